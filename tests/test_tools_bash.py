"""Bash: output and exit codes, truncation, timeout/abort/cancel killing the process group,
background jobs, and the read-only classifier."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.tools.base import NoFileRules, ToolContext, ToolOutput
from agentfsm.tools.bash import (
    ABORTED,
    BACKGROUND_JOBS,
    MAX_OUTPUT_CHARS,
    BashTool,
    format_duration,
    is_read_only_command,
    start_background,
    stop_background,
)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(cwd=tmp_path, file_access=NoFileRules())


async def bash(ctx: ToolContext, command: str, **kw: object) -> ToolOutput:
    return await BashTool().call({"command": command, **kw}, ctx)


def alive(pid: int) -> bool:
    """Running and not a zombie (a killed child may linger unreaped under some init processes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_dead(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


async def read_pid(path: Path, within: float = 5.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


# --- output ----------------------------------------------------------------------------------


async def test_stdout_and_stderr_are_combined(ctx: ToolContext) -> None:
    out = await bash(ctx, "echo out; echo err >&2")
    assert out == ToolOutput("out\nerr")


async def test_nonzero_exit_is_an_error_with_its_code(ctx: ToolContext) -> None:
    out = await bash(ctx, "echo partial; exit 3")
    assert out.is_error and out.data == "Exit code 3\npartial"
    assert (await bash(ctx, "false")).data == "Exit code 1"


async def test_death_by_signal_reports_128_plus_signal(ctx: ToolContext) -> None:
    out = await bash(ctx, "kill -9 $$")
    assert out.is_error and out.data == "Exit code 137"


async def test_runs_in_cwd_with_no_stdin(ctx: ToolContext, tmp_path: Path) -> None:
    assert (await bash(ctx, "pwd")).data == str(tmp_path)
    assert (await bash(ctx, "cat")).data == ""


async def test_blank_edges_are_trimmed(ctx: ToolContext) -> None:
    assert (await bash(ctx, r"printf '\n\n  x\n  y  \n\n'")).data == "  x\n  y"


async def test_long_output_is_truncated_with_a_note(ctx: ToolContext) -> None:
    out = await bash(ctx, "seq 1 20000")
    full = "\n".join(str(i) for i in range(1, 20001))
    left = full[MAX_OUTPUT_CHARS:].count("\n") + 1
    assert out.data == f"{full[:MAX_OUTPUT_CHARS]}\n\n... [{left} lines truncated] ..."


async def test_huge_output_stays_bounded(ctx: ToolContext) -> None:
    out = await bash(ctx, "yes line | head -n 300000")
    assert out.data.endswith("lines truncated] ...")
    assert len(out.data) < MAX_OUTPUT_CHARS + 100


async def test_a_background_child_holding_the_stream_does_not_hold_the_call(ctx: ToolContext) -> None:
    started = time.monotonic()
    out = await bash(ctx, "(sleep 30 &) ; echo quick")
    assert out.data == "quick"
    assert time.monotonic() - started < 10


# --- killing ---------------------------------------------------------------------------------


async def test_timeout_kills_the_process_group(ctx: ToolContext, tmp_path: Path) -> None:
    started = time.monotonic()
    out = await bash(ctx, "echo before; sleep 30 & echo $! > child.pid; wait", timeout=500)
    assert time.monotonic() - started < 10
    assert out.is_error
    assert out.data == "Command timed out after 0.5s\nbefore"
    assert await wait_dead(await read_pid(tmp_path / "child.pid"))


async def test_abort_kills_the_command(ctx: ToolContext, tmp_path: Path) -> None:
    task = asyncio.create_task(bash(ctx, "sleep 30 & echo $! > child.pid; echo waiting; wait"))
    child = await read_pid(tmp_path / "child.pid")
    ctx.abort.set()
    out = await asyncio.wait_for(task, 10)
    assert out.is_error and out.data == f"waiting\n{ABORTED}"
    assert await wait_dead(child)


async def test_cancellation_kills_the_command(ctx: ToolContext, tmp_path: Path) -> None:
    task = asyncio.create_task(bash(ctx, "sleep 30 & echo $! > child.pid; wait"))
    child = await read_pid(tmp_path / "child.pid")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_dead(child)


def test_format_duration() -> None:
    assert format_duration(500) == "0.5s"
    assert format_duration(120_000) == "2m 0s"
    assert format_duration(90_500) == "1m 30s"


# --- background ------------------------------------------------------------------------------


async def test_background_returns_at_once_and_writes_its_file(ctx: ToolContext) -> None:
    started = time.monotonic()
    out = await bash(ctx, "echo started; sleep 0.3; echo finished", run_in_background=True)
    assert time.monotonic() - started < 2
    assert out.data.startswith("Command running in background with ID: b")
    job_id = out.data.split("ID: ")[1].split(".")[0]
    job = BACKGROUND_JOBS[job_id]
    assert out.data.endswith(f"Output is being written to: {job.output_path}.")
    deadline = time.monotonic() + 10
    while "finished" not in job.output_path.read_text() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert job.output_path.read_text() == "started\nfinished\n"
    stop_background(job_id)


async def test_background_job_can_be_stopped(ctx: ToolContext) -> None:
    out = await bash(ctx, "sleep 30", run_in_background=True)
    job_id = out.data.split("ID: ")[1].split(".")[0]
    pid = BACKGROUND_JOBS[job_id].process.pid
    assert stop_background(job_id)
    assert await wait_dead(pid)
    assert not stop_background(job_id)


async def test_background_timeout_kills(ctx: ToolContext) -> None:
    out = await bash(ctx, "sleep 30", run_in_background=True, timeout=300)
    job_id = out.data.split("ID: ")[1].split(".")[0]
    assert await wait_dead(BACKGROUND_JOBS[job_id].process.pid)
    stop_background(job_id)


# --- traits ----------------------------------------------------------------------------------


def test_tool_traits_and_schema() -> None:
    t = BashTool()
    assert t.name == "Bash"
    assert t.interrupt_behavior() == "block"
    assert t.is_concurrency_safe({"command": "ls -la"})
    assert t.is_read_only({"command": "git status"})
    assert not t.is_concurrency_safe({"command": "rm -rf build"})
    assert not t.is_concurrency_safe({})
    assert t.permission_subject({"command": "npm test", "description": "Run tests"}) == "npm test"
    schema = t.input_schema
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["required"] == ["command"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"command", "timeout", "description", "run_in_background"}
    v = jsonschema.Draft202012Validator(schema)
    assert v.is_valid({"command": "ls", "timeout": 600000})
    assert not v.is_valid({"command": "ls", "timeout": 600001})


# --- the read-only classifier ----------------------------------------------------------------

READ_ONLY = [
    "ls", "ls -la src", "cat a.txt | grep foo | wc -l", "cd src && ls", "git status", "git log --oneline -5",
    "git diff HEAD~1 -- src", "git show HEAD:README.md", "git branch", "git branch -a",
    "git branch --list 'f*'", "find . -name '*.py' -type f", "rg TODO src", "head -n 5 a; tail -n 5 a", "pwd",
    "date +%Y", "which python", "sort a | uniq -c", "du -sh .", "stat a",
    "grep -rn 'x' . || echo none", "tr a-z A-Z", "uname -a",
    # the parser tells a descriptor copy from a file, a group from a word, a comment from a command
    "ls 2>&1", "(ls)", "{ ls; }", "ls #; rm x", "cat < a.txt",
]
NOT_READ_ONLY = [
    "", "rm -rf /", "ls > out.txt", "ls >> out.txt", "ls 2>out", "cat a | tee b", "ls; rm x", "ls && rm x",
    "ls || rm x", "ls | sh", "ls\nrm x", "ls & rm x", "sleep 1 &", "echo $(rm x)", "echo `rm x`",
    "cat <(rm x)", "git commit -m x", "git push", "git branch new-feature", "git branch -D main",
    "git -c core.pager=sh log", "git diff --output=x", "find . -delete", "find . -exec rm {} \\;",
    "sort -o out in", "sort -uo out in", "rg --pre cat x", "date -s tomorrow", "date 010203042030",
    "env rm x", "FOO=1 ls", "/bin/ls", "./script.sh", "$CMD", "python -c 'print(1)'", "xargs rm",
    "cat <<EOF", "uniq in out", "ls 'unclosed", "sed -i s/a/b/ f", "awk '{print}' f", "hostname evil",
    "command rm x", "ls #\nrm x", "GIT_EXTERNAL_DIFF=rm git diff",
    # they print environment variables, a secret among them: Claude Code asks first
    "env", "printenv HOME", "printenv", "echo $ANTHROPIC_API_KEY", "echo ${HOME:-x}", "set", "export -p",
    "declare -p", "cat /proc/self/environ", "cat /proc/1/environ | tr '\\0' '\\n'",
]


@pytest.mark.parametrize("command", READ_ONLY)
def test_read_only_commands(command: str) -> None:
    assert is_read_only_command(command)


def test_quoted_operators_are_text() -> None:
    # a real parser tells quoted text from a redirection or an operator
    assert is_read_only_command("echo 'a > b'")
    assert is_read_only_command("grep ';' rm")
    assert not is_read_only_command("echo a > b")


@pytest.mark.parametrize("command", NOT_READ_ONLY)
def test_commands_that_are_not_read_only(command: str) -> None:
    assert not is_read_only_command(command)


SAFE_PROGRAMS = ["ls", "cat", "head", "tail", "wc", "grep", "pwd", "echo", "stat", "du", "cut", "tr", "sort",
                 "git status", "git log", "rg", "find ."]
DANGEROUS = ["rm -rf x", "touch x", "mv a b", "python -c 1", "sh -c ls", "curl http://x", "git push",
             "dd if=/dev/zero of=x", "chmod 777 x", "npm install"]
words = st.text(alphabet="abcxyz019._/", min_size=1, max_size=8)


@given(prefix=st.text(max_size=20), suffix=st.text(max_size=20),
       redirect=st.sampled_from([">", ">>", "2>", "&>", ">|", "1>&2"]))
def test_a_redirect_is_never_read_only(prefix: str, suffix: str, redirect: str) -> None:
    assert not is_read_only_command(f"{prefix}{redirect}{suffix}")


@given(safe=st.sampled_from(SAFE_PROGRAMS), args=st.lists(words, max_size=3),
       sep=st.sampled_from([";", " ; ", "&&", "||", "|", "\n", " & ", "&"]),
       danger=st.sampled_from(DANGEROUS), danger_first=st.booleans())
def test_a_chained_write_is_never_read_only(safe: str, args: list[str], sep: str, danger: str,
                                            danger_first: bool) -> None:
    first, second = f"{safe} {' '.join(args)}", danger
    if danger_first:
        first, second = second, first
    assert not is_read_only_command(f"{first}{sep}{second}")


@given(parts=st.lists(st.tuples(st.sampled_from(SAFE_PROGRAMS), st.lists(words, max_size=3)),
                      min_size=1, max_size=4),
       seps=st.lists(st.sampled_from([" && ", " | ", "; ", " || "]), min_size=3, max_size=3),
       quote=st.booleans())
def test_chains_of_read_only_programs_are_read_only(parts: list[tuple[str, list[str]]], seps: list[str],
                                                    quote: bool) -> None:
    segments = [" ".join([prog, *((f"'{a}'" if quote else a) for a in args)]) for prog, args in parts]
    command = segments[0]
    for sep, seg in zip(seps, segments[1:], strict=False):
        command += sep + seg
    assert is_read_only_command(command)


async def test_bash_children_do_not_see_our_credentials(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret-bash")
    out = await bash(ctx, "echo ${ANTHROPIC_API_KEY:-unset}; env | grep -c sk-secret-bash || true")
    assert out.data == "unset\n0"
    job = start_background("echo ${ANTHROPIC_API_KEY:-unset}", ctx, None)
    job.process.wait()
    assert job.output_path.read_text().strip() == "unset"
    monkeypatch.setenv("AGENTFSM_SHARE_CREDENTIALS", "1")
    assert (await bash(ctx, "echo ${ANTHROPIC_API_KEY:-unset}")).data == "sk-secret-bash"
