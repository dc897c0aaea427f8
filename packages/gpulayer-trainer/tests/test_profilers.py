"""``Trainer(profiler=...)``: the profiled path is chosen once, as the Trainer is built, and a Trainer without a
profiler has today's hook caller and loop methods; each profiler's records, reports and files."""

import functools
import logging

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import (
    AdvancedProfiler,
    Callback,
    Module,
    PassThroughProfiler,
    Profiler,
    PyTorchProfiler,
    SimpleProfiler,
    Trainer,
    seed_everything,
)
from gpulayer.trainer.core.hooks import Hooks, _call_step
from gpulayer.trainer.core.profiled_hooks import ProfiledHooks
from gpulayer.trainer.exceptions import MisconfigurationException
from gpulayer.trainer.loops.evaluation_loop import EvaluationLoop
from gpulayer.trainer.loops.fit_loop import FitLoop
from gpulayer.trainer.loops.transfer import BatchTransfer
from gpulayer.trainer.profilers.attach import Timed


class Line(Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        with self.trainer.profiler.profile("my_block"):  # a Lightning user's own action
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.log("test", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def on_train_epoch_start(self):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class EpochEnd(Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        pass


def _loader():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(10, 2, generator=generator), torch.randn(10, 1, generator=generator))
    return DataLoader(data, batch_size=4)


def _trainer(tmp_path, **kwargs):
    options = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False, "max_epochs": 1}
    return Trainer(default_root_dir=tmp_path, **options | kwargs)


def _all_stages(trainer, model=None):
    model = model or Line()
    trainer.fit(model, _loader(), _loader())
    trainer.validate(model, _loader(), verbose=False)
    trainer.test(model, _loader(), verbose=False)
    trainer.predict(model, _loader())
    return model


def test_without_a_profiler_the_hook_caller_and_loop_methods_are_todays_objects(tmp_path):
    trainer = _trainer(tmp_path)
    _all_stages(trainer)
    assert type(trainer.profiler) is PassThroughProfiler
    assert type(trainer._hooks) is Hooks
    for loop in (trainer.fit_loop, trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        assert not {"run", "run_epoch", "run_batch"} & vars(loop).keys()
        assert loop.run.__func__ is (FitLoop.run if loop is trainer.fit_loop else EvaluationLoop.run)
    for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop):
        assert loop.iterate is iter
    assert "source" not in vars(trainer.fit_loop.transfer)
    assert trainer.fit_loop.transfer.source.__func__ is BatchTransfer.source
    assert "save_checkpoint" not in vars(trainer)
    step = trainer._hooks.step_caller("training_step")
    assert isinstance(step, functools.partial) and step.func is _call_step


def test_with_a_profiler_the_hooks_and_loops_are_the_timed_ones(tmp_path):
    trainer = _trainer(tmp_path, profiler="simple")
    assert type(trainer._hooks) is ProfiledHooks
    assert isinstance(trainer.fit_loop.run_epoch, Timed)
    assert isinstance(trainer.save_checkpoint, Timed)
    assert all(loop.iterate is not iter for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop))


def test_a_profiled_run_trains_the_same_as_an_unprofiled_one(tmp_path):
    weights = []
    for profiler in (None, "simple", "advanced"):
        seed_everything(7)
        model = Line()
        trainer = _trainer(tmp_path, profiler=profiler, max_epochs=2)
        trainer.fit(model, _loader(), _loader())
        weights.append((trainer.global_step, torch.cat([p.detach().flatten() for p in model.parameters()])))
    for step, weight in weights[1:]:
        assert step == weights[0][0]
        torch.testing.assert_close(weight, weights[0][1], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("given", "kind"),
    [("simple", SimpleProfiler), ("Advanced", AdvancedProfiler), ("PYTORCH", PyTorchProfiler), (None, None)],
)
def test_lightnings_names_make_their_profiler(tmp_path, given, kind):
    profiler = _trainer(tmp_path, profiler=given).profiler
    assert type(profiler) is (kind or PassThroughProfiler)


def test_a_profiler_object_is_the_trainers_and_bad_values_are_refused(tmp_path):
    mine = SimpleProfiler(filename="perf")
    assert _trainer(tmp_path, profiler=mine).profiler is mine
    with pytest.raises(MisconfigurationException, match=r"it can only be one of \['simple', 'advanced', 'pytorch'\]"):
        _trainer(tmp_path, profiler="xla")
    with pytest.raises(ValueError, match="barebones=True with profiler='simple'"):
        _trainer(tmp_path, profiler="simple", barebones=True, logger=None, enable_checkpointing=None)
    with pytest.raises(ValueError, match=r"Lightning's class; use gpulayer\.trainer\.SimpleProfiler"):
        _trainer(tmp_path, profiler="lightning.pytorch.profilers.SimpleProfiler")  # a config's class_path
    lightnings = type("SimpleProfiler", (), {"__module__": "lightning.pytorch.profilers.simple"})()
    with pytest.raises(TypeError, match=r"a Lightning profiler; use gpulayer\.trainer\.SimpleProfiler"):
        _trainer(tmp_path, profiler=lightnings)


