"""One session: its id, its session file, its tools, gate and hooks, its input queue, its subagents,
and the driver runs that make up each :meth:`Session.run`.

A run is one call of :meth:`Session.run`. It starts with the prompt (or with what is queued) and
normally is one driver run. It goes on with *follow-up* driver runs when the driver ended on
``completed`` and either input is still queued (it arrived during the last response, after the last
absorb point) or a background subagent this session launched is still running: the session then
waits for that agent's ``<task-notification>`` and hands it to the model as the next prompt — the
reference's launch / wait / consume pattern (seed 004: three parent requests). A run reports one
result: the last driver run's outcome, with turns, cost, usage and durations summed over the run.
Any other terminal reason (errors, abort, ``max_turns``, a hook stop) ends the run at once; what is
still queued stays queued for the next run, background agents keep running until teardown
(:meth:`Session.aclose`), which stops them and marks leftover queue items ``discarded``.

Sessions share nothing mutable, so many can run at once on one event loop.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm import log, prompts
from agentfsm.cost import add_usage
from agentfsm.driver import Driver, Emit, StepObserver
from agentfsm.model import ModelClient
from agentfsm.options import PERMISSION_MODES, AgentDefinition, Options
from agentfsm.ports import PromptOutcome, StopOutcome
from agentfsm.queue import TASK_NOTIFICATION, InputQueue, QueueItem
from agentfsm.request import system_blocks
from agentfsm.result import RunResult
from agentfsm.state import TERMINAL_INFO, LoopState, Message, TerminalReason
from agentfsm.trace import TraceWriter, default_sessions_dir

Prompt = str | Sequence[Mapping[str, Any]]

# Subagents may launch subagents only when their definition offers them the Agent tool; this caps
# the nesting so a model that keeps delegating cannot recurse without end.
MAX_AGENT_DEPTH = 4
# how long teardown and a cancelled foreground call wait for a subagent to write its result
SUBAGENT_STOP_GRACE_S = 5.0


def build_registry(options: Options) -> Any:
    from agentfsm.tools import AgentTool, ToolRegistry, builtin_tools

    agent_types = {name: d.description for name, d in options.agents.items()}
    tools = [AgentTool(agent_types) if t.name == "Agent" else t for t in builtin_tools()]
    registry = ToolRegistry([*tools, *options.extra_tools])
    if options.tools is not None:
        registry = registry.subset([*options.tools, *(t.name for t in options.extra_tools)])
    # an invalid schema is left to the driver, which ends the turn `turn_setup_failed` saying why
    if options.json_schema is not None and _is_valid_schema(options.json_schema):
        from agentfsm.tools.structured_output import StructuredOutputTool

        registry = ToolRegistry([*registry.tools(), StructuredOutputTool(options.json_schema)])
    return registry


def _is_valid_schema(schema: Mapping[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


@attrs.frozen
class SubagentIdentity:
    """Who a subagent session is, for its SubagentStop hooks."""

    agent_id: str
    agent_type: str
    transcript_path: str


class _SubagentHooks:
    """A subagent's loop hooks. Its end runs the parent's ``SubagentStop`` hooks where a main loop
    runs ``Stop`` (a block makes the subagent keep going, as Stop does); its prompt is the parent
    model's tool input, so ``UserPromptSubmit`` does not run; the rest are the subagent's own."""

    def __init__(self, own: Any, parent: Any, identity: SubagentIdentity) -> None:
        self._own = own
        self._parent = parent
        self._identity = identity

    async def user_prompt_submit(self, prompt: str) -> PromptOutcome:
        return PromptOutcome()

    async def stop(self, last_assistant_message: str, stop_hook_active: bool) -> StopOutcome:
        subagent_stop = getattr(self._parent, "subagent_stop", None)
        if subagent_stop is None:
            return StopOutcome()
        ident = self._identity
        return await subagent_stop(agent_id=ident.agent_id, agent_type=ident.agent_type,
                                   agent_transcript_path=ident.transcript_path,
                                   last_assistant_message=last_assistant_message,
                                   stop_hook_active=stop_hook_active)

    async def post_tool_batch(self, tool_calls: list[dict[str, Any]]) -> Any:
        return await self._own.post_tool_batch(tool_calls)

    async def pre_compact(self, trigger: str, custom_instructions: str | None) -> Any:
        return await self._own.pre_compact(trigger, custom_instructions)


@attrs.define
class _Background:
    task: asyncio.Task[None]
    session: Session
    description: str


class Session:
    """Runs prompts on one conversation; see the module docstring for what one run is.

    ``client`` is the model transport (shared between sessions if you like; ``owns_client`` says
    whether :meth:`aclose` closes it). ``emit`` receives every protocol message (the dicts the CLI
    prints in stream-json). ``history`` seeds the conversation (resume/fork, see
    :func:`agentfsm.sessions.open_session`). ``registry`` overrides the tools built from ``options``;
    ``depth``/``subagent`` are set for subagent sessions.
    """

    def __init__(self, options: Options, *, client: ModelClient | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, history: Sequence[Message] = (),
                 registry: Any = None, owns_client: bool = True, depth: int = 0,
                 subagent: SubagentIdentity | None = None, parent_hooks: Any = None,
                 observers: Sequence[StepObserver] = ()) -> None:
        log.ensure_configured()
        self.options = options
        self.session_id = options.session_id or str(uuid.uuid4())
        self.history: tuple[Message, ...] = tuple(history)
        self.emit = emit
        self.queue = queue if queue is not None else InputQueue()
        self.queue.bind(self._emit, self.session_id)
        self._client = client
        self._owns_client = owns_client
        self.depth = depth
        self.subagent = subagent
        self.observers = tuple(observers)
        self.sessions_dir: Path = options.sessions_dir or default_sessions_dir(options.cwd)
        self.trace_path: Path | None = (
            self.sessions_dir / f"{self.session_id}.jsonl") if options.write_trace else None
        self.trace = TraceWriter(self.trace_path)
        self.registry = registry if registry is not None else build_registry(options)
        self.gate, self.hooks = self._build_gate()
        if subagent is not None:
            self.hooks = _SubagentHooks(self.hooks, parent_hooks, subagent)
        self.driver: Driver | None = None
        self.last_state: LoopState | None = None
        self.resumed = False  # set by agentfsm.sessions when the file already holds header and history
        self._header_written = False
        self._running = False
        self._interrupted = False
        self._closed = False
        # Read/Edit freshness state lives as long as the conversation, not one driver run
        self._read_files: dict[str, float] = {}
        self._background: dict[str, _Background] = {}
        # foreground subagent runs: an aborted Agent call is cancelled without being awaited, so
        # teardown waits for them to write their results
        self._foreground: set[asyncio.Future[RunResult]] = set()
        self._subagent_cost = 0.0
        # resolved per call, so a CLI that switches logging on after the session exists is followed
        self.log = log.get_logger("agentfsm", session_id=self.session_id, agent_depth=depth)

    def _build_gate(self) -> tuple[Any, Any]:
        # Fails closed: a gate that cannot be built (bad settings, hooks that cannot load) stops the
        # session here, never leaves it without its rules.
        from agentfsm.hooks import build_gate

        gate = build_gate(self.options, session_id=self.session_id,
                          transcript_path=str(self.trace_path or ""), registry=self.registry)
        self.registry = gate.filter_registry(self.registry)
        return gate, gate

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            from agentfsm.transport import AnthropicTransport

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
        return tuple(self._background)

    def _emit(self, msg: dict[str, Any]) -> None:
        if self.emit is not None:
            self.emit(msg)

    def init_message(self) -> dict[str, Any]:
        return {"type": "system", "subtype": "init", "cwd": str(self.options.cwd),
                "session_id": self.session_id, "tools": list(self.registry.names()),
                "model": self.options.model, "permissionMode": self.permission_mode,
                "mcp_servers": [], "slash_commands": [], "output_style": "default",
                "agents": list(self._agent_definitions()),
                "agentfsm_version": _version(), "transcript_path": str(self.trace_path or "")}

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
            self._emit(self.init_message())
            if first_run:
                current = await self._session_start(current)
            started = time.monotonic()
            cost_before = self._subagent_cost
            results: list[RunResult] = []
            while current is not None:
                results.append(await self._run_once(current))
                current = await self._follow_up(results[-1])
            result = _merge(results, duration_ms=int((time.monotonic() - started) * 1000),
                            extra_cost=self._subagent_cost - cost_before)
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
        """The prompt of the next driver run of this run, or None when the run is over."""
        if result.terminal_reason is not TerminalReason.COMPLETED or self._interrupted:
            return None
        # with nothing queued, wait only while a background agent we launched may still report
        waiting = await self.queue.wait_for_items(lambda: bool(self._background) and not self._interrupted)
        if not waiting or self._interrupted:
            return None
        self.log.info("session.follow_up", queued=len(self.queue.pending),
                      background=len(self._background))
        return self._take_prompt()

    async def _run_once(self, prompt: Prompt) -> RunResult:
        system = system_blocks(self.options.cwd, system_prompt=self.options.system_prompt,
                               append=self.options.append_system_prompt)
        self.driver = Driver(options=self.options, client=self.client, registry=self.registry,
                             session_id=self.session_id, system=system, gate=self.gate, hooks=self.hooks,
                             trace=self.trace, emit=self._driver_emit, queue=self.queue,
                             services={"run_subagent": self.run_subagent}, observers=self.observers)
        self.driver.read_files = self._read_files
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
        prompt as a reminder, the way Claude Code adds it to the conversation."""
        start = getattr(self.hooks, "session_start", None)
        if start is None or self.options.agent_type is not None:
            return prompt
        source = "resume" if self.resumed else ("fork" if self.options.parent_session_id else "startup")
        outcome = await start(source)
        extra = tuple(getattr(outcome, "additional_context", ()) or ())
        if not extra:
            return prompt
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else list(prompt)
        return [*blocks, *({"type": "text", "text": prompts.reminder(c)} for c in extra)]

    def _driver_emit(self, msg: dict[str, Any]) -> None:
        # Each assistant block is in the session file as soon as it is complete — before its tool
        # runs — so a crash mid-tool leaves the dangling tool_use that resume repairs
        # (agentfsm.sessions.load_history). The driver records the whole message later, with its results.
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
            # A resumed file already holds both; its repairs are recomputed on every load.
            self.trace.session(self.session_id, self.options.limits, str(self.options.cwd),
                               self.options.model, self.options.parent_session_id)
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

    def abort(self) -> None:
        """Hard stop: like :meth:`interrupt`, but every running tool is cancelled at once."""
        self._interrupted = True
        if self.driver is not None:
            self.driver.abort()
        self.queue.poke()

    async def aclose(self) -> None:
        """Teardown: stop background agents, discard what is still queued, close the session file
        (and the client when this session owns it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._stop_background()
        self.queue.discard()
        end = getattr(self.hooks, "session_end", None)
        if end is not None and self._header_written and self.options.agent_type is None:
            await end("other")
        self.trace.close()
        client = self._client
        if self._owns_client and client is not None and hasattr(client, "aclose"):
            await client.aclose()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- subagents -------------------------------------------------------------------------------

    def _agent_definitions(self) -> dict[str, AgentDefinition]:
        from agentfsm.tools.agent import builtin_agents

        defs = {name: AgentDefinition(description=desc, prompt=prompt)
                for name, (desc, prompt) in builtin_agents().items()}
        defs.update(self.options.agents)
        return defs

    async def run_subagent(self, request: Any) -> Any:
        """The ``run_subagent`` service of the Agent tool (see :mod:`agentfsm.tools.agent`)."""
        from agentfsm.tools.agent import SubagentOutcome
        from agentfsm.tools.base import ToolError

        definition = self._agent_definitions().get(request.subagent_type)
        if definition is None:
            raise ToolError(f"Agent type '{request.subagent_type}' not found. Available agents: "
                            f"{', '.join(self._agent_definitions())}")
        if self.depth + 1 > MAX_AGENT_DEPTH:
            raise ToolError(f"Agents may nest at most {MAX_AGENT_DEPTH} deep; do this task yourself.")
        child = self._child_session(definition, request)
        self.log.info("subagent.start", agent_id=child.session_id, agent_type=request.subagent_type,
                      background=request.background, depth=child.depth)
        if request.background:
            task = asyncio.get_running_loop().create_task(
                self._run_background(child, request), name=f"subagent:{child.session_id}")
            self._background[child.session_id] = _Background(task, child, request.description)
            return SubagentOutcome(agent_id=child.session_id, launched=True,
                                   transcript_path=str(child.trace_path or ""))
        return await self._run_foreground(child, request)

    def _child_session(self, definition: AgentDefinition, request: Any) -> Session:
        agent_id = str(uuid.uuid4())
        base = self.options
        mode = self.permission_mode if self.permission_mode in PERMISSION_MODES else base.permission_mode
        options = attrs.evolve(
            base, model=definition.model or base.model, fallback_models=() if definition.model else
            base.fallback_models, tools=None, extra_tools=(), system_prompt=definition.prompt,
            append_system_prompt=None, limits=definition.limits or base.limits, permission_mode=mode,
            session_id=agent_id, resume=None, continue_session=False, fork_session=False,
            sessions_dir=self.sessions_dir / self.session_id / "subagents", json_schema=None,
            agent_type=request.subagent_type, parent_session_id=self.session_id)
        # the subagent's tools: fresh instances (tools may keep per-loop state), a subset of ours
        names = [n for n in self.registry.names()
                 if (definition.tools is None and n != "Agent")
                 or (definition.tools is not None and n in definition.tools)]
        registry = build_registry(attrs.evolve(options, extra_tools=base.extra_tools)).subset(names)
        transcript = str(self.sessions_dir / self.session_id / "subagents" / f"{agent_id}.jsonl")
        identity = SubagentIdentity(agent_id, request.subagent_type, transcript if base.write_trace else "")
        parent_emit = self.emit
        tool_use_id = request.tool_use_id

        def forward(msg: dict[str, Any]) -> None:
            # a foreground subagent's messages show in the parent's stream, marked with the Agent
            # call they belong to (as Claude Code does); its init/result/system messages do not
            shown = msg.get("type") in ("assistant", "user")
            if parent_emit is not None and shown and not request.background:
                parent_emit({**msg, "parent_tool_use_id": tool_use_id, "session_id": self.session_id})

        return Session(options, client=self.client, emit=forward, registry=registry, owns_client=False,
                       depth=self.depth + 1, subagent=identity, parent_hooks=self.hooks)

    async def _run_foreground(self, child: Session, request: Any) -> Any:
        run = asyncio.ensure_future(child.run(request.prompt))
        self._foreground.add(run)
        run.add_done_callback(self._foreground.discard)
        abort = request.abort
        abort_wait = asyncio.ensure_future(abort.wait()) if abort is not None else None
        try:
            waiters = {run} | ({abort_wait} if abort_wait is not None else set())
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():  # the parent's call was aborted: abort the subagent's loop too
                child.interrupt()
            # asyncio.wait, not `await run`: cancelling this call must not cancel the child's run
            # outright (it could not write its result); _stop_run below gives it a grace period
            await asyncio.wait({run})
            result: RunResult = run.result()
        except asyncio.CancelledError:
            # the parent gave up on the call: stop the subagent and let it write its result
            await _stop_run(child, run)
            raise
        finally:
            if abort_wait is not None:
                abort_wait.cancel()
            if run.done():
                await child.aclose()
            else:  # still unwinding after a cancel: close it once it is done
                run.add_done_callback(lambda _f: asyncio.ensure_future(child.aclose()))
        self._subagent_cost += result.total_cost_usd
        self.log.info("subagent.end", agent_id=child.session_id, terminal_reason=result.terminal_reason.value)
        return _outcome(child, result)

    async def _run_background(self, child: Session, request: Any) -> None:
        from agentfsm.tools.agent import task_notification

        status, text = "failed", ""
        try:
            result = await child.run(request.prompt)
            self._subagent_cost += result.total_cost_usd
            status = "completed" if not result.is_error else "failed"
            text = result.result or "; ".join(result.errors)
        except asyncio.CancelledError:
            status, text = "killed", "The agent was stopped before it finished."
            raise
        except Exception as exc:  # a crashed subagent must still be reported, never hang the parent
            self.log.exception("subagent.crashed", agent_id=child.session_id)
            text = f"{type(exc).__name__}: {exc}"
        finally:
            await child.aclose()
            entry = self._background.pop(child.session_id, None)
            self.log.info("subagent.end", agent_id=child.session_id, status=status, background=True)
            if not self._closed:
                self._emit({"type": "system", "subtype": "task_notification", "task_id": child.session_id,
                            "status": status, "summary": f"Agent \"{request.description}\" {status}",
                            "session_id": self.session_id})
                self.queue.submit(task_notification(child.session_id, request.description, status, text),
                                  kind=TASK_NOTIFICATION)
            elif entry is not None:
                self.queue.poke()

    async def _stop_background(self) -> None:
        running = list(self._background.values())
        for bg in running:
            bg.session.interrupt()
        tasks: list[asyncio.Future[Any]] = [bg.task for bg in running] + list(self._foreground)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=SUBAGENT_STOP_GRACE_S)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=SUBAGENT_STOP_GRACE_S)


async def _stop_run(child: Session, run: asyncio.Future[Any]) -> None:
    """Interrupt a subagent and give it a grace period to end on its own (writing its result);
    cancel it after that."""
    child.interrupt()
    _done, pending = await asyncio.wait({run}, timeout=SUBAGENT_STOP_GRACE_S)
    if pending:
        run.cancel()


def _outcome(child: Session, result: RunResult) -> Any:
    from agentfsm.tools.agent import SubagentOutcome

    uses = sum(len(m.tool_use_ids()) for m in child.history if m.role == "assistant")
    usage = result.usage
    tokens = sum(v for k, v in usage.items() if k.endswith("tokens") and isinstance(v, int))
    text = result.result if result.result is not None else "; ".join(result.errors)
    return SubagentOutcome(agent_id=child.session_id, text=text or "", is_error=result.is_error,
                           num_turns=result.num_turns, tool_uses=uses, total_tokens=tokens,
                           duration_ms=result.duration_ms, cost_usd=result.total_cost_usd,
                           transcript_path=str(child.trace_path or ""))


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
        permission_denials=tuple(d for r in results for d in r.permission_denials),
        warnings=tuple(w for r in results for w in r.warnings))


def _version() -> str:
    from agentfsm import __version__

    return __version__
