"""The input queue of one session: user input submitted while a run goes on, and task notifications.

Every item carries a uuid and a command lifecycle (Claude Code's ``command_lifecycle``)::

    queued ──absorb──▶ started ──run ends──▶ completed   (the run ended on a controlled terminal reason)
                                         └─▶ cancelled   (abort, hard failure, exception)
    queued ──────────session teardown───────▶ discarded

Each change is emitted as ``{"type": "system", "subtype": "command_lifecycle", "uuid", "state",
"session_id"}``. An item leaves the queue only when it is absorbed into the conversation — as an
attachment of a request the model accepted (the driver sends what is queued with every request and
:meth:`InputQueue.take_items` it when the machine's ``open_stream`` step takes it into the
conversation) or as the prompt of a follow-up run (:meth:`InputQueue.take`). The
absorbed message is written to the session file at once, so nothing submitted is lost: items still
queued when a run ends stay queued for the next run of the session, and only session teardown
(:meth:`InputQueue.discard`) drops them — saying so with ``discarded``.

No state is shared between queues; one per session.
"""

from __future__ import annotations

import asyncio
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.machine import prompts
from agentfsm.machine.state import Message

Emit = Callable[[dict[str, Any]], None]
Content = str | Sequence[Mapping[str, Any]]

QUEUED, STARTED, COMPLETED, CANCELLED, DISCARDED = "queued", "started", "completed", "cancelled", "discarded"

USER, TASK_NOTIFICATION = "user", "task_notification"


def _blocks(content: Content) -> tuple[Mapping[str, Any], ...]:
    if isinstance(content, str):
        return ({"type": "text", "text": content},)
    return tuple(dict(b) for b in content)


@attrs.define(eq=False)
class QueueItem:
    """One queued command. ``kind``: ``user`` (typed input) or ``task_notification`` (a background
    agent finished). ``content`` holds wire blocks."""

    content: tuple[Mapping[str, Any], ...] = attrs.field(converter=_blocks)
    uuid: str = attrs.field(factory=lambda: str(uuidlib.uuid4()))
    kind: str = USER
    state: str = QUEUED

    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")

    def as_attachment(self) -> Message:
        """The message that carries this item into a running turn (its uuid is the item's). User
        input is wrapped the way Claude Code marks mid-turn input; a task notification goes in as it is."""
        if self.kind == TASK_NOTIFICATION:
            return Message("user", self.content, kind="task_notification", uuid=self.uuid)
        wrapped = attrs.evolve(prompts.queued_input(self.text()), uuid=self.uuid)
        if all(b.get("type") == "text" for b in self.content):
            return wrapped
        # images and other blocks cannot be wrapped in a reminder; they follow the wrapped text
        extra = tuple(b for b in self.content if b.get("type") != "text")
        return attrs.evolve(wrapped, content=wrapped.content + extra)


class InputQueue:
    """FIFO of :class:`QueueItem`; see the module docstring for the lifecycle.

    ``emit`` receives the lifecycle messages (the session binds it with :meth:`bind`). Not
    thread-safe: submit from the event loop (``loop.call_soon_threadsafe`` from other threads).
    """

    def __init__(self, emit: Emit | None = None, session_id: str = "") -> None:
        self._emit: Emit | None = emit
        self.session_id = session_id
        self._queued: list[QueueItem] = []
        # absorbed by the run in progress, settled when it ends
        self._started: list[QueueItem] = []
        self._wake: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None

    def bind(self, emit: Emit | None, session_id: str) -> None:
        self._emit = emit
        self.session_id = session_id

    # --- inspection -----------------------------------------------------------------------------

    @property
    def pending(self) -> tuple[QueueItem, ...]:
        """Items still queued (not yet absorbed)."""
        return tuple(self._queued)

    @property
    def in_flight(self) -> tuple[QueueItem, ...]:
        """Items absorbed by the run in progress, not yet completed or cancelled."""
        return tuple(self._started)

    def __bool__(self) -> bool:
        # an empty queue is still a queue: `queue or InputQueue()` must keep the session's
        return True

    # --- lifecycle ------------------------------------------------------------------------------

    def _set(self, item: QueueItem, state: str) -> None:
        item.state = state
        if self._emit is not None:
            self._emit({"type": "system", "subtype": "command_lifecycle", "uuid": item.uuid,
                        "state": state, "session_id": self.session_id})

    def submit(self, content: Content, *, uuid: str | None = None, kind: str = USER) -> QueueItem:
        """Queue input for the running turn (or the next run). Returns the item (its uuid)."""
        item = QueueItem(content, uuid=uuid or str(uuidlib.uuid4()), kind=kind)
        if not item.content:
            raise ValueError("cannot queue empty input")
        self._queued.append(item)
        self._set(item, QUEUED)
        self.poke()
        return item

    def take(self) -> list[QueueItem]:
        """Every queued item, now ``started`` by the caller's run (which must :meth:`settle`)."""
        taken, self._queued = self._queued, []
        for item in taken:
            self._started.append(item)
            self._set(item, STARTED)
        return taken

    def take_items(self, items: Sequence[QueueItem]) -> None:
        """These items joined the conversation (the request that carried them was accepted): they
        are ``started`` by the caller's run, which must :meth:`settle`. Items no longer queued
        (cancelled meanwhile) are left alone."""
        for item in items:
            if item in self._queued:
                self._queued.remove(item)
                self._started.append(item)
                self._set(item, STARTED)

    def settle(self, controlled: bool) -> None:
        """The run that absorbed the started items ended: ``completed`` on a controlled terminal
        reason, ``cancelled`` on abort or hard failure."""
        started, self._started = self._started, []
        for item in started:
            self._set(item, COMPLETED if controlled else CANCELLED)

    def cancel(self, uuid: str) -> bool:
        """Withdraw a queued item before it is absorbed; False when it is no longer queued."""
        for item in self._queued:
            if item.uuid == uuid:
                self._queued.remove(item)
                self._set(item, CANCELLED)
                return True
        return False

    def discard(self) -> None:
        """Session teardown: what is still queued is dropped (``discarded``); an item absorbed by a
        run that never settled (the run raised past its own clean-up) is reported discarded too, so
        every uuid ends in exactly one terminal state."""
        left = [*self._started, *self._queued]
        self._started, self._queued = [], []
        for item in left:
            self._set(item, DISCARDED)
        self.poke()

    # --- waiting --------------------------------------------------------------------------------

    def poke(self) -> None:
        """Wake :meth:`wait_for_items` so it re-checks its condition."""
        if self._wake is not None:
            self._wake.set()

    async def wait_for_items(self, keep_waiting: Callable[[], bool]) -> bool:
        """Wait until something is queued (True), or until ``keep_waiting()`` turns false with the
        queue still empty (False). Whatever changes ``keep_waiting``'s answer must :meth:`poke`."""
        loop = asyncio.get_running_loop()
        if self._wake is None or self._wake_loop is not loop:
            self._wake, self._wake_loop = asyncio.Event(), loop
        while not self._queued:
            if not keep_waiting():
                return False
            self._wake.clear()
            await self._wake.wait()
        return True

    async def notifications_after_run(self, reporting: Callable[[], bool]) -> tuple[QueueItem, ...]:
        """After a run ended, wait while ``reporting()`` (background work the session started may
        still report); the task notifications queued by then start the next pass. Nothing when user
        input is queued (the session's next run takes that, with any notification beside it)."""
        await self.wait_for_items(reporting)
        pending = self.pending
        return () if any(item.kind != TASK_NOTIFICATION for item in pending) else pending
