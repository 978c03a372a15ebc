"""The streaming tool executor (docs/behaviour.md §4).

One executor per model response. The driver calls :meth:`StreamingToolExecutor.add_tool` at each
``tool_use`` block's ``content_block_stop`` — while the model is still streaming — and the call
starts at once when the rules allow:

* a call may start when nothing runs, or when it and everything running are concurrency-safe;
* a queued concurrency-unsafe call is a barrier: nothing after it starts before it finished;
* at most ``max_concurrency`` calls run at once;
* ``is_concurrency_safe(input)`` raising counts as unsafe; so do an unknown tool and an input that
  does not parse or validate (those finish instantly with their error result, in order).

Results are paired with their ``tool_use`` by id, never by completion order. :meth:`drain_ready`
hands out finished results scanning in model order: it passes a still-running safe call (later
finished safe results are delivered early) and stops at an unfinished unsafe one. After the stream
ended, :meth:`remaining` / :meth:`results` wait for the rest.

Context layers returned by concurrency-unsafe calls are merged into the shared context (seen by the
calls that start afterwards and returned by :meth:`context_layers` for the next turn); layers of
concurrency-safe calls are dropped — running beside siblings implies not changing what they see.

Interrupts: :attr:`interruptible` is true only while every running call's ``interrupt_behavior()``
is ``cancel``. :meth:`interrupt` cancels ``cancel`` calls (synthetic ``user_interrupted`` results)
and lets ``block`` calls finish. :meth:`abort` (stream fallback, stream retry, hard cancel) ends
everything at once and the executor is discarded.

**Neither interrupt nor abort undoes anything.** A call that already wrote a file, ran a command or
changed a remote system keeps that effect; the synthetic result only fixes the conversation's
record (every ``tool_use`` paired), it is not a rollback.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.runtime.pipeline import (
    USER_INTERRUPTED,
    CallResult,
    PreparedInput,
    ToolTable,
    run_tool_call,
    synthetic_result,
)
from agentfsm.runtime.ports import ToolGate
from agentfsm.tools.base import FileAccess, InterruptBehavior, Tool, ToolContext

log = fsm_log.get_logger("agentfsm.executor")

QUEUED, RUNNING, DONE, DELIVERED = "queued", "running", "done", "delivered"


@attrs.define(eq=False)
class _Entry:
    index: int
    block: Mapping[str, Any]
    tool_use_id: str
    tool_name: str
    invalid_json: str | None
    safe: bool
    interrupt: InterruptBehavior
    status: str = QUEUED
    # steps 3-4 as done by the safety check, handed to the pipeline so it does not redo them
    prepared: tuple[Tool, PreparedInput] | None = None
    task: asyncio.Task[CallResult] | None = None
    result: CallResult | None = None
    # set when the executor cancels the call; decides the synthetic text
    cancel_reason: str | None = None
    # the call's checks are behind it (run_tool_call's on_checked): its tool runs, or a hook
    checked: bool = False


class StreamingToolExecutor:
    """Runs the tool calls of one model response under the concurrency rules (module docstring).

    ``lookup``: the tool registry (anything :class:`agentfsm.runtime.pipeline.ToolTable` accepts). ``ctx_factory``
    builds the :class:`ToolContext` of one call from its id; the executor then sets the context's
    ``tool_use_id``, ``layers`` (a read-only view of the shared context) and ``on_progress`` (chained
    with the factory's own callback). ``on_progress(tool_use_id, data)`` receives every progress event.
    Must be used from inside a running event loop.
    """

    def __init__(self, lookup: Any, *, gate: ToolGate,
                 ctx_factory: Callable[[str], ToolContext] | None = None, max_concurrency: int = 10,
                 layers: Mapping[str, Any] | None = None,
                 on_progress: Callable[[str, Any], None] | None = None,
                 on_ready: Callable[[StreamingToolExecutor], None] | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.table = ToolTable.of(lookup)
        self.gate: ToolGate = gate
        self.max_concurrency = max_concurrency
        self._ctx_factory = ctx_factory
        self._on_progress = on_progress
        self._layers: dict[str, Any] = dict(layers or {})
        self._entries: list[_Entry] = []
        self._by_id: dict[str, _Entry] = {}
        self._in_progress: set[str] = set()
        self._tasks: set[asyncio.Task[CallResult]] = set()
        self._interrupted = False
        self._discarded: str | None = None  # the abort reason once aborted
        self._abort_event = asyncio.Event()
        # set while drain_ready() has something to hand out; on_ready is told at once (so a result can
        # be shown the moment it may be, without anyone polling for it)
        self.ready = asyncio.Event()
        self.on_ready = on_ready
        self._telling = False
        # set whenever a call finishes (results()/remaining() wake on it)
        self._changed = asyncio.Event()
        # set whenever a call finishes or its local checks are behind it (checks_done() wakes on it)
        self._progressed = asyncio.Event()

    # --- intake ----------------------------------------------------------------------------------

    def add_tool(self, block: Mapping[str, Any], *, invalid_json: str | None = None) -> None:
        """Queue one complete ``tool_use`` block and start it now if the rules allow.
        ``invalid_json``: the raw input text when the streamed JSON did not parse."""
        tool_use_id = str(block.get("id", ""))
        if tool_use_id in self._by_id:
            raise ValueError(f"tool_use {tool_use_id!r} was already added to this executor")
        name = str(block.get("name", ""))
        tool, safe, prepared, interrupt = call_traits(self.table, block, invalid_json)
        entry = _Entry(len(self._entries), block, tool_use_id, tool.name if tool else name, invalid_json,
                       safe, interrupt,
                       prepared=(tool, prepared) if tool is not None and prepared is not None else None)
        self._entries.append(entry)
        self._by_id[tool_use_id] = entry
        log.debug("tool.queued", tool_use_id=tool_use_id, tool_name=entry.tool_name, index=entry.index,
                  concurrency_safe=entry.safe, interrupt=entry.interrupt)
        if self._discarded is not None:
            # a late block after abort still needs its pairing result
            self._finish(entry, synthetic_result(tool_use_id, entry.tool_name, self._discarded,
                                                 _input_of(block)))
            return
        self._pump()

    # --- scheduling --------------------------------------------------------------------------------

    def _running(self) -> list[_Entry]:
        return [e for e in self._entries if e.status == RUNNING]

    def _can_start(self, entry: _Entry) -> bool:
        return may_start(entry.safe, [e.safe for e in self._running()], self.max_concurrency)

    def _pump(self) -> None:
        """Start whatever may start, scanning in model order; an unsafe call that cannot start yet
        ends the scan (the barrier)."""
        if self._discarded is not None:
            return
        for entry in self._entries:
            if entry.status != QUEUED:
                continue
            if self._interrupted and entry.interrupt == "cancel":
                entry.cancel_reason = USER_INTERRUPTED
                self._finish(entry, synthetic_result(entry.tool_use_id, entry.tool_name, USER_INTERRUPTED,
                                                     _input_of(entry.block)))
                continue
            if self._can_start(entry):
                self._start(entry)
            elif not entry.safe:
                break

    def _start(self, entry: _Entry) -> None:
        entry.status = RUNNING
        coro = run_tool_call(entry.block, lookup=self.table, gate=self.gate, ctx_factory=self._make_ctx,
                             invalid_json=entry.invalid_json, abort=self._abort_event,
                             in_progress=self._in_progress, prepared=entry.prepared,
                             on_checked=functools.partial(self._checked, entry))
        name = f"tool:{entry.tool_name}:{entry.tool_use_id}"
        task = asyncio.get_running_loop().create_task(coro, name=name)
        entry.task = task
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._on_task_done, entry))
        log.debug("tool.scheduled", tool_use_id=entry.tool_use_id, tool_name=entry.tool_name,
                  running=len(self._running()))

    def _checked(self, entry: _Entry) -> None:
        entry.checked = True
        self._progressed.set()

    def _make_ctx(self, tool_use_id: str) -> ToolContext:
        ctx = (self._ctx_factory(tool_use_id) if self._ctx_factory is not None
               else ToolContext(cwd=Path.cwd(), tool_use_id=tool_use_id))
        ctx.tool_use_id = tool_use_id
        # a snapshot: what earlier unsafe calls left, unaffected by calls finishing later
        ctx.layers = MappingProxyType(dict(self._layers))
        own = ctx.on_progress

        def progress(tid: str, data: Any) -> None:
            if own is not None:
                own(tid, data)
            self._progress(tid, data)

        ctx.on_progress = progress
        return ctx

    def _progress(self, tool_use_id: str, data: Any) -> None:
        if self._discarded is not None:
            return
        log.debug("tool.progress", tool_use_id=tool_use_id)
        if self._on_progress is not None:
            try:
                self._on_progress(tool_use_id, data)
            except Exception as exc:  # a display callback must not fail the tool
                log.warning("tool.progress_callback_failed", tool_use_id=tool_use_id, error=repr(exc))

    def _on_task_done(self, entry: _Entry, task: asyncio.Task[CallResult]) -> None:
        self._tasks.discard(task)
        if entry.status in (DONE, DELIVERED):  # abort() already answered for it
            return
        if task.cancelled():
            result = synthetic_result(entry.tool_use_id, entry.tool_name,
                                      entry.cancel_reason or USER_INTERRUPTED, _input_of(entry.block))
        elif (exc := task.exception()) is not None:  # run_tool_call does not raise; belt and braces
            log.error("tool.executor_error", tool_use_id=entry.tool_use_id, error=repr(exc))
            block = {"type": "tool_result", "tool_use_id": entry.tool_use_id, "is_error": True,
                     "content": f"Error: {type(exc).__name__}: {exc}"}
            result = CallResult(entry.tool_use_id, entry.tool_name, block, is_error=True)
        else:
            result = task.result()
            if result.cancel_reason is not None and entry.cancel_reason is not None:
                # the pipeline saw our cancellation; the executor's reason picks the text. A call that
                # finished despite the cancel keeps its real result: it did run.
                result = synthetic_result(entry.tool_use_id, entry.tool_name, entry.cancel_reason,
                                          result.tool_input or _input_of(entry.block))
        self._finish(entry, result)
        self._pump()

    def _finish(self, entry: _Entry, result: CallResult) -> None:
        entry.result = result
        entry.status = DONE
        if not entry.safe and result.context_layers:
            self._layers.update(result.context_layers)
        self._changed.set()
        self._progressed.set()
        self._update_ready()

    # --- delivery --------------------------------------------------------------------------------

    def _deliverable(self) -> list[_Entry]:
        entries = self._entries
        return [entries[i] for i in deliverable([(e.status, e.safe) for e in entries])]

    def _update_ready(self) -> None:
        if self._deliverable():
            self.ready.set()
            if self.on_ready is not None and not self._telling:
                self._telling = True  # on_ready usually drains, which comes back here
                try:
                    self.on_ready(self)
                finally:
                    self._telling = False
        else:
            self.ready.clear()

    def drain_ready(self) -> list[CallResult]:
        """Finished results not handed out yet, in model order, past running safe calls and up to the
        first unfinished unsafe one. Never waits."""
        out = []
        for entry in self._deliverable():
            entry.status = DELIVERED
            assert entry.result is not None
            out.append(entry.result)
        self._update_ready()
        return out

    async def wait_ready(self) -> None:
        """Return as soon as :meth:`drain_ready` has something (race it against the stream)."""
        await self.ready.wait()

    def has_pending(self) -> bool:
        """Some added call's result has not been handed out by :meth:`drain_ready` yet."""
        return any(e.status != DELIVERED for e in self._entries)

    def all_done(self) -> bool:
        return all(e.status in (DONE, DELIVERED) for e in self._entries)

    async def checks_done(self) -> None:
        """Wait until every call that started is past its checks (lookup, schema, input validation, the
        permission decision): finished, rejected by them, running its tool, or waiting on a PreToolUse
        hook. A call a rejection lets start is waited for too; calls still queued are not. With a
        permission callback nothing is waited for: its answer may be a person's, who must not hold the
        response's end (the calls then go on in the tool batch, as before)."""
        if getattr(self.gate, "can_use_tool", None) is not None:
            return
        while any(e.status == RUNNING and not e.checked for e in self._entries):
            self._progressed.clear()
            await self._progressed.wait()

    async def results(self) -> AsyncIterator[CallResult]:
        """After the stream ended: every result not handed out yet, as soon as the delivery rules
        allow, until every call has one."""
        while True:
            self._changed.clear()
            for result in self.drain_ready():
                yield result
            if all(e.status == DELIVERED for e in self._entries):
                return
            await self._changed.wait()

    async def remaining(self) -> list[CallResult]:
        """After the stream ended: wait for every call, then return **all** results of the response
        (including those already drained) in model order — the content of the one user message."""
        while not self.all_done():
            self._changed.clear()
            await self._changed.wait()
        for entry in self._entries:
            entry.status = DELIVERED
        self._update_ready()
        return self.ordered_results()

    def ordered_results(self, only: Collection[str] | None = None) -> list[CallResult]:
        """The results present so far, in model order (``only``: of these calls)."""
        return [e.result for e in self._entries if e.result is not None and (only is None or e.tool_use_id in only)]

    def context_layers(self) -> Mapping[str, Any]:
        """The shared context after this response: the initial layers plus what concurrency-unsafe
        calls returned, merged in completion order (which is model order: unsafe calls run alone)."""
        return dict(self._layers)

    # --- state -----------------------------------------------------------------------------------

    @property
    def tool_use_ids(self) -> list[str]:
        return [e.tool_use_id for e in self._entries]

    def status(self, tool_use_id: str) -> str:
        """``queued`` | ``running`` | ``done`` | ``delivered``."""
        return self._by_id[tool_use_id].status

    @property
    def in_progress(self) -> frozenset[str]:
        """Ids whose tool is inside ``call`` right now (pipeline steps 9-15)."""
        return frozenset(self._in_progress)

    @property
    def interruptible(self) -> bool:
        """True while at least one call runs and every running call is ``cancel``: a new user
        message may then interrupt the turn (a ``block`` call must be let finish first)."""
        running = self._running()
        return bool(running) and all(e.interrupt == "cancel" for e in running)

    @property
    def aborted(self) -> bool:
        return self._discarded is not None

    # --- interrupt and abort ---------------------------------------------------------------------

    def interrupt(self) -> list[str]:
        """The user interrupted: cancel running and queued ``cancel`` calls (they get the
        ``user_interrupted`` result); ``block`` calls — running or queued — go on and finish.
        Returns the ids of the cancelled calls. Side effects already made stay made."""
        self._interrupted = True
        cancelled = []
        for entry in self._entries:
            if entry.interrupt != "cancel":
                continue
            if entry.status == RUNNING and entry.task is not None and entry.task.cancel():
                # the slot stays taken until the task has really unwound, so nothing overlaps it
                entry.cancel_reason = USER_INTERRUPTED
                cancelled.append(entry.tool_use_id)
            elif entry.status == QUEUED:
                cancelled.append(entry.tool_use_id)
        log.info("executor.interrupt", cancelled=cancelled)
        self._pump()
        return cancelled

    def abort(self, reason: str = USER_INTERRUPTED) -> list[CallResult]:
        """Give up on this response (streaming fallback, stream retry, hard cancel): cancel every
        unfinished call, answer each with a synthetic error for ``reason`` (queued calls never start),
        and return every result in model order. Finished calls keep their real results. The executor
        is finished afterwards; build a new one for the next response. Nothing is rolled back: a call
        that already had side effects keeps them."""
        if self._discarded is None:
            self._discarded = reason
            self._abort_event.set()
            for entry in self._entries:
                if entry.status in (DONE, DELIVERED):
                    continue
                entry.cancel_reason = reason
                if entry.task is not None:
                    entry.task.cancel()
                self._finish(entry, synthetic_result(entry.tool_use_id, entry.tool_name, reason,
                                                     _input_of(entry.block)))
            log.info("executor.abort", reason=reason, calls=len(self._entries))
        return self.ordered_results()

    async def aclose(self, timeout: float | None = 5.0) -> None:
        """Wait (bounded) for cancelled calls to unwind, so no task outlives the loop unnoticed."""
        self.on_ready = None
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _done, still = await asyncio.wait(pending, timeout=timeout)
            if still:
                log.warning("executor.tasks_still_running", count=len(still))


@attrs.frozen(eq=False)
class RunCalls:
    """What every tool call of one run is given, and the executor of each of the run's responses.

    ``table``: the run's tools, each one's validators compiled once a run. ``file_access`` is asked
    once a call (the permission settings' policy as of then; None denies every path). ``read_files``
    is shared by the run's calls (Read records what it saw; Edit and Write check it)."""

    table: ToolTable
    gate: ToolGate
    cwd: Path
    session_id: str
    abort: asyncio.Event
    services: Mapping[str, Any]
    max_concurrency: int = 10
    file_access: Callable[[], FileAccess] | None = None
    read_files: dict[str, float] = attrs.field(factory=dict)

    def context(self, tool_use_id: str) -> ToolContext:
        return ToolContext(cwd=self.cwd, session_id=self.session_id, tool_use_id=tool_use_id, abort=self.abort,
                           read_files=self.read_files, services=self.services,
                           file_access=self.file_access() if self.file_access is not None else None)

    def executor(self, on_ready: Callable[[StreamingToolExecutor], None] | None = None) -> StreamingToolExecutor:
        """A new executor for one response's calls (``on_ready``: told when results may be shown)."""
        return StreamingToolExecutor(lookup=self.table, gate=self.gate, ctx_factory=self.context,
                                     max_concurrency=self.max_concurrency, on_ready=on_ready)


# --- the rules, as pure functions (the executor applies them; so does a Temporal workflow) --------


def may_start(safe: bool, running_safe: Sequence[bool], max_concurrency: int) -> bool:
    """A queued call may start when nothing runs, or when it and every running call are
    concurrency-safe and fewer than ``max_concurrency`` run (``running_safe``: the verdict of each
    running call)."""
    if not running_safe:
        return True
    return safe and all(running_safe) and len(running_safe) < max_concurrency


def deliverable(calls: Sequence[tuple[str, bool]]) -> list[int]:
    """Indices of the finished calls that may be handed out now, in model order, from
    ``(status, safe)`` per call: past running safe calls, never past an unfinished unsafe one."""
    out = []
    for i, (status, safe) in enumerate(calls):
        if status == DONE:
            out.append(i)
        elif status in (RUNNING, QUEUED) and not safe:
            break  # nothing observed after an unfinished unsafe call may be handed out before it
    return out


def call_traits(table: ToolTable, block: Mapping[str, Any], invalid_json: str | None = None
                ) -> tuple[Tool | None, bool, PreparedInput | None, InterruptBehavior]:
    """What scheduling needs to know of one ``tool_use`` block: its tool, the concurrency verdict, the
    validated input the verdict was reached on (None when validation itself failed: the pipeline
    reuses it instead of validating the same block again) and the interrupt behaviour."""
    tool = table.lookup(str(block.get("name", "")))
    if tool is None or invalid_json is not None:
        return tool, False, None, _interrupt_behavior(tool)
    prepared = None
    try:
        prepared = table.prepare_input(tool, block.get("input", {}))
        if prepared.issues:
            safe = False
        else:
            # a copy: is_concurrency_safe must not be able to change what the tool will run with
            safe = bool(tool.is_concurrency_safe(dict(prepared.input)))
    except Exception as exc:  # as Claude Code does: a verdict that cannot be reached is "unsafe"
        log.warning("tool.concurrency_check_failed", tool_use_id=block.get("id"), tool_name=tool.name,
                    error=repr(exc))
        safe = False
    return tool, safe, prepared, _interrupt_behavior(tool)


def _interrupt_behavior(tool: Tool | None) -> InterruptBehavior:
    if tool is None:
        return "block"
    try:
        behavior = tool.interrupt_behavior()
    except Exception as exc:  # as Claude Code does: undeclared, raising or unreadable means "block"
        log.warning("tool.interrupt_behavior_failed", tool_name=tool.name, error=repr(exc))
        return "block"
    return "cancel" if behavior == "cancel" else "block"


def _input_of(block: Mapping[str, Any]) -> dict[str, Any]:
    value = block.get("input")
    return dict(value) if isinstance(value, Mapping) else {}
