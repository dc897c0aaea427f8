"""``AdvancedProfiler``: each action under its own ``cProfile`` profile, reported with ``pstats`` sorted by
cumulative time (Lightning 2.6's, ``lightning/pytorch/profilers/advanced.py``)."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from collections import defaultdict
from pathlib import Path

from gpulayer.trainer.profilers.profiler import Profiler


class AdvancedProfiler(Profiler):
    """``line_count_restriction``: the rows of each action's report, a count or a fraction in [0, 1];
    ``dump_stats``: also write each action's raw profile to ``{dirpath}/{stage}-{filename}-{action}.prof``."""

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = defaultdict(cProfile.Profile)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats

    def start(self, action_name: str) -> None:
        for profile in self.profiled_actions.values():  # one cProfile may be enabled at a time: the innermost
            profile.disable()
        self.profiled_actions[action_name].enable()

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profile.disable()

    def summary(self) -> str:
        stats = {}
        for action_name, profile in self.profiled_actions.items():
            if self.dump_stats:
                self._dump(action_name, profile)
            text = io.StringIO()
            pstats.Stats(profile, stream=text).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction
            )
            stats[action_name] = text.getvalue()
        return self._stats_to_str(stats)

    def _dump(self, action_name: str, profile: cProfile.Profile) -> None:
        if not self.dirpath:
            raise ValueError("AdvancedProfiler(dump_stats=True) needs a dirpath (or a Trainer's log_dir)")
        os.makedirs(self.dirpath, exist_ok=True)
        profile.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action_name, extension=".prof")))

    def teardown(self, stage: str | None) -> None:
        super().teardown(stage=stage)
        self.profiled_actions.clear()

    def __reduce__(self) -> tuple:
        """Pickles without its ``cProfile`` objects (they do not pickle), as Lightning's does."""
        state = {
            "dirpath": self.dirpath,
            "filename": self.filename,
            "line_count_restriction": self.line_count_restriction,
        }
        return (self.__class__, (), state)
