"""Lightning 2.6's public names and GPUlayer's answer for each: the one source of ``gpulayer port``'s rewrites and
reports, and of the porting guide's table of them (``docs/porting-from-lightning.md``, tested against it).

A name is looked up by its full dotted path (``lightning.pytorch.callbacks.ModelCheckpoint``); ``pytorch_lightning``,
``lightning``'s top-level re-exports and Lightning's defining modules are first turned into the public path.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulayer.trainer import argument_checks as checks
from gpulayer.trainer.arguments import DECLARATIONS
from gpulayer.trainer.strategies.strategy_names import check_strategy

ADOPTED = "adopted"  # GPUlayer's name, same behaviour: the import is rewritten
DIFFERENT = "adopted with a difference"  # rewritten; the porting guide documents the difference
KEPT = "kept as Lightning's"  # GPUlayer's Trainer takes Lightning's object as it is: the import stays
WORKS = "works as it is"  # a helper that needs no Lightning Trainer: the import stays, named in the report, no finding
NOT_ADOPTED = "not adopted"  # the import stays, marked, and is reported: what to do instead
ARGUMENT = "an argument instead"  # port writes GPUlayer's argument where the code says where; else as NOT_ADOPTED


@dataclass(frozen=True)
class Answer:
    status: str
    note: str
    home: str = ""  # GPUlayer's dotted path, for ADOPTED and DIFFERENT

    @property
    def rewritten(self) -> bool:
        return self.status in (ADOPTED, DIFFERENT)

    @property
    def reported(self) -> bool:
        """Left to the user, where the port does not write GPUlayer's answer itself: reported, the import marked."""
        return self.status in (NOT_ADOPTED, ARGUMENT)


def _adopted(home: str, note: str = "") -> Answer:
    return Answer(ADOPTED, note, home)


def _different(home: str, note: str) -> Answer:
    return Answer(DIFFERENT, note, home)


_DISPLAY = "accepted in callbacks= and dropped with one warning (GPUlayer prints its log line and no summary)"
_LOGGER = "GPUlayer's Trainer takes Lightning's logger object as it is"
_LAUNCH = "write the loop under gpulayer.runtime.launch() (docs/porting-from-lightning.md), or keep Lightning for it"
_CALLBACK = (
    "Lightning's callbacks are refused in GPUlayer's callbacks=; write it as a gpulayer.trainer.Callback, "
    "or keep Lightning's Trainer for it"
)
_HELPER = "a helper of Lightning's that needs neither its Trainer nor Fabric: the import stays and works"
_TYPES = "a typing alias of Lightning's (annotations, no behaviour): the import stays and works"
# Lightning 2.6's typing aliases and TypedDicts in lightning/pytorch/utilities/types.py (its LRSchedulerConfig, a
# dataclass Lightning's loop reads, is not one of them)
_TYPE_ALIASES = (
    "STEP_OUTPUT",
    "TRAIN_DATALOADERS",
    "EVAL_DATALOADERS",
    "OptimizerLRScheduler",
    "OptimizerConfig",
    "OptimizerLRSchedulerConfig",
    "LRSchedulerConfigType",
    "LRSchedulerTypeUnion",
    "LRSchedulerTypeTuple",
    "LRSchedulerType",
    "LRSchedulerPLType",
)
_CLI = "pip install gpulayer-cli"
_CLI_NAMES = (
    "LightningCLI",
    "LightningArgumentParser",
    "SaveConfigCallback",
    "ReduceLROnPlateau",
    "instantiate_class",
    "instantiate_module",
    "OptimizerCallable",
    "LRSchedulerCallable",
    "ArgsType",
)

ASYNC_CHECKPOINT_IO = "lightning.pytorch.plugins.io.AsyncCheckpointIO"

