"""What the kernel sandbox costs per Bash command, and that a long session does not slow down.

The same run measures ``true`` through the Bash tool with the session's sandbox and without it,
interleaved (A, B, A, B, ...) so a busy machine weighs on both alike:

- wall time per command (median), and the ratio sandboxed / unsandboxed (goal: at most 1.2×);
- CPU per command: this process (resolving the rules, building the bwrap line) plus its children
  (bwrap, bash), from ``os.times()``; the difference is what the sandbox adds (goal: at most 15 ms);
- the resolution of the rules alone (``SessionSandbox.layout``) over a workspace of ``--files`` files
  with the deny rules of the issue (a bare ``.env`` rule walks the whole workspace every command).

Then a long session: ``--long`` sandboxed commands in a row; the median wall of the first and last
tenth, their ratio (1.0: no slow-down), and the file descriptors and placeholders left over.

    python bench/sandbox.py [--n 100] [--files 2000] [--long 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median

from agentfsm.hooks.config import SandboxSettings
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.hooks.sandbox import SessionSandbox
from agentfsm.tools.base import NoFileRules, ToolContext
from agentfsm.tools.bash import BashTool
from agentfsm.tools.sandbox import PLACEHOLDERS, SANDBOX, availability

RULES = ["Read(./secrets/**)", "Read(~/.ssh/**)", "Edit(.env)", "Edit(./locked/**)", "Read(**/*.pem)"]


def workspace(files: int) -> Path:
    ws = Path(tempfile.mkdtemp(prefix="agentfsm-bench-sandbox-"))
    (ws / "secrets").mkdir()
    (ws / "secrets" / "key.txt").write_text("secret\n")
    (ws / "locked").mkdir()
    (ws / "locked" / "a.txt").write_text("a\n")
    per_dir = 50
    for i in range(files):
        d = ws / "src" / f"pkg{i // per_dir}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_text("x = 1\n")
    return ws


def cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


async def one(ws: Path, services: dict[str, object]) -> tuple[float, float]:
    ctx = ToolContext(cwd=ws, session_id="bench", tool_use_id="toolu_bench", abort=asyncio.Event(),
                      services=services, file_access=NoFileRules())
    c0, w0 = cpu(), time.perf_counter()
    out = await BashTool().call({"command": "true"}, ctx)
    w1, c1 = time.perf_counter(), cpu()
    assert not out.is_error, out
    return w1 - w0, c1 - c0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="commands of each kind (interleaved)")
    ap.add_argument("--files", type=int, default=2000, help="files in the workspace the rules are resolved over")
    ap.add_argument("--long", type=int, default=500, help="commands in the long session")
    args = ap.parse_args()
    found = availability()
    print(machine())
    if not found.ok:
        print(f"the sandbox cannot run here: {found.reason}")
        return
    ws = workspace(args.files)
    policy = PermissionPolicy.build(ws, mode="bypassPermissions", deny=RULES)
    sandbox = SessionSandbox(SandboxSettings(), policy)
    on, off = {SANDBOX: sandbox}, {}
    for services in (on, off):  # warm both paths (imports, page cache)
        await one(ws, services)
    walls: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": []}
    cpus: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": []}
    for _ in range(args.n):
        for name, services in (("sandboxed", on), ("unsandboxed", off)):
            w, c = await one(ws, services)
            walls[name].append(w)
            cpus[name].append(c)
    resolve = []
    for _ in range(args.n):
        t0 = time.process_time()
        sandbox.layout(ws)
        resolve.append(time.process_time() - t0)
    ms = 1000.0
    ws_on, ws_off = median(walls["sandboxed"]), median(walls["unsandboxed"])
    cpu_on, cpu_off = sum(cpus["sandboxed"]) / args.n, sum(cpus["unsandboxed"]) / args.n
    print(f"`true` via the Bash tool, {args.n} each, interleaved; workspace of {args.files} files, rules {RULES}")
    print(f"  wall median   unsandboxed {ws_off * ms:7.2f} ms   sandboxed {ws_on * ms:7.2f} ms   "
          f"ratio {ws_on / ws_off:.2f}x (goal <= 1.2x)")
    print(f"  CPU per cmd   unsandboxed {cpu_off * ms:7.2f} ms   sandboxed {cpu_on * ms:7.2f} ms   "
          f"added {(cpu_on - cpu_off) * ms:.2f} ms (goal <= 15 ms)")
    print(f"  resolving the rules alone: median {median(resolve) * ms:.2f} ms CPU")
    # a long session
    fds0 = open_fds()
    long_walls = []
    for _ in range(args.long):
        w, _c = await one(ws, on)
        long_walls.append(w)
    tenth = max(1, args.long // 10)
    first, last = median(long_walls[:tenth]), median(long_walls[-tenth:])
    print(f"long session: {args.long} sandboxed commands; median wall first tenth {first * ms:.2f} ms, last tenth "
          f"{last * ms:.2f} ms, ratio {last / first:.2f}; open fds {fds0} -> {open_fds()}; "
          f"placeholders in use {len(PLACEHOLDERS._users)}; .env left on disk: {(ws / '.env').exists()}")


if __name__ == "__main__":
    asyncio.run(main())
