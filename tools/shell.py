"""Shell command lines, parsed: the programs a command runs and the files it reads and writes.

One entry point, :func:`analyse`, turns a command into an :class:`Analysis`: every simple command bash
would run (in pipelines, lists, subshells, groups, loop and function bodies, ``$(…)``, backticks,
``<(…)``, heredoc bodies, ``${x:-$(…)}``, array subscripts, and shell code handed to ``bash -c``,
``eval``, ``env -S``, ``xargs``, ``find -exec``…), each with its words where they are static, the
paths it reads and writes, and — the part a permission check must never ignore — the reasons it
could *not* be followed (a command name that is a variable, a shell reading code from a pipe, a parse
error, a construct the parser does not model). The permission rules and Bash's read-only classifier
decide from this record only, so a spelling the analysis cannot see through is a spelling they refuse
to vouch for.

The parser is tree-sitter-bash (linear in the input, no recursion limit, never raises; errors become
``ERROR``/``MISSING`` nodes). Three traps of its Python binding are avoided on purpose: the source is
fed through the read callback in chunks (``parse(bytes)`` holds the GIL for the whole parse, freezing
the event loop's thread on a long command); the tree is walked with an explicit stack carrying each
node's context (``Node.parent`` searches from the root, which made a naive walk quadratic); and a
tree of untrusted input is never turned into a string (``str()`` of a 100 000-deep tree crashed the
interpreter). And the grammar's own scanner reads past glibc's ``isdigit`` table when a ``{`` is followed
by a character above U+00FF (an out-of-bounds read that segfaults the process at random, found by
the property tests), so the parser is handed a copy with every non-ASCII byte masked as the letter
``a`` — same length, same offsets, and to bash a non-ASCII byte is an ordinary word character anyway
— while every word is still read from the original bytes. Four fidelity checks turn what the grammar
silently misreads (backticks inside ``${…}`` or heredocs, ``<<-`` bodies, a backslash-newline inside
a word, ``time { …; }``) into "cannot analyse".

The analysis itself is pure: it reads neither the disk nor the environment (``home`` is passed in),
so it can be memoised; globs are kept as patterns for the caller to expand when it decides.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from typing import Literal

import attrs
import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from agentfsm.tools import shell_files as files
from agentfsm.tools import shell_programs as programs
from agentfsm.tools.shell_words import (
    GLOB_CHARS,
    NOT_STATIC,
    SPLITS,
    Word,
    escape,
    has_unescaped,
    node_text,
    unescape,
    word_value,
)

#: Longer commands are not analysed at all (they are "too long to analyse": never auto-allowed, and
#: denied when a deny rule could apply). Analysis is linear, about 5-12 µs a byte (bench/shell_check.py).
MAX_COMMAND_BYTES = 128 * 1024
#: Shell code inside shell code (``bash -c "bash -c '…'"``, ``eval``) is followed this deep.
MAX_SHELL_DEPTH = 8
#: Syntax nodes visited over one analysis, re-parsed shell code included.
MAX_NODES = 2_000_000
#: A command's own text is kept for rule matching up to this length (longer ones match by argv).
MAX_PART_TEXT = 8192
#: Longer shell code is first checked with ``bash -n`` (bash's own parser, linear): tree-sitter's error
#: recovery is super-linear on some broken input (a 120 KB pipeline without its last command took 20 s),
#: and code bash rejects runs nothing anyway.
PRECHECK_BYTES = 16 * 1024
_CHUNK = 4096
#: Every byte above 0x7F becomes ``a`` for the parser (see the module's notes): the scanner then never
#: hands a code point above 0x7F to a ``<ctype.h>`` function.
_ASCII_MASK = bytes(range(128)) + b"a" * 128

Access = Literal["read", "write"]
_LANGUAGE = Language(tree_sitter_bash.language())


@attrs.frozen
class Command:
    """One simple command. ``argv`` is what runs after wrappers were peeled off (``env``, ``sudo``,
    ``timeout``, ``bash -c``…): the program first, ``None`` for a word that is not static (it holds
    an expansion or substitution, and an unquoted one may split into any number of words). ``via``
    names the wrappers, outermost first. ``text`` is the command as written, with its redirections,
    when it is at most :data:`MAX_PART_TEXT` characters long (else None)."""

    argv: tuple[str | None, ...]
    via: tuple[str, ...] = ()
    text: str | None = None
    # a command as written in the top-level command line (not run through a wrapper, not shell code
    # re-parsed from an argument): what allow rules must each cover
    part: bool = True
    # the argv's words (quoting, globs and braces kept) and the directories, relative to where the
    # command line runs, a `cd` before it may have moved to (None: not known): what
    # :func:`operand_paths` needs to place an operand a table names (agentfsm.hooks.bash_boundary)
    argv_words: tuple[Word, ...] = attrs.field(default=(), eq=False, repr=False)
    bases: tuple[str, ...] | None = attrs.field(default=(".",), eq=False, repr=False)
    # one of the commands of a pipeline (`a | b`): Claude Code's approval text names it as a part
    pipeline: bool = attrs.field(default=False, eq=False, repr=False)

    @property
    def program(self) -> str | None:
        """The program's base name (``/usr/bin/rm`` → ``rm``), None when its name is not static."""
        head = self.argv[0] if self.argv else None
        return None if head is None else programs.base_name(head)

    @property
    def static(self) -> bool:
        return None not in self.argv

    def words(self) -> str:
        """The argv for messages: ``?`` stands for a word that is not static."""
        return " ".join("?" if w is None else w for w in self.argv)


