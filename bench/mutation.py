"""Mutation score of the core, per module: do the tests catch every wrong rule?

For each module of ``bench/mutation.toml`` (the routes table, the state record, the executor, the
permission policy, the auditor), cosmic-ray makes every mutant — its own operators, narrowed to the
meaningful ones, plus the table-shaped ones of ``bench/mutation_operators.py`` — and each mutant is
tested by the few test files that cover that module (pytest ``-x``). A mutant the tests fail on is
killed; one they pass with survived. Printed, per module: mutants, killed, survivors, survivors listed
as equivalent in ``bench/mutation.toml`` (each with its reason), the score (killed / (mutants − listed
equivalents)) and the time taken.

    python bench/mutation.py                      # every module, every mutant (hours on 2 busy cores: nightly)
    python bench/mutation.py --sample 40          # a seeded sample per module (about 5 min a module)
    python bench/mutation.py graph state          # some modules
    python bench/mutation.py --jobs 2             # two mutants at a time (two scratch copies)
    python bench/mutation.py --survivors graph    # the last run's unlisted survivors, as diffs
    python bench/mutation.py --rerun-survivors    # test only the last run's survivors again
    python bench/mutation.py --report             # the last run's table, no testing
    python bench/mutation.py --since REV graph    # only mutants on lines changed since git REV (the rest pending)

Mutants are applied to scratch copies of the working tree under ``.mutation/`` (git-ignored), never to
the tree itself: tests and editing go on while a campaign runs. A copy imports ``agentfsm`` from itself
(``PYTHONPATH``), so the project's venv (``pip install -e '.[test,mutation]'``) is all it needs. The
session databases (``.mutation/<module>.sqlite``) are ordinary cosmic-ray sessions: ``cr-report`` and
``cr-html`` read them.

Why cosmic-ray, driven as a library, rather than a whole tool: its operators and sessions are kept
up, but its own runner starts the test command afresh per mutant over every configured test, and
mutmut runs from its own copy of the project, which pyproject's ``fsm/`` -> ``agentfsm`` mapping does
not fit; here a mutant costs one fork and the tests that execute its lines.

Exit status 0 when every module ran to the end and reached the threshold; 1 otherwise (a failing
baseline, the time budget spent, a score under the threshold, a stale equivalence entry).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import attrs
import parso
from cosmic_ray import plugins
from cosmic_ray.commands.init import init as cr_init
from cosmic_ray.mutating import mutate_code, use_mutation
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mutation_operators

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "bench" / "mutation.toml"
WORK = REPO / ".mutation"


# --- configuration -----------------------------------------------------------------------------


@attrs.frozen
class Equivalent:
    module: str
    operator: str
    original: str
    mutated: str
    why: str
    # for a line that occurs more than once: text of one of the two lines before it
    near: str = ""


@attrs.frozen
class Config:
    budget_minutes: float
    threshold: float
    timeout_factor: float
    min_timeout: float
    pytest_args: tuple[str, ...]
    exclude_operators: tuple[str, ...]
    skip_calls: frozenset[str]
    operators: Mapping[str, Any]
    modules: Mapping[str, Mapping[str, Any]]
    equivalents: tuple[Equivalent, ...]


def load_config(path: Path = CONFIG) -> Config:
    data = tomllib.loads(path.read_text())
    c = data["campaign"]
    return Config(c["budget_minutes"], c["threshold"], c["timeout_factor"], c["min_timeout"],
                  tuple(c["pytest_args"]), tuple(c["exclude_operators"]), frozenset(c["skip_calls"]),
                  c["operators"], data["modules"],
                  tuple(Equivalent(**e) for e in data.get("equivalent", ())))


def register_operators(config: Config) -> None:
    """Put the ``agentfsm`` operators beside cosmic-ray's core ones (its registry is a plain dict of
    providers; a provider maps operator names to classes)."""
    from agentfsm.machine import state

    enums = {alias: [m.name for m in getattr(state, enum)] for alias, enum in config.operators["enums"].items()}
    plugins.OPERATOR_PROVIDERS["agentfsm"] = mutation_operators.provider(
        enums=enums, variadic=config.operators["variadic"], ordered_rows=config.operators["ordered_rows"])
    _fix_exception_replacer()


def _fix_exception_replacer() -> None:
    """cosmic-ray's ExceptionReplacer takes each caught exception to be a bare name: for a dotted one
    (``except (a.APIConnectionError, a.APITimeoutError)``) it fails with an AttributeError that ends
    the run, and for ``except a.APIStatusError`` it renames the dot. Here each caught exception,
    bare or dotted, alone or in a tuple, is replaced whole by ``CosmicRayTestingException``."""
    from cosmic_ray.operators.exception_replacer import ExceptionReplacer
    from parso.python.tree import Name

    def name_nodes(node: Any) -> tuple[Any, ...]:
        caught = node.children[1]
        if caught.type == "atom" and caught.children[0].type == "operator" and caught.children[0].value == "(":
            inner = caught.children[1]
            return tuple(inner.children[::2]) if inner.type == "testlist_comp" else (inner,)
        return (caught,)

    def mutate(self: Any, node: Any, index: int) -> Any:
        target = name_nodes(node)[index]
        if isinstance(target, Name):
            target.value = "CosmicRayTestingException"
        else:
            replacement = Name("CosmicRayTestingException", target.start_pos, target.get_first_leaf().prefix)
            replacement.parent = target.parent
            siblings = target.parent.children
            siblings[siblings.index(target)] = replacement
        return node

    ExceptionReplacer._name_nodes = staticmethod(name_nodes)  # type: ignore[method-assign]
    ExceptionReplacer.mutate = mutate  # type: ignore[method-assign]


# --- scratch copies --------------------------------------------------------------------------------


def make_tree(dest: Path) -> Path:
    """A copy of the working tree (tracked and new files, as they are now) that imports ``agentfsm`` from
    itself: ``_import/agentfsm`` mirrors fsm/ and holds tools/ and hooks/, as an install lays them out."""
    if dest.exists():
        shutil.rmtree(dest)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    pkg = dest / "_import" / "agentfsm"
    pkg.mkdir(parents=True)
    for entry in (dest / "fsm").iterdir():
        (pkg / entry.name).symlink_to(entry)
    (pkg / "tools").symlink_to(dest / "tools")
    (pkg / "hooks").symlink_to(dest / "hooks")
    # bytecode for everything now; the mutated module's is removed before each mutant (tests run with
    # PYTHONDONTWRITEBYTECODE, so nothing stale is written back)
    # (compileall does not follow the symlinked directories: their real places are compiled instead,
    # which is where the interpreter looks for their bytecode too)
    for where in (dest / "_import", dest / "fsm", dest / "tools", dest / "hooks", dest / "tests"):
        compileall.compile_dir(str(where), quiet=2)
    return dest


def _pyc(tree: Path, module_path: str) -> list[Path]:
    rel = Path(module_path)
    pkg_dir = {"fsm": tree / "_import" / "agentfsm"}.get(rel.parts[0], tree / rel.parts[0])
    cache = pkg_dir.joinpath(*rel.parts[1:-1]) / "__pycache__"
    return list(cache.glob(f"{rel.stem}.*.pyc")) if cache.is_dir() else []


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of the tests in ``tree``: ``agentfsm`` from the copy, the mutation profile."""
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tree / "_import"), os.environ.get("PYTHONPATH")])),
            "PYTHONDONTWRITEBYTECODE": "1",
            "HYPOTHESIS_PROFILE": "mutation",
            "AGENTFSM_REFERENCE_DIR": os.environ.get("AGENTFSM_REFERENCE_DIR",
                                                     str(REPO.parent.parent / "shared" / "reference"))}


