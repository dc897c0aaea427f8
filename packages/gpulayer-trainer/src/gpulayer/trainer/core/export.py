"""``ExportMixin``: a ``Module``'s ``to_torchscript`` and ``to_onnx``, as Lightning's ``LightningModule`` has them."""

from __future__ import annotations

import os
from typing import Any

import torch

from gpulayer.trainer.batch import map_tensors


class ExportMixin:
    """Export in eval mode, on a sample input (given, or the module's ``example_input_array``) moved to its device.
    Mixed into ``Module``, whose ``example_input_array`` and ``device`` it reads."""

    def to_torchscript(
        self,
        file_path: str | os.PathLike | None = None,
        method: str = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> Any:
        """The module in eval mode as TorchScript, ``torch.jit.script``-ed or, with ``method="trace"``, traced on
        ``example_inputs`` (default: ``example_input_array``); saved to ``file_path`` when given (Lightning's)."""
        training = self.training
        if method == "script":
            scripted = torch.jit.script(self.eval(), **kwargs)
        elif method == "trace":
            scripted = torch.jit.trace(self.eval(), self._export_sample(example_inputs, "to_torchscript"), **kwargs)
        else:
            raise ValueError(f"to_torchscript(method={method!r}): accepted values are 'script' and 'trace'")
        self.train(training)
        if file_path is not None:
            torch.jit.save(scripted, os.fspath(file_path))
        return scripted

    def to_onnx(self, file_path: str | os.PathLike, input_sample: Any = None, **kwargs: Any) -> None:
        """Export the module in eval mode with ``torch.onnx.export`` on ``input_sample`` (default:
        ``example_input_array``), as Lightning does; torch's exporter needs the ``onnx`` package."""
        training = self.training
        sample = self._export_sample(input_sample, "to_onnx")
        torch.onnx.export(self.eval(), sample, os.fspath(file_path), **kwargs)
        self.train(training)

    def _export_sample(self, given: Any, method: str) -> Any:
        sample = given if given is not None else self.example_input_array
        if sample is None:
            raise ValueError(f"{method}: pass a sample input or set the module's example_input_array")
        return map_tensors(sample, lambda tensor: tensor.to(self.device))
