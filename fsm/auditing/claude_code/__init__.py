"""Claude Code's own runs read as events of the declared graph: session transcripts and stream-json output.

Claude Code (checked on 2.1.332) writes a transcript of every session
(``~/.claude/projects/<escaped cwd>/<session-id>.jsonl``) and, with ``-p --output-format stream-json
--verbose``, prints one line per content block and a result. Neither records the loop's moves, but both
record what the loop did: requests, responses (one record per content block), tool results, the hidden
messages each re-entry writes (the max-tokens resume prompt, the malformed-tool-use reminder, the
thinking-only nudge, Stop-hook feedback), compaction boundaries, retries and the synthetic error message
a run ends with. This module reads those records into the *events* the graph decides on
(:mod:`agentfsm.machine.events`), each with the edge the client's records show it took (``observed``), so
:mod:`agentfsm.auditing.claude_code_audit` can replay the events through :func:`agentfsm.machine.graph.advance` and let
the
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
acted on it and a ``cc_*`` warning says so (see :data:`agentfsm.auditing.checks.CODES`); what cannot be read as
anything is reported by line, never skipped.

Before any of that, the records are split by loop — the session's own, and each subagent's (sidechain
records by ``agentId``; stream-json lines by ``parent_tool_use_id``), each read on its own as a child
reading — and, per loop, copies are dropped and each message's blocks gathered
(:mod:`agentfsm.auditing.claude_code.identity`); stream-json's runs are put in order (each ``init`` opens one,
each result joins the run its ``result_index`` names). Which record types exist and what each is —
an event, a reported fact, ignored bookkeeping — is :mod:`agentfsm.auditing.claude_code.records`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from agentfsm.auditing.checks import Finding
from agentfsm.auditing.claude_code.identity import drop_copies, group_messages
from agentfsm.auditing.claude_code.items import (
    BUDGET_ERROR,
    CHECKED_VERSIONS,
    CLAUDE_CODE_LIMITS,
    MAX_TURNS_ERROR,
    META_TEXTS,
    STREAM_JSON,
    STRUCTURED_OUTPUT_TOOL,
    TRANSCRIPT,
    Fact,
    Internal,
    Item,
    Observation,
    Reading,
    RunEnd,
    RunStart,
)
from agentfsm.auditing.claude_code.stream_json import StreamWalker
from agentfsm.auditing.claude_code.transcript import TranscriptWalker
from agentfsm.auditing.claude_code.walker import Walker
from agentfsm.machine.state import Limits

# a queued task notification: the subagent's id and the tool call that started it
_NOTIFIED = re.compile(r"<task-id>([^<]+)</task-id>\s*<tool-use-id>([^<]+)</tool-use-id>")

__all__ = ["CHECKED_VERSIONS", "CLAUDE_CODE_LIMITS", "META_TEXTS", "STREAM_JSON", "TRANSCRIPT", "Fact", "Internal",
           "Item", "Observation", "Reading", "RunEnd", "RunStart", "kind_of", "read"]


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
            if "session_id" in rec and "sessionId" not in rec:
                return STREAM_JSON  # any system line of stream-json: its init may be the damaged one
        # a result line: a blocked prompt's has no terminal_reason, but its uuid and subtype
        if kind == "result" and "session_id" in rec and ("terminal_reason" in rec or {"uuid", "subtype"} <= rec.keys()):
            return STREAM_JSON
    return None


def _version(records: Sequence[tuple[int, Mapping[str, Any]]], source: str) -> str | None:
    key = "version" if source == TRANSCRIPT else "claude_code_version"
    return next((str(r[key]) for _, r in records if isinstance(r.get(key), str)), None)


def _limits(records: Sequence[tuple[int, Mapping[str, Any]]], base: Limits) -> Limits:
    """The caps the run was under: Claude Code's, with max_turns and max_budget_usd where the input states
    them."""
    if base.max_budget_usd is None:
        base = attrs.evolve(base, max_budget_usd=_budget(records))
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


def _budget(records: Sequence[tuple[int, Mapping[str, Any]]]) -> float | None:
    """--max-budget-usd: a transcript's budget_usd attachment, or a stream-json result that stopped at it."""
    for _, rec in records:
        att = rec.get("attachment")
        if isinstance(att, Mapping) and att.get("type") == "budget_usd" and isinstance(att.get("total"), int | float):
            return float(att["total"])
        if rec.get("type") == "result" and rec.get("subtype") == "error_max_budget_usd":
            for err in rec.get("errors") or ():
                m = BUDGET_ERROR.search(str(err))
                if m:
                    return float(m.group(1))
    return None


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


