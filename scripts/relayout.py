"""Move the modules of ``fsm/`` into subpackages that match the import-linter layers (issue 31, item 5).

``fsm/`` was one flat folder whose layer structure only the import-linter contract in pyproject.toml
knew. This codemod groups its modules into one subpackage per layer band (:data:`MAPPING`), and
rewrites every reference to them:

* Python (``fsm/ tools/ hooks/ tests/ bench/ examples/``), with libcst (a concrete syntax tree, so
  comments and formatting survive): ``import`` and ``from ... import`` statements (a ``from agentfsm
  import a, b`` whose names now live in two packages becomes two statements), dotted uses
  ``agentfsm.<module>.<name>``, module paths in strings (``monkeypatch.setattr`` targets,
  ``sys.modules`` checks, ``python -c`` code, ``-m`` arguments) and in comments and docstrings, and
  ``Path(__file__).parents[N]`` in a module that is now one folder deeper;
* text (``*.md``, ``*.toml``, ``*.yml``): file paths ``fsm/<module>.py`` and dotted module paths;
* pyproject.toml: the packages setuptools installs, the entry point, every module the import-linter
  contracts name, and one more contract, :data:`PACKAGE_LAYERS`, that states the new packages' order;
* bench/mutation.toml: module paths, and the new packages' ``__init__.py`` in its list of files
  outside the campaign.

Names that are persisted stay as they are: logger names (``get_logger("agentfsm.compact")``) and
Temporal activity and workflow names (``activity.defn(name="agentfsm.compact")``) are collected
from the source before rewriting (:func:`persisted_names`), and a bare string equal to one of them
is never rewritten. The old module paths stay importable: ``fsm/__init__.py`` gets a table of the
moved modules and an import hook that hands out the moved module itself (one module object under
both names) with a ``DeprecationWarning`` naming the new path.

The script is idempotent: a tree already in the new layout is left as it is (a second run changes
nothing). ``--check`` changes nothing and exits 1 when the tree is not in the new layout.

Usage (from the repository root)::

    python scripts/relayout.py            # move and rewrite, then sort the rewritten imports (ruff)
    python scripts/relayout.py --check    # exit 1 unless every module is in its layer package
    python scripts/relayout.py --plan     # print where each module goes

After moving: reinstall (``pip install -e '.[test]'``) so the new packages are installed, and
regenerate what is generated from the source (``agentfsm diagram``; see the script's closing message).
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import libcst as cst

# Every module (or subpackage) of fsm/ -> the layer package it moves to, in the order of the layers
# (pyproject.toml's first import-linter contract). A module added to fsm/ must be added here: the
# script refuses to run, and tests/test_relayout.py fails, naming the line to add.
MAPPING: dict[str, str] = {
    # the command line and the SDK's control protocol
    "cli": "commandline",
    "control": "commandline",
    "demo": "commandline",
    "sdk_coverage": "commandline",
    "conform": "commandline",
    # the auditor of traces and of Claude Code's own files
    "audit": "auditing",
    "coverage": "auditing",
    "claude_code_audit": "auditing",
    "claude_code": "auditing",
    "checks": "auditing",
    # sessions, resuming them, subagents, the wiring of one session, memory files
    "resume": "sessions",
    "session": "sessions",
    "subagents": "sessions",
    "compose": "sessions",
    "memory": "sessions",
    "claude_transcript": "sessions",
    # the runtime: the runner, the driver, what each phase does, the tool executor and pipeline
    "driver": "runtime",
    "runner": "runtime",
    "phases": "runtime",
    "executor": "runtime",
    "compact": "runtime",
    "signals": "runtime",
    "pipeline": "runtime",
    "trace": "runtime",
    "queue": "runtime",
    "result": "runtime",
    "assembler": "runtime",
    "request": "runtime",
    "ports": "runtime",
    "cost": "runtime",
    "tasks": "runtime",
    # the model transport
    "transport": "llm",
    "model": "llm",
    # the machine: the route table, its events, texts, options and state (pure)
    "graph": "machine",
    "events": "machine",
    "prompts": "machine",
    "options": "machine",
    "state": "machine",
    # what every layer may use
    "log": "common",
    "modes": "common",
    "textsafe": "common",
    "bounded_json": "common",
    "progress": "common",
    "weak": "common",
}

# What stays at the top of fsm/: the Python API, the subpackages that were already packages, the
# package's own files and its data folders.
STAY: frozenset[str] = frozenset({"__init__", "__main__", "api", "testing", "temporal", "diagram", "report",
                                  "data", "scenarios", "py.typed"})

# The new packages' docstrings (their __init__.py).
PACKAGE_DOCS: dict[str, str] = {
    "commandline": "The command line (``agentfsm ...``), the SDK's control protocol and the demo.",
    "auditing": "The auditor: agentfsm traces and Claude Code's own files, replayed against the declared graph.",
    "sessions": "Sessions: one conversation's runs, resuming them, subagents, the wiring of a session, memory files.",
    "runtime": "The runtime: the loop runner, the in-process driver and the I/O of each phase.",
    "llm": "The model transport: requests to the Messages API, streaming, retries and fallbacks.",
    "machine": "The machine: the declared graph, its events, texts, options and state. Pure: no I/O.",
    "common": "What every layer may use: logging, permission modes, text and JSON helpers, progress.",
}

# The packages' order, top to bottom, as one more import-linter contract (written to pyproject.toml):
# a package may import those below it, never one above. tools and hooks are agentfsm.tools and
# agentfsm.hooks when installed.
PACKAGE_LAYERS: tuple[str, ...] = (
    "commandline",
    "report",
    "temporal | diagram",
    "testing",
    "api | auditing",
    "sessions",
    "hooks",
    "runtime",
    "llm",
    "machine | tools",
    "common",
)
PACKAGE_CONTRACT = "The layer packages of fsm/, top to bottom (scripts/relayout.py)"

PY_ROOTS = ("fsm", "tools", "hooks", "tests", "bench", "examples")
TEXT_SUFFIXES = (".md", ".toml", ".yml", ".yaml")
SKIP_DIRS = frozenset({".git", ".venv", "node_modules", "__pycache__", "site", ".mypy_cache", ".ruff_cache",
                       ".pytest_cache", "scripts", "build", "dist"})
ALIAS_BEGIN = "# --- moved modules (written by scripts/relayout.py; do not edit) ---"
ALIAS_END = "# --- end of moved modules ---"


class LayoutError(Exception):
    """The tree cannot be moved as it is (a module missing from :data:`MAPPING`, a name clash)."""


# --- what is where -----------------------------------------------------------------------------------


def _entries(fsm: Path) -> Iterator[tuple[str, Path]]:
    """The modules and subpackages at the top of ``fsm/``: (name, path)."""
    for p in sorted(fsm.iterdir()):
        if p.name.startswith(".") or p.name == "__pycache__":
            continue
        if p.is_file() and p.suffix == ".py":
            yield p.stem, p
        elif p.is_dir() and (p / "__init__.py").is_file():
            yield p.name, p
        elif p.is_dir() or p.name in STAY:
            yield p.name, p


def _fine_layer(root: Path, name: str) -> str | None:
    """The layer (a line of pyproject's first import-linter contract) that names module ``name``."""
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    for line in re.findall(r'^\s*"([^"\n]*)",?\s*$', pyproject, flags=re.M):
        if name in [t.strip() for t in line.split("|")]:
            return line
    return None


def unmapped(root: Path) -> list[str]:
    """A message for each module of fsm/ that :data:`MAPPING` does not place: what it is and exactly
    which line to add to MAPPING (the package of the modules that share its import-linter layer)."""
    out = []
    packages = set(MAPPING.values())
    for name, path in _entries(root / "fsm"):
        if name in MAPPING or name in STAY or name in packages:
            continue
        layer = _fine_layer(root, name)
        neighbours = [t.strip() for t in layer.split("|")] if layer else []
        guess = next((MAPPING[n] for n in neighbours if n in MAPPING), None)
        rel = path.relative_to(root).as_posix()
        if guess:
            out.append(f"{rel} is not in scripts/relayout.py's MAPPING: add the line\n"
                       f'    "{name}": "{guess}",\n'
                       f"to MAPPING (its import-linter layer is {layer!r}, whose modules go to {guess}/)")
        else:
            choices = " | ".join(sorted(packages))
            out.append(f"{rel} is not in scripts/relayout.py's MAPPING: add the line\n"
                       f'    "{name}": "<package>",\n'
                       f"to MAPPING with <package> one of {choices}, the one whose modules share its layer in "
                       f"pyproject.toml's layers contract"
                       + ("" if layer else f" (add {name!r} to that contract too: it names no layer for it)"))
    return out


def layout_problems(root: Path) -> list[str]:
    """Why the tree is not in the new layout (empty when it is)."""
    fsm = root / "fsm"
    problems = unmapped(root)
    for name, pkg in MAPPING.items():
        old, new = _old_path(fsm, name), _new_path(fsm, name, pkg)
        if old is not None:
            problems.append(f"{old.relative_to(root).as_posix()} is still at the top of fsm/ (it belongs in {pkg}/)")
        elif new is None:
            problems.append(f"fsm/{pkg}/{name} is missing (MAPPING places {name!r} there)")
    for pkg in sorted(set(MAPPING.values())):
        if not (fsm / pkg / "__init__.py").is_file():
            problems.append(f"fsm/{pkg}/__init__.py is missing")
    init = (fsm / "__init__.py").read_text(encoding="utf-8")
    if ALIAS_BEGIN not in init or _alias_block() not in init:
        problems.append("fsm/__init__.py does not carry the current table of moved modules")
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    if PACKAGE_CONTRACT not in pyproject:
        problems.append("pyproject.toml has no contract for the layer packages")
    return problems


def _old_path(fsm: Path, name: str) -> Path | None:
    for p in (fsm / f"{name}.py", fsm / name):
        if p.exists():
            return p
    return None


def _new_path(fsm: Path, name: str, pkg: str) -> Path | None:
    return _old_path(fsm / pkg, name)


# --- rewriting references ------------------------------------------------------------------------


def _alternation(names: Iterable[str]) -> str:
    return "|".join(sorted(map(re.escape, names), key=len, reverse=True))


_NAMES = _alternation(MAPPING)
_DOTTED = re.compile(rf"(?<![\w.])agentfsm\.({_NAMES})(?!\w)")
# ``from agentfsm import a, b as c`` written in a string (code a test writes to a file) or in a document
_FROM_IMPORT = re.compile(r"\bfrom agentfsm import (\w+(?: as \w+)?(?:, *\w+(?: as \w+)?)*)")
_PATH = re.compile(rf"(?<![\w.-])fsm/(?:({_NAMES})(?=\.py\b)|(claude_code)(?=/|\b(?!\.)))")


def persisted_names(root: Path) -> frozenset[str]:
    """Names a run persists or a deployment registers, which must not change with the layout: every
    logger name (``get_logger("...")``) and every Temporal activity or workflow name
    (``defn(name="...")``) found in the source."""
    pattern = re.compile(r"""(?:get_logger|getLogger)\(\s*["']([\w.]+)["']|defn\(\s*name\s*=\s*["']([\w.]+)["']""")
    found: set[str] = set()
    for path in _files(root, PY_ROOTS, (".py",)):
        for a, b in pattern.findall(path.read_text(encoding="utf-8")):
            found.add(a or b)
    return frozenset(found)


def rewrite_text(text: str, persisted: frozenset[str] = frozenset()) -> str:
    """Rewrite module paths in free text (a string, a comment, a Markdown or TOML file): file paths
    ``fsm/<module>.py`` (and ``fsm/claude_code/``), dotted paths ``agentfsm.<module>`` — followed by
    ``.name`` or ``:name`` always, bare unless it is a persisted name (a logger or activity name) —
    and ``from agentfsm import <modules>`` when they all moved to one package."""

    def dotted(m: re.Match[str]) -> str:
        name = m.group(1)
        after = text[m.end():m.end() + 2]
        attribute = len(after) == 2 and after[0] in ".:" and (after[1].isalpha() or after[1] == "_")
        if not attribute and m.group(0) in persisted:
            return m.group(0)
        return f"agentfsm.{MAPPING[name]}.{name}"

    def path(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return f"fsm/{MAPPING[name]}/{name}"

    def from_import(m: re.Match[str]) -> str:
        names = [n.strip().split(" ")[0] for n in m.group(1).split(",")]
        packages = {MAPPING.get(n) for n in names}
        if len(packages) != 1 or None in packages:  # names that stay, or that went to several packages
            return m.group(0)
        return f"from agentfsm.{packages.pop()} import {m.group(1)}"

    text = _FROM_IMPORT.sub(from_import, text)
    return _PATH.sub(path, _DOTTED.sub(dotted, text))


def _new_module(dotted: str) -> str:
    """``agentfsm.<old>[.rest]`` -> its new dotted name (anything else unchanged)."""
    parts = dotted.split(".")
    if len(parts) >= 2 and parts[0] == "agentfsm" and parts[1] in MAPPING:
        return ".".join(["agentfsm", MAPPING[parts[1]], *parts[1:]])
    return dotted


def _dotted_expr(name: str) -> cst.Attribute | cst.Name:
    node: cst.Attribute | cst.Name = cst.Name(name.split(".")[0])
    for part in name.split(".")[1:]:
        node = cst.Attribute(value=node, attr=cst.Name(part))
    return node


def _has_file_dunder(node: cst.CSTNode) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            nonlocal found
            found = found or n.value == "__file__"

    node.visit(Finder())
    return found


class Rewriter(cst.CSTTransformer):
    """Rewrites one Python file's references to moved modules (see the module's docstring)."""

    def __init__(self, persisted: frozenset[str], moved: bool) -> None:
        self.persisted = persisted
        self.moved = moved  # this file is a module that moved one folder deeper

    # imports
    def leave_Import(self, original: cst.Import, updated: cst.Import) -> cst.Import:
        names = []
        for alias in updated.names:
            dotted = cst.helpers.get_full_name_for_node(alias.name) or ""
            new = _new_module(dotted)
            names.append(alias.with_changes(name=_dotted_expr(new)) if new != dotted else alias)
        return updated.with_changes(names=names)

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        if updated.module is None or updated.relative:
            return updated
        dotted = cst.helpers.get_full_name_for_node(updated.module) or ""
        new = _new_module(dotted)
        return updated.with_changes(module=_dotted_expr(new)) if new != dotted else updated

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
                                  ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        """``from agentfsm import a, b``: each moved name is imported from its package, one statement
        per package (the names that stay, from agentfsm as before)."""
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.ImportFrom):
            return updated
        imp = updated.body[0]
        if imp.relative or imp.module is None or cst.helpers.get_full_name_for_node(imp.module) != "agentfsm":
            return updated
        if isinstance(imp.names, cst.ImportStar):
            return updated
        groups: dict[str, list[cst.ImportAlias]] = {}
        for alias in imp.names:
            name = cst.helpers.get_full_name_for_node(alias.name) or ""
            module = f"agentfsm.{MAPPING[name]}" if name in MAPPING else "agentfsm"
            groups.setdefault(module, []).append(alias.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        if list(groups) == ["agentfsm"]:
            return updated
        lines = []
        for i, (module, aliases) in enumerate(groups.items()):
            stmt = cst.ImportFrom(module=_dotted_expr(module), names=aliases)
            lines.append(updated.with_changes(body=[stmt], leading_lines=updated.leading_lines if i == 0 else []))
        return cst.FlattenSentinel(lines)

    # agentfsm.<module>.<name> in code
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        if (isinstance(updated.value, cst.Name) and updated.value.value == "agentfsm"
                and updated.attr.value in MAPPING):
            return updated.with_changes(value=cst.Attribute(value=updated.value,
                                                            attr=cst.Name(MAPPING[updated.attr.value])))
        return updated

    # strings, docstrings, comments
    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        new = rewrite_text(updated.value, self.persisted)
        return updated.with_changes(value=new) if new != updated.value else updated

    def leave_FormattedStringText(self, original: cst.FormattedStringText, updated: cst.FormattedStringText
                                  ) -> cst.FormattedStringText:
        new = rewrite_text(updated.value, self.persisted)
        return updated.with_changes(value=new) if new != updated.value else updated

    def leave_Comment(self, original: cst.Comment, updated: cst.Comment) -> cst.Comment:
        new = rewrite_text(updated.value, self.persisted)
        return updated.with_changes(value=new) if new != updated.value else updated

    # REPO / "fsm" / "graph.py", site / "agentfsm" / "claude_code": a path built from parts
    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation
                              ) -> cst.BinaryOperation:
        if not isinstance(updated.operator, cst.Divide) or not isinstance(updated.right, cst.SimpleString):
            return updated
        name = updated.right.evaluated_value
        name = name.removesuffix(".py") if isinstance(name, str) else None
        left = updated.left.right if isinstance(updated.left, cst.BinaryOperation) else updated.left
        if name not in MAPPING or not isinstance(left, cst.SimpleString) or \
                left.evaluated_value not in ("fsm", "agentfsm"):
            return updated
        quote = updated.right.quote
        package = cst.SimpleString(f"{quote}{MAPPING[name]}{quote}")
        return updated.with_changes(left=cst.BinaryOperation(updated.left, cst.Divide(), package))

    # Path(__file__)...parents[N] in a module one folder deeper
    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.Subscript:
        if not self.moved or not isinstance(updated.value, cst.Attribute) or updated.value.attr.value != "parents":
            return updated
        if not _has_file_dunder(updated.value) or len(updated.slice) != 1:
            return updated
        index = updated.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer):
            bumped = index.with_changes(value=cst.Integer(str(int(index.value.value) + 1)))
            return updated.with_changes(slice=[updated.slice[0].with_changes(slice=bumped)])
        return updated


