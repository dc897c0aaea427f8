"""The Trainer on a CUDA GPU (nox -s cuda; skipped without one): each precision against the CPU run, fp16 AMP's
skipped steps and scaler state against Lightning, prefetching, autotuning, and no host sync on the lean path."""

import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Callback, Module, Trainer, seed_everything

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class Classifier(Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader():
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 16, generator=generator), torch.randint(0, 4, (256,), generator=generator))
    return DataLoader(data, batch_size=32, shuffle=True)


def _fit(tmp_path, module=Classifier, **kwargs):
    seed_everything(0)
    model = module()
    trainer = Trainer(
        accelerator="cuda", devices=1, max_epochs=2, enable_checkpointing=False, default_root_dir=tmp_path, **kwargs
    )
    trainer.fit(model, _loader())
    return trainer, model


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed", "bf16-true"])
def test_each_precision_trains_on_the_gpu_and_returns_the_model_to_the_cpu(tmp_path, precision):
    trainer, model = _fit(tmp_path, precision=precision)
    assert trainer.precision == precision and trainer.global_step == 16
    assert next(model.parameters()).device.type == "cpu"  # Lightning's teardown moves it back
    assert torch.isfinite(trainer.callback_metrics["loss"]).item()


def test_16_mixed_uses_a_grad_scaler(tmp_path):
    trainer, _ = _fit(tmp_path, precision="16-mixed")
    assert (
        trainer.strategy.precision_plugin.scaler is not None
        and trainer.strategy.precision_plugin.scaler.get_scale() > 0
    )


def test_prefetch_on_a_side_stream_gives_the_same_weights(tmp_path):
    weights = []
    for prefetch in (False, True):
        _, model = _fit(tmp_path, prefetch=prefetch)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


def test_prefetch_takes_batches_already_on_the_gpu(tmp_path):
    data = TensorDataset(torch.randn(64, 16, device="cuda"), torch.randint(0, 4, (64,), device="cuda"))
    options = {"max_epochs": 1, "logger": False, "enable_checkpointing": False, "default_root_dir": tmp_path}
    trainer = Trainer(accelerator="cuda", devices=1, prefetch=True, **options)
    trainer.fit(Classifier(), DataLoader(data, batch_size=32))  # pinning is for CPU tensors: these are copied as is
    assert trainer.global_step == 2


def test_benchmark_none_autotunes_only_long_runs(tmp_path):
    _fit(tmp_path)
    assert torch.backends.cudnn.benchmark is False  # 16 planned steps
    seed_everything(0)
    Trainer(
        accelerator="cuda",
        devices=1,  # "auto" would start a process per GPU on a machine with several
        max_steps=1000,
        limit_train_batches=1,
        enable_checkpointing=False,
        log_every_n_steps=0,
        default_root_dir=tmp_path,
    ).fit(Classifier(), _loader())
    assert torch.backends.cudnn.benchmark is True


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_list_of_devices_picks_the_gpu_as_lightning_does(tmp_path):
    seen = []

    class Where(Classifier):
        def training_step(self, batch, batch_idx):
            seen.append((batch[0].device, next(self.parameters()).device))
            return super().training_step(batch, batch_idx)

    options = {"max_steps": 2, "enable_checkpointing": False, "logger": False, "default_root_dir": tmp_path}
    try:
        Trainer(accelerator="cuda", devices=[1], **options).fit(Where(), _loader())
    finally:
        torch.cuda.set_device(0)
    assert seen == [(torch.device("cuda", 1), torch.device("cuda", 1))] * 2


def test_autotuning_requests_the_train_loader_where_lightning_does(tmp_path):
    events = []

    class Recording(Classifier):
        def on_fit_start(self):
            events.append("on_fit_start")

        def train_dataloader(self):
            events.append("train_dataloader")
            return _loader()

    seed_everything(0)
    trainer = Trainer(
        accelerator="cuda", devices=1, max_epochs=1, enable_checkpointing=False, default_root_dir=tmp_path
    )
    trainer.fit(Recording())  # benchmark=None: the planned steps are counted, which needs the loader
    assert events == ["on_fit_start", "train_dataloader"]


