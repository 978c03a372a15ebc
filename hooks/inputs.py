"""Hook event names, the typed input record of each event and the typed hook output.

Input records serialise to exactly the JSON Claude Code writes on a command hook's stdin (docs/behaviour.md §10),
so a hook written for Claude Code runs unchanged. Python-callable hooks receive the same records,
typed, and answer with a :class:`HookOutput` (or a dict in Claude Code's JSON shape, or None).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import attrs


class HookEvent(enum.StrEnum):
    PRE_TOOL_USE = "PreToolUse"
    POST_TOOL_USE = "PostToolUse"
    POST_TOOL_USE_FAILURE = "PostToolUseFailure"
    POST_TOOL_BATCH = "PostToolBatch"
    STOP = "Stop"
    SUBAGENT_STOP = "SubagentStop"
    SUBAGENT_START = "SubagentStart"
    USER_PROMPT_SUBMIT = "UserPromptSubmit"
    PRE_COMPACT = "PreCompact"
    SESSION_START = "SessionStart"
    SESSION_END = "SessionEnd"


HOOK_EVENTS: tuple[str, ...] = tuple(e.value for e in HookEvent)

# Events Claude Code knows but this loop never fires. Settings files written for Claude Code often
# configure them (Notification is common), so they must load without error and simply never run.
FOREIGN_EVENTS: frozenset[str] = frozenset({
    "Notification", "PermissionRequest", "PermissionDenied", "PostCompact",
    "PreToolBatch", "TaskCompleted", "TeammateIdle", "ConfigChange", "WorktreeCreate",
    "WorktreeRemove", "InstructionsLoaded", "Elicitation", "ElicitationResult", "StopFailure",
    "Setup", "UserPromptExpansion", "TaskCreated", "CwdChanged", "FileChanged",
})

# Which input field a matcher is compared with; None = the event ignores its matcher.
MATCHER_FIELD: Mapping[str, str | None] = {
    HookEvent.PRE_TOOL_USE: "tool_name",
    HookEvent.POST_TOOL_USE: "tool_name",
    HookEvent.POST_TOOL_USE_FAILURE: "tool_name",
    HookEvent.POST_TOOL_BATCH: None,
    HookEvent.STOP: None,
    HookEvent.SUBAGENT_STOP: "agent_type",
    HookEvent.SUBAGENT_START: "agent_type",
    HookEvent.USER_PROMPT_SUBMIT: None,
    HookEvent.PRE_COMPACT: "trigger",
    HookEvent.SESSION_START: "source",
    HookEvent.SESSION_END: "reason",
}

# Events whose exit code 2 blocks something; for the others stderr only reaches the user (docs/behaviour.md §10).
BLOCKING_EVENTS: frozenset[str] = frozenset({
    HookEvent.PRE_TOOL_USE, HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE,
    HookEvent.POST_TOOL_BATCH, HookEvent.STOP, HookEvent.SUBAGENT_STOP, HookEvent.USER_PROMPT_SUBMIT,
})

# Events where `decision: "block"` in JSON output means something (PreToolUse reads it as legacy deny).
DECISION_BLOCK_EVENTS: frozenset[str] = frozenset({
    HookEvent.POST_TOOL_USE, HookEvent.POST_TOOL_USE_FAILURE, HookEvent.POST_TOOL_BATCH,
    HookEvent.STOP, HookEvent.SUBAGENT_STOP, HookEvent.USER_PROMPT_SUBMIT,
})

# Events whose plain (non-JSON) stdout on exit 0 becomes context for the model.
PLAIN_STDOUT_CONTEXT_EVENTS: frozenset[str] = frozenset({
    HookEvent.USER_PROMPT_SUBMIT, HookEvent.SESSION_START,
})


def _json_safe(value: Any) -> Any:
    """Tool inputs and responses may hold attrs records, paths or bytes; hooks need plain JSON."""
    if attrs.has(type(value)):
        return _json_safe(attrs.asdict(value, recurse=False))
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


@attrs.frozen(kw_only=True)
class HookInput:
    """Fields every event carries. ``hook_event_name`` is the class's ``event``."""

    event: ClassVar[str] = ""
    # Claude Code leaves the permission mode out of some events' inputs (SubagentStart)
    shows_permission_mode: ClassVar[bool] = True

    session_id: str = ""
    transcript_path: str = ""
    cwd: str = ""
    # Claude Code sends "default" for the manual alias; the gate normalises before building records.
    permission_mode: str = "default"
    # the id of the user prompt whose run fired the event (None before the first prompt: left out)
    prompt_id: str | None = None
    # the subagent whose session fired the event (None in the main session: left out)
    agent_id: str | None = None
    agent_type: str | None = None

    @property
    def hook_event_name(self) -> str:
        return self.event

    def matcher_subject(self) -> str | None:
        """The value a matcher is compared with, or None when the event ignores matchers."""
        field = MATCHER_FIELD.get(self.event)
        if field is None:
            return None
        value = getattr(self, field, None)
        return "" if value is None else str(value)

    def to_json_dict(self) -> dict[str, Any]:
        """Claude Code's stdin object: common fields first, then the event's own."""
        out: dict[str, Any] = {
            "session_id": self.session_id,
            "transcript_path": self.transcript_path,
            "cwd": self.cwd,
            **({"prompt_id": self.prompt_id} if self.prompt_id is not None else {}),
            **({"permission_mode": self.permission_mode} if self.shows_permission_mode else {}),
            **({"agent_id": self.agent_id} if self.agent_id is not None else {}),
            **({"agent_type": self.agent_type} if self.agent_type is not None else {}),
            "hook_event_name": self.event,
        }
        for f in attrs.fields(type(self)):
            if f.name in out or f.name in ("prompt_id", "permission_mode", "agent_id", "agent_type"):
                continue
            out[f.name] = _json_safe(getattr(self, f.name))
        return out

    def to_json(self) -> str:
        # Compact separators on purpose: shell hooks in the wild grep for '"stop_hook_active":true'
        # (the Stop hook example of docs/behaviour.md §9 does), so the bytes must look like Claude Code's.
        return json.dumps(self.to_json_dict(), ensure_ascii=False, separators=(",", ":"))


