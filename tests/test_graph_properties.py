"""The routes table against an executable statement of docs/behaviour.md §2-§3, over generated moves.

:func:`expected` below says, for any state, event and limits, which edge the loop takes and what the
next state record is — written from the behaviour contract, rule by rule, independently of
``fsm/machine/graph.py``'s guards and effects. The properties draw states whose counters sit on both sides of
their caps, events of every kind (including the ones a phase must refuse) and small limits, and
compare every move of :func:`agentfsm.machine.graph.advance` with it field by field: the edge, every counter
and flag of the snapshot, the terminal reason and its detail, compaction and query tracking, the tool
context, the conversation, the notices. So each guard is checked at its boundary from both sides,
each counter's reset and each edge's terminal reasons on every draw — and a rule added later without
its statement here fails at once.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.auditing import audit
from agentfsm.auditing.audit import RAISED_BY
from agentfsm.machine import graph, prompts
from agentfsm.machine.events import (
    EVENT_TYPES,
    Aborted,
    Assembled,
    CallFailed,
    Compaction,
    ModelError,
    ModelResponse,
    Refused,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    TaskNotified,
    ToolsDrained,
)
from agentfsm.machine.graph import UndeclaredMove
from agentfsm.machine.state import (
    CompactTracking,
    Limits,
    LoopState,
    Message,
    Phase,
    QueryTracking,
    TerminalReason,
    ToolUseContext,
)

T = TerminalReason
A, C, S, D, F, X = Phase.ASSEMBLE, Phase.CALL_MODEL, Phase.STREAM, Phase.DISPATCH_TOOLS, Phase.FEEDBACK, Phase.STOP
EXAMPLES = 60

# --- the statement -----------------------------------------------------------------------------------

# The terminal reasons each edge into stop may carry (docs/behaviour.md §2, "Terminal reasons" and the
# diagram's note at stop).
REASONS: dict[str, frozenset[TerminalReason]] = {
    "setup_failed": frozenset({T.TURN_SETUP_FAILED, T.RAPID_REFILL_BREAKER, T.TOOL_DEFERRED_UNAVAILABLE,
                               T.TOOL_DEFERRED}),
    "prompt_blocked": frozenset({T.HOOK_STOPPED}),
    "refuse": frozenset({T.BLOCKING_LIMIT, T.BUDGET_EXHAUSTED, T.BACKGROUND_REQUESTED}),
    "over_budget": frozenset({T.BUDGET_EXHAUSTED}),
    "call_failed": frozenset({T.API_ERROR, T.MODEL_ERROR, T.PROMPT_TOO_LONG, T.IMAGE_ERROR}),
    "end_turn": frozenset({T.COMPLETED}),
    "recovery_exhausted": frozenset({T.API_ERROR, T.MALFORMED_TOOL_USE_EXHAUSTED,
                                     T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED}),
    "settle": frozenset({T.COMPLETED, T.STOP_HOOK_PREVENTED, T.MAX_TURNS}),
    "finish_batch": frozenset({T.MAX_TURNS, T.ABORTED_TOOLS, T.TOOL_DEFERRED, T.HOOK_STOPPED, T.COMPLETED,
                               T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED}),
    "abort": frozenset({T.ABORTED_STREAMING, T.ABORTED_TOOLS}),
}
DEST: dict[str, Phase] = {
    "call": C, "open_stream": S, "dispatch": D, "collect": F, "stream_retry": C, "non_streaming_retry": C,
    "fallback_retry": C,
    **dict.fromkeys(("next_turn", "reactive_compact_retry", "max_output_tokens_recovery",
                     "malformed_tool_use_retry", "thinking_only_nudge", "empty_response_nudge",
                     "structured_output_retry", "refusal_retry",
                     "stop_hook_blocking", "task_notification"), A),
    **dict.fromkeys(REASONS, X),
}
REENTRIES = frozenset(t for t, d in DEST.items() if d is A)
ERROR_REASONS = {"prompt_too_long": T.PROMPT_TOO_LONG, "image": T.IMAGE_ERROR, "model": T.MODEL_ERROR,
                 "stream_garbled": T.MODEL_ERROR}  # what came was not a stream: the model's fault


NOTICE = "notices"  # a rule's key for what the step reports besides the state


class Refusal(Exception):
    """The statement says this event cannot be taken here: the machine must raise UndeclaredMove."""


@attrs.frozen
class Move:
    trigger: str
    state: LoopState
    notices: tuple[str, ...] = ()


def _assistants(messages: tuple[Message, ...]) -> int:
    return sum(m.role == "assistant" for m in messages)


def _visible(blocks: tuple[Any, ...]) -> bool:
    return any(b.get("type") == "text" and b.get("text", "").strip() for b in blocks)


def _dispatchable(r: ModelResponse) -> bool:
    """§3.4: the blocks decide, not stop_reason — a call with broken JSON is dispatched too (answered
    with an input-validation error, as Claude Code does); only tool_use without any call is malformed."""
    return any(b.get("type") == "tool_use" for b in r.blocks)


def _kept(s: LoopState, r: ModelResponse, *extra: Message) -> tuple[Message, ...]:
    return (*s.messages, *((r.as_message(),) if r.blocks else ()), *extra)


def _paired(messages: tuple[Message, ...], e: CallFailed | Aborted, reason: str) -> tuple[Message, ...]:
    """§3.6: what a cut-off response showed stays in the history, every call it showed answered: by
    its finished result, else by a synthetic error for ``reason``."""
    if not e.shown:
        return messages
    partial = Message("assistant", e.shown, kind="assistant")
    ids = [b["id"] for b in e.shown if b.get("type") == "tool_use"]
    if not ids:
        return (*messages, partial)
    done = {b["tool_use_id"]: b for b in e.finished}
    results = tuple(done[i] if i in done else prompts.synthetic_block(i, reason) for i in ids)
    return (*messages, partial, Message("user", results, kind="tool_results"))


def _turn_cap(s: LoopState, lim: Limits) -> bool:
    return lim.max_turns is not None and s.turn_count + 1 > lim.max_turns


def _compacted(s: LoopState, *, rapid_count: int | None) -> CompactTracking:
    t = s.compact_tracking
    changes: dict[str, Any] = {"last_compact_turn_id": s.query_tracking.chain_id, "turns_since_compact": 0,
                               "compactions": t.compactions + 1}
    if rapid_count is not None:  # auto-compaction also closes the failure streak
        changes |= {"consecutive_failures": 0, "rapid_refill_count": rapid_count}
    return attrs.evolve(t, **changes)


def _structured_failed(e: ToolsDrained) -> bool:
    return any(b.get("type") == "tool_result" and b.get("is_error") and b.get("tool_use_id") in e.structured_output_ids
               for b in e.results.content)


def _lone_deferral(e: ToolsDrained) -> bool:
    ids = e.assistant.tool_use_ids()
    return len(ids) == 1 and ids[0] in e.deferred_ids


def _assemble(s: LoopState, e: Any, lim: Limits) -> tuple[str, dict[str, Any]]:
    if isinstance(e, SetupFailed):
        return ("prompt_blocked" if e.reason is T.HOOK_STOPPED else "setup_failed"), \
            {"terminal_reason": e.reason, "terminal_detail": e.detail}
    t = s.compact_tracking
    rapid = t.compactions > 0 and t.turns_since_compact < lim.rapid_refill_turns
    if e.compaction is not None and rapid and t.rapid_refill_count + 1 >= lim.rapid_refill_max:
        tracking = _compacted(s, rapid_count=t.rapid_refill_count + 1)
        return "setup_failed", {"compact_tracking": tracking, "terminal_reason": T.RAPID_REFILL_BREAKER,
                                "terminal_detail": "Context refilled right after compaction "
                                                   f"{tracking.rapid_refill_count} times in a row; stopping to "
                                                   "avoid thrashing."}
    changes: dict[str, Any] = {"query_tracking": QueryTracking(s.query_tracking.chain_id, s.query_tracking.depth + 1)}
    if e.compaction is not None:
        changes |= {"messages": e.compaction.messages,
                    "compact_tracking": _compacted(s, rapid_count=t.rapid_refill_count + 1 if rapid else 0)}
    elif e.compact_failed:
        changes["compact_tracking"] = attrs.evolve(t, consecutive_failures=t.consecutive_failures + 1)
    return "call", changes


def _call_failed(s: LoopState, e: CallFailed, lim: Limits) -> tuple[str, dict[str, Any]]:
    err = e.error
    # a stream that broke mid-way, or dropped before its first event, is requested again while retries
    # are left; never one that came garbled, and never once the loop fell back to a plain request
    dropped, garbled = err.kind == "stream_dropped", err.kind == "stream_garbled"
    # an overloaded_error or api_error event after complete blocks (Claude Code 2.1.332): a complete call
    # shown runs, as if the response had ended with tool_use; a complete text alone is kept and resumed from
    if s.phase is S and err.kind in ("overloaded", "stream_api_error", "stream_error") \
            and any(b.get("type") == "tool_use" for b in e.shown):
        return "dispatch", {"stream_retry_count": 0, "non_streaming": False}
    if s.phase is S and err.kind in ("overloaded", "stream_api_error"):
        if any(b.get("type") == "text" and str(b.get("text", "")).strip() for b in e.shown) \
                and s.max_output_tokens_recovery_count < lim.max_output_tokens_recoveries:
            return "max_output_tokens_recovery", {
                "stream_retry_count": 0, "non_streaming": False,
                "max_output_tokens_recovery_count": s.max_output_tokens_recovery_count + 1,
                "messages": (*s.messages, Message("assistant", e.shown, kind="assistant"),
                             prompts.meta_message(prompts.MID_STREAM_RESUME))}
    # an SSE error event of another type (Claude Code 2.1.332): asked again only while nothing complete was
    # shown; after a complete block it ends the run, in its generic words
    if err.kind == "stream_error" and e.shown:
        return "call_failed", {"terminal_reason": T.API_ERROR, "terminal_detail": f"API Error: {err.message}",
                               "messages": _paired(s.messages, e, "stream_failed")}
    if (s.phase is S or dropped) and err.retryable and not garbled and not s.non_streaming \
            and s.stream_retry_count < lim.stream_retries:
        return "stream_retry", {"stream_retry_count": s.stream_retry_count + 1}
    # still dropping, or garbled: once more without streaming, when the client can
    if (dropped or garbled) and not s.non_streaming and e.non_streaming_available:
        return "non_streaming_retry", {"non_streaming": True}
    if (err.retryable or err.kind == "overloaded") and e.fallback_available:
        return "fallback_retry", {"model_index": s.model_index + 1, "stream_retry_count": 0, "non_streaming": False}
    if err.kind == "prompt_too_long" and e.compaction is not None and not s.has_attempted_reactive_compact \
            and _assistants(s.messages) > 0:
        return "reactive_compact_retry", {"has_attempted_reactive_compact": True, "messages": e.compaction.messages,
                                          "compact_tracking": _compacted(s, rapid_count=None)}
    return "call_failed", {"terminal_reason": ERROR_REASONS.get(err.kind, T.API_ERROR),
                           "terminal_detail": _failure_text(s, err, e.compaction_failure),
                           "messages": _paired(s.messages, e, "stream_failed")}


def _failure_text(s: LoopState, err: ModelError, compaction_failure: str = "") -> str:
    """The API's message; a prompt too long before any response (nothing to compact) in Claude Code 2.1.332's
    words, with the sizes when the API's message states them; a prompt too long whose compaction failed
    names why (Claude Code 2.1.332)."""
    if err.kind == "image" and err.status == 413:  # request_too_large, in Claude Code 2.1.332's words
        return prompts.request_too_large(str(err.message))
    if err.kind == "stream_error":
        return f"API Error: {err.message}"
    if err.kind == "prompt_too_long" and _assistants(s.messages) > 0 and compaction_failure:
        return f"Prompt is too long \u00b7 automatic compaction failed: {compaction_failure}"
    if err.kind != "prompt_too_long" or _assistants(s.messages) > 0:
        return err.message
    sizes = re.search(r"(\d+) tokens > (\d+)", err.message)
    if sizes is None:
        return prompts.PTL_SINGLE_EXCHANGE
    return prompts.PTL_SINGLE_EXCHANGE_SIZED.format(request=sizes.group(1), limit=sizes.group(2),
                                                    conversation=prompts.rough_tokens(s.messages))


def _stream_ended(s: LoopState, e: StreamEnded, lim: Limits) -> tuple[str, dict[str, Any]]:
    trigger, changes = _response_rule(s, e, lim)
    # a stream that ended closes its retries, and the next request streams again
    return trigger, {"stream_retry_count": 0, "non_streaming": False, **changes}


def _response_rule(s: LoopState, e: StreamEnded, lim: Limits) -> tuple[str, dict[str, Any]]:
    r = e.response
    if lim.max_budget_usd is not None and e.cost_usd >= lim.max_budget_usd:
        # over budget once the response is paid for: it is kept, its calls that finished while it streamed
        # keep their results, the others never run (each answered as not run), and the run ends, whatever
        # the response was (Claude Code 2.1.332)
        ids = [b["id"] for b in r.blocks if b.get("type") == "tool_use"]
        done = {b["tool_use_id"]: b for b in e.finished}
        closed = (Message("user", tuple(done[i] if i in done else prompts.synthetic_block(i, "budget_exhausted")
                                        for i in ids), kind="tool_results"),) if ids else ()
        return "over_budget", {"messages": _kept(s, r, *closed), "terminal_reason": T.BUDGET_EXHAUSTED,
                               "terminal_detail": f"Reached maximum budget (${lim.max_budget_usd:g})"}
    if r.stop_reason == "refusal":
        # a safety classifier stopped the response, whatever it showed: once per run it is kept, its calls
        # answered without running on (a started one "Interrupted", the others "Not run") and the model
        # asked again; refused again, the run ends api_error and the response is not kept (Claude Code 2.1.332)
        if s.refusal_retry_count < lim.refusal_retries:
            ids = [b["id"] for b in r.blocks if b.get("type") == "tool_use"]
            started = set(e.started) & set(ids)
            results = tuple(prompts.synthetic_block(i, "refusal_interrupted" if i in started else "refusal_not_run")
                            for i in ids)
            reminder = prompts.meta_message(prompts.REFUSAL_RETRY + (prompts.REFUSAL_RETRY_STARTED if started else ""))
            paired = (Message("user", results, kind="tool_results"),) if ids else ()
            return "refusal_retry", {"messages": _kept(s, r, *paired, reminder),
                                     "refusal_retry_count": s.refusal_retry_count + 1}
        return "recovery_exhausted", {"terminal_reason": T.API_ERROR,
                                      "terminal_detail": prompts.refusal_exhausted(r.model, r.request_id, r.message_id)}
    if _dispatchable(r):
        return "dispatch", {}
    if r.stop_reason in ("max_tokens", "model_context_window_exceeded"):
        if s.max_output_tokens_recovery_count < lim.max_output_tokens_recoveries:
            # a cut answer with nothing visible (thinking only) is dropped before the reminder
            resume = prompts.meta_message(prompts.MAX_TOKENS_RESUME)
            shown = _visible(r.blocks) or any(b.get("type") == "tool_use" for b in r.blocks)
            return "max_output_tokens_recovery", {
                "messages": _kept(s, r, resume) if shown else (*s.messages, resume),
                "max_output_tokens_recovery_count": s.max_output_tokens_recovery_count + 1}
        return "recovery_exhausted", {"messages": _kept(s, r), "terminal_reason": T.API_ERROR,
                                      "terminal_detail": prompts.MAX_TOKENS_EXHAUSTED.format(n=lim.max_output_tokens)}
    if r.stop_reason == "tool_use":
        if s.malformed_tool_use_retry_count < lim.malformed_tool_use_retries:
            return "malformed_tool_use_retry", {
                "messages": (*s.messages, prompts.meta_message(prompts.MALFORMED_TOOL_USE_RETRY)),
                "malformed_tool_use_retry_count": s.malformed_tool_use_retry_count + 1}
        return "recovery_exhausted", {
            "terminal_reason": T.MALFORMED_TOOL_USE_EXHAUSTED,
            "terminal_detail": prompts.MALFORMED_TOOL_USE_EXHAUSTED}
    thinking = any(b.get("type") in ("thinking", "redacted_thinking") for b in r.blocks)
    # one nudge per turn for an answer without visible output, thinking-only or empty
    nudged = s.thinking_only_nudged or s.empty_response_nudged
    if not _visible(r.blocks) and thinking and not nudged and lim.thinking_only_nudges > 0:
        return "thinking_only_nudge", {"messages": (*s.messages, prompts.meta_message(prompts.EMPTY_RESPONSE_NUDGE)),
                                       "thinking_only_nudged": True}
    empty = not _visible(r.blocks) and not thinking and not any(b.get("type") == "tool_use" for b in r.blocks)
    if empty and not nudged and lim.empty_response_nudges > 0:
        # the empty answer is dropped; one nudge per turn asks for a visible one
        return "empty_response_nudge", {"messages": (*s.messages, prompts.meta_message(prompts.EMPTY_RESPONSE_NUDGE)),
                                        "empty_response_nudged": True}
    if e.json_schema and not e.structured_output_ids:
        detail = f"No valid structured output after {lim.structured_output_retries} retries."
        if s.structured_output_retry_count < lim.structured_output_retries:
            return "structured_output_retry", {
                "messages": _kept(s, r, prompts.meta_message(prompts.STRUCTURED_OUTPUT_RETRY, plain=True)),
                "structured_output_retry_count": s.structured_output_retry_count + 1}
        return "recovery_exhausted", {"messages": _kept(s, r), "terminal_reason": T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED,
                                      "terminal_detail": detail}
    # an empty final answer without blocks is kept as an empty text, so the result is "" (§3.4)
    blank = (Message("assistant", ({"type": "text", "text": ""},), kind="assistant"),) if empty and not r.blocks else ()
    return "end_turn", {"messages": (*_kept(s, r), *blank), "terminal_reason": T.COMPLETED, "terminal_detail": None,
                        "stop_hooks_due": True}


def _aborted(s: LoopState, e: Aborted, _lim: Limits) -> tuple[str, dict[str, Any]]:
    reason = T.ABORTED_TOOLS if s.phase is D else T.ABORTED_STREAMING
    tools = reason is T.ABORTED_TOOLS or any(b.get("type") == "tool_use" for b in e.shown)
    marker = prompts.interrupt_marker(prompts.INTERRUPTED_TOOLS if tools else prompts.INTERRUPTED)
    return "abort", {"terminal_reason": reason, "terminal_detail": e.detail,
                     "messages": (*_paired(s.messages, e, "user_interrupted"), marker)}


def _collect(s: LoopState, e: ToolsDrained, _lim: Limits) -> tuple[str, dict[str, Any]]:
    results = attrs.evolve(e.results, kind="deferred_tool_results" if _lone_deferral(e) else "tool_results")
    return "collect", {"messages": (*s.messages, e.assistant, results),
                       "tool_use_context": attrs.evolve(s.tool_use_context,
                                                        layers={**s.tool_use_context.layers, **e.context_layers})}


def _feedback(s: LoopState, e: ToolsDrained, lim: Limits) -> tuple[str, dict[str, Any]]:
    """§3.5-6, in this order."""
    def stop(reason: TerminalReason, detail: str | None, **more: Any) -> tuple[str, dict[str, Any]]:
        return "finish_batch", {"terminal_reason": reason, "terminal_detail": detail, **more}

    if e.aborted:
        return stop(T.ABORTED_TOOLS, "Request interrupted by user for tool use",
                    messages=(*s.messages, prompts.interrupt_marker(prompts.INTERRUPTED_TOOLS)))
    if _lone_deferral(e):
        return stop(T.TOOL_DEFERRED, "A tool call was deferred by a PreToolUse hook")
    if e.hook_stopped:
        return stop(T.HOOK_STOPPED, e.hook_stop_reason or None)
    if e.ends_turn:
        return stop(T.COMPLETED, None)
    if e.post_batch_blocked:
        return stop(T.HOOK_STOPPED, e.post_batch_reason or None)
    failed = _structured_failed(e)
    if failed and s.structured_output_retry_count >= lim.structured_output_retries:
        return stop(T.STRUCTURED_OUTPUT_RETRY_EXHAUSTED,
                    f"No valid structured output after {lim.structured_output_retries} retries.")
    if _turn_cap(s, lim):
        return stop(T.MAX_TURNS, f"Reached maximum number of turns ({lim.max_turns})")
    t = s.compact_tracking
    # §2: a normal next turn resets the recovery counters, the reactive-compaction and nudge flags and
    # the Stop-hook block count; an invalid StructuredOutput call counts towards its cap instead
    return "next_turn", {
        "turn_count": s.turn_count + 1, "max_output_tokens_recovery_count": 0, "malformed_tool_use_retry_count": 0,
        "structured_output_retry_count": s.structured_output_retry_count + 1 if failed else 0,
        "has_attempted_reactive_compact": False, "thinking_only_nudged": False, "empty_response_nudged": False,
        "stop_hook_blocking_count": 0,
        # stop_hook_active stays: once a Stop hook blocked, it is set for the rest of the run
        "compact_tracking": attrs.evolve(t, turns_since_compact=t.turns_since_compact + 1)}


def _stop_hooks(s: LoopState, e: StopHookVerdict, lim: Limits) -> tuple[str, dict[str, Any]]:
    if not s.stop_hooks_due:
        raise Refusal("the Stop hooks ran already")
    if e.prevented:
        return "settle", {"terminal_reason": T.STOP_HOOK_PREVENTED, "terminal_detail": e.stop_reason or None,
                          "stop_hooks_due": False}
    # a hook's additionalContext keeps the loop going like a block does (shown to the model, same cap)
    goes_on = e.blocked or len(e.context) > 0
    if goes_on and _turn_cap(s, lim):  # max_turns wins over the block
        return "settle", {"terminal_reason": T.MAX_TURNS, "stop_hooks_due": False,
                          "terminal_detail": f"Reached maximum number of turns ({lim.max_turns})"}
    if goes_on and s.stop_hook_blocking_count >= lim.stop_hook_block_cap:
        warning = prompts.STOP_HOOK_CAP_WARNING.format(n=s.stop_hook_blocking_count + 1)
        return "settle", {"terminal_reason": T.COMPLETED, "stop_hooks_due": False, "terminal_detail": warning,
                          NOTICE: (warning,)}  # the override is reported as a warning of the result
    if goes_on:
        texts = ([f"Stop hook feedback:\n{e.reason}"] if e.blocked else []) + [
            f"Stop hook additional context: {c}" for c in e.context]
        shown = Message("user", tuple({"type": "text", "text": f"<system-reminder>\n{t}\n</system-reminder>"}
                                      for t in texts), kind="hook_feedback")
        return "stop_hook_blocking", {"messages": (*s.messages, shown),
                                      "stop_hook_active": True, "turn_count": s.turn_count + 1, "stop_hooks_due": False,
                                      "stop_hook_blocking_count": s.stop_hook_blocking_count + 1}
    return "settle", {"stop_hooks_due": False}


def _task_notified(s: LoopState, e: TaskNotified, lim: Limits) -> tuple[str, dict[str, Any]]:
    # a run that ended any way but interrupted or moved to the background by its host goes on when its
    # background work reports (Claude Code 2.1.332: completed, API errors, max_turns even with no turn
    # left, the budget, hooks' `continue: false`, a deferred call, structured output exhausted), once its
    # Stop hooks have run; the notifications join the history and a new pass starts: the per-turn counters
    # and flags start over, stop_hook_active too, and the pass counts its own turns from the first
    if s.stop_hooks_due:
        raise Refusal("the Stop hooks have not run yet")
    if s.terminal_reason in (T.ABORTED_STREAMING, T.ABORTED_TOOLS, T.BACKGROUND_REQUESTED):
        raise Refusal(f"a run that ended {s.terminal_reason} is not continued by a notification")
    t = s.compact_tracking
    # (marked as the notifications that started a pass: they go as a message of their own)
    notes = tuple(attrs.evolve(m, kind="task_notification_pass") for m in e.notifications)
    return "task_notification", {
        "messages": (*s.messages, *notes), "turn_count": 1,
        "max_output_tokens_recovery_count": 0, "malformed_tool_use_retry_count": 0,
        "structured_output_retry_count": 0, "has_attempted_reactive_compact": False, "thinking_only_nudged": False,
        "empty_response_nudged": False, "stop_hook_blocking_count": 0, "stop_hook_active": False,
        "compact_tracking": attrs.evolve(t, turns_since_compact=t.turns_since_compact + 1)}


RULES: dict[tuple[Phase, type], Callable[[LoopState, Any, Limits], tuple[str, dict[str, Any]]]] = {
    (A, SetupFailed): _assemble, (A, Assembled): _assemble,
    (C, Refused): lambda s, e, lim: ("refuse", {"terminal_reason": e.reason, "terminal_detail": e.detail}),
    (C, StreamOpened): lambda s, e, lim: ("open_stream", {"messages": s.messages + e.sent_input}),
    (C, CallFailed): _call_failed, (S, CallFailed): _call_failed,
    (S, StreamEnded): _stream_ended,
    (D, ToolsDrained): _collect, (F, ToolsDrained): _feedback,
    (X, StopHookVerdict): _stop_hooks, (X, TaskNotified): _task_notified,
    **{(p, Aborted): _aborted for p in (A, C, S, D)},
}


def expected(state: LoopState, event: Any, limits: Limits) -> list[Move]:
    """Every move ``event`` causes from ``state``, per the statement; raises :class:`Refusal`."""
    moves = []
    while True:
        rule = RULES.get((state.phase, type(event)))
        if rule is None:
            raise Refusal(f"{type(event).__name__} in {state.phase.value}")
        trigger, changes = rule(state, event, limits)
        if DEST[trigger] is A:  # a re-entry records its label and forgets how the previous run ended
            changes = {"transition": trigger, "terminal_reason": None, "terminal_detail": None, **changes}
        if DEST[trigger] is X and changes.get("terminal_reason", state.terminal_reason) not in REASONS[trigger]:
            raise Refusal(f"{trigger} cannot carry {changes.get('terminal_reason', state.terminal_reason)}")
        notices = changes.pop(NOTICE, ())
        state = attrs.evolve(state, phase=DEST[trigger], **changes)
        moves.append(Move(trigger, state, notices))
        if state.phase is not F:  # only feedback decides on its own, on the same event
            return moves


# --- comparing ---------------------------------------------------------------------------------------


def _messages(state: LoopState) -> list[tuple[str, str, tuple[Any, ...]]]:
    return [(m.role, m.kind, tuple(m.content)) for m in state.messages]


def observable(state: LoopState) -> dict[str, Any]:
    """Everything a move decides (message uuids aside: a new hidden message gets a fresh one)."""
    return {**state.snapshot(), "terminal_reason": state.terminal_reason, "terminal_detail": state.terminal_detail,
            "compact_tracking": state.compact_tracking, "query_tracking": state.query_tracking,
            "layers": dict(state.tool_use_context.layers), "messages": _messages(state)}


def check(state: LoopState, event: Any, limits: Limits) -> list[str]:
    """Compare the machine with the statement on one (state, event, limits); returns the triggers."""
    try:
        want = expected(state, event, limits)
    except Refusal:
        with pytest.raises(UndeclaredMove):
            graph.advance(state, event, limits)
        return []
    got = graph.advance(state, event, limits)
    assert [s.trigger for s in got] == [m.trigger for m in want]
    for step, move in zip(got, want, strict=True):
        assert observable(step.state) == observable(move.state), step.trigger
        assert step.notices == move.notices
        assert step.state.phase is step.edge.dest
        if step.state.phase is X:
            assert step.edge.reasons == REASONS[step.trigger]
            assert step.state.terminal_reason in step.edge.reasons
    assert [s.automatic for s in got] == [False] + [True] * (len(got) - 1)
    return [s.trigger for s in got]


# --- generated states, events and limits -------------------------------------------------------------

TEXT = {"type": "text", "text": "an answer"}
BLANK = {"type": "text", "text": "  \n"}
THINK = {"type": "thinking", "thinking": "hm", "signature": "sig"}
REDACTED = {"type": "redacted_thinking", "data": "xx"}
USE_1 = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a"}}
USE_2 = {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}}
SO = {"type": "tool_use", "id": "so_1", "name": "StructuredOutput", "input": {}}
rarely = st.sampled_from([False, False, False, True])


@st.composite
def limits_st(draw: st.DrawFn) -> Limits:
    return Limits(max_turns=draw(st.one_of(st.none(), st.integers(1, 5))),
                  max_output_tokens_recoveries=draw(st.integers(0, 3)),
                  malformed_tool_use_retries=draw(st.integers(0, 3)),
                  thinking_only_nudges=draw(st.integers(0, 2)),
                  empty_response_nudges=draw(st.integers(0, 2)),
                  stop_hook_block_cap=draw(st.integers(0, 3)),
                  structured_output_retries=draw(st.integers(0, 3)),
                  stream_retries=draw(st.integers(0, 3)),
                  rapid_refill_turns=draw(st.integers(0, 3)),
                  rapid_refill_max=draw(st.integers(1, 3)),
                  max_output_tokens=draw(st.integers(1, 64_000)),
                  max_budget_usd=draw(st.sampled_from([None, None, 1.0])))


def near(cap: int | None) -> st.SearchStrategy[int]:
    """A counter on either side of its cap (or anywhere small)."""
    if cap is None:
        return st.integers(0, 5)
    return st.one_of(st.integers(max(0, cap - 1), cap + 1), st.integers(0, 4))


def conversation(exchanges: int) -> tuple[Message, ...]:
    out = [Message("user", "q0")]
    for i in range(exchanges):
        out += [Message("assistant", ({"type": "text", "text": f"a{i}"},), kind="assistant"),
                Message("user", f"q{i + 1}")]
    return tuple(out)


@st.composite
def state_st(draw: st.DrawFn, phase: Phase, lim: Limits) -> LoopState:
    at_stop = phase is X
    due = draw(st.booleans()) if at_stop else False
    # Stop hooks are due after end_turn (completed); a state the auditor restores from a trace may carry
    # any reason settle allows; a stale reason is possible in a running phase
    reason = (draw(st.sampled_from([T.COMPLETED, *sorted(REASONS["settle"])])) if due
              else draw(st.sampled_from(list(T)))) if at_stop else \
        draw(st.one_of(st.none(), st.none(), st.sampled_from(list(T))))
    tracking = CompactTracking(last_compact_turn_id=draw(st.sampled_from([None, "chain-old"])),
                               turns_since_compact=draw(st.integers(0, 4)),
                               consecutive_failures=draw(st.integers(0, 3)),
                               rapid_refill_count=draw(near(lim.rapid_refill_max)),
                               compactions=draw(st.integers(0, 3)))
    return LoopState(
        messages=conversation(draw(st.integers(0, 3))), phase=phase,
        tool_use_context=ToolUseContext(layers=draw(st.sampled_from([{}, {"memory": "old"}]))),
        compact_tracking=tracking, query_tracking=QueryTracking("chain-now", draw(st.integers(-1, 3))),
        turn_count=draw(near(lim.max_turns).map(lambda n: max(1, n))),
        max_output_tokens_recovery_count=draw(near(lim.max_output_tokens_recoveries)),
        malformed_tool_use_retry_count=draw(near(lim.malformed_tool_use_retries)),
        structured_output_retry_count=draw(near(lim.structured_output_retries)),
        stream_retry_count=draw(near(lim.stream_retries)),
        model_index=draw(st.integers(0, 2)),
        has_attempted_reactive_compact=draw(st.booleans()),
        thinking_only_nudged=draw(st.booleans()),
        empty_response_nudged=draw(st.booleans()),
        non_streaming=draw(st.booleans()),
        stop_hook_active=draw(st.booleans()),
        stop_hook_blocking_count=draw(near(lim.stop_hook_block_cap)),
        stop_hooks_due=due,
        transition=draw(st.sampled_from([None, "next_turn", "stop_hook_blocking"])),
        terminal_reason=reason,
        terminal_detail="earlier detail" if reason is not None else None,
    )


compaction_st = st.builds(Compaction, messages=st.just((Message("user", "summary", kind="compact_summary"),
                                                        Message("user", "q-last"))),
                          trigger=st.sampled_from(["auto", "reactive"]))
KINDS = ["prompt_too_long", "image", "api", "model", "overloaded", "connection", "stream_api_error", "stream_error",
         "stream_dropped",
         "stream_garbled"]
errors = st.builds(ModelError, kind=st.sampled_from(KINDS),
                   message=st.sampled_from(["boom", "prompt is too long"]),
                   status=st.sampled_from([None, 400, 413, 529]), retryable=st.booleans())
RESULT_1 = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}
# what a cut-off response showed (its complete blocks) and the results of its calls that finished
shown_facts = st.sampled_from([
    ((), ()),
    ((TEXT,), ()),
    ((TEXT, USE_1), (RESULT_1,)),
    ((TEXT, USE_1), ()),  # a call shown, not finished: the move pairs it
    ((USE_1, USE_2), (RESULT_1,)),
])


@st.composite
def call_failed_st(draw: st.DrawFn) -> CallFailed:
    shown, finished = draw(shown_facts)
    return CallFailed(draw(errors), compaction=draw(st.one_of(st.none(), compaction_st)),
                      fallback_available=draw(st.booleans()), non_streaming_available=draw(st.booleans()),
                      shown=shown, finished=finished,
                      compaction_failure=draw(st.sampled_from(["", "summarization produced empty response"])))


@st.composite
def aborted_st(draw: st.DrawFn) -> Aborted:
    shown, finished = draw(shown_facts)
    return Aborted(shown=shown, finished=finished, detail=draw(st.sampled_from(["Interrupted", "stop"])))


def _blocks(*pools: list[dict[str, Any]]) -> st.SearchStrategy[tuple[dict[str, Any], ...]]:
    """Blocks drawn from each pool in turn (each pool gives zero or one block), in a drawn order."""
    return st.tuples(*(st.sampled_from([None, *pool]) for pool in pools)).flatmap(
        lambda picked: st.permutations([b for b in picked if b is not None])).map(tuple)


# Responses by the rule they should meet (§3.4), and a few of anything: calls, calls whose JSON broke,
# a cut answer, only thinking, a plain answer.
_SHAPES = st.one_of(
    st.tuples(_blocks([USE_1, SO], [USE_2], [TEXT, THINK]), st.sampled_from(["tool_use", "end_turn", "max_tokens"])),
    st.tuples(_blocks([USE_2], [TEXT, BLANK, THINK]), st.just("tool_use")),
    st.tuples(_blocks([TEXT, BLANK], [THINK, REDACTED]), st.sampled_from(["max_tokens",
                                                                           "model_context_window_exceeded"])),
    st.tuples(_blocks([THINK, REDACTED], [BLANK]), st.sampled_from(["end_turn", "stop_sequence", None])),
    st.tuples(_blocks([TEXT], [THINK, BLANK, SO]), st.sampled_from(["end_turn", "stop_sequence", None])),
    st.tuples(_blocks([BLANK]), st.sampled_from(["end_turn", "stop_sequence", None])),  # an empty answer
    st.tuples(_blocks([TEXT, BLANK, THINK, REDACTED, USE_1, USE_2, SO]),
              st.sampled_from(["end_turn", "tool_use", "max_tokens", "model_context_window_exceeded", None])),
    st.tuples(_blocks([TEXT, BLANK, THINK], [USE_1], [USE_2]), st.just("refusal")),
)


@st.composite
def stream_ended_st(draw: st.DrawFn) -> StreamEnded:
    blocks, stop_reason = draw(_SHAPES)
    invalid = {b["id"]: "{bad" for b in blocks if b.get("id") == "toolu_2"}
    ids = tuple(b["id"] for b in blocks if b.get("name") == "StructuredOutput")
    return StreamEnded(ModelResponse(blocks, stop_reason, invalid_tool_inputs=invalid),
                       json_schema=draw(st.booleans()), structured_output_ids=draw(st.sampled_from([(), ids])),
                       cost_usd=draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
                       started=draw(st.sampled_from([(), (USE_1["id"],), (USE_1["id"], USE_2["id"])])))


@st.composite
def drained_st(draw: st.DrawFn) -> ToolsDrained:
    uses = draw(st.sampled_from([(USE_1,), (USE_1, USE_2), (SO,), (USE_1, SO)]))
    ids = [u["id"] for u in uses]
    results = tuple({"type": "tool_result", "tool_use_id": i, "content": "r", "is_error": draw(st.booleans())}
                    for i in ids)
    return ToolsDrained(
        assistant=Message("assistant", uses, kind="assistant"),
        results=Message("user", results, kind=draw(st.sampled_from(["tool_results", "deferred_tool_results"]))),
        aborted=draw(rarely), deferred_ids=tuple(draw(st.sets(st.sampled_from([*ids, "elsewhere"]), max_size=2))),
        hook_stopped=draw(rarely), hook_stop_reason=draw(st.sampled_from(["", "hook says stop"])),
        ends_turn=draw(rarely), post_batch_blocked=draw(rarely),
        post_batch_reason=draw(st.sampled_from(["", "batch blocked"])),
        context_layers=draw(st.sampled_from([{}, {"memory": "new"}, {"cwd": "/w"}])),
        structured_output_ids=tuple(i for i in ids if i == "so_1"))


verdicts = st.builds(StopHookVerdict, blocked=st.booleans(), reason=st.sampled_from(["", "run the tests"]),
                     prevented=st.sampled_from([False, False, True]), stop_reason=st.sampled_from(["", "enough"]),
                     context=st.sampled_from([(), (), ("lint is red",), ("a", "b\nc")]))
reasons = st.sampled_from(list(T))
NOTE = Message("user", ({"type": "text", "text": "<task-notification>…</task-notification>"},),
               kind="task_notification")
notified = st.builds(TaskNotified, notifications=st.sampled_from([(NOTE,), (NOTE, attrs.evolve(NOTE, uuid="n2"))]))


def reasons_for(*edges: str) -> st.SearchStrategy[TerminalReason]:
    """Mostly a reason the edges allow, sometimes any (which the machine must refuse)."""
    return st.one_of(st.sampled_from(sorted(frozenset().union(*(REASONS[e] for e in edges)))), reasons)


EVENTS: dict[Phase, st.SearchStrategy[Any]] = {
    A: st.one_of(st.builds(Assembled, compaction=st.one_of(st.none(), compaction_st), compact_failed=st.booleans()),
                 st.builds(SetupFailed, reason=reasons_for("setup_failed", "prompt_blocked"),
                           detail=st.just("setup detail"))),
    C: st.one_of(st.builds(Refused, reason=reasons_for("refuse"), detail=st.just("refused detail")),
                 st.builds(StreamOpened, sent_input=st.sampled_from([(), (prompts.queued_input("typed"),)])),
                 call_failed_st(), aborted_st()),
    S: st.one_of(stream_ended_st(), call_failed_st(), aborted_st()),
    D: st.one_of(drained_st(), drained_st(), aborted_st()),
    F: drained_st(),
    X: st.one_of(verdicts, notified),
}
any_event = st.one_of(*EVENTS.values())


def test_the_statement_names_every_edge_and_reason() -> None:
    """The statement and the declaration agree on the shape: every edge with its destination and
    terminal reasons, every handled (phase, event) pair."""
    assert {e.trigger: e.dest for e in graph.EDGES} == DEST
    assert {e.trigger: e.reasons for e in graph.EDGES if e.dest is X} == REASONS
    assert {t for t, d in DEST.items() if d is A} == graph.REENTRY_LABELS
    routed = {(p, r.event) for r in graph.ROUTES for p in r.sources}
    assert routed == set(RULES)
    assert set(graph.REFUSALS) == {(p, ev) for p in Phase for ev in EVENT_TYPES} - set(RULES)


# --- every cap, on both sides, exhaustively -------------------------------------------------------


def base(phase: Phase, **changes: Any) -> LoopState:
    """A state at ``phase`` with a history, an earlier compaction on record and Stop hooks due at stop."""
    due = phase is X
    tracking = CompactTracking(last_compact_turn_id="chain-old", turns_since_compact=2, consecutive_failures=1,
                               rapid_refill_count=1, compactions=1)
    return attrs.evolve(LoopState(messages=conversation(2), phase=phase, stop_hooks_due=due,
                                  terminal_reason=T.COMPLETED if due else None, compact_tracking=tracking,
                                  query_tracking=QueryTracking("chain-now", 0)), **changes)


def _drained(*, failed_structured: bool = False) -> ToolsDrained:
    use = SO if failed_structured else USE_1
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "r", "is_error": failed_structured}
    return ToolsDrained(Message("assistant", (use,), kind="assistant"), Message("user", (result,), kind="tool_results"),
                        structured_output_ids=(SO["id"],) if failed_structured else ())


CUT = ModelResponse((TEXT,), "max_tokens")
# tool_use without any call: the one malformed tool use (a call with broken JSON is dispatched)
MALFORMED = ModelResponse((TEXT,), "tool_use")
BROKE = ModelError("connection", "reset", None, retryable=True)
SUMMARY = Compaction((Message("user", "summary", kind="compact_summary"),), "auto")

# (phase, event, the counter set on the state, the Limits field that caps it)
CAPPED: dict[str, tuple[Phase, Any, str, str]] = {
    "max_tokens": (S, StreamEnded(CUT), "max_output_tokens_recovery_count", "max_output_tokens_recoveries"),
    "context_window_exceeded": (S, StreamEnded(ModelResponse((TEXT,), "model_context_window_exceeded")),
                                "max_output_tokens_recovery_count", "max_output_tokens_recoveries"),
    "malformed": (S, StreamEnded(MALFORMED), "malformed_tool_use_retry_count", "malformed_tool_use_retries"),
    "malformed_without_blocks": (S, StreamEnded(ModelResponse((), "tool_use")), "malformed_tool_use_retry_count",
                                 "malformed_tool_use_retries"),
    "structured_missing": (S, StreamEnded(ModelResponse((TEXT,), "end_turn"), json_schema=True),
                           "structured_output_retry_count", "structured_output_retries"),
    "structured_invalid": (F, _drained(failed_structured=True), "structured_output_retry_count",
                           "structured_output_retries"),
    "stream_retry": (S, CallFailed(BROKE), "stream_retry_count", "stream_retries"),
    "stream_retry_then_fallback": (S, CallFailed(BROKE, fallback_available=True), "stream_retry_count",
                                   "stream_retries"),
    "stop_hook_blocks": (X, StopHookVerdict(blocked=True, reason="again"), "stop_hook_blocking_count",
                         "stop_hook_block_cap"),
    "max_turns_after_tools": (F, _drained(), "turn_count", "max_turns"),
    "max_turns_at_a_stop_hook_block": (X, StopHookVerdict(blocked=True, reason="again"), "turn_count", "max_turns"),
    # a flag, not a counter: one nudge at most, and none when the limit is 0
    "thinking_only": (S, StreamEnded(ModelResponse((THINK, BLANK), "end_turn")), "", "thinking_only_nudges"),
    "empty_answer": (S, StreamEnded(ModelResponse((BLANK,), "end_turn")), "", "empty_response_nudges"),
    "empty_answer_without_blocks": (S, StreamEnded(ModelResponse((), None)), "", "empty_response_nudges"),
    # a connection that closed before the first event is retried from call_model too
    "stream_dropped": (C, CallFailed(ModelError("stream_dropped", "closed", None, retryable=True),
                                     non_streaming_available=True), "stream_retry_count", "stream_retries"),
}


@pytest.mark.parametrize("family", sorted(CAPPED))
def test_every_cap_on_both_sides(family: str) -> None:
    """Each capped move for every cap from 0 (1 where 0 is not a valid limit) to 3 and every counter
    value from 0 to one past the cap: below the cap the loop re-enters (or retries) and counts, at and
    over it the move the statement names for an exhausted cap."""
    phase, event, counter, cap_field = CAPPED[family]
    lowest = 1 if cap_field == "max_turns" else 0
    seen = set()
    for cap in range(lowest, 4):
        for value in range(lowest if counter == "turn_count" else 0, cap + 2):
            for flag in (False, True):
                state = base(phase, **({counter: value} if counter else {}), thinking_only_nudged=flag,
                             empty_response_nudged=flag)
                seen.add(tuple(check(state, event, Limits(**{cap_field: cap}))))
    assert len(seen) >= 2, seen  # both sides of the cap were taken


@pytest.mark.parametrize("exchanges", [0, 1, 2, 3])
@pytest.mark.parametrize("attempted", [False, True])
@pytest.mark.parametrize("phase", [C, S])
def test_reactive_compaction_needs_history_and_happens_once(exchanges: int, attempted: bool, phase: Phase) -> None:
    """A prompt-too-long error is answered by compaction only once the conversation holds a response
    (Claude Code 2.1.332 compacts after one exchange), once per turn, and only when the compaction succeeded."""
    state = base(phase, messages=conversation(exchanges), has_attempted_reactive_compact=attempted)
    ptl = ModelError("prompt_too_long", "prompt is too long", 400)
    for compaction in (None, SUMMARY):
        moved = check(state, CallFailed(ptl, compaction=compaction), Limits())
        assert moved == (["reactive_compact_retry"] if compaction and exchanges > 0 and not attempted
                         else ["call_failed"])


@pytest.mark.parametrize("rapid_max", [1, 2, 3])
@pytest.mark.parametrize("refill_turns", [0, 1, 2, 3])
def test_rapid_refill_on_both_sides(rapid_max: int, refill_turns: int) -> None:
    """A compaction within rapid_refill_turns of the previous one counts as a rapid refill; the
    rapid_refill_max-th in a row trips the breaker; an unhurried one resets the count."""
    lim = Limits(rapid_refill_turns=refill_turns, rapid_refill_max=rapid_max)
    for compactions in (0, 1):
        for since in range(0, refill_turns + 2):
            for count in range(0, rapid_max + 1):
                tracking = CompactTracking(turns_since_compact=since, rapid_refill_count=count, compactions=compactions,
                                           consecutive_failures=2)
                check(base(A, compact_tracking=tracking), Assembled(compaction=SUMMARY), lim)
                check(base(A, compact_tracking=tracking), Assembled(compact_failed=True), lim)


@pytest.mark.parametrize("phase", [C, S])
def test_every_failed_call(phase: Phase) -> None:
    """Every kind of failure, retryable or not, with and without a fallback model, a compaction, history to
    compact, stream retries left: stream retry, then fallback, then reactive compaction, then the error."""
    moved = set()
    for kind, retryable, fallback, compaction, exchanges, attempted, count, plain, plain_left in itertools.product(
            KINDS, [False, True], [False, True], [None, SUMMARY], [1, 2], [False, True], [0, 1, 2],
            [False, True], [False, True]):
        state = base(phase, messages=conversation(exchanges), has_attempted_reactive_compact=attempted,
                     stream_retry_count=count, non_streaming=plain)
        event = CallFailed(ModelError(kind, f"{kind} failed", 500, retryable), compaction=compaction,
                           fallback_available=fallback, non_streaming_available=plain_left)
        moved.update(check(state, event, Limits(stream_retries=1)))
    assert moved == {"call_failed", "fallback_retry", "reactive_compact_retry", "stream_retry", "non_streaming_retry"}


def test_every_kind_of_response() -> None:
    """Every combination of the blocks that matter (an answer, a blank text, thinking, a call, a call whose
    JSON broke, a StructuredOutput call) with every stop reason, with and without --json-schema, each
    recovery counter below and at its cap, the nudge given or not."""
    pool = [TEXT, BLANK, THINK, USE_1, USE_2, SO]
    moved = set()
    for size in range(0, 3):
        for blocks in itertools.combinations(pool, size):
            invalid = {b["id"]: "{bad" for b in blocks if b is USE_2}
            ids = tuple(b["id"] for b in blocks if b is SO)
            for stop_reason in ["end_turn", "tool_use", "max_tokens", "model_context_window_exceeded", None]:
                response = ModelResponse(blocks, stop_reason, invalid_tool_inputs=invalid)
                for schema, at_cap, nudged in itertools.product([False, True], [False, True], [False, True]):
                    n = 1 if at_cap else 0
                    state = base(S, max_output_tokens_recovery_count=n, malformed_tool_use_retry_count=n,
                                 structured_output_retry_count=n, thinking_only_nudged=nudged,
                                 empty_response_nudged=nudged, stream_retry_count=1, non_streaming=True)
                    moved.update(check(state, StreamEnded(response, json_schema=schema, structured_output_ids=ids),
                                       Limits(max_output_tokens_recoveries=1, malformed_tool_use_retries=1,
                                              structured_output_retries=1)))
    assert moved == {"dispatch", "max_output_tokens_recovery", "malformed_tool_use_retry", "thinking_only_nudge",
                     "empty_response_nudge", "structured_output_retry", "recovery_exhausted", "end_turn"}


def test_every_way_a_batch_ends() -> None:
    """Every combination of how a tool batch ended (aborted, a lone or a sibling deferral, a hook stop, a
    result that ends the turn, a PostToolBatch block, a failed StructuredOutput call) on both sides of
    max_turns and of the structured-output cap: the first rule of §3.5-6 that applies decides."""
    moved = set()
    flags = itertools.product([False, True], repeat=4)
    for (aborted, hook_stopped, ends_turn, post_blocked), deferral, failed, turn, count in itertools.product(
            flags, ["none", "lone", "sibling"], [False, True], [1, 2], [0, 1]):
        uses = (USE_1, USE_2) if deferral == "sibling" else (SO,) if failed else (USE_1,)
        results = tuple({"type": "tool_result", "tool_use_id": u["id"], "content": "r", "is_error": failed}
                        for u in uses)
        event = ToolsDrained(Message("assistant", uses, kind="assistant"),
                             Message("user", results, kind="tool_results"), aborted=aborted,
                             deferred_ids=(uses[0]["id"],) if deferral != "none" else (),
                             hook_stopped=hook_stopped, hook_stop_reason="stop" if turn == 1 else "",
                             ends_turn=ends_turn, post_batch_blocked=post_blocked,
                             post_batch_reason="blocked" if turn == 2 else "", context_layers={"k": turn},
                             structured_output_ids=(SO["id"],) if failed else ())
        state = base(D, turn_count=turn, structured_output_retry_count=count, max_output_tokens_recovery_count=1,
                     malformed_tool_use_retry_count=1, has_attempted_reactive_compact=True, thinking_only_nudged=True,
                     stop_hook_blocking_count=1, stop_hook_active=True,
                     tool_use_context=ToolUseContext(layers={"k": 0}))
        moved.update(tuple(check(state, event, Limits(max_turns=2, structured_output_retries=1))))
    assert moved == {"collect", "finish_batch", "next_turn"}


def test_every_stop_hook_verdict() -> None:
    """Every verdict (blocked, prevented, both, neither) before and after the Stop hooks ran, on both
    sides of the block cap and of max_turns."""
    moved = set()
    for blocked, prevented, due, count, turn, max_turns, reason, context in itertools.product(
            [False, True], [False, True], [False, True], [0, 1, 2], [1, 2], [None, 2], sorted(REASONS["settle"]),
            [(), ("read the log",)]):
        # (a state the auditor restores from a trace may carry any reason settle allows)
        state = base(X, stop_hooks_due=due, stop_hook_blocking_count=count, turn_count=turn, terminal_reason=reason)
        verdict = StopHookVerdict(blocked=blocked, reason="again" if blocked else "", prevented=prevented,
                                  stop_reason="enough" if turn == 1 else "", context=context)
        moved.update(check(state, verdict, Limits(stop_hook_block_cap=1, max_turns=max_turns)))
    assert moved == {"settle", "stop_hook_blocking"}


def test_every_notification_after_the_run() -> None:
    """A background task's notification at stop: before and after the Stop hooks ran, after every way
    the run may have ended, on both sides of max_turns; and in every running phase (refused there: the
    notification joins the next request as queued input instead)."""
    moved = set()
    for due, reason, turn, max_turns in itertools.product([False, True], list(T), [1, 2, 3], [None, 2, 3]):
        state = base(X, stop_hooks_due=due, terminal_reason=reason, turn_count=turn, stop_hook_active=True,
                     stop_hook_blocking_count=1, thinking_only_nudged=True)
        moved.update(check(state, TaskNotified((NOTE,)), Limits(max_turns=max_turns)))
    assert moved == {"task_notification"}
    for phase in (A, C, S, D, F):
        assert check(base(phase), TaskNotified((NOTE,)), Limits()) == []


def test_a_guard_is_its_name_and_a_route_its_declaration() -> None:
    """A trace names the guard that fired, so two guards of one name are one guard, and the name is all
    a guard shows of itself; a route is its row (source, event, guard, edge), whatever functions
    compute its effect."""
    assert graph.under_cap("stream_retry_count") == graph.under_cap("stream_retry_count")
    assert graph.Guard("g", lambda *_: True) == graph.Guard("g", lambda *_: False)
    assert repr(graph.Guard("g", lambda *_: True)) == "Guard(name='g')"
    row = ((S,), StreamEnded, graph.Guard("g", lambda *_: True), "end_turn")
    assert graph.Route(*row, lambda *_: {}) == graph.Route(*row, lambda *_: {"x": 1}, lambda *_: ("n",))


# --- the decisions the driver asks before doing I/O ----------------------------------------------


@given(tokens=st.integers(0, 400), window=st.integers(100, 300), buffer=st.integers(0, 100),
       failures=st.integers(0, 4), max_failures=st.integers(1, 3), auto=st.booleans(),
       budget=st.one_of(st.none(), st.sampled_from([0.5, 1.0])), cost=st.sampled_from([0.0, 0.99, 1.0, 1.5]),
       retries=st.sampled_from([0, 1]))
def test_auto_compaction_is_due_over_the_threshold_until_it_failed_too_often_or_the_budget_is_spent(
        tokens: int, window: int, buffer: int, failures: int, max_failures: int, auto: bool,
        budget: float | None, cost: float, retries: int) -> None:
    lim = Limits(context_window=window, auto_compact_buffer=buffer, auto_compact=auto,
                 max_consecutive_compact_failures=max_failures, max_budget_usd=budget)
    state = LoopState(compact_tracking=CompactTracking(consecutive_failures=failures), stream_retry_count=retries)
    # a spent budget refuses the next new request (a stream sent again is not new): no summary before it;
    # the cost exactly at the budget too, on both sides
    for c in (cost, *(() if budget is None else (budget, budget - 0.01))):
        spent = budget is not None and c >= budget and not retries
        for t in (tokens, window - buffer - 1, window - buffer, window - buffer + 1):
            assert graph.should_auto_compact(state, t, lim, cost_usd=c) == (
                auto and t > window - buffer and failures < max_failures and not spent)


@given(background=st.sampled_from([None, False, True, "the host said so"]),
       budget=st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0])), cost=st.sampled_from([0.0, 0.99, 1.0, 1.5]),
       tokens=st.integers(0, 400), window=st.integers(100, 300), buffer=st.integers(0, 100),
       retries=st.sampled_from([None, 0, 1, 2]))
def test_the_preflight_refuses_in_order(background: Any, budget: float | None, cost: float, tokens: int,
                                        window: int, buffer: int, retries: int | None) -> None:
    """Moved to the background, then the budget spent (cost ≥ budget; not for a request sent again after
    its stream broke, which Claude Code 2.1.332 does not check), then over the blocking limit."""
    lim = Limits(max_budget_usd=budget, context_window=window, blocking_buffer=buffer)
    state = None if retries is None else LoopState(phase=C, stream_retry_count=retries)
    # the generated cost, and the cost exactly at the budget and just under it
    for spent, t in itertools.product((cost, *(() if budget is None else (budget, budget - 0.01))),
                                      (tokens, window - buffer, window - buffer + 1)):
        refused = graph.preflight_refusal(background=background, cost_usd=spent, tokens=t, limits=lim, state=state)
        if background:
            assert refused == Refused(T.BACKGROUND_REQUESTED, background if isinstance(background, str)
                                      else "Moved to the background before the next request")
        elif budget is not None and spent >= budget and not retries:
            assert refused == Refused(T.BUDGET_EXHAUSTED, f"Reached maximum budget (${budget:g})")
        elif t > window - buffer:
            assert refused is not None and refused.reason is T.BLOCKING_LIMIT
            assert f"about {t} tokens, over the blocking limit of {window - buffer}." in refused.detail
        else:
            assert refused is None


@given(phase=st.sampled_from(list(Phase)), due=st.booleans())
def test_stop_hooks_are_due_only_at_stop_after_an_answer(phase: Phase, due: bool) -> None:
    assert graph.stop_hooks_are_due(LoopState(phase=phase, stop_hooks_due=due)) == (phase is X and due)


# §3.6, what the client sees of a response that broke off: asked again (a retry, or the history
# compacted) — withdrawn, its calls discarded; the end of the run — kept, every call it showed paired.
WITHDRAWN_BY = frozenset({"stream_retry", "non_streaming_retry", "fallback_retry", "reactive_compact_retry"})


def _agrees(state: LoopState, event: CallFailed | Aborted, lim: Limits) -> str:
    """The consequences the move declares are what it did to the history: a withdrawn response left
    nothing in it, a paired one left its blocks and exactly the results the client is shown."""
    step = graph.advance(state, event, lim)[0]
    does = step.edge.does
    shown_ids = [b["id"] for b in event.shown if b.get("type") == "tool_use"]
    if step.trigger == "dispatch":
        # an error event after a complete call (any SSE error type): the response is kept and its calls run
        # (Claude Code 2.1.332); nothing is closed, withdrawn or paired by the move itself
        assert isinstance(event, CallFailed) and event.error.kind in ("overloaded", "stream_api_error", "stream_error")
        assert does.shown is graph.Shown.KEEP and does.close_calls is None and shown_ids
        assert graph.shown_results(step, event) == () and step.state.messages == state.messages
    elif step.trigger in WITHDRAWN_BY:
        assert does.shown is graph.Shown.WITHDRAW and does.close_calls is not None
        assert graph.shown_results(step, event) == ()
        assert all(b not in m.content for m in step.state.messages for b in event.shown)
    elif step.trigger == "max_output_tokens_recovery":
        # an error event after a complete text and no call (overloaded_error, api_error): the text is kept as
        # shown and the model asked to resume from it (Claude Code 2.1.332); there is no call to pair
        assert isinstance(event, CallFailed) and event.error.kind in ("overloaded", "stream_api_error")
        assert does.shown is graph.Shown.KEEP and not shown_ids and graph.shown_results(step, event) == ()
        assert step.state.messages[-2].content == event.shown
    else:
        assert does.shown is graph.Shown.PAIR and does.close_calls is not None
        results = graph.shown_results(step, event)
        assert [b["tool_use_id"] for b in results] == shown_ids
        if shown_ids:
            kept = step.state.messages
            at = next(i for i, m in enumerate(kept) if m.tool_use_ids() == shown_ids)
            assert kept[at + 1].content == results  # the history holds what the client is shown
        finished = {b["tool_use_id"]: b for b in event.finished}
        for b in results:
            want = finished.get(b["tool_use_id"]) or prompts.synthetic_block(b["tool_use_id"], does.close_calls)
            assert b == want
    # a compaction the route did not use changes nothing it shows; one it used replaced the history
    if event.__class__ is CallFailed and step.trigger == "reactive_compact_retry":
        assert does.compacts and step.state.messages == event.compaction.messages  # type: ignore[union-attr]
    return step.trigger


@settings(max_examples=EXAMPLES * 3)
@given(data=st.data(), phase=st.sampled_from([C, S]), count=st.integers(0, 3), cap=st.integers(0, 3))
def test_what_the_client_sees_follows_the_declared_move(data: st.DataObject, phase: Phase, count: int,
                                                        cap: int) -> None:
    """Failures of every kind — compactions included — with what they showed and finished: the
    machine's move declares whether the response is withdrawn or paired, and the history agrees."""
    lim = Limits(stream_retries=cap)
    state = attrs.evolve(data.draw(state_st(phase, lim)), stream_retry_count=count)
    event = data.draw(call_failed_st())
    if phase is C:
        event = attrs.evolve(event, shown=(), finished=())  # nothing streamed before the stream opened
    _agrees(state, event, lim)


