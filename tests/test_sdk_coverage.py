"""The SDK protocol coverage table (fsm/data/sdk_coverage.toml) against the installed claude-agent-sdk:
every entry the SDK declares has a known status, and docs/sdk.md is the table's rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("claude_agent_sdk")

from agentfsm.commandline import sdk_coverage as cov

DOC = Path(__file__).parents[1] / "docs" / "sdk.md"


def test_every_entry_of_the_installed_sdk_has_a_known_status() -> None:
    assert cov.check(cov.sdk_entries(), cov.load_table()) == []


def test_the_walk_reaches_every_kind_of_entry() -> None:
    keys = {e.key for e in cov.sdk_entries()}
    # one of each group, read from the SDK's own declarations (a walk that found nothing would pass the check)
    assert {"options.can_use_tool", "options.add_dirs", "control.can_use_tool.tool_use_id", "control.interrupt",
            "control.set_model", "message.ResultMessage.num_turns", "message.TaskStartedMessage",
            "block.ToolUseBlock.input", "hook.StopHookInput.background_tasks", "hook.PreToolUseHookInput.prompt_id",
            "permission.PermissionResultAllow.updated_permissions"} <= keys
    # control subtypes the SDK sends without typing them (set_model, mcp_status) are found in its Query
    assert {k for k in keys if k.count(".") == 1 and k.startswith("control.")} >= {
        "control.mcp_status", "control.get_context_usage", "control.set_model", "control.initialize"}


def test_a_new_sdk_entry_or_an_unknown_status_fails_the_check() -> None:
    entries = [*cov.sdk_entries(), cov.Entry("options.brand_new_option", "options")]
    table = cov.load_table()
    assert cov.check(entries, table) == ["options.brand_new_option: in the installed SDK, not in the table"]
    table = {**table, "options.brand_new_option": cov.Status("unknown")}
    assert cov.check(entries, table) == [
        "options.brand_new_option: status 'unknown' is not one of identical, sdk-only, different, refused, gap"]
    table["options.brand_new_option"] = cov.Status("gap")
    assert cov.check(entries, table) == ["options.brand_new_option: status 'gap' needs a note saying why or what "
                                         "is missing"]
    stale = {**cov.load_table(), "options.gone": cov.Status("identical")}
    assert cov.check(cov.sdk_entries(), stale) == ["options.gone: in the table, not in the installed SDK"]


def test_a_malformed_value_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="expected a status or"):
        cov.load_table('[options]\ntools = ["gap"]\n')
    assert cov.load_table('[control.interrupt]\n_ = "identical"\n') == {"control.interrupt": cov.Status("identical")}


def test_docs_sdk_md_is_the_rendering_of_the_table() -> None:
    doc = DOC.read_text(encoding="utf-8")
    rendered = cov.render(cov.sdk_entries(), cov.load_table(), cov.sdk_version())
    assert cov.splice(doc, rendered) == doc, "docs/sdk.md is stale: run python -m agentfsm.commandline.sdk_coverage"
