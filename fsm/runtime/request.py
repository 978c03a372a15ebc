"""Builds the wire view of the history: what one Messages request carries."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from agentfsm.machine.graph import NotificationPlace, notification_place
from agentfsm.machine.state import Message

BASE_SYSTEM_PROMPT = (
    "You are an interactive agent that helps users with software engineering tasks, running in "
    "agentfsm, a Claude-Code-compatible agent loop. Use the tools available to you to inspect and "
    "change the user's workspace; prefer reading before editing; be concise in your final answer."
)


def canonical_names(tools: Iterable[Any]) -> dict[str, str]:
    """Each alias of the offered tools, and the tool's own name (``KillShell`` → ``TaskStop``,
    ``Task`` → ``Agent``): what :func:`normalize` renames a call to."""
    return {alias: t.name for t in tools for alias in getattr(t, "aliases", ())}


def normalize(messages: Sequence[Message], names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Wire messages: consecutive same-role messages merged (the API wants alternation), tool_result
    blocks first in a user message (the API requires them before any text), empty texts dropped; a
    call the model made by a tool's alias sent back under the tool's own name (``names``, from
    :func:`canonical_names`: Claude Code 2.1.332 streams a ``KillShell`` call as the model named it and
    sends it back as ``TaskStop``, tests/fixtures/background/task_stop/requests.jsonl; the history
    itself keeps the model's name); a task notification that joins a tool batch's results put inside
    the last of them (the graph's :func:`~agentfsm.machine.graph.notification_place`)."""
    return _normalize(messages, names=names)[0]


def _normalize(messages: Sequence[Message], offset: int = 0,
               names: Mapping[str, str] | None = None) -> tuple[list[dict[str, Any]], list[int]]:
    """The wire messages, and for each the index (plus ``offset``) of the first message it came from."""
    out: list[dict[str, Any]] = []
    starts: list[int] = []
    for i, m in enumerate(messages):
        blocks = [dict(b) for b in m.content if not (b.get("type") == "text" and not b.get("text"))]
        if names and m.role == "assistant":
            blocks = [{**b, "name": names[b["name"]]} if b.get("type") == "tool_use" and b.get("name") in names
                      else b for b in blocks]
        if not blocks:
            continue
        if (out and m.role == "user" and out[-1]["role"] == "user"
                and notification_place(m.kind, out[-1]["content"]) is NotificationPlace.IN_TOOL_RESULT):
            out[-1]["content"] = _into_last_result(out[-1]["content"], blocks)
            continue
        if out and out[-1]["role"] == m.role:
            last = out[-1]["content"][-1]
            if m.role == "user" and last.get("type") == "text":
                # Claude Code 2.1.332 ends a text with a newline when the next message's content joins it
                # (tests/fidelity/conform/conform-11d939ce08.json)
                out[-1]["content"][-1] = {**last, "text": last["text"] + "\n"}
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": m.role, "content": blocks})
            starts.append(offset + i)
    for msg in out:
        if msg["role"] == "user":
            results = [b for b in msg["content"] if b.get("type") == "tool_result"]
            if results:
                msg["content"] = results + [b for b in msg["content"] if b.get("type") != "tool_result"]
    return out, starts


def _into_last_result(content: list[dict[str, Any]], blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``content`` with the notification's texts appended to its last tool result (the graph's
    :data:`~agentfsm.machine.graph.NOTIFICATION_PLACES`): after the result's text, its trailing white
    space cut and a blank line between (Claude Code 2.1.332's joining), or as text blocks of a result
    whose content is blocks. A block that is no text follows in the message."""
    at = max(i for i, b in enumerate(content) if b.get("type") == "tool_result")
    result = dict(content[at])
    extra: list[dict[str, Any]] = []
    for b in blocks:
        if b.get("type") != "text":
            extra.append(dict(b))
            continue
        inner = result.get("content")
        if isinstance(inner, list):
            result["content"] = [*inner, {"type": "text", "text": b["text"]}]
        else:
            before = str(inner or "").rstrip()
            result["content"] = f"{before}\n\n{b['text']}" if before else b["text"]
    return [*content[:at], result, *content[at + 1:], *extra]


class WireCache:
    """The wire view of one loop's requests, built incrementally: when the history only grew since
    the last request, the wire messages of the unchanged part are reused and only the tail is
    normalised (the last wire message too, as new messages may merge into it). A request then costs
    what is new, not the whole history; a rewritten history (compaction) is normalised afresh. Wire
    dicts handed out are never changed afterwards, so earlier requests may share them. ``names``: the
    aliases of the offered tools (:func:`normalize`)."""

    def __init__(self, names: Mapping[str, str] | None = None) -> None:
        self._names = dict(names or {})
        self._messages: tuple[Message, ...] = ()
        self._wire: list[dict[str, Any]] = []
        self._starts: list[int] = []

    def wire(self, messages: tuple[Message, ...]) -> list[dict[str, Any]]:
        old = self._messages
        if old and self._starts and len(messages) >= len(old) and messages[:len(old)] == old:
            redo = self._starts[-1]  # the last wire message may take in what follows it
            tail, tail_starts = _normalize(messages[redo:], offset=redo, names=self._names)
            wire, starts = self._wire[:-1] + tail, self._starts[:-1] + tail_starts
        else:
            wire, starts = _normalize(messages, names=self._names)
        self._messages, self._wire, self._starts = messages, wire, starts
        return list(wire)


def system_blocks(cwd: Path, *, system_prompt: str | None, append: str | None,
                  extra: Sequence[str] = (), add_dirs: Sequence[Path] = (),
                  identity: str | None = None) -> tuple[Mapping[str, Any], ...]:
    base = system_prompt if system_prompt is not None else BASE_SYSTEM_PROMPT
    # the added directories are working directories too: the model must know it may work there
    more = "".join(f"\n  - {(cwd / d).resolve()}" for d in add_dirs)
    env = (f"Environment:\nWorking directory: {cwd}\n"
           + (f"Additional working directories:{more}\n" if more else "")
           + f"Platform: {platform.system().lower()}\n"
           f"Is git repo: {(cwd / '.git').exists()}\nToday's date: {date.today().isoformat()}\n"
           f"Shell: {os.path.basename(os.environ.get('SHELL', 'bash'))}")
    texts = [identity or "", base, env, *extra]
    if append:
        texts.append(append)
    return tuple({"type": "text", "text": t} for t in texts if t)
