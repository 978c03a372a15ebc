"""Drive the real loop with scripted model behaviour and check every docs/behaviour.md §3 invariant (public kit).

Three layers, each usable on its own:

* :class:`LoopHarness` — one :class:`~agentfsm.sessions.session.Session` (the real
:class:`~agentfsm.runtime.driver.Driver`)
  talking to an in-process :class:`~agentfsm.testing.ScriptedModel` that answers from a queue of
  responses. The model is reactive: at every request it reads the session's trace (flushed record
  by record) to learn where the loop is, so the checks run *during* the run, step by step, not only
  on its outcome. Each run returns a :class:`LoopRun`.
* :func:`run_loop` — one run of a script in a fresh harness, for ``@given`` tests with
  :func:`agentfsm.testing.strategies.model_behaviours`; :func:`invariant_violations` /
  :func:`assert_invariants` check a :class:`LoopRun`.
* :class:`AgentLoopStateMachine` — a hypothesis ``RuleBasedStateMachine`` whose rules queue model
  responses, type user input mid-run and run prompts (sometimes interrupted) on one session; users
  subclass it with their own ``tools``, ``hooks``, ``limits`` and invariants.

The invariants (docs/behaviour.md §3), each checked twice — by :func:`agentfsm.auditing.audit.audit` on the run's
trace, and
directly on what the scripted model received and what the trace recorded:

1. every ``tool_use`` sent to the model has exactly one ``tool_result`` with its id in the next
   (user) message, and no ``tool_result`` lacks its call;
2. messages alternate user/assistant from a user message (and a turn's request ends with one);
3. no request is sent after the loop reached ``stop`` (unless a Stop hook re-entered);
4. no counter exceeds its cap (:data:`agentfsm.machine.state.COUNTER_CAPS`), nor the turn ``max_turns``; and,
   stated from each counter's own field declaration (:data:`agentfsm.machine.state.COUNTERS`) rather than
   replayed through the route table — so a route whose effect forgets a reset is caught even though
   the auditor, replaying that same table, agrees with it (:func:`counter_violations`): a counter
   rises only on an edge that declares it, by one; after an edge that declares its reset it is back
   at its initial value; and it never falls back on an edge that neither raises nor resets it;
5. every state change is a declared edge of :data:`agentfsm.machine.graph.EDGES`, continuing where the last
   one ended;
6. the result's ``subtype``/``is_error`` are those :data:`agentfsm.machine.state.TERMINAL_INFO` gives its
   terminal reason, which is the reason of the last move into ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from hypothesis.strategies import SearchStrategy

from agentfsm.auditing.audit import audit
from agentfsm.llm.model import ModelClient, ModelRequest
from agentfsm.machine import prompts
from agentfsm.machine.graph import EDGES_BY_TRIGGER
from agentfsm.machine.options import Options
from agentfsm.machine.state import COUNTER_CAPS, COUNTERS, RAISED_BY, TERMINAL_INFO, Limits, LoopState, Message, Phase
from agentfsm.runtime.request import normalize
from agentfsm.runtime.result import RunResult
from agentfsm.runtime.trace import RunStarts, SnapshotReader, read_records
from agentfsm.sessions.session import Session
from agentfsm.testing.scenario import (
    Response,
    Scenario,
    StreamedResponse,
    TextBlock,
    exhausted_response,
    load_scenario,
    parse_response,
)
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.testing.strategies import model_responses, unique_tool_ids
from agentfsm.tools.base import Tool

__all__ = [
    "DEFAULT_SUMMARY",
    "AgentLoopStateMachine",
    "LoopHarness",
    "LoopRun",
    "ObservedRequest",
    "RequestContext",
    "ToolExchange",
    "assert_invariants",
    "counter_violations",
    "invariant_violations",
    "run_loop",
    "wire_problems",
]

_STOP = Phase.STOP.value
_START = Phase.ASSEMBLE.value
# where a compaction request may come from: auto-compaction (assemble), reactive (call_model, stream)
_COMPACTION_PHASES = frozenset({Phase.ASSEMBLE.value, Phase.CALL_MODEL.value, Phase.STREAM.value})

DEFAULT_SUMMARY: StreamedResponse = StreamedResponse(
    blocks=(TextBlock("Summary: the user asked for work; tools ran; nothing is pending."),),
    stop_reason="end_turn")
"""How the harness answers compaction requests unless told otherwise (a successful summary)."""

ScriptSource = Scenario | Sequence["Response | Mapping[str, Any]"] | Callable[[ModelRequest, int], Any]


# --- records -----------------------------------------------------------------------------------


@attrs.frozen
class ObservedRequest:
    """One request the scripted model received during a run.

    ``kind``: ``main`` (a model turn), ``compaction`` (a summarisation request) or ``subagent`` (a
    request of a subagent's own loop, answered from the same script). ``phase``: where
    the loop was, per its trace, when the request arrived. ``index``: the run's count of main
    requests before this one (compaction requests share the index of the turn they precede).
    """

    index: int
    kind: str
    phase: str
    request: ModelRequest
    response: Response


@attrs.frozen
class ToolExchange:
    """A ``tool_use`` block the model sent and the ``tool_result`` the loop answered it with."""

    use: Mapping[str, Any]
    result: Mapping[str, Any] | None

    @property
    def name(self) -> str:
        return str(self.use.get("name", ""))

    @property
    def input(self) -> Mapping[str, Any]:
        value = self.use.get("input")
        return value if isinstance(value, Mapping) else {}

    @property
    def is_error(self) -> bool:
        return bool(self.result and self.result.get("is_error"))

    @property
    def text(self) -> str:
        """The result's content as text (text blocks joined)."""
        content = (self.result or {}).get("content", "")
        if isinstance(content, str):
            return content
        return "".join(b.get("text", "") for b in content if isinstance(b, Mapping))


@attrs.frozen
class LoopRun:
    """Everything one run left behind, for the invariant checks and for the test's own assertions.

    ``records``: the run's trace records (from its prompt message to its result); ``file_records``:
    the whole session file so far (earlier runs of the session and the session header included).
    ``step_violations``: problems the harness saw while the run was going.
    """

    prompt: str
    result: RunResult
    # the bulky parts stay out of the repr: hypothesis and pytest print runs in their reports
    state: LoopState = attrs.field(repr=False)
    limits: Limits
    session_id: str
    trace_path: Path | None
    records: tuple[Mapping[str, Any], ...] = attrs.field(repr=False)
    file_records: tuple[Mapping[str, Any], ...] = attrs.field(repr=False)
    requests: tuple[ObservedRequest, ...] = attrs.field(repr=False)
    step_violations: tuple[str, ...] = ()

    @property
    def terminal_reason(self) -> str:
        return self.result.terminal_reason.value

    def transitions(self) -> list[Mapping[str, Any]]:
        return [r for r in self.records if r.get("type") == "transition"]

    def path(self) -> list[str]:
        """The triggers of the run's moves, in order (``call``, ``open_stream``, ...)."""
        return [str(r.get("trigger")) for r in self.transitions()]

    def main_requests(self) -> list[ObservedRequest]:
        return [r for r in self.requests if r.kind == "main"]

    def legs(self) -> list[tuple[Mapping[str, Any], ...]]:
        """The run's records split per driver run: one session run is several when input queued
        after the last absorb point (or a background agent's notification) is run as a follow-up
        prompt. Each leg starts at its prompt message."""
        return _split_legs(self.records)

    def messages(self) -> list[Mapping[str, Any]]:
        """The messages the run added to the conversation, in order: each driver run's prompt and
        what followed it — not a seeded history, nor the history a compaction re-wrote (those
        messages were added earlier, or are the summary of what was)."""
        out: list[Mapping[str, Any]] = []
        for leg in self.legs():
            rewriting = False
            for rec in leg:
                kind = rec.get("type")
                if kind == "compact_boundary":
                    rewriting = True
                elif kind == "message":
                    if not rewriting:
                        out.append(rec)
                else:
                    rewriting = False
        return out

    def tool_exchanges(self) -> list[ToolExchange]:
        """Every tool_use of the run with its tool_result (None if it never got one), in order."""
        results: dict[str, Mapping[str, Any]] = {}
        uses: list[Mapping[str, Any]] = []
        for m in self.messages():
            for b in m.get("content", ()):
                if b.get("type") == "tool_use" and m.get("role") == "assistant":
                    uses.append(b)
                elif b.get("type") == "tool_result":
                    results.setdefault(str(b.get("tool_use_id")), b)
        return [ToolExchange(u, results.get(str(u.get("id")))) for u in uses]

    def describe(self) -> str:
        """One line for failure messages: prompt, path and outcome."""
        return (f"prompt {self.prompt!r}: {' → '.join(self.path())} ⇒ {self.terminal_reason} "
                f"({len(self.main_requests())} model requests)")


@attrs.define
class RequestContext:
    """What an ``on_request`` callback sees: the harness (``.session``, ``.abort()``), the request,
    and the run's count of main requests before it."""

    harness: LoopHarness
    request: ModelRequest
    index: int
    kind: str


# --- direct checks (independent of agentfsm.auditing.audit, so the two cross-check each other) ---------------


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or () if isinstance(b, Mapping)]


