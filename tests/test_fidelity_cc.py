"""Opt-in differential test: Claude Code 2.1.332 and agentfsm run the same scripted scenarios, and what
the model is shown and what the run decides must be the same, down to the text (issue 14).

Each scenario (``tests/fidelity/scenarios/NAME.json``) gives the workspace's files, the command line
and the scripted model responses. Both clients run it in a fresh workspace (``ws/``), beside a
directory outside it (``out/``), with a scratch HOME, against their own scripted server. Compared,
with the run's paths written ``$WS``, ``$OUT``, ``$HOME``: every tool_result (text and error flag), the
shape of the history sent back (the blocks other than tool_results), the tools offered, the result's
fields, the files left in ``ws/`` and ``out/``, and the number of model requests.

A difference fails the test unless ``tests/fidelity/accepted.json`` lists it, with why (the same
reasons are in docs/compatibility.md). Normalised before comparing, because they are not
about tools: Claude Code's ``<total_tokens>`` budget reminder (and the right-trim it does before
adding it), the preamble reminders of the first message, the saved path of a persisted output
(random in Claude Code), and the echo of a tool_use's input (Claude Code echoes it parsed, with
defaults filled in).

Claude Code is located with ``$AGENTFSM_CLAUDE``, else ``claude`` on PATH; without it the test skips.
``AGENTFSM_FIDELITY_JOBS`` sets how many runs go at once (default 4).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentfsm.testing import oracle
from agentfsm.testing.oracle import (  # noqa: F401  (the regression fixtures import them from here)
    DEFAULT_TOOLS,
    MODEL,
    RESULT_FIELDS,
    canon,
    differences,
)
from agentfsm.testing.oracle import is_preamble as _is_preamble  # noqa: F401

# the first test waits for every run (about 4 minutes on 2 cores), so the timeout is the whole batch's
pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(1800)]

HERE = Path(__file__).parent / "fidelity"
SCENARIOS = sorted(p.stem for p in (HERE / "scenarios").glob("*.json"))
CLAUDE = os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")


def accepted() -> dict[str, dict[str, str]]:
    """``{scenario or "*": {difference key: why}}``."""
    data = json.loads((HERE / "accepted.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def run_client(name: str, client: str, root: Path, *, agentfsm: list[str] | None = None,
               pythonpath: str | None = None) -> dict[str, Any]:
    """One scenario with one client (:func:`agentfsm.testing.oracle.run_client`, in ``root/NAME/CLIENT``).
    ``agentfsm``: the command that runs agentfsm (default: this interpreter's ``-m agentfsm``);
    ``pythonpath``: put first on its import path (an older copy of the package, to record how it
    diverged)."""
    scen = json.loads((HERE / "scenarios" / f"{name}.json").read_text())
    return oracle.run_client(scen, client, root / name / client, claude=CLAUDE or "claude", agentfsm=agentfsm,
                             pythonpath=pythonpath)


# --- the test ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    if CLAUDE is None:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    root = tmp_path_factory.mktemp("fidelity")
    jobs = int(os.environ.get("AGENTFSM_FIDELITY_JOBS", "4"))
    with cf.ThreadPoolExecutor(jobs) as pool:
        futures = {(n, c): pool.submit(run_client, n, c, root) for n in SCENARIOS for c in ("cc", "af")}
        done: dict[tuple[str, str], Any] = {}
        for key, fut in futures.items():
            try:
                done[key] = fut.result()
            except Exception as exc:  # reported by the scenario's own test
                done[key] = exc
    return done


def test_there_are_enough_scenarios_and_every_accepted_difference_says_why() -> None:
    assert len(SCENARIOS) >= 30
    for scenario, entries in accepted().items():
        assert scenario == "*" or scenario in SCENARIOS, scenario
        assert all(isinstance(why, str) and len(why) > 20 for why in entries.values()), scenario


@pytest.mark.parametrize("name", SCENARIOS)
def test_agentfsm_shows_and_decides_what_claude_code_does(name: str, runs: dict[tuple[str, str], Any]) -> None:
    cc, af = runs[(name, "cc")], runs[(name, "af")]
    for client, run in (("Claude Code", cc), ("agentfsm", af)):
        if isinstance(run, Exception):
            raise AssertionError(f"{client} did not run {name}: {run!r}")
        assert run["result"] is not None, f"{client} gave no result for {name}: {run['stderr']}"
    allowed = {**accepted().get("*", {}), **accepted().get(name, {})}
    new = {k: v for k, v in differences(cc, af).items() if k not in allowed}
    assert not new, "differences not in tests/fidelity/accepted.json:\n" + json.dumps(
        new, indent=1, ensure_ascii=False, default=str)[:12000]
