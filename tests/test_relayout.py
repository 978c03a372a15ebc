"""scripts/relayout.py, the codemod that moves fsm/ into subpackages matching the import-linter layers
(issue 31, item 5). It is applied to a copy of the repository (``git archive HEAD``), never to this
checkout: the copy must come out in the new layout, unchanged by a second run, ruff-clean, with every
contract kept, and with a smoke subset of its own tests passing on the moved package."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "relayout.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("relayout", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["relayout"] = module
    spec.loader.exec_module(module)
    return module


relayout = _load()
MAPPING: dict[str, str] = relayout.MAPPING


def _fine_layers(pyproject: str) -> list[str]:
    contracts = tomllib.loads(pyproject)["tool"]["importlinter"]["contracts"]
    return next(c["layers"] for c in contracts if c["type"] == "layers")


# --- the mapping -----------------------------------------------------------------------------------


def test_every_module_of_fsm_is_in_the_mapping() -> None:
    """A module added to fsm/ without a line in MAPPING fails here, with the line to add."""
    problems = relayout.unmapped(REPO)
    assert problems == [], "\n".join(problems)


def _tiny_repo(tmp_path: Path, layers: list[str], modules: list[str]) -> Path:
    (tmp_path / "fsm").mkdir()
    (tmp_path / "fsm" / "__init__.py").write_text("")
    for name in modules:
        (tmp_path / "fsm" / f"{name}.py").write_text("")
    body = "".join(f'    "{layer}",\n' for layer in layers)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.importlinter]\nroot_packages = ["agentfsm"]\n\n[[tool.importlinter.contracts]]\nname = "x"\n'
        f'type = "layers"\ncontainers = ["agentfsm"]\nlayers = [\n{body}]\n')
    return tmp_path


def test_a_module_missing_from_the_mapping_is_named_with_the_line_to_add(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    root = _tiny_repo(tmp_path, ["driver", "runner | planner", "state"], ["driver", "planner", "oddity"])
    assert relayout.unmapped(root) == [
        "fsm/oddity.py is not in scripts/relayout.py's MAPPING: add the line\n"
        '    "oddity": "<package>",\n'
        "to MAPPING with <package> one of auditing | commandline | common | llm | machine | runtime | sessions, "
        "the one whose modules share its layer in pyproject.toml's layers contract (add 'oddity' to that "
        "contract too: it names no layer for it)",
        "fsm/planner.py is not in scripts/relayout.py's MAPPING: add the line\n"
        '    "planner": "runtime",\n'
        "to MAPPING (its import-linter layer is 'runner | planner', whose modules go to runtime/)",
    ]
    # the codemod refuses to move anything while a module has no place
    assert relayout.main(["--root", str(root)]) == 2
    assert '"planner": "runtime",' in capsys.readouterr().err
    assert (root / "fsm").joinpath("driver.py").exists()  # (a spelling the codemod leaves alone: it stays flat)


def test_the_layer_packages_match_the_import_linter_layers() -> None:
    """Every package the codemod creates is a layer of its package contract, the contract's other
    layers are what stays at the top (or tools/ and hooks/), and the module-level contract names
    exactly the modules of the mapping and those that stay."""
    packages = set(MAPPING.values())
    named = [t.strip() for layer in relayout.PACKAGE_LAYERS for t in layer.split("|")]
    assert len(named) == len(set(named))
    assert packages <= set(named) and set(relayout.PACKAGE_DOCS) == packages
    others = set(named) - packages
    assert others == {"report", "temporal", "diagram", "testing", "api", "hooks", "tools"}
    assert others - {"hooks", "tools"} <= relayout.STAY
    # (once the codemod is applied, the contract names the modules inside their packages: pkg.module)
    fine = {t.strip().split(".")[-1] for layer in _fine_layers((REPO / "pyproject.toml").read_text())
            for t in layer.split("|")}
    assert fine - set(MAPPING) == others
    assert set(MAPPING) <= fine
    # no package shares a name with a module (a rewrite could not tell them apart)
    assert not packages & set(MAPPING)


# --- the rewriting rules -------------------------------------------------------------------------------


def test_persisted_names_are_never_rewritten() -> None:
    """Logger names and Temporal activity names are persisted: the same text as a module path stays."""
    persisted = relayout.persisted_names(REPO)
    assert {"agentfsm.compact", "agentfsm.executor", "agentfsm.control", "agentfsm.call_model"} <= persisted
    keep = 'log = get_logger("agentfsm.compact"); await self._activity("agentfsm.compact", x)'
    assert relayout.rewrite_text(keep, persisted) == keep
    # the module itself, named with something of it or as a module path where no name is persisted
    assert relayout.rewrite_text(":func:`agentfsm.runtime.compact.compact`", persisted) == \
        ":func:`agentfsm.runtime.compact.compact`"
    assert relayout.rewrite_text("'agentfsm.sessions.session' in sys.modules", persisted) == \
        "'agentfsm.sessions.session' in sys.modules"
    assert relayout.rewrite_text('agentfsm = "agentfsm.commandline.cli:entry"', persisted) == \
        'agentfsm = "agentfsm.commandline.cli:entry"'


def test_paths_and_dotted_names_are_rewritten_once() -> None:
    text = ("see fsm/machine/graph.py, [it](../fsm/auditing/claude_code/walker.py), fsm/auditing/claude_code_audit.py, "
            "fsm/diagram/ "
            "and agentfsm.auditing.claude_code.transcript; agentfsm/graph.py and fsm/graph are not module paths")
    once = relayout.rewrite_text(text)
    assert once == ("see fsm/machine/graph.py, [it](../fsm/auditing/claude_code/walker.py), "
                    "fsm/auditing/claude_code_audit.py, fsm/diagram/ and agentfsm.auditing.claude_code.transcript; "
                    "agentfsm/graph.py and fsm/graph are not module paths")
    assert relayout.rewrite_text(once) == once
    # code in a string (a module a test writes out) or in a document
    assert relayout.rewrite_text("import sys\nfrom agentfsm import graph, state as s\n") == \
        "import sys\nfrom agentfsm.machine import graph, state as s\n"
    for unchanged in ("from agentfsm import api", "from agentfsm import graph, driver", "from agentfsm import Limits"):
        assert relayout.rewrite_text(unchanged) == unchanged


def test_python_rewrites_imports_uses_and_strings() -> None:
    source = (
        "from agentfsm import api, graph, log as fsm_log\n"
        "import agentfsm.runtime.driver as d\n"
        "from agentfsm.auditing.claude_code.walker import walk\n"
        "x = agentfsm.machine.state.Limits()\n"
        "y = agentfsm.Limits\n"
        "LOG = get_logger('agentfsm.memory')\n")
    import libcst as cst

    out = cst.parse_module(source).visit(relayout.Rewriter(frozenset({"agentfsm.memory"}), False)).code
    assert out == (
        "from agentfsm import api\n"
        "from agentfsm.machine import graph\n"
        "from agentfsm.common import log as fsm_log\n"
        "import agentfsm.runtime.driver as d\n"
        "from agentfsm.auditing.claude_code.walker import walk\n"
        "x = agentfsm.machine.state.Limits()\n"
        "y = agentfsm.Limits\n"
        "LOG = get_logger('agentfsm.memory')\n")
    parts = ('a = REPO / "fsm" / "graph.py"; b = site / "agentfsm" / "claude_code" / "walker.py"; '
             'c = REPO / "graph.py"\n')
    assert cst.parse_module(parts).visit(relayout.Rewriter(frozenset(), False)).code == (
        'a = REPO / "fsm" / "machine" / "graph.py"; b = site / "agentfsm" / "auditing" / "claude_code" / "walker.py"; '
        'c = REPO / "graph.py"\n')
    deeper = "ROOT = Path(__file__).resolve().parents[1] / 'docs'\n"
    assert cst.parse_module(deeper).visit(relayout.Rewriter(frozenset(), True)).code == \
        "ROOT = Path(__file__).resolve().parents[2] / 'docs'\n"


def test_lines_made_too_long_are_broken_where_nothing_changes() -> None:
    long = "x" * 70
    source = (f'names = {{"{long}", "{long}"}}\n'
              f"# {long} {long}\n"
              f'call(("{long} {long}"))\n')
    out = relayout.wrap_long_lines(source)
    assert all(len(line) <= 120 for line in out.splitlines()), out
    scope: dict[str, object] = {"call": lambda v: v}
    exec(compile(out, "<wrapped>", "exec"), scope)
    assert scope["names"] == {long}
    assert out.count("#") == 2
    # a line that was already long is left alone
    assert relayout.wrap_long_lines(source, keep=frozenset(source.splitlines(keepends=True))) == source


# --- the codemod on a copy of the repository -------------------------------------------------------------


def _tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
            and ".ruff_cache" not in p.parts}


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, frozenset[str]]]:
    """``git archive HEAD`` of this repository, with the codemod applied, and installed (no
    dependencies) into a scratch directory."""
    base = tmp_path_factory.mktemp("relayout")
    tree, site = base / "repo", base / "site"
    archive = _run(["git", "archive", "--format=tar", "-o", str(base / "head.tar"), "HEAD"], REPO)
    if archive.returncode != 0:
        pytest.skip(f"not a git checkout: {archive.stderr.strip()}")
    with tarfile.open(base / "head.tar") as tar:
        tar.extractall(tree, filter="data")
    if not (tree / "scripts" / "relayout.py").exists():  # HEAD predates the script: use this checkout's
        (tree / "scripts").mkdir(exist_ok=True)
        shutil.copy(SCRIPT, tree / "scripts" / "relayout.py")
    before = relayout.persisted_names(tree)
    check = _run([sys.executable, "scripts/relayout.py", "--check"], tree)
    applied = all((tree / "fsm" / pkg).is_dir() for pkg in MAPPING.values())
    # before the codemod is applied to main, HEAD is in the flat layout; after, this checks a no-op run
    assert check.returncode == (0 if applied else 1), check.stdout
    assert applied or "is still at the top of fsm/" in check.stdout
    done = _run([sys.executable, "scripts/relayout.py"], tree)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(tree)],
                     base)
    assert installed.returncode == 0, installed.stderr
    yield tree, site, before


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the copy, the codemod and an install take minutes on a busy machine
def test_the_copy_is_in_the_new_layout_and_a_second_run_changes_nothing(
        moved: tuple[Path, Path, frozenset[str]]) -> None:
    tree, _site, before = moved
    fsm = tree / "fsm"
    for name, pkg in MAPPING.items():
        assert not (fsm / f"{name}.py").exists() and not (fsm / name).exists(), name
        assert (fsm / pkg / f"{name}.py").exists() or (fsm / pkg / name / "__init__.py").exists(), name
    for pkg in set(MAPPING.values()):
        assert (fsm / pkg / "__init__.py").read_text().startswith('"""')
    left = {p.name.removesuffix(".py") for p in fsm.iterdir() if p.name != "__pycache__"}
    assert set(MAPPING.values()) <= left <= relayout.STAY | set(MAPPING.values())
    digest = _tree_digest(tree)
    again = _run([sys.executable, "scripts/relayout.py"], tree)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _tree_digest(tree) == digest
    assert _run([sys.executable, "scripts/relayout.py", "--check"], tree).returncode == 0
    # logger and activity names did not move with the modules
    assert relayout.persisted_names(tree) == before


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the copy, the codemod and an install take minutes on a busy machine
def test_no_import_of_an_old_path_is_left(moved: tuple[Path, Path, frozenset[str]]) -> None:
    tree, _site, _before = moved
    names = "|".join(sorted(MAPPING, key=len, reverse=True))
    old = re.compile(rf"^\s*(from agentfsm\.({names})\b|import agentfsm\.({names})\b"
                     rf"|from agentfsm import [^#\n]*\b({names})\b)", re.M)
    found = [f"{p.relative_to(tree)}: {m.group(0).strip()}" for top in relayout.PY_ROOTS
             for p in (tree / top).rglob("*.py") for m in old.finditer(p.read_text())]
    assert found == []
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or "ruff"
    lint = _run([ruff, "check", "--no-cache", "."], tree)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the copy, the codemod and an install take minutes on a busy machine
