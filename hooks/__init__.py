"""Hooks and permissions, Claude Code compatible (docs/behaviour.md §5, §10).

- :mod:`agentfsm.hooks.inputs`: event names, typed input records (serialised to Claude Code's stdin JSON)
  and the typed hook output;
- :mod:`agentfsm.hooks.config`: settings files and ``--settings``, merged with Claude Code's precedence;
- :mod:`agentfsm.hooks.runner`: runs the matching hooks of one event (Python callables and commands);
- :mod:`agentfsm.hooks.permissions`: rules (``Bash(npm run test:*)``, ``Edit(src/**)``), modes, ``can_use_tool``;
- :mod:`agentfsm.hooks.gate`: :class:`HookGate`, the :class:`agentfsm.runtime.ports.ToolGate` the engine uses.
"""

from agentfsm.common.modes import PERMISSION_MODES
from agentfsm.hooks.config import PermissionSettings, Settings, SettingsError, load_settings, parse_settings
from agentfsm.hooks.gate import (
    EventOutcome,
    HookGate,
    PostToolBatchOutcome,
    PromptOutcome,
    StopOutcome,
    build_gate,
)
from agentfsm.hooks.inputs import (
    HOOK_EVENTS,
    HookEvent,
    HookInput,
    HookOutput,
    PostToolBatchInput,
    PostToolUseFailureInput,
    PostToolUseInput,
    PreCompactInput,
    PreToolUseInput,
    SessionEndInput,
    SessionStartInput,
    StopInput,
    SubagentStopInput,
    ToolCallRecord,
    UserPromptSubmitInput,
)
from agentfsm.hooks.permissions import (
    PermissionAllow,
    PermissionDecision,
    PermissionDeny,
    PermissionPolicy,
    PermissionRule,
    ToolPermissionContext,
    normalize_mode,
    split_tool_list,
)
from agentfsm.hooks.runner import (
    CommandHook,
    HookBlockingError,
    HookMatcher,
    HookResult,
    HookRunner,
    HookRunResult,
)

__all__ = [
    "HOOK_EVENTS",
    "PERMISSION_MODES",
    "CommandHook",
    "EventOutcome",
    "HookBlockingError",
    "HookEvent",
    "HookGate",
    "HookInput",
    "HookMatcher",
    "HookOutput",
    "HookResult",
    "HookRunResult",
    "HookRunner",
    "PermissionAllow",
    "PermissionDecision",
    "PermissionDeny",
    "PermissionPolicy",
    "PermissionRule",
    "PermissionSettings",
    "PostToolBatchInput",
    "PostToolBatchOutcome",
    "PostToolUseFailureInput",
    "PostToolUseInput",
    "PreCompactInput",
    "PreToolUseInput",
    "PromptOutcome",
    "SessionEndInput",
    "SessionStartInput",
    "Settings",
    "SettingsError",
    "StopInput",
    "StopOutcome",
    "SubagentStopInput",
    "ToolCallRecord",
    "ToolPermissionContext",
    "UserPromptSubmitInput",
    "build_gate",
    "load_settings",
    "normalize_mode",
    "parse_settings",
    "split_tool_list",
]
