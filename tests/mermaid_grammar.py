"""A small grammar for the Mermaid agentfsm writes — flowcharts and sequence diagrams — so the suite can
tell, without a browser, that Mermaid-CLI (and GitHub) would parse it. Each function returns the
problems it found, with line numbers; empty means the text is in the grammar.

The grammar is the subset agentfsm emits, stated strictly: anything outside it is a problem even if
Mermaid might accept it, so a change in what is emitted has to be looked at.
"""

from __future__ import annotations

import re

_TEXT = r'[^;#\n"]+'  # message text: no statement separator, no entity start, no quote
_ID = r"[A-Za-z_][A-Za-z0-9_]*"
_ARROWS = r"(?:->>|-->>|--x|-x|->|-->|-\)|--\))"


def sequence_problems(text: str) -> list[str]:
    lines = text.rstrip("\n").split("\n")
    problems: list[str] = []
    if not lines or lines[0] != "sequenceDiagram":
        return ["line 1: a sequence diagram starts with 'sequenceDiagram'"]
    declared: set[str] = set()
    patterns = {
        "participant": re.compile(rf"^    participant ({_ID})(?: as ({_TEXT}))?$"),
        "message": re.compile(rf"^    ({_ID})({_ARROWS})({_ID}): ({_TEXT})$"),
        "note": re.compile(rf"^    Note (?:over ({_ID})(?:,({_ID}))?|left of ({_ID})|right of ({_ID})): ({_TEXT})$"),
        "comment": re.compile(r"^    %%.*$"),
    }
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        if m := patterns["participant"].match(line):
            declared.add(m[1])
            continue
        if m := patterns["message"].match(line):
            unknown = [p for p in (m[1], m[3]) if p not in declared]
            if unknown:
                problems.append(f"line {n}: message between undeclared participants {unknown}: {line.strip()}")
            continue
        if m := patterns["note"].match(line):
            unknown = [p for p in m.groups()[:4] if p is not None and p not in declared]
            if unknown:
                problems.append(f"line {n}: note over undeclared participants {unknown}: {line.strip()}")
            continue
        if patterns["comment"].match(line):
            continue
        problems.append(f"line {n}: not in the grammar: {line!r}")
    return problems


def flowchart_problems(text: str) -> list[str]:
    lines = text.rstrip("\n").split("\n")
    problems: list[str] = []
    if not lines or not re.match(r"^flowchart (TB|TD|LR|RL|BT)$", lines[0]):
        return ["line 1: a flowchart starts with 'flowchart <direction>'"]
    label = r'"[^"]*"'
    shapes = rf"(?:\(\[{label}\]\)|\(\(\({label}\)\)\)|\[{label}\]|\({label}\))"
    node = re.compile(rf"^\s+({_ID}){shapes}$")
    link = re.compile(rf"^\s+({_ID}) (-->|-\.->|==>|---|-\.-)(?:\|{label}\|)? ({_ID})$")
    other = [re.compile(p) for p in (
        r"^\s+%%.*$", rf"^\s+subgraph {_ID}\[{label}\]$", r"^\s+end$", r"^\s+direction (TB|TD|LR|RL|BT)$",
        r"^\s+linkStyle [\d,]+ [\w:#.,\- ]+$", rf"^\s+classDef {_ID} [\w:#.,\- ]+$",
        rf"^\s+class {_ID}(,{_ID})* {_ID}$", rf"^\s+style {_ID} [\w:#.,\- ]+$")]
    links = 0
    depth = 0
    styled: list[int] = []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        if link.match(line):
            links += 1
            continue
        if node.match(line):
            continue
        if m := re.match(r"^\s+linkStyle ([\d,]+) ", line):
            styled += [int(i) for i in m[1].split(",")]
        if line.strip().startswith("subgraph "):
            depth += 1
        if line.strip() == "end":
            depth -= 1
            if depth < 0:
                problems.append(f"line {n}: 'end' without a subgraph")
        if not any(p.match(line) for p in other):
            problems.append(f"line {n}: not in the grammar: {line!r}")
    if depth:
        problems.append("a subgraph is not closed")
    beyond = [i for i in styled if i >= links]
    if beyond:
        problems.append(f"linkStyle names links {beyond} but there are {links}")
    return problems
