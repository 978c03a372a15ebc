"""One run as the report shows it: the audit's verdict, the path over the graph, the state after every
move, the timeline, the lines of the file, and the child runs (subagents) it started.

Everything the report says about the loop comes from the auditor's public result
(:func:`agentfsm.auditing.audit.audit_report`): its moves, terminal reason, counters and findings. The state
after each move is read from the trace where the trace records it (an agentfsm session file's
transition snapshots); for a Claude Code input, whose records hold no state, the auditor's moves are
followed through :func:`agentfsm.machine.graph.follow` from a fresh state — each move along the edge the audit
says was taken, with the route's own effect — so the counters shown are those of the path taken.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.auditing import claude_code
from agentfsm.auditing.audit import AGENTFSM, SOURCES, audit_report, read_numbered, recognise
from agentfsm.auditing.checks import Finding, Report
from agentfsm.diagram.views import RunPath, path_from_records, path_from_report
from agentfsm.machine.events import EventRecordError, from_record
from agentfsm.machine.graph import EDGES_BY_TRIGGER, follow
from agentfsm.machine.state import LoopState, Phase
from agentfsm.report.timeline import Timeline, timeline
from agentfsm.runtime.trace import transition_snapshots

LINE_TEXT = 400  # characters of each record line the page keeps
MAX_LINES = 4000  # past this, only the lines something points at
CHILD_DEPTH = 3  # subagents of subagents of subagents, no deeper


@attrs.frozen
class MoveRow:
    """The ``n``-th move, the state after it and which of its fields the move changed."""

    n: int
    label: str
    kind: str
    source: str
    dest: str
    line: int
    declared: bool
    reason: str | None
    state: Mapping[str, Any]
    changed: tuple[str, ...]
    findings: int  # findings reported at this move's line


@attrs.frozen
class Run:
    key: str  # unique in the page: used in anchors
    name: str  # what the page calls it: a path relative to what was given, or the file name
    source: str  # an audit source kind, or "subagent" for a child read from its parent's lines
    report: Report | None
    path: RunPath | None
    moves: tuple[MoveRow, ...]
    timeline: Timeline
    lines: Mapping[int, str]
    children: tuple[Run, ...] = ()
    cost: float | None = None
    title: str = ""
    state_note: str = ""

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.report.findings if self.report is not None else ()

    @property
    def turns(self) -> int | None:
        if self.report is None:
            return None
        value = self.report.counters.get("turn_count")
        return value if isinstance(value, int) else None

    @property
    def source_text(self) -> str:
        return SOURCES.get(self.source, self.source)


def _kind(label: str) -> str:
    edge = EDGES_BY_TRIGGER.get(label)
    return edge.kind if edge is not None else "undeclared"


def _diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(k for k in after if before.get(k) != after.get(k))


def _states_of_trace(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [snap for _, snap in transition_snapshots(records)]


def _states_by_following(report: Report) -> tuple[list[dict[str, Any]], str]:
    """The state after each of the audit's moves, followed from a fresh state (see the module doc)."""
    limits = claude_code.CLAUDE_CODE_LIMITS
    state = LoopState()
    event = None
    out: list[dict[str, Any]] = []
    lost = 0
    # An input may hold several runs (a resumed session, the run a task notification started): each
    # starts from a fresh state, as the auditor replays it.
    starts, at = set(), 0
    for r in report.runs:
        starts.add(at)
        at += len(r.moves)
    for i, m in enumerate(report.moves):
        if i in starts and i:
            state, event = LoopState(), None
        if m.event is not None:
            try:
                event = from_record(m.event)
            except EventRecordError:
                event = None
        step = follow(state, event, limits, m.label) if event is not None and m.declared else None
        if step is not None:
            state = step.state
        else:
            lost += 1
            state = attrs.evolve(state, phase=Phase(m.dest)) if m.dest in {p.value for p in Phase} else state
        out.append(state.snapshot())
    note = ("state followed along the audited moves from a fresh state at each run's start"
            " (a Claude Code input records none)"
            + (f"; {lost} move(s) could not be followed and only change the phase" if lost else ""))
    return out, note


def _rows(report: Report, states: Sequence[Mapping[str, Any]]) -> tuple[MoveRow, ...]:
    at_line: dict[int, int] = {}
    for f in report.findings:
        at_line[f.line] = at_line.get(f.line, 0) + 1
    rows = []
    before: Mapping[str, Any] = {}
    for i, m in enumerate(report.moves):
        state = states[i] if i < len(states) else {}
        rows.append(MoveRow(i + 1, m.label, _kind(m.label), m.source, m.dest, m.line, m.declared, m.reason,
                            state, _diff(before, state) if before else tuple(state), at_line.get(m.line, 0)))
        before = state
    return tuple(rows)


