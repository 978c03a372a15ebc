"""Suite-wide set-up: hypothesis profiles, and the traces the property suite leaves for the coverage
check.

Profiles (``HYPOTHESIS_PROFILE=ci|nightly``, default ``ci``):

* ``ci`` — hypothesis' usual 100 examples per test, so CI stays within its time budget; the
  property suite (``tests/test_properties.py``) scales its own example counts from this number;
* ``nightly`` — ten times as many examples everywhere (the property suite runs tens of thousands
  of loops), no deadline, and no per-test timeout for the property suite;
* ``mutation`` — what ``bench/mutation.py`` runs each mutant's tests with: ``ci``'s example counts,
  derandomized and without the example database (a mutant's verdict must not depend on luck or on
  the mutants tested before it), no deadline (a slow machine must not kill a mutant), and no
  shrinking (a failure is all a mutant's verdict needs).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import structlog
from hypothesis import HealthCheck, Phase, settings

# the testing kit's fixtures are opt-in: a project asks for them by name, as this suite does
pytest_plugins = ("agentfsm.testing.plugin",)

# AGENTFSM_TEMPORAL sends every `agentfsm -p` to Temporal workers: the suite's local runs stay local
# (tests/test_temporal.py starts its own server and names it)
os.environ.pop("AGENTFSM_TEMPORAL", None)

settings.register_profile("ci", max_examples=100, print_blob=True)
settings.register_profile("nightly", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mutation", max_examples=100, derandomize=True, database=None, deadline=None,
                          print_blob=False, suppress_health_check=[HealthCheck.too_slow],
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

# The property suite's per-test budget in CI; a nightly profile lifts it (pytest-timeout's 120 s
# default would otherwise cut the big runs short).
_NIGHTLY_TIMEOUT_S = 6 * 3600


@attrs.define
class PropertyTraces:
    """Where the property suite writes its session files, and which workloads have run — the
    coverage check (``tests/test_coverage.py``) reads the union and runs what did not run."""

    dir: Path
    done: set[str] = attrs.field(factory=set)


@pytest.fixture(scope="session")
def property_traces() -> Iterator[PropertyTraces]:
    # not tmp_path_factory: thousands of session files need not survive the run for inspection,
    # and the coverage report names what it read
    with tempfile.TemporaryDirectory(prefix="agentfsm-property-traces-") as d:
        yield PropertyTraces(Path(d))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "property_suite: a workload of the project's property suite "
                                       "(its session files feed the coverage check)")
    config.addinivalue_line("markers", "after_property_suite: runs after every property_suite test, so "
                                       "it sees all their traces")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the coverage check needs the property suite's traces: run it last, keeping the order otherwise
    late = [i for i in items if i.get_closest_marker("after_property_suite") is not None]
    # under pytest-xdist (the README's `-n auto`, with `--dist loadgroup` from pyproject) the property
    # suite and the coverage check that reads its traces run on one worker, in this order: the traces
    # live in that worker's session-scoped `property_traces`
    for item in items:
        if item.get_closest_marker("property_suite") or item.get_closest_marker("after_property_suite"):
            item.add_marker(pytest.mark.xdist_group("property_suite"))
    if late:
        items[:] = [i for i in items if i.get_closest_marker("after_property_suite") is None] + late
    if PROFILE == "nightly":
        for item in items:
            if item.get_closest_marker("property_suite") or item.get_closest_marker("after_property_suite"):
                item.add_marker(pytest.mark.timeout(_NIGHTLY_TIMEOUT_S), append=False)


@pytest.fixture(autouse=True)
def _leave_structlog_as_found() -> Iterator[None]:
    """Sessions configure structlog process-wide (``agentfsm.common.log``: ``off`` for library use, a JSON file for
    the CLI). After every test, close any log file a run opened and put back what the process had,
    so a later test that captures logs sees structlog as it was."""
    from agentfsm.common import log

    was_configured, saved = structlog.is_configured(), structlog.get_config()
    yield
    log.configure("off")
    if was_configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()
