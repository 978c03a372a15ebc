"""Programs that run other programs, for :mod:`agentfsm.tools.shell`: wrappers (``env``, ``sudo``,
``timeout``, ``nice``, ``xargs``, ``find -exec``…), shells given code (``bash -c``, ``eval``, ``trap``,
a heredoc fed to ``sh``), and the variables and settings that make a program run a command of their
choosing (``BASH_ENV``, ``GIT_EXTERNAL_DIFF``, ``git -c alias.x='!…'``).

Code that cannot be followed — a shell reading a pipe, a command name computed at run time — is
reported as *opaque*, never guessed at. Where an option table may be wrong about which option takes
a value, every plausible start of the wrapped command is reported (see :func:`_argv`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from typing import Literal

import attrs

from agentfsm.tools.shell_files import FIND_ACTIONS, NO_FILES, READERS, Use, find_starts
from agentfsm.tools.shell_words import NOT_STATIC, Word


def base_name(word: str) -> str:
    """``/usr/bin/../bin/rm`` → ``rm``."""
    return word.rstrip("/").rsplit("/", 1)[-1] if "/" in word.rstrip("/") else word


@attrs.frozen
class Stdin:
    """What a command reads on standard input: ``static`` text (a here-string, a heredoc whose body
    is not expanded), ``piped`` (a pipe, a file, an expanded heredoc) or the ``terminal``."""

    kind: Literal["static", "piped", "terminal"]
    text: str | None = None


PIPED = Stdin("piped")
TERMINAL = Stdin("terminal")


@attrs.frozen
class Inner:
    """What a wrapper runs: ``argv`` lists (the command it starts, once or more), shell ``code`` to
    parse (None when it is not static), or ``opaque`` (``reason``). ``uses`` are files the wrapper
    itself touches; ``chdir`` a directory the inner command runs in."""

    kind: Literal["argv", "shell", "opaque"]
    argvs: tuple[tuple[Word, ...], ...] = ()
    code: str | None = None
    reason: str = ""
    stdin: Stdin | None = None
    uses: tuple[Use, ...] = ()
    chdir: Word | None = None


def _argv(args: Sequence[Word], i: int, **kw: object) -> Inner | None:
    """The command starting at ``args[i]`` — and, since an option table may be wrong about which
    option takes a value, the commands that would start at the other plausible places: any word
    among the options before it, and the word after it when the option just before it is one the
    table does not know to take no value."""
    if i >= len(args):
        return None
    starts = [i]
    for k in range(min(i, len(args))):
        t = args[k].text
        if t is not None and not t.startswith("-"):
            starts.append(k)
    before = args[i - 1].text if 0 < i <= len(args) else None
    if before is not None and before.startswith("-") and before != "--" and "=" not in before and i + 1 < len(args):
        starts.append(i + 1)
    argvs = tuple(tuple(args[k:]) for k in dict.fromkeys(starts) if k < len(args))
    return Inner("argv", argvs, **kw)  # type: ignore[arg-type]


def _opaque(reason: str) -> Inner:
    return Inner("opaque", reason=reason)


def _shell(code: str | None) -> Inner:
    return Inner("shell", code=code)


def _texts(args: Sequence[Word]) -> list[str | None]:
    return [a.text for a in args]


def skip_options(args: Sequence[Word], with_value: frozenset[str] = frozenset()) -> int:
    """Index of the first operand: options are skipped, those in ``with_value`` with their value
    (the next word, or the rest of a short-option cluster: ``-uroot``, ``-Eu root``); ``--`` ends the
    options. A word that is not static stops the scan (it may be anything)."""
    i = 0
    while i < len(args):
        a = args[i].text
        if a is None:
            return i
        if a == "--":
            return i + 1
        if not a.startswith("-") or a == "-":
            return i
        i += 1
        if a in with_value:
            i += 1
        elif not a.startswith("--"):
            for k, ch in enumerate(a[1:], start=1):
                if "-" + ch in with_value:
                    if k == len(a) - 1:
                        i += 1  # the value is the next word
                    break
    return i


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# env takes any word with a `=` in it as an assignment, whatever its name (`env 'BASH_FUNC_rm%%=() { :; }'
# rm x` runs rm, with an exported function set): a name the shell would refuse is still no program
_ENV_ASSIGNMENT = re.compile(r"^[^=]+=")
# Variables whose value the shell, or a program it starts, runs as a command or loads as code.
CODE_VARIABLES = frozenset({
    "BASH_ENV", "ENV", "PS4", "PS0", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "BASH_LOADABLES_PATH",
    "LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "GIT_EXTERNAL_DIFF", "GIT_PAGER", "PAGER", "GIT_EDITOR",
    "EDITOR", "VISUAL", "GIT_SEQUENCE_EDITOR", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS",
    "GIT_PROXY_COMMAND", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_EXEC_PATH", "GIT_TEMPLATE_DIR",
    "LESSOPEN", "LESSCLOSE", "MANPAGER", "MANOPT", "BROWSER", "FCEDIT", "PYTHONSTARTUP", "PYTHONPATH",
    "PERL5OPT", "PERL5LIB", "RUBYOPT", "NODE_OPTIONS", "PYTHONINSPECT", "TAR_OPTIONS", "GZIP", "XZ_OPT",
    "ZSTD_CLEVEL", "GREP_OPTIONS", "RIPGREP_CONFIG_PATH", "SYSTEMD_PAGER", "SUDO_ASKPASS",
})


def code_variable(name: str) -> bool:
    """Assigning ``name`` may make a command run code of the value's choosing."""
    return name in CODE_VARIABLES or name.startswith(("BASH_FUNC_", "GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_"))

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "rbash", "fish", "ksh93",
                    "busybox-sh", "tcsh", "csh"})
