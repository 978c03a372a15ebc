"""The kit's loop harness and invariant checks (``agentfsm.testing.stateful``): they pass sound runs and
name every kind of broken one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, run_state_machine_as_test

from agentfsm.auditing.audit import audit_file
from agentfsm.hooks import HookMatcher
from agentfsm.llm.model import ModelRequest
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, Message
from agentfsm.testing import HttpErrorResponse, StreamedResponse, TextBlock, text_response, tool_response
from agentfsm.testing.stateful import (
    AgentLoopStateMachine,
    LoopHarness,
    LoopRun,
    ObservedRequest,
    RequestContext,
    _StepChecker,
    assert_invariants,
    invariant_violations,
    run_loop,
    wire_problems,
)
from agentfsm.tools.base import tool

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
               "additionalProperties": False}


@tool("Echo", "Repeat the text.", ECHO_SCHEMA, concurrency_safe=True)
async def echo(inp: Mapping[str, Any], ctx: Any) -> str:
    return str(inp["text"])


def _echo(tid: str) -> StreamedResponse:
    return tool_response(tid, "Echo", {"text": tid})


def _user(*blocks: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _assistant(*blocks: Mapping[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


USE = {"type": "tool_use", "id": "t1", "name": "Echo", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
TEXT = {"type": "text", "text": "hi"}


# --- wire_problems -------------------------------------------------------------------------------


def test_wire_problems_passes_a_paired_conversation() -> None:
    assert wire_problems([_user(TEXT), _assistant(TEXT, USE), _user(RESULT, TEXT)]) == []


@pytest.mark.parametrize(("messages", "expected"), [
    ([_assistant(TEXT)], "roles must alternate"),
    ([_user(TEXT), _user(TEXT)], "roles must alternate"),
    ([_user(TEXT), _assistant(TEXT)], "ends with a 'assistant' message"),
    ([_user(TEXT), _assistant(USE), _user(TEXT)], "has 0 tool_results"),
    ([_user(TEXT), _assistant(USE), _user(RESULT, RESULT)], "has 2 tool_results"),
    ([_user(RESULT)], "answers no tool_use"),
    ([_user(TEXT), _assistant(USE), _user(RESULT), _assistant(USE), _user(RESULT)], "occurs twice"),
])
def test_wire_problems_names_each_breakage(messages: Sequence[Mapping[str, Any]], expected: str) -> None:
    problems = wire_problems(messages)
    assert any(expected in p for p in problems), problems


def test_wire_problems_allows_a_trailing_assistant_in_a_history() -> None:
    assert wire_problems([_user(TEXT), _assistant(TEXT)], ends_with_user=False) == []


# --- the step checker ----------------------------------------------------------------------------


def _move(frm: str, to: str, trigger: str, reason: str | None = None, **counters: int) -> dict[str, Any]:
    return {"type": "transition", "from": frm, "to": to, "trigger": trigger, "turn": counters.pop("turn", 1),
            "counters": counters, "terminal_reason": reason}


def _feed(limits: Limits, *records: Mapping[str, Any]) -> list[str]:
    checker = _StepChecker(limits)
    checker.feed({"type": "message", "kind": "prompt", "role": "user", "content": []})
    for r in records:
        checker.feed(r)
    return checker.violations


def test_step_checker_accepts_a_declared_path() -> None:
    assert _feed(Limits(), _move("assemble", "call_model", "call"),
                 _move("call_model", "stream", "open_stream"),
                 _move("stream", "stop", "end_turn", "completed")) == []


@pytest.mark.parametrize(("records", "expected"), [
    ([_move("assemble", "stream", "call")], "not a declared edge"),
    ([_move("assemble", "call_model", "teleport")], "not a declared trigger"),
    ([_move("call_model", "stream", "open_stream")], "starts at 'call_model' but the loop was at 'assemble'"),
    ([_move("assemble", "call_model", "call", malformed_tool_use_retry_count=3)],
     "exceeds malformed_tool_use"),
    ([_move("assemble", "call_model", "call", turn=3)], "exceeds max_turns=2"),
    ([_move("assemble", "call_model", "call", stream_retry_count=0),
      _move("call_model", "stream", "open_stream", stream_retry_count=1)],
     "stream_retry_count rose 0 → 1; only stream_retry raise it"),
    ([_move("assemble", "call_model", "call"), _move("call_model", "stream", "open_stream"),
      _move("stream", "stop", "end_turn", "api_error")], "does not allow"),
    ([_move("assemble", "call_model", "call"), _move("call_model", "stream", "open_stream"),
      _move("stream", "stop", "end_turn", "completed"), {"type": "request", "messages": []}],
     "request was recorded after the loop reached stop"),
])
def test_step_checker_names_each_breakage(records: list[Mapping[str, Any]], expected: str) -> None:
    violations = _feed(Limits(max_turns=2), *records)
    assert any(expected in v for v in violations), violations


# --- invariant_violations on real runs, then tampered ----------------------------------------------


@pytest.fixture(scope="module")
def sound_run() -> LoopRun:
    return run_loop([_echo("toolu_1"), text_response("done")], tools=[echo])


def test_a_sound_run_has_no_violations(sound_run: LoopRun) -> None:
    assert invariant_violations(sound_run) == []
    assert sound_run.path() == ["call", "open_stream", "dispatch", "collect", "next_turn", "call",
                                "open_stream", "end_turn", "settle"]
    [ex] = sound_run.tool_exchanges()
    assert (ex.name, ex.text, ex.is_error) == ("Echo", "toolu_1", False)


def _replace_request(run: LoopRun, i: int, **changes: Any) -> LoopRun:
    requests = list(run.requests)
    requests[i] = attrs.evolve(requests[i], **changes)
    return attrs.evolve(run, requests=tuple(requests))


def _tamper_record(run: LoopRun, predicate: Any, change: Any) -> LoopRun:
    def fix(recs: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
        return tuple(change(r) if predicate(r) else r for r in recs)

    return attrs.evolve(run, records=fix(run.records), file_records=fix(run.file_records))


def _unpaired(run: LoopRun) -> LoopRun:
    req = run.requests[1].request
    messages = [*req.messages[:-1], {"role": "user", "content": [{"type": "text", "text": "no results"}]}]
    return _replace_request(run, 1, request=attrs.evolve(req, messages=tuple(messages)))


def _over_cap(run: LoopRun) -> LoopRun:
    return _tamper_record(run, lambda r: r.get("type") == "transition" and r.get("trigger") == "next_turn",
                          lambda r: {**r, "changed": {**r["changed"], "stop_hook_blocking_count": 99}})


def _undeclared(run: LoopRun) -> LoopRun:
    return _tamper_record(run, lambda r: r.get("type") == "transition" and r.get("trigger") == "collect",
                          lambda r: {**r, "trigger": "next_turn"})


@pytest.mark.parametrize(("tamper", "expected"), [
    (_unpaired, "has 0 tool_results"),
    (lambda run: _replace_request(run, 1, phase="stop"), "sent after the loop reached stop"),
    (_over_cap, "counter_over_cap"),
    (_undeclared, "undeclared_move"),
    (lambda run: attrs.evolve(run, result=attrs.evolve(run.result, subtype="error_max_turns")),
     "TERMINAL_INFO says"),
    (lambda run: attrs.evolve(run, records=tuple(r for r in run.records if r.get("type") != "request")),
     "the trace records 0 requests but the model received 2"),
    (lambda run: attrs.evolve(run, state=attrs.evolve(run.state, messages=(
        *run.state.messages, Message("assistant", (dict(USE, id="toolu_1"),)))),),
     "history after the run"),
], ids=["unpaired", "request_after_stop", "over_cap", "undeclared", "subtype", "request_count", "history"])
def test_invariant_violations_name_each_tampering(sound_run: LoopRun, tamper: Any, expected: str) -> None:
    problems = invariant_violations(tamper(sound_run))
    assert any(expected in p for p in problems), problems


def test_assert_invariants_saves_the_trace_for_the_auditor(sound_run: LoopRun) -> None:
    with pytest.raises(AssertionError, match="trace saved to ") as caught:
        assert_invariants(_undeclared(sound_run))
    saved = Path(str(caught.value).rsplit("trace saved to ", 1)[1].strip())
    assert any(f.code == "undeclared_move" for f in audit_file(saved))


# --- the harness --------------------------------------------------------------------------------


def test_run_loop_without_trace_dir_leaves_nothing_behind(sound_run: LoopRun) -> None:
    assert sound_run.trace_path is not None and not sound_run.trace_path.exists()
    assert sound_run.file_records[0]["type"] == "session"


def test_run_loop_keeps_traces_in_trace_dir(tmp_path: Path) -> None:
    run = run_loop([text_response("hello")], trace_dir=tmp_path)
    assert run.trace_path is not None and run.trace_path.parent == tmp_path
    assert [f for f in audit_file(run.trace_path) if f.is_error] == []


def test_the_harness_needs_a_trace(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sessions_dir"):
        LoopHarness(Options(cwd=tmp_path))


def test_compaction_requests_are_observed_as_such() -> None:
    ptl = HttpErrorResponse(400, "invalid_request_error", "prompt is too long: 300000 tokens > 200000")
    run = run_loop([_echo("toolu_1"), _echo("toolu_2"), ptl, text_response("done")], tools=[echo])
    assert_invariants(run)
    kinds = [(r.kind, r.phase) for r in run.requests]
    assert ("compaction", "call_model") in kinds
    assert "reactive_compact_retry" in run.path()


def test_on_request_sees_every_request_and_can_type_input() -> None:
    seen: list[tuple[int, str]] = []

    def typist(ctx: RequestContext) -> None:
        seen.append((ctx.index, ctx.kind))
        if ctx.index == 0:
            ctx.harness.session.submit("also say bye")

    run = run_loop([_echo("toolu_1"), text_response("bye")], tools=[echo], on_request=typist)
    assert_invariants(run)
    assert seen == [(0, "main"), (1, "main")]
    last = run.requests[-1].request.messages[-1]
    assert "also say bye" in str(last["content"])


def test_a_factory_script_is_asked_per_request() -> None:
    asked: list[int] = []

    def answer(request: ModelRequest, n: int) -> StreamedResponse:
        asked.append(n)
        return _echo(f"toolu_{n}") if n < 2 else text_response("done")

    run = run_loop(answer, tools=[echo])
    assert_invariants(run)
    assert asked == [0, 1, 2] and run.terminal_reason == "completed"


def test_observed_requests_record_what_was_answered(sound_run: LoopRun) -> None:
    first: ObservedRequest = sound_run.requests[0]
    assert (first.index, first.kind, first.phase) == (0, "main", "call_model")
    assert isinstance(first.response, StreamedResponse) and first.response.stop_reason == "tool_use"


# --- the state machine --------------------------------------------------------------------------


QUIET = settings(max_examples=8, stateful_step_count=4, deadline=None,
                 suppress_health_check=list(HealthCheck))


def test_a_subclass_runs_its_tools_hooks_and_checks() -> None:
    stops: list[bool] = []
    checked: list[str] = []

    async def on_stop(inp: Any) -> None:
        stops.append(inp.stop_hook_active)

    class EchoMachine(AgentLoopStateMachine):
        tools = [echo]
        hooks = {"Stop": [HookMatcher(None, [on_stop])]}
        limits = Limits(max_turns=3)

        def interrupt_strategy(self) -> st.SearchStrategy[int | None]:
            return st.none()

        def check_run(self, run: LoopRun) -> None:
            checked.append(run.terminal_reason)
            assert run.limits.max_turns == 3

        @invariant()
        def history_only_grows(self) -> None:
            if self.last_run is not None:
                assert len(self.harness.session.history) >= 1

    run_state_machine_as_test(EchoMachine, settings=QUIET)
    assert checked and stops


def test_a_broken_user_invariant_fails_the_machine() -> None:
    class Impossible(AgentLoopStateMachine):
        tools = [echo]

        def check_run(self, run: LoopRun) -> None:
            assert run.terminal_reason == "no such reason", "user invariant broken"

    with pytest.raises(AssertionError, match="user invariant broken"):
        run_state_machine_as_test(Impossible, settings=QUIET)


def test_response_strategy_can_be_narrowed() -> None:
    texts: list[str] = []

    class OnlyText(AgentLoopStateMachine):
        def response_strategy(self) -> st.SearchStrategy[Any]:
            return st.just(StreamedResponse(blocks=(TextBlock("fixed"),)))

        def interrupt_strategy(self) -> st.SearchStrategy[int | None]:
            return st.none()

        def check_run(self, run: LoopRun) -> None:
            texts.append(run.result.result or "")
            assert run.terminal_reason == "completed"

    run_state_machine_as_test(OnlyText, settings=QUIET)
    assert texts and set(texts) <= {"fixed", "SCENARIO_EXHAUSTED"}


def test_subagent_requests_are_told_apart() -> None:
    call = tool_response("toolu_a", "Agent", {"description": "look", "prompt": "look around",
                                              "subagent_type": "general-purpose", "run_in_background": False})
    script = [call, text_response("sub answer"), text_response("parent done")]
    run = run_loop(script, builtin_tools=("Agent",))
    assert_invariants(run)
    assert [r.kind for r in run.requests] == ["main", "subagent", "main"]
    assert run.tool_exchanges()[0].text.startswith("sub answer")
