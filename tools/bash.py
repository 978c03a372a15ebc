"""Bash: run a shell command (Claude Code's Bash tool), plus the read-only command classifier
that decides whether a call may run alongside other tools.

Output goes to a temporary file rather than a pipe: a background child that inherits the stream
(``server &``) cannot hold the call open, and a command that prints gigabytes costs disk, not memory.
Timeout and abort kill the command's whole process group. Killing does not undo what the command
already did.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from agentfsm.tools.base import TASKS, TaskHost, TaskStarted, Tool, ToolContext, ToolError, ToolOutput
from agentfsm.tools.environment import child_environment
from agentfsm.tools.sandbox import SANDBOX, CommandSandbox, Prepared, unsandboxed
from agentfsm.tools.shell import Analysis, analyse

DEFAULT_TIMEOUT_MS = 120_000
#: Longest command the concurrency verdict analyses on the event loop.
INLINE_ANALYSIS_CHARS = 8192
MAX_TIMEOUT_MS = 600_000
#: How long a background command may run unless its call says (Claude Code 2.1.332: 10 minutes), and at most.
BACKGROUND_TIMEOUT_MS = 600_000
MAX_BACKGROUND_TIMEOUT_MS = 7_200_000
#: A foreground command its timeout moved to the background is answered no sooner than this long after
#: it started (Claude Code 2.1.332, tests/fidelity/conform/conform-1672508d24.json and tests/test_tasks.py:
#: a 0.5 s, 1 s or 1.5 s timeout answers at about 2 s, a 3 s one at 3 s). One that ends in between is answered
#: with its whole output as a background task, and its notification joins the same result.
MOVED_ANSWER_AFTER_MS = 2_000
MAX_OUTPUT_CHARS = 30_000
KILL_GRACE_S = 2.0
ABORTED = "<error>Command was aborted before completion</error>"
#: What a command that printed nothing returns (Claude Code's text): an empty result reads as lost.
NO_OUTPUT = "(Bash completed with no output)"
#: Programs whose exit status 1 means "nothing found", not an error.
SEARCH_PROGRAMS = frozenset({"grep", "egrep", "fgrep", "rg"})


# --- read-only classification ----------------------------------------------------------------

# Programs that only read, whatever their arguments.
_ANY_ARGS = frozenset({
    "ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "pwd", "echo", "printf", "which",
    "whereis", "stat", "du", "df", "uname", "whoami", "id", "groups", "cut", "tr", "nl",
    "tac", "rev", "basename", "dirname", "realpath", "readlink", "true", "false", "sleep", "seq",
    "test", "[", "type", "diff", "cmp", "comm", "md5sum", "sha1sum", "sha256sum", "sha512sum",
    "cksum", "b2sum", "strings", "od", "hexdump", "column", "fold", "expand", "unexpand", "jq", "ps",
    "pgrep", "cd", "file", "tree", "sort", "uniq", "rg", "find", "date", "hostname", "command", "git",
})
# Flags that make an otherwise read-only program write, run other programs or change the system.
_FORBIDDEN_FLAGS: dict[str, tuple[str, ...]] = {
    "find": ("-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"),
    "rg": ("--pre",),
    "sort": ("-o", "--output", "--compress-program"),
    "tree": ("-o",),
    "file": ("-C", "--compile"),
}
_GIT_READ_ONLY = frozenset({"status", "log", "diff", "show", "blame", "rev-parse", "ls-files", "ls-tree",
                            "describe", "shortlog", "rev-list", "cat-file", "grep"})
_GIT_FORBIDDEN = ("--output", "--ext-diff", "-O", "--open-files-in-pager", "--exec")
_GIT_LISTING_FLAGS = {
    "branch": frozenset({"-a", "--all", "-r", "--remotes", "-v", "-vv", "--verbose", "-l", "--list",
                         "--show-current", "--color", "--no-color", "--column", "--no-column", "--sort",
                         "--format", "--merged", "--no-merged", "--contains", "--no-contains",
                         "--points-at"}),
    "tag": frozenset({"-l", "--list", "-n", "--sort", "--format", "--merged", "--no-merged", "--contains",
                      "--no-contains", "--points-at", "--column", "--no-column", "--color"}),
}


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _has_flag(args: list[str], flags: tuple[str, ...]) -> bool:
    for a in args:
        name = _flag_name(a)
        if name in flags:
            return True
        # clustered short options: "-fo" carries "-o"
        if re.fullmatch(r"-[A-Za-z]{2,}", a) and any(len(f) == 2 and f[1] in a[1:] for f in flags
                                                     if f.startswith("-") and not f.startswith("--")):
            return True
    return False


def _git_read_only(args: list[str]) -> bool:
    if not args:
        return False
    # Global options (-c, -C, --exec-path, ...) come before the subcommand and can run programs.
    sub, rest = args[0], args[1:]
    if _has_flag(rest, _GIT_FORBIDDEN):
        return False
    if sub in _GIT_READ_ONLY:
        return True
    if sub in _GIT_LISTING_FLAGS:
        allowed = _GIT_LISTING_FLAGS[sub]
        listing = any(_flag_name(a) in ("-l", "--list") for a in rest)
        for a in rest:
            if a.startswith("-"):
                if _flag_name(a) not in allowed:
                    return False
            elif not listing:
                return False  # "git branch NAME" creates a branch
        return True
    if sub == "remote":
        return all(a in ("-v", "--verbose") for a in rest)
    if sub == "stash":
        return bool(rest) and rest[0] in ("list", "show")
    if sub == "config":
        return bool(rest) and rest[0] in ("--get", "--get-all", "--get-regexp", "--list", "-l")
    return False


def _date_read_only(args: list[str]) -> bool:
    # "date MMDDhhmm" and "date -s" set the clock; formats and display flags do not.
    return all(a.startswith("+") or (a.startswith("-") and _flag_name(a) not in ("-s", "--set"))
               for a in args) and not any(re.fullmatch(r"-[A-Za-z]*s[A-Za-z]*", a) for a in args)


_ARG_CHECKS: dict[str, Callable[[list[str]], bool]] = {
    "git": _git_read_only,
    "date": _date_read_only,
    "hostname": lambda args: not args,  # "hostname NAME" renames the machine
    "command": lambda args: bool(args) and args[0] in ("-v", "-V"),
    "uniq": lambda args: len([a for a in args if not a.startswith("-")]) <= 1,  # "uniq IN OUT" writes OUT
}


def segment_read_only(argv: tuple[str | None, ...]) -> bool:
    """Whether one command (its argv, ``None`` for a word that is not static) only reads."""
    if None in argv:
        return False
    words = [w for w in argv if w is not None]
    program, args = words[0], words[1:]
    # "/usr/bin/x", "./x" and "{" never name a known program
    if program not in _ANY_ARGS:
        return False
    if _has_flag(args, _FORBIDDEN_FLAGS.get(program, ())):
        return False
    check = _ARG_CHECKS.get(program)
    return check(args) if check is not None else True


def is_read_only_command(command: str, cwd: str | Path = "/") -> bool:
    """True only when every command bash would run for ``command`` is a known read-only program with
    harmless flags, nothing is written (no redirection to a file), no variable is expanded and no
    environment is printed (``env``, ``printenv``, ``$VAR``: a secret may be among them).

    Conservative by design: a false "no" only costs parallelism or a permission prompt, a false
    "yes" could run a write concurrently with other tools or unasked in plan mode. The verdict comes
    from :func:`agentfsm.tools.shell.analyse`, the same analysis the permission rules use.
    """
    # "\r": bash reads it as part of a word, so what the words are is unsure
    if not command.strip() or "\r" in command:
        return False
    return analysis_read_only(analyse(command, str(cwd)))


def analysis_read_only(analysis: Analysis) -> bool:
    """The read-only verdict of :func:`is_read_only_command` on an analysis already made."""
    if (not analysis.commands or analysis.opaque or analysis.environment or analysis.background
            or analysis.assigns or analysis.redirects_output):
        return False
    return all(segment_read_only(c.argv) for c in analysis.commands)


# --- running ---------------------------------------------------------------------------------


def format_duration(ms: float) -> str:
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:g}s"
    return f"{int(seconds // 60)}m {int(seconds % 60)}s"


#: Where Bash saves an output too large to show (a directory), when the host sets one: the session's
#: own ``<sessions dir>/<session id>/tool-results`` (Claude Code keeps them beside its session file).
TOOL_RESULTS_DIR = "tool_results_dir"
#: How much of a persisted output the model sees (Claude Code's 2 KB preview).
PREVIEW_CHARS = 2000


def max_output_chars() -> int:
    """Longest Bash output shown inline (``AGENTFSM_BASH_MAX_OUTPUT_CHARS``, else Claude Code's 30000)."""
    return _positive_env("AGENTFSM_BASH_MAX_OUTPUT_CHARS", MAX_OUTPUT_CHARS)


def _positive_env(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def tool_results_dir(ctx: ToolContext) -> Path:
    """Where a large output is saved: ``AGENTFSM_TOOL_RESULTS_DIR``, else the directory the host put
    in ``ctx.services`` (the session's), else one per session under the temporary directory."""
    configured = os.environ.get("AGENTFSM_TOOL_RESULTS_DIR")
    if configured:
        return Path(configured).expanduser() / (ctx.session_id or "default")
    given = ctx.services.get(TOOL_RESULTS_DIR)
    if given is not None:
        return Path(given)
    return Path(tempfile.gettempdir()) / "agentfsm" / (ctx.session_id or "default") / "tool-results"


def format_size(n: int) -> str:
    """Bytes as Claude Code writes a size: KB or MB with one decimal, a trailing ``.0`` dropped."""
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if n >= scale or unit == "KB":
            return f"{n / scale:.1f}".removesuffix(".0") + unit
    raise AssertionError("unreachable")


def _result_name(ctx: ToolContext) -> str:
    # the tool_use id names the file when it is a plain token (it comes from the model: never a path)
    tid = ctx.tool_use_id
    return f"{tid}.txt" if re.fullmatch(r"[A-Za-z0-9_-]{1,100}", tid or "") else f"b{secrets.token_hex(4)}.txt"


def persist(path: Path, ctx: ToolContext) -> Path | None:
    """Move the output file into the tool-results directory; None when that place may not be written
    or read (a deny rule: the file access policy is asked, as for any tool) or the move fails."""
    directory = tool_results_dir(ctx)
    target = directory / _result_name(ctx)
    for access in ("write", "read"):
        if ctx.access.denial(str(target), access) is not None:
            return None
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.move(str(path), str(target))
    except OSError:
        return None
    return target


def preview(text: str) -> str:
    """The first :data:`PREVIEW_CHARS` characters, cut back to the last whole line."""
    head = text[:PREVIEW_CHARS]
    if len(text) > PREVIEW_CHARS and "\n" in head:
        head = head[:head.rindex("\n")]
    return head


def read_output(path: Path, ctx: ToolContext | None = None, cap: int | None = None) -> str:
    """The command's output as the model sees it: leading blank lines and trailing whitespace
    dropped. Over ``cap`` characters it is saved to a file (:func:`persist`) and the model gets a
    ``<persisted-output>`` block with its size, where it is and a preview, as Claude Code does; when
    it cannot be saved, the head is shown with a count of the lines left out."""
    cap = cap or max_output_chars()
    extra_lines = 0
    more = False
    with path.open("rb") as fh:
        head = fh.read(max(cap * 4, PREVIEW_CHARS * 4))
        while chunk := fh.read(1 << 20):
            more = True
            extra_lines += chunk.count(b"\n")
    text = re.sub(r"\A(?:[ \t]*\n)+", "", head.decode("utf-8", errors="replace")).rstrip()
    if len(text) <= cap and not more:
        return text
    size = path.stat().st_size if more else len(text.encode("utf-8"))
    saved = persist(path, ctx) if ctx is not None else None
    if saved is not None:
        return (f"<persisted-output>\nOutput too large ({format_size(size)}). Full output saved to: {saved}\n\n"
                f"Preview (first 2KB):\n{preview(text)}\n...\n</persisted-output>")
    cut = text[:cap]
    left = text[cap:].count("\n") + extra_lines + 1
    return f"{cut}\n\n... [{left} lines truncated] ..."


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the process group, SIGKILL whatever is left after a grace period."""
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
    _signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


def _shell() -> str:
    # /bin/bash where it exists: bash names itself in its errors ("/bin/bash: line 1: …"), as in Claude Code
    return "/bin/bash" if os.access("/bin/bash", os.X_OK) else (shutil.which("bash") or "/bin/bash")


def _environment() -> dict[str, str]:
    # our credentials stay with us (tools/environment.py)
    env = child_environment()
    # A command that would open an editor (git commit without -m) must not wait for a human.
    env.setdefault("GIT_EDITOR", "true")
    return env


def _background_timeout_ms(input: Mapping[str, Any]) -> float:
    """How long a background command may run: its ``timeout``, else 10 minutes, at most 2 hours."""
    value = input.get("timeout")
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        return BACKGROUND_TIMEOUT_MS
    return min(float(value), MAX_BACKGROUND_TIMEOUT_MS)


def _timeout_ms(input: Mapping[str, Any]) -> float:
    value = input.get("timeout")
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
        return DEFAULT_TIMEOUT_MS
    return min(float(value), MAX_TIMEOUT_MS)


# A host that must not leave a command running after it dies (a Temporal worker killed mid-call)
# puts a guard in ``ctx.services[PROCESS_GUARD]``: its ``preexec()`` runs in the child before the
# shell starts (e.g. asking the kernel to kill the child with its parent), and ``started(pgid)`` is
# told the command's process group as soon as it exists (so a later attempt can kill what is left).
PROCESS_GUARD = "process_guard"


def prepare(command: str, ctx: ToolContext, disable_requested: bool = False) -> tuple[CommandSandbox | None, Prepared]:
    """How ``command`` runs: through the session's sandbox (``ctx.services[SANDBOX]``), or, when the
    host wired none, as a plain shell command."""
    sandbox: CommandSandbox | None = ctx.services.get(SANDBOX)
    if sandbox is None:
        return None, unsandboxed(_shell(), command, "no sandbox wired")
    return sandbox, sandbox.prepare(command, Path(ctx.cwd), shell=_shell(), disable_requested=disable_requested,
                                    tool_use_id=ctx.tool_use_id or "")


async def run_foreground(command: str, ctx: ToolContext, timeout_ms: float, *,
                         disable_sandbox: bool = False, description: str = "") -> ToolOutput:
    # the rules are resolved off the event loop: finding what a glob matches walks the workspace
    sandbox, prepared = await asyncio.to_thread(prepare, command, ctx, disable_sandbox)
    if prepared.refusal is not None:
        if sandbox is not None:
            sandbox.finished(prepared)
        return ToolOutput(prepared.refusal, is_error=True)

    def finished() -> None:
        if sandbox is not None:
            sandbox.finished(prepared)

    adopted = False
    try:
        output, adopted = await _run_prepared(command, prepared, ctx, timeout_ms, description=description,
                                              on_exit=finished)
        return output
    finally:
        if not adopted:
            finished()


def _task_host(ctx: ToolContext) -> TaskHost | None:
    return ctx.services.get(TASKS)


async def _spawn(prepared: Prepared, ctx: ToolContext, out_path: Path, fd: int) -> asyncio.subprocess.Process:
    guard = ctx.services.get(PROCESS_GUARD)
    with os.fdopen(fd, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *prepared.argv, cwd=str(ctx.cwd), env={**_environment(), **prepared.env},
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, preexec_fn=guard.preexec if guard is not None else None)
    if guard is not None:
        guard.started(proc.pid)
    return proc


def _minutes(ms: float) -> str:
    """A duration in whole minutes as Claude Code writes its background limit ("10m"), else as
    :func:`format_duration` does."""
    return f"{int(ms // 60_000)}m" if ms >= 60_000 and ms % 60_000 == 0 else format_duration(ms)


def whole_seconds(ms: float) -> str:
    """A timeout as Claude Code 2.1.332 names it in the moved-to-the-background text: under a minute, in
    whole seconds rounded half up, at least one (0.3 s, 0.5 s and 1.2 s are ``1s``, 1.5 s is ``2s``), else
    as :func:`format_duration` does."""
    return f"{max(1, math.floor(ms / 1000 + 0.5))}s" if ms < 60_000 else format_duration(ms)


def running_in_background(started: TaskStarted) -> str:
    """What the model is told of a command that runs as a background task (Claude Code's words)."""
    return (f"Command running in background with ID: {started.task_id}. Output is being written to: "
            f"{started.output_file}. You will be notified when it completes. To check interim output, use "
            "Read on that file path.")


def moved_to_background(so_far: str, timeout_ms: float, started: TaskStarted) -> str:
    """What the model is told of a command its timeout moved to the background (Claude Code's words)."""
    note = (f"Command did not complete within its {whole_seconds(timeout_ms)} timeout and was moved to the "
            f"background (ID: {started.task_id}). Output is being written to: {started.output_file}. You will "
            "be notified when it completes. If it is still running after "
            f"{_minutes(BACKGROUND_TIMEOUT_MS)} in the background, it will be stopped and you will be "
            "notified. It is running now: do not start a second copy while it runs. If it is no longer "
            "needed, stop it with TaskStop. To check interim output, use Read on that file path.")
    return "\n".join(p for p in (so_far, note) if p)


async def _run_prepared(command: str, prepared: Prepared, ctx: ToolContext, timeout_ms: float, *,
                        description: str = "", on_exit: Callable[[], None] | None = None) -> tuple[ToolOutput, bool]:
    """Run the command; (its result, whether the session's tasks adopted it: a command that outran its
    timeout moves to the background when the host keeps background tasks, and is killed otherwise)."""
    fd, name = tempfile.mkstemp(prefix="agentfsm-bash-", suffix=".out")
    out_path = Path(name)
    host = _task_host(ctx)
    adopted: TaskStarted | None = None
    try:
        proc = await _spawn(prepared, ctx, out_path, fd)
        waiter = asyncio.ensure_future(proc.wait())
        aborted = asyncio.ensure_future(ctx.abort.wait())
        try:
            started_at = time.monotonic()
            done, _ = await asyncio.wait({waiter, aborted}, timeout=timeout_ms / 1000,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done and host is not None:
                adopted = host.adopt_command(proc, out_path, command=command, description=description or command,
                                             tool_use_id=ctx.tool_use_id, timeout_ms=BACKGROUND_TIMEOUT_MS,
                                             on_exit=on_exit)
                return await _answer_moved(proc, waiter, aborted, host, adopted, timeout_ms,
                                           MOVED_ANSWER_AFTER_MS / 1000 - (time.monotonic() - started_at)), True
        finally:
            aborted.cancel()
            if adopted is None and proc.returncode is None:
                # timeout, abort, or this task was cancelled: nothing of the command may outlive it
                await asyncio.shield(_kill_group(proc))
        text = await asyncio.to_thread(read_output, out_path, ctx)
    finally:
        if adopted is None:
            with contextlib.suppress(OSError):
                out_path.unlink()
    if waiter not in done:
        if aborted in done:
            return ToolOutput("\n".join(p for p in (text, ABORTED) if p), is_error=True), False
        note = f"Command timed out after {format_duration(timeout_ms)}"
        return ToolOutput("\n".join(p for p in (note, text) if p), is_error=True), False
    code = _exit_code(proc.returncode)
    if code != 0 and not (code == 1 and await asyncio.to_thread(_found_nothing, command, str(ctx.cwd))):
        return ToolOutput("\n".join(p for p in (f"Exit code {code}", text) if p), is_error=True), False
    # what an SDK user receives (Claude Code's fields): the command's output, stderr merged into it
    return ToolOutput(text or NO_OUTPUT, structured={"stdout": text, "stderr": "", "interrupted": False,
                                                     "isImage": False, "noOutputExpected": False}), False


async def _answer_moved(proc: asyncio.subprocess.Process, waiter: asyncio.Future[int],
                        aborted: asyncio.Future[Any], host: TaskHost, adopted: TaskStarted, timeout_ms: float,
                        wait_s: float) -> ToolOutput:
    """The answer to a command its timeout moved to the background (``adopted``), given no sooner than
    :data:`MOVED_ANSWER_AFTER_MS` after it started (``wait_s`` more): one still running is told moved,
    with its output so far; one that ended meanwhile is answered as a background task with its whole
    output, once its end is reported (its notification then joins this result, where
    ``agentfsm.machine.graph.notification_place`` puts it)."""
    try:
        if wait_s > 0:
            await asyncio.wait({waiter, aborted}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done() and not waiter.cancelled():
            await host.ended(adopted.task_id)
            text = await asyncio.to_thread(read_output, Path(adopted.output_file), None)
            # the task's exit line, which its file gets on exit, is not part of what the command printed
            text = text.removesuffix(f"\n[exited with code {_exit_code(proc.returncode)}]").rstrip("\n")
            return ToolOutput("\n".join(p for p in (text, running_in_background(adopted)) if p))
        so_far = await asyncio.to_thread(read_output, Path(adopted.output_file), None)
        return ToolOutput(moved_to_background(so_far, timeout_ms, adopted))
    finally:
        waiter.cancel()


async def run_background(command: str, ctx: ToolContext, host: TaskHost, timeout_ms: float, *,
                         disable_sandbox: bool = False, description: str = "") -> ToolOutput:
    """Start ``command`` as a background task of the session (``run_in_background``): sandboxed like
    any command, its output written to the task's file, its end notified by the host."""
    sandbox, prepared = await asyncio.to_thread(prepare, command, ctx, disable_sandbox)
    if prepared.refusal is not None:
        if sandbox is not None:
            sandbox.finished(prepared)
        return ToolOutput(prepared.refusal, is_error=True)

    def finished() -> None:
        if sandbox is not None:
            sandbox.finished(prepared)

    fd, name = tempfile.mkstemp(prefix="agentfsm-bash-", suffix=".out")
    try:
        proc = await _spawn(prepared, ctx, Path(name), fd)
    except BaseException:
        finished()
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    started = host.adopt_command(proc, Path(name), command=command, description=description or command,
                                 tool_use_id=ctx.tool_use_id, timeout_ms=timeout_ms, on_exit=finished)
    return ToolOutput(running_in_background(started))


def _found_nothing(command: str, cwd: str) -> bool:
    """Whether exit status 1 only means "no match": the command ends in a search program (grep, rg)
    for which 1 is that answer, not a failure (as Claude Code reads it). Unsure means no."""
    if len(command) > INLINE_ANALYSIS_CHARS * 8:
        return False
    analysis = analyse(command, cwd)
    parts = [c for c in analysis.commands if c.part]
    if analysis.opaque or not parts:
        return False
    return parts[-1].program in SEARCH_PROGRAMS


@attrs.define
class BackgroundJob:
    id: str
    command: str
    output_path: Path
    process: subprocess.Popen[bytes]
    timer: threading.Timer | None = None

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()


#: Background commands started in this process, by id.
BACKGROUND_JOBS: dict[str, BackgroundJob] = {}


def background_dir(ctx: ToolContext) -> Path:
    return Path(tempfile.gettempdir()) / "agentfsm" / (ctx.session_id or "default") / "tasks"


def start_background(command: str, ctx: ToolContext, timeout_ms: float | None, *,
                     disable_sandbox: bool = False,
                     prepared: tuple[CommandSandbox | None, Prepared] | None = None) -> BackgroundJob:
    """Start ``command`` in the background. ``prepared``: how it runs, decided beforehand (off the
    event loop: resolving the sandbox's rules walks the workspace); the process itself is started by
    the calling thread, which must outlive it (bwrap's --die-with-parent follows the thread that
    forked it)."""
    sandbox, how = prepared if prepared is not None else prepare(command, ctx, disable_sandbox)
    if how.refusal is not None:
        if sandbox is not None:
            sandbox.finished(how)
        raise ToolError(how.refusal, wrapped=False)
    try:
        job = _start_prepared(command, how, ctx, timeout_ms)
    except BaseException:
        if sandbox is not None:
            sandbox.finished(how)
        raise
    if sandbox is not None:
        # the sandbox's placeholders go when the job ends
        threading.Thread(target=_finish_when_done, args=(job.process, sandbox, how), daemon=True).start()
    return job


def _finish_when_done(process: subprocess.Popen[bytes], sandbox: CommandSandbox, prepared: Prepared) -> None:
    process.wait()
    sandbox.finished(prepared)


def _start_prepared(command: str, prepared: Prepared, ctx: ToolContext, timeout_ms: float | None) -> BackgroundJob:
    job_id = "b" + secrets.token_hex(4)
    out_dir = background_dir(ctx)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{job_id}.output"
    with out_path.open("wb") as out:
        # Popen, not asyncio: the job must outlive this call and the event loop that made it.
        proc = subprocess.Popen(list(prepared.argv), cwd=str(ctx.cwd), env={**_environment(), **prepared.env},
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    job = BackgroundJob(job_id, command, out_path, proc)
    if timeout_ms is not None:
        job.timer = threading.Timer(timeout_ms / 1000, _signal_group, (proc.pid, signal.SIGKILL))
        job.timer.daemon = True
        job.timer.start()
    BACKGROUND_JOBS[job_id] = job
    return job


def stop_background(job_id: str) -> bool:
    """Kill a background job's process group; False if there is no such job."""
    job = BACKGROUND_JOBS.pop(job_id, None)
    if job is None:
        return False
    job.stop()
    return True


class BashTool(Tool):
    name = "Bash"
    description = (
        "Executes a bash command in the working directory and returns its combined stdout and stderr. "
        f"Times out after {DEFAULT_TIMEOUT_MS // 1000}s by default (timeout in ms, at most "
        f"{MAX_TIMEOUT_MS // 1000}s); output beyond {MAX_OUTPUT_CHARS} characters is saved to a file and a "
        "preview shown. A non-zero exit status is reported as an error with its code. A command that outruns its "
        "timeout moves to the background. Set run_in_background to start a long-running command and get its "
        "output file back at once; you are notified when it ends, and TaskStop stops it. Use Read, Glob, Grep, "
        "Edit and Write rather than cat, find, grep, sed or echo redirection for file work."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            # no "maximum": a background command may ask for up to MAX_BACKGROUND_TIMEOUT_MS; a foreground
            # one's is capped at MAX_TIMEOUT_MS when it runs (Claude Code's schema has none either)
            "timeout": {"type": "number",
                        "description": f"Optional timeout in milliseconds (max {MAX_TIMEOUT_MS} for a foreground "
                                       "command)"},
            "description": {"type": "string",
                            "description": "Clear, concise description of what this command does in "
                                           "active voice, in 5-10 words"},
            "run_in_background": {"type": "boolean",
                                  "description": "Set to true to run this command in the background. With it, "
                                                 "`timeout` limits how long the command may run in the background "
                                                 f"before it is stopped (default {BACKGROUND_TIMEOUT_MS} ms, max "
                                                 f"{MAX_BACKGROUND_TIMEOUT_MS} ms)."},
            # Claude Code's parameter and text; whether it is honoured is the settings' call
            # (sandbox.allowUnsandboxedCommands), and an unsandboxed command is never auto-allowed
            "dangerouslyDisableSandbox": {"type": "boolean",
                                          "description": "Set this to true to dangerously override sandbox mode "
                                                         "and run commands without sandboxing."},
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        command = input.get("command")
        # asked on the event loop: a long command is not analysed here (the permission check, in a
        # worker thread, still analyses it); it just runs alone
        return isinstance(command, str) and len(command) <= INLINE_ANALYSIS_CHARS and is_read_only_command(command)

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        # asked by the permission check, off the event loop: any length is analysed
        command = input.get("command")
        return isinstance(command, str) and is_read_only_command(command)

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        command = input.get("command")
        return command if isinstance(command, str) else None

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        command: str = input["command"]
        if not Path(ctx.cwd).is_dir():
            raise ToolError(f"Working directory does not exist: {ctx.cwd}")
        disable = input.get("dangerouslyDisableSandbox") is True
        description = input.get("description") if isinstance(input.get("description"), str) else ""
        if input.get("run_in_background"):
            host = _task_host(ctx)
            if host is not None:
                return await run_background(command, ctx, host, _background_timeout_ms(input),
                                            disable_sandbox=disable, description=description)
            timeout = _timeout_ms(input) if input.get("timeout") else None
            how = await asyncio.to_thread(prepare, command, ctx, disable)
            job = start_background(command, ctx, timeout, prepared=how)
            return ToolOutput(f"Command running in background with ID: {job.id}. "
                              f"Output is being written to: {job.output_path}.")
        return await run_foreground(command, ctx, _timeout_ms(input), disable_sandbox=disable,
                                    description=description)
