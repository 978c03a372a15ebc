"""A read-only tool call on Temporal runs as a local activity, with no heartbeat to carry its process
groups: they are kept in a file on the host, and the run that replaces a lost one kills them first.
The file lives where only this user can write (a planted file must not make a worker kill process
groups it did not start). No server needed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the Temporal extra is not installed: pip install 'agentfsm[temporal]'")

from agentfsm.temporal import activities
from agentfsm.temporal.activities import _kill_stale, _pgid_file, _ProcessGuard, _read_json


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(activities.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def test_a_local_attempts_groups_are_kept_and_a_rerun_kills_them(tmp: Path) -> None:
    file = _pgid_file("wf-1", "toolu_1")
    assert file is not None and file.parent.parent == tmp / f"agentfsm-{os.getuid()}"
    assert oct(file.parent.stat().st_mode & 0o777) == oct(0o700)
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        details = {"host": activities.HOST, "boot_id": activities.BOOT_ID, "pid": os.getpid(), "pgids": []}
        _ProcessGuard(details, local=True, file=file).started(proc.pid)
        # the lost attempt's worker is gone; the rerun reads the file and kills what it names
        assert _kill_stale(_read_json(_pgid_file("wf-1", "toolu_1"))) == [proc.pid]
        deadline = time.monotonic() + 5
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _pgid_file("wf-1", "toolu_2") != file  # one file per call


def test_another_hosts_groups_are_left_alone(tmp: Path) -> None:
    assert _kill_stale({"host": "elsewhere", "boot_id": activities.BOOT_ID, "pgids": [1]}) == []
    assert _kill_stale({"host": activities.HOST, "boot_id": "another-boot", "pgids": [1]}) == []
    assert _read_json(None) == {} and _read_json(tmp / "missing.json") == {}


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o755])
def test_a_directory_others_can_write_or_read_is_not_used(tmp: Path, mode: int) -> None:
    top = tmp / f"agentfsm-{os.getuid()}"
    top.mkdir()
    top.chmod(mode)
    assert _pgid_file("wf", "toolu") is None
    # no file: the guard keeps nothing (the commands still die with their worker) and nothing is read
    details: dict[str, object] = {"pgids": []}
    _ProcessGuard(details, local=True, file=None).started(12345)
    assert details["pgids"] == [12345]


def test_a_symlinked_directory_is_not_used(tmp: Path) -> None:
    target = tmp / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp / f"agentfsm-{os.getuid()}").symlink_to(target)
    assert _pgid_file("wf", "toolu") is None
