"""The working-directory boundary for shell commands: which words of a command name files it reads,
lists or changes into, and Claude Code's text when one of them lies outside the working directories
(the session's cwd and its added directories).

:data:`REACH` is the one declaration of that knowledge: per program, how its arguments reach files
(``files``: every operand; ``script``: every operand after the first, which is a pattern, filter or
program unless an option gave it; ``find``: the start directories; ``cd``: the directory it changes
to; ``none``: no file operand), which options take a value that is not a file, which take a file it
reads, and Claude Code's phrase for what the program may do only inside the working directories
(``None`` where Claude Code has none and asks with :data:`UNCLASSIFIED`). ``tests/test_bash_boundary.py``
checks it; the opt-in ``tests/test_boundary_oracle.py`` runs every entry outside the workspace against
Claude Code.

Fail closed: a program that :func:`agentfsm.tools.bash.segment_read_only` calls read-only but the table
does not list has every word judged as a path, and an operand whose place is not known (a word that
is not static, a relative path after a ``cd`` the analysis could not follow) is outside.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import attrs

from agentfsm.tools.shell import Analysis, Command, operand_paths
from agentfsm.tools.shell_words import GLOB_CHARS, has_unescaped

Operands = Literal["files", "script", "find", "cd", "none"]

#: Claude Code's text for a command whose effect it cannot tell.
UNCLASSIFIED = "This command requires approval"


@attrs.frozen
class Reach:
    """How one program's arguments reach files (see the module doc)."""

    verb: str | None
    operands: Operands = "files"
    #: options followed by a value that is not a file, with how many words the value is
    values: Mapping[str, int] = attrs.field(factory=dict)
    #: options followed by a file the program reads
    file_values: frozenset[str] = frozenset()
    #: options that give the script, so every operand is a file (``grep -e P f``)
    script_options: frozenset[str] = frozenset()
    #: the operand when none is given, relative to where it runs (``ls`` lists ``.``)
    default: str | None = None
    #: options with which the program writes files: then the write check names them, not this one
    writes: frozenset[str] = frozenset()


def _v(*names: str, n: int = 1) -> dict[str, int]:
    return dict.fromkeys(names, n)


_GREP = Reach("search for patterns in files from", "script",
              {**_v("-e", "--regexp", "-m", "-A", "-B", "-C", "--max-count", "--after-context", "--before-context",
                    "--context",
                    "--include", "--exclude", "--exclude-dir", "--label", "--color", "--colour", "-d", "-D",
                    "--binary-files", "--devices", "--directories")},
              frozenset({"-f", "--file"}), frozenset({"-e", "--regexp", "-f", "--file"}))
_NO_FILES = Reach(None, "none")

