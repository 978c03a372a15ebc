"""The trace auditor: checks a session file (JSONL, :mod:`agentfsm.runtime.trace`) against the declaration.

Everything is judged against :mod:`agentfsm.machine.graph` — the same edges and routes that run the loop —
so "declared" means one thing everywhere. Two kinds of checks:

* **Replay** (format 2 traces, which record each move's event): the machine is pure, so the auditor
  re-decides every recorded event from the state the previous move left (:func:`agentfsm.machine.graph.advance`)
  and compares the recorded move field by field — edge, route, destination, every counter and flag,
  the terminal reason. Anything the declared machine would not have produced is flagged with the
  record's line and the field. Moves a phase makes on its own (feedback) must follow in order.
* **Structure** (every format): each transition is a declared edge and starts where the previous one
  ended; counters never go negative, never jump, never go backwards except to 0, and rise only on
  the edges that raise them; caps hold; a move into ``stop`` carries a terminal reason its edge
  allows; the result repeats the last move's reason with the subtype and ``is_error`` of
  :data:`agentfsm.machine.state.TERMINAL_INFO`; every request alternates user/assistant and pairs every
  ``tool_use`` with exactly one ``tool_result``; no request after the loop stopped; record numbers
  are consecutive; a torn last line is reported as truncated.

A file that is not an agentfsm trace (empty, binary, another tool's JSONL) is refused with one line
(:class:`NotATrace`), never answered "ok". One session file may hold several runs of the loop (a
session that took several prompts, or was resumed): each starts with the ``prompt`` message the
driver records before its first move.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.auditing import claude_code
from agentfsm.auditing.checks import (
    CODES,
    ERROR,
    INFO,
    WARNING,
    WARNING_CODES,
    Finding,
    MoveAt,
    Report,
    check_pairs,
    check_request,
    merge_roles,
    read_numbered,
    severity_of,
)
from agentfsm.auditing.claude_code_audit import replay, with_subagent_files
from agentfsm.auditing.coverage import Coverage, Move, coverage, declared_moves, trace_files
from agentfsm.common.progress import interrupted, steps
from agentfsm.machine.events import EventRecordError, from_record, message_skeleton
from agentfsm.machine.graph import DECLARED_MOVES, EDGES_BY_TRIGGER, Edge, Step, UndeclaredMove, advance
from agentfsm.machine.state import (
    COUNTER_CAPS,
    COUNTERS,
    COUNTERS_BY_KEY,
    RAISED_BY,
    TERMINAL_INFO,
    Limits,
    LoopState,
    Message,
    Phase,
    TerminalReason,
    ToolUseContext,
)
from agentfsm.runtime.trace import (
    PROMPT_KINDS,
    TRACE_VERSION,
    RunStarts,
    SnapshotReader,
    graph_digest,
    transition_snapshots,
)

__all__ = ["AGENTFSM", "CODES", "ERROR", "INFO", "WARNING", "WARNING_CODES", "Coverage", "Finding", "Move",
           "MoveAt", "NotATrace", "Report", "audit", "audit_file", "audit_report", "check_pairs", "check_request",
           "coverage", "declared_moves", "main", "read_numbered", "recognise", "trace_files"]

# RAISED_BY (which edges may raise each counter, by exactly one: the structural check for every trace
# format) is declared on the counters' fields (agentfsm.machine.state.counter), not here.


class NotATrace(ValueError):
    """The input cannot be read as an agentfsm trace at all (empty, binary, another format)."""


_STATES = frozenset(p.value for p in Phase)
_REASONS = frozenset(r.value for r in TerminalReason)
_START = Phase.ASSEMBLE.value
_STOP = Phase.STOP.value
# the moves that leave stop for another pass of the loop (a Stop hook's block, a task notification)
_REENTER_FROM_STOP = frozenset(e.trigger for e in EDGES_BY_TRIGGER.values()
                               if Phase.STOP in e.sources and e.dest is not Phase.STOP)
AGENTFSM = "agentfsm"
SOURCES: Mapping[str, str] = {AGENTFSM: "agentfsm trace", claude_code.TRANSCRIPT: "Claude Code transcript",
                              claude_code.STREAM_JSON: "Claude Code stream-json output"}
_KNOWN = "not an agentfsm trace, a Claude Code transcript or a Claude Code stream-json output"
# how far recognition reads before it gives up: whole lines, never a byte prefix
_RECOGNISE_LINES = 200
_RECOGNISE_BYTES = 16 * 1024 * 1024
_OUR_TYPES = frozenset({"session", "message", "assistant_block", "compact_boundary", "transition", "request", "sandbox",
                        "result", "task"})


# --- reading -----------------------------------------------------------------------------------


def recognise(path: Path) -> str:
    """Which kind of input ``path`` is: :data:`AGENTFSM` (a session file), :data:`claude_code.TRANSCRIPT`
    or :data:`claude_code.STREAM_JSON`. Raises :class:`NotATrace` for anything else."""
    if not path.is_file():
        raise NotATrace(f"{path}: no such file")
    # decided by whole records, not by a byte prefix: Claude Code 2.1.332 writes a ~30 KiB prompt
    # snapshot and request records before the first answer, so with the prompt's line damaged the
    # first message that says "transcript" can lie past 64 KiB
    parsed: list[dict[str, Any]] = []
    damaged = 0
    read = 0
    nul = False
    with open(path, "rb") as fh:
        # readline's limit bounds memory on a file with no newlines (a binary file)
        while len(parsed) + damaged < _RECOGNISE_LINES and read < _RECOGNISE_BYTES:
            raw = fh.readline(_RECOGNISE_BYTES - read)
            if not raw:
                break
            read += len(raw)
            nul = nul or b"\x00" in raw
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                damaged += 1
                continue  # a broken or damaged line (a NUL byte, a torn write): the others decide
            if not isinstance(rec, dict):
                damaged += 1
                continue
            if rec.get("type") in _OUR_TYPES and "seq" in rec:
                if rec.get("type") == "session" and isinstance(rec.get("version"), int) \
                        and rec["version"] > TRACE_VERSION:
                    raise NotATrace(f"{path}: recorded by a newer agentfsm (trace format {rec['version']}; this "
                                    f"version reads formats 1 to {TRACE_VERSION})")
                return AGENTFSM
            parsed.append(rec)
            if claude_code.kind_of((rec,)) is not None:
                break
    if not parsed and not damaged:
        raise NotATrace(f"{path}: empty file, {_KNOWN}")
    if not parsed and nul:
        raise NotATrace(f"{path}: binary file, {_KNOWN}")
    kind = claude_code.kind_of(parsed)
    if kind is not None:
        return kind
    raise NotATrace(f"{path}: {_KNOWN} (no agentfsm session, message or transition records; no Claude Code "
                    "transcript or stream-json records)")


# --- auditing ----------------------------------------------------------------------------------


def audit(records: Iterable[Mapping[str, Any]], *, limits: Limits | Mapping[str, Any] | None = None
          ) -> list[Finding]:
    """Audit records in file order; record *n* is reported as line *n*. ``limits`` overrides the caps
    recorded in the session records (e.g. to audit against stricter caps than the run used)."""
    return sorted(_Auditor(limits).run(enumerate(records, 1)), key=lambda f: f.line)


def audit_file(path: Path | str, *, limits: Limits | Mapping[str, Any] | None = None) -> list[Finding]:
    """Audit one input — an agentfsm session file, a Claude Code transcript or stream-json output —
    and return its findings sorted by line (errors, warnings and remarks). Raises :class:`NotATrace`
    for a file that is none of those."""
    return list(audit_report(path, limits=limits).findings)


def audit_report(path: Path | str, *, limits: Limits | Mapping[str, Any] | None = None) -> Report:
    """Audit one input (see :func:`audit_file`) and report its kind, the moves it took, how it ended,
    its counters and findings. For a Claude Code input, ``limits`` replaces
    :data:`agentfsm.auditing.claude_code.CLAUDE_CODE_LIMITS`; for an agentfsm trace, the caps its session
    records."""
    path = Path(path)
    source = recognise(path)
    numbered, findings = read_numbered(path)
    if source != AGENTFSM:
        override = limits if isinstance(limits, Limits) or limits is None else _limits_record(limits)
        reading = with_subagent_files(claude_code.read(numbered, source, limits=override, path=str(path)), path,
                                      read_numbered)
        report = replay(reading, str(path))
        return attrs.evolve(report, findings=tuple(sorted((*findings, *report.findings), key=lambda f: f.line)))
    findings.extend(_Auditor(limits).run(numbered))
    moves: list[MoveAt] = []
    reason: Any = None
    counters: Mapping[str, Any] = {}
    for line, rec in numbered:
        if rec.get("type") == "transition":
            frm, to, trig = str(rec.get("from")), str(rec.get("to")), str(rec.get("trigger"))
            edge = EDGES_BY_TRIGGER.get(trig)
            declared = edge is not None and frm in _STATES and Phase(frm) in edge.sources and edge.dest.value == to
            event = rec.get("event")
            reason_here = rec.get("terminal_reason") if to == _STOP else None
            moves.append(MoveAt(trig, frm, to, line, declared, reason=reason_here,
                                event=event if isinstance(event, Mapping) else None))
            reason = rec.get("terminal_reason") if to == _STOP else None
        elif rec.get("type") == "result":
            reason = rec.get("terminal_reason", reason)
    # the counters after the last move, from its full snapshot (format 3 records only what changed)
    snapshots = transition_snapshots(rec for _, rec in numbered)
    if snapshots:
        names = LoopState().counters()
        counters = {k: v for k, v in snapshots[-1][1].items() if k in names}
    return Report(str(path), AGENTFSM, tuple(moves), reason if isinstance(reason, str) else None, counters,
                  tuple(sorted(findings, key=lambda f: f.line)))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _limits_mapping(limits: Limits | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if limits is None:
        return None
    return attrs.asdict(limits) if isinstance(limits, Limits) else dict(limits)


def _limits_record(values: Mapping[str, Any]) -> Limits | None:
    names = set(Limits.field_names())
    try:
        return Limits(**{k: v for k, v in values.items() if k in names})
    except (TypeError, ValueError):
        return None


class _Auditor:
    """Walks the records once, following the loop run by run, replaying what it can."""

    def __init__(self, limits: Limits | Mapping[str, Any] | None) -> None:
        self.override = _limits_mapping(limits)
        self.findings: list[Finding] = []
        self.digest = graph_digest()
        self.last_seq: int | None = None
        self.limits: Mapping[str, Any] = self.override or attrs.asdict(Limits())
        self.replayable = True  # the session's format and declaration allow replay
        self.view: list[Message] = []  # the conversation as the message records rebuild it
        self._new_run()

    def _new_run(self) -> None:
        self.active = False  # the run has a transition, request or result
        self.run_start = 0
        self.at: str = _START  # where the loop is, per the transitions so far
        self.last_transition: int | None = None  # its line
        self.stopped: tuple[int, str, Any] | None = None  # (line, trigger, reason) of the move into stop
        self.last_reason: Any = None
        self.result_line: int | None = None
        self.over: set[str] = set()  # counters (and "turn") now over their caps
        self.counters: dict[str, Any] | None = None  # the last transition's counters
        self.reader = SnapshotReader()  # each transition's full snapshot, whatever the format
        self.reported: set[tuple[str, str]] = set()  # request problems already reported in this run
        self.replay: LoopState | None = None  # the replayed state after the last move
        self.expected: list[Step] = []  # moves the machine makes on its own, still to be recorded
        self.appended: list[tuple[int, dict[str, Any]]] = []  # (move line, skeleton) still to be recorded

    def add(self, line: int, code: str, message: str) -> None:
        self.findings.append(Finding(line, code, message))

    def run(self, records: Iterable[tuple[int, Mapping[str, Any]]]) -> list[Finding]:
        saw_session = replacing = False
        starts = RunStarts()
        for line, rec in records:
            new_run = starts.starts_run(rec)
            self._seq(line, rec)
            kind = rec.get("type")
            if kind == "session":
                self._end_run()
                saw_session = True
                self._session(line, rec)
                continue
            if not saw_session:
                saw_session = True  # warn once
                self.add(line, "no_session_record",
                         "records before any session record: the caps of the default Limits are used")
            if kind == "compact_boundary":
                # the messages that follow, up to the next other record, are the new view
                replacing = True
                continue
            if kind == "message":
                if new_run:
                    self._end_run()
                if not starts.rewriting:
                    self._check_appended(line, rec)
                self._message(rec, replace=replacing)
                replacing = False
                continue
            if kind == "sandbox":
                self._sandbox(line, rec)
                continue
            if kind in ("transition", "request", "result") and not self.active:
                self.active, self.run_start = True, line
            if kind == "transition":
                self._transition(line, rec)
            elif kind == "request":
                self._request(line, rec)
            elif kind == "result":
                self._result(line, rec)
        self._end_run()
        return self.findings

    def _sandbox(self, line: int, rec: Mapping[str, Any]) -> None:
        """How a command of the model ran (agentfsm.tools.sandbox): report those outside the sandbox."""
        if rec.get("sandboxed") is True:
            return
        what = "was refused" if rec.get("refused") else "ran outside the kernel sandbox"
        self.add(line, "unsandboxed_command",
                 f"command {rec.get('tool_use_id') or '?'} {what}: {rec.get('reason') or 'no reason recorded'}")

    def _message(self, rec: Mapping[str, Any], *, replace: bool) -> None:
        if replace:
            self.view = []
        if rec.get("kind") == "erased_prompt" or rec.get("role") not in ("user", "assistant"):
            return
        content = rec.get("content")
        blocks = tuple(b for b in content if isinstance(b, Mapping)) if isinstance(content, list) else ()
        self.view.append(Message(rec["role"], blocks, kind=str(rec.get("kind", "prompt")),
                                 uuid=str(rec.get("uuid") or "")))

    def _check_appended(self, line: int, rec: Mapping[str, Any]) -> None:
        """A message record after a replayed move: it must be the next message that move added."""
        if not self.appended or rec.get("kind") in PROMPT_KINDS:
            return
        move_line, want = self.appended.pop(0)
        got = message_skeleton(Message(str(rec.get("role")), tuple(
            b for b in rec.get("content") or () if isinstance(b, Mapping)), kind=str(rec.get("kind"))))
        for skel in (want, got):
            skel.pop("uuid", None)
        if got != want:
            self.add(line, "message_mismatch", f"the message recorded here is not what the move at line {move_line} "
                                               f"added: recorded {_brief(got)}, replay {_brief(want)}")

    def _flush_appended(self, line: int) -> None:
        if self.appended:
            move_line, want = self.appended[0]
            self.add(line, "message_missing", f"the move at line {move_line} added {len(self.appended)} message(s) "
                                              f"the file does not record before this line (first: {_brief(want)})")
            self.appended = []

    def _seq(self, line: int, rec: Mapping[str, Any]) -> None:
        seq = rec.get("seq")
        if not _is_number(seq):
            return
        if self.last_seq is not None and seq != self.last_seq + 1:
            self.add(line, "seq_order", f"seq {seq} follows seq {self.last_seq} (expected {self.last_seq + 1})")
        self.last_seq = seq

    def _end_run(self) -> None:
        if self.active and self.result_line is None:
            self.add(self.run_start, "incomplete_run",
                     f"the run starting at line {self.run_start} has no result record (last position: {self.at})")
        self._new_run()

    def _session(self, line: int, rec: Mapping[str, Any]) -> None:
        recorded = rec.get("limits")
        limits = attrs.asdict(Limits())
        if isinstance(recorded, Mapping):
            limits.update(recorded)
        self.limits = self.override or limits
        self.view = []
        version = rec.get("version")
        self.replayable = True
        if version == 1:
            self.replayable = False
            self.add(line, "no_replay", "trace format 1 records no events: every move is checked against the "
                                        "declaration, but not replayed")
        digest = rec.get("graph")
        if digest != self.digest:
            self.replayable = False
            self.add(line, "graph_changed",
                     f"session {rec.get('session_id')!r} was recorded under declaration {digest!r}; the current "
                     f"one is {self.digest!r} — moves are checked against the current edges, not replayed")

    # transitions

    def _transition(self, line: int, rec: Mapping[str, Any]) -> None:
        self._flush_appended(line)
        frm, to, trig = rec.get("from"), rec.get("to"), rec.get("trigger")
        what = f"transition {trig!r} ({frm} → {to})"
        if self.result_line is not None:
            self.add(line, "transition_after_result", f"{what} after the result record at line {self.result_line}")
        if frm != self.at:
            where = (f"the previous transition (line {self.last_transition}) ended at {self.at!r}"
                     if self.last_transition is not None else f"a run starts at {_START!r}")
            self.add(line, "discontinuous", f"{what} starts at {frm!r} but {where}")
        edge = self._check_declared(line, what, frm, to, trig, rec.get("kind"))
        snap = self.reader.read(rec)
        reason = rec.get("terminal_reason")
        if to == _STOP and edge is not None and edge.dest is Phase.STOP:
            allowed = sorted(r.value for r in edge.reasons)
            if reason not in allowed:
                self.add(line, "bad_terminal_reason",
                         f"{what} ends the loop with terminal_reason {reason!r}; {trig!r} allows {', '.join(allowed)}")
        self._check_counters(line, what, str(trig), snap)
        self._check_caps(line, what, snap)
        if self.replayable:
            self._replay(line, what, rec, snap)
        if to == _STOP:
            self.stopped = (line, str(trig), reason)
            self.last_reason = reason
        elif frm == _STOP and trig in _REENTER_FROM_STOP:
            self.stopped = None
        self.at = to if isinstance(to, str) else repr(to)
        self.last_transition = line

    def _check_declared(self, line: int, what: str, frm: Any, to: Any, trig: Any, kind: Any) -> Edge | None:
        unknown = [s for s in (frm, to) if s not in _STATES]
        if unknown:
            self.add(line, "unknown_state", f"{what} names {', '.join(repr(s) for s in unknown)}, not a state of "
                                            f"the graph ({', '.join(p.value for p in Phase)})")
            return None
        edge = EDGES_BY_TRIGGER.get(trig) if isinstance(trig, str) else None
        others = sorted(DECLARED_MOVES.get((Phase(frm), Phase(to)), ()))
        alt = (f"the graph declares {frm} → {to} only as {', '.join(others)}" if others
               else f"the graph declares no move {frm} → {to}")
        if edge is None:
            self.add(line, "unknown_trigger", f"{what}: {trig!r} is not a declared trigger; {alt}")
            return None
        if Phase(frm) not in edge.sources or Phase(to) is not edge.dest:
            srcs = "/".join(s.value for s in edge.sources)
            self.add(line, "undeclared_move",
                     f"{what} is not a declared edge: {trig!r} goes {srcs} → {edge.dest.value}; {alt}")
            return None
        if kind is not None and kind != edge.kind:
            self.add(line, "kind_mismatch", f"{what} is recorded as kind {kind!r}; the edge is {edge.kind!r}")
        return edge

    def _check_counters(self, line: int, what: str, trigger: str, snap: Mapping[str, Any]) -> None:
        counters = {k: v for k, v in snap.items() if k in RAISED_BY or k in COUNTER_CAPS}
        prev = self.counters
        for name, value in counters.items():
            # reported where it went negative, not on every move it stays there
            if _is_number(value) and value < 0 and (prev is None or prev.get(name) != value):
                self.add(line, "counter_negative", f"counter {name}={value} is negative after {what}")
        self.counters = counters
        if prev is None:
            return
        for name, raisers in RAISED_BY.items():
            old, new = prev.get(name), counters.get(name)
            if not (_is_number(old) and _is_number(new)) or new == old:
                continue
            if new > old + 1:
                self.add(line, "counter_jump", f"counter {name} went {old} → {new} in one move ({what})")
            elif new > old and trigger not in raisers:
                self.add(line, "counter_without_edge",
                         f"counter {name} rose {old} → {new} on {what}; only {', '.join(sorted(raisers))} raise it")
            elif new < old and new != (initial := COUNTERS_BY_KEY[name].default):
                # a counter goes back only to where it starts (its field's declared default)
                self.add(line, "counter_backwards", f"counter {name} went back {old} → {new} on {what} "
                                                    f"(counters only reset, to {initial})")

    def _check_caps(self, line: int, what: str, counters: Mapping[str, Any]) -> None:
        # a counter stays over its cap on every move until it resets: report the move that took it
        # over, not each one after
        for name, field in COUNTER_CAPS.items():
            value, cap = counters.get(name), self.limits.get(field)
            over = _is_number(value) and _is_number(cap) and value > cap
            if over and name not in self.over:
                self.add(line, "counter_over_cap", f"counter {name}={value} exceeds its cap {field}={cap} after {what}")
            (self.over.add if over else self.over.discard)(name)
        turn, max_turns = counters.get("turn_count"), self.limits.get("max_turns")
        over = _is_number(turn) and _is_number(max_turns) and turn > max_turns
        if over and "turn" not in self.over:
            self.add(line, "turn_over_cap", f"turn {turn} exceeds max_turns={max_turns} after {what}")
        (self.over.add if over else self.over.discard)("turn")

    # replay

    def _replay(self, line: int, what: str, rec: Mapping[str, Any], snap: Mapping[str, Any]) -> None:
        """Re-decide the recorded event and compare; the replayed state carries on."""
        event_rec = rec.get("event")
        if event_rec is None:
            if not self.expected:
                self.add(line, "missing_event", f"{what} records no event, and the machine had no move of its own "
                                                "to make here")
                self.replay = None
                self._last_snapshot = snap
                return
            step = self.expected.pop(0)
            before = self.replay
        else:
            if self.expected:
                self.add(line, "replay_mismatch", f"{what}: the machine would first have moved on its own "
                                                  f"({self.expected[0].trigger}); that move is missing")
                self.expected = []
            limits = _limits_record(self.limits)
            if not isinstance(event_rec, Mapping) or limits is None:
                self.add(line, "bad_event", f"{what}: the event record or the session's limits cannot be read")
                self.replay = None
                self._last_snapshot = snap
                return
            try:
                event = from_record(event_rec)
            except EventRecordError as exc:
                self.add(line, "bad_event", f"{what}: {exc}")
                self.replay = None
                self._last_snapshot = snap
                return
            state = before = self._state_before(rec)
            try:
                steps = advance(state, event, limits)
            except (UndeclaredMove, AssertionError) as exc:
                self.add(line, "undeclared_move", f"{what}: the machine refuses {event_rec.get('type')} in "
                                                  f"{state.phase.value}: {exc}")
                self.replay = None
                self._last_snapshot = snap
                return
            step, self.expected = steps[0], list(steps[1:])
        self._compare(line, what, rec, snap, step)
        self.replay = step.state
        old, new = (before.messages if before is not None else ()), step.state.messages
        if before is not None and len(new) >= len(old) and all(a is b for a, b in zip(old, new, strict=False)):
            self.appended += [(line, message_skeleton(m)) for m in new[len(old):]]

    def _state_before(self, rec: Mapping[str, Any]) -> LoopState:
        """The replayed state before this move: the last replayed one, with the conversation as the
        message records rebuilt it; at a run's first move (or after a move that could not be
        replayed), a fresh one at the recorded source with the recorded counters."""
        messages = tuple(self.view)
        if self.replay is not None:
            return attrs.evolve(self.replay, messages=messages)
        fresh = LoopState(messages=messages, tool_use_context=ToolUseContext())
        if self.last_transition is None:
            return fresh
        return _restore(fresh, self.at, self._last_snapshot)

    _last_snapshot: Mapping[str, Any] = {}

    def _compare(self, line: int, what: str, rec: Mapping[str, Any], snap: Mapping[str, Any], step: Step) -> None:
        self._last_snapshot = snap
        got = step.state.snapshot()
        diffs = []
        for field, want in (("trigger", step.trigger), ("route", step.route), ("to", got["phase"])):
            if rec.get(field) != want:
                diffs.append(f"{field} {rec.get(field)!r} (replay: {want!r})")
        # every place the record states a field must agree with the replay
        stated: list[tuple[str, Any]] = list(snap.items())
        for part in (rec.get("counters"), rec.get("state"), rec.get("changed")):
            if isinstance(part, Mapping):
                stated += list(part.items())
        stated += [("terminal_reason", rec.get("terminal_reason"))]
        if "turn" in rec:
            stated.append(("turn_count", rec.get("turn")))
        seen: set[tuple[str, str]] = set()
        for field, value in stated:
            if field == "phase" or field not in got or got[field] == value or (field, repr(value)) in seen:
                continue
            seen.add((field, repr(value)))
            diffs.append(f"{field} {value!r} (replay: {got[field]!r})")
        if diffs:
            self.add(line, "replay_mismatch", f"{what} is not what the declared machine does here: " + "; ".join(diffs))

    # results

    def _result(self, line: int, rec: Mapping[str, Any]) -> None:
        self._flush_appended(line)
        for code, message in check_pairs(self.view):
            if (code, message) not in self.reported:  # a request of the run already showed it
                self.add(line, code, f"at the end of the run, the conversation: {message}")
        if self.result_line is not None:
            self.add(line, "duplicate_result", f"a second result record (the first is at line {self.result_line})")
        if self.expected:
            self.add(line, "replay_mismatch", f"the run ended before the machine's own move {self.expected[0].trigger}")
            self.expected = []
        reason = rec.get("terminal_reason")
        if self.stopped is None:
            self.add(line, "result_before_stop",
                     f"result record (terminal_reason {reason!r}) while the loop is at {self.at!r}"
                     + (f" (line {self.last_transition})" if self.last_transition is not None else ""))
        elif reason != self.last_reason:
            stop_line, trig, last = self.stopped
            self.add(line, "result_mismatch", f"result terminal_reason {reason!r} but the last move into stop "
                                              f"({trig!r}, line {stop_line}) carried {last!r}")
        elif reason not in _REASONS:
            self.add(line, "result_mismatch", f"result terminal_reason {reason!r} is not a terminal reason")
        if reason in _REASONS:
            info = TERMINAL_INFO[TerminalReason(reason)]
            subtype, is_error = rec.get("subtype"), rec.get("is_error")
            if subtype != info.subtype or is_error != info.is_error:
                self.add(line, "result_subtype",
                         f"result for {reason!r} has subtype={subtype!r}, is_error={is_error!r}; "
                         f"TERMINAL_INFO says subtype={info.subtype!r}, is_error={info.is_error!r}")
        self.result_line = line

    # requests

    def _request(self, line: int, rec: Mapping[str, Any]) -> None:
        if self.stopped is not None:
            stop_line, trig, reason = self.stopped
            self.add(line, "request_after_stop", f"request sent after the loop reached stop at line {stop_line} "
                                                 f"({trig!r}, {reason!r}) with no move out of stop "
                                                 f"({', '.join(sorted(_REENTER_FROM_STOP))}) in between")
        elif self.result_line is not None:
            self.add(line, "request_after_stop", f"request sent after the result record at line {self.result_line}")
        messages = rec.get("messages")
        if isinstance(messages, int) and not isinstance(messages, bool):
            self._request_by_reference(line, rec, messages)
            return
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            self.add(line, "bad_request", "a request record needs 'messages': how many messages it carried "
                                          "(or, format 2, a list of {role, blocks})")
            return
        for code, message in check_request(messages):
            self.add(line, code, message)

    def _request_by_reference(self, line: int, rec: Mapping[str, Any], count: int) -> None:
        """Format 3: the request carried the first ``count`` messages of the conversation as the message
        records rebuild it, the last of them ``last``; their pairing is checked on the records."""
        if not 0 < count <= len(self.view):
            self.add(line, "bad_request", f"the request says it carried {count} messages; the conversation recorded "
                                          f"before it has {len(self.view)}")
            return
        if self.view[count - 1].uuid != rec.get("last"):
            self.add(line, "bad_request", f"the request's last message is {rec.get('last')!r}; the conversation's "
                                          f"message {count} is {self.view[count - 1].uuid!r}")
        for i in range(1, count):
            if self.view[i].role == self.view[i - 1].role == "assistant":
                problem = ("role_order", f"conversation message {i} ({self.view[i].uuid}) is an assistant message "
                                         "right after another: two answers would travel as one")
                if problem not in self.reported:
                    self.reported.add(problem)
                    self.add(line, *problem)
        wire = [{"role": m.role, "blocks": list(m.content)} for m in merge_roles(self.view[:count])]
        for code, message in check_request(wire):
            if (code, message) not in self.reported:  # a problem carried on by later requests is one problem
                self.reported.add((code, message))
                self.add(line, code, message)


def _brief(skel: Mapping[str, Any]) -> str:
    blocks = ", ".join(str(b.get("type")) + (f":{b.get('id') or b.get('tool_use_id')}" if b.get("id") or
                                             b.get("tool_use_id") else "") for b in skel.get("content", ()))
    return f"{skel.get('role')} {skel.get('kind')} [{blocks}]"


def _restore(state: LoopState, phase: str, snap: Mapping[str, Any]) -> LoopState:
    """A state at ``phase`` carrying a recorded snapshot's counters (to resume replay after a move
    that could not be replayed)."""
    fields: dict[str, Any] = {"phase": Phase(phase) if phase in _STATES else Phase.ASSEMBLE}
    # every counter the fields declare (agentfsm.machine.state.COUNTERS), where it lives; then the rest of the
    # snapshot that is not a counter
    nested: dict[str, Any] = {"turns_since_compact": int(snap.get("turns_since_compact", 0) or 0),
                              "compactions": int(snap.get("compactions", 0) or 0)}
    for c in COUNTERS:
        if "." in c.path:
            nested[c.path.split(".", 1)[1]] = int(snap.get(c.key, 0) or 0)
        elif c.key in snap:
            fields[c.path] = snap[c.key]
    for name in ("stop_hooks_due", "transition"):
        if name in snap:
            fields[name] = snap[name]
    reason = snap.get("terminal_reason")
    fields["terminal_reason"] = TerminalReason(reason) if reason in _REASONS else None
    tracking = attrs.evolve(state.compact_tracking, **nested)
    depth = snap.get("depth")
    query = state.query_tracking
    if isinstance(depth, int) and not isinstance(depth, bool):
        query = attrs.evolve(query, depth=depth)
    try:
        return attrs.evolve(state, compact_tracking=tracking, query_tracking=query, **fields)
    except (TypeError, ValueError):
        return state


# --- CLI ---------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentfsm audit",
        description="Check runs against the declared graph: agentfsm session traces (every recorded event "
                    "replayed), Claude Code session transcripts (~/.claude/projects/<cwd>/<session>.jsonl) and "
                    "Claude Code stream-json output (-p --output-format stream-json --verbose), whose events are "
                    "inferred from the records and replayed through the same machine; or, with --coverage, "
                    "report which declared edges and terminal reasons a set of runs exercised. "
                    "Exit 0: no problems; 1: problems found; 2: an input is none of those.")
    p.add_argument("traces", nargs="*", type=Path, metavar="TRACE",
                   help="session files, transcripts or stream-json files (.jsonl); a directory means every "
                        ".jsonl below it")
    p.add_argument("--json", action="store_true",
                   help="machine-readable output: one JSON object per input, one per line")
    p.add_argument("--coverage", action="store_true", help="report edge and terminal-reason coverage")
    p.add_argument("--require-full", action="store_true",
                   help="with --coverage: exit 1 unless every edge and every terminal reason was exercised")
    p.add_argument("--codes", action="store_true", help="list the finding codes and exit")
    p.add_argument("--html", metavar="OUT.html",
                   help="write the audit as one self-contained HTML page instead (graph, timeline, state after "
                        "each move, findings linked to their lines; needs the report extra)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.html is not None:  # `agentfsm audit --html` goes to agentfsm.report, a layer above this one
        _parser().error("--html is written by the agentfsm command: agentfsm audit --html OUT.html PATH…")
    if args.codes:
        for code, doc in CODES.items():
            print(f"{code:36} {severity_of(code):8} {doc}")
        return 0
    if not args.traces:
        _parser().error("give at least one TRACE")
    if args.require_full and not args.coverage:
        _parser().error("--require-full goes with --coverage")
    try:
        return _main(args)
    except KeyboardInterrupt:  # reports are printed only once all are made: none was half written
        return interrupted("agentfsm audit", ["nothing was reported"])


def _main(args: argparse.Namespace) -> int:
    files = []
    for given in args.traces:
        found = trace_files([given])
        if given.is_dir() and not found:
            print(f"agentfsm audit: {given}: no .jsonl session files in this directory", file=sys.stderr)
            return 2
        files.extend(_without_subagent_files(found) if given.is_dir() else found)
    # every input is reported on its own: one that is not a trace is a finding for it, not the end
    kinds: dict[Path, str] = {}
    refused: dict[Path, str] = {}
    with steps(files, "recognising") as each:
        for f in each:
            try:
                kinds[f] = recognise(f)
            except NotATrace as exc:
                refused[f] = str(exc)
                print(f"agentfsm audit: {exc}", file=sys.stderr)
    if args.coverage:
        status = _main_coverage(kinds, as_json=args.json, require_full=args.require_full)
    else:
        status = _main_audit([f for f in files if f in kinds], as_json=args.json, refused=refused)
    return 2 if refused else status


def _without_subagent_files(files: Sequence[Path]) -> list[Path]:
    """A directory's files without the subagent transcripts of a session also in it
    (``<session>/subagents/agent-*.jsonl``): they are audited as that session's child runs."""
    given = set(files)
    return [f for f in files if not (f.parent.name == "subagents" and f.name.startswith("agent-")
                                     and f.parent.parent.with_suffix(".jsonl") in given)]


