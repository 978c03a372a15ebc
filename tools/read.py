"""Read: a text file as line-numbered ``N\\t<line>`` rows (Claude Code's FileRead tool).

Also home to the read-state helpers Write and Edit share: a file may only be overwritten or
edited after Read saw it, and only if it has not changed on disk since.
"""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from agentfsm.tools.base import (
    Access,
    ReadOnlyTool,
    ToolContext,
    ToolError,
    ToolOutput,
    ValidationResult,
    normalised_path_input,
)

DEFAULT_LIMIT = 2000
MAX_LINE_CHARS = 2000
#: Largest file Read returns whole (Claude Code's 256 KB); ``AGENTFSM_READ_MAX_BYTES`` changes it.
DEFAULT_MAX_BYTES = 256 * 1024
#: Largest file (or range of one) Read returns with ``allow_large: true``.
LARGE_MAX_BYTES = 4 * 1024 * 1024
CWD_NOTE = "Note: your current working directory is"
EMPTY_FILE_WARNING = "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>"
#: What Write and Edit add to a success (Claude Code's text): the model need not Read the file back.
FILE_STATE_CURRENT = " (file state is current in your context \u2014 no need to Read it back)"
NOT_READ_YET = "File has not been read yet. Read it first before writing to it."
MODIFIED_SINCE_READ = ("File has been modified since read, either by the user or by a linter. "
                       "Read it again before attempting to write it.")

# The Messages API takes these as image blocks; anything bigger than ~5 MB base64 is refused there.
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp"}
MAX_IMAGE_BYTES = 3_750_000
# Extensions that are never text; a NUL byte in the first 8 KB catches the rest.
BINARY_EXTENSIONS = frozenset({
    ".exe", ".dll", ".so", ".dylib", ".bin", ".o", ".a", ".lib", ".obj", ".class", ".jar", ".war",
    ".pyc", ".pyo", ".whl", ".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar", ".zst",
    ".bmp", ".ico", ".tif", ".tiff", ".psd", ".mp3", ".mp4", ".mov", ".avi", ".mkv", ".wav", ".flac",
    ".ogg", ".webm", ".woff", ".woff2", ".ttf", ".otf", ".eot", ".sqlite", ".db", ".pdf", ".doc",
    ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".dmg", ".iso", ".img", ".wasm",
})


# --- read state shared with Write and Edit -----------------------------------------------------


def absolute(ctx: ToolContext, file_path: str) -> Path:
    """``file_path`` made absolute against the context's cwd, with ``..`` folded (links kept)."""
    return Path(os.path.normpath(ctx.resolve(file_path)))


def _state_keys(path: Path) -> list[str]:
    # Recorded under the spelled path and the link-free one, so reading through a symlink and
    # editing the target (or the reverse) still counts as "read first".
    keys = [str(path)]
    real = os.path.realpath(path)
    if real != keys[0]:
        keys.append(real)
    return keys


def access_denied(ctx: ToolContext, path: Path, *accesses: Access) -> str | None:
    """The text denying ``path`` to the call (Claude Code's wording), or None: the permission
    settings' file-access policy is asked for each access, and fails closed when none was wired."""
    for access in accesses:
        denial = ctx.access.denial(str(path), access)
        if denial is not None:
            return denial.message(access)
    return None


def validate_access(ctx: ToolContext, path: Path, *accesses: Access) -> ValidationResult | None:
    text = access_denied(ctx, path, *accesses)
    return ValidationResult.deny(text) if text is not None else None


def require_access(ctx: ToolContext, path: Path, *accesses: Access) -> None:
    """Raise the denial (checked again when the call runs: a hook may have changed the input)."""
    text = access_denied(ctx, path, *accesses)
    if text is not None:
        raise ToolError(text)


def record_read(ctx: ToolContext, path: Path) -> None:
    """Remember that the model has seen ``path`` as it is on disk now."""
    mtime = path.stat().st_mtime
    for key in _state_keys(path):
        ctx.read_files[key] = mtime


