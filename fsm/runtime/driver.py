"""The in-process runtime of the loop: performs each phase's I/O on one event loop, decides nothing.

The loop itself — perform the phase, fire the event on the machine, carry out what the move declares
— is :class:`agentfsm.runtime.runner.LoopRunner`, which the Temporal workflow runs too. This module supplies
how each phase is done here (:data:`agentfsm.runtime.runner.WORK`: assemble the context, call the model,
consume the stream, run the tool batch, run Stop hooks when they are due), turns what happened into
an event record with the raw facts (what a broken response showed, which of its calls finished),
and carries out the consequences a move declares (:class:`agentfsm.machine.graph.Does`): pair or withdraw
what was shown, close the response's calls, take queued input. Where the loop goes, and every guard,
cap and "is it due" question, is answered by :mod:`agentfsm.machine.graph`.

Faults, phase by phase (the graph picks the edge; the driver gathers the facts):

* assemble — auto-compaction when :func:`agentfsm.machine.graph.should_auto_compact` says so; any exception
  while preparing the turn is ``turn_setup_failed``. A deferred tool call of a resumed run is run
  again before the loop starts (``tool_deferred_unavailable`` when its tool is gone).
* call_model — :func:`agentfsm.machine.graph.preflight_refusal` (a host's ``should_stop_before_next_call``,
  the budget, the blocking limit); then the request, carrying any queued user input. Transient HTTP
  failures are retried inside the transport; what still fails arrives as a classified
  :class:`ModelError`. A reactive compaction is made first when the route the failure would take
  with one compacts (:func:`agentfsm.machine.graph.compaction_wanted`).
* stream — a stream that breaks part-way is reported with what it showed and which calls finished;
  the move says whether that is withdrawn (asked again, or compacted) or kept and paired (the end).
  A protocol violation is ``model_error``.

Stopping (:mod:`agentfsm.runtime.signals`): :meth:`Driver.interrupt` is the user's interrupt (Ctrl-C, the
SDK's ``interrupt``): a response that is streaming is cut, running tools whose ``interrupt_behavior()``
is ``cancel`` are cancelled and ``block`` tools finish, then the loop ends
``aborted_tools``/``aborted_streaming``. :meth:`Driver.abort` is the hard stop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.common import log
from agentfsm.common.weak import weak_method
from agentfsm.llm.model import (
    MessageStart,
    ModelCallError,
    ModelClient,
    ResponseStream,
    RetryNotice,
    StreamEvent,
    can_unstream,
)
from agentfsm.machine import graph
from agentfsm.machine.events import (
    Aborted,
    Assembled,
    CallFailed,
    Compaction,
    Event,
    ModelError,
    SetupFailed,
    StopHookVerdict,
    StreamOpened,
    TaskNotified,
)
from agentfsm.machine.options import Options
from agentfsm.machine.state import LoopState, Message, Phase, TerminalReason, ToolUseContext
from agentfsm.runtime import phases
from agentfsm.runtime.assembler import ResponseAssembler, StreamProtocolError, TakenIds
from agentfsm.runtime.compact import compact
from agentfsm.runtime.executor import QUEUED, RunCalls, StreamingToolExecutor
from agentfsm.runtime.pipeline import INTERRUPT_RUN, ToolTable
from agentfsm.runtime.ports import LoopHooks, ToolGate, ToolLookup
from agentfsm.runtime.queue import InputQueue, QueueItem
from agentfsm.runtime.request import WireCache, canonical_names
from agentfsm.runtime.result import Passes, RunAccount, RunResult, build_result
from agentfsm.runtime.runner import LoopRunner, StepObserver
from agentfsm.runtime.signals import RunSignals, Stopped
from agentfsm.runtime.tasks import agent_running
from agentfsm.runtime.trace import TraceWriter
from agentfsm.tools.base import TASKS, FileAccess

__all__ = ["DEFERRED_RESULTS", "Driver", "Emit", "StepObserver", "StopBeforeCall"]

Emit = Callable[[dict[str, Any]], None]
# Asked before every model request with the loop state; a truthy answer ends the foreground loop
# with `background_requested` (a string answer is the reason).
StopBeforeCall = Callable[[LoopState], Any]
DEFERRED_RESULTS = graph.DEFERRED_RESULTS


class _LogSteps:
    """The structured log's view of the loop: one ``loop.transition`` event per move."""

    def __init__(self, logger: log.ModuleLogger) -> None:
        self.log = logger

    def on_step(self, before: LoopState, step: graph.Step, event: Event) -> None:
        if not self.log.is_enabled_for(20):
            return
        after = step.state
        self.log.info("loop.transition", **{"from": before.phase.value}, to=after.phase.value,
                      label=step.trigger, route=step.route, kind=step.edge.kind, turn=after.turn_count,
                      chain_id=after.query_tracking.chain_id, depth=after.query_tracking.depth,
                      terminal_reason=after.terminal_reason.value if after.terminal_reason else None,
                      **after.counters())


