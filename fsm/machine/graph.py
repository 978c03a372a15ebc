"""The agent loop's whole behaviour, as data: edges, routes, refusals, and the machine built from them.

Like h11's ``_state.py``, this module is the only place that decides where the loop goes:

* :data:`EDGES` — the shape: every declared move (trigger, sources → destination, kind, the terminal
  reasons a move into ``stop`` may carry);
* :data:`ROUTES` — the behaviour, in statechart form ``source, event [guard] / effect → edge``: for
  each phase and each kind of observed event, the guarded routes in the order they are tried; the
  first whose guard holds fires, and its effect computes the next frozen :class:`LoopState`;
* :data:`REFUSALS` — every (phase, event) pair no route handles, with the reason it cannot happen;
* :data:`MACHINE` — one module-level ``transitions.Machine`` built from the routes. It is what
  picks a route: conditions are the guards in declared order. Each running loop is a model of it
  (:class:`LoopMachine`), so the phase exists once, in the loop's state record.

Guards and effects are pure functions of (state, event, limits); the driver only performs what a
step implies. The auditor (:mod:`agentfsm.auditing.audit`) replays recorded events through :func:`advance` and
the diagrams (:mod:`agentfsm.diagram`) draw :data:`EDGES` and :data:`ROUTES`. The table is validated
at import (:func:`validate`): a route whose edge is not declared from its phase, an edge no route
takes, a (phase, event) pair neither routed nor refused, or a phase from which ``stop`` cannot be
reached fails loudly.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from transitions import Machine
from transitions import core as tcore

from agentfsm.machine import prompts
from agentfsm.machine.events import (
    EVENT_TYPES,
    Aborted,
    Assembled,
    CallFailed,
    Compaction,
    Event,
    Refused,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    TaskNotified,
    ToolsDrained,
)
from agentfsm.machine.state import (
    COUNTER_CAPS,
    COUNTERS,
    CompactTracking,
    Limits,
    LoopState,
    Message,
    Phase,
    QueryTracking,
    TerminalReason,
    appended,
    resets,
)

A, C, S, D, F, X = (
    Phase.ASSEMBLE,
    Phase.CALL_MODEL,
    Phase.STREAM,
    Phase.DISPATCH_TOOLS,
    Phase.FEEDBACK,
    Phase.STOP,
)
STATES: tuple[Phase, ...] = (A, C, S, D, F, X)
# the phases that perform work an abort can interrupt (feedback decides at once: nothing arrives there)
RUNNING: tuple[Phase, ...] = (A, C, S, D)
T = TerminalReason
# The kind of the tool_result message of a call a PreToolUse hook deferred: a resumed run finds it
# there (it survives in the session file) and runs the call again before the next request.
DEFERRED_RESULTS = "deferred_tool_results"


# --- edges: the shape, and what each move does to the world -----------------------------------


class Shown(enum.StrEnum):
    """What becomes of what the response in progress already showed the client (its complete
    blocks, and the results of its tool calls that were shown as they finished)."""

    KEEP = "keep"  # it stays as shown (the response ended: it is history, or deliberately left out of it)
    PAIR = "pair"  # it stays, and every tool_use it showed is answered (its result, or a synthetic one)
    WITHDRAW = "withdraw"  # it is withdrawn (a tombstone): the response is asked for again or replaced


@attrs.frozen
class Does:
    """What performing a move means outside the state record, as data: each runtime (the in-process
    driver, the Temporal workflow) performs exactly this after the move, and nothing keyed on an
    edge's name or kind.

    * ``shown`` — what becomes of what the response in progress showed (:class:`Shown`);
    * ``close_calls`` — the reason the response's unfinished tool calls are closed with (their
      synthetic results say it; a paired call's result is that one); None: they run on (dispatch),
      or no response is in play;
    * ``take_input`` — queued user input the request carried leaves the queue;
    * ``compacts`` — the move may replace the history with a compaction the event carries: the
      client is told (``compact_boundary``), the trace writes a boundary and the new view, and the
      next estimate forgets the last usage. No other move may replace the history (checked per move);
    * ``stop_feedback`` — the Stop hook's block reason is shown as a synthetic user message;
    * ``keeps_finished`` — the results of the response's calls that finished while it streamed (the
      event's ``finished``) stay in the history as a batch's would: the run accounts them (their
      permission denials). Performed before ``close_calls`` gives up the rest.
    """

    shown: Shown = Shown.KEEP
    close_calls: str | None = None
    take_input: bool = False
    compacts: bool = False
    stop_feedback: bool = False
    keeps_finished: bool = False

    @property
    def label(self) -> str:
        """The consequences in words, for the diagrams (empty for a move that only changes state)."""
        parts = [] if self.shown is Shown.KEEP else [f"{self.shown.value} shown"]
        if self.keeps_finished:
            parts.append("keep finished calls")
        if self.close_calls is not None:
            parts.append(f"close calls ({self.close_calls})")
        parts += [name for name, on in (("take input", self.take_input), ("compact", self.compacts),
                                         ("stop feedback", self.stop_feedback)) if on]
        return ", ".join(parts)


@attrs.frozen
class Edge:
    """One declared move. ``kind``: ``forward`` (the normal path), ``reentry`` (a labelled transition
    reason that starts the loop again), ``retry`` (same turn, same request again), ``terminal`` (into
    ``stop``; ``reasons`` are the terminal reasons it may carry). ``does``: its consequences outside
    the state record (:class:`Does`)."""

    trigger: str
    sources: tuple[Phase, ...]
    dest: Phase
    kind: str
    doc: str
    reasons: frozenset[TerminalReason] = frozenset()
    does: Does = Does()

    @property
    def label(self) -> str:
        return self.trigger


def _edge(trigger: str, sources: tuple[Phase, ...] | Phase, dest: Phase, kind: str, doc: str,
          *reasons: TerminalReason, does: Does = Does()) -> Edge:
    srcs = sources if isinstance(sources, tuple) else (sources,)
    return Edge(trigger, srcs, dest, kind, doc, frozenset(reasons), does)


# The consequences edges share. A response that ended without dispatching discards whatever its
# executor started (the calls were shown as they streamed; their results never reach history).
_ENDED = Does(close_calls="discarded")
# the calls of a response that ended over budget never run
BUDGET_CLOSED = "budget_exhausted"
# Asked for again (or replaced by a compaction): nothing of the broken response is kept.
_AGAIN = Does(Shown.WITHDRAW, close_calls=prompts.STREAMING_FALLBACK)


EDGES: tuple[Edge, ...] = (
    # forward path
    _edge("call", A, C, "forward", "context assembled (auto-compact done); send the request",
          does=Does(compacts=True)),
    _edge("open_stream", C, S, "forward", "the request was accepted and the response is streaming",
          does=Does(take_input=True)),
    _edge("dispatch", S, D, "forward", "the response ended with complete tool_use blocks (or an overloaded/api "
          "error event cut it after one: its calls run, as Claude Code 2.1.332)"),
    _edge("collect", D, F, "forward", "every tool of the batch has exactly one result"),
    # labelled re-entries (the transition reasons recorded in LoopState.transition)
    _edge("next_turn", F, A, "reentry", "tool results appended; next model turn"),
    _edge("reactive_compact_retry", (C, S), A, "reentry",
          "prompt too long, answered by one successful compaction",
          does=attrs.evolve(_AGAIN, compacts=True)),
    _edge("max_output_tokens_recovery", S, A, "reentry",
          "response hit max_tokens; keep it and ask to resume (count < cap)", does=_ENDED),
    _edge("malformed_tool_use_retry", S, A, "reentry",
          "stop_reason tool_use without a complete tool_use block; drop it and ask again (count < cap)",
          does=_ENDED),
    _edge("thinking_only_nudge", S, A, "reentry", "only thinking, no visible answer; ask once for one",
          does=_ENDED),
    _edge("empty_response_nudge", S, A, "reentry", "an answer with nothing in it; ask once for a visible one",
          does=_ENDED),
    _edge("structured_output_retry", S, A, "reentry",
          "ended without the required StructuredOutput call; ask for it (count < cap)", does=_ENDED),
    _edge("refusal_retry", S, A, "reentry",
          "a safety classifier stopped the response (stop_reason refusal): keep what it showed, answer its calls "
          "(none runs on), ask once more (count < cap)",
          does=Does(Shown.PAIR, close_calls=prompts.REFUSAL_INTERRUPTED)),
    _edge("stop_hook_blocking", X, A, "reentry",
          "a Stop hook blocked the end or added context for the model (count < cap)",
          does=Does(stop_feedback=True)),
    _edge("task_notification", X, A, "reentry",
          "the run had ended; a background task it started reported, and its notification starts the next pass",
          does=Does(take_input=True)),
    # same request again
    _edge("stream_retry", (C, S), C, "retry",
          "the stream broke (or dropped before its first event); discard it and request again", does=_AGAIN),
    _edge("non_streaming_retry", (C, S), C, "retry",
          "the stream broke or was garbled before any content; ask for the same response without streaming",
          does=_AGAIN),
    _edge("fallback_retry", (C, S), C, "retry", "retries exhausted on this model; use the fallback", does=_AGAIN),
    # into stop
    _edge("setup_failed", A, X, "terminal",
          "the turn could not be prepared (a resumed deferred call may be deferred again)",
          T.TURN_SETUP_FAILED, T.RAPID_REFILL_BREAKER, T.TOOL_DEFERRED_UNAVAILABLE, T.TOOL_DEFERRED),
    _edge("prompt_blocked", A, X, "terminal", "a UserPromptSubmit hook blocked the prompt", T.HOOK_STOPPED),
    _edge("over_budget", S, X, "terminal",
          "the response ended with the run's spend at --max-budget-usd; its calls that finished while it streamed "
          "keep their results, the others never run", T.BUDGET_EXHAUSTED,
          does=Does(close_calls=BUDGET_CLOSED, keeps_finished=True)),
    _edge("refuse", C, X, "terminal", "preflight refused the request",
          T.BLOCKING_LIMIT, T.BUDGET_EXHAUSTED, T.BACKGROUND_REQUESTED),
    _edge("call_failed", (C, S), X, "terminal", "the model call failed and cannot be recovered",
          T.API_ERROR, T.MODEL_ERROR, T.PROMPT_TOO_LONG, T.IMAGE_ERROR,
          does=Does(Shown.PAIR, close_calls=prompts.STREAM_FAILED)),
    _edge("end_turn", S, X, "terminal", "no tool call: the answer is final (Stop hooks are due)", T.COMPLETED,
          does=_ENDED),
    _edge("recovery_exhausted", S, X, "terminal",
          "a recovery branch reached its cap (a refusal: asked again and refused again)",
          T.API_ERROR, T.MALFORMED_TOOL_USE_EXHAUSTED, T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED, does=_ENDED),
    _edge("settle", X, X, "terminal", "Stop hooks ran and did not re-enter: passed, prevented, max_turns, "
          "or the block cap overridden", T.COMPLETED, T.STOP_HOOK_PREVENTED, T.MAX_TURNS),
    _edge("finish_batch", F, X, "terminal", "the tool batch ends the run",
          T.MAX_TURNS, T.ABORTED_TOOLS, T.TOOL_DEFERRED, T.HOOK_STOPPED, T.COMPLETED,
          T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED),
    _edge("abort", RUNNING, X, "terminal", "cancelled; every tool_use shown gets a result",
          T.ABORTED_STREAMING, T.ABORTED_TOOLS,
          does=Does(Shown.PAIR, close_calls=prompts.USER_INTERRUPTED, keeps_finished=True)),
)

EDGES_BY_TRIGGER: Mapping[str, Edge] = {e.trigger: e for e in EDGES}
REENTRY_LABELS: frozenset[str] = frozenset(e.trigger for e in EDGES if e.kind == "reentry")
# (source, dest) -> triggers, for the auditor
DECLARED_MOVES: Mapping[tuple[Phase, Phase], frozenset[str]] = {
    (s, e.dest): frozenset(x.trigger for x in EDGES if s in x.sources and x.dest == e.dest)
    for e in EDGES
    for s in e.sources
}


class UndeclaredMove(RuntimeError):
    """A move the graph does not declare was attempted."""


# --- guards ------------------------------------------------------------------------------------


GuardFn = Callable[[LoopState, Any, Limits], bool]


@attrs.frozen
class Guard:
    """A named pure predicate of (state, event, limits). Names are what the trace, the diagrams and
    error messages show; ``&`` and ``~`` combine guards into new named ones."""

    name: str
    fn: GuardFn = attrs.field(eq=False, repr=False)

    def __call__(self, state: LoopState, event: Any, limits: Limits) -> bool:
        return self.fn(state, event, limits)

    def __and__(self, other: Guard) -> Guard:
        a, b = self.fn, other.fn
        return Guard(f"{self.name} and {other.name}", lambda s, e, lim: a(s, e, lim) and b(s, e, lim))

    def __invert__(self) -> Guard:
        f = self.fn
        return Guard(f"not {self.name}", lambda s, e, lim: not f(s, e, lim))


def counter_value(state: LoopState, name: str) -> int:
    """A counter by its key (:data:`agentfsm.machine.state.COUNTERS`: some live in compact_tracking)."""
    return int(_counter_getters[name](state))


_counter_getters: Mapping[str, Callable[[LoopState], Any]] = {
    c.key: operator.attrgetter(c.path) for c in COUNTERS}


def under_cap(counter: str) -> Guard:
    """The counter may still be incremented: its value is below the Limits field that caps it."""
    cap = COUNTER_CAPS[counter]
    return Guard(f"under_cap({counter})",
                 lambda s, _e, lim: counter_value(s, counter) < getattr(lim, cap))


def stop_reason_is(*reasons: str) -> Guard:
    wanted = frozenset(reasons)
    return Guard(f"stop_reason_is({'|'.join(reasons)})",
                 lambda _s, e, _lim: e.response.stop_reason in wanted)


def _named(name: str) -> Callable[[GuardFn], Guard]:
    def wrap(fn: GuardFn) -> Guard:
        return Guard(name, fn)
    return wrap


@_named("turn_cap_reached")
def turn_cap_reached(s: LoopState, _e: Any, lim: Limits) -> bool:
    """Another turn would exceed max_turns."""
    return lim.max_turns is not None and s.turn_count + 1 > lim.max_turns


@_named("tools_running")
def tools_running(s: LoopState, _e: Any, _lim: Limits) -> bool:
    return s.phase is D


@_named("hook_stopped_prompt")
def hook_stopped_prompt(_s: LoopState, e: SetupFailed, _lim: Limits) -> bool:
    return e.reason is T.HOOK_STOPPED


def rapid_refill(state: LoopState, limits: Limits) -> bool:
    """A compaction now refills what the previous one emptied within ``rapid_refill_turns`` turns."""
    t = state.compact_tracking
    return t.compactions > 0 and t.turns_since_compact < limits.rapid_refill_turns


@_named("rapid_refill_tripped")
def rapid_refill_tripped(s: LoopState, e: Assembled, lim: Limits) -> bool:
    return (e.compaction is not None and rapid_refill(s, lim)
            and s.compact_tracking.rapid_refill_count + 1 >= lim.rapid_refill_max)


def may_reactive_compact(state: LoopState) -> bool:
    """A prompt-too-long error may be answered by compaction: once per turn, and only when the
    conversation holds a response to summarise. Claude Code 2.1.332 compacts once there is one
    (a tool turn, then prompt too long: docs/conform.md); the first request alone cannot be compacted."""
    return not state.has_attempted_reactive_compact and _exchanges(state.messages) > 0


def _exchanges(messages: tuple[Message, ...]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


def _retry_edge(state: LoopState, e: CallFailed, limits: Limits) -> str | None:
    """The retry edge a failed call takes (``stream_retry`` / ``non_streaming_retry`` /
    ``fallback_retry``), or None when the failure is not retried. Private to the guards below:
    a runtime learns what the move did from the step it took (:attr:`Edge.does`), never by asking
    ahead."""
    error = e.error
    # a stream that broke mid-way is requested again as a whole (its partial blocks discarded); so is
    # one whose connection closed before its first event
    dropped = error.kind == "stream_dropped"
    # an SSE error event of another type is asked again only while nothing complete was shown: after a
    # complete block Claude Code 2.1.332 runs the calls shown, or ends (docs/conform.md)
    settled = error.kind == "stream_error" and bool(e.shown)
    if (error.retryable and (state.phase is S or dropped) and error.kind != "stream_garbled" and not settled
            and not state.non_streaming and state.stream_retry_count < limits.stream_retries):
        return "stream_retry"
    # a stream still dropping, or one that came garbled (not SSE, not JSON, an HTML page) before any
    # content: the same request once more without streaming, as Claude Code does
    if (error.kind in ("stream_dropped", "stream_garbled") and not state.non_streaming
            and e.non_streaming_available):
        return "non_streaming_retry"
    # the transport's own retries are spent: move down the fallback chain
    if (error.retryable or error.kind == "overloaded") and e.fallback_available and not settled:
        return "fallback_retry"
    return None


@_named("cut_after_text")
def cut_after_text(s: LoopState, e: CallFailed, _lim: Limits) -> bool:
    """The API sent an ``overloaded_error`` or ``api_error`` event in the middle of a response that had
    already shown a complete text block, and no tool call: Claude Code 2.1.332 keeps the text and asks the
    model to resume from it (docs/conform.md). A dropped or garbled stream, or one that showed only thinking, is
    requested again as a whole."""
    shown = e.shown
    return (s.phase is S and e.error.kind in ("overloaded", "stream_api_error") and bool(shown)
            and any(b.get("type") == "text" and str(b.get("text", "")).strip() for b in shown)
            and not any(b.get("type") == "tool_use" for b in shown))


@_named("cut_after_tool_use")
def cut_after_tool_use(s: LoopState, e: CallFailed, _lim: Limits) -> bool:
    """The API sent an SSE ``error`` event (of any type) in the middle of a response that had already shown
    a complete tool_use block: Claude Code 2.1.332 keeps the response and runs its calls, as if it had
    ended with ``tool_use`` (tests/fidelity/conform/conform-3ef694a5db.json; docs/conform.md). A dropped or
    garbled stream is still requested again as a whole."""
    return (s.phase is S and e.error.kind in ("overloaded", "stream_api_error", "stream_error")
            and any(b.get("type") == "tool_use" for b in e.shown))


@_named("over_budget")
def over_budget(_s: LoopState, e: StreamEnded, lim: Limits) -> bool:
    """The run's spend, this response included, reached ``max_budget_usd``: Claude Code 2.1.332 ends the
    run there (``error_max_budget_usd``), whatever the response was, before any tool call of it runs
    (docs/conform.md)."""
    return lim.max_budget_usd is not None and e.cost_usd >= lim.max_budget_usd


@_named("stream_retry_left")
def stream_retry_left(s: LoopState, e: CallFailed, lim: Limits) -> bool:
    return _retry_edge(s, e, lim) == "stream_retry"


@_named("non_streaming_left")
def non_streaming_left(s: LoopState, e: CallFailed, lim: Limits) -> bool:
    return _retry_edge(s, e, lim) == "non_streaming_retry"


@_named("fallback_left")
def fallback_left(s: LoopState, e: CallFailed, lim: Limits) -> bool:
    return _retry_edge(s, e, lim) == "fallback_retry"


@_named("compacted_after_prompt_too_long")
def compacted_after_prompt_too_long(s: LoopState, e: CallFailed, _lim: Limits) -> bool:
    return e.error.kind == "prompt_too_long" and e.compaction is not None and may_reactive_compact(s)


def dispatchable(response: Any) -> bool:
    """Tool_use blocks reached their ``content_block_stop``: the batch runs, whatever ``stop_reason``
    says. A call whose input JSON did not parse runs too and is answered with an input-validation
    error the model can correct (Claude Code 2.1.332 does the same, tests/fidelity/scenarios/
    unparsable_tool_input.json); only a ``tool_use`` stop with no tool_use block at all is a
    malformed tool use."""
    return bool(response.tool_uses())


@_named("has_tool_calls")
def has_tool_calls(_s: LoopState, e: StreamEnded, _lim: Limits) -> bool:
    return dispatchable(e.response)


@_named("thinking_only")
def thinking_only(s: LoopState, e: StreamEnded, lim: Limits) -> bool:
    r = e.response
    # one nudge per turn for an answer without visible output, thinking-only or empty (Claude Code 2.1.332
    # ends the run on an empty answer after a thinking-only nudge: tests/fidelity/conform/conform-f1fc44a76c.json)
    return (not r.visible_text() and r.has_thinking() and not s.thinking_only_nudged
            and not s.empty_response_nudged and lim.thinking_only_nudges > 0)


def empty_answer(response: Any) -> bool:
    """A response with nothing in it: no visible text, no thinking, no tool call."""
    return not response.visible_text() and not response.has_thinking() and not response.tool_uses()


@_named("empty_response")
def empty_response(s: LoopState, e: StreamEnded, lim: Limits) -> bool:
    return (empty_answer(e.response) and not s.empty_response_nudged and not s.thinking_only_nudged
            and lim.empty_response_nudges > 0)


@_named("structured_output_missing")
def structured_output_missing(_s: LoopState, e: StreamEnded, _lim: Limits) -> bool:
    return e.json_schema and not e.structured_output_ids


@_named("aborted")
def batch_aborted(_s: LoopState, e: ToolsDrained, _lim: Limits) -> bool:
    return e.aborted


def lone_deferral(event: ToolsDrained) -> bool:
    """A deferral counts only for a lone call: deferring one of several would leave its siblings'
    results without their call on resume."""
    ids = event.assistant.tool_use_ids()
    return len(ids) == 1 and ids[0] in event.deferred_ids


@_named("lone_call_deferred")
def lone_call_deferred(_s: LoopState, e: ToolsDrained, _lim: Limits) -> bool:
    return lone_deferral(e)


@_named("hook_stopped")
def batch_hook_stopped(_s: LoopState, e: ToolsDrained, _lim: Limits) -> bool:
    return e.hook_stopped


@_named("ends_turn")
def batch_ends_turn(_s: LoopState, e: ToolsDrained, _lim: Limits) -> bool:
    return e.ends_turn


@_named("post_batch_blocked")
def post_batch_blocked(_s: LoopState, e: ToolsDrained, _lim: Limits) -> bool:
    return e.post_batch_blocked


def structured_output_failed(event: ToolsDrained) -> bool:
    """A structured-output call of this batch got an error result (its input failed the schema)."""
    calls = set(event.structured_output_ids)
    return any(b.get("is_error") for b in event.results.content
               if b.get("type") == "tool_result" and b.get("tool_use_id") in calls)


@_named("structured_output_failed")
def structured_failed(_s: LoopState, e: ToolsDrained, _lim: Limits) -> bool:
    return structured_output_failed(e)


@_named("stop_hooks_due")
def stop_hooks_due(s: LoopState, _e: Any, _lim: Limits) -> bool:
    return s.stop_hooks_due


# The ends after which a background task's report starts another pass: all but an interrupt (which stops
# the run's tasks) and the host's move to the background (the run goes on elsewhere). Claude Code 2.1.332 goes
# on after every other end tried (oracle runs, 2026-12-06, docs/conform.md): completed, an API error (a 4xx, a
# 5xx, a prompt or request too long), --max-turns even with no turn left, --max-budget-usd (whose budget then
# refuses the pass's request), a PreToolUse hook's `continue: false`, a deferred call, a Stop hook's
# `continue: false`, structured-output retries exhausted.
NOT_NOTIFIED_AFTER = frozenset({T.ABORTED_STREAMING, T.ABORTED_TOOLS, T.BACKGROUND_REQUESTED})
NOTIFIED_AFTER = frozenset(T) - NOT_NOTIFIED_AFTER


def takes_notifications(state: LoopState, limits: Limits) -> bool:
    """The run ended and may go on when a background task reports: it ended as :data:`NOTIFIED_AFTER`
    lists, its Stop hooks (if any were due) having run. The runtime waits for notifications only then."""
    return state.phase is X and not state.stop_hooks_due and state.terminal_reason in NOTIFIED_AFTER


class NotificationPlace(enum.Enum):
    """Where a task notification joins the conversation (issue 30)."""

    IN_TOOL_RESULT = "in_tool_result"
    OWN_MESSAGE = "own_message"


#: The kind of a notification message taken while the run goes on (queued input a request carries:
#: ``open_stream`` takes it) ...
RUN_NOTIFICATION = "task_notification"
#: ... and of one that restarted an ended run (the ``task_notification`` move: :func:`notified`).
PASS_NOTIFICATION = "task_notification_pass"

#: Where a notification goes, by the move that took it in. Claude Code 2.1.332
#: (tests/fixtures/background/notification_mid_run, json_schema_background): one taken while the run
#: goes on is appended to the text of the last tool result of the request that carries it, when that
#: request answers a tool batch (a text block of the result when its content is blocks); one that
#: restarts an ended run is a user message of its own, even after a batch that ended the run.
NOTIFICATION_PLACES: Mapping[NotificationPlace, str] = {
    NotificationPlace.IN_TOOL_RESULT: "taken while the run goes on, by a request that answers a tool batch: "
                                      "appended to the batch's last tool result",
    NotificationPlace.OWN_MESSAGE: "restarting an ended run (task_notification), or taken by a request that "
                                   "answers no tool batch: a user message of its own",
}


def notification_place(kind: str, joined: Iterable[Mapping[str, Any]]) -> NotificationPlace:
    """Where a notification message of ``kind`` goes in a request: ``joined`` are the blocks of the
    user message it would join (none when it starts one)."""
    if kind == RUN_NOTIFICATION and any(b.get("type") == "tool_result" for b in joined):
        return NotificationPlace.IN_TOOL_RESULT
    return NotificationPlace.OWN_MESSAGE


@_named("settled_completed")
def settled_completed(s: LoopState, _e: TaskNotified, lim: Limits) -> bool:
    return takes_notifications(s, lim)


@_named("prevented")
def verdict_prevented(_s: LoopState, e: StopHookVerdict, _lim: Limits) -> bool:
    return e.prevented


@_named("blocked_or_context")
def verdict_continues(_s: LoopState, e: StopHookVerdict, _lim: Limits) -> bool:
    # a hook's additionalContext re-enters like a block (Claude Code 2.1.332 does, under the same cap):
    # ending the run would drop what the hook wanted the model to read
    return e.blocked or bool(e.context)


# --- effects -----------------------------------------------------------------------------------

# An effect computes the changes a route makes to the state record (beyond phase, which the edge
# sets): pure, from (state, event, limits). Terminal routes return ``terminal_reason``.
Effect = Callable[[LoopState, Any, Limits], Mapping[str, Any]]
Notices = Callable[[LoopState, Any, Limits], tuple[str, ...]]


def _stop(reason: TerminalReason, detail: str | None = None) -> Effect:
    def effect(_s: LoopState, _e: Any, _lim: Limits) -> Mapping[str, Any]:
        return {"terminal_reason": reason, "terminal_detail": detail}
    effect.__name__ = f"stop_{reason.value}"
    return effect


def batch_aborted_stop(s: LoopState, _e: ToolsDrained, _lim: Limits) -> Mapping[str, Any]:
    """The user interrupted the tool batch: its results stand, the interrupt marker follows them."""
    return {"terminal_reason": TerminalReason.ABORTED_TOOLS,
            "terminal_detail": "Request interrupted by user for tool use",
            "messages": (*s.messages, prompts.interrupt_marker(prompts.INTERRUPTED_TOOLS))}


def stop_with_event_reason(_s: LoopState, e: SetupFailed | Refused, _lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": e.reason, "terminal_detail": e.detail}


def pair_shown(event: CallFailed | Aborted, reason: str) -> tuple[Message | None, Message | None]:
    """What a response cut off mid-way leaves in the history when its move pairs what it showed: its
    complete blocks, and a result for every tool_use among them — the finished call's own, else a
    synthetic one for ``reason`` (the edge's :attr:`Does.close_calls`)."""
    if not event.shown:
        return None, None
    partial = Message("assistant", event.shown, kind="assistant")
    ids = partial.tool_use_ids()
    if not ids:
        return partial, None
    finished = {b.get("tool_use_id"): b for b in event.finished}
    paired = tuple(finished[i] if i in finished else prompts.synthetic_block(i, reason) for i in ids)
    return partial, Message("user", paired, kind="tool_results")


def _with_pair(messages: tuple[Message, ...], event: CallFailed | Aborted, trigger: str) -> tuple[Message, ...]:
    """The history with what the cut-off response showed appended, every tool_use paired with the
    reason ``trigger``'s edge closes calls with."""
    reason = EDGES_BY_TRIGGER[trigger].does.close_calls
    assert reason is not None, f"{trigger} pairs what was shown, so it declares how calls are closed"
    partial, results = pair_shown(event, reason)
    if partial is None:
        return messages
    return (*messages, partial) + ((results,) if results is not None else ())


def shown_results(step: Step, event: Event) -> tuple[Mapping[str, Any], ...]:
    """The tool results a step shows the client: when its edge pairs what the response showed, the
    results it paired the shown calls with (the same ones its effect put in the history)."""
    does = step.edge.does
    if does.shown is Shown.PAIR and isinstance(event, StreamEnded):
        return refused_results(event)
    if does.shown is not Shown.PAIR or not isinstance(event, CallFailed | Aborted) or does.close_calls is None:
        return ()
    _partial, results = pair_shown(event, does.close_calls)
    return results.content if results is not None else ()


def _compacted(state: LoopState, rapid: bool) -> CompactTracking:
    t = state.compact_tracking
    return attrs.evolve(t, last_compact_turn_id=state.query_tracking.chain_id, turns_since_compact=0,
                        consecutive_failures=0, rapid_refill_count=t.rapid_refill_count + 1 if rapid else 0,
                        compactions=t.compactions + 1)


def rapid_refill_stop(s: LoopState, e: Assembled, lim: Limits) -> Mapping[str, Any]:
    tracking = _compacted(s, rapid=True)
    return {"compact_tracking": tracking, "terminal_reason": T.RAPID_REFILL_BREAKER,
            "terminal_detail": "Context refilled right after compaction "
                               f"{tracking.rapid_refill_count} times in a row; stopping to avoid thrashing."}


def assembled(s: LoopState, e: Assembled, lim: Limits) -> Mapping[str, Any]:
    changes: dict[str, Any] = {}
    if e.compaction is not None:
        changes["compact_tracking"] = _compacted(s, rapid=rapid_refill(s, lim))
        changes["messages"] = e.compaction.messages
    elif e.compact_failed:
        t = s.compact_tracking
        changes["compact_tracking"] = attrs.evolve(t, consecutive_failures=t.consecutive_failures + 1)
    qt = s.query_tracking
    changes["query_tracking"] = QueryTracking(chain_id=qt.chain_id, depth=qt.depth + 1)
    return changes


def stream_opened(s: LoopState, e: StreamOpened, _lim: Limits) -> Mapping[str, Any]:
    # queued input the request carried is in the conversation from now on: it is taken only by the
    # step that really starts a request (a refused or failed call leaves it queued)
    return {"messages": s.messages + e.sent_input} if e.sent_input else {}


def stream_retried(s: LoopState, _e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    return {"stream_retry_count": s.stream_retry_count + 1}


def non_streaming_taken(_s: LoopState, _e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    return {"non_streaming": True}


def fallback_taken(s: LoopState, _e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    return {**resets("fallback_retry", s), "model_index": s.model_index + 1}


def reactive_compacted(s: LoopState, e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    t = s.compact_tracking
    assert e.compaction is not None
    return {"has_attempted_reactive_compact": True, "messages": e.compaction.messages,
            "compact_tracking": attrs.evolve(t, last_compact_turn_id=s.query_tracking.chain_id,
                                             turns_since_compact=0, compactions=t.compactions + 1)}


def _error_reason(kind: str) -> TerminalReason:
    return {"prompt_too_long": T.PROMPT_TOO_LONG, "image": T.IMAGE_ERROR, "model": T.MODEL_ERROR,
            "stream_garbled": T.MODEL_ERROR}.get(kind, T.API_ERROR)


def _failure_detail(s: LoopState, error: Any, compaction_failure: str = "") -> str:
    """What the run's result says of a failure: the API's message, except for a prompt too long in a
    conversation of a single exchange, which no compaction can shrink: Claude Code 2.1.332 says so in its
    own words, with the request's size from the API's message and its estimate of the conversation's;
    and for a prompt too long whose compaction was tried and failed, which it names with why."""
    if error.kind == "prompt_too_long" and _exchanges(s.messages) == 0:
        return prompts.single_exchange_too_long(error.message, prompts.rough_tokens(s.messages))
    if error.kind == "prompt_too_long" and compaction_failure:
        return prompts.compaction_failed(compaction_failure)
    if error.kind == "image" and error.status == 413:  # request_too_large: Claude Code's own words
        return prompts.request_too_large(str(error.message))
    if error.kind == "stream_error":  # an SSE error event it ended on, in Claude Code's generic form
        return f"API Error: {error.message}"
    return str(error.message)


def call_failed(s: LoopState, e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": _error_reason(e.error.kind),
            "terminal_detail": _failure_detail(s, e.error, e.compaction_failure),
            "messages": _with_pair(s.messages, e, "call_failed")}


# A response that ended closes this request's stream retries; the next one streams again. The same
# resets for every edge a response ends on (agentfsm.machine.state.RESPONSE_ENDED: the counters declare them).
_ENDED_RESETS = resets("end_turn", LoopState())


def _ended(changes: Mapping[str, Any]) -> Mapping[str, Any]:
    return {**_ENDED_RESETS, **changes}


def _kept(s: LoopState, e: StreamEnded, *extra: Message) -> tuple[Message, ...]:
    assistant = e.response.as_message()
    return (*s.messages, *((assistant,) if assistant.content else ()), *extra)


def mid_stream_resume(s: LoopState, e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    # the text shown before the error event is kept, and the model asked to go on from it
    return _ended({"messages": (*s.messages, Message("assistant", e.shown, kind="assistant"),
                                prompts.meta_message(prompts.MID_STREAM_RESUME)),
                   "max_output_tokens_recovery_count": s.max_output_tokens_recovery_count + 1})


def dispatching(_s: LoopState, _e: StreamEnded | CallFailed, _lim: Limits) -> Mapping[str, Any]:
    return _ended({})


def max_tokens_recovery(s: LoopState, e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    # a cut answer with nothing visible yet (thinking only) is dropped, as Claude Code 2.1.332 does: the
    # resume reminder then joins the last user message (tests/fidelity/conform/conform-4faaa3549f.json)
    visible = e.response.visible_text() or e.response.tool_uses()
    kept = _kept(s, e, prompts.meta_message(prompts.MAX_TOKENS_RESUME)) if visible else (
        *s.messages, prompts.meta_message(prompts.MAX_TOKENS_RESUME))
    return _ended({"messages": kept,
                   "max_output_tokens_recovery_count": s.max_output_tokens_recovery_count + 1})


def budget_spent(s: LoopState, e: StreamEnded, lim: Limits) -> Mapping[str, Any]:
    """The response is kept. Its calls that finished while it streamed (``StreamEnded.finished``) keep their
    results: they ran, or were rejected before their tool (an unknown tool, input failing the schema, a
    TaskStop of no task). Claude Code 2.1.332 records those too: it starts each call as its block ends,
    and what finished before the response ended stays (a Write given 1.5 s wrote its file; the rule is
    timing, not the tool: tests/fixtures/claude_code/budget_finished_calls, docs/conform.md). The others
    never run; they are answered with a synthetic result so the history stays pairable (Claude Code
    leaves them unanswered in its transcript)."""
    ids = e.response.as_message().tool_use_ids()
    finished = {b.get("tool_use_id"): b for b in e.finished}
    closed = (Message("user", tuple(finished[i] if i in finished else prompts.synthetic_block(i, BUDGET_CLOSED)
                                    for i in ids), kind="tool_results"),) if ids else ()
    return _ended({"messages": _kept(s, e, *closed), "terminal_reason": T.BUDGET_EXHAUSTED,
                   "terminal_detail": prompts.budget_reached(lim.max_budget_usd or 0.0)})


def refused_results(e: StreamEnded) -> tuple[Mapping[str, Any], ...]:
    """The results that answer the calls of a refused response: none of them runs on; a call whose tool
    had started is told it may have done something, one still waiting that it never ran (Claude Code
    2.1.332's words)."""
    started = frozenset(e.started)
    return tuple(prompts.synthetic_block(i, prompts.REFUSAL_INTERRUPTED if i in started else prompts.REFUSAL_NOT_RUN)
                 for i in e.response.as_message().tool_use_ids())


def refusal_retried(s: LoopState, e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    """What the refused response showed is kept and its calls answered; the model is asked once more,
    reminded that a safety classifier stopped it (and that a call which had started may have run)."""
    results = refused_results(e)
    started = any(b["content"] == prompts.synthetic_text(prompts.REFUSAL_INTERRUPTED) for b in results)
    text = prompts.REFUSAL_RETRY + (prompts.REFUSAL_RETRY_STARTED if started else "")
    paired = (Message("user", results, kind="tool_results"),) if results else ()
    return _ended({"messages": _kept(s, e, *paired, prompts.meta_message(text)),
                   "refusal_retry_count": s.refusal_retry_count + 1})


def refusal_exhausted(_s: LoopState, e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    """Refused again: the run ends ``api_error`` (the second refused response is not kept), its result
    naming the model and the request and message ids, as Claude Code 2.1.332 does."""
    r = e.response
    return _ended({"terminal_reason": T.API_ERROR,
                   "terminal_detail": prompts.refusal_exhausted(r.model, r.request_id, r.message_id)})


def max_tokens_exhausted(s: LoopState, e: StreamEnded, lim: Limits) -> Mapping[str, Any]:
    return _ended({"messages": _kept(s, e), "terminal_reason": T.API_ERROR,
                   "terminal_detail": prompts.MAX_TOKENS_EXHAUSTED.format(n=lim.max_output_tokens)})


def malformed_retry(s: LoopState, _e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    # clean retry: the failed assistant message is dropped, never sent back
    return _ended({"messages": (*s.messages, prompts.meta_message(prompts.MALFORMED_TOOL_USE_RETRY)),
                   "malformed_tool_use_retry_count": s.malformed_tool_use_retry_count + 1})


def malformed_exhausted(_s: LoopState, _e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    return _ended({"terminal_reason": T.MALFORMED_TOOL_USE_EXHAUSTED,
                   "terminal_detail": prompts.MALFORMED_TOOL_USE_EXHAUSTED})


def thinking_nudge(s: LoopState, _e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    # the thinking-only answer is dropped (Claude Code re-asks without it)
    return _ended({"messages": (*s.messages, prompts.meta_message(prompts.EMPTY_RESPONSE_NUDGE)),
                   "thinking_only_nudged": True})


def empty_nudge(s: LoopState, _e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    # the empty answer is dropped; the nudge joins the last user message on the wire (Claude Code)
    return _ended({"messages": (*s.messages, prompts.meta_message(prompts.EMPTY_RESPONSE_NUDGE)),
                   "empty_response_nudged": True})


def structured_retry(s: LoopState, e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    return _ended({"messages": _kept(s, e, prompts.meta_message(prompts.STRUCTURED_OUTPUT_RETRY, plain=True)),
                   "structured_output_retry_count": s.structured_output_retry_count + 1})


def _structured_exhausted_detail(lim: Limits) -> str:
    return f"No valid structured output after {lim.structured_output_retries} retries."


def structured_exhausted(s: LoopState, e: StreamEnded, lim: Limits) -> Mapping[str, Any]:
    return _ended({"messages": _kept(s, e), "terminal_reason": T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED,
                   "terminal_detail": _structured_exhausted_detail(lim)})


def answered(s: LoopState, e: StreamEnded, _lim: Limits) -> Mapping[str, Any]:
    # an empty final answer is kept as an empty text, so the result says "" rather than repeating
    # what an earlier turn said (the block is dropped from the wire)
    empty = (_empty_text_answer(),) if empty_answer(e.response) and not e.response.blocks else ()
    return _ended({"messages": (*_kept(s, e), *empty), "terminal_reason": T.COMPLETED, "terminal_detail": None,
                   "stop_hooks_due": True})


def _empty_text_answer() -> Message:
    return Message("assistant", ({"type": "text", "text": ""},), kind="assistant")


def collected(s: LoopState, e: ToolsDrained, _lim: Limits) -> Mapping[str, Any]:
    results = e.results
    kind = DEFERRED_RESULTS if lone_deferral(e) else "tool_results"
    if results.kind != kind:
        results = attrs.evolve(results, kind=kind)
    layers = {**s.tool_use_context.layers, **e.context_layers}
    return {"messages": (*s.messages, e.assistant, results),
            "tool_use_context": attrs.evolve(s.tool_use_context, layers=layers)}


def batch_hook_stop(_s: LoopState, e: ToolsDrained, _lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": T.HOOK_STOPPED, "terminal_detail": e.hook_stop_reason or None}


def post_batch_stop(_s: LoopState, e: ToolsDrained, _lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": T.HOOK_STOPPED, "terminal_detail": e.post_batch_reason or None}


def batch_structured_exhausted(_s: LoopState, _e: ToolsDrained, lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED,
            "terminal_detail": _structured_exhausted_detail(lim)}


def _max_turns(_s: LoopState, _e: Any, lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": T.MAX_TURNS, "terminal_detail": f"Reached maximum number of turns ({lim.max_turns})"}


def next_turn(s: LoopState, e: ToolsDrained, _lim: Limits) -> Mapping[str, Any]:
    # A StructuredOutput call whose input failed the schema is a structured-output retry like an
    # answer without the call: it counts towards the same cap instead of resetting it, or a model
    # that keeps sending invalid output would loop until max_turns.
    # Every other reset is the counters' own declaration (reset_by next_turn).
    t = s.compact_tracking
    return {
        **resets("next_turn", s),
        "turn_count": s.turn_count + 1,
        "structured_output_retry_count": s.structured_output_retry_count + 1 if structured_output_failed(e) else 0,
        "compact_tracking": attrs.evolve(t, turns_since_compact=t.turns_since_compact + 1),
    }


def verdict_prevented_stop(_s: LoopState, e: StopHookVerdict, _lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": T.STOP_HOOK_PREVENTED, "terminal_detail": e.stop_reason or None,
            "stop_hooks_due": False}


def verdict_max_turns(s: LoopState, e: StopHookVerdict, lim: Limits) -> Mapping[str, Any]:
    return {**_max_turns(s, e, lim), "stop_hooks_due": False}


def block_cap_warning(s: LoopState, _e: StopHookVerdict, _lim: Limits) -> tuple[str, ...]:
    # the block being overridden is one more than the re-entries counted (Claude Code: "9 consecutive")
    return (prompts.STOP_HOOK_CAP_WARNING.format(n=s.stop_hook_blocking_count + 1),)


def verdict_cap_override(s: LoopState, _e: StopHookVerdict, _lim: Limits) -> Mapping[str, Any]:
    return {"terminal_reason": T.COMPLETED, "stop_hooks_due": False,
            "terminal_detail": block_cap_warning(s, _e, _lim)[0]}


def stop_hook_reentry(s: LoopState, e: StopHookVerdict, _lim: Limits) -> Mapping[str, Any]:
    feedback = prompts.stop_hook_feedback(e.reason if e.blocked else None, e.context)
    return {"messages": (*s.messages, feedback), "stop_hook_active": True,
            "stop_hook_blocking_count": s.stop_hook_blocking_count + 1, "turn_count": s.turn_count + 1,
            "stop_hooks_due": False}


def verdict_passed(_s: LoopState, _e: StopHookVerdict, _lim: Limits) -> Mapping[str, Any]:
    return {"stop_hooks_due": False}


def notified(s: LoopState, e: TaskNotified, _lim: Limits) -> Mapping[str, Any]:
    """The notifications join the conversation, as messages that started a pass (their place:
    :func:`notification_place`), and a new pass starts: the counters declared to reset on a new turn
    (agentfsm.machine.state.NEW_TURN) start over, and so does ``turn_count`` (a pass counts its own turns
    against max_turns, as Claude Code 2.1.332's does: its result's ``num_turns`` is the pass's)."""
    t = s.compact_tracking
    notes = tuple(attrs.evolve(m, kind=PASS_NOTIFICATION) for m in e.notifications)
    return {**resets("task_notification", s), "messages": (*s.messages, *notes),
            "compact_tracking": attrs.evolve(t, turns_since_compact=t.turns_since_compact + 1)}


def aborted(reason: TerminalReason) -> Effect:
    """The run was stopped: what was shown stays, paired, and the interrupt marker follows it (the
    next request tells the model where it was cut off, as Claude Code's does)."""
    def effect(s: LoopState, e: Aborted, _lim: Limits) -> Mapping[str, Any]:
        # a response cut off with tool calls shown (they are paired now) was stopped "for tool use"
        shown_calls = any(b.get("type") == "tool_use" for b in e.shown)
        tools = reason is TerminalReason.ABORTED_TOOLS or shown_calls
        marker = prompts.interrupt_marker(prompts.INTERRUPTED_TOOLS if tools else prompts.INTERRUPTED)
        return {"terminal_reason": reason, "terminal_detail": e.detail,
                "messages": (*_with_pair(s.messages, e, "abort"), marker)}
    effect.__name__ = f"aborted_{reason.value}"
    return effect


# --- routes: the behaviour ---------------------------------------------------------------------


@attrs.frozen
class Route:
    """``source, event [guard] / effect → edge``. ``guard`` None always holds. ``notices`` are texts
    the step reports (warnings for the result) besides its state."""

    sources: tuple[Phase, ...]
    event: type
    guard: Guard | None
    edge: str
    effect: Effect = attrs.field(eq=False)
    notices: Notices | None = attrs.field(default=None, eq=False)

    @property
    def guard_name(self) -> str:
        return self.guard.name if self.guard is not None else "else"

    @property
    def label(self) -> str:
        """``Event [guard] → edge``, as the diagrams show it."""
        guard = f" [{self.guard.name}]" if self.guard is not None else ""
        return f"{self.event.__name__}{guard} → {self.edge}"


def _route(sources: Phase | tuple[Phase, ...], event: type, guard: Guard | None, edge: str, effect: Effect,
           notices: Notices | None = None) -> Route:
    return Route(sources if isinstance(sources, tuple) else (sources,), event, guard, edge, effect, notices)


_due = stop_hooks_due
ROUTES: tuple[Route, ...] = (
    # assemble
    _route(A, SetupFailed, hook_stopped_prompt, "prompt_blocked", stop_with_event_reason),
    _route(A, SetupFailed, None, "setup_failed", stop_with_event_reason),
    _route(A, Assembled, rapid_refill_tripped, "setup_failed", rapid_refill_stop),
    _route(A, Assembled, None, "call", assembled),
    # call_model
    _route(C, Refused, None, "refuse", stop_with_event_reason),
    _route(C, StreamOpened, None, "open_stream", stream_opened),
    # a failed call, before or during the stream
    _route(S, CallFailed, cut_after_tool_use, "dispatch", dispatching),
    _route(S, CallFailed, cut_after_text & under_cap("max_output_tokens_recovery_count"),
           "max_output_tokens_recovery", mid_stream_resume),
    _route((C, S), CallFailed, stream_retry_left, "stream_retry", stream_retried),
    _route((C, S), CallFailed, non_streaming_left, "non_streaming_retry", non_streaming_taken),
    _route((C, S), CallFailed, fallback_left, "fallback_retry", fallback_taken),
    _route((C, S), CallFailed, compacted_after_prompt_too_long, "reactive_compact_retry", reactive_compacted),
    _route((C, S), CallFailed, None, "call_failed", call_failed),
    # the response ended
    _route(S, StreamEnded, over_budget, "over_budget", budget_spent),
    _route(S, StreamEnded, stop_reason_is("refusal") & under_cap("refusal_retry_count"), "refusal_retry",
           refusal_retried),
    _route(S, StreamEnded, stop_reason_is("refusal"), "recovery_exhausted", refusal_exhausted),
    _route(S, StreamEnded, has_tool_calls, "dispatch", dispatching),
    _route(S, StreamEnded, stop_reason_is("max_tokens", "model_context_window_exceeded")
           & under_cap("max_output_tokens_recovery_count"), "max_output_tokens_recovery", max_tokens_recovery),
    _route(S, StreamEnded, stop_reason_is("max_tokens", "model_context_window_exceeded"),
           "recovery_exhausted", max_tokens_exhausted),
    _route(S, StreamEnded, stop_reason_is("tool_use") & under_cap("malformed_tool_use_retry_count"),
           "malformed_tool_use_retry", malformed_retry),
    _route(S, StreamEnded, stop_reason_is("tool_use"), "recovery_exhausted", malformed_exhausted),
    _route(S, StreamEnded, thinking_only, "thinking_only_nudge", thinking_nudge),
    _route(S, StreamEnded, empty_response, "empty_response_nudge", empty_nudge),
    _route(S, StreamEnded, structured_output_missing & under_cap("structured_output_retry_count"),
           "structured_output_retry", structured_retry),
    _route(S, StreamEnded, structured_output_missing, "recovery_exhausted", structured_exhausted),
    _route(S, StreamEnded, None, "end_turn", answered),
    # the tool batch drained; feedback then decides at once (an automatic phase) on the same event
    _route(D, ToolsDrained, None, "collect", collected),
    _route(F, ToolsDrained, batch_aborted, "finish_batch", batch_aborted_stop),
    _route(F, ToolsDrained, lone_call_deferred, "finish_batch",
           _stop(T.TOOL_DEFERRED, "A tool call was deferred by a PreToolUse hook")),
    _route(F, ToolsDrained, batch_hook_stopped, "finish_batch", batch_hook_stop),
    _route(F, ToolsDrained, batch_ends_turn, "finish_batch", _stop(T.COMPLETED)),
    _route(F, ToolsDrained, post_batch_blocked, "finish_batch", post_batch_stop),
    _route(F, ToolsDrained, structured_failed & ~under_cap("structured_output_retry_count"), "finish_batch",
           batch_structured_exhausted),
    _route(F, ToolsDrained, turn_cap_reached, "finish_batch", _max_turns),
    _route(F, ToolsDrained, None, "next_turn", next_turn),
    # Stop hooks ran after a completed end of turn
    _route(X, StopHookVerdict, _due & verdict_prevented, "settle", verdict_prevented_stop),
    _route(X, StopHookVerdict, _due & verdict_continues & turn_cap_reached, "settle", verdict_max_turns),
    _route(X, StopHookVerdict, _due & verdict_continues & ~under_cap("stop_hook_blocking_count"), "settle",
           verdict_cap_override, block_cap_warning),
    _route(X, StopHookVerdict, _due & verdict_continues, "stop_hook_blocking", stop_hook_reentry),
    _route(X, StopHookVerdict, _due, "settle", verdict_passed),
    # background tasks reported after the run ended
    _route(X, TaskNotified, settled_completed, "task_notification", notified),
    # cancelled
    _route(RUNNING, Aborted, tools_running, "abort", aborted(T.ABORTED_TOOLS)),
    _route(RUNNING, Aborted, None, "abort", aborted(T.ABORTED_STREAMING)),
)

# Phases that decide at once, on the event that brought the loop there (no I/O in between).
AUTOMATIC: frozenset[Phase] = frozenset({F})

# Every (phase, event) pair no route handles, and why it cannot happen.
_ONLY = "reports the work of {}; the driver observes it nowhere else"
REFUSALS: Mapping[tuple[Phase, type], str] = {
    **{(p, SetupFailed): _ONLY.format("assemble") for p in (C, S, D, F, X)},
    **{(p, Assembled): _ONLY.format("assemble") for p in (C, S, D, F, X)},
    **{(p, Refused): _ONLY.format("call_model (the preflight)") for p in (A, S, D, F, X)},
    **{(p, StreamOpened): _ONLY.format("call_model") for p in (A, S, D, F, X)},
    **{(p, CallFailed): _ONLY.format("call_model and stream") for p in (A, D, F, X)},
    **{(p, StreamEnded): _ONLY.format("stream") for p in (A, C, D, F, X)},
    **{(p, ToolsDrained): _ONLY.format("dispatch_tools") for p in (A, C, S, X)},
    **{(p, StopHookVerdict): _ONLY.format("stop (after end_turn)") for p in (*RUNNING, F)},
    **{(p, TaskNotified): "a notification that arrives while the run goes on joins the next request as queued "
                          "input (StreamOpened), where notification_place says; only a run that ended is "
                          "restarted by one" for p in (*RUNNING, F)},
    (F, Aborted): "feedback decides on the batch's own event, at once: nothing can arrive in between",
    (X, Aborted): "the loop has stopped: there is nothing left to abort",
}

ROUTES_BY_KEY: Mapping[tuple[Phase, type], tuple[Route, ...]] = {
    key: tuple(r for r in ROUTES if key[0] in r.sources and r.event is key[1])
    for key in {(p, r.event) for r in ROUTES for p in r.sources}
}


def validate(edges: Iterable[Edge] = EDGES, routes: Iterable[Route] = ROUTES,
             refusals: Mapping[tuple[Phase, type], str] = REFUSALS,
             event_types: Iterable[type] = EVENT_TYPES) -> list[str]:
    """Problems with the declaration; empty when it is sound. Run at import (fails loudly)."""
    edges, routes = tuple(edges), tuple(routes)
    by_trigger = {e.trigger: e for e in edges}
    problems: list[str] = []
    routed: dict[tuple[Phase, type], list[Route]] = {}
    for r in routes:
        edge = by_trigger.get(r.edge)
        if edge is None:
            problems.append(f"route {r.label}: edge {r.edge!r} is not declared")
            continue
        for src in r.sources:
            if src not in edge.sources:
                problems.append(f"route {r.label} from {src.value}: {r.edge!r} is not declared from {src.value}")
            routed.setdefault((src, r.event), []).append(r)
    taken = {r.edge for r in routes}
    problems += [f"edge {e.trigger!r} is taken by no route" for e in edges if e.trigger not in taken]
    problems += [f"counter {c.key} names {name!r}, which is not a declared edge"
                 for c in COUNTERS for name in sorted(c.raised_by | c.reset_by) if name not in by_trigger]
    for phase in STATES:
        for ev in event_types:
            key = (phase, ev)
            if key in routed and key in refusals:
                problems.append(f"{phase.value}/{ev.__name__} is both routed and refused")
            elif key not in routed and key not in refusals:
                problems.append(f"{phase.value}/{ev.__name__} is neither routed nor refused")
    for (phase, ev), rs in routed.items():
        unguarded = [i for i, r in enumerate(rs) if r.guard is None]
        if unguarded and unguarded[0] != len(rs) - 1:
            problems.append(f"{phase.value}/{ev.__name__}: routes after the unguarded one can never fire")
        if phase in AUTOMATIC and not unguarded:
            problems.append(f"{phase.value} decides on its own, so {ev.__name__} needs an unguarded last route")
    # stop is reachable from every phase
    reach = {X}
    changed = True
    while changed:
        changed = False
        for e in edges:
            for s in e.sources:
                if e.dest in reach and s not in reach:
                    reach.add(s)
                    changed = True
    problems += [f"stop cannot be reached from {p.value}" for p in STATES if p not in reach]
    return problems


_PROBLEMS = validate()
if _PROBLEMS:  # pragma: no cover - a broken table must never load
    raise ImportError("agentfsm.machine.graph: the declaration is unsound:\n  " + "\n  ".join(_PROBLEMS))


# --- steps -------------------------------------------------------------------------------------


@attrs.frozen
class Step:
    """One move: the edge taken, the route (guard) that chose it, the state after it, and what the
    step reports (``notices``: warnings for the result)."""

    trigger: str
    state: LoopState
    route: str = "else"
    notices: tuple[str, ...] = ()
    automatic: bool = False

    @property
    def edge(self) -> Edge:
        return EDGES_BY_TRIGGER[self.trigger]


def _next_state(state: LoopState, route: Route, event: Any, limits: Limits) -> LoopState:
    edge = EDGES_BY_TRIGGER[route.edge]
    changes = dict(route.effect(state, event, limits))
    new_messages = changes.get("messages")
    if (new_messages is not None and not edge.does.compacts and new_messages is not state.messages
            and not appended(state.messages, new_messages)):
        raise UndeclaredMove(f"{route.edge} replaced the history, which only a move that compacts may do")
    if edge.kind == "reentry":
        changes["transition"] = route.edge
        changes.setdefault("terminal_reason", None)
        changes.setdefault("terminal_detail", None)
    if edge.dest is X:
        reason = changes.get("terminal_reason", state.terminal_reason)
        if reason not in edge.reasons:
            raise UndeclaredMove(f"{route.edge} cannot end the loop with {reason!r}")
    changes["phase"] = edge.dest
    # attrs.evolve for the loop state, once per move: every field's value fetched in one call, the
    # changed ones put in place, the record built from positional arguments
    values = list(_state_values(state))
    for name, value in changes.items():
        i = _STATE_INDEX.get(name)
        if i is None:  # what LoopState(**changes) raised for a field it does not have
            raise TypeError(f"LoopState.__init__() got an unexpected keyword argument {name!r}")
        values[i] = value
    return LoopState(*values)


# Every LoopState field is a positional init argument under its own name, in declaration order
# (checked here), so the values in that order build the record.
_STATE_FIELDS = tuple(f.name for f in attrs.fields(LoopState))
if not all(f.init and f.alias == f.name and not f.kw_only for f in attrs.fields(LoopState)):  # pragma: no cover
    raise ImportError("agentfsm.machine.graph: a LoopState field is not a positional init argument of its own name")
_STATE_INDEX = {name: i for i, name in enumerate(_STATE_FIELDS)}
_state_values = operator.attrgetter(*_STATE_FIELDS)


# --- the runtime machine -----------------------------------------------------------------------


class LoopModel:
    """A loop as the model :data:`MACHINE`'s callbacks act on: ``phase`` reads the state record, so
    there is a single copy of it. The phase is set only after the route's effect replaced the record,
    and the setter checks that the two agree."""

    __slots__ = ("record", "step")

    def __init__(self, state: LoopState) -> None:
        self.record = state
        self.step: Step | None = None

    @property
    def phase(self) -> str:
        # the machine's states are the phases' names (plain strings)
        return self.record.phase.value

    @phase.setter
    def phase(self, value: str) -> None:
        if value != self.record.phase.value:
            raise UndeclaredMove(f"the machine moved to {value} but the route's state is at {self.record.phase}")


def _condition(route: Route) -> Callable[[Any], bool]:
    guard = route.guard
    assert guard is not None

    def check(ed: Any) -> bool:
        return guard(ed.model.record, ed.kwargs["event"], ed.kwargs["limits"])
    check.__name__ = guard.name
    return check


def _perform(route: Route) -> Callable[[Any], None]:
    def before(ed: Any) -> None:
        model: LoopModel = ed.model
        event, limits = ed.kwargs["event"], ed.kwargs["limits"]
        state = model.record
        nxt = _next_state(state, route, event, limits)
        notices = route.notices(state, event, limits) if route.notices is not None else ()
        model.record = nxt
        model.step = Step(route.edge, nxt, route.guard_name, notices, ed.kwargs.get("automatic", False))
    return before


# --- the lean machine: transitions' classes without their per-step logging ----------------------
#
# Since issue 31 transitions' own ``Event.trigger`` runs every move, which took a move from about
# 10 to about 22 us. Most of the difference was not the walk but what transitions does around it for
# every move: some sixteen ``logging`` calls (``_LOGGER.debug``/``info`` in Event, Transition, State and
# Machine.callbacks, each a level check and a call even with nothing listening), ``resolve_callable``
# and the ``send_event`` test on every condition and callback, the ``itertools.chain`` of the
# machine-wide before/after lists, and the states' empty enter/exit lists. The subclasses below keep
# transitions' structure and every callback it would run (Event.trigger -> Machine._process with its
# queue -> Event._trigger -> the transitions tried in order -> prepare, conditions, before, the
# model's state set, after, finalize_event, on_exception) and drop only that: a condition's callable
# is resolved once, when the transition is added; a list of callbacks is walked only when it is not
# empty; nothing is logged per step. Issue 34, bench/moves.py, same run (3,000 loops x 7 rounds):
# transitions' stock classes 18.8 us a move, these 11.1 (the hand walk of the same lists that issue
# 31 replaced: 8.6; a plain walk of ROUTES_BY_KEY 6.4). tests/test_engine_shape.py checks that both
# take the same steps and run the same callbacks.


class LeanCondition(tcore.Condition):
    """A guard: its callable resolved once (a name is still resolved on the model, per check)."""

    def __init__(self, func: Any, target: bool = True) -> None:
        super().__init__(func, target)
        self._fn = func if callable(func) else None

    def check(self, event_data: tcore.EventData) -> bool:
        fn = self._fn or event_data.machine.resolve_callable(self.func, event_data)
        return bool(fn(event_data) == self.target)


def _run(callbacks: Iterable[Any], event_data: tcore.EventData) -> None:
    for func in callbacks:
        if callable(func):
            func(event_data)
        else:
            event_data.machine.callback(func, event_data)


class LeanState(tcore.State):
    """A phase: enter/exit callbacks run only when there are any (the graph declares none)."""

    def enter(self, event_data: tcore.EventData) -> None:
        if self.on_enter:
            _run(self.on_enter, event_data)

    def exit(self, event_data: tcore.EventData) -> None:
        if self.on_exit:
            _run(self.on_exit, event_data)


class LeanTransition(tcore.Transition):
    """A route's transition: transitions' ``execute`` (prepare, conditions — the guard —, the machine's
    and its own before callbacks — the effect —, the state change, after callbacks) without the
    per-step logging, each list walked only when it has callbacks."""

    condition_cls = LeanCondition

    def execute(self, event_data: tcore.EventData) -> bool:
        machine = event_data.machine
        if self.prepare:
            _run(self.prepare, event_data)
        for cond in self.conditions:
            if not cond.check(event_data):
                return False
        if machine.before_state_change:
            _run(machine.before_state_change, event_data)
        _run(self.before, event_data)
        if self.dest:
            self._change_state(event_data)
        if self.after:
            _run(self.after, event_data)
        if machine.after_state_change:
            _run(machine.after_state_change, event_data)
        return True

    def _change_state(self, event_data: tcore.EventData) -> None:
        machine = event_data.machine
        machine.states[self.source].exit(event_data)
        dest = machine.states[self.dest]
        setattr(event_data.model, machine.model_attribute, dest.value)
        event_data.state = dest
        dest.enter(event_data)
        if dest.final and machine.on_final:
            _run(machine.on_final, event_data)


class LeanEvent(tcore.Event):
    """An event: transitions' ``_trigger`` (the model's state, a source check, prepare_event, the
    transitions tried in order, on_exception, finalize_event) without its per-step logging."""

    def _trigger(self, event_data: tcore.EventData) -> bool:
        machine = self.machine
        event_data.state = machine.states[getattr(event_data.model, machine.model_attribute)]
        try:
            if self._is_valid_source(event_data.state):
                if machine.prepare_event:
                    _run(machine.prepare_event, event_data)
                for trans in self.transitions[event_data.state.name]:
                    event_data.transition = trans
                    if trans.execute(event_data):
                        event_data.result = True
                        break
        except BaseException as err:
            event_data.error = err
            if not machine.on_exception:
                raise
            _run(machine.on_exception, event_data)
        finally:
            if machine.finalize_event:
                try:
                    _run(machine.finalize_event, event_data)
                except BaseException as err:  # as transitions does: its own logger says so, and it goes on
                    tcore._LOGGER.error("%sWhile executing finalize callbacks a %s occurred: %s.",
                                        machine.name, type(err).__name__, str(err))
        return event_data.result


class LeanMachine(Machine):
    """``transitions.Machine`` with the lean classes above; events are always sent as EventData (the
    callbacks of the graph take one), which the lean classes assume."""

    state_cls = LeanState
    transition_cls = LeanTransition
    event_cls = LeanEvent

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("send_event", False):
            raise TypeError("LeanMachine runs with send_event=True (its callbacks take the EventData)")
        super().__init__(*args, **kwargs)


def build_machine(routes: Iterable[Route] = ROUTES) -> LeanMachine:
    """One ``transitions.Machine`` (the lean one above) for every loop: states are the phases, each
    route is a transition triggered by its event's name, with its guard as condition and its effect
    run before the state changes. Transitions of one trigger and source are tried in declared order."""
    machine = LeanMachine(model=None, states=[p.value for p in Phase], initial=A.value, auto_transitions=False,
                          send_event=True, ignore_invalid_triggers=False, model_attribute="phase")
    for route in routes:
        dest = EDGES_BY_TRIGGER[route.edge].dest
        conditions = [_condition(route)] if route.guard is not None else []
        for src in route.sources:
            machine.add_transition(route.event.__name__, src.value, dest.value, conditions=conditions,
                                   before=[_perform(route)])
    return machine


MACHINE: LeanMachine = build_machine()

class LoopMachine:
    """One running loop on :data:`MACHINE`. :meth:`fire` is the only way its state changes: the
    machine's event is triggered on the loop's model (its transitions tried in order, the first whose
    guard holds runs its route's effect), and a phase that decides on its own (:data:`AUTOMATIC`) fires
    again on the same event. :meth:`close` (or the context manager) ends it: a closed machine refuses
    every event; nothing is held once it is dropped (the model is never registered with MACHINE)."""

    def __init__(self, state: LoopState) -> None:
        self._model = LoopModel(state)
        self._open = True

    @property
    def state(self) -> LoopState:
        return self._model.record

    @property
    def phase(self) -> Phase:
        return self._model.record.phase

    def fire(self, event: Event, limits: Limits) -> tuple[Step, ...]:
        if not self._open:  # a run that ended stays where it ended: nothing moves it afterwards
            raise UndeclaredMove(f"{type(event).__name__}: the loop's machine is closed (its run has ended)")
        steps = [self._fire_one(event, limits, automatic=False)]
        while self.phase in AUTOMATIC:
            steps.append(self._fire_one(event, limits, automatic=True))
        return tuple(steps)

    def _fire_one(self, event: Event, limits: Limits, *, automatic: bool) -> Step:
        model = self._model
        phase = model.record.phase
        name = type(event).__name__
        trigger = MACHINE.events.get(name)
        if trigger is None:
            raise UndeclaredMove(f"{name} is not an event of the graph")
        if phase.value not in trigger.transitions:
            refusal = REFUSALS.get((phase, type(event)), "no route is declared")
            raise UndeclaredMove(f"{name} in {phase.value}: {refusal}")
        # transitions runs the move: the event's transitions from this state in declared order, their
        # conditions (the guards), the first that holds runs its before callback (the route's effect)
        # and the machine sets the model's state. Event.trigger, not a trigger bound on the model:
        # binding needs the model registered with the shared MACHINE (add_model/remove_model per
        # loop), which cost another ~60 us a loop and would keep every unclosed loop alive in it.
        # MACHINE is a LeanMachine (above): transitions' processing without its per-step logging,
        # 11.1 us a move against 18.8 for its stock classes (bench/moves.py, same run).
        model.step = None
        if trigger.trigger(model, event=event, limits=limits, automatic=automatic) and model.step is not None:
            return model.step
        guards = ", ".join(r.guard_name for r in ROUTES_BY_KEY.get((phase, type(event)), ()))
        raise UndeclaredMove(f"{name} in {phase.value}: no route's guard holds ({guards})")

    def close(self) -> None:
        self._open = False

    def __enter__(self) -> LoopMachine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def advance(state: LoopState, event: Event, limits: Limits) -> tuple[Step, ...]:
    """Every move ``event`` causes from ``state`` (one, or two when the next phase decides at once).
    Pure: the same machine as a running loop, on a model of its own."""
    with LoopMachine(state) as machine:
        return machine.fire(event, limits)


def decide(state: LoopState, event: Event, limits: Limits) -> Step:
    """The first move ``event`` causes from ``state`` (see :func:`advance`). Pure."""
    return advance(state, event, limits)[0]


def follow(state: LoopState, event: Event, limits: Limits, trigger: str) -> Step | None:
    """The move along edge ``trigger`` that a route of this phase and event makes, its guard aside;
    None when no such route exists. This is how an auditor keeps following a recorded path after a
    move the machine would not have chosen. It decides nothing: the counters and messages still
    come from the route's own effect. Pure."""
    for route in ROUTES_BY_KEY.get((state.phase, type(event)), ()):
        if route.edge != trigger:
            continue
        try:
            nxt = _next_state(state, route, event, limits)
        except (UndeclaredMove, AssertionError):
            continue
        notices = route.notices(state, event, limits) if route.notices is not None else ()
        return Step(route.edge, nxt, route.guard_name, notices, state.phase in AUTOMATIC)
    return None


# --- pure decisions the driver asks before doing I/O ------------------------------------------


def route_for(state: LoopState, event: Event, limits: Limits) -> Route | None:
    """The route ``event`` takes from ``state``: the first of its phase and event whose guard holds."""
    for route in ROUTES_BY_KEY.get((state.phase, type(event)), ()):
        if route.guard is None or route.guard(state, event, limits):
            return route
    return None


# What a failure is probed with: a compaction that succeeded (its content is never read by a guard).
_PROBE_COMPACTION = Compaction((), "reactive")


def compaction_wanted(state: LoopState, event: CallFailed, limits: Limits) -> bool:
    """A compaction would change the failure's move: with one, the route the event takes is a move
    that compacts (:attr:`Does.compacts`). The runtime then compacts before it reports the failure
    (the I/O the event carries); the guard that says so is the route's own, in the table."""
    route = route_for(state, attrs.evolve(event, compaction=_PROBE_COMPACTION), limits)
    return route is not None and EDGES_BY_TRIGGER[route.edge].does.compacts


def should_auto_compact(state: LoopState, tokens: int, limits: Limits, cost_usd: float = 0.0) -> bool:
    """Compact before the next request: over the threshold, compaction has not failed too often, and the
    budget is not spent (the next request would be refused: a summary would only spend past it; Claude
    Code 2.1.332 makes none, tests/fixtures/background/notified_after_budget)."""
    return (limits.auto_compact and tokens > limits.auto_compact_threshold
            and state.compact_tracking.consecutive_failures < limits.max_consecutive_compact_failures
            and not out_of_budget(cost_usd, limits, state))


def out_of_budget(cost_usd: float, limits: Limits, state: LoopState | None = None) -> bool:
    """``--max-budget-usd`` is reached and the next request is a new one (not :func:`sends_again`)."""
    return (limits.max_budget_usd is not None and cost_usd >= limits.max_budget_usd
            and not (state is not None and sends_again(state)))


def sends_again(state: LoopState) -> bool:
    """The next request is one whose stream broke, sent again (``stream_retry`` raised its count, and no
    response has ended since): the same request, not a new one. Claude Code 2.1.332 does not check the
    budget before it; the response it brings is checked, by ``over_budget`` (docs/conform.md)."""
    return state.stream_retry_count > 0


def preflight_refusal(*, background: Any, cost_usd: float, tokens: int, limits: Limits,
                      state: LoopState | None = None) -> Refused | None:
    """Reasons not to send the next request at all, in order: moved to the background (the host's
    answer; a string is the reason), the budget spent (unless the request is sent again,
    :func:`sends_again`), the context over the blocking limit."""
    if background:
        return Refused(T.BACKGROUND_REQUESTED, background if isinstance(background, str)
                       else "Moved to the background before the next request")
    if out_of_budget(cost_usd, limits, state):
        return Refused(T.BUDGET_EXHAUSTED, prompts.budget_reached(limits.max_budget_usd))
    if tokens > limits.blocking_limit:
        return Refused(T.BLOCKING_LIMIT, f"Prompt is too long: about {tokens} tokens, over the blocking limit "
                                         f"of {limits.blocking_limit}. Compact the conversation or start a new one.")
    return None


def stop_hooks_are_due(state: LoopState) -> bool:
    """The loop is at stop after a completed end of turn and its Stop hooks have not run yet."""
    return state.phase is X and state.stop_hooks_due
