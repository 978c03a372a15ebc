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
