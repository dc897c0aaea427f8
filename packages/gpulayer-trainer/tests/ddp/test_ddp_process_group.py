"""The Trainer inside a process group the user made (here the harness's, over a FileStore): DDP's options and
gradient skipping, reads of the metric dicts on one rank only, and data of uneven or unknown length."""

import warnings

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn import functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks

pytestmark = pytest.mark.multiprocess


class _Model(gl.Module):
    def __init__(self, unused_layer: bool = False) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)
        self.unused = nn.Linear(3, 1) if unused_layer else None

    def training_step(self, batch, batch_idx):
        loss = F.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss, sync_dist=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.mse_loss(self.net(batch[0]), batch[1]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _CountReductions(gl.Callback):
    """Counts DDP's gradient all-reduces with a communication hook (DDP's own extension point)."""

    def __init__(self) -> None:
        self.reductions = 0

    def on_train_start(self, trainer, pl_module):
        def counting(state, bucket):
            self.reductions += 1
            return allreduce_hook(state, bucket)

        trainer.strategy.model.register_comm_hook(None, counting)


class _ReadsOnRankZero(gl.Callback):
    """Reads every metric dict after every batch, on rank 0 only: a read must never be a collective."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero:
            trainer.callback_metrics, trainer.logged_metrics, trainer.progress_bar_metrics  # noqa: B018


def _data(rank: int, samples: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(rank)
    return TensorDataset(torch.randn(samples, 3, generator=generator), torch.randn(samples, 1, generator=generator))


def _accumulate_and_read(runtime, accumulate):
    counter = _CountReductions()
    trainer = gl.Trainer(
        accelerator="cpu", devices=2, max_epochs=2, accumulate_grad_batches=accumulate, logger=False,
        enable_checkpointing=False, log_every_n_steps=3, callbacks=[counter, _ReadsOnRankZero()],
    )  # fmt: skip
    model = _Model()
    trainer.fit(model, DataLoader(_data(0), batch_size=4), DataLoader(_data(1), batch_size=4))
    metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
    return trainer.strategy_name, trainer.runtime.placement.source, counter.reductions, trainer.global_step, metrics


@pytest.mark.parametrize(("accumulate", "steps"), [(1, 8), (3, 4)])
def test_micro_batches_that_do_not_step_skip_the_gradient_all_reduce(accumulate, steps):
    # 32 samples / 2 ranks / batch 4 = 4 batches per epoch; with accumulate=3 a window of 3 and one of 1, so
    # 2 steps an epoch: without no_sync every one of the 8 backward passes would all-reduce.
    ranks = run_ranks(_accumulate_and_read, accumulate, world_size=2, timeout=90)
    assert [r[:4] for r in ranks] == [("ddp", "process group", steps, steps)] * 2  # one bucket per step
    assert ranks[0][4] == ranks[1][4]  # synced metrics agree although rank 0 read them alone, often
    assert {"loss_step", "loss_epoch", "val_loss"} <= ranks[0][4].keys()


def _unused_parameter(runtime, find_unused_parameters):
    trainer = gl.Trainer(
        accelerator="cpu", strategy=gl.DDPStrategy(find_unused_parameters=find_unused_parameters), max_epochs=1,
        logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(_Model(unused_layer=True), DataLoader(_data(0), batch_size=4))
    return trainer.global_step


def test_ddp_strategy_options_reach_ddp():
    assert run_ranks(_unused_parameter, True, world_size=2, timeout=90) == [4, 4]
    with pytest.raises(AssertionError, match="find_unused_parameters=True"):  # DDP's own error, on the next step
        run_ranks(_unused_parameter, False, world_size=2, timeout=90)


class _Stream(IterableDataset):
    """No length; rank r yields 5 + 3r batches."""

    def __init__(self, rank: int) -> None:
        self.count = 5 + 3 * rank

    def __iter__(self):
        data = _data(0)
        return ((data[i][0], data[i][1]) for i in range(self.count))


def _uneven(runtime):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = gl.Trainer(
            accelerator="cpu", devices=2, max_epochs=2, logger=False, enable_checkpointing=False,
            use_distributed_sampler=False, num_sanity_val_steps=0,
        )  # fmt: skip
        rank = runtime.global_rank
        uneven_val = DataLoader(_data(rank, samples=8 + 4 * rank), batch_size=4)  # 2 and 3 batches
        trainer.fit(_Model(), DataLoader(_Stream(rank), batch_size=None), uneven_val)
        validated = trainer.validate(dataloaders=uneven_val, verbose=False)
    messages = [str(w.message) for w in caught if "different numbers of" in str(w.message)]
    return trainer.global_step, trainer.num_val_batches, validated, messages


def test_uneven_and_endless_data_end_together_on_every_rank():
    (step0, val0, res0, warned0), (step1, val1, res1, warned1) = run_ranks(_uneven, world_size=2, timeout=90)
    assert (step0, step1) == (10, 10)  # the stream of rank 0 ends after 5 batches, every epoch, on both ranks
    assert val0 == val1 == [2]
    assert res0 == res1  # val_loss is synced
    warning = (
        "the ranks have different numbers of val batches ([[2], [3]], by rank); every rank runs [2], so the others' "
        "extra batches are not used"
    )
    assert warned0 == warned1 == [warning, warning]  # in fit, and in validate


class _Predicts(_Model):
    def predict_step(self, batch, batch_idx):
        return batch[0]


def _predict(runtime):
    trainer = gl.Trainer(accelerator="cpu", devices=2, logger=False, enable_checkpointing=False)
    dataset = TensorDataset(torch.arange(9))  # 5 samples on rank 0 (3 batches), 4 on rank 1 (2 batches)
    batches = trainer.predict(_Predicts(), DataLoader(dataset, batch_size=2))
    return sorted(torch.cat(batches).tolist())


def test_predict_splits_the_data_without_padding_and_predicts_every_sample():
    rank0, rank1 = run_ranks(_predict, world_size=2, timeout=90)
    assert (rank0, rank1) == ([0, 2, 4, 6, 8], [1, 3, 5, 7])


class _Prepares(gl.DataModule):
    def __init__(self, folder, per_node):
        super().__init__()
        self.folder, self.prepare_data_per_node = folder, per_node

    def prepare_data(self):
        (self.folder / f"prepared-by-{self.trainer.global_rank}").write_text("")

    def setup(self, stage):
        self.found = sorted(p.name for p in self.folder.iterdir())  # after the barrier: rank 0's file is there

    def train_dataloader(self):
        return DataLoader(_data(0), batch_size=8)


def _prepare_data(runtime, folder, per_node):
    from pathlib import Path

    datamodule = _Prepares(Path(folder), per_node)
    trainer = gl.Trainer(accelerator="cpu", devices=2, max_steps=1, logger=False, enable_checkpointing=False)
    trainer.fit(_Model(), datamodule=datamodule)
    return datamodule.found


@pytest.mark.parametrize("per_node", [True, False])
def test_prepare_data_runs_on_rank_zero_while_the_other_rank_waits(tmp_path, per_node):
    # One node here, so local rank 0 is global rank 0 either way; the other rank waits at the barrier.
    assert run_ranks(_prepare_data, str(tmp_path), per_node, world_size=2, timeout=90) == [["prepared-by-0"]] * 2


def _time_interval_saves(runtime, folder):
    from datetime import timedelta

    from gpulayer.callbacks import ModelCheckpoint

    saves = ModelCheckpoint(dirpath=folder, train_time_interval=timedelta(0), save_top_k=-1, filename="{step}")
    trainer = gl.Trainer(
        accelerator="cpu", devices=2, max_epochs=1, logger=False, log_every_n_steps=3, callbacks=[saves],
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(_Model(), DataLoader(_data(0, samples=48), batch_size=4))  # 6 batches per rank
    return saves.last_model_path or saves.best_model_path


def test_a_time_interval_checkpoint_is_decided_at_sync_points_only(tmp_path):
    # An interval of 0 s is always due, but under DDP it is asked only at the sync points (steps 3 and 6 here):
    # no collective on the other batches.
    newest = str(tmp_path / "step=6.ckpt")
    assert run_ranks(_time_interval_saves, str(tmp_path), world_size=2, timeout=90) == [newest, newest]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=3.ckpt", "step=6.ckpt"]
