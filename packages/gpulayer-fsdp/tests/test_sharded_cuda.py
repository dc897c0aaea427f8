"""On two CUDA GPUs (nox -s cuda; skipped otherwise): a sharded checkpoint saved by FSDP2 on NCCL has Lightning's
file set, resumes bit-exactly on the same GPUs, and loads in one process on the CPU; an asynchronous save
(``async_save=True``: staged from the GPUs into CPU memory, written on a gloo group beside NCCL) writes what a
synchronous one writes. On one GPU (the GPU machines lent so far have one): a folder saved by gloo CPU ranks loads
exactly into one CUDA process.

Bit-exact on the GPUs: the resumed and the unbroken run launch the same kernels on the same devices in the same
order, and at these sizes (8 tokens: one key block in attention) no kernel should need atomics to reduce. A
difference here that the gloo tier does not show points at a kernel, not at the checkpoint."""

import os
from pathlib import Path

import pytest
import torch

from gpulayer.runtime.testing import run_ranks

from .conftest import packed, unpacked
from .test_async_sharded_save import _fit as _fit_saving_every_two_steps
from .test_async_sharded_save import assert_same_folders
from .test_sharded_checkpoints import _assert_state_equal, _fit

pytestmark = pytest.mark.cuda
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _two_gpus(runtime, folder: str) -> bytes:
    """Save after epoch 1, resume to epoch 3, and the unbroken run to epoch 3, all on NCCL."""
    folder, rank = Path(folder), runtime.global_rank
    first, _ = _fit(folder / "first", rank, 2, 1, save=str(folder / "gpus.ckpt"), accelerator="cuda")
    records = {"first": first, "files": sorted(os.listdir(folder / "gpus.ckpt"))}
    records["resumed"], _ = _fit(
        folder / "resumed", rank, 2, 3, accelerator="cuda", ckpt_path=str(folder / "gpus.ckpt")
    )
    records["unbroken"], _ = _fit(folder / "unbroken", rank, 2, 3, accelerator="cuda")
    return packed(records)


@two_gpus
def test_a_sharded_checkpoint_saved_on_nccl_resumes_exactly_on_the_gpus_and_in_one_cpu_process(tmp_path):
    records = unpacked(run_ranks(_two_gpus, str(tmp_path), accelerator="cuda", timeout=240))[0]
    assert records["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    _assert_state_equal(records["resumed"], records["unbroken"], atol=0, name="2 GPUs -> 2 GPUs")
    assert records["resumed"]["warnings"] == []
    on_cpu, _ = _fit(tmp_path / "cpu", 0, 1, 1, ckpt_path=str(tmp_path / "gpus.ckpt"))  # _fit's accelerator: "cpu"
    _assert_state_equal(on_cpu, records["first"], atol=0, name="2 GPUs -> 1 CPU process")
    assert len(on_cpu["warnings"]) == 1


def _two_gpus_saving_asynchronously(runtime, folder: str) -> None:
    for async_save in (False, True):
        kind = "asynchronous" if async_save else "synchronous"
        _fit_saving_every_two_steps(Path(folder) / kind, runtime.global_rank, async_save, accelerator="cuda")


@two_gpus
def test_an_asynchronous_save_on_nccl_writes_what_a_synchronous_one_writes(tmp_path):
    pytest.importorskip("gpulayer.callbacks")
    run_ranks(_two_gpus_saving_asynchronously, str(tmp_path / "runs"), accelerator="cuda", timeout=240)
    assert_same_folders(tmp_path / "runs", tmp_path)


def _two_cpu_ranks_saving(runtime, path: str) -> bytes:
    return packed(_fit(Path(path).parent / "saving", runtime.global_rank, 2, 1, save=path)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_sharded_checkpoint_saved_on_cpu_ranks_loads_exactly_on_one_gpu(tmp_path):
    """Saved by 2 gloo CPU ranks, read by DCP into one process's CUDA tensors (the machine may have one GPU)."""
    path = tmp_path / "cpu-ranks.ckpt"
    saved = unpacked(run_ranks(_two_cpu_ranks_saving, str(path), timeout=120))[0]
    on_gpu, _ = _fit(tmp_path / "gpu", 0, 1, 1, ckpt_path=str(path), accelerator="cuda")
    _assert_state_equal(on_gpu, saved, atol=0, name="2 CPU ranks -> 1 GPU")
    assert len(on_gpu["warnings"]) == 1
