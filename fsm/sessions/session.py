"""One session: its id, its session file, its tools, gate and hooks, its input queue, its subagents,
and the driver runs that make up each :meth:`Session.run`.

A run is one call of :meth:`Session.run`. It starts with the prompt (or with what is queued) and
normally is one driver run. It goes on with *follow-up* driver runs when the driver ended on
``completed`` and either input is still queued (it arrived during the last response, after the last
absorb point) or a background subagent this session launched is still running: the session then
waits for that agent's ``<task-notification>`` and hands it to the model as the next prompt — the
Claude Code's launch / wait / consume pattern (three parent requests). A run reports one
result: the last driver run's outcome, with turns, cost, usage and durations summed over the run.
Any other terminal reason (errors, abort, ``max_turns``, a hook stop) ends the run at once; what is
still queued stays queued for the next run, background agents keep running until teardown
(:meth:`Session.aclose`), which stops them and marks leftover queue items ``discarded``.

Sessions share nothing mutable, so many can run at once on one event loop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from agentfsm.common import log
from agentfsm.common.weak import weak_method
from agentfsm.llm.model import ModelClient
from agentfsm.machine import prompts
from agentfsm.machine.options import Options
from agentfsm.machine.state import TERMINAL_INFO, LoopState, Message, TerminalReason
from agentfsm.runtime import phases
from agentfsm.runtime.cost import add_usage
from agentfsm.runtime.driver import Driver, Emit, StepObserver
from agentfsm.runtime.queue import InputQueue, QueueItem
from agentfsm.runtime.request import system_blocks
from agentfsm.runtime.result import RunResult, merge_model_usage
from agentfsm.runtime.tasks import TaskRegistry, tasks_dir
from agentfsm.runtime.trace import TraceWriter, sessions_dir
from agentfsm.sessions.compose import build_policy, build_registry
from agentfsm.sessions.memory import load as load_memory
from agentfsm.sessions.memory import reminder_text
from agentfsm.sessions.subagents import SubagentHooks, SubagentIdentity, Subagents
from agentfsm.tools.base import TASKS
from agentfsm.tools.bash import TOOL_RESULTS_DIR
from agentfsm.tools.sandbox import SANDBOX

Prompt = str | Sequence[Mapping[str, Any]]
class Session:
    """Runs prompts on one conversation; see the module docstring for what one run is.

    ``client`` is the model transport (shared between sessions if you like; ``owns_client`` says
    whether :meth:`aclose` closes it). ``emit`` receives every protocol message (the dicts the CLI
    prints in stream-json). ``history`` seeds the conversation (resume/fork, see
    :func:`agentfsm.sessions.resume.open_session`). ``registry`` overrides the tools built from ``options``;
    ``depth``/``subagent`` are set for subagent sessions.
    """

    def __init__(self, options: Options, *, client: ModelClient | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, history: Sequence[Message] = (),
                 registry: Any = None, owns_client: bool = True, depth: int = 0,
                 subagent: SubagentIdentity | None = None, parent_hooks: Any = None,
                 observers: Sequence[StepObserver] = (), trace_handle: IO[str] | None = None) -> None:
        self.options = options
        self.session_id = options.session_id or str(uuid.uuid4())
        self.history: tuple[Message, ...] = tuple(history)
        self.emit = emit
        self.queue = queue if queue is not None else InputQueue()
        # the owned objects call back through weak methods: no cycle keeps a finished session alive
        self.queue.bind(weak_method(self._emit, gone=None), self.session_id)
        self._client = client
        self._owns_client = owns_client
        self.depth = depth
        self.subagent = subagent
        self.observers = tuple(observers)
        self.sessions_dir: Path = sessions_dir(options)
        self.trace_path: Path | None = (
            self.sessions_dir / f"{self.session_id}.jsonl") if options.write_trace else None
        # fails closed: settings or hooks that cannot be loaded stop the session here — before the
        # session file exists, so a bad input leaves nothing behind
        self.gate, self.registry = build_policy(
            options, registry if registry is not None else build_registry(options), session_id=self.session_id,
            transcript_path=str(self.trace_path or ""))
        # one writer per session: the file is locked (agentfsm.runtime.trace.lock_session_file); a resume
        # passes the handle it locked before it read the file
        mirror = None
        if options.claude_transcript and depth == 0 and self.trace_path is not None:
            from agentfsm.runtime.phases import CLAUDE_CODE_VERSION
            from agentfsm.sessions.claude_transcript import ClaudeTranscript, transcript_path

            mirror = ClaudeTranscript(transcript_path(options.cwd, self.session_id), session_id=self.session_id,
                                      cwd=str(options.cwd), version=CLAUDE_CODE_VERSION)
        self.trace = TraceWriter(self.trace_path, handle=trace_handle if self.trace_path is not None else None,
                                 mirror=mirror)
        self.hooks: Any = self.gate
        # the kernel sandbox of the model's commands (agentfsm.hooks.sandbox), when the gate has one
        self.sandbox: Any = getattr(self.gate, "sandbox", None)
        if self.sandbox is not None:
            refused = self.sandbox.unavailable_error
            if refused is not None:
                raise ValueError(refused)
            self.sandbox.observer = weak_method(self._sandbox_record, gone=None)
            self.sandbox.protected_paths = (str(self.sessions_dir),)
            self.sandbox.announce()
        observe = getattr(self.gate, "observe_hooks", None)
        if options.include_hook_events and observe is not None:
            observe(weak_method(self._emit_hook_event, gone=None))
        if subagent is not None:
            self.hooks = SubagentHooks(self.hooks, parent_hooks, subagent)
            if hasattr(self.gate, "agent"):  # the subagent's hook inputs name it, under the session's ids
                self.gate.agent = (subagent.agent_id, subagent.agent_type)
                outer = getattr(parent_hooks, "gate", parent_hooks)
                self.gate.parent = outer if hasattr(outer, "_common") else None
        self.subagents = Subagents(self, Session)
        # background commands (and, through Subagents, agents): owned here, stopped at aclose
        self.tasks = TaskRegistry(session_id=self.session_id, tasks_dir=tasks_dir(self.session_id),
                                  queue=self.queue, emit=weak_method(self._emit, gone=None),
                                  record=self.trace.write)
        if hasattr(self.gate, "background_tasks"):
            # the Stop hook's input lists the tasks still running (the registry holds nothing of the gate)
            self.gate.background_tasks = self.tasks.background_tasks
        self.driver: Driver | None = None
        self.last_state: LoopState | None = None
        self.resumed = False  # set by agentfsm.sessions.resume when the file already holds header and history
        self.repaired = False  # set by agentfsm.sessions.resume when resuming repaired the file's history
        # what agentfsm.sessions.resume skipped in the session file it resumed or forked (FileProblem records)
        self.file_problems: tuple[Any, ...] = ()
        self._header_written = False
        self._running = False
        self._interrupted = False
        self._exiting = False  # abort(exiting=True): the process ends after this run
        self._closed = False
        # Read/Edit freshness state lives as long as the conversation, not one driver run
        self._read_files: dict[str, float] = {}
        # resolved per call, so a CLI that switches logging on after the session exists is followed
        self.log = log.get_logger("agentfsm", session_id=self.session_id, agent_depth=depth)

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            from agentfsm.llm.transport import AnthropicTransport

            self._client = AnthropicTransport(max_retries=self.options.limits.api_max_retries)
            self._owns_client = True
        return self._client

    @property
    def permission_mode(self) -> str:
        mode = getattr(self.gate, "permission_mode", None) or self.options.permission_mode
        return mode or "default"

    @property
    def running(self) -> bool:
        """A run is in progress (input submitted now goes to the queue and is absorbed by it)."""
        return self._running

    @property
    def background_agents(self) -> tuple[str, ...]:
        """Ids of the background subagents still running."""
        return self.subagents.running_in_background

    def _emit(self, msg: dict[str, Any]) -> None:
        if self.emit is not None:
            self.emit(msg)

    def _emit_hook_event(self, msg: dict[str, Any]) -> None:
        self._emit({**msg, "session_id": self.session_id})

    def _sandbox_record(self, record: dict[str, Any]) -> None:
        # how each command of the model ran: `agentfsm audit` reports those run outside the sandbox
        self.trace.write(record)

    def init_message(self) -> dict[str, Any]:
        """``system/init`` (see :func:`agentfsm.runtime.phases.init_message`), with how the model's commands
        are sandboxed."""
        extra = {"sandbox": self.sandbox.status()} if self.sandbox is not None else {}
        return phases.init_message(cwd=str(self.options.cwd), session_id=self.session_id,
                                   tools=self.registry.names(), model=self.options.model,
                                   permission_mode=self.permission_mode, agents=self.subagents.definitions(),
                                   transcript_path=str(self.trace_path or ""), **extra)

    # --- runs ------------------------------------------------------------------------------------

    def submit(self, prompt: Prompt, *, uuid: str | None = None) -> QueueItem:
        """Queue user input: absorbed by the running turn at its next absorb point, or taken as the
        prompt of the next :meth:`run` ``(None)``."""
        return self.queue.submit(prompt, uuid=uuid)

    async def run(self, prompt: Prompt | None = None) -> RunResult:
        """Run ``prompt`` — or, when it is None, everything queued — to a result (emitted, and
        returned). One run at a time: while it goes on, :meth:`submit` input instead."""
        if self._running:
            raise RuntimeError("a run is already in progress on this session; submit() input to its queue")
        if self._closed:
            raise RuntimeError("the session is closed")
        self._running, self._interrupted = True, False
        try:
            current = prompt if prompt is not None else self._take_prompt()
            if current is None:
                raise ValueError("nothing to run: no prompt given and nothing queued")
            first_run = not self._header_written
            self._write_header()
            # a resumed session's tasks cut off by its earlier process's end: the client and model learn it
            # (the client first, as Claude Code tells it)
            self.tasks.announce_cut_off()
            self._emit(self.init_message())
            if first_run:
                current = await self._session_start(current)
            started = time.monotonic()
            cost_before = self.subagents.cost_usd
            results: list[RunResult] = []
            while current is not None:
                results.append(await self._run_once(current))
                current = await self._follow_up(results[-1])
            if self._exiting:
                await self.tasks.cut_off_all()
                await self.subagents.stop_all()
            result = _merge(results, duration_ms=int((time.monotonic() - started) * 1000),
                            extra_cost=self.subagents.cost_usd - cost_before)
            driver = self.driver
            if len(results) == 1 and driver is not None and driver.passes.index:
                result = attrs.evolve(result, duration_ms=results[0].duration_ms)  # the last pass's own
            if len(results) > 1 or driver is None or not driver.passes.last_printed:
                # (a run whose last pass ended waiting for background work printed that pass's result then)
                self._emit(result.to_dict())
            return result
        finally:
            self._running = False

    def _take_prompt(self) -> Prompt | None:
        items = self.queue.take()
        if not items:
            return None
        return tuple(b for item in items for b in item.content)

    async def _follow_up(self, result: RunResult) -> Prompt | None:
        """The prompt of the next driver run of this run, or None when the run is over: input queued
        after the last request that could carry it. (The driver itself waits for the background work
        the run started and takes its notifications: the graph's ``task_notification`` move; it leaves
        them queued when user input is queued beside them, and they join that input here.)"""
        if result.terminal_reason is not TerminalReason.COMPLETED or self._interrupted or not self.queue.pending:
            return None
        self.log.info("session.follow_up", queued=len(self.queue.pending),
                      background=len(self.subagents.running_in_background) + len(self.tasks.running))
        return self._take_prompt()

    def _background_pending(self) -> bool:
        """Background work this session started may still report (a task or a background agent)."""
        return bool(self.subagents.running_in_background or self.tasks.running)

    async def _run_once(self, prompt: Prompt) -> RunResult:
        system = system_blocks(self.options.cwd, add_dirs=self.options.add_dirs,
                               identity=self.options.system_identity,
                               system_prompt=self.options.system_prompt,
                               append=self.options.append_system_prompt)
        self.driver = Driver(options=self.options, client=self.client, registry=self.registry,
                             session_id=self.session_id, system=system, gate=self.gate, hooks=self.hooks,
                             trace=self.trace, emit=weak_method(self._driver_emit), queue=self.queue,
                             services={"run_subagent": self.subagents.run, SANDBOX: self.sandbox, TASKS: self.tasks,
                                       # large Bash outputs are saved beside the session file
                                       TOOL_RESULTS_DIR: self.sessions_dir / self.session_id / "tool-results"},
                             observers=self.observers,
                             file_access=self.gate.file_access,
                             background=weak_method(self._background_pending, gone=False),
                             read_files=self._read_files)
        if self._interrupted:
            self.driver.interrupt()
        try:
            result, state = await self.driver.run(prompt, self.history)
        except BaseException:
            self.queue.settle(False)
            raise
        self.history = state.messages
        self.last_state = state
        self.queue.settle(TERMINAL_INFO[result.terminal_reason].controlled)
        return result

    async def _session_start(self, prompt: Prompt) -> Prompt:
        """Fire SessionStart once per session (not for subagents); its context rides with the first
        prompt as a reminder, the way Claude Code adds it to the conversation. The CLAUDE.md memory of
        the setting sources goes before the prompt (a resumed session has it in its history)."""
        if self.options.agent_type is None and not self.resumed:
            memory = reminder_text(load_memory(self.options.cwd, self.options.setting_sources))
            if memory is not None:
                # a message of its own (recorded, so a resume has it), merged into the prompt's on the
                # wire; the prompt itself stays what UserPromptSubmit hooks are shown
                message = prompts.meta_message(memory, kind="memory")
                self.trace.message(message)
                self.history = (*self.history, message)
        start = getattr(self.hooks, "session_start", None)
        if start is None or self.options.agent_type is not None:
            return prompt
        source = "resume" if self.resumed else ("fork" if self.options.parent_session_id else "startup")
        self.trace.before_hooks(self.hooks, "SessionStart")
        outcome = await start(source)
        extra = tuple(getattr(outcome, "additional_context", ()) or ())
        if not extra:
            return prompt
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else list(prompt)
        return [*blocks, *prompts.reminder_blocks(extra)]

    def _driver_emit(self, msg: dict[str, Any]) -> None:
        # Each assistant block is in the session file as soon as it is complete — before its tool
        # runs — so a crash mid-tool leaves the dangling tool_use that resume repairs
        # (agentfsm.sessions.resume.load_history). The driver records the whole message later, with its results.
        if msg.get("type") == "assistant" and msg.get("parent_tool_use_id") is None:
            body = msg.get("message", {})
            for block in body.get("content", ()):
                self.trace.write({"type": "assistant_block", "message_id": body.get("id", ""),
                                  "block": block})
        self._emit(msg)

    def _write_header(self) -> None:
        if self._header_written:
            return
        if not self.resumed:
            # a new or forked session: its file starts with the header and the inherited history.
            self.trace.session(self.session_id, self.options.limits, str(self.options.cwd),
                               self.options.model, self.options.parent_session_id)
            for m in self.history:
                self.trace.message(m)
        elif self.repaired:
            # the resumed history differs from the file's records (a crash's repairs): record it as
            # the new view, so the file holds what the next request carries
            self.trace.compact_boundary("resume_repair", 0)
            for m in self.history:
                self.trace.message(m)
        self._header_written = True

    def interrupt(self) -> None:
        """The user's interrupt (Ctrl-C, the SDK's ``interrupt``): a streaming response is cut, tools
        whose ``interrupt_behavior()`` is ``cancel`` are cancelled and ``block`` tools finish, then the
        run ends; no follow-up runs start. Background agents keep running; their notifications stay
        queued for the next run."""
        self._interrupted = True
        if self.driver is not None:
            self.driver.interrupt()
        self.queue.poke()

    def abort(self, *, exiting: bool = False) -> None:
        """Hard stop: like :meth:`interrupt`, but every running tool is cancelled at once.
        ``exiting``: the process ends after this run (Ctrl-C in ``-p``): its background tasks are cut
        off before the run's result, as Claude Code's are (:meth:`TaskRegistry.cut_off_all`)."""
        self._interrupted = True
        self._exiting = self._exiting or exiting
        if self.driver is not None:
            self.driver.abort()
        self.queue.poke()

    async def aclose(self, *, close_client: bool = True) -> None:
        """Teardown: stop background agents, discard what is still queued, run SessionEnd hooks,
        close the session file (flushed and fsynced) and the client when this session owns it —
        unless ``close_client`` is false (a process about to exit need not say goodbye to the API).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.subagents.stop_all()
        await self.tasks.stop_all()
        self.queue.discard()
        end = getattr(self.hooks, "session_end", None)
        if end is not None and self._header_written and self.options.agent_type is None:
            self.trace.before_hooks(self.hooks, "SessionEnd")
            await end("other")
        self.trace.close()
        if self.sandbox is not None and hasattr(self.sandbox, "close"):
            self.sandbox.close()
        client = self._client
        if close_client and self._owns_client and client is not None and hasattr(client, "aclose"):
            await client.aclose()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

def _merge(results: Sequence[RunResult], *, duration_ms: int, extra_cost: float) -> RunResult:
    """One result for a run of several driver runs: the last one's outcome, the totals summed."""
    last = results[-1]
    usage: dict[str, Any] = {}
    for r in results:
        usage = add_usage(usage, r.usage)
    return attrs.evolve(
        last, num_turns=sum(r.num_turns for r in results), duration_ms=max(duration_ms, last.duration_ms),
        duration_api_ms=sum(r.duration_api_ms for r in results),
        total_cost_usd=sum(r.total_cost_usd for r in results) + extra_cost,
        usage=usage if len(results) > 1 else last.usage,
        model_usage=_merged_model_usage(results),
        permission_denials=tuple(d for r in results for d in r.permission_denials),
        warnings=tuple(w for r in results for w in r.warnings))


def _merged_model_usage(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        for model, entry in r.model_usage.items():
            out[model] = merge_model_usage(out.get(model), entry)
    return out
