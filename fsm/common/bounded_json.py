"""JSON from the model, parsed within bounds: a tool input is a JSON object of limited size and depth.

The model's tool input arrives as ``input_json_delta`` text. ``json.loads`` recurses once per level
of nesting, so 100,000 nested arrays raised ``RecursionError`` (not a ``JSONDecodeError``) and ended
the run without a ``tool_result``; a value that parses at a depth just under the interpreter's limit
would still break everything after it that walks the value (schema validation, the session file, the
next request body). A 5,000-digit number raised ``ValueError`` (Python's integer-string limit). So the
text is measured before it is parsed, and every way the parse can fail is one answer: the input is
malformed, with a reason the model can act on, like any other invalid tool input.

The depth is read off the text in linear time at C speed: escapes and strings are blanked out (a
bracket inside a string is data), the brackets left are turned into +1/-1 steps and their running sum's maximum is
the nesting depth (an upper bound for text that is not valid JSON, which fails to parse anyway).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

import attrs

#: Deepest nesting of objects and arrays a tool input may have. Real tool inputs nest a handful of
#: levels; the bound leaves every recursive walk after the parse (validation, coercion, encoding)
#: far from the interpreter's recursion limit.
MAX_DEPTH = 64
#: Largest tool input, in characters of JSON text (a file written whole fits many times over).
MAX_CHARS = 16 * 1024 * 1024

# Escapes go first (an escaped quote does not end a string); a string is then a quote, no quotes, a
# quote. Both patterns are linear: no group repeats, so nothing backtracks more than once.
_ESCAPE = re.compile(r"\\.", re.DOTALL)
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


@attrs.frozen
class JsonBounds:
    """How deep and how large a value may be."""

    max_depth: int = MAX_DEPTH
    max_chars: int = MAX_CHARS


DEFAULT_BOUNDS = JsonBounds()


class InputRejected(ValueError):
    """The text is not a JSON object within the bounds; ``str()`` says why, for the model (a
    phrase without a final stop: the caller appends what it echoes of the text)."""


def nesting_depth(text: str) -> int:
    """How deeply the arrays and objects of ``text`` nest (0 for a scalar); brackets inside
    strings do not count."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", _ESCAPE.sub("", text)))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_object(text: str, bounds: JsonBounds = DEFAULT_BOUNDS) -> dict[str, Any]:
    """``text`` as a JSON object (empty text is ``{}``); :class:`InputRejected` for text that is
    too large, too deep, not JSON or not an object. Never raises anything else."""
    if len(text) > bounds.max_chars:
        raise InputRejected(f"The tool input is larger than {bounds.max_chars} characters of JSON")
    if not text.strip():
        return {}
    depth = nesting_depth(text)
    if depth > bounds.max_depth:
        raise InputRejected(f"The tool input nests arrays and objects {depth} levels deep (at most "
                            f"{bounds.max_depth} are accepted)")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, the integer-digits limit
        raise InputRejected("The tool input is not valid JSON") from exc
    if not isinstance(value, dict):
        raise InputRejected(f"The tool input is a JSON {_JSON_TYPES.get(type(value), 'value')}, not an object")
    return value


def rejection(text: str, bounds: JsonBounds = DEFAULT_BOUNDS) -> str | None:
    """Why :func:`parse_object` refuses ``text``, or None if it accepts it."""
    try:
        parse_object(text, bounds)
    except InputRejected as exc:
        return str(exc)
    return None


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}
