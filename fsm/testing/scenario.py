"""Scenario records: what a scripted model answers, request by request.

A scenario is ``{"prompt": ..., "responses": [R0, R1, ...]}`` (the format Claude Code was driven
with in the recorded comparisons); the Nth model request of a run is answered with ``R[N]`` and, once
the list runs out, with the text ``SCENARIO_EXHAUSTED`` (``end_turn``). :func:`response_events` turns a
streamed response into the exact event sequence both the in-process model and the HTTP server send,
so the two transports cannot drift apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import jsonschema

from agentfsm.llm.model import (
    BlockDelta,
    BlockStart,
    BlockStop,
    MessageDelta,
    MessageStart,
    MessageStop,
    StreamEvent,
)

EXHAUSTED_TEXT = "SCENARIO_EXHAUSTED"

STOP_REASONS = (
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
)

# The workspace every scenario's $WS points at: the files the recorded comparisons used.
WORKSPACE_FILES: Mapping[str, str] = {
    "probe-fixture.txt": "AGENT_LOOP_FILE_MARKER\n",
    "a.txt": "ALPHA\n",
    "b.txt": "BETA\n",
}


class ScenarioError(ValueError):
    """A scenario file or dict that does not have the scenario structure."""


def _thaw(value: Any) -> Any:
    """A deep plain-JSON copy, so a record never shares mutable state with its caller."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


# --- blocks ------------------------------------------------------------------------------------


@attrs.frozen
class TextBlock:
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@attrs.frozen
class ToolUseBlock:
    id: str
    name: str
    input: Mapping[str, Any] = attrs.field(factory=dict, converter=_thaw)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": _thaw(self.input)}


@attrs.frozen
class ThinkingBlock:
    thinking: str
    signature: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"type": "thinking", "thinking": self.thinking, "signature": self.signature}


@attrs.frozen
class RawToolJsonBlock:
    """A tool_use whose ``input_json_delta`` text is sent verbatim — possibly invalid JSON."""

    id: str
    name: str
    json: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "raw_tool_json", "id": self.id, "name": self.name, "json": self.json}


Block = TextBlock | ToolUseBlock | ThinkingBlock | RawToolJsonBlock


# --- responses ---------------------------------------------------------------------------------


@attrs.frozen
class SseError:
    """An SSE ``error`` event sent in place of the rest of the stream (the API's mid-stream failure)."""

    type: str = "overloaded_error"
    message: str = "Overloaded"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message}


@attrs.frozen
class StreamedResponse:
    """A streamed message.

    ``break_after``: cut the stream after that many complete blocks (0 = right after
    ``message_start``); with ``break_mid_block`` the next block is also started and given its first
    delta before the cut. ``sse_error``: send an ``error`` event at the cut point (after
    ``break_after`` blocks, else after every block) instead of dropping the connection.
    ``stop_reason`` None sends a ``message_delta`` without one (a malformed stream). ``fault``: a
    stream that fails before its first event — ``drop`` (the connection closes after the headers),
    ``invalid_json`` (a ``message_start`` whose data is not JSON), ``html`` (a 200 with an HTML page),
    ``garbage`` (bytes that are not SSE); a non-streamed request gets the message itself.
    """

    blocks: tuple[Block, ...] = attrs.field(default=(), converter=tuple)
    stop_reason: str | None = "end_turn"
    usage: Mapping[str, int] | None = None
    delay_s: float = 0.0
    block_delay_s: float = 0.0
    break_after: int | None = None
    break_mid_block: bool = False
    sse_error: SseError | None = None
    fault: str | None = attrs.field(default=None, validator=attrs.validators.optional(
        attrs.validators.in_(("drop", "invalid_json", "html", "garbage"))))

    def __attrs_post_init__(self) -> None:
        if self.break_after is not None and not 0 <= self.break_after <= len(self.blocks):
            raise ScenarioError(f"break_after: {self.break_after} is more than the {len(self.blocks)} blocks")
        if self.break_mid_block and (self.break_after is None or self.break_after >= len(self.blocks)):
            raise ScenarioError("break_mid_block: needs break_after < the number of blocks")

    @property
    def breaks(self) -> bool:
        """The connection is dropped (no ``message_stop``, no error event)."""
        return self.break_after is not None and self.sse_error is None

    @property
    def complete(self) -> bool:
        return self.break_after is None and self.sse_error is None and self.fault is None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"blocks": [b.to_dict() for b in self.blocks], "stop_reason": self.stop_reason}
        if self.usage is not None:
            out["usage"] = dict(self.usage)
        if self.delay_s:
            out["delay_s"] = self.delay_s
        if self.block_delay_s:
            out["block_delay_s"] = self.block_delay_s
        if self.break_after is not None:
            out["break_after"] = self.break_after
        if self.break_mid_block:
            out["break_mid_block"] = True
        if self.sse_error is not None:
            out["sse_error"] = self.sse_error.to_dict()
        if self.fault is not None:
            out["fault"] = self.fault
        return out


