"""What happened when, read from an input's records: model requests, compactions, tool calls, hooks and
permission decisions, each as a span on one axis.

The auditor says which moves a run took and where; it does not time them. The records do: a Claude Code
transcript stamps every record (``api-request`` when a request left, one ``assistant`` record per
content block as it arrived, the ``tool_result`` when a tool finished), stream-json stamps its lines,
and an agentfsm session file orders its records. So the axis is milliseconds from the first stamped
record where the input has stamps, and the line number where it has none (an agentfsm session file):
the order is always true, durations only where they were recorded.

Everything here reads records and nothing decides; an input this does not understand gives fewer spans,
never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

REQUEST, COMPACTION, TOOL, HOOK, CHILD = "request", "compaction", "tool", "hook", "child"
MS, LINES = "ms", "line"


@attrs.frozen
class Span:
    """One thing that took time. ``start``/``end`` on the timeline's axis; ``first`` the first token of a
    model response (requests only); ``status``: ok, error, denied, failed (no response), interrupted
    (no result); ``child``: the key of the child run a tool call started (a subagent)."""

    kind: str
    label: str
    start: float
    end: float
    line: int
    status: str = "ok"
    first: float | None = None
    detail: str = ""
    end_line: int | None = None
    child: str | None = None
    lane: int = 0


@attrs.frozen
class Timeline:
    unit: str  # MS or LINES
    origin: float  # what 0 on the axis is: epoch milliseconds of the first stamp (0 for lines)
    spans: tuple[Span, ...]
    at_line: Mapping[int, float]  # where each record line sits on the axis
    start: float
    end: float
    lanes: Mapping[str, int]  # how many lanes each kind needs (concurrent spans on separate lanes)

    def at(self, line: int) -> float:
        """The axis position of ``line`` (the nearest stamped record at or before it)."""
        best = self.start
        for ln in sorted(self.at_line):
            if ln > line:
                break
            best = self.at_line[ln]
        return best


def _stamp(rec: Mapping[str, Any]) -> float | None:
    ts = rec.get("timestamp")
    if isinstance(ts, str):
        try:
            return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000.0
        except ValueError:
            return None
    return None


def _message(rec: Mapping[str, Any]) -> Mapping[str, Any]:
    msg = rec.get("message")
    return msg if isinstance(msg, Mapping) else {}


def blocks(rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The content blocks a record carries, whichever source wrote it."""
    kind = rec.get("type")
    if kind == "assistant_block":
        content: Any = [rec.get("block")]
    elif kind == "message":
        content = rec.get("content")
    else:
        content = _message(rec).get("content")
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _short(value: Any, limit: int = 90) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_summary(block: Mapping[str, Any]) -> str:
    """``Read a.txt`` — a tool call in a few words (file names, not absolute paths)."""
    name = str(block.get("name", "?"))
    inp = block.get("input")
    if not isinstance(inp, Mapping):
        return name
    for key in ("file_path", "path", "pattern", "command", "description", "url", "query"):
        if isinstance(inp.get(key), str):
            value = inp[key]
            if key in ("file_path", "path"):
                value = value.rstrip("/").rsplit("/", 1)[-1] or value
            return f"{name} {_short(value, 48)}"
    return name


def _usage_text(usage: Mapping[str, Any]) -> str:
    parts = []
    for key, short in (("input_tokens", "in"), ("cache_read_input_tokens", "cache read"),
                       ("cache_creation_input_tokens", "cache write"), ("output_tokens", "out")):
        if isinstance(usage.get(key), int) and (usage[key] or key in ("input_tokens", "output_tokens")):
            parts.append(f"{short} {usage[key]:,}")
    return " · ".join(parts)


