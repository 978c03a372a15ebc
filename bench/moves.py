"""The machine's own cost: one move, and one loop's machine, against a plain walk of the same table.

A conversation of two model turns is fired as events (assemble, open, a tool call, the batch — which
is two moves, collect and the automatic next_turn — then assemble, open, an answer, the Stop-hook
verdict): nine moves. Five ways, in alternating rounds, median reported:

* ``machine``: :class:`agentfsm.machine.graph.LoopMachine` as the runner uses it — every event triggered on
  the module-level machine, a ``transitions.Machine`` with the lean classes of issue 34
  (``Event.trigger`` on the loop's model: its conditions — the guards — in declared order, the
  route's effect as the ``before`` callback, the state set by the machine; no per-step logging);
* ``transitions' own classes``: the same routes on a ``transitions.Machine`` built from transitions'
  stock Event/Transition/State (what issue 31 ran: every move through their per-step logging and
  callback resolution), triggered as LoopMachine triggers its own — the same-run baseline of issue
  34's lean machine (:class:`agentfsm.machine.graph.LeanMachine`);
* ``machine lists walked``: what LoopMachine did before issue 31 — ``MACHINE``'s transition lists
  (the same conditions and callbacks) walked by hand, bypassing ``transitions``' event processing;
  kept here as the same-run baseline of that change;
* ``table walk``: the same routes walked by hand (``ROUTES_BY_KEY``, first guard that holds, the same
  effect) — what the machine costs without ``transitions``;
* ``evolve``: one ``attrs.evolve`` of the state per move — the floor of any design that keeps frozen
  snapshots.

Printed: µs per move for each, one loop's set-up and tear-down (with its first state), and the ratios.

    python bench/moves.py [--n 3000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from transitions import Machine

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, ratio

from agentfsm.machine import graph
from agentfsm.machine.events import (
    Assembled,
    ModelResponse,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    ToolsDrained,
)
from agentfsm.machine.state import Limits, LoopState, Message

LIMITS = Limits()
USE = ({"type": "tool_use", "id": "t1", "name": "Echo", "input": {"text": "x"}},)
EVENTS = (
    Assembled(), StreamOpened(), StreamEnded(ModelResponse(USE, "tool_use")),
    ToolsDrained(Message("assistant", USE, kind="assistant"),
                 Message("user", ({"type": "tool_result", "tool_use_id": "t1", "content": "x"},), kind="tool_results")),
    Assembled(), StreamOpened(), StreamEnded(ModelResponse(({"type": "text", "text": "done"},), "end_turn")),
    StopHookVerdict(),
)
MOVES = 9


def start() -> LoopState:
    return LoopState(messages=(Message("user", "go"),))


def by_machine() -> None:
    with graph.LoopMachine(start()) as m:
        for ev in EVENTS:
            m.fire(ev, LIMITS)


def _stock_machine() -> Machine:
    stock = Machine(model=None, states=[p.value for p in graph.Phase], initial=graph.A.value,
                    auto_transitions=False, send_event=True, ignore_invalid_triggers=False, model_attribute="phase")
    for route in graph.ROUTES:
        conditions = [graph._condition(route)] if route.guard is not None else []
        for src in route.sources:
            stock.add_transition(route.event.__name__, src.value, graph.EDGES_BY_TRIGGER[route.edge].dest.value,
                                 conditions=conditions, before=[graph._perform(route)])
    return stock


_STOCK = _stock_machine()


def _stock_one(model: graph.LoopModel, ev: Any, automatic: bool) -> None:
    model.step = None
    if not (_STOCK.events[type(ev).__name__].trigger(model, event=ev, limits=LIMITS, automatic=automatic)
            and model.step is not None):
        raise AssertionError("no route")


def by_stock_machine() -> None:
    model = graph.LoopModel(start())
    for ev in EVENTS:
        _stock_one(model, ev, False)
        while model.record.phase in graph.AUTOMATIC:
            _stock_one(model, ev, True)


def by_table() -> None:
    state = start()
    for ev in EVENTS:
        while True:
            for route in graph.ROUTES_BY_KEY[(state.phase, type(ev))]:
                if route.guard is None or route.guard(state, ev, LIMITS):
                    state = graph._next_state(state, route, ev, LIMITS)
                    break
            if state.phase not in graph.AUTOMATIC:
                break


def _machine_lists() -> dict[tuple[str, str], tuple[Any, ...]]:
    return {(name, src): tuple((tuple(c.func for c in t.conditions), tuple(t.before), t.dest) for t in ts)
            for name, event in graph.MACHINE.events.items() for src, ts in event.transitions.items()}


_LISTS = _machine_lists()


class _Fired:
    """The two fields of transitions' EventData the callbacks read."""

    __slots__ = ("kwargs", "model")

    def __init__(self, model: graph.LoopModel, kwargs: dict[str, Any]) -> None:
        self.model, self.kwargs = model, kwargs