def test_files(config: Config, module: str, tree: Path) -> list[str]:
    return [t for t in config.modules[module]["tests"] if (tree / t).exists()]


def pytest_args(config: Config, module: str, tree: Path) -> list[str]:
    return [*config.pytest_args, *deselected(config, module), *test_files(config, module, tree)]


def deselected(config: Config, module: str) -> list[str]:
    """``--deselect`` for each test a module's entry lists under ``deselect`` (with why, in the file)."""
    return [arg for test in config.modules[module].get("deselect", ()) for arg in ("--deselect", test)]


class Worker:
    """The test runner of one scratch copy (``bench/mutation_worker.py``): pytest and the third-party
    dependencies are imported once, and each mutant's tests run in a forked child."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "mutation_worker.py")], cwd=tree,
                                     env=tree_env(tree), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = json.loads(self._line())
        if not ready.get("ready"):
            raise RuntimeError(f"mutation worker in {tree}: {ready}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"mutation worker in {self.tree} exited ({self.proc.wait()})")
        return line

    def run(self, args: Sequence[str], timeout: float, *, coverage_map: Path | None = None,
            include: Sequence[str] = ()) -> tuple[int | None, str]:
        """pytest ``args`` in a fresh child: (exit status, or None after ``timeout`` s; output tail).
        ``coverage_map``: also write there which test ran which line of the files ``include`` names."""
        assert self.proc.stdin is not None
        request = {"args": list(args), "timeout": timeout, "coverage": str(coverage_map) if coverage_map else None,
                   "include": list(include) or None}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self._line())
        return reply["code"], reply["output"]

    def close(self) -> None:
        self.proc.terminate()  # ends a test still running, then the worker
        self.proc.wait(timeout=30)


class TestMap:
    """Which of a module's tests execute which of its lines, measured once on the unmutated copy. A
    mutant runs only the tests that execute a line it changed — all of them when a line also runs at
    import (every test imports the module), or when no test executes it in-process (a test may run
    it in a subprocess)."""

    def __init__(self, config: Config, module: str, lines: Mapping[int, Sequence[str]] | None) -> None:
        self.files = list(config.modules[module]["tests"])
        self.lines = lines

    def tests(self, spec: MutationSpec, everything: list[str]) -> list[str] | None:
        """The tests to run for ``spec``: node ids, or ``everything`` (the module's test files); None
        when no test executes its lines in-process."""
        if self.lines is None:
            return everything
        ids: set[str] = set()
        for line in range(spec.start_pos[0], spec.end_pos[0] + 1):
            ctxs = self.lines.get(line, ())
            if "" in ctxs:
                return everything
            ids.update(ctxs)
        if not ids:
            return None
        rank = {f: i for i, f in enumerate(self.files)}
        return sorted(ids, key=lambda n: (rank.get(n.split("::")[0], len(rank)), n))


def coverage_map(worker: Worker, config: Config, module: str) -> Mapping[int, Sequence[str]] | None:
    """Measure :class:`TestMap`'s lines for ``module`` (None when coverage.py is not installed)."""
    try:
        import coverage  # noqa: F401 - only whether the worker can use it
    except ImportError:
        print(f"{module}: coverage.py is not installed: every mutant runs all of the module's tests", flush=True)
        return None
    out = WORK / f"{module}.lines.json"
    args = [a for a in pytest_args(config, module, worker.tree) if a != "-x"]
    rel = Path(config.modules[module]["path"])
    target = os.path.realpath(worker.tree / rel)
    imported = worker.tree / "_import" / "agentfsm" / (rel.relative_to("fsm") if rel.parts[0] == "fsm" else rel)
    code, output = worker.run(args, 3600, coverage_map=out, include=[target, str(imported)])
    if code != 0 or not out.exists():
        raise RuntimeError(f"{module}: measuring coverage failed\n{output}")
    lines = json.loads(out.read_text()).get(target, {})
    return {int(n): ctxs for n, ctxs in lines.items()}


def run_mutant(item: WorkItem, worker: Worker, config: Config, module: str, timeout: float,
               test_map: TestMap) -> WorkResult:
    """One mutant in the worker's copy: cosmic-ray applies it (and puts the file back), the tests that
    execute its lines run against it."""
    rel = config.modules[module]["path"]
    spec = item.mutations[0]
    selected = test_map.tests(spec, test_files(config, module, worker.tree))
    # lines no test executes in-process may still run in a subprocess a test starts: all the tests then
    args = [*config.pytest_args, *deselected(config, module),
            *(selected if selected is not None else test_files(config, module, worker.tree))]
    operator = plugins.get_operator(spec.operator_name)(**spec.operator_args)
    for pyc in _pyc(worker.tree, rel):
        pyc.unlink()
    with use_mutation(worker.tree / rel, operator, spec.occurrence) as (_original, mutated):
        if mutated is None:
            return WorkResult(worker_outcome=WorkerOutcome.NO_TEST)
        code, output = worker.run(args, timeout)
        everything = test_files(config, module, worker.tree)
        if code == 0 and selected is not None and selected != everything:
            # the map can miss a test: coverage.py on Python 3.11 records no line a coroutine runs
            # after an exception was thrown into it (a cancellation it swallowed, say), so a survivor
            # of the selected tests is tested again by all of the module's tests before it counts
            code, output = worker.run([*config.pytest_args, *deselected(config, module), *everything], timeout)
    if code is None:
        return WorkResult(worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.KILLED, output="timeout")
    outcome = TestOutcome.SURVIVED if code == 0 else TestOutcome.KILLED
    return WorkResult(worker_outcome=WorkerOutcome.NORMAL, test_outcome=outcome, output=output[-2000:])


def baseline(worker: Worker, config: Config, module: str) -> tuple[bool, float, str]:
    """The module's tests on the unmutated copy: (green, seconds, output)."""
    start = time.monotonic()
    code, output = worker.run(pytest_args(config, module, worker.tree), 1800)
    return code == 0, time.monotonic() - start, output


# --- which mutants count ---------------------------------------------------------------------------


class Skipper:
    """Why a generated mutant is not counted (None: it counts). Not counted: operators outside the
    meaningful set, mutants inside type annotations (``from __future__ import annotations`` makes them
    strings nobody evaluates), in ``__all__``/``__slots__``, inside logging calls, and lines marked
    ``# pragma: no mutate``, and the ``*``/``/`` markers of a parameter list."""

    def __init__(self, config: Config, source: str) -> None:
        self.exclude = re.compile("|".join(f"(?:{e})" for e in config.exclude_operators)) \
            if config.exclude_operators else None
        self.skip_calls = config.skip_calls
        self.module = parso.parse(source)
        self.lines = source.splitlines()

    def reason(self, spec: MutationSpec) -> str | None:
        if self.exclude is not None and self.exclude.match(spec.operator_name):
            return "operator not in the meaningful set"
        line = self.lines[spec.start_pos[0] - 1] if spec.start_pos[0] <= len(self.lines) else ""
        if re.search(r"#.*pragma:.*no mutate", line):
            return "pragma: no mutate"
        leaf = self.module.get_leaf_for_position(tuple(spec.start_pos), include_prefixes=True)
        if leaf.type == "operator" and leaf.value in ("*", "/") and leaf.parent.type == "parameters":
            return "signature marker"  # `*`/`/` in a parameter list is syntax, not arithmetic
        node = leaf
        while node is not None and node.parent is not None:
            parent = node.parent
            if _is_annotation(node, parent):
                return "type annotation"
            target = parent.children[0].get_code().strip() if parent.type == "expr_stmt" else ""
            if target.startswith("__") and target.endswith("__"):
                return target  # __all__, __slots__: names for tools and the interpreter, not behaviour
            if parent.type in ("atom_expr", "power") and node.type == "trailer" and _is_op(node.children[0], "("):
                callee = mutation_operators._callee(node)
                if callee in self.skip_calls:
                    return f"inside {callee}()"
            node = parent
        return None


def _is_op(node: Any, value: str) -> bool:
    return node.type == "operator" and node.value == value


def _is_annotation(node: Any, parent: Any) -> bool:
    if parent.type == "tfpdef" and len(parent.children) == 3 and node is parent.children[2]:
        return True
    if parent.type == "annassign" and len(parent.children) >= 2 and node is parent.children[1]:
        return True
    if parent.type == "funcdef":
        kids = parent.children
        return any(_is_op(k, "->") and i + 1 < len(kids) and kids[i + 1] is node for i, k in enumerate(kids))
    return False


# --- sessions --------------------------------------------------------------------------------------


def db_path(module: str) -> Path:
    return WORK / f"{module}.sqlite"


def set_work(path: Path) -> None:
    """Where the scratch copies and sessions go (default ``.mutation/``)."""
    global WORK
    WORK = path.resolve()


def init_session(config: Config, module: str) -> tuple[int, Counter[str]]:
    """Every mutant of ``module`` into a fresh session; the ones that do not count are marked skipped
    with the reason. Returns (mutants counted, skipped by reason)."""
    rel = config.modules[module]["path"]
    path = REPO / rel
    skipper = Skipper(config, path.read_text())
    skipped: Counter[str] = Counter()
    with use_db(str(db_path(module)), WorkDB.Mode.create) as db:
        cr_init([Path(rel)], db, {})
        for item in db.work_items:
            why = skipper.reason(item.mutations[0])
            if why is not None:
                skipped[why] += 1
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why))
        counted = db.num_work_items - sum(skipped.values())
    return counted, skipped


