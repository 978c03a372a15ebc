"""Regression fixtures for divergences from Claude Code 2.1.332 that were found and fixed (issue 27).

Each fixture is a scenario of the differential test (``tests/fidelity/scenarios/NAME.json``: files,
command line, scripted model) and, in ``tests/fidelity/recorded/NAME.json``, two recorded runs of it
reduced to what that test compares — Claude Code's, and agentfsm's from before the fix — plus every
request's canonical shape. They replay without Claude Code:

- agentfsm, run now on the scenario, shows and decides what the recorded Claude Code run did (the
  differences of ``tests/test_fidelity_cc.py``, less ``tests/fidelity/accepted.json``), request by
  request;
- the recorded pre-fix agentfsm run differs from it on the very keys the fix is about, so the
  comparison is able to see the divergence (a fixture that cannot fail proves nothing).

With ``$AGENTFSM_CLAUDE`` set (or ``claude`` on PATH), the opt-in live test runs Claude Code itself on
each scenario and checks that it still does what was recorded, and that agentfsm still matches it.

Recording (the pre-fix package is an older checkout's ``fsm/``, ``tools/`` and ``hooks/`` laid out as
``DIR/agentfsm``, ``DIR/agentfsm/tools``, ``DIR/agentfsm/hooks``)::

    AGENTFSM_CLAUDE=... python tests/test_oracle_regressions.py NAME --before DIR
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_fidelity_cc import CLAUDE, HERE, _is_preamble, accepted, canon, differences, run_client

RECORDED = HERE / "recorded"
REGRESSIONS = sorted(p.stem for p in RECORDED.glob("*.json"))
# what a recording keeps of a run (besides the reduced history and the requests' shapes)
KEPT = ("tools", "result", "n_requests", "ws", "out")
# Claude Code wraps a hook's output in a provenance preamble of its own prompt; it is not stored here
# (it is not a protocol text, and the history's wording of hook feedback is an accepted difference)
HOOK_PREAMBLE = re.compile(r"(<system-reminder>\n)The text below is the output of a hook.*?(Stop hook feedback:)",
                           re.DOTALL)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return HOOK_PREAMBLE.sub(r"\1[Claude Code's hook provenance text: not stored]\n\2", value)
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


def _history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without the first message's context preamble (the client's own prompt text, which
    the comparison leaves out) and without thinking."""
    out = []
    for i, m in enumerate(messages):
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        kept = [b for b in content if not (i == 0 and _is_preamble(b))
                and b.get("type") not in ("thinking", "redacted_thinking")]
        out.append({"role": m["role"], "content": kept})
    return _scrub(out)


def reduce_run(run: dict[str, Any], client: str) -> dict[str, Any]:
    """A run as a recording keeps it: what the differential test compares, and each request's shape."""
    return {"client": client, "history": _history(run["history"]),
            "requests": [canon({"history": _history(body)})["shape"] for body in run["bodies"]],
            **{k: run[k] for k in KEPT}}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def new_differences(cc: dict[str, Any], af: dict[str, Any], name: str) -> dict[str, Any]:
    """The differences of the differential test not accepted for ``name``, plus one per request whose
    shape differs (unless the history's wording is an accepted difference of the scenario)."""
    allowed = {**accepted().get("*", {}), **accepted().get(name, {})}
    out = {k: v for k, v in differences(cc, af).items() if k not in allowed}
    if "history" not in allowed:
        for i, (x, y) in enumerate(zip(cc["requests"], af["requests"], strict=False)):
            if x != y:
                out[f"request[{i}]"] = (x, y)
    return _jsonable(out)


