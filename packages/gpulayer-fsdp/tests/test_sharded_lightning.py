"""Sharded checkpoints against Lightning 2.6's own FSDP strategy, both ways: the folders hold the same keys, the
tensors one framework saved are the ones the other reads, and a run continued from the other's folder ends where
the other's unbroken run ends (step, weights, AdamW state).

One spawn of 2 gloo ranks runs both frameworks on the same model, data and AdamW. Lightning's ``FSDPStrategy`` is
GPU-only in two places, so its runs take two CPU shims, neither touching its checkpoint code
(``lightning/pytorch/strategies/fsdp.py`` ``save_checkpoint``/``load_checkpoint`` run as shipped):

- ``Trainer`` refuses ``type(strategy) is FSDPStrategy`` without a CUDA accelerator
  (``lightning/pytorch/trainer/connectors/accelerator_connector.py``): a subclass with no body passes.
- Lightning wraps the module with ``device_id=root_device.index`` (None on CPU) and torch's FSDP1 then refuses
  ("FSDP needs a non-CPU accelerator device"): the module wraps ``net`` itself in ``configure_model``
  (``device_id=cpu``), Lightning's documented manual wrapping, and Lightning leaves a wrapped model as it is.

``meta.pt``'s ``loops`` entry is each trainer's own loop position (docs/porting-from-lightning.md, "Checkpoints"):
Lightning ignores GPUlayer's and starts counting from 0, GPUlayer cannot read Lightning's. So a continued run
resumes the other framework's folder with its own trainer's ``loops`` entry put into ``meta.pt``; Lightning also
resumes GPUlayer's folder as saved.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

import gpulayer.trainer as gl
from gpulayer.fsdp import FSDPStrategy
from gpulayer.runtime.testing import run_ranks
from gpulayer.trainer.checkpoint.sharded import by_index

from .conftest import packed, unpacked

STEPS_PER_EPOCH = 4  # 32 samples, 16 per rank in batches of 4


def _module_class(base: type) -> type:
    class Net(base):
        """Two linear layers under AdamW (two moments and a step count per parameter)."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))

        def training_step(self, batch, batch_idx):
            return F.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    return Net


def _loader(rank: int) -> DataLoader:
    """Rank r of 2 reads samples r, r+2, ...: the same shards in both frameworks (no distributed sampler)."""
    inputs = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    return DataLoader(Subset(TensorDataset(inputs, inputs[:, :2] ** 2), range(rank, 32, 2)), batch_size=4)


def _gpulayer(
    folder: Path, rank: int, name: str, max_epochs: int, strategy: str = "sharded", resume: str | None = None
):
    """GPUlayer on 2 ranks: sharded or full FSDP (each saves ``<name>.ckpt`` of its kind), or DDP (returns its state,
    as DDP holds it whole on every rank)."""
    trainer = gl.Trainer(
        devices=2,
        strategy="ddp" if strategy == "ddp" else FSDPStrategy(state_dict_type=strategy),
        max_epochs=max_epochs,
        default_root_dir=str(folder / name),
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
    )
    trainer.fit(_module_class(gl.Module)(), _loader(rank), ckpt_path=resume and str(folder / resume))
    if strategy == "ddp":
        return {"global_step": trainer.global_step, "weights": trainer.lightning_module.state_dict(),
                "optimizer": trainer.optimizers[0].state_dict()}  # fmt: skip
    trainer.save_checkpoint(str(folder / f"{name}.ckpt"))
    return None


