"""Variable-length token sequences batched by a length-bucketing BatchSampler with a padding collate, under DDP.

The trainer puts its distributed sampler into the bucketing sampler, which it remakes from its init arguments.
(One process: the corpus records the process that ran the script, so `devices=1`; the two-rank run is
`packages/gpulayer-trainer/tests/differential/test_loader_rebuild.py`.)
"""

import os

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler, random_split

VOCAB = 32


class TokenSequences(Dataset):
    """Sequences of 4 to 40 tokens; the label says whether high tokens outnumber low ones."""

    def __init__(self, size: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(4, 41, (size,), generator=generator)
        self.sequences = [torch.randint(1, VOCAB, (int(n),), generator=generator) for n in lengths]
        self.labels = [int((s >= VOCAB // 2).sum() > (s < VOCAB // 2).sum()) for s in self.sequences]

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, index):
        return self.sequences[index], self.labels[index]


def collate_padded(batch):
    sequences, labels = zip(*batch, strict=True)
    lengths = torch.tensor([len(s) for s in sequences])
    return pad_sequence(list(sequences), batch_first=True, padding_value=0), lengths, torch.tensor(labels)


class BucketBySequenceLengthSampler(BatchSampler):
    """Takes `bucket_size_multiplier` batches' worth of indices at a time, sorts them by length, cuts them into
    batches and shuffles the batches, so that little of each batch is padding."""

    def __init__(self, sampler, batch_size, drop_last, lengths, bucket_size_multiplier=4, generator=None):
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = lengths
        self.bucket_size_multiplier = bucket_size_multiplier
        self.generator = generator

    def __iter__(self):
        indices = list(self.sampler)
        bucket_size = self.batch_size * self.bucket_size_multiplier
        batches = []
        for start in range(0, len(indices), bucket_size):
            bucket = sorted(indices[start : start + bucket_size], key=lambda i: self.lengths[i])
            batches.extend(bucket[i : i + self.batch_size] for i in range(0, len(bucket), self.batch_size))
        if self.drop_last and len(batches[-1]) < self.batch_size:
            batches.pop()
        for i in torch.randperm(len(batches), generator=self.generator).tolist():
            yield batches[i]


class SequenceData(LightningDataModule):
    def __init__(self, batch_size: int = 16):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str):
        full = TokenSequences(480)
        self.train_set, self.val_set, self.test_set = random_split(
            full, [320, 80, 80], generator=torch.Generator().manual_seed(1)
        )

    def _lengths(self, subset):
        return [len(subset[i][0]) for i in range(len(subset))]

    def train_dataloader(self):
        sampler = BucketBySequenceLengthSampler(
            RandomSampler(self.train_set),
            batch_size=self.hparams.batch_size,
            drop_last=False,
            lengths=self._lengths(self.train_set),
            generator=torch.Generator().manual_seed(3),
        )
        return DataLoader(self.train_set, batch_sampler=sampler, collate_fn=collate_padded)

    def val_dataloader(self):
        sampler = BucketBySequenceLengthSampler(
            SequentialSampler(self.val_set),
            self.hparams.batch_size,
            False,
            self._lengths(self.val_set),
            generator=torch.Generator().manual_seed(4),
        )
        return DataLoader(self.val_set, batch_sampler=sampler, collate_fn=collate_padded)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size, collate_fn=collate_padded)


class BagOfEmbeddings(LightningModule):
    def __init__(self, dim: int = 16, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.Embedding(VOCAB, dim, padding_idx=0)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 2))

    def forward(self, tokens, lengths):
        summed = self.embedding(tokens).sum(dim=1)
        return self.head(summed / lengths[:, None])

    def training_step(self, batch, batch_idx):
        tokens, lengths, labels = batch
        loss = nn.functional.cross_entropy(self(tokens, lengths), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        tokens, lengths, labels = batch
        logits = self(tokens, lengths)
        self.log("val_loss", nn.functional.cross_entropy(logits, labels), prog_bar=True)
        self.log("val_acc", (logits.argmax(-1) == labels).float().mean())

    def test_step(self, batch, batch_idx):
        tokens, lengths, labels = batch
        self.log("test_acc", (self(tokens, lengths).argmax(-1) == labels).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


seed_everything(21)
datamodule = SequenceData()
model = BagOfEmbeddings()
trainer = Trainer(
    accelerator="cpu",
    strategy="ddp",
    devices=1,
    max_epochs=3,
    logger=False,
    enable_checkpointing=False,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
)
trainer.fit(model, datamodule=datamodule)
test_results = trainer.test(model, datamodule=datamodule)
