"""The file-access policy: which paths the permission rules keep every tool from reading or writing.

One decision, asked by Read, Write, Edit, Glob and Grep through the :class:`agentfsm.tools.base.FileAccess`
port and by the Bash check for the files a command touches. A path is judged in every spelling that
reaches the same bytes (:func:`spellings`): as written (``..`` folded on the text), as the kernel
resolves it (each symlink followed before the ``..`` after it is taken: ``pub/link/../key`` where
``pub/link -> ../secrets/vault`` is ``secrets/key``), and — for a file with more than one hard link
— as every other name of the same inode below the roots the rules protect.
What cannot be checked within its budget (a hard-link search or a directory walk over too many
files) is denied, never waved through.

Rule patterns read as gitignore does, in the one glob dialect of :mod:`agentfsm.tools.pathmatch`:
``//abs`` from the filesystem root, ``~/p`` from home, ``/p`` from the settings file's project, ``./p``
and ``a/b`` from the cwd, a pattern without a slash matches a name at any depth below the cwd, and
a matched directory covers everything inside it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from wcmatch import glob as wcglob

from agentfsm.tools.base import Access, AccessDenial
from agentfsm.tools.pathmatch import has_magic, path_rule_matcher

#: Entries looked at when judging everything below a directory (``grep -r``, ``cp -r``).
WALK_LIMIT = 100_000
#: Entries looked at to find the other names of a hard-linked file.
HARDLINK_WALK_LIMIT = 200_000
#: Paths a glob in a shell command may expand to before it counts as unknown.
GLOB_LIMIT = 10_000
# A name no rule targets on purpose: a pattern that matches it matches everything in its directory.
_PROBE = ".agentfsm-probe-\x01"


class PathRule(Protocol):
    """What a path check needs of a permission rule."""

    tool: str
    specifier: str | None
    root: Path | None


def rule_base(spec: str, cwd: Path, root: Path | None) -> tuple[Path, str, bool]:
    """(base directory, pattern relative to it, anchored) of a path rule's specifier."""
    if spec.startswith("//"):
        return Path("/"), spec[2:], True
    if spec == "~" or spec.startswith("~/"):
        return Path.home(), spec[2:], True
    if spec.startswith("/"):
        return (root or cwd), spec[1:], True
    if spec.startswith("./"):
        return cwd, spec[2:], True
    return cwd, spec, "/" in spec.rstrip("/")


def path_rule_matches(spec: str, path: str, cwd: Path, root: Path | None) -> bool:
    """Whether the specifier of a path rule matches ``path`` (absolute, normalised)."""
    base, pattern, anchored = rule_base(spec, cwd, root)
    try:
        rel = PurePosixPath(path).relative_to(os.path.normpath(str(base)))
    except ValueError:
        return False
    return path_rule_matcher(pattern, anchored=anchored).match("/".join(rel.parts))


def rule_root(spec: str, cwd: Path, root: Path | None) -> str:
    """The deepest directory (or file) every path the rule can match lies in: its literal prefix."""
    base, pattern, anchored = rule_base(spec, cwd, root)
    if not anchored:
        return os.path.normpath(str(base))
    fixed: list[str] = []
    for seg in pattern.split("/"):
        if not seg or seg == ".":
            continue
        if has_magic(seg):
            break
        fixed.append(seg)
    return os.path.normpath(os.path.join(str(base), *fixed))


