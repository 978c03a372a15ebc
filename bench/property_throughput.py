"""Property-test throughput: whole in-process loop runs per second, as a hypothesis example pays them.

One run = a new Session on a new ScriptedModel, one tool turn (the Echo tool) and a final answer,
each in its own ``asyncio.run`` (a property test starts a fresh event loop per example). Measured:

* the 30-line teaching loop (``bench/_common.bare_loop``) on the same script and tool (the baseline,
  same process, same run);
* the engine without a trace (``Options(write_trace=False)``);
* the engine writing its session file (one JSONL record per message/move/request, flushed);
* the engine under ``hypothesis.given`` (no trace): examples per second including hypothesis's own
  data generation and bookkeeping — skipped when hypothesis is not installed;
* ``agentfsm.testing.stateful.run_loop`` when present: the property suite's harness (scratch workspace,
  trace, records read back) — what ``tests/test_properties.py`` pays per example.

    python bench/property_throughput.py [--runs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    bare_loop,
    bare_system,
    echo_tool,
    engine_options,
    machine,
    run_engine,
    tool_turns,
    workspace,
)

from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext


def rate(fn: Callable[[], None], runs: int) -> tuple[float, float]:
    """(runs per second of wall time, CPU ms per run) over ``runs`` calls, after one warm-up call."""
    fn()
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(runs):
        fn()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return runs / wall, cpu / runs * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300, help="runs per measurement (default 300)")
    args = ap.parse_args(argv)

    cwd = workspace()
    echo = echo_tool()
    script = tool_turns(1)
    system = bare_system(cwd)
    ctx = ToolContext(cwd=cwd)
    no_trace = engine_options(cwd, [echo])
    sessions = cwd / "sessions"
    with_trace = engine_options(cwd, [echo], write_trace=True, sessions_dir=sessions)

    def bare() -> None:
        asyncio.run(bare_loop(ScriptedModel(script), "go", {echo.name: echo}, system, ctx))

    def engine() -> None:
        result = asyncio.run(run_engine(script, no_trace))
        if result.is_error:
            raise SystemExit(f"engine run went wrong: {result.to_dict()}")

    def traced() -> None:
        result = asyncio.run(run_engine(script, with_trace))
        if result.is_error:
            raise SystemExit(f"engine run went wrong: {result.to_dict()}")

    rows: list[tuple[str, float, float, str]] = []
    b = rate(bare, args.runs)
    rows.append(("bare loop (30 lines)", *b, "baseline"))
    e = rate(engine, args.runs)
    rows.append(("engine, no trace", *e, f"{e[0] / b[0]:.2f}x of bare"))
    t = rate(traced, args.runs)
    shutil.rmtree(sessions, ignore_errors=True)
    rows.append(("engine, session file written", *t, f"{t[0] / e[0]:.2f}x of no trace"))
    rows.append(hypothesis_row(script, no_trace, args.runs, e[0]))
    rows.append(run_loop_row(echo, args.runs, e[0]))

    print(f"machine: {machine()}")
    print(f"property throughput: one tool turn + one answer per run, a fresh asyncio.run each, "
          f"{args.runs} runs per row")
    print(f"  {'loop':<34} {'runs/s':>8} {'CPU ms/run':>10}  note")
    for name, per_s, cpu_ms, note in rows:
        shown = f"{per_s:8.0f} {cpu_ms:10.2f}" if per_s > 0 else f"{'n/a':>8} {'':>10}"
        print(f"  {name:<34} {shown}  {note}")
    return 0


def hypothesis_row(script: object, options: object, runs: int, plain: float) -> tuple[str, float, float, str]:
    name = "engine under hypothesis.given"
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import strategies as st
    except ImportError:
        return name, 0.0, 0.0, "hypothesis not installed (pip install -e '.[test]')"

    @settings(max_examples=runs, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(prompt=st.text(min_size=1, max_size=20))
    def prop(prompt: str) -> None:
        result = asyncio.run(run_engine(script, options, prompt=prompt))  # type: ignore[arg-type]
        assert not result.is_error

    per_s, cpu = rate(prop, 1)  # one call of prop = `runs` examples
    return name, per_s * runs, cpu / runs, f"{per_s * runs / plain:.2f}x of plain runs"


def run_loop_row(echo: object, runs: int, plain: float) -> tuple[str, float, float, str]:
    name = "agentfsm.testing.stateful.run_loop"
    try:
        from agentfsm.testing.stateful import run_loop
    except ImportError as exc:
        return name, 0.0, 0.0, f"not available ({exc})"
    script = list(tool_turns(1).responses)

    def one() -> None:
        run = run_loop(script, tools=[echo])  # type: ignore[list-item]
        if run.result.is_error:
            raise SystemExit(f"run_loop went wrong: {run.result}")

    try:
        per_s, cpu = rate(one, max(1, runs // 3))
    except Exception as exc:  # another team's harness: report, do not fail the bench
        return name, 0.0, 0.0, f"failed: {type(exc).__name__}: {exc}"
    return name, per_s, cpu, f"{per_s / plain:.2f}x of plain runs (trace + audit per run)"


if __name__ == "__main__":
    sys.exit(main())
