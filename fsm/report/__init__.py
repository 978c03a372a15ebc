"""``agentfsm audit --html OUT.html PATH…``: an audit as one self-contained page to look at.

Per run: the overview with the path taken, its counts and the audit's findings drawn on it (SVG from
Graphviz, :mod:`agentfsm.diagram`); a timeline of the moves, model requests (time to first token,
duration, tokens), compactions, tool calls (concurrent calls on parallel lanes, permission decisions,
denials), hooks, with child runs (subagents) nested under the call that started them; the moves, and
the state after each one with what it changed (click a move); every finding linked to its line, shown
in the page. Several inputs (or a directory) add an index with one row per run.

The page is rendered with Jinja2 from templates shipped as package data (``templates/``), its small
script and stylesheet inlined: nothing is fetched, so it opens from ``file://`` and can be mailed or
attached as it is. Jinja2 and pygraphviz are the ``report`` extra; without Jinja2 the command says
which extra to install, and without a Graphviz renderer the page is written with a note where the
graph would be.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from agentfsm.auditing.audit import NotATrace, trace_files
from agentfsm.common.progress import interrupted, steps
from agentfsm.diagram import dot as dot_views
from agentfsm.diagram.rendering import DiagramError, render, renderer
from agentfsm.diagram.views import KIND_COLOURS, LEGEND
from agentfsm.report.runs import Run, build, dumps, jsonable
from agentfsm.report.timeline import CHILD, COMPACTION, HOOK, LINES, MS, REQUEST, TOOL, Span, Timeline

__all__ = ["EXTRA", "ReportError", "build", "main", "render_page", "write_report"]

EXTRA = "pip install 'agentfsm[report]'"
LANE_NAMES = {REQUEST: "model", COMPACTION: "compaction", TOOL: "tools", HOOK: "hooks"}


class ReportError(RuntimeError):
    """The page cannot be written (a missing extra, an unreadable input)."""


def _environment() -> Any:
    try:
        import jinja2
    except ImportError as exc:
        raise ReportError(f"the HTML report needs Jinja2: {EXTRA}") from exc
    env = jinja2.Environment(loader=jinja2.PackageLoader("agentfsm.report", "templates"),
                             autoescape=jinja2.select_autoescape(default=True), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["dumps"] = dumps
    return env


def _asset(name: str) -> str:
    return resources.files("agentfsm.report").joinpath("templates", name).read_text(encoding="utf-8")


def _svg(run: Run) -> tuple[str, str]:
    """(svg, note): the overview with the run's path, or a note saying why there is no picture."""
    if run.path is None:
        return "", ""
    if renderer() is None:
        return "", f"graph not drawn: no Graphviz renderer; {EXTRA} (its pygraphviz wheel bundles Graphviz)"
    try:
        svg = render(dot_views.render_overview(run.path, header=run.title), "svg").decode("utf-8")
    except DiagramError as exc:
        return "", f"graph not drawn: {exc}"
    start = svg.find("<svg")
    return svg[start:], ""


# --- the timeline as rows of bars ------------------------------------------------------------------


def _fmt(value: float, unit: str) -> str:
    if unit == LINES:
        return f"line {value:.0f}"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def _bar(span: Span, x: Any, unit: str, key: str) -> dict[str, Any]:
    left, right = x(span.start), x(span.end)
    took = span.end - span.start
    parts = [span.label]
    if span.kind == REQUEST and span.first is not None and unit == MS:
        parts.append(f"first token after {_fmt(span.first - span.start, unit)}, {_fmt(took, unit)} in all")
    elif unit == MS and span.end > span.start:
        parts.append(_fmt(took, unit))
    if span.status != "ok":
        parts.append(span.status)
    if span.detail:
        parts.append(span.detail)
    # a bar too narrow for its name carries it beside it
    narrow = "" if right - left >= 0.75 * len(span.label) else " narrow-left" if left > 80 else " narrow"
    return {"left": left, "width": max(right - left, 0.0), "cls": f"{span.kind} {span.status}{narrow}",
            "first": (x(span.first) - left) if span.first is not None and span.end > span.start else None,
            "text": span.label, "title": " — ".join(parts), "line": span.line, "anchor": f"{key}-L{span.line}",
            "child": span.child}


