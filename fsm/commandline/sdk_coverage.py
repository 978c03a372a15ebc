"""How much of the Claude Agent SDK's protocol agentfsm speaks, entry by entry, read from the SDK itself.

:func:`sdk_entries` walks the installed ``claude-agent-sdk`` package's own type declarations — every
field of ``ClaudeAgentOptions``, every control request subtype (the typed ``SDKControlRequest`` union
and the requests its ``Query`` sends), every message type (and ``SystemMessage`` subclass) and content
block with its fields, every hook input and its fields, the permission callback's context and results —
so a new SDK release that adds one shows up here without anyone listing it by hand.

``data/sdk_coverage.toml`` gives each entry's status in agentfsm (:data:`STATUSES`);
:func:`check` says what the table misses, what it lists that the SDK no longer has, and which entries
lack a status or a reason; :func:`render` writes the table that ``docs/sdk.md`` holds
(``python -m agentfsm.commandline.sdk_coverage`` rewrites it there).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
import tomllib
import typing
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

STATUSES: dict[str, str] = {
    "identical": "what Claude Code does, as an SDK user observes it",
    "sdk-only": "handled inside the SDK's own process; the CLI never sees it",
    "different": "deliberately different (the note says why)",
    "refused": "refused by name: a clear error, never a silent no-op",
    "gap": "not yet: agentfsm does not do what Claude Code does (the note says what is missing)",
}
"""Every status an entry may have. ``unknown`` is not one: an entry nobody looked at fails the check."""

NEEDS_NOTE = frozenset({"different", "refused", "gap"})

GROUPS: dict[str, str] = {
    "options": "ClaudeAgentOptions fields",
    "control": "Control requests (subtype, then each field)",
    "message": "Messages and their fields",
    "block": "Content blocks and their fields",
    "hook": "Hook inputs and their fields",
    "permission": "Permission callback: context and results",
}


@attrs.frozen
class Entry:
    """One thing an SDK user can set or observe: ``key`` is ``group.Type[.field]``."""

    key: str
    group: str


@attrs.frozen
class Status:
    status: str
    note: str = ""


def _fields(cls: Any) -> list[str]:
    """The fields of a dataclass or TypedDict, in declaration order (inherited ones first)."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(typing.get_type_hints(cls))


def _members(union: Any) -> list[Any]:
    return [m for m in typing.get_args(union) if isinstance(m, type)]


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _literal(hint: Any) -> str | None:
    args = typing.get_args(hint)
    return str(args[0]) if typing.get_origin(hint) is typing.Literal and args else None


def _sent_subtypes(query_cls: type) -> list[str]:
    """The subtypes of the control requests the SDK's ``Query`` sends (dict literals handed to
    ``_send_control_request``): the SDK types only some of them in ``SDKControlRequest``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(query_cls)))
    found: list[str] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "_send_control_request" and node.args
                and isinstance(node.args[0], ast.Dict)):
            for k, v in zip(node.args[0].keys, node.args[0].values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "subtype" and isinstance(v, ast.Constant):
                    found.append(str(v.value))
    return found


def sdk_entries() -> list[Entry]:
    """Every entry of the installed SDK, in the SDK's own order (group by group)."""
    import claude_agent_sdk.types as t
    from claude_agent_sdk._internal.query import Query

    out: list[Entry] = []

    def add(group: str, *parts: str) -> None:
        key = ".".join((group, *parts))
        if key not in {e.key for e in out}:
            out.append(Entry(key, group))

    for name in _fields(t.ClaudeAgentOptions):
        add("options", name)

    request_union = typing.get_type_hints(t.SDKControlRequest)["request"]
    for member in _members(request_union):
        hints = typing.get_type_hints(member)
        subtype = _literal(hints["subtype"])
        assert subtype is not None, member
        add("control", subtype)
        for name in hints:
            if name != "subtype":
                add("control", subtype, name)
    for subtype in _sent_subtypes(Query):
        add("control", subtype)

    messages = _members(t.Message)
    messages += [c for c in _subclasses(t.SystemMessage) if c.__module__ == t.__name__]
    for cls in messages:
        add("message", cls.__name__)
        for name in _fields(cls):
            add("message", cls.__name__, name)
    for cls in _members(t.ContentBlock):
        add("block", cls.__name__)
        for name in _fields(cls):
            add("block", cls.__name__, name)
    for cls in _members(t.HookInput):
        add("hook", cls.__name__)
        for name in _fields(cls):
            add("hook", cls.__name__, name)
    for cls in (t.ToolPermissionContext, t.PermissionResultAllow, t.PermissionResultDeny, t.PermissionUpdate):
        add("permission", cls.__name__)
        for name in _fields(cls):
            add("permission", cls.__name__, name)
    return out


