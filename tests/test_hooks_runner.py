"""The hook runner: exit codes, JSON answers, matching, dedup, parallelism, timeouts, isolation."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.hooks.inputs import (
    HookEvent,
    HookOutput,
    PostToolUseInput,
    PreCompactInput,
    PreToolUseInput,
    SessionEndInput,
    SessionStartInput,
    StopInput,
    SubagentStopInput,
    UserPromptSubmitInput,
)
from agentfsm.hooks.runner import (
    CommandHook,
    HookBlockingError,
    HookMatcher,
    HookResult,
    HookRunner,
    combine,
    compile_matcher,
    interpret_command_result,
)


def pre(tool: str = "Bash", **tool_input: Any) -> PreToolUseInput:
    return PreToolUseInput(tool_name=tool, tool_input=tool_input or {"command": "ls"}, tool_use_id="toolu_1",
                           session_id="s1")


def runner(event: str, *hooks: Any, matcher: str | None = None, tmp: Path | None = None,
           env: dict[str, str] | None = None) -> HookRunner:
    return HookRunner({event: [HookMatcher(matcher, list(hooks))]}, project_dir=tmp or Path.cwd(), env=env)


# ---------------------------------------------------------------------------------------------
# Exit code × JSON output → decision (pure mapping, then the real subprocess path)

JSON_ANSWERS = st.one_of(
    st.none(),
    st.just("plain text, not json"),
    st.just("{not valid json"),
    st.fixed_dictionaries({}, optional={
        "continue": st.booleans(),
        "stopReason": st.text(max_size=10),
        "decision": st.sampled_from(["block", "approve"]),
        "reason": st.text(max_size=10),
        "hookSpecificOutput": st.fixed_dictionaries(
            {"hookEventName": st.sampled_from(["PreToolUse", "Stop", "PostToolUse"])},
            optional={"permissionDecision": st.sampled_from(["allow", "deny", "ask", "defer", "maybe"]),
                      "permissionDecisionReason": st.text(max_size=10),
                      "additionalContext": st.text(min_size=1, max_size=10)}),
    }),
)
EXIT_CODES = st.sampled_from([0, 1, 2, 3, 126, 127, 255])
EVENTS = st.sampled_from([HookEvent.PRE_TOOL_USE, HookEvent.STOP, HookEvent.POST_TOOL_USE,
                          HookEvent.USER_PROMPT_SUBMIT, HookEvent.SESSION_START])


def _stdout_of(answer: Any) -> str:
    if answer is None:
        return ""
    return answer if isinstance(answer, str) else json.dumps(answer)


def expected_decision(event: str, code: int, answer: Any) -> dict[str, Any]:
    """The documented mapping (docs/behaviour.md §10), written independently of the implementation."""
    exp: dict[str, Any] = {"blocked": False, "stop": False, "permission": None, "error": False, "context": []}
    if code == 2:
        exp["blocked"] = event != HookEvent.SESSION_START  # SessionStart: stderr to the user only
        return exp
    if code != 0:
        exp["error"] = True
        return exp
    if not isinstance(answer, dict):
        if isinstance(answer, str) and event in (HookEvent.USER_PROMPT_SUBMIT, HookEvent.SESSION_START):
            exp["context"] = [answer]
        return exp
    exp["stop"] = answer.get("continue") is False
    decision = answer.get("decision")
    if event == HookEvent.PRE_TOOL_USE and decision in ("approve", "block"):
        exp["permission"] = "allow" if decision == "approve" else "deny"
    if decision == "block" and event in (HookEvent.STOP, HookEvent.POST_TOOL_USE,
                                         HookEvent.USER_PROMPT_SUBMIT):
        exp["blocked"] = True
    specific = answer.get("hookSpecificOutput")
    if specific and specific.get("hookEventName") == event:
        if event == HookEvent.PRE_TOOL_USE and specific.get("permissionDecision") in ("allow", "deny", "ask",
                                                                                       "defer"):
            # hookSpecificOutput is read after the legacy field, so it wins
            exp["permission"] = specific["permissionDecision"]
        if specific.get("additionalContext"):
            exp["context"] = [specific["additionalContext"]]
    return exp


def check_against(event: str, code: int, answer: Any, res: Any) -> None:
    exp = expected_decision(event, code, answer)
    assert res.blocked == exp["blocked"]
    assert res.stop == exp["stop"]
    assert res.permission_decision == exp["permission"]
    assert list(res.additional_context) == exp["context"]
    assert any("exit status" in e for e in res.errors) == exp["error"]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=EVENTS, code=EXIT_CODES, answer=JSON_ANSWERS)
def test_exit_code_and_json_mapping(event: str, code: int, answer: Any) -> None:
    stdout = _stdout_of(answer)
    outcome, output, plain, notes = interpret_command_result(event, code, stdout, "the stderr")
    result = HookResult("h", "command", outcome, exit_code=code, stdout=stdout, stderr="the stderr",
                        output=output, plain_output=plain, notes=notes)
    res = combine(event, [result])
    check_against(event, code, answer, res)
    if res.blocked and code == 2:
        assert res.reason == "the stderr"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(event=EVENTS, code=EXIT_CODES, answer=JSON_ANSWERS)
def test_exit_code_and_json_mapping_through_a_real_process(tmp_path: Path, event: str, code: int,
                                                           answer: Any) -> None:
    # The answer travels through env vars so no test value is ever spliced into the command line.
    hook = CommandHook('printf "%s" "$HOOK_OUT"; printf "%s" "the stderr" >&2; exit "$HOOK_CODE"')
    env = {"HOOK_OUT": _stdout_of(answer), "HOOK_CODE": str(code)}
    r = HookRunner({event: [HookMatcher(None, [hook])]}, project_dir=tmp_path, env=env)
    record = {
        HookEvent.PRE_TOOL_USE: pre(),
        HookEvent.STOP: StopInput(),
        HookEvent.POST_TOOL_USE: PostToolUseInput(tool_name="Bash"),
        HookEvent.USER_PROMPT_SUBMIT: UserPromptSubmitInput(prompt="hi"),
        HookEvent.SESSION_START: SessionStartInput(),
    }[event]
    res = asyncio.run(r.run(record))
    assert res.results[0].exit_code == code
    check_against(event, code, answer, res)


async def test_exit_2_blocks_with_stderr_and_ignores_json(tmp_path: Path) -> None:
    allow = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow"}})
    hook = CommandHook(f"echo '{allow}'; echo 'no rm today' >&2; exit 2")
    res = await runner("PreToolUse", hook, tmp=tmp_path).run(pre())
    assert res.blocked and res.reason == "no rm today"
    assert res.permission_decision is None
    assert res.results[0].outcome == "blocking"


async def test_other_exit_codes_are_non_blocking_errors(tmp_path: Path) -> None:
    res = await runner("PreToolUse", CommandHook("echo oops >&2; exit 1"), tmp=tmp_path).run(pre())
    assert not res.blocked and res.permission_decision is None
    assert res.results[0].outcome == "non_blocking_error"
    assert "exit status 1" in res.errors[0] and "oops" in res.errors[0]


async def test_missing_program_is_a_non_blocking_error_and_a_permission_hook_fails_closed(tmp_path: Path) -> None:
    hooks = [CommandHook(args=["/nonexistent/agentfsm-hook"]), CommandHook("no-such-command-agentfsm")]
    said: list[str] = []
    for event, record in (("PreToolUse", pre()), ("PostToolUse", PostToolUseInput(
            tool_name="Bash", tool_input={"command": "ls"}, tool_use_id="toolu_1", tool_response="x"))):
        run = HookRunner({event: [HookMatcher(None, hooks)]}, project_dir=tmp_path, warn=said.append)
        res = await run.run(record)
        # a hook that never ran is no decision: the permission hook fails closed, the others are skipped
        assert res.blocked == (event == "PreToolUse")
        assert [r.outcome for r in res.results] == ["non_blocking_error", "non_blocking_error"]
        assert "could not start" in res.errors[0]
        assert "exit status 127" in res.errors[1]
    assert len(said) == 4 and all("could not run" in s for s in said)


async def test_plain_stdout_is_context_only_for_prompt_and_session_start(tmp_path: Path) -> None:
    hook = CommandHook("echo 'remember the milk'")
    for record, expect in [(UserPromptSubmitInput(prompt="x"), ("remember the milk",)),
                           (SessionStartInput(source="startup"), ("remember the milk",)),
                           (pre(), ()), (StopInput(), ())]:
        res = await runner(record.event, hook, tmp=tmp_path).run(record)
        assert res.additional_context == expect, record.event
        assert res.plain_context == expect, record.event  # marked as plain stdout ("success" in Claude Code)
    ctx = json.dumps({"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": "C"}})
    res = await runner("UserPromptSubmit", CommandHook(f"echo '{ctx}'"), tmp=tmp_path).run(
        UserPromptSubmitInput(prompt="x"))
    assert (res.additional_context, res.plain_context) == (("C",), ())


async def test_hook_event_name_must_match_the_running_event(tmp_path: Path) -> None:
    out = json.dumps({"hookSpecificOutput": {"hookEventName": "PostToolUse", "permissionDecision": "deny"}})
    res = await runner("PreToolUse", CommandHook(f"echo '{out}'"), tmp=tmp_path).run(pre())
    assert res.permission_decision is None
    assert any("hookEventName" in e for e in res.errors)


async def test_continue_false_stops_and_legacy_decisions_map(tmp_path: Path) -> None:
    stop = CommandHook("""echo '{"continue": false, "stopReason": "enough"}'""")
    legacy = CommandHook("""echo '{"decision": "block", "reason": "legacy no"}'""")
    res = await runner("PreToolUse", stop, legacy, tmp=tmp_path).run(pre())
    assert res.stop and res.stop_reason == "enough"
    assert res.permission_decision == "deny" and res.permission_decision_reason == "legacy no"
    approve = CommandHook("""echo '{"decision": "approve", "reason": "fine"}'""")
    res = await runner("PreToolUse", approve, tmp=tmp_path).run(pre())
    assert res.permission_decision == "allow"


# ---------------------------------------------------------------------------------------------
# Combining several hooks

DECISIONS = st.lists(st.sampled_from(["allow", "deny", "ask", "defer", None]), min_size=1, max_size=6)


@settings(deadline=None)
@given(DECISIONS)
def test_permission_decisions_combine_deny_defer_ask_allow(decisions: list[str | None]) -> None:
    results = [HookResult(f"h{i}", "python", "success", exit_code=0,
                          output=HookOutput(permission_decision=d, permission_decision_reason=f"r{i}"))  # type: ignore[arg-type]
               for i, d in enumerate(decisions)]
    res = combine(HookEvent.PRE_TOOL_USE, results)
    present = {d for d in decisions if d}
    expected = next((d for d in ("deny", "defer", "ask", "allow") if d in present), None)
    assert res.permission_decision == expected
    if expected:
        assert res.permission_decision_reason.split("\n") == [f"r{i}" for i, d in enumerate(decisions)
                                                              if d == expected]


@settings(deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_any_block_blocks_and_any_continue_false_stops(flags: list[tuple[bool, bool]]) -> None:
    results = [HookResult(f"h{i}", "python", "success", exit_code=0,
                          output=HookOutput(decision="block" if b else None, reason=f"why{i}",
                                            continue_=not s))
               for i, (b, s) in enumerate(flags)]
    res = combine(HookEvent.STOP, results)
    assert res.blocked == any(b for b, _ in flags)
    assert res.stop == any(s for _, s in flags)
    assert res.reason.split("\n") == ([f"why{i}" for i, (b, _) in enumerate(flags) if b] or [""])


# ---------------------------------------------------------------------------------------------
# Matchers

@pytest.mark.parametrize(("matcher", "subject", "hit"), [
    (None, "Bash", True), ("", "Anything", True), ("*", "Read", True),
    ("Bash", "Bash", True), ("Bash", "BashX", False), ("Bash", "bash", False),
    ("Edit|Write", "Write", True), ("Edit|Write", "Edit", True), ("Edit|Write", "MultiEdit", False),
    ("Notebook.*", "NotebookEdit", True), ("Notebook.*", "Read", False),
    ("^mcp__memory__", "mcp__memory__create", True), ("mcp__.*__write", "mcp__fs__write", True),
    ("mcp__fs", "mcp__fs__write", False),  # letters/digits/_ only = an exact name
    ("startup|resume", "resume", True), ("auto", "manual", False),
])
def test_matcher_semantics(matcher: str | None, subject: str, hit: bool) -> None:
    assert compile_matcher(matcher)(subject) is hit


def test_bad_regex_matcher_raises() -> None:
    with pytest.raises(ValueError, match="not a valid regular expression"):
        compile_matcher("Bash(")


async def test_events_match_their_own_field(tmp_path: Path) -> None:
    calls: list[str] = []

    def record_call(record: Any) -> None:
        calls.append(record.event)

    cases = [
        (SessionStartInput(source="resume"), "resume", "startup"),
        (SessionEndInput(reason="clear"), "clear", "logout"),
        (PreCompactInput(trigger="manual"), "manual", "auto"),
        (SubagentStopInput(agent_type="Explore"), "Explore", "Plan"),
        (pre("Read", file_path="/x"), "Read", "Bash"),
    ]
    for record, hit, miss in cases:
        calls.clear()
        r = HookRunner({record.event: [HookMatcher(hit, [record_call]), HookMatcher(miss, [record_call])]},
                       project_dir=tmp_path)
        await r.run(record)
        assert calls == [record.event], record.event


async def test_user_prompt_submit_and_stop_ignore_the_matcher(tmp_path: Path) -> None:
    seen: list[str] = []
    for record in (UserPromptSubmitInput(prompt="p"), StopInput()):
        r = HookRunner({record.event: [HookMatcher("NoSuchThing", [lambda rec: seen.append(rec.event)])]},
                       project_dir=tmp_path)
        await r.run(record)
    assert seen == ["UserPromptSubmit", "Stop"]


# ---------------------------------------------------------------------------------------------
# Dedup and parallelism

async def test_identical_command_hooks_run_once(tmp_path: Path) -> None:
    log = tmp_path / "count"
    cmd = f"echo x >> '{log}'"
    r = HookRunner({"PreToolUse": [HookMatcher("Bash", [CommandHook(cmd, timeout=5)]),
                                   HookMatcher("*", [CommandHook(cmd, timeout=60, source="other.json")]),
                                   HookMatcher(None, [CommandHook(cmd + " # different")])]},
                   project_dir=tmp_path)
    res = await r.run(pre())
    assert len(res.results) == 2
    assert log.read_text().count("x") == 2


async def test_same_python_callable_is_deduplicated(tmp_path: Path) -> None:
    calls = []

    def hook(record: Any) -> None:
        calls.append(1)

    r = HookRunner({"Stop": [HookMatcher(None, [hook]), HookMatcher("*", [hook])]}, project_dir=tmp_path)
    await r.run(StopInput())
    assert calls == [1]


async def test_matching_hooks_run_in_parallel(tmp_path: Path) -> None:
    # Three hooks that each wait for the other two: run one after another they would time out.
    barrier = asyncio.Barrier(3)

    async def hook(record: Any) -> HookOutput:
        await barrier.wait()
        return HookOutput.context("met")

    hooks = [lambda r: hook(r), lambda r: hook(r), lambda r: hook(r)]
    r = HookRunner({"Stop": [HookMatcher(None, hooks, timeout=5)]}, project_dir=tmp_path)
    res = await r.run(StopInput())
    assert res.additional_context == ("met", "met", "met")


async def test_command_hooks_run_in_parallel(tmp_path: Path) -> None:
    # each hook notes when it began and ended: run in parallel, every one began before any ended
    # (an ordering, not a duration, so a loaded machine cannot fail it)
    hooks = [CommandHook(f"date +%s.%N > {tmp_path}/begin{i}; sleep 0.5; date +%s.%N > {tmp_path}/end{i}")
             for i in range(3)]
    res = await runner("PreToolUse", *hooks, tmp=tmp_path).run(pre())
    assert [r.outcome for r in res.results] == ["success"] * 3
    begun = [float((tmp_path / f"begin{i}").read_text()) for i in range(3)]
    ended = [float((tmp_path / f"end{i}").read_text()) for i in range(3)]
    assert max(begun) < min(ended)


# ---------------------------------------------------------------------------------------------
# Timeouts

async def test_timeout_kills_the_hook_and_is_non_blocking(tmp_path: Path) -> None:
    start = time.monotonic()
    res = await runner("PreToolUse", CommandHook("sleep 30", timeout=1), tmp=tmp_path).run(pre())
    assert time.monotonic() - start < 5
    assert res.results[0].outcome == "timeout"
    assert not res.blocked and res.permission_decision is None and not res.stop
    assert "timed out after 1s" in res.errors[0]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state  # a zombie waiting for its reaper is dead


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    hook = CommandHook(f"sleep 30 & echo $! > '{pidfile}'; wait", timeout=1)
    start = time.monotonic()
    res = await runner("Stop", hook, tmp=tmp_path).run(StopInput())
    assert time.monotonic() - start < 5
    assert res.results[0].outcome == "timeout" and not res.blocked
    pid = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(pid):
            break
        await asyncio.sleep(0.05)
    assert not _alive(pid)


async def test_python_hook_timeout_is_non_blocking(tmp_path: Path) -> None:
    async def slow(record: Any) -> None:
        await asyncio.sleep(30)

    r = HookRunner({"Stop": [HookMatcher(None, [slow], timeout=0.2)]}, project_dir=tmp_path)
    start = time.monotonic()
    res = await r.run(StopInput())
    assert time.monotonic() - start < 5
    assert res.results[0].outcome == "timeout" and not res.blocked


async def test_cancelling_a_run_kills_its_hooks(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    hook = CommandHook(f"echo $$ > '{pidfile}'; sleep 30")
    task = asyncio.create_task(runner("Stop", hook, tmp=tmp_path).run(StopInput()))
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(pid):
            break
        await asyncio.sleep(0.05)
    assert not _alive(pid)


# ---------------------------------------------------------------------------------------------
# Isolation: model text travels on stdin only

NASTY = ["$(touch {p}/pwned1)", "`touch {p}/pwned2`", "'; touch {p}/pwned3; echo '",
         "\"; touch {p}/pwned4; echo \"", "x && touch {p}/pwned5", "$HOME ${{IFS}} \\ \n touch {p}/pwned6"]


async def test_model_text_never_executes(tmp_path: Path) -> None:
    got = tmp_path / "stdin.json"
    tool_input = {"command": " ; ".join(s.format(p=tmp_path) for s in NASTY), "description": "'\"$(id)`id`"}
    hooks = [CommandHook(f"cat > '{got}'"),
             CommandHook(args=["python3", "-c", "import sys; sys.stdin.read()"]),
             CommandHook('input=$(cat); echo "$input" | grep -q pwned && exit 0')]
    record = PreToolUseInput(tool_name="Bash", tool_input=tool_input, tool_use_id="toolu_x")
    res = await runner("PreToolUse", *hooks, tmp=tmp_path).run(record)
    assert all(r.outcome == "success" for r in res.results)
    assert not list(tmp_path.glob("pwned*"))
    assert json.loads(got.read_text())["tool_input"] == tool_input


async def test_stdin_is_the_exact_event_json_and_env_has_project_dir(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    hook = CommandHook(f"cat > '{out}.json'; echo \"$CLAUDE_PROJECT_DIR\" > '{out}.env'; pwd > '{out}.pwd'")
    record = StopInput(session_id="abc", transcript_path="/t.jsonl", cwd=str(tmp_path), stop_hook_active=True,
                       last_assistant_message="done")
    await runner("Stop", hook, tmp=tmp_path).run(record)
    raw = Path(f"{out}.json").read_text()
    assert raw == record.to_json()
    assert '"stop_hook_active":true' in raw
    assert Path(f"{out}.env").read_text().strip() == str(tmp_path.resolve())
    assert Path(f"{out}.pwd").read_text().strip() == str(tmp_path)


async def test_exec_form_runs_without_a_shell(tmp_path: Path) -> None:
    # With no shell, `$(...)` in an argument is just text.
    hook = CommandHook(args=["python3", "-c", "import sys, json; d = json.load(sys.stdin); "
                                              "print(json.dumps({'reason': sys.argv[1]}))", "$(touch pwned)"])
    res = await runner("Stop", hook, tmp=tmp_path).run(StopInput())
    assert res.results[0].outcome == "success"
    assert res.results[0].output is not None and res.results[0].output.reason == "$(touch pwned)"
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------------------------------------
# Python hooks

async def test_python_hooks_sync_async_dict_and_typed(tmp_path: Path) -> None:
    seen: list[Any] = []

    def sync_hook(record: PreToolUseInput) -> dict[str, Any]:
        seen.append(record)
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "additionalContext": "from dict"}}

    async def async_hook(record: PreToolUseInput) -> HookOutput:
        return HookOutput(permission_decision="ask", additional_context="from async")

    def none_hook(record: PreToolUseInput) -> None:
        return None

    r = HookRunner({"PreToolUse": [HookMatcher("Bash", [sync_hook, async_hook, none_hook])]},
                   project_dir=tmp_path)
    res = await r.run(pre(command="ls"))
    assert isinstance(seen[0], PreToolUseInput) and seen[0].tool_input == {"command": "ls"}
    assert res.additional_context == ("from dict", "from async")
    assert res.permission_decision == "ask"


async def test_python_hook_failures_do_not_escape(tmp_path: Path) -> None:
    def boom(record: Any) -> None:
        raise RuntimeError("kaput")

    def weird(record: Any) -> int:
        return 42

    def blocker(record: Any) -> None:
        raise HookBlockingError("stop right there")

    r = HookRunner({"Stop": [HookMatcher(None, [boom, weird, blocker])]}, project_dir=tmp_path)
    res = await r.run(StopInput())
    assert [x.outcome for x in res.results] == ["non_blocking_error", "non_blocking_error", "blocking"]
    assert res.blocked and res.reason == "stop right there"
    assert any("kaput" in e for e in res.errors)


async def test_no_matching_hooks_is_a_quiet_no(tmp_path: Path) -> None:
    r = HookRunner({"PreToolUse": [HookMatcher("Read", [CommandHook("exit 2")])]}, project_dir=tmp_path)
    res = await r.run(pre("Bash"))
    assert res.results == () and not res.blocked and not r.has_hooks("Stop")


def test_command_hook_validates() -> None:
    with pytest.raises(ValueError):
        CommandHook()
    with pytest.raises(ValueError):
        CommandHook("true", timeout=0)


# --- hostile hooks: a background child, huge output, our credentials ------------------------------


async def test_a_background_child_holding_stdout_does_not_stall_the_call(tmp_path: Path) -> None:
    # the hook exits at once, leaving `sleep` with its stdout and stderr: the call must not wait for it
    hook = CommandHook("(sleep 30 &) ; echo '{}'")
    start = time.perf_counter()
    res = await runner("PreToolUse", hook, tmp=tmp_path).run(pre())
    assert time.perf_counter() - start < 5
    assert res.results[0].outcome == "success"


async def test_huge_hook_output_is_capped(tmp_path: Path) -> None:
    from agentfsm.hooks.runner import MAX_OUTPUT_BYTES

    res = await runner("PreToolUse", CommandHook("head -c 5000000 /dev/zero | tr '\\0' a"), tmp=tmp_path).run(pre())
    assert len(res.results[0].stdout) <= MAX_OUTPUT_BYTES + 100


async def test_command_hooks_do_not_inherit_our_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret-hook")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "tok-secret-hook")
    hook = CommandHook("echo \"${ANTHROPIC_API_KEY:-unset} ${ANTHROPIC_AUTH_TOKEN:-unset} $CLAUDE_PROJECT_DIR\" >&2; "
                       "exit 2")
    res = await runner("PreToolUse", hook, tmp=tmp_path).run(pre())
    assert res.reason.startswith("unset unset ")
    monkeypatch.setenv("AGENTFSM_SHARE_CREDENTIALS", "1")  # shared only on purpose
    res = await runner("PreToolUse", hook, tmp=tmp_path).run(pre())
    assert res.reason.startswith("sk-secret-hook tok-secret-hook ")


# ---------------------------------------------------------------------------------------------
# hook_started / hook_response (--include-hook-events)


async def test_hook_events_for_command_hooks_only_and_a_failing_observer_changes_nothing(tmp_path: Path) -> None:
    def python_hook(inp: Any) -> dict[str, Any]:
        return {}

    r = runner(HookEvent.PRE_TOOL_USE, CommandHook("sleep 5", timeout=0.5),
               CommandHook("echo no >&2; exit 2"), python_hook, tmp=tmp_path)
    seen: list[dict[str, Any]] = []
    r.observer = seen.append
    result = await r.run(pre("Bash"))
    assert result.blocked and "no" in result.reason
    assert [m["subtype"] for m in seen].count("hook_started") == 2  # the Python hook is not a command
    by_id = {m["hook_id"]: m for m in seen if m["subtype"] == "hook_response"}
    assert len(by_id) == 2 and all(m["hook_name"] == "PreToolUse:Bash" for m in seen)
    outcomes = sorted(m["outcome"] for m in by_id.values())
    assert outcomes == ["cancelled", "error"]

    def broken(_msg: dict[str, Any]) -> None:
        raise RuntimeError("consumer went away")

    r.observer = broken
    again = await r.run(pre("Bash"))
    assert again.blocked and "no" in again.reason  # the hooks' answer still counts
