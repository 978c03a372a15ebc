"""Nothing silent: each failure a user causes is said (on stderr, with what to do) and loses nothing.

One test per case a newcomer met: a hook whose script is missing, a resume of a file that is not a
session, settings that do not load, a headless run's error wording, a misspelt flag.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentfsm.hooks.inputs import PostToolUseInput, PreToolUseInput
from agentfsm.hooks.runner import CommandHook, HookMatcher, HookRunner, unrunnable_reason

AGENTFSM = [sys.executable, "-m", "agentfsm"]


def _run_cli(*argv: str, cwd: Path, env: dict[str, str] | None = None,
             stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    base["HOME"] = str(cwd)
    return subprocess.run([*AGENTFSM, *argv], cwd=cwd, env={**base, **(env or {})}, input=stdin,
                          capture_output=True, text=True, timeout=120)


# --- a hook whose script is missing ------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "code"), [
    (["python3", "no/such/hook.py"], 2),      # python: "can't open file", exit 2 (which reads as a block)
    (["sh", "no/such/hook.sh"], 2),           # dash: "cannot open", exit 2
    (["bash", "no/such/hook.sh"], 127),
    (["bash", "-c", "no-such-program-xyz"], 127),
    ([sys.executable, "-m", "agentfsm_no_such.hook"], 1),   # python -m, a module this interpreter lacks
    ([sys.executable, "-m", "nosuchmodule_xyz"], 1),
])
def test_an_interpreter_that_cannot_open_the_hook_script_is_not_the_hooks_decision(tmp_path, argv, code):
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == code
    assert unrunnable_reason(proc.returncode, proc.stderr), proc.stderr


@pytest.mark.parametrize("stderr", ["denied: rm -rf is not allowed\n", "", "can't open file but I mean it\nline 2\n",
                                    "Traceback (most recent call last):\nModuleNotFoundError: No module named 'x'\n"])
def test_a_hooks_own_exit_2_still_blocks(stderr):
    assert unrunnable_reason(2, stderr) == ""
    assert unrunnable_reason(1, stderr) == ""


async def test_a_missing_hook_script_is_said_once_and_a_permission_hook_fails_closed(tmp_path):
    said: list[str] = []
    hook = CommandHook(command="python3 hooks/examples/no_such_hook.py", source=str(tmp_path / "settings.json"))
    matchers = [HookMatcher(None, [hook])]
    runner = HookRunner({"PreToolUse": matchers, "PostToolUse": matchers}, project_dir=tmp_path, warn=said.append)
    record = PreToolUseInput(tool_name="Bash", tool_input={"command": "ls"}, tool_use_id="t1", session_id="s",
                             cwd=str(tmp_path))
    first = await runner.run(record)
    second = await runner.run(record)
    # PreToolUse: denied as a hook error (fail closed), never as the hook's own decision
    assert first.blocked and second.blocked
    assert first.reason.startswith("PreToolUse hook error: [python3 hooks/examples/no_such_hook.py] could not run")
    assert first.results[0].outcome == "non_blocking_error"
    assert len(said) == 1, said  # once per hook
    assert "could not run" in said[0] and "no_such_hook.py" in said[0] and "denied (fail closed)" in said[0]
    assert "CLAUDE_PROJECT_DIR" in said[0] and "settings.json" in said[0]
    post = PostToolUseInput(tool_name="Bash", tool_input={"command": "ls"}, tool_use_id="t1", tool_response="x",
                            session_id="s", cwd=str(tmp_path))
    after = await runner.run(post)
    assert not after.blocked and not after.user_messages  # its exit 2 is not a PostToolUse "block" either


def _missing_hook_run(tmp_path: Path, event: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"prompt": "list", "responses": [
        {"blocks": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo ran-it"}}],
         "stop_reason": "tool_use"},
        {"blocks": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}]}))
    settings = {"hooks": {event: [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": "python3 hooks/examples/audit_log.py"}]}]}}
    proc = _run_cli("-p", "list", "--scripted", str(scenario), "--settings", json.dumps(settings),
                    "--permission-mode", "bypassPermissions", "--output-format", "stream-json", "--verbose",
                    cwd=tmp_path)
    return proc, [json.loads(line) for line in proc.stdout.splitlines()]


def test_cli_a_missing_permission_hook_is_on_stderr_and_denies_the_call(tmp_path):
    proc, messages = _missing_hook_run(tmp_path, "PreToolUse")
    assert proc.returncode == 0, proc.stderr
    assert "hooks/examples/audit_log.py" in proc.stderr and "could not run" in proc.stderr
    results = [b for m in messages if m["type"] == "user" for b in m["message"]["content"]]
    assert results[0]["is_error"] and "could not run" in str(results[0]["content"])
    assert "ran-it" not in str(results[0]["content"])  # the command never ran


def test_cli_a_missing_post_tool_hook_is_on_stderr_and_the_run_goes_on(tmp_path):
    proc, messages = _missing_hook_run(tmp_path, "PostToolUse")
    assert proc.returncode == 0, proc.stderr
    assert "hooks/examples/audit_log.py" in proc.stderr and "skipped" in proc.stderr
    results = [b for m in messages if m["type"] == "user" for b in m["message"]["content"]]
    assert "ran-it" in str(results[0]["content"]) and not results[0].get("is_error")
    assert messages[-1]["result"] == "done"


# --- resume of a file that is not a session; settings that do not load ----------------------------------

SID = "5b7c1c52-0d5e-4a4e-9a59-1f1b8f3b2d11"


@pytest.mark.parametrize("content", [b"", b"\n\n", b'{"type": "user", "message": {"role": "user"}}\n',
                                     b'{"not": "a record"}\nplain text\n'])
def test_resume_refuses_a_file_that_is_not_a_session_and_writes_nothing(tmp_path, content):
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    target = sessions / f"{SID}.jsonl"
    target.write_bytes(content)
    proc = _run_cli("-p", "hello", "--scripted", "read_probe", "--sessions-dir", str(sessions), "--resume", SID,
                    cwd=tmp_path)
    assert proc.returncode == 1
    assert f"Cannot resume {SID}" in proc.stderr and "Nothing was written" in proc.stderr, proc.stderr
    assert target.read_bytes() == content
    assert sorted(p.name for p in sessions.iterdir()) == [target.name]


@pytest.mark.parametrize(("settings", "said"), [
    ("missing-settings.json", "missing-settings.json"),
    ("{not json", "settings"),
    ('{"permissions": {"allow": "Bash"}}', "allow"),
])
def test_bad_settings_leave_no_session_file(tmp_path, settings, said):
    sessions = tmp_path / "sessions"
    proc = _run_cli("-p", "hello", "--scripted", "read_probe", "--sessions-dir", str(sessions),
                    "--settings", settings, cwd=tmp_path)
    assert proc.returncode == 1
    assert "agentfsm: error:" in proc.stderr and said in proc.stderr, proc.stderr
    assert not sessions.exists() or not any(sessions.rglob("*")), list(sessions.rglob("*"))


# --- Ctrl-C during a long Bash command ------------------------------------------------------------------


def test_the_first_ctrl_c_stops_a_long_bash_command(tmp_path):
    import signal
    import time

    started = tmp_path / "started"
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"prompt": "wait", "responses": [
        {"blocks": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                     "input": {"command": f"touch {started} && sleep 600"}}], "stop_reason": "tool_use"},
        {"blocks": [{"type": "text", "text": "never"}], "stop_reason": "end_turn"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    proc = subprocess.Popen([*AGENTFSM, "-p", "wait", "--scripted", str(scenario), "--permission-mode",
                             "bypassPermissions", "--output-format", "json", "--sessions-dir", str(tmp_path / "s")],
                            cwd=tmp_path, env={**env, "HOME": str(tmp_path)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while not started.exists():  # the command is running
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # far less than the command's 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "interrupted: stopping the model and any running tool" in err
    result = json.loads(out)
    assert result["is_error"] is True and result.get("result") != "never", result


# --- wording ------------------------------------------------------------------------------------------


def test_a_misspelt_flag_is_refused_naming_the_flag_that_was_meant(tmp_path):
    proc = _run_cli("-p", "hi", "--outpt-format", "json", cwd=tmp_path)
    assert proc.returncode == 1
    assert "unrecognized arguments: --outpt-format json" in proc.stderr
    assert "did you mean: --outpt-format → --output-format?" in proc.stderr


def test_a_bad_limit_says_what_it_takes_in_words(tmp_path):
    proc = _run_cli("-p", "hi", "--scripted", "read_probe", "--limit", "max_turns=three", cwd=tmp_path)
    assert proc.returncode == 1
    assert "limit max_turns takes a whole number, got 'three'" in proc.stderr


# --- MCP is an extra ------------------------------------------------------------------------------------

WITHOUT_MCP = ("import sys; sys.modules['mcp'] = None; from agentfsm.commandline.cli import main; "
               "sys.exit(main(sys.argv[1:]))")


def test_mcp_servers_without_the_mcp_extra_name_the_extra(tmp_path):
    config = json.dumps({"mcpServers": {"files": {"command": "npx", "args": ["some-server"]}}})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MCP, "-p", "hi", "--scripted", "read_probe",
                           "--mcp-config", config], cwd=tmp_path, env={**env, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "MCP servers are configured (files)" in proc.stderr
    assert "pip install 'agentfsm[mcp]'" in proc.stderr


def test_the_plain_run_does_not_import_mcp(tmp_path):
    (tmp_path / "probe-fixture.txt").write_text("x\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_MCP, "-p", "hi", "--scripted", "read_probe",
                           "--permission-mode", "bypassPermissions", "--sessions-dir", str(tmp_path / "s")],
                          cwd=tmp_path, env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- papercuts -------------------------------------------------------------------------------------------


def test_options_take_a_str_for_every_path(tmp_path):
    from agentfsm import Options

    options = Options(cwd=str(tmp_path), sessions_dir=str(tmp_path / "s"))
    assert options.sessions_dir == tmp_path / "s" and options.cwd == tmp_path.resolve()
    assert Options().sessions_dir is None


def test_loggers_follow_a_reconfiguration_through_structlogs_public_api():
    import structlog
    from structlog.testing import capture_logs

    from agentfsm.common import log

    logger = log.get_logger("agentfsm.test")
    saved = structlog.get_config()
    try:
        structlog.configure(processors=[structlog.processors.JSONRenderer()])
        with capture_logs() as first:
            logger.info("one")
        with capture_logs() as second:
            logger.info("two")
    finally:
        structlog.configure(**saved)
    assert [e["event"] for e in first] == ["one"] and [e["event"] for e in second] == ["two"]


# --- progress on long work --------------------------------------------------------------------------------


def test_bench_run_all_streams_each_bench_and_shows_progress_only_on_a_terminal(tmp_path, capsys, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import run_all
    finally:
        sys.path.pop(0)
    script = tmp_path / "fake.py"
    script.write_text("print('first line', flush=True)\nprint('second line')\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    steps = run_all.Steps(1)
    assert steps.progress is None  # pytest's stderr is no terminal: no bar, no control sequences
    monkeypatch.setattr(run_all, "STEPS", steps)
    assert run_all.run("fake.py") == "first line\nsecond line\n"
    out = capsys.readouterr().out
    assert "first line\nsecond line\n" in out and "\x1b[" not in out


# --- waits say what they wait for -------------------------------------------------------------------------


def test_a_prompt_read_from_an_open_stdin_says_so(tmp_path):
    (tmp_path / "probe-fixture.txt").write_text("x\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    proc = subprocess.Popen([*AGENTFSM, "-p", "--scripted", "read_probe", "--permission-mode", "bypassPermissions",
                             "--sessions-dir", str(tmp_path / "s")], cwd=tmp_path, env={**env, "HOME": str(tmp_path)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdin is not None
        line = proc.stderr.readline()  # said while stdin is still open
        assert "reading the prompt from stdin until it is closed" in line and "Ctrl-C stops" in line, line
        proc.stdin.write("what is in the file?")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_retry_wait_is_said_on_stderr_in_text_output(tmp_path):
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"prompt": "hi", "responses": [
        {"status": 529, "error_type": "overloaded_error", "message": "Overloaded"},
        {"blocks": [{"type": "text", "text": "fine now"}], "stop_reason": "end_turn"}]}))
    proc = _run_cli("-p", "hi", "--scripted", str(scenario), "--sessions-dir", str(tmp_path / "s"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fine now"
    assert "the API request failed (529: " in proc.stderr and "retrying in" in proc.stderr, proc.stderr
    assert "Ctrl-C stops" in proc.stderr


def test_an_endpoint_that_does_not_answer_is_named_as_a_connection_failure(tmp_path):
    """No HTTP answer at all (nothing listens at the base URL): the retry line says the connection
    failed and what to check, not the record's category "unknown"."""
    import socket

    with socket.socket() as s:  # a free loopback port, closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _run_cli("-p", "hi", "--limit", "api_max_retries=1", "--sessions-dir", str(tmp_path / "s"), cwd=tmp_path,
                    env={"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": "sk-test"})
    assert proc.returncode == 1
    assert "the API request failed (no answer: the connection failed or timed out; check the network and " \
           "ANTHROPIC_BASE_URL); retrying in" in proc.stderr, proc.stderr
    assert "unknown" not in proc.stderr.splitlines()[0]
