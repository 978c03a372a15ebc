"""The reference's canonical form, checked against the reference observations."""

from __future__ import annotations

import enum
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import attrs
import pytest

from agentfsm.llm.model import ModelRequest
from agentfsm.testing import (
    Scenario,
    ScriptedServer,
    StreamedResponse,
    ToolUseBlock,
    canonical_request,
    canonical_requests,
    canonical_result,
    canonical_run,
    load_bodies,
)

# The shapes below are what Claude Code 2.1.332 sent to this kit's ScriptedServer (captured with
# `serve-scripted --log`, abridged): context reminders as their own text blocks before the prompt,
# a token-count reminder appended to the last tool_result, results in completion order, the hook's
# feedback and the thinking-only nudge as reminders, the prompt resent as "THINK_ONLY\n".
WS = "/tmp/ws"
SESSION = '{"device_id":"d","account_uuid":"","session_id":"40bcc24b-eed5-433f-99ee-8bdb6f61929f"}'
EPHEMERAL = {"type": "ephemeral"}


def reminder(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": f"<system-reminder>\n{text}\n</system-reminder>", **extra}


CONTEXT = [
    reminder(
        "# Environment\nYou have been invoked in the following environment: \n - Primary working directory"
    ),
    reminder("You are powered by the model named Sonnet 4.5."),
    reminder("<total_tokens>15000000 tokens left</total_tokens>"),
    {"type": "text", "text": "<system-reminder>\nToday's date is 2026-12-02.\n</system-reminder>\n"},
]
TOKENS_LEFT = "\n\n<system-reminder>\n<total_tokens>14991730 tokens left</total_tokens>\n</system-reminder>"


def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}],
        "messages": messages,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": SESSION},
        "thinking": {"type": "adaptive"},
        "stream": True,
    }


def first_user(prompt: str, *after: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [*CONTEXT, {"type": "text", "text": prompt}, *after]}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def use(tool_id: str, name: str, path: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"file_path": path}}


def result(tool_id: str, content: str, is_error: bool = False, last: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"tool_use_id": tool_id, "type": "tool_result", "content": content}
    if is_error:
        out["is_error"] = True
    if last:
        out["content"] += TOKENS_LEFT
        out["cache_control"] = EPHEMERAL
    return out


def result_line(subtype: str, reason: str, is_error: bool, text: str | None) -> dict[str, Any]:
    """The client's final stream-json line; error subtypes carry ``errors`` and a null ``result``."""
    line: dict[str, Any] = {
        "type": "result",
        "subtype": subtype,
        "is_error": is_error,
        "terminal_reason": reason,
        "num_turns": 2,
        "duration_ms": 10,
        "session_id": "s",
        "result": text,
    }
    if text is None:
        line["errors"] = ["Reached maximum number of turns (1)"]
    return line


HOOK_FEEDBACK = reminder(
    "The text below is the output of a hook that the user, their organization or this environment set up.\n"
    "Stop hook feedback:\n[/ref/stop_block_once.sh]: STOP_HOOK_REENTER_MARKER: run the tests first\n",
    cache_control=EPHEMERAL,
)
NUDGE = reminder(
    "[Your previous response had no visible output. Please continue and produce a user-visible response.]",
    cache_control=EPHEMERAL,
)

# Per scenario: the bodies Claude Code 2.1.332 sent, and its result line.
REFERENCE_RUNS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "read_probe": (
        [
            body([first_user("AGENT_LOOP_INITIAL_MARKER")]),
            body(
                [
                    first_user("AGENT_LOOP_INITIAL_MARKER"),
                    assistant(use("toolu_agent_loop_probe", "Read", f"{WS}/probe-fixture.txt")),
                    {
                        "role": "user",
                        "content": [
                            result("toolu_agent_loop_probe", "1\tAGENT_LOOP_FILE_MARKER\n2", last=True),
                        ],
                    },
                ]
            ),
        ],
        result_line("success", "completed", False, "TOOL_EXECUTION_OK"),
    ),
    "parallel_reads": (
        [
            body([first_user("PARALLEL")]),
            body(
                [
                    first_user("PARALLEL"),
                    assistant(
                        {"type": "text", "text": "reading three"},
                        use("toolu_a", "Read", f"{WS}/a.txt"),
                        use("toolu_b", "Read", f"{WS}/b.txt"),
                        use("toolu_c", "Read", f"{WS}/missing.txt"),
                    ),
                    # In completion order: the missing file fails first.
                    {
                        "role": "user",
                        "content": [
                            result(
                                "toolu_c",
                                "File does not exist. Note: your current working directory is /tmp/ws.",
                                is_error=True,
                            ),
                            result("toolu_a", "1\tALPHA\n2\t"),
                            result("toolu_b", "1\tBETA\n2", last=True),
                        ],
                    },
                ]
            ),
        ],
        result_line("success", "completed", False, "DONE"),
    ),
    "unknown_tool": (
        [
            body([first_user("UNKNOWN_TOOL")]),
            body(
                [
                    first_user("UNKNOWN_TOOL"),
                    assistant(use("toolu_x", "Reed", f"{WS}/a.txt")),
                    {
                        "role": "user",
                        "content": [
                            result(
                                "toolu_x",
                                "<tool_use_error>Error: No such tool available: Reed</tool_use_error>",
                                is_error=True,
                                last=True,
                            ),
                        ],
                    },
                ]
            ),
        ],
        result_line("success", "completed", False, "DONE"),
    ),
    "max_turns": (
        [body([first_user("MAXTURNS")])],
        result_line("error_max_turns", "max_turns", True, None),
    ),
    "stop_hook": (
        [
            body([first_user("STOP_HOOK")]),
            body(
                [
                    first_user("STOP_HOOK"),
                    assistant({"type": "text", "text": "FIRST_DONE"}),
                    {"role": "user", "content": [HOOK_FEEDBACK]},
                ]
            ),
        ],
        result_line("success", "completed", False, "STOP_REENTRY_OK"),
    ),
    "thinking_only": (
        # The thinking-only answer is dropped and the nudge joins the first user message.
        [body([first_user("THINK_ONLY")]), body([first_user("THINK_ONLY\n", NUDGE)])],
        result_line("success", "completed", False, ""),
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_RUNS))
def test_reference_client_bodies_give_the_observed_form(
    name: str, agentfsm_reference_observed: Callable[[str], dict[str, Any]]
) -> None:
    bodies, line = REFERENCE_RUNS[name]
    assert canonical_run(bodies, line) == agentfsm_reference_observed(name)


