"""One run as a Mermaid sequence diagram: the picture for an incident write-up.

Lanes: the user, the loop, the model, the tools and the hooks. Each request (compaction requests
included), each response (its blocks and stop reason), each tool call and its result (an interrupted
call too), each Stop-hook verdict, each re-entry or retry with its label, and how the run ended; paths
appear as their last part, never the machine's directories. Everything comes from the moves and the
events they decided on — an agentfsm trace records both; for a Claude Code run they are what the auditor
reconstructed — so the picture shows what the machine saw, in the graph's words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentfsm.diagram.views import STOP, RunPath, Taken
from agentfsm.machine.graph import EDGES_BY_TRIGGER

PARTICIPANTS = (("U", "User"), ("L", "Loop"), ("M", "Model"), ("T", "Tools"), ("H", "Hooks"))
_UNSAFE = re.compile(r'[;#\n\r<>{}"]')
MAX_TEXT = 80


# an absolute path: what the picture shows of it is its last part (a hook script's name, a file's), never
# the machine's directories
_ABSOLUTE = re.compile(r"(?<![\w.~:/-])(?:~|[A-Za-z]:)?(?:/[\w.@+~-]+)+/([\w.@+~-]+)")


def _t(text: Any, limit: int = MAX_TEXT) -> str:
    """Message text Mermaid reads as plain text: no statement separators, entities or markup, and no
    absolute paths (their last part only)."""
    clean = _ABSOLUTE.sub(r"\1", str(text))
    clean = _UNSAFE.sub(" ", clean).replace("%%", "%").strip()
    clean = re.sub(r"\s+", " ", clean)
    return clean if len(clean) <= limit else clean[:limit - 1] + "…"


def _blocks(event: Mapping[str, Any] | None, key: str) -> list[Mapping[str, Any]]:
    if not event:
        return []
    value = event.get(key)
    if isinstance(value, Mapping):
        blocks = value.get("blocks", value.get("content", []))
        return [b for b in blocks if isinstance(b, Mapping)] if isinstance(blocks, list) else []
    return []


def _cut_calls(event: Mapping[str, Any] | None) -> list[Any]:
    """The calls an interrupt cut short. Today's Aborted record carries the facts (``shown``: the
    response's blocks, ``finished``: the results that had finished), and the abort route pairs the
    calls without a finished result; a record of an earlier release carried the pairing itself
    (``partial_results``: the result the loop wrote for each call)."""
    if not event:
        return []
    if "shown" in event or "finished" in event:
        finished = event.get("finished") or ()
        done = {b.get("tool_use_id") for b in finished if isinstance(b, Mapping)}
        shown = event.get("shown") or ()
        return [b.get("id") for b in shown
                if isinstance(b, Mapping) and b.get("type") == "tool_use" and b.get("id") not in done]
    return [b.get("tool_use_id") for b in _blocks(event, "partial_results") if b.get("type") == "tool_result"]


def _response(event: Mapping[str, Any] | None) -> str:
    blocks = _blocks(event, "response")
    kinds: list[str] = []
    for b in blocks:
        kind = str(b.get("type"))
        kinds.append(f"tool_use {b.get('name')}" if kind == "tool_use" else kind)
    counted: dict[str, int] = {}
    for k in kinds:
        counted[k] = counted.get(k, 0) + 1
    body = ", ".join(f"{k} ×{n}" if n > 1 else k for k, n in counted.items()) or "no content"
    response = event.get("response") if event else None
    stop = response.get("stop_reason") if isinstance(response, Mapping) else None
    return f"{body} · stop_reason {stop}" if stop else body


def _short(tool_id: Any) -> str:
    text = str(tool_id)
    return text if len(text) <= 26 else "…" + text[-20:]


def render(path: RunPath) -> str:
    """The run as ``sequenceDiagram`` text (Mermaid)."""
    out = ["sequenceDiagram", f"    %% {_t(path.title(), 400)}"]
    out += [f"    participant {short} as {name}" for short, name in PARTICIPANTS]
    internal = sorted(path.internal)
    steps = list(path.steps)
    requests = 0
    for i, step in enumerate(steps):
        while internal and step.line and internal[0][0] < step.line:
            _line, action, detail = internal.pop(0)
            out.append(f"    Note over L,M: {_t(action.replace('_', ' '))} {_t(detail)} (inside call_model)")
        prev = steps[i - 1] if i else None
        if step.source == "assemble" and (prev is None or _ended(prev, step)):  # a run's first move
            out.append("    U->>L: prompt")
        requests = _step(out, step, requests)
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if step.dest == STOP and (nxt is None or nxt.source != STOP):
            reason = step.reason or next((s.reason for s in reversed(steps[:i + 1]) if s.reason), None)
            out.append(f"    L-->>U: result · {_t(reason or 'unknown')}")
    for _line, action, detail in internal:
        out.append(f"    Note over L,M: {_t(action.replace('_', ' '))} {_t(detail)} (inside call_model)")
    return "\n".join(out) + "\n"


def _ended(prev: Taken, step: Taken) -> bool:
    return prev.dest == STOP and step.source != STOP


def _note(out: list[str], step: Taken, over: str = "L") -> None:
    kind = EDGES_BY_TRIGGER[step.label].kind if step.label in EDGES_BY_TRIGGER else "undeclared"
    marks = {"reentry": "↻ ", "retry": "⟳ ", "terminal": "■ "}
    reason = f" · {step.reason}" if step.reason else ""
    out.append(f"    Note over {over}: {marks.get(kind, '')}{_t(step.label + reason)}")


def _step(out: list[str], step: Taken, requests: int) -> int:
    """The lines one move adds; returns the number of requests so far."""
    event = step.event
    kind = str(event.get("type")) if event else ""
    if not step.declared:
        out.append(f"    Note over L: ⚠ {_t(step.label)} UNDECLARED ({step.source} → {step.dest})")
        return requests
    if step.label == "call":
        compaction = event.get("compaction") if event else None
        if isinstance(compaction, Mapping):
            # a compaction is a request of its own (the conversation summarised): drawn as one
            out.append(f"    L->>M: compaction request ({_t(compaction.get('trigger', 'auto'))})")
            out.append("    M-->>L: summary · context compacted")
        requests += 1
        out.append(f"    L->>M: request {requests}")
        return requests
    if step.label == "open_stream":
        return requests
    if kind == "StreamEnded":
        out.append(f"    M-->>L: {_t(_response(event))}")
        if step.label == "dispatch":
            for b in _blocks(event, "response"):
                if b.get("type") == "tool_use":
                    out.append(f"    L->>T: {_t(b.get('name'))} {_t(_short(b.get('id')))}")
            return requests
        _note(out, step, "L,M")
        return requests
    if kind == "ToolsDrained" and step.label == "collect":
        for b in _blocks(event, "results"):
            if b.get("type") == "tool_result":
                err = " (error)" if b.get("is_error") else ""
                out.append(f"    T-->>L: result {_t(_short(b.get('tool_use_id')))}{err}")
        return requests
    if kind == "CallFailed":
        error = event.get("error") if event else None
        if isinstance(error, Mapping):
            status = f" {error.get('status')}" if error.get("status") else ""
            message = f"{error.get('kind')} error{status}"
            out.append(f"    M--xL: {_t(message)}")
        if step.label == "reactive_compact_retry":
            # the conversation is summarised by a request of its own before the loop asks again
            out.append("    L->>M: compaction request (the prompt was too long)")
            out.append("    M-->>L: summary · context compacted")
        _note(out, step, "L,M")
        if EDGES_BY_TRIGGER[step.label].kind == "retry":
            requests += 1
            out.append(f"    L->>M: request {requests} (the same again)")
        return requests
    if kind == "StopHookVerdict":
        out.append("    L->>H: Stop hooks")
        if event and event.get("blocked"):
            out.append(f"    H-->>L: block · {_t(event.get('reason') or '')}")
        elif event and event.get("prevented"):
            out.append(f"    H-->>L: continue false · {_t(event.get('stop_reason') or '')}")
        elif event and event.get("context"):
            out.append(f"    H-->>L: context · {_t(' / '.join(map(str, event['context'])))}")
        else:
            out.append("    H-->>L: pass")
        _note(out, step)
        return requests
    if kind == "Aborted":
        out.append("    U--xL: interrupt")
        for use_id in _cut_calls(event):
            out.append(f"    T--xL: interrupted {_t(_short(use_id))}")
    _note(out, step)
    return requests

