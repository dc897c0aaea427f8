"""What every launched worker runs first: tie its life to the agent's, then run the user's code.

Scripts run as ``python -m gpulayer.runtime.worker SCRIPT ARGS`` (or ``-m MODULE ARGS``) under torch's
``record``, so a failing script leaves its traceback in the error file that the agent reports.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from collections.abc import Callable
from typing import Any

from gpulayer.runtime import clean_exit

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel kill this worker when its agent dies, so that no worker outlives a killed launcher."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not permitted here: the agent's own shutdown still stops us
    if os.getppid() != parent:  # the agent died before the request took effect
        os._exit(1)


def run_callable(target: Callable[..., Any], *args: Any) -> Any:
    """Entry point for callable targets; torch wraps it in ``record`` itself."""
    die_with_parent()
    try:
        return target(*args)
    except BaseException:
        clean_exit.mark_failed()  # torch's spawn wrapper catches the error, so excepthook never sees it
        raise


def run_script(argv: list[str]) -> None:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``python`` would, as ``__main__``."""
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    die_with_parent()
    record(run_script)(sys.argv[1:])


if __name__ == "__main__":
    main()
