"""Every terminal reason of docs/behaviour.md §2, reached through the real driver.

Each case drives :class:`agentfsm.runtime.driver.Driver` with the in-process scripted model and a real trigger —
scripted responses, limits, Python hooks, a ``can_use_tool`` callback, a tool that ends the turn, a
cancellation, a host callback — then checks the result's subtype and ``is_error`` against
:data:`agentfsm.machine.state.TERMINAL_INFO` and audits the session file the run wrote (it must be clean).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentfsm.auditing.audit import audit_file
from agentfsm.hooks import HookMatcher, build_gate
from agentfsm.hooks.inputs import HookOutput
from agentfsm.machine.options import Options
from agentfsm.machine.state import TERMINAL_INFO, Limits, LoopState, Message, Phase, TerminalReason
from agentfsm.runtime.driver import Driver
from agentfsm.runtime.ports import NoHooks
from agentfsm.runtime.request import system_blocks
from agentfsm.runtime.result import RunResult
from agentfsm.runtime.trace import TraceWriter
from agentfsm.sessions.compose import build_registry
from agentfsm.sessions.resume import load_history
from agentfsm.testing.scenario import populate_workspace
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolOutput, tool

T = TerminalReason


class PhaseTrace(TraceWriter):
    """The real session file, plus an event per phase the loop has entered — so a test can act at a
    precise point of the loop (cancel while tools run) instead of sleeping and hoping."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered: defaultdict[Phase, asyncio.Event] = defaultdict(asyncio.Event)

    def on_step(self, before: LoopState, step: Any, event: Any) -> None:
        super().on_step(before, step, event)
        self.entered[step.state.phase].set()


@attrs.define
class Run:
    result: RunResult
    state: LoopState
    model: ScriptedModel
    out: list[dict[str, Any]]
    trace_path: Path
    driver: Driver


@attrs.define
class Loop:
    """One test's workspace and session file; :meth:`run` drives the loop once."""

    tmp: Path
    ws: Path
    trace_path: Path
    runs: int = 0

    async def run(self, responses: Sequence[Any], *, prompt: str = "go", limits: Limits | None = None,
                  tools: tuple[str, ...] = ("Read",), mode: str = "bypassPermissions",
                  python_hooks: Mapping[str, list[HookMatcher]] | None = None,
                  can_use_tool: Any = None, extra_tools: tuple[Any, ...] = (),
                  json_schema: Mapping[str, Any] | None = None, history: Sequence[Message] = (),
                  loop_hooks: Any = None, on_emit: Callable[[Driver, dict[str, Any]], None] | None = None,
                  during: Callable[[Driver, PhaseTrace], Awaitable[None]] | None = None,
                  **driver_kw: Any) -> Run:
        options = Options(tools=tools, permission_mode=mode, cwd=self.ws, limits=limits or Limits(),
                          hooks=python_hooks or {}, can_use_tool=can_use_tool, extra_tools=extra_tools,
                          json_schema=json_schema, setting_sources=())
        model = ScriptedModel(list(responses), ws=self.ws)
        trace = PhaseTrace(self.trace_path)
        if self.runs == 0:
            trace.session("s-1", options.limits, str(self.ws), options.model)
        self.runs += 1
        registry = build_registry(options)
        gate = build_gate(options, session_id="s-1", transcript_path=str(self.trace_path), registry=registry)
        out: list[dict[str, Any]] = []
        holder: list[Driver] = []

        def emit(msg: dict[str, Any]) -> None:
            out.append(msg)
            if on_emit is not None:
                on_emit(holder[0], msg)

        driver = Driver(options=options, client=model, registry=gate.filter_registry(registry),
                        session_id="s-1", system=system_blocks(self.ws, system_prompt=None, append=None),
                        gate=gate, hooks=loop_hooks or gate, trace=trace, emit=emit,
                        file_access=gate.file_access, **driver_kw)
        holder.append(driver)
        task = asyncio.ensure_future(driver.run(prompt, tuple(history)))
        if during is not None:
            await during(driver, trace)
        result, state = await asyncio.wait_for(task, 30)
        trace.close()
        return Run(result, state, model, out, self.trace_path, driver)


@pytest.fixture
def loop(tmp_path: Path) -> Loop:
    ws = populate_workspace(tmp_path / "ws").resolve()
    return Loop(tmp_path, ws, tmp_path / "session.jsonl")


def text(t: str, stop: str = "end_turn", **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": stop, **kw}


def use(tid: str, name: str = "Read", inp: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": name,
                        "input": dict(inp if inp is not None else {"file_path": "$WS/a.txt"})}],
            "stop_reason": "tool_use", **kw}