def _mutant_lines(original: str, spec: MutationSpec) -> tuple[str, str]:
    """The lines a mutant spans, before and after, whitespace-trimmed and joined with `` / ``."""
    operator = plugins.get_operator(spec.operator_name)(**spec.operator_args)
    mutated = mutate_code(original, operator, spec.occurrence) or original
    before, after = original.splitlines(), mutated.splitlines()
    first, last = spec.start_pos[0] - 1, spec.end_pos[0]
    grown = len(after) - len(before)  # a mutant that drops a line shortens its span
    return (" / ".join(x.strip() for x in before[first:last]),
            " / ".join(x.strip() for x in after[first:last + grown]))


@attrs.frozen
class Survivor:
    module: str
    operator: str
    line: int
    original: str
    mutated: str
    equivalent: Equivalent | None


@attrs.frozen
class Score:
    module: str
    mutants: int  # counted (meaningful) mutants
    skipped: int  # generated but not counted
    killed: int
    timeouts: int
    errors: int  # the machinery failed on the mutant (not counted as killed)
    pending: int
    survivors: tuple[Survivor, ...]
    seconds: float

    @property
    def equivalent(self) -> int:
        return sum(s.equivalent is not None for s in self.survivors)

    @property
    def score(self) -> float:
        denominator = self.mutants - self.equivalent - self.pending - self.errors
        return 100.0 * self.killed / denominator if denominator else 100.0

    @property
    def interval(self) -> tuple[float, float]:
        """Wilson's 95 % interval of the score when only a sample was tested (percent)."""
        n = self.mutants - self.equivalent - self.pending - self.errors
        if not n:
            return (0.0, 100.0)
        z, p = 1.96, self.killed / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
        return (100 * max(0.0, centre - half), 100 * min(1.0, centre + half))


