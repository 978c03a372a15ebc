"""What the driver observed, handed to :func:`fsm.graph.decide`. Plain frozen records, no behaviour."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fsm.state import Message, TerminalReason


@attrs.frozen
class ModelError:
    """A failed model call, classified once so the graph never parses error strings.

    kind: ``prompt_too_long`` | ``image`` | ``api`` (a structured API error) | ``model`` (malformed
    stream, invariant broken) | ``overloaded`` | ``connection``.
    """

    kind: str
    message: str
    status: int | None = None
    retryable: bool = False


@attrs.frozen
class ModelResponse:
    """One assembled model response. ``blocks`` holds every content block that reached its
    ``content_block_stop``; ``invalid_tool_inputs`` maps tool_use ids whose JSON did not parse to the
    raw text (those blocks carry ``input: {}``); ``incomplete_tool_uses`` counts tool_use blocks the
    stream started but never finished."""

    blocks: tuple[Mapping[str, Any], ...] = ()
    stop_reason: str | None = None
    usage: Mapping[str, Any] = attrs.field(factory=dict)
    model: str = ""
    invalid_tool_inputs: Mapping[str, str] = attrs.field(factory=dict)
    incomplete_tool_uses: int = 0

    def tool_uses(self) -> list[Mapping[str, Any]]:
        return [b for b in self.blocks if b.get("type") == "tool_use"]

    def usable_tool_uses(self) -> list[Mapping[str, Any]]:
        return [b for b in self.tool_uses() if b["id"] not in self.invalid_tool_inputs]

    def visible_text(self) -> str:
        return "".join(b.get("text", "") for b in self.blocks if b.get("type") == "text").strip()

    def has_thinking(self) -> bool:
        return any(b.get("type") in ("thinking", "redacted_thinking") for b in self.blocks)

    def as_message(self) -> Message:
        return Message("assistant", self.blocks, kind="assistant")


@attrs.frozen
class Compaction:
    """A finished compaction: the messages that replace the history, and what it cost."""

    messages: tuple[Message, ...]
    trigger: str  # "auto" | "reactive" | "manual"
    pre_tokens: int = 0
    summary: str = ""


# --- events, by the phase that consumes them -------------------------------------------------


@attrs.frozen
class Assembled:
    """assemble finished: optional auto-compaction result and absorbed queued input."""

    compaction: Compaction | None = None
    compact_failed: bool = False
    rapid_refill: bool = False
    attachments: tuple[Message, ...] = ()


@attrs.frozen
class SetupFailed:
    reason: TerminalReason
    detail: str


@attrs.frozen
class Refused:
    """call_model preflight said no (blocking limit, budget, background request)."""

    reason: TerminalReason
    detail: str


@attrs.frozen
class StreamOpened:
    model: str = ""


@attrs.frozen
class CallFailed:
    """The request failed before or during streaming, after the transport's own retries.

    ``compaction`` is set when a reactive compaction was tried (and succeeded) for a prompt-too-long
    error; ``fallback_available`` says another model of the fallback chain is left to try.
    ``partial`` / ``partial_results`` pair any tool_use that already ran when the loop gives up.
    """

    error: ModelError
    compaction: Compaction | None = None
    fallback_available: bool = False
    partial: Message | None = None
    partial_results: Message | None = None


@attrs.frozen
class StreamEnded:
    response: ModelResponse
    structured_output_required: bool = False


@attrs.frozen
class StopHookVerdict:
    """Stop hooks' combined answer. ``blocked`` re-enters with ``reason``; ``prevented`` ends the run
    (``continue: false``) with ``stop_reason``."""

    blocked: bool = False
    reason: str = ""
    prevented: bool = False
    stop_reason: str = ""


@attrs.frozen
class ToolsDrained:
    """Every tool of the batch has its result. ``results`` is the one user message with every
    tool_result; the flags say how the batch ended (SPEC §3 step 5, in that order)."""

    assistant: Message
    results: Message
    aborted: bool = False
    deferred: bool = False
    hook_stopped: bool = False
    hook_stop_reason: str = ""
    ends_turn: bool = False
    post_batch_blocked: bool = False
    post_batch_reason: str = ""
    attachments: tuple[Message, ...] = ()
    context_layers: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Aborted:
    """The user (or the host) cancelled. ``partial``/``partial_results`` pair every tool_use shown."""

    partial: Message | None = None
    partial_results: Message | None = None
    detail: str = "Request interrupted by user"


Event = (
    Assembled
    | SetupFailed
    | Refused
    | StreamOpened
    | CallFailed
    | StreamEnded
    | StopHookVerdict
    | ToolsDrained
    | Aborted
)