_RUNS_ARGV = frozenset({"nohup", "unbuffer", "chronic", "ifne", "torsocks", "catchsegv", "fakeroot", "builtin",
                        "command", "coproc", "caffeinate", "xvfb-run", "dbus-launch", "setpriv", "env-update"})


def unwrap(program: str, args: Sequence[Word], stdin: Stdin) -> Inner | None:
    """What ``program args`` runs in turn, or None when it is an ordinary program."""
    texts = _texts(args)
    if program == "env":
        return _env(args)
    if program in _RUNS_ARGV:
        if program == "command" and any(t in ("-v", "-V") for t in texts[:skip_options(args)]):
            return None  # `command -v NAME` only looks the name up
        return _argv(args, skip_options(args))
    if program == "exec":
        return _argv(args, skip_options(args, frozenset({"-a"})))
    if program == "time":
        i = skip_options(args, frozenset({"-f", "--format", "-o", "--output"}))
        uses = tuple(Use(args[k + 1], "write", "time -o") for k in range(i - 1)
                     if texts[k] in ("-o", "--output"))
        inner = _argv(args, i)
        return attrs.evolve(inner, uses=uses) if inner is not None else None
    if program == "nice":
        i = 0
        while i < len(args) and (t := texts[i]) is not None and t.startswith("-") and t != "--":
            i += 2 if t in ("-n", "--adjustment") else 1
        if i < len(args) and texts[i] == "--":
            i += 1
        return _argv(args, i)
    if program in ("setsid", "stdbuf", "strace", "ltrace", "valgrind", "firejail", "unshare", "nsenter",
                   "numactl", "cgexec", "systemd-run", "pkexec", "proxychains", "proxychains4", "prlimit",
                   "runcon", "sg", "newgrp", "nocache", "eatmydata", "trickle", "vglrun", "primusrun"):
        values = frozenset({"-i", "-o", "-e", "-u", "-s", "-E", "-t", "-g", "-p", "-f", "-U", "-a", "-l",
                            "--user", "--input", "--output", "--error"})
        if program in ("stdbuf", "strace", "ltrace", "nsenter", "cgexec", "pkexec", "proxychains", "proxychains4"):
            i = skip_options(args, values)
        else:
            i = skip_options(args)
        if program in ("strace", "ltrace") and any(t in ("-p", "--attach") for t in texts[:i]):
            return None
        if program in ("sg", "newgrp"):
            return _argv(args, i + 1) if program == "sg" else None
        return _argv(args, i)
    if program == "timeout":
        i = skip_options(args, frozenset({"-s", "--signal", "-k", "--kill-after"}))
        return _argv(args, i + 1)  # after the duration
    # with a pid these change a running process and start nothing; only their own options count
    if program == "ionice":
        i = skip_options(args, frozenset({"-c", "-n", "--class", "--classdata"}))
        if any(t in ("-p", "-P", "-u", "--pid", "--pgid", "--uid") for t in texts[:i]):
            return None
        return _argv(args, i)
    if program == "taskset":
        i = skip_options(args)
        if any(t in ("-p", "--pid") or (t or "").startswith("-p") for t in texts[:i]):
            return None
        return _argv(args, i + 1)  # after the mask or cpu list
    if program == "chrt":
        i = skip_options(args)
        if any(t in ("-p", "--pid") for t in texts[:i]):
            return None
        return _argv(args, i + 1)  # after the priority
    if program == "faketime":
        return _argv(args, skip_options(args, frozenset({"-m", "-f"})) + 1)
    if program == "chroot":
        i = skip_options(args, frozenset({"--userspec", "--groups"}))
        inner = tuple(args[i + 1:])
        return Inner("argv", (inner or (Word.literal("/bin/sh"), Word.literal("-i")),))
    if program == "flock":
        i = skip_options(args, frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}))
        rest = args[i + 1:]
        lock = (Use(args[i], "write", "flock lock file"),) if i < len(args) else ()
        if rest and rest[0].text in ("-c", "--command"):
            return Inner("shell", code=rest[1].text if len(rest) > 1 else None, uses=lock)
        inner = _argv(args, i + 1)
        return attrs.evolve(inner, uses=lock) if inner is not None else None
    if program in ("sudo", "doas"):
        return _sudo(args)
    if program in ("su", "runuser"):
        for k, t in enumerate(texts):
            if t in ("-c", "--command") or (t or "").startswith("--command="):
                code = texts[k + 1] if t in ("-c", "--command") and k + 1 < len(texts) else (
                    t.split("=", 1)[1] if t else None)
                return _shell(code)
        if program == "runuser" and "--" in texts:
            return _argv(args, texts.index("--") + 1)
        return _opaque(f"{program} starts a shell that reads commands from its standard input")
    if program == "xargs":
        return _xargs(args)
    if program == "parallel":
        i = skip_options(args, frozenset({"-j", "--jobs", "-S", "--sshlogin", "--joblog", "-a", "--arg-file"}))
        if ":::" in texts:
            end = texts.index(":::")
            return Inner("argv", ((*tuple(args[i:end]), NOT_STATIC),)) if end > i else _opaque(
                "parallel runs commands that are not static")
        return Inner("argv", ((*tuple(args[i:]), NOT_STATIC),)) if i < len(args) else _opaque(
            "parallel runs commands read from its standard input")
    if program == "find":
        return _find(args)
    if program == "busybox":
        return _argv(args, 0) if args and texts[0] not in ("--list", "--help") else None
    if program == "script":
        for k, t in enumerate(texts):
            if t in ("-c", "--command") or (t is not None and re.fullmatch(r"-[a-zA-Z]*c", t)):
                return _shell(texts[k + 1] if k + 1 < len(texts) else None)
        return _opaque("script starts an interactive shell")
    if program == "watch":
        i = skip_options(args, frozenset({"-n", "--interval", "-d", "--differences"}))
        rest = texts[i:]
        return _shell(" ".join(t for t in rest if t is not None) if None not in rest else None) if rest else None
    if program in ("ssh", "gcloud", "docker", "kubectl", "podman") and program == "ssh":
        return _ssh(args)
    if program in SHELLS:
        return _shell_program(program, args, stdin)
    if program == "eval":
        if None in texts:
            return _opaque("eval of text that is not static")
        return _shell(" ".join(t for t in texts if t is not None))
    if program in ("source", "."):
        if not args:
            return None
        target = texts[0]
        if target is None:
            return _opaque(f"{program} runs a script whose name is not static")
        if _from_a_pipe(target):
            if stdin.kind == "static" and target in ("/dev/stdin", "-", "/proc/self/fd/0", "/dev/fd/0"):
                return _shell(stdin.text)
            return _opaque(f"{program} runs shell code it reads from a pipe")
        return None  # a script file: trusted like any program (its read is recorded below)
    if program == "trap":
        if texts[:1] == ["--"]:
            args, texts = args[1:], texts[1:]
        if not args or texts[0] in ("-", "-l", "-p", "-P"):
            return None
        if texts[0] is None:
            return _opaque("trap with code that is not static")
        return _shell(texts[0])
    if program in ("alias", "enable", "unalias") and args:
        return _opaque(f"{program} changes what command names mean")
    if program == "shopt" and "-s" in texts and any(t not in ("-s", "-q", "nullglob", "failglob", "lastpipe",
                                                              "pipefail", "inherit_errexit") for t in texts):
        return _opaque("shopt changes how the shell reads the command")
    if program == "git":
        return _git(args)
    return None