# Names, by Lightning's public path. A path ending in "." answers for every name below it that has no entry.
REGISTRY: dict[str, Answer] = {
    "lightning.pytorch.LightningModule": _adopted("gpulayer.trainer.Module"),
    "lightning.pytorch.LightningDataModule": _adopted("gpulayer.trainer.DataModule"),
    "lightning.pytorch.Trainer": _different(
        "gpulayer.trainer.Trainer", "every argument known; plugins, model_registry refused"
    ),
    "lightning.pytorch.Callback": _adopted("gpulayer.trainer.Callback"),
    "lightning.pytorch.seed_everything": _adopted("gpulayer.trainer.seed_everything"),
    "lightning.pytorch.callbacks.Checkpoint": _adopted("gpulayer.trainer.Checkpoint"),
    "lightning.pytorch.callbacks.EarlyStopping": _different(
        "gpulayer.callbacks.EarlyStopping", "values Lightning fails on later are refused at once"
    ),
    "lightning.pytorch.callbacks.ModelCheckpoint": _different(
        "gpulayer.callbacks.ModelCheckpoint", "local paths only; values Lightning fails on later are refused at once"
    ),
    "lightning.pytorch.callbacks.LearningRateMonitor": _adopted("gpulayer.callbacks.LearningRateMonitor"),
    "lightning.pytorch.callbacks.Timer": _different(
        "gpulayer.callbacks.Timer", "on several ranks a stop is agreed at the next sync point, not the next step"
    ),
    "lightning.pytorch.callbacks.LambdaCallback": _adopted("gpulayer.callbacks.LambdaCallback"),
    "lightning.pytorch.callbacks.BasePredictionWriter": _adopted("gpulayer.callbacks.BasePredictionWriter"),
    "lightning.pytorch.callbacks.OnExceptionCheckpoint": _different(
        "gpulayer.callbacks.OnExceptionCheckpoint", "values Lightning fails on later are refused at once"
    ),
    "lightning.pytorch.callbacks.GradientAccumulationScheduler": _adopted(
        "gpulayer.callbacks.GradientAccumulationScheduler"
    ),
    "lightning.pytorch.callbacks.BaseFinetuning": _different(
        "gpulayer.callbacks.BaseFinetuning", "a resume trains the groups unfrozen before the save (Lightning #21901)"
    ),
    "lightning.pytorch.callbacks.BackboneFinetuning": _different(
        "gpulayer.callbacks.BackboneFinetuning",
        "a resume trains the backbone unfrozen before the save (Lightning #21901)",
    ),
    "lightning.pytorch.callbacks.SpikeDetection": _different(
        "gpulayer.callbacks.SpikeDetection",
        "a bad mode is refused at once; a resume restores its state (Lightning's fails)",
    ),
    "lightning.fabric.utilities.spike.TrainingSpikeException": _adopted("gpulayer.callbacks.TrainingSpikeException"),
    "lightning.pytorch.callbacks.ModelPruning": _adopted("gpulayer.callbacks.ModelPruning"),
    "lightning.pytorch.callbacks.ThroughputMonitor": _different(
        "gpulayer.callbacks.ThroughputMonitor",
        "a bad window_size or keyword fails at construction, not when fit starts",
    ),
    "lightning.pytorch.callbacks.DeviceStatsMonitor": _adopted("gpulayer.callbacks.DeviceStatsMonitor"),
    "lightning.pytorch.callbacks.StochasticWeightAveraging": _different(
        "gpulayer.callbacks.StochasticWeightAveraging",
        "the batch-norm epoch takes no optimizer step (Lightning steps once there with stale gradients), so the "
        "module ends with the averaged weights and global_step is one lower",
    ),
    "lightning.pytorch.callbacks.WeightAveraging": _different(
        "gpulayer.callbacks.WeightAveraging",
        "with device=None the averaged copy moves to the module's device once the strategy places it (Lightning's "
        "stays where the module was at setup: the CPU on a GPU run)",
    ),
    "lightning.pytorch.callbacks.EMAWeightAveraging": _different(
        "gpulayer.callbacks.EMAWeightAveraging",
        "the copy on the module's device as WeightAveraging's; each update is four kernels with no host read, "
        "equal to Lightning's bit for bit",
    ),
    "lightning.pytorch.loggers.CSVLogger": _different(
        "gpulayer.trainer.CSVLogger", "rows are written at the log points and epoch ends"
    ),
    "lightning.pytorch.loggers.Logger": _adopted("gpulayer.trainer.Logger", "the base class of your own loggers"),
    "lightning.pytorch.strategies.DDPStrategy": _different(
        "gpulayer.trainer.DDPStrategy",
        "DDP's options; start_method='popen' runs the script on each rank under torch's elastic agent, 'spawn' and "
        "'fork' as Lightning's (no 'forkserver')",
    ),
    "lightning.pytorch.strategies.FSDPStrategy": _different(
        "gpulayer.fsdp.FSDPStrategy",
        'FSDP2 (pip install gpulayer-fsdp); `state_dict_type` "full" and "sharded" as Lightning\'s',
    ),
    "lightning.pytorch.strategies.SingleDeviceStrategy": _adopted("gpulayer.trainer.SingleDeviceStrategy"),
    "lightning.pytorch.strategies.Strategy": _different("gpulayer.trainer.Strategy", "no plugin attributes"),
    "lightning.pytorch.utilities.exceptions.MisconfigurationException": _adopted(
        "gpulayer.trainer.MisconfigurationException"
    ),
    "lightning.pytorch.utilities.warnings.PossibleUserWarning": _adopted("gpulayer.trainer.PossibleUserWarning"),
    "lightning.pytorch.trainer.states.TrainerFn": _adopted("gpulayer.trainer.TrainerFn"),
    "lightning.pytorch.trainer.states.TrainerState": _adopted("gpulayer.trainer.TrainerState"),
    "lightning.pytorch.trainer.states.TrainerStatus": _adopted("gpulayer.trainer.TrainerStatus"),
    "lightning.pytorch.trainer.states.RunningStage": _adopted("gpulayer.trainer.RunningStage"),
    "lightning.pytorch.callbacks.early_stopping.EarlyStoppingReason": _adopted(
        "gpulayer.callbacks.EarlyStoppingReason"
    ),
    "lightning.pytorch.loggers.": Answer(KEPT, _LOGGER),
    "lightning.pytorch.callbacks.ModelSummary": Answer(KEPT, _DISPLAY),
    "lightning.pytorch.callbacks.RichModelSummary": Answer(KEPT, _DISPLAY),
    "lightning.pytorch.callbacks.RichProgressBar": Answer(KEPT, _DISPLAY),
    "lightning.pytorch.callbacks.TQDMProgressBar": Answer(KEPT, _DISPLAY),
    "lightning.pytorch.callbacks.": Answer(NOT_ADOPTED, _CALLBACK),
    "lightning.pytorch.tuner.": Answer(
        NOT_ADOPTED,
        "GPUlayer has no Tuner (lr_find, scale_batch_size); sweep the learning rate or batch size with a few "
        "short fit(max_steps=...) runs, reading trainer.callback_metrics after each",
    ),
    "lightning.pytorch.utilities.model_summary.": Answer(
        NOT_ADOPTED,
        "Lightning's model summary needs Lightning's module; use print(model), or "
        "sum(p.numel() for p in model.parameters()) for the parameter count",
    ),
    "lightning.pytorch.profilers.Profiler": _adopted(
        "gpulayer.trainer.Profiler", "the base class of your own profilers"
    ),
    "lightning.pytorch.profilers.PassThroughProfiler": _adopted("gpulayer.trainer.PassThroughProfiler"),
    "lightning.pytorch.profilers.SimpleProfiler": _different(
        "gpulayer.trainer.SimpleProfiler", "rows for the hooks GPUlayer calls (those you override), not every hook"
    ),
    "lightning.pytorch.profilers.AdvancedProfiler": _different(
        "gpulayer.trainer.AdvancedProfiler", "rows for the hooks GPUlayer calls; a local dirpath (no fsspec)"
    ),
    "lightning.pytorch.profilers.PyTorchProfiler": _different(
        "gpulayer.trainer.PyTorchProfiler",
        "records every step unless schedule= is given; emit_nvtx refused; a local dirpath (no fsspec)",
    ),
    "lightning.pytorch.profilers.": Answer(
        NOT_ADOPTED, "XLAProfiler: GPUlayer has no XLA (TPU) support; use PyTorchProfiler"
    ),
    ASYNC_CHECKPOINT_IO: Answer(
        ARGUMENT,
        "GPUlayer takes no plugins; pass async_save=True to the strategy instead: "
        "Trainer(strategy=SingleDeviceStrategy(async_save=True)) on one device, DDPStrategy(async_save=True) on "
        "several (from gpulayer.trainer), FSDPStrategy(state_dict_type='sharded', async_save=True) under FSDP; the "
        "checkpoint callbacks' saves in fit are then written behind training, and trainer.save_checkpoint stays "
        "synchronous (gpulayer port makes the edit where a Trainer call in Python code names its strategy)",
    ),
    "lightning.pytorch.plugins.": Answer(
        NOT_ADOPTED, f"GPUlayer takes no plugins: precision= sets the precision; for anything else {_LAUNCH}"
    ),
    "lightning.pytorch.strategies.": Answer(
        NOT_ADOPTED,
        f"GPUlayer's strategies are DDP and FSDP (DeepSpeed, XLA and the others are not adopted); {_LAUNCH}",
    ),
    "lightning.pytorch.accelerators.": Answer(
        NOT_ADOPTED, "GPUlayer trains on CPU and CUDA only (no TPU, IPU, HPU, MPS): use accelerator='cpu'/'gpu'/'auto'"
    ),
    "lightning.pytorch.cli.LightningCLI": _different(
        "gpulayer.cli.LightningCLI",
        "pip install gpulayer-cli; a value the Trainer refuses fails as the command line is parsed, naming its key and "
        "the file or flag that set it (docs/cli.md)",
    ),
    **{f"lightning.pytorch.cli.{name}": _adopted(f"gpulayer.cli.{name}", _CLI) for name in _CLI_NAMES[1:]},
    "lightning.pytorch.cli.": Answer(
        NOT_ADOPTED, f"gpulayer.cli has {', '.join(_CLI_NAMES)}; the rest of Lightning's cli module is not adopted"
    ),
    "lightning.pytorch.utilities.rank_zero.rank_zero_only": _adopted("gpulayer.trainer.rank_zero_only"),
    "lightning.pytorch.utilities.rank_zero.": Answer(
        NOT_ADOPTED, "GPUlayer has rank_zero_only alone; guard the code with `if trainer.is_global_zero:`"
    ),
    "lightning.pytorch.utilities.grad_norm": Answer(WORKS, _HELPER),
    "lightning.fabric.utilities.suggested_max_num_workers": Answer(WORKS, _HELPER),
    "lightning.fabric.utilities.move_data_to_device": Answer(WORKS, _HELPER),
    "lightning.fabric.utilities.measure_flops": Answer(WORKS, _HELPER),
    "lightning.fabric.utilities.apply_func.convert_tensors_to_scalars": Answer(WORKS, _HELPER),
    **{f"lightning.pytorch.utilities.types.{name}": Answer(WORKS, _TYPES) for name in _TYPE_ALIASES},
    "lightning.fabric.": Answer(NOT_ADOPTED, f"GPUlayer has no Fabric; {_LAUNCH}"),
    "lightning.": Answer(NOT_ADOPTED, "GPUlayer has no equivalent; see docs/porting-from-lightning.md"),
}

