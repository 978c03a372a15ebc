"""Property tests of the streaming tool executor: random batches of safe/unsafe calls with random
durations (0-5 ms), failures, unknown tools and bad input, added at random moments of a simulated
stream, sometimes interrupted or aborted. Invariants checked on every run:

* an unsafe call never overlaps another call; safe calls overlap only safe calls;
* barrier order: everything before an unsafe call finished before it started, everything after it
  started after it finished;
* never more than ``max_concurrency`` calls at once;
* every call gets exactly one result, paired by id, and the batch forms one user message in model
  order; a result is handed out only when every unsafe call before it has finished;
* interrupt: ``block`` calls are never cancelled; abort: queued calls never start.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.runtime.executor import DELIVERED, DONE, QUEUED, RUNNING, StreamingToolExecutor, deliverable, may_start
from agentfsm.runtime.pipeline import CallResult
from agentfsm.runtime.ports import AllowAllGate
from agentfsm.tools.base import InterruptBehavior, Tool, ToolContext, ToolError, ToolOutput

KINDS = ("safe", "unsafe", "raising_check", "unknown", "invalid_input", "invalid_json")
OUTCOMES = ("ok", "tool_error", "exception", "error_output")
# kinds whose tool body actually runs (the others end in the pipeline before step 10)
RUNS = {"safe", "unsafe", "raising_check"}


@attrs.frozen
class Spec:
    kind: str
    ms: int
    outcome: str
    interrupt: InterruptBehavior
    gap_ms: int  # stream time before the next block arrives

    @property
    def safe(self) -> bool:
        return self.kind == "safe"


specs = st.builds(Spec, kind=st.sampled_from(KINDS), ms=st.integers(0, 5), outcome=st.sampled_from(OUTCOMES),
                  interrupt=st.sampled_from(("cancel", "block")), gap_ms=st.integers(0, 3))
batches = st.lists(specs, min_size=1, max_size=8)


class World:
    """Observes the calls: intervals on a logical clock and overlap violations at each start."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.tick = itertools.count()
        self.running: dict[str, bool] = {}  # id -> safe
        self.start: dict[str, int] = {}
        self.end: dict[str, int] = {}
        self.violations: list[str] = []
        self.started_after_abort: list[str] = []
        self.aborted = False


class P(Tool):
    name = "P"
    input_schema = {"type": "object", "properties": {
        "ms": {"type": "integer"}, "outcome": {"type": "string"}, "safe": {"type": ["boolean", "string"]},
        "interrupt": {"type": "string"}}, "required": ["ms"]}

    def __init__(self, world: World) -> None:
        self.world = world

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        if input["safe"] == "raise":
            raise RuntimeError("cannot decide")
        return bool(input["safe"])

    def interrupt_behavior(self) -> InterruptBehavior:
        return "block"  # the executor asks the tool, not the call: PCancel is the "cancel" twin

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        w, tid, safe = self.world, ctx.tool_use_id, input["safe"] is True
        if w.aborted:
            w.started_after_abort.append(tid)
        others = dict(w.running)
        if others and not safe:
            w.violations.append(f"unsafe {tid} started beside {sorted(others)}")
        if safe and not all(others.values()):
            w.violations.append(f"safe {tid} started beside unsafe {sorted(others)}")
        if len(others) + 1 > w.cap:
            w.violations.append(f"{tid} exceeded the cap {w.cap}")
        w.running[tid] = safe
        w.start[tid] = next(w.tick)
        try:
            await asyncio.sleep(input["ms"] / 1000)
        finally:
            del w.running[tid]
            w.end[tid] = next(w.tick)
        if input["outcome"] == "tool_error":
            raise ToolError(f"{tid} failed")
        if input["outcome"] == "exception":
            raise ValueError(f"{tid} crashed")
        return ToolOutput(f"{tid} ok", is_error=input["outcome"] == "error_output")


class PCancel(P):
    name = "PCancel"

    def interrupt_behavior(self) -> InterruptBehavior:
        return "cancel"


def block_for(i: int, spec: Spec) -> tuple[dict[str, Any], str | None]:
    tid = f"t{i}"
    name = "PCancel" if spec.interrupt == "cancel" else "P"
    safe: Any = {"safe": True, "unsafe": False, "raising_check": "raise"}.get(spec.kind, True)
    inp: dict[str, Any] = {"ms": spec.ms, "outcome": spec.outcome, "safe": safe}
    if spec.kind == "unknown":
        name = "Nope"
    if spec.kind == "invalid_input":
        inp["ms"] = "soon"
    raw = '{"ms": ' if spec.kind == "invalid_json" else None
    return {"type": "tool_use", "id": tid, "name": name, "input": {} if raw else inp}, raw


