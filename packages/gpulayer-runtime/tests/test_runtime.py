"""The Runtime in this process alone: collectives cost nothing and no process group is made."""

import pytest
import torch
import torch.distributed as dist

from gpulayer.runtime import Placement, Runtime


@pytest.fixture
def runtime():
    with Runtime(accelerator="cpu") as runtime:
        yield runtime


def test_fields_come_from_the_placement(runtime):
    assert (runtime.world_size, runtime.global_rank, runtime.local_rank, runtime.node_rank) == (1, 0, 0, 0)
    assert (runtime.local_world_size, runtime.num_nodes, runtime.device, runtime.backend) == (
        1,
        1,
        torch.device("cpu"),
        "gloo",
    )
    assert runtime.is_global_zero
    assert repr(runtime).startswith("Runtime(Placement(rank 0/1")


def test_collectives_at_world_size_one_return_their_input_without_a_process_group(runtime):
    tensor = torch.tensor([1.0, 2.0])
    for op in ("sum", "mean", "max", "min"):
        assert runtime.all_reduce(tensor, op) is tensor
    assert tensor.tolist() == [1.0, 2.0]
    assert runtime.all_gather(tensor) == [tensor]
    assert runtime.all_gather({"a": 1}) == [{"a": 1}]
    assert runtime.broadcast({"b": 2}) == {"b": 2}
    runtime.barrier()
    assert runtime.any(True) and not runtime.any(False)
    assert runtime.all(True) and not runtime.all(False)
    assert not dist.is_initialized()


def test_bad_arguments_are_named(runtime):
    with pytest.raises(ValueError, match=r"op='avg': expected one of 'sum', 'mean', 'max', 'min'"):
        runtime.all_reduce(torch.ones(1), "avg")
    with pytest.raises(ValueError, match=r"src=1: must be a rank in \[0, 1\)"):
        runtime.broadcast(1, src=1)
    with pytest.raises(ValueError, match="timeout=-1: expected a positive number of seconds"):
        Runtime(accelerator="cpu", timeout=-1)


def test_a_distributed_placement_without_an_address_is_refused():
    with pytest.raises(ValueError, match="names no master_addr and master_port"):
        Runtime(Placement(world_size=2, global_rank=0))


def test_close_is_idempotent():
    runtime = Runtime(accelerator="cpu")
    runtime.close()
    runtime.close()
