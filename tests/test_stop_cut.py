"""A stop cuts the driver's wait in the driver's own task (no task per wait): the cancellation it
makes is taken back once the work unwound, and a cancellation from outside still goes on as one. A
user's interrupt mid-stream still lets the block tools the response started finish."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentfsm.machine.options import Options
from agentfsm.machine.state import Phase, TerminalReason
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, ToolOutput, tool

SLOW = {"blocks": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}],
        "stop_reason": "end_turn", "block_delay_s": 5}


def _session(tmp_path: Path, script: list[dict[str, Any]], **kw: Any) -> Session:
    options = Options(tools=(), cwd=tmp_path, setting_sources=(), write_trace=False)
    return Session(options, client=ScriptedModel(script), **kw)


async def _streaming_run(tmp_path: Path) -> tuple[Any, asyncio.Task[Any]]:
    """A session run of a slow answer, once its first block has been shown."""
    session = _session(tmp_path, [SLOW])
    started = asyncio.Event()
    session.emit = lambda msg: started.set() if msg.get("type") == "assistant" else None
    task = asyncio.ensure_future(session.run("go"))
    await asyncio.wait_for(started.wait(), 20)
    return session, task


async def test_interrupt_mid_stream_leaves_the_callers_task_uncancelled(tmp_path: Path) -> None:
    shown: list[dict[str, Any]] = []
    session: Session

    def emit(msg: dict[str, Any]) -> None:
        shown.append(msg)
        if msg.get("type") == "assistant":
            session.interrupt()

    session = _session(tmp_path, [SLOW], emit=emit)
    async with session:
        result = await session.run("go")  # in this task (wait_for would run it in a task of its own)
    assert result.terminal_reason is TerminalReason.ABORTED_STREAMING
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await asyncio.sleep(0)  # the task goes on: no cancellation is left pending on it


async def test_a_cancel_from_outside_mid_stream_is_not_swallowed(tmp_path: Path) -> None:
    session, task = await _streaming_run(tmp_path)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await session.aclose()


async def test_an_outside_cancel_racing_an_interrupt_still_cancels(tmp_path: Path) -> None:
    session, task = await _streaming_run(tmp_path)
    session.interrupt()  # its cut is scheduled, then the outside cancel comes too
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await session.aclose()


async def test_a_timeout_around_a_run_still_times_out(tmp_path: Path) -> None:
    session = _session(tmp_path, [SLOW])
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await session.run("go")
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    await session.aclose()


async def test_an_interrupt_mid_stream_lets_a_started_block_tool_finish(tmp_path: Path) -> None:
    """Ctrl-C while the response still streams, after it started a ``block`` tool: the tool finishes
    and its real result pairs its call (RunSignals.finish_block_tools); only a hard abort cuts it."""
    started, finished = asyncio.Event(), []

    @tool("Hold", "Holds on a moment.", {"type": "object", "properties": {}}, interrupt="block")
    async def hold(_input: Any, _ctx: ToolContext) -> ToolOutput:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(True)
        return ToolOutput("held to the end")

    script = [{"blocks": [{"type": "tool_use", "id": "toolu_h", "name": "Hold", "input": {}},
                          {"type": "text", "text": "never shown"}], "stop_reason": "tool_use", "block_delay_s": 5}]
    options = Options(tools=(), extra_tools=(hold,), cwd=tmp_path, setting_sources=(), write_trace=False,
                      permission_mode="bypassPermissions")
    session = Session(options, client=ScriptedModel(script))
    async with session:
        run = asyncio.ensure_future(session.run("go"))
        await asyncio.wait_for(started.wait(), 20)
        session.interrupt()
        result = await asyncio.wait_for(run, 20)
    assert result.terminal_reason is TerminalReason.ABORTED_STREAMING
    assert finished == [True]
    results = [b for m in session.history for b in m.content if b.get("type") == "tool_result"]
    assert [r["tool_use_id"] for r in results] == ["toolu_h"]
    assert "held to the end" in str(results[0]["content"])


async def test_a_timeout_while_the_ended_run_waits_for_its_background_work_still_times_out(
        tmp_path: Path) -> None:
    """The run has ended (completed) and waits for a background command to report: a cancel then is
    the caller's and goes through as a timeout; the ended run is not turned into an abort."""
    background = {"blocks": [{"type": "tool_use", "id": "toolu_bg", "name": "Bash",
                              "input": {"command": "sleep 30", "run_in_background": True}}], "stop_reason": "tool_use"}
    answer = {"blocks": [{"type": "text", "text": "started it"}], "stop_reason": "end_turn"}
    options = Options(tools=("Bash",), cwd=tmp_path, setting_sources=(), permission_mode="bypassPermissions",
                      sessions_dir=tmp_path / "sessions")
    shown: list[dict[str, Any]] = []
    session = Session(options, client=ScriptedModel([background, answer]), emit=shown.append)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(3):
            await session.run("go")
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    texts = [b.get("text") for m in shown if m.get("type") == "assistant" for b in m["message"]["content"]]
    assert "started it" in texts  # the run had ended before the timeout
    await session.aclose()


class _InterruptAsTheAnswerEnds:
    """Interrupts the session at the move that ends the turn: the user's interrupt landing after the
    answer is complete, before its Stop hooks (where the Temporal runtime's ``between`` lets one in)."""

    def __init__(self) -> None:
        self.session: Session | None = None

    def on_step(self, before: Any, step: Any, event: Any) -> None:
        if step.state.phase is Phase.STOP and step.state.stop_hooks_due and self.session is not None:
            self.session.interrupt()


async def test_an_interrupt_after_the_answer_ended_lets_the_end_stand(tmp_path: Path) -> None:
    observer = _InterruptAsTheAnswerEnds()
    shown: list[dict[str, Any]] = []
    options = Options(tools=(), cwd=tmp_path, setting_sources=(), write_trace=False)
    session = Session(options, client=ScriptedModel([{"blocks": [{"type": "text", "text": "done"}],
                                                      "stop_reason": "end_turn"}]),
                      emit=shown.append, observers=(observer,))
    observer.session = session
    async with session:
        result = await session.run("go")
    assert (result.terminal_reason, result.is_error, result.result) == (TerminalReason.COMPLETED, False, "done")
    assert [m["type"] for m in shown] == ["system", "assistant", "result"]
