"""The declared graph and its pure rules, without I/O."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.machine import graph, prompts
from agentfsm.machine.events import (
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
from agentfsm.machine.graph import EDGES, LoopMachine, Step, UndeclaredMove, decide
from agentfsm.machine.state import COUNTER_CAPS, Limits, LoopState, Message, Phase, TerminalReason

LIM = Limits()
TEXT = ({"type": "text", "text": "done"},)
USE = ({"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/x"}},)


def run(state: LoopState, *events, limits: Limits = LIM) -> tuple[LoopState, list[str]]:
    labels = []
    with LoopMachine(state) as m:
        for ev in events:
            labels += [step.trigger for step in m.fire(ev, limits)]
        return m.state, labels


def no_change(_s: LoopState, _e: object, _lim: Limits) -> dict[str, object]:
    return {}


def fire(m: LoopMachine, event, limits: Limits = LIM) -> tuple[Step, LoopState]:
    """The last step ``event`` caused, and the state after it."""
    return m.fire(event, limits)[-1], m.state


def start() -> LoopState:
    return LoopState(messages=(Message("user", "hi"),))


def drained() -> ToolsDrained:
    return ToolsDrained(assistant=Message("assistant", USE, kind="assistant"),
                        results=Message("user", ({"type": "tool_result", "tool_use_id": "toolu_1",
                                                  "content": "ok"},), kind="tool_results"))


def to_stream(state: LoopState | None = None) -> tuple[LoopState, LoopMachine]:
    m = LoopMachine(state or start())
    m.fire(Assembled(), LIM)
    m.fire(StreamOpened(), LIM)
    return m.state, m


def test_machine_runs_exactly_the_routes() -> None:
    """Every route is one transitions transition per source, triggered by its event's name, in
    declared order; its destination is its edge's."""
    declared = [(r.event.__name__, s.value, graph.EDGES_BY_TRIGGER[r.edge].dest.value)
                for r in graph.ROUTES for s in r.sources]
    built = []
    for name, event in graph.MACHINE.events.items():
        for src, transitions in event.transitions.items():
            built += [(name, src, t.dest) for t in transitions]
    assert sorted(built) == sorted(declared)
    for (phase, ev), routes in graph.ROUTES_BY_KEY.items():
        transitions = graph.MACHINE.events[ev.__name__].transitions[phase.value]
        assert [len(t.conditions) for t in transitions] == [int(r.guard is not None) for r in routes]
    assert {"next_turn", "reactive_compact_retry", "max_output_tokens_recovery", "malformed_tool_use_retry",
            "thinking_only_nudge", "stop_hook_blocking"} <= graph.REENTRY_LABELS


def test_transitions_runs_each_move() -> None:
    """A loop's move is transitions' own event processing, not a walk of its lists: a callback that
    only transitions runs (a transition's ``after``, the machine's ``finalize_event``) is run by
    LoopMachine.fire, with the event data transitions builds."""
    seen: list[tuple[str, str]] = []
    (first,) = graph.MACHINE.events["Assembled"].transitions[Phase.ASSEMBLE.value][-1:]
    first.after.append(lambda ed: seen.append(("after", ed.model.record.phase.value)))
    graph.MACHINE.finalize_event.append(lambda ed: seen.append(("finalize", type(ed.kwargs["event"]).__name__)))
    try:
        with LoopMachine(start()) as m:
            m.fire(Assembled(), LIM)
    finally:
        first.after.pop()
        graph.MACHINE.finalize_event.pop()
    assert seen == [("after", Phase.CALL_MODEL.value), ("finalize", "Assembled")]


