#!/usr/bin/env python3
"""PostToolUse (and PostToolUseFailure) hook: append one JSON line per tool call to an audit log.

    {"hooks": {"PostToolUse": [{"hooks": [
        {"type": "command", "command": "python3 /path/to/audit_log.py"}]}]}}

The log is ``$AGENTFSM_AUDIT_LOG`` (relative paths are taken from the project directory) or
``<project>/.agentfsm/audit.jsonl``. Hooks of parallel tool calls run at the same time, so each line
is written under an exclusive lock. The hook never changes the run: it prints nothing and a failure
is a non-blocking error.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import sys
from pathlib import Path

_FIELDS = ("session_id", "hook_event_name", "tool_name", "tool_use_id", "tool_input", "tool_response",
           "duration_ms", "error", "is_interrupt", "permission_mode", "cwd")


def main() -> int:
    try:
        data = json.load(sys.stdin)
    except Exception as exc:
        sys.stderr.write(f"audit_log: cannot read the hook input: {exc}\n")
        return 1
    project = Path(os.environ.get("CLAUDE_PROJECT_DIR") or data.get("cwd") or ".")
    target = Path(os.environ.get("AGENTFSM_AUDIT_LOG") or project / ".agentfsm" / "audit.jsonl")
    if not target.is_absolute():
        target = project / target
    record = {"ts": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")}
    record.update({k: data[k] for k in _FIELDS if k in data})
    line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.write(line)
                fh.flush()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError as exc:
        sys.stderr.write(f"audit_log: cannot write {target}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
