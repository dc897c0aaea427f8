"""Where this process runs: its rank, its peers, its device, and which launcher said so."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gpulayer.runtime import slurm, started
from gpulayer.runtime.env_values import env_int, require_env

ACCELERATORS = ("auto", "cpu", "cuda")

# The torchrun contract (torch/distributed/run.py): every worker it starts gets all of these.
TORCHRUN_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """This process's place in its job. ``source`` says which launcher placed it."""

    world_size: int = 1
    global_rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    source: str = "in-process"
    accelerator: str = "cpu"
    restart_count: int = 0  # how many times torch's elastic agent restarted this node's workers
    agent_store: bool = False  # the workers' process group is to use the store the agent hosts
    cuda_index: int | None = None  # the GPU this process uses on CUDA; None: the one numbered by its local rank

    def __post_init__(self) -> None:
        if self.accelerator not in ("cpu", "cuda"):
            raise ValueError(f"accelerator={self.accelerator!r}: expected 'cpu' or 'cuda'")
        _check_rank("global_rank", self.global_rank, "world_size", self.world_size)
        _check_rank("local_rank", self.local_rank, "local_world_size", self.local_world_size)
        _check_rank("node_rank", self.node_rank, "num_nodes", self.num_nodes)
        if self.cuda_index is not None and self.cuda_index < 0:
            raise ValueError(f"cuda_index={self.cuda_index}: expected a GPU index, 0 or more, or None")

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None, *, accelerator: str = "auto") -> Placement:
        """Read the placement: a process ``start_processes`` started, then the environment (torchrun's variables,
        then Slurm's), else this process alone."""
        if accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator={accelerator!r}: expected one of {', '.join(map(repr, ACCELERATORS))}")
        env = os.environ if environ is None else environ
        if accelerator == "auto":
            accelerator = "cuda" if torch.cuda.is_available() else "cpu"
        worker = started.this_worker()
        if worker is not None and environ is None:
            return cls(**_from_started(worker), accelerator=accelerator)
        if any(name in env for name in TORCHRUN_VARIABLES[:3]):
            return cls(**_from_torchrun(env), accelerator=accelerator)
        if slurm.is_slurm_job(env):
            return cls(**slurm.placement_fields(env), accelerator=accelerator)
        return cls(accelerator=accelerator)

    @classmethod
    def from_process_group(cls, *, accelerator: str = "auto") -> Placement | None:
        """The placement of a default process group made outside any launcher (``init_process_group`` by hand):
        rank and world size from the group, nodes from ``LOCAL_WORLD_SIZE`` when set (else one node); None when
        there is no group."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        if accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator={accelerator!r}: expected one of {', '.join(map(repr, ACCELERATORS))}")
        if accelerator == "auto":
            accelerator = "cuda" if torch.cuda.is_available() else "cpu"
        world, rank = dist.get_world_size(), dist.get_rank()
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return cls(
            world_size=world,
            global_rank=rank,
            local_rank=int(os.environ.get("LOCAL_RANK", rank)),
            local_world_size=per_node,
            num_nodes=world // per_node,
            node_rank=rank // per_node,
            source="process group",
            accelerator=accelerator,
        )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def device(self) -> torch.device:
        if self.accelerator != "cuda":
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank if self.cuda_index is None else self.cuda_index)

    @property
    def backend(self) -> str:
        return "nccl" if self.accelerator == "cuda" else "gloo"

    def __repr__(self) -> str:
        where = f"{self.master_addr}:{self.master_port}" if self.is_distributed else "no peers"
        run = f", run {self.run_id}" if self.run_id else ""
        return (
            f"Placement(rank {self.global_rank}/{self.world_size}, local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}, {self.device}, {self.backend}, {where}, "
            f"from {self.source}{run})"
        )


def _from_torchrun(env: Mapping[str, str]) -> dict:
    missing = [name for name in TORCHRUN_VARIABLES if name not in env]
    if missing:
        raise ValueError(
            f"the environment looks launched by torchrun (RANK, WORLD_SIZE or LOCAL_RANK is set) but lacks "
            f"{', '.join(missing)}; start the script with torchrun or `gpulayer launch`, or unset RANK, "
            f"WORLD_SIZE and LOCAL_RANK to run in this process"
        )
    world_size = env_int(env, "WORLD_SIZE", minimum=1)
    local_world_size = env_int(env, "LOCAL_WORLD_SIZE", minimum=1)
    if world_size % local_world_size:
        raise ValueError(f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}")
    return dict(
        world_size=world_size,
        global_rank=env_int(env, "RANK"),
        local_rank=env_int(env, "LOCAL_RANK"),
        local_world_size=local_world_size,
        node_rank=env_int(env, "GROUP_RANK"),
        num_nodes=world_size // local_world_size,
        master_addr=require_env(env, "MASTER_ADDR"),
        master_port=env_int(env, "MASTER_PORT", minimum=1),
        run_id=env.get("TORCHELASTIC_RUN_ID"),
        source="torchrun",
        restart_count=env_int(env, "TORCHELASTIC_RESTART_COUNT") if "TORCHELASTIC_RESTART_COUNT" in env else 0,
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def _from_started(worker: started.StartedWorker) -> dict:
    return dict(
        world_size=worker.world_size,
        global_rank=worker.rank,
        local_rank=worker.rank,
        local_world_size=worker.world_size,
        master_addr=started.LOOPBACK,
        master_port=worker.store_port,
        run_id=worker.prefix,
        source=f"{worker.start_method} (start_processes)",
    )


def _check_rank(rank_name: str, rank: int, size_name: str, size: int) -> None:
    if size < 1:
        raise ValueError(f"{size_name}={size}: must be at least 1")
    if not 0 <= rank < size:
        raise ValueError(f"{rank_name}={rank}: must be in [0, {size_name}={size})")