def _env(args: Sequence[Word]) -> Inner | None:
    texts = _texts(args)
    i = 0
    chdir: Word | None = None
    while i < len(args):
        a = texts[i]
        if a is None:
            return _opaque("env with a word that is not static")
        if a in ("-u", "--unset"):
            i += 2
            continue
        if a in ("-C", "--chdir"):
            chdir = args[i + 1] if i + 1 < len(args) else None
            i += 2
            continue
        if a.startswith("--chdir="):
            chdir = Word.literal(a.split("=", 1)[1])
            i += 1
            continue
        if a in ("-S", "--split-string") or a.startswith(("--split-string=", "-S")):
            if a in ("-S", "--split-string"):
                code = texts[i + 1] if i + 1 < len(texts) else None
                rest = texts[i + 2:]
            else:
                code = a.split("=", 1)[1] if a.startswith("--") else a[2:]
                rest = texts[i + 1:]
            if code is None or None in rest:
                return _opaque("env -S with a string that is not static")
            return _shell(" ".join([code, *(shlex.quote(r) for r in rest if r is not None)]))
        if a == "--":
            i += 1
            break
        if a.startswith("-") and a != "-" and not a.startswith("--"):
            # a cluster: -iu NAME, -iS 'cmd', -vC DIR
            cluster = a[1:]
            taken = next((k for k, ch in enumerate(cluster) if ch in "uCS"), None)
            if taken is None:
                i += 1
                continue
            rest = cluster[taken + 1:]
            value = Word.literal(rest) if rest else (args[i + 1] if i + 1 < len(args) else None)
            if cluster[taken] == "S":
                code = value.text if value is not None else None
                tail = texts[i + (1 if rest else 2):]
                if code is None or None in tail:
                    return _opaque("env -S with a string that is not static")
                return _shell(" ".join([code, *(shlex.quote(t) for t in tail if t is not None)]))
            if cluster[taken] == "C":
                chdir = value
            i += 1 if rest else 2
            continue
        if a.startswith("-") and a != "-":
            i += 1
            continue
        if _ENV_ASSIGNMENT.match(a):
            if code_variable(a.split("=", 1)[0]):
                return _opaque(f"env sets {a.split('=', 1)[0]}, which may make a program run code")
            i += 1
            continue
        break
    while i < len(args) and texts[i] is not None and _ENV_ASSIGNMENT.match(texts[i] or ""):
        i += 1
    return _argv(args, i, chdir=chdir)