def hook(event: str, fn: Callable[[Any], Any], matcher: str | None = None) -> dict[str, list[HookMatcher]]:
    return {event: [HookMatcher(matcher=matcher, hooks=(fn,))]}


def paired(messages: Sequence[Message]) -> bool:
    """Every tool_use has exactly one tool_result in the next message, and no result is orphaned."""
    for i, m in enumerate(messages):
        uses = m.tool_use_ids() if m.role == "assistant" else []
        nxt = messages[i + 1].tool_result_ids() if i + 1 < len(messages) else []
        if uses and sorted(uses) != sorted(nxt):
            return False
        if m.role == "user" and m.tool_result_ids():
            prev = messages[i - 1].tool_use_ids() if i > 0 else []
            if sorted(prev) != sorted(m.tool_result_ids()):
                return False
    return True


# --- one case per terminal reason ------------------------------------------------------------


async def completed(loop: Loop) -> Run:
    return await loop.run([use("t1"), text("ALPHA read")])


async def background_requested(loop: Loop) -> Run:
    # the host moves the session to the background before the second request (after the tool ran)
    def host(state: LoopState) -> str | None:
        return "backgrounded by host" if state.turn_count > 1 else None

    run = await loop.run([use("t1"), text("never sent")], should_stop_before_next_call=host)
    assert run.model.count == 1 and run.state.messages[-1].tool_result_ids() == ["t1"]
    return run


async def max_turns(loop: Loop) -> Run:
    run = await loop.run([use("t1"), text("never sent")], limits=Limits(max_turns=1))
    assert run.model.count == 1 and run.result.errors == ("Reached maximum number of turns (1)",)
    return run


async def tool_deferred(loop: Loop) -> Run:
    run = await loop.run([use("t1"), text("never sent")],
                         python_hooks=hook("PreToolUse", lambda _r: HookOutput(permission_decision="defer")))
    assert run.model.count == 1
    return run


async def hook_stopped(loop: Loop) -> Run:
    run = await loop.run([use("t1"), text("never sent")],
                         python_hooks=hook("PreToolUse", lambda _r: HookOutput.stop("policy says stop")))
    # the hook's reason is the run's terminal detail; the result is the last answer (a tool call: no
    # text), as Claude Code reports a run a hook stopped after it reached the model
    assert run.model.count == 1 and run.state.terminal_detail == "policy says stop" and run.result.result == ""
    return run


async def stop_hook_prevented(loop: Loop) -> Run:
    run = await loop.run([text("done")], python_hooks=hook("Stop", lambda _r: HookOutput.stop("hold it")))
    assert run.state.terminal_detail == "hold it" and run.result.result == "done"  # Claude Code: the answer
    return run


async def aborted_streaming(loop: Loop) -> Run:
    # the user cancels as soon as the first block shows; the second block (and a tool) never arrive
    slow = {"blocks": [{"type": "text", "text": "thinking out loud"},
                       {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "$WS/a.txt"}}],
            "stop_reason": "tool_use", "block_delay_s": 5}

    def cancel_on_first_block(driver: Driver, msg: dict[str, Any]) -> None:
        if msg["type"] == "assistant":
            driver.abort()

    run = await loop.run([slow], on_emit=cancel_on_first_block)
    # the partial answer stays, followed by Claude Code's interrupt marker
    assert [b["type"] for b in run.state.messages[-2].content] == ["text"]
    assert run.state.messages[-1].text() == "[Request interrupted by user]"
    return run


async def aborted_tools(loop: Loop) -> Run:
    # the user cancels while the loop waits for a permission decision on a Write during dispatch
    async def ask_then_cancel(name: str, inp: Mapping[str, Any], ctx: Any) -> bool:
        await loop_trace.entered[Phase.DISPATCH_TOOLS].wait()
        driver_box[0].abort()
        await asyncio.sleep(10)  # the user never answers; the abort ends the wait
        return True

    driver_box: list[Driver] = []
    loop_trace: Any = None

    async def during(driver: Driver, trace: PhaseTrace) -> None:
        nonlocal loop_trace
        driver_box.append(driver)
        loop_trace = trace

    write = use("t1", "Write", {"file_path": "$WS/new.txt", "content": "x"})
    run = await loop.run([write, text("never sent")], tools=("Read", "Write"), mode="default",
                         can_use_tool=ask_then_cancel, during=during)
    assert not (loop.ws / "new.txt").exists()
    assert paired(run.state.messages) and run.state.messages[-2].tool_result_ids() == ["t1"]
    assert run.state.messages[-1].text() == "[Request interrupted by user for tool use]"
    return run


