"""Opt-in: Claude Code itself (``$AGENTFSM_CLAUDE`` or ``claude`` on PATH) runs a fixture's scenario
against the scripted server, and its fresh transcript and stream-json output audit to the moves the
committed fixture expects. Skips with a reason when the client is absent."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentfsm.auditing.audit import audit_report
from agentfsm.testing import ScriptedServer
from agentfsm.testing.scenario import load_scenario

FIXTURES = Path(__file__).parent / "fixtures" / "claude_code"
# scenarios that run in about a second each; a Stop hook script is written per run
LIVE = ["read_probe", "parallel_reads", "max_tokens_exhaust", "malformed_exhaust", "thinking_only_reset",
        "ptl_after_tools", "json_schema_retry", "max_turns_1", "stop_hook_once"]
STOP_BLOCK_ONCE = """#!/bin/sh
# blocks the end once: exit 2 with the reason, unless the loop is already continuing for a Stop hook
if grep -q '"stop_hook_active":true' ; then exit 0; fi
echo "STOP_HOOK_REENTER_MARKER: run the tests first" >&2
exit 2
"""


def _claude() -> str | None:
    return os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")


def _flags(scenario: str, hook: Path) -> list[str]:
    """The fixture's own flags (cmd.txt), after those every run shares; the hook path made local."""
    words = shlex.split((FIXTURES / scenario / "cmd.txt").read_text().splitlines()[0])
    tail = words[words.index("bypassPermissions") + 1:]
    return [w.replace("/TOOLS/stop_block_once.sh", str(hook)) for w in tail]


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("scenario", LIVE)
def test_a_fresh_claude_code_run_audits_like_its_fixture(scenario: str, agentfsm_workspace: Path,
                                                         tmp_path: Path) -> None:
    claude = _claude()
    if claude is None:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    hook = tmp_path / "stop_block_once.sh"
    hook.write_text(STOP_BLOCK_ONCE)
    hook.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    script = load_scenario(FIXTURES / scenario / "scenario.json", str(agentfsm_workspace))
    env = {**os.environ, "HOME": str(home), "IS_SANDBOX": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ANTHROPIC_API_KEY": "sk-test"}
    with ScriptedServer(script, per_session=True) as server:
        env["ANTHROPIC_BASE_URL"] = server.base_url
        done = subprocess.run(
            [claude, "--print", script.prompt, "--output-format", "stream-json", "--verbose", "--model",
             "claude-sonnet-4-5", "--tools", "Read", "--permission-mode", "bypassPermissions",
             *_flags(scenario, hook)],
            cwd=agentfsm_workspace, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    stream = tmp_path / "stream.jsonl"
    stream.write_text(done.stdout)
    transcripts = sorted((home / ".claude" / "projects").rglob("*.jsonl"))
    assert len(transcripts) == 1, done.stderr[-2000:]
    expected = json.loads((FIXTURES / scenario / "expected.json").read_text())
    for path, source in ((transcripts[0], "transcript"), (stream, "stream-json")):
        report = audit_report(path)
        assert report.errors == 0, [str(f) for f in report.findings]
        assert [m.label for m in report.moves] == expected[source]["moves"], source
        assert report.terminal_reason == expected[source]["terminal_reason"]


def _record_runs() -> Any:
    spec = importlib.util.spec_from_file_location("record_runs", FIXTURES / "record_runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED = ["interleaved_tool_results", "prompt_blocked", "subagent_foreground", "subagent_background",
            "notification_mid_run", "resumed", "permission_denied", "plan_mode"]


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("scenario", RECORDED)
def test_a_fresh_recording_audits_like_its_fixture(scenario: str, tmp_path: Path) -> None:
    """The cases record_runs.py recorded, run again: each run, each subagent loop (linked to its tool
    call) and each terminal reason as the fixture's expectations say, with no error."""
    claude = _claude()
    if claude is None:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    record_runs = _record_runs()
    out = tmp_path / "out"
    record_runs.record(scenario, out, claude)
    expected = json.loads((FIXTURES / scenario / "expected.json").read_text())
    inputs = {"transcript": record_runs.transcript_of(out), "stream-json": out / "stream.jsonl",
              "stream-json-2": out / "stream2.jsonl"}
    for source, exp in ((k, v) for k, v in expected.items() if k in inputs):
        report = audit_report(inputs[source])
        assert report.errors == 0, [str(f) for r in (report, *report.children) for f in r.findings]
        runs = exp.get("runs", [{"moves": exp["moves"], "terminal_reason": exp["terminal_reason"]}])
        assert [([m.label for m in r.moves], r.terminal_reason) for r in report.runs] == \
            [(r["moves"], r["terminal_reason"]) for r in runs], source
        assert [(c.link, [m.label for m in c.moves], c.terminal_reason) for c in report.children] == \
            [(c["link"], c["moves"], c["terminal_reason"]) for c in exp.get("children", [])], source