@given(data=st.data(), phase=st.sampled_from([S, D]))
def test_an_abort_pairs_what_was_shown(data: st.DataObject, phase: Phase) -> None:
    assert _agrees(base(phase), data.draw(aborted_st()), Limits()) == "abort"


def test_prompt_too_long_mid_stream_after_a_tool_call_is_withdrawn_when_compacted() -> None:
    """The case that diverged: a prompt-too-long error mid-stream after a tool_use block, answered by
    a compaction. The client used to be shown the call's "stream_failed" result while the loop
    compacted; the move withdraws the response, and its call is never answered in the history."""
    state = base(S)
    assert _assistants(state.messages) > 1 and not state.has_attempted_reactive_compact
    ptl = ModelError("prompt_too_long", "prompt is too long: 210000 tokens > 200000 maximum", 400)
    event = CallFailed(ptl, shown=(TEXT, USE_1), compaction=SUMMARY)
    assert graph.compaction_wanted(state, attrs.evolve(event, compaction=None), Limits())
    assert _agrees(state, event, Limits()) == "reactive_compact_retry"
    # without the compaction (it failed), the same failure ends the run with the call paired
    assert _agrees(state, attrs.evolve(event, compaction=None), Limits()) == "call_failed"


# --- the declaration's own machinery ----------------------------------------------------------------