LINE_LENGTH = 120  # pyproject's [tool.ruff] line-length


def wrap_long_lines(source: str, limit: int = LINE_LENGTH, keep: frozenset[str] = frozenset()) -> str:
    """Break the lines a rewrite made longer than ``limit``, where a break changes nothing: after a
    comma inside brackets, inside a comment (the rest on a comment line of its own), inside a
    docstring at a space, or between two halves of a plain string inside brackets. Lines it cannot
    break safely are left for the lint to name. Lines in ``keep`` (the file's lines before the rewrite)
    and lines with a ``noqa`` are left as they are."""
    for _ in range(20):
        new = _wrap_once(source, limit, keep)
        if new == source:
            return source
        compile(new, "<relayout>", "exec")  # a break must never change what the file means
        source = new
    return source


def _wrap_once(source: str, limit: int, keep: frozenset[str]) -> str:
    lines = source.splitlines(keepends=True)
    long = {i + 1 for i, line in enumerate(lines)
            if len(line.rstrip("\r\n")) > limit and line not in keep and "noqa" not in line}
    if not long:
        return source
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    cuts: dict[int, tuple[int, str, int]] = {}  # line -> (column, text inserted, characters dropped)
    brackets: list[int] = []
    commas: dict[int, tuple[int, str]] = {}
    statement_start = True
    for tok in tokens:
        row, col = tok.start
        if tok.type == tokenize.OP and tok.string in "([{":
            brackets.append(tok.end[1])
        elif tok.type == tokenize.OP and tok.string in ")]}" and brackets:
            brackets.pop()
        elif (tok.type == tokenize.OP and tok.string == "," and brackets and row in long
              and tok.end[1] < limit and tok.end[1] < len(lines[row - 1].rstrip())):
            commas[row] = (tok.end[1], " " * brackets[-1])
        elif tok.type == tokenize.COMMENT and row in long and tok.end[1] > limit and row not in cuts:
            cut = lines[row - 1].rfind(" ", col + 2, limit)
            if cut > col + 2:
                whole_line = not lines[row - 1][:col].strip()
                indent = col if whole_line else len(lines[row - 1]) - len(lines[row - 1].lstrip())
                cuts[row] = (cut, "\n" + " " * indent + "# ", 1)
        elif tok.type == tokenize.STRING and tok.string.endswith(('"""', "'''")) and statement_start:
            for r in range(row, tok.end[0] + 1):
                if r in long and r not in cuts:
                    line = lines[r - 1]
                    start = col + 3 if r == row else len(line) - len(line.lstrip())
                    cut = line.rfind(" ", start + 1, limit)
                    if cut > start:
                        cuts[r] = (cut, "\n" + " " * (len(line) - len(line.lstrip())), 1)
        elif (tok.type == tokenize.STRING and brackets and row == tok.end[0] and row in long
              and tok.end[1] > limit and row not in cuts):
            prefix = tok.string[:len(tok.string) - len(tok.string.lstrip("rRbBuU"))]
            quote = tok.string[len(prefix)]
            cut = lines[row - 1].rfind(" ", col + len(prefix) + 1, limit - 1)
            if "f" not in prefix.lower() and "\\" not in tok.string and cut > col + len(prefix) + 1:
                cuts[row] = (cut + 1, f"{quote}\n{' ' * brackets[-1]}{prefix}{quote}", 0)
        statement_start = tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                                       tokenize.ENCODING) or (statement_start and tok.type == tokenize.COMMENT)
    for row, (col, indent) in commas.items():
        cuts.setdefault(row, (col, "\n" + indent, 1 if lines[row - 1][col:col + 1] == " " else 0))
    for row, (col, text, drop) in cuts.items():
        line = lines[row - 1]
        lines[row - 1] = line[:col] + text + line[col + drop:]
    return "".join(lines)


