"""ModelPruning against Lightning 2.6.6 (``lightning/pytorch/callbacks/pruning.py``): the same arguments prune the
same weights at the same epochs under both frameworks, leaving the same weights and masks, the same log lines and
the same checkpoint (masks applied under ``make_pruning_permanent``), and refuse the same bad arguments with
Lightning's messages."""

import warnings

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks.pruning import ModelPruning

from .conftest import frameworks, info_messages

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.callbacks import ModelPruning as LightningModelPruning
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

FRAMEWORKS = frameworks(
    ModelPruning=(LightningModelPruning, ModelPruning),
    log_name=("lightning.pytorch.callbacks.pruning", "gpulayer.callbacks.pruning"),
)


def _module(framework):
    class Regressor(framework.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.hidden = torch.nn.Linear(4, 6)
            self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(6, 1))

        def forward(self, x):
            return self.head(self.hidden(x))

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regressor()


def _loader():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator))
    return DataLoader(data, batch_size=2)


def _fit(name, root, options, *, layers=None):
    """Weights and masks after ``fit``, the pruning log lines, and the checkpoint of the last epoch's end."""
    framework = FRAMEWORKS[name]
    model = _module(framework)
    if layers is not None:
        options = options | {"parameters_to_prune": [(getattr(model, layer), "weight") for layer in layers]}
    callback = framework.ModelPruning(**options)
    trainer_options = {"accelerator": "cpu", "max_epochs": 3, "logger": False, "num_sanity_val_steps": 1}
    trainer_options |= {"default_root_dir": root, "callbacks": [callback]}
    with warnings.catch_warnings(), info_messages(framework.log_name) as lines:
        warnings.simplefilter("ignore")
        trainer = framework.Trainer(**trainer_options | framework.options)
        trainer.fit(model, _loader(), _loader())
    (saved,) = (root / "checkpoints").iterdir()
    checkpoint = torch.load(saved, weights_only=False)["state_dict"]
    fresh = _module(framework)
    try:
        fresh.load_state_dict(checkpoint)
        loads = "loads"
    except RuntimeError as error:
        loads = str(error)
    return {
        "file": saved.name,
        "weights": {key: value.tolist() for key, value in model.state_dict().items()},
        "buffers": sorted(name for name, _ in model.named_buffers()),
        "lines": lines,
        "checkpoint": {key: value.tolist() for key, value in sorted(checkpoint.items())},
        "loads": loads,
    }


def _both(tmp_path, options, **kwargs):
    expected = _fit("lightning", tmp_path / "lightning", options, **kwargs)
    actual = _fit("gpulayer", tmp_path / "gpulayer", options, **kwargs)
    assert actual["lines"] == expected["lines"]
    assert actual == expected
    return actual


PLAIN_KEYS = ["head.1.bias", "head.1.weight", "hidden.bias", "hidden.weight"]


def test_global_l1_with_the_lottery_ticket_made_permanent(tmp_path):
    """Lightning's defaults (global, lottery ticket, permanent) at 50%, logging each parameter."""
    result = _both(tmp_path, {"pruning_fn": "l1_unstructured", "verbose": 2})
    assert result["buffers"] == []  # permanent at the end of training
    assert sorted(result["checkpoint"]) == PLAIN_KEYS and result["loads"] == "loads"
    assert len(result["lines"]) == 3 * 5
    assert result["lines"][0] == "Applied `L1Unstructured`. Pruned: 0/37 (0.00%) -> 18/37 (48.65%)"
    weight = torch.tensor(result["weights"]["hidden.weight"])
    assert 0 < int((weight == 0).sum()) < weight.numel()


def test_local_l1_with_a_callable_amount_kept_as_masks(tmp_path):
    options = {"pruning_fn": "l1_unstructured", "use_global_unstructured": False, "amount": [0.3, 0, 0.25].__getitem__}
    options |= {"make_pruning_permanent": False, "use_lottery_ticket_hypothesis": False, "verbose": 1}
    result = _both(tmp_path, options)
    assert result["buffers"] == ["head.1.bias_mask", "head.1.weight_mask", "hidden.bias_mask", "hidden.weight_mask"]
    assert len(result["lines"]) == 2  # epoch 1's amount is 0: no pruning
    assert result["lines"][0].startswith("Applied `l1_unstructured`. Pruned: 0/37 (0.00%) -> 11/37")
    assert "head.1.weight_orig" in result["checkpoint"] and "Unexpected key(s)" in result["loads"]


