"""CSVLogger: the same calls as on Lightning's CSVLogger give the same version, log dir and files, byte for byte.

Lightning writes ``hparams.yaml`` through OmegaConf where omegaconf is installed: the tests here run without it (both
frameworks see it missing), and the ``with_omegaconf`` tests at the end with it."""

import enum
import math
import os
import random
import sys
import threading
import warnings

import pytest

from gpulayer.trainer.logging.csv_logger import CSVLogger

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger


@pytest.fixture(autouse=True)
def without_omegaconf(request, monkeypatch):
    """omegaconf as if it were not installed, for Lightning (its import-time flag) and for GPUlayer (the import)."""
    if "with_omegaconf" not in request.node.name:
        monkeypatch.setattr("lightning.pytorch.core.saving._OMEGACONF_AVAILABLE", False)
        monkeypatch.setitem(sys.modules, "omegaconf", None)


def _run(logger_class, save_dir, calls, prepare=None, **options):
    """Makes ``calls`` on a fresh logger; returns its version, its log dir and every folder and file, under save_dir,
    and its root dir (as given, relative to save_dir)."""
    os.makedirs(save_dir)
    if prepare:
        prepare(save_dir)
    logger = logger_class(str(save_dir), **options)
    for method, *args in calls:
        getattr(logger, method)(*args)
    files = {}
    for folder, _, names in os.walk(save_dir):
        files[os.path.relpath(folder, save_dir)] = None
        for name in names:
            with open(os.path.join(folder, name), "rb") as file:
                files[os.path.relpath(os.path.join(folder, name), save_dir)] = file.read()
    return logger.version, os.path.relpath(logger.log_dir, save_dir), files, logger.root_dir.replace(str(save_dir), "")


