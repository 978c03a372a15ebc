"""The policy's decisions case by case: the interrupt flag of a decision and of a callback's deny, the
callback's context, rule objects handed to another list, ask rules from settings, the texts of ask
rules and of the mode's asks, the rule a Bash or file-tool decision reports, allow rules for Bash,
plan mode and acceptEdits with shell commands, where a call is judged (off the event loop or not), and
calls the policy judges without looking at what no rule asks about."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_permissions import FakeTool  # the permission tests' shared fake tool

from agentfsm.hooks import file_access
from agentfsm.hooks.config import PermissionSettings, Settings
from agentfsm.hooks.permissions import (
    PermissionDeny,
    PermissionPolicy,
    PermissionRule,
    ToolPermissionContext,
)
from agentfsm.tools.base import FILE_DENIED, read_denied

BASH = FakeTool("Bash")
READ, GREP, WRITE = FakeTool("Read", read_only=True), FakeTool("Grep", read_only=True), FakeTool("Write")


def asked_text(verb: str, path: Path) -> str:
    return f"Claude requested permissions to {verb} {path}, but you haven't granted it yet."


# ---------------------------------------------------------------------------------------------
# interrupt

def test_a_rule_decision_does_not_ask_to_interrupt_the_run(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, deny=["Bash(rm *)"])
    assert p.evaluate(BASH, {"command": "rm -rf build"}).interrupt is False
    assert p.evaluate(READ, {"file_path": str(tmp_path / "a")}).interrupt is False


@pytest.mark.parametrize(("answer", "interrupt"), [
    (False, False),
    (PermissionDeny("no"), False),
    ({"behavior": "deny", "message": "no"}, False),
    ({"behavior": "deny", "message": "no", "interrupt": True}, True),
    (PermissionDeny("no", interrupt=True), True),
])
async def test_a_callback_deny_interrupts_the_run_only_when_it_says_so(tmp_path: Path, answer: object,
                                                                       interrupt: bool) -> None:
    p = PermissionPolicy.build(tmp_path)
    d = await p.decide(WRITE, {"file_path": str(tmp_path / "a")}, can_use_tool=lambda n, i, c: answer)
    assert (d.behavior, d.decided_by, d.interrupt) == ("deny", "callback", interrupt)


# ---------------------------------------------------------------------------------------------
# the callback's context

def test_the_callback_context_is_a_mapping_of_its_fields_only() -> None:
    ctx = ToolPermissionContext(tool_use_id="t1", reason="why", cwd="/w")
    assert ctx["reason"] == "why"
    with pytest.raises(KeyError):
        ctx["message"]
    assert ctx.get("message") is None
    assert "message" not in ctx and "reason" in ctx
    assert dict(ctx) == {"tool_use_id": "t1", "permission_mode": "default", "reason": "why", "rule": None,
                         "cwd": "/w", "suggestions": (), "description": None, "decision_reason": None,
                         "blocked_path": None}


# ---------------------------------------------------------------------------------------------
# where rules come from

def test_a_rule_object_put_in_another_list_takes_that_lists_behavior(tmp_path: Path) -> None:
    allowed = PermissionRule.parse("Bash(rm *)", "allow", source="project")
    p = PermissionPolicy.build(tmp_path, allow=[allowed], deny=[allowed], ask=[allowed])
    assert list(p.allow) == [allowed]
    assert [(r.label, r.source) for r in p.deny] == [("deny: Bash(rm *)", "project")]
    assert [(r.label, r.source) for r in p.ask] == [("ask: Bash(rm *)", "project")]


def test_ask_rules_from_settings_reach_the_policy(tmp_path: Path) -> None:
    s = Settings(permissions=PermissionSettings(ask=(PermissionRule.parse("Bash(git push *)", "ask"),)))
    p = PermissionPolicy.from_settings(s, tmp_path, mode="bypassPermissions")
    pushed = p.evaluate(BASH, {"command": "git push origin main"})
    assert (pushed.behavior, str(pushed.rule), pushed.decided_by) == ("ask", "Bash(git push *)", "rule")
    assert p.evaluate(BASH, {"command": "git status"}).behavior == "allow"


# ---------------------------------------------------------------------------------------------
# ask rules: Claude Code's text for a file, the rule's own for anything else

async def test_an_ask_rule_on_a_file_asks_in_claude_codes_words(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, ask=["Read(./secret.env)"])
    secret = tmp_path / "secret.env"
    d = p.evaluate(READ, {"file_path": str(secret)})
    assert (d.behavior, d.reason, str(d.rule), d.decided_by, d.bare) == (
        "ask", asked_text("read from", secret), "Read(./secret.env)", "rule", True)
    # with nobody to ask, the model gets that text as is
    final = await p.decide(READ, {"file_path": str(secret)})
    assert (final.behavior, final.reason, final.decided_by) == ("deny", asked_text("read from", secret),
                                                                "non_interactive")
    assert p.evaluate(READ, {"file_path": str(tmp_path / "notes.txt")}).behavior == "allow"


def test_an_ask_rule_on_a_command_names_the_rule_and_its_source(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, ask=["Bash(git push *)"])
    d = p.evaluate(BASH, {"command": "git push"})
    assert (d.behavior, d.reason, d.bare) == ("ask", "Rule Bash(git push *) (settings) requires approval.", False)


# ---------------------------------------------------------------------------------------------
# the rule a Bash decision reports

@pytest.mark.parametrize("command", ["ls", "git status && make", "echo $(whoami)"])
def test_a_bare_bash_rule_denies_every_command_outright(tmp_path: Path, command: str) -> None:
    """A bare rule is a definite hit: the plain denial, not the could-apply one with its reason."""
    d = PermissionPolicy.build(tmp_path, deny=["Bash"]).evaluate(BASH, {"command": command})
    assert (d.behavior, d.reason, str(d.rule)) == (
        "deny", f"Permission to use Bash with command {command} has been denied.", "Bash")


@pytest.mark.parametrize("name", ["a.txt", "b.txt"])
def test_a_command_reading_a_denied_file_reports_the_rule_for_that_file(tmp_path: Path, name: str) -> None:
    p = PermissionPolicy.build(tmp_path, deny=["Read(./a.txt)", "Read(./b.txt)"])
    d = p.evaluate(BASH, {"command": f"cat {name}"})
    assert (d.behavior, str(d.rule)) == ("deny", f"Read(./{name})")


@pytest.mark.parametrize(("rules", "command"), [
    (["Read(./a.txt)", "Read(./b.txt)"], "cat $F"),
    (["Edit(./a.txt)", "Edit(./b.txt)"], "echo x > $F"),
])
def test_a_command_whose_file_cannot_be_named_reports_the_first_path_rule(tmp_path: Path, rules: list[str],
                                                                           command: str) -> None:
    d = PermissionPolicy.build(tmp_path, deny=rules).evaluate(BASH, {"command": command})
    assert (d.behavior, str(d.rule)) == ("deny", rules[0])
    assert "can't be named before it runs" in d.reason


def test_a_tree_too_big_to_check_is_denied_under_the_first_path_rule(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk's own denial names no rule; the decision reports the first one."""
    monkeypatch.setattr(file_access, "WALK_LIMIT", 2)
    (tmp_path / "big").mkdir()
    for i in range(3):
        (tmp_path / "big" / str(i)).touch()
    p = PermissionPolicy.build(tmp_path, deny=["Read(./a.txt)", "Read(./b.txt)"])
    d = p.evaluate(BASH, {"command": "grep -r foo big"})
    assert (d.behavior, str(d.rule)) == ("deny", "Read(./a.txt)")
    assert p.evaluate(BASH, {"command": "grep foo big/0"}).behavior == "ask"  # one file: nothing to walk


