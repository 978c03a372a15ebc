"""The documentation: the README stays a short user's guide, the MkDocs site (docs/, mkdocs.yml) builds
in strict mode — a broken link or a missing page fails it, and a stale embedded diagram fails the
check beside it — and every example marked ``<!-- example: run -->`` runs as printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentfsm import diagram

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = re.compile(r"<!-- example: run -->\s*```(?P<lang>sh|python)\n(?P<code>.*?)```", re.DOTALL)


def _mkdocs() -> list[str]:
    exe = Path(sys.executable).parent / "mkdocs"
    if not exe.exists():
        pytest.skip("mkdocs is not installed (it is in the `docs` extra, part of `test`): pip install -e '.[docs]'")
    return [str(exe)]


def _build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([*_mkdocs(), "build", "--strict", "-f", str(config), "-d", str(out)], cwd=config.parent,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_readme_is_a_short_users_guide() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    for job in ("## 1. Audit a run", "## 2. Property-test", "## 3. Draw", "## 4. The headless agent"):
        assert job in text, job
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    proc = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "loop" / "index.html").is_file()
    assert (tmp_path / "site" / "diagrams" / "overview.svg").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The gate is real: the same site with one link to a page that does not exist does not build."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=True)
    shutil.copytree(ROOT / "diagrams", copy / "diagrams")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "install.md", "a", encoding="utf-8") as fh:
        fh.write("\nSee [the missing page](no-such-page.md).\n")
    proc = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stdout + proc.stderr


def test_the_embedded_diagrams_are_current() -> None:
    pages = diagram.embedding_pages(ROOT)
    assert pages and pages[0] == ROOT / diagram.DOCS_PAGE
    assert [p for page in pages for p in diagram.readme_problems(page)] == []


def _examples() -> list[tuple[str, str, str]]:
    found = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for n, m in enumerate(MARK.finditer(page.read_text(encoding="utf-8")), 1):
            found.append((f"{page.relative_to(ROOT)}#{n}", m["lang"], m["code"]))
    return found


@pytest.mark.slow
def test_the_marked_examples_run_as_printed(tmp_path: Path) -> None:
    """In order, in one fresh folder (a later example may use what an earlier one made), with the
    installed `agentfsm` first on PATH and a home of its own; no API key."""
    examples = _examples()
    assert len(examples) >= 4, "the README lost its runnable examples"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HOME"] = str(tmp_path / "home")
    work = tmp_path / "work"
    work.mkdir()
    for name, lang, code in examples:
        argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{name} failed:\n{code}\n{proc.stdout}\n{proc.stderr}"


def test_the_driver_stays_within_the_size_issue_31_set_and_the_docs_say_its_size() -> None:
    """Issue 31: the ``Driver`` class performs phases, at most ~450 lines; a job that is not performing
    a phase goes to a module of its own (docs/contributing.md, "Where the runtime's jobs live")."""
    import ast

    tree = ast.parse((ROOT / "fsm" / "runtime" / "driver.py").read_text())
    [driver] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Driver"]
    size = (driver.end_lineno or 0) - driver.lineno + 1
    assert size <= 455, f"the Driver class is {size} lines: move a whole job out of it (docs/contributing.md)"
    stated = re.search(r"the `Driver` class is (\d+) lines", (ROOT / "docs" / "contributing.md").read_text())
    assert stated is not None, "docs/contributing.md no longer states the Driver's size"
    assert abs(int(stated.group(1)) - size) <= 15, f"docs/contributing.md says {stated.group(1)} lines; it is {size}"
