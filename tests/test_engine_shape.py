"""The engine's shape (issue 34): a finished session is freed by reference counting alone (no
reference cycles among its per-session objects, so the cyclic gc has nothing of it to walk), the
objects a turn leaves behind do not grow with the length of the conversation, and the lean machine
(:class:`agentfsm.machine.graph.LeanMachine`) takes the same steps as transitions' stock classes."""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transitions import Machine

from agentfsm.common.weak import weak_method
from agentfsm.machine import graph
from agentfsm.machine.events import Assembled, ModelResponse, StopHookVerdict, StreamEnded, StreamOpened, ToolsDrained
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, LoopState, Message, Phase
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import Scenario, StreamedResponse, TextBlock, ToolUseBlock
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import Tool, ToolContext, tool

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@tool("Echo", "Echo the text back.", ECHO_SCHEMA, concurrency_safe=True)
async def ECHO(input: Any, ctx: ToolContext) -> str:
    return str(input["text"])


def turns(k: int) -> Scenario:
    calls = [StreamedResponse(blocks=(ToolUseBlock(f"toolu_{i:04d}", "Echo", {"text": f"turn {i}"}),),
                              stop_reason="tool_use") for i in range(k)]
    return Scenario(prompt="go", responses=(*calls, StreamedResponse(blocks=(TextBlock("done"),))))


def options(tmp_path: Path, *, trace: bool, tools: tuple[Tool, ...] = (ECHO,)) -> Options:
    return Options(model="claude-sonnet-4-5", tools=(), extra_tools=tools, cwd=tmp_path, setting_sources=(),
                   write_trace=trace, sessions_dir=tmp_path / "sessions", permission_mode="bypassPermissions")


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _finished_session(tmp_path: Path, *, trace: bool, k: int = 3) -> weakref.ref[Session]:
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path, trace=trace), client=ScriptedModel(turns(k)), emit=seen.append)
    result = await session.run("go")
    await session.aclose()
    assert result.result == "done" and result.num_turns == k + 1
    assert any(m.get("type") == "result" for m in seen)
    return weakref.ref(session)


@pytest.mark.parametrize("trace", [False, True], ids=["untraced", "traced"])
def test_a_finished_session_is_freed_by_refcounting(tmp_path: Path, no_gc: None, trace: bool) -> None:
    """With the cyclic gc off, dropping a finished session frees it and everything it owned: the
    collector then finds nothing (a cycle anywhere in the session, its driver, queue, gate, sandbox,
    subagents or trace would leave objects for it)."""
    asyncio.run(_finished_session(tmp_path, trace=trace))  # warm-up: module-level caches filled once
    gc.collect()
    ref = asyncio.run(_finished_session(tmp_path, trace=trace))
    assert ref() is None
    assert gc.collect() == 0


def test_a_session_that_ran_a_subagent_is_freed_by_refcounting(tmp_path: Path, no_gc: None) -> None:
    """The parent's subagents hold it weakly, and the child's session (with its own queue, driver
    and gate) goes with it."""
    from agentfsm.tools import AgentTool  # noqa: F401 - the Agent tool is a built-in offered by name

    def script() -> ScriptedModel:
        def answer(request: Any, n: int) -> Any:
            parent = any(t["name"] == "Agent" for t in request.tools)
            if not parent:
                return {"blocks": [{"type": "text", "text": "CHILD"}]}
            if n == 0:
                return {"blocks": [{"type": "tool_use", "id": "toolu_a", "name": "Agent",
                                    "input": {"description": "d", "prompt": "p", "subagent_type": "general-purpose"}}]}
            return {"blocks": [{"type": "text", "text": "PARENT"}]}
        return ScriptedModel(answer, per_session=True)

    async def run() -> weakref.ref[Session]:
        opts = Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "s",
                       setting_sources=(), tools=("Agent", "Read"))
        session = Session(opts, client=script())
        result = await session.run("go")
        await session.aclose()
        assert result.result == "PARENT"
        return weakref.ref(session)

    asyncio.run(run())
    gc.collect()
    ref = asyncio.run(run())
    assert ref() is None
    assert gc.collect() == 0


def _tracked_per_turn(tmp_path: Path, k: int) -> list[int]:
    """gc-tracked objects alive after each model turn of one session of ``k`` tool turns, from the
    session's own step observer (the cyclic gc off, so the count only changes by allocation and
    refcount frees)."""
    counts: list[int] = []

    class PerTurn:
        def on_step(self, before: LoopState, step: graph.Step, event: Any) -> None:
            if step.trigger == "next_turn":
                counts.append(len(gc.get_objects()))

    async def run() -> None:
        session = Session(options(tmp_path, trace=True), client=ScriptedModel(turns(k)), observers=(PerTurn(),))
        await session.run("go")
        await session.aclose()

    asyncio.run(run())
    return counts