@attrs.frozen
class HttpErrorResponse:
    """An HTTP error answered instead of a stream.

    ``should_retry`` sets the API's ``x-should-retry`` header (None: no header, the SDK then decides
    by status; 529 defaults to True as the API does); ``retry_after_s`` sets ``retry-after-ms`` so
    SDK retries against the server need not wait the SDK's default backoff.
    """

    status: int
    error_type: str
    message: str
    delay_s: float = 0.0
    should_retry: bool | None = None
    retry_after_s: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.should_retry is None and self.status == 529:
            object.__setattr__(self, "should_retry", True)

    @property
    def sdk_retries(self) -> bool:
        """Whether the anthropic SDK retries this answer (its ``_should_retry`` rule)."""
        if self.should_retry is not None:
            return self.should_retry
        return self.status in (408, 409, 429) or self.status >= 500

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "error_type": self.error_type, "message": self.message}
        if self.delay_s:
            out["delay_s"] = self.delay_s
        if self.should_retry is not None and not (self.status == 529 and self.should_retry):
            out["should_retry"] = self.should_retry
        if self.retry_after_s is not None:
            out["retry_after_s"] = self.retry_after_s
        return out


Response = StreamedResponse | HttpErrorResponse


def exhausted_response() -> StreamedResponse:
    return StreamedResponse(blocks=(TextBlock(EXHAUSTED_TEXT),), stop_reason="end_turn")


def text_response(text: str, stop_reason: str = "end_turn", **kw: Any) -> StreamedResponse:
    return StreamedResponse(blocks=(TextBlock(text),), stop_reason=stop_reason, **kw)


def tool_response(id: str, name: str, input: Mapping[str, Any], **kw: Any) -> StreamedResponse:
    return StreamedResponse(blocks=(ToolUseBlock(id, name, input),), stop_reason="tool_use", **kw)


@attrs.frozen
class Scenario:
    prompt: str
    responses: tuple[Response, ...] = attrs.field(converter=tuple)
    description: str = ""
    meta: Mapping[str, Any] = attrs.field(factory=dict, converter=_thaw)

    def response_for(self, n: int) -> Response:
        if 0 <= n < len(self.responses):
            return self.responses[n]
        return exhausted_response()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt": self.prompt, "responses": [r.to_dict() for r in self.responses]}
        if self.description:
            out["description"] = self.description
        out.update(_thaw(self.meta))
        return out


# --- loading -----------------------------------------------------------------------------------

_NUM = {"type": "number", "minimum": 0}
_BLOCK_SCHEMAS: dict[str, dict[str, Any]] = {
    "text": {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        "additionalProperties": False,
    },
    "tool_use": {
        "type": "object",
        "required": ["type", "id", "name"],
        "properties": {
            "type": {"const": "tool_use"},
            "id": {"type": "string", "minLength": 1},
            "name": {"type": "string", "minLength": 1},
            "input": {"type": "object"},
        },
        "additionalProperties": False,
    },
    "thinking": {
        "type": "object",
        "required": ["type", "thinking"],
        "properties": {
            "type": {"const": "thinking"},
            "thinking": {"type": "string"},
            "signature": {"type": "string"},
        },
        "additionalProperties": False,
    },
    "raw_tool_json": {
        "type": "object",
        "required": ["type", "id", "name", "json"],
        "properties": {
            "type": {"const": "raw_tool_json"},
            "id": {"type": "string", "minLength": 1},
            "name": {"type": "string", "minLength": 1},
            "json": {"type": "string"},
        },
        "additionalProperties": False,
    },
}
_STREAMED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["blocks"],
    "properties": {
        "blocks": {"type": "array", "items": {"type": "object", "required": ["type"]}},
        "stop_reason": {"enum": [*STOP_REASONS, None]},
        "usage": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        "delay_s": _NUM,
        "block_delay_s": _NUM,
        "break_after": {"type": "integer", "minimum": 0},
        "break_mid_block": {"type": "boolean"},
        "fault": {"enum": ["drop", "invalid_json", "html", "garbage"]},
        "sse_error": {
            "oneOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"type": "string", "minLength": 1}, "message": {"type": "string"}},
                    "additionalProperties": False,
                },
            ]
        },
    },
    "additionalProperties": False,
}
_HTTP_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["status", "error_type", "message"],
    "properties": {
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "error_type": {"type": "string", "minLength": 1},
        "message": {"type": "string"},
        "delay_s": _NUM,
        "should_retry": {"type": "boolean"},
        "retry_after_s": _NUM,
    },
    "additionalProperties": False,
}
_SCENARIO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["responses"],
    "properties": {
        "prompt": {"type": "string"},
        "description": {"type": "string"},
        "responses": {"type": "array", "items": {"type": "object"}},
    },
}


