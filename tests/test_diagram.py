"""Diagrams are derived from agentfsm.graph.EDGES: complete, styled by edge kind, stable, and checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentfsm import diagram
from agentfsm.graph import EDGES, REENTRY_LABELS, STATES
from agentfsm.state import TerminalReason

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
]


def run_records(moves: list[tuple[str, str, str, str | None]] = RUN) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = [{"type": "session", "seq": 0, "session_id": "s-1"}]
    for trigger, frm, to, reason in moves:
        recs.append({"type": "transition", "seq": len(recs), "trigger": trigger, "from": frm, "to": to,
                     "terminal_reason": reason})
    return recs


def mermaid_links(text: str) -> list[tuple[str, str, str, str]]:
    """(source, arrow, label, dest) of every link, in order: linkStyle indexes count these."""
    pat = re.compile(r'^\s+(\w+) (-->|-\.->|==>|-\.-)(?:\|"([^"]*)"\|)? (\w+)$')
    return [(m[1], m[2], m[3] or "", m[4]) for line in text.splitlines() if (m := pat.match(line))]


def link_styles(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for line in text.splitlines():
        if m := re.match(r"\s+linkStyle ([\d,]+) (.+)$", line):
            out.update({int(i): m[2] for i in m[1].split(",")})
    return out


def dot_edge(text: str, src: str, dst: str, label: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip().startswith(f"{src} -> {dst} [label=\"{label}\"")]
    assert len(lines) == 1, (src, dst, label)
    return lines[0]


def test_every_state_trigger_and_reason_appears() -> None:
    mmd, dot = diagram.render_mermaid(), diagram.render_dot()
    for text in (mmd, dot):
        for state in STATES:
            assert re.search(rf"\b{state.value}\b", text)
        for edge in EDGES:
            assert f'"{edge.trigger}"' in text
        for reason in TerminalReason:
            assert reason.value in text
    # one arrow per (trigger, source), plus the note's link
    assert len(mermaid_links(mmd)) == sum(len(e.sources) for e in EDGES) + 1


def test_reentry_edges_are_styled_apart_from_forward_ones() -> None:
    mmd = diagram.render_mermaid()
    links, styles = mermaid_links(mmd), link_styles(mmd)
    assert set(styles) == set(range(len(links)))  # every link styled, none beyond
    by_kind = {e.trigger: e.kind for e in EDGES}
    for i, (_src, arrow, label, _dst) in enumerate(links):
        kind = by_kind.get(label)
        if kind is None:
            continue  # the note's link
        assert (arrow == "-.->") == (kind in ("reentry", "retry")), label
        assert diagram.KIND_COLOURS[kind] in styles[i], label
    assert diagram.KIND_COLOURS["reentry"] != diagram.KIND_COLOURS["forward"]

    dot = diagram.render_dot()
    assert "style=dashed" in dot_edge(dot, "feedback", "assemble", "next_turn")
    assert diagram.KIND_COLOURS["reentry"] in dot_edge(dot, "feedback", "assemble", "next_turn")
    assert "style=solid" in dot_edge(dot, "assemble", "call_model", "call")
    for edge in EDGES:
        for src in edge.sources:
            line = dot_edge(dot, src.value, edge.dest.value, edge.trigger)
            dashed = edge.kind in ("reentry", "retry")
            assert ("style=dashed" in line) == dashed and ("style=solid" in line) != dashed, line
    assert {e.trigger for e in EDGES if e.kind == "reentry"} == REENTRY_LABELS


def test_terminal_reasons_sit_in_a_note_at_stop() -> None:
    mmd, dot = diagram.render_mermaid(), diagram.render_dot()
    assert "    stop -.- stop_reasons" in mmd
    assert "stop -> terminal_reasons [style=dotted" in dot
    note = next(ln for ln in dot.splitlines() if ln.strip().startswith("terminal_reasons [shape=note"))
    assert "end_turn: completed\\l" in note
    assert "abort: aborted_streaming, aborted_tools\\l" in note


def test_output_is_stable_across_hash_seeds() -> None:
    # reasons are frozensets of str: their iteration order follows PYTHONHASHSEED
    code = "from agentfsm import diagram; print(diagram.render_mermaid() + diagram.render_dot())"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert outs == {diagram.render_mermaid() + diagram.render_dot() + "\n"}


def test_trace_overlay_counts_traversals_and_greys_the_rest() -> None:
    recs = run_records()
    mmd = diagram.render_trace_mermaid(recs)
    links, styles = mermaid_links(mmd), link_styles(mmd)
    labels = [label for _s, _a, label, _d in links]
    assert "next_turn ×3" in labels and "call ×4" in labels and "end_turn ×1" in labels
    taken = labels.index("next_turn ×3")
    untaken = labels.index("stream_retry")
    assert "3.5px" in styles[taken] and diagram.KIND_COLOURS["reentry"] in styles[taken]
    assert diagram.GREY in styles[untaken]
    assert "reached<br/>completed ×1" in mmd

    dot = diagram.render_trace_dot(recs)
    assert "penwidth=3" in dot_edge(dot, "feedback", "assemble", "next_turn ×3")
    assert diagram.GREY in dot_edge(dot, "stream", "call_model", "stream_retry")
    assert "18 transitions, ended completed" in dot


def test_trace_overlay_shows_undeclared_moves() -> None:
    recs = run_records([("call", "assemble", "call_model", None),
                        ("open_stream", "call_model", "stream", None),
                        ("collect", "stream", "feedback", None)])
    mmd = diagram.render_trace_mermaid(recs)
    assert ("stream", "==>", "collect ×1 UNDECLARED", "feedback") in mermaid_links(mmd)
    assert "never reached stop" in mmd
    assert '"collect ×1 UNDECLARED"' in diagram.render_trace_dot(recs)
    # states the run never entered are greyed
    assert "class dispatch_tools unvisited" in mmd


def test_write_all_then_check_detects_stale_and_missing(tmp_path: Path) -> None:
    written = diagram.write_all(tmp_path)
    names = {p.name for p in written}
    assert {"agent_loop.mmd", "agent_loop.dot", "README.md"} <= names
    if diagram.svg_renderer() is None:
        assert diagram.check(tmp_path) == [f"{tmp_path / 'agent_loop.svg'}: missing"]
        return
    assert "agent_loop.svg" in names
    assert diagram.check(tmp_path) == []
    assert diagram.write_all(tmp_path) == []  # nothing to do: nothing rewritten

    (tmp_path / "agent_loop.dot").write_text(diagram.render_dot().replace("next_turn", "next_lap"))
    (tmp_path / "agent_loop.mmd").unlink()
    svg = tmp_path / "agent_loop.svg"
    svg.write_bytes(re.sub(rb"sha256: [0-9a-f]{64}", b"sha256: " + b"0" * 64, svg.read_bytes()))
    assert diagram.check(tmp_path) == [
        f"{tmp_path / 'agent_loop.mmd'}: missing",
        f"{tmp_path / 'agent_loop.dot'}: stale",
        f"{tmp_path / 'agent_loop.svg'}: stale (rendered from an older agent_loop.dot)",
    ]
    rewritten = {p.name for p in diagram.write_all(tmp_path)}
    assert rewritten == {"agent_loop.mmd", "agent_loop.dot", "agent_loop.svg"}
    assert diagram.check(tmp_path) == []


def test_main_check_names_stale_files_and_the_command(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "agent_loop.dot").write_text("digraph {}\n")
    assert diagram.main(["--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'agent_loop.dot'}: stale" in err
    assert f"{tmp_path / 'agent_loop.mmd'}: missing" in err
    assert f"regenerate with: agentfsm diagram --out {tmp_path}" in err


@pytest.mark.skipif(diagram.svg_renderer() is None, reason="neither Graphviz dot nor pygraphviz installed")
def test_svg_shows_states_and_reentry_labels() -> None:
    dot = diagram.render_dot()
    svg = diagram.render_svg(dot).decode()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for state in STATES:
        assert f">{state.value}</text>" in svg
    for label in ("next_turn", "reactive_compact_retry", "max_output_tokens_recovery",
                  "malformed_tool_use_retry"):
        assert f">{label}</text>" in svg
    assert diagram.svg_stamp(svg.encode()) == diagram.dot_digest(dot)


@pytest.mark.skipif(diagram.svg_renderer() is None, reason="neither Graphviz dot nor pygraphviz installed")
def test_main_renders_a_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in run_records()))
    out = tmp_path / "run.svg"
    assert diagram.main(["--trace", str(trace), "--format", "svg", "--output", str(out)]) == 0
    assert ">next_turn ×3</text>" in out.read_text()
    mmd = tmp_path / "run.mmd"
    assert diagram.main(["--trace", str(trace), "--output", str(mmd)]) == 0
    assert '"next_turn ×3"' in mmd.read_text()


def test_committed_diagrams_are_current() -> None:
    """CI's staleness gate (docs/behaviour.md §8): regenerate with `agentfsm diagram` after changing fsm/graph.py."""
    root = diagram.repo_root()
    if root is None:
        pytest.skip("not running from a checkout")
    assert diagram.check(root / "diagrams") == []
    assert diagram.readme_problems(root / "README.md") == []


