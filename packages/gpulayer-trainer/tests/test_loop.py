"""Trainer behaviour beyond the differential tests: GPUlayer's own arguments, errors, exceptions, the log line."""

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from gpulayer.trainer import Callback, DataModule, Module, Trainer, seed_everything


class Regressor(Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(dropout), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data(n=40):
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator))


def _fit(tmp_path, model, loader, **kwargs):
    trainer = Trainer(accelerator="cpu", enable_checkpointing=False, default_root_dir=tmp_path, **kwargs)
    trainer.fit(model, loader)
    return trainer


def _weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_prefetch_gives_the_same_weights_as_no_prefetch(tmp_path, num_workers):
    results = []
    for prefetch in (False, True):
        seed_everything(3)
        model = Regressor(dropout=0.2)
        loader = DataLoader(_data(), batch_size=4, shuffle=True, num_workers=num_workers)
        trainer = _fit(tmp_path, model, loader, max_epochs=3, prefetch=prefetch, log_every_n_steps=0)
        results.append((_weights(model), trainer.global_step))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    assert results[0][1] == results[1][1] == 30


def test_prefetch_stops_its_thread_when_max_steps_ends_the_epoch_early(tmp_path):
    import threading

    _fit(tmp_path, Regressor(), DataLoader(_data(), batch_size=2), max_steps=3, prefetch=True, log_every_n_steps=0)
    assert not [t for t in threading.enumerate() if t.name == "gpulayer-prefetch"]


def test_prefetch_loads_with_one_intra_op_thread_and_leaves_other_threads_counts_alone(tmp_path):
    import threading

    class RecordsThreads(TensorDataset):
        def __init__(self, *tensors):
            super().__init__(*tensors)
            self.seen = set()

        def __getitem__(self, index):
            self.seen.add((threading.current_thread().name, torch.get_num_threads()))
            return super().__getitem__(index)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        data = RecordsThreads(*_data().tensors)
        _fit(tmp_path, Regressor(), DataLoader(data, batch_size=4), max_epochs=2, prefetch=True, log_every_n_steps=0)
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert data.seen == {("MainThread", 2), ("gpulayer-prefetch", 1)}  # each epoch's first batch: the caller
        assert (torch.get_num_threads(), later) == (2, [2])
    finally:
        torch.set_num_threads(before)


def test_the_log_line_shows_epoch_step_loss_progress_bar_metrics_speed_and_time_left(tmp_path, capsys):
    _fit(tmp_path, Regressor(), DataLoader(_data(), batch_size=4), max_epochs=1, log_every_n_steps=5)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("epoch 0 | step 5/10 | loss ")
    assert " | loss " in lines[0] and "samples/s" in lines[0] and lines[0].endswith("left")


def test_log_every_n_steps_zero_prints_nothing(tmp_path, capsys):
    _fit(tmp_path, Regressor(), DataLoader(_data(), batch_size=4), max_epochs=1, log_every_n_steps=0)
    assert capsys.readouterr().out == ""


def test_max_time_of_zero_stops_before_the_first_batch(tmp_path):
    trainer = _fit(tmp_path, Regressor(), DataLoader(_data(), batch_size=4), max_epochs=5, max_time={"seconds": 0})
    assert trainer.global_step == 0


def test_max_time_stops_after_the_batch_that_crosses_it(tmp_path):
    class SlowBatches(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 2:
                trainer.callbacks[-1]._offset = 3600.0  # the Timer now sees an hour gone

    trainer = _fit(
        tmp_path,
        Regressor(),
        DataLoader(_data(), batch_size=4),
        max_epochs=5,
        max_time="00:00:10:00",
        callbacks=[SlowBatches()],
    )
    assert (trainer.global_step, trainer.current_epoch) == (3, 1)


def test_a_module_without_training_step_is_refused_naming_the_method(tmp_path):
    class NoStep(Module):
        pass

    with pytest.raises(NotImplementedError, match="training_step"):
        _fit(tmp_path, NoStep(), DataLoader(_data(), batch_size=4), max_epochs=1)


@pytest.mark.parametrize("returned", [1.0, "sgd", {"lr_scheduler": None}])
def test_configure_optimizers_returning_something_else_names_the_method(tmp_path, returned):
    class Odd(Regressor):
        def configure_optimizers(self):
            return returned

    with pytest.raises(TypeError, match="configure_optimizers"):
        _fit(tmp_path, Odd(), DataLoader(_data(), batch_size=4), max_epochs=1)


def test_two_optimizers_are_refused_under_automatic_optimization(tmp_path):
    class Two(Regressor):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]

    with pytest.raises(RuntimeError, match="2 optimizers: training with several optimizers needs manual optimization"):
        _fit(tmp_path, Two(), DataLoader(_data(), batch_size=4), max_epochs=1)


def test_training_step_returning_something_else_is_refused(tmp_path):
    class Odd(Regressor):
        def training_step(self, batch, batch_idx):
            return 1.0

    with pytest.raises(TypeError, match="training_step returned float"):
        _fit(tmp_path, Odd(), DataLoader(_data(), batch_size=4), max_epochs=1)