@contextlib.contextmanager
def _as_launched_for_lightning(rank: int):
    """A torchrun launch's variables, by which Lightning finds this rank and the harness's process group; its
    warnings off."""
    environment = dict(os.environ)
    os.environ |= {"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": "2"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        os.environ.clear()
        os.environ.update(environment)


def _lightning(folder: Path, rank: int, name: str, max_epochs: int, resume: str | None = None) -> None:
    """Lightning 2.6's FSDP strategy (FSDP1) with ``state_dict_type="sharded"``: trains, then saves ``<name>.ckpt``."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import FSDPStrategy as LightningFSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # after its import, which sets INFO

    class OnCPU(LightningFSDPStrategy):
        """Lightning's strategy, unchanged: only not ``type(...) is FSDPStrategy``, which requires CUDA."""

    class Net(_module_class(pl.LightningModule)):
        def configure_model(self):
            if not isinstance(self.net, FullyShardedDataParallel):
                self.net = FullyShardedDataParallel(self.net, device_id=torch.device("cpu"), use_orig_params=True)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=OnCPU(state_dict_type="sharded"),
        max_epochs=max_epochs,
        default_root_dir=str(folder / name),
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(), _loader(rank), ckpt_path=resume and str(folder / resume))
    trainer.save_checkpoint(str(folder / f"{name}.ckpt"))


def _with_loops_of(folder: Path, name: str, loops_from: str, runtime) -> str:
    """A copy of ``<name>.ckpt`` whose ``meta.pt`` holds the ``loops`` entry of ``<loops_from>.ckpt`` (the same
    position, saved by the other trainer), and nothing else changed."""
    copy = f"{name}-with-{loops_from}-loops.ckpt"
    if runtime.global_rank == 0:
        shutil.copytree(folder / f"{name}.ckpt", folder / copy)
        meta = torch.load(folder / copy / "meta.pt", weights_only=True)
        meta["loops"] = torch.load(folder / f"{loops_from}.ckpt" / "meta.pt", weights_only=True)["loops"]
        torch.save(meta, folder / copy / "meta.pt")
    runtime.barrier()
    return copy


def _both_frameworks(runtime, folder: str) -> bytes:
    """Each framework's first epoch (saved) and unbroken two epochs, and each resuming the other's first epoch:
    GPUlayer under sharded FSDP, full FSDP and DDP, Lightning under its FSDP. Returns the DDP run's state."""
    folder, rank = Path(folder), runtime.global_rank
    _gpulayer(folder, rank, "gl-1", 1)
    _gpulayer(folder, rank, "gl-2", 2)
    with _as_launched_for_lightning(rank):
        _lightning(folder, rank, "pl-1", 1)
        _lightning(folder, rank, "pl-2", 2)
        _lightning(folder, rank, "pl-from-gl", 2, resume=_with_loops_of(folder, "gl-1", "pl-1", runtime))
        _lightning(folder, rank, "pl-from-gl-as-saved", 1, resume="gl-1.ckpt")  # counts from 0: one epoch more
    theirs = _with_loops_of(folder, "pl-1", "gl-1", runtime)
    _gpulayer(folder, rank, "gl-from-pl", 2, resume=theirs)
    _gpulayer(folder, rank, "gl-full-from-pl", 2, strategy="full", resume=theirs)
    return packed(_gpulayer(folder, rank, "gl-ddp-from-pl", 2, strategy="ddp", resume=theirs))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every run's end state, in one form: global step, weights and AdamW state numbered as ``Optimizer.state_dict``."""
    pytest.importorskip("lightning.pytorch")
    folder = tmp_path_factory.mktemp("lightning")
    ddp = unpacked(run_ranks(_both_frameworks, str(folder), timeout=180))[0]
    ends = {"gl-ddp-from-pl": ddp}
    for name in ("gl-1", "gl-2", "pl-1", "pl-2", "pl-from-gl", "pl-from-gl-as-saved", "gl-from-pl"):
        dcp_to_torch_save(folder / f"{name}.ckpt", folder / f"{name}.pt")  # torch's own reading of the folder
        shards = torch.load(folder / f"{name}.pt", weights_only=True)
        meta = torch.load(folder / f"{name}.ckpt" / "meta.pt", weights_only=True)
        keys = sorted(dcp.FileSystemReader(folder / f"{name}.ckpt").read_metadata().state_dict_metadata)
        ends[name] = {"global_step": meta["global_step"], "weights": shards["model"],
                      "optimizer": by_index(shards["optimizer_0"]), "meta": meta, "keys": keys}  # fmt: skip
    full = torch.load(folder / "gl-full-from-pl.ckpt", weights_only=True)
    ends["gl-full-from-pl"] = {"global_step": full["global_step"], "weights": full["state_dict"],
                               "optimizer": full["optimizer_states"][0]}  # fmt: skip
    return ends


