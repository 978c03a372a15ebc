"""The test runner of ``bench/mutation.py``: pytest in a forked child per mutant.

Started once per scratch copy (its working directory, with ``PYTHONPATH`` pointing at the copy), it
imports pytest and the project's third-party dependencies once; then, for each request line on stdin
(``{"args": [...], "timeout": s}``), it forks, the child runs ``pytest.main(args)`` — importing
``agentfsm`` afresh from the copy, mutant included — and one line goes back on stdout:
``{"code": exit status or null on timeout, "output": the tail of pytest's output}``. A mutant then
costs its tests, not an interpreter start and a few seconds of imports. ``agentfsm`` itself is never
imported here, so no child inherits a stale module.

With ``"coverage": FILE`` (and ``"include": [the module's paths]``) in the request, the child also
measures which test ran which line of the module (coverage.py, one dynamic context per test; the
import-time lines under the empty context) and writes ``{path: {line: [test node ids]}}`` to ``FILE``:
the map that lets each mutant run only the tests that execute its lines.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import tempfile
import time

PRELOAD = ("pytest", "_pytest.python", "hypothesis", "hypothesis.strategies", "hypothesis.stateful",
           "pytest_asyncio", "pytest_timeout", "attrs", "structlog", "transitions", "jsonschema", "referencing",
           "wcmatch.glob", "bracex", "httpx", "pydantic", "anthropic")


class _PerTest:
    """Switch coverage's dynamic context to each test's node id while it runs."""

    def __init__(self, cov: object) -> None:
        self.cov = cov

    def pytest_runtest_call(self, item: object) -> None:
        self.cov.switch_context(item.nodeid)  # type: ignore[attr-defined]

    def pytest_runtest_teardown(self, item: object) -> None:
        self.cov.switch_context("")  # type: ignore[attr-defined]


def _pytest(args: list[str], coverage_map: str | None, include: list[str] | None) -> int:
    import builtins

    import pytest

    # cosmic-ray's ExceptionReplacer writes ``except CosmicRayTestingException``, a name the mutated
    # module does not define: without it, the clause raised NameError for any exception that reached
    # it, which "killed" the mutant through an unrelated failure. Defined, the mutant means what it
    # says: that clause no longer catches what it did.
    builtins.CosmicRayTestingException = type("CosmicRayTestingException", (Exception,), {})  # type: ignore[attr-defined]

    if coverage_map is None:
        return int(pytest.main(args))
    import coverage

    cov = coverage.Coverage(data_file=None, config_file=False, branch=False, include=include)
    cov.start()
    try:
        code = int(pytest.main(args, plugins=[_PerTest(cov)]))
    finally:
        cov.stop()
    data = cov.get_data()
    lines: dict[str, dict[int, list[str]]] = {}
    for measured in data.measured_files():
        lines[os.path.realpath(measured)] = {n: sorted(c) for n, c in data.contexts_by_lineno(measured).items()}
    with open(coverage_map, "w") as fh:
        json.dump(lines, fh)
    return code


_child: int | None = None  # the running child's process group, ended with the worker


def _stop(_signum: int, _frame: object) -> None:
    if _child is not None:
        try:
            os.killpg(_child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    sys.exit(1)


def _run(args: list[str], timeout: float, coverage_map: str | None = None,
         include: list[str] | None = None) -> dict[str, object]:
    global _child
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:  # the child: its own process group, so a timeout ends whatever it started
            exit_code = 3
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                exit_code = _pytest(args, coverage_map, include)
            finally:
                os._exit(exit_code)
        _child = pid
        deadline = time.monotonic() + timeout
        code: int | None = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if code is None:
            os.waitpid(pid, 0)
        _child = None
        out.seek(0, os.SEEK_END)
        out.seek(max(0, out.tell() - 4000))
        return {"code": code, "output": out.read().decode("utf-8", "replace")}


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    leaked = [m for m in sys.modules if m == "agentfsm" or m.startswith("agentfsm.")]
    if leaked:
        print(json.dumps({"error": f"preloading imported {leaked[0]}"}), flush=True)
        return 1
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        reply = _run(request["args"], float(request["timeout"]), request.get("coverage"), request.get("include"))
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
