"""agentfsm as a guest in someone else's environment: it owns one import name, leaves the host's
logging alone, and keeps working beside generic packages named ``tools`` or ``hooks``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

KIT_RUN = textwrap.dedent("""
    import tools
    from agentfsm.testing.stateful import assert_invariants, run_loop
    from agentfsm.tools.base import tool

    @tool("Add", "Add.", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "required": ["a", "b"]})
    async def add(inp, ctx):
        return str(inp["a"] + inp["b"])

    run = run_loop([{"blocks": [{"type": "tool_use", "id": "t1", "name": "Add", "input": {"a": 1, "b": 2}}]},
                    {"blocks": [{"type": "text", "text": "3"}]}], tools=[add])
    assert_invariants(run)
    print("KIT_OK", run.result.result, "tools from", tools.__file__)
""")


def _run(args: list[str], cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    env.pop("ANTHROPIC_API_KEY", None)
    env["AGENTFSM_HOME"] = str(cwd / "agentfsm-home")  # the demo's session file stays in the test's folder
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _works_beside(shadow: Path, cwd: Path) -> None:
    demo = _run(["-m", "agentfsm", "demo"], cwd, shadow)
    assert demo.returncode == 0, demo.stderr
    (cwd / "probe-fixture.txt").write_text("AGENT_LOOP_FILE_MARKER\n")
    headless = _run(["-m", "agentfsm", "-p", "AGENT_LOOP_PROBE", "--scripted", "read_probe", "--output-format",
                     "json", "--permission-mode", "bypassPermissions", "--sessions-dir", str(cwd / "s")], cwd, shadow)
    assert headless.returncode == 0, headless.stderr
    assert '"terminal_reason": "completed"' in headless.stdout
    kit = _run(["-c", KIT_RUN], cwd, shadow)
    assert kit.returncode == 0, kit.stderr
    assert "KIT_OK 3" in kit.stdout and str(shadow) in kit.stdout


def test_a_project_with_its_own_tools_and_hooks_packages(tmp_path: Path) -> None:
    """An agent project commonly has `tools/` and `hooks/` packages of its own, first on sys.path."""
    project = tmp_path / "project"
    for name in ("tools", "hooks"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(f"OWN = {name!r}\n")
    _works_beside(project, tmp_path)


@pytest.mark.slow
def test_the_tools_distribution_from_pypi_does_not_break_it(tmp_path: Path) -> None:
    """`pip install tools==1.0.38` (a popular distribution with a top-level `tools` package) beside
    agentfsm: it used to overwrite ours."""
    target = tmp_path / "site"
    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                          "tools==1.0.38"], capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"the package index cannot provide tools==1.0.38 here: {got.stderr.strip()[-200:]}")
    assert (target / "tools" / "tools.py").exists()
    _works_beside(target, tmp_path)


HOST_APP = textwrap.dedent("""
    import asyncio, sys
    import structlog
    structlog.configure(processors=[structlog.processors.KeyValueRenderer(key_order=["event"])],
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    host = structlog.get_logger("host")
    host.error("HOST_BEFORE")

    import agentfsm
    from agentfsm.testing import ScriptedModel

    async def main():
        opts = agentfsm.Options(tools=(), cwd=".", write_trace=False, setting_sources=())
        model = ScriptedModel([{"blocks": [{"type": "text", "text": "hi"}]}])
        return [m async for m in agentfsm.query("hello", options=opts, client=model)]

    msgs = asyncio.run(main())
    host.error("HOST_AFTER")
    print("RESULT", msgs[-1]["result"])
""")


def test_a_host_that_configured_structlog_keeps_its_logging(tmp_path: Path) -> None:
    done = _run(["-c", HOST_APP], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "event='HOST_BEFORE'" in done.stderr and "event='HOST_AFTER'" in done.stderr
    # agentfsm's own events went through the host's configuration too
    assert "event='loop.transition'" in done.stderr
    assert done.stdout.strip() == "RESULT hi"


def test_an_unconfigured_host_gets_nothing_on_stdout(tmp_path: Path) -> None:
    app = HOST_APP.replace("structlog.configure(", "(lambda **_: None)(")
    done = _run(["-c", app], tmp_path)
    assert done.returncode == 0, done.stderr
    # the host's own lines go where an unconfigured structlog sends them; none of agentfsm's do
    assert done.stdout.splitlines()[-1] == "RESULT hi"
    assert "loop.transition" not in done.stdout + done.stderr
    # and structlog is still unconfigured afterwards: agentfsm configured nothing
    check = _run(["-c", app + "\nimport structlog; print('CONFIGURED', structlog.is_configured())"], tmp_path)
    assert "CONFIGURED False" in check.stdout
