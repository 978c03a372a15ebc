"""The pipeline one ``tool_use`` block goes through (docs/behaviour.md §4).

:func:`run_tool_call` runs the fifteen steps in order, each under its own timer:

 1 name/alias lookup          6 PreToolUse hooks               11 map to a ``tool_result`` block
 2 abort check                7 permission decision            12 PostToolUse hooks
 3 JSON parse / coercion      8 re-validate ``updatedInput``   13 output schema check
 4 JSON Schema validation     9 mark in progress               14 result, context layers, log
 5 the tool's validate_input 10 ``tool.call``                  15 clear in progress (``finally``)

Nothing raised on the way escapes: an unknown tool, bad JSON, a schema violation, a denial, a hook
error, an exception in the tool, even a cancellation all become a :class:`CallResult` whose
``block`` is a ``tool_result`` with the call's id (``is_error: true`` for failures), so the
conversation never holds an unpaired ``tool_use``. Error texts follow Claude Code's.

:class:`ToolTable` wraps whatever registry the host has (a ``tools.ToolRegistry``, a mapping, a
list of tools) and keeps each tool's validators (compiled by :mod:`agentfsm.tools.schema`).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.common.bounded_json import InputRejected, parse_object, rejection
from agentfsm.machine.prompts import (  # noqa: F401 - re-exported: texts of synthetic results, named from here too
    REJECT_MESSAGE,
    STREAMING_FALLBACK,
    USER_INTERRUPTED,
    WORKER_LOST,
    hook_stopped_note,
    synthetic_block,
    synthetic_text,
    tool_use_error,
)
from agentfsm.runtime.ports import PermissionOutcome, PostToolOutcome, PreToolOutcome, ToolGate
from agentfsm.tools.base import Tool, ToolContext, ToolError, ToolOutput
from agentfsm.tools.schema import coerce_input, compile_validator, schema_error, schema_issues

log = fsm_log.get_logger("agentfsm.tools")
#: The service (``ToolContext.services``) that interrupts the run, as the user's interrupt does: called
#: when the permission prompt denies a call with ``interrupt`` (the Agent SDK's
#: ``PermissionResultDeny(interrupt=True)``). The in-process driver provides it.
INTERRUPT_RUN = "interrupt_run"
# The texts of synthetic results live with the loop's other texts (agentfsm.machine.prompts): the machine
# pairs the calls of a response that broke off with them.

# --- texts the model sees --------------------------------------------------------------------

_INVALID_JSON_ECHO_BYTES = 200
_NOT_JSON = "The tool input is not valid JSON"


#: Claude Code's built-in tool names: one the model calls here though the session does not offer it is
#: reported as disabled (not merely unknown).
KNOWN_TOOL_NAMES = frozenset({
    "Agent", "Task", "Bash", "BashOutput", "KillShell", "TaskStop", "TaskOutput", "Glob", "Grep", "Read", "Edit",
    "MultiEdit", "Write", "NotebookEdit", "NotebookRead", "WebFetch", "WebSearch", "TodoWrite", "TodoRead",
    "ExitPlanMode", "EnterPlanMode", "SlashCommand", "Skill", "AskUserQuestion", "LS", "StructuredOutput",
})


def reminder(text: str) -> str:
    """``text`` in a ``<system-reminder>``: hook output the model should read as context, not as output."""
    return f"<system-reminder>\n{text}\n</system-reminder>"


# --- records ---------------------------------------------------------------------------------


@attrs.frozen
class CallTimings:
    """Milliseconds. ``steps`` maps ``"NN_name"`` to the time spent in each pipeline step."""

    hook_ms: float = 0.0
    permission_ms: float = 0.0
    run_ms: float = 0.0
    total_ms: float = 0.0
    steps: Mapping[str, float] = attrs.field(factory=dict)


@attrs.frozen
class CallResult:
    """How one tool call ended. ``block`` is the wire ``tool_result`` (no extra keys: it is sent as
    is); the other fields are for the loop: ``deferred`` (a PreToolUse hook deferred the call, it
    did not run), ``stop`` (a hook said ``continue: false``), ``ends_turn``, ``permission_denial``
    (``{tool_name, tool_use_id, tool_input}`` for the run's result), ``cancel_reason`` (set on
    synthetic results: ``user_interrupted``, ``streaming_fallback``, ...), ``output_data`` (what the
    tool returned, after any hook replacement) and ``tool_input`` (the input the tool ran with)."""

    tool_use_id: str
    tool_name: str
    block: Mapping[str, Any]
    is_error: bool = False
    tool_input: Mapping[str, Any] = attrs.field(factory=dict)
    output_data: Any = None
    context_layers: Mapping[str, Any] = attrs.field(factory=dict)
    ends_turn: bool = False
    # what an SDK user receives as the structured result (``tool_use_result``); None: derived from the block
    structured: Any = None
    deferred: bool = False
    stop: bool = False
    stop_reason: str = ""
    permission_denial: Mapping[str, Any] | None = None
    cancel_reason: str | None = None
    # text blocks for the model sent after the batch's results (in the same user message)
    after: tuple[Mapping[str, Any], ...] = ()
    timings: CallTimings = attrs.field(factory=CallTimings)

    @property
    def interrupted(self) -> bool:
        return self.cancel_reason == USER_INTERRUPTED


def synthetic_result(tool_use_id: str, tool_name: str, reason: str,
                     tool_input: Mapping[str, Any] | None = None) -> CallResult:
    """An error result for a call that never ran (or was cut short) for ``reason``."""
    block = synthetic_block(tool_use_id, reason)
    return CallResult(tool_use_id, tool_name, block, is_error=True, tool_input=dict(tool_input or {}),
                      cancel_reason=reason)


# --- the tool table: lookup, suggestions, compiled schemas -----------------------------------


@attrs.frozen
class Plan:
    """Which steps do anything for one tool under one gate, decided once per run (issue 34): the
    tool's own ``validate_input`` (5) when it has one, the PreToolUse (6), PostToolUse (12) and
    PostToolUseFailure hook points when the gate has a hook for them (a gate that cannot say runs
    them all), the output check (13) when the tool declares an output schema or a PostToolUse hook
    may replace the output. A step left out is one whose answer is known: the base validator's
    "valid", no hook's empty outcome, no schema's "no problems". The gate's hooks are fixed when it
    is built (agentfsm.hooks.gate), so the plan holds for the run."""

    validate: bool = True
    pre_hooks: bool = True
    post_hooks: bool = True
    failure_hooks: bool = True
    output_check: bool = True


def compile_plan(tool: Tool, gate: Any) -> Plan:
    has_hooks = getattr(gate, "has_hooks", None)

    def hooks(event: str) -> bool:
        return True if not callable(has_hooks) else bool(has_hooks(event))

    own_validate = (getattr(type(tool), "validate_input", None) is not Tool.validate_input
                    or "validate_input" in getattr(tool, "__dict__", {}))
    post = hooks("PostToolUse")
    return Plan(validate=own_validate, pre_hooks=hooks("PreToolUse"), post_hooks=post,
                failure_hooks=hooks("PostToolUseFailure"),
                output_check=post or getattr(tool, "output_schema", None) is not None)


# the PreToolUse answer when no hook is configured (what a gate's pre_tool_use answers then)
_NO_PRE = PreToolOutcome()


@attrs.frozen
class PreparedInput:
    """Step 3/4 outcome: the coerced input and the schema issues (empty = valid)."""

    input: dict[str, Any]
    issues: tuple[str, ...] = ()
    invalid_json: bool = False


class ToolTable:
    """Name/alias lookup and cached validators over the host's registry.

    ``source`` may be a :class:`ToolTable`, an object with ``lookup(name)`` or ``get(name)`` (and
    optionally ``names()`` / iteration over its tools), a ``Mapping[str, Tool]`` or an iterable of
    tools. Aliases are resolved here when the source does not resolve them itself.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        # keyed by id(tool); the tool is kept in the value so the id cannot be reused
        self._validators: dict[int, tuple[Tool, Any]] = {}
        self._out_validators: dict[int, tuple[Tool, Any]] = {}
        # compiled once per tool and gate (keyed by their ids; both kept so neither id is reused)
        self._plans: dict[tuple[int, int], tuple[Tool, Any, Plan]] = {}
        self._static: list[Tool] | None = None
        # asked once: an ABC check of a registry that is no Mapping costs ~µs on every lookup
        self._mapping = isinstance(source, Mapping)
        if not self._mapping and not any(
                hasattr(source, a) for a in ("lookup", "get", "tools")) and not callable(source):
            self._static = list(source)

    @classmethod
    def of(cls, source: Any) -> ToolTable:
        return source if isinstance(source, ToolTable) else cls(source)

    def tools(self) -> list[Tool]:
        src = self._source
        if self._static is not None:
            return self._static
        if self._mapping:
            return list(src.values())
        held = getattr(src, "tools", None)
        if callable(held):
            held = held()
        if held is not None:
            return list(held.values() if isinstance(held, Mapping) else held)
        try:
            return [t for t in src if isinstance(t, Tool)]
        except TypeError:
            return []

    def names(self) -> list[str]:
        names = getattr(self._source, "names", None)
        if callable(names):
            return list(names())
        return [t.name for t in self.tools()]

    def lookup(self, name: str) -> Tool | None:
        tool = self._direct(name)
        if tool is not None:
            return tool
        for t in self.tools():
            if name == t.name or name in t.aliases:
                return t
        return None

    def _direct(self, name: str) -> Tool | None:
        src = self._source
        if self._static is not None:
            return None
        try:
            if self._mapping:
                return src.get(name)
            for attr in ("lookup", "get"):
                fn = getattr(src, attr, None)
                if callable(fn):
                    return fn(name)
            if callable(src):
                return src(name)
        except LookupError:
            return None
        return None

    def same_but_case(self, name: str) -> str | None:
        """The offered tool whose name is ``name`` in other letters' case (``read`` for Read), if any."""
        low = name.lower()
        return next((n for n in self.names() if n.lower() == low and n != name), None)

    def suggest(self, name: str) -> str | None:
        """The closest known tool name (aliases count, the canonical name is returned)."""
        closest = getattr(self._source, "closest", None)
        if callable(closest):  # the registry's own answer keeps every "did you mean" consistent
            found = closest(name)
            return found if isinstance(found, str) else None
        canon: dict[str, str] = {}
        for t in self.tools():
            for n in (t.name, *t.aliases):
                canon.setdefault(n.lower(), t.name)
        for n in self.names():
            canon.setdefault(n.lower(), n)
        hit = difflib.get_close_matches(name.lower(), list(canon), n=1, cutoff=0.6)
        return canon[hit[0]] if hit else None

    def plan(self, tool: Tool, gate: Any) -> Plan:
        """The steps that do anything for ``tool`` under ``gate`` (:func:`compile_plan`), once."""
        hit = self._plans.get((id(tool), id(gate)))
        if hit is not None and hit[0] is tool and hit[1] is gate:
            return hit[2]
        plan = compile_plan(tool, gate)
        self._plans[(id(tool), id(gate))] = (tool, gate, plan)
        return plan

    # schemas ---------------------------------------------------------------------------------

    def input_validator(self, tool: Tool) -> Any:
        """Compiled once per tool; raises :class:`jsonschema.SchemaError` for a broken schema."""
        return self._compiled(self._validators, tool, tool.input_schema)[0]

    @staticmethod
    def _compiled(cache: dict[int, tuple[Tool, Any, Any]], tool: Tool,
                  schema: Mapping[str, Any]) -> tuple[Any, Callable[[Any], bool] | None]:
        """(jsonschema validator, fast acceptance check or None) for ``schema``."""
        hit = cache.get(id(tool))
        if hit is not None and hit[0] is tool:
            return hit[1], hit[2]
        validator, fast = compile_validator(schema)
        cache[id(tool)] = (tool, validator, fast)
        return validator, fast

    def prepare_input(self, tool: Tool, raw: Any, invalid_json: str | None = None) -> PreparedInput:
        """Steps 3 and 4: parse, coerce and validate. Raises only for a broken tool schema."""
        if invalid_json is None and isinstance(raw, str):
            try:
                raw = parse_object(raw)
            except InputRejected:
                invalid_json = raw
        if invalid_json is not None:
            return PreparedInput({}, (invalid_json_issue(invalid_json),), invalid_json=True)
        coerced = coerce_input(raw, tool.input_schema)
        return PreparedInput(coerced if isinstance(coerced, dict) else {},
                             tuple(self.input_issues(tool, coerced)))

    def input_issues(self, tool: Tool, value: Any) -> list[str]:
        validator, fast = self._compiled(self._validators, tool, tool.input_schema)
        if fast is not None and fast(value):
            return []
        return schema_issues(validator, value)

    def output_issues(self, tool: Tool, data: Any) -> list[str]:
        if tool.output_schema is None:
            return []
        validator, fast = self._compiled(self._out_validators, tool, tool.output_schema)
        if fast is not None and fast(data):
            return []
        return schema_issues(validator, data)


