"""``Trainer(profiler=...)`` under Lightning 2.6 and GPUlayer: the actions each profiler times (names and counts),
the report's layout, the files each stage writes, where a report without a file goes, and the values accepted.

GPUlayer times the hooks it calls: a module and a callback that override every hook are timed at the same points,
as often, under the same names. Lightning also times hooks of its strategy that GPUlayer's strategies do not have
(``UNMAPPED``), and every hook a module or callback leaves to its base class (GPUlayer skips those: a plain module
shows fewer rows).
"""

import logging
import re
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl

from .conftest import quiet_lightning

STAGES = ("fit", "validate", "test", "predict")
# Lightning's Strategy hooks, timed by its _call_strategy_hook; GPUlayer's strategies have no such hooks.
UNMAPPED = re.compile(r"\[Strategy\]SingleDeviceStrategy\.on_(train|validation|test|predict)(_batch)?_(start|end)$")
MODULE_HOOKS = (
    "prepare_data",
    "setup",
    "teardown",
    "configure_model",
    "configure_callbacks",
    "on_fit_start",
    "on_fit_end",
    "on_train_start",
    "on_train_end",
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "optimizer_step",
    "optimizer_zero_grad",
    "configure_gradient_clipping",
    "backward",
    "on_before_batch_transfer",
    "transfer_batch_to_device",
    "on_after_batch_transfer",
    "on_validation_model_zero_grad",
    *(f"on_{stage}_model_{mode}" for stage in ("validation", "test") for mode in ("eval", "train")),
    "on_predict_model_eval",
    *(f"on_{stage}_{when}" for stage in ("validation", "test", "predict") for when in ("start", "end")),
    *(
        f"on_{stage}_{part}_{when}"
        for stage in ("train", "validation", "test", "predict")
        for part in ("epoch", "batch")
        for when in ("start", "end")
    ),
)
CALLBACK_HOOKS = (
    *(name for name in MODULE_HOOKS if name.startswith("on_") and "model" not in name and "transfer" not in name),
    "setup",
    "teardown",
    "on_sanity_check_start",
    "on_sanity_check_end",
)


def _framework(name):
    """(Trainer, Module, Callback, the profilers' namespace, the Trainer's quiet options) of one framework."""
    if name == "gpulayer":
        return gl.Trainer, gl.Module, gl.Callback, gl, {}
    pl = quiet_lightning()
    quiet = {"enable_progress_bar": False, "enable_model_summary": False}
    return pl.Trainer, pl.LightningModule, pl.Callback, pl.profilers, quiet


def _base_call(name):
    def hook(self, *args, **kwargs):
        return getattr(super(type(self), self), name)(*args, **kwargs)

    return hook


def _module_class(base, every_hook):
    class Line(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def test_step(self, batch, batch_idx):
            self.log("test", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def predict_step(self, batch, batch_idx):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if every_hook:
        for name in MODULE_HOOKS:
            setattr(Line, name, _base_call(name))
    return Line


def _loader():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(10, 2, generator=generator), torch.randn(10, 1, generator=generator))
    return DataLoader(data, batch_size=4)


def _run(name, root, profiler, every_hook=True, stages=STAGES, **trainer):
    """Each stage of ``stages`` under ``name``'s framework, in ``root``, with ``profiler(namespace, root)``; returns
    the profiler."""
    Trainer, Module, Callback, namespace, quiet = _framework(name)
    profiler = profiler(namespace, root)
    hooks = CALLBACK_HOOKS if every_hook else ("on_train_epoch_end",)
    callback = type("Every", (Callback,), {hook: _base_call(hook) for hook in hooks})()
    options = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False, "max_epochs": 2}
    trainer = Trainer(default_root_dir=root, profiler=profiler, callbacks=[callback], **options | quiet | trainer)
    model = _module_class(Module, every_hook)()
    for stage in stages:
        if stage == "fit":
            trainer.fit(model, _loader(), _loader())
        else:
            getattr(trainer, stage)(model, _loader(), **({} if stage == "predict" else {"verbose": False}))
    return trainer.profiler


