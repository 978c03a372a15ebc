"""The agent loop's whole state graph, as data, plus the pure rules that pick an edge.

Like h11's ``_state.py``: this module is the only place that decides where the loop goes next. The
runtime ``transitions.Machine`` (:class:`LoopMachine`), the diagrams (``fsm.diagram``) and the trace
auditor (``fsm.audit``) are all built from :data:`EDGES`. :func:`decide` is pure — loop state +
observed event + limits in, the next state and the edge taken out — so every rule is testable
without I/O; the driver only performs what the chosen edge implies.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from transitions import Machine, MachineError

from fsm import prompts
from fsm.events import (
    Aborted,
    Assembled,
    CallFailed,
    Event,
    ModelError,
    Refused,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    ToolsDrained,
)
from fsm.state import (
    CompactTracking,
    LoopState,
    Message,
    Phase,
    QueryTracking,
    TerminalReason,
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
T = TerminalReason
# the tool a --json-schema run must end with (tools/structured_output.py)
STRUCTURED_OUTPUT_TOOL = "StructuredOutput"


@attrs.frozen
class Edge:
    """One declared move. ``kind``: ``forward`` (the normal path), ``reentry`` (a labelled transition
    reason that starts the loop again), ``retry`` (same turn, same request again), ``terminal`` (into
    ``stop``; ``reasons`` are the terminal reasons it may carry)."""

    trigger: str
    sources: tuple[Phase, ...]
    dest: Phase
    kind: str
    doc: str
    reasons: frozenset[TerminalReason] = frozenset()

    @property
    def label(self) -> str:
        return self.trigger


def _edge(trigger: str, sources: tuple[Phase, ...] | Phase, dest: Phase, kind: str, doc: str,
          *reasons: TerminalReason) -> Edge:
    srcs = sources if isinstance(sources, tuple) else (sources,)
    return Edge(trigger, srcs, dest, kind, doc, frozenset(reasons))


EDGES: tuple[Edge, ...] = (
    # forward path
    _edge("call", A, C, "forward", "context assembled (queued input absorbed, auto-compact done); send"),
    _edge("open_stream", C, S, "forward", "the request was accepted and the response is streaming"),
    _edge("dispatch", S, D, "forward", "the response ended with complete tool_use blocks"),
    _edge("collect", D, F, "forward", "every tool of the batch has exactly one result"),
    # labelled re-entries (SPEC §2 transition reasons)
    _edge("next_turn", F, A, "reentry", "tool results appended; next model turn"),
    _edge("reactive_compact_retry", (C, S), A, "reentry",
          "prompt too long, answered by one successful compaction"),
    _edge("max_output_tokens_recovery", S, A, "reentry",
          "response hit max_tokens; keep it and ask to resume (count < cap)"),
    _edge("malformed_tool_use_retry", S, A, "reentry",
          "stop_reason tool_use without a complete tool_use block; drop it and ask again (count < cap)"),
    _edge("thinking_only_nudge", S, A, "reentry", "only thinking, no visible answer; ask once for one"),
    _edge("structured_output_retry", S, A, "reentry",
          "ended without the required StructuredOutput call; ask for it (count < cap)"),
    _edge("stop_hook_blocking", X, A, "reentry", "a Stop hook blocked the end (count < cap)"),
    # same request again
    _edge("stream_retry", S, C, "retry", "the stream broke mid-way; discard it and request again"),
    _edge("fallback_retry", (C, S), C, "retry", "retries exhausted on this model; use the fallback"),
    # into stop
    _edge("setup_failed", A, X, "terminal",
          "the turn could not be prepared (a resumed deferred call may be deferred again)",
          T.TURN_SETUP_FAILED, T.RAPID_REFILL_BREAKER, T.TOOL_DEFERRED_UNAVAILABLE, T.TOOL_DEFERRED),
    _edge("prompt_blocked", A, X, "terminal", "a UserPromptSubmit hook blocked the prompt", T.HOOK_STOPPED),
    _edge("refuse", C, X, "terminal", "preflight refused the request",
          T.BLOCKING_LIMIT, T.BUDGET_EXHAUSTED, T.BACKGROUND_REQUESTED),
    _edge("call_failed", (C, S), X, "terminal", "the model call failed and cannot be recovered",
          T.API_ERROR, T.MODEL_ERROR, T.PROMPT_TOO_LONG, T.IMAGE_ERROR),
    _edge("end_turn", S, X, "terminal", "no tool call: the answer is final (Stop hooks next)", T.COMPLETED),
    _edge("recovery_exhausted", S, X, "terminal", "a recovery branch reached its cap",
          T.API_ERROR, T.MALFORMED_TOOL_USE_EXHAUSTED, T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED),
    _edge("settle", X, X, "terminal", "Stop hooks did not re-enter: prevented, max_turns, or cap override",
          T.COMPLETED, T.STOP_HOOK_PREVENTED, T.MAX_TURNS),
    _edge("finish_batch", F, X, "terminal", "the tool batch ends the run",
          T.MAX_TURNS, T.ABORTED_TOOLS, T.TOOL_DEFERRED, T.HOOK_STOPPED, T.COMPLETED,
          T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED),
    _edge("abort", (A, C, S, D, F), X, "terminal", "cancelled; every tool_use shown gets a result",
          T.ABORTED_STREAMING, T.ABORTED_TOOLS),
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


@attrs.frozen
class Step:
    """The outcome of :func:`decide`: the edge to take and the state after it."""

    trigger: str
    state: LoopState

    @property
    def edge(self) -> Edge:
        return EDGES_BY_TRIGGER[self.trigger]


# --- guards the driver consults before doing I/O ---------------------------------------------


def may_reactive_compact(state: LoopState) -> bool:
    """A prompt-too-long error may be answered by compaction: once per turn, and only when there is
    more than a single exchange to summarise (seed 004: one exchange cannot be compacted)."""
    return not state.has_attempted_reactive_compact and _exchanges(state.messages) > 1


def _exchanges(messages: tuple[Message, ...]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


# --- the rules ---------------------------------------------------------------------------------


def _move(state: LoopState, trigger: str, **changes: object) -> Step:
    edge = EDGES_BY_TRIGGER[trigger]
    if state.phase not in edge.sources:
        raise UndeclaredMove(f"{trigger}: {state.phase} is not a source of this edge")
    if edge.kind == "reentry":
        changes.setdefault("transition", trigger)
    reason = changes.get("terminal_reason")
    if edge.dest is Phase.STOP:
        if reason not in edge.reasons:
            raise UndeclaredMove(f"{trigger} cannot end the loop with {reason!r}")
    elif edge.kind in ("reentry",):
        changes.setdefault("terminal_reason", None)
        changes.setdefault("terminal_detail", None)
    return Step(trigger, attrs.evolve(state, phase=edge.dest, **changes))  # type: ignore[arg-type]


def _stop(state: LoopState, trigger: str, reason: TerminalReason, detail: str | None = None,
          messages: tuple[Message, ...] | None = None) -> Step:
    return _move(state, trigger, terminal_reason=reason, terminal_detail=detail,
                 messages=state.messages if messages is None else messages)


def _error_reason(kind: str) -> TerminalReason:
    return {
        "prompt_too_long": T.PROMPT_TOO_LONG,
        "image": T.IMAGE_ERROR,
        "model": T.MODEL_ERROR,
    }.get(kind, T.API_ERROR)


def _with_pair(messages: tuple[Message, ...], partial: Message | None,
               results: Message | None) -> tuple[Message, ...]:
    """Append what was shown of a cut-off response, keeping every tool_use paired."""
    if partial is None or not partial.content:
        return messages
    if partial.tool_use_ids() and results is None:
        raise UndeclaredMove("a partial assistant message with tool_use needs its results")
    return (*messages, partial) + ((results,) if results is not None else ())


def decide(state: LoopState, event: Event, limits) -> Step:
    """Pick the edge for ``event`` in ``state.phase`` and compute the next state. Pure."""
    phase = state.phase
    if isinstance(event, Aborted):
        if phase is X:
            raise UndeclaredMove("abort after the loop stopped")
        reason = T.ABORTED_TOOLS if phase in (D, F) else T.ABORTED_STREAMING
        return _stop(state, "abort", reason, event.detail,
                     _with_pair(state.messages, event.partial, event.partial_results))

    if phase is A:
        if isinstance(event, SetupFailed):
            trigger = "prompt_blocked" if event.reason is T.HOOK_STOPPED else "setup_failed"
            return _stop(state, trigger, event.reason, event.detail)
        if isinstance(event, Assembled):
            tracking = state.compact_tracking
            messages = state.messages + event.attachments
            if event.compaction is not None:
                rapid = tracking.rapid_refill_count + 1 if event.rapid_refill else 0
                tracking = attrs.evolve(
                    tracking, last_compact_turn_id=state.query_tracking.chain_id,
                    turns_since_compact=0, consecutive_failures=0, rapid_refill_count=rapid,
                    compactions=tracking.compactions + 1)
                messages = event.compaction.messages + event.attachments
                if rapid >= limits.rapid_refill_max:
                    return _stop(attrs.evolve(state, compact_tracking=tracking), "setup_failed",
                                 T.RAPID_REFILL_BREAKER,
                                 "Context refilled right after compaction "
                                 f"{rapid} times in a row; stopping to avoid thrashing.")
            elif event.compact_failed:
                tracking = attrs.evolve(tracking, consecutive_failures=tracking.consecutive_failures + 1)
            qt = state.query_tracking
            return _move(state, "call", messages=messages, compact_tracking=tracking,
                         query_tracking=QueryTracking(chain_id=qt.chain_id, depth=qt.depth + 1))
        raise UndeclaredMove(f"{type(event).__name__} is not an event of {phase}")

    if phase is C:
        if isinstance(event, Refused):
            return _stop(state, "refuse", event.reason, event.detail)
        if isinstance(event, StreamOpened):
            return _move(state, "open_stream")
        if isinstance(event, CallFailed):
            return _call_failed(state, event, limits)
        raise UndeclaredMove(f"{type(event).__name__} is not an event of {phase}")

    if phase is S:
        if isinstance(event, CallFailed):
            return _call_failed(state, event, limits)
        if isinstance(event, StreamEnded):
            return _stream_ended(state, event, limits)
        raise UndeclaredMove(f"{type(event).__name__} is not an event of {phase}")

    if phase is D:
        if isinstance(event, ToolsDrained):
            layers = {**state.tool_use_context.layers, **event.context_layers}
            ctx = attrs.evolve(state.tool_use_context, layers=layers)
            results = event.results
            if event.attachments:
                # queued input rides in the same user message as the results (one user message)
                extra = tuple(b for m in event.attachments for b in m.content)
                results = attrs.evolve(results, content=results.content + extra)
            return _move(state, "collect", messages=(*state.messages, event.assistant, results),
                         tool_use_context=ctx)
        raise UndeclaredMove(f"{type(event).__name__} is not an event of {phase}")

    if phase is F:
        if isinstance(event, ToolsDrained):
            return _after_batch(state, event, limits)
        raise UndeclaredMove(f"{type(event).__name__} is not an event of {phase}")

    if isinstance(event, StopHookVerdict):
        return _stop_hooks(state, event, limits)
    raise UndeclaredMove(f"{type(event).__name__} is not an event of {phase}")


def _swap(state: LoopState, trigger: str, messages: tuple[Message, ...]) -> Step:
    tracking = attrs.evolve(state.compact_tracking, last_compact_turn_id=state.query_tracking.chain_id,
                            turns_since_compact=0, compactions=state.compact_tracking.compactions + 1)
    return _move(state, trigger, messages=messages, compact_tracking=tracking)


def retry_trigger(state: LoopState, error: ModelError, fallback_available: bool, limits) -> str | None:
    """The retry edge a failed call takes (``stream_retry`` / ``fallback_retry``), or None when the
    failure is final. Pure; the driver asks it before deciding whether to keep what was streamed, so
    the two can never disagree about which failures are retried."""
    # a stream that broke mid-way is requested again as a whole (its partial blocks discarded)
    if error.retryable and state.phase is S and state.stream_retry_count < limits.stream_retries:
        return "stream_retry"
    # the transport's own retries are spent: move down the fallback chain
    if (error.retryable or error.kind == "overloaded") and fallback_available:
        return "fallback_retry"
    return None


def _call_failed(state: LoopState, event: CallFailed, limits) -> Step:
    err = event.error
    retry = retry_trigger(state, err, event.fallback_available, limits)
    if retry == "stream_retry":
        return _move(state, "stream_retry", stream_retry_count=state.stream_retry_count + 1)
    if retry == "fallback_retry":
        return _move(state, "fallback_retry", model_index=state.model_index + 1, stream_retry_count=0)
    if err.kind == "prompt_too_long" and event.compaction is not None:
        if not may_reactive_compact(state):
            raise UndeclaredMove("reactive compaction is not allowed in this state")
        return _swap(attrs.evolve(state, has_attempted_reactive_compact=True), "reactive_compact_retry",
                     event.compaction.messages)
    messages = _with_pair(state.messages, event.partial, event.partial_results)
    return _stop(state, "call_failed", _error_reason(err.kind), err.message, messages)


def _stream_ended(state: LoopState, event: StreamEnded, limits) -> Step:
    resp = event.response
    assistant = resp.as_message()
    if state.stream_retry_count:
        state = attrs.evolve(state, stream_retry_count=0)
    if resp.tool_uses() and (resp.usable_tool_uses() or resp.stop_reason != "tool_use"):
        return _move(state, "dispatch")
    if resp.stop_reason in ("max_tokens", "model_context_window_exceeded"):
        if state.max_output_tokens_recovery_count < limits.max_output_tokens_recoveries:
            kept = (assistant,) if assistant.content else ()
            return _move(state, "max_output_tokens_recovery",
                         messages=(*state.messages, *kept, prompts.meta_message(prompts.MAX_TOKENS_RESUME)),
                         max_output_tokens_recovery_count=state.max_output_tokens_recovery_count + 1)
        kept_msgs = (*state.messages, assistant) if assistant.content else state.messages
        return _stop(state, "recovery_exhausted", T.API_ERROR,
                     prompts.MAX_TOKENS_EXHAUSTED.format(n=limits.max_output_tokens), kept_msgs)
    if resp.stop_reason == "tool_use":
        # clean retry: the failed assistant message is dropped, never sent back
        if state.malformed_tool_use_retry_count < limits.malformed_tool_use_retries:
            return _move(state, "malformed_tool_use_retry",
                         messages=(*state.messages, prompts.meta_message(prompts.MALFORMED_TOOL_USE_RETRY)),
                         malformed_tool_use_retry_count=state.malformed_tool_use_retry_count + 1)
        return _stop(state, "recovery_exhausted", T.MALFORMED_TOOL_USE_EXHAUSTED,
                     "The model kept ending with stop_reason tool_use without a complete tool_use block.")
    if not resp.visible_text() and resp.has_thinking() and not state.thinking_only_nudged \
            and limits.thinking_only_nudges > 0:
        # the thinking-only answer is dropped (the reference client re-asks without it)
        return _move(state, "thinking_only_nudge",
                     messages=(*state.messages, prompts.meta_message(prompts.THINKING_ONLY_NUDGE)),
                     thinking_only_nudged=True)
    if event.structured_output_required:
        if state.structured_output_retry_count < limits.structured_output_retries:
            kept = (assistant,) if assistant.content else ()
            return _move(state, "structured_output_retry",
                         messages=(*state.messages, *kept,
                                   prompts.meta_message(prompts.STRUCTURED_OUTPUT_RETRY)),
                         structured_output_retry_count=state.structured_output_retry_count + 1)
        return _stop(state, "recovery_exhausted", T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED,
                     f"No valid structured output after {limits.structured_output_retries} retries.",
                     (*state.messages, assistant) if assistant.content else state.messages)
    messages = (*state.messages, assistant) if assistant.content else state.messages
    return _stop(state, "end_turn", T.COMPLETED, None, messages)


def _stop_hooks(state: LoopState, verdict: StopHookVerdict, limits) -> Step:
    if state.terminal_reason is not T.COMPLETED:
        raise UndeclaredMove("Stop hooks run only after a completed end of turn")
    if verdict.prevented:
        return _stop(state, "settle", T.STOP_HOOK_PREVENTED, verdict.stop_reason)
    if not verdict.blocked:
        raise UndeclaredMove("a Stop hook verdict that neither blocks nor prevents moves nothing")
    if limits.max_turns is not None and state.turn_count + 1 > limits.max_turns:
        return _stop(state, "settle", T.MAX_TURNS, f"Reached maximum number of turns ({limits.max_turns})")
    if state.stop_hook_blocking_count >= limits.stop_hook_block_cap:
        return _stop(state, "settle", T.COMPLETED,
                     prompts.STOP_HOOK_CAP_WARNING.format(n=state.stop_hook_blocking_count))
    return _move(state, "stop_hook_blocking",
                 messages=(*state.messages, prompts.stop_hook_feedback(verdict.reason)),
                 stop_hook_active=True,
                 stop_hook_blocking_count=state.stop_hook_blocking_count + 1,
                 turn_count=state.turn_count + 1)


def _after_batch(state: LoopState, event: ToolsDrained, limits) -> Step:
    if event.aborted:
        return _stop(state, "finish_batch", T.ABORTED_TOOLS, "Request interrupted by user for tool use")
    if event.deferred:
        return _stop(state, "finish_batch", T.TOOL_DEFERRED, "A tool call was deferred by a PreToolUse hook")
    if event.hook_stopped:
        return _stop(state, "finish_batch", T.HOOK_STOPPED, event.hook_stop_reason or None)
    if event.ends_turn:
        return _stop(state, "finish_batch", T.COMPLETED)
    if event.post_batch_blocked:
        return _stop(state, "finish_batch", T.HOOK_STOPPED, event.post_batch_reason or None)
    # A StructuredOutput call whose input failed the schema is a structured-output retry like an
    # answer without the call: it counts towards the same cap instead of resetting it, or a model
    # that keeps sending invalid output would loop until max_turns.
    structured_failed = _structured_output_failed(event)
    if structured_failed and state.structured_output_retry_count >= limits.structured_output_retries:
        return _stop(state, "finish_batch", T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED,
                     f"No valid structured output after {limits.structured_output_retries} retries.")
    if limits.max_turns is not None and state.turn_count + 1 > limits.max_turns:
        return _stop(state, "finish_batch", T.MAX_TURNS,
                     f"Reached maximum number of turns ({limits.max_turns})")
    tracking = state.compact_tracking
    return _move(
        state, "next_turn",
        turn_count=state.turn_count + 1,
        max_output_tokens_recovery_count=0,
        malformed_tool_use_retry_count=0,
        structured_output_retry_count=state.structured_output_retry_count + 1 if structured_failed else 0,
        has_attempted_reactive_compact=False,
        thinking_only_nudged=False,
        stop_hook_blocking_count=0,
        compact_tracking=CompactTracking(
            last_compact_turn_id=tracking.last_compact_turn_id,
            turns_since_compact=tracking.turns_since_compact + 1,
            consecutive_failures=tracking.consecutive_failures,
            rapid_refill_count=tracking.rapid_refill_count,
            compactions=tracking.compactions),
    )


def _structured_output_failed(event: ToolsDrained) -> bool:
    calls = {b["id"] for b in event.assistant.content
             if b.get("type") == "tool_use" and b.get("name") == STRUCTURED_OUTPUT_TOOL}
    return any(b.get("is_error") for b in event.results.content
               if b.get("type") == "tool_result" and b.get("tool_use_id") in calls)


# --- the runtime machine -----------------------------------------------------------------------


def machine_spec() -> dict[str, object]:
    """Keyword arguments for ``transitions.Machine``, derived from :data:`EDGES`."""
    return {
        "states": [p.value for p in STATES],
        "transitions": [
            {"trigger": e.trigger, "source": [s.value for s in e.sources], "dest": e.dest.value}
            for e in EDGES
        ],
        "initial": A.value,
        "auto_transitions": False,
        "ignore_invalid_triggers": False,
    }


class _Cursor:
    """The model object ``transitions`` moves; it holds only the current state name."""

    state: str


class LoopMachine:
    """One session's runtime machine. :meth:`apply` is the only way the loop state changes phase:
    the step's trigger is fired on a plain synchronous ``transitions.Machine`` built from
    :data:`EDGES`, so a move the graph does not declare raises :class:`UndeclaredMove` even if a rule
    above were wrong. (Building one costs ~0.45 ms per session and firing ~12 µs per move — small
    beside a turn; see ``bench/overhead.py``.)"""

    def __init__(self, state: LoopState) -> None:
        self._cursor = _Cursor()
        spec = machine_spec()
        spec["initial"] = state.phase.value
        Machine(model=self._cursor, **spec)  # type: ignore[arg-type]
        self.state = state

    @property
    def phase(self) -> Phase:
        return Phase(self._cursor.state)

    def apply(self, step: Step) -> LoopState:
        edge = EDGES_BY_TRIGGER.get(step.trigger)
        if edge is None:
            raise UndeclaredMove(f"no edge is declared for trigger {step.trigger!r}")
        if step.state.phase is not edge.dest:
            raise UndeclaredMove(f"{step.trigger} must lead to {edge.dest}, not {step.state.phase}")
        try:
            getattr(self._cursor, step.trigger)()
        except MachineError as exc:
            raise UndeclaredMove(f"{step.trigger} is not declared from {self._cursor.state}: "
                                 f"{exc.value}") from None
        self.state = step.state
        return step.state

    def step(self, event: Event, limits) -> tuple[Step, LoopState]:
        step = decide(self.state, event, limits)
        return step, self.apply(step)
