"""Start-up cost of the ``agentfsm`` command, against floors measured in the same run.

Each program runs as a child process (bytecode cached in a temporary prefix, one untimed warm-up
each), in alternating rounds so a neighbour's burst of load hits all alike; the median round is
printed. Programs:

* ``python -c pass`` — the floor any Python CLI starts from;
* ``python -c 'import anthropic'`` — what the SDK alone costs to import;
* ``agentfsm --help`` and ``agentfsm diagram --help``-like paths that need no model;
* ``agentfsm -p`` with ``--scripted read_probe`` (the in-process model: the SDK must not be imported);
* ``agentfsm -p`` against a loopback ScriptedServer (the real SDK path, as ``bench/cli.py`` runs it).

For the SDK path it also times, per run, the moments the issue's goals are about: from the spawn to
the first Messages request reaching the server (start-up), and from the ``result`` line on stdout to
the process's exit.

Then ``-X importtime`` of both ``-p`` paths: the import time summed per top-level package, and
which of the optional heavy packages each path imported (anthropic, temporalio, mcp, pygraphviz,
jsonschema, tree_sitter, hypothesis). Printed, never asserted.

    python bench/startup.py [--repeats 5] [--top 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, median, ratio
from cli import FLAGS, PROMPT, base_env, check, run_child

from agentfsm.testing.scenario import embedded_scenario_path, populate_workspace
from agentfsm.testing.server import ScriptedServer

# packages only some paths need; each row below says which ones its path imported
HEAVY = ("anthropic", "temporalio", "mcp", "pygraphviz", "jsonschema", "tree_sitter", "hypothesis", "rich")


class RequestClock:
    """The scripted server's request log as a clock: when each Messages request arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._lock = threading.Lock()

    def write(self, _text: str) -> int:
        with self._lock:
            self.times.append(time.perf_counter())
        return len(_text)

    def flush(self) -> None:
        pass


def timed_run(argv: list[str], env: dict[str, str], cwd: Path, clock: RequestClock) -> dict[str, float]:
    """One run, its stdout read line by line: seconds from the spawn to the first request and from
    the ``result`` line to the exit, and the CPU seconds (``os.wait4``)."""
    seen = len(clock.times)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    t_result = float("nan")
    assert proc.stdout is not None
    for line in proc.stdout:
        if b'"type": "result"' in line or b'"type":"result"' in line:
            t_result = time.perf_counter()
    _pid, _status, usage = os.wait4(proc.pid, 0)
    t_exit = time.perf_counter()
    proc.returncode = 0  # reaped here
    first = clock.times[seen] if len(clock.times) > seen else float("nan")
    return {"to_first_request": first - t0, "result_to_exit": t_exit - t_result,
            "cpu": usage.ru_utime + usage.ru_stime}


def import_rows(stderr: str) -> list[tuple[int, str]]:
    """(self µs, module) per line of ``-X importtime`` output."""
    rows: list[tuple[int, str]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, _cum, name = line[len("import time:"):].split("|")
        rows.append((int(self_us), name.strip()))
    return rows


def by_package(rows: list[tuple[int, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for us, name in rows:
        root = name.split(".")[0]
        out[root] = out.get(root, 0) + us
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--top", type=int, default=10, help="how many packages to list per -p path")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="agentfsm-bench-startup-"))
    ws = populate_workspace(tmp / "ws")
    home = tmp / "home"
    home.mkdir()
    clock = RequestClock()
    server = ScriptedServer(embedded_scenario_path("read_probe"), ws=str(ws), per_session=True, log=clock)  # type: ignore[arg-type]
    url = server.start()
    env = base_env(url, home)
    py = sys.executable
    programs: dict[str, list[str]] = {
        "python -c pass (floor)": [py, "-c", "pass"],
        "python -c 'import anthropic'": [py, "-c", "import anthropic"],
        "agentfsm --help": [py, "-m", "agentfsm", "--help"],
        "agentfsm -p --scripted": [py, "-m", "agentfsm", "--print", PROMPT, *FLAGS, "--scripted", "read_probe"],
        "agentfsm -p (SDK, loopback)": [py, "-m", "agentfsm", "--print", PROMPT, *FLAGS],
    }
    checked = ("agentfsm -p --scripted", "agentfsm -p (SDK, loopback)")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in programs}
    problems: list[str] = []
    try:
        for argv_ in programs.values():  # warm-up: bytecode cache, page cache
            run_child(argv_, env, ws)
        names = list(programs)
        for r in range(args.repeats):
            for name in (names if r % 2 == 0 else names[::-1]):
                run = run_child(programs[name], env, ws)
                if name in checked:
                    problems.append(check(run, name))
                runs[name].append(run)

        print(f"machine: {machine()}")
        print(f"startup: median of {args.repeats} alternating rounds, each program a fresh process")
        floor = median([r["cpu"] for r in runs["python -c pass (floor)"]])
        sdk = median([r["cpu"] for r in runs["python -c 'import anthropic'"]])
        print(f"  {'program':<30} {'CPU s':>7} {'wall s':>7} {'CPU - floor':>12} {'/ import anthropic':>19}")
        for name, rs in runs.items():
            cpu = median([r["cpu"] for r in rs])
            wall = median([r["wall"] for r in rs])
            print(f"  {name:<30} {cpu:7.3f} {wall:7.3f} {cpu - floor:12.3f} {ratio(cpu, sdk):>19}")
        for p in filter(None, problems):
            print(f"  WARNING, a run did not answer as scripted: {p}")

        sdk_argv = programs["agentfsm -p (SDK, loopback)"]
        timed = [timed_run(sdk_argv, env, ws, clock) for _ in range(args.repeats)]
        first = median([t["to_first_request"] for t in timed])
        tail = median([t["result_to_exit"] for t in timed])
        print(f"  agentfsm -p (SDK): spawn to first request {first:.3f} s (goal <= 0.5 s on an idle core); "
              f"result line to exit {tail * 1e3:.1f} ms (goal <= 50 ms)")

        for name in checked:
            run = run_child([py, "-X", "importtime", *programs[name][1:]], env, ws)
            rows = import_rows(run["stderr"])
            pkgs = by_package(rows)
            heavy = [h for h in HEAVY if h in pkgs]
            print(f"imports of `{name}`: {len(rows)} modules, {sum(us for us, _ in rows) / 1000:.0f} ms "
                  f"(-X importtime, one run); heavy packages imported: {', '.join(heavy) or 'none'}")
            top = sorted(pkgs.items(), key=lambda kv: -kv[1])[:args.top]
            print("    " + ", ".join(f"{root} {us / 1000:.0f} ms" for root, us in top))
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
