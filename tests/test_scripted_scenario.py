"""The scenario format: loading, validation, $WS, and the event sequence of a streamed response."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentfsm.llm.model import BlockDelta, BlockStart, BlockStop, MessageDelta, MessageStart, MessageStop
from agentfsm.testing import (
    EXHAUSTED_TEXT,
    HttpErrorResponse,
    RawToolJsonBlock,
    Scenario,
    ScenarioError,
    SseError,
    StreamedResponse,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    embedded_scenario_path,
    final_message,
    load_embedded_scenario,
    load_scenario,
    parse_response,
    populate_workspace,
    response_events,
    text_response,
    tool_response,
)

REFERENCE_NAMES = ["max_turns", "parallel_reads", "read_probe", "stop_hook", "thinking_only", "unknown_tool"]


def test_reference_scenarios_load(agentfsm_reference_dir: Path) -> None:
    for name in REFERENCE_NAMES:
        scenario = load_scenario(agentfsm_reference_dir / "scenarios" / f"{name}.json", "/ws")
        assert scenario.prompt
        assert scenario.responses
        assert "$WS" not in json.dumps(scenario.to_dict())


def test_read_probe_structure_and_ws(tmp_path: Path) -> None:
    scenario = load_embedded_scenario("read_probe", tmp_path)
    assert scenario.prompt == "AGENT_LOOP_INITIAL_MARKER"
    first, second = scenario.responses
    assert isinstance(first, StreamedResponse)
    assert first.stop_reason == "tool_use"
    assert first.blocks == (
        ToolUseBlock("toolu_agent_loop_probe", "Read", {"file_path": f"{tmp_path}/probe-fixture.txt"}),
    )
    assert second == text_response("TOOL_EXECUTION_OK")


def test_embedded_read_probe_is_the_reference_copy(agentfsm_reference_dir: Path) -> None:
    embedded = json.loads(embedded_scenario_path("read_probe").read_text())
    reference = json.loads((agentfsm_reference_dir / "scenarios" / "read_probe.json").read_text())
    assert embedded == reference


def test_response_for_past_the_end_is_exhausted() -> None:
    scenario = load_scenario({"prompt": "p", "responses": [{"blocks": [{"type": "text", "text": "one"}]}]})
    assert scenario.response_for(0) == text_response("one")
    for n in (1, 2, 50):
        resp = scenario.response_for(n)
        assert isinstance(resp, StreamedResponse)
        assert resp.blocks == (TextBlock(EXHAUSTED_TEXT),)
        assert resp.stop_reason == "end_turn"


def test_every_field_parses() -> None:
    raw = {
        "prompt": "P",
        "description": "all fields",
        "max_turns": 3,
        "responses": [
            {
                "blocks": [
                    {"type": "thinking", "thinking": "t", "signature": "sig"},
                    {"type": "text", "text": "hello"},
                    {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"file_path": "$WS/a.txt"}},
                    {"type": "raw_tool_json", "id": "tu2", "name": "Read", "json": '{"file_path": "$WS/b'},
                ],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 10, "output_tokens": 20},
                "delay_s": 0.5,
                "block_delay_s": 0.25,
                "break_after": 2,
                "break_mid_block": True,
            },
            {"blocks": [], "stop_reason": None, "sse_error": {"type": "api_error", "message": "boom"}},
            {"blocks": [{"type": "text", "text": "x"}], "sse_error": "overloaded_error"},
            {
                "status": 529,
                "error_type": "overloaded_error",
                "message": "Overloaded",
                "delay_s": 0.1,
                "retry_after_s": 0.01,
            },
            {
                "status": 400,
                "error_type": "invalid_request_error",
                "message": "prompt is too long: 1 > 0",
                "should_retry": False,
            },
        ],
    }
    s = load_scenario(raw, 'C:\\dir "x"')
    assert s.description == "all fields"
    assert s.meta == {"max_turns": 3}
    r0, r1, r2, r3, r4 = s.responses
    assert isinstance(r0, StreamedResponse)
    assert r0.blocks[0] == ThinkingBlock("t", "sig")
    assert r0.blocks[2] == ToolUseBlock("tu1", "Read", {"file_path": 'C:\\dir "x"/a.txt'})
    # In a raw JSON text the path is JSON-escaped, so the raw text parses to the same path.
    raw_block = r0.blocks[3]
    assert isinstance(raw_block, RawToolJsonBlock)
    assert json.loads(raw_block.json + '.txt"}') == {"file_path": 'C:\\dir "x"/b.txt'}
    assert (r0.usage, r0.delay_s, r0.block_delay_s, r0.break_after, r0.break_mid_block) == (
        {"input_tokens": 10, "output_tokens": 20},
        0.5,
        0.25,
        2,
        True,
    )
    assert r0.breaks and not r0.complete
    assert r1 == StreamedResponse((), None, sse_error=SseError("api_error", "boom"))
    assert not r1.breaks and not r1.complete
    assert r2 == StreamedResponse(
        (TextBlock("x"),), "end_turn", sse_error=SseError("overloaded_error", "Overloaded")
    )
    assert r3 == HttpErrorResponse(529, "overloaded_error", "Overloaded", 0.1, True, 0.01)
    assert r3.sdk_retries
    assert r4 == HttpErrorResponse(
        400, "invalid_request_error", "prompt is too long: 1 > 0", should_retry=False
    )
    assert not r4.sdk_retries
    # Lossless round trip through the JSON form.
    assert load_scenario(s.to_dict()) == s
    assert load_scenario(json.loads(json.dumps(s.to_dict()))) == s


def test_stop_reason_defaults_from_blocks() -> None:
    assert parse_response({"blocks": [{"type": "text", "text": "a"}]}).stop_reason == "end_turn"  # type: ignore[union-attr]
    tool = {"blocks": [{"type": "tool_use", "id": "a", "name": "Read"}]}
    assert parse_response(tool).stop_reason == "tool_use"  # type: ignore[union-attr]


def test_sdk_retry_rule() -> None:
    assert HttpErrorResponse(429, "rate_limit_error", "slow down").sdk_retries
    assert HttpErrorResponse(500, "api_error", "x").sdk_retries
    assert HttpErrorResponse(408, "timeout_error", "x").sdk_retries
    assert not HttpErrorResponse(400, "invalid_request_error", "x").sdk_retries
    assert not HttpErrorResponse(529, "overloaded_error", "x", should_retry=False).sdk_retries
    assert HttpErrorResponse(529, "overloaded_error", "x").should_retry is True


def test_records_and_dicts_mix_in_a_list() -> None:
    s = load_scenario([tool_response("t", "Read", {"file_path": "$WS/a.txt"}), {"blocks": []}], "/w")
    assert s.prompt == ""
    assert s.responses[0] == tool_response("t", "Read", {"file_path": "/w/a.txt"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"prompt": "p"}, "'responses' is a required property"),
        ({"prompt": 3, "responses": []}, "scenario.prompt: 3 is not of type 'string'"),
        ({"responses": [{"blocks": [{"type": "txt", "text": "a"}]}]}, "responses[0].blocks[0].type: 'txt'"),
        (
            {"responses": [{"blocks": [{"type": "text"}]}]},
            "responses[0].blocks[0]: 'text' is a required property",
        ),
        (
            {"responses": [{"blocks": [{"type": "tool_use", "id": "a", "name": "R", "input": []}]}]},
            "responses[0].blocks[0].input: [] is not of type 'object'",
        ),
        ({"responses": [{"blocks": [], "stop_reasn": "end_turn"}]}, "Additional properties are not allowed"),
        (
            {"responses": [{"blocks": [], "stop_reason": "done"}]},
            "responses[0].stop_reason: 'done' is not one of",
        ),
        ({"responses": [{"blocks": [], "delay_s": -1}]}, "responses[0].delay_s: -1 is less than the minimum"),
        ({"responses": [{"status": 200, "error_type": "x", "message": "m"}]}, "responses[0].status: 200"),
        ({"responses": [{"status": 500, "message": "m"}]}, "'error_type' is a required property"),
        (
            {"responses": [{"blocks": [{"type": "text", "text": "a"}], "break_after": 2}]},
            "break_after: 2 is more than the 1 blocks",
        ),
        (
            {"responses": [{"blocks": [{"type": "text", "text": "a"}], "break_mid_block": True}]},
            "break_mid_block: needs break_after",
        ),
        ({"responses": ["text"]}, "responses[0]: 'text' is not of type 'object'"),
        ([{"blocks": 1}], "responses[0].blocks: 1 is not of type 'array'"),
    ],
)
def test_validation_errors_name_the_field(raw: object, message: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        load_scenario(raw)  # type: ignore[arg-type]
    assert message in str(exc.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ScenarioError, match=r"bad\.json: not JSON"):
        load_scenario(bad)
    top = tmp_path / "list.json"
    top.write_text("[1]")
    with pytest.raises(ScenarioError, match=r"list\.json\.responses\[0\]"):
        load_scenario(top)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('"x"')
    with pytest.raises(ScenarioError, match="expected an object"):
        load_scenario(wrong)


def test_populate_workspace(tmp_path: Path) -> None:
    ws = populate_workspace(tmp_path / "w")
    assert (ws / "probe-fixture.txt").read_text().strip() == "AGENT_LOOP_FILE_MARKER"
    assert (ws / "a.txt").read_text().strip() == "ALPHA"
    assert (ws / "b.txt").read_text().strip() == "BETA"


# --- events ------------------------------------------------------------------------------------


def _accumulate(events: list) -> dict:
    """Rebuild the message from records the way a consumer does."""
    blocks: dict[int, dict] = {}
    raw_json: dict[int, str] = {}
    out: dict = {"stop_reason": "<none>", "done": False}
    for ev in events:
        r = ev.record
        if isinstance(r, MessageStart):
            out["model"], out["id"] = r.model, r.message_id
        elif isinstance(r, BlockStart):
            blocks[r.index] = dict(r.block)
            raw_json[r.index] = ""
        elif isinstance(r, BlockDelta):
            d = r.delta
            b = blocks[r.index]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] += d["signature"]
            else:
                raw_json[r.index] += d["partial_json"]
        elif isinstance(r, BlockStop):
            if blocks[r.index]["type"] == "tool_use":
                blocks[r.index]["input"] = raw_json[r.index]
            blocks[r.index]["stopped"] = True
        elif isinstance(r, MessageDelta):
            out["stop_reason"] = r.stop_reason
        elif isinstance(r, MessageStop):
            out["done"] = True
    out["blocks"] = [blocks[i] for i in sorted(blocks)]
    return out


def test_events_of_every_block_kind() -> None:
    resp = StreamedResponse(
        blocks=(
            ThinkingBlock("let me think about it", "sig-1"),
            TextBlock("Reading the file now, please wait."),
            ToolUseBlock("tu1", "Read", {"file_path": "/w/a.txt", "limit": 5}),
            RawToolJsonBlock("tu2", "Read", '{"file_path": "/w/b'),
        ),
        stop_reason="tool_use",
    )
    events = response_events(resp, "claude-test", input_tokens=123, message_id="msg_1")
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "ping"]
    assert types[-2:] == ["message_delta", "message_stop"]
    assert types.count("content_block_start") == types.count("content_block_stop") == 4
    # Every wire payload names its own event type, and is JSON.
    for e in events:
        assert e.data["type"] == e.type
        frame = e.sse().decode()
        assert frame.startswith(f"event: {e.type}\ndata: ") and frame.endswith("\n\n")
        assert json.loads(frame.split("data: ", 1)[1]) == e.data
    start = events[0]
    assert start.data["message"]["usage"]["input_tokens"] == 123
    assert start.record == MessageStart("claude-test", start.data["message"]["usage"], "msg_1")
    assert events[1].record is None
    # Text comes in several deltas; tool JSON opens with an empty partial_json.
    text_deltas = [e for e in events if e.data.get("delta", {}).get("type") == "text_delta"]
    assert len(text_deltas) > 1
    json_deltas = [
        e.data["delta"]["partial_json"]
        for e in events
        if e.data.get("delta", {}).get("type") == "input_json_delta" and e.data["index"] == 2
    ]
    assert json_deltas[0] == "" and len(json_deltas) > 2
    got = _accumulate(events)
    assert got["done"] and got["stop_reason"] == "tool_use" and got["model"] == "claude-test"
    thinking, text, tool, raw = got["blocks"]
    assert (thinking["thinking"], thinking["signature"]) == ("let me think about it", "sig-1")
    assert text["text"] == "Reading the file now, please wait."
    assert json.loads(tool["input"]) == {"file_path": "/w/a.txt", "limit": 5}
    assert (tool["id"], tool["name"]) == ("tu1", "Read")
    assert raw["input"] == '{"file_path": "/w/b'
    delta = events[-2]
    assert delta.data["usage"]["output_tokens"] >= 1
    assert delta.record == MessageDelta("tool_use", {"output_tokens": delta.data["usage"]["output_tokens"]})


def test_block_delay_pauses_after_each_stop_only() -> None:
    resp = StreamedResponse((TextBlock("a"), TextBlock("b")), block_delay_s=0.7)
    events = response_events(resp, "m")
    assert [e.pause_s for e in events if e.pause_s] == [0.7, 0.7]
    assert all(e.type == "content_block_stop" for e in events if e.pause_s)


def test_usage_overrides() -> None:
    resp = StreamedResponse(
        (TextBlock("a"),), usage={"input_tokens": 7, "output_tokens": 9, "cache_read_input_tokens": 3}
    )
    events = response_events(resp, "m", input_tokens=1000)
    assert events[0].data["message"]["usage"]["input_tokens"] == 7
    assert events[0].data["message"]["usage"]["cache_read_input_tokens"] == 3
    assert events[-2].data["usage"] == {"output_tokens": 9}


def test_break_after_and_mid_block() -> None:
    blocks = (TextBlock("one"), ToolUseBlock("t", "Read", {"file_path": "/x"}))
    cut = response_events(StreamedResponse(blocks, "tool_use", break_after=1), "m")
    assert [e.type for e in cut][-1] == "content_block_stop"
    assert not any(e.type in ("message_delta", "message_stop") for e in cut)
    mid = response_events(StreamedResponse(blocks, "tool_use", break_after=1, break_mid_block=True), "m")
    assert [e.type for e in mid][-2:] == ["content_block_start", "content_block_delta"]
    got = _accumulate(mid)
    assert not got["done"] and "stopped" not in got["blocks"][1]
    zero = response_events(StreamedResponse(blocks, "tool_use", break_after=0), "m")
    assert [e.type for e in zero] == ["message_start", "ping"]


def test_sse_error_is_the_last_event() -> None:
    resp = StreamedResponse(
        (TextBlock("a"), TextBlock("b")), sse_error=SseError("overloaded_error", "Overloaded")
    )
    events = response_events(resp, "m")
    assert events[-1].type == "error"
    assert events[-1].data == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    assert events[-1].record is None
    assert [e.type for e in events].count("content_block_stop") == 2
    early = response_events(attrs_evolve(resp, break_after=1), "m")
    assert [e.type for e in early].count("content_block_stop") == 1 and early[-1].type == "error"


def attrs_evolve(resp: StreamedResponse, **kw: object) -> StreamedResponse:
    import attrs

    return attrs.evolve(resp, **kw)


def test_final_message_for_non_streamed_requests() -> None:
    resp = StreamedResponse((TextBlock("hi"), RawToolJsonBlock("t", "Read", "{bad")), "tool_use")
    msg = final_message(resp, "m", input_tokens=5, message_id="msg_x")
    assert msg["content"] == [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "t", "name": "Read", "input": {}},
    ]
    assert (msg["id"], msg["model"], msg["stop_reason"], msg["usage"]["input_tokens"]) == (
        "msg_x",
        "m",
        "tool_use",
        5,
    )


def test_records_check_their_cut_points() -> None:
    with pytest.raises(ScenarioError, match="break_after: 3 is more than the 1 blocks"):
        StreamedResponse((TextBlock("a"),), break_after=3)
    with pytest.raises(ScenarioError, match="break_mid_block"):
        StreamedResponse((TextBlock("a"),), break_mid_block=True)
    assert StreamedResponse([TextBlock("a")]).blocks == (TextBlock("a"),)  # type: ignore[arg-type]


def test_scenario_is_a_value() -> None:
    a = load_scenario(
        {
            "prompt": "p",
            "responses": [{"blocks": [{"type": "tool_use", "id": "i", "name": "n", "input": {"k": [1, 2]}}]}],
        }
    )
    b = Scenario("p", (tool_response("i", "n", {"k": [1, 2]}),))
    assert a == b
    # The record holds its own copy of the input.
    source = {"k": [1]}
    block = ToolUseBlock("i", "n", source)
    source["k"].append(2)
    assert block.input == {"k": [1]}
