"""The async driver: performs what the machine decides, and nothing else.

Each iteration performs the work of the current phase (:data:`Driver.PERFORM`: assemble the context,
call the model, consume the stream, run the tool batch, run Stop hooks when they are due), turns what
happened into an event record and fires it on the loop's machine (:class:`agentfsm.graph.LoopMachine`).
Where the loop goes, and every guard, cap and "is it due" question, is answered by
:mod:`agentfsm.graph`; the driver asks its pure functions before doing I/O and acts on the steps the
machine returns. Observers (the session file, the structured log, the testing kit) see every step.

Faults, phase by phase (the graph picks the edge; the driver gathers the facts):

* assemble — a deferred tool call of a resumed run is run again (``tool_deferred_unavailable`` when
  its tool is gone); auto-compaction when :func:`agentfsm.graph.should_auto_compact` says so; any
  exception while preparing the turn is ``turn_setup_failed``.
* call_model — :func:`agentfsm.graph.preflight_refusal` (a host's ``should_stop_before_next_call``,
  the budget, the blocking limit); then the request, carrying any queued user input. Transient HTTP
  failures are retried inside the transport; what still fails arrives as a classified
  :class:`ModelError`. Prompt-too-long is answered by one reactive compaction when the graph allows it.
* stream — a stream that breaks part-way is either requested again as a whole (its executor is
  aborted, its blocks tombstoned, nothing of it kept) or, when no retry is left, ends the loop with
  every tool_use it showed paired with a result. A protocol violation is ``model_error``.

Stopping: :meth:`Driver.interrupt` is the user's interrupt (Ctrl-C, the SDK's ``interrupt``): a
response that is streaming is cut, running tools whose ``interrupt_behavior()`` is ``cancel`` are
cancelled and ``block`` tools finish, then the loop ends ``aborted_tools``/``aborted_streaming``.
:meth:`Driver.abort` is the hard stop: everything running is cancelled at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from agentfsm import graph, log, phases
from agentfsm.assembler import ResponseAssembler, StreamProtocolError
from agentfsm.compact import compact
from agentfsm.events import (
    Aborted,
    Assembled,
    CallFailed,
    Event,
    ModelError,
    ModelResponse,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
)
from agentfsm.executor import StreamingToolExecutor
from agentfsm.model import MessageStart, ModelCallError, ModelClient, ModelRequest, RetryNotice, StreamEvent
from agentfsm.options import Options
from agentfsm.pipeline import STREAMING_FALLBACK, CallResult, ToolTable
from agentfsm.ports import LoopHooks, ToolGate, ToolLookup
from agentfsm.queue import InputQueue, QueueItem
from agentfsm.request import WireCache
from agentfsm.result import RunAccount, RunResult, build_result, shows_api_error
from agentfsm.state import LoopState, Message, Phase, TerminalReason, ToolUseContext
from agentfsm.tools.base import FileAccess, ToolContext
from agentfsm.trace import TraceWriter

Emit = Callable[[dict[str, Any]], None]
# Asked before every model request with the loop state; a truthy answer ends the foreground loop
# with `background_requested` (a string answer is the reason).
StopBeforeCall = Callable[[LoopState], Any]
T = TypeVar("T")
STREAM_FAILED = phases.STREAM_FAILED
DEFERRED_RESULTS = graph.DEFERRED_RESULTS


class StepObserver(Protocol):
    """Told of every move of the loop, after it happened: the state before, the step (edge, route,
    state after) and the event that caused it (the same event for a move a phase made on its own)."""

    def on_step(self, before: LoopState, step: graph.Step, event: Event) -> None: ...


class _Stopped(Exception):
    """The awaited work was given up because the run is being stopped."""


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


async def _unstreamed(client: Any, request: ModelRequest) -> AsyncIterator[StreamEvent]:
    """The events of one request made without streaming (``client.create``), in stream form."""
    for event in await client.create(request):
        yield event


def _tool_use_ids(messages: Sequence[Message]) -> set[str]:
    return {b["id"] for m in messages if m.role == "assistant" for b in m.content
            if b.get("type") == "tool_use" and isinstance(b.get("id"), str)}


class Driver:
    """Runs one loop (one prompt to one result) of a session; see the module docstring."""

    def __init__(self, *, options: Options, client: ModelClient, registry: ToolLookup, session_id: str,
                 system: tuple[Mapping[str, Any], ...], gate: ToolGate, hooks: LoopHooks,
                 trace: TraceWriter | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, services: Mapping[str, Any] | None = None,
                 should_stop_before_next_call: StopBeforeCall | None = None,
                 observers: Sequence[StepObserver] = (),
                 file_access: Callable[[], FileAccess] | None = None) -> None:
        self.options = options
        self.limits = options.limits
        self.client = client
        # a --json-schema that is not a JSON Schema cannot be offered as a tool: the run's setup fails
        self.registry, self._setup_error = phases.structured_output_setup(registry, options.json_schema)
        # one table for the run's executors (one per response): each tool's validators compiled once a run
        self._tools = ToolTable.of(self.registry)
        self.session_id = session_id
        self.system = system
        self.gate = gate
        self.hooks = hooks
        self.trace = trace or TraceWriter(None)
        self.emit: Emit = emit or (lambda _m: None)
        self.queue = queue if queue is not None else InputQueue()
        self.services = dict(services or {})
        # the permission settings' file-access policy, one per call; without it file tools deny every path
        self.file_access = file_access
        self.should_stop_before_next_call: StopBeforeCall | None = (
            should_stop_before_next_call or options.should_stop_before_next_call)
        # Tools see the abort signal (ToolContext.abort) and may set it too; one watcher per run turns
        # both signals into futures every wait below can include without creating a task of its own.
        self.abort_event = asyncio.Event()
        self.interrupt_event = asyncio.Event()
        self._stop_fut: asyncio.Future[None] | None = None  # resolved on an interrupt or an abort
        self._abort_fut: asyncio.Future[None] | None = None  # resolved on an abort
        self._watcher: asyncio.Task[None] | None = None
        self.read_files: dict[str, float] = {}
        self.log = log.get_logger("agentfsm", session_id=session_id)
        self.observers: tuple[StepObserver, ...] = (self.trace, _LogSteps(self.log), *observers)
        self.account = RunAccount()
        # what the phase in progress holds between its perform and the machine's step
        self._request_messages = 0
        self._pending_input: tuple[QueueItem, ...] = ()
        self._stream: Any = None
        self._first: StreamEvent | None = None
        self._executor: StreamingToolExecutor | None = None
        self._asm: ResponseAssembler | None = None
        self._emitted_results: set[str] = set()
        self._t_request = 0.0
        self._ttft_ms = 0.0
        self._wire = WireCache()  # the wire view, built incrementally request by request
        self._static: int | None = None  # tokens of the system prompt and tool schemas
        # executors given up on (abort, stream retry): their cancelled calls are awaited at the end
        self._discarded: list[StreamingToolExecutor] = []

    PERFORM: Mapping[Phase, str] = {
        Phase.ASSEMBLE: "_assemble",
        Phase.CALL_MODEL: "_call_model",
        Phase.STREAM: "_consume_stream",
        Phase.DISPATCH_TOOLS: "_dispatch",
        Phase.STOP: "_stop_hooks",
    }

    # --- public --------------------------------------------------------------------------------

    def abort(self) -> None:
        """Hard stop: everything running is cancelled at once. Finished tools keep their effects."""
        self.abort_event.set()
        self.interrupt_event.set()
        self._signal()

    def interrupt(self) -> None:
        """The user's interrupt: the response is cut, ``cancel`` tools are cancelled and ``block``
        tools finish, then the loop ends. Nothing is rolled back."""
        self.interrupt_event.set()
        self._signal()
        executor = self._executor
        if executor is not None and not executor.aborted:
            executor.interrupt()

    def _signal(self) -> None:
        """Resolve the stop futures for the signals that are set."""
        for fut, on in ((self._stop_fut, self._stopping()), (self._abort_fut, self._stopping(hard=True))):
            if on and fut is not None and not fut.done():
                fut.set_result(None)

    def _arm(self) -> None:
        """The run's stop futures, and the one watcher that resolves them when a tool (or anyone
        holding the event) sets the abort signal directly."""
        loop = asyncio.get_running_loop()
        self._stop_fut, self._abort_fut = loop.create_future(), loop.create_future()
        self._signal()

        async def watch() -> None:
            await self.abort_event.wait()
            self.interrupt_event.set()
            self._signal()

        self._watcher = loop.create_task(watch(), name=f"abort-watch:{self.session_id}")

    async def _disarm(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.wait({watcher})

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
            self._before_hooks("UserPromptSubmit")
            first, setup_failure, erased = phases.prompt_verdict(first, await self.hooks.user_prompt_submit(text))
        # the prompt record marks where this run starts in the file (before anything the run
        # writes); an erased one is recorded as such, and resume leaves it out of the history
        self.trace.message(phases.recorded_prompt(first, erased))
        if setup_failure is None:
            history, setup_failure = await self._resume_deferred(tuple(history), first)
        messages: tuple[Message, ...] = tuple(history) if erased else (*history, first)
        self._arm()
        with graph.LoopMachine(LoopState(messages=messages, tool_use_context=ctx)) as machine:
            try:
                if setup_failure is not None:
                    self._fire(machine, setup_failure)
                await self._loop(machine)
            except asyncio.CancelledError:
                if machine.phase is not Phase.STOP:
                    self._fire(machine, self._abort_event_for(machine.state))
                raise
            finally:
                await self._close_stream()
                await self._close_executors()
                await self._disarm()
            state = machine.state
        if state.terminal_reason is TerminalReason.API_ERROR and shows_api_error(self.account.api_error_status):
            # Claude Code shows the refusal as a synthetic assistant message before the result
            self.emit(phases.api_error_message(self.account.api_error_status or 0, state.terminal_detail,
                                               self.session_id))
        if len(state.messages) > len(messages) and state.messages[-1].kind == "interrupt_marker":
            # the marker that closes an interrupted run is shown in the stream too (Claude Code)
            self.emit(phases.marker_message(state.messages[-1], self.session_id))
        acct = self.account
        result = build_result(state, session_id=self.session_id,
                              duration_ms=int((time.monotonic() - started) * 1000),
                              duration_api_ms=int(acct.api_ms), cost=acct.cost_usd, usage=acct.usage,
                              denials=tuple(acct.denials), structured_output=acct.structured_output,
                              warnings=tuple(acct.warnings), account=acct)
        self.trace.result(result.to_dict())
        self.log.info("loop.terminal", terminal_reason=result.terminal_reason.value,
                      subtype=result.subtype, is_error=result.is_error, turns=result.num_turns,
                      cost_usd=round(acct.cost_usd, 6))
        return result, state

    # --- the loop ------------------------------------------------------------------------------

    async def _loop(self, machine: graph.LoopMachine) -> None:
        while True:
            state = machine.state
            if state.phase is Phase.STOP and not graph.stop_hooks_are_due(state):
                return
            if state.phase is not Phase.STOP and self._stopping():
                event: Event = self._abort_event_for(state)
            else:
                event = await getattr(self, self.PERFORM[state.phase])(state)
            self._fire(machine, event)

    def _fire(self, machine: graph.LoopMachine, event: Event) -> None:
        before = machine.state
        for step in machine.fire(event, self.limits):
            for observer in self.observers:
                observer.on_step(before, step, event)
            self._after_step(before, step, event)
            before = step.state

    def _after_step(self, before: LoopState, step: graph.Step, event: Event) -> None:
        """What a step asks of the world: warnings reported, input taken, what a retry withdrew."""
        for notice in step.notices:
            self.account.warnings.append(notice)
            self.emit(phases.warning_message(self.session_id, notice))
        if step.trigger == "open_stream" and self._pending_input:
            self.queue.take_items(self._pending_input)
        if phases.rewrote_history(before, step):
            self.account.anchor(None, 0)
            self.emit(phases.compact_boundary_message(self.session_id, event))
        feedback = phases.stop_feedback_message(self.session_id, step, event)
        if feedback is not None:
            self.emit(feedback)
        if step.edge.kind == "retry" and before.phase is Phase.STREAM:
            # what this response showed is withdrawn; a retry from call_model showed nothing
            self._tombstone()
        if isinstance(event, StreamEnded) and step.trigger != "dispatch" and self._executor is not None:
            # not dispatching: discard whatever the executor started for this response
            self._executor.abort("discarded")
            self._discarded.append(self._executor)
            self._executor = None

    def _before_hooks(self, event: str) -> None:
        """A hook may read the session file (its ``transcript_path``): what the loop wrote is flushed
        before the hook starts (a command hook is started before this task next waits). Skipped only
        when the hooks say none is configured for the event; hooks that cannot say get the flush."""
        has_hooks = getattr(self.hooks, "has_hooks", None)
        if has_hooks is None or has_hooks(event):
            self.trace.flush()

    def _stopping(self, *, hard: bool = False) -> bool:
        """The run is being stopped: aborted (anything may set the abort signal, tools included), or,
        unless ``hard``, interrupted by the user."""
        return self.abort_event.is_set() or (not hard and self.interrupt_event.is_set())

    async def _until_stopped(self, work: Awaitable[T], *, hard: bool = False, stop_wins: bool = True) -> T:
        """Await ``work`` unless the run is stopped first (aborted, or, unless ``hard``, interrupted):
        then cancel it, let it unwind, and raise :class:`_Stopped`. With ``stop_wins`` a stop also
        wins over work that ended at the same moment (a fast stream must not run on to its end past a
        cancellation); without it, work that is done counts (a response that has started is taken)."""
        stop = self._abort_fut if hard else self._stop_fut
        assert stop is not None, "the driver waits only while a run is armed"
        current = asyncio.current_task()
        if stop.done() or current is None or not asyncio.iscoroutine(work):
            return await self._until_stopped_in_task(work, stop, stop_wins)
        # The work is awaited in this task, directly: no task per wait (three a model turn, each a
        # task, its scheduling and its wake-up). A stop cuts it by cancelling this task from a
        # callback on the stop's future; the CancelledError unwinds the work where it waits, and the
        # cancellation is taken back (uncancel) once it did, so only a cancel from outside this
        # driver goes on as one.
        cut = False
        waiting = True

        def on_stop(_fut: asyncio.Future[None]) -> None:
            nonlocal cut
            if waiting:  # a callback already scheduled when the wait ended must not cut what follows
                cut = True
                current.cancel()

        stop.add_done_callback(on_stop)
        try:
            result = await work
        except asyncio.CancelledError:
            if not cut:
                raise  # this wait itself was cancelled (the work with it)
            # from here on the task's own count says whether anyone else cancelled it too
            self._take_back(current)
            raise _Stopped from None
        except Exception:
            if cut:
                self._take_back(current)
                raise _Stopped from None  # a failure racing the stop is moot
            if stop_wins and stop.done():
                raise _Stopped from None
            raise
        finally:
            waiting = False
            stop.remove_done_callback(on_stop)
        if cut:
            self._take_back(current)  # the work swallowed the cancellation and finished
        if cut or (stop_wins and stop.done()):
            raise _Stopped  # the stop came first, or with the work's end and wins
        return result

    @staticmethod
    def _take_back(current: asyncio.Task[Any]) -> None:
        """Undo the cancellation a stop made of ``current``; a cancellation from outside (the task's
        count still above zero) goes on as one."""
        if current.uncancel() > 0:
            raise asyncio.CancelledError

    async def _until_stopped_in_task(self, work: Awaitable[T], stop: asyncio.Future[None], stop_wins: bool) -> T:
        """:meth:`_until_stopped` for work that is not a coroutine (or a stop already made): the work
        in a task of its own, cancelled from a callback on the stop's future."""
        task = asyncio.ensure_future(work)
        if stop.done():
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: moot
            raise _Stopped
        cut = False

        def on_stop(_fut: asyncio.Future[None]) -> None:
            nonlocal cut
            if not task.done():
                cut = True
                task.cancel()

        stop.add_done_callback(on_stop)
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not cut or (current is not None and current.cancelling()):
                raise  # this wait itself was cancelled (the work with it)
            raise _Stopped from None
        except Exception:
            if cut or (stop_wins and stop.done()):
                raise _Stopped from None  # a failure racing the stop is moot
            raise
        finally:
            stop.remove_done_callback(on_stop)
        if cut or (stop_wins and stop.done()):
            raise _Stopped  # the stop came first, or with the work's end and wins
        return result

    def _abort_event_for(self, state: LoopState) -> Aborted:
        """Pair every tool_use that was shown before the stop."""
        partial = results = None
        if state.phase in (Phase.STREAM, Phase.DISPATCH_TOOLS) and self._asm is not None:
            blocks = tuple(self._asm.blocks)
            got: dict[str, Mapping[str, Any]] = {}
            executor = self._executor
            if executor is not None and any(b.get("type") == "tool_use" for b in blocks):
                got = {r.tool_use_id: r.block for r in executor.abort("user_interrupted")}
                self._discarded.append(executor)
            partial, results = phases.pair_cut_off(blocks, got)
            for b in results.content if results is not None else ():
                self._emit_result(b)
        self._executor = None
        return Aborted(partial, results)

    # --- assemble ------------------------------------------------------------------------------

    async def _assemble(self, state: LoopState) -> Event:
        try:
            if not graph.should_auto_compact(state, self._estimate(state.messages), self.limits):
                return Assembled()  # nothing to await: no task, no race
            return await self._until_stopped(self._prepare_turn(state))
        except _Stopped:
            return self._abort_event_for(state)
        except Exception as exc:
            # Whatever breaks while preparing the turn (a hook object, a client failing outside its
            # error contract during compaction, a bug) ends the run cleanly instead of crashing it.
            self.log.error("turn.setup_failed", error=repr(exc), exc_info=True)
            return SetupFailed(TerminalReason.TURN_SETUP_FAILED, f"Turn setup failed: {type(exc).__name__}: {exc}")

    async def _prepare_turn(self, state: LoopState) -> Assembled:
        tokens = self._estimate(state.messages)
        if not graph.should_auto_compact(state, tokens, self.limits):
            return Assembled()
        self._before_hooks("PreCompact")
        await self.hooks.pre_compact("auto", None)
        self.log.info("compact.start", trigger="auto", tokens=tokens, threshold=self.limits.auto_compact_threshold)
        compaction = await compact(self.client, model=self._model(state), system=self.system,
                                   messages=state.messages, trigger="auto", metadata=self._metadata(),
                                   on_usage=self.account.spend)
        self.log.info("compact.end", trigger="auto", ok=compaction is not None)
        return Assembled(compaction=compaction, compact_failed=compaction is None)

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

    async def _call_model(self, state: LoopState) -> Event:
        # the previous response is history now: an abort or a retry must never pair or withdraw it
        self._asm = None
        pending = self.queue.pending
        sent = tuple(item.as_attachment() for item in pending)
        # the history itself when nothing is queued (no copy of the message tuple per request)
        outgoing = (*state.messages, *sent) if sent else state.messages
        background = self.should_stop_before_next_call(state) if self.should_stop_before_next_call else None
        refused = graph.preflight_refusal(background=background, cost_usd=self.account.cost_usd,
                                          tokens=self._estimate(outgoing), limits=self.limits)
        if refused is not None:
            self.log.info("model.refused", reason=refused.reason.value, detail=refused.detail)
            return refused
        model = self._model(state)
        request = phases.build_request(outgoing, model=model, system=self.system, tools=self.registry.api_schemas(),
                                       limits=self.limits, metadata=self._metadata(), wire=self._wire.wire(outgoing),
                                       task_budget=self.options.task_budget)
        wire = request.messages
        self.trace.request(model, state.query_tracking.depth, state.messages, sent)
        self.log.info("model.request", model=model, messages=len(wire),
                      chain_id=state.query_tracking.chain_id, depth=state.query_tracking.depth)
        self._request_messages = len(outgoing)
        self._pending_input = pending
        if self.options.include_partial_messages:
            self.emit(phases.requesting_message(self.session_id))
        self._t_request = time.monotonic()
        # after a stream that broke or came garbled before any content, the same request unstreamed
        self._stream = (_unstreamed(self.client, request) if state.non_streaming and self._can_unstream()
                        else self.client.stream(request))
        # a slow answer or the SDK's retry backoff must not hold an interrupt until the response starts
        try:
            self._first = await self._until_stopped(self._first_event(), stop_wins=False)
        except _Stopped:
            self._api_ms_since_request()
            await self._close_stream()
            return self._abort_event_for(state)
        except (StopAsyncIteration, ModelCallError) as exc:
            self._api_ms_since_request()
            return await self._failed(state, phases.open_error(exc))
        except Exception as exc:
            # outside the transport's error contract: a client bug, not a retryable fault
            self._api_ms_since_request()
            self.log.error("model.client_failed", error=repr(exc), exc_info=True)
            return await self._failed(state, phases.open_error(exc))
        self._ttft_ms = round((time.monotonic() - self._t_request) * 1000, 1)
        self.log.info("model.first_event", model=model, ms=self._ttft_ms)
        return StreamOpened(model, sent_input=sent)

    async def _first_event(self) -> StreamEvent:
        """The stream's first event; the transport's retries before it are reported as they happen."""
        while isinstance(event := await anext(self._stream), RetryNotice):
            self.log.warning("model.retry", attempt=event.attempt, max_retries=event.max_retries,
                             delay_ms=event.delay_ms, status=event.status, error=event.error)
            self.emit({"type": "system", "subtype": "api_retry", "attempt": event.attempt,
                       "max_retries": event.max_retries, "retry_delay_ms": event.delay_ms,
                       "error_status": event.status, "error": event.error, "session_id": self.session_id})
        return event

    def _api_ms_since_request(self) -> None:
        self.account.api_ms += (time.monotonic() - self._t_request) * 1000

    def _has_fallback(self, state: LoopState) -> bool:
        return phases.has_fallback(self.options.models, state)

    def _can_unstream(self) -> bool:
        """The client can make a request without streaming (``create``)."""
        return callable(getattr(self.client, "create", None))

    async def _failed(self, state: LoopState, error: ModelError, partial: Message | None = None,
                      partial_results: Message | None = None) -> CallFailed:
        await self._close_stream()
        compaction = None
        if phases.wants_reactive_compact(state, error):
            # held back from the user: only a failed compaction lets the error through
            self._before_hooks("PreCompact")
            await self.hooks.pre_compact("auto", None)
            self.log.info("compact.start", trigger="reactive", error=error.message)
            compaction = await compact(self.client, model=self._model(state), system=self.system,
                                       messages=state.messages, trigger="reactive",
                                       metadata=self._metadata(), on_usage=self.account.spend)
            self.log.info("compact.end", trigger="reactive", ok=compaction is not None)
        self.log.warning("model.error", kind=error.kind, status=error.status, message=error.message,
                         retryable=error.retryable)
        self.account.api_error_status = error.status
        return CallFailed(error, compaction=compaction, fallback_available=self._has_fallback(state),
                          partial=partial, partial_results=partial_results,
                          non_streaming_available=self._can_unstream())

    # --- stream --------------------------------------------------------------------------------

    async def _consume_stream(self, state: LoopState) -> Event:
        # a tool_use id already in the conversation (or twice in this response) is renamed before the
        # block reaches the executor or the session file: the API refuses duplicate ids
        asm = self._asm = ResponseAssembler(taken_ids=_tool_use_ids(state.messages))
        executor = self._executor = self._new_executor()
        self._emitted_results = set()
        it, first = self._stream, self._first
        self._first = None
        try:
            try:
                # one task reads the whole stream, raced once against a stop; tool results that
                # become ready meanwhile are shown by the executor's on_ready, not by polling
                await self._until_stopped(self._read_stream(it, first, asm, executor))
            except _Stopped:
                return await self._stopped_mid_stream(state)
        except (ModelCallError, StreamProtocolError) as exc:
            self._api_ms_since_request()
            return await self._stream_failed(state, phases.stream_error(exc, has_content=asm.has_content),
                                             asm, executor)
        except Exception as exc:
            self._api_ms_since_request()
            self.log.error("model.stream_failed_unexpectedly", error=repr(exc), exc_info=True)
            return await self._stream_failed(state, phases.stream_error(exc), asm, executor)
        finally:
            await self._close_stream()
        self._api_ms_since_request()
        response = asm.finish()
        self._account(response)
        self.log.info("model.stream_end", stop_reason=response.stop_reason, blocks=len(response.blocks),
                      tool_uses=len(response.tool_uses()))
        if asm.renamed_ids:
            self.log.warning("model.duplicate_tool_use_ids", renamed=asm.renamed_ids)
        return phases.stream_ended(response, json_schema=self.options.json_schema is not None)

    async def _stopped_mid_stream(self, state: LoopState) -> Aborted:
        """The stream was cut by a stop. On the user's interrupt, ``block`` tools the response already
        started finish first (their real results pair their calls); a hard abort cancels them."""
        await self._close_stream()
        executor = self._executor
        if executor is not None and not self._stopping(hard=True) and executor.has_pending():
            executor.interrupt()
            try:
                await self._until_stopped(executor.remaining(), hard=True)
            except _Stopped:
                pass
            self._emit_ready(executor)
        return self._abort_event_for(state)

    async def _stream_failed(self, state: LoopState, error: ModelError, asm: ResponseAssembler,
                             executor: StreamingToolExecutor) -> CallFailed:
        """The stream broke. Either the graph will request the response again (then nothing of this
        one is kept: its running tools are aborted with the streaming-fallback result and the next
        stream gets a new executor), or the loop ends and every tool_use this response showed is
        paired with its result — the real one if the tool finished, a synthetic one otherwise."""
        await self._close_stream()
        if asm.usage:
            # the input was processed (and billed) even though the answer is lost
            self.account.spend(asm.model or self._model(state), asm.usage)
        retry = graph.retry_trigger(state, error, self._has_fallback(state), self.limits, self._can_unstream())
        aborted = {r.tool_use_id: r for r in executor.abort(STREAMING_FALLBACK if retry else STREAM_FAILED)}
        self._discarded.append(executor)
        self._executor = None
        self.log.warning("model.stream_broken", kind=error.kind, retry=retry, blocks=len(asm.blocks),
                         tools_aborted=len(aborted))
        partial = results = None
        if retry is None:
            partial, results = phases.pair_cut_off(tuple(asm.blocks), {i: r.block for i, r in aborted.items()})
            for b in results.content if results is not None else ():
                self._emit_result(b)
        return await self._failed(state, error, partial, results)

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
            self.emit(phases.assistant_block_message(asm.message_id, asm.model, block, asm.usage, self.session_id))
            if block.get("type") == "tool_use":
                executor.add_tool(block, invalid_json=asm.invalid_tool_inputs.get(block["id"]))
                self._emit_ready(executor)
        if self.options.include_partial_messages:
            # after the block it finishes, as Claude Code prints them
            first = isinstance(ev, MessageStart)
            self.emit(phases.stream_event_message(ev, session_id=self.session_id, message_id=asm.message_id,
                                                  ttft_ms=int(self._ttft_ms) if first else None))

    def _account(self, response: ModelResponse) -> None:
        phases.account_response(self.account, response, self.options.model, self._request_messages)

    # --- dispatch_tools ------------------------------------------------------------------------

    async def _dispatch(self, state: LoopState) -> Event:
        executor, asm = self._executor, self._asm
        assert executor is not None and asm is not None
        try:
            results, interrupted = await self._drain(executor)
        except _Stopped:  # hard abort while tools ran
            return self._abort_event_for(state)
        self._executor = None
        assistant = asm.finish().as_message()
        ordered = phases.in_model_order(assistant, results)
        phases.account_batch(self.account, ordered)
        post = None
        if not interrupted:
            self._before_hooks("PostToolBatch")
            post = await self.hooks.post_tool_batch(phases.post_batch_input(assistant, ordered))
        return phases.batch_drained(assistant, ordered, interrupted=interrupted, post=post,
                                    context_layers=executor.context_layers())

    async def _drain(self, executor: StreamingToolExecutor) -> tuple[list[CallResult], bool]:
        """Every result of the batch (each is shown as soon as it may be, by the executor's
        on_ready); and whether the user interrupted meanwhile (then ``cancel`` tools were cancelled,
        ``block`` tools finished). A hard abort raises :class:`_Stopped`."""
        if self._stopping(hard=True):
            raise _Stopped
        interrupted = self._stopping()
        if interrupted:
            executor.interrupt()
        # executor.remaining() only waits on the batch (cancelling the wait cancels no call) and can
        # be awaited again: a stop cuts the waiting, the calls go on or are cancelled by the executor
        try:
            results = await self._until_stopped(executor.remaining(), hard=interrupted)
        except _Stopped:
            if self._stopping(hard=True):
                raise
            # the user's interrupt: cancel tools stop, block tools go on; wait for them unless aborted
            interrupted = True
            executor.interrupt()
            results = await self._until_stopped(executor.remaining(), hard=True)
        for r in results:
            self._emit_result(r.block)
        # an interrupt raised by the batch's last call itself (a permission callback's deny with
        # interrupt) still interrupts the batch
        return results, interrupted or self._stopping()

    def _emit_ready(self, executor: StreamingToolExecutor) -> None:
        for r in executor.drain_ready():
            self._emit_result(r.block)

    def _emit_result(self, block: Mapping[str, Any]) -> None:
        tid = block.get("tool_use_id", "")
        if tid in self._emitted_results:
            return
        self._emitted_results.add(tid)
        self.emit(phases.result_message(block, self.session_id))

    def _new_executor(self) -> StreamingToolExecutor:
        def make_ctx(tool_use_id: str) -> ToolContext:
            return ToolContext(cwd=self.options.cwd, session_id=self.session_id, tool_use_id=tool_use_id,
                               abort=self.abort_event, read_files=self.read_files, services=self.services,
                               file_access=self.file_access() if self.file_access is not None else None)

        executor = StreamingToolExecutor(lookup=self._tools, gate=self.gate, ctx_factory=make_ctx,
                                         max_concurrency=self.limits.max_tool_concurrency)
        # a bound method, not a closure over the executor: no executor -> callback -> executor cycle
        executor.on_ready = self._emit_ready
        return executor

    # --- stop ----------------------------------------------------------------------------------

    async def _stop_hooks(self, state: LoopState) -> StopHookVerdict:
        """Stop hooks are due after a completed end of turn: they may block (re-enter) or prevent the
        end. A stop while they run lets the end stand."""
        self._before_hooks("Stop")
        try:
            outcome = await self._until_stopped(self.hooks.stop(phases.last_assistant_text(state.messages),
                                                                state.stop_hook_active))
        except _Stopped:
            return StopHookVerdict()
        return phases.stop_verdict(outcome)

    # --- a resumed deferral --------------------------------------------------------------------

    async def _resume_deferred(self, history: tuple[Message, ...], first: Message
                               ) -> tuple[tuple[Message, ...], SetupFailed | None]:
        """A run resumed after ``tool_deferred`` first runs the deferred call (its PreToolUse hooks
        are asked again) and puts the real result where the deferral's stood. A call whose tool this
        session no longer offers cannot be resumed: ``tool_deferred_unavailable``. Deferred again:
        the run ends ``tool_deferred`` once more, before any request."""
        calls = phases.deferred_calls(history)
        if not calls:
            return history, None
        unavailable = phases.deferred_unavailable(calls, self.registry)
        if unavailable is not None:
            self.log.warning("tool.deferred_unavailable",
                             tools=[b["name"] for b in calls if self.registry.get(b["name"]) is None])
            return history, unavailable
        executor = self._new_executor()
        for block in calls:
            executor.add_tool(block)
        results = await executor.remaining()
        self.log.info("tool.deferred_resumed", tools=[b["name"] for b in calls])
        for r in results:
            self._emit_result(r.block)
        messages, failure = phases.deferred_resumed(history, results)
        # The session file's history view is rewritten from here on (agentfsm.resume.load_history
        # reads what follows the last boundary); the run's prompt, already recorded, closes the new view.
        self.trace.compact_boundary("deferred_resume", 0)
        for m in (*messages, first):
            self.trace.message(m)
        return messages, failure

    # --- clean-up ------------------------------------------------------------------------------

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
            self.emit(phases.tombstone_message(self.session_id, asm.message_id, asm.blocks))
        self._asm = None

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            try:
                await stream.aclose()
            except (RuntimeError, ModelCallError):  # closing a generator mid-iteration
                self.log.debug("model.stream_close_failed")

