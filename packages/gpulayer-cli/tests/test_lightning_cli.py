"""GPUlayer's LightningCLI beside Lightning 2.6's, the same script and command lines: the same parsed and saved
config (class paths and the version header aside), the same trained weights, --print_config and bad input."""

import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml


def _plain(text):
    """A dumped config with the framework's names taken out: its version header, project module and classes."""
    text = re.sub(r"^# (lightning\.pytorch|gpulayer-trainer)==.*\n", "", text)
    text = text.replace("lightning_project.", "PROJECT.").replace("gpulayer_project.", "PROJECT.")
    return text.replace("gpulayer.callbacks.", "CALLBACKS.").replace("lightning.pytorch.callbacks.", "CALLBACKS.")


GPULAYERS_OWN = ("prefetch", "check_finite_loss")  # Trainer arguments Lightning does not have


def _config(text):
    """A dumped config as a mapping, framework names out, without GPUlayer's own Trainer arguments (its Trainer
    group lists the arguments in GPUlayer's declaration order, so the comparison is of mappings)."""
    config = yaml.safe_load(_plain(text))
    for group in (config, *(value for value in config.values() if isinstance(value, dict))):
        trainer = group.get("trainer")
        if isinstance(trainer, dict):
            for name in GPULAYERS_OWN:
                trainer.pop(name, None)
    return config


def _hparams(path):
    """A logger's hparams.yaml, without the instantiator's path (``gpulayer.cli`` or ``lightning.pytorch.cli``)."""
    hparams = yaml.safe_load(path.read_text())
    assert hparams.pop("_instantiator").endswith(".cli.instantiate_module")
    return hparams


def _weights(model):
    return {key: value.clone() for key, value in model.state_dict().items()}


def _same_weights(ours, theirs):
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


FIT = ["fit", "--config", "base.yaml", "--model.lr", "0.1", "--trainer.max_epochs", "2", "--trainer.logger", "true"]
BASE = "seed_everything: 7\ntrainer:\n  accelerator: cpu\n  log_every_n_steps: 2\ndata:\n  batch_size: 6\n"


@pytest.fixture
def base(tmp_path):
    for name in ("lightning", "gpulayer"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "base.yaml").write_text(BASE)
    return tmp_path


def test_fit_from_a_config_and_flags_trains_and_saves_the_same_config(project, base):
    ours = project("gpulayer", FIT)
    theirs = project("lightning", FIT)
    assert ours.subcommand == theirs.subcommand == "fit"
    assert ours.trainer.global_step == theirs.trainer.global_step == 8
    _same_weights(_weights(ours.model), _weights(theirs.model))
    ours_saved = (base / "gpulayer" / ours.trainer.log_dir / "config.yaml").read_text()
    theirs_saved = (base / "lightning" / theirs.trainer.log_dir / "config.yaml").read_text()
    assert _config(ours_saved) == _config(theirs_saved)
    saved = yaml.safe_load(ours_saved)
    assert saved["seed_everything"] == 7 and saved["model"] == {"width": 4, "lr": 0.1}
    assert saved["trainer"]["max_epochs"] == 2 and saved["data"]["batch_size"] == 6
    assert ours_saved.startswith("# gpulayer-trainer==")


def test_print_config_prints_the_same_config_and_exits(project, base, capsys):
    printed = []
    for framework in ("gpulayer", "lightning"):
        with pytest.raises(SystemExit) as exited:
            project(framework, [*FIT, "--print_config"])
        assert exited.value.code == 0
        printed.append(capsys.readouterr().out)
    assert _config(printed[0]) == _config(printed[1])
    assert "max_epochs: 2" in printed[0]
    assert not (base / "gpulayer" / "lightning_logs").exists()


