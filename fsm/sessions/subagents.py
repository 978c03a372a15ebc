"""Subagents: the Agent tool's ``run_subagent`` service. Each subagent is a session of its own (own
messages, tools, limits, abort and session file) sharing the parent's model client; its end runs the
parent's ``SubagentStop`` hooks.

A foreground agent's run is awaited by the Agent call, its messages shown in the parent's stream
under that call; a background one runs as a task and reports with a ``<task-notification>`` queued
into the parent's session (the launch / wait / consume pattern Claude Code uses). Teardown interrupts
what still runs and gives it a grace period to write its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import attrs

from agentfsm.common import log
from agentfsm.machine.options import PERMISSION_MODES, AgentDefinition
from agentfsm.runtime.ports import PromptOutcome, StopOutcome
from agentfsm.runtime.result import RunResult
from agentfsm.sessions.compose import build_registry

# Subagents may launch subagents only when their definition offers them the Agent tool; this caps
# the nesting so a model that keeps delegating cannot recurse without end.
MAX_AGENT_DEPTH = 4
# how long teardown and a cancelled foreground call wait for a subagent to write its result
SUBAGENT_STOP_GRACE_S = 5.0


@attrs.frozen
class SubagentIdentity:
    """Who a subagent session is, for its SubagentStop hooks."""

    agent_id: str
    agent_type: str
    transcript_path: str


class SubagentHooks:
    """A subagent's loop hooks. Its end runs the parent's ``SubagentStop`` hooks where a main loop
    runs ``Stop`` (a block makes the subagent keep going, as Stop does); its prompt is the parent
    model's tool input, so ``UserPromptSubmit`` does not run; the rest are the subagent's own."""

    def __init__(self, own: Any, parent: Any, identity: SubagentIdentity) -> None:
        self._own = own
        self._parent = parent
        self._identity = identity

    @property
    def gate(self) -> Any:
        """The subagent's own gate (a subagent it launches names this session's ids through it)."""
        return self._own

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
    session: Any  # the subagent's Session
    description: str


class Subagents:
    """The subagents one session launched. ``make_session`` builds a child session (the Session class:
    passed in, so this module does not import the session layer that owns it)."""

    def __init__(self, parent: Any, make_session: Callable[..., Any]) -> None:
        # the owning session, held weakly (it owns this object: a strong reference back would be a
        # cycle that keeps every finished session for the cyclic gc; see agentfsm.common.weak)
        self.parent = weakref.proxy(parent)
        self._make_session = make_session
        self._background: dict[str, _Background] = {}
        # foreground subagent runs: an aborted Agent call is cancelled without being awaited, so
        # teardown waits for them to write their results
        self._foreground: set[asyncio.Future[RunResult]] = set()
        self.cost_usd = 0.0  # what subagents spent, added to the parent's result
        self.log = log.get_logger("agentfsm.subagents", session_id=parent.session_id)

    @property
    def running_in_background(self) -> tuple[str, ...]:
        """Ids of the background subagents still running."""
        return tuple(self._background)

    def definitions(self) -> dict[str, AgentDefinition]:
        from agentfsm.tools.agent import builtin_agents

        defs = {name: AgentDefinition(description=desc, prompt=prompt)
                for name, (desc, prompt) in builtin_agents().items()}
        defs.update(self.parent.options.agents)
        return defs

    async def run(self, request: Any) -> Any:
        """The ``run_subagent`` service of the Agent tool (see :mod:`agentfsm.tools.agent`)."""
        from agentfsm.tools.agent import SubagentOutcome
        from agentfsm.tools.base import ToolError

        definition = self.definitions().get(request.subagent_type)
        if definition is None:
            raise ToolError(f"Agent type '{request.subagent_type}' not found. Available agents: "
                            f"{', '.join(self.definitions())}")
        if self.parent.depth + 1 > MAX_AGENT_DEPTH:
            raise ToolError(f"Agents may nest at most {MAX_AGENT_DEPTH} deep; do this task yourself.")
        child = self._child_session(definition, request)
        self.log.info("subagent.start", agent_id=child.session_id, agent_type=request.subagent_type,
                      background=request.background, depth=child.depth)
        if request.background:
            task = asyncio.get_running_loop().create_task(
                self._run_background(child, request), name=f"subagent:{child.session_id}")
            self._background[child.session_id] = _Background(task, child, request.description)
            # the session's task registry owns it: TaskStop stops it, its end notifies (agentfsm.tasks)
            self.parent.tasks.adopt_agent(child.session_id, task, description=request.description,
                                          tool_use_id=request.tool_use_id, output_file=str(child.trace_path or ""),
                                          subagent_type=request.subagent_type, prompt=request.prompt,
                                          interrupt=child.interrupt)
            return SubagentOutcome(agent_id=child.session_id, launched=True,
                                   transcript_path=str(child.trace_path or ""))
        return await self._run_foreground(child, request)

    def _child_session(self, definition: AgentDefinition, request: Any) -> Any:
        agent_id = str(uuid.uuid4())
        base = self.parent.options
        mode = self.parent.permission_mode if self.parent.permission_mode in PERMISSION_MODES else base.permission_mode
        options = attrs.evolve(
            base, model=definition.model or base.model, fallback_models=() if definition.model else
            base.fallback_models, tools=None, extra_tools=(), system_prompt=definition.prompt,
            append_system_prompt=None, limits=definition.limits or base.limits, permission_mode=mode,
            session_id=agent_id, resume=None, continue_session=False, fork_session=False,
            sessions_dir=self.parent.sessions_dir / self.parent.session_id / "subagents", json_schema=None,
            agent_type=request.subagent_type, parent_session_id=self.parent.session_id)
        # the subagent's tools: fresh instances (tools may keep per-loop state), a subset of ours
        names = [n for n in self.parent.registry.names()
                 if (definition.tools is None and n != "Agent")
                 or (definition.tools is not None and n in definition.tools)]
        registry = build_registry(attrs.evolve(options, extra_tools=base.extra_tools)).subset(names)
        transcript = str(self.parent.sessions_dir / self.parent.session_id / "subagents" / f"{agent_id}.jsonl")
        identity = SubagentIdentity(agent_id, request.subagent_type, transcript if base.write_trace else "")
        parent_emit = self.parent.emit
        tool_use_id = request.tool_use_id

        forward_text = base.forward_subagent_text

        def forward(msg: dict[str, Any]) -> None:
            # a foreground subagent's messages show in the parent's stream, marked with the Agent
            # call they belong to (as Claude Code does); its init/result/system messages do not, nor
            # its text unless asked (forward_subagent_text), nor its tools' structured results
            if parent_emit is None or request.background or not _shown(msg, forward_text):
                return
            shown = {**msg, "parent_tool_use_id": tool_use_id, "session_id": self.parent.session_id}
            if msg.get("type") == "user":
                shown["tool_use_result"] = None
            parent_emit(shown)

        return self._make_session(options, client=self.parent.client, emit=forward, registry=registry,
                                  owns_client=False, depth=self.parent.depth + 1, subagent=identity,
                                  parent_hooks=self.parent.hooks)

    async def _started(self, child: Any, request: Any) -> Any:
        """The subagent's prompt, after the parent's SubagentStart hooks (their context rides with it,
        as SessionStart's does with a first prompt); a foreground one is shown under its Agent call."""
        from agentfsm.machine import prompts

        start = getattr(self.parent.hooks, "subagent_start", None)
        extra: tuple[str, ...] = ()
        if start is not None:
            extra = tuple(await start(agent_id=child.session_id, agent_type=request.subagent_type))
        parent_emit = self.parent.emit
        if parent_emit is not None and not request.background:
            parent_emit({"type": "user", "message": {"role": "user", "content": [
                {"type": "text", "text": request.prompt}]}, "parent_tool_use_id": request.tool_use_id,
                "session_id": self.parent.session_id, "uuid": str(uuid.uuid4())})
        if not extra:
            return request.prompt
        return [{"type": "text", "text": request.prompt}, *prompts.reminder_blocks(extra)]

    async def _run_foreground(self, child: Any, request: Any) -> Any:
        prompt = await self._started(child, request)
        run = asyncio.ensure_future(child.run(prompt))
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
        self.cost_usd += result.total_cost_usd
        self.log.info("subagent.end", agent_id=child.session_id, terminal_reason=result.terminal_reason.value)
        return _outcome(child, result)

    async def _run_background(self, child: Any, request: Any) -> None:
        status, text, usage = "failed", "", None
        try:
            result = await child.run(await self._started(child, request))
            self.cost_usd += result.total_cost_usd
            status = "completed" if not result.is_error else "failed"
            text = result.result or "; ".join(result.errors)
            outcome = _outcome(child, result)
            # the usage element of Claude Code's notification of a finished agent
            usage = {"subagent_tokens": outcome.total_tokens, "tool_uses": outcome.tool_uses,
                     "duration_ms": outcome.duration_ms}
        except asyncio.CancelledError:
            status, text = "killed", "The agent was stopped before it finished."
            raise
        except Exception as exc:  # a crashed subagent must still be reported, never hang the parent
            self.log.exception("subagent.crashed", agent_id=child.session_id)
            text = f"{type(exc).__name__}: {exc}"
        finally:
            await child.aclose()
            self._background.pop(child.session_id, None)
            self.log.info("subagent.end", agent_id=child.session_id, status=status, background=True)
            # the registry tells the client and, unless the session is closing or the task was
            # stopped by TaskStop (its result says so), queues the notification for the model
            with contextlib.suppress(ReferenceError):  # the session itself is gone: nobody to tell
                self.parent.tasks.agent_finished(child.session_id, status, text, usage=usage,
                                                 notify=not self.parent._closed)

    async def stop_all(self) -> None:
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


def _shown(msg: dict[str, Any], forward_text: bool) -> bool:
    """Whether a subagent's message shows in the parent's stream: its assistant and user messages,
    but an assistant message of text alone only when ``forward_text``."""
    if msg.get("type") == "user":
        return True
    if msg.get("type") != "assistant":
        return False
    content = (msg.get("message") or {}).get("content") or ()
    return forward_text or any(isinstance(b, dict) and b.get("type") != "text" for b in content)


async def _stop_run(child: Any, run: asyncio.Future[Any]) -> None:
    """Interrupt a subagent and give it a grace period to end on its own (writing its result);
    cancel it after that."""
    child.interrupt()
    _done, pending = await asyncio.wait({run}, timeout=SUBAGENT_STOP_GRACE_S)
    if pending:
        run.cancel()


def _outcome(child: Any, result: RunResult) -> Any:
    from agentfsm.tools.agent import SubagentOutcome

    uses = sum(len(m.tool_use_ids()) for m in child.history if m.role == "assistant")
    usage = result.usage
    tokens = sum(v for k, v in usage.items() if k.endswith("tokens") and isinstance(v, int))
    text = result.result if result.result is not None else "; ".join(result.errors)
    return SubagentOutcome(agent_id=child.session_id, text=text or "", is_error=result.is_error,
                           num_turns=result.num_turns, tool_uses=uses, total_tokens=tokens,
                           duration_ms=result.duration_ms, cost_usd=result.total_cost_usd,
                           transcript_path=str(child.trace_path or ""))
