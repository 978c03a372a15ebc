"""Every finding an auditor can raise is declared in agentfsm.auditing.checks.CODES (what `agentfsm
audit --codes` lists), and every declared code is raised somewhere. Two mechanisms hold it: a Finding
refuses an undeclared code where it is made, and the auditors' sources are read for the codes they
raise (issue 35: dropping any of 24 entries of CODES went unnoticed by the suite)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from agentfsm.auditing.checks import CODES, Finding

FSM = Path(__file__).resolve().parents[1] / "fsm"


def raised_codes() -> dict[str, set[str]]:
    """The codes the sources raise, with where: the second argument of ``Finding(...)`` and of the
    auditors' ``add``/``find`` helpers when it is written out, and the first of a ``(code, f"...")``
    pair the shared checks yield."""
    found: dict[str, set[str]] = {}
    for path in sorted(FSM.rglob("*.py")):
        auditing = "auditing" in path.parts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            code = None
            if isinstance(node, ast.Call) and len(node.args) >= 3:
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                arg = node.args[1]
                if name in ("Finding", "add", "find") and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    code = arg.value
            elif (auditing and isinstance(node, ast.Tuple) and len(node.elts) == 2
                  and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str)
                  and isinstance(node.elts[1], ast.JoinedStr)):
                code = node.elts[0].value
            if code is not None:
                found.setdefault(code, set()).add(str(path.relative_to(FSM.parent)))
    return found


def test_every_raised_code_is_declared_and_every_declared_one_raised() -> None:
    found = raised_codes()
    assert len(found) > 40, "the scan no longer sees how findings are raised"
    undeclared = {code: sorted(where) for code, where in found.items() if code not in CODES}
    assert not undeclared, f"raised but not declared in CODES: {undeclared}"
    assert not set(CODES) - set(found), f"declared but never raised: {sorted(set(CODES) - set(found))}"


def test_a_finding_with_an_undeclared_code_is_refused_where_it_is_made() -> None:
    with pytest.raises(ValueError, match="'no_such_code' is not declared"):
        Finding(1, "no_such_code", "m")
    assert Finding(1, "seq_order", "m").code == "seq_order"


def test_every_code_says_what_it_means() -> None:
    assert all(isinstance(doc, str) and len(doc.split()) >= 4 for doc in CODES.values())
