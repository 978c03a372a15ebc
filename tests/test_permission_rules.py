"""Which rule a call meets, by kind of rule: the paths of file tools (and the access they are judged
for), a Bash command's file writes under Edit rules, domains, a tool's own subject, aliases — and the
rule each query hands back. Each property names both sides: the call the rule meets and the one it
does not."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.hooks.config import PermissionSettings, Settings
from agentfsm.hooks.permissions import PermissionPolicy, PermissionRule
from agentfsm.tools.base import Tool

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class FakeTool(Tool):
    def __init__(self, name: str, aliases: tuple[str, ...] = (), subject_key: str | None = None) -> None:
        self.name = name
        self.aliases = aliases
        self._key = subject_key

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        return False

    def permission_subject(self, input: Mapping[str, Any]) -> str | None:
        if self._key is None:
            return super().permission_subject(input)
        value = input.get(self._key)
        return value if isinstance(value, str) else None


READ, WRITE, EDIT, GREP = FakeTool("Read"), FakeTool("Write"), FakeTool("Edit"), FakeTool("Grep")
BASH = FakeTool("Bash")
names = st.sampled_from(["notes.txt", "secret.env", "a.py", "data.json"])


@SETTINGS
@given(denied=names, asked=names, rule_kind=st.sampled_from(["deny", "ask"]))
def test_each_query_hands_back_the_rule_that_applies_and_none_otherwise(tmp_path: Path, denied: str, asked: str,
                                                                        rule_kind: str) -> None:
    rule = f"Read(./{denied})"
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions", **{rule_kind: [rule]})
    query = p.deny_rule_for if rule_kind == "deny" else p.ask_rule_for
    other = p.ask_rule_for if rule_kind == "deny" else p.deny_rule_for
    hit = query(READ, {"file_path": str(tmp_path / asked)})
    assert (str(hit) if hit is not None else None) == (rule if asked == denied else None)
    assert other(READ, {"file_path": str(tmp_path / asked)}) is None


@SETTINGS
@given(denied=names, asked=names, tool=st.sampled_from([READ, WRITE, EDIT]))
def test_a_denied_file_is_denied_for_the_access_the_tool_wants(tmp_path: Path, denied: str, asked: str,
                                                               tool: FakeTool) -> None:
    """A Read rule says a read is denied, an Edit rule a write, each only for its own file."""
    family = "Read" if tool is READ else "Edit"
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=[f"{family}(./{denied})"])
    link = tmp_path / f"link-to-{denied}"
    if not link.is_symlink():
        link.symlink_to(tmp_path / denied)
    decision = p.rule_decision(tool, {"file_path": str(link)}, "deny")
    assert decision is not None
    # through a link, the text names the access: reading for Read, writing for Write and Edit
    assert ("read" in decision.reason.lower()) == (tool is READ), decision.reason
    assert ("writ" in decision.reason.lower()) == (tool is not READ), decision.reason
    straight = p.rule_decision(tool, {"file_path": str(tmp_path / asked)}, "deny")
    assert (straight is not None) == (asked == denied)


@SETTINGS
@given(denied=names, written=names, how=st.sampled_from(["echo x > {}", "cp /dev/null {}", "touch {}"]))
def test_a_command_that_writes_a_file_answers_to_the_edit_rules(tmp_path: Path, denied: str, written: str,
                                                                how: str) -> None:
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=[f"Edit(./{denied})"])
    decision = p.evaluate(BASH, {"command": how.format(written)})
    assert (decision.behavior == "deny") == (written == denied), decision


@SETTINGS
@given(subject=st.sampled_from(["example.com", "domain:example.com", "domain:other.org"]),
       url=st.sampled_from([None, "https://example.com/x", "https://other.org/"]))
def test_domain_rules_read_a_url_only_for_webfetch(tmp_path: Path, subject: str, url: str | None) -> None:
    """`domain:` is WebFetch's syntax; for any other tool the specifier is a pattern of its subject."""
    lookup = FakeTool("Lookup", subject_key="q")
    rule = PermissionRule.parse("Lookup(domain:*)", "deny")
    assert rule.matches(lookup, {"q": subject, "url": url}, tmp_path) == subject.startswith("domain:")
    fetch = PermissionRule.parse("WebFetch(domain:example.com)", "deny")
    assert fetch.matches(FakeTool("WebFetch"), {"url": url}, tmp_path) == (url == "https://example.com/x")


@SETTINGS
@given(kind=st.sampled_from(["Explore", "general-purpose"]), name=st.sampled_from(["Agent", "Task", "Deploy"]))
def test_only_a_subagent_call_is_judged_by_its_subagent_type(tmp_path: Path, kind: str, name: str) -> None:
    tool = FakeTool(name, subject_key="target")
    rule = PermissionRule.parse(f"{name}(Explore)", "deny")
    call = {"subagent_type": kind, "target": "prod"}
    assert rule.matches(tool, call, tmp_path) == (name != "Deploy" and kind == "Explore")
    assert PermissionRule.parse(f"{name}(prod)", "deny").matches(tool, call, tmp_path) == (name == "Deploy")


