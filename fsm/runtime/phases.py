"""The work of each phase that does not depend on how the loop is run.

What the request of a turn is, how a failed model call is classified, what a finished tool batch
reports to the machine, what the Stop hooks' answer means, the stream-json messages a step shows. (How
a response cut off mid-way is paired is the machine's: :func:`agentfsm.machine.graph.pair_shown`.) The local
driver (:mod:`agentfsm.runtime.driver`) performs the phases on one event loop; a Temporal workflow
(:mod:`agentfsm.temporal`) performs them as activities. Both call these functions, so the two
runtimes build the same requests, events and messages from the same facts.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.llm.model import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    ModelCallError,
    ModelRequest,
    RetryNotice,
    StreamEvent,
)
from agentfsm.machine import graph, prompts
from agentfsm.machine.events import (
    ModelError,
    ModelResponse,
    SetupFailed,
    StopHookVerdict,
    StreamEnded,
    ToolsDrained,
)
from agentfsm.machine.state import Limits, LoopState, Message, TerminalReason, appended, new_id
from agentfsm.runtime.assembler import StreamProtocolError
from agentfsm.runtime.compact import chars_of, estimate_tokens
from agentfsm.runtime.pipeline import CallResult
from agentfsm.runtime.request import normalize
from agentfsm.runtime.result import ZERO_USAGE, RunAccount, api_error_kind, api_error_text, shows_api_error
from agentfsm.tools.structured_output import NAME as STRUCTURED_OUTPUT

Prompt = str | Sequence[Mapping[str, Any]]

# what a model call that produced no stream, or a stream without its end, is
# an empty stream is a garbled answer: nothing was shown, the request may be made again without streaming
EMPTY_STREAM = ModelError("stream_garbled", "The API returned an empty stream", None, True)
ENDED_EARLY = ModelError("connection", "The stream ended before message_stop", None, True)


# --- the prompt ----------------------------------------------------------------------------------


def first_message(prompt: Prompt) -> tuple[Message, str]:
    """The run's prompt as a user message, and its text (what UserPromptSubmit hooks see)."""
    content = prompt if not isinstance(prompt, str) else ({"type": "text", "text": prompt},)
    text = prompt if isinstance(prompt, str) else "".join(b.get("text", "") for b in content)
    return Message("user", tuple(content), kind="prompt"), text


def prompt_verdict(first: Message, outcome: Any) -> tuple[Message, SetupFailed | None, bool]:
    """What UserPromptSubmit's answer does to the prompt: ``(prompt, setup failure, erased)``. A blocked
    prompt (exit 2, decision block) or ``continue: false`` is erased: it never reaches the model or
    the history; extra context rides with the prompt as a reminder."""
    if outcome.blocked or outcome.stop:
        reason = (outcome.stop_reason if outcome.stop else outcome.reason) or "prompt blocked by hook"
        return first, SetupFailed(TerminalReason.HOOK_STOPPED, reason), True
    if outcome.additional_context:
        # before the prompt, labelled, as Claude Code sends them: plain stdout is the hook's "success"
        plain = list(getattr(outcome, "plain_context", ()) or ())
        labelled = []
        for text in outcome.additional_context:
            kind = "success" if text in plain else "additional context"
            if text in plain:
                plain.remove(text)
            labelled.append(f"UserPromptSubmit hook {kind}: {text}")
        first = attrs.evolve(first, content=prompts.reminder_blocks(labelled) + first.content)
    return first, None, False


def with_budget(first: Message, max_budget_usd: float | None, spent_usd: float) -> Message:
    """The prompt with the ``--max-budget-usd`` reminder first (what is spent and left), as Claude Code
    2.1.332 sends it with the prompt; unchanged without a budget."""
    if max_budget_usd is None:
        return first
    block = {"type": "text", "text": prompts.budget_reminder(spent_usd, max_budget_usd)}
    return attrs.evolve(first, content=(block, *first.content))


def recorded_prompt(first: Message, erased: bool) -> Message:
    """The prompt record that marks where a run starts in the session file (``erased_prompt`` when a
    hook erased it; resume leaves that out of the history)."""
    return attrs.evolve(first, kind="erased_prompt") if erased else first


