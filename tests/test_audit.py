"""The trace auditor against genuine traces and hand-tampered copies of them.

Traces are written by :class:`agentfsm.runtime.trace.TraceWriter` while :class:`Sim` walks the real
:class:`agentfsm.machine.graph.LoopMachine` (so :func:`agentfsm.machine.graph.decide` picks every edge, exactly as in
the
driver) and records each request through the driver's own wire normalisation.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.auditing import claude_code
from agentfsm.auditing.audit import (
    CODES,
    RAISED_BY,
    WARNING_CODES,
    Finding,
    Move,
    MoveAt,
    NotATrace,
    Report,
    _Auditor,
    audit,
    audit_file,
    audit_report,
    check_request,
    coverage,
    declared_moves,
    main,
    recognise,
    summary_line,
)
from agentfsm.machine import graph
from agentfsm.machine.events import (
    Aborted,
    Assembled,
    CallFailed,
    Compaction,
    Event,
    ModelError,
    ModelResponse,
    Refused,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    ToolsDrained,
)
from agentfsm.machine.graph import LoopMachine, may_reactive_compact
from agentfsm.machine.state import TERMINAL_INFO, Limits, LoopState, Message, Phase, TerminalReason
from agentfsm.runtime.trace import TraceWriter, transition_snapshots

Trace = tuple[Path, list[dict[str, Any]]]  # a session file and its records
SESSION = "0b9c1d7e-0000-4000-8000-000000000001"
MODEL = "claude-test"


# --- a scripted walk of the real machine ----------------------------------------------------------


def text(t: str = "done", stop: str = "end_turn") -> ModelResponse:
    return ModelResponse(blocks=({"type": "text", "text": t},), stop_reason=stop)


def tool_call(*ids: str) -> ModelResponse:
    blocks = tuple({"type": "tool_use", "id": i, "name": "Read", "input": {"file_path": "/a"}} for i in ids)
    return ModelResponse(blocks=blocks, stop_reason="tool_use")


THINKING_ONLY = ModelResponse(blocks=({"type": "thinking", "thinking": "hm", "signature": "s"},),
                              stop_reason="end_turn")
MALFORMED = ModelResponse(blocks=(), stop_reason="tool_use", incomplete_tool_uses=1)


def results_for(resp: ModelResponse) -> Message:
    return Message("user", tuple({"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                                 for b in resp.tool_uses()), kind="tool_results")


class Sim:
    """One session file written while the real machine runs; each method is one thing the driver
    does (a move, a request, the result)."""

    def __init__(self, path: Path, limits: Limits | None = None, prompt: str = "go") -> None:
        limits = limits or Limits()
        self.limits = limits
        self.trace = TraceWriter(path)
        self.trace.session(SESSION, limits, "/work", MODEL)
        self.machine = LoopMachine(LoopState())
        self.prompt(prompt)

    def prompt(self, text_: str) -> None:
        """A new run of the loop on the same history (the driver's ``run``)."""
        first = Message("user", text_, kind="prompt")
        self.trace.message(first)
        self.machine = LoopMachine(LoopState(messages=(*self.machine.state.messages, first)))

    @property
    def state(self) -> LoopState:
        return self.machine.state

    def feed(self, event: Event) -> str:
        """Fire ``event``; the trigger of the last move it caused."""
        before = self.machine.state
        for step in self.machine.fire(event, self.limits):
            self.trace.on_step(before, step, event)
            before = step.state
        return step.trigger

    def request(self) -> None:
        self.trace.request(MODEL, self.state.query_tracking.depth, self.state.messages)

    def call(self) -> None:
        self.feed(Assembled())
        self.request()

    def respond(self, resp: ModelResponse) -> str:
        self.call()
        self.feed(StreamOpened())
        return self.feed(StreamEnded(resp))

    def tools(self, resp: ModelResponse, **flags: Any) -> str:
        return self.feed(ToolsDrained(resp.as_message(), results_for(resp), **flags))

    def finish(self) -> None:
        if graph.stop_hooks_are_due(self.state):
            self.feed(StopHookVerdict())
        reason = self.state.terminal_reason
        assert reason is not None
        info = TERMINAL_INFO[reason]
        self.trace.result({"type": "result", "subtype": info.subtype, "is_error": info.is_error,
                           "terminal_reason": reason.value, "num_turns": self.state.turn_count,
                           "session_id": SESSION})

    def close(self) -> None:
        self.trace.close()


def _completed(sim: Sim) -> None:
    assert sim.respond(text()) == "end_turn"


def _tool_turn(sim: Sim) -> None:
    assert sim.respond(tool_call("toolu_1", "toolu_2")) == "dispatch"
    assert sim.tools(tool_call("toolu_1", "toolu_2")) == "next_turn"
    assert sim.respond(text()) == "end_turn"


def _max_turns(sim: Sim) -> None:
    sim.respond(tool_call("toolu_1"))
    assert sim.tools(tool_call("toolu_1")) == "finish_batch"


def _max_tokens(sim: Sim) -> None:
    assert sim.respond(text("cut", "max_tokens")) == "max_output_tokens_recovery"
    assert sim.respond(text("cut again", "max_tokens")) == "max_output_tokens_recovery"
    sim.respond(text())


def _max_tokens_exhausted(sim: Sim) -> None:
    sim.respond(text("cut", "max_tokens"))
    assert sim.respond(text("cut", "max_tokens")) == "recovery_exhausted"


def _malformed(sim: Sim) -> None:
    # two retries by default, as Claude Code 2.1.332
    assert sim.respond(MALFORMED) == "malformed_tool_use_retry"
    assert sim.respond(MALFORMED) == "malformed_tool_use_retry"
    assert sim.respond(MALFORMED) == "recovery_exhausted"


def _thinking(sim: Sim) -> None:
    assert sim.respond(THINKING_ONLY) == "thinking_only_nudge"
    sim.respond(text())


def _stop_hook(sim: Sim) -> None:
    sim.respond(text())
    assert sim.feed(StopHookVerdict(blocked=True, reason="tests are red")) == "stop_hook_blocking"
    sim.respond(text("fixed"))


def _stop_hook_prevented(sim: Sim) -> None:
    sim.respond(text())
    assert sim.feed(StopHookVerdict(prevented=True, stop_reason="halt")) == "settle"


def _api_error(sim: Sim) -> None:
    sim.call()
    assert sim.feed(CallFailed(ModelError("api", "Internal server error", 500))) == "call_failed"


def _stream_retry(sim: Sim) -> None:
    sim.call()
    sim.feed(StreamOpened())
    assert sim.feed(CallFailed(ModelError("connection", "reset", retryable=True))) == "stream_retry"
    sim.request()
    sim.feed(StreamOpened())
    sim.feed(StreamEnded(text()))


def _reactive_compact(sim: Sim) -> None:
    for i in (1, 2):  # one exchange alone cannot be compacted
        sim.respond(tool_call(f"toolu_{i}"))
        sim.tools(tool_call(f"toolu_{i}"))
    sim.call()
    assert may_reactive_compact(sim.state)
    summary = Compaction((Message("user", "summary of it all", kind="compact_summary"),), "reactive")
    err = ModelError("prompt_too_long", "prompt is too long", 400)
    assert sim.feed(CallFailed(err, compaction=summary)) == "reactive_compact_retry"
    sim.respond(text())


def _abort_tools(sim: Sim) -> None:
    resp = tool_call("toolu_1")
    sim.respond(resp)
    assert sim.feed(Aborted(resp.as_message().content, results_for(resp).content)) == "abort"


def _refused(sim: Sim) -> None:
    sim.feed(Assembled())
    assert sim.feed(Refused(TerminalReason.BUDGET_EXHAUSTED, "Reached maximum budget")) == "refuse"


def _two_prompts(sim: Sim) -> None:
    _tool_turn(sim)
    sim.finish()
    sim.prompt("and now?")
    sim.respond(text())


SCENARIOS: dict[str, tuple[Callable[[Sim], None], Limits, str]] = {
    "completed": (_completed, Limits(), "completed"),
    "tool_turn": (_tool_turn, Limits(), "completed"),
    "max_turns": (_max_turns, Limits(max_turns=1), "max_turns"),
    "max_tokens": (_max_tokens, Limits(), "completed"),
    "max_tokens_exhausted": (_max_tokens_exhausted, Limits(max_output_tokens_recoveries=1), "api_error"),
    "malformed": (_malformed, Limits(), "malformed_tool_use_exhausted"),
    "thinking": (_thinking, Limits(), "completed"),
    "stop_hook": (_stop_hook, Limits(), "completed"),
    "stop_hook_prevented": (_stop_hook_prevented, Limits(), "stop_hook_prevented"),
    "api_error": (_api_error, Limits(), "api_error"),
    "stream_retry": (_stream_retry, Limits(), "completed"),
    "reactive_compact": (_reactive_compact, Limits(), "completed"),
    "abort_tools": (_abort_tools, Limits(), "aborted_tools"),
    "refused": (_refused, Limits(max_budget_usd=0.01), "budget_exhausted"),
    "two_prompts": (_two_prompts, Limits(), "completed"),
}


def write_scenario(path: Path, name: str) -> Path:
    script, limits, reason = SCENARIOS[name]
    sim = Sim(path, limits)
    script(sim)
    assert sim.state.phase is Phase.STOP and sim.state.terminal_reason == TerminalReason(reason)
    sim.finish()
    sim.close()
    return path


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.is_error]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def rewrite(path: Path, recs: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def line_of(recs: list[dict[str, Any]], pred: Callable[[dict[str, Any]], bool], nth: int = 0) -> int:
    """1-based line of the nth record matching ``pred``."""
    return [i for i, r in enumerate(recs, 1) if pred(r)][nth]


def is_move(trigger: str) -> Callable[[dict[str, Any]], bool]:
    return lambda r: r["type"] == "transition" and r["trigger"] == trigger


def is_request(r: dict[str, Any]) -> bool:
    return r["type"] == "request"


def the(findings: list[Finding], code: str) -> Finding:
    found = [f for f in findings if f.code == code]
    assert len(found) == 1, (code, findings)
    return found[0]


# --- genuine traces pass ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_engine_traces_are_clean(tmp_path: Path, name: str) -> None:
    path = write_scenario(tmp_path / f"{name}.jsonl", name)
    assert audit_file(path) == []


def test_audit_of_records_numbers_them_like_lines(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    assert audit(recs) == []
    recs[line_of(recs, is_move("collect")) - 1]["from"] = "stream"
    assert the(audit(recs), "undeclared_move").line == line_of(recs, is_move("collect"))


# --- tampered copies are rejected, each with its line and code ---------------------------------


@pytest.fixture
def tool_trace(tmp_path: Path) -> Trace:
    path = write_scenario(tmp_path / "tool_turn.jsonl", "tool_turn")
    return path, records(path)


def test_undeclared_move_stream_to_feedback(tool_trace: Trace) -> None:
    path, recs = tool_trace
    line = line_of(recs, is_move("dispatch"))
    recs[line - 1]["to"] = "feedback"
    rewrite(path, recs)
    findings = audit_file(path)
    f = the(findings, "undeclared_move")
    assert f.line == line and f.is_error
    assert "'dispatch' (stream → feedback) is not a declared edge" in f.message
    assert "goes stream → dispatch_tools" in f.message
    assert "the graph declares no move stream → feedback" in f.message
    # the next move starts where the real loop was, not where the tampered record says
    d = the(findings, "discontinuous")
    assert d.line == line + 1 or d.line > line
    assert f"line {line}) ended at 'feedback'" in d.message


def test_unknown_trigger_and_state(tool_trace: Trace) -> None:
    path, recs = tool_trace
    recs[line_of(recs, is_move("call")) - 1]["trigger"] = "teleport"
    recs[line_of(recs, is_move("open_stream")) - 1]["to"] = "limbo"
    rewrite(path, recs)
    findings = audit_file(path)
    assert the(findings, "unknown_trigger").line == line_of(recs, lambda r: r.get("trigger") == "teleport")
    assert "'teleport' is not a declared trigger" in the(findings, "unknown_trigger").message
    assert "'limbo'" in the(findings, "unknown_state").message


def test_counter_over_cap(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "max_tokens")
    recs = records(path)
    line = line_of(recs, is_move("max_output_tokens_recovery"), nth=1)
    recs[line - 1]["changed"]["max_output_tokens_recovery_count"] = 4
    rewrite(path, recs)
    f = the(audit_file(path), "counter_over_cap")
    assert f.line == line
    assert "max_output_tokens_recovery_count=4 exceeds its cap max_output_tokens_recoveries=3" in f.message
    # caps come from the session record unless overridden: under a stricter one the first recovery
    # over it is flagged, once (the counter staying high on the next moves is the same excursion)
    stricter = audit_file(path, limits=Limits(max_output_tokens_recoveries=0))
    assert [f.line for f in stricter if f.code == "counter_over_cap"] == [
        line_of(recs, is_move("max_output_tokens_recovery"))]


def test_turn_over_max_turns(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "max_turns")
    recs = records(path)
    line = line_of(recs, is_move("finish_batch"))
    recs[line - 1]["turn"] = 2
    rewrite(path, recs)
    f = the(audit_file(path), "turn_over_cap")
    assert f.line == line and "turn 2 exceeds max_turns=1" in f.message


def _results_record(recs: list[dict[str, Any]]) -> int:
    return line_of(recs, lambda r: r["type"] == "message" and r["kind"] == "tool_results")


def test_unpaired_tool_use_in_request(tool_trace: Trace) -> None:
    """A request carries the conversation by reference: a tool_result taken out of the recorded
    conversation leaves the next request with an unpaired tool_use."""
    path, recs = tool_trace
    results = recs[_results_record(recs) - 1]
    results["content"] = [b for b in results["content"] if b.get("tool_use_id") != "toolu_2"]
    rewrite(path, recs)
    findings = audit_file(path)
    f = the(findings, "unpaired_tool_use")
    assert f.line == line_of(recs, is_request, nth=1)
    assert f.message == "tool_use 'toolu_2' (Read) in messages[1] has no tool_result in messages[2]"
    assert the(findings, "message_mismatch").line == _results_record(recs)


def test_orphan_and_duplicate_tool_results(tool_trace: Trace) -> None:
    path, recs = tool_trace
    blocks = recs[_results_record(recs) - 1]["content"]
    blocks.append({"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"})
    blocks.append(dict(blocks[0]))
    rewrite(path, recs)
    findings = audit_file(path)
    line = line_of(recs, is_request, nth=1)
    assert the(findings, "orphan_tool_result").line == line
    assert "'toolu_9' in messages[2] has no tool_use with that id in messages[1]" in \
        the(findings, "orphan_tool_result").message
    assert "has 2 tool_results" in the(findings, "duplicate_tool_result").message


def test_non_alternating_roles(tool_trace: Trace) -> None:
    path, recs = tool_trace
    results = _results_record(recs)
    recs[results - 1] = {**recs[results - 1], "role": "assistant", "kind": "assistant"}
    rewrite(path, recs)
    findings = audit_file(path)
    f = the(findings, "role_order")
    assert f.line == line_of(recs, is_request, nth=1)
    assert "conversation message 2" in f.message and "assistant message right after another" in f.message


def test_a_request_that_names_another_conversation(tool_trace: Trace) -> None:
    path, recs = tool_trace
    line = line_of(recs, is_request, nth=1)
    recs[line - 1]["last"] = "not-a-recorded-message"
    rewrite(path, recs)
    f = the(audit_file(path), "bad_request")
    assert f.line == line and "'not-a-recorded-message'" in f.message


def test_format_2_requests_with_skeletons_are_still_checked() -> None:
    recs = [{"type": "session", "seq": 0, "version": 2, "limits": {}},
            {"type": "request", "seq": 1, "messages": [{"role": "user", "blocks": [{"type": "text"}]},
                                                       {"role": "assistant", "blocks": [
                                                           {"type": "tool_use", "id": "t", "name": "Read"}]},
                                                       {"role": "user", "blocks": [{"type": "text"}]}]}]
    assert [f.code for f in audit(recs) if f.is_error] == ["unpaired_tool_use"]


def test_first_message_must_be_user() -> None:
    problems = list(check_request([{"role": "assistant", "blocks": []}]))
    assert problems == [("role_order", "messages[0] has role 'assistant' where 'user' is due: roles must "
                                       "alternate user/assistant starting with user")]


def test_request_after_stop(tool_trace: Trace) -> None:
    path, recs = tool_trace
    stop_line = line_of(recs, is_move("end_turn"))
    recs.insert(stop_line, dict(recs[line_of(recs, is_request, nth=1) - 1]))
    rewrite(path, recs)
    f = the(audit_file(path), "request_after_stop")
    assert f.line == stop_line + 1
    assert f"reached stop at line {stop_line} ('end_turn', 'completed')" in f.message


def test_request_after_stop_hook_blocking_is_fine_and_without_it_is_not(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "stop_hook")
    recs = records(path)
    assert audit_file(path) == []
    blocking = line_of(recs, is_move("stop_hook_blocking"))
    # drop the re-entry and the next move: the second request now follows a stop
    del recs[blocking - 1: blocking + 1]
    rewrite(path, recs)
    findings = audit_file(path)
    after = the(findings, "request_after_stop")
    assert after.line == line_of(recs, is_request, nth=1)


def test_result_disagrees_with_last_move(tool_trace: Trace) -> None:
    path, recs = tool_trace
    line = line_of(recs, lambda r: r["type"] == "result")
    recs[line - 1]["terminal_reason"] = "max_turns"
    rewrite(path, recs)
    findings = audit_file(path)
    f = the(findings, "result_mismatch")
    stop_line = line_of(recs, is_move("settle"))
    assert f.line == line
    assert f.message == (f"result terminal_reason 'max_turns' but the last move into stop ('settle', "
                         f"line {stop_line}) carried 'completed'")
    assert "TERMINAL_INFO says subtype='error_max_turns', is_error=True" in \
        the(findings, "result_subtype").message


def test_result_subtype_and_is_error(tool_trace: Trace) -> None:
    path, recs = tool_trace
    recs[-1]["is_error"] = True
    rewrite(path, recs)
    f = the(audit_file(path), "result_subtype")
    assert f.line == len(recs) and "is_error=True" in f.message


def test_bad_terminal_reason_on_move_into_stop(tool_trace: Trace) -> None:
    path, recs = tool_trace
    line = line_of(recs, is_move("end_turn"))
    recs[line - 1]["terminal_reason"] = "max_turns"
    rewrite(path, recs)
    findings = audit_file(path)
    f = the(findings, "bad_terminal_reason")
    assert f.line == line and "allows completed" in f.message
    # the replay of the same move disagrees too, naming the field
    r = the(findings, "replay_mismatch")
    assert r.line == line and "terminal_reason 'max_turns' (replay: 'completed')" in r.message
    assert errors(findings) == [f, r]


def test_transition_after_result_and_result_before_stop(tool_trace: Trace) -> None:
    path, recs = tool_trace
    result = recs.pop()
    stop_line = line_of(recs, is_move("end_turn"))
    recs.insert(stop_line - 1, result)  # result now precedes the move into stop
    rewrite(path, recs)
    findings = audit_file(path)
    assert the(findings, "result_before_stop").line == stop_line
    assert "while the loop is at 'stream'" in the(findings, "result_before_stop").message
    after = [f for f in findings if f.code == "transition_after_result"]
    assert [f.line for f in after] == [line_of(recs, is_move("end_turn")), line_of(recs, is_move("settle"))]
    assert all(f"after the result record at line {stop_line}" in f.message for f in after)


def test_discontinuous_first_move(tool_trace: Trace) -> None:
    path, recs = tool_trace
    del recs[line_of(recs, is_move("call")) - 1]
    rewrite(path, recs)
    f = the(audit_file(path), "discontinuous")
    assert f.line == line_of(recs, is_move("open_stream"))
    assert "starts at 'call_model' but a run starts at 'assemble'" in f.message


def test_graph_changed_is_a_warning(tool_trace: Trace,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    path, recs = tool_trace
    recs[0]["graph"] = "0123456789abcdef"
    rewrite(path, recs)
    findings = audit_file(path)
    assert [(f.line, f.code, f.severity) for f in findings] == [(1, "graph_changed", "warning")]
    assert main([str(path)]) == 0
    assert "warning [graph_changed]" in capsys.readouterr().out


def test_torn_last_line_is_tolerated(tool_trace: Trace) -> None:
    path, recs = tool_trace
    with open(path, "a") as fh:
        fh.write('{"type": "transition", "from": "stop", "to": "ass')
    findings = audit_file(path)
    assert [(f.line, f.code) for f in findings] == [(len(recs) + 1, "torn_last_line")]
    assert not errors(findings)


def test_broken_middle_line_and_seq_gap(tool_trace: Trace) -> None:
    path, _ = tool_trace
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"
    path.write_text("".join(lines))
    findings = audit_file(path)
    assert the(findings, "unreadable_line").line == 4
    # records missing or reordered are an error: nothing the writer does skips a number
    assert the(findings, "seq_order").line == 5 and the(findings, "seq_order").is_error


def test_crashed_run_then_resumed_run(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sim = Sim(path)
    sim.respond(tool_call("toolu_1"))  # crash while the tool runs: no result
    crashed_at = len(records(path)) - 3
    sim.prompt("continue")  # the resumed run
    sim.respond(text())
    sim.finish()
    sim.close()
    findings = audit_file(path)
    assert [(f.code, f.line) for f in findings] == [("incomplete_run", crashed_at)]
    assert "last position: dispatch_tools" in findings[0].message


def test_every_code_is_documented() -> None:
    assert WARNING_CODES <= set(CODES)
    assert Finding(3, "graph_changed", "x").severity == "warning"
    assert Finding(3, "undeclared_move", "x").severity == "error"
    assert str(Finding(3, "undeclared_move", "x")) == "line 3: error [undeclared_move] x"


# --- random walks of the real decision function -----------------------------------------------

PICKS = ("text", "tool", "tools2", "max_tokens", "malformed", "thinking", "api_error", "ptl", "refuse",
         "fallback", "abort_call", "stream_retry", "stream_error", "abort", "block", "prevent", "ends_turn",
         "hook_stop", "defer")


def walk(sim: Sim, picks: Iterable[str]) -> None:
    """Drive the machine like the driver would, taking model/tool/hook behaviour from ``picks``."""
    it = iter(picks)
    ids = itertools.count(1)
    response = text()
    drained: ToolsDrained | None = None
    while True:
        phase = sim.machine.phase
        if phase is Phase.STOP:
            pick = next(it, "end") if graph.stop_hooks_are_due(sim.state) else "end"
            if pick == "block":
                sim.feed(StopHookVerdict(blocked=True, reason="again"))
            elif pick == "prevent":
                sim.feed(StopHookVerdict(prevented=True, stop_reason="halt"))
            else:
                return
        elif phase is Phase.ASSEMBLE:
            sim.feed(Assembled())
        elif phase is Phase.CALL_MODEL:
            pick = next(it, "text")
            if pick == "refuse":
                sim.feed(Refused(TerminalReason.BLOCKING_LIMIT, "too long"))
                continue
            if pick == "abort_call":
                sim.feed(Aborted())
                continue
            sim.request()
            if pick == "fallback":
                sim.feed(CallFailed(ModelError("overloaded", "Overloaded", 529, retryable=True),
                                           fallback_available=True))
            elif pick == "api_error":
                sim.feed(CallFailed(ModelError("api", "boom", 500)))
            elif pick == "ptl":
                compaction = (Compaction((Message("user", "summary", kind="compact_summary"),), "reactive")
                              if may_reactive_compact(sim.state) else None)
                sim.feed(CallFailed(ModelError("prompt_too_long", "prompt is too long", 400),
                                           compaction=compaction))
            else:
                sim.feed(StreamOpened())
                response = {
                    "tool": tool_call(f"toolu_{next(ids)}"),
                    "tools2": tool_call(f"toolu_{next(ids)}", f"toolu_{next(ids)}"),
                    "max_tokens": text("cut", "max_tokens"),
                    "malformed": MALFORMED,
                    "thinking": THINKING_ONLY,
                }.get(pick, text())
                if pick == "stream_retry":
                    sim.feed(CallFailed(ModelError("connection", "reset", retryable=True)))
                elif pick == "stream_error":
                    sim.feed(CallFailed(ModelError("model", "malformed stream")))
                elif pick == "abort":
                    sim.feed(Aborted())
                else:
                    sim.feed(StreamEnded(response))
        elif phase is Phase.DISPATCH_TOOLS:
            pick = next(it, "ok")
            if pick == "abort":
                sim.feed(Aborted(response.as_message().content, results_for(response).content))
                continue
            drained = ToolsDrained(response.as_message(), results_for(response),
                                   ends_turn=pick == "ends_turn", hook_stopped=pick == "hook_stop",
                                   deferred_ids=tuple(response.as_message().tool_use_ids()) if pick == "defer"
                                   else ())
            sim.feed(drained)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.sampled_from(PICKS), max_size=14),
       max_turns=st.none() | st.integers(1, 3),
       recoveries=st.integers(0, 2), malformed=st.integers(0, 2), hook_cap=st.integers(0, 2))
def test_random_engine_walks_audit_clean(tmp_path: Path, picks: list[str], max_turns: int | None,
                                         recoveries: int, malformed: int, hook_cap: int) -> None:
    limits = Limits(max_turns=max_turns, max_output_tokens_recoveries=recoveries,
                    malformed_tool_use_retries=malformed, stop_hook_block_cap=hook_cap)
    path = tmp_path / f"walk-{abs(hash((tuple(picks), max_turns, recoveries, malformed, hook_cap)))}.jsonl"
    path.unlink(missing_ok=True)
    sim = Sim(path, limits)
    walk(sim, picks)
    sim.finish()
    sim.close()
    assert errors(audit_file(path)) == []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.sampled_from(PICKS), max_size=14))