def test_each_stage_writes_its_report_to_stage_filename_under_dirpath(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path / "reports", filename="perf")
    _all_stages(_trainer(tmp_path, profiler=profiler, callbacks=[EpochEnd()]))
    written = sorted(path.name for path in (tmp_path / "reports").iterdir())
    assert written == ["fit-perf.txt", "predict-perf.txt", "test-perf.txt", "validate-perf.txt"]
    fit = (tmp_path / "reports" / "fit-perf.txt").read_text()
    assert fit.startswith("FIT Profiler Report")
    for action in (
        "run_training_epoch",
        "run_training_batch",
        "my_block",
        "[LightningModule]Line.on_train_epoch_start",
        "[Callback]EpochEnd.on_train_epoch_end",
        "[Strategy]SingleDeviceStrategy.training_step",
        "[Strategy]SingleDeviceStrategy.backward",
        "[_TrainingEpochLoop].train_dataloader_next",
        "[_EvaluationLoop].val_next",
    ):
        assert f"|  {action} " in fit, action
    assert "[_PredictionLoop].predict_next" in (tmp_path / "reports" / "predict-perf.txt").read_text()


def test_a_filename_without_dirpath_goes_to_the_log_dir(tmp_path):
    _trainer(tmp_path, profiler=SimpleProfiler(filename="perf")).fit(Line(), _loader())
    assert (tmp_path / "fit-perf.txt").is_file()


def test_without_a_filename_the_report_goes_to_the_log_at_info(tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="gpulayer.trainer.profilers.profiler"):
        _trainer(tmp_path, profiler="simple").fit(Line(), _loader())
    reports = [record.getMessage() for record in caplog.records if "Profiler Report" in record.getMessage()]
    assert len(reports) == 1 and reports[0].startswith("FIT Profiler Report")
    assert "Profiler Report" not in capsys.readouterr().out


def test_the_simple_report_table(tmp_path):
    profiler = SimpleProfiler(extended=False)
    profiler.setup(stage="fit")
    for _ in range(2):
        with profiler.profile("a long action name"):
            pass
    lines = profiler.summary().splitlines()
    assert lines[0] == "FIT Profiler Report"
    assert [cell.strip() for cell in lines[3].split("|")] == ["", "Action", "Mean duration (s)", "Total time (s)", ""]
    assert lines[5].startswith("|  a long action name\t|")
    with pytest.raises(ValueError, match="Attempting to stop recording an action"):
        profiler.stop("never started")
    profiler.start("twice")
    with pytest.raises(ValueError, match=r"Attempted to start twice which has already started\."):
        profiler.start("twice")


def test_a_profilers_file_name_holds_the_stage_the_rank_and_the_action(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="perf")
    profiler.setup(stage="fit", local_rank=1)
    assert profiler._prepare_filename(action_name="[Strategy]X.training_step", extension=".json") == (
        "fit-perf-1-[Strategy]X.training_step.json"
    )
    assert SimpleProfiler()._prepare_filename() == "profile.txt"


def test_the_advanced_profiler_reports_pstats_per_action_and_dumps_them(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="perf", line_count_restriction=5, dump_stats=True)
    _trainer(tmp_path, profiler=profiler).fit(Line(), _loader())
    report = (tmp_path / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report")
    assert "Profile stats for: run_training_epoch" in report and "Ordered by: cumulative time" in report
    assert (tmp_path / "fit-perf-run_training_epoch.prof").is_file()


def test_the_pytorch_profiler_writes_its_table_and_a_chrome_trace_on_the_cpu(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="perf", row_limit=5)
    _trainer(tmp_path, profiler=profiler).fit(Line(), _loader(), _loader())
    report = (tmp_path / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report\nProfile stats for: records\n")
    assert "Self CPU %" in report and "[pl][profile]" in report
    traces = [path.name for path in tmp_path.glob("*.pt.trace.json")]
    assert len(traces) == 1 and traces[0].startswith("fit-perf-[Strategy]SingleDeviceStrategy.")


def test_the_pytorch_profilers_refusals():
    with pytest.raises(MisconfigurationException, match="Found sort_by_key: bogus"):
        PyTorchProfiler(sort_by_key="bogus")
    with pytest.raises(KeyError, match="This is already a positional argument"):
        PyTorchProfiler(table_kwargs={"row_limit": 3})
    with pytest.raises(KeyError, match="Found invalid table_kwargs key: bogus"):
        PyTorchProfiler(table_kwargs={"bogus": 3})
    with pytest.raises(MisconfigurationException, match="Schedule should be a callable"):
        PyTorchProfiler(schedule=3)
    with pytest.raises(MisconfigurationException, match="emit_nvtx=True"):
        PyTorchProfiler(emit_nvtx=True)


def test_a_custom_profiler_subclass_is_called_around_each_stage(tmp_path):
    class Recording(Profiler):
        def __init__(self):
            super().__init__()
            self.calls = []

        def start(self, action_name):
            self.calls.append(("start", action_name))

        def stop(self, action_name):
            self.calls.append(("stop", action_name))

        def setup(self, stage, local_rank=None, log_dir=None):
            super().setup(stage, local_rank, log_dir)
            self.calls.append(("setup", stage, local_rank, log_dir))

        def summary(self):
            self.calls.append(("summary", self._stage))
            return ""

    profiler = Recording()
    _trainer(tmp_path, profiler=profiler).fit(Line(), _loader())
    setups = [call for call in profiler.calls if call[0] == "setup"]
    assert setups == [("setup", "fit", None, str(tmp_path))]
    assert profiler.calls[-1] == ("summary", "fit")
    assert ("start", "run_training_batch") in profiler.calls