def _counted(labels: Iterable[str]) -> str:
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{label} ×{n}" for label, n in counts.items())


def summary_line(report: Report) -> str:
    """One line saying what was read and how it went (the text format's last line per input)."""
    n_err, n_warn = report.errors, report.warnings
    verdict = "ok" if not n_err else f"{n_err} error{'s' * (n_err != 1)}"
    if n_warn:
        verdict += f", {n_warn} warning{'s' * (n_warn != 1)}"
    if report.source == AGENTFSM:
        return f"{report.path}: agentfsm trace, {verdict}"
    kinds = {m.label: EDGES_BY_TRIGGER[m.label].kind if m.label in EDGES_BY_TRIGGER else "?" for m in report.moves}
    reentries = _counted(m.label for m in report.moves if kinds[m.label] == "reentry")
    retries = _counted(m.label for m in report.moves if kinds[m.label] == "retry")
    parts = [f"{len(report.moves)} moves", f"re-entries: {reentries or 'none'}"]
    if retries:
        parts.append(f"retries: {retries}")
    last = next((m for m in reversed(report.moves) if m.dest == _STOP), None)
    parts.append(f"ended {report.terminal_reason} ({last.label})" if report.terminal_reason and last is not None
                 else "did not reach stop")
    version = f" {report.version}" if report.version else ""
    return f"{report.path}: {SOURCES[report.source]}{version}, {'; '.join(parts)}; {verdict}"


