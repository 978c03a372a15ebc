"""agentfsm as the Claude Agent SDK's ``cli_path``: the real ``claude-agent-sdk`` package drives the CLI
over the stream-json control protocol, against the scripted Messages server.

Every scenario is also run with Claude Code itself when it is installed (``$AGENTFSM_CLAUDE``, else
``claude`` on PATH; skipped otherwise): both clients must send the same canonical requests, the ones
written down here (observed from Claude Code 2.1.332 driven by claude-agent-sdk 0.2.189).
"""

from __future__ import annotations

import json
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
    # the structured results SDK users see: the MCP content, and a failure's Error text (as Claude Code)
    assert [m.tool_use_result for m in run.messages if isinstance(m, sdk.UserMessage)] == [
        [{"type": "text", "text": "SUM=42"}], "Error: FAILED: scripted"]


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
    from agentfsm.runtime.phases import CLAUDE_CODE_VERSION

    assert tuple(int(x) for x in CLAUDE_CODE_VERSION.split(".")) >= (2, 1, 248)


def test_the_readme_example_runs(tmp_path: Path) -> None:
    import subprocess

    example = Path(__file__).parents[1] / "examples" / "sdk_dropin.py"
    # as a new user runs it: the venv not activated, so `agentfsm` is on no PATH, only beside the Python
    env = {**os.environ, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AGENTFSM_HOME": str(tmp_path / ".agentfsm")}
    proc = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # plain words, not the suite's markers: the scripted model reads notes.txt and answers
    assert "name='Read'" in proc.stdout and "notes.txt" in proc.stdout
    assert "result: success I read notes.txt" in proc.stdout and "(2 turns)" in proc.stdout
    assert "TOOL_EXECUTION_OK" not in proc.stdout


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

    # no command_lifecycle: the SDK's prompts carry no uuid, and Claude Code reports none for them
    kinds = list(map(kind, run.messages))
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


# --- the SDK user's view, case by case (issue 28): each runs through the real SDK on both CLIs ----------------


def write(tool_id: str, path: str, content: str = "x\n") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "Write", "input": {"file_path": path, "content": content}}


def read_at(tool_id: str, path: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "Read", "input": {"file_path": path}}


def turn(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"blocks": list(blocks), "stop_reason": "tool_use"}


async def client_run(run: Run, options: Any, *prompts: str) -> None:
    async with sdk.ClaudeSDKClient(options) as client:
        for prompt in prompts:
            await client.query(prompt)
            async for m in client.receive_response():
                run.messages.append(m)


async def test_can_use_tool_context_names_the_call_like_claude_code(cli: str, tmp_path: Path) -> None:
    """tool_use_id, description and suggestions: a write inside the working directory suggests accepting
    edits; a read outside it says why it asks and suggests allowing reads under the file's directory."""
    outside = tmp_path / "out"
    outside.mkdir()
    (outside / "o.txt").write_text("OUT\n")
    asked: list[tuple[str, Any]] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        asked.append((name, ctx))
        return sdk.PermissionResultAllow()

    responses = [turn(write("toolu_w1", "$WS/n.txt")), turn(read_at("toolu_o1", str(outside / "o.txt"))), text("ok")]

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read", "Write"], can_use_tool=can_use_tool), "go")

    await scenario(cli, tmp_path, responses, body)
    (w_name, w), (r_name, r) = asked
    assert (w_name, w.tool_use_id, w.description, w.decision_reason) == ("Write", "toolu_w1", "n.txt", None)
    assert [s.to_dict() for s in w.suggestions] == [{"type": "setMode", "mode": "acceptEdits",
                                                     "destination": "session"}]
    assert (r_name, r.tool_use_id, r.description) == ("Read", "toolu_o1", str(outside / "o.txt"))
    assert r.decision_reason == "Path is outside allowed working directories"
    assert [s.to_dict() for s in r.suggestions] == [{"type": "addRules", "destination": "session", "behavior": "allow",
                                                     "rules": [{"toolName": "Read", "ruleContent": f"/{outside}/**"}]}]


async def test_updated_permissions_are_honoured_for_the_session(cli: str, tmp_path: Path) -> None:
    """Answering with the suggestions ("always allow") stops the same question coming back: after
    setMode acceptEdits the second write is not asked, after addRules the second read there is not."""
    outside = tmp_path / "out"
    outside.mkdir()
    (outside / "o.txt").write_text("O\n")
    (outside / "o2.txt").write_text("O2\n")
    asked: list[str] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        asked.append(ctx.tool_use_id)
        return sdk.PermissionResultAllow(updated_permissions=ctx.suggestions)

    responses = [turn(write("toolu_1", "$WS/p1.txt")), turn(write("toolu_2", "$WS/p2.txt")),
                 turn(read_at("toolu_3", str(outside / "o.txt"))), turn(read_at("toolu_4", str(outside / "o2.txt"))),
                 text("ok")]

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read", "Write"], can_use_tool=can_use_tool), "go")

    run = await scenario(cli, tmp_path, responses, body)
    assert asked == ["toolu_1", "toolu_3"]
    assert (run.ws / "p2.txt").read_text() == "x\n"
    modes = [m.data.get("permissionMode") for m in run.messages
             if isinstance(m, sdk.SystemMessage) and m.subtype == "status"]
    assert modes == ["acceptEdits"]
    assert result_text(sent_result(run.server, 4, "toolu_4")).startswith("1\tO2")


