"""Finding, resuming, continuing and forking sessions from their session files (docs/behaviour.md §6).

Session files live in one directory per working directory (:func:`agentfsm.runtime.trace.default_sessions_dir`,
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

from agentfsm.llm.model import ModelClient
from agentfsm.machine.options import Options
from agentfsm.machine.state import Message
from agentfsm.runtime.driver import Emit, InputQueue
from agentfsm.runtime.tasks import read_task_records
from agentfsm.runtime.trace import FileProblem, lock_session_file, numbered_records, sessions_dir
from agentfsm.sessions.session import Session

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


def load_view(path: Path, problems: list[FileProblem] | None = None) -> tuple[tuple[Message, ...], bool]:
    """The history view of a session file, repaired, and whether repairs changed it (then the view
    the file's message records give differs from the history a resumed run starts from). What the
    file holds that cannot be used — bad bytes, a torn line, a record with fields of the wrong
    shape — is skipped and reported in ``problems``; the rest is resumed."""
    found: list[FileProblem] = problems if problems is not None else []
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

    for lineno, rec in numbered_records(path, found):
        kind = rec.get("type")
        if kind == "compact_boundary":
            messages, streamed, streamed_id = [], [], None
        elif kind == "assistant_block":
            if rec.get("message_id") != streamed_id:
                # a new response: whatever an earlier one streamed was retried or dropped
                streamed, streamed_id = [], rec.get("message_id") if isinstance(rec.get("message_id"), str) else None
            block = valid_block(rec.get("block"), "assistant")
            if block is not None:
                streamed.append(block)
            else:
                found.append(FileProblem(lineno, "malformed_record", "an assistant_block without a usable block"))
        elif kind == "message" and rec.get("kind") == "erased_prompt":
            recover()  # a run whose prompt a UserPromptSubmit hook erased: nothing of it is history
            streamed, streamed_id = [], None
        elif kind == "message":
            message = _message(rec)
            if message is None:
                found.append(FileProblem(lineno, "malformed_record", "a message whose role or content cannot be used"))
                continue
            if message.kind == "prompt" and message.role == "user":
                recover()  # a new run starts: an unrecorded response of the last one is rebuilt
            # any other message record takes up (or, for a dropped response, supersedes) the blocks
            streamed, streamed_id = [], None
            messages.append(message)
        elif kind == "result":
            streamed, streamed_id = [], None
    recovered = len(messages)
    recover()
    repaired = repair(messages)
    return repaired, len(messages) != recovered or repaired != tuple(messages)


_BLOCK_FIELDS: Mapping[str, Mapping[str, type | tuple[type, ...]]] = {
    "text": {"text": str},
    "tool_use": {"id": str, "name": str, "input": dict},
    "tool_result": {"tool_use_id": str, "content": (str, list)},
    "thinking": {"thinking": str},
    "redacted_thinking": {"data": str},
    "image": {"source": dict},
    "document": {"source": dict},
}
_ROLE_BLOCKS = {"assistant": frozenset({"text", "tool_use", "thinking", "redacted_thinking"}),
                "user": frozenset({"text", "tool_result", "image", "document"})}


def valid_block(block: Any, role: str) -> dict[str, Any] | None:
    """``block`` if it is a content block of a known type with the fields the API requires of it."""
    if not isinstance(block, Mapping) or block.get("type") not in _ROLE_BLOCKS.get(role, ()):
        return None
    fields = _BLOCK_FIELDS[block["type"]]
    if any(not isinstance(block.get(k), t) for k, t in fields.items()):
        return None
    return dict(block)


def _message(rec: Mapping[str, Any]) -> Message | None:
    role, content = rec.get("role"), rec.get("content")
    if role not in _ROLE_BLOCKS or not isinstance(content, list):
        return None
    blocks = [valid_block(b, role) for b in content]
    kept = tuple(b for b in blocks if b is not None)
    if not kept or len(kept) != len(blocks):
        return None
    kind = rec.get("kind") if isinstance(rec.get("kind"), str) else "prompt"
    ident = rec.get("uuid") if isinstance(rec.get("uuid"), str) else str(uuid.uuid4())
    return Message(role, kept, kind=kind, uuid=ident)


def unique_tool_ids(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with every repeated tool_use id renamed (``id_2``…) and the results answering the
    repeats renamed with them, in order: a session saved before ids were made unique resumes into a
    request the API accepts."""
    seen: set[str] = set()
    pending: dict[str, list[str]] = {}
    out: list[Message] = []
    for m in messages:
        if m.role == "assistant":
            pending = {}
            blocks: list[Mapping[str, Any]] = []
            for b in m.content:
                if b.get("type") == "tool_use":
                    orig = b["id"]
                    new, n = orig, 1
                    while new in seen:
                        n += 1
                        new = f"{orig}_{n}"
                    seen.add(new)
                    pending.setdefault(orig, []).append(new)
                    if new != orig:
                        b = {**b, "id": new}
                blocks.append(b)
            if blocks != list(m.content):
                m = attrs.evolve(m, content=tuple(blocks))
        elif m.role == "user" and pending:
            blocks = []
            for b in m.content:
                queue = pending.get(b.get("tool_use_id", "")) if b.get("type") == "tool_result" else None
                if queue:
                    new = queue.pop(0)
                    if new != b["tool_use_id"]:
                        b = {**b, "tool_use_id": new}
                blocks.append(b)
            if blocks != list(m.content):
                m = attrs.evolve(m, content=tuple(blocks))
            pending = {}
        out.append(m)
    return out


def repair(messages: Sequence[Message]) -> tuple[Message, ...]:
    """``messages`` with unique tool_use ids (:func:`unique_tool_ids`), every tool_use answered (a
    synthetic error result for each one without a result) and every tool_result that answers no
    tool_use of the message before it, or answers one a second time, dropped."""
    messages = unique_tool_ids(messages)
    # a conversation starts with the user: what precedes the first user message (its record lost to
    # damage) cannot be sent
    first_user = next((k for k, m in enumerate(messages) if m.role == "user" and not m.tool_result_ids()), None)
    messages = messages[first_user:] if first_user is not None else []
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == "user" and m.tool_result_ids():
            prev = out[-1] if out and out[-1].role == "assistant" else None
            calls = set(prev.tool_use_ids()) if prev is not None else set()
            kept = _answering(m.content, calls)
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
                    out.append(attrs.evolve(nxt, content=_answering(nxt.content, set(ids)) + synthetic))
                    i += 2
                    continue
                out.append(Message("user", synthetic, kind="synthetic"))
        i += 1
    return tuple(out)


def _answering(blocks: Sequence[Mapping[str, Any]], calls: set[str]) -> tuple[Mapping[str, Any], ...]:
    """``blocks`` without the tool_results that answer none of ``calls``, or answer one a second time
    (the API refuses a second result for a call as surely as an orphan)."""
    answered: set[Any] = set()
    kept: list[Mapping[str, Any]] = []
    for b in blocks:
        if b.get("type") == "tool_result":
            if b.get("tool_use_id") not in calls or b.get("tool_use_id") in answered:
                continue
            answered.add(b.get("tool_use_id"))
        kept.append(b)
    return tuple(kept)


def heal_tail(path: Path) -> int:
    """Cut a torn last line (a crash mid-write) off ``path`` so records appended on resume start on a
    line of their own instead of being glued to the fragment (and lost with it). Returns how many
    bytes were cut."""
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
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
                return size - (pos + nl + 1)
        fh.truncate(0)
        return size


def not_a_session(path: Path) -> str | None:
    """Why ``path`` cannot be resumed as an agentfsm session (None when it can): it is empty, or its
    first record is not the ``session`` header every session file starts with (another program's
    JSONL, a Claude Code transcript). Resuming such a file would start from nothing and append to it."""
    for _, rec in numbered_records(path):
        if rec.get("type") == "session" and isinstance(rec.get("session_id"), str):
            return None
        if rec.get("type") == "session":
            return "is not an agentfsm session file (its 'session' header names no session_id)"
        return (f"is not an agentfsm session file (its first record is of type {rec.get('type')!r}, not the "
                "'session' header)")
    return "holds no conversation (it is empty, or has no record agentfsm can read)"


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
    if (problem := not_a_session(path)) is not None:
        raise ValueError(f"Cannot resume {source_id}: {path} {problem}. Nothing was written to it; "
                         "start a new session instead (leave out --resume/--continue).")
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
    problems: list[FileProblem] = []
    if plan.fork:
        forked = attrs.evolve(options, session_id=options.session_id or None, resume=None,
                              continue_session=False, parent_session_id=source_id)
        session = Session(forked, history=load_view(plan.source, problems)[0], **kwargs)
        session.file_problems = tuple(problems)
        return session
    resumed = attrs.evolve(options, session_id=source_id, resume=source_id, continue_session=False)
    # locked before anything is read or healed: a second run resuming the same session stops here
    handle = lock_session_file(plan.source) if options.write_trace else None
    try:
        cut = heal_tail(plan.source)
        if cut:
            # the torn line's own number: the one after the last whole line (what the audit reports)
            with open(plan.source, "rb") as fh:
                torn_line = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b"")) + 1
            problems.append(FileProblem(torn_line, "torn_last_line", f"a torn last line ({cut} bytes, a crash "
                                                                     "mid-write) was cut off"))
        history, repaired = load_view(plan.source, problems)
        session = Session(resumed, history=history, trace_handle=handle, **kwargs)
    except BaseException:
        if handle is not None:
            handle.close()
        raise
    session.file_problems = tuple(problems)
    session.resumed = True  # the file already holds the header and these messages
    # the background tasks its last process left running were cut off with it: reported at the next run
    session.tasks.restore(read_task_records(rec for _, rec in numbered_records(plan.source)))
    # a crash left the file's view incomplete: the first run records the repaired view (appended,
    # after a boundary), so the file again holds what the next request carries
    session.repaired = repaired
    return session

