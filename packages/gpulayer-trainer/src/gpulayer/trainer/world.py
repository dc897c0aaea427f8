"""Which processes a Trainer trains on: the job a launcher placed, or one it starts on this machine.

Under ``gpulayer launch``, torchrun or Slurm (or in a process group the user made) the Trainer joins the
job it finds and checks that ``devices`` and ``num_nodes`` describe it. A plain ``python train.py`` asking
for more than one process becomes ``gpulayer launch --nproc-per-node N train.py ...``: the process turns into
torch's elastic agent, which runs the script again on every rank (Lightning re-runs it too).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import torch

from gpulayer.runtime import Placement
from gpulayer.trainer.strategy import DDPStrategy, Strategy, resolve_strategy


def find_placement(args: Any) -> tuple[Placement, str, DDPStrategy | Strategy | None]:
    """This process's placement and its strategy (a name, and its options: DDP's, or a registered strategy);
    starts the ranks (and does not return) when this process must launch them."""
    placement = Placement.detect(accelerator=args.accelerator)
    if placement.source == "in-process":
        placement = _process_group_placement(args.accelerator) or placement
    per_node = devices_per_node(args, placement)
    wanted = per_node * args.num_nodes
    name, strategy = resolve_strategy(args.strategy, wanted)
    if placement.source == "in-process":
        if wanted > 1:
            _become_launcher(per_node, args)
        return on_chosen_gpu(placement, args), name, strategy
    if (placement.world_size, placement.local_world_size) != (wanted, per_node):
        raise ValueError(
            f"devices={per_node} and num_nodes={args.num_nodes} ask for {wanted} processes with {per_node} per node, "
            f"but {placement.source} started {placement.world_size} with {placement.local_world_size} per node "
            f"({placement.num_nodes} node(s)); make them agree (devices='auto' takes the launcher's count)"
        )
    return on_chosen_gpu(placement, args), name, strategy


def on_chosen_gpu(placement: Placement, args: Any) -> Placement:
    """On CUDA, the rank with local rank ``r`` trains on GPU ``devices[r]`` (Lightning's ``parallel_devices``); a
    count of devices numbers them from 0, so that is GPU ``r``."""
    if args.accelerator != "cuda" or args.device_indices is None:
        return placement
    return dataclasses.replace(placement, cuda_index=args.device_indices[placement.local_rank])


def devices_per_node(args: Any, placement: Placement) -> int:
    """``devices`` as a count; ``"auto"`` is the launcher's processes per node, else every GPU (Lightning) or 1 CPU."""
    if args.device_indices is not None:
        return len(args.device_indices)
    if placement.source != "in-process":
        return placement.local_world_size
    return torch.cuda.device_count() if args.accelerator == "cuda" else 1


def device_of(args: Any, placement: Placement) -> torch.device:
    return placement.device if args.accelerator == "cuda" else torch.device("cpu")


def _process_group_placement(accelerator: str) -> Placement | None:
    """A default process group the user made outside any launcher: joined as is, one node unless told."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    return Placement(
        world_size=world,
        global_rank=rank,
        local_rank=int(os.environ.get("LOCAL_RANK", rank)),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        num_nodes=world // int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        node_rank=rank // int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        source="process group",
        accelerator=accelerator,
    )


def _become_launcher(per_node: int, args: Any) -> None:
    """Replace this process with ``gpulayer launch`` running this script on ``per_node`` processes here."""
    command = [sys.executable, "-m", "gpulayer.runtime", "launch", "--nproc-per-node", str(per_node)]
    if args.num_nodes > 1:
        command += _node_arguments(args.num_nodes)
    command += _this_script(per_node)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)  # each rank runs the script again: its Trainer picks its GPU from devices


def _node_arguments(num_nodes: int) -> list[str]:
    """Lightning's way to start a node by hand: MASTER_ADDR, MASTER_PORT and NODE_RANK, the same script on each."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK") if not os.environ.get(name)]
    if missing:
        raise RuntimeError(
            f"num_nodes={num_nodes} outside a launcher needs MASTER_ADDR, MASTER_PORT and NODE_RANK on every node "
            f"(missing: {', '.join(missing)}); or start each node with `gpulayer launch --nnodes {num_nodes} "
            "--rdzv-endpoint HOST:PORT ...`, torchrun, or srun"
        )
    endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    node_rank = os.environ["NODE_RANK"]
    return [
        "--nnodes",
        str(num_nodes),
        "--node-rank",
        node_rank,
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        endpoint,
    ]


def _this_script(per_node: int) -> list[str]:
    """How to run ``__main__`` again with its arguments: its path, or ``-m name`` when started with ``-m``."""
    if "PYTEST_CURRENT_TEST" in os.environ:
        raise RuntimeError(
            f"devices={per_node} inside a pytest test would start pytest again on every rank; run the training in a "
            "script (gpulayer.runtime.testing.run_command), or create the process group first and let the "
            "Trainer join it"
        )
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name != "__main__":
        return ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    path = getattr(main, "__file__", None)
    if path is None or not os.path.isfile(path):
        raise RuntimeError(
            f"devices={per_node} starts {per_node} processes by running this script again, but this is an "
            "interactive session; run a script (python train.py), or start the ranks with gpulayer launch, "
            "torchrun or srun"
        )
    return [os.path.abspath(path), *sys.argv[1:]]
