"""Settings loading, Claude Code compatible (docs/behaviour.md §5, §10).

Sources, low to high precedence: ``~/.claude/settings.json`` (userSettings) <
``<cwd>/.claude/settings.json`` (projectSettings) < ``<cwd>/.claude/settings.local.json``
(localSettings) < ``--settings FILE|JSON`` (flagSettings). Scalars from a higher source win; hook
lists are concatenated (every source's hooks run) and permission rule lists are merged.

A settings file that is not valid JSON or does not have the structure of ``settings.schema.json``
raises :class:`SettingsError` (a ValueError) naming the file, the JSON path in it and what is
expected there, before any hook runs, rather than failing half-way through a session.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.hooks import settings_schema
from agentfsm.hooks.inputs import FOREIGN_EVENTS, HOOK_EVENTS
from agentfsm.hooks.permissions import PermissionRule, RuleBehavior, dedup_rules, normalize_mode
from agentfsm.hooks.runner import DEFAULT_COMMAND_TIMEOUT_S, CommandHook, HookMatcher, compile_matcher
from agentfsm.hooks.settings_schema import json_path

log = fsm_log.get_logger("agentfsm.hooks.config")

# Handler types Claude Code accepts that this loop does not run; a settings file using them must
# still load (they are valid configuration), so they are skipped with a warning.
_UNSUPPORTED_HANDLER_TYPES = frozenset({"prompt", "agent", "http", "mcp_tool"})


class SettingsError(ValueError):
    """A settings source is unreadable or malformed. ``source`` names the file (or ``--settings``)."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


@attrs.frozen
class PermissionSettings:
    allow: tuple[PermissionRule, ...] = ()
    ask: tuple[PermissionRule, ...] = ()
    deny: tuple[PermissionRule, ...] = ()
    default_mode: str | None = None
    additional_directories: tuple[Path, ...] = ()
    disable_bypass_mode: bool = False


@attrs.frozen
class SandboxPath:
    """A path a ``sandbox.filesystem`` key names, with the project directory of its settings file
    (the base of a ``/path`` entry, as for permission rules)."""

    spec: str
    root: Path


@attrs.frozen
class SandboxSettings:
    """The ``sandbox`` settings (Claude Code's keys, same meaning; see docs/sandbox.md). ``None``
    means "not set by any source": :mod:`agentfsm.hooks.sandbox` applies the defaults."""

    enabled: bool | None = None
    fail_if_unavailable: bool | None = None
    auto_allow_bash: bool | None = None
    allow_unsandboxed: bool | None = None
    excluded_commands: tuple[str, ...] = ()
    allow_write: tuple[SandboxPath, ...] = ()
    deny_write: tuple[SandboxPath, ...] = ()
    deny_read: tuple[SandboxPath, ...] = ()
    # network: None = no network key set (the network is shared); a tuple = only these domains
    allowed_domains: tuple[str, ...] | None = None
    denied_domains: tuple[str, ...] = ()
    allow_local_binding: bool | None = None


@attrs.frozen
class Settings:
    """Merged settings. ``raw`` keeps every key (merged the same way) for the parts of the program
    that read settings this package does not interpret (``env``, ``model``, ...)."""

    hooks: Mapping[str, tuple[HookMatcher, ...]] = attrs.field(factory=dict)
    permissions: PermissionSettings = attrs.field(factory=PermissionSettings)
    sources: tuple[str, ...] = ()
    raw: Mapping[str, Any] = attrs.field(factory=dict)
    disable_all_hooks: bool = False
    sandbox: SandboxSettings = attrs.field(factory=SandboxSettings)

    def active_hooks(self) -> Mapping[str, tuple[HookMatcher, ...]]:
        """The hooks to run: none at all when ``disableAllHooks`` is set."""
        return {} if self.disable_all_hooks else self.hooks


# ----------------------------------------------------------------------------------------------
# One source
#
# The structure (which keys, which types) is checked against hooks/settings.schema.json first, so
# the code below reads values it knows the shape of; what a schema cannot say (a matcher is a valid
# regular expression, a rule parses, a mode's alias) is checked here, with the same kind of message.


