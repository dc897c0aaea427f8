"""GPUlayer's LightningCLI beside Lightning 2.6's, the same script and command lines: the same parsed and saved
config (class paths and the version header aside), the same trained weights, --print_config and bad input."""

import re
import warnings

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
    ],
)
def test_a_value_the_trainer_refuses_fails_naming_its_key_and_where_it_was_set(project, base, capsys, args, setter):
    (base / "gpulayer" / "bad.yaml").write_text("trainer:\n  max_epochs: -5\n")
    (base / "gpulayer" / "outer.yaml").write_text("fit:\n  trainer:\n    max_epochs: -5\n")
    with pytest.raises(SystemExit) as exited:
        project("gpulayer", args)
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
        cli = project(framework, given, model="Regressor", run=False, subclass_mode_model=True)
        assert type(cli.model).__name__ == "DeepRegressor" and cli.model.hparams.hidden == 3
        with warnings.catch_warnings():  # torch's deprecation notice inside Lightning's loop
            warnings.simplefilter("ignore", FutureWarning)
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
