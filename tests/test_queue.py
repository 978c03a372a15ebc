"""The input queue: command lifecycle, absorption after a tool batch, follow-up runs, teardown."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits
from agentfsm.runtime.queue import TASK_NOTIFICATION, InputQueue
from agentfsm.runtime.trace import read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, tool


def lifecycle(messages: list[dict[str, Any]], uid: str | None = None) -> list[str]:
    return [m["state"] for m in messages if m.get("subtype") == "command_lifecycle"
            and (uid is None or m["uuid"] == uid)]


def texts(body: Mapping[str, Any]) -> str:
    out = []
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        for b in content:
            if b.get("type") == "text":
                out.append(b["text"])
            elif b.get("type") == "tool_result":
                c = b.get("content")
                out.append(c if isinstance(c, str) else str(c))
    return "\n".join(out)


class Gate:
    """A slow tool the test controls: it reports that it started and waits to be released."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        schema = {"type": "object", "properties": {}, "additionalProperties": False}

        @tool("Slow", "Waits until released.", schema)
        async def slow(input: Mapping[str, Any], ctx: ToolContext) -> str:
            self.started.set()
            await self.release.wait()
            return "SLOW_DONE"

        self.tool = slow


def options(tmp_path: Path, *extra: Any, **kw: Any) -> Options:
    return Options(tools=(), extra_tools=extra, permission_mode="bypassPermissions", cwd=tmp_path,
                   sessions_dir=tmp_path / "sessions", setting_sources=(), **kw)


SLOW_CALL = {"blocks": [{"type": "tool_use", "id": "toolu_slow", "name": "Slow", "input": {}}]}


# --- the queue alone ---------------------------------------------------------------------------


def test_lifecycle_states_and_messages() -> None:
    seen: list[dict[str, Any]] = []
    q = InputQueue(seen.append, "sid")
    a = q.submit("first", uuid="u-a")
    b = q.submit([{"type": "text", "text": "second"}])
    assert [i.uuid for i in q.pending] == ["u-a", b.uuid]
    messages = [item.as_attachment() for item in q.pending]
    assert [m.uuid for m in messages] == ["u-a", b.uuid]  # an attachment carries its item's uuid
    q.take_items(q.pending)
    assert [m.kind for m in messages] == ["attachment", "attachment"]
    assert "first" in messages[0].text() and "while you were working" in messages[0].text()
    assert q.pending == () and [i.state for i in q.in_flight] == ["started", "started"]
    q.settle(controlled=True)
    assert a.state == b.state == "completed" and q.in_flight == ()
    c = q.submit("third")
    q.take()
    q.settle(controlled=False)
    assert c.state == "cancelled"
    d = q.submit("fourth")
    q.discard()
    assert d.state == "discarded"
    assert lifecycle(seen, "u-a") == ["queued", "started", "completed"]
    assert lifecycle(seen, c.uuid) == ["queued", "started", "cancelled"]
    assert lifecycle(seen, d.uuid) == ["queued", "discarded"]
    assert all(m == {"type": "system", "subtype": "command_lifecycle", "uuid": m["uuid"], "state": m["state"],
                     "session_id": "sid"} for m in seen)


def test_cancel_a_queued_item_and_empty_input() -> None:
    q = InputQueue()
    item = q.submit("x")
    assert q.cancel(item.uuid) and item.state == "cancelled" and not q.cancel(item.uuid)
    assert q.pending == ()
    q.take_items([item])  # a cancelled item is no longer taken
    assert item.state == "cancelled" and q.in_flight == ()
    with pytest.raises(ValueError):
        q.submit([])


def test_task_notifications_are_attached_as_they_are() -> None:
    q = InputQueue()
    q.submit("<task-notification>done</task-notification>", kind="task_notification")
    (msg,) = (item.as_attachment() for item in q.pending)
    assert msg.kind == "task_notification" and msg.text() == "<task-notification>done</task-notification>"


def test_an_empty_queue_is_kept() -> None:
    assert bool(InputQueue())  # `queue or InputQueue()` must not replace an empty queue


async def test_wait_for_items() -> None:
    q = InputQueue()
    assert not await q.wait_for_items(lambda: False)
    waiting = asyncio.ensure_future(q.wait_for_items(lambda: True))
    await asyncio.sleep(0)
    assert not waiting.done()
    q.submit("now")
    assert await asyncio.wait_for(waiting, 1)


