"""The private torch and torchmetrics APIs gpulayer-trainer relies on, one test each (ARCHITECTURE.md lists them).

Each test exercises the API on small real objects (a DDP on a one-rank gloo group, a DataLoader with one worker, a
torchmetrics Metric, a module ``torch.compile`` returned, a DCP folder written by one process) in the way GPUlayer
uses it. When a torch or torchmetrics release changes one, its test fails naming the API and the module of GPUlayer
to update.
"""

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from gpulayer.runtime.testing import is_alive

TORCH = f"torch {torch.__version__}"


@contextlib.contextmanager
def relied_on(library: str, api: str, user: str, purpose: str) -> Iterator[None]:
    """Any failure inside becomes one that names ``api``, the GPUlayer module that relies on it, and what for."""
    try:
        yield
    except Exception as error:
        pytest.fail(
            f"{library} no longer has {api} as GPUlayer relies on it, which gpulayer/trainer/{user} uses to "
            f"{purpose} ({type(error).__name__}: {error}); update {user} and ARCHITECTURE.md's table of private APIs"
        )


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _counted_ddp(module: torch.nn.Module, **options) -> tuple[DistributedDataParallel, list]:
    """``module`` in DDP, with a communication hook (public API) that counts the gradient reductions."""
    ddp, reductions = DistributedDataParallel(module, **options), []

    def count(state, bucket):
        reductions.append(bucket.index())
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    ddp.register_comm_hook(None, count)
    return ddp, reductions


# ---- ddp.py: manual optimization under DDP (Lightning's DDPStrategy.pre_backward and _DDPForwardRedirection) ----
def test_find_tensors():
    api = "torch.nn.parallel.distributed._find_tensors"
    with relied_on(
        TORCH, api, "strategies/ddp.py", "find the tensors of a manual_backward loss (find_unused_parameters=True)"
    ):
        from torch.nn.parallel.distributed import _find_tensors

        a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
        found = list(_find_tensors({"loss": a, "parts": [b, (c, "not a tensor")]}))
        assert [id(t) for t in found] == [id(a), id(b), id(c)], found
        assert [id(t) for t in _find_tensors(a)] == [id(a)]


def test_reducer_rebuild_buckets(one_rank_group):
    api = "DistributedDataParallel.reducer._rebuild_buckets"
    with relied_on(
        TORCH, api, "strategies/ddp.py", "let DDP rebuild its buckets before a manual_backward, as its forward does"
    ):
        ddp = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)))
        assert ddp.reducer._rebuild_buckets() is False  # nothing to rebuild from before a backward
        ddp(torch.ones(3, 2)).sum().backward()
        # After the first backward the buckets are rebuilt once, in the order the gradients came.
        assert [ddp.reducer._rebuild_buckets(), ddp.reducer._rebuild_buckets()] == [True, False]


def test_reducer_prepare_for_backward(one_rank_group):
    api = "DistributedDataParallel.reducer.prepare_for_backward"
    with relied_on(TORCH, api, "strategies/ddp.py", "ready DDP's reducer for each manual_backward of a step"):
        module = torch.nn.Linear(2, 1)
        ddp, reductions = _counted_ddp(module)
        x = torch.ones(3, 2)
        ddp(x).sum().backward()
        module(x).sum().backward()  # a second backward of the same step: DDP's forward readied nothing for it
        assert len(reductions) == 1
        ddp.reducer.prepare_for_backward([])
        module(x).sum().backward()
        assert len(reductions) == 2, "the backward after prepare_for_backward did not reduce the gradients"


def test_require_backward_grad_sync(one_rank_group):
    api = "DistributedDataParallel.require_backward_grad_sync"
    with relied_on(
        TORCH, api, "strategies/ddp.py", "stop DDP's forward readying a backward that a manual step already ran"
    ):
        ddp, reductions = _counted_ddp(torch.nn.Linear(2, 1))
        assert ddp.require_backward_grad_sync is True
        ddp.require_backward_grad_sync = False
        ddp(torch.ones(3, 2)).sum().backward()
        assert reductions == [], "a backward after a forward with require_backward_grad_sync=False reduced"
        ddp.require_backward_grad_sync = True
        ddp(torch.ones(3, 2)).sum().backward()
        assert len(reductions) == 1


def test_require_forward_param_sync(one_rank_group):
    api = "DistributedDataParallel.require_forward_param_sync"
    with relied_on(TORCH, api, "strategies/ddp.py", "have DDP's next forward sync the buffers after a manual_backward"):
        ddp = DistributedDataParallel(torch.nn.BatchNorm1d(2))  # a module with buffers
        assert ddp.require_forward_param_sync is True and ddp.will_sync_module_buffers()
        ddp.require_forward_param_sync = False
        assert not ddp.will_sync_module_buffers()
        ddp.require_forward_param_sync = True
        assert ddp.will_sync_module_buffers()


