"""Permission rules and modes, in Claude Code's syntax and with its precedence (docs/behaviour.md §5, §10).

A call is judged in this order; the first step that decides wins:

1. a matching ``deny`` rule denies — in every mode, ``bypassPermissions`` included;
2. a PreToolUse hook's ``deny`` denies;
3. ``plan`` mode denies anything that is not read-only (plan mode must not change the world, so
   not even an allow rule or a hook reopens it);
4. a matching ``ask`` rule, or a hook's ``ask``/``defer``, asks;
5. a hook's ``allow`` allows (it skips the prompt, never a deny or ask rule);
6. ``allow`` rules allow (for a compound Bash command every part must be allowed);
7. the mode: ``bypassPermissions`` allows; ``acceptEdits`` allows file edits inside the working
   directories; read-only tools are allowed; everything else asks;
8. ``dontAsk`` turns every ask into a denial; otherwise a ``can_use_tool`` callback answers the
   ask, and without one (a non-interactive run) the ask is a denial with a message saying so.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.common.modes import normalize_mode
from agentfsm.hooks import bash_boundary
from agentfsm.hooks.bash_approval import UNCLASSIFIED, approval_text, edits_inside
from agentfsm.hooks.bash_policy import (
    Match,
    denied_text,
    file_rule,
    parts_allowed,
    program_rule,
    spec_matches,
    wildcard,
)
from agentfsm.hooks.file_access import PathChecker, PolicyFileAccess, path_rule_matches
from agentfsm.tools.base import Access, Tool
from agentfsm.tools.bash import segment_read_only
from agentfsm.tools.pathmatch import has_magic
from agentfsm.tools.shell import analyse

RuleBehavior = Literal["allow", "ask", "deny"]

# Path rules name a tool family: `Edit(...)` covers every file-editing tool, `Read(...)` every tool
# that reads files (docs/behaviour.md §10). A rule naming a member directly covers only that member.
EDIT_TOOLS: frozenset[str] = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
READ_TOOLS: frozenset[str] = frozenset({"Read", "Grep", "Glob", "NotebookRead", "LS"})
_PATH_FAMILIES: Mapping[str, frozenset[str]] = {
    "Edit": EDIT_TOOLS, "Read": READ_TOOLS,
    **{name: frozenset({name}) for name in (EDIT_TOOLS | READ_TOOLS) - {"Edit", "Read"}},
}
_SEARCH_TOOLS = frozenset({"Grep", "Glob", "LS"})
# The rules a Bash command's file reads and writes answer to.
BASH_READ_RULES = frozenset({"Read"})
log = fsm_log.get_logger("agentfsm.permissions")

#: Longest a permission check of one Bash command may take before the call is denied.
CHECK_BUDGET_S = 30.0


# ----------------------------------------------------------------------------------------------
# Rule syntax

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-*]+$")


def parse_rule_text(text: str) -> tuple[str, str | None]:
    """``"Bash(npm run test:*)"`` → ``("Bash", "npm run test:*")``; ``"Read"`` → ``("Read", None)``.

    ``Tool()`` and ``Tool(*)`` mean the whole tool. Parentheses inside a specifier may be written
    escaped (``\\(``); the specifier runs to the last ``)``.
    """
    raw = text
    text = text.strip()
    if not text:
        raise ValueError("empty permission rule")
    if "(" not in text:
        if text.endswith(")"):
            raise ValueError(f"invalid permission rule {raw!r}: ')' without '('")
        name, spec = text, None
    else:
        if not text.endswith(")"):
            raise ValueError(f"invalid permission rule {raw!r}: the specifier must end with ')'")
        name, spec = text[: text.index("(")], text[text.index("(") + 1: -1]
        spec = spec.replace("\\(", "(").replace("\\)", ")")
        if spec.strip() in ("", "*"):
            spec = None
    name = name.strip()
    if not name or not _TOOL_NAME.match(name):
        raise ValueError(f"invalid permission rule {raw!r}: {name!r} is not a tool name")
    return name, spec


def split_tool_list(values: str | Iterable[str]) -> list[str]:
    """Split ``--allowedTools``/``--disallowedTools`` values: comma or whitespace separated, but
    never inside a specifier (``"Bash(git log *) Read,Edit"`` → three rules)."""
    items = [values] if isinstance(values, str) else list(values)
    out: list[str] = []
    for item in items:
        depth, buf = 0, []
        for ch in item:
            if ch == "(":
                depth += 1
            elif ch == ")" and depth:
                depth -= 1
            if depth == 0 and (ch == "," or ch.isspace()):
                if "".join(buf).strip():
                    out.append("".join(buf).strip())
                buf = []
                continue
            buf.append(ch)
        if "".join(buf).strip():
            out.append("".join(buf).strip())
    return out


@attrs.frozen
class PermissionRule:
    """One rule. ``root`` is the project directory of the settings file it came from: the base of
    ``/path`` specifiers (None = the working directory)."""

    tool: str
    specifier: str | None
    behavior: RuleBehavior
    source: str = "cli"
    root: Path | None = None

    @classmethod
    def parse(cls, text: str, behavior: RuleBehavior, source: str = "cli",
              root: Path | None = None) -> PermissionRule:
        tool, spec = parse_rule_text(text)
        return cls(tool, spec, behavior, source, root)

    def __str__(self) -> str:
        return self.tool if self.specifier is None else f"{self.tool}({self.specifier})"

    @property
    def label(self) -> str:
        return f"{self.behavior}: {self}"

    def identity(self) -> tuple[str, str | None, Path | None]:
        """Two rules with the same identity are the same rule. The root only tells `/p` rules apart:
        nothing else is relative to the settings file."""
        spec = self.specifier or ""
        rooted = spec.startswith("/") and not spec.startswith("//")
        return self.tool, self.specifier, self.root if rooted else None

    def names_tool(self, tool: Tool) -> bool:
        """Does the rule's tool part select ``tool`` (ignoring the specifier)?"""
        names = _tool_names(tool)
        if self.tool in names:
            return True
        if self.tool.startswith("mcp__"):
            # `mcp__server` and `mcp__server__*` name every tool of that server.
            prefix = self.tool[:-1] if self.tool.endswith("*") else self.tool + "__"
            return any(n.startswith(prefix) for n in names)
        return False

    def covers_whole_tool(self, name: str) -> bool:
        """A bare rule naming ``name`` (used to hide denied tools from the model)."""
        if self.specifier is not None:
            return False
        if self.tool == name:
            return True
        if self.tool.startswith("mcp__"):
            prefix = self.tool[:-1] if self.tool.endswith("*") else self.tool + "__"
            return name.startswith(prefix)
        return False

    def matches(self, tool: Tool, tool_input: Mapping[str, Any], cwd: Path) -> bool:
        """Does this rule apply to the call, read as a deny/ask rule would be (any part of a
        compound command, any spelling of a path)?"""
        return _rule_hits(self, tool, tool_input, cwd, strict=False)


