"""The engine's ports: what it asks of the world besides the model (tool lookup, the gate of every
tool call, the hooks of the loop), as protocols with typed answers.

The tool pipeline asks a :class:`ToolGate` before and after each call (PreToolUse hooks, the
permission decision, PostToolUse hooks); the driver asks :class:`LoopHooks` at the loop's own hook
points (prompt submission, compaction, the tool batch, the end of a turn). :mod:`agentfsm.hooks`
implements both for Claude Code's settings; the engine never imports it. :class:`AllowAllGate` and
:class:`NoHooks` are explicit choices for tests and embedders that want no policy at all — nothing
falls back to them on its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from agentfsm.tools.base import FileAccess, NoFileRules, Tool

PermissionBehavior = Literal["allow", "deny", "ask"]



@attrs.frozen
class PreToolOutcome:
    """Combined PreToolUse hook answer. ``decision`` None = hooks said nothing about permission.
    ``blocked`` (exit 2) denies the call with ``reason``; ``stop`` (``continue: false``) ends the run
    after this batch."""

    decision: Literal["allow", "deny", "ask", "defer"] | None = None
    reason: str = ""
    updated_input: Mapping[str, Any] | None = None
    additional_context: tuple[str, ...] = ()
    blocked: bool = False
    stop: bool = False
    stop_reason: str = ""
    hook_ms: float = 0.0


@attrs.frozen
class PermissionOutcome:
    behavior: PermissionBehavior
    reason: str = ""
    updated_input: Mapping[str, Any] | None = None
    rule: str | None = None  # the rule that decided, e.g. "deny: Bash(rm:*)"
    permission_ms: float = 0.0
    # the permission prompt (a person, the SDK's can_use_tool) changed the input before allowing it
    user_modified: bool = False
    # a deny that also interrupts the run (a can_use_tool callback's deny with ``interrupt``)
    interrupt: bool = False


@attrs.frozen
class PostToolOutcome:
    """Combined PostToolUse(Failure) hook answer. ``updated_output`` replaces the tool_result content
    (dropped if it fails the tool's output schema); ``blocked`` feeds ``reason`` to the model."""

    updated_output: Any = None
    additional_context: tuple[str, ...] = ()
    blocked: bool = False
    reason: str = ""
    stop: bool = False
    stop_reason: str = ""
    hook_ms: float = 0.0


class ToolGate(Protocol):
    async def pre_tool_use(self, tool_name: str, tool_input: Mapping[str, Any],
                           tool_use_id: str) -> PreToolOutcome: ...

    async def permission(self, tool: Tool, tool_input: Mapping[str, Any],
                         pre: PreToolOutcome, *, tool_use_id: str = "") -> PermissionOutcome: ...

    async def post_tool_use(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                            tool_response: Any, duration_ms: float) -> PostToolOutcome: ...

    async def post_tool_use_failure(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                                    error: str, is_interrupt: bool, *,
                                    duration_ms: float = 0.0) -> PostToolOutcome: ...


class ToolLookup(Protocol):
    """The tools a loop offers (:class:`agentfsm.tools.ToolRegistry`)."""

    def get(self, name: str) -> Tool | None: ...

    def names(self) -> list[str]: ...

    def tools(self) -> list[Tool]: ...

    def api_schemas(self) -> list[dict[str, Any]]: ...

    def closest(self, name: str) -> str | None: ...


class AllowAllGate:
    """No hooks, no rules: every call allowed unless a PreToolUse decision says otherwise. Only ever
    used when a caller passes it explicitly (tests, a bare engine)."""

    def file_access(self) -> FileAccess:
        """No rules on files either (pass it to the driver as ``file_access`` to say so)."""
        return NoFileRules()

    async def pre_tool_use(self, tool_name: str, tool_input: Mapping[str, Any],
                           tool_use_id: str) -> PreToolOutcome:
        return PreToolOutcome()

    async def permission(self, tool: Tool, tool_input: Mapping[str, Any],
                         pre: PreToolOutcome, *, tool_use_id: str = "") -> PermissionOutcome:
        if pre.decision == "deny":
            return PermissionOutcome("deny", pre.reason or "denied by hook")
        return PermissionOutcome("allow")

    async def post_tool_use(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                            tool_response: Any, duration_ms: float) -> PostToolOutcome:
        return PostToolOutcome()

    async def post_tool_use_failure(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                                    error: str, is_interrupt: bool, *,
                                    duration_ms: float = 0.0) -> PostToolOutcome:
        return PostToolOutcome()


# --- the loop's own hook points ----------------------------------------------------------------


@attrs.frozen
class StopOutcome:
    """Stop/SubagentStop hooks' combined answer. ``blocked``: the agent keeps going with ``reason``
    as feedback; ``prevented`` (``continue: false``) ends the run with ``stop_reason`` and overrides
    a block."""

    blocked: bool = False
    reason: str = ""
    prevented: bool = False
    stop_reason: str = ""
    additional_context: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    hook_ms: float = 0.0


@attrs.frozen
class PostToolBatchOutcome:
    """Unpacks as ``(blocked, reason, stop, stop_reason, additional_context)``."""

    blocked: bool = False
    reason: str = ""
    stop: bool = False
    stop_reason: str = ""
    additional_context: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    hook_ms: float = 0.0

    def __iter__(self) -> Iterator[Any]:
        return iter((self.blocked, self.reason, self.stop, self.stop_reason, self.additional_context))


@attrs.frozen
class PromptOutcome:
    """UserPromptSubmit's answer; unpacks as ``(blocked, reason, additional_context)``. A blocked
    prompt is erased (never sent to the model); ``stop`` ends the session."""

    blocked: bool = False
    reason: str = ""
    additional_context: tuple[str, ...] = ()
    stop: bool = False
    stop_reason: str = ""
    errors: tuple[str, ...] = ()
    hook_ms: float = 0.0
    # which of ``additional_context`` were a command hook's plain stdout, not its JSON's context
    plain_context: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[Any]:
        return iter((self.blocked, self.reason, self.additional_context))


@attrs.frozen
class EventOutcome:
    """PreCompact / SessionStart / SessionEnd: nothing to block; context (SessionStart) and
    messages for the user (exit-2 stderr, ``systemMessage``)."""

    additional_context: tuple[str, ...] = ()
    stop: bool = False
    stop_reason: str = ""
    user_messages: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    hook_ms: float = 0.0


class LoopHooks(Protocol):
    """The hook points of the loop itself (the tool-call ones are :class:`ToolGate`'s)."""

    async def user_prompt_submit(self, prompt: str) -> PromptOutcome: ...

    async def stop(self, last_assistant_message: str, stop_hook_active: bool) -> StopOutcome: ...

    async def post_tool_batch(self, tool_calls: Sequence[Mapping[str, Any]]) -> PostToolBatchOutcome: ...

    async def pre_compact(self, trigger: str, custom_instructions: str | None) -> EventOutcome: ...


class SessionHooks(LoopHooks, Protocol):
    """What a session adds to the loop's hook points: its start and end, and a subagent's end."""

    async def session_start(self, source: str) -> EventOutcome: ...

    async def session_end(self, reason: str) -> EventOutcome: ...

    async def subagent_stop(self, *, agent_id: str, agent_type: str, agent_transcript_path: str,
                            last_assistant_message: str, stop_hook_active: bool) -> StopOutcome: ...


class NoHooks:
    """Runs no hooks: every answer is "go on". An explicit choice, like :class:`AllowAllGate`."""

    def has_hooks(self, event: str) -> bool:
        return False

    async def user_prompt_submit(self, prompt: str) -> PromptOutcome:
        return PromptOutcome()

    async def stop(self, last_assistant_message: str, stop_hook_active: bool) -> StopOutcome:
        return StopOutcome()

    async def post_tool_batch(self, tool_calls: Sequence[Mapping[str, Any]]) -> PostToolBatchOutcome:
        return PostToolBatchOutcome()

    async def pre_compact(self, trigger: str, custom_instructions: str | None) -> EventOutcome:
        return EventOutcome()

    async def session_start(self, source: str) -> EventOutcome:
        return EventOutcome()

    async def session_end(self, reason: str) -> EventOutcome:
        return EventOutcome()

    async def subagent_stop(self, *, agent_id: str, agent_type: str, agent_transcript_path: str,
                            last_assistant_message: str, stop_hook_active: bool) -> StopOutcome:
        return StopOutcome()