Numbered = Sequence[tuple[int, Mapping[str, Any]]]
_MAIN = ""


def _thread_of(rec: Mapping[str, Any], source: str) -> str:
    """Which loop a record belongs to: ``""`` for the session's own, else the subagent's key (its
    ``agentId`` in a transcript, the parent's tool_use id in stream-json)."""
    if source == STREAM_JSON:
        parent = rec.get("parent_tool_use_id")
        return str(parent) if parent else _MAIN
    agent = rec.get("agentId")
    if rec.get("isSidechain") or (agent and "isSidechain" not in rec):
        return str(agent or "sidechain")
    return _MAIN


def _threads(numbered: Numbered, source: str) -> tuple[dict[str, list[tuple[int, Mapping[str, Any]]]], str | None]:
    """The records by loop (``""`` the session's own), and the subagent's id when the whole file is one
    subagent's own transcript (then its loop is the file's)."""
    threads: dict[str, list[tuple[int, Mapping[str, Any]]]] = {_MAIN: []}
    for line, rec in numbered:
        threads.setdefault(_thread_of(rec, source), []).append((line, rec))
    if len(threads) == 2 and not any(r.get("type") in ("user", "assistant") for _, r in threads[_MAIN]):
        (agent, records), = ((k, v) for k, v in threads.items() if k != _MAIN)
        return {_MAIN: sorted([*threads[_MAIN], *records], key=lambda lr: lr[0])}, agent
    return threads, None


def _links(numbered: Numbered) -> dict[str, str]:
    """A transcript's subagents by agent id -> the tool call that started each (from the tool's result,
    or the task notification that announced it)."""
    links: dict[str, str] = {}
    for _, rec in numbered:
        result = rec.get("toolUseResult")
        if isinstance(result, Mapping) and result.get("agentId"):
            msg = rec.get("message") or {}
            for b in (msg.get("content") if isinstance(msg, Mapping) else None) or ():
                if isinstance(b, Mapping) and b.get("type") == "tool_result":
                    links[str(result["agentId"])] = str(b.get("tool_use_id"))
        if rec.get("type") == "queue-operation":
            m = _NOTIFIED.search(str(rec.get("content") or ""))
            if m:
                links.setdefault(m.group(1), m.group(2))
    return links


def _stream_runs(records: list[tuple[int, Mapping[str, Any]]]) -> tuple[list[tuple[int, Mapping[str, Any]]],
                                                                         dict[int, str]]:
    """stream-json's runs in one output: each ``init`` after the first starts one (a run a task
    notification started). Their results can come late (the first run's result after the second run's
    answer): each goes to the end of the run its ``result_index`` names. Also: what started each run."""
    runs: list[list[tuple[int, Mapping[str, Any]]]] = [[]]
    results: list[tuple[int, Mapping[str, Any]]] = []
    for line, rec in records:
        if rec.get("type") == "system" and rec.get("subtype") == "init" and any(
                r.get("type") != "result" for _, r in runs[-1]):
            runs.append([])
        if rec.get("type") == "result" and isinstance(rec.get("result_index"), int):
            results.append((line, rec))
        else:
            runs[-1].append((line, rec))
    causes: dict[int, str] = {}
    for line, rec in results:
        k = rec["result_index"]
        if 0 <= k < len(runs):
            runs[k].append((line, rec))
            origin = rec.get("origin")
            if isinstance(origin, Mapping) and origin.get("kind") and runs[k]:
                causes[runs[k][0][0]] = str(origin["kind"])
        else:
            runs[-1].append((line, rec))
    return [lr for run in runs for lr in run], causes