def test_readme_block_is_rewritten_in_place(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- diagram:start x -->\nold\n<!-- diagram:end -->\noutro\n")
    assert diagram.readme_problems(readme)
    assert diagram.sync_readme(readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    assert diagram.render_mermaid() in text
    assert diagram.readme_problems(readme) == [] and not diagram.sync_readme(readme)


def test_without_a_renderer_the_svg_is_reported_not_faked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(diagram, "svg_renderer", lambda: None)
    with pytest.raises(diagram.DiagramError, match="pip install pygraphviz"):
        diagram.render_svg(diagram.render_dot())
    assert diagram.main(["--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert f"{tmp_path / 'agent_loop.svg'}: missing" in captured.err
    assert "pip install pygraphviz" in captured.err
    assert not (tmp_path / "agent_loop.svg").exists()
    assert (tmp_path / "agent_loop.dot").read_text() == diagram.render_dot()


def test_the_dot_program_is_preferred_when_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\n[ "$1" = -Tsvg ] || exit 3\nwc -c >/dev/null\n'
                    "printf '<?xml version=\"1.0\"?>\\n<svg><text>fake</text></svg>\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert diagram.svg_renderer() == "dot"
    svg = diagram.render_svg("digraph { a -> b }")
    assert svg.startswith(b'<?xml version="1.0"?>\n<!-- agentfsm-dot-sha256: ')
    assert svg.endswith(b"<svg><text>fake</text></svg>\n")
    assert diagram.svg_stamp(svg) == diagram.dot_digest("digraph { a -> b }")
    fake.write_text("#!/bin/sh\necho 'syntax error in line 1' >&2\nexit 1\n")
    with pytest.raises(diagram.DiagramError, match="syntax error in line 1"):
        diagram.render_svg("digraph {")


@pytest.mark.skipif(diagram.svg_renderer() is None, reason="neither Graphviz dot nor pygraphviz installed")
def test_first_render_in_a_fresh_process_labels_every_node() -> None:
    # pygraphviz 2.0.4 drops default node labels on a process's first render; the SVG in diagrams/
    # is usually exactly that render
    code = ("import sys, re; from agentfsm import diagram; "
            "sys.stdout.write(diagram.render_svg(diagram.render_dot()).decode())")
    svg = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for state in STATES:
        assert f">{state.value}</text>" in svg, state
