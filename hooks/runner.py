"""Run the hooks of one event: Python callables and Claude-Code-compatible command hooks.

Every matching hook of an event runs concurrently; their answers are combined into one
:class:`HookRunResult`. A command hook gets the event JSON on stdin and nowhere else: the command
line comes from settings, never from the model, so model-written text cannot reach a shell parser.
No failure of a hook (crash, bad output, timeout, missing program) escapes this module: each
becomes a non-blocking error note and the run goes on (docs/behaviour.md §5, §10). A hook that never
ran (its script or program is missing) is also said to the user, and a PreToolUse one fails closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.hooks.inputs import (
    BLOCKING_EVENTS,
    DECISION_BLOCK_EVENTS,
    PLAIN_STDOUT_CONTEXT_EVENTS,
    HookEvent,
    HookInput,
    HookOutput,
    parse_hook_output,
)
from agentfsm.tools.environment import child_environment

log = fsm_log.get_logger("agentfsm.hooks")

DEFAULT_COMMAND_TIMEOUT_S = 600.0
DEFAULT_PYTHON_TIMEOUT_S = 60.0
# After a kill, how long to wait for the hook to be reaped.
_KILL_GRACE_S = 2.0
#: Bytes of a hook's stdout (and of its stderr) read back; the rest is dropped.
MAX_OUTPUT_BYTES = 1 << 20

HookFn = Callable[[Any], Any]
"""A Python hook: ``fn(input_record) -> HookOutput | dict | str | None`` (sync or async)."""


class HookBlockingError(Exception):
    """Raised by a Python hook to block exactly as a command hook's exit 2 does; the message is the
    reason (the stderr of a command hook)."""


@attrs.frozen
class CommandHook:
    """One ``{"type": "command", ...}`` handler.

    Shell form: ``command`` runs under ``bash -c``. Exec form: ``args`` is the argv and no shell is
    involved; if ``command`` is given too it is the program and ``args`` its arguments.
    """

    command: str | None = None
    args: tuple[str, ...] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else tuple(v))
    timeout: float = DEFAULT_COMMAND_TIMEOUT_S
    source: str = ""  # the settings file it came from, for error messages and logs

    def __attrs_post_init__(self) -> None:
        if not self.command and not self.args:
            raise ValueError("a command hook needs 'command' (shell form) or 'args' (exec form)")
        if self.timeout <= 0:
            raise ValueError(f"a hook timeout must be positive, got {self.timeout!r}")

    def argv(self) -> list[str]:
        if self.args is not None:
            return ([self.command] if self.command else []) + list(self.args)
        assert self.command is not None
        return ["bash", "-c", self.command]

    @property
    def label(self) -> str:
        if self.args is not None:
            return " ".join(self.argv())
        return self.command or ""

    def dedup_key(self) -> tuple[Any, ...]:
        # Timeout and source are left out: the same command configured in two files runs once.
        return ("command", self.command, self.args)


Hook = CommandHook | HookFn

_EXACT_NAMES = re.compile(r"^[A-Za-z0-9_|]+$")


def compile_matcher(matcher: str | None) -> Callable[[str], bool]:
    """Claude Code's matcher rules: absent, ``""`` or ``"*"`` match everything; only letters,
    digits, ``_`` and ``|`` = exact names; anything else is a regular expression (searched, as
    JavaScript's ``RegExp.test`` does). A bad regex raises ValueError."""
    if matcher is None or matcher in ("", "*"):
        return lambda subject: True
    if _EXACT_NAMES.match(matcher):
        names = frozenset(n for n in matcher.split("|") if n)
        return lambda subject: subject in names
    try:
        rx = re.compile(matcher)
    except re.error as exc:
        raise ValueError(f"matcher {matcher!r} is not a valid regular expression: {exc}") from None
    return lambda subject: rx.search(subject) is not None


def _hooks_tuple(value: Iterable[Hook]) -> tuple[Hook, ...]:
    out = tuple(value)
    for h in out:
        if not isinstance(h, CommandHook) and not callable(h):
            raise TypeError(f"a hook must be a CommandHook or a callable, not {h!r}")
    return out


@attrs.frozen
class HookMatcher:
    """A matcher and the hooks it selects, as in ``settings.json`` (and the Python hook API)."""

    matcher: str | None = None
    hooks: tuple[Hook, ...] = attrs.field(factory=tuple, converter=_hooks_tuple)
    # Python hooks only; command hooks carry their own timeout.
    timeout: float = DEFAULT_PYTHON_TIMEOUT_S
    source: str = ""
    _match: Callable[[str], bool] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_match", compile_matcher(self.matcher))

    def matches(self, subject: str | None) -> bool:
        """``subject`` None = the event ignores matchers, so every matcher selects its hooks."""
        return subject is None or self._match(subject)


Outcome = Literal["success", "blocking", "non_blocking_error", "timeout"]


@attrs.frozen
class HookResult:
    """What one hook did."""

    hook: str
    kind: Literal["command", "python"]
    outcome: Outcome
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: HookOutput | None = None
    plain_output: str = ""  # exit-0 stdout that was not a JSON object
    notes: tuple[str, ...] = ()
    duration_ms: float = 0.0
    # why the hook's own code never ran (its program or script is missing, not executable): a
    # configuration mistake the user has to fix, never the hook's decision
    unrunnable: str = ""


@attrs.frozen
class HookRunResult:
    """The combined answer of every hook that ran for one event."""

    event: str
    results: tuple[HookResult, ...] = ()
    blocked: bool = False
    reason: str = ""
    stop: bool = False
    stop_reason: str = ""
    permission_decision: Literal["allow", "deny", "ask", "defer"] | None = None
    permission_decision_reason: str = ""
    updated_input: Mapping[str, Any] | None = None
    additional_context: tuple[str, ...] = ()
    # which of ``additional_context`` were a hook's plain stdout (Claude Code labels those "success")
    plain_context: tuple[str, ...] = ()
    updated_tool_output: Any = None
    suppress_output: bool = False
    # Non-blocking failures and ignored output fields; the run goes on but someone should see them.
    errors: tuple[str, ...] = ()
    # Text meant for the user only (systemMessage; exit-2 stderr of non-blocking events).
    user_messages: tuple[str, ...] = ()
    duration_ms: float = 0.0


# What an interpreter or shell prints, alone, when it cannot open the script it was given or find the
# program: the hook's code never ran. Python and dash exit 2 then, which would otherwise read as the
# hook's "block" (and the run would tell only the model); bash exits 126/127; `python -m` of a module
# that interpreter does not have exits 1.
_UNRUNNABLE = re.compile(
    r"\A(?:\S+: )?(?:\d+: |line \d+: )?(?:"
    r"can't open file '(?P<py>[^\n]*)': \[Errno \d+\] (?P<pyerr>[^\n]+)"  # python3 missing.py
    r"|(?:cannot|Can't|can't) open (?P<sh>[^\n:]+): (?P<sherr>[^\n]+)"  # sh missing.sh (dash)
    r"|(?P<bash>[^\n:]+): (?P<basherr>No such file or directory|Permission denied|command not found)"  # bash -c
    r"|(?:Error while finding module specification for '(?P<mod>[^'\n]+)' \((?P<moderr>[^\n]+)\)"  # python -m
    r"|No module named (?P<mod2>[^\n]+))"
    r")\n?\Z")


_SKIPPED = "It was skipped (its exit status is not taken as the hook's decision)."
# what a hook that cannot run does to its event: a permission hook fails closed, the others are skipped
_UNRUNNABLE_EFFECT = {HookEvent.PRE_TOOL_USE: "The tool call it guards was denied (fail closed) and the model "
                                              "was told the hook could not run."}


def unrunnable_reason(exit_code: int, stderr: str) -> str:
    """Why a command hook that exited ``exit_code`` with ``stderr`` never ran its own code ("" when it
    did): its interpreter could not open the script, or the shell could not find the program."""
    if exit_code not in (1, 2, 126, 127):
        return ""
    m = _UNRUNNABLE.match(stderr.strip() + "\n")
    if m is None:
        return ""
    if m["mod"] or m["mod2"]:  # `python -m` of a module this interpreter does not have (exit 1)
        return f"{m['mod'] or m['mod2']}: {m['moderr'] or 'no such module'} for this Python"
    if exit_code == 1:
        return ""
    what = m["py"] or m["sh"] or m["bash"]
    err = m["pyerr"] or m["sherr"] or m["basherr"]
    return f"{what.strip()}: {err.strip()}"


def interpret_command_result(event: str, exit_code: int, stdout: str,
                             stderr: str) -> tuple[Outcome, HookOutput | None, str, tuple[str, ...]]:
    """Map a finished command hook to (outcome, parsed JSON answer, plain stdout, notes).

    Exit 0: stdout is the answer if it is a JSON object, plain text otherwise. Exit 2: blocking,
    stdout ignored (stderr is the reason). Anything else: a non-blocking error.
    """
    if exit_code != 0 and (missing := unrunnable_reason(exit_code, stderr)):
        return "non_blocking_error", None, "", (f"could not run (exit status {exit_code}: {missing}); "
                                                      "not treated as the hook's decision",)
    if exit_code == 0:
        text = stdout.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except ValueError as exc:
                return "success", None, stdout, (f"stdout looks like JSON but does not parse ({exc}); "
                                                 "treated as plain text",)
            if isinstance(data, dict):
                output, notes = parse_hook_output(data, event)
                return "success", output, "", notes
        return "success", None, stdout, ()
    if exit_code == 2:
        return "blocking", None, "", ()
    detail = stderr.strip() or stdout.strip() or "no output"
    if exit_code < 0:
        with contextlib.suppress(ValueError):
            return "non_blocking_error", None, "", (
                f"killed by signal {signal.Signals(-exit_code).name}: {_tail(detail)}",)
    return "non_blocking_error", None, "", (f"failed with exit status {exit_code}: {_tail(detail)}",)


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


_DECISION_RANK = {"deny": 3, "defer": 2, "ask": 1, "allow": 0}


def combine(event: str, results: Sequence[HookResult], duration_ms: float = 0.0) -> HookRunResult:
    """Combine several hooks' answers: any block blocks (reasons joined), any ``continue: false``
    stops, and the strongest permission decision wins (deny > defer > ask > allow)."""
    blocked = stop = suppress = False
    reasons: list[str] = []
    stop_reasons: list[str] = []
    decisions: list[tuple[str, str]] = []
    updated_inputs: list[Mapping[str, Any]] = []
    contexts: list[str] = []
    plain: list[str] = []
    errors: list[str] = []
    user_messages: list[str] = []
    updated_output: Any = None

    for r in results:
        errors.extend(f"{r.hook}: {n}" for n in r.notes)
        if r.unrunnable and event == HookEvent.PRE_TOOL_USE:
            # fail closed: a permission hook that cannot run cannot approve the call (Claude Code denies
            # it too when the interpreter exits 2; here the program-not-found exits deny as well)
            blocked = True
            reasons.append(f"PreToolUse hook error: [{r.hook}] could not run ({r.unrunnable}); the call is denied "
                           "because a hook that cannot run cannot approve it")
            continue
        if r.outcome == "blocking":
            text = r.stderr.strip() or f"hook {r.hook!r} exited with status 2 and no stderr"
            if event in BLOCKING_EVENTS:
                blocked = True
                reasons.append(text)
            else:
                user_messages.append(text)
            continue
        if r.outcome != "success":
            continue
        if event in PLAIN_STDOUT_CONTEXT_EVENTS and r.plain_output.strip():
            contexts.append(r.plain_output.strip())
            plain.append(r.plain_output.strip())
        out = r.output
        if out is None:
            continue
        suppress = suppress or out.suppress_output
        if not out.continue_:
            stop = True
            if out.stop_reason:
                stop_reasons.append(out.stop_reason)
        if out.decision == "block" and event in DECISION_BLOCK_EVENTS:
            blocked = True
            reasons.append(out.reason or f"blocked by hook {r.hook!r}")
        if out.permission_decision is not None and event == HookEvent.PRE_TOOL_USE:
            decisions.append((out.permission_decision, out.permission_decision_reason or out.reason))
        if out.updated_input is not None and event == HookEvent.PRE_TOOL_USE:
            updated_inputs.append(out.updated_input)
        if out.additional_context:
            contexts.append(out.additional_context)
        if out.updated_tool_output is not None and event == HookEvent.POST_TOOL_USE:
            updated_output = out.updated_tool_output
        if out.system_message:
            user_messages.append(out.system_message)

    decision: Any = None
    decision_reason = ""
    if decisions:
        decision = max(decisions, key=lambda d: _DECISION_RANK[d[0]])[0]
        decision_reason = "\n".join(r for d, r in decisions if d == decision and r)

    updated_input: Mapping[str, Any] | None = None
    if updated_inputs:
        # Hooks run in parallel, so "later" has no meaning; the last in configuration order wins and
        # a disagreement is reported rather than silently merged.
        updated_input = updated_inputs[-1]
        if any(dict(u) != dict(updated_input) for u in updated_inputs[:-1]):
            errors.append("several hooks returned different updatedInput; the last configured one is used")

    return HookRunResult(
        event=event, results=tuple(results), blocked=blocked, reason="\n".join(reasons), stop=stop,
        stop_reason="\n".join(stop_reasons), permission_decision=decision,
        permission_decision_reason=decision_reason, updated_input=updated_input,
        additional_context=tuple(contexts), plain_context=tuple(plain), updated_tool_output=updated_output,
        suppress_output=suppress,
        errors=tuple(errors), user_messages=tuple(user_messages), duration_ms=duration_ms,
    )


def _hook_label(hook: Hook) -> str:
    if isinstance(hook, CommandHook):
        return hook.label
    return getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None) or repr(hook)


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write the event JSON to the hook's stdin and close it; a hook that does not read it is fine."""
    stdin = proc.stdin
    if stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
        stdin.write(data)
        await stdin.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
        stdin.close()


