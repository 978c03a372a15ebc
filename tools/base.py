"""The Tool protocol (docs/behaviour.md §4) and the records a tool call produces.

A tool is a subclass of :class:`Tool` (or a coroutine wrapped with :func:`tool`). The executor
(``agentfsm.executor``) runs every call through the 15-step pipeline (``agentfsm.runtime.pipeline``); a tool only
describes itself and does its work in :meth:`Tool.call`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

import attrs

InterruptBehavior = Literal["cancel", "block"]
Access = Literal["read", "write"]


@attrs.frozen
class ValidationResult:
    """A tool's verdict on its input. ``denied``: the input names a file the permission settings
    deny; the call is then reported as a permission denial, not as bad input."""

    ok: bool
    message: str = ""
    denied: bool = False

    @classmethod
    def valid(cls) -> ValidationResult:
        return cls(True)

    @classmethod
    def invalid(cls, message: str) -> ValidationResult:
        return cls(False, message)

    @classmethod
    def deny(cls, message: str) -> ValidationResult:
        return cls(False, message, denied=True)


# --- file access: the port through which every file tool asks the permission settings -----------

# Claude Code's texts: a path a rule denies as given, and one reached through a link or searched.
FILE_DENIED = "File is in a directory that is denied by your permission settings."


def normalised_path_input(input: Mapping[str, Any], cwd: Path, key: str = "file_path") -> dict[str, Any]:
    """``input`` with its path made absolute and ``..`` folded (symlinks kept), as Claude Code's file
    tools echo it (``../out/o.txt`` → ``/…/out/o.txt``)."""
    out = dict(input)
    value = out.get(key)
    if isinstance(value, str) and value and "\x00" not in value:
        out[key] = os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))
    return out


def read_denied(path: str) -> str:
    return f"Permission to read {path} has been denied."


def write_denied(path: str) -> str:
    return f"Permission to write {path} has been denied."


@attrs.frozen
class AccessDenial:
    """Why a path may not be read or written: the deny ``rule`` (its text, for logs), and whether the
    path reached it only once resolved (``through_link``: a symlink or a hard link)."""

    path: str
    rule: str
    through_link: bool = False

    def message(self, access: Access, *, search: bool = False) -> str:
        """The text the model sees (Claude Code's wording; it marks only the first as a tool error)."""
        if search or self.through_link:
            return read_denied(self.path) if access == "read" else write_denied(self.path)
        return f"<tool_use_error>{FILE_DENIED}</tool_use_error>"


class FileAccess(Protocol):
    """The file-access policy a tool call runs under (implemented by :mod:`agentfsm.hooks`, wired in
    by the composition root). Paths are absolute; links are resolved by the policy, not the caller."""

    def denial(self, path: str, access: Access) -> AccessDenial | None:
        """Why ``path`` may not be read (``access="read"``) or written, or None."""

    def tree_denial(self, directory: str, access: Access) -> AccessDenial | None:
        """Why nothing below ``directory`` may be read or written as a whole — the directory itself
        is denied, or every path inside it is — or None (single entries may still be denied)."""


class NoFileRules:
    """A file-access policy without rules: everything may be read and written. Only ever used when a
    caller passes it explicitly (tests, a bare engine)."""

    def denial(self, path: str, access: Access) -> AccessDenial | None:
        return None

    def tree_denial(self, directory: str, access: Access) -> AccessDenial | None:
        return None


class _NoPolicy:
    """What a tool sees when nobody wired a file-access policy: every path is denied (fail closed)."""

    RULE = "no file-access policy was configured"

    def denial(self, path: str, access: Access) -> AccessDenial | None:
        return AccessDenial(path, self.RULE)

    def tree_denial(self, directory: str, access: Access) -> AccessDenial | None:
        return AccessDenial(directory, self.RULE)


NO_POLICY: FileAccess = _NoPolicy()


#: The key of the session's background tasks in :attr:`ToolContext.services` (a :class:`TaskHost`).
TASKS = "tasks"


@attrs.frozen
class TaskStarted:
    """A background task a tool handed to the host: its id and the file its output goes to."""

    task_id: str
    output_file: str


@attrs.frozen
class TaskStopped:
    """A task :meth:`TaskHost.stop` ended: its id, kind (``local_bash``, ``local_agent``) and what it ran."""

    task_id: str
    task_type: str
    command: str


class TaskHost(Protocol):
    """What a tool may ask of the session's background tasks (``ctx.services[TASKS]``; the session's
    is :class:`agentfsm.runtime.tasks.TaskRegistry`)."""

    def adopt_command(self, process: asyncio.subprocess.Process, output_path: Path, *, command: str,
                      description: str, tool_use_id: str, timeout_ms: float,
                      on_exit: Callable[[], None] | None = None) -> TaskStarted:
        """Own ``process`` (a started command writing to ``output_path``) as a background task: it
        runs on, is stopped after ``timeout_ms``, and its end notifies the model."""
        ...

    async def stop(self, task_id: str) -> TaskStopped | None:
        """Stop a running task; None when no running task has this id."""
        ...

    async def ended(self, task_id: str) -> None:
        """Return once the end of a task whose process has exited is reported (its notification, if
        any, queued); at once for a task that is not running."""
        ...


@attrs.frozen
class ToolOutput:
    """What :meth:`Tool.call` returns. ``data`` is mapped to the tool_result content by
    :meth:`Tool.map_result`; ``ends_turn`` ends the run after this batch without another model call;
    ``context_layers`` are merged into the shared context only for concurrency-unsafe tools."""

    data: Any
    is_error: bool = False
    ends_turn: bool = False
    context_layers: Mapping[str, Any] = attrs.field(factory=dict)
    # what an SDK user receives as the call's structured result (``UserMessage.tool_use_result`` and
    # PostToolUse's ``tool_response``: Claude Code's per-tool objects); None: ``data`` stands for it
    structured: Any = None


class ToolError(Exception):
    """Raised by a tool for an expected failure; its message becomes an ``is_error`` tool_result,
    wrapped in ``<tool_use_error>`` unless ``wrapped=False`` (Claude Code sends some errors bare: a
    missing file for Read, a missing path for Glob and Grep, a rejected search pattern)."""

    def __init__(self, message: str, *, wrapped: bool = True) -> None:
        super().__init__(message)
        self.wrapped = wrapped


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
    # the permission settings' file-access policy; None (nobody wired one) denies every path
    file_access: FileAccess | None = None
    # the permission prompt changed the input before allowing it: file tools tell the model (Claude Code)
    user_modified: bool = False

    @property
    def access(self) -> FileAccess:
        """The file-access policy to ask; fails closed when none was given."""
        return self.file_access if self.file_access is not None else NO_POLICY

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
    # values of optional inputs Claude Code fills in when the model leaves them out (its Edit shows
    # ``replace_all: false`` to the model, the hooks and the SDK); the driver fills them in
    input_defaults: Mapping[str, Any] = {}

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

    def denial_input(self, input: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
        """The input as the run's ``permission_denials`` list it: as given, with the schema's defaults
        and :attr:`input_defaults` filled in for what the model left out (Claude Code's parsed input)."""
        out = {**self.input_defaults, **input}
        props = self.input_schema.get("properties", {})
        for key, spec in props.items() if isinstance(props, Mapping) else ():
            if isinstance(spec, Mapping) and "default" in spec and key not in out:
                out[key] = spec["default"]
        return out

    def invalid_input_text(self, input: Any) -> str | None:
        """The whole error text for input that fails the schema, when the tool words it itself;
        None (the default): the pipeline's ``InputValidationError`` listing."""
        return None

    def task_target(self, input: Mapping[str, Any]) -> str | None:
        """The id of the session's background task this call acts on (TaskStop's), None for a call that
        acts on none (the default). A runtime whose tasks run elsewhere runs such a call where the task
        runs (docs/temporal.md, "Background commands")."""
        return None

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
