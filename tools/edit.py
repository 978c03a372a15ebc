"""Edit: exact string replacement in a file the model has read (Claude Code's FileEdit tool)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from agentfsm.tools.base import Tool, ToolContext, ToolError, ToolOutput, ValidationResult, normalised_path_input
from agentfsm.tools.patch import structured_patch
from agentfsm.tools.read import (
    FILE_STATE_CURRENT,
    MODIFIED_SINCE_READ,
    NOT_READ_YET,
    absolute,
    last_read,
    not_found_message,
    open_regular,
    record_read,
    require_access,
    validate_access,
)

#: Largest file Edit reads into memory to change it.
MAX_EDIT_BYTES = 64 * 1024 * 1024
SAME_STRINGS = "No changes to make: old_string and new_string are exactly the same."
ALREADY_EXISTS = "Cannot create new file - file already exists."
NOT_FOUND = "String to replace not found in file."
#: Claude Code's note when a file changed since it was read and the edit still applied (old_string was
#: there, once): the edit is made rather than refused, and the model is told its view is partial.
STALE_NOTE = (" (note: the file had been modified on disk since you last read it \u2014 the edit applied "
              "cleanly, but the file contains other changes not in your context. Read it before edits that "
              "depend on surrounding content.)")

# Models often type straight quotes where the file has typographic ones (and the reverse).
_CURLY = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}


@attrs.frozen
class PlannedEdit:
    """What :meth:`EditTool.call` will write, worked out without touching the file."""

    path: Path
    new_text: str
    # index in new_text where the first replacement starts, for the snippet
    anchor: int
    inserted: str
    creates: bool
    crlf: bool
    bom: bool
    # the file changed on disk since the model read it (the edit still applied)
    stale: bool = False
    # the file's text before the edit (None: it did not exist)
    original: str | None = None


def normalize_quotes(text: str) -> str:
    for curly, straight in _CURLY.items():
        text = text.replace(curly, straight)
    return text


def find_actual_string(text: str, old: str) -> str | None:
    """``old`` as it occurs in ``text``: itself, or the same with the file's typographic quotes."""
    if old in text:
        return old
    at = normalize_quotes(text).find(normalize_quotes(old))
    # Quote normalisation maps one character to one, so offsets carry over to the original text.
    return text[at:at + len(old)] if at != -1 else None


def _styled_new(old: str, actual: str, new: str) -> str:
    """Give ``new`` the file's typographic quotes when ``actual`` only matched after normalising."""
    if actual == old:
        return new
    has_double = "\u201c" in actual or "\u201d" in actual
    has_single = "\u2018" in actual or "\u2019" in actual
    out: list[str] = []
    for i, ch in enumerate(new):
        opening = i == 0 or new[i - 1] in " \t\n\r([{\u2014\u2013"
        if ch == '"' and has_double:
            out.append("\u201c" if opening else "\u201d")
        elif ch == "'" and has_single:
            between_letters = 0 < i < len(new) - 1 and new[i - 1].isalpha() and new[i + 1].isalpha()
            out.append("\u2019" if between_letters or not opening else "\u2018")
        else:
            out.append(ch)
    return "".join(out)


def apply_edit(text: str, old: str, new: str, replace_all: bool) -> tuple[str, int]:
    """The text after the edit and where the first replacement starts; raises the model-facing
    errors. ``old`` must be non-empty."""
    actual = find_actual_string(text, old)
    if actual is None:
        raise ToolError(f"{NOT_FOUND}\nString: {old}")
    matches = text.count(actual)
    if matches > 1 and not replace_all:
        raise ToolError(
            f"Found {matches} matches of the string to replace, but replace_all is false. To replace all "
            "occurrences, set replace_all to true. To replace only one occurrence, please provide more "
            f"context to uniquely identify the instance.\nString: {old}")
    replacement = _styled_new(old, actual, new)
    target = actual
    # Deleting a whole line should take its newline along, as Claude Code does.
    if replacement == "" and not actual.endswith("\n") and actual + "\n" in text:
        target = actual + "\n"
    anchor = text.find(target)
    if not replace_all:
        return text.replace(target, replacement, 1), anchor
    result = text.replace(target, replacement)
    if target != actual:
        # A line-deleting replace_all also removes occurrences with no newline after them.
        result = result.replace(actual, "")
    return result, anchor


