"""agentfsm: Claude Code's agent loop as an explicit, auditable finite-state machine.

The Python API (:mod:`agentfsm.api`) is exported here but imported on first use, so ``import agentfsm``
stays cheap (the CLI's subcommands and the pytest plugin import this package too)::

    async for msg in agentfsm.query("hello", options=agentfsm.Options(tools=("Read",))):
        ...
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "query": "agentfsm.api",
    "AgentClient": "agentfsm.api",
    "Options": "agentfsm.machine.options",
    "AgentDefinition": "agentfsm.machine.options",
    "Limits": "agentfsm.machine.state",
    "Session": "agentfsm.sessions.session",
    "open_session": "agentfsm.sessions.resume",
}

__all__ = ["AgentClient", "AgentDefinition", "Limits", "Options", "Session", "__version__", "open_session",
           "query"]


def __getattr__(name: str) -> Any:
    if name in _MOVED:  # an old module path read as an attribute (scripts/relayout.py)
        new = f"{__name__}.{_MOVED[name]}.{name}"
        warnings.warn(f"{__name__}.{name} moved to {new}: import it from there", DeprecationWarning,
                      stacklevel=2)
        module = sys.modules.setdefault(f"{__name__}.{name}", importlib.import_module(new))
        globals()[name] = module
        return module
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
    from agentfsm.machine.options import AgentDefinition, Options
    from agentfsm.machine.state import Limits
    from agentfsm.sessions.resume import open_session
    from agentfsm.sessions.session import Session


# --- moved modules (written by scripts/relayout.py; do not edit) ---
# The modules that moved into the layer packages (scripts/relayout.py), by their old name: the old
# path stays importable, as the moved module itself (one module object under both names), with a
# DeprecationWarning that names the new path.
_MOVED: dict[str, str] = {
    "cli": "commandline",
    "control": "commandline",
    "demo": "commandline",
    "sdk_coverage": "commandline",
    "conform": "commandline",
    "audit": "auditing",
    "coverage": "auditing",
    "claude_code_audit": "auditing",
    "claude_code": "auditing",
    "checks": "auditing",
    "resume": "sessions",
    "session": "sessions",
    "subagents": "sessions",
    "compose": "sessions",
    "memory": "sessions",
    "claude_transcript": "sessions",
    "driver": "runtime",
    "runner": "runtime",
    "phases": "runtime",
    "executor": "runtime",
    "compact": "runtime",
    "signals": "runtime",
    "pipeline": "runtime",
    "trace": "runtime",
    "queue": "runtime",
    "result": "runtime",
    "assembler": "runtime",
    "request": "runtime",
    "ports": "runtime",
    "cost": "runtime",
    "tasks": "runtime",
    "transport": "llm",
    "model": "llm",
    "graph": "machine",
    "events": "machine",
    "prompts": "machine",
    "options": "machine",
    "state": "machine",
    "log": "common",
    "modes": "common",
    "textsafe": "common",
    "bounded_json": "common",
    "progress": "common",
    "weak": "common",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``agentfsm.<old>[.sub]`` for a moved module and loads it as the module at its new path."""

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec] = {}

    @staticmethod
    def new_name(name: str) -> str | None:
        parts = name.split(".")
        if len(parts) < 2 or parts[0] != __name__ or parts[1] not in _MOVED:
            return None
        return ".".join([parts[0], _MOVED[parts[1]], *parts[1:]])

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if self.new_name(name) else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        new = self.new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {new}: import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(str(new))
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        """The module is the moved one, already executed; it keeps its own spec (the import system
        gave it the old name's)."""
        module.__spec__ = self.specs.pop(module.__spec__.name, module.__spec__)



if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
# --- end of moved modules ---
