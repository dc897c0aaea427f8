"""``gpulayer consolidate FOLDER -o FILE``: a sharded checkpoint folder made one checkpoint file in the Trainer's format.

The folder is read into this process by the format's owner (gpulayer-trainer's ``checkpoint/sharded.py``,
``load_whole``): the model becomes ``"state_dict"``, the optimizers ``"optimizer_states"`` keyed by parameter index
(the format of a full checkpoint, which one process, DDP and FSDP all load), and the file is written atomically. The
whole checkpoint is held in this process's CPU memory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpulayer.trainer.checkpoint import checkpoint_io, sharded
from gpulayer.trainer.checkpoint.checkpoint_io import METADATA_FILENAME
from gpulayer.trainer.checkpoint.sharded import DCP_METADATA


def consolidate(folder: str | Path, output: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Write the checkpoint in ``folder`` to the one file ``output`` and return it. Bad paths are refused before
    anything is read or written."""
    folder, output = Path(folder), Path(output)
    check_paths(folder, output, force=force)
    checkpoint = sharded.load_whole(folder)
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
