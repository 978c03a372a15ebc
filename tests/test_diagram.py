"""Diagrams are derived from agentfsm.machine.graph: complete, readable at README width, stable, checked; and every
run can be drawn (over the overview, or as a sequence diagram)."""

from __future__ import annotations

import html
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mermaid_grammar import flowchart_problems, sequence_problems

from agentfsm import diagram
from agentfsm.diagram import dot as dot_views
from agentfsm.diagram import layout as lay
from agentfsm.diagram import mermaid as mermaid_views
from agentfsm.diagram import rendering, sequence
from agentfsm.diagram.rendering import png_size
from agentfsm.diagram.views import (
    COMPOSITE,
    KIND_COLOURS,
    RunPath,
    Taken,
    overview_groups,
    path_from_records,
    recovery_rows,
    running_phases,
    terminal_rows,
)
from agentfsm.machine.events import Aborted, to_record
from agentfsm.machine.graph import EDGES, ROUTES, RUNNING, STATES
from agentfsm.machine.state import COUNTERS, Limits, TerminalReason

RENDERER = pytest.mark.skipif(diagram.renderer() is None, reason="neither Graphviz dot nor pygraphviz installed")
FIXTURES = Path(__file__).parent / "fixtures" / "claude_code"

# a run: one tool turn, three more, then the answer; the moves as a trace records them
RUN: list[tuple[str, str, str, str | None]] = [
    ("call", "assemble", "call_model", None),
    ("open_stream", "call_model", "stream", None),
    ("dispatch", "stream", "dispatch_tools", None),
    ("collect", "dispatch_tools", "feedback", None),
    ("next_turn", "feedback", "assemble", None),
] * 3 + [
    ("call", "assemble", "call_model", None),
    ("open_stream", "call_model", "stream", None),
    ("end_turn", "stream", "stop", "completed"),
    ("settle", "stop", "stop", "completed"),
]


def run_records(moves: list[tuple[str, str, str, str | None]] = RUN) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [{"type": "session", "seq": 0, "session_id": "s-1", "version": 2}]
    for trigger, frm, to, reason in moves:
        recs.append({"type": "transition", "seq": len(recs), "trigger": trigger, "from": frm, "to": to,
                     "terminal_reason": reason})
    return recs


def write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def mermaid_links(text: str) -> list[tuple[str, str, str, str]]:
    """(source, arrow, label, dest) of every link, in order: linkStyle indexes count these."""
    pat = re.compile(r'^\s+(\w+) (-->|-\.->|==>|---|-\.-)(?:\|"([^"]*)"\|)? (\w+)$')
    return [(m[1], m[2], m[3] or "", m[4]) for line in text.splitlines() if (m := pat.match(line))]


