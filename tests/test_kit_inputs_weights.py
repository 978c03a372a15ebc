"""The kit's response strategies with a user's own tool inputs and family weights (issue 27 item 4).

Inputs drawn from a tool's JSON Schema never hold the commands that matter to a user's hooks and rules
(``rm -rf`` does not appear in any number of schema draws); a user gives a strategy per tool instead. The
weights say how often each family of model behaviour is drawn; 0 leaves one out.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.testing.scenario import StreamedResponse, ToolUseBlock
from agentfsm.testing.stateful import AgentLoopStateMachine
from agentfsm.testing.strategies import (
    FAMILY_WEIGHTS,
    model_responses,
    stream_breaks,
    tool_call_responses,
)
from agentfsm.tools import builtin_tools

TOOLS = [t for t in builtin_tools() if t.name in ("Bash", "Read")]
DANGEROUS = st.sampled_from([{"command": "rm -rf build"}, {"command": "rm -rf /"}])


def _calls(response: Any) -> list[ToolUseBlock]:
    return [b for b in getattr(response, "blocks", ()) if isinstance(b, ToolUseBlock)]


@settings(max_examples=60, deadline=None)
@given(tool_call_responses(TOOLS, True, inputs={"Bash": DANGEROUS}))
def test_a_tool_with_its_own_strategy_draws_from_it(response: StreamedResponse) -> None:
    for call in _calls(response):
        if call.name == "Bash":
            assert call.input["command"].startswith("rm -rf")
        else:
            assert call.name == "Read" and "file_path" in call.input  # still from its schema


@settings(max_examples=40, deadline=None)
@given(stream_breaks(TOOLS, inputs={"Bash": DANGEROUS}))
def test_a_broken_stream_draws_the_same_inputs(response: StreamedResponse) -> None:
    assert all(c.input["command"].startswith("rm -rf") for c in _calls(response) if c.name == "Bash")


@settings(max_examples=60, deadline=None)
@given(model_responses(TOOLS, weights={name: 0 for name in FAMILY_WEIGHTS if name != "tools"},
                       inputs={"Bash": DANGEROUS}))
def test_weights_leave_families_out(response: Any) -> None:
    assert isinstance(response, StreamedResponse) and response.stop_reason == "tool_use"
    assert response.break_after is None and _calls(response)


def test_the_default_weights_still_draw_every_family() -> None:
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None)
    @given(model_responses(TOOLS, weights={"tools": 3}))  # the default, given explicitly
    def draw(response: Any) -> None:
        seen.add(type(response).__name__ + ":" + str(getattr(response, "stop_reason", "")))

    draw()
    assert {"HttpErrorResponse:", "StreamedResponse:tool_use", "StreamedResponse:max_tokens"} <= seen


def test_bad_inputs_and_weights_get_a_clear_error() -> None:
    with pytest.raises(ValueError, match="tools not offered: \\['Write'\\]"):
        tool_call_responses(TOOLS, True, inputs={"Write": DANGEROUS}).example()
    with pytest.raises(TypeError, match="must be a hypothesis strategy"):
        tool_call_responses(TOOLS, True, inputs={"Bash": {"command": "ls"}}).example()
    with pytest.raises(ValueError, match="unknown families \\['telepathy'\\]"):
        model_responses(TOOLS, weights={"telepathy": 1})
    with pytest.raises(ValueError, match="whole number"):
        model_responses(TOOLS, weights={"text": -1})
    with pytest.raises(ValueError, match="nothing to draw"):
        model_responses(TOOLS, weights=dict.fromkeys(FAMILY_WEIGHTS, 0))


def test_the_state_machine_passes_its_inputs_and_weights_on() -> None:
    class Mine(AgentLoopStateMachine):
        tools = tuple(TOOLS)
        tool_input_strategies = {"Bash": DANGEROUS}
        family_weights = dict.fromkeys(FAMILY_WEIGHTS, 0) | {"tools": 1}

    machine = Mine()
    strategy = machine.response_strategy()

    @settings(max_examples=30, deadline=None, database=None)
    @given(strategy)
    def draw(response: Any) -> None:
        assert response.stop_reason == "tool_use"
        assert all(c.input["command"].startswith("rm -rf") for c in _calls(response) if c.name == "Bash")

    draw()