@given(a=st.booleans(), b=st.booleans())
def test_guards_combine_by_name_and_truth(a: bool, b: bool) -> None:
    ga = graph.Guard("a", lambda _s, _e, _l: a)
    gb = graph.Guard("b", lambda _s, _e, _l: b)
    args = (LoopState(), None, Limits())
    assert ((ga & gb).name, (ga & gb)(*args)) == ("a and b", a and b)
    assert ((~ga).name, (~ga)(*args)) == ("not a", not a)
    assert ((ga & ~gb).name, (ga & ~gb)(*args)) == ("a and not b", a and not b)


def test_each_step_names_the_route_that_chose_it() -> None:
    """A trace records the guard that fired (the auditor compares it): the route's own name, ``else``
    for an unguarded one, and the edge's label."""
    for route in graph.ROUTES:
        assert route.guard_name == (route.guard.name if route.guard is not None else "else")
        guard = f" [{route.guard.name}]" if route.guard is not None else ""
        assert route.label == f"{route.event.__name__}{guard} → {route.edge}"
    assert all(e.label == e.trigger for e in graph.EDGES)
    at_stream = base(S)
    steps = graph.advance(at_stream, StreamEnded(CUT), Limits())
    assert steps[0].route == "stop_reason_is(max_tokens|model_context_window_exceeded) and " \
                             "under_cap(max_output_tokens_recovery_count)"
    assert graph.advance(base(S), StreamEnded(ModelResponse((TEXT,), "end_turn")), Limits())[0].route == "else"
    assert graph.decide(at_stream, StreamEnded(CUT), Limits()).trigger == steps[0].trigger
    assert observable(graph.decide(at_stream, StreamEnded(CUT), Limits()).state) == observable(steps[0].state)