#: The declared table: program → how it reaches files, and Claude Code's phrase.
REACH: Mapping[str, Reach] = {
    "cat": Reach("concatenate files from"),
    "head": Reach("read the beginning of files from", values=_v("-n", "-c", "--lines", "--bytes")),
    "tail": Reach("read the end of files from", values=_v("-n", "-c", "--lines", "--bytes", "-s",
                                                           "--sleep-interval", "--pid", "--max-unchanged-stats")),
    "ls": Reach("list files in", values=_v("-I", "--ignore", "-w", "--width", "-T", "--tabsize", "--hide",
                                           "--format", "--sort", "--time-style", "--block-size", "--time",
                                           "--quoting-style", "--indicator-style"), default="."),
    "grep": _GREP, "egrep": _GREP, "fgrep": _GREP,
    "rg": Reach("search for patterns in files from", "script",
                {**_v("-e", "--regexp", "-m", "-A", "-B", "-C", "-g", "--glob", "-t", "--type", "-T", "--type-not",
                      "--max-count",
                      "--context", "--after-context", "--before-context", "--max-depth", "-d", "--color",
                      "-j", "--threads", "-M", "--max-columns", "--sort", "--sortr", "--type-add", "-r",
                      "--replace", "-E", "--encoding")},
                frozenset({"-f", "--file", "--ignore-file"}), frozenset({"-e", "--regexp", "-f", "--file", "--files",
                                                                        "--type-list"}), default="."),
    "wc": Reach("count lines/words/bytes in files from", file_values=frozenset({"--files0-from"})),
    "sort": Reach("sort contents of files from", values=_v("-k", "-t", "-S", "--key", "--field-separator",
                                                           "--buffer-size", "--parallel", "--batch-size"),
                  file_values=frozenset({"-o", "--output", "-T", "--temporary-directory", "--files0-from"})),
    "diff": Reach("compare files from", values=_v("-U", "-C", "--unified", "--context", "-W", "--width",
                                                  "--label", "-I", "--ignore-matching-lines", "-x", "--exclude",
                                                  "-F", "--show-function-line", "--line-format", "--color"),
                  file_values=frozenset({"-X", "--exclude-from", "--from-file", "--to-file"})),
    "cmp": Reach("compare files from", values=_v("-i", "-n", "--ignore-initial", "--bytes")),
    "comm": Reach("compare files from", values=_v("--output-delimiter")),
    "stat": Reach("read file stats from", values=_v("-c", "--format", "--printf")),
    "file": Reach("examine file types in", values=_v("-e", "--exclude", "-F", "--separator", "-P", "--parameter"),
                  file_values=frozenset({"-m", "--magic-file", "-f", "--files-from"})),
    "cd": Reach("change directories to", "cd"),
    "sed": Reach("edit files in", "script", values=_v("-e", "--expression", "-l", "--line-length"),
                 file_values=frozenset({"-f", "--file"}), script_options=frozenset({"-e", "--expression", "-f",
                                                                                    "--file"}),
                 writes=frozenset({"-i", "--in-place"})),
    "awk": Reach("process text from files in", "script", values=_v("-F", "-v", "--field-separator", "--assign"),
                 file_values=frozenset({"-f", "--file"}), script_options=frozenset({"-f", "--file"})),
    "uniq": Reach("filter duplicate lines from files in", values=_v("-f", "-s", "-w", "--skip-fields",
                                                                    "--skip-chars", "--check-chars")),
    "cut": Reach("extract columns from files in", values=_v("-d", "-f", "-c", "-b", "--delimiter", "--fields",
                                                            "--characters", "--bytes", "--output-delimiter")),
    "find": Reach("search files in", "find", default="."),
    "od": Reach("display octal dump of files from", values=_v("-A", "-t", "-N", "-j", "-w", "--address-radix",
                                                              "--format", "--read-bytes", "--skip-bytes", "--width")),
    "strings": Reach("extract strings from files in", values=_v("-n", "-t", "-e", "--bytes", "--radix",
                                                                "--encoding", "-s", "--output-separator")),
    "nl": Reach("number lines in files from", values=_v("-b", "-d", "-f", "-h", "-i", "-l", "-n", "-s", "-v", "-w")),
    "tac": Reach("read files (reversed) from", values=_v("-s", "--separator")),
    "rev": Reach("read files (reversed lines) from"),
    "paste": Reach("merge files from", values=_v("-d", "--delimiters")),
    "md5sum": Reach("compute MD5 checksums for files in"),
    "sha1sum": Reach("compute SHA-1 checksums for files in"),
    "sha256sum": Reach("compute SHA-256 checksums for files in"),
    "jq": Reach("process JSON from files in", "script",
                {**_v("--indent", "--tab"), **_v("--arg", "--argjson", "--slurpfile", "--rawfile", n=2)},
                frozenset({"-f", "--from-file", "-L"}), frozenset({"-f", "--from-file", "-n", "--null-input"})),
    "hexdump": Reach("display hex dump of files from", values=_v("-n", "-s", "-e"),
                     file_values=frozenset({"-f"})),
    "base64": Reach("encode/decode files from", values=_v("-w", "--wrap")),
    "fold": Reach("wrap lines of files from", values=_v("-w", "--width")),
    "column": Reach("format files from", values=_v("-s", "-c", "-o", "-N", "-R", "-H", "-E", "-W", "-O",
                                                   "--separator", "--output-separator", "--output-width",
                                                   "--table-columns")),
    "expand": Reach("convert tabs in files from", values=_v("-t", "--tabs")),
    "unexpand": Reach("convert spaces in files from", values=_v("-t", "--tabs")),
    "pr": Reach("paginate files from", values=_v("-h", "-o", "-w", "-l", "-W", "-s", "-S", "-N", "-e", "-i",
                                                 "--header", "--width", "--length", "--page-width")),
    "fmt": Reach("reformat files from", values=_v("-w", "-p", "-g", "--width", "--prefix", "--goal")),
    "tsort": Reach("sort files from"),
    "git": Reach("access files with git from", "script", values=_v("-C", "-c", "--git-dir", "--work-tree",
                                                                   "--namespace")),
    # read-only to agentfsm, but no phrase of Claude Code's: outside, they ask with UNCLASSIFIED
    "less": Reach(None), "more": Reach(None), "xxd": Reach(None, values=_v("-s", "-l", "-c", "-g", "-o")),
    "cksum": Reach(None), "b2sum": Reach(None), "sha224sum": Reach(None), "sha384sum": Reach(None),
    "sha512sum": Reach(None), "join": Reach(None), "yq": Reach(None, "script"), "zcat": Reach(None),
    "look": Reach(None, "script"), "iconv": Reach(None, values=_v("-f", "-t", "--from-code", "--to-code")),
    "lsattr": Reach(None), "namei": Reach(None),
    # they list or measure files outside (du -a prints every name below a directory): agentfsm asks
    # where Claude Code runs them (docs/compatibility.md)
    "du": Reach(None, values=_v("-d", "--max-depth", "-B", "--block-size", "-t", "--threshold", "--exclude",
                                "--time-style"), default="."),
    "tree": Reach(None, values=_v("-L", "-P", "-I", "--charset", "--filelimit", "--sort"), default="."),
    "pushd": Reach(None, "cd"),
    # no file operand (realpath and readlink resolve a name but read nothing; Claude Code runs them)
    **{p: _NO_FILES for p in (
        "echo", "printf", "pwd", "which", "whereis", "uname", "whoami", "id", "groups", "true", "false",
        "sleep", "seq", "type", "ps", "pgrep", "hostname", "command", "basename", "dirname", "realpath",
        "readlink", "test", "[", "tr", "df")},
    "date": Reach(None, "none", file_values=frozenset({"-f", "--file", "-r", "--reference"})),
}


