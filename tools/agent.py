"""Agent: launch a subagent — a separate agent loop with its own messages, tools, limits, abort
controller, session file and query depth (Claude Code's Agent tool, formerly Task).

The tool itself only validates and formats; the host runs the subagent. It finds the runner in
``ctx.services["run_subagent"]``: an ``async (SubagentRequest) -> SubagentOutcome`` callable that
:class:`agentfsm.sessions.session.Session` provides to every tool of its loop. Two modes:

- background (the default, as in Claude Code 2.1.332): the call returns at once with a result naming
  the agent id; the session's task registry owns the run (:mod:`agentfsm.tasks`: TaskStop stops it)
  and, when it finishes, its ``<task-notification>`` reaches the parent through its input queue;
- foreground (``run_in_background: false``): the parent's tool call lasts as long as the subagent's
  run; its result is the subagent's final text (plus a short ``agentId``/usage trailer, as Claude
  Code writes it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from agentfsm.tools.base import InterruptBehavior, Tool, ToolContext, ToolError, ToolOutput, ValidationResult

GENERAL_PURPOSE = "general-purpose"
GENERAL_PURPOSE_DESCRIPTION = (
    "General-purpose agent for researching complex questions, searching for code and executing "
    "multi-step tasks.")
GENERAL_PURPOSE_PROMPT = (
    "You are an agent for agentfsm, a Claude-Code-compatible agent loop. Given the user's task, use "
    "the tools available to complete it fully — do not gold-plate, but do not leave it half done. "
    "When you are finished, reply with a concise report of what you did and what you found: it is "
    "returned to the agent that launched you, which will relay the relevant parts to the user.")

LAUNCHED_TEXT = (
    "Async agent launched successfully.\n"
    "agentId: {agent_id} (an internal ID for your use; do not mention it to the user)\n"
    "The agent is working in the background. You will be notified automatically when it completes "
    "(a <task-notification> message). Continue with other work that does not overlap with it, or end "
    "your turn to wait for the notification. Do not launch another agent for the same task.\n"
    "output_file: {output_file}\n"
    "It is the agent's own transcript: do not Read it to follow the agent; wait for the notification.")

SubagentRunner = Callable[["SubagentRequest"], Awaitable["SubagentOutcome"]]


@attrs.frozen
class SubagentRequest:
    """What the Agent tool asks the host to run. ``abort`` is the parent call's abort signal."""

    description: str
    prompt: str
    subagent_type: str
    background: bool = False
    tool_use_id: str = ""
    abort: asyncio.Event | None = attrs.field(default=None, eq=False)


@attrs.frozen
class SubagentOutcome:
    """How a subagent ended (foreground) or that it started (background: ``launched``)."""

    agent_id: str
    text: str = ""
    is_error: bool = False
    launched: bool = False
    num_turns: int = 0
    tool_uses: int = 0
    total_tokens: int = 0
    duration_ms: int = 0
    cost_usd: float = 0.0
    transcript_path: str = ""


def builtin_agents() -> dict[str, tuple[str, str]]:
    """The built-in subagent types: name -> (description, system prompt)."""
    return {GENERAL_PURPOSE: (GENERAL_PURPOSE_DESCRIPTION, GENERAL_PURPOSE_PROMPT)}


class AgentTool(Tool):
    """``agents`` maps extra subagent types to their description (shown to the model)."""

    name = "Agent"
    aliases = ("Task",)
    input_schema = {
        "type": "object",
        "properties": {
            "description": {"type": "string", "description": "A short (3-5 word) description of the task"},
            "prompt": {"type": "string", "description": "The task for the agent to perform"},
            "subagent_type": {"type": "string",
                              "description": "The type of specialized agent to use for this task"},
            "run_in_background": {"type": "boolean",
                                  "description": "Agents run in the background by default, and you are notified "
                                                 "when one completes. Set to false only when your next step "
                                                 "needs this agent's result and nothing else can be done "
                                                 "meanwhile."},
        },
        "required": ["description", "prompt", "subagent_type"],
        "additionalProperties": False,
    }

    def __init__(self, agents: Mapping[str, str] | None = None) -> None:
        types = {name: desc for name, (desc, _prompt) in builtin_agents().items()}
        types.update(agents or {})
        self.agent_types: dict[str, str] = types
        listing = "\n".join(f"- {name}: {desc}" for name, desc in types.items())
        self.description = (
            "Launch a new agent to handle complex, multi-step tasks autonomously. The agent runs its "
            "own loop with its own context: it sees only the prompt you give it, so make the prompt "
            "self-contained, and say what it should report back. Its final message is returned to you; "
            "it is not shown to the user.\n\nAvailable agent types:\n" + listing + "\n\n"
            "Launch several agents in one message to run them concurrently. With run_in_background "
            "the call returns at once and you are notified when the agent completes.")

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        # a subagent has its own context; the subagent's own tools are gated and ordered by its loop
        return True

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        # launching is harmless by itself: every tool the subagent calls passes its own permissions
        return True

    def interrupt_behavior(self) -> InterruptBehavior:
        return "cancel"

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        subject = input.get("subagent_type")
        return subject if isinstance(subject, str) else None

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        kind = input.get("subagent_type")
        if kind not in self.agent_types:
            return ValidationResult.invalid(
                f"Agent type '{kind}' not found. Available agents: {', '.join(self.agent_types)}")
        if not str(input.get("prompt", "")).strip():
            return ValidationResult.invalid("The agent prompt is empty: say what the agent should do.")
        return ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        runner: SubagentRunner | None = ctx.services.get("run_subagent")
        if runner is None:
            raise ToolError("Agent is not available here: this loop has no subagent runner.")
        request = SubagentRequest(description=str(input.get("description", "")), prompt=str(input["prompt"]),
                                  subagent_type=str(input["subagent_type"]),
                                  background=input.get("run_in_background", True) is not False,
                                  tool_use_id=ctx.tool_use_id, abort=ctx.abort)
        outcome = await runner(request)
        if outcome.launched:
            return ToolOutput(LAUNCHED_TEXT.format(agent_id=outcome.agent_id, output_file=outcome.transcript_path))
        if outcome.is_error:
            raise ToolError(f"Agent failed: {outcome.text}" if outcome.text else "Agent failed.")
        trailer = (f"agentId: {outcome.agent_id} (for reference; the agent has finished)\n"
                   f"<usage>total_tokens: {outcome.total_tokens}\ntool_uses: {outcome.tool_uses}\n"
                   f"duration_ms: {outcome.duration_ms}</usage>")
        return ToolOutput([{"type": "text", "text": outcome.text or "(the agent returned no text)"},
                           {"type": "text", "text": trailer}])
