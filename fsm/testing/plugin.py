"""Pytest plugin: fixtures of the agentfsm testing kit. Opt-in: nothing is registered until a project
asks, with ``pytest -p agentfsm.testing.plugin`` or ``pytest_plugins = ("agentfsm.testing.plugin",)``
in its ``conftest.py``. Every fixture name starts with ``agentfsm_``; no marker is added.

- ``agentfsm_workspace``: a temporary directory holding the reference workspace files
  (``probe-fixture.txt``, ``a.txt``, ``b.txt``); scenarios' ``$WS`` stands for it.
- ``agentfsm_model(source, **kw)``: a :class:`~agentfsm.testing.ScriptedModel` for a scenario (path, dict,
  :class:`~agentfsm.testing.Scenario`), a list of responses or a ``(request, n)`` callable.
- ``agentfsm_server(source, **kw)``: a started :class:`~agentfsm.testing.ScriptedServer` on a free loopback
  port (``.base_url``), stopped at teardown.
- ``agentfsm_reference_dir`` / ``agentfsm_reference_scenario(name)`` /
  ``agentfsm_reference_observed(name)``: the reference observations (``$AGENTFSM_REFERENCE_DIR``,
  else ``../shared/reference`` beside the repository); tests using them are skipped when there is none.

Loading the plugin imports nothing of the kit: fixtures import what they need when used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agentfsm.testing.scenario import Scenario
    from agentfsm.testing.scripted import ScriptedModel
    from agentfsm.testing.server import ScriptedServer

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


@pytest.fixture
def agentfsm_workspace(tmp_path: Path) -> Path:
    from agentfsm.testing.scenario import populate_workspace

    return populate_workspace(tmp_path / "ws").resolve()


def _load(source: Any, ws: Path) -> Any:
    """What ScriptedModel/ScriptedServer accept, with $WS substituted wherever it can appear."""
    from agentfsm.testing.scenario import Scenario, load_scenario

    if isinstance(source, str | os.PathLike | dict | Scenario):
        return load_scenario(source, ws)
    return source  # a list (substituted by the model/server via ws=) or a callable


@pytest.fixture
def agentfsm_model(agentfsm_workspace: Path) -> Callable[..., ScriptedModel]:
    from agentfsm.testing.scripted import ScriptedModel

    def make(source: Any, **kwargs: Any) -> ScriptedModel:
        loaded = _load(source, agentfsm_workspace)
        if isinstance(loaded, list | tuple):
            kwargs.setdefault("ws", agentfsm_workspace)
        return ScriptedModel(loaded, **kwargs)

    return make


@pytest.fixture
def agentfsm_server(agentfsm_workspace: Path) -> Iterator[Callable[..., ScriptedServer]]:
    from agentfsm.testing.server import ScriptedServer

    started: list[ScriptedServer] = []

    def make(source: Any, **kwargs: Any) -> ScriptedServer:
        loaded = _load(source, agentfsm_workspace)
        if isinstance(loaded, list | tuple):
            kwargs.setdefault("ws", agentfsm_workspace)
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
def agentfsm_reference_dir(request: pytest.FixtureRequest) -> Path:
    found = find_reference_dir(request.config.rootpath)
    if found is None:
        pytest.skip(
            f"no reference observations: set ${REFERENCE_ENV} or put shared/reference beside the repository"
        )
    return found


@pytest.fixture
def agentfsm_reference_scenario(agentfsm_reference_dir: Path, agentfsm_workspace: Path) -> Callable[[str], Scenario]:
    from agentfsm.testing.scenario import load_scenario

    def load(name: str) -> Scenario:
        path = agentfsm_reference_dir / "scenarios" / f"{name}.json"
        if not path.exists():
            pytest.skip(f"reference scenario {name!r} not found in {agentfsm_reference_dir}")
        return load_scenario(path, agentfsm_workspace)

    return load


@pytest.fixture
def agentfsm_reference_observed(agentfsm_reference_dir: Path) -> Callable[[str], dict[str, Any]]:
    def load(name: str) -> dict[str, Any]:
        path = agentfsm_reference_dir / "observed" / f"{name}.json"
        if not path.exists():
            pytest.skip(f"reference observation {name!r} not found in {agentfsm_reference_dir}")
        observed: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return observed

    return load