def timeline_rows(run: Run) -> dict[str, Any]:
    """The timeline as rows of positioned bars (percentages of the axis), the run's children nested
    under it on the same axis where both are timed."""
    tl = run.timeline
    lo, hi = tl.start, max(tl.end, tl.start + 1)

    def x_of(origin_shift: float) -> Any:
        return lambda v: max(0.0, min(100.0, (v + origin_shift - lo) / (hi - lo) * 100.0))

    rows: list[dict[str, Any]] = []
    _run_rows(run, tl, x_of(0.0), rows, depth=0)
    for child in run.children:
        shift = child.timeline.origin - tl.origin if child.timeline.unit == tl.unit else 0.0
        rows.append({"label": f"↳ {child.name.rsplit(' › ', 1)[-1]}", "kind": CHILD, "bars": [], "depth": 1,
                     "ticks": [], "head": True, "key": child.key})
        _run_rows(child, child.timeline, x_of(shift), rows, depth=1)
    axis = [{"left": p, "text": _fmt(lo + (hi - lo) * p / 100, tl.unit)} for p in (0, 25, 50, 75, 100)]
    note = ("" if tl.unit == MS else
            "this input records no times: the axis is the line number, so the order is exact and lengths are not "
            "durations")
    return {"rows": rows, "axis": axis, "note": note}


def _run_rows(run: Run, tl: Timeline, x: Any, rows: list[dict[str, Any]], depth: int) -> None:
    if run.moves:
        ticks = [{"left": x(tl.at(m.line)), "n": m.n, "kind": m.kind, "colour": KIND_COLOURS.get(m.kind, "#8e44ad"),
                  "title": f"move {m.n}: {m.label} ({m.source} → {m.dest}), line {m.line}"} for m in run.moves]
        rows.append({"label": "moves", "kind": "moves", "bars": [], "ticks": ticks, "depth": depth, "key": run.key,
                     "head": False})
    for kind in (REQUEST, COMPACTION, TOOL, HOOK):
        n = tl.lanes.get(kind, 0)
        for lane in range(n):
            bars = [_bar(s, x, tl.unit, run.key) for s in tl.spans if s.kind == kind and s.lane == lane]
            label = LANE_NAMES[kind] + (f" {lane + 1}" if n > 1 else "")
            rows.append({"label": label, "kind": kind, "bars": bars, "ticks": [], "depth": depth, "key": run.key,
                         "head": False})


def span_rows(run: Run) -> list[dict[str, Any]]:
    """The timeline's spans as a table, in the order they started: what a screenshot (or a reader who
    does not hover) sees of each bar."""
    tl = run.timeline
    rows = []
    for s in sorted(tl.spans, key=lambda s: (s.start, s.line)):
        took = ""
        if tl.unit == MS:
            took = _fmt(s.end - s.start, MS) if s.end > s.start else ""
            if s.kind == REQUEST and s.first is not None:
                took = f"{_fmt(s.first - s.start, MS)} to first token, {_fmt(s.end - s.start, MS)}"
        rows.append({"at": _fmt(s.start, tl.unit), "took": took, "kind": LANE_NAMES.get(s.kind, s.kind),
                     "what": s.label, "status": s.status, "detail": s.detail, "line": s.line,
                     "anchor": f"{run.key}-L{s.line}", "child": s.child})
    return rows


# --- what happened, in words ---------------------------------------------------------------------


def story(run: Run) -> list[str]:
    """A few sentences a reviewer reads first: the path, the requests, the tools, how it ended and
    where the audit found something."""
    out = []
    spans = run.timeline.spans
    if run.report is not None and not run.moves:
        out.append("No moves of the loop: " + (run.state_note or "the auditor follows the main loop only") + ".")
    elif run.report is not None:
        rep = run.report
        kinds = Counter(m.kind for m in run.moves)
        reentries = Counter(m.label for m in run.moves if m.kind == "reentry")
        retries = Counter(m.label for m in run.moves if m.kind == "retry")
        said = [f"{len(run.moves)} moves"]
        if run.turns is not None:
            said.append(f"{run.turns} turn{'s' * (run.turns != 1)}")
        ended = next((m for m in reversed(run.moves) if m.dest == "stop"), None)
        end = (f"ended <b>{rep.terminal_reason}</b> (edge {ended.label})" if rep.terminal_reason and ended
               else "<b>did not reach stop</b>")
        out.append(f"{', '.join(said)}; {end}.")
        if reentries or retries:
            parts = [f"{label} ×{n}" for label, n in (reentries + retries).items()]
            out.append(f"Re-entered or retried: {', '.join(parts)}.")
        if kinds.get("undeclared"):
            out.append(f"<b>{kinds['undeclared']} move(s) the graph does not declare</b> (purple on the graph).")
    requests = [s for s in spans if s.kind == REQUEST]
    if requests:
        failed = [s for s in requests if s.status != "ok"]
        text = f"{len(requests)} model request{'s' * (len(requests) != 1)}"
        if failed:
            text += f", {len(failed)} without a normal response (" + "; ".join(
                f"<b>{s.label}</b>: {s.detail or s.status}" for s in failed) + ")"
        out.append(text + ".")
    for s in spans:
        if s.kind == COMPACTION:
            out.append(f"Compaction at line {s.line}" + (f": {s.detail}" if s.detail else "") + ".")
    tools = [s for s in spans if s.kind == TOOL]
    if tools:
        most = run.timeline.lanes.get(TOOL, 1)
        text = f"{len(tools)} tool call{'s' * (len(tools) != 1)}" + (f", up to {most} at once" if most > 1 else "")
        bad = [s for s in tools if s.status != "ok"]
        if bad:
            text += "; " + ", ".join(f"<b>{s.label}: {s.status}</b>" for s in bad)
        out.append(text + ".")
    if run.children:
        out.append(f"{len(run.children)} child run{'s' * (len(run.children) != 1)} (subagents), nested on the "
                   "timeline under the call that started them.")
    shown = [f for f in run.findings if f.severity in ("error", "warning")]
    if run.report is not None:
        if shown:
            first = shown[0]
            n_err = sum(f.is_error for f in shown)
            out.append(f"<b>The audit found {n_err} error{'s' * (n_err != 1)} and {len(shown) - n_err} "
                       f"warning{'s' * (len(shown) - n_err != 1)}</b>; the first at line {first.line} "
                       f"({first.code}).")
        else:
            remarks = len(run.findings)
            out.append("The audit found no errors or warnings" + (f" ({remarks} remark{'s' * (remarks != 1)})"
                                                                  if remarks else "") + ".")
    return out