def _walk_one(model: graph.LoopModel, ev: Any, automatic: bool) -> None:
    # as LoopMachine._fire_one walked them before issue 31
    fired = _Fired(model, {"event": ev, "limits": LIMITS, "automatic": automatic})
    for conditions, before, dest in _LISTS[(type(ev).__name__, model.record.phase.value)]:
        for check in conditions:
            if not check(fired):
                break
        else:
            model.step = None
            for callback in before:
                callback(fired)
            model.phase = dest
            if model.step is not None:
                return
            break
    raise AssertionError("no route")


def by_machine_lists() -> None:
    model = graph.LoopModel(start())
    for ev in EVENTS:
        _walk_one(model, ev, False)
        while model.record.phase in graph.AUTOMATIC:
            _walk_one(model, ev, True)


def by_evolve() -> None:
    state = start()
    for i in range(MOVES):
        state = attrs.evolve(state, turn_count=i)


def set_up_only() -> None:
    graph.LoopMachine(start()).close()


def _round(fn: Callable[[], None], n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000, help="loops per round (default 3000)")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds (default 7)")
    args = ap.parse_args(argv)
    fns = {"machine": by_machine, "stock classes": by_stock_machine, "machine lists walked": by_machine_lists,
           "table walk": by_table, "evolve": by_evolve, "set-up": set_up_only}
    for fn in fns.values():  # warm-up
        _round(fn, 50)
    got: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        order = list(fns.items()) if r % 2 == 0 else list(reversed(fns.items()))
        for name, fn in order:
            got[name].append(_round(fn, args.n))
    per = {k: median(v) for k, v in got.items()}
    move_machine = (per["machine"] - per["set-up"]) / MOVES
    print(f"machine: {machine()}")
    print(f"moves: {args.n} loops x {MOVES} moves per round, {args.rounds} rounds, median round, CPU")
    print(f"  LoopMachine (MACHINE): {move_machine:6.1f} us/move  (+ {per['set-up']:.1f} us set-up and tear-down "
          "per loop)")
    move_stock = (per["stock classes"] - per["set-up"]) / MOVES
    print(f"  transitions' stock classes (issue 31): {move_stock:6.1f} us/move")
    print(f"  MACHINE's lists walked (before issue 31): {per['machine lists walked'] / MOVES:6.1f} us/move")
    print(f"  plain table walk:     {per['table walk'] / MOVES:7.1f} us/move")
    print(f"  attrs.evolve alone:   {per['evolve'] / MOVES:7.1f} us/move")
    print(f"  ratio machine/walk:   {ratio(move_machine, per['table walk'] / MOVES)}")
    print(f"  ratio machine/stock classes: {ratio(move_machine, move_stock)}")
    print(f"  ratio machine/lists walked: {ratio(move_machine, per['machine lists walked'] / MOVES)}")
    print(f"  ratio machine/evolve: {ratio(move_machine, per['evolve'] / MOVES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