def _parse_handler(source: str, h: Mapping[str, Any]) -> CommandHook | None:
    if h["type"] in _UNSUPPORTED_HANDLER_TYPES:
        log.warning("hook_handler_unsupported", source=source, type=h["type"])
        return None
    return CommandHook(command=h.get("command"), args=h.get("args"),
                       timeout=float(h.get("timeout", DEFAULT_COMMAND_TIMEOUT_S)), source=source)


def _parse_hooks(source: str, hooks: Mapping[str, Any]) -> dict[str, tuple[HookMatcher, ...]]:
    out: dict[str, tuple[HookMatcher, ...]] = {}
    for event, entries in hooks.items():
        known = event in HOOK_EVENTS
        if event in FOREIGN_EVENTS:
            log.debug("hook_event_ignored", source=source, hook_event=event, detail="not fired by agentfsm")
        elif not known:
            # Forward compatibility: a settings file written for a newer Claude Code must still load,
            # but a typo such as "PreToolUs" should not go unnoticed either.
            log.warning("hook_event_ignored", source=source, hook_event=event, detail="unknown event name",
                        known=list(HOOK_EVENTS))
        matchers: list[HookMatcher] = []
        for i, entry in enumerate(entries):
            matcher = entry.get("matcher")
            try:
                compile_matcher(matcher)
            except ValueError as exc:
                raise SettingsError(source, f"{json_path(('hooks', event, i, 'matcher'))}: {exc}") from None
            commands = [c for c in map(functools.partial(_parse_handler, source), entry["hooks"])
                        if c is not None]
            if known and commands:
                matchers.append(HookMatcher(matcher=matcher, hooks=commands, source=source))
        if known and matchers:
            out[event] = tuple(matchers)
    return out


def _parse_permissions(source: str, perms: Mapping[str, Any], root: Path) -> PermissionSettings:
    lists: dict[str, tuple[PermissionRule, ...]] = {}
    behavior: RuleBehavior
    for behavior in ("allow", "ask", "deny"):
        rules = []
        for i, text in enumerate(perms.get(behavior, [])):
            try:
                rules.append(PermissionRule.parse(text, behavior, source, root))
            except ValueError as exc:
                raise SettingsError(source, f"{json_path(('permissions', behavior, i))}: {exc}") from None
        lists[behavior] = tuple(rules)
    mode = perms.get("defaultMode")
    if mode is not None:
        mode = normalize_mode(mode)  # the schema holds the same names; this maps the alias
    return PermissionSettings(
        allow=lists["allow"], ask=lists["ask"], deny=lists["deny"], default_mode=mode,
        additional_directories=tuple((root / Path(d).expanduser()).resolve()
                                     for d in perms.get("additionalDirectories", [])),
        disable_bypass_mode=perms.get("disableBypassPermissionsMode") == "disable",
    )


_SANDBOX_BOOLS = {"enabled": "enabled", "failIfUnavailable": "fail_if_unavailable",
                  "autoAllowBashIfSandboxed": "auto_allow_bash", "allowUnsandboxedCommands": "allow_unsandboxed"}
_FS_LISTS = {"allowWrite": "allow_write", "denyWrite": "deny_write", "denyRead": "deny_read"}


def _parse_sandbox(data: Mapping[str, Any], root: Path) -> SandboxSettings:
    fields: dict[str, Any] = {_SANDBOX_BOOLS[k]: v for k, v in data.items() if k in _SANDBOX_BOOLS}
    if "excludedCommands" in data:
        fields["excluded_commands"] = tuple(data["excludedCommands"])
    filesystem = data.get("filesystem", {})
    for key, name in _FS_LISTS.items():
        if key in filesystem:
            fields[name] = tuple(SandboxPath(s, root) for s in filesystem[key])
    network = data.get("network", {})
    if "allowedDomains" in network:
        fields["allowed_domains"] = tuple(network["allowedDomains"] or ())
    if "deniedDomains" in network:
        fields["denied_domains"] = tuple(network["deniedDomains"] or ())
    if "allowLocalBinding" in network:
        fields["allow_local_binding"] = network["allowLocalBinding"]
    return SandboxSettings(**fields)


