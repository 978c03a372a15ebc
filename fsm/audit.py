"""The trace auditor: checks a session file (JSONL, :mod:`fsm.trace`) against the declared graph.

Everything is judged against :data:`fsm.graph.EDGES`, the same declaration that builds the runtime
machine and the diagrams, so "declared" means one thing everywhere. The checks (SPEC §3 invariants,
§8):

* every transition is a declared edge (trigger known, ``from`` one of its sources, ``to`` its
  destination) and starts where the previous one ended (the first of a run at ``assemble``);
* every capped counter, and the turn, stays within the caps of the session's ``limits``;
* a move into ``stop`` carries a terminal reason its edge allows; the ``result`` record repeats the
  last move's reason with the subtype and ``is_error`` of :data:`fsm.state.TERMINAL_INFO`;
* every request alternates user/assistant from a user message, and pairs every ``tool_use`` with
  exactly one ``tool_result`` in the next message (and no ``tool_result`` without its call);
* no request after the loop reached ``stop`` (unless ``stop_hook_blocking`` re-entered), no
  transition after the result;
* a session recorded under another graph digest is a warning (``graph_changed``), not an error.

One session file may hold several runs of the loop (a session that took several prompts, or was
resumed after a crash): each starts with the ``prompt`` message the driver records before its first
move, and the checks that follow the loop's position start over there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import attrs

from fsm.graph import DECLARED_MOVES, EDGES, EDGES_BY_TRIGGER, Edge
from fsm.state import COUNTER_CAPS, TERMINAL_INFO, Limits, Phase, TerminalReason
from fsm.trace import graph_digest

ERROR = "error"
WARNING = "warning"

# code -> what it means (`agentfsm audit --codes` lists them)
CODES: Mapping[str, str] = {
    "unreadable_line": "a line (not the last) that is not a JSON record with a 'type'",
    "unknown_state": "a transition names a state the graph does not have",
    "unknown_trigger": "a transition's trigger is not a declared edge",
    "undeclared_move": "a transition's from/to is not declared for its trigger",
    "kind_mismatch": "a transition's recorded edge kind differs from the declared one",
    "discontinuous": "a transition does not start where the previous one ended",
    "counter_over_cap": "a counter exceeds the Limits field that caps it",
    "turn_over_cap": "the turn exceeds max_turns",
    "bad_terminal_reason": "a move into stop without a terminal reason its edge allows",
    "result_before_stop": "a result record while the loop is not at stop",
    "result_mismatch": "the result's terminal_reason differs from the last move into stop",
    "result_subtype": "the result's subtype/is_error disagree with TERMINAL_INFO",
    "duplicate_result": "a second result record in one run",
    "transition_after_result": "a transition after the run's result record",
    "request_after_stop": "a request after the loop reached stop without stop_hook_blocking",
    "bad_request": "a request record without a list of messages",
    "role_order": "request messages do not alternate user/assistant starting with user",
    "duplicate_tool_use": "a tool_use id occurs more than once in one request",
    "unpaired_tool_use": "a tool_use without a tool_result in the next message",
    "duplicate_tool_result": "a tool_use with more than one tool_result",
    "orphan_tool_result": "a tool_result without its tool_use in the previous message",
    # warnings
    "graph_changed": "the session was recorded under another graph (digest differs)",
    "torn_last_line": "the last line was cut off mid-write (a crash); it is skipped",
    "no_session_record": "records before any session record; default limits are used",
    "seq_order": "record seq numbers are not consecutive (records missing or reordered)",
    "incomplete_run": "a run without a result record (crashed or still running)",
}
WARNING_CODES: frozenset[str] = frozenset(
    {"graph_changed", "torn_last_line", "no_session_record", "seq_order", "incomplete_run"})


@attrs.frozen
class Finding:
    """One problem in a trace. ``line`` is the 1-based line of the record in the file."""

    line: int
    code: str
    message: str
    severity: str = attrs.field()

    @severity.default
    def _severity(self) -> str:
        return WARNING if self.code in WARNING_CODES else ERROR

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def __str__(self) -> str:
        return f"line {self.line}: {self.severity} [{self.code}] {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "code": self.code, "severity": self.severity, "message": self.message}


class Move(NamedTuple):
    """One declared move: an edge with several sources is one move per source."""

    trigger: str
    source: str
    dest: str

    def __str__(self) -> str:
        return f"{self.trigger} ({self.source} → {self.dest})"


def declared_moves() -> list[Move]:
    """Every declared move, in the order of :data:`EDGES` (stable, for reports and diagrams)."""
    return [Move(e.trigger, s.value, e.dest.value) for e in EDGES for s in e.sources]


_STATES = frozenset(p.value for p in Phase)
_REASONS = frozenset(r.value for r in TerminalReason)
_START = Phase.ASSEMBLE.value
_STOP = Phase.STOP.value
_REENTER_FROM_STOP = "stop_hook_blocking"


# --- reading -----------------------------------------------------------------------------------


def read_numbered(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], list[Finding]]:
    """Records of a session file with their 1-based line numbers, and findings about the file itself.

    Same tolerance as :func:`fsm.trace.read_records` for a torn last line (a crash mid-write), but a
    broken line in the middle is reported instead of skipped: nothing the writer does produces one.
    """
    records: list[tuple[int, dict[str, Any]]] = []
    findings: list[Finding] = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.endswith("\n"):
            findings.append(Finding(lineno, "torn_last_line",
                                    f"the last line ({len(line)} characters, no newline) was cut off "
                                    "mid-write; skipped"))
            break
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            findings.append(Finding(lineno, "unreadable_line", f"not JSON ({exc.msg} at column {exc.colno})"))
            continue
        if not isinstance(rec, dict) or "type" not in rec:
            findings.append(Finding(lineno, "unreadable_line",
                                    "not a record: a JSON object with a 'type' is required"))
            continue
        records.append((lineno, rec))
    return records, findings


# --- auditing ----------------------------------------------------------------------------------


def audit(records: Iterable[Mapping[str, Any]], *, limits: Limits | Mapping[str, Any] | None = None
          ) -> list[Finding]:
    """Audit records in file order; record *n* is reported as line *n*.

    ``limits`` overrides the caps recorded in the session records (e.g. to audit against stricter
    caps than the run used).
    """
    return sorted(_Auditor(limits).run(enumerate(records, 1)), key=lambda f: f.line)


def audit_file(path: Path | str, *, limits: Limits | Mapping[str, Any] | None = None) -> list[Finding]:
    """Audit one session file; findings are sorted by line."""
    numbered, findings = read_numbered(Path(path))
    findings.extend(_Auditor(limits).run(numbered))
    return sorted(findings, key=lambda f: f.line)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _limits_mapping(limits: Limits | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if limits is None:
        return None
    return attrs.asdict(limits) if isinstance(limits, Limits) else dict(limits)


class _Auditor:
    """Walks the records once, following the loop's position run by run.

    A run is one call of the loop: it starts at the ``prompt`` message the driver records before its
    first move (a session file holds several runs when the session took several prompts or was
    resumed), or at a ``session`` record. Messages that follow a ``compact_boundary`` are the
    rewritten history, not a new prompt.
    """

    def __init__(self, limits: Limits | Mapping[str, Any] | None) -> None:
        self.override = _limits_mapping(limits)
        self.findings: list[Finding] = []
        self.digest = graph_digest()
        self.last_seq: int | None = None
        self.limits: Mapping[str, Any] = self.override or attrs.asdict(Limits())
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

    def add(self, line: int, code: str, message: str) -> None:
        self.findings.append(Finding(line, code, message))

    def run(self, records: Iterable[tuple[int, Mapping[str, Any]]]) -> list[Finding]:
        saw_session = rewriting = False
        for line, rec in records:
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
                rewriting = True
                continue
            if kind == "message":
                if rec.get("kind") in ("prompt", "erased_prompt") and not rewriting:
                    self._end_run()
                continue
            rewriting = False
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

    def _seq(self, line: int, rec: Mapping[str, Any]) -> None:
        seq = rec.get("seq")
        if not _is_number(seq):
            return
        if self.last_seq is not None and seq != self.last_seq + 1:
            self.add(line, "seq_order",
                     f"seq {seq} follows seq {self.last_seq} (expected {self.last_seq + 1})")
        self.last_seq = seq

    def _end_run(self) -> None:
        if self.active and self.result_line is None:
            self.add(self.run_start, "incomplete_run",
                     f"the run starting at line {self.run_start} has no result record "
                     f"(last position: {self.at})")
        self._new_run()

    def _session(self, line: int, rec: Mapping[str, Any]) -> None:
        recorded = rec.get("limits")
        limits = attrs.asdict(Limits())
        if isinstance(recorded, Mapping):
            limits.update(recorded)
        self.limits = self.override or limits
        digest = rec.get("graph")
        if digest != self.digest:
            self.add(line, "graph_changed",
                     f"session {rec.get('session_id')!r} was recorded under graph {digest!r}; the current "
                     f"graph is {self.digest!r} — moves are judged against the current declaration")

    # transitions

    def _transition(self, line: int, rec: Mapping[str, Any]) -> None:
        frm, to, trig = rec.get("from"), rec.get("to"), rec.get("trigger")
        what = f"transition {trig!r} ({frm} → {to})"
        if self.result_line is not None:
            self.add(line, "transition_after_result",
                     f"{what} after the result record at line {self.result_line}")
        if frm != self.at:
            where = (f"the previous transition (line {self.last_transition}) ended at {self.at!r}"
                     if self.last_transition is not None else f"a run starts at {_START!r}")
            self.add(line, "discontinuous", f"{what} starts at {frm!r} but {where}")
        edge = self._check_declared(line, what, frm, to, trig, rec.get("kind"))
        reason = rec.get("terminal_reason")
        if to == _STOP and edge is not None and edge.dest is Phase.STOP:
            allowed = sorted(r.value for r in edge.reasons)
            if reason not in allowed:
                self.add(line, "bad_terminal_reason",
                         f"{what} ends the loop with terminal_reason {reason!r}; {trig!r} allows "
                         f"{', '.join(allowed)}")
        self._check_caps(line, what, rec)
        if to == _STOP:
            self.stopped = (line, str(trig), reason)
            self.last_reason = reason
        elif frm == _STOP and trig == _REENTER_FROM_STOP:
            self.stopped = None
        self.at = to if isinstance(to, str) else repr(to)
        self.last_transition = line

    def _check_declared(self, line: int, what: str, frm: Any, to: Any, trig: Any,
                        kind: Any) -> Edge | None:
        unknown = [s for s in (frm, to) if s not in _STATES]
        if unknown:
            self.add(line, "unknown_state",
                     f"{what} names {', '.join(repr(s) for s in unknown)}, not a state of the graph "
                     f"({', '.join(p.value for p in Phase)})")
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

    def _check_caps(self, line: int, what: str, rec: Mapping[str, Any]) -> None:
        # a counter stays over its cap on every move until it resets: report the move that took it
        # over, not each one after
        counters = rec.get("counters")
        counters = counters if isinstance(counters, Mapping) else {}
        for name, field in COUNTER_CAPS.items():
            value, cap = counters.get(name), self.limits.get(field)
            over = _is_number(value) and _is_number(cap) and value > cap
            if over and name not in self.over:
                self.add(line, "counter_over_cap",
                         f"counter {name}={value} exceeds its cap {field}={cap} after {what}")
            (self.over.add if over else self.over.discard)(name)
        turn, max_turns = rec.get("turn"), self.limits.get("max_turns")
        over = _is_number(turn) and _is_number(max_turns) and turn > max_turns
        if over and "turn" not in self.over:
            self.add(line, "turn_over_cap", f"turn {turn} exceeds max_turns={max_turns} after {what}")
        (self.over.add if over else self.over.discard)("turn")

    # results

    def _result(self, line: int, rec: Mapping[str, Any]) -> None:
        if self.result_line is not None:
            self.add(line, "duplicate_result",
                     f"a second result record (the first is at line {self.result_line})")
        reason = rec.get("terminal_reason")
        if self.stopped is None:
            self.add(line, "result_before_stop",
                     f"result record (terminal_reason {reason!r}) while the loop is at {self.at!r}"
                     + (f" (line {self.last_transition})" if self.last_transition is not None else ""))
        elif reason != self.last_reason:
            stop_line, trig, last = self.stopped
            self.add(line, "result_mismatch",
                     f"result terminal_reason {reason!r} but the last move into stop ({trig!r}, line "
                     f"{stop_line}) carried {last!r}")
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
            self.add(line, "request_after_stop",
                     f"request sent after the loop reached stop at line {stop_line} ({trig!r}, "
                     f"{reason!r}) with no {_REENTER_FROM_STOP!r} in between")
        elif self.result_line is not None:
            self.add(line, "request_after_stop",
                     f"request sent after the result record at line {self.result_line}")
        messages = rec.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            self.add(line, "bad_request", "a request record needs 'messages': a list of {role, blocks}")
            return
        for code, message in check_request(messages):
            self.add(line, code, message)


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


# --- coverage ----------------------------------------------------------------------------------


class Coverage(NamedTuple):
    taken_edges: Counter[Move]
    reasons: Counter[str]
    missing_edges: list[Move]
    missing_reasons: list[str]


def trace_files(paths: Iterable[Path | str]) -> list[Path]:
    """Files as given; a directory stands for every ``*.jsonl`` below it (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.rglob("*.jsonl")) if p.is_dir() else [p])
    return out


