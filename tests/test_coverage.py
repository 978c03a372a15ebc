"""Coverage of the declared graph: the union of the property suite's traces and a few deterministic
runs of rare paths exercises every declared edge (trigger × source) and every terminal reason
(docs/behaviour.md §2: "every terminal reason must be reachable, and a test must reach each one"), as
``agentfsm.auditing.audit.coverage`` counts them. Every trace of the union also passes the auditor.

The deterministic runs use the real driver through ``agentfsm.testing.stateful.LoopHarness``; what no
scenario record can express (a prompt-too-long error mid-stream, a protocol violation, an empty
stream, a client crashing during compaction) is injected by wrapping the scripted model.

These tests run after the property suite (``tests/conftest.py`` orders them); run on their own,
they first run the property workloads that did not run in this session.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import test_properties as suite

from agentfsm.auditing.audit import Coverage, Move, audit_file, coverage, declared_moves, trace_files
from agentfsm.hooks import HookBlockingError, HookMatcher
from agentfsm.llm.model import BlockStop, ModelCallError, ModelRequest, StreamEvent
from agentfsm.machine import prompts
from agentfsm.machine.events import ModelError
from agentfsm.machine.graph import EDGES_BY_TRIGGER
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, Message, TerminalReason
from agentfsm.testing import (
    HttpErrorResponse,
    Response,
    ScriptedModel,
    SseError,
    StreamedResponse,
    TextBlock,
    ThinkingBlock,
    text_response,
    tool_response,
)
from agentfsm.testing.stateful import LoopHarness, LoopRun, RequestContext, assert_invariants
from agentfsm.tools.base import Tool, tool

pytestmark = pytest.mark.after_property_suite

T = TerminalReason
TOOLS: list[Tool] = [suite.echo, suite.finish, suite.hold]
BIG_CONTEXT = {"input_tokens": 190_000, "output_tokens": 10}  # over the default auto-compact threshold

# --- moves and reasons no run can reach yet (each check is xfail(strict=True) with its reason) ----

UNREACHABLE_MOVES: Mapping[Move, str] = {}
UNREACHABLE_REASONS: Mapping[str, str] = {}


@attrs.frozen
class HostOptions(Options):
    """Options carrying the host's ``should_stop_before_next_call``, which the driver reads from its
    options (``agentfsm.runtime.driver``) but ``agentfsm.machine.options.Options`` does not declare."""

    should_stop_before_next_call: Callable[[Any], Any] | None = None


# --- model faults no scenario record expresses ---------------------------------------------------


def _is_compaction(request: ModelRequest) -> bool:
    last = request.messages[-1] if request.messages else {}
    content = last.get("content")
    texts = [content] if isinstance(content, str) else [b.get("text", "") for b in content or ()
                                                        if b.get("type") == "text"]
    return bool(texts) and str(texts[-1]).startswith(prompts.COMPACT_INSTRUCTION)


class Faulty:
    """Wraps the scripted model; main request number ``at`` (from 0, per run of the wrapper) — or
    every compaction request, for ``compaction_crash`` — fails as ``fault`` says:

    * ``prompt_too_long_mid_stream`` — the stream starts, then the API says the prompt is too long;
    * ``protocol`` — a ``content_block_stop`` for a block never started (a ``model_error``);
    * ``empty`` — the stream ends before its first event;
    * ``compaction_crash`` — the client raises something outside its error contract.

    The scripted model still sees (and answers) every request, so the harness checks them all.
    """

    def __init__(self, fault: str, at: int = 0, *, unstreamed: bool = False) -> None:
        self.fault, self.at = fault, at
        self._main = itertools.count()
        if unstreamed:  # the client can also answer without streaming (the loop's fallback)
            self.create = self._create

    def __call__(self, inner: ScriptedModel) -> Faulty:
        self.inner = inner
        return self

    async def _create(self, request: ModelRequest) -> list[StreamEvent]:
        return await self.inner.create(request)

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        compaction = _is_compaction(request)
        hit = (self.fault == "compaction_crash" and compaction) or (
            self.fault != "compaction_crash" and not compaction and next(self._main) == self.at)
        return self._faulty(request) if hit else self.inner.stream(request)

    async def _faulty(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        events = self.inner.stream(request)
        try:
            first = await anext(events)
        finally:
            await events.aclose()
        if self.fault == "empty":
            return
        if self.fault == "compaction_crash":
            raise RuntimeError("the client broke outside its error contract")
        yield first
        if self.fault == "protocol":
            yield BlockStop(7)
            return
        raise ModelCallError(ModelError("prompt_too_long", "prompt is too long: 250000 tokens > 200000", 400))


@attrs.define
class Interrupter:
    """Lets a hook or a request callback press Ctrl-C on the harness running it."""

    harness: LoopHarness | None = None

    def fire(self) -> None:
        assert self.harness is not None
        self.harness.abort()

    def interrupt(self) -> None:
        assert self.harness is not None
        self.harness.interrupt()


def _hook(event: str, fn: Callable[[Any], Any]) -> dict[str, list[HookMatcher]]:
    async def hook(inp: Any) -> Any:
        return fn(inp)

    return {event: [HookMatcher(None, [hook])]}


def _block(reason: str) -> Callable[[Any], Any]:
    def raise_(_inp: Any) -> Any:
        raise HookBlockingError(reason)

    return raise_


def run_path(trace_dir: Path, script: Sequence[Response], **kw: Any) -> LoopRun:
    """One checked run of ``script`` (see :func:`run_path_keep`)."""
    return run_path_keep(trace_dir, script, **kw)[0]


def run_path_keep(trace_dir: Path, script: Sequence[Response], *, tools: Sequence[Tool] = TOOLS,
             hooks: Callable[[Interrupter], Mapping[str, Any]] | Mapping[str, Any] | None = None,
             limits: Limits | None = None, fallback: bool = False,
             json_schema: Mapping[str, Any] | None = None, abort_at: int | None = None,
             fault: Faulty | None = None, history: Sequence[Message] = (),
             on_request: Callable[[Interrupter, RequestContext], None] | None = None,
             extra: Mapping[str, Any] | None = None,
             builtins: Sequence[str] = ()) -> tuple[LoopRun, LoopHarness]:
    """Run ``script`` on the real loop with this module's tools (and the named built-in ones), checked
    against every invariant; the harness is returned too (its session's history seeds a resumed run)."""
    box = Interrupter()
    workspace = trace_dir / "ws"
    workspace.mkdir(exist_ok=True)
    hook_map = dict(hooks(box) if callable(hooks) else hooks or {})
    # once Options declares the background hook itself, HostOptions is not needed any more
    options_cls = Options if "should_stop_before_next_call" in attrs.fields_dict(Options) else HostOptions
    options = options_cls(tools=tuple(builtins), extra_tools=tuple(tools), hooks=hook_map, limits=limits or Limits(),
                      permission_mode="bypassPermissions", cwd=workspace, sessions_dir=trace_dir,
                      setting_sources=(), json_schema=json_schema,
                      fallback_models=suite.FALLBACK if fallback else (), **dict(extra or {}))
    callback = (lambda ctx: on_request(box, ctx)) if on_request is not None else None
    harness = LoopHarness(options, script=list(script), on_request=callback, wrap_model=fault,
                          history=history)
    box.harness = harness
    try:
        run = harness.run("Please do the task.", abort_at=abort_at)
    finally:
        harness.close()
    assert_invariants(run)
    return run, harness


def _tool(tid: str, name: str = "Echo", **inp: Any) -> StreamedResponse:
    return tool_response(tid, name, inp or {"text": tid})


_IDS = itertools.count(1)


def _echo_turns(n: int, usage: Mapping[str, int] | None = None) -> list[Response]:
    """``n`` turns of one Echo call each (ids unique across the module, as a conversation needs)."""
    return [attrs.evolve(_tool(f"toolu_e{next(_IDS)}"), usage=usage) for _ in range(n)]


PTL = HttpErrorResponse(400, "invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum")
DONE = text_response("Done.")
MALFORMED = StreamedResponse(blocks=(TextBlock("calling"),), stop_reason="tool_use")
ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


# --- the rare paths ----------------------------------------------------------------------------


@attrs.frozen
class RarePath:
    """A deterministic run: what it must end with and which moves it must take."""

    reason: TerminalReason
    moves: tuple[Move, ...]
    run: Callable[[Path], LoopRun]


RARE_PATHS: dict[str, RarePath] = {}


def rare(name: str, reason: TerminalReason, *moves: str) -> Callable[[Callable[[Path], LoopRun]], Any]:
    """Register a rare path; ``moves`` are ``trigger:source`` (the destination is the edge's)."""
    def register(fn: Callable[[Path], LoopRun]) -> Callable[[Path], LoopRun]:
        parsed = []
        for m in moves:
            trigger, source = m.split(":")
            parsed.append(Move(trigger, source, EDGES_BY_TRIGGER[trigger].dest.value))
        RARE_PATHS[name] = RarePath(reason, tuple(parsed), fn)
        return fn

    return register


def _defer(_inp: Any) -> Any:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "defer"}}


