"""Findings and the checks every auditor shares: reading a JSONL file by line, request pairing.

A :class:`Finding` is one problem (or remark) about one line of an input. Both auditors —
:mod:`agentfsm.auditing.audit` for agentfsm traces, :mod:`agentfsm.auditing.claude_code_audit` for Claude Code
transcripts
and stream-json output — report through it, with the codes of :data:`CODES`, so ``agentfsm audit
--codes`` lists every one and a code means the same thing whatever was audited.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.machine.state import Message

ERROR = "error"
WARNING = "warning"
INFO = "info"

# code -> what it means (`agentfsm audit --codes` lists them)
CODES: Mapping[str, str] = {
    "unreadable_line": "a line (not the last) that is not a JSON record with a 'type'",
    "undecodable_line": "a line that is not valid UTF-8 (its bad bytes are replaced to read on)",
    "unknown_state": "a transition names a state the graph does not have",
    "unknown_trigger": "a transition's trigger is not a declared edge",
    "undeclared_move": "a transition's from/to is not declared for its trigger, or the machine refuses it",
    "kind_mismatch": "a transition's recorded edge kind differs from the declared one",
    "discontinuous": "a transition does not start where the previous one ended",
    "counter_over_cap": "a counter exceeds the Limits field that caps it",
    "turn_over_cap": "the turn exceeds max_turns",
    "counter_negative": "a counter below zero",
    "counter_jump": "a counter rose by more than one in one move",
    "counter_backwards": "a counter fell without being reset to 0",
    "counter_without_edge": "a counter rose on a move whose edge never raises it",
    "bad_event": "a transition's event record cannot be read",
    "missing_event": "a transition without its event where the machine had nothing to decide on its own",
    "replay_mismatch": "re-deciding the recorded event gives another move or state than recorded",
    "message_mismatch": "a message record differs from what the replayed move added (roles, tool ids, results)",
    "message_missing": "the replayed move added a message the file does not record",
    "bad_terminal_reason": "a move into stop without a terminal reason its edge allows",
    "result_before_stop": "a result record while the loop is not at stop",
    "result_mismatch": "the result's terminal_reason differs from the last move into stop",
    "result_subtype": "the result's subtype/is_error disagree with TERMINAL_INFO",
    "duplicate_result": "a second result record in one run",
    "transition_after_result": "a transition after the run's result record",
    "request_after_stop": "a request after the loop reached stop without a move out of it (stop_hook_blocking, "
                          "task_notification)",
    "bad_request": "a request record without a list of messages",
    "role_order": "request messages do not alternate user/assistant starting with user",
    "duplicate_tool_use": "a tool_use id occurs more than once in one request",
    "unpaired_tool_use": "a tool_use without a tool_result in the next message",
    "duplicate_tool_result": "a tool_use with more than one tool_result",
    "orphan_tool_result": "a tool_result without its tool_use in the previous message",
    "duplicate_record": "a Claude Code record written twice (same uuid, or a block of one message again with the same "
                        "content); the copy is not read",
    "stop_reason_mismatch": "a Claude Code message's stop_reason contradicts its blocks (tool calls that 'ended the "
                            "turn')",
    "not_a_trace": "the file is not an agentfsm trace, a Claude Code transcript or stream-json output",
    "seq_order": "record seq numbers are not consecutive (records missing or reordered)",
    "out_of_place": "a Claude Code record the loop cannot produce at this point (e.g. a response with no request)",
    # warnings
    "graph_changed": "the session was recorded under another declaration (digest differs): not replayed",
    "no_replay": "a format-1 trace records no events: moves are checked, not replayed",
    "torn_last_line": "the last line was cut off mid-write (a crash or a truncated copy); it is skipped",
    "no_session_record": "records before any session record; default limits are used",
    "incomplete_run": "a run without a result record (crashed or still running)",
    "unknown_record": "a Claude Code record type the recogniser does not know (a newer client?); not interpreted",
    "unsandboxed_command": "a command the model ran outside the kernel sandbox (the record says why: turned off, "
                           "unavailable, excludedCommands, dangerouslyDisableSandbox)",
    "cc_unmodelled_retry": "Claude Code sent the same request again in a way the graph has no edge for "
                           "(a 400 retried with fewer beta headers); no move is recorded",
    "cc_mid_stream_resume": "Claude Code kept a response an SSE error cut mid-stream and asked it to resume, on the "
                            "max-output-tokens counter; the graph would retry the stream (stream_retry). Followed as "
                            "max_output_tokens_recovery",
    "cc_structured_output_once": "Claude Code asks for the StructuredOutput call once per run; a later answer "
                                 "without it ends the run completed (the graph would retry up to its cap)",
    "cc_structured_output_max_turns": "Claude Code counts the structured-output request as a turn and ended at "
                                      "max_turns instead of re-entering; followed as end_turn then settle",
    # remarks: how an ambiguous record was read (neither a problem nor counted)
    "read_as_stream_retry": "a retry that leaves no other trace (a dropped connection, an SSE error before any "
                            "content) is read as a stream that opened and broke (open_stream, stream_retry)",
    "read_as_empty_answer": "the client wrote no answer to its last request and ended the turn (a success with "
                            "an empty result): read as an answer with nothing in it (open_stream, end_turn)",
    "read_as_reactive_compaction": "stream-json does not show whether a compaction answered a prompt-too-long "
                                   "error; read as reactive_compact_retry",
    "read_as_stop_hook_context": "a new request after a text answer with nothing shown in between: stream-json "
                                 "does not show a Stop hook's additionalContext, which re-enters; read as "
                                 "end_turn, then stop_hook_blocking",
    "read_as_subagent_answer": "stream-json does not show a foreground subagent's last answer (it is the parent's "
                               "tool result): read as an answer that ended its turn",
    "client_version": "the input was written by a Claude Code version the recognition rules were not checked on",
}
WARNING_CODES: frozenset[str] = frozenset(
    {"graph_changed", "no_replay", "torn_last_line", "no_session_record", "incomplete_run", "unknown_record",
     "unsandboxed_command", "cc_unmodelled_retry", "cc_mid_stream_resume", "cc_structured_output_once",
     "cc_structured_output_max_turns"})
INFO_CODES: frozenset[str] = frozenset(
    {"read_as_stream_retry", "read_as_empty_answer", "read_as_reactive_compaction", "read_as_stop_hook_context",
     "read_as_subagent_answer", "client_version"})


def severity_of(code: str) -> str:
    return INFO if code in INFO_CODES else WARNING if code in WARNING_CODES else ERROR


@attrs.frozen
class Finding:
    """One problem in an input, or a remark about it (severity ``info``). ``line`` is the 1-based line of the
    record in the file."""

    line: int
    # only a declared code: `agentfsm audit --codes` documents every finding a user can meet, and a
    # code dropped from CODES (or misspelt where it is raised) fails where it is raised, not in a report
    code: str = attrs.field()
    message: str
    severity: str = attrs.field()

    @code.validator
    def _declared(self, _attribute: attrs.Attribute[str], value: str) -> None:
        if value not in CODES:
            raise ValueError(f"finding code {value!r} is not declared in agentfsm.auditing.checks.CODES")

    @severity.default
    def _severity(self) -> str:
        return severity_of(self.code)

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    @property
    def is_warning(self) -> bool:
        return self.severity == WARNING

    def __str__(self) -> str:
        return f"line {self.line}: {self.severity} [{self.code}] {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "code": self.code, "severity": self.severity, "level": self.severity,
                "message": self.message}


def read_numbered(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[Finding]]:
    """Records of a session file with their 1-based line numbers, and findings about the file itself.

    A torn last line (a crash mid-write) is reported and skipped; a broken line in the middle is
    reported (nothing the writer does produces one); bytes that are not UTF-8 are replaced and the
    line reported, so one bad byte never hides the rest of the file.
    """
    records: list[tuple[int, dict[str, Any]]] = []
    findings: list[Finding] = []
    with open(path, "rb") as fh:
        lines = fh.readlines()
    for lineno, raw in enumerate(lines, 1):
        if not raw.endswith(b"\n"):
            findings.append(Finding(lineno, "torn_last_line",
                                    f"the last line ({len(raw)} bytes, no newline) was cut off mid-write; skipped"))
            break
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.decode("utf-8", errors="replace")
            findings.append(Finding(lineno, "undecodable_line", f"not UTF-8 at byte {exc.start}; read with the "
                                                                 "bad bytes replaced"))
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            findings.append(Finding(lineno, "unreadable_line", f"not JSON ({exc.msg} at column {exc.colno})"))
            continue
        except RecursionError:
            findings.append(Finding(lineno, "unreadable_line", "not JSON (nested too deeply to read)"))
            continue
        if not isinstance(rec, dict) or "type" not in rec:
            findings.append(Finding(lineno, "unreadable_line", "not a record: a JSON object with a 'type' is required"))
            continue
        records.append((lineno, rec))
    return records, findings


def merge_roles(messages: Sequence[Message]) -> list[Message]:
    """Consecutive messages of one role travel as one (queued input after the tool results)."""
    out: list[Message] = []
    for m in messages:
        if out and out[-1].role == m.role:
            out[-1] = Message(m.role, (*out[-1].content, *m.content), kind=out[-1].kind, uuid=out[-1].uuid)
        else:
            out.append(m)
    return out


def check_pairs(messages: Sequence[Message]) -> Iterator[tuple[str, str]]:
    """Pairing problems of a conversation (every tool_use answered once in the next message)."""
    merged = [{"role": m.role, "blocks": list(m.content)} for m in merge_roles(messages)]
    for code, message in check_request(merged):
        if code in ("unpaired_tool_use", "duplicate_tool_result", "orphan_tool_result", "duplicate_tool_use"):
            yield code, message


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    blocks = message.get("blocks", message.get("content", []))
    return [b for b in blocks if isinstance(b, Mapping)] if isinstance(blocks, list) else []


def check_request(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
    """(code, message) for each problem of one request's message skeleton (or wire messages)."""
    for i, m in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if m.get("role") != expected:
            prev = f"after {messages[i - 1].get('role')!r} " if i else ""
            yield ("role_order",
                   f"messages[{i}] has role {m.get('role')!r} {prev}where {expected!r} is due: roles must "
                   "alternate user/assistant starting with user")
            break  # every later message is shifted: one finding says it
    seen: set[str] = set()
    for i, m in enumerate(messages):
        blocks = _blocks(m)
        if m.get("role") == "assistant":
            uses = [(b.get("id"), b.get("name")) for b in blocks if b.get("type") == "tool_use"]
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            results = ([b.get("tool_use_id") for b in _blocks(nxt) if b.get("type") == "tool_result"]
                       if nxt is not None and nxt.get("role") == "user" else [])
            for use_id, name in uses:
                if use_id in seen:
                    yield ("duplicate_tool_use",
                           f"tool_use id {use_id!r} ({name}) occurs again in messages[{i}]")
                    continue
                seen.add(use_id)
                n = results.count(use_id)
                if n == 0:
                    where = f"messages[{i + 1}]" if nxt is not None else "a next message (there is none)"
                    yield ("unpaired_tool_use",
                           f"tool_use {use_id!r} ({name}) in messages[{i}] has no tool_result in {where}")
                elif n > 1:
                    yield ("duplicate_tool_result",
                           f"tool_use {use_id!r} ({name}) in messages[{i}] has {n} tool_results "
                           f"in messages[{i + 1}]")
        elif m.get("role") == "user":
            prev = messages[i - 1] if i else None
            calls = ({b.get("id") for b in _blocks(prev) if b.get("type") == "tool_use"}
                     if prev is not None and prev.get("role") == "assistant" else set())
            where = f"messages[{i - 1}]" if i else "a previous message (there is none)"
            for b in blocks:
                if b.get("type") == "tool_result" and b.get("tool_use_id") not in calls:
                    yield ("orphan_tool_result",
                           f"tool_result for {b.get('tool_use_id')!r} in messages[{i}] has no tool_use with "
                           f"that id in {where}")