# ---------------------------------------------------------------------------------------------
# the rule a file-tool decision reports, and how a search is judged

@pytest.mark.parametrize("name", ["a.txt", "b.txt"])
def test_a_file_decision_reports_the_rule_that_names_the_file(tmp_path: Path, name: str) -> None:
    p = PermissionPolicy.build(tmp_path, deny=["Read(./a.txt)", "Read(./b.txt)"])
    d = p.evaluate(READ, {"file_path": str(tmp_path / name)})
    assert (d.behavior, str(d.rule)) == ("deny", f"Read(./{name})")


def test_a_search_of_a_directory_whose_contents_are_denied_is_denied(tmp_path: Path) -> None:
    """A search reads the whole tree below its path: a rule on everything inside denies it."""
    (tmp_path / "secret").mkdir()
    p = PermissionPolicy.build(tmp_path, deny=["Read(./secret/**)"])
    d = p.evaluate(GREP, {"pattern": "x", "path": str(tmp_path / "secret")})
    # a denied search is told in the words of a denied read of its path
    assert (d.behavior, d.reason, str(d.rule)) == ("deny", read_denied(str(tmp_path / "secret")), "Read(./secret/**)")
    assert p.evaluate(GREP, {"pattern": "x", "path": str(tmp_path)}).behavior == "allow"


