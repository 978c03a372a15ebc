"""What one :meth:`Session.run` reports and does across the driver runs it takes, and across runs.

A run may take several driver runs (input that arrived after the last absorb point gets a follow-up
run); its one result adds them up. A session's runs share its file and hooks: what happens once per
session happens once, what one run sets does not leak into the next. Every check is made through the
public entry point (a :class:`Session` on the scripted model) on what a host sees: the result, the
emitted messages, the session file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from test_subagents import Recorder, agent_call

from agentfsm.hooks.permissions import PermissionDeny
from agentfsm.hooks.runner import HookMatcher
from agentfsm.machine.options import Options
from agentfsm.machine.state import TerminalReason
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.resume import load_history, open_session
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, tool

USAGE = {"input_tokens": 1000, "output_tokens": 100}
DELAY = 0.05  # every response takes this long: each driver run has API time of its own


def answer(text: str) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": text}], "usage": USAGE, "delay_s": DELAY}


WRITE = {"blocks": [{"type": "tool_use", "id": "toolu_w", "name": "Write",
                     "input": {"file_path": "$WS/denied.txt", "content": "x"}}],
         "stop_reason": "tool_use", "usage": USAGE, "delay_s": DELAY}


def options(tmp_path: Path, **kw: Any) -> Options:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    return Options(tools=("Write",), permission_mode="default", cwd=ws, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), can_use_tool=lambda *_: PermissionDeny("NO_WRITES"), **kw)


async def one_response_cost(tmp_path: Path) -> float:
    session = Session(options(tmp_path / "alone"), client=ScriptedModel([answer("x")]))
    try:
        return (await session.run("go")).total_cost_usd
    finally:
        await session.aclose()


async def test_a_run_with_a_follow_up_driver_run_reports_the_sum_of_both(tmp_path: Path) -> None:
    # driver run 1: a Write (denied by the callback), then the answer while LATE_INPUT arrives after the
    # last absorb point; driver run 2 (the follow-up) answers it. One result for the whole run.
    ref: list[Session] = []

    def respond(request: Any, n: int) -> dict[str, Any]:
        if n == 0:
            return WRITE
        if n == 1:
            ref[0].submit("LATE_INPUT")
            return answer("FIRST")
        return answer("SECOND")

    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path), client=ScriptedModel(respond, ws=tmp_path / "ws"), emit=seen.append)
    ref.append(session)
    try:
        result = await session.run("go")
    finally:
        await session.aclose()
    assert result.result == "SECOND" and [m["type"] for m in seen].count("result") == 1
    assert result.num_turns == 3  # two turns in the first driver run, one in the follow-up
    assert [d["tool_use_id"] for d in result.permission_denials] == ["toolu_w"]  # from the first driver run
    assert result.usage["input_tokens"] == 3 * USAGE["input_tokens"]
    assert result.usage["output_tokens"] == 3 * USAGE["output_tokens"]
    assert result.duration_api_ms >= 3 * DELAY * 1000 * 0.9
    assert result.duration_ms >= result.duration_api_ms
    single = await one_response_cost(tmp_path)
    assert single > 0 and abs(result.total_cost_usd - 3 * single) < 1e-9
    # the session file holds one result per driver run, the last one the run's outcome
    results = [r for r in read_records(session.trace_path) if r["type"] == "result"]
    assert [r["result"] for r in results] == ["FIRST", "SECOND"]


# --- once per session, and only for a session that ran ---------------------------------------------------


def plain(tmp_path: Path, **kw: Any) -> Options:
    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    kw.setdefault("setting_sources", ())
    return Options(tools=("Read",), permission_mode="bypassPermissions", cwd=ws, sessions_dir=tmp_path / "sessions",
                   **kw)


async def test_session_start_and_the_memory_come_once_at_the_first_run_session_end_once_at_close(
        tmp_path: Path) -> None:
    seen: list[str] = []
    hooks = {"SessionStart": [HookMatcher(hooks=[lambda r: seen.append(f"start:{r.source}")])],
             "SessionEnd": [HookMatcher(hooks=[lambda r: seen.append(f"end:{r.reason}")])]}
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "CLAUDE.md").write_text("PROJECT_MEMORY_MARKER\n")
    model = ScriptedModel([answer("ONE"), answer("TWO"), answer("THREE")])
    session = Session(plain(tmp_path, hooks=hooks, setting_sources=("project",)), client=model)
    try:
        for prompt in ("first", "second", "third"):
            await session.run(prompt)
        assert seen == ["start:startup"]
    finally:
        await session.aclose()
    assert seen == ["start:startup", "end:other"]
    assert [m.kind for m in session.history].count("memory") == 1
    assert [json.dumps(b["messages"]).count("PROJECT_MEMORY_MARKER") for b in model.bodies] == [1, 1, 1]


async def test_a_session_closed_without_a_run_runs_no_session_end_hook(tmp_path: Path) -> None:
    seen: list[str] = []
    hooks = {"SessionEnd": [HookMatcher(hooks=[lambda r: seen.append(f"end:{r.reason}")])]}
    session = Session(plain(tmp_path, hooks=hooks), client=ScriptedModel([]))
    await session.aclose()
    assert seen == []


# --- resume ------------------------------------------------------------------------------------------------


async def test_resuming_a_sound_session_file_appends_to_its_view_without_a_boundary(tmp_path: Path) -> None:
    first = Session(plain(tmp_path), client=ScriptedModel([answer("ONE")]))
    try:
        await first.run("first")
    finally:
        await first.aclose()
    resumed = open_session(plain(tmp_path, resume=first.session_id), client=ScriptedModel([answer("TWO")]))
    try:
        assert not resumed.repaired
        await resumed.run("second")
    finally:
        await resumed.aclose()
    records = list(read_records(resumed.trace_path))
    assert [r["type"] for r in records].count("session") == 1
    assert [r for r in records if r["type"] == "compact_boundary"] == []
    texts = [b.get("text") for r in records if r["type"] == "message" for b in r["content"]]
    assert texts == ["first", "ONE", "second", "TWO"]  # each message recorded once
    assert [m.text() for m in load_history(resumed.trace_path)] == texts


# --- subagents ------------------------------------------------------------------------------------------------


async def test_a_foreground_subagent_costs_the_parent_and_writes_its_blocks_to_its_own_file(tmp_path: Path) -> None:
    call = {**agent_call("CHILD_TASK"), "usage": USAGE, "delay_s": DELAY}
    rec = Recorder([call, answer("PARENT_OK")], [answer("CHILD_ANSWER_MARKER")])
    session = Session(Options(tools=("Agent", "Read"), permission_mode="bypassPermissions", cwd=tmp_path,
                              sessions_dir=tmp_path / "sessions", setting_sources=()),
                      client=ScriptedModel(rec, per_session=True))
    try:
        result = await session.run("go")
    finally:
        await session.aclose()
    assert result.result == "PARENT_OK" and len(rec.child_requests) == 1
    single = await one_response_cost(tmp_path)
    assert abs(result.total_cost_usd - 3 * single) < 1e-9  # the parent's two responses and the child's one
    parent = list(read_records(session.trace_path))
    assert not any("CHILD_ANSWER_MARKER" in json.dumps(r) for r in parent if r["type"] == "assistant_block")
    child_files = list((tmp_path / "sessions" / session.session_id / "subagents").glob("*.jsonl"))
    assert len(child_files) == 1
    assert any("CHILD_ANSWER_MARKER" in json.dumps(r) for r in read_records(child_files[0])
               if r["type"] == "assistant_block")


# --- an interrupt ends one run, not the session ---------------------------------------------------------------


async def test_after_an_interrupted_run_the_next_run_of_the_session_starts_clean(tmp_path: Path) -> None:
    started = asyncio.Event()
    schema = {"type": "object", "properties": {}, "additionalProperties": False}

    @tool("Wait", "Waits for ever.", schema, interrupt="cancel")
    async def wait(input: Any, ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(3600)
        return "never"

    call = {"blocks": [{"type": "tool_use", "id": "toolu_wait", "name": "Wait", "input": {}}],
            "stop_reason": "tool_use"}
    model = ScriptedModel([call, answer("TWO")])
    session = Session(Options(tools=(), extra_tools=(wait,), permission_mode="bypassPermissions", cwd=tmp_path,
                              sessions_dir=tmp_path / "sessions", setting_sources=()), client=model)
    try:
        first = asyncio.ensure_future(session.run("one"))
        await asyncio.wait_for(started.wait(), 30)
        session.interrupt()
        interrupted = await asyncio.wait_for(first, 30)
        second = await asyncio.wait_for(session.run("two"), 30)
    finally:
        await session.aclose()
    assert interrupted.terminal_reason is TerminalReason.ABORTED_TOOLS
    assert second.terminal_reason is TerminalReason.COMPLETED and second.result == "TWO" and model.count == 2
