"""Manual optimization against Lightning 2.6: a two-optimizer GAN that toggles, clips and steps its schedulers by
hand ends with Lightning's weights, ``global_step`` (one per ``opt.step()``), hook order and metrics; the same
misuse is refused; a checkpoint holds both optimizers and schedulers, resumes mid-epoch exactly, and loads in
Lightning."""

import warnings

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning


def _base(framework):
    return gl.Module if framework is gl else framework.LightningModule


def _gan_class(base):
    class GAN(base):
        """A generator of 2-D points and a discriminator, each with its optimizer and a scheduler stepped by hand
        at each epoch's last batch; the discriminator's gradients are clipped."""

        def __init__(self, returns="nothing", form="lists"):
            super().__init__()
            self.form = form
            self.automatic_optimization = False
            self.generator = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
            self.discriminator = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
            self.returns = returns
            self.events = []

        def training_step(self, batch, batch_idx):
            real = batch[0]
            generator_optimizer, discriminator_optimizer = self.optimizers()
            with self.toggled_optimizer(generator_optimizer):
                fake = self.generator(torch.randn(real.shape[0], 4, device=real.device))
                generator_loss = F.binary_cross_entropy_with_logits(
                    self.discriminator(fake), torch.ones(real.shape[0], 1, device=real.device)
                )
                generator_optimizer.zero_grad()
                self.manual_backward(generator_loss)
                generator_optimizer.step()
            self.toggle_optimizer(discriminator_optimizer)
            real_score, fake_score = self.discriminator(real), self.discriminator(fake.detach())
            discriminator_loss = (
                F.binary_cross_entropy_with_logits(real_score, torch.ones_like(real_score))
                + F.binary_cross_entropy_with_logits(fake_score, torch.zeros_like(fake_score))
            ) / 2
            discriminator_optimizer.zero_grad()
            self.manual_backward(discriminator_loss)
            self.clip_gradients(discriminator_optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            discriminator_optimizer.step()
            self.untoggle_optimizer(discriminator_optimizer)
            if self.trainer.is_last_batch:
                for scheduler in self.lr_schedulers():
                    scheduler.step()
            self.log_dict({"g_loss": generator_loss, "d_loss": discriminator_loss}, prog_bar=True)
            self.events.append(("step", self.global_step))
            if self.returns == "loss":
                return discriminator_loss
            if self.returns == "dict":
                return {"loss": discriminator_loss, "fake": fake}
            return None

        def on_before_backward(self, loss):
            self.events.append(("before backward", loss.dtype))

        def on_after_backward(self):
            self.events.append(("after backward",))

        def on_before_optimizer_step(self, optimizer):
            self.events.append(("before optimizer step", type(optimizer).__name__))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.events.append(("outputs", sorted(outputs)))

        def configure_optimizers(self):
            generator = torch.optim.Adam(self.generator.parameters(), lr=1e-2)
            discriminator = torch.optim.SGD(self.discriminator.parameters(), lr=1e-2)
            schedulers = [
                torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (generator, discriminator)
            ]
            if self.form == "dicts":
                pairs = zip((generator, discriminator), schedulers, strict=True)
                return [{"optimizer": optimizer, "lr_scheduler": scheduler} for optimizer, scheduler in pairs]
            return [generator, discriminator], schedulers

    return GAN


def _points():
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(32, 2, generator=generator) * 0.5 + 1), batch_size=8)


def _fit(framework, root, module_options=None, **arguments):
    torch.manual_seed(0)
    model = _gan_class(_base(framework))(**(module_options or {}))
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    options = dict(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, default_root_dir=root)
    trainer = framework.Trainer(**(options | arguments), **extra)
    trainer.fit(model, _points())
    return trainer, model


def _record(trainer, model):
    return {
        "global_step": trainer.global_step,
        "events": model.events,
        "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
        "learning_rates": [optimizer.param_groups[0]["lr"] for optimizer in trainer.optimizers],
        "weights": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
    }


def _both(tmp_path, module_options=None, **arguments):
    with warnings.catch_warnings():
        theirs = _record(*_fit(quiet_lightning(), tmp_path / "lightning", module_options, **arguments))
    ours = _record(*_fit(gl, tmp_path / "gpulayer", module_options, **arguments))
    return theirs, ours


@pytest.mark.parametrize(
    ("returns", "form"), [("nothing", "lists"), ("loss", "lists"), ("dict", "lists"), ("nothing", "dicts")]
)
def test_a_two_optimizer_gan_trains_as_in_lightning(tmp_path, returns, form):
    theirs, ours = _both(tmp_path, {"returns": returns, "form": form})
    assert ours == theirs
    assert ours["global_step"] == 16  # 4 batches, 2 epochs, two optimizer steps each
    assert ours["learning_rates"] == [1e-2 / 4, 1e-2 / 4]  # stepped by hand at each epoch's end


