"""``agentfsm demo``: the read probe, end to end, with no API key.

A scripted Messages server on loopback answers like a controlled model (first a Read
tool_use, then a text answer); the loop talks to it through the real ``anthropic`` SDK in a temporary
workspace, and the demo prints the conversation, the path through the graph and the trace file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _show(msg: dict[str, Any]) -> None:
    t = msg.get("type")
    if t == "assistant":
        for b in msg["message"]["content"]:
            if b.get("type") == "text":
                _say(f"  assistant ▸ {b['text']}")
            elif b.get("type") == "tool_use":
                _say(f"  assistant ▸ tool_use {b['name']} {json.dumps(b['input'])}  (id {b['id']})")
            elif b.get("type") == "thinking":
                _say("  assistant ▸ (thinking)")
    elif t == "user":
        for b in msg["message"]["content"]:
            if b.get("type") == "tool_result":
                content = b.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                flag = " [error]" if b.get("is_error") else ""
                _say(f"  tool      ▸ result for {b['tool_use_id']}{flag}: {text.strip()[:120]}")


async def _run(workspace: Path, sessions: Path) -> int:
    from agentfsm.options import Options
    from agentfsm.session import Session
    from agentfsm.testing.scenario import load_scenario
    from agentfsm.testing.server import ScriptedServer
    from agentfsm.trace import read_records
    from agentfsm.transport import AnthropicTransport

    raw = json.loads(resources.files("agentfsm").joinpath("scenarios/read_probe.json").read_text())
    scenario = load_scenario(raw, ws=str(workspace))
    server = ScriptedServer(scenario)
    url = await server.start_async()
    try:
        _say(f"scripted Messages server: {url}  (the real anthropic SDK talks to it)")
        _say(f"workspace: {workspace}")
        _say()
        _say(f"  user      ▸ {scenario.prompt}")
        options = Options(tools=("Read",), permission_mode="bypassPermissions", cwd=workspace,
                          sessions_dir=sessions)
        client = AnthropicTransport(api_key="sk-demo", base_url=url, max_retries=0)
        session = Session(options, client=client, emit=_show)
        try:
            result = await session.run(scenario.prompt)
        finally:
            await session.aclose()
    finally:
        await server.stop_async()
    path = ["assemble"]
    for rec in read_records(session.trace_path):  # type: ignore[arg-type]
        if rec["type"] == "transition":
            path.append(f"--{rec['trigger']}--> {rec['to']}")
    _say()
    _say("path through the graph:")
    _say("  " + " ".join(path))
    _say()
    _say(f"result: {result.subtype} (terminal_reason {result.terminal_reason.value}, "
         f"is_error {str(result.is_error).lower()}, {result.num_turns} turns, "
         f"{len(server.requests)} requests): {result.result}")
    _say(f"trace written to {session.trace_path}")
    _say(f"check it with: agentfsm audit {session.trace_path}")
    return 1 if result.is_error else 0


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="agentfsm demo", description=__doc__)
    parser.add_argument("--keep", metavar="DIR", help="keep the workspace and trace in DIR")
    args = parser.parse_args(list(argv))
    with tempfile.TemporaryDirectory(prefix="agentfsm-demo-") as tmp:
        base = Path(args.keep).resolve() if args.keep else Path(tmp)
        workspace = base / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "probe-fixture.txt").write_text("AGENT_LOOP_FILE_MARKER\n")
        sessions = (base / "sessions") if args.keep else Path.cwd() / ".agentfsm" / "demo"
        return asyncio.run(_run(workspace, sessions))
