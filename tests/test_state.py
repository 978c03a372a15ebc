"""The state record and its limits against docs/behaviour.md §2: defaults, ranges, settings, the terminal
reasons' classification, and what a trace records of a state.

The two tables of §2 (limits; terminal reasons) are read from the document itself, so the code and the
contract cannot drift apart silently in either direction.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.machine.state import (
    COUNTER_CAPS,
    COUNTERS,
    SNAPSHOT_KEYS,
    TERMINAL_INFO,
    CompactTracking,
    Limits,
    LoopState,
    Message,
    Phase,
    QueryTracking,
    TerminalReason,
    appended,
    new_id,
    set_id_source,
)

DOC = (Path(__file__).resolve().parents[1] / "docs" / "behaviour.md").read_text()


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table after the paragraph starting with ``heading`` (cells without backticks)."""
    rest = DOC[DOC.index(heading):]
    rows = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            if not set(cells[0]) <= {"-"}:
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # without the header


LIMITS = {row[0]: row for row in _table("**Limits**")}
REASONS = {row[0]: row for row in _table("**Terminal reasons**")}


def _documented_default(text: str) -> Any:
    words = {"none": None, "true": True, "false": False}
    return words[text] if text in words else int(text)


# --- limits --------------------------------------------------------------------------------------


def test_every_limit_is_documented_with_its_default() -> None:
    assert list(LIMITS) == Limits.field_names()
    defaults = Limits()
    for name, row in LIMITS.items():
        assert getattr(defaults, name) == _documented_default(row[1]), name


@pytest.mark.parametrize("name", Limits.field_names())
def test_every_limit_accepts_exactly_its_documented_range(name: str) -> None:
    """"≥ 1" rejects 0, "≥ 0" takes it, "or none" takes None; nothing takes a negative number."""
    allowed = LIMITS[name][2]
    if allowed == "true or false":
        assert Limits(**{name: False}) != Limits(**{name: True})
        return
    low = 1 if allowed.startswith(("≥ 1", "> 0")) else 0
    assert getattr(Limits(**{name: low}), name) == low
    assert getattr(Limits(**{name: low + 7}), name) == low + 7
    for bad in ({-1, 0} if low else {-1}):
        with pytest.raises(ValueError, match=name):
            Limits(**{name: bad})
    if "none" in allowed:
        assert getattr(Limits(**{name: None}), name) is None
    if name == "max_budget_usd":
        assert Limits(max_budget_usd=0.01).max_budget_usd == 0.01
        with pytest.raises(ValueError, match=name):
            Limits(max_budget_usd=-0.01)


@given(window=st.integers(1, 10**6), auto=st.integers(0, 10**5), blocking=st.integers(0, 10**5))
def test_thresholds_are_the_window_minus_the_buffers(window: int, auto: int, blocking: int) -> None:
    lim = Limits(context_window=window, auto_compact_buffer=auto, blocking_buffer=blocking)
    assert lim.auto_compact_threshold == window - auto
    assert lim.blocking_limit == window - blocking


@given(data=st.data())
def test_a_setting_parses_to_the_value_it_names(data: st.DataObject) -> None:
    """``--limit NAME=VALUE``: integers, the budget as a float, booleans in every usual spelling, ``none``
    (any case, or empty) for the optional ones; the result is the same Limits with that one field set."""
    name = data.draw(st.sampled_from(Limits.field_names()))
    base = Limits()
    current = getattr(base, name)
    if isinstance(current, bool):
        return  # every spelling: test_a_switch_takes_every_usual_spelling
    if name == "max_budget_usd":
        value = data.draw(st.floats(0.01, 1000, allow_nan=False))
        raw = repr(value)
    else:
        low = 1 if LIMITS[name][2].startswith("≥ 1") else 0
        value = data.draw(st.integers(low, 10**6))
        raw = data.draw(st.sampled_from([str(value), f" {value}", f"{value} "]))
    assert base.with_setting(name, raw) == attrs.evolve(base, **{name: value})


SPELLINGS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


@pytest.mark.parametrize("word", sorted(SPELLINGS))
def test_a_switch_takes_every_usual_spelling(word: str) -> None:
    switches = [f.name for f in attrs.fields(Limits) if isinstance(f.default, bool)]
    assert switches == ["auto_compact"]
    for raw in (word, word.upper(), f" {word.capitalize()} "):
        for start in (True, False):
            assert Limits(auto_compact=start).with_setting("auto_compact", raw).auto_compact is SPELLINGS[word]


