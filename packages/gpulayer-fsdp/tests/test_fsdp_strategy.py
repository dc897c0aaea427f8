"""FSDPStrategy's arguments, how the Trainer finds it, and which submodules the policies choose (no processes)."""

from datetime import timedelta

import pytest
from torch import nn

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.fsdp.sharding import units
from gpulayer.trainer.strategies.strategy_names import registered_strategies

from .conftest import Block, LanguageModel, Regression


def test_the_trainer_finds_the_strategy_through_its_entry_point():
    assert registered_strategies()["fsdp"].load() is FSDPStrategy


@pytest.mark.parametrize("strategy", ["fsdp", "FSDP", FSDPStrategy()])
def test_one_process_is_refused_at_construction_naming_the_device_count(strategy):
    with pytest.raises(
        ValueError, match=r"strategy='fsdp' shards the model across processes.*devices \* num_nodes = 1"
    ):
        gl.Trainer(strategy=strategy, logger=False)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"auto_wrap_policy": {Block}, "shard_model": print}, ValueError, "pass one of them, not both"),
        ({"shard_model": "blocks"}, TypeError, r"shard_model='blocks'\): accepted values are None or a function"),
        (
            {"reshard_after_forward": 1},
            TypeError,
            r"reshard_after_forward=1\): accepted values are True, False or None",
        ),
        ({"auto_wrap_policy": {int}}, TypeError, r"auto_wrap_policy=\{<class 'int'>\}\): accepted values are None"),
        ({"auto_wrap_policy": set()}, TypeError, r"auto_wrap_policy=set\(\)\): accepted values are None"),
        ({"auto_wrap_policy": lambda m, recurse, n: True}, TypeError, "FSDP1's .* policies do not apply to FSDP2"),
        ({"timeout": -1}, ValueError, r"FSDPStrategy\(timeout=-1\): accepted values are None, a positive number"),
    ],
)
def test_bad_options_name_the_argument_and_what_is_accepted(options, error, message):
    with pytest.raises(error, match=message):
        FSDPStrategy(**options)


def test_options_are_kept():
    strategy = FSDPStrategy(auto_wrap_policy=Block, reshard_after_forward=False, timeout=60)
    assert strategy.auto_wrap_policy == frozenset({Block})
    assert strategy.timeout == timedelta(seconds=60)
    assert repr(strategy) == f"FSDPStrategy(auto_wrap_policy=frozenset({{{Block!r}}}), reshard_after_forward=False)"


def test_the_default_policy_shards_the_repeated_blocks():
    model = LanguageModel()
    assert units(model, None) == list(model.blocks)  # embedding, norm and head stay with the root
    mlp = Regression()
    assert units(mlp, None) == [mlp.net[0], mlp.net[2], mlp.net[4]]  # the layers with parameters


def test_the_default_policy_without_containers_shards_each_child_with_parameters():
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.activation, self.decoder = nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2)

    plain = Plain()
    assert units(plain, None) == [plain.encoder, plain.decoder]


def test_a_class_policy_takes_every_instance_and_a_function_what_it_accepts():
    model = LanguageModel()
    assert units(model, frozenset({nn.LayerNorm})) == [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert units(model, lambda m: m is model.head) == [model.head]
