"""The kit's background-work strategy (issue 30) driving our loop, and what ``agentfsm conform`` makes of it.

Generated runs are turns of :func:`agentfsm.testing.strategies.background_work_responses` (a Bash
command in the background or moved there by its timeout, TaskStop / KillShell of an unknown id) and a
final answer; whatever is drawn, the run ends completed, every task it started has ended before the run's
result (``-p`` waits for its background work), each task that ended on its own reached the model as a
``<task-notification>`` naming it, the requests stay well formed, and once the session is closed no
process a task started is still running."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.commandline import conform
from agentfsm.llm.model import ModelRequest
from agentfsm.machine.options import Options
from agentfsm.sessions.session import Session
from agentfsm.testing import strategies as kit
from agentfsm.testing.oracle import task_ids_numbered
from agentfsm.testing.scenario import StreamedResponse, TextBlock, ToolUseBlock
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.testing.stateful import wire_problems
from agentfsm.tools import bash as bash_tool

FAST = 0.15  # the strategy's unit of time here: commands of 0.15, 0.45 and 0.75 s, timeouts of 0.15 s

# tool turns of background work (a final answer after them ends the turn; -p then waits for the work)
_turns = st.lists(kit.background_work_responses(seconds=FAST), min_size=1, max_size=4).map(kit.unique_tool_ids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (ended, not yet reaped by its parent) is not running
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def _run(responses: list[Any], ws: Path) -> tuple[Session, list[dict[str, Any]], Any, list[int]]:
    ws.mkdir(parents=True, exist_ok=True)
    bodies: list[dict[str, Any]] = []
    script = [*responses, StreamedResponse(blocks=(TextBlock("END"),), stop_reason="end_turn")]

    def answer(request: ModelRequest, n: int) -> Any:
        bodies.append(request.body())
        return script[n] if n < len(script) else StreamedResponse(blocks=(TextBlock("MORE"),), stop_reason="end_turn")

    options = Options(permission_mode="bypassPermissions", cwd=ws, sessions_dir=ws.parent / "sessions",
                      setting_sources=(), tools=("Bash", "Read", "TaskStop"), sandbox=False)
    session = Session(options, client=ScriptedModel(answer), emit=lambda _m: None)
    pids: list[int] = []
    try:
        # a moved command is answered no sooner than 2 s after it started (Claude Code's); scaled as FAST is
        with mock.patch.object(bash_tool, "MOVED_ANSWER_AFTER_MS", 2 * FAST * 1000):
            result = await session.run("go")
        pids = [live.process.pid for live in session.tasks._live.values() if live.process is not None]
    finally:
        await session.aclose()
    return session, bodies, result, pids


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(responses=_turns)
def test_generated_background_work_ends_reported_and_leaves_nothing_running(responses: list[Any],
                                                                            tmp_path_factory: Any) -> None:
    ws = tmp_path_factory.mktemp("bg") / "ws"
    session, bodies, result, pids = asyncio.run(_run(responses, ws))
    assert result.terminal_reason.value == "completed"
    tasks = list(session.tasks.tasks.values())
    assert len(tasks) == sum(1 for r in responses for b in getattr(r, "blocks", ())
                             if getattr(b, "name", "") == "Bash")
    assert not [t.task_id for t in tasks if t.running]  # -p waited for every one
    sent = json.dumps([b["messages"] for b in bodies])
    for t in tasks:
        if t.status in ("completed", "failed"):
            assert f"<task-id>{t.task_id}</task-id>" in sent, t
    for body in bodies:
        assert not wire_problems(body["messages"]), body["messages"][-1]
    assert not [pid for pid in pids if _alive(pid)]


async def test_a_task_still_running_when_the_session_closes_is_killed_with_its_children(tmp_path: Path) -> None:
    """A background command that would outlive us (a shell with a ``sleep`` child) is gone, child and
    all, once the session is closed — even when the run ended without waiting for it (interrupted)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "child.pid"
    start = StreamedResponse(blocks=(ToolUseBlock("toolu_1", "Bash", {
        "command": f"sleep 30 & echo $! > {marker}; wait", "description": "outlives", "run_in_background": True}),),
        stop_reason="tool_use")
    session: Session | None = None

    def answer(request: ModelRequest, n: int) -> Any:
        if n == 1 and session is not None:
            session.abort()  # Ctrl-C while the command runs in the background
        return start if n == 0 else StreamedResponse(blocks=(TextBlock("WAITING"),), stop_reason="end_turn")

    options = Options(permission_mode="bypassPermissions", cwd=ws, sessions_dir=tmp_path / "sessions",
                      setting_sources=(), tools=("Bash",), sandbox=False)
    session = Session(options, client=ScriptedModel(answer), emit=lambda _m: None)
    try:
        await session.run("go")
        leader = [live.process.pid for live in session.tasks._live.values() if live.process is not None]
        for _ in range(50):
            if marker.exists() and marker.read_text().strip():
                break
            await asyncio.sleep(0.05)
        child = int(marker.read_text())
        assert _alive(child)
    finally:
        await session.aclose()
    assert not [pid for pid in [*leader, child] if _alive(pid)]


# --- conform ---------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(conform.cases(["background"], max_responses=4))
def test_conform_draws_background_work_with_taskstop_offered(case: dict[str, Any]) -> None:
    assert case["tools"].split(",")[-1] == "TaskStop"
    names = {b.get("name") for r in case["responses"] for b in r.get("blocks", ())}
    assert names <= {"Bash", "Read", "Write", "Edit", "Glob", "Grep", "TaskStop", "KillShell", None}


def test_task_ids_are_numbered_the_same_for_either_client() -> None:
    def run(tid: str, tasks: str) -> dict[str, Any]:
        text = f"Command running in background with ID: {tid}. Output is being written to: {tasks}/{tid}.output."
        note = f"<task-notification>\n<task-id>{tid}</task-id>\n</task-notification>"
        return {"history": [{"role": "user", "content": text}, {"role": "user", "content": note}]}

    cc = task_ids_numbered(run("bq99ewg19", "/tmp/claude-0/-tmp-x-ws/5e0c/tasks"))
    ours = task_ids_numbered(run("b0a1b2c3d", "/tmp/agentfsm/5e0c-11/tasks"))
    assert cc == ours
    assert "TASK1" in json.dumps(cc) and "$TASKS/TASK1.output" in json.dumps(cc)
    assert not re.search(r"bq99ewg19|/tmp/", json.dumps(cc))
    untouched = {"history": [{"role": "user", "content": "no task here: b12345678"}]}
    assert task_ids_numbered(untouched) == untouched
