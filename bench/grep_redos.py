"""Grep on a catastrophic-backtracking pattern: ``(a+)+$`` over a 49-byte file, against a literal
pattern over the same file in the same run (both through GrepTool and ripgrep), and Python's ``re`` —
the engine of the fallback Grep no longer has — on the same pattern over growing inputs, to show
why it hung (each added byte doubles its time; it is stopped at a budget, never run on 49 bytes).

    python bench/grep_redos.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from pathlib import Path

from _common import machine

from agentfsm.tools.base import NoFileRules, ToolContext
from agentfsm.tools.grep import GrepTool

REDOS = "(a+)+$"
RE_BUDGET_S = 2.0


async def grep_wall(root: Path, pattern: str) -> float:
    ctx = ToolContext(cwd=root, file_access=NoFileRules())
    start = time.perf_counter()
    await GrepTool().call({"pattern": pattern, "output_mode": "content"}, ctx)
    return time.perf_counter() - start


def python_re(n: int) -> float:
    text = "a" * n + "!"
    start = time.perf_counter()
    re.search(REDOS, text)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    print(machine())
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "redos.txt").write_text("a" * 48 + "!")  # 49 bytes
        redos, literal = [], []
        for _ in range(args.rounds):  # alternating, so drift hits both alike
            redos.append(asyncio.run(grep_wall(root, REDOS)))
            literal.append(asyncio.run(grep_wall(root, "a")))
    r, lit = statistics.median(redos), statistics.median(literal)
    print(f"Grep {REDOS!r} over 49 bytes: median {r * 1000:.1f} ms, max {max(redos) * 1000:.1f} ms")
    print(f"Grep 'a' over the same file:    median {lit * 1000:.1f} ms")
    print(f"ratio (ReDoS / literal): {r / lit:.2f}  (goal: answers in under 1 s)")
    print(f"Python re on {REDOS!r} (the removed fallback's engine), stopped past {RE_BUDGET_S:g} s:")
    n = 16
    while True:
        t = python_re(n)
        print(f"  {n + 1:3d} bytes: {t * 1000:10.1f} ms")
        if t > RE_BUDGET_S or n >= 48:
            break
        n += 2
    if n < 48:
        print(f"  at this rate 49 bytes would take about {t * 2 ** (48 - n) / 3600:.0f} h")


if __name__ == "__main__":
    main()
