"""The 15-step pipeline of one tool call (agentfsm.runtime.pipeline): every failure path and its exact text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import structlog

from agentfsm.runtime.pipeline import REJECT_MESSAGE, CallResult, ToolTable, run_tool_call
from agentfsm.runtime.ports import AllowAllGate, PermissionOutcome, PostToolOutcome, PreToolOutcome
from agentfsm.tools.base import Tool, ToolContext, ToolError, ToolOutput, ValidationResult, tool
from agentfsm.tools.schema import coerce_input, schema_issues

READ_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "file_path": {"type": "string"},
        "offset": {"type": "number"},
        "limit": {"type": "number"},
    },
    "required": ["file_path"],
    "additionalProperties": False,
}


class FakeRead(Tool):
    name = "Read"
    aliases = ("ReadFile",)
    input_schema = READ_SCHEMA

    def __init__(self) -> None:
        self.calls: list[Mapping[str, Any]] = []
        self.in_progress_seen: set[str] | None = None
        self.ctxs: list[ToolContext] = []

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return True

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        self.calls.append(dict(input))
        self.ctxs.append(ctx)
        return ToolOutput(f"1\tcontents of {input['file_path']}")


class Recorder(AllowAllGate):
    """An AllowAllGate that records every call and answers with configured outcomes."""

    def __init__(self, pre: PreToolOutcome | None = None, perm: PermissionOutcome | None = None,
                 post: PostToolOutcome | None = None, failure: PostToolOutcome | None = None,
                 raises: str | None = None) -> None:
        self.pre, self.perm, self.post, self.failure, self.raises = pre, perm, post, failure, raises
        self.events: list[tuple[str, Any]] = []

    async def pre_tool_use(self, tool_name: str, tool_input: Mapping[str, Any],
                           tool_use_id: str) -> PreToolOutcome:
        self.events.append(("pre", (tool_name, dict(tool_input), tool_use_id)))
        if self.raises == "pre":
            raise RuntimeError("hook crashed")
        return self.pre or PreToolOutcome()

    async def permission(self, tool: Tool, tool_input: Mapping[str, Any],
                         pre: PreToolOutcome, *, tool_use_id: str = "") -> PermissionOutcome:
        self.events.append(("permission", (tool.name, dict(tool_input))))
        if self.raises == "permission":
            raise RuntimeError("rules unreadable")
        return self.perm or await super().permission(tool, tool_input, pre)

    async def post_tool_use(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                            tool_response: Any, duration_ms: float) -> PostToolOutcome:
        self.events.append(("post", (tool_name, tool_response, duration_ms)))
        if self.raises == "post":
            raise RuntimeError("post hook crashed")
        return self.post or PostToolOutcome()

    async def post_tool_use_failure(self, tool_name: str, tool_input: Mapping[str, Any], tool_use_id: str,
                                    error: str, is_interrupt: bool, *,
                                    duration_ms: float = 0.0) -> PostToolOutcome:
        self.events.append(("failure", (tool_name, error, is_interrupt)))
        return self.failure or PostToolOutcome()

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]


def use(name: str = "Read", input: Any = None, id: str = "toolu_1") -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name,
            "input": {"file_path": "/a.txt"} if input is None else input}


async def run(block: Mapping[str, Any], *tools: Tool, gate: Any = None, **kw: Any) -> CallResult:
    return await run_tool_call(block, lookup=list(tools) or [FakeRead()], gate=gate or AllowAllGate(), **kw)


def content(result: CallResult) -> Any:
    return result.block["content"]


# --- success ---------------------------------------------------------------------------------


async def test_success_block_timings_and_every_step() -> None:
    read = FakeRead()
    r = await run(use(), read)
    assert r.block == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1\tcontents of /a.txt"}
    assert not r.is_error and r.tool_name == "Read" and r.tool_use_id == "toolu_1"
    assert r.tool_input == {"file_path": "/a.txt"} and r.output_data == "1\tcontents of /a.txt"
    assert read.calls == [{"file_path": "/a.txt"}]
    assert read.ctxs[0].tool_use_id == "toolu_1"
    steps = [k.split("_", 1)[0] for k in r.timings.steps]
    # a tool without its own validate_input has no step 5 (issue 34's compiled plan); a gate that
    # cannot say which hooks it has runs every hook point
    assert steps == [f"{n:02d}" for n in (1, 2, 3, 4, 6, 7, 9, 10, 11, 12, 13, 14, 15)]
    assert r.timings.total_ms >= r.timings.run_ms >= 0


class HooksSaid(Recorder):
    """A Recorder gate that says which hook events it has hooks for."""

    def __init__(self, events: set[str], **kw: Any) -> None:
        super().__init__(**kw)
        self.events_with_hooks = events

    def has_hooks(self, event: str) -> bool:
        return event in self.events_with_hooks


class ValidatingRead(FakeRead):
    async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
        return ValidationResult.valid()


@pytest.mark.parametrize("events", [set(), {"PreToolUse"}, {"PostToolUse"}, {"PreToolUse", "PostToolUse"}])
@pytest.mark.parametrize("own_validate", [False, True])
async def test_the_compiled_plan_leaves_out_only_steps_that_do_nothing(events: set[str], own_validate: bool) -> None:
    """A hook point runs only when the gate has a hook for it, the tool's validate_input only when
    it has its own, the output check only with an output schema or a PostToolUse hook; the result is
    the same either way."""
    gate = HooksSaid(events)
    read = ValidatingRead() if own_validate else FakeRead()
    r = await run(use(), read, gate=gate)
    assert r.block == {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1\tcontents of /a.txt"}
    steps = {int(k.split("_", 1)[0]) for k in r.timings.steps}
    assert (5 in steps) is own_validate
    assert (6 in steps) is ("PreToolUse" in events)
    assert (12 in steps) is ("PostToolUse" in events) and (13 in steps) is ("PostToolUse" in events)
    assert {1, 2, 3, 4, 7, 9, 10, 11, 14, 15} <= steps
    kinds = [e[0] for e in gate.events]
    assert ("pre" in kinds) is ("PreToolUse" in events) and ("post" in kinds) is ("PostToolUse" in events)


async def test_a_failure_hook_runs_only_when_configured() -> None:
    class Broken(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            raise ToolError("disk on fire")

    for events, ran in ((set(), False), ({"PostToolUseFailure"}, True)):
        gate = HooksSaid(events)
        r = await run(use(), Broken(), gate=gate)
        assert r.is_error and "disk on fire" in content(r)
        assert any(e[0] == "failure" for e in gate.events) is ran


async def test_alias_resolves_to_canonical_name() -> None:
    gate = Recorder()
    r = await run(use("ReadFile"), gate=gate)
    assert not r.is_error and r.tool_name == "Read"
    assert gate.events[0] == ("pre", ("Read", {"file_path": "/a.txt"}, "toolu_1"))


async def test_input_given_as_raw_json_text_is_parsed() -> None:
    r = await run(use(input='{"file_path": "/b.txt"}'))
    assert content(r) == "1\tcontents of /b.txt"


# --- step 1: lookup --------------------------------------------------------------------------


async def test_unknown_tool_exact_text_without_suggestion() -> None:
    r = await run(use("Zzzqx"))
    assert r.is_error and r.block["is_error"] is True and r.block["tool_use_id"] == "toolu_1"
    assert content(r) == "<tool_use_error>Error: No such tool available: Zzzqx</tool_use_error>"


async def test_a_claude_code_tool_not_offered_is_said_to_be_disabled() -> None:
    # Claude Code's text for a tool it has but the session does not offer
    assert content(await run(use("NotebookEdit"))) == (
        "<tool_use_error>Error: No such tool available: NotebookEdit. NotebookEdit is disabled for this session, "
        "in subagents as well as here.</tool_use_error>")


async def test_a_name_in_other_case_is_corrected_and_a_near_miss_is_just_unknown() -> None:
    # Claude Code 2.1.332's words (compared on the same scripted server: docs/conform.md)
    for called in ("read", "READ", "rEAD"):
        assert content(await run(use(called))) == (
            f"<tool_use_error>Error: No such tool available: {called}. Tool names are case-sensitive: call Read "
            "instead.</tool_use_error>")
    assert content(await run(use("Reed"))) == "<tool_use_error>Error: No such tool available: Reed</tool_use_error>"


async def test_unknown_tool_runs_no_hooks() -> None:
    gate = Recorder()
    await run(use("Reed"), gate=gate)
    assert gate.events == []


# --- step 2: abort ---------------------------------------------------------------------------


async def test_abort_before_start_gives_synthetic_result_and_runs_no_hook() -> None:
    read, gate = FakeRead(), Recorder()
    ev = asyncio.Event()
    ev.set()
    r = await run(use(), read, gate=gate, abort=ev)
    assert r.is_error and content(r) == REJECT_MESSAGE
    assert r.cancel_reason == "user_interrupted" and r.interrupted
    assert gate.events == [] and read.calls == []


async def test_context_abort_signal_counts_too() -> None:
    def make_ctx(tid: str) -> ToolContext:
        ctx = ToolContext(cwd=Path("."))
        ctx.abort.set()
        return ctx

    read = FakeRead()
    r = await run(use(), read, ctx_factory=make_ctx)
    assert r.interrupted and read.calls == []


# --- step 3: JSON and coercion ---------------------------------------------------------------


async def test_unparsable_json_echoes_first_bytes_and_asks_for_valid_json() -> None:
    # Claude Code 2.1.332's text for the same input (tests/fidelity/scenarios/unparsable_tool_input.json)
    r = await run(use(input={}), invalid_json='{"file_path": "/a')
    assert r.is_error
    assert content(r) == (
        "<tool_use_error>InputValidationError: Read was called with input that could not be parsed as JSON.\n"
        'You sent (first 17 of 17 bytes): {"file_path": "/a\n'
        "Common causes: unescaped backslashes in file paths (use / or \\\\), unescaped control characters, "
        "or truncated output. Retry with valid JSON.</tool_use_error>")


async def test_unparsable_json_echo_is_capped_at_200_bytes() -> None:
    raw = '{"file_path": "' + "x" * 500
    r = await run(use(input={}), invalid_json=raw)
    assert f"You sent (first 200 of 515 bytes): {raw[:200]}\nCommon causes" in content(r)


async def test_json_that_parses_but_is_not_an_object_says_what_it_is() -> None:
    r = await run(use(input={}), invalid_json="[1, 2]")
    assert "The tool input is a JSON array, not an object: [1, 2]" in content(r)


async def test_raw_string_input_that_is_not_json() -> None:
    r = await run(use(input="{oops"))
    assert "You sent (first 5 of 5 bytes): {oops\n" in content(r)


async def test_coercion_of_strings_into_schema_types() -> None:
    schema = {"type": "object", "properties": {
        "flag": {"type": "boolean"}, "n": {"type": "integer"}, "x": {"type": "number"},
        "s": {"type": "string"}, "opt": {"type": ["integer", "null"]},
        "nested": {"type": "object", "properties": {"b": {"type": "boolean"}}},
        "items": {"type": "array", "items": {"type": "number"}}}}
    got: list[Mapping[str, Any]] = []

    @tool("Probe", "probe", schema)
    async def probe(input: Mapping[str, Any], ctx: ToolContext) -> str:
        got.append(input)
        return "ok"

    r = await run(use("Probe", {"flag": "true", "n": "42", "x": "2.5", "s": "7", "opt": "-3",
                                "nested": {"b": "false"}, "items": ["1", "1.5"]}), probe)
    assert not r.is_error
    assert got == [{"flag": True, "n": 42, "x": 2.5, "s": "7", "opt": -3, "nested": {"b": False},
                    "items": [1, 1.5]}]
    assert coerce_input({"n": "4.5"}, schema) == {"n": "4.5"}  # not an integer: left for the schema
    assert coerce_input({"flag": "yes"}, schema) == {"flag": "yes"}


# --- step 4: schema --------------------------------------------------------------------------


async def test_missing_required_parameter_text() -> None:
    r = await run(use(input={}))
    assert content(r) == ("<tool_use_error>InputValidationError: Read failed due to the following issue:\n"
                          "The required parameter `file_path` is missing</tool_use_error>")


async def test_unexpected_parameter_text() -> None:
    r = await run(use(input={"file_path": "/a", "x": 1}))
    assert content(r) == ("<tool_use_error>InputValidationError: Read failed due to the following issue:\n"
                          "An unexpected parameter `x` was provided</tool_use_error>")


async def test_type_mismatch_text() -> None:
    r = await run(use(input={"file_path": "/a", "limit": "ten"}))
    assert content(r) == ("<tool_use_error>InputValidationError: Read failed due to the following issue:\n"
                          "The parameter `limit` type is expected as `number` but provided as `string`"
                          "</tool_use_error>")


async def test_several_issues_one_line_each_in_schema_order_unexpected_last() -> None:
    read = FakeRead()
    r = await run(use(input={"zz": True, "limit": [1], "offset": False}), read)
    lines = content(r).removeprefix("<tool_use_error>").removesuffix("</tool_use_error>").split("\n")
    assert lines == [
        "InputValidationError: Read failed due to the following issues:",
        "The required parameter `file_path` is missing",
        "The parameter `offset` type is expected as `number` but provided as `boolean`",
        "The parameter `limit` type is expected as `number` but provided as `array`",
        "An unexpected parameter `zz` was provided",
    ]
    assert read.calls == []


def test_schema_issue_texts_for_nested_and_other_keywords() -> None:
    schema = {"type": "object", "properties": {
        "mode": {"enum": ["a", "b"]},
        "edits": {"type": "array", "items": {"type": "object", "required": ["old"],
                                             "properties": {"old": {"type": "string"}}}}}}
    table = ToolTable([])
    t = Tool()
    t.input_schema = schema
    issues = table.input_issues(t, {"mode": "c", "edits": [{"old": 1}, {}]})
    assert issues == [
        "The parameter `mode` is invalid: 'c' is not one of ['a', 'b']",
        "The parameter `edits.0.old` type is expected as `string` but provided as `number`",
        "The required parameter `edits.1.old` is missing",
    ]
    assert schema_issues(table.input_validator(t), []) == [
        "The tool input type is expected as `object` but provided as `array`"]


async def test_validator_compiled_once_per_tool() -> None:
    read = FakeRead()
    table = ToolTable([read])
    first = table.input_validator(read)
    await run_tool_call(use(), lookup=table, gate=AllowAllGate())
    assert table.input_validator(read) is first
    assert ToolTable([read]).input_validator(read) is first  # shared across tables (one per response)


async def test_broken_input_schema_is_an_error_result() -> None:
    @tool("Broken", "b", {"type": "object", "properties": {"x": {"type": "nonsense"}}})
    async def broken(input: Mapping[str, Any], ctx: ToolContext) -> str:
        return "ran"

    r = await run(use("Broken", {}), broken)
    assert r.is_error
    assert content(r).startswith("<tool_use_error>Error: the input schema of Broken is invalid")


# --- step 5: validate_input ------------------------------------------------------------------


async def test_validate_input_rejection_is_wrapped() -> None:
    class Picky(FakeRead):
        async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
            return ValidationResult.invalid("File does not exist.")

    gate = Recorder()
    r = await run(use(), Picky(), gate=gate)
    assert content(r) == "<tool_use_error>File does not exist.</tool_use_error>"
    assert gate.events == []


# --- step 6: PreToolUse ----------------------------------------------------------------------


async def test_pre_hook_block_text_and_tool_not_called() -> None:
    read = FakeRead()
    r = await run(use(), read, gate=Recorder(pre=PreToolOutcome(blocked=True, reason="no reading today")))
    assert r.is_error and content(r) == "PreToolUse:Read hook error: no reading today"
    assert read.calls == []


async def test_pre_hook_crash_fails_closed() -> None:
    read = FakeRead()
    r = await run(use(), read, gate=Recorder(raises="pre"))
    assert content(r) == "PreToolUse:Read hook error: hook crashed" and read.calls == []


async def test_pre_hook_defer_gives_deferred_outcome_without_running() -> None:
    read = FakeRead()
    r = await run(use(), read, gate=Recorder(pre=PreToolOutcome(decision="defer", reason="later")))
    assert r.deferred and r.is_error and read.calls == []
    assert content(r) == ("<tool_use_error>The Read call was deferred by a PreToolUse hook: later. "
                          "It has not run.</tool_use_error>")


async def test_pre_hook_stop_marks_stop_but_the_call_runs() -> None:
    read = FakeRead()
    r = await run(use(), read, gate=Recorder(pre=PreToolOutcome(stop=True, stop_reason="enough")))
    assert r.stop and r.stop_reason == "enough" and not r.is_error and len(read.calls) == 1
    # the model is told inside the result (a pass that task notifications start shows it: Claude Code 2.1.332)
    assert content(r) == ("1\tcontents of /a.txt\n\n<system-reminder>\nPreToolUse:Read hook stopped continuation: "
                          "enough\n</system-reminder>") and r.after == ()


@pytest.mark.parametrize(("event", "words"), [("PreToolUse", "Execution stopped by hook"),
                                              ("PostToolUse", "Execution stopped by PostToolUse hook")])
async def test_a_hook_stop_without_a_reason_is_told_in_claude_codes_words(event: str, words: str) -> None:
    outcome = {"pre": PreToolOutcome(stop=True)} if event == "PreToolUse" else {"post": PostToolOutcome(stop=True)}
    r = await run(use(), gate=Recorder(**outcome))
    assert r.stop and content(r) == (f"1\tcontents of /a.txt\n\n<system-reminder>\n{event}:Read hook stopped "
                                     f"continuation: {words}\n</system-reminder>")


async def test_a_pre_hook_stop_after_its_context_is_a_block_after_it() -> None:
    r = await run(use(), gate=Recorder(pre=PreToolOutcome(stop=True, stop_reason="halt", additional_context=("c1",))))
    assert content(r) == "1\tcontents of /a.txt"
    assert r.after == ({"type": "text", "text": "<system-reminder>\nPreToolUse:Read hook additional context: c1\n"
                                                "</system-reminder>"},
                       {"type": "text", "text": "<system-reminder>\nPreToolUse:Read hook stopped continuation: halt\n"
                                                "</system-reminder>\n"})


async def test_pre_hook_additional_context_follows_the_results() -> None:
    # Claude Code's form: a labelled reminder in its own block after the results; the result is untouched
    r = await run(use(), gate=Recorder(pre=PreToolOutcome(additional_context=("mind the gap",))))
    assert content(r) == "1\tcontents of /a.txt"
    assert r.after == ({"type": "text", "text": "<system-reminder>\nPreToolUse:Read hook additional context: "
                                                "mind the gap\n</system-reminder>"},)


async def test_pre_hook_updated_input_is_revalidated_and_used() -> None:
    read, gate = FakeRead(), Recorder(pre=PreToolOutcome(updated_input={"file_path": "/b.txt", "limit": "5"}))
    r = await run(use(), read, gate=gate)
    assert not r.is_error and read.calls == [{"file_path": "/b.txt", "limit": 5}]
    assert ("permission", ("Read", {"file_path": "/b.txt", "limit": 5})) in gate.events
    assert r.tool_input == {"file_path": "/b.txt", "limit": 5}


async def test_pre_hook_invalid_updated_input_is_a_config_error() -> None:
    read = FakeRead()
    r = await run(use(), read, gate=Recorder(pre=PreToolOutcome(updated_input={"path": "/b"})))
    assert r.is_error and read.calls == []
    assert content(r) == (
        "<tool_use_error>Error: the PreToolUse hook returned an updatedInput for Read that does not match "
        "its input schema (a configuration error); the call was not run:\n"
        "The required parameter `file_path` is missing\n"
        "An unexpected parameter `path` was provided</tool_use_error>")
    assert "08_revalidate" in r.timings.steps


# --- step 7: permission ----------------------------------------------------------------------


async def test_permission_deny_records_denial_and_never_calls() -> None:
    read = FakeRead()
    gate = Recorder(perm=PermissionOutcome("deny", "Permission to read /a.txt has been denied."))
    r = await run(use(), read, gate=gate)
    assert r.is_error and content(r) == "Permission to read /a.txt has been denied."
    assert r.permission_denial == {"tool_name": "Read", "tool_use_id": "toolu_1",
                                   "tool_input": {"file_path": "/a.txt"}}
    assert read.calls == [] and "post" not in gate.kinds()


async def test_a_denial_lists_the_values_the_model_gave_and_defaults_only_for_the_rest() -> None:
    """The run's permission_denials show what the model asked for: a field it gave keeps its value,
    even where the schema has a default; only the fields it left out are filled from the defaults."""
    schema = {"type": "object", "properties": {
        "file_path": {"type": "string"},
        "replace_all": {"type": "boolean", "default": False},
        "mode": {"type": "string", "default": "append"}},
        "required": ["file_path"], "additionalProperties": False}

    @tool("Edit", "e", schema)
    async def edit(input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        raise AssertionError("a denied call must not run")

    gate = Recorder(perm=PermissionOutcome("deny", "no"))
    r = await run(use("Edit", {"file_path": "/a.txt", "replace_all": True}), edit, gate=gate)
    assert r.permission_denial == {"tool_name": "Edit", "tool_use_id": "toolu_1",
                                   "tool_input": {"file_path": "/a.txt", "replace_all": True, "mode": "append"}}


async def test_unanswered_ask_is_a_denial_with_default_text() -> None:
    r = await run(use(), gate=Recorder(perm=PermissionOutcome("ask")))
    assert content(r) == "Permission to use Read has been denied." and r.permission_denial is not None


async def test_pre_hook_deny_through_open_gate() -> None:
    r = await run(use(), gate=Recorder(pre=PreToolOutcome(decision="deny", reason="policy")))
    assert content(r) == "policy" and r.permission_denial is not None


async def test_permission_crash_is_an_error_not_a_call() -> None:
    read = FakeRead()
    r = await run(use(), read, gate=Recorder(raises="permission"))
    assert r.is_error and read.calls == [] and r.permission_denial is None
    assert content(r) == ("<tool_use_error>Error: the permission check for Read failed: RuntimeError: "
                          "rules unreadable</tool_use_error>")


async def test_permission_updated_input_revalidated() -> None:
    read = FakeRead()
    allow_c = PermissionOutcome("allow", updated_input={"file_path": "/c"})
    ok = await run(use(), read, gate=Recorder(perm=allow_c))
    assert not ok.is_error and read.calls == [{"file_path": "/c"}]
    allow_bad = PermissionOutcome("allow", updated_input={"file_path": 3})
    bad = await run(use(), read, gate=Recorder(perm=allow_bad))
    assert bad.is_error and len(read.calls) == 1
    assert "the permission check returned an updatedInput for Read" in content(bad)
    assert "The parameter `file_path` type is expected as `string` but provided as `number`" in content(bad)


# --- steps 9/10: in progress and the call ----------------------------------------------------


async def test_in_progress_set_during_call_and_cleared_after() -> None:
    seen: list[set[str]] = []
    in_progress: set[str] = set()

    class Watch(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            seen.append(set(in_progress))
            raise ValueError("bad")

    await run(use(), Watch(), in_progress=in_progress)
    assert seen == [{"toolu_1"}] and in_progress == set()


async def test_tool_error_text_and_failure_hook() -> None:
    class Failing(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            raise ToolError("String to replace not found in file.")

    gate = Recorder(failure=PostToolOutcome(additional_context=("failure noted",)))
    r = await run(use(), Failing(), gate=gate)
    assert r.is_error
    assert content(r) == ("<tool_use_error>String to replace not found in file.</tool_use_error>"
                          "\n\n<system-reminder>\nPostToolUseFailure:Read hook additional context: failure noted"
                          "\n</system-reminder>")
    assert gate.events[-1] == ("failure", ("Read", "String to replace not found in file.", False))


async def test_unexpected_exception_text_and_failure_hook() -> None:
    class Crashing(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            raise KeyError("missing")

    gate = Recorder()
    r = await run(use(), Crashing(), gate=gate)
    assert r.is_error and content(r) == "Error: KeyError: 'missing'"
    assert gate.events[-1] == ("failure", ("Read", "Error: KeyError: 'missing'", False))
    assert "post" not in gate.kinds()


async def test_cancellation_during_call_is_user_interrupted() -> None:
    started = asyncio.Event()

    class Slow(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            started.set()
            await asyncio.sleep(10)
            return ToolOutput("never")

    gate, in_progress = Recorder(), set[str]()
    task = asyncio.create_task(run(use(), Slow(), gate=gate, in_progress=in_progress))
    await started.wait()
    task.cancel()
    r = await task
    assert r.is_error and r.interrupted and content(r) == REJECT_MESSAGE
    assert gate.events[-1] == ("failure", ("Read", "The user interrupted the tool call", True))
    assert in_progress == set()


async def test_async_generator_call_reports_progress() -> None:
    progress: list[tuple[str, Any]] = []

    class Streaming(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> AsyncIterator[Any]:  # type: ignore[override]
            yield "half"
            yield ToolOutput("done")

    def make_ctx(tid: str) -> ToolContext:
        return ToolContext(cwd=Path("."), on_progress=lambda i, d: progress.append((i, d)))

    r = await run(use(), Streaming(), ctx_factory=make_ctx)
    assert content(r) == "done" and progress == [("toolu_1", "half")]


async def test_plain_return_values_and_error_outputs() -> None:
    @tool("Sum", "s", {"type": "object", "properties": {"a": {"type": "integer"}}})
    async def summer(input: Mapping[str, Any], ctx: ToolContext) -> Any:
        return {"sum": input["a"] + 1}

    r = await run(use("Sum", {"a": 1}), summer)
    assert content(r) == '{"sum": 2}' and r.output_data == {"sum": 2}

    @tool("Soft", "s", {"type": "object"})
    async def soft(input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput("not found", is_error=True)

    soft_r = await run(use("Soft", {}), soft)
    assert soft_r.is_error and soft_r.block["is_error"] is True and content(soft_r) == "not found"


async def test_ends_turn_and_context_layers_are_reported() -> None:
    @tool("Finish", "f", {"type": "object"}, ends_turn=True)
    async def finish(input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput("bye", context_layers={"mode": "done"})

    r = await run(use("Finish", {}), finish)
    assert r.ends_turn and r.context_layers == {"mode": "done"}


async def test_a_turn_ending_tool_ends_the_turn_only_when_its_call_succeeds() -> None:
    """A failed call of a turn-ending tool (an error result, a ToolError, a crash) does not end the
    turn: the model gets the error and another turn to put it right."""

    @tool("Finish", "f", {"type": "object"}, ends_turn=True)
    async def finish(input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        how = input.get("how")
        if how == "error":
            return ToolOutput("the result does not match the schema", is_error=True)
        if how == "raise":
            raise ToolError("not accepted")
        if how == "crash":
            raise RuntimeError("broken")
        return ToolOutput("done")

    for how in ("error", "raise", "crash"):
        r = await run(use("Finish", {"how": how}), finish)
        assert r.is_error and not r.ends_turn, how
    ok = await run(use("Finish", {"how": "fine"}), finish)
    assert not ok.is_error and ok.ends_turn


# --- step 11: mapping ------------------------------------------------------------------------


async def test_custom_mapper_and_a_failing_one() -> None:
    class Mapped(FakeRead):
        def map_result(self, output: ToolOutput, tool_use_id: str) -> dict[str, Any]:
            return {"type": "tool_result", "tool_use_id": tool_use_id,
                    "content": [{"type": "text", "text": "mapped"}]}

    r = await run(use(), Mapped())
    assert content(r) == [{"type": "text", "text": "mapped"}]

    class BadMapper(FakeRead):
        def map_result(self, output: ToolOutput, tool_use_id: str) -> dict[str, Any]:
            raise TypeError("cannot map")

    bad = await run(use(), BadMapper())
    assert bad.is_error and content(bad) == "Error: TypeError: cannot map"


# --- steps 12/13: PostToolUse and the output schema ------------------------------------------


class Typed(FakeRead):
    output_schema = {"type": "object", "properties": {"lines": {"type": "integer"}}, "required": ["lines"]}

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        return ToolOutput({"lines": 3})


async def test_post_hook_updated_output_replaces_content() -> None:
    r = await run(use(), Typed(), gate=Recorder(post=PostToolOutcome(updated_output={"lines": 4})))
    assert content(r) == '{"lines": 4}' and r.output_data == {"lines": 4}


async def test_post_hook_updated_output_failing_schema_keeps_original_with_note() -> None:
    r = await run(use(), Typed(), gate=Recorder(post=PostToolOutcome(updated_output={"lines": "many"})))
    assert not r.is_error and r.output_data == {"lines": 3}
    assert content(r) == (
        '{"lines": 3}\n\n<system-reminder>\nPostToolUse:Read hook error: the updated tool output does not match '
        "the output schema of Read (The parameter `lines` type is expected as `integer` but provided as `string`); "
        "the original output was kept.\n</system-reminder>")


async def test_post_hook_blocked_reason_and_context_are_appended_and_stop_marked() -> None:
    post = PostToolOutcome(additional_context=("ctx one",), blocked=True, reason="looks wrong",
                           stop=True, stop_reason="halt")
    gate = Recorder(post=post)
    r = await run(use(), gate=gate)
    # `continue: false` is all the model is told of the answer: its context and block are dropped (Claude
    # Code 2.1.332); without it, each is inside the result in a labelled reminder
    assert content(r) == ("1\tcontents of /a.txt\n\n<system-reminder>\nPostToolUse:Read hook stopped continuation: "
                          "halt\n</system-reminder>")
    assert r.stop and r.stop_reason == "halt" and not r.is_error
    kept = await run(use(), gate=Recorder(post=attrs.evolve(post, stop=False, stop_reason="")))
    assert content(kept) == ("1\tcontents of /a.txt\n\n<system-reminder>\nPostToolUse:Read hook additional context: "
                             "ctx one\n</system-reminder>\n\n<system-reminder>\nPostToolUse:Read hook blocking error: "
                             "looks wrong\n</system-reminder>")
    assert not kept.stop
    name, response, duration = gate.events[-1][1]
    assert (name, response) == ("Read", "1\tcontents of /a.txt") and duration >= 0


async def test_post_hook_text_appended_to_block_list_content() -> None:
    class Blocks(FakeRead):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            return ToolOutput([{"type": "text", "text": "a"}])

    r = await run(use(), Blocks(), gate=Recorder(post=PostToolOutcome(additional_context=("b",))))
    assert content(r) == [{"type": "text", "text": "a"}, {"type": "text", "text": "<system-reminder>\nPostToolUse:"
                                                                          "Read hook additional context: b\n"
                                                                          "</system-reminder>"}]


async def test_post_hook_crash_keeps_output_and_notes_it() -> None:
    r = await run(use(), gate=Recorder(raises="post"))
    assert not r.is_error
    assert content(r) == ("1\tcontents of /a.txt\n\n<system-reminder>\nPostToolUse:Read hook error: post hook "
                          "crashed\n</system-reminder>")


@pytest.fixture
def plain_structlog() -> Iterator[None]:
    """capture_logs swaps processors but keeps the level filter; an earlier Session in this process
    may have configured logging "off" (a CRITICAL filter), so start from structlog's defaults."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.mark.usefixtures("plain_structlog")
