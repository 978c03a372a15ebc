"""Starting sessions as workflows and following them: ``agentfsm -p … --temporal`` and ``agentfsm batch``.

A client starts one workflow per session run and prints what the workflow shows while it progresses
(the ``output`` query, polled every 50 ms: it adds nothing to the history), so the text, json and
stream-json output and the exit status are the local run's. Ctrl-C signals ``interrupt`` (a second
one, or SIGTERM, ``abort``). The client holds no state the session needs: if it dies, the session
goes on on the workers, and the session file has everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from agentfsm.options import Options
from agentfsm.temporal import DEFAULT_TASK_QUEUE, WORKFLOW_NAME, workflow_id
from agentfsm.temporal.records import OutputPage, SessionInput, SessionSpec, Timing
from agentfsm.trace import sessions_dir

Emit = Callable[[Mapping[str, Any]], None]
POLL_S = 0.05
CLOSE_WAIT_S = 30.0
WAIT_NOTICE_S = 5.0
# a workflow task that is lost with its worker is given to another after this long
TASK_TIMEOUT = timedelta(seconds=5)


class SessionError(RuntimeError):
    """The session's workflow could not run to a result (it failed, was terminated, or is busy)."""


def session_input(options: Options, prompt: str | Sequence[Mapping[str, Any]], *, session_id: str | None = None,
                  resume_path: Path | None = None, resumed: bool = False, scripted: str | None = None,
                  live: bool = True, timing: Timing | None = None, continue_as_new_after: int = 0) -> SessionInput:
    """The input of one session run from the options a local run would use."""
    sid = session_id or options.session_id or str(uuid.uuid4())
    trace = (sessions_dir(options) / f"{sid}.jsonl").resolve() if options.write_trace else None
    blocks = ({"type": "text", "text": prompt},) if isinstance(prompt, str) else tuple(dict(b) for b in prompt)
    return SessionInput(SessionSpec.of(options, session_id=sid, trace_path=trace, scripted=scripted), blocks,
                        resume_path=str(resume_path) if resume_path else None, resumed=resumed, live=live,
                        timing=timing or Timing(), continue_as_new_after=continue_as_new_after)


async def start(client: Client, inp: SessionInput, *, task_queue: str = DEFAULT_TASK_QUEUE) -> WorkflowHandle[Any, Any]:
    """Start the session's run; a session whose previous run is still going is refused."""
    try:
        return await client.start_workflow(
            WORKFLOW_NAME, inp, id=workflow_id(inp.spec.session_id), task_queue=task_queue, result_type=dict,
            task_timeout=TASK_TIMEOUT, id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL)
    except WorkflowAlreadyStartedError:
        raise SessionError(f"session {inp.spec.session_id} is still running on the workers "
                           f"(workflow {workflow_id(inp.spec.session_id)})") from None


async def follow(client: Client, handle: WorkflowHandle[Any, Any], emit: Emit, *,
                 poll_s: float = POLL_S) -> dict[str, Any]:
    """Emit every message the session shows, as it shows it, until its result (returned)."""
    latest = client.get_workflow_handle(handle.id)  # queries follow the session into a continued run
    ended = asyncio.ensure_future(handle.result())
    since = 0
    answered, told = time.monotonic(), False
    try:
        while True:
            try:
                page: OutputPage = await latest.query("output", since, result_type=OutputPage)
            except Exception:  # no worker has the session yet (starting, failing over): ask again
                if ended.done():
                    return _ended(ended, emit)
                if not told and time.monotonic() - answered > WAIT_NOTICE_S:
                    told = True
                    sys.stderr.write(f"agentfsm: waiting for an agentfsm worker to take session {handle.id} "
                                     "(is `agentfsm worker` running on this task queue?)\n")
                await asyncio.sleep(0.2)
                continue
            answered = time.monotonic()
            if page.base > since:
                sys.stderr.write(f"agentfsm: {page.base - since} messages were missed while following\n")
            for msg in page.messages:
                emit(msg)
                if msg.get("type") == "result":
                    # the run still ends its session (SessionEnd hooks): wait, so a --resume right
                    # after this returns finds the session idle
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(ended), CLOSE_WAIT_S)
                    return dict(msg)
            since = page.base + len(page.messages)
            if not page.messages:
                if ended.done() and page.done:
                    return _ended(ended, emit)
                await asyncio.sleep(poll_s)
    finally:
        if not ended.done():
            ended.cancel()
            with contextlib.suppress(BaseException):
                await ended


