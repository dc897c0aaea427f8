"""Trainer(...) rejects bad arguments at construction, naming the argument, the value and what is accepted."""

import inspect
import math
import pydoc
from datetime import timedelta

import pytest
import torch

from gpulayer.trainer import Callback, DDPStrategy, Module, Trainer
from gpulayer.trainer.arguments import DECLARATIONS

BAD = [
    ({"accelerator": "tpu"}, ValueError, "accelerator='tpu'"),
    ({"strategy": "deepspeed"}, ValueError, "strategy='deepspeed'"),
    ({"devices": 0}, ValueError, "devices=0"),
    ({"devices": [0, 1]}, TypeError, "devices=[0, 1]"),
    ({"devices": 2, "strategy": "single_device"}, ValueError, "strategy='single_device'"),
    ({"strategy": "ddp_spawn", "num_nodes": 2}, ValueError, "strategy='ddp_spawn'"),  # started on one machine
    ({"strategy": "fsdp"}, ValueError, "strategy='fsdp'"),  # one process, or gpulayer-fsdp not installed
    ({"strategy": 3}, ValueError, "strategy=3"),
    ({"num_nodes": 0}, ValueError, "num_nodes=0"),
    ({"precision": "fp16"}, ValueError, "precision='fp16'"),
    ({"precision": "32-true "}, ValueError, "precision='32-true '"),
    ({"fast_dev_run": -1}, ValueError, "fast_dev_run=-1"),
    ({"max_epochs": -2}, ValueError, "max_epochs=-2"),
    ({"max_epochs": 1.5}, TypeError, "max_epochs=1.5"),
    ({"min_epochs": -1}, ValueError, "min_epochs=-1"),
    ({"max_steps": -2}, ValueError, "max_steps=-2"),
    ({"min_steps": -1}, ValueError, "min_steps=-1"),
    ({"max_time": "00:1:00:00"}, ValueError, "max_time='00:1:00:00'"),
    ({"max_time": {"weeks_": 1}}, ValueError, "max_time="),
    ({"max_time": 5}, ValueError, "max_time=5"),
    ({"limit_train_batches": 1.5}, ValueError, "limit_train_batches=1.5"),
    ({"limit_val_batches": -1}, ValueError, "limit_val_batches=-1"),
    ({"limit_test_batches": "all"}, ValueError, "limit_test_batches='all'"),
    ({"limit_predict_batches": True}, TypeError, "limit_predict_batches=True"),
    ({"val_check_interval": 1.5}, ValueError, "val_check_interval=1.5"),
    ({"val_check_interval": 0}, ValueError, "val_check_interval=0"),
    ({"val_check_interval": 0.5, "check_val_every_n_epoch": None}, ValueError, "check_val_every_n_epoch=None"),
    ({"check_val_every_n_epoch": 0}, ValueError, "check_val_every_n_epoch=0"),
    ({"check_val_every_n_epoch": 1.0}, TypeError, "check_val_every_n_epoch=1.0"),
    ({"num_sanity_val_steps": -2}, ValueError, "num_sanity_val_steps=-2"),
    ({"log_every_n_steps": -1}, ValueError, "log_every_n_steps=-1"),
    ({"accumulate_grad_batches": 0}, ValueError, "accumulate_grad_batches=0"),
    ({"gradient_clip_val": "1"}, TypeError, "gradient_clip_val='1'"),
    ({"gradient_clip_val": -1.0}, ValueError, "gradient_clip_val=-1.0"),
    ({"gradient_clip_algorithm": "l2"}, ValueError, "gradient_clip_algorithm='l2'"),
    ({"deterministic": 1}, ValueError, "deterministic=1"),
    ({"benchmark": "yes"}, ValueError, "benchmark='yes'"),
    ({"enable_checkpointing": 1}, TypeError, "enable_checkpointing=1"),
    ({"inference_mode": None}, TypeError, "inference_mode=None"),
    ({"use_distributed_sampler": "no"}, TypeError, "use_distributed_sampler='no'"),
    ({"prefetch": 1}, TypeError, "prefetch=1"),
    ({"default_root_dir": 3}, TypeError, "default_root_dir=3"),
    ({"callbacks": ["not a callback"]}, TypeError, "callbacks[0] is 'not a callback'"),
    ({"callbacks": "a string"}, TypeError, "callbacks='a string'"),
    ({"logger": ["not a logger"]}, TypeError, "logger=['not a logger']"),
    ({"enable_progress_bar": 0}, TypeError, "enable_progress_bar=0"),
    ({"enable_model_summary": "no"}, TypeError, "enable_model_summary='no'"),
    ({"barebones": None}, TypeError, "barebones=None"),
    ({"detect_anomaly": 1}, TypeError, "detect_anomaly=1"),
    ({"overfit_batches": -1}, ValueError, "overfit_batches=-1"),
    ({"overfit_batches": 1.5}, ValueError, "overfit_batches=1.5"),
    ({"reload_dataloaders_every_n_epochs": -1}, ValueError, "reload_dataloaders_every_n_epochs=-1"),
    ({"sync_batchnorm": "yes"}, TypeError, "sync_batchnorm='yes'"),
    ({"enable_autolog_hparams": None}, TypeError, "enable_autolog_hparams=None"),
    ({"profiler": "xla"}, ValueError, "it can only be one of ['simple', 'advanced', 'pytorch']"),
    ({"profiler": 1}, TypeError, "profiler=1: accepted values are None"),
    ({"plugins": []}, ValueError, "plugins=[]: GPUlayer takes no plugins"),
    ({"model_registry": "my-model"}, ValueError, "model_registry='my-model': GPUlayer uploads nothing"),
]