def test_a_denied_file_read_is_told_as_a_tool_error(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, deny=["Read(./secret.env)"])
    d = p.evaluate(READ, {"file_path": str(tmp_path / "secret.env")})
    assert (d.behavior, d.reason) == ("deny", f"<tool_use_error>{FILE_DENIED}</tool_use_error>")


def test_a_hard_link_whose_names_cannot_all_be_checked_is_denied_under_the_first_path_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search for the other names of a hard-linked file gives up past its limit; its denial names
    no rule, and the decision reports the first one."""
    monkeypatch.setattr(file_access, "HARDLINK_WALK_LIMIT", 2)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for i in range(3):
            (tmp_path / d / str(i)).touch()
    (tmp_path / "x.txt").touch()
    (tmp_path / "y.txt").hardlink_to(tmp_path / "x.txt")
    (tmp_path / "z.txt").touch()
    p = PermissionPolicy.build(tmp_path, deny=["Read(./a/**)", "Read(./b/**)"])
    d = p.evaluate(READ, {"file_path": str(tmp_path / "x.txt")})
    assert (d.behavior, str(d.rule)) == ("deny", "Read(./a/**)")
    assert p.evaluate(READ, {"file_path": str(tmp_path / "z.txt")}).behavior == "allow"  # a single name


def test_a_file_tool_judged_by_its_own_subject_is_denied_through_a_link(tmp_path: Path) -> None:
    """With no path key, a file tool's own subject is its path: a denied target is denied through a
    link to it (any spelling of the path meets a deny rule)."""
    (tmp_path / "secret.env").touch()
    (tmp_path / "link").symlink_to(tmp_path / "secret.env")
    tool = FakeTool("Read", read_only=True, subject_key="source")
    p = PermissionPolicy.build(tmp_path, deny=["Read(./secret.env)"])
    d = p.evaluate(tool, {"source": str(tmp_path / "link")})
    assert (d.behavior, str(d.rule)) == ("deny", "Read(./secret.env)")
    assert p.evaluate(tool, {"source": str(tmp_path / "notes.txt")}).behavior == "allow"


def test_a_file_call_without_a_path_is_judged_by_the_mode(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, deny=["Read(./secret.env)"], ask=["Edit(./secret.env)"])
    assert p.evaluate(READ, {}).behavior == "allow"
    d = p.evaluate(WRITE, {"content": "x"})
    assert (d.behavior, d.reason, d.decided_by) == ("ask", "Write needs approval in permission mode default.", "mode")


# ---------------------------------------------------------------------------------------------
# what no rule asks about is not looked at

def test_a_search_path_the_os_cannot_resolve_is_judged_as_written(tmp_path: Path) -> None:
    """A path the OS cannot resolve (a NUL byte) does not break the working-directory check: judged
    as written, it lies inside the working directory."""
    p = PermissionPolicy.build(tmp_path, deny=["Bash(rm *)"], ask=["WebFetch"])
    assert p.evaluate(GREP, {"pattern": "x", "path": "bad\x00path"}).behavior == "allow"


def test_a_command_is_not_analysed_when_there_are_no_rules(tmp_path: Path) -> None:
    """A command the shell analysis cannot read (a lone surrogate) shows it was never analysed: in
    bypassPermissions mode, with no rules, nothing needs the analysis."""
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions")
    d = p.evaluate(BASH, {"command": "echo \ud800"})
    assert (d.behavior, d.decided_by) == ("allow", "mode")


# ---------------------------------------------------------------------------------------------
# allow rules for Bash

@pytest.mark.parametrize("command", ["ls", "rm -rf build && make"])
def test_a_bare_bash_allow_rule_allows_every_command(tmp_path: Path, command: str) -> None:
    p = PermissionPolicy.build(tmp_path, allow=["Bash", "Bash(git status)"])
    d = p.evaluate(BASH, {"command": command})
    assert (d.behavior, str(d.rule), d.decided_by) == ("allow", "Bash", "rule")


def test_a_path_rule_never_allows_a_command_spelled_like_its_path(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, allow=["Read(./run.sh)"])
    assert p.allow_rule_for(BASH, {"command": "./run.sh"}) is None
    assert p.evaluate(BASH, {"command": "./run.sh"}).behavior == "ask"
    assert str(p.allow_rule_for(READ, {"file_path": str(tmp_path / "run.sh")})) == "Read(./run.sh)"


def test_a_bash_call_without_a_command_string_is_not_allowed_by_command_rules(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, allow=["Bash(ls)"])
    assert p.allow_rule_for(BASH, {"command": 5}) is None
    d = p.evaluate(BASH, {"command": 5})
    assert (d.behavior, d.reason) == ("ask", "Bash needs approval in permission mode default.")


def test_an_approved_command_no_single_rule_matches_reports_the_first_allow_rule(tmp_path: Path) -> None:
    """`Bash(ls && echo a:*)` is a legacy prefix rule: written as the command, it does not match it;
    the parts are approved by the other two rules, and the report falls back on the first rule."""
    p = PermissionPolicy.build(tmp_path, allow=["Bash(ls && echo a:*)", "Bash(ls)", "Bash(echo *)"])
    d = p.evaluate(BASH, {"command": "ls && echo a:*"})
    assert (d.behavior, str(d.rule)) == ("allow", "Bash(ls && echo a:*)")


# ---------------------------------------------------------------------------------------------
# the mode's texts

def test_plan_mode_names_a_write_by_the_path_as_given(tmp_path: Path) -> None:
    (tmp_path / "target.txt").touch()
    (tmp_path / "link").symlink_to(tmp_path / "target.txt")
    d = PermissionPolicy.build(tmp_path, mode="plan").evaluate(WRITE, {"file_path": str(tmp_path / "link")})
    assert (d.behavior, d.reason) == ("ask", f"Cannot write to {tmp_path / 'link'} while in plan mode.")


def test_a_write_the_mode_asks_about_names_the_path_as_given(tmp_path: Path) -> None:
    (tmp_path / "target.txt").touch()
    (tmp_path / "link").symlink_to(tmp_path / "target.txt")
    d = PermissionPolicy.build(tmp_path).evaluate(WRITE, {"file_path": str(tmp_path / "link")})
    assert (d.behavior, d.reason, d.bare) == ("ask", asked_text("write to", tmp_path / "link"), True)


def test_the_mode_reads_a_command_only_for_a_shell_tool(tmp_path: Path) -> None:
    d = PermissionPolicy.build(tmp_path).evaluate(FakeTool("Deploy"), {"command": "ship it"})
    assert (d.behavior, d.reason, d.bare) == ("ask", "Deploy needs approval in permission mode default.", False)


async def test_a_command_the_mode_asks_about_is_told_in_claude_codes_words(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path)
    d = p.evaluate(BASH, {"command": "git push"})
    assert (d.behavior, d.reason, d.bare) == ("ask", "This command requires approval", True)
    final = await p.decide(BASH, {"command": "git push"})
    assert (final.behavior, final.reason, final.decided_by) == ("deny", "This command requires approval",
                                                                "non_interactive")


@pytest.mark.parametrize(("allow", "named"), [
    ([], "touch"),
    (["Bash(touch *)"], "rm"),  # touch is approved: the text names what is not
    (["Read(touch *)"], "touch"),  # a rule of another tool approves no program
])
def test_the_mode_names_the_first_write_no_allow_rule_approves(tmp_path: Path, allow: list[str], named: str) -> None:
    p = PermissionPolicy.build(tmp_path, allow=allow)
    d = p.evaluate(BASH, {"command": "touch a.txt && rm -rf build"})
    where = p.cwd / ("a.txt" if named == "touch" else "build")
    assert d.behavior == "ask"
    assert d.reason.startswith(f"{named} in '{where}' needs approval."), d.reason


def test_plan_mode_reads_a_command_only_for_a_shell_tool(tmp_path: Path) -> None:
    deploy = FakeTool("Deploy")
    d = PermissionPolicy.build(tmp_path, mode="plan").evaluate(deploy, {"command": "ship it"})
    assert (d.behavior, d.reason) == (
        "ask", "Deploy is not available in plan mode: only read-only tools may run until the plan is approved.")
    shell = PermissionPolicy.build(tmp_path, mode="plan").evaluate(BASH, {"command": "rm -rf build"})
    assert shell.behavior == "ask" and shell.reason.startswith("rm in ")


# ---------------------------------------------------------------------------------------------
# acceptEdits and shell commands

def test_accept_edits_allows_a_command_that_only_edits_inside_the_working_directory(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, mode="acceptEdits")
    inside = p.evaluate(BASH, {"command": "touch a.txt"})
    assert (inside.behavior, inside.decided_by) == ("allow", "mode")
    assert p.evaluate(BASH, {"command": f"touch {tmp_path.parent / 'x.txt'}"}).behavior == "ask"


@pytest.mark.parametrize(("tool", "command"), [
    (BASH, "touch a.txt\r"),  # bash and the analysis may read a carriage return differently
    (BASH, 5),
    (FakeTool("Deploy"), "touch a.txt"),  # only a shell tool's command is read as a command
])
def test_accept_edits_does_not_allow_a_command_it_cannot_vouch_for(tmp_path: Path, tool: FakeTool,
                                                                   command: object) -> None:
    d = PermissionPolicy.build(tmp_path, mode="acceptEdits").evaluate(tool, {"command": command})
    assert (d.behavior, d.decided_by) == ("ask", "mode")


# ---------------------------------------------------------------------------------------------
# where and with what a call is judged

class ThreadNoting(FakeTool):
    """Notes the thread its read-only classifier runs in: the thread the call is judged in."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.threads: list[int] = []

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        self.threads.append(threading.get_ident())
        return False


