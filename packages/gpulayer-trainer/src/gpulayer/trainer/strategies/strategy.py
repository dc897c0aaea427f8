"""``Strategy``: the one contract by which the module trains on this job's processes, and ``SingleDeviceStrategy``.

One process (``SingleDeviceStrategy``), DDP (``ddp.py``) and FSDP (gpulayer-fsdp) each implement it. The Trainer
hands a strategy its ``Runtime``, device and precision once (``attach``), and the module for each stage
(``connect``); the loops then ask it to place the module, to run steps, to keep gradients local, and to read and
write the module's and optimizers' state. Users reach it as ``trainer.strategy``, with Lightning 2.6's names for
what they call on it (``lightning/pytorch/strategies/strategy.py``): ``barrier``, ``broadcast``, ``reduce``,
``all_gather``, ``reduce_boolean_decision``, ``root_device``, ``is_global_zero``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gpulayer.trainer.batch import map_tensors
from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.background_writes import BackgroundWrites
from gpulayer.trainer.core.optimizers import LRSchedulerConfig, parse_optimizers

if TYPE_CHECKING:
    from gpulayer.runtime import Runtime
    from gpulayer.trainer.strategies.precision import Precision

DEFAULT_TIMEOUT = timedelta(minutes=30)  # Lightning's default_pg_timeout
_REDUCE_OPS = {"sum": "sum", "mean": "mean", "avg": "mean", "max": "max", "min": "min"}


class Strategy:
    """How the module trains on this job's processes: where it lives, how a step runs, how ranks talk.

    A subclass overrides what differs from one process: ``setup_module`` (place or shard the module),
    ``setup_training`` (wrap it while ``fit`` trains), ``training_step_runner``/``evaluation_step_runner`` (run a
    step where the wrapper's hooks see it), ``no_sync``, ``teardown``, and the state methods. ``timeout`` bounds
    every collective of the process group the Trainer creates.
    """

    strategy_name = ""
    timeout: timedelta | None = DEFAULT_TIMEOUT
    # Whether evaluation may run under torch.inference_mode (a sharded module gathers parameters in each step:
    # tensors made under inference_mode could not serve a later training step).
    evaluates_in_inference_mode = True
    gradient_sync: str | None = None  # backward's gradient collective, named when it fails
    # Whether loaders get distributed samplers (use_distributed_sampler): DDP and FSDP, one process included.
    is_distributed = False
    # How its ranks start (Lightning's ``start_method``): "popen" runs the script on each (a launcher, or
    # ``gpulayer launch`` for a plain ``python train.py``); "spawn" and "fork" start them per entry point.
    start_method = "popen"

    def __init__(self) -> None:
        self.async_save = False  # a full-state checkpoint callback's saves are written behind training (fit only)
        self._writing_behind = False  # while fit runs with async_save, on every rank
        self._background_writes: BackgroundWrites | None = None  # then, on global rank 0
        self.runtime: Runtime | None = None
        self.precision_plugin: Precision | None = None
        self.root_device = torch.device("cpu")  # the device this process trains on (set by ``attach``)
        self.lightning_module: nn.Module | None = None
        self.sync_batchnorm = False

    # ---- given by the Trainer ------------------------------------------------------------------------------------
    def check_world_size(self, world_size: int) -> None:
        """Refuse, at construction, a number of processes this strategy cannot train on."""

    def attach(
        self, runtime: Runtime, device: torch.device, precision: Precision, sync_batchnorm: bool = False
    ) -> None:
        """The process group, device and precision of the Trainer this strategy serves; ``sync_batchnorm`` is the
        Trainer's (only DDP acts on it, as in Lightning)."""
        self.runtime, self.root_device, self.precision_plugin = runtime, device, precision
        self.sync_batchnorm = sync_batchnorm

    def connect(self, module: nn.Module) -> None:
        """The module of the stage about to run (Lightning's ``Strategy.connect``)."""
        self.lightning_module = module

    # ---- the ranks, with Lightning's names -----------------------------------------------------------------------
    is_global_zero = property(lambda self: self._runtime.is_global_zero)
    world_size = property(lambda self: self._runtime.world_size)
    global_rank = property(lambda self: self._runtime.global_rank)
    local_rank = property(lambda self: self._runtime.local_rank)
    node_rank = property(lambda self: self._runtime.node_rank)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank reaches this call (``name`` is Lightning's label; unused)."""
        self._runtime.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """``src``'s ``obj`` on every rank: a picklable object, or a tensor (filled in place)."""
        return self._runtime.broadcast(obj, src)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """``tensor`` reduced across ranks in place (``reduce_op``: "mean"/"avg", "sum", "max", "min" or a
        ``torch.distributed.ReduceOp`` of those); anything but a tensor is returned as it is, as in Lightning."""
        _world_group_only(group, "reduce")
        op = _reduce_op(reduce_op)
        if not isinstance(tensor, torch.Tensor) or self.world_size == 1:
            return tensor
        if op == "mean" and not tensor.is_floating_point():  # Lightning divides into the integer tensor
            self._runtime.all_reduce(tensor, "sum")
            return tensor.copy_(tensor / self.world_size)
        return self._runtime.all_reduce(tensor, op)

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's ``tensor`` stacked along a new first dimension (one process: ``tensor`` as it is);
        ``sync_grads=True`` lets gradients flow back to each rank's input."""
        _world_group_only(group, "all_gather")
        if self.world_size == 1:
            return tensor
        if sync_grads:
            from torch.distributed.nn.functional import all_gather

            return torch.stack(all_gather(tensor))
        return torch.stack(self._runtime.all_gather(tensor))

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """True on every rank when ``decision`` is true on all ranks (``all=True``) or on any."""
        return self._runtime.all(decision) if all else self._runtime.any(decision)

    # ---- checkpoint writes behind training (async_save) --------------------------------------------------------------
    @property
    def background_writes(self) -> BackgroundWrites | None:
        """Where a checkpoint callback's full-state saves go while ``fit`` runs with ``async_save``, else None."""
        return self._background_writes

    def start_background_writes(self) -> None:
        """At the start of ``fit``: with ``async_save``, global rank 0 writes the checkpoint callbacks' files
        behind training from now on."""
        self._writing_behind = self.async_save
        if self.async_save and self.is_global_zero:
            self._background_writes = BackgroundWrites()

    def finish_checkpoint_writes(self) -> None:
        """Before a checkpoint callback's next save, and at the end of ``fit``: wait for global rank 0's writes in
        flight and run what waited for them. Called on every rank at a point all of them reach: a write that
        failed fails every rank."""
        if not self._writing_behind:
            return
        error = self._background_writes.finish() if self._background_writes is not None else None
        if self._runtime.any(error is not None):
            cause = self._runtime.broadcast(f"{type(error).__name__}: {error}" if self.is_global_zero else None)
            if error is not None:
                raise error
            raise RuntimeError(
                f"a checkpoint write in the background (async_save=True) failed on global rank 0; the checkpoints "
                f"saved before it are kept. {cause}"
            )

    def stop_background_writes(self, *, every_rank_here: bool) -> BaseException | None:
        """At the end of ``fit``: every write in place, then saves are synchronous again. ``every_rank_here``: a
        failed write fails every rank (``fit`` ended well); else (``fit`` failed) this rank's write error is
        returned, for the caller to report with its own."""
        if every_rank_here:
            self.finish_checkpoint_writes()
        writes, self._background_writes, self._writing_behind = self._background_writes, None, False
        return writes.close() if writes is not None else None

    def remove_checkpoint(self, filepath: str | os.PathLike) -> None:
        """Delete a checkpoint file (or folder) on global rank 0, if it exists, once the checkpoints being saved are
        in place (``when_checkpoints_written``); the other ranks return at once."""
        if self.is_global_zero:
            self.when_checkpoints_written(functools.partial(checkpoint_io.remove, filepath))

    def when_checkpoints_written(self, action: Callable[[], None]) -> None:
        """Run ``action``, global rank 0's work on checkpoint files (removing an old one, linking ``last``, telling
        the loggers), once every checkpoint this strategy is saving is in place: at once, where ``save_checkpoint``
        writes before it returns. An asynchronous save runs it after its write, or never if the write fails."""
        if self._background_writes is None:
            action()
        else:
            self._background_writes.when_written(action)

    def checkpoint_exists(self, filepath: str | os.PathLike) -> bool:
        """Whether a checkpoint is at ``filepath`` or being written there (global rank 0's view)."""
        writes = self._background_writes
        return (writes is not None and writes.is_being_written(filepath)) or os.path.exists(filepath)

    @property
    def _runtime(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer yet; pass it as Trainer(strategy=)")
        return self.runtime

    # ---- the module ----------------------------------------------------------------------------------------------
    @property
    def model(self) -> nn.Module | None:
        """What steps run through while ``fit`` trains (DDP's wrapper), else the module itself."""
        return self.lightning_module

    def setup_module(self) -> None:
        """Put the module on ``root_device`` in the Trainer's precision, after any checkpoint weights loaded."""
        module = self.lightning_module
        module.to(self.root_device)
        self.precision_plugin.convert_module(module)

    def setup_training(self) -> None:
        """Before ``configure_optimizers`` in ``fit`` (DDP wraps the module here)."""

    def setup_optimizers(self, configured: Any) -> tuple[list[torch.optim.Optimizer], list[LRSchedulerConfig]]:
        """The optimizers and scheduler configs of what ``configure_optimizers`` returned (Lightning's
        ``Strategy.setup_optimizers``); a strategy that wraps optimizers does it here."""
        return parse_optimizers(configured, self.lightning_module)

    def training_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """What runs ``step`` in training: ``step`` itself, or ``step`` inside a wrapper's forward."""
        return step

    def manual_training_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """What runs ``step`` in training under manual optimization, where ``manual_backward`` runs the backward
        passes inside the step."""
        return self.training_step_runner(step)

    def evaluation_step_runner(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """What runs ``step`` in validation, test and predict."""
        return step

    def prepare_manual_backward(self, loss: torch.Tensor) -> None:
        """Before each ``manual_backward``: a wrapper that reduces gradients in backward gets ready for it."""

    def no_sync(self) -> AbstractContextManager[None]:
        """A micro-batch that does not step: gradients are kept, not reduced."""
        return contextlib.nullcontext()

    def block_backward_sync(self) -> AbstractContextManager[None]:
        """Lightning's name for ``no_sync``, for a ``manual_backward`` on a batch that accumulates by hand."""
        return self.no_sync()

    def teardown(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """After every stage: drop training wrappers, and put the module and optimizer state back on the CPU
        (Lightning's strategy teardown)."""
        if self.root_device.type == "cpu":
            return
        self.lightning_module.cpu()
        for optimizer in optimizers:
            for state in optimizer.state.values():
                for key, value in state.items():
                    state[key] = map_tensors(value, lambda t: t.cpu())

    # ---- checkpoint state: as one process would hold it, whatever the strategy -------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The module's full ``state_dict`` (what global rank 0 writes)."""
        return self.lightning_module.state_dict()

    def load_model_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        self.lightning_module.load_state_dict(state_dict, strict=strict)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """``optimizer.state_dict()`` as one process would have it."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: Any) -> None:
        """``state``: a ``state_dict``, or where a sharded folder holds it (a ``ShardedOptimizerState``)."""
        if isinstance(state, dict):
            optimizer.load_state_dict(state)
        else:
            _sharded().load_optimizer(self.lightning_module, optimizer, state)

    @property
    def saves_on_every_rank(self) -> bool:
        """Whether every rank writes part of a checkpoint (a sharded one), or global rank 0 alone writes it."""
        return False

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | os.PathLike) -> None:
        """Write ``checkpoint`` to ``filepath`` atomically before returning, after any write in flight: called on
        global rank 0, or on every rank where ``saves_on_every_rank``."""
        if self._background_writes is not None:
            self._background_writes.wait()  # the files appear in the order they were asked for
        checkpoint_io.save_atomic(checkpoint, filepath)

    def load_checkpoint(self, path: str | os.PathLike, weights_only: bool = True) -> dict[str, Any]:
        """The checkpoint at ``path``, read on every rank. A sharded folder gives its ``meta.pt``: its weights load
        here (``load_folder_weights``), its optimizer states when ``fit`` restores them."""
        if not os.path.isdir(path):
            return checkpoint_io.load(path, weights_only=weights_only)
        checkpoint = _sharded().load_metadata(os.fspath(path), weights_only, self.world_size)
        self.load_folder_weights(os.fspath(path), self.lightning_module.strict_loading)
        return checkpoint

    def load_folder_weights(self, path: str, strict: bool) -> None:
        """Read a sharded folder's model into the module: whole tensors, as one process (and DDP) holds them."""
        _sharded().load_model(self.lightning_module, path, strict)


def _sharded() -> ModuleType:
    """``sharded``, imported when a folder is read: it imports torch's DCP, which would add about 0.6 s to every
    ``import gpulayer.trainer``."""
    from gpulayer.trainer.checkpoint import sharded

    return sharded


class SingleDeviceStrategy(Strategy):
    """One process on one device (``strategy="single_device"``, and ``"auto"`` on one process). ``async_save=True``
    (not in Lightning): the checkpoint callbacks' saves during ``fit`` return once the state is copied to host memory,
    and are written behind training."""

    strategy_name = "single_device"
    timeout = None

    def __init__(self, *, async_save: bool = False) -> None:
        super().__init__()
        self.async_save = check_async_save(async_save, "SingleDeviceStrategy")

    def __repr__(self) -> str:
        return "SingleDeviceStrategy(async_save=True)" if self.async_save else "SingleDeviceStrategy()"


def check_async_save(value: Any, owner: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}(async_save={value!r}): accepted values are True and False")
    return value


def as_timeout(value: timedelta | float | None, owner: str) -> timedelta | None:
    """A strategy's ``timeout``: None, a ``timedelta``, or a positive number of seconds."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(
            f"{owner}(timeout={value!r}): accepted values are None, a positive number of seconds or a datetime.timedelta"
        )
    return timedelta(seconds=value)


def _reduce_op(value: Any) -> str:
    if isinstance(value, str):
        op = _REDUCE_OPS.get(value.lower())
    else:
        reduce_op = torch.distributed.ReduceOp
        pairs = ((reduce_op.SUM, "sum"), (reduce_op.AVG, "mean"), (reduce_op.MAX, "max"), (reduce_op.MIN, "min"))
        op = next((name for member, name in pairs if value == member), None)
    if op is None:
        raise ValueError(
            f"reduce(reduce_op={value!r}): accepted values are 'mean', 'avg', 'sum', 'max', 'min' or "
            "torch.distributed.ReduceOp.SUM, AVG, MAX, MIN"
        )
    return op


def _world_group_only(group: Any, method: str) -> None:
    if group is not None and group is not torch.distributed.group.WORLD:
        raise ValueError(f"{method}(group={group!r}): GPUlayer reduces over every rank; accepted values are None")
