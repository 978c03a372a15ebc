"""Auditing Claude Code's own runs: real transcripts and stream-json output (tests/fixtures/claude_code/)
replayed through the declared machine, and hand-tampered copies of them caught at their line."""

from __future__ import annotations

import copy
import json
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.auditing import claude_code
from agentfsm.auditing.audit import MoveAt, NotATrace, Report, audit_report, main, recognise
from agentfsm.machine.graph import EDGES_BY_TRIGGER
from agentfsm.machine.state import LoopState

FIXTURES = Path(__file__).parent / "fixtures" / "claude_code"
SCENARIOS = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").is_file())
SOURCES = {"transcript": ("transcript.jsonl", claude_code.TRANSCRIPT),
           "stream-json": ("stream.jsonl", claude_code.STREAM_JSON)}


def expected(scenario: str, source: str) -> dict[str, Any]:
    return json.loads((FIXTURES / scenario / "expected.json").read_text())[source]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def counted(report: Report, kind: str) -> dict[str, int]:
    return dict(Counter(m.label for m in report.moves if EDGES_BY_TRIGGER[m.label].kind == kind))


def codes(report: Report) -> dict[str, int]:
    return dict(Counter(f.code for f in report.findings))


def test_there_are_fixtures_for_every_reentry_and_the_reasons_claude_code_reaches() -> None:
    reentries, reasons = set(), set()
    for scenario in SCENARIOS:
        exp = expected(scenario, "transcript")
        reentries |= set(exp["reentries"])
        reasons.add(exp["terminal_reason"])
    # Claude Code shows a task notification that arrives after the run ended with a second init and a
    # result of its own; its records are read as the same run going on by the graph's task_notification
    # move (issue 30), as agentfsm's session file records it
    assert reentries == {e for e, edge in EDGES_BY_TRIGGER.items() if edge.kind == "reentry"}
    assert [run["cause"] for run in expected("subagent_background", "transcript")["runs"]] == ["prompt"]
    assert reasons >= {"completed", "api_error", "malformed_tool_use_exhausted", "prompt_too_long", "max_turns",
                       "stop_hook_prevented", "structured_output_retry_exhausted"}


def moved_counters(counters: Mapping[str, Any]) -> dict[str, Any]:
    """The counters a case is about: those away from their initial value (a counter added later
    starts there, so a recorded expectation without it still says what the run did)."""
    initial = LoopState().counters()
    return {k: v for k, v in counters.items() if v != initial.get(k)}


