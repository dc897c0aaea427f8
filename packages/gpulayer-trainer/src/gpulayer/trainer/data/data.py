"""Where each stage's loaders come from, how many batches each gives, and iterating them.

Loaders come from the entry point's arguments, else the DataModule's hook, else the module's (Lightning's
precedence). Iterators are created at the moments Lightning creates them, because creating a DataLoader
iterator draws from the global RNG: matching the moments keeps runs bit-for-bit comparable.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from gpulayer.trainer.core.datamodule import DataModule, datamodule_overrides
from gpulayer.trainer.core.hooks import is_overridden
from gpulayer.trainer.core.module import Module
from gpulayer.trainer.data.loader_rebuild import capturing_init_arguments, is_shuffled
from gpulayer.trainer.data.samplers import set_sampler_epoch
from gpulayer.trainer.data.seed import seed_workers_of
from gpulayer.trainer.exceptions import MisconfiguredValueError, PossibleUserWarning

PREFIX = {"fit": "train", "validate": "val", "test": "test", "predict": "predict"}


class DataSource:
    """One stage's loaders: given directly, or a DataModule/Module hook such as ``val_dataloader``."""

    def __init__(self, given: Any, datamodule: DataModule | None, module: Module, hook: str) -> None:
        self.given = given
        self.hook = hook
        if given is not None:
            self.owner: Any = None
        elif datamodule_overrides(datamodule, hook):
            self.owner = datamodule
        elif is_overridden(hook, module, Module):
            self.owner = module
        else:
            self.owner = None

    def is_defined(self) -> bool:
        return self.given is not None or self.owner is not None

    def request(self, hooks: Any, rank: int) -> Any:
        """The loaders, from the hook if that is where they come from; seeded workers as ``seed_everything`` asked."""
        if self.given is not None:
            loaders = self.given
        elif self.owner is None:
            raise MisconfiguredValueError(
                f"no {self.hook.removesuffix('_dataloader')} data: pass loaders or define {self.hook}()"
            )
        else:
            with capturing_init_arguments():  # so that a loader the hook makes can be remade by its own class
                loaders = (
                    hooks.module(self.hook) if isinstance(self.owner, Module) else getattr(self.owner, self.hook)()
                )
        inner = list(loaders.values()) if isinstance(loaders, dict) else loaders
        for loader in inner if isinstance(inner, (list, tuple)) else [loaders]:
            self._check_iterable(loader)
            seed_workers_of(loader, rank)
            if rank == 0 and isinstance(getattr(loader, "dataset", None), IterableDataset) and has_length(loader):
                warnings.warn(  # Lightning's has_len_all_ranks, which every loop calls on each loader it loads
                    "Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading "
                    "(when num_workers > 1), `__len__` could be inaccurate if each worker is not configured "
                    "independently to avoid having duplicate data.",
                    UserWarning,
                    stacklevel=4,
                )
        return loaders

    def _check_iterable(self, loader: Any) -> None:
        """Lightning's ``TypeError`` for a loader that cannot be iterated (``_check_dataloader_iterable``)."""
        if isinstance(loader, DataLoader):
            return
        try:
            iter(loader)
        except TypeError:
            where = "was given" if self.owner is None else f"came from {type(self.owner).__name__}.{self.hook}()"
            raise TypeError(
                f"a {self.hook.removesuffix('_dataloader')} loader that is not iterable {where}: {loader!r}; "
                "give a DataLoader or another iterable of batches"
            ) from None


def as_loader_list(loaders: Any, stage: str) -> list[Any]:
    """An evaluation stage's loaders: one loader or a list/tuple of them."""
    if isinstance(loaders, dict):
        raise NotImplementedError(f"a dict of {stage} loaders is not supported; pass one loader or a list")
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def train_loader(loaders: Any) -> tuple[Any, Callable[[Any], Any] | None]:
    """The training loader, and how its batches are shaped: one loader in a list, tuple or dict gives each batch in
    that container (``[batch]``, ``(batch,)``, ``{name: batch}``), as Lightning 2.6's ``CombinedLoader`` does."""
    if not isinstance(loaders, (list, tuple, dict)) or not loaders:  # an empty one trains no batch, as Lightning's
        return loaders, None
    inner = list(loaders.values()) if isinstance(loaders, dict) else list(loaders)
    if len(inner) != 1 or isinstance(inner[0], (list, tuple, dict)):
        raise NotImplementedError(
            f"train_dataloaders (or train_dataloader()) is a {type(loaders).__name__} of {len(inner)} loaders: GPUlayer "
            "trains on one loader, given alone or as the only one in a list, tuple or dict; combine them into one "
            "(for example with torch.utils.data.ConcatDataset)"
        )
    if isinstance(loaders, dict):
        (name,) = loaders
        return inner[0], lambda batch: {name: batch}
    return inner[0], (lambda batch: [batch]) if isinstance(loaders, list) else (lambda batch: (batch,))


