"""The project's own property suite: thousands of generated runs of the real loop, every one checked
against every docs/behaviour.md §3 invariant and audited (``agentfsm.testing.stateful.assert_invariants``).

Workloads (each a pytest test; their session files feed ``tests/test_coverage.py``):

* ``conversations`` — whole scripted conversations (``model_behaviours``: answers, valid and invalid
  tool calls, malformed calls, max_tokens, thinking-only, API errors, prompt-too-long, stream
  breaks) under random small limits, scripted Python hooks and sometimes a fallback model;
* ``tool_calls`` — one response of valid and invalid calls: each call gets the result its
  validity dictates (schema-invalid input and unknown tools never reach a tool);
* ``structured_output`` — ``--json-schema`` runs: a completed run always carries a valid answer;
* ``machine`` — :class:`agentfsm.testing.stateful.AgentLoopStateMachine` subclassed with this suite's
  tools and hook rules: several prompts on one session, input typed mid-run, interrupts.

Example counts scale with the hypothesis profile (``HYPOTHESIS_PROFILE=nightly`` runs ten times as
many; see ``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule, run_state_machine_as_test

from agentfsm.hooks import HookBlockingError, HookMatcher
from agentfsm.machine import prompts
from agentfsm.machine.options import Options
from agentfsm.machine.prompts import HOOK_STOPPED_SEEN
from agentfsm.machine.state import Limits, TerminalReason
from agentfsm.testing import RawToolJsonBlock, Response, StreamedResponse, TextBlock, ToolUseBlock
from agentfsm.testing.stateful import AgentLoopStateMachine, LoopRun, assert_invariants, run_loop
from agentfsm.testing.strategies import (
    loop_limits,
    model_behaviours,
    text_responses,
    tool_call_responses,
    unique_tool_ids,
)
from agentfsm.tools.base import Tool, ToolError, ToolOutput, tool
from agentfsm.tools.schema import coerce_input
from agentfsm.tools.structured_output import StructuredOutputTool

# --- the suite's tools: small, in-process, no filesystem -----------------------------------------


@tool("Echo", "Repeat the text.", {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 40},
                   "times": {"type": "integer", "minimum": 1, "maximum": 3}},
    "required": ["text"], "additionalProperties": False,
}, concurrency_safe=True, interrupt="cancel")
async def echo(inp: Mapping[str, Any], ctx: Any) -> str:
    return str(inp["text"]) * int(inp.get("times", 1))


@tool("Tally", "Add n to the running total (kept in the shared context).", {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 5}},
    "required": ["n"], "additionalProperties": False,
})
async def tally(inp: Mapping[str, Any], ctx: Any) -> ToolOutput:
    total = int(ctx.layers.get("tally", 0)) + int(inp["n"])
    return ToolOutput(str(total), context_layers={"tally": total})


@tool("Flaky", "Fail in the way asked.", {
    "type": "object",
    "properties": {"mode": {"enum": ["ok", "tool_error", "exception", "error_output"]}},
    "required": ["mode"], "additionalProperties": False,
}, concurrency_safe=True)
async def flaky(inp: Mapping[str, Any], ctx: Any) -> Any:
    mode = inp["mode"]
    if mode == "tool_error":
        raise ToolError("flaky: failed as asked")
    if mode == "exception":
        raise RuntimeError("flaky: crashed as asked")
    if mode == "error_output":
        return ToolOutput("flaky: error output", is_error=True)
    return "flaky: ok"


@tool("Finish", "End the turn with a summary.", {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 40}},
    "required": ["summary"], "additionalProperties": False,
}, ends_turn=True)
async def finish(inp: Mapping[str, Any], ctx: Any) -> str:
    return str(inp["summary"])


@tool("Hold", "Wait a few milliseconds; with interrupt, the user presses Ctrl-C meanwhile.", {
    "type": "object",
    "properties": {"ms": {"type": "integer", "minimum": 1, "maximum": 3},
                   "interrupt": {"type": "boolean"}},
    "required": ["ms"], "additionalProperties": False,
}, concurrency_safe=True, interrupt="cancel")
async def hold(inp: Mapping[str, Any], ctx: Any) -> str:
    # the wait lets the (instant) scripted stream end first, so the interrupt lands while the loop
    # drains its tools rather than while it streams
    await asyncio.sleep(int(inp["ms"]) / 1000)
    if inp.get("interrupt"):
        ctx.abort.set()  # the driver's abort signal: exactly what the host's interrupt sets
        await asyncio.sleep(1)  # cancelled by the abort (interrupt behaviour "cancel")
    return "held"


TOOLS: list[Tool] = [echo, tally, flaky, finish, hold]
TOOL_NAMES = {t.name for t in TOOLS}
FALLBACK = ("claude-haiku-4-5",)


# --- scripted hooks ----------------------------------------------------------------------------


@attrs.define
class HookPlan:
    """Scripted answers of Python hooks: each event takes its next decision, ``pass`` once the list
    is used up. Decisions: Stop ``block``/``prevent``; PreToolUse ``deny``/``defer``/``stop``/
    ``ask``; PostToolBatch ``block``/``context``; UserPromptSubmit ``block``."""

    stop: list[str] = attrs.field(factory=list)
    pre_tool: list[str] = attrs.field(factory=list)
    post_batch: list[str] = attrs.field(factory=list)
    prompt: list[str] = attrs.field(factory=list)

    def matchers(self) -> dict[str, list[HookMatcher]]:
        def take(queue: list[str]) -> str:
            return queue.pop(0) if queue else "pass"

        async def on_stop(_inp: Any) -> Any:
            decision = take(self.stop)
            if decision == "block":
                raise HookBlockingError("the tests have not been run yet")
            if decision == "prevent":
                return {"continue": False, "stopReason": "plan says stop"}
            return None

        async def on_pre_tool(_inp: Any) -> Any:
            decision = take(self.pre_tool)
            if decision == "stop":
                return {"continue": False, "stopReason": "plan stops the run"}
            if decision in ("deny", "defer", "ask"):
                return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": decision,
                                               "permissionDecisionReason": f"plan says {decision}"}}
            return None

        async def on_post_batch(_inp: Any) -> Any:
            decision = take(self.post_batch)
            if decision == "block":
                raise HookBlockingError("the batch broke a rule")
            if decision == "context":
                return {"hookSpecificOutput": {"hookEventName": "PostToolBatch",
                                               "additionalContext": "remember the style guide"}}
            return None

        async def on_prompt(_inp: Any) -> Any:
            if take(self.prompt) == "block":
                raise HookBlockingError("prompt rejected by plan")
            return None

        return {"Stop": [HookMatcher(None, [on_stop])], "PreToolUse": [HookMatcher(None, [on_pre_tool])],
                "PostToolBatch": [HookMatcher(None, [on_post_batch])],
                "UserPromptSubmit": [HookMatcher(None, [on_prompt])]}


def _decisions(*rare: str, common: int = 4) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(["pass"] * common + list(rare)), max_size=4)


hook_plans = st.builds(HookPlan, stop=_decisions("block", "prevent", common=2),
                       pre_tool=_decisions("deny", "defer", "stop", "ask", common=8),
                       post_batch=_decisions("block", "context"), prompt=_decisions("block", common=10))


# --- sizing --------------------------------------------------------------------------------------


def scale(ci_examples: int) -> int:
    """Examples for a workload: its CI count times the profile's factor (100 examples = 1×)."""
    return max(1, round(ci_examples * settings.default.max_examples / 100))


