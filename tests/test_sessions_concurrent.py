"""Many sessions in one process: 50 concurrent sessions against one loopback scripted server (each
session gets the whole scenario: ``per_session`` counts requests by ``metadata.user_id``), sharing
one transport; each completes with its own history. ``bench/sessions.py`` runs 1,000."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import agentfsm
from agentfsm.llm.transport import AnthropicTransport
from agentfsm.machine.options import Options
from agentfsm.runtime.trace import read_records
from agentfsm.testing.server import ScriptedServer

pytestmark = pytest.mark.server

N = 50
READ = {"blocks": [{"type": "tool_use", "id": "toolu_read", "name": "Read",
                    "input": {"file_path": "$WS/probe-fixture.txt"}}]}
DONE = {"blocks": [{"type": "text", "text": "TOOL_EXECUTION_OK"}]}


async def test_fifty_concurrent_sessions_each_with_its_own_history(agentfsm_workspace: Path,
                                                                   tmp_path: Path) -> None:
    with ScriptedServer([READ, DONE], ws=agentfsm_workspace, per_session=True) as server:
        transport = AnthropicTransport(api_key="sk-test", base_url=server.base_url, max_retries=0)
        options = Options(tools=("Read",), cwd=agentfsm_workspace, sessions_dir=tmp_path / "sessions",
                          setting_sources=())

        async def one(i: int) -> list[dict[str, Any]]:
            return [m async for m in agentfsm.query(f"PROMPT_{i}", options=options, client=transport)]

        try:
            runs = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(N))), 120)
        finally:
            await transport.aclose()
        all_bodies = server.requests
    assert len(all_bodies) == 2 * N
    ids = set()
    for i, msgs in enumerate(runs):
        result = msgs[-1]
        assert result["type"] == "result" and result["subtype"] == "success", result
        assert result["result"] == "TOOL_EXECUTION_OK" and result["num_turns"] == 2
        sid = result["session_id"]
        ids.add(sid)
        assert {m["session_id"] for m in msgs} == {sid}
        bodies = [b for b in all_bodies if b["metadata"]["user_id"] == f"session_{sid}"]
        assert len(bodies) == 2
        # its own prompt, its own tool exchange, nobody else's
        second = bodies[1]["messages"]
        assert second[0]["content"] == [{"type": "text", "text": f"PROMPT_{i}"}]
        assert [m["role"] for m in second] == ["user", "assistant", "user"]
        assert "AGENT_LOOP_FILE_MARKER" in json.dumps(second[2])
        prompts = {b["text"] for body in bodies for m in body["messages"] if m["role"] == "user"
                   for b in m["content"] if b["type"] == "text"}
        assert prompts == {f"PROMPT_{i}"}
        records = list(read_records(tmp_path / "sessions" / f"{sid}.jsonl"))
        assert records[0]["session_id"] == sid and records[-1]["type"] == "result"
    assert len(ids) == N
