"""Builds the wire view of the history: what one Messages request carries."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from agentfsm.state import Message

BASE_SYSTEM_PROMPT = (
    "You are an interactive agent that helps users with software engineering tasks, running in "
    "agentfsm, a Claude-Code-compatible agent loop. Use the tools available to you to inspect and "
    "change the user's workspace; prefer reading before editing; be concise in your final answer."
)


def normalize(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Wire messages: consecutive same-role messages merged (the API wants alternation), tool_result
    blocks first in a user message (the API requires them before any text), empty texts dropped."""
    out: list[dict[str, Any]] = []
    for m in messages:
        blocks = [dict(b) for b in m.content if not (b.get("type") == "text" and not b.get("text"))]
        if not blocks:
            continue
        if out and out[-1]["role"] == m.role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": m.role, "content": blocks})
    for msg in out:
        if msg["role"] == "user":
            results = [b for b in msg["content"] if b.get("type") == "tool_result"]
            if results:
                msg["content"] = results + [b for b in msg["content"] if b.get("type") != "tool_result"]
    return out


def system_blocks(cwd: Path, *, system_prompt: str | None, append: str | None,
                  extra: Sequence[str] = ()) -> tuple[Mapping[str, Any], ...]:
    base = system_prompt if system_prompt is not None else BASE_SYSTEM_PROMPT
    env = (f"Environment:\nWorking directory: {cwd}\nPlatform: {platform.system().lower()}\n"
           f"Is git repo: {(cwd / '.git').exists()}\nToday's date: {date.today().isoformat()}\n"
           f"Shell: {os.path.basename(os.environ.get('SHELL', 'bash'))}")
    texts = [base, env, *extra]
    if append:
        texts.append(append)
    return tuple({"type": "text", "text": t} for t in texts if t)
