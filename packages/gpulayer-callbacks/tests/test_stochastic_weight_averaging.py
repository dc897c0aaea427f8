"""StochasticWeightAveraging against Lightning 2.6.6 (``lightning/pytorch/callbacks/stochastic_weight_avg.py``): the
same run under both frameworks gives the same learning rate at every batch, the same averaged weights, batch norm
statistics, counters, callback state and checkpoint, a resumed run the same result, and the same refusals.

One difference, on purpose: in the batch-norm epoch Lightning 2.6 still steps the optimizer once, at the epoch's last
batch, with the gradients the last backward left, which moves the weights off the average and
counts a step. GPUlayer steps nothing there, so its module ends with exactly the weights Lightning's callback
averaged (``_average_model``), one ``global_step`` fewer; the running statistics, computed before that step, are
equal."""

import contextlib
import logging
import os
import re
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks.stochastic_weight_averaging import StochasticWeightAveraging
from gpulayer.runtime.testing import run_ranks

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import StochasticWeightAveraging as LightningSWA
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(SWA=(LightningSWA, StochasticWeightAveraging))
LOGGERS = {"lightning": "lightning.pytorch.utilities.rank_zero", "gpulayer": "gpulayer.callbacks"}
EPOCHS = 4


def _module(framework, *, bn=False, scheduler=None, groups=False, optimizers=1):
    class Regressor(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.inner = torch.nn.Linear(4, 3)
            self.norm = torch.nn.BatchNorm1d(3) if bn else torch.nn.Identity()
            self.outer = torch.nn.Linear(3, 1)
            self.automatic_optimization = optimizers == 1

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.outer(torch.relu(self.norm(self.inner(x)))), y)
            if optimizers == 1:
                return loss
            for optimizer in self.optimizers():
                optimizer.zero_grad()
            self.manual_backward(loss)
            for optimizer in self.optimizers():
                optimizer.step()

        def configure_optimizers(self):
            params = [{"params": self.inner.parameters()}, {"params": self.outer.parameters(), "lr": 0.05}]
            optimizer = torch.optim.SGD(params if groups else self.parameters(), lr=0.1, momentum=0.9)
            if optimizers == 2:
                return [optimizer, torch.optim.SGD(self.parameters(), lr=0.1)]
            if scheduler is None:
                return optimizer
            interval, count = scheduler
            configs = [
                {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.8), "interval": interval}
                for _ in range(count)
            ]
            return [optimizer], configs

    return Regressor()


def _loader(samples=12, batch_size=4):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=batch_size)


def _probe(framework, save_at=None, path=None):
    """Records the learning rate and counters after each batch; saves a checkpoint at ``save_at``: an
    ``(epoch, batch_idx)`` after that batch, or an epoch at its end."""

    class Probe(framework.Callback):
        def __init__(self):
            self.trace = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            lrs = [group["lr"] for group in trainer.optimizers[0].param_groups]
            configs = trainer.lr_scheduler_configs
            scheduler = type(configs[-1].scheduler).__name__ if configs else None
            point = (trainer.current_epoch, batch_idx, trainer.global_step, trainer.accumulate_grad_batches, lrs)
            self.trace.append((*point, trainer.max_epochs, scheduler))
            if (trainer.current_epoch, batch_idx) == save_at:
                trainer.save_checkpoint(path)

        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == save_at:
                trainer.save_checkpoint(path)

    return Probe()


def _state(module):
    return {key: value.tolist() for key, value in module.state_dict().items()}