def test_firing_agrees_with_transitions_own_trigger() -> None:
    """A conversation fired by LoopMachine and by ``transitions`` itself (the model added to MACHINE,
    its trigger called) takes the same steps to the same states."""
    events = [Assembled(), StreamOpened(), StreamEnded(ModelResponse(USE, "tool_use")), drained(), Assembled(),
              StreamOpened(), StreamEnded(ModelResponse(TEXT, "end_turn")), StopHookVerdict()]
    s0 = start()
    with LoopMachine(s0) as m:
        ours = [step for ev in events for step in m.fire(ev, LIM)]
    model = type("Model", (graph.LoopModel,), {})(s0)  # with a __dict__ for transitions' bound triggers
    graph.MACHINE.add_model(model, initial=model.record.phase.value)
    try:
        theirs = []
        for ev in events:
            automatic = False
            while True:
                model.step = None
                assert graph.MACHINE.events[type(ev).__name__].trigger(model, event=ev, limits=LIM,
                                                                         automatic=automatic)
                theirs.append(model.step)
                if model.record.phase not in graph.AUTOMATIC:
                    break
                automatic = True
    finally:
        graph.MACHINE.remove_model(model)
    def facts(steps: list[Step]) -> list[tuple[object, ...]]:  # a response's message gets a fresh uuid each time
        return [(s.trigger, s.route, s.automatic, s.notices, s.state.phase, s.state.turn_count,
                 [(m.role, m.kind, m.content) for m in s.state.messages], s.state.terminal_reason) for s in steps]

    assert facts(ours) == facts(theirs)
    assert len(ours) == 9 and ours[-1].state.phase is Phase.STOP


def test_the_declaration_is_sound() -> None:
    assert graph.validate() == []


def test_validation_catches_every_kind_of_unsound_table() -> None:
    r0 = graph.ROUTES
    bad_edge = (*r0, graph.Route((Phase.ASSEMBLE,), Assembled, None, "teleport", no_change))
    assert any("'teleport' is not declared" in p for p in graph.validate(routes=bad_edge))
    wrong_source = (*r0[:-1], graph.Route((Phase.STOP,), Aborted, None, "abort", no_change))
    assert any("not declared from stop" in p for p in graph.validate(routes=wrong_source))
    no_next_turn = tuple(r for r in r0 if r.edge != "next_turn")
    problems = graph.validate(routes=no_next_turn)
    assert "edge 'next_turn' is taken by no route" in problems
    assert any("feedback decides on its own" in p for p in problems)
    no_refusal = {k: v for k, v in graph.REFUSALS.items() if k != (Phase.STOP, Aborted)}
    assert "stop/Aborted is neither routed nor refused" in graph.validate(refusals=no_refusal)
    both = {**graph.REFUSALS, (Phase.STREAM, StreamEnded): "no"}
    assert "stream/StreamEnded is both routed and refused" in graph.validate(refusals=both)
    shadowed = (graph.Route((Phase.STREAM,), StreamEnded, None, "end_turn", graph.answered), *r0)
    assert any("can never fire" in p for p in graph.validate(routes=shadowed))
    dead_end = tuple(e for e in EDGES if Phase.FEEDBACK not in e.sources)
    assert "stop cannot be reached from feedback" in graph.validate(edges=dead_end, routes=())


def test_loop_machines_leave_the_shared_machine_as_they_found_it() -> None:
    before = len(graph.MACHINE.models)
    for _ in range(50):
        run(start(), Assembled(), StreamOpened(), StreamEnded(ModelResponse(TEXT, "end_turn")))
    assert len(graph.MACHINE.models) == before


def test_feedback_decides_on_its_own() -> None:
    """One ToolsDrained: collect into feedback, and feedback's move on the same event."""
    _s, m = to_stream()
    m.fire(StreamEnded(ModelResponse(USE, "tool_use")), LIM)
    steps = m.fire(drained(), LIM)
    assert [(s.trigger, s.automatic) for s in steps] == [("collect", False), ("next_turn", True)]
    assert steps[1].route == "else"


def test_every_terminal_reason_has_an_edge() -> None:
    reachable = set().union(*(e.reasons for e in EDGES))
    assert reachable == set(TerminalReason)


