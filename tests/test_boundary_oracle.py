"""Opt-in generating test of the Bash boundary table (``hooks/bash_boundary.py``'s ``REACH``) against Claude
Code 2.1.332: every program in the table, and a wider list of common commands the table may lack, is run
on a file or directory beside the workspace (``../out``), by Claude Code and by agentfsm, in the default
mode; the answer each gives the model must be the same text.

So adding a program to the table is checked against Claude Code, and a program Claude Code blocks that
the table lacks shows up as a difference ("X in '…' was blocked" against agentfsm's answer). Differences
agentfsm keeps on purpose are listed in :data:`ACCEPTED`, with why.

Claude Code is located with ``$AGENTFSM_CLAUDE``, else ``claude`` on PATH; without it the test skips.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentfsm.hooks.bash_boundary import REACH
from agentfsm.testing import oracle

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(1800)]

CLAUDE = os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")

#: Words before the path, for programs whose first operand is a pattern, filter or script.
_LEAD = {"grep": "O", "egrep": "O", "fgrep": "O", "rg": "O", "look": "O", "sed": "-n 1p", "awk": "'{print}'",
         "jq": ".", "yq": ".", "git": "diff --no-index in.txt", "iconv": "-f utf-8", "head": "-n 1"}
#: Programs given a directory.
_DIRECTORY = {"ls", "find", "cd", "du", "tree", "rg", "pushd", "namei", "lsattr"}
#: Common commands outside the table, to find one Claude Code blocks that the table lacks.
WIDER = ["zless ../out/o.txt", "bat ../out/o.txt", "hd ../out/o.txt", "xmllint ../out/o.txt",
         "python3 ../out/s.py", "git -C ../out status", "git log ../out", "tar tf ../out/o.txt",
         "unzip -l ../out/o.txt", "nm ../out/o.txt", "readelf -h ../out/o.txt", "objdump -f ../out/o.txt",
         "ldd ../out/o.txt", "dos2unix ../out/o.txt", "cat < ../out/o.txt", "tr a b < ../out/o.txt",
         "cat in.txt > ../out/y.txt", "cp ../out/o.txt here.txt", "cat link/o.txt", "ls link",
         "ls -la ../out/", "cat ../out/*.txt", "grep -r O ../out", "find . ../out -name x", "cd ~",
         "cat ~/.bashrc", "cat /dev/null", "realpath ../out/o.txt", "readlink -f ../out/o.txt",
         "basename ../out/o.txt", "dirname ../out/o.txt", "test -f ../out/o.txt",
         # the ways a command line composes them
         "cat in.txt && cat ../out/o.txt", "ls; ls ../out", "ls ../out || true", "cat ../out/o.txt | wc -l",
         "echo x | tee ../out/x.txt", "ls | grep ../out", "env ls ../out", "timeout 5 cat ../out/o.txt",
         "ls ../out > list.txt", "(ls ../out)", "bash -c 'ls ../out'"]

#: Differences agentfsm keeps on purpose: command → why.
ACCEPTED = {
    "du ../out": "Claude Code runs du outside; agentfsm asks: du -a lists every name below a directory.",
    "tree ../out": "as du: a listing outside, which agentfsm asks about.",
    "git log ../out": "Claude Code runs git log on an outside path; agentfsm asks (it reads the repository there).",
    "rg --files ../out": "Claude Code asks without a phrase; agentfsm names rg's phrase: both ask.",
    "awk -f ../out/s.py in.txt": "Claude Code: 'awk has an option that can't be checked'; agentfsm names awk's "
                                 "phrase: both ask.",
    "jq -f ../out/d.json in.txt": "Claude Code: 'jq command contains dangerous flags'; agentfsm names jq's "
                                  "phrase: both ask.",
    "(ls ../out)": "Claude Code: 'This command uses shell operators that require approval'; agentfsm names the "
                   "boundary: both ask.",
    "bash -c 'ls ../out'": "Claude Code: 'This command requires approval'; agentfsm names the boundary of the "
                           "command bash runs: both ask.",
}


def commands() -> list[str]:
    out: list[str] = []
    for program, reach in sorted(REACH.items()):
        if reach.operands == "none":
            continue
        target = "../out" if program in _DIRECTORY else "../out/o.txt"
        lead = _LEAD.get(program)
        out.append(" ".join(w for w in (program, lead, target) if w))
    return list(dict.fromkeys([*out, *WIDER]))


def case(cmds: list[str]) -> dict[str, Any]:
    files = {"in.txt": "IN\n", "$OUT/o.txt": "O\n", "$OUT/p.txt": "P\n", "$OUT/s.py": "print(1)\n",
             "$OUT/d.json": "{\"a\": 1}\n", "link": {"symlink": "$OUT"}}
    responses: list[dict[str, Any]] = [
        {"blocks": [{"type": "tool_use", "id": f"toolu_{i:03d}", "name": "Bash", "input": {"command": c}}],
         "stop_reason": "tool_use"} for i, c in enumerate(cmds)]
    responses.append({"blocks": [{"type": "text", "text": "done"}], "stop_reason": "end_turn"})
    return {"files": files, "prompt": "go", "args": ["--permission-mode", "default"], "responses": responses,
            "timeout": 900}


def answers(run: dict[str, Any], cmds: list[str]) -> dict[str, Any]:
    return {cmds[int(r["id"].split("_")[1])]: r["content"] for r in oracle.canon(run)["results"]}


def test_every_table_entry_and_common_command_answers_as_claude_code(tmp_path: Path) -> None:
    if not CLAUDE:
        pytest.skip("Claude Code not found: set $AGENTFSM_CLAUDE to its binary to compare the boundary table")
    cmds = commands()
    scenario = case(cmds)
    with cf.ThreadPoolExecutor(2) as pool:
        cc = pool.submit(oracle.run_client, scenario, oracle.CLAUDE_CODE, tmp_path / "cc", claude=CLAUDE)
        af = pool.submit(oracle.run_client, scenario, oracle.AGENTFSM, tmp_path / "af")
        a, b = answers(cc.result(), cmds), answers(af.result(), cmds)
    assert len(a) == len(cmds), f"Claude Code answered {len(a)} of {len(cmds)} commands"
    differ = {c: (a.get(c), b.get(c)) for c in cmds if a.get(c) != b.get(c) and c not in ACCEPTED}
    # the program Claude Code names ("X in '…' was blocked"), which the table does not list
    lacking = sorted({x.split(" in '", 1)[0] for x, _ in differ.values() if isinstance(x, str)
                      and " was blocked." in x and " in '" in x} - set(REACH) - {"Input redirection from"})
    assert not lacking, f"Claude Code blocks these outside the workspace; add them to REACH: {lacking}"
    assert differ == {}, "\n".join(f"{c}\n  CC: {x}\n  AF: {y}" for c, (x, y) in differ.items())
