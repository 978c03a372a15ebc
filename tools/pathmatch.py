"""Path patterns: match ``/``-separated relative paths against glob patterns, in one dialect.

Every place that matches paths against a glob goes through here, so a pattern means the same in the
Glob tool, in the Grep fallback's ignore files and ``--glob`` filters, and in ``Read(...)``/``Edit(...)``
permission rules. The dialect is wcmatch's glob: ``*`` and ``?`` stay within one segment; ``**`` as a
whole segment spans any number of directories (elsewhere it is a plain ``*``); ``[...]`` is a POSIX
bracket expression (``!`` or ``^`` negates, ranges, ``[:digit:]``-style classes, never ``/``); ``\\``
escapes; dotfiles match like any other name.

The three uses differ only in where a pattern is anchored and what a match covers, which the options
of :func:`compile_glob` spell out and one preset per use fixes:

- the Glob tool (:func:`glob_tool_matcher`): relative to the searched directory, ``{a,b}`` alternatives;
- gitignore lines (:func:`ignore_rule`): without a ``/`` a pattern matches at any depth, with one it is
  anchored; a trailing ``/`` matches directories only; a leading ``!`` re-includes;
- permission path rules (:func:`path_rule_matcher`): gitignore anchoring, and a matched directory
  covers everything below it.
"""

from __future__ import annotations

import functools
import re

import attrs
import bracex
from wcmatch import glob

# FORCEUNIX: the paths matched here are always "/"-separated and compared case-sensitively, whatever
# the host platform would do by default.
_FLAGS = glob.GLOBSTAR | glob.DOTGLOB | glob.FORCEUNIX
# Brace expansion is exponential in the number of groups; past this many alternatives a pattern is
# refused rather than expanded (wcmatch's own default limit).
BRACE_LIMIT = 1000


class PatternError(ValueError):
    """A pattern with too many ``{...}`` alternatives to expand."""


def expand_braces(pattern: str) -> list[str]:
    """``a.{js,ts}`` → ``[a.js, a.ts]``: the alternatives, as wcmatch's ``BRACE`` expands them (bash
    rules: nested groups expand, a group without a comma or an unbalanced one is literal text,
    ``\\{`` is a literal brace, ``{1..3}`` is a sequence)."""
    try:
        # return_empty: "{,}" is one empty alternative, not none
        return bracex.expand(pattern, keep_escapes=True, limit=BRACE_LIMIT, return_empty=True)
    except bracex.ExpansionLimitException as exc:
        raise PatternError(f"pattern {pattern!r} expands to more than {BRACE_LIMIT} alternatives") from exc


def has_magic(segment: str) -> bool:
    """Whether a path segment may match anything other than itself (a wildcard, a bracket, a brace
    or an escape): the walk of a glob and its permission check start below the segments that do not."""
    return glob.is_magic(segment, flags=_FLAGS | glob.BRACE)


@attrs.frozen
class Matcher:
    """A compiled pattern. :meth:`match` takes a path relative to where the pattern is anchored,
    ``/``-separated, without ``.`` or ``..`` segments; ``""`` is that directory itself."""

    pattern: str
    _wc: glob.WcMatcher[str] = attrs.field(alias="wc", repr=False, eq=False)

    def match(self, path: str) -> bool:
        return self._wc.match(path)


@functools.lru_cache(maxsize=1024)
def compile_glob(pattern: str, *, braces: bool = False, anywhere: bool = False,
                 contents: bool = False) -> Matcher:
    """Compile ``pattern`` in the one dialect of this module.

    ``braces``: ``{a,b}`` alternates (else it is literal text). ``anywhere``: the pattern may match
    the trailing segments of a path at any depth, as gitignore reads a pattern without a ``/``.
    ``contents``: a path also matches when one of its parent directories does.
    """
    # Braces are expanded here rather than by wcmatch's BRACE flag (which runs the same bracex) so
    # that an over-long expansion surfaces as our PatternError.
    alternatives = expand_braces(pattern) if braces else [pattern]
    if anywhere:
        alternatives = ["**/" + a for a in alternatives]
    if contents:
        alternatives += [a + "/**" for a in alternatives]
    # limit=0: the alternatives are already counted against BRACE_LIMIT
    return Matcher(pattern, wc=glob.compile(alternatives, flags=_FLAGS, limit=0))


# --- the three uses --------------------------------------------------------------------------


def glob_tool_matcher(pattern: str) -> Matcher:
    """Claude Code's Glob: a pattern relative to the searched directory, with ``{a,b}`` alternatives;
    empty and ``.`` segments (``./src//*.py``) mean nothing."""
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    return compile_glob("/".join(segments), braces=True)


@attrs.frozen
class IgnoreRule:
    """One gitignore-style line: ``negated`` is its leading ``!``, ``dir_only`` its trailing ``/``."""

    matcher: Matcher
    negated: bool
    dir_only: bool

    def matches(self, path: str, is_dir: bool) -> bool:
        """Whether the pattern matches ``path`` (relative to the ignore file's directory), negation
        aside: the caller decides what the last matching rule means."""
        return (is_dir or not self.dir_only) and self.matcher.match(path)


def ignore_rule(line: str, *, comments: bool = True) -> IgnoreRule | None:
    """A line of a .gitignore/.ignore/.rgignore file, or (``comments=False``) an rg ``--glob``;
    None for a blank line or a comment."""
    if comments:
        if not line.strip() or line.startswith("#"):
            return None
        # trailing spaces are dropped unless escaped
        line = re.sub(r"(?<!\\)\s+\Z", "", line)
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith(("\\!", "\\#")):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    # A "/" anywhere but at the end anchors the pattern to the ignore file's directory.
    anchored = "/" in line
    return IgnoreRule(compile_glob(line.lstrip("/"), anywhere=not anchored), negated, dir_only)


def path_rule_matcher(pattern: str, *, anchored: bool) -> Matcher:
    """The pattern of a ``Read(...)``/``Edit(...)`` rule, relative to its base directory (the caller
    resolves ``//``, ``~/``, ``/`` and ``./``): an unanchored pattern matches at any depth, and a
    matched directory covers everything inside it, as in gitignore. An empty pattern or ``.`` is the
    base directory itself, so it covers everything below."""
    pattern = pattern.rstrip("/")
    if pattern in ("", "."):
        pattern = "**"
    return compile_glob(pattern, anywhere=not anchored, contents=True)
