"""The settings schema (hooks/settings.schema.json): every refusing node says what it expects, a bad
document of any shape gets one error naming a path that is in it, the reference page is generated
from it, and the lists the code holds (permission modes, handler types) are the schema's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from agentfsm.common.modes import MODE_ALIASES, PERMISSION_MODES
from agentfsm.hooks import config, settings_schema
from agentfsm.hooks.config import SettingsError, load_settings, parse_settings
from agentfsm.hooks.inputs import HOOK_EVENTS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "settings.md"


def _nodes(node: Any, where: str = "#") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema node (not the branches of an ``anyOf``: their failures are reported by the node
    holding the ``anyOf``; not the ``if`` test, which refuses nothing)."""
    yield where, node
    for key, child in node.items():
        if key in ("properties", "$defs"):
            for name, sub in child.items():
                yield from _nodes(sub, f"{where}/{key}/{name}")
        elif key in ("items", "additionalProperties", "then") and isinstance(child, Mapping):
            yield from _nodes(child, f"{where}/{key}")


def test_every_refusing_node_says_what_it_expects() -> None:
    missing = [where for where, node in _nodes(settings_schema.schema())
               if settings_schema.VALIDATING_KEYWORDS & node.keys() and "x-expected" not in node]
    assert missing == []


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(settings_schema.schema())


def test_the_codes_lists_are_the_schemas() -> None:
    perms = settings_schema.schema()["properties"]["permissions"]["properties"]
    assert set(perms["defaultMode"]["enum"]) == set(PERMISSION_MODES) | set(MODE_ALIASES)
    handler = settings_schema.resolve({"$ref": "#/$defs/handler"})
    assert set(handler["properties"]["type"]["enum"]) == {"command"} | config._UNSUPPORTED_HANDLER_TYPES


def test_the_reference_page_is_generated_from_the_schema() -> None:
    assert PAGE.read_text(encoding="utf-8") == settings_schema.render_reference(), (
        "docs/settings.md is stale: run python -m agentfsm.hooks.settings_schema --write docs/settings.md")
    # every key of the schema has a row, and every hook event is named
    page = PAGE.read_text(encoding="utf-8")
    for key in ("sandbox.network.allowedDomains", "permissions.disableBypassPermissionsMode",
                "hooks.<event>[].hooks[].timeout", "disableAllHooks"):
        assert f"`{key}`" in page
    assert all(f"`{event}`" in page for event in HOOK_EVENTS)


def test_the_page_check_fails_on_a_stale_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "settings.md"
    assert settings_schema.main(["--write", str(page)]) == 0
    assert settings_schema.main(["--check", str(page)]) == 0
    page.write_text(page.read_text() + "an edit by hand\n")
    assert settings_schema.main(["--check", str(page)]) == 1
    assert "is stale" in capsys.readouterr().err


def test_unknown_keys_warn_where_they_matter_and_load_everywhere(tmp_path: Path) -> None:
    doc = {"statusLine": {"type": "command"}, "model": "x",  # Claude Code keys agentfsm does not read
           "permissions": {"dney": ["Bash"]},                 # a typo next to security rules
           "sandbox": {"enabeld": False, "filesystem": {"allowRead": ["."]}}}
    with capture_logs() as logs:
        s = parse_settings(doc, source="s.json", root=tmp_path)
    assert s.raw["statusLine"] == {"type": "command"} and s.permissions.deny == ()
    said = {(e["event"], e["key"]) for e in logs}
    assert said == {("permission_setting_unknown", "permissions.dney"),
                    ("sandbox_setting_unknown", "sandbox.enabeld"),
                    ("setting_not_applied", "sandbox.filesystem.allowRead")}
    assert s.sandbox.enabled is None  # the misspelt key changed nothing: the defaults stay


def test_a_missing_schema_refuses_every_settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> None:
        raise settings_schema.SchemaUnavailable("the settings schema of this agentfsm install cannot be read")

    monkeypatch.setattr(settings_schema, "problem", lambda data: unavailable())
    (tmp_path / "s.json").write_text('{"permissions": {"deny": ["Bash"]}}')
    with pytest.raises(SettingsError, match=r"s\.json: the settings schema .* cannot be read"):
        load_settings(tmp_path, "s.json", home=tmp_path, setting_sources=())


# --- any document --------------------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 700, allow_nan=False) | \
    st.sampled_from(["", " ", "Bash", "Bash(ls *)", "Read(./x)", "disable", "command", "prompt", "Bash(",
                     "default", "manual", "yolo", "*"]) | st.text(max_size=4)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=2)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=4)
_keys = st.sampled_from([*HOOK_EVENTS, "Notification", "PreToolUs", "a.b", "é"])


def _shaped(node: Mapping[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values shaped like the schema node, often right and sometimes wrong at any depth."""
    node = settings_schema.resolve(node)
    props = dict(node.get("properties", {}))
    props.update(node.get("then", {}).get("properties", {}))
    options: list[st.SearchStrategy[Any]] = []
    if "enum" in node:
        options.append(st.sampled_from(node["enum"]))
    if "const" in node:
        options.append(st.just(node["const"]))
    if props:
        options.append(st.fixed_dictionaries({}, optional={k: _shaped(v, depth + 1) for k, v in props.items()}))
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        options.append(st.dictionaries(_keys, _shaped(extra, depth + 1), max_size=2))
    if "items" in node:
        options.append(st.lists(_shaped(node["items"], depth + 1), max_size=2))
    kind = node.get("type")
    if kind == "boolean":
        options.append(st.booleans())
    elif kind == "number":
        options.append(st.floats(0.1, 900) | st.integers(1, 900))
    elif kind == "string":
        options.append(st.sampled_from(["Bash", "Edit|Write", "ls", "x"]))
    if not options:
        return _json
    return st.one_of(*options) if depth > 6 else st.one_of(*options, _json) if options else _json


_STEP = re.compile(r'\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]|\.?([A-Za-z_][A-Za-z0-9_]*)')
_PATH = re.compile(r'((?:[A-Za-z_][A-Za-z0-9_]*|\[\d+\]|\["(?:[^"\\]|\\.)*"\]|\.)+)( must be | is missing|: )')


def _steps(path_text: str) -> list[str | int]:
    """A message's JSON path read back into keys and indexes (``settings`` is the document)."""
    if path_text == "settings":
        return []
    return [int(i) if i else json.loads(q) if q else n for i, q, n in _STEP.findall(path_text)]


def _at(doc: Any, steps: list[str | int]) -> Any:
    """The value at ``steps``; KeyError/IndexError/TypeError when the path is not in ``doc``."""
    for step in steps:
        if isinstance(doc, list) != isinstance(step, int):  # an index into an object, a key into a list
            raise TypeError(step)
        doc = doc[step]
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shaped(settings_schema.schema()))
def test_any_document_loads_or_gets_one_error_naming_its_path(doc: Any) -> None:
    try:
        parse_settings(doc, source="s.json", root="/tmp")
    except SettingsError as exc:
        assert exc.source == "s.json"
        head = _PATH.match(exc.problem)
        assert head, f"the error does not start with a JSON path: {exc.problem!r}"
        steps = _steps(head.group(1))
        if head.group(2) == " is missing":  # the object is there and lacks the key
            parent = _at(doc, steps[:-1])
            assert isinstance(parent, dict) and steps[-1] not in parent
        else:
            value = _at(doc, steps)  # raises when the path is not in the document
            if head.group(2) == " must be ":
                assert exc.problem.endswith(", got " + settings_schema.short(value))
    else:
        # accepted means valid: nothing the schema refuses gets through
        jsonschema.validate(doc, settings_schema.schema())