def _files(root: Path, tops: Sequence[str], suffixes: Sequence[str]) -> Iterator[Path]:
    for top in tops:
        base = root / top
        if base.is_file():
            if base.suffix in suffixes:
                yield base
            continue
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and p.suffix in suffixes and not SKIP_DIRS.intersection(p.relative_to(root).parts):
                yield p


def _text_files(root: Path) -> Iterator[Path]:
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).parts
        if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIP_DIRS.intersection(rel) and p.name != "pyproject.toml":
            yield p


def rewrite_python(root: Path, path: Path, persisted: frozenset[str], moved: bool = False) -> bool:
    """Rewrite one Python file (``moved``: it was just moved one folder deeper); True when it changed."""
    source = path.read_text(encoding="utf-8")
    if path == root / "fsm" / "__init__.py":
        # the alias table is written whole by _write_aliases; the rest is rewritten like any file
        head, sep, tail = source.partition(ALIAS_BEGIN)
        new = cst.parse_module(head).visit(Rewriter(persisted, False)).code + sep + tail if sep else \
            cst.parse_module(source).visit(Rewriter(persisted, False)).code
    else:
        new = cst.parse_module(source).visit(Rewriter(persisted, moved)).code
    if new != source:
        new = wrap_long_lines(new, keep=frozenset(source.splitlines(keepends=True)))
        path.write_text(new, encoding="utf-8")
        return True
    return False


