"""Claude Code 2.1.332's protocol texts and shapes that are not a single tool's: the order of blocks
sent back, the result text of a --json-schema run, a schema error in ajv's words."""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.machine.events import ModelResponse
from agentfsm.machine.state import LoopState, Message, TerminalReason
from agentfsm.runtime.result import build_result
from agentfsm.tools.schema import ajv_issues, compile_validator
from agentfsm.tools.structured_output import StructuredOutputTool

blocks = st.lists(st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=5)),
    st.builds(lambda i: {"type": "tool_use", "id": f"toolu_{i}", "name": "Read", "input": {}}, st.integers(0, 99))),
    max_size=8)


@given(blocks)
def test_text_goes_before_tool_use_in_the_history(content: list[dict[str, Any]]) -> None:
    sent = ModelResponse(tuple(content)).as_message().content
    kinds = [b["type"] for b in sent]
    assert kinds == sorted(kinds, key=lambda k: k == "tool_use")  # every text first, as Claude Code sends it
    # nothing lost, and each kind keeps its own order
    for kind in ("text", "tool_use"):
        assert [b for b in sent if b["type"] == kind] == [b for b in content if b["type"] == kind]


def test_a_json_schema_run_returns_its_answer_as_compact_json() -> None:
    state = attrs.evolve(LoopState(), messages=(Message("assistant", ({"type": "text", "text": "x"},)),),
                         terminal_reason=TerminalReason.COMPLETED)
    result = build_result(state, session_id="s", duration_ms=0, duration_api_ms=0, cost=0.0, usage={}, denials=(),
                          structured_output={"answer": "42", "é": [1, 2]})
    assert result.result == '{"answer":"42","é":[1,2]}'
    assert json.loads(result.result) == result.structured_output
    plain = build_result(state, session_id="s", duration_ms=0, duration_api_ms=0, cost=0.0, usage={}, denials=())
    assert plain.result == "x"


def test_schema_errors_in_ajv_words() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}, "n": {"type": "integer", "minimum": 0},
                                               "tags": {"type": "array", "maxItems": 1}},
              "required": ["answer"], "additionalProperties": False}
    tool = StructuredOutputTool(schema)
    # Claude Code's text for {"answer": 5, "extra": true}, exactly
    assert tool.invalid_input_text({"answer": 5, "extra": True}) == (
        "Output does not match required schema: root: must NOT have additional properties ('extra' is not "
        "allowed), /answer: must be string")
    validator, _ = compile_validator(schema)
    assert ajv_issues(validator, {"n": -1, "tags": [1, 2]}) == [
        "root: must have required property 'answer'", "/n: must be >= 0", "/tags: must NOT have more than 1 items"]
    assert tool.invalid_input_text({"answer": "ok"}) is None
