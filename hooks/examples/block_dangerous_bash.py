#!/usr/bin/env python3
"""PreToolUse hook for Bash: deny commands that destroy data or run code fetched from the network.

    {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
        {"type": "command", "command": "python3 /path/to/block_dangerous_bash.py"}]}]}}

Answers with ``permissionDecision: "deny"`` JSON (exit 0) so the model reads the reason. It fails
closed: input it cannot read blocks the call (exit 2) instead of letting it through, because a guard
that crashes open is worse than none.
"""

from __future__ import annotations

import json
import re
import shlex
import sys

# Targets whose recursive removal is never what anybody meant.
_RM_TARGETS = re.compile(
    r"^(/|/\*|~|~/|~/\*|\$HOME/?\*?|\$\{HOME\}/?\*?|\.|\./|\./\*|\.\.|\.\./|\*"
    r"|/(bin|boot|dev|etc|home|lib|lib64|opt|proc|root|sbin|srv|sys|usr|var)/?\*?)$"
)
_SEGMENT_SPLIT = re.compile(r"&&|\|\||[;|&\n`()]|\$\(")
_WRAPPERS = {"sudo", "doas", "env", "nohup", "nice", "time", "command", "builtin", "exec", "xargs"}

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(curl|wget|fetch)\b[^|;&]*\|\s*(sudo\s+)?(env\s+)?(ba|z|da|k|fi)?sh\b"),
     "piping a download into a shell runs unreviewed code"),
    (re.compile(r"\b(ba|z|da|k)?sh\b[^;&|]*(<\(|\$\(|`)\s*(curl|wget)\b"),
     "running a downloaded script runs unreviewed code"),
    (re.compile(r"\bgit\b(\s+-\S+)*\s+push\b.*(\s--force(?!-with-lease|-if-includes)\b|\s-[a-zA-Z]*f[a-zA-Z]*\b)"),
     "force-pushing rewrites shared history (use --force-with-lease if you must)"),
    (re.compile(r"\bdd\b.*\bof=/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk)"), "writing raw data to a disk device"),
    (re.compile(r">\s*/dev/(sd|hd|vd|xvd|nvme|mmcblk|disk)"), "writing raw data to a disk device"),
    (re.compile(r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:"), "a fork bomb"),
    (re.compile(r"\bchmod\b.*\s-[a-zA-Z]*R[a-zA-Z]*\b.*\s/(\s|$)"),
     "changing permissions of the whole filesystem"),
    (re.compile(r"--no-preserve-root\b"), "rm --no-preserve-root"),
]
# Programs judged by their name in command position only, so `grep mkfs notes.txt` stays allowed.
_PROGRAMS: dict[str, str] = {
    "mkfs": "formatting a filesystem destroys its data",
    "shutdown": "shutting the machine down", "reboot": "shutting the machine down",
    "halt": "shutting the machine down", "poweroff": "shutting the machine down",
}


def _words(segment: str) -> list[str]:
    try:
        return shlex.split(segment)
    except ValueError:
        return segment.split()


def _simple_commands(command: str) -> list[list[str]]:
    """Rough split into simple commands (wrappers such as sudo and VAR=value removed). It only has
    to be good enough for the patterns below; permission rules do the careful parsing."""
    out = []
    for segment in _SEGMENT_SPLIT.split(command):
        words = _words(segment)
        while words and (words[0] in _WRAPPERS or re.match(r"^[A-Za-z_]\w*=", words[0])
                         or words[0].startswith("-")):
            words = words[1:]
        if words:
            out.append([words[0].rsplit("/", 1)[-1], *words[1:]])
    return out


def _dangerous_rm(words: list[str]) -> bool:
    if words[0] != "rm":
        return False
    flags = [w for w in words[1:] if w.startswith("-")]
    targets = [w for w in words[1:] if not w.startswith("-")]
    recursive = any(f == "--recursive" or (not f.startswith("--") and ("r" in f or "R" in f)) for f in flags)
    return recursive and any(_RM_TARGETS.match(t.rstrip()) for t in targets)


def verdict(command: str) -> str | None:
    """Why ``command`` must not run, or None."""
    for words in _simple_commands(command):
        if _dangerous_rm(words):
            return "recursive removal of the filesystem root, the home directory or the project"
        program = words[0].split(".", 1)[0]
        if program in _PROGRAMS:
            return _PROGRAMS[program]
    for pattern, why in _PATTERNS:
        if pattern.search(command):
            return why
    return None


def main() -> int:
    try:
        data = json.load(sys.stdin)
        tool_input = data.get("tool_input") or {}
        command = tool_input.get("command", "") if data.get("tool_name") == "Bash" else ""
        if not isinstance(command, str):
            raise TypeError("tool_input.command is not a string")
    except Exception as exc:
        sys.stderr.write(f"block_dangerous_bash: cannot read the hook input ({exc}); blocking to be safe\n")
        return 2
    why = verdict(command)
    if why is not None:
        json.dump({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": f"Blocked by block_dangerous_bash: {why}. Command: {command[:200]}",
        }}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
