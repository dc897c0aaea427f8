"""What every launched worker runs first: tie its life to the agent's, then run the user's code.

Scripts run as ``python -m gpulayer.runtime.worker SCRIPT ARGS`` (or ``-m MODULE ARGS``) under torch's
``record``, so a failing script leaves its traceback in the error file that the agent reports; a script that
returns or raises then ends without the interpreter's teardown (see ``end_now``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import io
import os
import runpy
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

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


def end_now(status: int, error: Exception | None = None) -> NoReturn:
    """End this worker as the interpreter ends a script, less its teardown of modules and objects.

    That teardown is where torch misbehaves at exit: it takes 0.4 s (up to 2 s on a loaded machine), which kept a
    failed rank alive after its error was recorded while its peers, whose collectives it had broken, died first; and
    a finished gloo rank sometimes aborts in it ("terminate called without an active exception"). So, as at any
    exit: print the traceback of ``error``, wait for non-daemon threads, run the atexit handlers (logging, DataLoader
    workers, the process group's close, the user's), flush every open file, and exit with ``status``.
    """
    if error is not None:
        sys.excepthook(type(error), error, error.__traceback__)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter runs at exit; there is no public name for it
    for stream in _open_files():
        with contextlib.suppress(Exception):  # a file that cannot flush would have failed to close in the teardown
            stream.flush()
    os._exit(status)


def _open_files() -> list[io.IOBase]:
    """The file objects still open: the teardown would have closed, and so flushed, them."""
    return [obj for obj in gc.get_objects() if isinstance(obj, io.IOBase) and not obj.closed]


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    die_with_parent()
    try:
        record(run_script)(sys.argv[1:])
    except Exception as error:  # recorded by now; SystemExit and KeyboardInterrupt end the process as usual
        end_now(1, error)
    end_now(0)


if __name__ == "__main__":
    main()