def input_validation_error(tool_name: str, issues: Iterable[str]) -> str:
    lines = list(issues)
    # "issue" for one, "issues" for more: Claude Code 2.1.332's words (tests/fidelity/conform/conform-03f0f82180.json)
    head = "the following issue" if len(lines) == 1 else "the following issues"
    return tool_use_error(f"InputValidationError: {tool_name} failed due to {head}:\n" + "\n".join(lines))


def invalid_json_error(tool_name: str, raw: str) -> str:
    """The result for a call whose input text was refused. Text that does not parse as JSON (cut off
    at ``content_block_stop``, an unescaped backslash) gets Claude Code 2.1.332's wording, so a model
    sees the same correction prompt from either client: the head of the text, counted (like Claude
    Code) in UTF-16 code units, and the usual causes. Too large, too deep or not an object keep
    :func:`invalid_json_issue`'s listing, which says which bound it broke."""
    why = rejection(raw)
    if why is not None and why != _NOT_JSON:
        return input_validation_error(tool_name, [invalid_json_issue(raw)])
    units = len(raw.encode("utf-16-le")) // 2
    head, used = [], 0
    for ch in raw:
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > _INVALID_JSON_ECHO_BYTES:
            break
        head.append(ch)
    shown = "".join(head)
    return tool_use_error(
        f"InputValidationError: {tool_name} was called with input that could not be parsed as JSON.\n"
        f"You sent (first {min(units, _INVALID_JSON_ECHO_BYTES)} of {units} bytes): {shown}\n"
        "Common causes: unescaped backslashes in file paths (use / or \\\\), unescaped control characters, "
        "or truncated output. Retry with valid JSON.")


