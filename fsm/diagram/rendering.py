"""SVG and PNG from DOT, through Graphviz: the ``dot`` program when it is on ``PATH``, else ``pygraphviz``
(whose manylinux wheels bundle the Graphviz libraries, so ``pip install pygraphviz`` is enough).

Layout and font metrics vary between Graphviz builds, so rendered bytes are never compared; instead
every SVG and PNG carries the SHA-256 of the DOT source it was rendered from (an XML comment in the
SVG, a ``tEXt`` chunk in the PNG), and ``agentfsm diagram --check`` compares that stamp — the same
verdict on every machine, renderer or not. A graph that says ``layout=nop2`` carries its own positions
and is drawn as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from typing import IO

STAMP_KEY = "agentfsm-dot-sha256"
_SVG_STAMP = re.compile(rb"<!-- agentfsm-dot-sha256: ([0-9a-f]{64}) -->")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FORMATS = ("svg", "png")


class DiagramError(RuntimeError):
    """Rendering failed, or no Graphviz renderer is installed."""


def renderer() -> str | None:
    """``"dot"`` or ``"pygraphviz"`` — whichever will render — or None."""
    if shutil.which("dot"):
        return "dot"
    try:
        import pygraphviz  # noqa: F401
    except ImportError:
        return None
    return "pygraphviz"


def dot_digest(dot: str) -> str:
    return hashlib.sha256(dot.encode()).hexdigest()


def stamp_of(data: bytes) -> str | None:
    """The DOT digest an SVG or PNG from :func:`render` was rendered from."""
    if data.startswith(_PNG_MAGIC):
        for kind, body in _png_chunks(data):
            if kind == b"tEXt" and body.startswith(STAMP_KEY.encode() + b"\x00"):
                return body.split(b"\x00", 1)[1].decode(errors="replace")
        return None
    m = _SVG_STAMP.search(data)
    return m.group(1).decode() if m else None


@contextlib.contextmanager
def _captured_stderr_fd() -> Iterator[IO[bytes]]:
    """Redirect file descriptor 2 into a temporary file: pygraphviz's bundled fontconfig prints
    configuration warnings straight to fd 2 (sys.stderr never sees them) on newer Debian fontconfig
    setups; they are noise for a successful render and part of the error otherwise."""
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield tmp
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _engine(dot: str) -> str:
    m = re.search(r"\blayout=\"?(\w+)", dot)
    return m.group(1) if m else "dot"


def render(dot: str, fmt: str) -> bytes:
    """Render DOT to ``svg`` or ``png``, stamped with the source's digest."""
    if fmt not in FORMATS:
        raise DiagramError(f"cannot render {fmt!r}: Graphviz renders {', '.join(FORMATS)}")
    which = renderer()
    if which == "dot":
        proc = subprocess.run([shutil.which("dot") or "dot", f"-T{fmt}"], input=dot.encode(),
                              capture_output=True, check=False, timeout=60)
        if proc.returncode != 0:
            detail = proc.stderr.decode(errors="replace")
            raise DiagramError(f"dot -T{fmt} failed ({proc.returncode}): {detail}")
        data = proc.stdout
    elif which == "pygraphviz":
        import pygraphviz

        with _captured_stderr_fd() as err:
            try:
                data = pygraphviz.AGraph(string=dot).draw(format=fmt, prog=_engine(dot))
            except Exception as exc:  # pygraphviz raises several types; all mean the same here
                err.seek(0)
                detail = err.read().decode(errors="replace")
                raise DiagramError(f"pygraphviz failed: {exc}\n{detail}") from exc
    else:
        raise DiagramError("no Graphviz renderer: `pip install 'agentfsm[diagrams]'` (pygraphviz, whose wheels "
                           "include Graphviz) or install Graphviz's `dot` program")
    assert isinstance(data, bytes)
    return _stamp_png(data, dot_digest(dot)) if fmt == "png" else _stamp_svg(data, dot_digest(dot))


def _stamp_svg(svg: bytes, digest: str) -> bytes:
    at = svg.find(b"<svg")
    if at < 0:
        raise DiagramError("the renderer returned no <svg> element")
    return svg[:at] + f"<!-- {STAMP_KEY}: {digest} -->\n".encode() + svg[at:]


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    at = len(_PNG_MAGIC)
    while at + 8 <= len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        yield kind, data[at + 8:at + 8 + length]
        at += 12 + length


def _stamp_png(png: bytes, digest: str) -> bytes:
    if not png.startswith(_PNG_MAGIC):
        raise DiagramError("the renderer returned no PNG")
    body = STAMP_KEY.encode() + b"\x00" + digest.encode()
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    ihdr_end = len(_PNG_MAGIC) + 8 + 13 + 4  # the IHDR chunk comes first and is 13 bytes long
    return png[:ihdr_end] + chunk + png[ihdr_end:]


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels of a PNG."""
    if not png.startswith(_PNG_MAGIC):
        raise DiagramError("not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)
