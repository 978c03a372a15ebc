"""An MCP server's tool in the loop: what its ``readOnlyHint`` annotation decides — whether the call
may overlap others and whether the user's interrupt cancels it (a read-only call is cancelled; a call
that may change things is let finish, as for any ``block`` tool)."""

from __future__ import annotations

import asyncio
from typing import Any

from agentfsm.runtime.executor import StreamingToolExecutor
from agentfsm.runtime.ports import AllowAllGate
from agentfsm.tools.mcp import McpServerConfig, McpTool


class HeldServer:
    """A connection stand-in whose calls wait until released (a slow remote tool)."""

    def __init__(self) -> None:
        self.config = McpServerConfig("srv", "stdio", command="unused")
        self.release = asyncio.Event()
        self.started: list[str] = []
        self.finished: list[str] = []

    async def call(self, name: str, arguments: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
        self.started.append(tool_use_id)
        await self.release.wait()
        self.finished.append(tool_use_id)
        return {"content": [{"type": "text", "text": f"{name} done"}]}


def listed(name: str, read_only: bool | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "inputSchema": {"type": "object", "properties": {}}}
    if read_only is not None:
        out["annotations"] = {"readOnlyHint": read_only}
    return out


async def test_an_interrupt_cancels_a_read_only_mcp_call_and_lets_a_writing_one_finish() -> None:
    server = HeldServer()
    tools = [McpTool(server, listed("lookup", True)), McpTool(server, listed("deploy", False))]  # type: ignore[arg-type]
    ex = StreamingToolExecutor(tools, gate=AllowAllGate())
    ex.add_tool({"type": "tool_use", "id": "r", "name": "mcp__srv__lookup", "input": {}})
    for _ in range(20):
        await asyncio.sleep(0)
    assert server.started == ["r"] and ex.interruptible
    assert ex.interrupt() == ["r"]
    [read] = await asyncio.wait_for(ex.remaining(), 2)
    assert read.interrupted and server.finished == []

    server = HeldServer()
    tools = [McpTool(server, listed("lookup", True)), McpTool(server, listed("deploy", None))]  # type: ignore[arg-type]
    ex = StreamingToolExecutor(tools, gate=AllowAllGate())
    ex.add_tool({"type": "tool_use", "id": "w", "name": "mcp__srv__deploy", "input": {}})
    for _ in range(20):
        await asyncio.sleep(0)
    assert server.started == ["w"] and not ex.interruptible
    assert ex.interrupt() == []
    server.release.set()
    [write] = await asyncio.wait_for(ex.remaining(), 2)
    assert not write.interrupted and not write.is_error and write.block["content"] == [
        {"type": "text", "text": "deploy done"}]
