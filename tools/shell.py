"""Shell command lines: split a compound command into its simple commands, and normalise one.

A hand-written scanner, not a shell parser: it knows quotes, escapes, ``$(…)``, backtick and process
substitutions, subshell groups, redirections and the control operators, which is what the
permission rules and the read-only classifier of the Bash tool need. They use only :func:`scan`,
:func:`split_compound_command`, :func:`split_words` and :func:`command_variants`, so a real parser
can take its place behind those four.
"""

from __future__ import annotations

import re
import shlex

import attrs

_OPERATORS = ("&&", "||", "|&", ";;", ";", "|", "&", "\n")
_SUBSTITUTIONS = ("$(", "<(", ">(")


@attrs.frozen
class CommandLine:
    """What :func:`scan` found in a command line.

    ``parts`` are its simple commands, the bodies of substitutions and subshell groups included
    (they run too); ``ok`` is False when quoting or parentheses do not balance; ``syntax`` is the
    shell syntax met outside quotes (or inside double quotes, where substitutions still run): the
    control operators of ``_OPERATORS``, ``$(``, backtick, ``<(``, ``>(``, ``(``/``)`` (a subshell
    group or a stray parenthesis) and the redirections ``<``/``>``.
    """

    parts: tuple[str, ...]
    ok: bool
    syntax: frozenset[str]


@attrs.define
class _Found:
    parts: list[str] = attrs.field(factory=list)
    syntax: set[str] = attrs.field(factory=set)


def scan(command: str) -> CommandLine:
    """Scan ``command`` (see :class:`CommandLine`)."""
    found = _Found()
    ok = _scan(command.replace("\\\n", " "), found, 0)
    return CommandLine(tuple(p.strip() for p in found.parts if p.strip()), ok, frozenset(found.syntax))


def split_compound_command(command: str) -> tuple[list[str], bool]:
    """Split a shell command at ``&&``, ``||``, ``;``, ``|``, ``&`` and newlines, outside quotes.

    The bodies of command substitutions (``$(…)``, backticks, ``<(…)``, ``>(…)``) and of subshell
    groups are returned as parts of their own, since they run too. ``ok`` is False when quoting or
    parentheses do not balance: such a command is never pre-approved by allow rules.
    """
    line = scan(command)
    return list(line.parts), line.ok


def split_words(part: str) -> list[str] | None:
    """The words of one simple command after quote removal (POSIX rules, ``#`` not a comment);
    None when its quoting does not balance."""
    try:
        return shlex.split(part, posix=True)
    except ValueError:
        return None


def _scan(s: str, found: _Found, depth: int) -> bool:
    if depth > 20:
        return False
    ok = True
    buf: list[str] = []
    i, n = 0, len(s)

    def flush() -> None:
        found.parts.append("".join(buf))
        buf.clear()

    while i < n:
        c = s[i]
        if c == "\\":
            buf.append(s[i:i + 2])
            i += 2
            continue
        if c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                buf.append(s[i:])
                return False
            buf.append(s[i:j + 1])
            i = j + 1
            continue
        if c == '"':
            j, ok2 = _scan_double(s, i + 1, found, depth)
            ok = ok and ok2
            buf.append(s[i:j])
            i = j
            continue
        if s.startswith(_SUBSTITUTIONS, i):
            found.syntax.add(s[i:i + 2])
            j, ok2 = _match_paren(s, i + 2)
            ok = ok and ok2 and _scan(s[i + 2: j - 1] if ok2 else s[i + 2:], found, depth + 1)
            buf.append(s[i:j])
            i = j
            continue
        if c == "`":
            found.syntax.add(c)
            j, ok2 = _match_backtick(s, i + 1)
            ok = ok and ok2 and _scan(s[i + 1: j - 1] if ok2 else s[i + 1:], found, depth + 1)
            buf.append(s[i:j])
            i = j
            continue
        if c == "(" and not "".join(buf).strip():
            found.syntax.add(c)
            j, ok2 = _match_paren(s, i + 1)
            ok = ok and ok2 and _scan(s[i + 1: j - 1] if ok2 else s[i + 1:], found, depth + 1)
            i = j
            continue
        # `2>&1`, `&>file`, `>|file` are redirections, not operators.
        prev = buf[-1][-1:] if buf else ""
        if c in "&|" and prev in (">", "<"):
            buf.append(c)
            i += 1
            continue
        if s.startswith("&>", i):
            found.syntax.add(">")
            buf.append("&>")
            i += 2
            continue
        op = next((o for o in _OPERATORS if s.startswith(o, i)), None)
        if op is not None:
            found.syntax.add(op)
            flush()
            i += len(op)
            continue
        if c in "()<>":
            found.syntax.add(c)  # a redirection, or a parenthesis a shell would reject or read as a function
        buf.append(c)
        i += 1
    flush()
    return ok