def _fit(name, root, swa, *, module=None, trainer=None, ckpt_path=None, save_at=None, caplog=None):
    framework = FRAMEWORKS[name]
    root.mkdir(parents=True, exist_ok=True)
    probe = _probe(framework, save_at, root / f"{name}-saved.ckpt")
    callback = framework.SWA(**swa)
    options = {"accelerator": "cpu", "devices": 1, "max_epochs": EPOCHS, "logger": False, "default_root_dir": root}
    options |= {"enable_checkpointing": False, "callbacks": [callback, probe]}
    model = _module(framework, **(module or {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        run.fit(model, _loader(), ckpt_path=ckpt_path)
    run.save_checkpoint(root / f"{name}-end.ckpt")
    checkpoint = torch.load(root / f"{name}-end.ckpt", weights_only=False)
    state = callback.state_dict()
    return {
        "global_step": run.global_step,
        "current_epoch": run.current_epoch,
        "max_epochs": run.max_epochs,
        "accumulate_grad_batches": run.accumulate_grad_batches,
        "trace": probe.trace,
        "weights": _state(model),
        "averaged": _state(callback._average_model),
        "n_averaged": state["n_averaged"],
        "latest_update_epoch": state["latest_update_epoch"],
        "scheduler_state": state["scheduler_state"],
        "callback_keys": sorted(checkpoint["callbacks"]),
        "state_keys": sorted(checkpoint["callbacks"]["StochasticWeightAveraging"]),
        "lr_schedulers": checkpoint["lr_schedulers"],
        "momenta": [module.momentum for module in model.modules() if isinstance(module, torch.nn.BatchNorm1d)],
        "warnings": sorted(re.sub(" at 0x[0-9a-f]+", "", str(w.message)) for w in caught if "SWA" in str(w.message)),
        "swapping": [r.getMessage() for r in (caplog.records if caplog else []) if r.getMessage().startswith("Swap")],
    }


def _as_intended(lightning, gpulayer):
    """Lightning's result without its stray optimizer step in the batch-norm epoch (the module docstring)."""
    expected = dict(lightning)
    if lightning["current_epoch"] > lightning["max_epochs"]:  # a batch-norm epoch ran
        params = {key for key in gpulayer["weights"] if "running" not in key and "num_batches" not in key}
        expected["weights"] = {
            k: lightning["averaged"][k] if k in params else v for k, v in lightning["weights"].items()
        }
        expected["global_step"] -= 1
        *before, last = lightning["trace"]
        expected["trace"] = [*before, (*last[:2], last[2] - 1, *last[3:])]
    return expected


def _both(tmp_path, swa, caplog=None, **kwargs):
    results = {}
    for name in FRAMEWORKS:
        if caplog is not None:
            caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGERS[name]) if caplog else contextlib.nullcontext():
            results[name] = _fit(name, tmp_path / name, swa, caplog=caplog, **kwargs)
    assert results["gpulayer"] == _as_intended(results["lightning"], results["gpulayer"])
    return results["gpulayer"]


def _weighted_average(averaged, current, n_averaged):
    return 0.25 * averaged + 0.75 * current


@pytest.mark.parametrize(
    ("swa", "module", "steps"),
    [
        pytest.param({"swa_lrs": 0.05, "swa_epoch_start": 2}, {}, 12, id="int-start-cos"),
        pytest.param(
            {"swa_lrs": 0.05, "swa_epoch_start": 0.5, "annealing_strategy": "linear"},
            {"bn": True},
            12,
            id="float-start-linear-batchnorm",
        ),
        pytest.param(
            {"swa_lrs": [0.02, 0.01], "swa_epoch_start": 3, "annealing_epochs": 1, "avg_fn": _weighted_average},
            {"bn": True, "groups": True},
            12,
            id="avg-fn-groups-batchnorm",
        ),
    ],
)
def test_the_same_averaged_weights_learning_rates_and_state_as_lightning(tmp_path, swa, module, steps):
    result = _both(tmp_path, swa, module=module)
    assert result["global_step"] == steps
    buffers = {k: v for k, v in result["weights"].items() if "running" in k or "num_batches" in k}
    assert result["weights"] == result["averaged"] | buffers
    assert result["state_keys"] == ["average_model_state", "latest_update_epoch", "n_averaged", "scheduler_state"]
    assert result["max_epochs"] == EPOCHS and result["current_epoch"] == EPOCHS + bool(module.get("bn"))


@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_the_fits_scheduler_is_swapped_for_swalr_with_lightnings_warning(tmp_path, caplog, interval):
    result = _both(tmp_path, {"swa_lrs": 0.05, "swa_epoch_start": 2}, caplog, module={"scheduler": (interval, 1)})
    assert result["swapping"] == ["Swapping scheduler `StepLR` for `SWALR`"]
    assert len(result["warnings"]) == (interval == "step")
    assert [point[-1] for point in result["trace"][:3]] == ["StepLR"] * 3
    assert {point[-1] for point in result["trace"][3:]} == {"SWALR"}


@pytest.mark.parametrize("save_at", [2, (2, 1)], ids=["epoch-end", "mid-epoch"])
def test_a_run_resumed_inside_the_window_ends_as_lightnings(tmp_path, save_at):
    """Saved in epoch 2 (averaging from epoch 1, a batch norm epoch to come), resumed to the end.

    From the epoch's end: the same as Lightning's resumed run, and as the unbroken run. From inside the epoch:
    Lightning trains that epoch's first batches again (a deliberate difference of GPUlayer's resume, ADR 0008), so
    weights are not compared; the counters, learning rates, SWA state and scheduler are, and in both the swapped
    scheduler is not stepped at the resumed epoch's end (SWALR is built again only as the next epoch starts)."""
    swa = {"swa_lrs": 0.05, "swa_epoch_start": 2}
    module = {"bn": True, "scheduler": ("epoch", 1)}
    unbroken = _both(tmp_path / "unbroken", swa, module=module, save_at=save_at)
    resumed = {}
    for name in FRAMEWORKS:
        path = tmp_path / "unbroken" / name / f"{name}-saved.ckpt"
        resumed[name] = _fit(name, tmp_path / "resumed" / name, swa, module=module, ckpt_path=path)
    ours, theirs = resumed["gpulayer"], _as_intended(resumed["lightning"], resumed["gpulayer"])
    assert ours["n_averaged"] == 3
    if save_at == 2:
        assert ours == theirs
        assert ours["trace"] == unbroken["trace"][-len(ours["trace"]) :]  # the epochs after the save, as unbroken
        assert ours | {"trace": unbroken["trace"]} == unbroken
    else:
        assert ours | {"weights": None, "averaged": None} == theirs | {"weights": None, "averaged": None}
        lrs = [point[4] for point in ours["trace"]]
        assert lrs[0] == lrs[1] != unbroken["trace"][-len(lrs) + 1][4]  # epoch 2's last batch, then epoch 3's first


@pytest.mark.parametrize(
    "arguments",
    [
        {"swa_lrs": 0.1, "swa_epoch_start": 0},
        {"swa_lrs": 0.1, "swa_epoch_start": 1.5},
        {"swa_lrs": 1},
        {"swa_lrs": -0.1},
        {"swa_lrs": [0.1, 0]},
        {"swa_lrs": 0.1, "avg_fn": 3},
        {"swa_lrs": 0.1, "device": 0},
    ],
    ids=str,
)
def test_bad_arguments_are_refused_with_lightnings_messages(arguments):
    with pytest.raises(MisconfigurationException) as theirs:
        LightningSWA(**arguments)
    with pytest.raises(gl.MisconfigurationException) as ours:
        StochasticWeightAveraging(**arguments)
    assert str(ours.value) == str(theirs.value)


def test_annealing_arguments_are_refused_at_construction_with_swalrs_messages():
    with pytest.raises(ValueError, match="anneal_strategy must be one of 'cos' or 'linear', instead got cosine"):
        StochasticWeightAveraging(0.1, annealing_strategy="cosine")
    with pytest.raises(ValueError, match="anneal_epochs must be equal or greater than 0, got -1"):
        StochasticWeightAveraging(0.1, annealing_epochs=-1)


@pytest.mark.parametrize(
    ("module", "trainer"),
    [
        pytest.param({"optimizers": 2}, {}, id="two-optimizers"),
        pytest.param({"scheduler": ("epoch", 2)}, {}, id="two-schedulers"),
        pytest.param({}, {"max_epochs": -1, "max_steps": 5}, id="float-start-without-max-epochs"),
    ],
)
def test_lightnings_refusals_at_fit_start(tmp_path, module, trainer):
    raised = {}
    for name, framework in FRAMEWORKS.items():
        options = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "default_root_dir": tmp_path}
        options |= {"max_epochs": 2, "callbacks": [framework.SWA(0.05, swa_epoch_start=0.5)]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = framework.Trainer(**options | framework.options | trainer)
            with pytest.raises(MisconfigurationException if name == "lightning" else gl.MisconfigurationException) as e:
                run.fit(_module(framework, **module), _loader())
        raised[name] = str(e.value)
    assert raised["gpulayer"] == raised["lightning"]


def _two_ranks(runtime, root):
    """The same 2-rank fit of a batch norm model under GPUlayer, then Lightning (which finds the harness's process
    group and this rank in the launcher's variables): parameters, buffers and Lightning's average."""
    rank = runtime.global_rank
    results = {}
    for name in ("gpulayer", "lightning"):  # GPUlayer's first: the variables set for Lightning would mislead it
        framework = FRAMEWORKS[name]
        if name == "lightning":
            os.environ |= {"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": "2"}
        callback = framework.SWA(swa_lrs=0.05, swa_epoch_start=2)
        options = {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_epochs": 3, "logger": False}
        options |= {"enable_checkpointing": False, "default_root_dir": f"{root}/{name}", "callbacks": [callback]}
        model = _module(framework, bn=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = framework.Trainer(**options | framework.options)
            run.fit(model, _loader(samples=24))
        results[name] = (run.global_step, _state(model), _state(callback._average_model))
    return results


@pytest.mark.multiprocess
def test_two_ranks_end_with_the_same_average_as_lightnings_ddp(tmp_path):
    ranks = run_ranks(_two_ranks, str(tmp_path), world_size=2, timeout=240)
    for results in ranks:
        (step, weights, averaged), (their_step, their_weights, their_averaged) = (
            results["gpulayer"],
            results["lightning"],
        )
        assert step == their_step - 1 == 9  # 3 steps per epoch per rank; Lightning's stray step in the batch norm epoch
        assert averaged == their_averaged
        buffers = {k: v for k, v in weights.items() if "running" in k or "num_batches" in k}
        assert weights == averaged | buffers
        assert buffers == {k: v for k, v in their_weights.items() if k in buffers}  # each rank's own pass
    params = {k: v for k, v in ranks[0]["gpulayer"][1].items() if "running" not in k and "num_batches" not in k}
    assert params == {k: v for k, v in ranks[1]["gpulayer"][1].items() if k in params}


def _under_fsdp(runtime, root):
    callback = StochasticWeightAveraging(swa_lrs=0.05)
    options = {"accelerator": "cpu", "devices": 2, "strategy": "fsdp", "max_epochs": 1, "logger": False}
    run = gl.Trainer(**options, enable_checkpointing=False, default_root_dir=root, callbacks=[callback])
    try:
        run.fit(_module(FRAMEWORKS["gpulayer"]), _loader())
    except gl.MisconfigurationException as error:
        return str(error)


@pytest.mark.multiprocess
def test_sharded_models_are_refused_as_lightning_refuses_them(tmp_path):
    pytest.importorskip("gpulayer.fsdp")
    refused = run_ranks(_under_fsdp, str(tmp_path), world_size=2, timeout=120)
    assert refused == ["SWA does not currently support sharded models."] * 2
