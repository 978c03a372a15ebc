"""Where everything of the overview goes: a fixed, deterministic layout computed from the declaration.

The forward path runs down one column; re-entries leave each source to the left and climb, nested, to
the phase they re-enter; retries loop on the right, close to the column; edges into ``stop`` leave to
the right on nested lanes and come down into ``stop`` at the bottom, where the last phase's edge drops
straight in. Every label sits beside the segment it names, in space no other line crosses: lanes are
placed from the widths of the labels they must clear, so a longer label (a run's counts) moves the
lanes out instead of overlapping them.

Widths are estimated from per-character advance widths (DejaVu Sans, which Graphviz substitutes for
Helvetica on most machines, and which is wider than Helvetica), never measured: the same declaration
gives the same layout — and the same DOT bytes — on every machine. Coordinates are points, y down;
:mod:`agentfsm.diagram.dot` turns them into Graphviz's y-up positions for its ``nop2`` engine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import attrs

from agentfsm.diagram.views import COMPOSITE, STOP, Group

FONT_NODE = 14.0
FONT_EDGE = 13.0
FONT_TITLE = 15.0
LINE = FONT_EDGE * 1.3  # line height of an edge label
PAD = 8.0  # between a line and its label
LANE_GAP = 16.0  # between two nested lanes
CORNER = 8.0  # rounded corners of the lanes
NODE_H = 36.0
STOP_R = 26.0
MARGIN = 18.0
CLUSTER_PAD = 14.0  # between the running phases and the composite state's border

# advance widths (em) of DejaVu Sans; anything else counts as a wide character
_ADVANCE: Mapping[str, float] = {
    **dict.fromkeys("abdeghnopqu", 0.635), "c": 0.55, "f": 0.352, "i": 0.278, "j": 0.278, "k": 0.579,
    "l": 0.278, "m": 0.974, "r": 0.411, "s": 0.521, "t": 0.392, "v": 0.592, "w": 0.818, "x": 0.592,
    "y": 0.592, "z": 0.525, "_": 0.5, " ": 0.318, **dict.fromkeys("0123456789", 0.636), "×": 0.838,
    "·": 0.318, ",": 0.318, ".": 0.318, ":": 0.337, "(": 0.39, ")": 0.39, "[": 0.39, "]": 0.39, "|": 0.337,
    "-": 0.361, "—": 1.0, "…": 1.0, "→": 0.838, "'": 0.275, "#": 0.838, "/": 0.337,
}


BOLD = 1.12  # bold glyphs are about this much wider


def text_width(text: str, size: float, bold: bool = False) -> float:
    return size * sum(_ADVANCE.get(ch, 0.75) for ch in text) * (BOLD if bold else 1.0)


Text = tuple[str, bool]  # a label line and whether it is set in bold


@attrs.frozen
class Box:
    """A phase: centre, size; ``stop`` is a circle of radius ``w / 2``."""

    name: str
    x: float
    y: float
    w: float
    h: float

    @property
    def west(self) -> float:
        return self.x - self.w / 2

    @property
    def east(self) -> float:
        return self.x + self.w / 2

    @property
    def top(self) -> float:
        return self.y - self.h / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h / 2


@attrs.frozen
class Label:
    """A block of lines whose box starts at (x0, y0); ``align`` ``l`` or ``r`` inside it."""

    x0: float
    y0: float
    w: float
    h: float
    align: str = "l"

    @property
    def centre(self) -> tuple[float, float]:
        return self.x0 + self.w / 2, self.y0 + self.h / 2


@attrs.frozen
class Arrow:
    """One arrow: a polyline from tail to head (the head is the arrow's tip) and its label."""

    key: tuple[str, str, str]  # (source, dest, kind) of its group, or ("undeclared", n, trigger)
    points: tuple[tuple[float, float], ...]
    label: Label | None


@attrs.frozen
class Layout:
    width: float
    height: float
    boxes: Mapping[str, Box]
    cluster: tuple[float, float, float, float]  # x0, y0, x1, y1 of the composite state
    cluster_label: tuple[float, float]  # where its name goes (left end of the text)
    arrows: tuple[Arrow, ...]
    title: Label


def _label(lines: Sequence[Text]) -> tuple[float, float]:
    """Width and height of a label of ``lines``."""
    return max((text_width(t, FONT_EDGE, bold) for t, bold in lines), default=0.0) + 4, LINE * len(lines) + 4


def column(groups: Sequence[Group], phases: Sequence[str]) -> list[str]:
    """The forward path from the first phase, then any phase it misses; ``stop`` is placed apart."""
    nxt = {g.source: g.dest for g in groups if g.kind == "forward"}
    order = [phases[0]]
    while order[-1] in nxt and nxt[order[-1]] not in order:
        order.append(nxt[order[-1]])
    return order + [p for p in phases if p not in order and p != STOP]


def overview(groups: Sequence[Group], phases: Sequence[str], running: Sequence[str],
             lines: Mapping[tuple[str, str, str], Sequence[Text]], title: Sequence[str],
             extra: Sequence[tuple[int, str, str, str, Sequence[Text]]] = ()) -> Layout:
    """The overview's layout. ``lines``: the label lines of each group's arrow, by (source, dest, kind);
    ``extra``: moves the graph does not declare, drawn straight ((n, trigger, source, dest, label lines))."""
    col = column(groups, phases)
    node_w = max(text_width(p, FONT_NODE) for p in phases) + 30
    lab = {key: _label(ls) for key, ls in lines.items()}
    row = {p: i for i, p in enumerate(col)}
    top_row = col[0]

    def size(key: tuple[str, str, str]) -> tuple[float, float]:
        return lab.get(key, (0.0, 0.0))

    reentries = [g for g in groups if g.kind == "reentry"]
    retries = [g for g in groups if g.kind == "retry"]
    terminals = [g for g in groups if g.kind == "terminal" and g.source != STOP]
    last = col[-1]
    straight = [g for g in terminals if g.source == last]
    laned = sorted((g for g in terminals if g.source != last),
                   key=lambda g: -(row[g.source] if g.source in row else row[running[-1]] + 0.5))
    loops = [g for g in retries if g.source == g.dest]
    backs = [g for g in retries if g.source != g.dest and g.source in row and g.dest in row]

    # vertical: the bands between rows hold, on the right, the terminal label of the row above, the
    # retry labels of loops that end in the row below, and the self-loop over the row below; on the
    # left, the re-entry label of the row below
    def key(g: Group) -> tuple[str, str, str]:
        return g.source, g.dest, g.kind

    band: list[float] = []
    for upper, lower in itertools.pairwise(col):
        right = sum(size(key(g))[1] + 6 for g in laned if g.source == upper)
        right += sum(size(key(g))[1] + 12 for g in backs if g.source == lower)
        right += sum(size(key(g))[1] + 28 for g in loops if g.source == lower)
        left = sum(size(key(g))[1] + 6 for g in reentries if g.source == lower)
        if any(g.source == COMPOSITE for g in laned) and upper == running[-1]:
            right += size(key(next(g for g in laned if g.source == COMPOSITE)))[1] + 6
        band.append(max(right, left, LINE + 8) + 26)
    ys = [0.0]
    for b in band:
        ys.append(ys[-1] + NODE_H + b)
    boxes: dict[str, Box] = {p: Box(p, 0.0, ys[row[p]], node_w, NODE_H) for p in col}
    stop_band = max([size(key(g))[1] for g in straight] + [LINE]) + 30
    stop_y = ys[-1] + NODE_H / 2 + stop_band + STOP_R
    boxes[STOP] = Box(STOP, 0.0, stop_y, 2 * STOP_R, 2 * STOP_R)
    west, east = -node_w / 2, node_w / 2

    arrows: list[Arrow] = []

    # the forward path
    for g in groups:
        if g.kind == "forward" and g.source in row and g.dest in row:
            a, b = boxes[g.source], boxes[g.dest]
            w, h = size(key(g))
            arrows.append(Arrow(key(g), ((0.0, a.bottom), (0.0, b.top)),
                                Label(PAD, (a.bottom + b.top) / 2 - h / 2, w, h)))
    for g in straight:
        a, s = boxes[g.source], boxes[STOP]
        w, h = size(key(g))
        arrows.append(Arrow(key(g), ((0.0, a.bottom), (0.0, s.top)), Label(PAD, (a.bottom + s.top) / 2 - h / 2, w, h)))

    # re-entries: left, nested, lower sources outside
    order = sorted(reentries, key=lambda g: row.get(g.source, len(col)))
    lane = west - PAD
    entries = _spread(len(order), NODE_H / 2 - 8)
    for i, g in enumerate(order):
        w, h = size(key(g))
        dest = boxes.get(g.dest, boxes[top_row])
        src = boxes[g.source]
        if g.source == STOP:
            start, near = (src.x - STOP_R, src.y), src.x - STOP_R - PAD
        else:
            # a label clears the composite state's border as well as its node
            start, near = (src.west, src.y), src.west - (CLUSTER_PAD if g.source in running else 0) - PAD
        lane = min(lane - LANE_GAP, near - w - PAD)
        ey = dest.y + entries[i]
        arrows.append(Arrow(key(g), (start, (lane, start[1]), (lane, ey), (dest.west, ey)),
                            Label(near - w, start[1] - 3 - h, w, h, "r")))
    left_edge = lane

    # the composite state's right border clears the forward labels beside the column
    forward_right = max([PAD + size(key(g))[0] for g in groups if g.kind == "forward"] + [0.0])
    cluster_right = max(east + CLUSTER_PAD, forward_right + 6)

    # retries: right, just outside the composite state
    right_inner = cluster_right
    loop_labels: list[tuple[float, float]] = []  # (right extent, top y) of retry labels
    for i, g in enumerate(backs):
        src, dest = boxes[g.source], boxes[g.dest]
        x = cluster_right + 14 + LANE_GAP * i
        w, h = size(key(g))
        y0, y1 = src.y - 9, dest.y + 9
        lbl = Label(x + 6, y0 - 6 - h, w, h)
        arrows.append(Arrow(key(g), ((east, y0), (x, y0), (x, y1), (east, y1)), lbl))
        right_inner = max(right_inner, x)
        loop_labels.append((lbl.x0 + w, src.y))
    for g in loops:
        b = boxes[g.source]
        w, h = size(key(g))
        x0, x1, ytop = east - 26, cluster_right + 8, b.top - 18
        lbl = Label(x1 + 6, ytop - h / 2, w, h)
        arrows.append(Arrow(key(g), ((x0, b.top), (x0, ytop), (x1, ytop), (x1, b.y - 9), (east, b.y - 9)), lbl))
        right_inner = max(right_inner, x1)
        loop_labels.append((lbl.x0 + w, b.y))

    # the composite state's right border encloses the retries, lanes and labels: a retry happens inside
    # running, and no retry line may cross the border
    border = max([cluster_right, right_inner] + [right for right, _ in loop_labels]) + 8
    # into stop: right, nested, upper sources outside; they come down into stop's right side
    label_x = max(right_inner + PAD + 4, border + PAD)
    stop = boxes[STOP]
    offsets = _spread(len(laned), STOP_R - 10)  # the innermost lane comes in highest
    lane = label_x
    for i, g in enumerate(laned):
        w, h = size(key(g))
        if g.source == COMPOSITE:
            sy = boxes[running[-1]].y
            start = (border, sy)
        else:
            sy = boxes[g.source].y
            start = (east, sy)
        clear = max([label_x + w] + [right for right, y in loop_labels if y >= sy - 1])
        lane = max(lane + LANE_GAP, clear + PAD)
        off = offsets[i]
        ey = stop.y - off
        ex = stop.x + math.sqrt(max(STOP_R ** 2 - off ** 2, 0.0))
        # the label hangs right-aligned against its own lane, below the corner, so it reads as that
        # lane's and not as the retry lanes' on its left (the lane is placed to leave it room)
        arrows.append(Arrow(key(g), (start, (lane, sy), (lane, ey), (ex, ey)),
                            Label(lane - PAD - w, sy + 4, w, h, "r")))
    right_edge = lane

    # settle (stop to stop): a loop under stop
    for g in groups:
        if g.kind == "terminal" and g.source == STOP and g.dest == STOP:
            w, h = size(key(g))
            b = stop.bottom
            arrows.append(Arrow(key(g), ((stop.x - 9, b - 1), (stop.x - 9, b + 18), (stop.x + 9, b + 18),
                                         (stop.x + 9, b - 1)), Label(stop.x + 16, b + 2, w, h)))

    # moves the graph does not declare: each on its own lane outside the re-entries, label beside it
    lane = left_edge
    for n, trigger, source, dest, extra_lines in extra:
        a, b = boxes.get(source), boxes.get(dest)
        if a is None or b is None:
            continue
        w, h = _label(extra_lines)
        lane -= LANE_GAP
        start, end = _west(a, 14), _west(b, 15)
        mid = (start[1] + end[1]) / 2
        lbl = Label(lane - PAD - w, mid - h / 2, w, h, "r")
        arrows.append(Arrow(("undeclared", str(n), trigger),
                            (start, (lane, start[1]), (lane, end[1]), end), lbl))
        lane = lbl.x0 - PAD
    left_edge = lane

    # the composite state around the running phases
    first, last_running = boxes[running[0]], boxes[running[-1]]
    cluster = (west - CLUSTER_PAD, first.top - 30, border, last_running.bottom + 12)
    # the title above everything
    tw = max((text_width(t, FONT_TITLE, i == 0) for i, t in enumerate(title)), default=0.0) + 4
    th = FONT_TITLE * 1.3 * len(title) + 4
    xs = [left_edge, right_edge, cluster[0], cluster[2]]
    ys_all = [cluster[1], stop.bottom + 26]
    for a in arrows:
        xs += [p[0] for p in a.points]
        ys_all += [p[1] for p in a.points]
        if a.label is not None:
            xs += [a.label.x0, a.label.x0 + a.label.w]
            ys_all += [a.label.y0, a.label.y0 + a.label.h]
    x_min, x_max = min(xs) - MARGIN, max(xs) + MARGIN
    y_top = min(ys_all) - th - 10 - MARGIN
    y_max = max(ys_all) + MARGIN
    width = max(x_max - x_min, tw + 2 * MARGIN)
    dx = -x_min + (width - (x_max - x_min)) / 2
    dy = -y_top
    title_label = Label((width - tw) / 2, MARGIN, tw, th, "c")
    return _shifted(Layout(width, y_max - y_top, boxes, cluster, (cluster[0] + 10, cluster[1] + 4),
                           tuple(arrows), title_label), dx, dy)


def _spread(n: int, half: float) -> list[float]:
    """``n`` offsets from ``+half`` down to ``-half`` (the first lowest)."""
    if n <= 1:
        return [0.0] * n
    return [half - 2 * half * i / (n - 1) for i in range(n)]


def _west(box: Box, dy: float) -> tuple[float, float]:
    """A point on the left side of ``box``, ``dy`` below its centre."""
    if box.name == STOP:
        return box.x - math.sqrt(max(STOP_R ** 2 - dy ** 2, 0.0)), box.y + dy
    return box.west, box.y + dy


def _shifted(layout: Layout, dx: float, dy: float) -> Layout:
    def p(pt: tuple[float, float]) -> tuple[float, float]:
        return pt[0] + dx, pt[1] + dy

    def lab(label: Label | None) -> Label | None:
        return None if label is None else attrs.evolve(label, x0=label.x0 + dx, y0=label.y0 + dy)

    boxes = {k: attrs.evolve(b, x=b.x + dx, y=b.y + dy) for k, b in layout.boxes.items()}
    arrows = tuple(attrs.evolve(a, points=tuple(p(q) for q in a.points), label=lab(a.label)) for a in layout.arrows)
    x0, y0, x1, y1 = layout.cluster
    return attrs.evolve(layout, boxes=boxes, arrows=arrows, cluster=(x0 + dx, y0 + dy, x1 + dx, y1 + dy),
                        cluster_label=p(layout.cluster_label))


# --- the recovery view -------------------------------------------------------------------------------

FONT_ROUTE = 12.0
ROUTE_LINE = FONT_ROUTE * 1.3


@attrs.frozen
class RouteBox:
    """One route's box: its lines (left-aligned), where it sits, and the phase its edge enters."""

    index: int
    x: float
    y: float
    w: float
    h: float
    dest: str  # the name of the destination node of its section


@attrs.frozen
class Recovery:
    width: float
    height: float
    title: Label
    phases: Mapping[str, Box]  # source and destination nodes, by node name
    routes: tuple[RouteBox, ...]
    spines: tuple[tuple[str, int, tuple[tuple[float, float], ...]], ...]  # (source node, route, polyline)
    arrows: tuple[tuple[int, tuple[tuple[float, float], ...]], ...]  # (route index, polyline to its dest)


def recovery(rows: Sequence[tuple[str, str, Sequence[str]]], title: Sequence[str]) -> Recovery:
    """``rows``: (source, dest, lines) of each route, in the order they are tried, grouped by source."""
    node_w = max(text_width(name, FONT_NODE) for s, d, _ in rows for name in (s, d)) + 30
    box_w = max(text_width(t, FONT_ROUTE, True) for _, _, ls in rows for t in ls) + 22
    x_src = MARGIN + node_w / 2
    x_spine = MARGIN + node_w + 22
    x_box = x_spine + 22
    x_dest = x_box + box_w + 150 + node_w / 2
    tw = max(text_width(t, FONT_TITLE, True) for t in title) + 4
    th = FONT_TITLE * 1.3 * len(title) + 4
    y = MARGIN + th + 16
    phases: dict[str, Box] = {}
    routes: list[RouteBox] = []
    spines = []
    arrows = []
    for source in dict.fromkeys(s for s, _, _ in rows):
        mine = [(i, d, ls) for i, (s, d, ls) in enumerate(rows) if s == source]
        top = y
        boxes = []
        for i, dest, lines in mine:
            h = ROUTE_LINE * len(lines) + 12
            boxes.append(RouteBox(i, x_box + box_w / 2, y + h / 2, box_w, h, f"{source}:{dest}"))
            y += h + 8
        bottom = y - 8
        mid = (top + bottom) / 2
        phases[f"from:{source}"] = Box(source, x_src, mid, node_w, NODE_H)
        for b in boxes:
            spines.append((f"from:{source}", b.index,
                           ((x_src + node_w / 2, mid), (x_spine, mid), (x_spine, b.y), (b.x - b.w / 2, b.y))))
        # each destination sits level with the middle of the routes that enter it, in order, not overlapping
        dests = list(dict.fromkeys(b.dest for b in boxes))
        want = [sum(b.y for b in boxes if b.dest == d) / sum(1 for b in boxes if b.dest == d) for d in dests]
        placed: list[float] = []
        for d, wy in sorted(zip(dests, want, strict=True), key=lambda p: p[1]):
            gy = max([wy] + [p + NODE_H + 24 for p in placed[-1:]])
            placed.append(gy)
            name = d.split(":", 1)[1]
            size = 2 * STOP_R if name == STOP else None
            phases[d] = Box(name, x_dest, gy, size or node_w, size or NODE_H)
        for b in boxes:
            tgt = phases[b.dest]
            end = (tgt.x - (STOP_R if tgt.name == STOP else tgt.w / 2), tgt.y)
            arrows.append((b.index, ((b.x + b.w / 2, b.y), (x_box + box_w + 40, b.y), end)))
        routes += boxes
        y += 30
    width = max(x_dest + node_w / 2 + MARGIN, tw + 2 * MARGIN)
    height = y - 30 + MARGIN
    return Recovery(width, height, Label((width - tw) / 2, MARGIN, tw, th, "c"), phases, tuple(routes),
                    tuple(spines), tuple(arrows))
