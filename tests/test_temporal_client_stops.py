"""``agentfsm -p … --temporal`` with the service up and no worker: the client says what it waits for,
honours SIGTERM and Ctrl-C, and gives up after ``--worker-timeout``, ending the workflow it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the Temporal extra is not installed: pip install 'agentfsm[temporal]'")

from agentfsm.temporal.devserver import DevServer, NoTemporalBinary, start_dev_server

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    try:
        dev = start_dev_server()
    except NoTemporalBinary as exc:
        pytest.skip(str(exc))
    with dev:
        yield dev


def _client(server: DevServer, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
    queue = f"nobody-{uuid.uuid4().hex[:8]}"  # no worker polls it
    return subprocess.Popen(
        [sys.executable, "-m", "agentfsm", "-p", "hello", "--scripted", "read_probe", "--temporal", server.address,
         "--task-queue", queue, "--sessions-dir", str(tmp_path / "s"), *extra],
        cwd=tmp_path, env={**env, "HOME": str(tmp_path)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_client_with_no_worker_says_what_it_waits_for_and_honours_a_signal(server, tmp_path, sig):
    proc = _client(server, tmp_path)
    try:
        assert proc.stderr is not None
        notice = proc.stderr.readline()  # written once the wait passes a second
        assert "waiting for an agentfsm worker" in notice and "Ctrl-C stops waiting" in notice, notice
        assert "giving up after 60 s" in notice
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)  # a hang guard: the service has no worker, ever
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "did not run: stopped by the user before any worker took it" in err, err
    assert "its workflow was ended" in err and "agentfsm worker --temporal" in err


def test_a_client_gives_up_waiting_for_a_worker(server, tmp_path):
    proc = _client(server, tmp_path, "--worker-timeout", "2")
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "no agentfsm worker took it within 2 s" in err, err
    assert "Fatal Python error" not in err


def test_a_worker_without_credentials_says_so_and_its_sessions_end_as_a_setup_failure(server, tmp_path):
    import json

    from agentfsm.temporal.client import spawn_workers, stop_workers

    queue = f"nokey-{uuid.uuid4().hex[:8]}"
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("ANTHROPIC_")}
    try:
        workers = spawn_workers(server.address, 1, task_queue=queue, log_dir=tmp_path)
    finally:
        os.environ.update(saved)
    try:
        assert "warning: no ANTHROPIC_API_KEY" in (tmp_path / "worker-0.log").read_text()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "AGENTFSM_"))}
        proc = subprocess.run(
            [sys.executable, "-m", "agentfsm", "-p", "hello", "--temporal", server.address, "--task-queue", queue,
             "--sessions-dir", str(tmp_path / "s"), "--output-format", "json"],
            cwd=tmp_path, env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120)
    finally:
        stop_workers(workers)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["subtype"] == "error_during_execution" and result["is_error"] is True, result
    text = json.dumps(result)
    assert text.count("no model to talk to") == 1 and "ANTHROPIC_API_KEY" in text, text
