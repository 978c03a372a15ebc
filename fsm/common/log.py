"""Logging for the loop: loggers that follow the host's structlog configuration, and the CLI's set-up.

Library code only *gets* loggers (:func:`get_logger`); it never configures structlog. When the host
application configured structlog, agentfsm's events go through the host's processors like its own;
when nobody did, they are dropped (structlog's default would print them to stdout, which belongs
to the headless protocol). Only the CLI calls :func:`configure`: JSON lines to the session's log
file, or a console rendering to stderr with ``--debug``."""

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
            # lives as long as logging does; a lone surrogate in an event is escaped, never fatal
            _sink = open(file, "a", encoding="utf-8", errors="backslashreplace")
        else:
            _sink = sys.stderr
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.WriteLoggerFactory(file=_sink),
        cache_logger_on_first_use=False,
    )


def _config_key() -> tuple[Any, ...]:
    """The configuration's objects, through structlog's public ``get_config()`` (the objects
    themselves, not copies): a reconfiguration replaces at least one of them."""
    cfg = structlog.get_config()
    return (cfg["wrapper_class"], cfg["processors"], cfg["logger_factory"], cfg["context_class"])


class ModuleLogger:
    """A module-level logger that builds its bound logger once per structlog configuration.

    ``structlog.get_logger()`` returns a lazy proxy that, with ``cache_logger_on_first_use`` off,
    assembles a new bound logger on *every* call (~4 µs, even when the level filter then drops the
    event); turning caching on instead would pin whatever configuration was current at first use,
    and the CLI reconfigures after the session exists. This one rebuilds only when the configuration
    objects changed (``configure()``, ``structlog.configure``, ``capture_logs`` all replace or
    keep-and-mutate them), so a dropped event costs one tuple compare and a no-op call."""

    __slots__ = ("_context", "_key", "_logger", "_name")

    def __init__(self, name: str, **context: Any) -> None:
        self._name = name
        self._context = context
        self._key: tuple[Any, ...] | None = None
        self._logger: Any = None

    def _current(self) -> Any:
        if not structlog.is_configured():
            return _DROP  # nobody configured logging: drop, without configuring anything globally
        key = _config_key()
        if key != self._key or self._logger is None:
            self._logger = structlog.get_logger(self._name).bind(**self._context)
            self._key = key
        return self._logger

    def is_enabled_for(self, level: int) -> bool:
        """Whether an event at ``level`` would be processed now: lets a caller skip building the
        arguments of a log line nobody will see."""
        check = getattr(self._current(), "is_enabled_for", None)
        return True if check is None else bool(check(level))

    def bind(self, **values: Any) -> Any:
        return self._current().bind(**values)

    def debug(self, event: str, **kw: Any) -> Any:
        return self._current().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> Any:
        return self._current().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> Any:
        return self._current().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> Any:
        return self._current().error(event, **kw)

    def exception(self, event: str, **kw: Any) -> Any:
        return self._current().exception(event, **kw)


def get_logger(name: str, **context: Any) -> ModuleLogger:
    """The logger for a module's ``log = get_logger(...)``, or an object's long-lived logger with
    its ``context`` bound (see :class:`ModuleLogger`): unlike ``structlog.get_logger().bind()``
    it follows a later :func:`configure`."""
    return ModuleLogger(name, **context)


class _Drop:
    """What a logger is while nobody configured logging: every event dropped, nothing formatted."""

    def bind(self, **_values: Any) -> _Drop:
        return self

    def is_enabled_for(self, _level: int) -> bool:
        return False

    def _drop(self, _event: str, **_kw: Any) -> None:
        return None

    debug = info = warning = error = exception = critical = _drop


_DROP = _Drop()
_PROBE = ModuleLogger("agentfsm")
