"""The workloads: the same model, data, loss and optimizer for every variant.

- ``mlp``: an MLP 32 -> 32 -> 1 on batches of 16; a step costs almost nothing, so the trainer's own cost shows.
- ``transformer``: a 2-layer causal transformer language model on synthetic tokens (vocabulary 128, 32 tokens).
- ``cnn``: a small convolutional network on 32 x 32 RGB images in batches of 16; the step's compute dominates.
- ``gan``: a generator and a discriminator (MLPs, width 64) on 2-D points in batches of 16, each with its own
  SGD, stepped by ``adversarial_step`` (under the trainers: manual optimization). One process only: under DDP a
  raw loop and a trainer would wrap the two networks differently.
- ``log_heavy``: the MLP with a busy ``training_step``: 8 ``self.log`` calls a step (two on the progress bar, one
  also per epoch, one a torchmetrics ``BinaryAccuracy``). Every variant computes the logged values and updates the
  metric; the trainers log them. One process only: what it measures is the cost of ``self.log``.
- ``default_install``: the MLP as a default install trains it (``default_install.py``): 4 epochs of 250 batches,
  a ``StepLR`` stepped per epoch, the default checkpoint and CSV logger, ``LearningRateMonitor(logging_interval=
  "epoch")``; the raw loops do the same work by hand. ``default_install_batch_hook``: the same with a user callback
  that defines ``on_train_batch_end`` (the raw loops call the same function). One process on the CPU, where the
  trainer's own cost shows (the GPU check's time stays as it was); no ``lightning_defaults``, and GPUlayer also with
  its checkpoints written in the background (``gpulayer_async_save``).

The MLP and the transformer also run the EMA variants (``variants.py``).

Batches are made in advance (each rank takes every world_size-th), so data loading costs next to nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SEED = 0
CHECKPOINTING_VARIANTS = ("gpulayer_async_save",)
EMA_VARIANTS = ("raw_ema", "gpulayer_ema", "lightning_ema")  # variants.py: an EMA of the weights at every step


@dataclass(frozen=True)
class Workload:
    name: str
    steps: int  # per fit, in a full run; a quick run takes a quarter
    make_net: Callable[[], nn.Module]
    make_batches: Callable[[int], list[tuple[torch.Tensor, torch.Tensor]]]
    loss: Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
    lr: float
    adversarial: bool = False  # two optimizers stepped by adversarial_step
    one_process: bool = False  # not run under DDP
    cpu_only: bool = False  # not run on a GPU
    # The step's loss and the self.log calls a trainer makes in it, as (name, value, options); the metric is
    # ``make_metric()``'s, or None. By default the step logs its loss once, as a real module does.
    logged_step: Callable[[nn.Module, tuple, Any], tuple[torch.Tensor, list[tuple[str, Any, dict]]]] | None = None
    make_metric: Callable[[], Any] | None = None
    epochs: int = 1  # a fit of ``steps`` steps goes over one epoch's batches (``batches``) this many times
    default_install: bool = False  # checkpoints, CSV logger, StepLR and LR monitor on (default_install.py)
    batch_hook: bool = False  # with a user callback that defines on_train_batch_end
    variants: tuple[str, ...] | None = None  # the variants that run it; None: every one that needs no checkpoints
    averages: bool = False  # the EMA variants run it

    def runs(self, variant: str) -> bool:
        """Whether ``variant`` trains this workload: ``gpulayer_async_save`` differs from ``gpulayer`` only where the
        trainers checkpoint (the default-install workloads), the EMA variants run on the MLP and the transformer."""
        if variant in EMA_VARIANTS:
            return self.averages
        return variant in self.variants if self.variants is not None else variant not in CHECKPOINTING_VARIANTS

    def batches(self, steps: int, rank: int = 0, world_size: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch's batches of a fit of ``steps`` steps, rank ``rank``'s."""
        return self.make_batches(steps // self.epochs * world_size)[rank::world_size]

    def step(
        self, net: nn.Module, batch: tuple, metric: Any = None
    ) -> tuple[torch.Tensor, list[tuple[str, Any, dict]]]:
        """The training loss of ``batch``, and the ``self.log`` calls that go with it."""
        if self.logged_step is not None:
            return self.logged_step(net, batch, metric)
        loss = self.loss(net, batch)
        return loss, [("loss", loss, {})]

    def seeded_net(self) -> nn.Module:
        torch.manual_seed(SEED)  # the same initial weights in every variant
        return self.make_net()

    def final_loss(self, net: nn.Module, batches: list, device: str = "cpu") -> float:
        """The trained model's mean loss over the batches, in fp32 on ``device``: equal losses mean the variants did
        the same updates."""
        net = net.to(device)  # the trainers hand the model back on the CPU, as Lightning does
        with torch.no_grad():
            return torch.stack([self.loss(net, tuple(t.to(device) for t in batch)) for batch in batches]).mean().item()


def _mlp_batches(count: int) -> list:
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randn(count * 16, 32, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(count * 16, 1, generator=generator)
    return list(zip(x.split(16), y.split(16), strict=True))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))


