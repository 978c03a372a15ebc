"""Upgrading workers while sessions are in flight: a workflow history recorded by the code before a
change replays on today's code (temporalio's Replayer, no server needed). The fixture
``tests/fixtures/temporal/session_before_issue34.json`` is a session recorded before issue 34's
changes (two responses with tool calls: a Read and a read-only Bash in one batch, a writing Bash in
the next, then an answer; every tool call a remote activity, a session-file flush before each model
call). Today's code takes the old path for it (``workflow.patched``), so a worker upgraded while such a
session runs finishes it instead of failing it with a non-determinism error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the Temporal extra is not installed: pip install 'agentfsm[temporal]'")

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from agentfsm.temporal.convert import DATA_CONVERTER
from agentfsm.temporal.worker import PASSTHROUGH
from agentfsm.temporal.workflow import FEWER_TASKS, SessionWorkflow

FIXTURES = Path(__file__).parent / "fixtures" / "temporal"


def _history(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json("recorded", json.loads((FIXTURES / name).read_text()))


@pytest.mark.parametrize("sandbox", [True, False])
async def test_a_history_recorded_before_the_change_replays(sandbox: bool) -> None:
    history = _history("session_before_issue34.json")
    kinds = [e.WhichOneof("attributes") for e in history.events]
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    # what makes it the old shape: every tool call a remote activity, and no version marker
    assert scheduled.count("agentfsm.run_tool") == 3 and scheduled.count("agentfsm.call_model") == 3
    assert not any(FEWER_TASKS.encode() in e.SerializeToString() for e in history.events)
    assert "marker_recorded_event_attributes" in kinds
    runner = (SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH))
              if sandbox else None)
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=DATA_CONVERTER,
                        **({"workflow_runner": runner} if runner else {}))
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_the_old_history_on_the_new_path_is_a_non_determinism_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: the same history replayed with the change taken unconditionally (as
    without the version check) does not match the commands the new code issues."""
    import agentfsm.temporal.workflow as wf

    monkeypatch.setattr(wf.workflow, "patched", lambda _id: True)
    from temporalio.worker import UnsandboxedWorkflowRunner

    replayer = Replayer(workflows=[SessionWorkflow], data_converter=DATA_CONVERTER,
                        workflow_runner=UnsandboxedWorkflowRunner())
    result = await replayer.replay_workflow(_history("session_before_issue34.json"), raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()
