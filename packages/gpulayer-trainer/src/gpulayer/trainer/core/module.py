"""``Module``: Lightning's ``LightningModule`` surface on an ``nn.Module`` — steps, hooks, optimization; ``self.log``
and export are its mixins' (``metric_logging.py``, ``export.py``)."""

from __future__ import annotations

import contextlib
import numbers
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gpulayer.trainer.batch import map_tensors
from gpulayer.trainer.core.datamodule import datamodule_overrides
from gpulayer.trainer.core.export import ExportMixin
from gpulayer.trainer.core.hooks import _call_step
from gpulayer.trainer.core.hyperparameters import HyperparametersMixin
from gpulayer.trainer.core.metric_logging import MetricLoggingMixin
from gpulayer.trainer.core.model_hooks import DataHooks, ModelHooks
from gpulayer.trainer.exceptions import MisconfiguredValueError, PossibleUserWarning

if TYPE_CHECKING:
    from gpulayer.trainer.loops.manual_optimization import ManualOptimization


class Module(ModelHooks, DataHooks, MetricLoggingMixin, ExportMixin, HyperparametersMixin, nn.Module):
    """Subclass it as you would ``LightningModule``: ``training_step`` and ``configure_optimizers`` at least."""

    # Properties TorchScript must not compile when the module is scripted (they read the Trainer), as in Lightning.
    __jit_unused_properties__ = (
        "trainer",
        "device",
        "dtype",
        "on_gpu",
        "current_epoch",
        "global_step",
        "global_rank",
        "local_rank",
        "logger",
        "loggers",
        "example_input_array",
        "hparams",
        "hparams_initial",
        "strict_loading",
    )
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Any = None
        self._current_fx_name: str | None = None
        self.automatic_optimization = True
        self._example_input_array: Any = None
        self._requires_grad_before_toggle: dict[nn.Parameter, bool] = {}
        self._strict_loading: bool | None = None  # None: never set, so load_from_checkpoint(strict=...) may differ

    def __getstate__(self) -> dict[str, Any]:
        """The module without its Trainer, as Lightning's ``LightningModule.__getstate__``: a trained module pickles
        (``torch.save``, ``copy.deepcopy``, a multiprocessing queue) and comes back detached."""
        state = dict(self.__dict__)
        state["_trainer"] = None
        return state

    # ---- what the trainer exposes ------------------------------------------------------------------------------
    @property
    def trainer(self) -> Any:
        if self._trainer is None and not self._jit_is_scripting:
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a Trainer")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu") if self._trainer is None else self._trainer.strategy.root_device

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:
        for tensor in self.parameters():
            return tensor.dtype
        return torch.get_default_dtype()

    @property
    def strict_loading(self) -> bool:
        """Whether a checkpoint's state_dict must match the module's keys exactly; unset or None means it must.

        Set it False in ``__init__`` for a module that adds or drops parameters (Lightning's).
        """
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, strict_loading: bool | None) -> None:
        self._strict_loading = strict_loading

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def logger(self) -> Any:
        """The Trainer's first logger, or None."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Any]:
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def example_input_array(self) -> Any:
        """A sample input, for your own tracing or export (GPUlayer prints no model summary that would use it)."""
        return self._example_input_array

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self._example_input_array = example

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every tensor in ``data`` (or ``data``, a number) gathered from every rank, stacked along a new first
        dimension (``trainer.strategy.all_gather``; one process: unchanged)."""
        strategy = self.trainer.strategy
        if isinstance(data, numbers.Number):
            data = torch.tensor(data, device=self.device)
        return map_tensors(data, lambda tensor: strategy.all_gather(tensor, group, sync_grads))

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizer (one), or the list of them; under manual optimization (``use_pl_optimizer``) the
        ``ManualOptimizer`` wrappers whose ``step()`` counts ``global_step``."""
        optimizers = self.trainer.optimizers
        if use_pl_optimizer and not self.automatic_optimization:
            optimization = self._manual_optimization()
            if optimization is not None:
                optimizers = optimization.manual_optimizers
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward of ``loss`` under manual optimization: scaled under fp16 AMP, through the ``on_before_backward``,
        ``backward`` and ``on_after_backward`` hooks; ``args`` and ``kwargs`` go to ``loss.backward``."""
        self._require_manual_optimization("manual_backward")
        optimization = self._manual_optimization()
        if optimization is None:
            raise RuntimeError("manual_backward: call it in training_step, while Trainer.fit trains the module")
        optimization.backward(loss, *args, **kwargs)

    def _manual_optimization(self) -> ManualOptimization | None:
        """The fit loop's ``ManualOptimization`` while ``fit`` trains with it, else None: the one place the module
        reaches the running optimization (``trainer.fit_loop.optimization``). Told apart by its ``manual`` flag: the
        class cannot be imported here (its module imports this one), and an import per call costs per step."""
        optimization = self.trainer.fit_loop.optimization
        return optimization if optimization is not None and optimization.manual else None

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Only ``optimizer``'s parameters require gradients until ``untoggle_optimizer`` (parameters that did not
        require them before keep not requiring them)."""
        requires_grad = {}
        for each in self.trainer.optimizers:
            for group in each.param_groups:
                for parameter in group["params"]:
                    if parameter not in requires_grad:
                        requires_grad[parameter] = parameter.requires_grad
                        parameter.requires_grad = False
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                parameter.requires_grad = requires_grad[parameter]
        self._requires_grad_before_toggle = requires_grad

    def untoggle_optimizer(self, optimizer: Any) -> None:
        """Give the other optimizers' parameters back the ``requires_grad`` they had at ``toggle_optimizer``."""
        raw = getattr(optimizer, "optimizer", optimizer)
        before = self._requires_grad_before_toggle
        for each in self.trainer.optimizers:
            if each is not raw:
                for group in each.param_groups:
                    for parameter in group["params"]:
                        if parameter in before:
                            parameter.requires_grad = before[parameter]
        self._requires_grad_before_toggle = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Any) -> Iterator[None]:
        """``toggle_optimizer`` for the block, ``untoggle_optimizer`` after it."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def _require_manual_optimization(self, method: str) -> None:
        if self.automatic_optimization:
            raise MisconfiguredValueError(
                f"{method}: set self.automatic_optimization = False to use it; under automatic optimization the "
                "Trainer runs backward and the optimizer steps itself"
            )

    def lr_schedulers(self) -> Any:
        """The scheduler (one), the list of them, or None."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self._trainer is None or self._trainer.is_global_zero:
            print(*args, **kwargs)

    # ---- steps and configuration (override these) ----------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__qualname__}.training_step must be implemented to fit")

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        pass

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        pass

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        batch = kwargs.get("batch", args[0] if args else None)
        return self(batch)

    def configure_optimizers(self) -> Any:
        return None

    def configure_callbacks(self) -> Any:
        return []

    def configure_model(self) -> None:
        pass

    # ---- the optimization step, as Lightning splits it ------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        loss.backward(*args, **kwargs)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        self.clip_gradients(
            optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm
        )

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the optimizer's gradients by total 2-norm or by value; values must agree with the Trainer's."""
        trainer_val, trainer_algorithm = self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm
        if gradient_clip_val is None:
            gradient_clip_val = trainer_val or 0.0
        elif trainer_val is not None and trainer_val != gradient_clip_val:
            raise MisconfiguredValueError(
                f"clip_gradients(gradient_clip_val={gradient_clip_val!r}) conflicts with "
                f"Trainer(gradient_clip_val={trainer_val!r}); set only one of them"
            )
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = trainer_algorithm or "norm"
        else:
            gradient_clip_algorithm = gradient_clip_algorithm.lower()
            if trainer_algorithm is not None and trainer_algorithm != gradient_clip_algorithm:
                raise MisconfiguredValueError(
                    f"clip_gradients(gradient_clip_algorithm={gradient_clip_algorithm!r}) conflicts with "
                    f"Trainer(gradient_clip_algorithm={trainer_algorithm!r}); set only one of them"
                )
        if gradient_clip_algorithm not in ("norm", "value"):
            raise MisconfiguredValueError(
                f"gradient_clip_algorithm={gradient_clip_algorithm!r}: accepted values are 'norm', 'value'"
            )
        if gradient_clip_val <= 0:
            return
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            nn.utils.clip_grad_value_(parameters, gradient_clip_val)
        else:
            nn.utils.clip_grad_norm_(parameters, gradient_clip_val)

    # ---- model modes around evaluation ---------------------------------------------------------------------------
    def on_validation_model_zero_grad(self) -> None:
        self.zero_grad()

    def on_validation_model_eval(self) -> None:
        self.trainer.lightning_module.eval()

    def on_validation_model_train(self) -> None:
        self.trainer.lightning_module.train()

    def on_test_model_eval(self) -> None:
        self.trainer.lightning_module.eval()

    def on_test_model_train(self) -> None:
        self.trainer.lightning_module.train()

    def on_predict_model_eval(self) -> None:
        self.trainer.lightning_module.eval()

    @classmethod
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike,
        map_location: Any = None,
        hparams_file: str | None = None,
        strict: bool | None = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Module:
        """Rebuild the module from a checkpoint's hyperparameters (``kwargs`` override them) and load its weights.

        Loads with ``weights_only=True``: a file holding anything but tensors and plain values is refused unless
        you pass ``weights_only=False`` for a file you trust.
        """
        if hparams_file is not None:
            raise NotImplementedError(
                "load_from_checkpoint(hparams_file=...) is not supported; pass overrides as kwargs"
            )
        from gpulayer.trainer.core.saving import load_module

        return load_module(cls, checkpoint_path, map_location, strict, weights_only, **kwargs)

    # ---- what Lightning's loggers call (TensorBoardLogger.log_graph) --------------------------------------------------
    def _on_before_batch_transfer(self, batch: Any, dataloader_idx: int = 0) -> Any:
        """Lightning's: ``on_before_batch_transfer`` of the stage (the DataModule's where it overrides it)."""
        return self._call_batch_hook("on_before_batch_transfer", batch, dataloader_idx)

    def _apply_batch_transfer_handler(
        self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0
    ) -> Any:
        """Lightning's: ``batch`` onto ``device`` (the module's) through the stage's transfer hooks."""
        batch = self._call_batch_hook("transfer_batch_to_device", batch, device or self.device, dataloader_idx)
        return self._call_batch_hook("on_after_batch_transfer", batch, dataloader_idx)

    def _call_batch_hook(self, name: str, *args: Any) -> Any:
        """A batch hook as a stage calls it: the DataModule's where it overrides it, else the module's, recorded as
        the running hook for ``self.log``."""
        datamodule = self._trainer.datamodule if self._trainer is not None else None
        if datamodule_overrides(datamodule, name):
            return getattr(datamodule, name)(*args)
        return _call_step(self, self.__dict__, name, *args)

    # ---- conveniences ----------------------------------------------------------------------------------------------
    def freeze(self) -> Module:
        for parameter in self.parameters():
            parameter.requires_grad = False
        return self.eval()

    def unfreeze(self) -> Module:
        for parameter in self.parameters():
            parameter.requires_grad = True
        return self.train()


def warn_if_modules_in_eval_mode(module: Module, is_global_zero: bool) -> None:
    """Lightning's ``PossibleUserWarning`` (global rank 0) when training starts with submodules in eval mode: the
    Trainer does not call ``train()`` for the user (``_FitLoop._warn_if_modules_in_eval_mode``)."""
    in_eval = [name for name, submodule in module.named_modules() if not submodule.training]
    if in_eval and is_global_zero:
        warnings.warn(
            f"Found {len(in_eval)} module(s) in eval mode at the start of training. This may lead to unexpected "
            "behavior during training. If this is intentional, you can ignore this warning.",
            PossibleUserWarning,
            stacklevel=3,
        )