def test_counters_are_read_where_they_live() -> None:
    tracking = CompactTracking(consecutive_failures=2, rapid_refill_count=1)
    state = base(A, compact_tracking=tracking, stream_retry_count=3)
    assert graph.counter_value(state, "consecutive_compact_failures") == 2
    assert graph.counter_value(state, "rapid_refill_count") == 1
    assert graph.counter_value(state, "stream_retry_count") == 3


def test_declared_moves_index_every_edge_by_its_endpoints() -> None:
    want: dict[tuple[Phase, Phase], set[str]] = {}
    for e in graph.EDGES:
        for s in e.sources:
            want.setdefault((s, e.dest), set()).add(e.trigger)
    assert {k: set(v) for k, v in graph.DECLARED_MOVES.items()} == want
    assert graph.EDGES_BY_TRIGGER == {e.trigger: e for e in graph.EDGES}
    assert graph.RUNNING == (A, C, S, D) and graph.AUTOMATIC == {F}
    assert graph.STATES == tuple(Phase)


def test_a_loop_machine_is_released_once() -> None:
    # loops trigger MACHINE's events on their own model, never registered with it; closing twice is
    # harmless
    before = list(graph.MACHINE.models)
    machine = graph.LoopMachine(base(A))
    machine.close()
    machine.close()
    with graph.LoopMachine(base(A)) as m:
        assert m.phase is A and m.state.phase is A
        assert graph.MACHINE.models == before
    assert graph.MACHINE.models == before == []


