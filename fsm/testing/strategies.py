"""Hypothesis strategies for model behaviour and tool inputs (public testing kit, docs/behaviour.md §8).

Every strategy yields the scenario records of :mod:`agentfsm.testing.scenario` (``StreamedResponse`` /
``HttpErrorResponse``), so what it draws can be fed to :class:`~agentfsm.testing.ScriptedModel` (or the
loopback :class:`~agentfsm.testing.ScriptedServer`) as is, and printed by hypothesis as a readable script.

* one response: :func:`text_responses`, :func:`tool_call_responses` (valid or invalid calls),
  :func:`malformed_responses`, :func:`max_tokens_responses`, :func:`thinking_only_responses`,
  :func:`api_errors`, :func:`prompt_too_long_errors`, :func:`stream_breaks`, and
  :func:`model_responses` mixing them all; :func:`background_work_responses` (issue 30: a Bash command
  run in the background or moved there by its timeout, a task stopped by the model) for runs whose
  tools include Bash and TaskStop;
* a whole conversation: :func:`model_behaviours` — a list of responses, one per model request, with
  tool_use ids unique across the list (:func:`unique_tool_ids`);
* tool inputs: :func:`inputs_from_schema` for the JSON Schema subset tools use, :func:`tool_inputs`
  (valid, or invalid in the ways models get them wrong);
* loop settings: :func:`loop_limits`.

Invalid inputs are invalid *after* the pipeline's coercion (``"5"`` for an integer is coerced and
therefore valid), so a test may rely on every invalid call getting an ``is_error`` tool_result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC
from typing import Any

import attrs
import jsonschema
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from agentfsm.llm.model import PROMPT_TOO_LONG_MARKERS
from agentfsm.machine.state import Limits
from agentfsm.testing.scenario import (
    HttpErrorResponse,
    RawToolJsonBlock,
    Response,
    SseError,
    StreamedResponse,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)
from agentfsm.tools.base import Tool
from agentfsm.tools.schema import coerce_input

__all__ = [
    "FAMILY_WEIGHTS",
    "api_errors",
    "background_work_responses",
    "inputs_from_schema",
    "loop_limits",
    "malformed_responses",
    "max_tokens_responses",
    "model_behaviours",
    "model_responses",
    "prompt_too_long_errors",
    "refusal_responses",
    "stream_breaks",
    "text_responses",
    "thinking_only_responses",
    "tool_call_responses",
    "tool_inputs",
    "unique_tool_ids",
]

# Short texts keep traces and hypothesis' reports readable; the loop never looks inside them.
_TEXT = st.text(max_size=24)
_VISIBLE = st.text(min_size=1, max_size=24).filter(lambda s: s.strip() != "")
_THINKING = st.text(min_size=1, max_size=24)
# Generated arrays and strings stay small: size says nothing about the loop's control flow.
_MAX_STRING = 16
_MAX_ITEMS = 3

# --- tool inputs from JSON Schema --------------------------------------------------------------

_SCALAR_JSON = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), _TEXT)


def _types(schema: Mapping[str, Any]) -> list[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return ["object"]
    if "items" in schema:
        return ["array"]
    return []


# string formats drawn directly (a filter over random text would almost never hit one)
_FORMATS: Mapping[str, Callable[[], SearchStrategy[str]]] = {
    "email": lambda: st.emails(),
    "uuid": lambda: st.uuids().map(str),
    "date": lambda: st.dates().map(lambda d: d.isoformat()),
    "date-time": lambda: st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    # checkers disagree on offsets (RFC 3339 wants one, strptime-based ones refuse it): draw both;
    # the validity filter keeps what the installed checker accepts
    "time": lambda: st.tuples(st.times().map(lambda t: t.replace(microsecond=0).isoformat()), st.booleans())
    .map(lambda p: p[0] + ("Z" if p[1] else "")),
    "ipv4": lambda: st.ip_addresses(v=4).map(str),
    "ipv6": lambda: st.ip_addresses(v=6).map(str),
    "uri": lambda: st.sampled_from(["https://example.com/", "file:///tmp/x", "urn:isbn:0451450523"]),
}


def _string(schema: Mapping[str, Any]) -> SearchStrategy[str]:
    lo = int(schema.get("minLength", 0))
    hi = schema.get("maxLength")
    hi = max(lo, int(hi) if hi is not None else lo + _MAX_STRING)
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS:
        return _FORMATS[fmt]()
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        # JSON Schema patterns are searched, not anchored: from_regex draws strings containing a match
        return st.from_regex(pattern).filter(lambda s: lo <= len(s) <= hi)
    return st.text(min_size=lo, max_size=hi)


def _bounds(schema: Mapping[str, Any]) -> tuple[float | None, float | None, bool, bool]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    # draft 2020-12: exclusive bounds are numbers; draft 4's boolean form is read too
    lo_open = hi_open = False
    if isinstance(xlo, bool):
        lo_open = xlo
    elif isinstance(xlo, int | float):
        lo, lo_open = xlo, True
    if isinstance(xhi, bool):
        hi_open = xhi
    elif isinstance(xhi, int | float):
        hi, hi_open = xhi, True
    return lo, hi, lo_open, hi_open


def _integer(schema: Mapping[str, Any]) -> SearchStrategy[int]:
    lo, hi, lo_open, hi_open = _bounds(schema)
    ilo = None if lo is None else (math.floor(lo) + 1 if lo_open else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hi_open else math.floor(hi))
    # unbounded integers are drawn near zero: a tool sees the same code paths for 7 and 10**30
    if ilo is None and ihi is None:
        ilo, ihi = -1000, 1000
    elif ilo is None:
        ilo = ihi - 2000  # type: ignore[operator]
    elif ihi is None:
        ihi = ilo + 2000
    strategy = st.integers(ilo, ihi)
    step = schema.get("multipleOf")
    if isinstance(step, int) and step > 0:
        strategy = strategy.map(lambda n: n - n % step).filter(lambda n: ilo <= n <= ihi)  # type: ignore[operator]
    return strategy


def _number(schema: Mapping[str, Any]) -> SearchStrategy[float | int]:
    lo, hi, lo_open, hi_open = _bounds(schema)
    floats = st.floats(
        min_value=lo,
        max_value=hi,
        exclude_min=lo_open and lo is not None,
        exclude_max=hi_open and hi is not None,
        allow_nan=False,
        allow_infinity=False,
    )
    return st.one_of(_integer(schema), floats)


def _array(schema: Mapping[str, Any]) -> SearchStrategy[list[Any]]:
    items = schema.get("items")
    element = _from_schema(items) if isinstance(items, Mapping) else _SCALAR_JSON
    lo = int(schema.get("minItems", 0))
    hi = schema.get("maxItems")
    hi = max(lo, int(hi) if hi is not None else lo + _MAX_ITEMS)
    if schema.get("uniqueItems"):
        return st.lists(element, min_size=lo, max_size=hi, unique_by=lambda v: json.dumps(v, sort_keys=True))
    return st.lists(element, min_size=lo, max_size=hi)


def _object(schema: Mapping[str, Any]) -> SearchStrategy[dict[str, Any]]:
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = [k for k in schema.get("required", ()) if isinstance(k, str)]
    req = {k: _from_schema(props.get(k, {})) for k in required}
    opt = {k: _from_schema(v) for k, v in props.items() if k not in req and isinstance(v, Mapping)}
    base = st.fixed_dictionaries(req, optional=opt)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping) and extra:
        # a schema for extra keys: sometimes add a few (keys outside ``properties``)
        keys = st.text(min_size=1, max_size=8).filter(lambda k: k not in props)
        more = st.dictionaries(keys, _from_schema(extra), max_size=2)
        return st.tuples(base, more).map(lambda t: {**t[1], **t[0]})
    return base


def _from_schema(schema: Any) -> SearchStrategy[Any]:
    if schema is True or schema == {}:
        return _SCALAR_JSON
    if not isinstance(schema, Mapping):
        raise ValueError(f"not a JSON Schema: {schema!r}")
    if "$ref" in schema:  # inline_local_refs ran first: only an unresolved one can be left
        raise ValueError(f"inputs_from_schema: $ref {schema['$ref']!r} was not inlined")
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list):
            # drawn from one branch; the top-level validity filter rejects oneOf overlaps
            return st.one_of([_from_schema(s) for s in schema[combinator]])
    makers: dict[str, Callable[[Mapping[str, Any]], SearchStrategy[Any]]] = {
        "string": _string,
        "integer": _integer,
        "number": _number,
        "boolean": lambda _s: st.booleans(),
        "null": lambda _s: st.none(),
        "array": _array,
        "object": _object,
    }
    types = [t for t in _types(schema) if t in makers]
    if not types:
        return _SCALAR_JSON
    return st.one_of([makers[t](schema) for t in types])


def inline_local_refs(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema`` with every local ``$ref`` replaced by the subschema it points at, resolved with
    ``referencing`` (jsonschema's own resolver). hypothesis-jsonschema would do this too, but its
    current release fails against the hypothesis this project uses, so refs are inlined here and the
    strategies above draw from the result."""
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    resource = DRAFT202012.create_resource(dict(schema))
    resolver = Registry().with_resource("urn:agentfsm:schema", resource).resolver("urn:agentfsm:schema")

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str):
                if not ref.startswith("#"):
                    raise ValueError(f"inputs_from_schema: remote $ref {ref!r} is not supported")
                if ref in seen:
                    raise ValueError(f"inputs_from_schema: recursive $ref {ref!r} is not supported")
                try:
                    target = resolver.lookup(ref).contents
                except Unresolvable as exc:
                    raise ValueError(f"inputs_from_schema: $ref {ref!r} does not resolve: {exc}") from None
                rest = {k: v for k, v in node.items() if k != "$ref"}
                merged = {**walk(target, (*seen, ref)), **{k: walk(v, seen) for k, v in rest.items()}}
                return merged
            return {k: walk(v, seen) for k, v in node.items() if k not in ("$defs", "definitions")}
        if isinstance(node, list):
            return [walk(v, seen) for v in node]
        return node

    return walk(schema, ())