async def _reap(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(TimeoutError, ProcessLookupError):
        await asyncio.wait_for(proc.wait(), _KILL_GRACE_S)


def _read_capped(fh: Any) -> bytes:
    """What a hook wrote, at most :data:`MAX_OUTPUT_BYTES` (a hook printing gigabytes costs disk)."""
    fh.seek(0)
    data = fh.read(MAX_OUTPUT_BYTES + 1)
    if len(data) > MAX_OUTPUT_BYTES:
        return data[:MAX_OUTPUT_BYTES] + b"\n[output truncated]"
    return data


def _read_both(out_f: Any, err_f: Any) -> tuple[bytes, bytes]:
    return _read_capped(out_f), _read_capped(err_f)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The hook runs in its own session, so its pgid is its pid; killing the group also reaches the
    # children a shell hook spawned (a `sleep` under `bash -c` would otherwise outlive it).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


class HookRunner:
    """Holds the configured hooks of every event and runs those matching one event record.

    ``project_dir`` becomes ``CLAUDE_PROJECT_DIR`` and the default working directory of command
    hooks; ``env`` is added to the inherited environment of every command hook.
    """

    def __init__(self, hooks: Mapping[str, Sequence[HookMatcher]] | None = None, *,
                 project_dir: str | Path = ".", env: Mapping[str, str] | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        self._hooks: dict[str, list[HookMatcher]] = {}
        # told, once per hook, when a command hook cannot run at all (its script or program is
        # missing): the user's configuration is wrong and only the user can fix it. stderr by default.
        self.warn: Callable[[str], None] = warn or _warn_stderr
        self._warned: set[str] = set()
        # told when each command hook starts and how it ended (stream-json's hook_started and
        # hook_response, as Claude Code prints them with --include-hook-events)
        self.observer: Callable[[dict[str, Any]], None] | None = None
        self.project_dir = Path(project_dir).resolve()
        self.env = dict(env or {})
        for event, matchers in (hooks or {}).items():
            for m in matchers:
                self.add(event, m)

    def add(self, event: str, matcher: HookMatcher) -> None:
        self._hooks.setdefault(str(event), []).append(matcher)

    def has_hooks(self, event: str) -> bool:
        return any(m.hooks for m in self._hooks.get(str(event), ()))

    def matching(self, event: str, subject: str | None) -> list[tuple[Hook, HookMatcher]]:
        """Hooks of ``event`` selected by ``subject``, deduplicated, in configuration order."""
        seen: set[Any] = set()
        out: list[tuple[Hook, HookMatcher]] = []
        for m in self._hooks.get(str(event), ()):
            if not m.matches(subject):
                continue
            for h in m.hooks:
                key = h.dedup_key() if isinstance(h, CommandHook) else ("python", id(h))
                if key in seen:
                    continue
                seen.add(key)
                out.append((h, m))
        return out

    async def run(self, record: HookInput) -> HookRunResult:
        event = record.event
        selected = self.matching(event, record.matcher_subject())
        if not selected:
            return HookRunResult(event=event)
        start = time.perf_counter()
        results = await asyncio.gather(*(self._run_one(h, m, record) for h, m in selected))
        return combine(event, results, (time.perf_counter() - start) * 1000)

    async def _run_one(self, hook: Hook, matcher: HookMatcher, record: HookInput) -> HookResult:
        observed = self.observer if isinstance(hook, CommandHook) else None
        started = hook_started_message(record) if observed is not None else None
        if observed is not None and started is not None:
            _tell(observed, started)
        try:
            if isinstance(hook, CommandHook):
                result = await self._run_command(hook, record)
            else:
                result = await self._run_python(hook, matcher.timeout, record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug here (an unserialisable record, an OS error mid-run) must not sink the turn.
            kind: Literal["command", "python"] = "command" if isinstance(hook, CommandHook) else "python"
            note = f"hook runner failed: {type(exc).__name__}: {exc}"
            result = HookResult(_hook_label(hook), kind, "non_blocking_error", notes=(note,))
        level = "info" if result.outcome in ("success", "blocking") else "warning"
        getattr(log, level)(
            "hook", hook_event=record.event, hook=result.hook, kind=result.kind, outcome=result.outcome,
            exit_code=result.exit_code, duration_ms=round(result.duration_ms, 1),
            session_id=record.session_id, notes=list(result.notes) or None,
        )
        if observed is not None and started is not None:
            _tell(observed, hook_response_message(started, result))
        if result.unrunnable and result.hook not in self._warned:
            self._warned.add(result.hook)
            where = f" (configured in {hook.source})" if isinstance(hook, CommandHook) and hook.source else ""
            cwd = record.cwd or self.project_dir
            effect = _UNRUNNABLE_EFFECT.get(record.event, _SKIPPED)
            _tell_user(self.warn, f"agentfsm: warning: the {record.event} hook `{result.hook}`{where} could not run: "
                                  f"{result.unrunnable}. {effect} A relative path is resolved from the session's "
                                  f"working directory, {cwd}: use an absolute path, or \"$CLAUDE_PROJECT_DIR\"/… "
                                  "for a script in the project.")
        return result

    async def _run_command(self, hook: CommandHook, record: HookInput) -> HookResult:
        label = hook.label
        data = record.to_json().encode("utf-8")
        # our credentials stay with us (agentfsm.tools.environment)
        env = child_environment({**self.env, "CLAUDE_PROJECT_DIR": str(self.project_dir)})
        cwd = record.cwd if record.cwd and Path(record.cwd).is_dir() else str(self.project_dir)
        start = time.perf_counter()

        def elapsed() -> float:
            return (time.perf_counter() - start) * 1000

        # stdout and stderr go to files, not pipes: a background child the hook leaves behind keeps
        # its copy of them, and with a pipe the call would wait for that child to exit
        with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *hook.argv(), stdin=asyncio.subprocess.PIPE, stdout=out_f, stderr=err_f, cwd=cwd, env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                return HookResult(label, "command", "non_blocking_error", notes=(f"could not start: {exc}",),
                                  duration_ms=elapsed(), unrunnable=f"could not start: {exc.strerror or exc}")
            feed = asyncio.ensure_future(_feed(proc, data))
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), hook.timeout)
            except TimeoutError:
                _kill_group(proc)
                await _reap(proc)
                feed.cancel()
                out_b, err_b = await asyncio.to_thread(_read_both, out_f, err_f)
                return HookResult(label, "command", "timeout", exit_code=proc.returncode,
                                  stdout=_decode(out_b), stderr=_decode(err_b),
                                  notes=(f"timed out after {hook.timeout:g}s and was killed",),
                                  duration_ms=elapsed())
            except asyncio.CancelledError:
                # The run was aborted: the hook must not outlive it.
                _kill_group(proc)
                feed.cancel()
                await asyncio.shield(_reap(proc))
                raise
            feed.cancel()
            out_b, err_b = await asyncio.to_thread(_read_both, out_f, err_f)

        stdout, stderr = _decode(out_b), _decode(err_b)
        code = proc.returncode if proc.returncode is not None else -1
        outcome, output, plain, notes = interpret_command_result(record.event, code, stdout, stderr)
        return HookResult(label, "command", outcome, exit_code=code, stdout=stdout, stderr=stderr,
                          output=output, plain_output=plain, notes=notes, duration_ms=elapsed(),
                          unrunnable=unrunnable_reason(code, stderr) if code else "")

    async def _run_python(self, fn: HookFn, timeout: float, record: HookInput) -> HookResult:
        label = _hook_label(fn)
        start = time.perf_counter()

        def done(outcome: Outcome, **kw: Any) -> HookResult:
            ms = (time.perf_counter() - start) * 1000
            return HookResult(label, "python", outcome, duration_ms=ms, **kw)

        try:
            # An instance with `async def __call__` is as async as a coroutine function.
            call_method = type(fn).__call__ if not inspect.isfunction(fn) else None
            if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call_method):
                value = await asyncio.wait_for(fn(record), timeout)
            else:
                # A sync hook may block (I/O, subprocess); a thread keeps the loop and the other
                # hooks of the event running. A timed-out thread cannot be killed, only abandoned.
                value = await asyncio.wait_for(asyncio.to_thread(fn, record), timeout)
                if inspect.isawaitable(value):
                    value = await asyncio.wait_for(_as_coro(value), timeout)
        except HookBlockingError as exc:
            return done("blocking", exit_code=2, stderr=str(exc))
        except TimeoutError:
            return done("timeout", notes=(f"timed out after {timeout:g}s",))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return done("non_blocking_error", notes=(f"raised {type(exc).__name__}: {exc}",))

        if value is None:
            return done("success", exit_code=0)
        if isinstance(value, HookOutput):
            return done("success", exit_code=0, output=value)
        if isinstance(value, Mapping):
            output, notes = parse_hook_output(value, record.event)
            return done("success", exit_code=0, output=output, notes=notes)
        if isinstance(value, str):
            return done("success", exit_code=0, stdout=value, plain_output=value)
        return done("non_blocking_error",
                    notes=(f"returned {type(value).__name__}; expected HookOutput, dict, str or None",))