def _finished(executor: StreamingToolExecutor | None) -> tuple[Mapping[str, Any], ...]:
    """The results of the calls of ``executor`` that have finished (none without one)."""
    return tuple(r.block for r in executor.ordered_results()) if executor is not None else ()


class Driver:
    """Runs one loop (one prompt to one result) of a session in process; see the module docstring.
    It is the :class:`agentfsm.runtime.runner.Runtime` of :class:`agentfsm.runtime.runner.LoopRunner`."""

    def __init__(self, *, options: Options, client: ModelClient, registry: ToolLookup, session_id: str,
                 system: tuple[Mapping[str, Any], ...], gate: ToolGate, hooks: LoopHooks,
                 trace: TraceWriter | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, services: Mapping[str, Any] | None = None,
                 should_stop_before_next_call: StopBeforeCall | None = None,
                 observers: Sequence[StepObserver] = (),
                 file_access: Callable[[], FileAccess] | None = None,
                 background: Callable[[], bool] | None = None, read_files: dict[str, float] | None = None) -> None:
        self.options = options
        # whether background work this session started may still report (its tasks and agents)
        self.background: Callable[[], bool] = background or (lambda: False)
        self.limits = options.limits
        self.client = client
        # a --json-schema that is not a JSON Schema cannot be offered as a tool: the run's setup fails
        self.registry, self._setup_error = phases.structured_output_setup(registry, options.json_schema)
        self.session_id = session_id
        self.system = system
        self.gate = gate
        self.hooks = hooks
        self.trace = trace or TraceWriter(None)
        self.emit: Emit = emit or (lambda _m: None)
        self.queue = queue if queue is not None else InputQueue()
        self.services = dict(services or {})
        # a permission callback's deny with interrupt stops the run like the user's interrupt
        # (held weakly: the driver's own bound method in its services would make a cycle, issue 34)
        self.services.setdefault(INTERRUPT_RUN, weak_method(self.interrupt, gone=None))
        self.should_stop_before_next_call: StopBeforeCall | None = (
            should_stop_before_next_call or options.should_stop_before_next_call)
        # tools see the abort signal (ToolContext.abort) and may set it too
        self.signals = RunSignals(session_id)
        # each tool call's context and each response's executor (read_files: what Read saw, session-wide)
        self.calls = RunCalls(ToolTable.of(self.registry), gate, options.cwd, session_id, self.signals.abort_event,
                              self.services, self.limits.max_tool_concurrency, file_access,
                              {} if read_files is None else read_files)
        self.log = log.get_logger("agentfsm", session_id=session_id)
        self.observers: tuple[StepObserver, ...] = (self.trace, _LogSteps(self.log), *observers)
        self.account = RunAccount()
        self.passes = Passes(time.monotonic())  # (each run starts its own)
        # what the phase in progress holds between its perform and the machine's step
        self._request_messages = 0
        self._pending_input: tuple[QueueItem, ...] = ()
        self._stream: ResponseStream | None = None  # the response of the last request
        self._executor: StreamingToolExecutor | None = None
        self._asm: ResponseAssembler | None = None
        self._taken_ids = TakenIds()  # the tool_use ids of the history, as of the last response
        self._shown = phases.ResultsShown(self.emit, session_id)  # each tool result shown once
        # the wire view, built incrementally request by request (calls by an alias under the tool's name)
        self._wire = WireCache(canonical_names(self.registry.tools()))
        self._static: int | None = None  # tokens of the system prompt and tool schemas
        # executors given up on (abort, stream retry): their cancelled calls are awaited at the end
        self._discarded: list[StreamingToolExecutor] = []

    # --- public --------------------------------------------------------------------------------

    def abort(self) -> None:
        """Hard stop: everything running is cancelled at once. Finished tools keep their effects."""
        self.signals.abort()

    def interrupt(self) -> None:
        """The user's interrupt: the response is cut, ``cancel`` tools are cancelled and ``block``
        tools finish, then the loop ends. Nothing is rolled back."""
        self.signals.interrupt()
        executor = self._executor
        if executor is not None and not executor.aborted:
            executor.interrupt()

    @property
    def cost_usd(self) -> float:
        return self.account.cost_usd

    async def run(self, prompt: str | Sequence[Mapping[str, Any]],
                  history: Sequence[Message] = ()) -> tuple[RunResult, LoopState]:
        started = time.monotonic()
        mode = getattr(self.gate, "permission_mode", None) or self.options.permission_mode or "default"
        ctx = ToolUseContext(cwd=str(self.options.cwd), permission_mode=mode,
                             tool_names=tuple(self.registry.names()))
        first, text = phases.first_message(prompt)
        setup_failure: SetupFailed | None = None
        erased = False
        if self._setup_error is not None:
            setup_failure = SetupFailed(TerminalReason.TURN_SETUP_FAILED, self._setup_error)
        else:
            self.trace.before_hooks(self.hooks, "UserPromptSubmit")
            first, setup_failure, erased = phases.prompt_verdict(first, await self.hooks.user_prompt_submit(text))
            if not erased:
                first = phases.with_budget(first, self.limits.max_budget_usd, self.account.cost_usd)
        # the prompt record marks where this run starts in the file (before anything the run
        # writes); an erased one is recorded as such, and resume leaves it out of the history
        self.trace.message(phases.recorded_prompt(first, erased))
        if setup_failure is None:
            history, setup_failure = await _resume_deferred(self, tuple(history), first)
        messages: tuple[Message, ...] = tuple(history) if erased else (*history, first)
        self.signals.arm()
        self.passes = Passes(started)
        runner = LoopRunner(self, LoopState(messages=messages, tool_use_context=ctx), self.session_id)
        try:
            state = await runner.run(setup_failure)
        finally:
            await self._close_stream()
            await self._close_executors()
            await self.signals.disarm()
        acct = self.account
        result = self.passes.of(self._result_so_far(state), time.monotonic())
        # the results of earlier passes held back while a background subagent ran come first
        for held in self.passes.held:
            self.emit(held.to_dict())
        self.passes.held.clear()
        self.trace.result(result.to_dict())
        self.log.info("loop.terminal", terminal_reason=result.terminal_reason.value,
                      subtype=result.subtype, is_error=result.is_error, turns=result.num_turns,
                      cost_usd=round(acct.cost_usd, 6))
        return result, state

    def _result_so_far(self, state: LoopState) -> RunResult:
        acct = self.account
        return build_result(state, session_id=self.session_id, duration_ms=0, duration_api_ms=int(acct.api_ms),
                            cost=acct.cost_usd, usage=acct.usage, denials=tuple(acct.denials),
                            structured_output=acct.structured_output, warnings=tuple(acct.warnings), account=acct)

    # --- the runtime's side of the runner: stop, and the consequences a move declares ------------

    def stopping(self) -> bool:
        return self.signals.stopping()

    async def between(self, state: LoopState) -> None:
        return None

    def abort_event(self, state: LoopState) -> Aborted:
        """What the stop cut: the blocks the response in progress showed, and its finished calls."""
        if state.phase in (Phase.STREAM, Phase.DISPATCH_TOOLS) and self._asm is not None:
            return Aborted(tuple(self._asm.blocks), _finished(self._executor))
        return Aborted()

    def warn(self, notice: str) -> None:
        self.account.warnings.append(notice)
        self.emit(phases.warning_message(self.session_id, notice))

    def take_input(self) -> None:
        if self._pending_input:
            self.queue.take_items(self._pending_input)

    def compacted(self, event: Event) -> None:
        self.account.anchor(None, 0)
        self.emit(phases.compact_boundary_message(self.session_id, event))

    def show(self, message: Mapping[str, Any]) -> None:
        self.emit(dict(message))

    def keep_finished(self, tool_use_ids: Sequence[str]) -> None:
        """The finished calls' results stay in the history: accounted as a batch's (docs/conform.md)."""
        phases.account_batch(self.account, self._executor.ordered_results(only=tool_use_ids) if self._executor else [])

    def close_calls(self, reason: str) -> None:
        """The response's executor is given up: its unfinished calls are cancelled for ``reason``."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.abort(reason)
            self._discarded.append(executor)

    def withdraw(self) -> None:
        """Withdraw what the response showed: its blocks and the results of its tool calls
        (stream-json consumers drop them; they never reach history)."""
        asm, self._asm = self._asm, None
        if asm is not None and asm.blocks:
            self.emit(phases.tombstone_message(self.session_id, asm.message_id, asm.blocks))

    def show_results(self, blocks: Sequence[Mapping[str, Any]]) -> None:
        for block in blocks:
            self._shown.block(block)

    # --- assemble ------------------------------------------------------------------------------

    async def assemble(self, state: LoopState) -> Event:
        try:
            if not graph.should_auto_compact(state, self._estimate(state.messages), self.limits, self.account.cost_usd):
                return Assembled()  # nothing to await: no task, no race
            return await self.signals.until_stopped(self._prepare_turn(state))
        except Stopped:
            return self.abort_event(state)
        except Exception as exc:
            # Whatever breaks while preparing the turn (a hook object, a client failing outside its
            # error contract during compaction, a bug) ends the run cleanly instead of crashing it.
            self.log.error("turn.setup_failed", error=repr(exc), exc_info=True)
            return SetupFailed(TerminalReason.TURN_SETUP_FAILED, f"Turn setup failed: {type(exc).__name__}: {exc}")

    async def _prepare_turn(self, state: LoopState) -> Assembled:
        tokens = self._estimate(state.messages)
        if not graph.should_auto_compact(state, tokens, self.limits, self.account.cost_usd):
            return Assembled()
        compaction = await self._compact(state, "auto", tokens=tokens, threshold=self.limits.auto_compact_threshold)
        return Assembled(compaction=compaction, compact_failed=compaction is None)

    async def _compact(self, state: LoopState, trigger: str, on_failure: Callable[[str], None] | None = None,
                       api_message: str = "", **logged: Any) -> Compaction | None:
        """The history compacted (``auto`` before a turn, ``reactive`` after a refusal), PreCompact first;
        ``on_failure(why)`` when the summary request failed."""
        self.trace.before_hooks(self.hooks, "PreCompact")
        await self.hooks.pre_compact("auto", None)
        self.log.info("compact.start", trigger=trigger, **logged)
        compaction = await compact(self.client, model=self._model(state), system=self.system, messages=state.messages,
                                   trigger=trigger, metadata=self._metadata(), on_usage=self.account.spend,
                                   on_failure=on_failure, api_message=api_message)
        self.log.info("compact.end", trigger=trigger, ok=compaction is not None)
        return compaction

    def _estimate(self, messages: Sequence[Message]) -> int:
        return phases.estimate(self.account, messages, self._static_tokens())

    def _static_tokens(self) -> int:
        """System prompt and tool schemas: part of every request, in no message (fixed for a run)."""
        if self._static is None:
            self._static = phases.static_tokens(self.system, self.registry.api_schemas())
        return self._static

    def _model(self, state: LoopState) -> str:
        return phases.model_for(self.options.models, state)

    def _metadata(self) -> dict[str, str]:
        return phases.request_metadata(self.session_id)

    # --- call_model ----------------------------------------------------------------------------

    async def call_model(self, state: LoopState) -> Event:
        # the previous response is history now: an abort or a retry must never pair or withdraw it
        self._asm = None
        pending = self.queue.pending
        sent = tuple(item.as_attachment() for item in pending)
        # the history itself when nothing is queued (no copy of the message tuple per request)
        outgoing = (*state.messages, *sent) if sent else state.messages
        background = self.should_stop_before_next_call(state) if self.should_stop_before_next_call else None
        refused = graph.preflight_refusal(background=background, cost_usd=self.account.cost_usd,
                                          tokens=self._estimate(outgoing), limits=self.limits,
                                          state=state)
        if refused is not None:
            self.log.info("model.refused", reason=refused.reason.value, detail=refused.detail)
            return refused
        model = self._model(state)
        request = phases.build_request(outgoing, model=model, system=self.system, tools=self.registry.api_schemas(),
                                       limits=self.limits, metadata=self._metadata(), wire=self._wire.wire(outgoing),
                                       task_budget=self.options.task_budget, thinking=self.options.thinking)
        wire = request.messages
        self.trace.request(model, state.query_tracking.depth, state.messages, sent)
        self.log.info("model.request", model=model, messages=len(wire),
                      chain_id=state.query_tracking.chain_id, depth=state.query_tracking.depth)
        self._request_messages = len(outgoing)
        self._pending_input = pending
        if self.options.include_partial_messages:
            self.emit(phases.requesting_message(self.session_id))
        # after a stream that broke or came garbled before any content, the same request unstreamed
        # the stream is kept on the driver, so its retry callback must not hold the driver (a cycle)
        stream = self._stream = ResponseStream(self.client, request, on_retry=weak_method(self._retrying),
                                               unstreamed=state.non_streaming and can_unstream(self.client))
        # a slow answer or the SDK's retry backoff must not hold an interrupt until the response starts
        try:
            await self.signals.until_stopped(stream.open(), stop_wins=False)
        except Stopped:
            self._api_ms_since_request()
            await self._close_stream()
            return self.abort_event(state)
        except (StopAsyncIteration, ModelCallError) as exc:
            self._api_ms_since_request()
            return await self._failed(state, phases.open_error(exc))
        except Exception as exc:
            # outside the transport's error contract: a client bug, not a retryable fault
            self._api_ms_since_request()
            self.log.error("model.client_failed", error=repr(exc), exc_info=True)
            return await self._failed(state, phases.open_error(exc))
        self.log.info("model.first_event", model=model, ms=stream.ttft_ms)
        return StreamOpened(model, sent_input=sent)

    def _retrying(self, event: RetryNotice) -> None:
        """The transport retries the request (before its response started): reported as it happens."""
        self.log.warning("model.retry", attempt=event.attempt, max_retries=event.max_retries,
                         delay_ms=event.delay_ms, status=event.status, error=event.error)
        self.emit(phases.retry_message(event, self.session_id))

    def _api_ms_since_request(self) -> None:
        if self._stream is not None:
            self.account.api_ms += self._stream.elapsed_ms()

    async def _failed(self, state: LoopState, error: ModelError, shown: Sequence[Mapping[str, Any]] = ()
                      ) -> CallFailed:
        """The failure's event: the error, the blocks shown and (last, after any compaction) the calls
        that finished. A reactive compaction is made first when the route the failure would take with
        one compacts; only a failed compaction lets the error through to the user."""
        await self._close_stream()
        event = CallFailed(error, fallback_available=phases.has_fallback(self.options.models, state),
                           non_streaming_available=can_unstream(self.client), shown=tuple(shown))
        if graph.compaction_wanted(state, event, self.limits):
            why: list[str] = []
            compaction = await self._compact(state, "reactive", why.append, error.message, error=error.message)
            event = attrs.evolve(event, compaction=compaction, compaction_failure=why[0] if why else "")
        self.log.warning("model.error", kind=error.kind, status=error.status, message=error.message,
                         retryable=error.retryable)
        self.account.api_error_status, self.account.api_error_endpoint = error.status, error.endpoint
        return attrs.evolve(event, finished=_finished(self._executor)) if shown else event

    # --- stream --------------------------------------------------------------------------------

    async def consume_stream(self, state: LoopState) -> Event:
        # a tool_use id already in the conversation (or twice in this response) is renamed before the
        # block reaches the executor or the session file: the API refuses duplicate ids
        asm = self._asm = ResponseAssembler(taken_ids=self._taken_ids.of(state.messages))
        # on_ready: a bound method, not a closure over the executor (no executor -> callback -> executor cycle)
        executor = self._executor = self.calls.executor(self._emit_ready)
        self._shown.reset()
        stream = self._stream
        assert stream is not None
        it, first = stream.events, stream.take_first()
        try:
            try:
                # one task reads the whole stream, raced once against a stop; tool results that
                # become ready meanwhile are shown by the executor's on_ready, not by polling
                await self.signals.until_stopped(self._read_stream(it, first, asm, executor))
            except Stopped:
                return await self._stopped_mid_stream(state)
        except (ModelCallError, StreamProtocolError) as exc:
            return await self._stream_failed(state, phases.stream_error(exc, has_content=asm.has_content), asm)
        except Exception as exc:
            self.log.error("model.stream_failed_unexpectedly", error=repr(exc), exc_info=True)
            return await self._stream_failed(state, phases.stream_error(exc), asm)
        finally:
            await self._close_stream()
        with contextlib.suppress(Stopped):  # the response ended: a stop now is the tool batch's (docs/conform.md)
            await self.signals.until_stopped(executor.checks_done())
        self._api_ms_since_request()
        response = asm.finish()
        phases.account_response(self.account, response, self.options.model, self._request_messages)
        self.log.info("model.stream_end", stop_reason=response.stop_reason, blocks=len(response.blocks),
                      tool_uses=len(response.tool_uses()))
        if asm.renamed_ids:
            self.log.warning("model.duplicate_tool_use_ids", renamed=asm.renamed_ids)
        started = tuple(i for i in executor.tool_use_ids if executor.status(i) != QUEUED)
        return phases.stream_ended(response, json_schema=self.options.json_schema is not None,
                                   cost_usd=self.account.cost_usd, started=started, finished=_finished(executor))

    async def _stopped_mid_stream(self, state: LoopState) -> Aborted:
        """The stream was cut by a stop. On the user's interrupt, ``block`` tools the response already
        started finish first (their real results pair their calls); a hard abort cancels them."""
        await self._close_stream()
        executor = self._executor
        if executor is not None and await self.signals.finish_block_tools(executor):
            self._emit_ready(executor)
        return self.abort_event(state)

    async def _stream_failed(self, state: LoopState, error: ModelError, asm: ResponseAssembler) -> CallFailed:
        """The stream broke: the event carries what it showed; the route taken says whether that is
        withdrawn (the response is asked for again, or the history compacted) or kept and paired."""
        self._api_ms_since_request()
        await self._close_stream()
        if asm.usage:
            # the input was processed (and billed) even though the answer is lost
            self.account.spend(asm.model or self._model(state), asm.usage)
        self.log.warning("model.stream_broken", kind=error.kind, blocks=len(asm.blocks))
        return await self._failed(state, error, asm.blocks)

    async def _read_stream(self, it: Any, first: StreamEvent | None, asm: ResponseAssembler,
                           executor: StreamingToolExecutor) -> None:
        if first is not None:
            self._on_event(first, asm, executor)
        async for ev in it:
            self._on_event(ev, asm, executor)
        if not asm.stopped:
            raise ModelCallError(phases.ENDED_EARLY)

    def _on_event(self, ev: StreamEvent, asm: ResponseAssembler, executor: StreamingToolExecutor) -> None:
        block = asm.feed(ev)
        if block is not None:
            if block.get("type") == "tool_use" and block["id"] not in asm.invalid_tool_inputs:
                phases.complete_tool_input(block, self.registry)
            self.emit(phases.assistant_block_message(asm.message_id, asm.model, block, asm.usage, self.session_id))
            if block.get("type") == "tool_use":
                executor.add_tool(block, invalid_json=asm.invalid_tool_inputs.get(block["id"]))
                self._emit_ready(executor)
        if self.options.include_partial_messages:
            # after the block it finishes, as Claude Code prints them
            ttft = self._stream.ttft_ms if isinstance(ev, MessageStart) and self._stream is not None else None
            self.emit(phases.stream_event_message(ev, session_id=self.session_id, message_id=asm.message_id,
                                                  ttft_ms=int(ttft) if ttft is not None else None))

    # --- dispatch_tools ------------------------------------------------------------------------

    async def dispatch_tools(self, state: LoopState) -> Event:
        executor, asm = self._executor, self._asm
        assert executor is not None and asm is not None
        try:
            results, interrupted = await self.signals.drain(executor)
            self._shown.calls(results)
        except Stopped:  # hard abort while tools ran
            return self.abort_event(state)
        self._executor = None
        assistant = asm.finish().as_message()
        ordered = phases.in_model_order(assistant, results)
        phases.account_batch(self.account, ordered)
        post = None
        if not interrupted:
            self.trace.before_hooks(self.hooks, "PostToolBatch")
            post = await self.hooks.post_tool_batch(phases.post_batch_input(assistant, ordered))
        return phases.batch_drained(assistant, ordered, interrupted=interrupted, post=post,
                                    budget=(self.limits.max_budget_usd, self.account.cost_usd),
                                    context_layers=executor.context_layers())

    def _emit_ready(self, executor: StreamingToolExecutor) -> None:
        self._shown.calls(executor.drain_ready())

    # --- stop ----------------------------------------------------------------------------------

    async def stop_hooks(self, state: LoopState) -> StopHookVerdict:
        """Stop hooks are due after a completed end of turn: they may block (re-enter) or prevent the
        end. A stop while they run lets the end stand."""
        self.trace.before_hooks(self.hooks, "Stop")
        try:
            outcome = await self.signals.until_stopped(self.hooks.stop(phases.last_assistant_text(state.messages),
                                                                state.stop_hook_active))
        except Stopped:
            return StopHookVerdict()
        return phases.stop_verdict(outcome)

    async def task_notifications(self, state: LoopState) -> TaskNotified | None:
        """Wait, after the run ended, while background work may still report; the notifications
        queued by then start the next pass (their items leave the queue with the move: its
        ``take_input``). None when nothing runs, the run is being stopped, or user input is queued
        (the session's next run takes that, with any notification beside it). The pass that ended
        has its result (:class:`Passes`): printed now, or held while a background subagent runs."""
        if self.background() and not self.stopping():
            ended = self.passes.ended(self._result_so_far(state), time.monotonic(),
                                      held=agent_running(self.services.get(TASKS)))
            if ended is not None:
                self.emit(ended.to_dict())
        pending = await self.queue.notifications_after_run(lambda: self.background() and not self.stopping())
        if self.stopping() or not pending:
            self.passes.no_next()
            return None
        self.passes.next(usage=self.account.usage, now=time.monotonic())
        self._pending_input = pending
        self.log.info("loop.task_notifications", count=len(pending))
        return TaskNotified(tuple(item.as_attachment() for item in pending))

    # --- clean-up ------------------------------------------------------------------------------

    async def _close_executors(self) -> None:
        """Let the calls of every abandoned executor unwind (bounded), so no task outlives the run."""
        discarded, self._discarded = self._discarded, []
        if self._executor is not None:
            discarded.append(self._executor)
        for executor in discarded:
            await executor.aclose()

    async def _close_stream(self) -> None:
        if self._stream is not None and not await self._stream.aclose():  # closed mid-iteration
            self.log.debug("model.stream_close_failed")


async def _resume_deferred(d: Driver, history: tuple[Message, ...], first: Message
                           ) -> tuple[tuple[Message, ...], SetupFailed | None]:
    """Before a resumed run's loop: a run resumed after ``tool_deferred`` first runs the deferred call
    (its PreToolUse hooks are asked again) and puts the real result where the deferral's stood. A
    call whose tool this session no longer offers cannot be resumed: ``tool_deferred_unavailable``.
    Deferred again: the run ends ``tool_deferred`` once more, before any request."""
    calls = phases.deferred_calls(history)
    if not calls:
        return history, None
    unavailable = phases.deferred_unavailable(calls, d.registry)
    if unavailable is not None:
        gone = [b["name"] for b in calls if d.registry.get(b["name"]) is None]
        d.log.warning("tool.deferred_unavailable", tools=gone)
        return history, unavailable
    executor = d.calls.executor(d._emit_ready)
    for block in calls:
        executor.add_tool(block)
    results = await executor.remaining()
    d.log.info("tool.deferred_resumed", tools=[b["name"] for b in calls])
    d._shown.calls(results)
    messages, failure = phases.deferred_resumed(history, results)
    # The session file's history view is rewritten from here on (agentfsm.sessions.resume.load_history
    # reads what follows the last boundary); the run's prompt, already recorded, closes the new view.
    d.trace.compact_boundary("deferred_resume", 0)
    for m in (*messages, first):
        d.trace.message(m)
    return messages, failure

