"""The model transport interface: a request record, stream event records, one error type.

Both transports — :mod:`agentfsm.llm.transport` (the ``anthropic`` SDK) and the scripted model of
:mod:`agentfsm.testing` — yield the same :data:`StreamEvent` records, so the loop cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs

from agentfsm.machine.events import ModelError


@attrs.frozen
class ModelRequest:
    model: str
    system: tuple[Mapping[str, Any], ...]
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    max_tokens: int
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    # the API's output_config (task_budget: the token budget the model is told it has for the task)
    output_config: Mapping[str, Any] | None = None
    # the API's thinking configuration ({"type": "enabled", "budget_tokens": ...} or disabled), when asked for
    thinking: Mapping[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        """The JSON body of ``POST /v1/messages``."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": [dict(b) for b in self.system],
            "messages": [dict(m) for m in self.messages],
            "stream": True,
        }
        if self.tools:
            body["tools"] = [dict(t) for t in self.tools]
        if self.metadata:
            body["metadata"] = dict(self.metadata)
        if self.output_config:
            body["output_config"] = dict(self.output_config)
        if self.thinking:
            body["thinking"] = dict(self.thinking)
        return body


@attrs.frozen
class MessageStart:
    model: str = ""
    usage: Mapping[str, Any] = attrs.field(factory=dict)
    message_id: str = ""
    # the API's ``request-id`` response header (a refusal's result names it, as Claude Code's does)
    request_id: str = ""


@attrs.frozen
class BlockStart:
    index: int
    block: Mapping[str, Any]


@attrs.frozen
class BlockDelta:
    """``delta`` as on the wire: text_delta, input_json_delta, thinking_delta, signature_delta."""

    index: int
    delta: Mapping[str, Any]


@attrs.frozen
class BlockStop:
    index: int


@attrs.frozen
class MessageDelta:
    stop_reason: str | None = None
    usage: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class MessageStop:
    pass


StreamEvent = MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop


@attrs.frozen
class RetryNotice:
    """Not a stream event: the transport tells the loop that the request failed before its stream
    started and will be sent again after ``delay_ms`` (attempt ``attempt`` of ``max_retries``).
    The driver reports it (``system``/``api_retry``) and never hands it to the assembler."""

    attempt: int
    max_retries: int
    delay_ms: int
    status: int | None
    error: str  # overloaded | rate_limit | server_error | unknown

    @classmethod
    def of(cls, error: ModelError, attempt: int, max_retries: int, delay_s: float) -> RetryNotice:
        kind = ("overloaded" if error.kind == "overloaded" else "rate_limit" if error.status == 429
                else "server_error" if error.status is not None and error.status >= 500 else "unknown")
        return cls(attempt, max_retries, int(delay_s * 1000), error.status, kind)