# How far each precision's weights may lie from the CPU run's at 32-true after 16 SGD steps on this small model.
CLOSE_TO_CPU = {"32-true": 1e-4, "16-mixed": 2e-2, "bf16-mixed": 5e-2, "bf16-true": 1e-1}


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().float().cpu().flatten() for p in model.parameters()])


@pytest.mark.parametrize("precision", list(CLOSE_TO_CPU))
def test_each_precision_ends_close_to_the_cpu_run(tmp_path, precision):
    seed_everything(0)
    cpu = Classifier()
    Trainer(accelerator="cpu", max_epochs=2, enable_checkpointing=False, logger=False).fit(cpu, _loader())
    _, gpu = _fit(tmp_path, precision=precision, logger=False)
    difference = (_weights(gpu) - _weights(cpu)).abs().max().item()
    print(f"{precision}: largest weight difference to the CPU run {difference:.2e}")
    assert difference <= CLOSE_TO_CPU[precision]


def _overflowing(base: type) -> type:
    """The classifier under ``base`` (ours or Lightning's), whose 4th batch makes every gradient inf."""

    class Overflowing(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
            self.seen = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            return loss * float("inf") if batch_idx == 3 else loss

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.seen.append(torch.cat([p.detach().float().flatten() for p in self.parameters()]).cpu())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Overflowing


def _fit_overflowing(framework: str, root, ckpt_path=None, **options):
    import lightning.pytorch as lightning  # here: collecting this module on a machine without a GPU stays cheap

    base, trainer_class = (
        (Module, Trainer) if framework == "gpulayer" else (lightning.LightningModule, lightning.Trainer)
    )
    model = _overflowing(base)()
    quiet = {"enable_progress_bar": False, "enable_model_summary": False} if framework == "lightning" else {}
    options = {"max_epochs": 1, "logger": False, "enable_checkpointing": False, **quiet, **options}
    accelerator = "gpu" if framework == "lightning" else "cuda"
    with warnings.catch_warnings():
        if framework == "lightning":
            warnings.simplefilter("ignore")
        trainer = trainer_class(
            accelerator=accelerator, devices=1, precision="16-mixed", default_root_dir=root, **options
        )
    loader = DataLoader(_loader().dataset, batch_size=32)  # unshuffled: the same batches in both
    with warnings.catch_warnings():
        if framework == "lightning":  # its tips (loader workers) and torch's LeafSpec deprecation, raised inside it
            warnings.simplefilter("ignore")
        trainer.fit(model, loader, ckpt_path=ckpt_path)
    return trainer, model


def test_16_mixed_skips_a_step_with_inf_gradients_exactly_as_lightning(tmp_path):
    ours, model = _fit_overflowing("gpulayer", tmp_path / "gpulayer")
    theirs, reference = _fit_overflowing("lightning", tmp_path / "lightning")
    assert ours.global_step == theirs.global_step == 8  # the skipped step still counts
    torch.testing.assert_close(model.seen[3], model.seen[2], rtol=0, atol=0)  # batch 3's update was skipped
    assert not torch.equal(model.seen[4], model.seen[3])
    for mine, lightnings in zip(model.seen, reference.seen, strict=True):
        torch.testing.assert_close(mine, lightnings, rtol=0, atol=1e-6)
    scale = ours.strategy.precision_plugin.scaler.get_scale()
    assert scale == theirs.precision_plugin.scaler.get_scale() == 2.0**15  # halved once from 2**16


def test_the_grad_scaler_state_is_checkpointed_and_restored(tmp_path):
    trainer, _ = _fit_overflowing("gpulayer", tmp_path)
    path = tmp_path / "halved.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=True)["MixedPrecision"]["scale"] == 2.0**15

    class ScaleAtStart(Callback):
        def on_train_start(self, trainer, pl_module):
            self.scale = trainer.strategy.precision_plugin.scaler.get_scale()

    probe = ScaleAtStart()
    _fit_overflowing("gpulayer", tmp_path, ckpt_path=str(path), max_epochs=2, callbacks=[probe])
    assert probe.scale == 2.0**15


def _set_sync_debug_mode(mode: str) -> None:
    """``torch.cuda.set_sync_debug_mode``, without its prototype warning (an error under this suite's settings, raised
    after the mode is set)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Synchronization debug mode is a prototype", UserWarning)
        torch.cuda.set_sync_debug_mode(mode)


class NoSyncBetweenLogSteps(Callback):
    """From ``on_train_batch_start`` to ``on_train_batch_end`` of every batch that logs nothing, any host-device
    synchronisation raises (the log steps, every 4th, read the loss for the log line: they may sync)."""

    def __init__(self) -> None:
        self.guarded = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if (batch_idx + 1) % 4:
            _set_sync_debug_mode("error")
            self.guarded += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        _set_sync_debug_mode("default")


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])  # 16-mixed: GradScaler reads found_inf each step
def test_no_step_that_logs_nothing_waits_for_the_device(tmp_path, precision):
    # Asked before the guard: on a GPU older than Ampere the first bf16 check (autocast makes one) copies a tensor to
    # the GPU, a sync; its answer is cached.
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("bf16-mixed: this GPU has no bf16 support (it needs compute capability 8.0, Ampere, or later)")
    guard = NoSyncBetweenLogSteps()

    class LogsANumberToo(Classifier):
        def training_step(self, batch, batch_idx):
            self.log("batch_idx", float(batch_idx))  # a Python number becomes a tensor on the GPU without a copy
            return super().training_step(batch, batch_idx)

    try:
        trainer, _ = _fit(tmp_path, LogsANumberToo, precision=precision, log_every_n_steps=4, callbacks=[guard])
    finally:
        _set_sync_debug_mode("default")
    assert trainer.global_step == 16 and guard.guarded == 12


class _Normalized(Classifier):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(16)
        self.classes: set[str] = set()

    def training_step(self, batch, batch_idx):
        self.classes.add(type(self.norm).__name__)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(self.norm(x)), y)


def test_sync_batchnorm_converts_during_fit_and_gives_the_users_layers_back(tmp_path):
    # On one rank SyncBatchNorm computes what BatchNorm does: the weights match a run without it.
    _, model = _fit(tmp_path / "synced", module=_Normalized, strategy="ddp", sync_batchnorm=True, logger=False)
    _, plain = _fit(tmp_path / "plain", module=_Normalized, strategy="ddp", logger=False)
    assert model.classes == {"SyncBatchNorm"} and plain.classes == {"BatchNorm1d"}
    assert type(model.norm) is torch.nn.BatchNorm1d  # the user's own layer, holding the trained statistics
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)


STARTED_ON_CUDA = """
import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl


class Regression(gl.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(strategy):
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    model = Regression()
    trainer = gl.Trainer(strategy=strategy, accelerator="cuda", devices=1, max_epochs=1, logger=False,
                         enable_checkpointing=False)
    trainer.fit(model, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
    return trainer, model


if __name__ == "__main__":
    trainer, model = fit("ddp_fork")  # the caller's Trainer takes no GPU, so its forked ranks can
    print("forked:", trainer.global_step, model.layer.weight.device, torch.cuda.is_initialized())
    trainer, model = fit("ddp_spawn")
    print("spawned:", trainer.global_step, model.layer.weight.device)
    torch.zeros(1, device="cuda")  # this process now holds a CUDA context
    try:
        fit("ddp_fork")
    except RuntimeError as error:
        print("fork refused:", error)
"""


def test_started_ranks_train_on_the_gpu_and_fork_after_cuda_is_refused_with_lightnings_words(tmp_path):
    from gpulayer.runtime.testing import clean_environment, run_command

    script = tmp_path / "started_on_cuda.py"
    script.write_text(STARTED_ON_CUDA)
    finished = run_command([sys.executable, str(script)], timeout=180, env=clean_environment())
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert "forked: 8 cpu False" in lines
    assert "spawned: 8 cpu" in lines
    assert (
        "fork refused: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
        "the 'spawn' start method or avoid CUDA initialization in the main process."
    ) in lines
