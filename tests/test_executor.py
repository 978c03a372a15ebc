"""The streaming tool executor (agentfsm.executor): one deterministic test per scheduling/delivery rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from agentfsm.runtime.executor import StreamingToolExecutor
from agentfsm.runtime.pipeline import REJECT_MESSAGE, CallResult, ToolTable
from agentfsm.runtime.ports import AllowAllGate
from agentfsm.tools.base import InterruptBehavior, Tool, ToolContext, ToolOutput

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}


class Lab:
    """Shared record of what the probe tools did; tests release held calls one by one."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.running: set[str] = set()
        self.max_running = 0
        self.layers_seen: dict[str, dict[str, Any]] = {}
        self._release: dict[str, asyncio.Event] = {}
        self._started: dict[str, asyncio.Event] = {}

    def release_event(self, tid: str) -> asyncio.Event:
        return self._release.setdefault(tid, asyncio.Event())

    def started_event(self, tid: str) -> asyncio.Event:
        return self._started.setdefault(tid, asyncio.Event())

    def release(self, *tids: str) -> None:
        for tid in tids:
            self.release_event(tid).set()

    async def wait_started(self, tid: str) -> None:
        await asyncio.wait_for(self.started_event(tid).wait(), 2)


class Probe(Tool):
    input_schema = SCHEMA

    def __init__(self, lab: Lab, name: str, *, safe: bool = True, hold: bool = True,
                 interrupt: InterruptBehavior = "block", layers: Mapping[str, Any] | None = None,
                 swallow_cancel: bool = False) -> None:
        self.lab, self.name, self.safe, self.hold = lab, name, safe, hold
        self.interrupt, self.layers, self.swallow_cancel = interrupt, dict(layers or {}), swallow_cancel

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return self.safe

    def interrupt_behavior(self) -> InterruptBehavior:
        return self.interrupt

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        lab, tid = self.lab, ctx.tool_use_id
        lab.started.append(tid)
        lab.running.add(tid)
        lab.max_running = max(lab.max_running, len(lab.running))
        lab.layers_seen[tid] = dict(ctx.layers)
        lab.started_event(tid).set()
        ctx.progress({"started": tid})
        try:
            if self.hold:
                try:
                    await lab.release_event(tid).wait()
                except asyncio.CancelledError:
                    lab.cancelled.append(tid)
                    if not self.swallow_cancel:
                        raise
        finally:
            lab.running.discard(tid)
            lab.finished.append(tid)
        return ToolOutput(f"{self.name} {tid} done", context_layers=self.layers)