async def test_tool_breaking_its_own_output_schema_is_logged() -> None:
    class Liar(Typed):
        async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
            return ToolOutput({"lines": "x"})

    with structlog.testing.capture_logs() as logs:
        r = await run(use(), Liar())
    assert not r.is_error
    assert any(e["event"] == "tool.output_schema_mismatch" for e in logs)


# --- logging ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("plain_structlog")
async def test_structlog_events_carry_ids_and_durations() -> None:
    with structlog.testing.capture_logs() as logs:
        await run(use())
        await run(use(id="toolu_2"), gate=Recorder(perm=PermissionOutcome("deny", "no")))
    by = {(e["event"], e["tool_use_id"]) for e in logs}
    assert {("tool.start", "toolu_1"), ("tool.result", "toolu_1"), ("tool.denied", "toolu_2")} <= by
    result = next(e for e in logs if e["event"] == "tool.result")
    assert result["tool_name"] == "Read"
    assert {"duration_ms", "run_ms", "hook_ms", "permission_ms"} <= set(result)


# --- the tool table ---------------------------------------------------------------------------


async def test_table_accepts_mapping_and_registry_like_objects() -> None:
    read = FakeRead()

    class Registry:
        def get(self, name: str) -> Tool | None:
            return read if name == "Read" else None

        def names(self) -> list[str]:
            return ["Read"]

    for source in ({"Read": read}, Registry(), [read]):
        table = ToolTable.of(source)
        assert table.lookup("Read") is read
        assert table.suggest("Raed") == "Read"
    assert ToolTable.of({"Read": read}).lookup("ReadFile") is read  # alias resolved by the table


async def test_no_failure_escapes_even_from_a_broken_context_factory() -> None:
    def broken(tid: str) -> ToolContext:
        raise OSError("no cwd")

    r = await run(use(), ctx_factory=broken)
    assert r.is_error and content(r) == "Error: OSError: no cwd" and r.block["tool_use_id"] == "toolu_1"


async def test_validate_input_raising_becomes_error() -> None:
    class Raising(FakeRead):
        async def validate_input(self, input: Mapping[str, Any], ctx: ToolContext) -> ValidationResult:
            raise RuntimeError("validator bug")

    r = await run(use(), Raising())
    assert r.is_error and content(r) == "Error: RuntimeError: validator bug"