def test_a_closed_loop_machine_refuses_every_event() -> None:
    state = base(A)
    with graph.LoopMachine(state) as m:
        m.fire(Assembled(), Limits())
        moved = m.state
    for closed in (m, graph.LoopMachine(state)):
        closed.close()
        at = closed.state
        with pytest.raises(UndeclaredMove, match=r"^Assembled: the loop's machine is closed"):
            closed.fire(Assembled(), Limits())
        assert closed.state is at
    assert moved.phase is C


def test_a_refused_move_leaves_the_loop_where_it_was() -> None:
    at_stream = base(S)
    with graph.LoopMachine(at_stream) as m:
        with pytest.raises(UndeclaredMove, match=r"^Refused in stream: reports the work of call_model \(the pre"):
            m.fire(Refused(T.BLOCKING_LIMIT, "x"), Limits())
        with pytest.raises(UndeclaredMove, match=r"^str is not an event of the graph$"):
            m.fire("not an event", Limits())  # type: ignore[arg-type]
        assert m.phase is S and m.state is at_stream
    with graph.LoopMachine(base(X, stop_hooks_due=False)) as m:
        with pytest.raises(UndeclaredMove, match=r"^StopHookVerdict in stop: no route's guard holds "
                                                 r"\(stop_hooks_due and prevented, "
                                                 r"stop_hooks_due and blocked_or_context and "):
            m.fire(StopHookVerdict(), Limits())
    with pytest.raises(UndeclaredMove, match=r"^call_failed cannot end the loop with "):
        graph._next_state(base(S), graph.Route((S,), CallFailed, None, "call_failed", lambda s, e, lim: {}),
                          CallFailed(BROKE), Limits())
    # only a move that declares a compaction may replace the history
    with pytest.raises(UndeclaredMove, match=r"^call_failed replaced the history, which only a move that compacts"):
        graph._next_state(base(S), graph.Route((S,), CallFailed, None, "call_failed",
                                               lambda s, e, lim: {"terminal_reason": T.API_ERROR, "messages": ()}),
                          CallFailed(BROKE), Limits())
    # an effect that names a field the record does not have is refused by name, as LoopState(**changes) would
    with pytest.raises(TypeError, match=r"^LoopState.__init__\(\) got an unexpected keyword argument 'bogus'$"):
        graph._next_state(base(S), graph.Route((S,), CallFailed, None, "call_failed",
                                               lambda s, e, lim: {"terminal_reason": T.API_ERROR, "bogus": 1}),
                          CallFailed(BROKE), Limits())


