"""Whole-process cost of the headless CLI on the read-probe scenario, against Claude Code.

A loopback ScriptedServer (started here, in a thread of this process) serves ``read_probe``: one Read
of ``$WS/probe-fixture.txt``, then the answer ``TOOL_EXECUTION_OK``. Each client runs as a child
process with the reference command line::

    PROG --print AGENT_LOOP_INITIAL_MARKER --output-format stream-json --verbose \\
         --model claude-sonnet-4-5 --tools Read --permission-mode bypassPermissions

with ``ANTHROPIC_BASE_URL`` at the server, ``ANTHROPIC_API_KEY=sk-test``, a temporary ``HOME`` and
``IS_SANDBOX=1`` when root. PROG is ``python -m fsm`` (agentfsm) and Claude Code when it is found
(``--claude PATH``, else ``$AGENTFSM_CLAUDE``, else ``claude`` on PATH). Per child: CPU seconds
(user + sys from ``os.wait4``'s rusage of that very child and the children it waited for), wall
seconds, peak RSS (``ru_maxrss``). The median of the repeats is printed with the ratios
agentfsm / Claude Code. Targets: CPU and peak RSS ≤ 0.5× Claude Code's.
``python -c pass`` is measured too, as the floor any Python CLI starts from, and — the peer of the
``-p`` row since issue 34 — ``bench/bare_sdk.py``: the same two streaming requests made with nothing
but ``anthropic.AsyncAnthropic`` (about 40 lines). agentfsm and that script run in alternating order
in the same repeats, so their ratio is a same-run figure; goal: agentfsm ≤ 1.0× the bare SDK.

Then ``python -X importtime -m agentfsm -p ...`` shows what the ``-p`` path imports: diagram code,
pygraphviz and hypothesis must not be among it; the biggest import costs are listed.

    python bench/cli.py [--repeats 3] [--claude-repeats 3] [--claude PATH | --no-claude]

Install Claude Code off PATH (``npm install --prefix DIR @anthropic-ai/claude-code``) so that the
test suite's Claude Code comparisons, which pick ``claude`` up from PATH, are not switched on by it.

Claude Code's background traffic (telemetry, error reports, auto-update) is switched off with its
documented environment variables: there is no network here but loopback, and waiting for it to time
out would only inflate its wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MODEL, ROOT, machine, median, ratio

from agentfsm.testing.scenario import embedded_scenario_path, populate_workspace
from agentfsm.testing.server import ScriptedServer

PROMPT = "AGENT_LOOP_INITIAL_MARKER"
EXPECTED = "TOOL_EXECUTION_OK"
FLAGS = ("--output-format", "stream-json", "--verbose", "--model", MODEL, "--tools", "Read",
         "--permission-mode", "bypassPermissions")
# modules the -p path must never import (issue 8): diagram rendering and the test libraries
FORBIDDEN = ("agentfsm.diagram", "pygraphviz", "graphviz", "hypothesis", "pytest", "agentfsm.auditing.audit",
             "agentfsm.commandline.demo")
CLAUDE_QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def run_child(argv: Sequence[str], env: Mapping[str, str], cwd: Path,
              timeout: float = 120.0) -> dict[str, Any]:
    """Run ``argv`` and reap it with ``os.wait4`` so the rusage is this child's alone (RUSAGE_CHILDREN's
    maxrss would be the largest child of the whole bench so far, not this one's)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err)
        deadline = t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.002)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return {"rc": proc.returncode, "cpu": usage.ru_utime + usage.ru_stime, "user": usage.ru_utime,
            "sys": usage.ru_stime, "wall": wall, "rss_mib": usage.ru_maxrss / 1024, "stdout": stdout,
            "stderr": stderr}


def final_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and msg.get("type") == "result":
            return msg
    return None


def check(run: dict[str, Any], who: str) -> str:
    """'' when the run answered as scripted, else why not (printed, not asserted)."""
    res = final_result(run["stdout"])
    if run["rc"] != 0 or res is None or res.get("result") != EXPECTED:
        tail = (run["stderr"] or run["stdout"])[-400:].strip()
        return f"{who}: rc={run['rc']} result={res and res.get('result')!r} {tail}"
    return ""


def base_env(url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "CLAUDE_"))}
    env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-test", HOME=str(home),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # Measure what an installed user runs: bytecode cached. A checkout (editable install) under
    # PYTHONDONTWRITEBYTECODE would recompile every project module on every start; the cache goes to
    # a temporary prefix so the bench writes nothing into the tree. One untimed warm-up run fills it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(home / "pycache")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"
    return env


def summarise(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: median([r[k] for r in runs]) for k in ("cpu", "user", "sys", "wall", "rss_mib")}


