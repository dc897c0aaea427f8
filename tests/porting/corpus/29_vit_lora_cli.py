"""A research project's LightningCLI: a Hugging Face ViT (a tiny one, random init) fine-tuned through peft LoRA on
the attention's query and value, in 16-mixed precision on the CPU; random flips and crops in the DataLoader's
workers; a per-step cosine warm-up sized by estimated_stepping_batches; a MetricCollection logged item by item; a
CLI subclass that adds ModelCheckpoint's arguments, and a CSVLogger as a lazy trainer default."""

import math
import os

import torch
import torchmetrics
from jsonargparse import lazy_instance
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import CSVLogger
from peft import LoraConfig, get_peft_model
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import ViTConfig, ViTForImageClassification

NUM_CLASSES = 4


class ShapesDataset(Dataset):
    """``count`` 3x16x16 images of four noisy colour blobs; ``augment`` flips and shifts each one at random."""

    def __init__(self, count: int, seed: int, augment: bool = False):
        generator = torch.Generator().manual_seed(seed)
        patterns = torch.rand(NUM_CLASSES, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        self.labels = torch.randint(0, NUM_CLASSES, (count,), generator=generator)
        self.images = patterns[self.labels] + 0.3 * torch.randn(count, 3, 16, 16, generator=generator)
        self.augment = augment

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index]
        if self.augment:  # torch's global generator: the one each DataLoader worker seeds
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
            padded = F.pad(image, (2, 2, 2, 2), mode="reflect")
            top, left = torch.randint(0, 5, (2,)).tolist()
            image = padded[:, top : top + 16, left : left + 16]
        return image, self.labels[index]


class ShapesDataModule(LightningDataModule):
    def __init__(self, batch_size: int = 16, num_workers: int = 2):
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers

    def setup(self, stage):
        self.train_set = ShapesDataset(256, seed=1, augment=True)
        self.val_set = ShapesDataset(64, seed=2)

    def train_dataloader(self):
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=32, num_workers=self.num_workers)


class ViTLoRAClassifier(LightningModule):
    def __init__(self, lora_rank: int = 4, lr: float = 3e-3, warmup_steps: int = 4):
        super().__init__()
        self.save_hyperparameters()
        config = ViTConfig(
            image_size=16,
            patch_size=4,
            num_channels=3,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=NUM_CLASSES,
        )
        lora = LoraConfig(
            r=lora_rank, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["classifier"]
        )
        self.model = get_peft_model(ViTForImageClassification(config), lora)
        metrics = torchmetrics.MetricCollection(
            {
                "acc": torchmetrics.Accuracy(task="multiclass", num_classes=NUM_CLASSES),
                "f1": torchmetrics.F1Score(task="multiclass", num_classes=NUM_CLASSES, average="macro"),
            }
        )
        self.train_metrics = metrics.clone(prefix="train_")
        self.val_metrics = metrics.clone(prefix="val_")

    def forward(self, images):
        return self.model(pixel_values=images).logits

    def training_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        self.train_metrics(logits, labels)
        for name, metric in self.train_metrics.items():
            self.log(name, metric, on_step=True, on_epoch=True)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self(images)
        self.val_metrics(logits, labels)
        for name, metric in self.val_metrics.items():
            self.log(name, metric, on_epoch=True)
        self.log("val_loss", F.cross_entropy(logits, labels), on_epoch=True)

    def configure_optimizers(self):
        trainable = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=self.hparams.lr, weight_decay=0.01)
        total = self.trainer.estimated_stepping_batches
        warmup = self.hparams.warmup_steps

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ResearchCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val_loss", "checkpoint.save_last": True})


out_dir = os.environ.get("OUT_DIR", "runs")
cli = ResearchCLI(
    ViTLoRAClassifier,
    ShapesDataModule,
    seed_everything_default=7,
    trainer_defaults={
        "accelerator": "cpu",
        "precision": "16-mixed",
        "max_steps": 20,
        "val_check_interval": 10,
        "check_val_every_n_epoch": None,
        "log_every_n_steps": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": lazy_instance(CSVLogger, save_dir=out_dir, name="vit_lora"),
        "default_root_dir": out_dir,
    },
    save_config_kwargs={"overwrite": True},
    run=False,
)
cli.trainer.fit(cli.model, datamodule=cli.datamodule)
