"""What crosses the workflow boundary: the session's input, and each activity's input and outcome.

Every record is a frozen attrs class carried by :mod:`agentfsm.temporal.convert`. Everything here is
in the workflow's history, so records carry **references**, not conversations: a model call names
the messages it needs by uuid and digest (:class:`MessageRef`) and the activity reads them back from
the session file, which the workflow has written before the call. Only what no record holds yet
travels inline, so the history grows with what happened, not with the square of the turns.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from agentfsm.machine.events import Compaction, ModelError, ModelResponse, SetupFailed
from agentfsm.machine.options import AgentDefinition, Options
from agentfsm.machine.state import Limits, LoopState, Message
from agentfsm.runtime.pipeline import CallResult
from agentfsm.runtime.tasks import TaskRecord


@attrs.frozen
class SessionSpec:
    """What a worker needs to rebuild one session's tools, gate and hooks: the serialisable part of
    :class:`agentfsm.machine.options.Options`, the session file, and which model answers (``scripted``: a
    scenario's JSON text, answered by the scripted model; else the Anthropic API from the worker's
    environment)."""

    session_id: str
    cwd: str
    model: str
    fallback_models: tuple[str, ...] = ()
    tools: tuple[str, ...] | None = None
    allowed_tools: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    permission_mode: str | None = None
    limits: Limits = attrs.field(factory=Limits)
    system_prompt: str | None = None
    append_system_prompt: str | None = None
    settings: str | None = None
    setting_sources: tuple[str, ...] = ("user", "project", "local")
    json_schema: Mapping[str, Any] | None = None
    sessions_dir: str | None = None
    trace_path: str | None = None
    parent_session_id: str | None = None
    scripted: str | None = None
    # Options.sandbox: False runs the model's commands outside the kernel sandbox (--no-sandbox)
    sandbox: bool = True
    # the subagent types the Agent tool may launch besides the built-in ones (Options.agents)
    agents: Mapping[str, AgentDefinition] = attrs.field(factory=dict)
    # a subagent's session: its type, how deep it nests, and the session file and prompt id of the
    # session that launched it (its hook inputs name that session, as a local subagent's do)
    agent_type: str | None = None
    depth: int = 0
    parent_trace_path: str | None = None
    parent_prompt_id: str | None = None

    @classmethod
    def of(cls, options: Options, *, session_id: str, trace_path: Path | None,
           scripted: str | None = None) -> SessionSpec:
        return cls(session_id=session_id, cwd=str(options.cwd), model=options.model,
                   fallback_models=tuple(options.fallback_models), tools=options.tools,
                   allowed_tools=tuple(options.allowed_tools), disallowed_tools=tuple(options.disallowed_tools),
                   permission_mode=options.permission_mode, limits=options.limits,
                   system_prompt=options.system_prompt, append_system_prompt=options.append_system_prompt,
                   settings=options.settings, setting_sources=tuple(options.setting_sources),
                   json_schema=options.json_schema,
                   sessions_dir=str(options.sessions_dir) if options.sessions_dir else None,
                   trace_path=str(trace_path) if trace_path else None,
                   parent_session_id=options.parent_session_id, scripted=scripted, sandbox=options.sandbox,
                   agents=dict(options.agents), agent_type=options.agent_type)

    def options(self) -> Options:
        return Options(model=self.model, fallback_models=self.fallback_models, tools=self.tools,
                       allowed_tools=self.allowed_tools, disallowed_tools=self.disallowed_tools,
                       permission_mode=self.permission_mode, limits=self.limits, system_prompt=self.system_prompt,
                       append_system_prompt=self.append_system_prompt, cwd=Path(self.cwd), settings=self.settings,
                       setting_sources=self.setting_sources, session_id=self.session_id,
                       sessions_dir=Path(self.sessions_dir) if self.sessions_dir else None,
                       json_schema=self.json_schema, write_trace=self.trace_path is not None,
                       parent_session_id=self.parent_session_id, sandbox=self.sandbox, agents=dict(self.agents),
                       agent_type=self.agent_type)

    @property
    def models(self) -> tuple[str, ...]:
        return (self.model, *self.fallback_models)


@attrs.frozen
class Timing:
    """The failure-detection settings of a session's activities, in seconds. A worker that dies is
    noticed after ``heartbeat_s`` (plus the retry's ``retry_s``); tests shorten them."""

    model_heartbeat_s: float = 10.0
    tool_heartbeat_s: float = 10.0
    retry_s: float = 1.0
    model_attempts: int = 4


@attrs.frozen
class AccountSnapshot:
    """A run's account (:class:`agentfsm.runtime.result.RunAccount`) carried across continue-as-new."""

    usage: Mapping[str, Any] = attrs.field(factory=dict)
    cost_usd: float = 0.0
    api_ms: float = 0.0
    denials: tuple[Mapping[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    structured_output: Any = None
    last_usage: Mapping[str, Any] | None = None
    counted_upto: int = 0
    model_usage: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    stop_reason: str | None = None
    api_error_status: int | None = None
    api_error_endpoint: str = ""


# the loop's own hook points a workflow asks through an activity
HOOK_EVENTS = ("Stop", "PostToolBatch", "SessionEnd", "SubagentStop")


@attrs.frozen
class RunSetup:
    """What a run is set up with (the ``open_run`` activity): the system prompt, the tools offered, the
    stream-json ``init`` message, the restored history of a resumed or forked session, the prompt after
    SessionStart and UserPromptSubmit (``setup_failed``/``erased`` when a hook stopped it), where the
    session file's record numbers go on, and which history messages the file already records as they
    are (``recorded``: uuid → digest)."""

    system: tuple[Mapping[str, Any], ...]
    tool_names: tuple[str, ...]
    static_tokens: int
    permission_mode: str
    init: Mapping[str, Any]
    first: Message
    history: tuple[Message, ...] = ()
    setup_failed: SetupFailed | None = None
    erased: bool = False
    next_seq: int = 0
    recorded: Mapping[str, str] = attrs.field(factory=dict)
    # the hook events the session has hooks for (asking the others is skipped)
    hook_events: tuple[str, ...] = HOOK_EVENTS
    # the background tasks the resumed session's file says were running when its last run ended: they
    # were cut off with it (agentfsm.runtime.tasks.cut_off), and this run reports them
    cut_off: tuple[TaskRecord, ...] = ()


@attrs.frozen
class Carried:
    """What a run carries into its continuation (continue-as-new): the loop where it is, and the
    run's bookkeeping."""

    state: LoopState
    setup: RunSetup
    account: AccountSnapshot
    seq: int
    recorded: Mapping[str, str]
    requests: int
    out_base: int
    out_tail: tuple[Mapping[str, Any], ...]
    started: float
    read_files: Mapping[str, float] = attrs.field(factory=dict)
    interrupted: bool = False
    aborted: bool = False
    # the uuid of the history's last message when the run's loop began (agentfsm.runtime.runner.LoopRunner)
    began_after: str | None = None
    # the pass the run is in (agentfsm.runtime.result.Passes): its number, start and the usage before it
    pass_index: int = 0
    pass_started: float | None = None
    pass_usage_before: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class SessionInput:
    """One run of a session. ``prompt``: content blocks. ``resume_path``: the session file whose
    history the run continues (``resumed``: it is this session's own file, which already holds the
    header and the history; else a fork's parent). ``live``: activities show each finished block at
    once (a signal per block); off, a response shows when it is complete. ``continue_as_new_after``:
    history length at which the run continues as new (0: when the server suggests it)."""

    spec: SessionSpec
    prompt: tuple[Mapping[str, Any], ...]
    resume_path: str | None = None
    resumed: bool = False
    live: bool = True
    timing: Timing = attrs.field(factory=Timing)
    continue_as_new_after: int = 0
    carried: Carried | None = None


@attrs.frozen
class OpenRunInput:
    spec: SessionSpec
    prompt: tuple[Mapping[str, Any], ...]
    resume_path: str | None
    resumed: bool
    workflow_id: str


@attrs.frozen
class MessageRef:
    """One message of a request: by reference (``uuid`` and ``digest`` of a ``message`` record the
    session file holds), or inline (``message``) when no record holds it as it is."""

    uuid: str
    digest: str = ""
    message: Message | None = None


#: The error type of a model call whose worker does not hold the earlier messages or the spec the
#: request names (the workflow then sends the request whole).
SEND_WHOLE = "agentfsm.send_whole"


def spec_file(trace_path: str) -> str:
    """Where a run's set-up keeps its session spec for the model calls that name it: beside the tool
    calls' outcome files (a name no outcome file has: theirs have no dot before ``.json``)."""
    return str(Path(trace_path).with_suffix(".tools") / "session.spec.json")


def chain_digest(previous: str, ref: MessageRef) -> str:
    """The digest of a request's messages up to and including ``ref``'s, from the digest of those
    before it: their uuids, and the record digests of those passed by reference."""
    return hashlib.sha256(f"{previous}\0{ref.uuid}\0{ref.digest}".encode()).hexdigest()[:24]


def message_digest(role: str, kind: str, content: Any) -> str:
    """The digest a :class:`MessageRef` names: role, kind and content of a message record."""
    text = json.dumps([role, kind, content], ensure_ascii=False, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@attrs.frozen
class ToolTraits:
    """What scheduling needs to know of a call (the worker's registry answers it): the concurrency
    verdict, the interrupt behaviour, and whether the tool says the call only reads (``read_only``: it
    may run again after its worker died, so it runs as a local activity on the workflow's worker);
    ``task``: the background task of the session the call acts on (TaskStop's), so the call runs on the
    worker that runs the task."""

    tool_use_id: str
    safe: bool
    interrupt: str
    read_only: bool = False
    task: str | None = None


@attrs.frozen
class ModelCallInput:
    """One model request. ``request_no``: the session's request count (a scripted model answers with
    the scenario's response of that number, so a retried request gets the same answer)."""

    spec: SessionSpec | None  # None: named by ``spec_digest`` and kept in ``spec_file`` (issue 34)
    workflow_id: str
    run_id: str
    request_no: int
    model: str
    system: tuple[Mapping[str, Any], ...]
    messages: tuple[MessageRef, ...]
    live: bool = True
    # session-file lines the workflow has not written yet (the request's own records among them): the
    # activity appends them (idempotently, by record number) before it reads the messages back
    lines: tuple[tuple[int, str], ...] = ()
    # the request's first ``prefix`` messages are the previous request's (issue 34: a long session does
    # not send its whole history with every call): the worker that served that request keeps them,
    # named by ``prefix_digest`` (:func:`chain_digest`); ``messages`` holds the rest. A worker that
    # does not hold them says so (:data:`SEND_WHOLE`) and the workflow sends the whole list.
    prefix: int = 0
    prefix_digest: str = ""
    # the spec, when not carried: its digest and the file the run's set-up wrote it to (a long session
    # does not send the same spec, scripted scenario included, with every call). A worker that cannot
    # find it says so (:data:`SEND_WHOLE`) and the workflow sends it.
    spec_digest: str = ""
    spec_file: str = ""


@attrs.frozen
class ModelCallOutcome:
    """How a model request ended: ``response`` when the stream finished; otherwise ``error``, with
    ``opened`` telling a failure before the stream from one during it, and ``blocks``/``usage`` what a
    broken stream had delivered. ``traits``: one per tool_use of the response."""

    opened: bool
    model: str
    message_id: str = ""
    response: ModelResponse | None = None
    error: ModelError | None = None
    blocks: tuple[Mapping[str, Any], ...] = ()
    usage: Mapping[str, Any] = attrs.field(factory=dict)
    api_ms: float = 0.0
    traits: tuple[ToolTraits, ...] = ()
    attempt: int = 1


@attrs.frozen
class ToolCallInput:
    spec: SessionSpec
    block: Mapping[str, Any]
    invalid_json: str | None = None
    layers: Mapping[str, Any] = attrs.field(factory=dict)
    read_files: Mapping[str, float] = attrs.field(factory=dict)
    # the running background agents of the session the call may stop (TaskStop): id -> description
    agents: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class ToolCallOutcome:
    """A call's result, what it changed in the session's Read/Edit freshness map, and whether the
    worker running it was lost (``interrupted``: not run again, the result says so)."""

    result: CallResult
    read_files: Mapping[str, float] = attrs.field(factory=dict)
    interrupted: bool = False
    attempt: int = 1
    # how each command of the call ran: the session sandbox's `sandbox` records, for the session file
    sandbox: tuple[Mapping[str, Any], ...] = ()
    # the background tasks the call started (a command run in the background, or moved there by its
    # timeout): each runs on in the worker that started it, watched by a `watch_task` activity
    tasks: tuple[TaskStart, ...] = ()
    # the background tasks the call stopped (TaskStop): the workflow records them stopped by the model
    stopped: tuple[str, ...] = ()
    # the background agents the call launched (Agent): each runs as a child workflow of the session's
    agents: tuple[AgentStart, ...] = ()


@attrs.frozen
class ToolBatchInput:
    """A response's tool calls run one after another in one activity (issue 34: where they would run
    so anyway — each concurrency-unsafe, each finishing when the user interrupts)."""

    spec: SessionSpec
    blocks: tuple[Mapping[str, Any], ...]
    invalid_json: tuple[str | None, ...]
    layers: Mapping[str, Any] = attrs.field(factory=dict)
    read_files: Mapping[str, float] = attrs.field(factory=dict)


@attrs.frozen
class ToolBatchOutcome:
    """The outcomes of the batch's calls that ran, in order (a call the stop cut: its interrupted
    result); ``stopped``: the run was stopped (the activity was cancelled) and the calls after these
    did not start."""

    outcomes: tuple[ToolCallOutcome, ...]
    stopped: bool = False


@attrs.frozen
class TaskStart:
    """A background command a tool call started on a worker: what the session's task record says of
    it, and where it runs (``task_queue``: the worker's own queue, where its ``watch_task`` activity
    must run; ``host``, ``boot_id`` and ``pgid``: so a worker on the same host can kill what is left of
    it when the worker that ran it is lost)."""

    task_id: str
    tool_use_id: str
    description: str
    output_file: str
    command: str
    timeout_ms: float
    task_queue: str
    host: str = ""
    boot_id: str = ""
    pgid: int = 0


@attrs.frozen
class AgentStart:
    """A background agent an Agent call launched: its task record's facts, and the run of its own
    session (``spec``, the prompt ``blocks`` with what the SubagentStart hooks added), which the
    workflow starts as a child workflow."""

    task_id: str  # the agent's session id
    tool_use_id: str
    description: str
    prompt: str
    subagent_type: str
    output_file: str  # the agent's session file
    spec: SessionSpec
    blocks: tuple[Mapping[str, Any], ...]


@attrs.frozen
class TaskEnd:
    """How a background command ended (``status``: ``completed``, ``failed``, or ``killed`` when its
    background timeout or a stop ended it; ``timed_out``: its timeout did; ``stopped``: the model's
    TaskStop did)."""

    status: str
    exit_code: int | None = None
    timed_out: bool = False
    stopped: bool = False


@attrs.frozen
class CompactInput:
    spec: SessionSpec
    request_no: int
    model: str
    system: tuple[Mapping[str, Any], ...]
    messages: tuple[MessageRef, ...]
    trigger: str
    api_message: str = ""  # a reactive compaction's prompt-too-long message (compact.reactive_split reads it)


@attrs.frozen
class CompactOutcome:
    """``requested``: a summary request was sent (it used up a scripted response); ``failure``: why that
    request failed (:attr:`agentfsm.machine.events.CallFailed.compaction_failure`)."""

    compaction: Compaction | None
    requested: bool
    model: str = ""
    usage: Mapping[str, Any] = attrs.field(factory=dict)
    failure: str = ""


@attrs.frozen
class StopInput:
    spec: SessionSpec
    last_assistant_text: str
    stop_hook_active: bool
    # the run's background tasks still running (the Stop hook's ``background_tasks``)
    background_tasks: tuple[Mapping[str, Any], ...] = ()


@attrs.frozen
class PostBatchInput:
    spec: SessionSpec
    calls: tuple[Mapping[str, Any], ...]


@attrs.frozen
class PostBatchOutcome:
    blocked: bool = False
    reason: str = ""
    stop: bool = False
    stop_reason: str = ""
    additional_context: tuple[str, ...] = ()


@attrs.frozen
class TraceBatch:
    """Session-file lines to append, each with its record number (appending is idempotent by it);
    ``settled``: tool calls whose outcome files are no longer needed (``final``: none are)."""

    path: str
    lines: tuple[tuple[int, str], ...]
    settled: tuple[str, ...] = ()
    final: bool = False


@attrs.frozen
class OutputPage:
    """The stream-json messages from ``since`` on (``base``: the number of the first one this run
    still holds, after a continue-as-new), and whether the run has ended. ``final``: the number of the
    run's own result message once it is shown (the results before it end notification passes)."""

    base: int
    messages: tuple[Mapping[str, Any], ...]
    done: bool
    final: int | None = None