def prints_environment(program: str, args: Sequence[str | None]) -> bool:
    """Whether ``program args`` prints environment variables (and so any secret among them)."""
    if program == "printenv":
        return True
    if program == "env":
        for a in args:
            if a is None:
                return True
            if a in ("-u", "--unset", "-C", "--chdir"):
                continue
            if a.startswith("-") or _ENV_ASSIGNMENT.match(a):
                continue
            return False  # env runs a command
        return True
    if program == "set":
        return not args or all(a in ("-o", "+o", "--") for a in args)
    if program in ("export", "declare", "typeset", "readonly", "local"):
        return not [a for a in args if a is not None and not a.startswith("-")] or "-p" in args
    if program == "compgen":
        return any(a in ("-v", "-e", "variable", "export") for a in args)
    return False


_SUBSCRIPT_CODE = re.compile(r"\[[^\]]*[$`]")
NAME_EVALUATORS = frozenset({"read", "mapfile", "readarray", "printf", "test", "[", "wait", "declare", "typeset",
                             "local", "export", "readonly", "hash", "let", "unset", "compgen", "complete", "jobs"})


def evaluates_code_in_names(program: str, args: Sequence[str | None]) -> str | None:
    """Why ``program args`` may run code hidden in a variable name, or None. Bash evaluates the array
    subscript of a name it is given (``printf -v 'a[$(cmd)]'``, ``read``, ``test -v``, ``wait -p``) and
    the value of an integer variable (``declare -i v='a[$(cmd)]'``) as arithmetic, and ``hash -p``
    maps a command name to any program."""

    def risky(a: str | None) -> bool:
        return a is None or _SUBSCRIPT_CODE.search(a) is not None

    flags = [a for a in args if a is not None and a.startswith("-")]
    if program == "hash" and any("p" in f[1:] for f in flags if not f.startswith("--")):
        return "hash -p makes a command name run another program"
    if program == "let":
        return "let evaluates its words as arithmetic"
    if program in ("compgen", "complete") and any(f in ("-C", "-F") for f in flags):
        return f"{program} -C/-F runs a command"
    if program in ("mapfile", "readarray") and any(f.startswith("-C") for f in flags):
        return f"{program} -C runs a callback"
    if program == "jobs" and "-x" in flags:
        return "jobs -x runs a command"
    if program in ("declare", "typeset", "local", "export", "readonly"):
        if any("i" in f[1:] for f in flags if not f.startswith("--")):
            return "an integer variable evaluates what it is given as arithmetic"
        if any(risky(a) for a in args):
            return "a variable name with a subscript that runs code"
        return None
    if program in ("printf", "wait"):
        option = "-v" if program == "printf" else "-p"
        names = [args[k + 1] for k, a in enumerate(args[:-1]) if a == option]
    elif program in ("test", "["):
        names = [args[k + 1] for k, a in enumerate(args[:-1]) if a == "-v"]
    elif program in ("read", "mapfile", "readarray", "unset"):
        names = [a for a in args if a is None or not a.startswith("-")]
    else:
        return None
    return "a variable name with a subscript that runs code" if any(risky(a) for a in names) else None


