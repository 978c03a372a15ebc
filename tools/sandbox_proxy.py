"""The sandbox's network gate: an HTTP(S) proxy (``proxy.py``) on a Unix socket that lets through
only the domains the settings allow (``sandbox.network.allowedDomains``, minus ``deniedDomains``).

It runs as a child process of the session (``python -m agentfsm.tools.sandbox_proxy``): proxy.py
configures logging for the whole process it runs in, and the session's own process must not have
its logging configured by a library. The process ends when its parent does.

A sandboxed command has a network namespace of its own (loopback only); the bridge
(:mod:`agentfsm.tools.sandbox_bridge`) inside it forwards a loopback port to this socket and points
``HTTP_PROXY``/``HTTPS_PROXY`` at that port. Plain HTTP and ``CONNECT`` (HTTPS) are both judged on
the host they name, before any upstream connection is made.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any


def domain_allowed(host: str, allowed: Sequence[str], denied: Sequence[str] = ()) -> bool:
    """Claude Code's domain patterns: ``example.com`` is that host exactly, ``*.example.com`` any
    host below it (not the domain itself). A denied pattern wins over an allowed one."""
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]

    def hit(pattern: str) -> bool:
        pattern = pattern.strip().rstrip(".").lower()
        if pattern.startswith("*."):
            return host.endswith(pattern[1:])
        return host == pattern

    return bool(host) and not any(hit(p) for p in denied) and any(hit(p) for p in allowed)


def _plugin(allowed: Sequence[str], denied: Sequence[str]) -> Any:
    from proxy.common.utils import text_
    from proxy.http.exception import HttpRequestRejected
    from proxy.http.proxy import HttpProxyBasePlugin

    class AllowedDomains(HttpProxyBasePlugin):  # type: ignore[misc]
        def before_upstream_connection(self, request: Any) -> Any:
            host = text_(request.host) if request.host else ""
            if not domain_allowed(host, allowed, denied):
                raise HttpRequestRejected(status_code=403, reason=b"Forbidden by the sandbox network settings")
            return request

    return AllowedDomains


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the sandbox's allow-list proxy on a Unix socket")
    ap.add_argument("socket")
    ap.add_argument("--allow", action="append", default=[])
    ap.add_argument("--deny", action="append", default=[])
    args = ap.parse_args(argv)
    import proxy

    parent = os.getppid()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with proxy.Proxy(plugins=[_plugin(args.allow, args.deny)], unix_socket_path=args.socket, threaded=True,
                     num_acceptors=1, num_workers=1, log_level="WARNING", hostname=None):
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        # end with the session: its process is our parent
        while not stop.wait(1.0):
            if os.getppid() != parent:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