@rare("abort in assemble", T.ABORTED_STREAMING, "abort:assemble")
def _abort_in_assemble(d: Path) -> LoopRun:
    return run_path(d, [DONE], hooks=lambda box: _hook("UserPromptSubmit", lambda _i: box.fire()))


@rare("abort in call_model", T.ABORTED_STREAMING, "fallback_retry:call_model", "abort:call_model")
def _abort_in_call_model(d: Path) -> LoopRun:
    # the request fails over to the fallback model; the interrupt lands before that is sent
    def press(box: Interrupter, ctx: RequestContext) -> None:
        if ctx.index == 0:
            box.fire()

    return run_path(d, [HttpErrorResponse(529, "overloaded_error", "Overloaded"), DONE], fallback=True,
                    on_request=press)


@rare("abort in stream", T.ABORTED_STREAMING, "abort:stream")
def _abort_in_stream(d: Path) -> LoopRun:
    return run_path(d, [DONE], abort_at=0)


@rare("abort in dispatch_tools", T.ABORTED_TOOLS, "abort:dispatch_tools")
def _abort_in_dispatch(d: Path) -> LoopRun:
    return run_path(d, [_tool("toolu_h", "Hold", ms=1, interrupt=True), DONE])


@rare("abort after the batch, before the next request", T.ABORTED_STREAMING, "abort:assemble")
def _abort_after_the_batch(d: Path) -> LoopRun:
    # the tools have run; the abort lands while PostToolBatch hooks run: the results are kept, and
    # the loop stops before the next request
    return run_path(d, [_tool("toolu_a"), DONE],
                    hooks=lambda box: _hook("PostToolBatch", lambda _i: box.fire()))


