"""API faults on the wire: the real ``anthropic`` SDK against the loopback scripted server (and, for
undecodable SSE, a few lines of raw HTTP), driven through a session in this process.

Transient HTTP failures are the SDK's to retry (``max_retries`` = ``Limits.api_max_retries``; the
server's ``retry-after-ms`` keeps its backoff short). A stream that breaks part-way is the loop's:
requested again as a whole (partial blocks tombstoned, running tools aborted, a new executor for the
new stream) or, with no retry left, the end of the run with every tool_use it showed paired.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentfsm.auditing.audit import audit_file
from agentfsm.llm.model import ModelCallError, ModelRequest
from agentfsm.llm.transport import AnthropicTransport
from agentfsm.machine import prompts
from agentfsm.machine.events import ModelError
from agentfsm.machine.graph import BUDGET_CLOSED
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, Message, TerminalReason
from agentfsm.runtime.result import RunResult
from agentfsm.sessions.session import Session
from agentfsm.testing.canonical import canonical_requests
from agentfsm.testing.scenario import load_scenario, parse_response
from agentfsm.testing.scripted import ScriptedModel, stream_error
from agentfsm.testing.server import ScriptedServer
from agentfsm.tools.base import Tool, ToolContext, ToolOutput

pytestmark = pytest.mark.server
T = TerminalReason


class SlowTool(Tool):
    """Sleeps (10 s, or not at all with ``quick``) and records what happened to each call, so a test
    can see a call cancelled by an abort and another one started by a fresh executor."""

    name = "Slow"
    description = "Waits."
    input_schema = {"type": "object", "properties": {"quick": {"type": "boolean"}}}

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def interrupt_behavior(self) -> Any:
        return "cancel"

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        self.events.append(("start", ctx.tool_use_id))
        try:
            await asyncio.sleep(0 if input.get("quick") else 10)
        except asyncio.CancelledError:
            self.events.append(("cancelled", ctx.tool_use_id))
            raise
        self.events.append(("done", ctx.tool_use_id))
        return ToolOutput("slept")


@attrs.define
class WireRun:
    result: RunResult
    bodies: list[dict[str, Any]]
    out: list[dict[str, Any]]
    history: tuple[Message, ...]
    trace: Path
    gateway: str = ""  # host:port of the scripted server

    @property
    def requests(self) -> list[list[str]]:
        return canonical_requests(self.bodies)

    def system(self, subtype: str) -> list[dict[str, Any]]:
        return [m for m in self.out if m["type"] == "system" and m.get("subtype") == subtype]

    def shown_pairs(self) -> tuple[list[str], list[str]]:
        uses = [b["id"] for m in self.out if m["type"] == "assistant" for b in m["message"]["content"]
                if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for m in self.out if m["type"] == "user"
                   for b in m["message"]["content"] if b.get("type") == "tool_result"]
        return uses, results


async def over_the_wire(tmp: Path, ws: Path, responses: Sequence[Any], *, limits: Limits | None = None,
                        fallback: tuple[str, ...] = (), extra_tools: tuple[Tool, ...] = (),
                        base_url: str | None = None, tools: tuple[str, ...] = ("Read",),
                        permission_mode: str = "bypassPermissions") -> WireRun:
    limits = limits or Limits()
    options = Options(tools=tools, permission_mode=permission_mode, cwd=ws, limits=limits,
                      fallback_models=fallback, extra_tools=extra_tools, sessions_dir=tmp / "sessions",
                      setting_sources=())
    out: list[dict[str, Any]] = []
    server = ScriptedServer(load_scenario({"prompt": "go", "responses": list(responses)}, ws=str(ws)))
    url = base_url or await server.start_async()
    try:
        client = AnthropicTransport(api_key="sk-test", base_url=url, max_retries=limits.api_max_retries)
        session = Session(options, client=client, emit=out.append)
        try:
            result = await session.run("go")
        finally:
            await session.aclose()
            await client.aclose()
    finally:
        await server.stop_async()
    assert session.trace_path is not None
    return WireRun(result, server.requests, out, session.history, session.trace_path, url.split("://", 1)[-1])


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": "end_turn", **kw}


def use(tid: str, name: str, inp: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": dict(inp)}


def pairs_ok(history: Sequence[Message]) -> bool:
    for i, m in enumerate(history):
        if m.role == "assistant" and m.tool_use_ids():
            if i + 1 >= len(history) or sorted(history[i + 1].tool_result_ids()) != sorted(m.tool_use_ids()):
                return False
    return True


# --- transient HTTP failures: the SDK retries ---------------------------------------------------


@pytest.mark.parametrize("status,etype", [(429, "rate_limit_error"), (500, "api_error"),
                                          (503, "api_error"), (529, "overloaded_error")])
async def test_transient_http_errors_are_retried_by_the_sdk(status: int, etype: str, tmp_path: Path,
                                                           agentfsm_workspace: Path) -> None:
    err = {"status": status, "error_type": etype, "message": f"HTTP {status}", "retry_after_s": 0.01}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [err, err, text("after two retries")])
    assert len(run.bodies) == 3 and run.requests == [["U:go"]] * 3
    assert run.result.terminal_reason is T.COMPLETED and run.result.result == "after two retries"
    assert audit_file(run.trace) == []


async def test_the_wait_the_api_asks_for_is_the_wait_announced_and_taken(tmp_path: Path,
                                                                         agentfsm_workspace: Path) -> None:
    """``retry-after-ms: 30`` means 30 milliseconds: the api_retry message says 30 ms, not 30 seconds."""
    err = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0.03}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [err, text("after one retry")])
    retries = [m for m in run.out if m.get("subtype") == "api_retry"]
    assert [m["retry_delay_ms"] for m in retries] == [30], retries
    assert run.result.result == "after one retry"


async def test_retries_exhausted_without_fallback_is_api_error(tmp_path: Path,
                                                                agentfsm_workspace: Path) -> None:
    err = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0.01}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [err] * 3, limits=Limits(api_max_retries=2))
    assert len(run.bodies) == 3
    res = run.result
    gateway = run.gateway
    # Claude Code 2.1.332's words for a 5xx: the status, the message, whose fault, where to look (the
    # gateway the base URL names); shown first as its synthetic assistant message
    said = (f"API Error: 529 Overloaded. This is a server-side issue, usually temporary \u2014 try again in a "
            f"moment. If it persists, check your inference gateway ({gateway}).")
    assert (res.terminal_reason, res.is_error, res.result) == (T.API_ERROR, True, said)
    shown = [m for m in run.out if m["type"] == "assistant" and m.get("is_api_error_message")]
    assert [(m["message"]["content"][0]["text"], m["error"], m["api_error_status"]) for m in shown] == \
        [(said, "server_error", 529)]


async def test_a_request_sent_again_after_a_broken_stream_is_not_refused_by_the_budget(
        tmp_path: Path, agentfsm_workspace: Path) -> None:
    """The stream broke after message_start, whose usage already spent the budget: Claude Code 2.1.332 sends
    the request again all the same, and ends over budget on the response it brings (docs/conform.md)."""
    broken = {"blocks": [], "stop_reason": "end_turn", "break_after": 0}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [broken, text("whole answer"), text("never sent")],
                              limits=Limits(max_budget_usd=0.0001))
    assert len(run.bodies) == 2
    assert run.result.terminal_reason is T.BUDGET_EXHAUSTED
    assert audit_file(run.trace) == []


@pytest.mark.parametrize("message,said", [("Internal server error.", "500 Internal server error"),
                                          ("Down!", "500 Down"), ("busy\u2026", "500 busy")])
async def test_a_final_5xx_is_worded_as_claude_code_words_it(message: str, said: str, tmp_path: Path,
                                                             agentfsm_workspace: Path) -> None:
    err = {"status": 500, "error_type": "api_error", "message": message, "should_retry": False}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [err, text("never sent")])
    assert len(run.bodies) == 1  # the API said not to retry
    assert run.result.result.startswith(f"API Error: {said}. This is a server-side issue")
    assert run.result.result.endswith(f"check your inference gateway ({run.gateway}).")
    assert audit_file(run.trace) == []


async def test_non_retryable_4xx_is_api_error_with_the_apis_message(tmp_path: Path,
                                                                    agentfsm_workspace: Path) -> None:
    err = {"status": 403, "error_type": "permission_error",
           "message": "Your API key does not have permission to use the specified resource."}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [err, text("never sent")])
    assert len(run.bodies) == 1  # a 403 is never retried
    res = run.result
    assert (res.terminal_reason, res.subtype, res.is_error) == (T.API_ERROR, "success", True)
    assert res.result == f"API Error: 403 {err['message']}"  # Claude Code's generic form for a 4xx
    assert audit_file(run.trace) == []


async def test_connection_refused_is_api_error(tmp_path: Path, agentfsm_workspace: Path) -> None:
    # a port nobody listens on: the SDK's connection error, after its (here: no) retries
    run = await over_the_wire(tmp_path, agentfsm_workspace, [], limits=Limits(api_max_retries=0),
                              base_url="http://127.0.0.1:9")
    assert run.result.terminal_reason is T.API_ERROR and "Connection error" in (run.result.result or "")
    assert audit_file(run.trace) == []


async def test_fallback_model_takes_over_when_the_primary_is_overloaded(tmp_path: Path,
                                                                       agentfsm_workspace: Path) -> None:
    err = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0.01}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [err, err, err, text("haiku here")],
                              limits=Limits(api_max_retries=2), fallback=("claude-haiku-4-5",))
    assert [b["model"] for b in run.bodies] == ["claude-sonnet-4-5"] * 3 + ["claude-haiku-4-5"]
    assert run.result.terminal_reason is T.COMPLETED and run.result.result == "haiku here"
    transitions = [json.loads(line) for line in run.trace.read_text().splitlines()]
    assert [r["trigger"] for r in transitions if r["type"] == "transition"].count("fallback_retry") == 1
    assert audit_file(run.trace) == []


# --- streams that break part-way: the loop retries the whole response --------------------------


async def test_broken_stream_is_retried_as_a_whole(tmp_path: Path, agentfsm_workspace: Path) -> None:
    slow = SlowTool()
    broken = {"blocks": [use("s1", "Slow", {}), {"type": "text", "text": "and then"}],
              "stop_reason": "tool_use", "break_after": 1, "block_delay_s": 0.2}
    again = {"blocks": [use("s2", "Slow", {"quick": True})], "stop_reason": "tool_use"}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [broken, again, text("done")],
                              extra_tools=(slow,))
    # nothing of the broken response was kept: the retry carries the prompt only
    assert run.requests == [["U:go"], ["U:go"], ["U:go", "use:s2:Slow", "res:s2:ok"]]
    # s1 started while streaming and was aborted with its executor; s2 ran on a new one
    assert slow.events == [("start", "s1"), ("cancelled", "s1"), ("start", "s2"), ("done", "s2")]
    # what the broken response showed was withdrawn
    tombstones = run.system("tombstone")
    assert len(tombstones) == 1 and tombstones[0]["blocks"] == 1 and tombstones[0]["tool_use_ids"] == ["s1"]
    assert not any(b.get("id") == "s1" or b.get("tool_use_id") == "s1"
                   for m in run.history for b in m.content)
    assert run.result.terminal_reason is T.COMPLETED
    assert audit_file(run.trace) == []


async def test_broken_stream_with_no_retry_left_pairs_every_started_tool(tmp_path: Path,
                                                                         agentfsm_workspace: Path) -> None:
    slow = SlowTool()
    broken = {"blocks": [use("r1", "Read", {"file_path": f"{agentfsm_workspace}/a.txt"}),
                         use("s1", "Slow", {}), {"type": "text", "text": "never shown"}],
              "stop_reason": "tool_use", "break_after": 2, "block_delay_s": 0.2}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [broken, text("never sent")],
                              limits=Limits(stream_retries=0), extra_tools=(slow,))
    assert len(run.bodies) == 1
    res = run.result
    assert (res.terminal_reason, res.is_error) == (T.API_ERROR, True)
    assert "Stream interrupted" in (res.result or "")
    assert pairs_ok(run.history)
    assistant, results = run.history[-2], run.history[-1]
    assert assistant.tool_use_ids() == ["r1", "s1"]
    by_id = {b["tool_use_id"]: b for b in results.content}
    assert "ALPHA" in str(by_id["r1"]["content"]) and not by_id["r1"].get("is_error")  # Read had finished
    assert by_id["s1"]["is_error"] is True and "discarded" in by_id["s1"]["content"]
    assert ("cancelled", "s1") in slow.events
    uses, shown = run.shown_pairs()
    assert sorted(uses) == sorted(shown) == ["r1", "s1"]
    assert audit_file(run.trace) == []


@pytest.mark.parametrize("sse,retried", [("overloaded_error", "resumed"), ("api_error", "resumed"),
                                         ("invalid_request_error", False), ("rate_limit_error", False)])
async def test_sse_error_event_mid_stream(sse: str, retried: bool | str, tmp_path: Path,
                                          agentfsm_workspace: Path) -> None:
    failing = text("half an answ", sse_error=sse)
    run = await over_the_wire(tmp_path, agentfsm_workspace, [failing, text("whole answer")])
    if retried == "resumed":
        # overloaded or api_error after a complete text block: the text is kept and the model asked to
        # resume from it, as Claude Code 2.1.332 does (docs/conform.md)
        assert len(run.bodies) == 2 and run.result.terminal_reason is T.COMPLETED
        sent = json.dumps(run.bodies[1]["messages"])
        assert "half an answ" in sent and "cut off mid-stream" in sent
        assert run.system("tombstone") == []
    else:
        # another type of error event after a complete text block ends the run, in Claude Code's generic
        # words (2.1.332: docs/conform.md)
        assert len(run.bodies) == 1 and run.result.terminal_reason is T.API_ERROR
        assert run.result.result == f"API Error: {sse}"  # the scripted server's message: the type
        # what was shown is kept as the answer's partial text, not withdrawn
        assert run.history[-1].text() == "half an answ"
    assert audit_file(run.trace) == []


@pytest.mark.parametrize("sse", ["invalid_request_error", "rate_limit_error", "authentication_error"])
async def test_an_sse_error_event_before_anything_complete_is_asked_again(sse: str, tmp_path: Path,
                                                                          agentfsm_workspace: Path) -> None:
    """Claude Code 2.1.332 asks again after an SSE error event of any type that came before any complete
    block (docs/conform.md), where agentfsm used to end the run on the API's message."""
    failing = {**text("never whole"), "break_after": 0, "sse_error": {"type": sse, "message": "stream failed"}}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [failing, text("whole answer")])
    assert len(run.bodies) == 2 and run.result.terminal_reason is T.COMPLETED
    assert run.result.result == "whole answer"
    assert audit_file(run.trace) == []