def last_read(ctx: ToolContext, path: Path) -> float | None:
    for key in _state_keys(path):
        if key in ctx.read_files:
            return ctx.read_files[key]
    return None


def check_fresh(ctx: ToolContext, path: Path) -> None:
    """Raise the Claude Code error unless ``path`` was read and is unchanged since."""
    seen = last_read(ctx, path)
    if seen is None:
        raise ToolError(NOT_READ_YET)
    if path.stat().st_mtime > seen:
        raise ToolError(MODIFIED_SINCE_READ)


def not_found_message(ctx: ToolContext, path: Path, *, what: str = "File does not exist.") -> str:
    msg = f"{what} {CWD_NOTE} {ctx.cwd}."
    similar = _similar_file(path)
    if similar is not None:
        # named relative to the cwd when it is inside it, as Claude Code does
        shown = os.path.relpath(similar, ctx.cwd) if Path(similar).is_relative_to(ctx.cwd) else similar
        msg += f" Did you mean {shown}?"
    return msg


def _similar_file(path: Path) -> str | None:
    # Same stem, other extension (``foo.ts`` for ``foo.js``): the usual near miss.
    try:
        for entry in os.scandir(path.parent):
            if entry.is_file() and Path(entry.name).stem == path.stem and entry.name != path.name:
                return str(path.parent / entry.name)
    except OSError:
        return None
    return None


def number_lines(lines: list[str], first: int) -> str:
    return "\n".join(f"{n}\t{line}" for n, line in enumerate(lines, start=first))


