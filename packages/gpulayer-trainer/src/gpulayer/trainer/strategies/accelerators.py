"""``trainer.accelerator``: what kind of device the Trainer trains on, with Lightning 2.6's classes and the methods
scripts call on them (``lightning/pytorch/accelerators/``): ``CPUAccelerator`` and ``CUDAAccelerator``."""

from __future__ import annotations

from typing import Any

import torch


class Accelerator:
    """The device kind: placement itself is the runtime's (``gpulayer.runtime.Placement``)."""

    def setup_device(self, device: torch.device) -> None:
        """Nothing to prepare: the runtime has chosen and selected the device."""

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        raise NotImplementedError

    def teardown(self) -> None:
        pass


class CPUAccelerator(Accelerator):
    @staticmethod
    def name() -> str:
        return "cpu"

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 1

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """The process's CPU and memory use, as Lightning reports them (needs ``psutil``)."""
        try:
            import psutil
        except ModuleNotFoundError:
            raise ModuleNotFoundError("CPUAccelerator.get_device_stats needs psutil: pip install psutil") from None

        return {
            "cpu_vm_percent": psutil.virtual_memory().percent,
            "cpu_percent": psutil.cpu_percent(),
            "cpu_swap_percent": psutil.swap_memory().percent,
        }


class CUDAAccelerator(Accelerator):
    @staticmethod
    def name() -> str:
        return "cuda"

    @staticmethod
    def is_available() -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def auto_device_count() -> int:
        return torch.cuda.device_count()

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """``torch.cuda.memory_stats(device)``, as Lightning reports them."""
        return torch.cuda.memory_stats(device)


def accelerator_for(device: torch.device) -> Accelerator:
    return CUDAAccelerator() if device.type == "cuda" else CPUAccelerator()
