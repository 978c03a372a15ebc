"""agentfsm: Claude Code's agent loop as an explicit, auditable finite-state machine.

The Python API (:mod:`agentfsm.api`) is exported here but imported on first use, so ``import agentfsm``
stays cheap (the CLI's subcommands and the pytest plugin import this package too)::

    async for msg in agentfsm.query("hello", options=agentfsm.Options(tools=("Read",))):
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "query": "agentfsm.api",
    "AgentClient": "agentfsm.api",
    "Options": "agentfsm.options",
    "AgentDefinition": "agentfsm.options",
    "Limits": "agentfsm.state",
    "Session": "agentfsm.session",
    "open_session": "agentfsm.resume",
}

__all__ = ["AgentClient", "AgentDefinition", "Limits", "Options", "Session", "__version__", "open_session",
           "query"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentfsm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from agentfsm.api import AgentClient, query
    from agentfsm.options import AgentDefinition, Options
    from agentfsm.resume import open_session
    from agentfsm.session import Session
    from agentfsm.state import Limits
