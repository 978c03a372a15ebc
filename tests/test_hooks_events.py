"""Event records serialise to Claude Code's stdin JSON; hook answers parse from its JSON shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.hooks.inputs import (
    HOOK_EVENTS,
    INPUT_TYPES,
    HookEvent,
    HookOutput,
    PostToolBatchInput,
    PostToolUseFailureInput,
    PostToolUseInput,
    PreCompactInput,
    PreToolUseInput,
    SessionEndInput,
    SessionStartInput,
    StopInput,
    SubagentStopInput,
    ToolCallRecord,
    UserPromptSubmitInput,
    parse_hook_output,
)

COMMON = ["session_id", "transcript_path", "cwd", "permission_mode", "hook_event_name"]

# docs/behaviour.md §10, field for field.
EXPECTED_FIELDS = {
    "PreToolUse": ["tool_name", "tool_input", "tool_use_id"],
    "PostToolUse": ["tool_name", "tool_input", "tool_use_id", "tool_response", "duration_ms"],
    "PostToolUseFailure": ["tool_name", "tool_input", "tool_use_id", "error", "is_interrupt", "duration_ms"],
    "PostToolBatch": ["tool_calls"],
    "Stop": ["stop_hook_active", "last_assistant_message", "background_tasks", "session_crons"],
    "SubagentStop": ["stop_hook_active", "agent_transcript_path", "last_assistant_message", "background_tasks",
                     "session_crons"],
    "SubagentStart": [],
    "UserPromptSubmit": ["prompt"],
    "PreCompact": ["trigger", "custom_instructions"],
    "SessionStart": ["source"],
    "SessionEnd": ["reason"],
}


def make(event: str) -> Any:
    common = {"session_id": "s", "transcript_path": "/t.jsonl", "cwd": "/w", "permission_mode": "plan"}
    extra: dict[str, Any] = {
        "PreToolUse": {"tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1"},
        "PostToolUse": {"tool_name": "Read", "tool_input": {"file_path": "/a"}, "tool_use_id": "toolu_2",
                        "tool_response": {"content": "x"}, "duration_ms": 12.5},
        "PostToolUseFailure": {"tool_name": "Bash", "tool_use_id": "toolu_3", "error": "boom",
                               "is_interrupt": True},
        "PostToolBatch": {"tool_calls": [{"tool_name": "Read", "tool_input": {}, "tool_use_id": "a"}]},
        "Stop": {"stop_hook_active": True, "last_assistant_message": "done"},
        "SubagentStop": {"agent_id": "ag1", "agent_type": "Explore", "agent_transcript_path": "/a.jsonl"},
        "SubagentStart": {"agent_id": "ag1", "agent_type": "Explore"},
        "UserPromptSubmit": {"prompt": "hello"},
        "PreCompact": {"trigger": "manual", "custom_instructions": "keep the plan"},
        "SessionStart": {"source": "resume"},
        "SessionEnd": {"reason": "logout"},
    }[event]
    return INPUT_TYPES[event](**common, **extra)


def test_every_event_has_a_record() -> None:
    assert set(INPUT_TYPES) == set(HOOK_EVENTS) == set(EXPECTED_FIELDS)


@pytest.mark.parametrize("event", HOOK_EVENTS)
def test_stdin_json_has_exactly_the_claude_code_fields(event: str) -> None:
    data = json.loads(make(event).to_json())
    common = COMMON
    if event in ("SubagentStop", "SubagentStart"):
        # the subagent is named after the permission mode, which SubagentStart leaves out (Claude Code 2.1.332)
        common = [*COMMON[:4], "agent_id", "agent_type", "hook_event_name"]
        if event == "SubagentStart":
            common.remove("permission_mode")
    assert list(data) == common + EXPECTED_FIELDS[event]
    assert data["hook_event_name"] == event
    assert data.get("permission_mode", "plan") == "plan"


def test_a_subagents_events_name_it_and_the_main_sessions_do_not() -> None:
    named = json.loads(PreToolUseInput(tool_name="Read", agent_id="a1", agent_type="Explore").to_json())
    assert list(named)[3:7] == ["permission_mode", "agent_id", "agent_type", "hook_event_name"]
    assert "agent_id" not in json.loads(PreToolUseInput(tool_name="Read").to_json())


def test_json_is_compact_like_claude_codes() -> None:
    raw = StopInput(stop_hook_active=True).to_json()
    assert '"stop_hook_active":true' in raw and ": " not in raw


def test_post_tool_batch_omits_missing_responses() -> None:
    record = PostToolBatchInput(tool_calls=[
        ToolCallRecord(tool_name="Read", tool_input={"file_path": "/a"}, tool_use_id="a", tool_response="A"),
        {"tool_name": "Bash", "tool_input": {"command": "x"}, "tool_use_id": "b"},
    ])
    calls = json.loads(record.to_json())["tool_calls"]
    assert calls == [
        {"tool_name": "Read", "tool_input": {"file_path": "/a"}, "tool_use_id": "a", "tool_response": "A"},
        {"tool_name": "Bash", "tool_input": {"command": "x"}, "tool_use_id": "b"},
    ]


def test_non_json_values_are_made_plain() -> None:
    from pathlib import Path

    response = {"path": Path("/x"), "raw": b"\xff", "t": (1, 2)}
    record = PostToolUseInput(tool_name="Read", tool_response=response)
    assert json.loads(record.to_json())["tool_response"] == {"path": "/x", "raw": "\ufffd", "t": [1, 2]}


def test_matcher_subjects() -> None:
    assert PreToolUseInput(tool_name="Edit").matcher_subject() == "Edit"
    assert PostToolUseFailureInput(tool_name="Bash").matcher_subject() == "Bash"
    assert SessionStartInput(source="compact").matcher_subject() == "compact"
    assert SessionEndInput(reason="clear").matcher_subject() == "clear"
    assert PreCompactInput(trigger="manual").matcher_subject() == "manual"
    assert SubagentStopInput(agent_type="Plan").matcher_subject() == "Plan"
    for record in (StopInput(), UserPromptSubmitInput(), PostToolBatchInput()):
        assert record.matcher_subject() is None


# ---------------------------------------------------------------------------------------------
# Output parsing

def test_pre_tool_use_output() -> None:
    out, notes = parse_hook_output({"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "no",
        "updatedInput": {"command": "ls -l"}, "additionalContext": "ctx"}}, "PreToolUse")
    assert notes == ()
    assert (out.permission_decision, out.permission_decision_reason) == ("deny", "no")
    assert out.updated_input == {"command": "ls -l"} and out.additional_context == "ctx"


def test_wrong_event_name_is_ignored_with_a_note() -> None:
    out, notes = parse_hook_output({"continue": False, "hookSpecificOutput": {
        "hookEventName": "PostToolUse", "permissionDecision": "deny"}}, "PreToolUse")
    assert out.permission_decision is None and not out.continue_
    assert len(notes) == 1 and "PostToolUse" in notes[0]
    out, notes = parse_hook_output({"hookSpecificOutput": {"permissionDecision": "deny"}}, "PreToolUse")
    assert out.permission_decision is None and notes


def test_legacy_pre_tool_use_decisions() -> None:
    assert parse_hook_output({"decision": "approve"}, "PreToolUse")[0].permission_decision == "allow"
    out, _ = parse_hook_output({"decision": "block", "reason": "r"}, "PreToolUse")
    assert (out.permission_decision, out.permission_decision_reason, out.decision) == ("deny", "r", None)


def test_decision_block_only_where_it_means_something() -> None:
    for event in ("Stop", "SubagentStop", "UserPromptSubmit", "PostToolUse", "PostToolUseFailure",
                  "PostToolBatch"):
        assert parse_hook_output({"decision": "block", "reason": "r"}, event)[0].decision == "block"
    out, notes = parse_hook_output({"decision": "block"}, "SessionStart")
    assert out.decision is None and notes


def test_bad_fields_are_noted_not_fatal() -> None:
    out, notes = parse_hook_output({"continue": "no", "reason": "kept", "hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "perhaps", "updatedInput": "x"}}, "PreToolUse")
    assert out.continue_ and out.reason == "kept" and out.permission_decision is None
    assert out.updated_input is None and len(notes) == 3


def test_post_tool_use_updated_output() -> None:
    out, _ = parse_hook_output({"hookSpecificOutput": {"hookEventName": "PostToolUse",
                                                       "updatedToolOutput": "redacted"}}, "PostToolUse")
    assert out.updated_tool_output == "redacted"
    # only PostToolUse can replace output
    out, _ = parse_hook_output({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                                       "updatedToolOutput": "x"}}, "PreToolUse")
    assert out.updated_tool_output is None


PRE_TOOL_OUTPUTS = st.builds(
    HookOutput,
    continue_=st.booleans(), stop_reason=st.text(max_size=5), suppress_output=st.booleans(),
    system_message=st.text(max_size=5), reason=st.text(max_size=5),
    permission_decision=st.sampled_from([None, "allow", "deny", "ask", "defer"]),
    permission_decision_reason=st.text(max_size=5),
    updated_input=st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
    additional_context=st.text(max_size=5),
)
STOP_OUTPUTS = st.builds(
    HookOutput,
    continue_=st.booleans(), stop_reason=st.text(max_size=5), decision=st.sampled_from([None, "block"]),
    reason=st.text(max_size=5), additional_context=st.text(max_size=5),
)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PRE_TOOL_OUTPUTS)
def test_typed_pre_tool_output_round_trips_through_json(out: HookOutput) -> None:
    back, notes = parse_hook_output(json.loads(json.dumps(out.to_json_dict("PreToolUse"))), "PreToolUse")
    assert notes == () and back == out


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STOP_OUTPUTS)
def test_typed_stop_output_round_trips_through_json(out: HookOutput) -> None:
    back, notes = parse_hook_output(json.loads(json.dumps(out.to_json_dict("Stop"))), "Stop")
    assert notes == () and back == out


def test_output_constructors() -> None:
    assert HookOutput.deny("x").to_json_dict("PreToolUse") == {"hookSpecificOutput": {
        "hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "x"}}
    assert HookOutput.block("r").to_json_dict("Stop") == {"decision": "block", "reason": "r"}
    assert HookOutput.stop("bye").to_json_dict("Stop") == {"continue": False, "stopReason": "bye"}
    assert HookOutput.allow(updated_input={"a": 1}).updated_input == {"a": 1}
    assert HookOutput.ask("?").permission_decision == "ask"
    assert HookOutput.context("c").additional_context == "c"
    assert HookEvent.PRE_TOOL_USE == "PreToolUse"
