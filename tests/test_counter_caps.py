"""A counter's cap is declared once: the counter names its limit (``counter(..., cap=NAME)``), the limit
is a :class:`~agentfsm.machine.state.Limits` field declared with ``_cap(default, validator)``, and
:func:`agentfsm.machine.state.cap_problems` (run at import) finds every way the two can disagree."""

from __future__ import annotations

import attrs
import pytest

from agentfsm.machine.state import (
    COUNTER_CAPS,
    COUNTERS,
    Counter,
    Limits,
    LoopState,
    _cap,
    _non_negative,
    cap_problems,
    counter,
)


def test_the_declared_counters_and_caps_agree() -> None:
    assert cap_problems() == []
    assert sorted(COUNTER_CAPS.values()) == sorted(Limits.cap_names())
    for key, cap in COUNTER_CAPS.items():
        assert Limits.capped_counter(cap) == key
    # a limit that caps no counter (the turn's max_turns is a guard of its own) is not a cap
    assert Limits.capped_counter("max_turns") is None
    assert "max_turns" not in Limits.cap_names()


def _with(counters: tuple[Counter, ...], key: str, **changes: object) -> tuple[Counter, ...]:
    return tuple(attrs.evolve(c, **changes) if c.key == key else c for c in counters)


def test_a_counter_capped_by_a_limit_that_does_not_exist_is_named_with_the_line_to_add() -> None:
    counters = _with(COUNTERS, "stream_retry_count", cap="stream_retires")
    problems = cap_problems(counters)
    assert any("stream_retry_count" in p and "'stream_retires'" in p
               and "add `stream_retires: int = _cap(DEFAULT, _non_negative)`" in p for p in problems), problems
    # and the real cap it no longer names is now a setting that does nothing
    assert any("Limits.stream_retries is declared with `_cap(...)` but no counter names it" in p for p in problems)


def test_a_counter_capped_by_a_limit_not_declared_as_a_cap_is_refused() -> None:
    counters = (*COUNTERS, Counter("turn_count_copy", "turn_count", 1, "max_turns"))
    assert cap_problems(counters) == [
        "counter turn_count_copy is capped by Limits.max_turns, which is not declared as a cap; "
        "declare it with `_cap(...)`"]


def test_two_counters_sharing_a_cap_are_refused() -> None:
    counters = _with(COUNTERS, "malformed_tool_use_retry_count", cap="stream_retries")
    problems = cap_problems(counters)
    assert any("Limits.stream_retries caps several counters (malformed_tool_use_retry_count, stream_retry_count)"
               in p for p in problems), problems
    assert any("Limits.malformed_tool_use_retries is declared with `_cap(...)` but no counter names it" in p
               for p in problems)


def test_a_cap_that_caps_no_counter_is_refused() -> None:
    """A limit added as a cap without the counter that uses it would be a setting that silently does
    nothing: the check names it."""
    extra = attrs.make_class("Limits", {
        **{f.name: attrs.field(default=f.default, validator=f.validator, metadata=f.metadata)
           for f in attrs.fields(Limits)},
        "image_retries": _cap(2, _non_negative)}, frozen=True)
    assert cap_problems(COUNTERS, extra) == [
        "Limits.image_retries is declared with `_cap(...)` but no counter names it: give the counter "
        "`cap='image_retries'`, or declare the field with `attrs.field` if it caps no counter"]


def test_a_new_counter_with_its_cap_is_accepted_by_the_check() -> None:
    """The walk-through of docs/contributing.md: a counter and its cap, each declared once, agree."""
    extra_limits = attrs.make_class("Limits", {
        **{f.name: attrs.field(default=f.default, validator=f.validator, metadata=f.metadata)
           for f in attrs.fields(Limits)},
        "image_retries": _cap(2, _non_negative)}, frozen=True)
    field = counter(0, cap="image_retries", raised_by=("image_error_retry",), reset_by=("next_turn",))
    extra_state = attrs.make_class("LoopState", {"image_retry_count": field}, bases=(LoopState,), frozen=True)
    meta = attrs.fields_dict(extra_state)["image_retry_count"].metadata["agentfsm.counter"]
    new = attrs.evolve(meta, key="image_retry_count", path="image_retry_count")
    assert cap_problems((*COUNTERS, new), extra_limits) == []
    assert extra_limits().image_retries == 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="image_retries must be >= 0"):
        extra_limits(image_retries=-1)