@rare("interrupt while a block tool runs", T.ABORTED_TOOLS, "finish_batch:feedback")
def _interrupt_while_tools_run(d: Path) -> LoopRun:
    # the user interrupts while a `block` tool runs: it finishes, its real result pairs its call, and
    # the batch ends the run
    box_holder: list[Interrupter] = []

    @tool("Steady", "Runs to its end even when interrupted.", {"type": "object"}, interrupt="block")
    async def steady(_inp: Any, _ctx: Any) -> str:
        await asyncio.sleep(0.01)  # the scripted stream ends first: the interrupt lands in dispatch
        box_holder[0].interrupt()
        await asyncio.sleep(0.02)
        return "finished anyway"

    def hooks(box: Interrupter) -> Mapping[str, Any]:
        box_holder.append(box)
        return {}

    run = run_path(d, [tool_response("toolu_s", "Steady", {}), DONE], tools=[*TOOLS, steady], hooks=hooks)
    assert run.state.messages[-2].content[0]["content"] == "finished anyway"
    assert run.state.messages[-1].text() == "[Request interrupted by user for tool use]"
    return run


@rare("reactive compaction after a failed request", T.COMPLETED, "reactive_compact_retry:call_model")
def _reactive_compaction(d: Path) -> LoopRun:
    return run_path(d, [*_echo_turns(2), PTL, DONE])


