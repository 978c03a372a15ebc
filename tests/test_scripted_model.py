"""The in-process scripted model: a ModelClient answering from a scenario."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentfsm.llm.model import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    MessageStop,
    ModelCallError,
    ModelClient,
    ModelRequest,
    StreamEvent,
)
from agentfsm.testing import (
    EXHAUSTED_TEXT,
    HttpErrorResponse,
    ScriptedModel,
    StreamedResponse,
    TextBlock,
    ToolUseBlock,
    response_events,
    text_response,
    tool_response,
)


def request(text: str = "hi", user_id: str | None = None) -> ModelRequest:
    metadata = {"user_id": user_id} if user_id else {}
    return ModelRequest(
        "claude-test",
        ({"type": "text", "text": "sys"},),
        ({"role": "user", "content": text},),
        (),
        1000,
        metadata,
    )


async def collect(model: ScriptedModel, req: ModelRequest | None = None) -> list[StreamEvent]:
    return [ev async for ev in model.stream(req or request())]


async def collect_error(
    model: ScriptedModel, req: ModelRequest | None = None
) -> tuple[list[StreamEvent], ModelCallError]:
    events: list[StreamEvent] = []
    with pytest.raises(ModelCallError) as exc:
        async for ev in model.stream(req or request()):
            events.append(ev)
    return events, exc.value


def text_of(events: list[StreamEvent]) -> str:
    return "".join(e.delta.get("text", "") for e in events if isinstance(e, BlockDelta))


def test_is_a_model_client() -> None:
    model: ModelClient = ScriptedModel([text_response("x")])
    assert hasattr(model, "stream")


async def test_answers_in_order_then_exhausted(agentfsm_model: Callable[..., ScriptedModel]) -> None:
    model = agentfsm_model(_read_probe_path())
    first = await collect(model)
    assert isinstance(first[0], MessageStart) and first[0].model == "claude-test"
    starts = [e for e in first if isinstance(e, BlockStart)]
    assert starts[0].block["type"] == "tool_use" and starts[0].block["id"] == "toolu_agent_loop_probe"
    assert isinstance(first[-1], MessageStop)
    assert isinstance(first[-2], MessageDelta) and first[-2].stop_reason == "tool_use"
    assert text_of(await collect(model)) == "TOOL_EXECUTION_OK"
    assert text_of(await collect(model)) == EXHAUSTED_TEXT
    assert model.count == 3
    assert len(model.requests) == 3 and model.requests[0] == request()
    assert model.bodies[0]["messages"] == [{"role": "user", "content": "hi"}]


def _read_probe_path() -> Path:
    from agentfsm.testing import embedded_scenario_path

    return embedded_scenario_path("read_probe")


async def test_ws_substituted_in_tool_input(
    agentfsm_model: Callable[..., ScriptedModel], agentfsm_workspace: Path
) -> None:
    model = agentfsm_model(_read_probe_path())
    events = await collect(model)
    raw = "".join(
        e.delta["partial_json"]
        for e in events
        if isinstance(e, BlockDelta) and e.delta["type"] == "input_json_delta"
    )
    assert raw == f'{{"file_path":"{agentfsm_workspace}/probe-fixture.txt"}}'
    assert (agentfsm_workspace / "probe-fixture.txt").read_text().strip() == "AGENT_LOOP_FILE_MARKER"


async def test_records_are_the_wire_events() -> None:
    resp = StreamedResponse(
        (TextBlock("abc def ghi"), ToolUseBlock("t", "Read", {"file_path": "/a"})), "tool_use"
    )
    model = ScriptedModel([resp], model="claude-reported")
    events = await collect(model)
    expected = [
        e.record for e in response_events(resp, "claude-reported", input_tokens=0) if e.record is not None
    ]
    assert [type(e) for e in events] == [type(e) for e in expected]
    assert events[1:] == expected[1:]
    first = events[0]
    assert isinstance(first, MessageStart) and first.model == "claude-reported"
    assert first.usage["input_tokens"] > 0 and first.message_id == "msg_scripted_000000"


async def test_http_error_raises_classified() -> None:
    model = ScriptedModel(
        [
            {
                "status": 400,
                "error_type": "invalid_request_error",
                "message": "prompt is too long: 300000 tokens",
            },
            {"status": 529, "error_type": "overloaded_error", "message": "Overloaded"},
            {"status": 429, "error_type": "rate_limit_error", "message": "slow down"},
            {"status": 400, "error_type": "invalid_request_error", "message": "bad image"},
            {"status": 401, "error_type": "authentication_error", "message": "invalid x-api-key"},
        ]
    )
    kinds = []
    for _ in range(5):
        events, err = await collect_error(model)
        assert events == []  # nothing streamed before the failure
        kinds.append((err.error.kind, err.error.status, err.error.retryable))
    assert kinds == [
        ("prompt_too_long", 400, False),
        ("overloaded", 529, True),
        ("api", 429, True),
        ("image", 400, False),
        ("api", 401, False),
    ]


async def test_break_raises_connection_error_after_the_blocks() -> None:
    model = ScriptedModel(
        [{"blocks": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "break_after": 1}]
    )
    events, err = await collect_error(model)
    assert sum(isinstance(e, BlockStop) for e in events) == 1
    assert not any(isinstance(e, MessageDelta | MessageStop) for e in events)
    assert (err.error.kind, err.error.retryable) == ("connection", True)


async def test_break_mid_block_leaves_a_started_tool_use() -> None:
    model = ScriptedModel(
        [
            {
                "blocks": [{"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "/a"}}],
                "break_after": 0,
                "break_mid_block": True,
            }
        ]
    )
    events, _ = await collect_error(model)
    assert any(isinstance(e, BlockStart) and e.block["type"] == "tool_use" for e in events)
    assert not any(isinstance(e, BlockStop) for e in events)


async def test_sse_errors_classified() -> None:
    model = ScriptedModel(
        [
            {"blocks": [{"type": "text", "text": "a"}], "sse_error": "overloaded_error"},
            {"blocks": [], "sse_error": {"type": "api_error", "message": "Internal server error"}},
            {"blocks": [], "sse_error": {"type": "invalid_request_error", "message": "prompt is too long"}},
            {"blocks": [], "sse_error": {"type": "rate_limit_error", "message": "slow down"}},
        ]
    )
    events, err = await collect_error(model)
    assert text_of(events) == "a"
    assert (err.error.kind, err.error.retryable) == ("overloaded", True)
    _, err = await collect_error(model)
    assert (err.error.kind, err.error.retryable) == ("stream_api_error", True)
    # any other type is a stream_error (the graph asks again only while nothing complete was shown)
    for message in ("prompt is too long", "slow down"):
        _, err = await collect_error(model)
        assert (err.error.kind, err.error.message, err.error.retryable) == ("stream_error", message, True)


async def test_max_retries_consumes_retryable_errors_like_the_sdk() -> None:
    script = [
        {"status": 529, "error_type": "overloaded_error", "message": "Overloaded"},
        {"status": 500, "error_type": "api_error", "message": "oops"},
        {"blocks": [{"type": "text", "text": "after retries"}]},
        {"status": 400, "error_type": "invalid_request_error", "message": "no"},
    ]
    model = ScriptedModel(script, max_retries=2)
    assert text_of(await collect(model)) == "after retries"
    assert model.count == 3 and len(model.requests) == 3
    _, err = await collect_error(model)  # not retryable: fails at once
    assert err.error.status == 400 and model.count == 4
    model = ScriptedModel(script, max_retries=1)
    _, err = await collect_error(model)
    assert err.error.status == 500 and model.count == 2


async def test_delays_are_honoured() -> None:
    resp = StreamedResponse(
        (ToolUseBlock("t", "Read", {}), TextBlock("after")), "tool_use", delay_s=0.2, block_delay_s=0.3
    )
    model = ScriptedModel([resp])
    t0 = time.monotonic()
    stamps: list[tuple[str, float]] = []
    async for ev in model.stream(request()):
        stamps.append((type(ev).__name__, time.monotonic() - t0))
    first_at = stamps[0][1]
    stops = [t for name, t in stamps if name == "BlockStop"]
    next_start = [t for name, t in stamps if name == "BlockStart"][1]
    assert first_at >= 0.18
    assert next_start - stops[0] >= 0.27  # the pause comes after the tool_use block is complete
    assert stamps[-1][1] >= 0.18 + 0.55


async def test_time_scale_zero_skips_delays() -> None:
    model = ScriptedModel([StreamedResponse((TextBlock("x"),), delay_s=5, block_delay_s=5)], time_scale=0)
    t0 = time.monotonic()
    await collect(model)
    assert time.monotonic() - t0 < 1


async def test_callable_source_sees_request_and_index() -> None:
    seen: list[tuple[str, int]] = []

    def script(req: ModelRequest, n: int) -> Any:
        seen.append((req.messages[-1]["content"], n))
        if n == 0:
            return tool_response("t0", "Read", {"file_path": "/x"})
        return {"blocks": [{"type": "text", "text": f"turn {n}"}]}

    model = ScriptedModel(script)
    await collect(model, request("one"))
    assert text_of(await collect(model, request("two"))) == "turn 1"
    assert seen == [("one", 0), ("two", 1)]


async def test_callable_returning_garbage_is_a_clear_error() -> None:
    model = ScriptedModel(lambda req, n: {"blocks": "nope"})
    with pytest.raises(ValueError, match=r"factory response 0\.blocks"):
        await collect(model)


def test_bad_source_type() -> None:
    with pytest.raises(TypeError):
        ScriptedModel(42)  # type: ignore[arg-type]


async def test_per_session_counts_each_user_id() -> None:
    model = ScriptedModel([text_response("first"), text_response("second")], per_session=True)
    assert text_of(await collect(model, request(user_id="a"))) == "first"
    assert text_of(await collect(model, request(user_id="b"))) == "first"
    assert text_of(await collect(model, request(user_id="a"))) == "second"
    assert model.count == 3


async def test_concurrent_streams_get_distinct_responses() -> None:
    model = ScriptedModel([text_response(f"r{i}", delay_s=0.01) for i in range(50)])
    texts = await asyncio.gather(*(collect(model) for _ in range(50)))
    assert sorted(text_of(t) for t in texts) == sorted(f"r{i}" for i in range(50))


def test_counter_is_thread_safe() -> None:
    model = ScriptedModel([text_response(str(i)) for i in range(400)])

    def worker() -> None:
        async def run() -> None:
            for _ in range(50):
                await collect(model)

        asyncio.run(run())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert model.count == 400 and len(model.requests) == 400


async def test_http_error_delay() -> None:
    model = ScriptedModel([HttpErrorResponse(500, "api_error", "x", delay_s=0.2)])
    t0 = time.monotonic()
    await collect_error(model)
    assert time.monotonic() - t0 >= 0.18
