"""A GAN under manual optimization: a generator learns 8 points on a ring from a discriminator, two optimizers.

    python docs/examples/gan.py                        # one process; writes runs/gan/samples.png
    python docs/examples/gan.py --devices 2            # DDP on two processes: the Trainer starts them

`training_step` steps both optimizers itself (`automatic_optimization = False`): the generator's with the
discriminator's parameters toggled off, then the discriminator's on real points and the generator's detached
fakes. `global_step` counts both steps. At the end rank 0 scores 2,000 generated points (the share within 0.25 of
a mode, and how many of the 8 modes get at least 2% of them) and draws them beside the real ones. The data is
generated with torch; a run takes well under a minute on a CPU.
"""

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.trainer import Module, Trainer, seed_everything

NOISE, MODES, RADIUS, SPREAD = 8, 8, 2.0, 0.05
NEAR = 0.25  # a generated point this close to a mode counts as on it


def ring(count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` points from 8 Gaussians (standard deviation 0.05) evenly spaced on a circle of radius 2."""
    angles = torch.randint(MODES, (count,), generator=generator) * (2 * math.pi / MODES)
    centers = RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1)
    return centers + SPREAD * torch.randn(count, 2, generator=generator)


def score(points: torch.Tensor) -> tuple[float, int]:
    """The share of ``points`` within ``NEAR`` of a mode, and the number of modes holding at least 2% of them."""
    angles = torch.arange(MODES) * (2 * math.pi / MODES)
    centers = RADIUS * torch.stack([angles.cos(), angles.sin()], dim=1)
    distance, nearest = torch.cdist(points, centers).min(dim=1)
    near = distance < NEAR
    counts = torch.bincount(nearest[near], minlength=MODES)
    return near.float().mean().item(), int((counts >= 0.02 * len(points)).sum())


def mlp(inputs: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, 128), nn.LeakyReLU(0.2), nn.Linear(128, 128), nn.LeakyReLU(0.2), nn.Linear(128, outputs)
    )


class GAN(Module):
    def __init__(self, lr: float = 2e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = mlp(NOISE, 2)
        self.discriminator = mlp(2, 1)

    def forward(self, noise: torch.Tensor) -> torch.Tensor:
        return self.generator(noise)

    def training_step(self, batch, batch_idx):
        (real,) = batch
        generator_optimizer, discriminator_optimizer = self.optimizers()
        fake = self(torch.randn(len(real), NOISE, device=self.device))

        # The generator: make the discriminator call its points real. The discriminator's parameters are toggled
        # off, so this backward leaves them no gradients.
        with self.toggled_optimizer(generator_optimizer):
            generator_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), torch.ones_like(real[:, :1]))
            generator_optimizer.zero_grad()
            self.manual_backward(generator_loss)
            generator_optimizer.step()

        # The discriminator: real points are real, the generator's (detached) are fake.
        with self.toggled_optimizer(discriminator_optimizer):
            real_score, fake_score = self.discriminator(real), self.discriminator(fake.detach())
            discriminator_loss = (
                F.binary_cross_entropy_with_logits(real_score, torch.ones_like(real_score))
                + F.binary_cross_entropy_with_logits(fake_score, torch.zeros_like(fake_score))
            ) / 2
            discriminator_optimizer.zero_grad()
            self.manual_backward(discriminator_loss)
            discriminator_optimizer.step()

        self.log_dict({"g_loss": generator_loss, "d_loss": discriminator_loss}, prog_bar=True)

    def configure_optimizers(self):
        betas = (0.5, 0.999)  # the usual choice for GANs: less momentum than Adam's default
        return [
            torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=betas),
            torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=betas),
        ]


def draw(real: torch.Tensor, generated: torch.Tensor, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 5))
    axes.scatter(real[:, 0], real[:, 1], s=2, alpha=0.3, label="real")
    axes.scatter(generated[:, 0], generated[:, 1], s=2, alpha=0.5, label="generated")
    axes.set_aspect("equal")
    axes.legend(loc="upper right")
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--max-epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root-dir", default="runs/gan")
    args = parser.parse_args()

    seed_everything(args.seed)
    points = ring(4096, torch.Generator().manual_seed(1234))
    model = GAN()
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        # Toggling leaves a parameter without a gradient in each backward: DDP must look for unused ones.
        strategy="ddp_find_unused_parameters_true" if args.devices > 1 else "auto",
        max_epochs=args.max_epochs,
        default_root_dir=args.root_dir,
        log_every_n_steps=32,
    )
    trainer.fit(model, DataLoader(TensorDataset(points), batch_size=128, shuffle=True))
    if trainer.is_global_zero:
        model.eval()
        with torch.no_grad():
            generated = model(torch.randn(2000, NOISE, generator=torch.Generator().manual_seed(7))).cpu()
        share, modes = score(generated)
        picture = Path(args.root_dir) / "samples.png"
        draw(points, generated, picture)
        print(
            f"global_step {trainer.global_step} on {trainer.world_size} rank(s): {share:.2f} of generated points "
            f"within {NEAR} of a mode, {modes} of {MODES} modes covered; drew {picture}"
        )


if __name__ == "__main__":
    main()
