"""Resume and the session file, by the guarantee they give: whatever a session file holds — repeated
tool ids, calls left without results, results that answer nothing, a torn line — the history a resumed
run starts from is a conversation the API accepts, and every request any run sends passes the pairing
checks the auditor applies (``agentfsm.auditing.checks.check_request``).

The repair is checked over generated damaged histories; repeated tool ids end to end, in one response,
across the runs of one session and across a resume; and the session options' contradictions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.auditing.audit import audit_file
from agentfsm.auditing.checks import check_pairs, check_request
from agentfsm.machine.options import Options
from agentfsm.machine.state import Message, TerminalReason
from agentfsm.runtime.request import normalize
from agentfsm.runtime.trace import TraceWriter
from agentfsm.sessions.resume import (
    DANGLING_RESULT,
    latest_session,
    load_history,
    load_view,
    open_session,
    plan_session,
    repair,
    unique_tool_ids,
    valid_block,
)
from agentfsm.testing.scenario import populate_workspace
from agentfsm.testing.scripted import ScriptedModel


def use(i: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": i, "name": "Read", "input": {}}


def res(i: str, content: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": content}


def A(*blocks: Any) -> Message:
    return Message("assistant", tuple(blocks), kind="assistant")


def U(*blocks: Any, kind: str = "tool_results") -> Message:
    return Message("user", tuple(blocks), kind=kind)


def ids(messages: Sequence[Message]) -> list[list[str]]:
    return [m.tool_use_ids() if m.role == "assistant" else m.tool_result_ids() for m in messages]


# --- unique ids ---------------------------------------------------------------------------------------


def test_an_id_repeated_in_a_later_message_is_renamed_with_its_result() -> None:
    history = [Message("user", "p"), A(use("a")), U(res("a", "first")), A(use("a")), U(res("a", "second"))]
    out = unique_tool_ids(history)
    assert ids(out) == [[], ["a"], ["a"], ["a_2"], ["a_2"]]
    assert out[4].content[0]["content"] == "second"
    assert out[:3] == history[:3]  # what needed no renaming is the same record


def test_every_further_repeat_takes_the_next_free_number() -> None:
    history = [Message("user", "p"), A(use("a")), U(res("a")), A(use("a")), U(res("a")), A(use("a_2"), use("a")),
               U(res("a_2"), res("a"))]
    assert ids(unique_tool_ids(history))[5:] == [["a_2_2", "a_3"], ["a_2_2", "a_3"]]


def test_an_id_repeated_in_one_message_pairs_its_results_in_order() -> None:
    out = unique_tool_ids([Message("user", "p"), A(use("d"), use("d")), U(res("d", "one"), res("d", "two"))])
    assert ids(out)[1:] == [["d", "d_2"], ["d", "d_2"]]
    assert [b["content"] for b in out[2].content] == ["one", "two"]


def test_a_result_is_renamed_only_in_the_message_right_after_its_call() -> None:
    out = unique_tool_ids([Message("user", "p"), A(use("a")), U(res("a")), A(use("a")), U(res("x")),
                           Message("user", (res("a"),))])
    # the late result answers no call of the message before it: left as it is (repair drops it)
    assert ids(out)[3:] == [["a_2"], ["x"], ["a"]]


# --- repair: the resumed history is always a valid conversation ----------------------------------------

TOOL_IDS = st.sampled_from(["a", "b", "c"])
STEP = st.one_of(
    st.builds(lambda xs: A(*[use(x) for x in xs], {"type": "text", "text": "t"}), st.lists(TOOL_IDS, max_size=3)),
    st.builds(lambda xs: U(*[res(x) for x in xs]), st.lists(TOOL_IDS, min_size=1, max_size=3)),
    st.just(Message("user", "more")),
    st.just(A({"type": "text", "text": "answer"})),
)


@given(st.lists(STEP, max_size=10), st.booleans())
def test_any_damaged_history_repairs_into_a_conversation_the_api_accepts(steps: list[Message], prompt: bool) -> None:
    history = [Message("user", "p"), *steps] if prompt else steps
    repaired = repair(history)
    assert list(check_pairs(list(repaired))) == []
    wire = normalize(repaired)
    assert [c for c, _ in check_request(wire)] in ([], ["role_order"])  # pairing is the repair's job
    if repaired:
        assert repaired[0].role == "user" and not repaired[0].tool_result_ids()
    assert repair(repaired) == repaired  # nothing left to repair
    # every prompt and answer from the first prompt on survives, in order
    start = next((k for k, m in enumerate(history) if m.role == "user" and not m.tool_result_ids()), len(history))
    assert [m.text() for m in repaired if not m.tool_result_ids()] == \
        [m.text() for m in history[start:] if not m.tool_result_ids()]


def test_a_second_result_for_one_call_is_dropped() -> None:
    out = repair([Message("user", "p"), A(use("a")), U(res("a", "first"), res("a", "again"))])
    assert ids(out) == [[], ["a"], ["a"]] and out[2].content[0]["content"] == "first"


def test_a_missing_result_is_added_beside_the_results_that_came() -> None:
    out = repair([Message("user", "p"), A(use("a"), use("b")), U(res("a"))])
    assert len(out) == 3 and out[2].tool_result_ids() == ["a", "b"]
    assert out[2].content[1] == {"type": "tool_result", "tool_use_id": "b", "is_error": True,
                                 "content": DANGLING_RESULT}


def test_calls_with_no_result_at_all_get_a_synthetic_message_before_what_follows() -> None:
    out = repair([Message("user", "p"), A(use("a")), Message("user", "next prompt")])
    assert [(m.role, m.kind) for m in out] == [("user", "prompt"), ("assistant", "assistant"),
                                              ("user", "synthetic"), ("user", "prompt")]
    assert out[2].tool_result_ids() == ["a"] and out[2].content[0]["is_error"] is True
    out = repair([Message("user", "p"), A(use("a"))])
    assert out[-1].kind == "synthetic" and out[-1].tool_result_ids() == ["a"]


def test_results_answering_nothing_are_dropped_and_an_emptied_message_with_them() -> None:
    out = repair([Message("user", "p"), A(use("a")), U(res("a"), res("zz")), U(res("a"))])
    assert ids(out) == [[], ["a"], ["a"]]
    out = repair([Message("user", "p"), A({"type": "text", "text": "x"}),
                  U(res("a"), {"type": "text", "text": "kept"})])
    assert out[2].text() == "kept" and out[2].tool_result_ids() == []


def test_what_precedes_the_first_prompt_is_not_sent() -> None:
    out = repair([A(use("a")), U(res("a")), Message("user", "p"), A({"type": "text", "text": "x"})])
    assert [m.text() for m in out] == ["p", "x"]
    assert repair([A(use("a")), U(res("a"))]) == ()


# --- reading a session file ------------------------------------------------------------------------------


@pytest.mark.parametrize("block, role, ok", [
    ({"type": "text", "text": "x"}, "assistant", True),
    ({"type": "text", "text": 3}, "assistant", False),
    ({"type": "tool_use", "id": "a", "name": "R", "input": {}}, "assistant", True),
    ({"type": "tool_use", "id": "a", "name": "R", "input": []}, "assistant", False),
    ({"type": "tool_use", "id": "a", "input": {}}, "assistant", False),
    ({"type": "tool_use", "id": "a", "name": "R", "input": {}}, "user", False),
    ({"type": "tool_result", "tool_use_id": "a", "content": "x"}, "user", True),
    ({"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text", "text": "x"}]}, "user", True),
    ({"type": "tool_result", "tool_use_id": "a", "content": None}, "user", False),
    ({"type": "tool_result", "tool_use_id": "a", "content": "x"}, "assistant", False),
    ({"type": "thinking", "thinking": "h"}, "assistant", True),
    ({"type": "redacted_thinking", "data": "d"}, "assistant", True),
    ({"type": "image", "source": {}}, "user", True),
    ({"type": "document", "source": "x"}, "user", False),
    ({"type": "nope"}, "user", False),
    ("text", "user", False),
    ({"type": "text", "text": "x"}, "system", False),
])
def test_a_block_is_kept_only_with_the_fields_the_api_requires_for_its_role(block: Any, role: str, ok: bool) -> None:
    assert (valid_block(block, role) == block) if ok else valid_block(block, role) is None


def _write(path: Path, *records: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")


def test_a_message_with_one_unusable_block_is_skipped_whole_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _write(path, {"type": "message", "role": "user", "content": [{"type": "text", "text": "p"}], "uuid": "u1"},
           {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                                {"type": "tool_use", "id": 5}]},
           {"type": "message", "role": "assistant", "content": [], "kind": "assistant"},
           {"type": "message", "role": "robot", "content": [{"type": "text", "text": "x"}]},
           {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "fine"}], "kind": 3})
    problems: list[Any] = []
    history, repaired = load_view(path, problems)
    assert [(m.role, m.text(), m.kind) for m in history] == [("user", "p", "prompt"), ("assistant", "fine", "prompt")]
    assert history[0].uuid == "u1" and not repaired
    assert [(p.line, p.code) for p in problems] == [(2, "malformed_record"), (3, "malformed_record"),
                                                    (4, "malformed_record")]


def test_the_view_starts_after_the_last_compact_boundary(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    t = TraceWriter(path)
    t.message(Message("user", "old"))
    t.write({"type": "compact_boundary"})
    t.message(Message("user", "summary", kind="compact_summary"))
    t.write({"type": "compact_boundary"})
    t.message(Message("user", "newest summary", kind="compact_summary"))
    t.message(Message("assistant", "a", kind="assistant"))
    t.close()
    assert [m.text() for m in load_history(path)] == ["newest summary", "a"]


def test_an_erased_prompt_and_a_result_record_drop_what_was_streamed(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _write(path, {"type": "message", "role": "user", "content": [{"type": "text", "text": "p"}], "kind": "prompt"},
           {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "a"}], "kind": "assistant"},
           {"type": "assistant_block", "message_id": "m1", "block": {"type": "text", "text": "LOST"}},
           {"type": "result", "subtype": "error"},
           {"type": "message", "role": "user", "content": [{"type": "text", "text": "q"}], "kind": "erased_prompt"})
    history, repaired = load_view(path)
    assert [m.text() for m in history] == ["p", "a"] and not repaired


def test_a_rebuilt_response_is_reported_as_a_repair(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    _write(path, {"type": "message", "role": "user", "content": [{"type": "text", "text": "p"}], "kind": "prompt"},
           {"type": "assistant_block", "message_id": "m1", "block": {"type": "text", "text": "CUT"}},
           {"type": "assistant_block", "message_id": "m1", "block": {"type": "bogus"}})
    problems: list[Any] = []
    history, repaired = load_view(path, problems)
    assert [m.text() for m in history] == ["p", "CUT"] and repaired
    assert [p.code for p in problems] == ["malformed_record"]


def test_latest_session_skips_empty_files_and_takes_the_newest(tmp_path: Path) -> None:
    import os

    assert latest_session(tmp_path) is None
    (tmp_path / "old.jsonl").write_text("{}\n")
    (tmp_path / "new.jsonl").write_text("{}\n")
    (tmp_path / "empty.jsonl").write_text("")
    os.utime(tmp_path / "old.jsonl", ns=(1, 1_000_000_000))
    os.utime(tmp_path / "new.jsonl", ns=(1, 2_000_000_000))
    os.utime(tmp_path / "empty.jsonl", ns=(1, 3_000_000_000))
    assert latest_session(tmp_path) == "new"
    (tmp_path / "empty.jsonl").write_text("{}\n")
    os.utime(tmp_path / "empty.jsonl", ns=(1, 3_000_000_000))
    assert latest_session(tmp_path) == "empty"


# --- the session options -----------------------------------------------------------------------------------


def _opts(tmp: Path, **kw: Any) -> Options:
    return Options(cwd=tmp, sessions_dir=tmp / "s", setting_sources=(), **kw)


def test_plan_session_refuses_each_contradiction(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    assert plan_session(_opts(tmp_path)).source is None
    assert plan_session(_opts(tmp_path, session_id="fresh")).source is None
    with pytest.raises(FileNotFoundError, match="No conversation found to continue"):
        plan_session(_opts(tmp_path, continue_session=True))
    with pytest.raises(ValueError, match="--fork-session needs --resume or --continue"):
        plan_session(_opts(tmp_path, fork_session=True))
    with pytest.raises(FileNotFoundError, match="No conversation found with session ID: nope"):
        plan_session(_opts(tmp_path, resume="nope"))
    (tmp_path / "s" / "old.jsonl").write_text('{"type": "session", "session_id": "old"}\n')
    with pytest.raises(ValueError, match="already in use"):
        plan_session(_opts(tmp_path, session_id="old"))
    with pytest.raises(ValueError, match="can only be used with --continue or --resume if --fork-session"):
        plan_session(_opts(tmp_path, resume="old", session_id="other"))
    with pytest.raises(ValueError, match="already in use"):
        plan_session(_opts(tmp_path, resume="old", session_id="old", fork_session=True))
    plan = plan_session(_opts(tmp_path, resume="old", session_id="other", fork_session=True))
    assert plan.source == tmp_path / "s" / "old.jsonl" and plan.fork
    plan = plan_session(_opts(tmp_path, continue_session=True))
    assert plan.source == tmp_path / "s" / "old.jsonl" and not plan.fork
    with pytest.raises(FileNotFoundError):
        plan_session(_opts(tmp_path / "elsewhere", continue_session=True))


# --- repeated tool ids end to end -----------------------------------------------------------------------


def read(*tids: str) -> dict[str, Any]:
    blocks = [{"type": "tool_use", "id": t, "name": "Read", "input": {"file_path": "$WS/a.txt"}} for t in tids]
    return {"blocks": blocks, "stop_reason": "tool_use"}


def text(t: str) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": "end_turn"}


def _requests_pair(model: ScriptedModel) -> list[list[str]]:
    """The tool ids of every request's last assistant message; and every request is well paired."""
    for body in model.bodies:
        assert [c for c, _ in check_request(body["messages"])] == [], body["messages"]
    return [[b["id"] for m in body["messages"] for b in m["content"] if b["type"] == "tool_use"]
            for body in model.bodies]