def invalid_json_issue(raw: str) -> str:
    """What is wrong with a tool input's text (not JSON, too deep, too large, not an object), with
    its first bytes."""
    why = rejection(raw) or _NOT_JSON
    data = raw[:_INVALID_JSON_ECHO_BYTES].encode("utf-8", errors="surrogatepass")
    head = data[:_INVALID_JSON_ECHO_BYTES].decode("utf-8", errors="ignore")
    more = "…" if len(raw) > _INVALID_JSON_ECHO_BYTES or len(data) > _INVALID_JSON_ECHO_BYTES else ""
    return (f"{why}: {head}{more}\n"
            "Send the tool call again with its input as one complete, valid JSON object.")


# --- the pipeline ----------------------------------------------------------------------------


class _Clock:
    """Per-step timings; steps that run twice (re-validation) accumulate.

    ``with clock.step(n, name):`` times one step. The clock is its own context manager (a stack of
    open steps keeps nesting correct) instead of a ``contextlib.contextmanager``: every call runs
    fifteen steps, and a generator-based context manager per step cost more than most steps."""

    __slots__ = ("_open", "steps", "t0")

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.steps: dict[str, float] = {}
        self._open: list[tuple[str, float]] = []

    def step(self, n: int, name: str) -> _Clock:
        key = _STEP_KEYS.get((n, name))
        if key is None:
            key = _STEP_KEYS.setdefault((n, name), f"{n:02d}_{name}")
        self._open.append((key, 0.0))
        return self

    def __enter__(self) -> None:
        key, _ = self._open[-1]
        self._open[-1] = (key, time.perf_counter())

    def __exit__(self, *_exc: object) -> None:
        end = time.perf_counter()
        key, start = self._open.pop()
        self.steps[key] = self.steps.get(key, 0.0) + (end - start) * 1000

    def total(self) -> float:
        return (time.perf_counter() - self.t0) * 1000