ENVIRONMENT_PRINTERS = frozenset({"printenv", "env", "set", "export", "declare", "typeset", "readonly", "local",
                                  "compgen"})


def _sudo(args: Sequence[Word]) -> Inner | None:
    texts = _texts(args)
    values = frozenset({"-u", "-g", "-h", "-p", "-C", "-r", "-t", "-U", "-D", "-R", "-T", "--user", "--group",
                        "--host", "--prompt", "--close-from", "--role", "--type", "--other-user", "--chdir",
                        "--chroot", "--command-timeout"})
    i = skip_options(args, values)
    flags = [t for t in texts[:i] if t is not None]
    if any(f in ("-l", "--list", "-v", "--validate", "-k", "-K", "-e", "--edit") for f in flags):
        return None
    if any(f in ("-s", "--shell", "-i", "--login") or re.fullmatch(r"-[a-zA-Z]*[si][a-zA-Z]*", f) for f in flags):
        rest = texts[i:]
        if not rest:
            return _opaque("sudo starts an interactive shell")
        return _shell(" ".join(r for r in rest if r is not None) if None not in rest else None)
    while i < len(args) and _ASSIGNMENT.match(texts[i] or ""):
        i += 1
    return _argv(args, i)


def _xargs(args: Sequence[Word]) -> Inner:
    values = frozenset({"-I", "-i", "-n", "-L", "-l", "-P", "-d", "-a", "-E", "-e", "-s", "--max-args",
                        "--max-procs", "--delimiter", "--arg-file", "--replace", "--eof", "--max-chars",
                        "--max-lines", "--process-slot-var"})
    texts = _texts(args)
    i = 0
    uses: list[Use] = []
    replace: str | None = None
    while i < len(args):
        a = texts[i]
        if a is None or not a.startswith("-") or a == "-":
            break
        if a == "--":
            i += 1
            break
        if a in ("-a", "--arg-file") and i + 1 < len(args):
            uses.append(Use(args[i + 1], "read", "xargs -a"))
        if a in ("-I", "--replace") and i + 1 < len(args):
            replace = texts[i + 1]
        elif a.startswith("-I") and len(a) > 2:
            replace = a[2:]
        i += 2 if a in values else 1
    inner = tuple(args[i:]) or (Word.literal("echo"),)
    if replace is not None:
        inner = tuple(NOT_STATIC if w.text is not None and replace in w.text else w for w in inner)
        return Inner("argv", (inner,), uses=tuple(uses))
    return Inner("argv", ((*inner, NOT_STATIC),), uses=tuple(uses))  # the arguments come from stdin




def _find(args: Sequence[Word]) -> Inner | None:
    texts = _texts(args)
    starts = find_starts(args)
    argvs: list[tuple[Word, ...]] = []
    uses: list[Use] = []
    for k, t in enumerate(texts):
        if t in FIND_ACTIONS:
            end = next((j for j in range(k + 1, len(texts)) if texts[j] in (";", "+")), len(texts))
            inner = tuple(NOT_STATIC if w.text is not None and "{}" in w.text else w for w in args[k + 1:end])
            if not inner:
                continue
            argvs.append(inner)
            program = base_name(inner[0].text) if inner[0].text is not None else None
            reader = program is not None and (program in READERS or program in NO_FILES)
            for s in starts:
                uses.append(Use(s, "read", f"find {t} {program or '?'}", recursive=True))
                if not reader:
                    uses.append(Use(s, "write", f"find {t} {program or '?'}", recursive=True))
    if not argvs:
        return None
    return Inner("argv", tuple(argvs), uses=tuple(uses))