def _tool_names(tool: Tool) -> set[str]:
    return {tool.name, *tool.aliases}


def _rule_hits(rule: PermissionRule, tool: Tool, tool_input: Mapping[str, Any], cwd: Path, *,
               strict: bool) -> bool:
    """``strict`` is the allow reading: every part of a compound command and every spelling of a
    path must match. The non-strict reading (deny/ask) needs only one."""
    names = _tool_names(tool)
    if rule.specifier is None:
        return rule.names_tool(tool)
    family = _PATH_FAMILIES.get(rule.tool)
    if family is not None and names & family:
        paths = _subject_paths(tool, tool_input, cwd)
        if not paths:
            return False
        hits = [path_rule_matches(rule.specifier, p, cwd, rule.root) for p in paths]
        return all(hits) if strict else any(hits)
    if not rule.names_tool(tool):
        return False
    if rule.tool == "Bash" or "Bash" in names:
        command = tool_input.get("command")
        if not isinstance(command, str):
            return False
        analysis = analyse(command, str(cwd))
        if strict:
            return parts_allowed([rule.specifier], command, analysis)
        return program_rule(rule.specifier, command, analysis) is not None
    if rule.tool == "WebFetch" and rule.specifier.startswith("domain:"):
        return _domain_matches(rule.specifier[len("domain:"):], tool_input.get("url"))
    subject = _generic_subject(tool, tool_input)
    return subject is not None and wildcard(rule.specifier).fullmatch(subject.strip()) is not None


def _generic_subject(tool: Tool, tool_input: Mapping[str, Any]) -> str | None:
    # A tool's permission_subject that raises is not caught here: "no subject" would read as "no
    # rule applies", an allow. The exception reaches the deciding method, which fails closed.
    if tool.name in ("Agent", "Task") and isinstance(tool_input.get("subagent_type"), str):
        return tool_input["subagent_type"]
    return tool.permission_subject(tool_input)


def _may_apply(rule: PermissionRule, tool: Tool) -> bool:
    """Whether ``rule`` could apply to some call of ``tool``: it names the tool, or it is a path
    rule of a family the tool belongs to (a Bash command answers to Read and Edit rules too)."""
    if rule.names_tool(tool):
        return True
    names = _tool_names(tool)
    family = _PATH_FAMILIES.get(rule.tool)
    if family is not None and names & family:
        return True
    return "Bash" in names and rule.specifier is not None and rule.tool in BASH_READ_RULES | EDIT_TOOLS


def unjudged_text(tool: Tool, exc: BaseException) -> str:
    """What the model is told when a call could not be judged against the rules."""
    return (f"Permission to use {tool.name} has been denied: the call could not be checked against the "
            f"permission rules ({type(exc).__name__}: {exc}).")


def _domain_matches(domain: str, url: Any) -> bool:
    if not isinstance(url, str):
        return False
    host = (urlsplit(url if "//" in url else "//" + url).hostname or "").lower()
    domain = domain.lower().strip()
    if domain.startswith("*."):
        return host.endswith(domain[1:])
    return host == domain or host.endswith("." + domain)


# ----------------------------------------------------------------------------------------------
# Path specifiers (gitignore-style)

def _subject_paths(tool: Tool, tool_input: Mapping[str, Any], cwd: Path, *, boundary: bool = False) -> list[str]:
    """The path(s) a file tool touches, absolute and normalised, plus the symlink-resolved form
    when it differs (a deny rule on a target must not be dodged through a link)."""
    raw: str | None = None
    for key in ("file_path", "notebook_path", "path"):
        if isinstance(tool_input.get(key), str) and tool_input[key]:
            raw = tool_input[key]
            break
    names = _tool_names(tool)
    if raw is None and names & _SEARCH_TOOLS:
        raw = str(cwd)  # a search without a path searches the working directory
    if raw is None:
        raw = _generic_subject(tool, tool_input)
    if raw is None:
        return []
    base = Path(os.path.expanduser(raw))
    if not base.is_absolute():
        base = cwd / base
    if "Glob" in names and isinstance(tool_input.get("pattern"), str):
        # Glob(pattern="/etc/**") reaches past its path: judge the fixed prefix (a relative one up to
        # a `..`, which the search never climbs: tools/glob.py's split_literal_prefix). For the
        # working-directory boundary (``boundary``) a relative pattern is not judged at all: it stays
        # below its path (the search enters no symlink either), and Claude Code judges only the path
        pattern = tool_input["pattern"]
        fixed: list[str] = []
        for seg in pattern.split("/") if pattern.startswith("/") or not boundary else ():
            if has_magic(seg) or (seg == ".." and not pattern.startswith("/")):
                break
            fixed.append(seg)
        prefix = "/".join(fixed)
        if pattern.startswith("/"):
            base = Path(prefix or "/")
        elif prefix:
            base = base / prefix
    norm = os.path.normpath(str(base))
    out = [norm]
    try:
        real = os.path.realpath(norm)
    except OSError:
        real = norm
    if real != norm:
        out.append(real)
    return out


