"""A multi-turn `ClaudeSDKClient` session, written against the Claude Agent SDK: two prompts in one
session, an interrupt while the model is still answering, a prompt after it, and the session resumed
later by a new client. Nothing in it knows which CLI runs it.

Offline: agentfsm's scripted Messages server plays the model. `python examples/sdk_session.py` runs
it with agentfsm; pass a CLI path (e.g. Claude Code's) as the first argument to run it there.
"""

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, ClaudeSDKClient, ResultMessage, TextBlock

sys.path.insert(0, str(Path(__file__).parent))
from sdk_dropin import agentfsm_cli

from agentfsm.testing import ScriptedServer
from agentfsm.testing.scenario import populate_workspace


def say(text: str, **extra: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": text}], "stop_reason": "end_turn", **extra}


SCRIPT = [
    say("The file holds ALPHA."),
    # a long answer, streamed slowly: the user interrupts it after its first block
    {"blocks": [{"type": "text", "text": "Let me explain at length..."}, {"type": "text", "text": "(never shown)"}],
     "stop_reason": "end_turn", "block_delay_s": 4},
    say("Short version: ALPHA is the marker."),
    say("Resumed: we talked about ALPHA."),
]


async def run(cli: str) -> list[str]:
    report: list[str] = []
    ws = populate_workspace(Path(tempfile.mkdtemp()) / "ws").resolve()
    home = ws.parent / "home"
    home.mkdir()

    async def answer(client: ClaudeSDKClient, prompt: str, *, interrupt: bool = False) -> str:
        await client.query(prompt)
        session = ""
        async for message in client.receive_response():
            if isinstance(message, AssistantMessage):
                report.extend(f"assistant: {b.text}" for b in message.content if isinstance(b, TextBlock))
                if interrupt:
                    await client.interrupt()
            elif isinstance(message, ResultMessage):
                report.append(f"result: {message.subtype} {message.result!r}")
                session = message.session_id
        return session

    with ScriptedServer(SCRIPT, ws=str(ws)) as api:
        env = {"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "sk-scripted", "HOME": str(home),
               "CLAUDE_CONFIG_DIR": str(home / ".claude"), "AGENTFSM_HOME": str(home / ".agentfsm"),
               "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        options = ClaudeAgentOptions(cli_path=cli, cwd=str(ws), model="claude-sonnet-4-5", tools=["Read"], env=env,
                                     setting_sources=[])
        async with ClaudeSDKClient(options) as client:
            first = await answer(client, "What does a.txt hold?")
            await answer(client, "Explain it in detail", interrupt=True)
            same = await answer(client, "Just the short version")
        report.append(f"one session: {first == same}")
        resumed = ClaudeAgentOptions(cli_path=cli, cwd=str(ws), model="claude-sonnet-4-5", tools=["Read"], env=env,
                                     setting_sources=[], resume=first)
        async with ClaudeSDKClient(resumed) as client:
            await answer(client, "What did we talk about?")
        last = api.requests[-1]["messages"]
        said = [b.get("text", "") for m in last if isinstance(m["content"], list) for b in m["content"]]
        report.append(f"the resumed request remembers: {'What does a.txt hold?' in said}, "
                      f"the interrupt: {any(t.startswith('[Request interrupted by user') for t in said)}")
    return report


if __name__ == "__main__":
    print("\n".join(asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else agentfsm_cli()))))
