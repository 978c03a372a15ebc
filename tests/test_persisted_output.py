"""A session saves a Bash output too large to show beside its session file, through the session's
file-access policy: the model gets Claude Code's <persisted-output> block and can Read the rest; a deny
rule over that directory keeps the file out and the output is cut instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentfsm.machine.options import Options
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel

BIG = "seq 1 20000"
SESSION = "8d3c1f5e-2a4b-4c6d-9e8f-0a1b2c3d4e5f"


def bash(ident: str, command: str) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": ident, "name": "Bash", "input": {"command": command}}],
            "stop_reason": "tool_use"}


def read(ident: str, path: str, offset: int, limit: int) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": ident, "name": "Read",
                        "input": {"file_path": path, "offset": offset, "limit": limit}}], "stop_reason": "tool_use"}


def results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]


async def run(tmp_path: Path, responses: list[dict[str, Any]], settings: str | None = None) -> tuple[
        ScriptedModel, Session]:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    model = ScriptedModel(responses, ws=ws)
    options = Options(tools=("Bash", "Read"), permission_mode="bypassPermissions", cwd=ws,
                      sessions_dir=tmp_path / "sessions", setting_sources=(), settings=settings,
                      session_id=SESSION)
    session = Session(options, client=model)
    try:
        await session.run("go")
    finally:
        await session.aclose()
    return model, session


async def test_a_large_output_is_saved_beside_the_session_and_can_be_read(tmp_path: Path) -> None:
    saved = tmp_path / "sessions" / SESSION / "tool-results" / "toolu_01.txt"
    model, _ = await run(tmp_path, [bash("toolu_01", BIG), read("toolu_02", str(saved), 19999, 2),
                                    {"blocks": [{"type": "text", "text": "x"}]}])
    block = results(model.bodies[1])[0]["content"]
    assert block.startswith(f"<persisted-output>\nOutput too large (106.3KB). Full output saved to: {saved}\n\n"
                            "Preview (first 2KB):\n1\n2\n")
    assert block.endswith("\n...\n</persisted-output>")
    # the model reads on from the saved file: every line is there
    assert results(model.bodies[2])[0]["content"] == "19999\t19999\n20000\t20000"


async def test_a_deny_rule_over_the_sessions_directory_keeps_the_output_out(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    settings = json.dumps({"permissions": {"deny": [f"Edit(/{sessions}/**)"]}})
    model, _ = await run(tmp_path, [bash("toolu_01", BIG), {"blocks": [{"type": "text", "text": "x"}]}], settings)
    text = results(model.bodies[1])[0]["content"]
    assert text.endswith("lines truncated] ...") and "<persisted-output>" not in text
    assert not list(sessions.rglob("tool-results"))


async def test_a_read_deny_rule_over_the_sessions_directory_keeps_the_output_out_too(tmp_path: Path) -> None:
    """Saving the output where the model may not read it would only point it at a denied file: the
    output is cut instead, as under a write deny rule."""
    sessions = tmp_path / "sessions"
    settings = json.dumps({"permissions": {"deny": [f"Read(/{sessions}/**)"]}})
    model, _ = await run(tmp_path, [bash("toolu_01", BIG), {"blocks": [{"type": "text", "text": "x"}]}], settings)
    text = results(model.bodies[1])[0]["content"]
    assert text.endswith("lines truncated] ...") and "<persisted-output>" not in text
    assert not list(sessions.rglob("tool-results"))
