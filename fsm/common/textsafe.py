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
import threading
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


# one encoder for every record: json.dumps with arguments builds a new JSONEncoder per call, which
# cost a fifth of serialising a typical session-file record
_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)
# ... and JSONEncoder.encode builds its C encoder again on every call (the session file writes about
# ten records a turn): the same C encoder, with the same settings, is built once per thread (its
# circular-reference markers are its own state; emptied again after a failed call, a successful
# one leaves them empty).
_LOCAL = threading.local()


def _c_encoder() -> Any:
    markers: dict[int, Any] = {}
    enc = json.encoder.c_make_encoder(
        markers, _ENCODER.default, json.encoder.encode_basestring, _ENCODER.indent, _ENCODER.key_separator,
        _ENCODER.item_separator, _ENCODER.sort_keys, _ENCODER.skipkeys, _ENCODER.allow_nan)
    _LOCAL.encoder = enc, markers
    return enc, markers


def _encode(obj: Any) -> str:
    if json.encoder.c_make_encoder is None or isinstance(obj, str):  # JSONEncoder.encode's own path
        return _ENCODER.encode(obj)
    enc, markers = getattr(_LOCAL, "encoder", None) or _c_encoder()
    try:
        return "".join(enc(obj, 0))
    except BaseException:
        markers.clear()
        raise


def json_text(obj: Any) -> str:
    """``obj`` as compact JSON, non-ASCII kept (``json.dumps(obj, ensure_ascii=False, default=str)``)."""
    return _encode(obj)


def json_line(obj: Any) -> str:
    """``obj`` as one line of JSON (non-ASCII kept), safe to encode as UTF-8 whatever it holds."""
    return printable(_encode(obj))


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