@pytest.mark.parametrize("command", ["rm -rf build", "ls && rm -rf build"])
def test_a_tool_known_as_bash_is_judged_on_its_command(tmp_path: Path, command: str) -> None:
    """A shell tool reached through the alias Bash: a rule naming it reads the command, not a pattern
    of the text (so `rm *` meets `rm -rf build` inside a compound command too)."""
    shell = FakeTool("Shell", aliases=("Bash",))
    assert PermissionRule.parse("Shell(rm *)", "deny").matches(shell, {"command": command}, tmp_path)
    assert not PermissionRule.parse("Shell(rm *)", "deny").matches(shell, {"command": "ls build"}, tmp_path)


def test_bypass_mode_disabled_by_settings_cannot_be_chosen(tmp_path: Path) -> None:
    off = Settings(permissions=PermissionSettings(disable_bypass_mode=True))
    with pytest.raises(ValueError, match="bypassPermissions is disabled"):
        PermissionPolicy.from_settings(off, tmp_path, mode="bypassPermissions")
    assert PermissionPolicy.from_settings(off, tmp_path, mode="acceptEdits").mode == "acceptEdits"
    on = Settings(permissions=PermissionSettings())
    assert PermissionPolicy.from_settings(on, tmp_path, mode="bypassPermissions").mode == "bypassPermissions"


@SETTINGS
@given(denied=names, asked=names)
def test_a_notebook_is_judged_by_its_notebook_path_and_a_search_without_a_path_by_the_cwd(
        tmp_path: Path, denied: str, asked: str) -> None:
    rule = PermissionRule.parse(f"Read(./{denied})", "deny")
    assert rule.matches(FakeTool("NotebookRead"), {"notebook_path": asked}, tmp_path) == (asked == denied)
    # a Grep without a path searches the working directory, whatever its pattern says
    assert not rule.matches(GREP, {"pattern": asked}, tmp_path)
    assert rule.matches(GREP, {"pattern": "x", "path": asked}, tmp_path) == (asked == denied)


@pytest.mark.parametrize(("allow", "command", "reported"), [
    (["Bash(ls)", "Bash(git status)"], "git status && ls", "Bash(git status)"),  # the first part's rule
    (["Bash(ls)", "Bash(git status)"], "ls && git status", "Bash(ls)"),
    (["Bash(git status)", "Bash(git status && make)"], "git status && make", "Bash(git status && make)"),  # exact
])
def test_the_allow_rule_reported_is_the_one_for_the_first_part_or_the_exact_command(
        tmp_path: Path, allow: list[str], command: str, reported: str) -> None:
    p = PermissionPolicy.build(tmp_path, allow=allow)
    assert str(p.allow_rule_for(BASH, {"command": command})) == reported


@SETTINGS
@given(denied=names, written=names)
def test_a_command_writing_a_file_does_not_answer_to_the_read_rules(tmp_path: Path, denied: str, written: str) -> None:
    """Writes answer to Edit rules only; a read of the same file answers to the Read rules."""
    p = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=[f"Read(./{denied})", "Bash(curl *)"])
    assert p.evaluate(BASH, {"command": f"echo x > {written}"}).behavior == "allow"
    assert (p.evaluate(BASH, {"command": f"cat {written}"}).behavior == "deny") == (written == denied)


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_rule_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="empty permission rule"):
        PermissionRule.parse(text, "deny")


@pytest.mark.parametrize(("answer", "allowed"), [
    ({"behavior": "allow"}, True), ({"behavior": "deny", "message": "no"}, False), (True, True), (False, False)])
def test_a_callback_answer_is_read_as_it_says(answer: object, allowed: bool) -> None:
    from agentfsm.hooks.permissions import PermissionAllow, PermissionDeny, _coerce_answer

    got = _coerce_answer(answer)
    assert isinstance(got, PermissionAllow if allowed else PermissionDeny)
    with pytest.raises(TypeError):
        _coerce_answer({"behavior": "maybe"})


@SETTINGS
@given(denied=names, asked=names)
def test_the_file_access_policy_denies_reads_by_read_rules_and_writes_by_edit_rules(
        tmp_path: Path, denied: str, asked: str) -> None:
    p = PermissionPolicy.build(tmp_path, deny=[f"Read(./{denied})", "Bash(rm *)", "WebFetch"])
    access = p.file_access()
    assert (access.denial(str(tmp_path / asked), "read") is not None) == (asked == denied)
    assert access.denial(str(tmp_path / asked), "write") is None
    q = PermissionPolicy.build(tmp_path, deny=[f"Edit(./{denied})", "Read"])
    assert (q.file_access().denial(str(tmp_path / asked), "write") is not None) == (asked == denied)
