"""Built-in tools with Claude Code's names, input schemas and result texts, and the registry."""

from __future__ import annotations

from agentfsm.tools.agent import AgentTool
from agentfsm.tools.base import (
    FileAccess,
    NoFileRules,
    Tool,
    ToolContext,
    ToolError,
    ToolOutput,
    ValidationResult,
    tool,
)
from agentfsm.tools.bash import BashTool, is_read_only_command
from agentfsm.tools.edit import EditTool
from agentfsm.tools.glob import GlobTool
from agentfsm.tools.grep import GrepTool
from agentfsm.tools.read import ReadTool
from agentfsm.tools.registry import ToolRegistry
from agentfsm.tools.structured_output import StructuredOutputTool
from agentfsm.tools.task_stop import TaskStopTool
from agentfsm.tools.write import WriteTool


def builtin_tools() -> list[Tool]:
    """Fresh instances of the built-in tools, in the order the model is shown them."""
    return [
        # The Agent tool (a subagent running its own loop) goes first, as in Claude Code.
        AgentTool(),
        BashTool(),
        GlobTool(),
        GrepTool(),
        ReadTool(),
        EditTool(),
        WriteTool(),
        # stops what Bash and Agent started in the background
        TaskStopTool(),
    ]


__all__ = [
    "AgentTool",
    "BashTool",
    "EditTool",
    "FileAccess",
    "GlobTool",
    "GrepTool",
    "NoFileRules",
    "ReadTool",
    "StructuredOutputTool",
    "TaskStopTool",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "ToolRegistry",
    "ValidationResult",
    "WriteTool",
    "builtin_tools",
    "is_read_only_command",
    "tool",
]
