"""The phases' own rules, end to end through a :class:`Session` on the scripted model: what a batch
reports (its results paired with the calls in call order whatever order they finished in, a hook's
context after the results, the structured output of the call that passed), and what Stop hooks are
shown. Each is checked on what the model is sent, the result and the session file."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_recovery import SCHEMA, structured

from agentfsm.hooks.runner import HookMatcher, HookOutput
from agentfsm.machine.options import Options
from agentfsm.machine.state import TerminalReason
from agentfsm.sessions.resume import load_history
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, ToolOutput, tool

DONE = {"blocks": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}
SCHEMA_NONE: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def options(tmp_path: Path, **kw: Any) -> Options:
    kw.setdefault("tools", ())
    return Options(permission_mode="bypassPermissions", cwd=tmp_path, sessions_dir=tmp_path / "sessions",
                   setting_sources=(), **kw)


async def run(tmp_path: Path, responses: list[Any], **kw: Any) -> tuple[Any, ScriptedModel, Session]:
    model = ScriptedModel(responses)
    session = Session(options(tmp_path, **kw), client=model)
    try:
        result = await asyncio.wait_for(session.run("go"), 60)
    finally:
        await session.aclose()
    return result, model, session


def calls(*ids_names: tuple[str, str]) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": i, "name": n, "input": {}} for i, n in ids_names],
            "stop_reason": "tool_use"}


async def test_results_are_paired_in_call_order_when_a_later_call_finishes_first(tmp_path: Path) -> None:
    second_done = asyncio.Event()

    @tool("First", "Finishes after Second.", SCHEMA_NONE, concurrency_safe=True)
    async def first(input: Any, ctx: ToolContext) -> str:
        await asyncio.wait_for(second_done.wait(), 30)
        return "FIRST_RESULT"

    @tool("Second", "Finishes at once.", SCHEMA_NONE, concurrency_safe=True)
    async def second(input: Any, ctx: ToolContext) -> str:
        second_done.set()
        return "SECOND_RESULT"

    result, model, session = await run(tmp_path, [calls(("t1", "First"), ("t2", "Second")), DONE],
                                       extra_tools=(first, second))
    assert result.terminal_reason is TerminalReason.COMPLETED
    sent = model.bodies[1]["messages"][-1]["content"]
    assert [(b["tool_use_id"], b["content"]) for b in sent] == [("t1", "FIRST_RESULT"), ("t2", "SECOND_RESULT")]
    recorded = load_history(session.trace_path)[2]
    assert [b["tool_use_id"] for b in recorded.content] == ["t1", "t2"]


async def test_a_pre_tool_use_hooks_context_follows_the_results_in_the_batch_message(tmp_path: Path) -> None:
    @tool("Probe", "Answers.", SCHEMA_NONE)
    async def probe(input: Any, ctx: ToolContext) -> str:
        return "PROBED"

    hooks = {"PreToolUse": [HookMatcher(hooks=[lambda _r: HookOutput.context("HOOK_CONTEXT")])]}
    result, model, session = await run(tmp_path, [calls(("p1", "Probe")), DONE], extra_tools=(probe,), hooks=hooks)
    assert result.terminal_reason is TerminalReason.COMPLETED
    for content in (model.bodies[1]["messages"][-1]["content"], load_history(session.trace_path)[2].content):
        assert [b["type"] for b in content] == ["tool_result", "text"]
        assert content[0]["content"] == "PROBED" and "HOOK_CONTEXT" in content[1]["text"]


async def test_the_structured_output_is_the_call_that_passed_not_a_failed_one_after_it(tmp_path: Path) -> None:
    good = structured("s_good", {"city": "Paris", "population": 2})
    bad = structured("s_bad", {"city": "Paris"})  # population missing: fails the schema
    both = {"blocks": [*good["blocks"], *bad["blocks"]], "stop_reason": "tool_use"}
    result, _, _ = await run(tmp_path, [both, DONE], json_schema=SCHEMA)
    assert result.terminal_reason is TerminalReason.COMPLETED
    assert result.structured_output == {"city": "Paris", "population": 2}


async def test_stop_hooks_are_shown_the_last_assistant_text(tmp_path: Path) -> None:
    shown: list[str] = []

    def on_stop(record: Any) -> None:
        shown.append(record.last_assistant_message)

    @tool("Probe", "Answers.", SCHEMA_NONE)
    async def probe(input: Any, ctx: ToolContext) -> str:
        return "PROBED"

    first = {"blocks": [{"type": "text", "text": "EARLIER_TEXT"},
                        {"type": "tool_use", "id": "p1", "name": "Probe", "input": {}}], "stop_reason": "tool_use"}
    last = {"blocks": [{"type": "text", "text": "FINAL_TEXT"}], "stop_reason": "end_turn"}
    result, _, _ = await run(tmp_path, [first, last], extra_tools=(probe,),
                             hooks={"Stop": [HookMatcher(hooks=[on_stop])]})
    assert result.result == "FINAL_TEXT" and shown == ["FINAL_TEXT"]


# --- what the driver shows when a stream is cut --------------------------------------------------------------


async def test_a_call_of_a_retried_response_shows_its_result_again_after_the_tombstone(tmp_path: Path) -> None:
    # the stream breaks after a call whose tool finished (its result was shown); the response is asked
    # for again with the same call id, and that call's result is shown again after the withdrawal
    @tool("Probe", "Answers at once.", SCHEMA_NONE, concurrency_safe=True)
    async def probe(input: Any, ctx: ToolContext) -> str:
        return "PROBED"

    call = {"type": "tool_use", "id": "p1", "name": "Probe", "input": {}}
    broken = {"blocks": [call, {"type": "text", "text": "more"}], "break_after": 1, "block_delay_s": 0.2}
    again = {"blocks": [call], "stop_reason": "tool_use"}
    model = ScriptedModel([broken, again, DONE])
    seen: list[dict[str, Any]] = []
    session = Session(options(tmp_path, extra_tools=(probe,)), client=model, emit=seen.append)
    try:
        result = await asyncio.wait_for(session.run("go"), 60)
    finally:
        await session.aclose()
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 3
    shown = [("result" if m["type"] == "user" else "tombstone") for m in seen
             if (m["type"] == "user" and any(b.get("tool_use_id") == "p1" for b in m["message"]["content"]))
             or m.get("subtype") == "tombstone"]
    assert shown == ["result", "tombstone", "result"]


async def test_an_interrupt_mid_stream_lets_a_started_block_tool_finish(tmp_path: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool("Hold", "Finishes when released.", SCHEMA_NONE, concurrency_safe=True, interrupt="block")
    async def hold(input: Any, ctx: ToolContext) -> str:
        started.set()
        await release.wait()
        return "HELD_RESULT"

    streaming = {"blocks": [{"type": "tool_use", "id": "h1", "name": "Hold", "input": {}},
                            {"type": "text", "text": "still streaming"}],
                 "stop_reason": "tool_use", "block_delay_s": 30}
    model = ScriptedModel([streaming, DONE])
    session = Session(options(tmp_path, extra_tools=(hold,)), client=model)
    try:
        running = asyncio.ensure_future(session.run("go"))
        await asyncio.wait_for(started.wait(), 30)
        session.interrupt()
        await asyncio.sleep(0.2)
        release.set()
        result = await asyncio.wait_for(running, 30)
    finally:
        await session.aclose()
    assert result.terminal_reason.value.startswith("aborted") and model.count == 1
    answers = {b["tool_use_id"]: b for m in load_history(session.trace_path) if m.role == "user"
               for b in m.content if b.get("type") == "tool_result"}
    assert answers["h1"]["content"] == "HELD_RESULT" and not answers["h1"].get("is_error")



async def test_a_turn_ending_tool_that_fails_does_not_end_the_turn(tmp_path: Path) -> None:
    @tool("Finish", "Ends the turn when it succeeds.", SCHEMA_NONE, ends_turn=True)
    async def finish(input: Any, ctx: ToolContext) -> ToolOutput:
        return ToolOutput("could not finish", is_error=True)

    result, model, _ = await run(tmp_path, [calls(("f1", "Finish")), DONE], extra_tools=(finish,))
    assert result.terminal_reason is TerminalReason.COMPLETED and result.result == "done" and model.count == 2
    assert model.bodies[1]["messages"][-1]["content"][0]["is_error"] is True
