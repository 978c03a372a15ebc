"""The HTML report in a real browser: headless Chromium (the system's, Debian's ``chromium``) driven by
Playwright loads the page from disk and checks that the graph, the timeline and the findings render,
that clicking a move shows the state after it and that a line link opens the file's lines. A
screenshot is kept as an artefact (its path is printed). Skips, saying why, when no browser is installed;
``.ci/run`` installs one. The browser is never downloaded by Playwright (``playwright install`` is not
used): it is the system's, at ``AGENTFSM_CHROMIUM`` or on PATH."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentfsm import report
from agentfsm.auditing.audit import audit_report
from agentfsm.diagram import renderer

RICH = Path(__file__).parent / "fixtures" / "report" / "rich_session"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


def _chromium() -> str | None:
    given = os.environ.get("AGENTFSM_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium; or set AGENTFSM_CHROMIUM)")
    if renderer() is None:
        pytest.skip("neither Graphviz dot nor pygraphviz installed: the page would have no graph")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.mark.slow
def test_the_report_renders_and_responds_in_a_browser(browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    report.write_report(out, [RICH / "transcript.jsonl", RICH / "stream.jsonl"])  # run1, run2
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    requested: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(out.as_uri())

    # nothing but the file itself was loaded
    assert [u for u in requested if not u.startswith(("file:", "data:", "about:"))] == []

    # the index, then per run the graph with its phases, the timeline and the findings
    assert page.locator(".index-table tbody tr").count() == 2
    run = page.locator("section#run1")
    graph = run.locator(".graph svg").first
    assert graph.is_visible() and graph.bounding_box()["width"] > 300
    titles = graph.locator("g.node title").all_text_contents()
    assert {"assemble", "call_model", "stream", "dispatch_tools", "feedback", "stop"} <= set(titles)
    bars = run.locator(":scope > .timeline .bar")
    assert bars.count() >= 10
    visible = [b for b in bars.all() if (box := b.bounding_box()) is not None and box["width"] >= 2]
    assert len(visible) == bars.count()
    assert run.locator(":scope > .timeline .bar.denied").count() == 1
    assert run.locator(":scope > .timeline .tl-head").count() == 1  # the subagent, nested

    stream = page.locator("section#run2")
    findings = audit_report(RICH / "stream.jsonl").findings
    assert stream.locator(":scope > .top .finding").count() == len(findings) > 0

    # clicking a move shows the state after it, with what it changed
    page.locator('section#run1 tr.move[data-move="12"]').click()
    panel = page.locator('.state[data-run="run1"]')
    assert "reactive_compact_retry" in panel.inner_text()
    changed = panel.locator("tr.changed th").all_text_contents()
    assert "has_attempted_reactive_compact" in changed and "phase" in changed
    # and so does a tick on the timeline
    page.locator('section#run1 .move-tick[data-move="16"]').click()
    assert "settle" in panel.inner_text() and "completed" in panel.inner_text()

    # a finding's line link opens the file's lines at that line
    first = findings[0]
    stream.locator(f':scope > .top a.line-link[href="#run2-L{first.line}"]').first.click()
    target = page.locator(f"#run2-L{first.line}")
    assert target.is_visible()
    assert "hit" in (target.get_attribute("class") or "")

    page.locator('section#run1 tr.move[data-move="12"]').click()
    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert errors == []