class _Builder:
    def __init__(self, records: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        self.records = records
        stamps = [(line, _stamp(rec)) for line, rec in records]
        stamped = [(line, t) for line, t in stamps if t is not None]
        # an input with stamps on most records is timed; otherwise lines are the axis
        self.unit = MS if stamped and len(stamped) * 2 >= len(records) else LINES
        self.origin = min((t for _, t in stamped), default=0.0) if self.unit == MS else 0.0
        self.at_line: dict[int, float] = {}
        last = 0.0
        for line, t in stamps:
            if self.unit == MS:
                last = (t - self.origin) if t is not None else last
            else:
                last = float(line)
            self.at_line[line] = last
        self.spans: list[Span] = []

    def pos(self, line: int) -> float:
        return self.at_line.get(line, 0.0)

    def run(self, child_of: Mapping[str, str]) -> Timeline:
        self._requests()
        self._compactions()
        self._tools(child_of)
        self._hooks()
        self._explain_failures()
        spans = _lanes(sorted(self.spans, key=lambda s: (s.start, s.line)))
        lanes: dict[str, int] = {}
        for s in spans:
            lanes[s.kind] = max(lanes.get(s.kind, 0), s.lane + 1)
        values = list(self.at_line.values()) or [0.0]
        end = max([*values, *(s.end for s in spans)])
        return Timeline(self.unit, self.origin, tuple(spans), dict(self.at_line), min(values), end, lanes)

    # model requests

    def _requests(self) -> None:
        responses: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
        by_message: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
        requests: list[tuple[int, Mapping[str, Any]]] = []
        for line, rec in self.records:
            kind = rec.get("type")
            if kind == "api-request":
                requests.append((line, rec))
            elif kind == "assistant" and not rec.get("parent_tool_use_id"):
                ref = rec.get("requestRef")
                if isinstance(ref, str):
                    responses.setdefault(ref, []).append((line, rec))
                else:
                    mid = str(_message(rec).get("id") or rec.get("request_id") or line)
                    by_message.setdefault(mid, []).append((line, rec))
            elif kind == "request":  # an agentfsm session file
                requests.append((line, rec))
        if requests and requests[0][1].get("type") == "request":
            self._agentfsm_requests(requests)
            return
        for n, (line, rec) in enumerate(requests, 1):
            got = responses.get(str(rec.get("id")), [])
            source = rec.get("querySource")
            label = f"request {n}" + (f" ({source})" if source not in (None, "sdk", "repl_main_thread") else "")
            self._response(label, line, got)
        for n, got in enumerate(by_message.values(), 1):  # stream-json: a response is its lines
            self._response(f"response {n}", got[0][0], got)

    def _response(self, label: str, line: int, got: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        start = self.pos(line)
        if not got:
            self.spans.append(Span(REQUEST, label, start, start, line, "failed",
                                   detail="no response recorded (an error answered it)"))
            return
        first, last = got[0], got[-1]
        msg = _message(last[1])
        usage = msg.get("usage") if isinstance(msg.get("usage"), Mapping) else {}
        stop = msg.get("stop_reason")
        synthetic = msg.get("model") == "<synthetic>" or last[1].get("isApiErrorMessage")
        texts = [b.get("text", "") for _, r in got for b in blocks(r) if b.get("type") == "text"]
        parts = [f"stop {stop}" if stop else "", _usage_text(usage or {})]
        if texts and texts[0]:
            parts.append(f"“{_short(texts[0], 70)}”")
        self.spans.append(Span(REQUEST, label, start, self.pos(last[0]), line, "error" if synthetic else "ok",
                               first=self.pos(first[0]), detail=" · ".join(p for p in parts if p),
                               end_line=last[0]))

    def _agentfsm_requests(self, requests: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        lines = [line for line, _ in self.records]
        for n, (line, rec) in enumerate(requests, 1):
            nxt = next((ln for ln, _ in requests if ln > line), lines[-1] + 1)
            answer = [(ln, r) for ln, r in self.records if line < ln < nxt and (
                r.get("type") == "assistant_block" or (r.get("type") == "message" and r.get("role") == "assistant"))]
            end = answer[-1][0] if answer else line
            self.spans.append(Span(REQUEST, f"request {n}", float(line), float(end), line,
                                   "ok" if answer else "failed", first=float(answer[0][0]) if answer else None,
                                   detail=f"model {rec.get('model')} · {rec.get('messages')} messages",
                                   end_line=end))

    def _compactions(self) -> None:
        for line, rec in self.records:
            if rec.get("type") == "compact_boundary" or (rec.get("type") == "system"
                                                         and rec.get("subtype") == "compact_boundary"):
                meta = rec.get("compactMetadata") or rec.get("compact_metadata") or {}
                meta = meta if isinstance(meta, Mapping) else {}
                end = self.pos(line)
                took = meta.get("durationMs")
                start = end - float(took) if self.unit == MS and isinstance(took, (int, float)) else end
                pre = meta.get("preTokens", meta.get("pre_tokens", rec.get("pre_tokens")))
                post = meta.get("postTokens", meta.get("post_tokens"))
                trig = meta.get("trigger", rec.get("trigger"))
                tokens = f"{pre:,} → {post:,} tokens" if isinstance(pre, int) and isinstance(post, int) else (
                    f"{pre:,} tokens before" if isinstance(pre, int) else "")
                detail = " · ".join(p for p in (f"trigger {trig}" if trig else "", tokens) if p)
                self.spans.append(Span(COMPACTION, "compaction request", start, end, line, detail=detail))

    def _explain_failures(self) -> None:
        """A request without a response that a compaction follows (before the next request) was refused
        for its size: say so where the bar is."""
        requests = sorted((s for s in self.spans if s.kind == REQUEST), key=lambda s: s.line)
        compactions = [s for s in self.spans if s.kind == COMPACTION]
        for i, s in enumerate(requests):
            if s.status != "failed":
                continue
            nxt = requests[i + 1].line if i + 1 < len(requests) else 1 << 62
            if any(s.line < c.line < nxt for c in compactions):
                at = self.spans.index(s)
                self.spans[at] = attrs.evolve(s, detail="no response: a compaction followed (the prompt was too long)")

    # tools

    def _tools(self, child_of: Mapping[str, str]) -> None:
        uses: dict[str, tuple[int, Mapping[str, Any]]] = {}
        results: dict[str, tuple[int, Mapping[str, Any], Mapping[str, Any]]] = {}
        for line, rec in self.records:
            if rec.get("parent_tool_use_id"):
                continue  # a subagent's own lines (stream-json): its run, not this one's
            for b in blocks(rec):
                if b.get("type") == "tool_use" and isinstance(b.get("id"), str):
                    uses.setdefault(b["id"], (line, b))
                elif b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str):
                    results.setdefault(b["tool_use_id"], (line, rec, b))
        for use_id, (line, block) in uses.items():
            got = results.get(use_id)
            start = self.pos(line)
            label = tool_summary(block)
            if got is None:
                self.spans.append(Span(TOOL, label, start, start, line, "interrupted",
                                       detail="no result recorded (interrupted or cut off)"))
                continue
            rline, rec, result = got
            status, notes = "ok", []
            decision = rec.get("permissionDecision")
            if isinstance(decision, Mapping):
                notes.append(f"permission {decision.get('decision')} ({decision.get('source', '?')})")
                if decision.get("decision") in ("reject", "deny"):
                    status = "denied"
            if rec.get("toolDenialKind"):
                status = "denied"
                notes.append(f"denied: {rec['toolDenialKind']}")
            if status == "ok" and result.get("is_error"):
                status = "error"
            content = result.get("content")
            text = content if isinstance(content, str) else " ".join(
                str(c.get("text", "")) for c in content if isinstance(c, Mapping)) if isinstance(content, list) else ""
            if text:
                notes.append(f"“{_short(text, 110)}”")
            tur = rec.get("toolUseResult")
            if isinstance(tur, Mapping) and isinstance(tur.get("totalDurationMs"), int):
                notes.append(f"{tur['totalDurationMs']} ms")
            self.spans.append(Span(TOOL, label, start, self.pos(rline), line, status, detail=" · ".join(notes),
                                   end_line=rline, child=child_of.get(use_id)))

    def _hooks(self) -> None:
        for line, rec in self.records:
            infos: list[Mapping[str, Any]] = []
            name = ""
            att = rec.get("attachment")
            if isinstance(att, Mapping) and str(att.get("type", "")).startswith("hook"):
                infos, name = [att], str(att.get("hookEvent") or att.get("hookName") or att.get("type"))
            elif rec.get("type") == "system" and str(rec.get("subtype", "")).endswith("hook_summary"):
                infos = [i for i in rec.get("hookInfos") or () if isinstance(i, Mapping)]
                name = str(rec.get("subtype")).replace("_summary", "").replace("_", " ")
            elif rec.get("type") == "system" and rec.get("subtype") in ("hook_response", "hook_started"):
                infos, name = [rec], str(rec.get("hook_event") or rec.get("hook_name") or "hook")
            for info in infos:
                end = self.pos(line)
                took = info.get("durationMs")
                start = end - float(took) if self.unit == MS and isinstance(took, (int, float)) else end
                cmd = str(info.get("command") or "")
                cmd = cmd.rsplit("/", 1)[-1] if cmd else ""
                prevented = rec.get("preventedContinuation")
                errors = rec.get("hookErrors") or ()
                status = "error" if errors or prevented else "ok"
                detail = " · ".join(p for p in (cmd, f"{took} ms" if took is not None else "",
                                                 "blocked" if errors else "", "prevented" if prevented else "") if p)
                self.spans.append(Span(HOOK, name or "hook", start, end, line, status, detail=detail))


def _lanes(spans: Sequence[Span]) -> list[Span]:
    """Spans of one kind that overlap in time go on separate lanes (greedy, by start), so concurrency
    shows as parallel bars."""
    out: list[Span] = []
    ends: dict[str, list[float]] = {}
    for s in spans:
        lanes = ends.setdefault(s.kind, [])
        for i, e in enumerate(lanes):
            if e <= s.start and not (e == s.start == s.end):
                lanes[i] = max(s.end, s.start + 1e-9)
                out.append(attrs.evolve(s, lane=i))
                break
        else:
            lanes.append(max(s.end, s.start + 1e-9))
            out.append(attrs.evolve(s, lane=len(lanes) - 1))
    return out


def timeline(records: Sequence[tuple[int, Mapping[str, Any]]], child_of: Mapping[str, str] | None = None
             ) -> Timeline:
    """The spans of ``records`` (numbered as :func:`agentfsm.auditing.checks.read_numbered` gives them).
    ``child_of``: tool_use id → key of the child run it started."""
    return _Builder(records).run(child_of or {})