def test_undeclared_move_raises() -> None:
    m = LoopMachine(start())
    with pytest.raises(UndeclaredMove, match="reports the work of call_model"):
        m.fire(StreamOpened(), LIM)  # not an event of assemble
    with pytest.raises(UndeclaredMove, match="not an event of the graph"):
        m.fire(object(), LIM)  # type: ignore[arg-type]
    assert m.phase is Phase.ASSEMBLE
    _s, m2 = to_stream()
    m2.fire(StreamEnded(ModelResponse(TEXT, "end_turn")), LIM)
    m2.fire(StopHookVerdict(), LIM)
    with pytest.raises(UndeclaredMove, match="no route's guard holds"):
        m2.fire(StopHookVerdict(blocked=True), LIM)  # Stop hooks ran already: nothing is due
    with pytest.raises(UndeclaredMove, match="nothing left to abort"):
        m2.fire(Aborted(), LIM)


def test_the_machine_checks_the_phase_against_the_edge() -> None:
    model = graph.LoopModel(start())
    with pytest.raises(UndeclaredMove):
        model.phase = "stream"  # the record is at assemble: the machine cannot move it elsewhere


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
                    drained())
    assert labels == ["call", "open_stream", "dispatch", "collect", "next_turn"]
    assert s.turn_count == 2 and s.transition == "next_turn"
    assert (s.max_output_tokens_recovery_count, s.thinking_only_nudged, s.has_attempted_reactive_compact,
            s.stop_hook_blocking_count) == (0, False, False, 0)
    assert [m.role for m in s.messages] == ["user", "assistant", "user"]
    assert s.messages[1].tool_use_ids() == s.messages[2].tool_result_ids()


def test_max_turns_ends_after_the_tools_ran() -> None:
    lim = Limits(max_turns=1)
    s, labels = run(start(), Assembled(), StreamOpened(), StreamEnded(ModelResponse(USE, "tool_use")),
                    drained(), limits=lim)
    assert labels[-1] == "finish_batch"
    assert s.terminal_reason is TerminalReason.MAX_TURNS
    assert s.messages[-1].tool_result_ids() == ["toolu_1"]


def test_invalid_structured_output_call_counts_towards_its_cap() -> None:
    call = ({"type": "tool_use", "id": "so_1", "name": "StructuredOutput", "input": {}},)
    failed = {"type": "tool_result", "tool_use_id": "so_1", "is_error": True,
              "content": "InputValidationError"}
    bad = ToolsDrained(assistant=Message("assistant", call, kind="assistant"),
                       results=Message("user", (failed,), kind="tool_results"), structured_output_ids=("so_1",))
    turn = (Assembled(), StreamOpened(),
            StreamEnded(ModelResponse(call, "tool_use"), json_schema=True, structured_output_ids=("so_1",)), bad)
    lim = Limits(structured_output_retries=1)
    s, labels = run(start(), *turn, limits=lim)
    assert labels[-1] == "next_turn" and s.structured_output_retry_count == 1
    s, labels = run(s, *turn, limits=lim)
    assert labels[-1] == "finish_batch"
    assert s.terminal_reason is TerminalReason.STRUCTURED_OUTPUT_RETRY_EXHAUSTED
    # a normal tool turn still resets the count
    s, _ = run(attrs.evolve(start(), structured_output_retry_count=1), Assembled(), StreamOpened(),
               StreamEnded(ModelResponse(USE, "tool_use")), drained(), limits=lim)
    assert s.structured_output_retry_count == 0


def test_max_tokens_recovers_up_to_cap_then_api_error() -> None:
    cut = StreamEnded(ModelResponse(({"type": "text", "text": "part"},), "max_tokens"))
    s, m = to_stream()
    for i in range(3):
        step, s = fire(m, cut, LIM)
        assert step.trigger == "max_output_tokens_recovery"
        assert s.max_output_tokens_recovery_count == i + 1
        assert prompts.MAX_TOKENS_RESUME in s.messages[-1].content[0]["text"]
        fire(m, Assembled(), LIM)
        fire(m, StreamOpened(), LIM)
    step, s = fire(m, cut, LIM)
    assert step.trigger == "recovery_exhausted" and s.terminal_reason is TerminalReason.API_ERROR
    assert [x.text() for x in s.messages if x.role == "assistant"] == ["part"] * 4