@attrs.frozen
class Outside:
    """The first place a command reaches outside the working directories: by ``program`` (None for an
    input redirection), at ``path`` (as Claude Code shows it: symlinks resolved; None when where it
    lies is not known before the command runs), with Claude Code's phrase (None: no phrase)."""

    program: str | None
    path: str | None
    verb: str | None
    command: Command | None = attrs.field(default=None, eq=False, repr=False)

    def text(self, dirs: Sequence[Path]) -> str:
        shown = ", ".join(f"'{d}'" for d in dirs)
        if self.path is None:
            return UNCLASSIFIED
        if self.program is None:
            return (f"Input redirection from '{self.path}' was blocked. For security, Claude Code may only read "
                    f"files in the allowed working directories for this session: {shown}.")
        if self.verb is None:
            return UNCLASSIFIED
        return (f"{self.program} in '{self.path}' was blocked. For security, Claude Code may only {self.verb} "
                f"the allowed working directories for this session: {shown}.")


def _option(word: str, names: Mapping[str, int] | frozenset[str]) -> tuple[str, bool] | None:
    """(the option of ``names`` that ``word`` is, whether its value is glued to it), or None."""
    if word in names:
        return word, False
    if word.startswith("--") and "=" in word and word.split("=", 1)[0] in names:
        return word.split("=", 1)[0], True
    if not word.startswith("--") and len(word) > 2 and word[:2] in names:
        return word[:2], True
    return None


def path_words(program: str, argv: Sequence[str | None], reach: Reach | None) -> list[int | str]:
    """The indices of ``argv`` (``argv[0]`` the program) that name files the program reads, lists or
    changes into, or a default operand (a string) when it names none. Without a ``reach`` every word
    that is not an option is a path (fail closed)."""
    if reach is None:
        return [k for k in range(1, len(argv)) if argv[k] is None or not argv[k].startswith("-")]  # type: ignore[union-attr]
    if reach.operands == "none":
        out: list[int | str] = []
        for k in range(1, len(argv)):
            word = argv[k]
            if word is not None and _option(word, reach.file_values) and k + 1 < len(argv):
                out.append(k + 1)
        return out
    operands: list[int] = []
    files: list[int] = []
    script_given = False
    ended = False
    k = 1
    while k < len(argv):
        word = argv[k]
        if word is None or ended or not word.startswith("-") or word == "-":
            if word is not None and word == "-" and not ended:
                k += 1
                continue  # standard input
            operands.append(k)
            k += 1
            continue
        if word == "--":
            ended = True
            k += 1
            continue
        if reach.operands == "find":
            if word in ("-H", "-L", "-P") or word.startswith("-O"):
                k += 1
                continue  # how links are followed, the optimisation level: before the starts
            if word == "-D":
                k += 2
                continue
            break  # the expression: its words are tests, not start directories
        if _option(word, reach.script_options) or (
                not word.startswith("--") and any(f"-{c}" in reach.script_options for c in word[1:2])):
            script_given = True
        hit = _option(word, reach.file_values)
        if hit is not None:
            if hit[1]:
                files.append(k)  # checked as the whole word: its value is glued on (`-o../x`)
            elif k + 1 < len(argv):
                files.append(k + 1)
                k += 2
                continue
        arity = _option(word, reach.values)
        if arity is not None and not arity[1]:
            k += 1 + reach.values[arity[0]]
            continue
        k += 1
    if reach.operands == "script" and not script_given and operands:
        operands = operands[1:]
    if reach.operands == "cd":
        operands = operands[:1]
    found: list[int | str] = [*files, *operands]
    if not operands and reach.default is not None:
        found.append(reach.default)
    elif not operands and reach.operands == "cd":
        found.append("~")
    return found


