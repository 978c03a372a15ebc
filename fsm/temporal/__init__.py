"""Durable, distributed sessions on Temporal: the declared machine runs in a workflow, I/O in activities.

One session run is one workflow execution (:mod:`agentfsm.temporal.workflow`). The workflow holds the
:class:`agentfsm.machine.state.LoopState` and fires the declared machine (:func:`agentfsm.machine.graph.advance`) on
every event, exactly as the local driver does; everything with side effects — model calls (streamed,
with heartbeats), tool calls, hooks, compaction, the session file — is an activity
(:mod:`agentfsm.temporal.activities`) doing the same phase work as the driver
(:mod:`agentfsm.runtime.phases`, :func:`agentfsm.runtime.pipeline.run_tool_call`). The workflow history is the
session's durable record; the session file is still written, by the workflow, and audits like a
local one.

Imported only for ``agentfsm worker``, ``agentfsm batch`` and ``agentfsm -p … --temporal``: the plain
``-p`` path never loads ``temporalio``. Install with ``pip install 'agentfsm[temporal]'``.
"""

from __future__ import annotations

DEFAULT_TASK_QUEUE = "agentfsm"
ENV_ADDRESS = "AGENTFSM_TEMPORAL"
WORKFLOW_NAME = "AgentSession"
# the error type of activity failures no retry can mend (bad settings, a session file other workers
# cannot see)
NON_RETRYABLE = "agentfsm.NonRetryable"


def workflow_id(session_id: str) -> str:
    """The id of the workflow that runs session ``session_id`` (one run at a time; a resumed session
    is a new run of the same id)."""
    return f"agentfsm-session-{session_id}"
