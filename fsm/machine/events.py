"""What the driver observed, handed to the machine (:mod:`agentfsm.machine.graph`). Plain frozen records.

Each event also has a *record* form (:func:`to_record` / :func:`from_record`): what the session file
keeps of it so the auditor can re-decide the move. Message contents are reduced to their skeleton
(roles, kinds, tool ids and names, error flags, whether a text is blank) — exactly what the graph's
guards read; the contents themselves are in the file's ``message`` records.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs

from agentfsm.machine.state import Message, TerminalReason


@attrs.frozen
class ModelError:
    """A failed model call, classified once so the graph never parses error strings.

    kind: ``prompt_too_long`` | ``image`` | ``api`` (a structured API error) | ``model`` (malformed
    stream, invariant broken) | ``overloaded`` | ``connection`` | ``stream_api_error`` (the API sent an
    ``api_error`` event part-way through a stream: retried like a dropped connection, except that a
    complete text already shown is resumed from) | ``stream_error`` (an SSE ``error`` event of another
    type part-way through a stream: requested again while nothing complete was shown, its complete calls
    run, otherwise final, shown as ``API Error: <message>``) | ``stream_dropped`` (the connection
    closed before the first event) | ``stream_garbled`` (what came was not a stream: invalid event
    JSON, an HTML page, bytes that are not SSE, before any content block).
    """

    kind: str
    message: str
    status: int | None = None
    retryable: bool = False
    # the gateway that answered: ``host[:port]`` of a base URL other than the Anthropic API's, "" for the
    # API itself or an in-process model (Claude Code's text for a 5xx says which to check)
    endpoint: str = ""

    @property
    def answered(self) -> bool:
        """The API accepted the request and what it sent back broke or was not a stream. A transport
        never sends an accepted request again on its own: whether the loop asks again is the loop's
        decision, and the event that reports the failure says what was already shown."""
        return self.kind in ("stream_dropped", "stream_garbled")


@attrs.frozen
class ModelResponse:
    """One assembled model response. ``blocks`` holds every content block that reached its
    ``content_block_stop``; ``invalid_tool_inputs`` maps tool_use ids whose JSON did not parse to the
    raw text (those blocks carry ``input: {}``); ``incomplete_tool_uses`` counts tool_use blocks the
    stream started but never finished."""

    blocks: tuple[Mapping[str, Any], ...] = ()
    stop_reason: str | None = None
    usage: Mapping[str, Any] = attrs.field(factory=dict)
    model: str = ""
    invalid_tool_inputs: Mapping[str, str] = attrs.field(factory=dict)
    incomplete_tool_uses: int = 0
    # the API's ids of the response and of its request (a refusal's result names them)
    message_id: str = ""
    request_id: str = ""

    def tool_uses(self) -> list[Mapping[str, Any]]:
        return [b for b in self.blocks if b.get("type") == "tool_use"]

    def usable_tool_uses(self) -> list[Mapping[str, Any]]:
        return [b for b in self.tool_uses() if b["id"] not in self.invalid_tool_inputs]

    def visible_text(self) -> str:
        return "".join(b.get("text", "") for b in self.blocks if b.get("type") == "text").strip()

    def has_thinking(self) -> bool:
        return any(b.get("type") in ("thinking", "redacted_thinking") for b in self.blocks)

    def as_message(self) -> Message:
        """The response as history keeps it and sends it back: tool_use blocks after every other
        block (text streamed after a tool_use moves before it, as Claude Code sends it back)."""
        calls = tuple(b for b in self.blocks if b.get("type") == "tool_use")
        rest = tuple(b for b in self.blocks if b.get("type") != "tool_use")
        return Message("assistant", rest + calls, kind="assistant")


@attrs.frozen
class Compaction:
    """A finished compaction: the messages that replace the history, and what it cost."""

    messages: tuple[Message, ...]
    trigger: str  # "auto" | "reactive" | "manual"
    pre_tokens: int = 0
    summary: str = ""


# --- events, by the phase that consumes them -------------------------------------------------


@attrs.frozen
class Assembled:
    """assemble finished: the auto-compaction result when one ran (``compact_failed`` when it was
    tried and failed)."""

    compaction: Compaction | None = None
    compact_failed: bool = False


@attrs.frozen
class SetupFailed:
    reason: TerminalReason
    detail: str


@attrs.frozen
class Refused:
    """call_model preflight said no (blocking limit, budget, background request)."""

    reason: TerminalReason
    detail: str


@attrs.frozen
class StreamOpened:
    """The request was accepted. ``sent_input``: queued user input the request carried (as
    attachment messages); it joins the conversation with this step."""

    model: str = ""
    sent_input: tuple[Message, ...] = ()


@attrs.frozen
class CallFailed:
    """The request failed before or during streaming, after the transport's own retries.

    ``compaction`` is set when a reactive compaction was tried (and succeeded) for a prompt-too-long
    error; ``fallback_available`` says another model of the fallback chain is left to try.
    ``non_streaming_available``: the client can make the same request without streaming.
    ``shown`` / ``finished`` are the raw facts of a response that broke part-way: the complete
    blocks it showed, and the results of the tool calls among them that had finished. What becomes
    of them (kept and paired, or withdrawn) is the route's declared consequence, not the runtime's.
    ``compaction_failure``: why a reactive compaction that was tried failed (the summary came back
    empty, or its request failed), in the words the run's result gives.
    """

    error: ModelError
    compaction: Compaction | None = None
    fallback_available: bool = False
    non_streaming_available: bool = False
    shown: tuple[Mapping[str, Any], ...] = ()
    finished: tuple[Mapping[str, Any], ...] = ()
    compaction_failure: str = ""


@attrs.frozen
class StreamEnded:
    """The response ended (``message_stop``). ``json_schema``: the run must end with a call of the
    structured-output tool (``--json-schema``); ``structured_output_ids``: this response's calls of it;
    ``cost_usd``: what the run has spent, this response included (checked against ``max_budget_usd``);
    ``started``: the response's calls whose tool had started (or finished) while it streamed, a raw fact
    the route of a refused response reads (a call that started may have done something); ``finished``:
    the results of those that had finished by the response's end (a response over the budget keeps them)."""

    response: ModelResponse
    json_schema: bool = False
    structured_output_ids: tuple[str, ...] = ()
    cost_usd: float = 0.0
    started: tuple[str, ...] = ()
    finished: tuple[Mapping[str, Any], ...] = ()


