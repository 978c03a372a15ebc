"""HookGate: the ToolGate the pipeline calls, and the driver-facing event methods."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentfsm.hooks import build_gate
from agentfsm.hooks.config import load_settings
from agentfsm.hooks.gate import HookGate
from agentfsm.hooks.inputs import HookOutput, PreToolUseInput, StopInput, ToolCallRecord
from agentfsm.hooks.permissions import PermissionAllow, PermissionPolicy, ToolPermissionContext
from agentfsm.hooks.runner import HookMatcher
from agentfsm.machine.options import Options
from agentfsm.runtime.ports import PreToolOutcome, ToolGate
from agentfsm.tools.base import Tool
from agentfsm.tools.registry import ToolRegistry

# the shared reference material sits next to the repository (../shared/reference), as for
# tests/test_reference.py; AGENTFSM_REFERENCE_DIR points elsewhere
REFERENCE_DIR = Path(os.environ.get("AGENTFSM_REFERENCE_DIR",
                                    Path(__file__).resolve().parents[1].parent / "shared" / "reference"))
REFERENCE_STOP_HOOK = REFERENCE_DIR / "stop_block_once.sh"


class FakeTool(Tool):
    def __init__(self, name: str, read_only: bool = False) -> None:
        self.name = name
        self._read_only = read_only

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        return self._read_only


BASH, READ = FakeTool("Bash"), FakeTool("Read", True)


def settings_json(event: str, command: str, matcher: str | None = None, **perm: Any) -> str:
    entry: dict[str, Any] = {"hooks": [{"type": "command", "command": command}]}
    if matcher:
        entry["matcher"] = matcher
    data: dict[str, Any] = {"hooks": {event: [entry]}}
    if perm:
        data["permissions"] = perm
    return json.dumps(data)


def gate_with(tmp_path: Path, event: str, command: str, matcher: str | None = None, mode: str | None = None,
              **kw: Any) -> HookGate:
    perm = kw.pop("permissions", {})
    return HookGate.from_cli(tmp_path, settings=settings_json(event, command, matcher, **perm),
                             permission_mode=mode, home=tmp_path / "home", session_id="sess-1",
                             transcript_path=str(tmp_path / "t.jsonl"), **kw)


def capture(tmp_path: Path, name: str = "stdin.json") -> tuple[str, Path]:
    out = tmp_path / name
    return f"cat > '{out}'", out


def test_hook_gate_is_a_tool_gate(tmp_path: Path) -> None:
    gate: ToolGate = HookGate(tmp_path)
    assert isinstance(gate, HookGate)


async def test_pre_tool_use_stdin_and_deny_decision(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    answer = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                                "permissionDecisionReason": "not on my watch"}})
    gate = gate_with(tmp_path, "PreToolUse", f"{cap}; echo '{answer}'", matcher="Bash",
                     mode="bypassPermissions")
    pre = await gate.pre_tool_use("Bash", {"command": "ls"}, "toolu_1")
    assert pre.decision == "deny" and pre.reason == "not on my watch" and not pre.blocked
    assert pre.hook_ms > 0
    data = json.loads(out.read_text())
    assert data == {"session_id": "sess-1", "transcript_path": str(tmp_path / "t.jsonl"),
                    "cwd": str(tmp_path.resolve()), "permission_mode": "bypassPermissions",
                    "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"},
                    "tool_use_id": "toolu_1"}
    perm = await gate.permission(BASH, {"command": "ls"}, pre)
    assert perm.behavior == "deny" and perm.reason == "PreToolUse:Bash hook error: not on my watch"  # even in bypass
    # the matcher keeps the hook away from other tools
    assert (await gate.pre_tool_use("Read", {"file_path": "/a"}, "toolu_2")).decision is None


async def test_exit_2_blocks_the_call_with_claude_codes_error_text(tmp_path: Path) -> None:
    gate = gate_with(tmp_path, "PreToolUse", "echo 'rm is not allowed here' >&2; exit 2",
                     mode="bypassPermissions")
    pre = await gate.pre_tool_use("Bash", {"command": "rm x"}, "toolu_1")
    assert pre.blocked and pre.reason == "rm is not allowed here"
    perm = await gate.permission(BASH, {"command": "rm x"}, pre)
    assert perm.behavior == "deny"
    assert perm.reason == "PreToolUse:Bash hook error: rm is not allowed here"


async def test_hook_allow_cannot_override_a_deny_rule_and_ask_forces_a_question(tmp_path: Path) -> None:
    policy = PermissionPolicy.build(tmp_path, deny=["Bash(rm *)"], allow=["Bash(make)"])
    gate = HookGate(tmp_path, policy=policy)
    allow = PreToolOutcome(decision="allow")
    assert (await gate.permission(BASH, {"command": "rm -rf x"}, allow)).behavior == "deny"
    assert (await gate.permission(BASH, {"command": "cc a.c"}, allow)).behavior == "allow"
    ask = await gate.permission(BASH, {"command": "make"}, PreToolOutcome(decision="ask", reason="check"))
    assert ask.behavior == "deny" and ask.reason == "check"  # nobody to answer: the hook's reason (Claude Code)
    asked: list[str] = []

    def approve(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> PermissionAllow:
        asked.append(ctx.reason)
        return PermissionAllow()

    gate.can_use_tool = approve
    ok = await gate.permission(BASH, {"command": "make"}, PreToolOutcome(decision="ask", reason="check"))
    assert ok.behavior == "allow" and asked == ["check"] and ok.permission_ms >= 0


async def test_updated_input_is_judged_and_passed_on(tmp_path: Path) -> None:
    answer = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow",
                                                "updatedInput": {"command": "ls -la"}}})
    gate = gate_with(tmp_path, "PreToolUse", f"echo '{answer}'", permissions={"deny": ["Bash(rm *)"]})
    pre = await gate.pre_tool_use("Bash", {"command": "ls"}, "t")
    assert pre.updated_input == {"command": "ls -la"}
    perm = await gate.permission(BASH, {"command": "ls"}, pre)
    assert perm.behavior == "allow" and perm.updated_input == {"command": "ls -la"}
    # a rewrite into a denied command is denied; so is a denied original laundered by a rewrite
    bad = PreToolOutcome(decision="allow", updated_input={"command": "rm -rf /"})
    assert (await gate.permission(BASH, {"command": "ls"}, bad)).behavior == "deny"
    laundered = PreToolOutcome(decision="allow", updated_input={"command": "ls"})
    assert (await gate.permission(BASH, {"command": "rm -rf /"}, laundered)).behavior == "deny"


async def test_continue_false_in_pre_tool_use(tmp_path: Path) -> None:
    gate = gate_with(tmp_path, "PreToolUse", """echo '{"continue": false, "stopReason": "quota"}'""")
    pre = await gate.pre_tool_use("Read", {"file_path": "/a"}, "t")
    assert pre.stop and pre.stop_reason == "quota"


async def test_post_tool_use(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    answer = json.dumps({"decision": "block", "reason": "lint failed", "hookSpecificOutput": {
        "hookEventName": "PostToolUse", "additionalContext": "ran ruff", "updatedToolOutput": "redacted"}})
    gate = gate_with(tmp_path, "PostToolUse", f"{cap}; echo '{answer}'")
    post = await gate.post_tool_use("Read", {"file_path": "/a"}, "toolu_7", {"content": "secret"}, 12.5)
    assert post.updated_output == "redacted" and post.additional_context == ("ran ruff",)
    assert post.blocked and post.reason == "lint failed"
    data = json.loads(out.read_text())
    # whole milliseconds, as Claude Code gives them
    assert data["tool_response"] == {"content": "secret"} and data["duration_ms"] == 12
    assert data["hook_event_name"] == "PostToolUse" and data["tool_use_id"] == "toolu_7"


async def test_post_tool_use_failure(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    gate = gate_with(tmp_path, "PostToolUseFailure", f"{cap}; echo 'try again' >&2; exit 2")
    post = await gate.post_tool_use_failure("Bash", {"command": "x"}, "toolu_8", "command not found", False)
    assert post.blocked and post.reason == "try again" and post.updated_output is None
    data = json.loads(out.read_text())
    assert (data["error"], data["is_interrupt"], data["tool_name"]) == ("command not found", False, "Bash")


async def test_stop_with_the_reference_hook(tmp_path: Path) -> None:
    if not REFERENCE_STOP_HOOK.exists():
        pytest.skip(f"no reference hook at {REFERENCE_STOP_HOOK} (set AGENTFSM_REFERENCE_DIR)")
    gate = gate_with(tmp_path, "Stop", f"bash {REFERENCE_STOP_HOOK}")
    first = await gate.stop("FIRST_DONE", stop_hook_active=False)
    assert first.blocked and "STOP_HOOK_REENTER_MARKER" in first.reason and not first.prevented
    second = await gate.stop("STOP_REENTRY_OK", stop_hook_active=True)
    assert not second.blocked and not second.prevented


async def test_stop_continue_false_overrides_a_block(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    gate = gate_with(tmp_path, "Stop", f"""{cap}; echo '{{"continue": false, "stopReason": "budget",
                                          "decision": "block", "reason": "more"}}'""")
    outcome = await gate.stop("bye", stop_hook_active=True)
    assert outcome.prevented and outcome.stop_reason == "budget" and not outcome.blocked
    data = json.loads(out.read_text())
    assert data["stop_hook_active"] is True and data["last_assistant_message"] == "bye"


