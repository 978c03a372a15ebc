"""Claude Code's own runs read as events of the declared graph: session transcripts and stream-json output.

Claude Code (checked on 2.1.332) writes a transcript of every session
(``~/.claude/projects/<escaped cwd>/<session-id>.jsonl``) and, with ``-p --output-format stream-json
--verbose``, prints one line per content block and a result. Neither records the loop's moves, but both
record what the loop did: requests, responses (one record per content block), tool results, the hidden
messages each re-entry writes (the max-tokens resume prompt, the malformed-tool-use reminder, the
thinking-only nudge, Stop-hook feedback), compaction boundaries, retries and the synthetic error message
a run ends with. This module reads those records into the *events* the graph decides on
(:mod:`agentfsm.events`), each with the edge the client's records show it took (``observed``), so
:mod:`agentfsm.claude_code_audit` can replay the events through :func:`agentfsm.graph.advance` and let the
same machine that runs agentfsm judge Claude Code's path.

The recognition rules, by record:

* a main-loop ``api-request`` (transcript) or the first line of a new response (stream-json) is ``call``
  (after closing whatever the loop was waiting on: a tool batch → ``next_turn``, Stop-hook feedback →
  ``stop_hook_blocking``, the structured-output request → ``structured_output_retry``); the first block
  of its response is ``open_stream``;
* ``tool_result`` records after a response with ``tool_use`` are ``dispatch`` and, when the batch is
  over, ``collect`` and what feedback decides;
* a hidden (``isMeta`` / ``isSynthetic``) user message is the re-entry its text names;
* a synthetic API-error assistant message ends the run (``call_failed``, or ``recovery_exhausted`` for
  the max-tokens, malformed-tool-use and mid-stream caps);
* a ``compact_boundary`` after a request that got no response is ``reactive_compact_retry``;
* the same request sent again is a retry: a new model is ``fallback_retry``, a dropped connection or an
  SSE error before any content is ``stream_retry``, transport retries (``system``/``api_error``) stay
  inside ``call_model`` as in agentfsm (where the SDK performs them);
* Stop-hook summaries, the block-cap notice and ``max_turns_reached`` settle the end.

Where Claude Code does something the graph models differently, the event is read the way the client
acted on it and a ``cc_*`` warning says so (see :data:`agentfsm.checks.CODES`); what cannot be read as
anything is reported by line, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.checks import Finding
from agentfsm.claude_code.items import (
    CHECKED_VERSIONS,
    CLAUDE_CODE_LIMITS,
    MAX_TURNS_ERROR,
    META_TEXTS,
    STREAM_JSON,
    STRUCTURED_OUTPUT_TOOL,
    TRANSCRIPT,
    Internal,
    Item,
    Observation,
    Reading,
    RunEnd,
    RunStart,
)
from agentfsm.claude_code.stream_json import StreamWalker
from agentfsm.claude_code.transcript import TranscriptWalker
from agentfsm.claude_code.walker import Walker
from agentfsm.state import Limits

__all__ = ["CHECKED_VERSIONS", "CLAUDE_CODE_LIMITS", "META_TEXTS", "STREAM_JSON", "TRANSCRIPT", "Internal", "Item",
           "Observation", "Reading", "RunEnd", "RunStart", "kind_of", "read"]


def kind_of(records: Iterable[Mapping[str, Any]]) -> str | None:
    """:data:`TRANSCRIPT`, :data:`STREAM_JSON` or None, from the first records of a JSONL input. A
    transcript's message records carry ``sessionId``, ``uuid`` and a ``message``; a stream-json line
    carries ``session_id`` and ``uuid`` (its first is the ``system``/``init`` line)."""
    for rec in records:
        if not isinstance(rec, Mapping):
            continue
        kind = rec.get("type")
        if kind in ("user", "assistant") and isinstance(rec.get("message"), Mapping) and "uuid" in rec:
            if "sessionId" in rec:
                return TRANSCRIPT
            if "session_id" in rec:
                return STREAM_JSON
        if kind == "system" and "uuid" in rec:
            if "sessionId" in rec and "subtype" in rec:
                return TRANSCRIPT
            if "session_id" in rec and rec.get("subtype") == "init" and "claude_code_version" in rec:
                return STREAM_JSON
        if kind == "result" and "session_id" in rec and "terminal_reason" in rec:
            return STREAM_JSON
    return None


def _version(records: Sequence[tuple[int, Mapping[str, Any]]], source: str) -> str | None:
    key = "version" if source == TRANSCRIPT else "claude_code_version"
    return next((str(r[key]) for _, r in records if isinstance(r.get(key), str)), None)


def _limits(records: Sequence[tuple[int, Mapping[str, Any]]], base: Limits) -> Limits:
    """The caps the run was under: Claude Code's, with max_turns where the input states it."""
    for _, rec in records:
        att = rec.get("attachment")
        if isinstance(att, Mapping) and att.get("type") == "max_turns_reached" and isinstance(att.get("maxTurns"), int):
            return attrs.evolve(base, max_turns=att["maxTurns"])
        if rec.get("type") == "result" and rec.get("subtype") == "error_max_turns":
            for err in rec.get("errors") or ():
                m = MAX_TURNS_ERROR.search(str(err))
                if m:
                    return attrs.evolve(base, max_turns=int(m.group(1)))
    return base


def _json_schema(records: Sequence[tuple[int, Mapping[str, Any]]]) -> bool:
    """Whether the run had to end with a StructuredOutput call (``--json-schema``)."""
    for _, rec in records:
        if rec.get("type") == "system" and rec.get("subtype") == "init":
            return STRUCTURED_OUTPUT_TOOL in (rec.get("tools") or ())
        if rec.get("type") == "api-request-shape":
            tools = ((rec.get("shape") or {}).get("tools")) or ()
            if any(isinstance(t, Mapping) and t.get("name") == STRUCTURED_OUTPUT_TOOL for t in tools):
                return True
    return False


def read(numbered: Sequence[tuple[int, Mapping[str, Any]]], source: str, *, limits: Limits | None = None
         ) -> Reading:
    """Read a Claude Code input's records (with their 1-based lines) as events of the graph.
    ``limits`` replaces :data:`CLAUDE_CODE_LIMITS` (max_turns is still read from the input when unset)."""
    base = limits if limits is not None else CLAUDE_CODE_LIMITS
    run_limits = _limits(numbered, base) if base.max_turns is None else base
    walker: Walker
    if source == TRANSCRIPT:
        walker = TranscriptWalker(_json_schema(numbered))
        walker.walk(numbered)
    elif source == STREAM_JSON:
        walker = StreamWalker(_json_schema(numbered))
        walker.walk(numbered)
    else:
        raise ValueError(f"not a Claude Code input kind: {source!r}")
    version = _version(numbered, source)
    findings = list(walker.findings)
    if version is not None and version not in CHECKED_VERSIONS:
        findings.append(Finding(1, "client_version", f"written by Claude Code {version}; the recognition rules were "
                                                     f"checked on {', '.join(sorted(CHECKED_VERSIONS))}"))
    return Reading(source, version, run_limits, tuple(walker.items), tuple(findings))
