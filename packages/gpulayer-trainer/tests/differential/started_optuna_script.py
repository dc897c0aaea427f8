"""The shape of Optuna's Lightning DDP example (optuna-examples ``pytorch/pytorch_lightning_ddp.py``), small: a study
on RDB storage (a SQLite file, which the started ranks reach) whose objective builds an MLP from the trial's
suggestions, fits it with ``Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu")`` and optuna-integration's
``PyTorchLightningPruningCallback`` watching ``val_acc``, calls ``callback.check_pruned()`` and returns
``trainer.callback_metrics["val_acc"].item()``. Data: scikit-learn's bundled digits (no download).

    python started_optuna_script.py FRAMEWORK OUT

A pruner prunes the second trial once it has reported epoch 1. Writes ``OUT/record.json``: each trial's number,
state, params, value, intermediate values and the pruning callback's system attributes (``ddp_pl:*``: what rank 0
of the started ranks stored), and the keys of ``trainer.callback_metrics`` after each fit.

The framework comes from ``sys.argv[1]`` at import: a spawned rank imports this file again (as ``__mp_main__``,
with the caller's ``sys.argv``) to find the module, data module and pruner classes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import torch
from optuna_integration import PyTorchLightningPruningCallback
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = sys.argv[1] if len(sys.argv) > 1 else ""
if FRAMEWORK == "lightning":
    import lightning.pytorch as fw

    Module, DataModule, Callback = fw.LightningModule, fw.LightningDataModule, fw.Callback
    FRAMEWORK_OPTIONS = {"enable_progress_bar": False, "enable_model_summary": False}
elif FRAMEWORK == "gpulayer":
    import gpulayer.trainer as fw

    Module, DataModule, Callback = fw.Module, fw.DataModule, fw.Callback
    FRAMEWORK_OPTIONS = {}
else:
    raise SystemExit("usage: started_optuna_script.py lightning|gpulayer OUT")

SEED = 1234
EPOCHS = 3
TRIALS = 2
BATCH_SIZE = 32
CLASSES = 10


class Net(nn.Module):
    def __init__(self, dropout: float, output_dims: list[int]):
        super().__init__()
        layers: list[nn.Module] = []
        input_dim = 64
        for output_dim in output_dims:
            layers += [nn.Linear(input_dim, output_dim), nn.ReLU(), nn.Dropout(dropout)]
            input_dim = output_dim
        layers.append(nn.Linear(input_dim, CLASSES))
        self.layers = nn.Sequential(*layers)

    def forward(self, data):
        return F.log_softmax(self.layers(data), dim=1)


class LightningNet(Module):
    def __init__(self, dropout: float, output_dims: list[int]):
        super().__init__()
        self.model = Net(dropout, output_dims)

    def forward(self, data):
        return self.model(data)

    def training_step(self, batch, batch_idx):
        data, target = batch
        return F.nll_loss(self(data), target)

    def validation_step(self, batch, batch_idx):
        data, target = batch
        pred = self(data).argmax(dim=1, keepdim=True)
        accuracy = pred.eq(target.view_as(pred)).float().mean()
        self.log("val_acc", accuracy, sync_dist=True)
        self.log("hp_metric", accuracy, on_step=False, on_epoch=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.model.parameters())


class DigitsDataModule(DataModule):
    """Scikit-learn's 8x8 digits, scaled to [0, 1]: 512 samples to train on, 128 to validate."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        from sklearn.datasets import load_digits

        digits = load_digits()
        data = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        target = torch.tensor(digits.target, dtype=torch.long)
        self.train = TensorDataset(data[:512], target[:512])
        self.val = TensorDataset(data[512:640], target[512:640])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


class EndsLightningsProcessGroup(Callback):
    """Lightning leaves its gloo group to the interpreter's exit, where a spawned rank can abort ("terminate called
    without an active exception", SIGABRT: fit fails with ProcessExitedException): ended at teardown in each started
    rank, as a script's last line would (``tests/ddp/train_script.py`` does the same). GPUlayer's started ranks
    end without that teardown (``_exit`` in gpulayer/runtime/started.py)."""

    def teardown(self, trainer, pl_module, stage):
        if FRAMEWORK == "lightning" and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class SecondTrialAfterEpochOne(optuna.pruners.BasePruner):
    """Prunes the second trial once it has reported epoch 1 (asked on rank 0 of the started ranks)."""

    def prune(self, study, trial):
        return trial.number == 1 and trial.last_step is not None and trial.last_step >= 1


def objective(trial, root: Path, seen: list):
    n_layers = trial.suggest_int("n_layers", 1, 2)
    dropout = trial.suggest_float("dropout", 0.2, 0.5)
    output_dims = [trial.suggest_int(f"n_units_l{i}", 4, 32, log=True) for i in range(n_layers)]
    fw.seed_everything(SEED + trial.number, verbose=False)
    model = LightningNet(dropout, output_dims)
    datamodule = DigitsDataModule(batch_size=BATCH_SIZE)
    callback = PyTorchLightningPruningCallback(trial, monitor="val_acc")
    trainer = fw.Trainer(
        logger=True,
        enable_checkpointing=False,
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=2,
        callbacks=[callback, EndsLightningsProcessGroup()],
        strategy="ddp_spawn",
        default_root_dir=str(root),
        **FRAMEWORK_OPTIONS,
    )
    trainer.logger.log_hyperparams(dict(n_layers=n_layers, dropout=dropout, output_dims=output_dims))
    trainer.fit(model, datamodule=datamodule)
    seen.append(sorted(trainer.callback_metrics))
    callback.check_pruned()
    return trainer.callback_metrics["val_acc"].item()


def main():
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name="pl_ddp",
        storage=f"sqlite:///{out / 'example.db'}",
        direction="maximize",
        pruner=SecondTrialAfterEpochOne(),
        sampler=optuna.samplers.RandomSampler(seed=0),
        load_if_exists=True,
    )
    seen: list = []
    study.optimize(lambda trial: objective(trial, out / "logs", seen), n_trials=TRIALS)
    trials = [
        {
            "number": trial.number,
            "state": trial.state.name,
            "params": trial.params,
            "value": trial.value,
            "intermediate_values": {str(step): value for step, value in sorted(trial.intermediate_values.items())},
            "system_attrs": {key: value for key, value in trial.system_attrs.items() if key.startswith("ddp_pl:")},
        }
        for trial in study.trials
    ]
    (out / "record.json").write_text(json.dumps({"trials": trials, "callback_metrics": seen}, indent=1))


if __name__ == "__main__":
    main()
