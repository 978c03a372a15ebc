"""The SDK-facing view of agentfsm's stream-json messages (agentfsm.commandline.control.SdkAccounting)."""

from __future__ import annotations

from typing import Any

from agentfsm.commandline.control import SdkAccounting


def user(*blocks: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
    return {"type": "user", "message": {"role": "user", "content": list(blocks)}, "parent_tool_use_id": parent}


def result(turns: int, usage: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "result", "num_turns": turns, "modelUsage": usage}


def lifecycle(uid: str, state: str) -> dict[str, Any]:
    return {"type": "system", "subtype": "command_lifecycle", "uuid": uid, "state": state}


def answer() -> dict[str, Any]:
    return {"type": "assistant", "message": {"content": []}, "parent_tool_use_id": None}


def test_num_turns_counts_tool_result_and_marker_messages_and_usage_adds_up() -> None:
    view = SdkAccounting()
    for m in (user({"type": "tool_result", "tool_use_id": "a"}), user({"type": "tool_result", "tool_use_id": "b"}),
              user({"type": "tool_result", "tool_use_id": "c"}, parent="toolu_agent"),  # a subagent's: not counted
              user({"type": "text", "text": "a prompt echoed"})):
        assert view(m) == m
    first = view(result(2, {"m": {"inputTokens": 10, "outputTokens": 1}}))
    assert first is not None and first["num_turns"] == 3
    view(user({"type": "text", "text": "[Request interrupted by user for tool use]"}))
    second = view(result(1, {"m": {"inputTokens": 5, "outputTokens": 2}, "n": {"inputTokens": 1}}))
    assert second is not None and second["num_turns"] == 2
    assert second["modelUsage"] == {"m": {"inputTokens": 15, "outputTokens": 3}, "n": {"inputTokens": 1}}
    # a run stopped before any request took no turn, whatever was shown
    stopped = view(result(0, {}))
    assert stopped is not None and stopped["num_turns"] == 0


def test_only_prompts_sent_with_a_uuid_have_a_lifecycle_and_are_named() -> None:
    view = SdkAccounting()
    assert view(lifecycle("mine-not", "queued")) is None
    view.given_uuids.update({"u1", "u2"})
    assert view(lifecycle("u1", "queued")) is not None
    view(lifecycle("u1", "started"))
    named = view(answer())
    assert named is not None and (named["user_message_uuid"], named["user_message_uuids"]) == ("u1", ["u1"])
    plain = view(answer())
    assert plain is not None and "user_message_uuid" not in plain
    view(lifecycle("u2", "started"))  # taken in mid-turn
    named = view(answer())
    assert named is not None and named["user_message_uuids"] == ["u1", "u2"]
    done = view(result(1, {}))
    assert done is not None and (done["user_message_uuid"], done["user_message_uuids"]) == ("u2", ["u1", "u2"])
    later = view(result(1, {}))
    assert later is not None and "user_message_uuid" not in later
