"""GradientAccumulationScheduler against Lightning 2.6.6 (``lightning/pytorch/callbacks/
gradient_accumulation_scheduler.py``): the same schedule under both frameworks gives the same batches stepping, the
same ``global_step``, learning rates, weights and ``metrics.csv``, and the same refusals and messages."""

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks import GradientAccumulationScheduler

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import GradientAccumulationScheduler as LightningScheduler
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(Scheduler=(LightningScheduler, GradientAccumulationScheduler))
BATCHES = 10  # per epoch: no factor used here divides it, so each epoch's last batch steps a short window


def _module(framework, *, scheduler=None, manual=False, own_step=False):
    class Regressor(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            if scheduler is None:
                return optimizer
            interval, frequency = scheduler
            lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
            config = {"scheduler": lr_scheduler, "interval": interval, "frequency": frequency}
            return {"optimizer": optimizer, "lr_scheduler": config}

        if own_step:

            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
                optimizer.step(closure=optimizer_closure)

    return Regressor()


def _probe(framework):
    """Records, after each batch, where it was, the step count, the window and the learning rate."""

    class Probe(framework.Callback):
        def __init__(self):
            self.trace = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            point = (trainer.current_epoch, batch_idx, trainer.global_step, trainer.accumulate_grad_batches, lr)
            self.trace.append(point)

    return Probe()


def _loader(samples):
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 4, generator=generator), torch.randn(samples, 1, generator=generator))
    return DataLoader(data, batch_size=2)


