"""``agentfsm``: Claude Code's headless command line, plus subcommands for the other jobs.

``agentfsm -p PROMPT [flags]`` runs the loop; ``demo``, ``serve-scripted``, ``diagram``, ``audit``,
``worker`` and ``batch`` are subcommands. Only what the ``-p`` path needs is imported on it (no diagram
code, no hypothesis, no Temporal SDK unless ``--temporal`` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from agentfsm.common.textsafe import json_line, printable

SUBCOMMANDS = ("demo", "serve-scripted", "diagram", "audit", "worker", "batch", "conform")
TEMPORAL_ENV = "AGENTFSM_TEMPORAL"  # stands in for --temporal


# what Claude Code tells the model first when the Agent SDK runs it with a custom (or empty) system prompt
SDK_IDENTITY = "You are a Claude agent, built on Anthropic's Claude Agent SDK."


class UsageError(Exception):
    """A command line that cannot run; exit status 2."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _split_list(values: Sequence[str] | None) -> tuple[str, ...]:
    """``Read,Grep`` and ``Read Grep`` both work; commas inside ``Bash(a,b)`` are kept."""
    out: list[str] = []
    for v in values or ():
        depth, cur = 0, ""
        for ch in v:
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            if (ch == "," or ch.isspace()) and depth == 0:
                if cur.strip():
                    out.append(cur.strip())
                cur = ""
            else:
                cur += ch
        if cur.strip():
            out.append(cur.strip())
    return tuple(out)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line is a :class:`UsageError` (exit 1, like Claude Code's)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message + self._suggestion(message))

    def _suggestion(self, message: str) -> str:
        """``unrecognized arguments: --outpt-format json`` → the flag that was meant (abbreviations are
        refused, so a near miss says which flag it is near)."""
        import difflib

        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        known = [o for a in self._actions for o in a.option_strings
                 if o.startswith("--") and a.help is not argparse.SUPPRESS]
        hints = []
        for word in message[len(prefix):].split():
            flag = word.split("=", 1)[0]
            if flag.startswith("--"):
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
                if close:
                    hints.append(f"{flag} → {close[0]}")
        return f" (did you mean: {', '.join(hints)}?)" if hints else ""


def build_parser() -> argparse.ArgumentParser:
    # no abbreviations: `--dangerously` must not pass for `--dangerously-skip-permissions`
    p = _Parser(
        prog="agentfsm", allow_abbrev=False,
        description="Claude Code's agent loop as an explicit finite-state machine. "
                    f"Subcommands: {', '.join(SUBCOMMANDS)} (run `agentfsm SUBCOMMAND --help`).")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when absent)")
    p.add_argument("-v", "--version", action="store_true", help="print the version and exit")
    p.add_argument("-p", "--print", action="store_true", dest="print_mode",
                   help="print the response and exit (headless mode)")
    p.add_argument("--output-format", choices=("text", "json", "stream-json"), default="text")
    p.add_argument("--input-format", choices=("text", "stream-json"), default="text")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--debug", action="store_true", help="log every loop event to stderr")
    p.add_argument("--model", default=None)
    p.add_argument("--fallback-model", default=None, help="comma-separated fallback models")
    p.add_argument("--tools", nargs="+", default=None, help='tools to offer: "Read,Grep" or "Read Grep"')
    p.add_argument("--allowedTools", "--allowed-tools", nargs="+", dest="allowed_tools", default=None)
    p.add_argument("--disallowedTools", "--disallowed-tools", nargs="+", dest="disallowed_tools",
                   default=None)
    p.add_argument("--permission-mode", default=None)
    p.add_argument("--dangerously-skip-permissions", action="store_true")
    p.add_argument("--no-sandbox", action="store_false", dest="sandbox",
                   help="run the model's commands outside the kernel sandbox (docs/sandbox.md)")
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--max-budget-usd", type=float, default=None)
    p.add_argument("--limit", action="append", default=[], metavar="NAME=VALUE",
                   help="set any loop limit, e.g. --limit malformed_tool_use_retries=2")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--append-system-prompt", default=None)
    p.add_argument("--settings", default=None, help="settings JSON file or JSON string")
    p.add_argument("--setting-sources", default=None, help="comma list of user,project,local")
    p.add_argument("--json-schema", default=None, help="JSON Schema the final answer must satisfy")
    p.add_argument("-r", "--resume", default=None, metavar="SESSION_ID")
    p.add_argument("-c", "--continue", action="store_true", dest="continue_session")
    p.add_argument("--fork-session", action="store_true")
    p.add_argument("--session-id", default=None)
    p.add_argument("--sessions-dir", default=None, help="where session files go")
    p.add_argument("--scripted", default=None, metavar="SCENARIO.json",
                   help="answer with the in-process scripted model instead of an API (a scenario file, or the "
                        "name of an embedded one: read_probe)")
    p.add_argument("--cwd", default=None, help="working directory of the session")
    p.add_argument("--permission-prompt-tool", default=None, metavar="stdio",
                   help="ask the Claude Agent SDK (over the stream-json control protocol) about calls the "
                        "permission rules leave open")
    p.add_argument("--mcp-config", nargs="+", action="extend", default=[], metavar="FILE|JSON",
                   help='MCP servers: {"mcpServers": {...}} as JSON text or a file (several merge)')
    p.add_argument("--strict-mcp-config", action="store_true",
                   help="use only --mcp-config servers, not those of ~/.claude.json and .mcp.json")
    p.add_argument("--system-prompt-file", default=None, metavar="FILE")
    # accepted for the Claude Agent SDK's sake; they change nothing in this loop
    p.add_argument("--include-partial-messages", action="store_true",
                   help="stream-json: also print each raw stream event (stream_event) as it arrives")
    p.add_argument("--task-budget", type=_positive_int, default=None, metavar="TOKENS",
                   help="tell the model the task's token budget (sent as output_config.task_budget)")
    # the Agent SDK's session_store and resume-at-message: agentfsm keeps its own session files and
    # cannot mirror them or cut a resumed session; refused by name rather than ignored
    for flag in ("--session-mirror",):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--resume-session-at", "--resume-drops-turn"):
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    p.add_argument("--include-hook-events", action="store_true",
                   help="stream-json: also print when each command hook starts and how it ended")
    for flag in ("--replay-user-messages",):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--thinking", "--thinking-display", "--max-thinking-tokens", "--effort", "--betas", "--plugin-dir"):
        p.add_argument(flag, action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--add-dir", action="extend", nargs="+", default=[], dest="add_dir", metavar="DIR",
                   help="another working directory: tools may read (and, as allowed, write) there without asking")
    p.add_argument("--temporal", default=os.environ.get(TEMPORAL_ENV) or None, metavar="HOST:PORT",
                   help=f"run the session as a durable Temporal workflow on `agentfsm worker`s (${TEMPORAL_ENV})")
    p.add_argument("--task-queue", default="agentfsm", help="the workers' task queue (with --temporal)")
    p.add_argument("--worker-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="with --temporal: how long to wait for a worker to take the session (default 60)")
    return p


def _thinking(args: argparse.Namespace, max_tokens: int) -> dict[str, Any] | None:
    """The thinking configuration the flags ask for, as Claude Code sends it: a budget
    (``--max-thinking-tokens``; ``--thinking adaptive`` takes the whole output budget less one token,
    as Claude Code 2.1.332 does for the models agentfsm knows), the display (``--thinking-display``,
    default ``updates``), or ``--thinking disabled``. None when no flag asks."""
    kind = args.thinking[-1] if args.thinking else None
    budget = args.max_thinking_tokens[-1] if args.max_thinking_tokens else None
    display = args.thinking_display[-1] if args.thinking_display else None
    if kind == "disabled":
        return {"type": "disabled"}
    if kind not in (None, "adaptive", "enabled"):
        raise UsageError(f"--thinking {kind}: use adaptive, enabled or disabled")
    if kind is None and budget is None:
        return None
    try:
        tokens = int(budget) if budget is not None else max_tokens - 1
    except ValueError:
        raise UsageError(f"--max-thinking-tokens {budget}: not a number of tokens") from None
    if not 0 < tokens < max_tokens:
        raise UsageError(f"--max-thinking-tokens {tokens}: must be positive and below the output limit ({max_tokens})")
    return {"budget_tokens": tokens, "type": "enabled", "display": display or "updates"}


def options_from_args(args: argparse.Namespace) -> Any:
    from agentfsm.machine.options import DEFAULT_MODEL, Options
    from agentfsm.machine.state import Limits

    if args.output_format == "stream-json" and not args.verbose:
        raise UsageError("When using --print, --output-format=stream-json requires --verbose")
    if args.session_mirror:
        raise UsageError("--session-mirror (the Agent SDK's session_store) is not supported: agentfsm keeps its "
                         "sessions in its own files (--sessions-dir)")
    if args.resume_session_at is not None or args.resume_drops_turn is not None:
        raise UsageError("--resume-session-at/--resume-drops-turn are not supported: agentfsm resumes a session "
                         "whole (--resume, --fork-session)")
    if args.plugin_dir:
        raise UsageError("--plugin-dir (the Agent SDK's plugins) is not supported: agentfsm loads no plugins")
    skills = [t for t in _split_list(args.allowed_tools) if t == "Skill" or t.startswith("Skill(")]
    if skills:
        raise UsageError(f"skills are not supported (the Agent SDK's skills option, --allowedTools {skills[0]}): "
                         "agentfsm has no Skill tool and loads no skills")
    if args.include_partial_messages and args.output_format != "stream-json":
        raise UsageError("--include-partial-messages requires --print and --output-format=stream-json.")
    if args.input_format == "stream-json" and args.output_format != "stream-json":
        raise UsageError("--input-format=stream-json requires output-format=stream-json.")
    if args.permission_prompt_tool is not None and (
            args.permission_prompt_tool != "stdio" or args.input_format != "stream-json"):
        raise UsageError("--permission-prompt-tool supports only 'stdio', with --input-format stream-json "
                         "(the Claude Agent SDK answers over the control protocol)")
    if args.cwd is not None and not Path(args.cwd).is_dir():
        raise UsageError(f"--cwd {args.cwd}: no such directory")
    if args.system_prompt_file is not None:
        if args.system_prompt is not None:
            raise UsageError("Cannot use both --system-prompt and --system-prompt-file")
        try:
            args.system_prompt = Path(args.system_prompt_file).read_text()
        except OSError as exc:
            raise UsageError(f"--system-prompt-file: {exc}") from None
    if args.session_id is not None:
        try:
            uuid.UUID(args.session_id)
        except ValueError:
            raise UsageError(f"--session-id must be a valid UUID, got {args.session_id!r}") from None
    limits = Limits()
    try:
        if args.max_turns is not None:
            limits = limits.with_setting("max_turns", str(args.max_turns))
        if args.max_budget_usd is not None:
            limits = limits.with_setting("max_budget_usd", str(args.max_budget_usd))
        for item in args.limit:
            name, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"--limit takes NAME=VALUE, got {item!r}")
            limits = limits.with_setting(name.strip(), value)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    mode = args.permission_mode or ("bypassPermissions" if args.dangerously_skip_permissions else None)
    schema = None
    if args.json_schema:
        try:
            schema = json.loads(Path(args.json_schema).read_text() if Path(args.json_schema).is_file()
                                else args.json_schema)
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"--json-schema is not a JSON file or JSON text: {exc}") from None
        from agentfsm.tools.schema import is_valid_schema

        if not isinstance(schema, dict) or not is_valid_schema(schema):
            raise UsageError("--json-schema is not a valid JSON Schema")
    # an empty --setting-sources= (the Agent SDK's isolation: setting_sources=[]) loads none of them
    sources = (tuple(_split_list([args.setting_sources])) if args.setting_sources is not None
               else ("user", "project", "local"))
    unknown = [s for s in sources if s not in ("user", "project", "local")]
    if unknown:
        raise UsageError(f"--setting-sources: unknown source(s) {', '.join(unknown)}; use user, project, local")
    try:
        return Options(
            model=args.model or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL,
            fallback_models=_split_list([args.fallback_model]) if args.fallback_model else (),
            tools=_split_list(args.tools) if args.tools is not None else None,
            allowed_tools=_split_list(args.allowed_tools),
            disallowed_tools=_split_list(args.disallowed_tools),
            permission_mode=mode, limits=limits, system_prompt=args.system_prompt, sandbox=args.sandbox,
            append_system_prompt=args.append_system_prompt,
            cwd=Path(args.cwd) if args.cwd else Path.cwd(), settings=args.settings,
            setting_sources=sources, session_id=args.session_id, resume=args.resume,
            continue_session=args.continue_session, fork_session=args.fork_session,
            sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None, json_schema=schema,
            include_partial_messages=args.include_partial_messages, task_budget=args.task_budget,
            include_hook_events=args.include_hook_events, add_dirs=args.add_dir,
            thinking=_thinking(args, limits.max_output_tokens),
            system_identity=SDK_IDENTITY if args.system_prompt is not None and os.environ.get(
                "CLAUDE_CODE_ENTRYPOINT", "").startswith("sdk") else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Stdout:
    """stdout as the headless protocol's channel. A reader that goes away (``| head -1``) is not an
    error: the first failed write sends the rest to /dev/null (so nothing complains at exit) and
    calls ``on_closed`` — the run is then stopped and still recorded in its session file."""

    def __init__(self) -> None:
        self.closed = False
        self.on_closed: Any = None

    def write(self, text: str) -> None:
        if self.closed:
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.closed = True
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            if self.on_closed is not None:
                self.on_closed()


# stream-json messages that carry a uuid in Claude Code's output
_UUID_TYPES = frozenset({"assistant", "user", "system", "result", "stream_event"})


def _setup_error_result(error: str, session_id: str | None) -> dict[str, Any]:
    """The result of a run that could not start (no model request made), as Claude Code prints it."""
    return {"type": "result", "subtype": "error_during_execution", "duration_ms": 0, "duration_api_ms": 0,
            "is_error": True, "num_turns": 0, "stop_reason": None, "session_id": session_id or str(uuid.uuid4()),
            "total_cost_usd": 0, "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0,
                                           "cache_read_input_tokens": 0, "output_tokens": 0},
            "modelUsage": {}, "permission_denials": [], "errors": [error]}


