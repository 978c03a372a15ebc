"""Accepted differences from Claude Code are data: ``tests/fidelity/accepted.json`` lists, per scenario
(or ``*`` for all) and per compared field, why agentfsm differs on purpose. The differential test
(``tests/test_fidelity_cc.py``) and the regression fixtures (``tests/test_oracle_regressions.py``)
accept exactly those, and docs/compatibility.md shows them as a table rendered from the file, so the
documentation cannot list a difference the tests do not accept, or leave one out.

Regenerate the table after editing the file: ``python tests/test_fidelity_accepted.py --write``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from test_fidelity_cc import HERE, RESULT_FIELDS, SCENARIOS, accepted

DOC = Path(__file__).resolve().parents[1] / "docs" / "compatibility.md"
START, END = "<!-- accepted:start (rendered from tests/fidelity/accepted.json) -->", "<!-- accepted:end -->"
# the keys tests/test_fidelity_cc.differences() can report, and those agentfsm conform adds
# (agentfsm.testing.oracle.conform_differences; ``request[]`` stands for every request)
FIELD = re.compile(r"tool_result\[\d+\]|history|tools|n_requests|ws|out|exit|path|counters|request\[\]|result\.("
                   + "|".join(RESULT_FIELDS) + ")")


def _cell(text: str) -> str:
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("\n", " ")
            .replace("<", "&lt;"))


def render() -> str:
    rows = ["| scenario | compared field | why |", "|---|---|---|"]
    for scenario, entries in accepted().items():
        for field, why in entries.items():
            where = "every scenario" if scenario == "*" else f"`{scenario}`"
            rows.append(f"| {where} | `{field}` | {_cell(why)} |")
    return "\n".join([START, *rows, END])


def _block(text: str) -> str:
    i, j = text.index(START), text.index(END) + len(END)
    return text[i:j]


def test_every_accepted_difference_names_a_scenario_a_compared_field_and_why() -> None:
    raw = json.loads((HERE / "accepted.json").read_text())
    assert isinstance(raw.get("_about"), str)
    for scenario, entries in accepted().items():
        assert scenario == "*" or scenario in SCENARIOS, f"{scenario}: no such scenario"
        for field, why in entries.items():
            assert FIELD.fullmatch(field), f"{scenario}: {field!r} is not a field the differential test compares"
            assert isinstance(why, str) and len(why) > 20, f"{scenario}.{field}: say why"


def test_the_docs_list_exactly_the_accepted_differences() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert START in text and END in text, "docs/compatibility.md lost its accepted-differences table"
    assert _block(text) == render(), "stale: run python tests/test_fidelity_accepted.py --write"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text.replace(_block(text), render()), encoding="utf-8")
