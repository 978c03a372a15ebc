"""``agentfsm conform``: differential property testing against an oracle (issue 27).

- Without Claude Code: the oracle is a second agentfsm configuration with a planted bug — next_turn's
  effect keeps the max-output-tokens recovery count, the bug that passed 1,200 generated runs of the kit
  (the auditor replays the same declaration). ``conform`` finds it, shrinks it to a small case and writes
  the fixture; against an unplanted agentfsm the same search finds nothing.
- Every saved fixture (``tests/fidelity/conform/ID.json``: a shrunk case, Claude Code's recorded run and
  agentfsm's from before the fix) replays without Claude Code: agentfsm now does what Claude Code did, and
  the pre-fix run differs on the fields the fixture names (a fixture that cannot fail proves nothing).
- With Claude Code installed (``$AGENTFSM_CLAUDE``, else ``claude`` on PATH): the CI profile, ``conform``
  against Claude Code itself (``$AGENTFSM_CONFORM_EXAMPLES`` examples, default 40).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings

from agentfsm.commandline import conform
from agentfsm.testing.oracle import AGENTFSM, canon, conform_differences, run_client

FIXTURES = Path(__file__).parent / "fidelity" / "conform"
SAVED = sorted(p.stem for p in FIXTURES.glob("*.json"))
# located as the differential test does (tests/test_fidelity_cc.py): $AGENTFSM_CLAUDE, else `claude` on PATH
CLAUDE = os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")

PLANTED = '''\
import sys
from agentfsm.machine import graph

_resets = graph.resets


def planted(trigger, state):
    """next_turn keeps the max-output-tokens recovery count"""
    changes = _resets(trigger, state)
    if trigger == "next_turn":
        changes.pop("max_output_tokens_recovery_count", None)
    return changes


graph.resets = planted
from agentfsm.commandline.cli import main

sys.exit(main())
'''


def _oracle(tmp_path: Path, body: str) -> str:
    path = tmp_path / "oracle"
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


def _conform(*argv: str) -> tuple[int, str, dict[str, Any]]:
    out = io.StringIO()
    code = conform.main([*argv, "--json"], out=out)
    lines = out.getvalue().splitlines()
    return code, out.getvalue(), json.loads(lines[-2])


SMALL = ("--examples", "3", "--only", "max_tokens", "--max-responses", "3", "--seed", "0", "--jobs", "2")


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_conform_finds_a_planted_divergence_and_writes_its_fixture(tmp_path: Path) -> None:
    oracle = _oracle(tmp_path, PLANTED)
    code, text, summary = _conform("--claude", oracle, *SMALL, "--shrink-runs", "4", "--fixtures", str(tmp_path / "fx"))
    assert code == 1, text
    assert text.splitlines()[-1].startswith("conform: 3 examples, "), text
    found = [d for d in summary["divergences"] if "counters" in d["signature"]]
    assert found, text
    fixture = json.loads(Path(found[0]["fixture"]).read_text())
    assert fixture["id"] == found[0]["id"] and fixture["id"] in text  # the id shown is the fixture's
    assert found[0]["size"] <= found[0]["first_size"]
    cc, af = fixture["claude_code"]["counters"], fixture["agentfsm_before"]["counters"]
    assert cc["max_output_tokens_recovery_count"] > af["max_output_tokens_recovery_count"]


class _FakeRunner(conform.Runner):
    """Runs nothing: a case diverges (on ``counters``) when a max_tokens cut is followed by a tool turn,
    the planted bug's condition."""

    def __init__(self) -> None:
        super().__init__("oracle", accepted={}, root=Path("."))

    def run(self, case: Any) -> conform.Outcome:
        key = self.key(case)
        if key not in self.cache:
            self.runs += 1
            stops = [r.get("stop_reason") for r in case["responses"]]
            bad = any(a in ("max_tokens", "model_context_window_exceeded") and b == "tool_use"
                      for a, b in itertools.pairwise(stops))
            diffs = {"counters": ({"n": 1}, {"n": 0})} if bad else {}
            self.cache[key] = conform.Outcome(case, {}, {}, diffs, tuple(diffs))
        return self.cache[key]


def test_a_divergence_is_shrunk_to_its_smallest_case() -> None:
    runner = _FakeRunner()
    strategy = conform.cases(["max_tokens", "hooks", "permissions"], max_responses=5)
    drawn = conform.draw_cases(strategy, 30, 0)
    first = next(o for o in map(runner.run, drawn) if o.unaccepted)
    small, runs = conform.shrink(runner, strategy, 30, 0, ("counters",), 500)
    assert small is not None and small.signature == ("counters",)
    assert runs > 0
    assert len(json.dumps(small.case)) < len(json.dumps(first.case))
    # the smallest: a cut and a tool turn, in the simplest set-up
    assert [r["stop_reason"] for r in small.case["responses"]] == ["max_tokens", "tool_use"]
    assert small.case["args"] == ["--permission-mode", "bypassPermissions"]


