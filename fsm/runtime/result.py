"""The result of one run: the per-run account kept while it runs, the result record it ends with, and
that record's headless-protocol JSON form."""

from __future__ import annotations

import json
import uuid as uuid_mod
from collections.abc import Mapping
from typing import Any

import attrs

from agentfsm.machine.state import TERMINAL_INFO, LoopState, TerminalReason
from agentfsm.runtime.cost import USAGE_KEYS, add_usage, cost_usd

ZERO_USAGE: Mapping[str, int] = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                                 "output_tokens": 0}


# Claude Code 2.1.332's words for a request the API answered with a 5xx: the status and message, that the
# fault is the server's, and where to look (the API's status page, or the gateway the base URL names)
SERVER_SIDE = "This is a server-side issue, usually temporary \u2014 try again in a moment."
STATUS_PAGE = "https://status.claude.com"
CAPACITY = "this may be a temporary capacity issue."  # a 429 with no message of its own
_CLOSING_MARKS = ".!?\u2026"  # the message's own closing marks give way to the note's full stop


def api_error_text(status: int, detail: str | None, endpoint: str = "") -> str:
    """Claude Code's words for a request the API refused: the status, then the API's message; a 429 as a
    rejected request (its message, or that it may be a passing capacity issue); a 5xx also says it is the
    server's fault, and for both what to check if it persists (``endpoint``: the gateway that answered,
    "" for the API itself)."""
    where = f"your inference gateway ({endpoint})" if endpoint else STATUS_PAGE
    if status == 429:
        said = detail or f"{CAPACITY} If it persists, check {where}."
        return f"API Error: Request rejected (429) \u00b7 {said}"
    text = f"API Error: {status} {detail or ''}".rstrip()
    if status < 500:
        return text
    return f"{text.rstrip(_CLOSING_MARKS)}. {SERVER_SIDE} If it persists, check {where}."


def shows_api_error(status: int | None) -> bool:
    """A refusal Claude Code shows in its own form (a synthetic assistant message, and the result's
    text), observed for a 400, a 429 and the 5xx statuses: every status the API refuses with."""
    return status is not None and status >= 400


def api_error_kind(status: int) -> str:
    """The ``error`` of Claude Code's synthetic assistant message for an API error status."""
    if status in (401, 403):
        return "authentication_failed"
    if status == 429:
        return "rate_limit"
    if status >= 500:
        return "server_error"
    return "unknown"



@attrs.define
class RunAccount:
    """What one run spends and collects besides its state: usage and cost of every request (main,
    compaction, a broken stream), API time, permission denials, warnings, the structured output.
    ``last_usage``/``counted_upto`` anchor the next token estimate on the last reported usage."""

    usage: dict[str, Any] = attrs.field(factory=dict)
    cost_usd: float = 0.0
    api_ms: float = 0.0
    denials: list[Mapping[str, Any]] = attrs.field(factory=list)
    warnings: list[str] = attrs.field(factory=list)
    structured_output: Any = None
    last_usage: Mapping[str, Any] | None = None
    counted_upto: int = 0
    # per model, in the result's `modelUsage` shape
    model_usage: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    # the last response's stop_reason, and the HTTP status of the last failed call (None once a
    # later call succeeded)
    stop_reason: str | None = None
    api_error_status: int | None = None
    # the gateway that gave that failure (:attr:`agentfsm.machine.events.ModelError.endpoint`)
    api_error_endpoint: str = ""

    def spend(self, model: str, usage: Mapping[str, Any]) -> None:
        self.usage = add_usage(self.usage, usage)
        cost = cost_usd(model, usage)
        self.cost_usd += cost
        self.model_usage[model] = merge_model_usage(self.model_usage.get(model), model_usage_entry(usage, cost))

    def anchor(self, usage: Mapping[str, Any] | None, messages: int) -> None:
        """The next estimate starts from this report and adds only what the request did not carry."""
        self.last_usage, self.counted_upto = usage, messages


