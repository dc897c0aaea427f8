"""``Trainer(prefetch=True)`` against ``prefetch=False`` on an input-bound workload: ``python prefetch_speedup.py``.

Each sample is made on the fly with CPU work (a 2-D FFT low-pass filter and noise, from the sample's own generator),
as decoding and augmentation are, in the main process (``num_workers=0``); a small CNN trains on it. Both settings
train the same batches to the same weights (checked); rounds alternate them, and the figure is the median over
rounds of time per step from the 10th step to the last. On CUDA prefetching also pins each batch and copies it on
a side stream. Writes ``prefetch.md`` and ``prefetch.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import gpulayer.trainer as gl

SIDE = 64
CLASSES = 10


class Synthesised(Dataset):
    """Images made per sample: noise, low-pass filtered in the frequency domain, with a label."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        rows = torch.fft.fftfreq(SIDE).abs()[:, None]
        columns = torch.fft.rfftfreq(SIDE)[None, :]
        self.low_pass = ((rows**2 + columns**2) < 0.05).float()

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        image = torch.randn(3, SIDE, SIDE, generator=generator)
        for _ in range(4):  # the cost of a decode and a few augmentations
            image = torch.fft.irfft2(torch.fft.rfft2(image) * self.low_pass, s=(SIDE, SIDE))
            image = image + 0.1 * torch.randn(3, SIDE, SIDE, generator=generator)
        return image, index % CLASSES


class SmallCNN(gl.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(), nn.Linear(16 * 16 * 16, CLASSES)
        )

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.net(images), labels)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class StepClock(gl.Callback):
    def __init__(self, first: int) -> None:
        self.first, self.marks = first, []

    """The time and step at the start of step ``first`` and at the end of training (the GPU's queue drained)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.first:
            self._mark(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self._mark(trainer, pl_module)

    def _mark(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.marks.append((time.perf_counter(), trainer.global_step))


def fit(prefetch: bool, steps: int, batch_size: int, accelerator: str) -> tuple[float, torch.Tensor]:
    """Seconds per step and the final weights."""
    clock = StepClock(first=10)
    model = SmallCNN()
    trainer = gl.Trainer(
        accelerator=accelerator,
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        benchmark=False,
        prefetch=prefetch,
        callbacks=[clock],
        log_every_n_steps=0,
    )
    loader = DataLoader(Synthesised(steps * batch_size), batch_size=batch_size, num_workers=0)
    trainer.fit(model, loader)
    (start, first_step), (end, last_step) = clock.marks
    weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    return (end - start) / (last_step - first_step), weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = parser.parse_args()
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    # cuDNN may pick convolution kernels that add in a varying order (atomics): both runs take the deterministic
    # ones, so that equal weights can prove the same work.
    torch.backends.cudnn.deterministic = True
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        weights = {}
        for prefetch in (False, True):
            seconds, weights[prefetch] = fit(prefetch, args.steps, args.batch_size, accelerator)
            times[prefetch].append(seconds)
        if not torch.allclose(weights[False], weights[True], rtol=0, atol=1e-6):
            raise SystemExit("prefetch=True trained to other weights than prefetch=False: not the same work")
    off, on = statistics.median(times[False]), statistics.median(times[True])
    device = torch.cuda.get_device_name() if accelerator == "cuda" else f"CPU ({platform.processor() or 'unknown'})"
    result = {
        "device": device,
        "torch": torch.__version__,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "ms_per_step": {"prefetch=False": off * 1e3, "prefetch=True": on * 1e3},
        "speed_up": off / on,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefetch.json").write_text(json.dumps(result, indent=1))
    (args.out / "prefetch.md").write_text(
        f"# prefetch on an input-bound workload\n\n{device}, torch {torch.__version__}, {args.steps} steps of "
        f"{args.batch_size} synthesised 3x{SIDE}x{SIDE} images, median of {args.rounds} rounds.\n\n"
        f"| setting | ms/step |\n| --- | ---: |\n| prefetch=False | {off * 1e3:.2f} |\n"
        f"| prefetch=True | {on * 1e3:.2f} |\n\nSpeed-up: {off / on:.2f}x (same weights in both).\n"
    )
    print(f"{device}: prefetch=False {off * 1e3:.2f} ms/step, prefetch=True {on * 1e3:.2f} ms/step, x{off / on:.2f}")


if __name__ == "__main__":
    main()