def test_the_model_cannot_be_moved_past_its_record() -> None:
    model = graph.LoopModel(base(S))
    model.phase = "stream"  # agreeing: fine
    with pytest.raises(UndeclaredMove, match="the machine moved to call_model but the route's state is at stream"):
        model.phase = "call_model"


# --- generated moves, compared with the statement ------------------------------------------------


def _moves_test(phases: tuple[Phase, ...], events: st.SearchStrategy[Any], doc: str) -> Callable[..., None]:
    @settings(max_examples=EXAMPLES, deadline=None)
    @given(data=st.data())
    def test(data: st.DataObject) -> None:
        lim = data.draw(limits_st())
        state = data.draw(state_st(data.draw(st.sampled_from(phases)), lim))
        check(state, data.draw(events), lim)
    test.__doc__ = doc
    return test


test_assemble = _moves_test((A,), EVENTS[A], "assemble: auto-compaction, the rapid-refill breaker, setup failures.")
test_call_model = _moves_test((C,), st.one_of(EVENTS[C]), "call_model: the preflight, an accepted request.")
test_failed_calls = _moves_test((C, S), call_failed_st(),
                                "A failed call: stream retry, fallback, reactive compaction, or the error.")
test_stream_ends = _moves_test((S,), stream_ended_st(), "The end of the stream decides (§3.4).")
test_tool_batches = _moves_test((D,), drained_st(), "The batch drained, then feedback at once (§3.5-6).")
test_feedback = _moves_test((F,), drained_st(), "feedback on its own (§3.6).")
test_stop_hooks = _moves_test((X,), verdicts, "Stop hooks: prevented, max_turns, the block cap, a block, a pass.")
test_aborts = _moves_test(tuple(Phase), aborted_st(), "An abort: from every running phase, paired; refused elsewhere.")


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_every_other_event_is_refused(data: st.DataObject) -> None:
    """An event a phase does not handle raises UndeclaredMove, naming the refusal."""
    lim = data.draw(limits_st())
    phase = data.draw(st.sampled_from(list(Phase)))
    event = data.draw(any_event)
    check(data.draw(state_st(phase, lim)), event, lim)
    if (phase, type(event)) in graph.REFUSALS:
        with pytest.raises(UndeclaredMove) as refused:
            graph.advance(data.draw(state_st(phase, lim)), event, lim)
        assert graph.REFUSALS[(phase, type(event))] in str(refused.value)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_runs_follow_the_statement(data: st.DataObject) -> None:
    """Whole runs: each event drawn for the phase the previous move left, every move as stated."""
    lim = data.draw(limits_st())
    state = LoopState(messages=conversation(data.draw(st.integers(0, 2))))
    with graph.LoopMachine(state) as machine:
        for _ in range(25):
            if machine.phase is X and not machine.state.stop_hooks_due:
                break
            event = data.draw(EVENTS[machine.phase])
            try:
                want = expected(machine.state, event, lim)
            except Refusal:
                continue
            steps = machine.fire(event, lim)
            assert [(s.trigger, observable(s.state)) for s in steps] == \
                [(m.trigger, observable(m.state)) for m in want]