def _validator(schema: Mapping[str, Any]) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def inputs_from_schema(schema: Mapping[str, Any]) -> SearchStrategy[Any]:
    """Values valid against ``schema``.

    Supported: ``type`` (string, integer, number, boolean, null, array, object, or a list of them),
    ``properties``/``required``/``additionalProperties`` (false, or a schema for extra keys),
    ``items``, ``enum``, ``const``, ``minimum``/``maximum`` (and the exclusive forms),
    ``minLength``/``maxLength``, ``pattern``, ``format`` (email, uuid, date, date-time, time,
    ipv4, ipv6, uri), ``minItems``/``maxItems``/``uniqueItems``, ``anyOf``/``oneOf``, ``multipleOf``
    (integers). Anything else (``allOf``, ``not``, ...) is honoured by filtering: every
    value drawn is checked with ``jsonschema``, so what comes out is always valid. Local ``$ref``s
    (``#/$defs/...``, ``#/definitions/...``: what pydantic's ``model_json_schema()`` writes) are
    inlined first; a recursive or remote ``$ref`` is refused with a ValueError.
    """
    validator = _validator(schema)
    schema = inline_local_refs(schema)
    strategy = _from_schema(schema)
    # the generators above honour every keyword of the subset exactly; only schemas using more
    # (formats, oneOf overlaps, patterns with length bounds...) need each value checked
    return strategy if _in_subset(schema) else strategy.filter(validator.is_valid)