def score(config: Config, module: str, seconds: float = 0.0) -> Score:
    rel = config.modules[module]["path"]
    original = (REPO / rel).read_text()
    killed = timeouts = errors = skipped = 0
    survivors: list[Survivor] = []
    with use_db(str(db_path(module)), WorkDB.Mode.open) as db:
        total = db.num_work_items
        pending = len(db.pending_work_items)
        for item, result in db.completed_work_items:
            spec = item.mutations[0]
            if result.worker_outcome in (WorkerOutcome.SKIPPED, WorkerOutcome.NO_TEST):
                skipped += 1
            elif result.worker_outcome != WorkerOutcome.NORMAL or result.test_outcome == TestOutcome.INCOMPETENT:
                errors += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                before, after = _mutant_lines(original, spec)
                lead = "\n".join(original.splitlines()[max(0, spec.start_pos[0] - 3):spec.start_pos[0] - 1])
                match = next((e for e in config.equivalents if e.module == module and e.operator == spec.operator_name
                              and e.original == before and e.mutated == after and e.near in lead), None)
                survivors.append(Survivor(module, spec.operator_name, spec.start_pos[0], before, after, match))
            else:
                killed += 1
                timeouts += result.output == "timeout"
    survivors.sort(key=lambda s: (s.line, s.operator))
    return Score(module, total - skipped, skipped, killed, timeouts, errors, pending, tuple(survivors), seconds)


