"""Running a scripted case with a real client — Claude Code (the oracle) or agentfsm — and reducing the run to
what the differential comparisons compare (issues 14 and 27).

A *case* is the differential test's scenario format (``tests/fidelity/scenarios/NAME.json``): ``files``
(the workspace; ``$OUT/...`` names a file in the directory beside it), ``prompt``, ``args`` (extra command
line), ``tools`` (the ``--tools`` list), ``responses`` (the scripted model, in
:mod:`agentfsm.testing.scenario`'s JSON form), ``timeout``. ``$WS``, ``$OUT`` and ``$HOME`` in any of them
stand for the run's own directories.

:func:`run_client` runs one client on a case in a fresh workspace (``ws/``), beside a directory outside
it (``out/``), with a scratch HOME, against its own :class:`~agentfsm.testing.server.ScriptedServer`. The
run comes back reduced — with the run's paths written ``$WS``, ``$OUT``, ``$HOME`` — to every request's
messages, the tools offered, the result line's fields, the exit status, the files left in ``ws/`` and
``out/``, and the path and counters the auditor rebuilds from the client's own record (Claude Code's
transcript, agentfsm's trace) with :func:`agentfsm.auditing.audit.audit_report`.

:func:`differences` is the differential test's comparison (tool results, history shape, result fields,
tools, number of requests, files); :func:`conform_differences` adds what ``agentfsm conform`` compares
besides: every request's canonical shape, the exit status, and the audited path and counters.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import urllib.parse
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentfsm.auditing.audit import NotATrace, audit_report
from agentfsm.machine import prompts
from agentfsm.testing.server import ScriptedServer

MODEL = "claude-sonnet-4-5"
DEFAULT_TOOLS = "Read,Write,Edit,Bash,Glob,Grep"
RESULT_FIELDS = ("subtype", "is_error", "terminal_reason", "result", "permission_denials", "structured_output",
                 "num_turns", "errors")
CLAUDE_CODE = "cc"
AGENTFSM = "af"

TOKENS_REMINDER = re.compile(
    r"\n*<system-reminder>\n<total_tokens>\d+ tokens left</total_tokens>\n</system-reminder>\n?")
SAVED_PATH = re.compile(r"Full output saved to: \S+")
# --max-budget-usd's reminder after a tool's output: compared after the output, whose trailing white space is
# each client's own (as everywhere, text is compared right-stripped), and after Claude Code's token reminder
BUDGET_REMINDER = re.compile(r"\s*(<system-reminder>\nUSD budget: [^<]*</system-reminder>)\s*$")
# each client's estimate of its own conversation (Claude Code's counts its context preamble, which is not
# compared): the number is left out of the comparison, the text around it is compared
OWN_ESTIMATE = re.compile(r"(this conversation is only ~)\d+( tokens)")
# Compaction speaks through each client's own prompt texts, which are not compared: the summary request's
# instructions (Claude Code's and agentfsm's, each by its opening words) are written <summary instructions>,
# and the message that carries a summary into the conversation is written by what it carries (the text
# after the shared opening sentence, less Claude Code's reminder before it and its pointer to the
# transcript after it) and by the notes it ends with, each client's own words written by what they say:
# <kept verbatim> (the latest rounds follow the summary unchanged), <not covered> (the summary request
# left out the start of the conversation). What is compared is which messages were summarised, the summary
# itself and those notes.
COMPACT_INSTRUCTION_OPENINGS = ("CRITICAL: Respond with TEXT ONLY", prompts.COMPACT_INSTRUCTION[:40])
COMPACT_SUMMARY_OPENING = prompts.COMPACT_SUMMARY_PREFIX.rstrip()  # the same sentence in both clients
_SUMMARY_TAIL = re.compile(r"\n\n(If you need specific details from before compaction|Continue the conversation "
                           r"from where it left off|" + re.escape(prompts.COMPACT_TRUNCATED_NOTE[:30]) + "|"
                           + re.escape(prompts.COMPACT_KEPT_NOTE[:30]) + r").*", re.S)
_COMPACT_NOTES = (
    ("<not covered>", ("part of the earlier conversation was too large", prompts.COMPACT_TRUNCATED_NOTE[:30])),
    ("<kept verbatim>", ("are the most recent messages from before compaction, kept verbatim",
                         prompts.COMPACT_KEPT_NOTE[:30])),
)
_LEADING_REMINDER = re.compile(r"^\s*<system-reminder>.*?</system-reminder>\s*", re.S)


def compaction_text(text: str) -> str:
    """``text`` with each client's own compaction prompt written by what it stands for (see above)."""
    if text.startswith(COMPACT_INSTRUCTION_OPENINGS):
        return "<summary instructions>"
    if text.startswith(COMPACT_SUMMARY_OPENING):
        rest = _LEADING_REMINDER.sub("", text[len(COMPACT_SUMMARY_OPENING):])
        notes = [name for name, says in _COMPACT_NOTES if any(s in rest for s in says)]
        return " ".join(["<compact summary>", _SUMMARY_TAIL.sub("", rest).strip(), *notes])
    return text