# --- the page ------------------------------------------------------------------------------------


def _context(run: Run) -> dict[str, Any]:
    svg, note = _svg(run) if run.moves else ("", "")
    return {"run": run, "svg": svg, "svg_note": note, "timeline": timeline_rows(run), "story": story(run),
            "spans": span_rows(run),
            "data": jsonable(run), "children": [_context(c) for c in run.children]}


def render_page(runs: Sequence[Run], *, title: str = "agentfsm audit") -> str:
    env = _environment()
    template = env.get_template("report.html.j2")
    return str(template.render(title=title, runs=[_context(r) for r in runs], legend=LEGEND,
                               colours=KIND_COLOURS, script=_asset("report.js"), style=_asset("report.css")))


def _display_names(paths: Sequence[Path], given: Sequence[Path]) -> dict[Path, str]:
    """What the page calls each input: its path relative to the directory given, else its file name —
    never an absolute path (it would tell more of the machine than the run, and widen every title)."""
    names = {}
    for p in paths:
        name = p.name
        for g in given:
            if g.is_dir():
                try:
                    name = p.resolve().relative_to(g.resolve()).as_posix()
                    break
                except ValueError:
                    continue
        names[p] = name
    return names


def _children_files(files: Sequence[Path]) -> set[Path]:
    """Files that are a subagent transcript of another input here (``<session>/subagents/*.jsonl``): shown
    nested under their parent, not as runs of their own."""
    given = {f.resolve() for f in files}
    out = set()
    for f in files:
        if f.parent.name == "subagents" and (f.parent.parent.with_suffix(".jsonl")).resolve() in given:
            out.add(f)
    return out


def write_report(out: Path, inputs: Sequence[Path]) -> list[Run]:
    """Audit ``inputs`` (files or directories) and write the page to ``out``; returns the runs."""
    files = trace_files(list(inputs))
    nested = _children_files(files)
    files = [f for f in files if f not in nested]
    if not files:
        raise ReportError("no .jsonl inputs found in " + ", ".join(str(p) for p in inputs))
    names = _display_names(files, inputs)
    with steps(files, "auditing") as each:
        runs = [build(f, names[f], key=f"run{i}") for i, f in enumerate(each, 1)]
    title = "agentfsm audit — " + (names[files[0]] if len(files) == 1 else f"{len(files)} runs")
    out.write_text(render_page(runs, title=title), encoding="utf-8")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentfsm audit --html",
                                description="Write the audit of runs as one self-contained HTML page.")
    p.add_argument("--html", type=Path, required=True, metavar="OUT.html", help="the page to write")
    p.add_argument("traces", nargs="+", type=Path, metavar="PATH",
                   help="agentfsm session files, Claude Code transcripts or stream-json files, or directories")
    args = p.parse_args(argv)
    for given in args.traces:
        if not given.exists():
            print(f"agentfsm audit: {given}: no such file or directory", file=sys.stderr)
            return 2
    try:
        runs = write_report(args.html, args.traces)
    except (NotATrace, ReportError) as exc:
        print(f"agentfsm audit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the page is written in one go at the end: none was half written
        return interrupted("agentfsm audit", [f"{args.html} not written"])
    if renderer() is None:
        print(f"agentfsm audit: graphs not drawn (no Graphviz renderer): {EXTRA}", file=sys.stderr)
    errors = sum(r.report.errors for r in runs if r.report is not None)
    print(f"wrote {args.html} ({len(runs)} run{'s' * (len(runs) != 1)}, {errors} error{'s' * (errors != 1)})")
    return 1 if errors else 0
