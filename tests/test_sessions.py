"""Session files, resume / continue / fork, crash recovery — through the CLI, as subprocesses, against
the loopback scripted server (the real ``anthropic`` SDK path)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentfsm.auditing.audit import check_request
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, Message
from agentfsm.runtime.trace import TraceWriter, read_records
from agentfsm.sessions.resume import DANGLING_RESULT, heal_tail, latest_session, load_history, open_session, repair
from agentfsm.testing.server import ScriptedServer

pytestmark = pytest.mark.server

READ = {"blocks": [{"type": "tool_use", "id": "toolu_read_1", "name": "Read",
                    "input": {"file_path": "$WS/probe-fixture.txt"}}]}


def text(t: str) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}]}


def env_for(server: ScriptedServer, home: Path) -> dict[str, str]:
    return {**os.environ, "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test",
            "AGENTFSM_HOME": str(home), "HOME": str(home)}


def cli(server: ScriptedServer, ws: Path, home: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "agentfsm", "--output-format", "stream-json", "--verbose",
         "--tools", "Read", "Bash", "--permission-mode", "bypassPermissions", *args],
        cwd=ws, env=env_for(server, home), capture_output=True, text=True, timeout=90)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines, proc.stderr


def wire_texts(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(role, what) per block: text, tool_use:<id>, tool_result:<id>[:error]."""
    out = []
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for b in content:
            if b["type"] == "text":
                out.append((m["role"], b["text"]))
            elif b["type"] == "tool_use":
                out.append((m["role"], f"tool_use:{b['id']}"))
            elif b["type"] == "tool_result":
                flag = ":error" if b.get("is_error") else ""
                out.append((m["role"], f"tool_result:{b['tool_use_id']}{flag}"))
    return out


def session_file(home: Path, ws: Path, sid: str) -> Path:
    return home / "projects" / str(ws.resolve()).replace(os.sep, "-") / f"{sid}.jsonl"


