"""Progress of long audits (agentfsm.common.progress): on a terminal's stderr only, never on stdout, and
Ctrl-C stops an audit of a directory at once with exit status 130 and a message."""

from __future__ import annotations

import io
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_audit import write_scenario

from agentfsm.common import progress
from agentfsm.common.progress import INTERRUPTED, steps

rich_console = pytest.importorskip("rich.console")

FIXTURES = Path(__file__).parent / "fixtures" / "claude_code"
TRANSCRIPT = FIXTURES / "max_tokens_reset" / "transcript.jsonl"
ENV = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
ENV.pop("NO_COLOR", None)


def _mixed_dir(root: Path) -> Path:
    """A directory of both kinds of input: agentfsm traces and Claude Code runs."""
    d = root / "runs"
    d.mkdir()
    for name in ("max_tokens", "tool_turn"):
        write_scenario(d / f"{name}.jsonl", name)
    for fixture in ("max_tokens_reset", "json_schema_retry", "parallel_reads"):
        for kind in ("transcript.jsonl", "stream.jsonl"):
            if (FIXTURES / fixture / kind).exists():
                shutil.copy(FIXTURES / fixture / kind, d / f"{fixture}-{kind}")
    return d


def _drain(fd: int, until: bytes | None = None, proc: subprocess.Popen[bytes] | None = None) -> bytes:
    """What the pty's other end wrote: everything until the writer closed it, or (``until``) until
    that text was seen."""
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 60)
        if not ready:
            raise AssertionError(f"no output for 60 s; so far: {out[-500:]!r}")
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the writer closed its end
            return out
        if not chunk:
            return out
        out += chunk
        if until is not None and until in out:
            return out


def _audit(args: list[str], *, tty: bool, cwd: Path) -> tuple[int, bytes, bytes]:
    """``agentfsm audit ARGS`` in a subprocess: status, stdout, stderr (a terminal's when ``tty``)."""
    cmd = [sys.executable, "-m", "agentfsm", "audit", *args]
    if not tty:
        done = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, env=ENV, cwd=cwd, timeout=300)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=ENV,
                          cwd=cwd) as proc:
        os.close(slave)
        try:
            err = _drain(master)
        finally:
            os.close(master)
        assert proc.stdout is not None
        out = proc.stdout.read()
        return proc.wait(timeout=300), out, err


@pytest.mark.parametrize("mode", [[], ["--json"], ["--coverage"], ["--coverage", "--json"], ["--html", "page.html"]],
                         ids=["text", "json", "coverage", "coverage-json", "html"])
def test_stdout_is_the_same_on_a_terminal_and_the_bar_is_on_its_stderr_only(tmp_path: Path, mode: list[str]) -> None:
    runs = _mixed_dir(tmp_path)
    total = len(list(runs.glob("*.jsonl")))
    plain = tmp_path / "plain"
    plain.mkdir()
    on_tty = tmp_path / "tty"
    on_tty.mkdir()
    status, out, err = _audit([*mode, str(runs)], tty=False, cwd=plain)
    tty_status, tty_out, tty_err = _audit([*mode, str(runs)], tty=True, cwd=on_tty)
    assert out, err  # the report itself
    assert (tty_status, tty_out) == (status, out)
    if mode[:1] == ["--html"]:
        assert (on_tty / "page.html").read_bytes() == (plain / "page.html").read_bytes()
    # the bar: file name, count done of the total, how to stop; none of it without a terminal
    assert b"(Ctrl-C stops)" in tty_err and f"/{total}".encode() in tty_err, tty_err[-600:]
    assert b".jsonl" in tty_err
    assert b"Ctrl-C" not in err and b"\x1b[" not in err
    assert b"Ctrl-C" not in out and b"\x1b[" not in tty_out


def test_the_bar_names_each_item_and_counts_them(tmp_path: Path) -> None:
    sink = io.StringIO()
    console = rich_console.Console(file=sink, force_terminal=True, width=120)
    files = [tmp_path / f"run{i}.jsonl" for i in range(3)]
    with steps(files, "auditing", console=console) as each:
        seen = [f.name for f in each]
        console.file.flush()
    assert seen == ["run0.jsonl", "run1.jsonl", "run2.jsonl"]
    text = sink.getvalue()
    assert "(Ctrl-C stops)" in text and "/3" in text and "auditing" in text


@pytest.mark.parametrize("items", [[], ["a"], ["a", "b", "c"]])
def test_without_a_terminal_the_items_pass_through_and_nothing_is_written(items: list[str]) -> None:
    stream = io.StringIO()  # isatty() is False
    with steps(items, "auditing", stream=stream) as each:
        assert list(each) == items
    assert stream.getvalue() == ""


def test_a_terminal_without_rich_gets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    assert progress._console(stream) is not None
    monkeypatch.setitem(sys.modules, "rich.console", None)  # rich is optional: not installed
    assert progress._console(stream) is None
    with steps(["a", "b"], "auditing", stream=stream) as each:
        assert list(each) == ["a", "b"]
    assert stream.getvalue() == ""


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Thousands of Claude Code transcripts (hard links to one): an audit long enough to interrupt."""
    d = tmp_path_factory.mktemp("big")
    for i in range(5_000):
        try:
            os.link(TRANSCRIPT, d / f"t{i:05}.jsonl")
        except OSError:  # another filesystem: copies
            shutil.copy(TRANSCRIPT, d / f"t{i:05}.jsonl")
    return d


@pytest.mark.parametrize(("mode", "under_way"), [
    ([], b"recognising t"), ([], b"auditing t"), (["--coverage"], b"counting moves in t"),
    (["--html", "page.html"], b"auditing t")], ids=["recognising", "audit", "coverage", "html"])
def test_ctrl_c_stops_a_directory_audit_with_status_130_and_a_message(big_dir: Path, tmp_path: Path,
                                                                      mode: list[str], under_way: bytes) -> None:
    master, slave = pty.openpty()
    with subprocess.Popen([sys.executable, "-m", "agentfsm", "audit", *mode, str(big_dir)], stdout=subprocess.PIPE,
                          stderr=slave, stdin=subprocess.DEVNULL, env=ENV, cwd=tmp_path) as proc:
        os.close(slave)
        try:
            err = _drain(master, until=under_way)  # that phase of the audit is under way
            assert proc.poll() is None, "the audit ended before it could be interrupted"
            proc.send_signal(signal.SIGINT)
            err += _drain(master)
        finally:
            os.close(master)
        assert proc.stdout is not None
        out = proc.stdout.read()
        status = proc.wait(timeout=60)
    assert status == INTERRUPTED
    assert b"agentfsm audit: interrupted (Ctrl-C)" in err
    assert b"Traceback" not in err
    assert out == b""  # nothing half reported
    assert not (tmp_path / "page.html").exists()
