"""BaseFinetuning and BackboneFinetuning against Lightning 2.6.6 (``lightning/pytorch/callbacks/finetuning.py``): the
same module, data and callback under both frameworks give, epoch by epoch, the same param groups and learning rates,
the same frozen parameters and batch-norm tracking, the same weights, callback state and checkpoint, the same
warnings and verbose log; a fit resumed after the unfreeze epoch rebuilds the optimizer's groups as Lightning's; and
Lightning's errors come with its messages."""

import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks.finetuning import BackboneFinetuning, BaseFinetuning

from .conftest import frameworks

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import BackboneFinetuning as LightningBackbone
    from lightning.pytorch.callbacks import BaseFinetuning as LightningBase
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(
    Backbone=(LightningBackbone, BackboneFinetuning),
    Base=(LightningBase, BaseFinetuning),
    log_name=("lightning.pytorch.callbacks.finetuning", "gpulayer.callbacks.finetuning"),
)


def _module(framework, *, backbone="sequential", manual=False):
    """A backbone (Linear, BatchNorm, ReLU, Linear) and a head; ``manual``: two optimizers stepped by hand."""

    class Transfer(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.automatic_optimization = not manual
            layers = [torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 6)]
            if backbone == "sequential":
                self.backbone = torch.nn.Sequential(*layers)
            elif backbone == "list":  # an attribute, but not an nn.Module
                self.layers = torch.nn.ModuleList(layers)
                self.backbone = list(self.layers)
            else:
                self.layers = torch.nn.Sequential(*layers)
            self.head = torch.nn.Linear(6, 1)

        def forward(self, x):
            return self.head(self.layers(x) if hasattr(self, "layers") else self.backbone(x))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            if not manual:
                return loss
            optimizers = self.optimizers()
            self.manual_backward(loss)
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
            return None

        def configure_optimizers(self):
            if manual:
                return [
                    torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.02, momentum=0.9),
                    torch.optim.Adam(self.head.parameters(), lr=0.001),
                ]
            optimizer = torch.optim.Adam(filter(lambda p: p.requires_grad, self.parameters()), lr=0.01)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.7)}

    return Transfer()


def _custom(framework):
    """A BaseFinetuning of the user's: the whole backbone frozen (its batch norm too), then unfrozen in two steps."""

    class Custom(framework.Base):
        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.backbone, train_bn=False)

        def finetune_function(self, pl_module, epoch, optimizer):
            if epoch == 1:  # the first group's lr / 5
                self.unfreeze_and_add_param_group(pl_module.backbone[3], optimizer, initial_denom_lr=5.0)
            elif epoch == 2:  # all the rest, at its own lr: the last Linear is in the optimizer already
                self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr="0.003", train_bn=False)
            elif epoch == 3:  # the batch norm, now trained
                self.unfreeze_and_add_param_group(pl_module.backbone[1], optimizer, lr=1e-3)

    return Custom()


def _probe(framework, save_at=None):
    """Records at each train epoch start, after the finetuning callback: the param groups' learning rates and sizes,
    which parameters train and whether the batch norm tracks its running stats. ``save_at=(step, path)`` saves a
    checkpoint after that step, mid-epoch."""

    class Probe(framework.Callback):
        def __init__(self):
            self.trace = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if save_at is not None and trainer.global_step == save_at[0]:
                trainer.save_checkpoint(save_at[1])

        def on_train_epoch_start(self, trainer, pl_module):
            groups = [(group["lr"], len(group["params"])) for group in trainer.optimizers[0].param_groups]
            training = [name for name, p in pl_module.named_parameters() if p.requires_grad]
            tracking = pl_module.backbone[1].track_running_stats
            self.trace.append((trainer.current_epoch, groups, training, tracking))

    return Probe()


def _loader():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(24, 4, generator=generator), torch.randn(24, 1, generator=generator))
    return DataLoader(data, batch_size=6)