def _check(instance: Any, schema: Mapping[str, Any], where: str) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        err = errors[0]
        path = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ScenarioError(f"{path}: {err.message}{more}")


def parse_block(raw: Mapping[str, Any], where: str = "block") -> Block:
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind not in _BLOCK_SCHEMAS:
        raise ScenarioError(f"{where}.type: {kind!r} is not one of {sorted(_BLOCK_SCHEMAS)}")
    _check(raw, _BLOCK_SCHEMAS[kind], where)
    if kind == "text":
        return TextBlock(raw["text"])
    if kind == "tool_use":
        return ToolUseBlock(raw["id"], raw["name"], raw.get("input", {}))
    if kind == "thinking":
        return ThinkingBlock(raw["thinking"], raw.get("signature", ""))
    return RawToolJsonBlock(raw["id"], raw["name"], raw["json"])


def parse_response(raw: Mapping[str, Any] | Response, where: str = "response") -> Response:
    """One response from its JSON form (records are passed through)."""
    if isinstance(raw, StreamedResponse | HttpErrorResponse):
        return raw
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object, got {type(raw).__name__}")
    if "status" in raw:
        _check(raw, _HTTP_ERROR_SCHEMA, where)
        return HttpErrorResponse(
            status=raw["status"],
            error_type=raw["error_type"],
            message=raw["message"],
            delay_s=float(raw.get("delay_s", 0)),
            should_retry=raw.get("should_retry"),
            retry_after_s=None if raw.get("retry_after_s") is None else float(raw["retry_after_s"]),
        )
    _check(raw, _STREAMED_SCHEMA, where)
    blocks = tuple(parse_block(b, f"{where}.blocks[{i}]") for i, b in enumerate(raw["blocks"]))
    if "stop_reason" in raw:
        stop_reason = raw["stop_reason"]
    else:
        is_tool = any(isinstance(b, ToolUseBlock | RawToolJsonBlock) for b in blocks)
        stop_reason = "tool_use" if is_tool else "end_turn"
    sse = raw.get("sse_error")
    sse_error = None
    if isinstance(sse, str):
        sse_error = SseError(sse, _default_error_message(sse))
    elif isinstance(sse, Mapping):
        sse_error = SseError(sse["type"], sse.get("message", _default_error_message(sse["type"])))
    try:
        return StreamedResponse(
            blocks=blocks,
            stop_reason=stop_reason,
            usage=dict(raw["usage"]) if "usage" in raw else None,
            delay_s=float(raw.get("delay_s", 0)),
            block_delay_s=float(raw.get("block_delay_s", 0)),
            break_after=raw.get("break_after"),
            break_mid_block=bool(raw.get("break_mid_block", False)),
            sse_error=sse_error,
            fault=raw.get("fault"),
        )
    except ScenarioError as e:
        raise ScenarioError(f"{where}.{e}") from None


def _default_error_message(error_type: str) -> str:
    return {"overloaded_error": "Overloaded", "api_error": "Internal server error"}.get(
        error_type, error_type
    )


