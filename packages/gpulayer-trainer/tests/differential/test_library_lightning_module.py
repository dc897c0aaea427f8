"""A library's model built on Lightning's ``LightningModule`` (pytorch-forecasting's ``DeepAR``, torchgeo's tasks) is
taken by GPUlayer's Trainer as it is: the differential harness's scenarios with the module on Lightning's class."""

import copy
import warnings

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.trainer.core.lightning_module import as_module
from gpulayer.trainer.exceptions import MisconfigurationException

from .conftest import quiet_lightning

LIBRARY_MODULE = "gpulayer, Lightning's module"

SCENARIOS = {
    "every entry point": {"stages": ("fit", "validate", "test", "predict")},
    "two val loaders, shuffled": {"val_sizes": (6, 3), "shuffle": True, "trainer": {"max_epochs": 3}},
    "accumulation and clipping": {
        "trainer": {"max_epochs": 2, "accumulate_grad_batches": 2, "gradient_clip_val": 0.05},
    },
    "bf16-mixed": {"trainer": {"max_epochs": 2, "precision": "bf16-mixed"}, "stages": ("fit", "predict")},
    "a datamodule": {"data_source": "datamodule", "stages": ("fit", "test")},
    "estimated stepping batches": {"estimate_stepping_batches": True},
    "an exception": {"module": {"training_step": None}, "expect_error": True},
}


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_every_hook_metric_and_weight_of_a_module_on_lightnings_class_as_in_lightning(run, assert_same, scenario):
    assert_same(run("lightning", **scenario), run(LIBRARY_MODULE, **scenario))


def _library_classes(pl):
    """Two models as a library ships them on Lightning's class, calling what library code calls on ``self``."""

    class ManualModel(pl.LightningModule):
        """Manual optimization with two optimizers and their schedulers: toggles, backward, clipping by hand."""

        def __init__(self, hidden=8, trace=None):
            super().__init__()
            self.save_hyperparameters(ignore="trace")
            self.automatic_optimization = False
            self.encoder = torch.nn.Linear(4, self.hparams.hidden)
            self.head = torch.nn.Linear(self.hparams.hidden, 1)
            self.trace = trace

        def forward(self, x):
            return self.head(torch.relu(self.encoder(x)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            first, second = self.optimizers()
            for optimizer in (first, second):
                self.toggle_optimizer(optimizer)
                loss = F.mse_loss(self(x), y)
                optimizer.zero_grad()
                self.manual_backward(loss)
                self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
                optimizer.step()
                self.untoggle_optimizer(optimizer)
            if self.trainer.is_last_batch:
                for scheduler in self.lr_schedulers():
                    scheduler.step()
            gathered = self.all_gather(loss.detach())
            self.log_dict({"loss": loss, "gathered": gathered.mean()}, prog_bar=True)
            self.trace.append(
                (self.device.type, self.current_epoch, self.global_step, self.hparams.hidden, self.trainer.max_epochs)
            )
            self.print("step", self.global_step)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

        def configure_optimizers(self):
            first = torch.optim.SGD(self.encoder.parameters(), lr=0.1)
            second = torch.optim.Adam(self.head.parameters(), lr=0.01)
            schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (first, second)]
            return [first, second], schedulers

    class AutomaticModel(pl.LightningModule):
        """Automatic optimization whose overrides hand on to Lightning's defaults through ``super()``."""

        def __init__(self, trace=None):
            super().__init__()
            self.save_hyperparameters(ignore="trace")
            self.layer = torch.nn.Linear(4, 1)
            self.trace = trace

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            loss = F.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", F.mse_loss(self(batch[0]), batch[1]))

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def log(self, name, value, *args, **kwargs):  # pytorch-forecasting's BaseModel overrides log this way
            self.trace.append(("log", name))
            super().log(name, value, *args, **kwargs)

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.trace.append(("clip", gradient_clip_val, gradient_clip_algorithm))
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            self.trace.append(("optimizer_step", epoch, batch_idx))
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            self.trace.append(("transfer", device.type, dataloader_idx))
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_train_end(self):
            copied = copy.deepcopy(self)  # an averaging callback's copy, made during the stage: of the library's class
            self.trace.append(("copied", [kind.__name__ for kind in type(copied).__mro__[:2]]))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9)}

    return ManualModel, AutomaticModel


