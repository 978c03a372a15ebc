"""What a permission prompt is told about a call, and the permission updates its answer may carry.

Claude Code hands its permission prompt (the Agent SDK's ``can_use_tool`` callback) more than the
tool and its input: ``suggestions`` — the permission updates that would stop the same question
coming back ("allow reads under this directory", "accept edits for the session") — a
``description`` of the call's subject, and a ``decision_reason`` when the question is not the
mode's own. An answer may send updates back (``updatedPermissions``); :func:`apply_updates`
applies them to the session's :class:`~agentfsm.hooks.permissions.PermissionPolicy`, so the user is
not asked again. Only the session destination is honoured: agentfsm writes no settings file on a
callback's behalf.

The wire form of an update is the SDK's (``PermissionUpdate.to_dict``): ``{"type": "addRules",
"rules": [{"toolName": "Read", "ruleContent": "//abs/dir/**"}], "behavior": "allow",
"destination": "session"}``, ``{"type": "setMode", "mode": "acceptEdits", ...}``, and
``addDirectories``/``removeDirectories``/``replaceRules``/``removeRules``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentfsm.common import log as fsm_log
from agentfsm.tools.base import Tool

if TYPE_CHECKING:
    from agentfsm.hooks.permissions import PermissionDecision, PermissionPolicy

log = fsm_log.get_logger("agentfsm.permissions")

OUTSIDE_REASON = "Path is outside allowed working directories"
UPDATE_TYPES = ("addRules", "replaceRules", "removeRules", "setMode", "addDirectories", "removeDirectories")


def _rule_path(path: str) -> str:
    """An absolute path in a rule's own syntax: ``//`` marks it absolute (``/tmp`` → ``//tmp``)."""
    return "/" + path


SEARCH_TOOLS = frozenset({"Glob", "Grep"})


def _real_paths(path: str) -> list[str]:
    """``path`` and, when a symlink takes it elsewhere, where it resolves."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return [path]
    return [path] if real == path else [path, real]


def _shell_context(policy: PermissionPolicy, tool: Tool, command: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(blocked path, suggestions) for a shell command, as Claude Code gives them: one that reads, lists or
    changes into a place outside the working directories offers the command as a rule and reads under
    that place (a part of a pipeline names no blocked path); one that writes outside, or copies from
    outside, offers the command, the directory and accepting edits."""
    from agentfsm.hooks.bash_approval import approval_subject
    from agentfsm.tools.shell import analyse

    itself = {"type": "addRules", "rules": [{"toolName": tool.name, "ruleContent": command}], "behavior": "allow",
              "destination": "localSettings"}
    found = policy.bash_outside(tool, {"command": command})
    place: str | None = found.path if found is not None else None
    if place is None:
        subject = approval_subject(analyse(command, str(policy.cwd)), policy.working_dirs)
        if subject is not None and not subject.inside:
            return subject.path, [itself, {"type": "addDirectories", "directories": [os.path.dirname(subject.path)],
                                           "destination": "session"},
                                  *([{"type": "setMode", "mode": "acceptEdits", "destination": "session"}]
                                    if policy.mode == "default" else [])]
        raw = policy.outside_read(tool, {"command": command})
        place = os.path.realpath(raw) if raw not in (None, "?") else None
    if place is None:
        return None, []
    folder = place if os.path.isdir(place) else os.path.dirname(place)
    blocked = None if found is not None and found.command is not None and found.command.pipeline else place
    return blocked, [itself, {"type": "addRules", "rules": [{"toolName": "Read", "ruleContent":
                                                             _rule_path(folder.rstrip("/")) + "/**"}],
                              "behavior": "allow", "destination": "session"}]


