"""The session workflow: the loop's runtime on Temporal, each phase's I/O an activity.

The loop is :class:`agentfsm.runtime.runner.LoopRunner`, the same one the local driver (:mod:`agentfsm.runtime.driver`)
runs; this workflow supplies how each phase is performed here (an activity,
:mod:`agentfsm.temporal.activities`), the same event records with the same raw facts, and how the
consequences a move declares (:class:`agentfsm.machine.graph.Does`) are carried out. It has no loop of its
own and decides nothing: it asks the same pure questions (:mod:`agentfsm.machine.graph`,
:mod:`agentfsm.runtime.phases`). It is deterministic, as Temporal
requires: ids come from :func:`temporalio.workflow.uuid4` (:func:`agentfsm.machine.state.set_id_source`),
time from :func:`temporalio.workflow.now`.

What it keeps besides the state: the run's account, the stream-json messages a client follows (the
``output`` query; activities signal each finished assistant block as it streams), and the session
file's records, written through a local activity before each remote one and at the end. Tools run
after the response ended, one activity per call, under the executor's scheduling rules
(:func:`agentfsm.runtime.executor.may_start`, :func:`agentfsm.runtime.executor.deliverable`).

Signals: ``interrupt`` (the user's Ctrl-C: a streaming response is cut, ``cancel`` tools are
cancelled, ``block`` tools finish) and ``abort`` (everything stops at once) — the driver's
:meth:`~agentfsm.runtime.driver.Driver.interrupt` and :meth:`~agentfsm.runtime.driver.Driver.abort`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, ChildWorkflowError, WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    import json

    import attrs

    from agentfsm.machine import graph, prompts
    from agentfsm.machine.events import (
        Aborted,
        Assembled,
        CallFailed,
        Event,
        ModelError,
        ModelResponse,
        SetupFailed,
        StopHookVerdict,
        StreamOpened,
        TaskNotified,
    )
    from agentfsm.machine.state import Limits, LoopState, Message, Phase, TerminalReason, ToolUseContext
    from agentfsm.runtime import phases
    from agentfsm.runtime.executor import DELIVERED, DONE, QUEUED, RUNNING, deliverable, may_start
    from agentfsm.runtime.pipeline import USER_INTERRUPTED, WORKER_LOST, CallResult, synthetic_result
    from agentfsm.runtime.result import Passes, RunAccount, RunResult, build_result
    from agentfsm.runtime.runner import LoopRunner, StepObserver
    from agentfsm.runtime.tasks import (
        COMPLETED,
        FAILED,
        KILLED,
        LOCAL_AGENT,
        LOCAL_BASH,
        TaskRecord,
        command_summary,
        finished_messages,
        running_list,
        started_messages,
    )
    from agentfsm.runtime.trace import TraceWriter
    from agentfsm.temporal import NON_RETRYABLE, WORKFLOW_NAME, workflow_id
    from agentfsm.temporal.convert import spec_digest
    from agentfsm.temporal.records import (
        SEND_WHOLE,
        AccountSnapshot,
        AgentStart,
        Carried,
        CompactInput,
        CompactOutcome,
        MessageRef,
        ModelCallInput,
        ModelCallOutcome,
        OpenRunInput,
        OutputPage,
        PostBatchInput,
        PostBatchOutcome,
        RunSetup,
        SessionInput,
        StopInput,
        TaskEnd,
        TaskStart,
        ToolBatchInput,
        ToolBatchOutcome,
        ToolCallInput,
        ToolCallOutcome,
        ToolTraits,
        TraceBatch,
        chain_digest,
        message_digest,
        spec_file,
    )

# a query answers at most this much at once (a client that fell behind asks again)
_PAGE_MESSAGES = 500
_PAGE_CHARS = 1 << 20
# messages a continued run keeps for a client that has not read them yet
_CARRIED_OUTPUT = 200
# The workflow's versions (temporalio's patching: a history recorded before a change replays on the
# code that existed then; docs/temporal.md, "Upgrading workers"). Each id names one change and stays
# as long as histories without it may still be in flight.
# Issue 34: read-only tool calls as local activities; a model call writes the pending session-file
# lines itself (no local activity before it).
FEWER_TASKS = "agentfsm-34-fewer-tasks"
# Issue 34, long sessions: a model call names only the messages new since the previous request (the
# worker that served it keeps the rest), so a turn's payload and history do not grow with the session.
LEAN_REQUESTS = "agentfsm-34-lean-requests"
# Issue 34: the calls of a response that would run one after another anyway (none read-only, each
# concurrency-unsafe and finishing when the user interrupts) run in one activity.
TOOL_BATCHES = "agentfsm-34-tool-batches"
# below this many messages a request names them all (a prefix would save little)
_LEAN_MIN = 16


class _Stopped(Exception):
    """The awaited work was given up because the run is being stopped (``results``: what finished)."""

    def __init__(self, results: Mapping[str, CallResult] | None = None) -> None:
        super().__init__("stopped")
        self.results = dict(results or {})


@attrs.define
class _Call:
    """One tool call of the batch in progress (the executor's entry, as the workflow keeps it)."""

    block: Mapping[str, Any]
    safe: bool
    interrupt: str
    invalid_json: str | None
    local: bool = False  # a read-only call run as a local activity
    queue: str | None = None  # a call acting on a running background task: that task's worker's own queue
    agent: str | None = None  # a call acting on a running background agent (TaskStop): the agent's id
    status: str = QUEUED
    handle: Any = None
    result: CallResult | None = None
    cancel_reason: str | None = None

    @property
    def tool_use_id(self) -> str:
        return str(self.block.get("id", ""))


@workflow.defn(name=WORKFLOW_NAME)
class SessionWorkflow:
    """One run of a session (one prompt to one result); see the module docstring."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        self._inp = inp
        self._spec = inp.spec
        carried = inp.carried
        self._out: list[Mapping[str, Any]] = list(carried.out_tail) if carried else []
        self._out_base = carried.out_base if carried else 0
        self._done = False
        self._final: int | None = None  # the number of the run's own result message, once shown
        self._interrupted = carried.interrupted if carried else False
        self._aborted = carried.aborted if carried else False
        self._shown: dict[int, dict[str, list[Mapping[str, Any]]]] = {}
        self._pending: list[tuple[int, str]] = []
        self._settled: list[str] = []  # tool calls whose outcome files may go
        self._tools_ran = False
        self._recorded: dict[str, str] = dict(carried.recorded) if carried else {}
        self._requests = carried.requests if carried else 0
        self._read_files: dict[str, float] = dict(carried.read_files) if carried else {}
        self._emitted: set[str] = set()
        self._given_up: set[int] = set()  # model requests the run stopped waiting for
        self._trace: TraceWriter | None = None
        self._outcome: ModelCallOutcome | None = None
        self._request_no = -1
        self._request_messages = 0
        self._fewer_tasks = False
        self._lean: bool | None = None  # LEAN_REQUESTS, asked once a request is long enough to gain by it
        self._spec_digest = ""
        # the messages of the last request a worker resolved, and the digest of each of its prefixes
        self._chain: Sequence[Message] = ()
        self._chain_digests: list[str] = []
        # background commands (issue 30): each task's record, the watches of those still running, the
        # ones being stopped, and the notifications not yet taken into the conversation
        self._tasks: dict[str, TaskRecord] = {}
        self._watches: dict[str, tuple[Any, asyncio.Task[None]]] = {}
        self._queues: dict[str, str] = {}  # each task's worker's own queue
        self._ended_watches: list[asyncio.Task[None]] = []  # of tasks recorded ended before their watch said so
        # background agents: each one's child workflow, the calls now acting on one (TaskStop) and the
        # end of one that ended while such a call ran (recorded when the call says it did not stop it),
        # and what the agents spent (added to the run's result, as a local session adds it)
        self._agents: dict[str, Any] = {}
        self._agent_calls: dict[str, int] = {}
        self._agent_ends: dict[str, tuple[str, str, Mapping[str, Any] | None]] = {}
        self._agent_cost = 0.0
        self._stopping_tasks: set[str] = set()
        self._notes: list[Message] = []
        self._sending: tuple[Message, ...] = ()

    # --- what clients and activities talk to ---------------------------------------------------------

    @workflow.signal
    def push(self, item: Mapping[str, Any]) -> None:
        """An activity finished an assistant block: show it now."""
        n = int(item["request_no"])
        if n in self._given_up:  # a cancelled call's last blocks, arriving after the run moved on
            return
        msg = item["message"]
        body = msg["message"]
        self._shown.setdefault(n, {}).setdefault(body["id"], []).extend(body["content"])
        self._show(msg)

    @workflow.signal
    def lost(self, request_no: int) -> None:
        """An attempt of this request died with its worker: withdraw what it showed."""
        if request_no not in self._given_up:
            self._withdraw(request_no)

    def _withdraw(self, request_no: int) -> None:
        for message_id, blocks in self._shown.pop(request_no, {}).items():
            self._emit(phases.tombstone_message(self._spec.session_id, message_id, blocks))

    @workflow.signal
    def interrupt(self) -> None:
        self._interrupted = True

    @workflow.signal
    def abort(self) -> None:
        self._aborted = self._interrupted = True

    @workflow.query
    def output(self, since: int) -> OutputPage:
        start = max(since, self._out_base)
        page: list[Mapping[str, Any]] = []
        size = 0
        for msg in self._out[start - self._out_base:start - self._out_base + _PAGE_MESSAGES]:
            size += len(json.dumps(msg, ensure_ascii=False, default=str))
            if page and size > _PAGE_CHARS:
                break
            page.append(msg)
        done = self._done and start + len(page) >= self._out_base + len(self._out)
        return OutputPage(start, tuple(page), done, self._final)

    def _emit(self, msg: Mapping[str, Any]) -> None:
        self._out.append(msg)

    def _show(self, msg: Mapping[str, Any]) -> None:
        """An assistant block: on stream-json at once, and in the session file as soon as it is
        complete (before its tool runs), as the local session does."""
        self._emit(msg)
        if self._trace is not None:
            body = msg["message"]
            for block in body["content"]:
                self._trace.write({"type": "assistant_block", "message_id": body["id"], "block": block})

    # --- the run -------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SessionInput) -> dict[str, Any]:
        self._fewer_tasks = workflow.patched(FEWER_TASKS)
        first = await self._open(inp) if inp.carried is None else self._restore(inp.carried)
        # a run continued as new shows at its end what its loop added since its first run began
        self._runner = LoopRunner(self, self._state, self._spec.session_id,
                                  began_after=inp.carried.began_after if inp.carried is not None else ...)
        self._state = await self._runner.run(first)
        await self._stop_tasks()
        result = self._result()
        await self._flush(final=True)
        if self._hooked("SessionEnd") and self._spec.agent_type is None:  # (a subagent ends no session)
            try:
                await self._activity("agentfsm.close_run", self._spec, None, timeout=timedelta(minutes=2), local=True)
            except ActivityError as exc:
                workflow.logger.warning("SessionEnd hooks failed: %s", exc)
        self._done = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._spec.agent_type is not None:
            # a background agent's run: the launching session's notification counts its tool uses
            uses = sum(len(m.tool_use_ids()) for m in self._state.messages if m.role == "assistant")
            return {**result, "tool_uses": uses}
        return result

    async def _open(self, inp: SessionInput) -> SetupFailed | None:
        spec = self._spec
        info = workflow.info()
        try:
            setup: RunSetup = await self._activity(
                "agentfsm.open_run", OpenRunInput(spec, inp.prompt, inp.resume_path, inp.resumed, info.workflow_id),
                RunSetup, timeout=timedelta(minutes=5), local=True)
        except ActivityError as exc:
            raise _failure(f"the session could not be set up: {_cause(exc)}") from exc
        self._setup = setup
        self._started = workflow.now().timestamp()
        self._passes = Passes(self._started)
        self._account = RunAccount()
        self._recorded.update(setup.recorded)
        self._trace = self._writer(setup.next_seq)
        if not inp.resumed:
            # a new or forked session: its file starts with the header and the inherited history
            self._trace.session(spec.session_id, spec.limits, spec.cwd, spec.model, spec.parent_session_id,
                                workflow_id=info.workflow_id, run_id=info.run_id)
            for m in setup.history:
                self._trace.message(m)
        self._announce_cut_off(setup.cut_off)
        self._emit(dict(setup.init))
        first = setup.first
        self._trace.message(phases.recorded_prompt(first, setup.erased))
        history, failure = setup.history, setup.setup_failed
        if failure is None and phases.deferred_calls(history):
            history, failure = await self._resume_deferred(history, first)
        messages = history if setup.erased else (*history, first)
        ctx = ToolUseContext(cwd=spec.cwd, permission_mode=setup.permission_mode, tool_names=setup.tool_names)
        self._state = LoopState(messages=tuple(messages), tool_use_context=ctx)
        return failure

    def _writer(self, seq: int) -> TraceWriter:
        sink = self._record if self._spec.trace_path else None
        return TraceWriter(None, sink=sink, seq=seq, clock=lambda: workflow.now().timestamp())

    def _record(self, rec: dict[str, Any]) -> None:
        if rec["type"] == "message":
            self._recorded[rec["uuid"]] = message_digest(rec["role"], rec["kind"], rec["content"])
        self._pending.append((rec["seq"], json.dumps(rec, ensure_ascii=False, default=str)))

    # --- the runner's side: stop, and the consequences a move declares ------------------------------

    @property
    def limits(self) -> Limits:
        return self._spec.limits

    @property
    def account(self) -> RunAccount:
        return self._account

    @property
    def observers(self) -> tuple[StepObserver, ...]:
        assert self._trace is not None
        return (self._trace,)

    async def between(self, state: LoopState) -> None:
        if state.phase is Phase.ASSEMBLE and self._continue_as_new_due():
            await self._continue_as_new(state)

    def stopping(self, *, hard: bool = False) -> bool:
        return self._aborted or (not hard and self._interrupted)

    def abort_event(self, state: LoopState) -> Aborted:
        """What the stop cut: the blocks the response in progress showed (no tool of it ran yet)."""
        o, self._outcome = self._outcome, None
        if state.phase in (Phase.STREAM, Phase.DISPATCH_TOOLS) and o is not None:
            return Aborted(tuple(o.response.blocks if o.response else o.blocks))
        return Aborted()

    def warn(self, notice: str) -> None:
        self._account.warnings.append(notice)
        self._emit(phases.warning_message(self._spec.session_id, notice))

    def take_input(self) -> None:
        """The notifications the move took into the conversation leave the queue."""
        taken, self._sending = self._sending, ()
        if taken:
            gone = {m.uuid for m in taken}
            self._notes = [m for m in self._notes if m.uuid not in gone]

    def compacted(self, event: Event) -> None:
        self._account.anchor(None, 0)
        self._emit(phases.compact_boundary_message(self._spec.session_id, event))

    def show(self, message: Mapping[str, Any]) -> None:
        self._emit(message)

    def keep_finished(self, tool_use_ids: Sequence[str]) -> None:
        return None  # no call finishes while a response streams here: they start after it ended

    def close_calls(self, reason: str) -> None:
        return None  # a response's calls start only after it ended (one activity each, in dispatch)

    def withdraw(self) -> None:
        self._withdraw(self._request_no)

    def show_results(self, blocks: Sequence[Mapping[str, Any]]) -> None:
        self._emit_results(blocks)

    # --- activities ----------------------------------------------------------------------------------

    async def _activity(self, name: str, arg: Any, result_type: Any, *, timeout: timedelta,
                        heartbeat: float | None = None, attempts: int = 3, stop: str | None = None,
                        local: bool = False) -> Any:
        """Run activity ``name``; with ``stop`` (``soft``/``hard``), give up on it when the run is
        stopped: it is cancelled and :class:`_Stopped` raised. ``local``: on this worker, recorded as
        one marker (hooks and set-up: short work that needs no heartbeat of its own)."""
        retry = RetryPolicy(initial_interval=timedelta(seconds=self._inp.timing.retry_s), maximum_attempts=attempts,
                            non_retryable_error_types=[NON_RETRYABLE])
        if local:
            handle = workflow.start_local_activity(name, arg, result_type=result_type, start_to_close_timeout=timeout,
                                                   retry_policy=retry)
        else:
            handle = workflow.start_activity(
                name, arg, result_type=result_type, start_to_close_timeout=timeout, retry_policy=retry,
                heartbeat_timeout=timedelta(seconds=heartbeat) if heartbeat else None)
        if stop is None:
            return await handle
        hard = stop == "hard"
        await workflow.wait_condition(lambda: handle.done() or self.stopping(hard=hard))
        if handle.done():
            return handle.result()
        handle.cancel()
        try:
            await handle
        except (asyncio.CancelledError, ActivityError):
            pass
        raise _Stopped

    async def _flush(self, *, final: bool = False) -> None:
        """Write the pending session-file records (a local activity on this worker), and drop the
        outcome files of tool calls whose results the history now holds."""
        if not self._spec.trace_path or not (self._pending or self._settled or (final and self._tools_ran)):
            self._pending.clear()
            self._settled.clear()
            return
        lines, settled = tuple(self._pending), tuple(self._settled)
        try:
            await workflow.execute_local_activity(
                "agentfsm.append_trace", TraceBatch(self._spec.trace_path, lines, settled, final), result_type=int,
                start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=5))
        except ActivityError as exc:  # kept, and tried again with the next flush
            workflow.logger.warning("the session file could not be written: %s", exc)
            return
        del self._pending[:len(lines)]
        del self._settled[:len(settled)]

    def _hooked(self, event: str) -> bool:
        """Hooks are configured for ``event`` (else asking them is skipped: the answer would be empty)."""
        return event in self._setup.hook_events

    def _refs(self, messages: Sequence[Message]) -> tuple[MessageRef, ...]:
        """The messages of a request: by reference where the session file records them as they are."""
        out = []
        for m in messages:
            digest = self._recorded.get(m.uuid)
            out.append(MessageRef(m.uuid, digest) if digest else MessageRef(m.uuid, message=m))
        return tuple(out)

    def _lean_from(self, messages: int) -> bool:
        """Whether requests are sent lean (LEAN_REQUESTS). Asked (and its marker recorded) only when a
        request first holds :data:`_LEAN_MIN` messages: a short session's history stays as it was."""
        if self._lean is None and messages >= _LEAN_MIN:
            self._lean = workflow.patched(LEAN_REQUESTS)
            if self._lean:
                self._spec_digest = spec_digest(self._spec)
        return bool(self._lean)

    def _prefix(self, outgoing: Sequence[Message]) -> int:
        """How many of the request's first messages are the previous request's (the worker that served
        it keeps them): all of them when the history only grew since, else none."""
        prev = self._chain
        if not self._lean or len(prev) < _LEAN_MIN or len(outgoing) < len(prev):
            return 0
        return len(prev) if all(a is b for a, b in zip(prev, outgoing, strict=False)) else 0

    def _estimate(self, messages: Sequence[Message]) -> int:
        return phases.estimate(self._account, messages, self._setup.static_tokens)

    # --- assemble ------------------------------------------------------------------------------------

    async def assemble(self, state: LoopState) -> Event:
        if not graph.should_auto_compact(state, self._estimate(state.messages), self._spec.limits,
                                         cost_usd=self._account.cost_usd):
            return Assembled()
        try:
            compaction = await self._compact(state, "auto")
        except _Stopped:
            return self.abort_event(state)
        except ActivityError as exc:
            return SetupFailed(TerminalReason.TURN_SETUP_FAILED, f"Turn setup failed: {_cause(exc)}")
        return Assembled(compaction=compaction, compact_failed=compaction is None)

    async def _compact(self, state: LoopState, trigger: str, on_failure: Callable[[str], None] | None = None,
                       api_message: str = "") -> Any:
        await self._flush()
        n = self._requests
        timing = self._inp.timing
        out: CompactOutcome = await self._activity(
            "agentfsm.compact",
            CompactInput(self._spec, n, phases.model_for(self._spec.models, state), self._setup.system,
                         self._refs(state.messages), trigger, api_message),
            CompactOutcome, timeout=timedelta(minutes=15), heartbeat=timing.model_heartbeat_s,
            attempts=timing.model_attempts, stop="soft")
        if out.requested:
            self._requests += 1
        if out.usage:
            self._account.spend(out.model or self._spec.model, out.usage)
        if out.failure and on_failure is not None:
            on_failure(out.failure)
        return out.compaction

    # --- call_model and stream -----------------------------------------------------------------------

    async def call_model(self, state: LoopState) -> Event:
        spec, limits = self._spec, self._spec.limits
        self._outcome = None
        # the notifications of background tasks that ended while the run went on go with the request
        sent = tuple(self._notes)
        outgoing = (*state.messages, *sent) if sent else state.messages
        refused = graph.preflight_refusal(background=None, cost_usd=self._account.cost_usd,
                                          tokens=self._estimate(outgoing), limits=limits, state=state)
        if refused is not None:
            return refused
        model = phases.model_for(spec.models, state)
        assert self._trace is not None
        self._trace.request(model, state.query_tracking.depth, state.messages, sent)
        self._request_messages = len(outgoing)
        lines: tuple[tuple[int, str], ...] = ()
        if self._fewer_tasks and self._spec.trace_path:
            lines = tuple(self._pending)  # the activity writes them before it reads the messages back
        else:
            await self._flush()
        n = self._request_no = self._requests
        self._requests += 1
        info, timing = workflow.info(), self._inp.timing
        refs = self._refs(outgoing)
        lean = self._lean_from(len(outgoing))
        prefix = self._prefix(outgoing)
        named = lean and bool(spec.trace_path)  # the spec by its digest: the set-up wrote it down
        call = ModelCallInput(None if named else spec, info.workflow_id, info.run_id, n, model, self._setup.system,
                              refs[prefix:], self._inp.live, lines, prefix,
                              self._chain_digests[prefix - 1] if prefix else "",
                              self._spec_digest if named else "", spec_file(spec.trace_path or "") if named else "")

        async def request(inp: ModelCallInput) -> ModelCallOutcome:
            return await self._activity(  # type: ignore[no-any-return]
                "agentfsm.call_model", inp, ModelCallOutcome, timeout=timedelta(minutes=15),
                heartbeat=timing.model_heartbeat_s, attempts=timing.model_attempts, stop="soft")

        try:
            try:
                o = await request(call)
            except ActivityError as exc:
                if not (prefix or named) or _error_type(exc) != SEND_WHOLE:
                    raise
                # another worker served the previous request, or the spec's file is gone: sent whole
                prefix = 0
                o = await request(attrs.evolve(call, spec=spec, messages=refs, prefix=0, prefix_digest="",
                                               spec_digest="", spec_file=""))
            del self._pending[:len(lines)]  # written (the outcome is the activity's, after it wrote them)
            if self._lean:
                digests = self._chain_digests[:prefix]
                last = digests[-1] if digests else ""
                for ref in refs[prefix:]:
                    last = chain_digest(last, ref)
                    digests.append(last)
                self._chain, self._chain_digests = outgoing, digests
        except _Stopped:
            self._given_up.add(n)
            return Aborted(tuple(b for shown in self._shown.get(n, {}).values() for b in shown))
        except ActivityError as exc:  # every attempt was lost: nothing of them stands
            self._given_up.add(n)
            self._withdraw(n)
            return await self._failed(state, ModelError("api", f"The model call failed: {_cause(exc)}"))
        self._account.api_ms += o.api_ms
        if not self._inp.live:
            for block in o.response.blocks if o.response else o.blocks:
                self._shown.setdefault(n, {}).setdefault(o.message_id, []).append(block)
                self._show(phases.assistant_block_message(o.message_id, o.model, block, {}, spec.session_id))
        if o.error is not None and not o.opened:
            return await self._failed(state, o.error)
        self._outcome = o
        self._sending = sent
        return StreamOpened(model, sent_input=sent)

    async def consume_stream(self, state: LoopState) -> Event:
        """The stream ran inside the model activity: report how it ended."""
        o = self._outcome
        assert o is not None
        if o.response is not None:
            phases.account_response(self._account, o.response, self._spec.model, self._request_messages)
            return phases.stream_ended(o.response, json_schema=self._spec.json_schema is not None,
                                       cost_usd=self._account.cost_usd)
        assert o.error is not None
        if o.usage:  # the input was processed (and billed) even though the answer is lost
            self._account.spend(o.model or phases.model_for(self._spec.models, state), o.usage)
        # no tool of this response ran (its calls run after it ended): it showed blocks, none finished
        return await self._failed(state, o.error, tuple(o.blocks))

    async def _failed(self, state: LoopState, error: ModelError, shown: tuple[Mapping[str, Any], ...] = ()
                      ) -> CallFailed:
        """The failure's event; a reactive compaction first when the route it would take with one
        compacts (:func:`agentfsm.machine.graph.compaction_wanted`)."""
        event = CallFailed(error, fallback_available=phases.has_fallback(self._spec.models, state), shown=shown)
        if graph.compaction_wanted(state, event, self._spec.limits):
            why: list[str] = []
            try:
                event = attrs.evolve(event, compaction=await self._compact(state, "reactive", why.append,
                                                                                error.message))
            except (_Stopped, ActivityError):
                pass
            event = attrs.evolve(event, compaction_failure=why[0] if why else "")
        self._account.api_error_status, self._account.api_error_endpoint = error.status, error.endpoint
        return event

    # --- dispatch_tools ------------------------------------------------------------------------------

    async def dispatch_tools(self, state: LoopState) -> Event:
        o = self._outcome
        assert o is not None
        # a response an error event cut after complete tool_use blocks runs them (graph.cut_after_tool_use)
        response = o.response if o.response is not None else ModelResponse(tuple(o.blocks), "tool_use", model=o.model)
        assistant = response.as_message()
        traits = {t.tool_use_id: t for t in o.traits}
        try:
            results, interrupted = await self._run_batch(response.tool_uses(), traits, response.invalid_tool_inputs)
        except _Stopped as stopped:  # a hard abort while tools ran: finished calls keep their results
            self._outcome = None
            return Aborted(tuple(response.blocks), tuple(r.block for r in stopped.results.values()))
        self._outcome = None
        ordered = phases.in_model_order(assistant, results)
        phases.account_batch(self._account, ordered)
        post = None
        if not interrupted and not self._hooked("PostToolBatch"):
            post = PostBatchOutcome()
        elif not interrupted:
            try:
                post = await self._activity("agentfsm.post_batch", PostBatchInput(
                    self._spec, tuple(phases.post_batch_input(assistant, ordered))), PostBatchOutcome,
                    timeout=timedelta(minutes=10), local=True)
            except ActivityError as exc:
                workflow.logger.warning("PostToolBatch hooks failed: %s", exc)
                post = PostBatchOutcome()
        layers: dict[str, Any] = {}
        for r in ordered:
            if not traits.get(r.tool_use_id, ToolTraits(r.tool_use_id, False, "block")).safe:
                layers.update(r.context_layers)
        return phases.batch_drained(assistant, ordered, interrupted=interrupted, post=post, context_layers=layers,
                                    budget=(self._spec.limits.max_budget_usd, self._account.cost_usd))

    async def _run_batch(self, blocks: Sequence[Mapping[str, Any]], traits: Mapping[str, ToolTraits],
                         invalid: Mapping[str, str]) -> tuple[list[CallResult], bool]:
        """Every call of a response, one activity each, under the executor's rules: a call starts when
        nothing runs or it and everything running are concurrency-safe (at most
        ``max_tool_concurrency``); an unsafe call is a barrier; results are shown in model order, past
        running safe calls. The user's interrupt cancels ``cancel`` calls (``block`` calls finish); a
        hard abort cancels everything and raises :class:`_Stopped` with what finished."""
        calls = []
        for b in blocks:
            t = traits.get(str(b.get("id", "")))
            # a call acting on a running background task (TaskStop) runs on the worker that runs it; one
            # acting on a background agent runs as a remote activity (it signals the agent's workflow)
            target = t.task if t is not None and t.task in self._watches else None
            queue = self._queues.get(target) if target is not None else None
            agent = target if target is not None and self._tasks[target].task_type == LOCAL_AGENT else None
            calls.append(_Call(b, t.safe if t else False, t.interrupt if t else "block", invalid.get(b.get("id")),
                               local=self._fewer_tasks and t is not None and t.read_only and target is None,
                               queue=queue, agent=agent))
            if agent is not None:
                self._agent_calls[agent] = self._agent_calls.get(agent, 0) + 1
        if (len(calls) > 1 and self._fewer_tasks
                and all(not c.local and not c.safe and c.interrupt == "block" for c in calls)
                and workflow.patched(TOOL_BATCHES)):
            return await self._run_in_order(calls)
        layers: dict[str, Any] = {}
        limit = self._spec.limits.max_tool_concurrency
        interrupted = self.stopping()
        timing = self._inp.timing

        def finish(c: _Call, result: CallResult) -> None:
            c.result, c.status = result, DONE
            if not c.safe:
                layers.update(result.context_layers)
            if c.agent is not None:
                self._agent_call_done(c.agent)

        def pump() -> None:
            for c in calls:
                if c.status != QUEUED:
                    continue
                if interrupted and c.interrupt == "cancel":
                    c.cancel_reason = USER_INTERRUPTED
                    finish(c, synthetic_result(c.tool_use_id, str(c.block.get("name", "")), USER_INTERRUPTED,
                                               c.block.get("input") if isinstance(c.block.get("input"), Mapping)
                                               else None))
                    continue
                if may_start(c.safe, [x.safe for x in calls if x.status == RUNNING], limit):
                    c.status = RUNNING
                    if c.local:
                        # only reads: run again (not called interrupted) if its worker is lost
                        c.handle = workflow.start_local_activity(
                            "agentfsm.run_tool", ToolCallInput(self._spec, c.block, c.invalid_json, dict(layers),
                                                               dict(self._read_files)),
                            result_type=ToolCallOutcome, start_to_close_timeout=timedelta(minutes=15),
                            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=timing.retry_s),
                                                     maximum_attempts=2, non_retryable_error_types=[NON_RETRYABLE]),
                            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
                        continue
                    self._tools_ran = True
                    # on a task's worker's queue: when that worker is gone, no one takes the call
                    where: dict[str, Any] = {} if c.queue is None else dict(
                        task_queue=c.queue, schedule_to_start_timeout=timedelta(
                            seconds=max(5.0, timing.tool_heartbeat_s * 3)))
                    agents = {} if c.agent is None else {c.agent: self._tasks[c.agent].description}
                    c.handle = workflow.start_activity(
                        "agentfsm.run_tool", ToolCallInput(self._spec, c.block, c.invalid_json, dict(layers),
                                                           dict(self._read_files), agents),
                        result_type=ToolCallOutcome, start_to_close_timeout=timedelta(minutes=15),
                        heartbeat_timeout=timedelta(seconds=timing.tool_heartbeat_s), **where,
                        # attempt 2 exists to answer "interrupted" (or to run a read-only call again)
                        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=timing.retry_s),
                                                 maximum_attempts=2, non_retryable_error_types=[NON_RETRYABLE]),
                        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
                elif not c.safe:
                    break

        def collect(c: _Call) -> None:
            name = str(c.block.get("name", ""))
            try:
                out: ToolCallOutcome = c.handle.result()
            except asyncio.CancelledError:
                finish(c, synthetic_result(c.tool_use_id, name, c.cancel_reason or USER_INTERRUPTED))
                return
            except ActivityError as exc:  # no attempt could report: what the call did is unknown
                if c.cancel_reason is not None and isinstance(exc.cause, CancelledError):
                    finish(c, synthetic_result(c.tool_use_id, name, c.cancel_reason))
                    return
                workflow.logger.warning("tool call %s failed on every attempt: %s", c.tool_use_id, exc)
                finish(c, synthetic_result(c.tool_use_id, name, WORKER_LOST))
                return
            self._read_files.update(out.read_files)
            if not c.local:  # a local call leaves no outcome file
                self._settled.append(c.tool_use_id)
            assert self._trace is not None
            for rec in out.sandbox:
                # how the call's commands ran, as a local session records them (agentfsm audit)
                self._trace.write(rec)
            self._call_tasks(out)
            result = out.result
            if c.cancel_reason is not None and result.cancel_reason is not None:
                result = synthetic_result(c.tool_use_id, result.tool_name, c.cancel_reason, result.tool_input)
            finish(c, result)

        def cancel(c: _Call, reason: str) -> None:
            c.cancel_reason = reason
            c.handle.cancel()

        while True:
            pump()
            for i in deliverable([(c.status, c.safe) for c in calls]):
                calls[i].status = DELIVERED
                done = calls[i].result
                assert done is not None
                self._emit_results((done.block,), done.structured)
            if all(c.status == DELIVERED for c in calls):
                return [c.result for c in calls if c.result is not None], interrupted
            await workflow.wait_condition(
                lambda seen=interrupted: any(c.status == RUNNING and c.handle.done() for c in calls)
                or self.stopping(hard=True) or self.stopping() != seen)
            for c in calls:
                if c.status == RUNNING and c.handle.done():
                    collect(c)
            if self.stopping(hard=True):
                running = [c for c in calls if c.status == RUNNING]
                for c in running:
                    cancel(c, USER_INTERRUPTED)
                if running:
                    await workflow.wait_condition(lambda running=running: all(c.handle.done() for c in running))
                    for c in running:
                        collect(c)
                raise _Stopped({c.tool_use_id: c.result for c in calls if c.result is not None})
            if self.stopping() and not interrupted:
                interrupted = True
                for c in calls:
                    if c.status == RUNNING and c.interrupt == "cancel":
                        cancel(c, USER_INTERRUPTED)

    async def _run_in_order(self, calls: Sequence[_Call]) -> tuple[list[CallResult], bool]:
        """Calls that run one after another, in one activity (``agentfsm.run_tools``): the same results
        as one activity each — a user's interrupt lets them all finish; a hard abort cuts the running
        one (interrupted) and starts no other, raising :class:`_Stopped` with what finished; a call
        whose worker was lost is answered interrupted and the calls after it still run."""
        timing = self._inp.timing
        self._tools_ran = True
        handle = workflow.start_activity(
            "agentfsm.run_tools", ToolBatchInput(self._spec, tuple(c.block for c in calls),
                                                 tuple(c.invalid_json for c in calls), {}, dict(self._read_files)),
            result_type=ToolBatchOutcome, start_to_close_timeout=timedelta(minutes=15) * len(calls),
            heartbeat_timeout=timedelta(seconds=timing.tool_heartbeat_s),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=timing.retry_s), maximum_attempts=2,
                                     non_retryable_error_types=[NON_RETRYABLE]),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
        await workflow.wait_condition(lambda: handle.done() or self.stopping(hard=True))
        cancelled = not handle.done()
        if cancelled:
            handle.cancel()
            await workflow.wait_condition(handle.done)
        results: list[CallResult] = []
        try:
            out: ToolBatchOutcome = handle.result()
        except (asyncio.CancelledError, ActivityError) as exc:  # nothing reported: what ran is unknown
            if cancelled:
                out = ToolBatchOutcome((), stopped=True)
            else:
                workflow.logger.warning("tool batch failed on every attempt: %s", exc)
                out = ToolBatchOutcome(())
        assert self._trace is not None
        for c, o in zip(calls, out.outcomes, strict=False):
            self._read_files.update(o.read_files)
            self._settled.append(c.tool_use_id)
            for rec in o.sandbox:
                self._trace.write(rec)
            self._call_tasks(o)
            result = o.result
            if cancelled and result.cancel_reason is not None:
                result = synthetic_result(c.tool_use_id, result.tool_name, USER_INTERRUPTED, result.tool_input)
            results.append(result)
        if cancelled or out.stopped:
            raise _Stopped({r.tool_use_id: r for r in results})
        for c in calls[len(results):]:  # no attempt could report them: what they did is unknown
            results.append(synthetic_result(c.tool_use_id, str(c.block.get("name", "")), WORKER_LOST))
        for r in results:
            self._emit_results((r.block,), r.structured)
        return results, self.stopping()

    def _emit_results(self, results: Message | Sequence[Mapping[str, Any]] | None, structured: Any = None) -> None:
        """Each result's stream-json message, once (``structured``: what an SDK user receives as the one
        call's ``tool_use_result``, as the local driver shows it)."""
        blocks = results.content if isinstance(results, Message) else results or ()
        for block in blocks:
            tid = block.get("tool_use_id", "")
            if tid in self._emitted:
                continue
            self._emitted.add(tid)
            self._emit(phases.result_message(block, self._spec.session_id, structured))

    async def _resume_deferred(self, history: tuple[Message, ...], first: Message
                               ) -> tuple[tuple[Message, ...], SetupFailed | None]:
        """A run resumed after ``tool_deferred`` first runs the deferred calls (their PreToolUse hooks
        are asked again), as the local driver does."""
        try:
            results, _ = await self._run_batch(phases.deferred_calls(history), {}, {})
        except _Stopped:
            return history, SetupFailed(TerminalReason.TURN_SETUP_FAILED, "Stopped while resuming a deferred call")
        messages, failure = phases.deferred_resumed(history, results)
        assert self._trace is not None
        self._trace.compact_boundary("deferred_resume", 0)
        for m in (*messages, first):
            self._trace.message(m)
        return messages, failure

    # --- stop ----------------------------------------------------------------------------------------

    async def task_notifications(self, state: LoopState) -> TaskNotified | None:
        """Wait, after the run ended, while background tasks it started still run; the notifications
        queued by then start the next pass (they leave the queue with the move: its ``take_input``).
        None when nothing runs or the run is being stopped."""
        if self._watches and not self.stopping():
            # the pass that ended has its result, as a local run's (agentfsm.runtime.result.Passes): shown
            # now, or held to the run's end while a background agent runs
            ended = self._passes.ended(self._result_so_far(state), workflow.now().timestamp(),
                                       held=any(t.running and t.task_type == LOCAL_AGENT for t in self._tasks.values()))
            if ended is not None:
                self._emit(ended.to_dict())
        await workflow.wait_condition(lambda: bool(self._notes) or not self._watches or self.stopping())
        if self.stopping() or not self._notes:
            self._passes.no_next()
            return None
        self._passes.next(usage=self._account.usage, now=workflow.now().timestamp())
        self._sending = tuple(self._notes)
        return TaskNotified(self._sending)

    # --- background tasks ----------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(workflow.now().timestamp() * 1000)

    def _call_tasks(self, out: ToolCallOutcome) -> None:
        """The background tasks a call started, and those it stopped (TaskStop): stopped by the model,
        each is recorded ``killed`` and the client told ``stopped`` (its description as the summary),
        the model not notified (the call's result tells it), as a local session's registry does. Its
        watch's report, which follows, is then left unsaid."""
        for start in out.tasks:
            self._task_started(start)
        for agent in out.agents:
            self._agent_started(agent)
        for task_id in out.stopped:
            rec = self._tasks.get(task_id)
            if rec is None or not rec.running:
                continue  # it ended meanwhile: that end stands
            watch = self._watches.get(task_id)
            if watch is not None:
                self._ended_watches.append(watch[1])
            self._task_finished(task_id, KILLED, None, rec.description, notify=False, client_status="stopped")

    def _task_started(self, start: TaskStart) -> None:
        """A tool call started a background command on its worker: record it, tell the client, and watch
        it with an activity on that worker's own queue (heartbeats: a lost worker is noticed)."""
        rec = TaskRecord(start.task_id, LOCAL_BASH, start.tool_use_id, start.description, start.output_file,
                         command=start.command, started_ms=self._now_ms())
        self._tasks[rec.task_id] = rec
        assert self._trace is not None
        self._trace.write(rec.to_record())
        for msg in started_messages(rec, running_list(self._tasks.values())):
            self._emit({**msg, "session_id": self._spec.session_id})
        heartbeat = self._inp.timing.tool_heartbeat_s
        handle = workflow.start_activity(
            "agentfsm.watch_task", start, result_type=TaskEnd, task_queue=start.task_queue,
            start_to_close_timeout=timedelta(milliseconds=start.timeout_ms) + timedelta(minutes=1),
            # the worker that runs the command is the only one that may watch it: when it is gone, no
            # one takes the watch, and the task is reported cut off (as a lost tool call is)
            schedule_to_start_timeout=timedelta(seconds=max(5.0, heartbeat * 3)),
            heartbeat_timeout=timedelta(seconds=heartbeat), retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
        self._queues[rec.task_id] = start.task_queue
        self._watches[rec.task_id] = (handle, asyncio.create_task(self._watch(start, handle)))

    def _announce_cut_off(self, cut: Sequence[TaskRecord]) -> None:
        """The tasks a resumed session's last run left running were cut off with it: each is recorded
        ``killed``, the client told (``stopped``, before the run's ``init``) and the model notified
        with the run's first request, as a local session's resume reports them
        (agentfsm.runtime.tasks.TaskRegistry.restore and announce_cut_off)."""
        assert self._trace is not None
        for rec in cut:
            ended = attrs.evolve(rec, status=KILLED, ended_ms=self._now_ms(), summary=prompts.task_cut_off_summary(rec))
            self._tasks[rec.task_id] = ended
            self._trace.write(ended.to_record())
        for rec in sorted(cut, key=lambda r: r.task_type == LOCAL_BASH):  # agents first, as Claude Code
            ended = self._tasks[rec.task_id]
            agent = rec.task_type != LOCAL_BASH
            self._emit({"type": "system", "subtype": "task_notification", "task_id": rec.task_id,
                        "tool_use_id": rec.tool_use_id, "status": "stopped", "output_file": rec.output_file,
                        "summary": ended.summary, "session_id": self._spec.session_id})
            text = prompts.task_notification(
                task_id=rec.task_id, tool_use_id=None if agent else rec.tool_use_id,
                output_file=rec.output_file if agent else None, status="stopped", summary=ended.summary,
                note=prompts.TASK_CUT_OFF_NOTE_AGENT if agent else prompts.TASK_CUT_OFF_NOTE_COMMAND)
            self._notes.append(Message("user", ({"type": "text", "text": text},), kind="task_notification"))

    def _agent_started(self, start: AgentStart) -> None:
        """An Agent call launched a background agent: record its task, tell the client (with the
        agent's type and prompt), and run its session as a child workflow (the same workflow: its loop
        is the same LoopRunner). A lost worker does not cut it off: its workflow goes on on another
        worker, each of its tool calls answered as any call of a lost worker is."""
        rec = TaskRecord(start.task_id, LOCAL_AGENT, start.tool_use_id, start.description, start.output_file,
                         started_ms=self._now_ms())
        self._tasks[rec.task_id] = rec
        assert self._trace is not None
        self._trace.write(rec.to_record())
        extra = {"subagent_type": start.subagent_type, "prompt": start.prompt}
        for msg in started_messages(rec, running_list(self._tasks.values()), extra):
            self._emit({**msg, "session_id": self._spec.session_id})
        self._watches[rec.task_id] = (None, asyncio.create_task(self._run_agent(start)))

    async def _run_agent(self, start: AgentStart) -> None:
        """The agent's run, to its end: what its result says is reported as a local session's
        registry reports an agent's end (agentfsm.runtime.tasks.TaskRegistry.agent_finished)."""
        task_id = start.task_id
        status, text, usage = FAILED, "", None
        try:
            handle = await workflow.start_child_workflow(
                WORKFLOW_NAME, SessionInput(start.spec, start.blocks, live=False, timing=self._inp.timing),
                id=workflow_id(task_id), result_type=dict, task_queue=workflow.info().task_queue)
            self._agents[task_id] = handle
            result: Mapping[str, Any] = await handle
            self._agent_cost += float(result.get("total_cost_usd") or 0.0)
            status = FAILED if result.get("is_error") else COMPLETED
            text = str(result.get("result") or "; ".join(map(str, result.get("errors") or ())))
            tokens = sum(v for k, v in (result.get("usage") or {}).items()
                         if k.endswith("tokens") and isinstance(v, int))
            # the usage element of the notification of a finished agent (Claude Code's)
            usage = {"subagent_tokens": tokens, "tool_uses": int(result.get("tool_uses") or 0),
                     "duration_ms": int(result.get("duration_ms") or 0)}
        except (ChildWorkflowError, WorkflowAlreadyStartedError, asyncio.CancelledError) as exc:
            # an agent that could not start or crashed is still reported
            workflow.logger.warning("background agent %s failed: %s", task_id, exc)
            text = _cause(exc)
        if not self._tasks[task_id].running:
            return
        if task_id in self._stopping_tasks:  # stopped: the run ended (no one is left to tell)
            self._task_finished(task_id, KILLED, None, prompts.BACKGROUND_SESSION_ENDED, notify=False)
        elif self._agent_calls.get(task_id):  # a TaskStop call acts on it: its outcome says what ended it
            self._agent_ends[task_id] = (status, text, usage)
        else:
            self._agent_finished(task_id, status, text, usage)

    def _agent_finished(self, task_id: str, status: str, text: str, usage: Mapping[str, Any] | None) -> None:
        rec = self._tasks[task_id]
        summary = f'Agent "{rec.description}" {"finished" if status == COMPLETED else status}'
        self._task_finished(task_id, status, None, summary, notify=True, result=text, usage=usage,
                            client_summary=text)

    def _agent_call_done(self, task_id: str) -> None:
        """A call acting on a background agent ended (its outcome, if any, was taken): an end of the
        agent that arrived meanwhile and that the call did not cause is reported now."""
        left = self._agent_calls.get(task_id, 1) - 1
        if left > 0:
            self._agent_calls[task_id] = left
            return
        self._agent_calls.pop(task_id, None)
        end = self._agent_ends.pop(task_id, None)
        if end is not None and self._tasks[task_id].running:
            self._agent_finished(task_id, *end)

    async def _watch(self, start: TaskStart, handle: Any) -> None:
        """How the task ended, as the local session's registry reports it (agentfsm.runtime.tasks)."""
        rec = self._tasks[start.task_id]
        try:
            end: TaskEnd = await handle
        except (asyncio.CancelledError, ActivityError) as exc:
            if not self._tasks[start.task_id].running:  # recorded ended already (the model stopped it)
                return
            if start.task_id in self._stopping_tasks:  # stopped: the run ended (no one is left to tell)
                self._task_finished(start.task_id, KILLED, None, prompts.BACKGROUND_SESSION_ENDED, notify=False)
                return
            # the worker running it was lost, and the command with it: what is left of its process
            # group is killed (same host), and the model is told the task was cut off
            workflow.logger.warning("background task %s lost with its worker: %s", start.task_id, exc)
            try:
                await self._activity("agentfsm.reap_task", start, list[int], timeout=timedelta(seconds=30),
                                     attempts=2)
            except ActivityError:
                pass
            self._task_finished(start.task_id, KILLED, None, prompts.task_lost_summary(rec), notify=True)
            return
        if not self._tasks[start.task_id].running:  # recorded ended already (the model stopped it)
            return
        if end.stopped:  # the model's TaskStop, whose outcome the workflow has not seen yet
            self._task_finished(start.task_id, KILLED, None, rec.description, notify=False, client_status="stopped")
            return
        summary = (prompts.background_timeout_summary(rec.description) if end.timed_out
                   else command_summary(rec.description, end.status, end.exit_code))
        self._task_finished(start.task_id, end.status, end.exit_code, summary, notify=True)

    def _task_finished(self, task_id: str, status: str, exit_code: int | None, summary: str, *,
                       notify: bool, client_status: str | None = None, result: str | None = None,
                       usage: Mapping[str, Any] | None = None, client_summary: str | None = None) -> None:
        rec = attrs.evolve(self._tasks[task_id], status=status, exit_code=exit_code, ended_ms=self._now_ms(),
                           summary=summary, notified=notify)
        self._tasks[task_id] = rec
        self._watches.pop(task_id, None)
        assert self._trace is not None
        self._trace.write(rec.to_record())
        for msg in finished_messages(rec, running_list(self._tasks.values()), status=client_status or status,
                                     summary=client_summary or summary):
            self._emit({**msg, "session_id": self._spec.session_id})
        if notify:
            text = prompts.task_notification(task_id=task_id, tool_use_id=rec.tool_use_id,
                                             output_file=rec.output_file, status=status, summary=summary,
                                             result=result, usage=usage)
            self._notes.append(Message("user", ({"type": "text", "text": text},), kind="task_notification"))

    async def _stop_tasks(self) -> None:
        """The run ended: every background task still running is stopped (its watch is cancelled, which
        kills its command) and recorded ``killed``; nothing a run started outlives it."""
        watches = list(self._watches.items())
        for task_id, (handle, watcher) in watches:
            self._stopping_tasks.add(task_id)
            if handle is not None:
                handle.cancel()
            else:  # a background agent: its session is aborted (it ends its run and writes its file)
                await workflow.wait_condition(lambda t=task_id, w=watcher: t in self._agents or w.done())
                child = self._agents.get(task_id)
                if child is not None and not watcher.done():
                    try:
                        await child.signal("abort")
                    except Exception as exc:  # it ended meanwhile
                        workflow.logger.info("background agent %s not aborted: %s", task_id, exc)
        ended = self._ended_watches
        if watches or ended:
            await workflow.wait_condition(lambda: all(w.done() for _, (_, w) in watches)
                                          and all(w.done() for w in ended))
        for task_id, _ in watches:
            # (an agent that ended while a TaskStop call the stop left unstarted was to say what ended it)
            if self._tasks[task_id].running:
                self._task_finished(task_id, KILLED, None, prompts.BACKGROUND_SESSION_ENDED, notify=False)

    async def stop_hooks(self, state: LoopState) -> StopHookVerdict:
        """Stop hooks are due after a completed end of turn; a stop while they run lets the end stand."""
        if not self._hooked("Stop" if self._spec.agent_type is None else "SubagentStop"):
            return StopHookVerdict()
        try:
            return await self._activity(  # type: ignore[no-any-return]
                "agentfsm.stop_hooks", StopInput(self._spec, phases.last_assistant_text(state.messages),
                                                 state.stop_hook_active,
                                                 tuple(running_list(self._tasks.values()))),
                StopHookVerdict, timeout=timedelta(minutes=10), stop="soft", local=True)
        except (_Stopped, ActivityError):
            return StopHookVerdict()

    # --- the end, and continuing as new --------------------------------------------------------------

    def _result_so_far(self, state: LoopState) -> RunResult:
        acct = self._account
        return build_result(state, session_id=self._spec.session_id, duration_ms=0,
                            duration_api_ms=int(acct.api_ms), cost=acct.cost_usd + self._agent_cost,
                            usage=acct.usage, denials=tuple(acct.denials), structured_output=acct.structured_output,
                            warnings=tuple(acct.warnings), account=acct)

    def _result(self) -> dict[str, Any]:
        # the last pass's result (its own turns, time and usage); results of earlier passes held back while
        # a background agent ran come first, as in a local run
        result = self._passes.of(self._result_so_far(self._state), workflow.now().timestamp())
        for held in self._passes.held:
            self._emit(held.to_dict())
        self._passes.held.clear()
        record = result.to_dict()
        assert self._trace is not None
        self._trace.result(record)
        self._emit(record)
        self._final = self._out_base + len(self._out) - 1  # the client stops following at this one
        return record

    def _continue_as_new_due(self) -> bool:
        info = workflow.info()
        if self._watches or self._notes:  # a task's watch cannot be carried into a new run
            return False
        after = self._inp.continue_as_new_after
        return bool(after and info.get_current_history_length() >= after) or info.is_continue_as_new_suggested()

    async def _continue_as_new(self, state: LoopState) -> None:
        """Carry the loop into a fresh run (a long session's history stays within Temporal's limits)."""
        await self._flush()
        await workflow.wait_condition(workflow.all_handlers_finished)
        acct = self._account
        tail = self._out[-_CARRIED_OUTPUT:]
        assert self._trace is not None
        carried = Carried(
            state=state, setup=self._setup,
            account=AccountSnapshot(acct.usage, acct.cost_usd, acct.api_ms, tuple(acct.denials), tuple(acct.warnings),
                                    acct.structured_output, acct.last_usage, acct.counted_upto,
                                    {m: dict(u) for m, u in acct.model_usage.items()}, acct.stop_reason,
                                    acct.api_error_status, acct.api_error_endpoint),
            seq=self._trace.next_seq, recorded=self._recorded, requests=self._requests,
            out_base=self._out_base + len(self._out) - len(tail), out_tail=tuple(tail), started=self._started,
            read_files=self._read_files, interrupted=self._interrupted, aborted=self._aborted,
            began_after=self._runner.began_after, pass_index=self._passes.index,
            pass_started=self._passes.started, pass_usage_before=dict(self._passes.usage_before))
        workflow.continue_as_new(attrs.evolve(self._inp, carried=carried))

    def _restore(self, carried: Carried) -> None:
        """A run continued as new: the loop state and everything around it, as the last run left them."""
        self._setup = carried.setup
        self._state = carried.state
        self._started = carried.started
        self._passes = Passes(carried.pass_started if carried.pass_started is not None else carried.started,
                              index=carried.pass_index, usage_before=dict(carried.pass_usage_before))
        a = carried.account
        self._account = RunAccount(dict(a.usage), a.cost_usd, a.api_ms, list(a.denials), list(a.warnings),
                                   a.structured_output, a.last_usage, a.counted_upto,
                                   {m: dict(u) for m, u in a.model_usage.items()}, a.stop_reason, a.api_error_status,
                                   a.api_error_endpoint)
        self._trace = self._writer(carried.seq)
        return None


def _cause(exc: BaseException) -> str:
    """The innermost message of an activity failure."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__


def _error_type(exc: ActivityError) -> str | None:
    """The application error type an activity failed with (None when it failed otherwise)."""
    from temporalio.exceptions import ApplicationError

    cause = exc.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def _failure(message: str) -> Exception:
    from temporalio.exceptions import ApplicationError

    return ApplicationError(message, type=NON_RETRYABLE, non_retryable=True)