@pytest.mark.parametrize("cap", [1, 2])
def test_malformed_tool_use_clean_retry(cap: int) -> None:
    bad = StreamEnded(ModelResponse(({"type": "text", "text": "calling"},), "tool_use"))
    lim = Limits(malformed_tool_use_retries=cap)
    s, m = to_stream()
    for _ in range(cap):
        step, s = fire(m, bad, lim)
        assert step.trigger == "malformed_tool_use_retry"
        assert not any(x.role == "assistant" for x in s.messages)  # the failed message is dropped
        fire(m, Assembled(), lim)
        fire(m, StreamOpened(), lim)
    step, s = fire(m, bad, lim)
    assert s.terminal_reason is TerminalReason.MALFORMED_TOOL_USE_EXHAUSTED


def test_unparsable_sibling_still_dispatches() -> None:
    resp = ModelResponse((*USE, {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}}),
                         "tool_use", invalid_tool_inputs={"toolu_2": '{"file_'})
    _s, m = to_stream()
    step, _ = fire(m, StreamEnded(resp), LIM)
    assert step.trigger == "dispatch"


def test_thinking_only_nudged_once() -> None:
    think = StreamEnded(ModelResponse(({"type": "thinking", "thinking": "hm", "signature": "s"},),
                                      "end_turn"))
    s, m = to_stream()
    step, s = fire(m, think, LIM)
    assert step.trigger == "thinking_only_nudge" and s.thinking_only_nudged
    assert [x.role for x in s.messages] == ["user", "user"]  # thinking dropped, nudge added
    fire(m, Assembled(), LIM)
    fire(m, StreamOpened(), LIM)
    step, s = fire(m, think, LIM)
    assert step.trigger == "end_turn" and s.terminal_reason is TerminalReason.COMPLETED


def test_stop_hook_blocks_until_cap_then_completes() -> None:
    lim = Limits(stop_hook_block_cap=2)
    s, m = to_stream()
    labels = []
    for _ in range(3):
        fire(m, StreamEnded(ModelResponse(TEXT, "end_turn")), lim)
        step, s = fire(m, StopHookVerdict(blocked=True, reason="run tests"), lim)
        labels.append(step.trigger)
        if s.phase is Phase.STOP:
            break
        fire(m, Assembled(), lim)
        fire(m, StreamOpened(), lim)
    assert labels == ["stop_hook_blocking", "stop_hook_blocking", "settle"]
    assert s.terminal_reason is TerminalReason.COMPLETED and s.stop_hook_blocking_count == 2
    assert s.turn_count == 3 and s.stop_hook_active


def test_stop_hook_max_turns_wins() -> None:
    lim = Limits(max_turns=1)
    s, m = to_stream()
    fire(m, StreamEnded(ModelResponse(TEXT, "end_turn")), lim)
    step, s = fire(m, StopHookVerdict(blocked=True, reason="again"), lim)
    assert step.trigger == "settle" and s.terminal_reason is TerminalReason.MAX_TURNS


def test_stop_hook_prevented() -> None:
    s, m = to_stream()
    fire(m, StreamEnded(ModelResponse(TEXT, "end_turn")), LIM)
    _, s = fire(m, StopHookVerdict(prevented=True, stop_reason="enough"), LIM)
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
    fire(m, Assembled(), LIM)
    comp = Compaction(messages=(Message("user", "summary"), *long.messages[3:]), trigger="reactive")
    step, s2 = fire(m, CallFailed(ptl, compaction=comp), LIM)
    assert step.trigger == "reactive_compact_retry" and s2.has_attempted_reactive_compact
    assert s2.messages[0].text() == "summary"
    fire(m, Assembled(), LIM)
    assert not graph.may_reactive_compact(m.state)
    step, s3 = fire(m, CallFailed(ptl), LIM)
    assert s3.terminal_reason is TerminalReason.PROMPT_TOO_LONG


