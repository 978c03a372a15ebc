"""Grep: regex search over file contents, ripgrep-backed (Claude Code's Grep tool).

Two backends produce the same records (:class:`FileHits`, counts, file lists): ripgrep, run as a
subprocess with the arguments Claude Code passes it, and a pure-Python walk that reproduces
ripgrep's file selection (hidden files searched, VCS directories skipped, ``.gitignore`` inside a
git work tree, ``.ignore``/``.rgignore``, ``--glob`` overrides, ``--type``, symlinks not followed,
binary files skipped). One formatter turns the records into text, so both backends print alike.

Known fallback differences: Python's ``re`` dialect instead of Rust's regex; the global git
excludes file (core.excludesFile) is not read; globs follow :mod:`agentfsm.tools.pathmatch`, the one
dialect of the Glob tool and the permission rules, so a ``[...]`` class never matches ``/`` and knows
``[:digit:]``-style names and ``\\`` escapes, where ripgrep's globset lets a class match ``/``, has
no named classes and rejects a reversed range such as ``[z-a]``.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast

import attrs

from agentfsm.tools.base import FileAccess, ReadOnlyTool, ToolContext, ToolError, ToolOutput, ValidationResult
from agentfsm.tools.glob import VCS_DIRS, display_path, run_stoppable, search_root_denial, visible
from agentfsm.tools.pathmatch import IgnoreRule, PatternError, expand_braces, ignore_rule
from agentfsm.tools.read import CWD_NOTE, decode_text

Backend = Literal["auto", "rg", "python"]
OutputMode = Literal["content", "files_with_matches", "count"]

#: Process-wide default; tests set it to ``"python"`` to exercise the fallback with rg installed.
BACKEND: Backend = "auto"
DEFAULT_HEAD_LIMIT = 250
#: Largest file the pure-Python fallback searches (it reads a file whole).
MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_LINE_CHARS = 500

# Globs of the file types the fallback knows (copied from ripgrep's own type table).
FILE_TYPES: dict[str, tuple[str, ...]] = {
    "py": ("*.py", "*.pyi"),
    "python": ("*.py", "*.pyi"),
    "js": ("*.js", "*.jsx", "*.vue", "*.cjs", "*.mjs"),
    "ts": ("*.ts", "*.tsx", "*.cts", "*.mts"),
    "typescript": ("*.ts", "*.tsx", "*.cts", "*.mts"),
    "rust": ("*.rs",),
    "go": ("*.go",),
    "java": ("*.java", "*.jsp", "*.jspx", "*.properties"),
    "md": ("*.markdown", "*.md", "*.mdown", "*.mkdn"),
    "markdown": ("*.markdown", "*.md", "*.mdown", "*.mkdn"),
    "json": ("*.json", "composer.lock"),
    "yaml": ("*.yaml", "*.yml"),
    "toml": ("*.toml", "Cargo.lock"),
    "c": ("*.[chH]", "*.[chH].in", "*.cats"),
    "cpp": ("*.[ChH]", "*.[ChH].in", "*.[ch]pp", "*.[ch]pp.in", "*.[ch]xx", "*.[ch]xx.in", "*.cc",
            "*.cc.in", "*.hh", "*.hh.in", "*.inl"),
    "sh": ("*.bash", "*.sh", "*.zsh", "*.ksh", ".bashrc", ".zshrc", ".profile", ".bash_profile"),
    "html": ("*.ejs", "*.htm", "*.html"),
    "css": ("*.css", "*.scss"),
    "txt": ("*.txt",),
}


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


# --- ripgrep backend -------------------------------------------------------------------------


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
    # ripgrep matches --glob patterns against paths relative to its working directory, so it runs
    # in the searched directory: "src/*" then means the same as in the fallback.
    cwd = q.root if os.path.isdir(q.root) else os.path.dirname(q.root)
    proc = await asyncio.create_subprocess_exec(
        "rg", *rg_args(q), cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    talk = asyncio.ensure_future(proc.communicate())
    aborted = asyncio.ensure_future(ctx.abort.wait())
    try:
        await asyncio.wait({talk, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if not talk.done():
            raise ToolError("Search aborted.")
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
        raise ToolError(message)
    return out


async def search_rg(q: Query, ctx: ToolContext) -> Found:
    out = await run_rg(q, ctx)
    if q.mode == "files_with_matches":
        return [os.fsdecode(p) for p in out.split(b"\0") if p.strip(b"\n")]
    if q.mode == "count":
        return [(os.fsdecode(m[1]), int(m[2])) for m in re.finditer(rb"([^\0]*)\0(\d+)(?:\n|\Z)", out)
                if m[2] != b"0"]
    return parse_rg_json(out)


# --- pure-Python backend: file selection ------------------------------------------------------


def _verdict(rules: Sequence[tuple[str, IgnoreRule]], path: str, is_dir: bool) -> bool | None:
    """Whether the last matching rule is a plain one (True) or a ``!`` one (False); None if none
    matches. For ignore files plain means "ignore"; for ``--glob`` overrides it means "keep"."""
    verdict: bool | None = None
    for base, rule in rules:
        if path.startswith(base) and rule.matches(path[len(base):], is_dir):
            verdict = not rule.negated
    return verdict


def _read_rules(directory: str, name: str) -> list[tuple[str, IgnoreRule]]:
    """The rules of one ignore file, each tagged with the directory its patterns are relative to."""
    try:
        text = Path(directory, name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    base = directory.rstrip("/") + "/"
    return [(base, r) for r in (ignore_rule(ln) for ln in text.splitlines()) if r is not None]


@attrs.frozen
class DirRules:
    """What one directory contributes to ignoring, by ripgrep's categories."""

    rgignore: list[tuple[str, IgnoreRule]]
    ignore: list[tuple[str, IgnoreRule]]
    gitignore: list[tuple[str, IgnoreRule]]
    exclude: list[tuple[str, IgnoreRule]]
    has_git: bool

    @classmethod
    def of(cls, directory: str) -> DirRules:
        has_git = os.path.exists(os.path.join(directory, ".git"))
        exclude: list[tuple[str, IgnoreRule]] = []
        if has_git:
            base = directory.rstrip("/") + "/"
            exclude = [(base, r) for _, r in _read_rules(os.path.join(directory, ".git", "info"), "exclude")]
        return cls(_read_rules(directory, ".rgignore"), _read_rules(directory, ".ignore"),
                   _read_rules(directory, ".gitignore"), exclude, has_git)


