"""``--include-partial-messages`` (the Agent SDK's ``include_partial_messages``): every raw stream event
as a ``stream_event`` message and a ``system``/``status`` before every request, as Claude Code 2.1.332
prints them (compared with it through the SDK in ``tests/test_sdk_dropin.py``). Checked over generated
conversations: the events of each response add up to the blocks the loop showed for it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.api import query
from agentfsm.machine.options import Options
from agentfsm.testing import ScriptedModel
from agentfsm.testing.strategies import malformed_responses, text_responses, tool_call_responses, unique_tool_ids
from agentfsm.tools.base import tool


@tool("Echo", "Repeat the text.", {
    "type": "object", "properties": {"text": {"type": "string", "maxLength": 20}},
    "required": ["text"], "additionalProperties": False,
}, concurrency_safe=True)
async def echo(inp: Mapping[str, Any], ctx: Any) -> str:
    return str(inp["text"])


def _run(script: list[Any], tmp: Path) -> tuple[list[dict[str, Any]], ScriptedModel]:
    model = ScriptedModel(script)
    options = Options(tools=(), extra_tools=(echo,), permission_mode="bypassPermissions", cwd=tmp,
                      sessions_dir=tmp / "sessions", setting_sources=(), include_partial_messages=True)

    async def go() -> list[dict[str, Any]]:
        return [m async for m in query("Go.", options=options, client=model)]

    return asyncio.run(go()), model


def _rebuilt(events: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The blocks a response's wire events describe, in index order."""
    blocks: dict[int, dict[str, Any]] = {}
    raw: dict[int, str] = {}
    for ev in events:
        if ev["type"] == "content_block_start":
            blocks[ev["index"]] = dict(ev["content_block"])
            raw[ev["index"]] = ""
        elif ev["type"] == "content_block_delta":
            block, delta = blocks[ev["index"]], ev["delta"]
            if delta["type"] == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta["type"] == "input_json_delta":
                raw[ev["index"]] += delta["partial_json"]
    for i, block in blocks.items():
        if block.get("type") == "tool_use" and raw[i]:
            try:
                parsed = json.loads(raw[i])
            except ValueError:
                parsed = None
            # input that is not a JSON object is shown as what the loop made of it; not compared
            block["input"] = parsed if isinstance(parsed, dict) else None
    return [blocks[i] for i in sorted(blocks)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(first=st.lists(st.one_of(tool_call_responses([echo], valid=None, max_calls=3), malformed_responses()),
                      max_size=3),
       last=text_responses())
def test_stream_events_add_up_to_the_blocks_shown(first: list[Any], last: Any, tmp_path: Path) -> None:
    messages, model = _run(unique_tool_ids([*first, last]), tmp_path)
    kinds = [m["type"] if m["type"] != "system" else f"system:{m['subtype']}" for m in messages]
    # one status per request, before it
    assert kinds.count("system:status") == len(model.requests)
    starts = [i for i, k in enumerate(kinds) if k == "stream_event"
              and messages[i]["event"]["type"] == "message_start"]
    assert all("system:status" in kinds[:i] for i in starts)
    by_id: dict[str, list[Mapping[str, Any]]] = {}
    shown: dict[str, list[Mapping[str, Any]]] = {}
    for i, m in enumerate(messages):
        if m["type"] == "stream_event":
            assert m["parent_tool_use_id"] is None and m["session_id"] == messages[-1]["session_id"]
            by_id.setdefault(m["api_message_id"], []).append(m["event"])
            if m["event"]["type"] == "content_block_stop":
                # the block itself was shown just before the event that closes it
                assert messages[i - 1]["type"] == "assistant", kinds[max(0, i - 3):i + 1]
        elif m["type"] == "assistant" and m.get("parent_tool_use_id") is None:
            shown.setdefault(m["message"]["id"], []).extend(m["message"]["content"])
    assert by_id and set(shown) <= set(by_id)
    for message_id, events in by_id.items():
        assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
        rebuilt = _rebuilt(events)
        seen = shown.get(message_id, [])
        assert [b["type"] for b in rebuilt] == [b["type"] for b in seen]
        for wire, block in zip(rebuilt, seen, strict=True):
            for key in ("text", "thinking", "name"):
                assert wire.get(key) == block.get(key)
            if wire.get("type") == "tool_use" and wire.get("input") is not None:
                assert wire["input"] == block["input"]


def test_without_the_option_nothing_partial_is_shown(tmp_path: Path) -> None:
    from agentfsm.testing import text_response

    model = ScriptedModel([text_response("Done.")])
    options = Options(tools=(), permission_mode="bypassPermissions", cwd=tmp_path,
                      sessions_dir=tmp_path / "sessions", setting_sources=())

    async def go() -> list[dict[str, Any]]:
        return [m async for m in query("Go.", options=options, client=model)]

    kinds = {(m["type"], m.get("subtype")) for m in asyncio.run(go())}
    assert ("stream_event", None) not in kinds and ("system", "status") not in kinds


def test_the_cli_wants_stream_json_for_partial_messages(tmp_path: Path) -> None:
    agentfsm = str(Path(sys.executable).with_name("agentfsm"))
    for fmt in ("text", "json"):
        out = subprocess.run([agentfsm, "-p", "hi", "--output-format", fmt, "--include-partial-messages",
                              "--scripted", "read_probe", "--cwd", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and out.stdout == ""
        assert "--include-partial-messages requires --print and --output-format=stream-json." in out.stderr
    out = subprocess.run([agentfsm, "-p", "hi", "--output-format", "stream-json", "--verbose",
                          "--include-partial-messages", "--temporal", "127.0.0.1:1", "--cwd", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "--include-partial-messages is not supported with --temporal" in out.stderr
    out = subprocess.run([agentfsm, "-p", "hi", "--output-format", "stream-json", "--verbose",
                          "--include-partial-messages", "--scripted", "read_probe", "--cwd", str(tmp_path),
                          "--sessions-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert out.returncode == 0 and lines[-1]["type"] == "result"
    events = [m for m in lines if m["type"] == "stream_event"]
    assert events and all(isinstance(m.get("uuid"), str) and m["api_message_id"] for m in events)
    assert "ttft_ms" in events[0] and events[0]["event"]["type"] == "message_start"
