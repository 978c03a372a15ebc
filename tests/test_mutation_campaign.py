"""bench/mutation.toml covers the code: every Python file of fsm/, tools/ and hooks/ is a campaign module
or is listed under ``[outside]`` with why, and every module's path and tests exist. Reads the file only
(no cosmic-ray needed), so a module added without a decision fails here, not in a nightly run."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((REPO / "bench" / "mutation.toml").read_text())


def _sources() -> set[str]:
    return {p.relative_to(REPO).as_posix() for top in ("fsm", "tools", "hooks") for p in (REPO / top).rglob("*.py")}


def test_every_source_file_is_in_the_campaign_or_listed_outside_with_a_reason() -> None:
    modules = {m["path"] for m in CONFIG["modules"].values()}
    outside = CONFIG["outside"]
    assert all(why.strip() for why in outside.values())

    def listed(path: str) -> bool:
        return path in outside or any(k.endswith("/") and path.startswith(k) for k in outside)

    undecided = sorted(p for p in _sources() if p not in modules and not listed(p))
    assert undecided == [], f"add these to bench/mutation.toml ([modules.*] or [outside], with why): {undecided}"
    both = sorted(p for p in modules if listed(p))
    assert both == [], f"in the campaign and listed outside it: {both}"


def test_every_listed_path_exists() -> None:
    gone = [k for k in CONFIG["outside"] if not (REPO / k).exists()]
    assert gone == [], f"[outside] names what is not there: {gone}"
    for name, module in CONFIG["modules"].items():
        assert (REPO / module["path"]).is_file(), name
        missing = [t for t in module["tests"] if not (REPO / t).is_file()]
        assert missing == [], f"{name}: no such test file {missing}"
        assert len(set(module["tests"])) == len(module["tests"]), f"{name}: a test file listed twice"


def test_the_modules_issue_35_named_are_in_the_campaign() -> None:
    modules = {m["path"] for m in CONFIG["modules"].values()}
    named = {"fsm/runtime/compact.py", "fsm/runtime/phases.py", "fsm/runtime/driver.py", "fsm/auditing/checks.py",
             "fsm/runtime/request.py", "fsm/sessions/resume.py",
             "fsm/sessions/session.py", "fsm/runtime/trace.py", "fsm/llm/model.py", "fsm/llm/transport.py",
             "fsm/runtime/pipeline.py"}
    assert named <= modules
    # the tools' own input handling: every tool module but the package and the command environment
    tools = {p for p in _sources() if p.startswith("tools/")}
    assert tools - modules <= {"tools/__init__.py", "tools/environment.py"}
