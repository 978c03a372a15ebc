"""The canonical form of what a client sent: how agentfsm's requests are compared with Claude Code's.

Two clients are compared by the skeleton of their requests, not their bytes: per request, one entry
per visible event —

- ``U:<text>`` / ``A:<text>``: a user / assistant text block, stripped, its first 40 characters
  (Claude Code sends the prompt as ``"THINK_ONLY\n"`` in a nudge request; its canonical entry is
  ``U:THINK_ONLY``). A message with several text blocks gives one entry per block; a string
  ``content`` is one block.
  Texts that are empty (after stripping) or start with ``<system-reminder>`` (after stripping) are
  left out, in either role: they carry the client's context, not the conversation.
- ``T``: a thinking (or redacted_thinking) block.
- ``use:<id>:<name>``: a tool_use block.
- ``res:<id>:ok|err``: a tool_result block (``err`` when ``is_error`` is true). The results of one
  user message are sorted by id and stand where that message's first result stands, so completion
  order never shows.

Other blocks (images, documents, server tool results) are left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentfsm.llm.model import ModelRequest

REMINDER_PREFIX = "<system-reminder>"
TEXT_LIMIT = 40


def _is_hidden_text(text: str) -> bool:
    stripped = text.strip()
    return not stripped or stripped.startswith(REMINDER_PREFIX)


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list | tuple):
        return [b for b in content if isinstance(b, Mapping)]
    return []


def canonical_message(message: Mapping[str, Any]) -> list[str]:
    """The entries of one message."""
    role = message.get("role")
    prefix = "A:" if role == "assistant" else "U:"
    entries: list[str] = []
    results: list[tuple[str, str]] = []
    results_at: int | None = None
    for block in _blocks(message.get("content")):
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str) and not _is_hidden_text(text):
                entries.append(prefix + text.strip()[:TEXT_LIMIT])
        elif kind in ("thinking", "redacted_thinking"):
            entries.append("T")
        elif kind in ("tool_use", "server_tool_use"):
            entries.append(f"use:{block.get('id')}:{block.get('name')}")
        elif kind == "tool_result":
            if results_at is None:
                results_at = len(entries)
            tool_id = str(block.get("tool_use_id"))
            results.append((tool_id, f"res:{tool_id}:{'err' if block.get('is_error') else 'ok'}"))
    if results_at is not None:
        entries[results_at:results_at] = [entry for _, entry in sorted(results)]
    return entries


def canonical_request(body: Mapping[str, Any] | ModelRequest) -> list[str]:
    """The entries of one request (a ``POST /v1/messages`` body or a :class:`ModelRequest`)."""
    if isinstance(body, ModelRequest):
        body = body.body()
    entries: list[str] = []
    for message in body.get("messages") or ():
        if isinstance(message, Mapping):
            entries.extend(canonical_message(message))
    return entries


def canonical_requests(bodies: Iterable[Mapping[str, Any] | ModelRequest]) -> list[list[str]]:
    return [canonical_request(b) for b in bodies]


def _field(result: Any, name: str) -> Any:
    value = result.get(name) if isinstance(result, Mapping) else getattr(result, name, None)
    return getattr(value, "value", value)  # enums (TerminalReason) as their wire string


def canonical_result(result: Any) -> dict[str, Any]:
    """``subtype``, ``terminal_reason``, ``is_error`` and ``text`` of a result — the CLI's result JSON
    object (text from ``result``) or a result record with those attributes."""
    text = _field(result, "result")
    if text is None:
        text = _field(result, "text")
    return {
        "subtype": _field(result, "subtype"),
        "terminal_reason": _field(result, "terminal_reason"),
        "is_error": bool(_field(result, "is_error")),
        "text": text if isinstance(text, str) else "",
    }


def canonical_run(bodies: Iterable[Mapping[str, Any] | ModelRequest], result: Any) -> dict[str, Any]:
    """A whole run in the shape of ``reference/observed/*.json``."""
    return {"requests": canonical_requests(bodies), "result": canonical_result(result)}


def load_bodies(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The request bodies of a ``serve-scripted --log`` file (one JSON object a line)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
