"""The wire view of a history (``agentfsm.runtime.request``) and the request checks the auditors share
(``agentfsm.auditing.checks``), each against an independent statement of its rule over generated inputs, plus
the cases at each boundary: the first message, the last, a tool id seen once, twice, across messages,
a result in the wrong message, a line of a session file that is torn, undecodable or no record."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.auditing.checks import (
    CODES,
    ERROR,
    INFO,
    INFO_CODES,
    WARNING,
    WARNING_CODES,
    Finding,
    MoveAt,
    Report,
    check_pairs,
    check_request,
    merge_roles,
    read_numbered,
    severity_of,
)
from agentfsm.machine.state import Message
from agentfsm.runtime.request import BASE_SYSTEM_PROMPT, normalize, system_blocks

# --- normalize ---------------------------------------------------------------------------------------

BLOCKS = st.sampled_from([
    {"type": "text", "text": "hi"},
    {"type": "text", "text": ""},
    {"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
    {"type": "tool_result", "tool_use_id": "t2", "content": "ok"},
    {"type": "image", "source": {"type": "base64", "data": "x", "media_type": "image/png"}},
])
MESSAGES = st.builds(lambda role, blocks: Message(role, tuple(blocks)), st.sampled_from(["user", "assistant"]),
                     st.lists(BLOCKS, max_size=4))


def _expected_wire(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Every non-empty block in order, consecutive same-role blocks in one message, and in a user
    message the tool results first (in their order), then the rest (in theirs). Where a user message's
    blocks join the one before and that one ends with a text, the text gets a newline (Claude Code
    2.1.332, tests/fidelity/conform/conform-11d939ce08.json)."""
    groups: list[tuple[str, list[dict[str, Any]]]] = []
    for m in messages:
        kept = [dict(b) for b in m.content if not (b.get("type") == "text" and not b.get("text"))]
        if not kept:
            continue
        if groups and groups[-1][0] == m.role:
            last = groups[-1][1][-1]
            if m.role == "user" and last["type"] == "text":
                groups[-1][1][-1] = {**last, "text": last["text"] + "\n"}
            groups[-1][1].extend(kept)
        else:
            groups.append((m.role, kept))
    out = []
    for role, blocks in groups:
        if role == "user":
            blocks = ([b for b in blocks if b["type"] == "tool_result"]
                      + [b for b in blocks if b["type"] != "tool_result"])
        out.append({"role": role, "content": blocks})
    return out


@given(st.lists(MESSAGES, max_size=8))
def test_normalize_merges_roles_drops_empty_texts_and_puts_results_first(messages: list[Message]) -> None:
    assert normalize(messages) == _expected_wire(messages)


def test_normalize_cases() -> None:
    result = {"type": "tool_result", "tool_use_id": "a", "content": "ok"}
    wire = normalize([Message("user", "go"), Message("assistant", ""), Message("user", (
        {"type": "text", "text": "note"}, result))])
    # the empty answer is dropped, so the three user parts travel as one message, the result first; the
    # text the next message joins ends with a newline
    assert wire == [{"role": "user", "content": [result, {"type": "text", "text": "go\n"},
                                                 {"type": "text", "text": "note"}]}]
    # an assistant message keeps its order (only user messages put results first)
    use = {"type": "tool_use", "id": "a", "name": "Read", "input": {}}
    assert normalize([Message("assistant", (use, {"type": "text", "text": "x"}))])[0]["content"][0] == use
    assert normalize([]) == []


def test_normalize_does_not_change_the_history() -> None:
    m = Message("user", ({"type": "text", "text": "a"}, {"type": "tool_result", "tool_use_id": "t", "content": "x"}))
    before = [dict(b) for b in m.content]
    wire = normalize([m, Message("user", "b")])
    wire[0]["content"].append({"type": "text", "text": "added"})
    assert [dict(b) for b in m.content] == before


# --- system blocks -----------------------------------------------------------------------------------