def rewrite_pyproject(root: Path, persisted: frozenset[str]) -> bool:
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    head, sep, contracts = text.partition("[tool.importlinter]")
    # the contracts name modules: every one is rewritten, persisted names or not
    contracts = re.sub(rf'"agentfsm\.({_NAMES})((?:\.\w+)*)"',
                       lambda m: f'"agentfsm.{MAPPING[m.group(1)]}.{m.group(1)}{m.group(2)}"', contracts)

    def layer_line(m: re.Match[str]) -> str:
        tokens = [t.strip() for t in m.group(2).split("|")]
        return m.group(1) + " | ".join(f"{MAPPING[t]}.{t}" if t in MAPPING else t for t in tokens) + m.group(3)

    contracts = re.sub(r'(?m)^(\s*")([\w.| ]+)(",?\s*)$', layer_line, contracts)
    head = rewrite_text(head, persisted)
    packages = [f"agentfsm.{p}" for p in dict.fromkeys(MAPPING.values())]

    def add_packages(m: re.Match[str]) -> str:
        listed = re.findall(r'"([\w.]+)"', m.group(0))
        missing = [p for p in packages if p not in listed]
        if not missing:
            return m.group(0)
        return m.group(0).replace('"agentfsm",', '"agentfsm", ' + ", ".join(f'"{p}"' for p in missing) + ",", 1)

    head = re.sub(r"(?ms)^packages = \[.*?\]", add_packages, head, count=1)
    new = head + sep + contracts
    if sep and PACKAGE_CONTRACT not in new:
        layers = "".join(f'    "{layer}",\n' for layer in PACKAGE_LAYERS)
        new = new.rstrip("\n") + (
            "\n\n[[tool.importlinter.contracts]]\n"
            f'name = "{PACKAGE_CONTRACT}"\n'
            'type = "layers"\n'
            'containers = ["agentfsm"]\n'
            f"layers = [\n{layers}]\n")
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def rewrite_mutation(root: Path) -> bool:
    """bench/mutation.toml lists every Python file outside the campaign: the new packages' markers."""
    path = root / "bench" / "mutation.toml"
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    anchor = '"fsm/__init__.py" = '
    if anchor not in text:
        return False
    lines = [f'"fsm/{p}/__init__.py" = "a layer package (scripts/relayout.py): its docstring only"'
             for p in dict.fromkeys(MAPPING.values()) if f'"fsm/{p}/__init__.py"' not in text]
    if not lines:
        return False
    start = text.index(anchor)
    end = text.index("\n", start) + 1
    path.write_text(text[:end] + "\n".join(lines) + "\n" + text[end:], encoding="utf-8")
    return True


