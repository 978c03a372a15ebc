"""A long session: 1,000 model turns in one run, each a tool call with a small result, with the
context window small enough that auto-compaction happens several times.

Measured, per turn (a turn = from one ``call`` move to the next): CPU time and the session file's
growth. Printed: CPU per turn and bytes per turn of the first and the last 100 turns and their ratios
(linear cost means ratios near 1), how often compaction ran, the file's size, the peak of traced
Python memory against the size of the live context at the end, and how long ``--resume`` of the
finished session takes to load its history. The baseline is the same run's first 100 turns.

    python bench/long_session.py [--turns 1000] [--window 40000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import echo_tool, engine_options, machine, ratio, workspace

from agentfsm.llm.model import ModelRequest
from agentfsm.machine import prompts
from agentfsm.machine.state import Limits
from agentfsm.runtime.compact import chars_of
from agentfsm.sessions.resume import load_history
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import StreamedResponse, TextBlock, ToolUseBlock
from agentfsm.testing.scripted import ScriptedModel


class Script:
    """Answers each main request with a tool call until ``turns`` are done, then a final text; a
    compaction request with a short summary. Reports usage as the request's size (chars/4), as a
    real API would, so the context estimate grows with the history."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.calls = 0
        self.compactions = 0

    def __call__(self, request: ModelRequest, _n: int) -> Any:
        # a real API counts the prompt on its side; the script estimates it from the message count,
        # so the bench measures the engine and not the scripted model's own bookkeeping
        tokens = 2000 + 120 * len(request.messages)
        usage = {"input_tokens": tokens, "output_tokens": 30}
        last = request.messages[-1]["content"]
        texts = [b.get("text", "") for b in last if isinstance(b, dict) and b.get("type") == "text"]
        if texts and texts[-1].startswith(prompts.COMPACT_INSTRUCTION):
            self.compactions += 1
            return StreamedResponse(blocks=(TextBlock(f"Summary {self.compactions}: echoed turns so far."),),
                                    usage=usage)
        if self.calls >= self.turns:
            return StreamedResponse(blocks=(TextBlock("done"),), usage=usage)
        self.calls += 1
        block = ToolUseBlock(f"toolu_{self.calls:05d}", "Echo", {"text": f"turn {self.calls} " + "x" * 200})
        return StreamedResponse(blocks=(block,), stop_reason="tool_use", usage=usage)


class TurnClock:
    """A step observer: the CPU time and the session file's size at each ``call`` move."""

    def __init__(self, trace: Path) -> None:
        self.trace = trace
        self.cpu: list[float] = []
        self.size: list[int] = []

    def on_step(self, before: Any, step: Any, event: Any) -> None:
        if step.trigger == "call":
            self.cpu.append(time.process_time())
            self.size.append(self.trace.stat().st_size if self.trace.exists() else 0)


def per_turn(marks: list[float] | list[int], first: bool, n: int = 100) -> float:
    window = marks[: n + 1] if first else marks[-(n + 1):]
    return (window[-1] - window[0]) / (len(window) - 1)


async def run(turns: int, window: int, traced: bool) -> dict[str, Any]:
    cwd = workspace()
    options = engine_options(cwd, [echo_tool()], write_trace=True, sessions_dir=cwd / "sessions")
    limits = Limits(context_window=window, auto_compact_buffer=window // 5, blocking_buffer=window // 20,
                    rapid_refill_turns=0)
    import attrs

    options = attrs.evolve(options, limits=limits)
    script = Script(turns)
    session = Session(options, client=ScriptedModel(script, keep_requests=False))
    assert session.trace_path is not None
    clock = TurnClock(session.trace_path)
    session.observers = (clock,)
    if traced:
        tracemalloc.start()
    try:
        result = await session.run("go")
    finally:
        await session.aclose()
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    if traced:
        tracemalloc.stop()
    t0 = time.perf_counter()
    history = load_history(session.trace_path)
    resume_s = time.perf_counter() - t0
    live = chars_of([[dict(b) for b in m.content] for m in session.history])
    return {"result": result, "clock": clock, "compactions": script.compactions, "peak": peak,
            "file": session.trace_path.stat().st_size, "resume_s": resume_s, "history": len(history),
            "live_chars": live}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=1000, help="model turns with a tool call (default 1000)")
    ap.add_argument("--window", type=int, default=40_000, help="context window in tokens (default 40000)")
    args = ap.parse_args(argv)
    out = asyncio.run(run(args.turns, args.window, traced=False))
    # memory is measured on two run lengths: bounded by the live context means the longer run
    # peaks no higher than the shorter one
    mem_short = asyncio.run(run(max(args.turns // 4, 50), args.window, traced=True))
    mem = asyncio.run(run(max(args.turns // 2, 100), args.window, traced=True))
    clock: TurnClock = out["clock"]
    first_cpu, last_cpu = per_turn(clock.cpu, True) * 1e3, per_turn(clock.cpu, False) * 1e3
    first_b, last_b = per_turn(clock.size, True), per_turn(clock.size, False)
    print(f"machine: {machine()}")
    print(f"long session: {out['result'].num_turns} turns, {out['compactions']} compactions, "
          f"terminal_reason {out['result'].terminal_reason.value}")
    print(f"  CPU per turn:    first 100 {first_cpu:7.2f} ms   last 100 {last_cpu:7.2f} ms   "
          f"ratio {ratio(last_cpu, first_cpu)}   (goal <= 1.2x)")
    print(f"  file per turn:   first 100 {first_b:7.0f} B    last 100 {last_b:7.0f} B    "
          f"ratio {ratio(last_b, first_b)}   (goal <= 1.2x)")
    print(f"  session file:    {out['file'] / 2**20:.2f} MiB")
    print(f"  --resume load:   {out['resume_s'] * 1e3:.0f} ms for {out['history']} messages   (goal < 1 s)")
    print(f"  traced memory:   peak {mem_short['peak'] / 2**20:.2f} MiB over {mem_short['result'].num_turns} turns, "
          f"{mem['peak'] / 2**20:.2f} MiB over {mem['result'].num_turns} turns   ratio "
          f"{ratio(mem['peak'], mem_short['peak'])} (bounded: ~1x)")
    mid_cpu = (clock.cpu[200] - clock.cpu[100]) / 100 * 1e3 if len(clock.cpu) > 200 else float("nan")
    print(f"  (turns 100-200, past the warm-up: {mid_cpu:.2f} ms per turn; last 100 / that: "
          f"{ratio(last_cpu, mid_cpu)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
