"""The scripted Messages server on loopback, exercised with the real anthropic SDK and raw HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from agentfsm.llm.model import ModelRequest
from agentfsm.testing import (
    EXHAUSTED_TEXT,
    ScriptedServer,
    StreamedResponse,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    embedded_scenario_path,
    load_bodies,
    load_scenario,
    response_events,
    text_response,
    tool_response,
)

pytestmark = pytest.mark.server

ServerFactory = Callable[..., ScriptedServer]
USER = [{"role": "user", "content": "hi"}]


def client(server: ScriptedServer, **kw: Any) -> anthropic.AsyncAnthropic:
    kw.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(base_url=server.base_url, api_key="sk-test", **kw)


async def sdk_events(c: anthropic.AsyncAnthropic, **kw: Any) -> list[Any]:
    kw.setdefault("messages", USER)
    stream = await c.messages.create(model="claude-test", max_tokens=100, stream=True, **kw)
    return [ev async for ev in stream]


# --- a tiny raw HTTP/1.1 client, to see the wire as it is ---------------------------------------


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, headers, body
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    return status, headers, await reader.readexactly(int(headers.get("content-length", "0")))


async def hang_up(writer: asyncio.StreamWriter) -> None:
    # Wait for the close to happen, or the test's loop may end with the socket still open.
    writer.close()
    await writer.wait_closed()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def sse_frames(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    frames = []
    for raw in body.decode().split("\n\n"):
        if not raw:
            continue
        lines = dict(line.split(": ", 1) for line in raw.split("\n"))
        frames.append((lines["event"], json.loads(lines["data"])))
    return frames


def body_of(**kw: Any) -> bytes:
    return json.dumps(
        {"model": "claude-test", "max_tokens": 10, "messages": USER, "stream": True, **kw}
    ).encode()


# --- the SDK path ------------------------------------------------------------------------------

MIXED = StreamedResponse(
    (
        ThinkingBlock("pondering", "sig-xyz"),
        TextBlock("Let me read it."),
        ToolUseBlock("toolu_1", "Read", {"file_path": "/w/a.txt"}),
    ),
    "tool_use",
)


async def test_sdk_parses_every_event(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([MIXED])
    async with client(server) as c:
        events = await sdk_events(c)
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    assert events[0].message.model == "claude-test" and events[0].message.usage.input_tokens > 0
    assert [e.content_block.type for e in events if e.type == "content_block_start"] == [
        "thinking",
        "text",
        "tool_use",
    ]
    assert events[-2].delta.stop_reason == "tool_use"


async def test_sdk_stream_helper_accumulates_the_message(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([MIXED, text_response("done", usage={"input_tokens": 3, "output_tokens": 4})])
    async with client(server) as c:
        async with c.messages.stream(model="claude-test", max_tokens=100, messages=USER) as stream:
            message = await stream.get_final_message()
        async with c.messages.stream(model="claude-test", max_tokens=100, messages=USER) as stream:
            second = await stream.get_final_message()
    thinking, text, tool = message.content
    assert (thinking.type, thinking.thinking, thinking.signature) == ("thinking", "pondering", "sig-xyz")
    assert (text.type, text.text) == ("text", "Let me read it.")
    assert (tool.type, tool.id, tool.name, tool.input) == (
        "tool_use",
        "toolu_1",
        "Read",
        {"file_path": "/w/a.txt"},
    )
    assert message.stop_reason == "tool_use" and message.id == "msg_scripted_000000"
    assert second.content[0].text == "done"
    assert (second.usage.input_tokens, second.usage.output_tokens) == (3, 4)


async def test_non_streamed_request_gets_a_message(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([MIXED])
    async with client(server) as c:
        message = await c.messages.create(model="claude-test", max_tokens=100, messages=USER)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.stop_reason == "tool_use"


async def test_wire_is_exactly_response_events(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([MIXED])
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    payload = body_of()
    writer.write(post("/v1/messages", payload))
    status, headers, body = await read_response(reader)
    await hang_up(writer)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["request-id"] == "req_scripted_000000"
    expected = response_events(
        MIXED,
        "claude-test",
        input_tokens=len(json.dumps(json.loads(payload), separators=(",", ":"))) // 4,
        message_id="msg_scripted_000000",
    )
    assert sse_frames(body) == [(e.type, e.data) for e in expected]


async def test_sdk_sees_scripted_pauses(agentfsm_server: ServerFactory) -> None:
    resp = StreamedResponse(
        (ToolUseBlock("t", "Read", {"file_path": "/a"}), TextBlock("after")),
        "tool_use",
        delay_s=0.2,
        block_delay_s=0.4,
    )
    server = agentfsm_server([resp])
    async with client(server) as c:
        t0 = time.monotonic()
        stream = await c.messages.create(model="claude-test", max_tokens=10, messages=USER, stream=True)
        opened = time.monotonic() - t0
        stamps = [(ev.type, time.monotonic() - t0) async for ev in stream]
    stop_at = next(t for k, t in stamps if k == "content_block_stop")
    next_start = [t for k, t in stamps if k == "content_block_start"][1]
    assert opened >= 0.18
    assert next_start - stop_at >= 0.35  # the tool_use block arrived complete well before the text


# --- errors ------------------------------------------------------------------------------------


async def test_http_errors_reach_the_sdk_as_status_errors(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server(
        [
            {
                "status": 400,
                "error_type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000",
            },
            {"status": 529, "error_type": "overloaded_error", "message": "Overloaded"},
            {"status": 401, "error_type": "authentication_error", "message": "invalid x-api-key"},
        ]
    )
    async with client(server) as c:
        with pytest.raises(anthropic.BadRequestError) as bad:
            await sdk_events(c)
        with pytest.raises(anthropic.APIStatusError) as overloaded:
            await sdk_events(c)
        with pytest.raises(anthropic.AuthenticationError):
            await sdk_events(c)
    assert bad.value.status_code == 400
    assert bad.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000"},
    }
    assert overloaded.value.status_code == 529
    assert overloaded.value.response.headers["x-should-retry"] == "true"
    assert overloaded.value.body["error"]["type"] == "overloaded_error"


async def test_sdk_retries_consume_the_next_responses(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server(
        [
            {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0.01},
            {"status": 500, "error_type": "api_error", "message": "oops", "retry_after_s": 0.01},
            {"blocks": [{"type": "text", "text": "third time lucky"}]},
        ]
    )
    async with client(server, max_retries=2) as c:
        events = await sdk_events(c)
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "third time lucky"
    assert len(server.requests) == 3


async def test_break_closes_the_stream_mid_way(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server(
        [
            {
                "blocks": [{"type": "text", "text": "partial"}, {"type": "text", "text": "never"}],
                "break_after": 1,
            },
            {"blocks": [{"type": "text", "text": "next"}]},
        ]
    )
    async with client(server) as c:
        seen: list[str] = []
        with pytest.raises(Exception) as exc:
            stream = await c.messages.create(model="claude-test", max_tokens=10, messages=USER, stream=True)
            async for ev in stream:
                seen.append(ev.type)
        assert "incomplete" in str(exc.value).lower() or isinstance(exc.value, anthropic.APIConnectionError)
        assert seen.count("content_block_stop") == 1 and "message_stop" not in seen
        # The server goes on serving after a broken connection.
        events = await sdk_events(c)
    assert events[-1].type == "message_stop"


async def test_sse_error_mid_stream(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server(
        [{"blocks": [{"type": "text", "text": "a"}], "sse_error": "overloaded_error"}, {"blocks": []}]
    )
    async with client(server) as c:
        seen: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as exc:
            stream = await c.messages.create(model="claude-test", max_tokens=10, messages=USER, stream=True)
            async for ev in stream:
                seen.append(ev.type)
        assert seen[-1] == "content_block_stop"
        assert exc.value.body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
        }
        # The SDK drops the connection once it raised; the server answers the next request anyway.
        events = await sdk_events(c)
    assert events[-1].type == "message_stop"


async def test_count_tokens(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([])
    async with client(server) as c:
        counted = await c.messages.count_tokens(model="claude-test", messages=USER)
    assert counted.input_tokens > 0
    assert server.requests == []  # only Messages requests are recorded and counted


async def test_unknown_paths_and_bad_requests(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([])
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 404 and json.loads(body)["error"]["type"] == "not_found_error"
    writer.write(post("/v1/messages", b"{not json"))
    status, _, body = await read_response(reader)
    assert status == 400 and json.loads(body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "request body is not a JSON object"},
    }
    writer.write(b"NONSENSE\r\n\r\n")
    status, headers, _ = await read_response(reader)
    assert status == 400 and headers["connection"] == "close"
    assert await reader.read() == b""
    await hang_up(writer)
    assert server.requests == []


# --- HTTP/1.1 ----------------------------------------------------------------------------------


async def test_keep_alive_on_one_connection(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([text_response("one"), text_response("two")])
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    texts = []
    for _ in range(2):
        writer.write(post("/v1/messages?beta=true", body_of()))
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["connection"] == "keep-alive"
        texts.append("".join(d["delta"]["text"] for t, d in sse_frames(body) if t == "content_block_delta"))
    writer.write(post("/v1/messages/count_tokens", json.dumps({"messages": USER}).encode()))
    status, headers, body = await read_response(reader)
    assert status == 200 and "content-length" in headers and json.loads(body)["input_tokens"] > 0
    writer.write(post("/v1/messages", body_of(), "Connection: close\r\n"))
    status, headers, _ = await read_response(reader)
    assert headers["connection"] == "close"
    assert await reader.read() == b""
    await hang_up(writer)
    assert texts == ["one", "two"] and server.connections == 1


async def test_sdk_reuses_connections(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([text_response(str(i)) for i in range(5)])
    async with client(server) as c:
        for _ in range(5):
            await sdk_events(c)
    assert server.connections == 1 and len(server.requests) == 5


async def test_chunked_request_body(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([text_response("ok")])
    payload = body_of()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:10], payload[10:])) + b"0\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    status, _, _ = await read_response(reader)
    await hang_up(writer)
    assert status == 200 and server.requests == [json.loads(payload)]


# --- sessions and load -------------------------------------------------------------------------


async def _read_probe_session(c: anthropic.AsyncAnthropic, user_id: str) -> list[str]:
    """Drive the read probe as a client would: answer the tool_use, then read the final text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "AGENT_LOOP_INITIAL_MARKER"}]
    texts = []
    for _ in range(2):
        async with c.messages.stream(
            model="claude-test", max_tokens=100, messages=messages, metadata={"user_id": user_id}
        ) as stream:
            message = await stream.get_final_message()
        blocks = [b.model_dump(exclude_none=True) for b in message.content]
        texts += [b["text"] for b in blocks if b["type"] == "text"]
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if not uses:
            break
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": u["id"],
                        "content": Path(u["input"]["file_path"]).read_text(),
                    }
                    for u in uses
                ],
            }
        )
    return texts


