"""The run's stop signals on their own (agentfsm.runtime.signals): which wait each signal cuts, that a
cut wait cancels its work and takes its own cancellation back, how a tie between a stop and the work's
end is decided, and how a batch of tool calls is drained under them. The loop's tests reach these only
through whole runs, where the moment a signal lands is not chosen (issue 35: 6 of 10 sampled mutants
of this module survived them)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentfsm.runtime.signals import RunSignals, Stopped


async def armed() -> RunSignals:
    signals = RunSignals("t")
    signals.arm()
    return signals


async def _parked(gate: asyncio.Event, unwound: list[str], value: str = "done") -> str:
    try:
        await gate.wait()
        return value
    finally:
        unwound.append("unwound")


async def _cut_by(signal: Callable[[RunSignals], None], *, hard: bool,
                  wrap: Callable[[Awaitable[str]], Awaitable[str]] | None = None) -> tuple[str, list[str]]:
    """Wait on parked work, give ``signal`` once the wait began; what the wait gave, and what unwound."""
    signals = await armed()
    gate, unwound = asyncio.Event(), []
    work = _parked(gate, unwound)
    waiter = asyncio.ensure_future(signals.until_stopped(wrap(work) if wrap else work, hard=hard))
    await asyncio.sleep(0)
    signal(signals)
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, gate.set)
    try:
        outcome = await asyncio.wait_for(waiter, 2)
    except Stopped:
        outcome = "stopped"
    await signals.disarm()
    return outcome, unwound


def _as_task(work: Awaitable[str]) -> Awaitable[str]:
    return asyncio.ensure_future(work)  # not a coroutine: the wait runs it in a task of its own


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
async def test_an_interrupt_cuts_a_soft_wait_and_not_a_hard_one(wrap: Any) -> None:
    assert await _cut_by(RunSignals.interrupt, hard=False, wrap=wrap) == ("stopped", ["unwound"])
    assert await _cut_by(RunSignals.interrupt, hard=True, wrap=wrap) == ("done", ["unwound"])


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
async def test_an_abort_cuts_every_wait(wrap: Any) -> None:
    assert await _cut_by(RunSignals.abort, hard=False, wrap=wrap) == ("stopped", ["unwound"])
    assert await _cut_by(RunSignals.abort, hard=True, wrap=wrap) == ("stopped", ["unwound"])


async def test_a_tool_setting_the_abort_event_itself_is_an_abort_and_an_interrupt() -> None:
    """Tools hold only the event (ToolContext.abort): the watcher turns its setting into both signals."""
    signals = await armed()
    outcome = await _cut_by(lambda s: s.abort_event.set(), hard=True)
    assert outcome == ("stopped", ["unwound"])
    signals.abort_event.set()
    await asyncio.sleep(0)
    assert signals.interrupt_event.is_set() and signals.stopping(hard=True)
    await signals.disarm()


async def test_disarm_ends_the_watcher() -> None:
    signals = await armed()
    watcher = signals._watcher
    assert watcher is not None and not watcher.done()
    await signals.disarm()
    assert watcher.cancelled() and signals._watcher is None
    signals.abort_event.set()
    await asyncio.sleep(0)
    assert not signals.interrupt_event.is_set(), "a disarmed run has no watcher left to turn it into an interrupt"
    await signals.disarm()  # twice is harmless


async def test_signals_given_twice_or_in_either_order_are_harmless() -> None:
    for order in ((RunSignals.interrupt, RunSignals.abort), (RunSignals.abort, RunSignals.interrupt),
                  (RunSignals.interrupt, RunSignals.interrupt)):
        signals = await armed()
        for give in order:
            give(signals)
        assert signals.stopping()
        assert signals.stopping(hard=True) is (RunSignals.abort in order)
        await signals.disarm()


async def test_a_stop_given_before_arming_holds_once_armed() -> None:
    signals = RunSignals("t")
    signals.interrupt()
    signals.arm()
    with pytest.raises(Stopped):
        await signals.until_stopped(asyncio.sleep(5))
    assert await signals.until_stopped(asyncio.sleep(0, "ran"), hard=True) == "ran"
    await signals.disarm()


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
@pytest.mark.parametrize("stop_wins", [True, False])
async def test_a_stop_that_comes_with_the_works_end(stop_wins: bool, wrap: Any) -> None:
    """The work ends in the same step as the stop: with ``stop_wins`` the stop is what counts (a fast
    stream must not run past a cancellation); without it, the finished work is taken."""
    signals = await armed()
    wrap = wrap or (lambda work: work)

    async def ends_with_a_stop() -> str:
        signals.interrupt()
        return "taken"

    if stop_wins:
        with pytest.raises(Stopped):
            await signals.until_stopped(wrap(ends_with_a_stop()), stop_wins=True)
    else:
        assert await signals.until_stopped(wrap(ends_with_a_stop()), stop_wins=False) == "taken"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await signals.disarm()


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
@pytest.mark.parametrize("stop_wins", [True, False])
async def test_a_failure_racing_a_stop(stop_wins: bool, wrap: Any) -> None:
    signals = await armed()
    wrap = wrap or (lambda work: work)

    async def fails_with_a_stop() -> str:
        signals.interrupt()
        raise OSError("connection reset")

    if stop_wins:
        with pytest.raises(Stopped):
            await signals.until_stopped(wrap(fails_with_a_stop()), stop_wins=True)
    else:
        with pytest.raises(OSError, match="connection reset"):
            await signals.until_stopped(wrap(fails_with_a_stop()), stop_wins=False)
    await signals.disarm()


async def test_a_failure_without_a_stop_is_the_failure() -> None:
    signals = await armed()

    async def fails() -> str:
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        await signals.until_stopped(fails())
    await signals.disarm()


async def test_a_cut_wait_takes_its_own_cancellation_back_and_leaves_an_outside_one() -> None:
    signals = await armed()
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, signals.interrupt)
    with pytest.raises(Stopped):
        await signals.until_stopped(asyncio.sleep(5))
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)  # and no late cut lands on what follows
    await signals.disarm()

    signals = await armed()
    waiter = asyncio.ensure_future(signals.until_stopped(asyncio.sleep(5)))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await signals.disarm()


async def test_work_that_swallows_the_cut_is_still_stopped() -> None:
    signals = await armed()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    asyncio.get_running_loop().call_later(0.02, signals.interrupt)
    with pytest.raises(Stopped):
        await signals.until_stopped(stubborn())
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await signals.disarm()


async def test_a_wait_that_ended_is_not_cut_by_a_stop_after_it() -> None:
    signals = await armed()
    assert await signals.until_stopped(asyncio.sleep(0, "first")) == "first"
    signals.abort()
    await asyncio.sleep(0)
    await asyncio.sleep(0.01)  # what follows the ended wait runs on, uncancelled
    await signals.disarm()


class FakeBatch:
    """Tool calls that end when ``done`` is set; ``interrupt`` counts the user's interrupts."""

    def __init__(self, pending: bool = True) -> None:
        self.done = asyncio.Event()
        self.interrupts = 0
        self.pending = pending

    def interrupt(self) -> None:
        self.interrupts += 1

    def has_pending(self) -> bool:
        return self.pending and not self.done.is_set()

    async def remaining(self) -> list[str]:
        await self.done.wait()
        return ["result"]