def _line_texts(path: Path, keep: set[int]) -> dict[int, str]:
    with open(path, "rb") as fh:
        raw = fh.read().splitlines()
    every = len(raw) <= MAX_LINES
    out = {}
    for n, line in enumerate(raw, 1):
        if every or n in keep:
            text = line.decode("utf-8", errors="replace")
            cut = len(text) - LINE_TEXT
            out[n] = text if cut <= 0 else text[:LINE_TEXT] + f" …[{cut} more characters]"
    return out


def _cost(records: Sequence[tuple[int, Mapping[str, Any]]]) -> float | None:
    found = None
    for _, rec in records:
        for key in ("totalCostUSD", "total_cost_usd", "cost_usd"):
            if rec.get("type") in ("cost-state", "result") and isinstance(rec.get(key), (int, float)):
                found = float(rec[key])
    return found


def _children_of_transcript(path: Path, records: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Path]:
    """tool_use id → the subagent transcript it started: Claude Code writes a subagent's records to
    ``<session>/subagents/agent-<agentId>.jsonl`` beside the session file, and the Task result names
    the agent."""
    out = {}
    folder = path.with_suffix("") / "subagents"
    for _, rec in records:
        tur = rec.get("toolUseResult")
        if not isinstance(tur, Mapping) or not isinstance(tur.get("agentId"), str):
            continue
        content = (rec.get("message") or {}).get("content")
        ids = [b.get("tool_use_id") for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
        child = folder / f"agent-{tur['agentId']}.jsonl"
        if ids and isinstance(ids[0], str) and child.is_file():
            out[ids[0]] = child
    return out


def build(path: Path, name: str, key: str = "run1", depth: int = 0) -> Run:
    """The report's view of one input (raises :class:`agentfsm.auditing.audit.NotATrace`)."""
    source = recognise(path)
    report = audit_report(path)
    records, _ = read_numbered(path)
    if source == AGENTFSM:
        run_path = path_from_records((rec for _, rec in records), name)
        states, note = _states_of_trace([rec for _, rec in records]), "state as the trace records it after each move"
    else:
        run_path = path_from_report(report, name)
        states, note = _states_by_following(report)
    run_path = attrs.evolve(run_path, findings=tuple((f.line, f.severity, f.code) for f in report.findings))
    rows = _rows(report, states)
    children: list[Run] = []
    child_of: dict[str, str] = {}
    if depth < CHILD_DEPTH and source == claude_code.TRANSCRIPT:
        for n, (use_id, child) in enumerate(_children_of_transcript(path, records).items(), 1):
            ckey = f"{key}-c{n}"
            child_of[use_id] = ckey
            children.append(build(child, f"{name} › {child.name}", ckey, depth + 1))
    elif source == claude_code.STREAM_JSON:
        for n, (use_id, lines) in enumerate(_sidechains(records).items(), 1):
            ckey = f"{key}-c{n}"
            child_of[use_id] = ckey
            children.append(_sidechain_run(lines, f"{name} › subagent of {use_id}", ckey, path))
    tl = timeline(records, child_of)
    keep = {m.line for m in rows} | {f.line for f in report.findings} | {s.line for s in tl.spans}
    return Run(key, name, source, report, run_path, rows, tl, _line_texts(path, keep), tuple(children),
               _cost(records), run_path.title(), note)


def _sidechains(records: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, list[tuple[int, Mapping[str, Any]]]]:
    out: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for line, rec in records:
        parent = rec.get("parent_tool_use_id")
        if isinstance(parent, str):
            out.setdefault(parent, []).append((line, {k: v for k, v in rec.items() if k != "parent_tool_use_id"}))
    return out


def _sidechain_run(lines: Sequence[tuple[int, Mapping[str, Any]]], name: str, key: str, path: Path) -> Run:
    """A subagent whose lines stream-json interleaves with its parent's (``parent_tool_use_id``): not
    audited (the auditor reads the main loop), shown on the timeline."""
    tl = timeline(lines)
    return Run(key, name, "subagent", None, None, (), tl, _line_texts(path, {n for n, _ in lines}),
               title=f"{name}: {len(lines)} lines", state_note="a subagent's lines: not audited")


def jsonable(run: Run) -> dict[str, Any]:
    """What the page's script needs of a run: the state after each move and what it changed."""
    return {"key": run.key, "moves": [{"n": m.n, "label": m.label, "kind": m.kind, "source": m.source,
                                       "dest": m.dest, "line": m.line, "reason": m.reason, "state": dict(m.state),
                                       "changed": list(m.changed), "declared": m.declared} for m in run.moves]}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