@attrs.frozen(kw_only=True)
class PreToolUseInput(HookInput):
    event: ClassVar[str] = HookEvent.PRE_TOOL_USE
    tool_name: str
    tool_input: Mapping[str, Any] = attrs.field(factory=dict)
    tool_use_id: str = ""


def whole_ms(value: float) -> int:
    """A duration in whole milliseconds, as Claude Code gives hooks ``duration_ms``."""
    return round(value)


@attrs.frozen(kw_only=True)
class PostToolUseInput(HookInput):
    event: ClassVar[str] = HookEvent.POST_TOOL_USE
    tool_name: str
    tool_input: Mapping[str, Any] = attrs.field(factory=dict)
    tool_use_id: str = ""
    tool_response: Any = None
    duration_ms: int = attrs.field(default=0, converter=whole_ms)


@attrs.frozen(kw_only=True)
class PostToolUseFailureInput(HookInput):
    event: ClassVar[str] = HookEvent.POST_TOOL_USE_FAILURE
    tool_name: str
    tool_input: Mapping[str, Any] = attrs.field(factory=dict)
    tool_use_id: str = ""
    error: str = ""
    is_interrupt: bool = False
    duration_ms: int = attrs.field(default=0, converter=whole_ms)


@attrs.frozen(kw_only=True)
class ToolCallRecord:
    """One call of a finished batch, as PostToolBatch reports it."""

    tool_name: str
    tool_input: Mapping[str, Any] = attrs.field(factory=dict)
    tool_use_id: str = ""
    # None = the call produced no response (denied, cancelled); omitted from the JSON then.
    tool_response: Any = None

    def to_json_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tool_name": self.tool_name,
            "tool_input": _json_safe(self.tool_input),
            "tool_use_id": self.tool_use_id,
        }
        if self.tool_response is not None:
            out["tool_response"] = _json_safe(self.tool_response)
        return out


def _tool_calls(value: Any) -> tuple[ToolCallRecord, ...]:
    out = []
    for item in value:
        if isinstance(item, ToolCallRecord):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(ToolCallRecord(
                tool_name=str(item.get("tool_name", "")), tool_input=item.get("tool_input") or {},
                tool_use_id=str(item.get("tool_use_id", "")), tool_response=item.get("tool_response"),
            ))
        else:
            raise TypeError(f"a PostToolBatch tool call must be a ToolCallRecord or a mapping, not {item!r}")
    return tuple(out)


@attrs.frozen(kw_only=True)
class PostToolBatchInput(HookInput):
    event: ClassVar[str] = HookEvent.POST_TOOL_BATCH
    tool_calls: tuple[ToolCallRecord, ...] = attrs.field(default=(), converter=_tool_calls)

    def to_json_dict(self) -> dict[str, Any]:
        out = super().to_json_dict()
        out["tool_calls"] = [c.to_json_dict() for c in self.tool_calls]
        return out


