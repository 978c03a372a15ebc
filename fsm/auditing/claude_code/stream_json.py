"""Claude Code's stream-json output (``-p --output-format stream-json --verbose``) read as events of the
graph: one line per content block, no request records, no stop reasons, a final result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentfsm.auditing.claude_code.items import (
    COMPACT_SUMMARY_START,
    INTERRUPTED,
    MALFORMED,
    PROMPT_BLOCKED,
    STOP_CAP_NOTICE,
    STREAM_JSON,
    THINKING_ONLY,
    Internal,
    Observation,
    RunEnd,
)
from agentfsm.auditing.claude_code.records import FACT, STREAM_SYSTEM, STREAM_TYPES, role_of
from agentfsm.auditing.claude_code.walker import Walker, blocks_of, meta_kind, text_of
from agentfsm.machine.state import Phase


class StreamWalker(Walker):
    """Reads stream-json: a new response id stands for its request; stop reasons are inferred."""

    source = STREAM_JSON

    def __init__(self, json_schema: bool, causes: Mapping[int, str] | None = None, *,
                 subagent_end: tuple[int, str] | None = None) -> None:
        super().__init__(json_schema)
        self.causes: Mapping[int, str] = causes or {}  # init line -> what started that run
        self.notified = False  # a task_notification line came since the loop's last move
        self.subagent_end = subagent_end  # a subagent's lines: (line, status) of its last task notice
        self.spent: float | None = None  # the total cost the last result line gave

    def walk(self, numbered: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        last = 0
        for line, rec in numbered:
            last = line
            kind = rec.get("type")
            if kind == "assistant":
                self._assistant(line, rec)
            elif kind == "user":
                self._user(line, rec)
            elif kind == "system":
                self._system(line, rec)
            elif kind == "result":
                self._result(line, rec)
            elif role_of(STREAM_TYPES, kind) is None:
                self.unknown(line, f"line type {kind!r}")
        if self.subagent_end is not None:
            end_line, status = self.subagent_end
            if status == "completed" and self.phase is Phase.DISPATCH_TOOLS and self.batch is not None:
                self.end_batch(end_line, "next_turn")  # its tools' results went back to it
            if status == "completed" and self.phase is Phase.ASSEMBLE:
                self.on_unshown_answer(end_line)
            last = max(last, end_line)
        self.finish(last)
        self.report_unknown()

    def emit(self, line: int, event: Any, *observed: str | None) -> None:
        super().emit(line, event, *observed)
        self.notified = False  # (a task the model stopped mid-run notifies too: that starts no pass)

    def _begin(self, line: int) -> None:
        if self.phase is None:
            self.start_run(line, None, self.causes.get(line, "prompt"))

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
            return
        if self.phase is not Phase.CALL_MODEL:
            self.to_call(line)
        r = self.open_stream(line, rid, str(msg.get("model") or ""))
        r.add(line, blocks, rec.get("uuid"))

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
        if sub == "task_notification":
            self.notified = True
        if sub == "init":
            # what started this pass: its result's origin, else a task notification told just before
            # (results without result_index do not say)
            cause = self.causes.get(line) or ("task-notification" if self.notified else "prompt")
            self.notified = False
            if self.phase is not None and any(isinstance(i, Observation) for i in self.items):
                # each run of the process opens with its own init (the run a task notification started):
                # the one before is over, whether or not its result line came first
                self.start_run(line, None, cause)
            elif self.phase is None:
                self.start_run(line, None, cause)
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
        elif sub == "informational" and (
                (rec.get("prompt_submit_outcome") or {}).get("kind") == "blocked_by_hook"
                or str(rec.get("content", "")).startswith(PROMPT_BLOCKED)):
            self.on_prompt_blocked(line, str(rec.get("content")))
        elif role_of(STREAM_SYSTEM, sub) == FACT:
            self.fact(line, str(sub), _fact_detail(rec))
        elif role_of(STREAM_SYSTEM, sub) is None:
            self.unknown(line, f"system line {sub!r}")

    def _result(self, line: int, rec: Mapping[str, Any]) -> None:
        reason = rec.get("terminal_reason")
        if self.phase is None and not self.items:
            self.start_run(line, None)
        if (self.phase in (Phase.ASSEMBLE, Phase.CALL_MODEL) and rec.get("subtype") == "success"
                and rec.get("result") == ""):
            self.on_empty_answer(line, "a success with an empty result and no answer shown since the last "
                                       "request: read as an empty answer")
        usage = rec.get("usage") if isinstance(rec.get("usage"), Mapping) else {}
        requested = any(usage.get(k) for k in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                                "cache_creation_input_tokens"))
        cost = rec.get("total_cost_usd") if isinstance(rec.get("total_cost_usd"), int | float) else None
        spent_before, self.spent = self.spent, cost
        if (reason == "budget_exhausted" and self.phase is Phase.ASSEMBLE and not requested
                and spent_before is not None and cost is not None and cost <= spent_before):
            # a pass (after an earlier result of the run) that used and spent nothing and showed nothing:
            # refused before its request (an unanswered first request spent nothing either, but made one)
            errors = rec.get("errors")
            self.on_budget_refused(line, str(errors[0]) if isinstance(errors, list) and errors else "")
        elif reason == "budget_exhausted" and isinstance(rec.get("total_cost_usd"), int | float):
            self.on_over_budget(line, float(rec["total_cost_usd"]))
        self.finish(line, str(reason) if reason else "unknown", rec.get("stop_reason"))
        self.items.append(RunEnd(line, str(reason) if reason else None))


def _fact_detail(rec: Mapping[str, Any]) -> str:
    """What a fact line says, in a few words: the tool or task, its status."""
    if rec.get("subtype") == "background_tasks_changed":
        ids = [str(t.get("task_id")) for t in rec.get("tasks") or () if isinstance(t, Mapping)]
        return f"{len(ids)} running" + (": " + ", ".join(ids) if ids else "")
    parts = [f"{k}={rec[k]}" for k in ("tool_name", "tool_use_id", "task_id", "status", "is_backgrounded")
             if rec.get(k) is not None]
    patch = rec.get("patch")
    if isinstance(patch, Mapping) and patch.get("status"):
        parts.append(f"status={patch['status']}")
    return ", ".join(parts)
