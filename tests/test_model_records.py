"""The model transport's records (agentfsm.llm.model): the request body sent, a whole response read
as the events its stream would have carried, the wait before a retry, and one response's stream being
closed. Issue 35: 67 mutants of this module survived its tests, which reached these only through runs
whose scripted server made none of the cases that tell them apart."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.llm.model import (
    BlockStart,
    MessageStart,
    ModelCallError,
    ModelError,
    ModelRequest,
    ResponseStream,
    backoff_s,
    message_events,
)
from agentfsm.runtime.assembler import ResponseAssembler

# --- the request body ------------------------------------------------------------------------------


def _request(**kw: Any) -> ModelRequest:
    base: dict[str, Any] = {"model": "m", "system": ({"type": "text", "text": "sys"},),
                            "messages": ({"role": "user", "content": "hi"},), "tools": (), "max_tokens": 10}
    return ModelRequest(**{**base, **kw})


def test_the_body_streams_and_carries_the_system_blocks() -> None:
    body = _request().body()
    assert body == {"model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "sys"}],
                    "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize(("field", "value"), [
    ("tools", ({"name": "Read", "input_schema": {"type": "object"}},)),
    ("metadata", {"user_id": "u"}),
    ("output_config", {"task_budget": {"total": 1000}}),
    ("thinking", {"type": "enabled", "budget_tokens": 1024}),
])
def test_an_optional_part_is_sent_only_when_set(field: str, value: Any) -> None:
    assert field not in _request().body()
    sent = _request(**{field: value}).body()[field]
    assert sent == (list(value) if isinstance(value, tuple) else value)


# --- a whole response as stream events -------------------------------------------------------------

_TEXT = st.text(max_size=12)
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), _TEXT),
                     lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(_TEXT, c, max_size=3)),
                     max_leaves=8)
_BLOCKS = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _TEXT),
    st.builds(lambda i, n, inp: {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": inp},
              st.integers(0, 10**6), st.sampled_from(["Read", "Bash"]),
              st.one_of(st.none(), st.dictionaries(_TEXT, _JSON, max_size=3))),
    st.builds(lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, _TEXT, _TEXT),
    st.builds(lambda d: {"type": "redacted_thinking", "data": d}, _TEXT),
)
_MESSAGES = st.fixed_dictionaries({
    "id": st.from_regex(r"\Amsg_[a-z0-9]{1,8}\Z"),
    "model": st.sampled_from(["claude-a", "claude-b"]),
    "content": st.lists(_BLOCKS, max_size=5).map(
        lambda bs: [({**b, "id": f"toolu_{n}"} if b["type"] == "tool_use" else b) for n, b in enumerate(bs)]),
    "stop_reason": st.sampled_from(["end_turn", "tool_use", "max_tokens", "refusal"]),
    "usage": st.fixed_dictionaries({"input_tokens": st.integers(0, 10**6), "output_tokens": st.integers(0, 10**5)}),
})


@given(_MESSAGES)
def test_a_whole_response_reads_back_as_itself_through_its_events(message: dict[str, Any]) -> None:
    """What the loop assembles from the events of a response made without streaming is that response:
    every block in order (a call's input, an empty one as {}), why it stopped, its usage and ids."""
    asm = ResponseAssembler()
    for event in message_events(message):
        asm.feed(event)
    response = asm.finish()
    want = [({**b, "input": b["input"] or {}} if b["type"] == "tool_use" else b) for b in message["content"]]
    assert list(response.blocks) == want
    assert response.stop_reason == message["stop_reason"] and response.usage == message["usage"]
    assert (response.model, response.message_id) == (message["model"], message["id"])
    assert not response.invalid_tool_inputs and asm.stopped


def test_a_response_without_content_or_usage_is_still_whole() -> None:
    events = message_events({"stop_reason": "end_turn"})
    assert events[0] == MessageStart(model="", usage={}, message_id="")
    asm = ResponseAssembler()
    for event in events:
        asm.feed(event)
    assert asm.finish().blocks == () and asm.finish().usage == {"output_tokens": 0}


def test_a_block_of_an_unknown_kind_is_passed_on_whole() -> None:
    block = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"q": "x"}}
    events = message_events({"content": [block], "stop_reason": "end_turn"})
    assert events[1] == BlockStart(0, block) and events[1].block is not block