def prompt_context(policy: PermissionPolicy, tool: Tool, tool_input: Mapping[str, Any],
                   decision: PermissionDecision, hook_reason: str = "") -> dict[str, Any]:
    """``suggestions``, ``description`` and ``decision_reason`` for the question ``decision`` asks,
    as Claude Code 2.1.332 fills them: a file call names its path (relative inside the working
    directory); a read outside the working directories says so and suggests allowing reads under the
    file's directory; a write in the default mode suggests accepting edits for the session (and,
    outside the working directories, adding the file's directory); plan mode suggests nothing; a
    shell command is described by its ``description``."""
    from agentfsm.hooks.permissions import EDIT_TOOLS, _file_subject, _inside, _through_link, _tool_names

    subject = _file_subject(tool, tool_input, policy.cwd)
    description: str | None = None
    suggestions: list[dict[str, Any]] = []
    reason: str | None = hook_reason or None if decision.decided_by == "hook" else None
    blocked: str | None = None
    if subject is None:
        # a shell command is described by its own description, else by the command (Claude Code)
        given = tool_input.get("description")
        command = tool_input.get("command")
        description = given if isinstance(given, str) and given else None
        if "Bash" in _tool_names(tool) and isinstance(command, str):
            description = description or command
            blocked, suggestions = _shell_context(policy, tool, command)
    else:
        path, _access, tree = subject
        inside = _inside([path], policy.working_dirs)
        names = _tool_names(tool)
        pattern = tool_input.get("pattern")
        if names & SEARCH_TOOLS and isinstance(pattern, str):
            description = pattern  # a search is described by what it looks for
        else:
            description = os.path.relpath(path, policy.cwd) if _inside([path], [policy.cwd]) else path
        folder = path if tree or os.path.isdir(path) else os.path.dirname(path)
        real = _through_link(_real_paths(path), policy.working_dirs)
        real_folder = None
        if real is not None:
            # inside as written, outside where a symlink takes it: said, and both places offered
            blocked = real
            real_folder = real if tree or os.path.isdir(real) else os.path.dirname(real)
            if reason is None:
                reason = (f"{path} resolves through a symlink to {real}, which is outside the allowed working "
                          "directories")
        if not inside and reason is None:
            reason = OUTSIDE_REASON
        if policy.reads_outside(tool, tool_input):
            suggestions += [{"type": "addRules", "rules": [{"toolName": "Read", "ruleContent":
                                                            _rule_path(f.rstrip("/")) + "/**"}],
                             "behavior": "allow", "destination": "session"} for f in (folder, real_folder) if f]
        elif names & EDIT_TOOLS and policy.mode in ("default", "acceptEdits") \
                and decision.decided_by == "mode":
            if policy.mode == "default":
                suggestions.append({"type": "setMode", "mode": "acceptEdits", "destination": "session"})
            if not inside or real_folder is not None:
                suggestions.append({"type": "addDirectories", "directories": [d for d in (folder, real_folder) if d],
                                    "destination": "session"})
    return {"suggestions": tuple(suggestions), "description": description, "decision_reason": reason,
            "blocked_path": blocked}


def _problem(update: Any) -> str | None:
    """Why ``update`` cannot be applied, or None."""
    if not isinstance(update, Mapping):
        return f"not an object: {update!r}"
    kind = update.get("type")
    if kind not in UPDATE_TYPES:
        return f"unknown type {kind!r}"
    if kind in ("addRules", "replaceRules", "removeRules"):
        rules = update.get("rules")
        if update.get("behavior") not in ("allow", "deny", "ask"):
            return f"{kind}: behavior must be allow, deny or ask"
        if not isinstance(rules, list) or not all(
                isinstance(r, Mapping) and isinstance(r.get("toolName"), str) and r["toolName"]
                and isinstance(r.get("ruleContent", ""), str) for r in rules):
            return f"{kind}: rules must be a list of {{toolName, ruleContent?}}"
        from agentfsm.hooks.permissions import PermissionRule

        for r in rules:
            try:
                PermissionRule.parse(f"{r['toolName']}({r['ruleContent']})" if r.get("ruleContent")
                                     else r["toolName"], update["behavior"], "session")
            except ValueError as exc:
                return f"{kind}: rule {r!r}: {exc}"
    if kind == "setMode":
        from agentfsm.common.modes import PERMISSION_MODES

        if update.get("mode") not in PERMISSION_MODES:
            return f"setMode: unknown mode {update.get('mode')!r}"
    if kind in ("addDirectories", "removeDirectories"):
        dirs = update.get("directories")
        if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
            return f"{kind}: directories must be a list of paths"
    return None


def apply_updates(policy: PermissionPolicy, updates: Sequence[Any]) -> bool:
    """Apply the ``updatedPermissions`` of an answer to ``policy`` for the session. One bad update
    drops them all (as Claude Code does; the call itself stays allowed); returns whether they were
    applied."""
    from agentfsm.hooks.permissions import PermissionRule, dedup_rules, normalize_mode

    problems = [p for p in map(_problem, updates) if p is not None]
    if problems:
        log.warning("permission.updates_ignored", problems=problems)
        return False
    for u in updates:
        kind = u["type"]
        if kind == "setMode":
            policy.mode = normalize_mode(u["mode"])
        elif kind == "addDirectories":
            policy.additional_directories.extend(
                (policy.cwd / Path(d).expanduser()).resolve() for d in u["directories"])
        elif kind == "removeDirectories":
            gone = {(policy.cwd / Path(d).expanduser()).resolve() for d in u["directories"]}
            policy.additional_directories[:] = [d for d in policy.additional_directories if d not in gone]
        else:
            behavior = u["behavior"]
            rules = [PermissionRule.parse(f"{r['toolName']}({r['ruleContent']})" if r.get("ruleContent")
                                          else r["toolName"], behavior, "session") for r in u["rules"]]
            kept = list(getattr(policy, behavior))
            if kind == "replaceRules":
                kept = [r for r in kept if r.source != "session"] + rules
            elif kind == "removeRules":
                ids = {r.identity() for r in rules}
                kept = [r for r in kept if r.identity() not in ids]
            else:
                kept += rules
            setattr(policy, behavior, dedup_rules(kept))
        log.info("permission.updated", update_type=kind, destination=u.get("destination", "session"))
    return True