_STEP_KEYS: dict[tuple[int, str], str] = {}


def _nothing() -> None:
    return None


def _default_ctx(tool_use_id: str) -> ToolContext:
    return ToolContext(cwd=Path.cwd(), tool_use_id=tool_use_id)


async def run_tool_call(
    block: Mapping[str, Any],
    *,
    lookup: Any,
    gate: ToolGate,
    ctx_factory: Callable[[str], ToolContext] | None = None,
    invalid_json: str | None = None,
    abort: asyncio.Event | None = None,
    in_progress: set[str] | None = None,
    prepared: tuple[Tool, PreparedInput] | None = None,
    on_checked: Callable[[], None] | None = None,
) -> CallResult:
    """Run one ``tool_use`` block through the 15 steps; never raises (cancellation included: a
    cancelled call returns a ``user_interrupted`` result, which is what the executor relies on).

    ``lookup``: the tool registry (see :class:`ToolTable`). ``invalid_json``: the raw input text when
    the streamed JSON did not parse (``ModelResponse.invalid_tool_inputs``). ``abort``: checked
    before anything else happens, besides the context's own ``abort``. ``in_progress``: a set the
    call's id is in while the tool itself runs. ``prepared``: steps 3-4 already done for this block
    (the executor validates the input to judge concurrency safety) and the tool they were done for;
    reused when the lookup finds that same tool, so the schema runs once per call, not twice.
    ``on_checked``: told when the call's checks are behind it (lookup, schema, input validation, the
    permission decision) and its tool is about to run, or before it waits on a PreToolUse hook (a process
    of its own). A call the checks reject finishes instead.
    """
    call = _Call(block, ToolTable.of(lookup), gate, ctx_factory or _default_ctx,
                 in_progress if in_progress is not None else set(), on_checked)
    try:
        return await call.run(invalid_json, abort, prepared)
    except asyncio.CancelledError:
        call.log.info("tool.interrupted", step="before_call")
        return call.cancelled(USER_INTERRUPTED)
    except Exception as exc:  # the net under every step: the loop must never see a raw exception
        call.log.exception("tool.pipeline_error")
        return call.error(f"Error: {type(exc).__name__}: {exc}")
    finally:
        # step 15
        with call.clock.step(15, "clear_in_progress"):
            call.in_progress.discard(call.tool_use_id)


