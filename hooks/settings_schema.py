"""The settings files' structure as a JSON Schema (``settings.schema.json``, next to this module),
the one error a bad file gets, and the settings reference page generated from the schema.

The schema is data: which keys exist, their types, and for every node that can refuse a value an
``x-expected`` text that the error message uses ("``hooks.Stop[0].hooks[0].timeout`` must be a
positive number of seconds, got "5""). Validation is jsonschema's; this module only turns its first
error into one sentence with a JSON path. Two more annotations drive the loader's warnings:
``x-warn-unknown`` (an object whose unknown keys are warned about, with that log event) and
``x-not-applied`` (a key that is accepted and has no effect here).

``python -m agentfsm.hooks.settings_schema --write docs/settings.md`` regenerates the reference page;
``--check`` fails when it is stale (the suite checks it too).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

import jsonschema

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# the keywords that can refuse a value: a node holding one of them needs an ``x-expected`` text
VALIDATING_KEYWORDS = frozenset({"type", "enum", "const", "pattern", "minimum", "exclusiveMinimum",
                                 "minItems", "required", "anyOf"})


class SchemaUnavailable(RuntimeError):
    """The schema file is missing or unreadable: settings cannot be checked, so none are loaded."""


@functools.cache
def schema() -> Mapping[str, Any]:
    """The settings schema, read once from the package."""
    try:
        text = resources.files("agentfsm.hooks").joinpath("settings.schema.json").read_text(encoding="utf-8")
        loaded = json.loads(text)
    except (OSError, ValueError) as exc:  # a broken install: refuse rather than load unchecked settings
        raise SchemaUnavailable(f"the settings schema of this agentfsm install cannot be read ({exc}); "
                                "reinstall agentfsm") from None
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with a local ``$ref`` followed (its own keys, such as ``description``, win)."""
    ref = node.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return node
    target = resolve(schema()["$defs"][ref.removeprefix("#/$defs/")])
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


def json_path(parts: Sequence[str | int]) -> str:
    """``hooks.Stop[0].matcher``: keys that are names after a dot, others quoted, indexes in brackets;
    the document itself is ``settings``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "settings"


def short(value: Any, limit: int = 80) -> str:
    """A value as the error shows it: JSON, strings quoted, cut at ``limit`` characters."""
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def problem(data: Any) -> tuple[tuple[str | int, ...], str] | None:
    """The first place where ``data`` breaks the schema, as (JSON path, sentence), or None when
    the document is valid."""
    error = next(iter(_validator().iter_errors(data)), None)
    if error is None:
        return None
    path = tuple(error.absolute_path)
    node = error.schema if isinstance(error.schema, Mapping) else {}
    if error.validator == "required":
        # name the missing key, with what it must be, rather than its parent object
        props = node.get("properties", {})
        missing = next(k for k in node["required"] if k not in error.instance)
        wanted = resolve(props.get(missing, {})).get("x-expected")
        where = (*path, missing)
        text = f"{json_path(where)} is missing" + (f"; it must be {wanted}" if wanted else "")
        return where, text
    expected = node.get("x-expected")
    if expected is None:  # every refusing node has a text (a test holds this); jsonschema's own words else
        return path, f"{json_path(path)}: {error.message}"
    return path, f"{json_path(path)} must be {expected}, got {short(error.instance)}"


def annotations(data: Any, node: Mapping[str, Any] | None = None,
                path: tuple[str | int, ...] = ()) -> Iterator[tuple[str, tuple[str | int, ...], str]]:
    """The loader's warnings for a valid document: ``(log event, path, detail)`` for every key of an
    ``x-warn-unknown`` object that the schema does not list, and for every ``x-not-applied`` key."""
    node = resolve(schema() if node is None else node)
    if "x-not-applied" in node:
        yield "setting_not_applied", path, node["x-not-applied"]
    if not isinstance(data, Mapping):
        return
    props = node.get("properties", {})
    for key, value in data.items():
        if key in props:
            yield from annotations(value, props[key], (*path, key))
        elif "x-warn-unknown" in node:
            yield node["x-warn-unknown"], (*path, key), "not a key agentfsm knows; ignored"


# ----------------------------------------------------------------------------------------------
# The reference page

_HEADER = """\
# Settings reference