@pytest.mark.parametrize("sse", ["overloaded_error", "api_error", "invalid_request_error"])
async def test_sse_error_event_after_a_complete_tool_call_runs_it(sse: str, tmp_path: Path,
                                                                  agentfsm_workspace: Path) -> None:
    """Claude Code 2.1.332 keeps a response an overloaded_error or api_error event cut after a complete
    tool_use block, runs the call and sends its result with the next request
    (tests/fidelity/conform/conform-3ef694a5db.json); agentfsm requested the response again."""
    (agentfsm_workspace / "a.txt").write_text("ALPHA\n")
    cut = {"blocks": [use("toolu_01", "Read", {"file_path": str(agentfsm_workspace / "a.txt")})],
           "stop_reason": "tool_use", "break_after": 1, "sse_error": sse}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [cut, text("done")])
    assert len(run.bodies) == 2 and run.result.terminal_reason is T.COMPLETED and run.result.result == "done"
    last = run.bodies[1]["messages"]
    assert [b["type"] for b in last[-2]["content"]] == ["tool_use"]
    assert last[-1]["content"][0]["tool_use_id"] == "toolu_01" and "ALPHA" in json.dumps(last[-1]["content"][0])
    assert run.system("tombstone") == []
    assert audit_file(run.trace) == []