_OPTUNA = (
    "works as it is: Optuna's pruning callback is built on Lightning's Callback, which GPUlayer's Trainer takes, and a "
    "test runs its study under both trainers (the same trial pruned at the same epoch)"
)
_RAY_TUNE = (
    "works as it is: Ray Tune's report callbacks are built on Lightning's Callback, which GPUlayer's Trainer takes, and "
    "a test runs a Tune trial under both trainers (the same metrics reported, the same checkpointed weights)"
)
_RAY_TRAIN = (
    "Ray Train's Lightning integration configures Lightning's own Trainer (RayDDPStrategy is a Lightning strategy, "
    "prepare_trainer reads its internals): keep Lightning's Trainer under Ray Train, or start GPUlayer's ranks with "
    "gpulayer launch or torchrun"
)

_LIBRARY_MODELS = (
    "works as it is: its models are built on Lightning's LightningModule, which GPUlayer's Trainer takes as they are "
    "(ADR 0031), and a test fits its NBeats and DeepAR under both trainers (the same weights, metrics, checkpoint and "
    "predictions)"
)

# Libraries that build Lightning's Trainer inside themselves (a model's or an engine's fit): the user's script has no
# Trainer to rewrite, so what they train stays on Lightning. By the import path of their Lightning part.
OWN_TRAINER_LIBRARIES = (
    "pytorch_tabular",  # TabularModel.fit
    "darts",  # the torch models' fit (TorchForecastingModel)
    "neuralforecast",  # NeuralForecast.fit, each model's fit
    "anomalib.engine",  # Engine (its models are LightningModules a Trainer of the script may fit)
    "scvi",  # scvi-tools' models' train (scvi.train.Trainer, a subclass of Lightning's)
    "gluonts.torch",  # PyTorchLightningEstimator.train
    "autogluon.multimodal",  # MultiModalPredictor.fit
    "autogluon.timeseries",  # TimeSeriesPredictor.fit, through GluonTS's torch models
)
OWN_TRAINER = "builds Lightning's Trainer inside the library: this project stays on Lightning"