def move_counts(records: Iterable[Mapping[str, Any]]) -> tuple[Counter[Move], Counter[str]]:
    """How often each declared move was taken, and each terminal reason reached; undeclared moves
    are left out (the auditor reports them)."""
    declared = set(declared_moves())
    moves: Counter[Move] = Counter()
    reasons: Counter[str] = Counter()
    for rec in records:
        if rec.get("type") != "transition":
            continue
        move = Move(str(rec.get("trigger")), str(rec.get("from")), str(rec.get("to")))
        if move in declared:
            moves[move] += 1
            reason = rec.get("terminal_reason")
            if move.dest == _STOP and reason in _REASONS:
                reasons[reason] += 1
    return moves, reasons


def coverage(paths: Iterable[Path | str]) -> Coverage:
    """Which declared moves and terminal reasons the traces exercised, and which never."""
    taken: Counter[Move] = Counter()
    reasons: Counter[str] = Counter()
    for path in trace_files(paths):
        m, r = move_counts(rec for _, rec in read_numbered(path)[0])
        taken.update(m)
        reasons.update(r)
    missing = [m for m in declared_moves() if m not in taken]
    missing_reasons = [r.value for r in TerminalReason if r.value not in reasons]
    return Coverage(taken, reasons, missing, missing_reasons)