def test_bf16_mixed_on_the_cpu_trains_as_in_lightning(tmp_path):
    theirs, ours = _both(tmp_path, precision="bf16-mixed")
    assert ours == theirs
    assert ours["weights"] != _record(*_fit(gl, tmp_path / "32-true"))["weights"]  # autocast did run


def _misuse(framework, root, case):
    base = _base(framework)
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    options = dict(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, default_root_dir=root)
    model = _gan_class(base)()
    if case == "gradient_clip_val":
        options["gradient_clip_val"] = 1.0
    elif case == "accumulate_grad_batches":
        options["accumulate_grad_batches"] = 2
    elif case == "two optimizers, automatic":
        model = _automatic(base, two_optimizers=True)
    elif case == "manual_backward, automatic":
        model = _automatic(base, manual_backward=True)
    elif case == "training_step returns a str":
        model.training_step = lambda batch, batch_idx: "loss"
    framework.Trainer(**options, **extra).fit(model, _points())


def _automatic(base, two_optimizers=False, manual_backward=False):
    class Automatic(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            if manual_backward:
                self.manual_backward(loss)
            return loss

        def configure_optimizers(self):
            first = torch.optim.SGD(self.parameters(), lr=0.1)
            return [first, torch.optim.SGD(self.parameters(), lr=0.1)] if two_optimizers else first

    return Automatic()


@pytest.mark.parametrize(
    ("case", "lightnings_type"),
    [
        ("gradient_clip_val", "MisconfigurationException"),
        ("accumulate_grad_batches", "MisconfigurationException"),
        ("two optimizers, automatic", "RuntimeError"),
        ("manual_backward, automatic", "MisconfigurationException"),
        ("training_step returns a str", "MisconfigurationException"),
    ],
)
def test_misuse_is_refused_as_lightning_refuses_it(tmp_path, case, lightnings_type):
    with warnings.catch_warnings():
        pl = quiet_lightning()
        from lightning.pytorch.utilities.exceptions import MisconfigurationException

        with pytest.raises(Exception) as theirs:
            _misuse(pl, tmp_path / "lightning", case)
    with pytest.raises(Exception) as ours:
        _misuse(gl, tmp_path / "gpulayer", case)
    ours_is, theirs_is = (
        (isinstance(ours.value, gl.MisconfigurationException), isinstance(theirs.value, MisconfigurationException))
        if lightnings_type == "MisconfigurationException"
        else (isinstance(ours.value, RuntimeError), isinstance(theirs.value, RuntimeError))
    )
    assert ours_is and theirs_is, (repr(ours.value), repr(theirs.value))


class _SavesAtStep(gl.Callback):
    def __init__(self, path, step):
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def test_a_checkpoint_holds_both_optimizers_resumes_mid_epoch_exactly_and_loads_in_lightning(tmp_path):
    path = tmp_path / "mid.ckpt"
    torch.manual_seed(0)
    unbroken = _gan_class(gl.Module)()
    options = dict(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, default_root_dir=tmp_path)
    gl.Trainer(**options, callbacks=[_SavesAtStep(path, 10)]).fit(unbroken, _points())  # epoch 1, batch 0
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["global_step"] == 10
    assert [len(state["state"]) for state in checkpoint["optimizer_states"]] == [4, 0]  # Adam's moments; plain SGD
    assert [state["last_epoch"] for state in checkpoint["lr_schedulers"]] == [1, 1]

    torch.manual_seed(1)  # the checkpoint's random states, not this seed, drive the rest of the run
    resumed = _gan_class(gl.Module)()
    trainer = gl.Trainer(**options)
    trainer.fit(resumed, _points(), ckpt_path=path)
    assert trainer.global_step == 16
    for name, tensor in unbroken.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=0, atol=0)

    with warnings.catch_warnings():
        pl = quiet_lightning()
        loaded = _gan_class(pl.LightningModule).load_from_checkpoint(path)
    ours = _gan_class(gl.Module).load_from_checkpoint(path)
    for name, tensor in ours.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)

    # And back: a Lightning checkpoint of the GAN loads in GPUlayer (its weights; resuming a fit across the two
    # trainers is not supported, the porting guide says why).
    theirs_path = tmp_path / "lightning.ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer, model = _fit(pl, tmp_path / "lightning", max_epochs=1)
        trainer.save_checkpoint(theirs_path)
    back = _gan_class(gl.Module).load_from_checkpoint(theirs_path)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_16_mixed_on_a_gpu_scales_each_step_as_lightning_does(tmp_path):
    # One GradScaler for both optimizers: each step() unscales its optimizer, steps through the scaler and updates
    # the scale, as Lightning's MixedPrecision.optimizer_step does.
    theirs, ours = _both(tmp_path, accelerator="cuda", devices=1, precision="16-mixed")
    assert (ours["global_step"], ours["events"], ours["learning_rates"]) == (
        theirs["global_step"],
        theirs["events"],
        theirs["learning_rates"],
    )
    for name, weight in theirs["weights"].items():
        torch.testing.assert_close(torch.tensor(ours["weights"][name]), torch.tensor(weight), rtol=1e-3, atol=1e-4)