def test_stream_retry_capped_then_fallback_then_error() -> None:
    broke = ModelError("connection", "reset", None, True)
    lim = Limits(stream_retries=1)
    s, m = to_stream()
    step, s = fire(m, CallFailed(broke, fallback_available=True), lim)
    assert step.trigger == "stream_retry" and s.phase is Phase.CALL_MODEL
    fire(m, StreamOpened(), lim)
    step, s = fire(m, CallFailed(broke, fallback_available=True), lim)
    assert step.trigger == "fallback_retry" and s.model_index == 1 and s.stream_retry_count == 0
    step, s = fire(m, CallFailed(ModelError("overloaded", "busy", 529, True)), lim)
    assert s.terminal_reason is TerminalReason.API_ERROR


def test_refusals_and_setup_failures() -> None:
    for reason in (TerminalReason.BLOCKING_LIMIT, TerminalReason.BUDGET_EXHAUSTED,
                   TerminalReason.BACKGROUND_REQUESTED):
        m = LoopMachine(start())
        fire(m, Assembled(), LIM)
        step, s = fire(m, Refused(reason, "no"), LIM)
        assert step.trigger == "refuse" and s.terminal_reason is reason
    m = LoopMachine(start())
    step, s = fire(m, SetupFailed(TerminalReason.HOOK_STOPPED, "blocked"), LIM)
    assert step.trigger == "prompt_blocked"
    with pytest.raises(UndeclaredMove):
        decide(start(), SetupFailed(TerminalReason.COMPLETED, "x"), LIM)


def test_abort_pairs_every_call_it_shows() -> None:
    """The abort event carries raw facts (the blocks shown, the results finished); the route pairs
    each shown call: with its finished result, else with the synthetic result its edge declares."""
    s, m = to_stream()
    step = decide(s, Aborted(shown=USE), LIM)
    partial, results, _marker = step.state.messages[-3:]
    assert partial.tool_use_ids() == results.tool_result_ids() == ["toolu_1"]
    assert results.content[0]["content"] == prompts.synthetic_text(step.edge.does.close_calls)
    assert graph.shown_results(step, Aborted(shown=USE)) == results.content
    done = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "real"}
    _, s = fire(m, Aborted(shown=USE, finished=(done,)), LIM)
    assert s.terminal_reason is TerminalReason.ABORTED_STREAMING
    assert s.messages[-3].tool_use_ids() == s.messages[-2].tool_result_ids()
    assert s.messages[-2].content == (done,)


@pytest.mark.parametrize(("turns_since", "rapid"), [(0, True), (1, True), (2, False)])
def test_rapid_refill_breaker(turns_since: int, rapid: bool) -> None:
    """A compaction within rapid_refill_turns (2) of the previous one is a rapid refill; with
    rapid_refill_max=2 the second one in a row trips the breaker."""
    lim = Limits(rapid_refill_max=2)
    comp = Compaction(messages=(Message("user", "summary"),), trigger="auto")
    tracking = graph.CompactTracking(compactions=1, turns_since_compact=turns_since)
    s, labels = run(attrs.evolve(start(), compact_tracking=tracking), Assembled(compaction=comp), limits=lim)
    assert labels == ["call"] and s.compact_tracking.rapid_refill_count == int(rapid)
    s2, labels = run(attrs.evolve(s, phase=Phase.ASSEMBLE), Assembled(compaction=comp), limits=lim)
    if rapid:
        assert labels == ["setup_failed"] and s2.terminal_reason is TerminalReason.RAPID_REFILL_BREAKER
    else:
        assert labels == ["call"] and s2.compact_tracking.rapid_refill_count == 1


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
        elif phase is Phase.DISPATCH_TOOLS:
            ev = drained()
        else:
            if not graph.stop_hooks_are_due(s):
                break
            ev = data.draw(st.sampled_from([StopHookVerdict(blocked=True, reason="more"), StopHookVerdict(),
                                            StopHookVerdict(prevented=True, stop_reason="no")]))
        before = m.state
        # the machine is pure: the same state and event give the same steps, and the state is untouched
        expected = graph.advance(before, ev, limits)
        steps = m.fire(ev, limits)
        assert [(x.trigger, x.route, x.state.snapshot()) for x in steps] == \
            [(x.trigger, x.route, x.state.snapshot()) for x in expected]
        for step in steps:
            after = step.state
            assert before.phase in step.edge.sources and after.phase is step.edge.dest
            for counter, cap_name in COUNTER_CAPS.items():
                value = after.counters().get(counter)
                cap = getattr(limits, cap_name)
                if value is not None and cap is not None:
                    assert value <= cap, (counter, value, cap)
            if limits.max_turns is not None:
                assert after.turn_count <= limits.max_turns
            if after.phase is Phase.STOP:
                assert after.terminal_reason in step.edge.reasons
            for a, b in zip(after.messages, after.messages[1:], strict=False):
                if a.role == "assistant" and a.tool_use_ids():
                    assert b.role == "user" and sorted(b.tool_result_ids()) == sorted(a.tool_use_ids())
            assert after.messages[0].role == "user"
            before = after
    m.close()


