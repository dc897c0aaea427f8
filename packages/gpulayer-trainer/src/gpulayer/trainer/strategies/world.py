"""Which processes a Trainer trains on: the job a launcher placed, or one it starts on this machine.

Under ``gpulayer launch``, torchrun or Slurm (or in a process group the user made:
``Placement.from_process_group``) the Trainer joins the job it finds and checks that ``devices`` and ``num_nodes``
describe it. A plain ``python train.py`` asking for more than one process becomes ``gpulayer launch
--nproc-per-node N train.py ...`` (the runtime's ``relaunch``). Under Lightning's ``ddp_spawn``, ``ddp_fork`` and
``ddp_notebook`` (and ``"auto"`` in an interactive session) this process stays alone, and each entry point runs in
processes it starts (``started_call.py``).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
from typing import TYPE_CHECKING

import torch

from gpulayer.runtime import Placement, relaunch
from gpulayer.trainer.exceptions import MisconfiguredValueError
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
    strategy = resolve_strategy(args.strategy, wanted, interactive_session())
    if placement.source == "in-process":
        if strategy.start_method != "popen":
            _check_started(args, strategy.start_method, wanted)
            # The caller trains nothing, so it takes no GPU: a CUDA context here would break its forked ranks.
            return dataclasses.replace(placement, accelerator="cpu"), strategy
        if wanted > 1 and interactive_session():
            _refuse_in_interactive_session(args)
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


def interactive_session() -> bool:
    """A Python prompt or notebook, by Lightning 2.6's test (``_IS_INTERACTIVE`` in lightning/fabric/utilities)."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def _check_started(args: TrainerArguments, start_method: str, wanted: int) -> None:
    """Lightning's refusals of started ranks, before any work: spawn at a prompt, fork where the platform has none;
    and GPUlayer's: started ranks live on this machine."""
    if start_method == "spawn" and interactive_session():
        _refuse_in_interactive_session(args)
    if start_method == "fork" and "fork" not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"You selected `Trainer(strategy={args.strategy!r})` but process forking is not supported on this "
            "platform. We recommend `Trainer(strategy='ddp_spawn')` instead."
        )
    if args.num_nodes > 1:
        raise ValueError(
            f"strategy={args.strategy!r} starts its {wanted} processes on this machine, but num_nodes="
            f"{args.num_nodes}; for several machines use strategy='ddp' under gpulayer launch, torchrun or srun"
        )


def _refuse_in_interactive_session(args: TrainerArguments) -> None:
    """Lightning's words for a strategy that cannot start ranks from a prompt or notebook."""
    raise MisconfiguredValueError(
        f"`Trainer(strategy={args.strategy!r})` is not compatible with an interactive environment. Run your code as a "
        "script, or choose a notebook-compatible strategy: `Trainer(strategy='ddp_notebook')`. In case you are "
        "spawning processes yourself, make sure to include the Trainer creation inside the worker function."
    )


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
