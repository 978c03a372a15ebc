"""The async driver: performs what the graph decides.

Each iteration observes the world in the current phase (assemble context, call the model, stream,
run tools, run hooks), turns what happened into an event record, and hands it to the machine
(:class:`fsm.graph.LoopMachine`). The driver never chooses a next phase itself.

Faults and recovery, phase by phase (the graph picks the edge; the driver gathers the facts):

* assemble — a deferred tool call of a resumed run is run again (``tool_deferred_unavailable`` when
  its tool is gone); auto-compaction when the estimated context passes the threshold; any exception
  while preparing the turn is ``turn_setup_failed``.
* call_model — preflight: a host's ``should_stop_before_next_call`` (``background_requested``), the
  budget (``budget_exhausted``, cost from :mod:`fsm.cost`'s price table), the blocking limit; then the
  request. Transient HTTP failures are retried inside the transport (the SDK's own retry machinery);
  what still fails arrives as a classified :class:`ModelError`. Prompt-too-long is answered by one
  reactive compaction when the graph allows it.
* stream — a stream that breaks part-way is either requested again as a whole (its executor is
  aborted, its blocks tombstoned, nothing of it kept) or, when no retry is left, ends the loop with
  every tool_use it showed paired with a result. A protocol violation is ``model_error``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import jsonschema
import structlog

from fsm import graph, prompts
from fsm.assembler import ResponseAssembler, StreamProtocolError
from fsm.compact import chars_of, compact, estimate_tokens
from fsm.cost import add_usage, cost_usd
from fsm.events import (
    Aborted,
    Assembled,
    CallFailed,
    Event,
    ModelError,
    ModelResponse,
    Refused,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    ToolsDrained,
)
from fsm.executor import StreamingToolExecutor
from fsm.gate import OpenGate, ToolGate
from fsm.model import MessageStop, ModelCallError, ModelClient, ModelRequest, StreamEvent
from fsm.options import Options
from fsm.pipeline import STREAMING_FALLBACK, synthetic_result
from fsm.queue import InputQueue  # re-exported: `from fsm.driver import InputQueue`
from fsm.request import normalize
from fsm.result import RunResult, build_result
from fsm.state import LoopState, Message, Phase, TerminalReason, ToolUseContext
from fsm.trace import TraceWriter
from tools.base import ToolContext

Emit = Callable[[dict[str, Any]], None]
# Asked before every model request with the loop state; a truthy answer ends the foreground loop
# with `background_requested` (a string answer is the reason). Seed: shouldStopBeforeNextApiCall.
StopBeforeCall = Callable[[LoopState], Any]
_END = object()
# The kind of the tool_result message of a call a PreToolUse hook deferred: a resumed run finds it
# there (it survives in the session file) and runs the call again before the next request.
DEFERRED_RESULTS = "deferred_tool_results"
STREAM_FAILED = "stream_failed"


class LoopHooks:
    """The non-tool hook events the driver fires; the default runs nothing. ``hooks.HookGate``
    implements the same methods for command and Python hooks."""

    async def user_prompt_submit(self, prompt: str) -> Any:
        return None

    async def stop(self, last_assistant_message: str, stop_hook_active: bool) -> Any:
        return None

    async def post_tool_batch(self, tool_calls: list[dict[str, Any]]) -> Any:
        return None

    async def pre_compact(self, trigger: str, custom_instructions: str | None) -> Any:
        return None


class Driver:
    def __init__(self, *, options: Options, client: ModelClient, registry: Any, session_id: str,
                 system: tuple[Mapping[str, Any], ...], gate: ToolGate | None = None,
                 hooks: Any = None, trace: TraceWriter | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, services: Mapping[str, Any] | None = None,
                 should_stop_before_next_call: StopBeforeCall | None = None) -> None:
        self.options = options
        self.limits = options.limits
        self.client = client
        # a --json-schema that is not a JSON Schema cannot be offered as a tool: the run's setup fails
        self._setup_error: str | None = None
        try:
            self.registry = _with_structured_output(registry, options.json_schema)
        except jsonschema.SchemaError as exc:
            self.registry = registry
            self._setup_error = ("Turn setup failed: the JSON schema for structured output is invalid: "
                                 f"{exc.message}")
        self.session_id = session_id
        self.system = system
        self.gate: ToolGate = gate or OpenGate()
        self.hooks = hooks or LoopHooks()
        self.trace = trace or TraceWriter(None)
        self.emit: Emit = emit or (lambda _m: None)
        self.queue = queue or InputQueue()
        self.services = dict(services or {})
        self.should_stop_before_next_call: StopBeforeCall | None = (
            should_stop_before_next_call or getattr(options, "should_stop_before_next_call", None))
        self.abort_event = asyncio.Event()
        self.read_files: dict[str, float] = {}
        self.log = structlog.get_logger("agentfsm").bind(session_id=session_id)
        # per-run bookkeeping
        self._usage: dict[str, Any] = {}
        self._cost = 0.0
        self._api_ms = 0.0
        self._denials: list[Mapping[str, Any]] = []
        self._warnings: list[str] = []
        self._last_usage: Mapping[str, Any] | None = None
        self._counted_upto = 0  # messages the request behind _last_usage carried
        self._request_messages = 0
        # executors given up on (abort, stream retry): their cancelled calls are awaited at the end
        self._discarded: list[StreamingToolExecutor] = []
        self._stream: Any = None
        self._first: StreamEvent | None = None
        self._executor: StreamingToolExecutor | None = None
        self._asm: ResponseAssembler | None = None
        self._drained: ToolsDrained | None = None
        self._structured: Any = None
        self._response_id = ""
        self._emitted_results: set[str] = set()
        self._last_trigger = ""
        self._t_request = 0.0

    # --- public --------------------------------------------------------------------------------

    def abort(self) -> None:
        """Cancel the run (Ctrl-C, host interrupt). Tools already finished keep their side effects."""
        self.abort_event.set()

    @property
    def cost_usd(self) -> float:
        return self._cost

    async def run(self, prompt: str | Sequence[Mapping[str, Any]],
                  history: Sequence[Message] = ()) -> tuple[RunResult, LoopState]:
        started = time.monotonic()
        tool_names = tuple(self.registry.names())
        mode = getattr(self.gate, "permission_mode", None) or self.options.permission_mode or "default"
        ctx = ToolUseContext(cwd=str(self.options.cwd), permission_mode=mode,
                             tool_names=tool_names)
        content = prompt if not isinstance(prompt, str) else ({"type": "text", "text": prompt},)
        first = Message("user", tuple(content), kind="prompt")
        text = prompt if isinstance(prompt, str) else "".join(b.get("text", "") for b in content)
        setup_failure: SetupFailed | None = None
        erased = False
        if self._setup_error is not None:
            setup_failure = SetupFailed(TerminalReason.TURN_SETUP_FAILED, self._setup_error)
        else:
            submitted = await self.hooks.user_prompt_submit(text)
            if submitted is not None and (getattr(submitted, "blocked", False)
                                          or getattr(submitted, "stop", False)):
                # a blocked prompt (exit 2, decision block) or `continue: false` is erased: it never
                # reaches the model or the history
                reason = (getattr(submitted, "stop_reason", "") if getattr(submitted, "stop", False)
                          else getattr(submitted, "reason", "")) or "prompt blocked by hook"
                setup_failure = SetupFailed(TerminalReason.HOOK_STOPPED, reason)
                erased = True
            else:
                extra = tuple(getattr(submitted, "additional_context", ()) or ()) if submitted else ()
                if extra:
                    first = attrs.evolve(first, content=first.content + tuple(
                        {"type": "text", "text": prompts.reminder(c)} for c in extra))
        # the prompt record marks where this run starts in the file (before anything the run
        # writes); an erased one is recorded as such, and resume leaves it out of the history
        self.trace.message(attrs.evolve(first, kind="erased_prompt") if erased else first)
        if setup_failure is None:
            history, setup_failure = await self._resume_deferred(tuple(history), first)
        messages: tuple[Message, ...] = tuple(history) if erased else (*history, first)
        state = LoopState(messages=messages, tool_use_context=ctx)
        machine = graph.LoopMachine(state)
        try:
            if setup_failure is not None:
                self._apply(machine, setup_failure)
            await self._loop(machine)
        except asyncio.CancelledError:
            if machine.phase is not Phase.STOP:
                self._apply(machine, self._abort_event_for(machine.state))
            raise
        finally:
            await self._close_stream()
            await self._close_executors()
        result = build_result(machine.state, session_id=self.session_id,
                              duration_ms=int((time.monotonic() - started) * 1000),
                              duration_api_ms=int(self._api_ms), cost=self._cost, usage=self._usage,
                              denials=tuple(self._denials), structured_output=self._structured,
                              warnings=tuple(self._warnings))
        self.trace.result(result.to_dict())
        self.log.info("loop.terminal", terminal_reason=result.terminal_reason.value,
                      subtype=result.subtype, is_error=result.is_error, turns=result.num_turns,
                      cost_usd=round(self._cost, 6))
        return result, machine.state

    # --- the loop ------------------------------------------------------------------------------

    async def _loop(self, machine: graph.LoopMachine) -> None:
        while True:
            state = machine.state
            phase = machine.phase
            if phase is Phase.STOP:
                # Stop hooks run once per end_turn; a `settle` leaves the loop in stop for good
                if self._last_trigger != "end_turn":
                    return
                event = await self._stop_hooks(state)
                if event is None:
                    return
                self._apply(machine, event)
                continue
            if self.abort_event.is_set():
                self._apply(machine, self._abort_event_for(state))
                continue
            if phase is Phase.ASSEMBLE:
                event = await self._assemble(state)
            elif phase is Phase.CALL_MODEL:
                event = await self._call_model(state)
            elif phase is Phase.STREAM:
                event = await self._consume_stream(state)
            elif phase is Phase.DISPATCH_TOOLS:
                event = await self._dispatch(state)
            else:  # FEEDBACK: the same drained batch decides how the loop goes on
                assert self._drained is not None
                event, self._drained = self._drained, None
            self._apply(machine, event)

    def _apply(self, machine: graph.LoopMachine, event: Event) -> LoopState:
        before = machine.state
        step, after = machine.step(event, self.limits)
        self._last_trigger = step.trigger
        edge = step.edge
        self.trace.transition(step.trigger, edge.kind, before, after)
        self._record_messages(before, after, event)
        self.log.info("loop.transition", **{"from": before.phase.value}, to=after.phase.value,
                      label=step.trigger, kind=edge.kind, turn=after.turn_count,
                      chain_id=after.query_tracking.chain_id, depth=after.query_tracking.depth,
                      terminal_reason=after.terminal_reason.value if after.terminal_reason else None,
                      **after.counters())
        if edge.kind == "retry" and before.phase is Phase.STREAM:
            # what this response showed is withdrawn; a retry from call_model showed nothing
            self._tombstone()
        return after

    def _record_messages(self, before: LoopState, after: LoopState, event: Event) -> None:
        old, new = before.messages, after.messages
        if new is old:
            return
        if len(new) >= len(old) and all(a is b for a, b in zip(old, new, strict=False)):
            for m in new[len(old):]:
                self.trace.message(m)
            return
        compaction = getattr(event, "compaction", None)
        trigger = compaction.trigger if compaction is not None else "swap"
        pre = compaction.pre_tokens if compaction is not None else 0
        self.trace.compact_boundary(trigger, pre)
        for m in new:
            self.trace.message(m)
        self._last_usage, self._counted_upto = None, 0
        self.emit({"type": "system", "subtype": "compact_boundary", "session_id": self.session_id,
                   "compact_metadata": {"trigger": "manual" if trigger == "manual" else "auto",
                                        "pre_tokens": pre}})

    def _abort_event_for(self, state: LoopState) -> Aborted:
        """Pair every tool_use that was shown before the abort."""
        partial = results = None
        if state.phase in (Phase.STREAM, Phase.DISPATCH_TOOLS) and self._asm is not None:
            blocks = tuple(self._asm.blocks)
            if blocks:
                partial = Message("assistant", blocks, kind="assistant")
                ids = partial.tool_use_ids()
                if ids:
                    got = {r.tool_use_id: r for r in (self._executor.abort("user_interrupted")
                                                      if self._executor else [])}
                    if self._executor is not None:
                        self._discarded.append(self._executor)
                    res_blocks = tuple(got[i].block if i in got else _interrupted(i) for i in ids)
                    results = Message("user", res_blocks, kind="tool_results")
                    for b in res_blocks:
                        self._emit_result(b)
        self._executor = None
        return Aborted(partial, results)

    # --- phases --------------------------------------------------------------------------------

    async def _assemble(self, state: LoopState) -> Event:
        try:
            return await self._prepare_turn(state)
        except Exception as exc:
            # Whatever breaks while preparing the turn (a hook object, a client failing outside its
            # error contract during compaction, a bug) ends the run cleanly instead of crashing it.
            self.log.error("turn.setup_failed", error=repr(exc), exc_info=True)
            return SetupFailed(TerminalReason.TURN_SETUP_FAILED,
                               f"Turn setup failed: {type(exc).__name__}: {exc}")

    async def _prepare_turn(self, state: LoopState) -> Event:
        lim = self.limits
        tokens = self._estimate(state)
        tracking = state.compact_tracking
        compaction = None
        failed = rapid = False
        if (lim.auto_compact and tokens > lim.auto_compact_threshold
                and tracking.consecutive_failures < lim.max_consecutive_compact_failures):
            await self.hooks.pre_compact("auto", None)
            self.log.info("compact.start", trigger="auto", tokens=tokens,
                          threshold=lim.auto_compact_threshold)
            compaction = await compact(self.client, model=self._model(state), system=self.system,
                                       messages=state.messages, trigger="auto",
                                       metadata=self._metadata(), on_usage=self._account_usage)
            self.log.info("compact.end", trigger="auto", ok=compaction is not None)
            failed = compaction is None
            # refilled to the threshold within `rapid_refill_turns` of the previous compaction
            rapid = (compaction is not None and tracking.compactions > 0
                     and tracking.turns_since_compact < lim.rapid_refill_turns)
        # queued input is absorbed last: once absorbed it must reach the conversation, so nothing
        # that can fail comes after it
        attachments = self.queue.absorb()
        return Assembled(compaction=compaction, compact_failed=failed, rapid_refill=rapid,
                         attachments=attachments)

    def _estimate(self, state: LoopState) -> int:
        return estimate_tokens(state.messages, self._last_usage, self._counted_upto,
                               static_tokens=self._static_tokens())

    def _static_tokens(self) -> int:
        """System prompt and tool schemas: part of every request, in no message."""
        return (chars_of(list(self.system)) + chars_of(self.registry.api_schemas())) // 4

    def _model(self, state: LoopState) -> str:
        models = self.options.models
        return models[min(state.model_index, len(models) - 1)]

    def _metadata(self) -> dict[str, str]:
        return {"user_id": f"session_{self.session_id}"}

    def _preflight(self, state: LoopState) -> Refused | None:
        """Reasons not to send the next request at all (seed order: background, budget, limit)."""
        lim = self.limits
        if self.should_stop_before_next_call is not None:
            answer = self.should_stop_before_next_call(state)
            if answer:
                reason = (answer if isinstance(answer, str)
                          else "Moved to the background before the next request")
                return Refused(TerminalReason.BACKGROUND_REQUESTED, reason)
        if lim.max_budget_usd is not None and self._cost >= lim.max_budget_usd:
            return Refused(TerminalReason.BUDGET_EXHAUSTED,
                           f"Reached maximum budget (${lim.max_budget_usd:g}); spent ${self._cost:.4f}")
        tokens = self._estimate(state)
        if tokens > lim.blocking_limit:
            return Refused(TerminalReason.BLOCKING_LIMIT,
                           f"Prompt is too long: about {tokens} tokens, over the blocking limit "
                           f"of {lim.blocking_limit}. Compact the conversation or start a new one.")
        return None

    async def _call_model(self, state: LoopState) -> Event:
        # the previous response is history now: an abort or a retry must never pair or withdraw it
        self._asm = None
        refused = self._preflight(state)
        if refused is not None:
            self.log.info("model.refused", reason=refused.reason.value, detail=refused.detail)
            return refused
        wire = normalize(state.messages)
        model = self._model(state)
        request = ModelRequest(model=model, system=self.system, messages=tuple(wire),
                               tools=tuple(self.registry.api_schemas()),
                               max_tokens=self.limits.max_output_tokens, metadata=self._metadata())
        self.trace.request(model, state.query_tracking.depth, wire)
        self.log.info("model.request", model=model, messages=len(wire),
                      chain_id=state.query_tracking.chain_id, depth=state.query_tracking.depth)
        self._request_messages = len(state.messages)
        self._t_request = time.monotonic()
        self._stream = self.client.stream(request)
        # race the first event against an abort: a slow answer or the SDK's retry backoff must not
        # hold an interrupt until the response starts
        first = asyncio.ensure_future(anext(self._stream))
        abort_wait = asyncio.ensure_future(self.abort_event.wait())
        try:
            await asyncio.wait({first, abort_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            abort_wait.cancel()
        if not first.done():
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            await self._close_stream()
            return self._abort_event_for(state)
        try:
            self._first = first.result()
        except StopAsyncIteration:
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            return await self._failed(state, ModelError("connection", "The API returned an empty stream",
                                                        None, True))
        except ModelCallError as exc:
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            return await self._failed(state, exc.error)
        except Exception as exc:
            # outside the transport's error contract: a client bug, not a retryable fault
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            self.log.error("model.client_failed", error=repr(exc), exc_info=True)
            return await self._failed(state, ModelError("model", f"Model call failed: {type(exc).__name__}: "
                                                                 f"{exc}"))
        self.log.info("model.first_event", model=model,
                      ms=round((time.monotonic() - self._t_request) * 1000, 1))
        return StreamOpened(model)

    def _has_fallback(self, state: LoopState) -> bool:
        return state.model_index + 1 < len(self.options.models)

    async def _failed(self, state: LoopState, error: ModelError, partial: Message | None = None,
                      partial_results: Message | None = None) -> CallFailed:
        await self._close_stream()
        compaction = None
        if error.kind == "prompt_too_long" and graph.may_reactive_compact(state):
            # held back from the user: only a failed compaction lets the error through
            await self.hooks.pre_compact("auto", None)
            self.log.info("compact.start", trigger="reactive", error=error.message)
            compaction = await compact(self.client, model=self._model(state), system=self.system,
                                       messages=state.messages, trigger="reactive",
                                       metadata=self._metadata(), on_usage=self._account_usage)
            self.log.info("compact.end", trigger="reactive", ok=compaction is not None)
        self.log.warning("model.error", kind=error.kind, status=error.status, message=error.message,
                         retryable=error.retryable)
        return CallFailed(error, compaction=compaction, fallback_available=self._has_fallback(state),
                          partial=partial, partial_results=partial_results)

    async def _consume_stream(self, state: LoopState) -> Event:
        asm = self._asm = ResponseAssembler()
        executor = self._executor = self._new_executor()
        self._emitted_results = set()
        it, first = self._stream, self._first
        self._first = None
        try:
            if first is not None:
                self._on_event(first, asm, executor)
            while True:
                ev = await self._next_event(it, executor)
                if ev is _END:
                    break
                if ev is None:  # abort requested while streaming
                    return self._abort_event_for(attrs.evolve(state))
                self._on_event(ev, asm, executor)  # type: ignore[arg-type]
            if not asm.stopped:
                raise ModelCallError(ModelError("connection", "The stream ended before message_stop",
                                                None, True))
        except (ModelCallError, StreamProtocolError) as exc:
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            if isinstance(exc, ModelCallError):
                error = exc.error
            else:
                error = ModelError("model", f"Malformed stream from the API: {exc}")
            return await self._stream_failed(state, error, asm, executor)
        except Exception as exc:
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            self.log.error("model.stream_failed_unexpectedly", error=repr(exc), exc_info=True)
            error = ModelError("model", f"Model stream failed: {type(exc).__name__}: {exc}")
            return await self._stream_failed(state, error, asm, executor)
        finally:
            await self._close_stream()
        self._api_ms += (time.monotonic() - self._t_request) * 1000
        response = asm.finish()
        self._account(response)
        self.log.info("model.stream_end", stop_reason=response.stop_reason, blocks=len(response.blocks),
                      tool_uses=len(response.tool_uses()))
        needs_structured = self._needs_structured_output(response)
        event = StreamEnded(response, structured_output_required=needs_structured)
        if not (response.tool_uses() and (response.usable_tool_uses() or response.stop_reason != "tool_use")):
            # not dispatching: discard whatever the executor started for this response
            executor.abort("discarded")
            self._discarded.append(executor)
            self._executor = None
        return event

    async def _stream_failed(self, state: LoopState, error: ModelError, asm: ResponseAssembler,
                             executor: StreamingToolExecutor) -> CallFailed:
        """The stream broke. Either the graph will request the response again (then nothing of this
        one is kept: its running tools are aborted with the streaming-fallback result and the next
        stream gets a new executor), or the loop ends and every tool_use this response showed is
        paired with its result — the real one if the tool finished, a synthetic one otherwise."""
        await self._close_stream()
        if asm.usage:
            # the input was processed (and billed) even though the answer is lost
            self._account_usage(asm.model or self._model(state), asm.usage)
        retry = graph.retry_trigger(state, error, self._has_fallback(state), self.limits)
        aborted = {r.tool_use_id: r for r in executor.abort(STREAMING_FALLBACK if retry else STREAM_FAILED)}
        self._discarded.append(executor)
        self._executor = None
        self.log.warning("model.stream_broken", kind=error.kind, retry=retry, blocks=len(asm.blocks),
                         tools_aborted=len(aborted))
        partial = results = None
        blocks = tuple(asm.blocks)
        if blocks and retry is None:
            partial = Message("assistant", blocks, kind="assistant")
            ids = partial.tool_use_ids()
            if ids:
                results = Message("user", tuple(aborted[i].block if i in aborted else _interrupted(i)
                                                for i in ids), kind="tool_results")
                for b in results.content:
                    self._emit_result(b)
        return await self._failed(state, error, partial, results)

    async def _next_event(self, it: Any, executor: StreamingToolExecutor) -> Any:
        """The next stream event, emitting tool results that become ready meanwhile; None = abort.

        An abort wins over an event that arrived at the same moment: a fast stream must not run on
        to its end (and complete the turn) past a cancellation."""
        if self.abort_event.is_set():
            return None
        nxt = asyncio.ensure_future(anext(it, _END))
        abort_wait = asyncio.ensure_future(self.abort_event.wait())
        try:
            while True:
                waiters = {nxt, abort_wait}
                ready = None
                if executor.has_pending():
                    # race the stream against the executor, so a result shows as soon as it exists
                    ready = asyncio.ensure_future(executor.wait_ready())
                    waiters.add(ready)
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if ready is not None and not ready.done():
                    ready.cancel()
                self._emit_ready(executor)
                if abort_wait in done:
                    nxt.cancel()
                    # let the cancelled read unwind, so the stream can be closed (not left running)
                    await asyncio.wait({nxt})
                    if not nxt.cancelled():
                        nxt.exception()  # retrieved: a failure racing the abort is moot
                    return None
                if nxt in done:
                    return nxt.result()
        finally:
            abort_wait.cancel()

    def _on_event(self, ev: StreamEvent, asm: ResponseAssembler, executor: StreamingToolExecutor) -> None:
        block = asm.feed(ev)
        if isinstance(ev, MessageStop):
            self.log.debug("model.message_stop")
        if block is None:
            return
        self.emit({"type": "assistant", "message": {
            "id": asm.message_id, "type": "message", "role": "assistant", "model": asm.model,
            "content": [block], "stop_reason": None, "usage": dict(asm.usage)},
            "parent_tool_use_id": None, "session_id": self.session_id})
        if block.get("type") == "tool_use":
            executor.add_tool(block, invalid_json=asm.invalid_tool_inputs.get(block["id"]))
            self._emit_ready(executor)

    def _account(self, response: ModelResponse) -> None:
        self._account_usage(response.model or self.options.model, response.usage)
        # the next estimate starts from this report and adds only what the request did not carry
        self._last_usage = response.usage
        self._counted_upto = self._request_messages

    def _account_usage(self, model: str, usage: Mapping[str, Any]) -> None:
        """Usage and cost of any request the loop made (main, compaction, a broken stream)."""
        self._usage = add_usage(self._usage, usage)
        self._cost += cost_usd(model, usage)

    def _needs_structured_output(self, response: ModelResponse) -> bool:
        if self.options.json_schema is None:
            return False
        return not any(b.get("name") == "StructuredOutput" for b in response.tool_uses())

    async def _dispatch(self, state: LoopState) -> Event:
        executor = self._executor
        asm = self._asm
        assert executor is not None and asm is not None
        results = await self._drain(executor)
        if results is None:  # aborted while tools ran
            return self._abort_event_for(state)
        self._executor = None
        response = asm.finish()
        assistant = response.as_message()
        by_id = {r.tool_use_id: r for r in results}
        ordered = [by_id[i] for i in assistant.tool_use_ids()]
        for r in ordered:
            if r.permission_denial is not None:
                self._denials.append(r.permission_denial)
            if r.tool_name == "StructuredOutput" and not r.is_error:
                self._structured = r.output_data
        # a deferral counts only for a lone call: deferring one of several would leave its siblings'
        # results without their call on resume (seed 004)
        deferred = len(ordered) == 1 and ordered[0].deferred
        user = Message("user", tuple(r.block for r in ordered),
                       kind=DEFERRED_RESULTS if deferred else "tool_results")
        stop = next((r for r in ordered if r.stop), None)
        ends_turn = any(r.ends_turn for r in ordered)
        calls = [{"tool_name": r.tool_name, "tool_input": dict(_input_of(assistant, r.tool_use_id)),
                  "tool_use_id": r.tool_use_id, "tool_response": r.block.get("content")} for r in ordered]
        post = await self.hooks.post_tool_batch(calls)
        post_blocked = bool(post is not None
                            and (getattr(post, "blocked", False) or getattr(post, "stop", False)))
        post_reason = (getattr(post, "reason", "") or getattr(post, "stop_reason", "")) if post else ""
        extra = tuple(getattr(post, "additional_context", ()) or ()) if post else ()
        if extra:
            user = attrs.evolve(user, content=user.content + tuple(
                {"type": "text", "text": prompts.reminder(c)} for c in extra))
        continuing = not (stop or deferred or ends_turn or post_blocked)
        # queued input is absorbed only when another request follows this batch (not past max_turns)
        absorb = continuing and (self.limits.max_turns is None or state.turn_count < self.limits.max_turns)
        attachments = self.queue.absorb() if absorb else ()
        self._drained = ToolsDrained(
            assistant=assistant, results=user, aborted=False, deferred=deferred,
            hook_stopped=stop is not None, hook_stop_reason=stop.stop_reason if stop else "",
            ends_turn=ends_turn, post_batch_blocked=post_blocked and not ends_turn,
            post_batch_reason=post_reason, attachments=attachments,
            context_layers=executor.context_layers())
        return self._drained

    async def _drain(self, executor: StreamingToolExecutor) -> list[Any] | None:
        waiter = asyncio.ensure_future(executor.remaining())
        abort_wait = asyncio.ensure_future(self.abort_event.wait())
        try:
            while True:
                ready = asyncio.ensure_future(executor.wait_ready())
                done, _ = await asyncio.wait({waiter, abort_wait, ready}, return_when=asyncio.FIRST_COMPLETED)
                if not ready.done():
                    ready.cancel()
                self._emit_ready(executor)
                if waiter in done:
                    results = waiter.result()
                    for r in results:
                        self._emit_result(r.block)
                    return results
                if abort_wait in done:
                    waiter.cancel()
                    return None
        finally:
            abort_wait.cancel()

    def _emit_ready(self, executor: StreamingToolExecutor) -> None:
        for r in executor.drain_ready():
            self._emit_result(r.block)

    def _emit_result(self, block: Mapping[str, Any]) -> None:
        tid = block.get("tool_use_id", "")
        if tid in self._emitted_results:
            return
        self._emitted_results.add(tid)
        self.emit({"type": "user", "message": {"role": "user", "content": [dict(block)]},
                   "parent_tool_use_id": None, "session_id": self.session_id})

    def _new_executor(self) -> StreamingToolExecutor:
        def make_ctx(tool_use_id: str) -> ToolContext:
            return ToolContext(cwd=self.options.cwd, session_id=self.session_id, tool_use_id=tool_use_id,
                               abort=self.abort_event, read_files=self.read_files,
                               services=self.services)

        return StreamingToolExecutor(lookup=self.registry, gate=self.gate, ctx_factory=make_ctx,
                                     max_concurrency=self.limits.max_tool_concurrency)

    async def _stop_hooks(self, state: LoopState) -> Event | None:
        """After a completed end of turn, Stop hooks may block (re-enter) or prevent the end."""
        last = next((m for m in reversed(state.messages) if m.role == "assistant"), None)
        outcome = await self.hooks.stop(last.text() if last else "", state.stop_hook_active)
        if outcome is None:
            return None
        blocked = bool(getattr(outcome, "blocked", False))
        prevented = bool(getattr(outcome, "prevented", False))
        if not (blocked or prevented):
            return None
        if blocked and not prevented and state.stop_hook_blocking_count >= self.limits.stop_hook_block_cap:
            warning = prompts.STOP_HOOK_CAP_WARNING.format(n=state.stop_hook_blocking_count)
            self._warnings.append(warning)
            self.emit({"type": "system", "subtype": "warning", "message": warning,
                       "session_id": self.session_id})
        return StopHookVerdict(blocked=blocked, reason=getattr(outcome, "reason", "") or "",
                               prevented=prevented, stop_reason=getattr(outcome, "stop_reason", "") or "")

    async def _resume_deferred(self, history: tuple[Message, ...], first: Message
                               ) -> tuple[tuple[Message, ...], SetupFailed | None]:
        """A run resumed after ``tool_deferred`` first runs the deferred call (its PreToolUse hooks
        are asked again) and puts the real result where the deferral's stood. A call whose tool this
        session no longer offers cannot be resumed: ``tool_deferred_unavailable``. Deferred again:
        the run ends ``tool_deferred`` once more, before any request."""
        if len(history) < 2 or history[-1].kind != DEFERRED_RESULTS or history[-2].role != "assistant":
            return history, None
        assistant = history[-2]
        calls = [b for b in assistant.content if b.get("type") == "tool_use"]
        missing = [b["name"] for b in calls if self.registry.get(b["name"]) is None]
        if missing:
            self.log.warning("tool.deferred_unavailable", tools=missing)
            return history, SetupFailed(
                TerminalReason.TOOL_DEFERRED_UNAVAILABLE,
                f"The deferred tool call cannot be resumed: {', '.join(missing)} is no longer available "
                f"(available tools: {', '.join(self.registry.names()) or 'none'}).")
        executor = self._new_executor()
        for block in calls:
            executor.add_tool(block)
        results = await executor.remaining()
        self.log.info("tool.deferred_resumed", tools=[b["name"] for b in calls])
        deferred = len(results) == 1 and results[0].deferred
        replaced = Message("user", tuple(r.block for r in results),
                           kind=DEFERRED_RESULTS if deferred else "tool_results")
        for r in results:
            self._emit_result(r.block)
        messages = (*history[:-1], replaced)
        # The session file's history view is rewritten from here on (fsm.sessions.load_history reads
        # what follows the last boundary); the run's prompt, already recorded, closes the new view.
        self.trace.compact_boundary("deferred_resume", 0)
        for m in (*messages, first):
            self.trace.message(m)
        if deferred:
            return messages, SetupFailed(TerminalReason.TOOL_DEFERRED,
                                         "The resumed tool call was deferred again by a PreToolUse hook")
        return messages, None

    async def _close_executors(self) -> None:
        """Let the calls of every abandoned executor unwind (bounded), so no task outlives the run."""
        discarded, self._discarded = self._discarded, []
        if self._executor is not None:
            discarded.append(self._executor)
        for executor in discarded:
            await executor.aclose()

    def _tombstone(self) -> None:
        """Withdraw what a response that is being requested again already showed: its blocks and
        the results of its tool calls (stream-json consumers drop them; they never reach history)."""
        asm = self._asm
        if asm is not None and asm.blocks:
            ids = [b["id"] for b in asm.blocks if b.get("type") == "tool_use"]
            self.emit({"type": "system", "subtype": "tombstone", "session_id": self.session_id,
                       "message_id": asm.message_id, "blocks": len(asm.blocks), "tool_use_ids": ids})
        self._asm = None

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            try:
                await stream.aclose()
            except (RuntimeError, ModelCallError):  # closing a generator mid-iteration
                self.log.debug("model.stream_close_failed")


def _with_structured_output(registry: Any, schema: Mapping[str, Any] | None) -> Any:
    """The registry plus the ``StructuredOutput`` tool when a JSON schema asks for it (unless the
    session already registered one)."""
    if schema is None or registry.get("StructuredOutput") is not None:
        return registry
    from tools.registry import ToolRegistry
    from tools.structured_output import StructuredOutputTool

    return ToolRegistry([*registry.tools(), StructuredOutputTool(schema)])


def _interrupted(tool_use_id: str) -> dict[str, Any]:
    """The result of a tool_use the executor never saw (cut off before it was handed over)."""
    return dict(synthetic_result(tool_use_id, "", "user_interrupted").block)


def _input_of(assistant: Message, tool_use_id: str) -> Mapping[str, Any]:
    for b in assistant.content:
        if b.get("type") == "tool_use" and b.get("id") == tool_use_id:
            return b.get("input", {})
    return {}