def test_shrinking_stops_at_its_budget_of_runs() -> None:
    runner = _FakeRunner()
    strategy = conform.cases(["max_tokens"], max_responses=5)
    runner_runs = [runner.run(c) for c in conform.draw_cases(strategy, 30, 0)]
    assert any(o.unaccepted for o in runner_runs)
    _, runs = conform.shrink(runner, strategy, 30, 0, ("counters",), 3)
    assert runs <= 3


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_conform_against_the_same_agentfsm_finds_nothing(tmp_path: Path) -> None:
    oracle = _oracle(tmp_path, "import sys\nfrom agentfsm.commandline.cli import main\n\nsys.exit(main())\n")
    code, text, summary = _conform("--claude", oracle, "--examples", "3", "--only", "max_tokens,invalid",
                                   "--max-responses", "3")
    assert code == 0, text
    assert text.splitlines()[-1] == "conform: 3 examples, 0 divergences, 0 accepted"
    assert summary["examples"] == 3 and summary["runs"] == 3


def test_bad_input_gets_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert conform.main(["--claude", str(tmp_path / "nothing")]) == 2
    assert "no Claude Code binary" in capsys.readouterr().err
    oracle = _oracle(tmp_path, "")
    assert conform.main(["--claude", oracle, "--only", "telepathy"]) == 2
    assert "unknown families ['telepathy']" in capsys.readouterr().err


@settings(max_examples=60, deadline=None)
@given(conform.cases())
def test_every_drawn_case_is_a_scenario_the_scripted_server_loads(case: dict[str, Any]) -> None:
    from agentfsm.testing.scenario import load_scenario

    scenario = load_scenario({"prompt": case["prompt"], "responses": case["responses"]}, "/ws")
    # (a case with a budget may end with answers that reach it: conform.BUDGETS)
    assert 1 <= len(scenario.responses) <= 5 + (len(conform.BUDGETS) if "--max-budget-usd" in case["args"] else 0)
    assert case["args"][:1] == ["--permission-mode"]
    ids = [b["id"] for r in case["responses"] for b in r.get("blocks", ()) if "id" in b]
    assert len(ids) == len(set(ids))


def test_a_signature_leaves_out_indices_and_consequences() -> None:
    assert conform.signature(["tool_result[3]", "history", "request[2]"]) == ("tool_result[]",)
    assert conform.signature(["history", "request[1]", "n_requests"]) == ("history", "n_requests", "request[]")