def _shell_program(program: str, args: Sequence[Word], stdin: Stdin) -> Inner | None:
    texts = _texts(args)
    k = 0
    while k < len(args):
        a = texts[k]
        if a is None:
            return _opaque(f"{program} with an option that is not static")
        if a in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            k += 2
            continue
        if a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
            code = texts[k + 1] if k + 1 < len(texts) else None
            if code is not None and re.search(r"\$\{?[0-9@*#]", code):
                # `bash -c '$0 x' rm`: the words after the code fill it in where it runs
                return _opaque(f"{program} -c code takes its words from the arguments after it")
            return _shell(code)
        if a in ("-s", "-") or (a.startswith("-") and not a.startswith("--") and "s" in a[1:]):
            break
        if a.startswith(("-", "+")):
            k += 1
            continue
        if _from_a_pipe(a):
            if stdin.kind == "static" and a in ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"):
                return _shell(stdin.text)
            return _opaque(f"{program} runs shell code it reads from a pipe")
        return None  # a script file: trusted like any program (its read is recorded below)
    if stdin.kind == "static":
        return _shell(stdin.text)
    if stdin.kind == "piped":
        return _opaque(f"{program} runs shell code it reads from its standard input")
    return _opaque(f"{program} starts a shell that reads commands from the terminal")


def _from_a_pipe(path: str) -> bool:
    return path in ("-", "/dev/stdin") or path.startswith(("/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"))


def _ssh(args: Sequence[Word]) -> Inner | None:
    values = frozenset({"-b", "-c", "-D", "-E", "-e", "-F", "-I", "-i", "-J", "-L", "-l", "-m", "-O", "-o", "-p",
                        "-Q", "-R", "-S", "-W", "-w"})
    i = skip_options(args, values)
    rest = _texts(args[i + 1:])  # after the host
    if not rest:
        return None
    return _shell(" ".join(r for r in rest if r is not None) if None not in rest else None)


# git settings whose value is a command git runs
_GIT_COMMAND_KEYS = re.compile(r"^(core\.(pager|editor|sshcommand|fsmonitor|hookspath|askpass|gitproxy)|"
                               r"diff\..*\.(textconv|command)|diff\.external|filter\..*\.(clean|smudge|process)|"
                               r"merge\..*\.driver|credential\..*helper|credential\.helper|sequence\.editor|"
                               r"gpg\.program|gpg\..*\.program|pager\..*|web\.browser|browser\..*\.cmd|"
                               r"uploadpack\.packobjectshook|remote\..*\.(uploadpack|receivepack)|protocol\..*|"
                               r"include\.path|includeif\..*|alias\..*|core\.gitproxy)=", re.IGNORECASE)


def _git(args: Sequence[Word]) -> Inner | None:
    texts = _texts(args)
    k = 0
    chdirs: list[str | None] = []
    while k < len(args):
        a = texts[k]
        if a is None:
            return _opaque("git with an option that is not static")
        if a in ("-c", "--config-env"):
            value = texts[k + 1] if k + 1 < len(texts) else None
            if value is None or _GIT_COMMAND_KEYS.match(value):
                return _opaque("git -c sets a command git runs")
            k += 2
            continue
        if a.startswith("--exec-path") or a.startswith("--config-env="):
            return _opaque("git runs its commands from another place")
        if a == "-C":
            chdirs.append(texts[k + 1] if k + 1 < len(texts) else None)
        if a in ("-C", "--git-dir", "--work-tree", "--namespace"):
            k += 2
            continue
        if a.startswith("-"):
            k += 1
            continue
        break
    if k == 0 or k >= len(args):
        return None
    # `git -C dir push` is `git push` run elsewhere: rules on git's subcommands see it without the
    # global options (the command as written is recorded too)
    # `git -C a -C b` runs in a/b (a later absolute -C starts over)
    chdir: Word | None = None
    if chdirs:
        chdir = NOT_STATIC if None in chdirs else Word.literal(os.path.join(*(c for c in chdirs if c is not None)))
    return Inner("argv", ((Word.literal("git"), *args[k:]),), chdir=chdir)