def deferred_calls(history: Sequence[Message]) -> list[Mapping[str, Any]]:
    """The tool calls a PreToolUse hook deferred when the history (a resumed run's) ends with them;
    empty otherwise."""
    if len(history) < 2 or history[-1].kind != graph.DEFERRED_RESULTS or history[-2].role != "assistant":
        return []
    return [b for b in history[-2].content if b.get("type") == "tool_use"]


def deferred_unavailable(calls: Sequence[Mapping[str, Any]], registry: Any) -> SetupFailed | None:
    """A deferred call whose tool this session no longer offers cannot be resumed."""
    missing = [b["name"] for b in calls if registry.get(b["name"]) is None]
    if not missing:
        return None
    return SetupFailed(TerminalReason.TOOL_DEFERRED_UNAVAILABLE,
                       f"The deferred tool call cannot be resumed: {', '.join(missing)} is no longer available "
                       f"(available tools: {', '.join(registry.names()) or 'none'}).")


def deferred_resumed(history: Sequence[Message], results: Sequence[CallResult]
                     ) -> tuple[tuple[Message, ...], SetupFailed | None]:
    """The history with the deferred calls' real results where the deferral's stood; deferred again,
    the run ends ``tool_deferred`` once more, before any request."""
    deferred = len(results) == 1 and results[0].deferred
    replaced = Message("user", tuple(r.block for r in results),
                       kind=graph.DEFERRED_RESULTS if deferred else "tool_results")
    messages = (*history[:-1], replaced)
    if deferred:
        return messages, SetupFailed(TerminalReason.TOOL_DEFERRED,
                                     "The resumed tool call was deferred again by a PreToolUse hook")
    return messages, None


