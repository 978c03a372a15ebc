"""``agentfsm demo``: a task a person recognises (read, fix with Edit, test with Bash, answer), shown in
plain words, its path through the graph, the session file under the user's home and how to check it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from agentfsm.auditing.audit import audit_file


def _demo(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    env["HOME"] = str(tmp_path / "home")
    return subprocess.run([sys.executable, "-m", "agentfsm", "demo", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_demo_fixes_a_bug_and_says_where_its_run_is(tmp_path):
    proc = _demo(tmp_path, "--keep", str(tmp_path / "kept"), "--trace-dir", str(tmp_path / "traces"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # the task, in words: read, edit, run the test, answer
    for said in ("calls Read  prices.py", "calls Edit  prices.py", "calls Bash  $ python3 test_prices.py",
                 "test_prices: ok", "The test passes now."):
        assert said in out, out
    assert "MARKER" not in out and "TOOL_EXECUTION_OK" not in out
    # every line of the conversation starts in its column: nothing a tool printed lands at column 0
    talk = out[out.index("  user"):out.index("the path through the graph")]
    assert all(not line or line.startswith("  ") for line in talk.splitlines()), talk
    assert "turn 1: assemble → call_model → stream → dispatch_tools → feedback → (next_turn)" in out
    assert re.search(r"turn 4: assemble → call_model → stream → stop", out), out
    # the tools really ran: the bug is fixed in the workspace
    assert "return price - price * percent / 100" in (tmp_path / "kept" / "workspace" / "prices.py").read_text()
    traces = list((tmp_path / "traces").glob("*.jsonl"))
    assert len(traces) == 1
    assert f"agentfsm audit {traces[0]}" in out
    assert f"agentfsm diagram --trace {traces[0]}" in out
    errors = [f for f in audit_file(traces[0]) if f.is_error]
    assert not errors, errors


def test_the_demo_keeps_its_session_file_under_the_users_home(tmp_path):
    proc = _demo(tmp_path)
    assert proc.returncode == 0, proc.stderr
    traces = list((tmp_path / "home" / ".agentfsm" / "demo").glob("*.jsonl"))
    assert len(traces) == 1, proc.stdout
    assert not (tmp_path / ".agentfsm").exists()  # nothing in the folder the user ran it from


def test_a_trace_dir_that_cannot_be_made_is_said(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    proc = _demo(tmp_path, "--trace-dir", str(tmp_path / "file" / "traces"))
    assert proc.returncode == 1
    assert "cannot keep the session file in" in proc.stderr and "--trace-dir" in proc.stderr
    assert "Traceback" not in proc.stderr