def test_every_observation_is_covered(agentfsm_reference_dir: Path) -> None:
    assert {p.stem for p in (agentfsm_reference_dir / "observed").glob("*.json")} <= set(REFERENCE_RUNS)


# --- edge cases --------------------------------------------------------------------------------


def test_string_content_and_several_text_blocks() -> None:
    messages = [
        {"role": "user", "content": "plain string prompt"},
        {"role": "assistant", "content": "plain assistant string"},
        {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]},
        assistant({"type": "text", "text": "one"}, {"type": "text", "text": "two"}),
    ]
    assert canonical_request({"messages": messages}) == [
        "U:plain string prompt",
        "A:plain assistant string",
        "U:first",
        "U:second",
        "A:one",
        "A:two",
    ]


def test_texts_cut_at_forty_characters() -> None:
    long = "x" * 39 + "yz" + "tail"
    got = canonical_request(
        {"messages": [{"role": "user", "content": long}, assistant({"type": "text", "text": long})]}
    )
    assert got == ["U:" + "x" * 39 + "y", "A:" + "x" * 39 + "y"]


def test_reminders_and_empty_texts_are_left_out() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "  \n<system-reminder>indented</system-reminder>"},
                {"type": "text", "text": ""},
                {"type": "text", "text": "   \n"},
                {"type": "text", "text": "kept <system-reminder> not at the start"},
            ],
        },
        {"role": "user", "content": "<system-reminder>a string reminder</system-reminder>"},
        assistant(
            {"type": "text", "text": ""}, {"type": "text", "text": "<system-reminder>x</system-reminder>"}
        ),
    ]
    assert canonical_request({"messages": messages}) == ["U:kept <system-reminder> not at the start"]


def test_text_is_stripped_then_cut() -> None:
    padded = "\n  " + "p" * 45 + " \n"
    assert canonical_request({"messages": [{"role": "user", "content": padded}]}) == ["U:" + "p" * 40]
    assert canonical_request({"messages": [{"role": "user", "content": "THINK_ONLY\n"}]}) == ["U:THINK_ONLY"]


def test_results_sorted_by_id_where_the_first_result_stands() -> None:
    messages = [
        assistant(
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "redacted_thinking", "data": "x"},
            use("b2", "Read", "/b"),
            use("a1", "Read", "/a"),
            use("c3", "Read", "/c"),
        ),
        {
            "role": "user",
            "content": [
                result("c3", "x", True),
                result("a1", "x"),
                {"type": "tool_result", "tool_use_id": "b2", "is_error": False},
                {"type": "text", "text": "typed while the tools ran"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
            ],
        },
        {"role": "user", "content": [result("z9", "x"), result("y8", "x")]},
    ]
    assert canonical_request({"messages": messages}) == [
        "T",
        "T",
        "use:b2:Read",
        "use:a1:Read",
        "use:c3:Read",
        "res:a1:ok",
        "res:b2:ok",
        "res:c3:err",
        "U:typed while the tools ran",
        "res:y8:ok",
        "res:z9:ok",
    ]


def test_model_requests_and_malformed_entries() -> None:
    req = ModelRequest(
        "m", (), ({"role": "user", "content": "hello"}, {"role": "assistant", "content": None}), (), 10
    )
    assert canonical_requests([req, {"messages": ["junk", {"role": "user", "content": [1, "x"]}]}, {}]) == [
        ["U:hello"],
        [],
        [],
    ]


class _Reason(enum.StrEnum):
    MAX_TURNS = "max_turns"


@attrs.frozen
class _RunResult:
    subtype: str
    terminal_reason: _Reason
    is_error: bool
    result: str | None