def _alias_block() -> str:
    table = "".join(f'    "{name}": "{pkg}",\n' for name, pkg in MAPPING.items())
    return f'''{ALIAS_BEGIN}
# The modules that moved into the layer packages (scripts/relayout.py), by their old name: the old
# path stays importable, as the moved module itself (one module object under both names), with a
# DeprecationWarning that names the new path.
_MOVED: dict[str, str] = {{
{table}}}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``agentfsm.<old>[.sub]`` for a moved module and loads it as the module at its new path."""

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec] = {{}}

    @staticmethod
    def new_name(name: str) -> str | None:
        parts = name.split(".")
        if len(parts) < 2 or parts[0] != __name__ or parts[1] not in _MOVED:
            return None
        return ".".join([parts[0], _MOVED[parts[1]], *parts[1:]])

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if self.new_name(name) else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        new = self.new_name(spec.name)
        warnings.warn(f"{{spec.name}} moved to {{new}}: import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(str(new))
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        """The module is the moved one, already executed; it keeps its own spec (the import system
        gave it the old name's)."""
        module.__spec__ = self.specs.pop(module.__spec__.name, module.__spec__)



if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
{ALIAS_END}
'''


def write_aliases(root: Path) -> bool:
    path = root / "fsm" / "__init__.py"
    text = path.read_text(encoding="utf-8")
    block = _alias_block()
    if ALIAS_BEGIN in text:
        start = text.index(ALIAS_BEGIN)
        end = text.index(ALIAS_END, start) + len(ALIAS_END) + 1
        new = text[:start] + block + text[end:]
    else:
        new = text.rstrip("\n") + "\n\n\n" + block
    for module in ("importlib.abc", "importlib.machinery", "importlib.util", "sys", "warnings"):
        if not re.search(rf"(?m)^import {re.escape(module)}$", new):
            new = new.replace("\nimport importlib\n", f"\nimport importlib\nimport {module}\n", 1)
    # an old name read as an attribute (``agentfsm.graph`` after ``import agentfsm``) imports it the same way
    getattr_hook = (
        "    if name in _MOVED:  # an old module path read as an attribute (scripts/relayout.py)\n"
        "        new = f\"{__name__}.{_MOVED[name]}.{name}\"\n"
        "        warnings.warn(f\"{__name__}.{name} moved to {new}: import it from there\", DeprecationWarning,\n"
        "                      stacklevel=2)\n"
        "        module = sys.modules.setdefault(f\"{__name__}.{name}\", importlib.import_module(new))\n"
        "        globals()[name] = module\n"
        "        return module\n")
    if getattr_hook not in new:
        new = new.replace("    module = _EXPORTS.get(name)\n", getattr_hook + "    module = _EXPORTS.get(name)\n", 1)
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