# Other libraries' Lightning integrations, by their public path, answered as Lightning's names are; a path ending in
# "." answers for every name below it. An integration that works is reported as such, and is no finding.
INTEGRATIONS: dict[str, Answer] = {
    "optuna_integration.PyTorchLightningPruningCallback": Answer(KEPT, _OPTUNA),
    "optuna_integration.pytorch_lightning.PyTorchLightningPruningCallback": Answer(KEPT, _OPTUNA),
    "optuna.integration.PyTorchLightningPruningCallback": Answer(KEPT, _OPTUNA),
    "ray.tune.integration.pytorch_lightning.": Answer(KEPT, _RAY_TUNE),
    "ray.train.lightning.": Answer(NOT_ADOPTED, _RAY_TRAIN),
    "pytorch_forecasting.": Answer(WORKS, _LIBRARY_MODELS),
    **{f"{library}.": Answer(NOT_ADOPTED, OWN_TRAINER) for library in OWN_TRAINER_LIBRARIES},
}

# Other public paths of the same objects that a name's own path above does not lead to (``_package_level``): the
# `lightning` package's re-exports, and Fabric's and other modules' paths of what the registry names elsewhere.
_SAME = {
    "lightning.LightningModule": "lightning.pytorch.LightningModule",
    "lightning.LightningDataModule": "lightning.pytorch.LightningDataModule",
    "lightning.Trainer": "lightning.pytorch.Trainer",
    "lightning.Callback": "lightning.pytorch.Callback",
    "lightning.seed_everything": "lightning.pytorch.seed_everything",
    "lightning.Fabric": "lightning.fabric.Fabric",
    "lightning.fabric.seed_everything": "lightning.pytorch.seed_everything",
    "lightning.fabric.utilities.seed.seed_everything": "lightning.pytorch.seed_everything",
    "lightning.fabric.utilities.exceptions.MisconfigurationException": (
        "lightning.pytorch.utilities.exceptions.MisconfigurationException"
    ),
    "lightning.fabric.utilities.warnings.PossibleUserWarning": "lightning.pytorch.utilities.warnings.PossibleUserWarning",
    "lightning.pytorch.utilities.rank_zero_only": "lightning.pytorch.utilities.rank_zero.rank_zero_only",
    "lightning.fabric.utilities.rank_zero_only": "lightning.pytorch.utilities.rank_zero.rank_zero_only",
    "lightning.fabric.utilities.rank_zero.rank_zero_only": "lightning.pytorch.utilities.rank_zero.rank_zero_only",
    "lightning.pytorch.utilities.suggested_max_num_workers": "lightning.fabric.utilities.suggested_max_num_workers",
    "lightning.pytorch.utilities.move_data_to_device": "lightning.fabric.utilities.move_data_to_device",
    "lightning.pytorch.utilities.measure_flops": "lightning.fabric.utilities.measure_flops",
    "lightning.pytorch.plugins.AsyncCheckpointIO": ASYNC_CHECKPOINT_IO,
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger": "lightning.pytorch.loggers.TensorBoardLogger",
}
LIGHTNING_ROOTS = ("lightning", "pytorch_lightning")


