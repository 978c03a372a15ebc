"""Background tasks (agentfsm.tasks): the registry, background Bash (run_in_background, a command
moved to the background by its timeout), TaskStop / KillShell, the notification each end queues, the
session file's task records, and that nothing outlives the session."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agentfsm.llm.model import ModelRequest
from agentfsm.machine.options import Options
from agentfsm.runtime.queue import TASK_NOTIFICATION, InputQueue
from agentfsm.runtime.tasks import COMPLETED, FAILED, KILLED, TaskRecord, TaskRegistry, cut_off
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools import bash as bash_tool
from agentfsm.tools.base import TASKS, ToolContext
from agentfsm.tools.bash import BashTool, moved_to_background
from agentfsm.tools.task_stop import TaskStopTool


def registry(tmp_path: Path, seen: list[dict[str, Any]] | None = None,
             records: list[dict[str, Any]] | None = None) -> TaskRegistry:
    return TaskRegistry(session_id="s1", tasks_dir=tmp_path / "tasks", queue=InputQueue(),
                        emit=seen.append if seen is not None else None,
                        record=records.append if records is not None else None)


def ctx(tmp_path: Path, host: TaskRegistry | None, tool_use_id: str = "toolu_1") -> ToolContext:
    return ToolContext(cwd=tmp_path, session_id="s1", tool_use_id=tool_use_id,
                       services={TASKS: host} if host is not None else {})


async def wait_until(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- background Bash ---------------------------------------------------------------------------


async def test_run_in_background_returns_at_once_and_notifies_on_exit(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    host = registry(tmp_path, seen, records)
    out = await BashTool().call({"command": "echo START; sleep 0.5; echo END", "description": "slow echo",
                                 "run_in_background": True}, ctx(tmp_path, host))
    assert not out.is_error
    (task_id,) = host.running
    rec = host.get(task_id)
    assert rec is not None and rec.task_type == "local_bash" and rec.tool_use_id == "toolu_1"
    assert rec.description == "slow echo" and rec.command == "echo START; sleep 0.5; echo END"
    assert out.data == (f"Command running in background with ID: {task_id}. Output is being written to: "
                        f"{rec.output_file}. You will be notified when it completes. To check interim output, "
                        "use Read on that file path.")
    assert len(task_id) == 9 and task_id.startswith("b")
    await wait_until(lambda: not host.running)
    done = host.get(task_id)
    assert done is not None and done.status == COMPLETED and done.exit_code == 0 and done.notified
    # the exit is appended to the output, as Claude Code's files end
    assert Path(done.output_file).read_text() == "START\nEND\n\n[exited with code 0]\n"
    (item,) = host.queue.pending
    assert item.kind == TASK_NOTIFICATION
    text = item.text()
    assert text.startswith("<system-reminder>\n") and "NOT USER INPUT" in text
    assert (f"<task-notification>\n<task-id>{task_id}</task-id>\n<tool-use-id>toolu_1</tool-use-id>\n"
            f"<output-file>{done.output_file}</output-file>\n<status>completed</status>\n"
            '<summary>Background command "slow echo" completed (exit code 0)</summary>\n'
            "</task-notification>") in text
    # the client saw the task start and end, in Claude Code's order
    subtypes = [m["subtype"] for m in seen if m.get("type") == "system"]
    assert subtypes == ["background_tasks_changed", "task_started", "task_updated", "task_notification",
                        "background_tasks_changed"]
    assert all(m["session_id"] == "s1" for m in seen)
    # every state of the task went to the session file
    assert [r["status"] for r in records] == ["running", "completed"]
    assert TaskRecord.from_record(records[-1]) == done


@pytest.mark.parametrize("code", [1, 3])
async def test_a_failing_background_command_is_reported_failed_with_its_code(tmp_path: Path, code: int) -> None:
    host = registry(tmp_path)
    await BashTool().call({"command": f"echo X; exit {code}", "description": "second", "run_in_background": True},
                          ctx(tmp_path, host))
    await wait_until(lambda: not host.running)
    (rec,) = host.tasks.values()
    assert rec.status == FAILED and rec.exit_code == code
    assert (f'<summary>Background command "second" failed with exit code {code}</summary>'
            in host.queue.pending[0].text())
    assert Path(rec.output_file).read_text() == f"X\n\n[exited with code {code}]\n"


async def test_a_foreground_command_that_outruns_its_timeout_moves_to_the_background(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Claude Code 2.1.332 answers no sooner than 2 s after the start (bash.MOVED_ANSWER_AFTER_MS); shorter here
    monkeypatch.setattr(bash_tool, "MOVED_ANSWER_AFTER_MS", 400)
    host = registry(tmp_path)
    began = time.monotonic()
    out = await BashTool().call({"command": "echo SLOW_START; sleep 1; echo SLOW_END", "description": "slow",
                                 "timeout": 200}, ctx(tmp_path, host, "toolu_slow"))
    assert time.monotonic() - began >= 0.4
    assert not out.is_error
    (task_id,) = host.running
    rec = host.get(task_id)
    assert rec is not None and rec.tool_use_id == "toolu_slow"
    # the timeout is named in whole seconds, at least one (Claude Code's words)
    assert out.data.startswith("SLOW_START\nCommand did not complete within its 1s timeout and was moved to the "
                               f"background (ID: {task_id}). Output is being written to: {rec.output_file}.")
    assert out.data == moved_to_background("SLOW_START", 200, host_started(rec))
    await wait_until(lambda: not host.running)
    done = host.get(task_id)
    assert done is not None and done.status == COMPLETED
    # the command kept writing to the same file after it was moved
    assert Path(done.output_file).read_text() == "SLOW_START\nSLOW_END\n\n[exited with code 0]\n"
    assert "<tool-use-id>toolu_slow</tool-use-id>" in host.queue.pending[0].text()


async def test_a_moved_command_that_ends_before_the_answer_is_answered_as_a_background_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """conform-1672508d24: a command its timeout moved that ends before the answer is due gets its whole
    output and the background-task wording, and its notification is queued before the call returns (the
    next request carries it in this call's result)."""
    monkeypatch.setattr(bash_tool, "MOVED_ANSWER_AFTER_MS", 3000)
    host = registry(tmp_path)
    began = time.monotonic()
    out = await BashTool().call({"command": "echo A; sleep 0.4; echo B", "description": "quick",
                                 "timeout": 100}, ctx(tmp_path, host, "toolu_q"))
    assert time.monotonic() - began < 2.5  # answered when it ended, not at the floor
    assert not out.is_error and not host.running
    (rec,) = host.tasks.values()
    assert rec.status == COMPLETED and rec.notified
    assert out.data == "A\nB\n" + bash_tool.running_in_background(host_started(rec))
    (item,) = host.queue.pending
    assert "<tool-use-id>toolu_q</tool-use-id>" in item.text() and "<status>completed</status>" in item.text()


@pytest.mark.parametrize(("ms", "shown"), [(300, "1s"), (500, "1s"), (1200, "1s"), (1500, "2s"), (2200, "2s"),
                                           (3000, "3s"), (59_400, "59s"), (90_000, "1m 30s")])
def test_a_moved_commands_timeout_is_named_in_whole_seconds(ms: int, shown: str) -> None:
    # Claude Code 2.1.332's texts for 0.3, 0.5, 1.2, 1.5, 2.2 and 3 s timeouts
    assert bash_tool.whole_seconds(ms) == shown


def host_started(rec: TaskRecord) -> Any:
    from agentfsm.tools.base import TaskStarted

    return TaskStarted(rec.task_id, rec.output_file)


async def test_without_a_task_host_a_timeout_still_kills_the_command(tmp_path: Path) -> None:
    out = await BashTool().call({"command": "sleep 5", "timeout": 200}, ctx(tmp_path, None))
    assert out.is_error and out.data.startswith("Command timed out after 0.2s")


async def test_a_background_command_is_stopped_after_its_background_timeout(tmp_path: Path) -> None:
    host = registry(tmp_path)
    await BashTool().call({"command": "sleep 30", "description": "long", "run_in_background": True,
                           "timeout": 300}, ctx(tmp_path, host))
    await wait_until(lambda: not host.running)
    (rec,) = host.tasks.values()
    assert rec.status == KILLED and rec.notified
    assert "<status>killed</status>" in host.queue.pending[0].text()


async def test_background_commands_go_through_the_sandbox_service(tmp_path: Path) -> None:
    """run_in_background prepares the command through the session's sandbox like a foreground one, and
    tells it when the command is over."""
    from agentfsm.tools.sandbox import SANDBOX, Prepared

    class Sandbox:
        def __init__(self) -> None:
            self.prepared: list[str] = []
            self.finished_ids: list[str] = []

        def prepare(self, command: str, cwd: Path, *, shell: str, disable_requested: bool,
                    tool_use_id: str) -> Prepared:
            self.prepared.append(command)
            return Prepared(argv=(shell, "-c", f"echo WRAPPED; {command}"), sandboxed=True, record={})

        def finished(self, prepared: Prepared) -> None:
            self.finished_ids.append("done")

    sandbox = Sandbox()
    host = registry(tmp_path)
    context = ToolContext(cwd=tmp_path, session_id="s1", tool_use_id="toolu_sb",
                          services={TASKS: host, SANDBOX: sandbox})
    await BashTool().call({"command": "echo INNER", "run_in_background": True}, context)
    await wait_until(lambda: not host.running)
    assert sandbox.prepared == ["echo INNER"] and sandbox.finished_ids == ["done"]
    (rec,) = host.tasks.values()
    assert Path(rec.output_file).read_text().startswith("WRAPPED\nINNER\n")


async def test_a_refused_background_command_starts_no_task(tmp_path: Path) -> None:
    from agentfsm.tools.sandbox import SANDBOX, Prepared

    class Refusing:
        def prepare(self, command: str, cwd: Path, **_kw: Any) -> Prepared:
            return Prepared(argv=(), sandboxed=False, record={}, refusal="sandbox says no")

        def finished(self, prepared: Prepared) -> None:
            pass

    host = registry(tmp_path)
    context = ToolContext(cwd=tmp_path, session_id="s1", services={TASKS: host, SANDBOX: Refusing()})
    out = await BashTool().call({"command": "echo X", "run_in_background": True}, context)
    assert out.is_error and out.data == "sandbox says no" and host.tasks == {}


# --- TaskStop ----------------------------------------------------------------------------------


async def test_task_stop_kills_the_process_group_and_tells_only_the_client(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    host = registry(tmp_path, seen)
    pidfile = tmp_path / "child.pid"
    await BashTool().call({"command": f"sleep 30 & echo $! > {pidfile}; wait", "description": "long",
                           "run_in_background": True}, ctx(tmp_path, host))
    (task_id,) = host.running
    await wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    child = int(pidfile.read_text())
    out = await TaskStopTool().call({"task_id": task_id}, ctx(tmp_path, host, "toolu_stop"))
    body = json.loads(out.data)
    assert body == {"message": f"Successfully stopped task: {task_id} (sleep 30 & echo $! > {pidfile}; wait)",
                    "task_id": task_id, "task_type": "local_bash",
                    "command": f"sleep 30 & echo $! > {pidfile}; wait"}
    assert out.data.startswith('{"message":')  # compact, as Claude Code writes it
    await wait_until(lambda: not alive(child))
    rec = host.get(task_id)
    assert rec is not None and rec.status == KILLED and not rec.notified
    assert host.queue.pending == ()  # the model is told by the tool's result only
    note = [m for m in seen if m.get("subtype") == "task_notification"]
    assert note[-1]["status"] == "stopped" and note[-1]["summary"] == "long"


async def test_kill_shell_is_task_stop_with_its_old_parameter(tmp_path: Path) -> None:
    from agentfsm.tools import ToolRegistry, builtin_tools

    tools = ToolRegistry(builtin_tools())
    assert tools.get("KillShell") is tools.get("TaskStop")
    host = registry(tmp_path)
    await BashTool().call({"command": "sleep 30", "run_in_background": True}, ctx(tmp_path, host))
    (task_id,) = host.running
    out = await TaskStopTool().call({"shell_id": task_id}, ctx(tmp_path, host))
    assert json.loads(out.data)["task_id"] == task_id and host.running == ()


def test_a_call_made_by_an_alias_goes_back_under_the_tools_own_name() -> None:
    """Claude Code 2.1.332 sends a ``KillShell`` call back as ``TaskStop`` (and ``Task`` as ``Agent``);
    the history keeps the model's name, and a name that is no alias is left alone."""
    from agentfsm.machine.state import Message
    from agentfsm.runtime.request import WireCache, canonical_names, normalize
    from agentfsm.tools import ToolRegistry, builtin_tools

    names = canonical_names(ToolRegistry(builtin_tools()).tools())
    assert names["KillShell"] == "TaskStop" and names["Task"] == "Agent"
    history = (Message("user", ({"type": "text", "text": "go"},)),
               Message("assistant", ({"type": "tool_use", "id": "t1", "name": "KillShell", "input": {"shell_id": "b1"}},
                                     {"type": "tool_use", "id": "t2", "name": "Nope", "input": {}})))
    wire = WireCache(names).wire(history)
    assert [b["name"] for b in wire[1]["content"]] == ["TaskStop", "Nope"]
    assert history[1].content[0]["name"] == "KillShell"
    assert [b["name"] for b in normalize(history)[1]["content"]] == ["KillShell", "Nope"]


@pytest.mark.parametrize("given", [{"task_id": "no_such_task"}, {"shell_id": "nope"}])
async def test_task_stop_of_an_unknown_id_is_an_error(tmp_path: Path, given: dict[str, str]) -> None:
    from agentfsm.tools.base import ToolError

    host = registry(tmp_path)
    with pytest.raises(ToolError, match=f"^No task found with ID: {next(iter(given.values()))}$"):
        await TaskStopTool().call(given, ctx(tmp_path, host))


async def test_task_stop_of_a_finished_task_is_an_error(tmp_path: Path) -> None:
    from agentfsm.tools.base import ToolError

    host = registry(tmp_path)
    await BashTool().call({"command": "true", "run_in_background": True}, ctx(tmp_path, host))
    (task_id,) = host.running
    await wait_until(lambda: not host.running)
    with pytest.raises(ToolError, match="No task found"):
        await TaskStopTool().call({"task_id": task_id}, ctx(tmp_path, host))


async def test_task_stop_needs_an_id(tmp_path: Path) -> None:
    res = await TaskStopTool().validate_input({}, ctx(tmp_path, registry(tmp_path)))
    assert not res.ok and "task_id" in (res.message or "")
    res = await TaskStopTool().validate_input({"task_id": "  "}, ctx(tmp_path, registry(tmp_path)))
    assert not res.ok


# --- teardown and records ------------------------------------------------------------------------


async def test_stop_all_leaves_nothing_running_and_records_killed(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []
    host = registry(tmp_path, records=records)
    for _ in range(3):
        await BashTool().call({"command": "sleep 30", "run_in_background": True}, ctx(tmp_path, host))
    pids = [live.process.pid for live in host._live.values() if live.process is not None]
    assert len(pids) == 3 and all(alive(p) for p in pids)
    await host.stop_all()
    assert host.running == () and all(not alive(p) for p in pids)
    assert all(r.status == KILLED and not r.notified for r in host.tasks.values())
    assert host.queue.pending == ()
    with pytest.raises(RuntimeError, match="closing"):
        await BashTool().call({"command": "true", "run_in_background": True}, ctx(tmp_path, host))
    await host.stop_all()  # idempotent


def test_cut_off_finds_the_tasks_a_file_left_running() -> None:
    running = TaskRecord("b1", "local_bash", "t1", "d", "/o")
    done = TaskRecord("b2", "local_bash", "t2", "d", "/o", status="completed", exit_code=0)
    assert cut_off({"b1": running, "b2": done}) == (running,)
    assert TaskRecord.from_record({"type": "task", "task_id": "x"}) is None
    assert TaskRecord.from_record({**running.to_record(), "status": "exploded"}) is None


# --- in a session ------------------------------------------------------------------------------


def bash(tid: str, **inp: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Bash", "input": inp}]}


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], **kw}


def options(tmp_path: Path) -> Options:
    return Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), tools=("Bash", "Read", "TaskStop"), sandbox=False)