def substitute_ws(value: Any, ws: str, *, raw_json: bool = False) -> Any:
    """``$WS`` replaced in every string (keys included); inside a raw JSON text the path is escaped
    as a JSON string body, so a path with quotes or backslashes keeps the raw text as valid as it was."""
    if isinstance(value, str):
        return value.replace("$WS", json.dumps(ws)[1:-1] if raw_json else ws)
    if isinstance(value, Mapping):
        is_raw = value.get("type") == "raw_tool_json"
        return {
            substitute_ws(k, ws): substitute_ws(v, ws, raw_json=is_raw and k == "json")
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [substitute_ws(v, ws) for v in value]
    return value


def load_scenario(
    source: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any] | Response] | Scenario,
    ws: str | os.PathLike[str] | None = None,
) -> Scenario:
    """A scenario from a file path, a dict, or a bare list of responses (in a file too), with
    ``$WS`` replaced by ``ws`` (left alone when ``ws`` is None).

    Raises :class:`ScenarioError` naming the bad field."""
    where = "scenario"
    if isinstance(source, Scenario):
        if ws is None:
            return source
        source = source.to_dict()
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        where = str(path)
        try:
            raw: Any = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ScenarioError(f"{path}: cannot read: {e.strerror or e}") from e
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{path}: not JSON: {e}") from e
    elif isinstance(source, Mapping):
        raw = source
    elif isinstance(source, Sequence):
        raw = {"prompt": "", "responses": list(source)}
    else:
        raise ScenarioError(f"scenario: expected a path, a dict or a list, got {type(source).__name__}")
    if isinstance(raw, list):
        raw = {"prompt": "", "responses": raw}
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{where}: expected an object with 'responses', got {type(raw).__name__}")
    if isinstance(raw.get("responses"), list | tuple):
        # Records go through their JSON form so that $WS and validation treat every response alike.
        raw = {
            **raw,
            "responses": [
                r.to_dict() if isinstance(r, StreamedResponse | HttpErrorResponse) else r
                for r in raw["responses"]
            ],
        }
    raw = _thaw(raw)
    if ws is not None:
        raw = substitute_ws(raw, os.fspath(ws))
    _check(raw, _SCENARIO_SCHEMA, where)
    responses = tuple(parse_response(r, f"{where}.responses[{i}]") for i, r in enumerate(raw["responses"]))
    meta = {k: v for k, v in raw.items() if k not in ("prompt", "responses", "description")}
    return Scenario(
        prompt=raw.get("prompt", ""),
        responses=responses,
        description=raw.get("description", ""),
        meta=meta,
    )


def scenario_path(arg: str) -> Path:
    """A scenario argument: a file, or the name of an embedded scenario when no such file exists."""
    path = Path(arg)
    if path.exists() or path.suffix:
        return path
    embedded = embedded_scenario_path(arg)
    return embedded if embedded.exists() else path


def embedded_scenario_path(name: str = "read_probe") -> Path:
    """The path of a scenario shipped inside the package (``fsm/scenarios/NAME.json``)."""
    return Path(__file__).resolve().parent.parent / "scenarios" / f"{name}.json"


def load_embedded_scenario(name: str = "read_probe", ws: str | os.PathLike[str] | None = None) -> Scenario:
    return load_scenario(embedded_scenario_path(name), ws)


