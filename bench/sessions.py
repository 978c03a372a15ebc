"""Many sessions in one process: N concurrent sessions against one loopback scripted server.

Each session runs the read probe (a Read tool call, then a text answer: two requests) through the
real anthropic SDK, all sharing one transport, on one event loop. The scripted server runs in a
child process (``agentfsm serve-scripted --per-session``) so its memory is not counted; pass
``--server thread`` to serve from a thread of this process instead.

Printed: wall time, requests per second, peak RSS, and the marginal memory per session:
``(RSS with all N sessions alive - RSS before the first) / N``, where "alive" is the highest RSS
sampled while the N sessions run or after they finished (their Session objects, histories and
results are all still referenced then). Target: <= 1 MiB per session. Session files are written
(as a real run does) unless ``--no-trace``.

    python bench/sessions.py [--n 1000] [--server subprocess|thread] [--no-trace]
    python bench/sessions.py --scale [--gc default|tuned]

``--scale`` runs the in-process scripted model instead (no HTTP: the engine's own cost) at 1, 10, 100
and 1,000 concurrent sessions of six model turns each (five Echo tool turns and an answer), session
files written, and prints per size: turns per second, p50/p99 latency of a turn (from one request of a
session to its next), the share of wall time spent in garbage collection (``gc.callbacks``) and the
marginal memory per session. ``--gc tuned`` freezes what start-up allocated (``gc.freeze()``) and sizes
the young generation above what the sessions hold in flight (:func:`tuned_thresholds`), as a
long-running host would.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, machine, workspace

from agentfsm.llm.transport import AnthropicTransport
from agentfsm.machine.options import Options
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import load_embedded_scenario, populate_workspace
from agentfsm.testing.server import ScriptedServer

MIB = 1024 * 1024


def rss_bytes() -> int:
    """Resident set size now (Linux /proc; falls back to the peak elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class Sampler:
    """Highest RSS seen while it runs (sampled every ``every`` seconds)."""

    def __init__(self, every: float = 0.01) -> None:
        self.every = every
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes())
            await asyncio.sleep(self.every)

    def __enter__(self) -> Sampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.peak = max(self.peak, rss_bytes())


def start_server(ws: Path, mode: str) -> tuple[str, Any]:
    if mode == "thread":
        server = ScriptedServer(load_embedded_scenario("read_probe", ws=str(ws)), per_session=True)
        return server.start(), server
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentfsm", "serve-scripted", "read_probe", "--per-session", "--ws", str(ws)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise RuntimeError(f"the scripted server did not start (said {url!r})")
    return url, proc


def stop_server(handle: Any) -> None:
    if isinstance(handle, ScriptedServer):
        handle.stop()
    else:
        handle.terminate()
        handle.wait(timeout=30)


async def run_sessions(n: int, url: str, ws: Path, sessions_dir: Path, trace: bool) -> dict[str, Any]:
    transport = AnthropicTransport(api_key="sk-bench", base_url=url, max_retries=2)
    options = Options(tools=("Read",), cwd=ws, sessions_dir=sessions_dir, setting_sources=(),
                      permission_mode="bypassPermissions", write_trace=trace)

    async def one(session: Session) -> Any:
        return await session.run("AGENT_LOOP_INITIAL_MARKER")

    try:
        # warm-up: every lazy import and cache the sessions touch is loaded before RSS0
        warm = Session(options, client=transport, owns_client=False)
        await one(warm)
        await warm.aclose()
        del warm
        gc.collect()
        rss0 = rss_bytes()
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        with Sampler() as sampler:
            sessions = [Session(options, client=transport, owns_client=False) for _ in range(n)]
            results = await asyncio.gather(*(one(s) for s in sessions))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        alive = max(sampler.peak, rss_bytes())  # every session, history and result still referenced
        ok = sum(1 for r in results if r.subtype == "success" and r.result == "TOOL_EXECUTION_OK")
        for s in sessions:
            await s.aclose()
    finally:
        await transport.aclose()
    return {"rss0": rss0, "alive": alive, "wall": wall, "cpu": cpu, "ok": ok}


