"""Records that survive between loop iterations: the loop state, its limits, terminal reasons.

Every record is frozen; the loop replaces the whole record with ``attrs.evolve`` at each transition so
a trace can keep every snapshot. Messages are held in wire form (``role`` + content blocks) because
that is what is sent, compared and resumed; the ``kind`` tag says where a message came from.
"""

from __future__ import annotations

import enum
import functools
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
    _T.MALFORMED_TOOL_USE_EXHAUSTED: TerminalInfo(False, "success", True),
    _T.MODEL_ERROR: TerminalInfo(False, "error_during_execution", True),
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


_CAP = "agentfsm.cap"


def _cap(default: int, validator: Callable[[Any, attrs.Attribute, Any], None]) -> Any:
    """A :class:`Limits` field that is the cap of one counter: the counter names it (``counter(...,
    cap=NAME)``) and this marks it as such, so :func:`cap_problems` finds a cap that no counter uses
    (a setting that would silently do nothing) as surely as a counter whose cap is not a limit. The
    value, its validator and its documentation stay here; which counter it caps is read from the
    counter (:meth:`Limits.capped_counter`), never declared twice."""
    return attrs.field(default=default, validator=validator, metadata={_CAP: True})


@attrs.frozen
class Limits:
    """Every cap of the loop, each a setting (``--limit NAME=VALUE``). Defaults follow Claude Code
    (docs/behaviour.md §2)."""

    max_turns: int | None = attrs.field(default=None, validator=_positive_or_none)
    max_output_tokens_recoveries: int = _cap(3, _non_negative)
    # an earlier Claude Code (2.1.235) retried once; 2.1.332 retries twice
    malformed_tool_use_retries: int = _cap(2, _non_negative)
    thinking_only_nudges: int = attrs.field(default=1, validator=_non_negative)
    # an answer with nothing in it is asked for again this many times (Claude Code 2.1.332: once)
    empty_response_nudges: int = attrs.field(default=1, validator=_non_negative)
    stop_hook_block_cap: int = _cap(8, _non_negative)
    structured_output_retries: int = _cap(5, _non_negative)
    # a response refused by a safety classifier is asked for again this many times per run (Claude Code 2.1.332: once)
    refusal_retries: int = _cap(1, _non_negative)
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
    rapid_refill_max: int = _cap(3, _positive_or_none)
    max_consecutive_compact_failures: int = _cap(3, _positive_or_none)
    # transport retries of one request (429/5xx/529/connection), done by the SDK's retry machinery
    api_max_retries: int = attrs.field(default=10, validator=_non_negative)
    # a stream that breaks mid-way is requested again as a whole, this many times per turn
    stream_retries: int = _cap(2, _non_negative)

    @property
    def auto_compact_threshold(self) -> int:
        return self.context_window - self.auto_compact_buffer

    @property
    def blocking_limit(self) -> int:
        return self.context_window - self.blocking_buffer

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in attrs.fields(cls)]

    @classmethod
    def cap_names(cls) -> list[str]:
        """The fields declared with :func:`_cap`: each caps exactly one counter (:func:`cap_problems`)."""
        return [f.name for f in attrs.fields(cls) if f.metadata.get(_CAP)]

    @classmethod
    def capped_counter(cls, name: str) -> str | None:
        """The key of the counter limit ``name`` caps (None for a limit that caps no counter)."""
        return next((c.key for c in COUNTERS if c.cap == name), None)

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


# --- counters: declared once, on their field --------------------------------------------------------

# The edges on which a response ended (every route of a stream that ended): each closes the request's
# stream retries, and the next request streams again.
RESPONSE_ENDED = ("dispatch", "end_turn", "max_output_tokens_recovery", "recovery_exhausted",
                  "malformed_tool_use_retry", "thinking_only_nudge", "empty_response_nudge",
                  "structured_output_retry", "refusal_retry")
# The edges that start a new model turn: after a tool batch, and when a background task's notification
# starts the next pass after the run had ended. Per-turn counters are reset by both.
NEW_TURN = ("next_turn", "task_notification")
_COUNTER = "agentfsm.counter"


@attrs.frozen
class Counter:
    """What one counter (or flag) of the loop is, declared on its field's metadata: ``key``, its name
    in :meth:`LoopState.counters`, snapshots, traces and the auditor (the field's name unless set);
    ``cap``, the :class:`Limits` field it never exceeds; ``raised_by``, the edges that raise it (by
    one — the auditor flags a rise on any other); ``reset_by``, the edges that put it back to its
    initial value (the graph's effects of those edges take the resets from here). The field is
    ``path`` in the state record (``compact_tracking.consecutive_failures``)."""

    key: str
    path: str = ""
    default: Any = None
    cap: str | None = None
    raised_by: frozenset[str] = frozenset()
    reset_by: frozenset[str] = frozenset()


