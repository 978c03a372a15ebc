"""Records that survive between loop iterations: the loop state, its limits, terminal reasons.

Every record is frozen; the loop replaces the whole record with ``attrs.evolve`` at each transition so
a trace can keep every snapshot. Messages are held in wire form (``role`` + content blocks) because
that is what is sent, compared and resumed; the ``kind`` tag says where a message came from.
"""

from __future__ import annotations

import enum
import operator
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs

# Where new record ids come from. The machine itself makes ids (a meta message's uuid, a query chain's
# id); a host that replays the machine and needs the same ids again (a Temporal workflow) installs a
# deterministic source with :func:`set_id_source`.
_id_source: Callable[[], uuid.UUID] = uuid.uuid4


def set_id_source(source: Callable[[], uuid.UUID] | None) -> None:
    """Make every id the records mint come from ``source`` (None: :func:`uuid.uuid4` again)."""
    global _id_source
    _id_source = source or uuid.uuid4


def new_id() -> uuid.UUID:
    """A fresh id from the installed source."""
    return _id_source()


class Phase(enum.StrEnum):
    """The six states of the declared graph (docs/behaviour.md §2)."""

    ASSEMBLE = "assemble"
    CALL_MODEL = "call_model"
    STREAM = "stream"
    DISPATCH_TOOLS = "dispatch_tools"
    FEEDBACK = "feedback"
    STOP = "stop"


class TerminalReason(enum.StrEnum):
    COMPLETED = "completed"
    BACKGROUND_REQUESTED = "background_requested"
    MAX_TURNS = "max_turns"
    TOOL_DEFERRED = "tool_deferred"
    HOOK_STOPPED = "hook_stopped"
    STOP_HOOK_PREVENTED = "stop_hook_prevented"
    ABORTED_STREAMING = "aborted_streaming"
    ABORTED_TOOLS = "aborted_tools"
    BLOCKING_LIMIT = "blocking_limit"
    RAPID_REFILL_BREAKER = "rapid_refill_breaker"
    PROMPT_TOO_LONG = "prompt_too_long"
    IMAGE_ERROR = "image_error"
    MODEL_ERROR = "model_error"
    API_ERROR = "api_error"
    MALFORMED_TOOL_USE_EXHAUSTED = "malformed_tool_use_exhausted"
    BUDGET_EXHAUSTED = "budget_exhausted"
    STRUCTURED_OUTPUT_RETRY_EXHAUSTED = "structured_output_retry_exhausted"
    TOOL_DEFERRED_UNAVAILABLE = "tool_deferred_unavailable"
    TURN_SETUP_FAILED = "turn_setup_failed"


@attrs.frozen
class TerminalInfo:
    """How a terminal reason is classified (docs/behaviour.md §2) and reported (docs/behaviour.md §10)."""

    controlled: bool  # not counted as a runtime error
    subtype: str  # result subtype of the headless protocol
    is_error: bool


_T = TerminalReason
TERMINAL_INFO: Mapping[TerminalReason, TerminalInfo] = {
    _T.COMPLETED: TerminalInfo(True, "success", False),
    _T.BACKGROUND_REQUESTED: TerminalInfo(True, "success", False),
    _T.MAX_TURNS: TerminalInfo(True, "error_max_turns", True),
    _T.TOOL_DEFERRED: TerminalInfo(True, "success", False),
    _T.HOOK_STOPPED: TerminalInfo(True, "success", False),
    _T.STOP_HOOK_PREVENTED: TerminalInfo(True, "success", False),
    _T.ABORTED_STREAMING: TerminalInfo(False, "error_during_execution", True),
    _T.ABORTED_TOOLS: TerminalInfo(False, "error_during_execution", True),
    # Errors surfaced as an assistant API-error message: Claude Code 2.1.332 reports these as
    # subtype "success" with is_error true (docs/behaviour.md §10).
    _T.BLOCKING_LIMIT: TerminalInfo(False, "success", True),
    _T.RAPID_REFILL_BREAKER: TerminalInfo(False, "success", True),
    _T.PROMPT_TOO_LONG: TerminalInfo(False, "success", True),
    _T.IMAGE_ERROR: TerminalInfo(False, "success", True),
    _T.API_ERROR: TerminalInfo(False, "success", True),
    _T.MODEL_ERROR: TerminalInfo(False, "error_during_execution", True),
    _T.MALFORMED_TOOL_USE_EXHAUSTED: TerminalInfo(False, "error_during_execution", True),
    _T.BUDGET_EXHAUSTED: TerminalInfo(False, "error_max_budget_usd", True),
    _T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED: TerminalInfo(False, "error_max_structured_output_retries", True),
    _T.TOOL_DEFERRED_UNAVAILABLE: TerminalInfo(False, "error_during_execution", True),
    _T.TURN_SETUP_FAILED: TerminalInfo(False, "error_during_execution", True),
}
del _T