async def test_per_session_runs_the_scenario_per_user_id(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server(embedded_scenario_path("read_probe"), per_session=True)
    async with client(server) as c:
        results = await asyncio.gather(*(_read_probe_session(c, f"user_{i}") for i in range(50)))
    assert results == [["TOOL_EXECUTION_OK"]] * 50
    assert len(server.requests) == 100
    assert len(server.requests_for("user_7")) == 2


async def test_global_count_without_per_session(agentfsm_server: ServerFactory) -> None:
    server = agentfsm_server([text_response("a"), text_response("b")])
    async with client(server) as c:
        first = await sdk_events(c, metadata={"user_id": "x"})
        second = await sdk_events(c, metadata={"user_id": "y"})
        third = await sdk_events(c)
    texts = [
        "".join(e.delta.text for e in ev if e.type == "content_block_delta") for ev in (first, second, third)
    ]
    assert texts == ["a", "b", EXHAUSTED_TEXT]


async def test_a_thousand_concurrent_connections(agentfsm_server: ServerFactory) -> None:
    # Each answer waits, so every connection is open at the same time.
    server = agentfsm_server([text_response("hello", delay_s=0.5, block_delay_s=0.1)], per_session=True)

    async def session(i: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/messages", body_of(metadata={"user_id": f"s{i}"})))
        _, _, body = await read_response(reader)
        await hang_up(writer)
        return "".join(d["delta"]["text"] for t, d in sse_frames(body) if t == "content_block_delta")

    t0 = time.monotonic()
    texts = await asyncio.gather(*(session(i) for i in range(1000)))
    elapsed = time.monotonic() - t0
    assert texts == ["hello"] * 1000
    assert len(server.requests) == 1000 and server.connections == 1000
    assert elapsed < 30  # served side by side: one after another would take 600 s


async def test_callable_source_behind_the_server(agentfsm_server: ServerFactory) -> None:
    seen: list[ModelRequest] = []

    def script(req: ModelRequest, n: int) -> Any:
        seen.append(req)
        return tool_response(f"t{n}", "Read", {"file_path": "/x"}) if n == 0 else text_response("bye")

    server = agentfsm_server(script)
    async with client(server) as c:
        await sdk_events(c, system="be brief", metadata={"user_id": "u"})
        await sdk_events(c)
    assert seen[0].system == ({"type": "text", "text": "be brief"},)
    assert seen[0].metadata == {"user_id": "u"} and seen[0].max_tokens == 100
    assert seen[0].messages == tuple(USER)


# --- lifecycle, log, CLI -----------------------------------------------------------------------


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_thread_mode_start_stop_and_context_manager(agentfsm_workspace: Path) -> None:
    scenario = load_scenario(embedded_scenario_path("read_probe"), agentfsm_workspace)
    with ScriptedServer(scenario) as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        sync = anthropic.Anthropic(base_url=server.base_url, api_key="sk-test", max_retries=0)
        with sync.messages.stream(model="claude-test", max_tokens=10, messages=USER) as stream:
            message = stream.get_final_message()
        sync.close()
        port = server.port
        assert _port_open(port)
    assert message.content[0].input == {"file_path": f"{agentfsm_workspace}/probe-fixture.txt"}
    assert not _port_open(port)
    server.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not running"):
        server.base_url  # noqa: B018
    # A stopped server starts again; the scenario goes on where it was.
    with server:
        with anthropic.Anthropic(base_url=server.base_url, api_key="sk-test", max_retries=0) as sync:
            again = sync.messages.create(model="claude-test", max_tokens=10, messages=USER)
    assert again.content[0].text == "TOOL_EXECUTION_OK"


def test_start_failure_is_raised_to_the_caller() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = ScriptedServer([], port=taken.getsockname()[1])
        with pytest.raises(OSError):
            server.start()


async def test_async_mode_and_stop_with_open_streams() -> None:
    async with ScriptedServer([text_response("slow", delay_s=30)]) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(post("/v1/messages", body_of()))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 5  # a pending answer does not hold up the stop
    assert await reader.read() == b""
    await hang_up(writer)


async def test_log_file_holds_each_body(agentfsm_server: ServerFactory, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    server = agentfsm_server([text_response("a")], log=log)
    async with client(server) as c:
        await sdk_events(c)
        await sdk_events(c, messages=[{"role": "user", "content": "é second"}])
    bodies = load_bodies(log)
    assert bodies == server.requests
    assert bodies[1]["messages"][0]["content"] == "é second"


@contextlib.contextmanager
def serve_cli(*args: str, cwd: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "agentfsm.testing.server", *args]
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        try:
            yield p
        finally:
            if p.poll() is None:
                p.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_until_signalled(agentfsm_workspace: Path, tmp_path: Path, sig: signal.Signals) -> None:
    log = tmp_path / "log.jsonl"
    scenario = str(embedded_scenario_path("read_probe"))
    args = ["--port", "0", "--ws", str(agentfsm_workspace), "--log", str(log), "--per-session"]
    with serve_cli(scenario, *args, cwd=tmp_path) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with anthropic.Anthropic(base_url=url, api_key="sk-test", max_retries=0) as sync:
            metadata = {"user_id": "a"}
            with sync.messages.stream(
                model="claude-test", max_tokens=10, messages=USER, metadata=metadata
            ) as stream:
                message = stream.get_final_message()
        assert message.content[0].input == {"file_path": f"{agentfsm_workspace}/probe-fixture.txt"}
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read() == ""  # one line, the URL, and nothing else
    assert load_bodies(log)[0]["metadata"] == {"user_id": "a"}


def test_cli_embedded_name_and_default_ws(tmp_path: Path) -> None:
    with serve_cli("read_probe", cwd=tmp_path) as proc:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        with anthropic.Anthropic(base_url=url, api_key="sk-test", max_retries=0) as sync:
            message = sync.messages.create(model="claude-test", max_tokens=10, messages=USER)
        assert message.content[0].input == {"file_path": f"{tmp_path.resolve()}/probe-fixture.txt"}
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_cli_rejects_a_bad_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"responses": [{"blocks": [{"type": "txt"}]}]}))
    with serve_cli(str(bad), cwd=tmp_path) as proc:
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "responses[0].blocks[0].type: 'txt'" in err


def test_main_in_process_rejects_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentfsm.testing.server import main

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing.json")])
    assert exc.value.code == 2
    assert "cannot read" in capsys.readouterr().err