def counter(default: Any, *, key: str = "", cap: str | None = None, raised_by: tuple[str, ...] = (),
            reset_by: tuple[str, ...] = ()) -> Any:
    """An attrs field that is a counter of the loop (see :class:`Counter`)."""
    meta = Counter(key, "", default, cap, frozenset(raised_by), frozenset(reset_by))
    return attrs.field(default=default, metadata={_COUNTER: meta})


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
    """What the loop remembers about compaction: when it last compacted, how often in a row it failed or
    refilled at once (the guards of auto-compaction and of the rapid-refill breaker read these)."""

    last_compact_turn_id: str | None = None
    turns_since_compact: int = 0
    consecutive_failures: int = counter(0, key="consecutive_compact_failures",
                                        cap="max_consecutive_compact_failures", raised_by=("call",))
    # rapid refills in a row; the breaker (setup_failed) counts the one that trips it
    rapid_refill_count: int = counter(0, cap="rapid_refill_max", raised_by=("call", "setup_failed"))
    compactions: int = 0


@attrs.frozen
class QueryTracking:
    """Correlates every model call and tool event of one user turn: the chain id, and how many requests
    deep the turn is."""

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
    # a pass started by task notifications counts its own turns (graph.notified)
    turn_count: int = counter(1, raised_by=("next_turn", "stop_hook_blocking"), reset_by=("task_notification",))
    max_output_tokens_recovery_count: int = counter(0, cap="max_output_tokens_recoveries",
                                                    raised_by=("max_output_tokens_recovery",), reset_by=NEW_TURN)
    malformed_tool_use_retry_count: int = counter(0, cap="malformed_tool_use_retries",
                                                  raised_by=("malformed_tool_use_retry",), reset_by=NEW_TURN)
    # a StructuredOutput call whose input failed the schema raises it on next_turn too (else it resets)
    structured_output_retry_count: int = counter(0, cap="structured_output_retries",
                                                 raised_by=("structured_output_retry", "next_turn"),
                                                 reset_by=NEW_TURN)
    stream_retry_count: int = counter(0, cap="stream_retries", raised_by=("stream_retry",),
                                      reset_by=(*RESPONSE_ENDED, "fallback_retry"))
    # index into (model, *fallback_models): which model the next request goes to
    model_index: int = counter(0, raised_by=("fallback_retry",))
    has_attempted_reactive_compact: bool = counter(False, reset_by=NEW_TURN)
    thinking_only_nudged: bool = counter(False, reset_by=NEW_TURN)
    empty_response_nudged: bool = counter(False, reset_by=NEW_TURN)
    # the stream broke or was garbled before any content: the next request is made without streaming
    non_streaming: bool = counter(False, reset_by=(*RESPONSE_ENDED, "fallback_retry"))
    # set by the first Stop-hook block and kept for the rest of the run, tool turns included (Claude Code
    # 2.1.332 does; a hook that blocks "unless stop_hook_active" blocks once per run, not once per turn:
    # tests/fidelity/scenarios/stop_hook_active_after_tool_turn.json)
    # (a task notification's pass is a new run of the loop in Claude Code: the flag starts over)
    stop_hook_active: bool = counter(False, reset_by=("task_notification",))
    stop_hook_blocking_count: int = counter(0, cap="stop_hook_block_cap", raised_by=("stop_hook_blocking",),
                                            reset_by=NEW_TURN)
    # a refused response (stop_reason refusal) is asked for once more per run: Claude Code 2.1.332 ends the run
    # on a second refusal, a tool turn in between or not (tests/fidelity/conform/); like stop_hook_active, it
    # starts over with a task notification's pass
    refusal_retry_count: int = counter(0, cap="refusal_retries", raised_by=("refusal_retry",),
                                       reset_by=("task_notification",))
    # set by end_turn: the loop is at stop and its Stop hooks have not run yet
    stop_hooks_due: bool = False
    transition: str | None = None
    terminal_reason: TerminalReason | None = None
    # why the loop ended, in words (error text, hook stop reason); reported in the result
    terminal_detail: str | None = None

    def counters(self) -> dict[str, Any]:
        """The counters a trace records with every move (and the auditor checks against caps): every
        field declared with :func:`counter`, by its key, in declaration order (:data:`COUNTERS`)."""
        return dict(zip(COUNTER_KEYS, _counter_values(self), strict=True))

    def snapshot(self) -> dict[str, Any]:
        """Every field the machine decides, as JSON (messages and the tool context aside): what a
        trace records after each move and the auditor compares with its own replay."""
        return {k: snapshot_json(v) for k, v in zip(SNAPSHOT_KEYS, self.snapshot_values(), strict=True)}

    def snapshot_values(self) -> tuple[Any, ...]:
        """The snapshot's values in :data:`SNAPSHOT_KEYS` order, as the state holds them (phase and
        terminal reason as enum members; :func:`snapshot_json` makes them JSON): fetched in one
        call, so a writer comparing two states' snapshots builds no dict for either."""
        return _snapshot_values(self)