def about_the_case(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run's record with its counters narrowed to those the case moves (:func:`moved_counters`)."""
    return {**run, "counters": moved_counters(run["counters"])} if "counters" in run else dict(run)


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_real_run_replays_to_the_moves_the_scenario_implies(scenario: str, source: str) -> None:
    name, kind = SOURCES[source]
    path = FIXTURES / scenario / name
    exp = expected(scenario, source)
    assert recognise(path) == kind
    report = audit_report(path)
    assert report.source == kind and report.version == "2.1.332"
    assert [m.label for m in report.moves] == exp["moves"]
    assert counted(report, "reentry") == exp["reentries"]
    assert counted(report, "retry") == exp["retries"]
    assert report.terminal_reason == exp["terminal_reason"]
    assert moved_counters(report.counters) == moved_counters(exp["counters"])
    assert codes(report) == exp["findings"], [str(f) for f in report.findings]
    assert report.errors == 0
    # every move is a declared edge, each starting where the previous one of its run ended
    assert all(m.declared for m in report.moves)
    assert [m for run in report.runs for m in run.moves] == list(report.moves)
    for run in report.runs:
        assert run.moves[0].source == "assemble"
        for a, b in zip(run.moves, run.moves[1:], strict=False):
            assert b.source == a.dest
    lines = len((FIXTURES / scenario / name).read_text().splitlines())
    assert all(1 <= m.line <= lines for m in report.moves)


NESTED = [s for s in SCENARIOS if any(k in json.loads((FIXTURES / s / "expected.json").read_text())[src]
                                      for src in SOURCES for k in ("runs", "children", "facts"))]


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("scenario", NESTED)
def test_runs_subagents_and_facts_are_reported_one_by_one(scenario: str, source: str) -> None:
    """Each run of a session (a resumed one, the run a task notification started) and each subagent loop
    (linked to the tool call that started it) has its own path, counters and terminal reason."""
    name, _ = SOURCES[source]
    exp = expected(scenario, source)
    report = audit_report(FIXTURES / scenario / name)
    runs = exp.get("runs", [{"line": report.runs[0].line, "cause": "prompt", "moves": exp["moves"],
                             "terminal_reason": exp["terminal_reason"], "counters": exp["counters"]}])
    assert [about_the_case(r.to_json()) for r in report.runs] == [about_the_case(r) for r in runs]
    assert [(c.link, [m.label for m in c.moves], c.terminal_reason, moved_counters(c.counters), codes(c))
            for c in report.children] == [(c["link"], c["moves"], c["terminal_reason"], moved_counters(c["counters"]),
                                           c["findings"]) for c in exp.get("children", [])]
    assert [kind for _, kind, _ in report.facts] == exp.get("facts", [])
    assert report.errors == 0


def test_each_client_process_of_a_resumed_session_has_its_stream_json() -> None:
    exp = expected("resumed", "stream-json-2")
    report = audit_report(FIXTURES / "resumed" / "stream2.jsonl")
    assert [m.label for m in report.moves] == exp["moves"] and report.terminal_reason == exp["terminal_reason"]
    assert moved_counters(report.counters) == moved_counters(exp["counters"])
    assert report.errors == 0 and codes(report) == {}


# --- tampered copies ------------------------------------------------------------------------------


def _index(recs: list[dict[str, Any]], pred: Any, nth: int = 0) -> int:
    return [i for i, r in enumerate(recs) if pred(r)][nth]


def _is_error_message(r: dict[str, Any]) -> bool:
    return bool(r.get("isApiErrorMessage") or r.get("is_api_error_message"))


def _is_tool_result(r: dict[str, Any]) -> bool:
    content = (r.get("message") or {}).get("content")
    return r.get("type") == "user" and isinstance(content, list) and \
        any(b.get("type") == "tool_result" for b in content)


def test_a_fourth_max_tokens_recovery_in_a_transcript_is_flagged_at_its_line(tmp_path: Path) -> None:
    recs = records(FIXTURES / "max_tokens_exhaust" / "transcript.jsonl")
    at = _index(recs, _is_error_message)  # the client gave up here; the tampered copy resumes a fourth time
    resume = copy.deepcopy(next(r for r in recs if r.get("isMeta")))
    request = copy.deepcopy([r for r in recs if r["type"] == "api-request"][-1])
    answer = copy.deepcopy(recs[at - 1])
    resume["uuid"], request["id"] = "tampered-resume", "tampered-request"
    answer["message"].update(id="msg_tampered", stop_reason="end_turn", content=[{"type": "text", "text": "DONE"}])
    answer.update(uuid="tampered-answer", requestRef="tampered-request")
    path = write(tmp_path / "t.jsonl", [*recs[:at], resume, request, answer, *recs[at + 1:]])
    report = audit_report(path)
    line = at + 1
    found = {(f.code, f.line) for f in report.findings if f.is_error}
    assert found == {("replay_mismatch", line), ("counter_over_cap", line)}
    assert counted(report, "reentry") == {"max_output_tokens_recovery": 4}
    assert "max_output_tokens_recovery_count=4 exceeds its cap max_output_tokens_recoveries=3" in \
        next(f.message for f in report.findings if f.code == "counter_over_cap")
    assert main([str(path)]) == 1


def test_a_fourth_max_tokens_recovery_in_stream_json_is_flagged_at_its_line(tmp_path: Path) -> None:
    recs = records(FIXTURES / "max_tokens_exhaust" / "stream.jsonl")
    at = _index(recs, _is_error_message)
    resume = copy.deepcopy(next(r for r in recs if r.get("isSynthetic")))
    answer = copy.deepcopy(next(r for r in recs if r["type"] == "assistant"))
    answer["message"].update(id="msg_tampered", content=[{"type": "text", "text": "DONE"}])
    resume["uuid"], answer["uuid"] = "tampered-resume", "tampered-answer"  # a copy would be a duplicate
    result = copy.deepcopy(recs[-1])
    result.update(terminal_reason="completed", is_error=False, stop_reason="end_turn")
    path = write(tmp_path / "s.jsonl", [*recs[:at], resume, answer, *recs[at + 1:-1], result])
    report = audit_report(path)
    assert {(f.code, f.line) for f in report.findings if f.is_error} == \
        {("replay_mismatch", at + 1), ("counter_over_cap", at + 1)}
    assert report.terminal_reason == "completed"


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_removed_tool_result_is_flagged_at_its_tool_use(tmp_path: Path, source: str) -> None:
    name, _ = SOURCES[source]
    recs = records(FIXTURES / "parallel_reads" / name)
    gone = _index(recs, _is_tool_result, nth=1)
    use_id = recs[gone]["message"]["content"][0]["tool_use_id"]
    tool_use_line = 1 + _index(recs, lambda r: r.get("type") == "assistant" and any(
        b.get("id") == use_id for b in r["message"]["content"]))
    path = write(tmp_path / name, recs[:gone] + recs[gone + 1:])
    report = audit_report(path)
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [("unpaired_tool_use", tool_use_line)]
    assert use_id in errors[0].message
    # the path is still the one the client took
    assert [m.label for m in report.moves] == expected("parallel_reads", source)["moves"]


def test_a_duplicated_tool_result_and_an_orphan_are_flagged(tmp_path: Path) -> None:
    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    at = _index(recs, _is_tool_result)
    second = copy.deepcopy(recs[at])
    second["uuid"] = "second-result"  # written again as a new record: a second result for one call
    orphan = copy.deepcopy(recs[at])
    orphan["uuid"] = "orphan-result"
    orphan["message"]["content"][0]["tool_use_id"] = "toolu_nobody"
    path = write(tmp_path / "t.jsonl", [*recs[:at + 1], second, orphan, *recs[at + 1:]])
    report = audit_report(path)
    assert {(f.code, f.line) for f in report.findings if f.is_error} == \
        {("duplicate_tool_result", at + 2), ("orphan_tool_result", at + 3)}


def test_a_result_that_disagrees_with_the_path_is_flagged(tmp_path: Path) -> None:
    recs = records(FIXTURES / "max_turns_1" / "stream.jsonl")
    recs[-1]["terminal_reason"] = "completed"
    report = audit_report(write(tmp_path / "s.jsonl", recs))
    assert [(f.code, f.line) for f in report.findings if f.is_error] == [("result_mismatch", len(recs))]


def test_a_stop_hook_re_entry_past_the_cap_is_flagged(tmp_path: Path) -> None:
    recs = records(FIXTURES / "stop_hook_always" / "transcript.jsonl")
    # the client honoured its cap here; make it re-enter a ninth time instead
    at = _index(recs, lambda r: r.get("subtype") == "informational")
    request = copy.deepcopy([r for r in recs if r["type"] == "api-request"][-1])
    answer = copy.deepcopy([r for r in recs if r["type"] == "assistant"][-1])
    answer["message"]["id"], answer["uuid"] = "msg_tampered", "tampered-answer"
    path = write(tmp_path / "t.jsonl", [*recs[:at], request, answer, *recs[at + 1:]])
    report = audit_report(path)
    feedback = 1 + max(i for i, r in enumerate(recs[:at]) if r.get("isMeta"))  # the ninth block's message
    assert {(f.code, f.line) for f in report.findings if f.is_error} == {("replay_mismatch", feedback),
                                                                           ("counter_over_cap", feedback)}
    assert any(f.code == "counter_over_cap" and "stop_hook_blocking_count=9" in f.message for f in report.findings)


def test_a_blocking_stop_hooks_context_rides_with_its_feedback(tmp_path: Path) -> None:
    """A summary that blocks and carries additionalContext is one re-entry (the context is shown in the
    same message as the feedback), not a second move."""
    recs = records(FIXTURES / "stop_hook_once" / "transcript.jsonl")
    i = _index(recs, lambda r: r.get("subtype") == "stop_hook_summary")
    recs[i]["hookAdditionalContext"] = ["ALSO_THIS"]
    report = audit_report(write(tmp_path / "t.jsonl", recs))
    assert [m.label for m in report.moves] == expected("stop_hook_once", "transcript")["moves"]
    assert report.errors == 0 and codes(report) == {}


def test_a_stop_hooks_context_with_continue_false_settles(tmp_path: Path) -> None:
    recs = records(FIXTURES / "stop_hook_prevent" / "transcript.jsonl")
    i = _index(recs, lambda r: r.get("subtype") == "stop_hook_summary")
    recs[i]["hookAdditionalContext"] = ["NOT_SHOWN"]
    report = audit_report(write(tmp_path / "t.jsonl", recs))
    assert [m.label for m in report.moves] == expected("stop_hook_prevent", "transcript")["moves"]
    assert report.terminal_reason == "stop_hook_prevented" and report.errors == 0


def test_an_interrupt_is_an_abort(tmp_path: Path) -> None:
    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    at = _index(recs, _is_tool_result)
    result = copy.deepcopy(recs[at])
    result["message"]["content"][0].update(content="[Request interrupted by user for tool use]", is_error=True)
    interrupt = {**copy.deepcopy(recs[at]), "uuid": "interrupt",
                 "message": {"role": "user", "content": [{"type": "text",
                                                          "text": "[Request interrupted by user for tool use]"}]}}
    interrupt.pop("toolUseResult", None)
    report = audit_report(write(tmp_path / "t.jsonl", [*recs[:at], result, interrupt]))
    assert [m.label for m in report.moves] == ["call", "open_stream", "dispatch", "abort"]
    assert report.moves[-1].line == at + 2 and report.terminal_reason == "aborted_tools"
    assert report.errors == 0


def test_records_it_cannot_interpret_are_reported_by_line(tmp_path: Path) -> None:
    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    recs.insert(5, {"type": "brand-new-record", "sessionId": "x"})
    recs.insert(6, {"type": "system", "subtype": "something_new", "sessionId": "x", "uuid": "u"})
    report = audit_report(write(tmp_path / "t.jsonl", recs))
    assert {(f.code, f.line, f.severity) for f in report.findings} == {
        ("unknown_record", 6, "warning"), ("unknown_record", 7, "warning")}
    assert report.terminal_reason == "completed"


def test_a_cut_off_transcript_is_an_incomplete_run(tmp_path: Path) -> None:
    recs = records(FIXTURES / "three_turns" / "transcript.jsonl")
    cut = _index(recs, lambda r: r["type"] == "api-request", nth=2)
    report = audit_report(write(tmp_path / "t.jsonl", recs[:cut]))
    assert [f.code for f in report.findings] == ["incomplete_run"]
    assert report.terminal_reason is None


# --- the CLI ----------------------------------------------------------------------------------------


def test_json_output_is_one_object_per_input(capsys: pytest.CaptureFixture[str]) -> None:
    paths = [FIXTURES / "max_tokens_exhaust" / "transcript.jsonl", FIXTURES / "stop_hook_once" / "stream.jsonl"]
    assert main(["--json", *map(str, paths)]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [d["source"] for d in docs] == ["claude-code-transcript", "claude-code-stream-json"]
    first = docs[0]
    assert {"source", "moves", "terminal_reason", "counters", "errors", "warnings", "findings"} <= set(first)
    assert first["terminal_reason"] == "api_error" and first["errors"] == 0
    assert first["moves"][0] == {"from": "assemble", "to": "call_model", "label": "call", "line": 13}
    assert first["moves"][-1]["label"] == "recovery_exhausted"
    assert first["counters"]["max_output_tokens_recovery_count"] == 3


def test_text_output_says_what_it_read(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "stop_hook_once" / "transcript.jsonl"
    assert main([str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (f"{path}: Claude Code transcript 2.1.332, 8 moves; re-entries: stop_hook_blocking ×1; "
                       "ended completed (settle); ok")
    assert out[-2] == (f"{path}: path: call → open_stream → end_turn → stop_hook_blocking → call → open_stream → "
                       "end_turn → settle")


def test_divergences_are_warnings_and_do_not_fail(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "api_error_400_repeated" / "transcript.jsonl"
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning [cc_unmodelled_retry]" in out and "2 warnings" in out


def test_codes_lists_the_claude_code_findings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--codes"]) == 0
    out = capsys.readouterr().out
    for code in ("cc_mid_stream_resume", "unknown_record", "read_as_stream_retry", "out_of_place"):
        assert code in out


def test_coverage_counts_claude_code_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--coverage", "--json", str(FIXTURES / "stop_hook_always")]) == 0
    doc = json.loads(capsys.readouterr().out)
    edges = {(e["trigger"], e["from"]): e["count"] for e in doc["edges"]}
    assert edges[("stop_hook_blocking", "stop")] == 16  # eight in the transcript, eight in the stream


@pytest.mark.parametrize("content", [
    b'{"type": "user", "sessionId": "x"}\n',  # no message, no uuid: not a transcript record
    b'{"type": "assistant", "message": {"content": []}}\n',
    b'{"session_id": "x", "type": "system", "subtype": "other"}\n',
])
def test_other_jsonl_is_still_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    with pytest.raises(NotATrace):
        recognise(path)
    assert main([str(path)]) == 2


# --- robustness: any damage is reported, nothing crashes ----------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=st.sampled_from(SCENARIOS), source=st.sampled_from(sorted(SOURCES)), data=st.data())
def test_dropping_or_cutting_records_never_crashes(tmp_path: Path, scenario: str, source: str,
                                                   data: st.DataObject) -> None:
    name, _ = SOURCES[source]
    lines = (FIXTURES / scenario / name).read_text(encoding="utf-8").splitlines(keepends=True)
    keep = data.draw(st.integers(2, len(lines)), label="keep")
    drop = data.draw(st.integers(0, keep - 1), label="drop")
    damaged = lines[:drop] + lines[drop + 1:keep]
    path = tmp_path / name
    path.write_text("".join(damaged), encoding="utf-8")
    try:
        report = audit_report(path)
    except NotATrace:
        return  # what is left no longer reads as Claude Code output (e.g. only bookkeeping records)
    assert all(1 <= f.line <= len(damaged) for f in report.findings)
    assert all(m.source and m.dest for m in report.moves)
    if damaged == lines:
        assert report.errors == 0


# --- the path drawn over the graph ------------------------------------------------------------------


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_diagram_trace_draws_a_claude_code_run(tmp_path: Path, source: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from agentfsm import diagram

    name, _ = SOURCES[source]
    path = FIXTURES / "max_tokens_exhaust" / name
    assert diagram.main(["--trace", str(path)]) == 0
    mmd = capsys.readouterr().out
    assert "max_output_tokens_recovery ×3 · " in mmd and "recovery_exhausted ×1 · " in mmd and "call ×4 · " in mmd
    assert "ended api_error" in mmd and "UNDECLARED" not in mmd
    out = tmp_path / "run.dot"
    assert diagram.main(["--trace", str(path), "--output", str(out)]) == 0
    assert "<b>max_output_tokens_recovery ×3 · " in out.read_text()


def test_diagram_trace_shows_a_tampered_move_as_undeclared(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from agentfsm import diagram

    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    meta = {"type": "user", "isMeta": True, "uuid": "m", "sessionId": "s",
            "message": {"role": "user", "content": "[Your previous response had no visible output. Please "
                                                   "continue and produce a user-visible response.]"}}
    at = _index(recs, _is_tool_result)
    path = write(tmp_path / "t.jsonl", [*recs[:at + 1], meta, *recs[at + 1:]])
    report = audit_report(path)
    # a nudge while the tools were dispatched: the client went dispatch_tools → assemble, no edge does
    assert [(f.code, f.line) for f in report.findings if f.is_error] == [("undeclared_move", at + 2)]
    assert [m for m in report.moves if not m.declared] == [
        MoveAt("thinking_only_nudge", "dispatch_tools", "assemble", at + 2, declared=False)]
    assert diagram.main(["--trace", str(path)]) == 0
    assert 'dispatch_tools ==>|"thinking_only_nudge ×1 UNDECLARED · 4"| assemble' in capsys.readouterr().out


def test_the_readme_picture_of_a_claude_code_run_is_current() -> None:
    from agentfsm import diagram
    from agentfsm.diagram import dot as dot_views

    root = Path(__file__).parent.parent
    png = root / "docs" / "claude_code_run.png"
    rel = Path("tests/fixtures/claude_code/ptl_after_tools/transcript.jsonl")
    path = diagram.trace_path(root / rel)
    dot = dot_views.render_overview(path, header=path.title())
    assert diagram.stamp_of(png.read_bytes()) == diagram.dot_digest(dot), (
        f"docs/claude_code_run.png is stale: agentfsm diagram --trace {rel} --output docs/claude_code_run.png")


# --- tampering: each kind caught, at its line, and said for what it is ------------------------------


def _is_block_of(use_id: str) -> Any:
    return lambda r: r.get("type") == "assistant" and any(b.get("id") == use_id for b in r["message"]["content"])


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("scenario", ["read_probe", "interleaved_tool_results", "subagent_background"])
def test_an_exactly_duplicated_line_is_a_duplicate_record(tmp_path: Path, scenario: str, source: str) -> None:
    name, _ = SOURCES[source]
    lines = (FIXTURES / scenario / name).read_text(encoding="utf-8").splitlines(keepends=True)
    for at in [i for i, line in enumerate(lines) if json.loads(line).get("type") == "assistant"]:
        path = tmp_path / name
        path.write_text("".join([*lines[:at + 1], lines[at], *lines[at + 1:]]), encoding="utf-8")
        report = audit_report(path)
        found = [f for r in (report, *report.children) for f in r.findings]  # a subagent's line: its child's
        assert [(f.code, f.line) for f in found if f.is_error] == [("duplicate_record", at + 2)]
        assert f"line {at + 1}" in next(f.message for f in found if f.code == "duplicate_record")
        # the copy is not read again: the path is the client's
        assert [m.label for m in report.moves] == expected(scenario, source)["moves"]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_block_written_again_under_a_new_uuid_is_a_duplicate_record(tmp_path: Path, source: str) -> None:
    name, _ = SOURCES[source]
    recs = records(FIXTURES / "parallel_reads" / name)
    at = _index(recs, _is_block_of("toolu_b"))
    copy_of = {**copy.deepcopy(recs[at]), "uuid": "a-new-uuid"}
    report = audit_report(write(tmp_path / name, [*recs[:at + 1], copy_of, *recs[at + 1:]]))
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [("duplicate_record", at + 2)]
    assert "same message id and content" in errors[0].message


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_deleted_tool_use_block_leaves_its_result_an_orphan(tmp_path: Path, source: str) -> None:
    name, _ = SOURCES[source]
    recs = records(FIXTURES / "parallel_reads" / name)
    gone = _index(recs, _is_block_of("toolu_b"))
    result_line = 1 + _index(recs, lambda r: _is_tool_result(r) and r["message"]["content"][0]["tool_use_id"]
                             == "toolu_b") - 1  # one line less after the deletion
    report = audit_report(write(tmp_path / name, recs[:gone] + recs[gone + 1:]))
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [("orphan_tool_result", result_line)]
    assert "'toolu_b'" in errors[0].message


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_result_moved_before_its_call_is_caught(tmp_path: Path, source: str) -> None:
    """In the interleaved run a result may lie between the blocks of its message, but never before
    the block of its own call (a tool starts at its block's stop)."""
    name, _ = SOURCES[source]
    recs = records(FIXTURES / "interleaved_tool_results" / name)
    use_b = _index(recs, _is_block_of("toolu_b"))
    result_b = _index(recs, lambda r: _is_tool_result(r) and r["message"]["content"][0]["tool_use_id"] == "toolu_b")
    moved = [*recs[:use_b], recs[result_b], *[r for i, r in enumerate(recs[use_b:], use_b) if i != result_b]]
    report = audit_report(write(tmp_path / name, moved))
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [("orphan_tool_result", use_b + 1)]
    assert "before its tool_use" in errors[0].message


def test_interleaved_results_are_one_message_and_one_turn() -> None:
    """The run that split into two turns before: the results lie between the blocks of one message."""
    for source in SOURCES:
        name, _ = SOURCES[source]
        report = audit_report(FIXTURES / "interleaved_tool_results" / name)
        assert [m.label for m in report.moves].count("next_turn") == 1
        assert report.counters["turn_count"] == 2 and report.errors == 0


def test_a_stream_json_output_cut_before_its_result_is_an_incomplete_run(tmp_path: Path) -> None:
    lines = (FIXTURES / "read_probe" / "stream.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path / "s.jsonl"
    path.write_text("".join(lines[:-1]), encoding="utf-8")
    report = audit_report(path)
    assert [(f.code, f.line) for f in report.findings] == [("incomplete_run", 1)]
    assert "no result line" in report.findings[0].message
    path.write_text("".join(lines)[:-40], encoding="utf-8")  # torn inside the result line
    report = audit_report(path)
    assert {(f.code, f.line) for f in report.findings} == {("incomplete_run", 1), ("torn_last_line", len(lines))}


def test_a_tool_calling_message_said_to_end_the_turn_is_a_stop_reason_mismatch(tmp_path: Path) -> None:
    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    for r in recs:
        if r.get("type") == "assistant" and r["message"].get("stop_reason") == "tool_use":
            r["message"]["stop_reason"] = "end_turn"
    first = 1 + _index(recs, lambda r: r.get("type") == "assistant")
    report = audit_report(write(tmp_path / "t.jsonl", recs))
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [("stop_reason_mismatch", first)]
    assert "'end_turn'" in errors[0].message


def test_an_answer_said_to_hit_max_tokens_that_ended_the_turn_is_a_replay_mismatch(tmp_path: Path) -> None:
    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    at = _index(recs, lambda r: r.get("type") == "assistant" and r["message"].get("stop_reason") == "end_turn")
    recs[at]["message"]["stop_reason"] = "max_tokens"
    report = audit_report(write(tmp_path / "t.jsonl", recs))
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [("replay_mismatch", at + 1)]
    assert "took 'end_turn'" in errors[0].message and "'max_output_tokens_recovery'" in errors[0].message


@pytest.mark.parametrize(("field", "value", "code", "says"), [
    ("stop_reason", "max_tokens", "replay_mismatch", "'max_output_tokens_recovery'"),
    ("terminal_reason", "aborted_tools", "result_mismatch", "the result says terminal_reason 'aborted_tools'; the "
                                                            "replayed path ends with 'completed'"),
])
def test_a_falsified_stream_json_result_is_flagged_at_the_result_line(tmp_path: Path, field: str, value: str,
                                                                      code: str, says: str) -> None:
    recs = records(FIXTURES / "read_probe" / "stream.jsonl")
    recs[-1][field] = value
    report = audit_report(write(tmp_path / "s.jsonl", recs))
    errors = [f for f in report.findings if f.is_error]
    assert [(f.code, f.line) for f in errors] == [(code, len(recs))]
    assert says in errors[0].message


# --- directories and damaged files --------------------------------------------------------------------


def test_a_directory_with_a_bad_file_reports_every_good_one(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    good = ["read_probe", "subagent_foreground", "resumed"]
    for scenario in good:
        shutil.copytree(FIXTURES / scenario, tmp_path / scenario)
    (tmp_path / "resumed" / "empty.jsonl").write_text("")  # what a bad --settings leaves behind
    (tmp_path / "read_probe" / "other.jsonl").write_text('{"hello": 1}\n')
    assert main(["--json", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    docs = {Path(d["path"]).relative_to(tmp_path).as_posix(): d for d in map(json.loads, out.splitlines())}
    traces = {f"{s}/{n}" for s in good for n in ("transcript.jsonl", "stream.jsonl")} | {"resumed/stream2.jsonl"}
    assert set(docs) == traces | {"resumed/empty.jsonl", "read_probe/other.jsonl"}  # subagent files: children
    assert all(docs[t]["errors"] == 0 and docs[t]["terminal_reason"] == "completed" for t in traces)
    for bad in ("resumed/empty.jsonl", "read_probe/other.jsonl"):
        assert docs[bad]["source"] is None and [f["code"] for f in docs[bad]["findings"]] == ["not_a_trace"]
    assert len(err.splitlines()) == 2
    assert [c["link"] for c in docs["subagent_foreground/transcript.jsonl"]["children"]] == ["toolu_agent"]
    # the text output and --coverage too
    assert main([str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert all(f"{tmp_path / t}: Claude Code" in out for t in traces)
    assert main(["--coverage", "--json", str(tmp_path)]) == 2
    assert json.loads(capsys.readouterr().out)["traces"] == len(traces)


def test_a_nul_byte_damages_one_line_not_the_file(tmp_path: Path) -> None:
    lines = (FIXTURES / "read_probe" / "transcript.jsonl").read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"type":"attachment"' in line)
    lines[at] = lines[at][:40] + b"\x00" + lines[at][40:]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(lines))
    report = audit_report(path)
    assert [(f.code, f.line) for f in report.findings] == [("unreadable_line", at + 1)]
    assert [m.label for m in report.moves] == expected("read_probe", "transcript")["moves"]


def test_unknown_record_types_are_reported_once_per_type_with_a_count(tmp_path: Path) -> None:
    recs = records(FIXTURES / "read_probe" / "transcript.jsonl")
    for at in (4, 8, 12):
        recs.insert(at, {"type": "brand-new-record", "sessionId": "x"})
    report = audit_report(write(tmp_path / "t.jsonl", recs))
    assert [(f.code, f.line) for f in report.findings] == [("unknown_record", 5)]
    assert "3 records, lines 5, 9, 13" in report.findings[0].message


def test_the_record_table_in_the_docs_is_the_auditors() -> None:
    """docs/claude_code_records.md lists every record type of fsm/auditing/claude_code/records.py with its role,
    and no other."""
    from agentfsm.auditing.claude_code import records as tables

    doc = (Path(__file__).parent.parent / "docs" / "claude_code_records.md").read_text(encoding="utf-8")
    sections = doc.split("\n### ")[1:]
    named = {"Transcript records": tables.TRANSCRIPT_TYPES, "Transcript `system`": tables.TRANSCRIPT_SYSTEM,
             "Transcript `attachment`": tables.ATTACHMENTS, "stream-json lines": tables.STREAM_TYPES,
             "stream-json `system`": tables.STREAM_SYSTEM}
    assert len(sections) == len(named)
    for title, table in named.items():
        (section,) = [s for s in sections if s.startswith(title)]
        rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
        assert {row[0].strip("| `"): row[1] for row in rows} == {k: role for k, (role, _) in table.items()}, title


def test_every_record_type_of_the_recorded_runs_is_known() -> None:
    """No record of any recorded Claude Code run is unknown to the tables."""
    from agentfsm.auditing.claude_code import records as tables

    for path in FIXTURES.rglob("*.jsonl"):
        stream = path.name.startswith("stream")
        for rec in records(path):
            kind = rec.get("type")
            if stream:
                assert tables.role_of(tables.STREAM_TYPES, kind), (path, kind)
                if kind == "system":
                    assert tables.role_of(tables.STREAM_SYSTEM, rec.get("subtype")), (path, rec.get("subtype"))
            else:
                assert tables.role_of(tables.TRANSCRIPT_TYPES, kind), (path, kind)
                if kind == "system":
                    assert tables.role_of(tables.TRANSCRIPT_SYSTEM, rec.get("subtype")), (path, rec.get("subtype"))
                if kind == "attachment":
                    assert tables.role_of(tables.ATTACHMENTS, rec["attachment"].get("type")), (path, rec["attachment"])


ALL_INPUTS = sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("*/*.jsonl"))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fixture=st.sampled_from(ALL_INPUTS), data=st.data())
def test_any_damage_is_reported_within_the_file(tmp_path: Path, fixture: str, data: st.DataObject) -> None:
    """A line copied, a byte cut off the end, a NUL written anywhere: nothing crashes, every finding and
    move points at a line of the file, and the file is read, not refused."""
    body = (FIXTURES / fixture).read_bytes()
    lines = body.splitlines(keepends=True)
    how = data.draw(st.sampled_from(["copy", "cut", "nul"]), label="how")
    if how == "copy":
        at = data.draw(st.integers(0, len(lines) - 1), label="line")
        body = b"".join([*lines[:at + 1], lines[at], *lines[at + 1:]])
    elif how == "cut":
        body = body[:data.draw(st.integers(len(lines[0]) + 1, len(body) - 1), label="bytes")]
    else:
        at = data.draw(st.integers(0, len(body) - 1), label="byte")
        body = body[:at] + b"\x00" + body[at:]
    path = tmp_path / Path(fixture).name
    path.write_bytes(body)
    try:
        report = audit_report(path)
    except NotATrace:
        # refused only when no message, system or result record is left whole (e.g. cut to its queue records)
        left = []
        for raw in body.splitlines():
            try:
                left.append(json.loads(raw).get("type"))
            except ValueError:
                continue
        assert how != "copy" and not {"user", "assistant", "system", "result"} & set(left), left
        return
    n = len(body.splitlines())
    for r in (report, *report.children):
        assert all(1 <= f.line <= n for f in r.findings), [str(f) for f in r.findings]
        assert all(1 <= m.line <= n for m in r.moves)
    if how == "copy" and json.loads(lines[at]).get("uuid"):
        assert any(f.code == "duplicate_record" for r in (report, *report.children) for f in r.findings)


@pytest.mark.parametrize("fixture", ALL_INPUTS)
def test_a_damaged_first_message_does_not_hide_the_kind(tmp_path: Path, fixture: str) -> None:
    """Every message line before the first answer damaged (a NUL byte in it): the file is still
    recognised by the records after, however far into the file they lie (Claude Code writes a prompt
    snapshot of some 30 KiB before its first request; found by the generated damage test, which once
    read only a 64 KiB prefix)."""
    lines = (FIXTURES / fixture).read_bytes().splitlines(keepends=True)
    kinds = [json.loads(raw).get("type") for raw in lines]
    first_answer = next((i for i, k in enumerate(kinds) if k == "assistant"), None)
    if first_answer is None:
        pytest.skip(f"{fixture}: no assistant record")
    damaged = [b"\x00" + raw if kinds[i] in ("user", "system") and i < first_answer else raw
               for i, raw in enumerate(lines)]
    path = tmp_path / Path(fixture).name
    path.write_bytes(b"".join(damaged))
    assert recognise(path) == recognise(FIXTURES / fixture)


def test_sidechain_records_in_the_session_file_are_a_child_run(tmp_path: Path) -> None:
    """Where a client writes a subagent's records into the session's own file (isSidechain), they are
    read as the child run they are, linked through the tool result's agentId."""
    main_recs = records(FIXTURES / "subagent_foreground" / "transcript.jsonl")
    (sub,) = (FIXTURES / "subagent_foreground" / "transcript" / "subagents").glob("agent-*.jsonl")
    at = _index(main_recs, _is_tool_result)
    path = write(tmp_path / "t.jsonl", [*main_recs[:at], *records(sub), *main_recs[at:]])
    report = audit_report(path)
    assert [m.label for m in report.moves] == expected("subagent_foreground", "transcript")["moves"]
    (child,) = report.children
    assert child.link == "toolu_agent" and child.terminal_reason == "completed"
    assert [m.label for m in child.moves] == expected("subagent_foreground", "transcript")["children"][0]["moves"]
    assert report.errors == 0 and all(at < m.line <= at + len(records(sub)) for m in child.moves)


def test_a_second_init_is_the_task_notification_move_even_without_result_indexes(tmp_path: Path) -> None:
    """The pass a task notification starts opens with its own init line: read as the graph's
    task_notification move of the same run, not as a Stop hook's re-entry, also where the results do
    not say which pass they close."""
    recs = records(FIXTURES / "subagent_background" / "stream.jsonl")
    for r in recs:
        r.pop("result_index", None)
    report = audit_report(write(tmp_path / "s.jsonl", recs))
    runs = expected("subagent_background", "stream-json")["runs"]
    assert [[m.label for m in r.moves] for r in report.runs] == [r["moves"] for r in runs]
    assert [m.label for m in report.moves].count("task_notification") == 1
    assert report.errors == 0 and "stop_hook_blocking" not in [m.label for m in report.moves]