async def test_a_session_waits_for_its_background_command_and_runs_its_notification(tmp_path: Path) -> None:
    requests: list[ModelRequest] = []
    script = [bash("toolu_bg", command="sleep 0.5; echo BG_DONE", description="bg", run_in_background=True),
              text("WAITING"), text("GOT_IT")]

    def answer(request: ModelRequest, n: int) -> Any:
        requests.append(request)
        return script[n] if n < len(script) else text("EXHAUSTED")

    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path), client=ScriptedModel(answer), emit=seen.append)
    result = await session.run("GO")
    await session.aclose()
    assert result.result == "GOT_IT" and len(requests) == 3
    last = requests[2].messages[-1]
    note = "".join(b.get("text", "") for b in last["content"])
    assert "<task-notification>" in note and "<status>completed</status>" in note
    assert "<tool-use-id>toolu_bg</tool-use-id>" in note
    tasks = [r for r in read_records(session.trace_path) if r.get("type") == "task"]
    assert [r["status"] for r in tasks] == ["running", "completed"]


async def test_closing_a_session_stops_its_background_commands(tmp_path: Path) -> None:
    script = [bash("toolu_bg", command="sleep 30", run_in_background=True), text("LEFT_IT")]
    session = Session(options(tmp_path), client=ScriptedModel(lambda r, n: script[n] if n < 2 else text("X")))
    run = asyncio.ensure_future(session.run("GO"))
    await wait_until(lambda: bool(session.tasks.running))
    (task_id,) = session.tasks.running
    live = session.tasks._live[task_id]
    assert live.process is not None
    pid = live.process.pid
    await asyncio.sleep(0.2)
    session.interrupt()  # Ctrl-C while the run waits for the task: the run ends ...
    await asyncio.wait_for(run, 10)
    assert alive(pid)
    await session.aclose()  # ... and the session's end stops the task
    assert not alive(pid) and session.tasks.running == ()
    tasks = [r for r in read_records(session.trace_path) if r.get("type") == "task"]
    assert tasks[-1]["status"] == "killed"


