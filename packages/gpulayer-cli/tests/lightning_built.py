"""A callback another library might ship, built on Lightning 2.6's ``Callback``, for configs to name by class path."""

from lightning.pytorch.callbacks import Callback


class BatchCounter(Callback):
    """Counts the training batches, and the epochs ended.

    Args:
        start: The count before the first batch.
    """

    def __init__(self, start: int = 0):
        self.batches = start
        self.epochs = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs += 1
