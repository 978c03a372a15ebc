"""The tools' caps, each on both sides: a cap is where an off-by-one hides (``>`` for ``>=``), and a
test at one side only cannot tell. Read's size cap (a file of exactly the cap is read, one byte more is
refused) and its default line window; Glob's result cap and its note."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentfsm.tools.base import NoFileRules, ToolContext, ToolError
from agentfsm.tools.glob import MAX_RESULTS, GlobTool
from agentfsm.tools.read import DEFAULT_LIMIT, ReadTool


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, file_access=NoFileRules())


@pytest.mark.parametrize("size, refused", [(1023, False), (1024, False), (1025, True)])
async def test_read_takes_a_file_of_exactly_its_size_cap(ctx: ToolContext, tmp_path: Path, size: int,
                                                         refused: bool) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes((b"x" * 15 + b"\n") * (size // 16) + b"y" * (size % 16))
    assert path.stat().st_size == size
    if refused:
        with pytest.raises(ToolError, match=r"exceeds maximum allowed size \(1KB\)"):
            await ReadTool(max_bytes=1024).call({"file_path": str(path)}, ctx)
    else:
        out = await ReadTool(max_bytes=1024).call({"file_path": str(path)}, ctx)
        assert out.data.startswith("1\t" + "x" * 15)


@pytest.mark.parametrize("lines", [DEFAULT_LIMIT - 1, DEFAULT_LIMIT, DEFAULT_LIMIT + 1])
async def test_read_shows_the_first_default_limit_lines(ctx: ToolContext, tmp_path: Path, lines: int) -> None:
    path = tmp_path / "f.txt"
    path.write_text("\n".join(f"l{i}" for i in range(1, lines + 1)))  # no newline after the last
    out = (await ReadTool().call({"file_path": str(path)}, ctx)).data
    numbered = [ln for ln in out.splitlines() if ln.split("\t", 1)[0].isdigit()]
    assert len(numbered) == min(lines, DEFAULT_LIMIT)
    assert numbered[-1] == f"{min(lines, DEFAULT_LIMIT)}\tl{min(lines, DEFAULT_LIMIT)}"


@pytest.mark.parametrize("count", [MAX_RESULTS - 1, MAX_RESULTS, MAX_RESULTS + 1])
async def test_glob_notes_only_what_it_leaves_out(ctx: ToolContext, tmp_path: Path, count: int) -> None:
    for i in range(count):
        p = tmp_path / f"f{i:03}.txt"
        p.write_text("")
        os.utime(p, (1000 + i, 1000 + i))
    lines = (await GlobTool().call({"pattern": "*.txt"}, ctx)).data.split("\n")
    shown = min(count, MAX_RESULTS)
    assert lines[:shown] == [f"f{i:03}.txt" for i in range(shown)]
    if count > MAX_RESULTS:
        assert lines[shown:] == [f"(Showing {MAX_RESULTS} of {count} matching files; {count - MAX_RESULTS} more are "
                                 "not listed. Narrow the pattern or path to see the rest.)"]
    else:
        assert len(lines) == shown