def _file_subject(tool: Tool, tool_input: Mapping[str, Any], cwd: Path) -> tuple[str, Access, bool] | None:
    """(absolute path as given, access, whether the whole tree below it is meant) of a file tool's
    call: a search (Grep, Glob) reads its directory and what the pattern's fixed prefix adds."""
    names = _tool_names(tool)
    if names & _SEARCH_TOOLS:
        paths = _subject_paths(tool, tool_input, cwd)
        return (paths[0], "read", True) if paths else None
    raw = next((tool_input[k] for k in ("file_path", "notebook_path", "path")
                if isinstance(tool_input.get(k), str) and tool_input[k]), None)
    if raw is None:
        return None
    path = Path(os.path.expanduser(raw))
    if not path.is_absolute():
        path = cwd / path
    return os.path.normpath(str(path)), ("write" if names & EDIT_TOOLS else "read"), False


def requested(access: Access, path: str, real: str | None = None) -> str:
    """Claude Code's text for a file call nobody approved; ``real``: where ``path``, inside the
    working directories as written, resolves outside them through a symlink."""
    verb = "write to" if access == "write" else "read from"
    text = f"Claude requested permissions to {verb} {path}, but you haven't granted it yet."
    if real is not None:
        text += (f" {path} resolves through a symlink to {real}, which is outside the allowed working "
                 "directories.")
    return text


def _through_link(paths: Sequence[str], dirs: Sequence[Path]) -> str | None:
    """The resolved path when a path written inside ``dirs`` resolves outside them, else None."""
    if len(paths) > 1 and _inside(paths[:1], dirs) and not _inside(paths[1:2], dirs):
        return paths[1]
    return None


def dont_ask_text(tool_name: str) -> str:
    """Claude Code's denial in ``dontAsk`` mode: what the model may and may not do instead."""
    return (f"Permission to use {tool_name} has been denied because Claude Code is running in don't ask mode. "
            "IMPORTANT: You *may* attempt to accomplish this action using other tools that might naturally be "
            "used to accomplish this goal, e.g. using head instead of cat. But you *should not* attempt to work "
            "around this denial in malicious ways, e.g. do not use your ability to run tests to execute "
            "non-test actions. You should only try to work around this restriction in reasonable ways that do "
            "not attempt to bypass the intent behind this denial. If you believe this capability is essential "
            "to complete the user's request, STOP and explain to the user what you were trying to do and why "
            "you need this permission. Let the user decide how to proceed.")


def _inside(paths: Sequence[str], dirs: Sequence[Path]) -> bool:
    def one(p: str) -> bool:
        for d in dirs:
            d_s = os.path.normpath(str(d))
            if p == d_s or p.startswith(d_s.rstrip("/") + "/"):
                return True
        return False

    return bool(paths) and all(one(p) for p in paths)


# ----------------------------------------------------------------------------------------------
# Decisions and the can_use_tool callback

DecidedBy = Literal["rule", "hook", "mode", "callback", "non_interactive", "sandbox"]


@attrs.frozen
class PermissionDecision:
    behavior: Literal["allow", "deny", "ask"]
    reason: str = ""
    rule: PermissionRule | None = None
    decided_by: DecidedBy = "mode"
    updated_input: Mapping[str, Any] | None = None
    # A callback's deny may ask the host to stop the whole run, as the Agent SDK's `interrupt` does.
    interrupt: bool = False
    # ``reason`` is Claude Code's own text for this case: with nobody to ask, the model gets it as is
    bare: bool = False


@attrs.frozen
class ToolPermissionContext(Mapping[str, Any]):
    """What a ``can_use_tool`` callback is told about the call it must answer. Also readable as a
    mapping (``ctx["reason"]``) for callbacks typed against a plain dict context."""

    tool_use_id: str = ""
    permission_mode: str = "default"
    reason: str = ""  # why the call needs approval
    rule: str | None = None  # the ask rule that asked, if any
    cwd: str = ""
    # what Claude Code tells its permission prompt (and the Agent SDK's callback): the updates that
    # would stop the question coming back, the call's subject, and why it asks when it is not the mode
    suggestions: tuple[Mapping[str, Any], ...] = ()
    description: str | None = None
    decision_reason: str | None = None
    blocked_path: str | None = None  # the path outside the working directories a shell command reads

    def __getitem__(self, key: str) -> Any:
        if key not in attrs.fields_dict(type(self)):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(attrs.fields_dict(type(self)))

    def __len__(self) -> int:
        return len(attrs.fields(type(self)))


@attrs.frozen
class PermissionAllow:
    updated_input: Mapping[str, Any] | None = None
    # the Agent SDK's ``updatedPermissions``, in its wire form: applied for the session before the call runs
    updated_permissions: tuple[Mapping[str, Any], ...] = ()


