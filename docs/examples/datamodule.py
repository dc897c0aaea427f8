"""A DataModule for the Trainer: data prepared once per node, split alike on every process, one loader per stage.

    python docs/examples/datamodule.py                    # one process
    python docs/examples/datamodule.py --devices 2        # DDP on two processes: the Trainer starts them
    gpulayer launch --nproc-per-node 2 docs/examples/datamodule.py --devices 2

`prepare_data` generates the dataset file if it is missing (the stand-in for a download), `setup` reads it and
cuts train/val/test on every process, `teardown` lets go of it after each stage. The script fits a small
classifier, tests it, predicts the test samples, and prints the order in which the Trainer called the hooks.
The data is generated with torch: nothing is downloaded. Training takes about a second on a CPU; the rest of a
run is starting Python and, with --devices 2, the two ranks.
"""

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

from gpulayer.trainer import DataModule, Module, Trainer, seed_everything
from gpulayer.trainer.states import TrainerFn

FEATURES, CLASSES = 8, 4


class BlobsDataModule(DataModule):
    """Four overlapping Gaussian blobs in 8 dimensions, kept in ``data_dir/blobs.pt``."""

    def __init__(self, data_dir: str, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.path = Path(data_dir) / "blobs.pt"
        self.batch_size = batch_size
        self.seed = seed
        self.calls: list[str] = []  # the hooks the Trainer called on this process, in order

    def prepare_data(self) -> None:
        # One process per node (local rank 0) runs this while the others wait, so it only writes files: state set
        # here (self.x = ...) would exist on that one process. The Trainer calls it before every stage.
        self.calls.append("prepare_data")
        if self.path.exists():
            return
        generator = torch.Generator().manual_seed(1234)  # the dataset is fixed; --seed changes the split and the model
        labels = torch.randint(CLASSES, (4000,), generator=generator)
        centers = 0.8 * torch.randn(CLASSES, FEATURES, generator=generator)
        features = centers[labels] + torch.randn(len(labels), FEATURES, generator=generator)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")  # then a rename: a reader never sees half a file
        torch.save({"features": features, "labels": labels}, partial)
        os.replace(partial, self.path)
        print(f"prepare_data: wrote {self.path}", flush=True)

    def setup(self, stage: TrainerFn) -> None:
        # Every process, before every stage. Its own seeded generator, so that fit and test (each calls setup)
        # cut the same 70/15/15 split, and so does every rank.
        self.calls.append(f"setup({stage.value})")  # the entry point: TrainerFn.FITTING == "fit"
        data = torch.load(self.path)
        dataset = TensorDataset(data["features"], data["labels"])
        generator = torch.Generator().manual_seed(self.seed)
        self.train_set, self.val_set, self.test_set = random_split(dataset, [0.7, 0.15, 0.15], generator=generator)
        # Prediction runs on the test samples without their labels, each with its index in the file: under DDP
        # every rank predicts its own share, and the indices put the shares back in order.
        indices = torch.tensor(self.test_set.indices)
        self.predict_set = TensorDataset(indices, data["features"][indices])

    def train_dataloader(self) -> DataLoader:
        # No sampler: under DDP the Trainer gives each rank a shuffled share (DistributedSampler), as Lightning does.
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.predict_set, batch_size=256)

    def teardown(self, stage: TrainerFn) -> None:
        # After every stage: let go of the data; the next stage's setup reads it again.
        self.calls.append(f"teardown({stage.value})")
        self.train_set = self.val_set = self.test_set = self.predict_set = None


class Classifier(Module):
    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(dim=1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(dim=1) == y).float().mean(), sync_dist=True)  # averaged over ranks

    def predict_step(self, batch, batch_idx):
        indices, x = batch
        return indices, self(x).argmax(dim=1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def main(args: argparse.Namespace) -> None:
    # With --devices 2 outside a launcher, Trainer(...) runs this script again on two ranks (docs/distributed.md):
    # keep the code before it cheap and free of side effects. prepare_data does the writing, inside fit.
    seed_everything(args.seed)
    datamodule = BlobsDataModule(args.data_dir, seed=args.seed)
    model = Classifier()
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        max_epochs=args.max_epochs,
        default_root_dir=args.root_dir,
        log_every_n_steps=10,
    )
    trainer.fit(model, datamodule=datamodule)
    test_acc = trainer.test(model, datamodule=datamodule)[0]["test_acc"]
    batches = trainer.predict(model, datamodule=datamodule)

    # Each rank predicted its own share: every rank gathers them, rank 0 writes them in sample order.
    shares = trainer.runtime.all_gather(
        (torch.cat([indices for indices, _ in batches]), torch.cat([classes for _, classes in batches]))
    )
    if trainer.is_global_zero:
        indices = torch.cat([indices for indices, _ in shares])
        classes = torch.cat([classes for _, classes in shares])
        order = indices.argsort()
        predictions = Path(trainer.log_dir) / "predictions.pt"
        torch.save({"index": indices[order], "class": classes[order]}, predictions)
        print(f"hooks on rank 0: {', '.join(datamodule.calls)}")
        print(
            f"test accuracy {test_acc:.4f} on {trainer.world_size} rank(s); {len(order)} predictions in {predictions}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="runs/datamodule/data", help="where prepare_data writes blobs.pt")
    parser.add_argument("--root-dir", default="runs/datamodule", help="the Trainer's logs and checkpoints")
    parser.add_argument("--max-epochs", type=int, default=5)
    parser.add_argument("--devices", type=int, default=1, help="processes on this node; 2 runs DDP")
    parser.add_argument("--accelerator", default="auto", help='"cpu", "gpu" or "auto"')
    parser.add_argument("--seed", type=int, default=0)
    main(parser.parse_args())
