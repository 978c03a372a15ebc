"""``agentfsm conform --claude PATH``: Claude Code as the oracle, differential property testing (issue 27).

Hypothesis draws *cases*: the run's set-up (permission mode, allow/deny rules, hooks with generated
answers, ``--max-turns``, ``--max-budget-usd``, structured output) and the model's behaviour (the testing
kit's strategies — text, tool calls with realistic inputs on the case's workspace, invalid and cut-off tool
JSON, ``max_tokens`` cuts, thinking-only and empty responses, HTTP and mid-stream errors, prompt too long,
refusals, background work: Bash in the background or past its timeout, TaskStop). Each case is served
by the scripted server to both clients, each in a fresh workspace and HOME
(:func:`agentfsm.testing.oracle.run_client`), and compared by
:func:`agentfsm.testing.oracle.conform_differences`: tool results, the history and every request's shape,
the result line, the exit status, the files left, and the path and counters the auditor rebuilds from each
client's own record.

A difference is accepted only where ``tests/fidelity/accepted.json`` (or ``--accepted FILE``) says why: its
``*`` entries always, a scenario's entries when the case has that scenario's feature (the case's
``accepts`` list: a Stop hook that blocks brings ``hook_stop_block``'s, and so on).

The search runs in two phases. First the ``--examples`` cases are drawn (seeded by ``--seed``) and run,
``--jobs`` at a time. Then, for each distinct divergence (the set of differing fields, indices left out),
hypothesis searches again with the same seed — the runs already made are cached — and shrinks the first
case that shows it to the smallest one that still shows exactly it, within ``--shrink-seconds`` of new
runs. The shrunk case is written to ``--fixtures DIR`` as ``<id>.json`` (the case and both clients' runs
reduced to what is compared), which replays without Claude Code.

Last line: ``conform: N examples, D divergences, A accepted`` (D distinct divergences, A examples whose
only differences are accepted ones); the exit status is 0 only when D is 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from agentfsm.testing import strategies as kit
from agentfsm.testing.oracle import (
    AGENTFSM,
    CLAUDE_CODE,
    DEFAULT_TOOLS,
    conform_differences,
    is_preamble,
    run_client,
)
from agentfsm.testing.scenario import (
    RawToolJsonBlock,
    Response,
    StreamedResponse,
    TextBlock,
    ToolUseBlock,
)

REPO_ACCEPTED = Path(__file__).resolve().parents[2] / "tests" / "fidelity" / "accepted.json"

# --- the cases -----------------------------------------------------------------------------------

FILES: Mapping[str, str] = {"a.txt": "ALPHA\nbeta\n", "b.txt": "BETA\n", "sub/c.py": "print('c')\n",
                            "$OUT/o.txt": "O\n"}

RESPONSE_FAMILIES = ("text", "tools", "parallel", "invalid", "max_tokens", "thinking", "malformed", "errors",
                     "ptl", "stream", "refusal", "background")
SETUP_FAMILIES = ("permissions", "hooks", "limits", "schema")
FAMILIES = RESPONSE_FAMILIES + SETUP_FAMILIES

_WORD = st.sampled_from(["done", "ok", "Hello", "the answer is 4", "checking", "x"])


def _call(name: str, payload: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    return (name, payload)


# realistic inputs on the case's workspace (FILES): what a model asks of each tool
_TOOL_CALLS: st.SearchStrategy[tuple[str, Mapping[str, Any]]] = st.one_of(
    st.sampled_from(["a.txt", "b.txt", "sub/c.py", "missing.txt", "sub", "$OUT/o.txt"]).map(
        lambda f: _call("Read", {"file_path": f"$WS/{f}" if not f.startswith("$") else f})),
    st.builds(lambda f, c: _call("Write", {"file_path": f, "content": c}),
              st.sampled_from(["$WS/new.txt", "$WS/a.txt", "$WS/sub/new.py", "$OUT/w.txt"]),
              st.sampled_from(["W\n", "line one\nline two\n"])),
    st.builds(lambda f, o, n, r: _call("Edit", {"file_path": f, "old_string": o, "new_string": n,
                                                **({"replace_all": True} if r else {})}),
              st.sampled_from(["$WS/a.txt", "$WS/b.txt", "$WS/missing.txt"]),
              st.sampled_from(["ALPHA", "beta", "NOPE", ""]), st.sampled_from(["GAMMA", "ALPHA"]), st.booleans()),
    st.sampled_from(["echo hi", "ls", "cat a.txt", "false", "echo err >&2; exit 3", "touch t.txt",
                     "rm -f b.txt", "pwd", "rm -rf sub"]).map(lambda c: _call("Bash", {"command": c})),
    st.builds(lambda p, d: _call("Glob", {"pattern": p, **({"path": "$WS/sub"} if d else {})}),
              st.sampled_from(["*.txt", "**/*.py", "*.py", "sub/*", "nothing*"]), st.booleans()),
    st.builds(lambda p, m: _call("Grep", {"pattern": p, **({"output_mode": m} if m else {})}),
              st.sampled_from(["BETA", "print", "zzz", "a.*"]),
              st.sampled_from([None, "content", "count", "files_with_matches"])),
)

# calls a model gets wrong: unknown tool, input failing the schema, JSON cut off at content_block_stop
_INVALID_CALLS: st.SearchStrategy[tuple[str, Any]] = st.one_of(
    st.sampled_from(["Raed", "Shell", "read"]).map(lambda n: (n, {"file_path": "$WS/a.txt"})),
    st.sampled_from([("Read", {"file_path": 12}), ("Read", {}), ("Write", {"file_path": "$WS/n.txt"}),
                     ("Bash", {"command": ["ls"]}), ("Edit", {"file_path": "$WS/a.txt", "old_string": "ALPHA"}),
                     ("Glob", {}), ("Read", {"file_path": "$WS/a.txt", "offset": "x"})]),
    st.sampled_from(['{"file_path": 12', '{"file_path": "$WS/a.txt"', "[1, 2]", "not json"]).map(
        lambda raw: ("Read", raw)),
)


def _blocks_of(calls: Sequence[tuple[str, Any]]) -> tuple[Any, ...]:
    return tuple(RawToolJsonBlock("toolu_00", n, p) if isinstance(p, str) else ToolUseBlock("toolu_00", n, p)
                 for n, p in calls)


def _tool_turn(calls: st.SearchStrategy[list[tuple[str, Any]]]) -> st.SearchStrategy[Response]:
    return st.tuples(st.one_of(st.none(), _WORD), calls).map(
        lambda t: StreamedResponse(blocks=((TextBlock(t[0]),) if t[0] else ()) + _blocks_of(t[1]),
                                   stop_reason="tool_use"))


def _responses(family: str) -> st.SearchStrategy[Response]:
    if family == "text":
        return st.builds(lambda w: StreamedResponse(blocks=(TextBlock(w),), stop_reason="end_turn"), _WORD)
    if family == "tools":
        return _tool_turn(st.lists(_TOOL_CALLS, min_size=1, max_size=1))
    if family == "parallel":
        return _tool_turn(st.lists(_TOOL_CALLS, min_size=2, max_size=3))
    if family == "invalid":
        return _tool_turn(st.tuples(_INVALID_CALLS, st.lists(_TOOL_CALLS, max_size=1)).map(lambda t: [t[0], *t[1]]))
    if family == "max_tokens":
        return kit.max_tokens_responses()
    if family == "thinking":
        return kit.thinking_only_responses()
    if family == "malformed":
        return kit.malformed_responses()
    if family == "errors":
        return kit.api_errors((429, 500, 529))
    if family == "ptl":
        return kit.prompt_too_long_errors()
    if family == "stream":
        return kit.stream_breaks()
    if family == "background":
        return kit.background_work_responses()
    if family == "refusal":
        return st.builds(lambda w: StreamedResponse(blocks=(TextBlock(w),) if w else (), stop_reason="refusal"),
                         st.one_of(st.none(), _WORD))
    raise ValueError(f"unknown family {family!r}")


def _hook(event: str, answer: str, matcher: str | None) -> tuple[dict[str, Any], str | None]:
    """A hook entry of ``--settings`` answering ``answer``, and the scenario whose accepted differences
    come with it."""
    out = {"hookEventName": event}
    accepts = None
    if answer == "deny":
        cmd = "echo '" + json.dumps({"hookSpecificOutput": {**out, "permissionDecision": "deny",
                                                             "permissionDecisionReason": "DENY_MARK"}}) + "'"
    elif answer == "allow":
        cmd = "echo '" + json.dumps({"hookSpecificOutput": {**out, "permissionDecision": "allow",
                                                             "permissionDecisionReason": "ALLOW_MARK"}}) + "'"
    elif answer == "context":
        cmd = "echo '" + json.dumps({"hookSpecificOutput": {**out, "additionalContext": f"{event}_CTX"}}) + "'"
    elif answer == "exit2":
        cmd = "echo HOOK_STDERR >&2; exit 2"
        accepts = {"PreToolUse": "hook_pre_exit2", "PostToolUse": "hook_post_exit2"}.get(event)
    elif answer == "block":
        if event == "Stop":
            cmd = ('if [ -f "$HOME/stop_once" ]; then echo \'{}\'; else touch "$HOME/stop_once"; '
                   'echo \'{"decision": "block", "reason": "STOP_MARK"}\'; fi')
            accepts = "hook_stop_block"
        else:
            cmd = "echo '" + json.dumps({"decision": "block", "reason": "BLOCK_MARK"}) + "'"
            accepts = "hook_post_decision_block" if event == "PostToolUse" else None
    else:  # "ok": a hook that answers nothing
        cmd = "true"
    entry: dict[str, Any] = {"hooks": [{"type": "command", "command": cmd}]}
    if matcher is not None:
        entry["matcher"] = matcher
    return {event: [entry]}, accepts


_HOOKS = st.one_of(
    st.tuples(st.just("PreToolUse"), st.sampled_from(["deny", "allow", "context", "exit2", "ok"]),
              st.sampled_from(["Read", "Bash", "Write|Edit", None])),
    st.tuples(st.just("PostToolUse"), st.sampled_from(["context", "block", "exit2", "ok"]),
              st.sampled_from(["Read", "Bash", None])),
    st.tuples(st.just("Stop"), st.sampled_from(["block", "ok"]), st.none()),
    st.tuples(st.just("UserPromptSubmit"), st.sampled_from(["context", "ok"]), st.none()),
)


@attrs.frozen
class Setup:
    """The run's set-up, as command-line arguments, and the scenarios whose accepted differences apply.
    ``budget``: the case has ``--max-budget-usd``, and its responses then carry :data:`BUDGET_USAGE`."""

    args: tuple[str, ...]
    accepts: tuple[str, ...] = ()
    budget: bool = False


# With --max-budget-usd every scripted response says what it used, so both clients spend the same per
# response ($0.003 in, $0.003 out at claude-sonnet-4-5's prices: $0.006), and a budget of (k - 1/2)
# responses is reached by the k-th one, whatever each client's requests weigh (the scripted server counts
# a response's input from the request's size otherwise, and Claude Code's requests are larger)
BUDGET_USAGE: Mapping[str, int] = {"input_tokens": 1000, "output_tokens": 200}
BUDGETS = ("0.003", "0.009", "0.015")  # reached by the first, second, third response
_FINAL_ANSWER: Mapping[str, Any] = {"blocks": [{"type": "text", "text": "done"}], "stop_reason": "end_turn",
                                    "usage": dict(BUDGET_USAGE)}


def _setup(families: frozenset[str]) -> st.SearchStrategy[Setup]:
    def build(mode: str, rules: tuple[str, str] | None, hooks: list[Any], turns: int | None, budget: str | None,
              schema: bool) -> Setup:
        args = ["--permission-mode", mode]
        accepts: list[str] = []
        if rules is not None:
            args += [rules[0], rules[1]]
        if hooks:
            merged: dict[str, Any] = {}
            for event, answer, matcher in hooks:
                entry, accept = _hook(event, answer, matcher)
                for k, v in entry.items():
                    merged.setdefault(k, []).extend(v)
                if accept:
                    accepts.append(accept)
            args += ["--settings", json.dumps({"hooks": merged})]
        if turns is not None:
            args += ["--max-turns", str(turns)]
        if budget is not None:
            args += ["--max-budget-usd", budget]
        if schema:
            args += ["--json-schema", json.dumps({"type": "object", "properties": {"answer": {"type": "string"}},
                                                  "required": ["answer"], "additionalProperties": False})]
            accepts.append("schema_text_only")
        return Setup(tuple(args), tuple(sorted(set(accepts))), budget is not None)

    perms = "permissions" in families
    return st.builds(
        build,
        st.sampled_from(["bypassPermissions", "default", "acceptEdits", "dontAsk"]) if perms
        else st.just("bypassPermissions"),
        st.one_of(st.none(), st.tuples(st.sampled_from(["--allowedTools", "--disallowedTools"]),
                                       st.sampled_from(["Bash(echo:*)", "Read", "Bash", "Edit", "Glob",
                                                        "Bash(rm:*)"]))) if perms else st.none(),
        st.lists(_HOOKS, max_size=2) if "hooks" in families else st.just([]),
        st.one_of(st.none(), st.integers(1, 3)) if "limits" in families else st.none(),
        st.one_of(st.none(), st.sampled_from(BUDGETS)) if "limits" in families else st.none(),
        st.booleans() if "schema" in families else st.just(False),
    )


def _renumbered(responses: Sequence[Response]) -> list[Response]:
    return kit.unique_tool_ids(responses)


def cases(families: Sequence[str] = FAMILIES, *, max_responses: int = 5) -> st.SearchStrategy[dict[str, Any]]:
    """Cases (the differential test's scenario format) mixing the given families of model behaviour and
    set-up. Without any response family, responses are text and tool turns."""
    fams = frozenset(families)
    unknown = fams - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    kinds = [f for f in RESPONSE_FAMILIES if f in fams] or ["text", "tools"]
    # text and tool turns always take part: the other kinds are what happens around them
    base = [_responses("text"), _responses("tools")]
    step = st.one_of(*base, *[_responses(k) for k in kinds if k not in ("text", "tools")]).map(lambda r: [r])
    recoveries = [k for k in kinds if k in _RECOVERIES]
    if recoveries:
        # a recovery, then a tool turn, as one step (the kit's model_behaviours does the same): the edge
        # that raised a per-turn counter followed by the next_turn that must reset it; drawn
        # independently, the two rarely meet in a short script
        pair = st.tuples(st.one_of(*[_responses(k) for k in recoveries]), _responses("tools")).map(list)
        step = st.one_of(step, pair)
    def case(setup: Setup, steps: list[list[Response]]) -> dict[str, Any]:
        responses = [_priced(r.to_dict(), setup.budget)
                     for r in _renumbered([r for s in steps for r in s][:max_responses])]
        if setup.budget:
            # answers enough to reach the budget before the script runs out: the server's own answer then
            # would count its input from the request's size, each client's own
            responses += [dict(_FINAL_ANSWER)] * max(0, len(BUDGETS) - sum("blocks" in r for r in responses))
        accepts = sorted({*setup.accepts, *_response_accepts(responses)})
        return {"prompt": "go", "files": dict(FILES), "args": list(setup.args), "responses": responses,
                # background work is stopped with TaskStop, which the default tool list leaves out
                **({"tools": f"{DEFAULT_TOOLS},TaskStop"} if "background" in kinds else {}),
                **({"accepts": accepts} if accepts else {})}

    return st.builds(case, _setup(fams), st.lists(step, min_size=1, max_size=max_responses))


def _response_accepts(responses: Sequence[Mapping[str, Any]]) -> set[str]:
    """The scenarios whose accepted differences the responses bring: a Read of a directory brings
    ``read_directory``'s (Claude Code leaks Node's EISDIR)."""
    dirs = {f"$WS/{rel.rsplit('/', 1)[0]}" for rel in FILES if "/" in rel and not rel.startswith("$")}
    reads = [b.get("input") for r in responses for b in r.get("blocks", ())
             if b.get("type") == "tool_use" and b.get("name") == "Read"]
    return {"read_directory"} if any(isinstance(i, Mapping) and i.get("file_path") in dirs for i in reads) else set()


_RECOVERIES = ("max_tokens", "thinking", "malformed", "ptl", "stream", "errors")


def _priced(response: dict[str, Any], budget: bool) -> dict[str, Any]:
    """A streamed response of a case with a budget says what it used (:data:`BUDGET_USAGE`)."""
    return {**response, "usage": dict(BUDGET_USAGE)} if budget and "blocks" in response else response


def case_id(case: Mapping[str, Any]) -> str:
    return "conform-" + hashlib.sha256(json.dumps(case, sort_keys=True).encode()).hexdigest()[:10]


# --- accepted differences ------------------------------------------------------------------------


def load_accepted(path: Path | None) -> dict[str, dict[str, str]]:
    if path is None or not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_") and isinstance(v, dict)}


def allowed_for(case: Mapping[str, Any], accepted: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    out = dict(accepted.get("*", {}))
    for name in case.get("accepts", ()):
        out.update(accepted.get(name, {}))
    return out


def accepted_key(key: str, allowed: Mapping[str, str]) -> bool:
    """Whether the difference ``key`` is accepted: listed as is, or without its index (``request[]``
    accepts every ``request[i]``)."""
    return key in allowed or _INDEX.sub("[]", key) in allowed


_INDEX = re.compile(r"\[\d+\]")
# what follows from another difference (a different history is a different next request, a different
# number of requests...): left out of a divergence's signature when a more telling key is there
_CONSEQUENCES = ("history", "n_requests", "request[]", "path", "counters", "result.num_turns")


def signature(keys: Sequence[str]) -> tuple[str, ...]:
    """A divergence's kind: its differing fields without indices; the fields that follow from others are
    kept only when nothing else differs."""
    general = sorted({_INDEX.sub("[]", k) for k in keys})
    telling = [k for k in general if k not in _CONSEQUENCES]
    return tuple(telling or general)


# --- running ------------------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    case: Mapping[str, Any]
    cc: Mapping[str, Any]
    af: Mapping[str, Any]
    differences: Mapping[str, Any]
    unaccepted: tuple[str, ...]

    @property
    def signature(self) -> tuple[str, ...]:
        return signature(self.unaccepted) if self.unaccepted else ()


class Runner:
    """Runs cases with both clients (cached by the case), counting runs."""

    def __init__(self, claude: str, *, accepted: Mapping[str, Mapping[str, str]], root: Path,
                 agentfsm: Sequence[str] | None = None) -> None:
        self.claude = claude
        self.accepted = accepted
        self.root = root
        self.agentfsm = list(agentfsm) if agentfsm else None
        self.cache: dict[str, Outcome] = {}
        self.runs = 0
        self._lock = threading.Lock()

    def key(self, case: Mapping[str, Any]) -> str:
        return json.dumps(case, sort_keys=True)

    def run(self, case: Mapping[str, Any]) -> Outcome:
        key = self.key(case)
        with self._lock:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
            self.runs += 1
            rd = self.root / f"{self.runs:05d}"
        with cf.ThreadPoolExecutor(2) as pool:
            cc_f = pool.submit(run_client, case, CLAUDE_CODE, rd / "cc", claude=self.claude)
            af_f = pool.submit(run_client, case, AGENTFSM, rd / "af", agentfsm=self.agentfsm)
            cc, af = cc_f.result(), af_f.result()
        shutil.rmtree(rd, ignore_errors=True)
        diffs = conform_differences(cc, af)
        allowed = allowed_for(case, self.accepted)
        outcome = Outcome(case, cc, af, diffs, tuple(sorted(k for k in diffs if not accepted_key(k, allowed))))
        with self._lock:
            self.cache[key] = outcome
        return outcome


class _Diverged(Exception):
    pass


def _search(strategy: st.SearchStrategy[dict[str, Any]], examples: int, seed_value: int,
            body: Callable[[dict[str, Any]], None], *, shrink: bool) -> None:
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @seed(seed_value)
    @settings(max_examples=examples, database=None, deadline=None, phases=phases, derandomize=False,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, report_multiple_bugs=False,
              print_blob=False)
    @given(strategy)
    def search(case: dict[str, Any]) -> None:
        body(case)

    search()


def draw_cases(strategy: st.SearchStrategy[dict[str, Any]], examples: int, seed_value: int) -> list[dict[str, Any]]:
    """The first ``examples`` distinct cases hypothesis draws with ``seed_value``."""
    drawn: list[dict[str, Any]] = []
    seen: set[str] = set()

    def collect(case: dict[str, Any]) -> None:
        key = json.dumps(case, sort_keys=True)
        if key not in seen:
            seen.add(key)
            drawn.append(case)

    _search(strategy, examples, seed_value, collect, shrink=False)
    return drawn


def shrink(runner: Runner, strategy: st.SearchStrategy[dict[str, Any]], examples: int, seed_value: int,
           sig: tuple[str, ...], budget: int) -> tuple[Outcome | None, int]:
    """The smallest case hypothesis finds showing divergence ``sig`` with at most ``budget`` new runs
    (cases not run then count as not showing it: a count, not a time, so a search is repeatable under
    any load). Returns the outcome and the number of new runs."""
    runs0 = runner.runs
    smallest: list[Outcome] = []

    def check(case: dict[str, Any]) -> None:
        key = runner.key(case)
        if key not in runner.cache and runner.runs - runs0 >= budget:
            return
        outcome = runner.run(case)
        if outcome.signature == sig:
            smallest.append(outcome)
            raise _Diverged(sig)

    try:
        _search(strategy, examples, seed_value, check, shrink=True)
    except _Diverged:
        pass
    return (smallest[-1] if smallest else None), runner.runs - runs0


def _strip_preamble(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        out.append({"role": m["role"], "content": [b for b in content if not (i == 0 and is_preamble(b))
                                                   and b.get("type") not in ("thinking", "redacted_thinking")]})
    return out


def reduced(run: Mapping[str, Any], client: str) -> dict[str, Any]:
    """A run as a fixture keeps it: what :func:`conform_differences` compares."""
    return {"client": client, "history": _strip_preamble(run["history"]),
            "bodies": [_strip_preamble(b) for b in run["bodies"]],
            **{k: run.get(k) for k in ("tools", "result", "n_requests", "exit", "ws", "out", "path", "counters",
                                       "terminal_reason", "findings")}}


def write_fixture(directory: Path, outcome: Outcome, claude_version: str) -> Path:
    fid = case_id(outcome.case)
    data = {"_about": "A divergence from Claude Code found and shrunk by `agentfsm conform`; replayed without "
                      "Claude Code by tests/test_conform.py.",
            "id": fid, "diverged_on": list(outcome.unaccepted), "fixed": None, "case": dict(outcome.case),
            "claude_code": reduced(outcome.cc, f"Claude Code {claude_version}"),
            "agentfsm_before": reduced(outcome.af, "agentfsm")}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{fid}.json"
    path.write_text(json.dumps(json.loads(json.dumps(data, default=list)), indent=1, ensure_ascii=False) + "\n")
    return path


def _brief(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def claude_version(claude: str) -> str:
    import subprocess

    try:
        done = subprocess.run([claude, "--version"], capture_output=True, text=True, timeout=60,
                              env={"HOME": tempfile.mkdtemp(prefix="conform-v-"), "PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.split()[0] if done.stdout.split() else "unknown"


# --- the command --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agentfsm conform", description=__doc__.split("\n\n")[0])
    p.add_argument("--claude", required=True, help="the Claude Code binary (the oracle)")
    p.add_argument("--examples", type=int, default=40, help="cases drawn and run (default 40)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--only", action="append", default=None, metavar="FAMILY",
                   help=f"families of behaviour and set-up to draw (repeatable or comma-separated): "
                        f"{', '.join(FAMILIES)}")
    p.add_argument("--max-responses", type=int, default=5, help="scripted responses per case (default 5)")
    p.add_argument("--shrink-runs", type=int, default=30,
                   help="new runs allowed while shrinking each divergence (default 30)")
    p.add_argument("--fixtures", type=Path, default=None, help="write each shrunk divergence here as <id>.json")
    p.add_argument("--accepted", type=Path, default=REPO_ACCEPTED,
                   help="accepted differences (default: tests/fidelity/accepted.json)")
    p.add_argument("--agentfsm", default=None,
                   help="command running agentfsm (default: this interpreter's -m agentfsm)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object before the last line")
    return p


def main(argv: Sequence[str] | None = None, *, out: Any = None) -> int:
    args = parser().parse_args(argv)
    out = out or sys.stdout
    claude = shutil.which(args.claude) or args.claude
    if not Path(claude).is_file():
        sys.stderr.write(f"agentfsm conform: no Claude Code binary at {args.claude}\n")
        return 2
    families = [f.strip() for v in (args.only or [",".join(FAMILIES)]) for f in v.split(",") if f.strip()]
    try:
        strategy = cases(families, max_responses=args.max_responses)
    except ValueError as exc:
        sys.stderr.write(f"agentfsm conform: {exc}\n")
        return 2
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="agentfsm-conform-"))
    agentfsm = args.agentfsm.split() if args.agentfsm else None
    runner = Runner(claude, accepted=load_accepted(args.accepted), root=root, agentfsm=agentfsm)
    drawn = draw_cases(strategy, args.examples, args.seed)
    with cf.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        outcomes = list(pool.map(runner.run, drawn))
    explored = time.monotonic() - started
    first: dict[tuple[str, ...], Outcome] = {}
    accepted_only = 0
    for o in outcomes:
        if o.unaccepted:
            first.setdefault(o.signature, o)
        elif o.differences:
            accepted_only += 1
    version = claude_version(claude)
    found: list[dict[str, Any]] = []
    for sig, o in first.items():
        count = sum(1 for x in outcomes if x.signature == sig)
        small, new_runs = shrink(runner, strategy, args.examples, args.seed, sig, args.shrink_runs)
        small = small or o
        fid = case_id(small.case)
        where = write_fixture(args.fixtures, small, version) if args.fixtures else None
        found.append({"id": fid, "signature": list(sig), "examples": count, "shrink_runs": new_runs,
                      "first_size": len(json.dumps(o.case)), "size": len(json.dumps(small.case)),
                      "first_responses": len(o.case["responses"]), "responses": len(small.case["responses"]),
                      "fixture": str(where) if where else None})
        out.write(f"divergence {fid}: {', '.join(sig)} ({count} of {len(outcomes)} examples; shrunk from "
                  f"{len(o.case['responses'])} to {len(small.case['responses'])} responses in {new_runs} new runs)\n")
        out.write(f"  case: {_brief({k: small.case[k] for k in ('args', 'responses')}, 900)}\n")
        for k in small.unaccepted[:6]:
            cc, af = small.differences[k]
            out.write(f"  {k}:\n    Claude Code: {_brief(cc)}\n    agentfsm:    {_brief(af)}\n")
        if where:
            out.write(f"  fixture: {where}\n")
    shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started
    if args.json:
        out.write(json.dumps({"examples": len(outcomes), "divergences": found, "accepted": accepted_only,
                              "runs": runner.runs, "seconds": round(elapsed, 1),
                              "explore_seconds": round(explored, 1), "claude_code": version}) + "\n")
    out.write(f"conform: {len(outcomes)} examples, {len(found)} divergences, {accepted_only} accepted\n")
    return 0 if not found else 1
