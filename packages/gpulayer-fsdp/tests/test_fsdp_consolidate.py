"""``gpulayer consolidate``: a folder laid out as Lightning's FSDP strategy saves a sharded checkpoint, made one file
that GPUlayer and Lightning load and that one process and DDP resume from; Lightning's own ``consolidate_checkpoint``
reads the same folder; bad paths refused before anything is written.

One spawn of 2 gloo ranks trains under GPUlayer's FSDP strategy and writes the folder with DCP itself (the model and
optimizer under Lightning's keys, ``meta.pt`` from GPUlayer's ``dump_checkpoint``), beside the full checkpoint the
ranks gathered; everything else runs in this process.
"""

import importlib
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.fsdp.consolidate import consolidate, main
from gpulayer.runtime.testing import run_ranks
from gpulayer.trainer.checkpoint.sharded import by_index

from .conftest import packed, unpacked

PACKAGES = Path(__file__).resolve().parents[2]
STEPS = 2  # optimizer steps before the save: the first epoch (16 samples, batches of 4 per rank)


def _layers(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2))


class Net(gl.Module):
    """Two linear layers trained with AdamW (moments and step count are optimizer state); ``width`` is a
    hyperparameter, so loading the file needs ``meta.pt``'s."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = _layers(width)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def _loader(batch_size: int) -> DataLoader:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(16, 4, generator=generator)
    return DataLoader(TensorDataset(inputs, inputs[:, :2] ** 2), batch_size=batch_size)


def _trainer(folder: Path, devices: int, strategy: object, max_steps: int) -> gl.Trainer:
    return gl.Trainer(
        devices=devices,
        strategy=strategy,
        max_steps=max_steps,
        default_root_dir=str(folder),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )


def _two_ranks(runtime, folder: str) -> bytes:
    """Train, write ``sharded.ckpt`` (Lightning's layout) and ``full.ckpt`` (the ranks' gathered state); rank 0
    consolidates, and both ranks resume under DDP from its file and from the full one. Returns the resumed runs."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from gpulayer.fsdp import FSDPStrategy
    from gpulayer.trainer.checkpoint.checkpoint import dump_checkpoint

    folder, model = Path(folder), Net()
    trainer = _trainer(folder / "fsdp", 2, FSDPStrategy(), STEPS)
    trainer.fit(model, _loader(4))
    checkpoint = dump_checkpoint(trainer)  # every rank gathers; rank 0 keeps the full state
    full = {key: checkpoint.pop(key) for key in ("state_dict", "optimizer_states")}
    # What lightning/pytorch/strategies/fsdp.py's save_checkpoint writes for state_dict_type="sharded".
    sharded = {"model": model.state_dict(), "optimizer_0": get_optimizer_state_dict(model, trainer.optimizers[0])}
    dcp.save(sharded, checkpoint_id=folder / "sharded.ckpt")
    if runtime.global_rank == 0:
        torch.save(checkpoint, folder / "sharded.ckpt" / "meta.pt")
        torch.save({**checkpoint, **full}, folder / "full.ckpt")
        consolidate(folder / "sharded.ckpt", folder / "on-rank-0.ckpt")
    runtime.barrier()
    resumed = {}
    for name in ("on-rank-0", "full"):
        trainer = _trainer(folder / f"ddp-{name}", 2, "ddp", 2 * STEPS)
        trainer.fit(Net(), _loader(4), ckpt_path=str(folder / f"{name}.ckpt"))
        resumed[name] = [trainer.global_step, trainer.lightning_module.state_dict()]
    return packed(resumed)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The spawn's folder: ``sharded.ckpt/``, ``full.ckpt``, ``on-rank-0.ckpt`` and ``ddp-resumed.pt``."""
    folder = tmp_path_factory.mktemp("consolidate")
    torch.save(unpacked(run_ranks(_two_ranks, str(folder), timeout=120))[0], folder / "ddp-resumed.pt")
    return folder