def use(tid: str, name: str, input: Any = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": {} if input is None else input}


async def settle(rounds: int = 30) -> None:
    """Let every runnable task advance as far as it can (no real I/O is involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def ids(results: list[CallResult]) -> list[str]:
    return [r.tool_use_id for r in results]


@pytest.fixture
def lab() -> Lab:
    return Lab()


def make(lab: Lab, *tools: Tool, **kw: Any) -> StreamingToolExecutor:
    defaults: list[Tool] = [Probe(lab, "Safe"), Probe(lab, "Unsafe", safe=False),
                            Probe(lab, "Quick", hold=False),
                            Probe(lab, "QuickUnsafe", safe=False, hold=False)]
    kw.setdefault("gate", AllowAllGate())
    return StreamingToolExecutor(lookup=[*tools, *defaults], **kw)


# --- starting --------------------------------------------------------------------------------


async def test_add_tool_starts_before_the_stream_ends(lab: Lab) -> None:
    """The tool runs while the (simulated) stream is still open: the stream only continues once the
    tool has started, and its result is deliverable before message_stop."""
    ex = make(lab)
    emitted: list[str] = []

    async def stream() -> AsyncIterator[dict[str, Any]]:
        yield {"type": "content_block_stop", "block": use("a", "Quick")}
        await asyncio.wait_for(lab.started_event("a").wait(), 2)  # would time out if not started
        await asyncio.wait_for(ex.wait_ready(), 2)
        yield {"type": "text", "text": "after the tool"}
        yield {"type": "message_stop"}

    async for ev in stream():
        if ev["type"] == "content_block_stop":
            ex.add_tool(ev["block"])
        emitted += [f"result:{r.tool_use_id}" for r in ex.drain_ready()]
        emitted.append(ev["type"])
    assert emitted == ["content_block_stop", "result:a", "text", "message_stop"]
    assert ids(await ex.remaining()) == ["a"]


async def test_safe_calls_overlap(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("a", "Safe"))
    ex.add_tool(use("b", "Safe"))
    await lab.wait_started("a")
    await lab.wait_started("b")
    assert lab.running == {"a", "b"}
    lab.release("a", "b")
    assert ids(await ex.remaining()) == ["a", "b"]


async def test_unsafe_calls_run_one_at_a_time(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("a", "Unsafe"))
    ex.add_tool(use("b", "Unsafe"))
    await lab.wait_started("a")
    await settle()
    assert lab.started == ["a"] and ex.status("b") == "queued"
    lab.release("a")
    await lab.wait_started("b")
    assert lab.finished == ["a"]
    lab.release("b")
    assert ids(await ex.remaining()) == ["a", "b"]


async def test_safe_call_waits_for_running_unsafe(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("u", "Unsafe"))
    ex.add_tool(use("s", "Quick"))
    await lab.wait_started("u")
    await settle()
    assert ex.status("s") == "queued"
    lab.release("u")
    await ex.remaining()
    assert lab.started == ["u", "s"] and lab.finished == ["u", "s"]


async def test_queued_unsafe_call_is_a_barrier_for_later_safe_calls(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("s0", "Safe"))
    ex.add_tool(use("u1", "Unsafe"))
    ex.add_tool(use("s2", "Safe"))
    await lab.wait_started("s0")
    await settle()
    # s2 is safe and only safe s0 runs, yet it may not pass the queued unsafe u1
    assert lab.started == ["s0"] and ex.status("u1") == ex.status("s2") == "queued"
    lab.release("s0")
    await lab.wait_started("u1")
    await settle()
    assert ex.status("s2") == "queued"
    lab.release("u1")
    await lab.wait_started("s2")
    lab.release("s2")
    assert ids(await ex.remaining()) == ["s0", "u1", "s2"]
    assert lab.started == ["s0", "u1", "s2"]


async def test_concurrency_cap(lab: Lab) -> None:
    ex = make(lab, max_concurrency=2)
    for i in range(5):
        ex.add_tool(use(f"t{i}", "Safe"))
    await settle()
    assert lab.started == ["t0", "t1"]
    for i in range(5):
        await lab.wait_started(f"t{i}")
        lab.release(f"t{i}")
    await ex.remaining()
    assert lab.max_running == 2 and lab.started == [f"t{i}" for i in range(5)]


def test_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        StreamingToolExecutor(lookup=[], gate=AllowAllGate(), max_concurrency=0)


async def test_raising_is_concurrency_safe_counts_as_unsafe(lab: Lab) -> None:
    class Moody(Probe):
        def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
            raise RuntimeError("cannot tell")

    ex = make(lab, Moody(lab, "Moody"))
    ex.add_tool(use("a", "Moody"))
    ex.add_tool(use("b", "Safe"))
    await lab.wait_started("a")
    await settle()
    assert ex.status("b") == "queued"
    lab.release("a", "b")
    await ex.remaining()
    assert lab.started == ["a", "b"]


async def test_unknown_tool_and_invalid_input_are_instant_unsafe_errors_in_order(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("s0", "Safe"))
    ex.add_tool(use("x1", "Nope"))
    ex.add_tool(use("s2", "Safe", {"n": "not a number"}))
    ex.add_tool(use("s3", "Safe"))
    ex.add_tool(use("j4", "Safe"), invalid_json='{"n": ')
    await lab.wait_started("s0")
    await settle()
    assert [ex.status(i) for i in ("x1", "s2", "s3", "j4")] == ["queued"] * 4
    lab.release("s0", "s3")
    results = await ex.remaining()
    assert ids(results) == ["s0", "x1", "s2", "s3", "j4"]
    assert [r.is_error for r in results] == [False, True, True, False, True]
    assert "No such tool available: Nope" in results[1].block["content"]
    assert "InputValidationError: Safe failed" in results[2].block["content"]
    assert "could not be parsed as JSON" in results[4].block["content"]
    assert lab.started == ["s0", "s3"]


# --- delivery --------------------------------------------------------------------------------


async def test_finished_safe_results_pass_a_running_safe_call(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("slow", "Safe"))
    ex.add_tool(use("fast", "Quick"))
    await asyncio.wait_for(ex.wait_ready(), 2)
    assert ids(ex.drain_ready()) == ["fast"]
    assert ex.drain_ready() == [] and not ex.ready.is_set()
    lab.release("slow")
    await asyncio.wait_for(ex.wait_ready(), 2)
    assert ids(ex.drain_ready()) == ["slow"]
    # the user message still lists results in model order
    assert ids(await ex.remaining()) == ["slow", "fast"]


async def test_drain_stops_at_an_unfinished_unsafe_call(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "Cancelable", safe=False, interrupt="cancel"))
    ex.add_tool(use("q", "Quick"))
    ex.add_tool(use("u", "Unsafe"))
    ex.add_tool(use("c", "Cancelable"))
    await lab.wait_started("u")
    assert ids(ex.drain_ready()) == ["q"]
    ex.interrupt()  # c never started: it is answered now, but sits behind the running unsafe u
    await settle()
    assert ex.status("c") == "done" and ex.drain_ready() == []
    lab.release("u")
    await asyncio.wait_for(ex.wait_ready(), 2)
    assert ids(ex.drain_ready()) == ["u", "c"]


async def test_results_paired_by_id_not_completion_order(lab: Lab) -> None:
    ex = make(lab)
    for tid in ("a", "b", "c"):
        ex.add_tool(use(tid, "Safe"))
    await settle()
    lab.release("c")
    await settle()
    lab.release("b")
    await settle()
    lab.release("a")
    results = await ex.remaining()
    assert lab.finished == ["c", "b", "a"]
    assert ids(results) == ["a", "b", "c"]
    assert [r.block["tool_use_id"] for r in results] == ["a", "b", "c"]
    assert [r.block["content"] for r in results] == ["Safe a done", "Safe b done", "Safe c done"]


async def test_results_iterator_yields_each_once_by_delivery_rules(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("a", "Safe"))
    ex.add_tool(use("b", "Quick"))
    ex.add_tool(use("c", "Safe"))
    await asyncio.wait_for(ex.wait_ready(), 2)
    early = ids(ex.drain_ready())
    got: list[str] = []

    async def consume() -> None:
        async for r in ex.results():
            got.append(r.tool_use_id)

    consumer = asyncio.create_task(consume())
    await settle()
    lab.release("c")
    await settle()
    lab.release("a")
    await asyncio.wait_for(consumer, 2)
    assert early == ["b"] and got == ["c", "a"]
    assert not ex.has_pending()


async def test_ready_event_and_has_pending(lab: Lab) -> None:
    ex = make(lab)
    assert not ex.has_pending() and not ex.ready.is_set()
    ex.add_tool(use("a", "Safe"))
    assert ex.has_pending() and not ex.ready.is_set()
    await lab.wait_started("a")
    lab.release("a")
    await asyncio.wait_for(ex.wait_ready(), 2)
    assert ex.has_pending()  # finished but not handed out yet
    ex.drain_ready()
    assert not ex.has_pending() and not ex.ready.is_set()


def test_duplicate_id_is_refused(lab: Lab) -> None:
    async def go() -> None:
        ex = make(lab)
        ex.add_tool(use("a", "Quick"))
        with pytest.raises(ValueError, match="already added"):
            ex.add_tool(use("a", "Quick"))
        await ex.remaining()

    asyncio.run(go())


# --- context layers --------------------------------------------------------------------------


async def test_only_unsafe_calls_change_the_shared_context(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "SetMode", safe=False, hold=False, layers={"mode": "edit"}),
              Probe(lab, "SafeLayer", hold=False, layers={"leak": True}),
              layers={"base": 1})
    ex.add_tool(use("p", "SafeLayer"))
    ex.add_tool(use("m", "SetMode"))
    ex.add_tool(use("after", "Quick"))
    await ex.remaining()
    assert ex.context_layers() == {"base": 1, "mode": "edit"}
    assert lab.layers_seen["p"] == {"base": 1}
    assert lab.layers_seen["after"] == {"base": 1, "mode": "edit"}  # later calls see it at once


# --- progress and in-progress ----------------------------------------------------------------


async def test_progress_callback_and_in_progress(lab: Lab) -> None:
    events: list[tuple[str, Any]] = []
    ex = make(lab, on_progress=lambda tid, data: events.append((tid, data)))
    ex.add_tool(use("a", "Safe"))
    await lab.wait_started("a")
    assert ex.in_progress == {"a"} and events == [("a", {"started": "a"})]
    lab.release("a")
    await ex.remaining()
    assert ex.in_progress == frozenset()


async def test_factory_progress_callback_is_chained(lab: Lab) -> None:
    own: list[str] = []
    ours: list[str] = []

    def make_ctx(tid: str) -> ToolContext:
        from pathlib import Path

        return ToolContext(cwd=Path("."), on_progress=lambda i, d: own.append(i))

    ex = make(lab, ctx_factory=make_ctx, on_progress=lambda i, d: ours.append(i))
    ex.add_tool(use("a", "Quick"))
    await ex.remaining()
    assert own == ours == ["a"]


# --- interrupt -------------------------------------------------------------------------------


async def test_interruptible_only_when_every_running_call_cancels(lab: Lab) -> None:
    class BadBehaviour(Probe):
        def interrupt_behavior(self) -> InterruptBehavior:
            raise RuntimeError("?")

    ex = make(lab, Probe(lab, "C", interrupt="cancel"), BadBehaviour(lab, "Weird", interrupt="cancel"))
    assert not ex.interruptible  # nothing runs
    ex.add_tool(use("c1", "C"))
    await lab.wait_started("c1")
    assert ex.interruptible
    ex.add_tool(use("w", "Weird"))  # raising interrupt_behavior counts as block
    await lab.wait_started("w")
    assert not ex.interruptible
    lab.release("w")
    await asyncio.wait_for(ex.wait_ready(), 2)
    assert ex.interruptible
    lab.release("c1")
    await ex.remaining()
    assert not ex.interruptible


async def test_an_interrupt_behaviour_that_is_neither_cancel_nor_block_counts_as_block(lab: Lab) -> None:
    """A tool that answers ``interrupt_behavior()`` with something else ("Cancel", "kill", None) is
    let finish on an interrupt and keeps the turn from being interruptible, as a ``block`` tool."""
    odd = [Probe(lab, f"Odd{i}", interrupt=value) for i, value in enumerate(("Cancel", "kill", None))]  # type: ignore[arg-type]
    ex = make(lab, *odd)
    for i in range(len(odd)):
        ex.add_tool(use(f"o{i}", f"Odd{i}"))
        await lab.wait_started(f"o{i}")
    assert not ex.interruptible
    assert ex.interrupt() == [] and lab.cancelled == []
    lab.release("o0", "o1", "o2")
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert [r.interrupted or r.is_error for r in results] == [False, False, False]


async def test_interrupt_cancels_cancel_calls_and_lets_block_calls_finish(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "C", interrupt="cancel"))
    ex.add_tool(use("c", "C"))
    ex.add_tool(use("b", "Safe"))
    await lab.wait_started("c")
    await lab.wait_started("b")
    assert ex.interrupt() == ["c"]
    await asyncio.wait_for(ex.wait_ready(), 2)
    first = ex.drain_ready()
    assert ids(first) == ["c"] and first[0].interrupted and first[0].block["content"] == REJECT_MESSAGE
    assert first[0].block["is_error"] is True and lab.cancelled == ["c"]
    assert ex.status("b") == "running"
    lab.release("b")
    results = await ex.remaining()
    assert results[1].block["content"] == "Safe b done" and not results[1].is_error


async def test_interrupt_answers_queued_cancel_calls_without_starting_them(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "C", safe=False, interrupt="cancel"))
    ex.add_tool(use("u", "Unsafe"))
    ex.add_tool(use("c", "C"))
    ex.add_tool(use("b", "QuickUnsafe"))
    await lab.wait_started("u")
    ex.interrupt()
    lab.release("u")
    results = await ex.remaining()
    assert lab.started == ["u", "b"]  # the queued block call still ran; the cancel one never did
    assert [r.interrupted for r in results] == [False, True, False]


async def test_call_that_finishes_despite_cancel_keeps_its_real_result(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "Stubborn", interrupt="cancel", swallow_cancel=True))
    ex.add_tool(use("s", "Stubborn"))
    await lab.wait_started("s")
    ex.interrupt()
    [r] = await ex.remaining()
    assert lab.cancelled == ["s"] and not r.is_error and r.block["content"] == "Stubborn s done"


# --- abort -----------------------------------------------------------------------------------


async def test_abort_pairs_every_call_and_never_starts_queued_ones(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("done", "Quick"))
    ex.add_tool(use("s1", "Safe"))
    ex.add_tool(use("u2", "Unsafe"))
    ex.add_tool(use("s3", "Safe"))
    await lab.wait_started("s1")
    await settle()
    results = ex.abort("streaming_fallback")
    assert ids(results) == ["done", "s1", "u2", "s3"]
    assert results[0].block["content"] == "Quick done done" and not results[0].is_error
    fallback = "<tool_use_error>Error: Streaming fallback - tool execution discarded</tool_use_error>"
    assert [r.block["content"] for r in results[1:]] == [fallback] * 3
    assert all(r.block["is_error"] is True and r.cancel_reason == "streaming_fallback" for r in results[1:])
    await ex.aclose()
    assert lab.cancelled == ["s1"] and "u2" not in lab.started and "s3" not in lab.started
    assert ex.aborted and ids(await ex.remaining()) == ["done", "s1", "u2", "s3"]
    # a block that arrives after the abort is still paired, and nothing starts any more
    ex.add_tool(use("late", "Quick"))
    assert ids(ex.drain_ready())[-1] == "late" and "late" not in lab.started


async def test_abort_for_the_user_uses_the_interrupt_text_and_cancels_block_calls(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("u", "Unsafe"))  # interrupt behaviour "block": a hard abort still stops it
    await lab.wait_started("u")
    [r] = ex.abort()
    assert r.interrupted and r.block["content"] == REJECT_MESSAGE
    await ex.aclose()
    assert lab.cancelled == ["u"]
    assert ex.abort("again") == [r]  # idempotent


async def test_abort_reason_text_for_other_reasons(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("s", "Safe"))
    [r] = ex.abort("stream_failed")
    assert r.block["content"] == ("<tool_use_error>Error: Tool execution discarded (stream_failed)"
                                  "</tool_use_error>")
    await ex.aclose()


# --- the rules at their edges ----------------------------------------------------------------------


def test_the_default_cap_is_the_documented_limit() -> None:
    from agentfsm.machine.state import Limits

    assert StreamingToolExecutor([], gate=AllowAllGate()).max_concurrency == Limits().max_tool_concurrency


async def test_a_call_with_invalid_input_is_unsafe_even_for_a_safe_tool(lab: Lab) -> None:
    """A verdict reached on input that does not validate is "unsafe": the call waits for the running safe
    call and is a barrier for the next one."""
    ex = make(lab)
    ex.add_tool(use("s", "Safe"))
    await lab.wait_started("s")
    ex.add_tool(use("bad", "Safe", {"unexpected": 1}))
    ex.add_tool(use("q", "Quick"))
    await settle()
    assert (ex.status("bad"), ex.status("q")) == ("queued", "queued")
    lab.release("s")
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert [r.is_error for r in results] == [False, True, False] and "q" in lab.started


async def test_the_concurrency_verdict_cannot_change_what_the_tool_runs_with(lab: Lab) -> None:
    """A tool whose ``is_concurrency_safe`` scribbles on the input it is shown (normalising a field,
    dropping one it does not need for the verdict) still runs with, and reports, the model's input."""

    class Scribbler(Tool):
        name = "Scribbler"
        input_schema = SCHEMA

        def __init__(self) -> None:
            self.ran_with: list[dict[str, Any]] = []

        def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
            if isinstance(input, dict):
                input["n"] = -1
                input.pop("n")
            return True

        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            self.ran_with.append(dict(input))
            return ToolOutput(f"n={input.get('n')}")

    scribbler = Scribbler()
    ex = make(lab, scribbler)
    ex.add_tool(use("a", "Scribbler", {"n": 7}))
    [r] = await asyncio.wait_for(ex.remaining(), 2)
    assert scribbler.ran_with == [{"n": 7}]
    assert r.block["content"] == "n=7" and r.tool_input == {"n": 7} and not r.is_error


class CountingTable(ToolTable):
    """Records each schema validation of a call's input (step 4)."""

    def __init__(self, source: Any) -> None:
        super().__init__(source)
        self.validated: list[Any] = []

    def input_issues(self, tool: Tool, value: Any) -> list[str]:
        self.validated.append(value)
        return super().input_issues(tool, value)


async def test_each_input_is_prepared_once_per_call(lab: Lab) -> None:
    """The safety check's validated input is handed to the pipeline: the schema runs once per call."""
    table = CountingTable([Probe(lab, "Quick", hold=False), Probe(lab, "QuickUnsafe", safe=False, hold=False)])
    ex = StreamingToolExecutor(table, gate=AllowAllGate())
    ex.add_tool(use("a", "Quick", {"n": 1}))
    ex.add_tool(use("b", "QuickUnsafe", {"n": 2}))
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert not any(r.is_error for r in results)
    assert table.validated == [{"n": 1}, {"n": 2}]


async def test_an_interrupt_scans_past_a_cancelled_queued_call(lab: Lab) -> None:
    """A queued cancel call answered by the interrupt no longer holds back the safe call behind it."""
    ex = make(lab, Probe(lab, "CU", safe=False, interrupt="cancel"))
    ex.add_tool(use("s", "Safe"))
    await lab.wait_started("s")
    ex.add_tool(use("cu", "CU"))  # unsafe: queued behind the running safe call, a barrier
    ex.add_tool(use("s2", "Safe"))
    await settle()
    assert ex.status("s2") == "queued"
    assert ex.interrupt() == ["cu"]
    await lab.wait_started("s2")  # started at once, while s still runs
    assert ex.status("s") == "running"
    lab.release("s", "s2")
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert [r.interrupted for r in results] == [False, True, False]


async def test_an_interrupt_reaches_cancel_calls_after_block_calls(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "C", interrupt="cancel"))
    ex.add_tool(use("b", "Safe"))
    ex.add_tool(use("c", "C"))
    await lab.wait_started("b")
    await lab.wait_started("c")
    assert ex.interrupt() == ["c"]
    lab.release("b")
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert [r.interrupted for r in results] == [False, True]