class ModelCallError(Exception):
    """A failed model call (after the retries); carries the classified error. ``should_retry`` and
    ``retry_after_s`` are what the answer said about retrying (the API's ``x-should-retry`` and
    ``retry-after`` headers), when it said anything."""

    def __init__(self, error: ModelError, *, should_retry: bool | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.should_retry = should_retry
        self.retry_after_s = retry_after_s


def backoff_s(attempt: int, retry_after_s: float | None = None) -> float:
    """The wait before retry ``attempt`` (from 1): what the API asked for when it asked (up to a
    minute), else exponential from 0.5 s with up to 25% jitter, capped at 32 s (Claude Code waited
    ≈0.6 s, then ≈1.2 s, …)."""
    if retry_after_s is not None and 0 <= retry_after_s <= 60:
        return retry_after_s
    return min(0.5 * 2 ** (attempt - 1), 32.0) * (1 + random.random() * 0.25)


async def with_retries(open_stream: Callable[[], AsyncIterator[StreamEvent]], max_retries: int, *,
                       delay_s: Callable[[int, ModelCallError], float] = lambda n, e: backoff_s(n, e.retry_after_s),
                       sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                       ) -> AsyncIterator[StreamEvent | RetryNotice]:
    """Open a stream, sending the request again (up to ``max_retries`` times) while it fails before
    its first event with a retryable error — every transport retries the same way, and says so with
    a :class:`RetryNotice` before each wait. A failure after the stream started is not retried here:
    the loop requests the whole response again when its graph says so."""
    attempt = 0
    while True:
        stream = open_stream()
        try:
            first = await anext(stream)
        except StopAsyncIteration:
            return
        except ModelCallError as exc:
            await _close(stream)
            retry = exc.should_retry if exc.should_retry is not None else exc.error.retryable
            # a request the API accepted (its answer came, and broke before its first event) is never
            # sent again here: whether the loop asks again is the loop's decision
            if not retry or attempt >= max_retries or exc.error.answered:
                raise
            attempt += 1
            wait = delay_s(attempt, exc)
            yield RetryNotice.of(exc.error, attempt, max_retries, wait)
            await sleep(wait)
            continue
        yield first
        try:
            async for event in stream:
                yield event
        finally:
            await _close(stream)
        return


async def _close(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except (RuntimeError, ModelCallError):
            pass


class ModelClient(Protocol):
    """What the driver needs from a model: one streamed response per request.

    ``stream`` raises :class:`ModelCallError` for a failed call (before or during the stream) and
    returns normally after :class:`MessageStop`. Before its first event it may yield
    :class:`RetryNotice` records (see :func:`with_retries`). A client may also offer ``async
    create(request) -> list[StreamEvent]``, the same request made without streaming (see
    :func:`message_events`): the loop falls back to it after a stream that broke or came garbled
    before any content.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]: ...


async def _unstreamed(client: Any, request: ModelRequest) -> AsyncIterator[StreamEvent]:
    """The events of one request made without streaming (``client.create``), in stream form."""
    for event in await client.create(request):
        yield event


def can_unstream(client: Any) -> bool:
    """The client can make a request without streaming (``create``)."""
    return callable(getattr(client, "create", None))


class ResponseStream:
    """One request's response as the loop reads it: streamed, or (``unstreamed``) made with the
    client's ``create`` and read in stream form. :meth:`open` waits for its first event, reporting the
    transport's retries before it as they happen (``on_retry``); ``events`` then yields the rest.
    It knows how long the API has taken since the request (:meth:`elapsed_ms`) and is closed once."""

    def __init__(self, client: Any, request: ModelRequest, *, unstreamed: bool = False,
                 on_retry: Callable[[RetryNotice], None] = lambda _n: None) -> None:
        self.sent_at = time.monotonic()
        self.events: AsyncIterator[StreamEvent] = (_unstreamed(client, request) if unstreamed
                                                   else client.stream(request))
        self.first: StreamEvent | None = None  # the first event, until it is taken
        self.ttft_ms = 0.0
        self._on_retry = on_retry
        self._closed = False

    async def open(self) -> StreamEvent:
        """The first event (StopAsyncIteration: there is none; ModelCallError: the call failed)."""
        while isinstance(event := await anext(self.events), RetryNotice):
            self._on_retry(event)
        self.first = event
        self.ttft_ms = round(self.elapsed_ms(), 1)
        return event

    def take_first(self) -> StreamEvent | None:
        first, self.first = self.first, None
        return first

    def elapsed_ms(self) -> float:
        return (time.monotonic() - self.sent_at) * 1000

    async def aclose(self) -> bool:
        """Close the stream (again: nothing); False when closing it failed (it was mid-iteration)."""
        if self._closed:
            return True
        self._closed = True
        close = getattr(self.events, "aclose", None)
        if close is not None:
            try:
                await close()
            except (RuntimeError, ModelCallError):
                return False
        return True


def message_events(message: Mapping[str, Any]) -> list[StreamEvent]:
    """The events a stream of ``message`` (a whole Messages API response) would have carried."""
    events: list[StreamEvent] = [MessageStart(model=str(message.get("model", "")),
                                              usage=dict(message.get("usage") or {}),
                                              message_id=str(message.get("id", "")))]
    for i, block in enumerate(message.get("content") or ()):
        kind = block.get("type")
        if kind == "text":
            events += [BlockStart(i, {"type": "text", "text": ""}),
                       BlockDelta(i, {"type": "text_delta", "text": block.get("text", "")})]
        elif kind == "tool_use":
            start = {k: v for k, v in block.items() if k != "input"}
            events += [BlockStart(i, {**start, "input": {}}),
                       BlockDelta(i, {"type": "input_json_delta",
                                      "partial_json": json.dumps(block.get("input") or {})})]
        elif kind == "thinking":
            events += [BlockStart(i, {"type": "thinking", "thinking": ""}),
                       BlockDelta(i, {"type": "thinking_delta", "thinking": block.get("thinking", "")}),
                       BlockDelta(i, {"type": "signature_delta", "signature": block.get("signature", "")})]
        else:
            events.append(BlockStart(i, dict(block)))
        events.append(BlockStop(i))
    usage = dict(message.get("usage") or {})
    events += [MessageDelta(message.get("stop_reason"), {"output_tokens": usage.get("output_tokens", 0)}),
               MessageStop()]
    return events


PROMPT_TOO_LONG_MARKERS = ("prompt is too long", "prompt too long", "context window", "too many tokens",
                           "input length and `max_tokens` exceed context limit")


def sse_error(error_type: str, message: str) -> ModelError:
    """An SSE ``error`` event of a type other than ``overloaded_error``/``api_error`` part-way through a
    stream (shared by every transport): a ``stream_error``, which Claude Code 2.1.332 requests again when
    nothing complete was shown, and otherwise ends on (docs/conform.md) — unless its message says the
    prompt was too long or an image was refused, which are the API errors they name."""
    named = classify_error(None, error_type, message)
    if named.kind in ("prompt_too_long", "image"):
        return named
    return ModelError("stream_error", message, None, True)


def classify_error(status: int | None, error_type: str, message: str) -> ModelError:
    """Map an HTTP/API error onto the loop's error kinds (shared by every transport)."""
    low = message.lower()
    # a 413 (request_too_large) is no prompt-too-long error to compact: Claude Code 2.1.332 ends the run
    # image_error, whatever the message (docs/conform.md); the graph words the result
    if status == 413:
        return ModelError("image", message, status, False)
    if status == 400 and any(m in low for m in PROMPT_TOO_LONG_MARKERS):
        return ModelError("prompt_too_long", message, status, False)
    if status == 400 and "image" in low:
        return ModelError("image", message, status, False)
    if status == 529 or error_type == "overloaded_error":
        return ModelError("overloaded", message, status, True)
    if status is not None and (status == 429 or status >= 500 or status == 408):
        return ModelError("api", message, status, True)
    return ModelError("api", message, status, False)
