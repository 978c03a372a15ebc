"""Recovery branches and context governance, end to end.

The first group runs Claude Code's command line (``agentfsm --print P --output-format
stream-json --verbose --model claude-sonnet-4-5 --tools Read --permission-mode bypassPermissions``)
against the loopback scripted server, so the real ``anthropic`` SDK streams every response. The CLI's
``main`` runs in this process (the flags, printer, session and SDK transport are the same code a
subprocess would run; only the interpreter start-up is saved) — one case also runs it as a real
subprocess. The second group checks the counter rules in process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentfsm.auditing.audit import audit_file
from agentfsm.commandline.cli import main as agentfsm_main
from agentfsm.common import log
from agentfsm.machine import prompts
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, TerminalReason
from agentfsm.runtime.trace import read_records, transition_snapshots
from agentfsm.sessions.session import Session
from agentfsm.testing.canonical import canonical_requests
from agentfsm.testing.scenario import load_scenario, populate_workspace
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.testing.server import ScriptedServer

REFERENCE_ARGS = ["--output-format", "stream-json", "--verbose", "--model", "claude-sonnet-4-5",
                  "--tools", "Read", "--permission-mode", "bypassPermissions"]
OVERLOADED = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0.01}
PTL = {"status": 400, "error_type": "invalid_request_error",
       "message": "prompt is too long: 212345 tokens > 200000 maximum"}
# stop_reason tool_use without any tool_use block (a call with broken JSON is dispatched, not retried)
MALFORMED = {"blocks": [{"type": "text", "text": "I will call a tool"}], "stop_reason": "tool_use"}
THINKING = {"blocks": [{"type": "thinking", "thinking": "hmm", "signature": "sig"}],
            "stop_reason": "end_turn"}
INSTRUCTION = "U:" + prompts.COMPACT_INSTRUCTION[:40]
SUMMARY = "U:" + prompts.COMPACT_SUMMARY_PREFIX[:40]


def text(t: str, stop: str = "end_turn", **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": stop, **kw}


def read(tid: str, name: str = "a.txt", **kw: Any) -> dict[str, Any]:
    block = {"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": f"$WS/{name}"}}
    return {"blocks": [block], "stop_reason": "tool_use", **kw}


@attrs.define
class CliRun:
    code: int
    lines: list[dict[str, Any]]
    bodies: list[dict[str, Any]]
    traces: list[Path]

    @property
    def result(self) -> dict[str, Any]:
        assert self.lines and self.lines[-1]["type"] == "result", self.lines[-3:]
        return self.lines[-1]

    @property
    def requests(self) -> list[list[str]]:
        return canonical_requests(self.bodies)

    def system(self, subtype: str) -> list[dict[str, Any]]:
        return [m for m in self.lines if m["type"] == "system" and m.get("subtype") == subtype]

    def audit_clean(self) -> None:
        assert self.traces
        for path in self.traces:
            assert audit_file(path) == [], path

    def tool_pairs_shown(self) -> None:
        """stream-json: every tool_use shown is answered by exactly one user tool_result."""
        uses = [b["id"] for m in self.lines if m["type"] == "assistant" for b in m["message"]["content"]
                if b["type"] == "tool_use"]
        results = [b["tool_use_id"] for m in self.lines if m["type"] == "user"
                   for b in m["message"]["content"] if b.get("type") == "tool_result"]
        assert sorted(uses) == sorted(results)


@pytest.fixture
def cli(agentfsm_workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    home = tmp_path / "home"
    monkeypatch.setenv("AGENTFSM_HOME", str(home))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.chdir(agentfsm_workspace)

    def run(responses: Sequence[Any], *extra: str, prompt: str = "do the task") -> CliRun:
        scenario = load_scenario({"prompt": prompt, "responses": list(responses)}, ws=str(agentfsm_workspace))
        before = set(home.rglob("*.jsonl"))
        with ScriptedServer(scenario) as server:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
            capsys.readouterr()
            code = agentfsm_main(["--print", prompt, *REFERENCE_ARGS, *extra])
            out = capsys.readouterr().out
            bodies = server.requests
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        traces = sorted(set(home.rglob("*.jsonl")) - before)
        return CliRun(code, lines, bodies, traces)

    yield run
    log.configure("off")  # the CLI pointed structlog at the session's log file


pytestmark = pytest.mark.server


# --- the "done when", against the scripted server ----------------------------------------


def test_max_tokens_four_times_resumes_three_times_then_errors(cli: Any) -> None:
    run = cli([text(f"part {i} of the answer", "max_tokens") for i in range(4)])
    assert run.requests == [
        ["U:do the task"],
        ["U:do the task", "A:part 0 of the answer"],
        ["U:do the task", "A:part 0 of the answer", "A:part 1 of the answer"],
        ["U:do the task", "A:part 0 of the answer", "A:part 1 of the answer", "A:part 2 of the answer"],
    ]
    # each retry ends with the hidden resume instruction after the kept partial answer
    for body in run.bodies[1:]:
        last = body["messages"][-1]
        assert last["role"] == "user" and prompts.MAX_TOKENS_RESUME in last["content"][-1]["text"]
    res = run.result
    assert (res["subtype"], res["is_error"], res["terminal_reason"]) == ("success", True, "api_error")
    assert "output token maximum" in res["result"]
    assert run.code == 1
    run.audit_clean()


def test_malformed_tool_use_twice_with_limit_two_retries_cleanly(cli: Any) -> None:
    run = cli([MALFORMED, MALFORMED, text("recovered")], "--limit", "malformed_tool_use_retries=2")
    # the failed assistant messages are dropped: every request carries only the prompt (plus the
    # hidden retry instruction, which the canonical form leaves out)
    assert run.requests == [["U:do the task"]] * 3
    assert all(m["role"] != "assistant" for b in run.bodies for m in b["messages"])
    assert prompts.MALFORMED_TOOL_USE_RETRY in json.dumps(run.bodies[2]["messages"][-1])
    assert (run.result["terminal_reason"], run.result["result"]) == ("completed", "recovered")
    assert run.code == 0
    run.audit_clean()


def test_malformed_tool_use_default_limit_is_exhausted_after_two_retries(cli: Any) -> None:
    """As Claude Code 2.1.332: two retries, then subtype success with is_error and its text
    (tests/fidelity/conform/conform-11d939ce08.json)."""
    run = cli([MALFORMED, MALFORMED, MALFORMED, text("never sent")])
    assert len(run.bodies) == 3
    res = run.result
    assert (res["terminal_reason"], res["subtype"], res["is_error"], res["result"]) == (
        "malformed_tool_use_exhausted", "success", True, prompts.MALFORMED_TOOL_USE_EXHAUSTED)
    assert run.code == 1
    run.audit_clean()


def test_thinking_only_twice_nudges_once_then_completes(cli: Any) -> None:
    run = cli([THINKING, THINKING, text("never sent")])
    assert run.requests == [["U:do the task"], ["U:do the task"]]
    assert prompts.EMPTY_RESPONSE_NUDGE in json.dumps(run.bodies[1]["messages"][-1])
    res = run.result
    assert (res["terminal_reason"], res["is_error"], res["result"]) == ("completed", False, "")
    run.audit_clean()


def test_prompt_too_long_on_the_first_request_cannot_compact(cli: Any) -> None:
    run = cli([PTL, text("never sent")])
    assert len(run.bodies) == 1
    res = run.result
    assert (res["terminal_reason"], res["subtype"], res["is_error"]) == ("prompt_too_long", "success", True)
    # Claude Code 2.1.332's words: a single exchange cannot be compacted, with the request's size
    assert res["result"].startswith("Prompt is too long · the request is ~212345 tokens (limit 200000)")
    assert "A single-exchange conversation cannot be compacted" in res["result"]
    assert run.system("compact_boundary") == []
    run.audit_clean()


def test_prompt_too_long_after_two_tool_turns_compacts_reactively(cli: Any) -> None:
    run = cli([read("r1", "a.txt"), read("r2", "b.txt"), PTL, text("<summary>SUMMARY: read a and b</summary>"),
               text("all done")])
    requests = run.requests
    assert len(requests) == 5
    assert requests[2] == ["U:do the task", "use:r1:Read", "res:r1:ok", "use:r2:Read", "res:r2:ok"]
    # the summary request: the history before the last tool exchange + a text-only instruction
    summary_req = run.bodies[3]
    assert requests[3] == ["U:do the task", "use:r1:Read", "res:r1:ok", INSTRUCTION]
    assert "tools" not in summary_req
    # the retry: the summary, then only the last tool exchange
    assert requests[4] == [SUMMARY, "use:r2:Read", "res:r2:ok"]
    assert "SUMMARY: read a and b" in json.dumps(run.bodies[4]["messages"][0])
    assert len(run.system("compact_boundary")) == 1
    # the prompt-too-long error itself never reached the user
    assert "prompt is too long" not in json.dumps(run.lines)
    assert (run.result["terminal_reason"], run.result["result"]) == ("completed", "all done")
    run.tool_pairs_shown()
    run.audit_clean()


def test_overloaded_once_is_retried_by_the_sdk(cli: Any) -> None:
    run = cli([OVERLOADED, text("fine now")])
    assert run.requests == [["U:do the task"], ["U:do the task"]]
    assert (run.result["terminal_reason"], run.result["result"]) == ("completed", "fine now")
    assert run.code == 0
    run.audit_clean()


def test_overloaded_once_in_a_real_subprocess(agentfsm_workspace: Path, tmp_path: Path) -> None:
    """The same SDK retry through the installed entry point, for the exit status and stdout."""
    scenario = load_scenario({"prompt": "p", "responses": [OVERLOADED, text("fine now")]},
                             ws=str(agentfsm_workspace))
    with ScriptedServer(scenario) as server:
        env = {**os.environ, "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test",
               "AGENTFSM_HOME": str(tmp_path / "home"), "HOME": str(tmp_path / "home")}
        proc = subprocess.run([sys.executable, "-m", "agentfsm", "--print", "p", *REFERENCE_ARGS],
                              cwd=agentfsm_workspace, env=env, capture_output=True, text=True, timeout=90)
        assert len(server.requests) == 2
    result = json.loads(proc.stdout.splitlines()[-1])
    assert (result["terminal_reason"], result["result"], proc.returncode) == ("completed", "fine now", 0)


# --- context governance, faults and budget from the command line -------------------------------


def test_auto_compaction_when_the_estimate_passes_the_threshold(cli: Any, agentfsm_workspace: Path) -> None:
    # The threshold is 1500 tokens. The second request is ~450 (the scripted server reports chars/4
    # of the body); it then reads a ~3500-token file, so the third assemble — the reported context
    # plus the new tool result — is over the threshold and compacts before calling the model.
    (agentfsm_workspace / "big.txt").write_text("a line of the big file\n" * 600)
    limits = ["--limit", "context_window=60000", "--limit", "auto_compact_buffer=58500",
              "--limit", "blocking_buffer=0"]
    run = cli([read("r1"), read("r2", "big.txt"), text("<summary>SUMMARY of reads</summary>"),
               text("done after compaction")],
              *limits)
    requests = run.requests
    assert requests[:2] == [["U:do the task"], ["U:do the task", "use:r1:Read", "res:r1:ok"]]
    assert requests[2] == ["U:do the task", "use:r1:Read", "res:r1:ok", INSTRUCTION]
    assert requests[3] == [SUMMARY, "use:r2:Read", "res:r2:ok"]
    assert len(requests) == 4
    boundary = run.system("compact_boundary")
    assert len(boundary) == 1 and boundary[0]["compact_metadata"]["trigger"] == "auto"
    assert boundary[0]["compact_metadata"]["pre_tokens"] > 0
    # the session file says the same: what a resume, the transcript mirror and the auditor read
    kept = [r for path in run.traces for r in read_records(path) if r.get("type") == "compact_boundary"]
    assert [(r["trigger"], r["pre_tokens"] > 0) for r in kept] == [("auto", True)]
    assert run.result["terminal_reason"] == "completed"
    run.audit_clean()


def test_blocking_limit_when_still_over_after_compaction_failed(cli: Any) -> None:
    limits = ["--limit", "context_window=3000", "--limit", "auto_compact_buffer=1000",
              "--limit", "blocking_buffer=500"]
    run = cli([text("never sent")], *limits, prompt="y" * 20_000)
    assert run.bodies == []
    res = run.result
    assert (res["terminal_reason"], res["subtype"], res["is_error"]) == ("blocking_limit", "success", True)
    assert "blocking limit" in res["result"]
    run.audit_clean()


def test_fallback_model_after_the_primarys_retries_are_exhausted(cli: Any) -> None:
    run = cli([OVERLOADED, OVERLOADED, text("from the fallback")],
              "--fallback-model", "claude-haiku-4-5", "--limit", "api_max_retries=1")
    assert [b["model"] for b in run.bodies] == ["claude-sonnet-4-5", "claude-sonnet-4-5", "claude-haiku-4-5"]
    assert (run.result["terminal_reason"], run.result["result"]) == ("completed", "from the fallback")
    run.audit_clean()


def test_max_budget_usd_from_the_price_table(cli: Any) -> None:
    # 200k input + 10k output tokens on claude-sonnet-4-5: 0.2 * $3 + 0.01 * $15 = $0.75 > $0.5
    usage = {"input_tokens": 200_000, "output_tokens": 10_000}
    run = cli([read("r1", usage=usage), text("never sent")], "--max-budget-usd", "0.5")
    assert len(run.bodies) == 1
    res = run.result
    assert (res["terminal_reason"], res["subtype"], res["is_error"]) == (
        "budget_exhausted", "error_max_budget_usd", True)
    assert res["total_cost_usd"] == pytest.approx(0.75)
    assert res["usage"]["input_tokens"] == 200_000 and res["usage"]["output_tokens"] == 10_000
    assert run.code == 1
    run.audit_clean()


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}


def structured(tid: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "StructuredOutput", "input": value}],
            "stop_reason": "tool_use"}


def test_json_schema_offers_structured_output_and_validates_it(cli: Any) -> None:
    run = cli([text("Paris, roughly two million"),            # no call: structured_output_retry
               structured("s1", {"city": "Paris", "population": "many"}),  # invalid: an error result
               structured("s2", {"city": "Paris", "population": 2_100_000}),
               text("never sent")],
              "--json-schema", json.dumps(SCHEMA))
    tools = {t["name"]: t for t in run.bodies[0]["tools"]}
    assert tools["StructuredOutput"]["input_schema"] == SCHEMA
    assert len(run.bodies) == 3
    assert prompts.STRUCTURED_OUTPUT_RETRY in json.dumps(run.bodies[1]["messages"][-1])
    invalid = run.bodies[2]["messages"][-1]["content"][0]
    assert invalid["tool_use_id"] == "s1" and invalid["is_error"] is True
    res = run.result
    assert res["terminal_reason"] == "completed" and res["is_error"] is False
    assert res["structured_output"] == {"city": "Paris", "population": 2_100_000}
    run.audit_clean()


def test_json_schema_retry_cap(cli: Any) -> None:
    run = cli([text("a"), text("b"), text("c")], "--json-schema", json.dumps(SCHEMA),
              "--limit", "structured_output_retries=2")
    assert len(run.bodies) == 3
    res = run.result
    assert (res["terminal_reason"], res["subtype"], res["is_error"]) == (
        "structured_output_retry_exhausted", "error_max_structured_output_retries", True)
    run.audit_clean()


# --- counter rules, in process ---------------------------------------------------------------------


async def run_session(tmp: Path, responses: Sequence[Any], limits: Limits, *, tools: tuple[str, ...] = ("Read",),
                      **options_kw: Any) -> tuple[Any, ScriptedModel, Session]:
    """One session on the scripted model in a fresh workspace; its session file must audit clean
    (shared by the compaction and loop-slip tests)."""
    ws = populate_workspace(tmp / "ws").resolve()
    model = ScriptedModel(list(responses), ws=ws)
    options = Options(tools=tools, permission_mode="bypassPermissions", cwd=ws, limits=limits,
                      sessions_dir=tmp / "sessions", setting_sources=(), **options_kw)
    session = Session(options, client=model)
    try:
        result = await session.run("go")
    finally:
        await session.aclose()
    assert session.trace_path is not None and audit_file(session.trace_path) == []
    return result, model, session


async def test_recovery_counters_reset_after_a_normal_tool_turn(tmp_path: Path) -> None:
    """max_tokens ×3, a tool turn, max_tokens ×3 again: the recovery count restarted at the tool
    turn, so the default cap of 3 is never passed. The same for the malformed retry and the nudge."""
    mt = text("cut", "max_tokens")
    responses = [mt, mt, mt, read("r1"), mt, mt, mt, MALFORMED, read("r2"), MALFORMED, THINKING, read("r3"),
                 THINKING, text("done")]
    result, model, session = await run_session(tmp_path, responses, Limits())
    assert result.terminal_reason is TerminalReason.COMPLETED and result.result == "done"
    assert model.count == len(responses)
    counters = [snap for _rec, snap in transition_snapshots(read_records(session.trace_path))]
    assert max(c["max_output_tokens_recovery_count"] for c in counters) == 3
    assert max(c["malformed_tool_use_retry_count"] for c in counters) == 1


async def test_max_tokens_cap_is_a_setting(tmp_path: Path) -> None:
    mt = text("cut", "max_tokens")
    result, model, _ = await run_session(tmp_path, [mt, mt, mt], Limits(max_output_tokens_recoveries=1))
    assert result.terminal_reason is TerminalReason.API_ERROR and model.count == 2


async def test_prompt_too_long_is_compacted_once_per_turn(tmp_path: Path) -> None:
    """A second prompt-too-long in the same turn (after a successful reactive compaction) ends the
    loop: the flag is set until a normal next turn."""
    responses = [read("r1"), read("r2"), read("r3"), PTL, text("<summary>SUMMARY</summary>"), PTL, text("never sent")]
    result, model, _ = await run_session(tmp_path, responses, Limits())
    assert result.terminal_reason is TerminalReason.PROMPT_TOO_LONG and model.count == 6


async def test_failed_reactive_compaction_surfaces_prompt_too_long(tmp_path: Path) -> None:
    # the summary request itself is too long
    result, model, _ = await run_session(tmp_path, [read("r1"), read("r2"), PTL, PTL], Limits())
    assert result.terminal_reason is TerminalReason.PROMPT_TOO_LONG and model.count == 4


def _records(path: Path | None, kind: str) -> list[dict[str, Any]]:
    assert path is not None
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]


async def test_a_broken_stream_that_is_retried_is_paid_for_too(tmp_path: Path) -> None:
    """A stream that breaks after it started was billed for its input: the retried request does not
    make the first one free, so the run's usage and cost count both."""
    from agentfsm.runtime.cost import cost_usd
    from agentfsm.testing.scripted import estimate_input_tokens

    broken = {"blocks": [{"type": "text", "text": "cut"}, {"type": "text", "text": "off"}], "break_after": 1}
    result, model, _ = await run_session(tmp_path, [broken, text("whole answer")], Limits())
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 2
    assert result.usage["input_tokens"] == sum(estimate_input_tokens(b) for b in model.bodies)
    assert result.total_cost_usd == pytest.approx(cost_usd("claude-sonnet-4-5", result.usage))


