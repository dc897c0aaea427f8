"""``Trainer(prefetch=True)``: load the next batches in a background thread while this one trains.

The first batch of each epoch is fetched in the calling thread, at the moment the loop asks for it, so a
shuffling sampler draws its seed from the global RNG exactly when it would without prefetching; later
batches come from the thread, which loads them with one intra-op thread, as a DataLoader worker does. On
CUDA (when the transfer hooks are not overridden) the thread also pins each batch and copies it to the GPU
on a side stream. Datasets that draw from the global RNG in the main process (``num_workers=0`` with random
augmentation) would race with the training step: give them their own generator, or workers.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

from gpulayer.trainer.batch import map_tensors

_END = object()
_DEPTH = 2


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetch(iterator: Iterator[Any], device: torch.device | None) -> Iterator[Any]:
    """Yield ``iterator``'s batches, loaded ahead by a thread; ``device`` (CUDA) also moves them there."""
    try:
        first = next(iterator)
    except StopIteration:
        return
    ready: queue.Queue = queue.Queue(maxsize=_DEPTH)
    stop = threading.Event()
    thread = threading.Thread(target=_fill, args=(iterator, ready, stop, device), daemon=True, name="gpulayer-prefetch")
    thread.start()
    try:
        yield first
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.error
            batch, event = item
            if event is not None:
                _wait_on_main_stream(batch, event, device)
            yield batch
    finally:
        stop.set()
        while thread.is_alive():
            try:
                ready.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)


def _wait_on_main_stream(batch: Any, event: torch.cuda.Event, device: torch.device | None) -> None:
    """Order the copy before this stream's use, and keep the allocator from reusing the memory too early."""
    stream = torch.cuda.current_stream(device)
    stream.wait_event(event)
    map_tensors(batch, lambda t: t.record_stream(stream))


def _fill(iterator: Iterator[Any], ready: queue.Queue, stop: threading.Event, device: torch.device | None) -> None:
    stream = torch.cuda.Stream(device) if device is not None else None
    # One intra-op thread here, as in a DataLoader worker: with the main thread's count (16 on a 16-core machine) the
    # many small ops of a sample ran 1.8 x slower in this thread, and prefetching lost time. The count is per thread;
    # torch also keeps it as the default of threads started later, which gets the caller's count back at the end.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for batch in iterator:
            event = None
            if stream is not None:
                with torch.cuda.stream(stream):
                    batch = map_tensors(batch, lambda t: _pinned(t).to(device, non_blocking=True))
                    event = torch.cuda.Event()
                    event.record(stream)
            if not _put(ready, stop, (batch, event)):
                return
        _put(ready, stop, _END)
    except BaseException as error:
        _put(ready, stop, _Failure(error))
    finally:
        torch.set_num_threads(threads)


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor in page-locked memory, so that its copy can overlap; a tensor already on a GPU as it is."""
    return tensor.pin_memory() if tensor.device.type == "cpu" else tensor


def _put(ready: queue.Queue, stop: threading.Event, item: Any) -> bool:
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
