"""agentfsm as the Claude Agent SDK's CLI: one line (`cli_path`) changes, the rest is plain SDK code.

Runs offline: the scripted Messages server of agentfsm's testing kit stands in for the API (drop the
`ScriptedServer` block and set ANTHROPIC_API_KEY to talk to the real one).

    pip install 'agentfsm' claude-agent-sdk && python examples/sdk_dropin.py
"""

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, ResultMessage, TextBlock, query

from agentfsm.testing import ScriptedServer
from agentfsm.testing.scenario import scenario_path


def agentfsm_cli() -> str:
    """The `agentfsm` executable, found explicitly: next to this Python (a venv that is not activated
    still has it there), then on PATH. Without it the SDK would silently run its own bundled Claude
    Code (cli_path=None) and this example would print a success that agentfsm never produced."""
    beside = Path(sys.executable).with_name("agentfsm")
    if beside.is_file():
        return str(beside)
    found = shutil.which("agentfsm")
    if found is None:
        sys.exit(f"agentfsm executable not found: neither {beside} nor on PATH. "
                 "Install agentfsm into this Python (pip install agentfsm) or activate its venv.")
    return found


async def main() -> None:
    cli = agentfsm_cli()
    ws = Path(tempfile.mkdtemp())
    (ws / "notes.txt").write_text("Buy milk.\n")
    # read_a_file ships with agentfsm: one Read of notes.txt, then an answer
    with ScriptedServer(scenario_path("read_a_file"), ws=str(ws)) as api:
        options = ClaudeAgentOptions(
            cli_path=cli,  # <- the one line: the loop is agentfsm's
            cwd=str(ws), allowed_tools=["Read"],
            env={"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "sk-scripted"})
        async for message in query(prompt="What does notes.txt say?", options=options):
            if isinstance(message, AssistantMessage):
                for block in message.content:
                    print("assistant:", block.text if isinstance(block, TextBlock) else block)
            elif isinstance(message, ResultMessage):
                print("result:", message.subtype, message.result, f"({message.num_turns} turns)")


if __name__ == "__main__":
    asyncio.run(main())
