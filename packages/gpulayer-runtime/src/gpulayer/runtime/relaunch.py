"""``relaunch()``: run this script again under ``gpulayer launch``, on N processes of this machine.

How a plain ``python train.py`` that asks for several processes gets them (Lightning re-runs scripts the same way):
this process becomes torch's elastic agent, which starts the same script, with the same arguments, on every rank.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def relaunch(nproc_per_node: int, num_nodes: int = 1, *, asked_by: str | None = None) -> NoReturn:
    """Replace this process with ``gpulayer launch --nproc-per-node N`` running this script (or ``-m`` module) again.

    With ``num_nodes`` > 1 each node is started by hand, as in Lightning: ``MASTER_ADDR``, ``MASTER_PORT`` and
    ``NODE_RANK`` say where the first node listens and which node this is. ``asked_by`` names what asked for the
    processes in error messages (``"devices=2"``; default ``"nproc_per_node=N"``).
    """
    asked_by = asked_by or f"nproc_per_node={nproc_per_node}"
    command = [sys.executable, "-m", "gpulayer.runtime", "launch", "--nproc-per-node", str(nproc_per_node)]
    if num_nodes > 1:
        command += _node_arguments(num_nodes)
    command += _this_script(nproc_per_node, asked_by)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


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


def _this_script(nproc_per_node: int, asked_by: str) -> list[str]:
    """How to run ``__main__`` again with its arguments: its path, or ``-m name`` when started with ``-m``."""
    # pytest itself, not a script a test started (which inherits PYTEST_CURRENT_TEST but never imports _pytest).
    if "PYTEST_CURRENT_TEST" in os.environ and "_pytest" in sys.modules:
        raise RuntimeError(
            f"{asked_by} inside a pytest test would start pytest again on every rank; run the training in a "
            "script (gpulayer.runtime.testing.run_command), or create the process group first and join it"
        )
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name != "__main__":
        return ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    path = getattr(main, "__file__", None)
    if path is None or not os.path.isfile(path):
        raise RuntimeError(
            f"{asked_by} starts {nproc_per_node} processes by running this script again, but this is an "
            "interactive session; run a script (python train.py), or start the ranks with gpulayer launch, "
            "torchrun or srun"
        )
    return [os.path.abspath(path), *sys.argv[1:]]
