"""A DataLoader subclass and a length-bucketing BatchSampler made in ``*_dataloader`` hooks, remade around the
distributed sampler under DDP from their own init arguments, as Lightning 2.6 remakes them; and Lightning's
refusals (types and messages) for the loaders that cannot be remade."""

import contextlib
import os
import re
import warnings

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks
from gpulayer.trainer.data.loader_rebuild import capturing_init_arguments, rebuilt
from gpulayer.trainer.exceptions import MisconfigurationException

from .conftest import quiet_lightning


class Sequences(Dataset):
    """Sequences of 1 to 9 steps of 3 features, each with its index and a target."""

    def __init__(self, size, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(1, 10, (size,), generator=generator).tolist()
        self.steps = [torch.randn(length, 3, generator=generator) for length in self.lengths]
        self.targets = torch.randn(size, generator=generator)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        return index, self.steps[index], self.targets[index]


def pad(samples):
    """A collate that pads the sequences of a batch to its longest, with a mask."""
    indices, steps, targets = zip(*samples, strict=True)
    longest = max(len(s) for s in steps)
    padded = torch.zeros(len(steps), longest, 3)
    mask = torch.zeros(len(steps), longest)
    for row, sequence in enumerate(steps):
        padded[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1.0
    return {"index": torch.tensor(indices), "steps": padded, "mask": mask, "target": torch.stack(targets)}


class BucketBatchSampler(BatchSampler):
    """Batches of similar lengths: the sampler's indices in chunks of ``bucket`` batches, each chunk sorted by
    length and cut into batches, whose order is shuffled with ``generator``."""

    def __init__(self, sampler, batch_size, drop_last, lengths, bucket=3, generator=None):
        super().__init__(sampler, batch_size, drop_last)
        self.lengths, self.bucket, self.generator = lengths, bucket, generator

    def __iter__(self):
        indices = list(self.sampler)
        batches = []
        for start in range(0, len(indices), self.batch_size * self.bucket):
            chunk = sorted(indices[start : start + self.batch_size * self.bucket], key=self.lengths.__getitem__)
            batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        if self.drop_last and len(batches[-1]) < self.batch_size:
            batches.pop()
        order = torch.randperm(len(batches), generator=self.generator).tolist()
        return iter([batches[i] for i in order])


class TaggedLoader(DataLoader):
    """A DataLoader subclass with an argument of its own, kept under another name."""

    def __init__(self, dataset, tag, **kwargs):
        super().__init__(dataset, **kwargs)
        self.loader_tag = tag


def _module_class(base, scenario):
    class SequenceRegressor(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.seen = {"train": [], "val": []}

        def forward(self, batch):
            mean = (batch["steps"] * batch["mask"][..., None]).sum(1) / batch["mask"].sum(1, keepdim=True)
            return self.layer(mean).squeeze(-1)

        def training_step(self, batch, batch_idx):
            self.seen["train"].append(batch["index"].tolist())
            return torch.nn.functional.mse_loss(self(batch), batch["target"])

        def validation_step(self, batch, batch_idx):
            self.seen["val"].append(batch["index"].tolist())

        def predict_step(self, batch, batch_idx):
            return batch["index"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            data = Sequences(40)
            if scenario == "subclass":
                return TaggedLoader(data, "train", batch_size=4, shuffle=True, collate_fn=pad)
            generator = torch.Generator().manual_seed(5)
            batches = BucketBatchSampler(RandomSampler(data), 4, False, data.lengths, generator=generator)
            return DataLoader(data, batch_sampler=batches, collate_fn=pad)

        def val_dataloader(self):
            data = Sequences(18, seed=1)
            if scenario == "subclass":
                return TaggedLoader(data, tag="val", batch_size=4, collate_fn=pad)
            generator = torch.Generator().manual_seed(6)
            batches = BucketBatchSampler(SequentialSampler(data), 4, False, data.lengths, bucket=2, generator=generator)
            return DataLoader(data, batch_sampler=batches, collate_fn=pad)

        def predict_dataloader(self):  # drop_last: a predict loader is remade to keep the last batch
            return TaggedLoader(Sequences(10, seed=2), "predict", batch_size=4, drop_last=True, collate_fn=pad)

    return SequenceRegressor


def _run(framework, scenario, root):
    is_ours = framework is gl
    framework.seed_everything(7)
    model = _module_class(gl.Module if is_ours else framework.LightningModule, scenario)()
    extra = {} if is_ours else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, enable_checkpointing=False,
        default_root_dir=root, **extra,
    )  # fmt: skip
    trainer.fit(model)
    loader = trainer.train_dataloader
    record = {
        "seen": model.seen,
        "weights": {name: tensor.tolist() for name, tensor in model.layer.state_dict().items()},  # no tensors: queued
        "loader": (type(loader).__name__, getattr(loader, "loader_tag", None), type(loader.batch_sampler).__name__),
    }
    if scenario == "subclass":
        predicted = trainer.predict(model)
        record["predicted"] = [batch.tolist() for batch in predicted]
        record["predict_tag"] = trainer.predict_dataloaders.loader_tag
    return record


def _both_frameworks_on_this_rank(runtime, root):
    """GPUlayer's runs first; then Lightning's, which finds the harness's process group and this rank in the
    variables a launcher sets."""
    ours = {scenario: _run(gl, scenario, f"{root}/gl-{scenario}") for scenario in ("subclass", "bucketing")}
    rank = str(runtime.global_rank)
    os.environ |= {"LOCAL_RANK": rank, "RANK": rank, "NODE_RANK": "0", "WORLD_SIZE": "2"}
    with warnings.catch_warnings():
        pl = quiet_lightning()
        theirs = {scenario: _run(pl, scenario, f"{root}/pl-{scenario}") for scenario in ("subclass", "bucketing")}
    return theirs, ours


@pytest.mark.multiprocess
def test_a_loader_subclass_and_a_bucketing_batch_sampler_are_remade_for_ddp_as_in_lightning(tmp_path):
    by_rank = run_ranks(_both_frameworks_on_this_rank, str(tmp_path), world_size=2, timeout=240)
    for rank, (theirs, ours) in enumerate(by_rank):
        for scenario, expected in theirs.items():
            actual = ours[scenario]
            assert actual["seen"] == expected["seen"], f"rank {rank}, {scenario}: other batches"
            assert actual["loader"] == expected["loader"], f"rank {rank}, {scenario}"
            assert actual["weights"] == expected["weights"], f"rank {rank}, {scenario}"
        assert ours["subclass"]["predicted"] == theirs["subclass"]["predicted"], f"rank {rank}"
        assert ours["subclass"]["predict_tag"] == "predict"
    (_, first), (_, second) = by_rank
    for scenario in ("subclass", "bucketing"):  # in an epoch, the ranks read the two halves of the data
        first_epoch = [
            i for record in (first, second) for batch in record[scenario]["seen"]["train"][:5] for i in batch
        ]
        assert sorted(first_epoch) == list(range(40))
    assert first["bucketing"]["loader"] == ("DataLoader", None, "BucketBatchSampler")
    assert first["subclass"]["loader"][:2] == ("TaggedLoader", "train")
    assert [len(batch) for batch in first["subclass"]["predicted"]] == [4, 1]  # the last batch kept


# One process: the capture, and Lightning's refusals, against Lightning's own functions.


@contextlib.contextmanager
def _lightning_capture():
    from lightning.fabric.utilities.data import _replace_dunder_methods

    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        yield


def _both_rebuilt(make, stage="train", in_hook=True):
    """(Lightning's, GPUlayer's) loader ``make()`` gives, remade around a sampler that reverses its dataset: what it
    is and gives, or the error remaking it raised."""
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities.data import _update_dataloader

    mode = {"train": RunningStage.TRAINING, "predict": RunningStage.PREDICTING}[stage]
    outcomes = []
    for capture, remake in (
        (_lightning_capture, lambda loader, sampler: _update_dataloader(loader, sampler, mode=mode)),
        (capturing_init_arguments, lambda loader, sampler: rebuilt(loader, sampler, stage)),
    ):
        with capture() if in_hook else contextlib.nullcontext():  # in a hook, or not
            loader = make()
        sampler = list(reversed(range(len(loader.dataset))))
        try:
            made = remake(loader, sampler)
        except Exception as error:
            outcomes.append(error)
            continue
        # Lightning wraps a predict loader's batch sampler to track its indices (GPUlayer does not track them).
        batch_sampler = getattr(made.batch_sampler, "_batch_sampler", made.batch_sampler)
        outcomes.append(
            {
                "class": type(made).__name__,
                "tag": getattr(made, "loader_tag", None),
                "batch_sampler": type(batch_sampler).__name__,
                "bucket": getattr(batch_sampler, "bucket", None),
                "drop_last": getattr(batch_sampler, "drop_last", made.drop_last),
                "sampler": batch_sampler.sampler is sampler if batch_sampler is not None else made.sampler is sampler,
                "collate_fn": made.collate_fn,
                "extra": getattr(made, "extra", None),
                "batches": [batch["index"].tolist() for batch in made],
            }
        )
    return outcomes


def _bucketing_loader():
    data = Sequences(10)
    generator = torch.Generator().manual_seed(3)
    batches = BucketBatchSampler(RandomSampler(data), 3, drop_last=True, lengths=data.lengths, generator=generator)
    loader = DataLoader(data, batch_sampler=batches, collate_fn=pad)
    loader.extra = "set after __init__"  # replayed on the remade loader
    return loader


@pytest.mark.parametrize(
    ("make", "stage"),
    [
        (lambda: TaggedLoader(Sequences(10), "mine", batch_size=3, collate_fn=pad, drop_last=True), "train"),
        (lambda: TaggedLoader(Sequences(10), tag="mine", batch_size=3, collate_fn=pad, drop_last=True), "predict"),
        (_bucketing_loader, "train"),
        (_bucketing_loader, "predict"),  # predict keeps the last batch: drop_last=False injected
    ],
)
def test_loaders_made_in_a_hook_are_remade_from_their_init_arguments_as_lightning_remakes_them(make, stage):
    theirs, ours = _both_rebuilt(make, stage)
    assert ours == theirs
    assert ours["sampler"] and ours["tag"] in ("mine", None) and ours["drop_last"] is (stage == "train")


def test_the_classes_are_restored_after_the_hook_even_when_it_raises():
    originals = {cls: dict(vars(cls)) for cls in (DataLoader, BatchSampler, TaggedLoader, BucketBatchSampler)}
    with pytest.raises(KeyError), capturing_init_arguments():
        assert DataLoader.__init__ is not originals[DataLoader]["__init__"]
        raise KeyError("the hook failed")
    assert {cls: dict(vars(cls)) for cls in originals} == originals
    loader = TaggedLoader(Sequences(4), "outside", batch_size=2)
    assert not [name for name in vars(loader) if name.startswith("_gpulayer")]  # nothing recorded outside a hook


class _NoSamplerArgument(BatchSampler):
    def __init__(self, data_source, batch_size):
        super().__init__(SequentialSampler(data_source), batch_size, drop_last=False)


class _FixedLoader(DataLoader):
    def __init__(self, dataset):
        super().__init__(dataset, batch_size=2)


class _ShufflingLoader(DataLoader):
    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, shuffle=True, **kwargs)


@pytest.mark.parametrize(
    ("make", "in_hook", "error", "says"),
    [
        # Its own argument is not an attribute of the same name, and it was not made in a hook.
        (lambda: TaggedLoader(Sequences(6), "mine", batch_size=2), False, MisconfigurationException, "['tag']"),
        (lambda: _FixedLoader(Sequences(6)), False, MisconfigurationException, "doesn't expose all its attributes"),
        (lambda: _ShufflingLoader(Sequences(6), batch_size=2), True, MisconfigurationException, "`shuffle=...`"),
        (lambda: DataLoader(Sequences(6), batch_sampler=[[0, 1], [2, 3]]), True, TypeError, "doesn't subclass"),
        (
            lambda: DataLoader(Sequences(6), batch_sampler=_NoSamplerArgument(range(6), 2)),
            True,
            TypeError,
            "`sampler.`",
        ),
    ],
)
def test_loaders_that_cannot_be_remade_are_refused_as_lightning_refuses_them(make, in_hook, error, says):
    theirs, ours = _both_rebuilt(make, in_hook=in_hook)
    assert isinstance(theirs, Exception) and says in str(theirs)
    assert isinstance(ours, error) and str(ours) == str(theirs)
    if error is MisconfigurationException:
        assert isinstance(ours, (ValueError, TypeError))  # GPUlayer's errors are the builtin types too


def _fit_given(framework, root):
    model = _module_class(gl.Module if framework is gl else framework.LightningModule, "subclass")()
    trainer = framework.Trainer(
        accelerator="cpu", strategy="ddp", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        default_root_dir=root,
    )  # fmt: skip
    with pytest.raises(Exception) as raised:
        trainer.fit(model, TaggedLoader(Sequences(8), "given", batch_size=4, collate_fn=pad))
    return raised.value


def test_a_loader_subclass_given_to_fit_under_ddp_is_refused_as_in_lightning(tmp_path):
    ours = _fit_given(gl, tmp_path / "gl")
    environment = dict(os.environ)
    try:
        with warnings.catch_warnings():
            theirs = _fit_given(quiet_lightning(), tmp_path / "pl")
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environment)
    assert isinstance(ours, MisconfigurationException) and str(ours) == str(theirs)
    assert re.search(r"missing attributes are \['tag'\]", str(ours))


def _predict_on_one_process(framework, root):
    model = _module_class(gl.Module if framework is gl else framework.LightningModule, "subclass")()
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = framework.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=root, **extra)
    from_hook = trainer.predict(model)
    given = trainer.predict(model, DataLoader(Sequences(7), batch_size=3, drop_last=True, collate_fn=pad))
    return [[batch.tolist() for batch in run] for run in (from_hook, given)], trainer.predict_dataloaders.drop_last


def test_a_predict_loader_is_remade_to_keep_its_last_batch_on_one_process_too_as_in_lightning(tmp_path):
    ours = _predict_on_one_process(gl, tmp_path / "gl")
    with warnings.catch_warnings():
        theirs = _predict_on_one_process(quiet_lightning(), tmp_path / "pl")
    assert ours == theirs
    (from_hook, given), drop_last = ours
    assert ([len(batch) for batch in from_hook], given[-1], drop_last) == ([4, 4, 2], [6], False)
