"""The background task lifecycle over generated schedules (hypothesis): commands that end on their own
with any exit status, are stopped by the model part-way, or are still running when the session ends;
and runs whose background work reports after the run ended. What must hold for every schedule:

* each task ends exactly once, in the status its ending implies (``completed`` for exit 0, ``failed``
  for any other status, ``killed`` when stopped), and no process of it is left;
* the model is notified of exactly the tasks that ended on their own, once each, in the order they
  ended; a task stopped by the model or by the session's end notifies the client only;
* the client sees each task start before it ends, and every ``background_tasks_changed`` lists
  exactly the tasks running at that moment;
* through a session: every notification reaches the model exactly once, by the graph's
  ``task_notification`` move when it arrives after the run ended, and the session file audits clean.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.llm.model import ModelRequest
from agentfsm.machine.options import Options
from agentfsm.runtime.queue import InputQueue
from agentfsm.runtime.tasks import COMPLETED, FAILED, KILLED, TaskRegistry
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import TASKS, ToolContext
from agentfsm.tools.bash import BashTool

SLOW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# one command: how long it runs (tenths of a second), its exit status, and whether the model stops it
# after some tenths (None: it is not stopped)
command = st.tuples(st.integers(0, 4), st.sampled_from([0, 0, 1, 2, 7]), st.one_of(st.none(), st.integers(0, 3)))


@SLOW
@given(commands=st.lists(command, min_size=1, max_size=4), end_after=st.one_of(st.none(), st.integers(0, 5)))
def test_every_schedule_of_background_commands(tmp_path_factory: Any, commands: list[tuple[int, int, int | None]],
                                               end_after: int | None) -> None:
    tmp = tmp_path_factory.mktemp("tasks")
    asyncio.run(_schedule(tmp, commands, end_after))


async def _schedule(tmp: Path, commands: list[tuple[int, int, int | None]], end_after: int | None) -> None:
    seen: list[dict[str, Any]] = []
    host = TaskRegistry(session_id="s", tasks_dir=tmp / "tasks", queue=InputQueue(), emit=seen.append)
    ids: list[str] = []
    pids: dict[str, int] = {}
    for i, (tenths, code, _stop) in enumerate(commands):
        ctx = ToolContext(cwd=tmp, session_id="s", tool_use_id=f"toolu_{i}", services={TASKS: host})
        await BashTool().call({"command": f"sleep {tenths / 10}; exit {code}", "description": f"c{i}",
                               "run_in_background": True}, ctx)
        ids.append(host.running[-1])
        process = host._live[ids[-1]].process  # (no await since the call: it has not been reaped)
        assert process is not None
        pids[ids[-1]] = process.pid

    async def stop_later(tid: str, tenths: int) -> None:
        await asyncio.sleep(tenths / 10)
        await host.stop(tid)  # None when it ended first: both are fine

    stoppers = [asyncio.ensure_future(stop_later(tid, s)) for tid, (_t, _c, s) in zip(ids, commands, strict=True)
                if s is not None]
    closed_at = None
    if end_after is not None:
        await asyncio.sleep(end_after / 10)
        closed_at = int(time.time() * 1000)
        await host.stop_all()  # the session ends, whatever still runs
    deadline = asyncio.get_running_loop().time() + 20
    while host.running:
        assert asyncio.get_running_loop().time() < deadline, "a task never ended"
        await asyncio.sleep(0.02)
    await asyncio.gather(*stoppers)

    # each task ended once, in the status its ending implies; nothing of it is left
    updates = [m for m in seen if m["subtype"] == "task_updated"]
    assert sorted(m["task_id"] for m in updates) == sorted(ids)
    notes = {m["task_id"]: m for m in seen if m["subtype"] == "task_notification"}
    for tid, (_tenths, code, _stop) in zip(ids, commands, strict=True):
        rec = host.get(tid)
        assert rec is not None and not rec.running and not _alive(pids[tid])
        if rec.status == KILLED:
            assert not rec.notified
            assert notes[tid]["status"] in ("stopped", KILLED)
        else:
            assert rec.status == (COMPLETED if code == 0 else FAILED) and rec.exit_code == code
            # notified, unless it ended once the session was closing (nobody is left to read it)
            closing = closed_at is not None and rec.ended_ms is not None and rec.ended_ms >= closed_at
            assert rec.notified is not closing
    # the model is told of exactly the tasks that ended on their own, once each, in the order they ended
    notified = [m["task_id"] for m in updates if host.tasks[m["task_id"]].notified]
    queued = [re.search(r"<task-id>(\w+)</task-id>", item.text()).group(1)  # type: ignore[union-attr]
              for item in host.queue.pending]
    assert queued == notified
    # the client saw each task start before it ended, and every list of running tasks was right: a
    # task is listed from the message just before its task_started (Claude Code's order) until it ended
    started = {m["task_id"]: k for k, m in enumerate(seen) if m["subtype"] == "task_started"}
    ended = {m["task_id"]: k for k, m in enumerate(seen) if m["subtype"] == "task_updated"}
    assert set(started) == set(ended) == set(ids) and all(started[t] < ended[t] for t in ids)
    for k, m in enumerate(seen):
        if m["subtype"] == "background_tasks_changed":
            want = {t for t in ids if started[t] <= k + 1 and ended[t] > k}
            assert {t["task_id"] for t in m["tasks"]} == want


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delays=st.lists(st.integers(0, 4), min_size=1, max_size=3), answer_delay=st.integers(0, 3))
def test_every_notification_reaches_the_model_once(tmp_path_factory: Any, delays: list[int],
                                                   answer_delay: int) -> None:
    """Commands started in one response, ending at generated times while the run answers (slowly or
    not): the model receives every notification once, whether it arrived during the run (queued input)
    or after it (the task_notification move); the run ends only when all have reported."""
    tmp = tmp_path_factory.mktemp("session")
    asyncio.run(_session(tmp, delays, answer_delay))


async def _session(tmp: Path, delays: list[int], answer_delay: int) -> None:
    from agentfsm.auditing.audit import audit_file

    requests: list[ModelRequest] = []
    calls = [{"type": "tool_use", "id": f"toolu_{i}", "name": "Bash",
              "input": {"command": f"sleep {d / 10}; echo N{i}", "run_in_background": True}}
             for i, d in enumerate(delays)]

    def answer(request: ModelRequest, n: int) -> Any:
        requests.append(request)
        if n == 0:
            return {"blocks": calls}
        return {"blocks": [{"type": "text", "text": f"ANSWER_{n}"}], "delay_s": answer_delay / 10}

    opts = Options(permission_mode="bypassPermissions", cwd=tmp, sessions_dir=tmp / "sessions", setting_sources=(),
                   tools=("Bash",), sandbox=False)
    session = Session(opts, client=ScriptedModel(answer))
    result = await asyncio.wait_for(session.run("GO"), 30)
    await session.aclose()
    assert not result.is_error and session.tasks.running == ()
    last = " ".join(str(m) for m in requests[-1].messages)
    for i in range(len(delays)):
        tool_use = f"<tool-use-id>toolu_{i}</tool-use-id>"
        assert last.count(tool_use) == 1, tool_use  # reached the model, once
    records = list(read_records(session.trace_path))
    moves = [r["trigger"] for r in records if r.get("type") == "transition"]
    # each pass after the run ended is one task_notification move out of a settled stop
    assert moves.count("task_notification") <= len(delays)
    assert moves[-1] == "settle" and moves.count("call") == len(requests)
    assert [f.code for f in audit_file(session.trace_path) if f.severity != "info" and
            f.code != "unsandboxed_command"] == []