#: Claude Code's ``outcome`` of a hook_response: a non-zero exit (2 included) is an ``error``, a hook
#: stopped at its timeout ``cancelled``
_RESPONSE_OUTCOME: dict[str, str] = {"success": "success", "blocking": "error", "non_blocking_error": "error",
                                     "timeout": "cancelled"}


def hook_started_message(record: HookInput) -> dict[str, Any]:
    """``system``/``hook_started`` of a command hook about to run for ``record``."""
    subject = record.matcher_subject()
    name = f"{record.event}:{subject}" if subject else record.event
    return {"type": "system", "subtype": "hook_started", "hook_id": str(uuid.uuid4()), "hook_name": name,
            "hook_event": record.event}


def hook_response_message(started: Mapping[str, Any], result: HookResult) -> dict[str, Any]:
    """``system``/``hook_response``: how the hook of ``started`` ended."""
    return {**started, "subtype": "hook_response", "output": result.stdout + result.stderr,
            "stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code,
            "outcome": _RESPONSE_OUTCOME[result.outcome]}


def _tell(observer: Callable[[dict[str, Any]], None], message: dict[str, Any]) -> None:
    # a consumer's failure is not the hook's: the hook's answer still counts
    try:
        observer(message)
    except Exception as exc:
        log.warning("hook.observer_failed", error=repr(exc))


def _warn_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _tell_user(warn: Callable[[str], None], text: str) -> None:
    try:
        warn(text)
    except Exception as exc:  # a closed stderr must not sink the turn
        log.warning("hook.warn_failed", error=repr(exc))


async def _as_coro(value: Awaitable[Any]) -> Any:
    return await value


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