# --- running ---------------------------------------------------------------------------------------


def run(config: Config, modules: Sequence[str], *, jobs: int, budget_s: float, fresh: bool,
        rerun_survivors: bool, max_mutants: int | None = None, sample: int | None = None,
        seed: int = 0, since: str | None = None) -> dict[str, float]:
    """Test every pending mutant of ``modules``; returns the seconds spent per module."""
    WORK.mkdir(exist_ok=True)
    (WORK / ".gitignore").write_text("*\n")
    workers = [Worker(make_tree(WORK / f"tree-{i}")) for i in range(jobs)]
    try:
        return _run_modules(config, modules, workers, budget_s=budget_s, fresh=fresh,
                            rerun_survivors=rerun_survivors, max_mutants=max_mutants, sample=sample, seed=seed,
                            since=since)
    finally:
        for worker in workers:
            worker.close()


def _run_modules(config: Config, modules: Sequence[str], workers: list[Worker], *, budget_s: float, fresh: bool,
                 rerun_survivors: bool, max_mutants: int | None, sample: int | None = None,
                 seed: int = 0, since: str | None = None) -> dict[str, float]:
    deadline = time.monotonic() + budget_s
    spent: dict[str, float] = {}
    for module in modules:
        start = time.monotonic()
        new = fresh or not db_path(module).exists()
        if new:
            counted, skipped = init_session(config, module)
            print(f"{module}: {counted} mutants ({sum(skipped.values())} not counted: "
                  + ", ".join(f"{n} {why}" for why, n in skipped.most_common()) + ")", flush=True)
        retest: set[str] | None = None
        if rerun_survivors and not new:
            retest = set(_reset_survivors(module))
        absent = [t for t in config.modules[module]["tests"] if not (workers[0].tree / t).exists()]
        if absent:
            print(f"{module}: warning: no such test file {', '.join(absent)}", flush=True)
        green, took, output = baseline(workers[0], config, module)
        if not green:
            print(f"{module}: the tests fail without any mutant; fix them first\n{output}", flush=True)
            spent[module] = time.monotonic() - start
            continue
        timeout = max(config.min_timeout, config.timeout_factor * took)
        test_map = TestMap(config, module, coverage_map(workers[0], config, module))
        with use_db(str(db_path(module)), WorkDB.Mode.open) as db:
            pending = list(db.pending_work_items)
            if retest is not None:  # the survivors only (a sampled run leaves the rest pending)
                pending = [i for i in pending if i.job_id in retest]
            if since is not None:  # an incremental campaign: what changed since a full run (the rest pending)
                pending = on_lines(pending, lines_changed_since(since, config.modules[module]["path"]))
                print(f"{module}: {len(pending)} mutants on lines changed since {since}", flush=True)
            pending = choose(pending, module, sample=None if retest is not None else sample, seed=seed)
            pending = pending[:max_mutants] if max_mutants is not None else pending
            print(f"{module}: baseline {took:.1f}s, timeout {timeout:.0f}s, {len(pending)} to test", flush=True)
            _test_all(db, pending, workers, config, module, timeout, deadline, test_map)
        spent[module] = time.monotonic() - start
        if time.monotonic() >= deadline:
            print(f"time budget of {budget_s / 60:.0f} min spent", flush=True)
            break
    return spent