def test_the_auditor_replays_from_the_runs_own_conversation(tmp_path: Path, picks: list[str]) -> None:
    """Each move is replayed from the conversation the message records rebuild; it must be the run's own,
    message by message (role, blocks, uuid and the kind that says where a message came from), after a
    compaction too: a replay from another conversation proves nothing about the run, whatever the
    machine reads of it now or later."""
    path = tmp_path / f"conv-{abs(hash(tuple(picks)))}.jsonl"
    path.unlink(missing_ok=True)
    sim = Sim(path)
    walk(sim, picks)
    sim.finish()
    sim.close()
    rebuilt: list[list[Message]] = []

    class Watching(_Auditor):
        def _result(self, line: int, rec: Any) -> None:
            rebuilt.append(list(self.view))
            super()._result(line, rec)

    assert Watching(None).run(enumerate(records(path), 1)) is not None
    assert rebuilt == [list(sim.state.messages)]


# --- coverage and the CLI ---------------------------------------------------------------------


def test_coverage_counts_edges_and_reasons(tmp_path: Path) -> None:
    for name in SCENARIOS:
        write_scenario(tmp_path / f"{name}.jsonl", name)
    cov = coverage([tmp_path])
    taken, reasons, missing, missing_reasons = cov
    # tool_turn 1, reactive_compact 2, two_prompts 1
    assert taken[Move("next_turn", "feedback", "assemble")] == 4
    assert taken[Move("stream_retry", "stream", "call_model")] == 1
    assert taken[Move("abort", "dispatch_tools", "stop")] == 1
    assert reasons["completed"] >= 8 and reasons["budget_exhausted"] == 1
    assert Move("reactive_compact_retry", "stream", "assemble") in missing
    assert Move("abort", "assemble", "stop") in missing
    assert "image_error" in missing_reasons and "completed" not in missing_reasons
    assert set(missing) | set(taken) == set(declared_moves())


