"""The incremental wire view equals the full normalisation, whatever the history does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.machine.state import Message
from agentfsm.runtime.request import WireCache, normalize

BLOCKS = st.sampled_from([
    {"type": "text", "text": "hi"},
    {"type": "text", "text": ""},
    {"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
    {"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
    {"type": "thinking", "thinking": "hm", "signature": "s"},
])
MESSAGES = st.builds(lambda role, blocks: Message(role, tuple(blocks)), st.sampled_from(["user", "assistant"]),
                     st.lists(BLOCKS, min_size=0, max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "rewrite", "same"]), st.lists(MESSAGES, max_size=3)),
                max_size=12))
def test_incremental_wire_equals_normalize(steps: list[tuple[str, list[Message]]]) -> None:
    cache = WireCache()
    history: tuple[Message, ...] = ()
    for op, new in steps:
        if op == "append":
            history = (*history, *new)
        elif op == "rewrite":
            history = tuple(new)
        assert cache.wire(history) == normalize(history)


def test_earlier_requests_are_not_changed_by_later_ones() -> None:
    cache = WireCache()
    first = (Message("user", "go"),)
    a = cache.wire(first)
    snapshot = [dict(m, content=list(m["content"])) for m in a]
    cache.wire((*first, Message("user", "more")))  # merges into the same wire message
    assert a == snapshot


def test_an_alias_is_renamed_on_the_incremental_path_too() -> None:
    names = {"KillShell": "TaskStop"}
    cache = WireCache(names)
    first = (Message("user", "go"), Message("assistant", ({"type": "tool_use", "id": "k", "name": "KillShell",
                                                           "input": {}},), kind="assistant"))
    assert cache.wire(first) == normalize(first, names)
    grown = (*first, Message("user", ({"type": "tool_result", "tool_use_id": "k", "content": "ok"},)),
             Message("assistant", ({"type": "tool_use", "id": "k2", "name": "KillShell", "input": {}},)))
    assert cache.wire(grown) == normalize(grown, names)


def test_the_unchanged_part_is_reused_not_normalised_again() -> None:
    """What makes a request cost what is new: the wire messages before the last one are the same
    objects when the history only grew, or did not change at all."""
    cache = WireCache()
    history = (Message("user", "go"), Message("assistant", "a", kind="assistant"), Message("user", "more"))
    first = cache.wire(history)
    again = cache.wire(history)
    assert all(x is y for x, y in zip(first[:-1], again[:-1], strict=True))
    grown = cache.wire((*history, Message("assistant", "b", kind="assistant")))
    assert all(x is y for x, y in zip(first[:-1], grown[:2], strict=True))
    rewritten = cache.wire((Message("user", "go"),))  # a rewritten history is normalised afresh
    assert rewritten == [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
