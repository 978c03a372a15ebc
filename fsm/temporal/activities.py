"""The activities: everything a session does that touches the world, run on any worker.

Each activity performs one piece of phase work the same way the local driver does (the shared code is
:mod:`agentfsm.runtime.phases`, :func:`agentfsm.runtime.pipeline.run_tool_call`,
:func:`agentfsm.runtime.compact.compact`, the
session's gate and hooks from :mod:`agentfsm.sessions.compose`), and returns what it observed as a record. The
workflow decides; activities never do.

Failures, by activity (docs/behaviour.md §11):

* ``call_model`` — a model request is idempotent, so an attempt lost with its worker is simply made
  again (after the heartbeat timeout); what the lost attempt showed is withdrawn with a tombstone.
  Classified model errors are results, never exceptions: the graph decides about retries.
* ``run_tool`` — a call whose worker died is **not** run again unless the tool says it is read-only:
  the next attempt kills what is left of the lost attempt's process group (same host), and answers
  with an ``is_error`` result saying the call was interrupted (:data:`agentfsm.runtime.pipeline.WORKER_LOST`)
  — unless the lost attempt had already finished and left its outcome file, which is then returned.
  Side effects happen at most once; every tool_use still gets exactly one tool_result.
* ``append_trace`` (a local activity) — appends session-file lines idempotently by record number.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import hashlib
import json
import os
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import cattrs
from temporalio import activity
from temporalio.exceptions import ApplicationError

from agentfsm.common import log
from agentfsm.llm.model import ModelCallError, ModelClient, ModelRequest, RetryNotice, StreamEvent
from agentfsm.machine.events import ModelError, SetupFailed, StopHookVerdict
from agentfsm.machine.options import Options
from agentfsm.machine.state import Message, TerminalReason
from agentfsm.runtime import phases
from agentfsm.runtime.assembler import ResponseAssembler
from agentfsm.runtime.compact import compact, reactive_split, split_for_compaction
from agentfsm.runtime.executor import call_traits
from agentfsm.runtime.pipeline import WORKER_LOST, CallResult, ToolTable, run_tool_call, synthetic_result
from agentfsm.runtime.request import WireCache, system_blocks
from agentfsm.runtime.tasks import (
    COMPLETED,
    FAILED,
    KILLED,
    LOCAL_AGENT,
    LOCAL_BASH,
    STOP_GRACE_S,
    _exit_code,
    _kill_group,
    cut_off,
    new_task_id,
    read_task_records,
    tasks_dir,
)
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.resume import heal_tail, load_history
from agentfsm.temporal import NON_RETRYABLE, workflow_id
from agentfsm.temporal.convert import CONVERTER, spec_digest
from agentfsm.temporal.records import (
    HOOK_EVENTS,
    SEND_WHOLE,
    AgentStart,
    CompactInput,
    CompactOutcome,
    MessageRef,
    ModelCallInput,
    ModelCallOutcome,
    OpenRunInput,
    PostBatchInput,
    PostBatchOutcome,
    RunSetup,
    SessionSpec,
    StopInput,
    TaskEnd,
    TaskStart,
    ToolBatchInput,
    ToolBatchOutcome,
    ToolCallInput,
    ToolCallOutcome,
    ToolTraits,
    TraceBatch,
    chain_digest,
    message_digest,
    spec_file,
)
from agentfsm.tools.base import TASKS, TaskStarted, TaskStopped, ToolContext, ToolError
from agentfsm.tools.bash import PROCESS_GUARD
from agentfsm.tools.sandbox import SANDBOX

HOST = socket.gethostname()
try:
    BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
except OSError:  # not Linux: a stale process group is only killed by the same worker process
    BOOT_ID = f"pid-{os.getpid()}"
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: the kernel kills it when the worker dies (kill -9 included)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _ProcessGuard:
    """The Bash tool's process guard (:data:`agentfsm.tools.bash.PROCESS_GUARD`): commands die with
    the worker, and their process groups are reported in the heartbeat so a later attempt can kill
    grandchildren that outlived it."""

    preexec = staticmethod(_die_with_parent)

    def __init__(self, details: dict[str, Any], *, local: bool = False, file: Path | None = None) -> None:
        self.details = details
        self.local, self.file = local, file  # a local attempt (no heartbeats): the groups go to this file

    def started(self, pgid: int) -> None:
        self.details.setdefault("pgids", []).append(pgid)
        if not self.local:
            activity.heartbeat(self.details)
            return
        if self.file is None:  # no safe place for it: the commands still die with this worker
            return
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.details))
        os.replace(tmp, self.file)


def _pgid_file(workflow_id: str, tool_use_id: str) -> Path | None:
    """Where a local attempt keeps its process groups: on this host (only this host can kill them), in
    a directory of this user's that no one else can write (else None: a planted file must not make
    a worker kill process groups it did not start), named by the call."""
    top = Path(tempfile.gettempdir()) / f"agentfsm-{os.getuid()}"
    d = top / "pgids"
    try:
        for p in (top, d):
            with contextlib.suppress(FileExistsError):
                p.mkdir(mode=0o700)
            st = os.lstat(p)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                return None
    except OSError:
        return None
    name = hashlib.sha256(f"{workflow_id}\0{tool_use_id}".encode()).hexdigest()[:32]
    return d / f"{name}.json"


def _read_json(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_only(tool: Any, block: Mapping[str, Any], invalid_json: str | None) -> bool:
    """The tool says this call only reads (a call it cannot judge does not)."""
    if tool is None or invalid_json is not None:
        return False
    try:
        return bool(tool.is_read_only(dict(block.get("input") or {})))
    except Exception:
        return False


def _task_target(tool: Any, block: Mapping[str, Any], invalid_json: str | None) -> str | None:
    """The background task the call acts on, as the tool says (None: none, or it cannot judge)."""
    if tool is None or invalid_json is not None:
        return None
    try:
        target = tool.task_target(dict(block.get("input") or {}))
    except Exception:
        return None
    return target if isinstance(target, str) else None


def _kill_stale(details: Mapping[str, Any]) -> list[int]:
    """Kill the process groups a lost attempt left on this host; the ones it killed."""
    if details.get("host") != HOST or details.get("boot_id") != BOOT_ID:
        return []
    killed = []
    for pgid in details.get("pgids", ()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pgid), signal.SIGKILL)
            killed.append(int(pgid))
    return killed


@contextlib.asynccontextmanager
async def _heartbeats(details: Callable[[], Any]) -> AsyncIterator[None]:
    """Heartbeat while the body runs: a silent wait (the SDK's retry backoff, a quiet command) must not
    look like a dead worker, and a heartbeat is how a cancellation reaches the activity — so at least
    once a second, and three times per heartbeat timeout."""
    timeout = activity.info().heartbeat_timeout
    interval = min(1.0, max(0.2, timeout.total_seconds() / 3)) if timeout else 1.0

    async def beat() -> None:
        while True:
            activity.heartbeat(details())
            await asyncio.sleep(interval)

    task = asyncio.ensure_future(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _previous_details() -> dict[str, Any]:
    details = activity.info().heartbeat_details
    first = details[0] if details else None
    return dict(first) if isinstance(first, Mapping) else {}


# --- background commands on this worker ---------------------------------------------------------------


@attrs.define
class _Background:
    """A background command running on this worker: its process, and its end once known (a watcher of
    this worker's own ends it after its background timeout, whether or not a ``watch_task`` activity
    ever comes for it: nothing a session started runs on unbounded)."""

    process: asyncio.subprocess.Process
    output: Path
    ended: asyncio.Future[TaskEnd]
    session_id: str = ""
    command: str = ""  # what TaskStop's answer names: the command (its description when it has none)
    watcher: asyncio.Task[None] | None = None
    stopping: bool = False


class _WorkerTasks:
    """The Bash tool's task host (:class:`agentfsm.tools.base.TaskHost`) inside one ``run_tool``
    activity: a command it adopts runs on in this worker process, and the call's outcome names it
    (:class:`TaskStart`) so the workflow starts its ``watch_task`` activity on this worker's own queue.
    A TaskStop call of a task of the session runs on the task's worker's own queue (the workflow sends
    it there): :meth:`stop` stops the command here, and the call's outcome names it (``stopped``). The
    workflow owns the task record and the notification."""

    def __init__(self, acts: Activities, session_id: str, agents: Mapping[str, str] | None = None) -> None:
        self.acts, self.session_id = acts, session_id
        self.started: list[TaskStart] = []
        self.stopped: list[str] = []
        # the session's running background agents this call may stop (the workflow says which)
        self.agents = dict(agents or {})

    def adopt_command(self, process: asyncio.subprocess.Process, output_path: Path, *, command: str,
                      description: str, tool_use_id: str, timeout_ms: float,
                      on_exit: Callable[[], None] | None = None) -> TaskStarted:
        if self.acts.task_queue is None:
            raise RuntimeError("this worker keeps no background tasks (it has no queue of its own)")
        task_id = new_task_id(LOCAL_BASH, self.acts.background)
        folder = tasks_dir(self.session_id)
        target = folder / f"{task_id}.output"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.replace(output_path, target)
        except OSError:
            target = output_path  # another file system: the output stays where it is being written
        loop = asyncio.get_running_loop()
        bg = _Background(process, target, loop.create_future(), self.session_id, command or description)
        self.acts.background[task_id] = bg
        bg.watcher = loop.create_task(_watch_background(bg, timeout_ms, on_exit), name=f"task:{task_id}")
        self.started.append(TaskStart(task_id, tool_use_id, description or command, str(target), command,
                                      timeout_ms, self.acts.task_queue, HOST, BOOT_ID, process.pid))
        return TaskStarted(task_id, str(target))

    async def stop(self, task_id: str) -> TaskStopped | None:
        """Stop a running command of this session that runs on this worker, as a local session's
        registry does (SIGTERM to its group, SIGKILL after the grace; its watch then reports it
        ``killed``). None when no such command runs here: it is not the session's, it ended, or it runs
        on another worker (the workflow sends a call naming a running task to the task's worker).
        A background agent of the session (its workflow a child of the session's) is interrupted and,
        after the same grace, aborted, as a local session's registry stops one."""
        if task_id in self.agents:
            await _stop_agent(task_id)
            self.stopped.append(task_id)
            return TaskStopped(task_id, LOCAL_AGENT, self.agents[task_id])
        bg = self.acts.background.get(task_id)
        if bg is None or bg.session_id != self.session_id or bg.ended.done() or bg.stopping:
            return None
        bg.stopping = True
        await _kill_group(bg.process)
        if bg.watcher is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(bg.watcher)
        self.stopped.append(task_id)
        return TaskStopped(task_id, LOCAL_BASH, bg.command)

    async def ended(self, task_id: str) -> None:
        # the end is recorded on this worker; the workflow's watch_task activity reports it
        bg = self.acts.background.get(task_id)
        if bg is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(bg.ended)


async def _stop_agent(agent_id: str) -> None:
    """Stop a background agent's session workflow: interrupted (it ends its turn as the user's Ctrl-C
    ends one), aborted when it has not ended after :data:`STOP_GRACE_S`, cancelled after twice that."""
    handle = activity.client().get_workflow_handle(workflow_id(agent_id))
    for signal_name, grace in (("interrupt", STOP_GRACE_S), ("abort", STOP_GRACE_S * 2)):
        try:
            await handle.signal(signal_name)
            await asyncio.wait_for(handle.result(), grace)
            return
        except TimeoutError:
            continue
        except Exception:  # it ended meanwhile (a signal to an ended workflow fails), or failed
            return
    with contextlib.suppress(Exception):
        await handle.cancel()


class _WorkerAgents:
    """The Agent tool's ``run_subagent`` service inside one tool call's activity on a worker: a
    background agent is a session of its own, set up here as a local session sets one up
    (:mod:`agentfsm.sessions.subagents`: its options, its tools, the parent's SubagentStart hooks) and
    named in the call's outcome (:class:`AgentStart`); the workflow runs it as a child workflow and owns
    its task record and notification."""

    def __init__(self, spec: SessionSpec, ctx: _Context) -> None:
        self.spec, self.ctx = spec, ctx
        self.launched: list[AgentStart] = []

    async def __call__(self, request: Any) -> Any:
        from agentfsm.machine.options import PERMISSION_MODES, AgentDefinition
        from agentfsm.machine.prompts import reminder_blocks
        from agentfsm.runtime.trace import sessions_dir
        from agentfsm.sessions.subagents import MAX_AGENT_DEPTH
        from agentfsm.tools.agent import SubagentOutcome, builtin_agents
        from agentfsm.tools.structured_output import NAME as STRUCTURED_OUTPUT

        spec = self.spec
        definitions = {name: AgentDefinition(description=desc, prompt=prompt)
                       for name, (desc, prompt) in builtin_agents().items()}
        definitions.update(spec.agents)
        definition = definitions.get(request.subagent_type)
        if definition is None:
            raise ToolError(f"Agent type '{request.subagent_type}' not found. Available agents: "
                            f"{', '.join(definitions)}")
        if spec.depth + 1 > MAX_AGENT_DEPTH:
            raise ToolError(f"Agents may nest at most {MAX_AGENT_DEPTH} deep; do this task yourself.")
        if not request.background:
            raise ToolError("An agent runs in the background on a Temporal worker: run_in_background: false "
                            "is not available there. Launch it in the background and end your turn to wait "
                            "for its notification.")
        agent_id = str(uuid.uuid4())
        mode = getattr(self.ctx.gate, "permission_mode", None)
        names = tuple(n for n in self.ctx.registry.names() if n != STRUCTURED_OUTPUT and (
            (definition.tools is None and n != "Agent") or (definition.tools is not None and n in definition.tools)))
        base = Path(spec.trace_path).parent if spec.trace_path else sessions_dir(spec.options())
        folder = base / spec.session_id / "subagents"
        trace = str(folder / f"{agent_id}.jsonl") if spec.trace_path else None
        child = attrs.evolve(
            spec, session_id=agent_id, model=definition.model or spec.model,
            fallback_models=() if definition.model else spec.fallback_models, tools=names,
            permission_mode=mode if mode in PERMISSION_MODES else spec.permission_mode,
            limits=definition.limits or spec.limits, system_prompt=definition.prompt, append_system_prompt=None,
            json_schema=None, sessions_dir=str(folder), trace_path=trace, parent_session_id=spec.session_id,
            agent_type=request.subagent_type, depth=spec.depth + 1, parent_trace_path=spec.trace_path,
            parent_prompt_id=getattr(self.ctx.gate, "prompt_id", None))
        start = getattr(self.ctx.gate, "subagent_start", None)
        extra = tuple(await start(agent_id=agent_id, agent_type=request.subagent_type)) if start is not None else ()
        blocks = ({"type": "text", "text": request.prompt}, *reminder_blocks(extra))
        self.launched.append(AgentStart(agent_id, request.tool_use_id, request.description, request.prompt,
                                        request.subagent_type, trace or "", child, blocks))
        return SubagentOutcome(agent_id=agent_id, launched=True, transcript_path=trace or "")


class _ParentIds:
    """What a subagent's hook inputs name of the session that launched it (a local subagent's gate
    reads them from its parent's gate: agentfsm.hooks.gate.HookGate._common)."""

    def __init__(self, session_id: str, transcript_path: str, prompt_id: str | None) -> None:
        self.session_id, self.transcript_path, self.prompt_id = session_id, transcript_path, prompt_id

    def _common(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "transcript_path": self.transcript_path, "prompt_id": self.prompt_id}


async def _watch_background(bg: _Background, timeout_ms: float, on_exit: Callable[[], None] | None) -> None:
    """Wait for the command; stop it after its background timeout; record how it ended (and append its
    exit to its output file, as Claude Code 2.1.332 does)."""
    process = bg.process
    timed_out = False
    try:
        try:
            await asyncio.wait_for(process.wait(), timeout_ms / 1000)
        except TimeoutError:
            timed_out = True
            await _kill_group(process)
    except asyncio.CancelledError:
        await asyncio.shield(_kill_group(process))
        raise
    finally:
        if on_exit is not None:
            with contextlib.suppress(Exception):
                on_exit()
    code = _exit_code(process.returncode)
    if timed_out or bg.stopping:
        end = TaskEnd(KILLED, code, timed_out=timed_out, stopped=bg.stopping and not timed_out)
    else:
        with contextlib.suppress(OSError):
            with bg.output.open("a", encoding="utf-8") as fh:
                fh.write(f"\n[exited with code {code}]\n")
        end = TaskEnd(COMPLETED if code == 0 else FAILED, code)
    if not bg.ended.done():
        bg.ended.set_result(end)


# --- a session's context on this worker ------------------------------------------------------------


@attrs.define
class _Context:
    """One session's tools, gate and hooks, rebuilt on a worker from its :class:`SessionSpec`."""

    options: Options
    registry: Any
    table: ToolTable
    gate: Any
    setup_error: str | None
    # the `sandbox` records of the calls running now, by tool_use_id (each call's go into its outcome)
    sandbox_records: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        return value

    def hit(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value


class _MessageIndex:
    """The ``message`` records of one session file by uuid (the last record of a uuid wins), read
    incrementally: the file only grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.messages: dict[str, tuple[str, Message]] = {}
        self.lock = threading.Lock()

    def refresh(self) -> None:
        with self.lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                return
            if st.st_ino != self.inode or st.st_size < self.offset:
                self.inode, self.offset, self.messages = st.st_ino, 0, {}
            if st.st_size == self.offset:
                return
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # whole lines only; a line being written is read next time
            for line in data[:end].splitlines():
                if b'"message"' not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") != "message" or not isinstance(rec.get("uuid"), str):
                    continue
                role, kind, content = rec.get("role"), rec.get("kind", "prompt"), rec.get("content") or []
                self.messages[rec["uuid"]] = (message_digest(role, kind, content),
                                              Message(role, tuple(content), kind=kind, uuid=rec["uuid"]))
            self.offset += end

    def get(self, ref: MessageRef) -> Message | None:
        hit = self.messages.get(ref.uuid)
        return hit[1] if hit is not None and hit[0] == ref.digest else None


@attrs.define
class _Chain:
    """The messages of a session's last request on this worker, the digest of each prefix
    (:func:`agentfsm.temporal.records.chain_digest`) and their wire view."""

    messages: tuple[Message, ...] = ()
    digests: list[str] = attrs.field(factory=list)
    wire: WireCache = attrs.field(factory=WireCache)


class _PinnedScript:
    """The scripted model answering one request with the scenario's response number ``n`` — the same
    answer on every attempt, with the message id the in-process scripted model gives the Nth request."""

    def __init__(self, scenario: Any, n: int) -> None:
        self.scenario, self.n = scenario, n

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        from agentfsm.llm.model import classify_error
        from agentfsm.testing.scenario import HttpErrorResponse, response_events
        from agentfsm.testing.scripted import estimate_input_tokens, stream_error

        resp = self.scenario.response_for(self.n)
        if resp.delay_s:
            await asyncio.sleep(resp.delay_s)
        if isinstance(resp, HttpErrorResponse):
            raise ModelCallError(classify_error(resp.status, resp.error_type, resp.message))
        events = response_events(resp, request.model, input_tokens=estimate_input_tokens(request.body()),
                                 message_id=f"msg_scripted_{self.n:06d}")
        for event in events:
            if event.record is not None:
                yield event.record
            if event.pause_s:
                await asyncio.sleep(event.pause_s)
        if not resp.complete:
            raise ModelCallError(stream_error(resp))


async def _without_notices(stream: AsyncIterator[Any], logger: Any) -> AsyncIterator[StreamEvent]:
    """The stream's events; the transport's retry notices are logged (the activity heartbeats while
    the transport waits, and Temporal's own retry policy is the one the workflow sees)."""
    async for ev in stream:
        if isinstance(ev, RetryNotice):
            logger.warning("model.retry", attempt=ev.attempt, max_retries=ev.max_retries, delay_ms=ev.delay_ms,
                           status=ev.status, error=ev.error)
            continue
        yield ev


NO_MODEL_ON_WORKER = ("the agentfsm worker that took this session has no model to talk to: start it with "
                      "ANTHROPIC_API_KEY (or ANTHROPIC_BASE_URL for a compatible endpoint) in its environment, or "
                      "run the session with --scripted SCENARIO.json")


class _NoModel:
    """No model to talk to on this worker: every request fails, saying why."""

    def __init__(self, why: str) -> None:
        self.why = why

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        raise ModelCallError(ModelError("api", self.why, None, False))
        yield  # pragma: no cover - makes this an async generator


class Activities:
    """The activities of one worker process, with what it keeps between them: each session's context
    (tools, gate, hooks), an index of each session file's messages, the model transport."""

    def __init__(self, *, client: ModelClient | None = None) -> None:
        self._client = client
        self._contexts = _Lru(256)
        self._indexes = _Lru(16)
        self._scenarios = _Lru(64)
        self._last_seq = _Lru(1024)
        self._chains = _Lru(256)
        self._specs = _Lru(256)
        self.log = log.get_logger("agentfsm.temporal")
        # this worker's own task queue (set by agentfsm.temporal.worker.build_worker): the background
        # commands its tool calls start run here, and so must the activities that watch them
        self.task_queue: str | None = None
        self.background: dict[str, _Background] = {}

    def all(self) -> list[Callable[..., Awaitable[Any]]]:
        return [self.open_run, self.call_model, self.run_tool, self.run_tools, self.compact, self.stop_hooks,
                self.post_batch, self.close_run, self.reap_task]

    def own(self) -> list[Callable[..., Awaitable[Any]]]:
        """The activities of this worker's own queue: the watches of the commands it runs, and the tool
        calls that act on one of them (TaskStop)."""
        return [self.watch_task, self.run_tool]

    # --- helpers -----------------------------------------------------------------------------------

    def context(self, spec: SessionSpec, digest: str | None = None) -> _Context:
        key = digest or spec_digest(spec)
        hit = self._contexts.hit(key)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        from agentfsm.sessions.compose import build_policy, build_registry

        options = spec.options()
        try:
            gate, registry = build_policy(options, build_registry(options), session_id=spec.session_id,
                                          transcript_path=spec.trace_path or "")
        except Exception as exc:  # settings that cannot be used: the session cannot run anywhere
            raise ApplicationError(f"the session's settings cannot be used: {exc}", type=NON_RETRYABLE,
                                   non_retryable=True) from exc
        if spec.agent_type is not None and hasattr(gate, "agent"):
            # a subagent's hook inputs name it, under the ids of the session that launched it
            gate.agent = (spec.session_id, spec.agent_type)
            gate.parent = _ParentIds(spec.parent_session_id or "", spec.parent_trace_path or "", spec.parent_prompt_id)
        registry, error = phases.structured_output_setup(registry, options.json_schema)
        made = _Context(options, registry, ToolTable.of(registry), gate, error)
        sandbox = getattr(gate, "sandbox", None)
        if sandbox is not None:
            # how each command ran travels back in its call's outcome and is written to the session
            # file by the workflow, as a local session writes it (`agentfsm audit` reads it there)
            sandbox.observer = functools.partial(_keep_sandbox_record, made.sandbox_records)
            if spec.trace_path:
                # a command must not forge the records the audit reads (as a local session protects them)
                sandbox.protected_paths = (str(Path(spec.trace_path).parent),)
        return self._contexts.put(key, made)  # type: ignore[no-any-return]

    def _model_client(self, spec: SessionSpec, request_no: int) -> ModelClient:
        if spec.scripted is not None:
            scenario = self._scenarios.hit((spec.scripted, spec.cwd))
            if scenario is None:
                from agentfsm.testing.scenario import load_scenario

                scenario = self._scenarios.put((spec.scripted, spec.cwd),
                                               load_scenario(json.loads(spec.scripted), ws=spec.cwd))
            return _PinnedScript(scenario, request_no)
        if self._client is None:
            from agentfsm.llm.transport import AnthropicTransport, MissingCredentials

            try:
                self._client = AnthropicTransport(max_retries=spec.limits.api_max_retries)
            except MissingCredentials:
                return _NoModel(self._no_model(spec) or NO_MODEL_ON_WORKER)
        return self._client

    def _no_model(self, spec: SessionSpec) -> str | None:
        """Why this worker cannot answer ``spec``'s requests (None when it can)."""
        if spec.scripted is not None or self._client is not None:
            return None
        from agentfsm.llm.transport import AnthropicTransport, MissingCredentials

        try:
            self._client = AnthropicTransport(max_retries=spec.limits.api_max_retries)
        except MissingCredentials:
            return NO_MODEL_ON_WORKER
        return None

    def _spec(self, inp: ModelCallInput) -> SessionSpec:
        """The request's session spec: carried, or named by digest and read from the file the run's
        set-up wrote (else :data:`SEND_WHOLE`)."""
        if inp.spec is not None:
            return inp.spec
        spec: SessionSpec | None = self._specs.hit(inp.spec_digest)
        if spec is None:
            try:
                spec = CONVERTER.structure(json.loads(Path(inp.spec_file).read_text()), SessionSpec)
            except (OSError, ValueError, TypeError, KeyError, cattrs.BaseValidationError) as exc:
                raise ApplicationError(f"the session spec is not at {inp.spec_file}: {exc}", type=SEND_WHOLE,
                                       non_retryable=True) from exc
            if spec_digest(spec) != inp.spec_digest:
                raise ApplicationError(f"the session spec at {inp.spec_file} is another run's", type=SEND_WHOLE,
                                       non_retryable=True)
            self._specs.put(inp.spec_digest, spec)
        return spec

    def _request_messages(self, spec: SessionSpec, inp: ModelCallInput
                          ) -> tuple[tuple[Message, ...], list[dict[str, Any]]]:
        """A request's messages and their wire view: the prefix it names from this worker's last
        request of the session (else :data:`SEND_WHOLE`), the rest read as :meth:`_messages` does;
        kept for the session's next request, the wire view built incrementally (as the local driver's)."""
        chain: _Chain | None = self._chains.hit(spec.session_id)
        if inp.prefix:
            if chain is None or len(chain.digests) < inp.prefix or chain.digests[inp.prefix - 1] != inp.prefix_digest:
                raise ApplicationError("this worker does not hold the request's earlier messages",
                                       type=SEND_WHOLE, non_retryable=True)
            messages, digests = chain.messages[:inp.prefix], chain.digests[:inp.prefix]
        else:
            messages, digests = (), []
        last = digests[-1] if digests else ""
        for ref in inp.messages:
            last = chain_digest(last, ref)
            digests.append(last)
        messages = (*messages, *self._messages(spec, inp.messages))
        if chain is None:
            chain = self._chains.put(spec.session_id, _Chain())
        chain.messages, chain.digests = messages, digests
        return messages, chain.wire.wire(messages)

    def _messages(self, spec: SessionSpec, refs: Sequence[MessageRef]) -> list[Message]:
        """The messages a request names, read back from the session file where not inline."""
        out: list[Message] = []
        index: _MessageIndex | None = None
        for ref in refs:
            if ref.message is not None:
                out.append(ref.message)
                continue
            if index is None:
                if spec.trace_path is None:
                    raise ApplicationError("a message was passed by reference but the session writes no file",
                                           type=NON_RETRYABLE, non_retryable=True)
                index = self._indexes.hit(spec.trace_path) or self._indexes.put(
                    spec.trace_path, _MessageIndex(Path(spec.trace_path)))
                index.refresh()
            found = index.get(ref)
            if found is None:
                index.refresh()
                found = index.get(ref)
            if found is None:
                raise ApplicationError(
                    f"message {ref.uuid} is not in the session file {spec.trace_path} as the workflow recorded "
                    "it: every worker needs the sessions directory at the same path (shared storage)",
                    type=NON_RETRYABLE, non_retryable=True)
            out.append(found)
        return out

    async def _push(self, inp: ModelCallInput, signal_name: str, payload: Any) -> None:
        handle = activity.client().get_workflow_handle(inp.workflow_id, run_id=inp.run_id)
        await handle.signal(signal_name, payload)

    # --- open and close a run ----------------------------------------------------------------------

    @activity.defn(name="agentfsm.open_run")
    async def open_run(self, inp: OpenRunInput) -> RunSetup:
        """Set a run up: system prompt, tools, the init message, the restored history, SessionStart
        and UserPromptSubmit hooks (the first run of a session, as :class:`agentfsm.sessions.session.Session`
        does)."""
        spec = inp.spec
        ctx = self.context(spec)
        if spec.trace_path:
            _write_spec(spec)
        options = ctx.options
        system = system_blocks(options.cwd, system_prompt=options.system_prompt, append=options.append_system_prompt)
        mode = getattr(ctx.gate, "permission_mode", None) or options.permission_mode or "default"
        from agentfsm.tools.agent import builtin_agents

        sandbox = getattr(ctx.gate, "sandbox", None)
        init = phases.init_message(cwd=str(options.cwd), session_id=spec.session_id, tools=ctx.registry.names(),
                                   model=options.model, permission_mode=mode,
                                   agents=list(dict.fromkeys([*builtin_agents(), *options.agents])),
                                   transcript_path=spec.trace_path or "", workflow_id=inp.workflow_id,
                                   **({"sandbox": sandbox.status()} if sandbox is not None else {}))
        history: tuple[Message, ...] = ()
        next_seq = 0
        recorded: dict[str, str] = {}
        left_running: tuple[Any, ...] = ()
        if inp.resume_path is not None:
            source = Path(inp.resume_path)
            if inp.resumed:
                heal_tail(source)
            history = load_history(source)
            # (as a local session's resume reads them: agentfsm.sessions.resume.open_session)
            left_running = cut_off(read_task_records(read_records(source)))
            if inp.resumed:
                index = _MessageIndex(source)
                index.refresh()
                for m in history:
                    digest = message_digest(m.role, m.kind, [dict(b) for b in m.content])
                    hit = index.messages.get(m.uuid)
                    if hit is not None and hit[0] == digest:
                        recorded[m.uuid] = digest
                next_seq = max((r.get("seq", -1) for r in read_records(source)), default=-1) + 1
        prompt: Any = list(inp.prompt)
        # (a subagent's session starts no session: SessionStart is the launching session's)
        start = getattr(ctx.gate, "session_start", None) if spec.agent_type is None else None
        if start is not None:
            source_kind = "resume" if inp.resumed else ("fork" if spec.parent_session_id else "startup")
            extra = tuple(getattr(await start(source_kind), "additional_context", ()) or ())
            if extra:
                from agentfsm.machine.prompts import reminder_blocks

                prompt = [*prompt, *reminder_blocks(extra)]
        first, text = phases.first_message(prompt)
        failed: SetupFailed | None = None
        erased = False
        if ctx.setup_error is not None:
            failed = SetupFailed(TerminalReason.TURN_SETUP_FAILED, ctx.setup_error)
        elif (no_model := self._no_model(spec)) is not None:
            # said before the first request, as the run's setup failure (error_during_execution), not as
            # an API error of the model: the worker's configuration is what is missing
            failed = SetupFailed(TerminalReason.TURN_SETUP_FAILED, no_model)
        else:
            if spec.agent_type is None:  # a subagent's prompt is the parent model's tool input: no hook
                first, failed, erased = phases.prompt_verdict(first, await ctx.gate.user_prompt_submit(text))
            if not erased:
                first = phases.with_budget(first, spec.limits.max_budget_usd, 0.0)
        if failed is None and phases.deferred_calls(history):
            failed = phases.deferred_unavailable(phases.deferred_calls(history), ctx.registry)
        runner = getattr(ctx.gate, "runner", None)
        hooked = tuple(e for e in HOOK_EVENTS if runner is None or runner.has_hooks(e))
        return RunSetup(system=tuple(system), tool_names=tuple(ctx.registry.names()),
                        static_tokens=phases.static_tokens(system, ctx.registry.api_schemas()), permission_mode=mode,
                        init=init, first=first, history=history, setup_failed=failed, erased=erased,
                        next_seq=next_seq, recorded=recorded, hook_events=hooked, cut_off=left_running)

    @activity.defn(name="agentfsm.close_run")
    async def close_run(self, spec: SessionSpec) -> None:
        """The end of a run: SessionEnd hooks."""
        end = getattr(self.context(spec).gate, "session_end", None)
        if end is not None:
            await end("other")

    # --- the model ---------------------------------------------------------------------------------

    @activity.defn(name="agentfsm.call_model")
    async def call_model(self, inp: ModelCallInput) -> ModelCallOutcome:
        """One model request, streamed here: each finished block is shown at once (a signal to the
        workflow), every stream event heartbeats. A lost attempt's blocks are withdrawn first."""
        info = activity.info()
        spec = self._spec(inp)
        if info.attempt > 1 and inp.live:
            await self._push(inp, "lost", inp.request_no)
        ctx = self.context(spec, inp.spec_digest or None)
        if inp.lines and spec.trace_path:
            self._append(TraceBatch(spec.trace_path, inp.lines))
        messages, wire = self._request_messages(spec, inp)
        request = phases.build_request(messages, model=inp.model, system=inp.system,
                                       tools=ctx.registry.api_schemas(), limits=spec.limits,
                                       metadata=phases.request_metadata(spec.session_id), wire=wire)
        client = self._model_client(spec, inp.request_no)
        asm = ResponseAssembler()
        state = {"request_no": inp.request_no, "message_id": "", "events": 0}
        started = time.monotonic()

        def outcome(**kw: Any) -> ModelCallOutcome:
            return ModelCallOutcome(model=asm.model or inp.model, message_id=asm.message_id,
                                    api_ms=(time.monotonic() - started) * 1000, attempt=info.attempt, **kw)

        stream = _without_notices(client.stream(request), self.log)
        async with _heartbeats(lambda: state):
            try:
                try:
                    ev = await anext(stream)
                except (StopAsyncIteration, Exception) as exc:
                    if not isinstance(exc, ModelCallError | StopAsyncIteration):
                        self.log.error("model.client_failed", error=repr(exc), exc_info=True)
                    return outcome(opened=False, error=phases.open_error(exc))
                try:
                    while True:
                        block = asm.feed(ev)
                        state["events"] += 1
                        state["message_id"] = asm.message_id
                        activity.heartbeat(state)
                        if block is not None and inp.live:
                            await self._push(inp, "push", {"request_no": inp.request_no, "message": (
                                phases.assistant_block_message(asm.message_id, asm.model, block, asm.usage,
                                                               spec.session_id))})
                        try:
                            ev = await anext(stream)
                        except StopAsyncIteration:
                            break
                    if not asm.stopped:
                        raise ModelCallError(phases.ENDED_EARLY)
                except Exception as exc:  # the stream broke: the workflow asks the graph what now
                    return outcome(opened=True, error=phases.stream_error(exc, has_content=asm.has_content),
                                   blocks=tuple(asm.blocks), usage=dict(asm.usage))
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]
        response = asm.finish()
        traits = []
        for block in response.tool_uses():
            invalid = response.invalid_tool_inputs.get(block["id"])
            tool, safe, _prepared, interrupt = call_traits(ctx.table, block, invalid)
            traits.append(ToolTraits(block["id"], safe, interrupt, _read_only(tool, block, invalid),
                                     _task_target(tool, block, invalid)))
        return outcome(opened=True, response=response, traits=tuple(traits))

    @activity.defn(name="agentfsm.compact")
    async def compact(self, inp: CompactInput) -> CompactOutcome:
        """PreCompact hooks, then the summary request (auto or reactive compaction)."""
        spec = inp.spec
        ctx = self.context(spec)
        messages = self._messages(spec, inp.messages)
        requested = (reactive_split(messages, inp.api_message) if inp.trigger == "reactive"
                     else split_for_compaction(messages)) is not None
        await ctx.gate.pre_compact("auto", None)
        spent: dict[str, Any] = {}

        def on_usage(model: str, usage: Mapping[str, Any]) -> None:
            spent.update(model=model, usage=dict(usage))

        why: list[str] = []
        async with _heartbeats(lambda: {"request_no": inp.request_no}):
            compaction = await compact(self._model_client(spec, inp.request_no), model=inp.model, system=inp.system,
                                       messages=messages, trigger=inp.trigger,
                                       metadata=phases.request_metadata(spec.session_id), on_usage=on_usage,
                                       on_failure=why.append, api_message=inp.api_message)
        return CompactOutcome(compaction, requested, spent.get("model", ""), spent.get("usage", {}),
                              why[0] if why else "")

    # --- tools -------------------------------------------------------------------------------------

    @activity.defn(name="agentfsm.run_tool")
    async def run_tool(self, inp: ToolCallInput) -> ToolCallOutcome:
        """One tool call through the 15-step pipeline, with the session's gate and hooks."""
        info = activity.info()
        spec = inp.spec
        ctx = self.context(spec)
        block = inp.block
        tool_use_id = str(block.get("id", ""))
        if info.is_local:
            return await self._run_read_only(inp, ctx, info.workflow_id)
        outcome_file = _outcome_file(spec, tool_use_id)
        if info.attempt > 1:
            killed = _kill_stale(_previous_details())
            done = _read_outcome(outcome_file)
            if done is not None:
                return attrs.evolve(done, attempt=info.attempt)
            tool = ctx.table.lookup(str(block.get("name", "")))
            read_only = _read_only(tool, block, inp.invalid_json)
            self.log.warning("tool.worker_lost", tool_use_id=tool_use_id, attempt=info.attempt, read_only=read_only,
                             killed_groups=killed)
            if not read_only:
                lost = synthetic_result(tool_use_id, tool.name if tool else str(block.get("name", "")), WORKER_LOST,
                                        block.get("input") if isinstance(block.get("input"), Mapping) else None)
                return ToolCallOutcome(lost, interrupted=True, attempt=info.attempt)
        details: dict[str, Any] = {"host": HOST, "boot_id": BOOT_ID, "pid": os.getpid(), "pgids": []}
        async with _heartbeats(lambda: details):
            done = await self._run_call(inp, ctx, _ProcessGuard(details))
        _write_outcome(outcome_file, done)
        return done

    @activity.defn(name="agentfsm.run_tools")
    async def run_tools(self, inp: ToolBatchInput) -> ToolBatchOutcome:
        """A response's calls, one after another (each as :meth:`run_tool` runs one), in one activity.
        Each call's outcome file is written as it finishes and a mark before it starts, so an attempt
        after a lost worker keeps what finished, answers the call that was running "interrupted" (the
        batch holds no read-only call: those run as local activities) and runs the calls that had not
        started. Cancelled (a hard stop): the running call ends interrupted, the rest do not start."""
        info = activity.info()
        spec = inp.spec
        ctx = self.context(spec)
        killed = _kill_stale(_previous_details()) if info.attempt > 1 else []
        outcomes: list[ToolCallOutcome] = []
        details: dict[str, Any] = {"host": HOST, "boot_id": BOOT_ID, "pid": os.getpid(), "pgids": []}
        try:
            async with _heartbeats(lambda: details):
                await self._run_in_order(inp, ctx, details, killed, outcomes)
        except asyncio.CancelledError:  # a stop between two steps: what finished stands
            return ToolBatchOutcome(tuple(outcomes), stopped=True)
        return ToolBatchOutcome(tuple(outcomes), stopped=activity.is_cancelled())

    async def _run_in_order(self, inp: ToolBatchInput, ctx: _Context, details: dict[str, Any], killed: list[int],
                            outcomes: list[ToolCallOutcome]) -> None:
        info, spec = activity.info(), inp.spec
        layers, read_files = dict(inp.layers), dict(inp.read_files)
        for block, invalid in zip(inp.blocks, inp.invalid_json, strict=True):
            tool_use_id = str(block.get("id", ""))
            outcome_file = _outcome_file(spec, tool_use_id)
            mark = outcome_file.with_suffix(".started") if outcome_file is not None else None
            done = None
            if info.attempt > 1:
                done = _read_outcome(outcome_file)
                if done is not None:
                    done = attrs.evolve(done, attempt=info.attempt)
                elif mark is not None and mark.exists():
                    self.log.warning("tool.worker_lost", tool_use_id=tool_use_id, attempt=info.attempt,
                                     read_only=False, killed_groups=killed)
                    name = str(block.get("name", ""))
                    done = ToolCallOutcome(synthetic_result(
                        tool_use_id, name, WORKER_LOST,
                        block.get("input") if isinstance(block.get("input"), Mapping) else None),
                        interrupted=True, attempt=info.attempt)
            if done is None:
                if activity.is_cancelled():
                    return
                if mark is not None:
                    with contextlib.suppress(OSError):
                        mark.parent.mkdir(parents=True, exist_ok=True)
                        mark.touch()
                done = await self._run_call(ToolCallInput(spec, block, invalid, dict(layers), dict(read_files)),
                                            ctx, _ProcessGuard(details))
                _write_outcome(outcome_file, done)
            outcomes.append(done)
            layers.update(done.result.context_layers)
            read_files.update(done.read_files)
            if activity.is_cancelled():  # the stop cut this call (its result says so) or came after it
                return

    async def _run_read_only(self, inp: ToolCallInput, ctx: _Context, workflow_id: str) -> ToolCallOutcome:
        """A call the tool says only reads, as a local activity of the workflow's worker: no task of its
        own, no heartbeat, no outcome file — a worker lost while it runs is replaced by one that
        replays the workflow and runs the call again. Its process groups are kept in a file on this
        host instead of in heartbeats, so that run first kills what the lost one left."""
        pgids = _pgid_file(workflow_id, str(inp.block.get("id", "")))
        killed = _kill_stale(_read_json(pgids))
        if killed:
            self.log.warning("tool.worker_lost", tool_use_id=inp.block.get("id"), read_only=True, killed_groups=killed)
        details: dict[str, Any] = {"host": HOST, "boot_id": BOOT_ID, "pid": os.getpid(), "pgids": []}
        try:
            return await self._run_call(inp, ctx, _ProcessGuard(details, local=True, file=pgids))
        finally:
            if pgids is not None and (details["pgids"] or killed):
                pgids.unlink(missing_ok=True)

    async def _run_call(self, inp: ToolCallInput, ctx: _Context, guard: _ProcessGuard) -> ToolCallOutcome:
        """The call through the 15-step pipeline, with the session's gate and hooks."""
        spec, block = inp.spec, inp.block
        tool_use_id = str(block.get("id", ""))
        read_files = dict(inp.read_files)
        host = _WorkerTasks(self, spec.session_id, inp.agents)
        agents = _WorkerAgents(spec, ctx)
        services: dict[str, Any] = {PROCESS_GUARD: guard, TASKS: host, "run_subagent": agents}
        # the model's commands run in the session's kernel sandbox here too
        sandbox = getattr(ctx.gate, "sandbox", None)
        if sandbox is not None:
            services[SANDBOX] = sandbox

        def make_ctx(tid: str) -> ToolContext:
            # the gate's file rules, as a local run's driver passes them (without them every file tool
            # refuses: the port fails closed)
            access = getattr(ctx.gate, "file_access", None)
            return ToolContext(cwd=ctx.options.cwd, session_id=spec.session_id, tool_use_id=tid,
                               read_files=read_files, layers=dict(inp.layers), services=services,
                               file_access=access() if callable(access) else None)

        kept = ctx.sandbox_records.setdefault(tool_use_id, [])
        try:
            result = await run_tool_call(block, lookup=ctx.table, gate=ctx.gate, ctx_factory=make_ctx,
                                         invalid_json=inp.invalid_json)
        finally:
            ctx.sandbox_records.pop(tool_use_id, None)
        changed = {k: v for k, v in read_files.items() if inp.read_files.get(k) != v}
        return ToolCallOutcome(_portable(result), changed, attempt=activity.info().attempt,
                               sandbox=tuple(_json(r) for r in kept), tasks=tuple(host.started),
                               stopped=tuple(host.stopped), agents=tuple(agents.launched))

    # --- background tasks --------------------------------------------------------------------------

    @activity.defn(name="agentfsm.watch_task")
    async def watch_task(self, start: TaskStart) -> TaskEnd:
        """Wait, heartbeating, for a background command this worker runs to end (on this worker's own
        queue). Cancelled (the model or the session's end stops it): the command's group is killed and
        the end reported ``killed``. A task this worker does not run (it started before this worker
        did: its worker was lost) fails at once, as a lost worker's watch fails by its heartbeat."""
        bg = self.background.get(start.task_id)
        if bg is None:
            raise ApplicationError(f"background task {start.task_id} does not run on this worker",
                                   type=NON_RETRYABLE, non_retryable=True)
        try:
            async with _heartbeats(lambda: {"task_id": start.task_id}):
                return await asyncio.shield(bg.ended)
        except asyncio.CancelledError:
            bg.stopping = True
            await asyncio.shield(_kill_group(bg.process))
            if bg.watcher is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.shield(bg.watcher)
            raise
        finally:
            if bg.ended.done() or bg.stopping:
                self.background.pop(start.task_id, None)

    @activity.defn(name="agentfsm.reap_task")
    async def reap_task(self, start: TaskStart) -> list[int]:
        """What is left of a background command whose worker was lost: its process group is killed when
        this worker runs on the same host (the command itself died with its worker); the groups killed."""
        return _kill_stale({"host": start.host, "boot_id": start.boot_id, "pgids": [start.pgid] if start.pgid else []})

    # --- hooks -------------------------------------------------------------------------------------

    @activity.defn(name="agentfsm.stop_hooks")
    async def stop_hooks(self, inp: StopInput) -> StopHookVerdict:
        ctx = self.context(inp.spec)
        if hasattr(ctx.gate, "background_tasks"):  # what the workflow says runs (as a local session's registry)
            ctx.gate.background_tasks = lambda: list(inp.background_tasks)
        spec = inp.spec
        if spec.agent_type is not None:  # a subagent's end runs SubagentStop where a session's runs Stop
            return phases.stop_verdict(await ctx.gate.subagent_stop(
                agent_id=spec.session_id, agent_type=spec.agent_type, agent_transcript_path=spec.trace_path or "",
                last_assistant_message=inp.last_assistant_text, stop_hook_active=inp.stop_hook_active))
        return phases.stop_verdict(await ctx.gate.stop(inp.last_assistant_text, inp.stop_hook_active))

    @activity.defn(name="agentfsm.post_batch")
    async def post_batch(self, inp: PostBatchInput) -> PostBatchOutcome:
        ctx = self.context(inp.spec)
        post = await ctx.gate.post_tool_batch([dict(c) for c in inp.calls])
        return PostBatchOutcome(post.blocked, post.reason, post.stop, post.stop_reason,
                                tuple(post.additional_context))

    # --- the session file --------------------------------------------------------------------------

    @activity.defn(name="agentfsm.append_trace")
    async def append_trace(self, batch: TraceBatch) -> int:
        """Append session-file lines; lines whose record number the file already holds are skipped
        (a workflow task lost with its worker runs its local activities again)."""
        return self._append(batch)

    def _append(self, batch: TraceBatch) -> int:
        path = Path(batch.path)
        fresh: list[str] = []
        if batch.lines:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a+b") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                size = fh.seek(0, os.SEEK_END)
                known = self._last_seq.hit(batch.path)
                if known is not None and known[1] == size:
                    last = known[0]
                else:  # another worker wrote since (the session moved), or first sight of the file
                    heal_tail(path)
                    last = _last_seq_in(path)
                fresh = [line for seq, line in batch.lines if seq > last]
                if fresh:
                    fh.seek(0, os.SEEK_END)
                    fh.write("".join(line + "\n" for line in fresh).encode())
                    fh.flush()
                    last = max(seq for seq, _ in batch.lines)
                self._last_seq.put(batch.path, (last, fh.seek(0, os.SEEK_END)))
        outcomes = path.with_suffix(".tools")
        for tool_use_id in batch.settled:
            f = _outcome_file_in(outcomes, tool_use_id)
            if f is not None:
                f.unlink(missing_ok=True)
                f.with_suffix(".started").unlink(missing_ok=True)
        if batch.final:
            with contextlib.suppress(OSError):
                Path(spec_file(batch.path)).unlink(missing_ok=True)
                outcomes.rmdir()
        return len(fresh)


def _keep_sandbox_record(kept: dict[str, list[dict[str, Any]]], record: dict[str, Any]) -> None:
    """The session sandbox's observer on a worker: a record goes to the running call it names."""
    calls = kept.get(str(record.get("tool_use_id", "")))
    if calls is not None:
        calls.append(record)


def _last_seq_in(path: Path) -> int:
    """The record number of a session file's last line (-1 when empty), reading from the end."""
    with open(path, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        chunk, pos = b"", end
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step) + chunk
            lines = chunk.rstrip(b"\n").split(b"\n")
            if len(lines) > 1 or pos == 0:
                try:
                    return int(json.loads(lines[-1]).get("seq", -1))
                except (ValueError, AttributeError):
                    return max((r.get("seq", -1) for r in read_records(path)), default=-1)
    return -1


def _write_spec(spec: SessionSpec) -> None:
    """Keep the run's spec where its model calls' activities can read it (they name it by digest)."""
    assert spec.trace_path
    path = Path(spec_file(spec.trace_path))
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(CONVERTER.unstructure(spec), ensure_ascii=False, default=str))
        os.replace(tmp, path)


def _portable(result: CallResult) -> CallResult:
    """The result as the workflow may hold it: what a tool returned is kept only where the run reports
    it (the structured output, and what an SDK user receives as ``tool_use_result``) and only as JSON;
    context layers only as JSON."""
    from agentfsm.tools.structured_output import NAME as STRUCTURED_OUTPUT

    data = result.output_data if result.tool_name == STRUCTURED_OUTPUT and not result.is_error else None
    return attrs.evolve(result, output_data=_json(data), context_layers=_json(dict(result.context_layers)) or {},
                        tool_input=_json(dict(result.tool_input)) or {}, structured=_json(result.structured))


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def _outcomes_dir(spec: SessionSpec) -> Path | None:
    return Path(spec.trace_path).with_suffix(".tools") if spec.trace_path else None


def _outcome_file(spec: SessionSpec, tool_use_id: str) -> Path | None:
    d = _outcomes_dir(spec)
    return _outcome_file_in(d, tool_use_id) if d is not None else None


def _outcome_file_in(directory: Path, tool_use_id: str) -> Path | None:
    safe = "".join(c for c in tool_use_id if c.isalnum() or c in "-_")
    return directory / f"{safe}.json" if safe else None


def _write_outcome(path: Path | None, outcome: ToolCallOutcome) -> None:
    """The finished call's outcome, for an attempt that runs after this worker died before it could
    report (so the call is not called interrupted when it did finish)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(CONVERTER.unstructure(outcome), ensure_ascii=False, default=str))
        os.replace(tmp, path)


def _read_outcome(path: Path | None) -> ToolCallOutcome | None:
    if path is None or not path.is_file():
        return None
    try:
        return CONVERTER.structure(json.loads(path.read_text()), ToolCallOutcome)
    except (OSError, ValueError, TypeError, KeyError):
        return None
