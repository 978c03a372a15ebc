"""constraints.txt pins every distribution the test extra brings in, so a fresh clone installs the
versions the suite last passed with (the README's install command and .ci/run read it)."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"


def pins(text: str) -> dict[str, str]:
    """``name==version`` lines by canonical name; anything else (but comments and blanks) is an error."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if match is None:
            raise ValueError(f"constraints.txt line {number}: not a name==version pin: {raw!r}")
        name = canonicalize_name(match[1])
        if name in out:
            raise ValueError(f"constraints.txt line {number}: {match[1]} is pinned twice")
        out[name] = match[2]
    return out


def closure(dist: str, extras: frozenset[str]) -> set[str]:
    """The canonical names of every distribution that installing ``dist[extras]`` brings in, read from
    the installed metadata (markers evaluated for this interpreter and platform)."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(dist, extras)]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in done:
            continue
        done.add((name, wanted))
        for spec in metadata.requires(name) or ():
            req = Requirement(spec)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            child = canonicalize_name(req.name)
            if child != canonicalize_name(dist):
                seen.add(child)
            todo.append((req.name, frozenset(req.extras)))
    return seen


def test_every_distribution_of_the_test_extra_is_pinned() -> None:
    try:
        needed = closure("agentfsm", frozenset({"test"}))
    except metadata.PackageNotFoundError as exc:
        pytest.skip(f"agentfsm[test] is not installed here ({exc}): install it as the README says")
    pinned = pins(CONSTRAINTS.read_text(encoding="utf-8"))
    missing = sorted(needed - set(pinned))
    assert not missing, f"constraints.txt does not pin {missing}: see its header for how to refresh it"
    assert pinned["claude-agent-sdk"] == "0.2.189", "docs/sdk.md's table is read from claude-agent-sdk 0.2.189"


def test_the_install_commands_read_the_constraints() -> None:
    command = "pip install -c constraints.txt -e '.[test]'"
    for doc in ("README.md", "docs/install.md"):
        assert command in (ROOT / doc).read_text(encoding="utf-8"), doc
    assert "pip install -q -c constraints.txt -e '.[test]'" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_a_line_that_is_not_a_pin_is_a_clear_error() -> None:
    assert pins("# header\n\nAttrs==26.1.0  # why\n") == {"attrs": "26.1.0"}
    with pytest.raises(ValueError, match="line 2: not a name==version pin"):
        pins("attrs==26.1.0\nruff>=0.5\n")
    with pytest.raises(ValueError, match="pinned twice"):
        pins("attrs==1\nATTRS==2\n")