@attrs.frozen
class PathUse:
    """A file the command reads or writes. ``path`` is absolute, as the kernel receives it: ``.`` and
    repeated slashes dropped, ``..`` kept — folding ``a/link/..`` on the text names ``a``, while the
    kernel follows ``link`` first (:func:`agentfsm.hooks.file_access.spellings` resolves it the
    kernel's way) — or None when it is not static; ``glob`` marks a pattern (backslash escapes, bash's dialect)
    to expand against the disk; ``recursive``: everything below a directory (``grep -r``, ``cp -r``,
    ``find -delete``)."""

    path: str | None
    access: Access
    why: str
    recursive: bool = False
    glob: bool = False
    creates: bool = False  # files named after something else appear below it (see shell_files.Use)


@attrs.frozen
class Analysis:
    """What :func:`analyse` found. ``opaque``: reasons the command may run code the analysis cannot
    see (any program, any file); ``environment``: reasons it may print environment variables (a
    secret among them) — ``env``, ``printenv``, ``$VAR``, ``/proc/*/environ``."""

    commands: tuple[Command, ...] = ()
    paths: tuple[PathUse, ...] = ()
    opaque: tuple[str, ...] = ()
    environment: tuple[str, ...] = ()
    redirects_output: bool = False
    background: bool = False  # a job is started with `&`: it may outlive the call
    assigns: bool = False  # a variable is set (for the shell, or in a command's environment)

    @property
    def complete(self) -> bool:
        """Every program and every path is known."""
        return not self.opaque and all(p.path is not None for p in self.paths) and all(
            c.program is not None for c in self.commands)

    def reads(self) -> Iterator[PathUse]:
        return (p for p in self.paths if p.access == "read")

    def writes(self) -> Iterator[PathUse]:
        return (p for p in self.paths if p.access == "write")


def analyse(command: str, cwd: str, home: str | None = None) -> Analysis:
    """The :class:`Analysis` of ``command`` run in ``cwd`` (``home`` expands ``~``; default $HOME).
    Memoised: the permission check, the read-only classifier and the concurrency verdict of one call
    all ask for the same command."""
    return _analyse(command, os.path.normpath(str(cwd)), home if home is not None else os.path.expanduser("~"))