def _fit(name, root, callback, *, max_epochs=5, ckpt_path=None, save=None, save_at=None, manual=False):
    """Fits under framework ``name``; what to compare. ``save`` is a checkpoint's path to save after ``fit``."""
    framework = FRAMEWORKS[name]
    finetuning = callback(framework)
    probe = _probe(framework, save_at)
    options = {"accelerator": "cpu", "devices": 1, "max_epochs": max_epochs, "logger": False}
    options |= {"enable_checkpointing": False, "default_root_dir": root / name, "callbacks": [finetuning, probe]}
    model = _module(framework, manual=manual)
    handler = _Messages()
    logger = logging.getLogger(framework.log_name)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = framework.Trainer(**options | framework.options)
            trainer.fit(model, _loader(), ckpt_path=ckpt_path)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    checkpoint = None
    if save is not None:
        trainer.save_checkpoint(save)
        checkpoint = torch.load(save, weights_only=False)
    return {
        "trace": probe.trace,
        "weights": {key: value.tolist() for key, value in model.state_dict().items()},
        "param_groups": [
            [{**group, "params": [_name(model, p) for p in group["params"]]} for group in optimizer.param_groups]
            for optimizer in trainer.optimizers
        ],
        "optimizer_state": [optimizer.state_dict() for optimizer in trainer.optimizers],
        "callback_state": finetuning.state_dict(),
        "checkpoint_callbacks": None if checkpoint is None else checkpoint["callbacks"],
        "warnings": [str(w.message) for w in caught if "already exist" in str(w.message)],
        "log": handler.messages,
    }


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _name(model, param):
    return next(name for name, p in model.named_parameters() if p is param)


def _both(tmp_path, callback, **kwargs):
    expected = _fit("lightning", tmp_path, callback, **kwargs)
    actual = _fit("gpulayer", tmp_path, callback, **kwargs)
    assert _comparable(actual) == _comparable(expected)
    return actual


