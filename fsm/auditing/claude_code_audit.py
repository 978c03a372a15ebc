"""The Claude Code auditor: replays a Claude Code run's events through the declared machine.

:mod:`agentfsm.auditing.claude_code` reads a transcript or a stream-json output into events, each with the edge the
client's records show it took. Here every event goes through :func:`agentfsm.machine.graph.advance` from the
state the previous move left — the same machine, guards, effects and counters that run agentfsm — and the
machine's move is compared with the client's:

* the same edge: the move is recorded, the replayed state carries on;
* another edge: ``replay_mismatch`` at the record's line (the client took an edge the machine would
  not take here: e.g. a fourth max-tokens recovery where the cap is three), and the audit follows the
  client's edge through its route's own effect (:func:`agentfsm.machine.graph.follow`) so the counters stay
  those of the path the client really took;
* no route of this phase takes that edge at all: ``undeclared_move``.

After every move, counters over their caps (``counter_over_cap``) and turns over ``max_turns`` are
reported. A run that does not reach ``stop`` is ``incomplete_run``; stream-json's result must carry the
terminal reason the replay reached (``result_mismatch``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from agentfsm.auditing.checks import Finding, MoveAt, Report, RunAt
from agentfsm.auditing.claude_code import (
    STREAM_JSON,
    TRANSCRIPT,
    Fact,
    Internal,
    Observation,
    Reading,
    RunEnd,
    RunStart,
    read,
)
from agentfsm.machine.events import to_record
from agentfsm.machine.graph import AUTOMATIC, EDGES_BY_TRIGGER, Step, UndeclaredMove, advance, counter_value, follow
from agentfsm.machine.state import COUNTER_CAPS, Limits, LoopState, Phase


class _Replay:
    def __init__(self, reading: Reading, *, child: bool = False) -> None:
        # stream-json ends each run of the process with a result line; a subagent's lines have none
        self.needs_result = reading.source == STREAM_JSON and not child
        self.result_seen = False
        self.limits: Limits = reading.limits
        self.findings: list[Finding] = list(reading.findings)
        self.moves: list[MoveAt] = []
        self.internal: list[tuple[int, str, str]] = []
        self.facts: list[tuple[int, str, str]] = []
        self.state: LoopState | None = None
        self.run_line = 1
        self.over: set[str] = set()
        self.recorded: Observation | None = None  # the observation whose event the last move carried
        self.runs: list[RunAt] = []
        self.run_cause = "prompt"
        self.run_first = 0  # index in moves of the current run's first move

    def add(self, line: int, code: str, message: str) -> None:
        self.findings.append(Finding(line, code, message))

    # runs

    def start(self, item: RunStart) -> None:
        self.end_run()
        history = self.state.messages if self.state is not None else ()
        self.state = LoopState(messages=(*history, item.prompt) if item.prompt is not None else history)
        self.run_line, self.run_cause, self.run_first = item.line, item.cause, len(self.moves)
        self.over = set()

    def end_run(self) -> None:
        s = self.state
        if s is not None and (s.phase is not Phase.STOP or s.stop_hooks_due):
            self.add(self.run_line, "incomplete_run", f"the run starting at line {self.run_line} does not reach stop "
                                                      f"(last position: {s.phase.value})")
        elif s is not None and self.needs_result and not self.result_seen and len(self.moves) > self.run_first:
            self.add(self.run_line, "incomplete_run", f"the run starting at line {self.run_line} has no result line "
                                                      "(the output was cut off, or the process killed)")
        self.result_seen = False
        if s is not None and (len(self.moves) > self.run_first or not self.runs):
            reason = s.terminal_reason.value if s.phase is Phase.STOP and s.terminal_reason is not None else None
            self.runs.append(RunAt(self.run_line, self.run_cause, tuple(self.moves[self.run_first:]), reason,
                                   s.counters()))
        self.run_first = len(self.moves)

    def result(self, item: RunEnd) -> None:
        self.result_seen = True
        s = self.state
        if s is None or s.phase is not Phase.STOP or s.stop_hooks_due:
            where = s.phase.value if s is not None else "nowhere"
            self.add(item.line, "result_before_stop", f"result (terminal_reason {item.terminal_reason!r}) while the "
                                                      f"replayed loop is at {where}")
            return
        reached = s.terminal_reason.value if s.terminal_reason is not None else None
        if item.terminal_reason is not None and item.terminal_reason != reached:
            self.add(item.line, "result_mismatch", f"the result says terminal_reason {item.terminal_reason!r}; the "
                                                   f"replayed path ends with {reached!r}")

    # moves

    def event_of(self, obs: Observation) -> Mapping[str, Any] | None:
        """The observation's event in record form on the first move it causes; later ones (a phase that
        decides on its own) carry none, as in a trace."""
        if self.recorded is obs:
            return None
        self.recorded = obs
        return to_record(obs.event)

    def observe(self, obs: Observation) -> None:
        if self.state is None:
            self.state = LoopState()
        state = self.state
        try:
            expected = list(advance(state, obs.event, self.limits))
            refusal = ""
        except (UndeclaredMove, AssertionError) as exc:
            expected, refusal = [], str(exc)
        for k, want in enumerate(obs.observed):
            step = expected.pop(0) if expected else None
            if step is not None and (want is None or step.trigger == want):
                state = self.take(obs, state, step)
                continue
            if want is None:
                break
            what = f"Claude Code took {want!r} from {state.phase.value} ({type(obs.event).__name__})"
            if step is not None:
                self.add(obs.line, "replay_mismatch", f"{what}; the declared machine takes {step.trigger!r} here "
                                                      f"(route [{step.route}])")
            forced = follow(state, obs.event, self.limits, want)
            if forced is not None:
                if step is None:
                    self.add(obs.line, "replay_mismatch", f"{what}; the machine would not move here: {refusal}")
                state = self.take(obs, state, forced)
            else:
                state = self.jump(obs, state, want, refusal)
            expected = []
            if state.phase in AUTOMATIC and k + 1 < len(obs.observed):
                try:
                    expected = list(advance(state, obs.event, self.limits))
                except (UndeclaredMove, AssertionError) as exc:
                    refusal = str(exc)
        # moves the machine makes on its own that the records said nothing about
        for step in expected:
            state = self.take(obs, state, step)
        self.state = state

    def take(self, obs: Observation, before: LoopState, step: Step) -> LoopState:
        reason = step.state.terminal_reason
        self.moves.append(MoveAt(step.trigger, before.phase.value, step.state.phase.value, obs.line,
                                 reason=reason.value if reason is not None and step.edge.dest is Phase.STOP else None,
                                 event=self.event_of(obs)))
        self.check_caps(obs.line, step.trigger, step.state)
        return step.state

    def jump(self, obs: Observation, state: LoopState, want: str, refusal: str) -> LoopState:
        """The client took an edge no route of this phase and event takes: record it as it was."""
        edge = EDGES_BY_TRIGGER.get(want)
        dest = edge.dest if edge is not None else state.phase
        declared = edge is not None and state.phase in edge.sources
        why = (f"{want!r} is not declared from {state.phase.value}" if not declared else
               f"no route takes {want!r} on {type(obs.event).__name__} in {state.phase.value}")
        self.add(obs.line, "undeclared_move", f"Claude Code took {want!r} ({state.phase.value} → {dest.value}): {why}"
                                              + (f" ({refusal})" if refusal and declared else ""))
        self.moves.append(MoveAt(want, state.phase.value, dest.value, obs.line, declared=declared,
                                 event=self.event_of(obs)))
        changes: dict[str, Any] = {"phase": dest}
        if edge is not None and edge.kind == "reentry":
            changes.update(transition=want, terminal_reason=None)
        return attrs.evolve(state, **changes)

    def check_caps(self, line: int, trigger: str, state: LoopState) -> None:
        for name, field in COUNTER_CAPS.items():
            value, cap = counter_value(state, name), getattr(self.limits, field)
            over = value > cap
            if over and name not in self.over:
                self.add(line, "counter_over_cap", f"counter {name}={value} exceeds its cap {field}={cap} after "
                                                   f"{trigger!r}")
            (self.over.add if over else self.over.discard)(name)
        cap = self.limits.max_turns
        over = cap is not None and state.turn_count > cap
        if over and "turn" not in self.over:
            self.add(line, "turn_over_cap", f"turn {state.turn_count} exceeds max_turns={cap} after {trigger!r}")
        (self.over.add if over else self.over.discard)("turn")

    def run(self, reading: Reading, path: str) -> Report:
        for item in reading.items:
            if isinstance(item, RunStart):
                self.start(item)
            elif isinstance(item, Observation):
                self.observe(item)
            elif isinstance(item, RunEnd):
                self.result(item)
            elif isinstance(item, Internal):
                self.internal.append((item.line, item.action, item.detail))
            elif isinstance(item, Fact):
                self.facts.append((item.line, item.kind, item.detail))
        self.end_run()
        s = self.state
        reason = s.terminal_reason.value if s is not None and s.phase is Phase.STOP and s.terminal_reason else None
        findings = tuple(sorted(self.findings, key=lambda f: f.line))
        children = tuple(_Replay(child, child=True).run(child, child.path or path) for child in reading.children)
        return Report(path, reading.source, tuple(self.moves), reason, s.counters() if s is not None else {},
                      findings, tuple(self.internal), reading.version, tuple(self.runs), children, reading.link,
                      reading.agent, tuple(self.facts))


def subagent_files(path: Path) -> list[Path]:
    """A transcript's subagent transcripts: Claude Code writes each subagent's loop to
    ``<session>/subagents/agent-<id>.jsonl`` beside ``<session>.jsonl``."""
    folder = path.with_suffix("") / "subagents"
    return sorted(folder.glob("agent-*.jsonl")) if folder.is_dir() else []


def subagent_link(path: Path) -> str | None:
    """The tool call that started the subagent of ``agent-<id>.jsonl``, from the ``.meta.json`` the client
    writes beside it."""
    try:
        meta = json.loads(path.with_suffix(".meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    link = meta.get("toolUseId") if isinstance(meta, Mapping) else None
    return str(link) if isinstance(link, str) else None


def with_subagent_files(reading: Reading, path: Path, numbered_of: Any) -> Reading:
    """``reading`` with the subagent loops of its own files as children (a subagent the records already
    hold as a sidechain is not read twice). ``numbered_of(path)`` reads a file's records and findings."""
    if reading.source != TRANSCRIPT:
        return reading
    known = {c.agent for c in reading.children}
    children = list(reading.children)
    for f in subagent_files(path):
        numbered, findings = numbered_of(f)
        child = read(numbered, reading.source, path=str(f))
        if child.agent in known:
            continue
        link = subagent_link(f) or next((c.link for c in reading.children if c.agent == child.agent), None)
        children.append(attrs.evolve(child, findings=tuple(sorted((*findings, *child.findings), key=lambda x: x.line)),
                                     link=link))
    return attrs.evolve(reading, children=tuple(children))


def replay(reading: Reading, path: str = "") -> Report:
    """Replay a Claude Code input's events through the declared machine (see the module docstring)."""
    return _Replay(reading).run(reading, path)