def test_system_blocks_default_custom_append_and_extra(tmp_path: Path) -> None:
    default = system_blocks(tmp_path, system_prompt=None, append=None)
    assert default[0] == {"type": "text", "text": BASE_SYSTEM_PROMPT} and len(default) == 2
    env = default[1]["text"]
    assert f"Working directory: {tmp_path}\n" in env and "Is git repo: False" in env
    (tmp_path / ".git").mkdir()
    assert "Is git repo: True" in system_blocks(tmp_path, system_prompt=None, append=None)[1]["text"]
    custom = system_blocks(tmp_path, system_prompt="mine", append="after", extra=("x1", "", "x2"))
    assert [b["text"] for b in custom][:1] == ["mine"]
    assert [b["text"] for b in custom][2:] == ["x1", "x2", "after"]  # empty texts dropped, append last
    # an empty custom prompt replaces the default (and, empty, is not sent)
    assert system_blocks(tmp_path, system_prompt="", append="")[0]["text"].startswith("Environment:")


def test_added_directories_are_listed_resolved_and_only_when_there_are_some(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    env = system_blocks(tmp_path, system_prompt=None, append=None, add_dirs=(Path("lib"), tmp_path / "x" / ".."))[1]
    assert f"Additional working directories:\n  - {tmp_path / 'lib'}\n  - {tmp_path}\nPlatform:" in env["text"]
    assert "Additional working directories" not in system_blocks(tmp_path, system_prompt=None, append=None)[1]["text"]


def test_an_identity_comes_first_and_none_is_not_sent(tmp_path: Path) -> None:
    blocks = system_blocks(tmp_path, system_prompt="mine", append=None, identity="I am the agent")
    assert [b["text"] for b in blocks][:2] == ["I am the agent", "mine"]
    assert system_blocks(tmp_path, system_prompt="mine", append=None, identity=None)[0]["text"] == "mine"


# --- tool aliases on the wire ----------------------------------------------------------------------


def test_a_call_made_by_an_alias_goes_back_under_the_tools_own_name() -> None:
    names = {"KillShell": "TaskStop"}
    history = [Message("user", "go"),
               Message("assistant", ({"type": "text", "text": "stopping"},
                                     {"type": "tool_use", "id": "k", "name": "KillShell", "input": {}},
                                     {"type": "tool_use", "id": "r", "name": "Read", "input": {}}), kind="assistant"),
               Message("user", ({"type": "tool_result", "tool_use_id": "k", "content": "KillShell"},
                                {"type": "text", "text": "KillShell", "name": "KillShell"}), kind="tool_results")]
    wire = normalize(history, names)
    assert [b.get("name") for b in wire[1]["content"]] == [None, "TaskStop", "Read"]
    assert wire[2] == normalize(history)[2]  # a user message is never renamed
    assert history[1].content[1]["name"] == "KillShell"  # the history keeps the model's name
    assert normalize(history)[1]["content"][1]["name"] == "KillShell"  # no aliases, no renaming


# --- check_request -----------------------------------------------------------------------------------


def use(i: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": i, "name": "Read", "input": {}}


def res(i: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": i, "content": "ok"}


def msg(role: str, *blocks: Any) -> dict[str, Any]:
    return {"role": role, "content": [b if isinstance(b, Mapping) else {"type": "text", "text": b} for b in blocks]}


def codes(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    found = [c for c, _ in check_request(messages)]
    assert set(found) <= set(CODES), "every code a check yields is documented (agentfsm audit --codes)"
    return found


def test_a_well_paired_request_has_no_problem() -> None:
    assert codes([msg("user", "go"), msg("assistant", use("a"), use("b")), msg("user", res("b"), res("a")),
                  msg("assistant", "done")]) == []
    assert codes([]) == []


@pytest.mark.parametrize("roles, at", [
    (["assistant"], 0),
    (["user", "user"], 1),
    (["user", "assistant", "assistant"], 2),
    (["user", "assistant", "user", "user", "assistant"], 3),
    (["user", "system"], 1),
])
def test_roles_must_alternate_from_user_and_one_finding_says_so(roles: list[str], at: int) -> None:
    found = [(c, m) for c, m in check_request([msg(r, "x") for r in roles]) if c == "role_order"]
    assert len(found) == 1 and found[0][1].startswith(f"messages[{at}] has role {roles[at]!r}")
    expected = "user" if at % 2 == 0 else "assistant"
    assert f"where {expected!r} is due" in found[0][1]
    assert ("after" in found[0][1]) == (at > 0)


def test_a_tool_id_repeated_in_a_later_message_is_a_duplicate_not_an_unpaired_call() -> None:
    got = list(check_request([msg("user", "go"), msg("assistant", use("a")), msg("user", res("a")),
                              msg("assistant", use("a")), msg("user", res("a"))]))
    assert [c for c, _ in got] == ["duplicate_tool_use"]
    assert "'a'" in got[0][1] and "messages[3]" in got[0][1]


def test_a_tool_id_repeated_in_one_message_is_a_duplicate() -> None:
    got = codes([msg("user", "go"), msg("assistant", use("a"), use("a")), msg("user", res("a"))])
    assert got == ["duplicate_tool_use"]


@pytest.mark.parametrize("n, code", [(0, "unpaired_tool_use"), (1, None), (2, "duplicate_tool_result"),
                                     (3, "duplicate_tool_result")])
def test_each_call_is_answered_exactly_once_in_the_next_message(n: int, code: str | None) -> None:
    got = list(check_request([msg("user", "go"), msg("assistant", use("a")), msg("user", *[res("a")] * n, "more")]))
    assert [c for c, _ in got] == ([code] if code else [])
    if code == "duplicate_tool_result":
        assert f"has {n} tool_results in messages[2]" in got[0][1]


def test_an_answer_two_messages_later_does_not_pair() -> None:
    got = list(check_request([msg("user", "go"), msg("assistant", use("a")), msg("user", "hm"),
                              msg("assistant", "ok"), msg("user", res("a"))]))
    assert [c for c, _ in got] == ["unpaired_tool_use", "orphan_tool_result"]
    assert "in messages[1] has no tool_result in messages[2]" in got[0][1]
    assert "in messages[4] has no tool_use with that id in messages[3]" in got[1][1]


def test_a_call_in_the_last_message_has_no_next_message() -> None:
    got = list(check_request([msg("user", "go"), msg("assistant", use("a"))]))
    assert got == [("unpaired_tool_use", "tool_use 'a' (Read) in messages[1] has no tool_result in a next message "
                                         "(there is none)")]


def test_a_result_in_the_first_message_has_no_call() -> None:
    got = list(check_request([msg("user", res("a"))]))
    assert got == [("orphan_tool_result", "tool_result for 'a' in messages[0] has no tool_use with that id in a "
                                          "previous message (there is none)")]


def test_results_after_a_user_message_answer_nothing() -> None:
    # the roles are wrong too; the pairing is still judged on the previous message's role
    got = codes([msg("user", "go"), msg("user", res("a"))])
    assert got == ["role_order", "orphan_tool_result"]


def test_calls_followed_by_an_assistant_message_are_unanswered() -> None:
    assert "unpaired_tool_use" in codes([msg("user", "go"), msg("assistant", use("a")), msg("assistant", res("a"))])


def test_skeletons_with_blocks_and_unreadable_contents() -> None:
    skeleton = [{"role": "user", "blocks": [{"type": "text"}]}, {"role": "assistant", "blocks": [use("a")]},
                {"role": "user", "blocks": [res("a")]}]
    assert codes(skeleton) == []
    # content that is no list, blocks that are no objects: nothing to pair, nothing raised
    assert codes([{"role": "user", "content": "text"}, {"role": "assistant", "content": [1, "x", use("a")]},
                  {"role": "user", "content": None}]) == ["unpaired_tool_use"]


# an independent statement of the pairing rules, over generated conversations
IDS = st.sampled_from(["a", "b", "c"])
CONVERSATION = st.lists(st.tuples(st.lists(IDS, max_size=3), st.lists(IDS, max_size=3)), max_size=5)


def _expected_pairing(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    called: set[str] = set()
    for i, m in enumerate(messages):
        blocks = m["content"]
        if m["role"] == "assistant":
            nxt = messages[i + 1]["content"] if i + 1 < len(messages) else []
            for b in blocks:
                if b["type"] != "tool_use":
                    continue
                if b["id"] in called:
                    found.append(("duplicate_tool_use", b["id"]))
                    continue
                called.add(b["id"])
                n = sum(1 for r in nxt if r["type"] == "tool_result" and r["tool_use_id"] == b["id"])
                if n != 1:
                    found.append(("unpaired_tool_use" if n == 0 else "duplicate_tool_result", b["id"]))
        else:
            before = {b["id"] for b in messages[i - 1]["content"] if b["type"] == "tool_use"} if i else set()
            found += [("orphan_tool_result", b["tool_use_id"]) for b in blocks
                      if b["type"] == "tool_result" and b["tool_use_id"] not in before]
    return found


@given(st.lists(IDS, max_size=2), CONVERSATION)
def test_pairing_findings_follow_the_rule(opening: list[str], turns: list[tuple[list[str], list[str]]]) -> None:
    messages = [msg("user", "go", *[res(i) for i in opening])]
    for calls, answers in turns:
        messages += [msg("assistant", "x", *[use(i) for i in calls]), msg("user", *[res(i) for i in answers], "y")]
    got = [(c, re.search(r"'(\w+)'", m).group(1)) for c, m in check_request(messages)]  # type: ignore[union-attr]
    assert {c for c, _ in got} <= set(CODES)
    assert got == _expected_pairing(messages)


def test_check_pairs_merges_roles_and_reports_only_pairing() -> None:
    history = [Message("user", "go"), Message("assistant", (use("a"),)), Message("user", (res("a"),)),
               Message("user", "queued input"), Message("assistant", (use("b"),))]
    assert [c for c, _ in check_pairs(history)] == ["unpaired_tool_use"]
    # the same history unmerged would put two user messages in a row: no role_order from check_pairs
    assert [c for c, _ in check_pairs([Message("user", "a"), Message("user", (res("x"),))])] == ["orphan_tool_result"]


def test_merge_roles_keeps_the_first_messages_kind_and_uuid() -> None:
    a, b, c = Message("user", "a", kind="prompt", uuid="u1"), Message("user", "b", kind="meta", uuid="u2"), \
        Message("assistant", "c", kind="assistant", uuid="u3")
    merged = merge_roles([a, b, c, Message("assistant", "d")])
    assert [(m.role, m.kind, m.uuid) for m in merged] == [("user", "prompt", "u1"), ("assistant", "assistant", "u3")]
    assert [bl["text"] for bl in merged[0].content] == ["a", "b"]
    assert [bl["text"] for bl in merged[1].content] == ["c", "d"]


# --- findings and reading a file by line ----------------------------------------------------------------


def test_every_code_has_one_severity() -> None:
    assert WARNING_CODES <= set(CODES) and INFO_CODES <= set(CODES) and not WARNING_CODES & INFO_CODES
    for code in CODES:
        expected = INFO if code in INFO_CODES else WARNING if code in WARNING_CODES else ERROR
        assert severity_of(code) == expected == Finding(1, code, "m").severity
    f = Finding(7, "unpaired_tool_use", "says")
    assert f.is_error and not f.is_warning and str(f) == "line 7: error [unpaired_tool_use] says"
    w = Finding(2, "torn_last_line", "cut")
    assert w.is_warning and not w.is_error
    i = Finding(3, "client_version", "aside")
    assert not i.is_warning and not i.is_error
    assert f.to_json() == {"line": 7, "code": "unpaired_tool_use", "severity": "error", "level": "error",
                           "message": "says"}


def test_read_numbered_numbers_lines_and_reports_each_kind_of_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    lines = [json.dumps({"type": "a"}), "", "not json", json.dumps([1]), json.dumps({"no": "type"}),
             json.dumps({"type": "b", "t": "é"})]
    raw = "\n".join(lines).encode() + b"\n" + b'{"type": "c", "bad": "\xff"}\n' + b'{"type": "torn"'
    path.write_bytes(raw)
    records, findings = read_numbered(path)
    assert [(n, r["type"]) for n, r in records] == [(1, "a"), (6, "b"), (7, "c")]
    assert [(f.line, f.code) for f in findings] == [(3, "unreadable_line"), (4, "unreadable_line"),
                                                    (5, "unreadable_line"), (7, "undecodable_line"),
                                                    (8, "torn_last_line")]
    assert "at byte" in findings[3].message and "(15 bytes, no newline)" in findings[4].message


def test_a_torn_line_ends_the_reading_and_a_whole_last_line_is_read(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"type": "a"}\n{"type": "b"}\n')
    assert [r["type"] for _, r in read_numbered(path)[0]] == ["a", "b"] and read_numbered(path)[1] == []
    path.write_bytes(b'{"type": "a"}\n{"type": "b"}')
    records, findings = read_numbered(path)
    assert [r["type"] for _, r in records] == ["a"] and [f.code for f in findings] == ["torn_last_line"]


def test_a_record_nested_too_deeply_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text("[" * 100000 + "]" * 100000 + "\n" + json.dumps({"type": "a"}) + "\n")
    records, findings = read_numbered(path)
    assert [r["type"] for _, r in records] == ["a"] and [f.code for f in findings] == ["unreadable_line"]


def test_a_reports_json_names_every_part() -> None:
    move = MoveAt("end_turn", "stream", "stop", 6, reason="completed")
    assert move.to_json() == {"from": "stream", "to": "stop", "label": "end_turn", "line": 6}
    assert MoveAt("x", "a", "b", 2, declared=False).to_json()["declared"] is False
    finding = Finding(6, "torn_last_line", "cut")
    report = Report("p.jsonl", "agentfsm", (move,), "completed", {"turn": 1}, (finding,))
    assert report.to_json() == {
        "path": "p.jsonl", "source": "agentfsm", "moves": [move.to_json()], "terminal_reason": "completed",
        "counters": {"turn": 1}, "errors": 0, "warnings": 1, "findings": [{"path": "p.jsonl", **finding.to_json()}]}
    full = Report("p", "cc", (), None, {}, (), internal=((3, "retry", "why"),), version="2.1.332").to_json()
    assert full["internal"] == [{"line": 3, "action": "retry", "detail": "why"}]
    assert full["client_version"] == "2.1.332"


@pytest.mark.parametrize(("roles", "said"), [
    (["user", "user"], "messages[1] has role 'user' after 'user' where 'assistant' is due"),
    (["user", "assistant", "assistant"], "messages[2] has role 'assistant' after 'assistant' where 'user' is due"),
    (["user", "system"], "messages[1] has role 'system' after 'user' where 'assistant' is due"),
    (["assistant"], "messages[0] has role 'assistant' where 'user' is due"),
])
def test_a_role_out_of_order_names_the_message_before_it(roles: list[str], said: str) -> None:
    [(code, message)] = list(check_request([{"role": r, "content": []} for r in roles]))
    assert code == "role_order" and message.startswith(said)


def test_pairing_reports_a_tool_use_id_used_twice() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}
    answer = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    conversation = [Message("user", ({"type": "text", "text": "go"},)), Message("assistant", (use,)),
                    Message("user", (answer,)), Message("assistant", (use,)), Message("user", (answer,))]
    assert [code for code, _ in check_pairs(conversation)] == ["duplicate_tool_use"]
