"""Finding, resuming, continuing and forking sessions from their session files (SPEC §6)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from fsm.driver import Emit, InputQueue
from fsm.model import ModelClient
from fsm.options import Options
from fsm.session import Session
from fsm.state import Message
from fsm.trace import default_sessions_dir, read_records

DANGLING_RESULT = ("<tool_use_error>Tool use was interrupted: the session ended before its result was "
                   "recorded</tool_use_error>")


def sessions_dir(options: Options) -> Path:
    return options.sessions_dir or default_sessions_dir(options.cwd)


def latest_session(directory: Path) -> str | None:
    files = sorted(directory.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    return files[0].stem if files else None


def load_history(path: Path) -> tuple[Message, ...]:
    """The history view of a session file: the messages after the last compact boundary, with every
    dangling tool_use (a crash mid-turn) paired with a synthetic error result."""
    messages: list[Message] = []
    for rec in read_records(path):
        if rec["type"] == "compact_boundary":
            messages = []
        elif rec["type"] == "message":
            messages.append(Message(rec["role"], tuple(rec["content"]), kind=rec.get("kind", "prompt"),
                                    uuid=rec.get("uuid", "")))
    return repair(messages)


def repair(messages: Sequence[Message]) -> tuple[Message, ...]:
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(m)
        ids = m.tool_use_ids() if m.role == "assistant" else []
        if ids:
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            have = set(nxt.tool_result_ids()) if nxt is not None and nxt.role == "user" else set()
            missing = [t for t in ids if t not in have]
            if missing:
                synthetic = tuple({"type": "tool_result", "tool_use_id": t, "is_error": True,
                                   "content": DANGLING_RESULT} for t in missing)
                if nxt is not None and nxt.role == "user" and have:
                    out.append(attrs.evolve(nxt, content=tuple(nxt.content) + synthetic))
                    i += 2
                    continue
                out.append(Message("user", synthetic, kind="synthetic"))
        i += 1
    return tuple(out)


def open_session(options: Options, *, client: ModelClient | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None) -> Session:
    """A new session, or the one ``--resume``/``--continue`` names (forked with ``--fork-session``)."""
    directory = sessions_dir(options)
    source_id = options.resume
    if options.continue_session and source_id is None:
        source_id = latest_session(directory)
        if source_id is None:
            raise FileNotFoundError(f"--continue: no session to continue in {directory}")
    if source_id is None:
        return Session(options, client=client, emit=emit, queue=queue)
    path = directory / f"{source_id}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no session {source_id!r} in {directory}")
    history = load_history(path)
    if options.fork_session:
        forked = attrs.evolve(options, session_id=options.session_id if options.session_id else None,
                              parent_session_id=source_id)
        return Session(forked, client=client, emit=emit, queue=queue, history=history)
    resumed = attrs.evolve(options, session_id=source_id)
    session = Session(resumed, client=client, emit=emit, queue=queue, history=history)
    session.resumed = True  # the file already holds the header and these messages
    return session


def session_records(path: Path) -> list[dict[str, Any]]:
    return list(read_records(path))
