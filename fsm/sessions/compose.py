"""The composition root: what one session is built from — its tools and its gate (permission rules,
modes and hooks from Claude Code's settings). The one place the engine is wired to
:mod:`agentfsm.hooks`; it fails closed: settings that cannot be read, or hooks that cannot be loaded,
stop the session from being built rather than leaving it without its rules.
"""

from __future__ import annotations

from typing import Any

from agentfsm.machine.options import Options
from agentfsm.tools.schema import is_valid_schema


def build_registry(options: Options) -> Any:
    from agentfsm.tools import AgentTool, ToolRegistry, builtin_tools

    agent_types = {name: d.description for name, d in options.agents.items()}
    tools = [AgentTool(agent_types) if t.name == "Agent" else t for t in builtin_tools()]
    registry = ToolRegistry([*tools, *options.extra_tools])
    if options.tools is not None:
        registry = registry.subset([*options.tools, *(t.name for t in options.extra_tools)])
    # an invalid schema is left to the driver, which ends the turn `turn_setup_failed` saying why
    if options.json_schema is not None and is_valid_schema(options.json_schema):
        from agentfsm.tools.structured_output import StructuredOutputTool

        registry = ToolRegistry([*registry.tools(), StructuredOutputTool(options.json_schema)])
    return registry


def build_policy(options: Options, registry: Any, *, session_id: str, transcript_path: str) -> tuple[Any, Any]:
    """(gate, registry the model is shown): the session's :class:`agentfsm.hooks.HookGate` — it is both
    the tool gate and the loop's hooks — and the registry without the tools a bare deny rule hides.
    Raises :class:`agentfsm.hooks.SettingsError` for settings that cannot be used."""
    from agentfsm.hooks import build_gate

    gate = build_gate(options, session_id=session_id, transcript_path=transcript_path, registry=registry)
    return gate, gate.filter_registry(registry)