def has_length(loader: Any) -> bool:
    """Whether ``len(loader)`` works; a ``__len__`` that raises ``NotImplementedError`` means no length, as in
    Lightning (an iterable dataset's loader often does that)."""
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        return False
    return True


def num_batches(loader: Any, limit: int | float, stage: str) -> int | float:
    """Lightning's ``_parse_num_batches``: ints cap the count, floats take a (floored) fraction."""
    length: int | float = len(loader) if has_length(loader) else math.inf
    if length == 0:
        return 0
    if isinstance(limit, int):
        count: int | float = min(length, limit)
    elif length != math.inf:
        count = int(length * limit)
    elif limit != 1.0:
        raise MisconfiguredValueError(
            f"limit_{stage}_batches={limit!r}: a loader without a length needs 1.0 or an int (a number of batches)"
        )
    else:
        count = length
    if count == 0 and isinstance(limit, float) and limit > 0.0 and length != math.inf:
        raise MisconfiguredValueError(
            f"limit_{stage}_batches={limit!r} of {length} batches is less than one batch; "
            f"use at least limit_{stage}_batches={1.0 / length}"
        )
    return count


def data_rng_state(loader: Any) -> dict[str, torch.Tensor]:
    """What decides a loader's order: the global torch RNG and any generator of the loader or its sampler."""
    state = {"torch": torch.get_rng_state()}
    for name, generator in _generators(loader).items():
        state[name] = generator.get_state()
    return state