# Keywords the generators honour exactly (annotations included: they constrain nothing).
_EXACT_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
    "maxItems", "description", "title", "default", "examples", "$schema", "$comment",
})


def _in_subset(schema: Any) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, Mapping) or not set(schema) <= _EXACT_KEYWORDS:
        return False
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    items = schema.get("items", True)
    if isinstance(extra, Mapping) and extra:
        return False  # extra keys are drawn outside `properties` but may still match patterns
    return (isinstance(props, Mapping) and all(_in_subset(v) for v in props.values())
            and _in_subset(items))


def _tool_schema(tool: Tool | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(tool, Mapping):
        return tool
    return tool.input_schema


def _invalid_after_coercion(validator: Any, schema: Mapping[str, Any]) -> Callable[[Any], bool]:
    return lambda value: not validator.is_valid(coerce_input(value, schema))


def _wrong_values(prop: Mapping[str, Any]) -> SearchStrategy[Any] | None:
    """Values of another JSON type than ``prop`` allows, chosen so the pipeline cannot coerce them
    back (a numeric string for an integer would be coerced, so strings are never numeric here)."""
    types = set(_types(prop))
    if "enum" in prop or "const" in prop:
        allowed = list(prop.get("enum", [prop.get("const")]))
        return st.one_of(
            st.text(min_size=1, max_size=8).map(lambda s: f"not-{s}"), st.just({"wrong": True})
        ).filter(lambda v: v not in allowed)
    if not types:
        return None  # any value is allowed
    options: list[SearchStrategy[Any]] = []
    if "string" not in types:
        options.append(st.text(max_size=8).map(lambda s: f"x{s}"))
    if "object" not in types:
        options.append(st.just({"wrong": True}))
    if "array" not in types:
        options.append(st.lists(st.integers(0, 9), min_size=1, max_size=2))
    if "boolean" not in types:
        options.append(st.booleans())
    if "null" not in types:
        options.append(st.none())
    if not types & {"integer", "number"}:
        options.append(st.integers(-9, 9))
    elif "number" not in types:
        options.append(st.sampled_from([0.5, -1.25, 3.75]))  # not integral: not an integer
    return st.one_of(options) if options else None


def tool_inputs(tool: Tool | Mapping[str, Any], *, valid: bool = True) -> SearchStrategy[dict[str, Any]]:
    """Inputs for ``tool`` (a :class:`agentfsm.tools.base.Tool` or its input schema).

    ``valid=False`` draws the mistakes models make, each invalid after the pipeline's coercion: a
    required parameter missing, a parameter of the wrong type, an unexpected parameter (only when
    the schema has ``additionalProperties: false``). When the schema admits every object there is
    no such mistake and the strategy is empty (``st.nothing()``).
    """
    schema = _tool_schema(tool)
    if valid:
        return inputs_from_schema(schema)
    variants = _mistakes(schema)
    if not variants:
        return st.nothing()
    return st.one_of(variants).filter(_invalid_after_coercion(_validator(schema), schema))


def _mistakes(schema: Mapping[str, Any]) -> list[SearchStrategy[dict[str, Any]]]:
    """The kinds of invalid input ``schema`` allows (none when it admits every object)."""
    valid_inputs = inputs_from_schema(schema)
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = [k for k in schema.get("required", ()) if isinstance(k, str)]
    variants: list[SearchStrategy[dict[str, Any]]] = []
    if required:
        variants.append(
            st.tuples(valid_inputs, st.sampled_from(required)).map(
                lambda t: {k: v for k, v in t[0].items() if k != t[1]}
            )
        )
    wrong = {k: w for k, p in props.items() if isinstance(p, Mapping) and (w := _wrong_values(p)) is not None}
    if wrong:
        variants.append(
            st.tuples(valid_inputs, st.sampled_from(sorted(wrong))).flatmap(
                lambda t: wrong[t[1]].map(lambda v, base=t[0], key=t[1]: {**base, key: v})
            )
        )
    if schema.get("additionalProperties") is False:
        extra_keys = st.text(min_size=1, max_size=10).filter(lambda k: k not in props)
        variants.append(st.tuples(valid_inputs, extra_keys, _SCALAR_JSON).map(lambda t: {**t[0], t[1]: t[2]}))
    return variants


# --- responses ---------------------------------------------------------------------------------


def _tool_list(tools: Iterable[Tool]) -> list[Tool]:
    return list(tools)


def _known_names(tools: Sequence[Tool]) -> set[str]:
    return {n for t in tools for n in (t.name, *t.aliases)}


def _with_preamble(blocks: SearchStrategy[list[Any]]) -> SearchStrategy[tuple[Any, ...]]:
    """Optional thinking and text before the blocks, as models often write before calling a tool."""
    return st.tuples(st.booleans(), st.one_of(st.none(), _TEXT), blocks).map(
        lambda t: (
            ((ThinkingBlock("planning", "sig"),) if t[0] else ())
            + ((TextBlock(t[1]),) if t[1] is not None else ())
            + tuple(t[2])
        )
    )


def text_responses() -> SearchStrategy[StreamedResponse]:
    """A final answer: visible text (sometimes after thinking), ``end_turn`` or ``stop_sequence``."""
    return st.builds(
        lambda thinking, text, stop: StreamedResponse(
            blocks=((ThinkingBlock("thinking", "sig"),) if thinking else ()) + (TextBlock(text),),
            stop_reason=stop,
        ),
        st.booleans(),
        _VISIBLE,
        st.sampled_from(["end_turn", "end_turn", "stop_sequence"]),
    )


# A user's own input strategies, by tool name (``inputs=`` of the response strategies): what a model asks
# of that tool. A tool without one draws from its JSON Schema.
ToolInputs = Mapping[str, SearchStrategy[dict[str, Any]]]


def _check_inputs(tools: Sequence[Tool], inputs: ToolInputs | None) -> ToolInputs:
    inputs = dict(inputs or {})
    unknown = sorted(set(inputs) - {t.name for t in tools})
    if unknown:
        raise ValueError(f"inputs given for tools not offered: {unknown} (offered: {sorted(t.name for t in tools)})")
    for name, strategy in inputs.items():
        if not isinstance(strategy, SearchStrategy):
            raise TypeError(f"inputs[{name!r}] must be a hypothesis strategy of input objects, not {strategy!r}")
    return inputs


def _valid_call(tools: Sequence[Tool], inputs: ToolInputs | None = None) -> SearchStrategy[tuple[str, str, Any]]:
    own = _check_inputs(tools, inputs)
    return st.sampled_from(tools).flatmap(
        lambda t: (own[t.name] if t.name in own else tool_inputs(t)).map(lambda i, n=t.name: ("use", n, i)))


def _unknown_name(tools: Sequence[Tool]) -> SearchStrategy[str]:
    known = _known_names(tools)
    mangled = [f"{n}x" for n in sorted(known)] or ["NoSuchTool"]
    return st.one_of(st.sampled_from(mangled), st.from_regex(r"\A[A-Z][a-z]{2,8}\Z")).filter(
        lambda n: n not in known
    )


def _unparsable_json(tools: Sequence[Tool]) -> SearchStrategy[str]:
    """Raw ``input_json_delta`` text that does not parse to a JSON object."""

    def not_an_object(text: str) -> bool:
        if not text.strip():
            return False  # an empty input is read as {} — valid JSON for the assembler
        try:
            return not isinstance(json.loads(text), dict)
        except ValueError:
            return True

    truncated = (
        st.sampled_from(tools).flatmap(tool_inputs).map(lambda i: json.dumps(i)[:-1])
        if tools
        else st.just('{"a": 1')
    )
    return st.one_of(
        truncated,
        st.sampled_from(['{"file_path": ', "[1, 2]", "null", "not json", '{"a":}']),
        st.text(min_size=1, max_size=12),
    ).filter(not_an_object)


def _invalid_call(tools: Sequence[Tool]) -> SearchStrategy[tuple[str, str, Any]]:
    names = st.sampled_from(tools).map(lambda t: t.name) if tools else _unknown_name(tools)
    variants: list[SearchStrategy[tuple[str, str, Any]]] = [
        st.tuples(st.just("use"), _unknown_name(tools), st.just({})),
        st.tuples(st.just("raw"), names, _unparsable_json(tools)),
    ]
    with_mistakes = [t for t in tools if _mistakes(t.input_schema)]
    if with_mistakes:
        variants.append(
            st.sampled_from(with_mistakes).flatmap(
                lambda t: tool_inputs(t, valid=False).map(lambda i, n=t.name: ("use", n, i))
            )
        )
    return st.one_of(variants)


def _call_blocks(calls: list[tuple[str, str, Any]]) -> list[ToolUseBlock | RawToolJsonBlock]:
    out: list[ToolUseBlock | RawToolJsonBlock] = []
    for i, (kind, name, payload) in enumerate(calls):
        tid = f"toolu_{i:02d}"
        block = ToolUseBlock(tid, name, payload) if kind == "use" else RawToolJsonBlock(tid, name, payload)
        out.append(block)
    return out


def tool_call_responses(
    tools: Iterable[Tool], valid: bool | None = True, *, max_calls: int = 3, inputs: ToolInputs | None = None
) -> SearchStrategy[StreamedResponse]:
    """A response calling tools (``stop_reason: tool_use``), 1..``max_calls`` calls, sometimes after
    thinking and text. Ids are ``toolu_00``, ``toolu_01``... within the response; a conversation
    needs :func:`unique_tool_ids` (which :func:`model_behaviours` applies).

    ``valid=True``: known tools with schema-valid input. ``valid=False``: every call is wrong — an
    unknown tool name, input that fails the schema (:func:`tool_inputs` ``valid=False``), or raw
    JSON that does not parse. An unparsable call is still a call: it is dispatched and answered with
    an input-validation error, as Claude Code does. ``valid=None`` mixes.

    ``inputs``: your own strategy per tool name for its valid inputs (``{"Bash": st.sampled_from([{"command":
    "rm -rf build"}, ...])}``), used instead of its JSON Schema, which never draws the inputs that matter
    to your hooks and rules.
    """
    tool_list = _tool_list(tools)
    if valid and not tool_list:
        raise ValueError("tool_call_responses(valid=True) needs at least one tool")
    if valid is None:
        call = (st.one_of(_valid_call(tool_list, inputs), _invalid_call(tool_list)) if tool_list
                else _invalid_call([]))
    else:
        call = _valid_call(tool_list, inputs) if valid else _invalid_call(tool_list)
    calls = st.lists(call, min_size=1, max_size=max_calls).map(_call_blocks)
    return _with_preamble(calls).map(lambda blocks: StreamedResponse(blocks=blocks, stop_reason="tool_use"))


def background_work_responses(*, seconds: float = 1.0,
                              tool_use_id: str = "toolu_bg") -> SearchStrategy[StreamedResponse]:
    """A tool turn that starts or stops background work (issue 30), as Claude Code 2.1.332's model may:

    * Bash with ``run_in_background``: a command that succeeds or fails after ``3 × seconds``, or ends
      after ``seconds`` (its notification joins the result of a moved command below when one is
      waiting, else comes after the turn ended: ``-p`` waits for it and runs the notification pass);
    * a foreground Bash command that outruns its ``timeout`` (``seconds``; the command takes 5× that):
      it moves to the background instead of being killed (answered no sooner than 2 s after it started,
      ``agentfsm.tools.bash.MOVED_ANSWER_AFTER_MS``: a command over by then is answered as a background
      task, with its notification);
    * TaskStop (or its alias KillShell) of a task id that names no task (an error result: the ids are
      the client's own, which a script cannot know beforehand).

    Commands only print and sleep, so a run that draws them leaves nothing behind when it ends.
    """
    # long enough that the instant scripted turns after them are over first (when they end is then
    # the same for every client). A moved command's call is answered 2 × seconds after it started
    # (MOVED_ANSWER_AFTER_MS, at the default seconds): requests then come at even multiples of
    # ``seconds``, and every command here ends at an odd one, a whole ``seconds`` from any request. (A
    # command that ends at once, or one ending on a request, races the next request: conform-933b018b08
    # ended at 2 s with a request at 2 s, conform-338ecef2b2's `echo` before or after the next request.)
    background = st.builds(
        lambda cmd, desc: ToolUseBlock(tool_use_id, "Bash", {"command": cmd, "description": desc,
                                                             "run_in_background": True}),
        st.sampled_from([f"sleep {3 * seconds:g}; echo BG_DONE", f"sleep {seconds:g}; echo BG_SOON",
                         f"sleep {3 * seconds:g}; echo BG_FAILED >&2; exit 3"]),
        st.sampled_from(["background work", "slow check"]))
    timed_out = st.just(ToolUseBlock(tool_use_id, "Bash", {
        "command": f"echo SLOW_START; sleep {5 * seconds:g}; echo SLOW_END", "description": "slow",
        "timeout": max(1, int(seconds * 1000))}))
    stop = st.sampled_from([("TaskStop", "task_id"), ("KillShell", "shell_id")]).map(
        lambda t: ToolUseBlock(tool_use_id, t[0], {t[1]: "no_such_task"}))
    return st.one_of(background, timed_out, stop).map(
        lambda b: StreamedResponse(blocks=(b,), stop_reason="tool_use"))


def malformed_responses() -> SearchStrategy[StreamedResponse]:
    """``stop_reason: tool_use`` without any tool_use block: nothing at all, or only text/thinking
    (docs/behaviour.md §3 step 4). Calls whose JSON does not parse are not malformed (they are
    dispatched): :func:`tool_call_responses` ``valid=False`` draws those."""
    empty = st.just(StreamedResponse(blocks=(), stop_reason="tool_use"))
    talk = _with_preamble(st.just([])).map(lambda b: StreamedResponse(blocks=b, stop_reason="tool_use"))
    return st.one_of(empty, talk)


def refusal_responses(tools: Iterable[Tool] = (), *,
                      inputs: ToolInputs | None = None) -> SearchStrategy[StreamedResponse]:
    """A response a safety classifier stopped (``stop_reason: refusal``): nothing, some text, or — given
    tools — calls streamed before the stop. The loop keeps what it showed, answers its calls without
    running on and asks once more (``refusal_retry``); refused again, the run ends."""
    tool_list = _tool_list(tools)
    calls = (st.lists(_valid_call(tool_list, inputs), min_size=0, max_size=2).map(_call_blocks) if tool_list
             else st.just([]))
    return _with_preamble(calls).map(lambda blocks: StreamedResponse(blocks=blocks, stop_reason="refusal"))


def max_tokens_responses() -> SearchStrategy[StreamedResponse]:
    """A response cut at the output limit: text (maybe empty, maybe after thinking) with
    ``stop_reason`` ``max_tokens`` (or the context-window variant)."""
    return st.builds(
        lambda thinking, text, stop: StreamedResponse(
            blocks=((ThinkingBlock("thinking", "sig"),) if thinking else ())
            + ((TextBlock(text),) if text else ()),
            stop_reason=stop,
        ),
        st.booleans(),
        _TEXT,
        st.sampled_from(["max_tokens", "max_tokens", "model_context_window_exceeded"]),
    )


def thinking_only_responses() -> SearchStrategy[StreamedResponse]:
    """``end_turn`` with thinking blocks and no visible text (at most whitespace)."""
    return st.builds(
        lambda thoughts, ws: StreamedResponse(
            blocks=tuple(ThinkingBlock(t, "sig") for t in thoughts) + ((TextBlock(ws),) if ws else ()),
            stop_reason="end_turn",
        ),
        st.lists(_THINKING, min_size=1, max_size=2),
        st.sampled_from(["", "", " ", "\n"]),
    )


# status -> (error type, messages); none of the messages is a prompt-too-long marker, one of the
# 400s is an image error (classified as such by agentfsm.llm.model.classify_error)
_API_ERRORS: Mapping[int, tuple[str, tuple[str, ...]]] = {
    400: (
        "invalid_request_error",
        ("messages: invalid request", "messages.0.content.1.image.source.base64: image exceeds 5 MB maximum"),
    ),
    429: ("rate_limit_error", ("Number of request tokens has exceeded your per-minute rate limit",)),
    500: ("api_error", ("Internal server error",)),
    529: ("overloaded_error", ("Overloaded",)),
}


def api_errors(statuses: Sequence[int] = (400, 429, 500, 529)) -> SearchStrategy[HttpErrorResponse]:
    """An HTTP error answered instead of a stream: 400 invalid request (or a bad image), 429 rate
    limit, 500 internal error, 529 overloaded. Other statuses get a generic ``api_error``. A status the
    SDK retries sometimes says not to (``x-should-retry: false``), so the error a run ends with, and the
    words it is shown in, are drawn too, not only the retries."""

    def make(status: int) -> SearchStrategy[HttpErrorResponse]:
        etype, messages = _API_ERRORS.get(status, ("api_error", (f"HTTP {status}",)))
        final = st.just(None) if status < 500 and status != 429 else st.sampled_from([None, None, False])
        return st.builds(lambda m, should: HttpErrorResponse(status, etype, m, should_retry=should),
                         st.sampled_from(messages), final)

    return st.sampled_from(list(statuses)).flatmap(make)


def prompt_too_long_errors() -> SearchStrategy[HttpErrorResponse]:
    """The API's prompt-too-long answer: a 400, or a 413 for a request too large (which Claude Code 2.1.332
    does not compact: it ends the run ``image_error``, and so does agentfsm)."""
    assert PROMPT_TOO_LONG_MARKERS[0] == "prompt is too long"  # the phrase classify_error looks for
    return st.builds(
        lambda status, n: HttpErrorResponse(
            status,
            "invalid_request_error" if status == 400 else "request_too_large",
            f"prompt is too long: {n} tokens > 200000 maximum",
        ),
        st.sampled_from([400, 400, 413]),
        st.integers(200_001, 400_000),
    )


def stream_breaks(tools: Iterable[Tool] = (), *, inputs: ToolInputs | None = None) -> SearchStrategy[StreamedResponse]:
    """A stream that fails part-way: the connection drops after some complete blocks (maybe in the
    middle of the next one), or the API sends an SSE ``error`` event (``overloaded_error`` and
    ``api_error`` run the complete calls shown, else resume from a complete text, else are retried as a
    whole request; another type, ``invalid_request_error`` here, runs the complete calls shown, is retried
    when nothing complete was shown, and is final otherwise). Complete
    tool_use blocks before the cut have valid input, so their tools may already have started."""
    tool_list = _tool_list(tools)
    block = st.one_of(_VISIBLE.map(TextBlock), _THINKING.map(lambda t: ThinkingBlock(t, "sig")))
    if tool_list:
        block = st.one_of(block, _valid_call(tool_list, inputs).map(lambda c: ToolUseBlock("toolu_00", c[1], c[2])))

    def renumber(blocks: list[Any]) -> tuple[Any, ...]:
        return tuple(
            attrs.evolve(b, id=f"toolu_{i:02d}") if isinstance(b, ToolUseBlock) else b
            for i, b in enumerate(blocks)
        )

    def make(blocks: tuple[Any, ...], cut: int, mid: bool, sse: str | None) -> StreamedResponse:
        stop = "tool_use" if any(isinstance(b, ToolUseBlock) for b in blocks) else "end_turn"
        cut = min(cut, len(blocks))
        error = SseError(sse, "Overloaded" if sse == "overloaded_error" else "stream failed") if sse else None
        return StreamedResponse(
            blocks=blocks,
            stop_reason=stop,
            break_after=cut,
            break_mid_block=mid and cut < len(blocks) and error is None,
            sse_error=error,
        )

    return st.builds(
        make,
        st.lists(block, min_size=0, max_size=3).map(renumber),
        st.integers(0, 3),
        st.booleans(),
        st.sampled_from([None, None, "overloaded_error", "api_error", "invalid_request_error"]),
    )


# The families of model behaviour :func:`model_responses` mixes, with their default weights.
FAMILY_WEIGHTS: Mapping[str, int] = {"text": 2, "tools": 3, "invalid_tools": 1, "malformed": 1, "max_tokens": 1,
                                     "thinking": 1, "api_errors": 1, "prompt_too_long": 1, "stream_breaks": 1,
                                     "refusals": 1}


def model_responses(tools: Iterable[Tool] = (), *, inputs: ToolInputs | None = None,
                    weights: Mapping[str, int] | None = None) -> SearchStrategy[Response]:
    """One model response of any kind, weighted towards what models mostly do (answer, call tools).

    ``inputs``: your own input strategy per tool name (see :func:`tool_call_responses`). ``weights``: how
    often each family of :data:`FAMILY_WEIGHTS` is drawn, relative to the others (0 leaves a family out);
    the families you do not name keep their default weight."""
    tool_list = _tool_list(tools)
    if inputs or weights:
        return _model_responses(tool_list, inputs, _weights(weights))
    try:
        cached = _RESPONSES_CACHE.get(tuple(tool_list))
    except TypeError:  # an unhashable tool: build afresh every time
        return _model_responses(tool_list)
    if cached is None:
        cached = _RESPONSES_CACHE[tuple(tool_list)] = _model_responses(tool_list)
    return cached


# Strategies are validated by hypothesis once per object; a state machine asks for its response
# strategy at every draw, so one object per tool set saves most of the drawing time.
_RESPONSES_CACHE: dict[tuple[Tool, ...], SearchStrategy[Response]] = {}


def _weights(weights: Mapping[str, int] | None) -> Mapping[str, int]:
    given = dict(weights or {})
    unknown = sorted(set(given) - set(FAMILY_WEIGHTS))
    if unknown:
        raise ValueError(f"unknown families {unknown}; the families are {sorted(FAMILY_WEIGHTS)}")
    bad = {k: v for k, v in given.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
    if bad:
        raise ValueError(f"a family's weight is a whole number ≥ 0: {bad}")
    out = {**FAMILY_WEIGHTS, **given}
    if not any(out.values()):
        raise ValueError("every family has weight 0: nothing to draw")
    return out


def _model_responses(tool_list: list[Tool], inputs: ToolInputs | None = None,
                     weights: Mapping[str, int] = FAMILY_WEIGHTS) -> SearchStrategy[Response]:
    families: dict[str, Callable[[], SearchStrategy[Any]]] = {
        "text": text_responses,
        "tools": lambda: tool_call_responses(tool_list, True, inputs=inputs),
        "invalid_tools": lambda: tool_call_responses(tool_list, False),
        "malformed": malformed_responses,
        "max_tokens": max_tokens_responses,
        "thinking": thinking_only_responses,
        "api_errors": api_errors,
        "prompt_too_long": prompt_too_long_errors,
        "stream_breaks": lambda: stream_breaks(tool_list, inputs=inputs),
        "refusals": lambda: refusal_responses(tool_list, inputs=inputs),
    }
    kinds: list[SearchStrategy[Any]] = []
    for name, make in families.items():
        if name == "tools" and not tool_list:
            continue
        if weights[name]:
            kinds += [make()] * weights[name]
    if not kinds:
        raise ValueError("the families left with a weight draw nothing for these tools (no tools to call)")
    return st.one_of(kinds)


def unique_tool_ids(responses: Iterable[Response], prefix: str = "toolu_") -> list[Response]:
    """The responses with every tool_use id renumbered ``{prefix}0001``, ``{prefix}0002``... across
    the list, as the API's ids are unique within a conversation."""
    out: list[Response] = []
    n = 0
    for resp in responses:
        if isinstance(resp, StreamedResponse):
            blocks = []
            for b in resp.blocks:
                if isinstance(b, ToolUseBlock | RawToolJsonBlock):
                    n += 1
                    b = attrs.evolve(b, id=f"{prefix}{n:04d}")
                blocks.append(b)
            resp = attrs.evolve(resp, blocks=tuple(blocks))
        out.append(resp)
    return out


def model_behaviours(
    tools: Iterable[Tool] = (), *, min_size: int = 1, max_size: int = 6, inputs: ToolInputs | None = None,
    weights: Mapping[str, int] | None = None
) -> SearchStrategy[list[Response]]:
    """A whole scripted conversation: the responses to the model requests of one run, in order,
    mixing every kind of :func:`model_responses` — and, given tools, a recovery followed by a tool turn
    as one step, so that every per-turn counter is raised and then meets its reset — with tool_use ids
    unique across the list (at most ``max_size`` responses). When
    the list runs out the scripted model answers ``SCENARIO_EXHAUSTED`` (end_turn), so every run
    ends. ``inputs`` and ``weights``: as for :func:`model_responses`."""
    tool_list = _tool_list(tools)
    step = model_responses(tool_list, inputs=inputs, weights=weights).map(lambda r: [r])
    if tool_list:
        # A recovery, then a tool turn: the edge that raised or set a per-turn counter, followed by the
        # next_turn that must reset it. Drawn independently, the two rarely meet in a short script
        # (none in 100 examples), so a route that forgets a reset went unseen.
        step = st.one_of(step, st.tuples(_recoveries(tool_list, inputs),
                                         tool_call_responses(tool_list, True, inputs=inputs)).map(list))
    return st.lists(step, min_size=min_size, max_size=max_size).map(
        lambda steps: unique_tool_ids([r for s in steps for r in s][:max_size]))


def _recoveries(tool_list: list[Tool], inputs: ToolInputs | None = None) -> SearchStrategy[Response]:
    """A response the loop recovers from within the turn (its counter or flag is reset by next_turn,
    or, for a stream break, by the response that ends)."""
    return st.one_of(max_tokens_responses(), malformed_responses(), thinking_only_responses(),
                     prompt_too_long_errors(), stream_breaks(tool_list, inputs=inputs),
                     refusal_responses(tool_list, inputs=inputs))


def loop_limits(*, max_turns: bool = True) -> SearchStrategy[Limits]:
    """Small caps, so the runs reach them: max turns (or none), recovery/retry caps 0..3, stop-hook
    cap 0..3, stream retries 0..2, tool concurrency 1..4. Context settings keep their defaults."""
    return st.builds(
        Limits,
        max_turns=st.one_of(st.none(), st.integers(1, 4)) if max_turns else st.none(),
        max_output_tokens_recoveries=st.integers(0, 3),
        malformed_tool_use_retries=st.integers(0, 2),
        thinking_only_nudges=st.integers(0, 1),
        stop_hook_block_cap=st.integers(0, 3),
        stream_retries=st.integers(0, 2),
        max_tool_concurrency=st.integers(1, 4),
    )
