"""JSON Schema handling for tool inputs and outputs: validators compiled once per schema, a fast
acceptance path for plainly valid input, input coercion (Claude Code's lenient parsing of numbers and
booleans sent as strings), and the issue lines a schema violation is worded with.

Validation uses ``jsonschema`` (Draft 2020-12, formats checked); nothing here decides what the model
is told — :mod:`agentfsm.runtime.pipeline` wraps these issues into its error texts. It lives with the tools because the
tool protocol is where schemas are declared; the engine and the kit use it from here.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

# ``jsonschema`` (with its referencing registry and the bundled meta-schemas) is a tenth of the
# ``-p`` start-up; it is imported when a schema first needs it: checking a schema outside the plain
# subset, or wording the issues of an input the fast check did not accept.


def schema_error(exc: BaseException) -> str | None:
    """The reason when ``exc`` is jsonschema's ``SchemaError`` (a broken schema), else None. Lets
    callers catch it without importing jsonschema before anything could have raised it."""
    js = sys.modules.get("jsonschema.exceptions")
    if js is not None and isinstance(exc, js.SchemaError):
        return str(exc.message)
    return None


def is_valid_schema(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` is a JSON Schema at all (the one check every caller uses)."""
    if _plainly_valid(schema):
        return True
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


def check_schema(schema: Mapping[str, Any]) -> None:
    """Raise :class:`jsonschema.SchemaError` with the reason when ``schema`` is not a JSON Schema."""
    if _plainly_valid(schema):
        return
    import jsonschema

    jsonschema.validators.validator_for(schema).check_schema(schema)


def compile_validator(schema: Mapping[str, Any]) -> tuple[Any, Callable[[Any], bool] | None]:
    """(validator, fast acceptance check or None) for ``schema``, shared process-wide. A schema in
    the plain subset (certainly valid) gets its jsonschema validator built on first use only."""
    text = json.dumps(schema, default=str)
    fast = _compile_fast(text)
    if fast is not None and _plain_schema(text):
        return _lazy_validator(text), fast
    return _compile_schema(text), fast


@functools.lru_cache(maxsize=512)
def _compile_schema(schema_json: str) -> Any:
    """Validators are shared by every table (the executor builds one per response), keyed by the
    schema's JSON (key order kept: issue lines follow the schema's property order); raises
    :class:`jsonschema.SchemaError` for a broken schema."""
    import jsonschema

    cls = jsonschema.Draft202012Validator
    schema = json.loads(schema_json)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


class _LazyValidator:
    """A plain schema's jsonschema validator, built (and shared through :func:`_compile_schema`)
    when an input first fails the fast check."""

    __slots__ = ("_json", "schema")

    def __init__(self, schema_json: str) -> None:
        self._json = schema_json
        self.schema = json.loads(schema_json)

    def __getattr__(self, name: str) -> Any:
        return getattr(_compile_schema(self._json), name)


@functools.lru_cache(maxsize=512)
def _lazy_validator(schema_json: str) -> _LazyValidator:
    return _LazyValidator(schema_json)


# --- the plain subset: schemas certainly valid without asking jsonschema ----------------------------
#
# A schema that only uses the fast keywords below with well-typed values is valid Draft 2020-12 by
# construction (its meta-schema asks no more of these keywords: unique type names and required
# names, non-negative lengths, strings for titles). ``$schema``/``$id`` (URIs, dialects) and anything
# else go to jsonschema's own check.

_TEXT_ANNOTATIONS = frozenset({"description", "title", "$comment"})
_FLAG_ANNOTATIONS = frozenset({"deprecated", "readOnly", "writeOnly"})
_COUNTS = frozenset({"minLength", "maxLength", "minItems", "maxItems"})


def _plainly_valid(schema: Any) -> bool:
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError):
        return False
    return _compile_fast(text) is not None and _plain_schema(text)


@functools.lru_cache(maxsize=512)
def _plain_schema(schema_json: str) -> bool:
    try:
        return _plain(json.loads(schema_json))
    except (TypeError, ValueError):
        return False


def _unique_strings(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) for v in values) and len(set(values)) == len(values)


def _plain(schema: Any) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict) or "$schema" in schema or "$id" in schema:
        return False
    for key, value in schema.items():
        if key in _TEXT_ANNOTATIONS and not isinstance(value, str):
            return False
        if key in _FLAG_ANNOTATIONS and not isinstance(value, bool):
            return False
        if key == "examples" and not isinstance(value, list):
            return False
        if key in _COUNTS and not (type(value) is int and value >= 0):
            return False
    t = schema.get("type", "object")
    if not isinstance(t, str) and not (isinstance(t, list) and t and _unique_strings(t)):
        return False
    if "required" in schema and not _unique_strings(schema["required"]):
        return False
    subs = [*schema.get("properties", {}).values()]
    if "items" in schema:
        subs.append(schema["items"])
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, bool | dict):  # 0 == False: the fast check alone would take it
        return False
    if isinstance(extra, dict):
        subs.append(extra)
    return all(_plain(sub) for sub in subs)


