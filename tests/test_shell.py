"""shell: the one scanner of command lines, shared by the permission rules and Bash's read-only
classifier."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfsm.tools.bash import is_read_only_command
from agentfsm.tools.shell import command_variants, scan, split_compound_command, split_words


def test_split_and_variants() -> None:
    parts, ok = split_compound_command("a && b || c; d | e & f\ng $(h) `i` <(j)")
    assert ok and parts == ["a", "b", "c", "d", "e", "f", "h", "i", "j", "g $(h) `i` <(j)"]
    redirections = split_compound_command("echo hi 2>&1 | tee x &>/dev/null")
    assert redirections == (["echo hi 2>&1", "tee x &>/dev/null"], True)
    assert split_compound_command("echo 'a")[1] is False
    assert split_compound_command("echo $(ls")[1] is False
    assert "rm -rf /" in command_variants("A=1 B=2 sudo -u root /usr/bin/rm -rf /")


def test_variants_reach_into_shells_and_eval() -> None:
    assert "rm -rf /" in command_variants("bash -c 'ls && rm -rf /'")
    assert "rm x" in command_variants("eval rm x")
    assert "rm -rf /" in command_variants("timeout -s KILL 5 nice -n 3 env -u X rm -rf /")


@pytest.mark.parametrize(("command", "syntax"), [
    ("ls -la", set()),
    ("a && b || c; d | e & f\ng", {"&&", "||", ";", "|", "&", "\n"}),
    ("a |& b ;; c", {"|&", ";;"}),
    ("echo $(ls) `pwd` <(x) >(y)", {"$(", "`", "<(", ">("}),
    ('echo "$(ls)"', {"$("}),  # substitutions run inside double quotes
    ("echo '$(ls) && x | y > z'", set()),  # and nothing does inside single quotes
    ("(cd x; ls)", {"(", ";"}),
    ("ls ()(rm x)", {"(", ")"}),  # a function definition
    ("cat <in >out 2>&1", {"<", ">"}),
    ("cat &>log", {">"}),
])
def test_scan_reports_the_syntax_outside_quotes(command: str, syntax: set[str]) -> None:
    assert set(scan(command).syntax) == syntax


def test_split_words() -> None:
    assert split_words("grep -e 'a b' \"c\"d #x") == ["grep", "-e", "a b", "cd", "#x"]
    assert split_words("echo 'open") is None


# --- the read-only classifier splits with the same scanner ----------------------------------------


@pytest.mark.parametrize(("command", "read_only"), [
    ("ls 'a\nb'", True),  # a newline inside quotes is part of a word, not a second command
    ("ls \\\n  -la", True),  # a line continuation
    ("ls ()(rm -rf x)\nls", False),  # defines `ls` as a function that deletes, then calls it
    ("echo ';'", False),  # an operator in quotes is refused rather than told apart
    ("grep -E '(a|b)' f", True),  # but quoted text that merely contains operator characters is fine
    ("ls\rrm x", False),  # bash does not split words at a carriage return
    ("cat < in", False), ("cat <<EOF", False), ("(ls)", False), ("sleep 1 &", False), ("ls |& cat", False),
])
def test_classifier_uses_the_scanner(command: str, read_only: bool) -> None:
    assert is_read_only_command(command) is read_only


SAFE = ["ls", "cat a", "git status", "grep -n x .", "wc -l", "echo 'a b'", "rg 'x|y'", "pwd"]
UNSAFE = ["rm -rf x", "git push", "python -c 1", "sh -c ls", "FOO=1 ls", "(ls)", "ls &", "cat <x"]
SEPARATORS = [" && ", " || ", "; ", " | ", "\n"]


@given(parts=st.lists(st.sampled_from(SAFE + UNSAFE), min_size=1, max_size=4),
       seps=st.lists(st.sampled_from(SEPARATORS), min_size=3, max_size=3))
def test_a_read_only_command_is_read_only_part_by_part(parts: list[str], seps: list[str]) -> None:
    command = parts[0]
    for sep, part in zip(seps, parts[1:], strict=False):
        command += sep + part
    verdict = is_read_only_command(command)
    assert verdict is all(p in SAFE for p in parts)
    if verdict:
        # what the classifier vouched for is exactly what the permission rules see
        split, ok = split_compound_command(command)
        assert ok and split == parts
