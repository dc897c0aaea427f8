"""Lightning's ``ddp_spawn``, ``ddp_fork`` and ``ddp_notebook``: an entry point of the caller's Trainer runs in N
processes it starts (the runtime's ``start_processes``), and the caller's objects then hold what the run left.

Each started process builds a Trainer from the caller's arguments, callbacks and loggers and runs the same entry point
on its own copy of the model and data as rank r of an ordinary DDP job: every decision in it is DDP's, agreed across
ranks. Rank 0 then sends back what Lightning 2.6 restores in the caller (``_MultiProcessingLauncher`` in
``lightning/pytorch/strategies/launchers/multiprocessing.py``): the module's weights after ``fit`` (loaded with
``strict=False``), ``trainer.state``, ``callback_metrics`` and what ``validate``/``test`` return. Beyond Lightning's,
following its stated intent ("TODO: pass also best score"), it sends ``logged_metrics``, ``global_step`` and
``current_epoch``, and every checkpoint callback's best and last paths and scores: Lightning's caller keeps
``global_step == 0`` and ``best_model_score is None`` after a spawned fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gpulayer.runtime.started import start_processes
from gpulayer.trainer.checkpoint.checkpoint import rng_states, set_rng_states
from gpulayer.trainer.compiled import uncompiled
from gpulayer.trainer.core.callback import Checkpoint
from gpulayer.trainer.exceptions import MisconfiguredValueError
from gpulayer.trainer.states import TrainerFn, TrainerState, TrainerStatus
from gpulayer.trainer.strategies.world import interactive_session

if TYPE_CHECKING:
    from gpulayer.runtime import Placement
    from gpulayer.trainer.strategies.strategy import Strategy
    from gpulayer.trainer.trainer import Trainer

# What a checkpoint callback learns during a run, sent back to the caller's copy.
CHECKPOINT_RESULTS = (
    "best_model_path",
    "best_model_score",
    "best_k_models",
    "kth_best_model_path",
    "kth_value",
    "last_model_path",
)


class ProcessStarter:
    """The caller's side: starts ``nprocs`` ranks by ``start_method`` for each entry point, and applies what rank 0
    sends back. Lightning's rule that one Trainer fits once this way is kept here (``already_fit``)."""

    def __init__(self, start_method: str, nprocs: int) -> None:
        self.start_method, self.nprocs = start_method, nprocs
        self.already_fit = False

    @classmethod
    def for_caller(cls, placement: Placement, strategy: Strategy, nprocs: int) -> ProcessStarter | None:
        """A starter for a Trainer alone in its process whose strategy starts its ranks; None for any other."""
        if placement.source != "in-process" or strategy.start_method == "popen":
            return None
        return cls(strategy.start_method, nprocs)

    def run(self, trainer: Trainer, stage: str, arguments: dict[str, Any]) -> Any:
        """Run entry point ``stage`` with ``arguments`` (its parameters by name, ``self`` among them) on the ranks.
        As in Lightning, a refusal or a failed rank interrupts the caller: its status, callbacks' ``on_exception``,
        loggers finalized as failed (``_interrupt`` in ``lightning/pytorch/trainer/call.py``)."""
        arguments = {name: value for name, value in arguments.items() if name != "self"}
        if arguments.get("model") is None:
            arguments["model"] = trainer.lightning_module
        else:
            trainer.lightning_module = uncompiled(arguments["model"])  # Lightning's fit sets it before launching
        trainer.state.fn, trainer.state.status = TrainerFn(stage), TrainerStatus.RUNNING
        try:
            self._check(trainer, stage, arguments)
            if self.start_method == "fork":
                # Each rank would import it at its first optimizer (torch's lazy _disable_dynamo), once per fork.
                import torch._dynamo  # noqa: F401
            output = start_processes(
                _run_rank,
                type(trainer),
                trainer.args,
                trainer.loggers,
                trainer.callbacks,
                stage,
                arguments,
                ProcessSettings.capture() if self.start_method == "spawn" else None,
                nprocs=self.nprocs,
                start_method=self.start_method,
            )
        except BaseException as error:
            _interrupt(trainer, error)
            if isinstance(error, KeyboardInterrupt):
                raise SystemExit(1) from error  # Lightning's end after its graceful shutdown, as in a stage
            raise
        output.apply(trainer, trainer.lightning_module)
        self.already_fit |= stage == "fit"
        return output.returned

    def _check(self, trainer: Trainer, stage: str, arguments: dict[str, Any]) -> None:
        """Lightning's refusals, before any process starts."""
        if stage == "fit" and self.already_fit:
            raise NotImplementedError(
                "Calling `trainer.fit()` twice on the same Trainer instance using a spawn-based strategy is not "
                "supported. You can work around this limitation by creating a new Trainer instance and passing the "
                "`fit(ckpt_path=...)` argument."
            )
        if stage == "predict":
            if arguments.get("return_predictions"):
                raise MisconfiguredValueError(
                    "`return_predictions` should be set to `False` when using the strategies that spawn or fork. "
                    f"Found {arguments['return_predictions']} with strategy {type(trainer.strategy)}."
                )
            arguments["return_predictions"] = False  # no predictions come back (Lightning's predict returns None)
        if stage != "fit" and arguments["model"] is None:
            raise TypeError(f"{stage}: pass a model; this Trainer has not been given one before")
        if self.start_method == "fork" and trainer.args.accelerator == "cuda" and torch.cuda.is_initialized():
            raise RuntimeError(  # Lightning's words; the forked ranks could not use CUDA
                "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the "
                "'spawn' start method or avoid CUDA initialization in the main process."
                + (" You will have to restart the Python kernel." if interactive_session() else "")
            )