# --- fast acceptance of plainly valid input ----------------------------------------------------
#
# jsonschema walks a valid instance through generic keyword dispatch (~15-20 µs for a tool input of
# three fields, paid by every call). Tool schemas are nearly always the plain subset below, so a
# checker compiled from that subset answers "valid" in a few µs. It only ever *accepts*: anything it
# is unsure of (a keyword outside the subset, a float where an integer is wanted, an enum of
# objects) answers False, and the jsonschema validator then decides and words the issues. So it can
# never let through an input jsonschema would reject, nor change an error message.

_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment", "$schema", "$id",
                          "deprecated", "readOnly", "writeOnly"})
_FAST_KEYWORDS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "items", "enum",
                                 "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                 "minLength", "maxLength", "minItems", "maxItems"}
_Check = Callable[[Any], bool]


def _is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and v == v  # NaN compares with nothing: let jsonschema say


_TYPE_CHECKS: dict[str, _Check] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,  # an integral float is valid too, but jsonschema decides that
    "number": _is_number,
    "boolean": lambda v: type(v) is bool,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "null": lambda v: v is None,
}


@functools.lru_cache(maxsize=512)
def _compile_fast(schema_json: str) -> _Check | None:
    """A check that returns True only for instances ``schema_json`` certainly accepts; None when the
    schema uses anything outside the plain subset (or is not valid JSON Schema)."""
    try:
        return _fast(json.loads(schema_json))
    except (TypeError, ValueError, KeyError):
        return None


def _fast(schema: Any) -> _Check | None:
    if schema is True or schema == {}:
        return lambda _v: True
    if not isinstance(schema, dict) or not set(schema) <= _FAST_KEYWORDS:
        return None
    checks: list[_Check] = []
    t = schema.get("type")
    if t is not None:
        names = [t] if isinstance(t, str) else t
        if not isinstance(names, list) or not names or any(n not in _TYPE_CHECKS for n in names):
            return None
        type_checks = [_TYPE_CHECKS[n] for n in names]
        checks.append(type_checks[0] if len(type_checks) == 1 else
                      (lambda v, cs=tuple(type_checks): any(c(v) for c in cs)))
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            # scalars only, matched with their exact JSON type (1 is not true, 1.0 is not 1 here)
            if not isinstance(values, list) or any(type(x) not in (str, int, float, bool, type(None))
                                                   for x in values):
                return None
            allowed = frozenset((type(x), x) for x in values)
            checks.append(lambda v, a=allowed: type(v) in (str, int, float, bool, type(None))
                          and (type(v), v) in a)
    bounds = [(k, schema[k]) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
              if k in schema]
    if bounds:
        if any(not _is_number(b) for _, b in bounds):
            return None
        checks.append(lambda v, bs=tuple(bounds): not _is_number(v) or all(_within(k, b, v) for k, b in bs))
    lengths = [(k, schema[k]) for k in ("minLength", "maxLength") if k in schema]
    if lengths:
        if any(type(n) is not int for _, n in lengths):
            return None
        checks.append(lambda v, ls=tuple(lengths): type(v) is not str or all(
            (len(v) >= n) if k == "minLength" else (len(v) <= n) for k, n in ls))
    sizes = [(k, schema[k]) for k in ("minItems", "maxItems") if k in schema]
    if sizes:
        if any(type(n) is not int for _, n in sizes):
            return None
        checks.append(lambda v, ss=tuple(sizes): type(v) is not list or all(
            (len(v) >= n) if k == "minItems" else (len(v) <= n) for k, n in ss))
    if "items" in schema:
        item = _fast(schema["items"])
        if item is None:
            return None
        checks.append(lambda v, c=item: type(v) is not list or all(c(x) for x in v))
    obj = _fast_object(schema)
    if obj is False:
        return None
    if obj is not None:
        checks.append(obj)
    if not checks:
        return lambda _v: True
    if len(checks) == 1:
        return checks[0]
    return lambda v, cs=tuple(checks): all(c(v) for c in cs)


def _within(keyword: str, bound: float, v: float) -> bool:
    if keyword == "minimum":
        return v >= bound
    if keyword == "maximum":
        return v <= bound
    if keyword == "exclusiveMinimum":
        return v > bound
    return v < bound


def _fast_object(schema: dict[str, Any]) -> _Check | bool | None:
    """The object keywords' check; None when there are none, False when they are outside the subset."""
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(props, dict) or not isinstance(required, list) or extra not in (True, False) \
            or any(not isinstance(r, str) for r in required):
        return False
    if not props and not required and extra is True:
        return None
    compiled: dict[str, _Check] = {}
    for name, sub in props.items():
        c = _fast(sub)
        if c is None:
            return False
        compiled[name] = c
    req = tuple(required)
    closed = extra is False

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return True  # the object keywords apply to objects only
        for r in req:
            if r not in v:
                return False
        for k, x in v.items():
            c = compiled.get(k)
            if c is None:
                if closed:
                    return False
            elif not c(x):
                return False
        return True

    return check


# --- coercion and schema messages ------------------------------------------------------------

_INT_TEXT = re.compile(r"^[+-]?\d+$")