@rare("reactive compaction mid-stream", T.COMPLETED, "reactive_compact_retry:stream")
def _reactive_compaction_mid_stream(d: Path) -> LoopRun:
    return run_path(d, [*_echo_turns(2), DONE, DONE], fault=Faulty("prompt_too_long_mid_stream", 2))


@rare("prompt too long, one exchange", T.PROMPT_TOO_LONG, "call_failed:call_model")
def _prompt_too_long(d: Path) -> LoopRun:
    return run_path(d, [PTL])


@rare("prompt too long mid-stream, one exchange", T.PROMPT_TOO_LONG, "call_failed:stream")
def _prompt_too_long_mid_stream(d: Path) -> LoopRun:
    return run_path(d, [DONE], fault=Faulty("prompt_too_long_mid_stream", 0))


@rare("image error", T.IMAGE_ERROR, "call_failed:call_model")
def _image_error(d: Path) -> LoopRun:
    too_big = HttpErrorResponse(400, "invalid_request_error", "messages.0: image exceeds 5 MB maximum")
    return run_path(d, [too_big])


@rare("protocol violation", T.MODEL_ERROR, "call_failed:stream")
def _protocol_violation(d: Path) -> LoopRun:
    return run_path(d, [DONE], fault=Faulty("protocol"))


@rare("empty stream", T.MODEL_ERROR, "call_failed:call_model")
def _empty_stream(d: Path) -> LoopRun:
    # a body that held no event at all (not a stream), from a client that cannot ask unstreamed
    return run_path(d, [DONE], fault=Faulty("empty"), limits=Limits(stream_retries=0))


@rare("protocol violation before any content, unstreamed", T.COMPLETED, "non_streaming_retry:stream",
      "end_turn:stream")
def _protocol_violation_unstreamed(d: Path) -> LoopRun:
    return run_path(d, [DONE, DONE], fault=Faulty("protocol", unstreamed=True))


@rare("stream dropped before its first event, retried", T.COMPLETED, "stream_retry:call_model",
      "end_turn:stream")
def _dropped_before_first_event(d: Path) -> LoopRun:
    return run_path(d, [StreamedResponse(blocks=(TextBlock("lost"),), fault="drop"), DONE])


@rare("garbled stream, asked again unstreamed", T.COMPLETED, "non_streaming_retry:call_model",
      "end_turn:stream")
def _garbled_unstreamed(d: Path) -> LoopRun:
    return run_path(d, [StreamedResponse(blocks=(TextBlock("not SSE"),), fault="html"), DONE])


@rare("empty answer, asked again", T.COMPLETED, "empty_response_nudge:stream", "end_turn:stream")
def _empty_answer(d: Path) -> LoopRun:
    return run_path(d, [StreamedResponse(blocks=()), DONE])


@rare("stream error, final", T.API_ERROR, "call_failed:stream")
def _stream_error(d: Path) -> LoopRun:
    broken = StreamedResponse(blocks=(TextBlock("par"),), sse_error=SseError("invalid_request_error", "bad"))
    return run_path(d, [broken])


@rare("stream break, retried", T.COMPLETED, "stream_retry:stream")
def _stream_retry(d: Path) -> LoopRun:
    return run_path(d, [StreamedResponse(blocks=(TextBlock("cut"),), break_after=0), DONE])


@rare("stream break, fallback model", T.COMPLETED, "fallback_retry:stream")
def _stream_fallback(d: Path) -> LoopRun:
    return run_path(d, [StreamedResponse(blocks=(TextBlock("cut"),), break_after=0), DONE], fallback=True,
                    limits=Limits(stream_retries=0))


@rare("server error, fallback model", T.COMPLETED, "fallback_retry:call_model")
def _call_fallback(d: Path) -> LoopRun:
    return run_path(d, [HttpErrorResponse(500, "api_error", "Internal server error"), DONE], fallback=True)


@rare("rapid refill breaker", T.RAPID_REFILL_BREAKER, "setup_failed:assemble")
def _rapid_refill(d: Path) -> LoopRun:
    # two compactions in a row, the second refilled within rapid_refill_turns of the first
    return run_path(d, [*_echo_turns(2), *_echo_turns(3, BIG_CONTEXT)], limits=Limits(rapid_refill_max=1))


