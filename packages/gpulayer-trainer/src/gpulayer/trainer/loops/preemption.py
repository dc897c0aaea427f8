"""Preemption: SIGTERM (what Slurm and Kubernetes send before they stop a job) ends ``fit`` with a checkpoint.

The handler only notes the signal. The fit loop acts on it where the ranks already meet (``sync_decisions.py``):
every rank finishes its step, the ranks agree, and they save ``hpc_ckpt_N.ckpt`` in ``default_root_dir`` (Lightning's
name for the checkpoint a stopped job resumes from) and exit with status 143 (128 + SIGTERM). A later ``fit``
resumes it with ``ckpt_path="hpc"``; under Slurm, or in workers the elastic agent restarted, it does so by itself.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer

SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM


class SIGTERMException(SystemExit):
    """Ends ``fit`` on every rank after a SIGTERM, once the checkpoint is written (Lightning's name)."""

    def __init__(self) -> None:
        super().__init__(SIGTERM_EXIT_STATUS)


@contextmanager
def sigterm_noted(trainer: Trainer) -> Iterator[None]:
    """While ``fit`` runs, SIGTERM sets ``trainer.received_sigterm`` and calls the handler that was there before."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def note(signum: int, frame: Any) -> None:
        trainer.received_sigterm = True
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