def wire_problems(messages: Sequence[Mapping[str, Any]], *, ends_with_user: bool = True) -> list[str]:
    """Problems of one request's wire messages: roles must alternate from ``user`` (and end with
    ``user`` — a trailing assistant message would be a prefill, not a turn); every tool_use id is
    unique and has exactly one tool_result in the next message, which is a user message; every
    tool_result answers a tool_use of the message just before it."""
    problems: list[str] = []
    for i, m in enumerate(messages):
        want = "user" if i % 2 == 0 else "assistant"
        if m.get("role") != want:
            problems.append(f"messages[{i}] has role {m.get('role')!r} where {want!r} is due "
                            "(roles must alternate user/assistant from a user message)")
            break
    if ends_with_user and messages and messages[-1].get("role") != "user":
        problems.append(f"the request ends with a {messages[-1].get('role')!r} message, not a user message")
    seen: set[str] = set()
    for i, m in enumerate(messages):
        blocks = _blocks(m)
        if m.get("role") == "assistant":
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            answered = ([str(b.get("tool_use_id")) for b in _blocks(nxt) if b.get("type") == "tool_result"]
                        if nxt is not None and nxt.get("role") == "user" else [])
            for b in blocks:
                if b.get("type") != "tool_use":
                    continue
                tid = str(b.get("id"))
                if tid in seen:
                    problems.append(f"tool_use id {tid!r} occurs twice (messages[{i}])")
                seen.add(tid)
                n = answered.count(tid)
                if n != 1:
                    problems.append(f"tool_use {tid!r} ({b.get('name')}) in messages[{i}] has {n} "
                                    "tool_results in the next message (exactly one is required)")
        else:
            prev = messages[i - 1] if i else None
            calls = ({str(b.get("id")) for b in _blocks(prev) if b.get("type") == "tool_use"}
                     if prev is not None and prev.get("role") == "assistant" else set())
            for b in blocks:
                if b.get("type") == "tool_result" and str(b.get("tool_use_id")) not in calls:
                    problems.append(f"tool_result for {b.get('tool_use_id')!r} in messages[{i}] answers no "
                                    "tool_use of the message before it")
    return problems


