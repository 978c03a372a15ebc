"""The evasion corpus for ``Bash(...)`` deny rules (tests/evasion/rm_spellings.json): every spelling
that makes bash run ``rm`` is denied by ``Bash(rm:*)`` and ``Bash(rm *)`` in every permission mode,
and the corpus itself is checked against real bash (each entry really deletes ``./x``).

Add every bypass found to the corpus; the tests below then keep it closed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfsm.common.modes import PERMISSION_MODES
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.tools import BashTool

CORPUS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "evasion" / "rm_spellings.json").read_text(encoding="utf-8"))["entries"]
RUNS_RM = [e for e in CORPUS if e["runs"] == "rm"]
OTHER = [e for e in CORPUS if e["runs"] != "rm"]
BASH = BashTool()


def ids(entries: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entries]


@pytest.mark.parametrize("rule", ["Bash(rm:*)", "Bash(rm *)"])
@pytest.mark.parametrize("entry", RUNS_RM, ids=ids(RUNS_RM))
def test_every_spelling_of_rm_is_denied_in_every_mode(tmp_path: Path, entry: dict[str, Any], rule: str) -> None:
    for mode in PERMISSION_MODES:
        p = PermissionPolicy.build(tmp_path, mode=mode, deny=[rule], allow=["Bash"])
        d = p.evaluate(BASH, {"command": entry["command"]})
        assert d.behavior == "deny" and d.decided_by == "rule", (mode, entry["command"], d)


@pytest.mark.parametrize("entry", OTHER, ids=ids(OTHER))
def test_other_programs_are_not_claimed_by_a_program_rule(tmp_path: Path, entry: dict[str, Any]) -> None:
    # `Bash(rm:*)` names a program; protecting the file is what `Edit(...)` rules are for
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=["Bash(rm:*)"])
    assert p.evaluate(BASH, {"command": entry["command"]}).behavior == "allow"
    q = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=["Edit(./x)"])
    assert q.evaluate(BASH, {"command": entry["command"]}).behavior == "deny", entry["command"]


def _removes_x(command: str, where: Path) -> tuple[bool, subprocess.CompletedProcess[str]]:
    where.mkdir()
    (where / "x").write_text("x\n")
    done = subprocess.run(["bash", "-c", command], cwd=where, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HOME": str(where)})
    return not (where / "x").exists(), done


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("entry", CORPUS, ids=ids(CORPUS))
def test_the_corpus_is_real(tmp_path: Path, entry: dict[str, Any]) -> None:
    removed, done = _removes_x(entry["command"], tmp_path / "w")
    if not removed and done.returncode in (126, 127):
        pytest.skip(f"a program the entry needs is missing here: {done.stderr.strip()[:120]}")
    assert removed, (entry["command"], done.returncode, done.stderr)


# --- composition: wrappers and quoting around the corpus still run rm, and are still denied ----------

WRAPPERS = ["{}", "env {}", "nice -n 1 {}", "timeout 9 {}", "bash -c {q}", "sh -c {q}", "eval {q}",
            "true && {}", "{}; true", "( {} )", "{{ {}; }}", "if true; then {}; fi", "echo $({})", "command {}",
            "nohup {}", "exec {}", "sudo -E {}", "xargs -0 sh -c {q} _ < /dev/null || {}", "env >/dev/null {}",
            "nohup 2>/dev/null {}", "{} </dev/null", "time -p {}", "exec 2>&1; {}", "stdbuf -oL {}",
            "taskset -c 0 {}", "ionice -c 3 {}", "command -p {}", "builtin command {}", "setsid -w {}"]


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@settings(max_examples=60, deadline=None)
@given(entry=st.sampled_from(RUNS_RM), wrapper=st.lists(st.sampled_from(WRAPPERS), min_size=1, max_size=2))
def test_wrapped_spellings_that_run_rm_are_denied(tmp_path_factory: pytest.TempPathFactory, entry: dict[str, Any],
                                                  wrapper: list[str]) -> None:
    """For compositions of corpus entries with wrappers and quoting: if bash deletes ``x`` with it,
    the rule denies it (no false allow)."""
    command = entry["command"]
    for w in wrapper:
        command = w.format(command, q=_quote(command))
    removed, _ = _removes_x(command, tmp_path_factory.mktemp("w") / "w")
    p = PermissionPolicy.build("/", mode="bypassPermissions", deny=["Bash(rm:*)"])
    if removed:
        assert p.evaluate(BASH, {"command": command}).behavior == "deny", command


# --- path semantics: what a path names once the kernel resolves it (tests/evasion/path_semantics.json) -----

PATH_CORPUS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "evasion" / "path_semantics.json").read_text(encoding="utf-8"))["entries"]
PATH_RULES = ["Read(./secrets/**)", "Edit(./locked/**)"]


def path_workspace(root: Path) -> Path:
    """secrets/ (a key and a vault), locked/, pub/ with links into both, an empty e/; a git repository."""
    ws = root / "ws"
    for d in ("secrets/vault", "locked/sub", "pub", "e"):
        (ws / d).mkdir(parents=True)
    (ws / "secrets" / "key.txt").write_text("SECRET_MARKER\n")
    (ws / "secrets" / "vault" / "v.txt").write_text("vault\n")
    (ws / "locked" / "conf.txt").write_text("original\n")
    (ws / "pub" / "p.txt").write_text("public\n")
    (ws / "pub" / "mk").write_text("all:\n\tcat key.txt\n")
    (ws / "pub" / "vlink").symlink_to("../secrets/vault")
    (ws / "pub" / "lk").symlink_to("../locked/sub")
    if shutil.which("git") is not None:
        subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
        subprocess.run(["git", "add", "-A"], cwd=ws, check=True)
    return ws


@pytest.mark.parametrize("entry", PATH_CORPUS, ids=ids(PATH_CORPUS))
def test_paths_are_judged_where_the_kernel_resolves_them(tmp_path: Path, entry: dict[str, Any]) -> None:
    ws = path_workspace(tmp_path)
    for mode in PERMISSION_MODES:
        p = PermissionPolicy.build(ws, mode=mode, deny=PATH_RULES, allow=["Bash"])
        d = p.evaluate(BASH, {"command": entry["command"]})
        assert d.behavior == "deny" and d.decided_by == "rule", (mode, entry["command"], d)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize("entry", PATH_CORPUS, ids=ids(PATH_CORPUS))
def test_the_path_corpus_is_real(tmp_path: Path, entry: dict[str, Any]) -> None:
    # each entry really reads the secret or really writes the locked file when bash runs it
    ws = path_workspace(tmp_path)
    done = subprocess.run(["bash", "-c", entry["command"]], cwd=ws, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HOME": str(tmp_path), "CDPATH": ""})
    if done.returncode in (126, 127) and "SECRET_MARKER" not in done.stdout:
        pytest.skip(f"a program the entry needs is missing here: {done.stderr.strip()[:120]}")
    if entry["effect"] == "reads":
        assert "SECRET_MARKER" in done.stdout, (entry["command"], done.returncode, done.stderr)
    else:
        assert (ws / "locked" / "conf.txt").read_text() != "original\n", (entry["command"], done.stderr)


def test_the_same_paths_without_the_detour_are_allowed(tmp_path: Path) -> None:
    # the resolution must not deny what does not reach the protected files
    ws = path_workspace(tmp_path)
    p = PermissionPolicy.build(ws, mode="bypassPermissions", deny=PATH_RULES)
    # (a directory read as a whole is walked through its links: pub, which links into secrets, is not
    # one to name here)
    for command in ("cat pub/vlink/../../pub/p.txt", "cat pub/p.txt", "cd pub/vlink/.. && cat p.txt",
                    "tar -C locked -cf - conf.txt", "diff -r e locked", "git -C e status",
                    "echo x > pub/new.txt", "CDPATH=locked cd sub && cat ../conf.txt"):
        assert p.evaluate(BASH, {"command": command}).behavior == "allow", command
