"""``HookGate``: the real :class:`agentfsm.runtime.ports.ToolGate` and :class:`agentfsm.runtime.ports.SessionHooks` —
hooks plus permission rules and modes.

The tool pipeline calls :meth:`HookGate.pre_tool_use`, :meth:`HookGate.permission` and
:meth:`HookGate.post_tool_use` / :meth:`HookGate.post_tool_use_failure` for every call; the driver
calls the other async methods at the matching points of the loop (Stop, PostToolBatch, prompt
submission, compaction, session start and end).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.common.weak import weak_method
from agentfsm.hooks.config import Settings, load_settings
from agentfsm.hooks.inputs import (
    HOOK_EVENTS,
    HookEvent,
    HookInput,
    PostToolBatchInput,
    PostToolUseFailureInput,
    PostToolUseInput,
    PreCompactInput,
    PreToolUseInput,
    SessionEndInput,
    SessionStartInput,
    StopInput,
    SubagentStartInput,
    SubagentStopInput,
    ToolCallRecord,
    UserPromptSubmitInput,
)
from agentfsm.hooks.permissions import CanUseTool, PermissionPolicy, normalize_mode
from agentfsm.hooks.runner import HookMatcher, HookRunner, HookRunResult
from agentfsm.hooks.sandbox import SessionSandbox
from agentfsm.runtime.ports import (
    EventOutcome,
    PermissionOutcome,
    PostToolBatchOutcome,
    PostToolOutcome,
    PreToolOutcome,
    PromptOutcome,
    StopOutcome,
)
from agentfsm.tools.base import FileAccess, Tool

log = fsm_log.get_logger("agentfsm.permissions")


def _validate_python_hooks(python_hooks: Mapping[str, Sequence[HookMatcher]]) -> None:
    for event, matchers in python_hooks.items():
        if event not in HOOK_EVENTS:
            raise ValueError(f"python_hooks: unknown hook event {event!r}; "
                             f"expected one of {', '.join(HOOK_EVENTS)}")
        for m in matchers:
            if not isinstance(m, HookMatcher):
                raise TypeError(f"python_hooks[{event!r}] must hold HookMatcher records, not {m!r}")


class HookGate:
    """Hooks and permissions for one session.

    ``settings`` supplies command hooks and permission rules (see :func:`agentfsm.hooks.config.load_settings`);
    ``policy`` replaces the rules/mode built from settings; ``python_hooks`` adds Python callables
    per event; ``can_use_tool`` answers what the rules leave open (without it, an open question is a
    denial, as in any non-interactive run).
    """

    def __init__(self, cwd: str | Path = ".", *, settings: Settings | None = None,
                 policy: PermissionPolicy | None = None, permission_mode: str | None = None,
                 python_hooks: Mapping[str, Sequence[HookMatcher]] | None = None,
                 can_use_tool: CanUseTool | None = None, allowed_tools: str | Sequence[str] = (),
                 disallowed_tools: str | Sequence[str] = (), session_id: str = "",
                 transcript_path: str = "", env: Mapping[str, str] | None = None,
                 sandbox: bool = True) -> None:
        self.cwd = Path(cwd).resolve()
        self.settings = settings if settings is not None else Settings()
        self.policy = policy if policy is not None else PermissionPolicy.from_settings(
            self.settings, self.cwd, mode=permission_mode, allowed_tools=allowed_tools,
            disallowed_tools=disallowed_tools)
        if policy is not None and permission_mode is not None:
            self.policy.mode = normalize_mode(permission_mode)
        self.can_use_tool = can_use_tool
        self.prompt_id: str | None = None
        # (agent_id, agent_type) and the launching session's gate when this gate is a subagent's
        self.agent: tuple[str, str] | None = None
        self.parent: HookGate | None = None
        self.session_id = session_id
        self.transcript_path = transcript_path
        self.runner = HookRunner(self.settings.active_hooks(), project_dir=self.cwd, env=env)
        # the kernel sandbox of the model's commands (hooks, the user's own commands, run outside it)
        self.sandbox = SessionSandbox(self.settings.sandbox, self.policy, cli_enabled=sandbox)
        # held weakly (the sandbox holds the policy): gone, it auto-allows nothing (fails closed)
        self.policy.sandbox_auto_allow = weak_method(self.sandbox.auto_allows, gone=False)
        # the session's running background tasks, for the Stop hook's ``background_tasks`` (the session
        # sets it: agentfsm.runtime.tasks.TaskRegistry.background_tasks); None lists none
        self.background_tasks: Callable[[], Sequence[Mapping[str, Any]]] | None = None
        if python_hooks:
            _validate_python_hooks(python_hooks)
            for event, matchers in python_hooks.items():
                for m in matchers:
                    self.runner.add(event, m)

    @classmethod
    def from_cli(cls, cwd: str | Path = ".", *, settings: str | None = None,
                 permission_mode: str | None = None, allowed_tools: str | Sequence[str] = (),
                 disallowed_tools: str | Sequence[str] = (),
                 home: str | Path | None = None, **kwargs: Any) -> HookGate:
        """Load every settings source (plus ``--settings``) and build the gate; raises
        :class:`agentfsm.hooks.config.SettingsError` for a bad settings file."""
        loaded = load_settings(cwd, settings, home=home)
        return cls(cwd, settings=loaded, permission_mode=permission_mode, allowed_tools=allowed_tools,
                   disallowed_tools=disallowed_tools, **kwargs)

    @property
    def permission_mode(self) -> str:
        return self.policy.mode

    @permission_mode.setter
    def permission_mode(self, mode: str) -> None:
        self.policy.mode = normalize_mode(mode)

    def visible_tools(self, names: Sequence[str]) -> list[str]:
        return self.policy.visible_tools(names)

    def observe_hooks(self, observer: Callable[[dict[str, Any]], None]) -> None:
        """Tell ``observer`` when each command hook starts and ends (``hook_started``/``hook_response``)."""
        self.runner.observer = observer

    def file_access(self) -> FileAccess:
        """The file-access policy of one tool call (:class:`agentfsm.tools.base.FileAccess`): what the
        deny rules keep Read, Write, Edit, Glob and Grep from reading and writing."""
        return self.policy.file_access()

    def filter_registry(self, registry: Any) -> Any:
        """``registry`` (a :class:`agentfsm.tools.registry.ToolRegistry`) without the tools a bare deny rule
        forbids, so the model is never offered them."""
        names = list(registry.names())
        visible = set(self.visible_tools(names))
        hidden = [n for n in names if n not in visible]
        return registry.without(hidden) if hidden else registry

    def _common(self) -> dict[str, Any]:
        common = {"session_id": self.session_id, "transcript_path": self.transcript_path, "cwd": str(self.cwd),
                  "permission_mode": self.policy.mode, "prompt_id": self.prompt_id}
        if self.parent is not None:
            # a subagent's events are the session's: its id, file and prompt (as Claude Code), the
            # subagent named beside them
            outer = self.parent._common()
            common.update(session_id=outer["session_id"], transcript_path=outer["transcript_path"],
                          prompt_id=outer["prompt_id"])
        if self.agent is not None:
            common["agent_id"], common["agent_type"] = self.agent
        return common

    async def run(self, record: HookInput) -> HookRunResult:
        """Run the hooks of any event record as is (the typed methods below build the records)."""
        return await self.runner.run(record)

    def has_hooks(self, event: str) -> bool:
        """Some hook is configured for ``event`` (whether it matches a given call aside)."""
        return self.runner.has_hooks(event)

    async def _run_event(self, event: str, make: Callable[[], HookInput]) -> HookRunResult:
        """The hooks of ``event`` on the record ``make`` builds. With no hook configured for the
        event the answer is the runner's own answer when nothing matches, without building the
        record (a tool call passes three hook points; most sessions configure none of them)."""
        if not self.runner.has_hooks(event):
            return _nothing_ran(event)
        return await self.runner.run(make())

    # -- ToolGate -------------------------------------------------------------------------------

    async def pre_tool_use(self, tool_name: str, tool_input: Mapping[str, Any],
                           tool_use_id: str) -> PreToolOutcome:
        res = await self._run_event(HookEvent.PRE_TOOL_USE, lambda: PreToolUseInput(
            **self._common(), tool_name=tool_name, tool_input=tool_input, tool_use_id=tool_use_id))
        return PreToolOutcome(
            decision=res.permission_decision,
            reason=res.reason if res.blocked else res.permission_decision_reason,
            updated_input=res.updated_input, additional_context=res.additional_context, blocked=res.blocked,
            stop=res.stop, stop_reason=res.stop_reason, hook_ms=res.duration_ms,
        )

    async def permission(self, tool: Tool, tool_input: Mapping[str, Any],
                         pre: PreToolOutcome, *, tool_use_id: str = "") -> PermissionOutcome:
        """Rules, mode and the PreToolUse decision combined. A hook's ``deny`` (or exit 2) denies; its
        ``allow`` cannot override a deny or ask rule; its ``ask`` forces a question. ``defer`` is
        treated as ``ask`` here: ending the run for a deferred call is the pipeline's move. When a
        hook rewrote the input, the rules judge the rewritten input and deny rules the original too."""
        start = time.perf_counter()
        if pre.blocked:
            outcome = PermissionOutcome(
                "deny", f"{HookEvent.PRE_TOOL_USE}:{tool.name} hook error: {pre.reason}",
                rule="hook: PreToolUse exit 2")
            return self._log_permission(tool, outcome, start)
        effective = pre.updated_input if pre.updated_input is not None else tool_input
        if pre.updated_input is not None:
            denied = await self.policy.evaluate_off_loop(tool, tool_input)
            if denied.behavior == "deny" and denied.decided_by == "rule":
                outcome = PermissionOutcome("deny", denied.reason,
                                            rule=denied.rule.label if denied.rule is not None else "rule")
                return self._log_permission(tool, outcome, start)
        decision = await self.policy.decide(tool, effective, hook_decision=pre.decision,
                                            hook_reason=pre.reason, can_use_tool=self.can_use_tool,
                                            tool_use_id=tool_use_id)
        updated = decision.updated_input if decision.updated_input is not None else pre.updated_input
        label = decision.rule.label if decision.rule is not None else f"{decision.decided_by}"
        outcome = PermissionOutcome(decision.behavior, decision.reason, rule=label,
                                    updated_input=updated if decision.behavior == "allow" else None,
                                    user_modified=decision.decided_by == "callback"
                                    and decision.updated_input is not None,
                                    interrupt=decision.behavior == "deny" and decision.interrupt)
        return self._log_permission(tool, outcome, start)

    def _log_permission(self, tool: Tool, outcome: PermissionOutcome, start: float) -> PermissionOutcome:
        ms = (time.perf_counter() - start) * 1000
        # every field of the record, built directly (attrs.evolve inspects the class on each call)
        outcome = PermissionOutcome(outcome.behavior, outcome.reason, outcome.updated_input, outcome.rule,
                                    permission_ms=ms, user_modified=outcome.user_modified, interrupt=outcome.interrupt)
        log.info("permission", tool=tool.name, behavior=outcome.behavior, rule=outcome.rule,
                 permission_mode=self.policy.mode, permission_ms=round(ms, 2), session_id=self.session_id)
        return outcome

    async def post_tool_use(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                            tool_response: Any, duration_ms: float) -> PostToolOutcome:
        res = await self._run_event(HookEvent.POST_TOOL_USE, lambda: PostToolUseInput(
            **self._common(), tool_name=tool_name, tool_input=tool_input, tool_use_id=tool_use_id,
            tool_response=tool_response, duration_ms=duration_ms))
        return PostToolOutcome(updated_output=res.updated_tool_output,
                               additional_context=res.additional_context, blocked=res.blocked,
                               reason=res.reason, stop=res.stop, stop_reason=res.stop_reason,
                               hook_ms=res.duration_ms)

    async def post_tool_use_failure(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                                    error: str, is_interrupt: bool, *,
                                    duration_ms: float = 0.0) -> PostToolOutcome:
        res = await self._run_event(HookEvent.POST_TOOL_USE_FAILURE, lambda: PostToolUseFailureInput(
            **self._common(), tool_name=tool_name, tool_input=tool_input, tool_use_id=tool_use_id,
            error=error, is_interrupt=is_interrupt, duration_ms=duration_ms))
        return PostToolOutcome(additional_context=res.additional_context, blocked=res.blocked,
                               reason=res.reason, stop=res.stop, stop_reason=res.stop_reason,
                               hook_ms=res.duration_ms)

    # -- the other events -----------------------------------------------------------------------

    async def stop(self, last_assistant_message: str = "", stop_hook_active: bool = False) -> StopOutcome:
        tasks = tuple(self.background_tasks()) if self.background_tasks is not None else ()
        res = await self._run_event(HookEvent.STOP, lambda: StopInput(
            **self._common(), stop_hook_active=stop_hook_active, last_assistant_message=last_assistant_message,
            background_tasks=tasks))
        return _stop_outcome(res)

    async def subagent_stop(self, *, agent_id: str = "", agent_type: str = "",
                            agent_transcript_path: str = "", last_assistant_message: str = "",
                            stop_hook_active: bool = False) -> StopOutcome:
        res = await self._run_event(HookEvent.SUBAGENT_STOP, lambda: SubagentStopInput(
            **{**self._common(), "agent_id": agent_id, "agent_type": agent_type}, stop_hook_active=stop_hook_active,
            agent_transcript_path=agent_transcript_path, last_assistant_message=last_assistant_message))
        return _stop_outcome(res)

    async def subagent_start(self, *, agent_id: str, agent_type: str) -> tuple[str, ...]:
        """SubagentStart: a subagent is about to run; what the hooks add to its context."""
        res = await self._run_event(HookEvent.SUBAGENT_START, lambda: SubagentStartInput(
            **{**self._common(), "agent_id": agent_id, "agent_type": agent_type}))
        return tuple(res.additional_context)

    async def post_tool_batch(
            self, tool_calls: Sequence[ToolCallRecord | Mapping[str, Any]]) -> PostToolBatchOutcome:
        res = await self._run_event(HookEvent.POST_TOOL_BATCH,
                                    lambda: PostToolBatchInput(**self._common(), tool_calls=tool_calls))
        return PostToolBatchOutcome(blocked=res.blocked and not res.stop, reason=res.reason, stop=res.stop,
                                    stop_reason=res.stop_reason, additional_context=res.additional_context,
                                    errors=res.errors, hook_ms=res.duration_ms)

    async def user_prompt_submit(self, prompt: str) -> PromptOutcome:
        self.prompt_id = str(uuid.uuid4())  # a new prompt: every hook of its run names it
        res = await self._run_event(HookEvent.USER_PROMPT_SUBMIT,
                                    lambda: UserPromptSubmitInput(**self._common(), prompt=prompt))
        return PromptOutcome(blocked=res.blocked, reason=res.reason,
                             additional_context=res.additional_context, plain_context=res.plain_context,
                             stop=res.stop,
                             stop_reason=res.stop_reason, errors=res.errors, hook_ms=res.duration_ms)

    async def pre_compact(self, trigger: str = "auto",
                          custom_instructions: str | None = None) -> EventOutcome:
        res = await self._run_event(HookEvent.PRE_COMPACT, lambda: PreCompactInput(
            **self._common(), trigger=trigger,  # type: ignore[arg-type]
            custom_instructions=custom_instructions or ""))
        return _event_outcome(res)

    async def session_start(self, source: str = "startup") -> EventOutcome:
        res = await self._run_event(HookEvent.SESSION_START, lambda: SessionStartInput(
            **self._common(), source=source))  # type: ignore[arg-type]
        return _event_outcome(res)

    async def session_end(self, reason: str = "other") -> EventOutcome:
        res = await self._run_event(HookEvent.SESSION_END, lambda: SessionEndInput(**self._common(), reason=reason))
        return _event_outcome(res)


# _log_permission rebuilds a PermissionOutcome field by field: a field added to it must be added there
if tuple(f.name for f in attrs.fields(PermissionOutcome)) != (
        "behavior", "reason", "updated_input", "rule", "permission_ms", "user_modified",
        "interrupt"):  # pragma: no cover
    raise ImportError("agentfsm.hooks.gate: PermissionOutcome's fields changed; update _log_permission")


@functools.cache
def _nothing_ran(event: str) -> HookRunResult:
    """The answer when no hook of ``event`` ran (a frozen record: one per event is enough)."""
    return HookRunResult(event=event)


def _stop_outcome(res: HookRunResult) -> StopOutcome:
    # `continue: false` overrides every decision: a prevented stop is not also a block.
    return StopOutcome(blocked=res.blocked and not res.stop, reason=res.reason, prevented=res.stop,
                       stop_reason=res.stop_reason, additional_context=res.additional_context,
                       errors=res.errors, hook_ms=res.duration_ms)


def _event_outcome(res: HookRunResult) -> EventOutcome:
    return EventOutcome(additional_context=res.additional_context, stop=res.stop, stop_reason=res.stop_reason,
                        user_messages=res.user_messages, errors=res.errors, hook_ms=res.duration_ms)


def build_gate(options: Any, *, session_id: str = "", transcript_path: str = "",
               registry: Any = None) -> HookGate:
    """The gate of a session configured by an :class:`agentfsm.machine.options.Options`: settings from
    ``options.setting_sources`` plus ``--settings``, the CLI rule lists and mode, Python hooks and
    ``can_use_tool``. Raises :class:`agentfsm.hooks.config.SettingsError` for a bad settings source.

    ``Options.permission_mode`` cannot tell "not given" from an explicit ``default``, so
    ``default`` (or ``manual``) lets the settings' ``defaultMode`` apply.
    """
    settings = load_settings(options.cwd, options.settings, setting_sources=options.setting_sources)
    mode = options.permission_mode if normalize_mode(options.permission_mode) != "default" else None
    gate = HookGate(options.cwd, settings=settings, permission_mode=mode, python_hooks=options.hooks or None,
                    can_use_tool=options.can_use_tool, allowed_tools=options.allowed_tools,
                    disallowed_tools=options.disallowed_tools, session_id=session_id,
                    transcript_path=transcript_path, sandbox=getattr(options, "sandbox", True))
    gate.policy.additional_directories.extend(
        (gate.cwd / Path(d).expanduser()).resolve() for d in getattr(options, "add_dirs", ()))
    if registry is not None:
        _warn_unknown_tools(gate.policy, list(registry.names()) + [a for t in registry for a in t.aliases])
    return gate


def _warn_unknown_tools(policy: PermissionPolicy, known: Sequence[str]) -> None:
    # A rule naming a tool this session lacks is legal (settings are shared between setups) but is
    # usually a typo; a misspelt deny rule protects nothing, so say so.
    for rule in (*policy.deny, *policy.ask, *policy.allow):
        if rule.tool in known or rule.tool.startswith("mcp__"):
            continue
        log.warning("permission_rule_unknown_tool", rule=rule.label, source=rule.source,
                    known_tools=list(known))