def _schema_types(schema: Mapping[str, Any]) -> set[str]:
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def coerce_input(value: Any, schema: Any) -> Any:
    """Models often send ``"true"`` or ``"5"`` where the schema wants a boolean or a number; turn
    such strings into the schema's type (top level, nested ``properties`` and array ``items``).
    Mappings are copied, never mutated."""
    if not isinstance(schema, Mapping):
        return dict(value) if isinstance(value, Mapping) else value
    if isinstance(value, str):
        return _coerce_text(value, _schema_types(schema))
    if isinstance(value, Mapping):
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        return {k: coerce_input(v, props[k]) if k in props else v for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [coerce_input(v, items) for v in value]
    return value


def _coerce_text(text: str, types: set[str]) -> Any:
    if not types or "string" in types:
        return text
    s = text.strip()
    if "boolean" in types and s in ("true", "false"):
        return s == "true"
    if ("integer" in types or "number" in types) and _INT_TEXT.match(s):
        return int(s)
    if "number" in types:
        try:
            number = float(s)
        except ValueError:
            return text
        if math.isfinite(number):
            return number
    return text


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _param(path: Sequence[Any], leaf: str | None = None) -> str:
    parts = [str(p) for p in path] + ([leaf] if leaf is not None else [])
    return ".".join(parts)


def _unexpected(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return [k for k in instance if k not in props and not any(re.search(p, k) for p in patterns)]


def schema_issues(validator: Any, value: Any) -> list[str]:
    """One line per problem, in Claude Code's words; missing and mistyped parameters first (in the
    schema's property order), unexpected ones last — the order a Zod parse would report them."""
    order = {k: i for i, k in enumerate(validator.schema.get("properties", {}) or {})}
    lines: list[tuple[int, int, str]] = []
    err: ValidationError
    for err in validator.iter_errors(value):
        path = list(err.absolute_path)
        rank = order.get(str(path[0]), len(order)) if path else len(order)
        if err.validator == "required" and isinstance(err.instance, Mapping):
            for prop in err.validator_value:
                if prop not in err.instance:
                    r = rank if path else order.get(prop, len(order))
                    lines.append((0, r, f"The required parameter `{_param(path, prop)}` is missing"))
        elif err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
            for extra in _unexpected(err.instance, err.schema):
                lines.append((1, rank, f"An unexpected parameter `{_param(path, extra)}` was provided"))
        elif err.validator == "type":
            want = err.validator_value
            expected = want if isinstance(want, str) else " | ".join(want)
            subject = f"The parameter `{_param(path)}`" if path else "The tool input"
            lines.append((0, rank, f"{subject} type is expected as `{expected}` but provided as "
                                   f"`{json_type(err.instance)}`"))
        elif path:
            lines.append((0, rank, f"The parameter `{_param(path)}` is invalid: {err.message}"))
        else:
            lines.append((0, rank, err.message))
    seen: set[str] = set()
    out = []
    for _, _, line in sorted(lines, key=lambda x: (x[0], x[1])):
        if line not in seen:
            seen.add(line)
            out.append(line)
    return out


# --- JSON Schema problems in ajv's words (what Claude Code tells the model about a StructuredOutput) --

_AJV_BOUNDS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
_AJV_COUNTS = {"minLength": ("fewer", "characters"), "maxLength": ("more", "characters"),
               "minItems": ("fewer", "items"), "maxItems": ("more", "items"),
               "minProperties": ("fewer", "properties"), "maxProperties": ("more", "properties")}


def _ajv_message(err: ValidationError) -> list[str]:
    kind, want = err.validator, err.validator_value
    if kind == "type":
        return [f"must be {want if isinstance(want, str) else ','.join(want)}"]
    if kind == "required" and isinstance(err.instance, Mapping):
        return [f"must have required property '{p}'" for p in want if p not in err.instance]
    if kind == "additionalProperties" and isinstance(err.instance, Mapping):
        return [f"must NOT have additional properties ('{k}' is not allowed)"
                for k in _unexpected(err.instance, err.schema)]
    if kind in _AJV_BOUNDS:
        return [f"must be {_AJV_BOUNDS[str(kind)]} {want}"]
    if kind in _AJV_COUNTS:
        more, unit = _AJV_COUNTS[str(kind)]
        return [f"must NOT have {more} than {want} {unit}"]
    if kind == "enum":
        return ["must be equal to one of the allowed values"]
    if kind == "const":
        return ["must be equal to constant"]
    if kind == "pattern":
        return [f'must match pattern "{want}"']
    if kind == "format":
        return [f'must match format "{want}"']
    return [err.message]


def ajv_issues(validator: Any, value: Any) -> list[str]:
    """``<path>: <problem>`` for each problem, as ajv words them (``root`` for the value itself, else a
    JSON pointer such as ``/answer``); problems of the outer value first."""
    found: list[tuple[int, str]] = []
    for err in validator.iter_errors(value):
        path = list(err.absolute_path)
        where = "/" + "/".join(str(p) for p in path) if path else "root"
        found += [(len(path), f"{where}: {m}") for m in _ajv_message(err)]
    return [text for _, text in sorted(found, key=lambda x: x[0])]
