"""The loop's skeleton, once: perform the phase, fire the event, perform what the move declares.

Both runtimes run the loop through :class:`LoopRunner`: the in-process driver
(:mod:`agentfsm.runtime.driver`) and the Temporal workflow (:mod:`agentfsm.temporal.workflow`). A runtime
supplies only how to do things (:class:`Runtime`): the work of each phase, turned into an event
record; the abort event with what was shown so far; and how to carry out each consequence a move
declares (:class:`agentfsm.machine.graph.Does`). Which move is taken, and what it means for the outside world
— keep, pair or withdraw what was streamed, close the response's tool calls, take queued input,
tell the client of a compaction or a Stop hook's feedback — is read from the step the machine
returns, never re-derived by a runtime from an edge's name or kind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import EllipsisType
from typing import Any, Protocol

from agentfsm.machine import graph
from agentfsm.machine.events import Aborted, Event, StopHookVerdict, StreamEnded, TaskNotified
from agentfsm.machine.state import Limits, LoopState, Phase
from agentfsm.runtime import phases
from agentfsm.runtime.result import RunAccount


class StepObserver(Protocol):
    """Told of every move of the loop, after it happened: the state before, the step (edge, route,
    state after) and the event that caused it (the same event for a move a phase made on its own)."""

    def on_step(self, before: LoopState, step: graph.Step, event: Event) -> None: ...


class Runtime(Protocol):
    """How one runtime performs the loop: I/O only. The phase work methods are named in :data:`WORK`."""

    limits: Limits
    observers: Sequence[StepObserver]
    account: RunAccount  # the run's account (its last API error's status: what is shown at the end)

    def stopping(self) -> bool:
        """The run is being stopped (interrupted or aborted): the next phase is not performed."""

    def abort_event(self, state: LoopState) -> Aborted:
        """The abort event from ``state``: the blocks the response in progress showed, and the
        results of its calls that finished (the abort route pairs the rest)."""

    async def between(self, state: LoopState) -> None:
        """Before a phase is performed (a Temporal workflow may continue as a new run here)."""

    async def task_notifications(self, state: LoopState) -> TaskNotified | None:
        """The run ended and may go on (:func:`agentfsm.machine.graph.takes_notifications`): wait while
        background tasks it started may still report, and return what they reported; None when
        nothing is left to wait for (or the run is being stopped, or other input is queued)."""

    # the consequences a move declares (agentfsm.machine.graph.Does), carried out after the move
    def warn(self, notice: str) -> None: ...

    def take_input(self) -> None: ...

    def compacted(self, event: Event) -> None: ...

    def show(self, message: Mapping[str, Any]) -> None: ...

    def keep_finished(self, tool_use_ids: Sequence[str]) -> None: ...

    def close_calls(self, reason: str) -> None: ...

    def withdraw(self) -> None: ...

    def show_results(self, blocks: Sequence[Mapping[str, Any]]) -> None: ...


# The runtime's method that performs each phase's work (stop: its Stop hooks, when they are due).
WORK: Mapping[Phase, str] = {
    Phase.ASSEMBLE: "assemble",
    Phase.CALL_MODEL: "call_model",
    Phase.STREAM: "consume_stream",
    Phase.DISPATCH_TOOLS: "dispatch_tools",
    Phase.STOP: "stop_hooks",
}


def perform(runtime: Runtime, session_id: str, before: LoopState, step: graph.Step, event: Event) -> None:
    """Carry out what ``step`` declares besides its state: its notices and its edge's :class:`Does`.
    The one place a move's consequences for the outside world are decided; both runtimes call it."""
    for notice in step.notices:
        runtime.warn(notice)
    does = step.edge.does
    if does.take_input:
        runtime.take_input()
    if does.compacts and phases.rewrote_history(before, step):
        runtime.compacted(event)
    if does.stop_feedback and isinstance(event, StopHookVerdict) and event.blocked:
        runtime.show(phases.stop_feedback_message(session_id, event))
    if does.keeps_finished and isinstance(event, StreamEnded | Aborted):
        runtime.keep_finished(tuple(b["tool_use_id"] for b in event.finished))
    if does.close_calls is not None:
        runtime.close_calls(does.close_calls)
    if does.shown is graph.Shown.WITHDRAW:
        runtime.withdraw()
    elif does.shown is graph.Shown.PAIR:
        runtime.show_results(graph.shown_results(step, event))


class LoopRunner:
    """One run of the loop on its machine (:class:`agentfsm.machine.graph.LoopMachine`), through a runtime.
    :meth:`fire` is how any event (the run's setup failure included) reaches the machine; :meth:`run`
    is the loop until ``stop`` (and its due Stop hooks, and the passes the run's background tasks start
when they report after it ended). A cancellation of the run fires the abort
    event first, so the run ends at ``stop`` with everything shown paired."""

    def __init__(self, runtime: Runtime, state: LoopState, session_id: str, *,
                 began_after: str | EllipsisType | None = ...) -> None:
        self.runtime = runtime
        self.session_id = session_id
        self.machine = graph.LoopMachine(state)
        # the uuid of the history's last message when the loop began (``state``'s unless given: a
        # run continued as new passes its first run's), so what is shown at the end is this run's
        self.began_after = began_after if not isinstance(began_after, EllipsisType) else \
            (state.messages[-1].uuid if state.messages else None)

    @property
    def state(self) -> LoopState:
        return self.machine.state

    def fire(self, event: Event) -> None:
        runtime = self.runtime
        before = self.machine.state
        for step in self.machine.fire(event, runtime.limits):
            for observer in runtime.observers:
                observer.on_step(before, step, event)
            perform(runtime, self.session_id, before, step, event)
            before = step.state

    async def run(self, first: Event | None = None) -> LoopState:
        """Run to the end (``first``: an event that arrives before any phase, a setup failure), then
        show what follows the loop (:func:`agentfsm.runtime.phases.closing_messages`: the API error
        message, the interrupt marker), the same in every runtime."""
        runtime = self.runtime
        try:
            if first is not None:
                self.fire(first)
            while True:
                state = self.machine.state
                if state.phase is Phase.STOP and not graph.stop_hooks_are_due(state):
                    # the run ended; background work it started may start the next pass
                    if not graph.takes_notifications(state, runtime.limits) or runtime.stopping():
                        break
                    notified = await runtime.task_notifications(state)
                    if notified is None:
                        break
                    self.fire(notified)
                    continue
                await runtime.between(state)
                state = self.machine.state
                if state.phase is not Phase.STOP and runtime.stopping():
                    event: Event = runtime.abort_event(state)
                else:
                    event = await getattr(runtime, WORK[state.phase])(state)
                self.fire(event)
        except asyncio.CancelledError:
            if self.machine.phase is not Phase.STOP:
                self.fire(runtime.abort_event(self.machine.state))
            raise
        finally:
            self.machine.close()
        state = self.machine.state
        for message in phases.closing_messages(state, self.began_after, runtime.account.api_error_status,
                                               self.session_id, runtime.account.api_error_endpoint):
            runtime.show(message)
        return state