@attrs.frozen
class PermissionDeny:
    message: str = ""
    interrupt: bool = False


CanUseToolResult = PermissionAllow | PermissionDeny | Mapping[str, Any] | bool
CanUseTool = Callable[[str, Mapping[str, Any], ToolPermissionContext],
                      Awaitable[CanUseToolResult] | CanUseToolResult]


def _coerce_answer(value: Any) -> PermissionAllow | PermissionDeny:
    if isinstance(value, PermissionAllow | PermissionDeny):
        return value
    if isinstance(value, bool):
        return PermissionAllow() if value else PermissionDeny()
    if isinstance(value, Mapping):
        behavior = value.get("behavior")
        if behavior == "allow":
            ui = value.get("updatedInput", value.get("updated_input"))
            return PermissionAllow(ui if isinstance(ui, Mapping) else None)
        if behavior == "deny":
            return PermissionDeny(str(value.get("message", "")), bool(value.get("interrupt", False)))
    raise TypeError(f"can_use_tool must return PermissionAllow, PermissionDeny, a "
                    f"{{'behavior': 'allow'|'deny'}} dict or a bool, not {value!r}")


def _as_rules(items: Iterable[str | PermissionRule], behavior: RuleBehavior,
              source: str) -> list[PermissionRule]:
    out: list[PermissionRule] = []
    for item in items:
        if isinstance(item, PermissionRule):
            out.append(item if item.behavior == behavior else attrs.evolve(item, behavior=behavior))
        else:
            out.extend(PermissionRule.parse(t, behavior, source) for t in split_tool_list(item))
    return out


def dedup_rules(rules: Iterable[PermissionRule]) -> tuple[PermissionRule, ...]:
    """The rules in order, each once (the same rule from two sources is one rule)."""
    seen: set[tuple[str, str | None, Path | None]] = set()
    out = []
    for r in rules:
        key = r.identity()
        if key not in seen:
            seen.add(key)
            out.append(r)
    return tuple(out)