def import_report(env: Mapping[str, str], cwd: Path, top: int) -> None:
    run = run_child([sys.executable, "-X", "importtime", "-m", "agentfsm", "--print", PROMPT, *FLAGS], env, cwd)
    rows: list[tuple[int, int, str]] = []
    for line in run["stderr"].splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        rows.append((int(self_us), int(cum_us), name.rstrip()[1:]))  # keep the nesting indent
    names = {n.strip() for _, _, n in rows}
    bad = sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))
    total = sum(s for s, _, _ in rows)
    print(f"imports on the -p path: {len(names)} modules, {total / 1000:.0f} ms of import time in total "
          f"(-X importtime, this run)")
    print("  forbidden modules imported: " + (", ".join(bad) if bad else "none")
          + f"  (checked: {', '.join(FORBIDDEN)})")
    # self time summed per distribution-level package: says which dependency the time goes to
    by_root: dict[str, int] = {}
    for self_us, _, name in rows:
        root = name.strip().split(".")[0]
        by_root[root] = by_root.get(root, 0) + self_us
    print(f"  top {top} packages by import time (self time of all their modules):")
    for root, us in sorted(by_root.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {us / 1000:8.1f} ms  {root}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="runs of agentfsm and of each floor (default 3)")
    ap.add_argument("--claude-repeats", type=int, default=3, help="runs of Claude Code (default 3)")
    ap.add_argument("--claude", default=None, metavar="PATH",
                    help="the Claude Code binary (default: $AGENTFSM_CLAUDE, else `claude` on PATH)")
    ap.add_argument("--no-claude", action="store_true", help="skip Claude Code even if it is on PATH")
    ap.add_argument("--top", type=int, default=12, help="how many import costs to list")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="agentfsm-bench-cli-"))
    ws = populate_workspace(tmp / "ws")
    home = tmp / "home"
    home.mkdir()
    server = ScriptedServer(embedded_scenario_path("read_probe"), ws=str(ws), per_session=True)
    url = server.start()
    env = base_env(url, home)
    problems: list[str] = []
    try:
        agentfsm = [sys.executable, "-m", "agentfsm", "--print", PROMPT, *FLAGS]
        problems.append(check(run_child(agentfsm, env, ws), "agentfsm warm-up"))
        floor = [run_child([sys.executable, "-c", "pass"], env, ws) for _ in range(args.repeats)]
        sdk = [run_child([sys.executable, "-c", "import anthropic"], env, ws) for _ in range(args.repeats)]
        bare_sdk = [sys.executable, str(Path(__file__).resolve().parent / "bare_sdk.py"), PROMPT]
        if (out := run_child(bare_sdk, env, ws))["stdout"].strip() != EXPECTED:  # warm-up (bytecode cache)
            problems.append(f"bare SDK script: rc={out['rc']} {out['stdout'][-200:]!r} {out['stderr'][-400:]}")
        ours, peer = [], []
        for i in range(args.repeats):
            # alternating order: a neighbour's burst of load hits both alike
            for who in ((agentfsm, bare_sdk) if i % 2 == 0 else (bare_sdk, agentfsm)):
                r = run_child(who, env, ws)
                if who is agentfsm:
                    problems.append(check(r, "agentfsm"))
                    ours.append(r)
                else:
                    if r["stdout"].strip() != EXPECTED:
                        problems.append(f"bare SDK script: rc={r['rc']} {r['stderr'][-400:]}")
                    peer.append(r)
        claude = None if args.no_claude else (
            args.claude or os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude"))
        theirs: list[dict[str, Any]] = []
        claude_version = ""
        if claude:
            cenv = {**env, **CLAUDE_QUIET}
            claude_version = subprocess.run([claude, "--version"], env=cenv, capture_output=True, text=True,
                                            timeout=60).stdout.strip()
            run_child([claude, "--print", PROMPT, *FLAGS], cenv, ws)  # warm-up: page cache, first-run files
            for _ in range(args.claude_repeats):
                r = run_child([claude, "--print", PROMPT, *FLAGS], cenv, ws)
                problems.append(check(r, "claude"))
                theirs.append(r)

        print(f"machine: {machine()}")
        print(f"cli: read_probe against a loopback ScriptedServer, median of {args.repeats} runs "
              f"(Claude Code: {args.claude_repeats})")
        print(f"  {'program':<32} {'CPU s':>7} {'user':>6} {'sys':>6} {'wall s':>7} {'peak RSS MiB':>12}")
        rows = [("python -c pass (floor)", summarise(floor)),
                ("python -c 'import anthropic'", summarise(sdk)),
                ("bare SDK script (bare_sdk.py)", summarise(peer)),
                ("agentfsm (python -m agentfsm -p)", summarise(ours))]
        if theirs:
            rows.append((f"claude {claude_version.split()[0] if claude_version else ''}", summarise(theirs)))
        for name, s in rows:
            print(f"  {name:<32} {s['cpu']:7.3f} {s['user']:6.3f} {s['sys']:6.3f} {s['wall']:7.3f} "
                  f"{s['rss_mib']:12.1f}")
        a, b = summarise(ours), summarise(peer)
        print(f"  ratio agentfsm/bare SDK script: CPU {ratio(a['cpu'], b['cpu'])} (goal <= 1.0x), "
              f"peak RSS {ratio(a['rss_mib'], b['rss_mib'])}, wall {ratio(a['wall'], b['wall'])}")
        if theirs:
            a, c = summarise(ours), summarise(theirs)
            print(f"  ratio agentfsm/claude: CPU {ratio(a['cpu'], c['cpu'])} (target <= 0.5x), "
                  f"peak RSS {ratio(a['rss_mib'], c['rss_mib'])} (target <= 0.5x), "
                  f"wall {ratio(a['wall'], c['wall'])}")
        else:
            why = "--no-claude" if args.no_claude else "no `claude` on PATH, no $AGENTFSM_CLAUDE"
            print(f"  Claude Code not measured ({why}); `npm install --prefix DIR @anthropic-ai/claude-code` "
                  "and pass --claude DIR/node_modules/.bin/claude to get the ratios")
        for p in filter(None, problems):
            print(f"  WARNING, a run did not answer as scripted: {p}")
        import_report(env, ws, args.top)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