# A Stop hook's block reason reaches the model in each client's own words: Claude Code 2.1.332 sends a
# reminder quoting the hook's command (`Stop hook blocking error from command: "<command>": <reason>`) and
# one with its provenance preamble before `Stop hook feedback:\n<reason>`; agentfsm sends the last
# without the preamble (tests/fidelity/accepted.json, hook_stop_block). Compared by what they carry: the
# quoting reminder is left out, the preamble dropped, the reason compared.
STOP_FEEDBACK_OPENING = prompts.STOP_HOOK_FEEDBACK.split("{reason}")[0]
_STOP_COMMAND_QUOTED = re.compile(
    r"\s*<system-reminder>\nStop hook blocking error from command: .*</system-reminder>\s*", re.S)
_HOOK_PREAMBLE = re.compile(r"^(\s*<system-reminder>\n)[^<]*?(" + re.escape(STOP_FEEDBACK_OPENING) + ")", re.S)


def hook_feedback_text(text: str) -> str:
    """``text`` with each client's own wording of a Stop hook's feedback left out (see above)."""
    if _STOP_COMMAND_QUOTED.fullmatch(text):
        return ""
    return _HOOK_PREAMBLE.sub(r"\1\2", text)


PREAMBLE_MARKERS = ("# Environment\n", "You are powered by the model", "<total_tokens>", "Today's date is",
                    "Attribution for git commits", "As you answer the user's questions", "# claudeMd")


# --- running -----------------------------------------------------------------------------------


def file_bytes(spec: Any) -> bytes | None:
    """A case's file: its text, or ``{"lines": n}``, ``{"size": n}``, ``{"hex": ...}``, ``{"base64": ...}``,
    ``{"png": [w, h]}``; ``{"dir": true}`` (None) is a directory. (``{"symlink": target}`` is made by
    :func:`run_client`, not here.)"""
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


def subst(value: Any, paths: Mapping[str, str]) -> Any:
    """``$WS``, ``$OUT``, ``$HOME`` replaced by the run's directories, everywhere in ``value``."""
    if isinstance(value, str):
        for k, v in paths.items():
            value = value.replace(k, v)
        return value
    if isinstance(value, list):
        return [subst(v, paths) for v in value]
    if isinstance(value, dict):
        return {subst(k, paths): subst(v, paths) for k, v in value.items()}
    return value


def normalise(value: Any, paths: Mapping[str, str]) -> Any:
    """The reverse of :func:`subst`: the run's directories written ``$WS``, ``$OUT``, ``$HOME`` (and the
    scripted server's address ``$SERVER``)."""
    if isinstance(value, str):
        for k, v in sorted(paths.items(), key=lambda kv: -len(kv[1])):
            value = value.replace(v, k)
        return value
    if isinstance(value, list):
        return [normalise(v, paths) for v in value]
    if isinstance(value, dict):
        return {normalise(k, paths): normalise(v, paths) for k, v in value.items()}
    return value


def snapshot(root: Path) -> dict[str, str]:
    """The files under ``root``: short ASCII ones by content, the others by size and digest."""
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