def _main_audit(files: list[Path], *, as_json: bool, refused: Mapping[Path, str] | None = None) -> int:
    with steps(files, "auditing") as each:
        reports = [audit_report(f) for f in each]
    for report in reports:
        if as_json:
            print(json.dumps(report.to_json(), ensure_ascii=False))
            continue
        _print_report(report)
    if as_json:
        for f, why in (refused or {}).items():
            finding = Finding(1, "not_a_trace", why)
            print(json.dumps({"path": str(f), "source": None, "moves": [], "terminal_reason": None, "counters": {},
                              "errors": 1, "warnings": 0, "findings": [{"path": str(f), **finding.to_json()}]},
                             ensure_ascii=False))
    return 1 if any(r.errors for r in reports) else 0


def _print_report(report: Report, indent: str = "") -> None:
    for f in report.findings:
        print(f"{indent}{report.path}:{f.line}: {f.severity} [{f.code}] {f.message}")
    for line, kind, detail in report.facts:
        print(f"{indent}{report.path}:{line}: fact [{kind}] {detail}".rstrip())
    if report.source != AGENTFSM and report.moves:
        if len(report.runs) > 1:
            for n, run in enumerate(report.runs, 1):
                print(f"{indent}{report.path}: run {n} (line {run.line}, {run.cause}): "
                      + " → ".join(m.label for m in run.moves) + f"; ended {run.terminal_reason or 'nowhere'}")
        else:
            print(f"{indent}{report.path}: path: " + " → ".join(m.label for m in report.moves))
    for child in report.children:
        print(f"{indent}  subagent {child.agent or ''} started by tool call {child.link or '?'}:")
        _print_report(child, indent + "  ")
    print(indent + summary_line(report))