@rare("compaction crashes", T.TURN_SETUP_FAILED, "setup_failed:assemble")
def _compaction_crash(d: Path) -> LoopRun:
    # auto-compaction is due; the client raises something outside its error contract meanwhile
    return run_path(d, [*_echo_turns(2), *_echo_turns(1, BIG_CONTEXT), DONE],
                    fault=Faulty("compaction_crash"))


@rare("deferred tool gone on resume", T.TOOL_DEFERRED_UNAVAILABLE, "setup_failed:assemble")
def _tool_deferred_unavailable(d: Path) -> LoopRun:
    first, harness = run_path_keep(d, [_tool("toolu_d")], hooks=_hook("PreToolUse", _defer))
    assert first.result.terminal_reason is T.TOOL_DEFERRED, first.describe()
    # the same conversation, resumed where Echo is no longer offered
    return run_path(d, [DONE], tools=[suite.finish], history=harness.session.history)


@rare("blocking limit", T.BLOCKING_LIMIT, "refuse:call_model")
def _blocking_limit(d: Path) -> LoopRun:
    return run_path(d, [*_echo_turns(1, {"input_tokens": 198_000, "output_tokens": 10}), DONE],
                    limits=Limits(auto_compact=False))


@rare("budget", T.BUDGET_EXHAUSTED, "over_budget:stream")
def _budget(d: Path) -> LoopRun:
    return run_path(d, [*_echo_turns(1, {"input_tokens": 100_000, "output_tokens": 10}), DONE],
                    limits=Limits(max_budget_usd=0.01))


@rare("prompt blocked", T.HOOK_STOPPED, "prompt_blocked:assemble")
def _prompt_blocked(d: Path) -> LoopRun:
    return run_path(d, [DONE], hooks=_hook("UserPromptSubmit", _block("not allowed")))


@rare("max_tokens recovery exhausted", T.API_ERROR, "max_output_tokens_recovery:stream",
      "recovery_exhausted:stream")
def _max_tokens(d: Path) -> LoopRun:
    return run_path(d, [text_response("cut", "max_tokens")] * 2,
                    limits=Limits(max_output_tokens_recoveries=1))


@rare("malformed tool_use exhausted", T.MALFORMED_TOOL_USE_EXHAUSTED, "malformed_tool_use_retry:stream",
      "recovery_exhausted:stream")
def _malformed(d: Path) -> LoopRun:
    # one malformed response more than the declared number of retries
    return run_path(d, [MALFORMED] * (Limits().malformed_tool_use_retries + 1))


@rare("a background command's notification after the run settled", T.COMPLETED,
      "task_notification:stop", "end_turn:stream")
def _task_notification(d: Path) -> LoopRun:
    # the answer comes before the command ends, so its notification arrives at a settled stop
    background = tool_response("toolu_bg", "Bash", {"command": "sleep 0.3; echo BG_DONE",
                                                    "run_in_background": True})
    return run_path(d, [background, text_response("waiting"),
                        text_response("got it")],
                    builtins=("Bash",), extra={"sandbox": False})


@rare("thinking only, nudged", T.COMPLETED, "thinking_only_nudge:stream", "end_turn:stream")
def _thinking_only(d: Path) -> LoopRun:
    return run_path(d, [StreamedResponse(blocks=(ThinkingBlock("hm", "sig"),)), DONE])


@rare("structured output exhausted", T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED, "structured_output_retry:stream",
      "recovery_exhausted:stream")
def _structured_exhausted(d: Path) -> LoopRun:
    return run_path(d, [DONE, DONE], json_schema=ANSWER, limits=Limits(structured_output_retries=1))


@rare("structured output given", T.COMPLETED, "finish_batch:feedback")
def _structured_given(d: Path) -> LoopRun:
    return run_path(d, [tool_response("toolu_so", "StructuredOutput", {"answer": "42"})], json_schema=ANSWER)


