"""Engine overhead against the 30-line teaching loop (``bench/_common.bare_loop``).

Both loops talk to the same in-process ScriptedModel and call the same custom tool (no delay), for
N conversations of K tool turns plus a final answer each. What differs is everything the engine adds:
the session set-up (registry, gate, machine), the state machine and its records, the streaming
executor and the 15-step pipeline, structured logs, result building.

Printed: µs per loop iteration (one model turn) for both, CPU and wall, and the ratio engine / bare.
Target: engine ≤ 2× the bare loop. The two are measured in alternating rounds and the median round
is reported, so a neighbour's burst of load hits both alike.

    python bench/overhead.py [--n 200] [--k 5] [--rounds 7] [--profile]

``--profile`` runs the engine once more under cProfile and prints the top functions by own time.

``--breakdown`` (issue 34) runs the untraced and the traced engine under cProfile and prints the share
of the run's profiled time inside each part of the engine (cumulative, so nested parts overlap:
the model's own stream is inside consuming it, the pipeline inside dispatching): where a model turn's
cost goes, beside the scripted model's own share, which the 30-line loop pays too.

``--pipeline`` (issue 34): one Echo call through the tool pipeline with the session's own gate (no
hooks configured: the compiled plan leaves out the steps that do nothing), through the same pipeline
with every step run (the gate wrapped so it cannot say which hooks it has: what every call paid
before), the compiled pipeline in a task of its own (as the executor runs a call), the tool's
``call`` alone, and building a response's executor; µs of CPU per call, alternating rounds.

``--trace`` (issue 34) measures what the session file costs and what writing it as one record per
move would save: the traced engine as it is (format 3: a record per move, per message, per request,
per streamed block) against the same engine with a writer that folds each move's messages and
compaction boundary into the move's own record (``_OneRecordPerMove``, below: the same facts, as a
check at start-up shows, in fewer records), the untraced engine and the 30-line loop in alternating
rounds, with records and bytes per iteration; then the writer alone on the recorded moves of one
conversation (µs of CPU per move, both shapes), where the rest of the trace's cost goes (the same
engine without the fsync at a session file's close, then also without the flush per stretch
between waits: measurements, not options), and a session file's fixed cost (open, lock,
header, result, close, with and without the fsync at close).

``--growth`` (issue 34) shows how the cost grows instead: CPU per iteration of 1, 10, 100 and 1,000
concurrent conversations (``--k`` tool turns + an answer each, one event loop, traced), and of one
conversation of 10, 100 and 1,000 tool turns (traced), each beside the bare loop doing the same in
the same run (alternating order; the median of ``--rounds``, fewer for the largest sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    bare_loop,
    bare_system,
    echo_tool,
    engine_options,
    machine,
    median,
    ratio,
    run_engine,
    tool_turns,
    workspace,
)

from agentfsm.machine.events import to_record
from agentfsm.machine.state import SNAPSHOT_KEYS, LoopState, Message, appended, snapshot_json
from agentfsm.runtime.trace import TraceWriter
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext


def _timed(fn: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one asyncio run of ``fn``; GC collected before, so a
    collection left over from the other loop is not billed to this one."""
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    asyncio.run(fn())
    return time.process_time() - c0, time.perf_counter() - w0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="conversations per round (default 200)")
    ap.add_argument("--k", type=int, default=5, help="tool turns per conversation (default 5)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    ap.add_argument("--profile", action="store_true", help="profile the engine and print the top costs")
    ap.add_argument("--trace", action="store_true",
                    help="the session file: as written vs one record per move, per move and per session (issue 34)")
    ap.add_argument("--growth", action="store_true",
                    help="CPU per iteration from 1 to 1,000 sessions and from 10 to 1,000 turns, with the bare loop")
    ap.add_argument("--breakdown", action="store_true",
                    help="profile the engine and print the share of each of its parts (issue 34)")
    ap.add_argument("--pipeline", action="store_true",
                    help="one tool call: compiled pipeline, every step, the tool alone (issue 34)")
    args = ap.parse_args(argv)
    if args.growth:
        return growth(args)
    if args.trace:
        return trace(args)
    if args.breakdown:
        return breakdown(args)
    if args.pipeline:
        return pipeline(args)

    cwd = workspace()
    echo = echo_tool()
    responses = tool_turns(args.k)
    options = engine_options(cwd, [echo])
    traced = engine_options(cwd, [echo], write_trace=True, sessions_dir=cwd / "sessions")
    system = bare_system(cwd)
    tools = {echo.name: echo}
    iterations = args.n * (args.k + 1)

    async def engine() -> None:
        for _ in range(args.n):
            result = await run_engine(responses, options)
            if result.is_error or result.num_turns != args.k + 1:
                raise SystemExit(f"engine run went wrong: {result.to_dict()}")

    async def engine_traced() -> None:
        # the default: the session file written, one record per message, move and request
        for _ in range(args.n):
            result = await run_engine(responses, traced)
            if result.is_error:
                raise SystemExit(f"engine run went wrong: {result.to_dict()}")

    async def bare() -> None:
        ctx = ToolContext(cwd=cwd)
        for _ in range(args.n):
            final = await bare_loop(ScriptedModel(responses), "go", tools, system, ctx)
            if final[-1].get("text") != "done":
                raise SystemExit(f"bare loop went wrong: {final}")

    # warm-up: imports, lazily compiled validators, first-use caches of both loops
    asyncio.run(engine())
    asyncio.run(engine_traced())
    asyncio.run(bare())

    eng: list[tuple[float, float]] = []
    trc: list[tuple[float, float]] = []
    base: list[tuple[float, float]] = []
    for r in range(args.rounds):
        # alternate the order so none always runs right after another's garbage
        order = [(engine, eng), (engine_traced, trc), (bare, base)]
        for fn, into in (order if r % 2 == 0 else order[::-1]):
            into.append(_timed(fn))

    us = 1e6 / iterations
    e_cpu, e_wall = median([c for c, _ in eng]) * us, median([w for _, w in eng]) * us
    b_cpu, b_wall = median([c for c, _ in base]) * us, median([w for _, w in base]) * us
    print(f"machine: {machine()}")
    print(f"overhead: {args.n} conversations x ({args.k} tool turns + 1 answer) = {iterations} iterations "
          f"per round, {args.rounds} rounds, median round")
    print(f"  bare loop (30 lines): {b_cpu:8.1f} us/iter CPU  {b_wall:8.1f} us/iter wall")
    t_cpu, t_wall = median([c for c, _ in trc]) * us, median([w for _, w in trc]) * us
    print(f"  engine (Session):     {e_cpu:8.1f} us/iter CPU  {e_wall:8.1f} us/iter wall   (no session file)")
    print(f"  engine, traced:       {t_cpu:8.1f} us/iter CPU  {t_wall:8.1f} us/iter wall   (the default)")
    print(f"  ratio engine/bare:    {ratio(e_cpu, b_cpu)} CPU  {ratio(e_wall, b_wall)} wall;  traced "
          f"{ratio(t_cpu, b_cpu)} CPU   (goal: traced <= 150 us, about 3x)")
    print(f"  engine extra per iteration: {e_cpu - b_cpu:.1f} us CPU, traced {t_cpu - b_cpu:.1f} us CPU")
    n_rec, n_bytes = file_sizes(cwd / "sessions", args.k + 1)
    print(f"  session file per iteration: {n_rec:.2f} records, {n_bytes:.0f} bytes (header and result included)")

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        asyncio.run(engine())
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(35)
        print(out.getvalue())
    return 0


# (label, file suffix, function name): the engine's parts, as the driver and runner call them
PARTS: tuple[tuple[str, str, str], ...] = (
    ("session set-up (Session(): settings, gate, registry, writer)", "fsm/sessions/session.py", "__init__"),
    ("session start and teardown (SessionStart, aclose)", "fsm/sessions/session.py", "_session_start"),
    ("", "fsm/sessions/session.py", "aclose"),
    ("driver set-up (Driver(): tool table, accounting)", "fsm/runtime/driver.py", "__init__"),
    ("machine moves (transitions, guards, effects, new LoopState)", "fsm/machine/graph.py", "fire"),
    ("step observers and what a move does (trace, logs, emit)", "fsm/runtime/runner.py", "perform"),
    ("", "fsm/runtime/trace.py", "on_step"),
    ("", "fsm/runtime/driver.py", "on_step"),
    ("assemble (context estimate, auto-compact check)", "fsm/runtime/driver.py", "assemble"),
    ("call model (request, preflight, accounting; the first event)", "fsm/runtime/driver.py", "call_model"),
    ("consume stream (assembler, executor intake)", "fsm/runtime/driver.py", "consume_stream"),
    ("  of which executor intake (safety check, input parse)", "fsm/runtime/executor.py", "add_tool"),
    ("the scripted model itself, inside the two above (the 30-line loop pays it too)",
     "fsm/testing/scripted.py", "_once"),
    ("dispatch tools (wait for results, the batch)", "fsm/runtime/driver.py", "dispatch_tools"),
    ("tool pipeline (15 steps; in the call's own task)", "fsm/runtime/pipeline.py", "run_tool_call"),
    ("  of which the permission decision", "hooks/gate.py", "permission"),
    ("stop hooks (none configured)", "fsm/runtime/driver.py", "stop_hooks"),
    ("the stop signal wrapping each wait (the waits' work included)", "fsm/runtime/signals.py", "until_stopped"),
)


class _Opaque:
    """A gate that answers like the one it wraps but cannot say which hooks it has."""

    def __init__(self, gate: Any) -> None:
        self.pre_tool_use = gate.pre_tool_use
        self.permission = gate.permission
        self.post_tool_use = gate.post_tool_use
        self.post_tool_use_failure = gate.post_tool_use_failure


def pipeline(args: argparse.Namespace) -> int:
    from agentfsm.runtime.pipeline import ToolTable, run_tool_call
    from agentfsm.sessions.compose import build_policy, build_registry

    cwd = workspace()
    echo = echo_tool()
    options = engine_options(cwd, [echo])
    gate, registry = build_policy(options, build_registry(options), session_id="bench", transcript_path="")
    table = ToolTable.of(registry)
    block = {"type": "tool_use", "id": "toolu_1", "name": echo.name, "input": {"text": "hi"}}
    ctx = ToolContext(cwd=cwd)
    n = args.n * 50

    def make_ctx(tid: str) -> ToolContext:
        return ToolContext(cwd=cwd, tool_use_id=tid)

    async def through(g: Any) -> None:
        for _ in range(n):
            r = await run_tool_call(block, lookup=table, gate=g, ctx_factory=make_ctx)
            if r.is_error:
                raise SystemExit(f"the call went wrong: {r.block}")

    async def compiled() -> None:
        await through(gate)

    async def every_step() -> None:
        await through(_Opaque(gate))

    async def alone() -> None:
        for _ in range(n):
            await echo.call({"text": "hi"}, ctx)

    async def in_a_task() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(n):
            await loop.create_task(run_tool_call(block, lookup=table, gate=gate, ctx_factory=make_ctx))

    async def executors() -> None:
        from agentfsm.runtime.executor import StreamingToolExecutor

        for _ in range(n):
            StreamingToolExecutor(table, gate=gate)

    fns = {"compiled pipeline (session's gate)": compiled, "every step run (the same gate, opaque)": every_step,
           "compiled pipeline in a task of its own": in_a_task, "tool.call alone": alone,
           "a response's executor, built (no call)": executors}
    for fn in fns.values():
        asyncio.run(fn())
    got: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for name, fn in (list(fns.items()) if r % 2 == 0 else list(reversed(fns.items()))):
            got[name].append(_timed(fn)[0] * 1e6 / n)
    print(f"machine: {machine()}")
    print(f"pipeline: {n} calls of {echo.name} per round, {args.rounds} rounds, median, CPU")
    for name, values in got.items():
        print(f"  {name:<40} {median(values):7.1f} us/call")
    a, b = median(got["compiled pipeline (session's gate)"]), median(got["every step run (the same gate, opaque)"])
    print(f"  ratio compiled/every step: {ratio(a, b)}")
    print(f"  a call's own task adds {median(got['compiled pipeline in a task of its own']) - a:.1f} us/call")
    return 0


def breakdown(args: argparse.Namespace) -> int:
    """Where the engine's time goes, by part (cProfile, cumulative time)."""
    cwd = workspace()
    echo = echo_tool()
    responses = tool_turns(args.k)
    print(f"machine: {machine()}")
    for label, options in (("no session file", engine_options(cwd, [echo])),
                           ("traced", engine_options(cwd, [echo], write_trace=True, sessions_dir=cwd / "sessions"))):
        async def engine(options: Any = options) -> None:
            for _ in range(args.n):
                await run_engine(responses, options)

        asyncio.run(engine())  # warm-up
        prof = cProfile.Profile(time.process_time)  # CPU time: a neighbour's load and fsync waits aside
        prof.enable()
        asyncio.run(engine())
        prof.disable()
        stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        total = sum(tt for (_cc, _nc, tt, _ct, _callers) in stats.values())
        print(f"breakdown, {label}: {args.n} conversations x ({args.k} tool turns + 1 answer), share of the "
              f"profiled time (cumulative; parts nest)")
        shown: dict[str, float] = {}
        order: list[str] = []
        current = ""
        for name, suffix, func in PARTS:
            current = name or current
            if current not in shown:
                shown[current] = 0.0
                order.append(current)
            shown[current] += sum(ct for (f, _line, fn), (_cc, _nc, _tt, ct, _c) in stats.items()
                                  if fn == func and f.replace("\\", "/").endswith(suffix))
        for name in order:
            print(f"  {100 * shown[name] / total:5.1f} %  {name}")
    return 0

def file_sizes(folder: Path, iterations: int) -> tuple[float, float]:
    """Records and bytes per iteration over the session files in ``folder`` (one conversation of
    ``iterations`` iterations each)."""
    files = list(folder.glob("*.jsonl"))
    if not files:
        return 0.0, 0.0
    records = sum(f.read_bytes().count(b"\n") for f in files)
    size = sum(f.stat().st_size for f in files)
    return records / (len(files) * iterations), size / (len(files) * iterations)


class _OneRecordPerMove(TraceWriter):
    """The writer with each move's messages and compaction boundary folded into the move's own record
    (``type`` ``move``, fields ``messages`` and ``boundary``): the shape issue 34 asked about, for
    measuring only. Its :meth:`on_step` is the writer's with the three writes made one."""

    def on_step(self, before: LoopState, step: Any, event: Any) -> None:
        if not self._on:
            return
        after = step.state
        rec: dict[str, Any] = {
            "type": "move", "from": before.phase.value, "to": after.phase.value,
            "trigger": step.trigger, "kind": step.edge.kind, "route": step.route}
        if not step.automatic:
            rec["event"] = to_record(event)
        was = self._snap if self._snap_of is before else before.snapshot_values()
        now = after.snapshot_values()
        self._snap_of, self._snap = after, now
        rec["turn"] = after.turn_count
        rec["changed"] = {k: snapshot_json(v) for k, a, v in zip(SNAPSHOT_KEYS, was, now, strict=True) if a != v}
        if after.terminal_reason is not None:
            rec["terminal_reason"] = after.terminal_reason.value
        chain = after.query_tracking.chain_id
        if chain != self._chain:
            rec["chain_id"] = self._chain = chain
        old, new = before.messages, after.messages
        added: tuple[Message, ...] = ()
        if new is not old:
            if appended(old, new):
                added = new[len(old):]
            else:
                compaction = getattr(event, "compaction", None)
                rec["boundary"] = {"trigger": compaction.trigger if compaction is not None else "swap",
                                   "pre_tokens": compaction.pre_tokens if compaction is not None else 0}
                added = new
        if added:
            rec["messages"] = [{"uuid": m.uuid, "role": m.role, "kind": m.kind,
                                "content": [dict(b) for b in m.content]} for m in added]
        self.write(rec, flush=False)
        self.flush_soon()


class _NoFsync(TraceWriter):
    """The writer without the fsync at close (the file flushed and closed): what that fsync costs."""

    def close(self) -> None:
        self._flush_due = False
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._on = self._sink is not None


class _NoFsyncNoFlush(_NoFsync):
    """... and without the flush per stretch between waits (the buffer reaches the file when full and
    at close): what the flushes cost."""

    def flush_soon(self) -> None:
        return None


def _as_written(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``_OneRecordPerMove``'s records in the shape the writer writes them (``seq`` left out)."""
    out: list[dict[str, Any]] = []
    for rec in records:
        rec = {k: v for k, v in rec.items() if k != "seq"}
        if rec["type"] != "move":
            out.append(rec)
            continue
        messages, boundary = rec.pop("messages", ()), rec.pop("boundary", None)
        out.append({**rec, "type": "transition"})
        if boundary is not None:
            out.append({"type": "compact_boundary", **boundary})
        out.extend({"type": "message", **m} for m in messages)
    return out


def trace(args: argparse.Namespace) -> int:
    """The session file's cost: as written against one record per move, whole runs and the writer alone."""
    import agentfsm.sessions.session as session_module
    from agentfsm.machine.state import Limits

    cwd = workspace()
    echo = echo_tool()
    responses = tool_turns(args.k)
    iterations = args.n * (args.k + 1)
    untraced = engine_options(cwd, [echo])
    written = engine_options(cwd, [echo], write_trace=True, sessions_dir=cwd / "written")
    per_move = engine_options(cwd, [echo], write_trace=True, sessions_dir=cwd / "per_move")
    system = bare_system(cwd)
    tools = {echo.name: echo}

    # the moves of one traced conversation, to feed both writers the same steps
    steps: list[tuple[Any, Any, Any]] = []
    on_step = TraceWriter.on_step

    def capture(self: TraceWriter, before: Any, step: Any, event: Any) -> None:
        steps.append((before, step, event))
        on_step(self, before, step, event)

    TraceWriter.on_step = capture  # type: ignore[method-assign]
    try:
        asyncio.run(run_engine(responses, engine_options(cwd, [echo], write_trace=True, sessions_dir=cwd / "x")))
    finally:
        TraceWriter.on_step = on_step  # type: ignore[method-assign]
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for writer in (TraceWriter(None, sink=mine.append), _OneRecordPerMove(None, sink=theirs.append)):
        for before, step, event in steps:
            writer.on_step(before, step, event)
    if _as_written(theirs) != [{k: v for k, v in r.items() if k != "seq"} for r in mine]:
        raise SystemExit("one record per move does not hold the same facts as the writer's records")

    def engine(options: Any, writer: type[TraceWriter]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            session_module.TraceWriter = writer  # type: ignore[misc]
            try:
                for _ in range(args.n):
                    result = await run_engine(responses, options)
                    if result.is_error or result.num_turns != args.k + 1:
                        raise SystemExit(f"engine run went wrong: {result.to_dict()}")
            finally:
                session_module.TraceWriter = TraceWriter  # type: ignore[misc]
        return run

    async def bare() -> None:
        ctx = ToolContext(cwd=cwd)
        for _ in range(args.n):
            await bare_loop(ScriptedModel(responses), "go", tools, system, ctx)

    fns = {"traced, as written (format 3)": engine(written, TraceWriter),
           "traced, one record per move": engine(per_move, _OneRecordPerMove),
           "traced, no fsync at close": engine(written, _NoFsync),
           "traced, no fsync, no flushes": engine(written, _NoFsyncNoFlush),
           "untraced": engine(untraced, TraceWriter), "30-line loop": bare}
    for fn in fns.values():
        asyncio.run(fn())
    got: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for name, fn in (list(fns.items()) if r % 2 == 0 else list(reversed(fns.items()))):
            got[name].append(_timed(fn)[0] * 1e6 / iterations)
    print(f"machine: {machine()}")
    print(f"trace: {args.n} conversations x ({args.k} tool turns + 1 answer) per round, {args.rounds} "
          f"alternating rounds, median, CPU per iteration")
    sizes = {"traced, as written (format 3)": file_sizes(cwd / "written", args.k + 1),
             "traced, one record per move": file_sizes(cwd / "per_move", args.k + 1)}
    for name, values in got.items():
        extra = f"   {sizes[name][0]:5.2f} records {sizes[name][1]:6.0f} bytes / iteration" if name in sizes else ""
        print(f"  {name:<32} {median(values):7.1f} us{extra}")
    a, b, u = (median(got[k]) for k in ("traced, as written (format 3)", "traced, one record per move", "untraced"))
    print(f"  ratio one record per move / as written: {ratio(b, a)} "
          f"(the trace's own share: {a - u:.1f} -> {b - u:.1f} us)")

    # the writer alone, on the moves recorded above: built, encoded, written, one flush per move
    sink = open(cwd / "moves.jsonl", "a", encoding="utf-8")  # closed below
    try:
        def writer_run(kind: type[TraceWriter]) -> Callable[[], None]:
            w = kind(None)
            w._fh, w._on = sink, True

            def run() -> None:
                w._snap_of = None
                for before, step, event in steps:
                    w.on_step(before, step, event)  # outside an event loop: flushed at once
            return run

        shapes = {"as written": writer_run(TraceWriter), "one record per move": writer_run(_OneRecordPerMove)}
        per: dict[str, list[float]] = {k: [] for k in shapes}
        loops = max(1, args.n * 5)
        for r in range(args.rounds):
            for name, fn in (list(shapes.items()) if r % 2 == 0 else list(reversed(shapes.items()))):
                c0 = time.process_time()
                for _ in range(loops):
                    fn()
                per[name].append((time.process_time() - c0) * 1e6 / (loops * len(steps)))
    finally:
        sink.close()
    print(f"  the writer alone, {len(steps)} moves of one conversation ({len(mine)} records as written, "
          f"{len(theirs)} one per move):")
    for name, values in per.items():
        print(f"    {name:<22} {median(values):6.2f} us/move CPU")

    # a session file's fixed cost: open and lock, header, result, close (with and without its fsync)
    folder = cwd / "fixed"
    limits = Limits()

    def session_file(fsync: bool) -> None:
        w = TraceWriter(folder / f"{time.perf_counter_ns()}.jsonl")
        w.session("bench", limits, str(cwd), "m")
        w.result({"subtype": "success", "is_error": False})
        if fsync:
            w.close()
        elif w._fh is not None:
            w._fh.close()
            w._fh = None

    for fsync in (True, False):
        cpu: list[float] = []
        wall: list[float] = []
        for _ in range(args.rounds):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.n):
                session_file(fsync)
            cpu.append((time.process_time() - c0) * 1e6 / args.n)
            wall.append((time.perf_counter() - w0) * 1e6 / args.n)
        print(f"  a session file's open, lock, header, result, close{' and fsync' if fsync else ', no fsync'}: "
              f"{median(cpu):6.1f} us CPU {median(wall):7.1f} us wall per session")
    return 0


def growth(args: argparse.Namespace) -> int:
    """How the per-iteration cost grows with concurrent sessions and with the conversation's length."""
    cwd = workspace()
    echo = echo_tool()
    traced = engine_options(cwd, [echo], write_trace=True, sessions_dir=cwd / "sessions")
    system = bare_system(cwd)
    tools = {echo.name: echo}
    ctx = ToolContext(cwd=cwd)

    def pair(sessions: int, k: int) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
        responses = tool_turns(k)

        async def one_engine() -> None:
            result = await run_engine(responses, traced)
            if result.is_error or result.num_turns != k + 1:
                raise SystemExit(f"engine run went wrong: {result.to_dict()}")

        async def one_bare() -> None:
            final = await bare_loop(ScriptedModel(responses), "go", tools, system, ctx)
            if final[-1].get("text") != "done":
                raise SystemExit(f"bare loop went wrong: {final}")

        async def engine() -> None:
            await asyncio.gather(*(one_engine() for _ in range(sessions)))

        async def bare() -> None:
            await asyncio.gather(*(one_bare() for _ in range(sessions)))

        return engine, bare

    print(f"machine: {machine()}")
    print(f"growth: CPU per iteration (model turn), traced engine against the bare loop, median of rounds "
          f"(at most {args.rounds})")
    print(f"  {'sessions':>8} {'turns':>6} {'rounds':>6} {'engine us':>10} {'bare us':>9} {'ratio':>7}")
    asyncio.run(pair(1, args.k)[0]())  # warm-up
    for sessions, k in ((1, args.k), (10, args.k), (100, args.k), (1000, args.k), (1, 10), (1, 100), (1, 1000)):
        iterations = sessions * (k + 1)
        rounds = max(1, min(args.rounds, 20_000 // iterations))
        engine, bare = pair(sessions, k)
        eng: list[float] = []
        base: list[float] = []
        for r in range(rounds):
            order = [(engine, eng), (bare, base)]
            for fn, into in (order if r % 2 == 0 else order[::-1]):
                into.append(_timed(fn)[0] * 1e6 / iterations)
        e, b = median(eng), median(base)
        print(f"  {sessions:>8} {k:>6} {rounds:>6} {e:10.1f} {b:9.1f} {ratio(e, b):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
