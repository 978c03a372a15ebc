"""The stream-json control protocol Claude Code speaks with the Claude Agent SDK, at the CLI's edge.

The SDK runs ``cli_path --output-format stream-json --verbose … --input-format stream-json`` and talks
NDJSON both ways. Besides ``user`` messages, stdin carries ``control_request``s from the SDK
(``initialize`` first, then ``interrupt``, ``set_permission_mode``, ``set_model``, ``mcp_status`` at
any time) and ``control_response``s to the CLI's own requests; stdout carries the CLI's messages,
its answers, and its requests to the SDK: ``can_use_tool`` (``--permission-prompt-tool stdio``),
``hook_callback`` (the SDK's Python hooks, registered by ``initialize``) and ``mcp_message`` (the
SDK's in-process MCP servers). Each request has an id; the answer names it.

:class:`ControlChannel` reads stdin (:meth:`ControlChannel.pump`), answers the SDK's requests, sends
its own and waits for their answers, and hands user messages on to :func:`agentfsm.api.drive`. The
hooks and the permission callback it builds are plain Python hooks (:class:`agentfsm.hooks.HookMatcher`)
and an ``Options.can_use_tool`` callable: the loop cannot tell them from local ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs

from agentfsm.common import log as fsm_log
from agentfsm.hooks import HOOK_EVENTS, HookMatcher, PermissionAllow, PermissionDeny
from agentfsm.hooks.runner import DEFAULT_PYTHON_TIMEOUT_S
from agentfsm.machine.options import AgentDefinition, Options
from agentfsm.runtime.phases import CLAUDE_CODE_VERSION, api_key_source
from agentfsm.runtime.pipeline import REJECT_MESSAGE
from agentfsm.runtime.result import merge_model_usage

PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan")
_END = object()

log = fsm_log.get_logger("agentfsm.control")

Write = Callable[[dict[str, Any]], None]


class ControlError(Exception):
    """The other side answered a control request with an error, or can no longer answer."""


class ControlChannel:
    """One SDK connection over stdin/stdout. ``write`` prints one message (one stdout line)."""

    def __init__(self, write: Write, accounting: SdkAccounting | None = None) -> None:
        self.write = write
        self.accounting = accounting
        self.session: Any = None  # set once the session exists (before `initialize` is answered)
        self.mcp: Any = None  # the session's MCP servers (agentfsm.tools.mcp.McpServers), if any
        self.stdin_closed = False
        self.initialize: Mapping[str, Any] | None = None
        self.initialize_id: Any = None
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._users: asyncio.Queue[Any] = asyncio.Queue()
        self._first: asyncio.Future[str] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- stdin ---------------------------------------------------------------------------------

    async def pump(self, inputs: AsyncIterator[Any]) -> None:
        """Read every stdin message until EOF: answers go to the requests waiting for them, the
        SDK's requests are answered, anything else is a user message for :meth:`user_messages`."""
        try:
            async for raw in inputs:
                kind = raw.get("type") if isinstance(raw, Mapping) else None
                if kind == "control_response":
                    self._on_response(raw)
                elif kind == "control_cancel_request":
                    continue  # the SDK never withdraws its own requests in a way we must act on
                elif kind == "control_request" and isinstance(raw.get("request"), Mapping):
                    self._on_request(raw["request"], raw.get("request_id"))
                else:
                    uid = raw.get("uuid") if isinstance(raw, Mapping) else None
                    if isinstance(uid, str) and uid and self.accounting is not None:
                        self.accounting.given_uuids.add(uid)
                    self._users.put_nowait(raw)
                    self._announce("user")
        finally:
            self.stdin_closed = True
            for rid, fut in list(self._pending.items()):
                if not fut.done():
                    fut.set_exception(ControlError(f"stdin closed before control request {rid} was answered"))
            self._users.put_nowait(_END)
            self._announce("eof")

    async def first(self) -> str:
        """What came first on stdin: ``"initialize"``, ``"user"`` or ``"eof"``."""
        if self._first is None:
            self._first = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._first)

    def _announce(self, what: str) -> None:
        if self._first is None:
            self._first = asyncio.get_running_loop().create_future()
        if not self._first.done():
            self._first.set_result(what)

    async def user_messages(self) -> AsyncIterator[Any]:
        """The user messages of stdin, as they arrive, until EOF."""
        while (item := await self._users.get()) is not _END:
            yield item

    # --- requests the CLI sends ----------------------------------------------------------------

    async def request(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Send a control request and wait for its answer (the ``response`` object of a success).
        Raises :class:`ControlError` for an error answer or when stdin is closed. Cancelling the
        wait withdraws the request (``control_cancel_request``)."""
        subtype = body.get("subtype")
        if self.stdin_closed:
            raise ControlError(f"cannot send {subtype}: the SDK closed stdin")
        rid = str(uuid.uuid4())
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self.write({"type": "control_request", "request_id": rid, "request": dict(body)})
        try:
            return await fut
        except asyncio.CancelledError:
            if not fut.done():
                self.write({"type": "control_cancel_request", "request_id": rid})
            raise
        finally:
            self._pending.pop(rid, None)

    def _on_response(self, raw: Mapping[str, Any]) -> None:
        resp = raw.get("response")
        if not isinstance(resp, Mapping):
            log.warning("control.bad_response", message=dict(raw))
            return
        fut = self._pending.get(str(resp.get("request_id")))
        if fut is None or fut.done():
            log.info("control.unexpected_response", request_id=resp.get("request_id"))
            return
        if resp.get("subtype") == "success":
            answer = resp.get("response")
            fut.set_result(dict(answer) if isinstance(answer, Mapping) else {})
        else:
            fut.set_exception(ControlError(str(resp.get("error") or "the SDK answered with an error")))

    # --- requests the SDK sends ----------------------------------------------------------------

    def _answer(self, request_id: Any, response: Mapping[str, Any] | None = None, *,
                error: str | None = None, code: str | None = None) -> None:
        if error is None:
            body: dict[str, Any] = {"subtype": "success", "request_id": request_id, "response": dict(response or {})}
        else:
            body = {"subtype": "error", "request_id": request_id, "error": error}
            if code:
                body["error_code"] = code
        self.write({"type": "control_response", "response": body})

    def _on_request(self, request: Mapping[str, Any], request_id: Any) -> None:
        subtype = request.get("subtype")
        log.info("control.request", subtype=subtype, request_id=request_id)
        if subtype == "initialize":
            if self.initialize is not None:
                self._answer(request_id, error="Already initialized", code="already_initialized")
                return
            # answered once the session (and its MCP servers) exists: see answer_initialize
            self.initialize, self.initialize_id = request, request_id
            self._announce("initialize")
            return
        handler = _HANDLERS.get(str(subtype))
        if handler is None:
            self._answer(request_id, error=f"Unsupported control request subtype: {subtype}",
                         code="unsupported")
            return
        if asyncio.iscoroutinefunction(handler):
            task = asyncio.ensure_future(self._run_async(handler, request, request_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        try:
            handler(self, request, request_id)
        except Exception as exc:  # a bad request must not end the session
            self._answer(request_id, error=f"{subtype} failed: {type(exc).__name__}: {exc}")

    async def _run_async(self, handler: Any, request: Mapping[str, Any], request_id: Any) -> None:
        try:
            await handler(self, request, request_id)
        except Exception as exc:
            self._answer(request_id, error=f"{request.get('subtype')} failed: {type(exc).__name__}: {exc}")

    def answer_initialize(self, options: Options) -> None:
        """Answer the SDK's ``initialize`` (the fields it reads, and what else Claude Code reports
        that this loop has: agents, the permission mode, the version)."""
        if self.initialize is None:
            return
        session = self.session
        agents = [{"name": "general-purpose", "description": "General-purpose agent for multi-step tasks."}]
        agents += [{"name": n, "description": d.description, **({"model": d.model} if d.model else {})}
                   for n, d in options.agents.items()]
        response: dict[str, Any] = {
            "commands": [], "agents": sorted(agents, key=lambda a: a["name"].lower()),
            "output_style": "default", "available_output_styles": ["default"],
            "models": [{"value": options.model, "resolvedModel": options.model, "displayName": options.model,
                        "description": options.model}],
            "account": {"apiKeySource": api_key_source()},
            "pid": os.getpid(), "claude_code_version": CLAUDE_CODE_VERSION,
            "current_permission_mode": session.permission_mode if session is not None else "default",
            "hook_on_failure_supported": False, "analytics_disabled": True, "sandbox_enabled": False,
            "session_state": "idle", "capabilities": [],
        }
        if self.initialize.get("hooks"):
            response["hooks_applied"] = True
        self._answer(self.initialize_id, response)

    # --- what the loop plugs in ----------------------------------------------------------------

    def hook(self, callback_id: str) -> Callable[[Any], Any]:
        """A Python hook that asks the SDK's callback ``callback_id`` (``hook_callback``) with the
        event's JSON — the command hooks' stdin — and returns its JSON answer, which the hook runner
        applies exactly like a command hook's stdout."""

        async def sdk_hook(record: Any) -> Any:
            payload = record.to_json_dict()
            return await self.request({"subtype": "hook_callback", "callback_id": callback_id, "input": payload,
                                       "tool_use_id": payload.get("tool_use_id") or str(uuid.uuid4())})

        sdk_hook.__qualname__ = f"sdk:{callback_id}"
        return sdk_hook

    async def can_use_tool(self, tool_name: str, tool_input: Mapping[str, Any], ctx: Any) -> Any:
        """``--permission-prompt-tool stdio``: the SDK's ``can_use_tool`` callback decides a call the
        rules leave open. A deny with ``interrupt`` also interrupts the run."""
        body: dict[str, Any] = {"subtype": "can_use_tool", "tool_name": tool_name, "display_name": tool_name,
                                "input": dict(tool_input),
                                "permission_suggestions": [dict(s) for s in getattr(ctx, "suggestions", ())],
                                # the SDK promises its callback a tool_use_id; a call without one is a bug upstream
                                "tool_use_id": getattr(ctx, "tool_use_id", "") or f"toolu_{uuid.uuid4().hex}"}
        if getattr(ctx, "description", None):
            body["description"] = ctx.description
        if getattr(ctx, "decision_reason", None):
            body["decision_reason"] = ctx.decision_reason
        if getattr(ctx, "blocked_path", None):
            body["blocked_path"] = ctx.blocked_path
        answer = await self.request(body)
        behavior = answer.get("behavior")
        if behavior == "allow":
            updated = answer.get("updatedInput")
            if isinstance(updated, Mapping) and dict(updated) == dict(tool_input):
                updated = None  # the SDK echoes the input when the callback changed nothing
            updates = answer.get("updatedPermissions")
            updates = tuple(updates) if isinstance(updates, list) else ()
            for u in updates:
                # a mode the policy cannot take is dropped with the whole answer's updates: no status for it
                if (isinstance(u, Mapping) and u.get("type") == "setMode" and u.get("mode") in PERMISSION_MODES
                        and u.get("mode") != "auto" and self.session is not None):
                    self.write({"type": "system", "subtype": "status", "status": None,
                                "permissionMode": u.get("mode"), "session_id": self.session.session_id})
            return PermissionAllow(updated if isinstance(updated, Mapping) else None, updates)
        if behavior == "deny":
            if answer.get("interrupt"):
                if self.session is not None:
                    self.session.interrupt()
                # Claude Code tells the model its own refusal (the callback's message is for the user)
                return PermissionDeny(REJECT_MESSAGE, True)
            return PermissionDeny(str(answer.get("message") or ""), False)
        raise ControlError(f"can_use_tool answered with behavior {behavior!r}; expected allow or deny")

    async def mcp_send(self, server_name: str, message: Mapping[str, Any]) -> Mapping[str, Any]:
        """One JSON-RPC message to the SDK's in-process MCP server ``server_name`` (``mcp_message``);
        the answer holds the server's reply as ``mcp_response``."""
        return await self.request({"subtype": "mcp_message", "server_name": server_name, "message": dict(message)})

    def configure(self, options: Options) -> Options:
        """``options`` with what ``initialize`` registered: the SDK's hooks (as Python hooks) and
        agents. Events this loop never fires are left out (their callbacks are never asked)."""
        init = self.initialize or {}
        hooks = {e: list(m) for e, m in options.hooks.items()}
        for event, matchers in (init.get("hooks") or {}).items():
            if event not in HOOK_EVENTS:
                log.info("control.hook_event_ignored", hook_event=event)
                continue
            for m in matchers or ():
                ids = [str(i) for i in m.get("hookCallbackIds") or ()]
                timeout = m.get("timeout")
                hooks.setdefault(event, []).append(HookMatcher(
                    matcher=m.get("matcher"), hooks=[self.hook(i) for i in ids],
                    timeout=float(timeout) if isinstance(timeout, int | float) and timeout > 0
                    else DEFAULT_PYTHON_TIMEOUT_S, source="sdk"))
        agents = dict(options.agents)
        for name, d in (init.get("agents") or {}).items():
            if not isinstance(d, Mapping) or not d.get("description") or not isinstance(d.get("prompt"), str):
                log.warning("control.agent_ignored", agent=name)
                continue
            model = d.get("model")
            agents[str(name)] = AgentDefinition(
                description=str(d["description"]), prompt=d["prompt"],
                tools=tuple(d["tools"]) if isinstance(d.get("tools"), list) else None,
                model=None if model in (None, "inherit") else str(model))
        forward = (bool(init.get("forwardSubagentText")) if self.initialize is not None
                   else options.forward_subagent_text)
        # run as the SDK's CLI: the conversation is also kept where the SDK's session helpers look
        return attrs.evolve(options, hooks=hooks, agents=agents, forward_subagent_text=forward,
                            claude_transcript=True)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _counts_as_turn(msg: Mapping[str, Any]) -> bool:
    """A user message Claude Code counts in ``num_turns``: one carrying tool results, or an interrupt marker."""
    content = (msg.get("message") or {}).get("content")
    if not isinstance(content, list):
        return False
    return any(isinstance(b, Mapping) and (b.get("type") == "tool_result" or (
        b.get("type") == "text" and str(b.get("text", "")).startswith("[Request interrupted by user")))
        for b in content)