@attrs.frozen
class RunResult:
    terminal_reason: TerminalReason
    subtype: str
    is_error: bool
    num_turns: int
    duration_ms: int
    duration_api_ms: int
    total_cost_usd: float
    usage: Mapping[str, Any]
    session_id: str
    result: str | None
    errors: tuple[str, ...] = ()
    permission_denials: tuple[Mapping[str, Any], ...] = ()
    structured_output: Any = None
    warnings: tuple[str, ...] = ()
    stop_reason: str | None = None
    model_usage: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    api_error_status: int | None = None
    uuid: str = attrs.field(factory=lambda: str(uuid_mod.uuid4()))
    # the call a PreToolUse hook deferred ({id, name, input}), for a run that ended tool_deferred
    deferred_tool_use: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "result",
            "subtype": self.subtype,
            "is_error": self.is_error,
            "terminal_reason": self.terminal_reason.value,
            "duration_ms": self.duration_ms,
            "duration_api_ms": self.duration_api_ms,
            "num_turns": self.num_turns,
            "session_id": self.session_id,
            "total_cost_usd": round(self.total_cost_usd, 8),
            # a run that made no successful request still reports its (zero) usage, as Claude Code does
            "usage": dict(self.usage) or dict(ZERO_USAGE),
            "modelUsage": {m: dict(u) for m, u in self.model_usage.items()},
            "permission_denials": [dict(d) for d in self.permission_denials],
            "stop_reason": self.stop_reason,
            "api_error_status": self.api_error_status,
            "uuid": self.uuid,
        }
        if self.deferred_tool_use is not None:
            out["deferred_tool_use"] = dict(self.deferred_tool_use)
        # error subtypes carry `errors` instead of `result` (docs/behaviour.md §10)
        if self.subtype == "success":
            out["result"] = self.result or ""
        else:
            out["errors"] = list(self.errors)
        if self.structured_output is not None:
            out["structured_output"] = self.structured_output
        return out


def model_usage_entry(usage: Mapping[str, Any], cost: float) -> dict[str, Any]:
    """One request's usage in the shape of the result's ``modelUsage`` values."""
    def n(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) else 0

    server = usage.get("server_tool_use")
    searches = server.get("web_search_requests", 0) if isinstance(server, Mapping) else 0
    return {"inputTokens": n("input_tokens"), "outputTokens": n("output_tokens"),
            "cacheReadInputTokens": n("cache_read_input_tokens"),
            "cacheCreationInputTokens": n("cache_creation_input_tokens"),
            "webSearchRequests": searches if isinstance(searches, int) else 0, "costUSD": cost}


def merge_model_usage(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> dict[str, Any]:
    if a is None:
        return dict(b)
    return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}