@pytest.mark.parametrize(("kwargs", "error", "named"), BAD, ids=[str(k) for k, _, _ in BAD])
def test_a_bad_argument_is_refused_at_construction_before_any_file_is_made(tmp_path, kwargs, error, named):
    root = tmp_path / "run"
    with pytest.raises(error) as raised:
        Trainer(
            accelerator=kwargs.pop("accelerator", "cpu"),
            default_root_dir=kwargs.pop("default_root_dir", root),
            **kwargs,
        )
    assert named in str(raised.value)
    assert not root.exists()


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"timeout": -1}, ValueError, "DDPStrategy(timeout=-1)"),
        ({"timeout": "5"}, ValueError, "DDPStrategy(timeout='5')"),
        ({"static_graph": "yes"}, TypeError, "DDPStrategy(static_graph='yes')"),
        ({"device_ids": [0]}, ValueError, "DDPStrategy(device_ids=...)"),
    ],
)
def test_ddp_strategy_refuses_bad_options(kwargs, error, named):
    with pytest.raises(error) as raised:
        DDPStrategy(**kwargs)
    assert named in str(raised.value)


def test_devices_above_one_inside_pytest_is_refused_instead_of_starting_pytest_again(tmp_path):
    with pytest.raises(RuntimeError, match="devices=2 inside a pytest test"):
        Trainer(accelerator="cpu", devices=2, default_root_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_strategy_auto_is_one_device_in_one_process_and_ddp_keeps_its_options():
    assert Trainer(accelerator="cpu", logger=False).strategy_name == "single_device"
    trainer = Trainer(accelerator="cpu", logger=False, strategy=DDPStrategy(static_graph=True, timeout=5))
    assert (trainer.strategy_name, trainer.world_size, trainer.num_devices) == ("ddp", 1, 1)
    assert trainer.runtime.timeout.total_seconds() == 5


def test_the_error_lists_the_accepted_values():
    with pytest.raises(ValueError, match="'norm', 'value'"):
        Trainer(accelerator="cpu", gradient_clip_algorithm="l1")


def test_limits_follow_lightnings_int_and_fraction_rule():
    trainer = Trainer(
        accelerator="cpu",
        limit_train_batches=2.0,
        limit_val_batches=1,
        limit_test_batches=1.0,
        limit_predict_batches=0.25,
    )
    args = trainer.args
    assert (args.limit_train_batches, args.limit_val_batches) == (2, 1)
    assert isinstance(args.limit_train_batches, int)
    assert (args.limit_test_batches, args.limit_predict_batches) == (1.0, 0.25)


def test_fast_dev_run_overrides_the_loop_arguments():
    args = Trainer(accelerator="cpu", fast_dev_run=3, max_epochs=9, num_sanity_val_steps=5, limit_val_batches=0.1).args
    assert (args.limit_train_batches, args.limit_val_batches, args.max_steps, args.max_epochs) == (3, 3, 3, 1)
    assert args.num_sanity_val_steps == 0
    assert Trainer(accelerator="cpu", fast_dev_run=True).args.fast_dev_run == 1


def test_durations_take_lightnings_three_forms():
    assert Trainer(accelerator="cpu", max_time="1:02:03:04").args.max_time == timedelta(
        days=1, hours=2, minutes=3, seconds=4
    )
    assert Trainer(accelerator="cpu", max_time={"minutes": 0.5}).args.max_time == timedelta(seconds=30)
    assert Trainer(accelerator="cpu", val_check_interval="0:0:1:5").args.val_check_interval == timedelta(seconds=65)


def test_defaults_resolve_as_lightnings():
    args = Trainer(accelerator="cpu").args
    assert args.num_sanity_val_steps == 2 and args.log_every_n_steps == 50 and args.val_check_interval == 1.0
    assert args.precision == "32-true" and args.enable_checkpointing is True
    assert Trainer(accelerator="cpu", num_sanity_val_steps=-1).args.num_sanity_val_steps == math.inf


@pytest.mark.parametrize(
    ("given", "resolved"), [(32, "32-true"), ("32", "32-true"), (64, "64-true"), ("bf16-mixed", "bf16-mixed")]
)
def test_precision_aliases_resolve_silently(given, resolved):
    assert Trainer(accelerator="cpu", precision=given).precision == resolved


@pytest.mark.parametrize(
    ("given", "resolved"), [(16, "bf16-mixed"), ("16-mixed", "bf16-mixed"), ("bf16", "bf16-mixed")]
)
def test_fp16_amp_on_cpu_becomes_bf16_with_a_warning(given, resolved):
    with pytest.warns(UserWarning):
        assert Trainer(accelerator="cpu", precision=given).precision == resolved


def test_deterministic_switches_torch_to_deterministic_algorithms():
    Trainer(accelerator="cpu", deterministic="warn")
    import torch

    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    Trainer(accelerator="cpu", deterministic=False)
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_single_callback_or_a_list_is_accepted():
    callback = Callback()
    assert Trainer(accelerator="cpu", callbacks=callback, enable_checkpointing=False).callbacks == [callback]
    assert Trainer(accelerator="cpu", callbacks=[callback], enable_checkpointing=False).callbacks == [callback]


def test_every_lightning_trainer_argument_is_known_by_name():
    """A Lightning script's Trainer(...) never meets Python's "unexpected keyword argument": each of Lightning's
    arguments is adopted, or refused by name with what to do instead (the BAD cases above)."""
    lightning = pytest.importorskip("lightning.pytorch")
    theirs = set(inspect.signature(lightning.Trainer.__init__).parameters) - {"self"}
    ours = set(inspect.signature(Trainer.__init__).parameters) - {"self"}
    assert theirs - ours == set()


def test_the_signature_repeats_the_declarations_names_defaults_and_order():
    """Each argument is declared once (``TrainerArguments``); the signature, kept for IDEs and tools that read it
    (jsonargparse), must not drift from it. Defaults compare with their types, so 0 is not False."""
    parameters = list(inspect.signature(Trainer.__init__).parameters.values())[1:]
    assert {parameter.kind for parameter in parameters} == {inspect.Parameter.KEYWORD_ONLY}
    signature = [(p.name, type(p.default), p.default) for p in parameters]
    assert signature == [(name, type(d.default), d.default) for name, d in DECLARATIONS.items()]


def test_argument_properties_return_the_checked_value_and_show_the_declared_doc(tmp_path):
    trainer = Trainer(accelerator="cpu", logger=False, max_steps=7, limit_val_batches=2.0, default_root_dir=tmp_path)
    shown = [name for name, declared in DECLARATIONS.items() if declared.trainer_property]
    assert {"max_steps", "limit_val_batches", "log_every_n_steps", "precision", "num_nodes"} <= set(shown)
    for name in shown:
        view = inspect.getattr_static(Trainer, name)
        assert (view.fset, view.__doc__) == (None, DECLARATIONS[name].doc)
        assert getattr(trainer, name) == getattr(trainer.args, name)
    assert (trainer.max_steps, trainer.limit_val_batches, trainer.log_every_n_steps) == (7, 2, 50)
    with pytest.raises(AttributeError):
        trainer.max_steps = 3
    undocumented = [
        name for name, value in inspect.getmembers(Trainer) if isinstance(value, property) and not value.__doc__
    ]
    assert undocumented == []
    shown_by_help = pydoc.plain(pydoc.render_doc(Trainer))
    assert DECLARATIONS["max_steps"].doc in shown_by_help and "This process's rank among all processes" in shown_by_help


def test_enable_progress_bar_false_prints_no_log_line(tmp_path, capsys):
    data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))

    class Regressor(Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    for shown in (True, False):
        trainer = Trainer(
            accelerator="cpu",
            max_epochs=1,
            log_every_n_steps=1,
            enable_progress_bar=shown,
            enable_checkpointing=False,
            default_root_dir=tmp_path / str(shown),
        )
        trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=2))
        printed = capsys.readouterr().out
        assert ("step 4/4" in printed) is shown
        assert (tmp_path / str(shown) / "lightning_logs" / "version_0" / "metrics.csv").is_file()  # logging goes on