def set_data_rng_state(loader: Any, state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    for name, generator in _generators(loader).items():
        if name in state:
            generator.set_state(state[name])


def _generators(loader: Any) -> dict[str, torch.Generator]:
    found = {
        "loader": getattr(loader, "generator", None),
        "sampler": getattr(getattr(loader, "sampler", None), "generator", None),
    }
    return {name: generator for name, generator in found.items() if isinstance(generator, torch.Generator)}


def epoch_iterator(loader: Any, progress: Any) -> Iterator[Any]:
    """A new epoch's iterator, from the start of its global order, with the RNG state it is made with kept in
    ``progress`` for a resume."""
    set_sampler_epoch(loader, progress.epochs_processed)
    progress.order.start_batch = progress.order.start_sample = 0
    progress.data_snapshots = {"iter": data_rng_state(loader)}
    return iter(loader)


def replayed_iterator(loader: Any, progress: Any, consumed: int, count: int | float) -> Iterator[Any]:
    """This epoch's iterator, remade from the RNG states it was made and first read with, past ``consumed``
    batches (``count``: the epoch's batches, ``inf`` for a loader without a length)."""
    if count == math.inf:
        warnings.warn(
            f"resuming in the middle of an epoch of a loader without a length: its first {consumed} batches are "
            "read again and skipped, which resumes exactly only if it yields the same batches in the same order",
            UserWarning,
            stacklevel=4,
        )
    now = torch.get_rng_state()
    snapshots = progress.data_snapshots
    set_sampler_epoch(loader, progress.epochs_processed)
    set_data_rng_state(loader, snapshots["iter"])
    iterator = iter(loader)
    set_data_rng_state(loader, snapshots["first"])
    for _ in range(consumed):
        next(iterator)
    torch.set_rng_state(now)
    return iterator


def batches(iterator: Iterator[Any], count: int | float, start: int = 0) -> Iterator[tuple[int, Any, bool]]:
    """``(batch_idx, batch, is_last)`` from ``start`` up to ``count`` batches; looks one ahead only when ``count``
    is unknown."""
    if count == math.inf:
        return _looking_ahead(iterator, start)
    # Built from C iterators, so no Python frame runs per batch: zip asks the range first (no batch is read past
    # ``count``) and ends where ``next(iterator)`` raises StopIteration.
    read = map(next, itertools.repeat(iterator))
    last = itertools.chain(itertools.repeat(False, int(count) - start - 1), (True,))
    return zip(range(start, int(count)), read, last, strict=False)  # the loader may end early


def _looking_ahead(iterator: Iterator[Any], start: int) -> Iterator[tuple[int, Any, bool]]:
    try:
        upcoming = next(iterator)
    except StopIteration:
        return
    batch_idx = start
    while True:
        batch = upcoming
        try:
            upcoming = next(iterator)
        except StopIteration:
            yield batch_idx, batch, True
            return
        yield batch_idx, batch, False
        batch_idx += 1


def agreed_batches(runtime: Any, loaders: list[Any], counts: list[int | float], stage: str) -> list[int | float]:
    """The batch counts every rank runs for ``loaders``: the smallest rank's, per loader (one collective, at setup).

    Ranks that run different numbers of batches would wait for each other forever, so uneven data is cut to the
    shortest rank's, with a warning naming every rank's counts. A loader empty on some ranks only is an error on
    every rank (Lightning raises on the empty rank alone); empty on all of them, Lightning's warning.
    """
    every_rank = [list(counts)] if runtime.world_size == 1 else runtime.all_gather(list(counts))
    for index, per_rank in enumerate(zip(*every_rank, strict=True)):
        if not any(per_rank):
            warnings.warn(
                f"Total length of `{type(loaders[index]).__name__}` across ranks is zero. Please make sure this was "
                "your intention.",
                UserWarning,
                stacklevel=3,
            )
        elif not all(per_rank):
            empty = [rank for rank, count in enumerate(per_rank) if count == 0]
            raise RuntimeError(
                f"{stage} loader {index} has zero length on rank(s) {empty} but batches on the others "
                f"({list(per_rank)}, by rank): make sure that it returns at least 1 batch on every rank"
            )
    agreed = [min(per_loader) for per_loader in zip(*every_rank, strict=True)]
    if any(rank_counts != agreed for rank_counts in every_rank):
        warnings.warn(
            f"the ranks have different numbers of {stage} batches ({every_rank}, by rank); every rank runs "
            f"{agreed}, so the others' extra batches are not used",
            UserWarning,
            stacklevel=3,
        )
    return agreed


def stop_together(iterator: Iterator[Any], runtime: Any) -> Iterator[Any]:
    """A loader without a length, read on several ranks: each batch is taken only if every rank has one (one small
    collective per batch, the price of never hanging on uneven streams; give the loader a length to avoid it).
    Used even under an int ``limit_*_batches``: a stream may end before the limit on one rank only."""
    while True:
        try:
            batch, has_batch = next(iterator), True
        except StopIteration:
            batch, has_batch = None, False
        if not runtime.all(has_batch):
            return
        yield batch


def reload_due(args: Any, current_epoch: int, loaded_at_epoch: int) -> bool:
    """``reload_dataloaders_every_n_epochs=n``: request a loader again once ``n`` epochs have completed since it was
    last requested (Lightning's ``_should_reload_train_dl`` and ``_should_reload_val_dl``)."""
    every = args.reload_dataloaders_every_n_epochs
    return bool(every) and current_epoch - loaded_at_epoch >= every


def shut_down_workers(loaders: Iterable[Any]) -> None:
    """A stage's end, as Lightning's: a DataLoader's persistent workers stop (its next iteration starts new ones)."""
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            iterator._shutdown_workers()
        if iterator is not None:
            loader._iterator = None


def warn_too_few_batches_to_log(batches: int | float, log_every_n_steps: int, is_global_zero: bool) -> None:
    """Lightning's warning (on global rank 0): no row of the logger would come from this epoch's steps."""
    if is_global_zero:
        warnings.warn(
            f"The number of training batches ({batches}) is smaller than the logging interval "
            f"Trainer(log_every_n_steps={log_every_n_steps}). Set a lower value for log_every_n_steps if you want "
            "to see logs for the training epoch.",
            PossibleUserWarning,
            stacklevel=3,
        )


def warn_if_shuffled(loader: Any, prefix: str, is_global_zero: bool) -> None:
    """Lightning's ``PossibleUserWarning`` (on global rank 0) for a val/test/predict loader whose sampler shuffles."""
    if is_global_zero and is_shuffled(loader):
        warnings.warn(
            f"Your `{prefix}_dataloader`'s sampler has shuffling enabled, it is strongly recommended that you turn "
            "shuffling off for val/test dataloaders.",
            PossibleUserWarning,
            stacklevel=4,
        )
