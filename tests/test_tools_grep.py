"""Grep: output formats of the three modes, filters, paging, errors, and how a search ends (abort,
time limit), all through ripgrep from the ``ripgrep`` wheel — on every machine, PATH or not.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import agentfsm.tools.grep as grep_mod
from agentfsm.tools.base import NoFileRules, ToolContext, ToolError
from agentfsm.tools.grep import GrepTool, Query, rg_args, split_globs


@pytest.fixture
def backend() -> str:
    """(The tests took a backend when a Python fallback existed; ripgrep is the only one now.)"""
    return "rg"


def touch(path: Path, text: str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    touch(tmp_path / "a.txt", "alpha\nbeta\ngamma\ndelta\nalpha beta\n", 3000)
    touch(tmp_path / "src" / "m.py", "import os\n\ndef alpha():\n    return 'ALPHA'\n", 2000)
    touch(tmp_path / "src" / "n.js", "const alpha = 1;\n", 1000)
    touch(tmp_path / ".hidden.md", "alpha hidden\n", 500)
    return tmp_path


async def grep(root: Path, backend: str, **inp: Any) -> str:
    out = await GrepTool().call(inp, ToolContext(cwd=root, file_access=NoFileRules()))
    assert not out.is_error
    return out.data


# --- files_with_matches ------------------------------------------------------------------------


async def test_files_mode_is_default_and_newest_first(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha") == (
        "Found 4 files\na.txt\nsrc/m.py\nsrc/n.js\n.hidden.md")


async def test_single_file_found(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="import") == "Found 1 file\nsrc/m.py"


async def test_no_files_found(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="zzz") == "No files found"


async def test_case_insensitive(tree: Path, backend: str) -> None:
    out = await grep(tree, backend, pattern="ALPHA", output_mode="content")
    assert out == "src/m.py:4:    return 'ALPHA'"
    out = await grep(tree, backend, pattern="ALPHA", **{"-i": True})
    assert out.startswith("Found 4 files")


async def test_glob_and_type_filters(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", glob="*.py") == "Found 1 file\nsrc/m.py"
    assert await grep(tree, backend, pattern="alpha", glob="*.{py,js}") == "Found 2 files\nsrc/m.py\nsrc/n.js"
    assert await grep(tree, backend, pattern="alpha", glob="*.py,*.js") == "Found 2 files\nsrc/m.py\nsrc/n.js"
    assert await grep(tree, backend, pattern="alpha", glob="!*.txt !*.md") == (
        "Found 2 files\nsrc/m.py\nsrc/n.js")
    assert await grep(tree, backend, pattern="alpha", type="js") == "Found 1 file\nsrc/n.js"
    assert await grep(tree, backend, pattern="alpha", type="md") == "Found 1 file\n.hidden.md"


async def test_path_parameter(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", path="src") == "Found 2 files\nsrc/m.py\nsrc/n.js"
    assert await grep(tree, backend, pattern="alpha", path=str(tree / "a.txt")) == "Found 1 file\na.txt"


async def test_files_pagination(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", head_limit=2) == (
        "Found 2 files limit: 2\na.txt\nsrc/m.py")
    assert await grep(tree, backend, pattern="alpha", head_limit=2, offset=1) == (
        "Found 2 files limit: 2, offset: 1\nsrc/m.py\nsrc/n.js")
    assert await grep(tree, backend, pattern="alpha", head_limit=0, offset=3) == (
        "Found 1 file offset: 3\n.hidden.md")
    assert await grep(tree, backend, pattern="alpha", offset=9) == (
        "No entries at this offset. [Showing results with pagination = offset: 9]")


async def test_a_limit_is_reported_only_when_it_left_something_out(tree: Path, backend: str) -> None:
    """Exactly ``head_limit`` results are all the results: no "limit" note; one fewer allowed, and it is."""
    assert await grep(tree, backend, pattern="alpha", head_limit=4) == (
        "Found 4 files\na.txt\nsrc/m.py\nsrc/n.js\n.hidden.md")
    assert await grep(tree, backend, pattern="alpha", head_limit=3) == (
        "Found 3 files limit: 3\na.txt\nsrc/m.py\nsrc/n.js")
    assert await grep(tree, backend, pattern="alpha", head_limit=3, offset=1) == (
        "Found 3 files offset: 1\nsrc/m.py\nsrc/n.js\n.hidden.md")
    every = await grep(tree, backend, pattern="alpha", output_mode="content", head_limit=5)
    assert "pagination" not in every and every.count("\n") == 4
    assert (await grep(tree, backend, pattern="alpha", output_mode="content", head_limit=4)).endswith(
        "\n\n[Showing results with pagination = limit: 4]")


async def test_default_head_limit_is_250(tmp_path: Path, backend: str) -> None:
    for i in range(260):
        touch(tmp_path / f"f{i:03}.txt", "hit\n", 1000 + i)
    out = await grep(tmp_path, backend, pattern="hit")
    lines = out.split("\n")
    assert lines[0] == "Found 250 files limit: 250"
    assert lines[1] == "f259.txt" and len(lines) == 251
    assert (await grep(tmp_path, backend, pattern="hit", head_limit=0)).startswith("Found 260 files\n")


# --- content ---------------------------------------------------------------------------------


async def test_content_lines(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", output_mode="content") == (
        ".hidden.md:1:alpha hidden\na.txt:1:alpha\na.txt:5:alpha beta\nsrc/m.py:3:def alpha():\n"
        "src/n.js:1:const alpha = 1;")


async def test_content_without_line_numbers(tree: Path, backend: str) -> None:
    out = await grep(tree, backend, pattern="alpha", output_mode="content", glob="*.txt", **{"-n": False})
    assert out == "a.txt:alpha\na.txt:alpha beta"


async def test_content_of_a_single_file_has_no_path(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", output_mode="content", path="a.txt") == (
        "1:alpha\n5:alpha beta")


async def test_context_lines_and_separators(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", output_mode="content", glob="*.{txt,py}",
                      **{"-C": 1}) == (
        "a.txt:1:alpha\na.txt-2-beta\n--\na.txt-4-delta\na.txt:5:alpha beta\n--\n"
        "src/m.py-2-\nsrc/m.py:3:def alpha():\nsrc/m.py-4-    return 'ALPHA'")
    assert await grep(tree, backend, pattern="gamma", output_mode="content", path="a.txt",
                      **{"-B": 2, "-A": 0}) == "1-alpha\n2-beta\n3:gamma"
    assert await grep(tree, backend, pattern="gamma", output_mode="content", path="a.txt",
                      context=1, **{"-A": 3}) == "2-beta\n3:gamma\n4-delta"


async def test_context_is_ignored_outside_content_mode(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="gamma", **{"-C": 3}) == "Found 1 file\na.txt"


async def test_multiline(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="beta.gamma", output_mode="content") == "No matches found"
    assert await grep(tree, backend, pattern="beta.gamma", output_mode="content", multiline=True) == (
        "a.txt:2:beta\na.txt:3:gamma")
    assert await grep(tree, backend, pattern=r"a\nb|ta\nga", output_mode="content", multiline=True,
                      **{"-o": True}) == "a.txt:1:a\na.txt:2:b\na.txt:2:ta\na.txt:3:ga"


async def test_lines_right_after_a_multiline_match_are_not_a_new_group(tree: Path, backend: str) -> None:
    """A match spanning lines 2-3 is followed by line 4 without a ``--``; a later match that is not
    adjacent still gets one."""
    assert await grep(tree, backend, pattern="beta\ngamma", output_mode="content", multiline=True,
                      **{"-C": 1}) == "a.txt-1-alpha\na.txt:2:beta\na.txt:3:gamma\na.txt-4-delta"
    assert await grep(tree, backend, pattern="beta\ngamma|^alpha beta", output_mode="content", multiline=True,
                      path="a.txt", **{"-A": 1}) == "2:beta\n3:gamma\n4-delta\n5:alpha beta"
    assert await grep(tree, backend, pattern="^alpha\nbeta|^alpha beta", output_mode="content", multiline=True,
                      path="a.txt", **{"-A": 1}) == "1:alpha\n2:beta\n3-gamma\n--\n5:alpha beta"


async def test_only_matching(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="al[a-z]+", output_mode="content", path="a.txt",
                      **{"-o": True}) == "1:alpha\n5:alpha"


async def test_content_pagination_and_empty(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", output_mode="content", head_limit=2) == (
        ".hidden.md:1:alpha hidden\na.txt:1:alpha\n\n[Showing results with pagination = limit: 2]")
    assert await grep(tree, backend, pattern="alpha", output_mode="content", head_limit=1, offset=2) == (
        "a.txt:5:alpha beta\n\n[Showing results with pagination = limit: 1, offset: 2]")
    assert await grep(tree, backend, pattern="alpha", output_mode="content", offset=50) == (
        "No entries at this offset\n\n[Showing results with pagination = offset: 50]")
    assert await grep(tree, backend, pattern="nothing", output_mode="content") == "No matches found"


async def test_long_lines_are_omitted(tmp_path: Path, backend: str) -> None:
    touch(tmp_path / "w.txt", "x" * 600 + " needle\nshort needle\n")
    assert await grep(tmp_path, backend, pattern="needle", output_mode="content") == (
        "w.txt:1:[Omitted long matching line]\nw.txt:2:short needle")


# --- count -----------------------------------------------------------------------------------


async def test_count(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="alpha", output_mode="count") == (
        ".hidden.md:1\na.txt:2\nsrc/m.py:1\nsrc/n.js:1\n\nFound 5 total occurrences across 4 files.")
    assert await grep(tree, backend, pattern="import", output_mode="count") == (
        "src/m.py:1\n\nFound 1 total occurrence across 1 file.")
    assert await grep(tree, backend, pattern="alpha", output_mode="count", head_limit=1) == (
        ".hidden.md:1\n\nFound 5 total occurrences across 4 files. with pagination = limit: 1")
    assert await grep(tree, backend, pattern="zzz", output_mode="count") == (
        "No matches found\n\nFound 0 total occurrences across 0 files.")


async def test_count_in_a_single_file_keeps_the_path(tree: Path, backend: str) -> None:
    assert await grep(tree, backend, pattern="a", output_mode="count", path="a.txt") == (
        "a.txt:5\n\nFound 5 total occurrences across 1 file.")


# --- file selection --------------------------------------------------------------------------


async def test_vcs_directories_are_skipped(tree: Path, backend: str) -> None:
    touch(tree / ".git" / "config", "alpha\n")
    touch(tree / ".hg" / "x", "alpha\n")
    assert ".git" not in await grep(tree, backend, pattern="alpha")
    assert ".hg" not in await grep(tree, backend, pattern="alpha")


async def test_gitignore_applies_only_inside_a_repository(tmp_path: Path, backend: str) -> None:
    touch(tmp_path / "keep.txt", "needle\n", 2000)
    touch(tmp_path / "skip.log", "needle\n", 1000)
    touch(tmp_path / "build" / "out.txt", "needle\n", 500)
    touch(tmp_path / ".gitignore", "*.log\nbuild/\n", 100)
    assert await grep(tmp_path, backend, pattern="needle") == (
        "Found 3 files\nkeep.txt\nskip.log\nbuild/out.txt")
    (tmp_path / ".git").mkdir()
    assert await grep(tmp_path, backend, pattern="needle") == "Found 1 file\nkeep.txt"
    # an explicit glob overrides the ignore file; a path named outright is always searched
    assert await grep(tmp_path, backend, pattern="needle", glob="*.log") == "Found 1 file\nskip.log"
    assert await grep(tmp_path, backend, pattern="needle", path="skip.log") == "Found 1 file\nskip.log"


async def test_ignore_file_negation_and_nesting(tmp_path: Path, backend: str) -> None:
    (tmp_path / ".git").mkdir()
    touch(tmp_path / ".gitignore", "*.txt\n!important.txt\n", 10)
    touch(tmp_path / "a.txt", "needle\n", 100)
    touch(tmp_path / "important.txt", "needle\n", 200)
    touch(tmp_path / "sub" / ".ignore", "secret*\n", 10)
    touch(tmp_path / "sub" / "secret.md", "needle\n", 300)
    touch(tmp_path / "sub" / "open.md", "needle\n", 400)
    assert await grep(tmp_path, backend, pattern="needle") == "Found 2 files\nsub/open.md\nimportant.txt"


async def test_ignore_file_kinds_and_nested_repositories(tmp_path: Path, backend: str) -> None:
    (tmp_path / ".git").mkdir()
    touch(tmp_path / ".gitignore", "*.md\nm.txt\n", 10)
    touch(tmp_path / ".rgignore", "!keep.md\n", 10)  # .rgignore outranks .gitignore
    touch(tmp_path / "keep.md", "needle\n", 100)
    touch(tmp_path / "drop.md", "needle\n", 200)
    touch(tmp_path / "inner" / ".git" / "HEAD", "ref\n", 10)
    touch(tmp_path / "inner" / "m.txt", "needle\n", 300)  # the outer .gitignore stops at a nested repo
    assert await grep(tmp_path, backend, pattern="needle") == "Found 2 files\ninner/m.txt\nkeep.md"


async def test_binary_files_and_symlinks_are_skipped(tmp_path: Path, backend: str) -> None:
    touch(tmp_path / "t.txt", "needle\n")
    (tmp_path / "b.bin").write_bytes(b"needle\0\x01\x02")
    (tmp_path / "link.txt").symlink_to(tmp_path / "t.txt")
    assert await grep(tmp_path, backend, pattern="needle") == "Found 1 file\nt.txt"


async def test_results_outside_cwd_are_absolute(tree: Path, backend: str,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    out = await GrepTool().call(
        {"pattern": "import", "path": str(tree)}, ToolContext(cwd=elsewhere, file_access=NoFileRules()))
    assert out.data == f"Found 1 file\n{tree / 'src' / 'm.py'}"


# --- errors ----------------------------------------------------------------------------------


async def test_a_binary_file_named_outright_is_searched(tmp_path: Path, backend: str) -> None:
    (tmp_path / "b.bin").write_bytes(b"needle here\nx\0y\nneedle again\n")
    assert await grep(tmp_path, backend, pattern="needle", path="b.bin") == "Found 1 file\nb.bin"
    out = await grep(tmp_path, backend, pattern="needle", path="b.bin", output_mode="content")
    assert out == '1:needle here\n3:needle again\nbinary file matches (found "\\0" byte around offset 13)'


async def test_missing_path(tree: Path, backend: str) -> None:
    with pytest.raises(ToolError) as err:
        await grep(tree, backend, pattern="x", path="nope")
    assert str(err.value) == f"Path does not exist: nope. Note: your current working directory is {tree}."


async def test_bad_regex_and_unknown_type(tree: Path, backend: str) -> None:
    with pytest.raises(ToolError, match="regex parse error"):
        await grep(tree, backend, pattern="(unclosed")
    with pytest.raises(ToolError, match="unrecognized file type"):
        await grep(tree, backend, pattern="x", type="nosuchtype")


async def test_pattern_starting_with_dash(tmp_path: Path, backend: str) -> None:
    touch(tmp_path / "f.txt", "a -v flag\n")
    assert await grep(tmp_path, backend, pattern="-v", output_mode="content") == "f.txt:1:a -v flag"


# --- the binary, the end of a search ---------------------------------------------------------


def test_rg_comes_from_the_wheel_not_from_path(monkeypatch: pytest.MonkeyPatch) -> None:
    grep_mod.ripgrep_path.cache_clear()
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        found = grep_mod.ripgrep_path()
        assert found is not None and Path(found).name == "rg" and os.access(found, os.X_OK)
        assert found.startswith(sys.prefix) or found.startswith(os.path.realpath(sys.prefix))
    finally:
        grep_mod.ripgrep_path.cache_clear()


async def test_without_rg_the_tool_says_so(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grep_mod, "ripgrep_path", lambda: None)
    with pytest.raises(ToolError, match=r"ripgrep \(rg\) is not installed"):
        await grep(tree, "rg", pattern="alpha")


async def test_a_catastrophic_backtracking_pattern_answers(tmp_path: Path) -> None:
    # (a+)+$ over 49 bytes: Python's re backtracked for hours here; ripgrep's engine is linear
    touch(tmp_path / "redos.txt", "a" * 48 + "!")
    assert await grep(tmp_path, "rg", pattern="(a+)+$") == "No files found"
    touch(tmp_path / "ok.txt", "a" * 48 + "\n")
    assert await grep(tmp_path, "rg", pattern="(a+)+$") == "Found 1 file\nok.txt"


def fake_rg(tmp_path: Path) -> tuple[Path, Path]:
    """An ``rg`` that records its pid and then never finishes."""
    pid_file = tmp_path / "rg.pid"
    script = tmp_path / "rg"
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 1000\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, pid_file


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_the_runs_abort_stops_a_running_search(tree: Path, tmp_path_factory: pytest.TempPathFactory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    script, pid_file = fake_rg(tmp_path_factory.mktemp("bin"))
    monkeypatch.setattr(grep_mod, "ripgrep_path", lambda: str(script))
    ctx = ToolContext(cwd=tree, file_access=NoFileRules())
    call = asyncio.ensure_future(GrepTool().call({"pattern": "alpha"}, ctx))
    while not pid_file.exists() or not pid_file.read_text().strip():
        await asyncio.sleep(0.01)
    ctx.abort.set()
    with pytest.raises(ToolError, match="Search aborted"):
        await call
    assert gone(int(pid_file.read_text()))


async def test_a_search_past_its_time_limit_is_killed(tree: Path, tmp_path_factory: pytest.TempPathFactory,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    script, pid_file = fake_rg(tmp_path_factory.mktemp("bin"))
    monkeypatch.setattr(grep_mod, "ripgrep_path", lambda: str(script))
    monkeypatch.setenv(grep_mod.TIME_LIMIT_ENV, "0.2")
    with pytest.raises(ToolError) as err:
        await grep(tree, "rg", pattern="alpha")
    assert str(err.value) == ("Ripgrep search timed out after 0.2 seconds. The search may have matched files but "
                              "did not complete in time. Try searching a more specific path or pattern.")
    assert gone(int(pid_file.read_text()))


def test_the_time_limit_is_claude_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(grep_mod.TIME_LIMIT_ENV, raising=False)
    assert grep_mod.time_limit_s() == 20.0
    for bad in ("", "0", "-3", "soon"):
        monkeypatch.setenv(grep_mod.TIME_LIMIT_ENV, bad)
        assert grep_mod.time_limit_s() == 20.0
    monkeypatch.setenv(grep_mod.TIME_LIMIT_ENV, "45")
    assert grep_mod.time_limit_s() == 45.0
    assert grep_mod.timed_out_text(1).startswith("Ripgrep search timed out after 1 second.")


def test_rg_arguments_follow_claude_code() -> None:
    args = rg_args(Query(pattern="-x", root="/r", mode="content", ignore_case=True, multiline=True,
                         before=1, after=2, file_type="py", globs=("*.py",)))
    assert args[-4:] == ["-e", "-x", "--", "/r"]
    for flag in ("--hidden", "-U", "--multiline-dotall", "-i", "--json", "-n", "-B", "-A"):
        assert flag in args
    assert ["--glob", "!.git"] == args[args.index("!.git") - 1:args.index("!.git") + 1]
    assert ["--type", "py"] == args[args.index("py") - 1:args.index("py") + 1]
    assert "-l" in rg_args(Query(pattern="x", root="/r"))
    assert "-c" in rg_args(Query(pattern="x", root="/r", mode="count"))


async def test_newline_outside_multiline_is_refused(tree: Path, backend: str) -> None:
    with pytest.raises(ToolError, match="Consider enabling multiline mode"):
        await grep(tree, backend, pattern=r"beta\ngamma")


def test_split_globs() -> None:
    assert split_globs("*.py") == ("*.py",)
    assert split_globs("*.py,*.js  !x") == ("*.py", "*.js", "!x")
    assert split_globs("*.{ts,tsx} *.md") == ("*.{ts,tsx}", "*.md")
    assert split_globs(None) == ()


def test_tool_traits_and_schema() -> None:
    t = GrepTool()
    assert t.name == "Grep"
    assert t.is_concurrency_safe({}) and t.is_read_only({})
    assert t.interrupt_behavior() == "cancel"
    schema = t.input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["required"] == ["pattern"]
    assert schema["additionalProperties"] is False
    for key in ("pattern", "path", "glob", "type", "output_mode", "-i", "-n", "-A", "-B", "-C", "multiline",
                "head_limit"):
        assert key in schema["properties"]
    assert schema["properties"]["output_mode"]["enum"] == ["content", "files_with_matches", "count"]
    assert schema["properties"]["output_mode"]["default"] == "files_with_matches"
    assert schema["properties"]["-n"]["default"] is True
    v = jsonschema.Draft202012Validator(schema)
    assert not v.is_valid({"pattern": "x", "head_limit": -1})
    assert not v.is_valid({"pattern": "x", "output_mode": "lines"})


async def test_grep_refuses_special_files_without_blocking(tmp_path: Path) -> None:
    import asyncio
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules())
    for path in ("/dev/zero", str(fifo)):
        with pytest.raises(ToolError, match="not a regular file or a directory"):
            await asyncio.wait_for(GrepTool().call({"pattern": "x", "path": path}, ctx), 5)