def _run_rank(
    trainer_class: type[Trainer],
    args: Any,
    loggers: list[Any],
    callbacks: list[Any],
    stage: str,
    arguments: dict[str, Any],
    settings: ProcessSettings | None,
) -> WorkerOutput | None:
    """One started rank: the caller's Trainer rebuilt here, the entry point run, and rank 0's output."""
    if settings is not None:
        settings.restore()
    trainer = trainer_class.__new__(trainer_class)
    trainer.args = args
    trainer._build_from_args(loggers, callbacks)
    returned = getattr(trainer, stage)(**arguments)
    weights = trainer.lightning_module.state_dict()  # on every rank: a metric's state may sync (as Lightning)
    if not trainer.is_global_zero:
        return None
    checkpoints = [callback for callback in callbacks if isinstance(callback, Checkpoint)]
    return WorkerOutput(
        state=trainer.state,
        returned=returned,
        weights={name: tensor.detach().cpu() for name, tensor in weights.items()} if stage == "fit" else None,
        callback_metrics=_on_cpu(trainer.callback_metrics),
        logged_metrics=_on_cpu(trainer.logged_metrics),
        progress=trainer.fit_loop.progress.state_dict() if stage == "fit" else None,
        checkpoints=[
            {name: _on_cpu(getattr(callback, name)) for name in CHECKPOINT_RESULTS if hasattr(callback, name)}
            for callback in checkpoints
        ],
    )


def _interrupt(trainer: Trainer, error: BaseException) -> None:
    trainer.state.status = TrainerStatus.INTERRUPTED
    for callback in trainer.callbacks:
        callback.on_exception(trainer, trainer.lightning_module, error)
    for logger in trainer.loggers:
        logger.finalize("failed")


@dataclass(frozen=True)
class WorkerOutput:
    """What rank 0 sends back after an entry point (every tensor on the CPU)."""

    state: TrainerState
    returned: Any
    weights: dict[str, torch.Tensor] | None
    callback_metrics: dict[str, torch.Tensor]
    logged_metrics: dict[str, torch.Tensor]
    progress: dict[str, Any] | None
    checkpoints: list[dict[str, Any]]

    def apply(self, trainer: Trainer, module: torch.nn.Module) -> None:
        """Put the run's results into the caller's Trainer and module."""
        if self.weights is not None:
            # Not strict, as Lightning: the module's layers may have changed in the started process.
            module.load_state_dict(self.weights, strict=False)
        trainer.state = self.state
        trainer.callback_metrics.update(self.callback_metrics)  # the dicts themselves, as Lightning updates them
        trainer.logged_metrics.update(self.logged_metrics)
        if self.progress is not None:
            trainer.fit_loop.progress.load_state_dict(self.progress, step_limit=math.inf)
        for callback, results in zip(trainer.checkpoint_callbacks, self.checkpoints, strict=False):
            for name, value in results.items():
                setattr(callback, name, value)


@dataclass(frozen=True)
class ProcessSettings:
    """The caller's random states and determinism flags, which a spawned process starts without (Lightning's
    ``_GlobalStateSnapshot``); a forked one inherits them."""

    deterministic: tuple[bool, bool]
    cudnn_benchmark: bool
    rng: dict[str, Any]  # checkpoint.rng_states(), less CUDA's: a spawned rank makes its own CUDA context or none

    @classmethod
    def capture(cls) -> ProcessSettings:
        return cls(
            deterministic=(
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            rng={name: state for name, state in rng_states().items() if name != "cuda"},
        )

    def restore(self) -> None:
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        set_rng_states(self.rng)


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    return value