def test_main_exit_codes_and_json(tool_trace: Trace,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path, recs = tool_trace
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{path}: agentfsm trace, ok")
    recs[line_of(recs, is_move("dispatch")) - 1]["to"] = "feedback"
    rewrite(path, recs)
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:{line_of(recs, is_move('dispatch'))}: error [undeclared_move]" in out
    assert main([str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] >= 1
    assert {"path": str(path), "line": line_of(recs, is_move("dispatch")), "code": "undeclared_move",
            "severity": "error"}.items() <= doc["findings"][0].items()
    assert main([str(path.with_name("missing.jsonl"))]) == 2


def test_main_coverage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    assert main(["--coverage", str(path)]) == 0
    out = capsys.readouterr().out
    assert "×2  call" in out and "never  thinking_only_nudge" in out
    assert "terminal reasons reached: 1/" in out
    assert main(["--coverage", "--require-full", str(path)]) == 1
    capsys.readouterr()
    assert main(["--coverage", "--json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"trigger": "next_turn", "from": "feedback", "to": "assemble", "count": 1} in doc["edges"]
    assert "image_error" in doc["missing_reasons"]


# --- replay: tampering a genuine trace is caught, naming the line and the field ---------------


def _set_counter(rec: dict[str, Any], name: str, value: Any) -> None:
    """Tamper consistently: every place the record states the counter."""
    rec["changed"][name] = value
    if name == "turn_count":
        rec["turn"] = value


def test_counter_jump_is_caught(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("next_turn"))
    _set_counter(recs[line - 1], "turn_count", 5)
    rewrite(path, recs)
    findings = audit_file(path)
    assert "turn_count went 1 → 5 in one move" in the(findings, "counter_jump").message
    r = [f for f in findings if f.code == "replay_mismatch" and f.line == line]
    assert r and "turn_count 5 (replay: 2)" in r[0].message


def test_counter_going_backwards_or_negative_is_caught(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "max_tokens")
    recs = records(path)
    second = line_of(recs, is_move("max_output_tokens_recovery"), nth=1)
    snaps = {id(r): snap for r, snap in transition_snapshots(recs)}
    call = line_of(recs, lambda r: r["type"] == "transition" and r["trigger"] == "call" and
                   snaps[id(r)]["max_output_tokens_recovery_count"] == 2)
    _set_counter(recs[call - 1], "max_output_tokens_recovery_count", 1)
    _set_counter(recs[second - 1], "stream_retry_count", -1)
    rewrite(path, recs)
    findings = audit_file(path)
    [back] = [f for f in findings if f.code == "counter_backwards" and f.line == call]
    assert "max_output_tokens_recovery_count went back 2 → 1" in back.message
    neg = the(findings, "counter_negative")
    assert neg.line == second and "stream_retry_count=-1 is negative" in neg.message
    assert {f.line for f in findings if f.code == "replay_mismatch"} >= {call, second}


def test_recovery_counter_without_its_edge_is_caught(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("dispatch"))
    _set_counter(recs[line - 1], "malformed_tool_use_retry_count", 1)
    rewrite(path, recs)
    findings = audit_file(path)
    f = the(findings, "counter_without_edge")
    assert f.line == line
    assert "malformed_tool_use_retry_count rose 0 → 1 on transition 'dispatch'" in f.message
    assert "only malformed_tool_use_retry raise it" in f.message


@pytest.mark.parametrize("counter", sorted(RAISED_BY))
def test_every_counter_rising_on_an_edge_that_never_raises_it_is_caught(tmp_path: Path, counter: str) -> None:
    """``dispatch`` raises no counter: each counter raised on it is reported, naming the edges that may."""
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("dispatch"))
    old = {id(r): snap for r, snap in transition_snapshots(recs)}[id(recs[line - 1])][counter]
    _set_counter(recs[line - 1], counter, old + 1)
    rewrite(path, recs)
    found = [f for f in audit_file(path) if f.code == "counter_without_edge" and f.line == line]
    assert len(found) == 1 and f"{counter} rose {old} → {old + 1} on transition 'dispatch'" in found[0].message
    assert f"only {', '.join(sorted(RAISED_BY[counter]))} raise it" in found[0].message


def test_label_not_matching_the_move_is_caught(tmp_path: Path) -> None:
    """Both are declared stream → assemble re-entries: only replaying the event tells them apart."""
    path = write_scenario(tmp_path / "t.jsonl", "max_tokens")
    recs = records(path)
    line = line_of(recs, is_move("max_output_tokens_recovery"))
    recs[line - 1]["trigger"] = "thinking_only_nudge"
    rewrite(path, recs)
    findings = audit_file(path)
    f = next(x for x in findings if x.code == "replay_mismatch" and x.line == line)
    assert "trigger 'thinking_only_nudge' (replay: 'max_output_tokens_recovery')" in f.message
    assert not any(x.code == "undeclared_move" for x in findings)


def test_reentry_past_its_cap_is_caught(tmp_path: Path) -> None:
    """A fourth max-tokens recovery where the cap is three."""
    path = write_scenario(tmp_path / "t.jsonl", "max_tokens")
    recs = records(path)
    recs[0]["limits"]["max_output_tokens_recoveries"] = 1
    rewrite(path, recs)
    findings = audit_file(path)
    second = line_of(recs, is_move("max_output_tokens_recovery"), nth=1)
    over = the(findings, "counter_over_cap")
    assert over.line == second and "exceeds its cap max_output_tokens_recoveries=1" in over.message
    r = next(x for x in findings if x.code == "replay_mismatch" and x.line == second)
    assert "trigger 'max_output_tokens_recovery' (replay: 'recovery_exhausted')" in r.message


def test_wrong_terminal_reason_for_the_edge_is_caught(tool_trace: Trace) -> None:
    path, recs = tool_trace
    line = line_of(recs, is_move("settle"))
    recs[line - 1]["terminal_reason"] = "aborted_tools"
    recs[-1].update(terminal_reason="aborted_tools", subtype="error_during_execution", is_error=True)
    rewrite(path, recs)
    findings = audit_file(path)
    assert the(findings, "bad_terminal_reason").line == line
    assert "terminal_reason 'aborted_tools' (replay: 'completed')" in the(findings, "replay_mismatch").message


@pytest.mark.parametrize("change", ["drop", "duplicate"])
def test_missing_or_duplicated_tool_result_is_caught(tmp_path: Path, change: str) -> None:
    """The final batch's result message, tampered where no later request would show it."""
    path = write_scenario(tmp_path / "t.jsonl", "max_turns")
    recs = records(path)
    line = line_of(recs, lambda r: r["type"] == "message" and r["kind"] == "tool_results")
    blocks = recs[line - 1]["content"]
    if change == "drop":
        blocks.clear()
    else:
        blocks.append(dict(blocks[0]))
    rewrite(path, recs)
    findings = audit_file(path)
    assert the(findings, "message_mismatch").line == line
    code = "unpaired_tool_use" if change == "drop" else "duplicate_tool_result"
    assert the(findings, code).line == line_of(recs, lambda r: r["type"] == "result")


def test_a_missing_message_record_is_caught(tool_trace: Trace) -> None:
    path, recs = tool_trace
    line = line_of(recs, lambda r: r["type"] == "message" and r["kind"] == "tool_results")
    del recs[line - 1]
    rewrite(path, recs)
    message = the(audit_file(path), "message_missing").message
    assert "added 1 message(s) the file does not record" in message
    assert "(first: user tool_results [tool_result:toolu_" in message, message


def test_reordered_records_are_caught(tool_trace: Trace) -> None:
    path, recs = tool_trace
    a, b = line_of(recs, is_move("open_stream")), line_of(recs, is_move("dispatch", ), nth=0)
    recs[a - 1], recs[b - 1] = recs[b - 1], recs[a - 1]
    rewrite(path, recs)
    findings = audit_file(path)
    assert {"seq_order", "discontinuous"} <= {f.code for f in errors(findings)}
    assert a in {f.line for f in findings if f.code == "discontinuous"}


def test_a_truncated_last_line_is_reported_not_a_crash(tool_trace: Trace,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, _recs = tool_trace
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])  # cut mid-record
    findings = audit_file(path)
    assert the(findings, "torn_last_line").line == len(data[: len(data) - 20].splitlines())
    assert main([str(path)]) in (0, 1)
    assert "torn_last_line" in capsys.readouterr().out


def test_an_undecodable_byte_is_reported_and_the_rest_read(tool_trace: Trace) -> None:
    path, _recs = tool_trace
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"go"', b'"g\xff"')
    path.write_bytes(b"".join(lines))
    findings = audit_file(path)
    assert the(findings, "undecodable_line").line == 2
    assert not errors([f for f in findings if f.code != "undecodable_line"])


# --- inputs that are not traces are refused, never answered "ok" --------------------------------


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\x00\x01\x02binary", b'{"type": "user", "sessionId": "x"}\n',
                                     b"plain text\n"])
