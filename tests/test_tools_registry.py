"""ToolRegistry and builtin_tools(): lookup, suggestions, subsets, schemas, custom tools."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agentfsm.tools import ToolRegistry, builtin_tools, tool
from agentfsm.tools.base import NoFileRules, Tool, ToolContext, ToolError, ToolOutput

BUILTIN = ["Agent", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "TaskStop"]


@tool("Shout", "Upper-cases text.", {"type": "object", "properties": {"text": {"type": "string"}},
                                     "required": ["text"], "additionalProperties": False},
      concurrency_safe=True, interrupt="cancel", aliases=("Yell",))
async def shout(input: Mapping[str, Any], ctx: ToolContext) -> str:
    if not input["text"]:
        raise ToolError("Nothing to shout.")
    return input["text"].upper()


def test_builtin_tools_are_fresh_instances_with_claude_code_names() -> None:
    first, second = builtin_tools(), builtin_tools()
    assert [t.name for t in first] == BUILTIN
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert all(isinstance(t, Tool) for t in first)


def test_every_schema_is_valid_and_closed() -> None:
    for t in builtin_tools():
        jsonschema.Draft202012Validator.check_schema(t.input_schema)
        assert t.input_schema["type"] == "object"
        assert t.input_schema["additionalProperties"] is False, t.name
        assert t.description and len(t.description) < 1000, t.name
        api = t.api_schema()
        assert set(api) == {"name", "description", "input_schema"}


def test_concurrency_traits() -> None:
    reg = ToolRegistry(builtin_tools())
    assert reg["Read"].is_concurrency_safe({}) and reg["Glob"].is_concurrency_safe({})
    assert reg["Grep"].is_concurrency_safe({})
    assert not reg["Write"].is_concurrency_safe({}) and not reg["Edit"].is_concurrency_safe({})
    assert reg["Bash"].is_concurrency_safe({"command": "ls"})
    assert not reg["Bash"].is_concurrency_safe({"command": "make"})
    assert [t.interrupt_behavior() for t in reg] == ["cancel", "block", "cancel", "cancel", "cancel",
                                                     "block", "block", "block"]


def test_lookup_by_name_and_alias() -> None:
    reg = ToolRegistry([*builtin_tools(), shout])
    assert reg.get("Shout") is shout and reg.get("Yell") is shout
    assert reg.get("shout") is None  # names are case-sensitive, as the API is
    assert "Yell" in reg and "Nope" not in reg
    assert reg.names() == [*BUILTIN, "Shout"]
    with pytest.raises(KeyError):
        reg["Nope"]
    assert len(reg) == len(BUILTIN) + 1  # the built-ins and Shout


def test_closest_for_did_you_mean() -> None:
    reg = ToolRegistry([*builtin_tools(), shout])
    assert reg.closest("Reed") == "Read"
    assert reg.closest("grep") == "Grep"
    assert reg.closest("Yel") == "Shout"  # an alias leads to its tool's name
    assert reg.closest("WebFetch") is None


def test_subset_keeps_registry_order_and_accepts_aliases() -> None:
    reg = ToolRegistry([*builtin_tools(), shout])
    sub = reg.subset(["Write", "Read", "Yell", "Read", ""])
    assert sub.names() == ["Read", "Write", "Shout"]
    assert sub.get("Read") is reg.get("Read")


def test_subset_rejects_unknown_names_clearly() -> None:
    reg = ToolRegistry(builtin_tools())
    with pytest.raises(ValueError) as err:
        reg.subset(["Read", "Reed", "Frobnicate"])
    assert str(err.value) == ("Unknown tools: Reed (did you mean Read?), Frobnicate. "
                              "Available tools: Agent, Bash, Glob, Grep, Read, Edit, Write, TaskStop")


def test_without() -> None:
    reg = ToolRegistry([*builtin_tools(), shout])
    expected = ["Agent", "Glob", "Grep", "Read", "Edit", "Write", "TaskStop"]
    assert reg.without(["Bash", "Yell", "NotThere"]).names() == expected


def test_duplicate_names_and_aliases_are_refused() -> None:
    reg = ToolRegistry(builtin_tools())
    with pytest.raises(ValueError, match="already taken"):
        reg.register(builtin_tools()[0])

    class Clash(Tool):
        name = "Other"
        aliases = ("Read",)

    with pytest.raises(ValueError, match="'Read' is already taken by Read"):
        reg.register(Clash())
    assert "Other" not in reg


def test_api_schemas() -> None:
    reg = ToolRegistry([*builtin_tools(), shout])
    schemas = reg.api_schemas()
    assert [s["name"] for s in schemas] == reg.names()
    assert schemas[-1] == {"name": "Shout", "description": "Upper-cases text.",
                           "input_schema": shout.input_schema}


async def test_a_decorated_tool_runs(tmp_path: Path) -> None:
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules())
    assert await shout.call({"text": "hi"}, ctx) == ToolOutput("HI")
    with pytest.raises(ToolError, match="Nothing to shout"):
        await shout.call({"text": ""}, ctx)
    assert shout.is_concurrency_safe({}) and shout.interrupt_behavior() == "cancel"


def test_every_builtin_tool_tells_the_model_each_parameters_type_and_meaning() -> None:
    """The API takes an object schema; the model learns what to pass from each property's type and
    description, so neither may be missing."""
    for t in builtin_tools():
        schema = t.input_schema
        assert schema["type"] == "object", t.name
        for name, prop in schema["properties"].items():
            assert "type" in prop or "anyOf" in prop or "enum" in prop, (t.name, name)
            assert isinstance(prop.get("description"), str) and prop["description"].strip(), (t.name, name)
