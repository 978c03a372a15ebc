"""Opt-in differential test: Claude Code 2.1.332 and agentfsm run the same scripted scenarios, and what
the model is shown and what the run decides must be the same, down to the text (issue 14).

Each scenario (``tests/fidelity/scenarios/NAME.json``) gives the workspace's files, the command line
and the scripted model responses. Both clients run it in a fresh workspace (``ws/``), beside a
directory outside it (``out/``), with a scratch HOME, against their own scripted server. Compared,
with the run's paths written ``$WS``, ``$OUT``, ``$HOME``: every tool_result (text and error flag), the
shape of the history sent back (the blocks other than tool_results), the tools offered, the result's
fields, the files left in ``ws/`` and ``out/``, and the number of model requests.

A difference fails the test unless ``tests/fidelity/accepted.json`` lists it, with why (the same
reasons are in docs/compatibility.md). Normalised before comparing, because they are not
about tools: Claude Code's ``<total_tokens>`` budget reminder (and the right-trim it does before
adding it), the preamble reminders of the first message, the saved path of a persisted output
(random in Claude Code), and the echo of a tool_use's input (Claude Code echoes it parsed, with
defaults filled in).

Claude Code is located with ``$AGENTFSM_CLAUDE``, else ``claude`` on PATH; without it the test skips.
``AGENTFSM_FIDELITY_JOBS`` sets how many runs go at once (default 4).
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from agentfsm.testing.server import ScriptedServer

# the first test waits for every run (about 4 minutes on 2 cores), so the timeout is the whole batch's
pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(1800)]

HERE = Path(__file__).parent / "fidelity"
SCENARIOS = sorted(p.stem for p in (HERE / "scenarios").glob("*.json"))
CLAUDE = os.environ.get("AGENTFSM_CLAUDE") or shutil.which("claude")
MODEL = "claude-sonnet-4-5"
DEFAULT_TOOLS = "Read,Write,Edit,Bash,Glob,Grep"
RESULT_FIELDS = ("subtype", "is_error", "terminal_reason", "result", "permission_denials", "structured_output",
                 "num_turns", "errors")

TOKENS_REMINDER = re.compile(
    r"\n*<system-reminder>\n<total_tokens>\d+ tokens left</total_tokens>\n</system-reminder>\n?")
SAVED_PATH = re.compile(r"Full output saved to: \S+")
PREAMBLE_MARKERS = ("# Environment\n", "You are powered by the model", "<total_tokens>", "Today's date is",
                    "Attribution for git commits", "As you answer the user's questions", "# claudeMd")


def accepted() -> dict[str, dict[str, str]]:
    """``{scenario or "*": {difference key: why}}``."""
    data = json.loads((HERE / "accepted.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


# --- running -----------------------------------------------------------------------------------


def _file_bytes(spec: Any) -> bytes | None:
    if isinstance(spec, str):
        return spec.encode()
    if spec.get("dir"):
        return None
    if "lines" in spec:
        body = "\n".join(spec.get("pattern", "line {n}").format(n=i) for i in range(1, spec["lines"] + 1))
        return (body + ("\n" if spec.get("trailing_newline", True) else "")).encode()
    if "size" in spec:
        line = spec.get("line", "0123456789abcdef" * 4 + "\n")
        return (line * (spec["size"] // len(line) + 1))[: spec["size"]].encode()
    if "hex" in spec:
        return bytes.fromhex(spec["hex"])
    if "base64" in spec:
        return base64.b64decode(spec["base64"])
    if "png" in spec:  # a w×h red PNG
        w, h = spec["png"]
        raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    raise ValueError(f"bad file spec {spec!r}")


def _subst(value: Any, paths: dict[str, str]) -> Any:
    if isinstance(value, str):
        for k, v in paths.items():
            value = value.replace(k, v)
        return value
    if isinstance(value, list):
        return [_subst(v, paths) for v in value]
    if isinstance(value, dict):
        return {_subst(k, paths): _subst(v, paths) for k, v in value.items()}
    return value


def _normalise(value: Any, paths: dict[str, str]) -> Any:
    if isinstance(value, str):
        for k, v in sorted(paths.items(), key=lambda kv: -len(kv[1])):
            value = value.replace(v, k)
        return value
    if isinstance(value, list):
        return [_normalise(v, paths) for v in value]
    if isinstance(value, dict):
        return {_normalise(k, paths): _normalise(v, paths) for k, v in value.items()}
    return value


def _snapshot(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_dir():
            out[rel + "/"] = "<dir>"
            continue
        data = p.read_bytes()
        out[rel] = data.decode() if len(data) <= 300 and data.isascii() else \
            f"<{len(data)} bytes {hashlib.sha256(data).hexdigest()[:16]}>"
    return out


def run_client(name: str, client: str, root: Path, *, agentfsm: list[str] | None = None,
               pythonpath: str | None = None) -> dict[str, Any]:
    """One scenario with one client; the run reduced to what is compared (``bodies``: every request's
    messages, for the regression recordings). ``agentfsm``: the command that runs agentfsm (default:
    this interpreter's ``-m agentfsm``); ``pythonpath``: put first on its import path (an older copy
    of the package, to record how it diverged)."""
    scen = json.loads((HERE / "scenarios" / f"{name}.json").read_text())
    rd = root / name / client
    ws, out, home = rd / "ws", rd / "out", rd / "home"
    for d in (ws, out, home):
        d.mkdir(parents=True)
    paths = {"$WS": str(ws), "$OUT": str(out), "$HOME": str(home)}
    for rel, spec in scen.get("files", {}).items():
        target = Path(_subst(rel, paths))
        target = target if target.is_absolute() else ws / rel
        data = _file_bytes(spec)
        if data is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    argv = ([CLAUDE or "claude"] if client == "cc" else agentfsm or [sys.executable, "-m", "agentfsm"]) + [
        "-p", _subst(scen["prompt"], paths), "--output-format", "stream-json", "--verbose", "--model", MODEL,
        "--tools", scen.get("tools", DEFAULT_TOOLS), *_subst(scen.get("args", []), paths)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "IS_SANDBOX": "1",
           "ANTHROPIC_API_KEY": "sk-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "AGENTFSM_HOME": str(home / "agentfsm"), "LANG": "C.UTF-8", "TERM": "dumb"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    with ScriptedServer(_subst(scen["responses"], paths), ws=ws) as server:
        env["ANTHROPIC_BASE_URL"] = server.base_url
        done = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=scen.get("timeout", 180),
                              stdin=subprocess.DEVNULL)
        requests = [dict(r) for r in server.requests]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    return _normalise({
        "history": requests[-1].get("messages", []) if requests else [],
        "bodies": [r.get("messages", []) for r in requests],
        "tools": sorted(t.get("name") for t in (requests[0].get("tools", []) if requests else [])),
        "result": {k: result[k] for k in RESULT_FIELDS if k in result} if result else None,
        "n_requests": len(requests),
        "ws": _snapshot(ws), "out": _snapshot(out), "stderr": done.stderr[-1500:],
    }, paths)


# --- comparing ---------------------------------------------------------------------------------


def _text(content: Any) -> Any:
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    parts: list[Any] = []
    for b in content or []:
        if b.get("type") == "text":
            text = SAVED_PATH.sub("Full output saved to: $SAVED", TOKENS_REMINDER.sub("", b["text"])).rstrip()
            if text or len(content) == 1:
                parts.append(text)
        elif b.get("type") == "image":
            src = b.get("source", {})
            digest = hashlib.sha256(src.get("data", "").encode()).hexdigest()[:16]
            parts.append(f"<image {src.get('media_type')} {digest}>")
        else:
            parts.append(f"<{b.get('type')}>")
    return parts[0] if len(parts) == 1 and isinstance(parts[0], str) else parts


def _is_preamble(block: dict[str, Any]) -> bool:
    text = block.get("text", "") if block.get("type") == "text" else ""
    return text.startswith("<system-reminder>") and any(m in text[:400] for m in PREAMBLE_MARKERS)


def canon(run: dict[str, Any]) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    shape: list[Any] = []
    for i, m in enumerate(run["history"]):
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        # parallel results: Claude Code lists them as they complete, which varies from run to run;
        # agentfsm in call order. Compared by id, so the texts still have to match one for one.
        slots = [k for k, b in enumerate(content) if b.get("type") == "tool_result"]
        by_id = sorted((content[k] for k in slots), key=lambda b: str(b.get("tool_use_id")))
        content = list(content)
        for k, b in zip(slots, by_id, strict=True):
            content[k] = b
        blocks: list[Any] = []
        for b in content:
            if (i == 0 and _is_preamble(b)) or b.get("type") in ("thinking", "redacted_thinking"):
                continue
            if b.get("type") == "tool_result":
                results.append({"id": b["tool_use_id"], "is_error": bool(b.get("is_error")),
                                "content": _text(b.get("content"))})
                blocks.append(("tool_result", b["tool_use_id"]))
            elif b.get("type") == "tool_use":
                blocks.append(("tool_use", b["name"], b["id"]))
            elif b.get("type") == "text":
                text = TOKENS_REMINDER.sub("", b["text"])
                if text:
                    blocks.append(("text", text))
        shape.append((m["role"], blocks))
    return {**run, "results": results, "shape": shape}


def differences(cc: dict[str, Any], af: dict[str, Any]) -> dict[str, Any]:
    """``{key: (claude code, agentfsm)}`` for everything compared that differs."""
    a, b = canon(cc), canon(af)
    out: dict[str, Any] = {}
    for i in range(max(len(a["results"]), len(b["results"]))):
        x = a["results"][i] if i < len(a["results"]) else None
        y = b["results"][i] if i < len(b["results"]) else None
        if x != y:
            out[f"tool_result[{i}]"] = (x, y)
    if a["shape"] != b["shape"]:
        out["history"] = (a["shape"], b["shape"])
    ra, rb = a["result"] or {}, b["result"] or {}
    for k in RESULT_FIELDS:
        if ra.get(k) != rb.get(k):
            out[f"result.{k}"] = (ra.get(k), rb.get(k))
    for k in ("tools", "n_requests", "ws", "out"):
        if a[k] != b[k]:
            out[k] = (a[k], b[k])
    return out


# --- the test ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Any]:
    if CLAUDE is None:
        pytest.skip("no Claude Code binary: set $AGENTFSM_CLAUDE or put `claude` on PATH")
    root = tmp_path_factory.mktemp("fidelity")
    jobs = int(os.environ.get("AGENTFSM_FIDELITY_JOBS", "4"))
    with cf.ThreadPoolExecutor(jobs) as pool:
        futures = {(n, c): pool.submit(run_client, n, c, root) for n in SCENARIOS for c in ("cc", "af")}
        done: dict[tuple[str, str], Any] = {}
        for key, fut in futures.items():
            try:
                done[key] = fut.result()
            except Exception as exc:  # reported by the scenario's own test
                done[key] = exc
    return done


def test_there_are_enough_scenarios_and_every_accepted_difference_says_why() -> None:
    assert len(SCENARIOS) >= 30
    for scenario, entries in accepted().items():
        assert scenario == "*" or scenario in SCENARIOS, scenario
        assert all(isinstance(why, str) and len(why) > 20 for why in entries.values()), scenario


@pytest.mark.parametrize("name", SCENARIOS)
def test_agentfsm_shows_and_decides_what_claude_code_does(name: str, runs: dict[tuple[str, str], Any]) -> None:
    cc, af = runs[(name, "cc")], runs[(name, "af")]
    for client, run in (("Claude Code", cc), ("agentfsm", af)):
        if isinstance(run, Exception):
            raise AssertionError(f"{client} did not run {name}: {run!r}")
        assert run["result"] is not None, f"{client} gave no result for {name}: {run['stderr']}"
    allowed = {**accepted().get("*", {}), **accepted().get(name, {})}
    new = {k: v for k, v in differences(cc, af).items() if k not in allowed}
    assert not new, "differences not in tests/fidelity/accepted.json:\n" + json.dumps(
        new, indent=1, ensure_ascii=False, default=str)[:12000]