async def test_stream_retries_exhausted_then_fallback(tmp_path: Path, agentfsm_workspace: Path) -> None:
    broken = {"blocks": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}], "break_after": 1}
    run = await over_the_wire(tmp_path, agentfsm_workspace, [broken, broken, text("fallback answer")],
                              limits=Limits(stream_retries=1), fallback=("claude-haiku-4-5",))
    assert [b["model"] for b in run.bodies] == ["claude-sonnet-4-5", "claude-sonnet-4-5", "claude-haiku-4-5"]
    assert run.result.terminal_reason is T.COMPLETED and run.result.result == "fallback answer"
    assert audit_file(run.trace) == []


# --- malformed streams: model_error -------------------------------------------------------------


async def test_stream_without_stop_reason_is_model_error(tmp_path: Path, agentfsm_workspace: Path) -> None:
    run = await over_the_wire(tmp_path, agentfsm_workspace,
                              [{"blocks": [{"type": "text", "text": "hi"}], "stop_reason": None}])
    res = run.result
    assert (res.terminal_reason, res.subtype, res.is_error) == (T.MODEL_ERROR, "error_during_execution", True)
    assert "stop_reason" in res.errors[0]
    assert audit_file(run.trace) == []


async def _undecodable_sse_server() -> tuple[asyncio.Server, str]:
    """Answers every request with a stream whose second event's data is not JSON."""
    message = {"type": "message_start", "message": {
        "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}}
    sse = (f"event: message_start\ndata: {json.dumps(message)}\n\n"
           "event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0,\n\n").encode()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(sse), sse))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_undecodable_sse_is_model_error(tmp_path: Path, agentfsm_workspace: Path) -> None:
    server, url = await _undecodable_sse_server()
    try:
        run = await over_the_wire(tmp_path, agentfsm_workspace, [], base_url=url,
                                  limits=Limits(api_max_retries=0))
    finally:
        server.close()
        await server.wait_closed()
    assert run.result.terminal_reason is T.MODEL_ERROR
    assert "Malformed stream" in run.result.errors[0]
    assert audit_file(run.trace) == []