def test_not_a_trace_exits_2_with_one_line(tmp_path: Path, content: bytes,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "agentfsm trace" in err


def test_an_empty_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d").mkdir()
    assert main([str(tmp_path / "d")]) == 2
    assert "no .jsonl session files" in capsys.readouterr().err


def test_format_1_is_checked_without_replay_and_a_newer_format_is_refused(
        tool_trace: Trace, capsys: pytest.CaptureFixture[str]) -> None:
    path, recs = tool_trace
    recs[0]["version"] = 1
    for r in recs:
        r.pop("event", None)
    rewrite(path, recs)
    findings = audit_file(path)
    assert [(f.code, f.severity) for f in findings] == [("no_replay", "warning")]
    recs[0]["version"] = 99
    rewrite(path, recs)
    assert main([str(path)]) == 2
    assert "trace format 99" in capsys.readouterr().err



# --- reading what the auditor is given ---------------------------------------------------------

OUR_TYPES = ["session", "message", "assistant_block", "compact_boundary", "transition", "request", "result"]


@pytest.mark.parametrize("first", OUR_TYPES)
def test_a_file_opening_with_any_of_our_records_is_an_agentfsm_trace(tmp_path: Path, first: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"type": first, "seq": 1}) + "\n")
    assert recognise(path) == "agentfsm"
    path.write_text(json.dumps({"type": first}) + "\n")  # without a sequence number it is not ours
    with pytest.raises(NotATrace):
        recognise(path)


