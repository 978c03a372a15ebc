"""Properties of the permission system over random rules, modes, hook answers, callbacks and inputs.

The central one (docs/behaviour.md §5): a call that matches a deny rule is never allowed — in any mode,
``bypassPermissions`` included, whatever a hook or the ``can_use_tool`` callback says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.common.modes import PERMISSION_MODES
from agentfsm.hooks.gate import HookGate
from agentfsm.hooks.permissions import (
    PermissionAllow,
    PermissionDeny,
    PermissionPolicy,
    PermissionRule,
    ToolPermissionContext,
)
from agentfsm.runtime.ports import PreToolOutcome
from agentfsm.tools.base import Tool

CWD = Path("/nonexistent-agentfsm/proj")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class FakeTool(Tool):
    def __init__(self, name: str, read_only: bool) -> None:
        self.name = name
        self._read_only = read_only

    def is_read_only(self, input: Mapping[str, Any]) -> bool:
        return self._read_only


TOOLS = {
    "Bash": FakeTool("Bash", False), "Read": FakeTool("Read", True), "Grep": FakeTool("Grep", True),
    "Glob": FakeTool("Glob", True), "Write": FakeTool("Write", False), "Edit": FakeTool("Edit", False),
    "WebFetch": FakeTool("WebFetch", True), "Other": FakeTool("Other", False),
}

BASH_SPECS = ["rm *", "rm:*", "rm -rf *", "git push *", "git push:*", "ls*", "ls *", "*", "curl *",
              "npm test", "echo *", "* --force", "sudo *", "x"]
PATH_SPECS = ["src/**", "./.env", ".env", "*.pem", "//etc/**", "~/x/**", "/build/**", "docs", "**", "src/*",
              "../**", "//nonexistent-agentfsm/**"]
RULE_TEXTS = st.one_of(
    st.sampled_from(list(TOOLS)),
    st.builds(lambda s: f"Bash({s})", st.sampled_from(BASH_SPECS)),
    st.builds(lambda t, s: f"{t}({s})", st.sampled_from(["Read", "Edit", "Write", "Grep", "Glob"]),
              st.sampled_from(PATH_SPECS)),
    st.sampled_from(["WebFetch(domain:evil.com)", "Other(a*)"]),
    st.builds(lambda s: f"Bash({s})", st.text(alphabet="rm -*:/|;", min_size=1, max_size=8)
              .filter(lambda s: "(" not in s and ")" not in s)),
)

FRAGMENTS = ["rm -rf /", "ls", "ls -la", "git push origin main", "git push --force", "echo hi", "FOO=1 rm x",
             "sudo rm -rf x", "$(rm x)", "`rm y`", "npm test", "curl a", "'a;b'", "\"rm -rf /\"",
             "bash -c 'rm z'", "/bin/rm q", "x", "lsof"]
OPS = [" && ", " || ", "; ", " | ", " & ", "\n", " "]


@st.composite
def bash_commands(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=4))
    out = parts[0]
    for p in parts[1:]:
        out += draw(st.sampled_from(OPS)) + p
    return out


PATHS = st.sampled_from(["src/a.py", ".env", "sub/.env", "k.pem", "/etc/passwd", "docs/x", "build/y", "../o",
                         "~/x/y", "/nonexistent-agentfsm/proj/src/b.py", "src/../../z", "./docs"])


@st.composite
def calls(draw: st.DrawFn) -> tuple[Tool, dict[str, Any]]:
    name = draw(st.sampled_from(list(TOOLS)))
    if name == "Bash":
        inp: dict[str, Any] = {"command": draw(bash_commands())}
    elif name in ("Read", "Write", "Edit"):
        inp = {"file_path": draw(PATHS)}
    elif name in ("Grep", "Glob"):
        inp = {"pattern": draw(st.sampled_from(["x", "**/*.py", "/etc/*", "src/*"]))}
        if draw(st.booleans()):
            inp["path"] = draw(PATHS)
    elif name == "WebFetch":
        inp = {"url": draw(st.sampled_from(["https://evil.com/a", "https://ok.org", "http://x.evil.com"]))}
    else:
        inp = {"command": draw(st.sampled_from(["abc", "zzz"]))}
    return TOOLS[name], inp


RULE_LISTS = st.lists(RULE_TEXTS, max_size=4)
HOOK_DECISIONS = st.sampled_from([None, "allow", "deny", "ask", "defer"])


def callback(kind: str, replacement: dict[str, Any] | None) -> Any:
    if kind == "none":
        return None

    async def cb(name: str, inp: Mapping[str, Any], ctx: ToolPermissionContext) -> Any:
        if kind == "deny":
            return PermissionDeny("no")
        if kind == "rewrite":
            return PermissionAllow(updated_input=replacement)
        return PermissionAllow()

    return cb


def deny_hits(policy: PermissionPolicy, tool: Tool, inp: Mapping[str, Any]) -> bool:
    return any(r.matches(tool, inp, policy.cwd) for r in policy.deny)


@SETTINGS
@given(allow=RULE_LISTS, ask=RULE_LISTS, deny=RULE_LISTS, mode=st.sampled_from([*PERMISSION_MODES, "manual"]),
       call=calls(), hook=HOOK_DECISIONS, cb_kind=st.sampled_from(["none", "allow", "deny", "rewrite"]),
       replacement=calls())
def test_a_call_matching_a_deny_rule_is_never_allowed(allow: list[str], ask: list[str], deny: list[str],
                                                      mode: str, call: tuple[Tool, dict[str, Any]],
                                                      hook: str | None, cb_kind: str,
                                                      replacement: tuple[Tool, dict[str, Any]]) -> None:
    tool, inp = call
    policy = PermissionPolicy.build(CWD, mode=mode, allow=allow, ask=ask, deny=deny)
    decision = asyncio.run(policy.decide(tool, inp, hook_decision=hook,
                                         can_use_tool=callback(cb_kind, replacement[1])))
    assert decision.behavior in ("allow", "deny")
    if deny_hits(policy, tool, inp):
        assert decision.behavior == "deny"
        assert decision.rule is not None and decision.rule.behavior == "deny"
    if decision.behavior == "allow" and decision.updated_input is not None:
        assert not deny_hits(policy, tool, decision.updated_input)
    if hook == "deny":
        assert decision.behavior == "deny"


@SETTINGS
@given(deny=RULE_LISTS, allow=RULE_LISTS, mode=st.sampled_from(PERMISSION_MODES), call=calls(),
       rewritten=calls(), hook=HOOK_DECISIONS)
def test_the_gate_keeps_deny_rules_for_original_and_rewritten_input(
        deny: list[str], allow: list[str], mode: str, call: tuple[Tool, dict[str, Any]],
        rewritten: tuple[Tool, dict[str, Any]], hook: str | None) -> None:
    tool, inp = call
    updated = rewritten[1] if rewritten[0] is tool else None
    gate = HookGate(CWD, policy=PermissionPolicy.build(CWD, mode=mode, deny=deny, allow=allow),
                    can_use_tool=lambda n, i, c: True)
    pre = PreToolOutcome(decision=hook, updated_input=updated)  # type: ignore[arg-type]
    outcome = asyncio.run(gate.permission(tool, inp, pre))
    if deny_hits(gate.policy, tool, inp) or (updated is not None and deny_hits(gate.policy, tool, updated)):
        assert outcome.behavior == "deny"


@SETTINGS
@given(call=calls(), hook=st.sampled_from([None, "allow"]))
def test_bypass_without_deny_or_ask_rules_allows_everything(call: tuple[Tool, dict[str, Any]],
                                                            hook: str | None) -> None:
    tool, inp = call
    policy = PermissionPolicy.build(CWD, mode="bypassPermissions")
    assert asyncio.run(policy.decide(tool, inp, hook_decision=hook)).behavior == "allow"


@SETTINGS
@given(deny=RULE_LISTS, mode=st.sampled_from(PERMISSION_MODES), call=calls())
def test_a_hidden_tool_is_always_denied(deny: list[str], mode: str,
                                        call: tuple[Tool, dict[str, Any]]) -> None:
    tool, inp = call
    policy = PermissionPolicy.build(CWD, mode=mode, deny=deny, allow=[tool.name])
    if tool.name not in policy.visible_tools([tool.name]):
        assert policy.evaluate(tool, inp, hook_decision="allow").behavior == "deny"


@SETTINGS
@given(RULE_TEXTS)
def test_rules_print_as_they_parse(text: str) -> None:
    rule = PermissionRule.parse(text, "deny")
    assert PermissionRule.parse(str(rule), "deny") == rule