def _task_ends(numbered: Numbered) -> dict[str, tuple[int, str]]:
    """stream-json: each subagent's end (its tool call -> the line and status of its last task notice)."""
    ends: dict[str, tuple[int, str]] = {}
    calls: dict[str, str] = {}  # task id -> its tool call
    for line, rec in numbered:
        if rec.get("type") != "system":
            continue
        if rec.get("task_id") and rec.get("tool_use_id"):
            calls[str(rec["task_id"])] = str(rec["tool_use_id"])
        if rec.get("subtype") in ("task_notification", "task_updated"):
            patch = rec.get("patch")
            status = rec.get("status") or (patch.get("status") if isinstance(patch, Mapping) else None)
            use = rec.get("tool_use_id") or calls.get(str(rec.get("task_id")))
            if use and status:
                ends[str(use)] = (line, str(status))
    return ends


def _walk(records: Numbered, source: str, json_schema: bool, *, child: bool = False,
          end: tuple[int, str] | None = None) -> Walker:
    records, copies = drop_copies(records)
    records, misplaced = group_messages(records)
    copies += misplaced
    walker: Walker
    if source == TRANSCRIPT:
        walker = TranscriptWalker(json_schema, subagent=child)
        walker.findings.extend(copies)
        walker.walk(records)
    elif child:
        # a subagent's lines: its prompt is a user line; the task notice says how it ended
        stream = StreamWalker(json_schema, subagent_end=end)
        stream.findings.extend(copies)
        stream.start_run(records[0][0] if records else 1, None, "subagent")
        prompt = next((i for i, (_, rec) in enumerate(records) if rec.get("type") in ("user", "assistant")), None)
        if prompt is not None and _is_subagent_prompt(records[prompt][1]):
            records = [*records[:prompt], *records[prompt + 1:]]  # its prompt: the run's start, no event
        stream.walk(records)
        walker = stream
    else:
        records, causes = _stream_runs(records)
        walker = StreamWalker(json_schema, causes)
        walker.findings.extend(copies)
        walker.walk(records)
    return walker


def _is_subagent_prompt(rec: Mapping[str, Any]) -> bool:
    msg = rec.get("message")
    content = msg.get("content") if isinstance(msg, Mapping) else None
    return rec.get("type") == "user" and isinstance(content, list) and bool(content) and all(
        isinstance(b, Mapping) and b.get("type") == "text" for b in content)


def read(numbered: Sequence[tuple[int, Mapping[str, Any]]], source: str, *, limits: Limits | None = None,
         path: str = "") -> Reading:
    """Read a Claude Code input's records (with their 1-based lines) as events of the graph: the
    session's own loop, and each subagent loop it holds as a child reading.
    ``limits`` replaces :data:`CLAUDE_CODE_LIMITS` (max_turns is still read from the input when unset)."""
    if source not in (TRANSCRIPT, STREAM_JSON):
        raise ValueError(f"not a Claude Code input kind: {source!r}")
    base = limits if limits is not None else CLAUDE_CODE_LIMITS
    threads, own_agent = _threads(numbered, source)
    main = threads.pop(_MAIN)
    run_limits = _limits(main, base) if base.max_turns is None else base
    schema = _json_schema(main)
    ends = _task_ends(main) if source == STREAM_JSON else {}
    walker = _walk(main, source, schema, child=own_agent is not None)
    version = _version(numbered, source)
    findings = list(walker.findings)
    if version is not None and version not in CHECKED_VERSIONS:
        findings.append(Finding(1, "client_version", f"written by Claude Code {version}; the recognition rules were "
                                                     f"checked on {', '.join(sorted(CHECKED_VERSIONS))}"))
    links = _links(main) if source == TRANSCRIPT else {}
    children = []
    for key, records in threads.items():
        child_walker = _walk(records, source, False, child=True, end=ends.get(key))
        link = key if source == STREAM_JSON else links.get(key)
        children.append(Reading(source, version, base, tuple(child_walker.items), tuple(child_walker.findings),
                                link=link, agent=None if source == STREAM_JSON else key, path=path))
    agent = own_agent
    return Reading(source, version, run_limits, tuple(walker.items), tuple(findings), tuple(children),
                   agent=agent, path=path)