def result_of(lines: list[dict[str, Any]]) -> dict[str, Any]:
    assert lines and lines[-1]["type"] == "result", lines
    return lines[-1]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_session_id_then_resume_restores_the_history(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    script = [READ, text("TOOL_EXECUTION_OK"), text("RESUME_OK")]
    with ScriptedServer(script, ws=agentfsm_workspace) as server:
        rc, lines, err = cli(server, agentfsm_workspace, home, "-p", "INITIAL_MARKER", "--session-id", sid)
        assert rc == 0, err
        assert lines[0]["session_id"] == sid == result_of(lines)["session_id"]
        rc, lines, err = cli(server, agentfsm_workspace, home, "--resume", sid, "-p", "RESUME_MARKER")
        assert rc == 0, err
        bodies = server.requests
    res = result_of(lines)
    assert res["result"] == "RESUME_OK" and res["session_id"] == sid
    assert {m["session_id"] for m in lines} == {sid}
    assert len(bodies) == 3
    assert wire_texts(bodies[2]) == [
        ("user", "INITIAL_MARKER"), ("assistant", "tool_use:toolu_read_1"),
        ("user", "tool_result:toolu_read_1"), ("assistant", "TOOL_EXECUTION_OK"), ("user", "RESUME_MARKER")]
    assert "AGENT_LOOP_FILE_MARKER" in json.dumps(bodies[2]["messages"][2])
    assert list(check_request(bodies[2]["messages"])) == []
    # one file, both runs; the auditor finds nothing wrong with it
    path = session_file(home, agentfsm_workspace, sid)
    records = list(read_records(path))
    assert [r["type"] for r in records].count("session") == 1
    assert [r["type"] for r in records].count("result") == 2
    audit = subprocess.run([sys.executable, "-m", "agentfsm", "audit", str(path)], capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_fork_gives_a_new_id_with_the_same_history(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    with ScriptedServer([READ, text("FIRST_ANSWER"), text("FORK_OK")], ws=agentfsm_workspace) as server:
        assert cli(server, agentfsm_workspace, home, "-p", "ORIGINAL", "--session-id", sid)[0] == 0
        parent = session_file(home, agentfsm_workspace, sid)
        before = parent.read_bytes()
        rc, lines, err = cli(server, agentfsm_workspace, home, "--resume", sid, "--fork-session",
                             "-p", "FORKED")
        bodies = server.requests
    assert rc == 0, err
    new_id = lines[0]["session_id"]
    assert new_id != sid and result_of(lines)["session_id"] == new_id
    assert parent.read_bytes() == before  # the parent's file is untouched
    child = session_file(home, agentfsm_workspace, new_id)
    records = list(read_records(child))
    assert records[0]["type"] == "session" and records[0]["parent_session_id"] == sid
    assert records[0]["session_id"] == new_id
    assert wire_texts(bodies[2])[:4] == [*wire_texts(bodies[1]), ("assistant", "FIRST_ANSWER")]
    assert wire_texts(bodies[2])[-1] == ("user", "FORKED")
    # the fork's own file holds the whole history: resuming the fork needs nothing of the parent
    assert [m.text() for m in load_history(child) if m.role == "assistant"][-1] == "FORK_OK"


def test_continue_picks_the_latest_session_of_the_directory(agentfsm_workspace: Path, home: Path) -> None:
    older, newer = str(uuid.uuid4()), str(uuid.uuid4())
    with ScriptedServer([text("A"), text("B"), text("C")], ws=agentfsm_workspace) as server:
        assert cli(server, agentfsm_workspace, home, "-p", "OLDER", "--session-id", older)[0] == 0
        time.sleep(0.02)
        assert cli(server, agentfsm_workspace, home, "-p", "NEWER", "--session-id", newer)[0] == 0
        rc, lines, err = cli(server, agentfsm_workspace, home, "--continue", "-p", "CONTINUED")
        bodies = server.requests
    assert rc == 0, err
    assert lines[0]["session_id"] == newer == result_of(lines)["session_id"]
    assert wire_texts(bodies[2]) == [("user", "NEWER"), ("assistant", "B"), ("user", "CONTINUED")]


def test_usage_errors(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    with ScriptedServer([text("A")], ws=agentfsm_workspace) as server:
        rc, _, err = cli(server, agentfsm_workspace, home, "--resume", sid, "-p", "x")
        assert rc == 1 and "No conversation found with session ID" in err
        rc, _, err = cli(server, agentfsm_workspace, home, "--fork-session", "-p", "x")
        assert rc == 1 and "--fork-session" in err
        rc, _, err = cli(server, agentfsm_workspace, home, "--continue", "-p", "x")
        assert rc == 1 and "No conversation found" in err
        assert cli(server, agentfsm_workspace, home, "-p", "x", "--session-id", sid)[0] == 0
        rc, _, err = cli(server, agentfsm_workspace, home, "-p", "x", "--session-id", sid)
        assert rc == 1 and "already in use" in err
        other = str(uuid.uuid4())
        rc, _, err = cli(server, agentfsm_workspace, home, "--resume", sid, "--session-id", other, "-p", "x")
        assert rc == 1 and "--fork-session" in err
        assert len(server.requests) == 1


def test_a_transcript_cut_mid_record_resumes_with_the_dangling_call_repaired(
        agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    with ScriptedServer([READ, text("LOST"), text("AFTER_CRASH_OK")], ws=agentfsm_workspace) as server:
        assert cli(server, agentfsm_workspace, home, "-p", "BEFORE_CRASH", "--session-id", sid)[0] == 0
        path = session_file(home, agentfsm_workspace, sid)
        raw = path.read_bytes()
        # simulate a crash while the tool results were being written: cut that record in half
        start = raw.index(b'"kind": "tool_results"')
        line_start = raw.rindex(b"\n", 0, start) + 1
        path.write_bytes(raw[:line_start + (start - line_start) // 2])
        rc, lines, err = cli(server, agentfsm_workspace, home, "--resume", sid, "-p", "RESUMED")
        bodies = server.requests
    assert rc == 0, err
    assert result_of(lines)["result"] == "AFTER_CRASH_OK"
    assert wire_texts(bodies[2]) == [("user", "BEFORE_CRASH"), ("assistant", "tool_use:toolu_read_1"),
                                     ("user", "tool_result:toolu_read_1:error"), ("user", "RESUMED")]
    assert DANGLING_RESULT in json.dumps(bodies[2]["messages"][2])
    assert list(check_request(bodies[2]["messages"])) == []
    # the records appended on resume start on a line of their own: the file reads whole again
    history = load_history(path)
    assert history[-1].text() == "AFTER_CRASH_OK" and history[-2].text() == "RESUMED"


def test_kill_9_mid_tool_then_resume(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    sleep = {"blocks": [{"type": "text", "text": "Sleeping."},
                        {"type": "tool_use", "id": "toolu_sleep", "name": "Bash",
                         "input": {"command": "sleep 30", "description": "wait"}}]}
    with ScriptedServer([sleep, text("AFTER_KILL_OK")], ws=agentfsm_workspace) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentfsm", "--output-format", "stream-json", "--verbose", "--tools", "Bash",
             "--permission-mode", "bypassPermissions", "-p", "RUN_A_SLOW_TOOL", "--session-id", sid],
            cwd=agentfsm_workspace, env=env_for(server, home), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                msg = json.loads(line)
                if msg["type"] == "assistant" and msg["message"]["content"][0]["type"] == "tool_use":
                    break
            time.sleep(0.3)  # the tool is running now
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=30)
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        assert proc.returncode == -signal.SIGKILL
        rc, lines, err = cli(server, agentfsm_workspace, home, "--resume", sid, "-p", "AFTER_KILL")
        bodies = server.requests
    assert rc == 0, err
    assert result_of(lines)["result"] == "AFTER_KILL_OK"
    assert wire_texts(bodies[1]) == [
        ("user", "RUN_A_SLOW_TOOL"), ("assistant", "Sleeping."), ("assistant", "tool_use:toolu_sleep"),
        ("user", "tool_result:toolu_sleep:error"), ("user", "AFTER_KILL")]
    assert list(check_request(bodies[1]["messages"])) == []


def test_a_compact_boundary_restores_the_summary_view(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    trace = TraceWriter(session_file(home, agentfsm_workspace, sid))
    trace.session(sid, Limits(), str(agentfsm_workspace), "claude-sonnet-4-5")
    for m in (Message("user", "OLD_PROMPT"),
              Message("assistant", ({"type": "tool_use", "id": "toolu_old", "name": "Read", "input": {}},),
                      kind="assistant"),
              Message("user", ({"type": "tool_result", "tool_use_id": "toolu_old", "content": "x"},),
                      kind="tool_results"),
              Message("assistant", "OLD_ANSWER", kind="assistant")):
        trace.message(m)
    trace.compact_boundary("manual", 104)
    trace.message(Message("user", "SUMMARY_OF_EARLIER_WORK", kind="compact_summary"))
    trace.close()
    with ScriptedServer([text("FROM_SUMMARY")], ws=agentfsm_workspace) as server:
        rc, _, err = cli(server, agentfsm_workspace, home, "--resume", sid, "-p", "CURRENT")
        bodies = server.requests
    assert rc == 0, err
    # the summary and the prompt join into one user message on the wire, and a joined text ends with a
    # newline as in Claude Code 2.1.332 (tests/fidelity/conform/, fixture conform-11d939ce08)
    assert wire_texts(bodies[0]) == [("user", "SUMMARY_OF_EARLIER_WORK\n"), ("user", "CURRENT")]
    assert "OLD_PROMPT" not in json.dumps(bodies[0]) and "toolu_old" not in json.dumps(bodies[0])


# --- the pieces, in process --------------------------------------------------------------------


def test_repair_pairs_dangling_calls_and_drops_orphan_results() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}
    use2 = {"type": "tool_use", "id": "t2", "name": "Read", "input": {}}
    res = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    orphan = {"type": "tool_result", "tool_use_id": "gone", "content": "?"}
    history = repair([Message("user", "p"), Message("assistant", (use, use2), kind="assistant"),
                      Message("user", (res,), kind="tool_results"), Message("user", (orphan,))])
    assert [m.role for m in history] == ["user", "assistant", "user"]
    assert history[2].tool_result_ids() == ["t1", "t2"]
    assert history[2].content[1]["is_error"] is True
    history = repair([Message("user", "p"), Message("assistant", (use,), kind="assistant")])
    assert history[-1].kind == "synthetic" and history[-1].tool_result_ids() == ["t1"]


def test_load_history_rebuilds_an_unrecorded_response(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    t = TraceWriter(path)
    t.message(Message("user", "p1"))
    # a retried stream, then the response the crash cut off before the driver recorded it
    t.write({"type": "assistant_block", "message_id": "m0", "block": {"type": "text", "text": "RETRIED"}})
    t.write({"type": "assistant_block", "message_id": "m1", "block": {"type": "text", "text": "KEPT"}})
    t.write({"type": "assistant_block", "message_id": "m1",
             "block": {"type": "tool_use", "id": "t9", "name": "Bash", "input": {"command": "x"}}})
    t.close()
    first = load_history(path)
    assert [m.role for m in first] == ["user", "assistant", "user"]
    assert first[1].text() == "KEPT" and first[1].tool_use_ids() == ["t9"] and first[2].kind == "synthetic"
    # a later run starts: the rebuilt response stays in place, before its prompt
    t = TraceWriter(path)
    t.message(Message("user", "p2"))
    t.close()
    again = load_history(path)
    assert [m.text() for m in again if m.role == "user" and m.kind == "prompt"] == ["p1", "p2"]
    assert again[1].uuid == first[1].uuid  # recomputed identically on every load


def test_dropped_responses_are_not_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    t = TraceWriter(path)
    t.message(Message("user", "p1"))
    t.write({"type": "assistant_block", "message_id": "m0", "block": {"type": "thinking", "thinking": "hm"}})
    t.message(Message("user", "nudge", kind="meta"))  # the loop dropped the thinking-only answer
    t.write({"type": "assistant_block", "message_id": "m1", "block": {"type": "text", "text": "ANSWER"}})
    t.message(Message("assistant", "ANSWER", kind="assistant"))
    t.result({"subtype": "success"})
    t.close()
    assert [m.text() for m in load_history(path)] == ["p1", "nudge", "ANSWER"]


def test_heal_tail(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"type": "a"}\n{"type": "b"}\n{"type": "c", "x":')
    heal_tail(path)
    assert path.read_bytes() == b'{"type": "a"}\n{"type": "b"}\n'
    heal_tail(path)
    assert path.read_bytes() == b'{"type": "a"}\n{"type": "b"}\n'
    path.write_bytes(b"torn")
    heal_tail(path)
    assert path.read_bytes() == b""


def test_latest_session_ignores_subagent_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    time.sleep(0.01)
    (tmp_path / "a" / "subagents").mkdir(parents=True)
    (tmp_path / "a" / "subagents" / "z.jsonl").write_text("{}\n")
    (tmp_path / "a.log").write_text("x")
    assert latest_session(tmp_path) == "a"


def test_open_session_forks_in_process(tmp_path: Path) -> None:
    opts = Options(cwd=tmp_path, sessions_dir=tmp_path / "s", setting_sources=())
    first = open_session(opts)
    first.history = (Message("user", "hi"),)
    first._write_header()
    first.trace.close()
    fork = open_session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", setting_sources=(),
                                resume=first.session_id, fork_session=True))
    assert fork.session_id != first.session_id and fork.options.parent_session_id == first.session_id
    assert [m.text() for m in fork.history] == ["hi"] and not fork.resumed
    resumed = open_session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", setting_sources=(),
                                   continue_session=True))
    assert resumed.session_id == first.session_id and resumed.resumed