# --- what one audit reports ------------------------------------------------------------------------


@attrs.frozen
class MoveAt:
    """One move a run took, with the line of the record that shows it. ``declared``: the graph has
    this edge from ``source`` to ``dest``; ``reason``: the terminal reason of a move into stop;
    ``event``: the event it decided on, in record form (:func:`agentfsm.machine.events.to_record`), when known —
    what a picture of the run shows of each request, tool call and result."""

    label: str
    source: str
    dest: str
    line: int
    declared: bool = True
    reason: str | None = None
    event: Mapping[str, Any] | None = attrs.field(default=None, eq=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.source, "to": self.dest, "label": self.label, "line": self.line}
        if not self.declared:
            out["declared"] = False
        return out


@attrs.frozen
class RunAt:
    """One run of the loop in an input (a session file may hold several: later prompts, a resumed
    session, the run a background task's notification started): where it starts, what started it,
    its own path, how it ended and its counters at the end."""

    line: int
    cause: str
    moves: tuple[MoveAt, ...]
    terminal_reason: str | None
    counters: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "cause": self.cause, "moves": [m.label for m in self.moves],
                "terminal_reason": self.terminal_reason, "counters": dict(self.counters)}


@attrs.frozen
class Report:
    """The audit of one input: which kind it is, the moves it took, how it ended, its findings.
    ``internal``: what the client did inside a phase, no move of the graph (``(line, action, detail)``).
    ``runs``: the input's runs one by one (``moves`` is all of them in order; ``terminal_reason`` and
    ``counters`` are the last run's). ``children``: the subagent loops it started, each audited on its
    own, ``link`` naming the parent's tool call that started it and ``agent`` the subagent's id.
    ``facts``: what the records say that is no move (``(line, kind, detail)``): permission denials,
    the session's mode, background tasks."""

    path: str
    source: str
    moves: tuple[MoveAt, ...]
    terminal_reason: str | None
    counters: Mapping[str, Any]
    findings: tuple[Finding, ...]
    internal: tuple[tuple[int, str, str], ...] = ()
    version: str | None = None
    runs: tuple[RunAt, ...] = ()
    children: tuple[Report, ...] = ()
    link: str | None = None
    agent: str | None = None
    facts: tuple[tuple[int, str, str], ...] = ()

    @property
    def errors(self) -> int:
        """Errors in the input, its subagent loops' included."""
        return sum(f.is_error for f in self.findings) + sum(c.errors for c in self.children)

    @property
    def warnings(self) -> int:
        return sum(f.is_warning for f in self.findings) + sum(c.warnings for c in self.children)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path, "source": self.source, "moves": [m.to_json() for m in self.moves],
            "terminal_reason": self.terminal_reason, "counters": dict(self.counters),
            "errors": self.errors, "warnings": self.warnings,
            "findings": [{"path": self.path, **f.to_json()} for f in self.findings]}
        if self.internal:
            out["internal"] = [{"line": line, "action": action, "detail": detail}
                               for line, action, detail in self.internal]
        if self.version is not None:
            out["client_version"] = self.version
        if len(self.runs) > 1 or self.children:
            out["runs"] = [r.to_json() for r in self.runs]
        if self.children:
            out["children"] = [c.to_json() for c in self.children]
        if self.facts:
            out["facts"] = [{"line": line, "kind": kind, "detail": detail} for line, kind, detail in self.facts]
        if self.link is not None:
            out["link"] = self.link
        if self.agent is not None:
            out["agent"] = self.agent
        return out