@attrs.frozen(kw_only=True)
class StopInput(HookInput):
    event: ClassVar[str] = HookEvent.STOP
    stop_hook_active: bool = False
    last_assistant_message: str = ""
    # Claude Code's lists of the session's background tasks and scheduled prompts: the tasks still
    # running when the turn ends (agentfsm.tasks: task_id, task_type, description); agentfsm has no crons
    background_tasks: tuple[Mapping[str, Any], ...] = ()
    session_crons: tuple[Mapping[str, Any], ...] = ()


@attrs.frozen(kw_only=True)
class SubagentStopInput(HookInput):
    event: ClassVar[str] = HookEvent.SUBAGENT_STOP
    stop_hook_active: bool = False
    agent_transcript_path: str = ""
    last_assistant_message: str = ""
    background_tasks: tuple[Mapping[str, Any], ...] = ()
    session_crons: tuple[Mapping[str, Any], ...] = ()


@attrs.frozen(kw_only=True)
class SubagentStartInput(HookInput):
    """A subagent is about to run its prompt (``agent_id``, ``agent_type`` of the common fields name it)."""

    event: ClassVar[str] = HookEvent.SUBAGENT_START
    shows_permission_mode: ClassVar[bool] = False


@attrs.frozen(kw_only=True)
class UserPromptSubmitInput(HookInput):
    event: ClassVar[str] = HookEvent.USER_PROMPT_SUBMIT
    prompt: str = ""


@attrs.frozen(kw_only=True)
class PreCompactInput(HookInput):
    event: ClassVar[str] = HookEvent.PRE_COMPACT
    trigger: Literal["manual", "auto"] = "auto"
    custom_instructions: str = ""


@attrs.frozen(kw_only=True)
class SessionStartInput(HookInput):
    event: ClassVar[str] = HookEvent.SESSION_START
    source: Literal["startup", "resume", "clear", "compact", "fork"] = "startup"


@attrs.frozen(kw_only=True)
class SessionEndInput(HookInput):
    event: ClassVar[str] = HookEvent.SESSION_END
    reason: str = "other"


INPUT_TYPES: Mapping[str, type[HookInput]] = {
    cls.event: cls
    for cls in (PreToolUseInput, PostToolUseInput, PostToolUseFailureInput, PostToolBatchInput, StopInput,
                SubagentStopInput, SubagentStartInput, UserPromptSubmitInput, PreCompactInput, SessionStartInput,
                SessionEndInput)
}

PermissionDecisionValue = Literal["allow", "deny", "ask", "defer"]
_PERMISSION_DECISIONS = ("allow", "deny", "ask", "defer")


@attrs.frozen(kw_only=True)
class HookOutput:
    """What one hook answered, in typed form. Every field defaults to "said nothing".

    ``decision`` is ``"block"`` (or the PreToolUse legacy ``"approve"``, mapped to allow on parse).
    The event-specific fields are those of ``hookSpecificOutput``; a Python hook sets them directly.
    """

    continue_: bool = True
    stop_reason: str = ""
    suppress_output: bool = False
    system_message: str = ""
    decision: Literal["block"] | None = None
    reason: str = ""
    permission_decision: PermissionDecisionValue | None = None
    permission_decision_reason: str = ""
    updated_input: Mapping[str, Any] | None = None
    additional_context: str = ""
    updated_tool_output: Any = None

    # Small constructors for Python hooks, so the common answers read as what they mean.
    @classmethod
    def allow(cls, reason: str = "", updated_input: Mapping[str, Any] | None = None) -> HookOutput:
        return cls(permission_decision="allow", permission_decision_reason=reason,
                   updated_input=updated_input)

    @classmethod
    def deny(cls, reason: str) -> HookOutput:
        return cls(permission_decision="deny", permission_decision_reason=reason)

    @classmethod
    def ask(cls, reason: str = "") -> HookOutput:
        return cls(permission_decision="ask", permission_decision_reason=reason)

    @classmethod
    def block(cls, reason: str) -> HookOutput:
        return cls(decision="block", reason=reason)

    @classmethod
    def stop(cls, stop_reason: str = "") -> HookOutput:
        return cls(continue_=False, stop_reason=stop_reason)

    @classmethod
    def context(cls, text: str) -> HookOutput:
        return cls(additional_context=text)

    def to_json_dict(self, event: str) -> dict[str, Any]:
        """The same answer in Claude Code's JSON shape (for logs and for tests that round-trip)."""
        out: dict[str, Any] = {}
        if not self.continue_:
            out["continue"] = False
        if self.stop_reason:
            out["stopReason"] = self.stop_reason
        if self.suppress_output:
            out["suppressOutput"] = True
        if self.system_message:
            out["systemMessage"] = self.system_message
        if self.decision:
            out["decision"] = self.decision
        if self.reason:
            out["reason"] = self.reason
        specific: dict[str, Any] = {}
        if self.permission_decision:
            specific["permissionDecision"] = self.permission_decision
        if self.permission_decision_reason:
            specific["permissionDecisionReason"] = self.permission_decision_reason
        if self.updated_input is not None:
            specific["updatedInput"] = dict(self.updated_input)
        if self.additional_context:
            specific["additionalContext"] = self.additional_context
        if self.updated_tool_output is not None:
            specific["updatedToolOutput"] = self.updated_tool_output
        if specific:
            out["hookSpecificOutput"] = {"hookEventName": event, **specific}
        return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else json.dumps(value))


