"""The structured patch of a file change, as SDK users receive it in a Write or Edit result.

Claude Code reports a file change to SDK users (``UserMessage.tool_use_result``, PostToolUse's
``tool_response``) as a list of hunks: ``oldStart``, ``oldLines``, ``newStart``, ``newLines`` and the
hunk's ``lines``, each prefixed with ``" "``, ``"-"`` or ``"+"``, three lines of context around each
change (recorded from Claude Code 2.1.332 in tests/test_sdk_dropin.py). :mod:`difflib` finds the
changes; lines are compared with their line ends, so a lost final newline is a change, shown with the
``\\ No newline at end of file`` marker after the line that lacks it.
"""

from __future__ import annotations

import difflib
from typing import Any

CONTEXT = 3
NO_NEWLINE = "\\ No newline at end of file"


def _hunk_lines(prefix: str, lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if line.endswith("\n"):
            out.append(prefix + line[:-1].removesuffix("\r"))
        else:
            out.extend((prefix + line, NO_NEWLINE))
    return out


def structured_patch(old: str, new: str) -> list[dict[str, Any]]:
    """The hunks that turn ``old`` into ``new`` (empty when they are equal)."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    hunks: list[dict[str, Any]] = []
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        lines: list[str] = []
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                lines += _hunk_lines(" ", a[a1:a2])
                continue
            lines += _hunk_lines("-", a[a1:a2])
            lines += _hunk_lines("+", b[b1:b2])
        hunks.append({"oldStart": i1 + 1 if i2 > i1 else i1, "oldLines": i2 - i1,
                      "newStart": j1 + 1 if j2 > j1 else j1, "newLines": j2 - j1, "lines": lines})
    return hunks
