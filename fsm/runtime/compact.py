"""Context governance: token estimates, and compaction by a summarisation request.

Auto-compaction (before a call, when the estimate passes the threshold) keeps the last exchange verbatim
(the last assistant tool_use message and what follows it, or the trailing user input) and replaces
everything before it with one user message holding the model's summary
(:func:`split_for_compaction`). Reactive compaction (after the API answered prompt-too-long) splits as
Claude Code 2.1.332 does (:func:`reactive_split`), and shows again the files read in the part it
summarised (:func:`reread_reminders`). A history whose earlier part holds no assistant message cannot be
compacted.
"""

from __future__ import annotations

import json
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


def split_for_compaction(messages: Sequence[Message]) -> tuple[list[Message], list[Message]] | None:
    """An auto-compaction's (to summarise, to keep), or None when there is nothing earlier worth summarising."""
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


# --- which messages a reactive compaction summarises -------------------------------------------------
#
# Claude Code 2.1.332, oracle runs of issue 27 (docs/conform.md; recorded in tests/fidelity/recorded/compact_*.json):
# N tool rounds, then a 400 prompt-too-long, with small tool results. The conversation is taken in rounds: the
# messages before the first response, then each response with what follows it.
# - The API's message gives the sizes (``N tokens > M``): the older half of the rounds is summarised (rounds
#   // 2, the prompt's round counted, at least the prompt and one response) and the rest kept verbatim. N = 2,
#   3, 4 → one response summarised; 5, 6 → 2; 7, 8 → 3; 9, 10 → 4; 12 → 5; the same for 200001, 201000,
#   210000, 300000, 400000 and 2000000 tokens over 200000, and for 150000 over 100000 (N = 6).
# - It does not (``prompt is too long`` alone): only the last round is kept (N = 2…10).
# - The whole conversation is summarised when what would be summarised holds no response (one round after the
#   prompt); with the sizes given, the prompt's round is then left out of the summary request, the
#   truncation marker in its place, and the summary says a part is not covered (without them, neither).
# Where the tool results are large, Claude Code keeps fewer rounds than this (a few thousand tokens' worth;
# its rule there depends on the sizes and was not settled, docs/conform.md): the rule here is exact for
# rounds of a few hundred tokens, which is what the kit's cases draw.


@attrs.frozen
class Split:
    """A reactive compaction's split: ``summarised`` goes to the summary request (the first round left out
    when ``truncated``: the marker stands for it), ``kept`` follows the summary verbatim."""

    summarised: tuple[Message, ...]
    kept: tuple[Message, ...]
    truncated: bool = False


def rounds(messages: Sequence[Message]) -> list[list[Message]]:
    """The messages before the first response, then each response with the messages that follow it."""
    out: list[list[Message]] = []
    for m in messages:
        if m.role == "assistant" or not out:
            out.append([m])
        else:
            out[-1].append(m)
    return out


