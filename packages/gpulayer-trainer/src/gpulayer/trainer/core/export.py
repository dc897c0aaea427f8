"""``ExportMixin``: a ``Module``'s ``to_torchscript`` and ``to_onnx``, as Lightning's ``LightningModule`` has them."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from gpulayer.trainer.batch import map_tensors


class ExportMixin:
    """Export in eval mode, on a sample input (given, or the module's ``example_input_array``) moved to its device.
    Mixed into ``Module``, whose ``example_input_array`` and ``device`` it reads."""

    # True while ``to_torchscript`` compiles: TorchScript reads every attribute, ``trainer`` included, and a module
    # with no Trainer is scripted as in Lightning (its ``_jit_is_scripting``), ``trainer`` then being None.
    _jit_is_scripting = False

    def to_torchscript(
        self,
        file_path: str | os.PathLike | None = None,
        method: str = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> Any:
        """The module in eval mode as TorchScript, ``torch.jit.script``-ed or, with ``method="trace"``, traced on
        ``example_inputs`` (default: ``example_input_array``); saved to ``file_path`` when given (Lightning's).
        torch's deprecation of TorchScript (2.10 on) is warned once, here, not once per function and traced method."""
        if method not in ("script", "trace"):
            raise ValueError(f"to_torchscript(method={method!r}): accepted values are 'script' and 'trace'")
        training = self.training
        sample = self._export_sample(example_inputs, "to_torchscript") if method == "trace" else None
        with _torchs_deprecation_warned_once(), _scripting():
            if method == "script":
                scripted = torch.jit.script(self.eval(), **kwargs)
            else:
                scripted = torch.jit.trace(self.eval(), sample, **kwargs)
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


@contextlib.contextmanager
def _scripting() -> Iterator[None]:
    ExportMixin._jit_is_scripting = True
    try:
        yield
    finally:
        ExportMixin._jit_is_scripting = False


# torch's deprecation of TorchScript: a DeprecationWarning from torch 2.10, a FutureWarning from 2.14, whose words
# name the function ("`torch.jit.trace` is deprecated. Please switch to ...").
TORCHSCRIPT_DEPRECATION = re.compile(r"`torch\.jit\.\w+` is deprecated")


@contextlib.contextmanager
def _torchs_deprecation_warned_once() -> Iterator[None]:
    """torch's deprecation of TorchScript warned once, in its category and words, where ``to_torchscript`` was
    called; any other warning passes on as it came."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    deprecations = [warning for warning in caught if TORCHSCRIPT_DEPRECATION.match(str(warning.message))]
    for warning in caught:
        if warning not in deprecations:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if deprecations:
        warnings.warn(str(deprecations[0].message), deprecations[0].category, stacklevel=4)
