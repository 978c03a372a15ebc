"""``agentfsm audit --html``: the page's content, read back from the HTML it writes (the browser test,
tests/test_report_browser.py, checks that it renders and responds)."""

from __future__ import annotations

import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from test_audit import rewrite, write_scenario

from agentfsm import report
from agentfsm.auditing.audit import audit_report
from agentfsm.auditing.audit import main as audit_main
from agentfsm.commandline import cli
from agentfsm.diagram import renderer
from agentfsm.report.runs import build
from agentfsm.report.timeline import COMPACTION, REQUEST, TOOL, timeline

HERE = Path(__file__).parent
RICH = HERE / "fixtures" / "report" / "rich_session"
CC_FIXTURES = HERE / "fixtures" / "claude_code"
RENDERER = pytest.mark.skipif(renderer() is None, reason="neither Graphviz dot nor pygraphviz installed")


class Page(HTMLParser):
    """The parts of a page the tests look at: ids, links, external references, classes, scripts."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.external: list[str] = []
        self.classes: list[str] = []
        self.tags: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if a.get("class"):
            self.classes.append(str(a["class"]))
        if tag == "a" and a.get("href"):
            self.hrefs.append(str(a["href"]))
        for key in ("src", "href", "xlink:href"):
            value = a.get(key) or ""
            if re.match(r"(?i)(https?:)?//", value):
                self.external.append(f"{tag} {key}={value}")
        if tag == "link":
            self.external.append("link element")


def write_page(tmp_path: Path, *inputs: Path) -> tuple[str, Page]:
    out = tmp_path / "report.html"
    report.write_report(out, list(inputs))
    text = out.read_text(encoding="utf-8")
    return text, Page(text)


def test_the_rich_run_shows_its_requests_compaction_parallel_tools_denial_and_subagent() -> None:
    run = build(RICH / "transcript.jsonl", "transcript.jsonl")
    spans = run.timeline.spans
    requests = [s for s in spans if s.kind == REQUEST]
    assert len(requests) == 4
    # the request the prompt-too-long error answered got no response, and the compaction that followed says so
    assert [s.status for s in requests] == ["ok", "ok", "failed", "ok"]
    assert "compaction followed" in requests[2].detail
    assert [s.kind for s in spans].count(COMPACTION) == 1
    tools = [s for s in spans if s.kind == TOOL]
    assert sorted(s.label for s in tools) == ["Bash rm -rf /WORKSPACE/build", "Read a.txt", "Read b.txt",
                                              "Task Summarise files"]
    # the batch of three ran at once: three lanes, overlapping in time
    batch = [s for s in tools if s.label != "Task Summarise files"]
    assert {s.lane for s in batch} == {0, 1, 2}
    assert max(s.start for s in batch) < min(s.end for s in batch)
    assert [s.status for s in tools if s.label.startswith("Bash")] == ["denied"]
    # the Task call's child is the subagent transcript beside the session file, nested under it
    task = next(s for s in tools if s.label.startswith("Task"))
    assert task.child == run.children[0].key
    assert run.children[0].name.endswith("agent-ad06f21610fa70881.jsonl")
    assert len([s for s in run.children[0].timeline.spans if s.kind == REQUEST]) == 1
    # a request's first token comes after it left and no later than its last block
    for s in requests:
        if s.first is not None:
            assert s.start <= s.first <= s.end


def test_stream_json_nests_the_subagent_lines_under_the_task_call() -> None:
    run = build(RICH / "stream.jsonl", "stream.jsonl")
    assert len(run.children) == 1
    task = next(s for s in run.timeline.spans if s.kind == TOOL and s.label.startswith("Task"))
    assert task.child == run.children[0].key
    # the subagent's own lines are not the parent's responses
    parent_texts = " ".join(s.detail for s in run.timeline.spans if s.kind == REQUEST)
    assert "SUBAGENT: summarise" not in parent_texts


@pytest.mark.parametrize("fixture", [*sorted(p.relative_to(CC_FIXTURES).as_posix()
                                            for p in CC_FIXTURES.glob("*/*.jsonl")),
                                     "../report/rich_session/transcript.jsonl", "../report/rich_session/stream.jsonl"])
def test_the_state_after_the_last_move_agrees_with_the_audit(fixture: str) -> None:
    """The state the page shows is followed along the audited moves; where it ends must be where the
    auditor's replay ended, counter for counter, for every recorded Claude Code run."""
    path = CC_FIXTURES / fixture
    run = build(path, path.name)
    rep = audit_report(path)
    assert len(run.moves) == len(rep.moves)
    if run.moves:
        last = run.moves[-1].state
        assert {k: last[k] for k in rep.counters if k in last} == {k: v for k, v in rep.counters.items() if k in last}
        assert last["phase"] == rep.moves[-1].dest
    for a, b in zip(run.moves, run.moves[1:], strict=False):
        assert b.state["phase"] == b.dest and (set(b.changed) == {k for k in b.state if a.state.get(k) != b.state[k]})