def structured_output_setup(registry: Any, schema: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    """The registry plus the ``StructuredOutput`` tool when a JSON schema asks for it (unless the
    session already registered one); and the setup error when the schema is not a JSON Schema (it
    cannot be offered as a tool: the run's setup fails)."""
    if schema is None or registry.get(STRUCTURED_OUTPUT) is not None:
        return registry, None
    from agentfsm.tools.registry import ToolRegistry
    from agentfsm.tools.schema import schema_error
    from agentfsm.tools.structured_output import StructuredOutputTool

    try:
        return ToolRegistry([*registry.tools(), StructuredOutputTool(schema)]), None
    except Exception as exc:
        if (why := schema_error(exc)) is None:
            raise
        return registry, f"Turn setup failed: the JSON schema for structured output is invalid: {why}"


# --- assemble and call_model ---------------------------------------------------------------------


def model_for(models: Sequence[str], state: LoopState) -> str:
    """The model the next request goes to: the fallback chain's entry at ``state.model_index``."""
    return models[min(state.model_index, len(models) - 1)]


def has_fallback(models: Sequence[str], state: LoopState) -> bool:
    return state.model_index + 1 < len(models)


def request_metadata(session_id: str) -> dict[str, str]:
    return {"user_id": f"session_{session_id}"}


def static_tokens(system: Sequence[Mapping[str, Any]], tool_schemas: Sequence[Mapping[str, Any]]) -> int:
    """System prompt and tool schemas: part of every request, in no message."""
    return (chars_of(list(system)) + chars_of(list(tool_schemas))) // 4


def estimate(account: RunAccount, messages: Sequence[Message], static: int) -> int:
    """Tokens the next request will carry, anchored on the last reported usage."""
    return estimate_tokens(messages, account.last_usage, account.counted_upto, static_tokens=static)


def build_request(messages: Sequence[Message], *, model: str, system: Sequence[Mapping[str, Any]],
                  tools: Sequence[Mapping[str, Any]], limits: Limits,
                  metadata: Mapping[str, Any], wire: Sequence[Mapping[str, Any]] | None = None,
                  task_budget: int | None = None, thinking: Mapping[str, Any] | None = None) -> ModelRequest:
    """The Messages request of a turn: the wire view of ``messages`` (history plus queued input);
    ``wire``: that view already built (a caller that keeps it incrementally, request by request);
    ``task_budget``: the tokens the model is told the whole task may take (Claude Code's
    ``--task-budget``, sent with every request); ``thinking``: the API's thinking configuration, when
    the run asked for one (``--max-thinking-tokens``, ``--thinking``)."""
    output_config = {"task_budget": {"type": "tokens", "total": task_budget}} if task_budget is not None else None
    return ModelRequest(model=model, system=tuple(system),
                        messages=tuple(normalize(messages) if wire is None else wire),
                        tools=tuple(tools), max_tokens=limits.max_output_tokens, metadata=dict(metadata),
                        output_config=output_config, thinking=thinking)


def open_error(exc: BaseException) -> ModelError:
    """A request that failed before its first stream event (after the transport's own retries)."""
    if isinstance(exc, StopAsyncIteration):
        return EMPTY_STREAM
    if isinstance(exc, ModelCallError):
        return exc.error
    # outside the transport's error contract: a client bug, not a retryable fault
    return ModelError("model", f"Model call failed: {type(exc).__name__}: {exc}")


def stream_error(exc: BaseException, *, has_content: bool = True) -> ModelError:
    """A stream that broke part-way: a classified transport error, a protocol violation (garbled
    before any content block: nothing was shown, the request can be made again), or anything else
    (``model_error``)."""
    if isinstance(exc, ModelCallError):
        return exc.error
    if isinstance(exc, StreamProtocolError):
        kind = "model" if has_content else "stream_garbled"
        return ModelError(kind, f"Malformed stream from the API: {exc}", None, not has_content)
    return ModelError("model", f"Model stream failed: {type(exc).__name__}: {exc}")


def account_response(account: RunAccount, response: ModelResponse, default_model: str,
                     request_messages: int) -> None:
    """Spend a finished response's usage and anchor the next estimate on it."""
    account.spend(response.model or default_model, response.usage)
    account.stop_reason, account.api_error_status, account.api_error_endpoint = response.stop_reason, None, ""
    account.anchor(response.usage, request_messages)


# --- stream --------------------------------------------------------------------------------------


def stream_ended(response: ModelResponse, *, json_schema: bool, cost_usd: float = 0.0,
                 started: tuple[str, ...] = (), finished: tuple[Mapping[str, Any], ...] = ()) -> StreamEnded:
    return StreamEnded(response, json_schema=json_schema,
                       structured_output_ids=calls_of(response.tool_uses(), STRUCTURED_OUTPUT), cost_usd=cost_usd,
                       started=started, finished=finished)


# --- dispatch_tools ------------------------------------------------------------------------------


def in_model_order(assistant: Message, results: Sequence[CallResult]) -> list[CallResult]:
    """The batch's results in the order of the calls (results are paired by id, never by completion)."""
    by_id = {r.tool_use_id: r for r in results}
    return [by_id[i] for i in assistant.tool_use_ids()]


def account_batch(account: RunAccount, ordered: Sequence[CallResult]) -> None:
    """What a batch adds to the run's account: permission denials and the structured output."""
    for r in ordered:
        if r.permission_denial is not None:
            account.denials.append(r.permission_denial)
        if r.tool_name == STRUCTURED_OUTPUT and not r.is_error:
            account.structured_output = r.output_data


def results_message(ordered: Sequence[CallResult]) -> Message:
    """The user message of a batch: its results, then any text blocks the calls add (hook context)."""
    after = tuple(b for r in ordered for b in r.after)
    return Message("user", tuple(r.block for r in ordered) + after, kind="tool_results")


def post_batch_input(assistant: Message, ordered: Sequence[CallResult]) -> list[dict[str, Any]]:
    """What PostToolBatch hooks are told of the batch."""
    inputs = {b.get("id"): b.get("input", {}) for b in assistant.content if b.get("type") == "tool_use"}
    return [{"tool_name": r.tool_name, "tool_input": dict(inputs.get(r.tool_use_id) or {}),
             "tool_use_id": r.tool_use_id, "tool_response": r.block.get("content")} for r in ordered]


def with_budget_result(user: Message, max_budget_usd: float | None, spent_usd: float) -> Message:
    """The batch's results with the ``--max-budget-usd`` reminder (what is spent and left) appended to the
    last tool result, as Claude Code 2.1.332 does for every batch (it puts its own ``<total_tokens>``
    reminder first, which agentfsm does not send); unchanged without a budget."""
    at = next((i for i in range(len(user.content) - 1, -1, -1)
               if user.content[i].get("type") == "tool_result"), None)
    if max_budget_usd is None or at is None:
        return user
    note = prompts.budget_reminder(spent_usd, max_budget_usd)
    last = dict(user.content[at])
    content = last.get("content")
    if isinstance(content, str) or content is None:
        last["content"] = f"{content or ''}\n\n{note}"
    else:
        last["content"] = [*content, {"type": "text", "text": note}]
    return attrs.evolve(user, content=(*user.content[:at], last, *user.content[at + 1:]))


def batch_drained(assistant: Message, ordered: Sequence[CallResult], *, interrupted: bool, post: Any,
                  context_layers: Mapping[str, Any], budget: tuple[float | None, float] = (None, 0.0)
                  ) -> ToolsDrained:
    """The event of a finished batch. ``interrupted``: the user interrupted while it ran (PostToolBatch
    did not run: ``post`` is None); ``post``: PostToolBatch's combined answer; ``budget``: the run's
    ``--max-budget-usd`` and its spend so far (:func:`with_budget_result`)."""
    user = results_message(ordered)
    if interrupted:
        return ToolsDrained(assistant=assistant, results=user, aborted=True)
    user = with_budget_result(user, *budget)
    stop = next((r for r in ordered if r.stop), None)
    if post.additional_context:
        user = attrs.evolve(user, content=user.content + prompts.reminder_blocks(post.additional_context))
    return ToolsDrained(
        assistant=assistant, results=user, deferred_ids=tuple(r.tool_use_id for r in ordered if r.deferred),
        hook_stopped=stop is not None, hook_stop_reason=stop.stop_reason if stop else "",
        ends_turn=any(r.ends_turn for r in ordered), post_batch_blocked=post.blocked or post.stop,
        post_batch_reason=post.reason or post.stop_reason, context_layers=dict(context_layers),
        structured_output_ids=calls_of(assistant.content, STRUCTURED_OUTPUT))


def calls_of(blocks: Sequence[Mapping[str, Any]], name: str) -> tuple[str, ...]:
    return tuple(b["id"] for b in blocks if b.get("type") == "tool_use" and b.get("name") == name)


# --- stop ----------------------------------------------------------------------------------------


def last_assistant_text(messages: Sequence[Message]) -> str:
    """What Stop hooks are shown: the text of the last assistant message."""
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    return last.text() if last else ""


def stop_verdict(outcome: Any) -> StopHookVerdict:
    return StopHookVerdict(blocked=outcome.blocked, reason=outcome.reason, prevented=outcome.prevented,
                           stop_reason=outcome.stop_reason, context=tuple(outcome.additional_context))


# --- what a run shows ---------------------------------------------------------------------------

# The Claude Code release whose headless protocol this loop speaks. The Agent SDK reads it from
# `system/init` and warns when it is older than what the SDK needs (2.1.248 for SDK 0.2.189).
CLAUDE_CODE_VERSION = "2.1.332"


def api_key_source() -> str:
    return next((n for n in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN") if os.environ.get(n)), "none")


def init_message(*, cwd: str, session_id: str, tools: Sequence[str], model: str, permission_mode: str,
                 agents: Sequence[str], transcript_path: str, **extra: Any) -> dict[str, Any]:
    """``system/init``, with the fields of Claude Code's that the Agent SDK and its users read;
    ``claude_code_version`` is the protocol release this loop speaks (the SDK checks it). ``extra``
    adds fields (a workflow-backed run names its workflow)."""
    from agentfsm import __version__

    return {"type": "system", "subtype": "init", "cwd": cwd, "session_id": session_id, "tools": list(tools),
            "mcp_servers": [], "model": model, "permissionMode": permission_mode, "slash_commands": [],
            "apiKeySource": api_key_source(), "claude_code_version": CLAUDE_CODE_VERSION,
            "output_style": "default", "agents": list(agents), "skills": [], "plugins": [],
            "uuid": str(uuid.uuid4()), "agentfsm_version": __version__, "transcript_path": transcript_path,
            **extra}


# --- what a step shows -----------------------------------------------------------------------------


def rewrote_history(before: LoopState, step: graph.Step) -> bool:
    """The step replaced the history (compaction) rather than appending to it."""
    old, new = before.messages, step.state.messages
    return new is not old and not appended(old, new)


def stop_feedback_message(session_id: str, event: StopHookVerdict) -> dict[str, Any]:
    """The stream-json message of a Stop hook's block that re-entered: its feedback as a synthetic user
    message, as Claude Code prints it (a re-entry for additionalContext alone prints nothing)."""
    text = prompts.STOP_HOOK_FEEDBACK.format(reason=event.reason)
    return {"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": text}]},
            "parent_tool_use_id": None, "session_id": session_id, "isSynthetic": True}