def _lightning(tmp_path, calls, prepare=None, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(LightningCSVLogger, tmp_path / "lightning", calls, prepare, **options)


def _ours(tmp_path, calls, prepare=None, **options):
    return _run(CSVLogger, tmp_path / "gpulayer", calls, prepare, **options)


def _assert_same(tmp_path, calls, prepare=None, **options):
    ours = _ours(tmp_path, calls, prepare, **options)
    assert ours == _lightning(tmp_path, calls, prepare, **options)
    return ours


_METRIC_SEQUENCES = {
    "new columns midway": [
        ("log_metrics", {"loss": 1.0}, 0),
        ("save",),
        ("log_metrics", {"loss": 0.5, "acc": 0.25}, 1),
        ("save",),
        ("log_metrics", {"zeta": 3}, 2),
        ("log_metrics", {"Loss": 2.0, "epoch": 0}, 3),
        ("finalize", "success"),
    ],
    "rows without some keys": [
        ("log_metrics", {"a": 1.0, "b": 2.0}, 0),
        ("log_metrics", {"b": 3.0}, 0),
        ("log_metrics", {"c": 4.0, "epoch": 1}, 5),
        ("save",),
        ("log_metrics", {"a": 5.0}, 6),
        ("save",),
    ],
    "step None counts the rows buffered since the last save": [
        ("log_metrics", {"x": 1.0}),
        ("log_metrics", {"x": 2.0}),
        ("save",),
        ("log_metrics", {"x": 3.0}),
        ("log_metrics", {"x": 4.0}, 10),
        ("log_metrics", {"x": 5.0}),
        ("finalize", "success"),
    ],
    "every 100th step saves by itself": [
        *[("log_metrics", {"x": float(i)}) for i in range(150)],
        ("log_metrics", {"y": 1.0}, 199),
        ("log_metrics", {"x": 0.0}, 200),
    ],
    "numbers as Python's csv writes them": [
        (
            "log_metrics",
            {"int": 3, "float": 3.0, "third": 1 / 3, "sum": 0.1 + 0.2, "small": 1e-05, "big": 1e17, "huge": 10**20},
            0,
        ),
        ("log_metrics", {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "zero": -0.0, "flag": True}, 1),
        ("log_metrics", {"step": 99.0, "none": None}, 2),
        ("save",),
    ],
    "names needing quotes": [
        ("log_metrics", {"a,b": 1.0, 'say "hi"': 2.0, "val/acc": 0.5, "B": 1, "_": 2}, 0),
        ("save",),
        ("log_metrics", {"a,b": 1.5, "new,one": 7}, 1),
        ("save",),
    ],
    "saves with nothing to write": [
        ("save",),
        ("log_metrics", {"a": 1}, 0),
        ("save",),
        ("save",),
        ("finalize", "success"),
        ("finalize", "success"),
    ],
    "nothing logged": [("finalize", "success")],
}


@pytest.mark.parametrize("calls", _METRIC_SEQUENCES.values(), ids=_METRIC_SEQUENCES.keys())
def test_metrics_csv_is_lightnings(tmp_path, calls):
    files = _assert_same(tmp_path, calls)[2]
    assert ("lightning_logs/version_0/metrics.csv" in files) == any(call[0] == "log_metrics" for call in calls)


def test_random_call_sequences_give_lightnings_metrics_csv(tmp_path):
    rng = random.Random(0)
    names = ["loss", "acc", "epoch", "val_loss", "lr-Adam", "Z", "a,b"]
    values = [0, 1, -7, 0.5, 1 / 3, 2.5e-08, 1e20, math.nan, True]
    for case in range(40):
        calls = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.25:
                calls.append(("save",))
            else:
                metrics = {name: rng.choice(values) for name in rng.sample(names, rng.randint(0, 3))}
                calls.append(("log_metrics", metrics, rng.choice([None, rng.randint(0, 300)])))
        calls.append(("finalize", "success"))
        _assert_same(tmp_path / str(case), calls)


class _Color(enum.Enum):
    RED = 1


_HPARAMS = {
    "lr": 1e-3,
    "epochs": 10,
    "model": {"layers": [64, 32], "act": "relu", "dropout": None, "norm": {}, "extra": [], "deep": {"x": {"y": [1]}}},
    "flags": [True, False, None, [1, [2, []]], {"k": "v", "j": [{"a": 1, "b": (2, 3)}]}],
    "betas": (0.9, 0.999),
    "no_betas": (),
    "color": _Color.RED,
    "mixed keys": {1: "one", "two": 2, None: 3},
    "numbers": [0.1, 1e-05, 1e17, -1.5e300, math.inf, -math.inf, math.nan, -0.0, 10**30, -3],
    "quoted": ["yes", "No", "on", "null", "~", "", "1.5", "1e5", "0x1F", "017", "1_000", "2024-01-02", "<<", "="],
    "indicators": ["- a", "-a", ": a", "a: b", "a:b", "a #b", "a#b", "#x", "*x", "&x", "!x", "@x", "`x", "--- x", "?"],
    "spaces": [" lead", "trail ", "two  spaces", "it's", "'quoted'", '"double"', "back\\slash"],
    "unicode and control": ["café", "\t", "a\tb", "\x00", "\u2028", "emoji \U0001f600", "\xa0", "\ufeff"],
    "multiline": ["a\nb", "a\n\nb", "\nlead", "trail\n", "a \nb", "a\n b"],
    # a line folds at a lone space once past column 80 (here items start at column 2)
    "long": ["word " * 40, "x" * 120, ("it's " * 30).strip(), "é " * 60, "a" * 78 + " b", "a" * 79 + " b"],
    "/path/to/data: v2": "s3://bucket/path?query=1&x=#2",
    "Key With Caps": "Value",
    "k" * 122: "the longest simple key",
    "l" * 123: "a key too long to be simple",
    "multi\nline key": 1,
}


@pytest.mark.parametrize(
    "calls",
    [
        [("log_hyperparams", _HPARAMS)],
        [("log_hyperparams", {"lr": 0.1, "b": [1]}), ("log_hyperparams", {"lr": 0.2, "a": "new"})],
        [("log_hyperparams", {})],
        [("log_hyperparams", {"lr": 0.1}), ("log_metrics", {"loss": 1.0}, 0), ("finalize", "success")],
    ],
    ids=["plain values of every kind", "calls accumulate", "empty", "with metrics"],
)
def test_hparams_yaml_is_lightnings(tmp_path, calls):
    assert "lightning_logs/version_0/hparams.yaml" in _assert_same(tmp_path, calls)[2]


def _random_value(rng, depth=0):
    pieces = [" ", "  ", "'", '"', "\n", "\\", "word", "é", "\t", ":", "#", "-", "ab", "yes", "1", ".", "x" * 30]
    kind = rng.random()
    if depth > 3 or kind < 0.45:
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        return rng.choice([text, text, None, rng.random() < 0.5, rng.randint(-99, 10**9), rng.uniform(-1e6, 1e6)])
    if kind < 0.7:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind < 0.8:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    return {str(_random_value(rng, 3))[:60]: _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_random_hparams_give_lightnings_yaml(tmp_path):
    rng = random.Random(0)
    for case in range(60):
        _assert_same(tmp_path / str(case), [("log_hyperparams", {f"p{i}": _random_value(rng) for i in range(5)})])


def test_a_value_yaml_cannot_hold_is_skipped_with_lightnings_warning(tmp_path):
    calls = [("log_hyperparams", {"lr": 0.1, "lock": threading.Lock()})]
    with pytest.warns(UserWarning, match=r"^Skipping 'lock' parameter because it is not possible to safely dump"):
        ours = _ours(tmp_path, calls)
    assert ours == _lightning(tmp_path, calls)
    assert ours[2]["lightning_logs/version_0/hparams.yaml"] == b"lr: 0.1\n"


def _version_dirs(*names):
    def prepare(save_dir):
        for name in names:
            os.makedirs(save_dir / name)
        (save_dir / "lightning_logs").mkdir(exist_ok=True)
        (save_dir / "lightning_logs" / "version_99").write_text("a file is not a version")

    return prepare


@pytest.mark.parametrize(
    ("options", "existing", "version", "log_dir"),
    [
        ({}, [], 0, "lightning_logs/version_0"),
        ({}, ["lightning_logs/version_0", "lightning_logs/version_3"], 4, "lightning_logs/version_4"),
        ({}, ["lightning_logs/version_2", "lightning_logs/version_x", "lightning_logs/version_"], 3, None),
        ({}, ["lightning_logs/version_8_old", "lightning_logs/version_05"], 9, None),  # "8_old" counts as 8
        ({"name": "exp"}, ["lightning_logs/version_4", "exp/version_1"], 2, "exp/version_2"),
        ({"name": None}, ["version_0", "version_3"], 4, "version_4"),
        ({"name": ""}, ["version_1"], 2, "version_2"),
        ({"version": "run-a"}, ["lightning_logs/version_3"], "run-a", "lightning_logs/run-a"),
        ({"name": None, "version": 7}, [], 7, "version_7"),
    ],
)
def test_version_numbering_and_log_dir_are_lightnings(tmp_path, options, existing, version, log_dir):
    calls = [("log_metrics", {"loss": 1.0}, 0), ("save",)]
    ours = _assert_same(tmp_path, calls, _version_dirs(*existing), **options)
    assert ours[0] == version
    assert log_dir is None or ours[1] == log_dir


def test_nothing_is_created_before_the_first_write(tmp_path):
    logger = CSVLogger(str(tmp_path / "logs"))
    assert (logger.version, logger.log_dir) == (0, str(tmp_path / "logs" / "lightning_logs" / "version_0"))
    logger.finalize("success")
    assert not (tmp_path / "logs").exists()
    logger.save()  # as Lightning: save() makes the (empty) log dir even with nothing to write
    assert os.listdir(logger.log_dir) == []


def _used_version_0(save_dir):
    os.makedirs(save_dir / "lightning_logs" / "version_0")
    (save_dir / "lightning_logs" / "version_0" / "metrics.csv").write_text("old,step\n1,0\n")
    (save_dir / "lightning_logs" / "version_0" / "hparams.yaml").write_text("old: 1\n")
    (save_dir / "lightning_logs" / "version_0" / "notes.txt").write_text("kept")


@pytest.mark.parametrize(
    "calls",
    [
        [("log_metrics", {"new": 2.0}, 0), ("save",)],
        [("log_hyperparams", {"lr": 0.1})],  # metrics.csv goes although no metric is logged; hparams.yaml is rewritten
        [("save",)],
    ],
)
def test_a_used_version_dir_warns_and_loses_its_metrics_csv_at_the_first_write(tmp_path, calls):
    with pytest.warns(UserWarning) as ours_warned:
        ours = _ours(tmp_path, calls, _used_version_0, version=0)
    with warnings.catch_warnings(record=True) as lightning_warned:
        warnings.simplefilter("always")
        assert _run(LightningCSVLogger, tmp_path / "lightning", calls, _used_version_0, version=0) == ours
    messages = [
        str(w.message).replace(str(tmp_path / "lightning"), "ROOT")
        for w in lightning_warned
        if str(w.message).startswith("Experiment logs directory")
    ]
    assert [str(w.message).replace(str(tmp_path / "gpulayer"), "ROOT") for w in ours_warned] == messages
    assert messages[0].startswith("Experiment logs directory ROOT/lightning_logs/version_0 exists and is not empty.")
    assert b"old" not in ours[2].get("lightning_logs/version_0/metrics.csv", b"")
    assert ours[2]["lightning_logs/version_0/notes.txt"] == b"kept"


def test_an_empty_version_dir_is_used_without_a_warning(tmp_path):
    _assert_same(
        tmp_path, [("log_metrics", {"a": 1}, 0), ("save",)], _version_dirs("lightning_logs/version_0"), version=0
    )


def test_new_columns_replace_the_file_and_known_ones_append_to_it(tmp_path):
    logger = CSVLogger(str(tmp_path))
    path = os.path.join(logger.log_dir, "metrics.csv")
    logger.log_metrics({"a": 1.0}, 0)
    logger.save()
    first = os.stat(path).st_ino
    logger.log_metrics({"a": 2.0}, 1)
    logger.save()
    assert os.stat(path).st_ino == first  # appended in place
    logger.log_metrics({"b": 3.0}, 2)
    logger.save()
    assert os.stat(path).st_ino != first  # a new file moved over the old one
    assert sorted(os.listdir(logger.log_dir)) == ["metrics.csv"]
    with open(path, newline="") as file:
        assert file.read() == "a,b,step\r\n1.0,,0\r\n2.0,,1\r\n,3.0,2\r\n"


class _Unwritable:
    def __str__(self):
        raise RuntimeError("cannot be written")


def test_a_failed_rewrite_leaves_the_previous_file_whole(tmp_path):
    logger = CSVLogger(str(tmp_path))
    logger.log_metrics({"a": 1.0}, 0)
    logger.save()
    path = os.path.join(logger.log_dir, "metrics.csv")
    logger.log_metrics({"b": _Unwritable()}, 1)
    with pytest.raises(RuntimeError, match="cannot be written"):
        logger.save()
    with open(path, newline="") as file:
        assert file.read() == "a,step\r\n1.0,0\r\n"
    assert sorted(os.listdir(logger.log_dir)) == ["metrics.csv"]


def test_a_relative_save_dir_that_does_not_exist_yet_is_made_as_lightning_makes_it(tmp_path, monkeypatch):
    calls = [("log_hyperparams", {"lr": 0.1}), ("log_metrics", {"loss": 1.0}, 0), ("save",)]
    results = {}
    for name, logger_class in (("gpulayer", CSVLogger), ("lightning", LightningCSVLogger)):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logger = logger_class("runs")  # a relative folder, not made yet
            for method, *args in calls:
                getattr(logger, method)(*args)
        results[name] = sorted(str(path.relative_to(tmp_path / name)) for path in (tmp_path / name).rglob("*"))
    assert results["gpulayer"] == results["lightning"]
    assert "runs/lightning_logs/version_0/metrics.csv" in results["gpulayer"]


_OMEGACONF_CASES = {
    "plain values": {"lr": 0.1, "name": "it's", "layers": [64, 32], "nested": {"b": 1, "a": None}, "on": True},
    "a config with an interpolation": "config",
    "a tuple (omegaconf refuses it: yaml.dump)": {"shape": (3, 4), "lr": 0.5},
    "an enum": {"kind": enum.Enum("Kind", "SMALL LARGE").LARGE},
}


@pytest.mark.parametrize("case", _OMEGACONF_CASES)
def test_hparams_yaml_with_omegaconf_is_lightnings(tmp_path, case):
    omegaconf = pytest.importorskip("omegaconf")
    hparams = _OMEGACONF_CASES[case]
    if hparams == "config":
        hparams = {"model": omegaconf.OmegaConf.create({"width": 8, "lr": "${optim.lr}", "optim": {"lr": 0.01}})}
    written = _assert_same(tmp_path, [("log_hyperparams", hparams)])[2]["lightning_logs/version_0/hparams.yaml"]
    if case == "plain values":  # OmegaConf's order and style, not yaml.dump's sorted keys
        assert written.startswith(b"lr: 0.1\nname: it's\nlayers:\n- 64\n")


@pytest.mark.parametrize(
    ("hparams", "raised"),
    [({None: 1, "lr": 0.1}, "KeyValidationError"), ({"lr": 0.1, "lock": threading.Lock()}, "TypeError")],
    ids=["a None key", "a value deepcopy cannot copy"],
)
def test_hparams_lightning_fails_to_write_with_omegaconf_are_written_as_without_it(
    tmp_path, monkeypatch, hparams, raised
):
    """Lightning 2.6 raises (``save_hparams_to_yaml`` falls back only on OmegaConf's value errors); its documented
    intent, and what it writes without omegaconf, is the file with what YAML can hold, and GPUlayer writes that."""
    pytest.importorskip("omegaconf")
    calls = [("log_hyperparams", hparams)]
    with pytest.raises(Exception) as lightning_error:
        _lightning(tmp_path / "with", calls)
    assert type(lightning_error.value).__name__ == raised
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = _ours(tmp_path / "with", calls)
    monkeypatch.setattr("lightning.pytorch.core.saving._OMEGACONF_AVAILABLE", False)
    assert ours[2] == _lightning(tmp_path / "without", calls)[2]


def _through_experiment(logger_class, save_dir):
    """What user code does with ``self.logger.experiment`` on Lightning's CSVLogger: its writer's calls and fields."""
    import torch

    logger = logger_class(str(save_dir))
    writer = logger.experiment
    writer.log_hparams({"lr": 0.1})
    writer.log_metrics({"loss": torch.tensor(0.5), "acc": 0.25})  # step: the rows buffered
    writer.log_metrics({"loss": 0.4}, step=7)
    buffered = [dict(row) for row in writer.metrics]
    writer.save()
    writer.log_hparams({"layers": 2})
    logger.log_metrics({"loss": 0.3}, 8)  # the logger's rows go to the same writer
    logger.save()
    with open(writer.metrics_file_path, "rb") as file:
        csv_bytes = file.read()
    with open(os.path.join(writer.log_dir, "hparams.yaml"), "rb") as file:
        yaml_bytes = file.read()
    shown = (
        os.path.relpath(writer.log_dir, save_dir),
        os.path.relpath(writer.metrics_file_path, save_dir),
        writer.metrics_keys,
        dict(writer.hparams),
        buffered,
        writer.metrics,
        logger.experiment is writer,
    )
    return shown, csv_bytes, yaml_bytes


def test_the_experiment_is_lightnings_experiment_writer(tmp_path):
    """``CSVLogger.experiment`` (Lightning's ``ExperimentWriter``): the same calls give the same fields and files."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _through_experiment(LightningCSVLogger, tmp_path / "lightning")
    assert _through_experiment(CSVLogger, tmp_path / "gpulayer") == theirs


def test_a_tensorboard_call_on_the_csv_experiment_says_why_and_what_to_do(tmp_path):
    """Lightning's default logger is a TensorBoardLogger where tensorboard is installed; GPUlayer's is the CSVLogger,
    so ``self.logger.experiment.add_image`` needs Lightning's TensorBoardLogger passed in."""
    experiment = CSVLogger(str(tmp_path)).experiment
    with pytest.raises(AttributeError, match=r"no 'add_image'.*pass Lightning's TensorBoardLogger\(\.\.\.\) as"):
        experiment.add_image("digits", None)
    assert not hasattr(experiment, "add_scalar")


def test_the_experiment_off_rank_zero_takes_every_call_and_writes_nothing(tmp_path, monkeypatch):
    from gpulayer.trainer.logging.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = CSVLogger(str(tmp_path / "logs"))
    logger.experiment.add_image("digits", None)
    logger.experiment[0].log_metrics({"a": 1.0})
    logger.experiment.log_hparams({"lr": 0.1})
    assert not (tmp_path / "logs").exists()
