"""The pytest plugin: its fixtures, its reference lookup, and how little it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentfsm.testing import (
    EXHAUSTED_TEXT,
    Scenario,
    ScriptedModel,
    ScriptedServer,
    ToolUseBlock,
    find_reference_dir,
    text_response,
)
from agentfsm.testing.plugin import REFERENCE_ENV


def test_workspace_files(agentfsm_workspace: Path) -> None:
    assert agentfsm_workspace.is_absolute()
    assert {p.name: p.read_text().strip() for p in agentfsm_workspace.iterdir()} == {
        "probe-fixture.txt": "AGENT_LOOP_FILE_MARKER",
        "a.txt": "ALPHA",
        "b.txt": "BETA",
    }


def test_scripted_model_from_every_source(
    agentfsm_model: Callable[..., ScriptedModel], agentfsm_workspace: Path, tmp_path: Path
) -> None:
    raw = {
        "prompt": "p",
        "responses": [
            {"blocks": [{"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "$WS/a.txt"}}]}
        ],
    }
    path = tmp_path / "s.json"
    path.write_text(json.dumps(raw))
    expected = {"file_path": f"{agentfsm_workspace}/a.txt"}
    for source in (raw, path, str(path), Scenario("p", ()), raw["responses"]):
        model = agentfsm_model(source)
        assert isinstance(model, ScriptedModel)
        if model.scenario is not None and model.scenario.responses:
            block = model.scenario.responses[0].blocks[0]  # type: ignore[union-attr]
            assert isinstance(block, ToolUseBlock) and block.input == expected
    model = agentfsm_model(lambda req, n: text_response("x"), per_session=True)
    assert model.scenario is None and model.per_session


async def test_scripted_server_fixture(agentfsm_server: Callable[..., ScriptedServer]) -> None:
    import anthropic

    server = agentfsm_server([{"blocks": [{"type": "text", "text": "$WS"}]}])
    async with anthropic.AsyncAnthropic(base_url=server.base_url, api_key="sk-test", max_retries=0) as c:
        first = await c.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        second = await c.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert first.content[0].text.startswith("/") and second.content[0].text == EXHAUSTED_TEXT


def test_reference_fixtures(
    agentfsm_reference_scenario: Callable[[str], Scenario],
    agentfsm_reference_observed: Callable[[str], dict[str, Any]],
    agentfsm_workspace: Path,
) -> None:
    scenario = agentfsm_reference_scenario("parallel_reads")
    assert scenario.prompt == "PARALLEL"
    assert str(agentfsm_workspace) in json.dumps(scenario.to_dict())
    assert agentfsm_reference_observed("parallel_reads")["result"]["text"] == "DONE"


def test_find_reference_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REFERENCE_ENV, raising=False)
    (tmp_path / "shared" / "reference" / "scenarios").mkdir(parents=True)
    (tmp_path / "repo").mkdir()
    assert find_reference_dir(tmp_path / "repo") == (tmp_path / "shared" / "reference").resolve()
    monkeypatch.setenv(REFERENCE_ENV, str(tmp_path / "shared" / "reference"))
    assert find_reference_dir() == (tmp_path / "shared" / "reference").resolve()
    monkeypatch.setenv(REFERENCE_ENV, str(tmp_path / "nowhere"))
    assert find_reference_dir(tmp_path / "repo") is None


def _run(
    code_or_args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *code_or_args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_plugin_import_is_light(tmp_path: Path) -> None:
    probe = (
        "import sys, agentfsm.testing.plugin; "
        "heavy = ('hypothesis', 'anthropic', 'jsonschema', 'agentfsm.llm.model', 'agentfsm.testing.scenario'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    done = _run(["-c", probe], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


USER_TESTS = textwrap.dedent("""
    def test_fixtures(agentfsm_workspace, agentfsm_model):
        model = agentfsm_model([{"blocks": [{"type": "text", "text": "hi"}]}])
        assert (agentfsm_workspace / "a.txt").exists() and model.count == 0

    def test_reference(agentfsm_reference_scenario):
        agentfsm_reference_scenario("read_probe")
""")


def test_plugin_is_opt_in(tmp_path: Path) -> None:
    """Installing agentfsm adds nothing to someone else's pytest run: no fixtures, no markers."""
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"], tmp_path)
    assert "fixture 'agentfsm_workspace' not found" in done.stdout, done.stdout + done.stderr
    markers = _run(["-m", "pytest", "--markers", "-p", "no:cacheprovider"], tmp_path)
    assert "agentfsm" not in markers.stdout and "@pytest.mark.server" not in markers.stdout


@pytest.mark.parametrize("how", ["-p", "conftest"])
def test_plugin_fixtures_when_asked(tmp_path: Path, how: str) -> None:
    """A project outside this repository gets the namespaced fixtures with `-p agentfsm.testing.plugin`
    or `pytest_plugins` in its conftest."""
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "test_user.py"]
    if how == "-p":
        args[2:2] = ["-p", "agentfsm.testing.plugin"]
    else:
        (tmp_path / "conftest.py").write_text('pytest_plugins = ("agentfsm.testing.plugin",)\n')
    done = _run(args, tmp_path, {REFERENCE_ENV: str(tmp_path / "no-such-dir")})
    assert "1 passed, 1 skipped" in done.stdout, done.stdout + done.stderr
    assert "no reference observations" in done.stdout
