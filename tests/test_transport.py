"""The SDK transport on its own (agentfsm.llm.transport): where its credentials come from, the limits
it starts with, and how each failure of a request is classified for the retry policy and the graph.
The wire tests (tests/test_faults.py) reach it through whole runs; these name each case (issue 35's
full run of the module, 2026-12-06)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import attrs
import pytest

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
)
from agentfsm.llm.transport import AnthropicTransport, MissingCredentials, gateway

REQUEST = ModelRequest("claude-sonnet-4-5", (), ({"role": "user", "content": "hi"},), (), 100)
ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL")


@pytest.fixture(autouse=True)
def _no_credentials_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def _refused_url() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(("arg", "env", "expected"), [
    ("arg-key", {}, "arg-key"),
    ("arg-key", {"ANTHROPIC_API_KEY": "env-key", "ANTHROPIC_AUTH_TOKEN": "token"}, "arg-key"),
    (None, {"ANTHROPIC_API_KEY": "env-key"}, "env-key"),
    (None, {"ANTHROPIC_API_KEY": "env-key", "ANTHROPIC_AUTH_TOKEN": "token"}, "env-key"),
    (None, {"ANTHROPIC_AUTH_TOKEN": "token"}, "token"),
])
async def test_the_key_is_the_argument_then_the_api_key_then_the_auth_token(
        arg: str | None, env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    transport = AnthropicTransport(api_key=arg)
    assert transport.client.api_key == expected
    await transport.aclose()


async def test_no_key_and_no_url_is_refused_and_either_one_is_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MissingCredentials, match="ANTHROPIC_API_KEY"):
        AnthropicTransport()
    with_key = AnthropicTransport(api_key="k")
    assert with_key.client.api_key == "k" and with_key.endpoint == ""
    await with_key.aclose()
    # a compatible endpoint may need no key: the SDK is given a placeholder, never nothing
    with_url = AnthropicTransport(base_url="http://127.0.0.1:9")
    assert with_url.client.api_key == "not-needed" and with_url.endpoint == "127.0.0.1:9"
    await with_url.aclose()
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    from_env = AnthropicTransport()
    assert from_env.client.api_key == "not-needed" and str(from_env.client.base_url).startswith("http://127.0.0.1:9")
    await from_env.aclose()


async def test_the_limits_it_starts_with() -> None:
    """Claude Code's defaults: 10 retries of a request, 600 s for one; the SDK's own retries are off (the
    retry policy is agentfsm.llm.model.with_retries, which announces each retry)."""
    transport = AnthropicTransport(api_key="k")
    assert transport.max_retries == 10
    assert transport.client.max_retries == 0
    assert transport.client.timeout == 600.0
    await transport.aclose()
    transport = AnthropicTransport(api_key="k", max_retries=3, timeout=5.0)
    assert (transport.max_retries, transport.client.max_retries, transport.client.timeout) == (3, 0, 5.0)
    await transport.aclose()


async def _stream_failure(transport: AnthropicTransport) -> tuple[list[Any], ModelCallError]:
    seen: list[Any] = []
    with pytest.raises(ModelCallError) as caught:
        async for event in transport.stream(REQUEST):
            seen.append(event)
    return seen, caught.value


async def test_a_refused_connection_is_a_retryable_connection_error() -> None:
    transport = AnthropicTransport(api_key="k", base_url=_refused_url(), max_retries=1)
    seen, failure = await _stream_failure(transport)
    await transport.aclose()
    assert failure.error.kind == "connection" and failure.error.retryable
    assert failure.error.message.startswith("Connection error: ")
    assert [type(e) for e in seen] == [RetryNotice] and seen[0].attempt == 1


# --- a raw loopback server: exactly the bytes of each answer ----------------------------------------

MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
           "content": [], "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 5, "output_tokens": 1}}


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


WHOLE_STREAM = sse(
    {"type": "message_start", "message": MESSAGE},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
)


@attrs.define
class Answer:
    body: bytes
    headers: dict[str, str] = attrs.Factory(lambda: {"content-type": "text/event-stream"})
    status: int = 200
    cut_after: int | None = None  # send this many bytes of the body, then drop the connection


class RawServer:
    """Answers each request with the next :class:`Answer` (the last one again when they run out) and
    records whether each request asked for a stream."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.streamed: list[bool] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        self.streamed.append(bool(json.loads(await reader.readexactly(length)).get("stream")))
        answer = self.answers[min(len(self.streamed), len(self.answers)) - 1]
        headers = "".join(f"{k}: {v}\r\n" for k, v in answer.headers.items())
        writer.write(f"HTTP/1.1 {answer.status} X\r\n{headers}connection: close\r\n"
                     f"content-length: {len(answer.body)}\r\n\r\n".encode())
        writer.write(answer.body if answer.cut_after is None else answer.body[:answer.cut_after])
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()