def _assert_bit_equal(actual: object, expected: object, where: str = "") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype, where
        assert torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (where, actual, expected)
        for key in expected:
            _assert_bit_equal(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_bit_equal(a, e, f"{where}[{index}]")
    else:
        assert actual == expected, where


@pytest.mark.multiprocess
def test_the_consolidated_file_is_the_full_checkpoint_and_resumes_anywhere(folder, tmp_path, capsys):
    output = tmp_path / "one.ckpt"
    assert main([str(folder / "sharded.ckpt"), "-o", str(output)]) == 0
    assert f"wrote {output} (epoch 1, global step {STEPS}, 4 tensors)" in capsys.readouterr().out
    one = torch.load(output, weights_only=True)
    full = torch.load(folder / "full.ckpt", weights_only=True)
    # Weights and optimizer state bit-equal to what the ranks gathered, in the full checkpoint's own format.
    _assert_bit_equal(one, full)
    assert isinstance(one["optimizer_states"][0]["state"][0]["exp_avg"], torch.Tensor)
    _assert_bit_equal(torch.load(folder / "on-rank-0.ckpt", weights_only=True), full)

    loaded = Net.load_from_checkpoint(output)
    _assert_bit_equal(loaded.state_dict(), full["state_dict"])

    # Resumed in one process, from the consolidated file and from the full one: the same run.
    runs = {}
    for name, path in (("consolidated", output), ("full", folder / "full.ckpt")):
        trainer = _trainer(tmp_path / name, 1, "auto", 2 * STEPS)
        trainer.fit(Net(), _loader(8), ckpt_path=str(path))
        assert trainer.global_step == 2 * STEPS
        runs[name] = trainer.lightning_module.state_dict()
    _assert_bit_equal(runs["consolidated"], runs["full"])
    assert not torch.equal(runs["full"]["net.0.weight"], full["state_dict"]["net.0.weight"])  # it did train on

    # And under DDP on 2 ranks (in the spawn, from rank 0's consolidation of the folder): the same run again.
    ddp = torch.load(folder / "ddp-resumed.pt", weights_only=True)
    assert ddp["on-rank-0"][0] == ddp["full"][0] == 2 * STEPS
    _assert_bit_equal(ddp["on-rank-0"][1], ddp["full"][1])
    assert not torch.equal(ddp["full"][1]["net.0.weight"], full["state_dict"]["net.0.weight"])


@pytest.mark.multiprocess
def test_lightning_loads_the_file_and_its_consolidate_checkpoint_reads_the_folder(folder, tmp_path, monkeypatch):
    lightning = pytest.importorskip("lightning.pytorch")

    class LightningNet(lightning.LightningModule):
        def __init__(self, width: int = 8) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = _layers(width)

    output = tmp_path / "one.ckpt"
    consolidate(folder / "sharded.ckpt", output)
    full = torch.load(folder / "full.ckpt", weights_only=True)
    _assert_bit_equal(LightningNet.load_from_checkpoint(output).state_dict(), full["state_dict"])

    theirs = tmp_path / "lightning.ckpt"
    module = "lightning.fabric.utilities.consolidate_checkpoint"
    monkeypatch.setattr(sys, "argv", [module, str(folder / "sharded.ckpt"), "--output_file", str(theirs)])
    runpy.run_module(module, run_name="__main__")
    converted = torch.load(theirs, weights_only=True)
    _assert_bit_equal(converted["model"], full["state_dict"])  # Lightning keeps its sharded keys: model, optimizer_0
    state, groups = converted["optimizer_0"]["state"], converted["optimizer_0"]["param_groups"]
    names = [name for group in groups for name in group["params"]]
    _assert_bit_equal({names.index(name): value for name, value in state.items()}, full["optimizer_states"][0]["state"])
    assert converted["global_step"] == full["global_step"] and converted["hyper_parameters"] == {"width": 8}


@pytest.mark.multiprocess
def test_bad_paths_are_refused_naming_them_before_anything_is_written(folder, tmp_path, capsys):
    def refused(args: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
        return capsys.readouterr().err

    sharded = folder / "sharded.ckpt"
    output = tmp_path / "one.ckpt"
    assert f"{folder / 'full.ckpt'} is not a folder" in refused([str(folder / "full.ckpt"), "-o", str(output)])
    for name in (".metadata", "meta.pt"):
        broken = tmp_path / f"without-{name}"
        shutil.copytree(sharded, broken)
        (broken / name).unlink()
        assert f"{broken} is no whole sharded checkpoint: it has no {name}" in refused([str(broken), "-o", str(output)])
    inside = sharded / "one.ckpt"
    assert f"output {inside} lies inside the checkpoint folder" in refused([str(sharded), "-o", str(inside)])
    assert f"output {tmp_path} is a folder" in refused([str(sharded), "-o", str(tmp_path)])
    assert not output.exists() and not inside.exists()

    output.write_bytes(b"keep")
    assert f"output {output} exists" in refused([str(sharded), "-o", str(output)])
    assert output.read_bytes() == b"keep"
    assert main([str(sharded), "-o", str(output), "--force"]) == 0
    assert torch.load(output, weights_only=True)["global_step"] == STEPS


def test_optimizer_state_by_name_is_numbered_by_its_place_in_param_groups():
    groups = [{"params": ["b", "a"], "lr": 0.1}, {"params": ["c"], "lr": 0.2}]
    moments = {"a": {"momentum_buffer": torch.ones(1)}, "c": {"momentum_buffer": torch.zeros(1)}}  # b: none yet
    _assert_bit_equal(
        by_index({"state": moments, "param_groups": groups}),
        {
            "state": {1: moments["a"], 2: moments["c"]},
            "param_groups": [{"params": [0, 1], "lr": 0.1}, {"params": [2], "lr": 0.2}],
        },
    )
    indexed = {"state": {0: moments["a"]}, "param_groups": [{"params": [0, 1], "lr": 0.1}]}
    assert by_index(indexed) is indexed  # already Optimizer.state_dict()'s form


def test_the_command_is_declared_for_gpulayer():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    fsdp = tomllib.loads((PACKAGES / "gpulayer-fsdp" / "pyproject.toml").read_text())["project"]
    module, function = fsdp["entry-points"]["gpulayer.commands"]["consolidate"].split(":")
    assert getattr(importlib.import_module(module), function) is main


def test_the_installed_gpulayer_command_runs_it(tmp_path):
    """``gpulayer consolidate`` through the installed entry point: a path that is no folder is refused by name."""
    command = Path(sys.executable).with_name("gpulayer")
    missing = tmp_path / "missing.ckpt"
    done = subprocess.run(
        [command, "consolidate", missing, "-o", tmp_path / "one.ckpt"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert f"{missing} is not a folder" in done.stderr
    assert not (tmp_path / "one.ckpt").exists()
