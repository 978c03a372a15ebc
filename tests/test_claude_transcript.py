"""agentfsm.claude_transcript: the Claude Code-layout transcript the Agent SDK's session helpers read."""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agentfsm.sessions.claude_transcript import ClaudeTranscript, project_name, transcript_path

sessions = pytest.importorskip("claude_agent_sdk._internal.sessions")


@given(st.text(min_size=1, max_size=400))
# the cap's boundary (a name of exactly 200 characters keeps no suffix; 201 gets one) and long names whose
# 32-bit hash is negative and positive (the suffix is the hash's absolute value, signed as Claude Code's)
@example("a" * 199)
@example("c" * 200)
@example("a" * 250)
@example("b" * 300)
def test_the_directory_name_is_the_one_the_sdk_computes(name: str) -> None:
    path = "/" + name.replace("\x00", "")
    assert project_name(path) == sessions._sanitize_path(unicodedata.normalize("NFC", os.path.realpath(path)))


def test_the_path_follows_claude_config_dir(tmp_path: Path) -> None:
    got = transcript_path(tmp_path / "ws", "abc", {"CLAUDE_CONFIG_DIR": str(tmp_path / "cfg")})
    assert got == tmp_path / "cfg" / "projects" / project_name(tmp_path / "ws") / "abc.jsonl"


def test_entries_chain_and_a_compaction_starts_a_new_chain(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    t = ClaudeTranscript(path, session_id="s1", cwd="/w", version="2.1.332")
    t.message("user", [{"type": "text", "text": "hi"}], "u1")
    t.message("assistant", [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "t", "name": "Read",
                                                            "input": {}}], "a1")
    t.message("user", [{"type": "text", "text": "reminder"}], "m1", kind="meta")
    t.compact_boundary("auto", 100)
    t.message("user", [{"type": "text", "text": "summary"}], "c1", kind="compact_summary")
    t.close()
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["type"] for e in entries] == ["user", "assistant", "assistant", "user", "system", "user"]
    assert [e["parentUuid"] for e in entries[:4]] == [None, "u1", "a1", entries[2]["uuid"]]
    assert entries[1]["message"]["id"] == entries[2]["message"]["id"]  # one message, a block per entry
    assert entries[3]["isMeta"] is True and entries[5]["isCompactSummary"] is True
    assert entries[4]["parentUuid"] is None and entries[4]["logicalParentUuid"] == "m1"
    assert entries[5]["parentUuid"] == entries[4]["uuid"]
    assert all(e["sessionId"] == "s1" and e["cwd"] == "/w" for e in entries)
    # reopened (a resumed session), it goes on from the last entry
    again = ClaudeTranscript(path, session_id="s1", cwd="/w", version="2.1.332")
    again.message("user", [{"type": "text", "text": "more"}], "u2")
    again.close()
    assert json.loads(path.read_text().splitlines()[-1])["parentUuid"] == "c1"
    chain = sessions._build_conversation_chain(sessions._parse_transcript_entries(path.read_text()))
    # the SDK's reader follows the new chain only: the boundary, the summary, what came after
    assert [e["type"] for e in chain] == ["system", "user", "user"] and [e["uuid"] for e in chain][1:] == ["c1", "u2"]


def test_an_unwritable_directory_turns_the_mirror_off(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    t = ClaudeTranscript(blocker / "sub" / "t.jsonl", session_id="s", cwd="/w", version="v")
    t.message("user", [{"type": "text", "text": "hi"}], "u")  # logged, not raised
    t.close()
