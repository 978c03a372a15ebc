"""MCP servers as tools: ``--mcp-config`` parsing, one client connection per server (the official
``mcp`` package), and each server tool as a :class:`Tool` named ``mcp__<server>__<tool>``.

Server kinds, as in Claude Code's ``mcpServers`` records: ``stdio`` (a subprocess; ``type`` may be
left out), ``http`` (streamable HTTP), ``sse``, and ``sdk`` — a server living in the Claude Agent
SDK's process, reached through the control protocol (``mcp_message``); its JSON-RPC messages are
handed to a ``send(server_name, message)`` coroutine the host provides. A server that cannot be
reached is reported ``failed`` and the run goes on without its tools. This module imports ``mcp``
only when a server is started, so a run without MCP never pays for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from agentfsm.tools.base import InterruptBehavior, Tool, ToolContext, ToolError, ToolOutput

SERVER_KINDS = ("stdio", "http", "sse", "sdk")
CONNECT_TIMEOUT_S = 30.0
SdkSend = Callable[[str, Mapping[str, Any]], Awaitable[Mapping[str, Any]]]


class McpConfigError(ValueError):
    """An ``--mcp-config`` value that cannot be used (no such file, not JSON, no ``mcpServers``)."""


@attrs.frozen
class McpServerConfig:
    """One ``mcpServers`` entry. ``source``: ``dynamic`` (``--mcp-config``), ``user``, ``project``
    or ``sdk``."""

    name: str
    type: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    url: str = ""
    headers: Mapping[str, str] = attrs.field(factory=dict)
    source: str = "dynamic"

    def public(self) -> dict[str, Any]:
        """The config as ``mcp_status`` shows it (the environment is never echoed)."""
        if self.type == "stdio":
            return {"type": "stdio", "command": self.command, "args": list(self.args)}
        if self.type == "sdk":
            return {"type": "sdk", "name": self.name}
        return {"type": self.type, "url": self.url}


def _entry(name: str, raw: Any, source: str) -> McpServerConfig | None:
    """One entry, or None for an entry Claude Code would drop (it drops invalid ones silently)."""
    if not isinstance(raw, Mapping):
        return None
    kind = raw.get("type") or ("stdio" if "command" in raw else None)
    if kind not in SERVER_KINDS:
        return None
    strs = lambda v: isinstance(v, Mapping) and all(isinstance(x, str) for x in v.values())  # noqa: E731
    if kind == "stdio":
        args = raw.get("args", [])
        if not isinstance(raw.get("command"), str) or not raw["command"] or not (
                isinstance(args, list) and all(isinstance(a, str) for a in args)):
            return None
        env = raw.get("env", {})
        return McpServerConfig(name, "stdio", command=raw["command"], args=tuple(args),
                               env=dict(env) if strs(env) else {}, source=source)
    if kind == "sdk":
        return McpServerConfig(name, "sdk", source="sdk")
    if not isinstance(raw.get("url"), str) or not raw["url"]:
        return None
    headers = raw.get("headers", {})
    return McpServerConfig(name, kind, url=raw["url"], headers=dict(headers) if strs(headers) else {}, source=source)


def parse_mcp_configs(values: Sequence[str], cwd: Path, *, source: str = "dynamic") -> list[McpServerConfig]:
    """Every ``--mcp-config`` value (JSON text, else a file path relative to ``cwd``), merged in
    order; a later server of the same name replaces an earlier one. Raises :class:`McpConfigError`."""
    servers: dict[str, McpServerConfig] = {}
    for value in values:
        try:
            data = json.loads(value)
        except ValueError:
            path = (cwd / value).expanduser()
            try:
                data = json.loads(path.read_text())
            except FileNotFoundError:
                raise McpConfigError(f"MCP config file not found: {path}") from None
            except (OSError, ValueError) as exc:
                raise McpConfigError(f"MCP config file {path} is not valid JSON: {exc}") from None
        if not isinstance(data, Mapping) or not isinstance(data.get("mcpServers"), Mapping):
            got = "undefined" if not isinstance(data, Mapping) or "mcpServers" not in data else type(
                data["mcpServers"]).__name__
            raise McpConfigError(f"mcpServers: Invalid input: expected record, received {got}")
        for name, raw in data["mcpServers"].items():
            entry = _entry(str(name), raw, source)
            if entry is not None:
                servers[entry.name] = entry
    return list(servers.values())


def settings_servers(cwd: Path, home: Path) -> list[McpServerConfig]:
    """The servers Claude Code adds unless ``--strict-mcp-config``: the user's (``~/.claude.json``)
    then the project's (``.mcp.json`` in the working directory). Unreadable files are skipped."""
    out: list[McpServerConfig] = []
    for path, source in ((home / ".claude.json", "user"), (cwd / ".mcp.json", "project")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, Mapping) and isinstance(data.get("mcpServers"), Mapping):
            out += [e for n, r in data["mcpServers"].items() if (e := _entry(str(n), r, source)) is not None]
    return out


def tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``, with every character the API refuses in a tool name made ``_``."""
    clean = lambda s: re.sub(r"[^A-Za-z0-9_-]", "_", s)  # noqa: E731
    return f"mcp__{clean(server)}__{clean(tool)}"


def map_call_result(result: Mapping[str, Any]) -> ToolOutput:
    """A ``tools/call`` result as the model sees it (Claude Code's mapping): an error is the text of
    its blocks, as a string; ``structuredContent`` wins over ``content`` and is sent as compact JSON;
    otherwise the content blocks stay a list (text, and images as base64 image blocks)."""
    blocks = [b for b in result.get("content") or () if isinstance(b, Mapping)]
    if result.get("isError"):
        return ToolOutput("\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text"),
                          is_error=True)
    if result.get("structuredContent") is not None:
        return ToolOutput(json.dumps(result["structuredContent"], separators=(",", ":"), ensure_ascii=False))
    out: list[dict[str, Any]] = []
    for b in blocks:
        if b.get("type") == "text":
            out.append({"type": "text", "text": str(b.get("text", ""))})
        elif b.get("type") == "image" and isinstance(b.get("data"), str):
            out.append({"type": "image", "source": {"type": "base64", "media_type": b.get("mimeType", "image/png"),
                                                     "data": b["data"]}})
        else:
            out.append({"type": "text", "text": json.dumps(dict(b), ensure_ascii=False)})
    return ToolOutput(out or "")


class McpTool(Tool):
    """One tool of a connected server. Read-only (and concurrency-safe) only when the server says so
    with ``readOnlyHint``; permission rules name it ``mcp__<server>__<tool>`` or ``mcp__<server>``."""

    def __init__(self, connection: _Connection, listed: Mapping[str, Any]) -> None:
        self.connection = connection
        self.remote_name = str(listed["name"])
        self.name = tool_name(connection.config.name, self.remote_name)
        self.description = str(listed.get("description") or "")
        schema = listed.get("inputSchema")
        self.input_schema = dict(schema) if isinstance(schema, Mapping) else {"type": "object", "properties": {}}
        annotations = listed.get("annotations") or {}
        self._read_only = bool(isinstance(annotations, Mapping) and annotations.get("readOnlyHint"))

    def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
        return self._read_only

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        return self._read_only

    def interrupt_behavior(self) -> InterruptBehavior:
        return "cancel" if self._read_only else "block"

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        return None

    async def call(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        return map_call_result(await self.connection.call(self.remote_name, dict(input), ctx.tool_use_id))


class _Connection:
    """One server: a task holds the ``mcp.Client`` open (its context must live in one task) until
    :meth:`close`; calls are made from the loop's tool tasks."""

    def __init__(self, config: McpServerConfig, sdk_send: SdkSend | None, cwd: Path) -> None:
        self.config = config
        self.status = "pending"
        self.error = ""
        self.server_info: dict[str, Any] | None = None
        self.listed: list[dict[str, Any]] = []
        self._sdk_send = sdk_send
        self._cwd = cwd
        self._client: Any = None
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._errlog: Any = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._hold())

    async def wait_ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            self._fail(f"timed out after {timeout:g}s while connecting")

    def _fail(self, error: str) -> None:
        if self.status != "failed":
            self.status, self.error, self.listed = "failed", error, []
        self._ready.set()

    async def _hold(self) -> None:
        try:
            from mcp import Client

            transport, mode = self._transport()
            async with Client(transport, mode=mode, raise_exceptions=False) as client:
                listed = await client.list_tools()
                self.listed = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools]
                info = client.server_info
                self.server_info = ({"name": info.name, "version": info.version or ""} if info is not None else None)
                self._client, self.status = client, "connected"
                self._ready.set()
                await self._closing.wait()
        except asyncio.CancelledError:
            self._fail("cancelled")
            raise
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types"):
                self._fail(_describe(exc))
            else:  # an optional part of agentfsm: say which extra brings it
                self._fail("the MCP client is not installed: pip install 'agentfsm[mcp]'")
        except BaseException as exc:  # anyio wraps failures in exception groups; the run goes on
            self._fail(_describe(exc))
        finally:
            self._client = None
            self._ready.set()
            if self._errlog is not None:
                self._errlog.close()

    def _transport(self) -> tuple[Any, str]:
        c = self.config
        if c.type == "stdio":
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            # the server's stderr is its own log, not the protocol's stdout nor our stderr
            self._errlog = open(os.devnull, "w")  # closed with the connection
            params = StdioServerParameters(command=c.command, args=list(c.args), env=dict(c.env) or None,
                                           cwd=str(self._cwd))
            return stdio_client(params, errlog=self._errlog), "auto"
        if c.type == "http":
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            return streamable_http_client(c.url, http_client=create_mcp_http_client(headers=dict(c.headers))), "auto"
        if c.type == "sse":
            from mcp.client.sse import sse_client

            return sse_client(c.url, headers=dict(c.headers)), "legacy"
        if self._sdk_send is None:
            raise ConnectionError("no SDK is connected to serve this in-process server")
        return _sdk_transport(c.name, self._sdk_send), "legacy"

    async def call(self, name: str, arguments: dict[str, Any], tool_use_id: str) -> Mapping[str, Any]:
        client = self._client
        if client is None:
            raise ToolError(f"MCP server {self.config.name!r} is not connected ({self.error or self.status})")
        try:
            result = await client.call_tool(name, arguments, meta={"claudecode/toolUseId": tool_use_id})
        except Exception as exc:
            raise ToolError(f"MCP error calling {name} on {self.config.name}: {_describe(exc)}") from None
        return result.model_dump(by_alias=True, exclude_none=True, mode="json")

    async def close(self) -> None:
        self._closing.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task