def test_records_before_any_session_are_audited_against_the_default_caps(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "max_tokens")
    recs = records(path)
    assert recs[0]["type"] == "session"
    findings = audit(recs[1:])
    assert [f.code for f in findings if f.is_error] == []
    assert the(findings, "no_session_record").line == 1
    # the default caps hold; a cap of none is overstepped by the first recovery
    assert any(f.code == "counter_over_cap" for f in audit(recs[1:], limits={"max_output_tokens_recoveries": 0}))


def test_an_unreadable_event_is_reported_not_raised(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("dispatch"))
    recs[line - 1]["event"] = {"type": "stream_ended", "response": "not a response"}
    rewrite(path, recs)
    found = [f for f in audit_file(path) if f.code == "bad_event"]
    assert [f.line for f in found] == [line]


def test_a_report_names_the_reason_on_the_move_into_stop_only(tmp_path: Path) -> None:
    report = audit_report(write_scenario(tmp_path / "t.jsonl", "max_tokens"))
    assert report.moves and report.terminal_reason is not None
    for move in report.moves:
        assert move.reason == (report.terminal_reason if move.dest == "stop" else None), move


CC_RUN = Path(__file__).parent / "fixtures" / "claude_code" / "json_schema_retry"


@pytest.mark.parametrize("name", ["transcript.jsonl", "stream.jsonl"])
def test_a_claude_code_run_is_audited_against_caps_given_as_a_record_or_a_mapping(name: str) -> None:
    plain = audit_report(CC_RUN / name)
    assert plain.errors == 0
    strict = audit_report(CC_RUN / name, limits=Limits(structured_output_retries=0))
    assert strict.errors > 0
    as_mapping = audit_report(CC_RUN / name, limits={"structured_output_retries": 0})
    assert [str(f) for f in as_mapping.findings] == [str(f) for f in strict.findings]


