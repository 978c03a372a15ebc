"""Random interleavings of model failures through the real driver (in process).

Hypothesis scripts whole conversations from the testing kit's strategies — answers, tool calls
(valid, invalid, unparsable), malformed tool use, max_tokens, thinking-only, prompt-too-long, API
errors (429/500/529 retried by a mimicked SDK, 400s final), streams that break or send an SSE error —
under small random caps, with or without a fallback model and a Stop hook that keeps blocking. Every
run must end with a result whose subtype matches its terminal reason, never send a request after
that, keep every counter within its cap, pair every tool_use, and leave a session file the auditor
finds clean.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentfsm.auditing.audit import audit_file
from agentfsm.hooks import HookMatcher
from agentfsm.hooks.inputs import HookOutput
from agentfsm.llm.model import ModelCallError, ModelRequest, StreamEvent
from agentfsm.machine import graph
from agentfsm.machine.events import ModelError
from agentfsm.machine.options import Options
from agentfsm.machine.state import COUNTER_CAPS, TERMINAL_INFO, Limits, TerminalReason
from agentfsm.runtime.request import normalize
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import Response, SseError, StreamedResponse, TextBlock, ToolUseBlock, exhausted_response
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.testing.strategies import (
    loop_limits,
    model_behaviours,
    stream_breaks,
    tool_call_responses,
    unique_tool_ids,
)
from agentfsm.tools.base import Tool, ToolContext, ToolOutput


class Echo(Tool):
    """Concurrency-safe and side-effect free: the property is about the loop, not the filesystem."""

    name = "Echo"
    description = "Echo a text."
    input_schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                    "additionalProperties": False}

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return True

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput(input["text"])


class Tally(Tool):
    """Concurrency-unsafe (a barrier for the executor) and counting, still without side effects."""

    name = "Tally"
    description = "Count to n."
    input_schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 5}},
                    "required": ["n"]}

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        await asyncio.sleep(0)
        return ToolOutput(list(range(input["n"])))


TOOLS = (Echo(), Tally())
ERROR_REASONS_NEVER_EXPECTED = {TerminalReason.MODEL_ERROR, TerminalReason.TURN_SETUP_FAILED}
AFTER_ABORT = {TerminalReason.ABORTED_STREAMING, TerminalReason.ABORTED_TOOLS, TerminalReason.API_ERROR,
               TerminalReason.PROMPT_TOO_LONG, TerminalReason.IMAGE_ERROR}


# The API says the prompt is too long part-way through a response (after the blocks it showed): a
# failure a compaction may answer. The scripted model reports it as its transport would an SSE error
# with this message (an API error), so the model below reports it as the API's prompt-too-long answer,
# as tests/test_coverage.py's fault does.
PROMPT_TOO_LONG_MID_STREAM = "prompt is too long: 203000 tokens > 200000 maximum"


class PromptTooLongMidStream(ScriptedModel):
    async def _once(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        try:
            async for event in super()._once(request):
                yield event
        except ModelCallError as exc:
            if exc.error.message != PROMPT_TOO_LONG_MID_STREAM:
                raise
            raise ModelCallError(ModelError("prompt_too_long", exc.error.message, 400)) from exc


async def drive(tmp: Path, behaviour: list[Response], limits: Limits, *, retries: int, fallback: bool,
                block_stop: bool, abort_at: int | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ws = tmp / "ws"
    ws.mkdir()
    out: list[dict[str, Any]] = []
    late: list[int] = []

    def answer(request: ModelRequest, n: int) -> Response:
        if out and out[-1].get("type") == "result":
            late.append(n)  # recorded, not raised: an exception here would become a model error
        if n == abort_at:
            session.interrupt()  # the user cancels while this request is under way
        return behaviour[n] if n < len(behaviour) else exhausted_response()

    hooks = {"Stop": [HookMatcher(hooks=(lambda _r: HookOutput.block("keep going"),))]} if block_stop else {}
    options = Options(tools=(), extra_tools=TOOLS, permission_mode="bypassPermissions", cwd=ws, limits=limits,
                      fallback_models=("claude-haiku-4-5",) if fallback else (), hooks=hooks,
                      sessions_dir=tmp / "sessions", setting_sources=())
    model = PromptTooLongMidStream(answer, max_retries=retries, time_scale=0)
    session = Session(options, client=model, emit=out.append)
    try:
        result = await asyncio.wait_for(session.run("go"), 20)
    finally:
        await session.aclose()

    if abort_at is not None and abort_at < model.count:
        # cancelled mid-request: the run ends aborted — or with the error that request came back with
        assert result.terminal_reason in AFTER_ABORT, result.terminal_reason
    # a result, classified as the terminal table says, and nothing asked of the model after it
    info = TERMINAL_INFO[result.terminal_reason]
    assert (result.subtype, result.is_error) == (info.subtype, info.is_error)
    assert out[-1]["type"] == "result" and out[-1]["terminal_reason"] == result.terminal_reason.value
    assert not late, f"requests {late} were sent after the result"
    assert result.terminal_reason not in ERROR_REASONS_NEVER_EXPECTED, (result.terminal_reason, result.errors)
    # bounded: each request takes one scripted answer, and only blocking Stop hooks add requests past
    # the script's end (up to their cap), and a summary answer without its <summary> block one more
    assert model.count <= len(behaviour) + limits.stop_hook_block_cap + 3
    # counters within their caps at the end (the auditor checks every step of the trace)
    state = session.last_state
    counters = state.counters()
    for counter, cap in COUNTER_CAPS.items():
        assert counters[counter] <= getattr(limits, cap), counter
    if limits.max_turns is not None:
        assert state.turn_count <= limits.max_turns
    # the history a resumed session would send: alternating roles, every tool_use answered once
    wire = normalize(state.messages)
    assert [m["role"] for m in wire] == ["user", "assistant"] * (len(wire) // 2) + ["user"] * (len(wire) % 2)
    all_uses = [b["id"] for m in wire for b in m["content"] if b.get("type") == "tool_use"]
    assert len(all_uses) == len(set(all_uses)), f"a tool_use occurs twice: {all_uses}"
    for i, m in enumerate(wire):
        uses = [b["id"] for b in m["content"] if b.get("type") == "tool_use"]
        if uses:
            assert i + 1 < len(wire)
            got = [b["tool_use_id"] for b in wire[i + 1]["content"] if b.get("type") == "tool_result"]
            assert sorted(got) == sorted(uses)
    # the session file: declared moves only, counters within caps, every request paired, no request
    # after stop
    assert session.trace_path is not None
    findings = audit_file(session.trace_path)
    assert findings == [], findings
    records = list(read_records(session.trace_path))
    shown_follows_the_moves(out, records)
    return out, records


def shown_follows_the_moves(out: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """What the client saw of every response that broke off (or was stopped) is what the move the
    machine took declares (agentfsm.machine.graph.Does): withdrawn — a tombstone names each call it showed,
    none of them is answered "stream_failed" and none reaches the history; paired — no tombstone,
    and the result the client was shown for each call is the one the history holds."""
    tombstoned = {i for m in out if m.get("subtype") == "tombstone" for i in m["tool_use_ids"]}
    shown: dict[str, list[Any]] = {}
    for m in out:
        if m.get("type") == "user":
            for b in m["message"]["content"]:
                if b.get("type") == "tool_result":
                    shown.setdefault(b["tool_use_id"], []).append(b.get("content"))
    history = {b["tool_use_id"]: b.get("content") for r in records if r.get("type") == "message"
               for b in r.get("content", ()) if b.get("type") == "tool_result"}
    for rec in records:
        event = rec.get("event") or {}
        if rec.get("type") != "transition" or event.get("type") not in ("CallFailed", "Aborted"):
            continue
        does = graph.EDGES_BY_TRIGGER[rec["trigger"]].does
        for call in (b["id"] for b in event.get("shown", ()) if b.get("type") == "tool_use"):
            if does.shown is graph.Shown.WITHDRAW:
                assert call in tombstoned and call not in history, (rec["trigger"], call)
                assert not any("stream_failed" in str(c) for c in shown.get(call, ())), (rec["trigger"], call)
            elif does.shown is graph.Shown.KEEP:
                # an error event after a complete call: the response is kept and the call runs
                # (cut_after_tool_use); its result is in the history, and nothing is withdrawn
                assert rec["trigger"] == "dispatch" and call not in tombstoned, (rec["trigger"], call)
            else:
                assert does.shown is graph.Shown.PAIR and call not in tombstoned, (rec["trigger"], call)
                assert shown[call] == [history[call]], (rec["trigger"], call)


# A few good tool turns first, sometimes: a conversation with history is what reactive compaction,
# counter resets and pairing across turns need, and a purely random script rarely builds one. Then,
# sometimes, a response the API cuts with prompt-too-long after what it showed (tool calls among it):
# a compaction answers it when there is history enough, else it ends the run.
prompt_too_long_mid_stream = stream_breaks(TOOLS).map(
    lambda r: attrs.evolve(r, break_mid_block=False, sse_error=SseError("invalid_request_error",
                                                                        PROMPT_TOO_LONG_MID_STREAM)))
conversations = st.tuples(st.lists(tool_call_responses(TOOLS, True), max_size=3),
                          st.lists(prompt_too_long_mid_stream, max_size=1),
                          model_behaviours(TOOLS, max_size=8)).map(lambda t: unique_tool_ids([*t[0], *t[1], *t[2]]))


def _echo_call(tid: str, *before: Any) -> StreamedResponse:
    return StreamedResponse(blocks=(*before, ToolUseBlock(tid, "Echo", {"text": tid})), stop_reason="tool_use")


# The case that diverged (issue 31): two tool turns, then a response that shows a tool call and is cut
# by the API's prompt-too-long error; a compaction answers it (the next scripted answer is the summary).
PROMPT_TOO_LONG_AFTER_A_CALL = [
    _echo_call("toolu_0001"), _echo_call("toolu_0002"),
    attrs.evolve(_echo_call("toolu_0003", TextBlock("reading")), break_after=2,
                 sse_error=SseError("invalid_request_error", PROMPT_TOO_LONG_MID_STREAM)),
    StreamedResponse(blocks=(TextBlock("SUMMARY: echoed twice"),), stop_reason="end_turn"),
]


def test_prompt_too_long_mid_stream_after_a_tool_call_withdraws_what_was_shown(tmp_path: Path) -> None:
    """The case that diverged: the client was sent the shown call's "stream_failed" result while the
    loop compacted. The move withdraws the response: a tombstone names the call, no result of it says
    stream_failed, the history never holds it, and the run goes on to its end."""
    out, records = asyncio.run(drive(tmp_path, PROMPT_TOO_LONG_AFTER_A_CALL, Limits(), retries=0, fallback=False,
                                     block_stop=False))
    moves = [r["trigger"] for r in records if r.get("type") == "transition"]
    assert moves[10:13] == ["call", "open_stream", "reactive_compact_retry"] and moves[-2:] == ["end_turn", "settle"]
    assert [m["tool_use_ids"] for m in out if m.get("subtype") == "tombstone"] == [["toolu_0003"]]
    assert "stream_failed" not in json.dumps(out)
    assert not any(b.get("tool_use_id") == "toolu_0003" for r in records if r.get("type") == "message"
                   for b in r.get("content", ()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(behaviour=PROMPT_TOO_LONG_AFTER_A_CALL, limits=Limits(), retries=0, fallback=False, block_stop=False,
         abort_at=None)
@given(behaviour=conversations, limits=loop_limits(), retries=st.integers(0, 2), fallback=st.booleans(),
       block_stop=st.booleans(), abort_at=st.one_of(st.none(), st.integers(0, 8)))
def test_random_failures_keep_every_invariant(behaviour: list[Response], limits: Limits, retries: int,
                                              fallback: bool, block_stop: bool, abort_at: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="agentfsm-props-") as tmp:
        asyncio.run(drive(Path(tmp), behaviour, limits, retries=retries, fallback=fallback,
                          block_stop=block_stop, abort_at=abort_at))
