"""The session's sandbox: the permission rules turned into the filesystem view of each command the
model runs (:mod:`agentfsm.tools.sandbox` builds the bwrap command line from it).

The view is resolved from the rules as they are when the command starts:

- a ``Read(...)`` deny rule (or ``sandbox.filesystem.denyRead``) hides what it matches: a directory
  under an empty read-only tmpfs, a file under ``/dev/null``;
- an ``Edit(...)``/``Write(...)`` deny rule (or ``sandbox.filesystem.denyWrite``) makes what it
  matches read-only; a path it names that does not exist yet gets a read-only empty placeholder
  mounted where it would be created, so it cannot be created either;
- everything outside the writable places (the workspace, ``additionalDirectories``, the temporary
  directory, ``sandbox.filesystem.allowWrite``) is read-only.

A rule's literal part (``secrets`` of ``./secrets/**``) is masked as a whole, existing or not; what a
glob matches deeper (``**/*.pem``, ``.env`` at any depth) is found by walking below that literal part,
at most :data:`WALK_LIMIT` entries per command. A file that has other hard-linked names has those
names masked too (found by the same kind of walk over the writable places). When a walk cannot
finish within its budget the command is refused: an unfinished resolution proves nothing.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.hooks.bash_policy import parts_allowed
from agentfsm.hooks.config import SandboxPath, SandboxSettings
from agentfsm.hooks.file_access import path_rule_matches, rule_base, rule_root
from agentfsm.tools.base import Tool
from agentfsm.tools.pathmatch import has_magic
from agentfsm.tools.sandbox import (
    PLACEHOLDERS,
    Availability,
    Layout,
    NetworkGate,
    Prepared,
    availability,
    bwrap_argv,
    unsandboxed,
)
from agentfsm.tools.shell import analyse

log = fsm_log.get_logger("agentfsm.sandbox")
# the unavailability note is printed once per process, not per session
_ANNOUNCED: list[bool] = []

#: Entries looked at per command to resolve the rules' globs (and the other names of hard links).
WALK_LIMIT = 100_000
# A name no rule targets on purpose: a pattern that matches it matches everything in its directory.
_PROBE = ".agentfsm-probe-\x01"
#: The tools whose deny rules hide paths from reading, and those whose deny rules protect from writing.
READ_RULE_TOOLS = frozenset({"Read"})
WRITE_RULE_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})


#: Paths below each working directory a command must never write, whatever the rules say: writing them
#: would change what runs *outside* the sandbox later — the settings (their hooks run unsandboxed, their
#: rules govern the next session), git's hooks and config, editors' task files (Claude Code's sandbox
#: runtime protects the same). The settings files cannot be created either; the others are protected
#: where they exist (a placeholder `.git` would make git see a repository that is not there).
SETTINGS_FILES = (".claude/settings.json", ".claude/settings.local.json")
PROTECTED_IN_PROJECT = (".claude/commands", ".claude/agents", ".git/hooks", ".git/config", ".gitmodules",
                        ".mcp.json", ".vscode", ".idea", ".ripgreprc")
#: The same in the home directory (read-only anyway unless it is a writable place).
PROTECTED_IN_HOME = (".bashrc", ".bash_profile", ".zshrc", ".zprofile", ".profile", ".gitconfig", ".claude",
                     ".agentfsm")


class Unresolved(Exception):
    """The rules could not be turned into a view within the budget: the command must not run."""


@attrs.frozen
class _Rule:
    spec: str
    root: Path | None


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return path


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


class _Listings:
    """Directory listings kept between commands, each valid while its directory is unchanged: same
    inode, same mtime and same ctime (ctime cannot be set from user space, so a command that resets a
    directory's mtime after adding a file still invalidates it). A listing made less than
    :data:`RACY_S` after its directory last changed is not trusted (a change within the same clock
    tick would leave the times equal), as git treats racily clean index entries. So a walk costs a
    ``stat`` per directory, and a ``scandir`` only where something changed."""

    RACY_S = 2.0
    LIMIT = 200_000  # directories kept; past it the cache starts afresh

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[tuple[int, int, int, int], tuple[str, ...], tuple[str, ...]]] = {}

    def entries(self, directory: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(every name in ``directory``, the names of its subdirectories — symlinks not followed)."""
        st = os.stat(directory)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            kept = self._kept.get(directory)
        if kept is not None and kept[0] == key:
            return kept[1], kept[2]
        scanned = time.time_ns()
        names: list[str] = []
        dirs: list[str] = []
        for entry in os.scandir(directory):
            names.append(entry.name)
            try:
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.name)
            except OSError:
                pass
        listing = (tuple(names), tuple(dirs))
        if scanned - max(st.st_mtime_ns, st.st_ctime_ns) > self.RACY_S * 1e9:
            with self._lock:
                if len(self._kept) >= self.LIMIT:
                    self._kept.clear()
                self._kept[directory] = (key, *listing)
        return listing