def test_decide_is_the_first_move_of_an_event() -> None:
    """A drained batch is two moves (collect, then feedback on its own); decide reports the first."""
    state = base(D)
    assert graph.decide(state, _drained(), Limits()).trigger == "collect"
    assert [s.trigger for s in graph.advance(state, _drained(), Limits())] == ["collect", "next_turn"]


def test_the_shared_machine_has_the_phases_and_the_loops_only() -> None:
    """One transitions machine for every loop: its states are exactly the phases, and it holds no loop
    (each triggers the machine's events on its own model)."""
    assert set(graph.MACHINE.states) == {p.value for p in Phase}
    with graph.LoopMachine(base(A)):
        assert not any(isinstance(m, graph.LoopModel) for m in graph.MACHINE.models)


def test_the_machine_reads_the_phase_from_the_record() -> None:
    """The phase exists once, in the loop's record: replace the record and the machine follows it."""
    model = type("Model", (graph.LoopModel,), {})(base(A))  # a __dict__ for transitions' bound triggers
    graph.MACHINE.add_model(model, initial=A.value)
    try:
        model.record = base(S)
        graph.MACHINE.events["StreamEnded"].trigger(model, event=StreamEnded(ModelResponse((TEXT,), "end_turn")),
                                                    limits=Limits(), automatic=False)
        assert model.step is not None and model.step.trigger == "end_turn" and model.record.phase is X
        assert "state" not in vars(model) and "phase" not in vars(model)
    finally:
        graph.MACHINE.remove_model(model)