def test_no_background_process_survives_the_cli(tmp_path: Path, agentfsm_workspace: Path) -> None:
    """`agentfsm -p` exits with its background command still running: the command is gone after it."""
    import subprocess
    import sys

    from agentfsm.testing.server import ScriptedServer

    pidfile = tmp_path / "bg.pid"
    script = [bash("toolu_bg", command=f"echo $$ > {pidfile}; exec sleep 60", run_in_background=True),
              text("LEFT_IT")]
    with ScriptedServer(lambda r, n: script[n] if n < len(script) else text("X")) as server:
        proc = subprocess.Popen([sys.executable, "-m", "agentfsm", "-p", "GO", "--tools", "Bash",
                                 "--permission-mode", "bypassPermissions", "--no-sandbox"],
                                cwd=agentfsm_workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "ANTHROPIC_BASE_URL": server.base_url,
                                     "ANTHROPIC_API_KEY": "sk-test"})
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


async def test_the_notification_is_a_declared_move_and_the_run_audits_clean(tmp_path: Path) -> None:
    """The notification that arrives after the run ended takes the graph's task_notification edge (stop →
    assemble) in the same driver run; the session file records it and the auditor replays it without a
    finding."""
    from agentfsm.auditing.audit import audit_file

    script = [bash("toolu_bg", command="sleep 0.3; echo BG", run_in_background=True), text("WAITING"),
              text("GOT_IT")]
    session = Session(options(tmp_path), client=ScriptedModel(lambda r, n: script[n] if n < 3 else text("X")))
    result = await session.run("GO")
    await session.aclose()
    # the run's result is its last pass's: the notification's, one turn (Claude Code's per-pass result)
    assert result.result == "GOT_IT" and result.num_turns == 1
    records = list(read_records(session.trace_path))
    moves = [r["trigger"] for r in records if r.get("type") == "transition"]
    assert moves == ["call", "open_stream", "dispatch", "collect", "next_turn", "call", "open_stream", "end_turn",
                     "settle", "task_notification", "call", "open_stream", "end_turn", "settle"]
    assert [r["type"] for r in records].count("result") == 1
    # recorded as the notification that started a pass (the graph's PASS_NOTIFICATION: its own message)
    notes = [r["kind"] for r in records if r.get("type") == "message" and "task_notification" in str(r.get("kind"))]
    assert notes == ["task_notification_pass"]
    findings = audit_file(session.trace_path)
    # (the one warning says the command ran unsandboxed, as this test asked: a background command's run
    # is recorded like any other's)
    assert [(f.code, f.severity) for f in findings if f.severity != "info"] == [("unsandboxed_command", "warning")]


