"""What crosses the Temporal boundary survives the trip: every loop state, event and result the real loop
reaches (drawn by the testing kit) comes back equal from the payload converter, and the workflow's
record digests agree with what an activity reads back from a session file. No server needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

pytest.importorskip("temporalio", reason="the Temporal extra is not installed: pip install 'agentfsm[temporal]'")

from agentfsm.machine.events import from_record
from agentfsm.runtime.pipeline import CallResult
from agentfsm.runtime.trace import read_records
from agentfsm.temporal.activities import _MessageIndex
from agentfsm.temporal.convert import DATA_CONVERTER
from agentfsm.temporal.records import (
    AccountSnapshot,
    Carried,
    MessageRef,
    RunSetup,
    ToolCallOutcome,
    message_digest,
)
from agentfsm.testing.stateful import run_loop
from agentfsm.testing.strategies import model_behaviours
from agentfsm.tools.base import tool


@tool("Echo", "Echoes its text.", {"type": "object", "required": ["text"], "additionalProperties": False,
                                   "properties": {"text": {"type": "string"}}}, concurrency_safe=True)
async def echo(inp: Any, ctx: Any) -> str:
    return str(inp["text"])


def trip(value: Any, hint: Any) -> Any:
    converter = DATA_CONVERTER.payload_converter
    [payload] = converter.to_payloads([value])
    return converter.from_payloads([payload], [hint])[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=model_behaviours([echo]))
def test_every_state_the_loop_reaches_survives_the_trip(script: Any) -> None:
    run = run_loop(script, tools=[echo])
    setup = RunSetup(system=({"type": "text", "text": "s"},), tool_names=("Echo",), static_tokens=1,
                     permission_mode="default", init={"type": "system"}, first=run.state.messages[0])
    carried = Carried(state=run.state, setup=setup, account=AccountSnapshot(usage=dict(run.result.usage)), seq=9,
                      recorded={}, requests=2, out_base=0, out_tail=(run.result.to_dict(),), started=0.0)
    assert trip(carried, Carried) == carried
    for rec in run.records:
        if rec.get("type") == "transition" and "event" in rec:
            event = from_record(rec["event"])
            assert trip(event, type(event)) == event
    for message in run.state.messages:
        ref = MessageRef(message.uuid, message=message)
        assert trip(ref, MessageRef) == ref


def test_a_tool_outcome_keeps_its_order_and_fields() -> None:
    block = {"type": "tool_result", "tool_use_id": "t1", "content": "ok", "is_error": True}
    outcome = ToolCallOutcome(CallResult("t1", "Bash", block, is_error=True, tool_input={"command": "x"},
                                         permission_denial={"tool_name": "Bash"}, cancel_reason="worker_lost"),
                              {"/a": 1.5}, interrupted=True, attempt=2)
    back = trip(outcome, ToolCallOutcome)
    assert back == outcome
    assert list(back.result.block) == ["type", "tool_use_id", "content", "is_error"]  # not sorted


def test_the_recorded_digest_is_what_the_index_reads_back(tmp_path: Path) -> None:
    """A message the workflow recorded is found by its digest in the file; a changed one is not."""
    from agentfsm.machine.state import Message
    from agentfsm.runtime.trace import TraceWriter

    path = tmp_path / "s.jsonl"
    writer = TraceWriter(path)
    msgs = [Message("user", "héllo"), Message("assistant", ({"type": "tool_use", "id": "t", "name": "X",
                                                            "input": {"b": 1, "a": [1, 2]}},), kind="assistant")]
    for m in msgs:
        writer.message(m)
    writer.close()
    index = _MessageIndex(path)
    index.refresh()
    for rec, m in zip((r for r in read_records(path) if r["type"] == "message"), msgs, strict=True):
        digest = message_digest(rec["role"], rec["kind"], rec["content"])
        assert index.get(MessageRef(m.uuid, digest)) == m
        assert index.get(MessageRef(m.uuid, digest[::-1])) is None
    # appended later: read incrementally
    with open(path, "a") as fh:
        fh.write(json.dumps({"type": "message", "seq": 9, "uuid": "u3", "role": "user", "kind": "prompt",
                             "content": [{"type": "text", "text": "x"}]}) + "\n")
    index.refresh()
    assert index.get(MessageRef("u3", message_digest("user", "prompt", [{"type": "text", "text": "x"}]))) is not None


def test_appending_the_session_file_is_idempotent_across_workers(tmp_path: Path) -> None:
    """A workflow task lost with its worker runs its local activities again on another worker: lines
    already in the file are skipped, whichever worker wrote them; a torn last line is healed first."""
    import asyncio

    from agentfsm.temporal.activities import Activities
    from agentfsm.temporal.records import TraceBatch

    path = tmp_path / "s.jsonl"

    def lines(seqs: range) -> tuple[tuple[int, str], ...]:
        return tuple((i, json.dumps({"type": "x", "seq": i})) for i in seqs)

    a, b = Activities(), Activities()
    assert asyncio.run(a.append_trace(TraceBatch(str(path), lines(range(0, 3))))) == 3
    assert asyncio.run(b.append_trace(TraceBatch(str(path), lines(range(3, 6))))) == 3
    assert asyncio.run(a.append_trace(TraceBatch(str(path), lines(range(3, 8))))) == 2  # A's view was stale
    with open(path, "a") as fh:
        fh.write('{"type": "x", "seq": 8, "torn')
    assert asyncio.run(b.append_trace(TraceBatch(str(path), lines(range(8, 10))))) == 2
    assert [r["seq"] for r in read_records(path)] == list(range(10))


def test_payloads_leave_defaults_out_but_carry_what_the_workflow_decides_by_whole() -> None:
    """Defaults are not repeated in every activity input; a session's Limits and Timing and a continued
    run's state are always written out (a default changed by a later release must not change an
    in-flight session on replay); a payload written with every field (as before) still decodes."""
    import cattrs

    from agentfsm.machine.state import Limits
    from agentfsm.temporal.records import ModelCallInput, SessionInput, SessionSpec, Timing

    converter = DATA_CONVERTER.payload_converter
    spec = SessionSpec(session_id="s", cwd="/w", model="m")
    inp = SessionInput(spec, ({"type": "text", "text": "go"},))
    [payload] = converter.to_payloads([inp])
    data = json.loads(payload.data)
    assert data["spec"]["limits"] == cattrs.Converter().unstructure(Limits())
    assert data["timing"] == cattrs.Converter().unstructure(Timing())
    assert "sandbox" not in data["spec"] and "resume_path" not in data and "carried" not in data
    call = ModelCallInput(spec, "wf", "run", 0, "m", (), ())
    [small] = converter.to_payloads([call])
    assert "live" not in json.loads(small.data) and "lines" not in json.loads(small.data)
    assert trip(inp, SessionInput) == inp and trip(call, ModelCallInput) == call
    full = converter.from_payloads([converter.to_payloads([cattrs.Converter().unstructure(inp)])[0]], [SessionInput])
    assert full == [inp]