def _order(item: WorkItem) -> tuple[Any, ...]:
    # cosmic-ray's job ids are random: order by what the mutant is, so a run is the same every time
    spec = item.mutations[0]
    return (tuple(spec.start_pos), tuple(spec.end_pos), spec.operator_name, spec.occurrence)


def changed_lines(diff: str) -> set[int]:
    """The new-side line numbers a ``git diff -U0`` touches: every added or changed line, and for a pure
    deletion the lines either side of the gap (what now runs where the removed code ran)."""
    lines: set[int] = set()
    for m in re.finditer(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", diff, re.MULTILINE):
        start, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
        lines.update(range(start, start + count) if count else (start, start + 1))
    return lines


def lines_changed_since(rev: str, path: str) -> set[int]:
    done = subprocess.run(["git", "diff", "-U0", rev, "--", path], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git diff {rev} -- {path} failed: {done.stderr.strip()}")
    return changed_lines(done.stdout)


def on_lines(pending: list[WorkItem], lines: set[int]) -> list[WorkItem]:
    """The mutants that change one of ``lines``."""
    return [i for i in pending
            if any(n in lines for n in range(i.mutations[0].start_pos[0], i.mutations[0].end_pos[0] + 1))]


def choose(pending: list[WorkItem], module: str, *, sample: int | None, seed: int) -> list[WorkItem]:
    """The mutants to test, in source order: all of them, or a sample of ``sample`` drawn with a fixed
    seed (the same mutants for the same source, seed and module every time)."""
    pending = sorted(pending, key=_order)
    if sample is not None and sample < len(pending):
        picked = random.Random(f"{seed}:{module}").sample(range(len(pending)), sample)
        pending = [pending[i] for i in sorted(picked)]
    return pending


def _test_all(db: WorkDB, pending: list[WorkItem], workers: list[Worker], config: Config, module: str,
              timeout: float, deadline: float, test_map: TestMap) -> None:
    free = list(workers)
    running: dict[Future[WorkResult], tuple[WorkItem, Worker]] = {}
    done = 0
    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        queue = list(pending)
        while queue or running:
            while queue and free and time.monotonic() < deadline:
                item, worker = queue.pop(0), free.pop()
                running[pool.submit(run_mutant, item, worker, config, module, timeout, test_map)] = (item, worker)
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                item, worker = running.pop(fut)
                free.append(worker)
                db.set_result(item.job_id, fut.result())
                done += 1
                if done % 25 == 0:
                    print(f"  {module}: {done}/{len(pending)}", flush=True)


def _reset_survivors(module: str) -> list[str]:
    """Forget the survivors' results so they are tested again (after new tests were written)."""
    import sqlalchemy

    with use_db(str(db_path(module)), WorkDB.Mode.open) as db:
        ids = [item.job_id for item, result in db.completed_work_items
               if result.worker_outcome == WorkerOutcome.NORMAL and result.test_outcome == TestOutcome.SURVIVED]
        with db._session_maker.begin() as session:  # cosmic-ray has no "forget a result" call
            for chunk in range(0, len(ids), 500):
                session.execute(sqlalchemy.text("DELETE FROM work_results WHERE job_id IN ("
                                                + ",".join(f"'{i}'" for i in ids[chunk:chunk + 500]) + ")"))
    print(f"{module}: {len(ids)} survivors to test again", flush=True)
    return ids


# --- reporting -------------------------------------------------------------------------------------


def report(scores: Iterable[Score], config: Config, since: str | None = None) -> bool:
    scores = list(scores)
    ok = True
    print(f"\n{'module':<22}{'mutants':>8}{'killed':>8}{'timeout':>8}{'survived':>9}{'equiv.':>7}"
          f"{'pending':>8}{'errors':>7}{'score':>8}{'time':>8}")
    for s in scores:
        flag = ""
        if s.pending or s.score < config.threshold:
            ok, flag = False, "  <- " + (f"under {config.threshold:g} %" if not s.pending
                                         else f"only lines changed since {since}" if since is not None
                                         else f"sample, 95 % interval {s.interval[0]:.0f}-{s.interval[1]:.0f} %")
        path = config.modules[s.module]["path"]
        print(f"{path:<22}{s.mutants:>8}{s.killed:>8}{s.timeouts:>8}{len(s.survivors):>9}{s.equivalent:>7}"
              f"{s.pending:>8}{s.errors:>7}{s.score:>7.1f}%{_minutes(s.seconds):>8}{flag}")
    total_m = sum(s.mutants - s.equivalent - s.pending - s.errors for s in scores)
    total_k = sum(s.killed for s in scores)
    if total_m:
        print(f"{'all':<22}{'':>8}{total_k:>8}{'':>8}{'':>9}{'':>7}{'':>8}{'':>7}"
              f"{100.0 * total_k / total_m:>7.1f}%{_minutes(sum(s.seconds for s in scores)):>8}")
    used = {(e.module, e.operator, e.original, e.mutated) for s in scores for v in s.survivors
            if (e := v.equivalent) is not None}
    complete = {s.module for s in scores if not s.pending}
    stale = [e for e in config.equivalents
             if e.module in complete and (e.module, e.operator, e.original, e.mutated) not in used]
    for e in stale:
        ok = False
        print(f"stale equivalence entry (matches no survivor): {e.module} {e.operator}: {e.original!r}")
    return ok


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}m" if seconds else "-"


def show_survivors(scores: Iterable[Score], *, listed: bool) -> None:
    for s in scores:
        for v in s.survivors:
            if v.equivalent is not None and not listed:
                continue
            print(f"{s.module}:{v.line} {v.operator}\n  - {v.original}\n  + {v.mutated}"
                  + (f"\n  (equivalent: {v.equivalent.why})" if v.equivalent else ""))


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", metavar="MODULE",
                   help=f"modules to mutate ({', '.join(config.modules)}; default all)")
    p.add_argument("--jobs", type=int, default=1, help="mutants tested at once (one scratch copy each)")
    p.add_argument("--budget", type=float, default=config.budget_minutes, help="minutes (default %(default)s)")
    p.add_argument("--resume", action="store_true", help="keep the last sessions; test what is pending")
    p.add_argument("--rerun-survivors", action="store_true", help="test the last run's survivors again")
    p.add_argument("--work", type=Path, default=WORK, help="scratch directory (default %(default)s)")
    p.add_argument("--max-mutants", type=int, default=None, help="test at most this many per module (a smoke run)")
    p.add_argument("--sample", type=int, default=None,
                   help="test a reproducible random sample of this many mutants per module (the score is then "
                        "an estimate, printed with its 95%% interval)")
    p.add_argument("--seed", type=int, default=0, help="the sample's seed (default %(default)s)")
    p.add_argument("--since", metavar="REV", default=None,
                   help="test only the mutants on lines changed since git REV (e.g. the commit of the last full "
                        "run); the rest stay pending, so the run does not pass as a full one")
    p.add_argument("--report", action="store_true", help="print the last run's scores; test nothing")
    p.add_argument("--survivors", action="store_true", help="print the last run's unlisted survivors")
    p.add_argument("--all-survivors", action="store_true", help="print every survivor, listed ones too")
    args = p.parse_args(argv)
    set_work(args.work)
    modules = args.modules or list(config.modules)
    unknown = [m for m in modules if m not in config.modules]
    if unknown:
        p.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(config.modules)}")
    register_operators(config)
    # a terminated campaign still closes its workers (they end their running test) and restores the file
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spent: dict[str, float] = {}
    if not (args.report or args.survivors or args.all_survivors):
        print(f"mutation campaign: {', '.join(modules)}; {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.1f}; budget {args.budget:g} min; {args.jobs} job(s)", flush=True)
        spent = run(config, modules, jobs=max(1, args.jobs), budget_s=60 * args.budget,
                    fresh=not (args.resume or args.rerun_survivors), rerun_survivors=args.rerun_survivors,
                    max_mutants=args.max_mutants, sample=args.sample, seed=args.seed, since=args.since)
    missing = [m for m in modules if not db_path(m).exists()]
    if missing:
        print(f"no session for {', '.join(missing)}: run `python bench/mutation.py {' '.join(missing)}` first")
        return 1
    scores = [score(config, m, spent.get(m, 0.0)) for m in modules]
    if args.survivors or args.all_survivors:
        show_survivors(scores, listed=args.all_survivors)
        return 0
    return 0 if report(scores, config, args.since) else 1


if __name__ == "__main__":
    sys.exit(main())
