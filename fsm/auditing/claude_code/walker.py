"""The reading both formats share: follows the client's path phase by phase, as its records show it,
and emits the events the driver would have observed, each with the edge the client took."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from agentfsm.auditing.checks import Finding
from agentfsm.auditing.claude_code.items import (
    ENFORCE,
    MALFORMED,
    MAX_TOKENS,
    META_TEXTS,
    MID_STREAM_CUT,
    REENTRY_OF,
    REFUSED,
    REFUSED_AGAIN,
    REFUSED_RESULTS,
    STOP_FEEDBACK,
    STREAM_JSON,
    STRUCTURED_OUTPUT_TOOL,
    THINKING_ONLY,
    Fact,
    Item,
    Observation,
    RunStart,
)
from agentfsm.machine.events import (
    Aborted,
    Assembled,
    CallFailed,
    Compaction,
    Event,
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
from agentfsm.machine.graph import EDGES_BY_TRIGGER
from agentfsm.machine.prompts import HOOK_STOPPED_SEEN
from agentfsm.machine.state import Message, Phase, TerminalReason


def blocks_of(message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, Mapping):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [dict(b) for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def text_of(message: Any) -> str:
    return "".join(str(b.get("text", "")) for b in blocks_of(message) if b.get("type") == "text")


def meta_kind(text: str) -> str | None:
    """Which of the loop's hidden messages ``text`` is (:data:`META_TEXTS`), or None."""
    for start, kind in META_TEXTS:
        if text.startswith(start):
            return kind
    return None


def _dest(trigger: str) -> Phase:
    return EDGES_BY_TRIGGER[trigger].dest


@attrs.define
class _Response:
    """The response being streamed: blocks by record, the line of each tool_use."""

    id: str
    line: int
    last_line: int
    model: str = ""
    stop_reason: str | None = None
    blocks: list[dict[str, Any]] = attrs.field(factory=list)
    tool_lines: dict[str, int] = attrs.field(factory=dict)
    uuids: list[str] = attrs.field(factory=list)
    # the results Claude Code wrote for the calls of a refused response (none of them ran on)
    refused_results: list[dict[str, Any]] = attrs.field(factory=list)

    def add(self, line: int, blocks: Sequence[Mapping[str, Any]], uuid: str | None) -> None:
        self.last_line = line
        for b in blocks:
            self.blocks.append(dict(b))
            if b.get("type") == "tool_use":
                self.tool_lines[str(b.get("id"))] = line
        if uuid:
            self.uuids.append(uuid)

    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b.get("type") == "tool_use"]

    def has_text(self) -> bool:
        """A visible answer: a text block with something in it."""
        return any(b.get("type") == "text" and str(b.get("text") or "").strip() for b in self.blocks)

    def structured_ids(self) -> tuple[str, ...]:
        return tuple(str(b.get("id")) for b in self.tool_uses() if b.get("name") == STRUCTURED_OUTPUT_TOOL)

    def message(self) -> Message:
        return Message("assistant", tuple(self.blocks), kind="assistant", uuid=self.uuids[0] if self.uuids else "")


@attrs.define
class _Batch:
    """Tool results of the dispatched response, by tool_use id."""

    response: _Response
    results: dict[str, list[tuple[int, dict[str, Any]]]] = attrs.field(factory=dict)
    ends_turn: bool = False
    last_line: int = 0
    uuids: list[str] = attrs.field(factory=list)


