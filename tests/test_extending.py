"""Adding a recovery transition is an edit of the declaration only (docs/contributing.md).

The walk-through of docs/contributing.md adds a retry after an image error: one edge (its shape and what
it does to the outside world), one route (its guard and effect). Here the same edit is made to a COPY
of the table, installed in place of the real one for the test's duration, and everything derived from
the table must accept it without another edit: the validation at import, the transitions machine
that runs the moves, the consequences a runtime performs, the diagrams, the auditor's replay of a
session file and the testing kit's per-move invariants.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentfsm.auditing.audit import audit_file
from agentfsm.diagram import render_dot, render_mermaid
from agentfsm.machine import graph, prompts
from agentfsm.machine.events import (
    Assembled,
    CallFailed,
    ModelError,
    ModelResponse,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
)
from agentfsm.machine.state import Limits, LoopState, Message, Phase
from agentfsm.runtime.runner import perform
from agentfsm.runtime.trace import TraceWriter, graph_digest, read_records
from agentfsm.testing.stateful import _StepChecker

A, C, S = Phase.ASSEMBLE, Phase.CALL_MODEL, Phase.STREAM
IMAGE = ModelError("image", "messages.1: image exceeds 5 MB maximum", 400)
USE = {"type": "tool_use", "id": "toolu_9", "name": "Read", "input": {"file_path": "/img.png"}}


# --- the edit: one edge, one route -----------------------------------------------------------------

IMAGE_RETRY = graph.Edge(
    "image_error_retry", (C, S), A, "reentry",
    "the API refused an image; drop the images and ask again (once per turn)",
    # asked again: what the broken response showed is withdrawn, its calls closed
    does=graph.Does(graph.Shown.WITHDRAW, close_calls=prompts.STREAMING_FALLBACK))


@graph._named("image_refused_once")
def image_refused_once(s: LoopState, e: CallFailed, _lim: Limits) -> bool:
    return e.error.kind == "image" and not s.has_attempted_reactive_compact


def images_dropped(s: LoopState, _e: CallFailed, _lim: Limits) -> Mapping[str, Any]:
    note = prompts.meta_message("The images of this conversation were removed; continue without them.")
    return {"messages": (*s.messages, note), "has_attempted_reactive_compact": True}


def _edited() -> tuple[tuple[graph.Edge, ...], tuple[graph.Route, ...]]:
    edges = (*graph.EDGES, IMAGE_RETRY)
    routes = list(graph.ROUTES)
    at = next(i for i, r in enumerate(routes) if r.edge == "call_failed")  # before the final failure
    routes.insert(at, graph.Route((C, S), CallFailed, image_refused_once, "image_error_retry", images_dropped))
    return edges, tuple(routes)


# --- installing the copy -----------------------------------------------------------------------------


@pytest.fixture
def edited(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The edited copy in place of the declaration, in every module that holds a name for it."""
    edges, routes = _edited()
    assert graph.validate(edges, routes) == [], "the edit is a sound declaration"
    by_trigger = {e.trigger: e for e in edges}
    by_key = {key: tuple(r for r in routes if key[0] in r.sources and r.event is key[1])
              for key in {(p, r.event) for r in routes for p in r.sources}}
    moves = {(s, e.dest): frozenset(x.trigger for x in edges if s in x.sources and x.dest == e.dest)
             for e in edges for s in e.sources}
    new: dict[str, Any] = {"EDGES": edges, "ROUTES": routes, "EDGES_BY_TRIGGER": by_trigger, "ROUTES_BY_KEY": by_key,
                           "DECLARED_MOVES": moves,
                           "REENTRY_LABELS": frozenset(e.trigger for e in edges if e.kind == "reentry")}
    old = {name: getattr(graph, name) for name in new}
    for module in [m for name, m in sys.modules.items() if name.startswith("agentfsm") and m is not None]:
        for attr, value in list(vars(module).items()):
            for name, original in old.items():
                if value is original:
                    monkeypatch.setattr(module, attr, new[name])
    # the machine is built from the (installed) routes, as at import
    monkeypatch.setattr(graph, "MACHINE", graph.build_machine(routes))
    graph_digest.cache_clear()
    yield
    graph_digest.cache_clear()


def _history() -> tuple[Message, ...]:
    out = [Message("user", "q0")]
    for i in range(2):
        out += [Message("assistant", ({"type": "text", "text": f"a{i}"},), kind="assistant"),
                Message("user", f"q{i + 1}")]
    return tuple(out)


def test_the_machine_takes_the_new_transition(edited: None) -> None:
    state = LoopState(messages=_history(), phase=S)
    step = graph.advance(state, CallFailed(IMAGE, shown=(USE,)), Limits())[0]
    assert (step.trigger, step.route, step.state.phase) == ("image_error_retry", "image_refused_once", A)
    assert step.state.transition == "image_error_retry" and step.state.has_attempted_reactive_compact
    # once per turn: the second image error ends the run as before
    again = graph.advance(attrs.evolve(step.state, phase=C), CallFailed(IMAGE), Limits())[0]
    assert again.trigger == "call_failed"


def test_a_runtime_performs_what_the_new_edge_declares(edited: None) -> None:
    done: list[tuple[str, Any]] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            return lambda *args: done.append((name, args))

    state = LoopState(messages=_history(), phase=S)
    event = CallFailed(IMAGE, shown=(USE,))
    step = graph.advance(state, event, Limits())[0]
    perform(Recorder(), "s", state, step, event)  # type: ignore[arg-type]
    assert done == [("close_calls", (prompts.STREAMING_FALLBACK,)), ("withdraw", ())]


def test_the_diagrams_draw_the_new_transition(edited: None) -> None:
    for text in (render_mermaid("overview"), render_dot("overview"), render_dot("recovery")):
        assert "image_error_retry" in text
    assert "image_refused_once" in render_dot("recovery")


def test_the_auditor_and_the_kit_accept_a_run_that_takes_it(edited: None, tmp_path: Path) -> None:
    limits = Limits()
    path = tmp_path / "run.jsonl"
    trace = TraceWriter(path)
    trace.session("s-extend", limits, str(tmp_path), "claude-sonnet-4-5")
    first = Message("user", "go", kind="prompt")
    trace.message(first)
    kit = _StepChecker(limits)
    answer = ModelResponse(({"type": "text", "text": "done"},), "end_turn")
    with graph.LoopMachine(LoopState(messages=(first,))) as machine:
        for event in (Assembled(), StreamOpened(), CallFailed(IMAGE, shown=(USE,)), Assembled(), StreamOpened(),
                      StreamEnded(answer), StopHookVerdict()):
            before = machine.state
            if event.__class__ is StreamOpened:
                trace.request("claude-sonnet-4-5", before.query_tracking.depth, before.messages)
            for step in machine.fire(event, limits):
                trace.on_step(before, step, event)
                kit.on_step(before, step, event)
                before = step.state
        state = machine.state
    assert state.terminal_reason is not None
    trace.result({"type": "result", "subtype": "success", "is_error": False, "result": "done",
                  "terminal_reason": state.terminal_reason.value, "num_turns": state.turn_count,
                  "session_id": "s-extend"})
    trace.close()
    assert kit.violations == []
    assert audit_file(path) == []
    moves = [r["trigger"] for r in read_records(path) if r.get("type") == "transition"]
    assert "image_error_retry" in moves
