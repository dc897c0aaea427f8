"""Plain PyTorch training, no Trainer: `Runtime` places the process and its collectives keep the ranks in step.

One code path for one process or many, chosen from the environment (as nanoGPT's train.py does):

    python docs/examples/plain_pytorch.py                                      # one process
    gpulayer launch --nproc-per-node 2 docs/examples/plain_pytorch.py          # two: gloo on CPU, NCCL on GPUs
    python docs/examples/plain_pytorch.py --epochs 5 --accelerator cpu --out /tmp/plain.pt

It fits a small MLP to a seeded random "teacher" network (the data is generated, nothing is downloaded). Rank 0
draws the seed and broadcasts it, the validation loss is averaged over the ranks, the ranks agree on stopping
early, and rank 0 alone prints and saves the final weights.
"""

import argparse
import math
import os
import random
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gpulayer.runtime import Runtime

FEATURES = 16


def make_data(seed: int, samples: int = 4096, val_samples: int = 512) -> tuple[TensorDataset, TensorDataset]:
    """The same train and validation sets on every rank, from ``seed`` alone."""
    generator = torch.Generator().manual_seed(seed)
    teacher = [torch.randn(FEATURES, 32, generator=generator) / 4, torch.randn(32, 1, generator=generator) / 4]
    x = torch.randn(samples + val_samples, FEATURES, generator=generator)
    y = torch.tanh(x @ teacher[0]) @ teacher[1]
    y = (y - y.mean()) / y.std() + 0.05 * torch.randn(len(x), 1, generator=generator)  # unit variance, some noise
    return TensorDataset(x[:samples], y[:samples]), TensorDataset(x[samples:], y[samples:])


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))


@torch.no_grad()
def validation_loss(model: nn.Module, loader: DataLoader, rt: Runtime) -> float:
    """The mean squared error over every rank's share: sums and counts are reduced, then divided."""
    model.eval()
    totals = torch.zeros(2, device=rt.device)  # [sum of squared errors, samples]
    for x, y in loader:
        x, y = x.to(rt.device), y.to(rt.device)
        totals[0] += F.mse_loss(model(x), y, reduction="sum")
        totals[1] += len(x)
    model.train()
    rt.all_reduce(totals)  # one collective per validation, not one per batch
    return (totals[0] / totals[1]).item()


def main(args: argparse.Namespace) -> None:
    with Runtime(accelerator=args.accelerator) as rt:
        # Rank 0 decides the seed and every rank uses its value: the same data, the same initial weights.
        seed = rt.broadcast(args.seed if args.seed is not None else random.randrange(2**31))
        torch.manual_seed(seed)
        train_set, val_set = make_data(seed)

        # Each rank reads its own share; set_epoch below reshuffles the shares every epoch, alike on every rank.
        # The validation set (512 samples) splits evenly over 1, 2, 4 or 8 ranks, so no sample is padded in twice.
        train_sampler = DistributedSampler(train_set, num_replicas=rt.world_size, rank=rt.global_rank, seed=seed)
        val_sampler = DistributedSampler(val_set, num_replicas=rt.world_size, rank=rt.global_rank, shuffle=False)
        train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
        val_loader = DataLoader(val_set, batch_size=256, sampler=val_sampler)

        model = make_model().to(rt.device)
        raw_model = model  # what is saved: the weights without DDP's "module." prefix
        if rt.world_size > 1:  # DDP averages the gradients in backward; Runtime already joined the process group
            model = DistributedDataParallel(model, device_ids=[rt.device] if rt.device.type == "cuda" else None)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

        if rt.is_global_zero:
            print(f"{rt.placement!r}: seed {seed}, {len(train_sampler)} training samples per rank", flush=True)
        started = time.monotonic()
        val_losses = []
        for epoch in range(args.epochs):
            train_sampler.set_epoch(epoch)
            for x, y in train_loader:
                loss = F.mse_loss(model(x.to(rt.device)), y.to(rt.device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            val_losses.append(validation_loss(raw_model, val_loader, rt))  # no DDP: nothing to sync per batch
            if rt.is_global_zero:
                print(
                    f"epoch {epoch} | train loss {loss.item():.5f} (rank 0) | val loss {val_losses[-1]:.5f}", flush=True
                )
            # Every decision that ends work is combined at a point all ranks reach. The averaged loss is the same
            # everywhere, but each rank's clock and its own training loss are not: rt.any makes them stop together.
            stop_here = (
                val_losses[-1] <= args.target_loss
                or time.monotonic() - started > args.time_limit
                or not math.isfinite(loss.item())
            )
            if rt.any(stop_here):
                break

        # Every rank trained with rank 0's seed for as many epochs, and DDP kept the replicas identical: one check at
        # the end shows it (and would catch a rank gone astray).
        weights = sum(p.double().sum().item() for p in raw_model.parameters())
        ranks = rt.all_gather((seed, len(val_losses), weights))
        if len(set(ranks)) != 1:
            raise RuntimeError(f"the ranks disagree (seed, epochs, weight sum): {ranks}")
        if rt.is_global_zero:
            final = {"model": raw_model.state_dict(), "val_losses": val_losses, "seed": seed, "ranks": ranks}
            save_atomically(final, args.out)
            print(f"stopped after {len(val_losses)} epoch(s), val loss {val_losses[-1]:.5f}; saved {args.out}")


def save_atomically(obj: object, path: str) -> None:
    """Write to a temporary file beside ``path``, then rename: a reader never sees half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.partial"
    torch.save(obj, partial)
    os.replace(partial, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", default="runs/plain_pytorch/final.pt", help="where rank 0 saves the final weights")
    parser.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=None, help="default: rank 0 draws one")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--target-loss", type=float, default=0.01, help="stop once the validation loss is this low")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds; stop after the epoch that passes it")
    main(parser.parse_args())