# --- saved fixtures -------------------------------------------------------------------------------


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _new(cc: dict[str, Any], af: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    allowed = conform.allowed_for(case, conform.load_accepted(conform.REPO_ACCEPTED))
    return {k: v for k, v in conform_differences(cc, af).items() if not conform.accepted_key(k, allowed)}


def test_every_fixture_says_what_it_fixed() -> None:
    for name in SAVED:
        fx = _fixture(name)
        assert fx["id"] == name == conform.case_id(fx["case"])
        assert fx["claude_code"]["client"].startswith("Claude Code 2.1.332")
        assert fx["diverged_on"] and isinstance(fx["fixed"], str) and len(fx["fixed"]) > 40, name


@pytest.mark.parametrize("name", SAVED)
def test_the_recorded_divergence_is_one_the_comparison_sees(name: str) -> None:
    fx = _fixture(name)
    before = _new(fx["claude_code"], fx["agentfsm_before"], fx["case"])
    assert set(fx["diverged_on"]) <= set(before), sorted(before)


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("name", SAVED)
def test_agentfsm_now_does_what_the_recorded_claude_code_run_did(name: str, tmp_path: Path) -> None:
    fx = _fixture(name)
    now = conform.reduced(run_client(fx["case"], AGENTFSM, tmp_path), "agentfsm")
    new = _new(fx["claude_code"], json.loads(json.dumps(now)), fx["case"])
    assert not new, json.dumps(new, indent=1, ensure_ascii=False)[:8000]


# --- the CI profile against Claude Code ----------------------------------------------------------------


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_claude_code_and_agentfsm_conform(tmp_path: Path) -> None:
    if not CLAUDE:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    examples = os.environ.get("AGENTFSM_CONFORM_EXAMPLES", "40")
    code, text, _ = _conform("--claude", CLAUDE, "--examples", examples, "--fixtures", str(tmp_path / "fx"))
    assert code == 0, text[-12000:]


def test_a_stop_hooks_feedback_is_compared_by_what_it_carries() -> None:
    """A Stop hook that blocks, then background work that reports after the run (recorded with Claude Code
    2.1.332, seed 11's Stop-hook cases with background work): Claude Code quotes the hook's command in a
    reminder of its own and puts its provenance preamble before ``Stop hook feedback:``, in the request after
    the block and in every later one, the notification pass's included. Compared by the reason they carry,
    the runs agree; a different reason still differs, in the history and in each request that carries it."""
    rec = json.loads((Path(__file__).parent / "fixtures" / "conform_compare" / "stop_hook_background.json").read_text())
    cc, af = rec["claude_code"], rec["agentfsm"]
    assert "task_notification" in cc["path"] and cc["n_requests"] == 4
    assert conform_differences(cc, af) == {}
    other = json.loads(json.dumps(af).replace("STOP_MARK", "ANOTHER_REASON"))
    assert set(conform_differences(cc, other)) == {"history", "request[2]", "request[3]"}


@settings(max_examples=60, deadline=None)
@given(conform.cases(["limits", "tools", "parallel", "stream", "errors"]))
def test_a_drawn_budget_is_reached_by_the_first_second_or_third_response(case: dict[str, Any]) -> None:
    """Every streamed response of a case with --max-budget-usd says what it used, so both clients spend the
    same per response and the budget is reached by a known response (the first, second or third), not only
    by the first request, whatever each client's requests weigh."""
    args = case["args"]
    if "--max-budget-usd" not in args:
        assert all("usage" not in r for r in case["responses"])
        return
    budget = float(args[args.index("--max-budget-usd") + 1])
    usage = conform.BUDGET_USAGE
    per_response = (usage["input_tokens"] * 3.0 + usage["output_tokens"] * 15.0) / 1e6  # claude-sonnet-4-5
    k = round(budget / per_response + 0.5)
    assert k in (1, 2, 3) and (k - 1) * per_response < budget < k * per_response
    assert all(r.get("usage") == usage for r in case["responses"] if "blocks" in r)
    # the script holds answers enough to reach any drawn budget (the server's own answer after it would count
    # its input from the request's size, which is each client's own)
    assert sum("blocks" in r for r in case["responses"]) >= len(conform.BUDGETS)


def test_the_budget_reminder_after_a_tool_output_is_compared_after_the_output() -> None:
    """Claude Code 2.1.332's result of a Read with --max-budget-usd reached by the second response (oracle run of
    issue 27, 2026-12-06), and agentfsm's: the reminders agree, the white space before them (the output's own,
    and Claude Code's around its token reminder) is each client's. In a batch of several calls Claude Code puts
    the reminder on the result that completed last, agentfsm on the last in call order (seed 2 of
    ``--only limits,tools,parallel,text,permissions``): compared as the batch's, after its results."""
    tail = "<system-reminder>\nUSD budget: $0.006/$0.009; $0.002999999999999999 remaining\n</system-reminder>"
    tokens = "<system-reminder>\n<total_tokens>14991723 tokens left</total_tokens>\n</system-reminder>"
    cc = "1\tALPHA\n2\tbeta\n3\n\n" + tokens + "\n\n" + tail
    af = "1\tALPHA\n2\tbeta\n3\t\n\n" + tail

    def seen(*texts: str) -> Any:
        run = canon({"history": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{i}", "content": t} for i, t in enumerate(texts)]}]})
        return run["results"], run["shape"]

    assert seen(cc) == seen(af)
    assert seen(cc) != seen(af.replace("0.006/", "0.005/"))
    assert seen("sub/c.py" + "\n\n" + tail, "No matches found") == seen("sub/c.py", "No matches found\n\n" + tail)


@settings(max_examples=80, deadline=None)
@given(conform.cases(["tools", "parallel"]))
def test_a_case_that_reads_a_directory_accepts_what_claude_code_says_of_it(case: dict[str, Any]) -> None:
    """A Read of the workspace's directory: Claude Code leaks Node's EISDIR, agentfsm says what to use instead,
    an accepted difference (``read_directory``) the case brings (seed 1, ``--only limits,tools,parallel,text``:
    ``conform-7801414b1b``)."""
    reads = any(b.get("name") == "Read" and b.get("input", {}).get("file_path") == "$WS/sub"
                for r in case["responses"] for b in r.get("blocks", ()))
    assert reads == ("read_directory" in case.get("accepts", ()))
