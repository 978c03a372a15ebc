"""Progress of long work over many files, on stderr only, and how a command says it was interrupted.

stdout carries reports and ``--json`` output, which must be the same whether or not a person is
watching; so progress goes to stderr, and only when stderr is a terminal and rich (an optional
dependency: the ``test`` extra) can be imported. Otherwise :func:`steps` hands the items back
untouched and writes nothing: a log file or a pipe gets no control sequences.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, TypeVar

T = TypeVar("T")

# the shell's status for a process ended by SIGINT (128 + 2): what a caller's `$?` expects after Ctrl-C
INTERRUPTED = 130


def _console(stream: TextIO) -> Any | None:
    """A rich console on ``stream`` when a person is watching it, else None."""
    isatty = getattr(stream, "isatty", None)
    if isatty is None or not isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:  # rich is optional: without it the work is just quiet
        return None
    return Console(file=stream)


@contextmanager
def steps(items: Sequence[T], what: str, *, name: Callable[[T], str] | None = None, stream: TextIO | None = None,
          console: Any = None) -> Iterator[Iterator[T]]:
    """``with steps(files, "auditing") as each: for f in each: ...``: on a terminal, a bar below saying
    ``what``, the current item's name (``name(item)``, by default a path's file name), how many are
    done of how many, and that Ctrl-C stops. A context manager, not a bare generator, so the bar is
    gone before an exception (Ctrl-C) leaves the block. ``console`` (a rich console) is for tests
    that want the bar without a terminal."""
    con = console if console is not None else _console(sys.stderr if stream is None else stream)
    if con is None or not items:
        yield iter(items)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    label = name or (lambda item: Path(item).name if isinstance(item, (str, Path)) else str(item))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("(Ctrl-C stops)"), console=con, transient=True)

    def each() -> Iterator[T]:
        task = progress.add_task(what, total=len(items))
        for item in items:
            progress.update(task, description=f"{what} {label(item)}")
            yield item
            progress.advance(task)

    with progress:
        yield each()


def interrupted(prog: str, what: Iterable[str] = ()) -> int:
    """Say on stderr that Ctrl-C stopped ``prog`` (and what was not done), and give the exit status."""
    tail = "".join(f"; {w}" for w in what)
    print(f"{prog}: interrupted (Ctrl-C){tail}", file=sys.stderr)
    return INTERRUPTED