@rare("stop hook blocks once", T.COMPLETED, "stop_hook_blocking:stop")
def _stop_hook_once(d: Path) -> LoopRun:
    def once(inp: Any) -> Any:
        return None if inp.stop_hook_active else _block("run the tests")(inp)

    return run_path(d, [DONE, DONE], hooks=_hook("Stop", once))


@rare("stop hook cap overridden", T.COMPLETED, "settle:stop")
def _stop_hook_cap(d: Path) -> LoopRun:
    return run_path(d, [DONE, DONE], hooks=_hook("Stop", _block("again")),
                    limits=Limits(stop_hook_block_cap=1))


@rare("stop hook prevents", T.STOP_HOOK_PREVENTED, "settle:stop")
def _stop_hook_prevents(d: Path) -> LoopRun:
    return run_path(d, [DONE], hooks=_hook("Stop", lambda _i: {"continue": False, "stopReason": "enough"}))


@rare("stop hook at max_turns", T.MAX_TURNS, "settle:stop")
def _stop_hook_max_turns(d: Path) -> LoopRun:
    return run_path(d, [DONE], hooks=_hook("Stop", _block("again")), limits=Limits(max_turns=1))


@rare("max_turns after the tools", T.MAX_TURNS, "finish_batch:feedback")
def _max_turns(d: Path) -> LoopRun:
    return run_path(d, [_tool("toolu_m"), DONE], limits=Limits(max_turns=1))


@rare("tool deferred", T.TOOL_DEFERRED, "finish_batch:feedback")
def _tool_deferred(d: Path) -> LoopRun:
    return run_path(d, [_tool("toolu_df")], hooks=_hook("PreToolUse", _defer))


@rare("PreToolUse stops the run", T.HOOK_STOPPED, "finish_batch:feedback")
def _pre_tool_stop(d: Path) -> LoopRun:
    return run_path(d, [_tool("toolu_st"), DONE], hooks=_hook("PreToolUse", lambda _i: {"continue": False}))


@rare("PostToolBatch blocks", T.HOOK_STOPPED, "finish_batch:feedback")
def _post_batch_blocks(d: Path) -> LoopRun:
    return run_path(d, [_tool("toolu_pb"), DONE], hooks=_hook("PostToolBatch", _block("batch rejected")))


@rare("a tool ends the turn", T.COMPLETED, "finish_batch:feedback")
def _ends_turn(d: Path) -> LoopRun:
    return run_path(d, [_tool("toolu_f", "Finish", summary="all done")])


@rare("background requested", T.BACKGROUND_REQUESTED, "refuse:call_model")
def _background_requested(d: Path) -> LoopRun:
    # the host moves the run to the background once the first tool batch is done
    return run_path(d, [_tool("toolu_b"), DONE],
                    extra={"should_stop_before_next_call": lambda state: state.turn_count > 1})


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rare_runs(property_traces: Any) -> dict[str, LoopRun | BaseException]:
    """Every rare path, run once into the shared trace directory; a path that raised keeps its error
    (its own test reports it; the coverage report then shows what went missing)."""
    out: dict[str, LoopRun | BaseException] = {}
    base = property_traces.dir / "rare"
    for i, (name, path) in enumerate(RARE_PATHS.items()):
        d = base / f"{i:02d}"
        d.mkdir(parents=True)
        try:
            out[name] = path.run(d)
        except Exception as exc:  # reported by test_rare_path
            out[name] = exc
    return out


@attrs.frozen
class Union:
    """The coverage of every trace in the shared directory, and the property workloads this module
    had to run itself and saw fail (their own tests report the failure in full)."""

    cov: Coverage
    failed_workloads: Mapping[str, str]


@pytest.fixture(scope="session")
def union(property_traces: Any, rare_runs: Mapping[str, Any]) -> Union:
    failed: dict[str, str] = {}
    for name in suite.WORKLOADS:
        if name not in property_traces.done:  # run on its own: produce the property suite's traces
            try:
                suite.run_workload(name, property_traces)
            except Exception as exc:  # the traces written before the failure still count
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return Union(coverage([property_traces.dir]), failed)


