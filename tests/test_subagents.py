"""Subagents: the Agent tool runs a separate loop — isolated requests, own tools, own session file —
whose result returns to the parent as the tool result (foreground) or as a task notification
through the parent's queue (background)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentfsm.hooks.runner import HookMatcher
from agentfsm.llm.model import ModelRequest
from agentfsm.machine.options import AgentDefinition, Options
from agentfsm.machine.prompts import task_notification
from agentfsm.machine.state import Limits
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.testing.server import ScriptedServer
from agentfsm.tools import AgentTool


def agent_call(prompt: str, *, background: bool = False, kind: str = "general-purpose",
               tid: str = "toolu_agent") -> dict[str, Any]:
    # Claude Code 2.1.332 runs an agent in the background unless told otherwise: the foreground is explicit
    args: dict[str, Any] = {"description": "child task", "prompt": prompt, "subagent_type": kind,
                            "run_in_background": background}
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Agent", "input": args}]}


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], **kw}


def is_parent(request: ModelRequest) -> bool:
    return any(t["name"] == "Agent" for t in request.tools)


def all_text(body: Mapping[str, Any]) -> str:
    return json.dumps(body["messages"])


def options(tmp_path: Path, **kw: Any) -> Options:
    kw.setdefault("tools", ("Agent", "Read", "Glob"))
    return Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), **kw)


class Recorder:
    """Routes each request to the parent's or the child's script and keeps them apart."""

    def __init__(self, parent: list[Any], child: list[Any]) -> None:
        self.parent, self.child = parent, child
        self.parent_requests: list[ModelRequest] = []
        self.child_requests: list[ModelRequest] = []

    def __call__(self, request: ModelRequest, n: int) -> Any:
        if is_parent(request):
            self.parent_requests.append(request)
            script = self.parent
        else:
            self.child_requests.append(request)
            script = self.child
        item = script[n] if n < len(script) else text("EXHAUSTED")
        return item(request) if callable(item) else item


async def test_foreground_subagent_returns_its_final_text(tmp_path: Path) -> None:
    stops: list[Any] = []

    async def on_subagent_stop(record: Any) -> None:
        stops.append(record)

    rec = Recorder([agent_call("CHILD_TASK_PROMPT"), text("PARENT_OK")],
                   [text("CHILD_RESULT_MARKER")])
    model = ScriptedModel(rec, per_session=True)
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path, hooks={"SubagentStop": [HookMatcher(hooks=[on_subagent_stop])]}),
                      client=model, emit=seen.append)
    result = await session.run("PARENT_PROMPT")
    await session.aclose()
    assert result.result == "PARENT_OK" and result.num_turns == 2
    # isolated request streams: the child sees its prompt only, and not the Agent tool
    (child_req,) = rec.child_requests
    prompt_only = {"role": "user", "content": [{"type": "text", "text": "CHILD_TASK_PROMPT"}]}
    assert child_req.messages == (prompt_only,)
    assert [t["name"] for t in child_req.tools] == ["Glob", "Read"]
    assert "PARENT_PROMPT" not in json.dumps(child_req.body())
    child_user = child_req.metadata["user_id"]
    assert child_user != rec.parent_requests[0].metadata["user_id"]
    assert "general-purpose" not in json.dumps(child_req.system) and "agent for agentfsm" in json.dumps(
        child_req.system)
    # the parent's next request carries the child's answer as the Agent call's result
    result_block = rec.parent_requests[1].messages[-1]["content"][0]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_agent"
    assert result_block["content"][0] == {"type": "text", "text": "CHILD_RESULT_MARKER"}
    assert "agentId:" in result_block["content"][1]["text"]
    assert "CHILD_RESULT_MARKER" not in json.dumps(rec.parent_requests[0].body())
    # the child's own session file, below the parent's, naming it
    child_id = child_user.removeprefix("session_")
    child_file = tmp_path / "sessions" / session.session_id / "subagents" / f"{child_id}.jsonl"
    header = next(read_records(child_file))
    assert header["parent_session_id"] == session.session_id and header["session_id"] == child_id
    assert not (tmp_path / "sessions" / f"{child_id}.jsonl").exists()
    # SubagentStop ran with the child's identity; the child's blocks showed in the parent's stream
    (stop,) = stops
    assert stop.agent_id == child_id and stop.agent_type == "general-purpose"
    assert stop.agent_transcript_path == str(child_file)
    assert stop.last_assistant_message == "CHILD_RESULT_MARKER" and stop.session_id == session.session_id
    forwarded = [m for m in seen if m.get("parent_tool_use_id") == "toolu_agent"]
    assert forwarded and all(m["session_id"] == session.session_id for m in forwarded)
    assert [m["type"] for m in seen].count("result") == 1 and seen[-1]["type"] == "result"


async def test_background_subagent_notifies_the_parent_through_its_queue(tmp_path: Path) -> None:
    child_done = asyncio.Event()

    def child_answer(request: ModelRequest) -> dict[str, Any]:
        child_done.set()
        return text("SUBAGENT_CHILD_RESULT_MARKER", delay_s=0.3)

    rec = Recorder([agent_call("BG_TASK", background=True), text("WAITING_FOR_CHILD"),
                    text("SUBAGENT_PARENT_OK")], [child_answer])
    model = ScriptedModel(rec, per_session=True)
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path), client=model, emit=seen.append)
    result = await session.run("LAUNCH_IN_BACKGROUND")
    await session.aclose()
    assert result.result == "SUBAGENT_PARENT_OK"
    # three parent requests: launch, wait, consume the notification
    _launch, wait, consume = rec.parent_requests
    launched = wait.messages[-1]["content"][0]
    assert launched["type"] == "tool_result" and "Async agent launched successfully" in launched["content"]
    assert "SUBAGENT_CHILD_RESULT_MARKER" not in json.dumps(wait.body())
    last_user = consume.messages[-1]
    assert last_user["role"] == "user"
    note = "".join(b.get("text", "") for b in last_user["content"])
    assert note.startswith("<system-reminder>\n") and "NOT USER INPUT" in note
    assert "<task-notification>" in note and "<result>SUBAGENT_CHILD_RESULT_MARKER</result>" in note
    assert "<status>completed</status>" in note and "<tool-use-id>toolu_agent</tool-use-id>" in note
    assert '<summary>Agent "child task" finished</summary>' in note and "<subagent_tokens>" in note
    (child_req,) = rec.child_requests
    assert "LAUNCH_IN_BACKGROUND" not in json.dumps(child_req.body())
    # the notification went through the queue, with its lifecycle, and was announced
    kinds = [(m.get("subtype"), m.get("state")) for m in seen if m["type"] == "system"]
    assert ("task_notification", None) in kinds
    assert [s for k, s in kinds if k == "command_lifecycle"] == ["queued", "started", "completed"]
    # a result per pass, the first held back while the subagent ran (Claude Code's; its
    # tests/fixtures/background/subagent_background): the last one is the run's
    shown = [(m["result"], m["num_turns"]) for m in seen if m["type"] == "result"]
    assert shown == [("WAITING_FOR_CHILD", 2), ("SUBAGENT_PARENT_OK", 1)] and seen[-1]["type"] == "result"
    assert result.num_turns == 1
    assert session.background_agents == ()


async def test_a_notification_that_arrives_mid_turn_is_absorbed_after_the_tool_batch(tmp_path: Path) -> None:
    def parent_second(request: ModelRequest) -> dict[str, Any]:
        # the parent keeps working (a slow response, then a Glob) while the child finishes
        glob = {"type": "tool_use", "id": "toolu_glob", "name": "Glob", "input": {"pattern": "*"}}
        return {"blocks": [glob], "delay_s": 0.5}

    rec = Recorder([agent_call("FAST_BG", background=True), parent_second, text("PARENT_DONE")],
                   [text("CHILD_FAST")])
    model = ScriptedModel(rec, per_session=True)
    session = Session(options(tmp_path), client=model)
    result = await session.run("GO")
    await session.aclose()
    assert result.result == "PARENT_DONE"
    assert len(rec.parent_requests) == 3  # no extra follow-up run: the batch absorbed it
    last_user = rec.parent_requests[2].messages[-1]
    kinds = [b["type"] for b in last_user["content"]]
    assert kinds[0] == "tool_result" and "<task-notification>" in json.dumps(last_user)


async def test_subagent_stop_hook_can_make_the_subagent_keep_going(tmp_path: Path) -> None:
    calls: list[bool] = []

    async def block_once(record: Any) -> Any:
        calls.append(record.stop_hook_active)
        if not record.stop_hook_active:
            return {"decision": "block", "reason": "KEEP_GOING_REASON"}
        return None

    rec = Recorder([agent_call("T"), text("P")], [text("C1"), text("C2")])
    session = Session(options(tmp_path, hooks={"SubagentStop": [HookMatcher(hooks=[block_once])]}),
                      client=ScriptedModel(rec, per_session=True))
    result = await session.run("X")
    await session.aclose()
    assert result.result == "P" and calls == [False, True]
    assert len(rec.child_requests) == 2 and "KEEP_GOING_REASON" in json.dumps(rec.child_requests[1].body())
    assert rec.parent_requests[1].messages[-1]["content"][0]["content"][0]["text"] == "C2"


async def test_custom_agent_types_tools_and_prompt(tmp_path: Path) -> None:
    reviewer = AgentDefinition(description="Reviews code.", prompt="REVIEWER_SYSTEM_PROMPT", tools=("Read",),
                               limits=Limits(max_turns=3))
    rec = Recorder([agent_call("review it", kind="reviewer"), agent_call("x", kind="nope", tid="t2"),
                    text("END")], [text("LGTM")])
    session = Session(options(tmp_path, agents={"reviewer": reviewer}),
                      client=ScriptedModel(rec, per_session=True))
    assert "- reviewer: Reviews code." in session.registry["Agent"].description
    result = await session.run("go")
    await session.aclose()
    assert result.result == "END"
    (child,) = rec.child_requests
    assert [t["name"] for t in child.tools] == ["Read"]
    assert "REVIEWER_SYSTEM_PROMPT" in json.dumps(child.system)
    unknown = rec.parent_requests[2].messages[-1]["content"][0]
    assert unknown["is_error"] is True and "Agent type 'nope' not found" in json.dumps(unknown)


async def test_an_agent_with_nothing_to_do_is_refused_and_never_started(tmp_path: Path) -> None:
    """A prompt that is empty or only blanks starts no subagent: the model is told the prompt is empty."""
    rec = Recorder([agent_call("   \n\t"), agent_call("", tid="t2"), agent_call(" do it ", tid="t3"), text("END")],
                   [text("DONE")])
    session = Session(options(tmp_path), client=ScriptedModel(rec, per_session=True))
    result = await session.run("go")
    await session.aclose()
    assert result.result == "END"
    for turn in (1, 2):
        [answer] = rec.parent_requests[turn].messages[-1]["content"]
        assert answer["is_error"] is True and "The agent prompt is empty" in json.dumps(answer)
    assert len(rec.child_requests) == 1  # only the third call, which has something to do, ran


async def test_aborting_the_parent_aborts_a_foreground_subagent(tmp_path: Path) -> None:
    started = asyncio.Event()

    def slow_child(request: ModelRequest) -> dict[str, Any]:
        started.set()
        # a long pause between blocks: the child is streaming when the abort comes
        return {"blocks": [{"type": "text", "text": "PART"}, {"type": "text", "text": "TOO_LATE"}],
                "block_delay_s": 5}

    rec = Recorder([agent_call("slow")], [slow_child])
    session = Session(options(tmp_path), client=ScriptedModel(rec, per_session=True))
    run = asyncio.ensure_future(session.run("go"))
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.05)
    session.interrupt()
    result = await asyncio.wait_for(run, 5)
    await session.aclose()
    assert result.is_error and result.terminal_reason.value.startswith("aborted")
    (child_file,) = (tmp_path / "sessions" / session.session_id / "subagents").glob("*.jsonl")
    child_result = [r for r in read_records(child_file) if r["type"] == "result"]
    assert child_result and child_result[-1]["terminal_reason"].startswith("aborted")


async def test_teardown_stops_background_agents(tmp_path: Path) -> None:
    started = asyncio.Event()

    def slow_child(request: ModelRequest) -> dict[str, Any]:
        started.set()
        return text("NEVER", delay_s=30)

    rec = Recorder([agent_call("bg", background=True), text("I launched it")], [slow_child])
    # the host moves the run to the background before its second request: an end after which the run
    # does not wait for its background work (graph.NOT_NOTIFIED_AFTER), so the agent still runs
    session = Session(options(tmp_path, should_stop_before_next_call=lambda s: "moved" if s.turn_count > 1 else None),
                      client=ScriptedModel(rec, per_session=True))
    result = await session.run("go")
    assert result.terminal_reason.value == "background_requested"
    await asyncio.wait_for(started.wait(), 5)
    assert len(session.background_agents) == 1
    await asyncio.wait_for(session.aclose(), 10)
    assert session.background_agents == () and session.queue.pending == ()


def test_agent_tool_schema_and_notification_text() -> None:
    tool = AgentTool()
    assert tool.name == "Agent" and "Task" in tool.aliases
    assert tool.input_schema["required"] == ["description", "prompt", "subagent_type"]
    assert set(tool.input_schema["properties"]) == {"description", "prompt", "subagent_type",
                                                    "run_in_background"}
    assert tool.is_concurrency_safe({}) and tool.is_read_only({})
    assert tool.input_schema["properties"]["run_in_background"]["description"].startswith(
        "Agents run in the background by default")
    note = task_notification(task_id="a1", tool_use_id="t1", output_file="/o", status="completed",
                             summary='Agent "find <x>" finished', result="R & D")
    assert "<task-id>a1</task-id>" in note and "find &lt;x&gt;" in note and "<result>R &amp; D</result>" in note


@pytest.mark.server
def test_background_agent_through_the_cli(agentfsm_workspace: Path, tmp_path: Path) -> None:
    rec = Recorder([agent_call("CLI_CHILD_TASK", background=True), text("WAITING"),
                    text("SUBAGENT_PARENT_OK")], [text("SUBAGENT_CHILD_RESULT_MARKER", delay_s=0.2)])

    def respond(request: ModelRequest, n: int) -> Any:
        return rec(request, n)

    home = tmp_path / "home"
    with ScriptedServer(respond, per_session=True) as server:
        env = {**os.environ, "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test",
               "AGENTFSM_HOME": str(home), "HOME": str(home)}
        proc = subprocess.run(
            [sys.executable, "-m", "agentfsm", "-p", "CLI_PARENT", "--output-format", "stream-json", "--verbose",
             "--tools", "Agent", "Read", "--permission-mode", "bypassPermissions"],
            cwd=agentfsm_workspace, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[-1]["type"] == "result" and lines[-1]["result"] == "SUBAGENT_PARENT_OK"
    assert len(rec.parent_requests) == 3 and len(rec.child_requests) == 1
    assert "SUBAGENT_CHILD_RESULT_MARKER" in json.dumps(rec.parent_requests[2].messages[-1])
    assert lines[0]["tools"] == ["Agent", "Read"]


async def test_interrupting_the_wait_leaves_the_notification_for_the_next_run(tmp_path: Path) -> None:
    rec = Recorder([agent_call("bg", background=True), text("WAITING"), text("GOT_IT")],
                   [text("LATE_CHILD_RESULT", delay_s=0.5)])
    session = Session(options(tmp_path), client=ScriptedModel(rec, per_session=True))
    run = asyncio.ensure_future(session.run("go"))
    while len(rec.parent_requests) < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert not run.done()  # waiting for the background agent
    session.interrupt()
    result = await asyncio.wait_for(run, 5)
    assert result.result == "WAITING" and not result.is_error
    while not session.queue.pending:  # the notification arrives after the run ended: it is kept
        await asyncio.sleep(0.02)
    nxt = await session.run(None)
    await session.aclose()
    assert nxt.result == "GOT_IT"
    assert "LATE_CHILD_RESULT" in json.dumps(rec.parent_requests[2].messages[-1])
