"""One validation, test or predict run over every loader of the stage, in Lightning's hook order.

Lightning 2.6's is ``_EvaluationLoop`` in ``lightning/pytorch/loops/evaluation_loop.py``.
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.trainer.batch import map_tensors
from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.data.batch_indices import BatchIndices
from gpulayer.trainer.data.data import (
    DataSource,
    agreed_batches,
    as_loader_list,
    batches,
    has_length,
    num_batches,
    reload_due,
    stop_together,
    warn_if_shuffled,
)
from gpulayer.trainer.data.samplers import sampled, set_sampler_epoch
from gpulayer.trainer.logging.results import ResultCollection
from gpulayer.trainer.loops.cadence import validates_in_epoch
from gpulayer.trainer.states import LightningEnum

if TYPE_CHECKING:
    from gpulayer.trainer.core.hooks import Hooks
    from gpulayer.trainer.logging.logger_rows import LoggerRows
    from gpulayer.trainer.logging.metric_hub import MetricHub
    from gpulayer.trainer.loops.transfer import BatchTransfer
    from gpulayer.trainer.trainer import Trainer

_NAMES = {"validate": "validation", "test": "test", "predict": "predict"}


class WriteInterval(LightningEnum):
    """When a prediction writer writes (Lightning's, ``lightning/pytorch/callbacks/prediction_writer.py``): its
    ``interval`` tells the predict loop what to keep for it."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


def written_intervals(callbacks: list[Any]) -> tuple[bool, bool]:
    """Whether a prediction writer among ``callbacks`` writes after each batch, and whether one at the epoch's end."""
    intervals = [c.interval for c in callbacks if isinstance(getattr(c, "interval", None), WriteInterval)]
    return any(i.on_batch for i in intervals), any(i.on_epoch for i in intervals)


class EvaluationLoop:
    """Validates, tests or predicts (``stage``); ``run`` returns what the Trainer's entry point returns."""

    def __init__(
        self,
        trainer: Trainer,
        stage: str,
        *,
        hooks: Hooks,
        hub: MetricHub,
        logger_rows: LoggerRows,
        transfer: BatchTransfer,
    ) -> None:
        self.trainer = trainer
        self.hooks, self.hub, self.logger_rows, self.transfer = hooks, hub, logger_rows, transfer
        self.stage = stage
        self.name = _NAMES[stage]
        self.prefix = {"validate": "val", "test": "test", "predict": "predict"}[stage]
        self.results = None if stage == "predict" else ResultCollection(training=False)
        self.source: DataSource | None = None
        self.loaders: list[Any] | None = None
        self.max_batches: list[int | float] = []
        self.logged_batches: list[int] = []
        self.loaded_at: float = -math.inf
        self.warned_none = False  # Lightning's predict loop warns of a None prediction once per Trainer
        self.iterate = iter  # a loader's batches; a profiler times each fetch (profilers/attach.py)
        # Predict only, with the names of Lightning's _PredictionLoop, which prediction writers read. The outputs are
        # kept when returned or written at the epoch's end; the batch indices only while a writer writes.
        self.return_predictions = True
        self._predictions: list[list[Any]] = []  # loaders x batches
        self.epoch_batch_indices: list[list[list[int]]] = []  # loaders x batches x samples
        self.current_batch_indices: list[int] = []
        self._unknown_indices: set[str] = set()  # loader types warned of, once per Trainer as Lightning
        self._writes, self._keeping = (False, False), True  # set by each predict run

    @property
    def predictions(self) -> list[Any]:
        """The outputs kept so far: a list per batch, or one such list per loader when there are several."""
        if len(self._predictions) == 1:
            return self._predictions[0]
        return self._predictions

    @property
    def limit(self) -> int | float:
        return getattr(self.trainer.args, f"limit_{self.prefix}_batches")

    def attach(self, source: DataSource) -> None:
        self.source, self.loaders, self.max_batches = source, None, []
        self.loaded_at: float = -math.inf  # the epoch the loaders were last requested in, during fit

    def is_enabled(self) -> bool:
        """A source of loaders, an overridden step, and a non-zero limit (Lightning's ``enable_validation``)."""
        step = f"{self.name}_step"
        return (
            self.source is not None
            and self.source.is_defined()
            and (self.stage == "predict" or is_overridden(step, self.trainer.lightning_module, Module))
            and self.limit != 0
        )

    def setup_data(self) -> None:
        """Request the loaders once per entry point; during ``fit``, again when ``reload_dataloaders_every_n_epochs``
        says so."""
        if not self.is_enabled():
            return
        trainer, args = self.trainer, self.trainer.args
        fitting = trainer.state.fn == "fit"
        if self.loaders is not None and not (fitting and reload_due(args, trainer.current_epoch, self.loaded_at)):
            return
        # A sanity check in an epoch that does not validate leaves the next validation to load again (Lightning).
        if fitting and (
            not trainer.sanity_checking or validates_in_epoch(args.check_val_every_n_epoch, trainer.current_epoch)
        ):
            self.loaded_at = trainer.current_epoch
        loaders = as_loader_list(self.source.request(self.hooks, trainer.global_rank), self.prefix)
        for loader in loaders:
            warn_if_shuffled(loader, self.prefix, trainer.is_global_zero)
        recording = self.stage == "predict" and any(written_intervals(trainer.callbacks))
        loaders = [sampled(loader, self.prefix, trainer, fitting, recording) for loader in loaders]
        counted_before = self.logged_batches if self.loaders is not None else []
        self.loaders = loaders
        counts = [num_batches(loader, self.limit, self.prefix) for loader in loaders]
        # Predict runs no collective, so each rank predicts all of its shard; val and test merge metrics across
        # ranks at the same points, so they run the same number of batches on every rank.
        self.max_batches = (
            counts if self.stage == "predict" else agreed_batches(trainer.runtime, loaders, counts, self.prefix)
        )
        # The step of eval step rows, per loader, across runs (and across reloads of as many loaders).
        self.logged_batches = counted_before if len(counted_before) == len(loaders) else [0] * len(loaders)

    def run(self) -> list[dict[str, torch.Tensor]] | list[Any] | None:
        """Validation and test return one dict of logged epoch metrics per loader; predict its outputs."""
        self.setup_data()
        if not self.loaders or sum(self._limits()) == 0:
            return [] if self.stage != "predict" else None
        trainer = self.trainer
        module, hooks, hub = trainer.lightning_module, self.hooks, self.hub
        self._check_dataloader_idx(module)
        self._step_runner = trainer.strategy.evaluation_step_runner(hooks.step_caller(f"{self.name}_step"))
        self._step_context = trainer.strategy.precision_plugin.step_context
        several = len(self.loaders) > 1
        modes = {m: m.training for m in module.modules()}
        hooks.module(f"on_{self.name}_model_eval")
        if self.results is not None:
            hub.activate(self.results)
        hooks.both(f"on_{self.name}_start")
        hooks.both(f"on_{self.name}_epoch_start")
        predicting = self.stage == "predict"
        if predicting:
            self._predict_start()
        outputs: list[Any] = []
        for loader_idx, (loader, count) in enumerate(zip(self.loaders, self._limits(), strict=True)):
            if count == 0:
                continue
            idx = loader_idx if several else None
            set_sampler_epoch(loader, trainer.fit_loop.progress.epochs_processed)
            recorder = self._recorder(loader) if predicting and any(self._writes) else None
            iterator = self.iterate(loader)
            if trainer.world_size > 1 and not predicting and not has_length(loader):
                iterator = stop_together(iterator, trainer.runtime)
            for batch_idx, batch, _ in batches(iterator, count):
                batch = self.transfer(batch, loader_idx)
                if recorder is not None:  # before the batch's hooks, as Lightning records them
                    self._record(recorder.take(), loader_idx)
                output = self._step(hooks, hub, batch, batch_idx, idx)
                if predicting:
                    self._predicted(output, loader_idx)
            if not predicting:
                outputs.append(self._loader_end(hub))
        if predicting:
            return self._predict_end(modes)
        hub.epoch_end_reached()
        self.results.dataloader_idx = None
        hooks.both(f"on_{self.name}_epoch_end")
        epoch_end = {} if trainer.sanity_checking else hub.flush()
        for logged in outputs:
            logged.update(epoch_end)
        if not trainer.sanity_checking:
            self.logger_rows.push({name: value for logged in outputs for name, value in logged.items()} | epoch_end)
        hooks.both(f"on_{self.name}_end")
        hub.reset_results()
        self._restore(modes)
        return outputs

    def _step(self, hooks: Hooks, hub: MetricHub, batch: Any, batch_idx: int, idx: int | None) -> Any:
        args = (batch, batch_idx) if idx is None else (batch, batch_idx, idx)
        if self.results is not None:
            hub.on_batch_start(batch, idx)
        hooks.both(f"on_{self.name}_batch_start", *args)
        step_args = args if self._takes_batch_idx else args[:1] + args[2:]
        with self._step_context():
            output = self._step_runner(*step_args)
        hooks.both(f"on_{self.name}_batch_end", output, *args)
        if self.results is not None:
            hub.on_batch_end()
            if not self.trainer.sanity_checking:
                loader_idx = idx or 0
                self.logger_rows.push(hub.flush(), step=self.logged_batches[loader_idx], save=False)
                self.logged_batches[loader_idx] += 1
        return output

    def _predict_start(self) -> None:
        """What this predict run keeps: outputs when returned or written at the epoch's end, indices for writers."""
        self._writes = written_intervals(self.trainer.callbacks)  # (after each batch, at the epoch's end)
        self._keeping = self.return_predictions or self._writes[1]
        self._predictions = [[] for _ in self.loaders]
        self.epoch_batch_indices = [[] for _ in self.loaders]

    def _record(self, indices: list[int], loader_idx: int) -> None:
        on_batch, on_epoch = self._writes
        if on_epoch:
            self.epoch_batch_indices[loader_idx].append(indices)
        if on_batch:
            self.current_batch_indices = indices

    def _predicted(self, output: Any, loader_idx: int) -> None:
        if output is None and not self.warned_none and self.trainer.is_global_zero:
            self.warned_none = True
            warnings.warn("predict returned None if it was on purpose, ignore this warning...", stacklevel=3)
        if self._keeping:
            self._predictions[loader_idx].append(map_tensors(output, lambda t: t.cpu()))

    def _predict_end(self, modes: dict[torch.nn.Module, bool]) -> list[Any] | None:
        """Lightning's order: ``on_predict_epoch_end`` (where writers see the outputs), the outputs and indices
        dropped unless returned, then ``on_predict_end``."""
        self.hooks.both("on_predict_epoch_end")
        returned = self.predictions if self.return_predictions else None
        if not self.return_predictions:
            self._predictions = []
        self.epoch_batch_indices = []
        self.hooks.both("on_predict_end")
        self._restore(modes)
        return returned

    def _recorder(self, loader: Any) -> BatchIndices | None:
        """The loader's recorder of batch indices; none, with Lightning's warning once per loader type, when it has
        no batch sampler to record (an iterable dataset, ``batch_size=None``, not a DataLoader)."""
        batch_sampler = getattr(loader, "batch_sampler", None)
        if isinstance(batch_sampler, BatchIndices):
            return batch_sampler
        name = type(loader).__name__
        if name not in self._unknown_indices and self.trainer.is_global_zero:
            self._unknown_indices.add(name)
            warnings.warn(f"Couldn't infer the batch indices fetched from your dataloader: `{name}`", stacklevel=3)
        return None

    def _loader_end(self, hub: MetricHub) -> dict[str, torch.Tensor]:
        hub.epoch_end_reached()
        return {} if self.trainer.sanity_checking else dict(hub.flush())

    def _limits(self) -> list[int | float]:
        if self.trainer.sanity_checking:
            return [min(self.trainer.args.num_sanity_val_steps, count) for count in self.max_batches]
        return self.max_batches

    def _check_dataloader_idx(self, module: Module) -> None:
        """Lightning's rule for the step and the module's batch hooks: several loaders need a ``dataloader_idx``
        parameter; one loader must not require it (``_verify_dataloader_idx_requirement``)."""
        step = getattr(module, f"{self.name}_step")
        self._takes_batch_idx = takes_batch_idx(step)
        several = len(self.loaders) > 1
        hooks = [f"{self.name}_step", f"on_{self.name}_batch_start", f"on_{self.name}_batch_end"]
        for hook in hooks:
            method = getattr(module, hook)
            if method is None:  # a hook set to None is skipped
                continue
            parameters = inspect.signature(inspect.unwrap(method)).parameters
            has_idx = "dataloader_idx" in parameters or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
            if several and not has_idx:
                raise RuntimeError(
                    f"{type(module).__name__}.{hook} must take a `dataloader_idx` argument: "
                    f"{len(self.loaders)} {self.prefix} loaders are in use"
                )
            required = parameters.get("dataloader_idx")
            if not several and required is not None and required.default is inspect.Parameter.empty:
                raise RuntimeError(
                    f"{type(module).__name__}.{hook} requires `dataloader_idx` but one {self.prefix} loader is in "
                    "use; give it a default (dataloader_idx=0)"
                )

    def _restore(self, modes: dict[torch.nn.Module, bool]) -> None:
        module = self.trainer.lightning_module
        hook = f"on_{self.name}_model_train"
        if self.stage != "predict" and is_overridden(hook, module, Module):
            self.hooks.module(hook)
        else:
            for submodule, training in modes.items():
                submodule.training = training


def takes_batch_idx(step: Any) -> bool:
    """Lightning passes ``batch_idx`` when the step names it, takes two or more parameters, or takes ``*args``."""
    parameters = inspect.signature(step).parameters
    return (
        "batch_idx" in parameters
        or len(parameters) >= 2
        or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
    )
