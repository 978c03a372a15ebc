"""Bash commands against the permission modes: which commands only change files inside the working
directories (``acceptEdits`` lets those run), and the text that says why any other one needs approval.

Both read the :class:`agentfsm.tools.shell.Analysis` of the command, the one the deny rules judge.
Anything the analysis cannot follow — a program it does not know, a path computed at run time, code
handed to an interpreter — is not an edit inside the workspace: it still needs approval (fail closed).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

import attrs

from agentfsm.tools.bash import segment_read_only
from agentfsm.tools.shell import Analysis

#: Programs whose every file effect the analysis names (besides the read-only ones): the commands
#: ``acceptEdits`` lets run when those files are all inside the working directories.
FILE_EDITORS = frozenset({"touch", "rm", "rmdir", "mkdir", "cp", "mv", "sed", "tee", "ln", "truncate"})

#: Claude Code's text for a command whose effect it cannot tell.
UNCLASSIFIED = "This command requires approval"


def _inside(path: str, dirs: Sequence[Path]) -> bool:
    # where the write lands, as the kernel resolves it: `echo x > link` writes where the link points,
    # and `a/link/../f` (the analysis keeps its `..`) is below the link's target's parent
    real = os.path.realpath(path)
    for d in dirs:
        root = os.path.realpath(d)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            return True
    return False


def _followed(analysis: Analysis) -> bool:
    """Every program is known and every file it writes is named."""
    if analysis.opaque or analysis.environment or analysis.background or analysis.assigns:
        return False
    if not analysis.commands or not analysis.complete:
        return False
    return all(c.program in FILE_EDITORS or segment_read_only(c.argv) for c in analysis.commands)


def edits_inside(analysis: Analysis, dirs: Sequence[Path]) -> bool:
    """True when the command only reads, and creates, changes or removes files inside ``dirs``."""
    if not _followed(analysis):
        return False
    writes = [p for p in analysis.paths if p.access == "write"]
    return bool(writes) and all(p.path is not None and _inside(p.path, dirs) for p in writes)


@attrs.frozen
class Subject:
    """What a command's approval text names: ``what`` (``Output redirection to`` or ``PROGRAM in``), the
    path as Claude Code shows it (``..`` folded, symlinks resolved), and whether it is inside the
    working directories."""

    what: str
    path: str
    inside: bool


def approval_subject(analysis: Analysis, dirs: Sequence[Path], allowed: Collection[str] = (), *,
                     redirections_only: bool = False) -> Subject | None:
    """The first file the command would write (inside or outside the working directories), or a file
    a file editor (``cp``, ``mv``…) reads from outside them, other than by a program an allow rule
    already approves (``allowed``); None when there is none or the command cannot be classified.
    ``redirections_only``: only an output redirection is named."""
    if not _followed(analysis):
        return None
    for use in analysis.paths:
        redirection = use.why.startswith("redirection")
        if use.path is None or (redirections_only and not redirection):
            continue
        program = use.why.split()[0]
        if use.access != "write" and (redirection or program not in FILE_EDITORS or _inside(use.path, dirs)):
            continue
        if not redirection and program in allowed:
            continue
        what = "Output redirection to" if redirection else f"{program} in"
        return Subject(what, os.path.realpath(use.path), use.access == "write" and _inside(use.path, dirs))
    return None


def approval_text(analysis: Analysis, dirs: Sequence[Path], allowed: Collection[str] = (), *,
                  redirections_only: bool = False) -> str:
    """Why the command needs approval, in Claude Code's words: what :func:`approval_subject` names,
    else that it cannot be classified."""
    subject = approval_subject(analysis, dirs, allowed, redirections_only=redirections_only)
    if subject is None:
        return UNCLASSIFIED
    shown = ", ".join(f"'{d}'" for d in dirs)
    what = f"{subject.what} '{subject.path}'"
    if subject.inside:
        return (f"{what} needs approval. The path is inside the working directories for this session "
                f"({shown}), and Claude Code asks before a shell command creates, changes or removes "
                "files there.")
    return (f"{what} needs approval. The path is outside the working directories for this session "
            f"({shown}). Allowing runs the command as written.")
