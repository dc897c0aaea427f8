"""``StochasticWeightAveraging``: Lightning 2.6's SWA callback (lightning/pytorch/callbacks/stochastic_weight_avg.py),
Izmailov et al., "Averaging Weights Leads to Wider Optima and Better Generalization" (UAI 2018)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from copy import deepcopy
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.swa_utils import SWALR

from gpulayer.trainer import Callback
from gpulayer.trainer.core.optimizers import LRSchedulerConfig
from gpulayer.trainer.exceptions import (
    MisconfiguredNotImplementedError,
    MisconfiguredTypeError,
    MisconfiguredValueError,
)

log = logging.getLogger(__name__)

_AVG_FN = Callable[[Tensor, Tensor, Tensor], Tensor]
_CPU = torch.device("cpu")


class StochasticWeightAveraging(Callback):
    """Averages the module's weights over the epochs from ``swa_epoch_start`` to the last, under a ``SWALR``
    scheduler that replaces the fit's own, and leaves the average in the module when ``fit`` ends.

    - ``swa_lrs``: the SWA learning rate, one for every parameter group or a list of one per group.
    - ``swa_epoch_start``: the epoch (from 1) at which averaging starts, or a fraction of ``max_epochs``.
    - ``annealing_epochs``, ``annealing_strategy`` (``"cos"`` or ``"linear"``): how ``SWALR`` anneals to ``swa_lrs``.
    - ``avg_fn(averaged, current, n_averaged)``: the average's update; an equal-weight running mean by default.
    - ``device``: where the averaged copy lives (``None``: the module's device).

    A module with batch norm trains one epoch more: its running statistics are reset and recomputed by a pass over
    the training data with the averaged weights, forward only. One optimizer and at most one scheduler; not on
    sharded strategies.
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: Literal["cos", "linear"] = "cos",
        avg_fn: _AVG_FN | None = None,
        device: torch.device | str | None = _CPU,
    ) -> None:
        # Lightning's checks and messages, in its order.
        bad_int = isinstance(swa_epoch_start, int) and swa_epoch_start < 1
        if bad_int or (isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1):
            raise MisconfiguredValueError("swa_epoch_start should be a >0 integer or a float between 0 and 1.")
        message = "The `swa_lrs` should a positive float, or a list of positive floats"
        if not isinstance(swa_lrs, (float, list)):
            raise MisconfiguredTypeError(message)
        if isinstance(swa_lrs, float) and swa_lrs <= 0:
            raise MisconfiguredValueError(message)
        if isinstance(swa_lrs, list) and not all(lr > 0 and isinstance(lr, float) for lr in swa_lrs):
            raise MisconfiguredValueError(message)
        if avg_fn is not None and not callable(avg_fn):
            raise MisconfiguredTypeError("The `avg_fn` should be callable.")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise MisconfiguredTypeError(f"device is expected to be a torch.device or a str. Found {device}")
        # SWALR's own checks, which Lightning meets only at the epoch SWA starts: here before any work.
        if annealing_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {annealing_strategy}")
        if not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got {annealing_epochs}")
        self.n_averaged: Tensor | None = None
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn or self.avg_fn
        self._device = device
        self._model_contains_batch_norm: bool | None = None
        self._average_model: nn.Module | None = None
        self._initialized = False
        self._swa_scheduler: SWALR | None = None
        self._scheduler_state: dict[str, Any] | None = None
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self.momenta: dict[_BatchNorm, float | None] = {}
        self._max_epochs: int
        self._accumulate_grad_batches: int

    @property
    def swa_start(self) -> int:
        """The first averaged epoch, from 0."""
        return max(self._swa_epoch_start - 1, 0)

    @property
    def swa_end(self) -> int | float:
        """The last epoch of the fit (without the batch-norm epoch), from 0; infinite without an epoch limit."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        return any(isinstance(module, _BatchNorm) for module in pl_module.modules())

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.strategy.strategy_name == "fsdp":
            raise MisconfiguredNotImplementedError("SWA does not currently support sharded models.")
        self._average_model = deepcopy(pl_module)  # before the module moves to its device, as Lightning copies it

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if len(trainer.optimizers) != 1:
            raise MisconfiguredValueError("SWA currently works with 1 `optimizer`.")
        if len(trainer.lr_scheduler_configs) > 1:
            raise MisconfiguredValueError("SWA currently not supported for more than 1 `lr_scheduler`.")
        max_epochs = trainer.max_epochs
        if isinstance(self._swa_epoch_start, float):
            if max_epochs == -1:
                raise MisconfiguredValueError(
                    "SWA with `swa_epoch_start` as a float is not supported when `max_epochs=-1`. "
                    "Please provide `swa_epoch_start` as an integer."
                )
            self._swa_epoch_start = int(max_epochs * self._swa_epoch_start)
        self._model_contains_batch_norm = self.pl_module_contains_batch_norm(pl_module)
        self._max_epochs = max_epochs
        if self._model_contains_batch_norm and max_epochs != -1:
            trainer.fit_loop.max_epochs += 1  # the batch-norm epoch
        if self._scheduler_state is not None:
            # Resumed inside the window: the checkpoint's scheduler is SWALR's, rebuilt at the next epoch's start
            # (the trainer restores no scheduler into the cleared configs).
            trainer.lr_scheduler_configs.clear()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        epoch = trainer.current_epoch
        in_window = self.swa_start <= epoch <= self.swa_end
        if in_window and not self._initialized:
            self._start_averaging(trainer, pl_module)
        if in_window and epoch > self._latest_update_epoch:
            self.update_parameters(self._average_model, pl_module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch
        if self._max_epochs != -1 and epoch == self.swa_end + 1:  # the batch-norm epoch
            self.transfer_weights(self._average_model, pl_module)
            self.reset_batch_norm_and_save_state(pl_module)
            batches = trainer.num_training_batches
            if batches == float("inf"):
                raise MisconfiguredValueError("Iterable-style datasets are not supported")
            trainer.fit_loop._skip_backward = True
            # Every batch accumulates, as in Lightning, so only the epoch's last counts as a (logging) step.
            self._accumulate_grad_batches = trainer.accumulate_grad_batches
            trainer.accumulate_grad_batches = batches + 1

    def _start_averaging(self, trainer: Any, pl_module: Any) -> None:
        """The averaged copy onto its device, and ``SWALR`` in place of the fit's scheduler."""
        self._initialized = True
        self._average_model = self._average_model.to(self._device or pl_module.device)
        optimizer = trainer.optimizers[0]
        if isinstance(self._swa_lrs, float):
            self._swa_lrs = [self._swa_lrs] * len(optimizer.param_groups)
        for lr, group in zip(self._swa_lrs, optimizer.param_groups, strict=False):
            group["initial_lr"] = lr
        self._swa_scheduler = SWALR(
            optimizer,
            swa_lr=self._swa_lrs,
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,
            last_epoch=trainer.max_epochs if self._annealing_strategy == "cos" else -1,
        )
        if self._scheduler_state is not None:
            self._swa_scheduler.load_state_dict(self._scheduler_state)
        elif trainer.current_epoch != self.swa_start and trainer.is_global_zero:
            warnings.warn(
                "SWA is initializing after swa_start without any checkpoint data. "
                "This may be caused by loading a checkpoint from an older version of PyTorch Lightning.",
                stacklevel=2,
            )
        config = LRSchedulerConfig(self._swa_scheduler)
        configs = trainer.lr_scheduler_configs
        if configs:
            replaced = configs[0]
            if (replaced.interval != "epoch" or replaced.frequency != 1) and trainer.is_global_zero:
                warnings.warn(f"SWA is currently only supported every epoch. Found {replaced}", stacklevel=2)
            if trainer.is_global_zero:
                log.info(
                    f"Swapping scheduler `{type(replaced.scheduler).__name__}` for `{type(config.scheduler).__name__}`"
                )
            configs[0] = config
        else:
            configs.append(config)
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=pl_module.device)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        trainer.fit_loop._skip_backward = False

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # current_epoch already counts the last epoch here.
        finished = trainer.current_epoch - 1
        if self._model_contains_batch_norm and self._max_epochs != -1 and finished == self.swa_end + 1:
            trainer.accumulate_grad_batches = self._accumulate_grad_batches
            trainer.fit_loop.max_epochs -= 1
            self.reset_momenta()
        elif (finished == self.swa_end or self._max_epochs == -1) and self._average_model is not None:
            self.transfer_weights(self._average_model, pl_module)

    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        """Copy the parameters (not the buffers) of ``src_pl_module`` into ``dst_pl_module``."""
        for source, target in zip(src_pl_module.parameters(), dst_pl_module.parameters(), strict=False):
            target.detach().copy_(source.to(target.device))

    def reset_batch_norm_and_save_state(self, pl_module: nn.Module) -> None:
        """Fresh running statistics, accumulated as a plain mean (``momentum=None``) over the coming pass, as torch's
        ``swa_utils.update_bn`` does; each layer's momentum is kept in ``momenta``."""
        self.momenta = {}
        for module in pl_module.modules():
            if not isinstance(module, _BatchNorm):
                continue
            module.running_mean = torch.zeros_like(module.running_mean)
            module.running_var = torch.ones_like(module.running_var)
            self.momenta[module] = module.momentum
            module.momentum = None
            module.num_batches_tracked *= 0

    def reset_momenta(self) -> None:
        """Give each batch norm layer back the momentum ``reset_batch_norm_and_save_state`` kept."""
        for module, momentum in self.momenta.items():
            module.momentum = momentum

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: Tensor, avg_fn: _AVG_FN) -> None:
        """Fold ``model``'s parameters into ``average_model`` (the first are copied) and count them in
        ``n_averaged``."""
        for averaged, current in zip(average_model.parameters(), model.parameters(), strict=False):
            device = averaged.device
            averaged, current = averaged.detach(), current.detach().to(device)
            averaged.copy_(current if n_averaged == 0 else avg_fn(averaged, current, n_averaged.to(device)))
        n_averaged += 1

    @staticmethod
    def avg_fn(averaged_model_parameter: Tensor, model_parameter: Tensor, num_averaged: Tensor) -> Tensor:
        """The equal-weight running mean."""
        return averaged_model_parameter + (model_parameter - averaged_model_parameter) / (num_averaged + 1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "n_averaged": 0 if self.n_averaged is None else self.n_averaged.item(),
            "latest_update_epoch": self._latest_update_epoch,
            "scheduler_state": None if self._swa_scheduler is None else self._swa_scheduler.state_dict(),
            "average_model_state": None if self._average_model is None else self._average_model.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._init_n_averaged = state_dict["n_averaged"]
        self._latest_update_epoch = state_dict["latest_update_epoch"]
        self._scheduler_state = state_dict["scheduler_state"]
        if self._average_model is not None:
            self._average_model.load_state_dict(state_dict["average_model_state"])