# ---- data.py: a stage's end stops persistent workers (Lightning's _shutdown_workers_and_reset_iterator) ----------
class _WorkerPids(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        return os.getpid()


def _persistent_loader() -> DataLoader:
    return DataLoader(_WorkerPids(), batch_size=2, num_workers=1, persistent_workers=True)


def test_dataloader_iterator():
    with relied_on(
        TORCH, "DataLoader._iterator", "data/data.py", "find, and drop, the iterator that holds the workers"
    ):
        loader = _persistent_loader()
        assert loader._iterator is None
        iterator = iter(loader)
        assert loader._iterator is iterator and iter(loader) is iterator  # kept across epochs
        loader._iterator = None
        assert iter(loader) is not iterator  # the next epoch starts a new one


def test_multiprocessing_dataloader_iter():
    api = "torch.utils.data.dataloader._MultiProcessingDataLoaderIter"
    with relied_on(TORCH, api, "data/data.py", "tell an iterator with worker processes from one without"):
        from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

        assert isinstance(iter(_persistent_loader()), _MultiProcessingDataLoaderIter)
        assert not isinstance(iter(DataLoader(_WorkerPids())), _MultiProcessingDataLoaderIter)


def test_shutdown_workers():
    api = "_MultiProcessingDataLoaderIter._shutdown_workers"
    with relied_on(TORCH, api, "data/data.py", "stop a DataLoader's persistent workers at a stage's end"):
        iterator = iter(_persistent_loader())
        pid = int(next(iterator)[0])
        assert pid != os.getpid() and is_alive(pid)
        iterator._shutdown_workers()
        assert not is_alive(pid), "the worker still runs after _shutdown_workers()"


# ---- results.py and metric_logging.py: logging torchmetrics objects (Lightning's _ResultMetric and log_dict) ---------------
def test_metric_forward_cache():
    torchmetrics = pytest.importorskip("torchmetrics")
    library = f"torchmetrics {torchmetrics.__version__}"
    with relied_on(
        library, "Metric._forward_cache", "logging/results.py", "read a logged Metric's value for the batch"
    ):
        metric = torchmetrics.MeanMetric()
        assert metric._forward_cache is None
        metric(torch.tensor([1.0, 3.0]))
        value = metric(torch.tensor([5.0]))
        assert metric._forward_cache is value and value.item() == 5.0 and metric.compute().item() == 3.0


def test_metric_collection_enable_compute_groups():
    torchmetrics = pytest.importorskip("torchmetrics")
    library = f"torchmetrics {torchmetrics.__version__}"
    api = "MetricCollection._enable_compute_groups"
    with relied_on(library, api, "core/metric_logging.py", "decide whether log_dict copies each metric's state"):
        metrics = [torchmetrics.MeanMetric(), torchmetrics.SumMetric()]
        assert torchmetrics.MetricCollection(metrics)._enable_compute_groups is True  # the default
        assert torchmetrics.MetricCollection(metrics, compute_groups=False)._enable_compute_groups is False


# ---- compiled.py: a module torch.compile returned, handed to an entry point (Lightning's from_compiled) -------------
def test_optimized_module():
    api = "torch._dynamo.OptimizedModule"
    with relied_on(TORCH, api, "compiled.py", "recognise what torch.compile returns for a module"):
        compiled = torch.compile(torch.nn.Linear(2, 1), backend="eager")
        assert isinstance(compiled, sys.modules["torch._dynamo"].OptimizedModule)
        assert not isinstance(torch.nn.Linear(2, 1), sys.modules["torch._dynamo"].OptimizedModule)


def test_orig_mod():
    with relied_on(TORCH, "OptimizedModule._orig_mod", "compiled.py", "train the module torch.compile wrapped"):
        module = torch.nn.Linear(2, 1)
        assert torch.compile(module, backend="eager")._orig_mod is module


def test_dynamo_ctx():
    api = "OptimizedModule.dynamo_ctx"
    with relied_on(TORCH, api, "compiled.py", "compile the module's own forward with the user's torch.compile options"):
        graphs = []

        def backend(graph, example_inputs):  # a custom backend (public API) that records what it compiles
            graphs.append(graph)
            return graph.forward

        module, x = torch.nn.Linear(2, 1), torch.ones(1, 2)
        forward = torch.compile(module, backend=backend).dynamo_ctx(module.forward)
        assert torch.equal(forward(x), module(x)) and len(graphs) == 1


# A small DCP folder in Lightning's FSDP layout, as one process writes it.
SAVED = {
    "model": {"net.weight": torch.arange(6.0).reshape(2, 3)},
    "optimizer_0": {"state": {"net.weight": {"step": torch.tensor(2.0)}}, "param_groups": [{"params": ["net.weight"]}]},
}


def _read_whole(folder: Path) -> dict:
    """``sharded.load_whole``'s reading: every key of the folder into this process, no process group."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    whole: dict = {}
    _load_state_dict(whole, storage_reader=FileSystemReader(folder), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return whole


@pytest.fixture
def dcp_folder(tmp_path) -> Path:
    with pytest.warns(UserWarning, match="single process"):  # no process group: DCP saves as one process
        dcp.save(SAVED, checkpoint_id=tmp_path)
    return tmp_path


# ---- checkpoint/sharded.py: a sharded checkpoint folder read into one process (Lightning's _load_distributed_checkpoint) ----
def test_load_state_dict(dcp_folder):
    api = "torch.distributed.checkpoint.state_dict_loader._load_state_dict(..., no_dist=True)"
    with relied_on(
        TORCH, api, "checkpoint/sharded.py", "read a sharded checkpoint into one process without a process group"
    ):
        whole = _read_whole(dcp_folder)
        assert torch.equal(whole["model"]["net.weight"], SAVED["model"]["net.weight"])


def test_empty_state_dict_load_planner(dcp_folder):
    api = "torch.distributed.checkpoint.format_utils._EmptyStateDictLoadPlanner"
    with relied_on(TORCH, api, "checkpoint/sharded.py", "rebuild a checkpoint's nested dicts from its metadata alone"):
        whole = _read_whole(dcp_folder)
        assert whole.keys() == SAVED.keys()
        assert whole["optimizer_0"]["param_groups"] == [{"params": ["net.weight"]}]
        assert torch.equal(whole["optimizer_0"]["state"]["net.weight"]["step"], torch.tensor(2.0))
