"""Pytest plugin: fixtures of the agentfsm testing kit (registered as the ``agentfsm`` entry point).

- ``scripted_workspace``: a temporary directory holding the reference workspace files
  (``probe-fixture.txt``, ``a.txt``, ``b.txt``); scenarios' ``$WS`` stands for it.
- ``scripted_model(source, **kw)``: a :class:`~fsm.testing.ScriptedModel` for a scenario (path, dict,
  :class:`~fsm.testing.Scenario`), a list of responses or a ``(request, n)`` callable.
- ``scripted_server(source, **kw)``: a started :class:`~fsm.testing.ScriptedServer` on a free loopback
  port (``.base_url``), stopped at teardown.
- ``reference_dir`` / ``reference_scenario(name)`` / ``reference_observed(name)``: the reference
  observations (``$AGENTFSM_REFERENCE_DIR``, else ``../shared/reference`` beside the repository);
  tests using them are skipped when there is none.

This module is imported in every pytest run, so it imports the kit only inside fixtures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from fsm.testing.scenario import Scenario
    from fsm.testing.scripted import ScriptedModel
    from fsm.testing.server import ScriptedServer

REFERENCE_ENV = "AGENTFSM_REFERENCE_DIR"


def _is_reference_dir(path: Path) -> bool:
    return (path / "scenarios").is_dir()


def find_reference_dir(root: str | os.PathLike[str] | None = None) -> Path | None:
    """The reference directory: ``$AGENTFSM_REFERENCE_DIR``, else ``../shared/reference`` relative to
    ``root`` (a repository root), else relative to this package's checkout; None when none exists."""
    env = os.environ.get(REFERENCE_ENV)
    if env:
        path = Path(env).expanduser()
        return path.resolve() if _is_reference_dir(path) else None
    roots = [Path(root)] if root is not None else []
    roots.append(Path(__file__).resolve().parents[2])
    for base in roots:
        candidate = (base / ".." / "shared" / "reference").resolve()
        if _is_reference_dir(candidate):
            return candidate
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "server: talks to a loopback HTTP server the test starts itself (real anthropic SDK path)"
    )


@pytest.fixture
def scripted_workspace(tmp_path: Path) -> Path:
    from fsm.testing.scenario import populate_workspace

    return populate_workspace(tmp_path / "ws").resolve()


def _load(source: Any, ws: Path) -> Any:
    """What ScriptedModel/ScriptedServer accept, with $WS substituted wherever it can appear."""
    from fsm.testing.scenario import Scenario, load_scenario

    if isinstance(source, str | os.PathLike | dict | Scenario):
        return load_scenario(source, ws)
    return source  # a list (substituted by the model/server via ws=) or a callable


@pytest.fixture
def scripted_model(scripted_workspace: Path) -> Callable[..., ScriptedModel]:
    from fsm.testing.scripted import ScriptedModel

    def make(source: Any, **kwargs: Any) -> ScriptedModel:
        loaded = _load(source, scripted_workspace)
        if isinstance(loaded, list | tuple):
            kwargs.setdefault("ws", scripted_workspace)
        return ScriptedModel(loaded, **kwargs)

    return make


@pytest.fixture
def scripted_server(scripted_workspace: Path) -> Iterator[Callable[..., ScriptedServer]]:
    from fsm.testing.server import ScriptedServer

    started: list[ScriptedServer] = []

    def make(source: Any, **kwargs: Any) -> ScriptedServer:
        loaded = _load(source, scripted_workspace)
        if isinstance(loaded, list | tuple):
            kwargs.setdefault("ws", scripted_workspace)
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("port", 0)
        server = ScriptedServer(loaded, **kwargs)
        server.start()
        started.append(server)
        return server

    yield make
    for server in reversed(started):
        server.stop()


@pytest.fixture
def reference_dir(request: pytest.FixtureRequest) -> Path:
    found = find_reference_dir(request.config.rootpath)
    if found is None:
        pytest.skip(
            f"no reference observations: set ${REFERENCE_ENV} or put shared/reference beside the repository"
        )
    return found


@pytest.fixture
def reference_scenario(reference_dir: Path, scripted_workspace: Path) -> Callable[[str], Scenario]:
    from fsm.testing.scenario import load_scenario

    def load(name: str) -> Scenario:
        path = reference_dir / "scenarios" / f"{name}.json"
        if not path.exists():
            pytest.skip(f"reference scenario {name!r} not found in {reference_dir}")
        return load_scenario(path, scripted_workspace)

    return load


@pytest.fixture
def reference_observed(reference_dir: Path) -> Callable[[str], dict[str, Any]]:
    def load(name: str) -> dict[str, Any]:
        path = reference_dir / "observed" / f"{name}.json"
        if not path.exists():
            pytest.skip(f"reference observation {name!r} not found in {reference_dir}")
        observed: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return observed

    return load
