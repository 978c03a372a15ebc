"""acceptEdits and Bash: which commands only change files inside the working directories, and the text
that says why any other one needs approval (Claude Code 2.1.332's decisions and words)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.hooks.bash_approval import UNCLASSIFIED, approval_text, edits_inside
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.tools.bash import BashTool
from agentfsm.tools.shell import analyse


def inside(command: str, ws: Path) -> bool:
    return edits_inside(analyse(command, str(ws)), [ws])


def test_file_commands_inside_the_workspace_are_edits(tmp_path: Path) -> None:
    # what Claude Code ran in acceptEdits without asking
    for command in ("echo x > redir.txt", "touch t.txt", "rm -f b.txt", "ls && rm -f c.txt", "mkdir newdir",
                    "mkdir -p x/y/z", "sed -i s/A/B/ a.txt", "cp b.txt b2.txt", "mv b2.txt b3.txt"):
        assert inside(command, tmp_path), command


def test_outside_unknown_or_unfollowed_commands_are_not(tmp_path: Path) -> None:
    out = tmp_path.parent / "elsewhere"
    for command in (f"touch {out}/t", f"rm -f {out}/o.txt", f"cp b.txt {out}/b.txt", "echo x > ../up.txt",
                    "python3 -c \"open('p.txt','w').write('p')\"", "make", "touch $NAME", "eval touch x",
                    "ls", "cat a.txt | grep A", "touch x &", "X=1 touch x", "curl -o f http://x"):
        assert not inside(command, tmp_path), command


def test_a_link_out_of_the_workspace_is_outside(tmp_path: Path) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    (ws / "link").symlink_to(out)
    assert not inside("echo x > link/f.txt", ws)
    assert inside("echo x > f.txt", ws)


def test_the_texts_say_which_path_and_where(tmp_path: Path) -> None:
    out = tmp_path.parent / "elsewhere"
    text = approval_text(analyse("echo x > redir.txt", str(tmp_path)), [tmp_path])
    assert text == (f"Output redirection to '{tmp_path}/redir.txt' needs approval. The path is inside the working "
                    f"directories for this session ('{tmp_path}'), and Claude Code asks before a shell command "
                    "creates, changes or removes files there.")
    text = approval_text(analyse("ls && rm -f c.txt", str(tmp_path)), [tmp_path])
    assert text.startswith(f"rm in '{tmp_path}/c.txt' needs approval. The path is inside")
    text = approval_text(analyse(f"touch {out}/t.txt", str(tmp_path)), [tmp_path])
    assert text == (f"touch in '{out}/t.txt' needs approval. The path is outside the working directories for this "
                    f"session ('{tmp_path}'). Allowing runs the command as written.")
    assert approval_text(analyse("python3 -c 'print(1)'", str(tmp_path)), [tmp_path]) == UNCLASSIFIED


def test_accept_edits_policy_runs_edits_inside_and_asks_for_the_rest(tmp_path: Path) -> None:
    bash = BashTool()
    policy = PermissionPolicy.build(tmp_path, mode="acceptEdits", deny=["Bash(rm *)"])
    assert policy.evaluate(bash, {"command": "touch a.txt"}).behavior == "allow"
    assert policy.evaluate(bash, {"command": "rm -f a.txt"}).behavior == "deny"  # a deny rule still wins
    assert policy.evaluate(bash, {"command": "touch /etc/x"}).behavior == "ask"
    default = PermissionPolicy.build(tmp_path)
    assert default.evaluate(bash, {"command": "touch a.txt"}).behavior == "ask"


@given(st.lists(st.sampled_from(["touch", "rm", "x", "$(id)", ">", "../a", "/etc/p", "&&", ";", "|", "`w`",
                                 "bash", "-c", "'rm y'", "a.txt", "*", "$V", "&"]), min_size=1, max_size=6))
def test_an_edit_inside_never_names_a_path_outside_or_one_it_cannot_see(words: list[str]) -> None:
    ws = Path("/nonexistent-ws")
    analysis = analyse(" ".join(words), str(ws))
    if edits_inside(analysis, [ws]):
        assert not analysis.opaque and all(p.path is not None for p in analysis.paths)
        assert all(p.path.startswith(str(ws) + "/") or p.path == str(ws) for p in analysis.paths
                   if p.access == "write")


@pytest.mark.parametrize("command", [
    "timeout -vs KILL 5 rm x", "timeout -s KILL 5 rm x", "timeout --signal=KILL 5 rm x", "nice -n 5 rm x",
    "stdbuf -oL rm x", "stdbuf -eo L rm x", "ionice -c2 -n7 rm x", "env -i A=1 rm x",
    "env BASH_FUNC_rm%%='() { :; }' rm x", "env 'A-B=1' rm x", "env BASH_FUNC_ls%%='() { rm x; }' ls",
    "BASH_FUNC_ls%%='() { rm x; }' ls",
])
def test_a_deny_rule_holds_through_wrappers_whatever_their_options(tmp_path: Path, command: str) -> None:
    """A wrapper's options — a cluster ending in one that takes a value (``-vs KILL``), a value
    attached (``-oL``) or apart — never hide the command it runs from a ``Bash(rm:*)`` deny rule, and
    an exported function (``BASH_FUNC_name%%``) that could run anything is not let through either."""
    policy = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=["Bash(rm:*)"])
    assert policy.evaluate(BashTool(), {"command": command}).behavior != "allow", command


def test_find_deletes_wherever_its_delete_action_stands(tmp_path: Path) -> None:
    """``-delete`` followed by other actions (``-delete -print``) still deletes: an Edit deny rule over
    the directory holds, and acceptEdits asks before it deletes outside the workspace."""
    bash = BashTool()
    deny = PermissionPolicy.build(tmp_path, mode="bypassPermissions", deny=["Edit(./d/**)"])
    for command in ("find d -delete", "find d -name x -delete -print", "find d -delete -print -quit"):
        assert deny.evaluate(bash, {"command": command}).behavior == "deny", command
    assert deny.evaluate(bash, {"command": "find d -name x -print"}).behavior == "allow"
    out = tmp_path.parent / "elsewhere"
    accept = PermissionPolicy.build(tmp_path, mode="acceptEdits")
    assert accept.evaluate(bash, {"command": f"find {out} -name x -delete -print"}).behavior == "ask"