def link_styles(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for line in text.splitlines():
        if m := re.match(r"\s+linkStyle ([\d,]+) (.+)$", line):
            out.update({int(i): m[2] for i in m[1].split(",")})
    return out


# --- derived from the declaration --------------------------------------------------------------------


def test_the_overview_shows_every_move_once_with_abort_from_the_composite_state() -> None:
    groups = overview_groups()
    drawn = {(t, g.source, g.dest) for g in groups for t in g.triggers}
    running = {p.value for p in RUNNING}
    want = set()
    for e in EDGES:
        if set(e.sources) == set(RUNNING):
            want.add((e.trigger, COMPOSITE, e.dest.value))
        else:
            want |= {(e.trigger, s.value, e.dest.value) for s in e.sources}
    assert drawn == want
    assert [g.triggers for g in groups if g.source == COMPOSITE] == [("abort",)]
    # grouped: one arrow per (source, dest, kind); stop receives six, not thirteen
    assert len({(g.source, g.dest, g.kind) for g in groups}) == len(groups)
    assert sum(1 for g in groups if g.dest == "stop") <= 7 and running == set(running_phases())


def test_mermaid_and_dot_overviews_have_the_same_structure() -> None:
    mmd, dot = diagram.render_mermaid("overview"), diagram.render_dot("overview")
    links = mermaid_links(mmd)
    assert [(s, d, label.split("<br/>")) for s, _a, label, d in links] == \
        [(g.source, g.dest, list(g.triggers)) for g in overview_groups()]
    styles = link_styles(mmd)
    assert set(styles) == set(range(len(links)))
    for i, g in enumerate(overview_groups()):
        assert KIND_COLOURS[g.kind] in styles[i]
        assert (links[i][1] == "-.->") == (g.kind in ("reentry", "retry"))
    assert f'subgraph {COMPOSITE}["{COMPOSITE}"]' in mmd and "subgraph cluster_running" in dot
    for state in STATES:
        assert re.search(rf"\b{state.value}\b", dot) and re.search(rf"\b{state.value}\b", mmd)
    for edge in EDGES:
        assert f">{edge.trigger}</font>" in dot, edge.trigger


def test_the_recovery_view_lists_every_route_of_call_model_and_stream_in_order() -> None:
    rows = recovery_rows()
    routes = [r for r in ROUTES for src in r.sources if src.value in ("call_model", "stream")]
    assert len(rows) == len(routes)
    by_source = {s: [r.label for r in rows if r.source == s] for s in ("call_model", "stream")}
    for s in ("call_model", "stream"):
        assert by_source[s] == [r.label for r in ROUTES if any(p.value == s for p in r.sources)]
    dot, mmd = diagram.render_dot("recovery"), diagram.render_mermaid("recovery")
    for r in rows:
        assert f"{r.rank}. {r.label}" in mmd
        assert f"→ {r.edge}" in dot
        if r.guard and " and " not in r.guard:
            assert f">[{r.guard}]<" in dot, r.guard
    assert not flowchart_problems(mmd)


def test_the_recovery_view_shows_what_each_edge_counts_from_the_counters_declarations() -> None:
    """Each route's "counts" line is read from the counters' fields (raised_by, cap) and the cap's
    default from Limits: every counter a recovery edge raises is shown, with its cap, in every format."""
    rows = recovery_rows()
    dot, mmd = diagram.render_dot("recovery"), diagram.render_mermaid("recovery")
    md = diagram.recovery_markdown()
    shown = set()
    for r in rows:
        want = [c for c in COUNTERS if r.edge in c.raised_by]
        assert [line.split(" +1")[0] for line in r.counts] == [c.key for c in want], r.edge
        for c, line in zip(want, r.counts, strict=True):
            if c.cap:
                assert f"(cap {c.cap} = {getattr(Limits(), c.cap)})" in line
            shown.add(c.key)
            assert html.escape(line, quote=False) in dot and f"`{line}`" in md
        if r.counts:
            assert f"{r.label}<br/>{r.counts_label}" in mmd.replace("#quot;", '"')
    # the retries and recoveries of call_model and stream are all counted somewhere in the view
    assert {"stream_retry_count", "max_output_tokens_recovery_count", "malformed_tool_use_retry_count",
            "structured_output_retry_count", "model_index"} <= shown


def test_the_terminal_view_pairs_every_edge_with_its_reasons() -> None:
    dot, mmd = diagram.render_dot("terminal"), diagram.render_mermaid("terminal")
    pairs = {(r.trigger, reason) for r in terminal_rows() for reason, _s, _e in r.reasons}
    assert pairs == {(e.trigger, r.value) for e in EDGES if e.kind == "terminal" for r in e.reasons}
    assert {r for _t, r in pairs} == {r.value for r in TerminalReason}
    links = {(s, d) for s, _a, _l, d in mermaid_links(mmd)}
    assert links == {(f"edge_{t}", f"reason_{r}") for t, r in pairs}
    for trigger, reason in pairs:
        assert f"<b>{trigger}</b>" in dot and reason in dot


@pytest.mark.parametrize("view", list(diagram.VIEWS))
def test_every_view_is_in_the_mermaid_grammar(view: str) -> None:
    assert flowchart_problems(diagram.render_mermaid(view)) == []


def test_output_is_stable_across_hash_seeds() -> None:
    # reasons are frozensets of str: their iteration order follows PYTHONHASHSEED
    code = ("from agentfsm import diagram; print(''.join(diagram.render_mermaid(v) + diagram.render_dot(v) "
            "for v in diagram.VIEWS))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert outs == {"".join(diagram.render_mermaid(v) + diagram.render_dot(v) for v in diagram.VIEWS) + "\n"}


# --- readable ------------------------------------------------------------------------------------------


@RENDERER
def test_the_overview_png_fits_the_readme() -> None:
    png = diagram.render(diagram.render_dot("overview"), "png")
    width, height = png_size(png)
    assert width <= 1400 and width <= 2.2 * height, (width, height)
    # every font in it, scaled to a 900 px README column, is at least 11 px (96 dpi: 1 pt = 4/3 px)
    dot = diagram.render_dot("overview")
    sizes = [float(x) for x in re.findall(r'(?:fontsize=|point-size=")([\d.]+)', dot)]
    assert min(sizes) * 4 / 3 * min(1.0, 900 / width) >= 11, (min(sizes), width)


def _label_boxes(obj: dict[str, Any], size: float) -> list[tuple[float, float, float, float, str]]:
    out = []
    for key in ("_ldraw_", "_tldraw_", "_hldraw_"):
        for op in obj.get(key, []):
            if op["op"] == "F":
                size = op["size"]
            elif op["op"] == "T":
                x, y = op["pt"]
                w = op["width"]
                x0 = {"l": x, "c": x - w / 2, "r": x - w}[op["align"]]
                out.append((x0, y - 0.22 * size, x0 + w, y + 0.78 * size, op["text"]))
    return out


def _line_points(obj: dict[str, Any]) -> Iterator[tuple[float, float]]:
    for op in obj.get("_draw_", []) + obj.get("_hdraw_", []) + obj.get("_tdraw_", []):
        p = op.get("points", [])
        if op["op"] in ("b", "B"):
            for i in range(0, len(p) - 3, 3):
                (x0, y0), (x1, y1), (x2, y2), (x3, y3) = p[i:i + 4]
                for k in range(25):
                    t = k / 24
                    a, b, c, d = (1 - t) ** 3, 3 * t * (1 - t) ** 2, 3 * t * t * (1 - t), t ** 3
                    yield a * x0 + b * x1 + c * x2 + d * x3, a * y0 + b * y1 + c * y2 + d * y3
        elif op["op"] in ("L", "P", "p"):
            closed = p + p[:1] if op["op"] in ("P", "p") else p
            for (x0, y0), (x1, y1) in itertools.pairwise(closed):
                for k in range(25):
                    yield x0 + (x1 - x0) * k / 24, y0 + (y1 - y0) * k / 24


def crossings(dot: str) -> list[str]:
    """Labels an edge (or arrowhead) passes through, and labels that overlap, in Graphviz's own render."""
    import pygraphviz

    with rendering._captured_stderr_fd():
        doc = json.loads(pygraphviz.AGraph(string=dot).draw(format="json", prog=rendering._engine(dot)))
    labels = []
    for o in doc.get("objects", []):
        labels += _label_boxes(o, 14.0)
    for e in doc.get("edges", []):
        labels += _label_boxes(e, 13.0)
    found = set()
    for e in doc.get("edges", []):
        for x, y in _line_points(e):
            for x0, y0, x1, y1, text in labels:
                if x0 + 0.5 < x < x1 - 0.5 and y0 + 0.5 < y < y1 - 0.5:
                    found.add(f"an edge crosses {text!r}")
    for i, (a0, b0, a1, b1, ta) in enumerate(labels):
        for c0, d0, c1, d1, tb in labels[i + 1:]:
            if a0 < c1 - 1 and c0 < a1 - 1 and b0 < d1 - 1 and d0 < b1 - 1:
                found.add(f"{ta!r} overlaps {tb!r}")
    return sorted(found)


@RENDERER
@pytest.mark.parametrize("view", list(diagram.VIEWS))
def test_no_label_is_crossed_by_an_edge(view: str) -> None:
    assert crossings(diagram.render_dot(view)) == []


@RENDERER
def test_the_crossing_check_can_fail() -> None:
    dot = ('digraph { graph [layout=nop2, bb="0,0,200,100"]; a [pos="20,50", label=a]; b [pos="180,50", label=b]; '
           'a -> b [pos="e,160,50 40,50 80,50 120,50 150,50", label="across", lp="100,50"]; }')
    assert crossings(dot) == ["an edge crosses 'across'"]


@RENDERER
@pytest.mark.parametrize("fixture", ["ptl_after_tools/transcript.jsonl", "stop_hook_always/stream.jsonl",
                                     "mix_max_tokens_sse_error/transcript.jsonl"])
def test_a_run_drawn_over_the_overview_keeps_its_labels_clear(fixture: str) -> None:
    path = diagram.trace_path(FIXTURES / fixture)
    assert crossings(dot_views.render_overview(path)) == []


def test_layout_widths_are_conservative_for_the_node_font() -> None:
    # DejaVu Sans, which Graphviz substitutes for Helvetica: "dispatch_tools" is about 107 pt at 14 pt
    assert 100 <= lay.text_width("dispatch_tools", 14) <= 125


# --- diagrams/ and --check ---------------------------------------------------------------------------


def test_write_all_then_check_detects_stale_and_missing(tmp_path: Path) -> None:
    written = {p.name for p in diagram.write_all(tmp_path)}
    texts = {f"{v}.{ext}" for v in diagram.VIEWS for ext in ("mmd", "dot")} | {"README.md"}
    assert texts <= written
    if diagram.renderer() is None:
        assert f"{tmp_path / 'overview.svg'}: missing" in diagram.check(tmp_path)
        return
    assert {f"{v}.{ext}" for v in diagram.VIEWS for ext in ("svg", "png")} <= written
    assert diagram.check(tmp_path) == []
    assert diagram.write_all(tmp_path) == []  # nothing to do: nothing rewritten

    (tmp_path / "overview.dot").write_text(diagram.render_dot("overview").replace("next_turn", "next_lap"))
    (tmp_path / "recovery.mmd").unlink()
    png = tmp_path / "terminal.png"
    png.write_bytes(png.read_bytes().replace(diagram.dot_digest(diagram.render_dot("terminal")).encode(), b"0" * 64))
    assert diagram.check(tmp_path) == [
        f"{tmp_path / 'overview.dot'}: stale",
        f"{tmp_path / 'recovery.mmd'}: missing",
        f"{tmp_path / 'terminal.png'}: stale (rendered from an older terminal.dot)",
    ]
    rewritten = {p.name for p in diagram.write_all(tmp_path)}
    assert rewritten == {"overview.dot", "recovery.mmd", "terminal.png"}
    assert diagram.check(tmp_path) == []


def test_main_check_names_stale_files_and_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "overview.dot").write_text("digraph {}\n")
    assert diagram.main(["--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'overview.dot'}: stale" in err
    assert f"{tmp_path / 'overview.mmd'}: missing" in err
    assert f"regenerate with: agentfsm diagram --out {tmp_path}" in err


def test_committed_diagrams_are_current() -> None:
    """CI's staleness gate (docs/behaviour.md §8): regenerate with `agentfsm diagram` after changing
    fsm/machine/graph.py."""
    root = diagram.repo_root()
    if root is None:
        pytest.skip("not running from a checkout")
    assert diagram.check(root / "diagrams") == []
    pages = diagram.embedding_pages(root)
    assert pages[0] == root / "docs" / "loop.md"
    assert [p for page in pages for p in diagram.readme_problems(page)] == []
    loop = (root / "docs" / "loop.md").read_text()
    for view in diagram.VIEWS:
        assert f"diagrams/{view}.png" in loop or f"diagrams/{view}.svg" in loop, view
    assert "agentfsm diagram" in loop and "--check" in loop
    readme = (root / "README.md").read_text()
    assert "](diagrams/overview.svg)" in readme  # the README shows the picture, the page embeds the Mermaid


def test_readme_block_is_rewritten_in_place(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- diagram:start x -->\nold\n<!-- diagram:end -->\noutro\n")
    assert diagram.readme_problems(readme)
    assert diagram.sync_readme(readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert diagram.render_mermaid("overview") in text
    assert diagram.readme_problems(readme) == [] and not diagram.sync_readme(readme)


def test_without_a_renderer_pictures_are_reported_not_faked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rendering, "renderer", lambda: None)
    monkeypatch.setattr(diagram, "renderer", lambda: None)
    with pytest.raises(diagram.DiagramError, match=r"pip install .agentfsm\[diagrams\]."):
        diagram.render(diagram.render_dot(), "svg")
    assert diagram.main(["--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert f"{tmp_path / 'overview.png'}: missing" in captured.err
    assert "pip install 'agentfsm[diagrams]'" in captured.err
    assert not (tmp_path / "overview.svg").exists()
    assert (tmp_path / "overview.dot").read_text() == diagram.render_dot()


def test_the_dot_program_is_preferred_when_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\n[ "$1" = -Tsvg ] || exit 3\nwc -c >/dev/null\n'
                    "printf '<?xml version=\"1.0\"?>\\n<svg><text>fake</text></svg>\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert diagram.renderer() == "dot"
    svg = diagram.render("digraph { a -> b }", "svg")
    assert svg.startswith(b'<?xml version="1.0"?>\n<!-- agentfsm-dot-sha256: ')
    assert svg.endswith(b"<svg><text>fake</text></svg>\n")
    assert diagram.stamp_of(svg) == diagram.dot_digest("digraph { a -> b }")
    fake.write_text("#!/bin/sh\necho 'syntax error in line 1' >&2\nexit 1\n")
    with pytest.raises(diagram.DiagramError, match="syntax error in line 1"):
        diagram.render("digraph {", "svg")


@RENDERER
def test_a_png_carries_the_stamp_of_its_source() -> None:
    dot = diagram.render_dot("terminal")
    png = diagram.render(dot, "png")
    assert png.startswith(b"\x89PNG") and diagram.stamp_of(png) == diagram.dot_digest(dot)
    width, height = png_size(png)
    assert width > 100 and height > 100


@RENDERER
def test_first_render_in_a_fresh_process_labels_every_node() -> None:
    # pygraphviz 2.0.4 dropped default node labels on a process's first render; labels are explicit
    code = ("import sys; from agentfsm import diagram; "
            "sys.stdout.write(diagram.render(diagram.render_dot('overview'), 'svg').decode())")
    svg = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for state in STATES:
        assert f">{state.value}</text>" in svg, state


# --- one run -------------------------------------------------------------------------------------------


def test_a_run_over_the_overview_counts_orders_and_fades() -> None:
    path = path_from_records(run_records(), "t")
    mmd = mermaid_views.render_overview(path)
    links, styles = mermaid_links(mmd), link_styles(mmd)
    labels = {(s, d): label for s, _a, label, d in links}
    assert labels[("feedback", "assemble")] == "next_turn ×3 · 5, 10, 15"
    assert labels[("assemble", "call_model")] == "call ×4 · 1, 6, 11, …"
    taken = next(i for i, (s, _a, _l, d) in enumerate(links) if (s, d) == ("feedback", "assemble"))
    untaken = next(i for i, (s, _a, _l, d) in enumerate(links) if (s, d) == ("stream", "call_model"))
    assert "3.5px" in styles[taken] and KIND_COLOURS["reentry"] in styles[taken]
    assert diagram.views.GREY in styles[untaken]
    assert "%% t: 19 moves, ended completed" in mmd
    dot = dot_views.render_overview(path)
    # the picture names the lines of the file the moves were read from (the session record is line 1)
    assert "<b>next_turn ×3 · lines 6, 11, 16</b>" in dot and "penwidth=2.6" in dot
    assert f'<font color="{diagram.views.GREY_TEXT}" point-size="13">stream_retry</font>' in dot
    assert not flowchart_problems(mmd)


def test_undeclared_moves_are_drawn_in_the_warning_colour() -> None:
    path = path_from_records(run_records([("call", "assemble", "call_model", None),
                                          ("open_stream", "call_model", "stream", None),
                                          ("collect", "stream", "feedback", None)]), "t")
    mmd = mermaid_views.render_overview(path)
    assert ("stream", "==>", "collect ×1 UNDECLARED · 3", "feedback") in mermaid_links(mmd)
    assert "class dispatch_tools unvisited" in mmd and "never" not in mmd
    dot = dot_views.render_overview(path)
    assert f'<font color="{diagram.views.UNDECLARED}" point-size="13"><b>collect ×1 UNDECLARED</b>' in dot
    assert not flowchart_problems(mmd)


@pytest.mark.parametrize("ext,fmt", sorted(diagram.EXTENSIONS.items()))
def test_the_output_extension_picks_the_format(tmp_path: Path, ext: str, fmt: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path / "t.jsonl", run_records())
    out = tmp_path / f"run{ext}"
    if fmt in ("svg", "png") and diagram.renderer() is None:
        pytest.skip("no renderer")
    assert diagram.main(["--trace", str(trace), "--output", str(out)]) == 0
    data = out.read_bytes()
    expect = {"mermaid": b"flowchart TB", "md": b"```mermaid\nflowchart TB", "dot": b"// ", "svg": b"<?xml",
              "png": b"\x89PNG"}[fmt]
    assert data.startswith(expect), data[:40]
    if fmt == "svg":
        assert b">next_turn \xc3\x97 3" in data or "next_turn ×3".encode() in data


def test_format_overrides_the_extension_and_an_unknown_extension_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path / "t.jsonl", run_records())
    out = tmp_path / "run.txt"
    assert diagram.main(["--trace", str(trace), "--output", str(out), "--format", "dot"]) == 0
    assert out.read_text().startswith("// ")
    with pytest.raises(SystemExit) as exc:
        diagram.main(["--trace", str(trace), "--output", str(tmp_path / "run.jpeg")])
    assert exc.value.code == 2 and "unknown extension '.jpeg'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        diagram.main(["--trace", str(trace), "--as", "sequence", "--output", str(tmp_path / "run.png")])
    assert "a sequence diagram is Mermaid" in capsys.readouterr().err


def test_view_prints_one_view(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagram.main(["--view", "terminal", "--format", "mermaid"]) == 0
    assert capsys.readouterr().out == diagram.render_mermaid("terminal")


def test_a_file_that_is_not_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"hello": 1}\n')
    assert diagram.main(["--trace", str(bad)]) == 2
    assert "not an agentfsm trace" in capsys.readouterr().err


@pytest.mark.parametrize("fixture", sorted(p.relative_to(FIXTURES).as_posix()
                                           for p in FIXTURES.glob("*/*.jsonl")))
def test_every_claude_code_fixture_draws_both_ways(fixture: str) -> None:
    path = diagram.trace_path(FIXTURES / fixture)
    assert path.steps and all(s.declared for s in path.steps)
    assert flowchart_problems(mermaid_views.render_overview(path)) == []
    seq = sequence.render(path)
    assert sequence_problems(seq) == [], seq
    assert seq.count("U->>L: prompt") >= 1 and "L-->>U: result" in seq


def test_the_sequence_diagram_shows_requests_tools_hooks_and_re_entries() -> None:
    seq = sequence.render(diagram.trace_path(FIXTURES / "stop_hook_once" / "transcript.jsonl"))
    assert seq.splitlines()[:8] == [
        "sequenceDiagram", seq.splitlines()[1], "    participant U as User", "    participant L as Loop",
        "    participant M as Model", "    participant T as Tools", "    participant H as Hooks", "    U->>L: prompt"]
    assert "    L->>M: request 1" in seq and "    L->>M: request 2" in seq
    # the hook's script by its name, not its directory
    assert "    H-->>L: block · [stop_block_once.sh]: STOP_HOOK_REENTER_MARKER: run the tests first" in seq
    assert "    Note over L: ↻ stop_hook_blocking" in seq
    assert seq.rstrip().endswith("L-->>U: result · completed")
    context = sequence.render(diagram.trace_path(FIXTURES / "stop_hook_context" / "transcript.jsonl"))
    assert "    H-->>L: context · STOP_CONTEXT_MARKER: the lint step is red" in context
    assert "    Note over L: ↻ stop_hook_blocking" in context and sequence_problems(context) == []
    tools = sequence.render(diagram.trace_path(FIXTURES / "parallel_reads" / "transcript.jsonl"))
    assert tools.count("L->>T: Read") == 3 and tools.count("T-->>L: result") == 3
    assert sequence_problems(tools) == []


def test_the_sequence_grammar_check_can_fail() -> None:
    assert sequence_problems("sequenceDiagram\n    participant U as User\n    U->>L: a; b\n")
    assert sequence_problems("sequenceDiagram\n    Note over X: hi\n")
    assert flowchart_problems('flowchart TB\n    a -->|"x| b\n')
    assert flowchart_problems("flowchart TB\n    a --> b\n    linkStyle 3 stroke:#000\n")


def test_mermaid_cli_parses_what_is_emitted(tmp_path: Path) -> None:
    """Opt-in: the real Mermaid parser (``$AGENTFSM_MERMAID`` = a directory with node_modules/mermaid and
    node_modules/jsdom) agrees with the grammar check."""
    where = os.environ.get("AGENTFSM_MERMAID")
    if not where or not (Path(where) / "node_modules" / "mermaid").is_dir():
        pytest.skip("set $AGENTFSM_MERMAID to a directory where `npm install mermaid jsdom` was run")
    files = []
    for view in diagram.VIEWS:
        files.append(tmp_path / f"{view}.mmd")
        files[-1].write_text(diagram.render_mermaid(view))
    for fixture in ("stop_hook_always/stream.jsonl", "ptl_after_tools/transcript.jsonl"):
        path = diagram.trace_path(FIXTURES / fixture)
        files.append(tmp_path / f"{len(files)}.mmd")
        files[-1].write_text(sequence.render(path))
        files.append(tmp_path / f"{len(files)}.mmd")
        files[-1].write_text(mermaid_views.render_overview(path))
    script = tmp_path / "check.mjs"
    script.write_text(MERMAID_CHECK)
    done = subprocess.run(["node", str(script), *map(str, files)], cwd=where, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NODE_PATH": str(Path(where) / "node_modules")})
    assert done.returncode == 0, done.stdout + done.stderr


MERMAID_CHECK = """
import { createRequire } from "module";
import fs from "fs";
const require = createRequire(process.cwd() + "/");
const { JSDOM } = require("jsdom");
const dom = new JSDOM("<!DOCTYPE html><body></body>", { pretendToBeVisual: true });
globalThis.window = dom.window; globalThis.document = dom.window.document;
globalThis.DOMParser = dom.window.DOMParser; globalThis.Element = dom.window.Element;
const { default: mermaid } = await import(require.resolve("mermaid"));
mermaid.initialize({ startOnLoad: false });
let bad = 0;
for (const f of process.argv.slice(2)) {
  try { await mermaid.parse(fs.readFileSync(f, "utf8")); }
  catch (e) { bad++; console.log("FAIL", f, String(e.message || e).slice(0, 300)); }
}
process.exit(bad ? 1 : 0);
"""


# --- legible at page width -----------------------------------------------------------------------------

PAGE = 800  # px: a docs page's column
SMALLEST = 11.0  # px: the smallest text a reader should have to read


def legibility(svg: str) -> tuple[float, float]:
    """(rendered width in px, smallest font in px once the picture is scaled to fit PAGE px). Graphviz's
    SVG is in points (96 dpi: 1 pt = 4/3 px) and every text carries its font-size in those units."""
    m = re.search(r'<svg width="([\d.]+)pt" height="[\d.]+pt"', svg)
    assert m, "not a Graphviz SVG in points"
    width = float(m[1]) * 4 / 3
    sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', svg)]
    assert sizes, "no text"
    return width, min(sizes) * 4 / 3 * min(1.0, PAGE / width)


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parent.parent / "diagrams").glob("*.svg")))
def test_every_committed_diagram_is_legible_at_page_width(name: str) -> None:
    folder = Path(__file__).parent.parent / "diagrams"
    width, smallest = legibility((folder / name).read_text(encoding="utf-8"))
    assert smallest >= SMALLEST, f"{name}: {width:.0f} px wide, smallest text {smallest:.1f} px at {PAGE} px"
    # the PNG beside it is the same picture at 96 dpi
    png = folder / name.replace(".svg", ".png")
    assert abs(png_size(png.read_bytes())[0] - width) <= 2


def test_the_legibility_check_can_fail() -> None:
    # a wide picture with small text: 1600 pt = 2133 px, 12 pt text shrinks to 6 px at 800 px
    svg = '<svg width="1600pt" height="400pt"><text font-size="12.00">x</text></svg>'
    width, smallest = legibility(svg)
    assert round(width) == 2133 and smallest < SMALLEST


@RENDERER
def test_a_run_overlay_does_not_widen_with_the_directory_it_is_in(tmp_path: Path) -> None:
    source = FIXTURES / "ptl_after_tools" / "transcript.jsonl"
    short = tmp_path / "a" / "run.jsonl"
    deep = tmp_path / ("-home-someone-projects-" + "x" * 80) / "1f0e6a52-9d1b-4c55-8d7e-000000000000" / "run.jsonl"
    for p in (short, deep):
        p.parent.mkdir(parents=True)
        p.write_bytes(source.read_bytes())
    widths = {legibility(diagram.render_trace(diagram.trace_path(p), "svg").decode())[0] for p in (short, deep)}
    assert len(widths) == 1


@RENDERER
def test_the_overlay_draws_the_audit_findings(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.jsonl", run_records([("call", "assemble", "call_model", None),
                                                     ("open_stream", "call_model", "stream", None),
                                                     ("collect", "stream", "feedback", None)]))
    path = diagram.trace_path(trace)
    errors = [f for f in path.findings if f[1] == "error"]
    assert errors
    dot = dot_views.render_overview(path)
    assert f"audit: {len(errors)} error" in dot
    # the phase the run was in at the first error is outlined in red, with the findings as its tooltip
    assert re.search(r'stream \[[^\]]*color="#c0392b", penwidth=3.5, tooltip="line 4: error', dot), dot


def test_the_sequence_shows_compaction_requests_interrupted_calls_and_no_directories() -> None:
    seq = sequence.render(diagram.trace_path(FIXTURES / "ptl_after_tools" / "transcript.jsonl")).splitlines()
    error = next(i for i, line in enumerate(seq) if "prompt_too_long error 400" in line)
    # the 400 is followed by the compaction request and its summary, then the request asked again
    assert "L->>M: compaction request" in seq[error + 1] and "M-->>L: summary" in seq[error + 2]
    assert any("L->>M: request" in line for line in seq[error + 3:])
    hooks = sequence.render(diagram.trace_path(FIXTURES / "stop_hook_once" / "transcript.jsonl"))
    assert "stop_block_once.sh" in hooks and "/TOOLS/" not in hooks
    # the interrupt cut toolu_1 short; toolu_2 had finished
    shown = ({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}},
             {"type": "tool_use", "id": "toolu_2", "name": "Read", "input": {}})
    done = ({"type": "tool_result", "tool_use_id": "toolu_2", "content": "ok"},)
    steps = (Taken(1, "abort", "dispatch_tools", "stop", 3, reason="aborted_tools",
                   event=to_record(Aborted(shown=shown, finished=done))),)
    aborted = sequence.render(RunPath("t", steps))
    assert "U--xL: interrupt" in aborted and "T--xL: interrupted toolu_1" in aborted
    assert "interrupted toolu_2" not in aborted
    # a record of an earlier release carried the pairing itself
    old = {"type": "Aborted", "partial_results": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_9", "content": "interrupted"}]}}
    legacy = sequence.render(RunPath("t", (Taken(1, "abort", "dispatch_tools", "stop", 3, reason="aborted_tools",
                                                 event=old),)))
    assert "T--xL: interrupted toolu_9" in legacy
    assert sequence_problems(aborted) == [], aborted
