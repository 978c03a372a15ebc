"""``agentfsm``: Claude Code's headless command line, plus subcommands for the other jobs.

``agentfsm -p PROMPT [flags]`` runs the loop; ``demo``, ``serve-scripted``, ``diagram`` and ``audit``
are subcommands. Only what the ``-p`` path needs is imported on it (no diagram code, no hypothesis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from agentfsm.textsafe import json_line, printable

SUBCOMMANDS = ("demo", "serve-scripted", "diagram", "audit")


class UsageError(Exception):
    """A command line that cannot run; exit status 2."""


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentfsm",
        description="Claude Code's agent loop as an explicit finite-state machine. "
                    f"Subcommands: {', '.join(SUBCOMMANDS)} (run `agentfsm SUBCOMMAND --help`).")
    p.add_argument("prompt", nargs="?", help="the prompt (read from stdin when absent)")
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
    return p


def options_from_args(args: argparse.Namespace) -> Any:
    from agentfsm.options import DEFAULT_MODEL, Options
    from agentfsm.state import Limits

    if args.output_format == "stream-json" and not args.verbose:
        raise UsageError("When using --print, --output-format=stream-json requires --verbose")
    if args.max_turns is not None and not args.print_mode:
        raise UsageError("--max-turns works only with --print")
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
    sources = (tuple(_split_list([args.setting_sources])) if args.setting_sources
               else ("user", "project", "local"))
    try:
        return Options(
            model=args.model or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL,
            fallback_models=_split_list([args.fallback_model]) if args.fallback_model else (),
            tools=_split_list(args.tools) if args.tools is not None else None,
            allowed_tools=_split_list(args.allowed_tools),
            disallowed_tools=_split_list(args.disallowed_tools),
            permission_mode=mode, limits=limits, system_prompt=args.system_prompt,
            append_system_prompt=args.append_system_prompt,
            cwd=Path(args.cwd) if args.cwd else Path.cwd(), settings=args.settings,
            setting_sources=sources, session_id=args.session_id, resume=args.resume,
            continue_session=args.continue_session, fork_session=args.fork_session,
            sessions_dir=Path(args.sessions_dir) if args.sessions_dir else None, json_schema=schema)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


class Printer:
    """Writes the headless protocol to stdout in the chosen format."""

    def __init__(self, fmt: str, verbose: bool) -> None:
        self.fmt, self.verbose = fmt, verbose

    def __call__(self, msg: dict[str, Any]) -> None:
        if self.fmt == "stream-json":
            sys.stdout.write(json_line(msg) + "\n")
            sys.stdout.flush()
        elif msg.get("type") == "result":
            if self.fmt == "json":
                sys.stdout.write(json_line(msg) + "\n")
            else:
                text = msg.get("result") if "result" in msg else "\n".join(msg.get("errors", []))
                sys.stdout.write(printable(text or "") + "\n")
            sys.stdout.flush()


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
    # bytes that are not UTF-8 become lone surrogates (data, escaped wherever they are written)
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
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
            yield json.loads(line)
        except json.JSONDecodeError:
            yield {"type": "invalid", "line": n}


async def run_print(args: argparse.Namespace) -> int:
    from agentfsm import log
    from agentfsm.api import InputError, drive
    from agentfsm.options import Options
    from agentfsm.resume import open_session, plan_session

    options: Options = options_from_args(args)
    try:
        plan_session(options)  # before anything slow: a bad --resume is a usage error at once
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None
    prompt = _read_prompt(args)
    client = None
    if args.scripted:
        from agentfsm.testing.scenario import load_scenario, scenario_path
        from agentfsm.testing.scripted import ScriptedModel

        try:
            client = ScriptedModel(load_scenario(scenario_path(args.scripted), ws=str(options.cwd)))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--scripted: {exc}") from None
    else:
        from agentfsm.transport import AnthropicTransport, MissingCredentials

        try:
            client = AnthropicTransport(max_retries=options.limits.api_max_retries)
        except MissingCredentials as exc:
            sys.stderr.write(f"agentfsm: {exc}\n")
            return 1
    printer = Printer(args.output_format, args.verbose)
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
    loop = asyncio.get_running_loop()
    interrupts = [0]

    def on_sigint() -> None:
        # Ctrl-C is the user's interrupt (block tools finish); pressed again, it stops everything
        interrupts[0] += 1
        (session.interrupt if interrupts[0] == 1 else session.abort)()

    for sig, handler in ((signal.SIGINT, on_sigint), (signal.SIGTERM, session.abort)):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError):
            break
    inputs = _stdin_messages() if args.input_format == "stream-json" else None
    try:
        results = await drive(session, inputs, first=prompt)
    except InputError as exc:
        raise UsageError(f"stdin: {exc}") from None
    finally:
        await session.aclose()
    if not results:
        raise UsageError("stdin held no user message")
    # several runs (stream-json input) print several results; the exit status is the last one's
    return 1 if results[-1].is_error else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.print_mode and args.prompt is None and sys.stdin is not None and sys.stdin.isatty():
        parser.print_help()
        return 0
    args.print_mode = True  # agentfsm has no interactive mode: every run is headless
    try:
        return asyncio.run(run_print(args))
    except UsageError as exc:
        sys.stderr.write(f"agentfsm: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "demo":
        from agentfsm.demo import main as demo_main

        return demo_main(argv)
    if name == "serve-scripted":
        from agentfsm.testing.server import main as serve_main

        return serve_main(argv)
    if name == "diagram":
        from agentfsm.diagram import main as diagram_main

        return diagram_main(argv)
    from agentfsm.audit import main as audit_main

    return audit_main(argv)


if __name__ == "__main__":
    sys.exit(main())
