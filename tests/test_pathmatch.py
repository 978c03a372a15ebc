"""pathmatch: one glob dialect for the Glob tool, the Grep fallback's ignore rules and --glob
filters, and Read(...)/Edit(...) permission rules; bracket expressions mean the same in all three."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.tools.base import NoFileRules, Tool, ToolContext, ToolError
from agentfsm.tools.glob import GlobTool
from agentfsm.tools.grep import GrepTool
from agentfsm.tools.pathmatch import (
    BRACE_LIMIT,
    PatternError,
    compile_glob,
    expand_braces,
    glob_tool_matcher,
    has_magic,
    ignore_rule,
    path_rule_matcher,
)

BACKENDS = ["rg"]  # (Grep had a Python fallback too; ripgrep from the wheel is the only engine now)


class FakeRead(Tool):
    name = "Read"


READ = FakeRead()


def touch(path: Path, text: str = "needle\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def denied(cwd: Path, rule: str, path: str) -> bool:
    policy = PermissionPolicy.build(cwd, mode="bypassPermissions", deny=[rule])
    return policy.evaluate(READ, {"file_path": path}).behavior == "deny"


# --- the dialect -------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "name", "hit"), [
    ("a[!0-9]", "ab", True), ("a[!0-9]", "a1", False),
    ("a[^0-9]", "ab", True), ("a[^0-9]", "a1", False),  # "^" negates as "!" does
    ("a[a-c]", "ab", True), ("a[a-c]", "ad", False),
    ("a[!a-c]", "ad", True), ("a[!a-c]", "ab", False),
    ("a[]x]", "a]", True), ("a[!]x]", "a]", False), ("a[!]x]", "ab", True),  # "]" first is literal
    ("a[a-]", "a-", True), ("a[-a]", "a-", True),  # "-" at an end is literal
    ("a[[:digit:]]", "a7", True), ("a[[:digit:]]", "ab", False),
    ("a[![:alpha:]]", "a7", True), ("a[![:alpha:]]", "ab", False),
    ("a[z-a]", "az", False), ("a[z-a]", "a[z-a]", False),  # a reversed range matches nothing, never raises
    ("a[", "a[", True), ("a[b", "a[b", True),  # an unclosed bracket is literal text
    ("a\\*", "a*", True), ("a\\*", "ab", False),
    ("[.]x", ".x", True), ("?x", ".x", True), ("*x", ".x", True),  # dotfiles are names like any other
])
def test_bracket_expressions(pattern: str, name: str, hit: bool) -> None:
    assert compile_glob(pattern).match(name) is hit


def test_brackets_and_single_stars_never_cross_a_slash() -> None:
    for pattern in ("x[!a]y", "x[^a]y", "x?y", "x*y", "x**y"):
        assert not compile_glob(pattern).match("x/y"), pattern
    assert compile_glob("x/**/y").match("x/y") and compile_glob("x/**/y").match("x/a/b/y")


def test_options() -> None:
    assert compile_glob("*.py", anywhere=True).match("a/b/c.py")
    assert not compile_glob("*.py").match("a/b/c.py")
    assert compile_glob("docs", contents=True).match("docs/a/b.md")
    assert not compile_glob("docs").match("docs/a/b.md")
    assert compile_glob("*.{py,ts}", braces=True).match("a.ts")
    assert compile_glob("*.{py,ts}").match("x.{py,ts}")  # without braces they are literal text


def test_expand_braces_and_its_limit() -> None:
    assert expand_braces("a.{js,ts}") == ["a.js", "a.ts"]
    assert expand_braces("\\{a,b}") == ["\\{a,b}"]  # an escaped brace is no group
    assert expand_braces("{,}") == [""]
    with pytest.raises(PatternError):
        expand_braces("{a,b}" * 11)  # 2**11 alternatives
    assert len(expand_braces("{a,b}" * 9)) == 2 ** 9 < BRACE_LIMIT


def test_has_magic() -> None:
    assert not any(has_magic(s) for s in ("src", "a.py", "a-b", "~", "!x"))
    assert all(has_magic(s) for s in ("*.py", "a?", "[ab]", "x]", "{a,b}", "a\\b"))


# --- the three uses ----------------------------------------------------------------------------


def test_glob_tool_preset_ignores_empty_and_dot_segments() -> None:
    assert glob_tool_matcher("./src//*.py").match("src/a.py")
    assert glob_tool_matcher("src/**").match("src/a/b") and not glob_tool_matcher("src/**").match("src")


@pytest.mark.parametrize(("line", "path", "is_dir", "hit"), [
    ("*.log", "a/b/x.log", False, True),  # no slash: any depth
    ("/x.log", "x.log", False, True), ("/x.log", "a/x.log", False, False),  # a leading slash anchors
    ("a/*.log", "a/x.log", False, True), ("a/*.log", "b/a/x.log", False, False),  # so does a middle one
    ("build/", "build", True, True), ("build/", "build", False, False),  # a trailing slash: directories only
    ("**/x", "a/b/x", False, True), ("a/**", "a/b/c", False, True), ("a/**/b", "a/b", False, True),
    ("/**", "a/b", False, True),
    ("\\!x", "!x", False, True), ("\\#x", "#x", False, True),
    ("x\\ ", "x ", False, True), ("x  ", "x", False, True),  # trailing spaces go unless escaped
])
def test_ignore_rules(line: str, path: str, is_dir: bool, hit: bool) -> None:
    rule = ignore_rule(line)
    assert rule is not None and rule.matches(path, is_dir) is hit


def test_ignore_rule_negation_comments_and_blanks() -> None:
    rule = ignore_rule("!keep.md")
    assert rule is not None and rule.negated and rule.matches("keep.md", False)
    assert ignore_rule("# note") is None and ignore_rule("   ") is None and ignore_rule("/") is None
    glob_rule = ignore_rule("#x", comments=False)
    assert glob_rule is not None and glob_rule.matches("#x", False)


def test_path_rule_preset() -> None:
    assert path_rule_matcher("", anchored=True).match("")  # the base directory itself
    assert path_rule_matcher(".", anchored=False).match("a/b")
    assert path_rule_matcher("src/*", anchored=True).match("src/pkg/a.py")  # a matched dir covers its inside
    assert path_rule_matcher(".env", anchored=False).match("a/b/.env")
    assert not path_rule_matcher(".env", anchored=True).match("a/.env")


# --- the three uses agree ------------------------------------------------------------------------

TOKENS = ["a", "b", "1", ".", "-", "^", "!", "]", "[", "*", "?", "[ab]", "[!a]", "[^a]", "[a-c]", "[!a-c]",
          "[]a]", "[!]]", "[a-]", "[[:digit:]]", "[![:alpha:]]", "\\*", "\\["]
patterns = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=4).map("".join).filter(
    # "!" and "#" open negations and comments in ignore files, "." is the base itself in a permission rule
    lambda p: not p.startswith(("!", "#")) and p not in (".", ".."))
names = st.text(alphabet="ab1.-^!][*", min_size=1, max_size=5).filter(lambda n: n not in (".", ".."))
CWD = Path("/nonexistent-agentfsm/proj")


@settings(max_examples=300, deadline=None)
@given(pattern=patterns, name=names)
def test_glob_ignore_and_permission_rules_agree_on_one_segment(pattern: str, name: str) -> None:
    in_glob = glob_tool_matcher(pattern).match(name)
    rule = ignore_rule(pattern)
    assert rule is not None
    assert rule.matches(name, is_dir=False) is in_glob
    assert denied(CWD, f"Read({pattern})", str(CWD / name)) is in_glob
    if "^" not in pattern and "[:" not in pattern and "\\" not in pattern:
        # where Python's fnmatch knows the syntax, it agrees too ("[^" and "[:name:]" are POSIX only)
        assert in_glob is fnmatch.fnmatchcase(name, pattern)


# --- regressions: brackets in each user ----------------------------------------------------------


@pytest.fixture
def bracket_tree(tmp_path: Path) -> Path:
    for name in ("a1.txt", "ab.txt", "a-.txt", "a^.txt"):
        touch(tmp_path / name)
        os.utime(tmp_path / name, (1000, 1000))
    touch(tmp_path / "x" / "y")
    return tmp_path


async def glob(root: Path, pattern: str) -> str:
    out = await GlobTool().call({"pattern": pattern}, ToolContext(cwd=root, file_access=NoFileRules()))
    return out.data


async def test_glob_tool_brackets(bracket_tree: Path) -> None:
    assert await glob(bracket_tree, "a[!0-9].txt") == "a-.txt\na^.txt\nab.txt"
    assert await glob(bracket_tree, "a[^0-9].txt") == "a-.txt\na^.txt\nab.txt"
    assert await glob(bracket_tree, "a[[:digit:]].txt") == "a1.txt"
    assert await glob(bracket_tree, "a[\\^].txt") == "a^.txt"
    # the old translator let a negated class match the "/" in "x/y"
    assert await glob(bracket_tree, "**/x[!a]y") == "No files found"


async def test_glob_tool_refuses_an_explosive_brace_pattern(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="alternatives"):
        await GlobTool().call({"pattern": "{a,b}" * 11}, ToolContext(cwd=tmp_path, file_access=NoFileRules()))


async def grep_files(root: Path, backend: str, **inp: Any) -> list[str]:
    ctx = ToolContext(cwd=root, file_access=NoFileRules())
    out = await GrepTool().call({"pattern": "needle", **inp}, ctx)
    return sorted(out.data.split("\n")[1:])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_grep_glob_filter_brackets(bracket_tree: Path, backend: str) -> None:
    assert await grep_files(bracket_tree, backend, glob="a[!0-9].txt") == ["a-.txt", "a^.txt", "ab.txt"]
    assert await grep_files(bracket_tree, backend, glob="a[^0-9].txt") == ["a-.txt", "a^.txt", "ab.txt"]
    assert await grep_files(bracket_tree, backend, glob="a[]^].txt") == ["a^.txt"]
    assert await grep_files(bracket_tree, backend, glob="!a[a-z-].txt") == ["a1.txt", "a^.txt", "x/y"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_grep_ignore_file_brackets(bracket_tree: Path, backend: str) -> None:
    touch(bracket_tree / ".ignore", "a[!0-9].txt\n")
    assert await grep_files(bracket_tree, backend) == ["a1.txt", "x/y"]
    touch(bracket_tree / ".ignore", "a[^-^].txt\n")
    assert await grep_files(bracket_tree, backend) == ["a-.txt", "a^.txt", "x/y"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_grep_type_globs_use_brackets(tmp_path: Path, backend: str) -> None:
    for name in ("m.c", "m.h", "m.H", "m.x"):
        touch(tmp_path / name)
    assert await grep_files(tmp_path, backend, type="c") == ["m.H", "m.c", "m.h"]


def test_permission_rule_brackets(tmp_path: Path) -> None:
    assert denied(tmp_path, "Read(a[!0-9].txt)", str(tmp_path / "sub/ab.txt"))
    assert not denied(tmp_path, "Read(a[!0-9].txt)", str(tmp_path / "a1.txt"))
    assert denied(tmp_path, "Read(a[^0-9].txt)", str(tmp_path / "ab.txt"))
    assert denied(tmp_path, "Read(a[[:digit:]].txt)", str(tmp_path / "a1.txt"))
    assert denied(tmp_path, "Read(src/[!t]*.py)", str(tmp_path / "src/main.py"))
    assert not denied(tmp_path, "Read(src/[!t]*.py)", str(tmp_path / "src/test.py"))
    # neither a class nor a "**" inside a segment reaches across a "/" (gitignore's reading)
    assert not denied(tmp_path, "Read(./x[!a]y)", str(tmp_path / "x/y"))
    assert not denied(tmp_path, "Read(./a**b)", str(tmp_path / "a/b"))
    assert denied(tmp_path, "Read(./a/**/b)", str(tmp_path / "a/b"))
