"""Glob: pattern semantics, oldest-first order, the 100-result cap and its note, errors."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import threading
import time
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.tools.base import NoFileRules, ToolContext, ToolError
from agentfsm.tools.glob import MAX_RESULTS, GlobTool, run_stoppable
from agentfsm.tools.pathmatch import expand_braces, glob_tool_matcher


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, file_access=NoFileRules())


def touch(path: Path, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


async def glob(ctx: ToolContext, pattern: str, path: str | None = None) -> str:
    inp = {"pattern": pattern} if path is None else {"pattern": pattern, "path": path}
    out = await GlobTool().call(inp, ctx)
    assert not out.is_error
    return out.data


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    touch(tmp_path / "top.py", 1000)
    touch(tmp_path / "src" / "a.py", 3000)
    touch(tmp_path / "src" / "b.ts", 2000)
    touch(tmp_path / "src" / "deep" / "c.py", 4000)
    touch(tmp_path / ".hidden.py", 500)
    touch(tmp_path / ".git" / "hook.py", 5000)
    return tmp_path


async def test_a_pattern_without_a_directory_matches_names_at_any_depth(ctx: ToolContext, tree: Path) -> None:
    """As Claude Code 2.1.332's Glob (tests/fidelity/conform/conform-53238a8864.json); with a directory
    part, ``*`` stays in that directory."""
    assert await glob(ctx, "*.py") == ".hidden.py\ntop.py\nsrc/a.py\nsrc/deep/c.py"
    assert await glob(ctx, "src/*.py") == "src/a.py"


async def test_double_star_spans_directories_oldest_first(ctx: ToolContext, tree: Path) -> None:
    assert await glob(ctx, "**/*.py") == ".hidden.py\ntop.py\nsrc/a.py\nsrc/deep/c.py"


async def test_braces_and_trailing_double_star(ctx: ToolContext, tree: Path) -> None:
    assert await glob(ctx, "src/*.{py,ts}") == "src/b.ts\nsrc/a.py"
    assert await glob(ctx, "src/**") == "src/b.ts\nsrc/a.py\nsrc/deep/c.py"


async def test_vcs_directories_are_skipped_unless_named(ctx: ToolContext, tree: Path) -> None:
    assert ".git" not in await glob(ctx, "**/*")
    assert await glob(ctx, ".git/*.py") == ".git/hook.py"


async def test_path_parameter_and_absolute_results_outside_cwd(
        tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = ToolContext(cwd=tmp_path_factory.mktemp("elsewhere"), file_access=NoFileRules())
    out = await glob(elsewhere, "a.py", str(tree / "src"))
    assert out == str(tree / "src" / "a.py")
    assert await glob(ToolContext(cwd=tree, file_access=NoFileRules()), "*.py", "src") == "src/a.py\nsrc/deep/c.py"


async def test_absolute_pattern(ctx: ToolContext, tree: Path) -> None:
    assert await glob(ctx, f"{tree}/src/**/*.py") == "src/a.py\nsrc/deep/c.py"


async def test_no_files_found(ctx: ToolContext, tree: Path) -> None:
    assert await glob(ctx, "**/*.rs") == "No files found"


async def test_directories_are_not_results(ctx: ToolContext, tree: Path) -> None:
    found = (await glob(ctx, "*")).split("\n")
    assert found == (await glob(ctx, "**/*")).split("\n")
    assert found and all((tree / f).is_file() for f in found)


async def test_ties_in_mtime_sort_by_path(ctx: ToolContext, tmp_path: Path) -> None:
    for name in ("b.txt", "a.txt", "c.txt"):
        touch(tmp_path / name, 100)
    assert await glob(ctx, "*.txt") == "a.txt\nb.txt\nc.txt"


async def test_results_are_capped_with_a_note(ctx: ToolContext, tmp_path: Path) -> None:
    for i in range(130):
        touch(tmp_path / f"f{i:03}.txt", 1000 + i)
    lines = (await glob(ctx, "*.txt")).split("\n")
    assert len(lines) == MAX_RESULTS + 1
    assert lines[0] == "f000.txt"  # oldest first
    assert lines[-1] == ("(Showing 100 of 130 matching files; 30 more are not listed. Narrow the pattern or "
                         "path to see the rest.)")


async def test_missing_and_non_directory_paths(ctx: ToolContext, tmp_path: Path) -> None:
    with pytest.raises(ToolError) as err:
        await glob(ctx, "*", "nope")
    assert str(err.value) == (f"Directory does not exist: nope. Note: your current working directory is "
                              f"{tmp_path}.")
    touch(tmp_path / "file.txt")
    with pytest.raises(ToolError, match=r"Path is not a directory: file\.txt"):
        await glob(ctx, "*", "file.txt")
    with pytest.raises(ToolError):
        await glob(ctx, "  ")


async def test_symlink_cycles_do_not_hang(ctx: ToolContext, tmp_path: Path) -> None:
    touch(tmp_path / "d" / "x.py")
    (tmp_path / "d" / "loop").symlink_to(tmp_path / "d")
    assert await asyncio.wait_for(glob(ctx, "**/*.py"), 10) == "d/x.py"


async def test_abort_stops_the_walk(ctx: ToolContext, tmp_path: Path) -> None:
    touch(tmp_path / "a.py")
    ctx.abort.set()
    with pytest.raises(ToolError, match="aborted"):
        await GlobTool().call({"pattern": "**/*.py"}, ctx)


async def test_abort_or_cancel_during_a_walk_stops_it(ctx: ToolContext) -> None:
    def work(stop: threading.Event) -> str:
        while not stop.is_set():
            time.sleep(0.01)
        return "stopped"

    stop = threading.Event()
    task = asyncio.create_task(run_stoppable(ctx, stop, lambda: work(stop)))
    await asyncio.sleep(0.05)
    ctx.abort.set()
    with pytest.raises(ToolError, match="aborted"):
        await task
    assert stop.is_set()

    ctx.abort.clear()
    stop = threading.Event()
    task = asyncio.create_task(run_stoppable(ctx, stop, lambda: work(stop)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stop.is_set()


def test_expand_braces() -> None:
    assert expand_braces("a.{js,ts}") == ["a.js", "a.ts"]
    assert expand_braces("{a,b}/{c,d}") == ["a/c", "a/d", "b/c", "b/d"]
    assert expand_braces("x{a,{b,c}}y") == ["xay", "xby", "xcy"]
    assert expand_braces("{solo}.{a,b}") == ["{solo}.a", "{solo}.b"]
    assert expand_braces("open{a,b") == ["open{a,b"]


name_chars = st.text(alphabet="ab.c", min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))
glob_chars = st.text(alphabet="ab.c*?", min_size=1, max_size=6).filter(lambda n: n not in (".", ".."))


@given(name=name_chars, pattern=glob_chars)
def test_one_segment_matches_like_fnmatch(name: str, pattern: str) -> None:
    assert bool(glob_tool_matcher(pattern).match(name)) == fnmatch.fnmatchcase(name, pattern)


@given(dirs=st.lists(st.sampled_from(["a", "b", "c"]), max_size=4),
       name=name_chars)
def test_double_star_matches_any_depth(dirs: list[str], name: str) -> None:
    path = "/".join([*dirs, name])
    assert glob_tool_matcher(f"**/{name}").match(path)
    assert bool(glob_tool_matcher(name).match(path)) == (not dirs)


def test_tool_traits_and_schema() -> None:
    t = GlobTool()
    assert t.name == "Glob"
    assert t.is_concurrency_safe({}) and t.is_read_only({})
    assert t.interrupt_behavior() == "cancel"
    jsonschema.Draft202012Validator.check_schema(t.input_schema)
    assert t.input_schema["required"] == ["pattern"]
    assert t.input_schema["additionalProperties"] is False
    assert set(t.input_schema["properties"]) == {"pattern", "path"}
    assert t.permission_subject({"pattern": "*", "path": "/src"}) == "/src"