def _regression_loss(net: nn.Module, batch: tuple) -> torch.Tensor:
    return F.mse_loss(net(batch[0]), batch[1])


def _busy_step(net: nn.Module, batch: tuple, accuracy: Any) -> tuple[torch.Tensor, list[tuple[str, Any, dict]]]:
    """The MLP's loss, and 8 values logged as a busy training_step logs them."""
    inputs, targets = batch
    outputs = net(inputs)
    loss = F.mse_loss(outputs, targets)
    with torch.no_grad():
        accuracy(outputs > 0, targets > 0)  # the metric's forward: it updates the state and keeps the batch's value
        error = (outputs - targets).abs()
        values = [("mae", error.mean()), ("max_error", error.amax()), ("output_mean", outputs.mean())]
        values += [("output_std", outputs.std()), ("target_mean", targets.mean())]
    calls = [("loss", loss, {"prog_bar": True}), ("accuracy", accuracy, {"prog_bar": True})]
    calls += [("loss_per_epoch", loss, {"on_epoch": True}), *((name, value, {}) for name, value in values)]
    return loss, calls


def _binary_accuracy() -> Any:
    from torchmetrics.classification import BinaryAccuracy  # installed with Lightning

    return BinaryAccuracy()


VOCAB, CONTEXT, WIDTH = 128, 32, 64


class _LanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CONTEXT), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position
        return self.head(self.blocks(hidden, mask=self.mask, is_causal=True))


def _token_batches(count: int) -> list:
    """Sequences that follow a fixed random successor table with some noise: learnable, made in memory."""
    generator = torch.Generator().manual_seed(SEED)
    table = torch.randint(VOCAB, (VOCAB,), generator=generator)
    tokens = torch.empty(count * 8, CONTEXT + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (count * 8,), generator=generator)
    for position in range(1, CONTEXT + 1):
        noise = torch.randint(VOCAB, (count * 8,), generator=generator)
        keep = torch.rand(count * 8, generator=generator) < 0.8
        tokens[:, position] = torch.where(keep, table[tokens[:, position - 1]], noise)
    return [(chunk[:, :-1], chunk[:, 1:]) for chunk in tokens.split(8)]


def _language_loss(net: nn.Module, batch: tuple) -> torch.Tensor:
    logits = net(batch[0])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[1].reshape(-1))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip


def _image_batches(count: int) -> list:
    generator = torch.Generator().manual_seed(SEED)
    images = torch.randn(count * 16, 3, 32, 32, generator=generator)
    labels = (images[:, 0].mean(dim=(1, 2)) > 0).long() + 2 * (images[:, 1].mean(dim=(1, 2)) > 0).long()
    return list(zip(images.split(16), labels.split(16), strict=True))