async def blocking_limit(loop: Loop) -> Run:
    # one long prompt over a small window: nothing earlier to compact, so the request is refused
    lim = Limits(context_window=3000, auto_compact_buffer=1000, blocking_buffer=500)
    run = await loop.run([text("never sent")], prompt="x" * 20_000, limits=lim)
    assert run.model.count == 0 and run.state.compact_tracking.consecutive_failures == 1
    return run


async def rapid_refill_breaker(loop: Loop) -> Run:
    # threshold far below the request size: every compactable assemble compacts, and the context is
    # over the threshold again the very next turn
    lim = Limits(context_window=1_000_000, auto_compact_buffer=999_990, blocking_buffer=0,
                 rapid_refill_max=2, rapid_refill_turns=2, max_consecutive_compact_failures=5)
    summary = text("<summary>SUMMARY of the work so far</summary>")
    run = await loop.run([use("t1"), use("t2"), summary, use("t3"), summary, use("t4"), summary], limits=lim)
    assert run.state.compact_tracking.rapid_refill_count == 2 and run.model.count == 7
    return run


PTL = {"status": 400, "error_type": "invalid_request_error",
       "message": "prompt is too long: 210000 tokens > 200000 maximum"}


async def prompt_too_long(loop: Loop) -> Run:
    run = await loop.run([PTL])
    assert run.model.count == 1 and "Prompt is too long" in (run.result.result or "")
    return run


async def image_error(loop: Loop) -> Run:
    message = "messages.0.content.1.image.source.base64: image exceeds 5 MB maximum"
    return await loop.run([{"status": 400, "error_type": "invalid_request_error", "message": message}])


async def model_error(loop: Loop) -> Run:
    # a stream that reaches message_stop without ever saying why it stopped is malformed
    run = await loop.run([{"blocks": [{"type": "text", "text": "hi"}], "stop_reason": None}])
    assert "Malformed stream" in (run.result.errors[0])
    return run


async def api_error(loop: Loop) -> Run:
    run = await loop.run([{"status": 400, "error_type": "invalid_request_error",
                           "message": "messages.0.content: Input should be a valid list"}])
    # Claude Code's words (tests/fixtures/claude_code/api_error_400_repeated)
    assert run.result.result == "API Error: 400 messages.0.content: Input should be a valid list"
    return run


# stop_reason tool_use without any call (a call with broken JSON is dispatched, not a malformed tool use)
MALFORMED = {"blocks": [{"type": "text", "text": "calling"}],
             "stop_reason": "tool_use"}


async def malformed_tool_use_exhausted(loop: Loop) -> Run:
    return await loop.run([MALFORMED, MALFORMED, MALFORMED, text("never sent")])


async def budget_exhausted(loop: Loop) -> Run:
    # 1M input tokens on claude-sonnet-4-5 cost $3.00 by the price table; the budget is $1
    usage = {"input_tokens": 1_000_000, "output_tokens": 0}
    run = await loop.run([use("t1", usage=usage), text("never sent")], limits=Limits(max_budget_usd=1.0))
    assert run.model.count == 1 and run.result.total_cost_usd == pytest.approx(3.0)
    return run


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


async def structured_output_retry_exhausted(loop: Loop) -> Run:
    run = await loop.run([text("plain words"), text("still plain"), text("never sent")],
                         json_schema=SCHEMA, limits=Limits(structured_output_retries=1))
    assert run.model.count == 2
    assert any(t["name"] == "StructuredOutput" for t in run.model.requests[0].tools)
    return run


async def tool_deferred_unavailable(loop: Loop) -> Run:
    # run 1: a PreToolUse hook defers a Glob call; the session file keeps the deferral
    defer = hook("PreToolUse", lambda _r: HookOutput(permission_decision="defer"))
    first = await loop.run([use("g1", "Glob", {"pattern": "*.txt"})], tools=("Read", "Glob"),
                           python_hooks=defer)
    assert first.result.terminal_reason is T.TOOL_DEFERRED
    history = load_history(loop.trace_path)
    # run 2 resumes it in a session that no longer offers Glob
    run = await loop.run([text("never sent")], tools=("Read",), history=history, prompt="resume")
    assert run.model.count == 0 and "Glob" in (run.result.errors[0])
    return run


