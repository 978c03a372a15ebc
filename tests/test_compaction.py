"""Compaction and context accounting, by their rules: the token estimate that decides auto-compaction,
the split between what is summarised and what is kept, the summary request, and every way a
summarisation fails (an error, a broken or unfinished stream, a response with no text). Then, end to
end, the prompt-too-long errors the graph answers by compacting and the ones it will not.

Each boundary is tested on both sides, and the split against an independent statement of it over
generated histories."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_recovery import run_session  # the recovery tests' session runner, audit included

from agentfsm.llm.model import BlockDelta, BlockStart, BlockStop, MessageDelta, MessageStart, ModelRequest
from agentfsm.machine import prompts
from agentfsm.machine.state import Limits, Message, TerminalReason
from agentfsm.runtime.compact import (
    CHARS_PER_TOKEN,
    EMPTY_SUMMARY,
    NO_SUMMARY_MESSAGE,
    Split,
    chars_of,
    compact,
    estimate_tokens,
    reactive_split,
    reread_reminders,
    split_for_compaction,
    summary_request,
)
from agentfsm.runtime.request import normalize
from agentfsm.testing import oracle
from agentfsm.testing.scripted import ScriptedModel

SYSTEM = ({"type": "text", "text": "sys"},)
PTL = {"status": 400, "error_type": "invalid_request_error",
       "message": "prompt is too long: 212345 tokens > 200000 maximum"}


def user(text: str = "u") -> Message:
    return Message("user", text)


def said(text: str = "a") -> Message:
    return Message("assistant", text, kind="assistant")


def calls(*ids: str) -> Message:
    return Message("assistant", tuple({"type": "tool_use", "id": i, "name": "Read", "input": {}} for i in ids),
                   kind="assistant")


def results(*ids: str) -> Message:
    return Message("user", tuple({"type": "tool_result", "tool_use_id": i, "content": "x"} for i in ids),
                   kind="tool_results")


def sized(chars: int) -> Message:
    """A user message whose serialised content is exactly ``chars`` characters."""
    overhead = chars_of([{"type": "text", "text": ""}])
    m = user("x" * (chars - overhead))
    assert chars_of([dict(b) for b in m.content]) == chars
    return m


# --- the token estimate ----------------------------------------------------------------------------


@pytest.mark.parametrize("chars, tokens", [(399, 99), (400, 100), (401, 100), (403, 100), (404, 101)])
def test_without_usage_the_estimate_is_characters_over_four_rounded_down(chars: int, tokens: int) -> None:
    assert CHARS_PER_TOKEN == 4
    assert estimate_tokens([sized(chars)]) == tokens


def test_without_usage_every_message_counts_and_the_static_part_is_added() -> None:
    msgs = [sized(400), said("y" * 100), sized(800)]
    every = sum(chars_of([dict(b) for b in m.content]) for m in msgs) // 4
    assert estimate_tokens(msgs) == every
    assert estimate_tokens(msgs, static_tokens=37) == every + 37
    assert estimate_tokens(msgs[:2]) < estimate_tokens(msgs)  # the last one counts
    assert estimate_tokens(msgs[1:]) < estimate_tokens(msgs)  # and the first


@pytest.mark.parametrize("key", ["input_tokens", "output_tokens", "cache_creation_input_tokens",
                                 "cache_read_input_tokens"])
def test_each_reported_usage_field_counts(key: str) -> None:
    msgs = [sized(400), said()]
    assert estimate_tokens(msgs, {key: 1000}, counted_upto=2) == 1000
    # the other fields add to it, and a missing or null one is nothing
    assert estimate_tokens(msgs, {key: 1000, "input_tokens" if key != "input_tokens" else "output_tokens": 5,
                                  "cache_read_input_tokens" if key != "cache_read_input_tokens" else "x": None},
                           counted_upto=2) == 1005


def test_a_reported_usage_replaces_the_static_part_and_what_the_last_request_carried() -> None:
    before = [sized(4000), said("z" * 4000)]
    assert estimate_tokens(before, {"input_tokens": 10}, counted_upto=2, static_tokens=999) == 10


def test_only_user_messages_after_the_last_request_are_estimated_on_top_of_the_usage() -> None:
    carried = [sized(400)]
    answer = said("w" * 4000)  # the response itself: already in output_tokens
    fresh = sized(800)
    usage = {"input_tokens": 100, "output_tokens": 20}
    assert estimate_tokens([*carried, answer], usage, counted_upto=1) == 120
    assert estimate_tokens([*carried, answer, fresh], usage, counted_upto=1) == 120 + 200


def test_without_counted_upto_every_message_is_new_since_the_usage() -> None:
    """The default says the last request carried none of these messages: every user message, the
    first and the last included, is estimated on top of the usage."""
    msgs = [sized(400), said("w" * 4000), sized(800), sized(40)]  # 100, (the answer), 200 and 10 tokens
    assert estimate_tokens(msgs, {"input_tokens": 100}) == 100 + 310


@pytest.mark.parametrize("upto, expected", [(0, 100 + 310), (1, 100 + 210), (2, 100 + 10), (3, 100)])
def test_counted_upto_is_the_index_of_the_first_message_not_carried(upto: int, expected: int) -> None:
    msgs = [sized(400), sized(800), sized(40)]  # 100, 200 and 10 tokens
    assert estimate_tokens(msgs, {"input_tokens": 100}, counted_upto=upto) == expected


@pytest.mark.parametrize("usage", [None, {}, {"input_tokens": 0, "output_tokens": 0}, {"input_tokens": None}])
def test_a_usage_that_reports_nothing_falls_back_to_the_full_estimate(usage: dict[str, Any] | None) -> None:
    msgs = [sized(400), said(), sized(800)]
    assert estimate_tokens(msgs, usage, counted_upto=3, static_tokens=7) == estimate_tokens(msgs) + 7
    assert estimate_tokens(msgs) == sum(chars_of([dict(b) for b in m.content]) for m in msgs) // 4


@given(st.lists(st.text(max_size=60), min_size=1, max_size=6), st.text(max_size=60), st.integers(0, 50))
def test_appending_a_message_never_lowers_the_estimate(texts: list[str], more: str, static: int) -> None:
    msgs = [user(t) for t in texts]
    assert estimate_tokens([*msgs, user(more)], static_tokens=static) >= estimate_tokens(msgs, static_tokens=static)


# --- the split ---------------------------------------------------------------------------------------


def _expected_split(messages: Sequence[Message]) -> tuple[list[Message], list[Message]] | None:
    """The rule, stated independently: keep from the last assistant message that calls tools; without
    one, keep the trailing user messages; summarise the rest, if it holds an answer."""
    uses = [i for i, m in enumerate(messages) if m.role == "assistant" and m.tool_use_ids()]
    if uses:
        cut = uses[-1]
    else:
        trailing = 0
        for m in reversed(messages):
            if m.role != "user":
                break
            trailing += 1
        cut = len(messages) - trailing
    head = list(messages[:cut])
    return (head, list(messages[cut:])) if any(m.role == "assistant" for m in head) else None


def test_the_split_keeps_the_last_tool_exchange() -> None:
    msgs = [user(), calls("a"), results("a"), said(), user("again"), calls("b", "c"), results("b", "c")]
    assert split_for_compaction(msgs) == (msgs[:5], msgs[5:])


def test_the_split_keeps_the_last_of_two_tool_exchanges_not_the_first() -> None:
    msgs = [user(), calls("a"), results("a"), calls("b"), results("b")]
    assert split_for_compaction(msgs) == (msgs[:3], msgs[3:])


def test_an_answer_without_tool_calls_is_no_cut_point() -> None:
    msgs = [user(), said(), user(), calls("a"), results("a"), said("text only"), user("next")]
    assert split_for_compaction(msgs) == (msgs[:3], msgs[3:])
    # the cut is the tool exchange even when it leaves nothing to summarise
    assert split_for_compaction(msgs[2:]) is None


def test_without_tool_calls_the_trailing_user_messages_are_kept() -> None:
    msgs = [user(), said(), user("one"), user("two")]
    assert split_for_compaction(msgs) == (msgs[:2], msgs[2:])
    assert split_for_compaction(msgs[:2]) == (msgs[:2], [])  # nothing trailing: everything is summarised
    assert split_for_compaction(msgs[:3]) == (msgs[:2], msgs[2:3])


@pytest.mark.parametrize("msgs", [
    [],
    [user()],
    [user(), user()],
    [user(), calls("a"), results("a")],  # one exchange: the head [user] has no answer
])
def test_a_history_with_no_earlier_answer_cannot_be_split(msgs: list[Message]) -> None:
    expected = _expected_split(msgs)
    assert split_for_compaction(msgs) == expected
    if msgs and msgs[0].role == "user":
        assert expected is None


def test_one_answer_before_the_kept_exchange_is_enough() -> None:
    msgs = [user(), said(), user(), calls("a"), results("a")]
    assert split_for_compaction(msgs) == (msgs[:3], msgs[3:])
    # and without that answer there is nothing to summarise
    assert split_for_compaction([msgs[0], msgs[2], *msgs[3:]]) is None


_KINDS = st.sampled_from(["user", "said", "calls", "results"])


def _history(kinds: list[str]) -> list[Message]:
    make = {"user": lambda n: user(f"u{n}"), "said": lambda n: said(f"a{n}"), "calls": lambda n: calls(f"t{n}"),
            "results": lambda n: results(f"t{n - 1}")}
    return [make[k](n) for n, k in enumerate(kinds)]


@given(st.lists(_KINDS, max_size=12))
def test_the_split_follows_its_rule_over_any_history(kinds: list[str]) -> None:
    msgs = _history(kinds)
    got = split_for_compaction(msgs)
    assert got == _expected_split(msgs)
    if got is not None:
        head, tail = got
        assert head + tail == msgs and head
        assert not [m for m in tail[1:] if m.role == "assistant" and m.tool_use_ids()]


# --- the reactive split: what Claude Code 2.1.332 summarises after a prompt too long ---------------------

SIZED = "prompt is too long: 210000 tokens > 200000 maximum"
BARE = "prompt is too long"


def _expected_reactive(messages: Sequence[Message], sized: bool) -> tuple[int, bool] | None:
    """The rule, stated by counting responses (docs/conform.md): how many of the N responses are summarised
    (N meaning all of it), and whether the prompt is left out. With the sizes in the API's message, the
    older half of the rounds, the prompt's round counted: (N + 1) // 2 rounds, the prompt and at least one
    response; without them, all but the last response. None without a response."""
    n = sum(m.role == "assistant" for m in messages)
    if n == 0:
        return None
    k = max(1, (n + 1) // 2 - 1) if sized else n - 1
    if k == 0 or k >= n:
        return n, sized and messages[0].role == "user"
    return k, False


_ROUND = st.sampled_from(["calls", "said", "said_user", "calls2"])


def _rounds(prompt: int, kinds: list[str]) -> list[Message]:
    msgs = [user(f"p{i}") for i in range(prompt)]
    for n, k in enumerate(kinds):
        if k == "calls":
            msgs += [calls(f"t{n}"), results(f"t{n}")]
        elif k == "calls2":
            msgs += [calls(f"t{n}", f"s{n}"), results(f"t{n}", f"s{n}"), user(f"more{n}")]
        elif k == "said":
            msgs.append(said(f"a{n}"))
        else:
            msgs += [said(f"a{n}"), user(f"u{n}")]
    return msgs


@given(st.integers(1, 2), st.lists(_ROUND, max_size=14), st.booleans())
def test_the_reactive_split_follows_claude_codes_rule_over_any_history(prompt: int, kinds: list[str],
                                                                       sized: bool) -> None:
    msgs = _rounds(prompt, kinds)
    got = reactive_split(msgs, SIZED if sized else BARE)
    expected = _expected_reactive(msgs, sized)
    if expected is None:
        assert got is None
        return
    k, truncated = expected
    assert got is not None and got.truncated == truncated
    if k == len(kinds):  # all of it: nothing kept, the prompt left out when truncated
        assert got.kept == () and got.summarised == tuple(msgs[prompt:] if truncated else msgs)
        return
    answers = [i for i, m in enumerate(msgs) if m.role == "assistant"]
    assert got.summarised == tuple(msgs[:answers[k]]) and got.kept == tuple(msgs[answers[k]:])
    assert sum(m.role == "assistant" for m in got.summarised) == k


# N responses after the prompt, the API's message, and how many responses Claude Code 2.1.332 summarised
# (oracle runs of issue 27; "all" = the whole conversation, nothing kept): both sides of each boundary
@pytest.mark.parametrize("n, message, summarised", [
    (1, SIZED, "all"), (2, SIZED, 1), (3, SIZED, 1), (4, SIZED, 1), (5, SIZED, 2), (6, SIZED, 2), (7, SIZED, 3),
    (8, SIZED, 3), (9, SIZED, 4), (12, SIZED, 5),
    (4, "prompt is too long: 200001 tokens > 200000 maximum", 1), (4, "prompt is too long: 400000 tokens > "
                                                                      "200000 maximum", 1),
    (6, "prompt is too long: 150000 tokens > 100000 maximum", 2),
    (1, BARE, "all"), (2, BARE, 1), (3, BARE, 2), (4, BARE, 3), (10, BARE, 9),
])
def test_the_reactive_split_summarises_what_claude_code_did(n: int, message: str, summarised: Any) -> None:
    msgs = _rounds(1, ["calls"] * n)
    got = reactive_split(msgs, message)
    assert got is not None
    if summarised == "all":
        assert got.kept == ()
        assert sum(m.role == "assistant" for m in got.summarised) == n
    else:
        assert sum(m.role == "assistant" for m in got.summarised) == summarised
        assert got.summarised + got.kept == tuple(msgs) and got.kept[0].role == "assistant"


def test_a_single_exchange_is_summarised_whole_and_only_sizes_leave_the_prompt_out() -> None:
    msgs = [user(), calls("a"), results("a")]
    assert reactive_split(msgs, SIZED) == Split(tuple(msgs[1:]), (), truncated=True)
    assert reactive_split(msgs, BARE) == Split(tuple(msgs), (), truncated=False)
    # the first request alone (no response yet) cannot be compacted
    assert reactive_split([user()], SIZED) is None and reactive_split([user(), user()], BARE) is None
    # an automatic compaction still finds nothing to do in a single exchange
    assert split_for_compaction(msgs) is None


def reads(tid: str, path: str) -> Message:
    return Message("assistant", ({"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": path}},),
                   kind="assistant")


def read_result(tid: str, text: str, *, error: bool = False) -> Message:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tid, "content": text}
    if error:
        block["is_error"] = True
    return Message("user", (block,), kind="tool_results")


def _called(path: str) -> str:
    called = f'Called the Read tool with the following input: {{"file_path":"{path}"}}'
    return f"<system-reminder>\n{called}\n</system-reminder>"


def _result(text: str) -> str:
    return f"<system-reminder>\nResult of calling the Read tool:\n{text}\n</system-reminder>"


def test_the_files_read_in_the_summarised_part_only_are_shown_again_latest_first() -> None:
    summarised = [user(), reads("r1", "/w/a"), read_result("r1", "1\tA"), reads("r2", "/w/b"),
                  read_result("r2", "1\tB"), reads("r3", "/w/c"), read_result("r3", "no such file", error=True),
                  reads("r4", "/w/d"), read_result("r4", "1\tD")]
    kept = [reads("r5", "/w/d"), read_result("r5", "1\tD2")]
    # a file read again in the kept part is not shown; a read that failed is not either
    assert reread_reminders(summarised, kept) == [_called("/w/b"), _result("1\tB"), _called("/w/a"), _result("1\tA")]
    # a file read twice is shown once, with what the latest read returned
    twice = [user(), reads("r1", "/w/a"), read_result("r1", "old"), reads("r2", "/w/a"), read_result("r2", "new")]
    assert reread_reminders(twice, []) == [_called("/w/a"), _result("new")]


async def test_a_reactive_compaction_keeps_the_later_rounds_and_shows_the_summarised_files_again() -> None:
    """Three Reads then a prompt too long with the sizes (tests/fidelity/recorded/compact_three_reads.json):
    the prompt and the first Read summarised, the two later rounds kept after the summary, with a note
    saying so, and the file read in the summarised part shown again after the last kept result."""
    msgs = [user("go"), reads("r1", "/w/a"), read_result("r1", "1\tA\n2\t"), reads("r2", "/w/b"),
            read_result("r2", "1\tB"), reads("r3", "/w/c"), read_result("r3", "1\tC\n2\t")]
    got, model, _ = await _compact([tagged("gist")], messages=msgs, trigger="reactive", api_message=SIZED)
    assert got is not None and model.count == 1
    asked = model.requests[0].messages
    assert [b.get("id") for m in asked for b in m["content"] if b["type"] == "tool_use"] == ["r1"]
    summary, *kept = got.messages
    assert summary.text() == (prompts.COMPACT_SUMMARY_PREFIX + "Summary:\ngist\n\n" + prompts.COMPACT_KEPT_NOTE)
    assert [m.uuid for m in kept] == [m.uuid for m in msgs[3:]]
    assert kept[:3] == msgs[3:6]
    # the result's trailing blanks go before a reminder is joined to it
    assert kept[3].content[0]["content"] == "1\tC\n2\n\n" + _called("/w/a") + "\n\n" + _result("1\tA\n2\t")


async def test_a_reactive_compaction_of_a_single_exchange_leaves_the_prompt_out_when_the_sizes_are_given() -> None:
    """One Read then a prompt too long (tests/fidelity/recorded/compact_one_read.json): with the sizes, the
    summary request has the truncation marker instead of the prompt and the summary says a part is not
    covered; the file comes first, then the summary. Without them, the prompt is summarised too."""
    msgs = [user("go"), reads("r1", "/w/a"), read_result("r1", "1\tA")]
    got, model, _ = await _compact([tagged("gist")], messages=msgs, trigger="reactive", api_message=SIZED)
    assert got is not None
    first = model.requests[0].messages[0]["content"][0]["text"]
    assert first == "[earlier conversation truncated for compaction retry]"
    assert [m.kind for m in got.messages] == ["compact_summary"]
    assert [b["text"] for b in got.messages[0].content] == [
        _called("/w/a"), _result("1\tA"),
        prompts.COMPACT_SUMMARY_PREFIX + "Summary:\ngist\n\n" + prompts.COMPACT_TRUNCATED_NOTE]
    got, model, _ = await _compact([tagged("gist")], messages=msgs, trigger="reactive", api_message=BARE)
    assert got is not None
    assert model.requests[0].messages[0]["content"][0]["text"] == "go"
    assert got.messages[0].content[-1]["text"] == prompts.COMPACT_SUMMARY_PREFIX + "Summary:\ngist"


def test_the_comparison_reads_both_clients_compaction_notes_by_what_they_say() -> None:
    """Claude Code's summary message (its words, from tests/fidelity/recorded/compact_*.json, less its
    prompt's long middle) and agentfsm's are written the same when they say the same."""
    cc = ("This session is being continued from a previous conversation that ran out of context. The summary "
          "below covers the earlier portion of the conversation.\n\n<system-reminder>\n<tools-used-before-summary>"
          "Read</tools-used-before-summary>\n</system-reminder>\nSummary:\ngist\n\nIf you need specific details "
          "from before compaction (...)\n\nNote: part of the earlier conversation was too large to include and is "
          "NOT covered by this summary (...).\nContinue the conversation from where it left off (...)\n\nThe "
          "messages after this summary are the most recent messages from before compaction, kept verbatim. (...)")
    ours = "\n\n".join([prompts.COMPACT_SUMMARY_PREFIX + "Summary:\ngist", prompts.COMPACT_TRUNCATED_NOTE,
                         prompts.COMPACT_KEPT_NOTE])
    assert oracle.compaction_text(cc) == oracle.compaction_text(ours) == \
        "<compact summary> Summary:\ngist <not covered> <kept verbatim>"
    plain = prompts.COMPACT_SUMMARY_PREFIX + "Summary:\ngist"
    assert oracle.compaction_text(plain) == "<compact summary> Summary:\ngist"
    assert oracle.compaction_text(plain + "\n\n" + prompts.COMPACT_KEPT_NOTE) != oracle.compaction_text(plain)


# --- the summary request -----------------------------------------------------------------------------


def test_the_summary_request_carries_the_head_and_the_instruction_and_offers_no_tools() -> None:
    msgs = [user("first"), said("answer"), user(), calls("a"), results("a")]
    built = summary_request(msgs, model="m-1", system=SYSTEM, max_tokens=123, metadata={"user_id": "u"})
    assert built is not None
    request, tail = built
    assert tail == msgs[3:]
    assert request.model == "m-1" and request.system == SYSTEM and request.max_tokens == 123
    assert request.tools == () and dict(request.metadata) == {"user_id": "u"}
    instruction = Message("user", prompts.COMPACT_INSTRUCTION, kind="meta")
    assert list(request.messages) == normalize([*msgs[:3], instruction])
    assert request.messages[-1]["content"][-1]["text"] == prompts.COMPACT_INSTRUCTION


@pytest.mark.parametrize("custom", [None, ""])
def test_no_custom_instructions_leave_the_instruction_alone(custom: str | None) -> None:
    built = summary_request([user(), said(), user()], model="m", system=SYSTEM, custom_instructions=custom)
    assert built is not None
    assert built[0].messages[-1]["content"][-1]["text"] == prompts.COMPACT_INSTRUCTION
    assert built[0].max_tokens == 8192 and dict(built[0].metadata) == {}


def test_custom_instructions_follow_the_instruction() -> None:
    built = summary_request([user(), said(), user()], model="m", system=SYSTEM, custom_instructions="keep paths")
    assert built is not None
    text = built[0].messages[-1]["content"][-1]["text"]
    assert text == prompts.COMPACT_INSTRUCTION + "\n\nAdditional instructions:\nkeep paths"


def test_no_summary_request_when_nothing_can_be_summarised() -> None:
    assert summary_request([user(), calls("a"), results("a")], model="m", system=SYSTEM) is None


# --- compact(): success and every failure --------------------------------------------------------------

HISTORY = [user("first"), said("answer"), user("more"), calls("a"), results("a")]


def text(t: str, **kw: Any) -> dict[str, Any]:
    return {"blocks": [{"type": "text", "text": t}], "stop_reason": "end_turn", **kw}


async def _compact(responses: Sequence[Any], messages: Sequence[Message] = HISTORY, **kw: Any) -> tuple[Any, Any,
                                                                                                        list[Any]]:
    model = ScriptedModel(list(responses), **kw.pop("model_kw", {}))
    usage: list[Any] = []
    got = await compact(model, model="m", system=SYSTEM, messages=messages, trigger=kw.pop("trigger", "auto"),
                        on_usage=lambda name, u: usage.append((name, u)), **kw)
    return got, model, usage


def tagged(t: str) -> dict[str, Any]:
    """A summary answer in the form asked for: working notes, then the summary block."""
    return text(f"<analysis>working notes</analysis>\n<summary>{t}</summary>")


async def test_a_summary_replaces_the_head_and_keeps_the_last_exchange() -> None:
    got, model, usage = await _compact([tagged("  the gist  ")], trigger="manual")
    assert got is not None and model.count == 1
    summary, *kept = got.messages
    assert kept == HISTORY[3:]
    assert summary.role == "user" and summary.kind == "compact_summary"
    # the <summary> block only, as "Summary:" (Claude Code 2.1.332's form); the notes are not kept
    assert summary.text() == prompts.COMPACT_SUMMARY_PREFIX + "Summary:\nthe gist"
    assert got.summary == "Summary:\nthe gist" and got.trigger == "manual"
    assert got.pre_tokens == estimate_tokens(HISTORY)
    assert len(usage) == 1 and usage[0][0] == "m" and usage[0][1]["output_tokens"] >= 0
    # the request: no tools, the default output budget (the loop passes none of its own)
    assert model.requests[0].tools == () and model.requests[0].max_tokens == 8192


async def test_the_summary_is_asked_with_the_callers_budget_instructions_and_metadata() -> None:
    got, model, _ = await _compact([text("gist")], max_tokens=321, custom_instructions="keep paths",
                                   metadata={"user_id": "u-1"})
    assert got is not None
    request = model.requests[0]
    assert request.max_tokens == 321 and dict(request.metadata) == {"user_id": "u-1"}
    assert request.messages[-1]["content"][-1]["text"].endswith("\n\nAdditional instructions:\nkeep paths")


async def test_the_summary_usage_is_charged_to_the_model_that_answered() -> None:
    got, _, usage = await _compact([tagged("gist")], model_kw={"model": "claude-other"})
    assert got is not None and [name for name, _ in usage] == ["claude-other"]


async def test_an_answer_without_its_summary_block_is_asked_again_once() -> None:
    """Claude Code 2.1.332 (docs/conform.md): asked once more, saying so; the second answer is taken when it
    has the block."""
    got, model, usage = await _compact([text("no tags here"), tagged("second")])
    assert got is not None and model.count == 2 and len(usage) == 2  # both requests are paid for
    assert got.summary == "Summary:\nsecond"
    first, again = (r.messages[-1]["content"][-1]["text"] for r in model.requests)
    assert again == first + "\n\n" + prompts.COMPACT_AGAIN
    assert model.requests[0].messages[:-1] == model.requests[1].messages[:-1]


@pytest.mark.parametrize("second", [text("still no tags"), text(""), {"status": 500, "error_type": "api_error",
                                                                        "message": "boom"}])
async def test_the_first_answer_stands_when_the_second_has_no_summary_block(second: dict[str, Any]) -> None:
    got, model, _ = await _compact([text("<analysis>notes</analysis> the first"), second, tagged("never asked")])
    assert got is not None and model.count == 2
    assert got.summary == "the first"  # its notes left out


async def test_a_summary_block_in_the_first_answer_asks_nothing_more() -> None:
    got, model, _ = await _compact([text("<summary>\n  alone \n</summary>"), tagged("never asked")])
    assert got is not None and model.count == 1 and got.summary == "Summary:\nalone"


@pytest.mark.parametrize("answer", [
    text(""),
    text("   \n "),
    {"blocks": [{"type": "thinking", "thinking": "hmm", "signature": "s"}], "stop_reason": "end_turn"},
    {"blocks": [{"type": "tool_use", "id": "x", "name": "Read", "input": {}}], "stop_reason": "tool_use"},
])
async def test_a_summary_without_text_is_a_failed_compaction(answer: dict[str, Any]) -> None:
    why: list[str] = []
    got, model, usage = await _compact([answer], on_failure=why.append)
    assert got is None and model.count == 1
    assert usage  # its cost still counts
    assert why == [EMPTY_SUMMARY]  # a response came, with no text in it


async def test_a_summary_of_no_blocks_is_no_message() -> None:
    why: list[str] = []
    got, _, _ = await _compact([{"blocks": [], "stop_reason": "end_turn"}], on_failure=why.append)
    assert got is None and why == [NO_SUMMARY_MESSAGE]


async def test_a_compaction_that_succeeds_or_asks_nothing_reports_no_failure() -> None:
    why: list[str] = []
    assert (await _compact([text("gist")], on_failure=why.append))[0] is not None
    assert (await _compact([text("x")], messages=[user(), calls("a"), results("a")], on_failure=why.append))[0] is None
    assert why == []


@pytest.mark.parametrize("answer", [
    PTL,
    {"status": 500, "error_type": "api_error", "message": "boom"},
    {"status": 529, "error_type": "overloaded_error", "message": "Overloaded"},
    {"blocks": [{"type": "text", "text": "cut off"}], "break_after": 1},
    {"blocks": [{"type": "text", "text": "cut off"}], "sse_error": "overloaded_error"},
])
async def test_an_error_or_a_broken_stream_is_a_failed_compaction(answer: dict[str, Any]) -> None:
    why: list[str] = []
    got, model, _ = await _compact([answer, text("never asked")], on_failure=why.append)
    assert got is None and model.count == 1
    # one reason, naming the API's status when it answered with one
    assert len(why) == 1 and why[0]
    if "status" in answer:
        assert why[0].startswith(f"API Error: {answer['status']} ")


async def test_a_retried_summary_request_still_compacts() -> None:
    overloaded = {"status": 529, "error_type": "overloaded_error", "message": "Overloaded", "retry_after_s": 0}
    got, model, _ = await _compact([overloaded, tagged("gist")], model_kw={"max_retries": 1})
    assert got is not None and got.summary == "Summary:\ngist" and model.count == 2


class Unfinished:
    """A client whose stream ends cleanly but without message_stop."""

    def __init__(self) -> None:
        self.count = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.count += 1
        yield MessageStart(model="m", usage={"input_tokens": 5})
        yield BlockStart(0, {"type": "text", "text": ""})
        yield BlockDelta(0, {"type": "text_delta", "text": "a whole summary"})
        yield BlockStop(0)
        yield MessageDelta("end_turn", {"output_tokens": 3})


async def test_a_summary_stream_that_ends_before_message_stop_is_a_failed_compaction() -> None:
    client = Unfinished()
    usage: list[Any] = []
    got = await compact(client, model="m", system=SYSTEM, messages=HISTORY, trigger="auto",
                        on_usage=lambda name, u: usage.append(u))
    assert got is None and client.count == 1
    assert usage and usage[0]["input_tokens"] == 5


async def test_nothing_to_summarise_asks_nothing() -> None:
    got, model, usage = await _compact([text("never asked")], messages=[user(), calls("a"), results("a")])
    assert got is None and model.count == 0 and usage == []


async def test_a_request_without_usage_reports_none() -> None:
    got, _, usage = await _compact([{"status": 500, "error_type": "api_error", "message": "boom"}])
    assert got is None and usage == []


# --- end to end: which prompt-too-long errors the graph compacts ----------------------------------------


def read(tid: str) -> dict[str, Any]:
    return {"blocks": [{"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": "$WS/a.txt"}}],
            "stop_reason": "tool_use"}


async def _run(tmp: Path, responses: Sequence[Any], **limits: Any) -> tuple[Any, ScriptedModel]:
    result, model, _ = await run_session(tmp, responses, Limits(**limits))
    return result, model


async def test_a_prompt_too_long_on_the_first_request_is_not_compacted(tmp_path: Path) -> None:
    result, model = await _run(tmp_path, [PTL, text("never sent"), text("never sent")])
    assert result.terminal_reason is TerminalReason.PROMPT_TOO_LONG and result.is_error
    assert model.count == 1  # no summary request was made


async def test_a_prompt_too_long_after_one_tool_turn_is_compacted_whole(tmp_path: Path) -> None:
    """Claude Code 2.1.332 compacts once the conversation holds one response (docs/conform.md): the whole
    conversation is summarised, the prompt left out (the API's message gives the sizes), and the request
    is sent again with the file read shown again and the summary."""
    result, model = await _run(tmp_path, [read("r0"), PTL, tagged("SUMMARY"), text("done")])
    assert result.terminal_reason is TerminalReason.COMPLETED and result.result == "done"
    assert model.count == 4
    summary_req, retried = model.requests[2], model.requests[3]
    assert summary_req.tools == ()
    assert summary_req.messages[0]["content"][0]["text"] == prompts.COMPACT_TRUNCATION_MARKER
    assert [b.get("id") for m in summary_req.messages for b in m["content"] if b["type"] == "tool_use"] == ["r0"]
    assert [m["role"] for m in retried.messages] == ["user"]
    texts = [b["text"] for b in retried.messages[0]["content"]]
    assert texts[0].startswith("<system-reminder>\nCalled the Read tool with the following input: ")
    assert texts[-1] == (prompts.COMPACT_SUMMARY_PREFIX + "Summary:\nSUMMARY\n\n" + prompts.COMPACT_TRUNCATED_NOTE)


async def test_a_prompt_too_long_after_two_answers_is_compacted_and_the_turn_goes_on(tmp_path: Path) -> None:
    result, model = await _run(tmp_path, [read("r1"), read("r2"), PTL, tagged("SUMMARY"), text("done")])
    assert result.terminal_reason is TerminalReason.COMPLETED and result.result == "done"
    assert model.count == 5
    summary_req, retried = model.requests[3], model.requests[4]
    assert summary_req.tools == ()
    first = retried.messages[0]["content"][0]["text"]
    assert first == prompts.COMPACT_SUMMARY_PREFIX + "Summary:\nSUMMARY\n\n" + prompts.COMPACT_KEPT_NOTE
    # the kept exchange follows the summary: r2's call and its result
    assert [b.get("id") for m in retried.messages for b in m["content"] if b["type"] == "tool_use"] == ["r2"]


@pytest.mark.parametrize("summary", [text(""), PTL, {"blocks": [{"type": "text", "text": "x"}], "break_after": 1}])
async def test_a_failed_reactive_compaction_ends_the_turn_prompt_too_long(tmp_path: Path,
                                                                       summary: dict[str, Any]) -> None:
    result, model = await _run(tmp_path, [read("r1"), read("r2"), PTL, summary, text("never sent")])
    assert result.terminal_reason is TerminalReason.PROMPT_TOO_LONG
    assert model.count == 4
    assert result.result.startswith("Prompt is too long \u00b7 automatic compaction failed: ")


# why the summary failed, as Claude Code 2.1.332 names it in the run's result (compared with it on the same
# scripted server: docs/conform.md); the scripted model is no gateway, so a 5xx points to the status page
@pytest.mark.parametrize("summary,why", [
    (text(""), EMPTY_SUMMARY),
    ({"blocks": [{"type": "thinking", "thinking": "hmm", "signature": "s"}], "stop_reason": "end_turn"}, EMPTY_SUMMARY),
    ({"blocks": [], "stop_reason": "end_turn"}, NO_SUMMARY_MESSAGE),
    ({"status": 500, "error_type": "api_error", "message": "Internal server error", "should_retry": False},
     "API Error: 500 Internal server error. This is a server-side issue, usually temporary \u2014 try again in a "
     "moment. If it persists, check https://status.claude.com."),
])
async def test_a_failed_reactive_compaction_says_why_in_the_result(tmp_path: Path, summary: dict[str, Any],
                                                                   why: str) -> None:
    result, model = await _run(tmp_path, [read("r0"), PTL, summary, text("never sent")])
    assert (result.terminal_reason, model.count) == (TerminalReason.PROMPT_TOO_LONG, 3)
    assert result.result == f"Prompt is too long \u00b7 automatic compaction failed: {why}"


async def test_a_reactive_compaction_after_one_tool_turn_keeps_only_the_summary() -> None:
    msgs = [user(), calls("a"), results("a")]
    assert (await _compact([text("gist")], messages=msgs))[0] is None
    got, model, _ = await _compact([tagged("gist")], messages=msgs, trigger="reactive")
    assert got is not None and model.count == 1
    assert [m.kind for m in got.messages] == ["compact_summary"]
    assert got.messages[0].text() == prompts.COMPACT_SUMMARY_PREFIX + "Summary:\ngist"


@pytest.mark.parametrize("message, shown", [
    ("prompt is too long: 250000 tokens > 200000 maximum", prompts.REQUEST_TOO_LARGE_PROMPT),
    ("Request exceeds the maximum size", prompts.REQUEST_TOO_LARGE),
])
async def test_a_413_is_not_compacted_and_ends_image_error(tmp_path: Path, message: str, shown: str) -> None:
    """A 413 (request_too_large), also after a tool turn: Claude Code 2.1.332 makes no summary request and
    ends ``image_error`` with its own words (docs/conform.md)."""
    too_large = {"status": 413, "error_type": "request_too_large", "message": message}
    result, model = await _run(tmp_path, [read("r0"), too_large, text("never sent"), text("never sent")])
    assert result.terminal_reason is TerminalReason.IMAGE_ERROR and result.is_error
    assert result.result == shown
    assert model.count == 2
