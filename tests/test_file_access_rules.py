"""The file-access policy's own rules, one property each on both sides: where each kind of rule
pattern is anchored, what a symlink or a hard link to a file is judged as, when a whole directory is
denied, and the walk budgets (exactly at the budget is checked, one past it is denied)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfsm.hooks import file_access
from agentfsm.hooks.file_access import PathChecker, path_rule_matches, rule_root
from agentfsm.hooks.permissions import PermissionRule

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
names = st.sampled_from(["a.txt", "b.txt", ".env"])


def deny(*specs: str, root: Path | None = None) -> list[PermissionRule]:
    return [PermissionRule.parse(f"Read({s})", "deny", root=root) for s in specs]


def _vanishing(monkeypatch: pytest.MonkeyPatch, suffix: str, error: type[Exception], *calls: str) -> None:
    """``os.<call>`` raises ``error`` for a path ending in ``suffix`` (an entry that vanished or cannot
    be read while a search runs); every other path is answered as usual."""
    for name in calls:
        real = getattr(os, name)

        def failing(path: object, *args: object, _real: object = real, **kw: object) -> os.stat_result:
            if str(path).endswith(suffix):
                raise error(path)
            return _real(path, *args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(os, name, failing)


@SETTINGS
@given(rule=names, asked=names, deep=st.booleans())
def test_each_kind_of_pattern_is_anchored_where_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        rule: str, asked: str, deep: bool) -> None:
    """`//abs` from the filesystem root, `~/p` from home, `/p` from the project, `./p` from the cwd:
    each names one path; a bare name matches at any depth below the cwd."""
    home, cwd, project = tmp_path / "home", tmp_path / "cwd", tmp_path / "project"
    monkeypatch.setenv("HOME", str(home))
    sub = "sub/" if deep else ""
    same = rule == asked and not deep
    assert path_rule_matches(f"/{cwd}/{rule}", f"{cwd}/{sub}{asked}", cwd, None) == same
    assert path_rule_matches(f"~/{rule}", f"{home}/{sub}{asked}", cwd, None) == same
    assert not path_rule_matches(f"~/{rule}", f"{cwd}/{asked}", cwd, None)
    assert path_rule_matches(f"/{rule}", f"{project}/{sub}{asked}", cwd, project) == same
    assert path_rule_matches(f"./{rule}", f"{cwd}/{sub}{asked}", cwd, None) == same
    assert path_rule_matches(rule, f"{cwd}/{sub}{asked}", cwd, None) == (rule == asked)


def test_a_rules_root_is_its_literal_prefix(tmp_path: Path) -> None:
    assert rule_root("./src/*/deep/f.py", tmp_path, None) == str(tmp_path / "src")
    assert rule_root("./src/lib/f.py", tmp_path, None) == str(tmp_path / "src/lib/f.py")
    assert rule_root(".env", tmp_path, None) == str(tmp_path)  # any depth: the whole cwd
    assert rule_root("*.key", tmp_path, None) == str(tmp_path)


@SETTINGS
@given(denied=names, target=names)
def test_a_symlink_is_judged_as_what_it_points_to(tmp_path: Path, denied: str, target: str) -> None:
    (tmp_path / target).write_text("x")
    link = tmp_path / f"link-{target}"
    if not link.is_symlink():
        link.symlink_to(tmp_path / target)
    found = PathChecker(tmp_path, deny(f"./{denied}")).check(str(link))
    if denied == target:
        assert found is not None and found.through_link and found.rule == f"Read(./{denied})"
    else:
        assert found is None
    direct = PathChecker(tmp_path, deny(f"./{denied}")).check(str(tmp_path / target))
    assert (direct is not None and not direct.through_link) == (denied == target)


def test_missing_and_unreadable_paths_are_not_errors(tmp_path: Path) -> None:
    checker = PathChecker(tmp_path, deny("./a.txt"))
    assert checker.check(str(tmp_path / "nothing-here")) is None
    assert checker.check(str(tmp_path / "bad\x00name")) is None


@pytest.mark.parametrize("through_link", [False, True])
def test_a_directory_whose_every_entry_is_denied_is_denied_as_a_whole(tmp_path: Path, through_link: bool) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "open").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "secrets")
    checker = PathChecker(tmp_path, deny("./secrets/**"))
    found = checker.check_tree(str(tmp_path / ("alias" if through_link else "secrets")))
    assert found is not None and found.through_link == through_link
    assert checker.check_tree(str(tmp_path / "open")) is None


def test_creating_below_a_directory_meets_anchored_rules_only(tmp_path: Path) -> None:
    """Files yet to be made below a directory may land on an anchored rule's path; a rule such as
    `.env` is judged on what exists."""
    (tmp_path / "out").mkdir()
    assert PathChecker(tmp_path, deny("./out/new.txt")).check_below(str(tmp_path / "out"), creating=True) is not None
    assert PathChecker(tmp_path, deny("./out/new.txt")).check_below(str(tmp_path / "out")) is None
    assert PathChecker(tmp_path, deny(".env")).check_below(str(tmp_path / "out"), creating=True) is None
    (tmp_path / "out" / ".env").write_text("k")
    found = PathChecker(tmp_path, deny(".env")).check_below(str(tmp_path / "out"), creating=True)
    assert found is not None and found.through_link


@pytest.mark.parametrize("sibling", ["out-public", "out.bak", "outer"])
def test_creating_below_a_sibling_of_a_denied_directory_is_not_below_it(tmp_path: Path, sibling: str) -> None:
    """"Below a denied directory" is a path test, not a string-prefix one: `out-public` is not inside `out`."""
    (tmp_path / sibling).mkdir()
    assert PathChecker(tmp_path, deny("./out/**")).check_below(str(tmp_path / sibling), creating=True) is None
    assert PathChecker(tmp_path, deny("./out/**")).check_below(str(tmp_path), creating=True) is not None


@pytest.mark.parametrize("extra", [0, 1])
def test_a_walk_checks_exactly_its_budget_and_denies_past_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             extra: int) -> None:
    monkeypatch.setattr(file_access, "WALK_LIMIT", 4)
    for i in range(4 + extra):
        (tmp_path / f"f{i}").write_text("x")
    found = PathChecker(tmp_path, deny("./elsewhere")).check_below(str(tmp_path))
    assert (found is not None and "more than 4 entries" in found.rule) == bool(extra)


def test_the_walk_limits_are_the_documented_ones() -> None:
    """docs/deny-rules.md: 200 000 entries to find a hard link's other names, 100 000 below a directory,
    10 000 paths a glob in a command expands to."""
    assert (file_access.HARDLINK_WALK_LIMIT, file_access.WALK_LIMIT, file_access.GLOB_LIMIT) == \
        (200_000, 100_000, 10_000)
    page = (Path(__file__).resolve().parents[1] / "docs" / "deny-rules.md").read_text()
    assert "(200 000, 100 000 and 10 000 entries)" in page


@pytest.mark.parametrize("extra", [0, 1])
def test_a_hard_link_is_judged_by_its_other_names_within_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                extra: int) -> None:
    """Another name of a denied file is denied; when the search for other names stops at its budget
    (one past it), a hard-linked file is denied because it could not be cleared."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text("k")
    for i in range(2 + extra):
        (secrets / f"pad{i}").write_text("p")
    os.link(secrets / "key", tmp_path / "innocent")
    (tmp_path / "plain").write_text("p")
    os.link(tmp_path / "plain", tmp_path / "plain2")
    # the walk of secrets/ sees its 3 + extra entries
    monkeypatch.setattr(file_access, "HARDLINK_WALK_LIMIT", 3)
    checker = PathChecker(tmp_path, deny("./secrets/**"))
    found = checker.check(str(tmp_path / "plain2"))
    if extra:
        assert found is not None and found.through_link and "could not all be checked" in found.rule
    else:
        assert found is None
        hit = PathChecker(tmp_path, deny("./secrets/**")).check(str(tmp_path / "innocent"))
        assert hit is not None and hit.through_link and hit.rule == "Read(./secrets/**)"


