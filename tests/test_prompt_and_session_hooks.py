"""UserPromptSubmit, SessionStart and SessionEnd hooks fire at their places in a real session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentfsm.auditing.audit import audit_file
from agentfsm.hooks import HookMatcher, HookOutput
from agentfsm.machine.options import Options
from agentfsm.machine.state import TerminalReason
from agentfsm.sessions.resume import load_history
from agentfsm.sessions.session import Session
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, tool

ANSWER = {"blocks": [{"type": "text", "text": "ANSWER"}], "stop_reason": "end_turn"}


def session(tmp_path: Path, hooks: dict[str, Any], model: ScriptedModel) -> Session:
    return Session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", tools=("Read",), hooks=hooks),
                   client=model)


def user_texts(model: ScriptedModel) -> list[str]:
    return [b["text"] for m in model.requests[0].messages if m["role"] == "user"
            for b in m["content"] if b.get("type") == "text"]


async def test_continue_false_erases_the_prompt_and_stops(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER])
    s = session(tmp_path, {"UserPromptSubmit": [HookMatcher(hooks=[lambda _r: HookOutput.stop("no today")])]},
                model)
    result = await s.run("hello")
    await s.aclose()
    assert result.terminal_reason is TerminalReason.HOOK_STOPPED and not result.is_error
    assert result.result == "Operation stopped by hook: no today"
    assert model.count == 0 and s.history == ()
    assert load_history(s.trace_path) == ()  # erased: resume does not bring it back
    assert [f for f in audit_file(s.trace_path) if f.is_error] == []


async def test_blocked_prompt_is_erased_and_the_next_prompt_runs(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER])
    block_secret = HookMatcher(hooks=[lambda r: HookOutput.block("no secrets") if "secret" in r.prompt
                                      else None])
    s = session(tmp_path, {"UserPromptSubmit": [block_secret]}, model)
    first = await s.run("my secret")
    second = await s.run("plain question")
    await s.aclose()
    assert first.terminal_reason is TerminalReason.HOOK_STOPPED
    assert second.terminal_reason is TerminalReason.COMPLETED and second.result == "ANSWER"
    assert model.count == 1 and user_texts(model) == ["plain question"]
    assert [f for f in audit_file(s.trace_path) if f.is_error] == []


async def test_prompt_and_session_start_context_reach_the_model(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER])
    seen: list[str] = []

    def on_end(record: Any) -> None:
        seen.append(f"end:{record.reason}")

    hooks = {
        "SessionStart": [HookMatcher(hooks=[lambda r: (seen.append(f"start:{r.source}"),
                                                         HookOutput.context("PROJECT_RULES"))[1]])],
        "UserPromptSubmit": [HookMatcher(hooks=[lambda _r: HookOutput.context("PROMPT_NOTE")])],
        "SessionEnd": [HookMatcher(hooks=[on_end])],
    }
    s = session(tmp_path, hooks, model)
    result = await s.run("hello")
    assert seen == ["start:startup"]
    await s.aclose()
    assert seen == ["start:startup", "end:other"]
    assert result.result == "ANSWER"
    texts = user_texts(model)
    # Claude Code's order and label: the prompt's context first, then the prompt
    assert texts[:2] == ["<system-reminder>\nUserPromptSubmit hook additional context: PROMPT_NOTE\n</system-reminder>",
                         "hello"]
    assert any("PROJECT_RULES" in t and t.startswith("<system-reminder>") for t in texts)


async def test_a_stop_hook_that_always_blocks_ends_after_one_plus_eight_requests(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER] * 12)
    emitted: list[dict[str, Any]] = []
    s = Session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", tools=("Read",),
                        hooks={"Stop": [HookMatcher(hooks=[lambda _r: HookOutput.block("keep going")])]}),
                client=model, emit=emitted.append)
    result = await s.run("hello")
    await s.aclose()
    assert model.count == 1 + 8
    assert result.terminal_reason is TerminalReason.COMPLETED and not result.is_error
    # the ninth block is the one overridden (Claude Code: "blocked the turn from ending 9 consecutive times")
    assert any(m.get("subtype") == "warning" and "9 times" in m.get("message", "") for m in emitted)
    last = model.requests[-1].messages
    assert sum("keep going" in b.get("text", "") for m in last for b in m["content"]) == 8
    assert [f for f in audit_file(s.trace_path) if f.is_error] == []


def _stop_session(tmp_path: Path, hook: Any, model: ScriptedModel, emitted: list[dict[str, Any]]) -> Session:
    return Session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", tools=("Read",),
                           hooks={"Stop": [HookMatcher(hooks=[hook])]}), client=model, emit=emitted.append)


def _last_user(model: ScriptedModel, request: int) -> list[str]:
    return [b["text"] for b in model.requests[request].messages[-1]["content"]]


async def test_a_stop_hooks_context_keeps_the_loop_going_once(tmp_path: Path) -> None:
    """Like Claude Code 2.1.332: additionalContext without a block is shown to the model in a reminder
    and the loop goes on (the hook sees stop_hook_active the second time and passes)."""
    model = ScriptedModel([ANSWER, {"blocks": [{"type": "text", "text": "SECOND"}], "stop_reason": "end_turn"}])
    emitted: list[dict[str, Any]] = []
    seen: list[bool] = []

    def hook(record: Any) -> HookOutput | None:
        seen.append(record.stop_hook_active)
        return None if record.stop_hook_active else HookOutput.context("the lint step is red")

    s = _stop_session(tmp_path, hook, model, emitted)
    result = await s.run("hello")
    await s.aclose()
    assert seen == [False, True] and model.count == 2
    assert _last_user(model, 1) == ["<system-reminder>\nStop hook additional context: the lint step is red\n"
                                    "</system-reminder>"]
    assert result.terminal_reason is TerminalReason.COMPLETED and result.result == "SECOND"
    # context alone prints no user message (Claude Code prints none either)
    assert not [m for m in emitted if m.get("type") == "user"]
    assert [f for f in audit_file(s.trace_path) if f.is_error] == []


async def test_a_stop_hooks_block_and_context_are_one_message_and_the_feedback_is_printed(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER, ANSWER])
    emitted: list[dict[str, Any]] = []
    blocked = HookOutput(decision="block", reason="run the tests", additional_context="3 failing")

    s = _stop_session(tmp_path, lambda r: None if r.stop_hook_active else blocked, model, emitted)
    result = await s.run("hello")
    await s.aclose()
    assert model.count == 2 and result.terminal_reason is TerminalReason.COMPLETED
    assert _last_user(model, 1) == ["<system-reminder>\nStop hook feedback:\nrun the tests\n</system-reminder>",
                                    "<system-reminder>\nStop hook additional context: 3 failing\n</system-reminder>"]
    # the block's feedback is printed as a synthetic user message, as Claude Code prints it
    users = [m for m in emitted if m.get("type") == "user"]
    assert [(u["message"]["content"], u.get("isSynthetic")) for u in users] == [
        ([{"type": "text", "text": "Stop hook feedback:\nrun the tests"}], True)]
    assert [f for f in audit_file(s.trace_path) if f.is_error] == []


async def test_a_stop_hook_that_always_adds_context_meets_the_block_cap(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER] * 12)
    emitted: list[dict[str, Any]] = []
    s = _stop_session(tmp_path, lambda _r: HookOutput.context("more"), model, emitted)
    result = await s.run("hello")
    await s.aclose()
    assert model.count == 1 + 8
    assert result.terminal_reason is TerminalReason.COMPLETED and not result.is_error
    assert any(m.get("subtype") == "warning" and "9 times" in m.get("message", "") for m in emitted)
    assert [f for f in audit_file(s.trace_path) if f.is_error] == []


async def test_continue_false_wins_over_a_stop_hooks_context(tmp_path: Path) -> None:
    model = ScriptedModel([ANSWER] * 3)
    emitted: list[dict[str, Any]] = []
    halt = HookOutput(continue_=False, stop_reason="enough", additional_context="ignored")
    s = _stop_session(tmp_path, lambda _r: halt, model, emitted)
    result = await s.run("hello")
    await s.aclose()
    assert model.count == 1 and result.terminal_reason is TerminalReason.STOP_HOOK_PREVENTED


async def test_a_blocked_prompt_after_an_interrupted_run_does_not_show_the_old_interrupt_again(
        tmp_path: Path) -> None:
    """The interrupt marker that ended the last run is what the history ends with when a prompt is
    blocked: the blocked run shows the client nothing of that earlier run (issue 35, runner)."""
    started = asyncio.Event()

    @tool("Wait", "Waits for ever.", {"type": "object", "properties": {}, "additionalProperties": False},
          interrupt="cancel")
    async def wait(input: Any, ctx: ToolContext) -> str:
        started.set()
        await asyncio.sleep(3600)
        return "never"

    call = {"blocks": [{"type": "tool_use", "id": "toolu_wait", "name": "Wait", "input": {}}],
            "stop_reason": "tool_use"}
    block_secret = HookMatcher(hooks=[lambda r: HookOutput.block("no secrets") if "secret" in r.prompt else None])
    out: list[dict[str, Any]] = []
    s = Session(Options(cwd=tmp_path, sessions_dir=tmp_path / "s", tools=(), extra_tools=(wait,),
                        permission_mode="bypassPermissions", setting_sources=(),
                        hooks={"UserPromptSubmit": [block_secret]}),
                client=ScriptedModel([call]), emit=out.append)
    try:
        first = asyncio.ensure_future(s.run("one"))
        await asyncio.wait_for(started.wait(), 30)
        s.interrupt()
        interrupted = await asyncio.wait_for(first, 30)
        assert interrupted.terminal_reason is TerminalReason.ABORTED_TOOLS
        marker = s.history[-1]
        assert marker.kind == "interrupt_marker"
        shown_before = len(out)
        blocked = await asyncio.wait_for(s.run("my secret"), 30)
    finally:
        await s.aclose()
    assert blocked.terminal_reason is TerminalReason.HOOK_STOPPED
    assert s.history[-1].uuid == marker.uuid
    again = [m for m in out[shown_before:] if m["type"] == "user"]
    assert again == []
