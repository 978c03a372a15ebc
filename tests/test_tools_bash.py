"""Bash: output and exit codes, truncation, timeout/abort/cancel killing the process group,
background jobs, and the read-only classifier."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.tools.base import AccessDenial, NoFileRules, ToolContext, ToolOutput
from agentfsm.tools.bash import (
    ABORTED,
    BACKGROUND_JOBS,
    MAX_OUTPUT_CHARS,
    PREVIEW_CHARS,
    TOOL_RESULTS_DIR,
    BashTool,
    format_duration,
    format_size,
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
    assert out.data == "out\nerr" and not out.is_error
    # SDK users get Claude Code's fields: stderr is merged into stdout, as for the model
    assert out.structured == {"stdout": "out\nerr", "stderr": "", "interrupted": False, "isImage": False,
                              "noOutputExpected": False}


async def test_nonzero_exit_is_an_error_with_its_code(ctx: ToolContext) -> None:
    out = await bash(ctx, "echo partial; exit 3")
    assert out.is_error and out.data == "Exit code 3\npartial"
    assert (await bash(ctx, "false")).data == "Exit code 1"


async def test_death_by_signal_reports_128_plus_signal(ctx: ToolContext) -> None:
    out = await bash(ctx, "kill -9 $$")
    assert out.is_error and out.data == "Exit code 137"


async def test_runs_in_cwd_with_no_stdin(ctx: ToolContext, tmp_path: Path) -> None:
    assert (await bash(ctx, "pwd")).data == str(tmp_path)
    assert (await bash(ctx, "cat")).data == "(Bash completed with no output)"  # Claude Code's text


async def test_blank_edges_are_trimmed(ctx: ToolContext) -> None:
    assert (await bash(ctx, r"printf '\n\n  x\n  y  \n\n'")).data == "  x\n  y"


def _persisted(text: str) -> tuple[str, Path, str]:
    """The size, the saved path and the preview of a ``<persisted-output>`` block."""
    m = re.fullmatch(r"<persisted-output>\nOutput too large \((\S+)\)\. Full output saved to: (\S+)\n\n"
                     r"Preview \(first 2KB\):\n(.*)\n\.\.\.\n</persisted-output>", text, re.DOTALL)
    assert m is not None, text[:300]
    return m.group(1), Path(m.group(2)), m.group(3)


async def test_long_output_is_saved_to_a_file_with_a_preview(tmp_path: Path) -> None:
    # Claude Code's <persisted-output> block: size in KB, where the whole output is, a 2 KB preview
    # cut back to a whole line; the file is in the directory the host gave (the session's)
    store = tmp_path / "session" / "tool-results"
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules(), tool_use_id="toolu_01",
                      services={TOOL_RESULTS_DIR: store})
    out = await bash(ctx, "seq 1 20000")
    full = "\n".join(str(i) for i in range(1, 20001))
    size, saved, shown = _persisted(out.data)
    assert saved == store / "toolu_01.txt"
    assert saved.read_text().rstrip("\n") == full
    assert size == format_size(len(full)) == "106.3KB"
    assert full.startswith(shown + "\n") and len(shown) <= PREVIEW_CHARS and shown.endswith(str(shown.count("\n") + 1))


async def test_a_long_output_of_one_line_is_previewed_by_its_first_characters(tmp_path: Path) -> None:
    """With no line end in its first 2 KB (minified JSON, a base64 blob) the preview is those 2 KB, not
    nothing and not an error: only a preview that has a line end is cut back to it."""
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules(), tool_use_id="toolu_01",
                      services={TOOL_RESULTS_DIR: tmp_path / "r"})
    out = await bash(ctx, f"head -c {MAX_OUTPUT_CHARS + 5000} /dev/zero | tr '\\0' x")
    assert not out.is_error
    _, saved, shown = _persisted(out.data)
    assert shown == "x" * PREVIEW_CHARS and saved.read_text() == "x" * (MAX_OUTPUT_CHARS + 5000)
    lines = await bash(ctx, f"head -c {MAX_OUTPUT_CHARS} /dev/zero | tr '\\0' x; echo; seq 1 3")
    _, _, shown = _persisted(lines.data)
    assert shown == "x" * PREVIEW_CHARS  # its first line alone is longer than the preview


async def test_output_at_the_cap_stays_inline(ctx: ToolContext) -> None:
    assert (await bash(ctx, f"yes x | head -c {MAX_OUTPUT_CHARS}")).data.count("x") == MAX_OUTPUT_CHARS // 2
    assert (await bash(ctx, f"yes x | head -c {MAX_OUTPUT_CHARS + 1}")).data.startswith("<persisted-output>")


async def test_huge_output_is_moved_not_held(tmp_path: Path) -> None:
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules(), services={TOOL_RESULTS_DIR: tmp_path / "r"})
    out = await bash(ctx, "yes line | head -n 300000")
    size, saved, _ = _persisted(out.data)
    assert size == "1.4MB" and saved.stat().st_size == 300000 * 5
    assert len(out.data) < PREVIEW_CHARS + 400


async def test_the_cap_is_a_setting(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFSM_BASH_MAX_OUTPUT_CHARS", "10")
    assert (await bash(ctx, "echo 0123456789")).data == "0123456789"
    assert (await bash(ctx, "echo 0123456789a")).data.startswith("<persisted-output>\nOutput too large (0KB)")


async def test_the_directory_is_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFSM_TOOL_RESULTS_DIR", str(tmp_path / "elsewhere"))
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules(), session_id="s1", tool_use_id="t9",
                      services={TOOL_RESULTS_DIR: tmp_path / "session"})
    _, saved, _ = _persisted((await bash(ctx, "seq 1 20000")).data)
    assert saved == tmp_path / "elsewhere" / "s1" / "t9.txt"


class _DenyBelow:
    """A file-access policy denying everything below one directory."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)

    def denial(self, path: str, access: str) -> AccessDenial | None:
        return AccessDenial(path, "Edit(secret/**)") if path.startswith(self.root + "/") else None

    def tree_denial(self, directory: str, access: str) -> AccessDenial | None:
        return self.denial(directory, access)