def test_an_exception_reaches_on_exception_and_skips_teardown_hooks(tmp_path):
    calls = []

    class Recorder(Callback):
        def on_exception(self, trainer, pl_module, exception):
            calls.append(("on_exception", str(exception)))

        def on_fit_end(self, trainer, pl_module):
            calls.append("on_fit_end")

        def teardown(self, trainer, pl_module, stage):
            calls.append("teardown")

    class Failing(Regressor):
        def training_step(self, batch, batch_idx):
            raise ValueError("boom")

    class Data(DataModule):
        def train_dataloader(self):
            return DataLoader(_data(), batch_size=4)

        def on_exception(self, exception):
            calls.append(("datamodule", str(exception)))

    with pytest.raises(ValueError, match="boom"):
        Trainer(accelerator="cpu", max_epochs=1, callbacks=[Recorder()], default_root_dir=tmp_path).fit(
            Failing(), datamodule=Data()
        )
    assert calls == [("on_exception", "boom"), ("datamodule", "boom")]


def test_keyboard_interrupt_becomes_system_exit_1_after_on_exception(tmp_path):
    seen = []

    class Recorder(Callback):
        def on_exception(self, trainer, pl_module, exception):
            seen.append(type(exception).__name__)

    class Interrupted(Regressor):
        def training_step(self, batch, batch_idx):
            raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_info:
        _fit(tmp_path, Interrupted(), DataLoader(_data(), batch_size=4), max_epochs=1, callbacks=[Recorder()])
    assert exit_info.value.code == 1 and seen == ["KeyboardInterrupt"]


def test_an_iterable_dataset_without_length_trains_and_knows_its_last_batch(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            data = _data(12)
            return iter(data[i] for i in range(12))

    last = []

    class Last(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            last.append(trainer.is_last_batch)

    trainer = _fit(tmp_path, Regressor(), DataLoader(Stream(), batch_size=4), max_epochs=2, callbacks=[Last()])
    assert trainer.global_step == 6 and last == [False, False, True] * 2
    assert trainer.num_training_batches == float("inf")


def test_64_true_trains_in_double_and_logs_in_double(tmp_path):
    model = Regressor()
    trainer = _fit(tmp_path, model, DataLoader(_data(), batch_size=4), max_epochs=1, precision="64-true")
    assert model.layer[0].weight.dtype == torch.float64
    assert trainer.callback_metrics["loss"].dtype == torch.float64


def test_self_log_outside_a_trainer_warns_and_records_nothing():
    with pytest.warns(UserWarning, match="not attached"):
        Regressor().log("x", 1.0)


class _Indexed(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, index):
        return torch.tensor([float(index)])


def test_predict_returns_cpu_outputs_per_batch_and_lists_per_loader(tmp_path):
    class Doubler(Module):
        def forward(self, x):
            return x * 2

    trainer = Trainer(accelerator="cpu", default_root_dir=tmp_path)
    one = trainer.predict(Doubler(), DataLoader(_Indexed(), batch_size=4))
    assert [p.flatten().tolist() for p in one] == [[0, 2, 4, 6], [8, 10]]
    two = trainer.predict(Doubler(), [DataLoader(_Indexed(), batch_size=4), DataLoader(_Indexed(), batch_size=6)])
    assert [len(p) for p in two] == [2, 1]
    assert trainer.predict(Doubler(), DataLoader(_Indexed()), return_predictions=False) is None


def test_a_sync_dist_group_is_refused_naming_the_metric(tmp_path):
    class GroupLogging(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("grouped", loss, sync_dist=True, sync_dist_group="group")
            return loss

    with pytest.raises(ValueError, match=r"self.log\('grouped', ..., sync_dist_group='group'\)"):
        _fit(tmp_path, GroupLogging(), DataLoader(_data(), batch_size=8), max_epochs=1)


def test_batches_reads_no_batch_past_the_count_and_needs_only_next():
    from gpulayer.trainer.data.data import batches

    class NextOnly:  # an iterator that only defines __next__: the loop must not need more
        def __init__(self, items):
            self.items, self.reads = list(items), 0

        def __next__(self):
            if self.reads == len(self.items):
                raise StopIteration
            self.reads += 1
            return self.items[self.reads - 1]

    source = NextOnly("abcdef")
    assert list(batches(source, 4, start=1)) == [(1, "a", False), (2, "b", False), (3, "c", True)]
    assert source.reads == 3
    assert list(batches(NextOnly("ab"), 4)) == [(0, "a", False), (1, "b", False)]  # the loader ends first
    assert list(batches(NextOnly("ab"), float("inf"))) == [(0, "a", False), (1, "b", True)]


def test_a_repeated_log_call_is_checked_like_its_first_and_unhashable_options_still_work(tmp_path):
    class Logging(Regressor):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("listed", loss, prog_bar=[], on_epoch=True)  # an unhashable (falsy) option
            self.log("changes", loss, on_epoch=batch_idx > 1)  # the same until batch 2, then different
            return loss

    trainer = Trainer(accelerator="cpu", enable_checkpointing=False, default_root_dir=tmp_path, max_steps=2)
    trainer.fit(Logging(), DataLoader(_data(), batch_size=8))
    assert {"listed", "changes"} <= set(trainer.callback_metrics)
    assert "listed" not in trainer.progress_bar_metrics
    with pytest.raises(ValueError, match=r"self.log\('changes', ...\) was called twice in training_step"):
        _fit(tmp_path, Logging(), DataLoader(_data(), batch_size=8), max_epochs=1)