# --- the two transports agree on what a broken stream means --------------------------------------


@pytest.mark.parametrize("raw", [
    {"blocks": [{"type": "text", "text": "x"}], "sse_error": "overloaded_error"},
    {"blocks": [{"type": "text", "text": "x"}], "sse_error": "api_error"},
    {"blocks": [{"type": "text", "text": "x"}],
     "sse_error": {"type": "invalid_request_error", "message": "no"}},
    {"blocks": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}], "break_after": 1},
])
async def test_sdk_transport_classifies_broken_streams_like_the_scripted_model(raw: dict[str, Any]) -> None:
    resp = parse_response(raw)
    expected = stream_error(resp)  # type: ignore[arg-type]
    request = ModelRequest("claude-sonnet-4-5", (), ({"role": "user", "content": "hi"},), (), 100)
    errors: list[ModelError] = []
    for client_of in ("scripted", "sdk"):
        async with ScriptedServer([raw]) as server:
            client: Any = (ScriptedModel([raw]) if client_of == "scripted"
                           else AnthropicTransport(api_key="k", base_url=server.base_url, max_retries=0))
            with pytest.raises(ModelCallError) as caught:
                async for _ in client.stream(request):
                    pass
            errors.append(caught.value.error)
            if client_of == "sdk":
                await client.aclose()
    scripted, sdk = errors
    assert scripted == expected
    assert (sdk.kind, sdk.retryable, sdk.status) == (expected.kind, expected.retryable, expected.status)


