"""When the session file's records reach the file: inside an event loop, before the loop runs
anything else (one write for what a task wrote until it next waits); before a hook starts, whatever
kind; the result at once; outside an event loop at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agentfsm.hooks import HookMatcher
from agentfsm.machine.options import Options
from agentfsm.runtime.trace import TraceWriter, read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel


def _types(path: Path) -> list[str]:
    return [r["type"] for r in read_records(path)]


def test_outside_an_event_loop_a_record_is_in_the_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    writer = TraceWriter(path)
    writer.write({"type": "note", "x": 1})
    assert _types(path) == ["note"]
    writer.close()


async def test_inside_an_event_loop_records_are_in_the_file_before_anything_else_runs(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    writer = TraceWriter(path)
    seen: list[list[str]] = []

    async def other() -> None:
        seen.append(_types(path))

    writer.write({"type": "a"})
    task = asyncio.ensure_future(other())  # scheduled after the records were written
    writer.write({"type": "b"})
    writer.write({"type": "c"}, flush=False)
    await task
    assert seen == [["a", "b", "c"]]
    writer.result({"subtype": "success"})
    assert _types(path)[-1] == "result"  # at once, before this task waits
    writer.close()


def _read_transcript(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


async def test_hooks_read_what_the_loop_wrote_before_them(tmp_path: Path) -> None:
    """A hook may read its transcript_path: each sees the records of the moves before it (the
    runner starts hooks in tasks of their own, after the scheduled flush; the loop also flushes
    before it calls the hooks of an event that has any)."""
    seen: dict[str, list[dict[str, Any]]] = {}

    def remember(name: str) -> Any:
        def hook(record: Any) -> None:
            seen[name] = _read_transcript(record.transcript_path)
        return hook

    hooks = {event: [HookMatcher(hooks=(remember(event),))]
             for event in ("UserPromptSubmit", "PreToolUse", "PostToolBatch", "Stop", "SessionEnd")}
    script = [{"blocks": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                           "input": {"file_path": str(tmp_path / "a.txt")}}], "stop_reason": "tool_use"},
              {"blocks": [{"type": "text", "text": "THE_ANSWER"}], "stop_reason": "end_turn"}]
    (tmp_path / "a.txt").write_text("x")
    options = Options(tools=("Read",), cwd=tmp_path, setting_sources=(), write_trace=True,
                      sessions_dir=tmp_path / "sessions", hooks=hooks, permission_mode="bypassPermissions")
    async with Session(options, client=ScriptedModel(script)) as session:
        result = await session.run("go")
    assert not result.is_error
    assert [r["type"] for r in seen["UserPromptSubmit"]] == ["session"]
    # the tool's own block is in the file before its PreToolUse hook
    assert any(r["type"] == "assistant_block" and r["block"].get("id") == "toolu_1" for r in seen["PreToolUse"])
    batch = seen["PostToolBatch"]
    assert batch[-1]["type"] == "transition" and batch[-1]["to"] == "dispatch_tools"
    stop = seen["Stop"]
    assert any(r["type"] == "message" and r["role"] == "assistant" and "THE_ANSWER" in json.dumps(r["content"])
               for r in stop)
    assert seen["SessionEnd"][-1]["type"] == "result"


class _Says:
    """Hooks that say which events have any configured."""

    def __init__(self, *events: str) -> None:
        self.events = events

    def has_hooks(self, event: str) -> bool:
        return event in self.events


async def test_before_hooks_flushes_unless_the_hooks_say_none_is_configured(tmp_path: Path) -> None:
    """The one flush before a hook (the driver's loop hooks and the session's own use it): skipped
    only when the hooks say the event has none; hooks that cannot say get it."""
    path = tmp_path / "s.jsonl"
    writer = TraceWriter(path)
    writer.write({"type": "a"})  # inside an event loop: flushed when the loop next runs something
    writer.before_hooks(_Says("Stop"), "PreCompact")
    assert _types(path) == []
    writer.before_hooks(_Says("Stop"), "Stop")
    assert _types(path) == ["a"]
    writer.write({"type": "b"})
    writer.before_hooks(object(), "Stop")
    assert _types(path) == ["a", "b"]
    writer.close()