async def test_a_notification_pass_runs_past_max_turns(tmp_path: Path) -> None:
    """At max_turns the run still waits for its background work and answers its notification, as Claude
    Code 2.1.332 does (docs/conform.md): the limit ends the turns of a pass, not the session's passes."""
    from agentfsm.machine.state import Limits

    script = [bash("toolu_bg", command="sleep 0.3; echo BG_DONE", run_in_background=True), text("WAITING"),
              text("AFTER_THE_PASS")]
    opts = Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), tools=("Bash",), sandbox=False, limits=Limits(max_turns=2))
    session = Session(opts, client=ScriptedModel(lambda r, n: script[n] if n < 3 else text("X")))
    result = await asyncio.wait_for(session.run("GO"), 20)
    assert result.result == "AFTER_THE_PASS"
    await session.aclose()
    assert session.tasks.running == ()


# --- background subagents ----------------------------------------------------------------------


def agent(tid: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Agent",
                        "input": {"description": "child", "prompt": prompt, "subagent_type": "general-purpose",
                                  **extra}}]}


def agent_options(tmp_path: Path, **kw: Any) -> Options:
    return Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), tools=("Agent", "Read", "TaskStop"), sandbox=False, **kw)


async def test_an_agent_runs_in_the_background_by_default_as_a_task(tmp_path: Path) -> None:
    parent: list[ModelRequest] = []

    def answer(request: ModelRequest, n: int) -> Any:
        if not any(t["name"] == "Agent" for t in request.tools):
            return text("CHILD_REPORT", delay_s=0.3)
        parent.append(request)
        return [agent("toolu_ag", "SUBTASK"), text("WAITING"), text("DONE")][len(parent) - 1]

    seen: list[dict[str, Any]] = []
    session = Session(agent_options(tmp_path), client=ScriptedModel(answer, per_session=True), emit=seen.append)
    result = await session.run("GO")
    await session.aclose()
    assert result.result == "DONE" and len(parent) == 3
    launched = parent[1].messages[-1]["content"][0]
    assert "Async agent launched successfully" in json.dumps(launched)
    (rec,) = session.tasks.tasks.values()
    assert rec.task_type == "local_agent" and rec.status == COMPLETED and rec.tool_use_id == "toolu_ag"
    assert rec.output_file.endswith(f"/subagents/{rec.task_id}.jsonl")  # the agent's own transcript
    note = json.dumps(parent[2].messages[-1])
    assert "<result>CHILD_REPORT</result>" in note and f"<task-id>{rec.task_id}</task-id>" in note
    started = next(m for m in seen if m.get("subtype") == "task_started")
    assert started["subagent_type"] == "general-purpose" and started["prompt"] == "SUBTASK"
    ended = next(m for m in seen if m.get("subtype") == "task_notification")
    assert ended["summary"] == "CHILD_REPORT" and ended["status"] == "completed"