async def test_abort_while_waiting_for_the_first_event_ends_at_once(tmp_path: Path) -> None:
    """An interrupt during a slow answer (or the SDK's retry backoff) does not wait for the stream."""
    model = ScriptedModel([{"blocks": [{"type": "text", "text": "late"}], "stop_reason": "end_turn",
                            "delay_s": 30}])
    session = Session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", tools=("Read",)), client=model)
    run = asyncio.ensure_future(session.run("hello"))
    await asyncio.sleep(0.2)
    session.abort()
    result = await asyncio.wait_for(run, timeout=5)
    await session.aclose()
    assert result.terminal_reason is TerminalReason.ABORTED_STREAMING and result.is_error
    assert model.count == 1
    assert [f for f in audit_file(session.trace_path) if f.is_error] == []


# --- a stream that fails with something other than the API's or the connection's error ----------


async def _unreadable_event_server(*, after_start: bool) -> tuple[asyncio.Server, str, list[bool]]:
    """Streams an event nested deeper than the JSON decoder's stack (the first event, or the one after
    ``message_start``), which fails the SDK's read with neither an API nor a connection error; answers
    the same request unstreamed with a whole message. The list records each request's ``stream``."""
    message = {"id": "msg_x", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 5, "output_tokens": 1}}
    deep = "[" * 100_000 + "]" * 100_000
    start = f"event: message_start\ndata: {json.dumps({'type': 'message_start', 'message': message})}\n\n"
    unreadable = ('event: content_block_start\ndata: {"type": "content_block_start", "index": 0, "x": '
                  f"{deep}}}\n\n")
    sse = ((start if after_start else "") + unreadable).encode()
    whole = json.dumps({**message, "content": [{"type": "text", "text": "unstreamed answer"}],
                        "stop_reason": "end_turn"}).encode()
    streamed: list[bool] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        stream = bool(json.loads(await reader.readexactly(length)).get("stream"))
        streamed.append(stream)
        kind, data = (b"text/event-stream", sse) if stream else (b"application/json", whole)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
                     % (kind, len(data), data))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", streamed