def _comparable(value):
    """``value`` with its tensors as lists, so that ``==`` compares them exactly."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {key: _comparable(each) for key, each in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(each) for each in value]
    return value


def _backbone(**kwargs):
    return lambda framework: framework.Backbone(**kwargs)


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param({"unfreeze_backbone_at_epoch": 1, "verbose": True}, id="doubling-then-aligned"),
        pytest.param(
            {"unfreeze_backbone_at_epoch": 1, "lambda_func": lambda epoch: 1 + epoch / 10, "should_align": False}
            | {"backbone_initial_lr": 4e-3},
            id="lambda-not-aligned",
        ),
        pytest.param({"unfreeze_backbone_at_epoch": 2, "backbone_initial_lr": 4e-3, "verbose": True}, id="initial-lr"),
        pytest.param(
            {"unfreeze_backbone_at_epoch": 0, "backbone_initial_ratio_lr": 0.5, "train_bn": False, "rounding": 3},
            id="from-epoch-0-ratio-no-bn",
        ),
        pytest.param({}, id="defaults-never-unfrozen"),
    ],
)
def test_backbone_finetuning_trains_as_lightnings(tmp_path, arguments):
    result = _both(tmp_path, _backbone(**arguments), save=tmp_path / "saved.ckpt")
    unfreeze = arguments.get("unfreeze_backbone_at_epoch", 10)
    groups = [len(groups) for _, groups, _, _ in result["trace"]]
    assert groups == [1 if epoch < unfreeze else 2 for epoch in range(5)]
    assert set(result["checkpoint_callbacks"]) == {"BackboneFinetuning"}
    assert set(result["callback_state"]) == {"internal_optimizer_metadata", "previous_backbone_lr"}
    assert len(result["log"]) == (5 - unfreeze if arguments.get("verbose") else 0)
    if not arguments.get("should_align", True):  # past the head's rate: 0.004 * 1.3 * 1.4 * 1.5 against 0.01 * 0.7**4
        assert result["trace"][-1][1][1][0] > result["trace"][-1][1][0][0]


def test_every_optimizer_gets_the_backbone_as_lightnings(tmp_path):
    """Manual optimization with two optimizers: ``finetune_function`` runs for each, and the backbone joins both."""
    callback = _backbone(unfreeze_backbone_at_epoch=1, backbone_initial_lr=0.01)
    result = _both(tmp_path, callback, max_epochs=3, manual=True, save=tmp_path / "saved.ckpt")
    assert [len(groups) for groups in result["param_groups"]] == [2, 2]
    assert [len(groups) for groups in result["callback_state"]["internal_optimizer_metadata"].values()] == [2, 2]
    # Epoch 2 doubles SGD's to 0.02 (its own rate: no cap), then Adam's from that, capped at Adam's 0.001: as in
    # Lightning, one previous_backbone_lr serves every optimizer.
    assert [groups[1]["lr"] for groups in result["param_groups"]] == [0.02, 0.001]
    assert result["callback_state"]["previous_backbone_lr"] == 0.001


def test_the_default_backbone_rates_double_and_align(tmp_path):
    """Unfrozen at epoch 1 at a tenth of the head's 0.007, doubled each epoch, held at the head's rate once past it."""
    result = _both(tmp_path, _backbone(unfreeze_backbone_at_epoch=1, verbose=True))
    head = [0.01 * 0.7**epoch for epoch in range(5)]
    backbone = [lrs[1][0] for _, lrs, _, _ in result["trace"][1:]]
    assert backbone == pytest.approx([head[1] / 10, head[1] / 5, head[1] / 2.5, head[4]])
    assert result["log"][0] == "Current lr: 0.007, Backbone lr: 0.0007"
    # The batch norm was left trainable, so it is in the first group and skipped, with Lightning's warning.
    assert len(result["warnings"]) == 1


def test_a_custom_base_finetuning_as_lightnings(tmp_path):
    result = _both(tmp_path, _custom, save=tmp_path / "saved.ckpt")
    groups = [groups for _, groups, _, _ in result["trace"]]
    assert [size for _, size in groups[3]] == [2, 2, 2, 2]
    assert [lr for lr, _ in groups[1]] == pytest.approx([0.007, 0.007 / 5])  # the first group's lr / 5
    assert groups[2][2][0] == 0.003  # the first Linear: the last one is in a group already (the warning)
    assert groups[3][3][0] == 0.001  # the batch norm
    assert [tracking for *_, tracking in result["trace"]] == [False, False, True, True, True]
    assert len(result["warnings"]) == 1
    assert len(result["callback_state"]["internal_optimizer_metadata"][0]) == 4


@pytest.mark.parametrize(
    ("callback", "saved_epochs"),
    [
        pytest.param(_backbone(unfreeze_backbone_at_epoch=1), 2, id="backbone"),
        pytest.param(_custom, 3, id="custom"),
    ],
)
def test_a_resume_after_the_unfreeze_epoch_trains_as_an_unbroken_run(tmp_path, callback, saved_epochs):
    """Saved after the unfreeze epoch, resumed in a new Trainer and module: the optimizer's param groups and state as
    Lightning's resume rebuilds them. Lightning 2.6 then leaves the unfrozen parameters frozen (its issue #21901):
    GPUlayer trains them, as in an unbroken run."""
    unbroken = _both(tmp_path / "unbroken", callback)
    resumed = {}
    for name in FRAMEWORKS:
        _fit(name, tmp_path, callback, max_epochs=saved_epochs, save=tmp_path / f"{name}.ckpt")
        resumed[name] = _comparable(_fit(name, tmp_path / "resumed", callback, ckpt_path=tmp_path / f"{name}.ckpt"))
    ours, theirs, unbroken = resumed["gpulayer"], resumed["lightning"], _comparable(unbroken)
    for key in ("weights", "param_groups", "optimizer_state", "callback_state"):
        assert ours[key] == unbroken[key], key
    assert ours["trace"] == unbroken["trace"][saved_epochs:]
    assert [groups for _, groups, _, _ in ours["trace"]] == [groups for _, groups, _, _ in theirs["trace"]]
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["callback_state"] == theirs["callback_state"]
    frozen_in_lightning = {name for name in unbroken["trace"][-1][2] if name not in theirs["trace"][-1][2]}
    assert frozen_in_lightning == {"backbone.0.weight", "backbone.0.bias", "backbone.3.weight", "backbone.3.bias"}
    assert ours["weights"] != theirs["weights"]


def test_a_resume_mid_epoch_as_lightnings(tmp_path):
    """Saved mid-way through epoch 2 (after the unfreeze at epoch 1): the epoch starts again in both, and its
    ``finetune_function`` runs again, as Lightning runs it."""
    callback = _backbone(unfreeze_backbone_at_epoch=1)
    resumed = {}
    for name in FRAMEWORKS:
        _fit(name, tmp_path, callback, save_at=(10, tmp_path / f"{name}.ckpt"))
        resumed[name] = _comparable(_fit(name, tmp_path / "resumed", callback, ckpt_path=tmp_path / f"{name}.ckpt"))
    ours, theirs = resumed["gpulayer"], resumed["lightning"]
    assert [trace[:2] for trace in ours["trace"]] == [trace[:2] for trace in theirs["trace"]]
    for key in ("param_groups", "callback_state"):
        assert ours[key] == theirs[key], key


def _refused(name, root, callback, *, backbone="sequential"):
    framework = FRAMEWORKS[name]
    options = {"accelerator": "cpu", "max_epochs": 3, "logger": False, "enable_checkpointing": False}
    options |= {"default_root_dir": root / name, "callbacks": [callback(framework)]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = framework.Trainer(**options | framework.options)
        with pytest.raises(Exception) as raised:  # compared below, type and message
            trainer.fit(_module(framework, backbone=backbone), _loader())
    return raised.value


@pytest.mark.parametrize(
    ("callback", "backbone", "refused"),
    [
        pytest.param(_backbone(), "none", AttributeError, id="no-backbone"),
        pytest.param(_backbone(), "list", MisconfigurationException, id="backbone-not-a-module"),
        pytest.param(lambda framework: framework.Base(), "sequential", NotImplementedError, id="base-not-overridden"),
        pytest.param(
            _backbone(unfreeze_backbone_at_epoch=0, backbone_initial_lr="fast"), "sequential", ValueError, id="bad-lr"
        ),
        pytest.param(_backbone(unfreeze_backbone_at_epoch=1, lambda_func=2), "sequential", TypeError, id="bad-lambda"),
    ],
)
def test_lightnings_errors(tmp_path, callback, backbone, refused):
    theirs = _refused("lightning", tmp_path, callback, backbone=backbone)
    ours = _refused("gpulayer", tmp_path, callback, backbone=backbone)
    assert (type(theirs), str(ours)) == (refused, str(theirs))
    assert isinstance(ours, gl.MisconfigurationException if refused is MisconfigurationException else refused)


def test_the_state_loads_as_lightnings():
    """A state without ``internal_optimizer_metadata`` (before Lightning 1.6) is the metadata itself; a
    BackboneFinetuning state needs its ``previous_backbone_lr``."""
    old = {0: [{"lr": 0.1, "params": ["head.weight"]}]}
    for state in (old, {"internal_optimizer_metadata": old}):
        theirs, ours = LightningBase(), BaseFinetuning()
        theirs.load_state_dict(state)
        ours.load_state_dict(state)
        assert ours.state_dict() == theirs.state_dict() == {"internal_optimizer_metadata": old}
    for cls in (LightningBackbone, BackboneFinetuning):
        with pytest.raises(KeyError, match="previous_backbone_lr"):
            cls().load_state_dict({"internal_optimizer_metadata": old})


def _tree():
    """Nested modules: a ModuleDict, a Sequential with a batch norm, a list holding a ModuleList, and a parent with
    a parameter of its own."""
    torch.manual_seed(0)
    parent = torch.nn.Module()
    parent.scale = torch.nn.Parameter(torch.ones(3))
    parent.inner = torch.nn.Linear(3, 3)
    sequential = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU())
    listed = torch.nn.ModuleList([torch.nn.Linear(3, 2), torch.nn.Linear(2, 2)])
    return torch.nn.ModuleDict({"sequential": sequential, "parent": parent}), [listed, torch.nn.Linear(2, 1)]


def test_the_static_helpers_as_lightnings():
    """flatten_modules, filter_params, freeze, make_trainable and filter_on_optimizer, on fresh copies of one tree."""

    def run(cls):
        tree = _tree()
        everything = [p for part in (tree[0], *tree[1]) for p in part.parameters()]
        index = {id(p): i for i, p in enumerate(everything)}
        found = {"flat": [type(m).__name__ for m in cls.flatten_modules(tree)]}
        cls.freeze(tree, train_bn=False)
        found["frozen"] = [p.requires_grad for p in everything]
        cls.make_trainable(tree[1])
        cls.freeze(tree[0], train_bn=True)
        found["partly"] = [p.requires_grad for p in everything]
        found["tracking"] = tree[0]["sequential"][1].track_running_stats
        for train_bn in (True, False):
            for requires_grad in (True, False):
                params = cls.filter_params(tree, train_bn=train_bn, requires_grad=requires_grad)
                found[f"filter-{train_bn}-{requires_grad}"] = [index[id(p)] for p in params]
        optimizer = torch.optim.SGD([everything[0]], lr=0.1)
        same_values = torch.nn.Parameter(everything[0].detach().clone())  # Lightning compares values, not identity
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kept = cls.filter_on_optimizer(optimizer, [same_values, everything[1], everything[0]])
        found["kept"] = [index.get(id(p), "copy") for p in kept]
        found["warnings"] = [str(w.message) for w in caught]
        return found

    assert run(BaseFinetuning) == run(LightningBase)