def populate_workspace(path: str | os.PathLike[str]) -> Path:
    """Write the reference workspace files into ``path`` (created if needed) and return it."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for name, content in WORKSPACE_FILES.items():
        (root / name).write_text(content, encoding="utf-8")
    return root


# --- events ------------------------------------------------------------------------------------


@attrs.frozen
class WireEvent:
    """One SSE event: ``type`` is the ``event:`` name, ``data`` the JSON payload, ``record`` what the
    loop sees (None for ``ping`` and ``error``), ``pause_s`` how long to wait after sending it."""

    type: str
    data: Mapping[str, Any]
    record: StreamEvent | None = None
    pause_s: float = 0.0

    def sse(self) -> bytes:
        return f"event: {self.type}\ndata: {json.dumps(self.data, separators=(',', ':'))}\n\n".encode()


def _chunks(text: str, parts: int = 3) -> list[str]:
    """Split into up to ``parts`` non-empty pieces, as the API streams text in several deltas."""
    if not text:
        return []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _estimate_output_tokens(blocks: Iterable[Block]) -> int:
    chars = 0
    for b in blocks:
        if isinstance(b, TextBlock):
            chars += len(b.text)
        elif isinstance(b, ThinkingBlock):
            chars += len(b.thinking)
        elif isinstance(b, ToolUseBlock):
            chars += len(json.dumps(_thaw(b.input))) + len(b.name)
        else:
            chars += len(b.json) + len(b.name)
    return max(1, chars // 4)


def _block_events(index: int, block: Block) -> list[WireEvent]:
    """start, deltas and stop of one block (the stop event last)."""

    def delta(d: dict[str, Any]) -> WireEvent:
        return WireEvent(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": d},
            BlockDelta(index, d),
        )

    if isinstance(block, TextBlock):
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [delta({"type": "text_delta", "text": c}) for c in _chunks(block.text)]
    elif isinstance(block, ThinkingBlock):
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [delta({"type": "thinking_delta", "thinking": c}) for c in _chunks(block.thinking)]
        deltas.append(delta({"type": "signature_delta", "signature": block.signature}))
    else:
        start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
        text = (
            json.dumps(_thaw(block.input), separators=(",", ":"), ensure_ascii=False)
            if isinstance(block, ToolUseBlock)
            else block.json
        )
        # The API opens every tool_use with an empty partial_json before the real chunks.
        deltas = [delta({"type": "input_json_delta", "partial_json": c}) for c in ["", *_chunks(text)]]
    return [
        WireEvent(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
            BlockStart(index, start),
        ),
        *deltas,
        WireEvent("content_block_stop", {"type": "content_block_stop", "index": index}, BlockStop(index)),
    ]


def response_events(
    resp: StreamedResponse,
    model: str,
    *,
    input_tokens: int = 0,
    message_id: str = "msg_scripted",
) -> list[WireEvent]:
    """Every event the API would send for ``resp``, in order, with the pauses to make after each.

    A response that breaks ends without ``message_stop`` (the consumer then drops the connection or
    raises); one with ``sse_error`` ends with the ``error`` event.
    """
    usage = dict(resp.usage or {})
    in_tokens = usage.get("input_tokens", input_tokens)
    out_tokens = usage.get("output_tokens", _estimate_output_tokens(resp.blocks))
    start_usage = {
        "input_tokens": in_tokens,
        "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0),
        "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
        "output_tokens": 1,
    }
    message = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    events = [
        WireEvent(
            "message_start",
            {"type": "message_start", "message": message},
            MessageStart(model=model, usage=start_usage, message_id=message_id),
        ),
        WireEvent("ping", {"type": "ping"}),
    ]
    cut = resp.break_after if resp.break_after is not None else len(resp.blocks)
    for i, block in enumerate(resp.blocks[:cut]):
        block_events = _block_events(i, block)
        block_events[-1] = attrs.evolve(block_events[-1], pause_s=resp.block_delay_s)
        events.extend(block_events)
    if resp.break_mid_block:
        events.extend(_block_events(cut, resp.blocks[cut])[:2])
    if resp.sse_error is not None:
        err = {"type": "error", "error": resp.sse_error.to_dict()}
        events.append(WireEvent("error", err))
        return events
    if resp.break_after is not None:
        return events
    delta_usage = {"output_tokens": out_tokens}
    events.append(
        WireEvent(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": resp.stop_reason, "stop_sequence": None},
                "usage": delta_usage,
            },
            MessageDelta(stop_reason=resp.stop_reason, usage=delta_usage),
        )
    )
    events.append(WireEvent("message_stop", {"type": "message_stop"}, MessageStop()))
    return events


def final_message(
    resp: StreamedResponse, model: str, *, input_tokens: int = 0, message_id: str = "msg_scripted"
) -> dict[str, Any]:
    """The non-streamed ``Message`` body for ``resp`` (a ``stream: false`` request)."""
    content: list[dict[str, Any]] = []
    for b in resp.blocks:
        if isinstance(b, RawToolJsonBlock):
            try:
                parsed = json.loads(b.json)
            except ValueError:
                parsed = {}
            content.append(
                {
                    "type": "tool_use",
                    "id": b.id,
                    "name": b.name,
                    "input": parsed if isinstance(parsed, dict) else {},
                }
            )
        else:
            content.append(b.to_dict())
    usage = dict(resp.usage or {})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": resp.stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("input_tokens", input_tokens),
            "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0),
            "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
            "output_tokens": usage.get("output_tokens", _estimate_output_tokens(resp.blocks)),
        },
    }
