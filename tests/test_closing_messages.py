"""What both runtimes show after the loop ended (``phases.closing_messages``, shown by
:class:`agentfsm.runtime.runner.LoopRunner`): the API error message for a refusal Claude Code shows in
its generic form, and the interrupt marker the run's own loop added — not one its history already
ended with, and also after a compaction shortened the history."""

from __future__ import annotations

from pathlib import Path

import attrs

from agentfsm import query
from agentfsm.machine import prompts
from agentfsm.machine.options import Options
from agentfsm.machine.state import LoopState, Message, TerminalReason
from agentfsm.runtime.phases import closing_messages
from agentfsm.testing.scripted import ScriptedModel

PROMPT = Message("user", ({"type": "text", "text": "go"},))


def _state(*messages: Message, reason: TerminalReason = TerminalReason.ABORTED_STREAMING,
           detail: str | None = None) -> LoopState:
    return attrs.evolve(LoopState(messages=messages), terminal_reason=reason, terminal_detail=detail)


def test_the_marker_the_loop_added_is_shown_once_after_everything_else() -> None:
    marker = prompts.interrupt_marker(prompts.INTERRUPTED)
    [shown] = closing_messages(_state(PROMPT, marker), PROMPT.uuid, None, "s")
    assert shown["type"] == "user" and shown["message"]["content"] == [dict(b) for b in marker.content]
    assert shown["session_id"] == "s"


def test_a_marker_the_history_ended_with_is_not_shown_again() -> None:
    old = prompts.interrupt_marker(prompts.INTERRUPTED)
    assert closing_messages(_state(PROMPT, old), old.uuid, None, "s") == []


def test_a_marker_after_a_compaction_that_shortened_the_history_is_shown() -> None:
    history = [Message("user", ({"type": "text", "text": str(i)},)) for i in range(6)]
    summary = Message("user", ({"type": "text", "text": "summary"},), kind="compact_summary")
    marker = prompts.interrupt_marker(prompts.INTERRUPTED_TOOLS)
    assert len(closing_messages(_state(summary, marker), history[-1].uuid, None, "s")) == 1


def test_the_api_error_message_is_shown_for_every_refusal_in_claude_codes_words() -> None:
    state = _state(PROMPT, reason=TerminalReason.API_ERROR, detail="bad request")
    [error] = closing_messages(state, PROMPT.uuid, 400, "s")
    assert error["is_api_error_message"] and error["api_error_status"] == 400
    assert "bad request" in error["message"]["content"][0]["text"]
    # a 429 and a 5xx too, each in its own words and kind (Claude Code 2.1.332: docs/conform.md)
    [limited] = closing_messages(state, PROMPT.uuid, 429, "s")
    assert limited["error"] == "rate_limit"
    assert limited["message"]["content"][0]["text"] == "API Error: Request rejected (429) \u00b7 bad request"
    [server] = closing_messages(state, PROMPT.uuid, 529, "s", "gw:9")
    assert server["error"] == "server_error" and server["message"]["content"][0]["text"].endswith("(gw:9).")
    # no status (the call never reached the API), or a run that ended otherwise: none
    assert closing_messages(state, PROMPT.uuid, None, "s") == []
    assert closing_messages(_state(PROMPT, reason=TerminalReason.COMPLETED), PROMPT.uuid, 400, "s") == []


async def test_the_in_process_runtime_shows_them_before_the_result(tmp_path: Path) -> None:
    """Through a local run (the Temporal workflow's twin is in tests/test_temporal.py)."""
    refusal = {"status": 400, "error_type": "invalid_request_error", "message": "bad request"}
    options = Options(cwd=tmp_path, sessions_dir=tmp_path / "s", setting_sources=(), tools=())
    shown = [m async for m in query("go", options=options, client=ScriptedModel([refusal], time_scale=0))]
    assert [m["type"] for m in shown[-2:]] == ["assistant", "result"]
    assert shown[-2]["is_api_error_message"] and shown[-1]["terminal_reason"] == "api_error"
