"""The layer contracts (pyproject's ``[tool.importlinter]``), checked with import-linter against the
layout users install: agentfsm, with agentfsm.tools and agentfsm.hooks inside it. The repository keeps
fsm/, tools/ and hooks/ side by side, so the check runs on a build of the project installed into a
scratch directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    target = tmp_path_factory.mktemp("installed")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(REPO)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shutil.copy(REPO / "pyproject.toml", target / "pyproject.toml")
    yield target


def lint(where: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run([exe, "pyproject.toml", "--no-cache"], cwd=where, env=env, capture_output=True, text=True,
                          timeout=120)


def test_one_top_level_name(installed: Path) -> None:
    """Installing agentfsm creates exactly one importable top-level name."""
    # (bin/ holds the console script)
    tops = {p.name for p in installed.iterdir()
            if p.is_dir() and p.name != "bin" and not p.name.endswith((".dist-info", "__pycache__"))}
    assert tops == {"agentfsm"}
    assert (installed / "agentfsm" / "tools" / "read.py").exists()
    assert (installed / "agentfsm" / "hooks" / "gate.py").exists()
    assert (installed / "agentfsm" / "auditing" / "claude_code" / "transcript.py").exists()
    assert (installed / "agentfsm" / "hooks" / "examples" / "block_dangerous_bash.py").exists()


def test_the_contracts_hold(installed: Path) -> None:
    done = lint(installed)
    assert done.returncode == 0, done.stdout + done.stderr
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in done.stdout


def test_a_broken_arrow_is_caught(installed: Path, tmp_path: Path) -> None:
    """The check can fail: the engine importing the hooks breaks two contracts."""
    copy = tmp_path / "copy"
    shutil.copytree(installed, copy)
    driver = copy / "agentfsm" / "runtime" / "driver.py"
    driver.write_text(driver.read_text() + "\nimport agentfsm.hooks  # noqa\n")
    done = lint(copy)
    assert done.returncode != 0
    assert "The engine never imports the hooks, the session layer or the testing kit BROKEN" in done.stdout