@attrs.frozen
class StopHookVerdict:
    """Stop hooks' combined answer. ``blocked`` re-enters with ``reason``; so does ``context`` (the
    hooks' ``additionalContext``), which the model is shown even without a block, as Claude Code
    does; ``prevented`` ends the run (``continue: false``) with ``stop_reason``."""

    blocked: bool = False
    reason: str = ""
    prevented: bool = False
    stop_reason: str = ""
    context: tuple[str, ...] = ()


@attrs.frozen
class ToolsDrained:
    """Every tool of the batch has its result. ``results`` is the one user message with every
    tool_result (and PostToolBatch context); the rest says how the batch ended: ``deferred_ids``
    (calls a PreToolUse hook deferred), a hook that stopped continuation, a result that ends the
    turn, a PostToolBatch block."""

    assistant: Message
    results: Message
    aborted: bool = False
    deferred_ids: tuple[str, ...] = ()
    hook_stopped: bool = False
    hook_stop_reason: str = ""
    ends_turn: bool = False
    post_batch_blocked: bool = False
    post_batch_reason: str = ""
    context_layers: Mapping[str, Any] = attrs.field(factory=dict)
    # the batch's calls of the structured-output tool (--json-schema)
    structured_output_ids: tuple[str, ...] = ()


@attrs.frozen
class Aborted:
    """The user (or the host) cancelled. ``shown``: the complete blocks of the response in progress;
    ``finished``: the results of its tool calls that had finished (the abort route pairs the rest)."""

    shown: tuple[Mapping[str, Any], ...] = ()
    finished: tuple[Mapping[str, Any], ...] = ()
    detail: str = "Request interrupted by user"


@attrs.frozen
class TaskNotified:
    """After the run ended, background tasks it started reported: ``notifications`` are their
    ``<task-notification>`` messages (taken from the input queue), in the order they arrived."""

    notifications: tuple[Message, ...]


EVENT_TYPES: tuple[type, ...] = (
    Assembled, SetupFailed, Refused, StreamOpened, CallFailed, StreamEnded, StopHookVerdict, ToolsDrained, Aborted,
    TaskNotified,
)
Event = (
    Assembled
    | SetupFailed
    | Refused
    | StreamOpened
    | CallFailed
    | StreamEnded
    | StopHookVerdict
    | ToolsDrained
    | Aborted
    | TaskNotified
)


# --- record form -------------------------------------------------------------------------------

_EVENTS_BY_NAME: Mapping[str, type] = {t.__name__: t for t in EVENT_TYPES}
_SKELETON_KEYS = ("type", "id", "name", "tool_use_id", "is_error")


def _block_skeleton(block: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: block[k] for k in _SKELETON_KEYS if k in block}
    if block.get("type") == "text":
        # blank or not is all a guard reads of a text ("visible text")
        out["text"] = "…" if str(block.get("text", "")).strip() else ""
    return out


