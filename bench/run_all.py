"""Every speed figure of issues 19 and 34 in one table: each bench run as a child, its printed figures read
back, and each set against its goal and the baseline that bench measured in the same run.

    python bench/run_all.py [--quick] [--claude PATH | --no-claude]

Runs, one after another (about ten minutes on two busy cores; ``--quick`` shortens the rounds):
``cli.py`` (``-p`` CPU against Claude Code, when it is found: ``--claude``, ``$AGENTFSM_CLAUDE``, the
oracle under /work/scratch/cc, or ``claude`` on PATH), ``startup.py`` (imports, spawn to the first
request, result to exit), ``overhead.py`` (engine µs per iteration against the 30-line loop),
``overhead.py --growth`` (per-iteration cost from 1 to 1,000 sessions and 10 to 1,000 turns),
``moves.py`` (one move against a plain table walk and transitions' stock classes),
``sessions.py --scale`` with default and tuned gc (turns/s, p50/p99, gc share and memory at 1,000
sessions), ``critical_path.py`` (wall against
ideal), ``property_throughput.py`` (whole runs per second). ``cli.py`` also runs
``bare_sdk.py``, the bare-SDK peer of the ``-p`` row. With the Temporal extra, ``temporal.py --workers 4``
(read-probe sessions on four workers) and ``temporal_floor.py`` (Temporal's own floor for the same
shape, no agentfsm code) give the Temporal rows (about five more minutes). The full output of each bench is printed
above the table. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine

HERE = Path(__file__).resolve().parent
ORACLE = Path("/work/scratch/cc/node_modules/@anthropic-ai/claude-code/bin/claude.exe")

Row = tuple[str, str, str, str, str]  # what, measured, baseline (same run), goal, met


class Steps:
    """Progress over the benches (rich): on a terminal, a bar with the bench running, how many are done
    and the time spent, below the benches' own output as it comes; not on a terminal, nothing but
    that output (a log file or CI gets no control sequences)."""

    def __init__(self, total: int) -> None:
        self.progress: Any = None
        self.task: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.task = self.progress.add_task("benches", total=total)

    def __enter__(self) -> Steps:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def start(self, what: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=f"{what} (Ctrl-C stops)")

    def done(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.task)


STEPS: Steps | None = None


def run(script: str, *args: str) -> str:
    """The bench's stdout (echoed line by line as it comes), or '' when it failed."""
    cmd = [sys.executable, str(HERE / script), *args]
    print(f"$ {' '.join(cmd[1:])}", flush=True)
    if STEPS is not None:
        STEPS.start(" ".join(cmd[1:2]).rsplit("/", 1)[-1] + (" " + " ".join(args) if args else ""))
    with tempfile.TemporaryFile(mode="w+") as err, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", flush=True)
        code = proc.wait(timeout=1800)
        err.seek(0)
        tail = err.read()[-800:]
    if STEPS is not None:
        STEPS.done()
    if code != 0:
        print(f"  ({script} exited {code}: {tail})", flush=True)
    return "".join(lines)


def grab(pattern: str, text: str, conv: Callable[[str], float] = float) -> float | None:
    m = re.search(pattern, text, re.MULTILINE)
    return conv(m.group(1)) if m else None


def yes(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "no")


def fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def claude_path(arg: str | None, off: bool) -> str | None:
    if off:
        return None
    for cand in (arg, os.environ.get("AGENTFSM_CLAUDE"), str(ORACLE) if ORACLE.exists() else None,
                 shutil.which("claude")):
        if cand:
            return cand
    return None