def test_validation_reports_every_problem_and_follows_long_chains() -> None:
    """An undeclared edge does not hide the next route's problem, and stop is found reachable through a
    chain of edges listed in any order."""
    r0 = graph.ROUTES
    teleport = graph.Route((A,), Assembled, None, "teleport", lambda *_: {})
    wrong = graph.Route((X,), Aborted, None, "abort", lambda *_: {})
    problems = graph.validate(routes=(teleport, wrong, *r0))
    assert any("'teleport' is not declared" in p for p in problems)
    assert any("'abort' is not declared from stop" in p for p in problems)
    chain = [graph.EDGES_BY_TRIGGER[t] for t in ("call", "open_stream", "end_turn")]  # A → C → S → X
    unreachable = {p for p in graph.validate(edges=chain, routes=()) if "cannot be reached" in p}
    assert unreachable == {"stop cannot be reached from dispatch_tools", "stop cannot be reached from feedback"}


def test_a_table_that_does_not_validate_never_loads() -> None:
    """The module itself refuses to load with an unsound table (here: a route to an undeclared edge)."""
    import importlib.util

    source = Path(graph.__file__).read_text()
    assert "ROUTES: tuple[Route, ...] = (\n" in source
    head = "ROUTES: tuple[Route, ...] = (\n"
    broken = source.replace(head, head + "    _route(A, Assembled, None, 'teleport', assembled),\n", 1)
    spec = importlib.util.spec_from_loader("agentfsm._broken_graph", loader=None)
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match=r"declaration is unsound:\n  route Assembled → teleport: edge 'teleport'"):
        exec(compile(broken, graph.__file__, "exec"), module.__dict__)


# --- the auditor's table of which edge raises which counter, against the graph ---------------------


def _rises(state: LoopState, event: Any, lim: Limits) -> set[tuple[str, str]]:
    """(counter, edge) for every numeric counter a move of ``event`` raises."""
    pairs = set()
    before = state.counters()
    for step in graph.advance(state, event, lim):
        after = step.state.counters()
        pairs |= {(name, step.trigger) for name, value in after.items()
                  if not isinstance(value, bool) and value > before[name]}
        before = after
    return pairs


def _rapid(count: int) -> LoopState:
    return base(A, compact_tracking=CompactTracking(turns_since_compact=0, rapid_refill_count=count, compactions=1))


# one move for each way a counter rises (the graph's, not the auditor's, word for it)
RISES: list[tuple[LoopState, Any, Limits]] = [
    (base(F), _drained(), Limits()),
    (base(F), _drained(failed_structured=True), Limits()),
    (base(X), StopHookVerdict(blocked=True, reason="again"), Limits()),
    (base(X, stop_hooks_due=False), TaskNotified((NOTE,)), Limits()),
    (base(S), StreamEnded(CUT), Limits()),
    (base(S), StreamEnded(MALFORMED), Limits()),
    (base(S), StreamEnded(ModelResponse((TEXT,), "refusal")), Limits()),
    (base(S), StreamEnded(ModelResponse((TEXT,), "end_turn"), json_schema=True), Limits()),
    (base(S), CallFailed(BROKE), Limits()),
    (base(C), CallFailed(BROKE, fallback_available=True), Limits()),
    (base(A), Assembled(compact_failed=True), Limits()),
    (_rapid(0), Assembled(compaction=SUMMARY), Limits()),
    (_rapid(2), Assembled(compaction=SUMMARY), Limits()),
]


def test_the_auditor_names_exactly_the_edges_that_raise_each_counter() -> None:
    """The auditor flags a counter that rises on any other edge (audit.RAISED_BY): its table must hold
    every (counter, edge) the graph raises, and nothing the graph never does."""
    seen = set().union(*(_rises(*case) for case in RISES))
    assert seen == {(name, edge) for name, edges in RAISED_BY.items() for edge in edges}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_no_move_raises_a_counter_the_auditor_does_not_expect(data: st.DataObject) -> None:
    """Over generated moves from every phase: each rise is one the auditor's table allows, by one."""
    phase = data.draw(st.sampled_from([A, C, S, D, F, X]))
    lim = data.draw(limits_st())
    state, event = data.draw(state_st(phase, lim)), data.draw(EVENTS[phase])
    try:
        steps = graph.advance(state, event, lim)
    except UndeclaredMove:
        return
    before = state.counters()
    for step in steps:
        after = step.state.counters()
        for name, value in after.items():
            if not isinstance(value, bool) and value > before[name]:
                assert step.trigger in RAISED_BY.get(name, ()), (name, step.trigger)
                assert value == before[name] + 1, (name, before[name], value)
        before = after


@given(data=st.data())
def test_the_auditor_restores_what_a_snapshot_records(data: st.DataObject) -> None:
    """After a move it cannot replay, the auditor carries on from the recorded snapshot: every counter,
    flag, the phase and the terminal reason come back as they were."""
    phase = data.draw(st.sampled_from([A, C, S, D, F, X]))
    lim = data.draw(limits_st())
    state = data.draw(state_st(phase, lim))
    restored = audit._restore(LoopState(messages=(), tool_use_context=ToolUseContext()), phase.value,
                              state.snapshot())
    assert restored.counters() == state.counters()
    assert (restored.phase, restored.terminal_reason, restored.stop_hooks_due, restored.transition) == \
        (state.phase, state.terminal_reason, state.stop_hooks_due, state.transition)
    t, r = state.compact_tracking, restored.compact_tracking
    assert (r.turns_since_compact, r.compactions) == (t.turns_since_compact, t.compactions)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_following_the_edge_the_machine_chose_is_the_move_it_made(data: st.DataObject) -> None:
    """graph.follow (the auditor's way along a recorded edge) taken along the decided edge gives the
    same step — state, route and notices — wherever one route has that edge."""
    phase = data.draw(st.sampled_from([A, C, S, D, F, X]))
    lim = data.draw(limits_st())
    state, event = data.draw(state_st(phase, lim)), data.draw(EVENTS[phase])
    try:
        step = graph.decide(state, event, lim)
    except UndeclaredMove:
        return
    followed = graph.follow(state, event, lim, step.trigger)
    assert followed is not None and followed.trigger == step.trigger
    # where several routes share the edge, follow takes the first of them (its guard aside)
    if [r.edge for r in graph.ROUTES_BY_KEY[(state.phase, type(event))]].count(step.trigger) == 1:
        assert (followed.route, followed.notices) == (step.route, step.notices)
        assert observable(followed.state) == observable(step.state)



def test_following_an_edge_whose_effect_cannot_apply_gives_none() -> None:
    """The auditor follows a recorded edge through its route's own effect; where that effect cannot apply
    to the event (a reactive compaction without a compaction), there is no such move — None, not an
    exception. A cut-off call is no such case: the abort's own effect pairs it."""
    lim = Limits()
    ptl = CallFailed(ModelError("prompt_too_long", "prompt is too long", 400), compaction=None)
    assert graph.follow(base(C), ptl, lim, "reactive_compact_retry") is None
    step = graph.follow(base(S), Aborted(shown=(USE_1,)), lim, "abort")
    assert step is not None and step.trigger == "abort" and step.state.phase is X
    assert step.state.messages[-2].tool_result_ids() == ["toolu_1"]