def test_structured_pruning_of_chosen_layers_on_chosen_epochs(tmp_path):
    options = {"pruning_fn": "ln_structured", "pruning_dim": 0, "pruning_norm": 1, "amount": 2}
    options |= {"use_global_unstructured": False, "apply_pruning": lambda epoch: epoch != 1, "verbose": 2}
    options |= {"use_lottery_ticket_hypothesis": lambda epoch: epoch == 2}
    result = _both(tmp_path, options, layers=["hidden"])
    assert result["buffers"] == [] and sorted(result["checkpoint"]) == PLAIN_KEYS
    rows = torch.tensor(result["weights"]["hidden.weight"]).abs().sum(dim=1)
    assert int((rows == 0).sum()) == 4  # 2 rows at epoch 0, 2 more at epoch 2
    assert result["lines"][1].startswith("Applied `ln_structured` to `Linear(in_features=4, out_features=6, bias=True)")


def test_resampled_lottery_ticket_at_validation_end(tmp_path):
    options = {"pruning_fn": "l1_unstructured", "amount": 0.2, "resample_parameters": True}
    options |= {"prune_on_train_epoch_end": False, "make_pruning_permanent": False}
    result = _both(tmp_path, options)
    mask = torch.tensor(result["weights"]["hidden.weight_mask"])
    assert int((mask == 0).sum()) > 0


def test_a_pruning_method_class_prunes_globally(tmp_path):
    """A ``BasePruningMethod`` subclass given as ``pruning_fn``: Lightning keeps no name for it, and logs None."""
    result = _both(tmp_path, {"pruning_fn": torch_prune.L1Unstructured, "amount": 5, "verbose": 1})
    assert result["lines"][0] == "Applied `None`. Pruned: 0/37 (0.00%) -> 5/37 (13.51%)"


def test_the_checkpoint_keeps_the_masks_in_the_module(tmp_path):
    """A checkpoint saved mid-training has the masks applied under plain names; the module keeps training masked."""
    seen = {}
    for name, framework in FRAMEWORKS.items():
        model = _module(framework)
        callback = framework.ModelPruning("l1_unstructured", amount=0.5, use_lottery_ticket_hypothesis=False)
        options = {"accelerator": "cpu", "max_epochs": 1, "logger": False, "enable_checkpointing": False}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = framework.Trainer(**options | {"default_root_dir": tmp_path, "callbacks": [callback]})
            trainer.fit(model, _loader())
            callback.apply_pruning(0.5)  # masks again after on_train_end made them permanent
            trainer.save_checkpoint(tmp_path / f"{name}.ckpt")
        state = torch.load(tmp_path / f"{name}.ckpt", weights_only=False)["state_dict"]
        masked = {key: value.tolist() for key, value in model.state_dict().items()}
        seen[name] = ({key: value.tolist() for key, value in state.items()}, masked)
    assert seen["gpulayer"] == seen["lightning"]
    assert sorted(seen["gpulayer"][0]) == PLAIN_KEYS
    assert "hidden.weight_mask" in seen["gpulayer"][1]


def test_sanitized_parameters_are_lightnings():
    for name, framework in FRAMEWORKS.items():
        model = _module(framework)
        pairs = framework.ModelPruning.sanitize_parameters_to_prune(model, parameter_names=["bias"])
        assert [(type(m).__name__, p) for m, p in pairs] == [("Linear", "bias")] * 2, name
    ours = ModelPruning.sanitize_parameters_to_prune(model)
    theirs = LightningModelPruning.sanitize_parameters_to_prune(model)
    assert ours == theirs and len(ours) == 4


def _refusal(cls, construct, model):
    try:
        callback = cls(**construct)
        if model is not None:
            callback.sanitize_parameters_to_prune(model, callback._parameters_to_prune)
    except MisconfigurationException as error:
        return type(error).__name__, str(error)
    except gl.MisconfigurationException as error:
        return "MisconfigurationException", str(error)
    return None


OTHER = torch.nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("construct", "with_model"),
    [
        ({"pruning_fn": "l1_unstructured", "parameter_names": ["gamma"]}, False),
        ({"pruning_fn": "L3_unstructured"}, False),
        ({"pruning_fn": "random_structured", "use_global_unstructured": False}, False),
        ({"pruning_fn": "ln_structured", "pruning_dim": 0, "use_global_unstructured": False}, False),
        ({"pruning_fn": "ln_structured", "pruning_dim": 0, "pruning_norm": 2}, False),
        ({"pruning_fn": torch_prune.L1Unstructured, "use_global_unstructured": False}, False),
        ({"pruning_fn": torch_prune.l1_unstructured}, False),
        ({"pruning_fn": "l1_unstructured", "amount": "half"}, False),
        ({"pruning_fn": "l1_unstructured", "verbose": 3}, False),
        ({"pruning_fn": "l1_unstructured", "parameters_to_prune": [(OTHER, "weight")]}, True),
        ({"pruning_fn": "l1_unstructured", "parameters_to_prune": [(OTHER, "weight", 1)]}, True),
    ],
)
def test_bad_arguments_raise_lightnings_misconfiguration(construct, with_model):
    model = _module(FRAMEWORKS["gpulayer"]) if with_model else None
    theirs = _refusal(LightningModelPruning, construct, model)
    ours = _refusal(ModelPruning, construct, model)
    assert theirs is not None
    assert ours == theirs
