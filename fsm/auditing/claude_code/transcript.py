"""Claude Code session transcripts (``~/.claude/projects/<escaped cwd>/<session-id>.jsonl``) read as
events of the graph: one record per content block, request records, hidden loop messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentfsm.auditing.claude_code.items import (
    CONTEXT_START,
    INTERRUPTED,
    LOCAL_COMMAND_STARTS,
    PROMPT_BLOCKED,
    STOP_CAP_NOTICE,
    TASK_NOTIFICATION_START,
    TRANSCRIPT,
    Internal,
    RunStart,
)
from agentfsm.auditing.claude_code.records import (
    ATTACHMENTS,
    FACT,
    IGNORED,
    TRANSCRIPT_SYSTEM,
    TRANSCRIPT_TYPES,
    role_of,
)
from agentfsm.auditing.claude_code.walker import Walker, blocks_of, meta_kind, text_of
from agentfsm.machine.state import Message, Phase


class TranscriptWalker(Walker):
    """Reads a transcript: requests from ``api-request`` records, responses one record per block."""

    source = TRANSCRIPT

    def __init__(self, json_schema: bool, *, subagent: bool = False) -> None:
        super().__init__(json_schema)
        self.subagent = subagent  # a subagent's records: its first prompt is the one it was given
        self.request: Mapping[str, Any] | None = None
        self.request_line = 0
        self.retry_errors: list[tuple[int, Mapping[str, Any]]] = []  # system api_error records since the request
        self.has_requests = True
        self.process_ended = False  # a cost-state record: a later prompt is another client process's
        self.budget_usd: float | None = None  # the run's --max-budget-usd (its budget_usd attachment)

    def walk(self, numbered: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        # older clients wrote no request records: then a response's first block stands for its request
        self.has_requests = any(rec.get("type") == "api-request" for _, rec in numbered)
        last = 0
        for line, rec in self.in_answer_order(numbered):
            last = line
            kind = rec.get("type")
            role = role_of(TRANSCRIPT_TYPES, kind)
            if role is None:
                self.unknown(line, f"record type {kind!r}")
            elif role == FACT:
                self.fact(line, str(kind), str(rec.get(str(kind), "")))
            elif role != IGNORED:
                getattr(self, "_" + str(kind).replace("-", "_"))(line, rec)
        self.finish(last)
        self.report_unknown()

    def in_answer_order(self, numbered: Sequence[tuple[int, Mapping[str, Any]]]) -> list[tuple[int, Mapping[str, Any]]]:
        """The records, each loop request's record where its request was made. Claude Code 2.1.332 writes one
        ahead of its time after an SSE error that followed complete tool_use blocks: it keeps that response,
        runs its calls and records the request carrying their results before the response's own records
        (tests/fixtures/claude_code/sse_error_after_tool_use). Its responses say which request they answer
        (``requestRef``): a request record whose next response answers the request before it is read just
        before the first response that answers it. Line numbers stay the file's."""
        out = list(numbered)
        before: str | None = None  # the id of the last loop request read
        i = 0
        while i < len(out):
            rec = out[i][1]
            if rec.get("type") == "api-request" and self._loop_request(rec):
                rid = rec.get("id")
                refs = ((k, r.get("requestRef")) for k, (_, r) in enumerate(out[i + 1:], i + 1)
                        if r.get("type") == "assistant" and not r.get("isApiErrorMessage") and r.get("requestRef"))
                first = next(refs, None)
                if first is not None and before is not None and first[1] == before != rid:
                    answering = next((k for k, ref in refs if ref == rid), None)
                    if answering is not None:
                        out.insert(answering - 1, out.pop(i))
                        continue
                before = rid
            i += 1
        return out

    # requests

    def _loop_request(self, rec: Mapping[str, Any]) -> bool:
        """Whether a request record is the loop's own (not a side query): the requests the graph moves on."""
        source = rec.get("querySource")
        return source in (None, "sdk", "repl_main_thread") or (
            self.subagent and isinstance(source, str) and source.startswith("agent:"))

    def _api_request(self, line: int, rec: Mapping[str, Any]) -> None:
        if not self._loop_request(rec):
            return  # not the loop's own (a side query); the loop's requests are what the graph moves on
        prev, errors = self.request, self.retry_errors
        self.retry_errors = []
        same = (prev is not None and rec.get("base") == prev.get("id") and rec.get("tail") == []
                and self.phase in (Phase.CALL_MODEL, Phase.STREAM))
        if same:
            assert prev is not None
            self._same_request(line, rec, prev, errors)
        else:
            self.to_call(line)
        self.request, self.request_line = rec, line

    def _same_request(self, line: int, rec: Mapping[str, Any], prev: Mapping[str, Any],
                      errors: list[tuple[int, Mapping[str, Any]]]) -> None:
        params, before = rec.get("params") or {}, prev.get("params") or {}
        for eline, err in errors:
            status = (err.get("error") or {}).get("status")
            if err.get("source") != "connection_retry":
                self.items.append(Internal(eline, "transport_retry", str(status)))
        connection = [eline for eline, err in errors if err.get("source") == "connection_retry"]
        if params.get("model") != before.get("model"):
            last_status = next(((e.get("error") or {}).get("status") for _, e in reversed(errors)), None)
            self.on_fallback(line, last_status if isinstance(last_status, int) else 529)
        elif connection:
            self.on_stream_retry(connection[0], line, "the connection dropped (ECONNRESET) and the request was sent "
                                                      "again; read as a stream that opened and broke")
        elif errors:
            pass  # transport retries: inside call_model
        elif len(params.get("betas") or ()) < len(before.get("betas") or ()):
            self.items.append(Internal(line, "beta_strip_retry", "fewer beta headers"))
            self.find(line, "cc_unmodelled_retry", "the same request sent again with fewer beta headers (Claude Code's "
                                                   "retry of a 400 invalid_request_error); no edge of the graph")
        else:
            self.on_stream_retry(self.request_line, line, "the same request sent again with no error record (an SSE "
                                                          "error before any content); read as stream_retry")

    def _cost_state(self, line: int, rec: Mapping[str, Any]) -> None:
        # the client's last record of a run: a request still unanswered here was answered with nothing;
        # a response still open with the spend at the budget is where the run stopped over budget
        cost = rec.get("totalCostUSD")
        if (self.budget_usd is not None and isinstance(cost, int | float) and cost >= self.budget_usd
                and (self.phase in (Phase.STREAM, Phase.DISPATCH_TOOLS)
                     or (self.phase is Phase.CALL_MODEL and self.request is not None))):
            self.on_over_budget(line, float(cost))
        if self.phase is Phase.CALL_MODEL and self.request is not None:
            self.on_empty_answer(line, "the last request has no answer and the run ended: read as an empty answer")
        self.process_ended = True

    # messages

    def _assistant(self, line: int, rec: Mapping[str, Any]) -> None:
        msg = rec.get("message") or {}
        if rec.get("isApiErrorMessage"):
            self.on_api_error_message(line, rec, text_of(msg))
            return
        rid = str(msg.get("id") or rec.get("requestId") or "")
        blocks = blocks_of(msg)
        r = self.response
        if self.phase is Phase.STREAM and r is not None and r.id == rid:
            r.add(line, blocks, rec.get("uuid"))
            if msg.get("stop_reason"):
                r.stop_reason = msg["stop_reason"]
            return
        if self.phase is not Phase.CALL_MODEL and self.has_requests:
            self.find(line, "out_of_place", "a response with no request record before it")
        r = self.open_stream(line, rid, str(msg.get("model") or ""), msg.get("stop_reason"))
        r.add(line, blocks, rec.get("uuid"))

    def _user(self, line: int, rec: Mapping[str, Any]) -> None:
        msg = rec.get("message") or {}
        if rec.get("isCompactSummary"):
            return  # the boundary before it is the event
        blocks = blocks_of(msg)
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if results:
            if rec.get("toolDenialKind"):
                self.fact(line, "permission_denied", f"{', '.join(str(b.get('tool_use_id')) for b in results)} "
                                                     f"({rec.get('toolDenialKind')})")
            for b in results:
                self.add_result(line, b, bool(rec.get("toolEndsTurn")), rec.get("uuid"))
            return
        if rec.get("isMeta"):
            text = text_of(msg)
            kind = meta_kind(text)
            if kind is not None:
                self.on_meta(line, kind, text)
            elif not text.lstrip().startswith(CONTEXT_START):  # context riding with the next prompt
                self.unknown(line, f"a hidden user message {text[:40]!r}")
            return
        text = text_of(msg)
        if text.startswith(INTERRUPTED):
            self.on_interrupt(line)
            return
        if text.lstrip().startswith(LOCAL_COMMAND_STARTS):
            return  # a local command's input or output: the loop does not run for it
        prompt = Message("user", tuple(blocks) or ({"type": "text", "text": ""},), kind="prompt",
                         uuid=str(rec.get("uuid") or ""))
        cause = ("task-notification" if text.lstrip().startswith(TASK_NOTIFICATION_START) else
                 "resume" if self.process_ended else
                 "subagent" if self.subagent and not any(isinstance(i, RunStart) for i in self.items) else "prompt")
        self.process_ended = False
        self.start_run(line, prompt, cause)

    def _attachment(self, line: int, rec: Mapping[str, Any]) -> None:
        att = rec.get("attachment") or {}
        kind = att.get("type") if isinstance(att, Mapping) else None
        role = role_of(ATTACHMENTS, kind)
        if role is None:
            self.unknown(line, f"attachment type {kind!r}")
        elif role == FACT:
            self.fact(line, str(kind), str(att.get("commandMode") or ""))
        elif kind == "max_turns_reached":
            self.on_max_turns(line)
        elif kind == "budget_usd" and isinstance(att.get("total"), int | float):
            self.budget_usd = float(att["total"])

    def _system(self, line: int, rec: Mapping[str, Any]) -> None:
        sub = rec.get("subtype")
        if sub == "api_error":
            self.retry_errors.append((line, rec))
        elif sub == "model_fallback":
            pass  # written after the fallback model's request, which is the move
        elif sub == "compact_boundary":
            meta = rec.get("compactMetadata") or {}
            preserved = (meta.get("preservedMessages") or {}).get("uuids") or ()
            reactive = self.phase is Phase.CALL_MODEL
            if self.phase is Phase.DISPATCH_TOOLS:
                self.end_batch(line, "next_turn")
            self.on_compaction(line, reactive, [str(u) for u in preserved])
        elif sub == "stop_hook_summary":
            self.on_stop_hooks(line, blocked=bool(rec.get("hookErrors")) and self.feedback is not None,
                               prevented=bool(rec.get("preventedContinuation")),
                               stop_reason=str(rec.get("stopReason") or ""),
                               context=[str(c) for c in rec.get("hookAdditionalContext") or ()])
        elif sub == "informational" and STOP_CAP_NOTICE in str(rec.get("content", "")):
            self.settle_feedback(line)
        elif sub == "informational" and str(rec.get("content", "")).startswith(PROMPT_BLOCKED):
            self.on_prompt_blocked(line, str(rec.get("content")))
        elif role_of(TRANSCRIPT_SYSTEM, sub) is None:
            self.unknown(line, f"system record {sub!r}")
