"""Back-references held weakly, so that per-session objects form no reference cycles.

A session owns its queue, driver, gate and subagents; when one of them calls back into its owner
(an emit, a record for the session file, the subagent service) through a plain bound method, the
owner and the owned form a cycle, and a finished session waits for the cyclic garbage collector
instead of being freed by reference counting the moment its last reference goes. Those callbacks
are :func:`weak_method` instead: the owner stays the only strong holder (issue 34;
tests/test_engine_shape.py checks that a finished session leaves nothing for ``gc.collect()``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

_RAISE: Any = object()


class _WeakCall:
    """A bound method held weakly: one object and its weak reference (a closure would add a
    function and three cells to every session's gc-tracked objects)."""

    __slots__ = ("_gone", "_name", "_ref")

    def __init__(self, method: Callable[..., Any], gone: Any) -> None:
        self._ref = weakref.WeakMethod(method)  # type: ignore[arg-type]
        self._name: str = method.__qualname__  # a bound method has one (its repr would format the object)
        self._gone = gone

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self._ref()
        if bound is None:
            if self._gone is _RAISE:
                raise ReferenceError(f"{self._name}: its object is gone")
            return self._gone
        return bound(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<weak {self._name}>"


def weak_method(method: Callable[..., Any], *, gone: Any = _RAISE) -> Callable[..., Any]:
    """``method`` (a bound method) without a strong reference to its object. Called after the
    object is gone it returns ``gone``, or, when no ``gone`` is given, raises ReferenceError naming
    the method (a caller that must never outlive its owner says so loudly)."""
    return _WeakCall(method, gone)
