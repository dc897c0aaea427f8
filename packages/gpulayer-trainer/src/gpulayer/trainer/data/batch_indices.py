"""The sampler's indices of each predict batch, recorded for prediction writers (Lightning 2.6's
``_IndexBatchSamplerWrapper``, ``lightning/pytorch/overrides/distributed.py``).

A predict loader gets this batch sampler only while a prediction writer is among the callbacks. It holds only the
batches drawn and not yet taken by the loop (those its workers prefetch), where Lightning's keeps every batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any


class BatchIndices:
    """A batch sampler that keeps the indices of each batch it gives until the loop ``take``s them, in order."""

    def __init__(self, batch_sampler: Iterable[list[int]]) -> None:
        self.batch_sampler = batch_sampler
        self._drawn: deque[list[int]] = deque()

    def __iter__(self) -> Iterator[list[int]]:
        self._drawn.clear()  # a new pass over the loader
        for indices in self.batch_sampler:
            self._drawn.append(indices)
            yield indices

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:
        # The wrapped batch sampler's ``sampler``, ``batch_size`` and ``drop_last``; nothing private (unpickling
        # looks for hooks before ``batch_sampler`` is set).
        if name.startswith("_") or name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)

    def take(self) -> list[int]:
        """The indices of the oldest batch drawn and not yet taken: the batch the loop is about to run."""
        return self._drawn.popleft()
