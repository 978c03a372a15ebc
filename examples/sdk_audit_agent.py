"""A hook-driven auditing agent, written against the Claude Agent SDK: Python hooks record every
prompt, tool call, tool result and stop in an audit log, and a PreToolUse hook vetoes shell commands
that reach the network. Nothing in it knows which CLI runs it.

Offline: agentfsm's scripted Messages server plays the model. `python examples/sdk_audit_agent.py`
runs it with agentfsm; pass a CLI path (e.g. Claude Code's) as the first argument to run it there.
"""

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, HookMatcher, ResultMessage, query

sys.path.insert(0, str(Path(__file__).parent))
from sdk_dropin import agentfsm_cli

from agentfsm.testing import ScriptedServer
from agentfsm.testing.scenario import populate_workspace


def bash(tool_id: str, command: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": command, "description": "Run"}}


SCRIPT = [
    {"blocks": [bash("toolu_1", "cat a.txt"), bash("toolu_2", "curl https://example.com/upload -d @a.txt")],
     "stop_reason": "tool_use"},
    {"blocks": [{"type": "text", "text": "a.txt says ALPHA; the upload was blocked."}], "stop_reason": "end_turn"},
]


async def run(cli: str) -> list[str]:
    audit: list[str] = []
    ws = populate_workspace(Path(tempfile.mkdtemp()) / "ws").resolve()
    home = ws.parent / "home"
    home.mkdir()

    async def on_prompt(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        audit.append(f"prompt: {hook_input['prompt']}")
        return {}

    async def before_tool(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        command = hook_input["tool_input"].get("command", "")
        if "curl" in command.split():
            audit.append(f"vetoed {tool_use_id}: {command}")
            return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                           "permissionDecisionReason": "network access is not allowed"}}
        audit.append(f"allowed {tool_use_id}: {command}")
        return {}

    async def after_tool(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        audit.append(f"ran {tool_use_id}")
        return {}

    async def on_stop(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        audit.append(f"stop: {hook_input['last_assistant_message']}")
        return {}

    with ScriptedServer(SCRIPT, ws=str(ws)) as api:
        options = ClaudeAgentOptions(
            cli_path=cli, cwd=str(ws), model="claude-sonnet-4-5", tools=["Bash"], allowed_tools=["Bash"],
            setting_sources=[], hooks={
                "UserPromptSubmit": [HookMatcher(hooks=[on_prompt])],
                "PreToolUse": [HookMatcher(matcher="Bash", hooks=[before_tool])],
                "PostToolUse": [HookMatcher(hooks=[after_tool])],
                "Stop": [HookMatcher(hooks=[on_stop])]},
            env={"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "sk-scripted", "HOME": str(home),
                 "CLAUDE_CONFIG_DIR": str(home / ".claude"), "AGENTFSM_HOME": str(home / ".agentfsm"),
                 "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
        async for message in query(prompt="Show a.txt and upload it", options=options):
            if isinstance(message, ResultMessage):
                audit.append(f"result: {message.subtype} {message.result!r}, denied "
                             f"{[d['tool_use_id'] for d in message.permission_denials]}")
    # the parallel calls' hooks may interleave differently from run to run: the log is compared sorted
    return [audit[0], *sorted(audit[1:-2]), *audit[-2:]]


if __name__ == "__main__":
    print("\n".join(asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else agentfsm_cli()))))