def test_the_moved_package_imports_and_keeps_every_contract(moved: tuple[Path, Path, frozenset[str]]) -> None:
    tree, site, _before = moved
    env = {**os.environ, "PYTHONPATH": str(site)}
    modules = [f"agentfsm.{pkg}.{name}" for name, pkg in MAPPING.items()]
    # the old paths are built from MAPPING, not written out, so that the codemod (which rewrites every
    # module path it finds in a string) leaves this test meaning the same before and after the move
    def old(name: str) -> str:
        return ".".join(("agentfsm", name))

    def new(name: str) -> str:
        return f"agentfsm.{MAPPING[name]}.{name}"

    cc = "claude_code"
    probe = ("import importlib, warnings, agentfsm\n"
             f"assert agentfsm.__file__.startswith({str(site)!r}), agentfsm.__file__\n"
             f"for m in {modules!r}: importlib.import_module(m)\n"
             "with warnings.catch_warnings(record=True) as seen:\n"
             "    warnings.simplefilter('always')\n"
             f"    old = importlib.import_module({old('driver')!r})\n"
             f"    state = importlib.import_module({old('state')!r})\n"
             f"    walker = importlib.import_module({old(cc) + '.walker'!r})\n"
             f"new = importlib.import_module({new('driver')!r})\n"
             f"s = importlib.import_module({new('state')!r})\n"
             f"w = importlib.import_module({new(cc) + '.walker'!r})\n"
             "assert old is new and state is s and walker is w\n"
             f"assert new.__spec__.name == {new('driver')!r}\n"
             "print(sorted(str(x.message) for x in seen if x.category is DeprecationWarning))\n")
    done = _run([sys.executable, "-c", probe], tree, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(
        f"{a} moved to {b}: import it from there"
        for a, b in ((old(cc), new(cc)), (old(cc) + ".walker", new(cc) + ".walker"),
                     (old("driver"), new("driver")), (old("state"), new("state")))))
    shutil.copy(tree / "pyproject.toml", site / "pyproject.toml")
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    contracts = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert relayout.PACKAGE_CONTRACT in [c["name"] for c in contracts]
    kept = _run([lint, "pyproject.toml", "--no-cache"], site, env, timeout=300)
    assert kept.returncode == 0 and f"{len(contracts)} kept, 0 broken" in kept.stdout, kept.stdout + kept.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the copy, the codemod and an install take minutes on a busy machine
def test_a_smoke_subset_of_the_copys_tests_passes_on_the_moved_package(
        moved: tuple[Path, Path, frozenset[str]]) -> None:
    tree, site, _before = moved
    env = {**os.environ, "PYTHONPATH": str(site)}
    smoke = ["tests/test_state.py", "tests/test_counter_caps.py", "tests/test_extending.py",
             "tests/test_mutation_campaign.py", "tests/test_one_declaration.py"]
    smoke = [t for t in smoke if (tree / t).exists()]
    # an old module path used anywhere in them is an error: the rewrite must have caught it
    done = _run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-W",
                 "error:agentfsm.:DeprecationWarning", *smoke], tree, env, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