@pytest.mark.parametrize(
    "args",
    [["fit", "--trainer.no_such_key", "1"], ["fit", "--model.lr", "fast"], ["fit", "--data", "Other"], ["train"]],
    ids=["unknown key", "bad type", "unknown class", "unknown subcommand"],
)
def test_bad_input_is_refused_as_lightning_refuses_it(project, base, capsys, args):
    errors = []
    for framework in ("gpulayer", "lightning"):
        with pytest.raises(SystemExit) as exited:
            project(framework, args)
        assert exited.value.code == 2
        printed = _plain(capsys.readouterr().err)
        errors.append(printed[printed.index("error:") :])  # the usage above it lists Trainer arguments in each order
    assert errors[0] == errors[1]


@pytest.mark.parametrize(
    ("args", "setter"),
    [
        (["fit", "--trainer.max_epochs=-5"], "the flag --trainer.max_epochs"),
        (["fit", "--config", "bad.yaml"], "the config file bad.yaml"),
        (["--config", "outer.yaml", "fit"], "the config file outer.yaml"),
        (["fit"], "trainer_defaults"),
        ({"fit": {"trainer": {"max_epochs": -5}}}, "the args given to LightningCLI"),
    ],
)
def test_a_value_the_trainer_refuses_fails_naming_its_key_and_where_it_was_set(project, base, capsys, args, setter):
    (base / "gpulayer" / "bad.yaml").write_text("trainer:\n  max_epochs: -5\n")
    (base / "gpulayer" / "outer.yaml").write_text("fit:\n  trainer:\n    max_epochs: -5\n")
    with pytest.raises(SystemExit) as exited:
        project("gpulayer", args, trainer_defaults={"max_epochs": -5} if setter == "trainer_defaults" else {})
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert "max_epochs=-5: " in error
    assert error.endswith(f"(the key trainer.max_epochs, set by {setter})")
    assert sorted(path.name for path in (base / "gpulayer").iterdir()) == ["bad.yaml", "base.yaml", "outer.yaml"]


def test_a_second_run_refuses_to_overwrite_the_saved_config_as_lightning_does(project, base):
    args = ["fit", "--trainer.max_epochs", "1", "--trainer.logger", "false", "--trainer.default_root_dir", "run"]
    errors = []
    for framework in ("gpulayer", "lightning"):
        project(framework, args)
        with pytest.raises(RuntimeError) as refused:
            project(framework, args)
        errors.append(str(refused.value).replace(f"{base / framework}/", ""))  # GPUlayer's log_dir is absolute
    assert errors[0] == errors[1]
    assert "config.yaml to NOT exist" in errors[0]
    with pytest.warns(UserWarning, match="exists and is not empty"):  # the checkpoint folder, as Lightning warns
        overwriting = project("gpulayer", args, save_config_kwargs={"overwrite": True})
    assert overwriting.trainer.current_epoch == 1


def test_run_false_builds_the_classes_from_a_dict_with_subclasses_and_an_automatic_optimizer(project, base):
    config = {
        "model": {"class_path": "PROJECT.DeepRegressor", "init_args": {"hidden": 3}},
        "trainer": {"max_epochs": 1, "logger": False, "enable_checkpointing": False},
        "optimizer": {"class_path": "torch.optim.Adam", "init_args": {"lr": 0.01}},
        "lr_scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 1}},
        "seed_everything": 3,
    }
    built = {}
    for framework in ("gpulayer", "lightning"):
        given = yaml.safe_load(yaml.safe_dump(config).replace("PROJECT.", f"{framework}_project."))
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            cli = project(framework, given, model="Regressor", run=False, subclass_mode_model=True)
        overridden = "`DeepRegressor.configure_optimizers` will be overridden by `LightningCLI.configure_optimizers`."
        assert framework == "lightning" or overridden in [str(warning.message) for warning in warned]
        assert type(cli.model).__name__ == "DeepRegressor" and cli.model.hparams.hidden == 3
        with warnings.catch_warnings():  # torch's notice in Lightning's loop, Lightning's calls jsonargparse deprecates
            warnings.simplefilter("ignore" if framework == "lightning" else "error")
            cli.trainer.fit(cli.model, cli.datamodule)
        optimizer = cli.trainer.optimizers[0]
        built[framework] = (_weights(cli.model), type(optimizer).__name__, optimizer.param_groups[0]["lr"])
    _same_weights(built["gpulayer"][0], built["lightning"][0])
    assert built["gpulayer"][1:] == built["lightning"][1:] == ("Adam", 0.001)