def cli_rows(out: str) -> list[Row]:
    ours = grab(r"^\s+agentfsm \(python -m agentfsm -p\)\s+([\d.]+)", out)
    theirs = grab(r"^\s+claude \S*\s+([\d.]+)", out)
    sdk = grab(r"^\s+python -c 'import anthropic'\s+([\d.]+)", out)
    peer = grab(r"^\s+bare SDK script \(bare_sdk.py\)\s+([\d.]+)", out)
    ratio = ours / theirs if ours and theirs else None
    to_peer = ours / peer if ours and peer else None
    rows: list[Row] = [("`-p` read probe, whole-process CPU, against the bare-SDK script (issue 34)",
                        fmt(ours, ".2f", " s"), f"bench/bare_sdk.py {fmt(peer, '.2f', ' s')}", "≤ 1.0× the bare SDK",
                        f"{yes(None if to_peer is None else to_peer <= 1.0)} ({fmt(to_peer, '.2f', '×')})"),
                       ("`-p` read probe, whole-process CPU, against Claude Code", fmt(ours, ".2f", " s"),
                        f"Claude Code {fmt(theirs, '.2f', ' s')}", "retired by issue 34 (was ≤ 0.5×)",
                        fmt(ratio, ".2f", "×"))]
    if ours is not None and sdk is not None:
        own = max(0.0, ours - sdk)  # two medians of noisy runs: a negative difference means "about none"
        rows.append(("… of which `import anthropic` alone", fmt(sdk, ".2f", " s"), "—", "—",
                     f"agentfsm's own ≈ {own:.2f} s" + (f" = {own / theirs:.2f}× Claude Code" if theirs else "")))
    return rows


def startup_rows(out: str) -> list[Row]:
    first = grab(r"spawn to first request ([\d.]+) s", out)
    tail = grab(r"result line to exit ([\d.]+) ms", out)
    scripted = grab(r"^\s+agentfsm -p --scripted\s+([\d.]+)", out)
    floor = grab(r"^\s+python -c pass \(floor\)\s+([\d.]+)", out)
    helped = grab(r"^\s+agentfsm --help\s+([\d.]+)", out)
    heavy = re.search(r"imports of `agentfsm -p \(SDK, loopback\)`: (\d+) modules.*heavy packages imported: ([^\n]*)",
                      out)
    return [
        ("`-p` spawn to first request (SDK path)", fmt(first, ".2f", " s"), "—", "≤ 0.5 s on an idle core",
         yes(None if first is None else first <= 0.5)),
        ("`-p` result line to process exit", fmt(tail, ".1f", " ms"), "—", "≤ 50 ms",
         yes(None if tail is None else tail <= 50)),
        ("`-p --scripted` (no SDK) / `--help`, CPU", f"{fmt(scripted, '.2f', ' s')} / {fmt(helped, '.2f', ' s')}",
         f"`python -c pass` {fmt(floor, '.3f', ' s')}", "—", "—"),
        ("`-p` (SDK) imports", f"{heavy.group(1)} modules" if heavy else "n/a", "—",
         "no temporalio, mcp, pygraphviz, jsonschema", yes(None if heavy is None else not any(
             p in heavy.group(2) for p in ("temporalio", "mcp", "pygraphviz", "jsonschema")))),
    ]


def overhead_rows(out: str) -> list[Row]:
    bare = grab(r"bare loop \(30 lines\):\s+([\d.]+) us/iter CPU", out)
    plain = grab(r"engine \(Session\):\s+([\d.]+) us/iter CPU", out)
    traced = grab(r"engine, traced:\s+([\d.]+) us/iter CPU", out)
    records = grab(r"session file per iteration:\s+([\d.]+) records", out)
    size = grab(r"session file per iteration:\s+[\d.]+ records, ([\d.]+) bytes", out)
    t_ratio = traced / bare if traced and bare else None
    p_ratio = plain / bare if plain and bare else None
    return [("engine per iteration, traced (the default)", fmt(traced, ".0f", " µs CPU"),
             f"30-line loop {fmt(bare, '.0f', ' µs')}", "≤ 4× the 30-line loop (issue 34)",
             f"{yes(None if t_ratio is None else t_ratio <= 4)} ({fmt(t_ratio, '.1f', '×')})"),
            ("engine per iteration, no session file", fmt(plain, ".0f", " µs CPU"),
             f"30-line loop {fmt(bare, '.0f', ' µs')}", "≤ 3× the 30-line loop (issue 34)",
             f"{yes(None if p_ratio is None else p_ratio <= 3)} ({fmt(p_ratio, '.1f', '×')})"),
            ("session file per iteration, traced (records, bytes)",
             f"{fmt(records, '.2f', ' records')}, {fmt(size, '.0f', ' bytes')}", "—",
             "(reported; one record per move: overhead.py --trace)", "—")]