def _counts_per_stage(name, tmp_path, every_hook):
    counts = {}
    for stage in STAGES:  # one Trainer per stage: a SimpleProfiler's records run on across entry points
        with warnings.catch_warnings():
            recorded = _run(name, tmp_path / name, lambda p, root: p.SimpleProfiler(), every_hook, stages=(stage,))
        counts[stage] = {action: len(times) for action, times in recorded.recorded_durations.items()}
    return counts


def test_the_same_actions_are_timed_as_often_where_both_call_the_hook(tmp_path):
    theirs, ours = (_counts_per_stage(name, tmp_path, every_hook=True) for name in ("lightning", "gpulayer"))
    for stage in STAGES:
        unmapped = {action for action in theirs[stage] if UNMAPPED.match(action)}
        assert unmapped, stage  # the pattern still names something Lightning times
        assert ours[stage] == {action: n for action, n in theirs[stage].items() if action not in unmapped}, stage
    assert ours["fit"]["[Strategy]SingleDeviceStrategy.backward"] == 6
    assert ours["fit"]["[_TrainingEpochLoop].train_dataloader_next"] == 6


def test_a_plain_module_has_fewer_rows_all_of_them_lightnings(tmp_path):
    theirs, ours = (_counts_per_stage(name, tmp_path, every_hook=False) for name in ("lightning", "gpulayer"))
    for stage in STAGES:
        assert ours[stage].items() <= theirs[stage].items(), stage


def _cells(line):
    return [cell.strip() for cell in line.split("|")[1:-1]]


@pytest.mark.parametrize("extended", [True, False])
def test_the_simple_report_has_lightnings_layout(tmp_path, extended):
    def profiler(p, root):
        return p.SimpleProfiler(dirpath=root, filename="perf", extended=extended)

    reports = {}
    for name in ("lightning", "gpulayer"):
        with warnings.catch_warnings():
            _run(name, tmp_path / name, profiler, stages=("fit",))
        reports[name] = (tmp_path / name / "fit-perf.txt").read_text().splitlines()
    theirs, ours = reports["lightning"], reports["gpulayer"]
    assert ours[:2] == theirs[:2] == ["FIT Profiler Report", ""]
    assert _cells(ours[3]) == _cells(theirs[3])  # the header
    for report in (ours, theirs):  # rules above and below the header (and the total), and at the end
        rules = [index for index, line in enumerate(report) if set(line) == {"-"}]
        assert rules == ([2, 4, 6, len(report) - 1] if extended else [2, 4, len(report) - 1])
        rows = [line for line in report if line.startswith("|")]  # every row: the columns, tab-separated alike
        assert {(line.count("\t"), len(_cells(line))) for line in rows} == {(len(_cells(ours[3])),) * 2}
    if extended:
        assert _cells(ours[5])[:2] == _cells(theirs[5])[:2] == ["Total", "-"]
        assert _cells(ours[5])[-1] == _cells(theirs[5])[-1] == "100 %"


@pytest.mark.parametrize("kind", ["SimpleProfiler", "AdvancedProfiler"])
def test_each_stage_writes_the_same_files(tmp_path, kind):
    written = {}
    for name in ("lightning", "gpulayer"):
        with warnings.catch_warnings():
            _run(name, tmp_path / name, lambda p, root: getattr(p, kind)(dirpath=root / "out", filename="perf"))
        written[name] = sorted(path.name for path in (tmp_path / name / "out").iterdir())
    assert written["gpulayer"] == written["lightning"] == [f"{stage}-perf.txt" for stage in sorted(STAGES)]


def test_a_filename_without_dirpath_writes_to_the_log_dir(tmp_path):
    for name in ("lightning", "gpulayer"):
        with warnings.catch_warnings():
            _run(name, tmp_path / name, lambda p, root: p.SimpleProfiler(filename="perf"), stages=("fit",))
        assert (tmp_path / name / "fit-perf.txt").is_file(), name