async def test_an_interrupt_names_the_queued_cancel_calls_it_answers(lab: Lab) -> None:
    ex = make(lab, Probe(lab, "C", safe=False, interrupt="cancel"))
    ex.add_tool(use("u", "Unsafe"))
    ex.add_tool(use("c", "C"))
    await lab.wait_started("u")
    assert ex.interrupt() == ["c"]
    lab.release("u")
    await asyncio.wait_for(ex.remaining(), 2)


async def test_tasks_are_named_after_their_call_and_a_cancelled_one_is_paired(lab: Lab) -> None:
    """A call's task is ``tool:<name>:<id>``; cancelled from outside — before it started, or while its
    tool runs — it is answered as an interrupted call, never left without a result."""
    ex = make(lab)
    ex.add_tool(use("early", "Safe", {"n": 5}))
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "tool:Safe:early"]
    task.cancel()  # before its first step
    ex.add_tool(use("late", "Safe"))
    await lab.wait_started("late")
    [late] = [t for t in asyncio.all_tasks() if t.get_name() == "tool:Safe:late"]
    late.cancel()  # inside the tool
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert [r.block["content"] for r in results] == [REJECT_MESSAGE, REJECT_MESSAGE]
    assert [r.cancel_reason for r in results] == ["user_interrupted", "user_interrupted"]
    assert results[0].tool_input == {"n": 5} and "early" not in lab.started


