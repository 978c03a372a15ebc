"""The model transport interface: a request record, stream event records, one error type.

Both transports — :mod:`agentfsm.transport` (the ``anthropic`` SDK) and the scripted model of
:mod:`agentfsm.testing` — yield the same :data:`StreamEvent` records, so the loop cannot tell them apart.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import attrs

from agentfsm.events import ModelError


@attrs.frozen
class ModelRequest:
    model: str
    system: tuple[Mapping[str, Any], ...]
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    max_tokens: int
    metadata: Mapping[str, Any] = attrs.field(factory=dict)

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
        return body


@attrs.frozen
class MessageStart:
    model: str = ""
    usage: Mapping[str, Any] = attrs.field(factory=dict)
    message_id: str = ""


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


class ModelCallError(Exception):
    """A model call that failed after the transport's own retries; carries the classified error."""

    def __init__(self, error: ModelError) -> None:
        super().__init__(error.message)
        self.error = error


class ModelClient(Protocol):
    """What the driver needs from a model: one streamed response per request.

    ``stream`` raises :class:`ModelCallError` for a failed call (before or during the stream) and
    returns normally after :class:`MessageStop`. A client may also offer ``async create(request) ->
    list[StreamEvent]``, the same request made without streaming (see :func:`message_events`): the
    loop falls back to it after a stream that broke or came garbled before any content.
    """

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]: ...


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


def classify_error(status: int | None, error_type: str, message: str) -> ModelError:
    """Map an HTTP/API error onto the loop's error kinds (shared by every transport)."""
    low = message.lower()
    if status in (400, 413) and any(m in low for m in PROMPT_TOO_LONG_MARKERS):
        return ModelError("prompt_too_long", message, status, False)
    if status == 400 and "image" in low:
        return ModelError("image", message, status, False)
    if status == 529 or error_type == "overloaded_error":
        return ModelError("overloaded", message, status, True)
    if status is not None and (status == 429 or status >= 500 or status == 408):
        return ModelError("api", message, status, True)
    return ModelError("api", message, status, False)