class _Call:
    """State of one call while it moves through the steps."""

    def __init__(self, block: Mapping[str, Any], table: ToolTable, gate: ToolGate,
                 ctx_factory: Callable[[str], ToolContext], in_progress: set[str],
                 on_checked: Callable[[], None] | None = None) -> None:
        self.block = block
        self.checked = on_checked or _nothing
        self.tool_use_id = str(block.get("id", ""))
        self.name = str(block.get("name", ""))
        self.table = table
        self.gate = gate
        self.ctx_factory = ctx_factory
        self.in_progress = in_progress
        self.clock = _Clock()
        self.tool: Tool | None = None
        self.input: dict[str, Any] = dict(block["input"]) if isinstance(block.get("input"), Mapping) else {}
        self.notes: list[str] = []  # text for the model appended to the result (hook context, notes)
        self.after: list[str] = []  # text blocks sent after the results (PreToolUse context)
        self.hook_ms = 0.0
        self.permission_ms = 0.0
        self.run_ms = 0.0
        self.stop = False
        self.stop_reason = ""
        self.plan = Plan()  # every step, until the lookup found the tool and its plan
        self.log = log.bind(tool_use_id=self.tool_use_id, tool_name=self.name)

    # result builders ---------------------------------------------------------------------------

    def _timings(self) -> CallTimings:
        # the live dict, so step 15 (timed in run_tool_call's finally) shows up too
        return CallTimings(self.hook_ms, self.permission_ms, self.run_ms, self.clock.total(),
                           self.clock.steps)

    def result(self, block: Mapping[str, Any], *, is_error: bool, output_data: Any = None,
               structured: Any = None,
               context_layers: Mapping[str, Any] | None = None, ends_turn: bool = False,
               deferred: bool = False, denial: Mapping[str, Any] | None = None,
               cancel_reason: str | None = None) -> CallResult:
        out = dict(_append_texts(block, self.notes))
        out["type"], out["tool_use_id"] = "tool_result", self.tool_use_id
        if is_error:
            out["is_error"] = True
        else:
            out.pop("is_error", None)
        res = CallResult(self.tool_use_id, self.name, out, is_error=is_error, tool_input=dict(self.input),
                         after=tuple({"type": "text", "text": t} for t in self.after),
                         output_data=output_data, structured=structured,
                         context_layers=dict(context_layers or {}),
                         ends_turn=ends_turn, deferred=deferred, stop=self.stop,
                         stop_reason=self.stop_reason, permission_denial=denial,
                         cancel_reason=cancel_reason, timings=self._timings())
        self.log.info("tool.result", is_error=is_error, deferred=deferred, cancel_reason=cancel_reason,
                      duration_ms=round(res.timings.total_ms, 3), run_ms=round(self.run_ms, 3),
                      hook_ms=round(self.hook_ms, 3), permission_ms=round(self.permission_ms, 3))
        return res

    def _denied_input(self, cwd: Path) -> dict[str, Any]:
        """The input as a permission denial lists it: as the tool echoes it (:meth:`Tool.denial_input`:
        Claude Code lists ``replace_all: false`` for an Edit that did not give it, and a file tool's
        path absolute and normalised)."""
        if self.tool is None:
            return dict(self.input)
        return self.tool.denial_input(self.input, cwd)

    def error(self, text: str, **kw: Any) -> CallResult:
        return self.result({"content": text}, is_error=True, **kw)

    def cancelled(self, reason: str) -> CallResult:
        return self.result({"content": synthetic_text(reason)}, is_error=True, cancel_reason=reason)

    # the steps ---------------------------------------------------------------------------------

    async def run(self, invalid_json: str | None, abort: asyncio.Event | None,
                  prepared: tuple[Tool, PreparedInput] | None = None) -> CallResult:
        clock = self.clock
        self.log.info("tool.start")

        with clock.step(1, "lookup"):
            tool = self.table.lookup(self.name)
            if tool is None:
                same = self.table.same_but_case(self.name)
                self.log.warning("tool.unknown", suggestion=same or self.table.suggest(self.name))
                # In Claude Code 2.1.332's words (docs/conform.md): a tool offered under the same name in
                # other letters' case is named; a tool it has but this session does not offer is said to
                # be off for good (the model stops trying it); any other name is just unknown (no guess at
                # a near miss: the model chooses from the tools it was given)
                if same is not None:
                    why = f". Tool names are case-sensitive: call {same} instead."
                elif self.name in KNOWN_TOOL_NAMES:
                    why = f". {self.name} is disabled for this session, in subagents as well as here."
                else:
                    why = ""
                return self.error(f"<tool_use_error>Error: No such tool available: {self.name}{why}</tool_use_error>")
            self.tool = tool
            plan = self.plan = self.table.plan(tool, self.gate)
            if tool.name != self.name:  # called by an alias: hooks and rules see the canonical name
                self.name = tool.name
                self.log = self.log.bind(tool_name=tool.name, alias=self.block.get("name"))

        with clock.step(2, "abort_check"):
            ctx = self.ctx_factory(self.tool_use_id)
            ctx.tool_use_id = self.tool_use_id
            if (abort is not None and abort.is_set()) or ctx.abort.is_set():
                # as Claude Code does: an aborted call is answered before its input is even parsed, no hooks run
                self.log.info("tool.aborted_before_start")
                return self.cancelled(USER_INTERRUPTED)

        done = prepared[1] if prepared is not None and prepared[0] is tool else None
        with clock.step(3, "parse_coerce"):
            raw = self.block.get("input", {})
            if done is not None and not done.invalid_json and invalid_json is None \
                    and not isinstance(raw, str):
                coerced: Any = done.input
            else:
                done = None
                if invalid_json is not None or isinstance(raw, str):
                    parsed = self.table.prepare_input(tool, raw, invalid_json)
                    if parsed.invalid_json:
                        self.log.warning("tool.invalid_json", raw_bytes=len(str(invalid_json or raw)))
                        return self.error(invalid_json_error(self.name, str(invalid_json or raw)))
                    raw = parsed.input
                coerced = coerce_input(raw, tool.input_schema)
            self.input = coerced if isinstance(coerced, dict) else {}

        with clock.step(4, "schema"):
            try:
                issues = list(done.issues) if done is not None else self.table.input_issues(tool, coerced)
            except Exception as exc:
                if (why := schema_error(exc)) is None:
                    raise
                self.log.error("tool.bad_schema", error=why)
                return self.error(tool_use_error(f"Error: the input schema of {self.name} is invalid: {why}"))
            if issues:
                self.log.warning("tool.invalid_input", issues=issues)
                own = tool.invalid_input_text(coerced)
                return self.error(own if own else input_validation_error(self.name, issues))

        if plan.validate:
            with clock.step(5, "validate_input"):
                verdict = await tool.validate_input(self.input, ctx)
                if not verdict.ok and verdict.denied:
                    # the input names a file the permission settings deny: a denial, listed as one
                    # (checked before anything else about the file is said, as Claude Code does)
                    self.log.info("tool.denied", behavior="deny", reason=verdict.message, rule="file access")
                    return self.error(verdict.message or f"Permission to use {self.name} has been denied.",
                                      denial={"tool_name": self.name, "tool_use_id": self.tool_use_id,
                                              "tool_input": self._denied_input(ctx.cwd)})
                if not verdict.ok:
                    self.log.info("tool.rejected_input", message=verdict.message)
                    return self.error(tool_use_error(verdict.message or f"{self.name}: invalid input"))

        pre: PreToolOutcome = _NO_PRE
        if plan.pre_hooks:
            self.checked()  # a hook is a process of its own
            with clock.step(6, "pre_tool_use"):
                t = time.perf_counter()
                try:
                    pre = await self.gate.pre_tool_use(self.name, self.input, self.tool_use_id)
                except Exception as exc:  # a broken hook must not let the call through unchecked
                    self.log.warning("tool.hook_error", hook="PreToolUse", error=repr(exc))
                    return self.error(f"PreToolUse:{self.name} hook error: {exc}")
                finally:
                    self.hook_ms += (time.perf_counter() - t) * 1000
                # Claude Code sends a PreToolUse context as its own block after the results, labelled
                self.after.extend(reminder(f"PreToolUse:{self.name} hook additional context: {c}")
                                  for c in pre.additional_context)
                if pre.stop:
                    self.stop, self.stop_reason = True, pre.stop_reason
                    # Claude Code 2.1.332 (oracle runs, docs/conform.md): alone, the note goes inside the
                    # result; after the hook's context, it is a block of its own after it, ending in a newline
                    note = hook_stopped_note("PreToolUse", self.name, pre.stop_reason)
                    if pre.additional_context:
                        self.after.append(note + "\n")
                    else:
                        self.notes.append(note)
                if pre.blocked:
                    self.log.info("tool.blocked", hook="PreToolUse", reason=pre.reason)
                    # a hook that blocks the call (exit 2) denied it: listed as a denial, as Claude Code does
                    return self.error(f"PreToolUse:{self.name} hook error: {pre.reason}",
                                      denial={"tool_name": self.name, "tool_use_id": self.tool_use_id,
                                              "tool_input": self._denied_input(ctx.cwd)})
                if pre.decision == "defer":
                    self.log.info("tool.deferred", reason=pre.reason)
                    why = f": {pre.reason}" if pre.reason else ""
                    return self.error(tool_use_error(f"The {self.name} call was deferred by a PreToolUse "
                                                     f"hook{why}. It has not run."), deferred=True)

        if pre.updated_input is not None:
            bad = self._revalidate("PreToolUse hook", pre.updated_input)
            if bad is not None:
                return bad

        with clock.step(7, "permission"):
            t = time.perf_counter()
            try:
                perm: PermissionOutcome = await self.gate.permission(tool, self.input, pre,
                                                                      tool_use_id=self.tool_use_id)
            except Exception as exc:
                self.log.warning("tool.permission_error", error=repr(exc))
                return self.error(tool_use_error(f"Error: the permission check for {self.name} failed: "
                                                 f"{type(exc).__name__}: {exc}"))
            finally:
                self.permission_ms += (time.perf_counter() - t) * 1000
            if perm.behavior != "allow":
                # "ask" reaching the pipeline means nobody could answer: a denial (docs/behaviour.md §5)
                reason = perm.reason or f"Permission to use {self.name} has been denied."
                denial = {"tool_name": self.name, "tool_use_id": self.tool_use_id,
                          "tool_input": self._denied_input(ctx.cwd)}
                self.log.info("tool.denied", behavior=perm.behavior, reason=reason, rule=perm.rule)
                interrupt_run = ctx.services.get(INTERRUPT_RUN) if perm.interrupt else None
                if callable(interrupt_run):
                    interrupt_run()
                return self.error(reason, denial=denial)
        if perm.updated_input is not None:
            bad = self._revalidate("permission check", perm.updated_input)
            if bad is not None:
                return bad
        ctx.user_modified = perm.user_modified

        self.checked()
        with clock.step(9, "mark_in_progress"):
            self.in_progress.add(self.tool_use_id)

        t = time.perf_counter()
        with clock.step(10, "call"):
            try:
                output = await _invoke(tool, self.input, ctx)
            except ToolError as exc:
                self.run_ms = (time.perf_counter() - t) * 1000
                self.log.info("tool.error", error=str(exc))
                await self._post_failure(str(exc), is_interrupt=False)
                return self.error(tool_use_error(str(exc)) if getattr(exc, "wrapped", True) else str(exc))
            except asyncio.CancelledError:
                self.run_ms = (time.perf_counter() - t) * 1000
                self.log.info("tool.interrupted", step="call")
                await self._post_failure("The user interrupted the tool call", is_interrupt=True)
                return self.cancelled(USER_INTERRUPTED)
            except Exception as exc:
                self.run_ms = (time.perf_counter() - t) * 1000
                text = f"Error: {type(exc).__name__}: {exc}"
                self.log.warning("tool.exception", error=text, exc_info=True)
                await self._post_failure(text, is_interrupt=False)
                return self.error(text)
            self.run_ms = (time.perf_counter() - t) * 1000

        with clock.step(11, "map_result"):
            mapped = self._map(tool, output)
            if isinstance(mapped, CallResult):
                return mapped

        post: PostToolOutcome | None = None
        if output.is_error:  # a failed call (a shell command's exit code): PostToolUseFailure, as Claude Code
            if plan.failure_hooks:
                with clock.step(12, "post_tool_use"):
                    await self._post_failure(_content_text(mapped), is_interrupt=False)
            return self.result(mapped, is_error=True, output_data=output.data,
                               context_layers=output.context_layers, ends_turn=output.ends_turn)
        if plan.post_hooks:
            with clock.step(12, "post_tool_use"):
                t = time.perf_counter()
                try:
                    post = await self.gate.post_tool_use(self.name, self.input, self.tool_use_id,
                                                         sdk_result(output), self.run_ms)
                except (Exception, asyncio.CancelledError) as exc:
                    # the tool already ran: its output stands (an interrupt now must not claim otherwise)
                    self.log.warning("tool.hook_error", hook="PostToolUse", error=repr(exc))
                    self.notes.append(reminder(f"PostToolUse:{self.name} hook error: {exc}"))
                finally:
                    self.hook_ms += (time.perf_counter() - t) * 1000
                if post is not None:
                    self._apply_post(post, "PostToolUse")

        if plan.output_check:
            with clock.step(13, "output_schema"):
                if post is not None and post.updated_output is not None:
                    output, mapped = self._replace_output(tool, output, mapped, post.updated_output)
                elif not output.is_error:
                    self._check_own_output(tool, output)

        with clock.step(14, "result"):
            return self.result(mapped, is_error=bool(output.is_error), output_data=output.data,
                               structured=None if output.is_error else sdk_result(output),
                               context_layers=output.context_layers,
                               ends_turn=output.ends_turn or (tool.ends_turn and not output.is_error))

    # step helpers ------------------------------------------------------------------------------

    def _revalidate(self, source: str, updated: Mapping[str, Any]) -> CallResult | None:
        """Step 8: an ``updatedInput`` goes through the schema again; an invalid one is a
        configuration error and never reaches the tool."""
        assert self.tool is not None
        with self.clock.step(8, "revalidate"):
            candidate = coerce_input(dict(updated), self.tool.input_schema)
            issues = self.table.input_issues(self.tool, candidate)
            if issues:
                self.log.error("tool.invalid_updated_input", source=source, issues=issues)
                return self.error(tool_use_error(
                    f"Error: the {source} returned an updatedInput for {self.name} that does not match "
                    f"its input schema (a configuration error); the call was not run:\n"
                    + "\n".join(issues)))
            self.input = candidate
            return None

    def _map(self, tool: Tool, output: ToolOutput) -> Mapping[str, Any] | CallResult:
        try:
            return tool.map_result(output, self.tool_use_id)
        except Exception as exc:
            self.log.warning("tool.map_error", error=repr(exc), exc_info=True)
            return self.error(f"Error: {type(exc).__name__}: {exc}")

    def _apply_post(self, post: PostToolOutcome, event: str) -> None:
        if post.stop:
            # `continue: false` is all the model is told of this hook's answer: its context and its block are
            # dropped (Claude Code 2.1.332, oracle runs, docs/conform.md)
            self.stop, self.stop_reason = True, post.stop_reason or self.stop_reason
            self.notes.append(hook_stopped_note(event, self.name, post.stop_reason))
            return
        # inside the tool_result, each in a labelled reminder (Claude Code's form)
        self.notes.extend(reminder(f"{event}:{self.name} hook additional context: {c}")
                          for c in post.additional_context)
        if post.blocked:
            self.log.info("tool.post_blocked", hook=event, reason=post.reason)
            self.notes.append(reminder(f"{event}:{self.name} hook blocking error: {post.reason}"))

    def _replace_output(self, tool: Tool, output: ToolOutput, mapped: Mapping[str, Any],
                        updated: Any) -> tuple[ToolOutput, Mapping[str, Any]]:
        """Step 13 for a hook replacement: it must pass the tool's output schema, else the original
        output stays and the model is told why."""
        try:
            problems = self.table.output_issues(tool, updated)
        except Exception as exc:
            if (why := schema_error(exc)) is None:
                raise
            problems = [f"the output schema is invalid: {why}"]
        if problems:
            self.log.warning("tool.updated_output_rejected", problems=problems)
            self.notes.append(reminder(f"PostToolUse:{self.name} hook error: the updated tool output does not "
                              f"match the output schema of {self.name} ({'; '.join(problems)}); "
                              "the original output was kept."))
            return output, mapped
        replaced = attrs.evolve(output, data=updated, structured=None)
        remapped = self._map(tool, replaced)
        if isinstance(remapped, CallResult):
            self.notes.append(reminder(f"PostToolUse:{self.name} hook error: the updated tool output could not "
                                       "be mapped to a tool result; the original output was kept."))
            return output, mapped
        return replaced, remapped

    def _check_own_output(self, tool: Tool, output: ToolOutput) -> None:
        try:
            problems = self.table.output_issues(tool, output.data)
        except Exception as exc:
            if (why := schema_error(exc)) is None:
                raise
            problems = [f"the output schema is invalid: {why}"]
        if problems:
            # the tool broke its own contract; the model still gets the data, the log gets the bug
            self.log.warning("tool.output_schema_mismatch", problems=problems)

    async def _post_failure(self, error: str, *, is_interrupt: bool) -> None:
        if not self.plan.failure_hooks:
            return
        t = time.perf_counter()
        try:
            post = await self.gate.post_tool_use_failure(self.name, self.input, self.tool_use_id, error,
                                                         is_interrupt, duration_ms=self.run_ms)
        except (Exception, asyncio.CancelledError) as exc:
            # a second cancellation while reporting the first must still end in a result
            self.log.warning("tool.hook_error", hook="PostToolUseFailure", error=repr(exc))
            return
        finally:
            self.hook_ms += (time.perf_counter() - t) * 1000
        self._apply_post(post, "PostToolUseFailure")


