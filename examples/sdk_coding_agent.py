"""A permission-gated coding agent, written against the Claude Agent SDK: an in-process MCP tool
(`run_tests`), a `can_use_tool` callback that lets file edits inside the project through and refuses
the shell, and a report of what was asked and done. Nothing in it knows which CLI runs it.

Offline: agentfsm's scripted Messages server plays the model. `python examples/sdk_coding_agent.py`
runs it with agentfsm; pass a CLI path (e.g. Claude Code's) as the first argument to run it there.
"""

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    TextBlock,
    create_sdk_mcp_server,
    tool,
)

sys.path.insert(0, str(Path(__file__).parent))
from sdk_dropin import agentfsm_cli

from agentfsm.testing import ScriptedServer
from agentfsm.testing.scenario import populate_workspace


def use(tool_id: str, name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


SCRIPT = [  # what the model does: read, edit, run the tests, try the shell, report
    {"blocks": [use("toolu_1", "Read", file_path="$WS/a.txt")], "stop_reason": "tool_use"},
    {"blocks": [use("toolu_2", "Edit", file_path="$WS/a.txt", old_string="ALPHA", new_string="BETA")],
     "stop_reason": "tool_use"},
    {"blocks": [use("toolu_3", "mcp__dev__run_tests", suite="unit")], "stop_reason": "tool_use"},
    {"blocks": [use("toolu_4", "Bash", command="rm -rf build", description="Clean the build")],
     "stop_reason": "tool_use"},
    {"blocks": [{"type": "text", "text": "Renamed ALPHA to BETA; the unit tests pass."}], "stop_reason": "end_turn"},
]


async def run(cli: str) -> list[str]:
    report: list[str] = []
    ws = populate_workspace(Path(tempfile.mkdtemp()) / "ws").resolve()
    home = ws.parent / "home"
    home.mkdir()

    @tool("run_tests", "Run the project's test suite", {"suite": str})
    async def run_tests(args: dict[str, Any]) -> dict[str, Any]:
        report.append(f"tests run: {args['suite']}")
        return {"content": [{"type": "text", "text": f"{args['suite']}: 2 passed"}]}

    async def gate(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        report.append(f"asked: {name} {ctx.description!r}")
        if name.startswith("mcp__dev__"):
            return PermissionResultAllow()
        if name in ("Edit", "Write") and Path(tool_input["file_path"]).resolve().is_relative_to(ws):
            return PermissionResultAllow()
        return PermissionResultDeny(message=f"{name} is not allowed in this agent")

    with ScriptedServer(SCRIPT, ws=str(ws)) as api:
        options = ClaudeAgentOptions(
            cli_path=cli, cwd=str(ws), model="claude-sonnet-4-5", tools=["Read", "Edit", "Bash"],
            mcp_servers={"dev": create_sdk_mcp_server("dev", tools=[run_tests])},
            can_use_tool=gate, setting_sources=[],
            env={"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "sk-scripted", "HOME": str(home),
                 "CLAUDE_CONFIG_DIR": str(home / ".claude"), "AGENTFSM_HOME": str(home / ".agentfsm"),
                 "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
        async with ClaudeSDKClient(options) as client:
            await client.query("Rename ALPHA to BETA in a.txt and run the unit tests")
            async for message in client.receive_response():
                if isinstance(message, AssistantMessage):
                    report += [f"assistant: {b.text}" for b in message.content if isinstance(b, TextBlock)]
                elif isinstance(message, ResultMessage):
                    report.append(f"result: {message.subtype} after {message.num_turns} turns, denied "
                                  f"{[d['tool_name'] for d in message.permission_denials]}")
    report.append(f"a.txt now: {(ws / 'a.txt').read_text().strip()!r}")
    return report


if __name__ == "__main__":
    print("\n".join(asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else agentfsm_cli()))))