class Run:
    """Drives one executor like the loop does and checks delivery-time rules as it goes."""

    def __init__(self, batch: list[Spec], cap: int) -> None:
        self.batch = batch
        self.world = World(cap)
        self.ex = StreamingToolExecutor(lookup=[P(self.world), PCancel(self.world)], gate=AllowAllGate(),
                                        max_concurrency=cap)
        self.delivered: list[str] = []
        self.problems: list[str] = []

    def check_delivery(self, results: list[CallResult]) -> None:
        order = {f"t{i}": i for i in range(len(self.batch))}
        for r in results:
            self.delivered.append(r.tool_use_id)
            k = order[r.tool_use_id]
            for j in range(k):
                if not self.batch[j].safe and self.ex.status(f"t{j}") not in ("done", "delivered"):
                    self.problems.append(f"{r.tool_use_id} handed out before unsafe t{j} finished")

    async def stream(self, stop_after: int | None = None) -> None:
        for i, spec in enumerate(self.batch[: stop_after]):
            block, raw = block_for(i, spec)
            self.ex.add_tool(block, invalid_json=raw)
            self.check_delivery(self.ex.drain_ready())
            await asyncio.sleep(spec.gap_ms / 1000)
            self.check_delivery(self.ex.drain_ready())

    async def finish(self) -> list[CallResult]:
        async for r in self.ex.results():
            self.check_delivery([r])
        return await self.ex.remaining()

    def check_common(self, results: list[CallResult], added: int) -> None:
        w = self.world
        assert w.violations == []
        assert self.problems == []
        wanted = [f"t{i}" for i in range(added)]
        # exactly one result per call, paired by id, in model order: one user message
        assert [r.tool_use_id for r in results] == wanted
        assert [r.block["tool_use_id"] for r in results] == wanted
        assert all(r.block["type"] == "tool_result" for r in results)
        assert sorted(self.delivered) == sorted(set(self.delivered))  # nothing handed out twice
        # barrier order between calls whose bodies ran
        ran = [i for i in range(added) if f"t{i}" in w.start]
        for i in ran:
            if self.batch[i].safe:
                continue
            for j in ran:
                if j < i:
                    assert w.end[f"t{j}"] < w.start[f"t{i}"], f"t{j} still ran when unsafe t{i} started"
                elif j > i:
                    assert w.start[f"t{j}"] > w.end[f"t{i}"], f"t{j} passed the unsafe t{i}"


def expected_error(spec: Spec) -> bool:
    return spec.kind not in RUNS or spec.outcome != "ok"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches, cap=st.integers(1, 4))
def test_random_batches_keep_every_rule(batch: list[Spec], cap: int) -> None:
    async def go() -> tuple[Run, list[CallResult]]:
        run = Run(batch, cap)
        await run.stream()
        return run, await run.finish()

    run, results = asyncio.run(go())
    run.check_common(results, len(batch))
    assert sorted(run.delivered) == sorted(f"t{i}" for i in range(len(batch)))
    for spec, r in zip(batch, results, strict=True):
        assert r.is_error == expected_error(spec) == bool(r.block.get("is_error"))
        assert r.cancel_reason is None
    ran = {f"t{i}" for i, s in enumerate(batch) if s.kind in RUNS}
    assert set(run.world.start) == ran


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches, cap=st.integers(1, 4), cut=st.integers(0, 8), wait_ms=st.integers(0, 4),
       action=st.sampled_from(("interrupt", "abort")))
def test_interrupt_and_abort_keep_pairing(batch: list[Spec], cap: int, cut: int, wait_ms: int,
                                          action: str) -> None:
    added = min(len(batch), cut + 1)

    async def go() -> tuple[Run, list[CallResult], set[str]]:
        run = Run(batch, cap)
        await run.stream(stop_after=added)
        await asyncio.sleep(wait_ms / 1000)
        unstarted = {f"t{i}" for i in range(added) if run.ex.status(f"t{i}") == "queued"}
        if action == "abort":
            run.world.aborted = True
            results = run.ex.abort("streaming_fallback")
            assert [r.tool_use_id for r in results] == [f"t{i}" for i in range(added)]
            await run.ex.aclose()
            # the abort answered every call at once; waiting changes nothing
            assert await run.ex.remaining() == results
            return run, results, unstarted
        run.ex.interrupt()
        return run, await run.finish(), unstarted

    run, results, unstarted = asyncio.run(go())
    run.check_common(results, added)
    for spec, r in zip(batch, results, strict=False):
        if action == "interrupt" and spec.interrupt == "block":
            assert r.cancel_reason is None  # block calls always finish
        if r.cancel_reason is not None:
            assert r.is_error and r.block["is_error"] is True
        else:
            assert r.is_error == expected_error(spec)
    if action == "abort":
        assert run.world.started_after_abort == []
        assert not (unstarted & set(run.world.start))
        assert all(r.cancel_reason == "streaming_fallback" for r in results if r.tool_use_id in unstarted)
    else:
        cancel_unstarted = {f"t{i}" for i, s in enumerate(batch[:added])
                            if s.interrupt == "cancel" and f"t{i}" in unstarted and s.kind in RUNS}
        assert not (cancel_unstarted & set(run.world.start))


# --- the two scheduling rules as pure functions, over every shape of a batch -----------------------

_calls = st.lists(st.tuples(st.sampled_from([QUEUED, RUNNING, DONE, DELIVERED]), st.booleans()), max_size=8)


@given(_calls)
def test_finished_calls_are_handed_out_never_past_an_unfinished_unsafe_one(calls: list[tuple[str, bool]]) -> None:
    """A finished call is deliverable exactly when no earlier call is unfinished (queued or running)
    and unsafe; delivered ones are never handed out again."""
    expected = [i for i, (status, _safe) in enumerate(calls)
                if status == DONE and not any(st_ in (QUEUED, RUNNING) and not sf for st_, sf in calls[:i])]
    assert deliverable(calls) == expected


@given(st.booleans(), st.lists(st.booleans(), max_size=6), st.integers(1, 6))
def test_a_call_starts_alone_or_among_safe_calls_under_the_cap(safe: bool, running: list[bool], cap: int) -> None:
    """Nothing running: it starts. Otherwise only a safe call beside safe calls, fewer than the cap."""
    assert may_start(safe, running, cap) == (not running or (safe and all(running) and len(running) < cap))
