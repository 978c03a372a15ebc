"""The plain-schema shortcut of agentfsm.tools.schema: a schema it calls certainly valid is one
jsonschema accepts too, a broken one is still reported, and the lazily built validator words the
same issues as the eager one."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.tools import schema as S

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(allow_nan=False, width=16),
                    st.text(max_size=3), st.lists(st.sampled_from(["a", "b", "string", "object", "integer"]),
                                                  max_size=3))
_KEYS = st.sampled_from(sorted(S._FAST_KEYWORDS - {"$schema", "$id"}))  # dialects: never plain


def _schemas(depth: int = 2) -> st.SearchStrategy[dict]:
    leaf = st.dictionaries(_KEYS, _VALUES, max_size=4)
    if depth == 0:
        return leaf
    sub = _schemas(depth - 1)
    return st.one_of(
        leaf,
        st.builds(lambda base, props, items: {**base, "properties": props, **({"items": items} if items else {})},
                  leaf, st.dictionaries(st.sampled_from(["a", "b"]), sub, max_size=2), st.none() | sub),
    )


def _jsonschema_says_valid(schema: dict) -> bool:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(_schemas())
def test_plainly_valid_schemas_are_valid_for_jsonschema(schema: dict) -> None:
    if S._plainly_valid(schema):
        assert _jsonschema_says_valid(schema), schema
    assert S.is_valid_schema(schema) == _jsonschema_says_valid(schema)


@pytest.mark.parametrize("broken", [
    {"type": "object", "required": ["a", "a"]},
    {"type": "string", "minLength": -1},
    {"type": []},
    {"type": ["string", "string"]},
    {"type": "strng"},
    {"title": 3},
    {"type": "object", "properties": {"a": {"maxItems": 1.5}}},
    {"deprecated": "yes"},
    {"type": None},
])
def test_broken_schemas_in_the_fast_keywords_are_still_reported(broken: dict) -> None:
    assert not S.is_valid_schema(broken)
    with pytest.raises(jsonschema.SchemaError):
        S.check_schema(broken)
    with pytest.raises(jsonschema.SchemaError) as info:
        S.compile_validator(broken)
    assert S.schema_error(info.value) == info.value.message
    assert S.schema_error(ValueError("x")) is None


def test_dialect_keywords_are_left_to_jsonschema() -> None:
    assert not S._plainly_valid({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"})
    assert S.is_valid_schema({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"})


def test_the_lazy_validator_words_the_same_issues_as_the_eager_one() -> None:
    schema = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer", "minimum": 1}},
              "required": ["path"], "additionalProperties": False}
    lazy, fast = S.compile_validator(schema)
    assert isinstance(lazy, S._LazyValidator) and fast is not None
    eager = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for value in ({"n": 0, "x": 1}, {"path": 3}, [], {"path": "p", "n": 2}):
        assert S.schema_issues(lazy, value) == S.schema_issues(eager, value)