def growth_rows(out: str) -> list[Row]:
    rows: list[Row] = []
    for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x", out, re.MULTILINE):
        sessions, turns, eng, bare, times = m.groups()
        rows.append((f"engine per iteration, traced, {int(sessions):,} session(s) × {turns} tool turns",
                     f"{float(eng):.0f} µs CPU", f"30-line loop {float(bare):.0f} µs", "(growth, reported)",
                     f"{float(times):.2f}×"))
    return rows or [("engine growth (overhead.py --growth)", "n/a", "—", "—", "n/a")]


def throughput_rows(out: str) -> list[Row]:
    m = re.search(r"^\s+engine, no trace\s+([\d.]+)\s+([\d.]+)", out, re.MULTILINE)
    b = re.search(r"^\s+bare loop \(30 lines\)\s+([\d.]+)\s+([\d.]+)", out, re.MULTILINE)
    if not m or not b:
        return [("property-kit whole runs per second", "n/a", "—", "≥ 800", "n/a")]
    per_s, cpu_ms = float(m.group(1)), float(m.group(2))
    by_cpu = 1000 / cpu_ms if cpu_ms else 0.0
    return [("property-kit whole in-process runs per second (no trace)",
             f"{per_s:.0f} (CPU-bound: {by_cpu:.0f})", f"30-line loop {float(b.group(1)):.0f}", "≥ 800 (issue 34)",
             yes(by_cpu >= 800))]


def moves_rows(out: str) -> list[Row]:
    move = grab(r"LoopMachine \(MACHINE\):\s+([\d.]+) us/move", out)
    walk = grab(r"plain table walk:\s+([\d.]+) us/move", out)
    stock = grab(r"transitions' stock classes \(issue 31\):\s+([\d.]+) us/move", out)
    return [("one move of the machine", fmt(move, ".1f", " µs"), f"plain table walk {fmt(walk, '.1f', ' µs')}",
             "≤ 2× the walk", yes(None if move is None or walk is None else move <= 2 * walk)),
            ("one move, lean machine (issue 34)", fmt(move, ".1f", " µs"),
             f"transitions' stock classes {fmt(stock, '.1f', ' µs')}", "below the stock classes",
             f"{yes(None if move is None or stock is None else move < stock)}"
             f" ({fmt(move / stock if move and stock else None, '.2f', '×')})")]


def sessions_rows(out: str, mode: str) -> list[Row]:
    m = re.search(r"^\s+1000\s+(\d+)\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)\s+([\d.]+)%\s+(\d+)", out, re.MULTILINE)
    if not m:
        return [(f"1,000 sessions ({mode} gc)", "n/a", "—", "—", "n/a")]
    tps, p50, p99, spread, gcs, kib = (float(x) for x in m.groups())
    goal = 2500 if mode == "tuned" else 2000  # issue 34 asks 2,500 with gc sized for the sessions
    return [(f"1,000 sessions ({mode} gc): turns/s", f"{tps:.0f}", "—",
             f"≥ {goal:,}" + (" (issue 34)" if mode == "tuned" else " (issue 19)"), yes(tps >= goal)),
            (f"1,000 sessions ({mode} gc): p99 / p50 turn", f"{p99:.0f} / {p50:.0f} ms", "—", "≤ 3×",
             f"{yes(spread <= 3)} ({spread:.2f}×)"),
            (f"1,000 sessions ({mode} gc): gc share of wall", f"{gcs:.1f} %", "—", "< 5 %", yes(gcs < 5)),
            (f"1,000 sessions ({mode} gc): memory per session", f"{kib:.0f} KiB", "—", "≤ 200 KiB", yes(kib <= 200))]


def critical_rows(out: str) -> list[Row]:
    r = grab(r"wall/ideal = ([\d.]+)", out)
    return [("critical path (tools start at block stop)", fmt(r, ".3f", "× ideal"), "ideal measured in the run",
             "≤ 1.02× ideal", yes(None if r is None else r <= 1.02))]


