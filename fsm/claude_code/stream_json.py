"""Claude Code's stream-json output (``-p --output-format stream-json --verbose``) read as events of the
graph: one line per content block, no request records, no stop reasons, a final result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentfsm.claude_code.items import (
    COMPACT_SUMMARY_START,
    INTERRUPTED,
    MALFORMED,
    STOP_CAP_NOTICE,
    STREAM_JSON,
    THINKING_ONLY,
    Internal,
    RunEnd,
)
from agentfsm.claude_code.walker import Walker, blocks_of, meta_kind, text_of
from agentfsm.state import Phase

_STREAM_SYSTEM_QUIET = frozenset({"init", "status", "thinking_tokens", "notification", "informational",
                                  "hook_started", "hook_response", "hook_progress"})
_STREAM_QUIET_TYPES = frozenset({"stream_event"})


class StreamWalker(Walker):
    """Reads stream-json: a new response id stands for its request; stop reasons are inferred."""

    source = STREAM_JSON

    def walk(self, numbered: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        last = 0
        sidechain = False
        for line, rec in numbered:
            last = line
            kind = rec.get("type")
            if rec.get("parent_tool_use_id"):
                if not sidechain:
                    sidechain = True
                    self.find(line, "sidechain", "subagent messages (parent_tool_use_id set) are not audited")
                continue
            if kind == "assistant":
                self._assistant(line, rec)
            elif kind == "user":
                self._user(line, rec)
            elif kind == "system":
                self._system(line, rec)
            elif kind == "result":
                self._result(line, rec)
            elif kind not in _STREAM_QUIET_TYPES:
                self.find(line, "unknown_record", f"line type {kind!r} is not known; not interpreted")
        self.finish(last)

    def _begin(self, line: int) -> None:
        if self.phase is None:
            self.start_run(line, None)

    def _assistant(self, line: int, rec: Mapping[str, Any]) -> None:
        self._begin(line)
        msg = rec.get("message") or {}
        if rec.get("is_api_error_message"):
            self.on_api_error_message(line, rec, text_of(msg))
            return
        rid = str(msg.get("id") or rec.get("request_id") or "")
        blocks = blocks_of(msg)
        r = self.response
        if self.phase is Phase.STREAM and r is not None and r.id == rid and self.enforce is None:
            r.add(line, blocks, rec.get("uuid"))
            self.unparsable(line, blocks)
            return
        if self.phase is not Phase.CALL_MODEL:
            self.to_call(line)
        r = self.open_stream(line, rid, str(msg.get("model") or ""))
        r.add(line, blocks, rec.get("uuid"))
        self.unparsable(line, blocks)

    def _user(self, line: int, rec: Mapping[str, Any]) -> None:
        self._begin(line)
        msg = rec.get("message") or {}
        blocks = blocks_of(msg)
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if results:
            for b in results:
                self.add_result(line, b, False, rec.get("uuid"))
            return
        text = text_of(msg)
        if text.startswith(COMPACT_SUMMARY_START):
            return
        if text.startswith(INTERRUPTED):
            self.on_interrupt(line)
            return
        kind = meta_kind(text)
        if kind is None:
            self.find(line, "unknown_record", f"a user line the recogniser does not know: {text[:60]!r}")
            return
        if kind == MALFORMED and self.response is not None:
            self.response.stop_reason = "tool_use"
        if kind == THINKING_ONLY and self.phase is not Phase.STREAM and self.phase is not Phase.CALL_MODEL:
            self.to_call(line)  # an answer with no output is not shown: its request was sent
        self.on_meta(line, kind, text)

    def _system(self, line: int, rec: Mapping[str, Any]) -> None:
        sub = rec.get("subtype")
        if sub == "init":
            self._begin(line)
        elif sub == "api_retry":
            self._begin(line)
            if self.phase is not Phase.CALL_MODEL and self.phase is not Phase.STREAM:
                self.to_call(line)
            if rec.get("error_status") is None:
                self.on_stream_retry(line, line, "a retry with no HTTP status (a dropped connection); read as a "
                                                 "stream that opened and broke")
            else:
                self.items.append(Internal(line, "transport_retry", str(rec.get("error_status"))))
        elif sub == "model_fallback":
            self._begin(line)
            if self.phase is not Phase.CALL_MODEL:
                self.to_call(line)
            self.on_fallback(line, 529 if rec.get("trigger") == "overloaded" else None)
        elif sub == "compact_boundary":
            self._begin(line)
            meta = rec.get("compact_metadata") or {}
            preserved = (meta.get("preserved_messages") or {}).get("uuids") or ()
            if self.phase is not Phase.CALL_MODEL:
                self.to_call(line)
            self.find(line, "read_as_reactive_compaction", "a compaction between requests: stream-json does not say "
                                                           "whether it answered a prompt-too-long error; read as "
                                                           "reactive_compact_retry")
            self.on_compaction(line, True, [str(u) for u in preserved])
        elif sub == "informational" and STOP_CAP_NOTICE in str(rec.get("content", "")):
            self.settle_feedback(line)
        elif sub not in _STREAM_SYSTEM_QUIET:
            self.find(line, "unknown_record", f"system line {sub!r} is not known; not interpreted")

    def _result(self, line: int, rec: Mapping[str, Any]) -> None:
        reason = rec.get("terminal_reason")
        if self.phase is None and not self.items:
            self.start_run(line, None)
        if (self.phase in (Phase.ASSEMBLE, Phase.CALL_MODEL) and rec.get("subtype") == "success"
                and rec.get("result") == ""):
            self.on_empty_answer(line, "a success with an empty result and no answer shown since the last "
                                       "request: read as an empty answer")
        self.finish(line, str(reason) if reason else "unknown", rec.get("stop_reason"))
        self.items.append(RunEnd(line, str(reason) if reason else None))