@pytest.mark.parametrize(
    ("made", "named"),
    [
        (lambda cb: cb.ProgressBar(), "callbacks[1] is Lightning's ProgressBar .*: GPUlayer prints one log line"),
        (
            lambda cb: cb.EarlyStopping(monitor="x"),
            "callbacks[1] is Lightning's EarlyStopping .*: use gpulayer.callbacks.EarlyStopping",
        ),
        (lambda cb: cb.Timer(), "callbacks[1] is Lightning's Timer .*: use gpulayer.callbacks.Timer"),
        (
            lambda cb: cb.GradientAccumulationScheduler({1: 2}),
            "callbacks[1] is Lightning's GradientAccumulationScheduler .*: use "
            "gpulayer.callbacks.GradientAccumulationScheduler",
        ),
        (
            lambda cb: cb.LearningRateFinder(),
            "callbacks[1] is Lightning's LearningRateFinder .*: GPUlayer has no counterpart",
        ),
    ],
    ids=["progress bar", "a callback GPUlayer has", "timer", "accumulation scheduler", "one GPUlayer lacks"],
)
def test_a_lightning_callback_is_named_alone_with_what_to_do_instead(tmp_path, made, named):
    callbacks = pytest.importorskip("lightning.pytorch.callbacks")
    with pytest.raises(TypeError, match=named.replace("[", "\\[").replace("]", "\\]")) as raised:
        Trainer(accelerator="cpu", callbacks=[Callback(), made(callbacks)], default_root_dir=tmp_path)
    assert "Callback object at" not in str(raised.value)  # only the entry at fault is shown
    assert not any(tmp_path.iterdir())
