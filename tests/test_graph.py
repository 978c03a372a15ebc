"""The declared graph and its pure rules, without I/O."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import graph, prompts
from fsm.events import (
    Aborted,
    Assembled,
    CallFailed,
    Compaction,
    ModelError,
    ModelResponse,
    Refused,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    StreamOpened,
    ToolsDrained,
)
from fsm.graph import EDGES, LoopMachine, Step, UndeclaredMove, decide
from fsm.state import COUNTER_CAPS, Limits, LoopState, Message, Phase, TerminalReason

LIM = Limits()
TEXT = ({"type": "text", "text": "done"},)
USE = ({"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/x"}},)


def run(state: LoopState, *events, limits: Limits = LIM) -> tuple[LoopState, list[str]]:
    m = LoopMachine(state)
    labels = []
    for ev in events:
        step, state = m.step(ev, limits)
        labels.append(step.trigger)
    return state, labels


def start() -> LoopState:
    return LoopState(messages=(Message("user", "hi"),))


def drained() -> ToolsDrained:
    return ToolsDrained(assistant=Message("assistant", USE, kind="assistant"),
                        results=Message("user", ({"type": "tool_result", "tool_use_id": "toolu_1",
                                                  "content": "ok"},), kind="tool_results"))


def to_stream(state: LoopState | None = None) -> tuple[LoopState, LoopMachine]:
    m = LoopMachine(state or start())
    m.step(Assembled(), LIM)
    m.step(StreamOpened(), LIM)
    return m.state, m


def test_machine_declares_exactly_the_edges() -> None:
    spec = graph.machine_spec()
    declared = {(t["trigger"], s, t["dest"]) for t in spec["transitions"] for s in t["source"]}
    expected = {(e.trigger, s.value, e.dest.value) for e in EDGES for s in e.sources}
    assert declared == expected
    assert {"next_turn", "reactive_compact_retry", "max_output_tokens_recovery", "malformed_tool_use_retry",
            "thinking_only_nudge", "stop_hook_blocking"} <= graph.REENTRY_LABELS


def test_every_terminal_reason_has_an_edge() -> None:
    reachable = set().union(*(e.reasons for e in EDGES))
    assert reachable == set(TerminalReason)


def test_undeclared_move_raises() -> None:
    m = LoopMachine(start())
    with pytest.raises(UndeclaredMove):
        m.apply(Step("dispatch", attrs.evolve(m.state, phase=Phase.DISPATCH_TOOLS)))
    with pytest.raises(UndeclaredMove):
        m.apply(Step("teleport", m.state))  # type: ignore[arg-type]
    with pytest.raises(UndeclaredMove):
        decide(m.state, StreamOpened(), LIM)  # not an event of assemble
    assert m.phase is Phase.ASSEMBLE


def test_text_answer_completes() -> None:
    s, labels = run(start(), Assembled(), StreamOpened(),
                    StreamEnded(ModelResponse(TEXT, "end_turn")))
    assert labels == ["call", "open_stream", "end_turn"]
    assert s.terminal_reason is TerminalReason.COMPLETED
    assert s.messages[-1].text() == "done"


def test_tool_turn_pairs_and_resets_counters() -> None:
    s0 = attrs.evolve(start(), max_output_tokens_recovery_count=2, thinking_only_nudged=True,
                      has_attempted_reactive_compact=True, stop_hook_blocking_count=3)
    s, labels = run(s0, Assembled(), StreamOpened(), StreamEnded(ModelResponse(USE, "tool_use")),
                    drained(), drained())
    assert labels == ["call", "open_stream", "dispatch", "collect", "next_turn"]
    assert s.turn_count == 2 and s.transition == "next_turn"
    assert (s.max_output_tokens_recovery_count, s.thinking_only_nudged, s.has_attempted_reactive_compact,
            s.stop_hook_blocking_count) == (0, False, False, 0)
    assert [m.role for m in s.messages] == ["user", "assistant", "user"]
    assert s.messages[1].tool_use_ids() == s.messages[2].tool_result_ids()


def test_max_turns_ends_after_the_tools_ran() -> None:
    lim = Limits(max_turns=1)
    s, labels = run(start(), Assembled(), StreamOpened(), StreamEnded(ModelResponse(USE, "tool_use")),
                    drained(), drained(), limits=lim)
    assert labels[-1] == "finish_batch"
    assert s.terminal_reason is TerminalReason.MAX_TURNS
    assert s.messages[-1].tool_result_ids() == ["toolu_1"]


def test_invalid_structured_output_call_counts_towards_its_cap() -> None:
    call = ({"type": "tool_use", "id": "so_1", "name": "StructuredOutput", "input": {}},)
    failed = {"type": "tool_result", "tool_use_id": "so_1", "is_error": True,
              "content": "InputValidationError"}
    bad = ToolsDrained(assistant=Message("assistant", call, kind="assistant"),
                       results=Message("user", (failed,), kind="tool_results"))
    turn = (Assembled(), StreamOpened(), StreamEnded(ModelResponse(call, "tool_use")), bad, bad)
    lim = Limits(structured_output_retries=1)
    s, labels = run(start(), *turn, limits=lim)
    assert labels[-1] == "next_turn" and s.structured_output_retry_count == 1
    s, labels = run(s, *turn, limits=lim)
    assert labels[-1] == "finish_batch"
    assert s.terminal_reason is TerminalReason.STRUCTURED_OUTPUT_RETRY_EXHAUSTED
    # a normal tool turn still resets the count
    s, _ = run(attrs.evolve(start(), structured_output_retry_count=1), Assembled(), StreamOpened(),
               StreamEnded(ModelResponse(USE, "tool_use")), drained(), drained(), limits=lim)
    assert s.structured_output_retry_count == 0


def test_max_tokens_recovers_up_to_cap_then_api_error() -> None:
    cut = StreamEnded(ModelResponse(({"type": "text", "text": "part"},), "max_tokens"))
    s, m = to_stream()
    for i in range(3):
        step, s = m.step(cut, LIM)
        assert step.trigger == "max_output_tokens_recovery"
        assert s.max_output_tokens_recovery_count == i + 1
        assert prompts.MAX_TOKENS_RESUME in s.messages[-1].content[0]["text"]
        m.step(Assembled(), LIM)
        m.step(StreamOpened(), LIM)
    step, s = m.step(cut, LIM)
    assert step.trigger == "recovery_exhausted" and s.terminal_reason is TerminalReason.API_ERROR
    assert [x.text() for x in s.messages if x.role == "assistant"] == ["part"] * 4


@pytest.mark.parametrize("cap", [1, 2])
def test_malformed_tool_use_clean_retry(cap: int) -> None:
    bad = StreamEnded(ModelResponse(({"type": "text", "text": "calling"},), "tool_use"))
    lim = Limits(malformed_tool_use_retries=cap)
    s, m = to_stream()
    for _ in range(cap):
        step, s = m.step(bad, lim)
        assert step.trigger == "malformed_tool_use_retry"
        assert not any(x.role == "assistant" for x in s.messages)  # the failed message is dropped
        m.step(Assembled(), lim)
        m.step(StreamOpened(), lim)
    step, s = m.step(bad, lim)
    assert s.terminal_reason is TerminalReason.MALFORMED_TOOL_USE_EXHAUSTED


def test_unparsable_sibling_still_dispatches() -> None:
    resp = ModelResponse((*USE, {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}}),
                         "tool_use", invalid_tool_inputs={"toolu_2": '{"file_'})
    _s, m = to_stream()
    step, _ = m.step(StreamEnded(resp), LIM)
    assert step.trigger == "dispatch"


def test_thinking_only_nudged_once() -> None:
    think = StreamEnded(ModelResponse(({"type": "thinking", "thinking": "hm", "signature": "s"},),
                                      "end_turn"))
    s, m = to_stream()
    step, s = m.step(think, LIM)
    assert step.trigger == "thinking_only_nudge" and s.thinking_only_nudged
    assert [x.role for x in s.messages] == ["user", "user"]  # thinking dropped, nudge added
    m.step(Assembled(), LIM)
    m.step(StreamOpened(), LIM)
    step, s = m.step(think, LIM)
    assert step.trigger == "end_turn" and s.terminal_reason is TerminalReason.COMPLETED


def test_stop_hook_blocks_until_cap_then_completes() -> None:
    lim = Limits(stop_hook_block_cap=2)
    s, m = to_stream()
    labels = []
    for _ in range(3):
        m.step(StreamEnded(ModelResponse(TEXT, "end_turn")), lim)
        step, s = m.step(StopHookVerdict(blocked=True, reason="run tests"), lim)
        labels.append(step.trigger)
        if s.phase is Phase.STOP:
            break
        m.step(Assembled(), lim)
        m.step(StreamOpened(), lim)
    assert labels == ["stop_hook_blocking", "stop_hook_blocking", "settle"]
    assert s.terminal_reason is TerminalReason.COMPLETED and s.stop_hook_blocking_count == 2
    assert s.turn_count == 3 and s.stop_hook_active


def test_stop_hook_max_turns_wins() -> None:
    lim = Limits(max_turns=1)
    s, m = to_stream()
    m.step(StreamEnded(ModelResponse(TEXT, "end_turn")), lim)
    step, s = m.step(StopHookVerdict(blocked=True, reason="again"), lim)
    assert step.trigger == "settle" and s.terminal_reason is TerminalReason.MAX_TURNS


def test_stop_hook_prevented() -> None:
    s, m = to_stream()
    m.step(StreamEnded(ModelResponse(TEXT, "end_turn")), LIM)
    _, s = m.step(StopHookVerdict(prevented=True, stop_reason="enough"), LIM)
    assert s.terminal_reason is TerminalReason.STOP_HOOK_PREVENTED and s.terminal_detail == "enough"


def test_reactive_compact_only_with_history_and_once() -> None:
    ptl = ModelError("prompt_too_long", "prompt is too long", 400)
    s = start()
    assert not graph.may_reactive_compact(s)
    long = attrs.evolve(s, messages=(Message("user", "a"), Message("assistant", TEXT, kind="assistant"),
                                     Message("user", "b"), Message("assistant", USE, kind="assistant"),
                                     Message("user", ({"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": "x"},))))
    assert graph.may_reactive_compact(long)
    m = LoopMachine(long)
    m.step(Assembled(), LIM)
    comp = Compaction(messages=(Message("user", "summary"), *long.messages[3:]), trigger="reactive")
    step, s2 = m.step(CallFailed(ptl, compaction=comp), LIM)
    assert step.trigger == "reactive_compact_retry" and s2.has_attempted_reactive_compact
    assert s2.messages[0].text() == "summary"
    m.step(Assembled(), LIM)
    assert not graph.may_reactive_compact(m.state)
    step, s3 = m.step(CallFailed(ptl), LIM)
    assert s3.terminal_reason is TerminalReason.PROMPT_TOO_LONG


def test_stream_retry_capped_then_fallback_then_error() -> None:
    broke = ModelError("connection", "reset", None, True)
    lim = Limits(stream_retries=1)
    s, m = to_stream()
    step, s = m.step(CallFailed(broke, fallback_available=True), lim)
    assert step.trigger == "stream_retry" and s.phase is Phase.CALL_MODEL
    m.step(StreamOpened(), lim)
    step, s = m.step(CallFailed(broke, fallback_available=True), lim)
    assert step.trigger == "fallback_retry" and s.model_index == 1 and s.stream_retry_count == 0
    step, s = m.step(CallFailed(ModelError("overloaded", "busy", 529, True)), lim)
    assert s.terminal_reason is TerminalReason.API_ERROR


def test_refusals_and_setup_failures() -> None:
    for reason in (TerminalReason.BLOCKING_LIMIT, TerminalReason.BUDGET_EXHAUSTED,
                   TerminalReason.BACKGROUND_REQUESTED):
        m = LoopMachine(start())
        m.step(Assembled(), LIM)
        step, s = m.step(Refused(reason, "no"), LIM)
        assert step.trigger == "refuse" and s.terminal_reason is reason
    m = LoopMachine(start())
    step, s = m.step(SetupFailed(TerminalReason.HOOK_STOPPED, "blocked"), LIM)
    assert step.trigger == "prompt_blocked"
    with pytest.raises(UndeclaredMove):
        decide(start(), SetupFailed(TerminalReason.COMPLETED, "x"), LIM)


def test_abort_requires_pairing() -> None:
    s, m = to_stream()
    with pytest.raises(UndeclaredMove):
        decide(s, Aborted(partial=Message("assistant", USE, kind="assistant")), LIM)
    res = Message("user", ({"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                            "content": "interrupted"},))
    _, s = m.step(Aborted(partial=Message("assistant", USE, kind="assistant"), partial_results=res), LIM)
    assert s.terminal_reason is TerminalReason.ABORTED_STREAMING
    assert s.messages[-2].tool_use_ids() == s.messages[-1].tool_result_ids()


def test_rapid_refill_breaker() -> None:
    lim = Limits(rapid_refill_max=1)
    comp = Compaction(messages=(Message("user", "summary"),), trigger="auto")
    s, _ = run(start(), Assembled(compaction=comp, rapid_refill=True), limits=lim)
    assert s.terminal_reason is TerminalReason.RAPID_REFILL_BREAKER


# --- properties ------------------------------------------------------------------------------

responses = st.sampled_from([
    ModelResponse(TEXT, "end_turn"),
    ModelResponse(USE, "tool_use"),
    ModelResponse(({"type": "text", "text": "part"},), "max_tokens"),
    ModelResponse(({"type": "text", "text": "x"},), "tool_use"),
    ModelResponse(({"type": "thinking", "thinking": "t", "signature": "s"},), "end_turn"),
])
call_errors = st.sampled_from([
    ModelError("prompt_too_long", "prompt is too long", 400),
    ModelError("connection", "reset", None, True),
    ModelError("api", "bad request", 400),
    ModelError("overloaded", "busy", 529, True),
])


@st.composite
def limits_st(draw: st.DrawFn) -> Limits:
    return Limits(max_turns=draw(st.one_of(st.none(), st.integers(1, 4))),
                  max_output_tokens_recoveries=draw(st.integers(0, 3)),
                  malformed_tool_use_retries=draw(st.integers(0, 2)),
                  stop_hook_block_cap=draw(st.integers(0, 3)), stream_retries=draw(st.integers(0, 2)))


@settings(max_examples=300, deadline=None)
@given(limits=limits_st(), data=st.data())
def test_random_runs_respect_caps_and_declared_moves(limits: Limits, data: st.DataObject) -> None:
    m = LoopMachine(start())
    for _ in range(60):
        s = m.state
        phase = s.phase
        if phase is Phase.ASSEMBLE:
            ev = Assembled()
        elif phase is Phase.CALL_MODEL:
            ev = data.draw(st.sampled_from([StreamOpened(), CallFailed(data.draw(call_errors))]))
        elif phase is Phase.STREAM:
            ev = data.draw(st.one_of(responses.map(StreamEnded),
                                     call_errors.map(lambda e: CallFailed(e, fallback_available=False))))
        elif phase in (Phase.DISPATCH_TOOLS, Phase.FEEDBACK):
            ev = drained()
        else:
            if m.state.terminal_reason is not TerminalReason.COMPLETED or not data.draw(st.booleans()):
                break
            ev = StopHookVerdict(blocked=True, reason="more")
        before = m.phase
        step, after = m.step(ev, limits)
        assert before in step.edge.sources and after.phase is step.edge.dest
        for counter, cap_name in COUNTER_CAPS.items():
            value = after.counters().get(counter)
            cap = getattr(limits, cap_name)
            if value is not None and cap is not None:
                assert value <= cap, (counter, value, cap)
        if limits.max_turns is not None:
            assert after.turn_count <= limits.max_turns
        if after.phase is Phase.STOP:
            assert after.terminal_reason in step.edge.reasons
        roles = [x.role for x in after.messages]
        for a, b in zip(after.messages, after.messages[1:], strict=False):
            if a.role == "assistant" and a.tool_use_ids():
                assert b.role == "user" and sorted(b.tool_result_ids()) == sorted(a.tool_use_ids())
        assert roles[0] == "user"
