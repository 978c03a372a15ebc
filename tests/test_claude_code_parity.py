"""Issue 18's "like Claude Code" behaviours, run on Claude Code itself and on agentfsm against the same
scripted server: an empty final answer is asked for again once, a garbled stream is requested again
without streaming, a dropped one again as a stream, and deny rules hold where Claude Code's do.

The Claude Code half is opt-in: set ``$AGENTFSM_CLAUDE`` (or put ``claude`` on PATH) to Claude Code
2.1.332; without it those cases skip, and the agentfsm half still runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentfsm.machine.prompts import EMPTY_RESPONSE_NUDGE
from agentfsm.testing.server import ScriptedServer

pytestmark = [pytest.mark.server, pytest.mark.slow]

CLAUDE = os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")
CLIENTS = ["claude", "agentfsm"]


def client_argv(client: str) -> list[str]:
    if client == "claude":
        if CLAUDE is None:
            pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
        return [CLAUDE, "--model", "claude-sonnet-4-5"]
    return [sys.executable, "-m", "agentfsm"]


def run(client: str, responses: list[dict[str, Any]], ws: Path, home: Path, *args: str) -> tuple[
        list[dict[str, Any]], dict[str, Any]]:
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "AGENTFSM_HOME": str(home), "IS_SANDBOX": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "ANTHROPIC_API_KEY": "sk-test"}
    with ScriptedServer(responses, ws=ws) as server:
        env["ANTHROPIC_BASE_URL"] = server.base_url
        done = subprocess.run([*client_argv(client), "-p", "go", "--output-format", "stream-json", "--verbose",
                               "--permission-mode", "bypassPermissions", *args],
                              cwd=ws, env=env, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        requests = list(server.requests)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    results = [line for line in lines if line.get("type") == "result"]
    assert results, (client, done.stderr[-2000:])
    return requests, results[-1]


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], **kw}


def last_user_texts(body: dict[str, Any]) -> list[str]:
    content = body["messages"][-1]["content"]
    return [content] if isinstance(content, str) else [b.get("text", "") for b in content if b["type"] == "text"]


@pytest.mark.parametrize("client", CLIENTS)
def test_an_empty_final_answer_is_asked_for_again_once(client: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    requests, result = run(client, [{"blocks": [], "stop_reason": "end_turn"}, text("ASKED_AGAIN")], ws,
                           tmp_path / "home", "--tools", "Read")
    assert len(requests) == 2 and result["result"] == "ASKED_AGAIN"
    assert any(EMPTY_RESPONSE_NUDGE in t for t in last_user_texts(requests[1]))
    # asked once: a second empty answer ends the run with an empty result
    requests, result = run(client, [{"blocks": [], "stop_reason": "end_turn"}] * 2 + [text("THIRD")], ws,
                           tmp_path / "home2", "--tools", "Read")
    assert len(requests) == 2 and result["result"] == "" and result["subtype"] == "success"


@pytest.mark.parametrize("fault", ["html", "invalid_json", "garbage"])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_garbled_stream_is_requested_again_without_streaming(client: str, fault: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    requests, result = run(client, [text("R0", fault=fault), text("R1")], ws, tmp_path / "home", "--tools", "Read")
    assert [r.get("stream") is True for r in requests] == [True, False]
    assert result["result"] == "R1" and not result["is_error"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stream_dropped_before_its_first_event_is_requested_again(client: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    requests, result = run(client, [text("R0", fault="drop"), text("R1")], ws, tmp_path / "home", "--tools", "Read")
    assert [r.get("stream") is True for r in requests] == [True, True]
    assert result["result"] == "R1"


@pytest.mark.parametrize("command", ["/usr/bin/env rm x", "bash -lc 'rm x'", "sh -xc 'rm x'", "a=rm; $a x",
                                     "RM=rm; $RM x"])
@pytest.mark.parametrize("client", CLIENTS)
def test_the_five_spellings_claude_code_blocks(client: str, command: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "x").write_text("x")
    call = {"blocks": [{"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": command}}],
            "stop_reason": "tool_use"}
    run(client, [call, text("DONE")], ws, tmp_path / "home", "--tools", "Bash", "--disallowedTools", "Bash(rm:*)")
    assert (ws / "x").exists(), f"{client} ran {command!r}"


@pytest.mark.parametrize("client", CLIENTS)
def test_grep_leaves_denied_files_out(client: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "private").mkdir(parents=True)
    (ws / "secret.txt").write_text("SECRET_MARKER\n")
    (ws / "private" / "notes.txt").write_text("PRIVATE_MARKER\n")
    (ws / "public.txt").write_text("PUBLIC_MARKER\n")
    call = {"blocks": [{"type": "tool_use", "id": "toolu_01", "name": "Grep",
                        "input": {"pattern": "MARKER", "output_mode": "content"}}], "stop_reason": "tool_use"}
    requests, _ = run(client, [call, text("DONE")], ws, tmp_path / "home", "--tools", "Grep",
                      "--disallowedTools", "Read(./secret.txt)", "Read(./private/**)")
    sent = json.dumps(requests[1]["messages"][-1])
    assert "PUBLIC_MARKER" in sent and "SECRET_MARKER" not in sent and "PRIVATE_MARKER" not in sent


STOP_CONTEXT_HOOK = """#!/bin/sh
# context for the model, no block: once, or (with "always") every time
if [ "$1" != always ] && grep -q '"stop_hook_active":true' ; then exit 0; fi
echo '{"hookSpecificOutput":{"hookEventName":"Stop","additionalContext":"STOP_CONTEXT_MARKER"}}'
"""


@pytest.mark.parametrize("always", [False, True])
@pytest.mark.parametrize("client", CLIENTS)
def test_a_stop_hooks_additional_context_re_enters_like_a_block(client: str, always: bool, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    hook = tmp_path / "stop_context.sh"
    hook.write_text(STOP_CONTEXT_HOOK)
    hook.chmod(0o755)
    command = f"{hook} always" if always else str(hook)
    settings = json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": command}]}]}})
    requests, result = run(client, [text(f"ANSWER{i}") for i in range(12)], ws, tmp_path / "home",
                           "--tools", "Read", "--settings", settings)
    reminder = "<system-reminder>\nStop hook additional context: STOP_CONTEXT_MARKER\n</system-reminder>"
    # once: one re-entry; always: the same cap as a block (eight re-entries, the ninth overridden)
    assert len(requests) == (9 if always else 2)
    assert all(last_user_texts(body) == [reminder] for body in requests[1:])
    assert result["subtype"] == "success" and result["result"] == f"ANSWER{len(requests) - 1}"
