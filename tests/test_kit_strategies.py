"""The kit's hypothesis strategies (``agentfsm.testing.strategies``): what each draws is what it says."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.llm.model import classify_error
from agentfsm.machine.state import Limits
from agentfsm.testing import (
    HttpErrorResponse,
    RawToolJsonBlock,
    StreamedResponse,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    load_scenario,
    parse_response,
)
from agentfsm.testing.strategies import (
    api_errors,
    inputs_from_schema,
    loop_limits,
    malformed_responses,
    max_tokens_responses,
    model_behaviours,
    model_responses,
    prompt_too_long_errors,
    stream_breaks,
    text_responses,
    thinking_only_responses,
    tool_call_responses,
    tool_inputs,
    unique_tool_ids,
)
from agentfsm.tools import builtin_tools
from agentfsm.tools.base import Tool, tool
from agentfsm.tools.schema import coerce_input

KIT = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BUILTINS = [t for t in builtin_tools() if t.name != "Agent"]


@tool("Note", "Store a note.", {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 12},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True, "maxItems": 3},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "meta": {"type": "object", "properties": {"pinned": {"type": "boolean"}}, "required": ["pinned"],
                 "additionalProperties": False},
        "kind": {"const": "note"},
    },
    "required": ["title", "meta"],
    "additionalProperties": False,
})
async def note(inp: Mapping[str, Any], ctx: Any) -> str:
    return str(inp["title"])


TOOLS: list[Tool] = [note, *BUILTINS]
SCHEMAS: dict[str, Mapping[str, Any]] = {
    **{t.name: t.input_schema for t in TOOLS},
    "nullable": {"type": ["string", "null"], "maxLength": 3},
    "any_of": {"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "pattern": "^x+$"}]},
    **{f"format_{f}": {"type": "string", "format": f}
       for f in ("email", "uuid", "date", "date-time", "time", "ipv4", "ipv6", "uri")},
    "extra_keys": {"type": "object", "properties": {"a": {"type": "integer"}},
                   "additionalProperties": {"type": "boolean"}},
    "multiple_of": {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 7},
}


def _valid(schema: Mapping[str, Any], value: Any) -> bool:
    # the format checker the tool pipeline validates with (agentfsm.runtime.pipeline)
    cls = jsonschema.Draft202012Validator
    return bool(cls(schema, format_checker=cls.FORMAT_CHECKER).is_valid(value))


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_inputs_from_schema_are_valid(name: str) -> None:
    schema = SCHEMAS[name]

    @KIT
    @given(inputs_from_schema(schema))
    def check(value: Any) -> None:
        assert _valid(schema, value), value

    check()


@pytest.mark.parametrize("t", TOOLS, ids=lambda t: t.name)
def test_invalid_tool_inputs_stay_invalid_after_coercion(t: Tool) -> None:
    @KIT
    @given(tool_inputs(t, valid=False))
    def check(value: dict[str, Any]) -> None:
        assert not _valid(t.input_schema, coerce_input(value, t.input_schema)), value

    check()


def test_a_schema_that_admits_every_object_has_no_invalid_inputs() -> None:
    assert tool_inputs({"type": "object"}, valid=False).is_empty


def _calls(resp: StreamedResponse) -> list[ToolUseBlock | RawToolJsonBlock]:
    return [b for b in resp.blocks if isinstance(b, ToolUseBlock | RawToolJsonBlock)]


@KIT
@given(tool_call_responses(TOOLS))
def test_valid_tool_calls_name_known_tools_with_valid_input(resp: StreamedResponse) -> None:
    calls = _calls(resp)
    assert resp.stop_reason == "tool_use" and calls
    assert len({c.id for c in calls}) == len(calls)
    by_name = {t.name: t for t in TOOLS}
    for c in calls:
        assert isinstance(c, ToolUseBlock) and c.name in by_name
        assert _valid(by_name[c.name].input_schema, c.input), c


def _is_invalid(call: ToolUseBlock | RawToolJsonBlock) -> bool:
    by_name = {t.name: t for t in TOOLS}
    if call.name not in by_name:
        return True
    if isinstance(call, RawToolJsonBlock):
        try:
            return not isinstance(json.loads(call.json), dict)
        except ValueError:
            return True
    schema = by_name[call.name].input_schema
    return not _valid(schema, coerce_input(dict(call.input), schema))


@KIT
@given(tool_call_responses(TOOLS, valid=False))
def test_invalid_tool_calls_are_all_invalid(resp: StreamedResponse) -> None:
    calls = _calls(resp)
    assert calls and all(_is_invalid(c) for c in calls), calls


@KIT
@given(malformed_responses())
def test_malformed_responses_have_no_usable_tool_use(resp: StreamedResponse) -> None:
    assert resp.stop_reason == "tool_use"
    assert not any(isinstance(b, (ToolUseBlock, RawToolJsonBlock)) for b in resp.blocks)


@KIT
@given(max_tokens_responses())
def test_max_tokens_responses(resp: StreamedResponse) -> None:
    assert resp.stop_reason in ("max_tokens", "model_context_window_exceeded")
    assert resp.complete and not _calls(resp)


@KIT
@given(thinking_only_responses())
def test_thinking_only_responses_show_no_text(resp: StreamedResponse) -> None:
    assert resp.stop_reason == "end_turn"
    assert any(isinstance(b, ThinkingBlock) for b in resp.blocks)
    assert not "".join(b.text for b in resp.blocks if isinstance(b, TextBlock)).strip()


@KIT
@given(text_responses())
def test_text_responses_show_text(resp: StreamedResponse) -> None:
    assert "".join(b.text for b in resp.blocks if isinstance(b, TextBlock)).strip()
    assert not _calls(resp) and resp.complete


@KIT
@given(api_errors())
def test_api_errors_classify_as_their_status_says(resp: HttpErrorResponse) -> None:
    error = classify_error(resp.status, resp.error_type, resp.message)
    assert resp.status in (400, 429, 500, 529)
    assert error.retryable == (resp.status != 400)
    assert error.kind in (("api", "image") if resp.status == 400 else ("api", "overloaded"))


@KIT
@given(prompt_too_long_errors())
def test_prompt_too_long_errors_classify_as_such(resp: HttpErrorResponse) -> None:
    # a 413 (request too large) ends image_error, as in Claude Code 2.1.332 (docs/conform.md)
    expected = "image" if resp.status == 413 else "prompt_too_long"
    assert classify_error(resp.status, resp.error_type, resp.message).kind == expected


@KIT
@given(stream_breaks(TOOLS))
def test_stream_breaks_never_complete(resp: StreamedResponse) -> None:
    assert not resp.complete
    # what the scenario loader accepts, so a break can be served over HTTP too
    assert parse_response(resp.to_dict()) == resp


@KIT
@given(model_behaviours(TOOLS))
def test_model_behaviours_are_scenarios_with_unique_tool_ids(script: list[Any]) -> None:
    ids = [c.id for r in script if isinstance(r, StreamedResponse) for c in _calls(r)]
    assert len(ids) == len(set(ids))
    # a JSON round trip through the scenario format gives the same script back
    assert list(load_scenario([r.to_dict() for r in script]).responses) == script


@KIT
@given(st.lists(model_responses(TOOLS), max_size=4))
def test_unique_tool_ids_renumbers_across_the_list(responses: list[Any]) -> None:
    renumbered = unique_tool_ids(responses, prefix="toolu_x")
    ids = [c.id for r in renumbered if isinstance(r, StreamedResponse) for c in _calls(r)]
    assert ids == [f"toolu_x{i:04d}" for i in range(1, len(ids) + 1)]


@KIT
@given(loop_limits())
def test_loop_limits_are_small_valid_limits(limits: Limits) -> None:
    assert limits.max_turns is None or 1 <= limits.max_turns <= 4
    assert limits.stop_hook_block_cap <= 3 and limits.max_tool_concurrency <= 4


def test_response_kinds_all_occur() -> None:
    # the mix reaches every kind it promises (a strategy that silently lost a branch would not)
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(model_responses(TOOLS))
    def collect(resp: Any) -> None:
        if isinstance(resp, HttpErrorResponse):
            seen.add("prompt_too_long" if "too long" in resp.message else "api_error")
        elif not resp.complete:
            seen.add("break")
        elif resp.stop_reason in ("max_tokens", "model_context_window_exceeded"):
            seen.add("max_tokens")
        elif resp.stop_reason == "tool_use":
            seen.add("tool_use" if any(isinstance(b, (ToolUseBlock, RawToolJsonBlock)) for b in resp.blocks)
                     else "malformed")
        elif any(isinstance(b, TextBlock) and b.text.strip() for b in resp.blocks):
            seen.add("text")
        else:
            seen.add("thinking_only")

    collect()
    assert seen == {"prompt_too_long", "api_error", "break", "max_tokens", "tool_use", "malformed", "text",
                    "thinking_only"}


# what pydantic's `model_json_schema()` writes for a model with a nested model, a list of them and
# an optional field: local $refs into $defs, anyOf with null
PYDANTIC_ORDER = {
    "$defs": {"Item": {"properties": {"name": {"title": "Name", "type": "string"},
                                      "qty": {"minimum": 1, "title": "Qty", "type": "integer"}},
                       "required": ["name", "qty"], "title": "Item", "type": "object"}},
    "properties": {"items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"},
                   "main": {"$ref": "#/$defs/Item"},
                   "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Note"}},
    "required": ["items", "main"], "title": "Order", "type": "object",
}


@settings(max_examples=60, deadline=None)
@given(value=inputs_from_schema(PYDANTIC_ORDER))
def test_local_refs_are_resolved_like_pydantic_writes_them(value: Any) -> None:
    jsonschema.validate(value, PYDANTIC_ORDER)
    assert {"name", "qty"} <= set(value["main"])


def test_unresolvable_and_recursive_refs_are_refused() -> None:
    with pytest.raises(ValueError, match="does not resolve"):
        inputs_from_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}})
    recursive = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
                 "$ref": "#/$defs/Node"}
    with pytest.raises(ValueError, match="recursive"):
        inputs_from_schema(recursive)
    with pytest.raises(ValueError, match="remote"):
        inputs_from_schema({"$ref": "https://example.com/schema.json"})