# --- CLI ---------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentfsm audit",
        description="Check session traces (JSONL) against the declared graph; or, with --coverage, report "
                    "which declared edges and terminal reasons a set of traces exercised.")
    p.add_argument("traces", nargs="*", type=Path, metavar="TRACE",
                   help="session files (.jsonl); a directory means every .jsonl below it")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--coverage", action="store_true", help="report edge and terminal-reason coverage")
    p.add_argument("--require-full", action="store_true",
                   help="with --coverage: exit 1 unless every edge and every terminal reason was exercised")
    p.add_argument("--codes", action="store_true", help="list the finding codes and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.codes:
        for code, doc in CODES.items():
            print(f"{code:24} {WARNING if code in WARNING_CODES else ERROR:8} {doc}")
        return 0
    if not args.traces:
        _parser().error("give at least one TRACE")
    if args.require_full and not args.coverage:
        _parser().error("--require-full goes with --coverage")
    files = trace_files(args.traces)
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"agentfsm audit: no such trace file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.coverage:
        return _main_coverage(files, as_json=args.json, require_full=args.require_full)
    return _main_audit(files, as_json=args.json)


def _main_audit(files: list[Path], *, as_json: bool) -> int:
    results = {str(f): audit_file(f) for f in files}
    errors = sum(f.is_error for fs in results.values() for f in fs)
    warnings = sum(not f.is_error for fs in results.values() for f in fs)
    if as_json:
        found = [{"path": path, **f.to_json()} for path, fs in results.items() for f in fs]
        print(json.dumps({"errors": errors, "warnings": warnings, "findings": found}, indent=2))
    else:
        for path, fs in results.items():
            for f in fs:
                print(f"{path}:{f.line}: {f.severity} [{f.code}] {f.message}")
            n_err = sum(f.is_error for f in fs)
            summary = "ok" if not n_err else f"{n_err} error{'s' * (n_err != 1)}"
            n_warn = len(fs) - n_err
            print(f"{path}: {summary}" + (f", {n_warn} warning{'s' * (n_warn != 1)}" if n_warn else ""))
    return 1 if errors else 0


def _move_json(m: Move) -> dict[str, str]:
    return {"trigger": m.trigger, "from": m.source, "to": m.dest}


def _main_coverage(files: list[Path], *, as_json: bool, require_full: bool) -> int:
    cov = coverage(files)
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