def _positive_or_none(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"limit {attribute.name} must be positive or unset, got {value!r}")


def _non_negative(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value < 0:
        raise ValueError(f"limit {attribute.name} must be >= 0, got {value!r}")


@attrs.frozen
class Limits:
    """Every cap of the loop, each a setting (``--limit NAME=VALUE``). Defaults follow Claude Code
    (docs/behaviour.md §2)."""

    max_turns: int | None = attrs.field(default=None, validator=_positive_or_none)
    max_output_tokens_recoveries: int = attrs.field(default=3, validator=_non_negative)
    # an earlier Claude Code (2.1.235) retried once; 2.1.332 retries twice
    malformed_tool_use_retries: int = attrs.field(default=1, validator=_non_negative)
    thinking_only_nudges: int = attrs.field(default=1, validator=_non_negative)
    # an answer with nothing in it is asked for again this many times (Claude Code 2.1.332: once)
    empty_response_nudges: int = attrs.field(default=1, validator=_non_negative)
    stop_hook_block_cap: int = attrs.field(default=8, validator=_non_negative)
    structured_output_retries: int = attrs.field(default=5, validator=_non_negative)
    max_tool_concurrency: int = attrs.field(default=10, validator=_positive_or_none)
    max_budget_usd: float | None = attrs.field(default=None, validator=_positive_or_none)
    max_output_tokens: int = attrs.field(default=32000, validator=_positive_or_none)
    # context governance, in estimated tokens
    context_window: int = attrs.field(default=200_000, validator=_positive_or_none)
    auto_compact_buffer: int = attrs.field(default=13_000, validator=_non_negative)
    blocking_buffer: int = attrs.field(default=3_000, validator=_non_negative)
    auto_compact: bool = True
    # compaction refilled to the threshold within this many turns counts as a rapid refill ...
    rapid_refill_turns: int = attrs.field(default=2, validator=_non_negative)
    # ... and this many consecutive rapid refills trip the breaker
    rapid_refill_max: int = attrs.field(default=3, validator=_positive_or_none)
    max_consecutive_compact_failures: int = attrs.field(default=3, validator=_positive_or_none)
    # transport retries of one request (429/5xx/529/connection), done by the SDK's retry machinery
    api_max_retries: int = attrs.field(default=10, validator=_non_negative)
    # a stream that breaks mid-way is requested again as a whole, this many times per turn
    stream_retries: int = attrs.field(default=2, validator=_non_negative)

    @property
    def auto_compact_threshold(self) -> int:
        return self.context_window - self.auto_compact_buffer

    @property
    def blocking_limit(self) -> int:
        return self.context_window - self.blocking_buffer

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in attrs.fields(cls)]

    def with_setting(self, name: str, raw: str) -> Limits:
        """Parse ``raw`` for limit ``name`` (``none`` unsets an optional cap); clear errors otherwise."""
        fields = {f.name: f for f in attrs.fields(type(self))}
        if name not in fields:
            raise ValueError(f"unknown limit {name!r}; known limits: {', '.join(fields)}")
        current = getattr(self, name)
        text = raw.strip().lower()
        value: Any
        if text in ("none", "null", "") and name in ("max_turns", "max_budget_usd"):
            value = None
        elif isinstance(current, bool):
            if text not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(f"limit {name} takes true or false, got {raw!r}")
            value = text in ("true", "1", "yes", "on")
        elif name == "max_budget_usd":
            value = _parse_number(name, raw, float)
        else:
            value = _parse_number(name, raw, int)
        return attrs.evolve(self, **{name: value})