def parse_hook_output(data: Mapping[str, Any], event: str) -> tuple[HookOutput, tuple[str, ...]]:
    """Read Claude Code's JSON answer for ``event``. Returns the typed answer and error notes for
    the parts that had to be ignored (a wrong ``hookEventName``, an unknown decision, bad types);
    a malformed field never invalidates the rest of the answer."""
    notes: list[str] = []
    kw: dict[str, Any] = {}

    cont = data.get("continue", True)
    if isinstance(cont, bool):
        kw["continue_"] = cont
    else:
        notes.append(f"'continue' must be a boolean, got {cont!r}; ignored")
    kw["stop_reason"] = _text(data.get("stopReason"))
    kw["suppress_output"] = data.get("suppressOutput") is True
    kw["system_message"] = _text(data.get("systemMessage"))
    kw["reason"] = _text(data.get("reason"))

    decision = data.get("decision")
    if decision is not None:
        if event == HookEvent.PRE_TOOL_USE and decision in ("approve", "block"):
            # Legacy PreToolUse form, still honoured by Claude Code: approve/block = allow/deny.
            kw["permission_decision"] = "allow" if decision == "approve" else "deny"
            kw["permission_decision_reason"] = kw["reason"]
        elif decision == "block" and event in DECISION_BLOCK_EVENTS:
            kw["decision"] = "block"
        elif decision in ("approve", "undefined", ""):
            pass  # older Claude Code releases wrote these for "no decision"
        else:
            notes.append(f"'decision': {decision!r} has no meaning for {event}; ignored")

    specific = data.get("hookSpecificOutput")
    if specific is not None:
        if not isinstance(specific, Mapping):
            notes.append("'hookSpecificOutput' must be an object; ignored")
        elif specific.get("hookEventName") != event:
            notes.append(
                f"hookSpecificOutput.hookEventName is {specific.get('hookEventName')!r} but the running "
                f"event is {event!r}; hookSpecificOutput ignored")
        else:
            _parse_specific(specific, event, kw, notes)
    return HookOutput(**kw), tuple(notes)


def _parse_specific(specific: Mapping[str, Any], event: str, kw: dict[str, Any], notes: list[str]) -> None:
    if event == HookEvent.PRE_TOOL_USE:
        pd = specific.get("permissionDecision")
        if pd is not None:
            if pd in _PERMISSION_DECISIONS:
                kw["permission_decision"] = pd
            else:
                notes.append(f"permissionDecision must be one of {'|'.join(_PERMISSION_DECISIONS)}, "
                             f"got {pd!r}; ignored")
        if "permissionDecisionReason" in specific:
            kw["permission_decision_reason"] = _text(specific.get("permissionDecisionReason"))
        ui = specific.get("updatedInput")
        if ui is not None:
            if isinstance(ui, Mapping):
                kw["updated_input"] = dict(ui)
            else:
                notes.append("updatedInput must be an object; ignored")
    if event == HookEvent.POST_TOOL_USE:
        for key in ("updatedToolOutput", "updatedMCPToolOutput"):
            if specific.get(key) is not None:
                kw["updated_tool_output"] = specific[key]
                break
    ctx = specific.get("additionalContext")
    if ctx is not None:
        kw["additional_context"] = _text(ctx)