def test_an_empty_answer_is_asked_for_once_then_the_result_is_empty() -> None:
    empty = StreamEnded(ModelResponse((), "end_turn"))
    s, m = to_stream()
    step, s = fire(m, empty, LIM)
    assert step.trigger == "empty_response_nudge" and s.empty_response_nudged
    assert prompts.EMPTY_RESPONSE_NUDGE in s.messages[-1].text()  # the empty answer is dropped
    fire(m, Assembled(), LIM)
    fire(m, StreamOpened(), LIM)
    step, s = fire(m, empty, LIM)
    assert step.trigger == "end_turn" and s.messages[-1].role == "assistant" and s.messages[-1].text() == ""
    s, m = to_stream()
    step, _ = fire(m, empty, Limits(empty_response_nudges=0))
    assert step.trigger == "end_turn"


def _call_model() -> LoopMachine:
    m = LoopMachine(start())
    m.fire(Assembled(), LIM)
    return m


def test_a_stream_dropped_before_its_first_event_is_retried_then_asked_unstreamed() -> None:
    dropped = CallFailed(ModelError("stream_dropped", "closed", None, True), non_streaming_available=True)
    m = _call_model()
    triggers = [fire(m, dropped, Limits(stream_retries=2))[0].trigger for _ in range(3)]
    assert triggers == ["stream_retry", "stream_retry", "non_streaming_retry"] and m.state.non_streaming
    step, s = fire(m, dropped, Limits(stream_retries=2))  # the unstreamed request failed too: final
    assert step.trigger == "call_failed" and s.terminal_reason is TerminalReason.API_ERROR


def test_a_garbled_stream_is_asked_unstreamed_at_once_and_streams_again_after() -> None:
    garbled = CallFailed(ModelError("stream_garbled", "not SSE", None, True), non_streaming_available=True)
    m = _call_model()
    step, s = fire(m, garbled, LIM)
    assert step.trigger == "non_streaming_retry" and s.non_streaming and s.stream_retry_count == 0
    fire(m, StreamOpened(), LIM)
    _, s = fire(m, StreamEnded(ModelResponse(USE, "tool_use")), LIM)
    assert not s.non_streaming  # the next request streams again
    # a client that cannot ask unstreamed ends the run: a garbled stream is a model error
    m = _call_model()
    step, s = fire(m, CallFailed(ModelError("stream_garbled", "not SSE", None, True)), LIM)
    assert step.trigger == "call_failed" and s.terminal_reason is TerminalReason.MODEL_ERROR


