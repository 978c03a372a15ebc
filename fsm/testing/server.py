"""The scripted model as a real HTTP/1.1 Messages server on loopback, speaking the API's SSE.

HTTP/1.1 is h11's (request parsing, chunked bodies, keep-alive, response framing): a maintained,
sans-I/O protocol library that the ``anthropic`` SDK's own HTTP stack already installs, so the kit adds
no dependency. Sockets are ``asyncio.start_server``'s. Being sans-I/O, h11 leaves every byte's timing
to us, which a scripted server needs and a framework would hide: each SSE event is flushed on its own
(a scripted pause is a pause on the wire), and a scripted break closes the socket before the
terminating chunk, an error the client cannot mistake for a normal end. The real ``anthropic`` SDK
(and Claude Code itself) can be pointed at it with ``ANTHROPIC_BASE_URL``; complete responses keep
the connection alive for the next request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http
import json
import os
import signal
import sys
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import IO, Any

import attrs
import h11

from agentfsm.llm.model import ModelRequest
from agentfsm.testing.scenario import (
    HttpErrorResponse,
    Scenario,
    ScenarioError,
    StreamedResponse,
    final_message,
    load_scenario,
    response_events,
    scenario_path,
)
from agentfsm.testing.scripted import ResponseSource, ScriptSource, estimate_input_tokens, session_key

# the largest request head h11 buffers before it answers 431
_MAX_HEADER_BYTES = 1 << 20
# SSE error types mapped to the status a non-streamed request would have had.
_ERROR_STATUS = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429, "timeout_error": 504}


@attrs.frozen
class _HttpRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    keep_alive: bool


def request_from_body(body: Mapping[str, Any]) -> ModelRequest:
    """A :class:`ModelRequest` rebuilt from a JSON body, for response factories behind the server."""
    system = body.get("system") or ()
    if isinstance(system, str):
        system = ({"type": "text", "text": system},)
    metadata = body.get("metadata")
    max_tokens = body.get("max_tokens")
    return ModelRequest(
        model=str(body.get("model", "")),
        system=tuple(b for b in system if isinstance(b, Mapping)),
        messages=tuple(m for m in body.get("messages") or () if isinstance(m, Mapping)),
        tools=tuple(t for t in body.get("tools") or () if isinstance(t, Mapping)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else 0,
        metadata=dict(metadata) if isinstance(metadata, Mapping) else {},
    )


def _reason(status: int) -> str:
    if status == 529:
        return "Overloaded"
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


class ScriptedServer:
    """A loopback Messages server answering the Nth ``POST /v1/messages`` with the scenario's R[N].

    ``scenario``: a path, a :class:`Scenario`, a list of responses or a ``(request, n)`` callable;
    ``ws`` replaces ``$WS``. ``per_session`` counts per ``metadata.user_id`` so concurrent sessions
    each run the whole scenario. ``log`` (a path or a text file) receives every Messages request
    body as a JSON line. ``time_scale`` multiplies every scripted delay.

    Run it in a background thread (``start()`` / ``stop()`` or ``with``) or on the running loop
    (``await start_async()`` / ``await stop_async()`` or ``async with``).
    """

    def __init__(
        self,
        scenario: ScriptSource | str | os.PathLike[str],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        ws: str | os.PathLike[str] | None = None,
        per_session: bool = False,
        log: str | os.PathLike[str] | IO[str] | None = None,
        model: str | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if isinstance(scenario, str | os.PathLike):
            scenario = load_scenario(scenario, ws)
            ws = None
        self._source = ResponseSource(scenario, ws=ws)
        self.host = host
        self.port = port
        self.per_session = per_session
        self.model = model
        self.time_scale = time_scale
        self._log_target = log
        self._log: IO[str] | None = None
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._by_session: dict[Hashable, list[dict[str, Any]]] = {}
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections = 0  # accepted so far: tells a test whether keep-alive reused them

    # --- recorded requests ---------------------------------------------------------------------

    @property
    def scenario(self) -> Scenario | None:
        return self._source.scenario

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every ``POST /v1/messages`` body received, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, user_id: Hashable) -> list[dict[str, Any]]:
        """The bodies of one session (its ``metadata.user_id``), in arrival order."""
        with self._lock:
            return list(self._by_session.get(user_id, ()))

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the scripted server is not running")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # --- lifecycle -----------------------------------------------------------------------------

    async def start_async(self) -> str:
        """Listen on the running loop; returns the base URL (``http://127.0.0.1:PORT``)."""
        if self._server is not None:
            raise RuntimeError("the scripted server is already running")
        # A large backlog: a thousand sessions may connect in the same instant.
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=4096
        )
        if self._log_target is not None and self._log is None:
            self._log = (
                open(self._log_target, "w", encoding="utf-8")
                if isinstance(self._log_target, str | os.PathLike)
                else self._log_target
            )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.base_url

    async def stop_async(self) -> None:
        """Stop listening and end every open connection (idempotent)."""
        server = self._server
        if server is None:
            return
        self._server = None
        server.close()
        # Python 3.11's Server.close leaves accepted connections open; end them ourselves. A
        # connection accepted just before the close registers its handler one loop step later.
        await asyncio.sleep(0)
        while self._handlers:
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await asyncio.sleep(0)
        await server.wait_closed()
        if self._log is not None and isinstance(self._log_target, str | os.PathLike):
            self._log.close()
        self._log = None

    async def serve(self, stop: asyncio.Event) -> None:
        """Serve on the running loop until ``stop`` is set."""
        if self._server is None:
            await self.start_async()
        try:
            await stop.wait()
        finally:
            await self.stop_async()

    def start(self) -> str:
        """Serve from a background thread with its own event loop; returns the base URL."""
        if self._thread is not None:
            raise RuntimeError("the scripted server is already running")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                try:
                    loop.run_until_complete(self.start_async())
                except BaseException as e:  # handed to the caller of start()
                    failure.append(e)
                    return
                finally:
                    ready.set()
                loop.run_forever()
                loop.run_until_complete(self.stop_async())
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"scripted-server-{id(self):x}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self.base_url

    def stop(self) -> None:
        """Stop a server started with :meth:`start` (idempotent)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        self._thread = None
        self._loop = None

    def __enter__(self) -> ScriptedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> ScriptedServer:
        await self.start_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_async()

    # --- HTTP ----------------------------------------------------------------------------------

    async def _sleep(self, seconds: float) -> None:
        if seconds > 0 and self.time_scale > 0:
            await asyncio.sleep(seconds * self.time_scale)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADER_BYTES)
        out = _Wire(conn, writer)
        try:
            while True:
                try:
                    req = await self._read_request(conn, reader)
                except h11.RemoteProtocolError as e:
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await out.json(e.error_status_hint, _error_body("invalid_request_error", str(e)), False)
                    return
                if req is None or not await self._dispatch(req, out):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return  # a request body left unread, or a response that ended the connection
                conn.start_next_cycle()
        except (ConnectionError, h11.LocalProtocolError):
            return  # the client went away (or left mid-answer); nothing to answer
        except asyncio.CancelledError:
            return  # the server is stopping
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> _HttpRequest | None:
        """The next whole request, or None when the client closed an idle connection."""
        head: h11.Request | None = None
        body: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(1 << 16))  # b"" at the end of the stream
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
                tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
                # h11 speaks keep-alive to HTTP/1.1 clients only; an HTTP/1.0 answer ends the connection
                keep_alive = head.http_version == b"1.1" and "close" not in tokens
                target = head.target.decode("latin-1").split("?", 1)[0]
                return _HttpRequest(head.method.decode("latin-1").upper(), target, headers, b"".join(body),
                                    keep_alive)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _dispatch(self, req: _HttpRequest, out: _Wire) -> bool:
        """Answer one request; returns whether the connection stays usable."""
        path = req.path.rstrip("/")
        if req.method == "POST" and path == "/v1/messages":
            return await self._messages(req, out)
        if req.method == "POST" and path == "/v1/messages/count_tokens":
            body = self._json_body(req)
            if body is None:
                return await self._bad_json(out, req.keep_alive)
            return await out.json(
                200, {"input_tokens": estimate_input_tokens(body)}, req.keep_alive
            )
        return await out.json(
            404,
            _error_body("not_found_error", f"{req.method} {req.path}: no such endpoint"),
            req.keep_alive,
        )

    @staticmethod
    def _json_body(req: _HttpRequest) -> dict[str, Any] | None:
        try:
            body = json.loads(req.body)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    async def _bad_json(self, out: _Wire, keep_alive: bool) -> bool:
        return await out.json(
            400, _error_body("invalid_request_error", "request body is not a JSON object"), keep_alive
        )

    def _record(self, body: dict[str, Any], key: Hashable) -> None:
        with self._lock:
            self._requests.append(body)
            self._by_session.setdefault(key, []).append(body)
            if self._log is not None:
                self._log.write(json.dumps(body, ensure_ascii=False) + "\n")
                self._log.flush()

    async def _messages(self, req: _HttpRequest, out: _Wire) -> bool:
        body = self._json_body(req)
        if body is None:
            return await self._bad_json(out, req.keep_alive)
        key = session_key(body.get("metadata")) if isinstance(body.get("metadata"), Mapping) else None
        self._record(body, key)
        request = request_from_body(body)
        _, serial, resp = self._source.take(request, key if self.per_session else None)
        await self._sleep(resp.delay_s)
        request_id = f"req_scripted_{serial:06d}"
        if isinstance(resp, HttpErrorResponse):
            headers = {"request-id": request_id}
            if resp.should_retry is not None:
                headers["x-should-retry"] = "true" if resp.should_retry else "false"
            if resp.retry_after_s is not None:
                headers["retry-after-ms"] = f"{resp.retry_after_s * 1000:g}"
            return await out.json(
                resp.status, _error_body(resp.error_type, resp.message), req.keep_alive, headers
            )
        model = self.model or request.model
        tokens = estimate_input_tokens(body)
        message_id = f"msg_scripted_{serial:06d}"
        if body.get("stream") is True:
            return await self._stream(out, resp, model, tokens, message_id, request_id, req.keep_alive)
        if resp.sse_error is not None:
            status = _ERROR_STATUS.get(resp.sse_error.type, 500)
            return await out.json(
                status,
                _error_body(resp.sse_error.type, resp.sse_error.message),
                req.keep_alive,
                {"request-id": request_id},
            )
        if resp.breaks:
            return False  # closed without an answer, the non-streamed form of a broken stream
        message = final_message(resp, model, input_tokens=tokens, message_id=message_id)
        return await out.json(200, message, req.keep_alive, {"request-id": request_id})

    async def _stream(
        self,
        out: _Wire,
        resp: StreamedResponse,
        model: str,
        input_tokens: int,
        message_id: str,
        request_id: str,
        keep_alive: bool,
    ) -> bool:
        head = [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache"),
                ("request-id", request_id), ("connection", "keep-alive" if keep_alive else "close")]
        if resp.fault is not None:
            return await self._fault(out, resp.fault, head)
        # no content-length: h11 frames the body as chunks, one per event
        await out.send(h11.Response(status_code=200, headers=head))
        for event in response_events(resp, model, input_tokens=input_tokens, message_id=message_id):
            # Flush each event on its own so a scripted pause is a pause on the wire, too.
            await out.send(h11.Data(data=event.sse()))
            await self._sleep(event.pause_s)
        if resp.breaks:
            return False  # the caller closes the socket before the terminating chunk
        await out.send(h11.EndOfMessage())
        return keep_alive

    @staticmethod
    async def _fault(out: _Wire, fault: str, head: list[tuple[str, str]]) -> bool:
        """A stream that fails before its first event (see ``StreamedResponse.fault``)."""
        if fault == "html":
            page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            await out.send(h11.Response(status_code=200, headers=[
                ("content-type", "text/html"), ("content-length", str(len(page))), ("connection", "close")]),
                h11.Data(data=page), h11.EndOfMessage())
            return False
        await out.send(h11.Response(status_code=200, headers=head))
        frames = {"drop": b"",
                  "invalid_json": b"event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\n\n",
                  "garbage": b"\x00\x01garbage that is not server-sent events\xff\n\n"}[fault]
        if frames:
            await out.send(h11.Data(data=frames))
        if fault != "drop":
            await out.send(h11.EndOfMessage())
        return False


class _Wire:
    """One connection's outgoing side: h11 frames the events, the stream writer sends them."""

    def __init__(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        self.conn, self.writer = conn, writer

    async def send(self, *events: h11.Event) -> None:
        for event in events:
            data = self.conn.send(event)
            if data:
                self.writer.write(data)
        await self.writer.drain()

    async def json(self, status: int, payload: Mapping[str, Any], keep_alive: bool,
                   headers: Mapping[str, str] | None = None) -> bool:
        """A whole JSON response; returns whether the connection stays usable."""
        data = json.dumps(payload, ensure_ascii=False).encode()
        await self.send(
            h11.Response(status_code=status, reason=_reason(status).encode(), headers=[
                ("content-type", "application/json"), ("content-length", str(len(data))),
                ("connection", "keep-alive" if keep_alive else "close"), *(headers or {}).items()]),
            h11.Data(data=data), h11.EndOfMessage())
        return keep_alive


# --- CLI ---------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentfsm serve-scripted",
        description="Serve a scenario as a loopback Anthropic Messages API (real SSE) until SIGINT/SIGTERM. "
        "Prints the base URL on one line.",
    )
    p.add_argument("scenario", help="scenario JSON file, or the name of an embedded one (read_probe)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--ws", default=None, help="directory that $WS stands for (default: the current one)")
    p.add_argument(
        "--per-session",
        action="store_true",
        help="count requests per metadata.user_id, so each session runs the whole scenario",
    )
    p.add_argument("--log", default=None, help="write each request body as a JSON line to this file")
    p.add_argument("--model", default=None, help="model name to report (default: the request's)")
    return p


async def _serve(server: ScriptedServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    url = await server.start_async()
    print(url, flush=True)
    await server.serve(stop)


def main(argv: Sequence[str] | None = None) -> int:
    """``agentfsm serve-scripted SCENARIO [--port N] [--ws DIR] [--per-session] [--log FILE]``."""
    parser = _parser()
    args = parser.parse_args(argv)
    ws = os.path.abspath(args.ws) if args.ws else os.getcwd()
    try:
        scenario = load_scenario(scenario_path(args.scenario), ws)
    except ScenarioError as e:
        parser.error(str(e))
    try:
        server = ScriptedServer(
            scenario, args.host, args.port, per_session=args.per_session, log=args.log, model=args.model
        )
        asyncio.run(_serve(server))
    except OSError as e:
        sys.stderr.write(f"agentfsm serve-scripted: cannot serve on {args.host}:{args.port}: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
