"""``StructuredOutput``: how a run with ``--json-schema`` hands back its final answer.

Claude Code offers this tool whenever a JSON schema is set: the model ends the run by calling it
with the answer as the tool input. The tool's input schema *is* the user's schema, so the pipeline's
JSON Schema validation (``jsonschema``, docs/behaviour.md §4 step 4) checks the answer before :meth:`call` runs;
an invalid answer becomes an ``InputValidationError`` result the model can correct. A valid one ends
the turn without another model call (``ends_turn``) and becomes the result's ``structured_output``.

The API wants an object as tool input; a schema for anything else (an array, a string) is wrapped
as ``{"output": <schema>}`` and unwrapped again, so every JSON Schema can be asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentfsm.tools.base import Tool, ToolContext, ToolOutput
from agentfsm.tools.schema import ajv_issues, check_schema, compile_validator

NAME = "StructuredOutput"
WRAP_KEY = "output"
SUCCESS_TEXT = "Structured output provided successfully"


def _is_object_schema(schema: Mapping[str, Any]) -> bool:
    t = schema.get("type")
    return t == "object" or (t is None and ("properties" in schema or "required" in schema))


class StructuredOutputTool(Tool):
    """The final-answer tool of a ``--json-schema`` run. ``schema`` is checked once, here, so a
    broken schema is a clear error when the session starts rather than a failure of every call."""

    name = NAME
    ends_turn = True

    def __init__(self, schema: Mapping[str, Any]) -> None:
        check_schema(schema)
        self.schema = dict(schema)
        self.wrapped = not _is_object_schema(schema)
        self.input_schema = (
            {"type": "object", "properties": {WRAP_KEY: self.schema}, "required": [WRAP_KEY],
             "additionalProperties": False}
            if self.wrapped else self.schema)
        self.description = (
            "Use this tool to return your final response in the requested structured format. Call it "
            "exactly once, at the end, with input that matches the schema; the run ends after it.")

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return True

    def invalid_input_text(self, input: Any) -> str | None:
        """Claude Code's text for an answer that does not match the schema (sent without a
        ``<tool_use_error>`` wrapper): the problems in ajv's words, joined by ``, ``."""
        validator, _ = compile_validator(self.input_schema)
        issues = ajv_issues(validator, input)
        return f"Output does not match required schema: {', '.join(issues)}" if issues else None

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        # no side effect: it only records the answer, so no permission mode needs to ask for it
        return True

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        value = input[WRAP_KEY] if self.wrapped else dict(input)
        return ToolOutput(value, ends_turn=True)

    def map_result(self, output: ToolOutput, tool_use_id: str) -> dict[str, Any]:
        if output.is_error:
            return super().map_result(output, tool_use_id)
        return {"type": "tool_result", "tool_use_id": tool_use_id, "content": SUCCESS_TEXT}
