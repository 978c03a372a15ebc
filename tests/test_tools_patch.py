"""The structured patch SDK users receive for Write and Edit (agentfsm.tools.patch)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentfsm.tools.patch import NO_NEWLINE, structured_patch

texts = st.lists(st.sampled_from(["a", "b", "c", "", "x y"]), max_size=12).map("\n".join) | st.lists(
    st.sampled_from(["a\n", "b\n", "c", "\n"]), max_size=12).map("".join)


def apply(old: str, hunks: list[dict[str, Any]]) -> str:
    """Apply hunks the way a patch tool does: context and removals must match the old lines."""
    lines = old.splitlines(keepends=True)
    out: list[str] = []
    at = 0
    for hunk in hunks:
        start = hunk["oldStart"] - 1 if hunk["oldLines"] else hunk["oldStart"]
        out += lines[at:start]
        at = start
        body = hunk["lines"]
        for i, line in enumerate(body):
            if line == NO_NEWLINE:
                continue
            ends = "" if i + 1 < len(body) and body[i + 1] == NO_NEWLINE else "\n"
            tag, text = line[0], line[1:] + ends
            if tag in " -":
                assert lines[at].rstrip("\r\n") + ("\n" if lines[at].endswith("\n") else "") == text
                at += 1
            if tag in " +":
                out.append(text)
        assert sum(1 for line in body if line[:1] in " -") == hunk["oldLines"]
        assert sum(1 for line in body if line[:1] in " +") == hunk["newLines"]
    return "".join(out + lines[at:])


@given(texts, texts)
def test_the_patch_turns_the_old_text_into_the_new(old: str, new: str) -> None:
    hunks = structured_patch(old, new)
    assert apply(old, hunks) == new
    assert (hunks == []) == (old == new)


def test_hunks_keep_three_lines_of_context_as_claude_code() -> None:
    # recorded from Claude Code 2.1.332 (tests/test_sdk_dropin.py)
    assert structured_patch("ALPHA\n", "ALPHA\nMORE\n") == [
        {"oldStart": 1, "oldLines": 1, "newStart": 1, "newLines": 2, "lines": [" ALPHA", "+MORE"]}]
    old = "".join(f"l{i}\n" for i in range(1, 21))
    [hunk] = structured_patch(old, old.replace("l10\n", "L10\n"))
    assert hunk == {"oldStart": 7, "oldLines": 7, "newStart": 7, "newLines": 7,
                    "lines": [" l7", " l8", " l9", "-l10", "+L10", " l11", " l12", " l13"]}


def test_a_lost_final_newline_is_shown() -> None:
    assert structured_patch("a\nb\n", "a\nb") == [
        {"oldStart": 1, "oldLines": 2, "newStart": 1, "newLines": 2, "lines": [" a", "-b", "+b", NO_NEWLINE]}]


def test_a_hunk_with_no_old_lines_starts_at_line_zero_as_unified_diff_says() -> None:
    """Writing into an empty file: ``@@ -0,0 +1,2 @@`` (diff -u's header), not ``-1,0``; emptying a
    file is the mirror image, ``@@ -1,2 +0,0 @@``."""
    assert structured_patch("", "a\nb\n") == [
        {"oldStart": 0, "oldLines": 0, "newStart": 1, "newLines": 2, "lines": ["+a", "+b"]}]
    assert structured_patch("a\nb\n", "") == [
        {"oldStart": 1, "oldLines": 2, "newStart": 0, "newLines": 0, "lines": ["-a", "-b"]}]
    assert structured_patch("a\n", "a\nb\n")[0]["oldStart"] == 1  # with context, the context's first line


def test_a_change_in_a_long_file_of_repeated_lines_is_shown_with_its_context_not_the_rest() -> None:
    """No line is treated as junk for being frequent (difflib's autojunk would, in a file of 200 lines
    or more): one changed line of 400 identical ones makes a patch of a few lines, not of the file's
    second half."""
    old = "0\n" * 400
    new = "0\n" * 200 + "1\n" + "0\n" * 199
    hunks = structured_patch(old, new)
    assert sum(len(h["lines"]) for h in hunks) <= 2 * (2 * 3 + 2)
    assert any("+1" in h["lines"] for h in hunks)