class Printer:
    """Writes the headless protocol to stdout in the chosen format: stream-json, one line per
    message (every message gets a ``uuid``; ``decorate`` fills in what only the CLI knows, such as
    the MCP servers of ``system/init``); json, the result alone, or with ``--verbose`` the array of
    every message at the end; text, the result's text."""

    def __init__(self, fmt: str, verbose: bool, out: Stdout | None = None, *, session_states: bool = False) -> None:
        self.fmt, self.verbose = fmt, verbose
        self.out = out or Stdout()
        self.decorate: Any = None
        self.rewrite: Any = None  # the Agent SDK's view of the messages (agentfsm.commandline.control.SdkAccounting)
        self.session_states = session_states
        self.collected: list[dict[str, Any]] = []

    def __call__(self, msg: dict[str, Any]) -> None:
        if msg.get("type") in _UUID_TYPES and "uuid" not in msg:
            msg = {**msg, "uuid": str(uuid.uuid4())}
        if self.decorate is not None:
            msg = self.decorate(msg)
        if self.rewrite is not None:
            msg = self.rewrite(msg)
            if msg is None:  # not part of the SDK's view
                return
        if msg.get("type") == "system" and msg.get("subtype") == "api_retry" and self.fmt != "stream-json":
            # text and json print only the result: a retry wait would be silent, so it is said on stderr
            delay = (msg.get("retry_delay_ms") or 0) / 1000
            status = msg.get("error_status")
            # no status: no HTTP answer came at all, and the record's category ("unknown") tells a user
            # nothing, so say what that means and what to check
            why = (f"{status}: {printable(str(msg.get('error') or ''))[:200]}" if status is not None else
                   "no answer: the connection failed or timed out; check the network and ANTHROPIC_BASE_URL")
            _say(f"the API request failed ({why}); retrying in "
                 f"{delay:.1f} s (attempt {msg.get('attempt')} of {msg.get('max_retries')}; Ctrl-C stops)")
        if self.fmt == "stream-json":
            init = msg.get("type") == "system" and msg.get("subtype") == "init"
            if init and self.session_states:
                self._state("running", msg.get("session_id"))
            self.out.write(json_line(msg) + "\n")
            if msg.get("type") == "result" and self.session_states:
                self._state("idle", msg.get("session_id"))
        elif self.fmt == "json" and self.verbose:
            self.collected.append(msg)
        elif msg.get("type") == "result":
            if self.fmt == "json":
                self.out.write(json_line(msg) + "\n")
            else:
                text = msg.get("result") if "result" in msg else "\n".join(msg.get("errors", []))
                self.out.write(printable(text or "") + "\n")

    def _state(self, state: str, session_id: Any) -> None:
        # what the SDK asks for with CLAUDE_CODE_SDK_READS_SESSION_STATE=1 (it swallows these frames)
        self.out.write(json.dumps({"type": "system", "subtype": "session_state_changed", "state": state,
                                   "sdk_host_only": True, "uuid": str(uuid.uuid4()),
                                   "session_id": session_id}) + "\n")

    def finish(self) -> None:
        """``--output-format json --verbose``: every message, as one JSON array."""
        if self.fmt == "json" and self.verbose and self.collected:
            self.out.write(json_line(self.collected) + "\n")


