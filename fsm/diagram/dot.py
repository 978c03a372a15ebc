"""The views in Graphviz DOT.

The overview (and a run drawn over it) carries its own layout (:mod:`agentfsm.diagram.layout`): every
position is in the file and the ``nop2`` engine draws it as it is (``layout=nop2`` in the graph, so
``dot -Tsvg`` honours it too). The recovery and terminal views are laid out by ``dot``.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence

from agentfsm.diagram import layout as lay
from agentfsm.diagram.views import (
    CLUSTER_LINE,
    COMPOSITE,
    DASHED_KINDS,
    GREY,
    GREY_TEXT,
    KIND_COLOURS,
    LEGEND,
    NODE_FILL,
    NODE_LINE,
    NODE_TEXT,
    STOP,
    STOP_FILL,
    STOP_LINE,
    UNDECLARED,
    Group,
    Panel,
    RouteRow,
    RunPath,
    lines_text,
    overview_groups,
    phases,
    recovery_panels,
    running_phases,
    terminal_rows,
)

FONT = "Helvetica"
Line = tuple[str, str, bool]  # text, colour, bold
Point = Callable[[float, float], str]  # layout coordinates (y down) to a DOT position (y up)
ARROW = 8.0  # the length of an arrowhead at arrowsize 0.8


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _html_lines(lines: Sequence[Line], align: str, size: float) -> str:
    br = {"l": '<br align="left"/>', "r": '<br align="right"/>'}.get(align, "<br/>")
    parts = []
    for text, colour, bold in lines:
        t = html.escape(text, quote=False)
        t = f"<b>{t}</b>" if bold else t
        parts.append(f'<font color="{colour}" point-size="{size:g}">{t}</font>{br}')
    return "<" + "".join(parts) + ">"


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


# --- the overview -----------------------------------------------------------------------------------


def _group_lines(g: Group, path: RunPath | None) -> list[Line]:
    colour = KIND_COLOURS[g.kind]
    if path is None:
        return [(t, colour, False) for t in g.triggers]
    out: list[Line] = []
    for t in g.triggers:
        order = path.taken_along(t, g)
        out.append((f"{t} ×{len(order)} · {lines_text(path, order)}", colour, True) if order
                   else (t, GREY_TEXT, False))
    return out


def _undeclared(path: RunPath) -> list[tuple[int, str, str, str, list[Line]]]:
    return [(order[0], label, source, dest, [(f"{label} ×{len(order)} UNDECLARED", UNDECLARED, True),
                                            (lines_text(path, order), UNDECLARED, False)])
            for (label, source, dest), order in path.undeclared_moves().items()]


def overview_layout(path: RunPath | None = None) -> tuple[lay.Layout, dict[tuple[str, str, str], list[Line]]]:
    groups = overview_groups()
    lines = {(g.source, g.dest, g.kind): _group_lines(g, path) for g in groups}
    extra = _undeclared(path) if path is not None else []
    title = _title(path)
    layout = lay.overview(groups, phases(), running_phases(),
                          {k: [(t, bold) for t, _, bold in v] for k, v in lines.items()}, title,
                          [(n, t, s, d, [(x, bold) for x, _, bold in ls]) for n, t, s, d, ls in extra])
    for n, t, _s, _d, ls in extra:
        lines[("undeclared", str(n), t)] = ls
    return layout, lines


def render_overview(path: RunPath | None = None, *, header: str = "") -> str:
    """The overview in DOT, laid out; with ``path``, one run drawn over it: edges taken thick, with how
    often and at which steps, the rest grey; undeclared moves in purple."""
    layout, lines = overview_layout(path)
    height = layout.height

    def pt(x: float, y: float) -> str:
        return f"{_num(x)},{_num(height - y)}"

    visited = path.visited() if path is not None else None
    flagged = path.findings_at() if path is not None else {}
    out = [f"// {header}" if header else "// agentfsm overview",
           "// render as it is: the positions are in the file (layout=nop2), e.g. dot -Tsvg or neato -n2 -Tsvg",
           "digraph overview {",
           f'  graph [layout=nop2, bb="0,0,{_num(layout.width)},{_num(height)}", fontname={FONT}, '
           'outputorder=edgesfirst, pad=0.1];',
           f'  node [fontname={FONT}, fontsize={lay.FONT_NODE:g}, fixedsize=true, style="rounded,filled", '
           f'fillcolor="{NODE_FILL}", color="{NODE_LINE}", fontcolor="{NODE_TEXT}", shape=box, penwidth=1.3];',
           f"  edge [fontname={FONT}, fontsize={lay.FONT_EDGE:g}, arrowsize=0.8];"]
    x0, y0, x1, y1 = layout.cluster
    cx, cy = layout.cluster_label
    out.append(f'  subgraph cluster_running {{ graph [bb="{_num(x0)},{_num(height - y1)},{_num(x1)},'
               f'{_num(height - y0)}", label="{COMPOSITE}", lp="{pt(cx + lay.text_width(COMPOSITE, 13) / 2, cy + 9)}", '
               f'fontsize=13, fontcolor="{CLUSTER_LINE}", style="rounded,dashed", color="{CLUSTER_LINE}"];')
    running = set(running_phases())
    for name, b in layout.boxes.items():
        if name in running:
            out.append("    " + _node(name, b, pt, visited, flagged.get(name, ())))
    out.append("  }")
    for name, b in layout.boxes.items():
        if name not in running:
            out.append("  " + _node(name, b, pt, visited, flagged.get(name, ())))
    t = layout.title
    found = path.findings_text() if path is not None else ""
    alarm = STOP_LINE if path is not None and any(f[1] == "error" for f in path.findings) else "#d35400"
    title_lines: list[Line] = [(text, "#1b2a41" if i == 0 else alarm if found and text == found else "#566573",
                                i == 0 or bool(found and text == found)) for i, text in enumerate(_title(path))]
    out.append(f'  title [shape=plaintext, style="", width={_num(t.w / 72)}, height={_num(t.h / 72)}, '
               f'pos="{pt(*t.centre)}", label={_html_lines(title_lines, "c", lay.FONT_TITLE)}];')
    for a in layout.arrows:
        out.append("  " + _arrow(a, lines, path, pt, layout))
    out.append("}")
    return "\n".join(out) + "\n"


def _title(path: RunPath | None) -> list[str]:
    if path is None:
        return ["agentfsm agent loop — overview", LEGEND]
    found = path.findings_text()
    return [path.title(), *([found] if found else []), LEGEND]


def _node(name: str, b: lay.Box, pt: Point, visited: frozenset[str] | None,
          found: Sequence[tuple[int, str, str]] = ()) -> str:
    attrs_ = [f"label={_q(name)}", f'pos="{pt(b.x, b.y)}"', f"width={_num(b.w / 72)}", f"height={_num(b.h / 72)}"]
    if name == STOP:
        attrs_ += ["shape=doublecircle", f'fillcolor="{STOP_FILL}"', f'color="{STOP_LINE}"']
    if visited is not None and name not in visited:
        attrs_.append(f'fillcolor="#f4f4f4", color="{GREY}", fontcolor="{GREY_TEXT}"')
    if found:
        # a phase where the audit found something: outlined (red for an error, amber for a warning), and
        # the lines in its tooltip (the HTML report links them)
        error = any(sev == "error" for _, sev, _ in found)
        tip = "; ".join(f"line {line}: {sev} {code}" for line, sev, code in found)
        attrs_ += [f'color="{STOP_LINE if error else "#e67e22"}"', "penwidth=3.5", f"tooltip={_q(tip)}"]
    return f"{name} [{', '.join(attrs_)}];"


def _arrow(a: lay.Arrow, lines: Mapping[tuple[str, str, str], list[Line]], path: RunPath | None, pt: Point,
           layout: lay.Layout) -> str:
    key = a.key
    if key[0] == "undeclared":
        colour, style, width = UNDECLARED, "bold", 2.6
        # its DOT endpoints are the boxes its ends touch
        tail, head = _nearest(a.points[0], layout), _nearest(a.points[-1], layout)
    else:
        source, dest, kind = key
        taken = path is None or any(bold for _, _, bold in lines[key])
        colour = KIND_COLOURS[kind] if taken else GREY
        style = "dashed" if kind in DASHED_KINDS else "solid"
        width = 1.4 if path is None else (2.6 if taken else 1.0)
        # the composite state's arrow leaves from its last phase, as far as DOT's endpoints go
        tail, head = (running_phases()[-1] if source == COMPOSITE else source), dest
    spline = _spline(a.points)
    attrs_ = [f'pos="e,{pt(*a.points[-1])} {" ".join(pt(x, y) for x, y in spline)}"', f'color="{colour}"',
              f"style={style}", f"penwidth={width:g}"]
    if a.label is not None and lines.get(key):
        attrs_.append(f"label={_html_lines(lines[key], a.label.align, lay.FONT_EDGE)}")
        attrs_.append(f'lp="{pt(*a.label.centre)}"')
    return f"{tail} -> {head} [{', '.join(attrs_)}];"


def _nearest(p: tuple[float, float], layout: lay.Layout) -> str:
    return min(layout.boxes.values(), key=lambda b: (b.x - p[0]) ** 2 + (b.y - p[1]) ** 2).name


def _spline(points: Sequence[tuple[float, float]], *, head: bool = True) -> list[tuple[float, float]]:
    """Bezier control points for a polyline with rounded corners, stopping short of the arrowhead."""
    pts = list(points)
    if head:
        (xa, ya), (xb, yb) = pts[-2], pts[-1]
        d = max(((xb - xa) ** 2 + (yb - ya) ** 2) ** 0.5, 1e-6)
        pts[-1] = (xb - (xb - xa) / d * ARROW, yb - (yb - ya) / d * ARROW)
    out = [pts[0]]
    cur = pts[0]
    for i in range(1, len(pts)):
        p = pts[i]
        if i < len(pts) - 1:
            # round the corner at p: a straight run up to it, a curve around it
            nx, ny = pts[i + 1]
            r = min(lay.CORNER, _dist(cur, p) / 2, _dist(p, (nx, ny)) / 2)
            before = _towards(p, cur, r)
            after = _towards(p, (nx, ny), r)
            out += [*_straight(cur, before), p, p, after]
            cur = after
        else:
            out += _straight(cur, p)
            cur = p
    return out


def _dist(a: tuple[float, float], b: tuple[float, float]) -> float:
    return float(((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2) ** 0.5)


def _towards(p: tuple[float, float], q: tuple[float, float], r: float) -> tuple[float, float]:
    d = _dist(p, q) or 1.0
    return p[0] + (q[0] - p[0]) / d * r, p[1] + (q[1] - p[1]) / d * r


def _straight(a: tuple[float, float], b: tuple[float, float]) -> list[tuple[float, float]]:
    return [(a[0] + (b[0] - a[0]) / 3, a[1] + (b[1] - a[1]) / 3),
            (a[0] + 2 * (b[0] - a[0]) / 3, a[1] + 2 * (b[1] - a[1]) / 3), b]


# --- the recovery view ------------------------------------------------------------------------------


def _wrap_guard(guard: str) -> list[str]:
    """A long guard on several lines, split at its ``and``s."""
    parts = guard.split(" and ")
    return [parts[0]] + [f"and {p}" for p in parts[1:]]


def _event_doc(event: str) -> str:
    """The first sentence of an event's docstring: what the panel's event means."""
    from agentfsm.machine import events

    doc = " ".join((getattr(events, event, None).__doc__ or "").split())
    first = doc.split(". ", 1)[0].split(" ``", 1)[0].rstrip(".")
    return first.replace("``", "")


def _cell(text: str, colour: str, *, bold: bool = False, size: float = lay.FONT_ROUTE) -> str:
    t = html.escape(text, quote=False)
    return f'<font color="{colour}" point-size="{size:g}">{f"<b>{t}</b>" if bold else t}</font>'


def _guard_lines(r: RouteRow) -> list[str]:
    if not r.guard:
        return ["otherwise"]
    parts = _wrap_guard(r.guard)
    parts[0] = "[" + parts[0]
    parts[-1] = parts[-1] + "]"
    return [g if j == 0 else f"  {g}" for j, g in enumerate(parts)]


def _panel_lines(panel: Panel) -> list[tuple[str, float, bool]]:
    """Every line of a panel with its size and weight: what its width is estimated from."""
    out = [(f"{' and '.join(panel.sources)} — on {panel.event}", 14.0, True),
           (_event_doc(panel.event), lay.FONT_ROUTE, False)]
    for r in panel.rows:
        out += [(g, lay.FONT_ROUTE, False) for g in _guard_lines(r)]
        out.append((f"→ {r.edge}  to {r.dest}", lay.FONT_ROUTE, True))
        out += [(f"  {c}", lay.FONT_ROUTE, False) for c in r.counts]
    return out


def _panel(panel: Panel, width: int) -> str:
    """One family as an HTML-like table: a heading, then one row per route — its number (the order the
    machine tries them), its guard, and the edge it takes with where that leads. ``width``: of the
    text column, the same in every panel so they line up."""
    head = (f'<tr><td colspan="2" align="left" balign="left" bgcolor="{NODE_FILL}" cellpadding="6">'
            + _cell(f"{' and '.join(panel.sources)} — on {panel.event}", NODE_TEXT, bold=True, size=14)
            + '<br align="left"/>' + _cell(_event_doc(panel.event), "#566573") + '<br align="left"/></td></tr>')
    rows = []
    for r in panel.rows:
        lines = '<br align="left"/>'.join(_cell(g, "#566573") for g in _guard_lines(r))
        colour = KIND_COLOURS[r.kind] if r.kind != "terminal" else STOP_LINE
        took = _cell(f"→ {r.edge}", colour, bold=True) + _cell(f"  to {r.dest}", NODE_TEXT)
        # what the edge counts, from the counters' declarations: one line per counter it raises
        took += "".join('<br align="left"/>' + _cell(f"  {c}", "#566573") for c in r.counts)
        rows.append(f'<tr><td align="right" valign="top" width="22">{_cell(str(r.rank), NODE_TEXT, bold=True)}</td>'
                    f'<td align="left" balign="left" width="{width}">{lines}<br align="left"/>{took}'
                    '<br align="left"/></td></tr>')
    return (f'<<table border="1" cellborder="0" cellspacing="0" cellpadding="3" color="{CLUSTER_LINE}" '
            f'style="rounded">{head}{"".join(rows)}</table>>')


def render_recovery() -> str:
    """Every route out of call_model and stream, one panel per event (the failure families, and the
    events that lead on), each listing its routes in the order the machine tries them: the first whose
    guard holds fires. A phase whose routes for an event are the same as another's shares its panel, so
    nothing is drawn twice; destinations are named in the rows, so no arrow crosses another. The panels
    stack in one column, narrow enough to read at page width."""
    panels = recovery_panels()
    out = ["// agentfsm recovery view: every route out of call_model and stream (agentfsm.machine.graph.ROUTES), "
           "one panel per event",
           "digraph recovery {",
           f'  graph [fontname={FONT}, pad=0.2, nodesep=0.2, ranksep=0.18, labelloc=t, fontsize={lay.FONT_TITLE:g}, '
           f'fontcolor="{NODE_TEXT}", label=<<b>agentfsm — how call_model and stream decide</b><br/>'
           f'<font point-size="{lay.FONT_ROUTE:g}" color="#566573">one panel per event: its routes are tried in the '
           "order numbered; the first whose guard holds fires</font>>];",
           f"  node [fontname={FONT}, shape=plaintext, margin=0];",
           "  edge [style=invis];"]
    width = int(max(lay.text_width(t, size, bold) for p in panels for t, size, bold in _panel_lines(p))) + 8
    for n, panel in enumerate(panels, 1):
        out.append(f"  panel{n} [label={_panel(panel, width)}];")
    out += [f"  panel{n} -> panel{n + 1};" for n in range(1, len(panels))]
    out.append("}")
    return "\n".join(out) + "\n"


# --- the terminal view ------------------------------------------------------------------------------


def render_terminal() -> str:
    """Which edge into stop carries which terminal reason, as one table."""
    rows = terminal_rows()
    head = (f'<tr><td align="left"><b>edge</b></td><td align="left"><b>from</b></td>'
            f'<td align="left"><b>terminal reasons</b> (result subtype; <font color="{STOP_LINE}">red</font>: '
            "is_error)</td></tr>")
    body = []
    for r in rows:
        reasons = "<br/>".join(
            (f'<font color="{STOP_LINE}">' if err else "<font>") + html.escape(f"{reason} ({subtype})") + "</font>"
            for reason, subtype, err in r.reasons)
        # the edge names in ink: red is kept for what is an error (is_error reasons)
        body.append(f'<tr><td align="left" valign="top"><font color="{NODE_TEXT}"><b>'
                    f'{html.escape(r.trigger)}</b></font></td><td align="left" valign="top">'
                    f'{html.escape(", ".join(r.sources))}</td><td align="left" balign="left">{reasons}</td></tr>')
    table = (f'<<table border="0" cellborder="1" cellspacing="0" cellpadding="5" color="{GREY}">'
             + head + "".join(body) + "</table>>")
    return "\n".join([
        "// agentfsm terminal view: which edge into stop carries which terminal reason (agentfsm.machine.graph.EDGES)",
        "digraph terminal {",
        f'  graph [fontname={FONT}, pad=0.2, labelloc=t, fontsize=15, label="agentfsm — edges into stop and their '
        'terminal reasons"];',
        f"  node [fontname={FONT}, fontsize=13, shape=plaintext];",
        f"  reasons [label={table}];",
        "}",
    ]) + "\n"