async def test_task_stop_stops_a_background_agent(tmp_path: Path) -> None:
    child_started = asyncio.Event()
    parent: list[ModelRequest] = []

    def answer(request: ModelRequest, n: int) -> Any:
        if not any(t["name"] == "Agent" for t in request.tools):
            child_started.set()
            return text("NEVER", delay_s=30)
        parent.append(request)
        if len(parent) == 1:
            return agent("toolu_ag", "SUBTASK")
        if len(parent) == 2:
            agent_id = re.search(r"agentId: (\S+)", json.dumps(request.messages)).group(1)  # type: ignore[union-attr]
            return {"blocks": [{"type": "tool_use", "id": "toolu_stop", "name": "TaskStop",
                                "input": {"task_id": agent_id}}], "delay_s": 0.3}
        return text("STOPPED_IT")

    seen: list[dict[str, Any]] = []
    session = Session(agent_options(tmp_path), client=ScriptedModel(answer, per_session=True), emit=seen.append)
    result = await asyncio.wait_for(session.run("GO"), 30)
    assert child_started.is_set()
    assert result.result == "STOPPED_IT" and session.background_agents == () and session.tasks.running == ()
    stop_result = parent[2].messages[-1]["content"][0]
    body = json.loads(stop_result["content"])
    assert body["task_type"] == "local_agent" and body["message"].startswith("Successfully stopped task:")
    (rec,) = session.tasks.tasks.values()
    assert rec.status == KILLED and not rec.notified and session.queue.pending == ()
    assert [m["status"] for m in seen if m.get("subtype") == "task_notification"] == ["stopped"]
    await session.aclose()