def test_a_move_recorded_under_another_kind_is_caught(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("next_turn"))
    recs[line - 1]["kind"] = "terminal"
    rewrite(path, recs)
    found = [f for f in audit_file(path) if f.code == "kind_mismatch"]
    assert [f.line for f in found] == [line] and "the edge is 'reentry'" in found[0].message


def test_a_counter_that_is_not_a_number_is_left_to_the_replay(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("next_turn"))
    _set_counter(recs[line - 1], "stream_retry_count", "two")
    rewrite(path, recs)
    codes_ = {f.code for f in audit_file(path) if f.line == line}
    assert not codes_ & {"counter_jump", "counter_without_edge", "counter_backwards"}


def test_a_second_result_record_is_caught(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "completed")
    recs = records(path)
    result = line_of(recs, lambda r: r["type"] == "result")
    recs.insert(result, {**recs[result - 1], "seq": recs[result - 1]["seq"] + 1})
    for later in recs[result + 1:]:
        later["seq"] += 1
    rewrite(path, recs)
    found = the(audit_file(path), "duplicate_result")
    assert found.line == result + 1 and f"the first is at line {result}" in found.message


def test_without_a_result_record_the_report_ends_with_the_last_move_into_stop(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "max_turns")
    rewrite(path, [r for r in records(path) if r["type"] != "result"])
    assert audit_report(path).terminal_reason == "max_turns"


def test_a_snapshot_without_a_phase_or_compaction_counts_restores_to_the_start() -> None:
    from agentfsm.auditing.audit import _restore

    restored = _restore(LoopState(messages=()), "nowhere", {})
    assert restored.phase is Phase.ASSEMBLE
    t = restored.compact_tracking
    assert (t.turns_since_compact, t.compactions, t.consecutive_failures, t.rapid_refill_count) == (0, 0, 0, 0)


def test_the_cli_prints_a_claude_code_runs_path_and_counts_traces(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A Claude Code run's path is printed (an agentfsm trace's is its transitions); the coverage
    summary counts one trace or several."""
    ours = write_scenario(tmp_path / "t.jsonl", "completed")
    main([str(ours)])
    assert ": path: " not in capsys.readouterr().out
    main([str(CC_RUN / "transcript.jsonl")])
    assert f"{CC_RUN / 'transcript.jsonl'}: path: " in capsys.readouterr().out
    main(["--coverage", str(ours)])
    assert "(1 trace)" in capsys.readouterr().out
    main(["--coverage", str(ours), str(write_scenario(tmp_path / "u.jsonl", "tool_turn"))])
    assert "(2 traces)" in capsys.readouterr().out


@pytest.mark.parametrize("edges_full, reasons_full", [(True, True), (True, False), (False, True), (False, False)])
def test_require_full_needs_every_edge_and_every_reason(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str],
                                                        edges_full: bool, reasons_full: bool) -> None:
    from collections import Counter

    from agentfsm.auditing import audit as audit_module
    from agentfsm.auditing.coverage import Coverage, declared_moves

    moves = declared_moves()
    taken = Counter(moves if edges_full else moves[1:])
    reasons = Counter(r.value for r in (TerminalReason if reasons_full else list(TerminalReason)[1:]))
    monkeypatch.setattr(audit_module, "coverage", lambda _files: Coverage(taken, reasons, [], []))
    one = {Path("t.jsonl"): "agentfsm"}  # the coverage of each agentfsm trace is read on its own
    code = audit_module._main_coverage(one, as_json=False, require_full=True)
    capsys.readouterr()
    assert code == (0 if edges_full and reasons_full else 1)
    assert audit_module._main_coverage(one, as_json=False, require_full=False) == 0


# --- each check on both sides (the survivors of the full mutation run) ------------------------------


def _renumbered(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with consecutive sequence numbers again (after one was added or taken out)."""
    return [{**r, "seq": i} for i, r in enumerate(recs)]


