"""``Trainer(profiler=SimpleProfiler(...))`` on 2 gloo ranks under Lightning 2.6 and GPUlayer: each rank writes its own
report, ``fit-{filename}-{local_rank}.txt``, and times actions Lightning times under the same names."""

import pytest

from .conftest import train

pytestmark = pytest.mark.multiprocess


def test_each_rank_writes_its_report_and_times_lightnings_actions(tmp_path):
    runs = {name: train(name, tmp_path / name, profiler="perf", max_epochs=1) for name in ("lightning", "gpulayer")}
    for name in runs:
        assert sorted(path.name for path in (tmp_path / name).glob("fit-*")) == ["fit-perf-0.txt", "fit-perf-1.txt"]
        assert (tmp_path / name / "fit-perf-1.txt").read_text().startswith("FIT Profiler Report")
    for theirs, ours in zip(runs["lightning"], runs["gpulayer"], strict=True):
        assert set(ours["profiled"]) <= set(theirs["profiled"])
        timed = {"[Strategy]DDPStrategy.training_step", "[Strategy]DDPStrategy.backward", "run_training_batch"}
        assert timed <= set(ours["profiled"])