async def _drain(give: Callable[[RunSignals], None] | None, *, before: bool) -> tuple[Any, int]:
    signals = await armed()
    batch = FakeBatch()
    if give and before:
        give(signals)
    drained = asyncio.ensure_future(signals.drain(batch))
    await asyncio.sleep(0.01)
    if give and not before:
        give(signals)
    await asyncio.sleep(0.01)
    batch.done.set()
    try:
        outcome = await asyncio.wait_for(drained, 2)
    except Stopped:
        outcome = "stopped"
    await signals.disarm()
    return outcome, batch.interrupts


async def test_drain_under_each_signal() -> None:
    assert await _drain(None, before=False) == ((["result"], False), 0)
    assert await _drain(RunSignals.interrupt, before=True) == ((["result"], True), 1)
    assert await _drain(RunSignals.interrupt, before=False) == ((["result"], True), 1)
    assert await _drain(RunSignals.abort, before=True) == ("stopped", 0)
    assert (await _drain(RunSignals.abort, before=False))[0] == "stopped"


async def test_an_interrupt_raised_by_the_batchs_last_call_still_interrupts() -> None:
    signals = await armed()

    class InterruptingBatch(FakeBatch):
        async def remaining(self) -> list[str]:
            signals.interrupt_event.set()  # a permission callback's deny with interrupt, set as the call ends
            return ["result"]

    assert await signals.drain(InterruptingBatch()) == (["result"], True)
    await signals.disarm()


async def test_block_tools_finish_after_an_interrupt_and_not_after_an_abort() -> None:
    signals = await armed()
    signals.interrupt()
    batch = FakeBatch()
    asyncio.get_running_loop().call_later(0.02, batch.done.set)
    assert await signals.finish_block_tools(batch) is True
    assert batch.interrupts == 1 and batch.done.is_set()
    assert await signals.finish_block_tools(FakeBatch(pending=False)) is False
    await signals.disarm()

    signals = await armed()
    signals.abort()
    batch = FakeBatch()
    assert await signals.finish_block_tools(batch) is False and batch.interrupts == 0
    await signals.disarm()

    signals = await armed()  # an abort while the block tools finish cuts the wait
    signals.interrupt()
    batch = FakeBatch()
    asyncio.get_running_loop().call_later(0.02, signals.abort)
    assert await asyncio.wait_for(signals.finish_block_tools(batch), 2) is True
    assert not batch.done.is_set()
    await signals.disarm()