@attrs.define
class PermissionPolicy:
    """Rules + mode for one session. Build with :meth:`build` (or :meth:`from_settings`)."""

    cwd: Path
    mode: str = "default"
    allow: list[PermissionRule] = attrs.field(factory=list)
    ask: list[PermissionRule] = attrs.field(factory=list)
    deny: list[PermissionRule] = attrs.field(factory=list)
    additional_directories: list[Path] = attrs.field(factory=list)
    # `sandbox.autoAllowBashIfSandboxed`: a Bash call the mode would ask about is allowed when this
    # says it will run in the sandbox (set by agentfsm.hooks.sandbox; deny and ask rules still apply)
    sandbox_auto_allow: Callable[[Tool, Mapping[str, Any]], bool] | None = None

    @classmethod
    def build(cls, cwd: str | Path, *, mode: str | None = None,
              allow: Iterable[str | PermissionRule] = (), ask: Iterable[str | PermissionRule] = (),
              deny: Iterable[str | PermissionRule] = (), allowed_tools: str | Iterable[str] = (),
              disallowed_tools: str | Iterable[str] = (),
              additional_directories: Iterable[str | Path] = ()) -> PermissionPolicy:
        """``allowed_tools``/``disallowed_tools`` are the CLI lists (``--allowedTools``), merged
        into allow/deny."""
        cwd_p = Path(cwd).resolve()
        if isinstance(allowed_tools, str):
            allowed_tools = [allowed_tools]
        if isinstance(disallowed_tools, str):
            disallowed_tools = [disallowed_tools]
        return cls(
            cwd=cwd_p,
            mode=normalize_mode(mode),
            allow=dedup_rules([*_as_rules(allow, "allow", "settings"), *_as_rules(allowed_tools, "allow", "cli")]),
            ask=dedup_rules(_as_rules(ask, "ask", "settings")),
            deny=dedup_rules([*_as_rules(deny, "deny", "settings"), *_as_rules(disallowed_tools, "deny", "cli")]),
            additional_directories=[(cwd_p / Path(d).expanduser()).resolve() for d in additional_directories],
        )

    @classmethod
    def from_settings(cls, settings: Any, cwd: str | Path, *, mode: str | None = None,
                      allowed_tools: str | Iterable[str] = (),
                      disallowed_tools: str | Iterable[str] = ()) -> PermissionPolicy:
        """From a :class:`agentfsm.hooks.config.Settings`; an explicit ``mode`` beats ``defaultMode``."""
        perms = settings.permissions
        effective = normalize_mode(mode if mode is not None else perms.default_mode)
        if effective == "bypassPermissions" and perms.disable_bypass_mode:
            raise ValueError("permission mode bypassPermissions is disabled by settings "
                             "(permissions.disableBypassPermissionsMode = \"disable\")")
        return cls.build(
            cwd, mode=mode if mode is not None else perms.default_mode, allow=perms.allow, ask=perms.ask,
            deny=perms.deny, allowed_tools=allowed_tools, disallowed_tools=disallowed_tools,
            additional_directories=perms.additional_directories,
        )

    # -- queries --------------------------------------------------------------------------------

    def deny_rule_for(self, tool: Tool, tool_input: Mapping[str, Any]) -> PermissionRule | None:
        decision = self.rule_decision(tool, tool_input, "deny")
        return decision.rule if decision is not None else None

    def ask_rule_for(self, tool: Tool, tool_input: Mapping[str, Any]) -> PermissionRule | None:
        decision = self.rule_decision(tool, tool_input, "ask")
        return decision.rule if decision is not None else None

    def rule_decision(self, tool: Tool, tool_input: Mapping[str, Any],
                      behavior: Literal["deny", "ask"]) -> PermissionDecision | None:
        """The first deny (or ask) rule that applies to the call, as a decision with the text the
        model sees. Bash is judged on the analysis of its command, file tools on their paths in
        every spelling (:mod:`agentfsm.hooks.file_access`), everything else on its subject."""
        rules = self.deny if behavior == "deny" else self.ask
        if not rules:
            return None
        try:
            return self._rule_decision(tool, tool_input, rules, behavior)
        except Exception as exc:
            # Fail closed: a call that could not be judged (a tool's permission_subject raised, a
            # path could not be read) counts as hit by the first rule that could apply to it.
            rule = next((r for r in rules if _may_apply(r, tool)), None)
            if rule is None:
                return None
            log.warning("permission.unjudged", tool=tool.name, rule=str(rule), error=repr(exc))
            return self._decision(behavior, rule, unjudged_text(tool, exc))

    def _rule_decision(self, tool: Tool, tool_input: Mapping[str, Any], rules: Sequence[PermissionRule],
                       behavior: Literal["deny", "ask"]) -> PermissionDecision | None:
        names = _tool_names(tool)
        if "Bash" in names:
            command = tool_input.get("command")
            if isinstance(command, str):
                return self._bash_decision(tool, command, rules, behavior)
        elif names & (READ_TOOLS | EDIT_TOOLS):
            decision = self._file_decision(tool, tool_input, rules, behavior)
            if decision is not None:
                return decision
        for r in rules:
            if _rule_hits(r, tool, tool_input, self.cwd, strict=False):
                return self._decision(behavior, r, f"Permission to use {tool.name} has been denied.")
        return None

    def _decision(self, behavior: Literal["deny", "ask"], rule: PermissionRule, text: str,
                  asked: str | None = None) -> PermissionDecision:
        if behavior == "ask":
            if asked is not None:
                return PermissionDecision("ask", asked, rule, "rule", bare=True)
            return PermissionDecision("ask", f"Rule {rule} ({rule.source}) requires approval.", rule, "rule")
        return PermissionDecision("deny", text, rule, "rule")

    def _bash_decision(self, tool: Tool, command: str, rules: Sequence[PermissionRule],
                       behavior: Literal["deny", "ask"]) -> PermissionDecision | None:
        analysis = analyse(command, str(self.cwd))
        for r in rules:
            if not r.names_tool(tool):
                continue
            match = Match(True) if r.specifier is None else program_rule(r.specifier, command, analysis)
            if match is not None:
                return self._decision(behavior, r, denied_text(command, match))
        read = [r for r in rules if r.specifier is not None and r.tool in BASH_READ_RULES]
        write = [r for r in rules if r.specifier is not None and r.tool in EDIT_TOOLS]
        found = file_rule(analysis, PathChecker(self.cwd, read), PathChecker(self.cwd, write))
        if found is None:
            return None
        denial, match = found
        candidates = [*read, *write]
        rule = next((r for r in candidates if denial is not None and str(r) == denial.rule), None)
        if rule is None:
            rule = (read or write)[0] if not match.definite or denial is None else candidates[0]
        return self._decision(behavior, rule, denied_text(command, match))

    def _file_decision(self, tool: Tool, tool_input: Mapping[str, Any], rules: Sequence[PermissionRule],
                       behavior: Literal["deny", "ask"]) -> PermissionDecision | None:
        names = _tool_names(tool)
        covering = [r for r in rules if r.specifier is not None and r.tool in _PATH_FAMILIES
                    and names & _PATH_FAMILIES[r.tool]]
        if not covering:
            return None
        subject = _file_subject(tool, tool_input, self.cwd)
        if subject is None:
            return None
        path, access, tree = subject
        checker = PathChecker(self.cwd, covering)
        found = checker.check_tree(path) if tree else checker.check(path)
        if found is None:
            return None
        rule = next((r for r in covering if str(r) == found.rule), covering[0])
        return self._decision(behavior, rule, found.message(access, search=tree),
                              asked=requested(access, path))

    def file_access(self) -> PolicyFileAccess:
        """The file-access policy tools ask (:class:`agentfsm.tools.base.FileAccess`): ``Read(...)``
        deny rules on reading, ``Edit(...)`` deny rules on writing. One per tool call."""
        return PolicyFileAccess(
            self.cwd, read=[r for r in self.deny if r.specifier is not None and r.tool == "Read"],
            write=[r for r in self.deny if r.specifier is not None and r.tool == "Edit"])

    def allow_rule_for(self, tool: Tool, tool_input: Mapping[str, Any]) -> PermissionRule | None:
        """The allow rule that pre-approves the call. A compound Bash command is approved when each
        of its parts is approved by some allow rule (the first such rule is reported). A call that
        cannot be judged is approved by none."""
        try:
            return self._allow_rule_for(tool, tool_input)
        except Exception as exc:
            log.warning("permission.unjudged", tool=tool.name, rule="allow", error=repr(exc))
            return None

    def _allow_rule_for(self, tool: Tool, tool_input: Mapping[str, Any]) -> PermissionRule | None:
        whole = next((r for r in self.allow if r.specifier is None and r.names_tool(tool)), None)
        if whole is not None:
            return whole
        if "Bash" in _tool_names(tool):
            command = tool_input.get("command")
            specs = [r for r in self.allow if r.specifier is not None and r.names_tool(tool)]
            if not isinstance(command, str) or not specs:
                return None
            analysis = analyse(command, str(self.cwd))
            if not parts_allowed([r.specifier or "" for r in specs], command, analysis):
                return None
            # Report the rule that approved the first part: the one a reader will look for.
            if any((r.specifier or "").strip() == command.strip() for r in specs):
                first = command
            else:
                first = next((c.text for c in analysis.commands if c.part and c.text), command)
            return next((r for r in specs if spec_matches(r.specifier or "", first)), specs[0])
        return next((r for r in self.allow if _rule_hits(r, tool, tool_input, self.cwd, strict=True)), None)

    def visible_tools(self, names: Iterable[str]) -> list[str]:
        """Drop the tools a bare deny rule forbids outright: the model should not see them."""
        return [n for n in names if not any(r.covers_whole_tool(n) for r in self.deny)]

    def _is_read_only(self, tool: Tool, tool_input: Mapping[str, Any]) -> bool:
        try:
            return bool(tool.is_read_only(tool_input))
        except Exception:
            return False  # a classifier that fails cannot vouch for the call

    def reads_outside(self, tool: Tool, tool_input: Mapping[str, Any]) -> bool:
        """The call reads a path outside the working directories (see :meth:`outside_read`)."""
        return self.outside_read(tool, tool_input) is not None

    def outside_read(self, tool: Tool, tool_input: Mapping[str, Any]) -> str | None:
        """The first path outside the working directories that a file-reading tool (Read, Grep, Glob,
        ...) or a shell command reads, or None. A shell path the analysis cannot name is not judged
        here (a command that reads such paths is not read-only to begin with)."""
        names = _tool_names(tool)
        if "Bash" in names:
            found = self.bash_outside(tool, tool_input)
            if found is not None:
                return found.path or "?"
            command = tool_input.get("command")
            if not isinstance(command, str) or "\r" in command:
                return None
            for use in analyse(command, str(self.cwd)).paths:
                if use.access != "read" or use.path is None:
                    continue
                try:
                    real = os.path.realpath(use.path)
                except (OSError, ValueError):
                    real = use.path
                if not _inside(sorted({os.path.normpath(use.path), real}), self.working_dirs):
                    return use.path
            return None
        if not names & READ_TOOLS:
            return None
        try:
            paths = _subject_paths(tool, tool_input, self.cwd, boundary=True)
        except ValueError:  # a path the OS cannot take (a NUL byte): judged as written
            raw = next((tool_input[k] for k in ("file_path", "notebook_path", "path")
                        if isinstance(tool_input.get(k), str) and tool_input[k]), "")
            paths = [os.path.normpath(os.path.join(self.cwd, os.path.expanduser(raw)))] if raw else []
        return paths[0] if paths and not _inside(paths, self.working_dirs) else None

    def bash_outside(self, tool: Tool, tool_input: Mapping[str, Any]) -> bash_boundary.Outside | None:
        """Where a shell command reads, lists or changes into a place outside the working directories
        (:mod:`agentfsm.hooks.bash_boundary`) that no Read allow rule covers, or None. A command line
        that holds a carriage return is outside (what its words are is unsure)."""
        command = tool_input.get("command")
        if "Bash" not in _tool_names(tool) or not isinstance(command, str):
            return None
        if "\r" in command:
            return bash_boundary.Outside(None, None, None)
        return bash_boundary.outside(analyse(command, str(self.cwd)), self.cwd, self.working_dirs,
                                     covered=self._read_allowed)

    def _read_allowed(self, path: str) -> bool:
        """A Read allow rule covers ``path``, as written and resolved (it is then readable outside)."""
        rules = [r for r in self.allow if r.tool == "Read" and r.specifier is not None]
        if not rules:
            return False
        names = {os.path.normpath(path), os.path.realpath(path)}
        return all(any(path_rule_matches(r.specifier or "", n, self.cwd, r.root) for r in rules) for n in names)

    def _bash_ask_text(self, tool: Tool, command: str) -> str:
        """Claude Code's text for a shell command that needs approval: an output redirection first,
        then a place outside the working directories it reads, lists or changes into, then what it
        writes, else that it cannot be classified; what a part of a pipeline needs is said of that
        part."""
        analysis = analyse(command, str(self.cwd))
        specs = [r.specifier for r in self.allow if r.specifier is not None and r.names_tool(tool)]
        # the parts an allow rule approves are not what needs approval: name another
        allowed = {c.program for c in analysis.commands if c.program and c.text
                   and any(spec_matches(sp, c.text) for sp in specs)}
        text = approval_text(analysis, self.working_dirs, allowed, redirections_only=True)
        if text != UNCLASSIFIED:
            return text
        found = bash_boundary.outside(analysis, self.cwd, self.working_dirs, covered=self._read_allowed)
        if found is not None:
            part = found.command
        else:
            text = approval_text(analysis, self.working_dirs, allowed)
            named = text.split(" in '", 1)[0] if " in '" in text else None
            part = next((c for c in analysis.commands if named and c.program == named and c.pipeline), None)
            if text == UNCLASSIFIED:
                # a part of a pipeline that is not read-only (`cat a | python3 -c …`) is what needs approval
                part = next((c for c in analysis.commands if c.pipeline and c.part and not segment_read_only(c.argv)),
                            None)
        if part is not None and part.pipeline and part.text:
            return ("This Bash command contains multiple operations. The following part requires approval: "
                    f"{part.text}")
        return found.text(self.working_dirs) if found is not None else text

    def _read_only_outside(self, tool: Tool, tool_input: Mapping[str, Any]) -> str | None:
        """Claude Code's text for a read-only call that reaches outside the working directories, or
        None: a shell command by its boundary text, a file tool by the path it reads."""
        if "Bash" in _tool_names(tool):
            found = self.bash_outside(tool, tool_input)
            if found is not None:
                return self._bash_ask_text(tool, str(tool_input.get("command")))
            # a read the table does not place (a program run in a directory: `git -C ../x log`)
            command = tool_input.get("command")
            for use in analyse(str(command), str(self.cwd)).reads():
                placed = use.why.split()[0] in bash_boundary.REACH and not use.why.endswith("runs in this directory")
                if not placed and (use.path is None or not bash_boundary.inside(use.path, self.working_dirs)):
                    return bash_boundary.UNCLASSIFIED
            return None
        outside = self.outside_read(tool, tool_input)
        if outside is None:
            return None
        try:
            real = _through_link(_subject_paths(tool, tool_input, self.cwd, boundary=True), self.working_dirs)
        except ValueError:
            real = None
        return requested("read", outside, real)

    def _edit_inside_workspace(self, tool: Tool, tool_input: Mapping[str, Any]) -> bool:
        if not _tool_names(tool) & EDIT_TOOLS:
            return False
        return _inside(_subject_paths(tool, tool_input, self.cwd), [self.cwd, *self.additional_directories])

    # -- evaluation -----------------------------------------------------------------------------

    def evaluate(self, tool: Tool, tool_input: Mapping[str, Any], *,
                 hook_decision: str | None = None, hook_reason: str = "") -> PermissionDecision:
        """Rules, hook decision and mode (steps 1–7 of the module doc, plus dontAsk). The result
        may be ``ask``; :meth:`decide` resolves that. Whatever raises while judging denies: no
        failure of the check may end in an allow (or in no answer at all)."""
        try:
            return self._evaluate(tool, tool_input, hook_decision, hook_reason)
        except Exception as exc:
            log.warning("permission.unjudged", tool=tool.name, error=repr(exc))
            return PermissionDecision("deny", unjudged_text(tool, exc), None, "rule")

    def _evaluate(self, tool: Tool, tool_input: Mapping[str, Any], hook_decision: str | None,
                  hook_reason: str) -> PermissionDecision:
        denied = self.rule_decision(tool, tool_input, "deny")
        if denied is not None:
            return denied
        if hook_decision == "deny":
            # Claude Code's form: the hook event and tool, then the hook's reason
            return PermissionDecision("deny", f"PreToolUse:{tool.name} hook error: "
                                      + (hook_reason or "denied by a PreToolUse hook"), None, "hook")
        read_only = self._is_read_only(tool, tool_input)
        if self.mode == "plan" and not read_only:
            # Claude Code asks the permission prompt (the SDK's can_use_tool); nobody to ask denies with this text
            return PermissionDecision("ask", self._plan_text(tool, tool_input), None, "mode", bare=True)
        decision = self._evaluate_open(tool, tool_input, read_only, hook_decision, hook_reason)
        if decision.behavior == "ask" and self.mode == "dontAsk":
            return PermissionDecision("deny", dont_ask_text(tool.name), decision.rule, "mode")
        return decision

    def _plan_text(self, tool: Tool, tool_input: Mapping[str, Any]) -> str:
        """Claude Code's plan-mode texts: a file write names its path, a shell command says what it
        would change (as in the default mode); anything else says plan mode is read-only."""
        names = _tool_names(tool)
        paths = _subject_paths(tool, tool_input, self.cwd) if names & EDIT_TOOLS else []
        if paths:
            return f"Cannot write to {paths[0]} while in plan mode."
        if "Bash" in names and isinstance(tool_input.get("command"), str):
            return self._bash_ask_text(tool, tool_input["command"])
        return f"{tool.name} is not available in plan mode: only read-only tools may run until the plan is approved."

    @property
    def working_dirs(self) -> list[Path]:
        return [self.cwd, *self.additional_directories]

    def _mode_ask(self, tool: Tool, tool_input: Mapping[str, Any]) -> PermissionDecision:
        """An ``ask`` from the permission mode, with Claude Code's text saying what needs approval."""
        names = _tool_names(tool)
        paths = _subject_paths(tool, tool_input, self.cwd) if names & EDIT_TOOLS else []
        if paths:
            return PermissionDecision("ask", requested("write", paths[0], _through_link(paths, self.working_dirs)),
                                      None, "mode", bare=True)
        if "Bash" in names and isinstance(tool_input.get("command"), str):
            return PermissionDecision("ask", self._bash_ask_text(tool, tool_input["command"]), None, "mode",
                                      bare=True)
        return PermissionDecision("ask", f"{tool.name} needs approval in permission mode {self.mode}.",
                                  None, "mode")

    def _bash_edits_inside(self, tool: Tool, tool_input: Mapping[str, Any]) -> bool:
        command = tool_input.get("command")
        if "Bash" not in _tool_names(tool) or not isinstance(command, str) or "\r" in command:
            return False
        analysis = analyse(command, str(self.cwd))
        # what it reads must be inside too: `cp ../out/key here` copies a file from outside in
        return (edits_inside(analysis, self.working_dirs)
                and bash_boundary.outside(analysis, self.cwd, self.working_dirs) is None
                and all(u.path is not None and bash_boundary.inside(u.path, self.working_dirs)
                        for u in analysis.paths if u.access == "read"))

    def _evaluate_open(self, tool: Tool, tool_input: Mapping[str, Any], read_only: bool,
                       hook_decision: str | None, hook_reason: str) -> PermissionDecision:
        asked = self.rule_decision(tool, tool_input, "ask")
        if asked is not None:
            return asked
        if hook_decision in ("ask", "defer"):
            # a hook's own reason is what the model gets when nobody can answer (Claude Code)
            return PermissionDecision("ask", hook_reason or "A PreToolUse hook asked for approval.",
                                      None, "hook", bare=bool(hook_reason))
        if hook_decision == "allow":
            return PermissionDecision("allow", hook_reason, None, "hook")
        found = self.bash_outside(tool, tool_input) if self.mode != "bypassPermissions" else None
        if found is not None and found.path is not None:
            # a place outside the working directories asks even when a Bash allow rule names the
            # program (`Bash(cat:*)` is not `cat` anywhere): Claude Code. (A place not known before
            # the command runs is left to the rules: `git diff $(git status)` as they approve it.)
            return PermissionDecision("ask", self._bash_ask_text(tool, str(tool_input.get("command"))), None,
                                      "mode", bare=True)
        rule = self.allow_rule_for(tool, tool_input)
        if rule is not None:
            return PermissionDecision("allow", "", rule, "rule")
        if self.mode == "bypassPermissions":
            return PermissionDecision("allow", "", None, "mode")
        if self.mode == "acceptEdits" and self._edit_inside_workspace(tool, tool_input):
            return PermissionDecision("allow", "", None, "mode")
        if read_only:
            # a read outside the working directories asks, in every mode but bypass, whether a file
            # tool or a read-only shell command makes it (Claude Code)
            outside = self._read_only_outside(tool, tool_input)
            if outside is None:
                return PermissionDecision("allow", "", None, "mode")
            return PermissionDecision("ask", outside, None, "mode", bare=True)
        if self.mode == "acceptEdits" and self._bash_edits_inside(tool, tool_input):
            # a shell command whose only effect is on files inside the working directories
            return PermissionDecision("allow", "", None, "mode")
        if self.sandbox_auto_allow is not None and self.sandbox_auto_allow(tool, tool_input):
            return PermissionDecision("allow", "", None, "sandbox")
        return self._mode_ask(tool, tool_input)

    async def evaluate_off_loop(self, tool: Tool, tool_input: Mapping[str, Any], *,
                                hook_decision: str | None = None, hook_reason: str = "") -> PermissionDecision:
        """:meth:`evaluate`, in a worker thread for Bash (see :meth:`decide`)."""
        if "Bash" not in _tool_names(tool):
            return self.evaluate(tool, tool_input, hook_decision=hook_decision, hook_reason=hook_reason)
        work = asyncio.to_thread(self.evaluate, tool, tool_input, hook_decision=hook_decision,
                                 hook_reason=hook_reason)
        try:
            return await asyncio.wait_for(work, CHECK_BUDGET_S)
        except TimeoutError:
            return PermissionDecision("deny", f"Permission to use {tool.name} has been denied: the command "
                                              f"could not be checked within {CHECK_BUDGET_S:g}s.", None, "rule")

    async def decide(self, tool: Tool, tool_input: Mapping[str, Any], *, hook_decision: str | None = None,
                     hook_reason: str = "", can_use_tool: CanUseTool | None = None,
                     tool_use_id: str = "") -> PermissionDecision:
        """The final allow/deny: :meth:`evaluate`, then the callback for an ``ask``. A Bash command
        is judged in a worker thread (parsing it and looking at the files it names is linear in its
        length, but a long one would still stall every other session on the event loop), within
        :data:`CHECK_BUDGET_S`; a check that does not finish in time denies."""
        decision = await self.evaluate_off_loop(tool, tool_input, hook_decision=hook_decision,
                                                hook_reason=hook_reason)
        if decision.behavior != "ask":
            return decision
        if can_use_tool is None and decision.bare:
            log.info("permission.not_granted", tool=tool.name, reason=decision.reason,
                     hint="non-interactive: allow it with --allowedTools, a permissions.allow rule in "
                          "settings, or another --permission-mode")
            return attrs.evolve(decision, behavior="deny", decided_by="non_interactive")
        if can_use_tool is None:
            return PermissionDecision(
                "deny",
                f"Permission to use {tool.name} was not granted: {decision.reason} This run is "
                "non-interactive, so nobody can approve the call; allow it with --allowedTools, a "
                "permissions.allow rule in settings, or another --permission-mode.",
                decision.rule, "non_interactive")
        from agentfsm.hooks.permission_prompt import prompt_context

        ctx = ToolPermissionContext(tool_use_id=tool_use_id, permission_mode=self.mode,
                                    reason=decision.reason, cwd=str(self.cwd),
                                    rule=str(decision.rule) if decision.rule else None,
                                    **prompt_context(self, tool, tool_input, decision, hook_reason))
        try:
            value = can_use_tool(tool.name, dict(tool_input), ctx)
            if inspect.isawaitable(value):
                value = await value
            answer = _coerce_answer(value)
        except Exception as exc:
            return PermissionDecision("deny", f"Permission to use {tool.name} was denied: the "
                                              f"can_use_tool callback failed ({type(exc).__name__}: {exc}).",
                                      None, "callback")
        if isinstance(answer, PermissionDeny):
            return PermissionDecision("deny", answer.message or f"Permission to use {tool.name} was denied.",
                                      None, "callback", interrupt=answer.interrupt)
        if answer.updated_permissions:
            from agentfsm.hooks.permission_prompt import apply_updates

            apply_updates(self, answer.updated_permissions)
        if answer.updated_input is not None:
            # The approved input is what will run, so deny rules are judged on it once more.
            denied = await asyncio.to_thread(self.rule_decision, tool, answer.updated_input, "deny")
            if denied is not None:
                return denied
        return PermissionDecision("allow", "", None, "callback", updated_input=answer.updated_input)