async def test_notifications_after_a_run_are_taken_only_without_user_input_beside_them() -> None:
    q = InputQueue()
    assert await q.notifications_after_run(lambda: False) == ()  # nothing runs, nothing queued
    waiting = asyncio.ensure_future(q.notifications_after_run(lambda: True))
    await asyncio.sleep(0)
    assert not waiting.done()  # background work may still report: waited for
    q.submit("<task-notification>done</task-notification>", kind=TASK_NOTIFICATION)
    assert [i.kind for i in await asyncio.wait_for(waiting, 1)] == [TASK_NOTIFICATION]
    q.submit("and a question")  # user input beside it: the session's next run takes both
    assert await q.notifications_after_run(lambda: True) == ()


# --- absorption in a session -------------------------------------------------------------------


async def test_input_during_a_slow_tool_is_absorbed_in_the_next_request(tmp_path: Path) -> None:
    gate = Gate()
    model = ScriptedModel([SLOW_CALL, {"blocks": [{"type": "text", "text": "DONE"}]}])
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path, gate.tool), client=model, emit=seen.append)
    run = asyncio.ensure_future(session.run("start"))
    await asyncio.wait_for(gate.started.wait(), 5)
    item = session.submit("EXTRA_INPUT_MARKER")
    assert item.state == "queued"
    gate.release.set()
    result = await asyncio.wait_for(run, 10)
    await session.aclose()
    assert result.subtype == "success" and result.result == "DONE"
    bodies = model.bodies
    assert len(bodies) == 2
    assert "EXTRA_INPUT_MARKER" not in texts(bodies[0])
    last_user = bodies[1]["messages"][-1]
    assert last_user["role"] == "user"
    kinds = [b["type"] for b in last_user["content"]]
    assert kinds[0] == "tool_result" and "text" in kinds  # one user message: results, then the input
    assert "EXTRA_INPUT_MARKER" in texts(bodies[1])
    assert lifecycle(seen, item.uuid) == ["queued", "started", "completed"]
    # the absorbed input is in the session file
    assert any("EXTRA_INPUT_MARKER" in str(r.get("content")) for r in read_records(session.trace_path)
               if r["type"] == "message")


async def test_input_after_the_last_absorb_point_gets_a_follow_up_run(tmp_path: Path) -> None:
    arrived = asyncio.Event()
    session_ref: list[Session] = []

    def respond(request: Any, n: int) -> dict[str, Any]:
        if n == 0:
            # the input arrives while the final answer streams: no tool batch is left to absorb it
            session_ref[0].submit("LATE_INPUT")
            arrived.set()
            return {"blocks": [{"type": "text", "text": "FIRST"}]}
        return {"blocks": [{"type": "text", "text": "SECOND"}]}

    model = ScriptedModel(respond)
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path), client=model, emit=seen.append)
    session_ref.append(session)
    result = await session.run("go")
    await session.aclose()
    assert arrived.is_set()
    assert result.result == "SECOND" and result.num_turns == 2
    assert len(model.bodies) == 2 and "LATE_INPUT" in texts(model.bodies[1])
    assert [m["type"] for m in seen].count("result") == 1  # one run, one result
    assert lifecycle(seen) == ["queued", "started", "completed"]


async def test_items_stay_queued_after_a_failed_run_and_are_discarded_at_teardown(tmp_path: Path) -> None:
    failing = {"status": 400, "error_type": "invalid_request_error", "message": "bad"}

    def respond(request: Any, n: int) -> dict[str, Any]:
        if n == 0:
            session_ref[0].submit("KEPT_FOR_NEXT_RUN")
            return failing
        if n == 1:
            return {"blocks": [{"type": "text", "text": "OK"}]}
        if n == 2:
            session_ref[0].submit("ARRIVES_LATE")
            return {"blocks": [{"type": "text", "text": "OK2"}]}
        return {"blocks": [{"type": "text", "text": "FOLLOW_UP"}]}

    session_ref: list[Session] = []
    seen: list[dict[str, Any]] = []
    model = ScriptedModel(respond)
    session = Session(options(tmp_path), client=model, emit=seen.append)
    session_ref.append(session)
    first = await session.run("one")
    assert first.is_error
    (kept,) = session.queue.pending
    assert kept.state == "queued"
    second = await session.run("two")  # absorbs the kept item at its first request
    assert second.result == "OK" and kept.state == "completed"
    assert "KEPT_FOR_NEXT_RUN" in texts(model.bodies[1])
    third = await session.run("three")  # ARRIVES_LATE comes during its last response -> follow-up
    assert third.result == "FOLLOW_UP" and "ARRIVES_LATE" in texts(model.bodies[3])
    session.queue.submit("LEFT_OVER")
    await session.aclose()
    assert lifecycle(seen)[-2:] == ["queued", "discarded"]