<!-- generated by `python -m agentfsm.hooks.settings_schema --write docs/settings.md` from
hooks/settings.schema.json; tests/test_settings_schema.py fails when this page is stale -->

The settings keys agentfsm reads, with their types. Files are read in the order given in
[Hooks and permissions](hooks.md). A value of the wrong type stops the run before anything is written,
with one error that names the file, the key's path and what the key must hold. For example:

```text
agentfsm: .claude/settings.json: hooks.Stop[0].hooks[0].timeout must be a positive number of seconds, got '5'
```

Other keys are kept and not read, so a settings file written for Claude Code loads as it is.
"""


def _type_text(node: Mapping[str, Any]) -> str:
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " · ".join(f"`{v}`" for v in node["enum"])
    types = node.get("type")
    if types is None:
        return "any"
    names = {"array": "list", "object": "object", "string": "string", "boolean": "true/false",
             "number": "number", "integer": "integer", "null": "null"}
    kinds = [names[t] for t in ([types] if isinstance(types, str) else types)]
    if "array" in (types if isinstance(types, list) else [types]) and "items" in node:
        item = resolve(node["items"])
        kinds[kinds.index("list")] = f"list of {_type_text(item)}s"
    return " or ".join(kinds)


def _rows(node: Mapping[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    node = resolve(node)
    if path:
        description = str(node.get("description", "")).replace("\n", " ")
        yield json_path(path), _type_text(node), description
    for key, child in node.get("properties", {}).items():
        yield from _rows(child, (*path, key))
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield from _rows(extra, (*path, "<event>"))


def _handler_rows() -> Iterator[tuple[str, str, str]]:
    handler = resolve({"$ref": "#/$defs/handler"})
    entry = resolve({"$ref": "#/$defs/eventMatchers"})["items"]
    base = "hooks.<event>[]"
    for key, child in entry["properties"].items():
        if key != "hooks":
            yield f"{base}.{key}", _type_text(resolve(child)), child.get("description", "")
    fields = {**handler["properties"], **handler["then"]["properties"]}
    for key, child in fields.items():
        yield f"{base}.hooks[].{key}", _type_text(resolve(child)), child.get("description", "")


def render_reference() -> str:
    """The settings reference page, in Markdown, from the schema alone."""
    from agentfsm.hooks.inputs import HOOK_EVENTS  # the events are the hook package's, not the schema's

    out = [_HEADER]
    for section, node in schema()["properties"].items():
        out.append(f"\n## `{section}`\n\n{node.get('description', '')}\n")
        out.append("| key | value | meaning |\n|---|---|---|")
        rows = list(_rows(node, (section,)))
        if section == "hooks":
            rows = rows[:1] + list(_handler_rows())
        for key, kind, description in rows:
            cell = description.replace("|", "\\|")
            out.append(f"| `{key}` | {kind} | {cell} |")
        if section == "hooks":
            out.append("\n`<event>` is one of " + ", ".join(f"`{e}`" for e in HOOK_EVENTS) + ".")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentfsm.hooks.settings_schema",
                                     description="Write or check the settings reference page.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="PAGE", help="write the page (docs/settings.md)")
    group.add_argument("--check", metavar="PAGE", help="exit 1 when the page differs from the schema")
    args = parser.parse_args(argv)
    page = render_reference()
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(page)
        return 0
    try:
        with open(args.check, encoding="utf-8") as f:
            current = f.read()
    except OSError as exc:
        sys.stderr.write(f"{args.check}: {exc.strerror or exc}\n")
        return 1
    if current != page:
        sys.stderr.write(f"{args.check} is stale: run python -m agentfsm.hooks.settings_schema "
                         f"--write {args.check}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