def props(ci_examples: int, **kw: Any) -> settings:
    return settings(max_examples=scale(ci_examples), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **kw)


def _options(trace_dir: Path, *, tools: Sequence[Tool] = TOOLS, hooks: Mapping[str, Any] | None = None,
             limits: Limits | None = None, fallback: bool = False,
             json_schema: Mapping[str, Any] | None = None) -> Options:
    workspace = trace_dir / "ws"
    workspace.mkdir(exist_ok=True)
    return Options(tools=(), extra_tools=tuple(tools), hooks=dict(hooks or {}), limits=limits or Limits(),
                   permission_mode="bypassPermissions", cwd=workspace, sessions_dir=trace_dir,
                   setting_sources=(), fallback_models=FALLBACK if fallback else (), json_schema=json_schema)


# --- the suite's own properties, on top of the invariants of docs/behaviour.md §3 ---------------------------------


def _calls_by_id(run: LoopRun) -> dict[str, ToolUseBlock | RawToolJsonBlock]:
    """What the model really sent for each tool_use id (the trace holds ``{}`` for unparsable JSON)."""
    out: dict[str, ToolUseBlock | RawToolJsonBlock] = {}
    for obs in run.requests:
        if isinstance(obs.response, StreamedResponse):
            for b in obs.response.blocks:
                if isinstance(b, ToolUseBlock | RawToolJsonBlock):
                    out[b.id] = b
    return out


_VALIDATORS: dict[str, Any] = {}


