"""The Tool protocol (docs/behaviour.md §4) and the records a tool call produces.

A tool is a subclass of :class:`Tool` (or a coroutine wrapped with :func:`tool`). The executor
(``agentfsm.executor``) runs every call through the 15-step pipeline (``agentfsm.pipeline``); a tool only
describes itself and does its work in :meth:`Tool.call`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

InterruptBehavior = Literal["cancel", "block"]


@attrs.frozen
class ValidationResult:
    ok: bool
    message: str = ""

    @classmethod
    def valid(cls) -> ValidationResult:
        return cls(True)

    @classmethod
    def invalid(cls, message: str) -> ValidationResult:
        return cls(False, message)


@attrs.frozen
class ToolOutput:
    """What :meth:`Tool.call` returns. ``data`` is mapped to the tool_result content by
    :meth:`Tool.map_result`; ``ends_turn`` ends the run after this batch without another model call;
    ``context_layers`` are merged into the shared context only for concurrency-unsafe tools."""

    data: Any
    is_error: bool = False
    ends_turn: bool = False
    context_layers: Mapping[str, Any] = attrs.field(factory=dict)


class ToolError(Exception):
    """Raised by a tool for an expected failure; its message becomes an ``is_error`` tool_result."""


@attrs.define
class ToolContext:
    """Live context handed to one tool call. Not a record: it holds the abort signal and callbacks.

    ``read_files`` maps absolute paths to the mtime at which Read last saw them (Edit/Write refuse
    files not read first or changed since). ``layers`` is a read-only view of the shared context.
    """

    cwd: Path
    session_id: str = ""
    tool_use_id: str = ""
    abort: asyncio.Event = attrs.field(factory=asyncio.Event)
    read_files: dict[str, float] = attrs.field(factory=dict)
    layers: Mapping[str, Any] = attrs.field(factory=dict)
    on_progress: Callable[[str, Any], None] | None = None
    # services the host provides (e.g. "run_subagent" for the Agent tool)
    services: Mapping[str, Any] = attrs.field(factory=dict)

    def progress(self, data: Any) -> None:
        if self.on_progress is not None:
            self.on_progress(self.tool_use_id, data)

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.cwd / p)


class Tool:
    """Base class: override the class attributes and :meth:`call`; every hook has a safe default."""

    name: str = ""
    aliases: tuple[str, ...] = ()
    description: str = ""
    input_schema: Mapping[str, Any] = {"type": "object", "properties": {}}
    output_schema: Mapping[str, Any] | None = None
    ends_turn: bool = False

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return False

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        """Used by ``plan`` mode and ``acceptEdits``; defaults to the concurrency verdict."""
        return self.is_concurrency_safe(input)

    def interrupt_behavior(self) -> InterruptBehavior:
        return "block"

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        return ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        raise NotImplementedError(f"tool {self.name} does not implement call()")

    def map_result(self, output: ToolOutput, tool_use_id: str) -> dict[str, Any]:
        """The ``tool_result`` block for ``output``."""
        data = output.data
        if isinstance(data, str):
            content: Any = data
        elif isinstance(data, list) and all(isinstance(b, Mapping) and "type" in b for b in data):
            content = [dict(b) for b in data]
        else:
            content = json.dumps(data, ensure_ascii=False, default=str)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
        if output.is_error:
            block["is_error"] = True
        return block

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        """What permission rules' specifiers match (a path for file tools, the command for Bash)."""
        for key in ("file_path", "path", "command", "pattern", "url"):
            if isinstance(input.get(key), str):
                return input[key]
        return None

    def api_schema(self) -> dict[str, Any]:
        """The tool as sent in the request's ``tools`` list."""
        return {"name": self.name, "description": self.description, "input_schema": dict(self.input_schema)}


class ReadOnlyTool(Tool):
    """A tool that only reads: it may run beside other safe tools, is allowed in ``plan`` mode, and
    an interrupt may cancel it (nothing half-written is left behind)."""

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return True

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        return True

    def interrupt_behavior(self) -> InterruptBehavior:
        return "cancel"


ToolFn = Callable[[Mapping[str, Any], ToolContext], Awaitable[Any]]


def tool(
    name: str,
    description: str,
    input_schema: Mapping[str, Any],
    *,
    concurrency_safe: bool = False,
    read_only: bool | None = None,
    interrupt: InterruptBehavior = "block",
    ends_turn: bool = False,
    output_schema: Mapping[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
) -> Callable[[ToolFn], Tool]:
    """Turn ``async def fn(input, ctx)`` into a :class:`Tool`. A plain return value becomes the
    result; raise :class:`ToolError` for an error result."""

    def wrap(fn: ToolFn) -> Tool:
        class _FnTool(Tool):
            async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
                value = await fn(input, ctx)
                return value if isinstance(value, ToolOutput) else ToolOutput(value)

            def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
                return concurrency_safe

            def is_read_only(self, input: Mapping[str, Any]) -> bool:
                return concurrency_safe if read_only is None else read_only

            def interrupt_behavior(self) -> InterruptBehavior:
                return interrupt

        inst = _FnTool()
        inst.name, inst.description, inst.input_schema = name, description, input_schema
        inst.output_schema, inst.ends_turn, inst.aliases = output_schema, ends_turn, aliases
        inst.__doc__ = fn.__doc__
        return inst

    return wrap