def build_result(state: LoopState, *, session_id: str, duration_ms: int, duration_api_ms: int,
                 cost: float, usage: Mapping[str, Any], denials: tuple[Mapping[str, Any], ...],
                 structured_output: Any = None, warnings: tuple[str, ...] = (),
                 account: RunAccount | None = None) -> RunResult:
    reason = state.terminal_reason
    if reason is None:
        raise ValueError("the loop has not reached a terminal state")
    info = TERMINAL_INFO[reason]
    last_text = ""
    for m in reversed(state.messages):
        if m.role == "assistant":
            last_text = m.text()
            break
    if reason is TerminalReason.COMPLETED and structured_output is not None:
        # the answer itself, as compact JSON (Claude Code's `result` for a --json-schema run)
        text = json.dumps(structured_output, ensure_ascii=False, separators=(",", ":"))
    elif reason is TerminalReason.COMPLETED or reason is TerminalReason.TOOL_DEFERRED:
        text = last_text
    elif reason in (TerminalReason.HOOK_STOPPED, TerminalReason.STOP_HOOK_PREVENTED) and usage:
        # a hook stopped a run that reached the model: the last answer stands as the result, even an
        # empty one (Claude Code; tests/fixtures/claude_code/stop_hook_prevent)
        text = last_text
    elif reason in (TerminalReason.HOOK_STOPPED, TerminalReason.STOP_HOOK_PREVENTED):
        # stopped before any request (UserPromptSubmit): the hook's reason is all there is to say
        text = f"Operation stopped by hook: {state.terminal_detail or ''}".rstrip()
    elif reason is TerminalReason.API_ERROR and account is not None and shows_api_error(account.api_error_status):
        text = api_error_text(account.api_error_status or 0, state.terminal_detail, account.api_error_endpoint)
    elif info.is_error:
        text = state.terminal_detail or reason.value
    else:
        text = last_text
    errors = (state.terminal_detail or reason.value,) if info.subtype != "success" else ()
    acct = account or RunAccount()
    # a run stopped before its first request took no turn (Claude Code counts 0)
    turns = 0 if reason is TerminalReason.HOOK_STOPPED and not usage else state.turn_count
    deferred = _deferred_call(state) if reason is TerminalReason.TOOL_DEFERRED else None
    return RunResult(reason, info.subtype, info.is_error, turns, duration_ms, duration_api_ms,
                     cost, usage, session_id, text, errors, denials, structured_output, warnings,
                     # Claude Code names the deferral as the stop reason
                     stop_reason="tool_deferred" if deferred is not None else acct.stop_reason,
                     model_usage={m: dict(u) for m, u in acct.model_usage.items()},
                     api_error_status=acct.api_error_status if info.is_error else None, deferred_tool_use=deferred)


def _deferred_call(state: LoopState) -> Mapping[str, Any] | None:
    """The deferred call of a run that ended ``tool_deferred``: the one call of its last response."""
    for message in reversed(state.messages):
        if message.role == "assistant":
            calls = [b for b in message.content if b.get("type") == "tool_use"]
            if len(calls) != 1:
                return None
            return {"id": calls[0]["id"], "name": calls[0]["name"], "input": dict(calls[0].get("input") or {})}
    return None


@attrs.define
class Passes:
    """The passes of one driver run — its prompt's, then one per set of task notifications that
    started another (the graph's ``task_notification`` move) — and their results. Claude Code 2.1.332
    prints a result per pass (tests/fixtures/background: ``num_turns``, ``duration_ms`` and ``usage``
    are the pass's own; the cost and API time the run's so far), and holds a pass's result back to
    the run's end while a background subagent runs."""

    started: float
    index: int = 0
    usage_before: dict[str, Any] = attrs.field(factory=dict)
    held: list[RunResult] = attrs.field(factory=list)
    # the last pass's result was printed when the pass ended (the run then ended without another)
    last_printed: bool = False
    own_held: bool = False  # the last pass's result is the last of ``held``

    def ended(self, run: RunResult, now: float, *, held: bool) -> RunResult | None:
        """This pass ended and the run waits for background work: its result (``run``: the run so
        far) to print now, or None when it is ``held`` back to the run's end (a background subagent
        runs)."""
        result = self.of(run, now)
        if held:
            self.held.append(result)
            self.own_held = True
            return None
        self.last_printed = True
        return result

    def no_next(self) -> None:
        """No other pass starts: a result of this pass held back is the run's own, printed at its end."""
        if self.own_held:
            self.held.pop()
            self.own_held = False

    def of(self, run: RunResult, now: float) -> RunResult:
        """``run`` (the run so far, as :func:`build_result` makes it) as the result of this pass."""
        usage = run.usage
        if self.index:
            usage = {**usage, **{k: usage[k] - self.usage_before.get(k, 0) for k in USAGE_KEYS
                                 if isinstance(usage.get(k), int)}}
        # (the run's turn count is the pass's own: a pass starts it over, graph.notified)
        return attrs.evolve(run, duration_ms=int((now - self.started) * 1000), usage=usage)

    def next(self, *, usage: Mapping[str, Any], now: float) -> None:
        """Another pass starts (the run so far used ``usage``)."""
        self.index += 1
        self.usage_before, self.started = dict(usage), now
        self.last_printed = False
        self.own_held = False