async def test_a_pipeline_that_raises_still_answers_its_call(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Belt and braces: the pipeline never raises, but if it did, the call gets an error result."""
    import agentfsm.runtime.executor as executor_module

    async def broken(block: Any, **_kw: Any) -> CallResult:
        raise RuntimeError("pipeline broke")

    monkeypatch.setattr(executor_module, "run_tool_call", broken)
    ex = make(lab)
    ex.add_tool(use("x", "Quick"))
    [r] = await asyncio.wait_for(ex.remaining(), 2)
    assert (r.tool_use_id, r.tool_name, r.is_error) == ("x", "Quick", True)
    assert r.block == {"type": "tool_result", "tool_use_id": "x", "is_error": True,
                       "content": "Error: RuntimeError: pipeline broke"}


async def test_a_cancelled_call_reports_the_input_it_ran_with(lab: Lab) -> None:
    """The interrupted result carries the coerced input the tool got ("5" → 5), not the raw block's."""
    ex = make(lab, Probe(lab, "C", interrupt="cancel"))
    ex.add_tool(use("c", "C", {"n": "5"}))
    await lab.wait_started("c")
    ex.interrupt()
    [r] = await asyncio.wait_for(ex.remaining(), 2)
    assert r.interrupted and r.tool_input == {"n": 5}


async def test_an_aborted_call_reports_its_input(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("u", "Unsafe", {"n": 3}))
    ex.add_tool(use("q", "Quick", {"n": 4}))
    await lab.wait_started("u")
    results = ex.abort()
    assert [r.tool_input for r in results] == [{"n": 3}, {"n": 4}]
    await ex.aclose()


async def test_ready_is_told_once_per_readiness_and_never_reentered(lab: Lab) -> None:
    """``on_ready`` is called whenever something becomes deliverable, and never from inside itself (a
    listener that reacts by aborting does not hear about the abort's results while it is still running)."""
    calls: list[int] = []
    depth = [0]

    def on_ready(told: StreamingToolExecutor) -> None:
        depth[0] += 1
        calls.append(depth[0])
        if len(calls) == 2:
            told.abort()  # reacting to the second result by giving up on the rest
        told.drain_ready()
        depth[0] -= 1

    ex = make(lab, on_ready=on_ready)
    ex.add_tool(use("a", "Safe"))
    ex.add_tool(use("b", "Safe"))
    ex.add_tool(use("c", "Safe"))
    await lab.wait_started("c")
    lab.release("a")
    await asyncio.wait_for(_until(lambda: len(calls) == 1), 2)
    lab.release("b")
    await asyncio.wait_for(_until(lambda: len(calls) == 2), 2)
    await settle()
    assert calls == [1, 1] and ex.aborted and not ex.has_pending()
    await ex.aclose()


async def _until(done: Any) -> None:
    while not done():
        await asyncio.sleep(0.001)


async def test_remaining_hands_out_everything(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("a", "Quick"))
    ex.add_tool(use("b", "Quick"))
    assert ex.tool_use_ids == ["a", "b"] and ex.aborted is False
    results = await asyncio.wait_for(ex.remaining(), 2)
    assert ids(results) == ["a", "b"]
    assert not ex.has_pending() and not ex.ready.is_set() and ex.drain_ready() == []
    assert [ex.status(i) for i in ("a", "b")] == ["delivered", "delivered"]


async def test_an_abort_keeps_results_already_handed_out(lab: Lab) -> None:
    ex = make(lab)
    ex.add_tool(use("q", "Quick"))
    ex.add_tool(use("s", "Safe"))
    await asyncio.wait_for(ex.wait_ready(), 2)
    assert ids(ex.drain_ready()) == ["q"]
    results = ex.abort("stream_failed")
    assert results[0].block["content"] == "Quick q done" and not results[0].is_error
    assert results[1].cancel_reason == "stream_failed"
    await ex.aclose()


async def test_a_call_that_outlives_its_abort_keeps_the_aborted_answer(lab: Lab) -> None:
    """The abort answered the call; when its tool finishes later anyway, nothing changes and nothing is
    handed out twice — whether or not the answer was handed out already."""
    for drained_first in (False, True):
        lab = Lab()
        ex = make(lab, Probe(lab, "Stubborn", swallow_cancel=True))
        ex.add_tool(use("s", "Stubborn"))
        await lab.wait_started("s")
        [aborted] = ex.abort("stream_failed")
        if drained_first:
            assert ids(ex.drain_ready()) == ["s"]
        lab.release("s")
        await ex.aclose()
        assert lab.finished == ["s"]  # it did run to its end (nothing is rolled back) ...
        assert ex.ordered_results() == [aborted]  # ... but the answer stands
        assert ex.drain_ready() == ([] if drained_first else [aborted])
        assert ex.drain_ready() == []


async def test_progress_after_an_abort_and_a_failing_progress_display_are_ignored(lab: Lab) -> None:
    seen: list[tuple[str, Any]] = []

    def on_progress(tid: str, data: Any) -> None:
        seen.append((tid, data))
        raise RuntimeError("display broke")

    class Chatty(Tool):
        name = "Chatty"
        input_schema = SCHEMA

        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            ctx.progress("before")
            try:
                await lab.release_event(ctx.tool_use_id).wait()
            except asyncio.CancelledError:
                ctx.progress("after the abort")
                raise
            return ToolOutput("never")

    ex = make(lab, Chatty(), on_progress=on_progress)
    ex.add_tool(use("q", "Quick"))
    ex.add_tool(use("c", "Chatty"))
    await asyncio.wait_for(_until(lambda: ("c", "before") in seen), 2)
    [quick] = [r for r in ex.drain_ready() if r.tool_use_id == "q"]
    assert not quick.is_error  # the display's failure did not fail the call
    ex.abort()
    await ex.aclose()
    assert ("c", "after the abort") not in seen


async def test_closing_waits_for_unwinding_calls_only_so_long(lab: Lab) -> None:
    never = asyncio.Event()

    class Deaf(Tool):
        name = "Deaf"
        input_schema = SCHEMA

        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            lab.started_event(ctx.tool_use_id).set()
            while not never.is_set():
                try:
                    await never.wait()
                except asyncio.CancelledError:
                    continue  # ignores every cancellation
            return ToolOutput("at last")

    ex = make(lab, Deaf())
    ex.add_tool(use("d", "Deaf"))
    await lab.wait_started("d")
    ex.abort()
    await asyncio.wait_for(ex.aclose(timeout=0.05), 2)
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "tool:Deaf:d"]
    assert not task.done()  # still there: close did not wait for it
    never.set()
    await asyncio.wait([task], timeout=1)


