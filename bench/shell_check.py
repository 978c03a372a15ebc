"""The permission check of a long Bash command: linear in its length, and off the event loop.

For command shapes that stress the parser (a long ``&&`` chain, a long pipeline, many arguments,
deep ``$( )`` nesting, one long word, a long heredoc) at growing sizes up to the analysis cap, it times
the whole permission decision (:meth:`PermissionPolicy.evaluate` with a ``Bash(rm:*)`` and a
``Read(...)`` deny rule: parse, walk, rules, paths) against ``bash -n`` on the same text — bash's own
parser, a linear baseline measured in the same run — and prints µs per byte and the growth from
the smallest to the largest size (linear: the size ratio, 16×). Broken input whose tree-sitter
error recovery is super-linear (a pipeline without its last command) is listed too.

Then the event loop: a ticker coroutine runs while :meth:`PermissionPolicy.decide` judges the
largest command; its longest gap (the event loop's stall) is printed against the ticker alone.

    python bench/shell_check.py [--sizes 8,32,64,128]   # sizes in KB
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, ratio

from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.tools import BashTool
from agentfsm.tools.shell import MAX_COMMAND_BYTES, _analyse, _walked

SHAPES = {
    "&& chain": ("echo a && ", "true"),
    "pipeline": ("cat | ", "cat"),
    "many args": ("echo " + "a " * 8, ""),
    "$( ) nesting": ("$(echo ", ""),
    "one long word": ("x", ""),
    "heredoc body": ("", ""),
    "broken pipeline (no last command)": ("cat | ", ""),
}


def command(shape: str, size: int) -> str:
    size -= 64  # room for the frame around the shape: every command stays within the analysis cap
    unit, end = SHAPES[shape]
    if shape == "heredoc body":
        return "cat <<'EOF' > out.txt\n" + ("line of text\n" * (size // 13)) + "EOF\n"
    if shape == "one long word":
        return "echo " + "x" * size
    if shape == "$( ) nesting":
        depth = size // 8
        return "echo " + "$(echo " * depth + "x" + ")" * depth
    if shape == "many args":
        return (unit * (size // len(unit)))[:size]
    return unit * ((size - len(end)) // len(unit)) + end


def time_decision(policy: PermissionPolicy, text: str, rounds: int) -> float:
    out = []
    for _ in range(rounds):
        _analyse.cache_clear()
        _walked.cache_clear()
        start = time.perf_counter()
        policy.evaluate(BashTool(), {"command": text})
        out.append(time.perf_counter() - start)
    return median(out)


def time_bash_n(text: str, rounds: int) -> float:
    bash = shutil.which("bash")
    if bash is None:
        return float("nan")
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run([bash, "-n"], input=text.encode(), capture_output=True)
        out.append(time.perf_counter() - start)
    return median(out)


async def loop_stall(policy: PermissionPolicy, text: str) -> tuple[float, float]:
    """(longest gap of a 1 ms ticker while the decision runs, longest gap of the ticker alone), ms."""

    async def ticker(stop: asyncio.Event) -> float:
        worst, last = 0.0, time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now
        return worst * 1000

    _analyse.cache_clear()
    _walked.cache_clear()
    stop = asyncio.Event()
    tick = asyncio.ensure_future(ticker(stop))
    await policy.decide(BashTool(), {"command": text})
    stop.set()
    busy = await tick
    stop = asyncio.Event()
    tick = asyncio.ensure_future(ticker(stop))
    await asyncio.sleep(0.5)
    stop.set()
    return busy, await tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,8,32,64,128", help="command sizes in KB")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) * 1024 for s in args.sizes.split(",")]
    sizes = [min(s, MAX_COMMAND_BYTES) for s in sizes]
    print(machine())
    ws = Path(tempfile.mkdtemp(prefix="agentfsm-bench-"))
    policy = PermissionPolicy.build(ws, mode="bypassPermissions", deny=["Bash(rm:*)", "Read(./secret.txt)"])
    print(f"\n{'shape':36} " + " ".join(f"{s // 1024:>8}KB" for s in sizes) + "   growth   bash -n   ratio")
    for shape in SHAPES:
        times = [time_decision(policy, command(shape, s), args.rounds) for s in sizes]
        base = time_bash_n(command(shape, sizes[-1]), args.rounds)
        growth = times[-1] / times[0] if times[0] > 0 else float("nan")
        cells = " ".join(f"{t * 1000:8.1f}ms" for t in times)
        print(f"{shape:36} {cells}   {growth:5.1f}x  {base * 1000:6.1f}ms  {ratio(times[-1], base)}")
    per_byte = time_decision(policy, command("&& chain", sizes[-1]), args.rounds) / sizes[-1] * 1e6
    print(f"\n&& chain at {sizes[-1] // 1024} KB: {per_byte:.2f} µs/byte (size growth {sizes[-1] / sizes[0]:.0f}x)")
    busy, idle = asyncio.run(loop_stall(policy, command("pipeline", sizes[-1])))
    print(f"event loop, longest stall while judging a {sizes[-1] // 1024} KB pipeline: {busy:.1f} ms "
          f"(ticker alone: {idle:.1f} ms; {ratio(busy, idle)})")
    over = "x" * (MAX_COMMAND_BYTES * 8)
    start = time.perf_counter()
    policy.evaluate(BashTool(), {"command": over})
    print(f"a {len(over) // 1024} KB command (over the {MAX_COMMAND_BYTES // 1024} KB cap, not analysed): "
          f"{(time.perf_counter() - start) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