def test_failure_records_of_an_earlier_release_still_read() -> None:
    """Session files written before failure events carried raw facts recorded the pairing itself
    (``partial``, ``partial_results``): they read as the blocks shown and the results as finished, so
    the auditor's replay pairs them the same way."""
    from agentfsm.machine.events import from_record, to_record

    old = {"type": "Aborted", "partial": {"role": "assistant", "kind": "assistant", "uuid": "u1",
                                          "content": [{"type": "text", "text": "…"},
                                                      {"type": "tool_use", "id": "toolu_1", "name": "Read"}]},
           "partial_results": {"role": "user", "kind": "tool_results", "uuid": "u2",
                               "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True}]}}
    event = from_record(old)
    assert isinstance(event, Aborted)
    assert [b["type"] for b in event.shown] == ["text", "tool_use"]
    assert [b["tool_use_id"] for b in event.finished] == ["toolu_1"]
    assert from_record(to_record(event)) == event
    failed = from_record({"type": "CallFailed", "error": {"kind": "api", "message": "x"}, "partial": None})
    assert isinstance(failed, CallFailed) and failed.shown == () and failed.finished == ()


def test_every_tuple_field_of_every_event_reads_back_a_tuple() -> None:
    """Events are compared by value after a trip through their record (the auditor's replay, the
    Temporal history): a tuple field read back as a list makes an equal event unequal. Checked for
    every field of every event class declared a tuple, so a field added later is held too — and with
    the annotations resolved, as cattrs (the Temporal converter) leaves them."""
    from agentfsm.machine.events import EVENT_TYPES, from_record, to_record

    for kind in EVENT_TYPES:
        attrs.resolve_types(kind)

    samples = {"tuple[str, ...]": ("toolu_1", "toolu_2"),
               "tuple[Mapping[str, Any], ...]": ({"type": "tool_use", "id": "toolu_1", "name": "Read"},),
               "tuple[Message, ...]": (Message("user", ({"type": "text", "text": "…"},), kind="prompt", uuid="u"),)}
    seen = 0
    for kind in EVENT_TYPES:
        tuple_fields = [f for f in attrs.fields(kind) if _type_name(f.type).startswith("tuple[")]
        for field in tuple_fields:
            assert _type_name(field.type) in samples, f"{kind.__name__}.{field.name}: no sample for {field.type}"
            base = {f.name: _sample_for(f) for f in attrs.fields(kind) if f.default is attrs.NOTHING}
            event = kind(**{**base, field.name: samples[_type_name(field.type)]})
            back = from_record(to_record(event))
            assert type(getattr(back, field.name)) is tuple, f"{kind.__name__}.{field.name} came back a list"
            assert getattr(back, field.name) == getattr(event, field.name)
            seen += 1
    assert seen >= 11


def _sample_for(field: attrs.Attribute) -> object:  # type: ignore[type-arg]
    from agentfsm.machine.events import ModelError, ModelResponse

    by_type = {"ModelError": ModelError("api", "x", None, False),
               "ModelResponse": ModelResponse((), "end_turn", {}, "m", {}, 0),
               "Message": Message("user", (), kind="tool_results", uuid="u"),
               "TerminalReason": TerminalReason.COMPLETED, "str": "d", "tuple[Message, ...]": ()}
    assert _type_name(field.type) in by_type, f"no sample for the required field {field.name}: {field.type}"
    return by_type[_type_name(field.type)]


def _type_name(hint: object) -> str:
    """An annotation as written, whether still a string or resolved (``tuple[str, ...]``, ``Message``)."""
    if isinstance(hint, str):
        return hint
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("agentfsm.machine.state.", "").replace("typing.", "").replace(
        "collections.abc.", "")


def test_every_edge_a_response_ends_on_closes_its_stream_retries() -> None:
    """``stream_retry_count`` is reset by the edges a stream that ended leaves on
    (agentfsm.machine.state.RESPONSE_ENDED). The list lives with the counters, below the routes; a
    route added on ``StreamEnded`` and not listed left the count of an earlier broken stream standing
    (refusal_retry did, until the kit drew refusals). Terminal edges end the run: nothing is left."""
    from agentfsm.machine.graph import EDGES, ROUTES
    from agentfsm.machine.state import RESPONSE_ENDED

    kinds = {e.trigger: e.kind for e in EDGES}
    routed = {r.edge for r in ROUTES if r.event is StreamEnded}
    assert {e for e in routed if kinds[e] != "terminal"} <= set(RESPONSE_ENDED)
    assert set(RESPONSE_ENDED) <= routed, "RESPONSE_ENDED names an edge no ended stream takes"
