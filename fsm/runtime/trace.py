"""The session file: one JSONL record per message, state transition, request and result.

One file serves both jobs of docs/behaviour.md §6 and §8: resume reads the ``message`` (and ``compact_boundary``)
records, the auditor reads ``transition``, ``request`` and ``result`` records. Records are written
whole, in order, and reach the file before anything else can act on them: inside an event loop a
record is flushed before the loop runs anything else (one write for every record made since the
task last waited: the moves, messages and request of a turn's synchronous stretch), outside one at
once, and the result at once. A crash therefore loses at most the records of the stretch it
interrupted — nothing any tool, hook or request could have seen — and leaves at most one torn last
line, which readers skip.

Record types (every record has ``type`` and ``seq``, a per-file counter from 0):

``session``      ``session_id``, ``version``, ``limits`` (Limits fields), ``graph`` (digest of the
                 declared edges), ``cwd``, ``model``, ``parent_session_id`` (fork/subagent), ``ts``;
                 a session run as a Temporal workflow adds ``workflow_id`` and ``run_id``
``message``      ``uuid``, ``role``, ``kind``, ``content`` (wire blocks) — the transcript
``assistant_block`` ``message_id``, ``block``: one streamed content block as soon as it is complete,
                 so a crash while its tools run still leaves the ``tool_use`` to repair on resume
``compact_boundary`` ``trigger``, ``pre_tokens``; the messages after it are the new history view
``transition``   ``from``, ``to``, ``trigger``, ``kind`` (edge kind), ``route`` (the guard that
                 chose the edge), ``event`` (the observed event in record form, see
                 :func:`agentfsm.machine.events.to_record`; absent on a move a phase made on its own, which
                 decided on the previous record's event), ``turn``, ``changed`` (the fields of the
                 state snapshot, :meth:`LoopState.snapshot`, that this move changed — a reader
                 rebuilds each snapshot with :class:`SnapshotReader`), ``terminal_reason`` (on moves
                 into stop), ``chain_id`` (when a run's chain starts)
``request``      ``model``, ``depth``, ``messages`` (how many messages of the conversation — the
                 message records since the last boundary — the request carried), ``last`` (the uuid
                 of the last of them), ``queued`` (uuids of queued user input it also carried; their
                 message records follow when the request was accepted)

Every record holds what is new since the record before it, so a session file grows linearly with
the run. Format 2 repeated every counter in each transition and a skeleton of the whole
conversation in each request; format 1 recorded no events. Readers here and in the auditor read all
three.
``result``       the result object printed by the CLI (``subtype``, ``is_error``, ``terminal_reason``…)
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from agentfsm.machine.events import to_record

try:
    import fcntl
except ImportError:  # pragma: no cover - no advisory locks on this platform
    fcntl = None  # type: ignore[assignment]
from agentfsm.common.textsafe import json_line
from agentfsm.machine.state import SNAPSHOT_KEYS, Limits, LoopState, Message, appended, snapshot_json

# 1: transitions without events (audited structurally); 2: events and full snapshots (replayed);
# 3: what changed since the previous record (replayed; linear in the run's length)
TRACE_VERSION = 3


@functools.cache
def graph_digest() -> str:
    """The declaration's fingerprint (edges and routes, in order); hashed once per process."""
    from agentfsm.machine.graph import EDGES, ROUTES

    text = json.dumps([[[e.trigger, [s.value for s in e.sources], e.dest.value, e.kind,
                         sorted(r.value for r in e.reasons)] for e in EDGES],
                       [[[s.value for s in r.sources], r.label] for r in ROUTES]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SessionBusy(ValueError):
    """Another run holds the session file: one writer per session."""


def lock_session_file(path: Path) -> IO[str]:
    """``path`` opened for appending under an exclusive advisory lock (held until it is closed);
    :class:`SessionBusy` when another run holds it. Two runs writing one session would interleave
    into a history neither had."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a", encoding="utf-8")
    if fcntl is not None:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise SessionBusy(f"Session {path.stem} is in use by another agentfsm run (its session file is "
                              "locked). Wait for that run to end, or add --fork-session to continue the "
                              "conversation in a new session.") from None
    return fh


class TraceWriter:
    """Appends records to one session file; ``path=None`` keeps nothing (a pure in-memory run).
    The file is locked while the writer holds it (:func:`lock_session_file`); ``handle`` is a file
    already opened and locked that way.

    Each record method returns before building its record when there is no file: the loop calls
    them on every move, and a run without a trace should not pay for dicts nobody writes."""

    def __init__(self, path: Path | None, handle: IO[str] | None = None, *,
                 sink: Callable[[dict[str, Any]], None] | None = None, seq: int = 0,
                 clock: Callable[[], float] = time.time, mirror: Any = None) -> None:
        """``handle``: ``path`` already opened and locked (:func:`lock_session_file`). ``sink``: hand
        each finished record (``seq`` set) to this callable instead of the file — a host that writes
        the file elsewhere (a Temporal workflow, through an activity) builds the same records; ``seq``
        is then the number of the first record and ``clock`` gives ``ts``. ``mirror``: also hand each
        message and compaction to it (:class:`agentfsm.sessions.claude_transcript.ClaudeTranscript`)."""
        self.path = path
        self.mirror = mirror
        self._seq = seq
        self._chain: str | None = None
        self._snap_of: Any = None  # the state whose snapshot values _snap are
        self._snap: tuple[Any, ...] = ()
        self._fh: IO[str] | None = None
        self._sink = sink
        self._clock = clock
        self._flush_due = False  # a flush is scheduled on the running loop
        self._lock = threading.Lock()  # records may come from worker threads (see write)
        if sink is None and path is not None:
            self._fh = handle if handle is not None else lock_session_file(path)
            self._seq = _next_seq(path)
        self._on = self._fh is not None or sink is not None

    @property
    def next_seq(self) -> int:
        return self._seq

    def write(self, record: Mapping[str, Any], *, flush: bool = True) -> None:
        """Append one record. With ``flush`` it reaches the file before the event loop runs anything
        else (see :meth:`flush_soon`); ``flush=False`` leaves it in the buffer for a caller that writes
        several records and flushes after them."""
        if not self._on:
            return
        # One record at a time: a command's sandbox record comes from the worker thread that prepared
        # it (concurrent read-only commands prepare in parallel), the loop's from the event loop; a
        # seq taken and written under the lock keeps the file's records numbered in order.
        with self._lock:
            # "type" first, then "seq", then the rest in order (update keeps "type" where it is)
            rec = {"type": record["type"], "seq": self._seq}
            rec.update(record)
            self._seq += 1
            if self._sink is not None:
                self._sink(rec)
                return
            if self._fh is None:  # closed meanwhile (by the loop, while a worker thread got here)
                return
            self._fh.write(json_line(rec) + "\n")
        if flush:
            self.flush_soon()

    def flush_soon(self) -> None:
        """Flush before the running event loop runs anything else: the records a task writes until it
        next waits reach the file in one write, and before any other task, callback, tool or hook
        of this loop runs. Outside an event loop: at once."""
        if self._flush_due or self._fh is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            with self._lock:
                if self._fh is not None:
                    self._fh.flush()
            return
        self._flush_due = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        """Flush now (before the loop hands the file to someone else: a hook may read it)."""
        self._flush_due = False
        with self._lock:
            if self._fh is not None:
                self._fh.flush()

    def before_hooks(self, hooks: object, event: str) -> None:
        """A hook may read the session file (its ``transcript_path``): what was written is flushed
        before ``hooks`` run for ``event`` (a command hook is started before the caller next waits).
        Skipped only when the hooks say none is configured for the event; hooks that cannot say get
        the flush."""
        has_hooks = getattr(hooks, "has_hooks", None)
        if has_hooks is None or has_hooks(event):
            self.flush()

    def session(self, session_id: str, limits: Limits, cwd: str, model: str,
                parent_session_id: str | None = None, **extra: Any) -> None:
        """The header; ``extra`` adds fields (a workflow-backed session names its workflow)."""
        if not self._on:
            return
        self.write({"type": "session", "session_id": session_id, "version": TRACE_VERSION,
                    "limits": attrs.asdict(limits), "graph": graph_digest(), "cwd": cwd, "model": model,
                    "parent_session_id": parent_session_id, "ts": self._clock(), **extra})

    def message(self, msg: Message, *, flush: bool = True) -> None:
        if not self._on:
            return
        self.write({"type": "message", "uuid": msg.uuid, "role": msg.role, "kind": msg.kind,
                    "content": [dict(b) for b in msg.content]}, flush=flush)
        if self.mirror is not None:
            self.mirror.message(msg.role, msg.content, msg.uuid, msg.kind)

    def compact_boundary(self, trigger: str, pre_tokens: int, *, flush: bool = True) -> None:
        if not self._on:
            return
        self.write({"type": "compact_boundary", "trigger": trigger, "pre_tokens": pre_tokens}, flush=flush)
        if self.mirror is not None:
            self.mirror.compact_boundary(trigger, pre_tokens)

    def on_step(self, before: LoopState, step: Any, event: Any) -> None:
        """A step of the loop (the driver's observer): its transition record, then the messages it
        added — or, when it replaced the history (compaction), a boundary and the new view."""
        if not self._on:
            return
        after = step.state
        rec: dict[str, Any] = {
            "type": "transition", "from": before.phase.value, "to": after.phase.value,
            "trigger": step.trigger, "kind": step.edge.kind, "route": step.route}
        if not step.automatic:
            rec["event"] = to_record(event)
        # the previous step's snapshot is this step's "before": computed once per state
        was = self._snap if self._snap_of is before else before.snapshot_values()
        now = after.snapshot_values()
        self._snap_of, self._snap = after, now
        rec["turn"] = after.turn_count
        # the snapshot fields whose values differ (enum members differ exactly when their values do)
        rec["changed"] = {k: snapshot_json(v) for k, a, v in zip(SNAPSHOT_KEYS, was, now, strict=True) if a != v}
        if after.terminal_reason is not None:
            rec["terminal_reason"] = after.terminal_reason.value
        chain = after.query_tracking.chain_id
        if chain != self._chain:
            rec["chain_id"] = self._chain = chain
        self.write(rec, flush=False)
        old, new = before.messages, after.messages
        if new is not old:
            if appended(old, new):
                for m in new[len(old):]:
                    self.message(m, flush=False)
            else:
                compaction = getattr(event, "compaction", None)
                self.compact_boundary(compaction.trigger if compaction is not None else "swap",
                                      compaction.pre_tokens if compaction is not None else 0, flush=False)
                for m in new:
                    self.message(m, flush=False)
        # the step's records reach the file together, with whatever else this stretch writes
        self.flush_soon()

    def request(self, model: str, depth: int, messages: Any, queued: Any = ()) -> None:
        """A request was sent: it carried ``messages`` (the conversation: every message record since
        the last boundary) and ``queued`` input. Referenced, not copied."""
        if not self._on:
            return
        self.write({"type": "request", "model": model, "depth": depth, "messages": len(messages),
                    "last": messages[-1].uuid if messages else None, "queued": [m.uuid for m in queued]})

    def result(self, result: Mapping[str, Any]) -> None:
        """The run's result, flushed at once: it is in the file before anyone prints it."""
        if not self._on:
            return
        self.write({"type": "result", **result}, flush=False)
        self.flush()

    def close(self) -> None:
        """Close the file, its records on disk first (fsync): a result printed is a result kept."""
        self._flush_due = False
        if self.mirror is not None:
            self.mirror.close()
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
                try:
                    os.fsync(self._fh.fileno())
                except OSError:  # a file system without fsync still gets its flushed records
                    pass
                self._fh.close()
                self._fh = None
            self._on = self._sink is not None


# The snapshot of a loop that has not moved yet: what format 3 records are differences from.
FRESH_SNAPSHOT: Mapping[str, Any] = LoopState().snapshot()


class SnapshotReader:
    """Rebuilds the full state snapshot after each transition record, whatever the format: format 3
    records hold only what changed (from :data:`FRESH_SNAPSHOT` at a run's first move), format 2 the
    whole snapshot, format 1 only the counters."""

    def __init__(self) -> None:
        self.snapshot: dict[str, Any] = dict(FRESH_SNAPSHOT)

    def start_run(self) -> None:
        self.snapshot = dict(FRESH_SNAPSHOT)

    def read(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        changed = rec.get("changed")
        if isinstance(changed, Mapping):
            snap = {**self.snapshot, **changed}
        else:
            snap = {**FRESH_SNAPSHOT}
            for part in (rec.get("counters"), rec.get("state")):
                if isinstance(part, Mapping):
                    snap.update(part)
        if "turn" in rec:
            snap["turn_count"] = rec["turn"]
        if "terminal_reason" in rec:
            snap["terminal_reason"] = rec["terminal_reason"]
        if isinstance(rec.get("to"), str):
            snap["phase"] = rec["to"]
        self.snapshot = snap
        return snap


def transition_snapshots(records: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
    """Each transition record with the full snapshot after it, in file order (runs start afresh)."""
    reader, starts, out = SnapshotReader(), RunStarts(), []
    for rec in records:
        if starts.starts_run(rec):
            reader.start_run()
        if rec.get("type") == "transition":
            out.append((rec, reader.read(rec)))
    return out


PROMPT_KINDS = frozenset({"prompt", "erased_prompt"})


class RunStarts:
    """Where each run of the loop starts in a session file: at the prompt message the driver records
    before its first move (``erased_prompt`` when a hook erased it) — unless that message is part of
    a history rewritten after a compact boundary. Feed it every record in order."""

    def __init__(self) -> None:
        self.rewriting = False  # inside the messages that follow a compact boundary

    def starts_run(self, rec: Mapping[str, Any]) -> bool:
        kind = rec.get("type")
        if kind == "compact_boundary":
            self.rewriting = True
            return False
        if kind == "message":
            return rec.get("kind") in PROMPT_KINDS and not self.rewriting
        if kind in ("sandbox", "task"):
            # how a command ran (agentfsm.hooks.sandbox), a background task's state (agentfsm.tasks):
            # no part of the conversation
            return False
        self.rewriting = False
        return False


def sessions_dir(options: Any) -> Path:
    """Where a session configured by ``options`` keeps its file: ``Options.sessions_dir``, else the
    per-project default."""
    return options.sessions_dir or default_sessions_dir(options.cwd)


def _next_seq(path: Path) -> int:
    last = -1
    for rec in read_records(path):
        seq = rec.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > last:
            last = seq
    return last + 1


@attrs.frozen
class FileProblem:
    """Something a reader of a session file skipped or repaired, by 1-based line: ``torn_last_line``
    (a crash mid-write), ``undecodable_line`` (bytes that are not UTF-8, read with U+FFFD in their
    place), ``unreadable_line`` (not a JSON record), ``malformed_record`` (a record whose fields a
    reader cannot use)."""

    line: int
    code: str
    detail: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.detail}"


def read_records(path: Path, problems: list[FileProblem] | None = None) -> Iterator[dict[str, Any]]:
    """Every whole record of a session file, in order. Nothing in the file stops the reader: a torn
    last line, bytes that are not UTF-8, a line that is not a JSON object with a ``type`` are
    skipped (or, for bad bytes, read with replacement characters) and, when ``problems`` is given,
    reported there."""
    return (rec for _line, rec in numbered_records(path, problems))


def numbered_records(path: Path, problems: list[FileProblem] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`read_records` with each record's 1-based line number."""
    if not path.exists():
        return

    def note(line: int, code: str, detail: str) -> None:
        if problems is not None:
            problems.append(FileProblem(line, code, detail))

    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.endswith(b"\n"):
                note(lineno, "torn_last_line", f"the last line ({len(raw)} bytes, no newline) was cut off mid-write")
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = raw.decode("utf-8", errors="replace")
                note(lineno, "undecodable_line", f"not UTF-8 at byte {exc.start}; read with the bad bytes replaced")
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as exc:
                note(lineno, "unreadable_line", f"not JSON ({exc})"[:200])
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
                note(lineno, "unreadable_line", "not a record: a JSON object with a 'type' is required")
                continue
            yield lineno, rec


def default_sessions_dir(cwd: Path) -> Path:
    """``$AGENTFSM_HOME/projects/<cwd with / as ->`` like Claude Code's per-project folders."""
    if not cwd.is_absolute():  # resolved against the process's cwd, which may change: not cached
        return _sessions_dir.__wrapped__(str(cwd), os.environ.get("AGENTFSM_HOME"), os.environ.get("HOME"))
    return _sessions_dir(str(cwd), os.environ.get("AGENTFSM_HOME"), os.environ.get("HOME"))


@functools.lru_cache(maxsize=64)
def _sessions_dir(cwd: str, agentfsm_home: str | None, home_env: str | None) -> Path:
    # Memoised on the inputs (the environment included): every Session asks, even one that writes no
    # trace, and resolving the path costs a few syscalls each time. ``home_env`` is only in the key
    # because Path.home() reads $HOME.
    home = Path(agentfsm_home) if agentfsm_home is not None else Path.home() / ".agentfsm"
    return home / "projects" / str(Path(cwd).resolve()).replace(os.sep, "-")