def message_skeleton(msg: Message) -> dict[str, Any]:
    return {"role": msg.role, "kind": msg.kind, "uuid": msg.uuid,
            "content": [_block_skeleton(b) for b in msg.content]}


def _message(data: Mapping[str, Any]) -> Message:
    return Message(data["role"], tuple(data.get("content", ())), kind=data.get("kind", "prompt"),
                   uuid=data.get("uuid") or "")


# fields that hold content blocks: their skeletons are recorded
_BLOCK_FIELDS = frozenset({"shown", "finished"})


def _encode(value: Any) -> Any:
    if isinstance(value, Message):
        return message_skeleton(value)
    if isinstance(value, ModelResponse):
        return {"blocks": [_block_skeleton(b) for b in value.blocks], "stop_reason": value.stop_reason,
                "model": value.model, "invalid_tool_inputs": sorted(value.invalid_tool_inputs),
                "incomplete_tool_uses": value.incomplete_tool_uses}
    if isinstance(value, Compaction):
        return {"trigger": value.trigger, "pre_tokens": value.pre_tokens,
                "messages": [message_skeleton(m) for m in value.messages]}
    if isinstance(value, ModelError):
        return attrs.asdict(value)
    if isinstance(value, TerminalReason):
        return value.value
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return sorted(value)  # context layers: only their names are kept
    return value


_NO_DEFAULT = object()


@functools.cache
def _fields_and_defaults(kind: type) -> tuple[tuple[str, Any], ...]:
    """Each field of an event class with its default (a factory's product, made once: the factories
    of events make empty containers, compared by value), or a marker when it has none."""
    out = []
    for field in attrs.fields(kind):
        default = field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        out.append((field.name, _NO_DEFAULT if default is attrs.NOTHING else default))
    return tuple(out)


def to_record(event: Event) -> dict[str, Any]:
    """The session-file form of an event: ``{"type": <event name>, <field>: <value>…}``; fields at
    their default are left out (a reader gets the default back)."""
    kind = type(event)
    rec: dict[str, Any] = {"type": kind.__name__}
    for name, default in _fields_and_defaults(kind):
        value = getattr(event, name)
        if default is _NO_DEFAULT or not value == default:
            rec[name] = [_block_skeleton(b) for b in value] if name in _BLOCK_FIELDS else _encode(value)
    return rec


class EventRecordError(ValueError):
    """An event record that does not describe an event."""


def _decode_field(name: str, kind: Any, value: Any) -> Any:
    if value is None:
        return None
    if name in ("assistant", "results"):
        return _message(value)
    if name in _BLOCK_FIELDS:
        return tuple(dict(b) for b in value)
    if name in ("sent_input", "notifications"):
        return tuple(_message(m) for m in value)
    if name == "response":
        return ModelResponse(tuple(value.get("blocks", ())), value.get("stop_reason"), {}, value.get("model", ""),
                             {i: "" for i in value.get("invalid_tool_inputs", ())},
                             int(value.get("incomplete_tool_uses", 0)))
    if name == "compaction":
        return Compaction(tuple(_message(m) for m in value.get("messages", ())), value.get("trigger", "auto"),
                          int(value.get("pre_tokens", 0)))
    if name == "error":
        return ModelError(**value)
    if kind in (TerminalReason, "TerminalReason"):
        return TerminalReason(value)
    if kind in ("tuple[str, ...]", tuple[str, ...]):
        # by declared type, not by name: a string-tuple field added later cannot come back a list (the
        # annotation is a string until something, such as cattrs, resolves the class's types)
        return tuple(value)
    if name == "context_layers":
        return {k: None for k in value}
    return value


def from_record(rec: Mapping[str, Any]) -> Event:
    """The event an event record describes (message contents are skeletons). Raises
    :class:`EventRecordError` for anything else."""
    kind = _EVENTS_BY_NAME.get(str(rec.get("type")))
    if kind is None:
        raise EventRecordError(f"unknown event type {rec.get('type')!r}")
    try:
        rec = _current(rec)
        fields = {f.name: _decode_field(f.name, f.type, rec[f.name]) for f in attrs.fields(kind) if f.name in rec}
        return kind(**fields)  # type: ignore[no-any-return]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise EventRecordError(f"{kind.__name__} record cannot be read: {exc}") from None


def _current(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record of an earlier release, whose failure events carried the pairing itself (``partial``,
    ``partial_results``), in today's form: the blocks shown, and the results as finished ones."""
    if "partial" not in rec and "partial_results" not in rec:
        return rec
    out = {k: v for k, v in rec.items() if k not in ("partial", "partial_results")}
    out["shown"] = list((rec.get("partial") or {}).get("content", ()))
    out["finished"] = [b for b in (rec.get("partial_results") or {}).get("content", ())
                       if b.get("type") == "tool_result"]
    return out