# --- moving ----------------------------------------------------------------------------------------


def move(root: Path) -> list[tuple[Path, Path]]:
    """Move each mapped module into its package (creating the packages); what was moved, from where to
    where (a second run moves nothing)."""
    fsm = root / "fsm"
    done = []
    for pkg, doc in PACKAGE_DOCS.items():
        init = fsm / pkg / "__init__.py"
        if not init.exists():
            init.parent.mkdir(exist_ok=True)
            init.write_text(f'"""{doc}"""\n', encoding="utf-8")
    for name, pkg in MAPPING.items():
        old, new = _old_path(fsm, name), _new_path(fsm, name, pkg)
        if old is None:
            continue
        if new is not None:
            raise LayoutError(f"both {old.relative_to(root)} and {new.relative_to(root)} exist; keep one")
        target = fsm / pkg / old.name
        shutil.move(str(old), str(target))
        done.append((old, target))
    return done


def _ruff() -> str | None:
    here = Path(sys.executable).parent / "ruff"
    return str(here) if here.exists() else shutil.which("ruff")


def relayout(root: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Move and rewrite the tree at ``root``; the files that changed."""
    missing = unmapped(root)
    if missing:
        raise LayoutError("\n".join(missing))
    persisted = persisted_names(root)
    moved = move(root)
    for old, new in moved:
        log(f"moved {old.relative_to(root).as_posix()} -> {new.relative_to(root).as_posix()}")
    deeper = [new for _, new in moved]  # files here are one folder deeper than before this run
    changed: list[Path] = []
    for path in _files(root, PY_ROOTS, (".py",)):
        if rewrite_python(root, path, persisted, moved=any(path == d or d in path.parents for d in deeper)):
            changed.append(path)
    for path in _text_files(root):
        text = path.read_text(encoding="utf-8")
        new = rewrite_text(text, persisted)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    if rewrite_pyproject(root, persisted):
        changed.append(root / "pyproject.toml")
    if rewrite_mutation(root):
        changed.append(root / "bench" / "mutation.toml")
    if write_aliases(root):
        changed.append(root / "fsm" / "__init__.py")
    py = sorted({str(p) for p in changed if p.suffix == ".py"})
    if py:
        ruff = _ruff()
        if ruff is None:
            raise LayoutError("ruff is needed to sort the rewritten imports: pip install ruff")
        # the rewritten imports sort differently (and a longer one wraps): ruff's isort puts them back
        subprocess.run([ruff, "check", "--select", "I", "--fix", "--quiet", *py], cwd=root, check=False,
                       capture_output=True)
    for path in sorted(set(changed)):
        log(f"rewrote {path.relative_to(root).as_posix()}")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the repository (default: this script's)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 unless in the new layout")
    parser.add_argument("--plan", action="store_true", help="print where each module goes")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if args.plan:
        for name, pkg in MAPPING.items():
            print(f"fsm/{name} -> fsm/{pkg}/{name}")
        return 0
    if args.check:
        problems = layout_problems(root)
        for p in problems:
            print(p)
        if problems:
            print(f"{len(problems)} problem(s): run python scripts/relayout.py")
        return 1 if problems else 0
    try:
        changed = relayout(root)
    except LayoutError as e:
        print(e, file=sys.stderr)
        return 2
    left = layout_problems(root)
    for p in left:
        print(p, file=sys.stderr)
    if changed:
        print("\nnext: pip install -e '.[test]' (the new packages), then agentfsm diagram (the diagrams name the "
              "graph's module), then ruff check . and the tests")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
