"""Assembles streamed events into content blocks.

A block is complete at its ``content_block_stop``; that is the moment a ``tool_use`` is handed to the
executor — before ``message_stop`` (docs/behaviour.md §3 step 3). ``stop_reason`` is recorded but never trusted
alone to decide whether tools exist (docs/behaviour.md §3): the blocks themselves decide.

A ``tool_use`` whose id is missing, already in the conversation (``taken_ids``) or repeated within the
response gets a fresh id at its ``content_block_start`` — before it can run, be saved or be sent back —
so one bad id can neither confuse result pairing nor poison the session with a request the API
refuses. The renames are listed in ``renamed_ids``.

A sequence the Messages protocol does not allow (a delta for a block that is not open, a second
``message_start``, ``message_stop`` with blocks still open or without any ``stop_reason``, anything
after ``message_stop``) raises :class:`StreamProtocolError`; the loop ends ``model_error`` on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agentfsm.common.bounded_json import DEFAULT_BOUNDS, InputRejected, JsonBounds, parse_object
from agentfsm.llm.model import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    MessageStop,
    StreamEvent,
)
from agentfsm.machine.events import ModelResponse
from agentfsm.machine.state import Message, appended


class StreamProtocolError(Exception):
    """The event sequence broke the Messages streaming protocol (a ``model_error``)."""


def tool_use_ids(messages: Sequence[Message]) -> set[str]:
    """The ids of the ``tool_use`` blocks the assistant messages of ``messages`` hold."""
    return {b["id"] for m in messages if m.role == "assistant" for b in m.content
            if b.get("type") == "tool_use" and isinstance(b.get("id"), str)}


class TakenIds:
    """The tool_use ids a conversation holds, kept as it grows (the ``taken_ids`` of each response's
    assembler). A history that only grew adds its new messages' ids (collecting them all again cost a
    long conversation about 1 ms a turn at 600 turns, issue 34's ``bench/overhead.py --growth``); one
    that was replaced (a compaction, a repair) is read afresh."""

    def __init__(self) -> None:
        self._of: tuple[Message, ...] = ()
        self._ids: frozenset[str] = frozenset()

    def of(self, messages: tuple[Message, ...]) -> frozenset[str]:
        known = self._of
        if appended(known, messages):
            if len(messages) > len(known):
                self._ids = self._ids | tool_use_ids(messages[len(known):])
        else:
            self._ids = frozenset(tool_use_ids(messages))
        self._of = messages
        return self._ids


class ResponseAssembler:
    def __init__(self, taken_ids: Iterable[str] = (), bounds: JsonBounds = DEFAULT_BOUNDS) -> None:
        self._taken: set[str] = set(taken_ids)
        self._bounds = bounds
        self._json_chars: dict[int, int] = {}
        self.renamed_ids: dict[str, str] = {}
        self._open: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self.blocks: list[dict[str, Any]] = []
        self.invalid_tool_inputs: dict[str, str] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.model = ""
        self.message_id = ""
        self.request_id = ""
        self.started = False
        self.stopped = False

    def feed(self, event: StreamEvent) -> dict[str, Any] | None:
        """Take one event; return the block it completed, if any."""
        if isinstance(event, MessageStart):
            if self.started:
                raise StreamProtocolError("message_start twice in one response")
            self.started = True
            self.model, self.message_id, self.request_id = event.model, event.message_id, event.request_id
            self.usage.update(event.usage)
            return None
        if not self.started:
            raise StreamProtocolError(f"{type(event).__name__} before message_start")
        if self.stopped:
            raise StreamProtocolError(f"{type(event).__name__} after message_stop")
        if isinstance(event, BlockStart):
            if event.index in self._open:
                raise StreamProtocolError(f"content block {event.index} started twice")
            block = dict(event.block)
            if block.get("type") == "tool_use":
                self._json[event.index] = []
                block["input"] = {}
                block["id"] = self._unique_id(block.get("id"))
            elif block.get("type") == "text":
                block.setdefault("text", "")
            elif block.get("type") == "thinking":
                block.setdefault("thinking", "")
                block.setdefault("signature", "")
            self._open[event.index] = block
            return None
        if isinstance(event, BlockDelta):
            block = self._open.get(event.index)
            if block is None:
                raise StreamProtocolError(f"delta for content block {event.index} that is not open")
            d = event.delta
            kind = d.get("type")
            if kind == "text_delta":
                block["text"] = block.get("text", "") + d.get("text", "")
            elif kind == "input_json_delta":
                self._take_json(event.index, d.get("partial_json", ""))
            elif kind == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + d.get("thinking", "")
            elif kind == "signature_delta":
                block["signature"] = block.get("signature", "") + d.get("signature", "")
            elif kind == "citations_delta":
                block.setdefault("citations", []).append(d.get("citation"))
            return None
        if isinstance(event, BlockStop):
            block = self._open.pop(event.index, None)
            if block is None:
                raise StreamProtocolError(f"content_block_stop for block {event.index} that is not open")
            if block.get("type") == "tool_use":
                raw = "".join(self._json.pop(event.index, []))
                self._json_chars.pop(event.index, None)
                try:
                    block["input"] = parse_object(raw, self._bounds)
                except InputRejected:
                    # too large, too deep, not JSON, not an object: malformed input, sent back as {}
                    # (the API needs an object); the pipeline says why and echoes the raw text
                    self.invalid_tool_inputs[block["id"]] = raw
            self.blocks.append(block)
            return block
        if isinstance(event, MessageDelta):
            if event.stop_reason is not None:
                self.stop_reason = event.stop_reason
            self.usage.update({k: v for k, v in event.usage.items() if v is not None})
            return None
        if isinstance(event, MessageStop):
            # A complete response closes every block and says why it stopped; one that does not is
            # malformed (a model_error), not something to guess the meaning of.
            if self._open:
                raise StreamProtocolError(
                    f"message_stop while content block(s) {sorted(self._open)} are still open")
            if self.stop_reason is None:
                raise StreamProtocolError("message_stop without a stop_reason in any message_delta")
            self.stopped = True
            return None
        raise StreamProtocolError(f"unknown stream event {event!r}")

    def _take_json(self, index: int, chunk: Any) -> None:
        """Keep a tool input's text up to one character past the size bound: enough to tell that
        it is too large, without holding whatever else the stream sends."""
        if not isinstance(chunk, str):
            chunk = ""
        held = self._json_chars.get(index, 0)
        room = self._bounds.max_chars + 1 - held
        if room <= 0:
            return
        chunk = chunk[:room]
        self._json.setdefault(index, []).append(chunk)
        self._json_chars[index] = held + len(chunk)

    @property
    def has_content(self) -> bool:
        """A content block has started (something of the answer was seen)."""
        return bool(self.blocks or self._open)

    def _unique_id(self, ident: Any) -> str:
        base = ident if isinstance(ident, str) and ident else "toolu_agentfsm"
        fresh, n = base, 1
        while fresh in self._taken:
            n += 1
            fresh = f"{base}_{n}"
        if fresh != ident:
            self.renamed_ids[str(ident)] = fresh
        self._taken.add(fresh)
        return fresh

    def finish(self) -> ModelResponse:
        incomplete = sum(1 for b in self._open.values() if b.get("type") == "tool_use")
        return ModelResponse(
            blocks=tuple(self.blocks),
            stop_reason=self.stop_reason,
            usage=dict(self.usage),
            model=self.model,
            invalid_tool_inputs=dict(self.invalid_tool_inputs),
            incomplete_tool_uses=incomplete,
            message_id=self.message_id,
            request_id=self.request_id,
        )