def expected_validity(block: ToolUseBlock | RawToolJsonBlock, tools: Sequence[Tool]) -> bool:
    """Whether the pipeline must let this call through to its tool."""
    found = next((t for t in tools if t.name == block.name), None)
    if found is None or isinstance(block, RawToolJsonBlock):
        return False
    validator = _VALIDATORS.get(found.name)
    if validator is None or validator.schema != found.input_schema:
        validator = _VALIDATORS[found.name] = jsonschema.Draft202012Validator(found.input_schema)
    return bool(validator.is_valid(coerce_input(dict(block.input), found.input_schema)))


def check_tool_properties(run: LoopRun, tools: Sequence[Tool] = TOOLS) -> None:
    """Invalid calls never reach a tool; what reached Echo comes back verbatim; a permission denial
    in the result is an error result of this run; after a successful Finish (``ends_turn``) the
    model is not called again in that driver run."""
    sent = _calls_by_id(run)
    denied = {d.get("tool_use_id") for d in run.result.permission_denials}
    for ex in run.tool_exchanges():
        tid = str(ex.use.get("id"))
        assert ex.result is not None, f"{tid} has no result"
        block = sent.get(tid)
        if block is not None and not expected_validity(block, tools):
            assert ex.is_error, f"invalid call {block!r} got a non-error result {ex.result!r}"
        if ex.name == "Echo" and not ex.is_error:
            echoed = str(ex.input["text"]) * int(ex.input.get("times", 1))
            notes = HOOK_STOPPED_SEEN.findall(ex.text)
            if notes:
                # a hook that stopped the run says so after the output (right-trimmed, as for any reminder)
                noted = [prompts.reminder(prompts.HOOK_STOPPED_NOTE.format(event="PreToolUse", tool="Echo",
                                                                            reason=why)) for why in notes]
                echoed = "\n\n".join([echoed.rstrip(), *noted] if echoed else noted)
            assert ex.text == echoed, ex
        if tid in denied:
            assert ex.is_error, f"denied call {tid} has a non-error result"
    exchanged = {str(ex.use.get("id")) for ex in run.tool_exchanges()}
    assert denied <= exchanged, f"denials {denied - exchanged} name no tool_use of the run"
    # ends_turn: once a successful Finish result is in the conversation, the model is not called
    # again in that driver run (a result discarded with a retried stream never got in)
    finish_ids = {str(ex.use.get("id")) for ex in run.tool_exchanges() if ex.name == "Finish"}
    fresh = {id(m) for m in run.messages()}
    for leg in run.legs():
        done_at = next((i for i, r in enumerate(leg) if id(r) in fresh
                        and any(b.get("type") == "tool_result" and not b.get("is_error")
                                and str(b.get("tool_use_id")) in finish_ids for b in r.get("content", ()))),
                       None)
        if done_at is not None:
            later = [r for r in leg[done_at:] if r.get("type") == "request"]
            assert not later, "the model was called again after a successful Finish"


# --- workloads -----------------------------------------------------------------------------------


def conversations_workload(trace_dir: Path) -> int:
    runs = 0

    @props(1200)
    @given(script=model_behaviours(TOOLS, max_size=6), limits=loop_limits(), plan=hook_plans,
           fallback=st.booleans())
    def conversation(script: list[Response], limits: Limits, plan: HookPlan, fallback: bool) -> None:
        nonlocal runs
        run = run_loop(script, options=_options(trace_dir, hooks=plan.matchers(), limits=limits,
                                                fallback=fallback))
        runs += 1
        assert_invariants(run)
        check_tool_properties(run)

    conversation()
    return runs


def tool_calls_workload(trace_dir: Path) -> int:
    runs = 0
    tools = [echo, tally, flaky, finish]

    @props(350)
    @given(calls=tool_call_responses(tools, valid=None, max_calls=4), then=text_responses())
    def calls_get_their_results(calls: StreamedResponse, then: StreamedResponse) -> None:
        nonlocal runs
        [calls] = unique_tool_ids([calls])
        run = run_loop([calls, then], options=_options(trace_dir, tools=tools))
        runs += 1
        assert_invariants(run)
        check_tool_properties(run, tools)
        blocks = [b for b in calls.blocks if isinstance(b, ToolUseBlock | RawToolJsonBlock)]
        exchanges = {str(ex.use.get("id")): ex for ex in run.tool_exchanges()}
        assert blocks  # tool_call_responses draws at least one call
        # every call is dispatched, an unparsable one too (answered with an input-validation error, as
        # Claude Code 2.1.332 does): none is a malformed tool use
        assert run.path()[2] == "dispatch", run.path()
        for b in blocks:
            ex = exchanges[b.id]
            if not expected_validity(b, tools):
                assert ex.is_error
                if b.name not in TOOL_NAMES:
                    assert "No such tool available" in ex.text, ex.text
                else:  # a schema failure, or (a raw block) input that is not a JSON object
                    assert "InputValidationError" in ex.text, ex.text
            elif b.name == "Flaky":
                assert ex.is_error == (b.input["mode"] != "ok"), ex
            else:
                assert not ex.is_error, ex

    calls_get_their_results()
    return runs


