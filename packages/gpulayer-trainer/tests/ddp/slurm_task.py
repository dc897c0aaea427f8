"""One Slurm task, as ``srun`` starts it: ``slurm_task.py STORE_PATH train_script.py ARGS...``.

The tasks meet through a FileStore at STORE_PATH (a test must not depend on a fixed port), then run the training
script, whose Trainer reads its placement from SLURM_* and joins that process group.
"""

import os
import runpy
import sys

import torch.distributed as dist

store_path, script = sys.argv[1], sys.argv[2]
world_size, rank = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_PROCID"])
dist.init_process_group("gloo", store=dist.FileStore(store_path, world_size), rank=rank, world_size=world_size)
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