def _read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt of a text-input run (argument, else all of stdin). With ``--input-format
    stream-json`` stdin is read while the run goes on instead (:func:`_stdin_messages`), so this
    returns only the prompt argument, if any."""
    if args.prompt is not None:
        return args.prompt
    if args.input_format == "stream-json":
        if sys.stdin is None:
            raise UsageError("--input-format stream-json reads user messages from stdin, but there is none")
        return None
    if sys.stdin is None or sys.stdin.isatty():
        raise UsageError("no prompt: pass one as an argument or on stdin")
    import threading

    # a pipe that stays open (a script that forgot `< /dev/null`) would be a silent wait
    notice = threading.Timer(1.0, _say, ("reading the prompt from stdin until it is closed (pass the prompt as "
                                         "an argument instead; Ctrl-C stops)",))
    notice.daemon = True
    notice.start()
    try:
        # bytes that are not UTF-8 become lone surrogates (data, escaped wherever they are written)
        raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    finally:
        notice.cancel()
    data = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
    if not data.strip():
        raise UsageError("no prompt: stdin was empty")
    return data


async def _stdin_messages() -> AsyncIterator[Any]:
    """stream-json input: each stdin line as a JSON value, as soon as it arrives. A thread does the
    blocking reads (stdin may be a pipe, a file or a terminal); blank lines are skipped."""
    import threading

    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()

    def post(item: tuple[int, str] | None) -> None:
        try:
            loop.call_soon_threadsafe(lines.put_nowait, item)
        except RuntimeError:  # the loop is gone: the process is finishing anyway
            pass

    def read() -> None:
        try:
            source = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else sys.stdin
            for n, raw in enumerate(source, 1):
                # bytes that are not UTF-8 become lone surrogates: data, never the end of the input
                line = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
                if line.strip():
                    post((n, line))
        except (OSError, ValueError):
            pass  # stdin closed under us: that is the end of the input
        finally:
            post(None)

    threading.Thread(target=read, name="agentfsm-stdin", daemon=True).start()
    while (item := await lines.get()) is not None:
        n, line = item
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, too many digits, nested past the stack
            message = {"type": "invalid", "line": n}
        yield message


async def run_print(args: argparse.Namespace, *, exit_at_once: bool = False) -> int:
    import attrs

    from agentfsm.api import InputError, drive
    from agentfsm.common import log
    from agentfsm.machine.options import Options
    from agentfsm.sessions.resume import open_session, plan_session

    options: Options = options_from_args(args)
    try:
        plan_session(options)  # before anything slow: a bad --resume is a usage error at once
    except FileNotFoundError as exc:
        if args.output_format != "text":
            # Claude Code answers a resume it cannot find with an error result (the SDK raises it
            # as such, with the text), then exits 1 as for a usage error
            Printer(args.output_format, False)(_setup_error_result(str(exc), options.resume or options.session_id))
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    mcp_configs = _mcp_configs(args, options)
    prompt = _read_prompt(args)
    if args.temporal:
        # partial messages: the model call streams inside an activity, and its events are not relayed
        unsupported = (("--mcp-config", args.mcp_config), ("--permission-prompt-tool", args.permission_prompt_tool),
                       ("--include-partial-messages", args.include_partial_messages),
                       ("--task-budget", args.task_budget),
                       ("--thinking/--max-thinking-tokens", options.thinking))
        for flag, given in unsupported:
            if given:
                raise UsageError(f"{flag} is not supported with --temporal")
        return await _run_temporal(args, options, prompt, exit_at_once=exit_at_once)
    out = Stdout()
    printer = Printer(args.output_format, args.verbose, out, session_states=(
        args.input_format == "stream-json" and os.environ.get("CLAUDE_CODE_SDK_READS_SESSION_STATE") == "1"))
    channel = None
    pump: asyncio.Future[None] | None = None
    mcp = None
    session = None
    client = None
    try:
        if args.input_format == "stream-json":
            from agentfsm.commandline.control import ControlChannel, SdkAccounting

            printer.rewrite = SdkAccounting()
            channel = ControlChannel(printer, printer.rewrite)
            pump = asyncio.ensure_future(channel.pump(_stdin_messages()))
            if prompt is None and await channel.first() == "eof":
                return 0  # nothing asked: nothing to answer (the SDK closed stdin at once)
            options = channel.configure(options)
            if args.permission_prompt_tool == "stdio":
                options = attrs.evolve(options, can_use_tool=channel.can_use_tool)
        client = _model_client(args, options)
        if client is None:
            return 1
        if mcp_configs:
            from agentfsm.tools.mcp import McpServers

            mcp = McpServers(mcp_configs, sdk_send=channel.mcp_send if channel is not None else None,
                             cwd=options.cwd)
            await mcp.start()
            options = attrs.evolve(options, extra_tools=(*options.extra_tools, *mcp.tools()))
            printer.decorate = _with_mcp_status(mcp)
        try:
            session = open_session(options, client=client, emit=printer)
        except (ValueError, FileNotFoundError) as exc:
            raise UsageError(str(exc)) from None
        if session.file_problems:
            shown = "; ".join(str(p) for p in session.file_problems[:5])
            more = f" (and {len(session.file_problems) - 5} more)" if len(session.file_problems) > 5 else ""
            sys.stderr.write(printable(f"agentfsm: warning: the session file had {len(session.file_problems)} "
                                       f"unusable part(s), skipped: {shown}{more}\n"))
        if args.debug:
            log.configure("console", level="debug")
        elif session.trace_path is not None:
            log.configure("json", file=session.trace_path.with_suffix(".log"))
        out.on_closed = session.abort
        _stop_on_signals(session)
        if channel is not None:
            channel.session, channel.mcp = session, mcp
            channel.answer_initialize(options)
        try:
            results = await drive(session, channel.user_messages() if channel is not None else None, first=prompt)
        except InputError as exc:
            raise UsageError(f"stdin: {exc}") from None
    finally:
        if session is not None:
            await session.aclose(close_client=not exit_at_once)
        elif client is not None and hasattr(client, "aclose") and not exit_at_once:
            await client.aclose()
        if mcp is not None:
            await mcp.aclose()
        if channel is not None:
            await channel.aclose()
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    printer.finish()
    if not results:
        if args.input_format == "stream-json":
            return 0
        raise UsageError("stdin held no user message")
    # several runs (stream-json input) print several results; the exit status is the last one's
    code = 1 if results[-1].is_error else 0
    if exit_at_once:
        # The result is printed and the session file fsynced: nothing is left that the user needs.
        # Tearing down the event loop, idle connection pools and the interpreter's module graph
        # costs hundreds of milliseconds and changes nothing, so the process ends here.
        _exit_now(code)
    return code


def _mcp_configs(args: argparse.Namespace, options: Any) -> list[Any]:
    """The MCP servers of this run: ``--mcp-config`` ones, after those of ``~/.claude.json`` and
    ``.mcp.json`` unless ``--strict-mcp-config`` (each only when its setting source is used)."""
    if not args.mcp_config and args.strict_mcp_config:
        return []
    from agentfsm.tools.mcp import McpConfigError, parse_mcp_configs, settings_servers

    try:
        given = parse_mcp_configs(args.mcp_config, options.cwd)
    except McpConfigError as exc:
        raise UsageError(f"Invalid MCP configuration:\n{exc}") from None
    found = [] if args.strict_mcp_config else [
        c for c in settings_servers(options.cwd, Path.home())
        if (c.source == "user" and "user" in options.setting_sources)
        or (c.source == "project" and "project" in options.setting_sources)]
    names = {c.name for c in given}
    servers = [c for c in found if c.name not in names] + given
    if servers and _mcp_missing():
        listed = ", ".join(sorted({c.name for c in servers}))
        if given:
            raise UsageError(f"MCP servers are configured ({listed}) but the MCP client is not installed: "
                             "pip install 'agentfsm[mcp]'")
        # servers of the user's own settings files (~/.claude.json, .mcp.json): the run goes on without them
        sys.stderr.write(f"agentfsm: warning: the MCP servers of your settings ({listed}) are skipped: the MCP "
                         "client is not installed (pip install 'agentfsm[mcp]')\n")
        return []
    return servers


def _mcp_missing() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("mcp") is None
    except (ImportError, ValueError):
        return True


def _with_mcp_status(mcp: Any) -> Any:
    def decorate(msg: dict[str, Any]) -> dict[str, Any]:
        if msg.get("type") == "system" and msg.get("subtype") == "init":
            return {**msg, "mcp_servers": mcp.status()}
        return msg

    return decorate


def _model_client(args: argparse.Namespace, options: Any) -> Any:
    """The model: the scripted one (``--scripted``), else the Anthropic transport; None (after
    saying why) when there are no credentials. Both retry transient failures the same way."""
    if args.scripted:
        from agentfsm.testing.scenario import load_scenario, scenario_path
        from agentfsm.testing.scripted import ScriptedModel

        try:
            return ScriptedModel(load_scenario(scenario_path(args.scripted), ws=str(options.cwd)),
                                 max_retries=options.limits.api_max_retries)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--scripted: {exc}") from None
    from agentfsm.llm.transport import AnthropicTransport, MissingCredentials

    try:
        return AnthropicTransport(max_retries=options.limits.api_max_retries)
    except MissingCredentials as exc:
        sys.stderr.write(f"agentfsm: {exc}\n")
        return None


def _stop_on_signals(session: Any) -> None:
    loop = asyncio.get_running_loop()
    interrupts = [0]

    def on_sigint() -> None:
        # Ctrl-C in a terminal stops what is running now: the response being streamed and every
        # running tool (a long Bash command is killed, as the terminal's Ctrl-C would kill it), then
        # the run ends and is recorded. (The SDK's `interrupt` request, which lets `block` tools finish,
        # is a different path: agentfsm.control.) Pressed again, the process exits at once.
        interrupts[0] += 1
        if interrupts[0] == 1:
            _say("interrupted: stopping the model and any running tool; press Ctrl-C again to exit at once")
            # the process exits after this run: its background tasks are cut off first (Claude Code's -p
            # does the same: tests/fixtures/background/ctrl_c)
            session.abort(exiting=True)
            return
        _say("exiting now; the session file holds the run up to the interrupt")
        with contextlib.suppress(Exception):
            session.trace.flush()
        _exit_now(130)

    def on_sigterm() -> None:
        _say("terminated: stopping the run")
        session.abort(exiting=True)

    for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, on_sigterm)):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError):
            break


def _say(text: str) -> None:
    """A line for the user on stderr (stdout is the headless protocol's channel)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"agentfsm: {text}\n")
        sys.stderr.flush()


async def _run_temporal(args: argparse.Namespace, options: Any, prompt: str | None, *,
                        exit_at_once: bool = False) -> int:
    """The same run as a workflow on Temporal workers (agentfsm.temporal), printed the same way."""
    from agentfsm.sessions.resume import plan_session

    if prompt is None:
        raise UsageError("--input-format stream-json is not supported with --temporal; pass the prompt")
    scripted = None
    if args.scripted:
        from agentfsm.testing.scenario import load_scenario, scenario_path

        try:
            path = scenario_path(args.scripted)
            load_scenario(path, ws=str(options.cwd))  # a bad scenario is a usage error here, not on a worker
            scripted = path.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise UsageError(f"--scripted: {exc}") from None
    try:
        from agentfsm.temporal.commands import print_run
    except ImportError as exc:
        raise UsageError(f"--temporal needs the Temporal extra: pip install 'agentfsm[temporal]' ({exc})") from None
    code = await print_run(args.temporal, args.task_queue, options, plan_session(options), prompt,
                           Printer(args.output_format, args.verbose), scripted=scripted,
                           worker_timeout=args.worker_timeout)
    if exit_at_once:
        # The Temporal client's core runtime keeps native threads that call into Python; letting the
        # interpreter finalise under them can end in "Fatal Python error: PyGILState_Release"
        # (temporalio sdk-python#300; `agentfsm worker` ends the same way for the same reason). The
        # result is printed and the session lives on the workers: nothing is left to tear down.
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what could be said was said
            pass
    os._exit(code)


def entry() -> int:
    """The console script: :func:`main`, ending the process as soon as the run is over. What start-up
    imported is frozen out of garbage collection: modules and classes are never garbage, and
    scanning them again on every collection is the process's biggest GC cost."""
    import gc

    gc.freeze()
    return main(exit_at_once=True)


def main(argv: Sequence[str] | None = None, *, exit_at_once: bool = False) -> int:
    """The command line. ``exit_at_once``: end the process right after the result (the console
    script's choice; a caller that goes on — tests, an embedding program — keeps it off)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:], exit_at_once=exit_at_once)
    parser = build_parser()
    try:
        _refuse_misspelt_subcommand(argv)
        args = parser.parse_args(argv)
        if args.version:
            sys.stdout.write(f"{_version()} (agentfsm)\n")
            return 0
        if not args.print_mode and args.prompt is None and args.input_format != "stream-json" and (
                sys.stdin is not None and sys.stdin.isatty()):
            parser.print_help()
            return 0
        args.print_mode = True  # agentfsm has no interactive mode: every run is headless
        return asyncio.run(run_print(args, exit_at_once=exit_at_once))
    except UsageError as exc:
        sys.stderr.write(f"agentfsm: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


def _refuse_misspelt_subcommand(argv: Sequence[str]) -> None:
    """``agentfsm diagarm`` is a typo, not a prompt: a first word close to a subcommand (and
    nothing like a sentence) is refused rather than sent to the model."""
    import difflib

    word = argv[0] if argv else ""
    if not word or word.startswith("-") or not word.replace("-", "").isalpha():
        return
    close = difflib.get_close_matches(word.lower(), SUBCOMMANDS, n=1, cutoff=0.75)
    if close:
        raise UsageError(f"unknown command {word!r}; did you mean `agentfsm {close[0]}`? "
                         f"(to send it as a prompt: agentfsm -p {word!r})")


def _version() -> str:
    from agentfsm import __version__

    return __version__


def _subcommand(name: str, argv: list[str], *, exit_at_once: bool = False) -> int:
    if name == "demo":
        from agentfsm.commandline.demo import main as demo_main

        return demo_main(argv)
    if name == "serve-scripted":
        from agentfsm.testing.server import main as serve_main

        return serve_main(argv)
    if name == "conform":
        try:
            from agentfsm.commandline.conform import main as conform_main
        except ImportError as exc:
            sys.stderr.write(f"agentfsm conform: needs the testing extra: pip install 'agentfsm[testing]' ({exc})\n")
            return 2
        return conform_main(argv)
    if name == "diagram":
        from agentfsm.diagram import main as diagram_main

        return diagram_main(argv)
    if name in ("worker", "batch"):
        try:
            from agentfsm.temporal.commands import batch_main
            from agentfsm.temporal.worker import main as worker_main
        except ImportError as exc:
            sys.stderr.write(f"agentfsm {name}: needs the Temporal extra: pip install 'agentfsm[temporal]' ({exc})\n")
            return 2
        code = (worker_main if name == "worker" else batch_main)(argv)
        if exit_at_once:
            _exit_now(code)  # no interpreter finalisation under the Temporal core's threads (see _run_temporal)
        return code
    if any(a == "--html" or a.startswith("--html=") for a in argv):
        # the page (agentfsm.report) sits above the auditor and the diagrams; the auditor cannot import it
        from agentfsm.report import main as report_main

        return report_main(argv)
    from agentfsm.auditing.audit import main as audit_main

    return audit_main(argv)


if __name__ == "__main__":
    sys.exit(main())