def public_path(dotted: str) -> str:
    """``dotted`` under Lightning's public module path: ``pytorch_lightning`` is ``lightning.pytorch``, and a name in a
    submodule is the name the registry gives its package (``_package_level``)."""
    if dotted == "pytorch_lightning" or dotted.startswith("pytorch_lightning."):
        dotted = "lightning.pytorch" + dotted[len("pytorch_lightning") :]
    return _package_level(_SAME.get(dotted, dotted))


def _package_level(dotted: str) -> str:
    """A name imported from a submodule of the package the registry names it in, as the registry names it:
    ``lightning.pytorch.callbacks.early_stopping.EarlyStopping`` is ``lightning.pytorch.callbacks.EarlyStopping``,
    ``lightning.pytorch.core.module.LightningModule`` is ``lightning.pytorch.LightningModule`` (Lightning's packages
    export what their submodules define; a test walks Lightning 2.6's modules for every such path)."""
    module, _, name = dotted.rpartition(".")
    parts = module.split(".")
    for end in range(len(parts), 1, -1):  # the module itself, then each package above it, down to lightning.<x>
        candidate = ".".join(parts[:end]) + "." + name
        if candidate in REGISTRY:
            return candidate
    return dotted


def is_lightning(dotted: str) -> bool:
    return dotted.split(".")[0] in LIGHTNING_ROOTS


