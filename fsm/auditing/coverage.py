"""Coverage of the declaration by traces: which declared moves and terminal reasons a set of session
files exercised, and which never."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from agentfsm.machine.graph import EDGES
from agentfsm.machine.state import Phase, TerminalReason
from agentfsm.runtime.trace import read_records

_REASONS = frozenset(r.value for r in TerminalReason)
_STOP = Phase.STOP.value


class Move(NamedTuple):
    """One declared move: an edge with several sources is one move per source."""

    trigger: str
    source: str
    dest: str

    def __str__(self) -> str:
        return f"{self.trigger} ({self.source} → {self.dest})"


def declared_moves() -> list[Move]:
    """Every declared move, in the order of :data:`agentfsm.machine.graph.EDGES` (stable, for reports and diagrams)."""
    return [Move(e.trigger, s.value, e.dest.value) for e in EDGES for s in e.sources]


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
        m, r = move_counts(read_records(path))
        taken.update(m)
        reasons.update(r)
    missing = [m for m in declared_moves() if m not in taken]
    missing_reasons = [r.value for r in TerminalReason if r.value not in reasons]
    return Coverage(taken, reasons, missing, missing_reasons)