def _audited(home: Path, client: str) -> dict[str, Any]:
    """The path and counters the auditor rebuilds from the client's own record of the run."""
    # (an oracle that is not Claude Code — another agentfsm, in the kit's own tests — keeps its trace under
    # agentfsm's home)
    wheres = [home / ".claude", home / "agentfsm"] if client == CLAUDE_CODE else [home / "agentfsm"]
    files = [p for where in wheres if where.is_dir()
             for p in sorted(where.rglob("*.jsonl")) if "subagents" not in p.parts]
    if not files:
        return {"path": None, "counters": None, "terminal_reason": None, "findings": ["no transcript"]}
    try:
        report = audit_report(files[0])
    except NotATrace as exc:
        return {"path": None, "counters": None, "terminal_reason": None, "findings": [str(exc)]}
    return {"path": [m.label for m in report.moves], "counters": dict(report.counters),
            "terminal_reason": report.terminal_reason,
            "findings": [f"{f.code}: {f.message}" for f in report.findings if f.severity == "error"]}


def run_client(case: Mapping[str, Any], client: str, rd: Path, *, claude: str | None = None,
               agentfsm: Sequence[str] | None = None, pythonpath: str | None = None) -> dict[str, Any]:
    """Run ``case`` with ``client`` (:data:`CLAUDE_CODE`, whose binary is ``claude``, or :data:`AGENTFSM`,
    run as ``agentfsm`` — default: this interpreter's ``-m agentfsm`` — with ``pythonpath`` first on its
    import path) in the fresh directory ``rd``; the run reduced to what is compared (``bodies``: every
    request's messages)."""
    ws, out, home = rd / "ws", rd / "out", rd / "home"
    for d in (ws, out, home):
        d.mkdir(parents=True)
    paths = {"$WS": str(ws), "$OUT": str(out), "$HOME": str(home)}
    for rel, spec in case.get("files", {}).items():
        target = Path(subst(rel, paths))
        target = target if target.is_absolute() else ws / rel
        if isinstance(spec, Mapping) and "symlink" in spec:
            # a link in the workspace to somewhere else: the boundary cases go out through one
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(subst(spec["symlink"], paths))
            continue
        data = file_bytes(spec)
        if data is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    if client == CLAUDE_CODE:
        if not claude:
            raise ValueError("no Claude Code binary given")
        command = [claude]
    else:
        command = list(agentfsm or [sys.executable, "-m", "agentfsm"])
    argv = [*command, "-p", subst(case["prompt"], paths), "--output-format", "stream-json", "--verbose",
            "--model", MODEL, "--tools", case.get("tools", DEFAULT_TOOLS), *subst(case.get("args", []), paths)]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "IS_SANDBOX": "1",
           "ANTHROPIC_API_KEY": "sk-test", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "AGENTFSM_HOME": str(home / "agentfsm"), "LANG": "C.UTF-8", "TERM": "dumb"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    with ScriptedServer(subst(case["responses"], paths), ws=ws) as server:
        env["ANTHROPIC_BASE_URL"] = server.base_url
        # the server's address, which a 5xx's text names, is each run's own: written $SERVER
        paths = {**paths, "$SERVER": urllib.parse.urlsplit(server.base_url).netloc}
        try:
            done = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True,
                                  timeout=case.get("timeout", 180), stdin=subprocess.DEVNULL)
            stdout, stderr, code = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            stderr, code = f"timed out after {exc.timeout} s", None
        requests = [dict(r) for r in server.requests]
    events = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    return task_ids_numbered(normalise({
        "history": requests[-1].get("messages", []) if requests else [],
        "bodies": [r.get("messages", []) for r in requests],
        "tools": sorted(t.get("name") for t in (requests[0].get("tools", []) if requests else [])),
        "result": {k: result[k] for k in RESULT_FIELDS if k in result} if result else None,
        "n_requests": len(requests), "exit": code,
        "ws": snapshot(ws), "out": snapshot(out), "stderr": stderr[-1500:],
        **_audited(home, client),
    }, paths))


