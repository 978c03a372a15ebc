"""The files a program reads and writes, for :mod:`agentfsm.tools.shell`: ``cat`` reads its operands,
``cp`` writes its last one, ``sed -i`` both, ``tar c`` reads directories recursively, ``dd`` has ``if=``
and ``of=``, inline ``python3 -c`` code may touch any file.

The tables err on one side only. A word that might be a file is treated as one (an extra path can
only make a deny rule match where it would not have); a program that is not listed is assumed to
read and write every word it is given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import attrs

from agentfsm.tools.shell_words import Word

Access = Literal["read", "write"]
FIND_ACTIONS = ("-exec", "-execdir", "-ok", "-okdir")
_FIND_WRITES = ("-fprint", "-fprint0", "-fprintf", "-fls")


def text_of(args: Sequence[Word]) -> list[str | None]:
    return [a.text for a in args]


@attrs.frozen
class Use:
    """A file operand: ``value`` (None when not static), the access, why, whether everything
    below it is meant, and whether the command ``creates`` files below it named after something
    else (a tree copied in, an archive extracted: names a rule may match that do not exist yet)."""

    value: Word | None
    access: Access
    why: str
    recursive: bool = False
    creates: bool = False



def find_starts(args: Sequence[Word]) -> list[Word]:
    """The start directories of ``find`` (``.`` when none is given)."""
    starts: list[Word] = []
    for a in args:
        t = a.text
        if t is None:
            starts.append(a)
            break
        if t.startswith("-") or t in ("(", "!", ")", ","):
            break
        starts.append(a)
    return starts or [Word.literal(".")]




@attrs.frozen
class Effects:
    """Files a program touches (``uses``), reasons its effect is unknowable (``opaque``), and shell
    code it runs (``shell_code``, e.g. the literal ``system("…")`` calls of an awk program)."""

    uses: tuple[Use, ...] = ()
    opaque: tuple[str, ...] = ()
    shell_code: tuple[str, ...] = ()


# Programs that take no file operand (their words are text, numbers, names).
NO_FILES = frozenset({
    "echo", "printf", "true", "false", ":", "sleep", "seq", "yes", "expr", "exit", "return", "break", "continue",
    "wait", "kill", "pkill", "killall", "jobs", "fg", "bg", "disown", "whoami", "id", "groups", "uname", "hostname",
    "arch", "nproc", "printenv", "set", "shift", "getopts", "read", "unset", "export", "declare", "local",
    "readonly", "typeset", "cd", "pushd", "popd", "dirs", "umask", "ulimit", "shopt", "history", "hash", "times",
    "type", "which", "whereis", "tput", "clear", "stty", "tty", "logname", "users", "who", "w", "uptime", "free",
    "ps", "pgrep", "locale", "getconf", "sync", "basename", "dirname", "realpath", "readlink", "pwd", "test", "[",
    "[[", "env", "date", "cal", "factor", "numfmt", "bc", "dc", "lsof", "top", "htop", "nice", "renice", "trap",
    "alias", "unalias", "command", "builtin", "exec", "eval", "let", "compgen", "complete", "mapfile",
    "readarray", "caller", "enable", "help", "logout", "suspend", "coproc", "time", "timeout",
})
# Programs that only list or describe files (names, sizes), never print their contents.
LISTERS = frozenset({"ls", "dir", "vdir", "tree", "du", "df", "stat", "find", "lsattr", "namei", "exa", "eza",
                     "fd", "fdfind", "locate", "mlocate"})
# Programs that read their file operands (and write nothing, apart from the flags handled below).
READERS = frozenset({
    "cat", "tac", "head", "tail", "less", "more", "most", "nl", "wc", "sort", "uniq", "cut", "paste", "strings",
    "od", "hexdump", "hd", "xxd", "base64", "base32", "basenc", "md5sum", "sha1sum", "sha224sum", "sha256sum",
    "sha384sum", "sha512sum", "b2sum", "cksum", "sum", "diff", "diff3", "sdiff", "cmp", "comm", "file", "jq", "yq",
    "awk", "gawk", "mawk", "nawk", "sed", "tr", "column", "fold", "fmt", "rev", "iconv", "zcat", "bzcat", "xzcat",
    "zstdcat", "lzcat", "zless", "zmore", "zgrep", "zegrep", "zfgrep", "look", "join", "pr", "expand", "unexpand",
    "tsort", "ptx", "nm", "objdump", "readelf", "ldd", "grep", "egrep", "fgrep", "rg", "ag", "ack", "bat",
    "batcat", "source", ".", "shuf", "csplit", "split", "xmllint", "tidy", "colordiff", "wdiff", "vimdiff",
    "dos2unix", "unix2dos", "htmlq", "pup", "xq", "tomlq", "mlr", "csvlook", "numfmt",
})
# Programs whose first operand is a pattern or a program, not a file (unless given by an option).
_PATTERN_FIRST = {"grep": ("-e", "--regexp", "-f", "--file"), "egrep": ("-e", "-f"), "fgrep": ("-e", "-f"),
                  "zgrep": ("-e", "-f"), "zegrep": ("-e", "-f"), "zfgrep": ("-e", "-f"),
                  "rg": ("-e", "--regexp", "-f", "--file", "--files", "--type-list"),
                  "ag": ("-f",), "ack": ("--match",), "look": (), "jq": ("-f", "--from-file", "-n"),
                  "yq": ("--from-file",), "xq": (), "tomlq": (), "awk": ("-f", "--file"), "gawk": ("-f", "--file"),
                  "mawk": ("-f",), "nawk": ("-f",), "sed": ("-e", "--expression", "-f", "--file"),
                  "htmlq": (), "pup": ()}
# Recursive readers: the flags that make them recurse (empty: they always do). diff reads the files
# inside two directories it is given even without -r (and prints them with -N).
_RECURSIVE = {"diff": (), "colordiff": (),
              "grep": ("-r", "-R", "--recursive", "--dereference-recursive", "--directories=recurse"),
              "egrep": ("-r", "-R", "--recursive"), "fgrep": ("-r", "-R", "--recursive"),
              "zgrep": ("-r", "-R"), "rg": (), "ag": (), "ack": (), "bat": ()}


def _split_options(args: Sequence[Word]) -> tuple[list[Word], list[Word]]:
    """(option words, operand words): operands are the words that do not start with ``-`` (or all
    words after ``--``); a word that is not static counts as an operand."""
    options: list[Word] = []
    operands: list[Word] = []
    ended = False
    for a in args:
        t = a.text
        if not ended and t == "--":
            ended = True
            continue
        if not ended and t is not None and t.startswith("-") and t != "-":
            options.append(a)
        else:
            operands.append(a)
    return options, operands


def _has_option(options: Sequence[Word], names: Sequence[str]) -> bool:
    """A long option (with or without ``=value``) or a short one, also inside a cluster (``-rn``)."""
    shorts = {n[1] for n in names if len(n) == 2 and n.startswith("-") and n[1] != "-"}
    for o in options:
        t = o.text or ""
        if t in names or t.split("=", 1)[0] in names:
            return True
        if not t.startswith("--") and len(t) > 2 and any(c in shorts for c in t[1:]):
            return True
    return False


def _attached_values(options: Sequence[Word]) -> list[Word]:
    """Values glued to options (``--output=f``, ``-ofile``): any of them may name a file."""
    out: list[Word] = []
    for o in options:
        t = o.text or ""
        if t.startswith("--") and "=" in t:
            out.append(Word.literal(t.split("=", 1)[1]))
        elif not t.startswith("--") and len(t) > 2:
            out.append(Word.literal(t[2:]))
    return out


def _value_of(args: Sequence[Word], names: Sequence[str]) -> list[Word]:
    """The values of options in ``names`` (``-o F``, ``--output F``, ``--output=F``, ``-oF``)."""
    out: list[Word] = []
    texts = text_of(args)
    for k, t in enumerate(texts):
        if t is None:
            continue
        if t in names and k + 1 < len(args):
            out.append(args[k + 1])
        elif t.startswith("--") and t.split("=", 1)[0] in names and "=" in t:
            out.append(Word.literal(t.split("=", 1)[1]))
        elif not t.startswith("--") and len(t) > 2 and t[:2] in names:
            out.append(Word.literal(t[2:]))
    return out


def file_effects(program: str, args: Sequence[Word]) -> Effects:
    """The files ``program args`` reads and writes (see the module docstring)."""
    options, operands = _split_options(args)
    if program in NO_FILES:
        if program == "date":
            return Effects(tuple(Use(w, "read", "date -f/-r") for w in _value_of(args, ("-f", "--file", "-r",
                                                                                      "--reference"))))
        if program == "printf" and _value_of(args, ("-v",)):
            return Effects()
        return Effects()
    if program in LISTERS:
        return _lister(program, args, options, operands)
    handler = _WRITERS.get(program)
    if handler is not None:
        return handler(program, args, options, operands)
    if program in READERS:
        return _reader(program, args, options, operands)
    if program in INTERPRETERS:
        return _interpreter(program, args, options, operands)
    if program == "git":
        return _git(args)
    return _unknown(program, args)


def _unknown(program: str, args: Sequence[Word]) -> Effects:
    """An unlisted program: every word it is given may be a file it reads and writes."""
    why = f"{program} (a program whose file use is not known)"
    uses: list[Use] = []
    options, _ = _split_options(args)
    for a in [*[w for w in args if w.text is None or not w.text.startswith("-") or w.text == "-"],
              *_attached_values(options)]:
        uses += [Use(a if a.text is not None else None, "read", why), Use(a if a.text is not None else None,
                                                                          "write", why)]
    return Effects(tuple(uses))


# git's subcommands that read the files below the directories they are given, as grep -r does
# (`git grep x dir`, `git diff --no-index a b`). Without a path they read the whole work tree, as
# `git show` prints tracked contents: that stays the stated limit of deny rules (docs/security.md).
_GIT_TREE_READERS = {"grep": ("-e", "-f", "--and", "--or", "--not"), "diff": ()}


def _git(args: Sequence[Word]) -> Effects:
    """``git SUBCOMMAND ...`` (global options were peeled off by the unwrapper)."""
    sub = args[0].text if args else None
    if sub not in _GIT_TREE_READERS:
        return _unknown("git", args)
    options, operands = _split_options(args[1:])
    if sub == "grep" and operands and not _has_option(options, _GIT_TREE_READERS["grep"]):
        operands = operands[1:]  # the pattern
    reads = tuple(Use(t, "read", f"git {sub} (recursive)", recursive=True) for t in operands)
    # what else git may do with its words stays as for any program it does not know
    return Effects((*reads, *_unknown("git", args).uses))


# Programs that run in a directory an option names (their relative operands are below it, and they
# may read anything there): `make -C dir`, `tar -C dir -cf - key.txt`. (git's -C, and env's, are
# read where those wrappers are unwrapped.)
CHDIR_OPTIONS = {"make": ("-C", "--directory"), "gmake": ("-C", "--directory"), "tar": ("-C", "--directory"),
                 "ninja": ("-C",), "meson": ("-C",), "bsdtar": ("-C", "--cd", "--directory")}


def working_directories(program: str, args: Sequence[Word]) -> list[Word]:
    """The directories ``program args`` runs in by its own option (``make -C dir``)."""
    names = CHDIR_OPTIONS.get(program)
    if names is None:
        return []
    if program == "tar":
        # tar's letters take values in order (`-xzfC a.tgz dir`): its own parser finds -C in a cluster
        return list(_tar_values(args, text_of(args))[1])
    return _value_of(args, names)


INTERPRETERS = {"python": ("-c",), "python2": ("-c",), "python3": ("-c",), "pypy": ("-c",), "pypy3": ("-c",),
                "perl": ("-e", "-E"), "ruby": ("-e",), "node": ("-e", "-p", "--eval", "--print"),
                "nodejs": ("-e", "-p"), "deno": ("eval",), "bun": ("-e", "--eval"), "php": ("-r",),
                "lua": ("-e",), "luajit": ("-e",), "Rscript": ("-e",), "R": ("-e",), "tclsh": (), "osascript": ("-e",),
                "julia": ("-e", "--eval"), "pwsh": ("-c", "-Command"), "powershell": ("-c", "-Command"),
                "groovy": ("-e",), "scala": ("-e",), "elixir": ("-e",), "erl": ("-eval",), "swift": ("-e",),
                "jshell": (), "gdb": ("-ex", "--eval-command"), "vim": ("-c", "+"), "nvim": ("-c", "+"),
                "vi": ("-c", "+"), "emacs": ("--eval",), "ex": ("-c",)}


def _interpreter(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    """Inline code (``python3 -c``, ``perl -e``…) may read and write any file: its paths are unknown.
    A script file is a program like any other (its words are treated as its files)."""
    flags = INTERPRETERS[program]
    texts = text_of(args)
    inline = any(t in flags or (t is not None and any(t.startswith(f) and len(f) == 2 and f.startswith("-")
                                                      for f in flags)) for t in texts)
    if inline or (program in ("deno",) and texts[:1] == ["eval"]):
        why = f"inline {program} code can read and write any file"
        return Effects((Use(None, "read", why), Use(None, "write", why), *(_unknown(program, args).uses)))
    return _unknown(program, args)


def _lister(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    if program == "find":
        starts = find_starts(args)
        texts = text_of(args)
        uses: list[Use] = []
        if "-delete" in texts:
            uses += [Use(s, "write", "find -delete", recursive=True) for s in starts]
        for k, t in enumerate(texts):
            if t in _FIND_WRITES and k + 1 < len(args):
                uses.append(Use(args[k + 1], "write", f"find {t}"))
            if t in ("-fls",) and k + 1 < len(args):
                uses.append(Use(args[k + 1], "write", f"find {t}"))
        return Effects(tuple(uses))
    return Effects()


def _reader(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    opaque: list[str] = []
    code: list[str] = []
    uses: list[Use] = []
    files = list(operands)
    pattern_options = _PATTERN_FIRST.get(program)
    if pattern_options is not None and files and not _has_option(options, pattern_options):
        script = files.pop(0)  # the pattern, filter or program
        if program in ("awk", "gawk", "mawk", "nawk"):
            opaque_reason, runs, writes = _awk(script.text)
            if opaque_reason:
                opaque.append(opaque_reason)
            code += runs
            uses += [Use(w, "write", f"{program} print >") for w in writes]
        if program == "sed":
            uses += _sed_script(script.text)
    if program in ("awk", "gawk", "mawk", "nawk"):
        for w in _value_of(args, ("-f", "--file")):
            uses.append(Use(w, "read", f"{program} -f"))
        for w in args:
            if w.text is not None and w.text.startswith("-f") and w.text != "-f":
                pass
    if program == "sed":
        for w in _value_of(args, ("-e", "--expression")):
            uses += _sed_script(w.text)
        for w in _value_of(args, ("-f", "--file")):
            uses.append(Use(w, "read", "sed -f"))
        if _has_option(options, ("-i", "--in-place")) or any((o.text or "").startswith("-i") for o in options):
            uses += [Use(f, "read", "sed -i") for f in files] + [Use(f, "write", "sed -i") for f in files]
            return Effects(tuple(uses), tuple(opaque), tuple(code))
    if program in ("grep", "egrep", "fgrep", "zgrep", "rg", "ag", "ack"):
        for w in _value_of(args, ("-f", "--file")):
            uses.append(Use(w, "read", f"{program} -f"))
    if program == "rg" and _has_option(options, ("--pre",)):
        opaque.append("rg --pre runs a program on every file")
    recursive_flags = _RECURSIVE.get(program)
    recursive = recursive_flags is not None and (not recursive_flags or _has_option(options, recursive_flags))
    if recursive:
        if program in ("rg", "ag", "ack", "bat") and _has_option(options, ("--files",)):
            return Effects(tuple(uses), tuple(opaque), tuple(code))  # a listing
        targets = files or [Word.literal(".")]
        uses += [Use(f, "read", f"{program} (recursive)", recursive=True) for f in targets]
        return Effects(tuple(uses), tuple(opaque), tuple(code))
    if program in ("uniq", "xxd") and len(files) >= 2:
        uses.append(Use(files[-1], "write", f"{program} output file"))
        files = files[:-1]
    outputs = {"sort": ("-o", "--output"), "shuf": ("-o", "--output"), "iconv": ("-o", "--output"),
               "jq": (), "split": (), "csplit": ("-f", "--prefix")}.get(program, ())
    for w in _value_of(args, outputs):
        uses.append(Use(w, "write", f"{program} -o"))
    if program in ("split", "csplit"):
        uses.append(Use(None, "write", f"{program} output files"))
    if program in ("dos2unix", "unix2dos"):
        uses += [Use(f, "write", program) for f in files]
    uses += [Use(f, "read", program) for f in files]
    uses += [Use(w, "read", program) for w in _attached_values(options)]
    return Effects(tuple(uses), tuple(opaque), tuple(code))


def _awk(program_text: str | None) -> tuple[str | None, list[str], list[Word | None]]:
    """(opaque reason, literal ``system("…")`` code, files written) of an awk program."""
    if program_text is None:
        return "an awk program that is not static", [], []
    runs: list[str] = []
    writes: list[Word | None] = []
    calls = re.findall(r'system\s*\(\s*"((?:[^"\\]|\\.)*)"\s*\)', program_text)
    if len(calls) != len(re.findall(r"\bsystem\s*\(", program_text)):
        return "an awk program runs a command that is not static", [], []
    runs += [c.replace('\\"', '"').replace("\\\\", "\\") for c in calls]
    if re.search(r'\|\s*getline|\|\s*"|"\s*\||\|&|\bsystem\b(?!\s*\()', program_text):
        return "an awk program pipes to or from a command", runs, []
    for m in re.finditer(r'(?:print|printf)[^;{}]*?>>?\s*("(?:[^"\\]|\\.)*"|\S+)', program_text):
        target = m.group(1)
        writes.append(Word.literal(target[1:-1]) if target.startswith('"') else None)
    if re.search(r"\bgetline\s*<", program_text):
        writes.append(None)  # reads a file named at run time; recorded as unknown
    return None, runs, writes


def _sed_script(script: str | None) -> list[Use]:
    """Files a sed script reads (``r``/``R``) or writes (``w``/``W``, ``s///w``); a script that is not
    static, or one with the ``e`` command (run a shell command), counts as touching unknown files."""
    if script is None:
        return [Use(None, "read", "sed script"), Use(None, "write", "sed script")]
    uses: list[Use] = []
    for m in re.finditer(r"(?:^|[;{}\n]|\d|\$|/)\s*([rRwW])\s+([^;\n}]+)", script):
        access: Access = "read" if m.group(1) in "rR" else "write"
        uses.append(Use(Word.literal(m.group(2).strip()), access, f"sed {m.group(1)}"))
    for m in re.finditer(r"s(.)(?:\\.|(?!\1).)*\1(?:\\.|(?!\1).)*\1([gpiImMe0-9]*)w\s*([^;\n}]+)", script):
        uses.append(Use(Word.literal(m.group(3).strip()), "write", "sed s///w"))
    if re.search(r"(?:^|[;{}\n])\s*e\b|s(.)(?:\\.|(?!\1).)*\1(?:\\.|(?!\1).)*\1[gpiImM0-9]*e", script):
        uses += [Use(None, "read", "sed e runs a command"), Use(None, "write", "sed e runs a command")]
    return uses


# --- writers ---------------------------------------------------------------------------------------


def _writes_operands(program: str, args: Sequence[Word], options: Sequence[Word],
                     operands: Sequence[Word]) -> Effects:
    recursive = program in ("rm", "chmod", "chown", "chgrp", "shred") and _has_option(
        options, ("-r", "-R", "--recursive"))
    skip = {"chmod": 1, "chown": 1, "chgrp": 1}.get(program, 0)
    if program in ("chmod", "chown", "chgrp") and any((o.text or "").startswith("--reference") for o in options):
        skip = 0
    targets = list(operands[skip:])
    uses = [Use(t, "write", program, recursive=recursive) for t in targets]
    if program == "truncate":
        values = _value_of(args, ("-s", "--size"))
        uses = [u for u in uses if u.value not in values]
        uses += [Use(w, "read", "truncate -r") for w in _value_of(args, ("-r", "--reference"))]
    if program == "mkdir" or (program == "install" and _has_option(options, ("-d",))):
        modes = _value_of(args, ("-m", "--mode"))
        uses = [u for u in uses if u.value not in modes]
    if program == "tee":
        pass
    return Effects(tuple(uses))


def _copies(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    """cp, install, ln, rsync, scp, mv: sources read (mv: deleted, so written), the target written."""
    recursive = program in ("rsync",) or _has_option(options, ("-r", "-R", "-a", "--recursive", "--archive"))
    target_dir = _value_of(args, ("-t", "--target-directory"))
    sources = list(operands)
    targets: list[Word] = list(target_dir)
    if not target_dir and sources:
        targets.append(sources.pop())
    uses: list[Use] = []
    if program == "ln":
        pass  # a link's target is not read by making the link
    else:
        # mv puts a whole tree under new names, with or without -r: it reads everything below a source
        uses += [Use(s, "read", program, recursive=recursive or program == "mv") for s in sources]
    if program == "mv":
        uses += [Use(s, "write", "mv source", recursive=True) for s in sources]
    tree = recursive or program == "mv"
    uses += [Use(t, "write", f"{program} target", recursive=tree, creates=tree) for t in targets]
    # a target that is a directory receives each source under its own name (`cp /tmp/x/secret .`)
    for t in targets:
        for src in sources:
            if t.text is not None and src.text is not None and src.text.rstrip("/"):
                name = src.text.rstrip("/").rsplit("/", 1)[-1]
                uses.append(Use(Word.literal(f"{t.text.rstrip('/')}/{name}"), "write", f"{program} into a directory",
                                recursive=tree, creates=tree))
    return Effects(tuple(uses))


def _dd(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    uses: list[Use] = []
    for a in args:
        t = a.text
        if t is None:
            uses += [Use(None, "read", "dd"), Use(None, "write", "dd")]
        elif t.startswith("if="):
            uses.append(Use(Word.literal(t[3:]), "read", "dd if="))
        elif t.startswith("of="):
            uses.append(Use(Word.literal(t[3:]), "write", "dd of="))
    return Effects(tuple(uses))


def _archive(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    """tar, zip, unzip, gzip and friends."""

    if program == "tar":
        return _tar(args, text_of(args))
    if program == "zip":
        recursive = _has_option(options, ("-r", "--recurse-paths"))
        if not operands:
            return Effects()
        return Effects((Use(operands[0], "write", "zip archive"),
                        *(Use(o, "read", "zip", recursive=recursive) for o in operands[1:])))
    if program == "unzip":
        dest = _value_of(args, ("-d",)) or [Word.literal(".")]
        if _has_option(options, ("-l", "-t", "-v", "-p", "-c", "-Z")):
            return Effects(tuple(Use(o, "read", "unzip") for o in operands[:1]))
        return Effects((*(Use(o, "read", "unzip") for o in operands[:1]),
                        *(Use(d, "write", "unzip", recursive=True, creates=True) for d in dest)))
    # gzip, gunzip, bzip2, xz, zstd, lz4, compress: the file is replaced by its (un)compressed form
    stdout_only = _has_option(options, ("-c", "--stdout", "--to-stdout", "-l", "--list", "-t", "--test"))
    uses = [Use(o, "read", program) for o in operands]
    if not stdout_only:
        uses += [Use(o, "write", program) for o in operands]
        uses += [Use(None, "write", f"{program} output file")] if operands else []
    return Effects(tuple(uses))


def _tar(args: Sequence[Word], texts: list[str | None]) -> Effects:
    mode, directory, archive, operands = _tar_values(args, texts)
    archive = [a for a in archive if a.text != "-"]  # `-f -`: standard input or output, no file
    uses: list[Use] = []
    if "c" in mode or "r" in mode or "u" in mode or "A" in mode:
        uses += [Use(a, "write", "tar archive") for a in archive]
        uses += [Use(o, "read", "tar", recursive=True) for o in operands]
    elif "x" in mode:
        uses += [Use(a, "read", "tar archive") for a in archive]
        uses += [Use(d, "write", "tar extract", recursive=True, creates=True)
                 for d in (directory or [Word.literal(".")])]
    elif "t" in mode or "d" in mode:
        uses += [Use(a, "read", "tar archive") for a in archive]
    else:
        uses += [Use(None, "read", "tar"), Use(None, "write", "tar")]
    return Effects(tuple(uses))


def _tar_values(args: Sequence[Word], texts: list[str | None]) -> tuple[str, list[Word], list[Word], list[Word]]:
    """(mode letters, -C directories, archives, operands) of a tar command line."""
    mode = ""
    archive: list[Word] = []
    directory: list[Word] = []
    operands: list[Word] = []
    value_letters = "fCTXgKbLVN"
    k = 0
    first = True
    while k < len(args):
        t = texts[k]
        if t is None:
            operands.append(args[k])
            k += 1
            first = False
            continue
        letters = ""
        if t.startswith("--"):
            name, _, value = t.partition("=")
            if name in ("--create", "--extract", "--get", "--list", "--append", "--update", "--concatenate",
                        "--delete", "--diff", "--compare"):
                mode += {"--create": "c", "--extract": "x", "--get": "x", "--list": "t", "--append": "r",
                         "--update": "u", "--concatenate": "A", "--delete": "d", "--diff": "d",
                         "--compare": "d"}[name]
            elif name in ("--file", "--directory", "--files-from", "--exclude-from"):
                w = Word.literal(value) if value else (args[k + 1] if k + 1 < len(args) else None)
                if not value:
                    k += 1
                if w is not None:
                    (archive if name == "--file" else directory if name == "--directory" else operands).append(w)
            k += 1
            first = False
            continue
        if t.startswith("-") and len(t) > 1:
            letters = t[1:]
        elif first and re.fullmatch(r"[A-Za-z]+", t):
            letters = t
        else:
            operands.append(args[k])
            k += 1
            first = False
            continue
        first = False
        k += 1
        for c in letters:
            if c in "cxtruAd":
                mode += c
            if c in value_letters:
                w = args[k] if k < len(args) else None
                k += 1
                if w is not None:
                    (archive if c == "f" else directory if c == "C" else operands).append(w)
    return mode, directory, archive, operands


def _patch(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    # patch writes the files the patch names: unknown here
    return Effects((*(Use(o, "write", "patch") for o in operands), Use(None, "write", "patch"),
                    *(Use(w, "read", "patch -i") for w in _value_of(args, ("-i", "--input")))))


def _sponge(program: str, args: Sequence[Word], options: Sequence[Word], operands: Sequence[Word]) -> Effects:
    return Effects(tuple(Use(o, "write", program) for o in operands))


_WRITERS = {
    **{p: _writes_operands for p in ("tee", "touch", "truncate", "rm", "unlink", "shred", "rmdir", "mkdir",
                                     "mkfifo", "mknod", "chmod", "chown", "chgrp", "chattr", "setfacl", "wipe",
                                     "srm", "trash", "trash-put", "gio", "chcon", "utimes")},
    **{p: _copies for p in ("cp", "install", "ln", "rsync", "scp", "mv")},
    "dd": _dd,
    **{p: _archive for p in ("tar", "zip", "unzip", "gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd",
                             "unzstd", "lz4", "compress", "uncompress", "lzma", "unlzma", "7z", "7za")},
    "patch": _patch,
    "sponge": _sponge,
}