def _describe(exc: BaseException) -> str:
    """The innermost useful message of an exception (group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.asynccontextmanager
async def _sdk_transport(name: str, send: SdkSend) -> AsyncIterator[Any]:
    """An MCP transport whose peer is the SDK: each JSON-RPC message goes out as an ``mcp_message``
    control request; the ``mcp_response`` of a request comes back as the server's answer."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    read_w, read_r = anyio.create_memory_object_stream[Any](64)
    write_w, write_r = anyio.create_memory_object_stream[Any](64)

    async def relay(message: Mapping[str, Any]) -> None:
        rid = message.get("id")
        try:
            answer = await send(name, message)
            response = answer.get("mcp_response")
        except Exception as exc:
            response = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": _describe(exc)}}
        if rid is None or not isinstance(response, Mapping) or not ("result" in response or "error" in response):
            return  # a notification's acknowledgement
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await read_w.send(SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(
                {**response, "id": rid}, by_name=False)))

    async def forward() -> None:
        async with anyio.create_task_group() as tg:
            async for msg in write_r:
                tg.start_soon(relay, msg.message.model_dump(by_alias=True, exclude_unset=True, mode="json"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(forward)
        try:
            yield read_r, write_w
        finally:
            tg.cancel_scope.cancel()
            await read_w.aclose()


class McpServers:
    """The MCP servers of one session: started together, their tools, their status, closed together."""

    def __init__(self, configs: Sequence[McpServerConfig], *, sdk_send: SdkSend | None = None,
                 cwd: Path | str = ".") -> None:
        self.connections = [_Connection(c, sdk_send, Path(cwd)) for c in configs]

    async def start(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Connect every server (concurrently); a server that fails or times out is ``failed``."""
        for conn in self.connections:
            conn.start()
        await asyncio.gather(*(c.wait_ready(timeout) for c in self.connections))

    def tools(self) -> list[Tool]:
        out: list[Tool] = []
        for conn in self.connections:
            if conn.status == "connected":
                out += sorted((McpTool(conn, t) for t in conn.listed), key=lambda t: t.name)
        return out

    def status(self, *, detailed: bool = False) -> list[dict[str, Any]]:
        """``system/init``'s ``mcp_servers`` (``detailed``: ``mcp_status``'s ``mcpServers``)."""
        out: list[dict[str, Any]] = []
        for conn in self.connections:
            c = conn.config
            entry: dict[str, Any] = {"name": c.name, "status": conn.status}
            if detailed:
                if conn.error:
                    entry["error"] = conn.error
                if conn.server_info is not None:
                    entry["serverInfo"] = conn.server_info
                entry |= {"config": c.public(), "transport": c.type,
                          "scope": "dynamic" if c.source in ("dynamic", "sdk") else c.source, "source": c.source}
                if conn.status == "connected":
                    entry["tools"] = [{"name": t["name"], "annotations": t.get("annotations") or {}}
                                      for t in conn.listed]
            else:
                entry["source"] = c.source
            out.append(entry)
        return out

    async def aclose(self) -> None:
        await asyncio.gather(*(c.close() for c in self.connections), return_exceptions=True)
