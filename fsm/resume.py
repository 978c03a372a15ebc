"""Finding, resuming, continuing and forking sessions from their session files (docs/behaviour.md §6).

Session files live in one directory per working directory (:func:`agentfsm.trace.default_sessions_dir`,
like Claude Code's ``~/.claude/projects/<cwd>``); a subagent's file lives under its parent's, in
``<parent id>/subagents/``, so ``--continue`` never picks one.

- ``--resume ID``: the session goes on in the same file, its history restored;
- ``--continue``: the same, for the most recently written session of the directory;
- ``--fork-session`` (with either): a new session id and a new file that starts with the restored
  history, its ``session`` record naming the parent (``parent_session_id``).

Restoring (:func:`load_history`) reads the messages after the last compact boundary — the summary
view, not the messages it replaced — and makes a crashed session's history valid again: a torn last
line is ignored, an assistant message the crash cut off before the driver recorded it is rebuilt
from its ``assistant_block`` records, and every ``tool_use`` left without a result gets a synthetic
error ``tool_result``. The repairs are recomputed on every load rather than written back, so a
session file is only ever appended to.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.driver import Emit, InputQueue
from agentfsm.model import ModelClient
from agentfsm.options import Options
from agentfsm.session import Session
from agentfsm.state import Message
from agentfsm.trace import read_records, sessions_dir

DANGLING_RESULT = ("<tool_use_error>Tool use was interrupted: the session ended before its result was "
                   "recorded</tool_use_error>")


def latest_session(directory: Path) -> str | None:
    """The id of the session file written last in ``directory`` (subagents' files are elsewhere)."""
    # an empty file is a session opened but never run (its writer creates the file up front)
    files = [p for p in directory.glob("*.jsonl") if p.is_file() and p.stat().st_size > 0]
    if not files:
        return None
    return max(files, key=lambda p: p.stat().st_mtime_ns).stem


def load_history(path: Path) -> tuple[Message, ...]:
    """The history view of a session file, repaired (see the module docstring)."""
    return load_view(path)[0]


def load_view(path: Path) -> tuple[tuple[Message, ...], bool]:
    """The history view of a session file, repaired, and whether repairs changed it (then the view
    the file's message records give differs from the history a resumed run starts from)."""
    messages: list[Message] = []
    streamed: list[Mapping[str, Any]] = []  # blocks of the response being streamed
    streamed_id: str | None = None

    def recover() -> None:
        # blocks no message record took up: the run crashed after streaming them
        nonlocal streamed, streamed_id
        if streamed:
            ident = uuid.uuid5(uuid.NAMESPACE_URL, f"agentfsm:recovered:{streamed_id}")
            messages.append(Message("assistant", tuple(streamed), kind="assistant", uuid=str(ident)))
        streamed, streamed_id = [], None

    for rec in read_records(path):
        kind = rec.get("type")
        if kind == "compact_boundary":
            messages, streamed, streamed_id = [], [], None
        elif kind == "assistant_block":
            if rec.get("message_id") != streamed_id:
                # a new response: whatever an earlier one streamed was retried or dropped
                streamed, streamed_id = [], rec.get("message_id")
            if isinstance(rec.get("block"), Mapping):
                streamed.append(rec["block"])
        elif kind == "message" and rec.get("kind") == "erased_prompt":
            recover()  # a run whose prompt a UserPromptSubmit hook erased: nothing of it is history
            streamed, streamed_id = [], None
        elif kind == "message":
            if rec.get("kind") == "prompt" and rec.get("role") == "user":
                recover()  # a new run starts: an unrecorded response of the last one is rebuilt
            # any other message record takes up (or, for a dropped response, supersedes) the blocks
            streamed, streamed_id = [], None
            messages.append(Message(rec["role"], tuple(rec["content"]), kind=rec.get("kind", "prompt"),
                                    uuid=rec.get("uuid") or str(uuid.uuid4())))
        elif kind == "result":
            streamed, streamed_id = [], None
    recovered = len(messages)
    recover()
    repaired = repair(messages)
    return repaired, len(messages) != recovered or repaired != tuple(messages)


def repair(messages: Sequence[Message]) -> tuple[Message, ...]:
    """``messages`` with every tool_use answered (a synthetic error result for each one without a
    result) and every tool_result that answers no tool_use of the message before it dropped."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == "user" and m.tool_result_ids():
            prev = out[-1] if out and out[-1].role == "assistant" else None
            calls = set(prev.tool_use_ids()) if prev is not None else set()
            kept = tuple(b for b in m.content
                         if b.get("type") != "tool_result" or b.get("tool_use_id") in calls)
            if len(kept) != len(m.content):
                m = attrs.evolve(m, content=kept)
                if not kept:
                    i += 1
                    continue
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


def heal_tail(path: Path) -> None:
    """Cut a torn last line (a crash mid-write) off ``path`` so records appended on resume start on a
    line of their own instead of being glued to the fragment (and lost with it)."""
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        # find the last newline, reading backwards in chunks
        pos = size
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                fh.truncate(pos + nl + 1)
                return
        fh.truncate(0)


@attrs.frozen
class SessionPlan:
    """What :func:`open_session` will do: ``source`` is the session file to resume or fork (None
    for a new session)."""

    source: Path | None = None
    fork: bool = False


def plan_session(options: Options) -> SessionPlan:
    """Check the session options against the sessions directory without opening anything.

    Raises ValueError for contradictory options and FileNotFoundError for a session that does not
    exist (the CLI turns both into usage errors)."""
    directory = sessions_dir(options)
    source_id = options.resume
    if options.continue_session and source_id is None:
        source_id = latest_session(directory) if directory.is_dir() else None
        if source_id is None:
            raise FileNotFoundError(f"No conversation found to continue in {directory}")
    taken = bool(options.session_id) and (directory / f"{options.session_id}.jsonl").exists()
    if source_id is None:
        if options.fork_session:
            raise ValueError("--fork-session needs --resume or --continue: there is nothing to fork")
        if taken:
            raise ValueError(f"Session ID {options.session_id} is already in use.")
        return SessionPlan()
    path = directory / f"{source_id}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"No conversation found with session ID: {source_id}")
    if options.session_id and not options.fork_session:
        raise ValueError("--session-id can only be used with --continue or --resume if --fork-session "
                         "is also specified.")
    if taken:
        raise ValueError(f"Session ID {options.session_id} is already in use.")
    return SessionPlan(path, options.fork_session)


def open_session(options: Options, *, client: ModelClient | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, owns_client: bool = True) -> Session:
    """A new session, or the one ``--resume``/``--continue`` names (forked with ``--fork-session``);
    raises what :func:`plan_session` raises."""
    plan = plan_session(options)
    kwargs: dict[str, Any] = {"client": client, "emit": emit, "queue": queue, "owns_client": owns_client}
    if plan.source is None:
        return Session(options, **kwargs)
    source_id = plan.source.stem
    if plan.fork:
        forked = attrs.evolve(options, session_id=options.session_id or None, resume=None,
                              continue_session=False, parent_session_id=source_id)
        return Session(forked, history=load_history(plan.source), **kwargs)
    heal_tail(plan.source)
    resumed = attrs.evolve(options, session_id=source_id, resume=source_id, continue_session=False)
    history, repaired = load_view(plan.source)
    session = Session(resumed, history=history, **kwargs)
    session.resumed = True  # the file already holds the header and these messages
    # a crash left the file's view incomplete: the first run records the repaired view (appended,
    # after a boundary), so the file again holds what the next request carries
    session.repaired = repaired
    return session

