"""``MetricLoggingMixin``: a ``Module``'s ``self.log`` and ``self.log_dict`` (Lightning's ``LightningModule.log``)."""

from __future__ import annotations

import numbers
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from gpulayer.trainer.exceptions import MisconfiguredRuntimeError, MisconfiguredValueError
from gpulayer.trainer.logging.results import Meta, ResultCollection, log_levels, reduction


class MetricLoggingMixin:
    """``self.log``: values kept on the device in the running loop's ``ResultCollection`` (``trainer._metric_hub``,
    the one place metrics live) and reduced by Lightning's rules. Mixed into ``Module``, whose ``_trainer``,
    ``_current_fx_name``, ``device`` and submodules it reads."""

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record ``value`` under ``name``; kept on the device and reduced at epoch end (Lightning's rules)."""
        trainer = self._trainer
        hub = None if trainer is None or trainer.args.barebones else trainer._metric_hub
        results = None if hub is None else hub.results
        if results is None or sync_dist_group is not None:
            self._refuse_log(name, sync_dist_group)
            return
        fx = self._current_fx_name
        # A call with an earlier one's arguments (every step's) goes to its Metric: checks and Meta depend on them.
        call = (
            fx,
            name,
            prog_bar,
            logger,
            on_step,
            on_epoch,
            reduce_fx,
            enable_graph,
            add_dataloader_idx,
            sync_dist,
            rank_zero_only,
            metric_attribute,
            results.dataloader_idx,
        )
        try:
            metric = results.by_call.get(call)
            hashable = True
        except TypeError:  # an unhashable argument: checked and looked up on every call
            metric, hashable = None, False
        if metric is None:  # a first call: its arguments are checked before its value
            levels = _checked_levels(fx, name, on_step, on_epoch, add_dataloader_idx)
        value = self._logged_value(name, value, enable_graph)  # a tensor, or a torchmetrics Metric
        torchmetric = not isinstance(value, torch.Tensor)
        if hub.should_reset_tensors(fx):
            results.reset(fx=fx)
        if metric is None:
            metric = self._new_metric(results, call, levels, value if torchmetric else None, hashable)
        if torchmetric:
            metric.update(value, 1)
        else:
            results.log(metric, value, batch_size)
        hub.current_fx = fx

    def _refuse_log(self, name: str, sync_dist_group: Any) -> None:
        """Why ``self.log`` records nothing: an error, or a warning when no Trainer, or a barebones one, listens."""
        if sync_dist_group is not None:
            raise ValueError(
                f"self.log({name!r}, ..., sync_dist_group={sync_dist_group!r}): GPUlayer reduces sync_dist values "
                "over every rank; pass sync_dist_group=None"
            )
        if self._trainer is None:
            warnings.warn(
                f"self.log({name!r}, ...) was called on a module not attached to a Trainer; nothing is recorded",
                UserWarning,
                stacklevel=3,
            )
        elif self._trainer.args.barebones:
            warnings.warn(
                f"self.log({name!r}, ...) records nothing under Trainer(barebones=True), which turns logging off",
                UserWarning,
                stacklevel=3,
            )
        else:
            raise MisconfiguredRuntimeError(
                f"self.log({name!r}, ...) is not supported in {self._current_fx_name or 'this hook'}"
            )

    def _new_metric(
        self, results: ResultCollection, call: tuple, levels: tuple[bool, bool], torchmetric: Any, hashable: bool
    ) -> Any:
        """The Metric a first ``self.log`` call (``call``, its key) records into, remembered for the next ones."""
        fx, name, prog_bar, logger, _, _, reduce_fx, enable_graph, add_idx, sync, rank_zero_only, attribute, idx = call
        if torchmetric is not None:
            attribute = self._attribute_of(name, torchmetric, attribute)
        logger = True if logger is None else logger
        sync = sync and not rank_zero_only
        meta = Meta(
            fx, name, prog_bar, logger, *levels, reduction(reduce_fx), enable_graph, add_idx, idx, sync, attribute
        )
        metric = results.metric(meta, torchmetric is not None)
        if hashable:
            results.by_call[call] = metric
        return metric

    def log_dict(
        self,
        dictionary: Mapping[str, Any],
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """``self.log`` for every key of ``dictionary`` (a ``torchmetrics.MetricCollection`` too: each of its
        metrics under its name), with the same options."""
        collection = _torchmetrics_class("MetricCollection")
        if collection is not None and isinstance(dictionary, collection):
            # Lightning's way: the names without the collection's prefix base, and no state copies for groups.
            items = dictionary.items(keep_base=False, copy_state=not dictionary._enable_compute_groups)
        else:
            items = dictionary.items()
        for name, value in items:
            self.log(
                name,
                value,
                prog_bar=prog_bar,
                logger=logger,
                on_step=on_step,
                on_epoch=on_epoch,
                reduce_fx=reduce_fx,
                enable_graph=enable_graph,
                sync_dist=sync_dist,
                sync_dist_group=sync_dist_group,
                add_dataloader_idx=add_dataloader_idx,
                batch_size=batch_size,
                rank_zero_only=rank_zero_only,
            )

    def _attach_logging(self, callbacks: list[Any]) -> None:
        """Each callback's ``self.log`` and ``self.log_dict`` become this module's, set at every entry point (Lightning
        2.6's ``_attach_model_logging_functions``): a callback logs under its running hook's name and defaults."""
        for callback in callbacks:
            callback.log = self.log
            callback.log_dict = self.log_dict

    def _forget_metric_attributes(self) -> None:
        """Drops the cache of Metric attribute names at teardown, as Lightning does: a Metric made in a later
        ``setup`` is found then."""
        self.__dict__["_metric_attributes"] = None

    def _attribute_of(self, name: str, metric: Any, given: str | None) -> str:
        """Lightning's ``metric_attribute``: the name under which the logged Metric is an attribute of the module."""
        if given is not None:
            return given
        metric_class = _torchmetrics_class("Metric")
        attributes = self.__dict__.get("_metric_attributes")
        if attributes is None:  # looked up once, as Lightning does
            attributes = {id(m): n for n, m in self.named_modules() if isinstance(m, metric_class)}
            self.__dict__["_metric_attributes"] = attributes
        found = attributes.get(id(metric))
        if found is None:
            known = sorted(attributes.values())
            raise MisconfiguredValueError(
                f"self.log({name!r}, <{type(metric).__name__}>): the metric is not an attribute of "
                f"{type(self).__name__}" + (f" (its metrics: {known})" if known else "") + "; set it as one in "
                "__init__ (self.accuracy = Accuracy(...)), or pass metric_attribute= naming the attribute"
            )
        return found

    def _logged_value(self, name: str, value: Any, enable_graph: bool) -> Any:
        """What ``self.log`` keeps of ``value``: a float tensor on the device, or a ``torchmetrics.Metric`` itself."""
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"self.log({name!r}, ...): the tensor must hold exactly one element, not {value.numel()}"
                )
            tensor = value if enable_graph else value.detach()
            if tensor.dim():
                tensor = tensor.squeeze()
            dtype = tensor.dtype
            if not dtype.is_floating_point:
                warnings.warn(
                    f"self.log({name!r}, ...) in {self._current_fx_name}: the value is not floating point; it is "
                    "converted to reduce it",
                    UserWarning,
                    stacklevel=3,
                )
            if dtype not in (torch.float32, torch.float64):
                tensor = tensor.to(_metric_dtype())
            return tensor
        if isinstance(value, numbers.Number) and not isinstance(value, complex):  # a bool too: True logs 1.0
            return torch.full((), value, device=self.device, dtype=_metric_dtype())  # a fill: no copy to the GPU
        metric_class, collection_class = _torchmetrics_class("Metric"), _torchmetrics_class("MetricCollection")
        if metric_class is not None and isinstance(value, metric_class):
            return value
        if collection_class is not None and isinstance(value, collection_class):
            raise ValueError(f"self.log({name!r}, <MetricCollection>): log a MetricCollection with self.log_dict")
        raise ValueError(
            f"self.log({name!r}, {value!r}): accepted values are a Python number, a one-element tensor or a "
            f"torchmetrics.Metric (got {type(value).__name__})"
        )


def _checked_levels(
    fx: str | None, name: str, on_step: bool | None, on_epoch: bool | None, add_dataloader_idx: bool
) -> tuple[bool, bool]:
    """``on_step`` and ``on_epoch`` of a first ``self.log`` call, and its name, checked for the running hook."""
    levels = log_levels(fx, on_step, on_epoch)
    if add_dataloader_idx and "/dataloader_idx_" in name:
        raise MisconfiguredValueError(
            f"self.log({name!r}, ...): the name must not contain '/dataloader_idx_' when add_dataloader_idx=True"
        )
    return levels


def _metric_dtype() -> torch.dtype:
    dtype = torch.get_default_dtype()
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _torchmetrics_class(name: str) -> type | None:
    """``torchmetrics.<name>`` when torchmetrics is imported (a value of its classes cannot exist otherwise, and
    gpulayer-trainer does not depend on it)."""
    torchmetrics = sys.modules.get("torchmetrics")
    return getattr(torchmetrics, name, None) if torchmetrics is not None else None
