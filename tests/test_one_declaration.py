"""One declaration decides every move: regressions for decisions the driver used to re-derive, tried
through the public testing kit as a user would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentfsm.hooks import HookMatcher, HookOutput
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits
from agentfsm.testing.stateful import LoopHarness, RequestContext, assert_invariants, run_loop

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def text(t: str) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": "end_turn"}


def structured(answer: Any, tid: str = "so_1") -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "StructuredOutput", "input": {"answer": answer}}],
            "stop_reason": "tool_use"}


def always_block(_record: Any) -> HookOutput:
    return HookOutput.block("keep going")


def test_stop_hook_cap_warning_only_when_the_cap_decided() -> None:
    """max_turns wins over the Stop-hook block cap; the cap's warning comes from the step that
    overrides the block, so a run ended by max_turns carries no such warning."""
    hooks = {"Stop": [HookMatcher(hooks=[always_block])]}
    run = run_loop([text("done")] * 12, hooks=hooks, limits=Limits(max_turns=9))
    assert_invariants(run)
    assert run.result.terminal_reason.value == "max_turns" and run.result.subtype == "error_max_turns"
    assert run.result.warnings == ()
    assert len(run.main_requests()) == 9
    # without max_turns the cap decides: 1 + 8 requests, completed, with the warning
    run = run_loop([text("done")] * 12, hooks=hooks)
    assert_invariants(run)
    assert run.result.terminal_reason.value == "completed" and len(run.main_requests()) == 1 + 8
    assert run.result.warnings == ("Stop hook blocked 9 times in a row; overriding the block and ending the turn.",)


def _typed_during_first_request(ctx: RequestContext) -> None:
    """The user types once, while the first request of the first run is answered."""
    if ctx.kind == "main" and ctx.index == 0 and len(ctx.harness.runs) == 0:
        ctx.harness.session.submit("TYPED_MID_TURN")


def _harness(tmp_path: Path, script: list[dict[str, Any]]) -> LoopHarness:
    ws = tmp_path / "ws"
    ws.mkdir()
    options = Options(tools=(), permission_mode="bypassPermissions", cwd=ws, sessions_dir=tmp_path / "s",
                      setting_sources=(), json_schema=SCHEMA, limits=Limits(structured_output_retries=0))
    return LoopHarness(options, script=script, on_request=_typed_during_first_request)


def test_input_typed_before_a_final_batch_is_not_taken(tmp_path: Path) -> None:
    """The run ends at its tool batch (no valid structured output, no retries left): no request
    follows, so what the user typed meanwhile stays queued for the next run — not appended to the
    history and marked cancelled."""
    harness = _harness(tmp_path, [structured(42), structured("fine", "so_2")])
    try:
        run = harness.run("give me JSON")
        assert run.result.terminal_reason.value == "structured_output_retry_exhausted"
        assert_invariants(run)
        assert not any("TYPED_MID_TURN" in m.text() for m in run.state.messages)
        [item] = harness.session.queue.pending
        assert item.state == "queued" and item.text() == "TYPED_MID_TURN"
        # the next run takes it with its first request
        again = harness.run("again")
        assert again.result.terminal_reason.value == "completed"
        assert "TYPED_MID_TURN" in str(again.main_requests()[0].request.messages)
        assert item.state == "completed"
    finally:
        harness.close()


def test_input_typed_before_a_final_answer_is_not_taken(tmp_path: Path) -> None:
    """The same when the answer itself ends the run (recovery exhausted at the end of the stream)."""
    harness = _harness(tmp_path, [text("no JSON here")])
    try:
        run = harness.run("give me JSON")
        assert run.result.terminal_reason.value == "structured_output_retry_exhausted"
        assert not any("TYPED_MID_TURN" in m.text() for m in run.state.messages)
        assert [i.state for i in harness.session.queue.pending] == ["queued"]
    finally:
        harness.close()


def test_input_typed_during_a_tool_batch_rides_the_next_request(tmp_path: Path) -> None:
    """A request that really follows takes the input: in the conversation, once, after the results."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("ALPHA\n")
    options = Options(tools=("Read",), permission_mode="bypassPermissions", cwd=ws, sessions_dir=tmp_path / "s",
                      setting_sources=())
    read = {"blocks": [{"type": "tool_use", "id": "r1", "name": "Read", "input": {"file_path": str(ws / "a.txt")}}],
            "stop_reason": "tool_use"}
    harness = LoopHarness(options, script=[read, text("done")], on_request=_typed_during_first_request)
    try:
        run = harness.run("read it")
        assert_invariants(run)
        second = run.main_requests()[1].request.messages
        user = second[-1]
        assert user["role"] == "user" and user["content"][0]["type"] == "tool_result"
        assert sum("TYPED_MID_TURN" in str(b) for b in user["content"]) == 1
        assert harness.session.queue.pending == ()
        assert any(rec.get("trigger") == "open_stream" for rec in run.records)
    finally:
        harness.close()