def _parse_number(name: str, raw: str, kind: type) -> Any:
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"limit {name} takes {what}, got {raw!r}") from None


def _block_tuple(value: Any) -> tuple[Mapping[str, Any], ...]:
    if isinstance(value, str):
        return ({"type": "text", "text": value},)
    return tuple(value)


@attrs.frozen
class Message:
    """One conversation message in wire form.

    ``kind`` records its origin (``prompt``, ``assistant``, ``tool_results``, ``meta`` for hidden
    loop-generated user messages, ``compact_summary``, ``attachment``, ``synthetic``).
    """

    role: str = attrs.field(validator=attrs.validators.in_(("user", "assistant")))
    content: tuple[Mapping[str, Any], ...] = attrs.field(converter=_block_tuple)
    kind: str = "prompt"
    uuid: str = attrs.field(factory=lambda: str(new_id()))

    def tool_use_ids(self) -> list[str]:
        return [b["id"] for b in self.content if b.get("type") == "tool_use"]

    def tool_result_ids(self) -> list[str]:
        return [b["tool_use_id"] for b in self.content if b.get("type") == "tool_result"]

    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")


@attrs.frozen
class CompactTracking:
    """What the loop remembers about compaction (seed: compactTracking)."""

    last_compact_turn_id: str | None = None
    turns_since_compact: int = 0
    consecutive_failures: int = 0
    rapid_refill_count: int = 0
    compactions: int = 0


@attrs.frozen
class QueryTracking:
    """Correlates every model call and tool event of one user turn (seed: queryTracking)."""

    chain_id: str = attrs.field(factory=lambda: new_id().hex[:16])
    depth: int = -1


@attrs.frozen
class ToolUseContext:
    """The serialisable part of the tool context. Context layers from concurrency-unsafe tools are
    merged into ``layers``; live objects (abort signals, tool instances) stay with the driver."""

    cwd: str = "."
    permission_mode: str = "default"
    tool_names: tuple[str, ...] = ()
    layers: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class LoopState:
    """What survives between iterations (docs/behaviour.md §2, pythonised)."""

    messages: tuple[Message, ...] = ()
    phase: Phase = Phase.ASSEMBLE
    tool_use_context: ToolUseContext = attrs.field(factory=ToolUseContext)
    compact_tracking: CompactTracking = attrs.field(factory=CompactTracking)
    query_tracking: QueryTracking = attrs.field(factory=QueryTracking)
    turn_count: int = 1
    max_output_tokens_recovery_count: int = 0
    malformed_tool_use_retry_count: int = 0
    structured_output_retry_count: int = 0
    stream_retry_count: int = 0
    # index into (model, *fallback_models): which model the next request goes to
    model_index: int = 0
    has_attempted_reactive_compact: bool = False
    thinking_only_nudged: bool = False
    empty_response_nudged: bool = False
    # the stream broke or was garbled before any content: the next request is made without streaming
    non_streaming: bool = False
    stop_hook_active: bool = False
    stop_hook_blocking_count: int = 0
    # set by end_turn: the loop is at stop and its Stop hooks have not run yet
    stop_hooks_due: bool = False
    transition: str | None = None
    terminal_reason: TerminalReason | None = None
    # why the loop ended, in words (error text, hook stop reason); reported in the result
    terminal_detail: str | None = None

    def counters(self) -> dict[str, Any]:
        """The counters a trace records with every move (and the auditor checks against caps)."""
        return {
            "turn_count": self.turn_count,
            "max_output_tokens_recovery_count": self.max_output_tokens_recovery_count,
            "malformed_tool_use_retry_count": self.malformed_tool_use_retry_count,
            "structured_output_retry_count": self.structured_output_retry_count,
            "stream_retry_count": self.stream_retry_count,
            "model_index": self.model_index,
            "has_attempted_reactive_compact": self.has_attempted_reactive_compact,
            "thinking_only_nudged": self.thinking_only_nudged,
            "empty_response_nudged": self.empty_response_nudged,
            "non_streaming": self.non_streaming,
            "stop_hook_active": self.stop_hook_active,
            "stop_hook_blocking_count": self.stop_hook_blocking_count,
            "consecutive_compact_failures": self.compact_tracking.consecutive_failures,
            "rapid_refill_count": self.compact_tracking.rapid_refill_count,
        }

    def snapshot(self) -> dict[str, Any]:
        """Every field the machine decides, as JSON (messages and the tool context aside): what a
        trace records after each move and the auditor compares with its own replay."""
        return {k: snapshot_json(v) for k, v in zip(SNAPSHOT_KEYS, self.snapshot_values(), strict=True)}

    def snapshot_values(self) -> tuple[Any, ...]:
        """The snapshot's values in :data:`SNAPSHOT_KEYS` order, as the state holds them (phase and
        terminal reason as enum members; :func:`snapshot_json` makes them JSON): fetched in one
        call, so a writer comparing two states' snapshots builds no dict for either."""
        return _snapshot_values(self)