def _merge_sandbox(low: SandboxSettings, high: SandboxSettings) -> SandboxSettings:
    """Scalars from the higher source win; lists add up (every source's paths and commands count)."""
    def pick(name: str) -> Any:
        value = getattr(high, name)
        return value if value is not None else getattr(low, name)

    domains = (None if low.allowed_domains is None and high.allowed_domains is None
               else (*(low.allowed_domains or ()), *(high.allowed_domains or ())))
    return SandboxSettings(
        enabled=pick("enabled"), fail_if_unavailable=pick("fail_if_unavailable"),
        auto_allow_bash=pick("auto_allow_bash"), allow_unsandboxed=pick("allow_unsandboxed"),
        excluded_commands=(*low.excluded_commands, *high.excluded_commands),
        allow_write=(*low.allow_write, *high.allow_write), deny_write=(*low.deny_write, *high.deny_write),
        deny_read=(*low.deny_read, *high.deny_read), allowed_domains=domains,
        denied_domains=(*low.denied_domains, *high.denied_domains),
        allow_local_binding=pick("allow_local_binding"))


def parse_settings(data: Any, *, source: str, root: str | Path) -> Settings:
    """Validate one settings object. ``root`` is the project directory of the source: the base of
    ``/path`` permission rules and of relative ``additionalDirectories``."""
    root_p = Path(root)
    try:
        found = settings_schema.problem(data)
    except settings_schema.SchemaUnavailable as exc:
        raise SettingsError(source, str(exc)) from None
    if found is not None:
        raise SettingsError(source, found[1])
    for event, where, detail in settings_schema.annotations(data):
        # forward compatibility: a key written for a newer Claude Code still loads, and a typo does not
        # go unnoticed (for the sandbox, its defaults are the strict ones)
        log.warning(event, source=source, key=json_path(where), detail=detail)
    hooks = _parse_hooks(source, data["hooks"]) if "hooks" in data else {}
    perms = (_parse_permissions(source, data["permissions"], root_p) if "permissions" in data
             else PermissionSettings())
    sandbox = _parse_sandbox(data["sandbox"], root_p) if "sandbox" in data else SandboxSettings()
    return Settings(hooks=hooks, permissions=perms, sources=(source,), raw=dict(data),
                    disable_all_hooks=data.get("disableAllHooks", False), sandbox=sandbox)


# ----------------------------------------------------------------------------------------------
# Merging and loading

def _deep_merge(low: Any, high: Any) -> Any:
    if isinstance(low, Mapping) and isinstance(high, Mapping):
        out = dict(low)
        for k, v in high.items():
            out[k] = _deep_merge(out[k], v) if k in out else v
        return out
    if isinstance(low, list) and isinstance(high, list):
        merged = list(low)
        for item in high:
            if not (isinstance(item, str) and item in merged):
                merged.append(item)
        return merged
    return high


def merge_settings(layers: Sequence[Settings]) -> Settings:
    """Merge sources given low to high precedence."""
    hooks: dict[str, list[HookMatcher]] = {}
    allow: list[PermissionRule] = []
    ask: list[PermissionRule] = []
    deny: list[PermissionRule] = []
    dirs: list[Path] = []
    mode: str | None = None
    disable_bypass = False
    raw: Any = {}
    disable_all: bool = False
    sandbox = SandboxSettings()
    for layer in layers:
        sandbox = _merge_sandbox(sandbox, layer.sandbox)
        for event, matchers in layer.hooks.items():
            hooks.setdefault(event, []).extend(matchers)
        p = layer.permissions
        allow.extend(p.allow)
        ask.extend(p.ask)
        deny.extend(p.deny)
        dirs.extend(d for d in p.additional_directories if d not in dirs)
        mode = p.default_mode if p.default_mode is not None else mode
        # Disabling bypass mode is a lock: any source may set it, none can lift it.
        disable_bypass = disable_bypass or p.disable_bypass_mode
        if "disableAllHooks" in layer.raw:
            disable_all = layer.disable_all_hooks
        raw = _deep_merge(raw, layer.raw)
    return Settings(
        hooks={e: tuple(m) for e, m in hooks.items()},
        permissions=PermissionSettings(dedup_rules(allow), dedup_rules(ask), dedup_rules(deny), mode,
                                       tuple(dirs), disable_bypass),
        sources=tuple(s for layer in layers for s in layer.sources),
        raw=raw,
        disable_all_hooks=disable_all,
        sandbox=sandbox,
    )


