"""The kit's counter invariants hold independently of the route table (issue 27).

The auditor replays a trace through the declared routes, so a route whose effect forgets a reset is a
bug it shares: it computes the same wrong counter and finds nothing. The kit also states each
counter's resets, rises and cap from the counter's own field declaration (``agentfsm.machine.state.COUNTERS``)
and checks every move against it (``agentfsm.testing.stateful.counter_violations``). Planted here:
``max_output_tokens_recovery_count`` not reset on ``next_turn``, as a change of the graph's effect (the
field still declares the reset). The kit's ordinary property test catches it within hypothesis's
default budget of 100 examples; the same test passes on the code as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from agentfsm.auditing.audit import audit
from agentfsm.machine import graph
from agentfsm.machine.state import COUNTERS_BY_KEY, LoopState
from agentfsm.testing import text_response, tool_response
from agentfsm.testing.scenario import StreamedResponse, TextBlock
from agentfsm.testing.stateful import assert_invariants, counter_violations, invariant_violations, run_loop
from agentfsm.testing.strategies import model_behaviours
from agentfsm.tools.base import tool

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
          "additionalProperties": False}


@tool("Echo", "Repeat the text.", SCHEMA, concurrency_safe=True)
async def echo(inp: Mapping[str, Any], ctx: Any) -> str:
    return str(inp["text"])


@pytest.fixture
def recovery_count_kept_on_next_turn(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The planted bug: next_turn's effect keeps the max-output-tokens recovery count. The field's
    declaration (reset_by next_turn) is untouched; only the graph's effect changes."""
    resets = graph.resets

    def planted(trigger: str, state: LoopState) -> dict[str, Any]:
        changes = resets(trigger, state)
        if trigger == "next_turn":
            changes.pop("max_output_tokens_recovery_count", None)
        return changes

    monkeypatch.setattr(graph, "resets", planted)
    assert "next_turn" in COUNTERS_BY_KEY["max_output_tokens_recovery_count"].reset_by
    yield


CUT = StreamedResponse(blocks=(TextBlock("part"),), stop_reason="max_tokens")
SCRIPT = [CUT, tool_response("toolu_1", "Echo", {"text": "x"}), text_response("done")]


def _kit_property() -> None:
    """What a user of the kit writes (docs/kit.md), at hypothesis's default budget, made repeatable."""

    # Detection is what is measured here, at the default 100 examples; shrinking is left out because on a loaded
    # machine it ran into hypothesis's own five-minute shrink limit and then reported two failures as an
    # ExceptionGroup instead of the one assertion (seen with 8 jobs on 2 cores).
    @settings(max_examples=100, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=[Phase.explicit, Phase.reuse, Phase.generate])
    @given(model_behaviours([echo]))
    def test_echo_in_the_loop(script: list[Any]) -> None:
        assert_invariants(run_loop(script, tools=[echo]))

    test_echo_in_the_loop()


def test_the_planted_bug_is_invisible_to_the_auditor_but_not_to_the_kit(recovery_count_kept_on_next_turn: None
                                                                        ) -> None:
    run = run_loop(SCRIPT, tools=[echo])
    after = [r for r in run.records if r.get("type") == "transition"]
    assert [r["trigger"] for r in after][:6] == ["call", "open_stream", "max_output_tokens_recovery", "call",
                                                 "open_stream", "dispatch"]
    # the auditor replays the same (planted) routes: nothing to report
    assert [f for f in audit(run.file_records, limits=run.limits) if f.is_error] == []
    problems = invariant_violations(run)
    assert any("max_output_tokens_recovery_count=1 after 'next_turn'" in p for p in problems), problems


def test_the_unplanted_code_keeps_the_same_run_clean() -> None:
    assert invariant_violations(run_loop(SCRIPT, tools=[echo])) == []


FRESH = "AGENTFSM_KIT_FRESH_PROCESS"


@pytest.mark.skipif(os.environ.get(FRESH) != "1", reason="run in a fresh interpreter by the test after it")
def test_the_planted_bug_is_caught_in_this_process(recovery_count_kept_on_next_turn: None) -> None:
    with pytest.raises(AssertionError, match=r"max_output_tokens_recovery_count=.* after 'next_turn'"):
        _kit_property()


@pytest.mark.slow
def test_the_kits_property_test_catches_the_planted_bug_within_its_default_budget() -> None:
    """In a fresh interpreter, as a user's own test run is. In one process after certain other test files
    (test_conform and test_claude_code_audit together, 2026-12-06) the same 100 examples missed it: what
    carries over from them is not found yet (docs/testing.md)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                           f"{__file__}::test_the_planted_bug_is_caught_in_this_process"],
                          env={**os.environ, FRESH: "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_the_kits_property_test_passes_on_the_code_as_it_is() -> None:
    _kit_property()


@pytest.mark.parametrize(("trigger", "before", "after", "expected"), [
    ("next_turn", {"max_output_tokens_recovery_count": 2}, {"max_output_tokens_recovery_count": 2},
     "resets it to 0"),
    ("next_turn", {"thinking_only_nudged": True}, {"thinking_only_nudged": True}, "resets it to False"),
    ("stream_retry", {"stream_retry_count": 0}, {"stream_retry_count": 2}, "a counter rises by one"),
    ("call", {"max_output_tokens_recovery_count": 2}, {"max_output_tokens_recovery_count": 0},
     "neither raises nor resets it"),
    ("call", {"non_streaming": True}, {"non_streaming": False}, "neither raises nor resets it"),
])
def test_counter_violations_names_each_breakage(trigger: str, before: dict[str, Any], after: dict[str, Any],
                                                expected: str) -> None:
    problems = counter_violations(trigger, before, after)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(("trigger", "before", "after"), [
    ("next_turn", {"max_output_tokens_recovery_count": 2}, {"max_output_tokens_recovery_count": 0}),
    # the same edge raises and resets it: either is declared
    ("next_turn", {"structured_output_retry_count": 1}, {"structured_output_retry_count": 2}),
    ("next_turn", {"structured_output_retry_count": 1}, {"structured_output_retry_count": 0}),
    ("max_output_tokens_recovery", {"max_output_tokens_recovery_count": 0}, {"max_output_tokens_recovery_count": 1}),
    # set once a Stop hook blocked, and kept through a tool turn (Claude Code 2.1.332)
    ("next_turn", {"stop_hook_active": True}, {"stop_hook_active": True}),
])
def test_counter_violations_passes_declared_moves(trigger: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    assert counter_violations(trigger, before, after) == []
