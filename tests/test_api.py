"""The Python API: ``agentfsm.query`` and ``agentfsm.AgentClient`` yield the messages the CLI prints."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

import agentfsm
from agentfsm.api import InputError, parse_input
from agentfsm.machine.options import Options
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, tool

READ = {"blocks": [{"type": "tool_use", "id": "toolu_r", "name": "Read",
                    "input": {"file_path": "$WS/probe-fixture.txt"}}]}


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], **kw}


def options(ws: Path, **kw: Any) -> Options:
    kw.setdefault("tools", ("Read",))
    return Options(permission_mode="bypassPermissions", cwd=ws, sessions_dir=ws.parent / "sessions",
                   setting_sources=(), **kw)


def user(content: Any, uid: str | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": "user", "message": {"role": "user", "content": content}}
    if uid:
        msg["uuid"] = uid
    return msg


async def test_query_yields_the_stream_json_messages(agentfsm_workspace: Path) -> None:
    model = ScriptedModel([READ, text("TOOL_EXECUTION_OK")], ws=agentfsm_workspace)
    msgs = [m async for m in agentfsm.query("read it", options=options(agentfsm_workspace), client=model)]
    assert [m["type"] for m in msgs] == ["system", "assistant", "user", "assistant", "result"]
    init, result = msgs[0], msgs[-1]
    assert init["subtype"] == "init" and init["tools"] == ["Read"]
    assert result["subtype"] == "success" and result["result"] == "TOOL_EXECUTION_OK"
    assert {m["session_id"] for m in msgs} == {init["session_id"]}
    assert "AGENT_LOOP_FILE_MARKER" in json.dumps(msgs[2])
    # the same dicts the CLI prints: JSON-serialisable as they are
    json.dumps(msgs)


async def test_query_resumes_a_session(agentfsm_workspace: Path) -> None:
    model = ScriptedModel([text("FIRST"), text("SECOND")])
    opts = options(agentfsm_workspace)
    first = [m async for m in agentfsm.query("ONE", options=opts, client=model)]
    sid = first[-1]["session_id"]
    resumed = [m async for m in agentfsm.query("TWO", options=attrs.evolve(opts, resume=sid), client=model)]
    assert resumed[-1]["session_id"] == sid and resumed[-1]["result"] == "SECOND"
    texts = [b["text"] for m in model.bodies[1]["messages"] for b in m["content"]]
    assert texts == ["ONE", "FIRST", "TWO"]


async def test_query_with_streamed_input_queues_later_messages(agentfsm_workspace: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    schema = {"type": "object", "properties": {}, "additionalProperties": False}

    @tool("Slow", "Waits until released.", schema)
    async def slow(input: Mapping[str, Any], ctx: ToolContext) -> str:
        started.set()
        await release.wait()
        return "SLOW_DONE"

    async def inputs() -> AsyncIterator[dict[str, Any]]:
        yield user("FIRST_MESSAGE", "uuid-1")
        await started.wait()  # the run is in its slow tool now
        yield user([{"type": "text", "text": "SECOND_MESSAGE"}], "uuid-2")
        release.set()

    slow_call = {"blocks": [{"type": "tool_use", "id": "toolu_s", "name": "Slow", "input": {}}]}
    model = ScriptedModel([slow_call, text("ALL_DONE")])
    opts = options(agentfsm_workspace, tools=(), extra_tools=(slow,))
    msgs = [m async for m in agentfsm.query(inputs(), options=opts, client=model)]
    assert msgs[-1]["type"] == "result" and msgs[-1]["result"] == "ALL_DONE"
    assert [m["type"] for m in msgs].count("result") == 1
    life = [(m["uuid"], m["state"]) for m in msgs if m.get("subtype") == "command_lifecycle"]
    assert [s for u, s in life if u == "uuid-1"] == ["queued", "started", "completed"]
    assert [s for u, s in life if u == "uuid-2"] == ["queued", "started", "completed"]
    assert "SECOND_MESSAGE" in json.dumps(model.bodies[1]["messages"][-1])


async def test_agent_client_multi_turn_interrupt_and_queue(agentfsm_workspace: Path) -> None:
    started = asyncio.Event()
    schema = {"type": "object", "properties": {}, "additionalProperties": False}

    @tool("Hang", "Never returns on its own.", schema, interrupt="cancel")
    async def hang(input: Mapping[str, Any], ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    hang_call = {"blocks": [{"type": "tool_use", "id": "toolu_h", "name": "Hang", "input": {}}]}
    model = ScriptedModel([text("HELLO_BACK"), text("SECOND_ANSWER"), hang_call, text("AFTER_INTERRUPT")])
    opts = options(agentfsm_workspace, tools=(), extra_tools=(hang,))
    async with agentfsm.AgentClient(opts, client=model) as agent:
        first_uuid = await agent.send("HELLO")
        msgs = [m async for m in agent.receive()]
        assert msgs[-1]["result"] == "HELLO_BACK"
        assert [m["state"] for m in msgs if m.get("uuid") == first_uuid] == ["queued", "started", "completed"]
        await agent.send("AGAIN")
        msgs = [m async for m in agent.receive()]
        assert msgs[-1]["result"] == "SECOND_ANSWER"
        assert [b["text"] for m in model.bodies[1]["messages"] for b in m["content"]] == [
            "HELLO", "HELLO_BACK", "AGAIN"]
        # interrupt a run stuck in a tool
        await agent.send("HANG_PLEASE")
        await asyncio.wait_for(started.wait(), 5)
        late = await agent.send("WHILE_HANGING")  # queued: the run is busy
        await agent.interrupt()
        msgs = [m async for m in agent.receive()]
        result = msgs[-1]
        assert result["type"] == "result" and result["is_error"]
        assert result["terminal_reason"].startswith("aborted")
        # the input queued during the interrupted run starts the next run
        msgs = [m async for m in agent.receive()]
        assert msgs[-1]["result"] == "AFTER_INTERRUPT"
        assert [m["state"] for m in msgs if m.get("uuid") == late][-1] == "completed"
        sid = agent.session_id
    assert all(m.get("session_id", sid) == sid for m in msgs)


async def test_agent_client_teardown_discards_unrun_input(agentfsm_workspace: Path) -> None:
    started = asyncio.Event()
    schema = {"type": "object", "properties": {}, "additionalProperties": False}

    @tool("Hang", "Never returns on its own.", schema, interrupt="cancel")
    async def hang(input: Mapping[str, Any], ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    hang_call = {"blocks": [{"type": "tool_use", "id": "toolu_h", "name": "Hang", "input": {}}]}
    model = ScriptedModel([hang_call])
    agent = agentfsm.AgentClient(options(agentfsm_workspace, tools=(), extra_tools=(hang,)), client=model)
    await agent.connect()
    await agent.send("ONE")
    await asyncio.wait_for(started.wait(), 5)
    extra = await agent.send("TWO")
    await asyncio.wait_for(agent.close(), 5)
    states = []
    while not agent._messages.empty():
        m = agent._messages.get_nowait()
        if isinstance(m, dict) and m.get("uuid") == extra:
            states.append(m["state"])
    assert states == ["queued", "discarded"]
    assert len(model.bodies) == 1
    with pytest.raises(RuntimeError):
        await agent.send("THREE")


def test_parse_input() -> None:
    assert parse_input(user("hi", "u")) == ("user", "hi", "u")
    blocks = [{"type": "text", "text": "x"}]
    assert parse_input(user(blocks)) == ("user", blocks, None)
    kind, body, rid = parse_input({"type": "control_request", "request_id": "r1",
                                   "request": {"subtype": "interrupt"}})
    assert (kind, body["subtype"], rid) == ("control", "interrupt", "r1")
    bad_ones = ([], {"type": "assistant"}, user(""), user([{"text": "no type"}]), {"type": "control_request"})
    for bad in bad_ones:
        with pytest.raises(InputError):
            parse_input(bad)


def test_import_fsm_stays_cheap() -> None:
    code = ("import sys, fsm; heavy = [m for m in ('agentfsm.api', 'agentfsm.sessions.session', 'anthropic', "
            "'agentfsm.runtime.driver') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert agentfsm.query.__module__ == "agentfsm.api" and agentfsm.AgentClient.__module__ == "agentfsm.api"


@pytest.mark.parametrize("budget", [0, -5, True, 2.5, "100"])
def test_a_task_budget_must_be_a_positive_token_count(budget: Any) -> None:
    from agentfsm.machine.options import Options

    with pytest.raises(ValueError, match="task_budget must be a positive number of tokens"):
        Options(task_budget=budget)
    assert Options(task_budget=1).task_budget == 1