async def test_a_denied_directory_is_never_written_the_output_is_cut_instead(tmp_path: Path) -> None:
    # the saved file goes through the one file-access policy: a deny rule over the directory wins
    store = tmp_path / "denied" / "tool-results"
    ctx = ToolContext(cwd=tmp_path, file_access=_DenyBelow(tmp_path / "denied"), tool_use_id="t1",
                      services={TOOL_RESULTS_DIR: store})
    out = await bash(ctx, "seq 1 20000")
    full = "\n".join(str(i) for i in range(1, 20001))
    left = full[MAX_OUTPUT_CHARS:].count("\n") + 1
    assert out.data == f"{full[:MAX_OUTPUT_CHARS]}\n\n... [{left} lines truncated] ..."
    assert not store.exists()


async def test_a_tool_use_id_never_names_a_path(tmp_path: Path) -> None:
    ctx = ToolContext(cwd=tmp_path, file_access=NoFileRules(), tool_use_id="../../escape",
                      services={TOOL_RESULTS_DIR: tmp_path / "r"})
    _, saved, _ = _persisted((await bash(ctx, "seq 1 20000")).data)
    assert saved.parent == tmp_path / "r" and ".." not in saved.name


def test_sizes_read_like_claude_code() -> None:
    assert [format_size(n) for n in (30001, 38 * 1024, 50000, 1258291, 0)] == ["29.3KB", "38KB", "48.8KB",
                                                                               "1.2MB", "0KB"]


async def test_grep_finding_nothing_is_not_an_error(ctx: ToolContext, tmp_path: Path) -> None:
    # as Claude Code reads it: exit 1 from a search program means "no match"
    (tmp_path / "a.txt").write_text("ALPHA\n")
    out = await bash(ctx, "cat a.txt | grep B")
    assert (out.data, out.is_error) == ("(Bash completed with no output)", False)
    assert (await bash(ctx, "grep B a.txt; false")).is_error
    out = await bash(ctx, "grep -q B a.txt || exit 1")
    assert out.is_error and out.data == "Exit code 1"


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
    assert set(schema["properties"]) == {"command", "timeout", "description", "run_in_background",
                                         "dangerouslyDisableSandbox"}
    v = jsonschema.Draft202012Validator(schema)
    assert v.is_valid({"command": "ls", "timeout": 600000})
    # no maximum in the schema (Claude Code 2.1.332 has none): a background command may ask for up to
    # two hours, a foreground one is held to ten minutes when it runs
    assert v.is_valid({"command": "ls", "timeout": 7_200_000, "run_in_background": True})
    assert not v.is_valid({"command": "ls", "timeout": "soon"})
    from agentfsm.tools.bash import _background_timeout_ms, _timeout_ms

    assert _timeout_ms({"timeout": 600_001}) == 600_000 and _timeout_ms({"timeout": 600_000}) == 600_000
    assert _background_timeout_ms({"timeout": 7_200_001}) == 7_200_000
    assert _background_timeout_ms({"timeout": 7_199_999}) == 7_199_999
    assert _background_timeout_ms({}) == 600_000 and _background_timeout_ms({"timeout": True}) == 600_000


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