def reactive_split(messages: Sequence[Message], api_message: str = "") -> Split | None:
    """What a compaction after the API's prompt-too-long ``api_message`` summarises and keeps (the rule
    above); None when the conversation holds no response (nothing to summarise)."""
    if not any(m.role == "assistant" for m in messages):
        return None
    groups = rounds(messages)
    sized = prompts.states_sizes(api_message)
    head = max(2, len(groups) // 2) if sized else len(groups) - 1

    def flat(gs: Sequence[list[Message]]) -> tuple[Message, ...]:
        return tuple(m for g in gs for m in g)

    if head < len(groups) and any(m.role == "assistant" for m in flat(groups[:head])):
        return Split(flat(groups[:head]), flat(groups[head:]))
    # the whole conversation; with the sizes given, its first round (the prompt, no response in it) left out
    truncated = sized and len(groups) > 1 and not any(m.role == "assistant" for m in groups[0])
    return Split(flat(groups[1:]) if truncated else flat(groups), (), truncated)


def _result_text(block: Mapping[str, Any]) -> str | None:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple) and content and all(b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    return None


def _reads(messages: Sequence[Message]) -> dict[str, str]:
    """The files a run's Read calls in ``messages`` read (their results' texts, errors left out), by path, the
    latest last."""
    calls: dict[str, str] = {}
    found: dict[str, str] = {}
    for m in messages:
        for b in m.content:
            if b.get("type") == "tool_use" and b.get("name") == "Read" and isinstance(b.get("input"), Mapping):
                path = b["input"].get("file_path")
                if isinstance(path, str):
                    calls[str(b.get("id"))] = path
            elif b.get("type") == "tool_result" and not b.get("is_error") and str(b.get("tool_use_id")) in calls:
                text = _result_text(b)
                if text is not None:
                    path = calls[str(b.get("tool_use_id"))]
                    found.pop(path, None)
                    found[path] = text
    return found


def reread_reminders(summarised: Sequence[Message], kept: Sequence[Message]) -> list[str]:
    """The files read in the summarised part and not in the kept one, shown again after the summary, as Claude
    Code 2.1.332 does (tests/fidelity/recorded/compact_*.json): for each, latest first, the call
    (``{"file_path": ...}``) and the result the model saw, each a reminder of its own."""
    in_kept = set(_reads(kept)) | {b["input"].get("file_path") for m in kept for b in m.content
                                   if b.get("type") == "tool_use" and b.get("name") == "Read"
                                   and isinstance(b.get("input"), Mapping)}
    out: list[str] = []
    for path, text in reversed(list(_reads(summarised).items())):
        if path in in_kept:
            continue
        called = json.dumps({"file_path": path}, ensure_ascii=False, separators=(",", ":"))
        out += [prompts.REREAD_CALLED.format(input=called), prompts.REREAD_RESULT.format(result=text)]
    return out


def _with_reminders(kept: Sequence[Message], reminders: Sequence[str]) -> tuple[Message, ...]:
    """``kept`` with ``reminders`` after the last tool result (its text's trailing blanks dropped, as Claude
    Code joins a reminder to a result), or as a message of their own when the kept part ends otherwise."""
    if not reminders:
        return tuple(kept)
    joined = "".join(f"\n\n{r}" for r in reminders)
    last = kept[-1]
    slots = [i for i, b in enumerate(last.content) if b.get("type") == "tool_result"]
    if last.role == "user" and slots:
        i = slots[-1]
        block = dict(last.content[i])
        content = block.get("content")
        if isinstance(content, str):
            block["content"] = content.rstrip() + joined
        else:
            block["content"] = [*(content or []), {"type": "text", "text": joined.lstrip()}]
        blocks = (*last.content[:i], block, *last.content[i + 1:])
        return (*kept[:-1], attrs.evolve(last, content=blocks))
    return (*kept, Message("user", tuple({"type": "text", "text": r} for r in reminders), kind="meta"))


def summary_request(messages: Sequence[Message], *, model: str, system: tuple[Mapping[str, Any], ...],
                    max_tokens: int = 8192, custom_instructions: str | None = None,
                    metadata: Mapping[str, Any] | None = None
                    ) -> tuple[ModelRequest, list[Message]] | None:
    """The summarisation request for ``messages`` (history before the last exchange plus a
    text-only instruction, no tools offered) and the messages it keeps; None when impossible."""
    split = split_for_compaction(messages)
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
                  on_failure: FailureSink | None = None,
                  api_message: str = "") -> Compaction | None:
    """Summarise the history; None when that is impossible or fails.

    Auto-compaction summarises all but the last exchange (:func:`split_for_compaction`); a reactive one splits
    by :func:`reactive_split`, ``api_message`` being the API's prompt-too-long message, and shows again the
    files read in what it summarised (:func:`reread_reminders`).

    A failed summarisation (API error, broken or malformed stream, no visible text) is not an
    exception: the caller decides what a failed compaction means (a counted auto-compact failure,
    or ``prompt_too_long`` for a reactive one). ``on_usage(model, usage)`` receives the summary
    request's usage so its cost counts towards the budget like any other request; ``on_failure(why)``
    why a summary request that was sent failed, in the words the run's result gives.
    """
    if trigger == "reactive":
        split = reactive_split(messages, api_message)
        if split is None:
            log.info("compact.impossible", trigger=trigger, messages=len(messages))
            return None
        summarised, kept, truncated = split.summarised, split.kept, split.truncated
        head = [Message("user", prompts.COMPACT_TRUNCATION_MARKER, kind="meta"), *summarised] if truncated \
            else list(summarised)
    else:
        old = split_for_compaction(messages)
        if old is None:
            log.info("compact.impossible", trigger=trigger, messages=len(messages))
            return None
        head, tail = old
        summarised, kept, truncated = tuple(head), tuple(tail), False
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
    pre = estimate_tokens(messages)
    if trigger != "reactive":
        summary_msg = Message("user", prompts.COMPACT_SUMMARY_PREFIX + summary, kind="compact_summary")
        return Compaction(messages=(summary_msg, *kept), trigger=trigger, pre_tokens=pre, summary=summary)
    notes = [*([prompts.COMPACT_TRUNCATED_NOTE] if truncated else []), *([prompts.COMPACT_KEPT_NOTE] if kept else [])]
    body = "\n\n".join([prompts.COMPACT_SUMMARY_PREFIX + summary, *notes])
    reminders = reread_reminders(summarised, kept)
    if kept:
        out = (Message("user", body, kind="compact_summary"), *_with_reminders(kept, reminders))
    else:
        # nothing kept: the files come first, then the summary (Claude Code 2.1.332,
        # tests/fidelity/recorded/compact_one_read.json), in one message so that no newline joins them on the wire
        blocks = tuple({"type": "text", "text": t} for t in (*reminders, body))
        out = (Message("user", blocks, kind="compact_summary"),)
    return Compaction(messages=out, trigger=trigger, pre_tokens=pre, summary=summary)
