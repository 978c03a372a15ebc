"""Hand-made mutants: do the tests notice the slips a developer makes that no mutation operator makes?

``bench/handmade/<module>.toml`` holds, per campaign module of ``bench/mutation.toml``, mutants written
by hand: each an exact-snippet replacement (``file``, ``old``, ``new``, ``slip``, ``why``) of a kind
the operators of ``bench/mutation.py`` cannot make — a wrong field, an off-by-one, a missing check, a
reversed pairing, a string-prefix test for "inside a directory", ``<`` for ``<=`` at a cap, a dropped
reset, swapped arguments. Each is applied to a scratch copy of the tree (never the working tree) and
tested with the tests ``bench/mutation.toml`` maps to its module (pytest ``-x``, the ``mutation``
hypothesis profile), in the campaign's forked worker. A mutant is *killed* when a test fails on it,
passes on the unmutated copy and fails on the mutant again when run alone; a test that fails on the
clean copy too, or only once (flaky under load), says nothing of the mutant and is deselected.

    python bench/handmade.py                       # every mutant (an hour or more on 2 busy cores)
    python bench/handmade.py session driver        # the mutants of some modules
    python bench/handmade.py --id session.turns-of-last-run
    python bench/handmade.py --jobs 2              # two mutants at a time (two scratch copies)
    python bench/handmade.py --survivors           # re-run only the last run's survivors (and untested)
    python bench/handmade.py --test-timeout 30     # seconds per test (default 60): a hanging mutant fails early
    python bench/handmade.py --report              # the last run's table, no testing
    python bench/handmade.py --check               # only check that every snippet applies (no tests)

Results are kept in ``.mutation/handmade.json`` (one entry per mutant id, with the digest of the
file it mutated), so ``--survivors`` and ``--report`` read the last run. A mutant with
``equivalent = "reason"`` is run and shown but left out of the score.

Exit status 0 when every mutant that counts was killed or the score reached ``--threshold``
(default 95); 1 otherwise, or when a snippet no longer applies.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parents[1]
SET = REPO / "bench" / "handmade"
CAMPAIGN = REPO / "bench" / "mutation.toml"
RESULTS = REPO / ".mutation" / "handmade.json"
SLIPS = frozenset({
    "off-by-one", "< vs <= at a cap", "wrong field", "wrong argument", "wrong unit", "wrong sign", "wrong end",
    "wrong neighbour", "wrong check", "wrong order", "wrong quantifier", "missing check", "missing case",
    "missing negation", "missing normalisation", "missing copy", "missing step", "reversed pairing",
    "swapped arguments", "string-prefix containment", "dropped reset", "dropped statement", "dropped term",
    "dropped element"})


@attrs.frozen
class Mutant:
    id: str
    module: str  # the campaign module ([modules.<name>] of bench/mutation.toml)
    file: str
    old: str
    new: str
    slip: str
    why: str
    equivalent: str = ""
    source: str = ""  # the bench/handmade/*.toml it is declared in


def campaign_modules(path: Path = CAMPAIGN) -> dict[str, Mapping[str, Any]]:
    return dict(tomllib.loads(path.read_text())["modules"])


def load(directory: Path = SET, modules: Mapping[str, Mapping[str, Any]] | None = None) -> list[Mapping[str, Any]]:
    """Every mutant declaration, as read (``module`` is the file's stem); :func:`problems` says what is
    wrong with them."""
    out: list[Mapping[str, Any]] = []
    for toml in sorted(directory.glob("*.toml")):
        for raw in tomllib.loads(toml.read_text()).get("mutant", []):
            out.append({**raw, "module": toml.stem, "source": toml.relative_to(REPO).as_posix()})
    return out


def problems(raw: Sequence[Mapping[str, Any]], modules: Mapping[str, Mapping[str, Any]],
             repo: Path = REPO) -> list[str]:
    """What is wrong with the declarations, one sentence each (empty: the set is well formed and every
    snippet applies)."""
    found: list[str] = []
    seen: set[str] = set()
    fields = {f.name for f in attrs.fields(Mutant)} - {"module", "source"}
    for r in raw:
        where = f"{r.get('source')}: mutant {r.get('id', '?')!r}"
        missing = sorted(k for k in ("id", "file", "old", "new", "slip", "why") if not isinstance(r.get(k), str))
        unknown = sorted(set(r) - fields - {"module", "source"})
        if missing or unknown:
            found.append(f"{where}: " + "; ".join(filter(None, [
                f"missing or not text: {', '.join(missing)}" if missing else "",
                f"unknown fields: {', '.join(unknown)}" if unknown else ""])))
            continue
        if r["id"] in seen:
            found.append(f"{where}: the id is used twice")
        seen.add(r["id"])
        if not r["id"].startswith(r["module"] + "."):
            found.append(f"{where}: the id must start with its module's name, {r['module']!r} + '.'")
        module = modules.get(r["module"])
        if module is None:
            found.append(f"{where}: {r['source']} is named after no campaign module of bench/mutation.toml")
            continue
        if r["file"] != module["path"]:
            found.append(f"{where}: file {r['file']!r} is not {r['module']}'s path {module['path']!r}")
            continue
        if r["slip"] not in SLIPS:
            found.append(f"{where}: slip {r['slip']!r} is none of {sorted(SLIPS)} (add it to SLIPS if it is new)")
        if not r["why"].strip() or r["old"] == r["new"] or not r["old"]:
            found.append(f"{where}: needs a why, and an old snippet that differs from new")
            continue
        path = repo / r["file"]
        if not path.is_file():
            found.append(f"{where}: no such file {r['file']}")
            continue
        text = path.read_text()
        count = text.count(r["old"])
        if count != 1:
            found.append(
                f"{where}: its old snippet occurs {count} times in {r['file']} (it must occur exactly once). "
                + ("The code changed: refresh the mutant — copy the current line(s) the slip belongs to into "
                   "`old` and make the same slip in `new` — or drop it if the code it mutated is gone."
                   if count == 0 else "Make `old` longer (a neighbouring line) until it is unique.")
                + f" old = {r['old']!r}")
            continue
        try:
            ast.parse(text.replace(r["old"], r["new"], 1))
        except SyntaxError as exc:
            found.append(f"{where}: the mutated {r['file']} does not parse ({exc.msg}, line {exc.lineno})")
    return found


def mutants(raw: Iterable[Mapping[str, Any]]) -> list[Mutant]:
    return [Mutant(**r) for r in raw]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


# --- running ---------------------------------------------------------------------------------------

_FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


@attrs.frozen
class Outcome:
    id: str
    status: str  # killed | survived | timeout | unconfirmed (the failing test fails on the clean tree too)
    test: str  # the test that failed (killed), or ""
    seconds: float
    digest: str  # of the mutated file's unmutated source
    tail: str = ""  # the end of pytest's output, for a survivor or an unconfirmed kill


def run_one(m: Mutant, worker: Any, tests: Sequence[str], pytest_args: Sequence[str], timeout: float,
            pyc: Any, deselect: Sequence[str] = ()) -> Outcome:
    """``m`` applied in ``worker``'s copy, its module's tests run against it, the file put back.

    A kill is confirmed: the failing test must pass on the unmutated copy and fail again, run alone, on
    the mutant. A test that fails on the clean copy too, or passes on the mutant the second time (a
    flaky test), says nothing of the mutant: it is deselected and the mutant's tests run again without
    it (up to three such tests)."""
    target = worker.tree / m.file
    original = target.read_text()
    if original.count(m.old) != 1:
        return Outcome(m.id, "stale", "", 0.0, "", f"old snippet occurs {original.count(m.old)} times")
    dig = hashlib.sha256(original.encode()).hexdigest()[:12]
    start = time.monotonic()
    unsure: list[str] = []
    skip = [a for t in deselect for a in ("--deselect", t)]

    def on_mutant(args: Sequence[str]) -> tuple[int | None, str]:
        for p in pyc(worker.tree, m.file):
            p.unlink()
        target.write_text(original.replace(m.old, m.new, 1))
        try:
            return worker.run([*pytest_args, *args], timeout)
        finally:
            target.write_text(original)
            for p in pyc(worker.tree, m.file):
                p.unlink()

    while True:
        code, output = on_mutant([*skip, *(a for t in unsure for a in ("--deselect", t)), *tests])
        took = time.monotonic() - start
        note = f"deselected (red on the clean tree, or flaky): {', '.join(unsure)}\n" if unsure else ""
        if code is None:
            return Outcome(m.id, "timeout", "", took, dig, note + output[-1500:])
        if code == 0:
            return Outcome(m.id, "survived", "", took, dig, note + output[-800:])
        hit = _FAILED.search(output)
        if hit is None:  # a collection error or a crash: say so, do not count it
            return Outcome(m.id, "unconfirmed", "", took, dig, note + output[-1500:])
        test = hit.group(1)
        clean, again = worker.run([*pytest_args, test], timeout)
        if clean == 0:
            twice, again = on_mutant([test])
            if twice not in (0, None):
                return Outcome(m.id, "killed", test, time.monotonic() - start, dig, note)
        unsure.append(test)
        if len(unsure) >= 3:
            return Outcome(m.id, "unconfirmed", test, took, dig, note + again[-1500:])


def run(chosen: Sequence[Mutant], *, jobs: int, timeout: float, work: Path,
        deselect: Sequence[str] = (), test_timeout: float = 60.0) -> list[Outcome]:
    sys.path.insert(0, str(REPO / "bench"))
    import mutation  # the campaign's scratch copies and forked worker (needs the `mutation` extra)

    config = mutation.load_config()
    mutation.set_work(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / ".gitignore").write_text("*\n")
    workers = [mutation.Worker(mutation.make_tree(work / f"handmade-{i}")) for i in range(max(1, jobs))]
    results: list[Outcome] = []
    try:
        free = list(workers)
        running: dict[Future[Outcome], Any] = {}
        queue = list(chosen)
        with ThreadPoolExecutor(max_workers=len(workers)) as pool:
            while queue or running:
                while queue and free:
                    m, w = queue.pop(0), free.pop()
                    tests = mutation.test_files(config, m.module, w.tree)
                    args = [*config.pytest_args, "--timeout", f"{test_timeout:g}"]
                    running[pool.submit(run_one, m, w, tests, args, timeout, mutation._pyc, deselect)] = w
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    free.append(running.pop(fut))
                    outcome = fut.result()
                    results.append(outcome)
                    save([outcome])
                    print(f"  {outcome.status:<11} {outcome.id}  ({outcome.seconds:.0f}s"
                          + (f", {outcome.test}" if outcome.test else "") + ")", flush=True)
    finally:
        for w in workers:
            w.close()
    return results


def previous() -> dict[str, dict[str, Any]]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def save(outcomes: Iterable[Outcome]) -> None:
    data = previous()
    for o in outcomes:
        data[o.id] = attrs.asdict(o) | {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True))


# --- reporting -------------------------------------------------------------------------------------


def report(chosen: Sequence[Mutant], threshold: float) -> bool:
    """The table of the last results of ``chosen``, per module; True when the score reaches
    ``threshold``."""
    data = previous()
    rows: dict[str, list[int]] = {}
    alive: list[tuple[Mutant, dict[str, Any]]] = []
    for m in chosen:
        r = data.get(m.id)
        row = rows.setdefault(m.module, [0, 0, 0, 0, 0])  # mutants, killed, survived, equivalent, other
        row[0] += 1
        status = r["status"] if r is not None else "untested"
        if m.equivalent:
            row[3] += 1
        elif status in ("killed", "timeout"):
            row[1] += 1
        elif status == "survived":
            row[2] += 1
            alive.append((m, r))
        else:
            row[4] += 1
    print(f"\n{'module':<24}{'mutants':>8}{'killed':>8}{'survived':>9}{'equiv.':>7}{'other':>7}{'score':>8}")
    for module, (n, k, s, e, o) in sorted(rows.items()):
        counted = n - e - o
        print(f"{module:<24}{n:>8}{k:>8}{s:>9}{e:>7}{o:>7}"
              + (f"{100.0 * k / counted:>7.1f}%" if counted else f"{'-':>8}"))
    n, k, s, e, o = (sum(col) for col in zip(*rows.values(), strict=True)) if rows else (0, 0, 0, 0, 0)
    counted = n - e - o
    score = 100.0 * k / counted if counted else 0.0
    print(f"{'all':<24}{n:>8}{k:>8}{s:>9}{e:>7}{o:>7}{score:>7.1f}%")
    if o:
        print(f"{o} not counted (untested, stale, or killed only by a test that fails on the clean tree too)")
    for m, _r in alive:
        print(f"survived: {m.id} ({m.slip}): {m.why}")
    return bool(counted) and not o and score >= threshold


def main(argv: Sequence[str] | None = None) -> int:
    modules = campaign_modules()
    raw = load()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", metavar="MODULE", help="only these modules' mutants")
    p.add_argument("--id", action="append", default=[], help="only this mutant (repeatable)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per mutant (default %(default)s)")
    p.add_argument("--test-timeout", type=float, default=60.0,
                   help="seconds per test (pytest-timeout; default %(default)s): a mutant that hangs one test "
                        "fails that test then, instead of after the suite's 120 s")
    p.add_argument("--threshold", type=float, default=95.0)
    p.add_argument("--survivors", action="store_true",
                   help="only the last run's survivors and untested ones (not the argued equivalents)")
    p.add_argument("--report", action="store_true", help="the last results; test nothing")
    p.add_argument("--check", action="store_true", help="only check the declarations and snippets")
    p.add_argument("--work", type=Path, default=REPO / ".mutation")
    p.add_argument("--deselect", action="append", default=[], metavar="NODEID",
                   help="leave this test out of every mutant's run (a test known to be flaky under load)")
    args = p.parse_args(argv)
    bad = problems(raw, modules)
    if bad:
        print("\n".join(bad))
        return 1
    chosen = mutants(raw)
    unknown = sorted(set(args.modules) - {m.module for m in chosen})
    if unknown:
        p.error(f"no hand-made mutants for {', '.join(unknown)}")
    if args.modules:
        chosen = [m for m in chosen if m.module in args.modules]
    if args.id:
        chosen = [m for m in chosen if m.id in args.id]
    if args.check:
        print(f"{len(chosen)} hand-made mutants over {len({m.module for m in chosen})} modules; every snippet applies")
        return 0
    if not args.report:
        if args.survivors:
            last = previous()
            # an argued equivalent is run by a full run only: re-running it cannot change the score
            chosen_run = [m for m in chosen if last.get(m.id, {}).get("status") not in ("killed", "timeout")
                          and not m.equivalent]
        else:
            chosen_run = list(chosen)
        print(f"hand-made mutants: {len(chosen_run)} to test, {args.jobs} job(s)", flush=True)
        run(chosen_run, jobs=args.jobs, timeout=args.timeout, work=args.work, deselect=args.deselect,
            test_timeout=args.test_timeout)
    return 0 if report(chosen, args.threshold) else 1


if __name__ == "__main__":
    sys.exit(main())
