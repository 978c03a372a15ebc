"""Hostile text is data, and a session file holds one writer: lone surrogates, duplicate tool ids,
bad bytes, torn and malformed records, two resumes of one session — through the CLI against the
loopback scripted server (the real SDK path)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentfsm.auditing.audit import check_request
from agentfsm.runtime.trace import FileProblem
from agentfsm.sessions.resume import load_view
from agentfsm.testing.server import ScriptedServer

pytestmark = pytest.mark.server


def text(t: str) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}]}


def bash(*commands: tuple[str, str]) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Bash", "input": {"command": c}} for tid, c in commands],
            "stop_reason": "tool_use"}


def run(server: ScriptedServer, ws: Path, home: Path, *args: str, stdin: str | None = None,
        wait: bool = True) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "agentfsm", "--output-format", "stream-json", "--verbose", "--tools", "Bash,Read",
           "--permission-mode", "bypassPermissions", *args]
    env = {**os.environ, "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test",
           "AGENTFSM_HOME": str(home), "HOME": str(home)}
    if not wait:
        return subprocess.Popen(cmd, cwd=ws, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=120, input=stdin)


def result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert lines and lines[-1]["type"] == "result", (proc.stdout[-2000:], proc.stderr[-2000:])
    return lines[-1]


def session_path(home: Path, ws: Path, sid: str) -> Path:
    return home / "projects" / str(ws.resolve()).replace(os.sep, "-") / f"{sid}.jsonl"


def audit(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentfsm", "audit", str(path)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_lone_surrogates_are_data(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    script = [{"blocks": [{"type": "text", "text": "before \ud83d after"},
                          {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo \udcff"}}],
               "stop_reason": "tool_use"},
              text("done \ud83d")]
    with ScriptedServer(script, ws=agentfsm_workspace) as server:
        # a prompt that is not UTF-8 (argv bytes) arrives as a lone surrogate too
        proc = run(server, agentfsm_workspace, home, "-p", "go \udcff", "--session-id", sid)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        assert result(proc)["result"] == "done \ud83d"  # escaped on stdout, read back as it came
        second = server.requests[1]
    # what was sent carries no surrogate (U+FFFD instead); what was recorded keeps it (escaped)
    assert "\ufffd" in json.dumps(second, ensure_ascii=False)
    path = session_path(home, agentfsm_workspace, sid)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert "before \ud83d after" in json.dumps(records, ensure_ascii=False)
    assert audit(path).returncode == 0


def test_duplicate_tool_ids_are_repaired_before_anything_runs(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    script = [bash(("toolu_dup", "echo FIRST"), ("toolu_dup", "echo SECOND")),
              bash(("toolu_dup", "echo THIRD")),  # the same id in a later turn
              text("done")]
    with ScriptedServer(script, ws=agentfsm_workspace) as server:
        proc = run(server, agentfsm_workspace, home, "-p", "go", "--session-id", sid)
        assert proc.returncode == 0 and result(proc)["subtype"] == "success", proc.stderr
        last = server.requests[-1]
    assert list(check_request(last["messages"])) == []
    results = [b for m in last["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b["type"] == "tool_result"]
    assert [r["content"] for r in results] == ["FIRST", "SECOND", "THIRD"]
    assert len({r["tool_use_id"] for r in results}) == 3
    assert audit(session_path(home, agentfsm_workspace, sid)).returncode == 0


def test_a_session_saved_with_duplicate_ids_resumes_into_a_valid_request(agentfsm_workspace: Path,
                                                                         home: Path) -> None:
    sid = str(uuid.uuid4())
    with ScriptedServer([text("one"), text("two")], ws=agentfsm_workspace) as server:
        assert run(server, agentfsm_workspace, home, "-p", "go", "--session-id", sid).returncode == 0
        path = session_path(home, agentfsm_workspace, sid)
        use = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "true"}}
        res = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
        with path.open("a") as fh:  # what an older agentfsm saved: one id twice
            prompt = [{"type": "text", "text": "p"}]
            for rec in ({"type": "message", "role": "user", "kind": "prompt", "content": prompt},
                        {"type": "message", "role": "assistant", "kind": "assistant", "content": [use, use]},
                        {"type": "message", "role": "user", "kind": "tool_results", "content": [res, res]},
                        {"type": "message", "role": "assistant", "kind": "assistant", "content": [use]},
                        {"type": "message", "role": "user", "kind": "tool_results", "content": [res]}):
                fh.write(json.dumps({"seq": 1000, **rec}) + "\n")
        proc = run(server, agentfsm_workspace, home, "--resume", sid, "-p", "again")
        assert proc.returncode == 0, proc.stderr
        assert list(check_request(server.requests[-1]["messages"])) == []


CORRUPTIONS = {
    "bad_byte_in_a_text": lambda lines: [ln.replace(b'"first"', b'"fi\xffrst"') for ln in lines],
    "bad_byte_in_the_structure": lambda lines: [*lines[:2], lines[2][:3] + b"\xff\xfe" + lines[2][3:], *lines[3:]],
    "torn_multibyte_tail": lambda lines: [*lines, '{"type": "message", "role": "user", "content": "é'.encode()[:-1]],
    "malformed_records": lambda lines: [*lines[:3],
                                        b'{"type": "message", "role": "robot", "content": [1, 2]}\n',
                                        b'{"type": "message", "role": "user", "content": "not a list"}\n',
                                        b'{"type": "message", "role": "user", "content": [{"type": "tool_use"}]}\n',
                                        b'{"type": "assistant_block", "block": 7}\n',
                                        b'{"type": 5}\n', b'[1, 2]\n', b'{"type": "transition", "seq": "x"}\n',
                                        b'{not json\n', b"[" * 5000 + b"\n", *lines[3:]],
    "random_bytes": lambda lines: [*lines[:2], bytes(random.Random(7).randrange(256) for _ in range(300)) + b"\n",
                                   *lines[2:]],
}


@pytest.mark.slow
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_damaged_session_file_still_resumes_forks_continues_and_audits(agentfsm_workspace: Path, home: Path,
                                                                        corruption: str) -> None:
    sid = str(uuid.uuid4())
    with ScriptedServer([bash(("toolu_a", "echo A")), text("first"), text("resumed"), text("forked"),
                         text("continued")], ws=agentfsm_workspace) as server:
        assert run(server, agentfsm_workspace, home, "-p", "FIRST_PROMPT", "--session-id", sid).returncode == 0
        path = session_path(home, agentfsm_workspace, sid)
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(CORRUPTIONS[corruption](lines)))
        problems: list[FileProblem] = []
        load_view(path, problems)
        assert problems, "the damage is reported"
        for k, args in enumerate((("--resume", sid), ("--continue",), ("--resume", sid, "--fork-session"))):
            proc = run(server, agentfsm_workspace, home, *args, "-p", "NEXT")
            assert proc.returncode == 0, (args, proc.stderr)
            assert "Traceback" not in proc.stderr
            assert k > 0 or "warning: the session file" in proc.stderr  # said when first met
            assert list(check_request(server.requests[-1]["messages"])) == []
            assert "FIRST_PROMPT" in json.dumps(server.requests[-1]["messages"])
    checked = audit(path)
    assert checked.returncode in (0, 1) and "Traceback" not in checked.stderr, checked.stderr


class _GatedServer(ScriptedServer):
    """Holds the response scripted with ``delay_s: HELD`` until ``release`` is set: a run is then
    provably still in flight, however slow the machine is."""

    HELD = 1000.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    async def _sleep(self, seconds: float) -> None:
        if seconds != self.HELD:
            await super()._sleep(seconds)
            return
        while not self.release.is_set():
            await asyncio.sleep(0.02)


@pytest.mark.slow
def test_one_writer_per_session(agentfsm_workspace: Path, home: Path) -> None:
    sid = str(uuid.uuid4())
    held = {"blocks": [{"type": "text", "text": "slow"}], "delay_s": _GatedServer.HELD}
    with _GatedServer([text("one"), held, text("forked")], ws=agentfsm_workspace) as server:
        assert run(server, agentfsm_workspace, home, "-p", "go", "--session-id", sid).returncode == 0
        first = run(server, agentfsm_workspace, home, "--resume", sid, "-p", "again", wait=False)
        assert isinstance(first, subprocess.Popen)
        try:
            deadline = time.monotonic() + 60
            while len(server.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(server.requests) == 2, "the first run never reached the model"
            busy = run(server, agentfsm_workspace, home, "--resume", sid, "-p", "meanwhile")
            assert first.poll() is None, "the first run must still hold the session"
            assert busy.returncode == 1 and "is in use by another agentfsm run" in busy.stderr, busy.stderr
            forked = run(server, agentfsm_workspace, home, "--resume", sid, "--fork-session", "-p", "fork it")
            assert forked.returncode == 0, forked.stderr
        finally:
            server.release.set()
            _out, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
    assert audit(session_path(home, agentfsm_workspace, sid)).returncode == 0


@pytest.mark.parametrize("hostile", [
    '{"file_path": ' + "[" * 100_000 + "]" * 100_000 + "}",  # parses only with a deep enough stack
    "[" * 100_000,  # json.loads recursed into every "[" before finding the text incomplete
    '{"file_path": ' + "1" * 5_000 + "}",  # past Python's integer-digits limit: a ValueError, no JSONDecodeError
])
def test_a_deep_or_huge_tool_input_is_malformed_input(agentfsm_workspace: Path, home: Path, hostile: str) -> None:
    # it used to end the run with RecursionError and leave the call without a tool_result
    sid = str(uuid.uuid4())
    script = [{"blocks": [{"type": "raw_tool_json", "id": "toolu_deep", "name": "Read", "json": hostile}],
               "stop_reason": "tool_use"},
              text("recovered")]
    with ScriptedServer(script, ws=agentfsm_workspace) as server:
        proc = run(server, agentfsm_workspace, home, "-p", "go", "--session-id", sid)
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr, proc.stderr[-2000:]
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (result(proc)["terminal_reason"], result(proc)["result"]) == ("completed", "recovered")
        assert len(server.requests) == 2
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    answers = [b for m in lines if m["type"] == "user" for b in m["message"]["content"]
               if b.get("type") == "tool_result" and b["tool_use_id"] == "toolu_deep"]
    # answered as invalid JSON is: the call withdrawn (with its tool_result), the model asked again
    assert len(answers) == 1 and answers[0]["is_error"], answers
    assert audit(session_path(home, agentfsm_workspace, sid)).returncode == 0