async def _invoke(tool: Tool, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
    """``call`` is normally a coroutine; an async generator is accepted too (each yielded item is
    progress, a yielded :class:`ToolOutput` is the result)."""
    produced: Any = tool.call(input, ctx)
    if inspect.isasyncgen(produced):
        final: ToolOutput | None = None
        async for item in produced:
            if isinstance(item, ToolOutput):
                final = item
            else:
                ctx.progress(item)
        if final is None:
            raise RuntimeError(f"{tool.name}.call yielded no ToolOutput")
        return final
    value = await produced
    return value if isinstance(value, ToolOutput) else ToolOutput(value)


def _append_texts(block: Mapping[str, Any], texts: Sequence[str]) -> Mapping[str, Any]:
    if not texts:
        return block
    content = block.get("content")
    if content is None or content == "":
        new: Any = "\n\n".join(texts)
    elif isinstance(content, str):
        # the output right-trimmed first, as Claude Code does before it adds a reminder
        new = "\n\n".join([content.rstrip(), *texts])
    else:
        new = [*content, *({"type": "text", "text": t} for t in texts)]
    return {**block, "content": new}


def sdk_result(output: ToolOutput) -> Any:
    """What an SDK user receives for a call's output (PostToolUse's ``tool_response``, the stream's
    ``tool_use_result``): the tool's structured result, else the data the model's result came from."""
    return output.structured if output.structured is not None else output.data


def _content_text(block: Mapping[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in content or () if isinstance(b, Mapping) and b.get("type") == "text")
