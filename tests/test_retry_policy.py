"""The model retry policy every transport shares (``agentfsm.llm.model``): how an HTTP/API error is
classified, how long a retry waits, and which failures are sent again and how often — each boundary on
both sides (the statuses around 408, 429 and 500, the retry-after bound, the backoff cap, the retry
count), and the retry loop against a statement of its rule over generated failure sequences."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.llm.model import (
    MessageStart,
    MessageStop,
    ModelCallError,
    RetryNotice,
    backoff_s,
    classify_error,
    with_retries,
)
from agentfsm.machine.events import ModelError

PTL = "prompt is too long: 212345 tokens > 200000 maximum"


@pytest.mark.parametrize("status, error_type, message, kind, retryable", [
    (400, "invalid_request_error", PTL, "prompt_too_long", False),
    (413, "request_too_large", "Prompt too long", "image", False),  # Claude Code 2.1.332: image_error
    (400, "invalid_request_error", "input length and `max_tokens` exceed context limit: 1 + 2 > 3",
     "prompt_too_long", False),
    (401, "authentication_error", PTL, "api", False),  # the text alone is not enough: a 400
    (500, "api_error", PTL, "api", True),
    (400, "invalid_request_error", "Image too large", "image", False),
    (413, "request_too_large", "image too large", "image", False),  # every 413 is request_too_large
    (529, "overloaded_error", "Overloaded", "overloaded", True),
    (529, "api_error", "x", "overloaded", True),
    (200, "overloaded_error", "Overloaded", "overloaded", True),
    (None, "overloaded_error", "Overloaded", "overloaded", True),
    (429, "rate_limit_error", "slow down", "api", True),
    (428, "x", "y", "api", False),
    (430, "x", "y", "api", False),
    (408, "timeout", "y", "api", True),
    (407, "x", "y", "api", False),
    (409, "x", "y", "api", False),
    (499, "x", "y", "api", False),
    (500, "api_error", "boom", "api", True),
    (503, "api_error", "boom", "api", True),
    (400, "invalid_request_error", "bad", "api", False),
    (None, "connection", "reset", "api", False),
])
def test_classify_error(status: int | None, error_type: str, message: str, kind: str, retryable: bool) -> None:
    error = classify_error(status, error_type, message)
    assert (error.kind, error.retryable, error.status, error.message) == (kind, retryable, status, message)


@pytest.mark.parametrize("after, honoured", [(0.0, True), (0.5, True), (60.0, True), (60.01, False), (-0.01, False),
                                             (None, False)])
def test_a_retry_waits_what_the_api_asked_within_a_minute(after: float | None, honoured: bool) -> None:
    waited = backoff_s(1, after)
    if honoured:
        assert waited == after
    else:
        assert 0.5 <= waited <= 0.5 * 1.25


@given(st.integers(1, 30))
def test_the_backoff_doubles_from_half_a_second_up_to_32s_with_a_quarter_of_jitter(attempt: int) -> None:
    base = min(0.5 * 2 ** (attempt - 1), 32.0)
    assert base <= backoff_s(attempt) <= base * 1.25


def test_the_backoff_reaches_its_cap_at_the_seventh_attempt() -> None:
    assert backoff_s(6) <= 16 * 1.25 and backoff_s(7) >= 32 and backoff_s(30) <= 40


@pytest.mark.parametrize("error, expected", [
    (ModelError("overloaded", "o", 529, True), "overloaded"),
    (ModelError("overloaded", "o", None, True), "overloaded"),
    (ModelError("api", "r", 429, True), "rate_limit"),
    (ModelError("api", "s", 500, True), "server_error"),
    (ModelError("api", "s", 599, True), "server_error"),
    (ModelError("api", "s", 499, True), "unknown"),
    (ModelError("api", "t", 408, True), "unknown"),
    (ModelError("connection", "c", None, True), "unknown"),
])
def test_a_retry_notice_names_the_kind_of_failure(error: ModelError, expected: str) -> None:
    notice = RetryNotice.of(error, 2, 10, 1.2345)
    assert notice == RetryNotice(2, 10, 1234, error.status, expected)


# --- the retry loop --------------------------------------------------------------------------------

OK = [MessageStart(model="m"), MessageStop()]


class Opener:
    """Streams that fail before their first event with the given errors, then one that succeeds."""

    def __init__(self, failures: Sequence[ModelCallError], then: Sequence[Any] = OK, mid: ModelCallError | None = None):
        self.failures = list(failures)
        self.then = then
        self.mid = mid
        self.opened = 0
        self.closed = 0

    def __call__(self) -> AsyncIterator[Any]:
        n = self.opened
        self.opened += 1
        return self._stream(n)

    async def _stream(self, n: int) -> AsyncIterator[Any]:
        try:
            if n < len(self.failures):
                raise self.failures[n]
            for i, event in enumerate(self.then):
                if self.mid is not None and i == 1:
                    raise self.mid
                yield event
        finally:
            self.closed += 1


async def _run(opener: Opener, max_retries: int) -> tuple[list[Any], list[float], ModelCallError | None]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    got: list[Any] = []
    try:
        async for item in with_retries(opener, max_retries, delay_s=lambda n, e: n / 10, sleep=sleep):
            got.append(item)
    except ModelCallError as exc:
        return got, slept, exc
    return got, slept, None


def overloaded(should_retry: bool | None = None) -> ModelCallError:
    return ModelCallError(ModelError("overloaded", "Overloaded", 529, True), should_retry=should_retry)


def bad_request(should_retry: bool | None = None) -> ModelCallError:
    return ModelCallError(ModelError("api", "bad", 400, False), should_retry=should_retry)


@pytest.mark.parametrize("failures, max_retries", [(0, 0), (0, 3), (1, 1), (2, 3), (3, 3)])
async def test_retryable_failures_are_sent_again_up_to_the_cap(failures: int, max_retries: int) -> None:
    opener = Opener([overloaded()] * failures)
    got, slept, raised = await _run(opener, max_retries)
    assert raised is None and opener.opened == failures + 1
    notices = [g for g in got if isinstance(g, RetryNotice)]
    assert [(n.attempt, n.max_retries, n.delay_ms) for n in notices] == [
        (k, max_retries, int(k / 10 * 1000)) for k in range(1, failures + 1)]
    assert slept == [k / 10 for k in range(1, failures + 1)]
    assert got[failures:] == OK  # the notices come first, then the stream


@pytest.mark.parametrize("failures, max_retries", [(1, 0), (2, 1), (4, 3)])
async def test_one_failure_past_the_cap_is_raised(failures: int, max_retries: int) -> None:
    errors = [overloaded() for _ in range(failures)]
    opener = Opener(errors)
    got, _, raised = await _run(opener, max_retries)
    assert raised is errors[max_retries] and opener.opened == max_retries + 1
    assert len(got) == max_retries and all(isinstance(g, RetryNotice) for g in got)


async def test_the_answers_own_word_on_retrying_wins_over_the_kind() -> None:
    opener = Opener([overloaded(should_retry=False)])
    _, _, raised = await _run(opener, 5)
    assert raised is not None and opener.opened == 1
    opener = Opener([bad_request(should_retry=True)])
    got, _, raised = await _run(opener, 5)
    assert raised is None and opener.opened == 2 and got[1:] == OK
    opener = Opener([bad_request()])
    _, _, raised = await _run(opener, 5)
    assert raised is not None and opener.opened == 1


@pytest.mark.parametrize("kind", ["stream_dropped", "stream_garbled"])
async def test_a_response_that_came_and_broke_is_left_to_the_graph(kind: str) -> None:
    opener = Opener([ModelCallError(ModelError(kind, "x", None, True), should_retry=True)])
    _, slept, raised = await _run(opener, 5)
    assert raised is not None and raised.error.kind == kind and opener.opened == 1 and slept == []


async def test_a_failure_after_the_first_event_is_not_retried() -> None:
    mid = overloaded()
    opener = Opener([], then=OK, mid=mid)
    got, _, raised = await _run(opener, 5)
    assert raised is mid and opener.opened == 1 and got == OK[:1]


async def test_an_empty_stream_yields_nothing_and_every_stream_is_closed() -> None:
    opener = Opener([], then=[])
    got, _, raised = await _run(opener, 5)
    assert got == [] and raised is None and opener.opened == 1
    opener = Opener([overloaded(), overloaded()])
    await _run(opener, 5)
    assert opener.closed == opener.opened == 3


@given(st.lists(st.sampled_from(["retry", "final", "graph"]), max_size=6), st.integers(0, 4))
async def test_the_retry_loop_follows_its_rule(kinds: list[str], max_retries: int) -> None:
    make = {"retry": lambda: overloaded(), "final": lambda: bad_request(),
            "graph": lambda: ModelCallError(ModelError("stream_dropped", "x", None, True))}
    errors = [make[k]() for k in kinds]
    opener = Opener(errors)
    got, _, raised = await _run(opener, max_retries)
    # the rule: retry while the failure is retryable and not the graph's, at most max_retries times
    expected_opens, expected_raise = 0, None
    for n, k in enumerate([*kinds, "ok"]):
        expected_opens += 1
        if k == "ok":
            break
        if k != "retry" or n >= max_retries:
            expected_raise = errors[n]
            break
    assert opener.opened == expected_opens and raised is expected_raise
    assert sum(isinstance(g, RetryNotice) for g in got) == expected_opens - 1