@RENDERER
def test_the_page_is_self_contained_and_every_line_link_has_its_line(tmp_path: Path) -> None:
    # the directory: its two inputs in file order (stream.jsonl, transcript.jsonl), the subagent's transcript
    # nested under the session's rather than a run of its own
    text, page = write_page(tmp_path, RICH)
    assert page.external == []
    assert "<svg" in text and "@import" not in text and "url(http" not in text
    anchors = [h[1:] for h in page.hrefs if h.startswith("#")]
    assert anchors and all(a in page.ids for a in anchors), [a for a in anchors if a not in page.ids]
    # the stream-json run has warnings: each is listed with a link to its line
    rep = audit_report(RICH / "stream.jsonl")
    for f in rep.findings:
        assert f"#run1-L{f.line}" in page.hrefs
    assert "#run1" in page.hrefs and "#run2" in page.hrefs and "#run3" not in page.hrefs
    assert "run2-c1" in page.ids and "run1-c1" in page.ids
    index = text[text.index('<table class="index-table">'):]
    index = index[:index.index("</table>")]
    assert index.count("<tr") == 3  # its head and one row per run


@RENDERER
def test_a_tampered_trace_shows_its_errors_on_the_graph_and_in_the_list(tmp_path: Path) -> None:
    path = write_scenario(tmp_path / "tool_turn.jsonl", "tool_turn")
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    line = next(i for i, r in enumerate(recs, 1) if r.get("type") == "transition" and r.get("trigger") == "dispatch")
    recs[line - 1]["to"] = "feedback"
    rewrite(path, recs)
    rep = audit_report(path)
    assert rep.errors
    out = tmp_path / "page.html"
    assert cli.main(["audit", "--html", str(out), str(path)]) == 1
    text = out.read_text(encoding="utf-8")
    page = Page(text)
    assert text.count('class="finding error"') == rep.errors
    assert f"#run1-L{line}" in page.hrefs
    # on the graph: the title counts them, and the phase they were found in is outlined
    assert f"audit: {rep.errors} error" in text
    assert 'stroke-width="3.5"' in text
    # an agentfsm trace records the state after each move: the page carries it for the script
    data = json.loads(re.search(r'<script type="application/json" class="run-data">(.*?)</script>', text, re.S)[1])
    assert data["moves"][0]["state"]["phase"] == "call_model"


def test_a_trace_without_stamps_is_laid_out_by_line() -> None:
    recs = [(1, {"type": "request", "seq": 0, "model": "m", "messages": 1}),
            (2, {"type": "message", "seq": 1, "role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/x/y/a.txt"}}]}),
            (3, {"type": "message", "seq": 2, "role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]})]
    tl = timeline(recs)
    assert tl.unit == "line"
    req = next(s for s in tl.spans if s.kind == REQUEST)
    tool = next(s for s in tl.spans if s.kind == TOOL)
    assert (req.start, req.end) == (1.0, 2.0)
    assert (tool.label, tool.start, tool.end) == ("Read a.txt", 2.0, 3.0)


def test_a_call_without_its_result_is_shown_interrupted() -> None:
    recs = [(1, {"type": "assistant", "timestamp": "2026-01-01T00:00:00.000Z", "message": {
        "id": "m1", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "sleep 9"}}]}})]
    (span,) = [s for s in timeline(recs).spans if s.kind == TOOL]
    assert span.status == "interrupted"


def test_without_jinja2_the_command_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    out = tmp_path / "r.html"
    assert report.main(["--html", str(out), str(RICH / "transcript.jsonl")]) == 2
    assert "pip install 'agentfsm[report]'" in capsys.readouterr().err
    assert not out.exists()


def test_without_a_renderer_the_page_says_where_the_graph_would_be(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(report, "renderer", lambda: None)
    out = tmp_path / "r.html"
    assert report.main(["--html", str(out), str(RICH / "transcript.jsonl")]) == 0
    text = out.read_text(encoding="utf-8")
    assert "<svg" not in text and "graph not drawn" in text and "agentfsm[report]" in text
    assert "agentfsm[report]" in capsys.readouterr().err


def test_bad_inputs_are_refused_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"hello": 1}\n')
    assert cli.main(["audit", "--html", str(tmp_path / "r.html"), str(bad)]) == 2
    assert "not an agentfsm trace" in capsys.readouterr().err
    assert cli.main(["audit", "--html", str(tmp_path / "r.html"), str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    # the auditor's own entry point does not write pages: it says who does
    with pytest.raises(SystemExit):
        audit_main(["--html", "x.html", str(bad)])
    assert "agentfsm audit --html" in capsys.readouterr().err


def test_the_page_names_inputs_relative_to_what_was_given(tmp_path: Path) -> None:
    names: dict[Any, str] = report._display_names([RICH / "transcript.jsonl"], [RICH.parent])
    assert names[RICH / "transcript.jsonl"] == "rich_session/transcript.jsonl"
    assert report._display_names([RICH / "stream.jsonl"], [RICH / "stream.jsonl"])[RICH / "stream.jsonl"] == \
        "stream.jsonl"