def recording(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


# --- the tests ---------------------------------------------------------------------------------------


def test_every_regression_is_a_scenario_of_the_differential_test_and_says_what_it_fixed() -> None:
    assert {"stop_hook_active_after_tool_turn", "unparsable_tool_input"} <= set(REGRESSIONS)
    for name in REGRESSIONS:
        assert (HERE / "scenarios" / f"{name}.json").is_file(), name
        rec = recording(name)
        assert rec["claude_code"]["client"].startswith("Claude Code 2.1.332")
        assert rec["diverged_on"] and len(rec["fixed"]) > 40, name


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("name", REGRESSIONS)
def test_agentfsm_now_does_what_the_recorded_claude_code_run_did(name: str, tmp_path: Path) -> None:
    rec = recording(name)
    now = _jsonable(reduce_run(run_client(name, "af", tmp_path), "agentfsm"))
    assert now["result"] is not None
    new = new_differences(rec["claude_code"], now, name)
    assert not new, json.dumps(new, indent=1, ensure_ascii=False)[:8000]


@pytest.mark.parametrize("name", REGRESSIONS)
def test_the_recorded_divergence_is_one_the_comparison_sees(name: str) -> None:
    """Replayed without running anything: the pre-fix agentfsm run differs from Claude Code's on the
    keys the fixture names, so the test above would have failed before the fix."""
    rec = recording(name)
    before = new_differences(rec["claude_code"], rec["agentfsm_before"], name)
    assert set(rec["diverged_on"]) <= set(before), sorted(before)


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("name", REGRESSIONS)
def test_claude_code_still_does_what_was_recorded(name: str, tmp_path: Path) -> None:
    if CLAUDE is None:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    rec = recording(name)
    cc = _jsonable(reduce_run(run_client(name, "cc", tmp_path / "cc"), "Claude Code"))
    same = {k: (rec["claude_code"][k], cc[k]) for k in ("n_requests", "result", "requests", "ws", "out")
            if rec["claude_code"][k] != cc[k]}
    assert not same, json.dumps(same, indent=1, ensure_ascii=False)[:8000]
    assert canon(cc)["results"] == canon(rec["claude_code"])["results"]
    af = _jsonable(reduce_run(run_client(name, "af", tmp_path / "af"), "agentfsm"))
    new = new_differences(cc, af, name)
    assert not new, json.dumps(new, indent=1, ensure_ascii=False)[:8000]


# --- recording ---------------------------------------------------------------------------------------


def record(name: str, before: str, fixed: str) -> dict[str, Any]:
    """Run ``name`` with Claude Code and with the pre-fix agentfsm in ``before``; the recording."""
    if CLAUDE is None:
        raise SystemExit("set $AGENTFSM_CLAUDE to Claude Code 2.1.332")
    root = Path(tempfile.mkdtemp(prefix="oracle-"))
    version = run_version()
    cc = _jsonable(reduce_run(run_client(name, "cc", root / "cc"), f"Claude Code {version}"))
    old = _jsonable(reduce_run(run_client(name, "af", root / "af", pythonpath=before), "agentfsm before the fix"))
    return {"_about": "Recorded by tests/test_oracle_regressions.py (see its docstring); replayed without Claude Code.",
            "fixed": fixed, "diverged_on": sorted(new_differences(cc, old, name)),
            "claude_code": cc, "agentfsm_before": old}


def run_version() -> str:
    import subprocess

    done = subprocess.run([str(CLAUDE), "--version"], capture_output=True, text=True, timeout=60,
                          env={"HOME": tempfile.mkdtemp(), "PATH": "/usr/bin:/bin"})
    return done.stdout.split()[0] if done.stdout.split() else "unknown"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="record a regression fixture of a fixed divergence")
    ap.add_argument("name")
    ap.add_argument("--before", required=True, help="directory holding the pre-fix agentfsm package")
    ap.add_argument("--fixed", required=True, help="what the fix changed, in words")
    args = ap.parse_args()
    out = record(args.name, args.before, args.fixed)
    RECORDED.mkdir(exist_ok=True)
    (RECORDED / f"{args.name}.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(args.name, "diverged on", out["diverged_on"], file=sys.stderr)