LISTINGS = _Listings()


class _Walker:
    """Directory walks sharing one budget (per command)."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def walk(self, top: str, skip: Callable[[str], bool]) -> Iterator[tuple[str, tuple[str, ...]]]:
        """(directory, its names) for ``top`` and every directory below it that ``skip`` lets in."""
        stack = [top]
        while stack:
            directory = stack.pop()
            try:
                names, dirs = LISTINGS.entries(directory)
            except OSError:
                continue
            self.left -= len(names)
            if self.left < 0:
                raise Unresolved(f"more than {WALK_LIMIT} entries to look at below {top}")
            yield directory, names
            for d in dirs:
                path = os.path.join(directory, d)
                if not skip(path):
                    stack.append(path)

    def paths(self, top: str, skip: Callable[[str], bool]) -> Iterator[str]:
        for directory, names in self.walk(top, skip):
            for name in names:
                yield os.path.join(directory, name)


@attrs.define
class _Builder:
    cwd: Path
    writable: list[str]
    walker: _Walker
    hidden: dict[str, bool] = attrs.field(factory=dict)  # real path -> is a directory
    read_only: set[str] = attrs.field(factory=set)
    absent: dict[str, bool] = attrs.field(factory=dict)

    def covered(self, path: str) -> bool:
        return any(_inside(path, h) for h, is_dir in self.hidden.items() if is_dir)

    def in_writable(self, path: str) -> bool:
        return any(_inside(path, w) for w in self.writable)

    def hide(self, path: str) -> None:
        for p in {path, _real(path)}:
            try:
                st = os.stat(p)
            except (OSError, ValueError):
                continue
            if stat.S_ISDIR(st.st_mode):
                self.hidden[_real(p)] = True
            elif not self.covered(_real(p)):
                self.hidden[_real(p)] = False

    def protect(self, path: str) -> None:
        for p in {path, _real(path)}:
            if os.path.exists(p):
                real = _real(p)
                if self.in_writable(real):
                    self.read_only.add(real)
            elif os.path.lexists(p):
                # a dangling symlink: writing it creates its target, so the target may not be created
                self.block_creation(_real(p), False)

    def block_creation(self, path: str, is_dir: bool) -> None:
        """``path`` does not exist: mount a placeholder at its first missing component, if that
        lies in a writable place (elsewhere nothing can be created anyway)."""
        parts = Path(os.path.normpath(path)).parts
        current = Path(parts[0])
        for i, part in enumerate(parts[1:], start=1):
            nxt = current / part
            # a placeholder another running command mounted is still a missing component: one made
            # inside it would keep it from being removed when that command ends
            if not os.path.lexists(nxt) or (PLACEHOLDERS.any_made()
                                              and PLACEHOLDERS.made(os.path.join(_real(str(current)), part))):
                parent = _real(str(current))
                target = os.path.join(parent, part)
                if self.in_writable(target) and not self.covered(target):
                    last = i == len(parts) - 1
                    self.absent[target] = is_dir or not last
                return
            current = nxt
        # it exists after all (made since the check): protect it as it is
        if os.path.exists(path):
            self.protect(path)

    # -- one rule

    def apply(self, rule: _Rule, hide: bool) -> tuple[str, _Rule, bool] | None:
        """Mask what the rule names literally; return (directory to walk, rule, hide) when it also
        matches deeper by a glob (the walks of all rules are made together, see :meth:`walk`)."""
        base, pattern, anchored = rule_base(rule.spec, self.cwd, rule.root)
        literal = rule_root(rule.spec, self.cwd, rule.root)
        whole = path_rule_matches(rule.spec, os.path.join(literal, _PROBE), self.cwd, rule.root)
        itself = path_rule_matches(rule.spec, literal, self.cwd, rule.root)
        if anchored and (whole or itself):
            # the literal part is denied as a whole (`secrets/**`, `.env` from its base)
            self._mark(literal, hide, as_dir=whole)
            if whole:
                return None
        if not anchored and not has_magic(pattern):
            # a bare name (`.env`) matches at any depth: the top one cannot be created, deeper ones
            # that exist are found by the walk
            self._mark(os.path.join(str(base), pattern.rstrip("/")), hide, as_dir=pattern.endswith("/"))
        top = _real(literal)
        return (top, rule, hide) if os.path.isdir(top) else None

    def walk(self, pending: Sequence[tuple[str, _Rule, bool]]) -> None:
        """One walk per directory for every rule that matches below it by a glob. An entry's name is
        first screened against the rule's last segment (exact, or ``fnmatch`` for a plain ``*``/``?``
        segment), and only a name that passes is matched by the rule itself: most names pass no rule."""
        by_top: dict[str, list[tuple[_Rule, bool, Callable[[str], bool]]]] = {}
        for top, rule, hide in pending:
            by_top.setdefault(top, []).append((rule, hide, _name_screen(rule.spec)))
        for top in _outermost(list(by_top)):
            rules = [r for t, rs in by_top.items() if _inside(t, top) for r in rs]
            for directory, names in self.walker.walk(top, self.covered):
                for rule, hide, screen in rules:
                    for name in screen(names):
                        path = os.path.normpath(os.path.join(directory, name))
                        if path_rule_matches(rule.spec, path, self.cwd, rule.root):
                            self._mark(path, hide, as_dir=False)

    def _mark(self, path: str, hide: bool, *, as_dir: bool) -> None:
        if os.path.lexists(path):
            if hide:
                self.hide(path)
            else:
                self.protect(path)
        elif not hide:
            self.block_creation(path, as_dir)

    # -- hard links

    def other_names(self, roots: Sequence[str]) -> None:
        """Mask every other name of a hidden or protected file that has several hard links: a link
        made before the command started reads the same bytes, whatever path the mask covers.
        ``st_nlink`` says how many names there are; the walk over ``roots`` (the writable places)
        must find them all, or the command is refused (a name elsewhere cannot be masked unseen).
        ``roots`` are the writable places but the temporary directory (see :func:`resolve_layout`)."""
        wanted: dict[tuple[int, int], tuple[bool, int]] = {}  # inode -> (hide, link count)
        found: dict[tuple[int, int], set[str]] = {}

        def note(path: str, st: os.stat_result, hide: bool) -> None:
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                was = wanted.get(key, (False, st.st_nlink))
                wanted[key] = (was[0] or hide, st.st_nlink)
                found.setdefault(key, set()).add(path)

        masked = [*((p, True, d) for p, d in self.hidden.items()),
                  *((p, False, os.path.isdir(p)) for p in self.read_only)]
        for path, hide, is_dir in masked:
            if not is_dir:
                try:
                    note(path, os.stat(path), hide)
                except OSError:
                    pass
                continue
            for entry in self.walker.paths(path, lambda _p: False):
                try:
                    note(os.path.normpath(entry), os.lstat(entry), hide)
                except OSError:
                    continue
        if not wanted:
            return
        devices = {dev for dev, _ in wanted}
        for root in roots:
            try:
                if not os.path.isdir(root) or os.stat(root).st_dev not in devices:
                    continue
            except OSError:
                continue
            for entry in self.walker.paths(root, lambda p: self.covered(p) or p in self.read_only):
                try:
                    st = os.lstat(entry)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in wanted or not stat.S_ISREG(st.st_mode):
                    continue
                path = os.path.normpath(entry)
                found[key].add(path)
                if wanted[key][0]:
                    self.hidden.setdefault(path, False)
                elif self.in_writable(path):
                    self.read_only.add(path)
        for key, (_hide, links) in wanted.items():
            if len(found[key]) < links:
                names = ", ".join(sorted(found[key]))
                raise Unresolved(f"a file the rules deny has {links} hard-linked names and only "
                                 f"{len(found[key])} were found in the writable places ({names}); "
                                 "remove the other links, or deny them too")


def resolve_layout(cwd: Path, *, read_rules: Iterable[tuple[str, Path | None]],
                   write_rules: Iterable[tuple[str, Path | None]], writable: Iterable[str | Path],
                   network_isolated: bool = False, walk_limit: int = WALK_LIMIT,
                   protect_existing: Iterable[str | Path] = ()) -> Layout:
    """The view a command gets under these rules now (plus ``protect_existing``: paths made read-only
    where they exist). Raises :class:`Unresolved` past the budget."""
    places: list[str] = []
    for w in writable:
        real = _real(str(w))
        if os.path.isdir(real) and real not in places:
            places.append(real)
    builder = _Builder(cwd=cwd, writable=places, walker=_Walker(walk_limit))
    pending = [builder.apply(_Rule(spec, root), hide=True) for spec, root in read_rules]
    pending += [builder.apply(_Rule(spec, root), hide=False) for spec, root in write_rules]
    builder.walk([p for p in pending if p is not None])
    for path in protect_existing:
        # never over a writable place: a sessions directory that holds the workspace must not make
        # the workspace read-only
        real = _real(str(path))
        if os.path.lexists(path) and not any(_inside(w, real) and w != real for w in places):
            builder.protect(str(path))
    if builder.hidden or builder.read_only:
        # the temporary directory is shared with everything on the machine: its other names are not
        # searched there (a link found missing refuses the command instead)
        tmp = _real(tempfile.gettempdir())
        builder.other_names(_outermost([p for p in places if p != tmp]))
    # a protected or placeholder path inside a hidden directory is already out of reach
    read_only = {p for p in builder.read_only if not builder.covered(p)}
    absent = {p: d for p, d in builder.absent.items() if not builder.covered(p)}
    hidden_dirs = sorted(p for p, d in builder.hidden.items() if d)
    hidden_files = sorted(p for p, d in builder.hidden.items()
                          if not d and not any(_inside(p, h) for h in hidden_dirs))
    return Layout(writable=tuple(places), read_only=tuple(sorted(read_only)),
                  hidden_dirs=tuple(_outermost(hidden_dirs)), hidden_files=tuple(hidden_files),
                  absent=tuple(sorted(absent.items())), network_isolated=network_isolated)


def _name_screen(spec: str) -> Callable[[Sequence[str]], Sequence[str]]:
    """The names of a directory that may match the rule ``spec``, picked by its last segment when that
    is a literal name (one lookup) or a plain ``*``/``?`` pattern (``fnmatch.filter``); otherwise every
    name (``**``, brackets, braces and escapes are left to the rule's own matcher). Only the names it
    keeps are matched by the rule itself: most names of a workspace pass no rule."""
    last = spec.rstrip("/").rsplit("/", 1)[-1]
    if not last or last == "**" or any(c in last for c in "[]{}\\!()|+@"):
        return lambda names: names
    if not has_magic(last):
        return lambda names: (last,) if last in names else ()
    return lambda names: fnmatch.filter(names, last)


def _outermost(dirs: Sequence[str]) -> list[str]:
    out: list[str] = []
    for d in sorted(dirs, key=len):
        if not any(_inside(d, o) for o in out):
            out.append(d)
    return out


def _sandbox_path(p: SandboxPath) -> tuple[str, Path | None]:
    return p.spec, p.root


# --- the session's sandbox ------------------------------------------------------------------------


@attrs.define
class SessionSandbox:
    """Implements :class:`agentfsm.tools.sandbox.CommandSandbox` for one session: its settings, its
    permission policy (read live: rules and directories as they are when a command starts), and
    whether the CLI turned the sandbox off. ``observer`` gets a record per command (the trace)."""

    settings: SandboxSettings
    policy: Any  # agentfsm.hooks.permissions.PermissionPolicy
    cli_enabled: bool = True
    observer: Callable[[dict[str, Any]], None] | None = None
    # None: the process-wide probe (agentfsm.tools.sandbox.availability), looked up when asked
    probe_with: Callable[[], Availability] | None = None
    # what the host keeps that no command may write: the session files (a forged record would
    # mislead `agentfsm audit`)
    protected_paths: tuple[str, ...] = ()
    _network: NetworkGate | None = None

    def close(self) -> None:
        """Stop the network proxy, if one was started (the session ends)."""
        if self._network is not None:
            self._network.close()

    def probe(self) -> Availability:
        return (self.probe_with or availability)()

    @property
    def wanted(self) -> bool:
        return self.cli_enabled and self.settings.enabled is not False

    @property
    def explicitly_enabled(self) -> bool:
        return self.cli_enabled and self.settings.enabled is True

    def status(self) -> dict[str, Any]:
        """What ``system/init`` says of the sandbox."""
        if not self.wanted:
            why = "--no-sandbox" if not self.cli_enabled else "sandbox.enabled is false"
            return {"enabled": False, "reason": why}
        found = self.probe()
        if not found.ok:
            return {"enabled": False, "reason": found.reason,
                    "failIfUnavailable": bool(self.settings.fail_if_unavailable)}
        return {"enabled": True, "network": "isolated" if self.network_isolated else "shared",
                "allowedDomains": list(self.settings.allowed_domains or ())}

    def announce(self) -> None:
        """Say once per process, on stderr, that the sandbox is wanted but cannot run here."""
        if self.wanted and not self.probe().ok and not _ANNOUNCED:
            _ANNOUNCED.append(True)
            sys.stderr.write(f"agentfsm: the sandbox cannot run here ({self.probe().reason}); the model's "
                             "commands run unsandboxed, guarded by the permission rules' shell analysis only\n")

    @property
    def active(self) -> bool:
        return self.wanted and self.probe().ok

    @property
    def unavailable_error(self) -> str | None:
        """Why the session must not start: the sandbox is required but cannot run."""
        if self.wanted and self.settings.fail_if_unavailable and not self.probe().ok:
            return (f"the sandbox is required (sandbox.failIfUnavailable) but cannot run: {self.probe().reason}."
                    " Set sandbox.failIfUnavailable=false to allow unsandboxed execution.")
        return None

    @property
    def network_isolated(self) -> bool:
        # only when the settings ask: without network keys the sandbox governs files only
        return self.settings.allowed_domains is not None

    def _may_disable(self, disable_requested: bool) -> bool:
        return disable_requested and self.settings.allow_unsandboxed is not False

    def excluded(self, command: str, cwd: Path) -> bool:
        """Every part of ``command`` matches a ``sandbox.excludedCommands`` pattern (``docker`` means
        the program with any arguments, ``docker:*`` and ``docker *`` as in permission rules)."""
        patterns = list(self.settings.excluded_commands)
        if not patterns:
            return False
        specs = [*patterns, *(p + ":*" for p in patterns if not p.endswith("*"))]
        analysis = analyse(command, str(cwd))
        # what the analysis cannot see through runs sandboxed
        return not analysis.opaque and parts_allowed(specs, command, analysis)

    def auto_allows(self, tool: Tool, tool_input: Mapping[str, Any]) -> bool:
        """``autoAllowBashIfSandboxed``: a Bash call that will run sandboxed needs no approval. Claude
        Code's default (true) holds when the settings turn the sandbox on; when it is on only by
        agentfsm's default, the setting must say so, so today's approvals do not change unasked."""
        if "Bash" not in {tool.name, *tool.aliases} or not self.active:
            return False
        allowed = self.settings.auto_allow_bash
        if allowed is None:
            allowed = self.explicitly_enabled
        if not allowed:
            return False
        command = tool_input.get("command")
        if not isinstance(command, str):
            return False
        if self._may_disable(bool(tool_input.get("dangerouslyDisableSandbox"))):
            return False
        return not self.excluded(command, self.policy.cwd)

    # -- CommandSandbox

    def prepare(self, command: str, cwd: Path, *, shell: str, disable_requested: bool,
                tool_use_id: str) -> Prepared:
        prepared = self._prepare(command, cwd, shell=shell, disable_requested=disable_requested)
        if prepared.placeholders:
            PLACEHOLDERS.acquire(prepared.placeholders)
        if self.observer is not None:
            self.observer({"type": "sandbox", "tool_use_id": tool_use_id, **prepared.record,
                           **({"refused": prepared.refusal} if prepared.refusal else {})})
        return prepared

    def finished(self, prepared: Prepared) -> None:
        if prepared.placeholders:
            PLACEHOLDERS.release(prepared.placeholders)

    def _prepare(self, command: str, cwd: Path, *, shell: str, disable_requested: bool) -> Prepared:
        if not self.wanted:
            return unsandboxed(shell, command, "--no-sandbox" if not self.cli_enabled else "sandbox.enabled=false")
        found = self.probe()
        if not found.ok:
            if self.settings.fail_if_unavailable:
                return unsandboxed(shell, command, "unavailable", refusal=(
                    f"Sandbox is required (sandbox.failIfUnavailable) but cannot run: {found.reason}"))
            return unsandboxed(shell, command, f"unavailable: {found.reason}")
        if self._may_disable(disable_requested):
            return unsandboxed(shell, command, "dangerouslyDisableSandbox")
        if self.excluded(command, cwd):
            return unsandboxed(shell, command, "excludedCommands")
        try:
            layout = self.layout(cwd)
            if self.network_isolated and self.settings.allowed_domains:
                if self._network is None:
                    self._network = NetworkGate(self.settings.allowed_domains, self.settings.denied_domains)
                layout = attrs.evolve(layout, proxy_socket=self._network.socket())
        except OSError as exc:
            return unsandboxed(shell, command, "network proxy", refusal=(
                f"The sandbox's network proxy could not start ({exc}), so the command was not run."))
        except Unresolved as exc:
            return unsandboxed(shell, command, "unresolved", refusal=(
                f"The sandbox could not be built from the permission rules ({exc}), so the command was not run."))
        assert found.bwrap is not None
        argv = bwrap_argv(found.bwrap, layout, shell, command, str(cwd))
        return Prepared(argv=tuple(argv), sandboxed=True, record={"sandboxed": True, "policy": layout.summary()},
                        placeholders=layout.absent)

    def layout(self, cwd: Path) -> Layout:
        """The view under the session's rules as they are now."""
        policy = self.policy
        read = [(r.specifier, r.root) for r in policy.deny if r.specifier is not None and r.tool in READ_RULE_TOOLS]
        write = [(r.specifier, r.root) for r in policy.deny
                 if r.specifier is not None and r.tool in WRITE_RULE_TOOLS]
        read += [_sandbox_path(p) for p in self.settings.deny_read]
        write += [_sandbox_path(p) for p in self.settings.deny_write]
        writable: list[str | Path] = [cwd, policy.cwd, *policy.additional_directories, tempfile.gettempdir()]
        for p in self.settings.allow_write:
            base, pattern, _ = rule_base(p.spec, cwd, p.root)
            writable.append(os.path.normpath(os.path.join(str(base), pattern)))
        projects = list(dict.fromkeys([Path(cwd), Path(policy.cwd), *map(Path, policy.additional_directories)]))
        write += [("//" + str(d / f).lstrip("/"), None) for d in projects for f in SETTINGS_FILES]
        protect = [d / f for d in projects for f in PROTECTED_IN_PROJECT]
        protect += [Path.home() / f for f in PROTECTED_IN_HOME]
        protect += [Path(p) for p in self.protected_paths]
        return resolve_layout(Path(policy.cwd), read_rules=read, write_rules=write, writable=writable,
                              network_isolated=self.network_isolated, protect_existing=protect)
