"""A tool input is a JSON object within bounds of depth and size; anything else is malformed input,
never an exception of another kind (agentfsm.common.bounded_json, and the assembler that uses it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.common.bounded_json import (
    DEFAULT_BOUNDS,
    InputRejected,
    JsonBounds,
    nesting_depth,
    parse_object,
    rejection,
)
from agentfsm.llm.model import BlockDelta, BlockStart, BlockStop, MessageStart
from agentfsm.runtime.assembler import ResponseAssembler

# strings full of the characters that confuse a scan: brackets, quotes and backslashes are data there
tricky = st.text(alphabet='[]{}"\\ax,:\n\u00e9', max_size=8)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), tricky)


def nest(value: Any, levels: list[bool], key: str) -> Any:
    """``value`` wrapped in ``len(levels)`` containers: an object (True) or an array (False) each."""
    for as_object in reversed(levels):
        value = {key: value} if as_object else [value]
    return value


def depth(value: Any) -> int:
    stack, deepest = [(value, 0)], 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            d += 1
            stack.extend((c, d) for c in (v.values() if isinstance(v, dict) else v))
        deepest = max(deepest, d)
    return deepest


@given(scalars, st.lists(st.booleans(), max_size=40), tricky, st.integers(0, 40))
def test_depth_is_read_off_the_text_and_bounds_what_is_parsed(leaf: Any, levels: list[bool], key: str,
                                                               limit: int) -> None:
    value = {"k": nest(leaf, levels, key)}
    text = json.dumps(value, ensure_ascii=False)
    assert nesting_depth(text) == depth(value) == len(levels) + 1
    bounds = JsonBounds(max_depth=limit)
    if depth(value) <= limit:
        assert parse_object(text, bounds) == json.loads(text)
    else:
        with pytest.raises(InputRejected, match=f"{depth(value)} levels deep"):
            parse_object(text, bounds)


@given(st.text(alphabet='[]{}"\\a1:, ', max_size=60), st.integers(1, 8), st.integers(0, 80))
def test_any_text_is_an_object_or_a_rejection(text: str, limit: int, size: int) -> None:
    bounds = JsonBounds(max_depth=limit, max_chars=size)
    try:
        value = parse_object(text, bounds)
    except InputRejected as exc:
        assert rejection(text, bounds) == str(exc)
        return
    assert isinstance(value, dict) and len(text) <= size and depth(value) <= limit


@given(st.integers(0, 200), st.integers(1, 100))
def test_size_is_bounded(length: int, limit: int) -> None:
    text = '{"a": "' + "x" * length + '"}'
    bounds = JsonBounds(max_chars=limit)
    if len(text) <= limit:
        assert parse_object(text, bounds) == {"a": "x" * length}
    else:
        assert rejection(text, bounds) == f"The tool input is larger than {limit} characters of JSON"


@pytest.mark.parametrize(("text", "why"), [
    ("[" * 100_000, "100000 levels deep"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "100001 levels deep"),
    ('{"a": ' + "9" * 5_000 + "}", "not valid JSON"),
    ('{"a": 1', "not valid JSON"),
    ("[1, 2]", "a JSON array, not an object"),
    ('"text"', "a JSON string, not an object"),
    ("null", "a JSON null, not an object"),
    ("7", "a JSON number, not an object"),
    ("7.5", "a JSON number, not an object"),
    ("true", "a JSON boolean, not an object"),
])
def test_what_the_model_is_told(text: str, why: str) -> None:
    assert why in (rejection(text) or "")


def assemble(chunks: list[str], bounds: JsonBounds) -> ResponseAssembler:
    asm = ResponseAssembler(bounds=bounds)
    asm.feed(MessageStart(model="m", usage={}, message_id="msg"))
    asm.feed(BlockStart(0, {"type": "tool_use", "id": "toolu_1", "name": "Read"}))
    for chunk in chunks:
        asm.feed(BlockDelta(0, {"type": "input_json_delta", "partial_json": chunk}))
    asm.feed(BlockStop(0))
    return asm


@given(st.lists(st.text(alphabet="ab", max_size=30), max_size=20), st.integers(1, 60))
def test_the_assembler_holds_at_most_one_character_past_the_bound(parts: list[str], limit: int) -> None:
    chunks = ['{"a": "', *parts, '"}']
    text = "".join(chunks)
    asm = assemble(chunks, JsonBounds(max_chars=limit))
    block = asm.blocks[0]
    if len(text) <= limit:
        assert block["input"] == {"a": "".join(parts)} and not asm.invalid_tool_inputs
    else:
        held = asm.invalid_tool_inputs["toolu_1"]
        assert block["input"] == {} and held == text[:limit + 1]
        why = rejection(held, JsonBounds(max_chars=limit))
        assert why == f"The tool input is larger than {limit} characters of JSON"


def test_the_assembler_answers_a_deep_input_as_invalid() -> None:
    deep = '{"file_path": ' + "[" * 100_000 + "]" * 100_000 + "}"
    asm = assemble([deep[i:i + 1000] for i in range(0, len(deep), 1000)], JsonBounds())
    assert asm.blocks[0]["input"] == {} and asm.invalid_tool_inputs["toolu_1"] == deep
    assert asm.finish().invalid_tool_inputs == {"toolu_1": deep}


# any JSON value: siblings as well as chains, so a bracket's step is checked where it closes one
# container and the next opens beside it
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(tricky, children, max_size=4)),
    max_leaves=30,
)


@given(json_values)
def test_the_depth_read_off_any_json_text_is_its_values_depth(value: Any) -> None:
    """The running sum of +1/-1 steps is the value's nesting depth, for every shape of value: a scalar
    is 0, and a closed container gives its level back to the sibling after it."""
    text = json.dumps(value)
    assert nesting_depth(text) == depth(value)
    assert nesting_depth(json.dumps(value, indent=1)) == depth(value)


@given(json_values, st.integers(0, 6))
def test_an_object_is_accepted_exactly_when_it_is_within_the_depth(value: Any, limit: int) -> None:
    obj = {"k": value}
    text = json.dumps(obj)
    if depth(obj) <= limit:
        assert parse_object(text, JsonBounds(max_depth=limit)) == json.loads(text)
    else:
        assert f"{depth(obj)} levels deep" in (rejection(text, JsonBounds(max_depth=limit)) or "")


@pytest.mark.parametrize("text", ["", " ", "\n\t "])
def test_no_input_at_all_is_the_empty_object(text: str) -> None:
    """A call with no parameters streams no input JSON (or only blanks): that is ``{}``, not invalid."""
    assert parse_object(text) == {} and rejection(text) is None


def test_the_default_depth_is_64_levels() -> None:
    assert DEFAULT_BOUNDS.max_depth == 64
    at_limit = '{"a": ' + "[" * 63 + "]" * 63 + "}"
    assert parse_object(at_limit)["a"] is not None
    over = '{"a": ' + "[" * 64 + "]" * 64 + "}"
    assert rejection(over) == "The tool input nests arrays and objects 65 levels deep (at most 64 are accepted)"


def test_the_default_size_is_16_mib_of_text() -> None:
    """16 × 1024 × 1024 characters are accepted, one more is not (the limit a written file meets)."""
    limit = 16 * 1024 * 1024
    assert DEFAULT_BOUNDS.max_chars == limit
    head, tail = '{"content": "', '"}'
    text = head + "x" * (limit - len(head) - len(tail)) + tail
    assert len(text) == limit
    assert rejection(text) is None
    assert rejection(text + " ") == f"The tool input is larger than {limit} characters of JSON"
