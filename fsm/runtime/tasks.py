"""The background tasks of one session: commands run in the background and background subagents.

A task is started by a tool call (Bash ``run_in_background``, a foreground Bash command that outran its
timeout, a background ``Agent`` call) and owned by the session's :class:`TaskRegistry`, which:

* keeps a :class:`TaskRecord` per task (attrs, frozen: every change replaces it) and writes each
  record to the session file (``{"type": "task", ...}``), so a resumed session knows which tasks were
  running when its process ended (:func:`cut_off`);
* watches the task: a command is waited for (and stopped after its background timeout), its exit
  appended to its output file as Claude Code 2.1.332 does (``[exited with code N]``);
* tells the client (stream-json ``system`` messages ``background_tasks_changed``, ``task_started``,
  ``task_updated``, ``task_notification``, with Claude Code's fields) and, when a task ends on its
  own, queues its ``<task-notification>`` for the model (:func:`agentfsm.machine.prompts.task_notification`)
  as a ``task_notification`` item of the session's input queue. A task the model stopped
  (``TaskStop``) notifies the client only: Claude Code's model is told by the TaskStop result;
* stops tasks: one (:meth:`TaskRegistry.stop`, the TaskStop tool) or all of them when the session
  closes (:meth:`TaskRegistry.stop_all`): nothing a session started outlives it.

Every fact here was read off recorded Claude Code runs (tests/fixtures/background/, made by its
``record.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import string
import tempfile
import time
from collections.abc import Callable, Container, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from agentfsm.common import log
from agentfsm.machine import prompts
from agentfsm.runtime.queue import TASK_NOTIFICATION, InputQueue
from agentfsm.tools.base import TaskStarted, TaskStopped

Emit = Callable[[dict[str, Any]], None]

LOCAL_BASH, LOCAL_AGENT = "local_bash", "local_agent"
RUNNING, COMPLETED, FAILED, KILLED = "running", "completed", "failed", "killed"
STATUSES = frozenset({RUNNING, COMPLETED, FAILED, KILLED})
#: How long a background command may run unless its call says (Claude Code 2.1.332: 10 minutes) ...
DEFAULT_BACKGROUND_TIMEOUT_MS = 600_000
#: ... and at most (its Bash schema: 7200000 ms).
MAX_BACKGROUND_TIMEOUT_MS = 7_200_000
#: How long a stopped command gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 2.0
_ID_CHARS = string.ascii_lowercase + string.digits


@attrs.frozen
class TaskRecord:
    """One background task. ``status``: ``running``, then ``completed`` / ``failed`` (it ended on its
    own) or ``killed`` (stopped: by the model, its timeout, or the session's end). ``notified``: its
    notification was queued for the model."""

    task_id: str
    task_type: str
    tool_use_id: str
    description: str
    output_file: str
    command: str = ""
    status: str = attrs.field(default=RUNNING, validator=attrs.validators.in_(STATUSES))
    exit_code: int | None = None
    started_ms: int = 0
    ended_ms: int | None = None
    summary: str = ""
    notified: bool = False

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def to_record(self) -> dict[str, Any]:
        """The session file's record of this task's current state."""
        return {"type": "task", **attrs.asdict(self)}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TaskRecord | None:
        """A record read back from a session file; None when it is not a usable task record."""
        fields = {f.name for f in attrs.fields(cls)}
        try:
            return cls(**{k: v for k, v in rec.items() if k in fields})
        except (TypeError, ValueError):
            return None


def tasks_dir(session_id: str) -> Path:
    """Where a session's background tasks write their output: a folder of its own under the temporary
    directory (Claude Code keeps them under ``/tmp/claude-<uid>/<project>/<session>/tasks``)."""
    return Path(tempfile.gettempdir()) / "agentfsm" / (session_id or "default") / "tasks"


def cut_off(records: Mapping[str, TaskRecord]) -> tuple[TaskRecord, ...]:
    """The tasks a session file says were still running when its last process ended: a resumed
    session reports them (their processes did not survive it)."""
    return tuple(r for r in records.values() if r.running)


def read_task_records(records: Iterable[Mapping[str, Any]]) -> dict[str, TaskRecord]:
    """Each task's last state among a session file's records (``{"type": "task"}``; unusable ones are
    skipped)."""
    out: dict[str, TaskRecord] = {}
    for raw in records:
        if raw.get("type") == "task":
            rec = TaskRecord.from_record(raw)
            if rec is not None:
                out[rec.task_id] = rec
    return out


def agent_running(registry: object) -> bool:
    """A background subagent of ``registry`` (a session's :class:`TaskRegistry`; anything else has
    none) still runs."""
    return any(t.running and t.task_type == LOCAL_AGENT for t in getattr(registry, "tasks", {}).values())


def command_summary(description: str, status: str, exit_code: int | None) -> str:
    """The ``<summary>`` of a finished background command (Claude Code's words)."""
    if status == COMPLETED:
        return f'Background command "{description}" completed (exit code {exit_code})'
    if status == FAILED:
        return f'Background command "{description}" failed with exit code {exit_code}'
    return f'Background command "{description}" was stopped'


def new_task_id(task_type: str, taken: Container[str] = ()) -> str:
    """A fresh task id not in ``taken``: ``b`` and 8 characters for a command, ``a`` and 16 hex digits
    for an agent (the shapes of Claude Code's)."""
    while True:
        if task_type == LOCAL_BASH:
            tid = "b" + "".join(secrets.choice(_ID_CHARS) for _ in range(8))
        else:
            tid = "a" + secrets.token_hex(8)
        if tid not in taken:
            return tid


def running_list(records: Iterable[TaskRecord]) -> list[dict[str, Any]]:
    """The running tasks as the Stop hook's ``background_tasks`` and ``background_tasks_changed``
    list them."""
    return [{"task_id": t.task_id, "task_type": t.task_type, "description": t.description}
            for t in records if t.running]


def started_messages(rec: TaskRecord, running: list[dict[str, Any]],
                     extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """What the client is told when a task starts (stream-json ``system`` messages, Claude Code's
    fields; without ``session_id``)."""
    return [{"type": "system", "subtype": "background_tasks_changed", "tasks": running},
            {"type": "system", "subtype": "task_started", "task_id": rec.task_id, "tool_use_id": rec.tool_use_id,
             "description": rec.description, "is_backgrounded": True, "task_type": rec.task_type, **(extra or {})}]


def finished_messages(rec: TaskRecord, running: list[dict[str, Any]], *, status: str,
                      summary: str) -> list[dict[str, Any]]:
    """What the client is told when a task ended: its new status, the status and summary it is shown
    (``stopped`` and the description for a task the model stopped), and the tasks still running."""
    return [{"type": "system", "subtype": "task_updated", "task_id": rec.task_id,
             "patch": {"status": rec.status, "end_time": rec.ended_ms}},
            {"type": "system", "subtype": "task_notification", "task_id": rec.task_id,
             "tool_use_id": rec.tool_use_id, "status": status, "output_file": rec.output_file, "summary": summary},
            {"type": "system", "subtype": "background_tasks_changed", "tasks": running}]


@attrs.define
class _Live:
    """What runs for a task: a command's process, or a subagent's asyncio task."""

    process: asyncio.subprocess.Process | None = None
    task: asyncio.Future[Any] | None = None
    watcher: asyncio.Task[None] | None = None
    on_exit: Callable[[], None] | None = None
    interrupt: Callable[[], None] | None = None
    stopping: bool = False


class TaskRegistry:
    """The background tasks of one session (see the module docstring). Lives on the session's event
    loop: tools call it from their calls, watchers run as tasks of that loop."""

    def __init__(self, *, session_id: str, tasks_dir: Path, queue: InputQueue, emit: Emit | None = None,
                 record: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.session_id = session_id
        self.tasks_dir = tasks_dir
        self.queue = queue
        self._emit_fn = emit
        self._record = record
        self.tasks: dict[str, TaskRecord] = {}
        self._live: dict[str, _Live] = {}
        self._closed = False
        self._cut_off: tuple[TaskRecord, ...] = ()  # found by restore(), announced at the next run
        self.log = log.get_logger("agentfsm.tasks", session_id=session_id)

    # --- inspection ------------------------------------------------------------------------------

    @property
    def running(self) -> tuple[str, ...]:
        """Ids of the tasks still running, in the order they started."""
        return tuple(t.task_id for t in self.tasks.values() if t.running)

    def get(self, task_id: str) -> TaskRecord | None:
        return self.tasks.get(task_id)

    def background_tasks(self) -> list[dict[str, Any]]:
        """The running tasks as the Stop hook's ``background_tasks`` and ``background_tasks_changed``
        list them."""
        return running_list(self.tasks.values())

    # --- starting --------------------------------------------------------------------------------

    def new_id(self, task_type: str) -> str:
        """A fresh task id: ``b`` and 8 characters for a command, ``a`` and 16 hex digits for an agent
        (the shapes of Claude Code's)."""
        return new_task_id(task_type, self.tasks)

    def output_path(self, task_id: str) -> Path:
        return self.tasks_dir / f"{task_id}.output"

    def adopt_command(self, process: asyncio.subprocess.Process, output_path: Path, *, command: str,
                      description: str, tool_use_id: str, timeout_ms: float,
                      on_exit: Callable[[], None] | None = None) -> TaskStarted:
        """Own a started command as a background task (see :class:`agentfsm.tools.base.TaskHost`):
        its output file moves to the tasks folder (the command keeps writing to it: a rename keeps the
        open file), it is watched, stopped after ``timeout_ms``, and its end notifies."""
        if self._closed:
            raise RuntimeError("the session is closing: no new background task may start")
        task_id = self.new_id(LOCAL_BASH)
        target = self.output_path(task_id)
        try:
            self.tasks_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.replace(output_path, target)
        except OSError:
            target = output_path  # another file system: the output stays where it is being written
        live = _Live(process=process, on_exit=on_exit)
        self._live[task_id] = live
        self._started(TaskRecord(task_id, LOCAL_BASH, tool_use_id, description or command, str(target),
                                 command=command, started_ms=_now_ms()))
        live.watcher = asyncio.get_running_loop().create_task(
            self._watch_command(task_id, live, target, timeout_ms), name=f"task:{task_id}")
        return TaskStarted(task_id, str(target))

    async def ended(self, task_id: str) -> None:
        """Return once the task's watcher has reported its end (its notification queued): the Bash tool
        waits for it before answering a call whose command ended after its timeout moved it here."""
        live = self._live.get(task_id)
        if live is not None and live.watcher is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(live.watcher)

    def adopt_agent(self, task_id: str, task: asyncio.Future[Any], *, description: str, tool_use_id: str,
                    output_file: str, subagent_type: str = "", prompt: str = "",
                    interrupt: Callable[[], None] | None = None) -> TaskRecord:
        """Own a background subagent's run (its end is reported by :meth:`agent_finished`)."""
        if self._closed:
            raise RuntimeError("the session is closing: no new background task may start")
        self._live[task_id] = _Live(task=task, interrupt=interrupt)
        started = {"subagent_type": subagent_type, "prompt": prompt} if subagent_type else {}
        return self._started(TaskRecord(task_id, LOCAL_AGENT, tool_use_id, description, output_file,
                                        started_ms=_now_ms()), started)

    def _started(self, rec: TaskRecord, extra: Mapping[str, Any] | None = None) -> TaskRecord:
        self.tasks[rec.task_id] = rec
        self._write(rec)
        self.log.info("task.start", task_id=rec.task_id, task_type=rec.task_type, tool_use_id=rec.tool_use_id)
        for msg in started_messages(rec, self.background_tasks(), extra):
            self._emit(msg)
        return rec

    # --- watching --------------------------------------------------------------------------------

    async def _watch_command(self, task_id: str, live: _Live, output: Path, timeout_ms: float) -> None:
        process = live.process
        assert process is not None
        timed_out = False
        try:
            try:
                await asyncio.wait_for(process.wait(), timeout_ms / 1000)
            except TimeoutError:
                timed_out = True
                await _kill_group(process)
        except asyncio.CancelledError:
            # the session is closing (stop_all): nothing of the command may outlive it
            await asyncio.shield(_kill_group(process))
            raise
        finally:
            if live.on_exit is not None:
                with contextlib.suppress(Exception):
                    live.on_exit()
                live.on_exit = None
        if live.stopping or not self.tasks[task_id].running:
            return  # stop() or stop_all() reports it
        code = _exit_code(process.returncode)
        rec = self.tasks[task_id]
        if timed_out:
            self._finish(task_id, KILLED, code, prompts.background_timeout_summary(rec.description), notify=True)
            return
        with contextlib.suppress(OSError):
            with output.open("a", encoding="utf-8") as fh:
                fh.write(f"\n[exited with code {code}]\n")
        status = COMPLETED if code == 0 else FAILED
        self._finish(task_id, status, code, command_summary(rec.description, status, code), notify=True)

    def agent_finished(self, task_id: str, status: str, result: str, *, usage: Mapping[str, Any] | None = None,
                       notify: bool = True) -> TaskRecord | None:
        """A background subagent's run ended (``completed``, ``failed`` or ``killed``). The client's
        summary is the agent's report, the model's says the agent finished (Claude Code's)."""
        rec = self.tasks.get(task_id)
        live = self._live.get(task_id)
        if rec is None or not rec.running or (live is not None and live.stopping):
            return rec  # not ours, reported already, or being stopped (stop() reports it)
        summary = f'Agent "{rec.description}" {"finished" if status == COMPLETED else status}'
        return self._finish(task_id, status, None, summary, notify=notify, result=result, usage=usage,
                            client_summary=result)

    def _finish(self, task_id: str, status: str, exit_code: int | None, summary: str, *, notify: bool,
                result: str | None = None, usage: Mapping[str, Any] | None = None,
                client_status: str | None = None, client_summary: str | None = None) -> TaskRecord:
        current = self.tasks[task_id]
        if not current.running:
            return current  # a task ends once: whoever reports it second says nothing
        rec = attrs.evolve(current, status=status, exit_code=exit_code, ended_ms=_now_ms(),
                           summary=summary, notified=notify and not self._closed)
        self.tasks[task_id] = rec
        self._live.pop(task_id, None)
        self._write(rec)
        self.log.info("task.end", task_id=task_id, status=status, exit_code=exit_code, notified=rec.notified)
        # what the client is told: the status (``stopped`` for a task the model stopped) and a summary
        # (the task's description when stopped; a subagent's own report)
        shown = rec.description if client_status is not None else client_summary or summary
        for msg in finished_messages(rec, self.background_tasks(), status=client_status or status, summary=shown):
            self._emit(msg)
        if rec.notified:
            text = prompts.task_notification(task_id=task_id, tool_use_id=rec.tool_use_id,
                                             output_file=rec.output_file, status=status, summary=summary,
                                             result=result, usage=usage)
            self.queue.submit(text, kind=TASK_NOTIFICATION)
        else:
            self.queue.poke()  # whoever waits for a task to report re-checks
        return rec

    # --- stopping --------------------------------------------------------------------------------

    async def stop(self, task_id: str) -> TaskStopped | None:
        """Stop a running task (the TaskStop tool): the client is told (status ``stopped``), the model
        is not notified (the tool's result says it). None when no running task has this id."""
        rec = self.tasks.get(task_id)
        live = self._live.get(task_id)
        if rec is None or not rec.running or live is None:
            return None
        await self._halt(live)
        # (it may have ended meanwhile, on its own or by the session's end: then that end stands)
        self._finish(task_id, KILLED, None, rec.description, notify=False, client_status="stopped")
        return TaskStopped(task_id, rec.task_type, rec.command or rec.description)

    async def _halt(self, live: _Live) -> None:
        live.stopping = True
        if live.process is not None:
            await _kill_group(live.process)
            if live.watcher is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await live.watcher
        elif live.task is not None and not live.task.done():
            if live.interrupt is not None:  # a subagent: interrupted, given a grace period to end
                live.interrupt()
                await asyncio.wait({live.task}, timeout=STOP_GRACE_S)
            if not live.task.done():
                live.task.cancel()
                await asyncio.wait({live.task}, timeout=STOP_GRACE_S * 2)

    async def stop_all(self) -> None:
        """The session closes: every task still running is stopped (no notification: nobody is left
        to read it) and recorded as ``killed``. Idempotent."""
        self._closed = True
        for task_id in self.running:
            live = self._live.get(task_id)
            if live is not None:
                await self._halt(live)
            if self.tasks[task_id].running:
                self._finish(task_id, KILLED, None, prompts.BACKGROUND_SESSION_ENDED, notify=False)

    async def cut_off_all(self) -> None:
        """The process ends on the user's interrupt (Ctrl-C in ``-p``), as Claude Code 2.1.332's does
        (tests/fixtures/background/ctrl_c): every running task is stopped — a command's process group
        and a subagent with whatever it runs — before the run's result; the client is told of each
        command (``stopped``, its description), not of a subagent; no notification is queued, and the
        session file keeps no end for them, so a resumed session reports them cut off
        (:meth:`restore`). Idempotent; :meth:`stop_all` after it finds nothing running."""
        self._closed = True
        for task_id in self.running:
            rec = self.tasks[task_id]
            # ended in memory first: whoever reports the task's end meanwhile (its watcher, the
            # subagent's run) finds it ended and says nothing
            self.tasks[task_id] = attrs.evolve(rec, status=KILLED, ended_ms=_now_ms(),
                                               summary=prompts.BACKGROUND_SESSION_ENDED)
            live = self._live.pop(task_id, None)
            if live is not None:
                await self._halt(live)
            self.log.info("task.cut_off", task_id=task_id, task_type=rec.task_type)
            if rec.task_type != LOCAL_BASH:
                continue
            self._emit({"type": "system", "subtype": "task_notification", "task_id": task_id,
                        "tool_use_id": rec.tool_use_id, "status": "stopped", "output_file": rec.output_file,
                        "summary": rec.description})
            self._emit({"type": "system", "subtype": "task_updated", "task_id": task_id,
                        "patch": {"status": KILLED, "end_time": self.tasks[task_id].ended_ms}})
            self._emit({"type": "system", "subtype": "background_tasks_changed", "tasks": self.background_tasks()})

    # --- resume ----------------------------------------------------------------------------------

    def restore(self, records: Mapping[str, TaskRecord]) -> tuple[TaskRecord, ...]:
        """A resumed session's tasks, as its file last recorded them. Those it left running were cut
        off with the process that ran them (nothing of a session outlives it): they are recorded
        ``killed`` now, and :meth:`announce_cut_off` tells the client and the model at the next run."""
        cut = cut_off(records)
        for task_id, rec in records.items():
            self.tasks[task_id] = rec
        for rec in cut:
            ended = attrs.evolve(rec, status=KILLED, ended_ms=_now_ms(), summary=prompts.task_cut_off_summary(rec))
            self.tasks[rec.task_id] = ended
            self._write(ended)
        self._cut_off = tuple(self.tasks[r.task_id] for r in cut)
        return self._cut_off

    def announce_cut_off(self) -> None:
        """Tell the client and the model of the tasks a resumed session found cut off (once), as
        Claude Code 2.1.332 does (tests/fixtures/background/ctrl_c, ``resume_stream.jsonl``): status
        ``stopped``, subagents first; a subagent's notification names its output file, a command's
        the tool call that started it, and each carries a note on what may be left of it."""
        cut, self._cut_off = self._cut_off, ()
        for rec in sorted(cut, key=lambda r: r.task_type == LOCAL_BASH):
            agent = rec.task_type != LOCAL_BASH
            self._emit({"type": "system", "subtype": "task_notification", "task_id": rec.task_id,
                        "tool_use_id": rec.tool_use_id, "status": "stopped", "output_file": rec.output_file,
                        "summary": rec.summary})
            self.queue.submit(prompts.task_notification(
                task_id=rec.task_id, tool_use_id=None if agent else rec.tool_use_id,
                output_file=rec.output_file if agent else None, status="stopped", summary=rec.summary,
                note=prompts.TASK_CUT_OFF_NOTE_AGENT if agent else prompts.TASK_CUT_OFF_NOTE_COMMAND),
                kind=TASK_NOTIFICATION)

    # --- output ----------------------------------------------------------------------------------

    def _emit(self, msg: dict[str, Any]) -> None:
        if self._emit_fn is not None:
            self._emit_fn({**msg, "session_id": self.session_id})

    def _write(self, rec: TaskRecord) -> None:
        if self._record is not None:
            self._record(rec.to_record())


def _now_ms() -> int:
    return int(time.time() * 1000)


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _group_running(pgid: int) -> bool:
    """Whether a process of the group still runs: one not ended, or ended and not reaped (a zombie,
    which runs nothing) does not count. Read from ``/proc`` where there is one; elsewhere any member
    the group signal still reaches counts."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


async def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the command's process group, SIGKILL what is left after :data:`STOP_GRACE_S`, and wait
    (at most :data:`STOP_GRACE_S` more) until no process of the group runs: a signal only marks its
    target, which ends when it is next scheduled, so the leader's end does not mean its children's."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
    # whatever of the group outlived its leader goes too
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()
    deadline = time.monotonic() + STOP_GRACE_S
    while _group_running(process.pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