async def test_allow_with_updated_input_is_told_to_the_model(cli: str, tmp_path: Path) -> None:
    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        return sdk.PermissionResultAllow(updated_input={**tool_input, "content": "CHANGED\n"})

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Write"], can_use_tool=can_use_tool), "go")

    run = await scenario(cli, tmp_path, [turn(write("toolu_1", "$WS/a1.txt")), text("ok")], body)
    assert (run.ws / "a1.txt").read_text() == "CHANGED\n"
    told = result_text(sent_result(run.server, 1, "toolu_1"))
    assert told.startswith(f"File created successfully at: {run.ws / 'a1.txt'} The user modified your proposed "
                           "content before accepting it.")


async def test_deny_with_interrupt_gives_claude_codes_refusal_and_the_marker(cli: str, tmp_path: Path) -> None:
    async def deny(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        return sdk.PermissionResultDeny(message="DENY_AND_STOP", interrupt=True)

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Write"], can_use_tool=deny), "write", "after")

    run = await scenario(cli, tmp_path, [turn(write("toolu_di", "$WS/d.txt")), text("OK"), text("OK")], body)
    refusal = sent_result(run.server, 1, "toolu_di")
    assert refusal.get("is_error") is True
    assert result_text(refusal).startswith("The user doesn't want to proceed with this tool use. The tool use was "
                                           "rejected")
    shown = [b.text for m in run.messages if isinstance(m, sdk.UserMessage) and isinstance(m.content, list)
             for b in m.content if isinstance(b, sdk.TextBlock)]
    assert shown == ["[Request interrupted by user for tool use]"]
    first, _second = run.results()
    assert (first.subtype, first.terminal_reason, first.num_turns) == ("error_during_execution", "aborted_tools", 3)


async def test_can_use_tool_context_at_the_working_directory_boundary(cli: str, tmp_path: Path) -> None:
    """Issue 28 item 3 through the SDK: a shell command that lists, reads, or copies from a place
    outside, a part of a pipeline that does, and file tools going out through a symlink in the
    workspace: the callback is told what Claude Code 2.1.332 tells it (blocked path, reason, the
    description, and the suggestions that would stop the question coming back)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "o.txt").write_text("O\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "link").symlink_to(out)
    calls = [("Bash", {"command": "ls ../out"}), ("Bash", {"command": "cat ../out/o.txt"}),
             ("Bash", {"command": "cat ../out/o.txt | wc -l"}), ("Bash", {"command": "cp ../out/o.txt h.txt"}),
             ("Read", {"file_path": f"{ws}/link/o.txt"}), ("Glob", {"pattern": "*.txt", "path": f"{ws}/link"}),
             ("Write", {"file_path": f"{ws}/link/w.txt", "content": "x"})]
    asked: list[dict[str, Any]] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        seen = {"name": name, "description": ctx.description, "reason": ctx.decision_reason,
                "blocked": getattr(ctx, "blocked_path", None), "suggestions": [s.to_dict() for s in ctx.suggestions]}
        asked.append(json.loads(json.dumps(seen).replace(str(out.resolve()), "$OUT").replace(str(ws.resolve()), "$WS")))
        return sdk.PermissionResultDeny(message="no")

    responses = [turn({"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": inp})
                 for i, (n, inp) in enumerate(calls)] + [text("ok")]

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read", "Write", "Bash", "Glob"], can_use_tool=can_use_tool), "go")

    await scenario(cli, tmp_path, responses, body)

    def rules(tool: str, content: str, destination: str = "session") -> dict[str, Any]:
        return {"type": "addRules", "destination": destination, "behavior": "allow",
                "rules": [{"toolName": tool, "ruleContent": content}]}

    def shell(command: str, blocked: str | None, place: str) -> dict[str, Any]:
        return {"name": "Bash", "description": command, "reason": None, "blocked": blocked,
                "suggestions": [rules("Bash", command, "localSettings"), rules("Read", f"/{place}/**")]}

    link = "resolves through a symlink to {}, which is outside the allowed working directories"
    assert asked == [
        shell("ls ../out", "$OUT", "$OUT"), shell("cat ../out/o.txt", "$OUT/o.txt", "$OUT"),
        shell("cat ../out/o.txt | wc -l", None, "$OUT"),
        {"name": "Bash", "description": "cp ../out/o.txt h.txt", "reason": None, "blocked": "$OUT/o.txt",
         "suggestions": [rules("Bash", "cp ../out/o.txt h.txt", "localSettings"),
                         {"type": "addDirectories", "destination": "session", "directories": ["$OUT"]},
                         {"type": "setMode", "destination": "session", "mode": "acceptEdits"}]},
        {"name": "Read", "description": "link/o.txt", "reason": "$WS/link/o.txt " + link.format("$OUT/o.txt"),
         "blocked": "$OUT/o.txt", "suggestions": [rules("Read", "/$WS/link/**"), rules("Read", "/$OUT/**")]},
        {"name": "Glob", "description": "*.txt", "reason": "$WS/link " + link.format("$OUT"), "blocked": "$OUT",
         "suggestions": [rules("Read", "/$WS/link/**"), rules("Read", "/$OUT/**")]},
        {"name": "Write", "description": "link/w.txt", "reason": "$WS/link/w.txt " + link.format("$OUT/w.txt"),
         "blocked": "$OUT/w.txt", "suggestions": [{"type": "setMode", "destination": "session", "mode": "acceptEdits"},
                                                  {"type": "addDirectories", "destination": "session",
                                                   "directories": ["$WS/link", "$OUT"]}]}]


async def test_read_outside_the_working_directories_is_denied_in_dont_ask(cli: str, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("SECRET\n")

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read"], permission_mode="dontAsk"), "go")

    run = await scenario(cli, tmp_path, [turn(read_at("toolu_s", str(tmp_path / "secret.txt"))), text("ok")], body)
    refused = sent_result(run.server, 1, "toolu_s")
    assert "SECRET" not in result_text(refused)
    assert result_text(refused).startswith("Permission to use Read has been denied because Claude Code is running in "
                                           "don't ask mode.")
    [result] = run.results()
    assert [d["tool_use_id"] for d in result.permission_denials] == ["toolu_s"]


async def test_add_dirs_are_working_directories_shown_to_the_model(cli: str, tmp_path: Path) -> None:
    extra, outside = tmp_path / "extra", tmp_path / "out"
    extra.mkdir()
    outside.mkdir()
    (extra / "e.txt").write_text("E\n")
    (outside / "o.txt").write_text("O\n")
    asked: list[str] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        asked.append(tool_input["file_path"])
        return sdk.PermissionResultDeny(message="no")

    responses = [turn(read_at("toolu_e", str(extra / "e.txt")), read_at("toolu_o", str(outside / "o.txt"))),
                 text("ok")]

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read"], add_dirs=[str(extra)], can_use_tool=can_use_tool), "go")

    run = await scenario(cli, tmp_path, responses, body)
    assert asked == [str(outside / "o.txt")]  # the added directory is inside the boundary, the other is not
    assert result_text(sent_result(run.server, 1, "toolu_e")).startswith("1\tE")
    import json

    assert str(extra) in json.dumps(run.server.requests[0])  # the model is told of the added directory
    [result] = run.results()
    assert result.num_turns == 3  # 1 + each tool-result message (two parallel reads: two messages)


async def test_plan_mode_asks_can_use_tool_for_a_write(cli: str, tmp_path: Path) -> None:
    asked: list[Any] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        asked.append((name, ctx.description, ctx.suggestions))
        return sdk.PermissionResultAllow()

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read", "Write"], permission_mode="plan",
                                          can_use_tool=can_use_tool), "go")

    run = await scenario(cli, tmp_path, [turn(write("toolu_1", "$WS/pl.txt")), text("ok")], body)
    assert asked == [("Write", "pl.txt", [])]
    assert (run.ws / "pl.txt").read_text() == "x\n"


async def test_model_usage_adds_up_over_the_session(cli: str, tmp_path: Path) -> None:
    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read"]), "first", "second")

    run = await scenario(cli, tmp_path, [text("ONE"), text("TWO")], body)
    first, second = run.results()
    one = first.model_usage["claude-sonnet-4-5"]["inputTokens"]
    assert one == first.usage["input_tokens"] > 0
    assert second.model_usage["claude-sonnet-4-5"]["inputTokens"] == one + second.usage["input_tokens"]
    assert (first.num_turns, second.num_turns) == (1, 1)


async def test_a_failed_resume_gives_the_no_conversation_result(cli: str, tmp_path: Path) -> None:
    missing = "11111111-2222-3333-4444-555555555555"
    raised: list[BaseException] = []

    async def body(run: Run) -> None:
        try:
            await client_run(run, run.options(resume=missing), "hello")
        except Exception as exc:
            raised.append(exc)

    run = await scenario(cli, tmp_path, [text("never")], body)
    assert run.server.requests == []
    [exc] = raised
    assert isinstance(exc, sdk.ResultError), exc
    assert f"No conversation found with session ID: {missing}" in str(exc)


async def test_a_400_is_shown_as_an_error_assistant_message(cli: str, tmp_path: Path) -> None:
    refusal = {"status": 400, "error_type": "invalid_request_error", "message": "Invalid request: bad field"}

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read"]), "go")

    run = await scenario(cli, tmp_path, [refusal] * 3, body)
    [shown] = [m for m in run.messages if isinstance(m, sdk.AssistantMessage)]
    assert [b.text for b in shown.content] == ["API Error: 400 Invalid request: bad field"]
    assert shown.error == "unknown" and shown.usage is not None and shown.usage["output_tokens"] == 0
    [result] = run.results()
    assert (result.is_error, result.result) == (True, "API Error: 400 Invalid request: bad field")
    assert result.usage is not None


async def test_empty_setting_sources_load_no_settings(cli: str, tmp_path: Path) -> None:
    """``setting_sources=[]`` (the SDK's isolation): the project's deny rule is not loaded."""
    import json

    async def body(run: Run) -> None:
        settings = run.ws / ".claude" / "settings.json"
        settings.parent.mkdir(exist_ok=True)
        settings.write_text(json.dumps({"permissions": {"deny": ["Read"]}}))
        await client_run(run, run.options(tools=["Read"], setting_sources=[]), "go")

    run = await scenario(cli, tmp_path, [turn(read("toolu_r", "a.txt")), text("ok")], body)
    assert result_text(sent_result(run.server, 1, "toolu_r")).startswith("1\tALPHA")


async def test_interrupt_stops_a_running_tool(cli: str, tmp_path: Path) -> None:
    bash = {"type": "tool_use", "id": "toolu_sleep", "name": "Bash",
            "input": {"command": "sleep 6 && echo done > slept.txt", "description": "Sleep"}}

    async def body(run: Run) -> None:
        async with sdk.ClaudeSDKClient(run.options(tools=["Bash"], permission_mode="bypassPermissions")) as client:
            await client.query("sleep")
            async for m in client.receive_response():
                run.messages.append(m)
                if isinstance(m, sdk.AssistantMessage):
                    await client.interrupt()

    run = await scenario(cli, tmp_path, [turn(bash), text("never")], body)
    assert not (run.ws / "slept.txt").exists()
    shown = [b.text for m in run.messages if isinstance(m, sdk.UserMessage) and isinstance(m.content, list)
             for b in m.content if isinstance(b, sdk.TextBlock)]
    assert shown == ["[Request interrupted by user for tool use]"]
    [result] = run.results()
    assert result.subtype == "error_during_execution"


async def test_hook_inputs_carry_the_prompt_id_and_stop_lists(cli: str, tmp_path: Path) -> None:
    """Every hook input of a prompt's run names the same ``prompt_id`` (a new one per prompt); Stop
    lists the background tasks and crons (none here)."""
    seen: list[dict[str, Any]] = []

    async def record(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        seen.append(dict(hook_input))
        return {}

    events = ("UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop")

    async def body(run: Run) -> None:
        await client_run(run, run.options(allowed_tools=["Read"], hooks={
            e: [sdk.HookMatcher(hooks=[record])] for e in events}), "one", "two")

    await scenario(cli, tmp_path, [turn(read("toolu_r", "a.txt")), text("ONE"), text("TWO")], body)
    assert [h["hook_event_name"] for h in seen] == [*events, "UserPromptSubmit", "Stop"]
    first, second = {h["prompt_id"] for h in seen[:4]}, {h["prompt_id"] for h in seen[4:]}
    assert len(first) == len(second) == 1 and first != second and all(isinstance(p, str) for p in first)
    assert list(seen[0])[:4] == ["session_id", "transcript_path", "cwd", "prompt_id"]
    stop = seen[3]
    assert (stop["background_tasks"], stop["session_crons"]) == ([], [])


@pytest.mark.parametrize("sources", [None, [], ["project"]])
async def test_claude_md_memory_follows_the_setting_sources(cli: str, tmp_path: Path, sources: Any) -> None:
    """CLAUDE.md files go into the first request's context per source; ``setting_sources=[]`` loads none."""
    import json

    async def body(run: Run) -> None:
        (run.ws / "CLAUDE.md").write_text("PROJECT_MEMORY_MARKER\n")
        (run.ws / "CLAUDE.local.md").write_text("LOCAL_MEMORY_MARKER\n")
        config = tmp_path / "home" / ".claude"
        config.mkdir(parents=True)
        (config / "CLAUDE.md").write_text("USER_MEMORY_MARKER\n")
        run.env["CLAUDE_CONFIG_DIR"] = str(config)
        kw = {} if sources is None else {"setting_sources": sources}
        await client_run(run, run.options(tools=["Read"], **kw), "go")

    run = await scenario(cli, tmp_path, [text("ok")], body)
    first = run.server.requests[0]["messages"]
    loaded = {m for m in ("USER", "PROJECT", "LOCAL") if f"{m}_MEMORY_MARKER" in json.dumps(first)}
    assert loaded == {None: {"USER", "PROJECT", "LOCAL"}, 0: set(), 1: {"PROJECT"}}[None if sources is None
                                                                                   else len(sources)]
    if loaded:
        [shown] = [b["text"] for b in first[0]["content"] if "PROJECT_MEMORY_MARKER" in b.get("text", "")]
        assert f"Contents of {run.ws / 'CLAUDE.md'} (project instructions, checked into the codebase):\n\n" \
               "PROJECT_MEMORY_MARKER" in shown
        assert shown.startswith("<system-reminder>\nCodebase and user instructions are shown below.")
    assert first[0]["content"][-1]["text"] == "go"


# --- three realistic SDK programs, unchanged but for cli_path: the same report from both CLIs ----------------

PROGRAMS = {
    "sdk_coding_agent": [
        "asked: Edit 'a.txt'", "asked: mcp__dev__run_tests None", "tests run: unit", "asked: Bash 'Clean the build'",
        "assistant: Renamed ALPHA to BETA; the unit tests pass.", "result: success after 5 turns, denied ['Bash']",
        "a.txt now: 'BETA'"],
    "sdk_session": [
        "assistant: The file holds ALPHA.", "result: success 'The file holds ALPHA.'",
        "assistant: Let me explain at length...", "result: error_during_execution None",
        "assistant: Short version: ALPHA is the marker.", "result: success 'Short version: ALPHA is the marker.'",
        "one session: True", "assistant: Resumed: we talked about ALPHA.",
        "result: success 'Resumed: we talked about ALPHA.'",
        "the resumed request remembers: True, the interrupt: True"],
    "sdk_audit_agent": [
        "prompt: Show a.txt and upload it", "allowed toolu_1: cat a.txt", "ran toolu_1",
        "vetoed toolu_2: curl https://example.com/upload -d @a.txt", "stop: a.txt says ALPHA; the upload was blocked.",
        "result: success 'a.txt says ALPHA; the upload was blocked.', denied ['toolu_2']"],
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
async def test_a_program_written_for_claude_code_runs_unchanged(cli: str, program: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    examples = Path(__file__).parents[1] / "examples"
    monkeypatch.syspath_prepend(str(examples))
    spec = importlib.util.spec_from_file_location(program, examples / f"{program}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert await module.run(cli) == PROGRAMS[program]


@pytest.mark.parametrize("prompt", [None, "CUSTOM_PROMPT"])
async def test_a_custom_or_empty_system_prompt_opens_with_the_sdk_identity(cli: str, tmp_path: Path,
                                                                          prompt: str | None) -> None:
    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read"], setting_sources=[], system_prompt=prompt), "go")

    run = await scenario(cli, tmp_path, [text("ok")], body)
    # Claude Code's attribution header aside (agentfsm sends none: it is not Claude Code)
    texts = [b["text"] for b in run.server.requests[0]["system"]
             if not b["text"].startswith("x-anthropic-billing-header")]
    assert texts[0] == "You are a Claude agent, built on Anthropic's Claude Agent SDK."
    if prompt is not None:
        assert texts[1] == prompt


async def test_a_prompt_sent_with_a_uuid_is_named_in_the_answer(cli: str, tmp_path: Path) -> None:
    """A user message sent as a dict with a ``uuid`` is echoed: on the first assistant message of its
    turn and on the result (``user_message_uuid`` and ``user_message_uuids``)."""
    import uuid as uuidlib

    sent = [str(uuidlib.uuid4()), str(uuidlib.uuid4())]

    def one(text_: str, uid: str) -> Any:
        async def gen() -> Any:
            yield {"type": "user", "message": {"role": "user", "content": text_}, "parent_tool_use_id": None,
                   "uuid": uid}
        return gen()

    async def body(run: Run) -> None:
        async with sdk.ClaudeSDKClient(run.options(allowed_tools=["Read"])) as client:
            for prompt, uid in zip(("first", "second"), sent, strict=True):
                await client.query(one(prompt, uid))
                async for m in client.receive_response():
                    run.messages.append(m)

    run = await scenario(cli, tmp_path, [turn(read("toolu_r", "a.txt")), text("ONE"), text("TWO")], body)
    first, second = run.results()
    assert (first.user_message_uuid, first.user_message_uuids) == (sent[0], [sent[0]])
    assert (second.user_message_uuid, second.user_message_uuids) == (sent[1], [sent[1]])
    answers = [m for m in run.messages if isinstance(m, sdk.AssistantMessage)]
    assert [a.user_message_uuid for a in answers] == [sent[0], None, sent[1]]


@pytest.mark.parametrize(("event", "expected"), [
    ("PreToolUse", ("", "hook_stopped", 2)),  # the last answer was a tool call: no text
    ("Stop", ("ok", "stop_hook_prevented", 1)),
    ("UserPromptSubmit", ("Operation stopped by hook: HOOK_SAYS_STOP", None, 0)),
])
async def test_the_result_after_a_hook_stops_the_run(cli: str, tmp_path: Path, event: str,
                                                     expected: tuple[str, str | None, int]) -> None:
    async def stop(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        return {"continue": False, "stopReason": "HOOK_SAYS_STOP"}

    async def body(run: Run) -> None:
        await client_run(run, run.options(allowed_tools=["Read"], hooks={event: [sdk.HookMatcher(hooks=[stop])]}),
                         "go")

    first = turn(read("toolu_r", "a.txt")) if event == "PreToolUse" else text("ok")
    run = await scenario(cli, tmp_path, [first, text("never")], body)
    [result] = run.results()
    text_, reason, turns = expected
    assert (result.subtype, result.result, result.num_turns) == ("success", text_, turns)
    if reason is not None:  # Claude Code gives no terminal_reason for a prompt a hook stopped
        assert result.terminal_reason == reason


async def test_a_shell_command_reading_outside_asks_like_a_read(cli: str, tmp_path: Path) -> None:
    """The boundary holds in the shell too: a read-only command reading outside the working directories
    asks (``blocked_path`` names the file); one reading inside does not."""
    (tmp_path / "secret.txt").write_text("SECRET\n")
    asked: list[tuple[str, Any, Any]] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], ctx: Any) -> Any:
        asked.append((tool_input["command"], ctx.blocked_path, ctx.description))
        return sdk.PermissionResultDeny(message="no")

    def sh(tool_id: str, command: str) -> dict[str, Any]:
        return {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": command, "description": "Show"}}

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Bash"], can_use_tool=can_use_tool), "go")

    outside = str(tmp_path / "secret.txt")
    run = await scenario(cli, tmp_path, [turn(sh("toolu_o", f"cat {outside}")), turn(sh("toolu_i", "cat a.txt")),
                                         text("ok")], body)
    assert asked == [(f"cat {outside}", outside, "Show")]
    assert "SECRET" not in result_text(sent_result(run.server, 1, "toolu_o"))
    assert "ALPHA" in result_text(sent_result(run.server, 2, "toolu_i"))


def _tool(tool_id: str, name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}


async def test_structured_tool_results_and_completed_inputs(cli: str, tmp_path: Path) -> None:
    """``UserMessage.tool_use_result`` and PostToolUse's ``tool_response`` are each tool's structured
    result (Write and Edit with their patch), a failure's is its ``Error: ...`` text and goes to
    PostToolUseFailure; Edit's input shows ``replace_all: false`` everywhere. Recorded from Claude
    Code 2.1.332."""
    calls = [_tool("toolu_ra", "Read", file_path="$WS/a.txt"),
             _tool("toolu_r", "Read", file_path="$WS/multi.txt", offset=2, limit=2),
             _tool("toolu_new", "Write", file_path="$WS/new.txt", content="one\ntwo\n"),
             _tool("toolu_upd", "Write", file_path="$WS/a.txt", content="ALPHA\nMORE\n"),
             _tool("toolu_e", "Edit", file_path="$WS/multi.txt", old_string="line3", new_string="LINE3\nextra"),
             _tool("toolu_all", "Edit", file_path="$WS/multi.txt", old_string="x", new_string="y", replace_all=True),
             _tool("toolu_sh", "Bash", command="echo out; echo err >&2", description="print"),
             _tool("toolu_fail", "Bash", command="echo fail; exit 3"),
             _tool("toolu_gone", "Read", file_path="$WS/missing.txt"),
             _tool("toolu_nf", "Edit", file_path="$WS/multi.txt", old_string="notthere", new_string="q")]
    hooks: dict[str, list[dict[str, Any]]] = {"PreToolUse": [], "PostToolUse": [], "PostToolUseFailure": []}

    def recorder(event: str) -> Any:
        async def hook(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
            hooks[event].append(dict(hook_input))
            return {}
        return hook

    async def body(run: Run) -> None:
        (run.ws / "multi.txt").write_text("line1\nline2\nline3\nline4 x\nline5 x\n")
        await client_run(run, run.options(tools=["Read", "Write", "Edit", "Bash"], permission_mode="bypassPermissions",
                                          hooks={e: [sdk.HookMatcher(hooks=[recorder(e)])] for e in hooks}), "go")

    run = await scenario(cli, tmp_path, [turn(c) for c in calls] + [text("done")], body)
    ws = str(run.ws)

    def local(value: Any) -> Any:
        return json.loads(json.dumps(value).replace(ws, "$WS"))

    results = {b.tool_use_id: local(m.tool_use_result) for m in run.messages
               if isinstance(m, sdk.UserMessage) and isinstance(m.content, list)
               for b in m.content if isinstance(b, sdk.ToolResultBlock)}
    multi = "line1\nline2\nline3\nline4 x\nline5 x\n"
    edited = "line1\nline2\nLINE3\nextra\nline4 x\nline5 x\n"
    assert results == {
        "toolu_ra": {"type": "text", "file": {"filePath": "$WS/a.txt", "content": "ALPHA\n", "numLines": 2,
                                              "startLine": 1, "totalLines": 2}},
        "toolu_r": {"type": "text", "file": {"filePath": "$WS/multi.txt", "content": "line2\nline3", "numLines": 2,
                                             "startLine": 2, "totalLines": 6}},
        "toolu_new": {"type": "create", "filePath": "$WS/new.txt", "content": "one\ntwo\n", "structuredPatch": [],
                      "originalFile": None, "userModified": False},
        "toolu_upd": {"type": "update", "filePath": "$WS/a.txt", "content": "ALPHA\nMORE\n", "structuredPatch": [
            {"oldStart": 1, "oldLines": 1, "newStart": 1, "newLines": 2, "lines": [" ALPHA", "+MORE"]}],
            "originalFile": "ALPHA\n", "userModified": False},
        "toolu_e": {"filePath": "$WS/multi.txt", "oldString": "line3", "newString": "LINE3\nextra",
                    "originalFile": multi,
                    "structuredPatch": [{"oldStart": 1, "oldLines": 5, "newStart": 1, "newLines": 6, "lines": [
                        " line1", " line2", "-line3", "+LINE3", "+extra", " line4 x", " line5 x"]}],
                    "userModified": False, "replaceAll": False, "contentNotInModelContext": True},
        "toolu_all": {"filePath": "$WS/multi.txt", "oldString": "x", "newString": "y", "originalFile": edited,
                      "structuredPatch": [{"oldStart": 1, "oldLines": 6, "newStart": 1, "newLines": 6, "lines": [
                          " line1", " line2", " LINE3", "-extra", "-line4 x", "-line5 x", "+eytra", "+line4 y",
                          "+line5 y"]}],
                      "userModified": False, "replaceAll": True, "contentNotInModelContext": True},
        "toolu_sh": {"stdout": "out\nerr", "stderr": "", "interrupted": False, "isImage": False,
                     "noOutputExpected": False},
        "toolu_fail": "Error: Exit code 3\nfail",
        "toolu_gone": "Error: File does not exist. Note: your current working directory is $WS.",
        "toolu_nf": "Error: String to replace not found in file.\nString: notthere",
    }
    post = {h["tool_use_id"]: local(h["tool_response"]) for h in hooks["PostToolUse"]}
    assert post == {k: v for k, v in results.items() if not isinstance(v, str)}
    assert all(isinstance(h["duration_ms"], int) for h in hooks["PostToolUse"] + hooks["PostToolUseFailure"])
    assert [(h["tool_use_id"], local(h["error"])) for h in hooks["PostToolUseFailure"]] == [
        ("toolu_fail", "Exit code 3\nfail"),
        ("toolu_gone", "File does not exist. Note: your current working directory is $WS.")]
    pre = {h["tool_use_id"]: h["tool_input"] for h in hooks["PreToolUse"]}
    assert pre["toolu_e"]["replace_all"] is False and "replace_all" not in pre["toolu_upd"]
    shown = {b.id: b.input for m in run.messages if isinstance(m, sdk.AssistantMessage)
             for b in m.content if isinstance(b, sdk.ToolUseBlock)}
    assert shown["toolu_e"]["replace_all"] is False and shown["toolu_all"]["replace_all"] is True
    sent = [b["input"] for m in run.server.requests[-1]["messages"] if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use" and b["id"] == "toolu_e"]
    assert sent == [shown["toolu_e"]]  # the model's history shows the completed input too


@pytest.mark.parametrize("forward", [False, True])
async def test_a_subagents_prompt_and_final_text_follow_forward_subagent_text(cli: str, tmp_path: Path,
                                                                            forward: bool) -> None:
    """A foreground subagent's prompt is shown under its Agent call; its final text only with
    ``forward_subagent_text``; its tool results carry no structured result; SubagentStart runs and
    the subagent's hook inputs name it (``agent_id``, ``agent_type``). Recorded from Claude Code 2.1.332."""
    agent = _tool("toolu_agent", "Agent", description="Read a", prompt="Read a.txt and say its word",
                  subagent_type="general-purpose", run_in_background=False)
    seen: list[dict[str, Any]] = []

    async def record(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        seen.append(dict(hook_input))
        return {}

    async def body(run: Run) -> None:
        events = ("PreToolUse", "PostToolUse", "SubagentStart", "SubagentStop")
        await client_run(run, run.options(tools=["Read", "Agent"], permission_mode="bypassPermissions",
                                          forward_subagent_text=forward,
                                          hooks={e: [sdk.HookMatcher(hooks=[record])] for e in events}), "delegate")

    run = await scenario(cli, tmp_path, [turn(agent), turn(read("toolu_sub_read", "a.txt")), text("SUB_SAYS_ALPHA"),
                                         text("MAIN_DONE")], body)
    under = [m for m in run.messages if isinstance(m, sdk.UserMessage | sdk.AssistantMessage)
             and m.parent_tool_use_id == "toolu_agent"]
    shown = [(type(m).__name__, [type(b).__name__ for b in m.content]) for m in under]
    assert shown == [("UserMessage", ["TextBlock"]), ("AssistantMessage", ["ToolUseBlock"]),
                     ("UserMessage", ["ToolResultBlock"])] + ([("AssistantMessage", ["TextBlock"])] if forward else [])
    assert under[0].content[0].text == "Read a.txt and say its word"
    assert [m.tool_use_result for m in under if isinstance(m, sdk.UserMessage)] == [None, None]
    events = [(h["hook_event_name"], h.get("tool_name")) for h in seen]
    assert events == [("PreToolUse", "Agent"), ("SubagentStart", None), ("PreToolUse", "Read"),
                      ("PostToolUse", "Read"), ("SubagentStop", None), ("PostToolUse", "Agent")]
    start = seen[1]
    agent_id = start["agent_id"]
    assert isinstance(agent_id, str) and agent_id and start["agent_type"] == "general-purpose"
    for h in seen[2:5]:  # the subagent's own events name it, under the session's ids and prompt
        assert (h["agent_id"], h["agent_type"]) == (agent_id, "general-purpose")
        assert [h[k] for k in ("session_id", "transcript_path", "prompt_id")] == [
            seen[0][k] for k in ("session_id", "transcript_path", "prompt_id")]
    for h in (seen[0], seen[5]):  # the main session's do not
        assert "agent_id" not in h and "agent_type" not in h
    [result] = run.results()
    assert result.result == "MAIN_DONE"


async def test_the_sdks_session_helpers_find_the_session(cli: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``list_sessions`` and ``get_session_messages`` (reading ``$CLAUDE_CONFIG_DIR``) find the session
    and its conversation, prompt to answer, as they do for Claude Code; a resumed session goes on in
    the same transcript."""
    config = tmp_path / "claude-config"

    async def body(run: Run) -> None:
        run.env["CLAUDE_CONFIG_DIR"] = str(config)
        await client_run(run, run.options(allowed_tools=["Read"]), "Read a.txt please")
        [first] = run.results()
        async for m in sdk.query(prompt="and again", options=run.options(allowed_tools=["Read"],
                                                                        resume=first.session_id)):
            run.messages.append(m)

    responses = [{"blocks": [{"type": "text", "text": "Reading."}, read("toolu_r", "a.txt")],
                  "stop_reason": "tool_use"}, text("It says ALPHA."), text("Still ALPHA.")]
    run = await scenario(cli, tmp_path, responses, body)
    first, second = run.results()
    assert first.session_id == second.session_id
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    found = sdk.list_sessions(directory=str(run.ws))
    messages = sdk.get_session_messages(first.session_id, directory=str(run.ws))
    assert [(s.session_id, s.first_prompt) for s in found] == [(first.session_id, "Read a.txt please")]

    def shown(m: Any) -> tuple[str, list[str]]:
        content = m.message["content"]
        if isinstance(content, str):
            return m.type, ["text:" + content]
        return m.type, [b["type"] + ":" + (b.get("text") or b.get("name") or b.get("tool_use_id") or "")
                        for b in content]

    assert [shown(m) for m in messages] == [
        ("user", ["text:Read a.txt please"]), ("assistant", ["text:Reading."]), ("assistant", ["tool_use:Read"]),
        ("user", ["tool_result:toolu_r"]), ("assistant", ["text:It says ALPHA."]),
        ("user", ["text:and again"]), ("assistant", ["text:Still ALPHA."])]
    if cli == AGENTFSM:  # agentfsm audit reads the transcript as the Claude Code transcript it is laid out as
        from agentfsm.auditing.audit import audit_report

        [path] = (config / "projects").rglob("*.jsonl")
        report = audit_report(path)
        assert report.errors == 0, [str(f) for f in report.findings]
        assert report.moves


@pytest.mark.parametrize(("option", "named"), [({"plugins": [{"type": "local", "path": "plugin"}]}, "--plugin-dir"),
                                               ({"skills": ["review"]}, "skills are not supported")])
async def test_plugins_and_skills_are_refused_by_name(tmp_path: Path, option: dict[str, Any], named: str) -> None:
    """agentfsm loads no plugins and has no Skill tool: the SDK's options for them stop the run with a
    usage error that names them (never a run that silently lacks them)."""
    said: list[str] = []

    async def body(run: Run) -> None:
        with pytest.raises(Exception):  # noqa: B017 - the SDK raises its own process/connection errors
            await client_run(run, run.options(stderr=said.append, **option), "go")

    await scenario(AGENTFSM, tmp_path, [text("never")], body)
    assert any(named in line and "not supported" in line for line in said), said


async def test_a_deferred_call_is_named_in_the_result(cli: str, tmp_path: Path) -> None:
    """A PreToolUse ``defer`` ends the run with the call in ``deferred_tool_use``, ``tool_deferred`` as
    the stop reason, and no tool result shown (Claude Code 2.1.332)."""
    async def defer(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "defer"}}

    async def body(run: Run) -> None:
        await client_run(run, run.options(allowed_tools=["Read"], hooks={
            "PreToolUse": [sdk.HookMatcher(hooks=[defer])]}), "go")

    run = await scenario(cli, tmp_path, [turn(read("toolu_d", "a.txt")), text("never")], body)
    [result] = run.results()
    assert (result.subtype, result.stop_reason, result.num_turns) == ("success", "tool_deferred", 1)
    deferred = result.deferred_tool_use
    assert (deferred.id, deferred.name, deferred.input) == ("toolu_d", "Read", {"file_path": f"{run.ws}/a.txt"})
    assert not tool_results(run.messages)


@pytest.mark.parametrize(("option", "sent"), [
    ({"max_thinking_tokens": 2048}, {"type": "enabled", "budget_tokens": 2048, "display": "updates"}),
    ({"thinking": {"type": "enabled", "budget_tokens": 3000}}, {"type": "enabled", "budget_tokens": 3000,
                                                                "display": "updates"}),
    ({"thinking": {"type": "enabled", "budget_tokens": 3000, "display": "summarized"}},
     {"type": "enabled", "budget_tokens": 3000, "display": "summarized"}),
    ({"thinking": {"type": "adaptive"}}, {"type": "enabled", "budget_tokens": 31999, "display": "updates"}),
    ({"thinking": {"type": "disabled"}}, {"type": "disabled"}),
], ids=["max_thinking_tokens", "enabled", "display", "adaptive", "disabled"])
async def test_the_thinking_the_sdk_asks_for_is_sent(cli: str, tmp_path: Path, option: dict[str, Any],
                                                     sent: dict[str, Any]) -> None:
    """The SDK's thinking options reach every request as Claude Code 2.1.332 sends them (claude-sonnet-4-5:
    ``adaptive`` takes the whole output budget less one token)."""
    async def body(run: Run) -> None:
        await client_run(run, run.options(**option), "hi")

    run = await scenario(cli, tmp_path, [text("ok")], body)
    assert [r.get("thinking") for r in run.server.requests] == [sent]


async def test_a_background_subagent_is_told_as_task_messages(cli: str, tmp_path: Path) -> None:
    """An Agent call runs in the background (Claude Code 2.1.332's default): the SDK sees
    TaskStartedMessage, TaskUpdatedMessage (completed) and TaskNotificationMessage for it, with the
    same fields, naming the call."""
    agent = _tool("toolu_agent", "Agent", description="Read a", prompt="Read a.txt", subagent_type="general-purpose")

    async def body(run: Run) -> None:
        await client_run(run, run.options(tools=["Read", "Agent"], permission_mode="bypassPermissions"), "delegate")

    run = await scenario(cli, tmp_path, [turn(agent), text("MAIN_WAIT"), text("SUB"), text("MAIN_DONE")], body)
    tasks = [m for m in run.messages if type(m).__name__.startswith("Task")]
    assert [type(m).__name__ for m in tasks] == ["TaskStartedMessage", "TaskUpdatedMessage",
                                                  "TaskNotificationMessage"]
    started, updated, notified = tasks
    assert len({m.task_id for m in tasks}) == 1
    assert (started.tool_use_id, started.description, started.task_type) == ("toolu_agent", "Read a", "local_agent")
    assert (updated.status, updated.patch["status"]) == ("completed", "completed")
    assert (notified.status, notified.tool_use_id) == ("completed", "toolu_agent")
    assert isinstance(notified.output_file, str) and isinstance(notified.summary, str)


async def test_effort_leaves_the_request_and_the_hook_inputs_as_they_are(cli: str, tmp_path: Path) -> None:
    """``effort="low"`` with claude-sonnet-4-5: Claude Code 2.1.332 puts it neither in the request nor in
    the hook inputs; neither does agentfsm."""
    seen: list[dict[str, Any]] = []

    async def record(hook_input: Any, tool_use_id: Any, ctx: Any) -> Any:
        seen.append(dict(hook_input))
        return {}

    async def body(run: Run) -> None:
        await client_run(run, run.options(allowed_tools=["Read"], effort="low", hooks={
            e: [sdk.HookMatcher(hooks=[record])] for e in ("UserPromptSubmit", "PreToolUse", "Stop")}), "go")

    run = await scenario(cli, tmp_path, [turn(read("toolu_r", "a.txt")), text("ok")], body)
    assert [h["hook_event_name"] for h in seen] == ["UserPromptSubmit", "PreToolUse", "Stop"]
    assert not any("effort" in h for h in seen)
    assert not any("effort" in r or r.get("output_config") for r in run.server.requests)