async def test_an_aborted_run_cancels_what_it_absorbed(tmp_path: Path) -> None:
    gate = Gate()
    model = ScriptedModel([SLOW_CALL, SLOW_CALL, {"blocks": [{"type": "text", "text": "x"}]}])
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path, gate.tool), client=model, emit=seen.append)
    run = asyncio.ensure_future(session.run("start"))
    await asyncio.wait_for(gate.started.wait(), 5)
    item = session.submit("ABSORBED_THEN_ABORTED")
    gate.release.set()
    # the second Slow call starts after the input was absorbed; interrupt it
    gate.started.clear()
    gate.release = asyncio.Event()
    await asyncio.wait_for(gate.started.wait(), 5)
    session.abort()
    result = await asyncio.wait_for(run, 10)
    await session.aclose()
    assert result.terminal_reason.value in ("aborted_tools", "aborted_streaming")
    assert lifecycle(seen, item.uuid) == ["queued", "started", "cancelled"]


async def test_an_interrupt_lets_a_block_tool_finish(tmp_path: Path) -> None:
    """Ctrl-C while a `block` tool runs: the tool finishes, its real result pairs its call, the run
    ends aborted_tools; a hard abort would have cancelled it."""
    gate = Gate()
    model = ScriptedModel([SLOW_CALL, {"blocks": [{"type": "text", "text": "never"}]}])
    session = Session(options(tmp_path, gate.tool), client=model)
    run = asyncio.ensure_future(session.run("start"))
    await asyncio.wait_for(gate.started.wait(), 5)
    await asyncio.sleep(0.05)  # the (instant) scripted stream ends: the loop waits in dispatch_tools
    session.interrupt()
    await asyncio.sleep(0.05)
    assert not run.done()  # still waiting for the block tool
    gate.release.set()
    result = await asyncio.wait_for(run, 10)
    await session.aclose()
    assert result.terminal_reason.value == "aborted_tools" and model.count == 1
    results = session.history[-2]
    assert results.tool_result_ids() == ["toolu_slow"] and not results.content[0].get("is_error")
    assert session.history[-1].text() == "[Request interrupted by user for tool use]"


async def test_no_absorption_into_a_batch_that_ends_the_run(tmp_path: Path) -> None:
    gate = Gate()
    model = ScriptedModel([SLOW_CALL])
    session = Session(options(tmp_path, gate.tool, limits=Limits(max_turns=1)), client=model)
    run = asyncio.ensure_future(session.run("start"))
    await asyncio.wait_for(gate.started.wait(), 5)
    item = session.submit("NOT_PAST_MAX_TURNS")
    gate.release.set()
    result = await asyncio.wait_for(run, 10)
    assert result.terminal_reason.value == "max_turns"
    assert item.state == "queued" and session.queue.pending == (item,)
    assert not any("NOT_PAST_MAX_TURNS" in m.text() for m in session.history)
    await session.aclose()
    assert item.state == "discarded"


async def test_a_second_concurrent_run_is_refused(tmp_path: Path) -> None:
    gate = Gate()
    session = Session(options(tmp_path, gate.tool), client=ScriptedModel([SLOW_CALL]))
    run = asyncio.ensure_future(session.run("start"))
    await asyncio.wait_for(gate.started.wait(), 5)
    with pytest.raises(RuntimeError, match="already in progress"):
        await session.run("again")
    gate.release.set()
    await asyncio.wait_for(run, 10)
    with pytest.raises(ValueError, match="nothing to run"):
        await session.run(None)
    await session.aclose()


# --- the CLI reads stream-json input while the run goes on -------------------------------------


