"""Permission rules (Claude Code syntax), modes, hook decisions and the can_use_tool callback."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agentfsm.hooks.permissions import (
    PermissionAllow,
    PermissionDeny,
    PermissionPolicy,
    PermissionRule,
    ToolPermissionContext,
    normalize_mode,
    parse_rule_text,
    split_tool_list,
)
from agentfsm.tools.base import Tool


class FakeTool(Tool):
    """A tool that does nothing; its read-only answer and its subject (the input under ``subject_key``)
    are what the test says. Shared by the permission test files."""

    def __init__(self, name: str, read_only: bool = False, aliases: tuple[str, ...] = (),
                 subject_key: str | None = None) -> None:
        self.name = name
        self.aliases = aliases
        self._read_only = read_only
        self._key = subject_key

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        return self._read_only

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        if self._key is None:
            return super().permission_subject(input)
        value = input.get(self._key)
        return value if isinstance(value, str) else None


class FakeBash(FakeTool):
    """Read-only only for a plain `ls`/`cat`/`git status` with no shell operators."""

    def __init__(self) -> None:
        super().__init__("Bash")

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        cmd = str(input.get("command", ""))
        return cmd.split(" ")[0] in ("ls", "cat") and not any(c in cmd for c in ";&|$`>")


BASH = FakeBash()
READ, GREP, GLOB = FakeTool("Read", True), FakeTool("Grep", True), FakeTool("Glob", True)
WRITE, EDIT, MULTI = FakeTool("Write"), FakeTool("Edit"), FakeTool("MultiEdit")
FETCH = FakeTool("WebFetch", True)
AGENT = FakeTool("Agent", aliases=("Task",))
MCP = FakeTool("mcp__github__create_issue")


def policy(tmp_path: Path, **kw: Any) -> PermissionPolicy:
    return PermissionPolicy.build(tmp_path, **kw)


def bash_verdict(p: PermissionPolicy, command: str) -> str:
    return p.evaluate(BASH, {"command": command}).behavior


# ---------------------------------------------------------------------------------------------
# Rule syntax

@pytest.mark.parametrize(("text", "parsed"), [
    ("Bash", ("Bash", None)), ("Bash()", ("Bash", None)), ("Bash(*)", ("Bash", None)),
    ("Bash(npm run test:*)", ("Bash", "npm run test:*")), ("Read(./.env)", ("Read", "./.env")),
    ("Edit(src/**)", ("Edit", "src/**")),
    ("  WebFetch(domain:example.com) ", ("WebFetch", "domain:example.com")),
    ("Bash(echo \\(hi\\))", ("Bash", "echo (hi)")),
    ("Bash(python -c 'print(1)')", ("Bash", "python -c 'print(1)'")),
    ("mcp__github", ("mcp__github", None)), ("mcp__github__*", ("mcp__github__*", None)),
])
def test_rule_parsing(text: str, parsed: tuple[str, str | None]) -> None:
    assert parse_rule_text(text) == parsed


@pytest.mark.parametrize("bad", ["", "  ", "Bash(ls", "Bash ls)", "(ls)", "Ba sh", "Bash)"])
def test_bad_rules_raise(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_rule_text(bad)


def test_rule_str_round_trips() -> None:
    for text in ("Bash(npm run test:*)", "Read", "Edit(//etc/**)"):
        assert str(PermissionRule.parse(text, "deny")) == text
    assert PermissionRule.parse("Bash(x)", "ask").label == "ask: Bash(x)"


def test_tool_lists_split_on_commas_and_spaces_outside_parentheses() -> None:
    assert split_tool_list("Bash(git log *) Read,Edit(src/**),  Grep") == [
        "Bash(git log *)", "Read", "Edit(src/**)", "Grep"]
    assert split_tool_list(["Bash(npm run test:*)", "Write Glob"]) == [
        "Bash(npm run test:*)", "Write", "Glob"]


def test_modes() -> None:
    assert normalize_mode("manual") == "default" and normalize_mode(None) == "default"
    for mode in ("default", "acceptEdits", "plan", "bypassPermissions", "dontAsk"):
        assert normalize_mode(mode) == mode
    with pytest.raises(ValueError, match="unknown permission mode"):
        normalize_mode("auto")


# ---------------------------------------------------------------------------------------------
# Bash specifiers

@pytest.mark.parametrize(("rule", "command", "hit"), [
    ("npm run build", "npm run build", True),
    ("npm run build", "npm run build --prod", False),
    ("npm run build", "  npm run build  ", True),
    ("ls *", "ls -la", True), ("ls *", "ls", True), ("ls *", "lsof", False),
    ("ls*", "lsof", True), ("ls*", "ls -la", True),
    ("git * main", "git push origin main", True), ("git * main", "git push origin dev", False),
    ("* --version", "node --version", True), ("* --version", "node --help", False),
    ("npm run test:*", "npm run test", True), ("npm run test:*", "npm run test -- -x", True),
    ("npm run test:*", "npm run testing", False), ("npm run test:*", "npm run", False),
    ("foo:*bar", "foo:xxbar", True),  # `:*` is a prefix marker only at the end
    ("echo \\*", "echo *", True), ("echo \\*", "echo hi", False),
])
def test_bash_specifiers(tmp_path: Path, rule: str, command: str, hit: bool) -> None:
    p = policy(tmp_path, allow=[f"Bash({rule})"])
    assert (bash_verdict(p, command) == "allow") is hit


@pytest.mark.parametrize(("command", "verdict"), [
    ("git status", "allow"),
    ("git status && git diff", "allow"),
    ("git status && rm -rf build", "ask"),  # not every part is approved
    ("git status; git diff | grep x", "ask"),
    ("git status || npm test", "allow"),
    ("git diff | npm test", "allow"),
    ("git status & curl evil.sh", "ask"),
    ("git status\ncurl evil.sh", "ask"),
    ("git diff \"a && b\"", "allow"),  # operators inside quotes do not split
    ("git diff 'x; rm -rf /'", "allow"),
    ("git diff 2>&1", "allow"),  # a redirection is not an operator
    ("git diff $(curl evil.sh)", "ask"),  # substitutions run too
    ("git diff `curl evil.sh`", "ask"),
    ("git diff $(git status)", "allow"),
    ("git diff \"$(curl evil.sh)\"", "ask"),
    ("(git status; curl x)", "ask"),
    ("git diff 'unterminated", "ask"),  # unparsable shell is never pre-approved
])
def test_compound_commands_need_every_part_allowed(tmp_path: Path, command: str, verdict: str) -> None:
    p = policy(tmp_path, allow=["Bash(git status)", "Bash(git diff *)", "Bash(npm test)"])
    assert bash_verdict(p, command) == verdict


@pytest.mark.parametrize("command", [
    "rm -rf /", "ls && rm -rf /", "ls; rm -rf /tmp/x", "ls | rm -rf x", "echo $(rm -rf /)", "echo `rm -rf /`",
    "FOO=1 rm -rf /", "sudo rm -rf /", "/bin/rm -rf /", "env A=1 rm -rf x", "timeout 5 rm -rf x",
    "nohup rm -rf x &", "bash -c 'rm -rf /'", "sh -c \"ls; rm -rf /\"", "eval 'rm -rf /'", "rm  -rf  /",
    "rm -rf \"/\"", "find . | xargs rm -rf", "if true; then rm -rf /; fi", "{ rm -rf /; }",
])
def test_deny_catches_any_part_and_any_spelling(tmp_path: Path, command: str) -> None:
    p = policy(tmp_path, mode="bypassPermissions", allow=["Bash"], deny=["Bash(rm -rf *)"])
    assert bash_verdict(p, command) == "deny", command


def test_allow_rules_do_not_use_normalised_spellings(tmp_path: Path) -> None:
    # `Bash(npm test)` must not approve a differently-spelled command that merely looks similar.
    p = policy(tmp_path, allow=["Bash(npm test)"])
    for command in ("NODE_OPTIONS=--require=evil npm test", "sudo npm test", "bash -c 'npm test'"):
        assert bash_verdict(p, command) == "ask", command
    assert bash_verdict(p, "npm test") == "allow"


def test_exact_compound_rule(tmp_path: Path) -> None:
    p = policy(tmp_path, allow=["Bash(npm run build && npm test)"])
    assert bash_verdict(p, "npm run build && npm test") == "allow"
    assert p.allow_rule_for(BASH, {"command": "npm run build && npm test"}) == p.allow[0]


def test_ask_rules_and_precedence(tmp_path: Path) -> None:
    p = policy(tmp_path, allow=["Bash(git *)"], ask=["Bash(git push *)"], deny=["Bash(git push --force *)"])
    assert p.evaluate(BASH, {"command": "git log"}).behavior == "allow"
    ask = p.evaluate(BASH, {"command": "git push origin main"})
    assert ask.behavior == "ask" and str(ask.rule) == "Bash(git push *)"
    deny = p.evaluate(BASH, {"command": "git push --force origin main"})
    assert deny.behavior == "deny" and str(deny.rule) == "Bash(git push --force *)"
    # Claude Code's text: the command is quoted, the rule is not named (it is in the decision and the log)
    assert deny.reason == "Permission to use Bash with command git push --force origin main has been denied."


# ---------------------------------------------------------------------------------------------
# Path specifiers

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    cwd = tmp_path / "proj"
    (cwd / "src/pkg").mkdir(parents=True)
    (cwd / "docs").mkdir()
    return cwd


@pytest.mark.parametrize(("rule", "path", "hit"), [
    ("Read(./.env)", ".env", True), ("Read(./.env)", "sub/.env", False),
    ("Read(.env)", "sub/deeper/.env", True),  # no slash: any depth, as in gitignore
    ("Read(*.pem)", "keys/server.pem", True), ("Read(*.pem)", "server.pem.bak", False),
    ("Edit(src/*)", "src/a.py", True), ("Edit(src/*)", "src/pkg/a.py", True),  # dir src/pkg matches `*`
    ("Edit(src/*.py)", "src/pkg/a.py", False), ("Edit(src/*.py)", "src/a.py", True),
    ("Edit(src/**)", "src/pkg/deep/a.py", True), ("Edit(src/**)", "docs/a.md", False),
    ("Edit(src/**/*.py)", "src/a.py", True), ("Edit(src/**/*.py)", "src/pkg/x/a.py", True),
    ("Edit(docs)", "docs/guide/a.md", True),  # a matched directory covers what is inside
    ("Edit(./src/pkg/a.py)", "src/pkg/../pkg/a.py", True),  # `..` is normalised
    ("Edit(src/**)", "src/../../outside.py", False),
])
def test_relative_path_rules(tree: Path, rule: str, path: str, hit: bool) -> None:
    tool = READ if rule.startswith("Read") else EDIT
    p = policy(tree, deny=[rule], mode="bypassPermissions")
    assert (p.evaluate(tool, {"file_path": str(tree / path)}).behavior == "deny") is hit
    # relative file paths resolve against the cwd too
    assert (p.evaluate(tool, {"file_path": path}).behavior == "deny") is hit


def test_root_home_and_project_anchors(tree: Path, tmp_path: Path) -> None:
    home = Path.home()
    p = PermissionPolicy.build(tree, mode="bypassPermissions", deny=[
        "Edit(//etc/**)", "Read(~/.ssh/**)",
        PermissionRule.parse("Edit(/build/**)", "deny", "settings", root=tmp_path / "other")])
    assert p.evaluate(WRITE, {"file_path": "/etc/passwd"}).behavior == "deny"
    assert p.evaluate(READ, {"file_path": str(home / ".ssh/id_rsa")}).behavior == "deny"
    assert p.evaluate(READ, {"file_path": "~/.ssh/id_rsa"}).behavior == "deny"
    assert p.evaluate(EDIT, {"file_path": str(tmp_path / "other/build/x.o")}).behavior == "deny"
    assert p.evaluate(EDIT, {"file_path": str(tree / "build/x.o")}).behavior == "allow"
    # a CLI rule's `/p` is relative to the cwd
    q = PermissionPolicy.build(tree, mode="bypassPermissions", deny=["Edit(/build/**)"])
    assert q.evaluate(EDIT, {"file_path": str(tree / "build/x.o")}).behavior == "deny"


def test_edit_rules_cover_write_and_read_rules_cover_grep_and_glob(tree: Path) -> None:
    p = policy(tree, mode="bypassPermissions", deny=["Edit(src/**)", "Read(docs/**)"])
    for tool in (EDIT, WRITE, MULTI):
        assert p.evaluate(tool, {"file_path": str(tree / "src/a.py")}).behavior == "deny", tool.name
    assert p.evaluate(READ, {"file_path": str(tree / "src/a.py")}).behavior == "allow"
    assert p.evaluate(GREP, {"pattern": "x", "path": str(tree / "docs/api")}).behavior == "deny"
    assert p.evaluate(GLOB, {"pattern": "**/*.md", "path": "docs/api"}).behavior == "deny"
    assert p.evaluate(GLOB, {"pattern": "docs/api/*.md"}).behavior == "deny"  # the fixed prefix counts
    assert p.evaluate(WRITE, {"file_path": str(tree / "docs/a.md")}).behavior == "allow"
    # a rule naming Write covers Write only
    q = policy(tree, mode="bypassPermissions", deny=["Write(src/**)"])
    assert q.evaluate(EDIT, {"file_path": str(tree / "src/a.py")}).behavior == "allow"
    assert q.evaluate(WRITE, {"file_path": str(tree / "src/a.py")}).behavior == "deny"


def test_symlink_to_a_denied_path_is_denied(tree: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("k")
    os.symlink(secret, tree / "innocent")
    p = PermissionPolicy.build(tree, mode="bypassPermissions", deny=[f"Read(/{secret.relative_to('/')}/**)"
                                                                     .replace("Read(/", "Read(//")])
    assert p.evaluate(READ, {"file_path": str(tree / "innocent/key")}).behavior == "deny"
    # and an allow rule needs both the path and its target to be covered
    q = policy(tree, allow=["Edit(innocent/**)"])
    assert q.evaluate(EDIT, {"file_path": str(tree / "innocent/key")}).behavior == "ask"
    q = policy(tree, allow=["Edit(src/**)"])
    assert q.evaluate(EDIT, {"file_path": str(tree / "src/a.py")}).behavior == "allow"


# ---------------------------------------------------------------------------------------------
# Other tools

def test_other_specifiers(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="bypassPermissions",
               deny=["WebFetch(domain:evil.com)", "mcp__github", "Agent(general-purpose)"])
    assert p.evaluate(FETCH, {"url": "https://api.evil.com/x"}).behavior == "deny"
    assert p.evaluate(FETCH, {"url": "https://notevil.com/x"}).behavior == "allow"
    assert p.evaluate(MCP, {}).behavior == "deny"
    assert p.evaluate(AGENT, {"subagent_type": "general-purpose", "prompt": "x"}).behavior == "deny"
    assert p.evaluate(AGENT, {"subagent_type": "Explore", "prompt": "x"}).behavior == "allow"
    q = policy(tmp_path, deny=["Task"], mode="bypassPermissions")  # legacy names reach the tool by alias
    assert q.evaluate(AGENT, {}).behavior == "deny"


# ---------------------------------------------------------------------------------------------
# Modes

def test_default_mode(tmp_path: Path) -> None:
    p = policy(tmp_path)
    assert p.evaluate(READ, {"file_path": "a"}).behavior == "allow"
    # a read outside the working directories asks (Claude Code), with its text for nobody to ask
    outside = p.evaluate(READ, {"file_path": "/etc/hosts"})
    assert (outside.behavior, outside.bare) == ("ask", True)
    assert outside.reason == "Claude requested permissions to read from /etc/hosts, but you haven't granted it yet."
    assert p.evaluate(BASH, {"command": "ls"}).behavior == "allow"
    assert p.evaluate(BASH, {"command": "make"}).behavior == "ask"
    assert p.evaluate(WRITE, {"file_path": "a"}).behavior == "ask"


def test_accept_edits_mode(tmp_path: Path) -> None:
    extra = tmp_path.parent / (tmp_path.name + "-extra")
    p = policy(tmp_path, mode="acceptEdits", additional_directories=[extra])
    assert p.evaluate(WRITE, {"file_path": str(tmp_path / "a.py")}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": "sub/a.py"}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": str(extra / "x")}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": "../outside.py"}).behavior == "ask"
    assert p.evaluate(EDIT, {"file_path": "/etc/passwd"}).behavior == "ask"
    assert p.evaluate(READ, {"file_path": "/etc/hosts"}).behavior == "ask"
    assert p.evaluate(READ, {"file_path": str(extra / "x")}).behavior == "allow"
    assert p.evaluate(BASH, {"command": "make"}).behavior == "ask"


def test_plan_mode_is_read_only(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="plan", allow=["Bash(make)", "Edit"])
    assert p.evaluate(READ, {"file_path": "a"}).behavior == "allow"
    assert p.evaluate(BASH, {"command": "ls"}).behavior == "allow"
    # Claude Code's texts: a file write names its path, a shell command says what needs approval
    texts = {"make": "This command requires approval", "a": f"Cannot write to {tmp_path / 'a'} while in plan mode."}
    for tool, inp in ((BASH, {"command": "make"}), (EDIT, {"file_path": "a"}), (WRITE, {"file_path": "a"})):
        # asked (the SDK's can_use_tool may approve, as in Claude Code); nobody to ask denies with the text
        d = p.evaluate(tool, inp, hook_decision="allow")
        assert (d.behavior, d.bare) == ("ask", True) and d.reason == texts[inp.get("command") or inp["file_path"]]


def test_bypass_mode(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="bypassPermissions", deny=["Bash(rm *)"], ask=["Bash(git push *)"])
    assert p.evaluate(BASH, {"command": "make"}).behavior == "allow"
    assert p.evaluate(WRITE, {"file_path": "/anywhere"}).behavior == "allow"
    assert p.evaluate(BASH, {"command": "rm x"}).behavior == "deny"
    assert p.evaluate(BASH, {"command": "git push origin"}).behavior == "ask"


def test_dont_ask_mode(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="dontAsk", allow=["Bash(make)"], ask=["Bash(make install)"])
    assert p.evaluate(BASH, {"command": "make"}).behavior == "allow"
    assert p.evaluate(READ, {"file_path": "a"}).behavior == "allow"
    for inp in ({"command": "make test"}, {"command": "make install"}):
        d = p.evaluate(BASH, inp)
        # Claude Code's dontAsk text, naming the tool
        assert d.behavior == "deny" and d.reason.startswith("Permission to use Bash has been denied because Claude "
                                                            "Code is running in don't ask mode. IMPORTANT:")
    assert p.evaluate(BASH, {"command": "make"}, hook_decision="ask").behavior == "deny"


def test_a_read_only_classifier_that_raises_is_not_trusted(tmp_path: Path) -> None:
    class Broken(FakeTool):
        def is_read_only(self, input: Mapping[str, Any]) -> bool:
            raise RuntimeError("nope")

    assert policy(tmp_path).evaluate(Broken("X"), {}).behavior == "ask"
    assert policy(tmp_path, mode="plan").evaluate(Broken("X"), {}).behavior == "ask"


class RaisingSubject(FakeTool):
    """A tool whose subject cannot be named: every part of the check that asks for it fails."""

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        raise RuntimeError("no subject")


@pytest.mark.parametrize("mode", ["default", "acceptEdits", "plan", "bypassPermissions", "dontAsk"])
def test_a_subject_that_raises_is_denied_by_any_rule_that_could_apply(tmp_path: Path, mode: str) -> None:
    deploy = RaisingSubject("Deploy", read_only=True)
    d = policy(tmp_path, mode=mode, deny=["Deploy(prod*)"]).evaluate(deploy, {"target": "prod-eu"})
    assert (d.behavior, d.decided_by, str(d.rule)) == ("deny", "rule", "Deploy(prod*)")
    assert "could not be checked against the permission rules (RuntimeError: no subject)" in d.reason
    # an ask rule asks (and is no allow), an allow rule with a specifier approves nothing
    asked = policy(tmp_path, mode=mode, ask=["Deploy(prod*)"]).evaluate(deploy, {})
    assert asked.behavior != "allow" and str(asked.rule) == "Deploy(prod*)"
    # a rule of another tool does not apply: the (read-only) call is judged by the mode alone
    assert policy(tmp_path, mode=mode, deny=["Other(prod*)"]).evaluate(deploy, {}).behavior == "allow"


def test_a_subject_that_raises_is_approved_by_no_allow_rule(tmp_path: Path) -> None:
    tool = RaisingSubject("Deploy")
    d = policy(tmp_path, allow=["Deploy(prod*)"]).evaluate(tool, {})
    assert d.behavior == "ask" and d.rule is None
    assert policy(tmp_path, allow=["Deploy"]).evaluate(tool, {}).behavior == "allow"  # the whole tool


def test_a_file_tool_whose_subject_raises_is_denied_by_its_path_rules(tmp_path: Path) -> None:
    # no path key: the subject comes from permission_subject, which fails
    for name in ("Read", "Write"):  # (Grep and Glob without a path search the cwd: no subject asked)
        tool = RaisingSubject(name, read_only=name != "Write")
        d = policy(tmp_path, mode="bypassPermissions", deny=["Read(./secrets/**)", "Edit(.env)"]).evaluate(tool, {})
        assert d.behavior == "deny", name


def test_any_failure_of_the_check_denies(tmp_path: Path) -> None:
    class Exploding(FakeTool):
        def permission_subject(self, input: Mapping[str, Any]) -> str | None:
            raise RecursionError("deep")

    # an Edit-family tool in acceptEdits asks for its paths, which asks for the subject
    d = policy(tmp_path, mode="acceptEdits").evaluate(Exploding("Write"), {})
    assert d.behavior == "deny" and "RecursionError: deep" in d.reason


# ---------------------------------------------------------------------------------------------
# Hook decisions and the callback

def test_hook_decisions_against_rules(tmp_path: Path) -> None:
    p = policy(tmp_path, allow=["Bash(make)"], ask=["Bash(make deploy)"], deny=["Bash(rm *)"])
    assert p.evaluate(BASH, {"command": "rm x"}, hook_decision="allow").behavior == "deny"  # allow ≠ override
    assert p.evaluate(BASH, {"command": "make deploy"}, hook_decision="allow").behavior == "ask"
    assert p.evaluate(BASH, {"command": "cc x"}, hook_decision="allow").behavior == "allow"
    # a hook's ask forces a question even where an allow rule would not ask
    assert p.evaluate(BASH, {"command": "make"}, hook_decision="ask").behavior == "ask"
    assert p.evaluate(BASH, {"command": "make"}, hook_decision="defer").behavior == "ask"
    d = p.evaluate(BASH, {"command": "make"}, hook_decision="deny", hook_reason="hook says no")
    assert (d.behavior, d.reason, d.decided_by) == ("deny", "PreToolUse:Bash hook error: hook says no", "hook")
    bypass = policy(tmp_path, mode="bypassPermissions")
    assert bypass.evaluate(BASH, {"command": "ls"}, hook_decision="deny").behavior == "deny"


async def test_non_interactive_ask_is_a_denial(tmp_path: Path) -> None:
    d = await policy(tmp_path).decide(WRITE, {"file_path": "a"})
    assert d.behavior == "deny" and d.decided_by == "non_interactive"
    # Claude Code's text (the hint for the human goes to the log)
    assert d.reason == f"Claude requested permissions to write to {tmp_path / 'a'}, but you haven't granted it yet."
    d = await policy(tmp_path).decide(FakeTool("mcp__x__y"), {})
    assert "non-interactive" in d.reason and "--allowedTools" in d.reason


async def test_can_use_tool_answers_what_rules_leave_open(tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, Any], ToolPermissionContext]] = []

    async def approve(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> PermissionAllow:
        seen.append((name, dict(inp), ctx))
        return PermissionAllow()

    p = policy(tmp_path, ask=["Bash(make *)"], deny=["Bash(rm *)"])
    d = await p.decide(BASH, {"command": "make all"}, can_use_tool=approve, tool_use_id="toolu_9")
    assert d.behavior == "allow" and d.decided_by == "callback"
    name, inp, ctx = seen[0]
    assert (name, inp, ctx.rule, ctx.tool_use_id, ctx.permission_mode) == (
        "Bash", {"command": "make all"}, "Bash(make *)", "toolu_9", "default")
    # never consulted for what rules already decided
    seen.clear()
    assert (await p.decide(BASH, {"command": "rm x"}, can_use_tool=approve)).behavior == "deny"
    assert (await p.decide(BASH, {"command": "ls"}, can_use_tool=approve)).behavior == "allow"
    assert seen == []


async def test_can_use_tool_answers(tmp_path: Path) -> None:
    p = policy(tmp_path, deny=["Bash(rm *)"])

    def deny_cb(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> PermissionDeny:
        return PermissionDeny("not today", interrupt=True)

    d = await p.decide(BASH, {"command": "make"}, can_use_tool=deny_cb)
    assert (d.behavior, d.reason, d.interrupt) == ("deny", "not today", True)

    def rewrite(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> dict[str, Any]:
        return {"behavior": "allow", "updatedInput": {"command": "make -n"}}

    d = await p.decide(BASH, {"command": "make"}, can_use_tool=rewrite)
    assert d.behavior == "allow" and d.updated_input == {"command": "make -n"}

    def sneaky(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> PermissionAllow:
        return PermissionAllow(updated_input={"command": "rm -rf /"})

    d = await p.decide(BASH, {"command": "make"}, can_use_tool=sneaky)
    assert d.behavior == "deny" and str(d.rule) == "Bash(rm *)"

    def broken(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> Any:
        raise RuntimeError("callback crashed")

    d = await p.decide(BASH, {"command": "make"}, can_use_tool=broken)
    assert d.behavior == "deny" and "callback crashed" in d.reason

    d = await p.decide(BASH, {"command": "make"}, can_use_tool=lambda n, i, c: "yes")
    assert d.behavior == "deny" and "can_use_tool must return" in d.reason
    assert (await p.decide(BASH, {"command": "make"}, can_use_tool=lambda n, i, c: True)).behavior == "allow"


async def test_dont_ask_never_calls_the_callback(tmp_path: Path) -> None:
    called = []
    p = policy(tmp_path, mode="dontAsk")
    d = await p.decide(BASH, {"command": "make"}, can_use_tool=lambda n, i, c: called.append(1) or True)
    assert d.behavior == "deny" and called == []


# ---------------------------------------------------------------------------------------------
# CLI lists and visible tools

def test_allowed_and_disallowed_tools(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, allowed_tools="Bash(git log *),Write",
                               disallowed_tools="Bash(rm *) Edit")
    assert p.evaluate(BASH, {"command": "git log -1"}).behavior == "allow"
    assert p.evaluate(WRITE, {"file_path": "/x"}).behavior == "allow"
    assert p.evaluate(BASH, {"command": "rm x"}).behavior == "deny"
    assert p.evaluate(EDIT, {"file_path": "x"}).behavior == "deny"
    assert [r.source for r in p.deny] == ["cli", "cli"]


def test_visible_tools(tmp_path: Path) -> None:
    p = PermissionPolicy.build(tmp_path, deny=["Bash(rm *)", "mcp__github"],
                               disallowed_tools=["WebFetch", "Edit"])
    names = ["Read", "Edit", "Write", "Bash", "WebFetch", "mcp__github__create_issue", "mcp__slack__post"]
    assert p.visible_tools(names) == ["Read", "Write", "Bash", "mcp__slack__post"]


async def test_a_long_bash_command_is_judged_off_the_event_loop(tmp_path: Path) -> None:
    import asyncio
    import gc
    import time

    from agentfsm.tools import BashTool
    from agentfsm.tools.shell import MAX_COMMAND_BYTES

    p = policy(tmp_path, mode="bypassPermissions", deny=["Bash(rm:*)", "Read(./secret.txt)"])
    command = "echo a && " * ((MAX_COMMAND_BYTES - 100) // 10) + "rm x"
    worst, stop = [0.0], asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            worst[0], last = max(worst[0], now - last), now

    # a full collection in a long test process stops every thread alike: that is not what is measured
    gc.collect()
    gc.disable()
    try:
        tick = asyncio.ensure_future(ticker())
        started = time.perf_counter()
        d = await p.decide(BashTool(), {"command": command})
        elapsed = time.perf_counter() - started
        stop.set()
        await tick
    finally:
        gc.enable()
    assert d.behavior == "deny"  # the rm at the end of 128 KB is found
    # judged on the loop, the longest stall would be the whole judgement; relative, so load cannot fail it
    assert worst[0] < elapsed / 2, f"the event loop stalled {worst[0]:.2f}s of {elapsed:.2f}s"


@pytest.mark.parametrize("command", ["git -C . push origin main", "git --no-pager -c color.ui=false push",
                                     "env GIT_DIR=.git git push", "cd sub && git push", "git push --force"])
def test_subcommand_rules_see_through_global_options(tmp_path: Path, command: str) -> None:
    from agentfsm.tools import BashTool

    p = policy(tmp_path, mode="bypassPermissions", deny=["Bash(git push:*)"])
    assert p.evaluate(BashTool(), {"command": command}).behavior == "deny"
    assert p.evaluate(BashTool(), {"command": "git -C sub status"}).behavior == "allow"
