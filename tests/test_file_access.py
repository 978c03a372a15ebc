"""Deny means deny, through every tool: Read(...) and Edit(...) deny rules hold for Read, Write, Edit,
Glob, Grep and Bash, in every permission mode, through symlinks and hard links (the issue-18 probes,
with Claude Code 2.1.332's texts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agentfsm.hooks import build_gate
from agentfsm.machine.options import Options
from agentfsm.runtime.pipeline import CallResult, run_tool_call
from agentfsm.sessions.compose import build_registry
from agentfsm.tools.base import ToolContext
from agentfsm.tools.read import record_read

RULES = ("Read(./secret.txt)", "Read(./private/**)", "Edit(./protected.txt)")
MODES = ("default", "acceptEdits", "plan", "bypassPermissions", "dontAsk")
DENIED_MARKERS = ("SECRET_MARKER", "PRIVATE_MARKER", "DEEP_MARKER")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for rel, text in {"secret.txt": "SECRET_MARKER\n", "private/notes.txt": "PRIVATE_MARKER\n",
                      "private/sub/deep.txt": "DEEP_MARKER\n", "public.txt": "PUBLIC_MARKER\n",
                      "protected.txt": "PROTECTED_ORIG\n", "a": "A_CONTENT\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    os.symlink("private", root / "link_private")
    os.symlink("secret.txt", root / "link_secret")
    os.link(root / "secret.txt", root / "hard_secret")
    return root


async def call(ws: Path, mode: str, name: str, tool_input: dict[str, Any], *, read_first: str | None = None,
               rules: tuple[str, ...] = RULES) -> CallResult:
    options = Options(cwd=ws, permission_mode=mode, disallowed_tools=rules, setting_sources=())
    registry = build_registry(options)
    gate = build_gate(options, registry=registry)
    read_files: dict[str, float] = {}

    def ctx(tool_use_id: str) -> ToolContext:
        c = ToolContext(cwd=ws, tool_use_id=tool_use_id, read_files=read_files, file_access=gate.file_access())
        if read_first is not None:
            record_read(c, ws / read_first)
        return c

    block = {"type": "tool_use", "id": "toolu_1", "name": name, "input": tool_input}
    return await run_tool_call(block, lookup=registry, gate=gate, ctx_factory=ctx)


def text(r: CallResult) -> str:
    content = r.block["content"]
    return content if isinstance(content, str) else repr(content)


def leaks(r: CallResult) -> bool:
    return any(m in text(r) for m in DENIED_MARKERS)


FILE_DENIED = "<tool_use_error>File is in a directory that is denied by your permission settings.</tool_use_error>"


# --- Read, Grep, Glob --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_read_is_denied_in_every_spelling(ws: Path, mode: str) -> None:
    for path in ("secret.txt", "private/notes.txt", "link_secret", "link_private/notes.txt", "hard_secret",
                 "private/../secret.txt", "./private/sub/deep.txt"):
        r = await call(ws, mode, "Read", {"file_path": str(ws / path)})
        assert r.is_error and not leaks(r) and r.permission_denial is not None, (mode, path, text(r))
    assert text(await call(ws, mode, "Read", {"file_path": str(ws / "secret.txt")})) == FILE_DENIED
    link = str(ws / "link_secret")
    assert text(await call(ws, mode, "Read", {"file_path": link})) == f"Permission to read {link} has been denied."
    public = await call(ws, mode, "Read", {"file_path": str(ws / "public.txt")})
    assert "PUBLIC_MARKER" in text(public)


@pytest.mark.parametrize("mode", MODES)
async def test_grep_never_returns_denied_contents(ws: Path, mode: str) -> None:
    for extra in ({}, {"output_mode": "content"}, {"output_mode": "count"}, {"glob": "secret*"},
                  {"glob": "*", "output_mode": "content", "-C": 3}):
        r = await call(ws, mode, "Grep", {"pattern": "MARKER", **extra})
        assert not leaks(r), (extra, text(r))
        assert "secret" not in text(r) and "private" not in text(r), text(r)
    files = await call(ws, mode, "Grep", {"pattern": "MARKER"})
    assert text(files) == "Found 1 file\npublic.txt"
    for path in ("private", "link_private", "secret.txt", "link_secret", "private/sub"):
        given = str(ws / path)
        r = await call(ws, mode, "Grep", {"pattern": "MARKER", "path": given})
        assert text(r) == f"Permission to read {given} has been denied.", text(r)
        assert r.permission_denial is not None


@pytest.mark.parametrize("mode", MODES)
async def test_glob_lists_no_denied_file(ws: Path, mode: str) -> None:
    r = await call(ws, mode, "Glob", {"pattern": "**/*"})
    listed = set(text(r).splitlines())
    assert listed == {"public.txt", "protected.txt", "a"}, listed
    assert text(await call(ws, mode, "Glob", {"pattern": "link_*"})) == "No files found"
    for path in ("private", "link_private"):
        given = str(ws / path)
        r = await call(ws, mode, "Glob", {"pattern": "*", "path": given})
        assert text(r) == f"Permission to read {given} has been denied."


# --- Write and Edit --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_write_and_edit_are_denied_before_anything_else_is_said(ws: Path, mode: str) -> None:
    target = str(ws / "protected.txt")
    for read_first in (None, "protected.txt"):
        edit = await call(ws, mode, "Edit", {"file_path": target, "old_string": "PROTECTED_ORIG",
                                             "new_string": "HACKED"}, read_first=read_first)
        write = await call(ws, mode, "Write", {"file_path": target, "content": "HACKED"}, read_first=read_first)
        for r in (edit, write):
            assert text(r) == FILE_DENIED and r.permission_denial is not None
    assert (ws / "protected.txt").read_text() == "PROTECTED_ORIG\n"


async def test_edit_of_a_file_it_may_not_read_is_denied(ws: Path) -> None:
    # Edit quotes the file back (and old_string is an oracle): reading rules hold for it too
    r = await call(ws, "bypassPermissions", "Edit", {"file_path": str(ws / "secret.txt"), "old_string": "SECRET",
                                                     "new_string": "x"}, read_first="secret.txt")
    assert r.is_error and not leaks(r) and (ws / "secret.txt").read_text() == "SECRET_MARKER\n"


# --- Bash ------------------------------------------------------------------------------------------

BASH_READS = [
    "cat secret.txt", "head secret.txt", "cat < secret.txt", "cat link_secret", "cat private/notes.txt",
    "cat $WS/secret.txt", "cp secret.txt y && cat y", "cat secre?.txt", "grep -r MARKER .", "cat hard_secret",
    "cat */notes.txt", "cd private && cat notes.txt", "tar cf - private | tar xO", "find . -type f -exec cat {} +",
    "xargs cat <<< secret.txt", "cat \"$(echo secret.txt)\"", "bash -c 'cat secret.txt'", "less secret.txt",
    "python3 -c 'print(open(\"secret.txt\").read())'", "sed -n p secret.txt", "awk 1 secret.txt",
    "base64 secret.txt", "grep -R MARKER link_private", "cat {secret,public}.txt", "rg MARKER",
    "cat public.txt >/dev/null secret.txt",  # bash reads secret.txt: the words after a redirection are arguments
]
BASH_WRITES = [
    "echo HACKED > protected.txt", "echo HACKED >> protected.txt", "sed -i s/PROTECTED_ORIG/HACKED/ protected.txt",
    "cp a protected.txt", "echo HACKED | tee protected.txt", "mv a protected.txt", "echo HACKED > $WS/protected.txt",
    "dd if=a of=protected.txt", "truncate -s 0 protected.txt", "rm protected.txt", "echo x | sponge protected.txt",
    "perl -pi -e s/P/H/ protected.txt", "find . -name protected.txt -delete",
    "tar xf /dev/null -C . ; cp a protecte?.txt", "mkdir -p /tmp/d18 && echo H > /tmp/d18/protected.txt && "
    "cp /tmp/d18/protected.txt .", "cp -t . /tmp/d18/protected.txt",
    "bash -c 'echo HACKED > protected.txt'", "ln -sf a protected.txt", "echo HACKED > \"$(echo protected.txt)\"",
]


@pytest.mark.parametrize("mode", ["default", "bypassPermissions", "acceptEdits"])
@pytest.mark.parametrize("command", BASH_READS)
async def test_bash_cannot_read_a_denied_file(ws: Path, mode: str, command: str) -> None:
    r = await call(ws, mode, "Bash", {"command": command.replace("$WS", str(ws))})
    assert not leaks(r), text(r)
    assert r.is_error and r.permission_denial is not None, text(r)


@pytest.mark.parametrize("mode", ["default", "bypassPermissions", "acceptEdits"])
@pytest.mark.parametrize("command", BASH_WRITES)
async def test_bash_cannot_write_a_denied_file(ws: Path, mode: str, command: str) -> None:
    r = await call(ws, mode, "Bash", {"command": command.replace("$WS", str(ws))})
    assert r.is_error and r.permission_denial is not None, text(r)
    assert (ws / "protected.txt").read_text() == "PROTECTED_ORIG\n"


async def test_bash_denial_texts(ws: Path) -> None:
    r = await call(ws, "bypassPermissions", "Bash", {"command": "cat secret.txt"})
    assert text(r) == "Permission to use Bash with command cat secret.txt has been denied."
    r = await call(ws, "bypassPermissions", "Bash", {"command": "cat \"$F\""})
    assert text(r).startswith("Permission to use Bash with command cat \"$F\" has been denied: ")


# Writes that unlink or replace a name of a read-denied file (or move a tree holding one): the bytes
# would stay behind under a name no rule covers (`hard_secret`, once `secret.txt` is gone) or arrive
# under a new one (found by the permission fuzz suite: `mv secret b.txt` orphaned a hard link).
BASH_EXPOSES = [
    "rm secret.txt", "mv a secret.txt", "ln -f a secret.txt", "unlink secret.txt", "rsync a secret.txt",
    "find . -name secret.txt -delete", "f=secret.txt; rm \"$f\"", "cp a secret.txt", "mv private moved",
    "mv link_private moved", "mv -t moved private", "rm -r private link_private hard_secret secret.txt",
]


@pytest.mark.parametrize("mode", ["default", "bypassPermissions", "acceptEdits"])
@pytest.mark.parametrize("command", BASH_EXPOSES)
async def test_bash_cannot_expose_a_denied_file_under_another_name(ws: Path, mode: str, command: str) -> None:
    (ws / "moved").mkdir()
    r = await call(ws, mode, "Bash", {"command": command})
    assert r.is_error and r.permission_denial is not None, text(r)
    assert os.stat(ws / "secret.txt").st_nlink == 2 and (ws / "private/notes.txt").exists()
    for name in ("hard_secret", "moved/notes.txt", "moved/private/notes.txt"):
        if (ws / name).exists():
            assert not leaks(await call(ws, mode, "Read", {"file_path": str(ws / name)}))
            assert not leaks(await call(ws, mode, "Bash", {"command": f"cat {name}"}))


async def test_writes_that_expose_nothing_still_run(ws: Path) -> None:
    # without another name the bytes go with the name; a hard link is only a concern while it exists
    os.unlink(ws / "hard_secret")
    reads = ("Read(./secret.txt)", "Read(./private/**)")  # an Edit rule would make any unnamed write a could-apply
    for command in ("rm secret.txt", "f=a; rm \"$f\"", "rm -r private"):
        r = await call(ws, "bypassPermissions", "Bash", {"command": command}, rules=reads)
        assert r.permission_denial is None, (command, text(r))
    assert not (ws / "secret.txt").exists() and not (ws / "private").exists()
    # a hard link of a file no rule names: removing one name exposes nothing
    os.link(ws / "public.txt", ws / "public2.txt")
    r = await call(ws, "bypassPermissions", "Bash", {"command": "rm public.txt"}, rules=reads)
    assert r.permission_denial is None, text(r)


# A rule that names a file at any depth (`Edit(.env)`) holds for the files a tree copy or an
# extraction creates: their names are not known before the command runs (found by the full
# mutation run of the file-access policy: `cp -r src dst` created `dst/.env`).
BASH_CREATES = ["cp -r src dst", "cp -r src existing", "cp -a src/. dst", "cp -R src dst", "mv src moved_src",
                "tar cf - -C src . | tar xf - -C existing", "tar xf /dev/null", "unzip -d existing x.zip",
                "cp -r src .."]


@pytest.mark.parametrize("command", BASH_CREATES)
async def test_a_name_rule_holds_for_files_a_copy_creates(ws: Path, command: str) -> None:
    (ws / "src").mkdir()
    (ws / "src" / ".env").write_text("NEW\n")
    (ws / "existing").mkdir()
    r = await call(ws, "bypassPermissions", "Bash", {"command": command}, rules=("Edit(.env)",))
    assert r.is_error and r.permission_denial is not None, text(r)
    assert "can't be checked before it runs" in text(r) or "has been denied" in text(r)
    assert sorted(str(p.relative_to(ws)) for p in ws.rglob(".env")) == ["src/.env"]


async def test_copies_no_name_rule_can_reach_still_run(ws: Path, tmp_path: Path) -> None:
    (ws / "src").mkdir()
    (ws / "src" / "code.py").write_text("x\n")
    outside = tmp_path / "outside"
    for command, rules in (("cp -r src " + str(outside), ("Edit(.env)",)),  # outside the rule's base
                           ("cp src/code.py copy.py", ("Edit(.env)",)),  # names known: checked as written
                           ("cp -r src dst", ("Edit(./protected.txt)",))):  # anchored: judged by place
        r = await call(ws, "bypassPermissions", "Bash", {"command": command}, rules=rules)
        assert r.permission_denial is None, (command, text(r))
    assert (outside / "code.py").exists() and (ws / "copy.py").exists() and (ws / "dst" / "code.py").exists()


BENIGN = [
    "ls -la", "git status", "echo 'secret.txt is a name'", "grep -n x public.txt", "cat public.txt a",
    "find . -name '*.py'", "echo x > out.txt", "make 2>&1 | tail -5", "cd private/.. && ls", "wc -l public.txt",
    "mkdir -p build && cp a build/", "ls private", "sed -n 1,5p public.txt", "tar czf out.tgz a public.txt",
]


@pytest.mark.parametrize("command", BENIGN)
async def test_benign_commands_still_run(ws: Path, command: str) -> None:
    r = await call(ws, "bypassPermissions", "Bash", {"command": command})
    assert r.permission_denial is None, text(r)


async def test_no_rules_no_checks(ws: Path) -> None:
    r = await call(ws, "bypassPermissions", "Bash", {"command": "cat secret.txt"}, rules=())
    assert "SECRET_MARKER" in text(r)


async def test_a_tool_without_a_file_policy_fails_closed(ws: Path) -> None:
    from agentfsm.tools import GlobTool, ReadTool

    bare = ToolContext(cwd=ws)
    assert (await ReadTool().validate_input({"file_path": str(ws / "public.txt")}, bare)).denied
    assert (await GlobTool().validate_input({"pattern": "*"}, bare)).denied


@pytest.mark.parametrize("command", ["cp -r private copy", "cp -r private existing"])
async def test_bash_cannot_create_a_denied_file_below_a_directory_new_or_not(ws: Path, command: str) -> None:
    """A recursive copy creates names below its target that are not known before it runs: a rule for a
    path there denies it, whether the target directory exists already or the copy creates it."""
    (ws / "existing").mkdir()
    r = await call(ws, "bypassPermissions", "Bash", {"command": command},
                   rules=("Edit(./copy/notes.txt)", "Edit(./existing/notes.txt)"))
    assert r.is_error and r.permission_denial is not None, text(r)
    assert not (ws / "copy").exists() and not (ws / "existing" / "notes.txt").exists()
