"""Context governance: token estimates, and compaction by a summarisation request.

Compaction keeps the last exchange verbatim (the last assistant tool_use message and what follows it,
or the trailing user input) and replaces everything before it with one user message holding the
model's summary. A history whose earlier part holds no assistant message cannot be compacted.

The same :func:`compact` serves auto-compaction (before a call, when the estimate passes the
threshold) and reactive compaction (after the API answered prompt-too-long); only the trigger differs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.common.textsafe import json_text
from agentfsm.llm.model import ModelCallError, ModelClient, ModelRequest, RetryNotice
from agentfsm.machine import prompts
from agentfsm.machine.events import Compaction, ModelResponse
from agentfsm.machine.state import Message
from agentfsm.runtime.assembler import ResponseAssembler, StreamProtocolError
from agentfsm.runtime.request import normalize
from agentfsm.runtime.result import api_error_text

log = fsm_log.get_logger("agentfsm.compact")

# Tokens are estimated as characters / 4 wherever the API has not reported a count: the usual rough
# ratio for English text and code, and the one the scripted model reports, so estimates and reports agree.
CHARS_PER_TOKEN = 4

UsageSink = Callable[[str, Mapping[str, Any]], None]


def chars_of(blocks: Any) -> int:
    """Serialised size of any JSON-able request part (messages' blocks, system, tool schemas)."""
    return len(json_text(blocks))


def estimate_tokens(messages: Sequence[Message], last_usage: Mapping[str, Any] | None = None,
                    counted_upto: int = 0, static_tokens: int = 0) -> int:
    """Tokens the next request will carry.

    With a reported usage (the last response's input, cache and output tokens) only what was
    appended since is estimated: ``messages[counted_upto:]`` are the messages the last request did
    not carry, and an assistant message among them is that response itself — already in
    ``output_tokens`` — so it is not counted twice. Without one, chars/4 of every message plus
    ``static_tokens`` (system prompt and tool schemas, which the usage report would include).
    """
    def chars(msgs: Sequence[Message]) -> int:
        return sum(chars_of([dict(b) for b in m.content]) for m in msgs)

    if last_usage:
        reported = sum(int(last_usage.get(k) or 0) for k in (
            "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
        if reported:
            fresh = [m for m in messages[counted_upto:] if m.role != "assistant"]
            return reported + chars(fresh) // CHARS_PER_TOKEN
    return chars(messages) // CHARS_PER_TOKEN + static_tokens


def split_for_compaction(messages: Sequence[Message], *, whole: bool = False
                         ) -> tuple[list[Message], list[Message]] | None:
    """(to summarise, to keep) or None when there is nothing earlier worth summarising.

    ``whole`` (a reactive compaction): when nothing before the last exchange holds a response but the
    conversation does, all of it is summarised and nothing kept, as Claude Code 2.1.332 does after one
    tool turn answered prompt-too-long (docs/conform.md)."""
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
        if whole and any(m.role == "assistant" for m in tail):
            return list(messages), []
        return None
    return head, tail


def summary_request(messages: Sequence[Message], *, model: str, system: tuple[Mapping[str, Any], ...],
                    max_tokens: int = 8192, custom_instructions: str | None = None,
                    metadata: Mapping[str, Any] | None = None, whole: bool = False
                    ) -> tuple[ModelRequest, list[Message]] | None:
    """The summarisation request for ``messages`` (history before the last exchange plus a
    text-only instruction, no tools offered) and the messages it keeps; None when impossible."""
    split = split_for_compaction(messages, whole=whole)
    if split is None:
        return None
    head, tail = split
    return _request(head, _instruction(custom_instructions), model=model, system=system, max_tokens=max_tokens,
                    metadata=metadata), tail


def _instruction(custom_instructions: str | None) -> str:
    if custom_instructions:
        return f"{prompts.COMPACT_INSTRUCTION}\n\nAdditional instructions:\n{custom_instructions}"
    return prompts.COMPACT_INSTRUCTION


def _request(head: Sequence[Message], instruction: str, *, model: str, system: tuple[Mapping[str, Any], ...],
             max_tokens: int, metadata: Mapping[str, Any] | None) -> ModelRequest:
    """``head`` to summarise, then the instruction; no tools offered."""
    request_msgs = [*head, Message("user", instruction, kind="meta")]
    return ModelRequest(model=model, system=system, messages=tuple(normalize(request_msgs)), tools=(),
                        max_tokens=max_tokens, metadata=dict(metadata or {}))


# the summary proper: what the model wrote in its <summary> block (its <analysis> is working, not kept)
_SUMMARY_BLOCK = re.compile(r"<summary>(.*?)</summary>", re.S)
_ANALYSIS_BLOCK = re.compile(r"<analysis>.*?</analysis>\s*", re.S)


def kept_summary(text: str) -> str:
    """What of a summary answer is kept: its ``<summary>`` block, as ``Summary:`` and the block's text
    (Claude Code 2.1.332's form), or, without one, the answer less any ``<analysis>`` block."""
    block = _SUMMARY_BLOCK.search(text)
    if block is not None:
        return f"Summary:\n{block.group(1).strip()}"
    return _ANALYSIS_BLOCK.sub("", text).strip() or text.strip()


@attrs.frozen
class _Failed:
    why: str  # in the words the run's result gives
    logged: str


async def _ask(client: ModelClient, request: ModelRequest, model: str, on_usage: UsageSink | None
               ) -> ModelResponse | _Failed:
    """One summary request: its response, or why it failed (an API error, a broken or malformed stream);
    its usage goes to ``on_usage`` either way."""
    asm = ResponseAssembler()
    try:
        async for ev in client.stream(request):
            if not isinstance(ev, RetryNotice):  # the transport retrying the summary request
                asm.feed(ev)
    except (ModelCallError, StreamProtocolError) as exc:
        error = exc.error if isinstance(exc, ModelCallError) else None
        return _Failed(api_error_text(error.status, error.message, error.endpoint)
                       if error is not None and error.status is not None else str(exc), str(exc))
    finally:
        if on_usage is not None and asm.usage:
            on_usage(asm.model or model, dict(asm.usage))
    if not asm.stopped:
        return _Failed(NO_SUMMARY_MESSAGE if not asm.blocks else EMPTY_SUMMARY,
                       "summary stream ended before message_stop")
    return asm.finish()


# Why a summary failed, in Claude Code 2.1.332's words (the run's result after a prompt-too-long that
# could not be compacted says "Prompt is too long · automatic compaction failed: <why>")
NO_SUMMARY_MESSAGE = "no assistant message in summarization response"
EMPTY_SUMMARY = "summarization produced empty response"
FailureSink = Callable[[str], None]


async def compact(client: ModelClient, *, model: str, system: tuple[Mapping[str, Any], ...],
                  messages: Sequence[Message], trigger: str, max_tokens: int = 8192,
                  custom_instructions: str | None = None,
                  metadata: Mapping[str, Any] | None = None,
                  on_usage: UsageSink | None = None,
                  on_failure: FailureSink | None = None) -> Compaction | None:
    """Summarise the history before the last exchange; None when that is impossible or fails.

    A failed summarisation (API error, broken or malformed stream, no visible text) is not an
    exception: the caller decides what a failed compaction means (a counted auto-compact failure,
    or ``prompt_too_long`` for a reactive one). ``on_usage(model, usage)`` receives the summary
    request's usage so its cost counts towards the budget like any other request; ``on_failure(why)``
    why a summary request that was sent failed, in the words the run's result gives.
    """
    split = split_for_compaction(messages, whole=trigger == "reactive")
    if split is None:
        log.info("compact.impossible", trigger=trigger, messages=len(messages))
        return None
    head, tail = split
    instruction = _instruction(custom_instructions)

    async def ask(instruction: str) -> ModelResponse | _Failed:
        return await _ask(client, _request(head, instruction, model=model, system=system, max_tokens=max_tokens,
                                           metadata=metadata), model, on_usage)

    def failed(why: str, logged: str) -> None:
        log.warning("compact.failed", trigger=trigger, error=logged)
        if on_failure is not None:
            on_failure(why)

    first = await ask(instruction)
    if isinstance(first, _Failed):
        failed(first.why, first.logged)
        return None
    text = first.visible_text()
    if not text:
        failed(EMPTY_SUMMARY if first.blocks else NO_SUMMARY_MESSAGE, "the summary response had no text")
        return None
    if _SUMMARY_BLOCK.search(text) is None:
        # an answer without its <summary> block: asked once more, saying so, as Claude Code 2.1.332 does; the
        # second answer is taken when it has the block, the first otherwise (docs/conform.md)
        second = await ask(f"{instruction}\n\n{prompts.COMPACT_AGAIN}")
        again = "" if isinstance(second, _Failed) else second.visible_text()
        if _SUMMARY_BLOCK.search(again) is not None:
            text = again
        else:
            log.info("compact.kept_first_answer", trigger=trigger)
    summary = kept_summary(text)
    summary_msg = Message("user", prompts.COMPACT_SUMMARY_PREFIX + summary, kind="compact_summary")
    pre = estimate_tokens(messages)
    return Compaction(messages=(summary_msg, *tail), trigger=trigger, pre_tokens=pre, summary=summary)