# --- the campaign's full run (2026-12-06): the wait in a task of its own, and the defaults ----------


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
@pytest.mark.parametrize("stop_wins", [True, False])
async def test_work_given_after_a_stop_never_starts(stop_wins: bool, wrap: Any) -> None:
    """A stop already made: the work is given up before its first step, whatever ``stop_wins`` says
    (a turn that was interrupted before it began must not start, even for an instant), and a work that
    would finish at once is not taken either."""
    for give in (RunSignals.interrupt, RunSignals.abort):
        signals = await armed()
        give(signals)
        started: list[str] = []

        async def work(started: list[str] = started) -> str:
            started.append("started")
            return "finished at once"

        with pytest.raises(Stopped):
            await signals.until_stopped(wrap(work()) if wrap else work(), stop_wins=stop_wins)
        assert started == []
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await signals.disarm()


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
async def test_by_default_a_stop_that_comes_with_the_works_end_wins(wrap: Any) -> None:
    signals = await armed()

    async def ends_with_a_stop() -> str:
        signals.interrupt()
        return "taken"

    with pytest.raises(Stopped):
        await signals.until_stopped(wrap(ends_with_a_stop()) if wrap else ends_with_a_stop())
    await signals.disarm()


async def test_work_in_a_task_of_its_own_is_cancelled_by_the_stop() -> None:
    """Work that would never end on its own (a task, not a coroutine): the stop cancels it."""
    signals = await armed()
    work = asyncio.ensure_future(asyncio.Event().wait())
    asyncio.get_running_loop().call_later(0.01, signals.interrupt)
    with pytest.raises(Stopped):
        await asyncio.wait_for(signals.until_stopped(work), 10)
    assert work.cancelled()
    await signals.disarm()


@pytest.mark.parametrize("wrap", [None, _as_task], ids=["in-task", "own-task"])
async def test_a_cut_work_that_fails_as_it_unwinds_is_stopped(wrap: Any) -> None:
    """Work that raises something else when cut (a cleanup that fails): the failure is moot, the wait
    is stopped, with or without ``stop_wins``, and the cut is taken back."""
    for stop_wins in (True, False):
        signals = await armed()

        async def fails_when_cut() -> str:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                raise OSError("cleanup failed") from None
            return "slept"

        asyncio.get_running_loop().call_later(0.01, signals.interrupt)
        with pytest.raises(Stopped):
            await signals.until_stopped(wrap(fails_when_cut()) if wrap else fails_when_cut(), stop_wins=stop_wins)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await signals.disarm()


async def test_after_a_cut_the_work_swallowed_the_next_cut_is_a_stop_too() -> None:
    """The user's interrupt cuts a wait whose work swallows the cancellation; the same task then waits
    hard (block tools finishing) and an abort cuts that: a stop again, not a cancellation of the run."""
    signals = await armed()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    loop = asyncio.get_running_loop()
    loop.call_later(0.01, signals.interrupt)
    with pytest.raises(Stopped):
        await signals.until_stopped(stubborn())
    loop.call_later(0.01, signals.abort)
    with pytest.raises(Stopped):
        await signals.until_stopped(asyncio.sleep(5), hard=True)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await signals.disarm()


async def test_a_wait_in_a_task_of_its_own_cancelled_from_outside_is_a_cancellation() -> None:
    """Cancelling the waiter (the run's caller) is a cancellation, not a stop: alone, and when it comes
    in the same step as a stop."""
    for with_a_stop in (False, True):
        signals = await armed()
        work = asyncio.ensure_future(asyncio.Event().wait())
        waiter = asyncio.ensure_future(signals.until_stopped(work))
        await asyncio.sleep(0)
        if with_a_stop:
            signals.interrupt()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert work.cancelled()
        await signals.disarm()


async def test_work_cancelled_by_someone_else_is_a_cancellation_not_a_stop() -> None:
    signals = await armed()
    work = asyncio.ensure_future(asyncio.Event().wait())
    asyncio.get_running_loop().call_later(0.01, work.cancel)
    with pytest.raises(asyncio.CancelledError):
        await signals.until_stopped(work)
    assert not signals.stopping()
    await signals.disarm()


async def test_a_stopped_wait_leaves_no_unretrieved_failure_behind() -> None:
    """Work that had already failed when the wait began after a stop: its failure is moot, and asyncio
    must not report it later as never retrieved (a spurious error in the user's log)."""
    reports: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reports.append(context))
    try:
        signals = await armed()
        signals.interrupt()

        async def failing() -> str:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                raise OSError("failed while cancelled") from None
            return "slept"

        work = asyncio.ensure_future(failing())
        await asyncio.sleep(0)  # started: it is parked in its sleep
        with pytest.raises(Stopped):
            await signals.until_stopped(work)
        del work
        gc.collect()
        await asyncio.sleep(0)
        await signals.disarm()
    finally:
        loop.set_exception_handler(None)
    assert [r.get("message") for r in reports] == []