def test_the_advanced_report_is_pstats_per_action(tmp_path):
    def profiler(p, root):
        return p.AdvancedProfiler(dirpath=root, filename="perf", line_count_restriction=3)

    reports = {}
    for name in ("lightning", "gpulayer"):
        with warnings.catch_warnings():
            _run(name, tmp_path / name, profiler, stages=("fit",))
        reports[name] = (tmp_path / name / "fit-perf.txt").read_text()
    for report in reports.values():
        assert report.startswith("FIT Profiler Report\nProfile stats for: ")
        assert "Profile stats for: run_training_epoch\n" in report and "Ordered by: cumulative time" in report
    actions = {name: set(re.findall(r"^Profile stats for: (.*)$", text, re.M)) for name, text in reports.items()}
    assert actions["gpulayer"] == {action for action in actions["lightning"] if not UNMAPPED.match(action)}


def _pytorch_profiler(p, root):
    return p.PyTorchProfiler(dirpath=root / "out", filename="perf")


def test_the_pytorch_profiler_writes_its_table_and_a_chrome_trace_on_the_cpu(tmp_path):
    for name in ("lightning", "gpulayer"):
        out = tmp_path / name / "out"
        with warnings.catch_warnings():
            profiler = _run(name, tmp_path / name, _pytorch_profiler, stages=("fit",))
        profiler.teardown(None)  # Lightning's would close its torch profiler as the interpreter exits otherwise
        report = (out / "fit-perf.txt").read_text()
        assert report.startswith("FIT Profiler Report\nProfile stats for: records\n"), name
        assert "Self CPU %" in report and "[pl][profile]run_training_batch" in report, name
        traces = [path.name for path in out.glob("*.pt.trace.json")]
        assert len(traces) == 1 and traces[0].startswith("fit-perf-[Strategy]SingleDeviceStrategy."), name


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_report_without_a_file_goes_to_the_profilers_log_at_info(tmp_path, capsys):
    for name, package in (("lightning", "lightning.pytorch"), ("gpulayer", "gpulayer.trainer")):
        with warnings.catch_warnings():
            _framework(name)
            logger, kept = logging.getLogger(f"{package}.profilers.profiler"), _Kept()
            level, logger.level = logger.level, logging.INFO  # quiet_lightning turned Lightning's INFO lines off
            logger.addHandler(kept)
            try:
                _run(name, tmp_path / name, lambda p, root: p.SimpleProfiler(), stages=("fit",))
            finally:
                logger.removeHandler(kept)
                logger.setLevel(level)
        reports = [record for record in kept.records if "Profiler Report" in record.getMessage()]
        assert [(record.levelno, record.getMessage().splitlines()[0]) for record in reports] == [
            (logging.INFO, "FIT Profiler Report")
        ], name
        assert "Profiler Report" not in capsys.readouterr().out, name


@pytest.mark.parametrize("given", ["simple", "advanced", "pytorch", "Simple"])
def test_the_same_names_make_the_same_profilers(tmp_path, given):
    with warnings.catch_warnings():
        Trainer, *_ = _framework("lightning")
        theirs = Trainer(profiler=given, logger=False, default_root_dir=tmp_path).profiler
    ours = gl.Trainer(profiler=given, logger=False, default_root_dir=tmp_path).profiler
    assert type(ours).__name__ == type(theirs).__name__
    assert (ours.dirpath, ours.filename) == (theirs.dirpath, theirs.filename) == (None, None)


def test_an_unknown_name_and_barebones_are_refused_as_lightning_refuses_them(tmp_path):
    with warnings.catch_warnings():
        Trainer, *_ = _framework("lightning")
        from lightning.pytorch.utilities.exceptions import MisconfigurationException

        for trainer, error in ((Trainer, MisconfigurationException), (gl.Trainer, gl.MisconfigurationException)):
            with pytest.raises(error) as raised:
                trainer(profiler="bogus", logger=False, default_root_dir=tmp_path)
            assert str(raised.value).startswith(
                "When passing string value for the `profiler` parameter of `Trainer`, it can only be one of ['simple', "
                "'advanced', 'pytorch'"
            )
            with pytest.raises(ValueError, match="barebones=True"):
                trainer(profiler="simple", barebones=True, default_root_dir=tmp_path)