# --- the wait before a retry ------------------------------------------------------------------------


@pytest.mark.parametrize("asked", [0.0, 0.25, 7, 60])
def test_a_wait_the_api_asks_for_is_kept_up_to_a_minute(asked: float) -> None:
    assert backoff_s(5, asked) == asked


@pytest.mark.parametrize("asked", [None, -1, 60.5, 3600])
@pytest.mark.parametrize("attempt", [1, 2, 3, 7, 12])
def test_otherwise_the_wait_doubles_from_half_a_second_with_a_quarter_of_jitter_up_to_32_s(
        attempt: int, asked: float | None) -> None:
    base = min(0.5 * 2 ** (attempt - 1), 32.0)
    random.seed(attempt)
    for _ in range(20):
        assert base <= backoff_s(attempt, asked) <= base * 1.25


# --- closing one response's stream ------------------------------------------------------------------


class _Events:
    def __init__(self, fail: BaseException | None = None, closable: bool = True) -> None:
        self.closed = 0
        self.fail = fail
        if not closable:
            self.aclose = None  # type: ignore[assignment]

    def __aiter__(self) -> AsyncIterator[Any]:
        return self  # type: ignore[return-value]

    async def __anext__(self) -> Any:
        raise StopAsyncIteration

    async def aclose(self) -> None:  # type: ignore[no-redef]
        self.closed += 1
        if self.fail is not None:
            raise self.fail


class _Client:
    def __init__(self, events: _Events) -> None:
        self.events = events

    def stream(self, _request: ModelRequest) -> _Events:
        return self.events


async def test_a_stream_is_closed_once_and_says_whether_closing_worked() -> None:
    events = _Events()
    stream = ResponseStream(_Client(events), _request())
    assert await stream.aclose() is True and await stream.aclose() is True
    assert events.closed == 1


@pytest.mark.parametrize("fail", [RuntimeError("aclose(): asynchronous generator is already running"),
                                  ModelCallError(ModelError("api", "reset", None, True))])
async def test_a_stream_that_cannot_be_closed_mid_iteration_says_so(fail: BaseException) -> None:
    events = _Events(fail)
    stream = ResponseStream(_Client(events), _request())
    assert await stream.aclose() is False and events.closed == 1
    assert await stream.aclose() is True and events.closed == 1  # closed is closed: not tried again


async def test_a_stream_without_aclose_is_closed_by_forgetting_it() -> None:
    stream = ResponseStream(_Client(_Events(closable=False)), _request())
    assert await stream.aclose() is True


# --- the transport's retries close what they give up -------------------------------------------------


class _Failing(_Events):
    """A stream whose first event is a failure."""

    def __init__(self, error: ModelCallError, fail_close: BaseException | None = None,
                 closable: bool = True) -> None:
        super().__init__(fail_close, closable)
        self.error = error

    async def __anext__(self) -> Any:
        raise self.error


class _Ok(_Events):
    def __init__(self) -> None:
        super().__init__()
        self.sent = False

    async def __anext__(self) -> Any:
        if self.sent:
            raise StopAsyncIteration
        self.sent = True
        return MessageStart(model="m")


@pytest.mark.parametrize("fail_close", [None, RuntimeError("running"),
                                        ModelCallError(ModelError("api", "x", None, True))])
@pytest.mark.parametrize("closable", [True, False])
async def test_a_stream_given_up_before_its_first_event_is_closed_and_the_request_sent_again(
        fail_close: BaseException | None, closable: bool) -> None:
    from agentfsm.llm.model import RetryNotice, with_retries

    failed = _Failing(ModelCallError(ModelError("overloaded", "Overloaded", 529, True)), fail_close, closable)
    ok = _Ok()
    streams = iter([failed, ok])

    async def no_wait(_s: float) -> None:
        return None

    got = [e async for e in with_retries(lambda: next(streams), 3, delay_s=lambda n, e: 0.0, sleep=no_wait)]
    assert [type(e) for e in got] == [RetryNotice, MessageStart]
    assert failed.closed == (1 if closable else 0) and ok.closed == 1
