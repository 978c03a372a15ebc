"""A session's conversation in Claude Code's transcript layout, for the Agent SDK's session helpers.

When agentfsm runs as the SDK's CLI, the SDK's ``list_sessions`` and ``get_session_messages`` look
for ``<config dir>/projects/<sanitised cwd>/<session id>.jsonl`` (the config dir is
``$CLAUDE_CONFIG_DIR``, else ``~/.claude``) and read its ``user``/``assistant`` entries, chained by
``parentUuid``. :class:`ClaudeTranscript` writes that file beside agentfsm's own session file (which
stays what the loop resumes from and what ``agentfsm audit`` reads for its moves): one entry per user
message and one per assistant content block (as Claude Code writes them), hidden loop messages marked
``isMeta``, a compaction as a ``compact_boundary`` entry that starts a new chain. ``agentfsm audit``
reads the file too, as the Claude Code transcript it is laid out as.

The directory name follows Claude Code's rule (every character but ASCII letters and digits becomes
``-``; a name over 200 characters is cut and suffixed with a hash of the path), as the SDK's own
reader computes it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import unicodedata
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from agentfsm.common import log

MAX_NAME = 200
_UNSAFE = re.compile(r"[^a-zA-Z0-9]")
ENTRYPOINT = "sdk-cli"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """Claude Code's config directory: ``$CLAUDE_CONFIG_DIR``, else ``~/.claude``."""
    env = os.environ if env is None else env
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(unicodedata.normalize("NFC", configured)) if configured else Path.home() / ".claude"


def _hash36(text: str) -> str:
    """The 32-bit string hash Claude Code suffixes long directory names with, in base 36."""
    h = 0
    for ch in text:
        h = ((h << 5) - h + ord(ch)) & 0xFFFFFFFF
    if h >= 0x80000000:
        h -= 0x100000000
    h = abs(h)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        h, r = divmod(h, 36)
        out = digits[r] + out
        if h == 0:
            return out


def project_name(cwd: str | os.PathLike[str]) -> str:
    """The per-project directory name of ``cwd`` (its real path, NFC)."""
    path = unicodedata.normalize("NFC", os.path.realpath(cwd))
    name = _UNSAFE.sub("-", path)
    return name if len(name) <= MAX_NAME else f"{name[:MAX_NAME]}-{_hash36(path)}"


def transcript_path(cwd: str | os.PathLike[str], session_id: str, env: Mapping[str, str] | None = None) -> Path:
    return config_dir(env) / "projects" / project_name(cwd) / f"{session_id}.jsonl"


def _last_uuid(path: Path) -> str | None:
    """The uuid of the file's last entry (a resumed session goes on from it)."""
    last = None
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("uuid"), str):
                    last = entry["uuid"]
    except OSError:
        return None
    return last


class ClaudeTranscript:
    """Appends a session's messages to its Claude Code-layout transcript. A failure to write is logged
    and turns the mirror off: the SDK's helpers then miss the session, the run itself goes on."""

    def __init__(self, path: Path, *, session_id: str, cwd: str, version: str) -> None:
        self.path = path
        self._common = {"userType": "external", "entrypoint": ENTRYPOINT, "cwd": cwd, "sessionId": session_id,
                        "version": version}
        self._parent: str | None = _last_uuid(path) if path.exists() else None
        self._fh: IO[str] | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")
        except OSError as exc:
            log.get_logger("agentfsm.claude_transcript").warning("claude_transcript.unwritable", path=str(path),
                                                                  error=str(exc))

    def _write(self, entry: dict[str, Any]) -> None:
        if self._fh is None:
            return
        try:
            self._fh.write(json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n")
            self._fh.flush()
        except OSError as exc:
            log.get_logger("agentfsm.claude_transcript").warning("claude_transcript.write_failed",
                                                                  path=str(self.path), error=str(exc))
            self.close()

    def _entry(self, kind: str, uid: str, **fields: Any) -> None:
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self._write({"parentUuid": self._parent, "isSidechain": False, **fields, "type": kind, "uuid": uid,
                     "timestamp": now, **self._common})
        self._parent = uid

    def message(self, role: str, content: Any, uid: str, kind: str = "prompt") -> None:
        """One conversation message: a user message as one entry (``isMeta`` when the loop made it up,
        ``isCompactSummary`` for a compaction's summary), an assistant message one entry per block."""
        blocks = [dict(b) for b in content]
        if role == "assistant":
            message_id = f"msg_{uid.replace('-', '')}"
            for i, block in enumerate(blocks):
                self._entry("assistant", uid if i == 0 else str(uuid.uuid4()), message={
                    "id": message_id, "type": "message", "role": "assistant", "content": [block]})
            return
        flags: dict[str, Any] = {}
        if kind in ("meta", "attachment", "synthetic"):
            flags["isMeta"] = True
        elif kind == "compact_summary":
            flags["isCompactSummary"] = True
        self._entry("user", uid, message={"role": "user", "content": blocks}, **flags)

    def compact_boundary(self, trigger: str, pre_tokens: int) -> None:
        """A compaction: the next messages start a new chain (the SDK reads the chain of the last one)."""
        logical, self._parent = self._parent, None
        self._entry("system", str(uuid.uuid4()), subtype="compact_boundary", logicalParentUuid=logical,
                    compactMetadata={"trigger": trigger, "preTokens": pre_tokens})

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                pass
