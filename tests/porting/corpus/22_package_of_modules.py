"""The training script of a package whose modules import each other (`shapes_package/`)."""

import os

from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor
from shapes_package.data import Blobs
from shapes_package.model import TwoClasses

seed_everything(8)
model = TwoClasses()
trainer = Trainer(
    max_epochs=3,
    accelerator="cpu",
    enable_checkpointing=False,
    enable_model_summary=False,
    log_every_n_steps=2,
    default_root_dir=os.environ.get("OUT_DIR", "runs"),
    callbacks=[LearningRateMonitor()],
)
trainer.fit(model, datamodule=Blobs())
