"""Which processes a Trainer trains on: the job a launcher placed, or one it starts on this machine.

Under ``gpulayer launch``, torchrun or Slurm (or in a process group the user made:
``Placement.from_process_group``) the Trainer joins the job it finds and checks that ``devices`` and ``num_nodes``
describe it. A plain ``python train.py`` asking for more than one process becomes ``gpulayer launch
--nproc-per-node N train.py ...`` (the runtime's ``relaunch``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from gpulayer.runtime import Placement, relaunch
from gpulayer.trainer.strategies.strategy import Strategy
from gpulayer.trainer.strategies.strategy_names import resolve_strategy

if TYPE_CHECKING:
    from gpulayer.trainer.arguments import TrainerArguments


def find_placement(args: TrainerArguments) -> tuple[Placement, Strategy]:
    """This process's placement and the strategy it trains with; starts the ranks (and does not return) when this
    process must launch them."""
    placement = Placement.detect(accelerator=args.accelerator)
    if placement.source == "in-process":
        placement = Placement.from_process_group(accelerator=args.accelerator) or placement
    per_node = devices_per_node(args, placement)
    wanted = per_node * args.num_nodes
    strategy = resolve_strategy(args.strategy, wanted)
    if placement.source == "in-process":
        if wanted > 1:
            relaunch(per_node, args.num_nodes, asked_by=f"devices={per_node}")
        return on_chosen_gpu(placement, args), strategy
    if (placement.world_size, placement.local_world_size) != (wanted, per_node):
        raise ValueError(
            f"devices={per_node} and num_nodes={args.num_nodes} ask for {wanted} processes with {per_node} per node, "
            f"but {placement.source} started {placement.world_size} with {placement.local_world_size} per node "
            f"({placement.num_nodes} node(s)); make them agree (devices='auto' takes the launcher's count)"
        )
    return on_chosen_gpu(placement, args), strategy


def on_chosen_gpu(placement: Placement, args: TrainerArguments) -> Placement:
    """On CUDA, the rank with local rank ``r`` trains on GPU ``devices[r]`` (Lightning's ``parallel_devices``); a
    count of devices numbers them from 0, so that is GPU ``r``."""
    if args.accelerator != "cuda" or args.devices is None:
        return placement
    return dataclasses.replace(placement, cuda_index=args.devices[placement.local_rank])


def devices_per_node(args: TrainerArguments, placement: Placement) -> int:
    """``devices`` as a count; ``"auto"`` is the launcher's processes per node, else every GPU (Lightning) or 1 CPU."""
    if args.devices is not None:
        return len(args.devices)
    if placement.source != "in-process":
        return placement.local_world_size
    return torch.cuda.device_count() if args.accelerator == "cuda" else 1


def device_of(args: TrainerArguments, placement: Placement) -> torch.device:
    return placement.device if args.accelerator == "cuda" else torch.device("cpu")
