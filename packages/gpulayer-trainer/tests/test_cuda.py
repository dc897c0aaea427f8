"""The Trainer on a CUDA GPU (nox -s cuda; skipped without one): AMP, prefetching, and the lean path."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer, seed_everything

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


def _fit(tmp_path, **kwargs):
    seed_everything(0)
    model = Classifier()
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
    assert trainer._precision.scaler is not None and trainer._precision.scaler.get_scale() > 0


def test_prefetch_on_a_side_stream_gives_the_same_weights(tmp_path):
    weights = []
    for prefetch in (False, True):
        _, model = _fit(tmp_path, prefetch=prefetch)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


def test_benchmark_none_autotunes_only_long_runs(tmp_path):
    _fit(tmp_path)
    assert torch.backends.cudnn.benchmark is False  # 16 planned steps
    seed_everything(0)
    Trainer(
        accelerator="cuda",
        max_steps=1000,
        limit_train_batches=1,
        enable_checkpointing=False,
        log_every_n_steps=0,
        default_root_dir=tmp_path,
    ).fit(Classifier(), _loader())
    assert torch.backends.cudnn.benchmark is True
