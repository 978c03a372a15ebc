"""Nightly profile of ``agentfsm conform`` (docs/conform.md): many generated examples against Claude Code.

    python bench/conform_nightly.py --claude PATH [--examples 500] [--seed S] [--jobs 2] [--out FILE]

Runs the command with every family of behaviour and set-up, writes the shrunk divergences to
``--fixtures`` (default: a scratch directory) and the summary (examples, divergences with their ids and
fields, accepted, runs, seconds) as JSON to ``--out`` (default: stdout). Exit status: the command's
(0 only when no divergence is outside the accepted list).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

from agentfsm.commandline.conform import main as conform_main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claude", required=True)
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shrink-runs", type=int, default=40)
    ap.add_argument("--fixtures", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    fixtures = args.fixtures or Path(tempfile.mkdtemp(prefix="conform-nightly-"))
    out = io.StringIO()
    code = conform_main(["--claude", args.claude, "--examples", str(args.examples), "--seed", str(args.seed),
                         "--jobs", str(args.jobs), "--shrink-runs", str(args.shrink_runs),
                         "--fixtures", str(fixtures), "--json"], out=out)
    lines = out.getvalue().splitlines()
    summary = json.loads(lines[-2])
    summary["fixtures"] = str(fixtures)
    sys.stderr.write(out.getvalue())
    text = json.dumps(summary, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
