"""The worked example of the testing kit (docs/kit.md), run exactly as printed there, so it cannot rot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agentfsm.testing.scenario import tool_response
from agentfsm.testing.stateful import assert_invariants, run_loop
from agentfsm.tools.base import tool

README = Path(__file__).resolve().parents[1] / "docs" / "kit.md"
_BLOCK = re.compile(
    r"<!-- kit-example:start[^>]*-->\s*```python\n(?P<code>.*?)```\s*<!-- kit-example:end -->", re.DOTALL)


def _example() -> str:
    found = _BLOCK.search(README.read_text(encoding="utf-8"))
    assert found is not None, "docs/kit.md lost its kit-example block"
    return found.group("code")


# the example's names live in this module, so pytest collects its TestAddMachine as it would in a
# user's test file
_namespace: dict[str, Any] = {"__name__": __name__}
exec(compile(_example(), f"{README}:kit-example", "exec"), _namespace)
TestAddMachine = _namespace["TestAddMachine"]


def test_readme_example_given_test_passes() -> None:
    _namespace["test_add_in_the_loop"]()


def test_readme_example_is_at_most_30_lines() -> None:
    assert len(_example().strip().splitlines()) <= 30


def test_readme_example_property_catches_a_wrong_tool() -> None:
    # the example's check is not vacuous: the same tool, subtracting, is caught
    add = _namespace["add"]

    @tool(add.name, add.description, add.input_schema)
    async def wrong(inp: Any, ctx: Any) -> str:
        return str(inp["a"] - inp["b"])

    run = run_loop([tool_response("toolu_1", "Add", {"a": 2, "b": 3})], tools=[wrong])
    assert_invariants(run)
    with pytest.raises(AssertionError):
        _namespace["sums_are_right"](run)