def test_a_symlink_loop_is_walked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link back up the tree is entered once (by where it leads), so the walk stays within budget."""
    monkeypatch.setattr(file_access, "WALK_LIMIT", 10)
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (tmp_path / "d" / name).write_text("x")
    (tmp_path / "d" / "sub" / "up").symlink_to(tmp_path / "d")
    assert PathChecker(tmp_path, deny("./elsewhere")).check_below(str(tmp_path / "d")) is None
    found = PathChecker(tmp_path, deny("./d/b")).check_below(str(tmp_path / "d"))
    assert found is not None and found.rule == "Read(./d/b)"


def test_the_hard_link_search_skips_what_it_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule whose directory does not exist, or an entry that vanished while the search ran, is
    skipped: the other names found still decide."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text("k")
    (secrets / "gone").write_text("g")
    os.link(secrets / "key", tmp_path / "innocent")
    _vanishing(monkeypatch, "gone", FileNotFoundError, "lstat")
    found = PathChecker(tmp_path, deny("./missing/**", "./secrets/**")).check(str(tmp_path / "innocent"))
    assert found is not None and found.through_link and found.rule == "Read(./secrets/**)"


@pytest.mark.parametrize("count", [0, 1, 3, 4])
def test_a_glob_expands_up_to_its_budget_and_is_unknown_past_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                count: int) -> None:
    """Every match up to GLOB_LIMIT (exactly at it included); one more and the expansion is unknown
    (None); no match leaves the pattern as bash does, unescaped."""
    monkeypatch.setattr(file_access, "GLOB_LIMIT", 3)
    for i in range(count):
        (tmp_path / f"f{i}.txt").write_text("x")
    got = file_access.expand_glob(str(tmp_path / "f*.txt"))
    if count == 0:
        assert got == [str(tmp_path / "f*.txt")]
        assert file_access.expand_glob(str(tmp_path / "g\\*.txt")) == [str(tmp_path / "g*.txt")]
    elif count <= 3:
        assert sorted(got or ()) == [str(tmp_path / f"f{i}.txt") for i in range(count)]
    else:
        assert got is None


@pytest.mark.parametrize("entries", [0, 2])
def test_everything_below_a_denied_directory_is_denied_by_the_directory(tmp_path: Path, entries: int) -> None:
    """Empty or not, a directory a rule covers is denied as itself (not through what is inside)."""
    (tmp_path / "secrets").mkdir()
    for i in range(entries):
        (tmp_path / "secrets" / f"k{i}").write_text("k")
    found = PathChecker(tmp_path, deny("./secrets")).check_below(str(tmp_path / "secrets"))
    assert found is not None and found.rule == "Read(./secrets)" and not found.through_link


# --- names that go away: writing over or removing a denied file that has other names ------------


@pytest.mark.parametrize("links", [1, 2, 3])
def test_unlinking_a_denied_name_is_denied_only_while_other_names_exist(tmp_path: Path, links: int) -> None:
    (tmp_path / "secret").write_text("s")
    for i in range(links - 1):
        os.link(tmp_path / "secret", tmp_path / f"other{i}")
    (tmp_path / "plain").write_text("p")
    os.link(tmp_path / "plain", tmp_path / "plain2")
    checker = PathChecker(tmp_path, deny("./secret"))
    found = checker.check_unlink(str(tmp_path / "secret"))
    assert (found is not None) == (links > 1)
    if found is not None:
        assert found.rule.startswith("Read(./secret) (a file with other hard-linked names")
        assert found.path == str(tmp_path / "secret")
    # a name no rule covers, a hard-linked one included, may go: nothing denied is exposed
    assert checker.check_unlink(str(tmp_path / "plain")) is None
    # removing the other name exposes nothing either (it is denied only through the link)
    if links > 1:
        assert checker.check_unlink(str(tmp_path / "other0")) is None
    assert checker.has_linked_denied() == (links > 1)
    assert not PathChecker(tmp_path, []).has_linked_denied()
    assert PathChecker(tmp_path, []).check_unlink(str(tmp_path / "secret")) is None


def test_unlinking_judges_the_name_not_what_a_symlink_points_to(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "secret").write_text("s")
    os.link(real / "secret", tmp_path / "other")
    os.symlink("real", tmp_path / "via")
    os.symlink("real/secret", tmp_path / "alias")
    checker = PathChecker(tmp_path, deny("./real/secret"))
    # the directory on the way is resolved: via/secret is real/secret's own name
    assert checker.check_unlink(str(tmp_path / "via" / "secret")) is not None
    # a symlink named at the end is itself what goes away, not the file behind it
    assert checker.check_unlink(str(tmp_path / "alias")) is None
    # directories and missing names are not files with other names
    assert checker.check_unlink(str(real)) is None
    assert checker.check_unlink(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("extra", [0, 1])
def test_a_recursive_unlink_walks_exactly_its_budget_and_denies_past_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        extra: int) -> None:
    tree = tmp_path / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "secret").write_text("s")
    os.link(tree / "deep" / "secret", tmp_path / "other")
    checker = PathChecker(tmp_path, deny("./tree/deep/secret"))
    found = checker.check_unlink(str(tree), recursive=True)
    assert found is not None and "other hard-linked names" in found.rule and found.path == str(tree)
    assert checker.check_unlink(str(tree)) is None  # not recursive: the directory itself only
    os.unlink(tmp_path / "other")
    for i in range(2 + extra):
        (tree / f"pad{i}").write_text("p")
    # tree holds deep, deep/secret and the pads: 4 + extra entries
    monkeypatch.setattr(file_access, "WALK_LIMIT", 4)
    found = checker.check_unlink(str(tree), recursive=True)
    assert (found is not None and "more than 4 entries" in found.rule) == bool(extra)


@pytest.mark.parametrize("extra", [0, 1])
def test_the_search_for_linked_denied_files_stops_at_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                extra: int) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for i in range(3 + extra):
        (secrets / f"f{i}").write_text("x")
    monkeypatch.setattr(file_access, "HARDLINK_WALK_LIMIT", 3)
    # nothing is hard-linked: within the budget that is known, past it it is not
    assert PathChecker(tmp_path, deny("./secrets/**")).has_linked_denied() == bool(extra)


# --- each rule of the policy on both sides (the survivors of the full mutation run) ----------------


def test_the_root_the_home_and_a_slash_inside_anchor_a_pattern(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`//name` is the one file at the filesystem root, `~` alone is the whole home directory, a slash
    inside a pattern anchors it at the cwd; a trailing slash alone does not (a directory at any depth)."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    monkeypatch.setenv("HOME", str(home))
    assert path_rule_matches("//x.key", "/x.key", cwd, None)
    assert not path_rule_matches("//x.key", "/a/x.key", cwd, None)
    assert path_rule_matches("~", f"{home}/a.txt", cwd, None)
    assert not path_rule_matches("~", f"{cwd}/a.txt", cwd, None)
    assert path_rule_matches("sub/a.txt", f"{cwd}/sub/a.txt", cwd, None)
    assert not path_rule_matches("sub/a.txt", f"{cwd}/x/sub/a.txt", cwd, None)
    assert path_rule_matches("sub/", f"{cwd}/x/sub/a.txt", cwd, None)


def test_a_rules_root_reads_past_empty_and_dot_segments(tmp_path: Path) -> None:
    assert rule_root("./src//lib/./f.py", tmp_path, None) == str(tmp_path / "src/lib/f.py")
    assert rule_root("//" + str(tmp_path)[1:] + "/./a/*.py", tmp_path, None) == str(tmp_path / "a")


def test_a_path_with_a_leading_double_slash_is_the_same_path(tmp_path: Path) -> None:
    """POSIX keeps `//` at the start of a path through normpath; it names the same file as `/`."""
    (tmp_path / "secret").write_text("s")
    assert file_access.normalise("//" + str(tmp_path)[1:] + "/secret") == str(tmp_path / "secret")
    found = PathChecker(tmp_path, deny("./secret")).check("//" + str(tmp_path)[1:] + "/secret")
    assert found is not None and found.rule == "Read(./secret)"


def test_without_rules_nothing_is_walked_or_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rule, no denial: not even past the walk's budget (there is nothing to look for)."""
    monkeypatch.setattr(file_access, "WALK_LIMIT", 1)
    monkeypatch.setattr(file_access, "HARDLINK_WALK_LIMIT", 0)
    for i in range(3):
        (tmp_path / f"f{i}").write_text("x")
    os.link(tmp_path / "f0", tmp_path / "f0-alias")
    checker = PathChecker(tmp_path, [])
    assert not checker
    assert checker.check_below(str(tmp_path)) is None
    assert checker.check(str(tmp_path / "f0-alias")) is None


