"""The stop signals of one in-process run, and how work is awaited under them.

Two signals: the user's interrupt (a streaming response is cut, ``cancel`` tools stop, ``block``
tools finish) and the hard abort (everything stops at once; tools may set it too, through
``ToolContext.abort``). :meth:`RunSignals.until_stopped` awaits a piece of work unless a stop comes
first, then cancels it, lets it unwind and raises :class:`Stopped`. How a response's tool calls (a
:class:`Batch`) are awaited under the two signals is here too: :meth:`RunSignals.drain` and
:meth:`RunSignals.finish_block_tools`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R", covariant=True)


class Stopped(Exception):
    """The awaited work was given up because the run is being stopped."""


class Batch(Protocol[R]):
    """A response's tool calls as the stop signals reach them
    (:class:`agentfsm.runtime.executor.StreamingToolExecutor`)."""

    def interrupt(self) -> object:
        """The user's interrupt: ``cancel`` tools are cancelled, ``block`` tools go on."""

    def has_pending(self) -> bool:
        """Some call has not finished."""

    def remaining(self) -> Awaitable[R]:
        """Every result, once all calls finished; awaiting it again is harmless, and cancelling the
        wait cancels no call."""


class RunSignals:
    """The run's interrupt and abort, as events anyone may set and as futures every wait includes.
    One watcher per armed run turns a tool's ``abort.set()`` into both, without a task per wait."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.abort_event = asyncio.Event()
        self.interrupt_event = asyncio.Event()
        self._stop_fut: asyncio.Future[None] | None = None  # resolved on an interrupt or an abort
        self._abort_fut: asyncio.Future[None] | None = None  # resolved on an abort
        self._watcher: asyncio.Task[None] | None = None

    def abort(self) -> None:
        self.abort_event.set()
        self.interrupt_event.set()
        self._signal()

    def interrupt(self) -> None:
        self.interrupt_event.set()
        self._signal()

    def stopping(self, *, hard: bool = False) -> bool:
        """The run is being stopped: aborted (anything may set the abort signal, tools included), or,
        unless ``hard``, interrupted by the user."""
        return self.abort_event.is_set() or (not hard and self.interrupt_event.is_set())

    def _signal(self) -> None:
        """Resolve the stop futures for the signals that are set."""
        for fut, on in ((self._stop_fut, self.stopping()), (self._abort_fut, self.stopping(hard=True))):
            if on and fut is not None and not fut.done():
                fut.set_result(None)

    def arm(self) -> None:
        """The run's stop futures, and the one watcher that resolves them when a tool (or anyone
        holding the event) sets the abort signal directly."""
        loop = asyncio.get_running_loop()
        self._stop_fut, self._abort_fut = loop.create_future(), loop.create_future()
        self._signal()

        async def watch() -> None:
            await self.abort_event.wait()
            self.interrupt_event.set()
            self._signal()

        self._watcher = loop.create_task(watch(), name=f"abort-watch:{self.name}")

    async def disarm(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.wait({watcher})

    async def until_stopped(self, work: Awaitable[T], *, hard: bool = False, stop_wins: bool = True) -> T:
        """Await ``work`` unless the run is stopped first (aborted, or, unless ``hard``, interrupted):
        then cancel it, let it unwind, and raise :class:`Stopped`. With ``stop_wins`` a stop also
        wins over work that ended at the same moment (a fast stream must not run on to its end past a
        cancellation); without it, work that is done counts (a response that has started is taken)."""
        stop = self._abort_fut if hard else self._stop_fut
        assert stop is not None, "the driver waits only while a run is armed"
        current = asyncio.current_task()
        if stop.done() or current is None or not asyncio.iscoroutine(work):
            return await self._until_stopped_in_task(work, stop, stop_wins)
        # The work is awaited in this task, directly: no task per wait (three a model turn, each a
        # task, its scheduling and its wake-up). A stop cuts it by cancelling this task from a
        # callback on the stop's future; the CancelledError unwinds the work where it waits, and the
        # cancellation is taken back (uncancel) once it did, so only a cancel from outside this
        # driver goes on as one.
        cut = False
        waiting = True

        def on_stop(_fut: asyncio.Future[None]) -> None:
            nonlocal cut
            if waiting:  # a callback already scheduled when the wait ended must not cut what follows
                cut = True
                current.cancel()

        stop.add_done_callback(on_stop)
        try:
            result = await work
        except asyncio.CancelledError:
            if not cut:
                raise  # this wait itself was cancelled (the work with it)
            # from here on the task's own count says whether anyone else cancelled it too
            _take_back(current)
            raise Stopped from None
        except Exception:
            if cut:
                _take_back(current)
                raise Stopped from None  # a failure racing the stop is moot
            if stop_wins and stop.done():
                raise Stopped from None
            raise
        finally:
            waiting = False
            stop.remove_done_callback(on_stop)
        if cut:
            _take_back(current)  # the work swallowed the cancellation and finished
        if cut or (stop_wins and stop.done()):
            raise Stopped  # the stop came first, or with the work's end and wins
        return result

    async def drain(self, batch: Batch[T]) -> tuple[T, bool]:
        """Every result of the batch (each is shown as soon as it may be, by the executor's on_ready);
        and whether the user interrupted meanwhile (then ``cancel`` tools were cancelled, ``block``
        tools finished). A hard abort raises :class:`Stopped`."""
        if self.stopping(hard=True):
            raise Stopped
        interrupted = self.stopping()
        if interrupted:
            batch.interrupt()
        # batch.remaining() only waits on the batch (cancelling the wait cancels no call) and can be
        # awaited again: a stop cuts the waiting, the calls go on or are cancelled by the executor
        try:
            results = await self.until_stopped(batch.remaining(), hard=interrupted)
        except Stopped:
            if self.stopping(hard=True):
                raise
            # the user's interrupt: cancel tools stop, block tools go on; wait for them unless aborted
            interrupted = True
            batch.interrupt()
            results = await self.until_stopped(batch.remaining(), hard=True)
        # an interrupt raised by the batch's last call itself (a permission callback's deny with
        # interrupt) still interrupts the batch
        return results, interrupted or self.stopping()

    async def finish_block_tools(self, batch: Batch[Any]) -> bool:
        """A response was cut by a stop while its calls ran. On the user's interrupt, the ``block``
        tools it started finish first (their real results pair their calls; ``cancel`` tools are
        cancelled); a hard abort, during or before, cuts them. Whether it waited for any."""
        if not self.stopping(hard=True) and batch.has_pending():
            batch.interrupt()
            try:
                await self.until_stopped(batch.remaining(), hard=True)
            except Stopped:
                pass
            return True
        return False

    @staticmethod
    async def _until_stopped_in_task(work: Awaitable[T], stop: asyncio.Future[None], stop_wins: bool) -> T:
        """:meth:`until_stopped` for work that is not a coroutine (or a stop already made): the work
        in a task of its own, cancelled from a callback on the stop's future."""
        task = asyncio.ensure_future(work)
        if stop.done():
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: moot
            raise Stopped
        cut = False

        def on_stop(_fut: asyncio.Future[None]) -> None:
            nonlocal cut
            if not task.done():
                cut = True
                task.cancel()

        stop.add_done_callback(on_stop)
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not cut or (current is not None and current.cancelling()):
                raise  # this wait itself was cancelled (the work with it)
            raise Stopped from None
        except Exception:
            if cut or (stop_wins and stop.done()):
                raise Stopped from None  # a failure racing the stop is moot
            raise
        finally:
            stop.remove_done_callback(on_stop)
        if cut or (stop_wins and stop.done()):
            raise Stopped  # the stop came first, or with the work's end and wins
        return result


def _take_back(current: asyncio.Task[Any]) -> None:
    """Undo the cancellation a stop made of ``current``; a cancellation from outside (the task's
    count still above zero) goes on as one."""
    if current.uncancel() > 0:
        raise asyncio.CancelledError
