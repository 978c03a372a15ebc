"""Text from outside is data: JSON lines and text that survive lone surrogates, and request bodies
that never carry one.

A lone UTF-16 surrogate (``"\\ud83d"`` in the model's JSON, a file name that is not UTF-8 decoded by
``os.fsdecode``) is a valid Python string that UTF-8 cannot encode. Written as is, it crashed the run
at the first file write; sent as is, it made the request itself unencodable.

* :func:`json_line` escapes it: inside a JSON string ``\\ud83d`` is an escape, so the line is valid
  UTF-8 JSON and reads back as the very same string (the session file keeps what happened).
* :func:`scrub` replaces it with U+FFFD for the wire (the API wants well-formed text).
* :func:`printable` escapes it in plain text.
"""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def json_line(obj: Any) -> str:
    """``obj`` as one line of JSON (non-ASCII kept), safe to encode as UTF-8 whatever it holds."""
    return printable(json.dumps(obj, ensure_ascii=False, default=str))


def printable(text: str) -> str:
    """``text`` with each lone surrogate written as its ``\\uXXXX`` escape."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def scrub(obj: Any) -> Any:
    """``obj`` (strings, lists, dicts of them) with every lone surrogate replaced by U+FFFD."""
    if isinstance(obj, str):
        return obj if obj.isascii() or not _SURROGATE.search(obj) else _SURROGATE.sub("\ufffd", obj)
    if isinstance(obj, dict):
        return {scrub(k): scrub(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub(v) for v in obj]
    return obj