@pytest.mark.parametrize("after_start", [False, True])
async def test_a_stream_unreadable_before_its_first_event_is_asked_again_unstreamed(
        after_start: bool, tmp_path: Path, agentfsm_workspace: Path) -> None:
    """Before any event, a stream that cannot be read is not a stream yet: the same request is asked
    once more without streaming (the run completes with that answer). After an event it is a stream
    that broke part-way: it is requested again as a whole, never unstreamed, so with no stream retry
    left the run ends on the API error."""
    server, url, streamed = await _unreadable_event_server(after_start=after_start)
    try:
        run = await over_the_wire(tmp_path, agentfsm_workspace, [], base_url=url,
                                  limits=Limits(api_max_retries=0, stream_retries=0))
    finally:
        server.close()
        await server.wait_closed()
    if after_start:
        assert streamed == [True]
        assert (run.result.terminal_reason, run.result.is_error) == (T.API_ERROR, True)
        assert "Stream interrupted" in (run.result.result or "")
    else:
        assert streamed == [True, False]
        assert (run.result.terminal_reason, run.result.result) == (T.COMPLETED, "unstreamed answer")
    assert audit_file(run.trace) == []


@pytest.mark.parametrize("pause", [0.0, 0.6])
async def test_over_budget_keeps_the_results_of_calls_that_finished_while_the_response_streamed(
        tmp_path: Path, agentfsm_workspace: Path, pause: float) -> None:
    """A response that brings the spend to --max-budget-usd ends the run; a call of it that finished while
    it streamed keeps its result (it ran), one that had not never runs. Claude Code 2.1.332 starts each call
    as its block ends and records what finished (tests/fixtures/claude_code/budget_finished_calls,
    budget_partial_calls)."""
    (agentfsm_workspace / "a.txt").write_text("ALPHA\n")
    read = use("toolu_01", "Read", {"file_path": str(agentfsm_workspace / "a.txt")})
    run = await over_the_wire(tmp_path, agentfsm_workspace,
                              [{"blocks": [read], "stop_reason": "tool_use", "block_delay_s": pause}, text("no")],
                              limits=Limits(max_budget_usd=1e-9))
    assert run.result.terminal_reason is T.BUDGET_EXHAUSTED and len(run.bodies) == 1
    (result,) = run.history[-1].content
    assert result["tool_use_id"] == "toolu_01"
    if pause:
        assert "ALPHA" in str(result["content"]) and not result.get("is_error")
    else:
        assert result == prompts.synthetic_block("toolu_01", BUDGET_CLOSED)
    assert audit_file(run.trace) == []


