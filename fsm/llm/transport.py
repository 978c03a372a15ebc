"""The Anthropic Messages transport: ``anthropic.AsyncAnthropic`` streaming, nothing hand-rolled.

Transient failures before the stream starts (429, 5xx, 529, connection resets) are retried here, by
:func:`agentfsm.llm.model.with_retries` (``max_retries``, exponential backoff, the API's ``retry-after``
and ``x-should-retry``), which tells the loop about each retry so a dead endpoint is never silent;
the SDK's own retries are off. What still fails is classified once into a
:class:`agentfsm.machine.events.ModelError` for the graph.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import attrs

from agentfsm.common.textsafe import scrub
from agentfsm.llm.model import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    MessageStop,
    ModelCallError,
    ModelRequest,
    RetryNotice,
    StreamEvent,
    classify_error,
    message_events,
    sse_error,
    with_retries,
)
from agentfsm.machine.events import ModelError


class MissingCredentials(Exception):
    """No API key and no base URL: there is nothing to talk to."""


def _dump(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    return obj.model_dump(exclude_none=True) if hasattr(obj, "model_dump") else dict(obj)


class AnthropicTransport:
    def __init__(self, *, api_key: str | None = None, base_url: str | None = None,
                 max_retries: int = 10, timeout: float = 600.0) -> None:
        import anthropic  # imported here so `agentfsm diagram`/`audit` never pay for it

        key = api_key or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
        url = base_url or os.environ.get("ANTHROPIC_BASE_URL")
        if not key and not url:
            raise MissingCredentials(
                "no model to talk to: set ANTHROPIC_API_KEY (or ANTHROPIC_BASE_URL for a compatible "
                "endpoint), or pass --scripted SCENARIO.json to use the scripted model")
        self._anthropic = anthropic
        self.max_retries = max_retries
        self.endpoint = gateway(url)
        self.client = anthropic.AsyncAnthropic(api_key=key or "not-needed", base_url=url,
                                               max_retries=0, timeout=timeout)

    async def aclose(self) -> None:
        await self.client.close()

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent | RetryNotice]:
        return with_retries(lambda: self._once(request), self.max_retries)

    async def _once(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        a = self._anthropic
        # a lone surrogate (model output, a non-UTF-8 file name) cannot be encoded: send U+FFFD instead
        body = scrub(request.body())
        body.pop("stream")
        try:
            raw = await self.client.messages.create(**body, stream=True)
        except a.APIStatusError as exc:
            should, after = _retry_headers(exc)
            raise ModelCallError(self._at(_status_error(exc)), should_retry=should, retry_after_s=after) from exc
        except (a.APIConnectionError, a.APITimeoutError) as exc:
            raise ModelCallError(ModelError("connection", f"Connection error: {exc}", None, True)) from exc
        started = False  # an event came: failures after it are the stream's, before it the request's
        request_id = _request_id(raw)
        try:
            async for ev in raw:
                mapped = _map_event(ev)
                if isinstance(mapped, MessageStart) and request_id:
                    mapped = attrs.evolve(mapped, request_id=request_id)
                if mapped is not None:
                    started = True
                    yield mapped
        except a.APIError as exc:
            # mid-stream the SDK raises APIError for an SSE `error` event (an APIStatusError carrying
            # the 200 of the stream's response) and for a dropped connection
            error = self._at(_stream_error(a, exc))
            if not started and error.kind in ("connection", "stream_api_error"):
                error = ModelError("stream_dropped", error.message, None, True)
            raise ModelCallError(error) from exc
        except ModelCallError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # undecodable SSE data (JSONDecodeError is a ValueError) or an event missing its fields;
            # before any event it is not a stream at all (an HTML page, garbage): ask again unstreamed
            if not started:
                raise ModelCallError(ModelError("stream_garbled", f"Malformed stream from the API: {exc}",
                                                None, True)) from exc
            raise ModelCallError(ModelError("model", f"Malformed stream from the API: {exc}")) from exc
        except Exception as exc:  # httpx/httpcore read errors surface as their own types
            kind = "connection" if started else "stream_dropped"
            raise ModelCallError(ModelError(kind, f"Stream interrupted: {exc}", None, True)) from exc
        finally:
            await raw.close()

    async def create(self, request: ModelRequest) -> list[StreamEvent]:
        """The same request without streaming (after a stream that broke or came garbled before any
        content), its message given back as the events a stream of it would have carried."""
        a = self._anthropic
        body = scrub(request.body())
        body.pop("stream")
        try:
            message = await self.client.messages.create(**body)
            # the SDK builds the message without validating it: JSON that is not a message (a list, a
            # number for its content) fails only here, and is as malformed as undecodable JSON
            return message_events(_dump(message))
        except a.APIStatusError as exc:
            raise ModelCallError(self._at(_status_error(exc))) from exc
        except (a.APIConnectionError, a.APITimeoutError) as exc:
            raise ModelCallError(ModelError("connection", f"Connection error: {exc}", None, True)) from exc
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            # (RecursionError: a body nested deeper than the JSON decoder's stack, a tool input of
            # 100,000 arrays say; the streamed path bounds that in agentfsm.common.bounded_json)
            raise ModelCallError(ModelError("model", f"Malformed response from the API: {exc}")) from exc

    def _at(self, error: ModelError) -> ModelError:
        """The error with the gateway that gave it (Claude Code's text for a 5xx names it)."""
        return attrs.evolve(error, endpoint=self.endpoint) if self.endpoint else error


def gateway(base_url: str | None) -> str:
    """``host[:port]`` of a base URL other than the Anthropic API's; "" for the API itself."""
    if not base_url:
        return ""
    # the user and password a URL may carry are never shown
    host = (urllib.parse.urlsplit(base_url).netloc or base_url).rsplit("@", 1)[-1]
    return "" if host.lower() in ("api.anthropic.com", "api.anthropic.com:443") else host


def _retry_headers(exc: Any) -> tuple[bool | None, float | None]:
    """What the answer said about retrying: ``x-should-retry``, and ``retry-after-ms``/``retry-after``."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    should = {"true": True, "false": False}.get(str(headers.get("x-should-retry", "")).lower())
    after: float | None = None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            after = float(headers[name]) / scale
            break
        except (KeyError, TypeError, ValueError):
            continue
    return should, after


def _status_error(exc: Any) -> ModelError:
    body = exc.body if isinstance(getattr(exc, "body", None), dict) else {}
    err = body.get("error", {}) if isinstance(body.get("error"), dict) else {}
    message = err.get("message") or str(exc)
    return classify_error(exc.status_code, err.get("type", ""), message)


def _stream_error(a: Any, exc: Any) -> ModelError:
    """A failure after the stream started, classified as :func:`agentfsm.testing.scripted.stream_error`
    does for the in-process model: an SSE ``overloaded_error`` is an overload (as a 529), an SSE
    ``api_error`` (the server failed part-way) a retryable ``stream_api_error``, a dropped connection a
    retryable connection error — the whole response is requested again, unless a complete text was
    already shown (:func:`agentfsm.machine.graph.cut_after_text`) — and any other SSE error type is a
    ``stream_error`` (:func:`agentfsm.llm.model.sse_error`)."""
    if isinstance(exc, a.APIConnectionError):
        return ModelError("connection", f"Stream interrupted: {exc}", None, True)
    body = getattr(exc, "body", None)
    err = body.get("error", body) if isinstance(body, dict) else {}
    etype = err.get("type", "") if isinstance(err, dict) else ""
    message = (err.get("message") if isinstance(err, dict) else None) or str(exc)
    if etype == "overloaded_error":
        return ModelError("overloaded", message, 529, True)
    if etype == "api_error":
        return ModelError("stream_api_error", message, None, True)
    if etype == "":
        return ModelError("connection", message or "stream interrupted", None, True)
    return sse_error(etype, message)


def _request_id(raw: Any) -> str:
    """The stream's ``request-id`` response header ("" when the response has none)."""
    headers = getattr(getattr(raw, "response", None), "headers", None)
    return str(headers.get("request-id", "")) if headers is not None else ""


def _map_event(ev: Any) -> StreamEvent | None:
    t = ev.type
    if t == "message_start":
        return MessageStart(model=ev.message.model, usage=_dump(ev.message.usage), message_id=ev.message.id)
    if t == "content_block_start":
        return BlockStart(ev.index, _dump(ev.content_block))
    if t == "content_block_delta":
        return BlockDelta(ev.index, _dump(ev.delta))
    if t == "content_block_stop":
        return BlockStop(ev.index)
    if t == "message_delta":
        return MessageDelta(ev.delta.stop_reason, _dump(ev.usage))
    if t == "message_stop":
        return MessageStop()
    return None  # ping and future event types carry nothing the loop needs
