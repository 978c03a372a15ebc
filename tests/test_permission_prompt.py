"""What the permission prompt is told (suggestions, description, decision reason) and how the
updates its answer carries are applied to the session's policy (hooks/permission_prompt.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_permissions import FakeTool  # the permission tests' shared fake tool

from agentfsm.hooks.permission_prompt import OUTSIDE_REASON, apply_updates, prompt_context
from agentfsm.hooks.permissions import PermissionPolicy

READ, WRITE, BASH = FakeTool("Read", read_only=True), FakeTool("Write"), FakeTool("Bash")


def asked(policy: PermissionPolicy, tool: FakeTool, tool_input: dict[str, Any]) -> dict[str, Any]:
    decision = policy.evaluate(tool, tool_input)
    assert decision.behavior == "ask", decision
    return prompt_context(policy, tool, tool_input, decision)


def test_a_write_inside_suggests_accepting_edits_and_names_the_path_relatively(tmp_path: Path) -> None:
    ctx = asked(PermissionPolicy.build(tmp_path), WRITE, {"file_path": str(tmp_path / "sub" / "n.txt")})
    assert ctx == {"suggestions": ({"type": "setMode", "mode": "acceptEdits", "destination": "session"},),
                   "description": "sub/n.txt", "decision_reason": None, "blocked_path": None}


def test_a_write_outside_also_suggests_adding_its_directory(tmp_path: Path) -> None:
    ws, other = tmp_path / "ws", tmp_path / "other"
    ws.mkdir()
    ctx = asked(PermissionPolicy.build(ws), WRITE, {"file_path": str(other / "w.txt")})
    assert ctx["suggestions"] == ({"type": "setMode", "mode": "acceptEdits", "destination": "session"},
                                  {"type": "addDirectories", "directories": [str(other)], "destination": "session"})
    assert (ctx["description"], ctx["decision_reason"]) == (str(other / "w.txt"), OUTSIDE_REASON)


def test_a_write_in_an_additional_directory_is_named_by_its_full_path_and_is_not_outside(tmp_path: Path) -> None:
    # inside the working directories, but not below the cwd: named as it is, not as ../extra/x.txt
    ws, extra = tmp_path / "ws", tmp_path / "extra"
    ws.mkdir()
    extra.mkdir()
    ctx = asked(PermissionPolicy.build(ws, additional_directories=[extra]), WRITE, {"file_path": str(extra / "x.txt")})
    assert (ctx["description"], ctx["decision_reason"]) == (str(extra / "x.txt"), None)


def test_a_read_outside_suggests_reads_under_its_directory(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    ctx = asked(PermissionPolicy.build(ws), READ, {"file_path": str(tmp_path / "out" / "o.txt")})
    assert ctx["suggestions"] == ({"type": "addRules", "behavior": "allow", "destination": "session",
                                   "rules": [{"toolName": "Read", "ruleContent": f"/{tmp_path}/out/**"}]},)
    assert ctx["decision_reason"] == OUTSIDE_REASON


def test_plan_mode_suggests_nothing_and_a_command_is_described_by_its_description(tmp_path: Path) -> None:
    plan = asked(PermissionPolicy.build(tmp_path, mode="plan"), WRITE, {"file_path": "p.txt"})
    assert (plan["suggestions"], plan["description"]) == ((), "p.txt")
    shell = asked(PermissionPolicy.build(tmp_path), BASH, {"command": "make", "description": "Build it"})
    assert (shell["suggestions"], shell["description"]) == ((), "Build it")


def test_the_suggestions_applied_stop_the_question_coming_back(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    policy = PermissionPolicy.build(ws)
    for tool, first, second in ((READ, tmp_path / "out" / "a", tmp_path / "out" / "b"),
                                (WRITE, ws / "a", ws / "b"), (WRITE, tmp_path / "x" / "a", tmp_path / "x" / "b")):
        ctx = asked(policy, tool, {"file_path": str(first)})
        assert apply_updates(policy, ctx["suggestions"])
        assert policy.evaluate(tool, {"file_path": str(second)}).behavior == "allow", (tool.name, second)
    assert policy.mode == "acceptEdits" and policy.additional_directories == [tmp_path / "x"]
    # elsewhere it still asks
    assert policy.evaluate(READ, {"file_path": str(tmp_path / "else" / "c")}).behavior == "ask"


def test_rules_are_replaced_and_removed_for_the_session_only(tmp_path: Path) -> None:
    policy = PermissionPolicy.build(tmp_path, deny=["Bash(rm *)"], allow=["Bash(ls)"])
    rule = {"toolName": "Bash", "ruleContent": "make *"}
    assert apply_updates(policy, [{"type": "addRules", "rules": [rule], "behavior": "allow"}])
    assert policy.evaluate(BASH, {"command": "make all"}).behavior == "allow"
    assert apply_updates(policy, [{"type": "removeRules", "rules": [rule], "behavior": "allow"}])
    assert policy.evaluate(BASH, {"command": "make all"}).behavior == "ask"
    assert apply_updates(policy, [{"type": "replaceRules", "behavior": "deny",
                                   "rules": [{"toolName": "Bash", "ruleContent": "curl *"}]}])
    # the settings' deny rule stays: a session update never drops a rule it did not add
    assert {str(r) for r in policy.deny} >= {"Bash(rm *)", "Bash(curl *)"}


BAD_UPDATES = st.sampled_from([
    {"type": "setMode", "mode": "yolo"}, {"type": "addRules", "rules": [{"toolName": "Read"}]},
    {"type": "addRules", "rules": "Read", "behavior": "allow"}, {"type": "addDirectories", "directories": "/x"},
    {"type": "teleport"}, "setMode", {"type": "removeRules", "rules": [{"ruleContent": "x"}], "behavior": "deny"},
])
GOOD_UPDATES = st.sampled_from([
    {"type": "setMode", "mode": "acceptEdits"}, {"type": "addDirectories", "directories": ["/srv"]},
    {"type": "addRules", "rules": [{"toolName": "Bash", "ruleContent": "make *"}], "behavior": "allow"},
])


@given(good=st.lists(GOOD_UPDATES, max_size=3), bad=BAD_UPDATES, at=st.integers(0, 3))
def test_one_bad_update_drops_them_all(good: list[Any], bad: Any, at: int) -> None:
    policy = PermissionPolicy.build("/tmp")
    before = (policy.mode, list(policy.allow), list(policy.additional_directories))
    updates = [*good[:at], bad, *good[at:]]
    assert apply_updates(policy, updates) is False
    assert (policy.mode, list(policy.allow), list(policy.additional_directories)) == before


def test_a_shell_command_reading_outside_asks_and_names_the_path(tmp_path: Path) -> None:
    from agentfsm.tools.bash import BashTool

    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret.txt").write_text("S\n")
    policy, bash = PermissionPolicy.build(ws), BashTool()
    for inside in ("cat a.txt", "ls", "grep -r x ."):
        assert policy.evaluate(bash, {"command": inside}).behavior == "allow", inside
    outside = {"command": f"cat {tmp_path / 'secret.txt'}", "description": "Show it"}
    ctx = asked(policy, bash, outside)
    assert (ctx["blocked_path"], ctx["description"]) == (str(tmp_path / "secret.txt"), "Show it")
    assert ctx["suggestions"][1] == {"type": "addRules", "behavior": "allow", "destination": "session",
                                     "rules": [{"toolName": "Read", "ruleContent": f"/{tmp_path}/**"}]}
    assert policy.evaluate(bash, {"command": "cat ../secret.txt"}).behavior == "ask"  # relative, still outside
    assert PermissionPolicy.build(ws, mode="dontAsk").evaluate(bash, outside).behavior == "deny"