def _loader(size=16):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(size, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def _fit(trainer_class, model_class, root, **arguments):
    torch.manual_seed(0)
    trace = []
    model = model_class(trace=trace)
    options = dict(accelerator="cpu", max_epochs=2, logger=False, default_root_dir=root, enable_progress_bar=False)
    trainer = trainer_class(**options, **arguments)
    trainer.fit(model, _loader(), _loader(8))
    files = sorted(path.name for path in (root / "checkpoints").iterdir())
    return (
        trainer,
        model,
        {
            "trace": trace,
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
            "weights": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
            "files": files,
        },
    )


@pytest.mark.parametrize(
    ("model", "arguments"), [(0, {}), (1, {"gradient_clip_val": 0.1})], ids=["manual", "automatic"]
)
def test_a_library_model_calls_what_it_calls_on_self_as_under_lightning(tmp_path, capsys, model, arguments):
    """Every method such a library calls on ``self`` answers as under Lightning's Trainer, its ``super()`` calls
    included; the printed lines, weights, metrics and checkpoint files are Lightning's."""
    with warnings.catch_warnings():
        pl = quiet_lightning()
        model_class = _library_classes(pl)[model]
        *_, theirs = _fit(pl.Trainer, model_class, tmp_path / "lightning", enable_model_summary=False, **arguments)
    printed_by_lightning = capsys.readouterr().out
    _, fitted, ours = _fit(gl.Trainer, model_class, tmp_path / "gpulayer", **arguments)
    assert ours == theirs
    assert capsys.readouterr().out == printed_by_lightning
    assert type(fitted) is model_class and not isinstance(fitted, gl.Module)  # its own class again after fit


def test_after_gpulayers_fit_the_model_works_where_the_library_uses_lightning(tmp_path):
    """The library's own Lightning paths after GPUlayer's fit: Lightning's Trainer predicts with the fitted object, and
    the checkpoint GPUlayer saved loads with the library class's own ``load_from_checkpoint``."""
    with warnings.catch_warnings():
        pl = quiet_lightning()
        model_class = _library_classes(pl)[1]
        _, fitted, _ = _fit(gl.Trainer, model_class, tmp_path)
        predicted = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False).predict(fitted, _loader())
        loaded = model_class.load_from_checkpoint(tmp_path / "checkpoints" / "epoch=1-step=8.ckpt", trace=[])
    expected = [fitted(batch[0]) for batch in _loader()]
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(predicted, expected, strict=True))
    for name, tensor in fitted.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


# What Lightning's LightningModule and its mixins define that stays Lightning's under GPUlayer's Trainer, with why;
# every other name they define is GPUlayer's for the length of an entry point.
KEPT_LIGHTNING = {
    "automatic_optimization": "a property over _automatic_optimization: GPUlayer's loop reads the flag through it",
    "to": "Lightning's device tracking around nn.Module's (GPUlayer's Module has nn.Module's own)",
    "cpu": "the same",
    "cuda": "the same",
    "type": "the same",
    "float": "the same",
    "double": "the same",
    "half": "the same",
    "fabric": "None: no Fabric runs the model",
    "device_mesh": "None: no model-parallel strategy made one",
    "configure_sharded_model": "a library model overriding it (deprecated in Lightning) is refused by name",
    "to_tensorrt": "export with Lightning's own code, no Trainer involved",
    "_log_dict_through_fabric": "helpers of Lightning's own methods, which GPUlayer's loop does not call",
    "_to_hparams_dict": "the same",
    "_verify_is_manual_optimization": "the same",
    "_LightningModule__check_allowed": "the same",
    "_LightningModule__check_not_nested": "the same",
    "_LightningModule__to_tensor": "the same",
}


def test_every_name_lightnings_module_defines_is_gpulayers_or_kept_for_a_stated_reason(tmp_path):
    """Walks Lightning's LightningModule classes: a name Lightning adds in a later version fails here until it is
    given GPUlayer's implementation or a reason to stay Lightning's."""
    with warnings.catch_warnings():
        pl = quiet_lightning()

    class LibraryModel(pl.LightningModule):
        def training_step(self, batch, batch_idx):
            return None

    seen, model = set(), LibraryModel()
    with as_module(model):
        order = type(model).__mro__
        for lightning_class in pl.LightningModule.__mro__[:-2]:  # without nn.Module and object
            for name in vars(lightning_class):
                if name.startswith("__") and name not in ("__getstate__", "__jit_unused_properties__"):
                    continue
                seen.add(name)
                owner = next(kind for kind in order if name in vars(kind))
                from_lightning = owner.__module__.startswith("lightning.")
                assert from_lightning == (name in KEPT_LIGHTNING), f"{name}: {owner.__module__}.{owner.__name__}"
    assert set(KEPT_LIGHTNING) <= seen, "names kept that Lightning no longer defines"
    assert type(model) is LibraryModel


def test_a_library_model_overriding_configure_sharded_model_is_refused_by_name():
    with warnings.catch_warnings():
        pl = quiet_lightning()

    class OldLibraryModel(pl.LightningModule):
        def configure_sharded_model(self):
            pass

    with pytest.raises(MisconfigurationException, match=r"OldLibraryModel\.configure_sharded_model"):
        gl.Trainer(logger=False).fit(OldLibraryModel(), _loader())
