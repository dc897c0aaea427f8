"""A user's script calling fit, validate, test and predict twice on Lightning's started strategies (``ddp_spawn``,
``ddp_fork``, ``ddp_notebook``), run under Lightning 2.6 or GPUlayer on 2 gloo CPU ranks:

    python started_script.py FRAMEWORK OUT STRATEGY [STRATEGY ...]

For each strategy it makes two calls, each with a new Trainer (seeded first) in ``OUT/<strategy>`` and writes
``OUT/record.json``: what the caller's Trainer, module and checkpoint callback hold before the first entry point and
after each one, what each entry point returned, the refusals of a second ``fit`` and of ``return_predictions=True``,
and what rank 0 held at ``on_fit_end`` (the ``Recorder`` callback, in the started process); then every file under
``OUT/<strategy>`` with the rows of each ``metrics.csv``.

    python -i < STDIN    (STDIN: ``import sys; sys.argv = [SCRIPT, FRAMEWORK, OUT, "interactive"]``, then
                          ``exec(compile(open(SCRIPT).read(), SCRIPT, "exec"))``)

at a Python prompt instead records ``ddp_spawn`` refused and ``strategy="auto"`` fitting with 2 devices.

The framework comes from ``sys.argv[1]`` at import: a spawned rank imports this file again (as ``__mp_main__``,
with the caller's ``sys.argv``) to find the module and callback classes.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = sys.argv[1] if len(sys.argv) > 1 else ""
if FRAMEWORK == "lightning":
    import lightning.pytorch as fw
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    Module, Callback = fw.LightningModule, fw.Callback
    FRAMEWORK_OPTIONS = {"enable_progress_bar": False, "enable_model_summary": False}
elif FRAMEWORK == "gpulayer":
    import gpulayer.trainer as fw
    from gpulayer.callbacks import ModelCheckpoint

    Module, Callback, CSVLogger = fw.Module, fw.Callback, fw.CSVLogger
    FRAMEWORK_OPTIONS = {}
else:
    raise SystemExit(f"usage: {Path(__file__).name} lightning|gpulayer OUT STRATEGY [STRATEGY ...]")

SEED = 1234
CALLS = 2
# Set in the caller just before its entry points: a forked rank inherits it, a spawned rank (which imports this file
# again) sees None. Tells how each framework started its ranks without asking either for its own attributes.
CALLER_MARK: int | None = None


class Model(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss, on_step=True, on_epoch=True)  # rank 0's own
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.layer(batch[0]), batch[1]), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("test_loss", F.mse_loss(self.layer(batch[0]), batch[1]), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)


class Recorder(Callback):
    """On rank 0 of the started ranks, at on_fit_end: what that Trainer and its checkpoint callback hold. In the
    caller's process: the exceptions its on_exception saw."""

    def __init__(self, path: str, root: str):
        self.path, self.root = path, root
        self.exceptions = []

    def on_exception(self, trainer, pl_module, exception):
        self.exceptions.append(type(exception).__name__)

    def teardown(self, trainer, pl_module, stage):
        end_lightnings_process_group()

    def on_fit_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        record = {
            "pid": os.getpid(),
            "caller_mark": CALLER_MARK,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "current_epoch": trainer.current_epoch,
            "callback_metrics": floats(trainer.callback_metrics),
            "logged_metrics": floats(trainer.logged_metrics),
            "checkpoint": checkpoint_state(trainer.checkpoint_callback, self.root),
            "weights": weights(pl_module),
        }
        Path(self.path).write_text(json.dumps(record, indent=1))


def end_lightnings_process_group():
    """Lightning leaves its gloo group to the interpreter's exit, where a spawned rank can abort ("terminate called
    without an active exception", SIGABRT: the call fails with ProcessExitedException): ended here in each started
    rank, as a script's last line would (``tests/ddp/train_script.py`` does the same). GPUlayer's started ranks
    end without that teardown (``_exit`` in gpulayer/runtime/started.py)."""
    if FRAMEWORK == "lightning" and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def floats(metrics):
    return {key: float(value) for key, value in sorted(metrics.items())}


def weights(module):
    return {key: value.tolist() for key, value in module.state_dict().items()}


def relative(path, root):
    return os.path.relpath(path, root) if path else path


def number(value):
    return None if value is None else float(value)


def checkpoint_state(callback, root):
    return {
        "best_model_path": relative(callback.best_model_path, root),
        "best_model_score": number(callback.best_model_score),
        "best_k_models": {relative(path, root): float(score) for path, score in sorted(callback.best_k_models.items())},
        "kth_best_model_path": relative(callback.kth_best_model_path, root),
        "kth_value": number(callback.kth_value),
        "last_model_path": relative(callback.last_model_path, root),
    }


def state(trainer):
    return {name: getattr(getattr(trainer.state, name), "value", None) for name in ("fn", "status", "stage")}


def caller(trainer, module, root):
    """What the caller's Trainer, module and checkpoint callback hold now."""
    return {
        "state": state(trainer),
        "weights": weights(module),
        "callback_metrics": floats(trainer.callback_metrics),
        "logged_metrics": floats(trainer.logged_metrics),
        "global_step": trainer.global_step,
        "current_epoch": trainer.current_epoch,
        "checkpoint": checkpoint_state(trainer.checkpoint_callback, root),
    }