async def test_summary_requests_count_towards_usage_and_cost(tmp_path: Path) -> None:
    """A compaction is a request like any other: its usage is in the result, and so its cost."""
    from agentfsm.runtime.cost import cost_usd
    from agentfsm.testing.scripted import estimate_input_tokens

    responses = [read("r1"), read("r2"), PTL, text("<summary>SUMMARY</summary>"), text("done")]
    result, model, _ = await run_session(tmp_path, responses, Limits())
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 5
    streamed = [b for i, b in enumerate(model.bodies) if i != 2]  # the prompt-too-long answer has no usage
    expected_input = sum(estimate_input_tokens(b) for b in streamed)
    assert result.usage["input_tokens"] == expected_input
    assert result.total_cost_usd == pytest.approx(cost_usd("claude-sonnet-4-5", result.usage))


async def test_invalid_structured_output_calls_count_towards_the_retry_cap(tmp_path: Path) -> None:
    """A StructuredOutput call that fails the schema is a retry like an answer without the call —
    it does not reset the count as a normal tool turn would."""
    bad = [structured(f"s{i}", {"city": "Paris"}) for i in range(4)]  # `population` missing
    result, model, _ = await run_session(tmp_path, [*bad, text("never sent")],
                                         Limits(structured_output_retries=2), json_schema=SCHEMA)
    assert model.count == 3
    assert result.terminal_reason is TerminalReason.STRUCTURED_OUTPUT_RETRY_EXHAUSTED
    assert result.subtype == "error_max_structured_output_retries" and result.is_error
    errors = [m["content"][0] for r in model.bodies[1:] for m in r["messages"][-1:]]
    # Claude Code's schema error text, in ajv's words
    assert all(e["is_error"] and e["content"] == "Output does not match required schema: root: must have required "
               "property 'population'" for e in errors)


