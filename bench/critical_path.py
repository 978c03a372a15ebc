"""Critical path: do tools start at their block's ``content_block_stop``, overlapping the stream?

One scripted response streams three concurrency-safe tool_use blocks with a pause after each block
(``--gap``, default 0.2 s), then a final answer; each tool takes ``--tool`` seconds (default 0.3 s).
The run goes through the real Session / Driver / StreamingToolExecutor; the in-process ScriptedModel
is the default transport, ``--sse`` serves the same script over real SSE from a loopback
ScriptedServer through the anthropic SDK transport instead.

Printed per repeat and as the median:

* wall   — Session.run from start to result;
* ideal  — the last tool_use block's stop, as *measured in this run* (the time the driver emitted
  that block), plus the tool's duration; nothing can finish earlier, since that tool cannot start
  before its block is complete. (The schedule's own figure is printed alongside.)
* naive  — what a loop that waits for ``message_stop`` and runs the tools one after another takes:
  the measured stream time plus 3 × tool time (the 30-line teaching loop).

Target: wall / ideal ≤ 1.05. No assertion: the figures are printed for the reader.

    python bench/critical_path.py [--repeats 5] [--gap 0.2] [--tool 0.3] [--sse]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MODEL, engine_options, machine, median, workspace

from agentfsm.llm.model import ModelClient
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import Scenario, StreamedResponse, TextBlock, ToolUseBlock
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import Tool, ToolContext, tool

N_TOOLS = 3


def script(gap: float) -> Scenario:
    blocks = tuple(ToolUseBlock(f"toolu_cp_{i}", "Sleep", {"text": f"call {i}"}) for i in range(N_TOOLS))
    return Scenario(prompt="go", responses=(
        StreamedResponse(blocks=blocks, stop_reason="tool_use", block_delay_s=gap),
        StreamedResponse(blocks=(TextBlock("all three done"),)),
    ))


def sleep_tool(duration: float, starts: dict[str, float]) -> Tool:
    @tool("Sleep", "Wait a fixed time, then echo the text.",
          {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
          concurrency_safe=True)
    async def _sleep(input: Mapping[str, Any], ctx: ToolContext) -> str:
        starts[ctx.tool_use_id] = time.perf_counter()
        await asyncio.sleep(duration)
        return str(input["text"])

    return _sleep


async def one_run(client: ModelClient, gap: float, duration: float, cwd: Path) -> dict[str, float]:
    starts: dict[str, float] = {}
    block_stops: list[float] = []
    results: list[float] = []

    def emit(msg: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        if msg.get("type") == "assistant":
            content = msg["message"]["content"]
            if content and content[0].get("type") == "tool_use":
                block_stops.append(now)  # the driver emits each block at its content_block_stop
        elif msg.get("type") == "user":
            results.append(now)

    options = engine_options(cwd, [sleep_tool(duration, starts)])
    session = Session(options, client=client, emit=emit)
    t0 = time.perf_counter()
    result = await session.run("go")
    wall = time.perf_counter() - t0
    await session.aclose()
    if result.is_error or len(block_stops) != N_TOOLS or len(starts) != N_TOOLS:
        raise SystemExit(f"the run went wrong: {result.to_dict()}")
    last_stop = block_stops[-1] - t0
    # the stream itself ends one gap after the last block (the scripted pause before message_delta)
    stream_end = last_stop + gap
    return {
        "wall": wall,
        "ideal": max(last_stop + duration, stream_end),
        "ideal_schedule": max((N_TOOLS - 1) * gap + duration, N_TOOLS * gap),
        "naive": stream_end + N_TOOLS * duration,
        "last_stop": last_stop,
        "first_start": min(starts.values()) - t0,
        "last_start": max(starts.values()) - t0,
        "first_result": results[0] - t0 if results else float("nan"),
    }


async def run_all(args: argparse.Namespace) -> list[dict[str, float]]:
    cwd = workspace()
    out = []
    server = None
    if args.sse:
        from agentfsm.llm.transport import AnthropicTransport
        from agentfsm.testing.server import ScriptedServer

        # per-session counting: each repeat is a new session (its own metadata.user_id)
        server = ScriptedServer(script(args.gap), per_session=True)
        base_url = await server.start_async()
    try:
        for _ in range(args.repeats):
            if server is not None:
                client: ModelClient = AnthropicTransport(api_key="sk-test", base_url=base_url, max_retries=0)
            else:
                client = ScriptedModel(script(args.gap))
            out.append(await one_run(client, args.gap, args.tool, cwd))
    finally:
        if server is not None:
            await server.stop_async()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gap", type=float, default=0.2, help="pause after each tool_use block (s)")
    ap.add_argument("--tool", type=float, default=0.3, help="duration of each tool call (s)")
    ap.add_argument("--sse", action="store_true", help="real SSE over loopback through the anthropic SDK")
    args = ap.parse_args(argv)
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-test")

    runs = asyncio.run(run_all(args))
    print(f"machine: {machine()}")
    transport = "loopback SSE via anthropic SDK" if args.sse else "in-process ScriptedModel"
    print(f"critical path: {N_TOOLS} concurrency-safe tool_use blocks, {args.gap:g} s apart, tools of "
          f"{args.tool:g} s, {transport}, model {MODEL}")
    print(f"{'run':>4} {'wall s':>8} {'ideal s':>8} {'naive s':>8} {'wall/ideal':>10} {'wall/naive':>10}"
          f" {'last stop':>9} {'tool starts (s)':>17}")
    for i, r in enumerate(runs):
        print(f"{i + 1:>4} {r['wall']:8.3f} {r['ideal']:8.3f} {r['naive']:8.3f} "
              f"{r['wall'] / r['ideal']:10.3f} {r['wall'] / r['naive']:10.3f} {r['last_stop']:9.3f}"
              f"   {r['first_start']:.3f} .. {r['last_start']:.3f}")
    wall = median([r["wall"] for r in runs])
    ideal = median([r["ideal"] for r in runs])
    naive = median([r["naive"] for r in runs])
    print(f"median: wall {wall:.3f} s, ideal {ideal:.3f} s "
          f"(schedule says {runs[0]['ideal_schedule']:.3f} s), naive sequential {naive:.3f} s")
    print(f"  wall/ideal = {wall / ideal:.3f}  (target <= 1.05)   wall/naive = {wall / naive:.3f}")
    lag_ms = median([r["last_start"] - r["last_stop"] for r in runs]) * 1000
    first = median([r["first_result"] for r in runs])
    stop = median([r["last_stop"] for r in runs]) + args.gap
    print(f"  the last tool started {lag_ms:.1f} ms after its block stop; the first result was out at "
          f"{first:.3f} s, before message_stop at ~{stop:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
