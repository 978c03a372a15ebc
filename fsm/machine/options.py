"""Options of one session: what the CLI flags and the Python API both fill in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from agentfsm.common.modes import PERMISSION_MODES, PermissionMode, normalize_mode
from agentfsm.machine.state import Limits

DEFAULT_MODEL = "claude-sonnet-4-5"

__all__ = ["PERMISSION_MODES", "AgentDefinition", "CanUseTool", "Options", "PermissionMode", "normalize_mode"]

CanUseTool = Callable[[str, Mapping[str, Any], Mapping[str, Any]], Awaitable[Any]]


def _mode(_inst: Any, _attr: attrs.Attribute, value: str | None) -> None:
    if value is not None:
        normalize_mode(value)  # raises, naming the modes


@attrs.frozen
class AgentDefinition:
    """A subagent type the ``Agent`` tool can launch (claude-agent-sdk's ``AgentDefinition``).

    ``prompt`` is the subagent's system prompt; ``tools`` None = the parent's tools minus ``Agent``;
    ``model`` None = the parent's model; ``limits`` None = the parent's limits."""

    description: str
    prompt: str
    tools: tuple[str, ...] | None = attrs.field(default=None, converter=attrs.converters.optional(tuple))
    model: str | None = None
    limits: Limits | None = None


@attrs.frozen
class Options:
    """Everything a session is configured with. ``tools`` None = every built-in tool."""

    model: str = DEFAULT_MODEL
    fallback_models: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    allowed_tools: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    # None: the settings files' `defaultMode` applies, else "default"
    permission_mode: str | None = attrs.field(default=None, validator=_mode)
    limits: Limits = attrs.field(factory=Limits)
    system_prompt: str | None = None
    append_system_prompt: str | None = None
    cwd: Path = attrs.field(factory=Path.cwd, converter=lambda p: Path(p).resolve())
    settings: str | None = None  # --settings FILE|JSON
    setting_sources: tuple[str, ...] = ("user", "project", "local")
    session_id: str | None = None
    resume: str | None = None
    continue_session: bool = False
    fork_session: bool = False
    # a str is a path, as for cwd
    sessions_dir: Path | None = attrs.field(default=None, converter=lambda p: None if p is None else Path(p))
    json_schema: Mapping[str, Any] | None = None
    # stream-json `stream_event` lines (each raw stream event) and `system`/`status` before each request,
    # as Claude Code prints them with --include-partial-messages
    include_partial_messages: bool = False
    # stream-json `system` hook_started/hook_response around each command hook (--include-hook-events)
    include_hook_events: bool = False
    # --task-budget: the token budget the model is told the task has (output_config.task_budget)
    task_budget: int | None = attrs.field(default=None)
    # the API's thinking configuration sent with each request (--max-thinking-tokens, --thinking); None: none
    thinking: Mapping[str, Any] | None = None
    # the line that opens the system prompt before a custom one: the Agent SDK's identity when the SDK
    # runs this CLI (Claude Code adds it there); None for a plain CLI run
    system_identity: str | None = None
    # --add-dir: more working directories (the permission checks' boundary, shown to the model), relative to cwd
    add_dirs: tuple[Path, ...] = attrs.field(default=(), converter=lambda ds: tuple(Path(d) for d in ds))

    @task_budget.validator
    def _positive_budget(self, _attribute: Any, value: int | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"task_budget must be a positive number of tokens, got {value!r}")
    can_use_tool: CanUseTool | None = None
    hooks: Mapping[str, Any] = attrs.field(factory=dict)  # Python hooks: event -> [HookMatcher]
    extra_tools: tuple[Any, ...] = ()  # user Tool instances
    write_trace: bool = True
    # False (`--no-sandbox`): the model's commands run outside the kernel sandbox whatever the
    # settings say (docs/sandbox.md)
    sandbox: bool = True
    # subagent types for the Agent tool, besides the built-in "general-purpose"
    agents: Mapping[str, AgentDefinition] = attrs.field(factory=dict)
    # asked before every model request; a true answer ends the run `background_requested`
    should_stop_before_next_call: Callable[[Any], Any] | None = None
    agent_type: str | None = None  # set for subagents
    # a foreground subagent's final text is shown in the stream (the SDK's initialize turns this off
    # unless it asks for forwardSubagentText, as Claude Code does)
    forward_subagent_text: bool = True
    # also keep the conversation in Claude Code's transcript layout (agentfsm.claude_transcript), where
    # the Agent SDK's session helpers look: set when agentfsm runs as the SDK's CLI
    claude_transcript: bool = False
    parent_session_id: str | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model, *self.fallback_models)
