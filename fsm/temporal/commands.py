"""The command lines that use Temporal: ``agentfsm -p … --temporal HOST:PORT`` (the print run, as a
workflow) and ``agentfsm batch --temporal HOST:PORT FILES… [--workers N]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.machine.options import Options
from agentfsm.temporal import DEFAULT_TASK_QUEUE, ENV_ADDRESS
from agentfsm.temporal.client import (
    WORKER_WAIT_S,
    BatchItem,
    SessionError,
    batch_item,
    run_batch,
    run_session,
    session_input,
    spawn_workers,
    stop_workers,
)
from agentfsm.temporal.worker import connect


async def print_run(address: str, task_queue: str, options: Options, plan: Any, prompt: str,
                    emit: Callable[[Mapping[str, Any]], None], *, scripted: str | None = None,
                    worker_timeout: float = WORKER_WAIT_S) -> int:
    """``agentfsm -p PROMPT --temporal``: the session run as a workflow, its messages printed as they
    come; the exit status of a local run (0, or 1 for an error result or a failed workflow)."""
    resume_path, resumed, session_id = None, False, options.session_id
    if plan.source is not None:
        resume_path = plan.source
        if plan.fork:
            options = attrs.evolve(options, resume=None, continue_session=False, parent_session_id=plan.source.stem)
        else:
            resumed, session_id = True, plan.source.stem
    inp = session_input(options, prompt, session_id=session_id, resume_path=resume_path, resumed=resumed,
                        scripted=scripted)
    try:
        client = await connect(address)
        result = await run_session(client, inp, emit, task_queue=task_queue, handle_signals=True,
                                   worker_timeout=worker_timeout,
                                   where=f" on task queue {task_queue!r} at {address}")
    except (ConnectionError, SessionError) as exc:
        sys.stderr.write(f"agentfsm: {exc}\n")
        return 1
    return 1 if result.get("is_error") else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentfsm batch",
        description="Run many sessions on Temporal workers and collect their results: one JSON result line per "
                    "file on stdout, in the files' order. A file is a scenario (JSON with 'prompt' and "
                    "'responses': the scripted model answers) or a prompt (the workers' model answers).")
    p.add_argument("files", nargs="+", type=Path, metavar="SCENARIO_OR_PROMPT_FILE")
    p.add_argument("--temporal", default=os.environ.get(ENV_ADDRESS), metavar="HOST:PORT")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    p.add_argument("--workers", type=int, default=0,
                   help="start this many worker processes here for the batch (default 0: use running workers)")
    p.add_argument("--concurrency", type=int, default=100, help="per started worker (see agentfsm worker)")
    p.add_argument("--parallel", type=int, default=200, help="sessions in flight at once (default 200)")
    p.add_argument("--cwd", type=Path, default=None, help="the sessions' working directory")
    p.add_argument("--model", default=None)
    p.add_argument("--tools", default=None, help='tools to offer: "Read,Grep"')
    p.add_argument("--permission-mode", default=None)
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--sessions-dir", type=Path, default=None)
    p.add_argument("--no-trace", action="store_true", help="write no session files")
    return p


def batch_main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.temporal:
        sys.stderr.write(f"agentfsm batch: --temporal HOST:PORT is required (or set ${ENV_ADDRESS})\n")
        return 2
    try:
        items = [batch_item(f) for f in args.files]
        options = _options(args)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"agentfsm batch: {exc}\n")
        return 2
    workers = spawn_workers(args.temporal, args.workers, task_queue=args.task_queue,
                            concurrency=args.concurrency) if args.workers > 0 else []
    started = time.monotonic()

    def show(item: BatchItem, result: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps({"file": item.name, **result}, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    async def go() -> list[dict[str, Any]]:
        client = await connect(args.temporal)
        return await run_batch(client, items, options, task_queue=args.task_queue, parallel=args.parallel,
                               on_result=show)

    try:
        results = asyncio.run(go())
    except ConnectionError as exc:
        sys.stderr.write(f"agentfsm batch: {exc}\n")
        return 1
    finally:
        stop_workers(workers)
    wall = time.monotonic() - started
    errors = sum(1 for r in results if r.get("is_error"))
    sys.stderr.write(f"agentfsm batch: {len(results)} sessions, {errors} with an error result, {wall:.1f}s "
                     f"({len(results) / wall:.1f} sessions/s)\n")
    return 1 if errors else 0


def _options(args: argparse.Namespace) -> Options:
    from agentfsm.machine.options import DEFAULT_MODEL
    from agentfsm.machine.state import Limits

    limits = Limits(max_turns=args.max_turns) if args.max_turns is not None else Limits()
    return Options(model=args.model or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL,
                   tools=tuple(t for t in (args.tools or "").replace(",", " ").split()) if args.tools else None,
                   permission_mode=args.permission_mode, limits=limits, cwd=args.cwd or Path.cwd(),
                   sessions_dir=args.sessions_dir, write_trace=not args.no_trace)
