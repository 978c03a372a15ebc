"""One session: its id, its session file, its tools, gate and hooks, and the driver that runs it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from fsm import log
from fsm.driver import Driver, Emit, InputQueue, LoopHooks
from fsm.gate import OpenGate
from fsm.model import ModelClient
from fsm.options import Options
from fsm.request import system_blocks
from fsm.result import RunResult
from fsm.state import LoopState, Message
from fsm.trace import TraceWriter, default_sessions_dir


def build_registry(options: Options) -> Any:
    from tools import ToolRegistry, builtin_tools

    registry = ToolRegistry([*builtin_tools(), *options.extra_tools])
    if options.tools is not None:
        registry = registry.subset([*options.tools, *(t.name for t in options.extra_tools)])
    return registry


class Session:
    """Runs prompts on one conversation. Sessions share nothing mutable, so many can run at once
    on one event loop."""

    def __init__(self, options: Options, *, client: ModelClient | None = None, emit: Emit | None = None,
                 queue: InputQueue | None = None, history: Sequence[Message] = ()) -> None:
        log.ensure_configured()
        self.options = options
        self.session_id = options.session_id or str(uuid.uuid4())
        self.history: tuple[Message, ...] = tuple(history)
        self.queue = queue or InputQueue()
        self.emit = emit
        self._client = client
        sessions_dir = options.sessions_dir or default_sessions_dir(options.cwd)
        self.trace_path: Path | None = (sessions_dir / f"{self.session_id}.jsonl") if options.write_trace else None
        self.trace = TraceWriter(self.trace_path)
        self.registry = build_registry(options)
        self.gate, self.hooks = self._build_gate()
        self.driver: Driver | None = None
        self._header_written = False
        self.resumed = False  # set by fsm.sessions when the file already holds header and history
        self.log = structlog.get_logger("agentfsm").bind(session_id=self.session_id)

    def _build_gate(self) -> tuple[Any, Any]:
        try:
            from hooks import build_gate
        except ImportError:
            return OpenGate(), LoopHooks()
        gate = build_gate(self.options, session_id=self.session_id,
                          transcript_path=str(self.trace_path or ""), registry=self.registry)
        self.registry = gate.filter_registry(self.registry)
        return gate, gate

    @property
    def client(self) -> ModelClient:
        if self._client is None:
            from fsm.transport import AnthropicTransport

            self._client = AnthropicTransport(max_retries=self.options.limits.api_max_retries)
        return self._client

    @property
    def permission_mode(self) -> str:
        mode = getattr(self.gate, "permission_mode", None) or self.options.permission_mode
        return mode or "default"

    def init_message(self) -> dict[str, Any]:
        return {"type": "system", "subtype": "init", "cwd": str(self.options.cwd),
                "session_id": self.session_id, "tools": list(self.registry.names()),
                "model": self.options.model, "permissionMode": self.permission_mode,
                "mcp_servers": [], "slash_commands": [], "output_style": "default",
                "agentfsm_version": _version(), "transcript_path": str(self.trace_path or "")}

    async def run(self, prompt: str | Sequence[Mapping[str, Any]]) -> RunResult:
        if not self._header_written:
            if not self.resumed:
                self.trace.session(self.session_id, self.options.limits, str(self.options.cwd),
                                   self.options.model, self.options.parent_session_id)
            for m in self.history:
                # a resumed file already holds its messages; only repairs are new
                if not self.resumed or m.kind == "synthetic":
                    self.trace.message(m)
            self._header_written = True
        emit = self.emit or (lambda _m: None)
        emit(self.init_message())
        system = system_blocks(self.options.cwd, system_prompt=self.options.system_prompt,
                               append=self.options.append_system_prompt)
        self.driver = Driver(options=self.options, client=self.client, registry=self.registry,
                             session_id=self.session_id, system=system, gate=self.gate, hooks=self.hooks,
                             trace=self.trace, emit=emit, queue=self.queue)
        result, state = await self.driver.run(prompt, self.history)
        self.history = state.messages
        self.last_state: LoopState = state
        emit(result.to_dict())
        return result

    def abort(self) -> None:
        if self.driver is not None:
            self.driver.abort()

    async def aclose(self) -> None:
        self.trace.close()
        client = self._client
        if client is not None and hasattr(client, "aclose"):
            await client.aclose()


def _version() -> str:
    from fsm import __version__

    return __version__