class GcClock:
    """Wall time spent in garbage collection, from gc.callbacks."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class TurnTimes:
    """A step observer: when each session sent each request (its ``call`` moves)."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self._last: dict[int, float] = {}

    def observer(self) -> Any:
        key = len(self._last)
        self._last[key] = time.perf_counter()
        times = self

        class _Obs:
            def on_step(self, _before: Any, step: Any, _event: Any) -> None:
                if step.trigger in ("call", "settle", "finish_batch"):
                    now = time.perf_counter()
                    times.gaps.append(now - times._last[key])
                    times._last[key] = now

        return _Obs()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_scale(n: int, base: Path) -> dict[str, Any]:
    from _common import echo_tool, tool_turns

    from agentfsm.testing.scripted import ScriptedModel

    model = ScriptedModel(tool_turns(5), per_session=True, keep_requests=False)
    options = Options(tools=(), extra_tools=(echo_tool(),), cwd=base, sessions_dir=base / f"s{n}",
                      setting_sources=(), permission_mode="bypassPermissions")
    warm = Session(options, client=model, owns_client=False)
    await warm.run("go")
    await warm.aclose()
    del warm
    gc.collect()
    times = TurnTimes()
    rss0 = rss_bytes()
    with GcClock() as gcc, Sampler() as sampler:
        t0 = time.perf_counter()
        sessions = [Session(options, client=model, owns_client=False, observers=(times.observer(),))
                    for _ in range(n)]
        results = await asyncio.gather(*(s.run("go") for s in sessions))
        wall = time.perf_counter() - t0
    alive = max(sampler.peak, rss_bytes())
    ok = sum(1 for r in results if r.result == "done")
    for s in sessions:
        await s.aclose()
    turns = sum(r.num_turns for r in results)
    return {"n": n, "ok": ok, "wall": wall, "turns": turns, "gc": gcc.total, "p50": percentile(times.gaps, 0.5),
            "p99": percentile(times.gaps, 0.99), "per_session": (alive - rss0) / n}


# A session in the middle of a turn holds about 180 gc-tracked objects (its records, the turn's
# coroutines, tasks and futures; measured with gc.get_objects()); most of them live until the turn ends.
IN_FLIGHT_PER_SESSION = 200


def tuned_thresholds(sessions: int) -> tuple[int, int, int]:
    """gc thresholds for ``sessions`` concurrent sessions: the young generation sized above what the
    sessions hold in flight, so a young collection does not keep re-examining (and promoting) the
    live turns of every session — with the default 700 it ran every few turns and each one walked
    them all. Few collections, and what is freed by reference counting never waits for one."""
    return max(50_000, IN_FLIGHT_PER_SESSION * sessions), 50, 100


def main_scale(gc_mode: str) -> int:
    if gc_mode == "tuned":
        gc.freeze()  # what start-up allocated is never garbage: keep it out of every collection
    base = workspace()
    print(f"machine: {machine()}")
    print(f"sessions, in-process scripted model, 6 turns each, session files written, gc {gc_mode}")
    print(f"  {'sessions':>8} {'turns/s':>9} {'p50 turn':>10} {'p99 turn':>10} {'p99/p50':>8} {'gc share':>9} "
          f"{'KiB/session':>12}")
    try:
        for n in (1, 10, 100, 1000):
            if gc_mode == "tuned":
                gc.set_threshold(*tuned_thresholds(n))
            out = asyncio.run(run_scale(n, base))
            if out["ok"] != n:
                print(f"  {n}: only {out['ok']} sessions completed")
                return 1
            print(f"  {n:>8} {out['turns'] / out['wall']:>9.0f} {out['p50'] * 1e3:>8.1f}ms {out['p99'] * 1e3:>8.1f}ms "
                  f"{out['p99'] / out['p50']:>8.2f} {out['gc'] / out['wall']:>8.1%} {out['per_session'] / 1024:>12.0f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("  goals at 1,000: >= 2,000 turns/s, p99 <= 3x p50, gc < 5% of wall, <= 200 KiB per session")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", action="store_true", help="in-process model at 1, 10, 100, 1000 sessions")
    ap.add_argument("--gc", choices=("default", "tuned"), default="default", help="with --scale: gc settings")
    ap.add_argument("--n", type=int, default=1000, help="concurrent sessions (default 1000)")
    ap.add_argument("--server", choices=("subprocess", "thread"), default="subprocess")
    ap.add_argument("--no-trace", action="store_true", help="do not write session files")
    args = ap.parse_args(argv)
    if args.scale:
        return main_scale(args.gc)

    base = workspace()
    ws = populate_workspace(base / "ws")
    sessions_dir = base / "sessions"
    url, handle = start_server(ws, args.server)
    try:
        out = asyncio.run(run_sessions(args.n, url, ws, sessions_dir, not args.no_trace))
    finally:
        stop_server(handle)
        shutil.rmtree(base, ignore_errors=True)
    n = args.n
    marginal = (out["alive"] - out["rss0"]) / n
    print(f"machine: {machine()}")
    print(f"sessions: {n} concurrent, {out['ok']} completed correctly; server: {args.server}; "
          f"session files: {'no' if args.no_trace else 'yes'}")
    print(f"wall time: {out['wall']:.2f} s ({2 * n / out['wall']:.0f} requests/s); CPU: {out['cpu']:.2f} s")
    print(f"RSS before: {out['rss0'] / MIB:.1f} MiB; with all sessions alive: {out['alive'] / MIB:.1f} MiB; "
          f"peak RSS (process): {peak_rss_bytes() / MIB:.1f} MiB")
    print(f"marginal memory per session: {marginal / 1024:.0f} KiB "
          f"({'within' if marginal <= MIB else 'OVER'} the 1 MiB target)")
    return 0 if out["ok"] == n and marginal <= MIB else 1


if __name__ == "__main__":
    sys.exit(main())