def load_table(text: str | None = None) -> dict[str, Status]:
    """``data/sdk_coverage.toml``: ``[group.Type]`` tables whose keys are fields (``_`` is the type itself),
    or ``[options]`` whose keys are option names; each value is a status or ``[status, note]``."""
    if text is None:
        text = resources.files("agentfsm").joinpath("data/sdk_coverage.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    table: dict[str, Status] = {}

    def walk(prefix: str, node: Any) -> None:
        for k, v in node.items():
            key = prefix if k == "_" else f"{prefix}.{k}"
            if isinstance(v, dict):
                walk(key, v)
            elif isinstance(v, str):
                table[key] = Status(v)
            elif isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v):
                table[key] = Status(v[0], v[1])
            else:
                raise ValueError(f"sdk_coverage.toml: {key}: expected a status or [status, note], got {v!r}")

    for group, node in raw.items():
        walk(group, node)
    return table


def check(entries: list[Entry], table: dict[str, Status]) -> list[str]:
    """What is wrong with the table for these entries; empty when every entry has a known status."""
    problems = [f"{e.key}: in the installed SDK, not in the table" for e in entries if e.key not in table]
    known = {e.key for e in entries}
    problems += [f"{k}: in the table, not in the installed SDK" for k in table if k not in known]
    for k, s in table.items():
        if s.status not in STATUSES:
            problems.append(f"{k}: status {s.status!r} is not one of {', '.join(STATUSES)}")
        elif s.status in NEEDS_NOTE and not s.note.strip():
            problems.append(f"{k}: status {s.status!r} needs a note saying why or what is missing")
    return problems


def counts(entries: list[Entry], table: dict[str, Status]) -> dict[str, int]:
    tally = dict.fromkeys(STATUSES, 0)
    for e in entries:
        if e.key in table and table[e.key].status in tally:
            tally[table[e.key].status] += 1
    return tally


BEGIN = "<!-- sdk-coverage:begin (generated by `python -m agentfsm.commandline.sdk_coverage`; do not edit) -->"
END = "<!-- sdk-coverage:end -->"


def render(entries: list[Entry], table: dict[str, Status], sdk_version: str) -> str:
    """The Markdown table of every entry, group by group, with the tally first."""
    tally = counts(entries, table)
    lines = [BEGIN, "", f"Read from claude-agent-sdk {sdk_version}: {len(entries)} entries — "
             + ", ".join(f"{n} {s}" for s, n in tally.items()) + ".", ""]
    lines += ["| status | meaning |", "|---|---|"] + [f"| {s} | {m} |" for s, m in STATUSES.items()] + [""]
    for group, title in GROUPS.items():
        lines += [f"### {title}", "", "| entry | status | note |", "|---|---|---|"]
        for e in entries:
            if e.group == group:
                s = table.get(e.key, Status("unknown"))
                note = s.note.replace("|", "\\|").replace("\n", " ")
                lines.append(f"| `{e.key.removeprefix(group + '.')}` | {s.status} | {note} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def splice(doc: str, table_md: str) -> str:
    """``doc`` with the text between the markers replaced by ``table_md``."""
    head, sep, rest = doc.partition(BEGIN)
    if not sep:
        raise ValueError("docs/sdk.md has no sdk-coverage markers")
    _, sep2, tail = rest.partition(END)
    if not sep2:
        raise ValueError("docs/sdk.md: sdk-coverage begin marker without its end marker")
    return head + table_md + tail


def sdk_version() -> str:
    from importlib.metadata import version

    return version("claude-agent-sdk")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    doc = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "docs" / "sdk.md"
    entries, table = sdk_entries(), load_table()
    problems = check(entries, table)
    for p in problems:
        print(p, file=sys.stderr)
    doc.write_text(splice(doc.read_text(encoding="utf-8"), render(entries, table, sdk_version())), encoding="utf-8")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