def returned_value(value):
    if value is None:
        return None
    return [floats(metrics) for metrics in value]


def refusal(trainer, call):
    """The error ``call`` raises (its type's names, its message), and after it the caller's ``trainer.state`` and
    what the caller's ``Recorder.on_exception`` has seen so far."""
    try:
        call()
    except Exception as error:
        raised = {"types": [cls.__name__ for cls in type(error).__mro__], "message": str(error)}
    else:
        raised = None
    if trainer is None:
        return {"raised": raised}
    seen = [list(callback.exceptions) for callback in trainer.callbacks if isinstance(callback, Recorder)]
    return {"raised": raised, "state": state(trainer), "on_exception": seen}


TRUE_WEIGHT = torch.randn(4, 2, generator=torch.Generator().manual_seed(98))


def loader(size, offset, shuffle=False):
    generator = torch.Generator().manual_seed(99 + offset)
    x = torch.randn(size, 4, generator=generator)
    y = x @ TRUE_WEIGHT + 0.1 * torch.randn(size, 2, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=shuffle)


STAGES = ("fit", "validate", "test", "predict")


def new_trainer(strategy, root, recorded):
    return fw.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=3,
        log_every_n_steps=2,
        default_root_dir=str(root),
        logger=CSVLogger(save_dir=str(root)),  # Lightning's default is TensorBoard's where that is installed
        callbacks=[
            ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True),
            Recorder(str(recorded), str(root)),
        ],
        **FRAMEWORK_OPTIONS,
    )


def stages(strategy, call):
    """Every entry point on the first call; the second call under ddp_spawn fits only (each spawned entry point starts
    two interpreters that import torch and the trainer: seconds each)."""
    return ("fit",) if call and strategy == "ddp_spawn" else STAGES


def one_call(strategy, call, out, stages=STAGES, refusals=False):
    """A new Trainer (seeded first) running ``stages`` in turn; ``refusals``: then a second fit, and a predict with
    ``return_predictions=True``."""
    root, recorded = out / strategy, out / f"worker-{strategy}-{call}.json"
    fw.seed_everything(SEED, verbose=False)
    model = Model()
    trainer = new_trainer(strategy, root, recorded)
    record = {"initial": caller(trainer, model, root), "seconds": {}}
    data = {"fit": (loader(32, 0, shuffle=True), loader(16, 1)), "validate": (loader(16, 1),)}
    data |= {"test": (loader(16, 2),), "predict": (loader(12, 3),)}
    for stage in stages:
        started = time.monotonic()
        returned = getattr(trainer, stage)(model, *data[stage])
        record["seconds"][stage] = time.monotonic() - started
        record[stage] = {**caller(trainer, model, root), "returned": returned_value(returned)}
        if stage == "fit":
            record["worker"] = json.loads(recorded.read_text())
    if refusals:  # Lightning refuses return_predictions=True in its started ranks, after starting them
        started = time.monotonic()
        record["refusals"] = {
            "return_predictions": refusal(
                trainer, lambda: trainer.predict(model, *data["predict"], return_predictions=True)
            ),
            "second_fit": refusal(trainer, lambda: trainer.fit(model, *data["fit"])),
        }
        record["seconds"]["refusals"] = time.monotonic() - started
    record["strategy"] = {  # how each framework names what it chose (not compared between them)
        "class": type(trainer.strategy).__name__,
        "start_method": getattr(trainer.strategy, "_start_method", getattr(trainer.strategy, "start_method", None)),
    }
    return record


def interactive(out):
    """At a Python prompt: ``ddp_spawn`` refused when the Trainer is made, and ``"auto"`` with 2 devices fitting in
    2 started ranks."""
    record = {"interactive": bool(getattr(sys, "ps1", None)) or bool(sys.flags.interactive)}
    record["ddp_spawn"] = refusal(None, lambda: new_trainer("ddp_spawn", out / "ddp_spawn", out / "unused.json"))
    record["auto"] = one_call("auto", 0, out, stages=("fit",))
    return record


def files(root):
    """Every file under ``root`` (relative), and each metrics.csv as rows of strings."""
    found = sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
    tables = {}
    for name in found:
        if name.endswith("metrics.csv"):
            with open(root / name, newline="") as table:
                tables[name] = list(csv.DictReader(table))
    return {"files": found, "metrics": tables}


def main():
    global CALLER_MARK
    out, strategies = Path(sys.argv[2]), sys.argv[3:]
    out.mkdir(parents=True, exist_ok=True)
    CALLER_MARK = os.getpid()
    result = {"caller_pid": CALLER_MARK}
    if strategies == ["interactive"]:
        result |= interactive(out)
    for strategy in () if strategies == ["interactive"] else strategies:
        calls = [one_call(strategy, call, out, stages(strategy, call), refusals=call == 0) for call in range(CALLS)]
        result[strategy] = {"calls": calls, **files(out / strategy)}
    (out / "record.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