def _move_json(m: Move) -> dict[str, str]:
    return {"trigger": m.trigger, "from": m.source, "to": m.dest}


def _main_coverage(kinds: Mapping[Path, str], *, as_json: bool, require_full: bool) -> int:
    taken: Counter[Move] = Counter()
    reasons: Counter[str] = Counter()
    with steps(list(kinds), "counting moves in") as each:
        for f in each:
            if kinds[f] == AGENTFSM:
                ours = coverage([f])
                taken.update(ours.taken_edges)
                reasons.update(ours.reasons)
                continue
            top = audit_report(f)
            for report in (top, *top.children):  # each subagent loop is a run of the loop too
                taken.update(Move(m.label, m.source, m.dest) for m in report.moves if m.declared)
                for run in report.runs or ():
                    if run.terminal_reason is not None:
                        reasons[run.terminal_reason] += 1
    cov = Coverage(taken, reasons, [m for m in declared_moves() if m not in taken],
                   [r.value for r in TerminalReason if r.value not in reasons])
    files = list(kinds)
    moves = declared_moves()
    full = not cov.missing_edges and not cov.missing_reasons
    if as_json:
        print(json.dumps({
            "traces": len(files),
            "edges": [{**_move_json(m), "count": cov.taken_edges[m]} for m in moves],
            "terminal_reasons": [{"reason": r.value, "count": cov.reasons[r.value]} for r in TerminalReason],
            "missing_edges": [_move_json(m) for m in cov.missing_edges],
            "missing_reasons": cov.missing_reasons,
        }, indent=2))
    else:
        width = max(len(m.trigger) for m in moves)
        print(f"declared edges exercised: {len(moves) - len(cov.missing_edges)}/{len(moves)} "
              f"({len(files)} trace{'s' * (len(files) != 1)})")
        for m in moves:
            n = cov.taken_edges[m]
            print(f"  {'×' + str(n) if n else 'never':>7}  {m.trigger:{width}}  {m.source} → {m.dest}")
        reasons = list(TerminalReason)
        print(f"terminal reasons reached: {len(reasons) - len(cov.missing_reasons)}/{len(reasons)}")
        for r in reasons:
            n = cov.reasons[r.value]
            print(f"  {'×' + str(n) if n else 'never':>7}  {r.value}")
    return 1 if require_full and not full else 0


if __name__ == "__main__":
    sys.exit(main())
