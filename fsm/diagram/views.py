"""What each diagram shows, derived from the declaration (:mod:`agentfsm.machine.graph`) and nothing else — and the
path one run took, read from an agentfsm trace or from the audit of a Claude Code run.

* the **overview**: the phases, with the working ones inside a composite *running* state; one arrow per
  (source, destination, kind) carrying every trigger of that move, and one ``abort`` arrow from
  *running* for the edge every running phase declares;
* the **recovery** view: every route out of ``call_model`` and ``stream``, as ``Event [guard] → edge``
  (:attr:`agentfsm.machine.graph.Route.label`), in the order the machine tries them, each with the counters its
  edge raises and their caps, read from the counters' own declarations (:data:`agentfsm.machine.state.COUNTERS`);
* the **terminal** view: which edge into ``stop`` carries which terminal reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.auditing.checks import Report
from agentfsm.machine.graph import EDGES, EDGES_BY_TRIGGER, ROUTES, RUNNING, STATES
from agentfsm.machine.state import COUNTERS, TERMINAL_INFO, Limits, Phase

# one colour per edge kind, the same in every view and format
KIND_COLOURS: Mapping[str, str] = {
    "forward": "#2c3e50",
    "reentry": "#1f77b4",
    "retry": "#d35400",
    "terminal": "#c0392b",
}
DASHED_KINDS = frozenset({"reentry", "retry"})
GREY, GREY_TEXT = "#c8c8c8", "#9a9a9a"
UNDECLARED = "#8e44ad"  # moves a run took that the graph does not declare
NODE_FILL, NODE_LINE, NODE_TEXT = "#eef3fb", "#4a6fa5", "#1b2a41"
STOP_FILL, STOP_LINE = "#fde2e1", "#c0392b"
CLUSTER_LINE = "#95a5a6"
LEGEND = "solid: forward · dashed blue: re-entry · dashed orange: retry of the same request · red: into stop"
COMPOSITE = "running"  # the composite state around the phases an abort can interrupt
STOP = Phase.STOP.value


# --- the overview ----------------------------------------------------------------------------------


@attrs.frozen
class Group:
    """One arrow of the overview: the declared moves of one kind from ``source`` to ``dest``."""

    source: str
    dest: str
    kind: str
    triggers: tuple[str, ...]


def phases() -> tuple[str, ...]:
    return tuple(p.value for p in STATES)


def running_phases() -> tuple[str, ...]:
    return tuple(p.value for p in RUNNING)


def overview_groups() -> tuple[Group, ...]:
    """The overview's arrows, in declaration order. An edge declared from every running phase is one
    arrow from the composite state."""
    running = frozenset(RUNNING)
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for edge in EDGES:
        composite = len(edge.sources) > 1 and frozenset(edge.sources) == running
        sources = (COMPOSITE,) if composite else tuple(s.value for s in edge.sources)
        for source in sources:
            grouped.setdefault((source, edge.dest.value, edge.kind), []).append(edge.trigger)
    return tuple(Group(s, d, k, tuple(ts)) for (s, d, k), ts in grouped.items())


# --- the recovery view -------------------------------------------------------------------------------


@attrs.frozen
class RouteRow:
    """One route out of ``source``: its label (``Event [guard] → edge``), its rank among the routes of its
    (phase, event) — the order the machine tries them — and where its edge leads."""

    source: str
    rank: int
    event: str
    guard: str | None
    edge: str
    kind: str
    dest: str
    counts: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.event} [{self.guard}] → {self.edge}" if self.guard else f"{self.event} → {self.edge}"

    @property
    def counts_label(self) -> str:
        """What the edge counts, in one line (empty when it raises no counter)."""
        return "; ".join(self.counts)


def counted_by(edge: str) -> tuple[str, ...]:
    """The counters ``edge`` raises, each with the cap it may not pass and that cap's default — as the
    counters declare them (``counter(..., cap=..., raised_by=...)``), so a new counter's label needs no
    edit here."""
    defaults = Limits()
    out = []
    for c in COUNTERS:
        if edge in c.raised_by:
            out.append(f"{c.key} +1 (cap {c.cap} = {getattr(defaults, c.cap)})" if c.cap else f"{c.key} +1")
    return tuple(out)


RECOVERY_SOURCES: tuple[Phase, ...] = (Phase.CALL_MODEL, Phase.STREAM)


def recovery_rows() -> tuple[RouteRow, ...]:
    """Every route out of call_model and stream, in declaration order (the order they are tried)."""
    rows = []
    for source in RECOVERY_SOURCES:
        ranks: Counter[type] = Counter()
        for route in ROUTES:
            if source not in route.sources:
                continue
            ranks[route.event] += 1
            edge = EDGES_BY_TRIGGER[route.edge]
            row = RouteRow(source.value, ranks[route.event], route.event.__name__,
                           route.guard.name if route.guard is not None else None, route.edge, edge.kind,
                           edge.dest.value, counted_by(route.edge))
            assert row.label == route.label  # the view shows exactly the routes table's labels
            rows.append(row)
    return tuple(rows)


@attrs.frozen
class Panel:
    """One family of the recovery view: the routes one event takes out of one phase — or out of several,
    when their routes are the same (a failed call is judged alike from call_model and stream) — in the
    order the machine tries them."""

    sources: tuple[str, ...]
    event: str
    rows: tuple[RouteRow, ...]


def recovery_panels() -> tuple[Panel, ...]:
    """The recovery view's panels: one per (phase, event), in the order the routes are declared; phases
    whose routes for an event are identical share one panel, so no route (and no target) is drawn twice."""
    families: dict[tuple[str, str], list[RouteRow]] = {}
    for r in recovery_rows():
        families.setdefault((r.source, r.event), []).append(r)
    panels: list[Panel] = []
    for (source, event), rows in families.items():
        same = [i for i, p in enumerate(panels) if p.event == event and
                [(r.guard, r.edge, r.dest) for r in p.rows] == [(r.guard, r.edge, r.dest) for r in rows]]
        if same:
            p = panels[same[0]]
            panels[same[0]] = attrs.evolve(p, sources=(*p.sources, source))
        else:
            panels.append(Panel((source,), event, tuple(rows)))
    return tuple(panels)


# --- the terminal view -------------------------------------------------------------------------------


@attrs.frozen
class TerminalRow:
    """One edge into stop: where it leaves from and the terminal reasons it may carry."""

    trigger: str
    sources: tuple[str, ...]
    reasons: tuple[tuple[str, str, bool], ...]  # (reason, result subtype, is_error)


def terminal_rows() -> tuple[TerminalRow, ...]:
    running = frozenset(RUNNING)
    rows = []
    for edge in EDGES:
        if edge.kind != "terminal":
            continue
        composite = len(edge.sources) > 1 and frozenset(edge.sources) == running
        sources = (COMPOSITE,) if composite else tuple(s.value for s in edge.sources)
        # sorted: the reasons are a frozenset, whose order follows the hash seed
        reasons = tuple((r.value, TERMINAL_INFO[r].subtype, TERMINAL_INFO[r].is_error)
                        for r in sorted(edge.reasons, key=lambda r: r.value))
        rows.append(TerminalRow(edge.trigger, sources, reasons))
    return tuple(rows)


# --- one run's path ---------------------------------------------------------------------------------


@attrs.frozen
class Taken:
    """The ``n``-th move of a run (from 1)."""

    n: int
    label: str
    source: str
    dest: str
    line: int = 0
    declared: bool = True
    reason: str | None = None
    event: Mapping[str, Any] | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen
class RunPath:
    """The moves one input took, in order, and what to call it."""

    name: str
    steps: tuple[Taken, ...]
    internal: tuple[tuple[int, str, str], ...] = ()
    findings: tuple[tuple[int, str, str], ...] = ()  # (line, severity, code) of the audit's findings

    def counts(self) -> Counter[tuple[str, str, str]]:
        return Counter((s.label, s.source, s.dest) for s in self.steps)

    def order(self, label: str, source: str, dest: str) -> list[int]:
        return [s.n for s in self.steps if (s.label, s.source, s.dest) == (label, source, dest)]

    def taken_along(self, trigger: str, group: Group) -> list[int]:
        """The steps at which the run took ``trigger`` along ``group`` (from any running phase for the
        composite state's arrow)."""
        running = set(running_phases())
        return [s.n for s in self.steps if s.declared and s.label == trigger and s.dest == group.dest
                and (s.source == group.source or (group.source == COMPOSITE and s.source in running))]

    def undeclared_moves(self) -> dict[tuple[str, str, str], list[int]]:
        """Each distinct undeclared move (trigger, source, dest) and the steps it was taken at."""
        seen: dict[tuple[str, str, str], list[int]] = {}
        for s in self.undeclared():
            seen.setdefault((s.label, s.source, s.dest), []).append(s.n)
        return seen

    def undeclared(self) -> list[Taken]:
        return [s for s in self.steps if not s.declared]

    def reasons(self) -> Counter[str]:
        """How each run of the path ended: the reason of the last move into stop before the loop left it
        (a Stop hook's re-entry) or the path ended."""
        ends = [s for i, s in enumerate(self.steps) if s.dest == STOP and s.reason
                and (i + 1 == len(self.steps) or self.steps[i + 1].source != STOP)]
        return Counter(s.reason for s in ends if s.reason)

    def findings_at(self) -> dict[str, list[tuple[int, str, str]]]:
        """The audit's findings (errors and warnings, not remarks) by the phase the run was in when their
        line was read: the source of the first move recorded at that line, else the destination of the
        last move before it (the first phase before any)."""
        out: dict[str, list[tuple[int, str, str]]] = {}
        for line, severity, code in self.findings:
            if severity not in ("error", "warning"):
                continue
            at = [s for s in self.steps if s.line == line]
            before = [s for s in self.steps if s.line < line]
            phase = (at[0].source if at else before[-1].dest if before
                     else self.steps[0].source if self.steps else phases()[0])
            out.setdefault(phase, []).append((line, severity, code))
        return out

    def findings_text(self) -> str:
        """``2 errors, 1 warning (lines 12, 40)`` or ""."""
        shown = [f for f in self.findings if f[1] in ("error", "warning")]
        if not shown:
            return ""
        n_err = sum(1 for f in shown if f[1] == "error")
        n_warn = len(shown) - n_err
        parts = [f"{n} {word}{'s' * (n != 1)}" for n, word in ((n_err, "error"), (n_warn, "warning")) if n]
        lines = sorted({f[0] for f in shown})
        where = ", ".join(str(n) for n in lines[:6]) + (", …" if len(lines) > 6 else "")
        return f"audit: {', '.join(parts)} at line{'s' * (len(lines) != 1)} {where} (outlined phases)"

    def visited(self) -> frozenset[str]:
        return frozenset(p for s in self.steps for p in (s.source, s.dest))

    def title(self) -> str:
        ended = ", ".join(f"{r} ×{n}" if n > 1 else r for r, n in sorted(self.reasons().items())) or "not at stop"
        return f"{self.name}: {len(self.steps)} moves, ended {ended}"


def _declared(label: str, source: str, dest: str) -> bool:
    edge = EDGES_BY_TRIGGER.get(label)
    return edge is not None and edge.dest.value == dest and source in {s.value for s in edge.sources}


def path_from_records(records: Iterable[Mapping[str, Any]], name: str = "") -> RunPath:
    """An agentfsm trace's path, from its transition records (other records are passed over, so a
    newer or older trace format still draws)."""
    steps: list[Taken] = []
    session = None
    for line, rec in enumerate(records, 1):
        if rec.get("type") == "session" and session is None:
            session = rec.get("session_id")
        if rec.get("type") != "transition":
            continue
        label, source, dest = str(rec.get("trigger")), str(rec.get("from")), str(rec.get("to"))
        reason = rec.get("terminal_reason")
        event = rec.get("event")
        steps.append(Taken(len(steps) + 1, label, source, dest, line, _declared(label, source, dest),
                           str(reason) if reason and dest == STOP else None,
                           event if isinstance(event, Mapping) else None))
    return RunPath(name or f"trace {session or '(no session record)'}", tuple(steps))


def path_from_report(report: Report, name: str) -> RunPath:
    """The path the auditor reconstructed (a Claude Code transcript or stream-json output)."""
    steps = tuple(Taken(i, m.label, m.source, m.dest, m.line, m.declared, m.reason, m.event)
                  for i, m in enumerate(report.moves, 1))
    return RunPath(name, steps, report.internal)


def lines_text(path: RunPath, order: Sequence[int], limit: int = 6) -> str:
    """``lines 15, 32, 42`` — the lines of the input the moves ``order`` were read from, so a reader can find
    them in the file (moves a phase made on its own share their event's line)."""
    at = {s.n: s.line for s in path.steps}
    lines = list(dict.fromkeys(at[n] for n in order if at.get(n)))
    if not lines:
        return f"steps {steps_text(order, limit)}"
    return f"line{'s' * (len(lines) != 1)} {steps_text(lines, limit)}"


def steps_text(order: Sequence[int], limit: int = 3) -> str:
    """``1, 6, 11, …`` — where in the run a move was taken."""
    shown = ", ".join(str(n) for n in order[:limit])
    return shown + (", …" if len(order) > limit else "")