async def _events(answers: list[Answer], *, max_retries: int = 0) -> tuple[list[Any], RawServer]:
    server = RawServer(answers)
    async with server as url:
        transport = AnthropicTransport(api_key="k", base_url=url, max_retries=max_retries)
        try:
            events = [e async for e in transport.stream(REQUEST)]
        finally:
            await transport.aclose()
    return events, server


async def _failure(answers: list[Answer], *, max_retries: int = 0) -> tuple[list[Any], ModelCallError, RawServer]:
    server = RawServer(answers)
    seen: list[Any] = []
    async with server as url:
        transport = AnthropicTransport(api_key="k", base_url=url, max_retries=max_retries)
        try:
            with pytest.raises(ModelCallError) as caught:
                async for event in transport.stream(REQUEST):
                    seen.append(event)
        finally:
            await transport.aclose()
    return seen, caught.value, server


async def test_a_whole_stream_reads_as_its_events() -> None:
    """Each SSE event as the loop's event, pings left out; the message's id, model and request id (the
    response's ``request-id`` header) on its start; usage as the API sent it, no field made up."""
    events, server = await _events([Answer(WHOLE_STREAM, {"content-type": "text/event-stream",
                                                          "request-id": "req_42"})])
    assert server.streamed == [True]
    assert events == [
        MessageStart(model="claude-sonnet-4-5", usage={"input_tokens": 5, "output_tokens": 1}, message_id="msg_1",
                     request_id="req_42"),
        BlockStart(0, {"type": "text", "text": ""}),
        BlockDelta(0, {"type": "text_delta", "text": "hi"}),
        BlockStop(0),
        MessageDelta("end_turn", {"output_tokens": 2}),
        MessageStop(),
    ]
    events, _ = await _events([Answer(WHOLE_STREAM)])
    assert events[0] == MessageStart(model="claude-sonnet-4-5", usage={"input_tokens": 5, "output_tokens": 1},
                                     message_id="msg_1")