def _read_file(path: Path, root: Path) -> Settings:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(source, f"cannot read settings file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(source, f"settings file is not UTF-8 text: {exc}") from None
    if not text.strip():
        return Settings(sources=(source,))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(source, f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                                    f"{exc.msg}") from None
    return parse_settings(data, source=source, root=root)


SETTING_SOURCES: tuple[str, ...] = ("user", "project", "local")


def settings_files(cwd: str | Path, *, home: str | Path | None = None,
                   setting_sources: Iterable[str] = SETTING_SOURCES) -> list[tuple[Path, Path]]:
    """The standard settings files of the chosen sources (``--setting-sources``), low to high
    precedence, as (path, project root) pairs; only those that exist. The same file is never read
    twice (cwd = home)."""
    wanted = set(setting_sources)
    unknown = wanted - set(SETTING_SOURCES)
    if unknown:
        raise SettingsError("--setting-sources", f"unknown source(s) {', '.join(sorted(unknown))}; "
                                                 f"expected a subset of {', '.join(SETTING_SOURCES)}")
    cwd_p = Path(cwd).resolve()
    home_p = Path(home).resolve() if home is not None else Path.home().resolve()
    candidates: list[tuple[Path, Path]] = []
    if "user" in wanted:
        candidates.append((home_p / ".claude" / "settings.json", home_p))
    if "project" in wanted:
        candidates.append((cwd_p / ".claude" / "settings.json", cwd_p))
    if "local" in wanted:
        candidates.append((cwd_p / ".claude" / "settings.local.json", cwd_p))
    seen: set[Path] = set()
    out = []
    for path, root in candidates:
        resolved = path.resolve()
        if resolved in seen or not path.is_file():
            continue
        seen.add(resolved)
        out.append((path, root))
    return out


def load_settings(cwd: str | Path = ".", settings: str | None = None, *, home: str | Path | None = None,
                  setting_sources: Iterable[str] = SETTING_SOURCES) -> Settings:
    """Load and merge every settings source for a session in ``cwd``.

    ``settings`` is the ``--settings`` argument: a JSON object (text starting with ``{``) or the
    path of a settings file (relative to ``cwd``); it is always read. ``setting_sources`` picks
    which of the standard files are read (``user``, ``project``, ``local``). ``home`` overrides the
    user's home directory (tests, sandboxes).
    """
    cwd_p = Path(cwd).resolve()
    files = settings_files(cwd_p, home=home, setting_sources=setting_sources)
    layers = [_read_file(path, root) for path, root in files]
    if settings is not None:
        layers.append(_load_flag_settings(settings, cwd_p))
    merged = merge_settings(layers)
    log.debug("settings_loaded", sources=list(merged.sources),
              hook_events=sorted(merged.hooks), rules=sum(len(getattr(merged.permissions, k))
                                                           for k in ("allow", "ask", "deny")))
    return merged


def _load_flag_settings(arg: str, cwd: Path) -> Settings:
    text = arg.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SettingsError("--settings", f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                                              f"{exc.msg}") from None
        return parse_settings(data, source="--settings", root=cwd)
    if not text:
        raise SettingsError("--settings", "expected a settings file path or a JSON object, "
                                          "got an empty string")
    path = Path(text).expanduser()
    if not path.is_absolute():
        path = cwd / path
    if not path.is_file():
        raise SettingsError(str(path), "settings file given with --settings does not exist")
    parent = path.resolve().parent
    # A file inside some project's .claude/ belongs to that project; anything else to its folder.
    root = parent.parent if parent.name == ".claude" else parent
    return _read_file(path, root)