@functools.lru_cache(maxsize=256)
def _analyse(command: str, cwd: str, home: str) -> Analysis:
    return _walked(command, home).result(cwd)


@functools.lru_cache(maxsize=64)
def _walked(command: str, home: str) -> _Walker:
    """The walk of ``command`` (independent of the directory it runs in: paths stay relative until
    :meth:`_Walker.result` places them), shared by every cwd it is judged for."""
    walker = _Walker(home)
    walker.run(command, 0)
    return walker


def parse(source: bytes) -> Node:
    """The syntax tree of ``source``, parsed in chunks through the read callback so the GIL is
    released between them. The tree's offsets are ``source``'s; its text is read from ``source``, never
    from the tree (the parser sees a copy with non-ASCII bytes masked)."""
    parser = Parser(_LANGUAGE)
    masked = source.translate(_ASCII_MASK)

    def read(offset: int, _point: object) -> bytes:
        return masked[offset:offset + _CHUNK]

    return parser.parse(read).root_node


def bash_accepts(source: bytes) -> bool:
    """Whether bash parses ``source`` (``bash -n``: read, never run). False when bash is missing or
    does not answer in time: the caller then treats the command as one it cannot analyse."""
    shell = shutil.which("bash")
    if shell is None:
        return False
    try:
        done = subprocess.run([shell, "--norc", "--noprofile", "-n"], input=source, capture_output=True,
                              timeout=10, env={"PATH": os.defpath, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


# --- the walk --------------------------------------------------------------------------------------

RESERVED = frozenset({"if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until",
                      "do", "done", "in", "function", "{", "}", "!", "[[", "]]"})
_TEXT_NODES = frozenset({"word", "string_content", "heredoc_content", "regex", "extglob_pattern"})
_HIDDEN_CODE = ("`", "$(", "<(", ">(")
_HIDDEN_CODE_BYTES = tuple(m.encode() for m in _HIDDEN_CODE)
_SUBSCRIPT_CODE = re.compile(rb"\[[^\]]*[$`]")
_ARITH_TEST = re.compile(rb"\s-(eq|ne|lt|le|gt|ge)\s")
_SPECIAL_FILES = re.compile(r"^/dev/(null|stdout|stderr|stdin|tty|zero|u?random|full|fd/\d+)$")
_ENVIRON = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?environ$")
_MAX_BASES = 16


@attrs.define
class _Frame:
    """A node on the walk's stack with its context: the node above it, whether the command reads a
    pipe, whether it sits in an arithmetic context."""

    node: Node
    parent: Node | None
    piped: bool
    arith: bool
    pipeline: bool = False  # an element of a pipeline (`a | b`), itself or redirected


class _Walker:
    def __init__(self, home: str) -> None:
        self.home = home
        self.commands: list[Command] = []
        # (raw path, access, why, recursive, glob, creates)
        self.uses: list[tuple[str | None, Access, str, bool, bool, bool]] = []
        self.opaque: list[str] = []
        self.environment: list[str] = []
        self.redirects_output = False
        self.background = False
        self.assigns = False
        self.nodes = 0
        # directories a `cd` in the command may have moved to (relative to where it runs, unless a
        # `cd` named an absolute one): relative paths are checked against each
        self.bases: list[str] = ["."]
        self.bases_unknown = False
        # the directories a CDPATH set in the command names (a relative `cd` may land below any)
        self.cdpath: list[str] = []

    # -- results

    def bad(self, why: str) -> None:
        if why not in self.opaque:
            self.opaque.append(why)

    def env(self, why: str) -> None:
        if why not in self.environment:
            self.environment.append(why)

    def result(self, cwd: str) -> Analysis:
        """The analysis for the command run in ``cwd``."""
        uses: list[PathUse] = []
        seen: set[tuple[str | None, Access, bool, bool, bool]] = set()
        for raw, access, why, recursive, is_glob, creates in self.uses:
            for path in self._resolve(raw, cwd, is_glob):
                key = (path, access, recursive, is_glob, creates)
                if key not in seen:
                    seen.add(key)
                    uses.append(PathUse(path, access, why, recursive, is_glob, creates))
        return Analysis(tuple(self.commands), tuple(uses), tuple(self.opaque), tuple(self.environment),
                        self.redirects_output, self.background, self.assigns)

    def _resolve(self, raw: str | None, cwd: str, is_glob: bool) -> list[str | None]:
        if raw is None:
            return [None]
        if raw.startswith("/"):
            return [kernel_path(raw)]
        if self.bases_unknown:
            return [None]
        out: list[str | None] = []
        for base in self.bases:
            where = kernel_path(os.path.join(cwd, base))
            # a glob is a pattern: the directory it is joined to must not add wildcards of its own
            out.append(kernel_path(os.path.join(escape(where) if is_glob else where, raw)))
        return out

    # -- parsing

    def run(self, command: str, depth: int) -> None:
        if depth > MAX_SHELL_DEPTH:
            self.bad("shell code nested too deeply")
            return
        if len(command) > MAX_COMMAND_BYTES:
            self.bad(f"command longer than {MAX_COMMAND_BYTES // 1024} KB")
            return
        command = self._join_continuations(command)
        src = command.encode("utf-8", "surrogateescape")
        if len(src) > PRECHECK_BYTES and not bash_accepts(src):
            self.bad("bash does not parse the command")
            return
        root = parse(src)
        if root.has_error:
            self.bad("the command does not parse")
        self._walk(root, src, depth)

    def _join_continuations(self, command: str) -> str:
        """Bash drops backslash-newline before it splits words; tree-sitter splits a word there. After
        whitespace (``cmd \\``) dropping it first changes nothing; inside a word the grammar would
        misread it."""
        if "\\\n" not in command:
            return command
        if _CONTINUATION_IN_WORD.search(command.replace("\\\\", "")):
            self.bad("a line continuation inside a word")
        return re.sub(r"(?<=[ \t])\\\n", "", command)

    def _walk(self, root: Node, src: bytes, depth: int) -> None:
        stack = [_Frame(root, None, False, False)]
        while stack:
            self.nodes += 1
            if self.nodes > MAX_NODES:
                self.bad("command too complex to analyse")
                return
            f = stack.pop()
            n = f.node
            t = n.type
            if t == "ERROR" or n.is_missing:
                self.bad("the command does not parse")
            elif t in ("&", "|&") and not n.is_named:
                self.background = self.background or t == "&"
            if (t in _TEXT_NODES or (t == "heredoc_body" and not _quoted_heredoc(f.parent, src))) and any(
                    m in src[n.start_byte:n.end_byte] for m in _HIDDEN_CODE_BYTES):
                if any(m in _own_text(n, src) for m in _HIDDEN_CODE):
                    self.bad("a command substitution the parser did not expose")
            if f.arith and t in ("variable_name", "simple_expansion", "expansion"):
                # arithmetic evaluates a variable's *text*: a value of a[$(cmd)] runs cmd
                self.bad("arithmetic on a variable's value (it may run code)")
            if t in ("simple_expansion", "expansion"):
                self.env("a variable in this command can't be checked before it runs")
                if t == "expansion" and src[n.start_byte:n.start_byte + 3] == b"${!":
                    # ${!name} looks up a name held in a variable: a[$(cmd)] there runs cmd
                    self.bad("an indirect expansion evaluates a name it reads at run time")
            elif t == "subscript":
                index = n.child_by_field_name("index")
                if index is not None and re.search(rb"[A-Za-z_$`]", src[index.start_byte:index.end_byte]):
                    # an index is arithmetic: it evaluates a variable's text, and a[$(cmd)] there runs cmd
                    self.bad("an array subscript evaluates a variable's value (it may run code)")
            if t == "command":
                self._command(n, src, depth, f)
            elif t in ("declaration_command", "unset_command"):
                self._declaration(n, src, depth)
            elif t == "variable_assignment":
                self._assignment(n, src)
            elif t == "file_redirect":
                self._redirect(n, src)
            elif t == "test_command" and b"-v" in src[n.start_byte:n.end_byte] and (
                    _SUBSCRIPT_CODE.search(src[n.start_byte:n.end_byte]) or _has_expansion(n)):
                self.bad("[[ -v ]] on a variable name with a subscript that runs code")
            elif t == "redirected_statement":
                body = n.child_by_field_name("body")
                if (body is None or body.type != "command") and any(
                        len(r.children_by_field_name("destination")) > 1 for r in _redirects_of(n)):
                    self.bad("words after the redirection of a compound command")
            arith = f.arith or t == "arithmetic_expansion" or (
                t == "compound_statement" and src[n.start_byte:n.start_byte + 2] == b"((") or (
                t == "test_command" and _ARITH_TEST.search(src[n.start_byte:n.end_byte]) is not None)
            if t in ("command_substitution", "process_substitution"):
                arith = False
            kids = n.children
            if t == "pipeline":
                first = next((k for k in kids if k.is_named), None)
                frames = [_Frame(k, n, k is not first and k.is_named, arith, k.is_named) for k in kids]
            elif t == "redirected_statement":
                frames = [_Frame(k, n, f.piped, arith, f.pipeline) for k in kids]
            else:
                frames = [_Frame(k, n, False, arith) for k in kids]
            stack.extend(reversed(frames))

    # -- nodes

    def _assignment(self, n: Node, src: bytes) -> None:
        name = n.child_by_field_name("name")
        if name is not None:
            var = node_text(src, name)
            self.assigns = True
            if programs.code_variable(var):
                self.bad(f"assigning {var} may make a program run code")
            if var == "CDPATH":
                self._cdpath(n, src)
        value = n.child_by_field_name("value")
        if value is not None and _SUBSCRIPT_CODE.search(src[value.start_byte:value.end_byte]):
            # a[$(cmd)] as a value: bash runs cmd wherever the value is used as a name or a number
            self.bad("a value holding a subscript that runs code")

    def _cdpath(self, n: Node, src: bytes) -> None:
        """Note the directories of a CDPATH assignment (``CDPATH=secrets cd vault`` lands in
        secrets/vault); one that is not static leaves every later relative path unknown."""
        value = n.child_by_field_name("value")
        text = word_value(value, src).text if value is not None else ""
        if text is None:
            self.bases_unknown = True
            return
        self.cdpath = list(dict.fromkeys([*self.cdpath, *(d or "." for d in text.split(":"))]))

    def _redirect(self, n: Node, src: bytes) -> None:
        op = next((node_text(src, c) for c in n.children if not c.is_named and c.type != "ERROR"), "")
        dest = n.child_by_field_name("destination")
        if dest is None:
            return
        if op in (">&", "<&") and re.fullmatch(r"\d+-?|-", node_text(src, dest)):
            return  # duplicating or closing a descriptor
        value = word_value(dest, src)
        if op.startswith("<") and op != "<>":
            accesses: tuple[Access, ...] = ("read",)
        elif op == "<>":
            accesses = ("read", "write")
        else:
            accesses = ("write",)
            self.redirects_output = True
        for access in accesses:
            self.path(value, access, f"redirection {op}")

    def path(self, value: Word | None, access: Access, why: str, recursive: bool = False,
             creates: bool = False) -> None:
        """Record a file operand (None, or a word that is not static: an unknown path)."""
        for text, is_glob in word_paths(value, self.home):
            if text is not None and not is_glob and text.startswith("/") and _ENVIRON.match(_normpath(text)):
                self.env("accesses /proc/*/environ, which may expose secrets")
            self.uses.append((text, access, why, recursive, is_glob, creates))

    def _tilde(self, text: str) -> str | None:
        return _tilde(text, self.home)

    def _bases(self) -> tuple[str, ...] | None:
        return None if self.bases_unknown else tuple(self.bases)

    def _declaration(self, n: Node, src: bytes, depth: int) -> None:
        words: list[Word] = []
        for c in n.children:
            if not c.is_named:
                words.append(Word.literal(node_text(src, c)))  # export, declare, local, readonly, typeset, unset
            elif c.type == "variable_assignment":
                words.append(NOT_STATIC if _has_expansion(c) else Word.literal(node_text(src, c)))
            elif c.type == "variable_name":
                words.append(Word.literal(node_text(src, c)))
            else:
                words.append(word_value(c, src))
        if words:
            self.simple(words, (), _part_text(n, src), depth, None)

    def _command(self, n: Node, src: bytes, depth: int, f: _Frame) -> None:
        words: list[Word] = []
        for c in n.named_children:
            t = c.type
            name = c.child_by_field_name("name") if t == "variable_assignment" else None
            if name is not None and node_text(src, name) == "CDPATH":
                self._cdpath(c, src)  # before the command runs: `CDPATH=… cd` is read by this cd
            if t in ("variable_assignment", "file_redirect", "herestring_redirect", "heredoc_redirect", "subscript"):
                continue
            if t == "command_name":
                words.append(word_value(c.named_children[0], src) if c.named_children else SPLITS)
            else:
                words.append(word_value(c, src))
        if any(c.type == "$" for c in n.children if not c.is_named):
            words.append(NOT_STATIC)  # a lone `$` before a string: what it joins is unclear
        words += [word_value(w, src) for w in _words_after_redirects(n, f.parent)]
        if not words:
            return
        whole = f.parent if f.parent is not None and f.parent.type == "redirected_statement" else n
        self.simple(words, (), _part_text(whole, src), depth, self._stdin(n, src, f), pipeline=f.pipeline)

    def _stdin(self, n: Node, src: bytes, f: _Frame) -> programs.Stdin:
        """What the command reads on standard input: static text (a here-string, or a heredoc whose
        body is not expanded), something else (a pipe, a file, an expanded heredoc), or nothing."""
        redirects = list(n.named_children)
        if f.parent is not None and f.parent.type == "redirected_statement":
            redirects += f.parent.named_children
        for c in redirects:
            if c.type == "herestring_redirect":
                value = word_value(c.named_children[-1], src, quoted=True) if c.named_children else NOT_STATIC
                return programs.Stdin("static", value.text + "\n") if value.text is not None else programs.PIPED
            if c.type == "heredoc_redirect":
                body = next((b for b in c.named_children if b.type == "heredoc_body"), None)
                if body is None:
                    return programs.Stdin("static", "")
                if _quoted_heredoc(c, src) or not body.named_children:
                    return programs.Stdin("static", node_text(src, body))
                return programs.PIPED
            if c.type == "file_redirect" and node_text(src, c).lstrip("0").startswith("<"):
                return programs.PIPED
        return programs.PIPED if f.piped else programs.TERMINAL

    # -- one simple command, then what it runs in turn

    def simple(self, words: Sequence[Word], via: tuple[str, ...], text: str | None, depth: int,
               stdin: programs.Stdin | None, *, pipeline: bool = False) -> None:
        """Record ``words`` (run through the wrappers ``via``) and follow what it runs in turn."""
        if not words:
            return
        argv = tuple(w.text for w in words)
        part = depth == 0 and not via
        head = argv[0]
        if head is None:
            self.commands.append(Command(argv, via, text, part, tuple(words), self._bases(), pipeline))
            self.bad("the command name is not static (a variable, substitution or expansion)")
            return
        if words[0].glob or words[0].braces:
            self.bad("the command name is a glob or brace expansion")
        program = programs.base_name(head)
        if program in RESERVED:
            self.bad(f"the reserved word {program!r} where a command name belongs")
        self.commands.append(Command(argv, via, text, part, tuple(words), self._bases(), pipeline))
        if program in programs.ENVIRONMENT_PRINTERS and programs.prints_environment(program, argv[1:]):
            self.env(f"{program} prints the environment")
        if program in programs.NAME_EVALUATORS:
            hidden = programs.evaluates_code_in_names(program, argv[1:])
            if hidden is not None:
                self.bad(hidden)
        args = words[1:]
        inner = programs.unwrap(program, args, stdin or programs.TERMINAL)
        if inner is None:
            for where in files.working_directories(program, args):
                self._cd("cd", (where.text,))
                self.path(where, "read", f"{program} runs in this directory", recursive=True)
            effects = files.file_effects(program, args)
            for use in effects.uses:
                self.path(use.value, use.access, use.why, use.recursive, use.creates)
            for reason in effects.opaque:
                self.bad(reason)
            for code in effects.shell_code:
                self.run(code, depth + 1)
            if program in ("cd", "pushd", "popd"):
                self._cd(program, argv[1:])
            if program in ("source", ".") and args:
                self.path(args[0], "read", program)
            return
        for use in inner.uses:
            self.path(use.value, use.access, use.why, use.recursive, use.creates)
        if inner.chdir is not None:
            self._cd("cd", (inner.chdir.text,))
            # a program run in a directory (env -C, git -C, make -C, tar -C) may read below it
            self.path(inner.chdir, "read", f"{program} runs in this directory", recursive=True)
        if inner.kind == "argv":
            for inner_argv in inner.argvs:
                self.simple(inner_argv, (*via, program), text, depth, inner.stdin or stdin, pipeline=pipeline)
        elif inner.kind == "shell":
            if inner.code is None:
                self.bad(f"{program} runs shell code that is not static")
            else:
                self.run(inner.code, depth + 1)
        else:
            self.bad(inner.reason)

    def _cd(self, program: str, args: Sequence[str | None]) -> None:
        operands = [a for a in args if a is None or not a.startswith("-")]
        if program == "popd" or (operands and operands[0] in (None, "-")):
            self.bases_unknown = True
            return
        # `cd` folds `..` on the text (bash's -L, the default); `cd -P` resolves links first, as the
        # kernel does: the base then keeps its `..` for the checker to resolve
        physical = any(a is not None and a.startswith("-") and "P" in a and a != "--" for a in args)
        target = operands[0] if operands else self.home
        assert target is not None
        if target.startswith("~"):
            expanded = self._tilde(target)
            if expanded is None:
                self.bases_unknown = True
                return
            target = expanded
        fold = kernel_path if physical else _normpath
        # a relative name that does not start with . or .. is looked up in CDPATH's directories first
        via = self.cdpath if not target.startswith(("/", "./", "../")) and target not in (".", "..") else []
        new = {fold(os.path.join(b, d, target)) for b in self.bases for d in ["", *via]}
        self.bases = list(dict.fromkeys([*self.bases, *sorted(new)]))
        if len(self.bases) > _MAX_BASES:
            self.bases_unknown = True


# --- helpers ---------------------------------------------------------------------------------------


def _tilde(text: str, home: str) -> str | None:
    head, sep, rest = text.partition("/")
    if head != "~":
        return None  # ~user: whose home that is is not the analysis' business
    home = home.replace("\\", "\\\\")
    return f"{home}/{rest}" if sep else home


def word_paths(value: Word | None, home: str, *, special: bool = False) -> list[tuple[str | None, bool]]:
    """The paths a file operand names, as (text — None when not known —, is a glob pattern): one per
    brace alternative, ``~`` expanded, the special files (``/dev/null``…) left out unless ``special``."""
    if value is None or value.text is None or value.pattern is None:
        return [(None, False)]
    out: list[tuple[str | None, bool]] = []
    for alt in value.alternatives():
        is_glob = has_unescaped(alt, GLOB_CHARS)
        if alt.startswith("~"):
            expanded = _tilde(alt, home)
            if expanded is None:
                out.append((None, False))
                continue
            alt = expanded
        text = alt if is_glob else unescape(alt)
        if not special and not is_glob and _SPECIAL_FILES.match(text):
            continue
        out.append((text, is_glob))
    return out


def operand_paths(command: Command, index: int, cwd: str, home: str | None = None) -> list[tuple[str | None, bool]]:
    """The absolute paths (as the kernel receives them, ``..`` kept; None when not known) that word
    ``index`` of ``command``'s argv names when the command line runs in ``cwd``, each with whether it
    is a glob pattern: relative to every directory a ``cd`` before it may have moved to."""
    if index >= len(command.argv_words):
        return [(None, False)]
    out: list[tuple[str | None, bool]] = []
    home = home if home is not None else os.path.expanduser("~")
    for text, is_glob in word_paths(command.argv_words[index], home, special=True):
        if text is None or (not text.startswith("/") and command.bases is None):
            out.append((None, False))
        elif text.startswith("/"):
            out.append((kernel_path(text), is_glob))
        else:
            for base in command.bases or ():
                where = kernel_path(os.path.join(os.path.normpath(cwd), base))
                out.append((kernel_path(os.path.join(escape(where) if is_glob else where, text)), is_glob))
    return out

_CONTINUATION_IN_WORD = re.compile(r"(?<![\s\\])\\\n")


def _normpath(path: str) -> str:
    out = os.path.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def kernel_path(path: str) -> str:
    """``path`` as the kernel reads it, without the disk: repeated slashes and ``.`` dropped, ``..``
    kept (only the disk can say what it leads to: the parent of a symlink's target, not the
    parent of the link)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    head = "/" if path.startswith("/") else ""
    return head + "/".join(parts) if parts else (head or ".")


def _redirects_of(statement: Node) -> Iterator[Node]:
    """The file redirections of a redirected statement, those inside its heredoc redirections too."""
    for c in statement.named_children:
        if c.type == "file_redirect":
            yield c
        elif c.type == "heredoc_redirect":
            yield from (k for k in c.named_children if k.type == "file_redirect")


def _words_after_redirects(command: Node, parent: Node | None) -> list[Node]:
    """Arguments the grammar filed under a redirection: in ``cmd a >f b c`` bash runs ``cmd a b c``
    with its output in ``f``, but tree-sitter reads ``b`` and ``c`` as more destinations of ``>``."""
    out: list[Node] = []
    for r in command.named_children:
        if r.type == "file_redirect":
            out += r.children_by_field_name("destination")[1:]
    if parent is not None and parent.type == "redirected_statement" and parent.child_by_field_name("body") == command:
        for r in _redirects_of(parent):
            out += r.children_by_field_name("destination")[1:]
    return out


def _has_expansion(n: Node) -> bool:
    stack = [n]
    while stack:
        c = stack.pop()
        if c.type in ("simple_expansion", "expansion", "command_substitution", "arithmetic_expansion",
                      "process_substitution"):
            return True
        stack.extend(c.children)
    return False


def _own_text(n: Node, src: bytes) -> str:
    """The text of ``n`` its named children do not cover: what the grammar left unparsed."""
    out, pos = [], n.start_byte
    for c in n.named_children:
        out.append(src[pos:c.start_byte])
        pos = c.end_byte
    out.append(src[pos:n.end_byte])
    return b"".join(out).decode("utf-8", "surrogateescape")


def _quoted_heredoc(redirect: Node | None, src: bytes) -> bool:
    """Whether the heredoc of ``redirect`` has a quoted delimiter (its body is then not expanded)."""
    for c in (redirect.children if redirect is not None else ()):
        if c.type == "heredoc_start":
            return any(q in src[c.start_byte:c.end_byte] for q in (b"'", b'"', b"\\"))
    return False


def _part_text(n: Node | None, src: bytes) -> str | None:
    if n is None or n.end_byte - n.start_byte > MAX_PART_TEXT:
        return None
    return node_text(src, n).strip()
