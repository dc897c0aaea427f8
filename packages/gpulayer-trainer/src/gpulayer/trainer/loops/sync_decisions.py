"""The decisions that end training, taken the same on every rank: stop, preempt, fail on a non-finite loss.

On one process the loop acts on this process's own ``trainer.should_stop`` and ``trainer.received_sigterm``.
On several, a callback may set ``should_stop`` on one rank and a SIGTERM may reach one rank, so the loop acts on
what the ranks last agreed (``Agreement``), combined in one all-reduce of a ``Level`` at sync points every rank
reaches: every ``log_every_n_steps`` optimizer steps, the epoch's last batch, after validation and at the
epoch end. A non-finite loss is checked at the same points (a host sync there, never per step).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from gpulayer.trainer.checkpoint.hpc import hpc_save_path
from gpulayer.trainer.loops.preemption import SIGTERMException

if TYPE_CHECKING:
    from gpulayer.trainer.trainer import Trainer


class NonFiniteLossError(ValueError):
    """The training loss became NaN or inf (``Trainer(check_finite_loss=False)`` trains on)."""


class Level(enum.IntEnum):
    """What a rank asks for at a sync point; the ranks take the highest."""

    CONTINUE = 0
    STOP = 1  # should_stop is set: stop once min_epochs/min_steps allow
    PREEMPT = 2  # a SIGTERM arrived: save hpc_ckpt_N.ckpt and end fit (a preemption stops too)
    NONFINITE_LOSS = 3  # a rank's loss is NaN or inf: fail on every rank


class Agreement:
    """``should_stop`` and ``received_sigterm`` as every rank last agreed on them (several ranks only): the
    same names as the Trainer's, so the loop reads one object either way."""

    def __init__(self) -> None:
        self.should_stop = False
        self.received_sigterm = False


class SyncDecisions:
    """Combines the three decisions across ranks, and acts on them: ``decided`` is what the loop reads."""

    def __init__(self, trainer: Trainer, position: Callable[[], str]) -> None:
        self.trainer = trainer
        self.position = position  # where the loop is, for the non-finite loss error
        self.distributed = trainer.world_size > 1
        self.decided: Trainer | Agreement = Agreement() if self.distributed else trainer

    def reset(self) -> None:
        if isinstance(self.decided, Agreement):
            self.decided.should_stop = self.decided.received_sigterm = False

    def agree(self, loss: torch.Tensor | None = None) -> None:
        """At a point every rank reaches: the highest ``Level`` any rank asks for, in one collective (several
        ranks only). ``loss``, when given, is this batch's loss, checked for NaN and inf."""
        if not self.distributed:
            return
        trainer = self.trainer
        level = Level.PREEMPT if trainer.received_sigterm else Level(int(trainer.should_stop))
        own_loss_nonfinite = self._nonfinite(loss)
        if own_loss_nonfinite:
            level = Level.NONFINITE_LOSS
        flags = torch.tensor([level], dtype=torch.int32, device=trainer.runtime.device)
        agreed = Level(int(trainer.runtime.all_reduce(flags, "max").item()))
        if agreed == Level.NONFINITE_LOSS:
            raise self._nonfinite_loss_error(loss if own_loss_nonfinite else None)
        self.decided.received_sigterm = agreed == Level.PREEMPT
        self.decided.should_stop = trainer.should_stop = agreed >= Level.STOP  # the same on every rank

    def check_loss_alone(self, loss: torch.Tensor | None) -> None:
        """On one process: fail if ``loss`` (of a log step or the epoch's last batch) is not finite."""
        if self._nonfinite(loss):
            raise self._nonfinite_loss_error(loss)

    def _nonfinite(self, loss: torch.Tensor | None) -> bool:
        if loss is None or not self.trainer.args.check_finite_loss:
            return False
        return not bool(torch.isfinite(loss.detach()).all())  # a host sync, at sync points only

    def _nonfinite_loss_error(self, loss: torch.Tensor | None) -> NonFiniteLossError:
        """``loss``: this rank's non-finite loss, or None when another rank's was the non-finite one."""
        where = self.position()
        if loss is not None:
            what = f"the loss training_step returned is {loss.detach().flatten()[0].item()} at {where}"
        else:
            what = f"another rank's training_step loss is not finite at {where}"
        return NonFiniteLossError(
            f"{what}; the loss is checked at log steps (log_every_n_steps={self.trainer.args.log_every_n_steps}) "
            "and at each epoch's last batch, so it may have become non-finite a few steps earlier. "
            "Trainer(check_finite_loss=False) trains on regardless"
        )

    def preempt_if_asked(self) -> None:
        """After a SIGTERM (on several ranks, once they agreed on it): save where every rank stands to
        ``hpc_ckpt_N.ckpt`` and end ``fit`` (exit status 143)."""
        if not self.decided.received_sigterm:
            return
        trainer = self.trainer
        path = trainer.runtime.broadcast(hpc_save_path(trainer.default_root_dir) if trainer.is_global_zero else None)
        trainer.save_checkpoint(path)
        trainer.runtime.barrier()  # the file is complete before any rank exits
        if trainer.is_global_zero:
            print(f"SIGTERM: saved {path} at step {trainer.global_step}; fit(ckpt_path='hpc') resumes it", flush=True)
        raise SIGTERMException()