def plan_edit(ctx: ToolContext, input: Mapping[str, Any]) -> PlannedEdit:
    """Every check Claude Code makes, in its order, and the resulting text. Writes nothing."""
    old: str = input["old_string"]
    new: str = input["new_string"]
    replace_all = bool(input.get("replace_all", False))
    if old == new:
        raise ToolError(SAME_STRINGS)
    path = absolute(ctx, input["file_path"])
    if path.is_dir():
        raise ToolError(f"{path} is a directory; Edit needs a file path.")
    if not path.exists():
        if old == "":
            return PlannedEdit(path, new, 0, new, creates=True, crlf=False, bom=False)
        raise ToolError(not_found_message(ctx, path))
    with open_regular(ctx, path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= MAX_EDIT_BYTES:
            raw = fh.read(MAX_EDIT_BYTES + 1)
            # a file that grew past the cap after fstat would be cut short by the write: refused as well
            size = max(size, len(raw))
        if size > MAX_EDIT_BYTES:
            raise ToolError(f"File is too large to edit ({size / 1024 / 1024:.1f} MB; Edit changes files up to "
                            f"{MAX_EDIT_BYTES // 1024 // 1024} MB). Use a shell command such as sed instead.")
    bom = raw.startswith(b"\xef\xbb\xbf")
    body = raw[3 if bom else 0:]
    if old == "":
        if body.strip():
            raise ToolError(ALREADY_EXISTS)
        return PlannedEdit(path, new, 0, new, creates=False, crlf=False, bom=bom,
                           original=body.decode("utf-8", errors="replace"))
    seen = last_read(ctx, path)
    if seen is None:
        raise ToolError(NOT_READ_YET)
    stale = path.stat().st_mtime > seen
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"File {path} is not valid UTF-8, so Edit will not change it: use a shell "
                        "command that keeps its encoding.") from exc
    # Edit on LF text and put CRLF back, but only for files that are CRLF throughout: converting a
    # mixed file would rewrite lines the edit never touched.
    original = text
    crlf = "\r\n" in text and text.count("\r\n") == text.count("\n")
    if crlf:
        text = text.replace("\r\n", "\n")
        old, new = old.replace("\r\n", "\n"), new.replace("\r\n", "\n")
    try:
        new_text, anchor = apply_edit(text, old, new, replace_all)
    except ToolError:
        if stale:  # what the model remembers is out of date: it must read the file again
            raise ToolError(MODIFIED_SINCE_READ) from None
        raise
    return PlannedEdit(path, new_text, anchor, new, creates=False, crlf=crlf, bom=bom, stale=stale,
                       original=original)



class EditTool(Tool):
    name = "Edit"
    description = (
        "Performs an exact string replacement in a file. The file must have been read with the Read tool "
        "first and not changed since. old_string must match the file exactly (copy it from the Read "
        "output without the line-number prefix) and must be unique unless replace_all is true; give more "
        "surrounding context to make it unique. An empty old_string creates a new file."
    )
    input_defaults: Mapping[str, Any] = {"replace_all": False}
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The absolute path to the file to modify"},
            "old_string": {"type": "string", "description": "The text to replace"},
            "new_string": {"type": "string",
                           "description": "The text to replace it with (must be different from old_string)"},
            "replace_all": {"type": "boolean", "default": False,
                            "description": "Replace all occurrences of old_string (default false)"},
        },
        "required": ["file_path", "old_string", "new_string"],
        "additionalProperties": False,
    }


    def denial_input(self, input: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
        # Claude Code lists the path absolute and normalised (symlinks kept)
        return normalised_path_input(super().denial_input(input, cwd), cwd)
    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        # the permission settings first: a denied file gets no word about its state. Edit reads the
        # file too (its result quotes the edited lines), so a file it may not read is denied as well.
        path = absolute(ctx, input["file_path"])
        denied = await asyncio.to_thread(validate_access, ctx, path, "write", "read")
        if denied is not None:
            return denied
        try:
            await asyncio.to_thread(plan_edit, ctx, input)
        except ToolError as exc:
            return ValidationResult.invalid(str(exc))
        return ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        # Planned afresh: hooks and permission prompts run between validation and the call.
        await asyncio.to_thread(require_access, ctx, absolute(ctx, input["file_path"]), "write", "read")
        plan = await asyncio.to_thread(plan_edit, ctx, input)
        await asyncio.to_thread(_write, plan)
        record_read(ctx, plan.path)
        shown = input["file_path"]
        head = (f"The file {shown} has been updated. All occurrences were successfully replaced."
                if input.get("replace_all") else f"The file {shown} has been updated successfully.")
        structured = edit_result(input, plan, ctx.user_modified)
        if ctx.user_modified:  # Claude Code's words, spacing and stray period included
            return ToolOutput(head + "  The user modified your proposed changes before accepting them. .",
                              structured=structured)
        # no snippet of the edited lines (as Claude Code): the model wrote them, they cost tokens
        return ToolOutput(head + (STALE_NOTE if plan.stale else FILE_STATE_CURRENT), structured=structured)


def edit_result(input: Mapping[str, Any], plan: PlannedEdit, user_modified: bool) -> dict[str, Any]:
    """What an SDK user receives for an edit (Claude Code's fields; the snippet is not in the model's
    context, as the result text says only that the file was updated)."""
    written = plan.new_text.replace("\n", "\r\n") if plan.crlf else plan.new_text
    return {"filePath": input["file_path"], "oldString": input["old_string"], "newString": input["new_string"],
            "originalFile": plan.original, "structuredPatch": structured_patch(plan.original or "", written),
            "userModified": user_modified, "replaceAll": bool(input.get("replace_all", False)),
            "contentNotInModelContext": True}


def _write(plan: PlannedEdit) -> None:
    text = plan.new_text.replace("\n", "\r\n") if plan.crlf else plan.new_text
    data = (b"\xef\xbb\xbf" if plan.bom else b"") + text.encode("utf-8")
    try:
        if plan.creates:
            plan.path.parent.mkdir(parents=True, exist_ok=True)
        plan.path.write_bytes(data)
    except OSError as exc:
        raise ToolError(f"Could not write {plan.path}: {exc.strerror or exc}") from exc
