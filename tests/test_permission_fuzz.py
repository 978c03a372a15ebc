"""The permission fuzz suite: hypothesis builds file layouts (directories, unicode and dash names,
symlinks, ``..`` spellings, hard links), deny rules on some of their paths, and tool calls of every
file tool — Read, Grep, Glob, Write, Edit and Bash, run for real — in every permission mode; then
checks that no byte of a file a ``Read(...)`` rule denies reached a tool_result and no file an
``Edit(...)`` rule denies changed.

Budget: ``HYPOTHESIS_PROFILE=ci`` (the default) runs :data:`CI_EXAMPLES` layouts; the nightly profile
ten times as many; ``AGENTFSM_FUZZ_EXAMPLES=N`` sets the number outright (see docs/deny-rules.md).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.common.modes import PERMISSION_MODES
from agentfsm.hooks import build_gate
from agentfsm.machine.options import Options
from agentfsm.runtime.pipeline import run_tool_call
from agentfsm.sessions.compose import build_registry
from agentfsm.tools.base import ToolContext
from agentfsm.tools.pathmatch import path_rule_matcher
from agentfsm.tools.read import record_read
from agentfsm.tools.sandbox import SANDBOX

CI_EXAMPLES = 150
_PROFILE_SCALE = 10 if os.environ.get("HYPOTHESIS_PROFILE") == "nightly" else 1
EXAMPLES = int(os.environ.get("AGENTFSM_FUZZ_EXAMPLES", CI_EXAMPLES * _PROFILE_SCALE))

NAMES = ["a", "b.txt", "secret", "dir", "sub", "é", "日本", "with space", "-dash", ".hidden", "x.py", "notes"]


@attrs.frozen
class Layout:
    dirs: tuple[str, ...]
    files: tuple[str, ...]  # each holds its own marker
    symlinks: tuple[tuple[str, str], ...]  # (link, target relative to ws)
    hardlinks: tuple[tuple[str, str], ...]  # (new name, existing file)


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    dirs = [""]
    for _ in range(draw(st.integers(1, 3))):
        parent = draw(st.sampled_from(dirs))
        d = _join(parent, draw(st.sampled_from(NAMES)))
        if d not in dirs:
            dirs.append(d)
    files: list[str] = []
    for _ in range(draw(st.integers(2, 6))):
        f = _join(draw(st.sampled_from(dirs)), draw(st.sampled_from(NAMES)))
        if f not in dirs and f not in files and not any(f.startswith(x + "/") for x in files):
            files.append(f)
    if not files:
        files.append("plain_file")
    taken = set(dirs) | set(files)
    symlinks: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 3))):
        link = _join(draw(st.sampled_from(dirs)), "link_" + draw(st.sampled_from(NAMES)))
        target = draw(st.sampled_from([*files, *[d for d in dirs if d]] or files))
        if link not in taken:
            taken.add(link)
            symlinks.append((link, target))
    hardlinks: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 2))):
        name = _join(draw(st.sampled_from(dirs)), "hard_" + draw(st.sampled_from(NAMES)))
        if name not in taken and files:
            taken.add(name)
            hardlinks.append((name, draw(st.sampled_from(files))))
    return Layout(tuple(d for d in dirs if d), tuple(files), tuple(symlinks), tuple(hardlinks))


def marker(i: int) -> str:
    return f"MARK{i:03d}Z"


def build(root: Path, layout: Layout) -> dict[str, str]:
    """Create the layout; return each file's marker by its path."""
    ws = root / "ws"
    ws.mkdir()
    for d in layout.dirs:
        (ws / d).mkdir(parents=True, exist_ok=True)
    markers = {}
    for i, f in enumerate(layout.files):
        (ws / f).parent.mkdir(parents=True, exist_ok=True)
        (ws / f).write_text(marker(i) + "\n")
        markers[f] = marker(i)
    for link, target in layout.symlinks:
        (ws / link).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(ws / target, (ws / link).parent), ws / link)
    for name, existing in layout.hardlinks:
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(ws / existing, ws / name)
        markers[name] = markers[existing]
    return markers


@st.composite
def rules(draw: st.DrawFn, layout: Layout) -> tuple[list[str], list[str]]:
    """(Read rules, Edit rules) on paths of the layout: files, whole directories, bare names."""
    targets = [*layout.files, *layout.dirs]
    read: list[str] = []
    for t in draw(st.lists(st.sampled_from(targets), min_size=1, max_size=3, unique=True)):
        kind = draw(st.sampled_from(["exact", "tree", "name"]))
        if kind == "tree" and t in layout.dirs:
            read.append(f"./{t}/**")
        elif kind == "name" and "/" not in t and t.isalnum():
            read.append(t)
        else:
            read.append(f"./{t}")
    edit = [f"./{t}" for t in draw(st.lists(st.sampled_from(layout.files), max_size=2, unique=True))]
    return read, edit


def denied(rel: str, specs: list[str]) -> bool:
    """Ground truth, in the rules' own dialect: does a path rule name ``rel`` (relative to the ws)?"""
    for spec in specs:
        if spec.startswith("./"):
            if path_rule_matcher(spec[2:], anchored=True).match(rel):
                return True
        elif path_rule_matcher(spec, anchored="/" in spec.rstrip("/")).match(rel):
            return True
    return False


def denied_markers(ws: Path, layout: Layout, markers: dict[str, str], read_specs: list[str]) -> set[str]:
    """The markers of every file a Read rule denies by its real path or by one of its hard-linked
    names (a hard link shares the bytes: one denied name denies them under every name). A symlink's
    own name being denied only closes that way in, not the file it points to."""
    out = set()
    real_ws = os.path.realpath(ws)
    for rel in [*layout.files, *(h for h, _ in layout.hardlinks)]:
        real_rel = os.path.relpath(os.path.realpath(ws / rel), real_ws)
        if denied(rel, read_specs) or denied(real_rel, read_specs):
            out.add(markers[rel])
    return out


