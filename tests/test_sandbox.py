"""The kernel sandbox of the model's commands (docs/sandbox.md).

The probes are the bypass classes the shell analysis cannot close (names read from a file, code the
analysis does not parse as code, links made within one command, scripts the model wrote). Each runs
twice: through the Bash tool alone, with no permission check at all — so the sandbox is the only
guard and must hold by itself — and through a whole session in ``bypassPermissions`` with the rules
in its settings, where no byte of a denied file may reach any request body. Denied files must never
change and a denied path that did not exist must still not exist.

Every test that runs bwrap skips, saying why, where the sandbox cannot run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentfsm
from agentfsm.auditing.audit import audit_file
from agentfsm.auditing.checks import severity_of
from agentfsm.hooks.config import SandboxSettings, SettingsError, parse_settings
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.hooks.sandbox import SessionSandbox, Unresolved, resolve_layout
from agentfsm.machine.options import Options
from agentfsm.testing.scripted import ScriptedModel
from agentfsm.tools.base import NoFileRules, ToolContext
from agentfsm.tools.bash import BashTool
from agentfsm.tools.registry import ToolRegistry
from agentfsm.tools.sandbox import SANDBOX, Availability, availability

AVAILABLE = availability()
needs_bwrap = pytest.mark.skipif(not AVAILABLE.ok, reason=f"the sandbox cannot run here: {AVAILABLE.reason}")

SECRET = "SECRETKEY-7f3a91"
SSH = "SSHKEY-c0ffee42"
RULES = ["Read(./secrets/**)", "Read(~/.ssh/**)", "Edit(.env)", "Edit(./locked/**)"]

READ_PROBES = [
    "cat secrets/key.txt",
    "du --files0-from=secrets/key.txt",
    "strings @secrets/key.txt",
    "xargs --arg-file=secrets/key.txt echo",
    "sed -n '1r secrets/key.txt' pub/x.txt",
    "sed -n '/pub/I r secrets/key.txt' pub/x.txt",
    "awk 'BEGIN{while((getline l < \"secrets/key.txt\")>0) print l}'",
    "awk '{print}' ARGV=secrets/key.txt secrets/key.txt",
    "python3 - <<'EOF'\nprint(open('secrets/key.txt').read())\nEOF",
    "python3 <<< \"print(open('secrets/key.txt').read())\"",
    "ln secrets/key.txt h && cat h",
    "ln -s secrets s && cat s/key.txt",
    "ln -s secrets/key.txt sl; cat sl",
    "chmod +x secrets/key.txt && ./secrets/key.txt",
    "cat pub/vlink/../key.txt",
    "tar -C secrets -cf - key.txt | tar -xOf -",
    "mkdir -p e && diff -rN e secrets",
    "find . -type f -exec cat {} +",
    "grep -r SECRET . ; grep -r SSHKEY ~",
    "cat ~/.ssh/id_rsa",
    "cp -r ~/.ssh copied && cat copied/*",
    "printf 'print(open(\"secrets/key.txt\").read())\\n' > s.py && python3 s.py",
    "printf 'import os\\nfor r,_,f in os.walk(\".\"):\\n  [print(open(os.path.join(r,x)).read()) for x in f]\\n'"
    " > w.py && python3 w.py",
    "umount secrets; cat secrets/key.txt",
    "cat /proc/1/environ /proc/$PPID/environ 2>&1 | tr '\\0' '\\n'",
]
WRITE_PROBES = [
    "sed -ne 'w .env' pub/x.txt",
    "touch .env",
    "printf 'all:\\n\\techo HACK > .env\\n\\techo HACK > locked/a.txt\\n' > Makefile && make",
    "echo HACK > locked/a.txt",
    "echo HACK >> locked/a.txt",
    "python3 -c \"open('locked/a.txt','w').write('HACK')\"",
    "rm -rf locked",
    "mv locked moved",
    "mv locked/a.txt pub/",
    "ln -s locked/a.txt l && echo HACK > l",
    "ln locked/a.txt hl && echo HACK > hl",
    "cd locked && echo HACK > new.txt",
    "tar --checkpoint=1 --checkpoint-action=exec='echo HACK > .env' -cf /dev/null pub",
    "sed -i s/orig/HACK/ locked/a.txt",
    "printf 'open(\".env\",\"w\").write(\"HACK\")\\n' > m.py && python3 m.py",
]


def _tree(path: Path) -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = Path(root, f)
            out[str(p.relative_to(path))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SSH + "\n")
    monkeypatch.setenv("HOME", str(home))
    w = tmp_path / "ws"
    (w / "secrets" / "vault").mkdir(parents=True)
    (w / "secrets" / "key.txt").write_text(SECRET + "\n")
    (w / "locked").mkdir()
    (w / "locked" / "a.txt").write_text("orig\n")
    (w / "pub").mkdir()
    (w / "pub" / "x.txt").write_text("pub line\n")
    os.symlink("../secrets/vault", w / "pub" / "vlink")
    yield w


def _guarded(ws: Path) -> dict[str, Any]:
    return {"locked": _tree(ws / "locked"), "secrets": _tree(ws / "secrets"), "env": (ws / ".env").exists(),
            "ssh": _tree(Path(os.environ["HOME"]) / ".ssh")}


def _sandbox(ws: Path, settings: SandboxSettings | None = None, **kw: Any) -> SessionSandbox:
    policy = PermissionPolicy.build(ws, mode="bypassPermissions", deny=RULES)
    return SessionSandbox(settings or SandboxSettings(), policy, **kw)


async def _bash(ws: Path, sandbox: SessionSandbox, command: str, **extra: Any) -> str:
    ctx = ToolContext(cwd=ws, session_id="s", tool_use_id="toolu_probe", abort=asyncio.Event(),
                      services={SANDBOX: sandbox}, file_access=NoFileRules())
    out = await BashTool().call({"command": command, **extra}, ctx)
    return str(out.data)


# --- the sandbox alone holds ------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("command", READ_PROBES + WRITE_PROBES)
async def test_the_sandbox_alone_holds_every_probe(ws: Path, command: str) -> None:
    before = _guarded(ws)
    records: list[dict[str, Any]] = []
    out = await _bash(ws, _sandbox(ws, observer=records.append), command)
    assert SECRET not in out and SSH not in out, out
    assert _guarded(ws) == before, out
    assert [r["sandboxed"] for r in records] == [True]


@needs_bwrap
async def test_what_the_rules_do_not_deny_still_works(ws: Path) -> None:
    out = await _bash(ws, _sandbox(ws), "echo made > new.txt && cat new.txt pub/x.txt && mkdir d && ls locked "
                                        "&& cat locked/a.txt && echo t > $(mktemp) && echo ok")
    assert out.splitlines() == ["made", "pub line", "a.txt", "orig", "ok"]
    assert (ws / "new.txt").read_text() == "made\n"


@needs_bwrap
async def test_a_kernel_refusal_is_the_programs_own_error(ws: Path) -> None:
    out = await _bash(ws, _sandbox(ws), "echo HACK > locked/a.txt")
    assert "locked/a.txt: Read-only file system" in out
    assert out.startswith("Exit code 1")


@needs_bwrap
async def test_a_denied_path_that_does_not_exist_cannot_be_created_and_leaves_nothing(ws: Path) -> None:
    out = await _bash(ws, _sandbox(ws), "echo HACK > .env; test -s .env || echo EMPTY")
    assert "Read-only file system" in out and "EMPTY" in out
    # the placeholder bwrap mounted over .env is gone once the command ended
    assert not (ws / ".env").exists()


@needs_bwrap
async def test_globs_at_any_depth_are_resolved_when_the_command_starts(ws: Path) -> None:
    policy = PermissionPolicy.build(ws, mode="bypassPermissions", deny=["Read(**/*.pem)"])
    sandbox = SessionSandbox(SandboxSettings(), policy)
    assert "PEMSECRET" in await _bash(ws, sandbox, "mkdir -p a/b && echo PEMSECRET > a/b/c.pem && cat a/b/c.pem")
    # the next command starts after the file exists: it is masked now
    assert "PEMSECRET" not in await _bash(ws, sandbox, "cat a/b/c.pem; python3 -c 'print(open(\"a/b/c.pem\").read())'")


@needs_bwrap
async def test_a_dangling_symlink_at_a_denied_path_cannot_create_its_target(ws: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "made-through-the-link", ws / ".env")
    out = await _bash(ws, _sandbox(ws), "echo HACK > .env")
    assert "Read-only file system" in out and not (tmp_path / "made-through-the-link").exists()


@needs_bwrap
async def test_other_hard_linked_names_are_masked_too(ws: Path) -> None:
    os.link(ws / "secrets" / "key.txt", ws / "pub" / "innocent.txt")
    out = await _bash(ws, _sandbox(ws), "cat pub/innocent.txt")
    assert SECRET not in out and "Permission denied" in out


@needs_bwrap
async def test_background_commands_run_sandboxed_and_release_their_placeholders(ws: Path) -> None:
    from agentfsm.tools.bash import BACKGROUND_JOBS

    out = await _bash(ws, _sandbox(ws), "sleep 0.3; cat secrets/key.txt; touch .env; echo ran > bg.txt",
                      run_in_background=True)
    job_id = out.split("ID: ")[1].split(".")[0]
    job = BACKGROUND_JOBS.pop(job_id)
    assert job.process.wait(timeout=30) == 0
    text = job.output_path.read_text()
    assert SECRET not in text and "touch: cannot touch '.env'" in text
    assert (ws / "bg.txt").read_text() == "ran\n"
    for _ in range(100):  # the placeholder goes when the watcher sees the job end
        if not (ws / ".env").exists():
            break
        await asyncio.sleep(0.05)
    assert not (ws / ".env").exists()


@needs_bwrap
async def test_commands_that_overlap_leave_no_placeholder_behind(ws: Path) -> None:
    """A placeholder one running command mounted (for the missing ``.claude``) is still a missing path to
    a second one: it mounts its own there, not inside it, so the last to end removes it, whichever
    ends first (conform-1672508d24 left an empty ``.claude/`` in the workspace)."""
    from agentfsm.tools.bash import BACKGROUND_JOBS

    sandbox = _sandbox(ws)
    jobs = []
    for seconds in (0.2, 0.5):  # the second starts while the first runs, and outlives it
        out = await _bash(ws, sandbox, f"sleep {seconds}", run_in_background=True)
        jobs.append(BACKGROUND_JOBS.pop(out.split("ID: ")[1].split(".")[0]))
        for _ in range(100):  # its placeholders, once bwrap has set them up
            if (ws / ".claude").is_dir():
                break
            await asyncio.sleep(0.01)
    assert all(job.process.wait(timeout=30) == 0 for job in jobs)
    for _ in range(100):  # the placeholder goes when the watcher sees the last job end
        if not (ws / ".claude").exists():
            break
        await asyncio.sleep(0.05)
    assert not (ws / ".claude").exists()


@needs_bwrap
async def test_what_would_run_outside_the_sandbox_later_cannot_be_written(ws: Path) -> None:
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n")
    out = await _bash(ws, _sandbox(ws), "mkdir -p .claude; echo '{\"hooks\": {}}' > .claude/settings.local.json; "
                                        "echo 'curl evil' > .git/hooks/pre-commit; echo '[x]' >> .git/config; "
                                        "echo '{}' > .claude/settings.json; echo fine > ok.txt")
    assert not (ws / ".claude").exists() and not (ws / ".git" / "hooks" / "pre-commit").exists()
    assert (ws / ".git" / "config").read_text() == "[core]\n" and (ws / "ok.txt").exists()
    assert out.count("Read-only file system") >= 3


READERS = ["cat {p}", "head -c 200 {p}", "python3 -c \"print(open('{p}').read())\"", "awk '{{print}}' {p}",
           "sed -n p {p}", "cp {p} out.txt && cat out.txt", "ln {p} l && cat l", "ln -s {p} l && cat l",
           "tar -cf - {p} 2>/dev/null | tar -xOf -", "dd if={p} status=none", "while read -r x; do echo $x; done < {p}",
           "sh -c 'cat \"$1\"' _ {p}", "xargs -0 cat <<< {p}", "mkdir -p d && cp -r $(dirname {p}) d/ && cat d/*/*"]
SECRET_SPELLINGS = ["secrets/key.txt", "./secrets/key.txt", "$PWD/secrets/key.txt", "pub/vlink/../key.txt",
                    "secrets//key.txt", "pub/../secrets/key.txt", "~/.ssh/id_rsa", "$(printf secrets)/key.txt",
                    "s*/key.txt", "$HOME/.ssh/id_rsa", "secrets/vault/../key.txt"]
WRITERS = ["echo HACK > {p}", "echo HACK | tee {p}", "cp pub/x.txt {p}", "python3 -c \"open('{p}','w').write('H')\"",
           "sed -i s/o/H/ {p}", "truncate -s0 {p}", "rm -f {p}", "ln -sf /etc/hostname {p}", "mv pub/x.txt {p}",
           "touch {p}", "dd of={p} if=/dev/zero count=1 status=none", "printf H >> {p}"]
TARGETS = [".env", "./.env", "$PWD/.env", "locked/a.txt", "./locked/a.txt", "locked/../locked/a.txt",
           "$PWD/locked/a.txt", "l*/a.txt", "pub/../.env"]


@needs_bwrap
@settings(max_examples=int(os.environ.get("AGENTFSM_SANDBOX_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(st.tuples(st.just("r"), st.sampled_from(READERS), st.sampled_from(SECRET_SPELLINGS)),
                                st.tuples(st.just("w"), st.sampled_from(WRITERS), st.sampled_from(TARGETS))),
                      min_size=1, max_size=4),
       joiner=st.sampled_from([" ; ", " && ", " || ", " | "]))
def test_composed_commands_never_get_past_the_sandbox(ws: Path, parts: list[tuple[str, str, str]],
                                                      joiner: str) -> None:
    before = _guarded(ws)
    command = joiner.join(template.format(p=path) for _kind, template, path in parts)
    try:
        out = asyncio.run(_bash(ws, _sandbox(ws), command))
        assert SECRET not in out and SSH not in out, (command, out)
        assert _guarded(ws) == before, (command, out)
    finally:
        for leftover in ("out.txt", "l", "d"):
            target = ws / leftover
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                import shutil

                shutil.rmtree(target)
        if not (ws / "pub" / "x.txt").exists():
            (ws / "pub" / "x.txt").write_text("pub line\n")


# --- through a whole session: no denied byte reaches a request body ------------------------------


@needs_bwrap
async def test_no_denied_byte_reaches_a_request_and_nothing_denied_changes(ws: Path, tmp_path: Path) -> None:
    before = _guarded(ws)
    probes = READ_PROBES + WRITE_PROBES
    script = [{"blocks": [{"type": "tool_use", "id": f"toolu_{i:03d}", "name": "Bash", "input": {"command": c}}]}
              for i, c in enumerate(probes)]
    model = ScriptedModel([*script, {"blocks": [{"type": "text", "text": "DONE"}]}])
    settings = json.dumps({"permissions": {"deny": RULES}})
    options = Options(cwd=ws, permission_mode="bypassPermissions", settings=settings, setting_sources=(),
                      sessions_dir=tmp_path / "sessions", tools=("Bash",))
    msgs = [m async for m in agentfsm.query("probe", options=options, client=model)]
    assert msgs[0]["sandbox"]["enabled"] is True
    assert msgs[-1]["result"] == "DONE"
    bodies = json.dumps(model.bodies)
    assert SECRET not in bodies and SSH not in bodies
    assert _guarded(ws) == before
    # the trace says each command ran sandboxed, under which policy; audit finds none unsandboxed
    trace = next((tmp_path / "sessions").glob("*.jsonl"))
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    ran = [r for r in records if r["type"] == "sandbox"]
    # the shell analysis refuses some probes before anything runs; every one that ran was sandboxed
    assert ran and all(r["sandboxed"] and r["policy"]["digest"] for r in ran)
    findings = audit_file(trace)
    assert not [f for f in findings if f.code == "unsandboxed_command"]
    # the sandbox records sit between a call and its result without disturbing the replay
    assert not [f for f in findings if severity_of(f.code) == "error"], findings


@needs_bwrap
async def test_no_sandbox_option_runs_unsandboxed_and_audit_reports_it(ws: Path, tmp_path: Path) -> None:
    model = ScriptedModel([{"blocks": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                        "input": {"command": "echo hi"}}]},
                           {"blocks": [{"type": "text", "text": "DONE"}]}])
    options = Options(cwd=ws, permission_mode="bypassPermissions", setting_sources=(), sandbox=False,
                      sessions_dir=tmp_path / "sessions", tools=("Bash",))
    msgs = [m async for m in agentfsm.query("go", options=options, client=model)]
    assert msgs[0]["sandbox"] == {"enabled": False, "reason": "--no-sandbox"}
    trace = next((tmp_path / "sessions").glob("*.jsonl"))
    found = [f for f in audit_file(trace) if f.code == "unsandboxed_command"]
    assert len(found) == 1 and "--no-sandbox" in found[0].message


@needs_bwrap
async def test_a_session_with_sandbox_records_resumes(ws: Path, tmp_path: Path) -> None:
    model = ScriptedModel([{"blocks": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                        "input": {"command": "echo hi"}}]},
                           {"blocks": [{"type": "text", "text": "DONE"}]}])
    opts = Options(cwd=ws, permission_mode="bypassPermissions", setting_sources=(),
                   sessions_dir=tmp_path / "sessions", tools=("Bash",))
    first = [m async for m in agentfsm.query("go", options=opts, client=model)]
    again = ScriptedModel([{"blocks": [{"type": "text", "text": "AGAIN"}]}])
    resumed = Options(cwd=ws, permission_mode="bypassPermissions", setting_sources=(), resume=first[-1]["session_id"],
                      sessions_dir=tmp_path / "sessions", tools=("Bash",))
    second = [m async for m in agentfsm.query("more", options=resumed, client=again)]
    assert second[-1]["result"] == "AGAIN"
    # the resumed request carries the earlier call and its result
    assert "toolu_1" in json.dumps(again.bodies[0]["messages"])


# --- settings --------------------------------------------------------------------------------


def test_sandbox_settings_parse_with_claude_codes_keys(tmp_path: Path) -> None:
    s = parse_settings({"sandbox": {"enabled": True, "failIfUnavailable": True, "autoAllowBashIfSandboxed": False,
                                    "allowUnsandboxedCommands": False, "excludedCommands": ["docker"],
                                    "filesystem": {"allowWrite": ["~/.cache"], "denyRead": ["./private"],
                                                   "denyWrite": ["/conf"]},
                                    "network": {"allowedDomains": ["pypi.org"], "allowLocalBinding": True}}},
                       source="s.json", root=tmp_path).sandbox
    assert (s.enabled, s.fail_if_unavailable, s.auto_allow_bash, s.allow_unsandboxed) == (True, True, False, False)
    assert s.excluded_commands == ("docker",) and s.allowed_domains == ("pypi.org",)
    assert [p.spec for p in s.deny_read] == ["./private"] and s.deny_write[0].root == tmp_path


@pytest.mark.parametrize(("value", "needle"), [
    ({"enabled": "yes"}, "sandbox.enabled must be true or false"),
    ({"excludedCommands": "docker"}, "sandbox.excludedCommands must be a list"),
    ({"filesystem": {"denyRead": [1]}}, "sandbox.filesystem.denyRead[0] must be a non-empty string, got 1"),
    ({"network": []}, "sandbox.network must be an object"),
    ([], "sandbox must be an object, got []"),
])
def test_bad_sandbox_settings_get_a_clear_error(tmp_path: Path, value: Any, needle: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(needle)):
        parse_settings({"sandbox": value}, source="s.json", root=tmp_path)


def _never() -> Availability:
    return Availability(False, None, "test: no user namespaces")


def test_unavailable_sandbox_runs_unsandboxed_or_refuses_when_required(ws: Path) -> None:
    soft = _sandbox(ws, probe_with=_never)
    prepared = soft.prepare("true", ws, shell="/bin/bash", disable_requested=False, tool_use_id="t")
    assert not prepared.sandboxed and prepared.refusal is None and "no user namespaces" in prepared.record["reason"]
    assert soft.status()["enabled"] is False and soft.unavailable_error is None
    hard = _sandbox(ws, SandboxSettings(fail_if_unavailable=True), probe_with=_never)
    assert hard.unavailable_error is not None and "failIfUnavailable" in hard.unavailable_error
    refused = hard.prepare("true", ws, shell="/bin/bash", disable_requested=False, tool_use_id="t")
    assert refused.refusal is not None


def test_session_refuses_to_start_without_a_required_sandbox(ws: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentfsm.hooks.sandbox.availability", _never)
    settings = json.dumps({"sandbox": {"enabled": True, "failIfUnavailable": True}})
    options = Options(cwd=ws, setting_sources=(), settings=settings, sessions_dir=tmp_path / "s")
    with pytest.raises(ValueError, match="failIfUnavailable"):
        agentfsm.Session(options, client=ScriptedModel([]))


@needs_bwrap
def test_disable_flag_excluded_commands_and_settings_decide_who_runs_outside(ws: Path) -> None:
    def how(sandbox: SessionSandbox, command: str, disable: bool = False) -> str:
        p = sandbox.prepare(command, ws, shell="/bin/bash", disable_requested=disable, tool_use_id="t")
        return "in" if p.sandboxed else p.record["reason"]

    default = _sandbox(ws, SandboxSettings(excluded_commands=("docker",)))
    assert how(default, "ls") == "in"
    assert how(default, "ls", disable=True) == "dangerouslyDisableSandbox"
    assert how(default, "docker ps -a") == "excludedCommands"
    # every part must be excluded: a compound with anything else runs sandboxed
    assert how(default, "docker ps && cat secrets/key.txt") == "in"
    strict = _sandbox(ws, SandboxSettings(allow_unsandboxed=False))
    assert how(strict, "ls", disable=True) == "in"
    assert how(_sandbox(ws, SandboxSettings(enabled=False)), "ls") == "sandbox.enabled=false"
    assert how(_sandbox(ws, cli_enabled=False), "ls") == "--no-sandbox"


@needs_bwrap
def test_auto_allow_follows_claude_codes_meaning(ws: Path) -> None:
    bash = BashTool()
    on_by_default = _sandbox(ws)
    assert not on_by_default.auto_allows(bash, {"command": "make"})
    explicit = _sandbox(ws, SandboxSettings(enabled=True))
    assert explicit.auto_allows(bash, {"command": "make"})
    assert not explicit.auto_allows(bash, {"command": "make", "dangerouslyDisableSandbox": True})
    assert not _sandbox(ws, SandboxSettings(enabled=True, auto_allow_bash=False)).auto_allows(bash, {"command": "x"})
    policy = PermissionPolicy.build(ws, mode="default", deny=RULES)
    policy.sandbox_auto_allow = SessionSandbox(SandboxSettings(enabled=True), policy).auto_allows
    assert policy.evaluate(bash, {"command": "make"}).behavior == "allow"
    # deny rules still come first
    assert policy.evaluate(bash, {"command": "cat secrets/key.txt"}).behavior == "deny"
    assert ToolRegistry([bash]).names() == ["Bash"]


# --- resolving the rules (no bwrap needed) ----------------------------------------------------------


def test_layout_masks_literal_parts_globs_and_absent_paths(ws: Path) -> None:
    (ws / "deep" / "er").mkdir(parents=True)
    (ws / "deep" / "er" / ".env").write_text("x")
    layout = resolve_layout(ws, read_rules=[("./secrets/**", None), ("**/*.pem", None)],
                            write_rules=[(".env", None), ("./locked/**", None), ("./gone/**", None)],
                            writable=[ws])
    real = os.path.realpath(ws)
    assert layout.hidden_dirs == (f"{real}/secrets",)
    assert set(layout.read_only) == {f"{real}/locked", f"{real}/deep/er/.env"}
    assert dict(layout.absent) == {f"{real}/.env": False, f"{real}/gone": True}


def test_a_masked_directory_does_not_reach_its_siblings_that_share_its_name_as_a_prefix(ws: Path) -> None:
    """Denying ``secrets/`` says nothing of ``secrets-old/`` or ``secrets.txt`` next to it: a sibling
    denied by a rule of its own is masked in its own right (not taken for part of ``secrets/``), and a
    file a write rule protects beside it stays protected."""
    (ws / "secrets-old").mkdir()
    (ws / "secrets-old" / "key.txt").write_text("old\n")
    (ws / "secrets.txt").write_text("list\n")
    (ws / "secrets-notes").mkdir()
    (ws / "secrets-notes" / "todo").write_text("x\n")
    layout = resolve_layout(ws, read_rules=[("./secrets/**", None), ("./secrets-old/**", None),
                                            ("./secrets.txt", None)],
                            write_rules=[("./secrets-notes/todo", None)], writable=[ws])
    real = os.path.realpath(ws)
    assert set(layout.hidden_dirs) == {f"{real}/secrets", f"{real}/secrets-old"}
    assert layout.hidden_files == (f"{real}/secrets.txt",)
    assert layout.read_only == (f"{real}/secrets-notes/todo",)


def test_the_trace_summary_counts_only_what_it_leaves_out() -> None:
    """A policy's trace record lists up to SUMMARY_PATHS paths of each kind; the count of all of them
    appears only when some were left out."""
    from agentfsm.tools.sandbox import SUMMARY_PATHS, Layout

    def paths(n: int) -> tuple[str, ...]:
        return tuple(f"/ws/p{i:03}" for i in range(n))

    whole = Layout(read_only=paths(SUMMARY_PATHS), hidden_files=paths(SUMMARY_PATHS),
                   absent=tuple((p, False) for p in paths(SUMMARY_PATHS))).summary()
    assert len(whole["read_only"]) == len(whole["hidden"]) == len(whole["absent"]) == SUMMARY_PATHS
    assert not {"read_only_count", "hidden_count", "absent_count"} & set(whole)
    cut = Layout(read_only=paths(SUMMARY_PATHS + 1), hidden_dirs=paths(SUMMARY_PATHS + 1),
                 absent=tuple((p, True) for p in paths(SUMMARY_PATHS + 1))).summary()
    assert len(cut["read_only"]) == SUMMARY_PATHS
    assert (cut["read_only_count"], cut["hidden_count"], cut["absent_count"]) == (SUMMARY_PATHS + 1,) * 3


def test_the_network_bridge_leaves_the_command_no_way_around_the_proxy(tmp_path: Path) -> None:
    """Proxy variables inherited from outside (NO_PROXY=*, an ALL_PROXY elsewhere) would let the
    command skip the allow-list proxy: the bridge drops them and points both HTTP(S)_PROXY at itself."""
    import subprocess
    import sys

    from agentfsm.tools.sandbox import BRIDGE

    env = {**os.environ, "NO_PROXY": "*", "no_proxy": "*", "ALL_PROXY": "socks5://10.0.0.1:1080",
           "all_proxy": "socks5://10.0.0.1:1080", "HTTP_PROXY": "http://10.0.0.1:3128"}
    script = 'echo "${NO_PROXY-unset}|${no_proxy-unset}|${ALL_PROXY-unset}|${all_proxy-unset}|$HTTP_PROXY|$https_proxy"'
    done = subprocess.run([sys.executable, "-I", "-S", str(BRIDGE), str(tmp_path / "no.sock"), "--", "sh", "-c",
                           script], env=env, capture_output=True, text=True, timeout=30)
    seen = done.stdout.strip().split("|")
    assert seen[:4] == ["unset"] * 4, done.stdout
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", seen[4]) and seen[5] == seen[4]


@pytest.mark.parametrize(("script", "status"), [("exit 3", 3), ("kill -TERM $$", 143), ("kill -KILL $$", 137)])
def test_the_network_bridge_exits_with_its_commands_status(tmp_path: Path, script: str, status: int) -> None:
    """The bridge stands between the shell and the command in a network-isolated sandbox: the status
    the Bash tool reports is the command's, a death by signal N as 128 + N (the shell's convention)."""
    import subprocess
    import sys

    from agentfsm.tools.sandbox import BRIDGE

    done = subprocess.run([sys.executable, "-I", "-S", str(BRIDGE), str(tmp_path / "no.sock"), "--",
                           "sh", "-c", script], timeout=30)
    assert done.returncode == status


def test_layout_resolution_has_a_budget_and_fails_closed(ws: Path) -> None:
    for i in range(50):
        (ws / "pub" / f"f{i}").write_text("x")
    with pytest.raises(Unresolved):
        resolve_layout(ws, read_rules=[("**/*.pem", None)], write_rules=[], writable=[ws], walk_limit=20)


def test_a_hard_link_outside_the_writable_places_refuses_the_command(ws: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.link(ws / "secrets" / "key.txt", elsewhere / "copy")
    with pytest.raises(Unresolved, match="hard-linked"):
        resolve_layout(ws, read_rules=[("./secrets/**", None)], write_rules=[], writable=[ws])


# --- network (loopback only) ------------------------------------------------------------------------


@pytest.fixture
def web() -> Iterator[int]:
    import http.server
    import threading

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"HELLO-FROM-LOOPBACK"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _fetch(url: str) -> str:
    return ("python3 -c \"import urllib.request,sys\ntry: print(urllib.request.urlopen('" + url
            + "', timeout=10).read().decode())\nexcept Exception as e: print('FAILED', e)\"")


def _connect(port: int) -> str:
    return (f"python3 -c \"import socket\ntry: socket.create_connection(('127.0.0.1', {port}), 5); print('CONNECTED')\n"
            "except OSError as e: print('REFUSED', e)\"")


@needs_bwrap
async def test_without_network_settings_the_network_is_shared(ws: Path, web: int) -> None:
    out = await _bash(ws, _sandbox(ws), _fetch(f"http://127.0.0.1:{web}/"))
    assert "HELLO-FROM-LOOPBACK" in out


@needs_bwrap
async def test_allowed_domains_pass_through_the_proxy_and_nothing_else_does(ws: Path, web: int) -> None:
    sandbox = _sandbox(ws, SandboxSettings(allowed_domains=("localhost",)))
    try:
        assert "HELLO-FROM-LOOPBACK" in await _bash(ws, sandbox, _fetch(f"http://localhost:{web}/"))
        refused = await _bash(ws, sandbox, _fetch(f"http://127.0.0.1:{web}/"))
        assert "HELLO" not in refused and "403" in refused
        # around the proxy: the sandbox has a network of its own, the host's loopback is not in it
        assert "REFUSED" in await _bash(ws, sandbox, _connect(web))
        records: list[dict[str, Any]] = []
        sandbox.observer = records.append
        await _bash(ws, sandbox, "true")
        assert records[0]["policy"]["network"] == "isolated"
    finally:
        sandbox.close()


@needs_bwrap
async def test_denied_domains_win_and_an_empty_allow_list_cuts_the_network(ws: Path, web: int) -> None:
    sandbox = _sandbox(ws, SandboxSettings(allowed_domains=("localhost",), denied_domains=("localhost",)))
    try:
        assert "403" in await _bash(ws, sandbox, _fetch(f"http://localhost:{web}/"))
    finally:
        sandbox.close()
    closed = _sandbox(ws, SandboxSettings(allowed_domains=()))
    out = await _bash(ws, closed, _fetch(f"http://localhost:{web}/") + "; " + _connect(web))
    assert "HELLO" not in out and "REFUSED" in out


def test_domain_patterns_read_as_claude_codes() -> None:
    from agentfsm.tools.sandbox_proxy import domain_allowed

    assert domain_allowed("pypi.org", ["pypi.org"]) and not domain_allowed("evil-pypi.org", ["pypi.org"])
    assert domain_allowed("files.pythonhosted.org", ["*.pythonhosted.org"])
    assert not domain_allowed("pythonhosted.org", ["*.pythonhosted.org"])
    assert not domain_allowed("a.example.com", ["*.example.com"], ["a.example.com"])
    assert domain_allowed("PyPI.org.", ["pypi.org"]) and not domain_allowed("", ["pypi.org"])


def test_kept_listings_see_every_change_even_with_the_mtime_put_back(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from agentfsm.hooks.sandbox import _Listings

    monkeypatch.setattr(_Listings, "RACY_S", -1.0)  # trust listings at once (the race is tested by design)
    listings = _Listings()
    d = tmp_path / "d"
    d.mkdir()
    (d / "a").write_text("x")
    assert listings.entries(str(d)) == (("a",), ())
    before = os.stat(d)
    (d / "new.pem").write_text("secret")
    # a command covering its tracks: the directory's mtime set back to what it was
    os.utime(d, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(d).st_mtime_ns == before.st_mtime_ns
    assert sorted(listings.entries(str(d))[0]) == ["a", "new.pem"]


def test_a_listing_made_right_after_a_change_is_not_kept(tmp_path: Path) -> None:
    from agentfsm.hooks.sandbox import _Listings

    listings = _Listings()
    (tmp_path / "f").write_text("x")
    listings.entries(str(tmp_path))
    assert str(tmp_path) not in listings._kept