def temporal_rows(out: str, floor: str) -> list[Row]:
    """Issue 34's Temporal rows: sessions/s and CPU per session on 4 workers, against the in-process API
    (same run) and Temporal's own floor for the read probe's shape (bench/temporal_floor.py)."""
    m = re.search(r"^Temporal, 4 workers\s+([\d.]+)\s+([\d.]+)\s+\S+\s+([\d.]+)\s+(\d+)", out, re.MULTILINE)
    base = grab(r"^in-process API\s+[\d.]+\s+([\d.]+)", out)
    events = grab(r"^\s+4 worker\(s\): ([\d.]+) events", out)
    f = re.search(r"^probe shape \(2 remote, 3 local\), sandbox on\s+[\d.]+\s+([\d.]+)\s+\S+\s+([\d.]+)", floor,
                  re.MULTILINE)
    floor_rate, floor_cpu = (float(f.group(1)), float(f.group(2))) if f else (None, None)
    if not m:
        return [("Temporal, 4 workers (temporal.py)", "n/a", "—", "≥ 40 sessions/s; ≤ 30 ms CPU", "n/a")]
    rate, cpu = float(m.group(2)), float(m.group(3))
    return [("Temporal, read-probe sessions on 4 workers (2 cores): sessions/s", f"{rate:.1f}",
             f"in-process API {fmt(base, '.0f', '/s')}; Temporal's floor for the shape {fmt(floor_rate, '.1f', '/s')}",
             "≥ 40 (issue 34)", f"{yes(rate >= 40)} (floor {yes(None if floor_rate is None else floor_rate >= 40)})"),
            ("Temporal CPU per session (server + workers + client)", f"{cpu:.1f} ms",
             f"floor for the shape, no agentfsm code {fmt(floor_cpu, '.1f', ' ms')}", "≤ 30 ms (issue 34)",
             f"{yes(cpu <= 30)} (floor {yes(None if floor_cpu is None else floor_cpu <= 30)})"),
            ("Temporal history per session", fmt(events, ".1f", " events"), "27 before issue 34", "—", "—")]


def table(rows: Sequence[Row]) -> str:
    head = ("what", "measured", "baseline (same run)", "goal", "met")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and repeats")
    ap.add_argument("--claude", default=None, metavar="PATH", help="the Claude Code binary for cli.py")
    ap.add_argument("--no-claude", action="store_true")
    args = ap.parse_args(argv)
    q = args.quick
    global STEPS
    STEPS = Steps(total=12)
    with STEPS:
        rows = _measure(args, q)
    print(f"machine: {machine()}")
    print(table(rows))
    return 0


def _measure(args: argparse.Namespace, q: bool) -> list[Row]:
    rows: list[Row] = []
    claude = claude_path(args.claude, args.no_claude)
    rows += cli_rows(run("cli.py", "--repeats", "3" if q else "5", "--claude-repeats", "3" if q else "5",
                         *(["--claude", claude] if claude else ["--no-claude"])))
    rows += startup_rows(run("startup.py", "--repeats", "3" if q else "5"))
    rows += overhead_rows(run("overhead.py", *(["--n", "100", "--rounds", "3"] if q else ["--rounds", "5"])))
    rows += growth_rows(run("overhead.py", "--growth", "--rounds", "3" if q else "5"))
    rows += moves_rows(run("moves.py", *(["--n", "1000", "--rounds", "3"] if q else [])))
    for mode in ("default", "tuned"):
        rows += sessions_rows(run("sessions.py", "--scale", "--gc", mode), mode)
    rows += critical_rows(run("critical_path.py", "--repeats", "3" if q else "5"))
    rows += throughput_rows(run("property_throughput.py", "--runs", "100" if q else "300"))
    if importlib.util.find_spec("temporalio") is not None:
        rows += temporal_rows(run("temporal.py", "--n", "200" if q else "1000", "--workers", "4"),
                              run("temporal_floor.py", "--n", "100" if q else "200"))
    else:
        rows.append(("Temporal rows", "n/a (pip install 'agentfsm[temporal]')", "—", "—", "n/a"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