def _glued(word: str) -> str:
    """The value glued to an option (``-o../x`` → ``../x``, ``--output=../x`` → ``../x``)."""
    if word.startswith("--"):
        return word.split("=", 1)[1] if "=" in word else ""
    return word[2:] if word.startswith("-") else word


def _fixed(path: str) -> str:
    """A glob pattern's directory part before its first wildcard (what it can reach)."""
    parts: list[str] = []
    for seg in path.split("/"):
        if has_unescaped(seg, GLOB_CHARS):
            break
        parts.append(seg)
    return "/".join(parts) or "/"


def _within(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def inside(path: str, dirs: Sequence[Path]) -> bool:
    """``path`` (absolute, ``..`` possibly kept) lies in one of ``dirs``, both as written and with its
    symlinks resolved as the kernel does."""
    roots = sorted({os.path.normpath(str(d)) for d in dirs} | {os.path.realpath(d) for d in dirs})
    return _within(os.path.normpath(path), roots) and _within(os.path.realpath(path), roots)


def shown(path: str) -> str:
    """A path as Claude Code names it in the boundary texts: symlinks resolved, ``..`` folded."""
    return os.path.realpath(path)


def _command_outside(command: Command, cwd: str, dirs: Sequence[Path], home: str | None,
                     covered: Callable[[str], bool]) -> Outside | None:
    program = command.program
    if program is None:
        return None
    reach = REACH.get(program)
    from agentfsm.tools.bash import segment_read_only

    if reach is None and not segment_read_only(command.argv):
        return None  # not read-only: it asks anyway, and what it writes is named by the write check
    if reach is not None and reach.writes and any(
            w is not None and (_option(w, reach.writes) or (w.startswith("-") and not w.startswith("--")
                                                            and any(f"-{c}" in reach.writes for c in w[1:])))
            for w in command.argv[1:]):
        return None
    verb = reach.verb if reach is not None else None
    if reach is not None and reach.operands == "cd" and "-" in command.argv[1:]:
        return Outside(program, None, None, command)  # back to $OLDPWD: where that is is not known
    for spot in path_words(program, command.argv, reach):
        if isinstance(spot, str):
            # a default operand, placed as the command's own would be (`cd` alone goes home)
            targets = [(home or os.path.expanduser("~"), False)] if spot == "~" else [
                (os.path.join(os.path.normpath(cwd), b, spot) if command.bases is not None else None, False)
                for b in (command.bases or (None,))]
        else:
            word = command.argv[spot]
            if word is not None and word.startswith("-") and spot >= 1:
                glued = _glued(word)
                targets = [(glued if glued.startswith("/") else os.path.join(os.path.normpath(cwd), b, glued), False)
                           for b in (command.bases or (".",))] if glued else []
            else:
                targets = operand_paths(command, spot, cwd, home)
        for path, is_glob in targets:
            if path is None:
                return Outside(program, None, None, command)  # a place not known before it runs: asks
            where = _fixed(path) if is_glob else path
            if not inside(where, dirs) and not covered(where):
                return Outside(program, shown(where), verb, command)
    return None


def _nothing(path: str) -> bool:
    return False


def outside(analysis: Analysis, cwd: Path | str, dirs: Sequence[Path], home: str | None = None,
            covered: Callable[[str], bool] = _nothing) -> Outside | None:
    """The first file a command reads, lists or changes into outside ``dirs`` (see the module doc),
    else an input redirection from outside, else None. ``covered``: a path outside that a rule lets
    the session read anyway (a ``Read(//elsewhere/**)`` allow rule)."""
    for command in analysis.commands:
        found = _command_outside(command, str(cwd), dirs, home, covered)
        if found is not None:
            return found
    for use in analysis.paths:
        if use.access == "read" and use.why.startswith("redirection <"):
            if use.path is None:
                return Outside(None, None, None)
            where = _fixed(use.path) if use.glob else use.path
            if not inside(where, dirs) and not covered(where):
                return Outside(None, shown(where), None)
    return None
