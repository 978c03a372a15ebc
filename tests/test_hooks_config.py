"""Settings: sources, precedence, merging, and clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentfsm.hooks.config import SettingsError, load_settings, parse_settings, settings_files
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.hooks.runner import CommandHook


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def hook(cmd: str, matcher: str | None = None, event: str = "PreToolUse", **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"hooks": [{"type": "command", "command": cmd, **extra}]}
    if matcher is not None:
        entry["matcher"] = matcher
    return {"hooks": {event: [entry]}}


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    home, cwd = tmp_path / "home", tmp_path / "proj"
    home.mkdir()
    cwd.mkdir()
    return home, cwd


def commands(settings: Any, event: str = "PreToolUse") -> list[str]:
    return [h.command for m in settings.hooks.get(event, ()) for h in m.hooks]


def test_no_files_no_settings(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    s = load_settings(cwd, home=home)
    assert s.hooks == {} and s.sources == () and s.permissions.default_mode is None


def test_precedence_user_project_local_flag(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    u = write(home / ".claude/settings.json",
              {**hook("user"), "permissions": {"defaultMode": "plan", "allow": ["Read"]},
               "env": {"A": "u", "B": "u"}})
    p = write(cwd / ".claude/settings.json",
              {**hook("project"), "permissions": {"defaultMode": "acceptEdits", "deny": ["Bash(rm:*)"]},
               "env": {"B": "p"}})
    loc = write(cwd / ".claude/settings.local.json",
                {**hook("local"), "permissions": {"defaultMode": "dontAsk", "allow": ["Read", "Edit"]},
                 "model": "local-model"})
    flag = json.dumps({**hook("flag"), "permissions": {"defaultMode": "bypassPermissions", "ask": ["Bash"]}})
    s = load_settings(cwd, flag, home=home)
    assert s.sources == (str(u), str(p), str(loc), "--settings")
    assert commands(s) == ["user", "project", "local", "flag"]  # hook lists concatenate, low to high
    assert s.permissions.default_mode == "bypassPermissions"  # scalars: the highest source wins
    assert [str(r) for r in s.permissions.allow] == ["Read", "Edit"]  # rule lists merge (deduplicated)
    assert [str(r) for r in s.permissions.deny] == ["Bash(rm:*)"]
    assert [str(r) for r in s.permissions.ask] == ["Bash"]
    assert s.raw["env"] == {"A": "u", "B": "p"} and s.raw["model"] == "local-model"
    s = load_settings(cwd, home=home)
    assert s.permissions.default_mode == "dontAsk"
    s = load_settings(cwd, home=home, setting_sources=("project", "local"))
    assert commands(s) == ["project", "local"]
    s = load_settings(cwd, flag, home=home, setting_sources=["user"])
    assert commands(s) == ["user", "flag"]  # --settings is read whatever the sources
    with pytest.raises(SettingsError, match="unknown source"):
        load_settings(cwd, home=home, setting_sources=["managed"])


def test_settings_flag_file_and_its_project_root(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    home, cwd = dirs
    other = write(tmp_path / "elsewhere/.claude/settings.json",
                  {**hook("from-file"), "permissions": {"deny": ["Edit(/secret/**)"]}})
    s = load_settings(cwd, str(other), home=home)
    assert commands(s) == ["from-file"]
    rule = s.permissions.deny[0]
    assert rule.root == (tmp_path / "elsewhere").resolve()  # `/p` is relative to that file's project
    rel = write(cwd / "conf/agent.json", hook("relative"))
    assert commands(load_settings(cwd, "conf/agent.json", home=home)) == ["relative"]
    assert rel.exists()


def test_rule_roots_follow_their_source(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    write(home / ".claude/settings.json", {"permissions": {"deny": ["Read(/notes/**)"]}})
    write(cwd / ".claude/settings.json", {"permissions": {"deny": ["Edit(/build/**)"]}})
    s = load_settings(cwd, '{"permissions": {"deny": ["Write(/tmpl/**)"]}}', home=home)
    roots = {str(r): r.root for r in s.permissions.deny}
    assert roots == {"Read(/notes/**)": home.resolve(), "Edit(/build/**)": cwd.resolve(),
                     "Write(/tmpl/**)": cwd.resolve()}
    assert [r.source for r in s.permissions.deny] == [
        str(home / ".claude/settings.json"), str(cwd / ".claude/settings.json"), "--settings"]


def test_same_file_is_not_read_twice_when_cwd_is_home(tmp_path: Path) -> None:
    write(tmp_path / ".claude/settings.json", hook("once"))
    assert len(settings_files(tmp_path, home=tmp_path)) == 1
    assert commands(load_settings(tmp_path, home=tmp_path)) == ["once"]


def test_hook_fields(dirs: tuple[Path, Path]) -> None:
    _, cwd = dirs
    data = {"hooks": {
        "PreToolUse": [{"matcher": "Edit|Write", "hooks": [
            {"type": "command", "command": "a.sh", "timeout": 30},
            {"type": "command", "args": ["python3", "b.py"]},
            {"type": "prompt", "prompt": "is this ok?"}]}],  # valid in Claude Code, not run here
        "Stop": [{"hooks": [{"type": "command", "command": "c.sh"}]}],
        "Notification": [{"hooks": [{"type": "command", "command": "notify-send hi"}]}],  # not fired here
        "SomeFutureEvent": [{"hooks": [{"type": "command", "command": "x"}]}],
    }}
    s = parse_settings(data, source="t.json", root=cwd)
    assert set(s.hooks) == {"PreToolUse", "Stop"}
    m = s.hooks["PreToolUse"][0]
    assert m.matcher == "Edit|Write"
    assert m.hooks == (CommandHook("a.sh", timeout=30.0, source="t.json"),
                       CommandHook(args=("python3", "b.py"), timeout=600.0, source="t.json"))


def test_disable_all_hooks(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    write(cwd / ".claude/settings.json", hook("p"))
    s = load_settings(cwd, '{"disableAllHooks": true}', home=home)
    assert s.disable_all_hooks and s.active_hooks() == {} and commands(s) == ["p"]


def test_empty_file_is_empty_settings(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    write(cwd / ".claude/settings.local.json", "  \n")
    assert load_settings(cwd, home=home).hooks == {}


@pytest.mark.parametrize(("content", "fragment"), [
    ('{"hooks": ', "invalid JSON at line 1"),
    ("[1, 2]", "settings must be a JSON object"),
    ('{"hooks": []}', "hooks must be an object mapping event names to lists, got []"),
    ('{"hooks": {"PreToolUse": {"matcher": "x"}}}', "hooks.PreToolUse must be a list"),
    ('{"hooks": {"PreToolUse": [{"matcher": 3, "hooks": []}]}}',
     "hooks.PreToolUse[0].matcher must be a string"),
    ('{"hooks": {"PreToolUse": [{"matcher": "Bash(", "hooks": []}]}}', "not a valid regular expression"),
    ('{"hooks": {"Stop": [{"hooks": "echo"}]}}', "hooks.Stop[0].hooks must be a list"),
    ('{"hooks": {"Stop": [{"hooks": [{"command": "x"}]}]}}',
     'hooks.Stop[0].hooks[0].type is missing; it must be "command"'),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command"}]}]}}',
     'hooks.Stop[0].hooks[0] must be a command handler with "command" (shell form) or a non-empty "args"'),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command", "args": []}]}]}}', 'or a non-empty "args" (exec form)'),
    ('{"hooks": {"Stop": [{}]}}', "hooks.Stop[0].hooks is missing; it must be a list of handlers"),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "shell", "command": "x"}]}]}}',
     'hooks.Stop[0].hooks[0].type must be "command" (or one of agent, http, mcp_tool, prompt), got \'shell\''),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": true}]}]}}',
     "timeout must be a positive number of seconds, got true"),
    ('{"hooks": {"my.event": 3}}', 'hooks["my.event"] must be a list'),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": ""}]}]}}', "non-empty string"),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command", "args": "ls"}]}]}}',
     "args must be a non-empty list"),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": -1}]}]}}',
     "timeout must be a positive number"),
    ('{"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x", "timeout": "5"}]}]}}',
     "timeout must be a positive number"),
    ('{"permissions": []}', "permissions must be an object, got []"),
    ('{"permissions": {"allow": "Bash"}}', "permissions.allow must be a list"),
    ('{"permissions": {"deny": [42]}}', "permissions.deny[0] must be a string"),
    ('{"permissions": {"deny": ["Bash(rm"]}}', "permissions.deny[0]: invalid permission rule"),
    ('{"permissions": {"ask": ["Bad Name"]}}', "is not a tool name"),
    ('{"permissions": {"defaultMode": "yolo"}}', "permissions.defaultMode must be one of default, acceptEdits"),
    ('{"permissions": {"additionalDirectories": "/x"}}', "additionalDirectories must be a list"),
    ('{"disableAllHooks": "yes"}', "disableAllHooks must be true or false"),
    # a lock with a value it does not know is refused, not read as "no lock" (fail closed)
    ('{"permissions": {"disableBypassPermissionsMode": true}}',
     'permissions.disableBypassPermissionsMode must be "disable"'),
])
def test_bad_settings_name_the_file_and_the_problem(dirs: tuple[Path, Path], content: str,
                                                    fragment: str) -> None:
    home, cwd = dirs
    path = write(cwd / ".claude/settings.json", content)
    with pytest.raises(SettingsError) as err:
        load_settings(cwd, home=home)
    assert str(path) in str(err.value) and fragment in str(err.value)
    assert isinstance(err.value, ValueError)
    # the same text passed inline is reported against --settings
    path.unlink()
    with pytest.raises(ValueError, match=r"^--settings: ") if content.lstrip().startswith("{") else \
            pytest.raises(ValueError):
        load_settings(cwd, content, home=home)


def test_settings_flag_errors(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(cwd, "nope.json", home=home)
    with pytest.raises(SettingsError, match="empty string"):
        load_settings(cwd, "   ", home=home)
    bad = write(cwd / "bad.json", "{\n  'single': 'quotes'\n}")
    with pytest.raises(SettingsError, match=r"bad\.json: invalid JSON at line 2"):
        load_settings(cwd, str(bad), home=home)


def test_not_utf8_is_a_clear_error(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    p = cwd / ".claude/settings.json"
    p.parent.mkdir()
    p.write_bytes(b"\xff\xfe{}")
    with pytest.raises(SettingsError, match="not UTF-8"):
        load_settings(cwd, home=home)


def test_permission_policy_from_settings(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    write(cwd / ".claude/settings.json", {"permissions": {
        "allow": ["Bash(npm test)"], "deny": ["Read(./.env)"], "defaultMode": "acceptEdits",
        "additionalDirectories": ["../shared"]}})
    s = load_settings(cwd, home=home)
    policy = PermissionPolicy.from_settings(s, cwd, allowed_tools="Grep Glob", disallowed_tools=["WebFetch"])
    assert policy.mode == "acceptEdits"
    assert [str(r) for r in policy.allow] == ["Bash(npm test)", "Grep", "Glob"]
    assert [str(r) for r in policy.deny] == ["Read(./.env)", "WebFetch"]
    assert policy.additional_directories == [(cwd.parent / "shared").resolve()]
    assert PermissionPolicy.from_settings(s, cwd, mode="plan").mode == "plan"  # the CLI beats defaultMode


def test_disable_bypass_mode_is_a_lock(dirs: tuple[Path, Path]) -> None:
    home, cwd = dirs
    write(home / ".claude/settings.json", {"permissions": {"disableBypassPermissionsMode": "disable"}})
    s = load_settings(cwd, '{"permissions": {"defaultMode": "default"}}', home=home)
    with pytest.raises(ValueError, match="bypassPermissions is disabled"):
        PermissionPolicy.from_settings(s, cwd, mode="bypassPermissions")
    assert PermissionPolicy.from_settings(s, cwd).mode == "default"