def test_a_traces_report_holds_its_moves_events_counters_and_the_results_reason(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sim = Sim(path)
    sim.respond(tool_call("toolu_1"))
    sim.tools(tool_call("toolu_1"))
    sim.respond(text())
    sim.finish()
    sim.close()
    recs = records(path)
    moves = [r for r in recs if r["type"] == "transition"]
    report = audit_report(path)
    assert [m.label for m in report.moves] == [r["trigger"] for r in moves]
    assert all(m.declared for m in report.moves)
    assert [m.event for m in report.moves] == [r.get("event") for r in moves]
    assert any(m.event for m in report.moves) and any(m.event is None for m in report.moves)
    assert dict(report.counters) == sim.state.counters() and report.counters["turn_count"] == 2
    recs[line_of(recs, is_move("dispatch")) - 1]["to"] = "feedback"
    recs[-1]["terminal_reason"] = "max_turns"  # the result record says how the run ended
    rewrite(path, recs)
    report = audit_report(path)
    assert [m.declared for m in report.moves] == [r["trigger"] != "dispatch" for r in moves]
    assert report.terminal_reason == "max_turns"


@pytest.mark.parametrize(("content", "says"), [(b"", "empty file"), (b"\n \n", "empty file"),
                                               (b"\x00\x01binary", "binary file")])
def test_an_empty_or_binary_file_is_refused_as_such(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(content)
    with pytest.raises(NotATrace, match=says):
        recognise(path)


def test_lines_that_are_no_records_are_passed_over_when_recognising(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('not json\n[1, 2]\n"text"\n' + json.dumps({"type": "session", "seq": 1}) + "\n")
    assert recognise(path) == "agentfsm"


def test_a_claude_code_runs_unreadable_line_is_reported_with_its_findings(tmp_path: Path) -> None:
    lines = (CC_RUN / "transcript.jsonl").read_text().splitlines(keepends=True)
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join([*lines[:3], "{not json\n", *lines[3:]]))
    findings = audit_file(path)
    assert the(findings, "unreadable_line").line == 4
    assert [f.line for f in findings] == sorted(f.line for f in findings)


@pytest.mark.parametrize("bad", [{"max_turns": 0}, {"max_turns": "many"}])
def test_caps_that_are_no_limits_are_set_aside(tmp_path: Path, bad: dict[str, Any]) -> None:
    """For a Claude Code run, caps that make no Limits leave its default caps; in a session record, they
    leave nothing to replay against (each move is reported, nothing raised)."""
    plain = audit_report(CC_RUN / "transcript.jsonl")
    assert [str(f) for f in audit_report(CC_RUN / "transcript.jsonl", limits=bad).findings] == \
        [str(f) for f in plain.findings]
    recs = records(write_scenario(tmp_path / "t.jsonl", "completed"))
    recs[0]["limits"] = {**recs[0]["limits"], **bad}
    found = [f for f in audit(recs) if f.code == "bad_event"]
    assert found and all("the session's limits cannot be read" in f.message for f in found)


def test_a_record_without_a_sequence_number_is_not_out_of_order(tool_trace: Trace) -> None:
    """Numbering is checked where there is a number: the record without one is passed over (the next
    number must still follow the last one seen)."""
    _path, recs = tool_trace
    del recs[3]["seq"]
    assert [f.line for f in audit(recs) if f.code == "seq_order"] == [5]


def test_a_gap_in_the_sequence_names_the_number_expected(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    del recs[4]
    message = the(audit(recs), "seq_order").message
    assert message == f"seq {recs[4]['seq']} follows seq {recs[3]['seq']} (expected {recs[3]['seq'] + 1})"


def test_a_run_cut_off_after_its_first_request_is_incomplete(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    kept = [r for r in recs[:line_of(recs, is_request)] if r["type"] != "transition"]
    assert [r["type"] for r in kept] == ["session", "message", "request"]
    assert the(audit(_renumbered(kept)), "incomplete_run").line == 3


def test_an_erased_prompt_and_a_message_of_no_conversation_role_stay_out_of_the_conversation(
        tool_trace: Trace) -> None:
    """A prompt a hook erased is recorded (kind erased_prompt) but never sent; neither is a message of a
    role the conversation has no place for."""
    _path, recs = tool_trace
    erased = {"type": "message", "uuid": "erased-1", "role": "user", "kind": "erased_prompt",
              "content": [{"type": "text", "text": "never sent"}]}
    other = {"type": "message", "uuid": "sys-1", "role": "system", "kind": "meta",
             "content": [{"type": "text", "text": "not a turn"}]}
    prompt = line_of(recs, lambda r: r["type"] == "message") - 1
    assert errors(audit(_renumbered([*recs[:prompt], erased, other, *recs[prompt:]]))) == []


def test_messages_the_file_lacks_are_reported_from_the_first(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    kept = [r for r in recs if not (r["type"] == "message" and r["kind"] in ("assistant", "tool_results")
                                    and r["seq"] < recs[line_of(recs, is_move("next_turn")) - 1]["seq"])]
    message = the(audit(_renumbered(kept)), "message_missing").message
    assert "added 2 message(s) the file does not record" in message
    assert "(first: assistant assistant [tool_use:toolu_" in message, message


@pytest.mark.parametrize("jump", [1, 2])
def test_a_counter_rising_by_more_than_one_is_a_jump(tmp_path: Path, jump: int) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    line = line_of(recs, is_move("next_turn"))
    _set_counter(recs[line - 1], "turn_count", 1 + jump)
    assert bool([f for f in audit(recs) if f.code == "counter_jump"]) == (jump > 1)


def test_turns_over_max_turns_are_reported_once_where_they_went_over(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "t.jsonl", "tool_turn")
    recs = records(path)
    over = [f for f in audit(recs, limits={"max_turns": 1}) if f.code == "turn_over_cap"]
    assert [f.line for f in over] == [line_of(recs, is_move("next_turn"))]


def test_a_move_into_stop_by_an_unknown_trigger_is_reported_not_raised(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    recs[line_of(recs, is_move("end_turn")) - 1]["trigger"] = "no_such_edge"
    assert the(audit(recs), "unknown_trigger")


def test_only_a_stop_hook_re_entry_leaves_stop_for_more_requests(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    stop = line_of(recs, is_move("settle"))
    forged = {"type": "transition", "from": "stop", "to": "assemble", "trigger": "next_turn", "kind": "reentry",
              "turn": 3}
    request = {**recs[line_of(recs, is_request) - 1]}
    findings = audit(_renumbered([*recs[:stop], forged, request, *recs[stop:]]))
    assert [f.line for f in findings if f.code == "request_after_stop"] == [stop + 2]


def test_a_missing_move_of_the_machines_own_is_named(tool_trace: Trace) -> None:
    """feedback decides at once on the batch's event: a trace that leaves its move out is caught at the
    next recorded event, or at the result when the run ends there."""
    _path, recs = tool_trace
    without = [r for r in recs if not (r["type"] == "transition" and r["trigger"] == "next_turn")]
    found = [f.message for f in audit(_renumbered(without)) if f.code == "replay_mismatch"]
    assert any("would first have moved on its own (next_turn); that move is missing" in m for m in found)
    cut = [*recs[:line_of(recs, is_move("next_turn")) - 1], recs[-1]]
    found = [f.message for f in audit(_renumbered(cut)) if f.code == "replay_mismatch"]
    assert "the run ended before the machine's own move next_turn" in found


@pytest.mark.parametrize("name", ["two_prompts", "reactive_compact", "tool_turn"])
def test_the_replay_ends_in_the_runs_own_state(tmp_path: Path, name: str) -> None:
    """Every run of a session is replayed from its own conversation (a second prompt's run too), so the
    replay ends where the run ended: the same snapshot and the same messages."""
    script, limits, _reason = SCENARIOS[name]
    path = tmp_path / f"{name}.jsonl"
    sim = Sim(path, limits)
    script(sim)
    sim.finish()
    sim.close()
    final: list[LoopState | None] = []

    class Watching(_Auditor):
        def _result(self, line: int, rec: Any) -> None:
            final.append(self.replay)
            super()._result(line, rec)

    assert errors(Watching(None).run(enumerate(records(path), 1))) == []
    last = final[-1]
    assert last is not None and last.snapshot() == sim.state.snapshot() and last.messages == sim.state.messages


def test_the_cli_wants_a_trace_and_require_full_wants_coverage(capsys: pytest.CaptureFixture[str],
                                                               tool_trace: Trace) -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2 and "give at least one TRACE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--require-full", str(tool_trace[0])])
    assert exc.value.code == 2 and "--require-full goes with --coverage" in capsys.readouterr().err


def _report(moves: tuple[MoveAt, ...] = (), reason: str | None = None, errors_: int = 0, warnings: int = 0,
            source: str = claude_code.TRANSCRIPT) -> Report:
    findings = tuple([Finding(1, "undeclared_move", "x")] * errors_ + [Finding(1, "graph_changed", "y")] * warnings)
    return Report("run.jsonl", source, moves, reason, {}, findings)


@pytest.mark.parametrize(("n_err", "n_warn", "verdict"), [(0, 0, "ok"), (1, 0, "1 error"), (2, 0, "2 errors"),
                                                          (0, 1, "ok, 1 warning"), (2, 2, "2 errors, 2 warnings")])
def test_a_summary_counts_errors_and_warnings_in_words(n_err: int, n_warn: int, verdict: str) -> None:
    assert summary_line(_report(errors_=n_err, warnings=n_warn, source="agentfsm")) == \
        f"run.jsonl: agentfsm trace, {verdict}"
    assert summary_line(_report(errors_=n_err, warnings=n_warn)).endswith(f"; {verdict}")


def test_a_claude_code_summary_names_its_re_entries_retries_and_end() -> None:
    moves = (MoveAt("call", "assemble", "call_model", 1), MoveAt("stream_retry", "stream", "call_model", 2),
             MoveAt("next_turn", "feedback", "assemble", 3), MoveAt("end_turn", "stream", "stop", 4))
    line = summary_line(_report(moves, "completed"))
    assert "4 moves; re-entries: next_turn ×1; retries: stream_retry ×1; ended completed (end_turn)" in line
    line = summary_line(_report(moves[:1], "completed"))
    assert "re-entries: none;" in line and "retries" not in line and "did not reach stop" in line


def test_coverage_of_a_claude_code_run_counts_its_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = CC_RUN / "transcript.jsonl"
    reason = audit_report(run).terminal_reason
    assert reason is not None
    main(["--coverage", "--json", str(run)])
    doc = json.loads(capsys.readouterr().out)
    assert doc["traces"] == 1
    assert {r["reason"]: r["count"] for r in doc["terminal_reasons"]} == \
        {r.value: int(r.value == reason) for r in TerminalReason}
    taken = {(e["trigger"], e["from"], e["to"]) for e in doc["edges"] if e["count"]}
    assert [m for m in doc["missing_edges"] if (m["trigger"], m["from"], m["to"]) in taken] == []
    assert len(doc["missing_edges"]) == len(doc["edges"]) - len(taken) > 0
    main(["--coverage", str(run)])
    out = capsys.readouterr().out
    assert f"declared edges exercised: {len(taken)}/{len(doc['edges'])} (1 trace)" in out
    assert f"     ×1  {reason}\n" in out and "  never  image_error\n" in out


def test_records_before_any_session_record_are_replayed_too(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    i = line_of(recs, is_move("dispatch")) - 1
    recs[i]["trigger"], recs[i]["to"] = "end_turn", "stop"
    assert [f for f in audit(recs[1:]) if f.code == "replay_mismatch"]


def test_what_a_move_record_leaves_out_or_adds_is_no_mismatch(tool_trace: Trace) -> None:
    """A move without its turn number keeps the last one; a field the state has not is not compared."""
    _path, recs = tool_trace
    rec = recs[line_of(recs, is_move("open_stream")) - 1]
    del rec["turn"]
    rec["changed"] = {**rec.get("changed", {}), "no_such_field": 1}
    assert errors(audit(recs)) == []


def test_a_result_before_any_move_into_stop_names_the_last_move(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    stop = line_of(recs, is_move("end_turn"))
    message = the(audit(_renumbered([*recs[:stop - 1], recs[-1]])), "result_before_stop").message
    assert message.endswith(f"while the loop is at 'stream' (line {stop - 1})")
    first = the(audit(_renumbered([recs[0], recs[1], recs[-1]])), "result_before_stop").message
    assert first.endswith("while the loop is at 'assemble'")


def test_a_result_whose_reason_is_no_terminal_reason_is_caught_even_when_the_move_agrees(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    for r in recs:
        if r.get("terminal_reason") is not None:
            r["terminal_reason"] = "bogus"
    found = [f.message for f in audit(recs) if f.code == "result_mismatch"]
    assert found == ["result terminal_reason 'bogus' is not a terminal reason"]


def test_a_request_after_a_result_that_came_too_early_is_caught(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    request = line_of(recs, is_request)
    findings = audit(_renumbered([*recs[:request - 1], recs[-1], recs[request - 1]]))
    assert "request sent after the result record at line" in the(findings, "request_after_stop").message


@pytest.mark.parametrize("messages", [None, "two", [1, {"role": "user"}]])
def test_a_request_whose_messages_cannot_be_read_is_a_bad_request(tool_trace: Trace, messages: Any) -> None:
    _path, recs = tool_trace
    recs[line_of(recs, is_request) - 1]["messages"] = messages
    assert "needs 'messages'" in the(audit(recs), "bad_request").message


def test_a_request_by_reference_must_name_messages_the_conversation_has(tool_trace: Trace) -> None:
    _path, recs = tool_trace
    first = line_of(recs, is_request, 1)
    rec = recs[first - 1]
    rec["messages"] = 0
    assert "carried 0 messages" in the(audit(recs), "bad_request").message
    rec["messages"], rec["last"] = 3, "someone-else"
    view = [r for r in recs[:first] if r["type"] == "message"]
    message = the(audit(recs), "bad_request").message
    assert message.endswith(f"the conversation's message 3 is {view[2]['uuid']!r}")


def test_two_answers_in_a_row_are_caught_wherever_they_are(tool_trace: Trace) -> None:
    """An assistant message right after another is reported at its place, the conversation's second
    message included; a lone assistant message is not two in a row."""
    _path, recs = tool_trace
    answer = {"type": "message", "uuid": "a-0", "role": "assistant", "kind": "assistant",
              "content": [{"type": "text", "text": "early"}]}
    second = {**answer, "uuid": "a-1"}
    request = {"type": "request", "model": MODEL, "depth": 0, "messages": 2, "last": "a-1", "queued": []}
    found = [f.message for f in audit(_renumbered([recs[0], answer, second, request])) if f.code == "role_order"]
    assert any(m.startswith("conversation message 1 (a-1)") for m in found), found
    lone = _renumbered([recs[0], answer, {**request, "messages": 1, "last": "a-0"}])
    assert not [f for f in audit(lone) if f.code == "role_order" and f.message.startswith("conversation message")]


def test_a_reports_counters_are_those_after_its_last_move(tool_trace: Trace) -> None:
    path, recs = tool_trace
    rewrite(path, recs[:line_of(recs, is_move("next_turn"))])  # cut off right after the second turn began
    assert audit_report(path).counters["turn_count"] == 2


def test_a_trace_of_another_declaration_is_checked_but_not_replayed(tool_trace: Trace) -> None:
    """A route renamed since the trace was recorded is no error there (its moves are checked against the
    current edges only); under the current declaration the same record is a replay mismatch."""
    _path, recs = tool_trace
    recs[line_of(recs, is_move("dispatch")) - 1]["route"] = "an_older_guard"
    assert the(audit(recs), "replay_mismatch")
    recs[0]["graph"] = "0000000000000000"
    assert [f.code for f in audit(recs)] == ["graph_changed"]


def test_after_a_move_that_could_not_be_replayed_the_replay_resumes_from_the_recorded_conversation(
        tmp_path: Path) -> None:
    """The move after an unreadable one is replayed from the recorded phase and counters and the
    conversation the records rebuild: a reactive compaction, which needs a response in the history, is
    still the move the machine makes there."""
    recs = records(write_scenario(tmp_path / "t.jsonl", "reactive_compact"))
    ptl = line_of(recs, is_move("reactive_compact_retry"))
    before = max(i for i, r in enumerate(recs[:ptl - 1], 1) if r["type"] == "transition")
    recs[before - 1]["event"] = {"type": "no_such_event"}
    findings = audit(recs)
    assert [f.line for f in findings if f.code == "bad_event"] == [before]
    # phase, counters and query depth all come back: nothing at all is reported at the next move
    assert [f.message for f in findings if f.line == ptl] == []
    # a depth recorded as a boolean is not taken for a depth: the replay keeps its own, and says so
    recs[before - 1].setdefault("changed", {})["depth"] = True
    findings = audit(recs)
    assert [f.code for f in findings if f.line == ptl] == ["replay_mismatch"]
    assert "depth True (replay: " in next(f.message for f in findings if f.line == ptl)
