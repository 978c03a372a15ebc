"""The loop's handling of what goes wrong, through its public entry point (a :class:`Session` on the
scripted model) and the auditor on the session files it writes:

- tool input that is not valid JSON, of every kind (cut off, a trailing comma, not an object, text after
  the object), with a tool_use stop or cut off by max_tokens: the call is answered with the invalid-JSON
  error (Claude Code's wording, echoing the input up to a bound) and the run goes on; only a tool_use
  stop without any call is asked for again;
- a stream that breaks while a tool runs: the executor's abort reason reaches the conversation (a
  retried response leaves no trace; a final failure answers the call with the stream-failed text);
- moves into stop without their terminal reason, and runs without a result or with a wrong one, in
  real session files of several endings: the auditor names each.

Every run's session file is audited clean and every request it sent passes the pairing checks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_recovery import run_session  # the recovery tests' session runner, audit included

from agentfsm.auditing.audit import audit_file
from agentfsm.auditing.checks import CODES, check_request
from agentfsm.hooks.permissions import PermissionDeny
from agentfsm.machine.options import Options
from agentfsm.machine.state import Limits, TerminalReason
from agentfsm.runtime.pipeline import REJECT_MESSAGE, WORKER_LOST, synthetic_result, synthetic_text
from agentfsm.sessions.resume import load_history
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import populate_workspace
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import ToolContext, tool

DONE = {"blocks": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"}
GOOD = {"type": "tool_use", "id": "good", "name": "Read", "input": {"file_path": "$WS/a.txt"}}
# stop_reason tool_use without a tool_use block: the malformed tool use the graph asks again for
NO_CALL = {"blocks": [{"type": "text", "text": "calling"}], "stop_reason": "tool_use"}
PTL = {"status": 400, "error_type": "invalid_request_error", "message": "prompt is too long: 300000 tokens > 200000"}


def raw(text: str, tid: str = "bad") -> dict[str, Any]:
    return {"type": "raw_tool_json", "id": tid, "name": "Read", "json": text}


async def run(tmp: Path, responses: Sequence[Any], *, tools: tuple[str, ...] = ("Read",),
              **limits: Any) -> tuple[Any, ScriptedModel, Session]:
    result, model, session = await run_session(tmp, responses, Limits(**limits), tools=tools)
    for body in model.bodies:
        assert [c for c, _ in check_request(body["messages"])] == []
    return result, model, session


def after_prompt(model: ScriptedModel, n: int) -> list[dict[str, Any]]:
    return model.bodies[n]["messages"][1:]


# --- invalid tool JSON, end to end --------------------------------------------------------------------

# (an empty input is not among them: a tool_use that streams no input JSON has the input {})
INVALID = ['{"file_path": "$WS/a.txt"', '{"file_path": "$WS/a.txt",}', "[1]", '"a string"',
           '{"file_path": "$WS/a.txt"} trailing', "{"]


@pytest.mark.parametrize("text", INVALID)
async def test_a_tool_call_with_invalid_json_is_answered_and_the_run_goes_on(tmp_path: Path, text: str) -> None:
    # Claude Code 2.1.332 does the same (tests/fidelity/scenarios/unparsable_tool_input.json): the call is
    # kept and answered with an input-validation error the model can correct; nothing is asked again
    result, model, _ = await run(tmp_path, [{"blocks": [raw(text)], "stop_reason": "tool_use"}, DONE, DONE])
    assert result.terminal_reason is TerminalReason.COMPLETED and result.result == "done"
    assert model.count == 2 and result.num_turns == 2
    call, answer = after_prompt(model, 1)
    assert [b["id"] for b in call["content"]] == ["bad"] and call["content"][0]["input"] == {}
    assert answer["content"][0]["tool_use_id"] == "bad" and answer["content"][0]["is_error"] is True
    assert answer["content"][0]["content"].startswith("<tool_use_error>InputValidationError: Read ")


async def test_tool_use_without_a_call_past_the_retry_cap_ends_the_run(tmp_path: Path) -> None:
    bad = NO_CALL
    # two retries by default, as Claude Code 2.1.332 (tests/fidelity/conform/conform-11d939ce08.json)
    result, model, _ = await run(tmp_path, [bad, bad, bad, DONE])
    assert result.terminal_reason is TerminalReason.MALFORMED_TOOL_USE_EXHAUSTED and result.is_error
    assert model.count == 3
    result, model, _ = await run(tmp_path / "two", [bad, bad, DONE])
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 3
    result, model, _ = await run(tmp_path / "one", [bad, bad, DONE], malformed_tool_use_retries=1)
    assert result.terminal_reason is TerminalReason.MALFORMED_TOOL_USE_EXHAUSTED and model.count == 2


async def test_a_valid_call_beside_an_invalid_one_runs_and_the_invalid_one_is_answered(tmp_path: Path) -> None:
    result, model, _ = await run(tmp_path, [{"blocks": [GOOD, raw('{"file_path": 1,')], "stop_reason": "tool_use"},
                                            DONE])
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 2
    calls, answers = after_prompt(model, 1)
    assert [b["id"] for b in calls["content"]] == ["good", "bad"]
    assert calls["content"][1]["input"] == {}  # what could not be read is sent back as an empty input
    good, bad = answers["content"]
    assert good["tool_use_id"] == "good" and not good.get("is_error") and "ALPHA" in good["content"]
    assert bad["tool_use_id"] == "bad" and bad["is_error"] is True
    assert bad["content"] == (
        "<tool_use_error>InputValidationError: Read was called with input that could not be parsed as JSON.\n"
        'You sent (first 16 of 16 bytes): {"file_path": 1,\nCommon causes: unescaped backslashes in file paths '
        "(use / or \\\\), unescaped control characters, or truncated output. Retry with valid JSON.</tool_use_error>")


@pytest.mark.parametrize("size, cut", [(199, False), (200, False), (201, True)])
async def test_invalid_json_cut_off_by_max_tokens_is_answered_with_its_first_200_bytes(tmp_path: Path, size: int,
                                                                                      cut: bool) -> None:
    text = '{"file_path": "' + "x" * (size - len('{"file_path": "'))
    assert len(text.encode()) == size
    result, model, _ = await run(tmp_path, [{"blocks": [raw(text)], "stop_reason": "max_tokens"}, DONE])
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 2
    answer = after_prompt(model, 1)[1]["content"][0]
    assert answer["is_error"] is True
    head, echoed = answer["content"].split("You sent (", 1)[1].split("\n", 1)[0].split("): ", 1)
    assert head == f"first {min(size, 200)} of {size} bytes" and echoed == text[:200]
    assert cut == (size > 200)


async def test_a_wide_character_at_the_echo_bound_is_dropped_not_split(tmp_path: Path) -> None:
    # counted like Claude Code, in UTF-16 code units: an emoji is two, the first one spans units 200 and 201
    text = '{"file_path": "' + "x" * 184 + "\U0001f600" * 5
    _, model, _ = await run(tmp_path, [{"blocks": [raw(text)], "stop_reason": "max_tokens"}, DONE])
    content = after_prompt(model, 1)[1]["content"][0]["content"]
    assert "(first 200 of 209 bytes): " + '{"file_path": "' + "x" * 184 + "\n" in content


async def test_a_call_whose_json_is_valid_but_breaks_the_schema_runs_through_validation(tmp_path: Path) -> None:
    wrong = {"type": "tool_use", "id": "v", "name": "Read", "input": {"file_path": 1}}
    result, model, _ = await run(tmp_path, [{"blocks": [wrong], "stop_reason": "tool_use"}, DONE])
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 2
    answer = after_prompt(model, 1)[1]["content"][0]
    assert answer["is_error"] is True and "`file_path` type is expected as `string`" in answer["content"]


# --- abort reasons through the executor ---------------------------------------------------------------

SLOW = {"type": "tool_use", "id": "slow", "name": "Bash", "input": {"command": "sleep 30"}}


async def test_a_stream_that_breaks_while_a_tool_runs_is_retried_without_a_trace_of_it(tmp_path: Path) -> None:
    broken = {"blocks": [SLOW, {"type": "text", "text": "more"}], "break_after": 1}
    result, model, session = await run(tmp_path, [broken, DONE], tools=("Bash",))
    assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 2
    assert model.bodies[1]["messages"] == model.bodies[0]["messages"]  # asked again, as before
    assert [m.role for m in load_history(session.trace_path)] == ["user", "assistant"]  # type: ignore[arg-type]


async def test_a_stream_that_breaks_for_good_answers_the_running_call_with_the_stream_failed_text(
        tmp_path: Path) -> None:
    broken = {"blocks": [SLOW, {"type": "text", "text": "more"}], "break_after": 1}
    result, _, session = await run(tmp_path, [broken, DONE], tools=("Bash",), stream_retries=0)
    assert result.is_error and result.terminal_reason is not TerminalReason.COMPLETED
    history = load_history(session.trace_path)  # type: ignore[arg-type]
    assert [m.role for m in history] == ["user", "assistant", "user"]
    assert history[1].tool_use_ids() == ["slow"]
    answer = history[2].content[0]
    assert answer["tool_use_id"] == "slow" and answer["is_error"] is True
    assert answer["content"] == "<tool_use_error>Error: Tool execution discarded (stream_failed)</tool_use_error>"


@pytest.mark.parametrize("reason, text", [
    ("user_interrupted", REJECT_MESSAGE),
    ("streaming_fallback", "<tool_use_error>Error: Streaming fallback - tool execution discarded</tool_use_error>"),
    ("fallback", "<tool_use_error>Error: Streaming fallback - tool execution discarded</tool_use_error>"),
    ("stream_failed", "<tool_use_error>Error: Tool execution discarded (stream_failed)</tool_use_error>"),
    ("discarded", "<tool_use_error>Error: Tool execution discarded (discarded)</tool_use_error>"),
])
def test_each_abort_reason_has_its_text_and_the_result_is_an_error(reason: str, text: str) -> None:
    assert synthetic_text(reason) == text
    result = synthetic_result("t", "Bash", reason, {"command": "x"})
    assert result.block == {"type": "tool_result", "tool_use_id": "t", "content": text, "is_error": True}
    assert result.is_error and result.cancel_reason == reason and result.tool_input == {"command": "x"}
    assert result.interrupted == (reason == "user_interrupted")
    assert "worker" in synthetic_text(WORKER_LOST) and synthetic_text(WORKER_LOST).startswith("<tool_use_error>")


class Waiting:
    """Two concurrency-safe tools that wait: ``Blocker`` (interrupt behaviour ``block``) until released,
    ``Canceller`` (``cancel``) for good. ``running`` is set once both run."""

    def __init__(self) -> None:
        self.running, self.release, self.count = asyncio.Event(), asyncio.Event(), 0
        schema = {"type": "object", "properties": {}, "additionalProperties": False}

        async def wait(release: asyncio.Event | None) -> str:
            self.count += 1
            if self.count == 2:
                self.running.set()
            await (release.wait() if release is not None else asyncio.sleep(3600))
            return "finished"

        @tool("Blocker", "Waits until released.", schema, concurrency_safe=True, interrupt="block")
        async def blocker(input: Any, ctx: ToolContext) -> str:
            return await wait(self.release)

        @tool("Canceller", "Waits for ever.", schema, concurrency_safe=True, interrupt="cancel")
        async def canceller(input: Any, ctx: ToolContext) -> str:
            return await wait(None)

        self.tools = (blocker, canceller)


@pytest.mark.parametrize("hard", [False, True])
async def test_an_interrupt_cancels_cancel_tools_and_lets_block_tools_finish_a_hard_abort_cancels_both(
        tmp_path: Path, hard: bool) -> None:
    ws = populate_workspace(tmp_path / "ws").resolve()
    both = {"blocks": [{"type": "tool_use", "id": "b1", "name": "Blocker", "input": {}},
                       {"type": "tool_use", "id": "c1", "name": "Canceller", "input": {}}], "stop_reason": "tool_use"}
    model = ScriptedModel([both, DONE], ws=ws)
    waiting = Waiting()
    options = Options(tools=(), extra_tools=waiting.tools, permission_mode="bypassPermissions", cwd=ws,
                      sessions_dir=tmp_path / "sessions", setting_sources=())
    session = Session(options, client=model)
    try:
        run_task = asyncio.create_task(session.run("go"))
        await asyncio.wait_for(waiting.running.wait(), 30)
        session.abort() if hard else session.interrupt()
        waiting.release.set()
        result = await asyncio.wait_for(run_task, 30)
    finally:
        await session.aclose()
    assert result.is_error and result.terminal_reason.value.startswith("aborted") and model.count == 1
    assert session.trace_path is not None and audit_file(session.trace_path) == []
    history = load_history(session.trace_path)
    assert [m.kind for m in history] == ["prompt", "assistant", "tool_results", "interrupt_marker"]
    answers = {b["tool_use_id"]: b for b in history[2].content}
    assert answers["c1"]["content"] == REJECT_MESSAGE and answers["c1"]["is_error"] is True
    if hard:
        assert answers["b1"]["content"] == REJECT_MESSAGE and answers["b1"]["is_error"] is True
    else:
        assert answers["b1"]["content"] == "finished" and not answers["b1"].get("is_error")


@pytest.mark.parametrize("interrupt", [True, False])
async def test_a_permission_callbacks_deny_with_interrupt_ends_the_run_as_the_users_interrupt_does(
        tmp_path: Path, interrupt: bool) -> None:
    # the Agent SDK's PermissionResultDeny(interrupt=True), given in process (Options.can_use_tool): the call
    # is denied and the run ends aborted_tools with the interrupt marker, as through stream-json
    # (tests/test_sdk_dropin.py); without interrupt the model is told and the run goes on
    ws = populate_workspace(tmp_path / "ws").resolve()
    write = {"blocks": [{"type": "tool_use", "id": "w1", "name": "Write",
                         "input": {"file_path": "$WS/new.txt", "content": "x"}}], "stop_reason": "tool_use"}
    model = ScriptedModel([write, DONE, DONE], ws=ws)
    asked: list[str] = []

    def deny(name: str, tool_input: Any, ctx: Any) -> PermissionDeny:
        asked.append(name)
        return PermissionDeny("NOT_NOW", interrupt=interrupt)

    options = Options(tools=("Write",), permission_mode="default", cwd=ws, sessions_dir=tmp_path / "sessions",
                      setting_sources=(), can_use_tool=deny)
    session = Session(options, client=model)
    try:
        result = await session.run("go")
    finally:
        await session.aclose()
    assert asked == ["Write"] and not (ws / "new.txt").exists()
    assert [d["tool_use_id"] for d in result.permission_denials] == ["w1"]
    assert session.trace_path is not None and audit_file(session.trace_path) == []
    history = load_history(session.trace_path)
    answer = history[2].content[0]
    assert answer["tool_use_id"] == "w1" and answer["is_error"] is True and "NOT_NOW" in answer["content"]
    if interrupt:
        assert result.terminal_reason is TerminalReason.ABORTED_TOOLS and result.is_error and model.count == 1
        assert [m.kind for m in history] == ["prompt", "assistant", "tool_results", "interrupt_marker"]
    else:
        assert result.terminal_reason is TerminalReason.COMPLETED and model.count == 2
        assert [m.kind for m in history][:3] == ["prompt", "assistant", "tool_results"]
        assert "interrupt_marker" not in [m.kind for m in history]


# --- the auditor on stops without a reason or a result -------------------------------------------------

ENDINGS: dict[str, tuple[list[Any], dict[str, Any], TerminalReason]] = {
    "completed": ([DONE], {}, TerminalReason.COMPLETED),
    "max_turns": ([{"blocks": [GOOD], "stop_reason": "tool_use"}, DONE], {"max_turns": 1}, TerminalReason.MAX_TURNS),
    "malformed": ([NO_CALL] * 3, {},
                  TerminalReason.MALFORMED_TOOL_USE_EXHAUSTED),
    "prompt_too_long": ([PTL], {}, TerminalReason.PROMPT_TOO_LONG),
    "api_error": ([{"status": 400, "error_type": "invalid_request_error", "message": "bad"}], {},
                  TerminalReason.API_ERROR),
}


async def _ending(tmp: Path, name: str) -> tuple[Path, list[dict[str, Any]]]:
    responses, limits, reason = ENDINGS[name]
    result, _, session = await run(tmp, responses, **limits)
    assert result.terminal_reason is reason
    assert session.trace_path is not None
    return session.trace_path, [json.loads(line) for line in session.trace_path.read_text().splitlines()]


def _rewrite(path: Path, recs: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _found(path: Path) -> set[tuple[int, str]]:
    findings = audit_file(path)
    assert {f.code for f in findings} <= set(CODES), "every code the auditor reports is documented"
    return {(f.line, f.code) for f in findings}


def _into_stop(recs: list[dict[str, Any]]) -> int:
    """0-based index of the first move into stop."""
    return next(i for i, r in enumerate(recs) if r["type"] == "transition" and r["to"] == "stop")


@pytest.mark.parametrize("name", sorted(ENDINGS))
async def test_a_move_into_stop_without_its_reason_is_caught(tmp_path: Path, name: str) -> None:
    path, recs = await _ending(tmp_path, name)
    i = _into_stop(recs)
    recs[i].pop("terminal_reason")
    recs[i].get("changed", {}).pop("terminal_reason", None)
    _rewrite(path, recs)
    assert (i + 1, "bad_terminal_reason") in _found(path)


@pytest.mark.parametrize("name", sorted(ENDINGS))
async def test_a_move_into_stop_with_another_edges_reason_is_caught(tmp_path: Path, name: str) -> None:
    path, recs = await _ending(tmp_path, name)
    i = _into_stop(recs)
    other = "blocking_limit"  # no edge of these endings allows it
    recs[i]["terminal_reason"] = other
    _rewrite(path, recs)
    assert (i + 1, "bad_terminal_reason") in _found(path)


@pytest.mark.parametrize("name", sorted(ENDINGS))
async def test_a_run_without_its_result_is_incomplete(tmp_path: Path, name: str) -> None:
    path, recs = await _ending(tmp_path, name)
    _rewrite(path, [r for r in recs if r["type"] != "result"])
    findings = audit_file(path)
    assert [f.code for f in findings] == ["incomplete_run"] and not findings[0].is_error
    assert "incomplete_run" in CODES
    # the run starts with its first move
    assert findings[0].line == 1 + next(i for i, r in enumerate(recs) if r["type"] == "transition")


@pytest.mark.parametrize("name", sorted(ENDINGS))
@pytest.mark.parametrize("reason", [None, "", "not_a_reason", "completed", "max_turns"])
async def test_a_result_without_the_stops_reason_is_caught(tmp_path: Path, name: str, reason: str | None) -> None:
    path, recs = await _ending(tmp_path, name)
    result = next(i for i, r in enumerate(recs) if r["type"] == "result")
    if reason == ENDINGS[name][2].value:
        return  # the run's own reason: nothing to catch
    if reason is None:
        recs[result].pop("terminal_reason")
    else:
        recs[result]["terminal_reason"] = reason
    _rewrite(path, recs)
    assert (result + 1, "result_mismatch") in _found(path)


@pytest.mark.parametrize("name", sorted(ENDINGS))
async def test_a_result_before_any_move_into_stop_is_caught(tmp_path: Path, name: str) -> None:
    path, recs = await _ending(tmp_path, name)
    result = recs.pop(next(i for i, r in enumerate(recs) if r["type"] == "result"))
    i = _into_stop(recs)
    recs.insert(i, result)
    _rewrite(path, [{**r, "seq": n} for n, r in enumerate(recs)])
    assert (i + 1, "result_before_stop") in _found(path)