@pytest.mark.parametrize("broken_first", [False, True])
async def test_over_budget_lists_the_denials_of_calls_rejected_while_the_response_streamed(
        tmp_path: Path, agentfsm_workspace: Path, broken_first: bool) -> None:
    """In ``dontAsk`` mode a call no rule allows is denied as its block ends, before the response does: when
    that response brings the spend to --max-budget-usd, Claude Code 2.1.332 keeps those denials and lists
    them in the result's ``permission_denials`` (oracle runs of issue 27: a Write and ``rm -rf sub``, on
    the first response or on the one a stream broken after ``message_start`` brought; docs/conform.md).
    Calls of a response asked for again are withdrawn, so theirs are not listed."""
    write = use("toolu_01", "Write", {"file_path": str(agentfsm_workspace / "new.txt"), "content": "W\n"})
    rm = use("toolu_02", "Bash", {"command": "rm -rf sub"})
    denied = {"blocks": [write, rm], "stop_reason": "tool_use"}
    withdrawn = {"blocks": [use("toolu_03", "Write", {"file_path": str(agentfsm_workspace / "other.txt"),
                                                     "content": "X\n"})], "stop_reason": "tool_use", "break_after": 1}
    script = [withdrawn, denied, text("never sent")] if broken_first else [denied, text("never sent")]
    run = await over_the_wire(tmp_path, agentfsm_workspace, script, limits=Limits(max_budget_usd=1e-9),
                              tools=("Read", "Write", "Bash"), permission_mode="dontAsk")
    assert run.result.terminal_reason is T.BUDGET_EXHAUSTED and len(run.bodies) == (2 if broken_first else 1)
    assert [(d["tool_name"], d["tool_use_id"], d["tool_input"]) for d in run.result.permission_denials] == \
        [("Write", "toolu_01", write["input"]), ("Bash", "toolu_02", rm["input"])]
    assert [b["tool_use_id"] for b in run.history[-1].content] == ["toolu_01", "toolu_02"]
    assert all(b.get("is_error") and b != prompts.synthetic_block(b["tool_use_id"], BUDGET_CLOSED)
               for b in run.history[-1].content)
    assert not (agentfsm_workspace / "new.txt").exists()
    assert audit_file(run.trace) == []


async def test_budget_reminder_follows_the_last_result_of_every_batch(tmp_path: Path,
                                                                      agentfsm_workspace: Path) -> None:
    """With --max-budget-usd larger than the run's spend, Claude Code 2.1.332 appends its ``USD budget:
    $spent/$max; $left remaining`` reminder to the last tool result of every batch (seen with the oracle:
    `$0.040578/$100; $99.959422 remaining` after one request); the spend is each client's own."""
    (agentfsm_workspace / "a.txt").write_text("ALPHA\n")
    read = use("toolu_01", "Read", {"file_path": str(agentfsm_workspace / "a.txt")})
    again = use("toolu_02", "Read", {"file_path": str(agentfsm_workspace / "a.txt")})
    run = await over_the_wire(tmp_path, agentfsm_workspace,
                              [{"blocks": [read], "stop_reason": "tool_use"},
                               {"blocks": [again], "stop_reason": "tool_use"}, text("done")],
                              limits=Limits(max_budget_usd=100.0))
    assert run.result.terminal_reason is T.COMPLETED and len(run.bodies) == 3
    for body in run.bodies[1:]:
        result = body["messages"][-1]["content"][-1]
        head, _, note = result["content"].partition("\n\n<system-reminder>\nUSD budget: $")
        assert "ALPHA" in head and note.endswith(" remaining\n</system-reminder>"), result
        spent, _, rest = note.partition("/$100; $")
        assert 0 < float(spent) < 100 and abs(float(spent) + float(rest.split(" ")[0]) - 100) < 1e-9
    # every batch carries the spend so far: the second is larger than the first
    first = run.bodies[2]["messages"][-3]["content"][-1]["content"]
    second = run.bodies[2]["messages"][-1]["content"][-1]["content"]
    assert first == run.bodies[1]["messages"][-1]["content"][-1]["content"]
    assert float(first.split("USD budget: $")[1].split("/")[0]) < float(second.split("USD budget: $")[1].split("/")[0])