async def test_a_json_schema_that_is_not_one_fails_the_turn_setup(tmp_path: Path) -> None:
    result, model, _ = await run_session(tmp_path, [text("never sent")], Limits(),
                                         json_schema={"type": "no-such-type"})
    assert result.terminal_reason is TerminalReason.TURN_SETUP_FAILED and model.count == 0
    assert "JSON schema" in result.errors[0]


async def test_an_object_schema_without_a_type_is_not_wrapped(tmp_path: Path) -> None:
    """A schema that says what an object holds (``properties`` or only ``required``) without
    ``"type": "object"`` is an object schema: the tool's input is the answer itself, not ``{"output": ...}``."""
    for schema in ({"required": ["answer"]}, {"properties": {"answer": {"type": "string"}}}):
        result, model, _ = await run_session(tmp_path, [structured("s1", {"answer": "42"})], Limits(),
                                             json_schema=schema)
        offered = next(t for t in model.requests[0].tools if t["name"] == "StructuredOutput")
        assert offered["input_schema"] == schema
        assert result.terminal_reason is TerminalReason.COMPLETED and result.structured_output == {"answer": "42"}


async def test_array_schemas_are_wrapped_for_the_tool_input(tmp_path: Path) -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    result, model, _ = await run_session(tmp_path, [structured("s1", {"output": ["a", "b"]})], Limits(),
                                         json_schema=schema)
    offered = next(t for t in model.requests[0].tools if t["name"] == "StructuredOutput")
    assert offered["input_schema"]["properties"]["output"] == schema
    assert result.terminal_reason is TerminalReason.COMPLETED and result.structured_output == ["a", "b"]
