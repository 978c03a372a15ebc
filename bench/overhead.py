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
    args = ap.parse_args(argv)
    if args.growth:
        return growth(args)

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
