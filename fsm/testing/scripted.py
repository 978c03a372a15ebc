"""The scripted model in-process: a :class:`agentfsm.llm.model.ModelClient` that answers from a scenario.

It yields exactly the records the SDK transport would assemble from :class:`ScriptedServer`'s SSE
(both come from :func:`agentfsm.testing.scenario.response_events`), so a loop test on the in-process
model says something about the loop on the wire too.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.llm.model import (
    ModelCallError,
    ModelRequest,
    RetryNotice,
    StreamEvent,
    classify_error,
    sse_error,
    with_retries,
)
from agentfsm.machine.events import ModelError
from agentfsm.testing.scenario import (
    HttpErrorResponse,
    Response,
    Scenario,
    StreamedResponse,
    WireEvent,
    load_scenario,
    parse_response,
    response_events,
)

ResponseFactory = Callable[[ModelRequest, int], "Response | Mapping[str, Any]"]
ScriptSource = Scenario | Sequence["Response | Mapping[str, Any]"] | ResponseFactory


class ResponseSource:
    """Hands out ``(n, R[n])`` per request; the index counts globally, or per session key.

    Thread-safe: the server runs in its own thread while tests read ``requests`` from theirs, and a
    loop may issue concurrent calls (subagents) through one model.
    """

    def __init__(self, source: ScriptSource, *, ws: str | os.PathLike[str] | None = None) -> None:
        self._factory: ResponseFactory | None = None
        self.scenario: Scenario | None = None
        if isinstance(source, Scenario):
            self.scenario = load_scenario(source, ws) if ws is not None else source
        elif callable(source):
            self._factory = source
        elif isinstance(source, Sequence) and not isinstance(source, str | bytes):
            self.scenario = load_scenario(list(source), ws)
        else:
            raise TypeError(
                f"expected a Scenario, a list of responses or a callable, got {type(source).__name__}"
            )
        self._lock = threading.Lock()
        self._counts: dict[Hashable, int] = {}
        self._serial = 0

    def take(self, request: ModelRequest, key: Hashable = None) -> tuple[int, int, Response]:
        """``(n, serial, response)``: the per-key index, the global arrival number, the answer."""
        with self._lock:
            n = self._counts.get(key, 0)
            self._counts[key] = n + 1
            serial = self._serial
            self._serial += 1
        if self._factory is not None:
            return n, serial, parse_response(self._factory(request, n), f"factory response {n}")
        assert self.scenario is not None
        return n, serial, self.scenario.response_for(n)

    @property
    def count(self) -> int:
        with self._lock:
            return self._serial


def session_key(metadata: Mapping[str, Any] | None) -> Hashable:
    """The per-session counting key: ``metadata.user_id`` (None when absent)."""
    if not metadata:
        return None
    user_id = metadata.get("user_id")
    return user_id if isinstance(user_id, Hashable) else json.dumps(user_id, sort_keys=True)


def estimate_input_tokens(body: Mapping[str, Any]) -> int:
    """The scripted servers' token count: a quarter of the JSON body's length."""
    return len(json.dumps(body, separators=(",", ":"))) // 4


def stream_error(resp: StreamedResponse) -> ModelError:
    """What the SDK transport makes of a cut stream (kept in step with :mod:`agentfsm.llm.transport`): an SSE
    ``overloaded_error`` is an overload (as a 529), an SSE ``api_error`` a retryable ``stream_api_error``,
    a dropped connection a retryable ``connection`` error, any other SSE error a ``stream_error``."""
    if resp.fault is not None:
        if resp.fault == "drop":
            return ModelError("stream_dropped", "Stream interrupted: the connection closed before the first event",
                              None, True)
        return ModelError("stream_garbled", f"Malformed stream from the API: a {resp.fault} body", None, True)
    if resp.sse_error is not None:
        etype, message = resp.sse_error.type, resp.sse_error.message
        if etype == "api_error":
            return ModelError("stream_api_error", message, None, True)
        if etype == "overloaded_error":
            return classify_error(529, etype, message)
        return sse_error(etype, message)
    return ModelError("connection", "stream ended before message_stop (connection closed)", None, True)


class ScriptedModel:
    """A :class:`agentfsm.llm.model.ModelClient` answering the Nth ``stream`` call with the scenario's R[N].

    ``source``: a :class:`Scenario`, a list of responses (records or their JSON dicts), or a callable
    ``(request, n) -> response`` for property tests. ``ws`` replaces ``$WS`` in a scenario or list.
    ``model`` overrides the model name reported in ``message_start`` (default: the request's).
    ``per_session`` counts per ``metadata.user_id``. ``max_retries`` mimics the SDK transport: an HTTP
    error the SDK would retry consumes the next response instead of failing, up to that many times.
    ``time_scale`` multiplies every scripted delay (0 runs a timed scenario instantly).
    ``keep_requests=False`` does not keep the requests (:attr:`requests` stays empty): for long runs,
    where keeping every request would hold every version of the history.
    """

    def __init__(
        self,
        source: ScriptSource,
        *,
        ws: str | os.PathLike[str] | None = None,
        model: str | None = None,
        per_session: bool = False,
        max_retries: int = 0,
        time_scale: float = 1.0,
        keep_requests: bool = True,
    ) -> None:
        self.keep_requests = keep_requests
        self._source = ResponseSource(source, ws=ws)
        self.model = model
        self.per_session = per_session
        self.max_retries = max_retries
        self.time_scale = time_scale
        self._lock = threading.Lock()
        self._requests: list[ModelRequest] = []

    @property
    def scenario(self) -> Scenario | None:
        return self._source.scenario

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request received, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The requests as ``POST /v1/messages`` bodies, ready for :func:`canonical_requests`."""
        return [r.body() for r in self.requests]

    @property
    def count(self) -> int:
        return self._source.count

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.time_scale > 0:
            await asyncio.sleep(seconds * self.time_scale)

    def events_for(self, request: ModelRequest) -> tuple[Response, list[WireEvent]]:
        """Take the next response for ``request`` (recording it) and the events it streams."""
        serial, resp = self._take(request)
        if isinstance(resp, HttpErrorResponse):
            return resp, []
        return resp, self._events(resp, request, serial)

    def _take(self, request: ModelRequest) -> tuple[int, Response]:
        if self.keep_requests:
            with self._lock:
                self._requests.append(request)
        key = session_key(request.metadata) if self.per_session else None
        _, serial, resp = self._source.take(request, key)
        return serial, resp

    def _events(self, resp: StreamedResponse, request: ModelRequest, serial: int) -> list[WireEvent]:
        # the estimate serialises the whole request: only when the script does not give the count
        given = (resp.usage or {}).get("input_tokens")
        return response_events(
            resp,
            self.model or request.model,
            input_tokens=given if given is not None else estimate_input_tokens(request.body()),
            message_id=f"msg_scripted_{serial:06d}",
        )

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent | RetryNotice]:
        # the transports' retry rule (agentfsm.llm.model.with_retries); a scripted wait is the answer's
        # retry_after_s (none: at once), so a scenario runs as fast as it was written
        return with_retries(lambda: self._once(request), self.max_retries,
                            delay_s=lambda _n, exc: exc.retry_after_s or 0.0, sleep=self._sleep)

    async def _once(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        resp, events = self.events_for(request)
        await self._sleep(resp.delay_s)
        if isinstance(resp, HttpErrorResponse):
            raise ModelCallError(classify_error(resp.status, resp.error_type, resp.message),
                                 should_retry=resp.sdk_retries, retry_after_s=resp.retry_after_s)
        if isinstance(resp, StreamedResponse) and resp.fault is not None:
            raise ModelCallError(stream_error(resp))  # before the first event
        for event in events:
            if event.record is not None:
                yield event.record
            await self._sleep(event.pause_s)
        if not resp.complete:
            raise ModelCallError(stream_error(resp))

    async def create(self, request: ModelRequest) -> list[StreamEvent]:
        """The next response answered without streaming (as the server answers ``stream: false``):
        a stream fault does not apply; a cut one closes the connection, an SSE error is an HTTP error."""
        attempts = 0
        while True:
            serial, resp = self._take(request)
            await self._sleep(resp.delay_s)
            if isinstance(resp, HttpErrorResponse):
                if resp.sdk_retries and attempts < self.max_retries:
                    attempts += 1
                    continue
                raise ModelCallError(classify_error(resp.status, resp.error_type, resp.message))
            break
        if resp.sse_error is not None:
            raise ModelCallError(stream_error(attrs.evolve(resp, break_after=None, fault=None)))
        if resp.breaks:
            raise ModelCallError(ModelError("connection", "Connection error: closed without an answer", None, True))
        events = self._events(attrs.evolve(resp, fault=None), request, serial)
        return [e.record for e in events if e.record is not None]