# The snapshot: its keys in order, and where each value is in the state (the counters() keys in
# their order, between phase and stop_hooks_due).
_SNAPSHOT_PATHS: tuple[tuple[str, str], ...] = (
    ("phase", "phase"),
    ("turn_count", "turn_count"),
    ("max_output_tokens_recovery_count", "max_output_tokens_recovery_count"),
    ("malformed_tool_use_retry_count", "malformed_tool_use_retry_count"),
    ("structured_output_retry_count", "structured_output_retry_count"),
    ("stream_retry_count", "stream_retry_count"),
    ("model_index", "model_index"),
    ("has_attempted_reactive_compact", "has_attempted_reactive_compact"),
    ("thinking_only_nudged", "thinking_only_nudged"),
    ("empty_response_nudged", "empty_response_nudged"),
    ("non_streaming", "non_streaming"),
    ("stop_hook_active", "stop_hook_active"),
    ("stop_hook_blocking_count", "stop_hook_blocking_count"),
    ("consecutive_compact_failures", "compact_tracking.consecutive_failures"),
    ("rapid_refill_count", "compact_tracking.rapid_refill_count"),
    ("stop_hooks_due", "stop_hooks_due"),
    ("transition", "transition"),
    ("terminal_reason", "terminal_reason"),
    ("turns_since_compact", "compact_tracking.turns_since_compact"),
    ("compactions", "compact_tracking.compactions"),
    ("depth", "query_tracking.depth"),
)
SNAPSHOT_KEYS: tuple[str, ...] = tuple(k for k, _ in _SNAPSHOT_PATHS)
_snapshot_values = operator.attrgetter(*(path for _, path in _SNAPSHOT_PATHS))


def snapshot_json(value: Any) -> Any:
    """A snapshot value as the snapshot records it (an enum member as its value)."""
    return value.value if isinstance(value, enum.Enum) else value


# Counter name -> the Limits field that caps it; shared by the graph's guards, the auditor and the
# property tests so the three can never disagree about what "over the cap" means.
COUNTER_CAPS: Mapping[str, str] = {
    "max_output_tokens_recovery_count": "max_output_tokens_recoveries",
    "malformed_tool_use_retry_count": "malformed_tool_use_retries",
    "structured_output_retry_count": "structured_output_retries",
    "stream_retry_count": "stream_retries",
    "stop_hook_blocking_count": "stop_hook_block_cap",
    "rapid_refill_count": "rapid_refill_max",
    "consecutive_compact_failures": "max_consecutive_compact_failures",
}


def appended(old: tuple[Message, ...], new: tuple[Message, ...]) -> bool:
    """``new`` is ``old`` with messages added at the end (not a rewritten history)."""
    return len(new) >= len(old) and new[:len(old)] == old
