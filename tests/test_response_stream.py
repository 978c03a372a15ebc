"""One request's response as the loop reads it (``llm.model.ResponseStream``): the transport's retries
before the first event are reported and never handed on; the first event is kept to be read once;
a client without ``create`` cannot be asked unstreamed; closing happens once and says when it failed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentfsm.llm.model import (
    MessageStart,
    MessageStop,
    ModelCallError,
    ModelRequest,
    ResponseStream,
    RetryNotice,
    StreamEvent,
    can_unstream,
)
from agentfsm.machine.events import ModelError

REQUEST = ModelRequest(model="m", system=(), messages=(), tools=(), max_tokens=10)
START = MessageStart(message_id="msg_1", model="m", usage={})
STOP = MessageStop()
RETRY = RetryNotice(attempt=1, max_retries=3, delay_ms=5, status=529, error="overloaded")


class Client:
    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.closed = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        try:
            for ev in self.events:
                yield ev
        finally:
            self.closed += 1


class Unstreamed(Client):
    async def create(self, request: ModelRequest) -> list[StreamEvent]:
        return [START, STOP]

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        raise AssertionError("asked to stream")


async def test_retries_are_reported_and_the_first_event_is_read_once() -> None:
    retries: list[RetryNotice] = []
    client = Client([RETRY, RETRY, START, STOP])
    stream = ResponseStream(client, REQUEST, on_retry=retries.append)
    assert await stream.open() == START
    assert retries == [RETRY, RETRY] and stream.ttft_ms >= 0 and stream.elapsed_ms() >= stream.ttft_ms
    assert stream.take_first() == START and stream.take_first() is None
    assert [ev async for ev in stream.events] == [STOP]
    assert await stream.aclose() and await stream.aclose()


async def test_a_stream_without_events_or_with_a_failure_raises_at_open() -> None:
    with pytest.raises(StopAsyncIteration):
        await ResponseStream(Client([RETRY]), REQUEST).open()

    class Failing(Client):
        async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
            raise ModelCallError(ModelError("api", "boom", 500))
            yield START  # pragma: no cover

    with pytest.raises(ModelCallError):
        await ResponseStream(Failing([]), REQUEST).open()


async def test_unstreamed_asks_create_and_reads_its_events_as_a_stream() -> None:
    client = Unstreamed([])
    assert can_unstream(client) and not can_unstream(Client([]))
    stream = ResponseStream(client, REQUEST, unstreamed=True)
    assert await stream.open() == START
    assert [ev async for ev in stream.events] == [STOP]


async def test_closing_a_started_stream_closes_it_once() -> None:
    client = Client([START, STOP])
    stream = ResponseStream(client, REQUEST)
    await stream.open()
    assert await stream.aclose() and client.closed == 1
    assert await stream.aclose() and client.closed == 1


async def test_a_close_that_fails_is_reported() -> None:
    class Stubborn:
        def __aiter__(self) -> Stubborn:
            return self

        async def __anext__(self) -> StreamEvent:
            return START

        async def aclose(self) -> None:
            raise RuntimeError("aclose(): asynchronous generator is already running")

    class StubbornClient:
        def stream(self, request: ModelRequest) -> Stubborn:
            return Stubborn()

    stream = ResponseStream(StubbornClient(), REQUEST)
    assert await stream.open() == START
    assert await stream.aclose() is False
    assert await stream.aclose() is True  # closed once: not tried again
