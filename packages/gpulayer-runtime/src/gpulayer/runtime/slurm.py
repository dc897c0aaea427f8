"""Slurm placement: one task per process, started by ``srun`` (the shape Lightning's SLURMEnvironment reads)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpulayer.runtime.env_values import env_int, require_env

# Interactive allocations (`salloc`, `srun --pty bash`) set SLURM_* but did not start our processes.
INTERACTIVE_JOB_NAMES = ("bash", "interactive")
# Lightning's choice, kept so that a job moved from Lightning uses the same port.
PORT_BASE = 15000

_BRACKET = re.compile(r"\[([^\]]*)\]")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def is_slurm_job(env: Mapping[str, str]) -> bool:
    """True for a batch step with several tasks; false for interactive shells and single-task jobs."""
    if "SLURM_NTASKS" not in env or "SLURM_PROCID" not in env:
        return False
    if env.get("SLURM_JOB_NAME") in INTERACTIVE_JOB_NAMES:
        return False
    return env_int(env, "SLURM_NTASKS", minimum=1) > 1


def placement_fields(env: Mapping[str, str]) -> dict:
    node_rank = env_int(env, "SLURM_NODEID")
    job_id = require_env(env, "SLURM_JOB_ID")
    nodelist = env.get("SLURM_JOB_NODELIST") or require_env(env, "SLURM_NODELIST")
    return dict(
        world_size=env_int(env, "SLURM_NTASKS", minimum=1),
        global_rank=env_int(env, "SLURM_PROCID"),
        local_rank=env_int(env, "SLURM_LOCALID"),
        local_world_size=tasks_on_node(env, node_rank),
        node_rank=node_rank,
        num_nodes=env_int(env, "SLURM_NNODES", minimum=1)
        if "SLURM_NNODES" in env
        else env_int(env, "SLURM_JOB_NUM_NODES", minimum=1),
        master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
        master_port=env_int(env, "MASTER_PORT", minimum=1) if "MASTER_PORT" in env else port_for_job(job_id),
        run_id=job_id,
        source="slurm",
    )


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``"gpu[003-008,011],cpu1"`` gives ``"gpu003"``."""
    first = _split_top_level(nodelist.strip())[0]
    return _BRACKET.sub(lambda m: m.group(1).split(",")[0].split("-")[0], first)


def port_for_job(job_id: str) -> int:
    digits = re.sub(r"\D", "", job_id)
    if not digits:
        raise ValueError(f"environment variable SLURM_JOB_ID={job_id!r}: expected a job number")
    return PORT_BASE + int(digits[-4:])


def tasks_on_node(env: Mapping[str, str], node_rank: int) -> int:
    """Tasks on node ``node_rank``, from Slurm's compact form ``"4(x2),2"`` (4 on nodes 0-1, 2 on node 2)."""
    name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    spec = require_env(env, name)
    counts: list[int] = []
    for part in spec.split(","):
        match = _TASKS.match(part.strip())
        if match is None:
            raise ValueError(f"environment variable {name}={spec!r}: expected a form like '4(x2),2'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if node_rank >= len(counts):
        raise ValueError(f"environment variable {name}={spec!r} lists {len(counts)} nodes; SLURM_NODEID={node_rank}")
    return counts[node_rank]


def _split_top_level(nodelist: str) -> list[str]:
    """Split a hostlist on the commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(nodelist[start:i])
            start = i + 1
    parts.append(nodelist[start:])
    return parts
