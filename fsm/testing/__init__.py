"""agentfsm's public testing kit: a scripted model (in-process and as a loopback Messages server
speaking real SSE), the scenario format, the canonical form requests are compared in, and pytest fixtures.

Names are imported on first use: the pytest plugin (``agentfsm.testing.plugin``) may be loaded in a pytest
run, and importing this package must not pull in the engine for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    # scenario format
    "Scenario": "scenario",
    "Response": "scenario",
    "StreamedResponse": "scenario",
    "HttpErrorResponse": "scenario",
    "SseError": "scenario",
    "Block": "scenario",
    "TextBlock": "scenario",
    "ToolUseBlock": "scenario",
    "ThinkingBlock": "scenario",
    "RawToolJsonBlock": "scenario",
    "ScenarioError": "scenario",
    "WireEvent": "scenario",
    "EXHAUSTED_TEXT": "scenario",
    "WORKSPACE_FILES": "scenario",
    "load_scenario": "scenario",
    "parse_response": "scenario",
    "response_events": "scenario",
    "final_message": "scenario",
    "text_response": "scenario",
    "tool_response": "scenario",
    "exhausted_response": "scenario",
    "populate_workspace": "scenario",
    "embedded_scenario_path": "scenario",
    "load_embedded_scenario": "scenario",
    # in-process model
    "ScriptedModel": "scripted",
    "ResponseSource": "scripted",
    "ResponseFactory": "scripted",
    "stream_error": "scripted",
    # loopback server
    "ScriptedServer": "server",
    "request_from_body": "server",
    # canonical form
    "canonical_request": "canonical",
    "canonical_requests": "canonical",
    "canonical_result": "canonical",
    "canonical_run": "canonical",
    "load_bodies": "canonical",
    # fixtures' helpers
    "find_reference_dir": "plugin",
    # property testing (hypothesis is imported only when one of these is used)
    "AgentLoopStateMachine": "stateful",
    "LoopHarness": "stateful",
    "LoopRun": "stateful",
    "run_loop": "stateful",
    "assert_invariants": "stateful",
    "invariant_violations": "stateful",
    "model_behaviours": "strategies",
    "model_responses": "strategies",
    "tool_inputs": "strategies",
    "inputs_from_schema": "strategies",
}

__all__ = [
    "EXHAUSTED_TEXT",
    "WORKSPACE_FILES",
    "Block",
    "HttpErrorResponse",
    "RawToolJsonBlock",
    "Response",
    "ResponseFactory",
    "ResponseSource",
    "Scenario",
    "ScenarioError",
    "ScriptedModel",
    "ScriptedServer",
    "SseError",
    "StreamedResponse",
    "TextBlock",
    "ThinkingBlock",
    "ToolUseBlock",
    "WireEvent",
    "canonical_request",
    "canonical_requests",
    "canonical_result",
    "canonical_run",
    "embedded_scenario_path",
    "exhausted_response",
    "final_message",
    "find_reference_dir",
    "load_bodies",
    "load_embedded_scenario",
    "load_scenario",
    "parse_response",
    "populate_workspace",
    "request_from_body",
    "response_events",
    "stream_error",
    "text_response",
    "tool_response",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentfsm.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agentfsm.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from agentfsm.testing.canonical import (
        canonical_request,
        canonical_requests,
        canonical_result,
        canonical_run,
        load_bodies,
    )
    from agentfsm.testing.plugin import find_reference_dir
    from agentfsm.testing.scenario import (
        EXHAUSTED_TEXT,
        WORKSPACE_FILES,
        Block,
        HttpErrorResponse,
        RawToolJsonBlock,
        Response,
        Scenario,
        ScenarioError,
        SseError,
        StreamedResponse,
        TextBlock,
        ThinkingBlock,
        ToolUseBlock,
        WireEvent,
        embedded_scenario_path,
        exhausted_response,
        final_message,
        load_embedded_scenario,
        load_scenario,
        parse_response,
        populate_workspace,
        response_events,
        text_response,
        tool_response,
    )
    from agentfsm.testing.scripted import ResponseFactory, ResponseSource, ScriptedModel, stream_error
    from agentfsm.testing.server import ScriptedServer, request_from_body