def warning_message(session_id: str, notice: str) -> dict[str, Any]:
    return {"type": "system", "subtype": "warning", "message": notice, "session_id": session_id}


def compact_boundary_message(session_id: str, event: Any) -> dict[str, Any]:
    """The stream-json message of a step that compacted the history."""
    compaction = getattr(event, "compaction", None)
    return {"type": "system", "subtype": "compact_boundary", "session_id": session_id,
            "compact_metadata": {"trigger": "manual" if compaction and compaction.trigger == "manual" else "auto",
                                 "pre_tokens": compaction.pre_tokens if compaction else 0}}


def tombstone_message(session_id: str, message_id: str, blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Withdraws what a response that is requested again (or was lost) already showed: its blocks and
    the results of its tool calls (stream-json consumers drop them; they never reach history)."""
    return {"type": "system", "subtype": "tombstone", "session_id": session_id, "message_id": message_id,
            "blocks": len(blocks), "tool_use_ids": [b["id"] for b in blocks if b.get("type") == "tool_use"]}


def stream_event_message(ev: StreamEvent, *, session_id: str, message_id: str,
                         ttft_ms: int | None = None) -> dict[str, Any]:
    """The stream-json ``stream_event`` of one stream event, in its wire form (Claude Code's partial
    messages: the first carries the time to it from the request)."""
    msg: dict[str, Any] = {"type": "stream_event", "event": wire_event(ev, message_id), "session_id": session_id,
                           "parent_tool_use_id": None}
    if ttft_ms is not None:
        msg["ttft_ms"] = ttft_ms
    if message_id:
        msg["api_message_id"] = message_id
    return msg


def wire_event(ev: StreamEvent, message_id: str) -> dict[str, Any]:
    """A stream event record as the Messages API streamed it."""
    if isinstance(ev, MessageStart):
        return {"type": "message_start", "message": {
            "id": ev.message_id or message_id, "type": "message", "role": "assistant", "model": ev.model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": dict(ev.usage)}}
    if isinstance(ev, BlockStart):
        return {"type": "content_block_start", "index": ev.index, "content_block": dict(ev.block)}
    if isinstance(ev, BlockDelta):
        return {"type": "content_block_delta", "index": ev.index, "delta": dict(ev.delta)}
    if isinstance(ev, BlockStop):
        return {"type": "content_block_stop", "index": ev.index}
    if isinstance(ev, MessageDelta):
        return {"type": "message_delta", "delta": {"stop_reason": ev.stop_reason, "stop_sequence": None},
                "usage": dict(ev.usage)}
    return {"type": "message_stop"}


def requesting_message(session_id: str) -> dict[str, Any]:
    """``system``/``status`` before each model request (printed with partial messages)."""
    return {"type": "system", "subtype": "status", "status": "requesting", "session_id": session_id}


def api_error_message(status: int, detail: str | None, session_id: str, endpoint: str = "") -> dict[str, Any]:
    """The synthetic assistant message that shows an API error in the stream (Claude Code's form)."""
    return {"type": "assistant", "message": {
        "id": str(new_id()), "type": "message", "role": "assistant", "model": "<synthetic>",
        "content": [{"type": "text", "text": api_error_text(status, detail, endpoint)}], "stop_reason": "stop_sequence",
        "stop_sequence": "", "usage": dict(ZERO_USAGE)}, "parent_tool_use_id": None, "session_id": session_id,
        "error": api_error_kind(status), "is_api_error_message": True, "api_error_status": status}


def closing_messages(state: LoopState, began_after: str | None, api_error_status: int | None,
                     session_id: str, endpoint: str = "") -> list[dict[str, Any]]:
    """What the client is shown after the loop ended and before the result: Claude Code's synthetic
    assistant message for an API refusal it shows in its generic form, and the marker that closes an
    interrupted run (``began_after``: the uuid of the history's last message when the loop began, so
    a marker the history already ended with is not shown again, even after a compaction)."""
    shown: list[dict[str, Any]] = []
    if state.terminal_reason is TerminalReason.API_ERROR and shows_api_error(api_error_status):
        shown.append(api_error_message(api_error_status or 0, state.terminal_detail, session_id, endpoint))
    last = state.messages[-1] if state.messages else None
    if last is not None and last.kind == "interrupt_marker" and last.uuid != began_after:
        shown.append(marker_message(last, session_id))
    return shown


def retry_message(notice: RetryNotice, session_id: str) -> dict[str, Any]:
    """``system``/``api_retry``: a request the transport retries, as it happens."""
    return {"type": "system", "subtype": "api_retry", "attempt": notice.attempt, "max_retries": notice.max_retries,
            "retry_delay_ms": notice.delay_ms, "error_status": notice.status, "error": notice.error,
            "session_id": session_id}


class ResultsShown:
    """The tool results a run shows the client, each once (by its tool_use id): a result that an
    executor's on_ready showed as soon as it could is not shown again when its batch drains or its
    response is paired. :meth:`reset` for each response."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], session_id: str) -> None:
        self.emit = emit
        self.session_id = session_id
        self._ids: set[str] = set()

    def reset(self) -> None:
        self._ids = set()

    def calls(self, results: Sequence[CallResult]) -> None:
        """How calls ended, with the structured result each tool gave for SDK users."""
        for r in results:
            if not r.deferred:  # a deferred call has no result yet (the run's result names it, as Claude Code)
                self.block(r.block, r.structured)

    def block(self, block: Mapping[str, Any], structured: Any = None) -> None:
        tid = block.get("tool_use_id", "")
        if tid in self._ids:
            return
        self._ids.add(tid)
        self.emit(result_message(block, self.session_id, structured))


def marker_message(message: Any, session_id: str) -> dict[str, Any]:
    """The stream-json message of an interrupt marker (a visible user message of the history)."""
    return {"type": "user", "message": {"role": "user", "content": [dict(b) for b in message.content]},
            "parent_tool_use_id": None, "session_id": session_id}


def result_message(block: Mapping[str, Any], session_id: str, structured: Any = None) -> dict[str, Any]:
    """The stream-json message of one tool result, with what an SDK user receives as its structured
    result (``tool_use_result``, see :func:`tool_use_result`)."""
    return {"type": "user", "message": {"role": "user", "content": [dict(block)]},
            "parent_tool_use_id": None, "session_id": session_id,
            "tool_use_result": tool_use_result(block, structured)}


_ERROR_TAGS = re.compile(r"^<tool_use_error>(.*)</tool_use_error>$", re.DOTALL)


def tool_use_result(block: Mapping[str, Any], structured: Any = None) -> Any:
    """A call's result as SDK users receive it: the tool's ``structured`` object when it gave one;
    for a failed call, Claude Code's ``Error: ...`` text (the model's text without the
    ``<tool_use_error>`` wrapper); else the content the model received."""
    if structured is not None:
        return structured
    content = block.get("content")
    if not block.get("is_error"):
        return content
    text = content if isinstance(content, str) else "".join(
        str(b.get("text", "")) for b in content or () if isinstance(b, Mapping) and b.get("type") == "text")
    match = _ERROR_TAGS.match(text)
    inner = match.group(1) if match else text
    return inner if inner.startswith("Error") else f"Error: {inner}"


def complete_tool_input(block: dict[str, Any], tools: Any) -> None:
    """Fill a finished tool_use block's input with its tool's defaults (Claude Code shows them to the
    model, the hooks and the SDK): done once, where the block is finished, so every view agrees."""
    tool = tools.get(block.get("name", ""))
    defaults = getattr(tool, "input_defaults", None)
    if defaults and isinstance(block.get("input"), dict):
        block["input"] = {**{k: v for k, v in defaults.items() if k not in block["input"]}, **block["input"]}


def assistant_block_message(message_id: str, model: str, block: Mapping[str, Any], usage: Mapping[str, Any],
                            session_id: str) -> dict[str, Any]:
    """The stream-json message of one finished assistant content block."""
    return {"type": "assistant", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [dict(block)],
        "stop_reason": None, "usage": dict(usage)}, "parent_tool_use_id": None, "session_id": session_id}