# a background task's id as each client announces it, and its output file (Claude Code's under
# /tmp/claude-<uid>/<project>/<session>/tasks, agentfsm's under <tmp>/agentfsm/<session>/tasks)
_TASK_ID_SITES = re.compile(r"with ID: ([A-Za-z0-9_-]+)|<task-id>([A-Za-z0-9_-]+)</task-id>|"
                            r"/tasks/([A-Za-z0-9_-]+)\.output")
_TASKS_DIR = re.compile(r"/[^\s\"'<>]*?/tasks/(TASK\d+)\.output")


def task_ids_numbered(run: Any) -> Any:
    """The run with its background tasks' ids (chosen at random by each client) written ``TASK1``,
    ``TASK2``… in order of appearance, and their output files ``$TASKS/TASKn.output``."""
    text = json.dumps(run)
    ids: dict[str, str] = {}
    for m in _TASK_ID_SITES.finditer(text):
        found = next(g for g in m.groups() if g)
        ids.setdefault(found, f"TASK{len(ids) + 1}")
    if not ids:
        return run
    for old, new in sorted(ids.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return json.loads(_TASKS_DIR.sub(lambda m: f"$TASKS/{m.group(1)}.output", text))


# --- comparing ---------------------------------------------------------------------------------


def _text(content: Any) -> Any:
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    parts: list[Any] = []
    for b in content or []:
        if b.get("type") == "text":
            text = SAVED_PATH.sub("Full output saved to: $SAVED",
                                  without_preamble(TOKENS_REMINDER.sub("", b["text"]))).rstrip()
            text = BUDGET_REMINDER.sub(lambda m: "\n\n" + m.group(1), text)
            if text or len(content) == 1:
                parts.append(text)
        elif b.get("type") == "image":
            src = b.get("source", {})
            digest = hashlib.sha256(src.get("data", "").encode()).hexdigest()[:16]
            parts.append(f"<image {src.get('media_type')} {digest}>")
        else:
            parts.append(f"<{b.get('type')}>")
    return parts[0] if len(parts) == 1 and isinstance(parts[0], str) else parts


_REMINDER = re.compile(r"\n*<system-reminder>\n(.*?)</system-reminder>", re.S)


_JOINED_REMINDER = re.compile(r"(?<=\S)\n*(?=<system-reminder>\n)")


def without_preamble(text: str) -> str:
    """``text`` less the context preamble's reminders joined to it (Claude Code joins them to the last tool
    result when it compacts and keeps rounds: tests/fidelity/recorded/compact_three_reads.json), each
    reminder still joined after text by a blank line (as both clients join one; removing the token reminder
    before it takes one newline with it)."""
    text = _REMINDER.sub(lambda m: "" if any(k in m.group(1)[:400] for k in PREAMBLE_MARKERS) else m.group(0), text)
    return _JOINED_REMINDER.sub("\n\n", text)


def is_preamble(block: Mapping[str, Any]) -> bool:
    """A block of the first message's context preamble (the client's own prompt text, not compared)."""
    text = block.get("text", "") if block.get("type") == "text" else ""
    return text.startswith("<system-reminder>") and any(m in text[:400] for m in PREAMBLE_MARKERS)


def canon(run: Mapping[str, Any]) -> dict[str, Any]:
    """The run with ``results`` (every tool_result: id, error flag, text) and ``shape`` (per message of the
    history, its blocks other than thinking and the preamble) added."""
    results: list[dict[str, Any]] = []
    shape: list[Any] = []
    for m in run["history"]:
        content = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        # parallel results: Claude Code lists them as they complete, which varies from run to run;
        # agentfsm in call order. Compared by id, so the texts still have to match one for one.
        slots = [k for k, b in enumerate(content) if b.get("type") == "tool_result"]
        by_id = sorted((content[k] for k in slots), key=lambda b: str(b.get("tool_use_id")))
        content = list(content)
        for k, b in zip(slots, by_id, strict=True):
            content[k] = b
        blocks: list[Any] = []
        # --max-budget-usd's reminder rides with the batch's last result: Claude Code's last to complete,
        # agentfsm's last in call order; compared as the message's, after its blocks
        reminders: list[Any] = []
        for b in content:
            if (m["role"] == "user" and is_preamble(b)) or b.get("type") in ("thinking", "redacted_thinking"):
                continue
            if b.get("type") == "tool_result":
                text = _text(b.get("content"))
                if isinstance(text, str) and (found := BUDGET_REMINDER.search(text)):
                    text = text[:found.start()]
                    reminders.append(("budget reminder", found.group(1)))
                results.append({"id": b["tool_use_id"], "is_error": bool(b.get("is_error")), "content": text})
                blocks.append(("tool_result", b["tool_use_id"]))
            elif b.get("type") == "tool_use":
                blocks.append(("tool_use", b["name"], b["id"]))
            elif b.get("type") == "text":
                text = hook_feedback_text(compaction_text(TOKENS_REMINDER.sub("", b["text"])))
                if text:
                    blocks.append(("text", text))
        # consecutive messages of one role are one turn to the API: Claude Code sends the files it shows again
        # after a compaction, and its preamble, as user messages of their own before the summary's
        # (tests/fidelity/recorded/compact_one_read.json), agentfsm in one
        blocks += reminders
        if shape and shape[-1][0] == m["role"]:
            shape[-1] = (m["role"], [*shape[-1][1], *blocks])
        else:
            shape.append((m["role"], blocks))
    shape = [(role, blocks) for role, blocks in shape if blocks]
    return {**run, "results": results, "shape": shape}


def _estimates_out(result: Mapping[str, Any]) -> dict[str, Any]:
    text = result.get("result")
    return {**result, "result": OWN_ESTIMATE.sub(r"\1N\2", text)} if isinstance(text, str) else dict(result)


def differences(cc: Mapping[str, Any], af: Mapping[str, Any]) -> dict[str, Any]:
    """``{key: (claude code, agentfsm)}`` for everything the differential test compares that differs."""
    a, b = canon(cc), canon(af)
    out: dict[str, Any] = {}
    for i in range(max(len(a["results"]), len(b["results"]))):
        x = a["results"][i] if i < len(a["results"]) else None
        y = b["results"][i] if i < len(b["results"]) else None
        if x != y:
            out[f"tool_result[{i}]"] = (x, y)
    if a["shape"] != b["shape"]:
        out["history"] = (a["shape"], b["shape"])
    ra, rb = _estimates_out(a["result"] or {}), _estimates_out(b["result"] or {})
    for k in RESULT_FIELDS:
        if ra.get(k) != rb.get(k):
            out[f"result.{k}"] = (ra.get(k), rb.get(k))
    for k in ("tools", "n_requests", "ws", "out"):
        if a[k] != b[k]:
            out[k] = (a[k], b[k])
    return out


def request_shapes(run: Mapping[str, Any]) -> list[Any]:
    """Every request's history shape (:func:`canon`'s ``shape``), the first message's preamble left out."""
    return [canon({"history": body})["shape"] for body in run.get("bodies", [])]


def conform_differences(cc: Mapping[str, Any], af: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`differences`, plus one key per request whose shape differs (``request[i]``), the exit status
    (``exit``) and the audited path and counters (``path``, ``counters``)."""
    out = differences(cc, af)
    ra, rb = request_shapes(cc), request_shapes(af)
    for i in range(max(len(ra), len(rb))):
        x = ra[i] if i < len(ra) else None
        y = rb[i] if i < len(rb) else None
        if x != y:
            out[f"request[{i}]"] = (x, y)
    for k in ("exit", "path"):
        if cc.get(k) != af.get(k):
            out[k] = (cc.get(k), af.get(k))
    x, y = _common(cc.get("counters"), af.get("counters"))
    if x != y:
        out["counters"] = (cc.get("counters"), af.get("counters"))
    return out


def _common(x: Any, y: Any) -> tuple[Any, Any]:
    """Two runs' counters on the counters both know (a run recorded before a counter was declared
    does not have it); anything else as it is."""
    if isinstance(x, Mapping) and isinstance(y, Mapping):
        keys = x.keys() & y.keys()
        return {k: x[k] for k in keys}, {k: y[k] for k in keys}
    return x, y
