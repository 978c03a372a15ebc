"""The hand-made mutant set (``bench/handmade/``) is well formed and still applies to the code.

Each mutant is an exact-snippet replacement; when the code it mutates is edited, its ``old`` snippet
may stop occurring exactly once. This fails then, with the mutant and how to refresh it, so the set
never silently shrinks to the mutants that still apply. Running the mutants against the tests is
``bench/handmade.py``'s job (an hour or more), not the suite's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import handmade  # noqa: E402

MODULES = handmade.campaign_modules()
RAW = handmade.load()


def test_every_mutant_is_well_formed_and_its_snippet_occurs_exactly_once() -> None:
    found = handmade.problems(RAW, MODULES)
    assert found == [], "bench/handmade/ no longer applies:\n" + "\n".join(found)


def test_every_campaign_module_has_hand_made_mutants() -> None:
    covered = {r["module"] for r in RAW}
    assert set(MODULES) - covered == set(), "write hand-made mutants (bench/handmade/<module>.toml) for these"


def test_the_mutants_are_not_all_of_one_kind() -> None:
    # the set is of the slips the operators cannot make: several kinds, none dominant
    kinds = [r["slip"] for r in RAW]
    assert len(set(kinds)) >= 10
    assert max(kinds.count(k) for k in set(kinds)) <= len(kinds) // 3


def test_a_stale_snippet_is_reported_with_how_to_refresh_it(tmp_path: Path) -> None:
    (tmp_path / "fsm").mkdir()
    (tmp_path / "fsm" / "x.py").write_text("a = 1\nb = a + 1\nc = a + 1\n")
    modules = {"x": {"path": "fsm/x.py", "tests": []}}
    base = {"module": "x", "source": "bench/handmade/x.toml", "file": "fsm/x.py", "slip": "off-by-one",
            "why": "w"}
    ok = {**base, "id": "x.ok", "old": "b = a + 1", "new": "b = a"}
    assert handmade.problems([ok], modules, tmp_path) == []
    gone = {**base, "id": "x.gone", "old": "d = a", "new": "d = 0"}
    twice = {**base, "id": "x.twice", "old": "a + 1", "new": "a"}
    broken = {**base, "id": "x.broken", "old": "b = a + 1", "new": "b = ("}
    [g] = handmade.problems([gone], modules, tmp_path)
    assert "'x.gone'" in g and "occurs 0 times" in g and "refresh the mutant" in g
    [t] = handmade.problems([twice], modules, tmp_path)
    assert "occurs 2 times" in t and "unique" in t
    [b] = handmade.problems([broken], modules, tmp_path)
    assert "does not parse" in b
    assert len(handmade.problems([ok, {**ok, "old": "c = a + 1"}], modules, tmp_path)) == 1  # the id twice
    [u] = handmade.problems([{**ok, "slip": "typo"}], modules, tmp_path)
    assert "slip 'typo'" in u
    [w] = handmade.problems([{**ok, "file": "fsm/y.py"}], modules, tmp_path)
    assert "is not x's path" in w


@pytest.mark.parametrize("entry", RAW, ids=[r.get("id", "?") for r in RAW])
def test_each_mutant_changes_its_file(entry: dict) -> None:
    text = (REPO / entry["file"]).read_text()
    assert text.replace(entry["old"], entry["new"], 1) != text