class SdkAccounting:
    """The ResultMessage as the Agent SDK's users and docs know it, rewritten on its way out (agentfsm's
    own CLI output keeps its own counts): ``num_turns`` is 1 + each user message the run showed (tool
    results and interrupt markers), and ``modelUsage`` adds up over the whole session, as Claude Code's
    does; a prompt the SDK sent with a uuid is named (``user_message_uuid(s)``) on the first answer of
    the turn that took it in and on its result, and only such prompts have their ``command_lifecycle``
    shown. Plugged into the printer as a rewrite of each outgoing message (None drops it)."""

    def __init__(self) -> None:
        self._shown = 0
        self._model_usage: dict[str, dict[str, Any]] = {}
        # the uuids the SDK gave its user messages: only those have a command lifecycle to report
        self.given_uuids: set[str] = set()
        # those the current turn took in (in order), and whether the next answer must name them
        self._taken: list[str] = []
        self._stamp = False

    def __call__(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        kind = msg.get("type")
        if kind == "system" and msg.get("subtype") == "command_lifecycle":
            # Claude Code reports the lifecycle of a prompt that came with a uuid, and no other
            if msg.get("uuid") not in self.given_uuids:
                return None
            if msg.get("state") == "started" and msg["uuid"] not in self._taken:
                self._taken.append(msg["uuid"])
                self._stamp = True
            return msg
        if kind == "assistant" and msg.get("parent_tool_use_id") is None and self._stamp:
            # the first answer after the turn took in a prompt names it (and all it took in so far)
            self._stamp = False
            return {**msg, "user_message_uuid": self._taken[-1], "user_message_uuids": list(self._taken)}
        if kind == "user" and msg.get("parent_tool_use_id") is None and _counts_as_turn(msg):
            self._shown += 1
        elif kind == "result":
            for model, entry in (msg.get("modelUsage") or {}).items():
                self._model_usage[model] = merge_model_usage(self._model_usage.get(model), entry)
            msg = {**msg, "num_turns": 1 + self._shown if msg.get("num_turns") else 0,
                   "modelUsage": {m: dict(e) for m, e in self._model_usage.items()}}
            if self._taken:
                msg.update(user_message_uuid=self._taken[-1], user_message_uuids=list(self._taken[-64:]))
            self._shown, self._taken, self._stamp = 0, [], False
        return msg


# --- the SDK's requests ------------------------------------------------------------------------


def _interrupt(ch: ControlChannel, request: Mapping[str, Any], request_id: Any) -> None:
    # the SDK's interrupt is the user's stop: Claude Code aborts every running tool (a `sleep` is killed,
    # its file never written), not only the ones that would give way to a new message
    if ch.session is not None and ch.session.running:
        ch.session.abort()
    ch._answer(request_id, {"still_queued": []})


def _set_permission_mode(ch: ControlChannel, request: Mapping[str, Any], request_id: Any) -> None:
    mode = request.get("mode")
    if mode not in PERMISSION_MODES or mode == "auto" or ch.session is None:
        ch._answer(request_id, error="Cannot set permission mode: must be one of "
                                     + ", ".join(m for m in PERMISSION_MODES if m != "auto"), code="invalid_mode")
        return
    ch.session.gate.permission_mode = mode
    ch._answer(request_id, {"mode": mode})
    ch.write({"type": "system", "subtype": "status", "status": None, "permissionMode": mode,
              "session_id": ch.session.session_id})


def _set_model(ch: ControlChannel, request: Mapping[str, Any], request_id: Any) -> None:
    from agentfsm.machine.options import DEFAULT_MODEL

    if ch.session is None:
        ch._answer(request_id, error="no session yet")
        return
    model = request.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        ch._answer(request_id, error=f"Invalid model {model!r}")
        return
    resolved = model or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL
    ch.session.options = attrs.evolve(ch.session.options, model=resolved)
    ch._answer(request_id, {"model": resolved})


def _mcp_status(ch: ControlChannel, request: Mapping[str, Any], request_id: Any) -> None:
    servers = ch.mcp.status(detailed=True) if ch.mcp is not None else []
    ch._answer(request_id, {"mcpServers": servers})


_HANDLERS: Mapping[str, Any] = {
    "interrupt": _interrupt,
    "set_permission_mode": _set_permission_mode,
    "set_model": _set_model,
    "mcp_status": _mcp_status,
}
