"""Ready command hooks (plain ``python3`` scripts, standard library only).

- ``block_dangerous_bash.py`` — PreToolUse on Bash: denies ``rm -rf /``, ``curl … | sh``,
  ``git push --force``, ``mkfs``, writes to raw disks, fork bombs (``permissionDecision: deny``).
- ``require_tests_before_stop.py`` — Stop: runs ``$AGENTFSM_TEST_COMMAND`` (default ``pytest -q``)
  and blocks the end of the turn (exit 2, failure tail on stderr) while it fails.
- ``audit_log.py`` — PostToolUse: appends one JSON line per tool call to ``$AGENTFSM_AUDIT_LOG``
  (default ``<project>/.agentfsm/audit.jsonl``).

Use :func:`example_command` to get a ``command`` string for ``settings.json``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

EXAMPLES: tuple[str, ...] = ("block_dangerous_bash", "require_tests_before_stop", "audit_log")
_DIR = Path(__file__).resolve().parent


def example_path(name: str) -> Path:
    if name not in EXAMPLES:
        raise ValueError(f"unknown example hook {name!r}; expected one of {', '.join(EXAMPLES)}")
    return _DIR / f"{name}.py"


def example_command(name: str) -> str:
    """A shell-form ``command`` that runs the example with ``python3`` (no exec bit needed)."""
    return f"python3 {shlex.quote(str(example_path(name)))}"