def _ended(ended: asyncio.Future[Any], emit: Emit) -> dict[str, Any]:
    exc = ended.exception()
    if exc is not None:
        raise SessionError(f"the session's workflow failed: {_cause(exc)}")
    result = dict(ended.result())
    emit(result)
    return result


def _cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, WorkflowFailureError):
        return str(exc.cause)
    return str(exc) or type(exc).__name__


async def run_session(client: Client, inp: SessionInput, emit: Emit, *, task_queue: str = DEFAULT_TASK_QUEUE,
                      handle_signals: bool = False) -> dict[str, Any]:
    """Start one session run and follow it to its result. With ``handle_signals``, Ctrl-C interrupts
    the session (a second Ctrl-C, or SIGTERM, aborts it) instead of this process."""
    handle = await start(client, inp, task_queue=task_queue)
    if handle_signals:
        _forward_signals(client.get_workflow_handle(handle.id))
    return await follow(client, handle, emit)


def _forward_signals(handle: WorkflowHandle[Any, Any]) -> None:
    loop = asyncio.get_running_loop()
    presses = [0]
    tasks: set[asyncio.Future[Any]] = set()

    def send(name: str) -> None:
        task = asyncio.ensure_future(handle.signal(name))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def on_sigint() -> None:
        presses[0] += 1
        send("interrupt" if presses[0] == 1 else "abort")

    for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, lambda: send("abort"))):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


# --- many sessions ---------------------------------------------------------------------------------


@attrs.frozen
class BatchItem:
    """One session of a batch: a prompt, answered by the scripted model when ``scripted`` holds a
    scenario (its JSON text), else by the workers' model."""

    name: str
    prompt: str
    scripted: str | None = None


def batch_item(path: Path) -> BatchItem:
    """A scenario file (JSON with ``responses``; its ``prompt`` is the session's) or a prompt file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
        if isinstance(data, dict) and "responses" in data:
            prompt = data.get("prompt")
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{path}: a scenario run as a session needs a 'prompt'")
            return BatchItem(str(path), prompt, text)
    if not text.strip():
        raise ValueError(f"{path}: the prompt file is empty")
    return BatchItem(str(path), text)


async def run_batch(client: Client, items: Iterable[BatchItem], options: Options, *,
                    task_queue: str = DEFAULT_TASK_QUEUE, parallel: int = 200, live: bool = False,
                    on_result: Callable[[BatchItem, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every item as a session on the workers (at most ``parallel`` at once) and return their
    results in the items' order. A session whose workflow failed gets an error result."""
    gate = asyncio.Semaphore(parallel)

    async def one(item: BatchItem) -> dict[str, Any]:
        async with gate:
            inp = session_input(options, item.prompt, scripted=item.scripted, live=live)
            try:
                handle = await start(client, inp, task_queue=task_queue)
                result = dict(await handle.result())
            except (SessionError, WorkflowFailureError) as exc:
                result = {"type": "result", "subtype": "error_during_execution", "is_error": True,
                          "session_id": inp.spec.session_id, "errors": [_cause(exc)]}
        if on_result is not None:
            on_result(item, result)
        return result

    return list(await asyncio.gather(*(one(item) for item in items)))


def spawn_workers(address: str, n: int, *, task_queue: str = DEFAULT_TASK_QUEUE, concurrency: int = 100,
                  log_dir: Path | None = None, timeout: float = 60.0, extra: Sequence[str] = ()) -> list[Any]:
    """Start ``n`` worker processes on this machine and wait until each is ready (each one's stderr
    goes to a file in ``log_dir``, a temporary directory by default)."""
    import subprocess
    import tempfile

    logs = log_dir or Path(tempfile.mkdtemp(prefix="agentfsm-workers-"))
    procs = []
    for i in range(n):
        with open(logs / f"worker-{i}.log", "wb") as err:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "agentfsm", "worker", "--temporal", address, "--task-queue", task_queue,
                 "--concurrency", str(concurrency), *extra], stdout=subprocess.DEVNULL, stderr=err,
                stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    for i, p in enumerate(procs):
        log = logs / f"worker-{i}.log"
        while b"agentfsm worker ready" not in log.read_bytes():
            if time.monotonic() > deadline or p.poll() is not None:
                stop_workers(procs)
                raise RuntimeError(f"a worker did not start: {log.read_text(errors='replace').strip()[-2000:]}")
            time.sleep(0.05)
    return procs


def stop_workers(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except Exception:
            p.kill()
            p.wait()