async def test_subagent_stop_matches_agent_type(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    gate = gate_with(tmp_path, "SubagentStop", f"{cap}; echo 'keep exploring' >&2; exit 2", matcher="Explore")
    hit = await gate.subagent_stop(agent_id="a1", agent_type="Explore", agent_transcript_path="/a1.jsonl",
                                   last_assistant_message="found it")
    assert hit.blocked and hit.reason == "keep exploring"
    data = json.loads(out.read_text())
    assert (data["agent_id"], data["agent_type"]) == ("a1", "Explore")
    assert data["agent_transcript_path"] == "/a1.jsonl"
    assert not (await gate.subagent_stop(agent_type="Plan")).blocked


async def test_post_tool_batch(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    gate = gate_with(tmp_path, "PostToolBatch", f"""{cap}; echo '{{"decision": "block", "reason": "audit",
        "hookSpecificOutput": {{"hookEventName": "PostToolBatch", "additionalContext": "3 calls"}}}}'""")
    result = await gate.post_tool_batch([
        ToolCallRecord(tool_name="Read", tool_input={"file_path": "/a"}, tool_use_id="a", tool_response="A"),
        {"tool_name": "Bash", "tool_input": {"command": "x"}, "tool_use_id": "b"}])
    blocked, reason, stop, stop_reason, context = result
    assert (blocked, reason, stop, stop_reason, context) == (True, "audit", False, "", ("3 calls",))
    calls = json.loads(out.read_text())["tool_calls"]
    assert [c["tool_use_id"] for c in calls] == ["a", "b"] and "tool_response" not in calls[1]


async def test_user_prompt_submit(tmp_path: Path) -> None:
    gate = gate_with(tmp_path, "UserPromptSubmit", "echo 'Today is Tuesday.'", matcher="ignored")
    blocked, _, context = await gate.user_prompt_submit("what day is it?")
    assert not blocked and context == ("Today is Tuesday.",)
    gate = gate_with(tmp_path, "UserPromptSubmit",
                     'grep -q password && { echo "no secrets in prompts" >&2; exit 2; }; exit 0')
    outcome = await gate.user_prompt_submit("my password is hunter2")
    assert outcome.blocked and outcome.reason == "no secrets in prompts"
    assert not (await gate.user_prompt_submit("hello")).blocked


async def test_session_and_compact_events(tmp_path: Path) -> None:
    cap, out = capture(tmp_path)
    gate = gate_with(tmp_path, "SessionStart", f"{cap}; echo 'project uses uv'", matcher="startup|resume")
    start = await gate.session_start("resume")
    assert start.additional_context == ("project uses uv",)
    assert json.loads(out.read_text())["source"] == "resume"
    assert (await gate.session_start("clear")).additional_context == ()
    # exit 2 on a non-blocking event only reaches the user
    gate = gate_with(tmp_path, "SessionEnd", "echo 'cleanup failed' >&2; exit 2")
    end = await gate.session_end("logout")
    assert end.user_messages == ("cleanup failed",) and not end.stop
    cap2, out2 = capture(tmp_path, "compact.json")
    gate = gate_with(tmp_path, "PreCompact", cap2, matcher="manual")
    await gate.pre_compact("manual", "keep the todo list")
    data = json.loads(out2.read_text())
    assert (data["trigger"], data["custom_instructions"]) == ("manual", "keep the todo list")
    out2.unlink()
    await gate.pre_compact("auto", None)
    assert not out2.exists()


async def test_python_hooks_api(tmp_path: Path) -> None:
    seen: list[PreToolUseInput] = []

    async def guard(record: PreToolUseInput) -> HookOutput | None:
        seen.append(record)
        if "rm" in record.tool_input.get("command", ""):
            return HookOutput.deny("python says no")
        return None

    def stopper(record: StopInput) -> dict[str, Any]:
        return {"decision": "block", "reason": "write the summary first"}

    gate = HookGate(tmp_path, permission_mode="manual", session_id="s9",
                    python_hooks={"PreToolUse": [HookMatcher(matcher="Bash", hooks=[guard])],
                                  "Stop": [HookMatcher(hooks=[stopper])]})
    pre = await gate.pre_tool_use("Bash", {"command": "rm -rf x"}, "toolu_1")
    assert pre.decision == "deny" and pre.reason == "python says no"
    assert isinstance(seen[0], PreToolUseInput) and seen[0].permission_mode == "default"
    assert seen[0].session_id == "s9" and seen[0].tool_use_id == "toolu_1"
    assert (await gate.stop()).reason == "write the summary first"
    with pytest.raises(ValueError, match="unknown hook event"):
        HookGate(tmp_path, python_hooks={"PreToolUs": [HookMatcher(hooks=[guard])]})


async def test_settings_and_python_hooks_together(tmp_path: Path) -> None:
    settings = load_settings(tmp_path, settings_json("Stop", "echo from-command >&2; exit 2"),
                             home=tmp_path / "h")

    def py(record: StopInput) -> HookOutput:
        return HookOutput.block("from-python")

    gate = HookGate(tmp_path, settings=settings, python_hooks={"Stop": [HookMatcher(hooks=[py])]})
    outcome = await gate.stop()
    assert outcome.blocked and outcome.reason.split("\n") == ["from-command", "from-python"]


def test_gate_modes_and_visible_tools(tmp_path: Path) -> None:
    gate = HookGate.from_cli(tmp_path, disallowed_tools="Write", home=tmp_path / "h",
                             settings='{"permissions": {"defaultMode": "plan", "deny": ["WebFetch"]}}')
    assert gate.permission_mode == "plan"
    gate.permission_mode = "manual"
    assert gate.permission_mode == "default"
    assert gate.visible_tools(["Read", "Write", "WebFetch", "Bash"]) == ["Read", "Bash"]
    cli_wins = HookGate.from_cli(tmp_path, settings='{"permissions": {"defaultMode": "plan"}}',
                                 permission_mode="acceptEdits", home=tmp_path / "h")
    assert cli_wins.permission_mode == "acceptEdits"
    with pytest.raises(ValueError):
        gate.permission_mode = "yolo"


async def test_read_only_tools_pass_and_others_are_denied_without_anyone_to_ask(tmp_path: Path) -> None:
    gate = HookGate(tmp_path)
    assert (await gate.permission(READ, {"file_path": str(tmp_path / "a")}, PreToolOutcome())).behavior == "allow"
    # outside the working directory even a read needs approval: nobody to ask denies it
    assert (await gate.permission(READ, {"file_path": "/a"}, PreToolOutcome())).behavior == "deny"
    denied = await gate.permission(BASH, {"command": "make"}, PreToolOutcome())
    assert denied.behavior == "deny" and denied.rule == "non_interactive"


async def test_build_gate_from_session_options(tmp_path: Path) -> None:
    (tmp_path / ".claude").mkdir()
    (tmp_path / ".claude/settings.json").write_text(json.dumps(
        {"permissions": {"defaultMode": "acceptEdits", "deny": ["Write"]}}))
    seen: list[Any] = []

    async def cb(name: str, inp: Mapping[str, Any], ctx: Mapping[str, Any]) -> bool:
        seen.append((ctx["reason"], dict(ctx)["permission_mode"]))
        return True

    def py_stop(record: StopInput) -> HookOutput:
        return HookOutput.block("not yet")

    options = Options(cwd=tmp_path, settings='{"permissions": {"allow": ["Bash(ls *)"]}}',
                      setting_sources=("project",), disallowed_tools=("Grep",), can_use_tool=cb,
                      hooks={"Stop": [HookMatcher(hooks=[py_stop])]})
    registry = ToolRegistry([FakeTool("Bash"), FakeTool("Grep", True), FakeTool("Read", True),
                             FakeTool("Write")])
    gate = build_gate(options, session_id="s1", transcript_path="/t.jsonl", registry=registry)
    assert gate.permission_mode == "acceptEdits"  # Options' "default" lets defaultMode apply
    assert gate.filter_registry(registry).names() == ["Bash", "Read"]
    assert (await gate.stop()).reason == "not yet"
    assert (await gate.permission(BASH, {"command": "make"}, PreToolOutcome())).behavior == "allow"
    assert seen == [("This command requires approval", "acceptEdits")]  # Claude Code's text
    assert build_gate(attrs.evolve(options, permission_mode="plan")).permission_mode == "plan"
