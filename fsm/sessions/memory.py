"""CLAUDE.md memory files: the instructions a user or project keeps for the agent, loaded into the
context of a session's first prompt according to the setting sources (``--setting-sources``).

Each source brings its files, as Claude Code reads them: ``user`` the one in the Claude config
directory (``$CLAUDE_CONFIG_DIR``, else ``~/.claude``), ``project`` each ``CLAUDE.md`` and
``.claude/CLAUDE.md`` from the filesystem root down to the working directory, ``local`` each
``CLAUDE.local.md`` on the same path. An empty source list (the Agent SDK's isolation) loads none.
A file that cannot be read is skipped with a warning: memory is advice, not a security boundary.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from agentfsm.common import log as fsm_log

log = fsm_log.get_logger("agentfsm.memory")

# what each kind of file is, in the words the model is shown beside its path
DESCRIPTIONS: Mapping[str, str] = {
    "user": "user's private global instructions for all projects",
    "project": "project instructions, checked into the codebase",
    "local": "user's private project instructions, not checked in",
}
HEADER = ("Codebase and user instructions are shown below. Be sure to adhere to these instructions. "
          "IMPORTANT: These instructions OVERRIDE any default behavior and you MUST follow them exactly as written.")
MAX_BYTES = 256 * 1024  # a larger file is cut: it would crowd out the conversation


@attrs.frozen
class MemoryFile:
    path: Path
    source: str
    text: str


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    given = env.get("CLAUDE_CONFIG_DIR")
    return Path(given).expanduser() if given else Path.home() / ".claude"


def candidates(cwd: Path, sources: Iterable[str], *, config: Path) -> list[tuple[Path, str]]:
    """The memory paths of ``sources`` in the order they are shown (user, then root → cwd)."""
    wanted = set(sources)
    out: list[tuple[Path, str]] = []
    if "user" in wanted:
        out.append((config / "CLAUDE.md", "user"))
    cwd = cwd.resolve()
    for d in reversed((cwd, *cwd.parents)):
        if "project" in wanted:
            out += [(d / "CLAUDE.md", "project"), (d / ".claude" / "CLAUDE.md", "project")]
        if "local" in wanted:
            out.append((d / "CLAUDE.local.md", "local"))
    return out


def load(cwd: Path, sources: Iterable[str], *, config: Path | None = None) -> list[MemoryFile]:
    """The memory files that exist for ``sources``, each read once (a path reached twice is skipped)."""
    seen: set[Path] = set()
    files: list[MemoryFile] = []
    for path, source in candidates(cwd, sources, config=config or config_dir()):
        try:
            if not path.is_file():
                continue
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            with path.open("rb") as f:
                data = f.read(MAX_BYTES)
        except OSError as exc:
            log.warning("memory.unreadable", path=str(path), error=str(exc))
            continue
        text = data.decode("utf-8", errors="replace").strip()
        if text:
            files.append(MemoryFile(path, source, text))
    return files


def reminder_text(files: Iterable[MemoryFile]) -> str | None:
    """The memory as the model is shown it (inside a system reminder), or None when there is none."""
    parts = [f"Contents of {f.path} ({DESCRIPTIONS[f.source]}):\n\n{f.text}" for f in files]
    if not parts:
        return None
    return "\n\n".join([HEADER, *parts])
