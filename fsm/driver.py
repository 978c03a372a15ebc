"""The async driver: performs what the graph decides.

Each iteration observes the world in the current phase (assemble context, call the model, stream,
run tools, run hooks), turns what happened into an event record, and hands it to the machine
(:class:`fsm.graph.LoopMachine`). The driver never chooses a next phase itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import structlog

from fsm import graph, prompts
from fsm.assembler import ResponseAssembler, StreamProtocolError
from fsm.compact import compact, estimate_tokens
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
from fsm.pipeline import synthetic_result
from fsm.gate import OpenGate, ToolGate
from fsm.model import MessageStop, ModelCallError, ModelClient, ModelRequest, StreamEvent
from fsm.options import Options
from fsm.request import normalize
from fsm.result import RunResult, build_result
from fsm.state import LoopState, Message, Phase, TerminalReason, ToolUseContext
from fsm.trace import TraceWriter
from tools.base import ToolContext

Emit = Callable[[dict[str, Any]], None]
_END = object()


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


@attrs.define
class InputQueue:
    """User input submitted while a turn runs; an item leaves the queue only once absorbed."""

    items: list[str] = attrs.field(factory=list)

    def submit(self, text: str) -> None:
        self.items.append(text)

    def take(self) -> list[str]:
        taken, self.items = self.items, []
        return taken


class Driver:
    def __init__(self, *, options: Options, client: ModelClient, registry: Any, session_id: str,
                 system: tuple[Mapping[str, Any], ...], gate: ToolGate | None = None,
                 hooks: Any = None, trace: TraceWriter | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, services: Mapping[str, Any] | None = None) -> None:
        self.options = options
        self.limits = options.limits
        self.client = client
        self.registry = registry
        self.session_id = session_id
        self.system = system
        self.gate: ToolGate = gate or OpenGate()
        self.hooks = hooks or LoopHooks()
        self.trace = trace or TraceWriter(None)
        self.emit: Emit = emit or (lambda _m: None)
        self.queue = queue or InputQueue()
        self.services = dict(services or {})
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
        self._counted_upto = 0
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
        state = LoopState(messages=(*history, first), tool_use_context=ctx)
        machine = graph.LoopMachine(state)
        self.trace.message(first)
        text = prompt if isinstance(prompt, str) else "".join(b.get("text", "") for b in content)
        blocked = await self.hooks.user_prompt_submit(text)
        if blocked is not None and getattr(blocked, "blocked", False):
            self._apply(machine, SetupFailed(TerminalReason.HOOK_STOPPED,
                                             getattr(blocked, "reason", "") or "prompt blocked by hook"))
        try:
            await self._loop(machine)
        except asyncio.CancelledError:
            if machine.phase is not Phase.STOP:
                self._apply(machine, self._abort_event_for(machine.state))
            raise
        finally:
            await self._close_stream()
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
        if edge.kind in ("retry",) or step.trigger in ("stream_retry", "fallback_retry"):
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
                    res_blocks = tuple(got[i].block if i in got else _interrupted(i) for i in ids)
                    results = Message("user", res_blocks, kind="tool_results")
                    for b in res_blocks:
                        self._emit_result(b)
        self._executor = None
        return Aborted(partial, results)

    # --- phases --------------------------------------------------------------------------------

    async def _assemble(self, state: LoopState) -> Event:
        attachments = tuple(prompts.queued_input(t) for t in self.queue.take())
        lim = self.limits
        tokens = estimate_tokens(state.messages, self._last_usage, self._counted_upto)
        tracking = state.compact_tracking
        if (lim.auto_compact and tokens > lim.auto_compact_threshold
                and tracking.consecutive_failures < lim.max_consecutive_compact_failures):
            await self.hooks.pre_compact("auto", None)
            self.log.info("compact.start", trigger="auto", tokens=tokens)
            result = await compact(self.client, model=self._model(state), system=self.system,
                                   messages=state.messages, trigger="auto",
                                   metadata=self._metadata())
            self.log.info("compact.end", trigger="auto", ok=result is not None)
            if result is None:
                return Assembled(compact_failed=True, attachments=attachments)
            rapid = tracking.compactions > 0 and tracking.turns_since_compact < lim.rapid_refill_turns
            return Assembled(compaction=result, rapid_refill=rapid, attachments=attachments)
        return Assembled(attachments=attachments)

    def _model(self, state: LoopState) -> str:
        models = self.options.models
        return models[min(state.model_index, len(models) - 1)]

    def _metadata(self) -> dict[str, str]:
        return {"user_id": f"session_{self.session_id}"}

    async def _call_model(self, state: LoopState) -> Event:
        lim = self.limits
        if lim.max_budget_usd is not None and self._cost >= lim.max_budget_usd:
            return Refused(TerminalReason.BUDGET_EXHAUSTED,
                           f"Reached maximum budget (${lim.max_budget_usd:g}); spent ${self._cost:.4f}")
        tokens = estimate_tokens(state.messages, self._last_usage, self._counted_upto)
        if tokens > lim.blocking_limit:
            return Refused(TerminalReason.BLOCKING_LIMIT,
                           f"Prompt is too long: about {tokens} tokens, over the blocking limit "
                           f"of {lim.blocking_limit}. Compact the conversation or start a new one.")
        wire = normalize(state.messages)
        model = self._model(state)
        request = ModelRequest(model=model, system=self.system, messages=tuple(wire),
                               tools=tuple(self.registry.api_schemas()),
                               max_tokens=lim.max_output_tokens, metadata=self._metadata())
        self.trace.request(model, state.query_tracking.depth, wire)
        self.log.info("model.request", model=model, messages=len(wire),
                      chain_id=state.query_tracking.chain_id, depth=state.query_tracking.depth)
        self._t_request = time.monotonic()
        self._stream = self.client.stream(request)
        try:
            self._first = await anext(self._stream)
        except StopAsyncIteration:
            return CallFailed(ModelError("model", "The API returned an empty stream", None, True),
                              fallback_available=self._has_fallback(state))
        except ModelCallError as exc:
            self._api_ms += (time.monotonic() - self._t_request) * 1000
            return await self._failed(state, exc.error)
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
            await self.hooks.pre_compact("auto", None)
            compaction = await compact(self.client, model=self._model(state), system=self.system,
                                       messages=state.messages, trigger="reactive",
                                       metadata=self._metadata())
        self.log.warning("model.error", kind=error.kind, status=error.status, message=error.message)
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
            error = exc.error if isinstance(exc, ModelCallError) else ModelError("model", str(exc))
            return await self._stream_failed(state, error, asm, executor)
        finally:
            self._stream = None
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
            self._executor = None
        return event

    async def _stream_failed(self, state: LoopState, error: ModelError, asm: ResponseAssembler,
                             executor: StreamingToolExecutor) -> CallFailed:
        retrying = (error.retryable and state.stream_retry_count < self.limits.stream_retries) or (
            (error.retryable or error.kind == "overloaded") and self._has_fallback(state))
        aborted = {r.tool_use_id: r for r in executor.abort("stream_failed")}
        self._executor = None
        partial = results = None
        blocks = tuple(asm.blocks)
        if blocks and not retrying:
            partial = Message("assistant", blocks, kind="assistant")
            ids = partial.tool_use_ids()
            if ids:
                results = Message("user", tuple(aborted[i].block if i in aborted else _interrupted(i)
                                                for i in ids), kind="tool_results")
        return await self._failed(state, error, partial, results)

    async def _next_event(self, it: Any, executor: StreamingToolExecutor) -> Any:
        """The next stream event, emitting tool results that become ready meanwhile; None = abort."""
        if not executor.has_pending() and not self.abort_event.is_set():
            # nothing running: no need to race the stream against the executor
            nxt = asyncio.ensure_future(anext(it, _END))
            abort_wait = asyncio.ensure_future(self.abort_event.wait())
            done, _ = await asyncio.wait({nxt, abort_wait}, return_when=asyncio.FIRST_COMPLETED)
            abort_wait.cancel()
            if nxt in done:
                return nxt.result()
            nxt.cancel()
            return None
        nxt = asyncio.ensure_future(anext(it, _END))
        abort_wait = asyncio.ensure_future(self.abort_event.wait())
        try:
            while True:
                waiters = {nxt, abort_wait}
                ready = None
                if executor.has_pending():
                    ready = asyncio.ensure_future(executor.wait_ready())
                    waiters.add(ready)
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if ready is not None and not ready.done():
                    ready.cancel()
                self._emit_ready(executor)
                if nxt in done:
                    return nxt.result()
                if abort_wait in done:
                    nxt.cancel()
                    return None
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
        self._usage = add_usage(self._usage, response.usage)
        self._cost += cost_usd(response.model or self.options.model, response.usage)
        self._last_usage = response.usage

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
        user = Message("user", tuple(r.block for r in ordered), kind="tool_results")
        deferred = len(ordered) == 1 and ordered[0].deferred
        stop = next((r for r in ordered if r.stop), None)
        ends_turn = any(r.ends_turn for r in ordered)
        calls = [{"tool_name": r.tool_name, "tool_input": dict(_input_of(assistant, r.tool_use_id)),
                  "tool_use_id": r.tool_use_id, "tool_response": r.block.get("content")} for r in ordered]
        post = await self.hooks.post_tool_batch(calls)
        post_blocked = bool(post is not None and (getattr(post, "blocked", False) or getattr(post, "stop", False)))
        post_reason = (getattr(post, "reason", "") or getattr(post, "stop_reason", "")) if post else ""
        extra = tuple(getattr(post, "additional_context", ()) or ()) if post else ()
        if extra:
            user = attrs.evolve(user, content=user.content + tuple(
                {"type": "text", "text": prompts.reminder(c)} for c in extra))
        continuing = not (stop or deferred or ends_turn or post_blocked)
        attachments = tuple(prompts.queued_input(t) for t in self.queue.take()) if continuing else ()
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

    def _tombstone(self) -> None:
        asm = self._asm
        if asm is not None and asm.blocks:
            self.emit({"type": "system", "subtype": "tombstone", "session_id": self.session_id,
                       "message_id": asm.message_id, "blocks": len(asm.blocks)})
        self._asm = None

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            try:
                await stream.aclose()
            except (RuntimeError, ModelCallError):  # closing a generator mid-iteration
                self.log.debug("model.stream_close_failed")


def _interrupted(tool_use_id: str) -> dict[str, Any]:
    """The result of a tool_use the executor never saw (cut off before it was handed over)."""
    return dict(synthetic_result(tool_use_id, "", "user_interrupted").block)


def _input_of(assistant: Message, tool_use_id: str) -> Mapping[str, Any]:
    for b in assistant.content:
        if b.get("type") == "tool_use" and b.get("id") == tool_use_id:
            return b.get("input", {})
    return {}
