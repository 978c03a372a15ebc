"""The floor under a Temporal session: what Temporal itself costs per workflow on this machine, with
no agentfsm code in it — the measurement that says how close ``bench/temporal.py`` can get.

Three shapes, each N workflows on one dev server (in memory, as ``bench/temporal.py`` uses) and one
worker process, the same client settings (``--parallel`` in flight, results awaited):

* ``empty``: a workflow that returns at once (start → end: one workflow task);
* ``one activity``: a workflow that runs one remote activity (what a session's single model call,
  or a tool call, costs at least);
* ``one local activity``: the same step as a local activity (one marker, no task of its own);
* ``probe shape``: the least a read-probe session is on Temporal — two remote activities (the model
  calls) and three local ones (set-up, the Read, the last session-file write), with no agentfsm code.

Each with the workflow sandbox on (the worker's default) and off. Printed per shape: wall, workflows
per second, CPU seconds of server / worker / client (from ``/proc`` and ``getrusage``) and CPU per
workflow, and the history events per workflow. A session of the read probe is at least one workflow
whose two model calls are remote activities: ``probe shape`` is its floor.

    python bench/temporal_floor.py [--n 200] [--parallel 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow

QUEUE_ENV = "AGENTFSM_FLOOR_QUEUE"


@activity.defn(name="floor.step")
async def step(text: str) -> str:
    return text.upper()


@workflow.defn(name="floor.empty")
class Empty:
    @workflow.run
    async def run(self, text: str) -> str:
        return text


@workflow.defn(name="floor.one_activity")
class OneActivity:
    @workflow.run
    async def run(self, text: str) -> str:
        return str(await workflow.execute_activity(step, text, start_to_close_timeout=timedelta(seconds=30)))


@workflow.defn(name="floor.one_local_activity")
class OneLocalActivity:
    @workflow.run
    async def run(self, text: str) -> str:
        return str(await workflow.execute_local_activity(step, text, start_to_close_timeout=timedelta(seconds=30)))


@workflow.defn(name="floor.probe_shape")
class ProbeShape:
    """The read probe's least shape on Temporal: a local step (set-up), a remote one (the first model
    call), a local one (the Read), a remote one (the second model call), a local one (the last write)."""

    @workflow.run
    async def run(self, text: str) -> str:
        t = timedelta(seconds=30)
        text = await workflow.execute_local_activity(step, text, start_to_close_timeout=t)
        text = await workflow.execute_activity(step, text, start_to_close_timeout=t)
        text = await workflow.execute_local_activity(step, text, start_to_close_timeout=t)
        text = await workflow.execute_activity(step, text, start_to_close_timeout=t)
        return str(await workflow.execute_local_activity(step, text, start_to_close_timeout=t))


SHAPES = {"empty": "floor.empty", "one activity": "floor.one_activity",
          "one local activity": "floor.one_local_activity", "probe shape (2 remote, 3 local)": "floor.probe_shape"}


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def serve(address: str, queue: str, sandbox: bool) -> None:
    """The worker process: the three workflows and the activity, until killed."""
    from temporalio.client import Client
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker

    client = await Client.connect(address)
    kw = {} if sandbox else {"workflow_runner": UnsandboxedWorkflowRunner()}
    async with Worker(client, task_queue=queue, workflows=[Empty, OneActivity, OneLocalActivity, ProbeShape],
                      activities=[step], max_concurrent_activities=200, **kw):
        print("ready", flush=True)
        await asyncio.Event().wait()


async def drive(address: str, queue: str, shape: str, n: int, parallel: int) -> tuple[float, int]:
    """Run n workflows of ``shape``; wall seconds and history events of the first one."""
    from temporalio.client import Client

    client = await Client.connect(address)
    gate = asyncio.Semaphore(parallel)
    tag = uuid.uuid4().hex[:8]
    first = f"floor-{tag}-0"

    async def one(i: int) -> None:
        async with gate:
            await client.execute_workflow(SHAPES[shape], "x", id=f"floor-{tag}-{i}", task_queue=queue)

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - t0
    events = len((await client.get_workflow_handle(first).fetch_history()).events)
    return wall, events


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--parallel", type=int, default=200)
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine

    from agentfsm.temporal.devserver import start_dev_server

    print(f"machine: {machine()}")
    print(f"{args.n} workflows per shape, {args.parallel} in flight, one worker process, dev server in memory")
    print(f"{'shape':<46}{'wall s':>8}{'wf/s':>8}{'CPU s srv/wrk/cli':>20}{'CPU ms/wf':>11}{'events':>8}")
    with start_dev_server() as server:
        for sandbox in (True, False):
            queue = f"floor-{os.getpid()}-{int(sandbox)}"
            # the workflows' module imported by name (the sandbox re-imports it; __main__ would not do)
            code = (f"import sys, asyncio; sys.path.insert(0, {str(Path(__file__).parent)!r}); import temporal_floor; "
                    f"asyncio.run(temporal_floor.serve({server.address!r}, {queue!r}, {sandbox}))")
            worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
            try:
                assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
                asyncio.run(drive(server.address, queue, "empty", min(20, args.n), args.parallel))  # warm-up
                for shape in SHAPES:
                    srv0, wrk0, cli0 = cpu_of(server.process.pid), cpu_of(worker.pid), own_cpu()
                    wall, events = asyncio.run(drive(server.address, queue, shape, args.n, args.parallel))
                    srv, wrk, cli = cpu_of(server.process.pid) - srv0, cpu_of(worker.pid) - wrk0, own_cpu() - cli0
                    label = f"{shape}, sandbox {'on' if sandbox else 'off'}"
                    print(f"{label:<46}{wall:>8.1f}{args.n / wall:>8.1f}{f'{srv:.1f}/{wrk:.1f}/{cli:.1f}':>20}"
                          f"{(srv + wrk + cli) / args.n * 1000:>11.1f}{events:>8}", flush=True)
            finally:
                worker.kill()
                worker.wait()


if __name__ == "__main__":
    main()
