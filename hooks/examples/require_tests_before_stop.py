#!/usr/bin/env python3
"""Stop hook: the agent may not finish while the tests fail.

    {"hooks": {"Stop": [{"hooks": [
        {"type": "command", "command": "python3 /path/to/require_tests_before_stop.py", "timeout": 900}]}]}}

Runs ``$AGENTFSM_TEST_COMMAND`` (default ``pytest -q``) in the project directory. When it fails the
hook exits 2 with the tail of the output on stderr: the loop feeds that to the model and goes on.
When ``stop_hook_active`` is true (the agent is already continuing because of this hook) it lets the
stop through, so a suite the agent cannot fix does not hold the session forever.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

TAIL_LINES = 40


def _passed(command: str, code: int) -> bool:
    if code == 0:
        return True
    # pytest's 5 = "no tests collected": nothing failed, so nothing to fix.
    words = shlex.split(command) if command.strip() else []
    runs_pytest = bool(words) and (words[0].endswith("pytest") or words[:3] == ["python", "-m", "pytest"]
                                   or words[:3] == ["python3", "-m", "pytest"])
    return runs_pytest and code == 5


def main() -> int:
    try:
        data = json.load(sys.stdin)
    except Exception as exc:
        sys.stderr.write(f"require_tests_before_stop: cannot read the hook input: {exc}\n")
        return 1
    if data.get("stop_hook_active") is True:
        return 0
    command = os.environ.get("AGENTFSM_TEST_COMMAND", "pytest -q")
    cwd = os.environ.get("CLAUDE_PROJECT_DIR") or data.get("cwd") or "."
    # The command comes from the operator's environment, not from the model, so a shell is fine.
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, errors="replace")
    if _passed(command, proc.returncode):
        return 0
    output = (proc.stdout + ("\n" if proc.stdout and proc.stderr else "") + proc.stderr).rstrip()
    tail = "\n".join(output.splitlines()[-TAIL_LINES:])
    sys.stderr.write(f"The tests are failing (`{command}` exited with status {proc.returncode}). "
                     f"Fix them before you finish. Last lines of the output:\n{tail}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
