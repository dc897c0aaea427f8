"""Close this process's gloo group when the process exits cleanly, and only then.

A gloo group still alive when the interpreter exits can abort the process ("terminate called without an
active exception": 4 runs in 40 of a two-rank ``Trainer(devices=2).fit`` on torch 2.13) while its threads are torn
down, so a finished job reports a SIGABRT. Collecting garbage (objects of the finished run, in reference cycles,
that still hold the group) and then closing the group prevents that (0 in 100). A failing rank must not close it:
its peers would see the group vanish and fail before this rank's own error reached the agent, which then names the
wrong rank.
"""

from __future__ import annotations

import atexit
import gc
import sys
from collections.abc import Callable
from types import TracebackType

_failed = False
_watching = False
_collecting = False


def mark_failed() -> None:
    """Record that this process is ending with an error (for callables, whose errors never reach excepthook)."""
    global _failed
    _failed = True


def close_at_clean_exit(close: Callable[[], None]) -> None:
    """Call ``close`` when the interpreter exits, unless an exception ended this process."""
    global _watching
    if not _watching:
        sys.excepthook = _marking(sys.excepthook)
        _watching = True
    atexit.register(_close_unless_failed, close)


def collect_at_clean_exit() -> None:
    """For a gloo group this process did not make (its maker closes it): collect the garbage of finished runs when
    the interpreter exits cleanly, before its teardown, so that nothing still holding the group (and gloo's work
    objects, whose tensors reference Python objects) is destroyed in that teardown. The same abort was seen with a
    group made by hand under Slurm, in the flake hunt; torch's own attempt at an exit handler is pytorch/pytorch
    pull request 179291."""
    global _collecting
    if not _collecting:
        close_at_clean_exit(_nothing)
        _collecting = True


def _nothing() -> None:
    """The close of a group this process does not own: nothing (``_close_unless_failed`` collects first)."""


def _marking(previous: Callable[..., object]) -> Callable[..., object]:
    def excepthook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> object:
        mark_failed()
        return previous(kind, error, traceback)

    return excepthook


def _close_unless_failed(close: Callable[[], None]) -> None:
    if not _failed:
        gc.collect()
        close()
