"""The incremental index of the tool_use ids a conversation holds (``assembler.TakenIds``): whatever
the histories it is asked about in turn — grown by messages at the end, or replaced (a compaction, a
repair) — it answers what collecting every id afresh answers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentfsm.machine.state import Message
from agentfsm.runtime.assembler import TakenIds, tool_use_ids

ids = st.sampled_from(["t1", "t2", "t3", "t4", "t5"])
use = st.builds(lambda i: {"type": "tool_use", "id": i, "name": "Echo", "input": {}}, ids)
blocks = st.lists(st.one_of(use, st.just({"type": "text", "text": "x"}),
                            st.just({"type": "tool_use", "name": "NoId", "input": {}})), max_size=3)
messages = st.one_of(
    st.builds(lambda c: Message("assistant", tuple(c), kind="assistant"), blocks),
    st.builds(lambda i: Message("user", ({"type": "tool_result", "tool_use_id": i, "content": "x"},),
                                kind="tool_results"), ids))
# each change: messages added at the end (True) or a history put in its place (False)
changes = st.lists(st.tuples(st.booleans(), st.lists(messages, max_size=4)), max_size=8)


@given(changes)
def test_the_index_answers_what_collecting_every_id_answers(steps: list[tuple[bool, list[Message]]]) -> None:
    index, history = TakenIds(), ()
    for grows, more in steps:
        history = (*history, *more) if grows else tuple(more)
        assert index.of(history) == tool_use_ids(history)


def test_a_history_with_the_same_length_but_other_messages_is_read_afresh() -> None:
    index = TakenIds()
    a = (Message("assistant", ({"type": "tool_use", "id": "a", "name": "E", "input": {}},), kind="assistant"),)
    b = (Message("assistant", ({"type": "tool_use", "id": "b", "name": "E", "input": {}},), kind="assistant"),)
    assert index.of(a) == {"a"}
    assert index.of(b) == {"b"}  # replaced, not grown: "a" is no longer taken
    assert index.of((*b, *a)) == {"a", "b"}
