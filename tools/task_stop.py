"""TaskStop: stop a background task of the session (Claude Code's TaskStop, formerly KillShell).

The tool validates and formats; the session's task registry (``ctx.services[TASKS]``, a
:class:`agentfsm.tools.base.TaskHost`) stops the task. Claude Code 2.1.332 accepts ``task_id`` and
the deprecated ``shell_id`` (KillShell's parameter), answers with a JSON object naming the task, and
with ``No task found with ID: …`` for an id no running task has (tests/fixtures/background/task_stop).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentfsm.tools.base import TASKS, TaskHost, Tool, ToolContext, ToolError, ToolOutput, ValidationResult


def _task_id(input: Mapping[str, Any]) -> str | None:
    for key in ("task_id", "shell_id"):
        value = input.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


class TaskStopTool(Tool):
    name = "TaskStop"
    aliases = ("KillShell",)
    description = (
        "- Stops a running background task by its ID (a command run in the background, or a background agent)\n"
        "- Takes a task_id parameter identifying the task to stop\n"
        "- Returns a success or failure status")
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "task_id": {"type": "string", "description": "The ID of the background task to stop."},
            "shell_id": {"type": "string", "description": "Deprecated: use task_id instead"},
        },
        "additionalProperties": False,
    }

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return True

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        # it only ends work this session's model started itself; nothing of the workspace changes
        return True

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        return _task_id(input)

    def task_target(self, input: Mapping[str, Any]) -> str | None:
        return _task_id(input)

    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        if _task_id(input) is None:
            return ValidationResult.invalid("Missing required parameter: task_id")
        return ValidationResult.valid()

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        task_id = _task_id(input)
        host: TaskHost | None = ctx.services.get(TASKS)
        if task_id is None or host is None:
            raise ToolError(f"No task found with ID: {task_id or ''}")
        stopped = await host.stop(task_id)
        if stopped is None:
            raise ToolError(f"No task found with ID: {task_id}")
        return ToolOutput(json.dumps({"message": f"Successfully stopped task: {stopped.task_id} ({stopped.command})",
                                      "task_id": stopped.task_id, "task_type": stopped.task_type,
                                      "command": stopped.command}, ensure_ascii=False, separators=(",", ":")))
