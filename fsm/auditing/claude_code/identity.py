"""Message identity in a Claude Code input: one message is one message, however its records lie.

Claude Code writes each content block of a response as its own record, all with the response's message
id, and starts a tool at its block's stop — so a tool's result can be written *between* two blocks of
the message that called it (a transcript and stream-json alike). Reading records in file order would
close the message at the first result and open a second one at the next block. Instead, before any
reading, the records of one message are gathered where its last block lies: the results and
bookkeeping written between its blocks follow it, in their own order. Every record keeps its line, so
what is reported still points into the file.

Copies are found here too, before they can count twice: a record whose ``uuid`` was seen before, and an
assistant record that repeats a block of its message (same message id, same content) are findings
(``duplicate_record``) and are not read again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentfsm.auditing.checks import Finding

Numbered = Sequence[tuple[int, Mapping[str, Any]]]


def _message_id(rec: Mapping[str, Any]) -> str | None:
    msg = rec.get("message")
    if rec.get("type") != "assistant" or not isinstance(msg, Mapping):
        return None
    mid = msg.get("id")
    return str(mid) if isinstance(mid, str) and mid else None


def _content_key(rec: Mapping[str, Any]) -> str:
    msg = rec.get("message") or {}
    return json.dumps(msg.get("content") if isinstance(msg, Mapping) else None, sort_keys=True, default=str)


def _is_tool_result(rec: Mapping[str, Any]) -> bool:
    msg = rec.get("message")
    content = msg.get("content") if isinstance(msg, Mapping) else None
    return rec.get("type") == "user" and isinstance(content, list) and any(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)


def _may_lie_inside(rec: Mapping[str, Any]) -> bool:
    """What the client writes while a message's blocks are still streaming: its tools' results and
    bookkeeping (progress, attachments, permission and task notices). A new request, another message,
    a prompt or a result line closes the message for good."""
    kind = rec.get("type")
    if kind == "assistant" or kind == "api-request" or kind == "result":
        return False
    if kind == "user":
        return _is_tool_result(rec)
    return not (kind == "system" and rec.get("subtype") in ("init", "compact_boundary", "api_error", "api_retry"))


def drop_copies(numbered: Numbered) -> tuple[list[tuple[int, Mapping[str, Any]]], list[Finding]]:
    """The records without the copies of earlier ones, and a ``duplicate_record`` finding per copy."""
    kept: list[tuple[int, Mapping[str, Any]]] = []
    findings: list[Finding] = []
    by_uuid: dict[str, int] = {}
    by_block: dict[tuple[str, str], int] = {}
    for line, rec in numbered:
        uuid = rec.get("uuid")
        if isinstance(uuid, str) and uuid:
            first = by_uuid.get(uuid)
            if first is not None:
                findings.append(Finding(line, "duplicate_record", f"a copy of the {rec.get('type')} record at line "
                                                                  f"{first} (same uuid {uuid}); not read again"))
                continue
            by_uuid[uuid] = line
        mid = _message_id(rec)
        if mid is not None:
            key = (mid, _content_key(rec))
            first = by_block.get(key)
            if first is not None:
                findings.append(Finding(line, "duplicate_record", f"the block of message {mid} at line {first} "
                                                                  "written again (same message id and content); "
                                                                  "not read again"))
                continue
            by_block[key] = line
        kept.append((line, rec))
    return kept, findings


def _result_ids(rec: Mapping[str, Any]) -> list[str]:
    msg = rec.get("message")
    content = msg.get("content") if isinstance(msg, Mapping) else None
    return [str(b.get("tool_use_id")) for b in content or ()
            if isinstance(b, Mapping) and b.get("type") == "tool_result"]


def _use_ids(rec: Mapping[str, Any]) -> list[str]:
    msg = rec.get("message")
    content = msg.get("content") if isinstance(msg, Mapping) else None
    return [str(b.get("id")) for b in content or () if isinstance(b, Mapping) and b.get("type") == "tool_use"]


def group_messages(numbered: Numbered) -> tuple[list[tuple[int, Mapping[str, Any]]], list[Finding]]:
    """The records with each message's blocks together: what was written between two blocks of one
    message (its tools' results, bookkeeping) moves after its last block, in its own order. A message
    id that comes back after a new request or another message is left where it is (the reading
    reports it). A result written between the blocks before the block of its own call cannot be (a
    tool starts at its block's stop): an ``orphan_tool_result`` finding."""
    records = list(numbered)
    findings: list[Finding] = []
    last_of: dict[str, int] = {}
    for i, (_, rec) in enumerate(records):
        mid = _message_id(rec)
        if mid is not None:
            last_of[mid] = i
    out: list[tuple[int, Mapping[str, Any]]] = []
    i = 0
    while i < len(records):
        mid = _message_id(records[i][1])
        end = last_of.get(mid, i) if mid is not None else i
        if end == i:
            out.append(records[i])
            i += 1
            continue
        blocks: list[tuple[int, Mapping[str, Any]]] = [records[i]]
        held: list[tuple[int, Mapping[str, Any]]] = []
        called = {u: records[i][0] for u in _use_ids(records[i][1])}
        later = {u: line for line, rec in records[i:end + 1] if _message_id(rec) == mid for u in _use_ids(rec)}
        j = i + 1
        while j <= end:
            line, rec = records[j]
            if _message_id(rec) == mid:
                blocks.append(records[j])
                called.update((u, line) for u in _use_ids(rec))
            elif _may_lie_inside(rec):
                for use in _result_ids(rec):
                    if use not in called and use in later:
                        findings.append(Finding(line, "orphan_tool_result", f"the tool_result for {use!r} is written "
                                                                            f"before its tool_use (line {later[use]})"))
                held.append(records[j])
            else:
                break  # the message was closed before this block: leave the rest in file order
            j += 1
        out.extend(blocks)
        out.extend(held)
        i = j
    return out, findings
