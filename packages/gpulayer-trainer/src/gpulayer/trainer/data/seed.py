"""``seed_everything``: Lightning's seeding of Python, NumPy and torch, with its environment variables."""

from __future__ import annotations

import functools
import logging
import os
import random
import warnings

import torch

_log = logging.getLogger(__name__)
_MAX_SEED = 2**32 - 1


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed ``random``, ``numpy.random`` (when installed) and torch on every device; return the seed.

    ``seed=None`` takes ``PL_GLOBAL_SEED`` from the environment, else 0 with a warning. Sets ``PL_GLOBAL_SEED``
    and ``PL_SEED_WORKERS`` as Lightning does, so scripts and spawned processes agree.
    """
    if seed is None:
        from_env = os.environ.get("PL_GLOBAL_SEED")
        if from_env is None:
            warnings.warn(
                "seed_everything: no seed given and PL_GLOBAL_SEED is unset; using 0", UserWarning, stacklevel=2
            )
            seed = 0
        else:
            try:
                seed = int(from_env)
            except ValueError:
                raise ValueError(f"PL_GLOBAL_SEED={from_env!r}: must be an int") from None
    elif not isinstance(seed, int):
        seed = int(seed)
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed={seed}: accepted values are ints in [0, {_MAX_SEED}]")
    if verbose:
        _log.info("Seed set to %d", seed)
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    os.environ["PL_SEED_WORKERS"] = str(int(workers))
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    return seed


def reset_seed() -> None:
    """Seed again as ``seed_everything`` last did, from its environment variables (nothing if it was never called).
    DDP and FSDP runs do this as they start, as Lightning's strategies do in ``setup_distributed``
    (``lightning/pytorch/strategies/ddp.py``), so a model built before the run draws the same after it."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is not None:
        seed_everything(int(seed), workers=os.environ.get("PL_SEED_WORKERS") == "1", verbose=False)


def seed_workers_of(loader: object, rank: int) -> None:
    """After ``seed_everything(workers=True)``: give a DataLoader without ``worker_init_fn`` Lightning's one."""
    if os.environ.get("PL_SEED_WORKERS") == "1" and getattr(loader, "worker_init_fn", False) is None:
        loader.worker_init_fn = functools.partial(worker_init_function, rank=rank)


def worker_init_function(worker_id: int, rank: int = 0) -> None:
    """Lightning's ``pl_worker_init_function``: distinct torch, Python and NumPy seeds per (seed, worker, rank)."""
    base_seed = torch.initial_seed() - worker_id
    seeds = _seed_sequence(base_seed, worker_id, rank, count=4)
    torch.manual_seed(seeds[0])
    random.seed((seeds[1] << 32) | seeds[2])
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(numpy.random.SeedSequence([base_seed, worker_id, rank]).generate_state(4))


def _seed_sequence(base_seed: int, worker_id: int, rank: int, count: int) -> list[int]:
    """Lightning 2.6's ``_generate_seed_sequence``: the (seed, worker, rank) word mixed by MurmurHash3's 64-bit
    finalizer, then ``count`` steps of Knuth's linear congruential generator."""
    mask = (1 << 64) - 1
    combined = (base_seed << 32) | (worker_id << 16) | rank
    combined ^= combined >> 33
    combined = (combined * 0xFF51AFD7ED558CCD) & mask
    combined ^= combined >> 33
    combined = (combined * 0xC4CEB9FE1A85EC53) & mask
    combined ^= combined >> 33
    seeds = []
    for _ in range(count):
        combined = (combined * 6364136223846793005 + 1) & mask
        seeds.append(combined)
    return seeds