def spellings(ws: Path, rel: str) -> list[str]:
    return [str(ws / rel), rel, f"./{rel}", str(ws / "x" / ".." / rel)]


BASH_TEMPLATES = ["cat {p}", "head -n 1 {p}", "grep -r MARK {d}", "cp {p} {q}", "echo NEW > {p}", "echo NEW >> {p}",
                  "sed -i s/MARK/EDIT/ {p}", "tee {p} < /dev/null", "find {d} -type f -exec cat {{}} +",
                  "bash -c 'cat {p}'", "cat {d}/*", "mv {p} {q}", "ls {d}", "xargs cat <<< {p}", "rm -f {p}",
                  "cd {d} && cat *", "dd if={p} of={q}", "sort -o {q} {p}",
                  # names that go away: a moved tree, a name replaced or unlinked while others remain
                  "mv {d} moved", "ln -f {q} {p}", "mv {q} {p}", "unlink {p}"]


@st.composite
def calls(draw: st.DrawFn, layout: Layout) -> dict[str, Any]:
    names = [*layout.files, *(h for h, _ in layout.hardlinks), *(s for s, _ in layout.symlinks)]
    dirs = [".", *layout.dirs]
    p = draw(st.sampled_from(names))
    tool = draw(st.sampled_from(["Read", "Grep", "Glob", "Write", "Edit", "Bash", "Bash"]))
    if tool == "Read":
        return {"name": "Read", "input": {"file_path": draw(st.sampled_from(spellings(Path("/WS"), p)))}}
    if tool == "Grep":
        inp: dict[str, Any] = {"pattern": "MARK", "output_mode": draw(st.sampled_from(
            ["content", "files_with_matches", "count"]))}
        if draw(st.booleans()):
            inp["path"] = draw(st.sampled_from([*dirs, *names]))
        if draw(st.booleans()):
            inp["glob"] = draw(st.sampled_from(["*", "**/*", "*.txt", "secret*", "é*"]))
        return {"name": "Grep", "input": inp}
    if tool == "Glob":
        inp = {"pattern": draw(st.sampled_from(["**/*", "*", "**/link_*", "**/hard_*", "*/*"]))}
        if draw(st.booleans()):
            inp["path"] = draw(st.sampled_from(dirs))
        return {"name": "Glob", "input": inp}
    if tool == "Write":
        return {"name": "Write", "input": {"file_path": p, "content": "WRITTEN\n"}, "read_first": p}
    if tool == "Edit":
        return {"name": "Edit", "input": {"file_path": p, "old_string": "MARK", "new_string": "EDIT"}, "read_first": p}
    q = draw(st.sampled_from([*names, "new_file"]))
    d = draw(st.sampled_from(dirs))
    command = draw(st.sampled_from(BASH_TEMPLATES)).format(p=_quote(p), q=_quote(q), d=_quote(d))
    return {"name": "Bash", "input": {"command": command}}


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


async def _run(ws: Path, mode: str, read_specs: list[str], edit_specs: list[str], call: dict[str, Any]) -> str:
    disallowed = [f"Read({s})" for s in read_specs] + [f"Edit({s})" for s in edit_specs]
    options = Options(cwd=ws, permission_mode=mode, disallowed_tools=tuple(disallowed), setting_sources=())
    registry = build_registry(options)
    gate = build_gate(options, registry=registry)
    read_files: dict[str, float] = {}

    def ctx(tool_use_id: str) -> ToolContext:
        # each Bash probe runs in the session's kernel sandbox too (a second line behind the rules)
        c = ToolContext(cwd=ws, tool_use_id=tool_use_id, read_files=read_files, file_access=gate.file_access(),
                        services={SANDBOX: gate.sandbox})
        first = call.get("read_first")
        if first is not None and (ws / first).exists():
            record_read(c, ws / first)
        return c

    inp = {k: (v.replace("/WS", str(ws)) if isinstance(v, str) else v) for k, v in call["input"].items()}
    block = {"type": "tool_use", "id": "toolu_fuzz", "name": call["name"], "input": inp}
    r = await run_tool_call(block, lookup=registry, gate=gate, ctx_factory=ctx)
    content = r.block["content"]
    return content if isinstance(content, str) else repr(content)


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.data_too_large])
@given(data=st.data())
def test_no_denied_byte_reaches_a_tool_result_and_no_denied_file_changes(data: st.DataObject) -> None:
    layout = data.draw(layouts(), "layout")
    read_specs, edit_specs = data.draw(rules(layout), "rules")
    mode = data.draw(st.sampled_from(PERMISSION_MODES), "mode")
    batch = data.draw(st.lists(calls(layout), min_size=1, max_size=4), "calls")
    root = Path(tempfile.mkdtemp(prefix="agentfsm-fuzz-"))
    try:
        markers = build(root, layout)
        ws = root / "ws"
        secret = denied_markers(ws, layout, markers, read_specs)
        protected = {rel: (ws / rel).read_bytes() for rel in layout.files if denied(rel, edit_specs)}
        for call in batch:
            out = asyncio.run(_run(ws, mode, read_specs, edit_specs, call))
            leaked = [m for m in secret if m in out]
            assert not leaked, f"{call} leaked {leaked}: {out[:500]}"
            for rel, before in protected.items():
                assert (ws / rel).exists() and (ws / rel).read_bytes() == before, f"{call} changed {rel}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