ANSWER_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 20},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["answer"], "additionalProperties": False,
}


def structured_output_workload(trace_dir: Path) -> int:
    runs = 0
    # the strategies draw calls for the StructuredOutput tool the driver adds for a JSON schema
    tools = [StructuredOutputTool(ANSWER_SCHEMA), echo]

    @props(250)
    @given(script=model_behaviours(tools, max_size=5), retries=st.integers(0, 2))
    def answers_are_valid(script: list[Response], retries: int) -> None:
        nonlocal runs
        limits = Limits(structured_output_retries=retries)
        run = run_loop(script, options=_options(trace_dir, tools=[echo], limits=limits,
                                                json_schema=ANSWER_SCHEMA))
        runs += 1
        assert_invariants(run)
        if run.result.terminal_reason is TerminalReason.COMPLETED:
            jsonschema.validate(run.result.structured_output, ANSWER_SCHEMA)

    answers_are_valid()
    return runs


class ProjectLoopMachine(AgentLoopStateMachine):
    """The kit's state machine with this suite's tools, random limits, scripted hooks (more Stop and
    PreToolUse decisions are queued by rules as the session goes on) and sometimes a fallback model."""

    tools = TOOLS

    def __init__(self) -> None:
        super().__init__()
        self.plan = HookPlan()
        self.fallback = False

    def limits_strategy(self) -> st.SearchStrategy[Limits]:
        return loop_limits()

    def build_hooks(self) -> Mapping[str, Sequence[Any]]:
        return self.plan.matchers()

    def build_options(self) -> Options:
        return attrs.evolve(super().build_options(), fallback_models=FALLBACK if self.fallback else ())

    @initialize(plan=hook_plans, fallback=st.booleans())
    def choose_hooks(self, plan: HookPlan, fallback: bool) -> None:
        self.plan, self.fallback = plan, fallback

    @rule(decision=st.sampled_from(["block", "prevent", "pass"]))
    def stop_hook_will(self, decision: str) -> None:
        self.plan.stop.append(decision)

    @rule(decision=st.sampled_from(["deny", "defer", "stop", "pass"]))
    def pre_tool_hook_will(self, decision: str) -> None:
        self.plan.pre_tool.append(decision)

    def check_run(self, run: LoopRun) -> None:
        check_tool_properties(run)


def machine_workload(trace_dir: Path) -> int:
    runs = 0

    class Machine(ProjectLoopMachine):
        def check_run(self, run: LoopRun) -> None:
            nonlocal runs
            runs += 1
            super().check_run(run)

    Machine.trace_dir = trace_dir
    run_state_machine_as_test(Machine, settings=props(200, stateful_step_count=12))
    return runs


WORKLOADS: dict[str, Callable[[Path], int]] = {
    "conversations": conversations_workload,
    "tool_calls": tool_calls_workload,
    "structured_output": structured_output_workload,
    "machine": machine_workload,
}


def run_workload(name: str, property_traces: Any) -> None:
    try:
        runs = WORKLOADS[name](property_traces.dir)
    finally:
        # ran (even if it failed): the coverage check reads its traces instead of running it again
        property_traces.done.add(name)
    assert runs >= scale(100) // 2, f"{name}: only {runs} runs were generated"


@pytest.mark.property_suite
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_property_workload(name: str, property_traces: Any) -> None:
    run_workload(name, property_traces)


def test_interrupt_as_a_later_stream_opens_leaves_a_valid_history(tmp_path: Path) -> None:
    """Found by the state machine: an interrupt that lands after a request was sent but before its
    first content block must not re-append the previous turn's assistant message (whose tool_use
    ids then occur twice, which the API rejects on the next request)."""
    call = StreamedResponse(blocks=(ToolUseBlock("toolu_1", "Echo", {"text": "a"}),), stop_reason="tool_use")
    script = [call, StreamedResponse(blocks=(TextBlock("done"),))]
    run = run_loop(script, options=_options(tmp_path), abort_at=1)
    assert run.path()[-1] == "abort"
    assert_invariants(run)


def test_example_counts_follow_the_hypothesis_profile() -> None:
    # ci: the counts written above; nightly (1000 examples a test): ten times as many
    assert scale(100) == settings.default.max_examples
    assert scale(1200) == 12 * settings.default.max_examples
