"""The working-directory boundary for Bash (issue 28 item 3): a command that reads, lists or changes
into a place outside the working directories asks — in dontAsk is denied — with Claude Code 2.1.332's
text, whatever the program, and a read-only program the table cannot place asks (fail closed).

The texts below are the ones Claude Code gave for these commands run from a workspace beside ``out/``
(tests/fidelity/scenarios/boundary_bash_default.json and the opt-in tests/test_boundary_oracle.py
compare them with Claude Code itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentfsm.hooks.bash_boundary import REACH, UNCLASSIFIED, outside, path_words
from agentfsm.hooks.permissions import PermissionPolicy
from agentfsm.tools import bash as bash_tool
from agentfsm.tools.bash import BashTool
from agentfsm.tools.shell import analyse


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "ws" / "in.txt").write_text("IN\n")
    (tmp_path / "ws" / "sub").mkdir()
    (tmp_path / "out" / "o.txt").write_text("O\n")
    (tmp_path / "ws" / "link").symlink_to(tmp_path / "out")
    return (tmp_path / "ws").resolve()


def blocked(program: str, path: str, verb: str, ws: Path) -> str:
    return (f"{program} in '{path}' was blocked. For security, Claude Code may only {verb} the allowed working "
            f"directories for this session: '{ws}'.")


def text(command: str, ws: Path, mode: str = "default", dirs: tuple[Path, ...] = ()) -> tuple[str, str]:
    policy = PermissionPolicy.build(ws, mode=mode, additional_directories=dirs)
    d = policy.evaluate(BashTool(), {"command": command})
    return d.behavior, d.reason


# Claude Code's answers, in its words ($OUT is the directory beside the workspace)
CASES = [
    ("cat ../out/o.txt", "cat", "$OUT/o.txt", "concatenate files from"),
    ("head -n 1 ../out/o.txt", "head", "$OUT/o.txt", "read the beginning of files from"),
    ("tail ../out/o.txt", "tail", "$OUT/o.txt", "read the end of files from"),
    ("ls ../out", "ls", "$OUT", "list files in"),
    ("ls -la ../out/", "ls", "$OUT", "list files in"),
    ("ls in.txt ../out", "ls", "$OUT", "list files in"),
    ("ls && ls ../out", "ls", "$OUT", "list files in"),
    ("ls link", "ls", "$OUT", "list files in"),
    ("grep O ../out/o.txt", "grep", "$OUT/o.txt", "search for patterns in files from"),
    ("grep -e O ../out/o.txt", "grep", "$OUT/o.txt", "search for patterns in files from"),
    ("grep -f ../out/o.txt in.txt", "grep", "$OUT/o.txt", "search for patterns in files from"),
    ("grep -r O ../out", "grep", "$OUT", "search for patterns in files from"),
    ("wc -l ../out/o.txt", "wc", "$OUT/o.txt", "count lines/words/bytes in files from"),
    ("sort -k1 ../out/o.txt", "sort", "$OUT/o.txt", "sort contents of files from"),
    ("sort -o ../out/s.txt in.txt", "sort", "$OUT/s.txt", "sort contents of files from"),
    ("diff in.txt ../out/o.txt", "diff", "$OUT/o.txt", "compare files from"),
    ("stat ../out/o.txt", "stat", "$OUT/o.txt", "read file stats from"),
    ("stat -c %s ../out/o.txt", "stat", "$OUT/o.txt", "read file stats from"),
    ("file -b ../out/o.txt", "file", "$OUT/o.txt", "examine file types in"),
    ("cd ../out", "cd", "$OUT", "change directories to"),
    ("cd link", "cd", "$OUT", "change directories to"),
    ("cd ../out && ls", "cd", "$OUT", "change directories to"),
    ("cd", "cd", "$HOME", "change directories to"),
    ("rg O ../out", "rg", "$OUT", "search for patterns in files from"),
    ("sed -n 1p ../out/o.txt", "sed", "$OUT/o.txt", "edit files in"),
    ("awk '{print}' ../out/o.txt", "awk", "$OUT/o.txt", "process text from files in"),
    ("uniq ../out/o.txt", "uniq", "$OUT/o.txt", "filter duplicate lines from files in"),
    ("cut -c1 ../out/o.txt", "cut", "$OUT/o.txt", "extract columns from files in"),
    ("find ../out -name '*.txt'", "find", "$OUT", "search files in"),
    ("find . ../out -name x", "find", "$OUT", "search files in"),
    ("cat link/o.txt", "cat", "$OUT/o.txt", "concatenate files from"),
    ("cat ../out/*.txt", "cat", "$OUT", "concatenate files from"),
    ("cat ./../out/o.txt", "cat", "$OUT/o.txt", "concatenate files from"),
    ("cat -- ../out/o.txt", "cat", "$OUT/o.txt", "concatenate files from"),
    ("cat /dev/null", "cat", "/dev/null", "concatenate files from"),
    ("od -c ../out/o.txt", "od", "$OUT/o.txt", "display octal dump of files from"),
    ("strings ../out/o.txt", "strings", "$OUT/o.txt", "extract strings from files in"),
    ("nl ../out/o.txt", "nl", "$OUT/o.txt", "number lines in files from"),
    ("tac ../out/o.txt", "tac", "$OUT/o.txt", "read files (reversed) from"),
    ("rev ../out/o.txt", "rev", "$OUT/o.txt", "read files (reversed lines) from"),
    ("cmp ../out/o.txt in.txt", "cmp", "$OUT/o.txt", "compare files from"),
    ("paste ../out/o.txt in.txt", "paste", "$OUT/o.txt", "merge files from"),
    ("md5sum ../out/o.txt", "md5sum", "$OUT/o.txt", "compute MD5 checksums for files in"),
    ("sha256sum ../out/o.txt", "sha256sum", "$OUT/o.txt", "compute SHA-256 checksums for files in"),
    ("jq . ../out/o.txt", "jq", "$OUT/o.txt", "process JSON from files in"),
    ("base64 ../out/o.txt", "base64", "$OUT/o.txt", "encode/decode files from"),
    ("fold ../out/o.txt", "fold", "$OUT/o.txt", "wrap lines of files from"),
    ("pr ../out/o.txt", "pr", "$OUT/o.txt", "paginate files from"),
    ("git diff --no-index in.txt ../out/o.txt", "git", "$OUT/o.txt", "access files with git from"),
]


@pytest.mark.parametrize(("command", "part"), [("cat in.txt | grep O ../out/o.txt", "grep O ../out/o.txt"),
                                               ("cat ../out/o.txt | wc -l", "cat ../out/o.txt"),
                                               ("echo x | tee ../out/x.txt", "tee ../out/x.txt"),
                                               ("cat in.txt | cat - ../out/o.txt", "cat - ../out/o.txt"),
                                               ("echo x | tee t.txt", "tee t.txt"),
                                               ("touch a.txt | cat", "touch a.txt"),
                                               ("cat in.txt | python3 -c 'print(1)'", "python3 -c 'print(1)'"),
                                               ("ls | xargs cat", "xargs cat")])
def test_a_part_of_a_pipeline_is_named_as_a_part(ws: Path, command: str, part: str) -> None:
    assert text(command, ws) == ("ask", "This Bash command contains multiple operations. The following part "
                                        f"requires approval: {part}")
    assert text("ls | grep ../out", ws)[0] == "allow"  # a pattern, not a path


def test_a_bash_allow_rule_does_not_open_the_boundary(ws: Path) -> None:
    out = (ws.parent / "out").resolve()
    policy = PermissionPolicy.build(ws, allow=["Bash(ls:*)", "Bash(cat:*)", "Bash(cd:*)"])
    for command, program in (("ls ../out", "ls"), ("cat ../out/o.txt", "cat"), ("cd ../out", "cd")):
        d = policy.evaluate(BashTool(), {"command": command})
        assert d.behavior == "ask" and d.reason.startswith(f"{program} in '{out}"), command
    assert policy.evaluate(BashTool(), {"command": "cat in.txt"}).behavior == "allow"
    # a Read allow rule over the place does; bypassPermissions runs everything
    reads = PermissionPolicy.build(ws, allow=[f"Read(/{out}/**)", "Read(//etc/hostname)"])
    assert reads.evaluate(BashTool(), {"command": "cat ../out/o.txt /etc/hostname"}).behavior == "allow"
    assert reads.evaluate(BashTool(), {"command": "cat /etc/passwd"}).behavior == "ask"
    assert PermissionPolicy.build(ws, mode="bypassPermissions").evaluate(
        BashTool(), {"command": "ls ../out"}).behavior == "allow"


def test_plan_mode_names_the_boundary_too(ws: Path) -> None:
    assert text("sed -n 1p ../out/o.txt", ws, "plan")[1].startswith(f"sed in '{ws.parent}/out/o.txt' was blocked.")


@pytest.mark.parametrize(("command", "program", "path", "verb"), CASES)
def test_claude_codes_text_for_each_command(ws: Path, command: str, program: str, path: str, verb: str) -> None:
    where = path.replace("$OUT", str(ws.parent / "out")).replace("$HOME", str(Path.home().resolve()))
    behavior, reason = text(command, ws)
    assert (behavior, reason) == ("ask", blocked(program, where, verb, ws))
    # dontAsk turns the ask into its denial; an added directory that holds the path lets it through
    assert text(command, ws, "dontAsk")[0] == "deny"
    if path.startswith("$OUT"):
        assert text(command, ws, dirs=(ws.parent / "out",))[1] != reason


@pytest.mark.parametrize("command", ["ls ../out", "find ../out -name '*.txt'", "stat ../out/o.txt",
                                     "cd ../out && ls", "ls /", "ls ~", "cd .. && ls", "ls -d ../out",
                                     "du -a ../out", "tree ../out", "cd - && ls", "ls link/"])
def test_listing_or_changing_into_a_place_outside_never_runs_unasked(ws: Path, command: str) -> None:
    # the hole of issue 28 item 3: these ran without asking
    for mode in ("default", "acceptEdits", "plan"):
        assert text(command, ws, mode)[0] != "allow", (mode, command)


def test_input_redirection_from_outside(ws: Path) -> None:
    assert text("tr a b < ../out/o.txt", ws)[1] == (
        f"Input redirection from '{ws.parent}/out/o.txt' was blocked. For security, Claude Code may only read "
        f"files in the allowed working directories for this session: '{ws}'.")


@pytest.mark.parametrize("command", ["less ../out/o.txt", "cksum ../out/o.txt", "sha512sum ../out/o.txt",
                                     "git -C ../out status", "du ../out", "python3 ../out/s.py", "cd -"])
def test_no_phrase_of_claude_codes_asks_unclassified(ws: Path, command: str) -> None:
    assert text(command, ws) == ("ask", UNCLASSIFIED)


def test_writes_name_the_path_folded_and_a_copy_from_outside_its_source(ws: Path) -> None:
    out = ws.parent / "out"
    assert text("cp ../out/o.txt here.txt", ws)[1].startswith(f"cp in '{out}/o.txt' needs approval. The path is "
                                                             "outside")
    assert text("echo hi > ../out/x.txt", ws)[1].startswith(f"Output redirection to '{out}/x.txt' needs approval")
    # an output redirection is named before a place the command reads
    assert text("sort ../out/o.txt > sorted.txt", ws)[1].startswith(
        f"Output redirection to '{ws}/sorted.txt' needs approval. The path is inside")
    # acceptEdits does not let a file from outside be copied in
    assert text("cp ../out/o.txt here.txt", ws, "acceptEdits")[0] == "ask"
    assert text("cat ../out/o.txt > here.txt", ws, "acceptEdits")[0] == "ask"
    assert text("cp in.txt here.txt", ws, "acceptEdits")[0] == "allow"


@pytest.mark.parametrize("command", ["cat in.txt", "ls", "ls sub", "cd sub && ls",
                                     "grep -r IN .", "find . -name x", "realpath ../out/o.txt", "basename ../x",
                                     "head -n 1 in.txt", "cat ../ws/in.txt", "stat in.txt", "du -sh sub",
                                     "cut -d / -f1 in.txt", "sort -t / -k2 in.txt", "find -L . -name x"])
def test_inside_the_workspace_reads_run(ws: Path, command: str) -> None:
    assert text(command, ws) == ("allow", ""), command


def test_an_added_directory_is_inside(ws: Path) -> None:
    out = ws.parent / "out"
    assert text("ls ../out", ws, dirs=(out,)) == ("allow", "")
    assert text("cat ../out/o.txt", ws, dirs=(out,)) == ("allow", "")
    behavior, reason = text("cat /etc/hostname", ws, dirs=(out,))
    assert behavior == "ask" and reason.endswith(f"for this session: '{ws}', '{out.resolve()}'.")


def test_every_read_only_program_has_a_table_entry() -> None:
    # fail closed is the fallback; the table is meant to name every program the classifier trusts
    missing = sorted(p for p in bash_tool._ANY_ARGS if p not in REACH)
    assert missing == []


def test_a_read_only_program_the_table_lacks_has_every_word_judged(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentfsm.hooks import bash_boundary

    monkeypatch.setattr(bash_boundary, "REACH", {k: v for k, v in REACH.items() if k != "stat"})
    found = outside(analyse("stat -c %s ../out/o.txt", str(ws)), ws, [ws])
    assert found is not None and found.text([ws]) == UNCLASSIFIED


def test_option_values_are_not_paths_but_file_options_are() -> None:
    assert path_words("head", ["head", "-n", "/x", "f"], REACH["head"]) == [3]
    assert path_words("grep", ["grep", "-e", "p", "a", "b"], REACH["grep"]) == [3, 4]
    assert path_words("grep", ["grep", "p", "a"], REACH["grep"]) == [2]
    assert path_words("grep", ["grep", "-f", "pats", "a"], REACH["grep"]) == [2, 3]
    assert path_words("jq", ["jq", "--arg", "k", "/v", ".", "f"], REACH["jq"]) == [5]
    assert path_words("ls", ["ls", "-la"], REACH["ls"]) == ["."]
    assert path_words("cd", ["cd"], REACH["cd"]) == ["~"]
    assert path_words("find", ["find", "a", "b", "-name", "/x"], REACH["find"]) == [1, 2]


_WORDS = st.sampled_from(["../out", "../out/o.txt", "/etc/hostname", "~", "link", "link/o.txt", "/", "..",
                          "../out/*.txt", "{in.txt,../out/o.txt}", "~/x"])
_OPTS = st.sampled_from(["", "-l", "-n 1", "-a", "-r", "--", "-c1"])


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(program=st.sampled_from(sorted(p for p, r in REACH.items() if r.operands not in ("none", "cd"))),
       opt=_OPTS, path=_WORDS, lead=st.sampled_from(["", "cd sub && ", "true; ", "echo x | "]))
def test_a_read_only_command_reaching_outside_never_runs_unasked(ws: Path, program: str, opt: str, path: str,
                                                                 lead: str) -> None:
    # whatever the program, its options and how the path is spelt: a command that would run without
    # asking (read-only) never names a place outside among its file operands
    assume(not opt or opt.split()[0] not in REACH[program].values)  # an option that takes the next word
    script = "x " if REACH[program].operands == "script" and program not in ("git",) else ""
    command = f"{lead}{program} {opt} {script}{path}".replace("  ", " ")
    behavior, _ = text(command, ws)
    if behavior == "allow":
        # allowed only when the outside word is not a file operand: the value of an option the table
        # declares (`rg -r ../out x`), or the pattern
        argv = command.split(" && ")[-1].split("; ")[-1].split(" | ")[-1].split()
        k = argv.index(path) if path in argv else -1
        assert k > 1, command
        before = argv[k - 1]
        reach = REACH[program]
        # (find takes its start directories before any other word that starts with a dash)
        assert before in reach.values or (reach.operands == "script" and not script) or (
            reach.operands == "find" and before not in ("-H", "-L", "-P")), command


# --- the file tools at the boundary -------------------------------------------------------------


def test_a_file_tool_through_a_symlink_says_where_it_resolves(ws: Path) -> None:
    from agentfsm.tools import GlobTool, GrepTool, ReadTool, WriteTool

    out = (ws.parent / "out").resolve()
    policy = PermissionPolicy.build(ws)
    read = policy.evaluate(ReadTool(), {"file_path": f"{ws}/link/o.txt"})
    assert (read.behavior, read.reason) == ("ask", (
        f"Claude requested permissions to read from {ws}/link/o.txt, but you haven't granted it yet. "
        f"{ws}/link/o.txt resolves through a symlink to {out}/o.txt, which is outside the allowed working "
        "directories."))
    write = policy.evaluate(WriteTool(), {"file_path": f"{ws}/link/w.txt", "content": "x"})
    assert write.reason.endswith(f"{ws}/link/w.txt resolves through a symlink to {out}/w.txt, which is outside "
                                 "the allowed working directories.")
    for tool in (GlobTool(), GrepTool()):
        d = policy.evaluate(tool, {"pattern": "*", "path": f"{ws}/link"})
        assert d.reason.endswith(f"{ws}/link resolves through a symlink to {out}, which is outside the allowed "
                                 "working directories."), tool.name
    # written outside: no sentence about links
    plain = policy.evaluate(ReadTool(), {"file_path": f"{out}/o.txt"})
    assert plain.reason == f"Claude requested permissions to read from {out}/o.txt, but you haven't granted it yet."


def test_a_relative_glob_pattern_never_climbs_out_of_its_directory(ws: Path) -> None:
    from agentfsm.tools import GlobTool
    from agentfsm.tools.glob import find_files, split_literal_prefix

    assert PermissionPolicy.build(ws).evaluate(GlobTool(), {"pattern": "../out/*.txt"}).behavior == "allow"
    assert find_files(str(ws), "../out/*.txt") == []
    assert find_files(str(ws), "sub/../../out/*.txt") == []
    assert split_literal_prefix("/r", "a/b/*.py") == ("/r/a/b", "*.py")
    assert split_literal_prefix("/r", "../x/*.py") == ("/r", "../x/*.py")
    # nor through a symlink in the workspace (Claude Code: "No files found", asked nothing)
    assert PermissionPolicy.build(ws).evaluate(GlobTool(), {"pattern": "link/*.txt"}).behavior == "allow"
    assert find_files(str(ws), "link/*.txt") == [] and find_files(str(ws), "link/o.txt") == []
    assert find_files(str(ws), "sub/*.txt") == [] and len(find_files(str(ws), "*.txt")) == 1
    # an absolute pattern is still judged by where it points
    assert PermissionPolicy.build(ws).evaluate(GlobTool(), {"pattern": f"{ws.parent}/out/*.txt"}).behavior == "ask"


@pytest.mark.parametrize(("given", "listed"), [("../out/o.txt", "$OUT/o.txt"), ("$WS/../out/o.txt", "$OUT/o.txt"),
                                               ("$WS/link/o.txt", "$WS/link/o.txt"), ("in.txt", "$WS/in.txt")])
def test_a_denial_lists_a_file_tools_path_absolute_and_folded(ws: Path, given: str, listed: str) -> None:
    from agentfsm.tools import EditTool, GrepTool, ReadTool, WriteTool

    def sub(p: str) -> str:
        return p.replace("$WS", str(ws)).replace("$OUT", str(ws.parent / "out"))

    for tool in (ReadTool(), WriteTool(), EditTool()):
        assert tool.denial_input({"file_path": sub(given)}, ws)["file_path"] == sub(listed)
    assert EditTool().denial_input({"file_path": "a"}, ws)["replace_all"] is False
    # Grep is listed as given: no defaults filled in (Claude Code's Grep lists none)
    assert GrepTool().denial_input({"pattern": "O", "path": "../out"}, ws) == {"pattern": "O", "path": "../out"}


def test_a_sibling_whose_name_starts_with_the_workspaces_is_outside(ws: Path) -> None:
    """``/x/ws-evil`` is not inside ``/x/ws``: reading or listing it asks with Claude Code's text, while
    the workspace's own files run."""
    evil = ws.parent / f"{ws.name}-evil"
    evil.mkdir()
    (evil / "k.txt").write_text("K\n")
    assert text(f"cat {evil}/k.txt", ws) == ("ask", blocked("cat", f"{evil}/k.txt", "concatenate files from", ws))
    assert text(f"ls ../{ws.name}-evil", ws) == ("ask", blocked("ls", str(evil), "list files in", ws))
    assert text("cat in.txt", ws)[0] == "allow"
