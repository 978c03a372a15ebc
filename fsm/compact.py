"""Context governance: token estimates, and compaction by a summarisation request.

Compaction keeps the last exchange verbatim (the last assistant tool_use message and what follows it,
or the trailing user input) and replaces everything before it with one user message holding the
model's summary. A history whose earlier part holds no assistant message cannot be compacted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fsm import prompts
from fsm.assembler import ResponseAssembler
from fsm.events import Compaction
from fsm.model import ModelClient, ModelRequest
from fsm.state import Message


def estimate_tokens(messages: Sequence[Message], last_usage: Mapping[str, Any] | None = None,
                    counted_upto: int = 0) -> int:
    """Tokens the next request will carry: the last response's reported context plus a chars/4
    estimate of what was appended since; chars/4 of everything when nothing was reported."""
    def chars(msgs: Sequence[Message]) -> int:
        return sum(len(json.dumps([dict(b) for b in m.content], ensure_ascii=False)) for m in msgs)

    if last_usage:
        reported = sum(int(last_usage.get(k) or 0) for k in (
            "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
        if reported:
            return reported + chars(messages[counted_upto:]) // 4
    return chars(messages) // 4


def split_for_compaction(messages: Sequence[Message]) -> tuple[list[Message], list[Message]] | None:
    """(to summarise, to keep) or None when there is nothing earlier worth summarising."""
    cut = None
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant" and m.tool_use_ids():
            cut = i
            break
    if cut is None:
        cut = len(messages)
        while cut > 0 and messages[cut - 1].role == "user":
            cut -= 1
    head, tail = list(messages[:cut]), list(messages[cut:])
    if not any(m.role == "assistant" for m in head):
        return None
    return head, tail


def _wire(messages: Sequence[Message]) -> list[dict[str, Any]]:
    from fsm.request import normalize

    return normalize(messages)


async def compact(client: ModelClient, *, model: str, system: tuple[Mapping[str, Any], ...],
                  messages: Sequence[Message], trigger: str, max_tokens: int = 8192,
                  custom_instructions: str | None = None,
                  metadata: Mapping[str, Any] | None = None) -> Compaction | None:
    """Summarise the history before the last exchange; None when that is impossible or fails."""
    split = split_for_compaction(messages)
    if split is None:
        return None
    head, tail = split
    instruction = prompts.COMPACT_INSTRUCTION
    if custom_instructions:
        instruction += f"\n\nAdditional instructions:\n{custom_instructions}"
    request_msgs = [*head, Message("user", instruction, kind="meta")]
    request = ModelRequest(model=model, system=system, messages=tuple(_wire(request_msgs)), tools=(),
                           max_tokens=max_tokens, metadata=dict(metadata or {}))
    asm = ResponseAssembler()
    from fsm.model import ModelCallError

    try:
        async for ev in client.stream(request):
            asm.feed(ev)
    except ModelCallError:
        return None
    summary = asm.finish().visible_text()
    if not summary:
        return None
    summary_msg = Message("user", prompts.COMPACT_SUMMARY_PREFIX + summary, kind="compact_summary")
    pre = estimate_tokens(messages)
    return Compaction(messages=(summary_msg, *tail), trigger=trigger, pre_tokens=pre, summary=summary)