def normalise(path: str) -> str:
    out = os.path.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def _real(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return normalise(path)


def spellings(path: str) -> list[str]:
    """The names ``path`` (absolute, ``..`` possibly kept) is judged under: folded on the text, then
    — when it differs — as the kernel resolves it. The one resolution every check of a path uses."""
    written = normalise(path)
    kernel = _real(path)  # realpath walks the components: a link is followed before the `..` after it
    return [written] if kernel == written else [written, kernel]


class PathChecker:
    """The rules of one access (the deny rules on reading, say) against paths on disk. Holds the
    hard-link index it builds on first need, so make one per decision: the disk moves on."""

    def __init__(self, cwd: Path, rules: Sequence[PathRule]) -> None:
        self.cwd = cwd
        self.rules = [r for r in rules if r.specifier is not None]
        self._inodes: dict[tuple[int, int], PathRule] | None = None
        self._inodes_complete = True

    def __bool__(self) -> bool:
        return bool(self.rules)

    def _hit(self, path: str) -> PathRule | None:
        for r in self.rules:
            assert r.specifier is not None
            if path_rule_matches(r.specifier, path, self.cwd, r.root):
                return r
        return None

    def check(self, path: str) -> AccessDenial | None:
        """Why ``path`` (absolute) is denied: as given, once resolved, or as another name of it."""
        if not self.rules:
            return None
        names = spellings(path)
        for k, name in enumerate(names):
            hit = self._hit(name)
            if hit is not None:
                return AccessDenial(path, str(hit), through_link=k > 0)
        return self._hard_link(path, names[-1])

    def check_tree(self, directory: str) -> AccessDenial | None:
        """Why ``directory`` as a whole is denied: it is, or everything inside it is."""
        if not self.rules:
            return None
        found = self.check(directory)
        if found is not None:
            return found
        names = spellings(directory)
        for k, candidate in enumerate(names):
            hit = self._hit(os.path.join(candidate, _PROBE))
            if hit is not None:
                return AccessDenial(directory, str(hit), through_link=k > 0)
        return None

    def check_below(self, directory: str, *, creating: bool = False) -> AccessDenial | None:
        """Why reading or writing everything below ``directory`` touches a denied path: the directory
        itself, a rule that covers all of it, an entry (or what an entry links to) found by walking
        it, or — when the access may ``create`` files — a rule naming something inside it that does
        not exist yet. Over :data:`WALK_LIMIT` entries the answer is a denial: an unfinished check
        proves nothing."""
        if not self.rules:
            return None
        found = self.check_tree(directory)
        if found is not None:
            return found
        tops = spellings(directory)
        # before anything on disk: a directory the access creates (`cp -r src new`) does not exist yet,
        # and the names it creates below it are not known either way
        for r in self.rules if creating else ():
            assert r.specifier is not None
            # an anchored rule whose paths lie below `top` may be hit (an unanchored one, such as
            # `.env`, is judged on the walk below)
            if rule_base(r.specifier, self.cwd, r.root)[2] and any(
                    _overlaps(rule_root(r.specifier, self.cwd, r.root), top) for top in tops):
                return AccessDenial(directory, str(r))
        # (a `top` that is no directory was judged by check_tree above; the walk finds nothing in it)
        seen_dirs: set[str] = set()
        count = 0
        for top in tops:
            for entry in _walk(top, seen_dirs):
                count += 1
                if count > WALK_LIMIT:
                    return AccessDenial(directory, f"more than {WALK_LIMIT} entries to check below it")
                found = self.check(entry)
                if found is not None:
                    return AccessDenial(directory, found.rule, through_link=True)
        return None

    def check_unlink(self, path: str, *, recursive: bool = False) -> AccessDenial | None:
        """Why writing ``path`` (or, ``recursive``, anything below it) could expose a denied file: a
        file the rules name that has other hard-linked names. Removing or replacing that name (``rm``,
        ``mv`` or ``ln -f`` over it, a program that writes a new file and renames it into place) leaves
        the same bytes under names no rule covers, so the write is denied. The name itself is judged
        as written, with its directory resolved (the last component is what gets unlinked, not what a
        symlink there points to). Over :data:`WALK_LIMIT` entries the answer is a denial."""
        if not self.rules:
            return None
        # the name as the kernel reaches it: its directory resolved, its last component kept
        parent, _, last = path.rstrip("/").rpartition("/")
        norm = normalise(os.path.join(_real(parent or "/"), last)) if last not in ("", ".", "..") else _real(path)
        entries: Iterator[str] = iter(dict.fromkeys([normalise(path), norm]))
        if recursive and os.path.isdir(norm) and not os.path.islink(norm):
            entries = _walk(norm, set(), follow=False)
        count = 0
        for entry in entries:
            count += 1
            if count > WALK_LIMIT:
                return AccessDenial(path, f"more than {WALK_LIMIT} entries to check below it")
            try:
                st = os.lstat(entry)
            except (OSError, ValueError):
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
                continue
            named = os.path.join(_real(os.path.dirname(entry)), os.path.basename(entry))
            hit = self._hit(normalise(entry)) or self._hit(normalise(named))
            if hit is not None:
                return AccessDenial(path, f"{hit} (a file with other hard-linked names; writing over or "
                                          "removing it would leave its contents readable under them)")
        return None

    def has_linked_denied(self) -> bool:
        """Whether some file the rules name has other hard-linked names (or the search for them ran
        past :data:`HARDLINK_WALK_LIMIT`): only then can a write the analysis cannot name expose it."""
        count = 0
        for r in self.rules:
            assert r.specifier is not None
            root = rule_root(r.specifier, self.cwd, r.root)
            # symlinked directories are entered: a file reached through one is denied by that spelling
            for entry in [root] if not os.path.isdir(root) else _walk(root, set()):
                count += 1
                if count > HARDLINK_WALK_LIMIT:
                    return True
                try:
                    st = os.stat(entry)
                except (OSError, ValueError):
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
                    continue
                if path_rule_matches(r.specifier, normalise(entry), self.cwd, r.root):
                    return True
        return False

    # -- hard links

    def _hard_link(self, path: str, real: str) -> AccessDenial | None:
        try:
            st = os.stat(real)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            return None
        index = self._inode_index(st.st_dev)
        hit = index.get((st.st_dev, st.st_ino))
        if hit is not None:
            return AccessDenial(path, str(hit), through_link=True)
        if not self._inodes_complete:
            return AccessDenial(path, "a hard-linked file whose other names could not all be checked",
                                through_link=True)
        return None

    def _inode_index(self, device: int) -> dict[tuple[int, int], PathRule]:
        """(device, inode) of every regular file the rules deny, found below each rule's root on the
        device of the file asked about (a hard link never crosses a file system)."""
        if self._inodes is not None:
            return self._inodes
        index: dict[tuple[int, int], PathRule] = {}
        count = 0
        for r in self.rules:
            assert r.specifier is not None
            root = rule_root(r.specifier, self.cwd, r.root)
            try:
                if os.stat(root).st_dev != device:
                    continue
            except (OSError, ValueError):
                continue
            for entry in [root] if not os.path.isdir(root) else _walk(root, set(), follow=False):
                count += 1
                if count > HARDLINK_WALK_LIMIT:
                    self._inodes_complete = False
                    break
                try:
                    st = os.lstat(entry)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and path_rule_matches(r.specifier, normalise(entry), self.cwd, r.root):
                    index.setdefault((st.st_dev, st.st_ino), r)
        self._inodes = index
        return index


def _overlaps(a: str, b: str) -> bool:
    """One of two directories lies inside the other (or they are the same)."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _walk(top: str, seen_dirs: set[str], *, follow: bool = True) -> Iterator[str]:
    """Every entry below ``top`` (iteratively; symlinked directories entered once when ``follow``)."""
    stack = [top]
    seen_dirs.add(_real(top))
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            yield entry.path
            try:
                is_dir = entry.is_dir(follow_symlinks=follow)
            except OSError:
                continue
            if is_dir:
                real = _real(entry.path) if follow else entry.path
                if real not in seen_dirs:
                    seen_dirs.add(real)
                    stack.append(entry.path)


def expand_glob(pattern: str) -> list[str] | None:
    """The paths a shell glob (bash's dialect, backslash escapes, dotfiles included to be safe)
    expands to now; the pattern itself, unescaped, when nothing matches (bash passes it on as is);
    None past :data:`GLOB_LIMIT` matches."""
    out: list[str] = []
    flags = wcglob.FORCEUNIX | wcglob.DOTGLOB
    try:
        for hit in wcglob.iglob(pattern, flags=flags):
            out.append(hit)  # as the kernel will receive it: a `..` in it is for the checker to resolve
            if len(out) > GLOB_LIMIT:
                return None
    except (OSError, ValueError):
        return None
    return out or [_unescape(pattern)]


def _unescape(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        out.append(pattern[i])
        i += 1
    return "".join(out)  # (a `..` kept: see expand_glob)


class PolicyFileAccess:
    """The :class:`agentfsm.tools.base.FileAccess` of a session's permission rules: ``read`` rules
    deny reading, ``write`` rules deny writing. Make one per tool call (see :class:`PathChecker`)."""

    def __init__(self, cwd: Path, read: Sequence[PathRule], write: Sequence[PathRule]) -> None:
        self._checkers = {"read": PathChecker(cwd, read), "write": PathChecker(cwd, write)}

    def checker(self, access: Access) -> PathChecker:
        return self._checkers[access]

    def denial(self, path: str, access: Access) -> AccessDenial | None:
        return self._checkers[access].check(path)

    def tree_denial(self, directory: str, access: Access) -> AccessDenial | None:
        return self._checkers[access].check_tree(directory)