def test_a_directory_denied_itself_is_reported_under_the_rule_that_names_it(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    found = PathChecker(tmp_path, deny("./d/*", "./d")).check_tree(str(tmp_path / "d"))
    assert found is not None and found.rule == "Read(./d)"
    found = PathChecker(tmp_path, deny("./d/*")).check_tree(str(tmp_path / "d"))
    assert found is not None and found.rule == "Read(./d/*)"


def test_creating_below_a_directory_that_does_not_exist_yet_meets_the_rules_there(tmp_path: Path) -> None:
    """`cp -r src new` creates `new` and the names below it: a rule for a path there denies it, as it does
    below an existing directory; a rule elsewhere does not."""
    (tmp_path / "old").mkdir()
    for target in ("new", "old"):
        found = PathChecker(tmp_path, deny(f"./{target}/.env")).check_below(str(tmp_path / target), creating=True)
        assert found is not None and found.rule == f"Read(./{target}/.env)"
        assert PathChecker(tmp_path, deny(f"./{target}/.env")).check_below(str(tmp_path / target)) is None
        assert PathChecker(tmp_path, deny("./elsewhere/.env")).check_below(str(tmp_path / target),
                                                                           creating=True) is None


def test_only_a_file_with_other_names_is_searched_for_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with one name, or a directory, has no other name to find: no search, so no denial for a
    search that could not finish; a file with two names is denied when the search cannot finish."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "key").write_text("k")
    (tmp_path / "plain").write_text("p")
    (tmp_path / "dir").mkdir()
    monkeypatch.setattr(file_access, "HARDLINK_WALK_LIMIT", 0)
    assert PathChecker(tmp_path, deny("./secrets/**")).check(str(tmp_path / "plain")) is None
    assert PathChecker(tmp_path, deny("./secrets/**")).check(str(tmp_path / "dir")) is None
    os.link(tmp_path / "plain", tmp_path / "plain2")
    found = PathChecker(tmp_path, deny("./secrets/**")).check(str(tmp_path / "plain"))
    assert found is not None and "could not all be checked" in found.rule


def test_the_hard_link_search_stays_on_the_files_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule whose root is on another file system cannot hold another name of the file: it is skipped
    (not walked, so it spends none of the budget), and the rules after it are still searched."""
    if os.stat("/proc").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /proc on a file system of its own")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "key").write_text("k")
    os.link(secrets / "key", tmp_path / "innocent")
    monkeypatch.setattr(file_access, "HARDLINK_WALK_LIMIT", 20)
    found = PathChecker(tmp_path, deny("//proc/**", "./secrets/**")).check(str(tmp_path / "innocent"))
    assert found is not None and found.through_link and found.rule == "Read(./secrets/**)"


def test_the_hard_link_search_does_not_follow_links_out_of_a_rules_root(tmp_path: Path) -> None:
    """What a symlink inside a denied directory points to is not denied by the rule (only the names
    below the directory are): another name of that file is not denied either."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("f")
    os.link(tmp_path / "elsewhere" / "f", tmp_path / "elsewhere" / "g")
    (tmp_path / "secrets" / "link").symlink_to(tmp_path / "elsewhere")
    checker = PathChecker(tmp_path, deny("./secrets/**"))
    assert checker.check(str(tmp_path / "secrets" / "link" / "f")) is not None
    assert PathChecker(tmp_path, deny("./secrets/**")).check(str(tmp_path / "elsewhere" / "g")) is None


def test_the_hard_link_search_indexes_only_the_files_a_rule_denies(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "ok.txt").write_text("o")
    (tmp_path / "d" / "a.key").write_text("k")
    os.link(tmp_path / "d" / "ok.txt", tmp_path / "ok-alias")
    os.link(tmp_path / "d" / "a.key", tmp_path / "key-alias")
    assert PathChecker(tmp_path, deny("./d/*.key")).check(str(tmp_path / "ok-alias")) is None
    found = PathChecker(tmp_path, deny("./d/*.key")).check(str(tmp_path / "key-alias"))
    assert found is not None and found.through_link


def test_the_hard_link_search_goes_on_past_an_entry_that_vanished(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry gone between listing and stat is skipped, and the rest of the rule's directory (here
    a subdirectory, always walked after it) is still searched."""
    secrets = tmp_path / "secrets"
    (secrets / "sub").mkdir(parents=True)
    (secrets / "gone").write_text("g")
    (secrets / "sub" / "key").write_text("k")
    os.link(secrets / "sub" / "key", tmp_path / "innocent")
    _vanishing(monkeypatch, "gone", FileNotFoundError, "lstat")
    found = PathChecker(tmp_path, deny("./secrets/**")).check(str(tmp_path / "innocent"))
    assert found is not None and found.through_link and found.rule == "Read(./secrets/**)"


class _Unstatable:
    """A directory entry whose type cannot be read (as os.DirEntry.is_dir may fail)."""

    def __init__(self, entry: os.DirEntry[str]) -> None:
        self.path, self.name = entry.path, entry.name

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        raise PermissionError(self.path)


@pytest.mark.parametrize("trouble", ["unlistable", "unstatable"])
def test_a_walk_goes_on_past_what_it_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 trouble: str) -> None:
    """A directory that cannot be listed, or an entry whose type cannot be read, is skipped; the rest of
    the walk still decides. (Listings are sorted here so the trouble always comes first.)"""
    top = tmp_path / "top"
    (top / "a-trouble").mkdir(parents=True)
    (top / "b-deep").mkdir()
    (top / "b-deep" / "key").write_text("k")
    real_scandir = os.scandir

    def scandir(path: str) -> list[object]:
        if trouble == "unlistable" and path.endswith("a-trouble"):
            raise PermissionError(path)
        entries = sorted(real_scandir(path), key=lambda e: e.name, reverse=trouble == "unlistable")
        return [_Unstatable(e) if trouble == "unstatable" and e.name == "a-trouble" else e for e in entries]

    monkeypatch.setattr(file_access.os, "scandir", scandir)
    found = PathChecker(tmp_path, deny("./top/b-deep/key")).check_below(str(top))
    assert found is not None and found.rule == "Read(./top/b-deep/key)"


def test_a_walk_below_a_directory_enters_its_symlinked_directories(tmp_path: Path) -> None:
    """A file reached through a symlinked directory is judged as what it is."""
    (tmp_path / "top").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.key").write_text("k")
    (tmp_path / "top" / "link").symlink_to(tmp_path / "outside")
    rule = "/" + str(tmp_path / "outside" / "secret.key")
    found = PathChecker(tmp_path, deny(rule)).check_below(str(tmp_path / "top"))
    assert found is not None and found.through_link and found.rule == f"Read({rule})"


def test_a_glob_expands_to_dotfiles_too(tmp_path: Path) -> None:
    """Safer to check more: `*` is expanded with the dotfiles (bash's dotglob)."""
    (tmp_path / ".env").write_text("e")
    (tmp_path / "a").write_text("a")
    assert sorted(file_access.expand_glob(str(tmp_path / "*")) or ()) == [str(tmp_path / ".env"), str(tmp_path / "a")]


@pytest.mark.parametrize("error", [OSError, ValueError])
def test_a_glob_that_cannot_be_expanded_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   error: type[Exception]) -> None:
    def failing(*_args: object, **_kw: object) -> list[str]:
        raise error("cannot")

    monkeypatch.setattr(file_access.wcglob, "iglob", failing)
    assert file_access.expand_glob(str(tmp_path / "*")) is None


def test_an_unmatched_glob_is_unescaped_to_its_last_character(tmp_path: Path) -> None:
    """An escape at the end takes the last character; a lone backslash at the end stays."""
    assert file_access.expand_glob(str(tmp_path / "x\\*")) == [str(tmp_path / "x*")]
    assert file_access.expand_glob(str(tmp_path / "x\\")) == [str(tmp_path / "x\\")]


def test_a_recursive_unlink_does_not_follow_symlinked_directories(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`rm -r tree` removes a symlink inside it, not what it points to: a denied, hard-linked file
    behind the link is not what goes away."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "secret").write_text("s")
    os.link(tmp_path / "real" / "secret", tmp_path / "other")
    (tmp_path / "tree").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "tree" / "link")
    assert PathChecker(tmp_path, deny("./real/secret")).check_unlink(str(tmp_path / "tree"), recursive=True) is None
    # with no rules there is nothing to find, and no walk to run out of budget on
    monkeypatch.setattr(file_access, "WALK_LIMIT", 1)
    assert PathChecker(tmp_path, []).check_unlink(str(tmp_path), recursive=True) is None


@pytest.mark.parametrize("error", [OSError, ValueError])
def test_entries_that_cannot_be_read_are_passed_over_not_the_end_of_the_search(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[Exception]) -> None:
    (tmp_path / "tree" / "z").mkdir(parents=True)
    (tmp_path / "tree" / "gone").write_text("g")  # yielded before what lies in z/
    (tmp_path / "tree" / "z" / "secret").write_text("s")
    os.link(tmp_path / "tree" / "z" / "secret", tmp_path / "other")
    _vanishing(monkeypatch, "/gone", error, "lstat", "stat")
    checker = PathChecker(tmp_path, deny("./tree/**"))
    assert checker.check_unlink(str(tmp_path / "tree"), recursive=True) is not None
    assert checker.has_linked_denied()


def test_the_search_for_linked_denied_files_enters_symlinked_directories(tmp_path: Path) -> None:
    """A file reached through a symlink below a rule's root is denied by that spelling: if it has
    other names, an unnamed write may expose it."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("f")
    (tmp_path / "secrets").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "secrets" / "link")
    checker = PathChecker(tmp_path, deny("./secrets/**"))
    assert not checker.has_linked_denied()
    os.link(tmp_path / "elsewhere" / "f", tmp_path / "f2")
    assert PathChecker(tmp_path, deny("./secrets/**")).has_linked_denied()