def _max_difference(actual: dict, expected: dict, name: str) -> float:
    """The largest |difference| over weights and AdamW state, after checking that both hold the same tensors."""
    assert actual["global_step"] == expected["global_step"], name
    pairs = [(actual["weights"][key], value) for key, value in expected["weights"].items()]
    assert actual["weights"].keys() == expected["weights"].keys(), name
    assert actual["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys(), name
    for index, state in expected["optimizer"]["state"].items():
        assert actual["optimizer"]["state"][index].keys() == state.keys(), name
        pairs += [(actual["optimizer"]["state"][index][key], value) for key, value in state.items()]
    for got, value in pairs:
        assert got.shape == value.shape and got.dtype == value.dtype, name
    return max((got - value).abs().max().item() for got, value in pairs)


@pytest.mark.multiprocess
def test_lightnings_and_gpulayers_sharded_folders_hold_the_same_keys(runs):
    """The same DCP keys (``model.*``, ``optimizer_0.*``) and param groups; GPUlayer's ``meta.pt`` holds Lightning's
    entries and adds its version and the RNG states."""
    ours, theirs = runs["gl-1"], runs["pl-1"]
    assert ours["keys"] == theirs["keys"]
    assert {f"model.net.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")} < set(ours["keys"])
    assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
    assert ours["meta"].keys() - theirs["meta"].keys() == {"gpulayer_version", "rng_states"}
    assert ours["meta"]["epoch"] == theirs["meta"]["epoch"] == 1
    assert ours["global_step"] == theirs["global_step"] == STEPS_PER_EPOCH


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("resumed", "unbroken"),
    [
        ("gl-from-pl", "pl-2"),  # GPUlayer (sharded FSDP2) continues Lightning's folder
        ("gl-full-from-pl", "pl-2"),  # ... under full FSDP2
        ("gl-ddp-from-pl", "pl-2"),  # ... under DDP
        ("pl-from-gl", "gl-2"),  # Lightning (FSDP1) continues GPUlayer's folder
        ("pl-2", "gl-2"),  # and the two unbroken runs agree
    ],
)
def test_a_folder_one_framework_saved_resumes_under_the_other_to_its_unbroken_run(runs, resumed, unbroken):
    """Epoch 1 saved by one framework, epoch 2 trained by the other: the unbroken run's step, weights and AdamW
    state, bit for bit: halving is exact in floating point, so FSDP1 and FSDP2 average two ranks' gradients to the
    same bits whichever order each divides and sums in."""
    difference = _max_difference(runs[resumed], runs[unbroken], f"{resumed} vs {unbroken}")
    print(f"{resumed} vs {unbroken}: max |difference| {difference:.3g}")
    assert runs[resumed]["global_step"] == 2 * STEPS_PER_EPOCH
    assert difference == 0


@pytest.mark.multiprocess
def test_lightning_resumes_gpulayers_folder_as_saved_with_its_tensors_and_its_counters_from_zero(runs):
    """GPUlayer's ``loops`` entry means nothing to Lightning: it restores the weights and AdamW state (one more
    epoch ends at the unbroken run's tensors, AdamW's own step count included) and counts steps from 0."""
    resumed, unbroken = runs["pl-from-gl-as-saved"], runs["gl-2"]
    assert resumed["global_step"] == STEPS_PER_EPOCH
    difference = _max_difference({**resumed, "global_step": unbroken["global_step"]}, unbroken, "as saved")
    assert difference == 0
