"""Containment: "inside the working directories" means a path the directory is an ancestor of, never a
path whose text starts with the directory's text. A sibling ``/ws-evil`` is not inside ``/ws``; nor is
``/ws/../ws-evil``, nor what a link inside ``/ws`` points to outside it.

Every is-inside check that decides something is exercised through its public behaviour, over
generated siblings: acceptEdits' file edits (``PermissionPolicy``), acceptEdits' shell commands
(``edits_inside`` and the texts of ``approval_text``), and the ignore files of the pure-Python Grep
(a rule of ``/ws/sub/.gitignore`` must not apply under ``/ws/sub-other``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_permissions import FakeTool  # the permission tests' shared fake tool

from agentfsm.hooks.bash_approval import approval_text, edits_inside
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.tools.shell import analyse

EDIT, WRITE, BASH = FakeTool("Edit"), FakeTool("Write"), FakeTool("Bash")

# what may follow a directory's name to make a sibling's: anything but the separator
SUFFIX = st.text(st.sampled_from("-_.x0E~ "), min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))
HERE = settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = (tmp_path / "ws").resolve()
    root.mkdir()
    return root


def _accept(ws: Path, **kw: object) -> PermissionPolicy:
    return PermissionPolicy.build(ws, mode="acceptEdits", **kw)  # type: ignore[arg-type]


@HERE
@given(suffix=SUFFIX)
def test_accept_edits_allows_an_edit_inside_and_asks_for_a_sibling(ws: Path, suffix: str) -> None:
    p = _accept(ws)
    sibling = Path(str(ws) + suffix)
    for tool in (EDIT, WRITE):
        assert p.evaluate(tool, {"file_path": str(ws / "a.py")}).behavior == "allow"
        assert p.evaluate(tool, {"file_path": str(ws / "deep" / "er" / "a.py")}).behavior == "allow"
        assert p.evaluate(tool, {"file_path": str(sibling / "a.py")}).behavior == "ask", sibling
        assert p.evaluate(tool, {"file_path": str(sibling)}).behavior == "ask", sibling
        assert p.evaluate(tool, {"file_path": f"{ws}/../{ws.name}{suffix}/a.py"}).behavior == "ask"


def test_the_working_directory_itself_is_inside_and_its_parent_is_not(ws: Path) -> None:
    p = _accept(ws)
    assert p.evaluate(EDIT, {"file_path": str(ws)}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": str(ws) + "/"}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": str(ws.parent)}).behavior == "ask"
    assert p.evaluate(EDIT, {"file_path": str(ws.parent / "a.py")}).behavior == "ask"
    assert p.evaluate(EDIT, {"file_path": "a.py"}).behavior == "allow"  # relative: in the working directory
    assert p.evaluate(EDIT, {"file_path": "../a.py"}).behavior == "ask"


@HERE
@given(suffix=SUFFIX)
def test_an_additional_directory_counts_and_its_sibling_does_not(tmp_path: Path, ws: Path, suffix: str) -> None:
    extra = (tmp_path / "extra").resolve()
    extra.mkdir(exist_ok=True)
    p = _accept(ws, additional_directories=[extra])
    assert p.evaluate(EDIT, {"file_path": str(extra / "b.py")}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": str(extra) + suffix + "/b.py"}).behavior == "ask"
    assert _accept(ws).evaluate(EDIT, {"file_path": str(extra / "b.py")}).behavior == "ask"


def test_a_link_inside_that_points_to_a_sibling_is_not_inside(ws: Path) -> None:
    evil = Path(str(ws) + "-evil")
    evil.mkdir()
    (ws / "link").symlink_to(evil)
    p = _accept(ws)
    assert p.evaluate(EDIT, {"file_path": str(ws / "link" / "a.py")}).behavior == "ask"
    assert edits_inside(analyse(f"touch {ws}/link/a.py", str(ws)), [ws]) is False
    (ws / "real").mkdir()
    (ws / "inner").symlink_to(ws / "real")
    assert p.evaluate(EDIT, {"file_path": str(ws / "inner" / "a.py")}).behavior == "allow"


@HERE
@given(suffix=SUFFIX,
       command=st.sampled_from(["touch {}", "echo x > {}", "rm -f {}", "mkdir -p {}", "tee {} < /dev/null"]))
def test_accept_edits_runs_a_command_that_edits_inside_only(ws: Path, suffix: str, command: str) -> None:
    p = _accept(ws)
    sibling = Path(str(ws) + suffix)
    inside, outside = str(ws / "f"), str(sibling / "f")
    assert p.evaluate(BASH, {"command": command.format(_quote(inside))}).behavior == "allow"
    assert p.evaluate(BASH, {"command": command.format(_quote(outside))}).behavior == "ask"
    assert edits_inside(analyse(command.format(_quote(inside)), str(ws)), [ws]) is True
    assert edits_inside(analyse(command.format(_quote(outside)), str(ws)), [ws]) is False


@HERE
@given(suffix=SUFFIX)
def test_the_approval_text_says_inside_or_outside_by_ancestry(ws: Path, suffix: str) -> None:
    outside = _quote(str(ws) + suffix + "/f")
    assert "is outside the working directories" in approval_text(analyse(f"echo x > {outside}", str(ws)), [ws])
    inside = _quote(str(ws / "f"))
    assert "is inside the working directories" in approval_text(analyse(f"echo x > {inside}", str(ws)), [ws])


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


async def test_grep_ignore_rules_apply_below_their_directory_not_in_a_sibling(ws: Path) -> None:
    """The pure-Python Grep reads .gitignore files per directory: ``sub/.gitignore``'s ``*.log`` hides
    ``sub/x.log`` but not ``sub-other/x.log``."""
    from agentfsm.tools.base import NoFileRules, ToolContext
    from agentfsm.tools.grep import GrepTool

    (ws / ".git").mkdir()
    for d in ("sub", "sub-other", "sub/inner"):
        (ws / d).mkdir()
        (ws / d / "x.log").write_text("needle\n")
    (ws / "sub" / ".gitignore").write_text("*.log\n")
    out = await GrepTool().call({"pattern": "needle"},
                                                ToolContext(cwd=ws, file_access=NoFileRules()))  # type: ignore[arg-type]
    assert out.data == "Found 1 file\nsub-other/x.log"
