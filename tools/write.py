"""Write: create a file or replace one the model has read (Claude Code's FileWrite tool)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentfsm.tools.base import Tool, ToolContext, ToolError, ToolOutput, ValidationResult, normalised_path_input
from agentfsm.tools.patch import structured_patch
from agentfsm.tools.read import (
    FILE_STATE_CURRENT,
    absolute,
    access_denied,
    check_fresh,
    record_read,
    require_access,
    validate_access,
)


class WriteTool(Tool):
    name = "Write"
    description = (
        "Writes a file to the local filesystem, creating missing parent directories. Overwrites the file "
        "if it exists: an existing file must have been read with the Read tool first in this "
        "conversation, and must not have changed since, or the write is refused. Prefer Edit for "
        "changes to existing files; use Write for new files or complete rewrites."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string",
                          "description": "The absolute path to the file to write (must be absolute, "
                                         "not relative)"},
            "content": {"type": "string", "description": "The content to write to the file"},
        },
        "required": ["file_path", "content"],
        "additionalProperties": False,
    }


    def denial_input(self, input: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
        # Claude Code lists the path absolute and normalised (symlinks kept)
        return normalised_path_input(super().denial_input(input, cwd), cwd)
    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        path = absolute(ctx, input["file_path"])
        # the permission settings first: a denied file gets no word about its state
        denied = await asyncio.to_thread(validate_access, ctx, path, "write")
        if denied is not None:
            return denied
        try:
            _check(ctx, path)
        except ToolError as exc:
            return ValidationResult.invalid(str(exc))
        return ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        path = absolute(ctx, input["file_path"])
        # Checked again: hooks and permission prompts run between validation and the call.
        await asyncio.to_thread(require_access, ctx, path, "write")
        existed = _check(ctx, path)
        # the old text only where it may be read (a write-only file's content is not shown anywhere)
        readable = existed and access_denied(ctx, path, "read") is None
        original = await asyncio.to_thread(_original, path) if readable else None
        await asyncio.to_thread(_write, path, input["content"])
        record_read(ctx, path)
        # what an SDK user receives (Claude Code's fields): a new file has no patch
        structured = {"type": "update" if existed else "create", "filePath": input["file_path"],
                      "content": input["content"],
                      "structuredPatch": structured_patch(original, input["content"]) if original is not None else [],
                      "originalFile": original, "userModified": ctx.user_modified}
        if ctx.user_modified:  # Claude Code's words, without the file-state note
            verb = f"The file {input['file_path']} has been updated successfully." if existed else \
                f"File created successfully at: {input['file_path']}"
            return ToolOutput(f"{verb} The user modified your proposed content before accepting it.",
                              structured=structured)
        if existed:
            return ToolOutput(f"The file {input['file_path']} has been updated successfully.{FILE_STATE_CURRENT}",
                              structured=structured)
        return ToolOutput(f"File created successfully at: {input['file_path']}{FILE_STATE_CURRENT}",
                          structured=structured)


def _check(ctx: ToolContext, path: Path) -> bool:
    """True when ``path`` exists (and so must be fresh); raises when it may not be written."""
    if path.is_dir():
        raise ToolError(f"{path} is a directory; Write needs a file path.")
    if not path.exists():
        return False
    if not path.is_file():  # a FIFO would block the write until a reader came, a device never ends
        raise ToolError(f"{path} is not a regular file; Write only writes regular files.")
    check_fresh(ctx, path)
    return True


def _original(path: Path) -> str | None:
    """The file's text before it is overwritten (None when it cannot be read: the write reports that)."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _write(path: Path, content: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # newline="" writes the content byte for byte: no platform newline translation.
        with path.open("w", encoding="utf-8", newline="") as fh:
            fh.write(content)
    except OSError as exc:
        raise ToolError(f"Could not write {path}: {exc.strerror or exc}") from exc
