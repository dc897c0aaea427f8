"""Every Python call of one steady-state GPUlayer step on the MLP: ``python step_calls.py [--all] [--workload W]``.

Trains the ``gpulayer`` variant's module (one process, CPU) and records, with ``sys.setprofile``, the calls made
from the start of ``training_step`` at batch 100 to the start of the one at batch 101: the user's step, the
optimizer's, the loop's bookkeeping and the next batch. Prints them as a tree, GPUlayer's frames marked ``*``;
without ``--all`` a library's frame (torch's, Python's) called by a library's frame is folded into its caller.
``--workload default_install`` (or ``default_install_batch_hook``) trains in that workload's configuration
(checkpoints, CSV logger, StepLR, LR monitor; and the batch counter's ``on_train_batch_end``) for one epoch, so
batch 100 is mid-epoch.
benchmarks/README.md keeps the result.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from types import FrameType
from typing import Any

import torch
from default_install import callbacks, configure_optimizers
from workloads import WORKLOADS

TRACED_STEP = 100
# The benchmark's own frames: the user's code in a real script.
USER_FILES = ("workloads.py", "default_install.py", "step_calls.py")


class CallTree:
    """The calls seen between ``start`` and ``stop``, as (depth, where) pairs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self._depth = 0

    def start(self) -> None:
        self._depth = 0
        sys.setprofile(self._record)

    def stop(self) -> None:
        sys.setprofile(None)

    def _record(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.calls.append((self._depth, _where(frame)))
            self._depth += 1
        elif event == "return":
            self._depth -= 1


def _where(frame: FrameType) -> str:
    path = frame.f_code.co_filename
    if "gpulayer/" in path:
        where = "* gpulayer/" + path.split("gpulayer/", 1)[1]
    elif "site-packages/" in path:
        where = path.split("site-packages/", 1)[1]
    else:  # Python's own modules, the benchmark's files
        where = os.path.basename(path)
    return f"{where}:{frame.f_code.co_name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="show every frame of torch and Python's libraries too")
    parser.add_argument("--workload", choices=("mlp", "default_install", "default_install_batch_hook"), default="mlp")
    args = parser.parse_args()
    from gpulayer.trainer import Module, Trainer

    torch.set_num_threads(1)
    workload, tree = WORKLOADS[args.workload], CallTree()

    class Bench(Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = workload.seeded_net()

        def training_step(self, batch, batch_idx):
            if batch_idx in (TRACED_STEP, TRACED_STEP + 1):
                (tree.start if batch_idx == TRACED_STEP else tree.stop)()
            loss = workload.loss(self.net, batch)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            if workload.default_install:
                return configure_optimizers(self.parameters(), workload.lr)
            return torch.optim.SGD(self.parameters(), lr=workload.lr)

    with tempfile.TemporaryDirectory() as root:
        lean = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
        if workload.default_install:  # the trainer's default checkpoint and CSV logger
            lean = {"enable_progress_bar": False, "callbacks": callbacks("gpulayer", workload.batch_hook)}
        trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, benchmark=False, default_root_dir=root, **lean)
        batches = WORKLOADS["mlp"].batches(TRACED_STEP + 10)  # one epoch
        trainer.fit(Bench(), torch.utils.data.DataLoader(batches, batch_size=None))
    _print(tree.calls, fold_libraries=not args.all)


def _print(calls: list[tuple[int, str]], fold_libraries: bool) -> None:
    shallowest = min(depth for depth, _ in calls)
    library_at: dict[int, bool] = {}  # whether the frame open at each depth is a library's (torch's, Python's)
    ours = 0
    for depth, where in calls:
        in_library = not where.startswith(("* ", *USER_FILES))
        library_at[depth] = in_library
        if fold_libraries and in_library and library_at.get(depth - 1, False):
            continue  # a library frame called by a library frame: folded into its caller
        ours += where.startswith("*")
        print("  " * (depth - shallowest) + where)
    print(f"{ours} calls of GPUlayer's")


if __name__ == "__main__":
    main()