def ignored(chain: Sequence[DirRules], path: str, is_dir: bool) -> bool:
    """ripgrep's verdict from the ignore files of ``path``'s directories (outermost first): in each
    category the nearest directory with a matching rule decides; .rgignore beats .ignore beats
    .gitignore beats .git/info/exclude; git files count only inside a work tree and stop applying
    above the nearest repository root."""
    any_git = any(d.has_git for d in chain)
    found: dict[str, bool | None] = {"rgignore": None, "ignore": None, "gitignore": None, "exclude": None}
    saw_git = False
    for d in reversed(chain):
        for category in ("rgignore", "ignore"):
            if found[category] is None:
                found[category] = _verdict(getattr(d, category), path, is_dir)
        if any_git and not saw_git:
            for category in ("gitignore", "exclude"):
                if found[category] is None:
                    found[category] = _verdict(getattr(d, category), path, is_dir)
        saw_git = saw_git or d.has_git
    for verdict in found.values():
        if verdict is not None:
            return verdict
    return False


class Selector:
    """Decides which files under ``root`` ripgrep would search, given the query's filters."""

    def __init__(self, q: Query) -> None:
        self.root = q.root
        self.overrides: list[tuple[str, IgnoreRule]] = []
        for g in [f"!{d}" for d in VCS_DIRS] + list(q.globs):
            try:
                alternatives = expand_braces(g)
            except PatternError as exc:
                raise ToolError(str(exc)) from exc
            for alt in alternatives:
                rule = ignore_rule(alt, comments=False)
                if rule is not None:
                    self.overrides.append((q.root.rstrip("/") + "/", rule))
        self.has_whitelist = any(not r.negated for _, r in self.overrides)
        self.types: list[IgnoreRule] | None = None
        if q.file_type:
            globs = FILE_TYPES.get(q.file_type)
            if globs is None:
                raise ToolError(f"unrecognized file type: {q.file_type}")
            self.types = [r for r in (ignore_rule(g, comments=False) for g in globs) if r is not None]

    def _parents(self) -> list[DirRules]:
        """ripgrep also reads the ignore files of the directories above the one searched."""
        chain: list[str] = []
        d = os.path.dirname(self.root)
        while True:
            chain.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
        return [DirRules.of(c) for c in reversed(chain)]

    def wanted(self, path: str, is_dir: bool, chain: Sequence[DirRules]) -> bool:
        # For overrides the sense is inverted: a plain glob keeps the path, "!glob" drops it; and an
        # override is the last word, keeping even ignored or untyped files.
        override = _verdict(self.overrides, path, is_dir)
        if override is not None:
            return override
        if not is_dir and self.has_whitelist:
            return False
        if ignored(chain, path, is_dir):
            return False
        if is_dir or self.types is None:
            return True
        name = os.path.basename(path)
        return any(t.matches(name, is_dir=False) for t in self.types)

    def files(self, stop: threading.Event) -> Iterator[str]:
        if not os.path.isdir(self.root):
            yield self.root  # a file named explicitly is searched whatever the filters say
            return
        stack: list[tuple[str, list[DirRules]]] = [(self.root, self._parents())]
        while stack:
            if stop.is_set():
                return
            directory, chain = stack.pop()
            chain = [*chain, DirRules.of(directory)]
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError:
                continue
            subdirs: list[tuple[str, list[DirRules]]] = []
            for entry in entries:
                try:
                    if entry.is_symlink():
                        continue
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if not is_dir and not entry.is_file(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                if not self.wanted(entry.path, is_dir, chain):
                    continue
                if is_dir:
                    subdirs.append((entry.path, chain))
                else:
                    yield entry.path
            stack.extend(reversed(subdirs))


# --- pure-Python backend: matching -----------------------------------------------------------

def _escapes_line_feed(pattern: str, i: int) -> bool:
    """Whether the escape at ``pattern[i]`` (a backslash) spells a line feed."""
    rest = pattern[i + 1:i + 7].lower()
    return rest[:1] == "n" or rest.startswith(("x0a", "u000a")) or re.match(r"x\{0*a\}", rest) is not None


def may_match_newline(pattern: str) -> bool:
    """Whether a multiline search must look across lines. ripgrep decides this from the parsed
    regex and falls back to line-by-line search when no line terminator can match; this reads
    the same cases off the pattern text: a line feed spelled out, ``.`` (which --multiline-dotall
    lets match it), ``\\s``, ``\\W``, ``\\D``, ``\\P{..}`` and negated classes."""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if _escapes_line_feed(pattern, i) or pattern[i + 1:i + 2] in ("s", "W", "D", "P"):
                return True
            i += 2
            continue
        if ch in ".\n" or (ch == "[" and pattern[i + 1:i + 2] == "^"):
            return True
        i += 1
    return False


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


NEWLINE_REFUSED = ("the literal '\"\\n\"' is not allowed in a regex\n\nConsider enabling multiline mode with "
                   "the --multiline flag (or -U for short).\nWhen multiline mode is enabled, new line "
                   "characters can be matched.")


def names_a_newline(pattern: str) -> bool:
    """Whether the pattern spells out a line feed (``\\n``, ``\\x0a`` or the character itself)."""
    i = 0
    while i < len(pattern):
        if pattern[i] == "\n":
            return True
        if pattern[i] == "\\":
            if _escapes_line_feed(pattern, i):
                return True
            i += 2
            continue
        i += 1
    return False


class Matcher:
    def __init__(self, q: Query) -> None:
        if not q.multiline and names_a_newline(q.pattern):
            # ripgrep refuses these outside multiline mode; so does the fallback, with its words
            raise ToolError(NEWLINE_REFUSED)
        flags = re.IGNORECASE if q.ignore_case else 0
        self.across_lines = q.multiline and may_match_newline(q.pattern)
        if self.across_lines:
            flags |= re.MULTILINE | re.DOTALL
        try:
            self.regex = re.compile(q.pattern, flags)
        except re.error as exc:
            raise ToolError(f"regex parse error: {exc}") from exc
        self.q = q

    def any(self, text: str) -> bool:
        if self.across_lines:
            return self.regex.search(text) is not None
        return any(self.regex.search(line) for line in _lines(text))

    def count(self, text: str) -> int:
        """What ``rg -c`` reports: matching lines, or matches when a match may span lines."""
        if self.across_lines:
            return sum(1 for _ in self.regex.finditer(text))
        return sum(1 for line in _lines(text) if self.regex.search(line))

    def _events(self, text: str, lines: list[str]) -> list[tuple[int, int, list[tuple[int, str]]]]:
        """(first line, last line, submatches) of each match event, lines 0-based."""
        if not self.across_lines:
            out = []
            for i, line in enumerate(lines):
                found = [(0, m.group(0)) for m in self.regex.finditer(line)]
                if found:
                    out.append((i, i, found))
            return out
        starts = [0, *(i + 1 for i, ch in enumerate(text) if ch == "\n")]
        merged: list[tuple[int, int, list[tuple[int, str]]]] = []
        for m in self.regex.finditer(text):
            first = bisect.bisect_right(starts, m.start()) - 1
            last = bisect.bisect_right(starts, max(m.end() - 1, m.start())) - 1
            if first >= len(lines):
                continue
            # ripgrep grows a match event while the next match starts on a line it already covers
            if merged and first <= merged[-1][1]:
                head, tail, subs = merged[-1]
                merged[-1] = (head, max(tail, last), [*subs, (first - head, m.group(0))])
            else:
                merged.append((first, last, [(0, m.group(0))]))
        return [(a, min(b, len(lines) - 1), subs) for a, b, subs in merged]

    def hits(self, path: str, text: str) -> FileHits | None:
        lines = _lines(text)
        events = self._events(text, lines)
        if not events:
            return None
        by_first = {first: (last, subs) for first, last, subs in events}
        shown: set[int] = set()
        for first, last, _ in events:
            shown.update(range(max(0, first - self.q.before), min(len(lines), last + self.q.after + 1)))
        hits = FileHits(path)
        covered_until = -1
        for n in sorted(shown):
            if n in by_first:
                last, subs = by_first[n]
                hits.events.append(Event("match", n + 1, "\n".join(lines[n:last + 1]), tuple(subs)))
                covered_until = last
            elif n > covered_until:
                hits.events.append(Event("context", n + 1, lines[n]))
        return hits


def search_python(q: Query, stop: threading.Event) -> Found:
    matcher = Matcher(q)
    files: list[str] = []
    counts: list[tuple[str, int]] = []
    hits: list[FileHits] = []
    named_file = not os.path.isdir(q.root)
    for path in Selector(q).files(stop):
        if stop.is_set():
            break
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size > MAX_FILE_BYTES:
                    continue  # ripgrep streams such a file; this fallback will not hold it in memory
                data = fh.read(MAX_FILE_BYTES + 1)
        except OSError:
            continue
        binary_at = data.find(b"\0")
        if binary_at >= 0 and not named_file:
            continue  # ripgrep skips binary files met while walking, but searches one named outright
        text = decode_text(data)
        if q.mode == "files_with_matches":
            if matcher.any(text):
                files.append(path)
        elif q.mode == "count":
            n = matcher.count(text)
            if n:
                counts.append((path, n))
        else:
            found = matcher.hits(path, text)
            if found is not None:
                found.binary_offset = binary_at if binary_at >= 0 else None
                hits.append(found)
    return files if q.mode == "files_with_matches" else counts if q.mode == "count" else hits


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


# --- formatting (shared by both backends) ----------------------------------------------------


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

    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        path = input.get("path")
        return path if isinstance(path, str) else None

    def use_ripgrep(self) -> bool:
        choice = self.backend or BACKEND
        if choice == "python":
            return False
        if choice == "rg":
            if shutil.which("rg") is None:
                raise ToolError("ripgrep (rg) is not installed.")
            return True
        return shutil.which("rg") is not None

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        given = input.get("path")
        denied = await asyncio.to_thread(search_root_denial, ctx, given if isinstance(given, str) else None)
        return denied or ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        given = input.get("path")
        root = os.path.normpath(ctx.resolve(given)) if given else os.path.abspath(ctx.cwd)
        if not os.path.exists(root):
            raise ToolError(f"Path does not exist: {given}. {CWD_NOTE} {ctx.cwd}.")
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
        if self.use_ripgrep():
            result = await search_rg(q, ctx)
        else:
            stop = threading.Event()
            result = await run_stoppable(ctx, stop, lambda: search_python(q, stop))
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
