"""Glob: files whose path matches a glob pattern, least recently modified first (as Claude Code lists them).

Pattern semantics are :mod:`agentfsm.tools.pathmatch`'s (``*`` and ``?`` stay within one path
segment, ``**`` spans any number of directories, ``[...]`` classes, dotfiles match), plus ``{a,b}``
alternatives as in Claude Code. The walk is our own ``os.scandir`` loop rather than ``Path.glob`` so
that it can skip VCS metadata, never follow a symlinked directory (3.11's ``**`` loops forever on a
symlink cycle) and stop when aborted.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from agentfsm.tools.base import FileAccess, ReadOnlyTool, ToolContext, ToolError, ToolOutput, ValidationResult
from agentfsm.tools.pathmatch import Matcher, PatternError, expand_braces, glob_tool_matcher, has_magic
from agentfsm.tools.read import CWD_NOTE

T = TypeVar("T")

MAX_RESULTS = 100
VCS_DIRS = (".git", ".svn", ".hg", ".bzr", ".jj", ".sl")


def split_literal_prefix(root: str, pattern: str) -> tuple[str, str]:
    """Move leading segments without wildcards into the directory the walk starts from. A ``..``
    stays in the pattern, where it matches nothing: a relative pattern never climbs out of the
    directory it searches (``../out/*.txt`` finds no files, as in Claude Code); nor does it go through a
    symlink (``link/*.txt`` finds nothing when ``link`` is one: the walk never follows a link)."""
    relative = not pattern.startswith("/")
    if not relative:
        root, pattern = "/", pattern.lstrip("/")
    segs = pattern.split("/")
    while len(segs) > 1 and not has_magic(segs[0]) and segs[0] != ".." and not (
            relative and os.path.islink(os.path.join(root, segs[0]))):
        root = os.path.join(root, segs.pop(0))
    return os.path.normpath(root), "/".join(segs)


def display_path(ctx: ToolContext, path: str) -> str:
    """Relative to the cwd when below it (as Claude Code shows search results), else absolute."""
    rel = os.path.relpath(path, os.path.abspath(ctx.cwd))
    return path if rel == "." or rel.startswith("..") else rel


def _walk(root: str, matcher: Matcher, max_depth: int | None, skip: frozenset[str],
          stop: threading.Event) -> Iterator[tuple[str, float]]:
    stack: list[tuple[str, str, int]] = [(root, "", 0)]
    while stack:
        if stop.is_set():
            return
        directory, rel_dir, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}{entry.name}"
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in skip and (max_depth is None or depth + 1 < max_depth):
                        stack.append((entry.path, rel + "/", depth + 1))
                elif matcher.match(rel) and entry.is_file():
                    yield entry.path, entry.stat().st_mtime
            except OSError:
                continue


def search_root_denial(ctx: ToolContext, given: str | None) -> ValidationResult | None:
    """A search (Glob, Grep) of a directory the permission settings deny as a whole — or of a file
    they deny — is refused outright, in Claude Code's words: ``Permission to read PATH has been
    denied.`` (a path that exists but is only partly denied is searched, its denied files left out)."""
    root = os.path.normpath(ctx.resolve(given)) if given else os.path.abspath(ctx.cwd)
    denial = ctx.access.tree_denial(root, "read")
    if denial is None:
        return None
    return ValidationResult.deny(denial.message("read", search=True) if given else
                                 f"Permission to read {root} has been denied.")


def visible(access: FileAccess, path: str) -> bool:
    """Whether a search may show ``path``: it, what it links to, and its other hard-linked names are
    all readable."""
    return access.denial(path, "read") is None


def find_files(root: str, pattern: str, stop: threading.Event | None = None) -> list[tuple[str, float]]:
    """(path, mtime) of files under ``root`` matching ``pattern``, unordered."""
    stop = stop or threading.Event()
    found: dict[str, float] = {}
    for alternative in expand_braces(pattern):
        if "/" not in alternative:
            # a pattern without a directory part matches a file's name at any depth (``*.py`` finds
            # sub/c.py), as Claude Code 2.1.332's Glob does (tests/fidelity/conform/conform-53238a8864.json)
            alternative = "**/" + alternative
        start, rest = split_literal_prefix(root, alternative)
        if not rest or not os.path.isdir(start):
            continue
        depth = None if "**" in rest else len([s for s in rest.split("/") if s not in ("", ".")])
        skip = frozenset(d for d in VCS_DIRS if d not in alternative)
        for path, mtime in _walk(start, glob_tool_matcher(rest), depth, skip, stop):
            found[path] = mtime
    return list(found.items())


class GlobTool(ReadOnlyTool):
    name = "Glob"
    description = (
        "Fast file pattern matching. Supports glob patterns like \"**/*.js\" or \"src/**/*.{ts,tsx}\" "
        "(`*` and `?` stay within one directory, `**` spans directories). Returns matching file paths, "
        f"least recently modified first, at most {MAX_RESULTS}. Use it to find files by name; use Grep "
        "to search file contents."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The glob pattern to match files against"},
            "path": {"type": "string",
                     "description": "The directory to search in. If not specified, the current working "
                                    "directory will be used. IMPORTANT: Omit this field to use the default "
                                    "directory. DO NOT enter \"undefined\" or \"null\" - simply omit it for "
                                    "the default behavior. Must be a valid directory path if provided."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        # Read rules cover Glob by the directory searched, not by the pattern.
        path = input.get("path")
        return path if isinstance(path, str) else None

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        given = input.get("path")
        denied = await asyncio.to_thread(search_root_denial, ctx, given if isinstance(given, str) else None)
        return denied or ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        pattern: str = input["pattern"]
        if not pattern.strip():
            raise ToolError("pattern must not be empty.")
        given = input.get("path")
        root = os.path.normpath(ctx.resolve(given)) if given else os.path.abspath(ctx.cwd)
        if given:
            if not os.path.exists(root):
                raise ToolError(f"Directory does not exist: {given}. {CWD_NOTE} {ctx.cwd}.", wrapped=False)
            if not os.path.isdir(root):
                raise ToolError(f"Path is not a directory: {given}")
        denied = search_root_denial(ctx, given)
        if denied is not None:
            raise ToolError(denied.message)
        stop = threading.Event()
        access = ctx.access

        def search() -> list[tuple[str, float]]:
            # what the permission settings deny is left out, as if it were not there
            return [(p, m) for p, m in find_files(root, pattern, stop) if visible(access, p)]

        try:
            found = await run_stoppable(ctx, stop, search)
        except PatternError as exc:
            raise ToolError(str(exc)) from exc
        if not found:
            return ToolOutput("No files found")
        # oldest first, as Claude Code 2.1.332 lists them (`rg --files --sort=modified`)
        found.sort(key=lambda pm: (pm[1], pm[0]))
        shown = [display_path(ctx, p) for p, _ in found[:MAX_RESULTS]]
        if len(found) > MAX_RESULTS:
            shown.append(f"(Showing {MAX_RESULTS} of {len(found)} matching files; "
                         f"{len(found) - MAX_RESULTS} more are not listed. Narrow the pattern or path "
                         "to see the rest.)")
        return ToolOutput("\n".join(shown))


async def run_stoppable(ctx: ToolContext, stop: threading.Event, work: Callable[[], T]) -> T:
    """Run blocking ``work`` in a thread; set ``stop`` (which the work polls) on abort or cancel."""
    if ctx.abort.is_set():
        raise ToolError("Search aborted.")
    job = asyncio.ensure_future(asyncio.to_thread(work))
    aborted = asyncio.ensure_future(ctx.abort.wait())
    try:
        await asyncio.wait({job, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if not job.done():
            stop.set()
            raise ToolError("Search aborted.")
        return job.result()
    finally:
        stop.set()
        aborted.cancel()
