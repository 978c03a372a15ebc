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
    ap.add_argument("--growth", action="store_true",
                    help="CPU per iteration from 1 to 1,000 sessions and from 10 to 1,000 turns, with the bare loop")
    ap.add_argument("--breakdown", action="store_true",
                    help="profile the engine and print the share of each of its parts (issue 34)")
    ap.add_argument("--pipeline", action="store_true",
                    help="one tool call: compiled pipeline, every step, the tool alone (issue 34)")
    args = ap.parse_args(argv)
    if args.growth:
        return growth(args)
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