async def turn_setup_failed(loop: Loop) -> Run:
    class BrokenPreCompact(NoHooks):
        async def pre_compact(self, trigger: str, custom_instructions: str | None) -> Any:
            raise OSError("hook host unreachable")

    lim = Limits(context_window=1_000_000, auto_compact_buffer=999_990, blocking_buffer=0)
    run = await loop.run([use("t1"), use("t2"), text("never sent")], limits=lim,
                         loop_hooks=BrokenPreCompact())
    assert "hook host unreachable" in run.result.errors[0]
    return run


CASES: dict[TerminalReason, Callable[[Loop], Awaitable[Run]]] = {
    T.COMPLETED: completed,
    T.BACKGROUND_REQUESTED: background_requested,
    T.MAX_TURNS: max_turns,
    T.TOOL_DEFERRED: tool_deferred,
    T.HOOK_STOPPED: hook_stopped,
    T.STOP_HOOK_PREVENTED: stop_hook_prevented,
    T.ABORTED_STREAMING: aborted_streaming,
    T.ABORTED_TOOLS: aborted_tools,
    T.BLOCKING_LIMIT: blocking_limit,
    T.RAPID_REFILL_BREAKER: rapid_refill_breaker,
    T.PROMPT_TOO_LONG: prompt_too_long,
    T.IMAGE_ERROR: image_error,
    T.MODEL_ERROR: model_error,
    T.API_ERROR: api_error,
    T.MALFORMED_TOOL_USE_EXHAUSTED: malformed_tool_use_exhausted,
    T.BUDGET_EXHAUSTED: budget_exhausted,
    T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED: structured_output_retry_exhausted,
    T.TOOL_DEFERRED_UNAVAILABLE: tool_deferred_unavailable,
    T.TURN_SETUP_FAILED: turn_setup_failed,
}


def test_every_terminal_reason_has_a_case() -> None:
    assert set(CASES) == set(TerminalReason)
    assert len(CASES) == 19


@pytest.mark.parametrize("reason", list(CASES), ids=lambda r: r.value)
async def test_terminal_reason_is_reached(reason: TerminalReason, loop: Loop) -> None:
    run = await CASES[reason](loop)
    res = run.result
    info = TERMINAL_INFO[reason]
    assert res.terminal_reason is reason, (res.terminal_reason, res.result, res.errors)
    assert (res.subtype, res.is_error) == (info.subtype, info.is_error)
    emitted = run.out[-1] if run.out and run.out[-1].get("type") == "result" else res.to_dict()
    assert emitted["terminal_reason"] == reason.value
    if info.subtype == "success":
        assert "result" in res.to_dict() and "errors" not in res.to_dict()
    else:
        assert res.to_dict()["errors"], "error subtypes carry `errors` instead of `result`"
    assert paired(run.state.messages)
    assert audit_file(run.trace_path) == []


async def test_ends_turn_tool_completes_without_another_call(loop: Loop) -> None:
    """A tool result declaring ends_turn completes the run after its batch (no second request)."""

    @tool("Finish", "End the task.", {"type": "object", "properties": {}}, ends_turn=True)
    async def finish(_inp: Mapping[str, Any], _ctx: Any) -> ToolOutput:
        return ToolOutput("finished")

    run = await loop.run([use("f1", "Finish", {}), text("never sent")], extra_tools=(finish,))
    assert run.result.terminal_reason is T.COMPLETED and run.model.count == 1
    assert audit_file(run.trace_path) == []


async def test_deferred_call_resumes_when_its_tool_is_still_there(loop: Loop) -> None:
    """The other side of tool_deferred_unavailable: resuming runs the deferred call (its PreToolUse
    hook is asked again), puts the real result where the deferral stood, and the loop goes on."""
    calls: list[str] = []

    def defer_once(record: Any) -> HookOutput | None:
        calls.append(record.tool_use_id)
        return HookOutput(permission_decision="defer") if len(calls) == 1 else None

    hooks_ = hook("PreToolUse", defer_once)
    first = await loop.run([use("t1")], python_hooks=hooks_)
    assert first.result.terminal_reason is T.TOOL_DEFERRED
    history = load_history(loop.trace_path)
    run = await loop.run([text("ALPHA it is")], python_hooks=hooks_, history=history, prompt="resume")
    assert run.result.terminal_reason is T.COMPLETED and calls == ["t1", "t1"]
    sent = run.model.requests[0].messages
    result_block = sent[-1]["content"][0]
    assert result_block["tool_use_id"] == "t1" and "ALPHA" in str(result_block["content"])
    assert not result_block.get("is_error")
    # the session file's view now holds the real result, and the whole file audits clean
    resumed = load_history(loop.trace_path)
    assert any(m.tool_result_ids() == ["t1"] and "ALPHA" in str(m.content) for m in resumed)
    assert audit_file(loop.trace_path) == []