@pytest.mark.parametrize("name", ["max_turns", "max_budget_usd"])
@pytest.mark.parametrize("raw", ["none", "None", "NULL", "null", "", "  "])
def test_none_unsets_an_optional_limit(name: str, raw: str) -> None:
    assert getattr(Limits(max_turns=3, max_budget_usd=2.0).with_setting(name, raw), name) is None


@pytest.mark.parametrize("name", [n for n in Limits.field_names() if n not in ("max_turns", "max_budget_usd")])
def test_none_is_no_value_for_a_required_limit(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Limits().with_setting(name, "none")


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("max_turns", "three", "limit max_turns takes a whole number, got 'three'"),
    ("max_turns", "2.5", "limit max_turns takes a whole number"),
    ("max_budget_usd", "lots", "limit max_budget_usd takes a number, got 'lots'"),
    ("auto_compact", "maybe", "limit auto_compact takes true or false, got 'maybe'"),
    ("auto_compact", "", "limit auto_compact takes true or false"),
    ("stream_retries", "-1", "limit stream_retries must be >= 0, got -1"),
    ("max_tool_concurrency", "0", "limit max_tool_concurrency must be positive or unset, got 0"),
])
def test_a_bad_setting_is_a_clear_error(name: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Limits().with_setting(name, raw)


def test_an_unknown_limit_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown limit 'max_turn'; known limits: max_turns, ") as err:
        Limits().with_setting("max_turn", "3")
    assert all(name in str(err.value) for name in Limits.field_names())


# --- terminal reasons ------------------------------------------------------------------------------


def test_every_terminal_reason_is_classified_as_documented() -> None:
    assert set(REASONS) == {r.value for r in TerminalReason}
    assert set(TERMINAL_INFO) == set(TerminalReason)
    for reason, info in TERMINAL_INFO.items():
        _, kind, subtype, is_error = REASONS[reason.value]
        assert (info.controlled, info.subtype, info.is_error) == (kind == "controlled", subtype, is_error == "true"), \
            reason


# --- what a trace records --------------------------------------------------------------------------

# Fields a move decides that a trace does not repeat with every move: the conversation and the tool
# context (recorded as messages), correlation ids, and the detail text (recorded with the result).
NOT_IN_SNAPSHOT = {"messages", "tool_use_context", "terminal_detail", "query_tracking.chain_id",
                   "compact_tracking.last_compact_turn_id"}


def _decided() -> list[str]:
    out = []
    for f in attrs.fields(LoopState):
        value = getattr(LoopState(), f.name)
        if f.name in NOT_IN_SNAPSHOT:
            continue
        out += [f"{f.name}.{g.name}" for g in attrs.fields(type(value))] if attrs.has(type(value)) else [f.name]
    return [n for n in out if n not in NOT_IN_SNAPSHOT]


def _other(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, Phase):
        return Phase.STOP if value is not Phase.STOP else Phase.ASSEMBLE
    if value is None:
        return "next_turn"
    raise AssertionError(value)


def _with(state: LoopState, dotted: str, value: Any) -> LoopState:
    if "." in dotted:
        outer, inner = dotted.split(".")
        return attrs.evolve(state, **{outer: attrs.evolve(getattr(state, outer), **{inner: value})})
    return attrs.evolve(state, **{dotted: value})


def _get(state: LoopState, dotted: str) -> Any:
    value: Any = state
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("field", _decided())
def test_the_snapshot_records_every_decided_field(field: str) -> None:
    """Two states that differ in one field the machine decides have different snapshots (the auditor
    replays from them), and the snapshot says the field's value."""
    base = LoopState(compact_tracking=CompactTracking(), query_tracking=QueryTracking("c", 0))
    changed = _with(base, field, TerminalReason.MAX_TURNS if field == "terminal_reason" else _other(_get(base, field)))
    assert base.snapshot() != changed.snapshot()
    leaf = field.split(".")[-1]
    names = {"consecutive_failures": "consecutive_compact_failures", "depth": "depth"}
    key = names.get(leaf, leaf)
    value = _get(changed, field)
    assert changed.snapshot()[key] == (value.value if isinstance(value, Phase | TerminalReason) else value)


@pytest.mark.parametrize("field", _decided())
def test_the_counters_are_the_snapshots_counter_slice(field: str) -> None:
    """What the driver logs and a Claude Code audit reports as the counters (LoopState.counters) is the
    part of the snapshot between the phase and stop_hooks_due, key for key and value for value."""
    base = LoopState(compact_tracking=CompactTracking(), query_tracking=QueryTracking("c", 0))
    changed = _with(base, field, TerminalReason.MAX_TURNS if field == "terminal_reason" else _other(_get(base, field)))
    keys = SNAPSHOT_KEYS[1:SNAPSHOT_KEYS.index("stop_hooks_due")]
    assert list(changed.counters()) == list(keys)
    assert changed.counters() == {k: changed.snapshot()[k] for k in keys}


def test_counters_are_the_capped_ones_and_the_turn() -> None:
    """Each counter a trace records with every move is checked against its cap (the auditor uses the same
    table, derived from the counters' own fields); every cap is a limit docs/behaviour.md §2 documents;
    the turn is checked against max_turns."""
    assert COUNTER_CAPS == {c.key: c.cap for c in COUNTERS if c.cap is not None}
    assert set(LoopState().counters()) >= {"turn_count", *COUNTER_CAPS}
    assert set(COUNTER_CAPS.values()) <= set(LIMITS) <= set(Limits.field_names())
    # each cap is a limit declared as one, capping exactly one counter (tests/test_counter_caps.py)
    assert sorted(COUNTER_CAPS.values()) == sorted(Limits.cap_names())


# --- messages --------------------------------------------------------------------------------------


def test_a_message_reads_its_blocks() -> None:
    blocks = ({"type": "text", "text": "a"}, {"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
              {"type": "text", "text": "b"}, {"type": "tool_use", "id": "t2", "name": "Read", "input": {}},
              {"type": "tool_result", "tool_use_id": "t0", "content": "x"})
    m = Message("assistant", blocks)
    assert m.tool_use_ids() == ["t1", "t2"]
    assert m.tool_result_ids() == ["t0"]
    assert m.text() == "ab"
    assert Message("user", "hello").content == ({"type": "text", "text": "hello"},)
    assert Message("user", "hello").kind == "prompt"
    assert Message("user", "x").uuid != Message("user", "x").uuid
    with pytest.raises(ValueError):
        Message("system", "no such role")


def test_a_fresh_state_starts_at_the_first_turn() -> None:
    s = LoopState()
    assert (s.phase, s.turn_count, s.query_tracking.depth, s.terminal_reason, s.transition) == \
        (Phase.ASSEMBLE, 1, -1, None, None)
    assert all(v in (0, False) for k, v in s.counters().items() if k != "turn_count")
    assert s.compact_tracking == CompactTracking(None, 0, 0, 0, 0)
    assert (s.snapshot()["turns_since_compact"], s.snapshot()["compactions"]) == (0, 0)
    assert QueryTracking().chain_id != QueryTracking().chain_id and len(QueryTracking().chain_id) == 16


_MESSAGES = st.builds(Message, st.sampled_from(["user", "assistant"]), st.sampled_from(["a", "b"]))


@given(old=st.lists(_MESSAGES, max_size=4).map(tuple), extra=st.lists(_MESSAGES, max_size=3).map(tuple),
       data=st.data())
def test_appended_means_the_old_conversation_is_kept_as_it_was(old: tuple[Message, ...], extra: tuple[Message, ...],
                                                                data: st.DataObject) -> None:
    """A trace records the messages a move added only when the move kept every earlier one: nothing added
    (the same length) is still appended; a shorter or rewritten history, however long, is not."""
    assert appended(old, old + extra)
    if old:
        assert not appended(old, old[:-1])
        i = data.draw(st.integers(0, len(old) - 1))
        other = attrs.evolve(old[i], uuid=old[i].uuid + "'")
        assert not appended(old, (*old[:i], other, *old[i + 1:], *extra))


def test_ids_come_from_the_installed_source_and_uuid4_again_after_none() -> None:
    """A replaying host (Temporal) installs its own id source; None puts the random one back."""
    fixed = iter(uuid.UUID(int=n) for n in range(1, 100))
    set_id_source(lambda: next(fixed))
    try:
        assert new_id() == uuid.UUID(int=1)
        assert Message("user", "x").uuid == str(uuid.UUID(int=2))
    finally:
        set_id_source(None)
    a, b = new_id(), new_id()
    assert isinstance(a, uuid.UUID) and a.version == 4 and a != b