def _is_compaction(request: ModelRequest) -> bool:
    """A summarisation request: its last message is the loop's compaction instruction."""
    if not request.messages:
        return False
    last = request.messages[-1]
    if last.get("role") != "user":
        return False
    texts = [b.get("text", "") for b in _blocks(last) if b.get("type") == "text"]
    return bool(texts) and str(texts[-1]).startswith(prompts.COMPACT_INSTRUCTION)


def counter_violations(trigger: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What move ``trigger`` did to the counters (``before``/``after``: :meth:`LoopState.counters`)
    against each counter's own declaration (:class:`agentfsm.machine.state.Counter`: ``raised_by``,
    ``reset_by``, ``default``), independently of the route table that moved them: after an edge that
    resets it, a counter is at its initial value (or one up, where the same edge may raise it); a rise
    is by one, on a declared edge; a counter falls back only on an edge that resets or raises it (a
    raise edge may start a count afresh, as a successful compaction does)."""
    out = []
    for c in COUNTERS:
        if c.key not in before or c.key not in after:
            continue
        old, new = before[c.key], after[c.key]
        number = isinstance(old, int) and not isinstance(old, bool) and isinstance(new, int)
        if trigger in c.reset_by:
            allowed = [c.default] + ([old + 1] if number and trigger in c.raised_by else [])
            if new not in allowed:
                out.append(f"{c.key}={new!r} after {trigger!r}, which its field declares resets it to "
                           f"{c.default!r} (it was {old!r})")
                continue
        if number and new > old and trigger in c.raised_by and new != old + 1:
            out.append(f"{c.key} rose {old} → {new} on {trigger!r}; a counter rises by one")
        fell = new < old if number else new != old and new == c.default
        if fell and trigger not in c.reset_by | c.raised_by:
            out.append(f"{c.key} fell back {old!r} → {new!r} on {trigger!r}, which neither raises nor resets it "
                       f"(reset by: {', '.join(sorted(c.reset_by)) or 'no edge'})")
    return out


class _StepChecker:
    """Follows the moves of one :meth:`Session.run` as they happen (a step observer of the session)
    and checks each one. A session run may hold several driver runs ("legs": a follow-up for input
    queued after the last absorb point, a background agent's notification); each starts at
    ``assemble``. :meth:`feed` takes trace records instead, for checking a recorded run."""

    def __init__(self, limits: Limits) -> None:
        self.caps = attrs.asdict(limits)
        self.at = _START
        self.stopped = False
        self.last_reason: str | None = None
        self.violations: list[str] = []
        self.moves = 0
        self.legs = 0
        self._starts = RunStarts()
        self._snapshots = SnapshotReader()
        self._prev: Mapping[str, Any] = {}  # the counters after the previous move of this leg

    def feed(self, rec: Mapping[str, Any]) -> None:
        kind = rec.get("type")
        if self._starts.starts_run(rec):
            self.legs += 1
            self.at, self.stopped, self._prev = _START, False, {}
            self._snapshots.start_run()
        if kind in ("compact_boundary", "message"):
            return
        if kind == "transition":
            self._transition(rec)
        elif kind == "request" and self.stopped:
            self.violations.append(f"a request was recorded after the loop reached stop (move {self.moves})")

    def on_step(self, before: LoopState, step: Any, event: Any) -> None:
        after = step.state
        if self.stopped and before.phase is Phase.ASSEMBLE and self.at == _STOP:
            # a new leg: a loop leaves stop only by a re-entry from stop (stop_hook_blocking,
            # task_notification), which starts at stop
            self.legs += 1
            self.at, self.stopped, self._prev = _START, False, {}
        elif self.moves == 0:
            self.legs += 1
        self._transition({"type": "transition", "from": before.phase.value, "to": after.phase.value,
                          "trigger": step.trigger, "turn": after.turn_count, "counters": after.counters(),
                          "terminal_reason": after.terminal_reason.value if after.terminal_reason else None})

    def _transition(self, rec: Mapping[str, Any]) -> None:
        self.moves += 1
        frm, to, trig = rec.get("from"), rec.get("to"), rec.get("trigger")
        where = f"move {self.moves} {trig!r} ({frm} → {to})"
        edge = EDGES_BY_TRIGGER.get(str(trig))
        if edge is None:
            self.violations.append(f"{where}: {trig!r} is not a declared trigger")
        elif frm not in {s.value for s in edge.sources} or to != edge.dest.value:
            self.violations.append(f"{where} is not a declared edge")
        elif to == _STOP and rec.get("terminal_reason") not in {r.value for r in edge.reasons}:
            self.violations.append(f"{where} ends with {rec.get('terminal_reason')!r}, which "
                                   f"{trig!r} does not allow")
        if frm != self.at:
            self.violations.append(f"{where} starts at {frm!r} but the loop was at {self.at!r}")
        counters = self._snapshots.read(rec)
        prev, self._prev = self._prev, counters
        for name, raisers in RAISED_BY.items():  # declared on the counters' fields
            old, new = prev.get(name), counters.get(name)
            if isinstance(old, int) and isinstance(new, int) and new > old and trig not in raisers:
                self.violations.append(f"{where}: {name} rose {old} → {new}; only {', '.join(sorted(raisers))} "
                                       "raise it")
        if prev:
            self.violations += [f"{where}: {v}" for v in counter_violations(str(trig), prev, counters)]
        for name, field in COUNTER_CAPS.items():
            value, cap = counters.get(name), self.caps.get(field)
            if isinstance(value, int) and isinstance(cap, int) and value > cap:
                self.violations.append(f"{where}: {name}={value} exceeds {field}={cap}")
        turn, max_turns = counters.get("turn_count"), self.caps.get("max_turns")
        if isinstance(turn, int) and isinstance(max_turns, int) and turn > max_turns:
            self.violations.append(f"{where}: turn {turn} exceeds max_turns={max_turns}")
        if to == _STOP:
            self.stopped, self.last_reason = True, rec.get("terminal_reason")
        elif frm == _STOP:
            self.stopped = False  # a re-entry from stop (stop_hook_blocking, task_notification)
        self.at = str(to)


def _split_legs(records: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], ...]]:
    legs: list[list[Mapping[str, Any]]] = []
    starts = RunStarts()
    for rec in records:
        if starts.starts_run(rec):
            legs.append([])
        if legs:
            legs[-1].append(rec)
    # a seeded history is written before the run's own prompt: its messages are no driver run
    return [tuple(leg) for leg in legs if any(r.get("type") in ("transition", "result") for r in leg)]


# --- the harness -------------------------------------------------------------------------------


def _responses_of(script: ScriptSource | None,
                  ws: Path | None) -> tuple[list[Response], Callable[..., Any] | None]:
    if script is None:
        return [], None
    if isinstance(script, Scenario):
        return list(load_scenario(script, ws).responses if ws is not None else script.responses), None
    if callable(script):
        return [], script
    if isinstance(script, Sequence) and not isinstance(script, str | bytes):
        return list(load_scenario(list(script), ws).responses), None
    raise TypeError(f"expected a Scenario, a list of responses or a callable, got {type(script).__name__}")


class LoopHarness:
    """A session of the real loop on a reactive scripted model.

    ``options`` configure the session as in production (``extra_tools``, ``hooks``, ``limits``,
    ``permission_mode``...); ``sessions_dir`` must be set (the trace is how the harness follows the
    loop). Main requests are answered from :meth:`feed` (queued responses), then from ``script``
    (``$WS`` in a scripted list or Scenario stands for ``options.cwd``), then with
    ``SCENARIO_EXHAUSTED`` text so every run ends. Compaction requests are answered with
    ``compaction_answer`` (None: they take the next scripted response, as a plain ScriptedModel
    would). ``on_request(ctx)`` runs at every request, before it is answered — to abort, type user
    input, or record something. ``wrap_model`` wraps the scripted model in your own
    :class:`~agentfsm.llm.model.ModelClient` — to inject transport faults no scenario record expresses.
    ``history`` seeds the conversation (as a forked or resumed session would start).
    """

    def __init__(self, options: Options, *, script: ScriptSource | None = None,
                 compaction_answer: Response | None = DEFAULT_SUMMARY,
                 on_request: Callable[[RequestContext], None] | None = None,
                 wrap_model: Callable[[ScriptedModel], ModelClient] | None = None,
                 history: Sequence[Message] = ()) -> None:
        if options.sessions_dir is None or not options.write_trace:
            raise ValueError("LoopHarness needs Options(sessions_dir=..., write_trace=True): it follows "
                             "the loop through its trace")
        self.options = options
        queued, self._factory = _responses_of(script, options.cwd)
        self._queue: deque[Response] = deque(queued)
        self.compaction_answer = compaction_answer
        self.on_request = on_request
        self.model = ScriptedModel(self._answer)
        self._checker: _StepChecker | None = None
        self.session = Session(options, client=wrap_model(self.model) if wrap_model else self.model,
                               history=history, observers=(self,))
        assert self.session.trace_path is not None
        self.trace_path: Path = self.session.trace_path
        self._observed: list[ObservedRequest] = []
        self._main = 0
        self._factory_n = 0
        self._abort_at: int | None = None
        self.runs: list[LoopRun] = []

    # feeding the model

    def feed(self, *responses: Response | Mapping[str, Any]) -> None:
        """Queue responses for the next main requests (before anything from ``script``)."""
        self._queue.extend(parse_response(r) for r in responses)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def abort(self) -> None:
        """Stop the running loop at once (every running tool cancelled)."""
        self.session.abort()

    def interrupt(self) -> None:
        """Interrupt the running loop as Ctrl-C would (``cancel`` tools cancelled, ``block`` tools finish)."""
        self.session.interrupt()

    def _next_main(self, request: ModelRequest) -> Response:
        if self._queue:
            return self._queue.popleft()
        if self._factory is not None:
            n, self._factory_n = self._factory_n, self._factory_n + 1
            return parse_response(self._factory(request, n), f"factory response {n}")
        return exhausted_response()

    def _kind(self, request: ModelRequest) -> str:
        owner = (request.metadata or {}).get("user_id")
        if owner is not None and owner != f"session_{self.session.session_id}":
            return "subagent"  # a subagent's own loop (the Agent tool) asks the same model
        return "compaction" if _is_compaction(request) else "main"

    def on_step(self, before: LoopState, step: Any, event: Any) -> None:
        """The session's step observer: the checker follows the loop move by move."""
        if self._checker is not None:
            self._checker.on_step(before, step, event)

    def _answer(self, request: ModelRequest, _n: int) -> Response:
        kind = self._kind(request)
        checker = self._checker
        if checker is None:
            raise AssertionError("the model was called outside a run")
        phase = checker.at
        if kind != "subagent":
            # a subagent's requests happen while this loop runs its tools: only the wire is checked
            if checker.stopped:
                checker.violations.append(f"a {kind} request was sent after the loop reached stop "
                                          f"({checker.last_reason})")
            expected = {Phase.CALL_MODEL.value} if kind == "main" else _COMPACTION_PHASES
            if phase not in expected:
                checker.violations.append(f"a {kind} request was sent while the loop was at {phase!r}")
        for problem in wire_problems(request.messages):
            checker.violations.append(f"{kind} request #{len(self._observed)}: {problem}")
        if self.on_request is not None:
            self.on_request(RequestContext(self, request, self._main, kind))
        if kind == "main" and self._abort_at is not None and self._main == self._abort_at:
            self.abort()
        if kind == "compaction" and self.compaction_answer is not None:
            response = self.compaction_answer
        else:
            response = self._next_main(request)
        self._observed.append(ObservedRequest(self._main, kind, phase, request, response))
        if kind == "main":
            self._main += 1
        return response

    # running

    async def arun(self, prompt: str, *, abort_at: int | None = None, timeout: float = 60.0) -> LoopRun:
        """Run ``prompt`` to its end; ``abort_at=k`` interrupts when the k-th main request (from 0)
        arrives. A loop that does not end within ``timeout`` seconds is a failure."""
        start = len(list(read_records(self.trace_path)))
        self._checker = _StepChecker(self.options.limits)
        self._observed, self._main, self._abort_at = [], 0, abort_at
        try:
            result = await asyncio.wait_for(self.session.run(prompt), timeout)
        except TimeoutError:
            raise AssertionError(f"the loop did not end within {timeout:g}s (prompt {prompt!r}); trace: "
                                 f"{self.trace_path}") from None
        checker, self._checker = self._checker, None
        records = list(read_records(self.trace_path))
        # the session header belongs to the first run's file, not to the run itself
        run_records = tuple(r for r in records[start:] if r.get("type") != "session")
        assert self.session.last_state is not None
        run = LoopRun(prompt=prompt, result=result, state=self.session.last_state, limits=self.options.limits,
                      session_id=self.session.session_id, trace_path=self.trace_path, records=run_records,
                      file_records=tuple(records), requests=tuple(self._observed),
                      step_violations=tuple(checker.violations))
        self.runs.append(run)
        return run

    def run(self, prompt: str, *, abort_at: int | None = None, timeout: float = 60.0) -> LoopRun:
        """:meth:`arun` on a fresh event loop (for sync tests and state machine rules)."""
        return asyncio.run(self.arun(prompt, abort_at=abort_at, timeout=timeout))

    def close(self) -> None:
        """Tear the session down (background agents stopped, queue discarded, trace closed)."""
        asyncio.run(self.session.aclose())


def _options(*, tools: Iterable[Tool], builtin_tools: Sequence[str], hooks: Mapping[str, Any] | None,
             limits: Limits | None, options: Options | None, workspace: Path,
             sessions_dir: Path | None) -> Options:
    if options is None:
        return Options(tools=tuple(builtin_tools), extra_tools=tuple(tools), hooks=dict(hooks or {}),
                       limits=limits or Limits(), permission_mode="bypassPermissions", cwd=workspace,
                       sessions_dir=sessions_dir, setting_sources=())
    changes: dict[str, Any] = {}
    if options.sessions_dir is None:
        changes["sessions_dir"] = sessions_dir
    if limits is not None:
        changes["limits"] = limits
    return attrs.evolve(options, **changes) if changes else options


def run_loop(script: ScriptSource, *, prompt: str = "Please do the task.", tools: Iterable[Tool] = (),
             builtin_tools: Sequence[str] = (), hooks: Mapping[str, Any] | None = None,
             limits: Limits | None = None, options: Options | None = None, trace_dir: Path | None = None,
             compaction_answer: Response | None = DEFAULT_SUMMARY, abort_at: int | None = None,
             on_request: Callable[[RequestContext], None] | None = None) -> LoopRun:
    """Run ``prompt`` once on the real loop, the model answering from ``script`` (a list of
    responses, a Scenario or a ``(request, n)`` callable).

    Without ``options`` the session offers ``tools`` (your Tool instances) plus the named
    ``builtin_tools`` (none by default: their inputs would touch the real filesystem), runs
    ``hooks`` (``{"Stop": [HookMatcher(...)]}``) with ``limits``, in ``bypassPermissions`` mode, in
    a scratch workspace, reading no settings files. The trace goes to ``trace_dir`` (kept), else to a
    temporary directory removed afterwards — the returned :class:`LoopRun` holds its records.
    """
    # a scratch directory only for what the caller did not provide (removing it costs more than
    # the run itself on some filesystems)
    needs_scratch = options is None or (options.sessions_dir is None and trace_dir is None)
    scratch = Path(tempfile.mkdtemp(prefix="agentfsm-run-")) if needs_scratch else None
    try:
        workspace = Path(".")
        if scratch is not None:
            workspace = scratch / "ws"
            workspace.mkdir()
        sessions_dir = trace_dir or (scratch / "sessions" if scratch is not None else None)
        opts = _options(tools=tools, builtin_tools=builtin_tools, hooks=hooks, limits=limits, options=options,
                        workspace=workspace, sessions_dir=sessions_dir)
        harness = LoopHarness(opts, script=script, compaction_answer=compaction_answer, on_request=on_request)
        try:
            return harness.run(prompt, abort_at=abort_at)
        finally:
            harness.close()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


# --- the checks --------------------------------------------------------------------------------


def invariant_violations(run: LoopRun) -> list[str]:
    """Every docs/behaviour.md §3 invariant the run broke, in words (empty when it kept them all)."""
    out = [f"during the run: {v}" for v in run.step_violations]
    # the auditor, on the whole session file (a session's earlier runs must stay valid too)
    out += [f"audit: {f}" for f in audit(run.file_records, limits=run.limits) if f.is_error]
    # every request the model received, checked here rather than through the trace's skeletons
    for i, obs in enumerate(run.requests):
        for problem in wire_problems(obs.request.messages):
            out.append(f"{obs.kind} request #{i}: {problem}")
        if obs.phase == _STOP and obs.kind != "subagent":
            out.append(f"{obs.kind} request #{i} was sent after the loop reached stop")
    recorded = sum(1 for r in run.records if r.get("type") == "request")
    if recorded != len(run.main_requests()):
        out.append(f"the trace records {recorded} requests but the model received {len(run.main_requests())}")
    legs = run.legs()
    if not legs:
        out.append("the run recorded no prompt message")
    for n, leg in enumerate(legs):
        what = f"driver run {n + 1} of {len(legs)}"
        moves = [r for r in leg if r.get("type") == "transition"]
        results = [r for r in leg if r.get("type") == "result"]
        if not moves or moves[-1].get("to") != _STOP:
            out.append(f"{what}: its last move does not reach stop")
        if len(results) != 1:
            out.append(f"{what} wrote {len(results)} result records (exactly one is required)")
        elif moves and results[0].get("terminal_reason") != moves[-1].get("terminal_reason"):
            out.append(f"{what}: its result says {results[0].get('terminal_reason')!r} but its last move "
                       f"into stop carried {moves[-1].get('terminal_reason')!r}")
        if n < len(legs) - 1 and results and results[0].get("terminal_reason") != "completed":
            out.append(f"{what} ended {results[0].get('terminal_reason')!r}, yet a follow-up run started")
    info = TERMINAL_INFO[run.result.terminal_reason]
    if (run.result.subtype, run.result.is_error) != (info.subtype, info.is_error):
        out.append(f"result for {run.terminal_reason!r} has subtype={run.result.subtype!r}, "
                   f"is_error={run.result.is_error!r}; TERMINAL_INFO says {info.subtype!r}, "
                   f"{info.is_error!r}")
    wire = run.result.to_dict()
    if ("errors" in wire) == (run.result.subtype == "success"):
        out.append("the result object carries `errors` exactly when its subtype is not success "
                   f"(subtype {run.result.subtype!r}, keys {sorted(wire)})")
    last_results = [r for r in (legs[-1] if legs else ()) if r.get("type") == "result"]
    if last_results and (last_results[0].get("terminal_reason"), last_results[0].get("subtype"),
                         last_results[0].get("is_error")) != (
            wire["terminal_reason"], wire["subtype"], wire["is_error"]):
        out.append("the last result record in the trace differs from the returned result")
    if run.state.phase is not Phase.STOP or run.state.terminal_reason is not run.result.terminal_reason:
        out.append(f"the final state is at {run.state.phase.value} with {run.state.terminal_reason!r}")
    caps = attrs.asdict(run.limits)
    for name, value in run.state.counters().items():
        field = COUNTER_CAPS.get(name)
        if field is not None and isinstance(value, int) and value > caps[field]:
            out.append(f"final state: {name}={value} exceeds {field}={caps[field]}")
    # the history the next prompt (or a resume) starts from must itself be a valid conversation
    for problem in wire_problems(normalize(run.state.messages), ends_with_user=False):
        out.append(f"history after the run: {problem}")
    return out


def assert_invariants(run: LoopRun) -> None:
    """Raise AssertionError listing every broken invariant; the trace is saved to a file named in
    the message so ``agentfsm audit`` / ``agentfsm diagram --trace`` can look at it."""
    problems = invariant_violations(run)
    if not problems:
        return
    saved = Path(tempfile.mkdtemp(prefix="agentfsm-failed-")) / f"{run.session_id}.jsonl"
    saved.write_text("".join(json.dumps(r, default=str) + "\n" for r in run.file_records), encoding="utf-8")
    lines = "\n  ".join(problems)
    raise AssertionError(f"{len(problems)} invariant violation(s) in {run.describe()}:\n  {lines}\n"
                         f"trace saved to {saved}")


# --- the state machine -------------------------------------------------------------------------


_PROMPTS = st.sampled_from(["Please do the task.", "Continue.", "What is in the workspace?", "Fix it."])
_TYPED = st.sampled_from(["also check the tests", "stop after this", "use the other file"])


class AgentLoopStateMachine(RuleBasedStateMachine):
    """Random conversations with the real loop, one session per example.

    The rule: run a prompt with up to ``max_script`` model responses drawn for it
    (:meth:`response_strategy`; unused ones stay queued for the next run), sometimes interrupting it
    at a model request (:meth:`interrupt_strategy`), sometimes with user input typed while it runs
    (submitted at its first model request, absorbed at the loop's next absorb point).
    Each run is checked step by step while it goes and as a whole afterwards
    (:func:`invariant_violations`, then :meth:`check_run`); between steps the session's history
    must stay a valid conversation.

    Subclass to point it at your code::

        class MyToolMachine(AgentLoopStateMachine):
            tools = [my_tool]                    # offered to the model, inputs drawn from their schemas
            limits = Limits(max_turns=5)         # or override limits_strategy()
            hooks = {"PreToolUse": [HookMatcher("MyTool", [my_hook])]}

            def check_run(self, run):            # your invariants, after every run
                for ex in run.tool_exchanges(): ...

        TestMyTool = MyToolMachine.TestCase

    Override :meth:`build_options` for anything else (fallback models, a JSON schema, built-in
    tools). ``trace_dir`` keeps every session file there (for ``agentfsm audit --coverage``);
    otherwise each example's scratch directory is removed at teardown.
    """

    tools: ClassVar[Sequence[Tool]] = ()
    builtin_tools: ClassVar[Sequence[str]] = ()
    hooks: ClassVar[Mapping[str, Sequence[Any]]] = {}
    limits: ClassVar[Limits] = Limits()
    permission_mode: ClassVar[str | None] = "bypassPermissions"
    trace_dir: ClassVar[Path | None] = None
    max_script: ClassVar[int] = 4
    # your own input strategy per tool name (instead of its JSON Schema), and the weight of each family of
    # model behaviour (agentfsm.testing.strategies.FAMILY_WEIGHTS), for the default response_strategy
    tool_input_strategies: ClassVar[Mapping[str, Any]] = {}
    family_weights: ClassVar[Mapping[str, int]] = {}

    def __init__(self) -> None:
        super().__init__()
        self._scratch = Path(tempfile.mkdtemp(prefix="agentfsm-machine-"))
        self.workspace = self._scratch / "ws"
        self.workspace.mkdir()
        self.chosen_limits: Limits = self.limits
        self.typed: list[str] = []
        self.runs: list[LoopRun] = []
        self._harness: LoopHarness | None = None

    # --- what subclasses override ----------------------------------------------------------------

    def all_tools(self) -> list[Tool]:
        """The Tool instances the model may call (responses are drawn for these)."""
        return list(self.tools)

    def response_strategy(self) -> SearchStrategy[Response]:
        """One model response; by default any kind of :func:`~agentfsm.testing.strategies.model_responses`."""
        return model_responses(self.all_tools(), inputs=self.tool_input_strategies or None,
                               weights=self.family_weights or None)

    def limits_strategy(self) -> SearchStrategy[Limits]:
        return st.just(self.limits)

    def interrupt_strategy(self) -> SearchStrategy[int | None]:
        """At which model request of a run (from 0) the user interrupts; None: not at all."""
        return st.one_of(st.none(), st.none(), st.integers(0, 3))

    def build_hooks(self) -> Mapping[str, Sequence[Any]]:
        return dict(self.hooks)

    def build_options(self) -> Options:
        return Options(tools=tuple(self.builtin_tools), extra_tools=tuple(self.all_tools()),
                       hooks=self.build_hooks(), limits=self.chosen_limits,
                       permission_mode=self.permission_mode, cwd=self.workspace,
                       sessions_dir=self.trace_dir or self._scratch / "sessions", setting_sources=())

    def on_request(self, ctx: RequestContext) -> None:
        """Called at every model request of a run; submits what the user typed meanwhile."""
        while self.typed:
            ctx.harness.session.submit(self.typed.pop(0))

    def check_run(self, run: LoopRun) -> None:
        """Your extra assertions about a finished run (the invariants of docs/behaviour.md §3 are already checked)."""

    # --- plumbing --------------------------------------------------------------------------------

    @property
    def harness(self) -> LoopHarness:
        if self._harness is None:
            self._harness = LoopHarness(self.build_options(), on_request=self.on_request)
        return self._harness

    @property
    def last_run(self) -> LoopRun | None:
        return self.runs[-1] if self.runs else None

    def teardown(self) -> None:
        if self._harness is not None:
            self._harness.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    # --- rules -----------------------------------------------------------------------------------

    @initialize(limits=st.runner().flatmap(lambda m: m.limits_strategy()))
    def choose_limits(self, limits: Limits) -> None:
        self.chosen_limits = limits

    @rule(prompt=_PROMPTS,
          responses=st.runner().flatmap(lambda m: st.lists(m.response_strategy(), max_size=m.max_script)),
          interrupt_at=st.runner().flatmap(lambda m: m.interrupt_strategy()),
          typed=st.lists(_TYPED, max_size=2))
    def run_prompt(self, prompt: str, responses: list[Response], interrupt_at: int | None,
                   typed: list[str]) -> None:
        # what the model will answer this run's requests with (left-overs stay queued for the next
        # run); tool_use ids stay unique across the whole session, as the API's are
        self.harness.feed(*unique_tool_ids(responses, prefix=f"toolu_r{len(self.runs) + 1:03d}_"))
        self.typed.extend(typed)  # the user types while the run goes on: see on_request
        run = self.harness.run(prompt, abort_at=interrupt_at)
        self.runs.append(run)
        assert_invariants(run)
        self.check_run(run)

    @invariant()
    def history_is_a_valid_conversation(self) -> None:
        if self._harness is None or not self.runs:
            return
        problems = wire_problems(normalize(self._harness.session.history), ends_with_user=False)
        assert not problems, f"session history after {len(self.runs)} runs: {problems}"