async def test_only_a_bash_call_is_judged_off_the_event_loop(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path)
    loop_thread = threading.get_ident()
    write, shell = ThreadNoting("Write"), ThreadNoting("Bash")
    await p.decide(write, {"file_path": str(tmp_path / "a")})
    await p.decide(shell, {"command": "git push"})
    assert write.threads == [loop_thread]
    assert len(shell.threads) == 1 and shell.threads[0] != loop_thread


@pytest.mark.parametrize("tool", [READ, BASH])
async def test_a_hooks_deny_reason_reaches_the_model_for_every_tool(tmp_path: Path, tool: FakeTool) -> None:
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions")
    d = await p.decide(tool, {"file_path": str(tmp_path / "a"), "command": "ls"}, hook_decision="deny",
                       hook_reason="blocked by policy")
    assert (d.behavior, d.reason, d.decided_by) == ("deny", f"PreToolUse:{tool.name} hook error: blocked by policy",
                                                    "hook")


async def test_the_callback_is_told_the_call_it_answers(tmp_path: Path) -> None:
    seen: list[ToolPermissionContext] = []

    def answer(name: str, tool_input: Mapping[str, Any], ctx: ToolPermissionContext) -> bool:
        seen.append(ctx)
        return True

    p = PermissionPolicy.build(tmp_path, mode="acceptEdits", ask=["Bash(git push *)"])
    d = await p.decide(BASH, {"command": "git push origin"}, can_use_tool=answer, tool_use_id="toolu_1")
    assert (d.behavior, d.decided_by) == ("allow", "callback")
    assert seen == [ToolPermissionContext(tool_use_id="toolu_1", permission_mode="acceptEdits",
                                          reason="Rule Bash(git push *) (settings) requires approval.",
                                          rule="Bash(git push *)", cwd=str(p.cwd),
                                          # a command with no description is described by itself (Claude Code)
                                          description="git push origin")]
