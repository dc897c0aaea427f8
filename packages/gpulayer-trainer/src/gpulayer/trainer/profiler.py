"""``trainer.profiler``: Lightning's ``PassThroughProfiler``, which profiles nothing, so that hooks written for
Lightning (``with self.trainer.profiler.profile("step"):``) run. GPUlayer has no profiler of its own: wrap
``fit`` in ``torch.profiler.profile`` for one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class PassThroughProfiler:
    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        yield action_name

    def describe(self) -> None:
        pass

    def summary(self) -> str:
        return ""