def split_lines(text: str) -> list[str]:
    """Lines as an editor shows them: a final newline does not open an extra empty line."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def file_lines(text: str) -> list[str]:
    """Lines as Read numbers them (Claude Code's way): a final newline opens one more, empty line, so
    ``"a\\nb\\n"`` is three lines and the model sees where the file ends."""
    if not text:
        return []
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def decode_text(data: bytes) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8", errors="replace")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8", errors="replace")


def looks_binary(path: Path, head: bytes) -> bool:
    if path.suffix.lower() in BINARY_EXTENSIONS:
        return True
    # UTF-16 text is full of NULs but announces itself with a byte-order mark.
    return b"\0" in head[:8192] and not head.startswith((b"\xff\xfe", b"\xfe\xff"))


def max_read_bytes() -> int:
    """The size cap of one Read (the ``AGENTFSM_READ_MAX_BYTES`` setting, else 256 KB)."""
    try:
        value = int(os.environ.get("AGENTFSM_READ_MAX_BYTES", ""))
    except ValueError:
        return DEFAULT_MAX_BYTES
    return value if value > 0 else DEFAULT_MAX_BYTES


def _kb(n: int) -> str:
    return f"{n / 1024:.1f}".rstrip("0").rstrip(".") + "KB"


def too_large(size: int, cap: int, allow_large: bool) -> str:
    """Claude Code's text for a file over the cap (its size in KB with one decimal)."""
    if allow_large:
        return (f"File content ({size / 1024:.1f}KB) exceeds the maximum size Read returns even with "
                f"allow_large ({_kb(cap)}). Use offset and limit parameters to read specific portions of "
                "the file, or search for specific content instead of reading the whole file.")
    return (f"File content ({size / 1024:.1f}KB) exceeds maximum allowed size ({_kb(cap)}). Use offset and limit "
            "parameters to read specific portions of the file, or search for specific content instead of "
            "reading the whole file. To read it anyway, up to what still fits in your context, call Read again "
            "with allow_large: true \u2014 only if you genuinely need all of it or the user asked for the whole "
            "file.")


def open_regular(ctx: ToolContext, path: Path) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file; a directory, a device, a FIFO or a
    socket is refused before anything is read (opened without blocking: a FIFO with no writer
    would otherwise hang the call, and ``/dev/zero`` never ends)."""
    try:
        _check_regular(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise ToolError(not_found_message(ctx, path), wrapped=False) from exc
    except IsADirectoryError as exc:
        raise ToolError(f"{path} is a directory, not a file. Use Bash (ls) or Glob to list a directory.") from exc
    except PermissionError as exc:
        raise ToolError(f"Permission denied: {path}") from exc
    except OSError as exc:
        raise ToolError(f"Could not read {path}: {exc.strerror or exc}") from exc
    try:
        _check_regular(path, os.fstat(fd).st_mode)  # again: it may have been replaced since
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _check_regular(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise ToolError(f"{path} is a directory, not a file. Use Bash (ls) or Glob to list a directory.")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ToolError(f"{path} is {kind}, not a regular file: Read only reads regular files.")


def _lines_of(fh: IO[bytes]) -> Iterator[str]:
    """The file's lines as :func:`file_lines` gives them, read one at a time."""
    first = True
    ended = False
    for raw in fh:
        if first:
            first = False
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
        line = raw.decode("utf-8", errors="replace")
        ended = line.endswith("\n")
        if ended:
            line = line[:-1]
        yield line[:-1] if line.endswith("\r") else line
    if ended:
        yield ""


# --- the tool --------------------------------------------------------------------------------


class ReadTool(ReadOnlyTool):
    name = "Read"
    description = (
        "Reads a file from the local filesystem. file_path must be an absolute path. By default up to "
        f"{DEFAULT_LIMIT} lines are returned from the start of the file; pass offset (1-based line "
        "number) and limit to page through longer files. Lines come back as `N<TAB>text` with N the "
        f"line number; lines longer than {MAX_LINE_CHARS} characters are cut. PNG, JPEG, GIF and WebP "
        "files are returned as images. Reading a directory is an error: use Bash `ls` or Glob instead. "
        "A file over 256 KB is refused unless a range (offset, limit) is given or allow_large is true."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The absolute path to the file to read"},
            "offset": {"type": "integer", "minimum": 0,
                       "description": "The line number to start reading from. Only provide if the file "
                                      "is too large to read at once"},
            "limit": {"type": "integer", "minimum": 1,
                      "description": "The number of lines to read. Only provide if the file is too "
                                     "large to read at once."},
            "allow_large": {"type": "boolean",
                            "description": "Set to true to read a text file, or a line range of one, that is "
                                           "over the usual size limits, up to what still fits in your context. "
                                           "Only use this when you genuinely need all of it or the user asked "
                                           "for the whole file; otherwise read it in parts with offset and "
                                           "limit, or search it."},
        },
        "required": ["file_path"],
        "additionalProperties": False,
    }

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        path = absolute(ctx, input["file_path"])
        return await asyncio.to_thread(validate_access, ctx, path, "read") or ValidationResult.valid()


    def denial_input(self, input: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
        # Claude Code lists the path absolute and normalised (symlinks kept)
        return normalised_path_input(super().denial_input(input, cwd), cwd)
    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        path = absolute(ctx, input["file_path"])
        await asyncio.to_thread(require_access, ctx, path, "read")
        offset: int | None = input.get("offset")
        limit: int | None = input.get("limit")
        # File I/O off the loop: a large file or a slow mount must not stall concurrent tools.
        return await asyncio.to_thread(self._read, ctx, path, offset, limit, bool(input.get("allow_large")))

    def _read(self, ctx: ToolContext, path: Path, offset: int | None, limit: int | None,
              allow_large: bool = False) -> ToolOutput:
        cap = LARGE_MAX_BYTES if allow_large else (self.max_bytes or max_read_bytes())
        with open_regular(ctx, path) as fh:
            size = os.fstat(fh.fileno()).st_size
            media_type = IMAGE_TYPES.get(path.suffix.lower())
            if media_type is not None:
                data = fh.read(MAX_IMAGE_BYTES + 1)
                if len(data) > MAX_IMAGE_BYTES:
                    raise ToolError(f"Image file is too large to read ({size} bytes; the maximum is "
                                    f"{MAX_IMAGE_BYTES} bytes).")
                record_read(ctx, path)
                return ToolOutput([{"type": "image", "source": {
                    "type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode("ascii")}}])
            head = fh.read(8192)
            if looks_binary(path, head):
                raise ToolError(f"This tool cannot read binary files. The file appears to be a binary "
                                f"{path.suffix or '(no extension)'} file. Use a shell command or script that "
                                "can read the format.")
            fh.seek(0)
            utf16 = head.startswith((b"\xff\xfe", b"\xfe\xff"))
            if (offset is None and limit is None) or utf16:
                if size > cap:
                    raise ToolError(too_large(size, cap, allow_large), wrapped=False)
                data = fh.read(cap + 1)
                if len(data) > cap:  # it grew while we looked
                    raise ToolError(too_large(len(data), cap, allow_large), wrapped=False)
                lines = file_lines(decode_text(data))
                text = render(lines, offset, limit)
                start = max(offset or 1, 1)
                window, total = lines[start - 1:start - 1 + (limit if limit is not None else DEFAULT_LIMIT)], len(lines)
            else:
                text, window, total = _render_range(fh, offset, limit, cap, allow_large)
        record_read(ctx, path)
        return ToolOutput(text, structured=text_result(path, window, max(offset or 1, 1), total))


def text_result(path: Path, window: list[str], first: int, total: int) -> dict[str, Any]:
    """What an SDK user receives for a text read (Claude Code's fields): the lines read, unnumbered."""
    return {"type": "text", "file": {"filePath": str(path), "content": "\n".join(window), "numLines": len(window),
                                     "startLine": first, "totalLines": total}}


def _render_range(fh: IO[bytes], offset: int | None, limit: int | None, cap: int,
                  allow_large: bool) -> tuple[str, list[str], int]:
    """:func:`render` of a range, reading the file one line at a time: memory holds the range, never
    the file (a 200 MB file costs what its 2000 lines cost). Also the lines read and the file's
    line count."""
    first = max(offset or 1, 1)
    count = limit if limit is not None else DEFAULT_LIMIT
    window: list[str] = []
    held = 0
    total = 0
    for line in _lines_of(fh):
        total += 1
        if first <= total < first + count:
            held += len(line)
            if held > cap:
                raise ToolError(too_large(held, cap, allow_large), wrapped=False)
            window.append(line)
    if total == 0:
        return EMPTY_FILE_WARNING, window, total
    if first > total:
        return (f"<system-reminder>Warning: the file exists but is shorter than the provided offset "
                f"({first}). The file has {total} lines.</system-reminder>"), window, total
    text = number_lines([_clip(line) for line in window], first)
    last = first + len(window) - 1
    if limit is None and last < total:
        text += (f"\n\n[Showing lines {first}-{last} of {total}. Call Read with offset={last + 1} "
                 "to read further.]")
    return text, window, total


def render(lines: list[str], offset: int | None, limit: int | None) -> str:
    """The tool_result text for ``lines`` read from ``offset`` (1-based; 0 counts as 1)."""
    total = len(lines)
    first = max(offset or 1, 1)
    if total == 0:
        return EMPTY_FILE_WARNING
    if first > total:
        return (f"<system-reminder>Warning: the file exists but is shorter than the provided offset "
                f"({first}). The file has {total} lines.</system-reminder>")
    count = limit if limit is not None else DEFAULT_LIMIT
    window = lines[first - 1:first - 1 + count]
    shown = [_clip(line) for line in window]
    text = number_lines(shown, first)
    last = first + len(window) - 1
    if limit is None and last < total:
        text += (f"\n\n[Showing lines {first}-{last} of {total}. Call Read with offset={last + 1} "
                 "to read further.]")
    return text


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return f"{line[:MAX_LINE_CHARS]}... [line truncated: {len(line)} characters]"