def test_trainer_defaults_callbacks_and_hooks_around_the_subcommand(project, base, monkeypatch):
    monkeypatch.chdir(base / "gpulayer")
    from gpulayer.callbacks import EarlyStopping
    from gpulayer.cli import LightningCLI

    calls = []

    class Recording(LightningCLI):
        def before_fit(self):
            calls.append(("before_fit", self.trainer.max_epochs))

        def after_fit(self):
            calls.append(("after_fit", self.trainer.current_epoch))

        def add_arguments_to_parser(self, parser):
            parser.link_arguments("data.batch_size", "model.width", compute_fn=lambda size: size)

    import gpulayer_project

    stopping = EarlyStopping("val_loss", patience=10)
    cli = Recording(
        gpulayer_project.Regressor,
        gpulayer_project.Numbers,
        args=["fit", "--trainer.max_epochs", "2", "--data.batch_size", "4", "--trainer.logger", "false"],
        trainer_defaults={"callbacks": [stopping], "enable_progress_bar": False},
        seed_everything_default=5,
    )
    assert calls == [("before_fit", 2), ("after_fit", 2)]
    assert stopping in cli.trainer.callbacks
    assert cli.config.fit.seed_everything == 5 and cli.config.fit.model.width == 4


def test_a_checkpoint_of_a_cli_built_module_loads_into_its_subclass_from_the_base_class(project, base):
    """load_from_checkpoint_support: the module saves its configuration and the instantiator, so the base class's
    load_from_checkpoint rebuilds the configured subclass; a checkpoint Lightning's CLI saved loads too, once its
    project is ported (the class path names the ported module)."""
    from lightning.pytorch import LightningModule

    from gpulayer.trainer import Module

    args = ["fit", "--model", "PROJECT.DeepRegressor", "--model.hidden", "3", "--trainer.max_epochs", "1"]
    saved = {}
    for framework in ("gpulayer", "lightning"):
        given = [arg.replace("PROJECT.", f"{framework}_project.") for arg in args]
        cli = project(framework, given, model="Regressor", subclass_mode_model=True)
        path = cli.trainer.checkpoint_callback.best_model_path
        saved[framework] = torch.load(path, weights_only=True)
        with warnings.catch_warnings():  # Lightning's calls that jsonargparse deprecates
            warnings.simplefilter("ignore" if framework == "lightning" else "error")
            loaded = (Module if framework == "gpulayer" else LightningModule).load_from_checkpoint(path)
        assert type(loaded).__name__ == "DeepRegressor" and loaded.hparams.hidden == 3
        _same_weights(_weights(loaded), _weights(cli.model))
    ours, theirs = (saved[name]["hyper_parameters"] for name in ("gpulayer", "lightning"))
    assert ours.pop("_instantiator") == "gpulayer.cli.instantiate_module"
    assert theirs.pop("_instantiator") == "lightning.pytorch.cli.instantiate_module"
    assert ours.pop("_class_path") == "gpulayer_project.DeepRegressor"
    assert theirs["_class_path"] == "lightning_project.DeepRegressor"
    assert (
        ours
        == {key: value for key, value in theirs.items() if key != "_class_path"}
        == {"width": 4, "lr": 0.05, "hidden": 3}
    )

    lightnings = base / "lightning.ckpt"
    theirs["_class_path"] = "gpulayer_project.DeepRegressor"  # the same project, ported
    torch.save(
        {
            **saved["lightning"],
            "hyper_parameters": {**theirs, "_instantiator": "lightning.pytorch.cli.instantiate_module"},
        },
        lightnings,
    )
    loaded = Module.load_from_checkpoint(lightnings)
    assert type(loaded).__module__ == "gpulayer_project" and loaded.hparams.hidden == 3
    _same_weights(_weights(loaded), saved["lightning"]["state_dict"])


