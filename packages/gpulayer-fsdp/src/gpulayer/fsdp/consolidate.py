"""``gpulayer consolidate FOLDER -o FILE``: a sharded checkpoint folder made one checkpoint file in the Trainer's format.

The folder is laid out as Lightning 2.6's FSDP strategy writes it (``lightning/pytorch/strategies/fsdp.py``,
``save_checkpoint``): torch.distributed.checkpoint (DCP) files holding ``"model"`` and ``"optimizer_0"``, ... and a
``meta.pt`` with everything else. DCP reads the shards into one process, as its ``dcp_to_torch_save`` does; the model
becomes ``"state_dict"``, the optimizers ``"optimizer_states"`` keyed by parameter index (the format of a full
checkpoint, which one process, DDP and FSDP all load), and the file is written atomically. The whole checkpoint is
held in this process's CPU memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import DCP_METADATA, METADATA_FILENAME

_OPTIMIZER_PREFIX = "optimizer_"


def consolidate(folder: str | Path, output: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Write the checkpoint in ``folder`` to the one file ``output`` and return it. Bad paths are refused before
    anything is read or written."""
    folder, output = Path(folder), Path(output)
    check_paths(folder, output, force=force)
    checkpoint = load_sharded(folder)
    checkpoint_io.save_atomic(checkpoint, output)
    return checkpoint


def check_paths(folder: Path, output: Path, *, force: bool = False) -> None:
    """Refuse a ``folder`` that is no sharded checkpoint and an ``output`` that would overwrite a file (unless
    ``force``), a folder, or land inside ``folder``."""
    if not folder.is_dir():
        raise ValueError(
            f"{folder} is not a folder: expected a sharded checkpoint folder (DCP shards and {METADATA_FILENAME})"
        )
    for name, what in (
        (DCP_METADATA, "DCP's index of the shards"),
        (METADATA_FILENAME, "the epoch, loops and callbacks"),
    ):
        if not (folder / name).is_file():
            raise ValueError(
                f"{folder} is no whole sharded checkpoint: it has no {name} ({what}); a save that did not finish, "
                "or a folder that is no checkpoint"
            )
    if output.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"output {output} lies inside the checkpoint folder {folder}: choose a path outside it")
    if output.is_dir():
        raise ValueError(f"output {output} is a folder: expected the path of a file")
    if output.exists() and not force:
        raise ValueError(f"output {output} exists: choose another path, or pass --force to overwrite it")


def load_sharded(folder: Path) -> dict[str, Any]:
    """The checkpoint in ``folder`` as one dict in the Trainer's format, its tensors on the CPU."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    meta = checkpoint_io.load(
        folder / METADATA_FILENAME
    )  # checked first: weights_only, so a file holding code is refused
    sharded: dict[str, Any] = {}
    # dcp_to_torch_save's own reading, without its torch.save: no process group, every shard into this process.
    _load_state_dict(
        sharded, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True
    )
    if "model" not in sharded:
        raise ValueError(
            f"{folder} holds no 'model' among its sharded keys ({', '.join(map(repr, sharded)) or 'none'}): it is "
            "not a checkpoint of Lightning's FSDP layout"
        )
    optimizers = sorted(
        (key for key in sharded if key.startswith(_OPTIMIZER_PREFIX) and key[len(_OPTIMIZER_PREFIX) :].isdigit()),
        key=lambda key: int(key[len(_OPTIMIZER_PREFIX) :]),
    )
    checkpoint = {**meta, "state_dict": sharded.pop("model")}
    if optimizers:
        checkpoint["optimizer_states"] = [by_index(sharded.pop(key)) for key in optimizers]
    return {**checkpoint, **sharded}  # keys of a layout other than Lightning's are kept as they are


def by_index(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (FSDP's and DCP's sharded form) keyed by parameter index instead,
    as ``Optimizer.state_dict()`` is: the position of the name in ``param_groups``, group after group."""
    groups = optimizer_state["param_groups"]
    names = [name for group in groups for name in group["params"]]
    if all(isinstance(name, int) for name in names):
        return optimizer_state
    index = {name: position for position, name in enumerate(names)}
    state = optimizer_state["state"]
    return {
        "state": {index[name]: state[name] for name in names if name in state},
        "param_groups": [{**group, "params": [index[name] for name in group["params"]]} for group in groups],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpulayer consolidate",
        description="Turn a sharded checkpoint folder (FSDPStrategy(state_dict_type='sharded')) into one checkpoint "
        "file that load_from_checkpoint, fit(ckpt_path=...) and Lightning load, in one process or any strategy.",
    )
    parser.add_argument("folder", help="the sharded checkpoint folder (DCP shards, .metadata and meta.pt)")
    parser.add_argument("-o", "--output", required=True, help="the checkpoint file to write, outside the folder")
    parser.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    args = parser.parse_args(argv)
    try:
        checkpoint = consolidate(args.folder, args.output, force=args.force)
    except (ValueError, checkpoint_io.DamagedCheckpointError, checkpoint_io.UnsafeCheckpointError) as bad:
        parser.error(str(bad))
    print(
        f"gpulayer consolidate: wrote {args.output} (epoch {checkpoint.get('epoch')}, "
        f"global step {checkpoint.get('global_step')}, {len(checkpoint['state_dict'])} tensors)"
    )
    return 0
