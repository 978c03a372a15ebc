"""structlog set-up. stdout belongs to the headless protocol, so logs go to a file (JSON lines) or to
stderr (console rendering); when nobody listens, the filtering logger drops events before any
formatting happens."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import IO, Any

import structlog

_sink: IO[str] | None = None


def configure(mode: str = "off", *, file: Path | None = None, level: str = "info") -> None:
    """``mode``: ``off`` (drop everything), ``json`` (JSON lines to ``file`` or stderr), ``console``
    (human-readable to stderr). Safe to call again; the last call wins."""
    global _sink
    if _sink is not None and _sink not in (sys.stderr, sys.stdout):
        _sink.close()
    _sink = None
    if mode == "off":
        # the loop never logs at CRITICAL, so this drops every event before any formatting
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
                            processors=[], cache_logger_on_first_use=False)
        return
    lvl = getattr(logging, level.upper(), logging.INFO)
    shared: list[Any] = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                         structlog.processors.TimeStamper(fmt="iso", utc=True)]
    if mode == "console":
        _sink = sys.stderr
        renderer: Any = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            _sink = open(file, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as logging does
        else:
            _sink = sys.stderr
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.WriteLoggerFactory(file=_sink),
        cache_logger_on_first_use=False,
    )


def ensure_configured() -> None:
    """Library use: never let structlog's default (printing to stdout) through."""
    if not structlog.is_configured():
        configure("off")
