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

from agentfsm.machine.options import Options
from agentfsm.runtime.trace import sessions_dir
from agentfsm.temporal import DEFAULT_TASK_QUEUE, WORKFLOW_NAME, workflow_id
from agentfsm.temporal.records import OutputPage, SessionInput, SessionSpec, Timing

Emit = Callable[[Mapping[str, Any]], None]
POLL_S = 0.05
CLOSE_WAIT_S = 30.0
WAIT_NOTICE_S = 1.0  # a wait longer than this says what it waits for
# how long a client waits for a worker to take its session before ending it (--worker-timeout)
WORKER_WAIT_S = 60.0
# a query or signal that the service cannot answer in this long is asked again (or given up)
QUERY_TIMEOUT_S = 0.5
# after an abort, how long the client keeps following for the session's last messages
ABORT_GRACE_S = 1.0
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


@attrs.define
class Following:
    """How a client follows its session: what the user asked (signals) and how long it waits for a
    worker. ``where`` names the service and task queue in messages."""

    worker_timeout: float = WORKER_WAIT_S
    where: str = ""
    stop: str = ""  # "", "interrupt" or "abort": set by the signal handlers
    changed: asyncio.Event = attrs.field(factory=asyncio.Event)

    def ask(self, what: str) -> None:
        if self.stop != "abort":
            self.stop = what
        self.changed.set()


async def follow(client: Client, handle: WorkflowHandle[Any, Any], emit: Emit, *,
                 poll_s: float = POLL_S, following: Following | None = None) -> dict[str, Any]:
    """Emit every message the session shows, as it shows it, until its result (returned).

    Until a worker has answered, nothing of the session has run: a stop the user asks for then, or
    no worker within ``following.worker_timeout``, ends the workflow (terminated, with the reason)
    and raises :class:`SessionError` saying why. Once the session runs, an abort is relayed and the
    client stops following within :data:`ABORT_GRACE_S` even if no worker is left to answer."""
    watch = following or Following()
    latest = client.get_workflow_handle(handle.id)  # queries follow the session into a continued run
    ended = asyncio.ensure_future(handle.result())
    since = 0
    began = answered = time.monotonic()
    seen_worker, told = False, False
    aborted_at: float | None = None
    rpc = timedelta(seconds=QUERY_TIMEOUT_S)
    try:
        while True:
            now = time.monotonic()
            if not seen_worker and (watch.stop or now - began > watch.worker_timeout):
                why = ("stopped by the user before any worker took it" if watch.stop else
                       f"no agentfsm worker took it within {watch.worker_timeout:g} s")
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(handle.terminate(reason=why), QUERY_TIMEOUT_S)
                raise SessionError(f"session {handle.id} did not run: {why}{watch.where}; its workflow was "
                                   "ended. Start a worker (`agentfsm worker --temporal HOST:PORT`) and run again.")
            if watch.stop == "abort":
                aborted_at = aborted_at or now
                if now - aborted_at > ABORT_GRACE_S:
                    raise SessionError(f"stopped following session {handle.id}: it was told to abort; its "
                                       "session file has the run up to there")
            try:
                page: OutputPage = await latest.query("output", since, result_type=OutputPage, rpc_timeout=rpc)
            except Exception:  # no worker has the session yet (starting, failing over): ask again
                if ended.done():
                    return _ended(ended, emit)
                if not told and time.monotonic() - answered > WAIT_NOTICE_S:
                    told = True
                    sys.stderr.write(f"agentfsm: waiting for an agentfsm worker to take session {handle.id}"
                                     f"{watch.where} (is `agentfsm worker` running on this task queue?); giving up "
                                     f"after {watch.worker_timeout:g} s; Ctrl-C stops waiting\n")
                    sys.stderr.flush()
                await _nap(0.2, watch)
                continue
            seen_worker, answered = True, time.monotonic()
            if page.base > since:
                sys.stderr.write(f"agentfsm: {page.base - since} messages were missed while following\n")
            for at, msg in enumerate(page.messages, start=page.base):
                emit(msg)
                # the run's own result (a notification pass's result is followed by the next pass)
                if msg.get("type") == "result" and at == page.final:
                    # the run still ends its session (SessionEnd hooks): wait, so a --resume right
                    # after this returns finds the session idle
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(ended), CLOSE_WAIT_S)
                    return dict(msg)
            since = page.base + len(page.messages)
            if not page.messages:
                if ended.done() and page.done:
                    return _ended(ended, emit)
                await _nap(poll_s, watch)
    finally:
        if not ended.done():
            ended.cancel()
            with contextlib.suppress(BaseException):
                await ended


async def _nap(seconds: float, watch: Following) -> None:
    """Sleep, but wake at once when the user asks to stop."""
    watch.changed.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(watch.changed.wait(), seconds)


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
                      handle_signals: bool = False, worker_timeout: float = WORKER_WAIT_S,
                      where: str = "") -> dict[str, Any]:
    """Start one session run and follow it to its result. With ``handle_signals``, Ctrl-C interrupts
    the session (a second Ctrl-C, or SIGTERM, aborts it) instead of this process; before any worker
    has taken the session, either one ends it at once (nothing of it has run)."""
    handle = await start(client, inp, task_queue=task_queue)
    following = Following(worker_timeout=worker_timeout, where=where or f" on task queue {task_queue!r}")
    if handle_signals:
        _forward_signals(client.get_workflow_handle(handle.id), following)
    return await follow(client, handle, emit, following=following)


def _forward_signals(handle: WorkflowHandle[Any, Any], following: Following) -> None:
    loop = asyncio.get_running_loop()
    presses = [0]
    tasks: set[asyncio.Future[Any]] = set()

    def send(name: str) -> None:
        following.ask(name)
        task = asyncio.ensure_future(handle.signal(name, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S)))
        tasks.add(task)
        task.add_done_callback(_quietly(tasks))

    def on_sigint() -> None:
        presses[0] += 1
        sys.stderr.write("agentfsm: interrupting the session; press Ctrl-C again to abort it\n" if presses[0] == 1
                         else "agentfsm: aborting the session\n")
        send("interrupt" if presses[0] == 1 else "abort")

    def on_sigterm() -> None:
        sys.stderr.write("agentfsm: terminated: aborting the session\n")
        send("abort")

    for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, on_sigterm)):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


def _quietly(tasks: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    # a signal that could not be delivered (no service, the workflow already ended) is not an error
    # the user can act on: the client's own stop handling has already begun
    def done(task: asyncio.Future[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return done


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