def _fit(name, root, scheduling, *, scheduler=None, trainer=None, ckpt_path=None, save=False):
    framework = FRAMEWORKS[name]
    probe = _probe(framework)
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 4,
        "log_every_n_steps": 2,
        "logger": framework.CSVLogger(root / name),
        "enable_checkpointing": False,
        "default_root_dir": root / name,
        "callbacks": [framework.Scheduler(dict(scheduling)), probe],
    }
    model = _module(framework, scheduler=scheduler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        run.fit(model, _loader(2 * BATCHES), _loader(4), ckpt_path=ckpt_path)
    if save:
        run.save_checkpoint(root / f"{name}.ckpt")
    return {
        "global_step": run.global_step,
        "current_epoch": run.current_epoch,
        "accumulate_grad_batches": run.accumulate_grad_batches,
        "trace": probe.trace,
        "weights": {key: value.tolist() for key, value in model.state_dict().items()},
        "metrics.csv": (root / name / "lightning_logs" / "version_0" / "metrics.csv").read_text(),
    }


def _both(tmp_path, scheduling, **kwargs):
    expected = _fit("lightning", tmp_path, scheduling, **kwargs)
    actual = _fit("gpulayer", tmp_path, scheduling, **kwargs)
    assert actual == expected
    return actual


@pytest.mark.parametrize(
    ("scheduling", "scheduler", "steps"),
    [
        pytest.param({1: 2}, None, 10 + 3 * 5, id="from-epoch-1"),
        pytest.param({0: 3, 2: 1}, None, 2 * 4 + 2 * 10, id="from-3-back-to-1"),
        pytest.param({1: 4, 2: 3, 3: 1}, ("step", 1), 10 + 3 + 4 + 10, id="step-scheduler"),
        pytest.param({2: 3}, ("step", 2), 2 * 10 + 2 * 4, id="step-scheduler-every-2"),
        pytest.param({0: 2, 1: 4}, ("epoch", 1), 5 + 3 * 3, id="epoch-scheduler"),
        pytest.param({0: 1}, None, 40, id="never-accumulates"),
    ],
)
def test_the_same_steps_weights_and_metrics_as_lightning(tmp_path, scheduling, scheduler, steps):
    result = _both(tmp_path, scheduling, scheduler=scheduler)
    assert result["global_step"] == steps


def test_max_steps_and_val_check_interval_follow_the_changed_window(tmp_path):
    result = _both(tmp_path, {1: 3}, trainer={"max_steps": 14, "val_check_interval": 4})
    assert result["global_step"] == 14


def test_a_resumed_run_applies_the_schedule_from_its_epoch(tmp_path):
    """Saved after 2 epochs, resumed to 4: the schedule of epochs 2 and 3 applies as in an unbroken run."""
    scheduling = {1: 2, 3: 3}
    unbroken = _both(tmp_path / "unbroken", scheduling)
    _both(tmp_path, scheduling, trainer={"max_epochs": 2}, save=True)
    resumed = {}
    for name in FRAMEWORKS:
        ckpt_path = tmp_path / f"{name}.ckpt"
        resumed[name] = _fit(name, tmp_path / "resumed", scheduling, ckpt_path=ckpt_path)
    for name in FRAMEWORKS:
        del resumed[name]["metrics.csv"]  # a resumed run's rows start at the checkpoint
    assert resumed["gpulayer"] == resumed["lightning"]
    assert resumed["gpulayer"]["weights"] == unbroken["weights"]
    assert resumed["gpulayer"]["global_step"] == unbroken["global_step"] == 10 + 5 + 5 + 4


@pytest.mark.parametrize(
    "scheduling",
    [{}, {-1: 2}, {"1": 2}, {1.0: 2}, {1: 0}, {1: 1.5}, {0: 2, 3: -4}],
    ids=str,
)
def test_a_bad_schedule_is_refused_with_lightnings_error(scheduling):
    with pytest.raises((TypeError, MisconfigurationException)) as theirs:
        LightningScheduler(dict(scheduling))
    with pytest.raises((TypeError, ValueError)) as ours:
        GradientAccumulationScheduler(dict(scheduling))
    assert str(ours.value) == str(theirs.value)
    if isinstance(theirs.value, MisconfigurationException):
        assert isinstance(ours.value, gl.MisconfigurationException)
    else:
        assert type(ours.value) is type(theirs.value) is TypeError


def test_the_schedule_reads_as_lightnings():
    for scheduling in ({4: 2}, {0: 3, 2: 1, 5: 4}, {3: 1}):
        theirs, ours = LightningScheduler(dict(scheduling)), GradientAccumulationScheduler(scheduling)
        assert (ours.scheduling, ours.epochs) == (theirs.scheduling, theirs.epochs)
        assert ours.going_to_accumulate_grad_batches() == theirs.going_to_accumulate_grad_batches()
        factors = [ours.get_accumulate_grad_batches(epoch) for epoch in range(8)]
        assert factors == [theirs.get_accumulate_grad_batches(epoch) for epoch in range(8)]
    given = {4: 2}
    GradientAccumulationScheduler(given)
    assert given == {4: 2}  # Lightning adds {0: 1} to the dict it is given; GPUlayer leaves it alone


def _refusal(name, root, *, trainer=None, module=None):
    framework = FRAMEWORKS[name]
    options = {"accelerator": "cpu", "max_epochs": 1, "logger": False, "enable_checkpointing": False}
    options |= {"default_root_dir": root, "callbacks": [framework.Scheduler({1: 2})]}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = framework.Trainer(**options | framework.options | (trainer or {}))
        try:
            run.fit(_module(framework, **(module or {})), _loader(8))
            raised = None
        except Exception as error:  # compared below, type and message
            raised = (type(error).__name__, str(error))
    messages = [str(w.message) for w in caught if "optimizer_{step,zero_grad}" in str(w.message)]
    return raised, messages, run.global_step


@pytest.mark.parametrize(
    ("trainer", "module", "refused"),
    [
        pytest.param({}, {"manual": True}, "RuntimeError", id="manual-optimization"),
        pytest.param({"accumulate_grad_batches": 2}, {}, "ValueError", id="trainer-accumulate-grad-batches"),
        pytest.param({}, {"own_step": True}, None, id="own-optimizer-step-warns"),
    ],
)
def test_lightnings_refusals_and_warning(tmp_path, trainer, module, refused):
    theirs = _refusal("lightning", tmp_path / "lightning", trainer=trainer, module=module)
    ours = _refusal("gpulayer", tmp_path / "gpulayer", trainer=trainer, module=module)
    assert ours == theirs
    assert (ours[0] or (None,))[0] == refused
    assert len(ours[1]) == (1 if refused is None else 0)


def test_the_trainers_window_set_by_hand_trains_and_refuses_as_lightnings(tmp_path):
    """``trainer.accumulate_grad_batches = 4`` before ``fit``: 3 steps in a 10-batch epoch, the same weights; it
    carries over, so a manual-optimization ``fit`` on that Trainer is refused, as Lightning refuses it."""
    results = {}
    for name, framework in FRAMEWORKS.items():
        options = {"accelerator": "cpu", "max_epochs": 1, "logger": False, "enable_checkpointing": False}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = framework.Trainer(**options | framework.options | {"default_root_dir": tmp_path / name})
            trainer.accumulate_grad_batches = 4
            model = _module(framework)
            trainer.fit(model, _loader(2 * BATCHES))
            weights = {key: value.tolist() for key, value in model.state_dict().items()}
            results[name] = (trainer.global_step, trainer.accumulate_grad_batches, weights)
            with pytest.raises(MisconfigurationException if name == "lightning" else ValueError) as refused:
                trainer.fit(_module(framework, manual=True), _loader(2 * BATCHES))
        assert "accumulate_grad_batches" in str(refused.value)
    assert results["gpulayer"] == results["lightning"]
    assert results["gpulayer"][:2] == (3, 4)
    with pytest.raises(ValueError, match="accumulate_grad_batches=0"):
        trainer.accumulate_grad_batches = 0
