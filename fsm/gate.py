"""The seam between the tool pipeline and hooks/permissions.

``fsm.pipeline`` asks a :class:`ToolGate` at steps 6, 7 and 12 of SPEC §4; ``hooks`` provides the
real gate (command and Python hooks, permission rules and modes). :class:`OpenGate` allows
everything and runs no hooks — the default of a bare engine and of unit tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

import attrs

from tools.base import Tool

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
                         pre: PreToolOutcome) -> PermissionOutcome: ...

    async def post_tool_use(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                            tool_response: Any, duration_ms: float) -> PostToolOutcome: ...

    async def post_tool_use_failure(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                                    error: str, is_interrupt: bool) -> PostToolOutcome: ...


class OpenGate:
    """No hooks; every call allowed unless a PreToolUse decision says otherwise."""

    async def pre_tool_use(self, tool_name: str, tool_input: Mapping[str, Any],
                           tool_use_id: str) -> PreToolOutcome:
        return PreToolOutcome()

    async def permission(self, tool: Tool, tool_input: Mapping[str, Any],
                         pre: PreToolOutcome) -> PermissionOutcome:
        if pre.decision == "deny":
            return PermissionOutcome("deny", pre.reason or "denied by hook")
        return PermissionOutcome("allow")

    async def post_tool_use(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                            tool_response: Any, duration_ms: float) -> PostToolOutcome:
        return PostToolOutcome()

    async def post_tool_use_failure(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                                    error: str, is_interrupt: bool) -> PostToolOutcome:
        return PostToolOutcome()