@pytest.mark.server
def test_cli_stream_json_input_is_read_during_the_run(agentfsm_workspace: Path, tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from agentfsm.testing.server import ScriptedServer

    slow = {"blocks": [{"type": "tool_use", "id": "toolu_sleep", "name": "Bash",
                        "input": {"command": "sleep 1", "description": "wait"}}]}
    home = tmp_path / "home"
    with ScriptedServer([slow, {"blocks": [{"type": "text", "text": "SAW_BOTH"}]},
                         {"blocks": [{"type": "text", "text": "THIRD"}]}]) as server:
        env = {**os.environ, "ANTHROPIC_BASE_URL": server.base_url, "ANTHROPIC_API_KEY": "sk-test",
               "AGENTFSM_HOME": str(home), "HOME": str(home)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentfsm", "-p", "--input-format", "stream-json", "--output-format",
             "stream-json", "--verbose", "--tools", "Bash", "--permission-mode", "bypassPermissions"],
            cwd=agentfsm_workspace, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        lines: list[dict[str, Any]] = []

        def send(content: str, uid: str) -> None:
            msg = {"type": "user", "message": {"role": "user", "content": content}, "uuid": uid}
            proc.stdin.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]

        def read_until(pred: Any) -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(json.loads(line))
                if pred(lines[-1]):
                    return
            raise AssertionError(f"stdout ended early: {lines}")

        send("FIRST_PROMPT", "u-first")
        read_until(lambda m: m["type"] == "assistant" and m["message"]["content"][0]["type"] == "tool_use")
        send("DURING_THE_TOOL", "u-second")  # the Bash tool is sleeping now
        read_until(lambda m: m["type"] == "result")
        send("AFTER_THE_RESULT", "u-third")  # the session is idle: this starts another run
        rest, err = proc.communicate(timeout=60)  # closes stdin: the end of the input
        lines += [json.loads(line) for line in rest.splitlines() if line.strip()]
        bodies = server.requests
    assert proc.returncode == 0, err
    results = [m for m in lines if m["type"] == "result"]
    assert [r["result"] for r in results] == ["SAW_BOTH", "THIRD"]
    assert len(bodies) == 3
    second = json.dumps(bodies[1]["messages"][-1])
    assert "tool_result" in second and "DURING_THE_TOOL" in second  # absorbed after the batch
    assert "AFTER_THE_RESULT" in json.dumps(bodies[2]["messages"][-1])
    for uid in ("u-first", "u-second", "u-third"):
        assert lifecycle(lines, uid) == ["queued", "started", "completed"], uid
    assert len({m["session_id"] for m in lines if "session_id" in m}) == 1


def test_cli_stream_json_input_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    def run(stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentfsm", "-p", "--input-format", "stream-json", "--output-format",
             "stream-json", "--verbose", "--scripted",
             str(Path(__file__).parents[1] / "fsm" / "scenarios" / "read_probe.json")],
            input=stdin, capture_output=True, text=True, cwd=tmp_path, timeout=60,
            env={**__import__("os").environ, "AGENTFSM_HOME": str(tmp_path / "home")})

    bad = run('{"type": "assistant"}\n')
    assert bad.returncode == 1 and "stream-json user message" in bad.stderr
    # nothing asked, nothing answered: Claude Code exits 0 without a line of output
    empty = run("\n")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")


async def test_input_absorbed_into_a_request_counts_toward_its_blocking_limit(tmp_path: Path) -> None:
    """Input queued during a tool is part of the next request, so it is part of the estimate that
    decides whether the request may be sent at all: a paste that pushes the request past the blocking
    limit ends the run as "prompt too long" instead of being sent."""
    limits = Limits(context_window=20_000, blocking_buffer=3_000, auto_compact=False)
    for paste, sent in (("SHORT_PASTE", 2), ("BIG_PASTE " * 12_000, 1)):
        gate = Gate()
        model = ScriptedModel([SLOW_CALL, {"blocks": [{"type": "text", "text": "DONE"}]}])
        session = Session(options(tmp_path / str(sent), gate.tool, limits=limits), client=model)
        run = asyncio.ensure_future(session.run("start"))
        await asyncio.wait_for(gate.started.wait(), 5)
        session.submit(paste)
        gate.release.set()
        result = await asyncio.wait_for(run, 10)
        await session.aclose()
        assert len(model.bodies) == sent, paste[:20]
        if sent == 1:
            assert result.is_error and "Prompt is too long" in str(result.result), result
        else:
            assert result.result == "DONE"


async def test_post_tool_batch_hooks_run_for_a_finished_batch_and_not_for_an_interrupted_one(
        tmp_path: Path) -> None:
    """PostToolBatch reviews a batch the model will see in full; a batch the user interrupted ends the
    run instead, so the hook is not asked about it."""
    from agentfsm.hooks.runner import HookMatcher

    for interrupt in (False, True):
        seen: list[Any] = []

        async def post_batch(inp: Any, seen: list[Any] = seen) -> None:
            seen.append(inp)

        gate = Gate()
        model = ScriptedModel([SLOW_CALL, {"blocks": [{"type": "text", "text": "DONE"}]}])
        session = Session(options(tmp_path / str(interrupt), gate.tool,
                                  hooks={"PostToolBatch": [HookMatcher(hooks=[post_batch])]}), client=model)
        run = asyncio.ensure_future(session.run("start"))
        await asyncio.wait_for(gate.started.wait(), 5)
        if interrupt:
            await asyncio.sleep(0.05)  # the (instant) scripted stream ends: the loop waits in dispatch_tools
            session.interrupt()
            await asyncio.sleep(0.05)
        gate.release.set()
        result = await asyncio.wait_for(run, 10)
        await session.aclose()
        if interrupt:
            assert result.terminal_reason.value == "aborted_tools" and seen == []
        else:
            assert result.result == "DONE" and len(seen) == 1
