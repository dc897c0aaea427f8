"""``DDPStrategy``: DistributedDataParallel around the module while ``fit`` trains.

DDP reduces gradients only for backward passes that follow its own ``forward``, so each training step runs
inside it (Lightning's forward redirection). Evaluation steps call the module directly: they need no gradient
reduction, and so they run no collective per batch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from gpulayer.trainer.strategies.strategy import DEFAULT_TIMEOUT, Strategy, as_timeout, check_async_save


class StepRunner(nn.Module):
    """What DDP (and a sharding strategy's root) wraps: the module, and a forward that runs the step it is handed."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, step: Any, *args: Any) -> Any:
        return step(*args)


# Lightning's start methods but "forkserver", which GPUlayer does not adopt.
START_METHODS = ("popen", "spawn", "fork")


class DDPStrategy(Strategy):
    """DistributedDataParallel with the options users tune; the rest of ``ddp_kwargs`` goes to DDP as is.

    ``timeout`` (a ``timedelta`` or seconds) bounds every collective: a rank that stops answering ends the job
    after it. The default is Lightning's, 30 minutes; ``None`` keeps torch's (30 minutes on gloo, 10 on NCCL). It
    applies to the process group the Trainer creates, not to one that already exists. DDP broadcasts rank 0's
    parameters and buffers when it wraps the module, then all-reduces gradients in backward. ``async_save=True`` (not
    in Lightning): rank 0 writes the checkpoint callbacks' files behind training during ``fit``. ``start_method``
    (Lightning's): ``"popen"`` runs the script on every rank (``gpulayer launch``); ``"spawn"`` and ``"fork"`` run
    each entry point in processes this one starts (``started_call.py``), for notebooks and functions.
    """

    strategy_name = "ddp"
    is_distributed = True

    def __init__(
        self,
        *,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        async_save: bool = False,
        start_method: str = "popen",
        **ddp_kwargs: Any,
    ) -> None:
        super().__init__()
        if start_method not in START_METHODS:
            accepted = ", ".join(map(repr, START_METHODS))
            raise ValueError(f"DDPStrategy(start_method={start_method!r}): accepted values are {accepted}")
        self.async_save = check_async_save(async_save, "DDPStrategy")
        for name, value in (
            ("find_unused_parameters", find_unused_parameters),
            ("static_graph", static_graph),
            ("gradient_as_bucket_view", gradient_as_bucket_view),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"DDPStrategy({name}={value!r}): accepted values are True or False")
        timeout = as_timeout(timeout, "DDPStrategy")
        reserved = {"module", "device_ids", "output_device", "process_group"} & ddp_kwargs.keys()
        if reserved:
            raise ValueError(f"DDPStrategy({', '.join(sorted(reserved))}=...): the Trainer sets these itself")
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.timeout: timedelta | None = timeout
        self.ddp_kwargs = ddp_kwargs
        self.start_method = start_method
        self._wrapped: DistributedDataParallel | None = None  # while fit trains on several ranks
        self._batchnorms: dict[str, nn.Module] = {}  # the batch norms sync_batchnorm replaced, by name

    def attach(self, runtime: Any, device: torch.device, precision: Any, sync_batchnorm: bool = False) -> None:
        if sync_batchnorm and device.type != "cuda":
            raise ValueError(
                f"sync_batchnorm=True with DDP on {device.type}: torch's DDP runs SyncBatchNorm on GPUs only (Lightning "
                "fails the same way when it wraps the model); use accelerator='gpu' or sync_batchnorm=False"
            )
        super().attach(runtime, device, precision, sync_batchnorm)

    def ddp_options(self) -> dict[str, Any]:
        return {
            "find_unused_parameters": self.find_unused_parameters,
            "static_graph": self.static_graph,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            **self.ddp_kwargs,
        }

    @property
    def model(self) -> nn.Module | None:
        return self._wrapped if self._wrapped is not None else self.lightning_module

    @property
    def gradient_sync(self) -> str | None:  # type: ignore[override]
        return "DDP's gradient all-reduce" if self._wrapped is not None else None

    def setup_training(self) -> None:
        """Wrap the module before ``configure_optimizers``, as Lightning does (on one rank there is nothing to do);
        under ``sync_batchnorm`` its batch norms become ``SyncBatchNorm`` first."""
        if self.sync_batchnorm:
            self._batchnorms = _to_sync_batchnorm(self.lightning_module)
        if self.world_size > 1:
            device = self.root_device
            self._wrapped = DistributedDataParallel(
                StepRunner(self.lightning_module),
                device_ids=[device.index] if device.type == "cuda" else None,
                **self.ddp_options(),
            )

    def training_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``step`` inside DDP's forward, so the backward of its loss reduces gradients across ranks."""
        return step if self._wrapped is None else functools.partial(self._wrapped, step)

    def manual_training_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """``step`` inside DDP's forward. Its backward passes already ran (``manual_backward`` readies the reducer
        for each), so DDP's forward must not ready it again on the way out for a backward that never comes: its
        gradient sync is off from the step's end to the forward's (Lightning's ``_DDPForwardRedirection``)."""
        wrapped = self._wrapped
        if wrapped is None:
            return step

        def step_then_hold_sync(*args: Any) -> Any:
            output = step(*args)
            wrapped.require_backward_grad_sync = False
            return output

        def run(*args: Any) -> Any:
            try:
                return wrapped(step_then_hold_sync, *args)
            finally:
                wrapped.require_backward_grad_sync = True

        return run

    def prepare_manual_backward(self, loss: torch.Tensor) -> None:
        """Ready DDP's reducer for one more backward of the same forward (the step): under manual optimization a
        step may call ``manual_backward`` several times, as a GAN's does (Lightning's ``DDPStrategy.pre_backward``)."""
        wrapped = self._wrapped
        if wrapped is None or not (torch.is_grad_enabled() and wrapped.require_backward_grad_sync):
            return
        wrapped.require_forward_param_sync = True
        unused = list(_find_tensors(loss)) if self.find_unused_parameters and not self.static_graph else []
        wrapped.reducer._rebuild_buckets()
        wrapped.reducer.prepare_for_backward(unused)

    def no_sync(self) -> AbstractContextManager[None]:
        """A micro-batch that does not step: its backward keeps gradients local (no all-reduce)."""
        return contextlib.nullcontext() if self._wrapped is None else self._wrapped.no_sync()

    def teardown(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self._wrapped = None  # its gradient buckets are freed once the stage ends
        _restore_batchnorms(self.lightning_module, self._batchnorms)
        self._batchnorms = {}
        super().teardown(optimizers)

    def __repr__(self) -> str:
        options = {k: v for k, v in self.ddp_options().items() if v} | (
            {"timeout": self.timeout} if self.timeout else {}
        )
        if self.async_save:
            options["async_save"] = True
        if self.start_method != "popen":
            options["start_method"] = self.start_method
        return f"DDPStrategy({', '.join(f'{k}={v!r}' for k, v in options.items())})"


def _to_sync_batchnorm(module: nn.Module) -> dict[str, nn.Module]:
    """Replace ``module``'s batch norms with ``SyncBatchNorm`` in place (sharing their parameters and running
    statistics); returns the replaced modules by name."""
    before = dict(module.named_modules())
    nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return {
        name: before[name]
        for name, converted in module.named_modules()
        if isinstance(converted, nn.SyncBatchNorm) and before.get(name) is not converted
    }


def _restore_batchnorms(module: nn.Module | None, originals: dict[str, nn.Module]) -> None:
    """Put the batch norms ``_to_sync_batchnorm`` replaced back, in the mode their replacements ended in
    (Lightning reverts them after fit too); they hold the trained values, which the two shared."""
    for name, original in originals.items():
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        original.train(getattr(parent, child).training)
        setattr(parent, child, original)
