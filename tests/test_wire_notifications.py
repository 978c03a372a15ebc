"""Where a task notification goes on the wire (agentfsm.runtime.request, by the graph's
notification_place): one taken while the run goes on rides inside the last tool result of the batch it
joins, as Claude Code 2.1.332 sends it (tests/fixtures/background/notification_mid_run); one that
starts a pass, or follows a prompt, stays a message's own text. Issue 35: 38 mutants of this code
survived the request module's tests, which never built such a history."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.machine.graph import PASS_NOTIFICATION, RUN_NOTIFICATION
from agentfsm.machine.state import Message
from agentfsm.runtime.request import WireCache, normalize

NOTE = "<task-notification>done</task-notification>"


def prompt(text: str = "go") -> Message:
    return Message("user", ({"type": "text", "text": text},), kind="prompt")


def calls(*ids: str) -> Message:
    return Message("assistant", tuple({"type": "tool_use", "id": i, "name": "Read", "input": {}} for i in ids),
                   kind="assistant")


def results(*contents: Any, tail: tuple[dict[str, Any], ...] = ()) -> Message:
    blocks = tuple({"type": "tool_result", "tool_use_id": f"t{n}", "content": c} for n, c in enumerate(contents))
    return Message("user", (*blocks, *tail), kind="tool_results")


def note(*blocks: dict[str, Any], kind: str = RUN_NOTIFICATION) -> Message:
    return Message("user", blocks or ({"type": "text", "text": NOTE},), kind=kind)


def last_user(history: list[Message]) -> list[dict[str, Any]]:
    wire = normalize(history)
    assert wire[-1]["role"] == "user"
    return wire[-1]["content"]


@pytest.mark.parametrize(("content", "joined"), [
    ("file text", f"file text\n\n{NOTE}"),
    ("file text \n\n", f"file text\n\n{NOTE}"),  # its trailing white space cut, one blank line between
    ("", NOTE),
    (None, NOTE),
    ([{"type": "text", "text": "a"}], [{"type": "text", "text": "a"}, {"type": "text", "text": NOTE}]),
])
def test_a_notification_mid_run_goes_inside_the_last_tool_result(content: Any, joined: Any) -> None:
    history = [prompt(), calls("t0"), results(content), note()]
    [result] = last_user(history)
    assert result["type"] == "tool_result" and result["tool_use_id"] == "t0"
    assert result["content"] == joined


def test_only_the_last_result_takes_it_and_what_follows_it_stays() -> None:
    marker = {"type": "text", "text": "[Request interrupted by user]"}
    history = [prompt(), calls("t0", "t1"), results("first", "second", tail=(marker,)), note()]
    content = last_user(history)
    assert content == [
        {"type": "tool_result", "tool_use_id": "t0", "content": "first"},
        {"type": "tool_result", "tool_use_id": "t1", "content": f"second\n\n{NOTE}"},
        marker,
    ]
    assert history[2].content[1]["content"] == "second", "the history itself is not changed"


def test_each_text_of_a_notification_goes_in_and_another_block_follows_in_the_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    history = [prompt(), calls("t0"), results("r"),
               note(image, {"type": "text", "text": "one"}, {"type": "text", "text": "two"})]
    assert last_user(history) == [{"type": "tool_result", "tool_use_id": "t0", "content": "r\n\none\n\ntwo"}, image]


def test_what_comes_after_the_notification_is_still_sent() -> None:
    history = [prompt(), calls("t0"), results("r"), note(), Message("assistant", ({"type": "text", "text": "ok"},)),
               prompt("next")]
    wire = normalize(history)
    assert [m["role"] for m in wire] == ["user", "assistant", "user", "assistant", "user"]
    assert wire[2]["content"][0]["content"] == f"r\n\n{NOTE}"
    assert wire[-1]["content"] == [{"type": "text", "text": "next"}]


@pytest.mark.parametrize("history", [
    [prompt(), note()],  # after a prompt: no result to go in
    [prompt(), calls("t0"), results("r"), note(kind=PASS_NOTIFICATION)],  # it starts a pass: its own text
], ids=["after-a-prompt", "a-pass-notification"])
def test_otherwise_it_stays_text_of_its_own(history: list[Message]) -> None:
    content = last_user(history)
    assert {"type": "text", "text": NOTE} in content
    assert all(NOTE not in str(b.get("content", "")) for b in content if b.get("type") == "tool_result")


def test_a_notification_after_an_answer_is_a_user_message_of_its_own() -> None:
    history = [prompt(), calls("t0"), results("r"), Message("assistant", ({"type": "text", "text": "a"},)), note()]
    wire = normalize(history)
    assert wire[-1] == {"role": "user", "content": [{"type": "text", "text": NOTE}]}
    assert wire[2]["content"][0]["content"] == "r"


KINDS = st.sampled_from(["prompt", "tool_results", RUN_NOTIFICATION, PASS_NOTIFICATION])
HISTORIES = st.lists(st.one_of(
    st.builds(lambda t: prompt(t), st.sampled_from(["go", "on"])),
    st.builds(lambda: calls("t0")),
    st.builds(lambda c: results(c), st.sampled_from(["r", "", "r \n", None])),
    st.builds(lambda k: note(kind=k), KINDS),
), max_size=8)


@settings(max_examples=200, deadline=None)
@given(HISTORIES)
def test_the_incremental_wire_places_notifications_as_a_fresh_one_does(history: list[Message]) -> None:
    cache = WireCache()
    for n in range(len(history) + 1):
        assert cache.wire(tuple(history[:n])) == normalize(history[:n])