class Walker:
    """Shared reading logic: follows the client's path phase by phase (as its records show it) and
    emits the events the driver would have observed. The two formats feed it through the ``on_*``
    methods."""

    source = ""

    def __init__(self, json_schema: bool) -> None:
        self.json_schema = json_schema
        self.items: list[Item] = []
        self.findings: list[Finding] = []
        self.phase: Phase | None = None  # None: no run yet, or the last run's end is unknown
        self.response: _Response | None = None
        self.batch: _Batch | None = None
        self.hooks_due_line: int | None = None  # end_turn taken, Stop hooks' verdict not seen yet
        # a Stop hook's re-entry (its block's feedback, its additionalContext), awaiting what follows
        self.feedback: tuple[int, StopHookVerdict] | None = None
        self.enforce: int | None = None  # the structured-output request's line, awaiting what follows
        self.enforced = False  # Claude Code asks for the StructuredOutput call once per run
        self.stopped = False  # the last run's records ended with the loop at stop (finish)
        self.pending_compaction: Compaction | None = None
        self.messages_by_uuid: dict[str, Message] = {}
        self.last_exchange: tuple[Message, ...] = ()
        self.unknown_kinds: dict[str, list[int]] = {}  # what is not known, by kind: the lines

    # -- emitting ---------------------------------------------------------------------------------

    def find(self, line: int, code: str, message: str) -> None:
        self.findings.append(Finding(line, code, message))

    def unknown(self, line: int, kind: str) -> None:
        """A record the tables do not know (``kind`` says which): reported once per kind, with a count,
        by :meth:`report_unknown` — one new record type is one finding, not one per line."""
        self.unknown_kinds.setdefault(kind, []).append(line)

    def report_unknown(self) -> None:
        for kind, lines in self.unknown_kinds.items():
            more = f" ({len(lines)} records, lines {', '.join(map(str, lines[:5]))}{', …' * (len(lines) > 5)})" \
                if len(lines) > 1 else ""
            self.find(lines[0], "unknown_record", f"{kind} is not known; not interpreted{more}")
        self.unknown_kinds = {}

    def fact(self, line: int, action: str, detail: str = "") -> None:
        """Something the report shows that is no move (a permission denial, a mode, a background task)."""
        self.items.append(Fact(line, action, detail))

    def emit(self, line: int, event: Event, *observed: str | None) -> None:
        self.stopped = False
        self.items.append(Observation(line, event, tuple(observed)))
        for trigger in observed:
            self.phase = _dest(trigger) if trigger is not None else None

    def start_run(self, line: int, prompt: Message | None, cause: str = "prompt") -> None:
        self.finish(line)
        if cause == "task-notification" and self.stopped:
            # background work the run started reported after it ended: the same run goes on, by the
            # graph's task_notification move (stop → assemble), as agentfsm's does (issue 30)
            note = (attrs.evolve(prompt, kind="task_notification") if prompt is not None else
                    Message("user", ({"type": "text", "text": ""},), kind="task_notification"))
            self.emit(line, TaskNotified((note,)), "task_notification")
            self.enforced = False
            return
        self.items.append(RunStart(line, prompt, cause))
        self.phase = Phase.ASSEMBLE
        self.enforced = False

    # -- the forward path -------------------------------------------------------------------------

    def to_call(self, line: int) -> None:
        """A new request starts at ``line``: close what the loop was waiting on, then ``call``."""
        if self.phase is None:
            self.start_run(line, None)
        if self.phase is Phase.STREAM:
            self.close_response_before_call(line)
        if self.phase is Phase.DISPATCH_TOOLS:
            self.end_batch(line, "next_turn")
        if self.enforce is not None and self.phase is Phase.STREAM:
            self.end_response(self.enforce, "structured_output_retry", json_schema=True)
            self.enforced = True
            self.enforce = None
        if (self.phase is Phase.STOP and self.feedback is None and self.hooks_due_line is not None
                and self.source == STREAM_JSON):
            self.find(line, "read_as_stop_hook_context", "a new request after the answer ended the turn, with no "
                                                         "Stop-hook feedback: read as a Stop hook's additionalContext "
                                                         "(stream-json does not show it), stop_hook_blocking")
            self.feedback = (line, StopHookVerdict(context=("",)))
        if self.phase is Phase.STOP and self.feedback is not None:
            fline, verdict = self.feedback
            self.emit(fline, verdict, "stop_hook_blocking")
            self.feedback = None
            self.hooks_due_line = None
        if self.phase is not Phase.ASSEMBLE:
            where = self.phase.value if self.phase is not None else "an unknown point"
            self.find(line, "out_of_place", f"a new request while the loop is at {where}, with no record of how "
                                            "it got back to assemble")
            self.phase = Phase.ASSEMBLE
        self.emit(line, Assembled(compaction=self.pending_compaction), "call")
        self.pending_compaction = None

    def close_response_before_call(self, line: int) -> None:
        """A request follows a response with no record in between: only a tool batch whose results are
        all missing explains it (they are reported); anything else is out of place."""
        r = self.response
        if r is not None and r.tool_uses() and self.enforce is None:
            self.end_response(r.last_line, "dispatch", stop_reason=r.stop_reason or "tool_use")
        elif r is not None and self.source == STREAM_JSON and self.enforce is None and r.has_text():
            # stream-json shows no Stop-hook round: a text answer that ended the turn, then the re-entry of
            # a Stop hook's additionalContext (to_call reads it so)
            self.end_response(r.last_line, "end_turn", stop_reason=r.stop_reason or "end_turn")
        elif self.enforce is None:
            self.find(line, "out_of_place",
                      f"a new request after the response at line {r.line if r else '?'} with no record of a "
                      "re-entry (no tool result, no loop message)")

    def open_stream(self, line: int, rid: str, model: str, stop_reason: str | None = None) -> _Response:
        if self.phase is not Phase.CALL_MODEL:
            self.to_call(line)
        self.emit(line, StreamOpened(model=model), "open_stream")
        self.response = _Response(rid, line, line, model, stop_reason)
        return self.response

    def end_response(self, line: int, trigger: str | None, *, stop_reason: str | None = None,
                     json_schema: bool | None = None, cost_usd: float = 0.0) -> None:
        """The streamed response ends (``StreamEnded``), taking ``trigger``."""
        r = self.response
        if r is None:  # a response the client did not write (a retracted malformed answer)
            r = _Response("", line, line)
        if json_schema is None:
            json_schema = self.json_schema and not self.enforced
        if trigger == "end_turn" and self.json_schema and self.enforced and not r.structured_ids():
            self.find(line, "cc_structured_output_once",
                      "the answer has no StructuredOutput call and the run ends: Claude Code asks for the call once "
                      "per run (the graph would ask again)")
        if trigger == "dispatch" and r.tool_uses() and r.stop_reason in ("end_turn", "stop_sequence"):
            self.find(r.line, "stop_reason_mismatch",
                      f"message {r.id or '?'} has tool_use blocks but its records say stop_reason {r.stop_reason!r} "
                      "(a response that calls tools stops with tool_use, or is cut at max_tokens); its tools were "
                      "run")
        response = ModelResponse(tuple(r.blocks), stop_reason or r.stop_reason or "end_turn", model=r.model)
        # a refused call whose result says it was interrupted had started (graph.refused_results)
        started = tuple(str(b.get("tool_use_id")) for b in r.refused_results
                        if str(b.get("content") or "").startswith("Interrupted"))
        self.emit(line, StreamEnded(response, json_schema=json_schema, structured_output_ids=r.structured_ids(),
                                    cost_usd=cost_usd, started=started), trigger)
        message = r.message()
        for u in r.uuids:
            self.messages_by_uuid[u] = message
        if trigger == "dispatch":
            self.batch = _Batch(r)
        else:
            self.response = None
        if trigger == "end_turn":
            self.hooks_due_line = line

    def add_result(self, line: int, block: Mapping[str, Any], ends_turn: bool, uuid: str | None) -> None:
        r = self.response
        if self.phase is Phase.STREAM and r is not None and (
                r.stop_reason == "refusal" or str(block.get("content") or "").startswith(REFUSED_RESULTS)):
            # a refused response's calls are answered without being dispatched; the reminder that follows
            # is the re-entry (refusal_retry)
            r.refused_results.append(dict(block))
            r.last_line = line
            return
        if self.phase is Phase.STREAM and self.response is not None and self.response.tool_uses():
            self.end_response(self.response.last_line, "dispatch",
                              stop_reason=self.response.stop_reason or "tool_use")
        batch = self.batch
        use_id = str(block.get("tool_use_id"))
        if self.phase is not Phase.DISPATCH_TOOLS or batch is None:
            self.find(line, "orphan_tool_result", f"tool_result for {use_id!r} with no tool_use of a response "
                                                  "being dispatched")
            return
        if use_id not in batch.response.tool_lines:
            self.find(line, "orphan_tool_result", f"tool_result for {use_id!r}: the response at line "
                                                  f"{batch.response.line} has no tool_use with that id")
            return
        seen = batch.results.setdefault(use_id, [])
        if seen:
            self.find(line, "duplicate_tool_result", f"a second tool_result for {use_id!r} (the first is at line "
                                                     f"{seen[0][0]})")
        seen.append((line, dict(block)))
        batch.last_line = line
        structured = use_id in batch.response.structured_ids()
        batch.ends_turn = batch.ends_turn or ends_turn or (structured and not block.get("is_error"))
        if uuid:
            batch.uuids.append(uuid)

    def end_batch(self, line: int, trigger: str | None, *, hook_stopped: bool = False) -> None:
        """The tool batch is over (``ToolsDrained``): ``collect``, then ``trigger`` (feedback's move);
        ``hook_stopped``: the run's result says a tool hook stopped it here."""
        batch = self.batch
        assert batch is not None
        r = batch.response
        for use in r.tool_uses():
            use_id = str(use.get("id"))
            if use_id not in batch.results:
                self.find(r.tool_lines.get(use_id, r.line), "unpaired_tool_use",
                          f"tool_use {use_id!r} ({use.get('name')}) has no tool_result before the batch ends "
                          f"(line {line})")
        results = tuple(block for use_id in (str(u.get("id")) for u in r.tool_uses())
                        for _, block in batch.results.get(use_id, [])[:1])
        message = Message("user", results, kind="tool_results", uuid=batch.uuids[0] if batch.uuids else "")
        for u in batch.uuids:
            self.messages_by_uuid[u] = message
        self.last_exchange = (r.message(), message)
        # a tool hook's `continue: false` shows as its reminder inside the call's result (in the records of
        # the request after it; stream-json shows the result without it, and only its result line says so)
        stopped = [m.group(1) for b in results for m in HOOK_STOPPED_SEEN.finditer(text_of(b))]
        self.emit(batch.last_line or line, ToolsDrained(
            assistant=r.message(), results=message, ends_turn=batch.ends_turn,
            hook_stopped=hook_stopped or bool(stopped), hook_stop_reason=stopped[0] if stopped else "",
            structured_output_ids=r.structured_ids()), "collect", trigger)
        self.batch = None
        self.response = None

    # -- the loop's own messages ------------------------------------------------------------------

    def on_meta(self, line: int, kind: str, text: str) -> None:
        """A hidden user message of the loop (``kind`` from :data:`META_TEXTS`)."""
        if kind == STOP_FEEDBACK:
            self.on_stop_feedback(line, text)
            return
        if self.phase is Phase.CALL_MODEL:
            # the response was not written (the transcript drops a retracted malformed answer)
            self.emit(line, StreamOpened(), "open_stream")
            self.response = None
        elif self.phase is not Phase.STREAM:
            # the client re-entered from where no response ended: the move as it was (the audit reports it)
            self.emit(line, StreamEnded(ModelResponse((), None)), REENTRY_OF[kind])
            self.response, self.batch = None, None
            return
        if kind == MAX_TOKENS:
            self.end_response(line, "max_output_tokens_recovery", stop_reason=self._stop("max_tokens"))
        elif kind == MID_STREAM_CUT:
            self.find(line, "cc_mid_stream_resume", "the response was cut by a stream error and Claude Code asked it "
                                                    "to resume (max-output-tokens counter); the graph retries the "
                                                    "stream instead")
            self.end_response(line, "max_output_tokens_recovery", stop_reason="max_tokens")
        elif kind == MALFORMED:
            if self.response is not None:
                self.response.blocks = [b for b in self.response.blocks if b.get("type") != "tool_use"]
            self.end_response(line, "malformed_tool_use_retry", stop_reason="tool_use")
        elif kind == THINKING_ONLY:
            # the client's one text for an answer with no visible output, with thinking or empty
            r = self.response
            thinking = r is not None and any(b.get("type") in ("thinking", "redacted_thinking") for b in r.blocks)
            self.end_response(line, "thinking_only_nudge" if thinking else "empty_response_nudge",
                              stop_reason=self._stop("end_turn"))
        elif kind == ENFORCE:
            self.enforce = line  # what follows says whether the loop re-entered or max_turns ended it
        elif kind == REFUSED:
            self.end_response(line, "refusal_retry", stop_reason="refusal")

    def on_prompt_blocked(self, line: int, detail: str) -> None:
        """A UserPromptSubmit hook blocked the prompt: the run ends before its first request (the
        client writes no record of the prompt)."""
        if self.phase is not None and self.phase is not Phase.ASSEMBLE:
            self.finish(line)
        if self.phase is None:
            self.start_run(line, None)
        self.emit(line, SetupFailed(TerminalReason.HOOK_STOPPED, detail), "prompt_blocked")

    def on_unshown_answer(self, line: int) -> None:
        """A subagent ended (its task completed) after a request whose answer stream-json does not
        show (a foreground subagent's final answer travels as its tool result): read as an answer
        that ended the turn."""
        if self.phase is Phase.ASSEMBLE:
            self.to_call(line)
        if self.phase is not Phase.CALL_MODEL:
            return
        self.find(line, "read_as_subagent_answer", "the subagent completed after a request whose answer is not "
                                                   "shown (it is the parent's tool result): read as an answer that "
                                                   "ended the turn")
        self.emit(line, StreamOpened(), "open_stream")
        self.response = _Response("", line, line, stop_reason="end_turn")
        self.response.blocks.append({"type": "text", "text": "(the subagent's answer)"})
        self.end_response(line, "end_turn", stop_reason="end_turn")

    def on_empty_answer(self, line: int, why: str) -> None:
        """The client wrote no answer to the request in progress and ended the turn: an answer with
        nothing in it (Claude Code records none)."""
        if self.phase is Phase.ASSEMBLE:
            self.to_call(line)  # stream-json shows no requests
        if self.phase is not Phase.CALL_MODEL:
            return
        self.find(line, "read_as_empty_answer", why)
        self.emit(line, StreamOpened(), "open_stream")
        self.response = None
        self.end_response(line, "end_turn", stop_reason="end_turn")

    def _stop(self, default: str) -> str:
        r = self.response
        return r.stop_reason if r is not None and r.stop_reason else default

    def on_stop_feedback(self, line: int, text: str) -> None:
        if self.phase is Phase.STREAM:
            self.end_response(line, "end_turn", stop_reason=self._stop("end_turn"))
        reason = (text.split("\n", 1)[1] if "\n" in text else text).strip()
        if self.phase is not Phase.STOP or self.hooks_due_line is None:
            # Stop hooks ran where no answer ended the turn: the move as it was (the audit reports it)
            self.emit(line, StopHookVerdict(blocked=True, reason=reason), "stop_hook_blocking")
            self.response, self.batch = None, None
            return
        self.feedback = (line, StopHookVerdict(blocked=True, reason=reason))

    def on_stop_hooks(self, line: int, *, blocked: bool, prevented: bool, stop_reason: str = "",
                      context: Sequence[str] = ()) -> None:
        """A Stop-hook round's summary. A blocking one only confirms the feedback message before it (and
        adds the hooks' additionalContext); context without a block re-enters too."""
        if blocked and self.feedback is not None:
            if context:
                fline, verdict = self.feedback
                self.feedback = (fline, attrs.evolve(verdict, context=tuple(context)))
            return
        if self.phase is Phase.STREAM:
            self.end_response(line, "end_turn", stop_reason=self._stop("end_turn"))
        if self.phase is not Phase.STOP or self.hooks_due_line is None:
            self.find(line, "out_of_place", "a Stop-hook summary where no answer ended the turn")
            return
        if context and not prevented:
            # the re-entry is the next request (or settle, at the block cap or max_turns)
            self.feedback = (line, StopHookVerdict(context=tuple(context)))
            return
        self.emit(line, StopHookVerdict(prevented=prevented, stop_reason=stop_reason, context=tuple(context)),
                  "settle")
        self.hooks_due_line = None

    def settle_feedback(self, line: int) -> None:
        """The blocking Stop hook's feedback did not re-enter (block cap, max_turns): ``settle``."""
        if self.feedback is None:
            return
        _, verdict = self.feedback
        self.emit(line, verdict, "settle")
        self.feedback = None
        self.hooks_due_line = None

    def on_max_turns(self, line: int) -> None:
        """The client stopped at max_turns: after a tool batch, a Stop hook's feedback or the
        structured-output request."""
        if self.phase is Phase.DISPATCH_TOOLS:
            self.end_batch(line, "finish_batch")
        elif self.enforce is not None and self.phase is Phase.STREAM:
            self.find(self.enforce, "cc_structured_output_max_turns",
                      "Claude Code wrote the structured-output request, then stopped at max_turns (it counts that "
                      "request as a turn, like a Stop hook's block); followed as end_turn, then settle")
            line_enforce = self.enforce
            self.enforce = None
            self.end_response(line_enforce, "end_turn", json_schema=False)
            self.emit(line, StopHookVerdict(blocked=True, reason="structured output required"), "settle")
            self.hooks_due_line = None
        elif self.feedback is not None:
            self.settle_feedback(line)
        else:
            self.find(line, "out_of_place", "max_turns reached where the loop is not between turns")

    def on_interrupt(self, line: int) -> None:
        """The user interrupted: ``abort`` from a running phase; at stop, while Stop hooks were due, the
        end stands (their verdict is a pass)."""
        if self.phase is Phase.STOP and self.hooks_due_line is not None and self.feedback is None:
            self.emit(line, StopHookVerdict(), "settle")
            self.hooks_due_line = None
        elif self.phase in (Phase.ASSEMBLE, Phase.CALL_MODEL, Phase.STREAM, Phase.DISPATCH_TOOLS):
            self.emit(line, Aborted(), "abort")
            self.response, self.batch, self.enforce, self.feedback = None, None, None, None
        else:
            self.find(line, "out_of_place", "an interrupt while the loop is not running")

    # -- failures and retries -----------------------------------------------------------------------

    def on_api_error_message(self, line: int, rec: Mapping[str, Any], text: str) -> None:
        """A synthetic API-error assistant message: the run ends."""
        api_error = rec.get("apiError") or rec.get("api_error")
        cut = rec.get("streamCutCause") or rec.get("truncatedAfterOutput")
        if self.phase in (Phase.ASSEMBLE, Phase.DISPATCH_TOOLS, None) or (
                self.phase is Phase.STOP and self.feedback is not None):
            self.to_call(line)
        if self.source == STREAM_JSON and not cut and api_error is None \
                and rec.get("error") == "server_error" and rec.get("api_error_status") is None:
            cut = True
        if REFUSED_AGAIN in text and self.phase in (Phase.CALL_MODEL, Phase.STREAM):
            # refused again after the one retry: the run ends (the refused response is not kept)
            if self.phase is Phase.CALL_MODEL:
                self.emit(line, StreamOpened(), "open_stream")
                self.response = None
            self.end_response(line, "recovery_exhausted", stop_reason="refusal")
            return
        # an SSE error event of another type (invalid_request_error, ...) is shown as a generic API error
        # (``error: unknown``) with no cut cause
        generic = rec.get("error") == "unknown" and rec.get("apiErrorStatus", rec.get("api_error_status")) is None
        if (cut or generic) and api_error is None and self.phase is Phase.STREAM and self.response is not None \
                and self.response.tool_uses():
            # an error event cut the response after complete tool_use blocks: Claude Code 2.1.332 keeps it and
            # runs its calls, as if it had ended with tool_use (graph.cut_after_tool_use)
            self.end_response(self.response.last_line, "dispatch", stop_reason="tool_use")
            return
        if api_error in ("max_output_tokens", "malformed_tool_use_exhausted") or cut:
            if self.phase is Phase.CALL_MODEL:
                self.emit(line, StreamOpened(), "open_stream")
                self.response = None
            if cut:
                self.find(line, "cc_mid_stream_resume", "a response cut mid-stream after the cap of resumes: Claude "
                                                        "Code ends the run here (api_error)")
            stop = "tool_use" if api_error == "malformed_tool_use_exhausted" else "max_tokens"
            if api_error == "malformed_tool_use_exhausted" and self.response is not None:
                self.response.blocks = [b for b in self.response.blocks if b.get("type") != "tool_use"]
            self.end_response(line, "recovery_exhausted", stop_reason=stop)
            return
        status = rec.get("apiErrorStatus", rec.get("api_error_status"))
        details = str(rec.get("errorDetails") or "")
        if text.startswith("Prompt is too long") or "prompt is too long" in details.lower():
            kind = "prompt_too_long"
        elif status == 529 or rec.get("apiErrorType", rec.get("api_error_type")) == "overloaded_error":
            kind = "overloaded"
        else:
            kind = "api"
        if self.phase not in (Phase.CALL_MODEL, Phase.STREAM):
            self.find(line, "out_of_place", "an API error message while no request is outstanding")
            return
        self.emit(line, CallFailed(ModelError(kind, text, status if isinstance(status, int) else None)),
                  "call_failed")
        self.response = None

    def on_fallback(self, line: int, status: int | None) -> None:
        self.emit(line, CallFailed(ModelError("overloaded", "overloaded; switching to the fallback model",
                                              status, retryable=True), fallback_available=True), "fallback_retry")
        self.response = None

    def on_stream_retry(self, open_line: int, line: int, why: str) -> None:
        """The same request again after a stream that broke (or never delivered content)."""
        if self.phase is Phase.CALL_MODEL:
            self.emit(open_line, StreamOpened(), "open_stream")
        self.find(line, "read_as_stream_retry", why)
        self.emit(line, CallFailed(ModelError("connection", why, None, retryable=True)), "stream_retry")
        self.response = None

    def on_compaction(self, line: int, reactive: bool, preserved_uuids: Sequence[str]) -> None:
        preserved: list[Message] = []
        for u in preserved_uuids:
            m = self.messages_by_uuid.get(u)
            if m is not None and m not in preserved:
                preserved.append(m)
        if not preserved:
            preserved = list(self.last_exchange)
        summary = Message("user", ({"type": "text", "text": "(compact summary)"},), kind="compact_summary")
        compaction = Compaction((summary, *preserved), "reactive" if reactive else "auto")
        if reactive:
            self.emit(line, CallFailed(ModelError("prompt_too_long", "Prompt is too long", 400),
                                       compaction=compaction), "reactive_compact_retry")
            self.response = None
        else:
            self.pending_compaction = compaction

    # -- the end ------------------------------------------------------------------------------------

    def _answered_in_stream(self, batch: _Batch) -> bool:
        """Some calls of the batch have their results and the observation that dispatched it is the last
        move (nothing after it): the calls that finished while the response streamed, before the client
        stopped over budget."""
        last = next((i for i in reversed(self.items) if isinstance(i, Observation)), None)
        return bool(batch.results) and last is not None and last.observed == ("dispatch",)

    def on_budget_refused(self, line: int, detail: str) -> None:
        """The client ended a run over its --max-budget-usd before it made a request (a pass that task
        notifications started after the budget was spent): ``call`` then the preflight's ``refuse``."""
        self.to_call(line)
        self.emit(line, Refused(TerminalReason.BUDGET_EXHAUSTED, detail), "refuse")

    def on_over_budget(self, line: int, cost_usd: float) -> None:
        """The client ended the run over its --max-budget-usd (spent ``cost_usd``) right after a response: the
        response takes ``over_budget``; none of its tool calls ran."""
        batch = self.batch
        if self.phase is Phase.DISPATCH_TOOLS and batch is not None and self._answered_in_stream(batch):
            # calls that finished while the response streamed (rejected before their tool, or run to the
            # end) have their results recorded, the others none: over_budget keeps the finished ones
            at = next(i for i in range(len(self.items) - 1, -1, -1)
                      if isinstance(self.items[i], Observation) and self.items[i].observed == ("dispatch",))
            ended = self.items[at]
            assert isinstance(ended, Observation) and isinstance(ended.event, StreamEnded)
            finished = tuple(results[0][1] for u in batch.response.tool_uses()
                             if (results := batch.results.get(str(u.get("id")))))
            self.items[at] = Observation(ended.line, attrs.evolve(ended.event, cost_usd=cost_usd, finished=finished),
                                         ("over_budget",))
            self.phase, self.batch, self.response = Phase.STOP, None, None
            return
        if self.phase is Phase.ASSEMBLE:
            self.to_call(line)  # stream-json shows no requests
        if self.phase is Phase.CALL_MODEL:
            # a response with nothing in it (Claude Code records none): the spend still reached the budget
            self.emit(line, StreamOpened(), "open_stream")
            self.response = None
            self.end_response(line, "over_budget", cost_usd=cost_usd)
            return
        r = self.response
        if self.phase is Phase.STREAM and r is not None:
            self.end_response(r.last_line, "over_budget", cost_usd=cost_usd)

    def finish(self, line: int, terminal_reason: str | None = None, stop_reason: str | None = None) -> None:
        """The run's records end (end of input, a new prompt, a stream-json result)."""
        if self.phase is None:
            return
        if self.phase is Phase.STREAM and self.enforce is not None:
            if terminal_reason == "max_turns":
                self.on_max_turns(line)
            else:
                self.end_response(self.enforce, "structured_output_retry", json_schema=True)
                self.enforce = None
        if self.phase is Phase.STREAM and self.response is not None:
            r = self.response
            trigger: str | None = "end_turn"
            if r.tool_uses():
                trigger = "dispatch"
            # a stop reason only the result line states (stream-json's answers carry none) is that line's claim
            at = line if stop_reason and not r.stop_reason else r.last_line
            self.end_response(at, trigger, stop_reason=stop_reason or r.stop_reason)
        if self.phase is Phase.DISPATCH_TOOLS and self.batch is not None:
            self.end_batch(line, "finish_batch" if terminal_reason is not None else None,
                           hook_stopped=terminal_reason == TerminalReason.HOOK_STOPPED.value)
        if self.phase is Phase.STOP and self.feedback is not None:
            if terminal_reason is not None:
                self.settle_feedback(line)
            else:
                fline, verdict = self.feedback
                self.emit(fline, verdict, None)
                self.feedback = None
        if self.phase is Phase.STOP and self.hooks_due_line is not None:
            prevented = terminal_reason == "stop_hook_prevented"
            self.emit(line if prevented else self.hooks_due_line, StopHookVerdict(prevented=prevented), "settle")
            self.hooks_due_line = None
        # the run's records ended with the loop at stop: a task notification may take it on
        self.stopped = self.phase is Phase.STOP and self.feedback is None
        self.phase = None
        self.response = None
        self.batch = None
