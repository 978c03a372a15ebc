"""``agentfsm demo``: a small task, end to end, with no API key.

A scripted Messages server on loopback plays the model: asked to fix a failing test, it reads
``prices.py``, fixes the bug with ``Edit``, runs the test with ``Bash`` and answers. The loop talks to it
through the real ``anthropic`` SDK, and the tools really run, in a temporary workspace. The demo prints
the conversation, the path the loop took through the graph, and where the run's session file is, with
the commands that check it (``agentfsm audit``) and draw it (``agentfsm diagram --trace``).

The session file goes to ``$AGENTFSM_HOME/demo`` (``~/.agentfsm/demo`` by default), or ``--trace-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from agentfsm.common.textsafe import printable

SCENARIO = "scenarios/fix_a_bug.json"

# the workspace the model works in: a function with a bug, and the test that shows it
FILES = {
    "prices.py": ('def discounted(price, percent):\n'
                  '    """The price after a discount of `percent` per cent."""\n'
                  '    return price + price * percent / 100\n'),
    "test_prices.py": ('from prices import discounted\n\n'
                       'got = discounted(80, 25)\n'
                       'assert got == 60, f"discounted(80, 25) should be 60, got {got}"\n'
                       'print("test_prices: ok, discounted(80, 25) == 60")\n'),
}

_LABEL = 11  # width of the speaker column
_SHOWN_LINES = 3  # lines of a tool result shown


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _speak(who: str, text: str, *, more: int = 0) -> None:
    """One turn of the conversation: the speaker, then ``text`` (several lines are indented under the
    first, so nothing a tool printed starts at column 0)."""
    lines = printable(text.expandtabs(4)).splitlines() or [""]
    pad = " " * (_LABEL + 4)
    shown = lines[:more] if more else lines
    _say(f"  {who:<{_LABEL}}▸ {shown[0]}")
    for line in shown[1:]:
        _say(pad + line)
    if more and len(lines) > more:
        rest = len(lines) - more
        _say(pad + f"… ({rest} more line{'s' if rest > 1 else ''})")


class Conversation:
    """Prints the headless messages of the run as a person reads them."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def _rel(self, path: Any) -> str:
        text = str(path)
        prefix = str(self.workspace) + os.sep
        return text[len(prefix):] if text.startswith(prefix) else text

    def _call(self, name: str, inp: Mapping[str, Any]) -> str:
        if name == "Bash":
            return f"Bash  $ {inp.get('command', '')}"
        if "file_path" in inp:
            return f"{name}  {self._rel(inp['file_path'])}"
        return f"{name}  {json.dumps(inp)}"

    def __call__(self, msg: dict[str, Any]) -> None:
        t = msg.get("type")
        if t == "assistant":
            for b in msg["message"]["content"]:
                if b.get("type") == "text":
                    _speak("assistant", b["text"])
                elif b.get("type") == "tool_use":
                    _speak("assistant", "calls " + self._call(b["name"], b.get("input") or {}))
        elif t == "user":
            for b in msg["message"]["content"]:
                if b.get("type") == "tool_result":
                    content = b.get("content")
                    if isinstance(content, list):
                        content = "\n".join(str(c.get("text", "")) for c in content if isinstance(c, Mapping))
                    # Read numbers every line, the empty one after the last newline too
                    text = re.sub(r"\n\s*\d+\s*\Z", "", str(content or "").rstrip())
                    who = "tool error" if b.get("is_error") else "tool"
                    _speak(who, text.replace(str(self.workspace) + os.sep, ""), more=_SHOWN_LINES)


def _path_by_turn(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The moves of the run, one line per turn: ``assemble → call_model → …``."""
    turns: list[list[str]] = [["assemble"]]
    for rec in records:
        if rec.get("type") != "transition":
            continue
        trigger, target = str(rec.get("trigger")), str(rec.get("to"))
        if trigger == "next_turn":
            turns[-1].append("(next_turn)")
            turns.append([target])
        elif trigger == "settle":
            continue
        else:
            turns[-1].append(target)
    return [" → ".join(t) for t in turns]


def default_trace_dir() -> Path:
    """Where the demo's session files go unless ``--trace-dir`` says otherwise."""
    home = os.environ.get("AGENTFSM_HOME")
    return (Path(home) if home else Path.home() / ".agentfsm") / "demo"


async def _run(workspace: Path, sessions: Path) -> int:
    from agentfsm.llm.transport import AnthropicTransport
    from agentfsm.machine.options import Options
    from agentfsm.runtime.trace import read_records
    from agentfsm.sessions.session import Session
    from agentfsm.testing.scenario import load_scenario
    from agentfsm.testing.server import ScriptedServer

    raw = json.loads(resources.files("agentfsm").joinpath(SCENARIO).read_text())
    scenario = load_scenario(raw, ws=str(workspace))
    server = ScriptedServer(scenario)
    url = await server.start_async()
    try:
        _say("agentfsm demo: a scripted model fixes a bug, through the real loop, tools and anthropic SDK")
        _say(f"  workspace  {workspace}  ({', '.join(FILES)})")
        _say(f"  model      scripted Messages server at {url} (no API key needed)")
        _say()
        _speak("user", scenario.prompt)
        options = Options(tools=("Read", "Edit", "Bash"), permission_mode="bypassPermissions", cwd=workspace,
                          sessions_dir=sessions)
        client = AnthropicTransport(api_key="sk-demo", base_url=url, max_retries=0)
        session = Session(options, client=client, emit=Conversation(workspace))
        try:
            result = await session.run(scenario.prompt)
        finally:
            await session.aclose()
    finally:
        await server.stop_async()
    trace = session.trace_path
    assert trace is not None
    _say()
    _say("the path through the graph, one line per turn:")
    for n, line in enumerate(_path_by_turn(list(read_records(trace))), 1):
        _say(f"  turn {n}: {line}")
    _say()
    outcome = "an error" if result.is_error else "success"
    _say(f"result: {outcome} ({result.terminal_reason.value}) after {result.num_turns} turns and "
         f"{len(server.requests)} model requests")
    _say()
    _say(f"the session file: {trace}")
    _say(f"  check the run against the graph:  agentfsm audit {trace}")
    _say(f"  draw the run over the graph:      agentfsm diagram --trace {trace} --output run.svg")
    _say("                                    (SVG/PNG need pip install 'agentfsm[diagrams]'; run.md gives Mermaid)")
    _say(f"  see it all in a browser:          agentfsm audit --html run.html {trace}")
    _say("                                    (needs pip install 'agentfsm[report]')")
    return 1 if result.is_error else 0


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="agentfsm demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace-dir", metavar="DIR", type=Path, default=None,
                        help=f"where the session file goes (default: {default_trace_dir()})")
    parser.add_argument("--keep", metavar="DIR", help="keep the workspace (and, without --trace-dir, the "
                                                      "session file) in DIR")
    args = parser.parse_args(list(argv))
    with tempfile.TemporaryDirectory(prefix="agentfsm-demo-") as tmp:
        base = Path(args.keep).resolve() if args.keep else Path(tmp)
        workspace = base / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        for name, text in FILES.items():
            (workspace / name).write_text(text)
        if args.trace_dir is not None:
            sessions = args.trace_dir.resolve()
        else:
            sessions = (base / "sessions") if args.keep else default_trace_dir()
        try:
            sessions.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            sys.stderr.write(f"agentfsm demo: cannot keep the session file in {sessions}: {exc.strerror or exc}; "
                             "give another folder with --trace-dir DIR\n")
            return 1
        return asyncio.run(_run(workspace, sessions))