def _classification_loss(net: nn.Module, batch: tuple) -> torch.Tensor:
    return F.cross_entropy(net(batch[0]), batch[1])


def _gan() -> nn.Module:
    def mlp(inputs: int, outputs: int) -> nn.Module:
        return nn.Sequential(
            nn.Linear(inputs, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, outputs)
        )

    return nn.ModuleDict({"generator": mlp(8, 2), "discriminator": mlp(2, 1)})


def _gan_batches(count: int) -> list:
    """Real points on a ring of 8 modes, and the generator's noise for the step: made in advance, so every variant
    draws the same fakes."""
    generator = torch.Generator().manual_seed(SEED)
    angles = torch.randint(8, (count * 16,), generator=generator) * (torch.pi / 4)
    real = 2 * torch.stack([angles.cos(), angles.sin()], dim=1) + 0.05 * torch.randn(count * 16, 2, generator=generator)
    noise = torch.randn(count * 16, 8, generator=generator)
    return list(zip(real.split(16), noise.split(16), strict=True))


def _discriminator_loss(net: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    scores = net["discriminator"](torch.cat([real, fake]))
    targets = torch.cat([torch.ones(len(real), 1, device=real.device), torch.zeros(len(fake), 1, device=real.device)])
    return F.binary_cross_entropy_with_logits(scores, targets)


def _gan_loss(net: nn.Module, batch: tuple) -> torch.Tensor:
    real, noise = batch
    return _discriminator_loss(net, real, net["generator"](noise))


def adversarial_step(net: nn.Module, optimizers: list, batch: tuple, backward: Callable, mixed: Any) -> torch.Tensor:
    """One GAN step: the generator's update against the discriminator, then the discriminator's on real points and
    the (detached) fakes; ``backward`` is ``Tensor.backward`` or ``manual_backward``. Returns the discriminator's
    loss."""
    real, noise = batch
    generator_optimizer, discriminator_optimizer = optimizers
    with mixed:
        fake = net["generator"](noise)
        generator_loss = F.binary_cross_entropy_with_logits(
            net["discriminator"](fake), torch.ones(len(fake), 1, device=fake.device)
        )
    generator_optimizer.zero_grad()
    backward(generator_loss)
    generator_optimizer.step()
    with mixed:
        discriminator_loss = _discriminator_loss(net, real, fake.detach())
    discriminator_optimizer.zero_grad()
    backward(discriminator_loss)
    discriminator_optimizer.step()
    return discriminator_loss


def optimizers_of(net: nn.Module, lr: float) -> list[torch.optim.Optimizer]:
    """The adversarial workload's two SGDs, the generator's first."""
    return [torch.optim.SGD(net[part].parameters(), lr=lr) for part in ("generator", "discriminator")]


WORKLOADS = {
    "mlp": Workload("mlp", 2000, _mlp, _mlp_batches, _regression_loss, 0.01, averages=True),
    "transformer": Workload("transformer", 200, _LanguageModel, _token_batches, _language_loss, 0.05, averages=True),
    "cnn": Workload("cnn", 60, _cnn, _image_batches, _classification_loss, 0.05),
    "gan": Workload("gan", 1000, _gan, _gan_batches, _gan_loss, 0.02, adversarial=True, one_process=True),
    "log_heavy": Workload(
        "log_heavy",
        1000,
        _mlp,
        _mlp_batches,
        _regression_loss,
        0.01,
        one_process=True,
        logged_step=_busy_step,
        make_metric=_binary_accuracy,
    ),
    **{
        name: Workload(
            name,
            1000,
            _mlp,
            _mlp_batches,
            _regression_loss,
            0.01,
            one_process=True,
            cpu_only=True,
            epochs=4,
            default_install=True,
            batch_hook=batch_hook,
            variants=("raw", "raw_lightning_order", "gpulayer", "gpulayer_async_save", "lightning"),
        )
        for name, batch_hook in (("default_install", False), ("default_install_batch_hook", True))
    },
}
