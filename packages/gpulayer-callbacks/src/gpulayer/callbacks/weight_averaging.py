"""``WeightAveraging`` and ``EMAWeightAveraging``: an averaged copy of the module, updated after optimizer steps,
swapped in for validation and copied into the module when training ends, as Lightning 2.6
(lightning/pytorch/callbacks/weight_averaging.py) does.

The copy is torch's ``AveragedModel``, so a checkpoint holds what Lightning's holds: ``state_dict`` the averaged
weights, ``current_model_state`` the module's own, ``averaging_state`` the count of updates. ``EMAWeightAveraging``
updates it without ``AveragedModel.update_parameters``' per-tensor Python and host read of the count, in a few
kernels per step whose results are Lightning's bit for bit (``_ExactEMA``).
"""

from __future__ import annotations

import itertools
import logging
import warnings
from copy import deepcopy
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from gpulayer.trainer import Callback, Module
from gpulayer.trainer.core.hooks import is_overridden

log = logging.getLogger(__name__)


class WeightAveraging(Callback):
    """Keeps ``AveragedModel(pl_module, device, use_buffers=use_buffers, **kwargs)`` (``avg_fn`` or
    ``multi_avg_fn`` among ``kwargs``; equal weights, SWA, without either), made when ``fit`` sets up and updated
    after each optimizer step and training epoch for which ``should_update`` is true (by default every step).

    ``use_buffers`` defaults to True, unlike ``AveragedModel``'s: buffers are averaged too; with False they are
    copied from the module at each update. ``device`` None: the module's device once the strategy has placed it
    (Lightning's is the module's device at ``setup``, the CPU before a GPU run places it). A module overriding
    ``configure_model`` has it called first, with Lightning's warning: the copy is never sharded.
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any) -> None:
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        # global_step at the last update after a step: the first check follows the first optimizer step.
        self._latest_update_step = 0
        # The epoch after which the copy was last updated; -1 lets the first epoch's end update it.
        self._latest_update_epoch = -1

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update after the optimizer step ``step_idx`` or the epoch ``epoch_idx`` (both from 0; the
        other is None). Override to choose; the default updates after every step."""
        return step_idx is not None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if is_overridden("configure_model", pl_module, Module):
            if trainer.is_global_zero:  # Lightning's message, word for word
                warnings.warn(
                    "You're using the WeightAveraging callback with a model that overrides the configure_model "
                    "callback. WeightAveraging doesn't support sharding model layers, so you may run out of memory.",
                    UserWarning,
                    stacklevel=2,
                )
            pl_module.configure_model()
        device = self._device or pl_module.device
        self._average_model = AveragedModel(pl_module, device=device, use_buffers=self._use_buffers, **self._kwargs)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self._device is None:  # the strategy has now placed the module
            self._average_model.to(pl_module.device)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._update_average(pl_module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._update_average(pl_module)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for average, current in _pairs(self._average_model.module, pl_module):
            current.data.copy_(average.data)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._average_model is not None:
            self._swap(pl_module)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._average_model is not None:
            self._swap(pl_module)

    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = state_dict["latest_update_step"]

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """The module's ``state_dict`` moves to ``current_model_state``; ``state_dict`` becomes the averaged one,
        and the copy's other state (``n_averaged``) goes to ``averaging_state``."""
        if self._average_model is None:
            if trainer.is_global_zero:
                log.info(
                    "You're using the WeightAveraging callback, but saving a checkpoint outside the 'fit' stage. The "
                    "state of the WeightAveraging callback won't be saved in the checkpoint. If training has "
                    "finished, the average model parameters will be saved to the state_dict in the checkpoint."
                )
            return
        state = self._averaged_state()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {name[7:]: value for name, value in state.items() if name.startswith("module.")}
        checkpoint["averaging_state"] = {name: value for name, value in state.items() if not name.startswith("module.")}

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Called after the module loaded ``state_dict`` (the averaged weights): the copy takes them, and the
        module its own from ``current_model_state``. A checkpoint written without weight averaging starts both
        from ``state_dict``."""
        if self._average_model is None:
            if trainer.is_global_zero:
                warnings.warn(
                    "You're using the WeightAveraging callback, but loading a checkpoint outside the 'fit' stage. The "
                    "WeightAveraging state cannot be restored. If you're using the checkpoint for prediction or "
                    "testing, you can ignore this warning. To disable the warning, remove the WeightAveraging "
                    "callback.",
                    UserWarning,
                    stacklevel=2,
                )
        elif "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            if trainer.is_global_zero:
                log.info("Found current_model_state in the checkpoint. This will be used to initialize the model.")
            state = {"module." + name: value for name, value in checkpoint["state_dict"].items()}
            self._average_model.load_state_dict(state | checkpoint["averaging_state"])
            pl_module.load_state_dict(checkpoint["current_model_state"])
        else:
            if trainer.is_global_zero:
                warnings.warn(
                    "The checkpoint was not created with WeightAveraging. Both the current and the average model will "
                    "be initialized with state_dict.",
                    UserWarning,
                    stacklevel=2,
                )
            self._average_model.module.load_state_dict(deepcopy(checkpoint["state_dict"]), strict=False)

    def _update_average(self, pl_module: Any) -> None:
        self._average_model.update_parameters(pl_module)

    def _averaged_state(self) -> dict[str, Any]:
        return self._average_model.state_dict()

    def _swap(self, pl_module: Any) -> None:
        """Exchange the values of the copy's parameters and buffers with the module's, in place."""
        for average, current in _pairs(self._average_model.module, pl_module):
            kept = average.data.clone()
            average.data.copy_(current.data)
            current.data.copy_(kept)


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average, ``decay * average + (1 - decay) * current`` (torch's ``get_ema_avg_fn``),
    updated after the optimizer steps ``step_idx`` with ``step_idx % update_every_n_steps == 0`` from
    ``update_starting_at_step`` on, and, given ``update_starting_at_epoch``, also after each epoch from that one on.
    The first update copies the module's weights, as ``AveragedModel`` does.

    Each update runs four kernels for all the tensors of one dtype and device, whatever their number, and reads
    nothing back from the device; its results equal Lightning's bit for bit.
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        # As Lightning: a decay outside [0, 1] raises torch's ValueError, an avg_fn among kwargs a TypeError.
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self._decay = decay
        self._ema: _ExactEMA | None = None
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        return (
            epoch_idx is not None
            and self.update_starting_at_epoch is not None
            and (epoch_idx >= self.update_starting_at_epoch)
        )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_fit_start(trainer, pl_module)
        self._ema = _ExactEMA(self._average_model, pl_module, self._decay)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._ema.write_count()
        super().on_train_end(trainer, pl_module)

    def _update_average(self, pl_module: Any) -> None:
        self._ema.update()

    def _averaged_state(self) -> dict[str, Any]:
        if self._ema is not None:
            self._ema.write_count()
        return super()._averaged_state()


class _ExactEMA:
    """``average.update_parameters(module)`` for ``avg_fn=get_ema_avg_fn(decay)``, with the same roundings.

    torch computes ``decay * a + (1 - decay) * c`` per tensor: two products and a sum, each rounded. Here the
    averaged copy's floating tensors of one dtype and device are views into one flat tensor, and an update is four
    kernels over it: the module's tensors gathered (``cat``), the two products, then the sum; the same three
    roundings per element. Tensors of other dtypes (BatchNorm's ``num_batches_tracked``) take
    torch's expression as it is. The count of updates is kept in Python, so choosing between the first update's
    copy and an average reads nothing from the device; ``n_averaged`` is written back before the copy's state is
    read.
    """

    def __init__(self, average: AveragedModel, module: torch.nn.Module, decay: float) -> None:
        self._average, self._decay = average, decay
        # The factors as CPU scalars made once: a kernel reads them as it reads a Python number, without
        # wrapping one at each call.
        self._factors = (torch.tensor(decay, dtype=torch.float64), torch.tensor(1 - decay, dtype=torch.float64))
        self._count = int(average.n_averaged)  # once per fit: 0, or what a checkpoint restored
        averaged = list(average.module.parameters())
        # The module's parameters as objects (as its optimizer holds them), its buffers by owner and name, read
        # at each update: a buffer the module assigns anew is still found.
        self._parameters = list(module.parameters())
        self._buffer_slots = [_owner_and_name(module, name) for name, _ in module.named_buffers()]
        self._buffers_averaged = average.use_buffers
        if average.use_buffers:
            averaged += list(average.module.buffers())
        else:
            self._copied_buffers = list(average.module.buffers())
        groups: dict[tuple, list[int]] = {}
        self._others: list[int] = []
        for index, (tensor, current) in enumerate(zip(averaged, self._current(), strict=False)):
            if tensor.is_floating_point():
                groups.setdefault((tensor.dtype, tensor.device, current.dtype, current.device), []).append(index)
            else:
                self._others.append(index)
        self._averaged = averaged
        self._groups = [_FlatGroup(indices, [averaged[i] for i in indices]) for indices in groups.values()]

    def _current(self) -> list[torch.Tensor]:
        """The module's tensors, in ``update_parameters``' order."""
        current = list(self._parameters)
        if self._buffers_averaged:
            current += [getattr(owner, name) for owner, name in self._buffer_slots]
        return current

    def update(self) -> None:
        current = self._current()
        decay, first = self._decay, self._count == 0
        for group in self._groups:
            gathered = group.gather(current)
            if first:
                group.flat.copy_(gathered)
            else:
                gathered.mul_(self._factors[1])
                group.flat.mul_(self._factors[0])
                group.flat.add_(gathered)
        for index in self._others:
            average = self._averaged[index].detach()
            tensor = current[index].detach().to(average.device)
            average.copy_(tensor if first else decay * average + (1 - decay) * tensor)
        if not self._buffers_averaged:
            buffers = [getattr(owner, name) for owner, name in self._buffer_slots]
            for average, tensor in zip(self._copied_buffers, buffers, strict=False):
                average.copy_(tensor)
        self._count += 1

    def write_count(self) -> None:
        self._average.n_averaged.fill_(self._count)


class _FlatGroup:
    """Averaged tensors of one dtype and device made views into one flat tensor, and what gathers the module's
    matching tensors: flat views of them, made again when a tensor's storage changed (``param.data = ...``, a
    buffer assigned anew), and a buffer to ``cat`` them into."""

    def __init__(self, indices: list[int], averaged: list[torch.Tensor]) -> None:
        self.indices = indices
        with torch.no_grad():
            self.flat = torch.cat([tensor.reshape(-1) for tensor in averaged])
            offset = 0
            for tensor in averaged:
                size = tensor.numel()
                tensor.data = self.flat[offset : offset + size].view(tensor.shape)
                offset += size
        self._pointers: list[int] = []
        self._views: list[torch.Tensor] | None = None  # None: a tensor is not contiguous, flattened at each update
        self._scratch: torch.Tensor | None = None
        self._moves = False  # the module's tensors are on another device than the copy

    def gather(self, current: list[torch.Tensor]) -> torch.Tensor:
        """The module's tensors of this group, flat, on the averaged copy's device."""
        tensors = [current[i] for i in self.indices]
        pointers = [tensor.data_ptr() for tensor in tensors]
        if pointers != self._pointers:
            self._pointers = pointers
            contiguous = all(tensor.is_contiguous() for tensor in tensors)
            self._views = [tensor.detach().view(-1) for tensor in tensors] if contiguous else None
            self._scratch = torch.empty(self.flat.numel(), dtype=tensors[0].dtype, device=tensors[0].device)
            self._moves = self._scratch.device != self.flat.device
        views = self._views if self._views is not None else [tensor.detach().reshape(-1) for tensor in tensors]
        gathered = torch.cat(views, out=self._scratch)
        return gathered.to(self.flat.device) if self._moves else gathered


def _owner_and_name(module: torch.nn.Module, dotted: str) -> tuple[torch.nn.Module, str]:
    owner, _, name = dotted.rpartition(".")
    return module.get_submodule(owner), name


def _pairs(average: torch.nn.Module, module: torch.nn.Module) -> zip:
    """The copy's parameters and buffers beside the module's, by position, as Lightning pairs them."""
    return zip(
        itertools.chain(average.parameters(), average.buffers()),
        itertools.chain(module.parameters(), module.buffers()),
        strict=False,
    )
