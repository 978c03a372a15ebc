"""Where a Temporal worker's CPU goes: a worker process with a sampling profiler over all its Python
threads (``bench/temporal.py --profile``). The SDK runs workflow activations on a thread pool and
activities on the event loop, so one profiler per thread would miss half; this samples every
thread's stack each millisecond instead, skips threads that wait (a selector, a queue, a lock), and
sorts each busy sample by side (workflow activation / activity / the SDK's own loop) and by what the
innermost recognised frame is doing (the sandbox, payload conversion, protobuf, agentfsm, the rest
of the SDK). Time in the SDK's Rust core threads is not Python and is read from ``/proc`` instead
(per thread, by name), so the table says how much of the worker's CPU is Python at all.

    python bench/temporal_sampler.py ADDRESS QUEUE CONCURRENCY SANDBOX(0/1) OUT.json
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

_IDLE = {("selectors.py", "select"), ("threading.py", "wait"), ("queue.py", "get"), ("thread.py", "_worker"),
         ("threading.py", "_wait_for_tstate_lock"), ("base_events.py", "_run_once")}


def _side(stack: list[str]) -> str:
    joined = "\n".join(stack)
    if "agentfsm/temporal/activities.py" in joined or "temporalio/worker/_activity.py" in joined:
        return "activity"
    if "temporalio/worker/_workflow_instance.py" in joined or "workflow_sandbox" in joined \
            or "temporalio/worker/_workflow.py" in joined:
        return "workflow"
    return "sdk loop"


def _what(stack: list[str]) -> str:
    for f in stack:  # innermost first
        if "workflow_sandbox" in f:
            return "sandbox"
        if "temporalio/converter" in f or "/cattrs/" in f or "agentfsm/temporal/convert.py" in f:
            return "payload conversion"
        if "google/protobuf" in f:
            return "protobuf"
        if "/agentfsm/" in f or "/fsm/" in f or "/tools/" in f:
            return "agentfsm"
        if "/temporalio/" in f:
            return "temporalio (other)"
    return "other (stdlib, asyncio)"


def _innermost_known(frame: Any) -> str:
    """The innermost frame's file:function, and the innermost agentfsm frame's (the detail view)."""
    here = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
    f = frame
    while f is not None:
        name = f.f_code.co_filename
        if "/agentfsm/" in name or "/fsm/" in name or "/tools/" in name:
            return f"{here} < {Path(name).name}:{f.f_code.co_name}"
        f = f.f_back
    return here


def sample(stop: threading.Event, counts: Counter[tuple[str, str]], interval: float = 0.001) -> None:
    me = threading.get_ident()
    while not stop.is_set():
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            code = frame.f_code
            if (Path(code.co_filename).name, code.co_name) in _IDLE:
                continue
            stack = []
            f: Any = frame
            while f is not None:
                stack.append(f.f_code.co_filename)
                f = f.f_back
            key = (_side(stack), _what(stack))
            counts[key] += 1
            if os.environ.get("SAMPLER_DETAIL"):
                counts[("inner", _innermost_known(frame))] += 1
        time.sleep(interval)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of a process (Linux /proc)."""
    out: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name.rstrip("0123456789-_")] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return dict(out)


def main() -> None:
    address, queue, concurrency, sandbox, out = sys.argv[1:6]
    from agentfsm.temporal.worker import serve

    counts: Counter[tuple[str, str]] = Counter()
    stop = threading.Event()
    began: dict[str, Any] = {}

    def ready() -> None:
        began["cpu"] = thread_cpu(os.getpid())
        threading.Thread(target=sample, args=(stop, counts), daemon=True).start()
        sys.stderr.write("agentfsm worker ready\n")
        sys.stderr.flush()

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    asyncio.run(serve(address, task_queue=queue, concurrency=int(concurrency), sandbox=sandbox == "1", ready=ready))
    stop.set()
    end = thread_cpu(os.getpid())
    cpu = {k: v - began.get("cpu", {}).get(k, 0.0) for k, v in end.items()}
    Path(out).write_text(json.dumps({"samples": [[s, w, n] for (s, w), n in counts.most_common()], "threads": cpu}))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
