"""The permission policy's small answers, one behaviour per test: which tools a rule family covers,
the MCP server prefixes, what a rule's identity is, rule text errors, file calls that name no path,
Bash rules on tools that are not Bash. Each test states a behaviour a wrong line of
``hooks/permissions.py`` would change (the mutation campaign of ``bench/mutation.py`` found them
unguarded); both sides of each rule are checked."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_permissions import FakeTool  # the permission tests' shared fake tool

from agentfsm.hooks.permissions import (
    PermissionPolicy,
    PermissionRule,
    dedup_rules,
    parse_rule_text,
    requested,
)
from agentfsm.tools.base import FILE_DENIED, read_denied

READ, LS, GLOB, GREP = (FakeTool(n, True) for n in ("Read", "LS", "Glob", "Grep"))
EDIT, NOTEBOOK_EDIT = FakeTool("Edit"), FakeTool("NotebookEdit")
BASH, FETCH = FakeTool("Bash"), FakeTool("WebFetch", True)
DENIED_FILE = f"<tool_use_error>{FILE_DENIED}</tool_use_error>"


class BrokenSubject(FakeTool):
    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        raise RuntimeError("cannot say")


def policy(cwd: Path, **kw: Any) -> PermissionPolicy:
    return PermissionPolicy.build(cwd, **kw)


# --- rule families --------------------------------------------------------------------------------


def test_an_edit_rule_covers_notebook_edit(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="bypassPermissions", deny=["Edit(./nb.ipynb)"])
    assert str(p.deny_rule_for(NOTEBOOK_EDIT, {"notebook_path": str(tmp_path / "nb.ipynb")})) == "Edit(./nb.ipynb)"
    # judged as a file (the policy's file text), not as a generic tool
    assert p.evaluate(NOTEBOOK_EDIT, {"notebook_path": str(tmp_path / "nb.ipynb")}).reason == DENIED_FILE
    assert p.deny_rule_for(NOTEBOOK_EDIT, {"notebook_path": str(tmp_path / "other.ipynb")}) is None


@pytest.mark.parametrize("tool", [LS, GLOB, GREP], ids=lambda t: t.name)
def test_a_read_rule_covers_every_search_tool_on_its_directory(tmp_path: Path, tool: FakeTool) -> None:
    (tmp_path / "private").mkdir()
    (tmp_path / "open").mkdir()
    p = policy(tmp_path, mode="bypassPermissions", deny=["Read(./private/**)"])
    assert p.evaluate(tool, {"path": str(tmp_path / "private")}).behavior == "deny"
    assert p.evaluate(tool, {"path": str(tmp_path / "open")}).behavior == "allow"


@pytest.mark.parametrize("tool", [LS, GLOB, GREP], ids=lambda t: t.name)
def test_a_search_without_a_path_searches_the_working_directory(tmp_path: Path, tool: FakeTool) -> None:
    (tmp_path / "private").mkdir()
    (tmp_path / "open").mkdir()
    rule = f"Read(/{tmp_path.resolve()}/private/**)"  # absolute (//...): the same place from either cwd
    inside = policy(tmp_path / "private", mode="bypassPermissions", deny=[rule])
    assert inside.evaluate(tool, {"pattern": "*"}).behavior == "deny"
    outside = policy(tmp_path / "open", mode="bypassPermissions", deny=[rule])
    assert outside.evaluate(tool, {"pattern": "*"}).behavior == "allow"


# --- MCP server prefixes --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["mcp__srv", "mcp__srv__*"])
def test_an_mcp_server_rule_names_that_servers_tools_only(text: str) -> None:
    rule = PermissionRule.parse(text, "deny")
    assert rule.names_tool(FakeTool("mcp__srv__create")) and rule.covers_whole_tool("mcp__srv__create")
    for other in ("mcp__srv2__create", "mcp__sr__x", "mcp__srv_b__create", "mcp__other__create", "Read"):
        assert not rule.names_tool(FakeTool(other)), other
        assert not rule.covers_whole_tool(other), other


def test_an_mcp_rule_with_a_specifier_does_not_hide_the_tool() -> None:
    assert not PermissionRule.parse("mcp__srv__create(x)", "deny").covers_whole_tool("mcp__srv__create")
    assert PermissionRule.parse("mcp__srv__create", "deny").covers_whole_tool("mcp__srv__create")


# --- rule text and identity -----------------------------------------------------------------------


def test_a_closing_parenthesis_without_an_opening_one_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"'\)' without '\('"):
        parse_rule_text("Bash)")
    assert parse_rule_text("Bash") == ("Bash", None)


def test_only_single_slash_rules_depend_on_their_settings_root(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    rooted = [PermissionRule.parse("Read(/x)", "deny", root=a), PermissionRule.parse("Read(/x)", "deny", root=b)]
    absolute = [PermissionRule.parse("Read(//x)", "deny", root=a), PermissionRule.parse("Read(//x)", "deny", root=b)]
    relative = [PermissionRule.parse("Read(./x)", "deny", root=a), PermissionRule.parse("Read(./x)", "deny", root=b)]
    assert len(dedup_rules(rooted)) == 2
    assert len(dedup_rules(absolute)) == 1 and len(dedup_rules(relative)) == 1


# --- file rules on calls that name no path ---------------------------------------------------------


def test_a_file_rule_neither_allows_nor_denies_a_call_without_a_path(tmp_path: Path) -> None:
    p = policy(tmp_path, allow=["Edit(./src/**)"], deny=["Read(./secret)"])
    assert p.allow_rule_for(EDIT, {}) is None  # nothing named: an allow rule cannot vouch for it
    assert p.allow_rule_for(EDIT, {"file_path": str(tmp_path / "src" / "a.py")}) is not None
    assert p.deny_rule_for(READ, {}) is None
    assert p.deny_rule_for(READ, {"file_path": str(tmp_path / "secret")}) is not None
    rule = PermissionRule.parse("Edit(./src/**)", "allow")
    assert not rule.matches(EDIT, {}, tmp_path)


# --- Bash rules -----------------------------------------------------------------------------------


def test_a_bash_rule_does_not_judge_another_tools_command_field(tmp_path: Path) -> None:
    runner = FakeTool("Runner")
    p = policy(tmp_path, mode="bypassPermissions", deny=["Bash(rm *)"])
    assert p.deny_rule_for(runner, {"command": "rm -rf x"}) is None
    assert not PermissionRule.parse("Bash(rm *)", "deny").matches(runner, {"command": "rm -rf x"}, tmp_path)
    assert p.deny_rule_for(BASH, {"command": "rm -rf x"}) is not None


def test_a_bash_rule_does_not_match_a_call_without_a_command(tmp_path: Path) -> None:
    rule = PermissionRule.parse("Bash(rm *)", "deny")
    for value in (None, 3, ["rm", "-rf"]):
        assert not rule.matches(BASH, {"command": value}, tmp_path)
    assert rule.matches(BASH, {"command": "rm -rf x"}, tmp_path)


# --- a file call's path ---------------------------------------------------------------------------


def test_a_file_call_is_denied_with_the_file_text_whichever_key_names_its_path(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="bypassPermissions", deny=["Read(./secret)"])
    for key in ("file_path", "path", "notebook_path"):
        decision = p.evaluate(READ, {key: str(tmp_path / "secret")})
        assert (decision.behavior, decision.reason) == ("deny", DENIED_FILE), key
    assert p.evaluate(READ, {"file_path": "", "path": str(tmp_path / "secret")}).reason == DENIED_FILE
    assert p.evaluate(READ, {"file_path": str(tmp_path / "open")}).behavior == "allow"


def test_file_path_wins_over_the_other_path_keys(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="acceptEdits")
    inside, outside = str(tmp_path / "a.py"), "/etc/hosts"
    assert p.evaluate(EDIT, {"file_path": inside, "path": outside}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": outside, "path": inside}).behavior == "ask"


def test_a_relative_path_is_read_from_the_working_directory(tmp_path: Path) -> None:
    p = policy(tmp_path, ask=["Read(./secret)"])
    asked = p.rule_decision(READ, {"file_path": "secret"}, "ask")
    assert asked is not None and asked.reason == requested("read", str(tmp_path.resolve() / "secret"))
    assert p.rule_decision(READ, {"file_path": str(tmp_path / "secret")}, "ask") is not None


def test_accept_edits_needs_a_named_file_inside_the_workspace(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="acceptEdits")
    assert p.evaluate(EDIT, {"file_path": str(tmp_path / "a.py")}).behavior == "allow"
    assert p.evaluate(EDIT, {"file_path": "/etc/hosts"}).behavior == "ask"
    assert p.evaluate(EDIT, {}).behavior == "ask"  # no file named: not an edit inside the workspace


def test_a_file_tools_path_may_come_from_its_permission_subject(tmp_path: Path) -> None:
    p = policy(tmp_path, mode="acceptEdits")
    # a file-writing tool whose input names its file under a key of its own (its permission subject)
    target_write = FakeTool("Write", subject_key="target")
    assert p.evaluate(target_write, {"target": str(tmp_path / "a.py")}).behavior == "allow"
    assert p.evaluate(target_write, {"target": "/etc/hosts"}).behavior == "ask"


def test_a_search_is_denied_with_the_read_text_naming_the_path_as_given(tmp_path: Path) -> None:
    (tmp_path / "private").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "private")
    p = policy(tmp_path, mode="bypassPermissions", deny=["Read(./private/**)"])
    for where in (tmp_path / "private", tmp_path / "link"):
        decision = p.evaluate(GREP, {"pattern": "x", "path": str(where)})
        assert (decision.behavior, decision.reason) == ("deny", read_denied(str(where)))


def test_a_subject_that_cannot_be_computed_is_denied_by_any_rule_that_could_apply(tmp_path: Path) -> None:
    # it used to match no rule, so bypassPermissions let the call through (the fail-open of issue 31)
    tool = BrokenSubject("Weird")
    p = policy(tmp_path, mode="bypassPermissions", deny=["Weird(x)"])
    assert str(p.deny_rule_for(tool, {"x": 1})) == "Weird(x)"
    assert p.evaluate(tool, {"x": 1}).behavior == "deny"
    assert policy(tmp_path, mode="bypassPermissions", deny=["Other(x)"]).evaluate(tool, {"x": 1}).behavior == "allow"


# --- Glob patterns --------------------------------------------------------------------------------


def test_a_glob_is_judged_on_its_patterns_fixed_prefix(tmp_path: Path) -> None:
    (tmp_path / "src" / "x").mkdir(parents=True)
    (tmp_path / "src" / "x" / "f").write_text("f")
    p = policy(tmp_path, mode="bypassPermissions", deny=["Read(./src/x/**)"])
    assert p.evaluate(GLOB, {"pattern": "src/x/*"}).behavior == "deny"
    # "src/*/x" lists src/a/x, src/b/x...: its fixed part is src, which is not denied as a whole
    assert p.evaluate(GLOB, {"pattern": "src/*/x"}).behavior == "allow"
    assert p.evaluate(GLOB, {"pattern": "src/x*/f"}).behavior == "allow"


def test_a_globs_wildcards_are_not_read_as_a_file_name(tmp_path: Path) -> None:
    # Glob leaves the denied files out of what it lists; the pattern itself names no file
    (tmp_path / "src").mkdir()
    p = policy(tmp_path, mode="bypassPermissions", deny=["Read(./src/*.env)"])
    assert p.evaluate(GLOB, {"pattern": "src/*.env"}).behavior == "allow"
    assert p.evaluate(READ, {"file_path": str(tmp_path / "src" / "a.env")}).behavior == "deny"


def test_an_absolute_glob_is_judged_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "private").mkdir()
    root = tmp_path.resolve()
    p = policy(tmp_path / "private", mode="bypassPermissions", deny=[f"Read(/{root}/private/**)"])
    assert p.evaluate(GLOB, {"pattern": f"{root}/private/*"}).behavior == "deny"
    # "/*" lists the filesystem's root, not the (denied) working directory
    assert p.evaluate(GLOB, {"pattern": "/*"}).behavior == "allow"
    assert p.evaluate(GLOB, {"pattern": "*"}).behavior == "deny"


# --- WebFetch domains -----------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "hits", "misses"), [
    ("WebFetch(domain:evil.com)", ["https://evil.com/x", "evil.com/x", "http://a.evil.com"],
     ["https://notevil.com", "https://evil.community"]),
    ("WebFetch(domain:*.evil.com)", ["https://a.evil.com/x", "a.b.evil.com"],
     ["https://evil.com", "https://notevil.com", "https://evil.com.example"]),
])
def test_a_domain_rule_meets_its_hosts_only(tmp_path: Path, rule: str, hits: list[str], misses: list[str]) -> None:
    p = policy(tmp_path, mode="bypassPermissions", deny=[rule])
    for url in hits:
        assert str(p.deny_rule_for(FETCH, {"url": url})) == rule, url
    for url in misses:
        assert p.deny_rule_for(FETCH, {"url": url}) is None, url


# --- the check's time budget ----------------------------------------------------------------------


async def test_a_bash_check_that_outlasts_its_budget_denies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from agentfsm.hooks import permissions

    real = permissions.analyse

    def slow(command: str, cwd: str) -> Any:
        time.sleep(0.5)
        return real(command, cwd)

    monkeypatch.setattr(permissions, "CHECK_BUDGET_S", 0.05)
    monkeypatch.setattr(permissions, "analyse", slow)
    p = policy(tmp_path, mode="bypassPermissions", deny=["Bash(rm *)"])  # a rule to check the command against
    decision = await p.decide(BASH, {"command": "ls"})
    assert decision.behavior == "deny" and decision.decided_by == "rule"
    assert decision.reason == "Permission to use Bash has been denied: the command could not be checked within 0.05s."
    monkeypatch.setattr(permissions, "analyse", real)
    assert (await p.decide(BASH, {"command": "ls"})).behavior == "allow"


# --- paths resolved as the kernel resolves them ------------------------------------------------------


def _linked_workspace(tmp_path: Path) -> Path:
    """ws/pub/out -> a directory outside the workspace; ws/pub/lk -> ws/locked/sub."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    for d in (ws / "pub", ws / "locked" / "sub", outside / "sub"):
        d.mkdir(parents=True)
    (ws / "pub" / "out").symlink_to(outside / "sub")
    (ws / "pub" / "lk").symlink_to(ws / "locked" / "sub")
    return ws


def test_accept_edits_judges_a_write_after_a_symlink_and_dotdot_where_it_lands(tmp_path: Path) -> None:
    # `pub/out/../f` is outside/f, not ws/pub/f: acceptEdits may not take it as an edit inside
    ws = _linked_workspace(tmp_path)
    p = policy(ws, mode="acceptEdits")
    assert p.evaluate(BASH, {"command": "touch pub/out/../f"}).behavior == "ask"
    assert p.evaluate(BASH, {"command": "touch pub/f"}).behavior == "allow"


def test_an_edit_rule_holds_through_a_symlink_and_dotdot(tmp_path: Path) -> None:
    ws = _linked_workspace(tmp_path)
    p = policy(ws, mode="bypassPermissions", deny=["Edit(./locked/**)"])
    for command in ("touch pub/lk/../conf.txt", "echo x > pub/lk/../conf.txt", "cp /etc/hostname pub/lk/../c",
                    "rm -f pub/lk/../conf.txt"):
        assert p.evaluate(BASH, {"command": command}).behavior == "deny", command
    assert p.evaluate(BASH, {"command": "touch pub/lk/../../pub/x"}).behavior == "allow"