def test_a_checkpoint_naming_an_untrusted_instantiator_or_class_is_refused(project, base, tmp_path):
    from gpulayer.trainer import Module

    cli = project("gpulayer", ["fit", "--trainer.max_epochs", "1"])
    checkpoint = torch.load(cli.trainer.checkpoint_callback.best_model_path, weights_only=True)
    for hparams, refused in (
        ({"_instantiator": "os.system"}, "The instantiator 'os.system' from the checkpoint is not one of the trusted"),
        ({"_class_path": "collections.OrderedDict"}, "The class 'collections.OrderedDict' requested by the checkpoint"),
    ):
        path = tmp_path / "edited.ckpt"
        torch.save({**checkpoint, "hyper_parameters": {**checkpoint["hyper_parameters"], **hparams}}, path)
        with pytest.raises(ValueError, match=re.escape(refused)):
            Module.load_from_checkpoint(path)


def test_configs_merge_in_order_and_callbacks_append_from_flags(project, base, capsys):
    for name in ("lightning", "gpulayer"):
        (base / name / "second.yaml").write_text("trainer:\n  max_epochs: 3\nmodel:\n  width: 4\n  lr: 0.2\n")
    args = [
        *("fit", "--config", "base.yaml", "--config", "second.yaml", "--model.lr", "0.3"),
        *("--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss"),
        *("--trainer.callbacks+=LearningRateMonitor", "--print_config"),
    ]
    printed = []
    for framework in ("gpulayer", "lightning"):
        with pytest.raises(SystemExit):
            project(framework, args)
        printed.append(_config(capsys.readouterr().out))
    assert printed[0] == printed[1]
    fit = printed[0]
    assert (fit["seed_everything"], fit["trainer"]["max_epochs"], fit["model"]["lr"]) == (7, 3, 0.3)
    callbacks = [
        (callback["class_path"], callback["init_args"].get("monitor")) for callback in fit["trainer"]["callbacks"]
    ]
    assert callbacks == [("CALLBACKS.EarlyStopping", "val_loss"), ("CALLBACKS.LearningRateMonitor", None)]


def test_help_shows_each_argument_with_its_docstring(project, base, capsys):
    shown = []
    for framework in ("gpulayer", "lightning"):
        with pytest.raises(SystemExit) as exited:
            project(framework, ["fit", "--help"])
        assert exited.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        shown.append(text)
        for line in (
            "--model.lr LR The SGD learning rate. (type: float, default: 0.05)",
            "--data.samples SAMPLES How many samples.",
        ):
            assert line in text
    model_part = [text[text.index("--model CONFIG") : text.index("--data CONFIG")] for text in shown]
    assert _plain(model_part[0]) == _plain(model_part[1])


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluation_subcommands_run_from_a_checkpoint_as_under_lightning(project, base, subcommand):
    ran = {}
    for framework in ("gpulayer", "lightning"):
        fitted = project(framework, ["fit", "--trainer.max_epochs", "1", "--trainer.logger", "false"])
        path = fitted.trainer.checkpoint_callback.best_model_path
        overwrite = {"overwrite": True}  # the evaluation's config goes where fit's did
        cli = project(
            framework, [subcommand, "--ckpt_path", path, "--trainer.logger", "false"], save_config_kwargs=overwrite
        )
        assert cli.subcommand == subcommand
        ran[framework] = (
            {name: float(value) for name, value in cli.trainer.callback_metrics.items()},
            _weights(cli.model),
        )
    assert ran["gpulayer"][0] == pytest.approx(ran["lightning"][0], rel=1e-6)
    _same_weights(ran["gpulayer"][1], ran["lightning"][1])
    if subcommand != "predict":
        assert f"{subcommand.replace('validate', 'val')}_loss" in ran["gpulayer"][0]


