"""Bash commands against the permission rules: ``Bash(...)`` rules on the programs a command runs,
``Read(...)`` and ``Edit(...)`` rules on the files it reads and writes.

Both judge the :class:`agentfsm.tools.shell.Analysis` of the command, so a rule holds however the
program is spelled or wrapped (``/usr/bin/env rm``, ``bash -lc 'rm x'``, ``$'\\x72m'``, ``find -exec
rm``) and whatever file a redirection, ``cp``, ``sed -i``, ``tee`` or ``dd`` names. Where the analysis
could not follow the command — a command name in a variable, shell code read from a pipe, a path
computed at run time — a rule that *could* apply denies: the command is never run on a guess.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import attrs

from agentfsm.hooks.file_access import PathChecker, expand_glob, normalise, rule_base
from agentfsm.tools.base import AccessDenial
from agentfsm.tools.shell import Analysis, Command

#: Longest command quoted in a denial; the rest is elided.
MAX_QUOTED = 1000


def wildcard(spec: str) -> re.Pattern[str]:
    """``*`` matches anything (newlines too); ``\\*`` is a literal star. A trailing `` *`` also
    matches nothing at all, so ``ls *`` covers ``ls`` and ``ls -la`` but not ``lsof``."""
    out: list[str] = []
    i, n = 0, len(spec)
    while i < n:
        c = spec[i]
        if c == "\\" and i + 1 < n and spec[i + 1] in "*\\":
            out.append(re.escape(spec[i + 1]))
            i += 2
            continue
        if c == "*":
            if i == n - 1 and out and out[-1] == re.escape(" "):
                out[-1] = "(?: .*)?"
            else:
                out.append(".*")
            i += 1
            continue
        out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def spec_matches(spec: str, command: str) -> bool:
    """Whether a ``Bash(spec)`` specifier matches one spelling of a command."""
    command = command.strip()
    spec = spec.strip()
    if spec.endswith(":*"):
        # Legacy prefix rule: a whole-word prefix (`npm run test:*` does not cover `npm run testing`).
        prefix = spec[:-2].rstrip()
        return command == prefix or command.startswith(prefix + " ") or command.startswith(prefix + "\t")
    if re.search(r"(?<!\\)\*", spec):
        return wildcard(spec).fullmatch(command) is not None
    return command == spec.replace("\\*", "*")


def _spec_tokens(spec: str) -> tuple[list[str], bool]:
    """The words of a specifier and whether it is a prefix (``rm:*``, ``rm *``)."""
    s = spec.strip()
    if s.endswith(":*"):
        return s[:-2].split(), True
    if s.endswith(" *"):
        return s[:-2].split(), True
    return s.split(), False


def _argv_verdict(spec: str, argv: Sequence[str | None]) -> str:
    """``yes``/``maybe``/``no``: can ``spec`` match an argv with words that are not static (None)?"""
    tokens, prefix = _spec_tokens(spec)
    for k, token in enumerate(tokens):
        if k >= len(argv):
            return "no"
        if argv[k] is None or "*" in token:
            return "maybe"
        if argv[k] != token:
            return "no"
    return "maybe" if prefix or len(argv) == len(tokens) else "no"


@attrs.frozen
class Match:
    """A rule hit: ``definite`` when the command does what the rule names, else the rule *could*
    apply to something the analysis cannot see (``reason``)."""

    definite: bool
    reason: str = ""


def spellings(c: Command) -> list[str]:
    """The texts a rule is matched against for one command: program by its base name, argv as
    written, and the command as it appears in the command line."""
    out: list[str] = []
    if c.static and c.program is not None:
        words = [w for w in c.argv if w is not None]
        out += [" ".join([c.program, *words[1:]]), " ".join(words)]
    if c.text:
        out.append(c.text)
    return out


def program_rule(spec: str, command: str, analysis: Analysis) -> Match | None:
    """A ``Bash(spec)`` deny/ask rule against a command: any command it runs, any spelling."""
    if spec_matches(spec, command):
        return Match(True)
    maybe: str | None = None
    for c in analysis.commands:
        if any(spec_matches(spec, s) for s in spellings(c)):
            return Match(True)
        if not c.static and maybe is None:
            verdict = _argv_verdict(spec, [c.program, *c.argv[1:]])
            if verdict != "no":
                maybe = (f"`{c.words()}` has words that can't be checked before it runs" if c.program
                         else "a command name in this command can't be checked before it runs")
    if analysis.opaque:
        return Match(False, analysis.opaque[0])
    if maybe is not None:
        return Match(False, maybe)
    return None


def parts_allowed(specs: Sequence[str], command: str, analysis: Analysis) -> bool:
    """The allow reading: every command as written in the command line (the bodies of ``$(…)``
    included) must match one of ``specs`` by its own text; a command the analysis could not follow
    is never pre-approved."""
    command = command.strip()
    if any(command == s.strip() for s in specs if "*" not in s):
        return True  # a rule written as the whole (compound) command allows exactly that text
    if analysis.opaque or not analysis.commands:
        return False
    parts = [c for c in analysis.commands if c.part]
    if not parts:
        return False
    return all(c.text is not None and any(spec_matches(s, c.text) for s in specs) for c in parts)


def file_rule(analysis: Analysis, read: PathChecker, write: PathChecker) -> tuple[AccessDenial | None, Match] | None:
    """The first denied file the command reads or writes (definite), else why a rule could apply to
    a file the analysis cannot name; None when no path rule applies."""
    if not read and not write:
        return None
    maybe: Match | None = None
    for use in analysis.paths:
        checker = read if use.access == "read" else write
        # a write can also expose what a read rule protects, by unlinking a name of a hard-linked file
        unlink = use.access == "write" and bool(read)
        if not checker and not unlink:
            continue
        if use.path is None:
            if checker or read.has_linked_denied():
                maybe = maybe or Match(False, f"{use.why}: a file this command {use.access}s can't be named "
                                              "before it runs")
            continue
        paths = expand_glob(use.path) if use.glob else [use.path]
        if paths is None:
            maybe = maybe or Match(False, f"the glob {use.path} matches too many files to check")
            continue
        for p in paths:
            found = None
            if checker:
                found = checker.check_below(p, creating=use.access == "write") if use.recursive else checker.check(p)
            if found is None and unlink:
                found = read.check_unlink(p, recursive=use.recursive)
            if found is None and use.creates and write:
                found = _creates_below(write, p)
            if found is not None:
                return found, Match(True, use.why)
    if analysis.opaque:
        return None, Match(False, analysis.opaque[0])
    if maybe is not None:
        return None, maybe
    return None


def _creates_below(write: PathChecker, directory: str) -> AccessDenial | None:
    """A write rule that names files by name at any depth (``Edit(.env)``) may match a file a copy or
    an extraction creates below ``directory``; those names are not known before it runs, so such a
    rule denies it (an anchored rule is judged by where its paths lie: ``check_below``)."""
    top = normalise(directory)
    for r in write.rules:
        assert r.specifier is not None
        base, _pattern, anchored = rule_base(r.specifier, write.cwd, r.root)
        # below the rule's base, or above it (a tree copied to a parent can land inside the base)
        base_dir = os.path.normpath(str(base))
        if not anchored and (_within(top, base_dir) or _within(base_dir, top)):
            return AccessDenial(directory, f"{r} (this command creates files below {directory} whose names "
                                           "can't be checked before it runs)")
    return None


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def quoted(command: str) -> str:
    command = command.strip()
    return command if len(command) <= MAX_QUOTED else command[:MAX_QUOTED] + "…"


def denied_text(command: str, match: Match) -> str:
    """The denial the model sees (Claude Code's wording, plus why when it was a could-apply)."""
    head = f"Permission to use Bash with command {quoted(command)} has been denied"
    if match.definite:
        return head + "."
    return (f"{head}: {match.reason}. A permission rule denies commands or files this one may reach, "
            "so it does not run; use a command whose programs and files are spelled out.")
