"""Where a Trainer's processes come from: a launcher's job it must agree with, or the script run again."""

import dataclasses
import types

import pytest
import torch

from gpulayer.runtime import Placement
from gpulayer.trainer import Trainer
from gpulayer.trainer.strategies.world import device_of, on_chosen_gpu

TORCHRUN = {"GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "0", "LOCAL_RANK": "0"}


@pytest.mark.parametrize(
    ("devices", "num_nodes", "world", "per_node", "named"),
    [
        (1, 1, 2, 2, "devices=1 and num_nodes=1 ask for 1 processes"),
        (2, 1, 4, 2, "started 4 with 2 per node (2 node(s))"),
        (2, 2, 4, 4, "devices=2 and num_nodes=2"),
    ],
)
def test_a_launchers_world_that_disagrees_with_devices_and_num_nodes_is_refused(
    monkeypatch, tmp_path, devices, num_nodes, world, per_node, named
):
    for name, value in {**TORCHRUN, "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(per_node)}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="make them agree") as raised:
        Trainer(accelerator="cpu", devices=devices, num_nodes=num_nodes, default_root_dir=tmp_path)
    assert named in str(raised.value) and "torchrun" in str(raised.value)
    assert not any(tmp_path.iterdir())


def test_a_published_strategy_that_is_not_installed_names_its_distribution(monkeypatch):
    from gpulayer.trainer.strategies import strategy_names

    monkeypatch.setattr(strategy_names, "registered_strategies", dict)
    with pytest.raises(
        ValueError, match=r"strategy='fsdp' needs the gpulayer-fsdp distribution.*pip install gpulayer-fsdp"
    ):
        Trainer(strategy="fsdp", logger=False)


def test_an_unknown_strategy_lists_the_accepted_names():
    with pytest.raises(ValueError, match=r"strategy='zero3': accepted values are 'auto', .*'fsdp'"):
        Trainer(strategy="zero3", logger=False)


@pytest.mark.parametrize(
    ("indices", "local_rank", "gpu"),
    [((1,), 0, 1), ((1, 3), 0, 1), ((1, 3), 1, 3), ((0, 1), 1, 1), (None, 1, 1)],
)
def test_each_rank_trains_on_the_gpu_its_local_rank_picks_from_devices(indices, local_rank, gpu):
    """Lightning's rule: ``devices=[1, 3]`` puts local rank 0 on cuda:1 and local rank 1 on cuda:3, in one process
    or under a launcher; a count (or "auto", None here) numbers the GPUs from 0."""
    placement = Placement(world_size=2, global_rank=local_rank, local_rank=local_rank, local_world_size=2)
    args = types.SimpleNamespace(accelerator="cuda", devices=indices)
    chosen = on_chosen_gpu(dataclasses.replace(placement, accelerator="cuda"), args)
    assert device_of(args, chosen) == chosen.device == torch.device("cuda", gpu)
    on_cpu = types.SimpleNamespace(accelerator="cpu", devices=(0, 1))
    assert device_of(on_cpu, on_chosen_gpu(placement, on_cpu)) == torch.device("cpu")
