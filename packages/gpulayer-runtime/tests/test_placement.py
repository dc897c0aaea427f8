import dataclasses

import pytest
import torch

from gpulayer.runtime import Placement, slurm

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "job7",
}
SLURM = {
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_ID": "1234567",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
    "SLURM_JOB_NAME": "train",
}


def test_no_launcher_means_this_process_alone():
    placement = Placement.detect({}, accelerator="cpu")
    assert (placement.world_size, placement.global_rank, placement.local_rank, placement.node_rank) == (1, 0, 0, 0)
    assert (placement.source, placement.device, placement.backend) == ("in-process", torch.device("cpu"), "gloo")
    assert not placement.is_distributed
    assert repr(placement) == "Placement(rank 0/1, local 0/1, node 0/1, cpu, gloo, no peers, from in-process)"


def test_torchrun_environment():
    placement = Placement.detect(TORCHRUN, accelerator="cpu")
    assert placement == Placement(
        world_size=4,
        global_rank=3,
        local_rank=1,
        local_world_size=2,
        node_rank=1,
        num_nodes=2,
        master_addr="10.0.0.1",
        master_port=29500,
        run_id="job7",
        source="torchrun",
        accelerator="cpu",
    )
    assert repr(placement) == (
        "Placement(rank 3/4, local 1/2, node 1/2, cpu, gloo, 10.0.0.1:29500, from torchrun, run job7)"
    )


def test_an_elastic_restart_and_the_agents_store_are_read():
    restarted = {**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    placement = Placement.detect(restarted, accelerator="cpu")
    assert (placement.restart_count, placement.agent_store) == (2, True)
    assert (Placement.detect(TORCHRUN, accelerator="cpu").restart_count, placement.world_size) == (0, 4)
    with pytest.raises(ValueError, match="TORCHELASTIC_RESTART_COUNT='once'"):
        Placement.detect({**restarted, "TORCHELASTIC_RESTART_COUNT": "once"}, accelerator="cpu")


def test_cuda_placement_uses_the_local_rank_as_device():
    placement = Placement.detect(TORCHRUN, accelerator="cuda")
    assert (placement.device, placement.backend) == (torch.device("cuda", 1), "nccl")


def test_torchrun_wins_over_slurm():
    # Lightning does the same: `srun torchrun ...` places by torchrun's variables.
    assert Placement.detect({**SLURM, **TORCHRUN}, accelerator="cpu").source == "torchrun"


@pytest.mark.parametrize("missing", ["LOCAL_WORLD_SIZE", "MASTER_PORT", "GROUP_RANK"])
def test_partial_torchrun_environment_names_what_is_missing(missing):
    env = {k: v for k, v in TORCHRUN.items() if k != missing}
    with pytest.raises(ValueError, match=f"lacks {missing}"):
        Placement.detect(env, accelerator="cpu")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RANK", "three", "RANK='three': expected a whole number"),
        ("RANK", "4", r"global_rank=4: must be in \[0, world_size=4\)"),
        ("LOCAL_RANK", "2", r"local_rank=2: must be in \[0, local_world_size=2\)"),
        ("LOCAL_WORLD_SIZE", "3", "WORLD_SIZE=4 is not a multiple of LOCAL_WORLD_SIZE=3"),
        ("MASTER_PORT", "0", "MASTER_PORT=0: expected at least 1"),
    ],
)
def test_bad_torchrun_values_are_named(name, value, message):
    with pytest.raises(ValueError, match=message):
        Placement.detect({**TORCHRUN, name: value}, accelerator="cpu")


def test_bad_accelerator_is_named():
    with pytest.raises(ValueError, match=r"accelerator='tpu': expected one of 'auto', 'cpu', 'cuda'"):
        Placement.detect({}, accelerator="tpu")


def test_slurm_environment():
    placement = Placement.detect(SLURM, accelerator="cpu")
    assert placement == Placement(
        world_size=8,
        global_rank=5,
        local_rank=1,
        local_world_size=4,
        node_rank=1,
        num_nodes=2,
        master_addr="gpu007",
        master_port=15000 + 4567,
        run_id="1234567",
        source="slurm",
        accelerator="cpu",
    )


def test_slurm_master_address_and_port_can_be_overridden():
    placement = Placement.detect({**SLURM, "MASTER_ADDR": "head", "MASTER_PORT": "4242"}, accelerator="cpu")
    assert (placement.master_addr, placement.master_port) == ("head", 4242)


@pytest.mark.parametrize(
    "overrides",
    [{"SLURM_JOB_NAME": "bash"}, {"SLURM_JOB_NAME": "interactive"}, {"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}],
    ids=["bash", "interactive", "one-task"],
)
def test_interactive_or_single_task_slurm_jobs_run_in_process(overrides):
    assert Placement.detect({**SLURM, **overrides}, accelerator="cpu").source == "in-process"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node1", "node1"),
        ("gpu[003-008,011],cpu1", "gpu003"),
        ("a1,b[2-3]", "a1"),
        ("rack[4-5]-node[01-02]", "rack4-node01"),
        ("node[7,9]-ib", "node7-ib"),
    ],
)
def test_first_host_of_a_slurm_hostlist(nodelist, first):
    assert slurm.first_host(nodelist) == first


@pytest.mark.parametrize(("spec", "node", "count"), [("4", 0, 4), ("4(x2),2", 1, 4), ("4(x2),2", 2, 2), ("1,3", 1, 3)])
def test_tasks_on_node(spec, node, count):
    assert slurm.tasks_on_node({"SLURM_TASKS_PER_NODE": spec}, node) == count


def test_malformed_tasks_per_node_is_named():
    with pytest.raises(ValueError, match=r"SLURM_TASKS_PER_NODE='4\(y2\)'"):
        slurm.tasks_on_node({"SLURM_TASKS_PER_NODE": "4(y2)"}, 0)


def test_placement_is_validated_at_construction():
    with pytest.raises(ValueError, match=r"global_rank=2: must be in \[0, world_size=2\)"):
        Placement(world_size=2, global_rank=2)
    with pytest.raises(ValueError, match="accelerator='mps'"):
        Placement(accelerator="mps")


def test_a_chosen_gpu_overrides_the_local_rank_and_must_be_an_index():
    placement = Placement(world_size=2, global_rank=1, local_rank=1, local_world_size=2, accelerator="cuda")
    assert dataclasses.replace(placement, cuda_index=3).device == torch.device("cuda", 3)
    with pytest.raises(ValueError, match="cuda_index=-1: expected a GPU index"):
        dataclasses.replace(placement, cuda_index=-1)


def test_a_process_group_made_by_hand_is_a_placement_and_none_without_one(tmp_path, monkeypatch):
    import torch.distributed as dist

    assert Placement.from_process_group(accelerator="cpu") is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), world_size=1, rank=0)
    try:
        placement = Placement.from_process_group(accelerator="cpu")
        with pytest.raises(ValueError, match="accelerator='tpu'"):
            Placement.from_process_group(accelerator="tpu")
    finally:
        dist.destroy_process_group()
    assert placement == Placement(source="process group", accelerator="cpu")