def exact(dotted: str) -> Answer | None:
    """The answer for exactly this name (not a module's answer for the names below it)."""
    return REGISTRY.get(public_path(dotted))


def answer(dotted: str) -> Answer:
    """The answer for a Lightning name: its own, or that of the closest module above it that has one."""
    path = public_path(dotted)
    if path in REGISTRY:
        return REGISTRY[path]
    parts = path.split(".")
    for end in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:end]) + "."
        if module in REGISTRY:
            return REGISTRY[module]
    return REGISTRY["lightning."]


def integration(dotted: str) -> Answer | None:
    """The answer for a name of another library's Lightning integration (its own, or its module's), or None."""
    if dotted in INTEGRATIONS:
        return INTEGRATIONS[dotted]
    parts = dotted.split(".")
    return next(
        (INTEGRATIONS[m] for end in range(len(parts), 0, -1) if (m := ".".join(parts[:end]) + ".") in INTEGRATIONS),
        None,
    )


def own_trainer_library(dotted: str) -> str | None:
    """The library of ``OWN_TRAINER_LIBRARIES`` a name is imported from, or None."""
    return next((library for library in OWN_TRAINER_LIBRARIES if f"{dotted}.".startswith(f"{library}.")), None)


def renames() -> dict[str, str]:
    """Lightning's name -> GPUlayer's, where they differ (``LightningModule`` -> ``Module``)."""
    pairs = {(path.rsplit(".", 1)[1], a.home.rsplit(".", 1)[1]) for path, a in REGISTRY.items() if a.rewritten}
    return {old: new for old, new in sorted(pairs) if old != new}


class Written(str):
    """An argument's code that is not a literal, shown as written."""

    def __repr__(self) -> str:
        return str(self)


def refused_trainer_argument(argument: str, value: object) -> str | None:
    """Why GPUlayer's Trainer refuses ``argument=value``, by the Trainer's own checks, or None. A value ``Written``
    (not a literal) is judged only for the arguments that accept None alone."""
    literal = not isinstance(value, Written)
    try:
        if argument in DECLARATIONS and DECLARATIONS[argument].check is checks.unadopted:
            checks.unadopted(argument, value, {})
        elif literal and argument == "strategy" and isinstance(value, str):
            check_strategy(value)
        elif literal and argument == "accelerator" and isinstance(value, str):
            checks.one_of(*checks.ACCELERATORS)(argument, value.lower(), {})
    except ValueError as refused:
        return str(refused)
    return None
