"""Shell words: the value of one argument of a parsed command (quote removal, ``$'…'`` escapes, which
characters stay live for glob and brace expansion), as :mod:`agentfsm.tools.shell` reads them."""

from __future__ import annotations

import re

import attrs
from tree_sitter import Node

from agentfsm.tools.pathmatch import PatternError, expand_braces

_ANSI_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b",
                 "E": "\x1b", "\\": "\\", "'": "'", '"': '"', "?": "?"}
GLOB_CHARS = frozenset("*?[")
_PATTERN_SPECIALS = frozenset("*?[]{},\\~")


def ansi_c(body: str) -> str:
    """The text of ``$'…'`` (bash's escapes: ``\\x72`` is ``r``, ``\\101`` is ``A``, ``\\cX``…)."""
    out: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        d = body[i + 1]
        if d in _ANSI_ESCAPES:
            out.append(_ANSI_ESCAPES[d])
            i += 2
        elif d in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[d]
            m = re.match(rf"[0-9a-fA-F]{{1,{width}}}", body[i + 2:])
            if m:
                code = int(m.group(), 16)
                out.append(chr(code) if code < 0x110000 else "\ufffd")
                i += 2 + len(m.group())
            else:
                out.append("\\" + d)
                i += 2
        elif d in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i + 1:])
            assert m is not None
            out.append(chr(int(m.group(), 8) & 0xFF))
            i += 1 + len(m.group())
        elif d == "c" and i + 2 < n:
            out.append(chr(ord(body[i + 2]) & 0x1F))
            i += 3
        else:
            out.append("\\" + d)
            i += 2
    return "".join(out)


def has_unescaped(pattern: str, chars: frozenset[str]) -> bool:
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c in chars:
            return True
        i += 1
    return False


def escape(text: str) -> str:
    """``text`` with every glob, brace and tilde character made literal."""
    return "".join("\\" + c if c in _PATTERN_SPECIALS else c for c in text)


def unescape(pattern: str) -> str:
    return re.sub(r"\\(.)", r"\1", pattern, flags=re.S)


@attrs.frozen
class Word:
    """A word's value: ``text`` after quote removal (None when not static); ``pattern`` the same
    text with the quoted characters escaped, for tilde, glob and brace expansion; ``splits``: an
    unquoted expansion that may become any number of words."""

    text: str | None
    pattern: str | None = None
    splits: bool = False

    @classmethod
    def literal(cls, text: str | None) -> Word:
        """A word whose text is taken as is (no expansion)."""
        return cls(text, None if text is None else escape(text))

    @property
    def glob(self) -> bool:
        return self.pattern is not None and has_unescaped(self.pattern, GLOB_CHARS)

    @property
    def braces(self) -> bool:
        return self.pattern is not None and "{" in self.pattern and len(self.alternatives()) > 1

    def alternatives(self) -> list[str]:
        """The brace expansion of the pattern (``{a,b}.txt`` → two patterns)."""
        if self.pattern is None:
            return []
        if "{" not in self.pattern:
            return [self.pattern]
        try:
            return expand_braces(self.pattern)
        except PatternError:
            return [self.pattern]


NOT_STATIC = Word(None)
SPLITS = Word(None, splits=True)


def node_text(src: bytes, n: Node) -> str:
    return src[n.start_byte:n.end_byte].decode("utf-8", "surrogateescape")


def _dquoted(text: str) -> str:
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def word_value(n: Node, src: bytes, quoted: bool = False) -> Word:
    """The value of an argument node (see :class:`Word`)."""
    t = n.type
    if t in ("word", "number"):
        raw = node_text(src, n)
        # unquoted: a backslash escape stays an escape in the pattern, every other character is live
        return Word(unescape(raw), raw)
    if t == "raw_string":
        return Word.literal(node_text(src, n)[1:-1])
    if t == "ansi_c_string":
        return Word.literal(ansi_c(node_text(src, n)[2:-1]))
    if t in ("string", "translated_string"):
        parts: list[str] = []
        for c in n.named_children:
            if c.type == "string_content":
                parts.append(_dquoted(node_text(src, c)))
            elif c.type == "string":
                inner = word_value(c, src, quoted=True)
                if inner.text is None:
                    return NOT_STATIC
                parts.append(inner.text)
            else:
                return NOT_STATIC  # an expansion inside quotes: one word, its value unknown
        return Word.literal("".join(parts))
    if t == "concatenation":
        values = [word_value(c, src, quoted) for c in n.children]
        if any(v.text is None for v in values):
            return Word(None, splits=any(v.splits for v in values))
        return Word("".join(v.text or "" for v in values), "".join(v.pattern or "" for v in values))
    if t in ("simple_expansion", "expansion", "command_substitution", "arithmetic_expansion"):
        return NOT_STATIC if quoted else SPLITS
    if t == "process_substitution":
        return Word.literal("/dev/fd/63")
    return SPLITS  # anything else (an array, an anonymous `$`…): unknown