def _scan_double(s: str, i: int, found: _Found, depth: int) -> tuple[int, bool]:
    """From just after an opening ``"``: index just after the closing one."""
    ok = True
    n = len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1, ok
        if s.startswith("$(", i):
            found.syntax.add("$(")
            j, ok2 = _match_paren(s, i + 2)
            ok = ok and ok2 and _scan(s[i + 2: j - 1] if ok2 else s[i + 2:], found, depth + 1)
            i = j
            continue
        if c == "`":
            found.syntax.add(c)
            j, ok2 = _match_backtick(s, i + 1)
            ok = ok and ok2 and _scan(s[i + 1: j - 1] if ok2 else s[i + 1:], found, depth + 1)
            i = j
            continue
        i += 1
    return n, False


def _match_paren(s: str, i: int) -> tuple[int, bool]:
    """From just after an opening ``(``: index just after its ``)``."""
    level, n = 1, len(s)
    while i < n:
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                return n, False
            i = j + 1
            continue
        if c == '"':
            # only the extent of the quoted text matters here: its substitutions are scanned when
            # the body of this group is
            i, ok = _scan_double(s, i + 1, _Found(), 0)
            if not ok:
                return n, False
            continue
        if c == "(":
            level += 1
        elif c == ")":
            level -= 1
            if level == 0:
                return i + 1, True
        i += 1
    return n, False


def _match_backtick(s: str, i: int) -> tuple[int, bool]:
    n = len(s)
    while i < n:
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == "`":
            return i + 1, True
        i += 1
    return n, False


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PREFIX_WORDS = frozenset({"!", "{", "}", "(", ")", "then", "do", "else", "elif", "if", "while", "until",
                           "time", "exec", "command", "builtin", "nohup", "sudo", "doas", "xargs"})
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish"})


def command_variants(part: str) -> set[str]:
    """Spellings of one simple command that deny and ask rules are also checked against, so that
    ``FOO=1 rm -rf /``, ``/bin/rm -rf /``, ``sudo rm -rf "/"``, ``timeout 5 rm -rf /`` and
    ``bash -c 'rm -rf /'`` cannot slip past ``Bash(rm -rf *)``. Allow rules never use these: a
    normalised spelling must not widen what was approved."""
    return _variants(part, 0)


def _variants(part: str, depth: int) -> set[str]:
    out = {part.strip()}
    if depth > 4:
        return out
    tokens = split_words(part)
    if tokens is None:
        tokens = part.split()
    tokens = _strip_prefixes(tokens)
    if not tokens:
        return out
    first = tokens[0].rsplit("/", 1)[-1] if "/" in tokens[0] else tokens[0]
    tokens = [first, *tokens[1:]]
    out.add(" ".join(tokens))
    inner: str | None = None
    if first in _SHELLS and "-c" in tokens[1:]:
        k = tokens.index("-c", 1)
        inner = tokens[k + 1] if k + 1 < len(tokens) else None
    elif first == "eval":
        inner = " ".join(tokens[1:])
    if inner:
        sub_parts, _ = split_compound_command(inner)
        out.add(inner.strip())
        for sp in sub_parts:
            out |= _variants(sp, depth + 1)
    return {o for o in out if o}


def _strip_prefixes(tokens: list[str]) -> list[str]:
    i, n = 0, len(tokens)
    while i < n:
        t = tokens[i]
        if t in _PREFIX_WORDS or _ASSIGNMENT.match(t):
            i += 1
            # sudo/xargs/command options (-u root, -E, -n 1 ...) belong to the wrapper
            if t in ("sudo", "doas", "xargs", "command", "exec"):
                while i < n and tokens[i].startswith("-"):
                    i += 2 if tokens[i] in ("-u", "-g", "-n", "-I", "-P", "-L", "-d") else 1
            continue
        if t == "env":
            i += 1
            while i < n and (tokens[i].startswith("-") or _ASSIGNMENT.match(tokens[i])):
                i += 2 if tokens[i] in ("-u", "-C", "-S") else 1
            continue
        if t == "nice":
            i += 1
            while i < n and tokens[i].startswith("-"):
                i += 2 if tokens[i] == "-n" else 1
            continue
        if t == "timeout":
            i += 1
            while i < n and tokens[i].startswith("-"):
                i += 2 if tokens[i] in ("-s", "-k", "--signal", "--kill-after") else 1
            i += 1  # the duration
            continue
        break
    return tokens[i:]