async def test_repeated_tool_ids_within_a_response_across_runs_and_across_a_resume(tmp_path: Path) -> None:
    ws = populate_workspace(tmp_path / "ws").resolve()
    model = ScriptedModel([read("t1", "t1"), text("one"), read("t1"), text("two"), read("t1_2", "t1"), text("three")],
                          ws=ws)
    options = Options(tools=("Read",), permission_mode="bypassPermissions", cwd=ws, sessions_dir=tmp_path / "s",
                      setting_sources=())
    session = open_session(options, client=model, owns_client=False)
    try:
        first = await session.run("go")
        second = await session.run("again")
    finally:
        await session.aclose()
    assert (first.result, second.result) == ("one", "two")
    assert session.trace_path is not None and audit_file(session.trace_path) == []
    resumed = open_session(Options(tools=("Read",), permission_mode="bypassPermissions", cwd=ws,
                                   sessions_dir=tmp_path / "s", setting_sources=(), resume=session.session_id),
                           client=model, owns_client=False)
    try:
        assert resumed.resumed and ids(resumed.history)[1:3] == [["t1", "t1_2"], ["t1", "t1_2"]]
        third = await resumed.run("and again")
    finally:
        await resumed.aclose()
    assert third.terminal_reason is TerminalReason.COMPLETED and third.result == "three"
    seen = _requests_pair(model)
    assert seen[1] == ["t1", "t1_2"]
    assert seen[3] == ["t1", "t1_2", "t1_3"]
    assert seen[5] == ["t1", "t1_2", "t1_3", "t1_2_2", "t1_4"]
    assert audit_file(session.trace_path) == []
