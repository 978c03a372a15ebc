"""The Python API, in the style of claude-agent-sdk.

One-shot::

    import agentfsm
    from agentfsm.machine.options import Options

    async for msg in agentfsm.query("What is in README.md?", options=Options(tools=("Read",))):
        if msg["type"] == "result":
            print(msg["result"])

Multi-turn::

    async with fsm.AgentClient(Options(permission_mode="acceptEdits")) as agent:
        await agent.send("Rename foo to bar in src/")
        async for msg in agent.receive():      # every message up to and including the result
            ...
        await agent.send("Now run the tests")  # same conversation
        async for msg in agent.receive():
            ...

Messages are the dicts the CLI prints with ``--output-format stream-json``: ``system`` (``init``,
``command_lifecycle``, ``task_notification``, ``compact_boundary``…), ``assistant`` (one content block
each, as soon as it is complete), ``user`` (each tool result as soon as it is ready) and ``result``.
:class:`agentfsm.machine.options.Options` configures everything (model, tools, limits, permission mode, hooks,
``can_use_tool``, ``cwd``, ``resume``/``continue_session``/``fork_session``, ``agents``…).
``client`` is the model transport (an :class:`agentfsm.llm.transport.AnthropicTransport`, a
:class:`agentfsm.testing.ScriptedModel`…); pass one to share it between sessions — it is then yours to
close. Without one, each session opens (and closes) its own ``AnthropicTransport``.

Input sent while a run goes on is queued and absorbed by that run after its current tool batch;
nothing is lost (see :mod:`agentfsm.runtime.queue`). Sessions share no mutable state: run as many as you like
concurrently on one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from typing import Any

from agentfsm.common import log as fsm_log
from agentfsm.llm.model import ModelClient
from agentfsm.machine.options import Options
from agentfsm.runtime.result import RunResult
from agentfsm.sessions.session import Prompt, Session

_DONE = object()
# how long leaving a query early or closing a client waits for the interrupted run to end
INTERRUPT_GRACE_S = 5.0


class InputError(ValueError):
    """An input message that is not a stream-json user message or control request."""


def parse_input(raw: Any) -> tuple[str, Any, str | None]:
    """One streamed input message: ``("user", content, uuid)`` for an SDK user message
    (``{"type": "user", "message": {"role": "user", "content": str | blocks}, "uuid"?}``), or
    ``("control", request, request_id)`` for ``{"type": "control_request", "request": {...}}``."""
    if not isinstance(raw, Mapping):
        raise InputError(f"expected a JSON object, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind == "control_request":
        request = raw.get("request")
        if not isinstance(request, Mapping):
            raise InputError("a control_request needs a 'request' object")
        return "control", request, raw.get("request_id")
    message = raw.get("message")
    if kind != "user" or not isinstance(message, Mapping) or message.get("role", "user") != "user":
        raise InputError("not a stream-json user message")
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            raise InputError("the user message is empty")
    elif not (isinstance(content, list) and content and all(isinstance(b, Mapping) and "type" in b
                                                            for b in content)):
        raise InputError("a user message's content must be a string or a list of content blocks")
    uid = raw.get("uuid")
    return "user", content, uid if isinstance(uid, str) and uid else None


async def drive(session: Session, inputs: AsyncIterable[Any] | None = None, *,
                first: Prompt | None = None) -> list[RunResult]:
    """Run ``session`` on ``first`` and/or on streamed ``inputs`` until both are used up.

    Every user message of ``inputs`` is submitted to the session's queue as it arrives — absorbed
    by the run in progress, or starting the next run when the session is idle — so input is read
    while the runs go on. Control requests: ``interrupt`` interrupts the run in progress. Returns
    the result of every run. An invalid message before the first valid one raises
    :class:`InputError`; later ones are reported (``system``/``warning``) and skipped.
    """
    log = fsm_log.get_logger("agentfsm", session_id=session.session_id)
    done = inputs is None
    accepted = 0

    def emit(msg: dict[str, Any]) -> None:
        if session.emit is not None:
            session.emit(msg)

    async def feed() -> None:
        nonlocal done, accepted
        try:
            async for raw in inputs:  # type: ignore[union-attr]
                try:
                    kind, body, ident = parse_input(raw)
                except InputError as exc:
                    if not accepted and first is None:
                        raise
                    log.warning("input.invalid", error=str(exc))
                    emit({"type": "system", "subtype": "warning", "session_id": session.session_id,
                          "message": f"ignored an input message: {exc}"})
                    continue
                accepted += 1
                if kind == "user":
                    session.submit(body, uuid=ident)
                else:
                    _control(session, body, ident, emit)
        finally:
            done = True
            session.queue.poke()

    feeder = asyncio.ensure_future(feed()) if inputs is not None else None
    results: list[RunResult] = []
    try:
        if first is not None:
            results.append(await session.run(first))
        while await session.queue.wait_for_items(lambda: not done):
            results.append(await session.run(None))
        if feeder is not None:
            await feeder  # its InputError, if any
    finally:
        if feeder is not None and not feeder.done():
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
    return results


def _control(session: Session, request: Mapping[str, Any], request_id: Any,
             emit: Any) -> None:
    subtype = request.get("subtype")
    if subtype == "interrupt":
        session.interrupt()
        response: dict[str, Any] = {"subtype": "success", "request_id": request_id}
    else:
        response = {"subtype": "error", "request_id": request_id,
                    "error": f"unsupported control request {subtype!r}"}
    emit({"type": "control_response", "response": response})


async def query(prompt: Prompt | AsyncIterable[Mapping[str, Any]], *, options: Options | None = None,
                client: ModelClient | None = None) -> AsyncIterator[dict[str, Any]]:
    """Run one prompt (a string or content blocks) — or a stream of stream-json user messages, each
    submitted to the queue as it arrives — and yield every message, the ``result`` last (one per
    run). ``options.resume`` / ``continue_session`` / ``fork_session`` pick up an earlier session.

    Leaving the loop early interrupts the run and closes the session.
    """
    from agentfsm.sessions.resume import open_session

    out: asyncio.Queue[Any] = asyncio.Queue()
    session = open_session(options or Options(), client=client, emit=out.put_nowait,
                           owns_client=client is None)

    async def work() -> None:
        try:
            if isinstance(prompt, str) or isinstance(prompt, Sequence):
                await drive(session, first=prompt)
            else:
                await drive(session, prompt)
        finally:
            await session.aclose()  # teardown's lifecycle messages come before the end marker
            out.put_nowait(_DONE)

    task = asyncio.ensure_future(work())
    try:
        while (msg := await out.get()) is not _DONE:
            yield msg
        await task  # errors of the run
    finally:
        if not task.done():
            session.interrupt()
            await _finish(task)


async def _finish(task: asyncio.Future[Any]) -> None:
    """Wait for an interrupted run to end; cancel it after a grace period (a run waiting for a slow
    model response notices an interrupt only when the response starts)."""
    _done, pending = await asyncio.wait({task}, timeout=INTERRUPT_GRACE_S)
    if pending:
        task.cancel()
        await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        fsm_log.get_logger("agentfsm").warning("api.run_failed_on_close", error=repr(task.exception()))


class AgentClient:
    """A multi-turn session (claude-agent-sdk's ``ClaudeSDKClient``).

    Use as ``async with AgentClient(options) as agent``. :meth:`send` submits a prompt: it starts a
    run when the session is idle and is queued (absorbed by the run after its current tool batch)
    while one goes on. :meth:`receive` yields messages until — and including — the next ``result``.
    :meth:`interrupt` stops the run in progress. Leaving the block interrupts what still runs,
    stops background agents and closes the session (queued input is then ``discarded``).
    """

    def __init__(self, options: Options | None = None, *, client: ModelClient | None = None) -> None:
        self.options = options or Options()
        self._client = client
        self._messages: asyncio.Queue[Any] = asyncio.Queue()
        self._session: Session | None = None
        self._worker: asyncio.Task[None] | None = None
        self._closing = False
        self._error: BaseException | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            raise RuntimeError("the client is not connected: use `async with AgentClient(...)` or connect()")
        return self._session

    @property
    def session_id(self) -> str:
        return self.session.session_id

    async def connect(self) -> AgentClient:
        from agentfsm.sessions.resume import open_session

        if self._session is None:
            self._session = open_session(self.options, client=self._client, emit=self._messages.put_nowait,
                                         owns_client=self._client is None)
            self._worker = asyncio.ensure_future(self._work())
        return self

    async def _work(self) -> None:
        session = self.session
        try:
            while not self._closing and await session.queue.wait_for_items(lambda: not self._closing):
                if self._closing:
                    break  # input that arrives while closing is discarded by the teardown
                await session.run(None)
        except Exception as exc:  # handed to receive()
            self._error = exc
            self._messages.put_nowait(_DONE)

    async def send(self, prompt: Prompt, *, uuid: str | None = None) -> str:
        """Submit ``prompt``; returns its command uuid (see the ``command_lifecycle`` messages)."""
        if self._closing:
            raise RuntimeError("the client is closed")
        return self.session.submit(prompt, uuid=uuid).uuid

    async def receive(self) -> AsyncIterator[dict[str, Any]]:
        """Messages up to and including the next ``result``."""
        while True:
            msg = await self._messages.get()
            if msg is _DONE:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                return
            yield msg
            if msg.get("type") == "result":
                return

    async def interrupt(self) -> None:
        """Stop the run in progress (its result reports the abort)."""
        self.session.interrupt()

    async def close(self) -> None:
        if self._session is None or self._closing:
            return
        self._closing = True
        session = self._session
        if session.running:
            session.interrupt()
        session.queue.poke()
        if self._worker is not None:
            await _finish(self._worker)
        await session.aclose()

    async def __aenter__(self) -> AgentClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
