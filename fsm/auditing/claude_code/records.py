"""Every record type Claude Code (2.1.332) writes, and what the auditor makes of it.

Each type is one of three things: an ``event`` (the reading turns it into a move of the graph or a run
boundary), a ``fact`` (no move, but what the report shows about the run: permission denials, mode
changes, background tasks) or ``ignored`` (known bookkeeping that says nothing about the loop). A type
in none of these tables is reported once per type, with its count (``unknown_record``). The tables are
data so that ``docs/claude_code_records.md`` can be checked against them.
"""

from __future__ import annotations

from collections.abc import Mapping

EVENT, FACT, IGNORED = "event", "fact", "ignored"

# transcript (``~/.claude/projects/<cwd>/<session>.jsonl``): the record's ``type``
TRANSCRIPT_TYPES: Mapping[str, tuple[str, str]] = {
    "user": (EVENT, "a prompt (a run starts), tool results, the loop's hidden messages, an interrupt"),
    "assistant": (EVENT, "one content block of a response (all blocks share the message id)"),
    "api-request": (EVENT, "a main-loop request (call); the same request again is a retry"),
    "system": (EVENT, "by subtype (below)"),
    "attachment": (EVENT, "by attachment type (below)"),
    "cost-state": (EVENT, "the client process's last record: a request still unanswered was answered with "
                          "nothing"),
    "mode": (FACT, "the session's mode when the process ended (normal, plan, …)"),
    "queue-operation": (IGNORED, "the input queue (enqueue/dequeue of prompts and task notifications); the "
                                 "user record that follows is what starts a run"),
    "api-request-blob": (IGNORED, "a request body"),
    "api-request-shape": (IGNORED, "a request's system prompt and tool schemas"),
    "last-prompt": (IGNORED, "resume pointer"),
    "atis-latch": (IGNORED, "client bookkeeping"),
    "tools-used": (IGNORED, "names of the tools used so far"),
    "summary": (IGNORED, "a session title"),
    "file-history-snapshot": (IGNORED, "file checkpoints for undo"),
    "custom-title": (IGNORED, "a title the user set"),
    "tag": (IGNORED, "a tag the user set"),
}

TRANSCRIPT_SYSTEM: Mapping[str, tuple[str, str]] = {
    "api_error": (EVENT, "a failed attempt of the request in progress (transport retry, or before a fallback)"),
    "model_fallback": (IGNORED, "written after the fallback model's request, which is the move"),
    "compact_boundary": (EVENT, "a compaction (reactive when a request was unanswered)"),
    "stop_hook_summary": (EVENT, "a Stop-hook round: settle, block, prevent or additionalContext"),
    "informational": (EVENT, "the Stop-hook block cap's notice (settle), a UserPromptSubmit block "
                             "(prompt_blocked); otherwise a notice"),
    "model_refusal_no_fallback": (IGNORED, "a response refused again, with no fallback model: the API-error "
                                           "answer that follows is the event (recovery_exhausted)"),
    "local_command": (IGNORED, "a local slash command's output"),
    "turn_duration": (IGNORED, "timing"),
}

ATTACHMENTS: Mapping[str, tuple[str, str]] = {
    "max_turns_reached": (EVENT, "the run stopped at max_turns"),
    "budget_usd": (EVENT, "the run's --max-budget-usd (and what was spent): its cost-state then says whether it "
                          "stopped over budget"),
    "hook_stopped_continuation": (IGNORED, "a Stop hook's continue:false; the stop_hook_summary is the event"),
    "hook_additional_context": (IGNORED, "a hook's additionalContext; the stop_hook_summary carries it"),
    "hook_success": (IGNORED, "a hook's output"),
    "structured_output": (IGNORED, "the accepted StructuredOutput call's data; its tool result is the event"),
    "plan_mode": (FACT, "the run is in plan mode"),
    "queued_command": (FACT, "input queued while the run was busy (a prompt, a background task's notification), "
                             "carried by the run's next request: no new run"),
    "environment": (IGNORED, "context for the next request"),
    "model": (IGNORED, "context for the next request"),
    "date": (IGNORED, "context for the next request"),
    "session_context": (IGNORED, "context for the next request"),
    "total_tokens_reminder": (IGNORED, "context for the next request"),
    "prompt_snapshot": (IGNORED, "the system prompt and tools of the next request"),
    "agent_listing_delta": (IGNORED, "the subagent types offered"),
    "file": (IGNORED, "a file's content attached to the prompt"),
}

# stream-json (``-p --output-format stream-json --verbose``): a line's ``type``
STREAM_TYPES: Mapping[str, tuple[str, str]] = {
    "user": (EVENT, "tool results, the loop's hidden messages, an interrupt, a subagent's prompt"),
    "assistant": (EVENT, "one content block of a response"),
    "system": (EVENT, "by subtype (below)"),
    "result": (EVENT, "the end of a run (result_index numbers the runs of one process)"),
    "stream_event": (IGNORED, "partial-message deltas (--include-partial-messages)"),
}

STREAM_SYSTEM: Mapping[str, tuple[str, str]] = {
    "init": (EVENT, "a run of the process starts (a second init: the run a task notification started)"),
    "api_retry": (EVENT, "a retried request: transport retry, or a dropped connection (stream_retry)"),
    "model_fallback": (EVENT, "fallback_retry"),
    "compact_boundary": (EVENT, "a compaction, read as reactive_compact_retry"),
    "informational": (EVENT, "the Stop-hook block cap's notice (settle), a UserPromptSubmit block "
                             "(prompt_blocked); otherwise a notice"),
    "permission_denied": (FACT, "a tool call the permission check denied (its error result follows)"),
    "model_refusal_no_fallback": (IGNORED, "a response refused again, with no fallback model: the API-error "
                                           "answer that follows is the event (recovery_exhausted)"),
    "task_started": (FACT, "a subagent (task) started, for a tool call; in the background or not"),
    "task_progress": (IGNORED, "a running subagent's progress"),
    "task_updated": (FACT, "a subagent's status changed (completed, failed, killed)"),
    "task_notification": (FACT, "a finished background subagent was announced to the model; the run it "
                                "starts follows its own init"),
    "background_tasks_changed": (FACT, "the set of background tasks changed"),
    "status": (IGNORED, "a status line (e.g. compacting)"),
    "thinking_tokens": (IGNORED, "a count of thinking tokens"),
    "notification": (IGNORED, "a notice for the user"),
    "hook_started": (IGNORED, "a hook began"),
    "hook_response": (IGNORED, "a hook's output"),
    "hook_progress": (IGNORED, "a hook's progress"),
}


def role_of(table: Mapping[str, tuple[str, str]], key: object) -> str | None:
    """EVENT, FACT or IGNORED for a known ``key`` of ``table``; None for an unknown one."""
    entry = table.get(key) if isinstance(key, str) else None
    return entry[0] if entry is not None else None