def _declared_counters() -> tuple[Counter, ...]:
    """Every field declared with :func:`counter`: the state's own, then compaction tracking's."""
    out = []
    for owner, prefix in ((LoopState, ""), (CompactTracking, "compact_tracking.")):
        for f in attrs.fields(owner):
            meta = f.metadata.get(_COUNTER)
            if meta is not None:
                out.append(attrs.evolve(meta, key=meta.key or f.name, path=prefix + f.name))
    return tuple(out)


COUNTERS: tuple[Counter, ...] = _declared_counters()
COUNTERS_BY_KEY: Mapping[str, Counter] = {c.key: c for c in COUNTERS}
COUNTER_KEYS: tuple[str, ...] = tuple(c.key for c in COUNTERS)
_counter_values = operator.attrgetter(*(c.path for c in COUNTERS))

# The snapshot: its keys in order, and where each value is in the state (the counters between phase
# and stop_hooks_due, in their order).
_SNAPSHOT_PATHS: tuple[tuple[str, str], ...] = (
    ("phase", "phase"),
    *((c.key, c.path) for c in COUNTERS),
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


# Counter name -> the Limits field that caps it (from the counters' declarations); shared by the
# graph's guards, the auditor and the testing kit so they can never disagree about "over the cap".
COUNTER_CAPS: Mapping[str, str] = {c.key: c.cap for c in COUNTERS if c.cap is not None}
# Counter name -> the edges that raise it (numbers only: a flag is set, not raised).
RAISED_BY: Mapping[str, frozenset[str]] = {c.key: c.raised_by for c in COUNTERS if c.raised_by}


def cap_problems(counters: tuple[Counter, ...] = COUNTERS, limits: type = Limits) -> list[str]:
    """What is wrong between the counters' caps and the limits, in words (empty when nothing is):
    every counter's ``cap`` is a :class:`Limits` field declared with :func:`_cap`, no two counters
    share one, and every such field caps a counter. Checked at import; ``counters`` and ``limits``
    are parameters so a test can hand it a mismatch."""
    fields = {f.name: f for f in attrs.fields(limits)}
    caps = {name for name, f in fields.items() if f.metadata.get(_CAP)}
    problems = []
    users: dict[str, list[str]] = {}
    for c in counters:
        if c.cap is None:
            continue
        users.setdefault(c.cap, []).append(c.key)
        if c.cap not in fields:
            problems.append(f"counter {c.key} is capped by {c.cap!r}, which is not a field of {limits.__name__}; "
                            f"add `{c.cap}: int = _cap(DEFAULT, _non_negative)` to {limits.__name__}")
        elif c.cap not in caps:
            problems.append(f"counter {c.key} is capped by {limits.__name__}.{c.cap}, which is not declared as a "
                            f"cap; declare it with `_cap(...)`")
    for cap, keys in users.items():
        if len(keys) > 1:
            problems.append(f"{limits.__name__}.{cap} caps several counters ({', '.join(keys)}); one cap per counter")
    for name in sorted(caps - users.keys()):
        problems.append(f"{limits.__name__}.{name} is declared with `_cap(...)` but no counter names it: give the "
                        f"counter `cap={name!r}`, or declare the field with `attrs.field` if it caps no counter")
    return problems


_problems = cap_problems()
if _problems:  # pragma: no cover - tests/test_counter_caps.py shows each of these failing on a mismatch
    raise ImportError("agentfsm.machine.state: the counters and their caps disagree:\n  " + "\n  ".join(_problems))


def resets(trigger: str, state: LoopState) -> dict[str, Any]:
    """The changes edge ``trigger`` makes by resetting counters (:attr:`Counter.reset_by`), for the
    graph's effects: state fields by name (compaction tracking's as a new ``compact_tracking``)."""
    own, nested = _resets_of(trigger)
    if not nested:
        return dict(own)
    return {**own, "compact_tracking": attrs.evolve(state.compact_tracking, **nested)}


@functools.cache
def _resets_of(trigger: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Per edge, once: the state's own fields it resets, and compaction tracking's."""
    own = {c.path: c.default for c in COUNTERS if trigger in c.reset_by and "." not in c.path}
    nested = {c.path.split(".", 1)[1]: c.default for c in COUNTERS if trigger in c.reset_by and "." in c.path}
    return own, nested


def appended(old: tuple[Message, ...], new: tuple[Message, ...]) -> bool:
    """``new`` is ``old`` with messages added at the end (not a rewritten history)."""
    return len(new) >= len(old) and new[:len(old)] == old