@pytest.mark.parametrize("first", [
    pytest.param(None, id="dropped"),
    pytest.param({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
                 id="sse-api-error"),
])
async def test_a_stream_that_fails_before_its_first_event_is_not_sent_again_here(first: Any) -> None:
    """The API accepted the request and its answer broke before any event (the connection dropped, or an
    SSE ``api_error``): it is ``stream_dropped``, which the graph asks again without streaming; the
    transport's retries never send it again, whatever is left of them."""
    body = sse(first) if first else WHOLE_STREAM
    seen, failure, server = await _failure([Answer(body, cut_after=None if first else 10)], max_retries=3)
    assert failure.error.kind == "stream_dropped" and failure.error.retryable and failure.error.answered
    assert seen == [] and server.streamed == [True]


async def test_usage_a_gateway_sends_as_null_reads_as_none_reported() -> None:
    body = WHOLE_STREAM.replace(b'"usage": {"output_tokens": 2}', b'"usage": null')
    assert body != WHOLE_STREAM
    events, _ = await _events([Answer(body)])
    assert events[-2] == MessageDelta("end_turn", {})


# deeper than the JSON decoder's stack: a read that fails with neither the API's nor the connection's error
DEEP = "[" * 100_000 + "]" * 100_000
START = sse({"type": "message_start", "message": MESSAGE})


@pytest.mark.parametrize(("after_start", "bad", "kind", "retryable"), [
    (False, b"event: message_start\ndata: {not json\n\n", "stream_garbled", True),
    (True, b"event: content_block_start\ndata: {not json\n\n", "model", False),
    (False, f'event: message_start\ndata: {{"type": "message_start", "x": {DEEP}}}\n\n'.encode(),
     "stream_dropped", True),
    (True, f'event: content_block_start\ndata: {{"type": "content_block_start", "x": {DEEP}}}\n\n'.encode(),
     "connection", True),
], ids=["garbled-first", "garbled-after-start", "unreadable-first", "unreadable-after-start"])
async def test_a_stream_that_cannot_be_read(after_start: bool, bad: bytes, kind: str, retryable: bool) -> None:
    """Before its first event a stream that cannot be read is not a stream (an HTML page, garbage): asked
    again unstreamed by the graph (``stream_garbled``/``stream_dropped``, never sent again here). After
    one, undecodable data is the model's failure (not retried) and a read that fails otherwise is a
    broken connection (the whole response is requested again)."""
    seen, failure, server = await _failure([Answer((START if after_start else b"") + bad)], max_retries=3)
    assert (failure.error.kind, failure.error.retryable) == (kind, retryable)
    assert server.streamed == [True]
    assert [type(e) for e in seen] == ([MessageStart] if after_start else [])


def _error_body(status: int, etype: str, message: str) -> Answer:
    return Answer(json.dumps({"type": "error", "error": {"type": etype, "message": message}}).encode(),
                  {"content-type": "application/json", "x-should-retry": "false"}, status=status)


async def test_the_unstreamed_request_reads_a_whole_message_as_the_events_of_its_stream() -> None:
    whole = {**MESSAGE, "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    server = RawServer([Answer(json.dumps(whole).encode(), {"content-type": "application/json"})])
    async with server as url:
        transport = AnthropicTransport(api_key="k", base_url=url, max_retries=0)
        events = await transport.create(REQUEST)
        await transport.aclose()
    assert server.streamed == [False]
    assert [type(e) for e in events] == [MessageStart, BlockStart, BlockDelta, BlockStop, MessageDelta, MessageStop]
    assert events[4].stop_reason == "end_turn"


@pytest.mark.parametrize(("answer", "kind", "retryable", "says"), [
    (_error_body(400, "invalid_request_error", "bad field"), "api", False, "bad field"),
    (_error_body(529, "overloaded_error", "Overloaded"), "overloaded", True, "Overloaded"),
    (Answer(b"<html>not json</html>", {"content-type": "application/json"}), "model", False,
     "Malformed response from the API"),
    (Answer(f'{{"id": "m", "x": {DEEP}}}'.encode(), {"content-type": "application/json"}), "model", False,
     "Malformed response from the API"),
], ids=["400", "529", "garbage", "nested-too-deeply"])
async def test_the_unstreamed_requests_failures(answer: Answer, kind: str, retryable: bool, says: str) -> None:
    server = RawServer([answer])
    async with server as url:
        transport = AnthropicTransport(api_key="k", base_url=url, max_retries=0)
        with pytest.raises(ModelCallError) as caught:
            await transport.create(REQUEST)
        await transport.aclose()
    assert server.streamed == [False]
    assert caught.value.error.kind == kind and caught.value.error.retryable is retryable
    assert says in caught.value.error.message


async def test_the_unstreamed_request_refused_is_a_retryable_connection_error() -> None:
    transport = AnthropicTransport(api_key="k", base_url=_refused_url(), max_retries=0)
    with pytest.raises(ModelCallError) as caught:
        await transport.create(REQUEST)
    await transport.aclose()
    assert caught.value.error.kind == "connection" and caught.value.error.retryable
    assert caught.value.error.message.startswith("Connection error: ")


# --- the gateway named in errors, and what an answer says about retrying ----------------------------


@pytest.mark.parametrize(("base_url", "named"), [
    (None, ""),
    ("", ""),
    ("https://api.anthropic.com", ""),
    ("https://API.Anthropic.com:443/v1", ""),
    ("https://api.anthropic.com:8443", "api.anthropic.com:8443"),
    ("http://127.0.0.1:8080/v1", "127.0.0.1:8080"),
    ("http://user:secret@gateway.example:8080", "gateway.example:8080"),
    ("http://user:p@ss@gateway.example", "gateway.example"),
    ("gateway.example:8080", "gateway.example:8080"),
])
def test_the_gateway_an_error_names(base_url: str | None, named: str) -> None:
    """``host[:port]`` of a base URL other than the Anthropic API's, never its user or password."""
    assert gateway(base_url) == named


def _refusal(status: int, headers: dict[str, str]) -> Answer:
    return Answer(json.dumps({"type": "error", "error": {"type": "x", "message": "no"}}).encode(),
                  {"content-type": "application/json", **headers}, status=status)


@pytest.mark.parametrize(("headers", "delay_ms"), [
    ({"retry-after-ms": "999", "retry-after": "5"}, 999),  # the milliseconds win over the seconds
    ({"retry-after": "0.02"}, 20),
    ({"retry-after-ms": "soon", "retry-after": "0.02"}, 20),  # an unreadable one is passed over
])
async def test_the_wait_an_answer_asks_for_is_the_wait_announced(headers: dict[str, str], delay_ms: int) -> None:
    events, server = await _events([_refusal(429, headers), Answer(WHOLE_STREAM)], max_retries=1)
    assert isinstance(events[0], RetryNotice) and events[0].delay_ms == delay_ms
    assert server.streamed == [True, True]


@pytest.mark.parametrize(("status", "should_retry", "retried"), [
    (400, "true", True), (400, "TRUE", True), (400, None, False),
    (529, "false", False), (529, None, True), (529, "maybe", True),
])
async def test_the_answers_own_word_on_retrying(status: int, should_retry: str | None, retried: bool) -> None:
    headers = {"retry-after-ms": "1"} | ({"x-should-retry": should_retry} if should_retry else {})
    answers = [_refusal(status, headers), Answer(WHOLE_STREAM)]
    if retried:
        events, server = await _events(answers, max_retries=1)
        assert isinstance(events[0], RetryNotice) and isinstance(events[-1], MessageStop)
        assert server.streamed == [True, True]
    else:
        seen, failure, server = await _failure(answers, max_retries=1)
        assert seen == [] and server.streamed == [True] and failure.error.status == status


@pytest.mark.parametrize(("error", "kind", "retryable", "message"), [
    ({"message": "gateway gave up"}, "connection", True, "gateway gave up"),  # no type: a broken connection
    ({"type": "overloaded_error", "message": "Overloaded"}, "overloaded", True, "Overloaded"),
    ({"type": "api_error", "message": "Internal"}, "stream_api_error", True, "Internal"),
    ({"type": "invalid_request_error", "message": "bad"}, "stream_error", True, "bad"),
], ids=["untyped", "overloaded", "api_error", "other"])
async def test_an_sse_error_event_after_the_start(error: dict[str, str], kind: str, retryable: bool,
                                                  message: str) -> None:
    body = START + sse({"type": "error", "error": error})
    seen, failure, _ = await _failure([Answer(body)])
    assert [type(e) for e in seen] == [MessageStart]
    assert (failure.error.kind, failure.error.retryable) == (kind, retryable)
    assert message in failure.error.message


# --- a response the SDK reads but whose shape is wrong ----------------------------------------------


@pytest.mark.parametrize("after_start", [False, True], ids=["first", "after-start"])
@pytest.mark.parametrize("event", [
    {"type": "message_start"},  # no message: read as None, whose fields are missing
    {"type": "message_start", "message": [1]},
    {"type": "content_block_delta", "index": 0, "delta": 5},  # a delta that is not an object
    {"type": "message_delta", "delta": None, "usage": {}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": "ab"},
], ids=["no-message", "message-list", "delta-number", "delta-null", "usage-string"])
async def test_an_event_missing_its_fields_or_of_the_wrong_shape(event: dict[str, Any], after_start: bool) -> None:
    """Like undecodable data: before the first event not a stream (asked again unstreamed), after it
    the model's failure; never an exception of the SDK's or Python's own through the loop."""
    seen, failure, _ = await _failure([Answer((START if after_start else b"") + sse(event))], max_retries=3)
    expected = ("model", False) if after_start else ("stream_garbled", True)
    assert (failure.error.kind, failure.error.retryable) == expected
    assert failure.error.message.startswith("Malformed stream from the API: ")
    assert [type(e) for e in seen] == ([MessageStart] if after_start else [])


@pytest.mark.parametrize("body", [
    b"[1, 2]", b'"a string"', json.dumps({**MESSAGE, "content": 5}).encode(),
    json.dumps({**MESSAGE, "usage": 5}).encode(), json.dumps({**MESSAGE, "content": [7]}).encode(),
], ids=["list", "string", "content-number", "usage-number", "block-number"])
async def test_an_unstreamed_answer_of_the_wrong_shape_is_a_malformed_response(body: bytes) -> None:
    """Valid JSON that is not a message: the model's failure, worded as a malformed response, never an
    exception of the SDK's or Python's own through the loop."""
    server = RawServer([Answer(body, {"content-type": "application/json"})])
    async with server as url:
        transport = AnthropicTransport(api_key="k", base_url=url, max_retries=0)
        with pytest.raises(ModelCallError) as caught:
            await transport.create(REQUEST)
        await transport.aclose()
    assert caught.value.error.kind == "model" and not caught.value.error.retryable
    assert caught.value.error.message.startswith("Malformed response from the API: ")
