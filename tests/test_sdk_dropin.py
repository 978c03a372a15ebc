"""agentfsm as the Claude Agent SDK's ``cli_path``: the real ``claude-agent-sdk`` package drives the CLI
over the stream-json control protocol, against the scripted Messages server.

Every scenario is also run with Claude Code itself when it is installed (``$AGENTFSM_CLAUDE``, else
``claude`` on PATH; skipped otherwise): both clients must send the same canonical requests, the ones
written down here (observed from Claude Code 2.1.332 driven by claude-agent-sdk 0.2.189).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

sdk = pytest.importorskip("claude_agent_sdk")

from agentfsm.testing import ScriptedServer, canonical_requests  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow]

AGENTFSM = str(Path(sys.executable).with_name("agentfsm"))


def _claude() -> str | None:
    return os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")


@pytest.fixture(params=["agentfsm", "claude-code"])
def cli(request: pytest.FixtureRequest) -> str:
    if request.param == "agentfsm":
        return AGENTFSM
    claude = _claude()
    if claude is None:
        pytest.skip("no Claude Code binary to compare with: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    return claude


class Run:
    """One scenario: the scripted server, the workspace, and what the SDK saw."""

    def __init__(self, cli: str, ws: Path, home: Path, server: ScriptedServer) -> None:
        self.cli, self.ws, self.server = cli, ws, server
        self.messages: list[Any] = []
        self.env = {"ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test", "HOME": str(home),
                    "AGENTFSM_HOME": str(home / ".agentfsm"), "IS_SANDBOX": "1",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}

    def options(self, **kw: Any) -> Any:
        kw.setdefault("model", "claude-sonnet-4-5")
        return sdk.ClaudeAgentOptions(cli_path=self.cli, cwd=str(self.ws), env=self.env, **kw)

    @property
    def canonical(self) -> list[list[str]]:
        return canonical_requests(self.server.requests)

    def results(self) -> list[Any]:
        return [m for m in self.messages if isinstance(m, sdk.ResultMessage)]


async def scenario(cli: str, tmp_path: Path, responses: list[dict[str, Any]],
                   body: Callable[[Run], Awaitable[None]]) -> Run:
    from agentfsm.testing.scenario import populate_workspace

    ws = populate_workspace(tmp_path / "ws").resolve()
    home = tmp_path / "home"
    home.mkdir()
    with ScriptedServer(responses, ws=str(ws)) as server:
        run = Run(cli, ws, home, server)
        await body(run)
    return run


def text(t: str) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": "end_turn"}


def read(tool_id: str, name: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "Read", "input": {"file_path": f"$WS/{name}"}}


def tool_results(messages: list[Any]) -> dict[str, Any]:
    """tool_use_id -> the ToolResultBlock the SDK parsed."""
    return {b.tool_use_id: b for m in messages if isinstance(m, sdk.UserMessage) and isinstance(m.content, list)
            for b in m.content if isinstance(b, sdk.ToolResultBlock)}


def sent_result(server: ScriptedServer, request: int, tool_use_id: str) -> dict[str, Any]:
    """The tool_result block the model received in request ``request``."""
    for message in server.requests[request]["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block.get("type") == "tool_result" and block.get("tool_use_id") == tool_use_id:
                return block
    raise AssertionError(f"no tool_result {tool_use_id} in request {request}")


def result_text(block: dict[str, Any]) -> str:
    content = block["content"]
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


async def test_query_one_shot(cli: str, tmp_path: Path) -> None:
    responses = [
        {"blocks": [{"type": "text", "text": "Reading."}, read("toolu_read1", "probe-fixture.txt")],
         "stop_reason": "tool_use"},
        text("The marker is AGENT_LOOP_FILE_MARKER."),
    ]

    async def body(run: Run) -> None:
        async for m in sdk.query(prompt="Read probe-fixture.txt and tell me the marker",
                                 options=run.options(allowed_tools=["Read"])):
            run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert run.canonical == [
        ["U:Read probe-fixture.txt and tell me the m"],
        ["U:Read probe-fixture.txt and tell me the m", "A:Reading.", "use:toolu_read1:Read", "res:toolu_read1:ok"],
    ]
    init = next(m for m in run.messages if isinstance(m, sdk.SystemMessage) and m.subtype == "init")
    assert init.data["claude_code_version"] >= "2.1.248" and isinstance(init.data["mcp_servers"], list)
    [result] = run.results()
    assert (result.subtype, result.is_error, result.num_turns) == ("success", False, 2)
    assert result.result == "The marker is AGENT_LOOP_FILE_MARKER." and result.stop_reason == "end_turn"
    assert isinstance(result.uuid, str) and result.model_usage and "claude-sonnet-4-5" in result.model_usage


async def test_can_use_tool_allows_one_write_and_denies_another(cli: str, tmp_path: Path) -> None:
    responses = [
        {"blocks": [{"type": "tool_use", "id": "toolu_w_ok", "name": "Write",
                     "input": {"file_path": "$WS/allowed.txt", "content": "ORIGINAL\n"}}], "stop_reason": "tool_use"},
        {"blocks": [{"type": "tool_use", "id": "toolu_w_no", "name": "Write",
                     "input": {"file_path": "$WS/denied.txt", "content": "NOPE\n"}}], "stop_reason": "tool_use"},
        text("Done: one written, one denied."),
    ]
    asked: list[tuple[str, dict[str, Any]]] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        asked.append((name, tool_input))
        if tool_input["file_path"].endswith("allowed.txt"):
            return sdk.PermissionResultAllow(updated_input={**tool_input, "content": "UPDATED BY SDK\n"})
        return sdk.PermissionResultDeny(message="SDK_DENIED: writing denied.txt is not allowed")

    async def body(run: Run) -> None:
        options = run.options(tools=["Read", "Write", "Bash"], can_use_tool=can_use_tool)
        async with sdk.ClaudeSDKClient(options) as client:
            await client.query("Write allowed.txt and denied.txt")
            async for m in client.receive_response():
                run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert run.canonical == [
        ["U:Write allowed.txt and denied.txt"],
        ["U:Write allowed.txt and denied.txt", "use:toolu_w_ok:Write", "res:toolu_w_ok:ok"],
        ["U:Write allowed.txt and denied.txt", "use:toolu_w_ok:Write", "res:toolu_w_ok:ok",
         "use:toolu_w_no:Write", "res:toolu_w_no:err"],
    ]
    assert [name for name, _ in asked] == ["Write", "Write"]
    assert (run.ws / "allowed.txt").read_text() == "UPDATED BY SDK\n"  # the allowed, updated input ran
    assert not (run.ws / "denied.txt").exists()
    denied = sent_result(run.server, 2, "toolu_w_no")
    assert denied.get("is_error") is True
    assert result_text(denied).startswith("SDK_DENIED: writing denied.txt is not allowed")  # verbatim to the model
    [result] = run.results()
    assert [d["tool_use_id"] for d in result.permission_denials] == ["toolu_w_no"]


async def test_python_pre_tool_use_hook_denies_one_of_two_parallel_reads(cli: str, tmp_path: Path) -> None:
    responses = [
        {"blocks": [{"type": "text", "text": "Reading both."}, read("toolu_ra", "a.txt"), read("toolu_rb", "b.txt")],
         "stop_reason": "tool_use"},
        text("a is ALPHA, b was blocked."),
    ]
    seen: dict[str, list[dict[str, Any]]] = {"pre": [], "post": [], "prompt": [], "stop": []}

    async def pre_read(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        seen["pre"].append(hook_input)
        if hook_input["tool_input"]["file_path"].endswith("b.txt"):
            return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                           "permissionDecisionReason": "HOOK_DENIED: b.txt is off limits"}}
        return {}

    def recorder(kind: str) -> Any:
        async def hook(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
            seen[kind].append(hook_input)
            return {}
        return hook

    async def body(run: Run) -> None:
        options = run.options(allowed_tools=["Read"], hooks={
            "PreToolUse": [sdk.HookMatcher(matcher="Read", hooks=[pre_read], timeout=30)],
            "PostToolUse": [sdk.HookMatcher(hooks=[recorder("post")])],
            "UserPromptSubmit": [sdk.HookMatcher(hooks=[recorder("prompt")])],
            "Stop": [sdk.HookMatcher(hooks=[recorder("stop")])]})
        async for m in sdk.query(prompt="Read a.txt and b.txt", options=options):
            run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert run.canonical == [
        ["U:Read a.txt and b.txt"],
        ["U:Read a.txt and b.txt", "A:Reading both.", "use:toolu_ra:Read", "use:toolu_rb:Read", "res:toolu_ra:ok",
         "res:toolu_rb:err"],
    ]
    assert sorted(h["tool_use_id"] for h in seen["pre"]) == ["toolu_ra", "toolu_rb"]
    assert all(h["hook_event_name"] == "PreToolUse" and h["tool_name"] == "Read" for h in seen["pre"])
    assert [h["tool_use_id"] for h in seen["post"]] == ["toolu_ra"]  # only the Read that ran
    assert [h["prompt"] for h in seen["prompt"]] == ["Read a.txt and b.txt"]
    assert [h["last_assistant_message"] for h in seen["stop"]] == ["a is ALPHA, b was blocked."]
    denied = sent_result(run.server, 1, "toolu_rb")
    assert denied.get("is_error") is True and "HOOK_DENIED: b.txt is off limits" in result_text(denied)
    assert "ALPHA" in result_text(sent_result(run.server, 1, "toolu_ra"))


async def test_two_prompts_in_one_client_session(cli: str, tmp_path: Path) -> None:
    responses = [
        text("FIRST_ANSWER"),
        {"blocks": [read("toolu_r2", "a.txt")], "stop_reason": "tool_use"},
        text("SECOND_ANSWER"),
    ]

    async def body(run: Run) -> None:
        async with sdk.ClaudeSDKClient(run.options(allowed_tools=["Read"])) as client:
            for prompt in ("first prompt", "second prompt"):
                await client.query(prompt)
                async for m in client.receive_response():
                    run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert run.canonical == [
        ["U:first prompt"],
        ["U:first prompt", "A:FIRST_ANSWER", "U:second prompt"],
        ["U:first prompt", "A:FIRST_ANSWER", "U:second prompt", "use:toolu_r2:Read", "res:toolu_r2:ok"],
    ]
    results = run.results()
    assert [(r.result, r.num_turns) for r in results] == [("FIRST_ANSWER", 1), ("SECOND_ANSWER", 2)]
    assert len({r.session_id for r in results}) == 1


async def test_in_process_sdk_mcp_tool(cli: str, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    @sdk.tool("add", "Add two numbers", {"a": int, "b": int})
    async def add(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"content": [{"type": "text", "text": f"SUM={args['a'] + args['b']}"}]}

    @sdk.tool("fail", "Always fails", {"why": str})
    async def fail(args: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": f"FAILED: {args['why']}"}], "is_error": True}

    calc = sdk.create_sdk_mcp_server("calc", version="2.0.0", tools=[add, fail])
    responses = [
        {"blocks": [{"type": "tool_use", "id": "toolu_add", "name": "mcp__calc__add", "input": {"a": 2, "b": 40}},
                    {"type": "tool_use", "id": "toolu_fail", "name": "mcp__calc__fail", "input": {"why": "scripted"}}],
         "stop_reason": "tool_use"},
        text("The sum is 42."),
    ]

    async def body(run: Run) -> None:
        options = run.options(mcp_servers={"calc": calc}, allowed_tools=["mcp__calc__add", "mcp__calc__fail"],
                              tools=["Read"])
        async for m in sdk.query(prompt="add 2 and 40", options=options):
            run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert run.canonical == [
        ["U:add 2 and 40"],
        ["U:add 2 and 40", "use:toolu_add:mcp__calc__add", "use:toolu_fail:mcp__calc__fail", "res:toolu_add:ok",
         "res:toolu_fail:err"],
    ]
    offered = [t["name"] for t in run.server.requests[0]["tools"]]
    assert {"Read", "mcp__calc__add", "mcp__calc__fail"} <= set(offered)
    assert calls == [{"a": 2, "b": 40}]
    assert sent_result(run.server, 1, "toolu_add")["content"] == [{"type": "text", "text": "SUM=42"}]
    failed = sent_result(run.server, 1, "toolu_fail")
    assert failed.get("is_error") is True and result_text(failed).startswith("FAILED: scripted")
    init = next(m for m in run.messages if isinstance(m, sdk.SystemMessage) and m.subtype == "init")
    assert {"name": "calc", "status": "connected", "source": "sdk"} in init.data["mcp_servers"]


async def test_interrupt_while_streaming_then_go_on(cli: str, tmp_path: Path) -> None:
    responses = [
        {"blocks": [{"type": "text", "text": "STREAMING_SLOWLY"}, {"type": "text", "text": "NEVER_SEEN"}],
         "stop_reason": "end_turn", "block_delay_s": 4},
        text("AFTER_THE_INTERRUPT"),
    ]

    async def body(run: Run) -> None:
        async with sdk.ClaudeSDKClient(run.options(tools=["Read"])) as client:
            await client.query("slow stream please")
            async for m in client.receive_response():
                run.messages.append(m)
                if isinstance(m, sdk.AssistantMessage):
                    await client.interrupt()
            await client.query("next prompt")
            async for m in client.receive_response():
                run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert run.canonical == [
        ["U:slow stream please"],
        ["U:slow stream please", "A:STREAMING_SLOWLY", "U:[Request interrupted by user]", "U:next prompt"],
    ]
    first, second = run.results()
    assert (first.subtype, first.is_error) == ("error_during_execution", True)
    assert (second.subtype, second.result) == ("success", "AFTER_THE_INTERRUPT")
    shown = [b.text for m in run.messages if isinstance(m, sdk.AssistantMessage) for b in m.content
             if isinstance(b, sdk.TextBlock)]
    assert "NEVER_SEEN" not in shown


async def test_can_use_tool_deny_with_interrupt_ends_the_turn(cli: str, tmp_path: Path) -> None:
    write = {"blocks": [{"type": "tool_use", "id": "toolu_di", "name": "Write",
                         "input": {"file_path": "$WS/d.txt", "content": "D\n"}}], "stop_reason": "tool_use"}

    async def deny(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        return sdk.PermissionResultDeny(message="DENY_AND_STOP", interrupt=True)

    async def body(run: Run) -> None:
        async with sdk.ClaudeSDKClient(run.options(tools=["Write"], can_use_tool=deny)) as client:
            for prompt in ("write", "after"):
                await client.query(prompt)
                async for m in client.receive_response():
                    run.messages.append(m)

    run = await scenario(cli, tmp_path, [write, text("OK_TEXT"), text("OK_TEXT")], body)
    assert run.canonical == [
        ["U:write"],
        ["U:write", "use:toolu_di:Write", "res:toolu_di:err", "U:[Request interrupted by user for tool us", "U:after"],
    ]
    first, second = run.results()
    assert (first.subtype, first.is_error, second.result) == ("error_during_execution", True, "OK_TEXT")
    assert not (run.ws / "d.txt").exists()


def test_agentfsm_speaks_the_claude_code_version_the_sdk_wants() -> None:
    from agentfsm.phases import CLAUDE_CODE_VERSION

    assert tuple(int(x) for x in CLAUDE_CODE_VERSION.split(".")) >= (2, 1, 248)


def test_the_readme_example_runs(tmp_path: Path) -> None:
    import subprocess

    example = Path(__file__).parents[1] / "examples" / "sdk_dropin.py"
    # as a new user runs it: the venv not activated, so `agentfsm` is on no PATH, only beside the Python
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AGENTFSM_HOME": str(tmp_path / ".agentfsm")}
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "result: success TOOL_EXECUTION_OK (2 turns)" in proc.stdout


def test_the_example_stops_loudly_without_agentfsm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `agentfsm` beside the Python nor on PATH: a clear stop, never the SDK's bundled Claude Code."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sdk_dropin_example",
                                                  Path(__file__).parents[1] / "examples" / "sdk_dropin.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="agentfsm executable not found"):
        example.agentfsm_cli()
    (tmp_path / "agentfsm").write_text("#!/bin/sh\n")
    (tmp_path / "agentfsm").chmod(0o755)
    assert example.agentfsm_cli() == str(tmp_path / "agentfsm")  # PATH is the second place looked at


async def test_partial_messages_stream_every_event(cli: str, tmp_path: Path) -> None:
    """``include_partial_messages``: each raw stream event as a StreamEvent, a ``status`` before each
    request, the assistant block before its ``content_block_stop``; the deltas add up to the blocks."""
    responses = [
        {"blocks": [{"type": "text", "text": "Reading the probe file now."}, read("toolu_read1", "probe-fixture.txt")],
         "stop_reason": "tool_use"},
        text("The marker is AGENT_LOOP_FILE_MARKER."),
    ]

    async def body(run: Run) -> None:
        async for m in sdk.query(prompt="Read probe-fixture.txt", options=run.options(
                allowed_tools=["Read"], include_partial_messages=True)):
            run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)

    def kind(m: Any) -> str:
        if isinstance(m, sdk.StreamEvent):
            return m.event["type"]
        if isinstance(m, sdk.SystemMessage):
            return f"system:{m.subtype}"
        return type(m).__name__

    # agentfsm's queue reports its commands' lifecycle too (Claude Code does not)
    kinds = [k for k in map(kind, run.messages) if k != "system:command_lifecycle"]
    one_response = ["system:status", "message_start", "content_block_start"]
    assert kinds[0] == "system:init" and kinds[-1] == "ResultMessage"
    assert kinds[1:4] == one_response and kinds.count("system:status") == 2
    assert kinds.count("message_start") == kinds.count("message_stop") == 2
    # each block is shown whole before the raw event that closes it
    for i, k in enumerate(kinds):
        if k == "content_block_stop":
            assert kinds[i - 1] == "AssistantMessage", kinds
    events = [m for m in run.messages if isinstance(m, sdk.StreamEvent)]
    assert all(e.session_id == run.results()[0].session_id and e.uuid and e.parent_tool_use_id is None
               for e in events)
    text_deltas = "".join(e.event["delta"].get("text", "") for e in events
                          if e.event["type"] == "content_block_delta")
    assert text_deltas == "Reading the probe file now.The marker is AGENT_LOOP_FILE_MARKER."
    json_deltas = "".join(e.event["delta"].get("partial_json", "") for e in events
                          if e.event["type"] == "content_block_delta")
    import json

    assert json.loads(json_deltas) == {"file_path": str(run.ws / "probe-fixture.txt")}
    stops = [e.event["delta"]["stop_reason"] for e in events if e.event["type"] == "message_delta"]
    assert stops == ["tool_use", "end_turn"]


async def test_task_budget_reaches_every_request_and_thinking_flags_are_accepted(cli: str, tmp_path: Path) -> None:
    """``task_budget`` is sent as ``output_config.task_budget`` with each request, as Claude Code sends it;
    the thinking options (``--thinking``, ``--thinking-display``) do not break the session."""
    responses = [{"blocks": [read("toolu_read1", "probe-fixture.txt")], "stop_reason": "tool_use"}, text("Done.")]

    async def body(run: Run) -> None:
        async for m in sdk.query(prompt="Read probe-fixture.txt", options=run.options(
                allowed_tools=["Read"], task_budget={"total": 5000},
                thinking={"type": "adaptive", "display": "summarized"})):
            run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    assert [r.get("output_config") for r in run.server.requests] == [
        {"task_budget": {"type": "tokens", "total": 5000}}] * 2
    [result] = run.results()
    assert result.subtype == "success" and result.result == "Done."


async def test_hook_events_around_each_command_hook(cli: str, tmp_path: Path) -> None:
    """``include_hook_events``: a ``hook_started`` and a ``hook_response`` (output, exit code, outcome)
    around every command hook, named ``<event>:<subject>``, as Claude Code prints them."""
    import json

    responses = [{"blocks": [read("toolu_read1", "probe-fixture.txt")], "stop_reason": "tool_use"}, text("Done.")]
    hooks = {"PreToolUse": [{"matcher": "Read", "hooks": [
                 {"type": "command", "command": "echo checked"},
                 {"type": "command", "command": "echo 'not fatal' >&2; exit 1"}]}],
             "PostToolUse": [{"hooks": [{"type": "command", "command": "echo 'look again' >&2; exit 2"}]}]}

    async def body(run: Run) -> None:
        async for m in sdk.query(prompt="Read probe-fixture.txt", options=run.options(
                allowed_tools=["Read"], include_hook_events=True, settings=json.dumps({"hooks": hooks}),
                setting_sources=[])):
            run.messages.append(m)

    run = await scenario(cli, tmp_path, responses, body)
    events = [m.data for m in run.messages if isinstance(m, sdk.SystemMessage)
              and m.subtype in ("hook_started", "hook_response")]
    started = {e["hook_id"]: e for e in events if e["subtype"] == "hook_started"}
    answered = [e for e in events if e["subtype"] == "hook_response"]
    assert sorted(e["hook_id"] for e in answered) == sorted(started)
    seen = sorted((e["hook_name"], e["hook_event"], e["output"], e["stdout"], e["stderr"], e["exit_code"], e["outcome"])
                  for e in answered)
    assert seen == [
        ("PostToolUse:Read", "PostToolUse", "look again\n", "", "look again\n", 2, "error"),
        ("PreToolUse:Read", "PreToolUse", "checked\n", "checked\n", "", 0, "success"),
        ("PreToolUse:Read", "PreToolUse", "not fatal\n", "", "not fatal\n", 1, "error"),
    ]
    for e in answered:  # each response after its start
        assert events.index(started[e["hook_id"]]) < events.index(e)
    [result] = run.results()
    assert result.subtype == "success"
