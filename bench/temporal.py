"""Many sessions on Temporal: N scripted sessions on 1, 2 and 4 worker processes, against the same N
sessions run concurrently in one process by the in-process API (the baseline, same run).

Each session is the read probe: the scripted model asks for a Read of a fixture file, then answers
(two model requests and one tool call). On Temporal that is one workflow run with its activities:
open the run, two model calls, the tool, the end; the session file is written by the workflow.
The dev server (``temporal server start-dev``, in memory) and the workers are separate processes
on this machine; their CPU time is read from ``/proc`` and reported next to wall time, since wall
time on a shared machine also counts other people's work.

Printed per setup: wall time, sessions/s, CPU seconds (server, workers, this client) and CPU per
session; then the per-session overhead Temporal adds: its CPU per session minus the in-process one.

    python bench/temporal.py [--n 1000] [--workers 1,2,4] [--parallel 200] [--no-trace] [--no-sandbox] [--profile]
    python bench/temporal.py --scale

``--scale``: instead of the rows, how the cost grows on one worker — 1, 10, 100 and 1,000 sessions,
and one session of 10, 100 and 1,000 Read turns (CPU per session and per turn, history events).

``--profile``: each worker process is one under a sampling profiler (bench/temporal_sampler.py), and
the table of where its CPU went follows its row (the sampler costs CPU of its own: compare shares,
not the row's totals). After the rows: what a session's workflow history holds.

With the defaults it runs 4,000 sessions (about five minutes on 2 cores); ``--n 200`` for a quick look.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine

from agentfsm import query
from agentfsm.machine.options import Options
from agentfsm.testing.scenario import load_embedded_scenario, populate_workspace
from agentfsm.testing.scripted import ScriptedModel


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def in_process(n: int, ws: Path, sessions: Path, parallel: int, trace: bool) -> dict[str, float]:
    """The baseline: n sessions on one event loop, the scripted model in-process."""
    scenario = load_embedded_scenario(ws=ws)
    gate = asyncio.Semaphore(parallel)

    async def one() -> bool:
        async with gate:
            opts = Options(cwd=ws, sessions_dir=sessions, setting_sources=(), write_trace=trace)
            last: dict[str, Any] = {}
            async for msg in query(scenario.prompt or "go", options=opts, client=ScriptedModel(scenario, time_scale=0)):
                last = msg
            return last.get("subtype") == "success"

    cpu0, t0 = own_cpu(), time.monotonic()
    ok = sum(await asyncio.gather(*(one() for _ in range(n))))
    return {"wall": time.monotonic() - t0, "cpu_client": own_cpu() - cpu0, "ok": ok}


async def history_shape(client: Any, session_ids: list[str]) -> dict[str, Any]:
    """What the sessions' workflow histories hold, averaged over a sample: events (and by type), the
    bytes of their payloads, and the workflow tasks (each one an activation of the workflow on a
    worker). Read after the timed part."""
    from collections import Counter

    from temporalio.api.enums.v1 import EventType

    from agentfsm.temporal.client import workflow_id

    kinds: Counter[str] = Counter()
    size = 0
    for sid in session_ids:
        history = await client.get_workflow_handle(workflow_id(sid)).fetch_history()
        for ev in history.events:
            kinds[EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_")] += 1
        size += sum(len(ev.SerializeToString()) for ev in history.events)
    n = max(1, len(session_ids))
    return {"events": sum(kinds.values()) / n, "history_bytes": size / n,
            "by_type": {k: v / n for k, v in kinds.most_common()}}


def sampled_worker(address: str, queue: str, parallel: int, sandbox: bool, out: Path) -> Any:
    """One worker under bench/temporal_sampler.py (its profile is written to ``out`` when it stops)."""
    import subprocess

    log = out.with_suffix(".log")
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "temporal_sampler.py"), address, queue,
                                 str(parallel), str(int(sandbox)), str(out)], stderr=err, stdin=subprocess.DEVNULL)
    while b"agentfsm worker ready" not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(log.read_text(errors="replace")[-2000:])
        time.sleep(0.05)
    return proc


def print_profile(out: Path) -> None:
    data = json.loads(out.read_text())
    total = sum(n for _s, _w, n in data["samples"]) or 1
    threads = data["threads"]
    cpu = sum(threads.values()) or 1.0
    print("\nthe worker's CPU by thread (s): " + ", ".join(
        f"{name or '?'} {v:.1f} ({v / cpu:.0%})" for name, v in sorted(threads.items(), key=lambda kv: -kv[1])
        if v >= 0.05))
    print("its Python samples (busy threads, 1 ms), by side and by what the innermost known frame does:")
    for side, what, n in data["samples"]:
        if n / total >= 0.01:
            print(f"  {side:<10}{what:<26}{n / total:>6.1%}")


def on_temporal(address: str, n: int, workers: int, ws: Path, sessions: Path, parallel: int, trace: bool,
                server_pid: int, sandbox: bool, profile: Path | None = None) -> dict[str, Any]:
    from agentfsm.temporal.client import BatchItem, run_batch, spawn_workers, stop_workers
    from agentfsm.temporal.worker import connect

    scenario = json.dumps(load_embedded_scenario().to_dict() | {"prompt": "AGENT_LOOP_INITIAL_MARKER"})
    queue = f"bench-{workers}-{os.getpid()}"
    if profile is not None:
        procs = [sampled_worker(address, queue, parallel, sandbox, profile)]
    else:
        procs = spawn_workers(address, workers, task_queue=queue, concurrency=parallel,
                              extra=() if sandbox else ("--no-sandbox",))
    try:
        opts = Options(cwd=ws, sessions_dir=sessions, setting_sources=(), write_trace=trace)
        items = [BatchItem(f"s{i}", "AGENT_LOOP_INITIAL_MARKER", scenario) for i in range(n)]

        before = {p.pid: cpu_of(p.pid) for p in procs}
        m: dict[str, Any] = {}

        async def go() -> None:
            client = await connect(address)
            server0, cpu0, t0 = cpu_of(server_pid), own_cpu(), time.monotonic()
            results = await run_batch(client, items, opts, task_queue=queue, parallel=parallel)
            m.update(wall=time.monotonic() - t0, cpu_client=own_cpu() - cpu0, cpu_server=cpu_of(server_pid) - server0,
                     cpu_workers=sum(cpu_of(p.pid) - before[p.pid] for p in procs),
                     ok=sum(1 for r in results if r.get("subtype") == "success"))
            # after the timed part: what the histories hold
            m.update(await history_shape(client, [r["session_id"] for r in results[:20] if r.get("session_id")]))

        asyncio.run(go())
        return m
    finally:
        stop_workers(procs)


def probe_scenario(turns: int) -> str:
    """The read probe with ``turns`` Read turns before its answer (1: the read probe itself)."""
    base = load_embedded_scenario().to_dict()
    read, answer = base["responses"]
    tool = read["blocks"][0]
    responses = [dict(read, blocks=[dict(tool, id=f"toolu_{i:05d}")]) for i in range(turns)]
    return json.dumps(base | {"prompt": "AGENT_LOOP_INITIAL_MARKER", "responses": [*responses, answer]})


SCALE_STEPS = ((1, 1), (10, 1), (100, 1), (1000, 1), (1, 10), (1, 100), (1, 1000))


def scale(address: str, server_pid: int, ws: Path, root: Path, parallel: int, trace: bool, sandbox: bool,
          steps: tuple[tuple[int, int], ...] = SCALE_STEPS) -> None:
    """How Temporal's cost grows: 1 to 1,000 read-probe sessions, and one session of 10 to 1,000 turns,
    on one worker process (each step's CPU from /proc, as the rows above)."""
    from agentfsm.temporal.client import BatchItem, run_batch, spawn_workers, stop_workers
    from agentfsm.temporal.worker import connect

    queue = f"bench-scale-{os.getpid()}"
    procs = spawn_workers(address, 1, task_queue=queue, concurrency=parallel,
                          extra=() if sandbox else ("--no-sandbox",))
    opts = Options(cwd=ws, sessions_dir=root / "scale", setting_sources=(), write_trace=trace)

    async def step(n: int, turns: int) -> dict[str, Any]:
        client = await connect(address)
        scenario = probe_scenario(turns)
        items = [BatchItem(f"s{i}", "AGENT_LOOP_INITIAL_MARKER", scenario) for i in range(n)]
        wrk0, srv0, cli0, t0 = cpu_of(procs[0].pid), cpu_of(server_pid), own_cpu(), time.monotonic()
        results = await run_batch(client, items, opts, task_queue=queue, parallel=parallel)
        wrk, srv, cli = cpu_of(procs[0].pid) - wrk0, cpu_of(server_pid) - srv0, own_cpu() - cli0
        m: dict[str, Any] = {"wall": time.monotonic() - t0, "cpu": wrk + srv + cli, "wrk": wrk, "srv": srv,
                             "ok": sum(r.get("subtype") == "success" for r in results)}
        m.update(await history_shape(client, [r["session_id"] for r in results[:20] if r.get("session_id")]))
        return m

    try:
        print("\nhow it grows, one worker process (CPU = server + worker + client):")
        print(f"  {'sessions':>8}{'turns':>7}{'wall s':>8}{'sessions/s':>12}{'CPU ms/session':>16}{'CPU ms/turn':>13}"
              f"{'srv/wrk ms/turn':>17}{'events/session':>16}{'history KB':>12}{'ok':>6}")
        for n, turns in steps:
            r = asyncio.run(step(n, turns))
            per_turn = f"{r['srv'] / n / turns * 1000:.1f}/{r['wrk'] / n / turns * 1000:.1f}"
            print(f"  {n:>8}{turns:>7}{r['wall']:>8.1f}{n / r['wall']:>12.1f}{r['cpu'] / n * 1000:>16.1f}"
                  f"{r['cpu'] / n / turns * 1000:>13.1f}{per_turn:>17}{r['events']:>16.0f}"
                  f"{r['history_bytes'] / 1024:>12.0f}{r['ok']:>6}", flush=True)
    finally:
        stop_workers(procs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--workers", default="1,2,4", help="comma-separated worker process counts")
    p.add_argument("--parallel", type=int, default=200, help="sessions in flight at once")
    p.add_argument("--no-trace", action="store_true", help="write no session files")
    p.add_argument("--no-sandbox", action="store_true", help="workers run workflows outside Temporal's sandbox")
    p.add_argument("--scale", action="store_true",
                   help="instead of the rows: how the cost grows from 1 to 1,000 sessions and 10 to 1,000 turns")
    p.add_argument("--steps", default="",
                   help="with --scale: the steps to run, as SESSIONSxTURNS,... (default: "
                        + ",".join(f"{n}x{t}" for n, t in SCALE_STEPS) + ")")
    p.add_argument("--profile", action="store_true",
                   help="one worker under a sampling profiler (bench/temporal_sampler.py): where its CPU goes")
    args = p.parse_args()
    from agentfsm.temporal.devserver import start_dev_server

    trace = not args.no_trace
    root = Path(tempfile.mkdtemp(prefix="agentfsm-bench-temporal-"))
    ws = populate_workspace(root / "ws")
    print(f"machine: {machine()}")
    print(f"{args.n} sessions (read probe: 2 model requests, 1 Read), {args.parallel} in flight, "
          f"session files {'on' if trace else 'off'}, workflow sandbox {'off' if args.no_sandbox else 'on'}")
    if args.scale:
        with start_dev_server() as server:
            steps = tuple((int(a), int(b)) for a, b in (x.split("x") for x in args.steps.split(",") if x))
            scale(server.address, server.process.pid, ws, root, args.parallel, trace, not args.no_sandbox,
                  steps or SCALE_STEPS)
        shutil.rmtree(root, ignore_errors=True)
        return
    base = asyncio.run(in_process(args.n, ws, root / "local", args.parallel, trace))
    base_per = base["cpu_client"] / args.n
    print(f"{'setup':<22}{'wall s':>8}{'sessions/s':>12}{'CPU s srv/wrk/cli':>22}{'CPU ms/session':>16}{'ok':>6}")
    print(f"{'in-process API':<22}{base['wall']:>8.1f}{args.n / base['wall']:>12.1f}"
          f"{'-/-/' + format(base['cpu_client'], '.1f'):>22}{base_per * 1000:>16.1f}{base['ok']:>6}")
    rows = []
    with start_dev_server() as server:
        for k in (int(x) for x in args.workers.split(",")):
            prof = root / f"profile-{k}.json" if args.profile else None
            r = on_temporal(server.address, args.n, k, ws, root / f"t{k}", args.parallel, trace, server.process.pid,
                            not args.no_sandbox, prof)
            cpu = r["cpu_server"] + r["cpu_workers"] + r["cpu_client"]
            rows.append((k, r, cpu))
            label = f"Temporal, {k} worker{'s' if k > 1 else ''}"
            split = f"{r['cpu_server']:.1f}/{r['cpu_workers']:.1f}/{r['cpu_client']:.1f}"
            print(f"{label:<22}{r['wall']:>8.1f}{args.n / r['wall']:>12.1f}{split:>22}"
                  f"{cpu / args.n * 1000:>16.1f}{r['ok']:>6}", flush=True)
            if prof is not None:
                print_profile(prof)
    print("\nwhat a session's workflow history holds (mean over 20 sessions):")
    for k, r, _cpu in rows:
        kinds = ", ".join(f"{name} {count:g}" for name, count in r["by_type"].items())
        print(f"  {k} worker(s): {r['events']:g} events, {r['history_bytes'] / 1024:.1f} KiB: {kinds}")
    print("\nper-session overhead Temporal adds (CPU per session minus the in-process API's; ratio of throughput):")
    for k, r, cpu in rows:
        print(f"  {k} worker(s): +{(cpu / args.n - base_per) * 1000:.1f} ms CPU per session "
              f"({cpu / args.n / base_per:.1f}x); throughput {base['wall'] / r['wall']:.2f}x of in-process")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