def test_parser_kwargs_give_a_subcommand_its_default_config_file(project, base):
    built = {}
    for framework in ("gpulayer", "lightning"):
        (base / framework / "defaults.yaml").write_text(
            "trainer:\n  max_epochs: 1\n  logger: false\nmodel:\n  lr: 0.5\n"
        )
        kwargs = {"fit": {"default_config_files": [str(base / framework / "defaults.yaml")]}}
        cli = project(framework, ["fit", "--trainer.enable_checkpointing", "false"], parser_kwargs=kwargs)
        built[framework] = (cli.trainer.current_epoch, cli.model.hparams.lr, _weights(cli.model))
    assert built["gpulayer"][:2] == built["lightning"][:2] == (1, 0.5)
    _same_weights(built["gpulayer"][2], built["lightning"][2])


def test_subclass_mode_module_and_datamodule_both_record_their_class_path_without_a_clash(project, base):
    """Both record ``_class_path`` in their hyperparameters: Lightning leaves it out of the clash check and out of what
    the loggers get (lightning/pytorch/loggers/utilities.py, 2.6)."""
    logged = {}
    for framework in ("gpulayer", "lightning"):
        args = ["fit", "--model", f"{framework}_project.DeepRegressor", "--model.hidden", "3"]
        args += ["--data", f"{framework}_project.SavedNumbers", "--trainer.max_epochs", "1", "--trainer.logger", "true"]
        cli = project(framework, args, subclass_mode_model=True, subclass_mode_data=True)
        assert cli.model.hparams["_class_path"] == f"{framework}_project.DeepRegressor"
        assert cli.datamodule.hparams["_class_path"] == f"{framework}_project.SavedNumbers"
        logged[framework] = _hparams(base / framework / cli.trainer.log_dir / "hparams.yaml")
    expected = {"width": 4, "lr": 0.05, "hidden": 3, "batch_size": 4, "samples": 24}
    assert logged["gpulayer"] == logged["lightning"] == expected


LIGHTNINGS_CLASSES = """trainer:
  max_epochs: 2
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {save_dir: tb, name: run}
  callbacks:
    - class_path: lightning_built.BatchCounter
      init_args: {start: 10}
"""