async def test_run_calls_give_each_call_the_runs_context_and_each_response_an_executor(
        lab: Lab, tmp_path: Any) -> None:
    """:class:`RunCalls` (what the driver hands every call): the run's cwd, session, abort signal,
    services and the one ``read_files`` all calls share; the file-access policy asked once per call;
    each executor under the run's concurrency cap, telling ``on_ready``."""
    from agentfsm.runtime.executor import RunCalls

    asked: list[int] = []
    policies: list[object] = []

    def file_access() -> Any:
        asked.append(1)
        policies.append(object())
        return policies[-1]

    abort, shared = asyncio.Event(), {"/a": 1.0}
    calls = RunCalls(ToolTable.of([Probe(lab, "Safe"), Probe(lab, "Quick", hold=False)]), AllowAllGate(),
                     tmp_path, "sess", abort, {"svc": 1}, 1, file_access, shared)
    one, two = calls.context("t1"), calls.context("t2")
    assert (one.cwd, one.session_id, one.tool_use_id, one.abort, one.services) == (tmp_path, "sess", "t1", abort,
                                                                                   {"svc": 1})
    assert one.read_files is shared and two.read_files is shared
    assert (one.file_access, two.file_access) == tuple(policies) and len(asked) == 2
    assert RunCalls(calls.table, calls.gate, tmp_path, "s", abort, {}).context("t").file_access is None
    told: list[StreamingToolExecutor] = []
    ex = calls.executor(told.append)
    assert ex.max_concurrency == 1 and ex.table is calls.table
    ex.add_tool(use("q1", "Quick"))
    await settle()
    assert told and told[0] is ex
    assert [r.tool_use_id for r in await ex.remaining()] == ["q1"]
    assert lab.finished == ["q1"]