def report(cov: Coverage) -> str:
    """The coverage table, as ``agentfsm audit --coverage`` prints it."""
    lines = [f"edges never exercised: {', '.join(map(str, cov.missing_edges)) or 'none'}",
             f"terminal reasons never reached: {', '.join(cov.missing_reasons) or 'none'}"]
    width = max(len(m.trigger) for m in declared_moves())
    for m in declared_moves():
        n = cov.taken_edges[m]
        lines.append(f"  {'×' + str(n) if n else 'never':>7}  {m.trigger:{width}}  {m.source} → {m.dest}")
    for r in TerminalReason:
        n = cov.reasons[r.value]
        lines.append(f"  {'×' + str(n) if n else 'never':>7}  {r.value}")
    return "\n".join(lines)


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RARE_PATHS))
def test_rare_path(name: str, rare_runs: Mapping[str, Any]) -> None:
    run = rare_runs[name]
    if isinstance(run, BaseException):
        raise run
    path = RARE_PATHS[name]
    assert run.result.terminal_reason is path.reason, run.describe()
    taken = {Move(str(t.get("trigger")), str(t.get("from")), str(t.get("to"))) for t in run.transitions()}
    assert set(path.moves) <= taken, f"{run.describe()}: missing {set(path.moves) - taken}"


def _edge_param(move: Move) -> Any:
    why = UNREACHABLE_MOVES.get(move)
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(move, id=f"{move.trigger}:{move.source}", marks=marks)


def _reason_param(reason: TerminalReason) -> Any:
    why = UNREACHABLE_REASONS.get(reason.value)
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    return pytest.param(reason.value, id=reason.value, marks=marks)


@pytest.mark.parametrize("move", [_edge_param(m) for m in declared_moves()])
def test_declared_edge_is_exercised(move: Move, union: Union) -> None:
    assert union.cov.taken_edges[move] > 0, f"{move} was never taken\n{report(union.cov)}"


@pytest.mark.parametrize("reason", [_reason_param(r) for r in TerminalReason])
def test_terminal_reason_is_reached(reason: str, union: Union) -> None:
    assert union.cov.reasons[reason] > 0, f"{reason} was never reached\n{report(union.cov)}"


def test_coverage_is_complete_but_for_the_known_gaps(union: Union) -> None:
    # one place that states the whole picture: exactly the listed gaps, nothing else
    assert not union.failed_workloads, f"property workloads failed: {dict(union.failed_workloads)}"
    assert set(union.cov.missing_edges) == set(UNREACHABLE_MOVES), report(union.cov)
    assert set(union.cov.missing_reasons) == set(UNREACHABLE_REASONS), report(union.cov)


def test_every_trace_of_the_union_passes_the_audit(union: Union, property_traces: Any) -> None:
    files = trace_files([property_traces.dir])
    assert len(files) >= len(RARE_PATHS)
    bad = {str(f): [str(x) for x in audit_file(f) if x.is_error] for f in files}
    bad = {f: xs for f, xs in bad.items() if xs}
    first = dict(itertools.islice(bad.items(), 3))
    assert not bad, f"{len(bad)} of {len(files)} traces fail the audit, e.g. {first}"


def test_every_trace_of_the_union_can_be_drawn(union: Union, property_traces: Any) -> None:
    """`agentfsm diagram --trace` on every trace the suite produced: over the overview (DOT and Mermaid)
    and as a sequence diagram in the Mermaid grammar."""
    from mermaid_grammar import flowchart_problems, sequence_problems

    from agentfsm import diagram
    from agentfsm.diagram import dot as dot_views
    from agentfsm.diagram import mermaid as mermaid_views
    from agentfsm.diagram import sequence

    files = trace_files([property_traces.dir])
    bad: dict[str, list[str]] = {}
    for f in files:
        path = diagram.trace_path(f)
        problems = sequence_problems(sequence.render(path)) + flowchart_problems(mermaid_views.render_overview(path))
        if path.steps and "digraph overview" not in dot_views.render_overview(path):
            problems.append("no DOT overview")
        if problems:
            bad[str(f)] = problems
    first = dict(itertools.islice(bad.items(), 3))
    assert not bad, f"{len(bad)} of {len(files)} traces do not draw, e.g. {first}"
