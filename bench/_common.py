"""Shared pieces of the benchmarks: the scripted conversation, the custom tool, the bare loop of
the 30-line teaching loop, the machine description and small statistics helpers.

Every bench measures its baseline in the same process and the same run as the engine, so a ratio
compares like with like even on a busy machine (CPU time is reported next to wall time because
other processes on the box inflate wall time but not our own CPU seconds).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# `python bench/X.py` from a checkout: make the repo importable even without `pip install -e .`
_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from agentfsm.llm.model import BlockDelta, BlockStart, BlockStop, MessageDelta, ModelRequest  # noqa: E402
from agentfsm.machine.options import Options  # noqa: E402
from agentfsm.runtime.request import system_blocks  # noqa: E402
from agentfsm.runtime.result import RunResult  # noqa: E402
from agentfsm.sessions.session import Session  # noqa: E402
from agentfsm.testing.scenario import Scenario, StreamedResponse, TextBlock, ToolUseBlock  # noqa: E402
from agentfsm.testing.scripted import ScriptedModel  # noqa: E402
from agentfsm.tools.base import Tool, ToolContext, tool  # noqa: E402

ROOT = _ROOT
MODEL = "claude-sonnet-4-5"
ECHO_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def echo_tool(name: str = "Echo", delay_s: float = 0.0) -> Tool:
    """A concurrency-safe custom tool that answers its input after ``delay_s`` (0 = no await at
    all, so the bench measures the loop and not the event loop's timer)."""

    @tool(name, "Echo the text back (after a fixed delay).", ECHO_SCHEMA, concurrency_safe=True)
    async def _echo(input: Mapping[str, Any], ctx: ToolContext) -> str:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        return str(input["text"])

    return _echo


def tool_turns(k: int, tool_name: str = "Echo") -> Scenario:
    """``k`` responses with one tool_use each, then a final text answer. A :class:`Scenario` record
    (not a list) so that a ScriptedModel built from it skips parsing and validating the script:
    both loops then pay only for serving the responses, not for loading them."""
    calls = [
        StreamedResponse(blocks=(ToolUseBlock(f"toolu_{i:04d}", tool_name, {"text": f"turn {i}"}),),
                         stop_reason="tool_use")
        for i in range(k)
    ]
    return Scenario(prompt="go", responses=(*calls, StreamedResponse(blocks=(TextBlock("done"),))))


def workspace() -> Path:
    """A throw-away working directory (no settings files, no git repo: nothing the engine reads
    from there varies between runs)."""
    return Path(tempfile.mkdtemp(prefix="agentfsm-bench-"))


def engine_options(cwd: Path, tools: Sequence[Tool], *, write_trace: bool = False,
                   sessions_dir: Path | None = None) -> Options:
    """Options offering exactly ``tools`` (no built-ins, so the request carries the same tools list as
    the bare loop's), no settings files read, traces as asked."""
    return Options(model=MODEL, tools=(), extra_tools=tuple(tools), cwd=cwd, setting_sources=(),
                   write_trace=write_trace, sessions_dir=sessions_dir)


async def run_engine(script: Scenario, options: Options, prompt: str = "go") -> RunResult:
    """One whole conversation through the real Session/Driver."""
    session = Session(options, client=ScriptedModel(script))
    try:
        return await session.run(prompt)
    finally:
        await session.aclose()


async def bare_loop(client: ScriptedModel, prompt: str, tools: Mapping[str, Tool],
                    system: tuple[Mapping[str, Any], ...], ctx: ToolContext) -> list[dict[str, Any]]:
    """Seed 001's loop (append the answer, stop unless ``stop_reason == "tool_use"``, run each
    tool_use, send the results back), written against the same in-process model and tools. The
    model only streams, so the response is folded from its events first."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    schemas = tuple(t.api_schema() for t in tools.values())
    while True:
        request = ModelRequest(model=MODEL, system=system, messages=tuple(messages), tools=schemas,
                               max_tokens=32000)
        content: list[dict[str, Any]] = []
        parts: dict[int, list[str]] = {}
        stop_reason = None
        async for ev in client.stream(request):
            if isinstance(ev, BlockStart):
                content.append(dict(ev.block))
                parts[ev.index] = []
            elif isinstance(ev, BlockDelta):
                if ev.delta["type"] == "text_delta":
                    content[ev.index]["text"] += ev.delta["text"]
                elif ev.delta["type"] == "input_json_delta":
                    parts[ev.index].append(ev.delta["partial_json"])
            elif isinstance(ev, BlockStop) and content[ev.index]["type"] == "tool_use":
                content[ev.index]["input"] = json.loads("".join(parts[ev.index]) or "{}")
            elif isinstance(ev, MessageDelta):
                stop_reason = ev.stop_reason
        messages.append({"role": "assistant", "content": content})
        if stop_reason != "tool_use":
            return content
        results = []
        for block in content:
            if block["type"] == "tool_use":
                out = await tools[block["name"]].call(block["input"], ctx)
                results.append({"type": "tool_result", "tool_use_id": block["id"], "content": out.data})
        messages.append({"role": "user", "content": results})


def bare_system(cwd: Path) -> tuple[Mapping[str, Any], ...]:
    """The engine's system blocks, so both loops send requests of the same size to the model."""
    return system_blocks(cwd, system_prompt=None, append=None)


def machine() -> str:
    """``nproc``, CPU model and Python: printed by every bench so a result names its machine."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load n/a"
    return (f"{os.cpu_count()} CPU(s), {model}, Python {platform.python_version()} "
            f"({platform.python_implementation()}), {load}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"
