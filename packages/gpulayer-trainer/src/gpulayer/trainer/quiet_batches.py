"""Which training batches no per-batch rule can act on, so that the fit loop runs them without asking each rule.

After every batch the fit loop asks its rules (a log step, validation, the epoch's end, the schedulers, the batch
hooks, accumulation, a stop or a SIGTERM) whether they act. In the common configuration most of them follow a
count, so the loop can tell at one batch where the next batch that any of them acts on is, and run the batches
before it as quiet batches: the step and its counters, nothing else. The rules stay one copy (ADR 0021); only when
they are asked changes. A stop or a SIGTERM can come at any batch: the loop reads both after every quiet batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.trainer.fit_loop import FitLoop

# The batch hooks run per batch and may set anything: a configuration with one runs every rule every batch.
_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end")


def has_quiet_batches(loop: FitLoop) -> bool:
    """Whether this epoch's rules all follow the batch count (else every batch asks every rule)."""
    args = loop.args
    return not (
        args.fast_dev_run
        or args.accumulate_grad_batches != 1
        or loop.val_check_batch is None  # val_check_interval is a time: due whenever the clock says
        or loop.trainer.lr_scheduler_configs
        or any(name in loop.hooks.active for name in _BATCH_HOOKS)
    )


def next_busy_batch(loop: FitLoop) -> int | float:
    """The first ``batch_idx`` after the current one at which a rule can act; the batches before it are quiet.

    Called after a batch that ran every rule (or at the epoch's start), when ``batch_idx``, ``total_batches`` and
    ``batches_that_stepped`` count the batches done. From here each quiet batch adds one to each of them.
    """
    following = loop.batch_idx + 1
    if not has_quiet_batches(loop):
        return following
    busy: int | float = math.inf  # the epoch's last batch is busy too: the loop sees it flagged is_last_batch
    every = loop.args.log_every_n_steps
    if every:  # a log step: the batch after which batches_that_stepped is a multiple of every
        busy = min(busy, following + (-(loop.batches_that_stepped + 1)) % every)
    interval = loop.val_check_batch
    if loop.should_validate_this_epoch() and interval != math.inf:
        if loop.args.check_val_every_n_epoch is None:  # counted in batches across epochs
            busy = min(busy, following + (-(loop.total_batches + 1)) % interval)
        else:
            busy = min(busy, following + (-(following + 1)) % interval)
    return busy
