"""Replays the reference scenarios (../shared/reference) through the CLI against the scripted server.

The command line is Claude Code's; the canonical form of what agentfsm sent must equal what
Claude Code 2.1.332 sent, and the result must carry the same subtype, terminal reason and error flag.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentfsm.testing.canonical import canonical_requests
from agentfsm.testing.scenario import load_scenario
from agentfsm.testing.server import ScriptedServer

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("AGENTFSM_REFERENCE_DIR", REPO.parent / "shared" / "reference"))

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not (REFERENCE / "observed").is_dir(), reason=f"no reference material at {REFERENCE}"),
]

CASES = {
    "read_probe": [],
    "max_turns": ["--max-turns", "1"],
    "parallel_reads": [],
    "unknown_tool": [],
    "thinking_only": [],
    "stop_hook": ["--settings", json.dumps({"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": str(REFERENCE / "stop_block_once.sh")}]}]}})],
}


def run_cli(name: str, extra: list[str], workspace: Path,
            home: Path) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    scenario = load_scenario(REFERENCE / "scenarios" / f"{name}.json", ws=str(workspace))
    with ScriptedServer(scenario) as server:
        env = {**os.environ, "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test",
               "AGENTFSM_HOME": str(home), "HOME": str(home)}
        proc = subprocess.run(
            [sys.executable, "-m", "agentfsm", "--print", scenario.prompt, "--output-format", "stream-json",
             "--verbose", "--model", "claude-sonnet-4-5", "--tools", "Read",
             "--permission-mode", "bypassPermissions", *extra],
            cwd=workspace, env=env, capture_output=True, text=True, timeout=90)
        bodies = list(server.requests)
    return proc, bodies


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_scenario(name: str, agentfsm_workspace: Path, tmp_path: Path) -> None:
    observed = json.loads((REFERENCE / "observed" / f"{name}.json").read_text())
    proc, bodies = run_cli(name, CASES[name], agentfsm_workspace, tmp_path / "home")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert lines, proc.stderr
    result = lines[-1]
    assert result["type"] == "result", proc.stderr
    assert canonical_requests(bodies) == observed["requests"]
    for key in ("subtype", "terminal_reason", "is_error"):
        assert result[key] == observed["result"][key], key
    text = result.get("result", "") if result["subtype"] == "success" else ""
    assert text == observed["result"]["text"]
    assert proc.returncode == (1 if observed["result"]["is_error"] else 0)
    # stream-json order: init first, result last, every tool_use answered by a user message
    assert lines[0]["type"] == "system" and lines[0]["subtype"] == "init"
    uses = [b["id"] for m in lines if m["type"] == "assistant" for b in m["message"]["content"]
            if b["type"] == "tool_use"]
    users = [m for m in lines if m["type"] == "user"]
    results = [b["tool_use_id"] for m in users for b in m["message"]["content"] if b["type"] == "tool_result"]
    assert sorted(uses) == sorted(results)
    # the other user messages are the loop's own, printed as Claude Code prints them (a Stop hook's feedback)
    assert all(m.get("isSynthetic") is True and m["message"]["content"][0]["text"].startswith("Stop hook feedback:\n")
               for m in users if not any(b["type"] == "tool_result" for b in m["message"]["content"]))
