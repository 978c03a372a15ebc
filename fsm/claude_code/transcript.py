"""Claude Code session transcripts (``~/.claude/projects/<escaped cwd>/<session-id>.jsonl``) read as
events of the graph: one record per content block, request records, hidden loop messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentfsm.claude_code.items import INTERRUPTED, LOCAL_COMMAND_STARTS, STOP_CAP_NOTICE, TRANSCRIPT, Internal
from agentfsm.claude_code.walker import Walker, blocks_of, meta_kind, text_of
from agentfsm.state import Message, Phase

# transcript records that carry no loop event (bookkeeping, resume pointers, request blobs)
_TRANSCRIPT_BOOKKEEPING = frozenset({
    "queue-operation", "api-request-blob", "api-request-shape", "last-prompt", "atis-latch", "cost-state",
    "tools-used", "summary", "file-history-snapshot", "custom-title", "tag"})
_TRANSCRIPT_SYSTEM_QUIET = frozenset({"informational", "local_command", "turn_duration"})


class TranscriptWalker(Walker):
    """Reads a transcript: requests from ``api-request`` records, responses one record per block."""

    source = TRANSCRIPT

    def __init__(self, json_schema: bool) -> None:
        super().__init__(json_schema)
        self.request: Mapping[str, Any] | None = None
        self.request_line = 0
        self.retry_errors: list[tuple[int, Mapping[str, Any]]] = []  # system api_error records since the request
        self.sidechain_seen = False
        self.has_requests = True

    def walk(self, numbered: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        # older clients wrote no request records: then a response's first block stands for its request
        self.has_requests = any(rec.get("type") == "api-request" for _, rec in numbered)
        last = 0
        for line, rec in numbered:
            last = line
            if rec.get("isSidechain"):
                if not self.sidechain_seen:
                    self.sidechain_seen = True
                    self.find(line, "sidechain", "subagent (sidechain) records from here on are not audited")
                continue
            handler = getattr(self, "_" + str(rec.get("type")).replace("-", "_"), None)
            if handler is not None:
                handler(line, rec)
            elif rec.get("type") not in _TRANSCRIPT_BOOKKEEPING:
                self.find(line, "unknown_record", f"record type {rec.get('type')!r} is not known; not interpreted")
        self.finish(last)

    # requests

    def _api_request(self, line: int, rec: Mapping[str, Any]) -> None:
        if rec.get("querySource") not in (None, "sdk", "repl_main_thread"):
            return  # not the main loop (a side query); the main loop's requests are what the graph moves on
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
        # the client's last record of a run: a request still unanswered here was answered with nothing
        if self.phase is Phase.CALL_MODEL and self.request is not None:
            self.on_empty_answer(line, "the last request has no answer and the run ended: read as an empty answer")

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
            self.unparsable(line, blocks)
            return
        if self.phase is not Phase.CALL_MODEL and self.has_requests:
            self.find(line, "out_of_place", "a response with no request record before it")
        r = self.open_stream(line, rid, str(msg.get("model") or ""), msg.get("stop_reason"))
        r.add(line, blocks, rec.get("uuid"))
        self.unparsable(line, blocks)

    def _user(self, line: int, rec: Mapping[str, Any]) -> None:
        msg = rec.get("message") or {}
        if rec.get("isCompactSummary"):
            return  # the boundary before it is the event
        blocks = blocks_of(msg)
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if results:
            for b in results:
                self.add_result(line, b, bool(rec.get("toolEndsTurn")), rec.get("uuid"))
            return
        if rec.get("isMeta"):
            text = text_of(msg)
            kind = meta_kind(text)
            if kind is None:
                self.find(line, "unknown_record", "a hidden user message the recogniser does not know: "
                                                  f"{text[:60]!r}")
            else:
                self.on_meta(line, kind, text)
            return
        text = text_of(msg)
        if text.startswith(INTERRUPTED):
            self.on_interrupt(line)
            return
        if text.lstrip().startswith(LOCAL_COMMAND_STARTS):
            return  # a local command's input or output: the loop does not run for it
        prompt = Message("user", tuple(blocks) or ({"type": "text", "text": ""},), kind="prompt",
                         uuid=str(rec.get("uuid") or ""))
        self.start_run(line, prompt)

    def _attachment(self, line: int, rec: Mapping[str, Any]) -> None:
        att = rec.get("attachment") or {}
        if att.get("type") == "max_turns_reached":
            self.on_max_turns(line)

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
        elif sub not in _TRANSCRIPT_SYSTEM_QUIET:
            self.find(line, "unknown_record", f"system record {sub!r} is not known; not interpreted")
