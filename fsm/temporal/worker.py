"""``agentfsm worker --temporal HOST:PORT [--task-queue Q] [--concurrency N]``: runs sessions' workflows
and activities until stopped (SIGINT/SIGTERM: a graceful shutdown).

Every worker of a task queue can run any step of any session, so workers need what the sessions use
at the same paths: the session's working directory (tools read and write it) and the sessions
directory (the session file is written by the workflow and read back by model calls). On one machine
that is automatic; across machines, mount them from shared storage.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from agentfsm.machine import state
from agentfsm.temporal import DEFAULT_TASK_QUEUE, ENV_ADDRESS
from agentfsm.temporal.activities import Activities
from agentfsm.temporal.convert import DATA_CONVERTER
from agentfsm.temporal.workflow import SessionWorkflow

# Pure, deterministic modules the workflow uses, imported once for all workflows instead of once per
# run inside the sandbox (ids and time inside them are the workflow's own: see _workflow_ids)
PASSTHROUGH = ("agentfsm", "attrs", "cattrs", "transitions", "structlog", "jsonschema", "referencing",
               "rpds", "anthropic", "httpx", "pydantic", "pydantic_core")
# how long a workflow task waits on a worker that holds the session's state before another worker
# takes it (replaying the history): the SDK's 10 s default would add 10 s to every failover
STICKY_TIMEOUT = timedelta(seconds=2)
HEARTBEAT_THROTTLE = timedelta(seconds=1)


def _workflow_ids() -> uuid.UUID:
    """Inside a workflow, ids come from its seeded random (the same on every replay)."""
    return workflow.uuid4() if workflow.in_workflow() else uuid.uuid4()


class SessionWorker:
    """A worker of a task queue, and its own queue (``<queue>.own.<id>``): the background commands its
    tool calls start run in this process, so the activities that watch them (``agentfsm.watch_task``)
    are scheduled there. Used like temporalio's :class:`~temporalio.worker.Worker`: ``async with`` or
    :meth:`run`."""

    def __init__(self, shared: Worker, own: Worker) -> None:
        self.shared, self.own = shared, own

    async def __aenter__(self) -> SessionWorker:
        await self.own.__aenter__()
        try:
            await self.shared.__aenter__()
        except BaseException:
            await self.own.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.shared.__aexit__(*exc)
        finally:
            await self.own.__aexit__(*exc)

    async def run(self) -> None:
        await asyncio.gather(self.shared.run(), self.own.run())

    async def shutdown(self) -> None:
        await asyncio.gather(self.shared.shutdown(), self.own.shutdown())


def build_worker(client: Client, *, task_queue: str = DEFAULT_TASK_QUEUE, concurrency: int = 100,
                 identity: str | None = None, activities: Activities | None = None,
                 sandbox: bool = True) -> SessionWorker:
    """A worker running :class:`SessionWorkflow` and the session activities. ``sandbox`` False runs the
    workflow without Temporal's sandbox: faster per session; the workflow code is deterministic by
    construction, the sandbox only catches a mistake (a time or random call) early."""
    state.set_id_source(_workflow_ids)
    acts = activities or Activities()
    acts.task_queue = f"{task_queue}.own.{uuid.uuid4().hex}"
    name = identity or f"agentfsm-{os.getpid()}"
    runner = (SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH))
              if sandbox else UnsandboxedWorkflowRunner())
    common: dict[str, Any] = dict(
        identity=name, graceful_shutdown_timeout=timedelta(seconds=5),
        # heartbeats carry cancellation back: an interrupt reaches a running tool within a second
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE, default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE)
    shared = Worker(
        client, task_queue=task_queue, workflows=[SessionWorkflow], activities=[*acts.all(), acts.append_trace],
        workflow_runner=runner, max_concurrent_activities=concurrency,
        sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT, **common)
    # watching a background command is a wait: many at once cost little
    own = Worker(client, task_queue=acts.task_queue, activities=acts.own(), max_concurrent_activities=1000, **common)
    return SessionWorker(shared, own)


async def connect(address: str) -> Client:
    """A client of the Temporal service at ``address`` speaking agentfsm's records."""
    try:
        return await Client.connect(address, data_converter=DATA_CONVERTER)
    except Exception as exc:
        raise ConnectionError(f"cannot reach Temporal at {address}: {exc}") from exc


async def serve(address: str, *, task_queue: str = DEFAULT_TASK_QUEUE, concurrency: int = 100,
                sandbox: bool = True, ready: Callable[[], Any] | None = None) -> None:
    """Run a worker until SIGINT or SIGTERM."""
    client = await connect(address)
    worker = build_worker(client, task_queue=task_queue, concurrency=concurrency, sandbox=sandbox)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        if ready is not None:
            ready()
        await stop.wait()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentfsm worker",
                                description="Run agentfsm sessions' workflows and activities on Temporal.")
    p.add_argument("--temporal", default=os.environ.get(ENV_ADDRESS), metavar="HOST:PORT",
                   help=f"the Temporal frontend (default: ${ENV_ADDRESS})")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    p.add_argument("--concurrency", type=int, default=100,
                   help="model calls, tools and hooks run at once by this worker (default 100)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run workflows outside Temporal's sandbox (faster; the sandbox only guards against "
                        "non-deterministic workflow code)")
    p.add_argument("--debug", action="store_true", help="log agentfsm's events to stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.temporal:
        sys.stderr.write(f"agentfsm worker: --temporal HOST:PORT is required (or set ${ENV_ADDRESS})\n")
        return 2
    if args.concurrency < 1:
        sys.stderr.write("agentfsm worker: --concurrency must be at least 1\n")
        return 2
    from agentfsm.common import log

    log.configure("console" if args.debug else "json", level="debug" if args.debug else "warning")

    def ready() -> None:
        if not any(os.environ.get(k) for k in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL")):
            sys.stderr.write("agentfsm worker: warning: no ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL here: this worker "
                             "runs only --scripted sessions (the others end at once, saying so)\n")
        sys.stderr.write(f"agentfsm worker ready: {args.temporal} task queue {args.task_queue} pid {os.getpid()}\n")
        sys.stderr.flush()

    code = 0
    try:
        asyncio.run(serve(args.temporal, task_queue=args.task_queue, concurrency=args.concurrency,
                          sandbox=not args.no_sandbox, ready=ready))
    except ConnectionError as exc:
        sys.stderr.write(f"agentfsm worker: {exc}\n")
        code = 1
    sys.stderr.flush()
    sys.stdout.flush()
    # skip interpreter finalisation: the SDK's core runtime can abort the process at exit (sdk-python#300)
    os._exit(code)