async def test_the_stop_hook_is_told_of_the_tasks_still_running(tmp_path: Path) -> None:
    from agentfsm.hooks.runner import HookMatcher

    inputs: list[Any] = []

    async def on_stop(record: Any) -> None:
        inputs.append(record)

    script = [bash("toolu_bg", command="sleep 0.5", description="nap", run_in_background=True), text("WAITING"),
              text("DONE")]
    opts = Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), tools=("Bash",), sandbox=False,
                   hooks={"Stop": [HookMatcher(hooks=[on_stop])]})
    session = Session(opts, client=ScriptedModel(lambda r, n: script[n] if n < 3 else text("X")))
    await session.run("GO")
    await session.aclose()
    first, second = inputs
    (task,) = first.background_tasks
    assert task["task_type"] == "local_bash" and task["description"] == "nap"
    assert second.background_tasks == ()  # the notification's pass ends with nothing running
    assert json.loads(first.to_json())["background_tasks"] == [dict(task)]


def test_records_from_worker_threads_keep_the_file_in_seq_order(tmp_path: Path) -> None:
    """A command's sandbox record is written by the worker thread that prepared it, while the loop
    writes its own (concurrent read-only commands prepare in parallel): every record's seq follows the
    one before it in the file."""
    import threading

    from agentfsm.runtime.trace import TraceWriter

    writer = TraceWriter(tmp_path / "s.jsonl")

    def burst(n: int) -> None:
        for i in range(300):
            writer.write({"type": "sandbox", "tool_use_id": f"t{n}-{i}", "sandboxed": True})

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for i in range(300):
        writer.write({"type": "task", "task_id": f"b{i}"})
    for t in threads:
        t.join()
    writer.close()
    seqs = [r["seq"] for r in read_records(tmp_path / "s.jsonl")]
    assert seqs == list(range(7 * 300))