def _listing(folder):
    """The files under ``folder``, TensorBoard's event files by their prefix (their names hold the host and time)."""
    names = (str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    return sorted(re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents", name) for name in names)


def test_a_config_naming_lightnings_logger_and_a_callback_built_on_lightnings_callback(project, base, monkeypatch):
    """What GPUlayer's Trainer takes, a config may name: Lightning's TensorBoardLogger and a callback built on
    Lightning's ``Callback`` (lightning_built.py) are built and used as under Lightning 2.6's LightningCLI."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    built = {}
    for framework in ("gpulayer", "lightning"):
        (base / framework / "parts.yaml").write_text(LIGHTNINGS_CLASSES)
        cli = project(framework, ["fit", "--config", "base.yaml", "--config", "parts.yaml"])
        (logger,), (counter,) = cli.trainer.loggers, [c for c in cli.trainer.callbacks if hasattr(c, "batches")]
        assert type(logger).__module__ == "lightning.pytorch.loggers.tensorboard"
        assert type(counter).__module__ == "lightning_built"
        folder = base / framework / logger.log_dir
        saved = _config((folder / "config.yaml").read_text())
        built[framework] = (logger.log_dir, (counter.batches, counter.epochs), _listing(folder), saved)
        built[framework] += (_hparams(folder / "hparams.yaml"), _weights(cli.model))
    ours, theirs = built["gpulayer"], built["lightning"]
    assert ours[:5] == theirs[:5]
    assert ours[0] == "tb/run/version_0" and ours[1] == (18, 2) and "events.out.tfevents" in ours[2]
    _same_weights(ours[5], theirs[5])


def test_a_config_naming_a_callback_the_trainer_refuses_is_refused_at_parse_time(project, base, capsys):
    """Lightning's own LearningRateMonitor is no GPUlayer callback (gpulayer.callbacks has one): refused by the parser,
    naming the key, before anything is built."""
    (base / "gpulayer" / "own.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n"
    )
    with pytest.raises(SystemExit):
        project("gpulayer", ["fit", "--config", "base.yaml", "--config", "own.yaml"])
    errors = capsys.readouterr().err
    assert "trainer.callbacks" in errors and "LearningRateMonitor" in errors


# Each callback GPUlayer adopts, by the short name a command line gives it, with the flags it needs.
SHORT_NAMES = {
    "Timer": ["--trainer.callbacks.duration=00:00:10:00", "--trainer.callbacks.interval=epoch"],
    "LambdaCallback": [],
    "GradientAccumulationScheduler": ["--trainer.callbacks.scheduling={0: 2, 1: 1}"],
    "OnExceptionCheckpoint": ["--trainer.callbacks.dirpath=crashes"],
    "BackboneFinetuning": ["--trainer.callbacks.unfreeze_backbone_at_epoch=2"],
    "StochasticWeightAveraging": ["--trainer.callbacks.swa_lrs=0.01"],
    "WeightAveraging": [],
    "EMAWeightAveraging": ["--trainer.callbacks.decay=0.99"],
    "SpikeDetection": ["--trainer.callbacks.window=5"],
    "ModelPruning": ["--trainer.callbacks.pruning_fn=l1_unstructured", "--trainer.callbacks.amount=0.3"],
    "ThroughputMonitor": ["--trainer.callbacks.batch_size_fn=builtins.len"],
    "DeviceStatsMonitor": [],
}
# The Trainer's own Timer (its max_time) lives in gpulayer.trainer, which gpulayer.callbacks re-exports: a saved config
# names the class where it is defined, and loads from either path.
SAVED_AS = {"Timer": "gpulayer.trainer.loops.timer.Timer"}


# Dumped values jsonargparse cannot write as YAML, with its warning under both frameworks: `device=torch.device("cpu")`.
# Lightning's ModelPruning also writes its `pruning_fn` string that way (its type tries Callable first); GPUlayer's
# writes the string.
UNSERIALIZABLE = {"ModelPruning": "pruning_fn"}


@pytest.mark.filterwarnings(r"ignore:\s*Unable to serialize instance cpu:UserWarning")
@pytest.mark.parametrize("name", SHORT_NAMES)
def test_each_adopted_callback_resolves_by_its_short_name(project, base, capsys, name):
    args = ["fit", "--config", "base.yaml", f"--trainer.callbacks+={name}", *SHORT_NAMES[name], "--print_config"]
    printed = []
    for framework in ("gpulayer", "lightning"):
        with pytest.raises(SystemExit):
            project(framework, args)
        printed.append(_config(capsys.readouterr().out))
    (ours,), (theirs,) = printed[0]["trainer"]["callbacks"], printed[1]["trainer"]["callbacks"]
    if name in UNSERIALIZABLE:
        key = UNSERIALIZABLE[name]
        assert (ours["init_args"].pop(key), theirs["init_args"].pop(key)) == (
            "l1_unstructured",
            "Unable to serialize instance l1_unstructured",
        )
    assert ours["init_args"] == theirs["init_args"]
    assert (ours["class_path"], theirs["class_path"]) == (SAVED_AS.get(name, f"CALLBACKS.{name}"), f"CALLBACKS.{name}")


@pytest.mark.parametrize(
    "flags", [["--trainer.profiler=simple"], ["--trainer.profiler=SimpleProfiler", "--trainer.profiler.filename=perf"]]
)
def test_a_profiler_by_its_name_or_its_short_class_name(project, base, capsys, flags):
    printed = []
    for framework in ("gpulayer", "lightning"):
        with pytest.raises(SystemExit):
            project(framework, ["fit", "--config", "base.yaml", *flags, "--print_config"])
        printed.append(_config(capsys.readouterr().out)["trainer"]["profiler"])
    ours, theirs = printed
    if isinstance(theirs, str):
        assert ours == theirs == "simple"
    else:
        assert ours["init_args"] == theirs["init_args"]
        assert ours["class_path"].rsplit(".", 1)[1] == theirs["class_path"].rsplit(".", 1)[1] == "SimpleProfiler"
    cli = project("gpulayer", ["fit", "--config", "base.yaml", *flags, "--trainer.max_epochs=1"])
    assert type(cli.trainer.profiler).__name__ == "SimpleProfiler"