def test_objects_per_turn_stay_flat(tmp_path: Path, no_gc: None) -> None:
    """What a turn leaves alive is its share of the history (the messages, kept for the next
    request), the same at turn 40 as at turn 10: nothing accumulates per turn beyond it."""
    counts = _tracked_per_turn(tmp_path, 60)
    growth = [b - a for a, b in itertools.pairwise(counts)]
    early, late = sorted(growth[5:15])[5], sorted(growth[45:55])[5]  # medians of ten turns
    assert 0 < early <= 40, growth  # two messages and their blocks, about seventeen objects
    assert late <= early + 5, (early, late, growth)


# --- the lean machine ----------------------------------------------------------------------------

USE = ({"type": "tool_use", "id": "t1", "name": "Echo", "input": {"text": "x"}},)
EVENTS = (Assembled(), StreamOpened(), StreamEnded(ModelResponse(USE, "tool_use")),
          ToolsDrained(Message("assistant", USE, kind="assistant"),
                       Message("user", ({"type": "tool_result", "tool_use_id": "t1", "content": "x"},),
                               kind="tool_results")),
          Assembled(), StreamOpened(), StreamEnded(ModelResponse(({"type": "text", "text": "done"},), "end_turn")),
          StopHookVerdict())


def _stock() -> Machine:
    stock = Machine(model=None, states=[p.value for p in Phase], initial=Phase.ASSEMBLE.value,
                    auto_transitions=False, send_event=True, ignore_invalid_triggers=False, model_attribute="phase")
    for route in graph.ROUTES:
        conditions = [graph._condition(route)] if route.guard is not None else []
        for src in route.sources:
            stock.add_transition(route.event.__name__, src.value, graph.EDGES_BY_TRIGGER[route.edge].dest.value,
                                 conditions=conditions, before=[graph._perform(route)])
    return stock


def test_the_lean_machine_takes_the_stock_machines_steps() -> None:
    """The same routes on transitions' stock classes and on the lean ones: the same steps, in the
    same states, with the same callbacks run (an ``after`` callback and ``finalize_event``)."""
    stock = _stock()
    lean = graph.build_machine()
    assert type(lean) is graph.LeanMachine and type(stock) is Machine
    limits = Limits()
    runs: list[list[tuple[Any, ...]]] = []
    for machine in (stock, lean):
        seen: list[str] = []
        machine.finalize_event.append(lambda ed, seen=seen: seen.append("final:" + ed.model.phase))
        for transitions in machine.events["StreamEnded"].transitions.values():
            for t in transitions:
                t.after.append(lambda ed, seen=seen: seen.append("after:" + ed.model.phase))
        model = graph.LoopModel(LoopState(messages=(Message("user", "go"),)))
        steps: list[tuple[Any, ...]] = []
        for ev in EVENTS:
            automatic = False
            while True:
                model.step = None
                assert machine.events[type(ev).__name__].trigger(model, event=ev, limits=limits, automatic=automatic)
                step = model.step
                assert step is not None
                steps.append((step.trigger, step.route, step.automatic, step.state.phase, step.state.turn_count))
                if model.record.phase not in graph.AUTOMATIC:
                    break
                automatic = True
        runs.append([*steps, tuple(seen)])
    assert runs[0] == runs[1]
    seen_lean = runs[1][-1]
    assert sum(x.startswith("final:") for x in seen_lean) == len(runs[1]) - 1  # once per trigger
    assert [x for x in seen_lean if x.startswith("after:")] == ["after:dispatch_tools", "after:stop"]


def test_the_lean_machine_refuses_positional_callbacks() -> None:
    with pytest.raises(TypeError, match="send_event=True"):
        graph.LeanMachine(model=None, states=["a"], initial="a", send_event=False)


def test_a_guard_raising_reaches_the_caller_as_in_transitions() -> None:
    machine = graph.LeanMachine(model=None, states=["a", "b"], initial="a", send_event=True, auto_transitions=False)

    def boom(_ed: Any) -> bool:
        raise ValueError("guard broke")

    machine.add_transition("go", "a", "b", conditions=[boom])
    model = type("M", (), {"state": "a"})()
    with pytest.raises(ValueError, match="guard broke"):
        machine.events["go"].trigger(model)
    assert model.state == "a"


class _Owner:
    def hello(self, name: str) -> str:
        return f"hello {name}"


def test_weak_method_does_not_keep_its_object() -> None:
    owner = _Owner()
    call, quiet = weak_method(owner.hello), weak_method(owner.hello, gone=None)
    assert call("x") == "hello x" and quiet("y") == "hello y"
    del owner
    assert quiet("y") is None
    with pytest.raises(ReferenceError, match=r"_Owner\.hello"):
        call("x")