async def test_a_resumed_session_reports_the_tasks_its_last_process_left_running(tmp_path: Path) -> None:
    """The session file says a task was running when its process ended (here: the file is closed and the
    command killed behind the registry's back, as a crash would leave them). Resuming records it
    killed, tells the client (``stopped``, as Claude Code says), and the first request of the next run
    carries its notification."""
    from agentfsm.machine.state import Limits
    from agentfsm.sessions.resume import open_session

    # the host moves the run to the background before its second request: an end after which it does not
    # wait for its background work (graph.NOTIFIED_AFTER), so the task is still running when it returns
    script = [bash("toolu_bg", command="sleep 30", description="long job", run_in_background=True),
              text("WAITING")]
    opts = Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), tools=("Bash",), sandbox=False, limits=Limits(),
                   should_stop_before_next_call=lambda state: "moved" if state.turn_count > 1 else None)
    first = Session(opts, client=ScriptedModel(lambda r, n: script[n] if n < 2 else text("X")))
    await first.run("GO")
    (task_id,) = first.tasks.running
    process = first.tasks._live[task_id].process
    assert process is not None
    first.trace.close()  # the process "ends": its file stays as it was
    os.killpg(process.pid, signal.SIGKILL)
    requests: list[ModelRequest] = []

    def answer(request: ModelRequest, n: int) -> Any:
        requests.append(request)
        return text("RESUMED")

    seen: list[dict[str, Any]] = []
    again = open_session(Options(permission_mode="bypassPermissions", cwd=tmp_path,
                                 sessions_dir=tmp_path / "sessions", setting_sources=(), tools=("Bash",),
                                 sandbox=False, resume=first.session_id),
                         client=ScriptedModel(answer), emit=seen.append)
    rec = again.tasks.get(task_id)
    assert rec is not None and rec.status == KILLED and again.tasks.running == ()
    result = await again.run("NEXT")
    await again.aclose()
    await first.aclose()
    assert result.result == "RESUMED" and len(requests) == 1
    sent = json.dumps(requests[0].messages)
    # Claude Code 2.1.332's words and status for it (tests/fixtures/background/ctrl_c/resume_stream.jsonl)
    assert f"<task-id>{task_id}</task-id>" in sent and "<status>stopped</status>" in sent
    assert "Background shell command didn't finish before the previous session ended" in sent
    note = [m for m in seen if m.get("subtype") == "task_notification"]
    assert [(m["task_id"], m["status"]) for m in note] == [(task_id, "stopped")]
    tasks = [r for r in read_records(again.trace_path) if r.get("type") == "task"]
    assert [r["status"] for r in tasks] == ["running", "killed"]


# --- stopping a command's process group --------------------------------------------------------------


async def test_stopping_a_group_waits_until_none_of_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal only marks its target, which ends when next scheduled: the leader's end does not mean
    its children's (a loaded machine once showed a killed task's ``sleep`` child running after the
    session closed). Stopping waits until no process of the group runs — a zombie runs nothing."""
    import asyncio

    from agentfsm.runtime import tasks as tasks_module

    monkeypatch.setattr(tasks_module, "STOP_GRACE_S", 0.2)
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", "trap '' TERM; sleep 30 & echo $!; wait", stdout=asyncio.subprocess.PIPE,
        start_new_session=True)
    assert proc.stdout is not None
    child = int((await proc.stdout.readline()).decode())
    assert tasks_module._group_running(proc.pid)
    asked: list[bool] = []
    real = tasks_module._group_running

    def running(pgid: int) -> bool:
        # what is really there, and as if the group's last member still ran at the first two looks
        asked.append(real(pgid))
        return len(asked) <= 2 or asked[-1]

    monkeypatch.setattr(tasks_module, "_group_running", running)
    await tasks_module._kill_group(proc)
    assert len(asked) == 3 and asked[-1] is False and not real(proc.pid)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