def test_canonical_result_from_a_record_or_a_line() -> None:
    record = _RunResult("error_max_turns", _Reason.MAX_TURNS, True, None)
    expected = {"subtype": "error_max_turns", "terminal_reason": "max_turns", "is_error": True, "text": ""}
    assert canonical_result(record) == expected
    assert canonical_result(result_line("error_max_turns", "max_turns", True, None)) == expected
    assert (
        canonical_result(
            {"subtype": "success", "terminal_reason": "completed", "is_error": False, "text": "from text"}
        )["text"]
        == "from text"
    )


def test_load_bodies(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    bodies = REFERENCE_RUNS["read_probe"][0]
    log.write_text("".join(json.dumps(b) + "\n" for b in bodies) + "\n")
    assert load_bodies(log) == bodies


# --- the kit end to end: a minimal client against the scripted server gives the observed form ---


async def _minimal_client(base_url: str, prompt: str) -> str:
    """A bare agent loop (Read only, no reminders) driven through the real SDK."""
    c = anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    try:
        while True:
            async with c.messages.stream(
                model="claude-sonnet-4-5", max_tokens=1000, messages=messages
            ) as stream:
                message = await stream.get_final_message()
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            messages.append({"role": "assistant", "content": blocks})
            uses = [b for b in blocks if b["type"] == "tool_use"]
            if not uses:
                return "".join(b.get("text", "") for b in blocks)
            results = []
            for u in reversed(uses):  # any completion order: the canonical form sorts them
                path = Path(u["input"].get("file_path", ""))
                if u["name"] != "Read":
                    results.append(result(u["id"], f"No such tool available: {u['name']}", True))
                elif path.is_file():
                    results.append(result(u["id"], path.read_text()))
                else:
                    results.append(result(u["id"], "File does not exist.", True))
            messages.append({"role": "user", "content": results})
    finally:
        await c.close()


@pytest.mark.server
@pytest.mark.parametrize("name", ["read_probe", "parallel_reads", "unknown_tool"])
async def test_minimal_client_through_the_server_matches_the_reference(
    name: str,
    agentfsm_reference_scenario: Callable[[str], Scenario],
    agentfsm_reference_observed: Callable[[str], dict[str, Any]],
    agentfsm_server: Callable[..., ScriptedServer],
    agentfsm_workspace: Path,
) -> None:
    scenario = agentfsm_reference_scenario(name)
    first = scenario.responses[0]
    assert isinstance(first, StreamedResponse)
    assert all(
        str(b.input["file_path"]).startswith(str(agentfsm_workspace))
        for b in first.blocks
        if isinstance(b, ToolUseBlock)
    )
    server = agentfsm_server(scenario)
    text = await _minimal_client(server.base_url, scenario.prompt)
    line = {"subtype": "success", "terminal_reason": "completed", "is_error": False, "result": text}
    assert canonical_run(server.requests, line) == agentfsm_reference_observed(name)


# --- the real client, when one is at hand --------------------------------------------------------

LIVE_RUNS: dict[str, list[str]] = {
    "read_probe": [],
    "parallel_reads": [],
    "unknown_tool": [],
    "thinking_only": [],
    "max_turns": ["--max-turns", "1"],
    "stop_hook": ["--settings", "HOOK"],
}


def _claude_binary() -> str | None:
    return os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LIVE_RUNS))
def test_claude_code_against_the_scripted_server_matches_the_reference(
    name: str,
    agentfsm_reference_dir: Path,
    agentfsm_reference_scenario: Callable[[str], Scenario],
    agentfsm_reference_observed: Callable[[str], dict[str, Any]],
    agentfsm_workspace: Path,
    tmp_path: Path,
) -> None:
    """Claude Code itself (``$AGENTFSM_CLAUDE`` or ``claude`` on PATH), run as the reference was, sends
    this server requests of the observed canonical form: the server speaks its wire well enough."""
    claude = _claude_binary()
    if claude is None:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    scenario = agentfsm_reference_scenario(name)
    hook = {
        "hooks": {
            "Stop": [{"hooks": [{"type": "command", "command": str(agentfsm_reference_dir / "stop_block_once.sh")}]}]
        }
    }
    extra = [json.dumps(hook) if a == "HOOK" else a for a in LIVE_RUNS[name]]
    (tmp_path / "home").mkdir()
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ANTHROPIC_API_KEY": "sk-test",
    }
    with ScriptedServer(scenario) as server:
        env["ANTHROPIC_BASE_URL"] = server.base_url
        done = subprocess.run(
            [
                claude,
                "--print",
                scenario.prompt,
                "--output-format",
                "stream-json",
                "--verbose",
                "--model",
                "claude-sonnet-4-5",
                "--tools",
                "Read",
                "--permission-mode",
                "bypassPermissions",
                *extra,
            ],
            cwd=agentfsm_workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    results = [line for line in lines if line.get("type") == "result"]
    assert results, done.stderr[-2000:]
    assert canonical_run(server.requests, results[-1]) == agentfsm_reference_observed(name)
