"""``ModelPruning``: prune a module's weights with ``torch.nn.utils.prune`` at epoch ends, with Lightning 2.6's
arguments, schedule, log lines and checkpoint (``lightning/pytorch/callbacks/pruning.py``)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from functools import partial
from typing import Any

import torch.nn.utils.prune as torch_prune
from torch import Tensor, nn

from gpulayer.trainer import Callback, Module, rank_zero_only
from gpulayer.trainer.core.lightning_classes import lightning_class
from gpulayer.trainer.exceptions import MisconfiguredTypeError, MisconfiguredValueError

log = logging.getLogger(__name__)

# The names Lightning accepts for `pruning_fn`: the function prunes one parameter, the class (a
# BasePruningMethod) is what `global_unstructured` takes.
_FUNCTIONS = {
    "ln_structured": torch_prune.ln_structured,
    "l1_unstructured": torch_prune.l1_unstructured,
    "random_structured": torch_prune.random_structured,
    "random_unstructured": torch_prune.random_unstructured,
}
_METHODS = {
    "ln_structured": torch_prune.LnStructured,
    "l1_unstructured": torch_prune.L1Unstructured,
    "random_structured": torch_prune.RandomStructured,
    "random_unstructured": torch_prune.RandomUnstructured,
}
_CONTAINERS = (Module, nn.Sequential, nn.ModuleList, nn.ModuleDict)

ParameterList = Sequence[tuple[nn.Module, str]]


class ModelPruning(Callback):
    """Prune ``parameters_to_prune`` (default: every ``weight`` and ``bias`` of the module's leaf layers) at the
    end of each training epoch, or of each validation run with ``prune_on_train_epoch_end=False``.

    ``pruning_fn`` is one of ``"l1_unstructured"``, ``"random_unstructured"``, ``"ln_structured"`` (needs
    ``pruning_dim`` and ``pruning_norm``), ``"random_structured"`` (needs ``pruning_dim``), or a
    ``BasePruningMethod`` subclass (global pruning only). ``amount`` (a fraction, a count, or a function of the
    epoch) and ``apply_pruning`` (a bool or a function of the epoch) say how much and when; 0 prunes nothing.
    ``use_lottery_ticket_hypothesis`` resets the weights left to their values at ``setup`` (or new ones with
    ``resample_parameters``). ``make_pruning_permanent`` folds the masks into the weights at the end of training,
    and writes checkpoints with the masks applied (plain ``weight`` keys) while training keeps its masks.
    ``verbose`` logs the sparsity after each pruning (1: overall, 2: per parameter too) on rank 0.
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable | str,
        parameters_to_prune: ParameterList = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: int | float | Callable[[int], int | float] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune = parameters_to_prune
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._global_kwargs: dict[str, Any] = {}
        # Per pruned layer: a copy taken at setup, and the (index in parameters_to_prune, name) pairs it holds.
        self._original_layers: dict[int, tuple[nn.Module, list[tuple[int, str]]]] | None = None
        self._pruning_method_name: str | None = None

        # Lightning's checks, order and messages; each raises a MisconfigurationException.
        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise MisconfiguredValueError(
                    f"The provided `parameter_names` name: {name} isn't in {self.PARAMETER_NAMES}"
                )
        if isinstance(pruning_fn, str):
            pruning_fn = self._resolve_name(pruning_fn.lower(), pruning_dim, pruning_norm)
        elif self._is_pruning_method(pruning_fn):
            if not use_global_unstructured:
                raise MisconfiguredValueError(
                    "PyTorch `BasePruningMethod` is currently only supported with `use_global_unstructured=True`."
                )
        else:
            raise MisconfiguredTypeError(
                f"`pruning_fn` is expected to be a str in {list(_FUNCTIONS)}"
                f" or a PyTorch `BasePruningMethod`. Found: {pruning_fn}."
                " HINT: if passing a `BasePruningMethod`, pass the class, not an instance"
            )
        if use_global_unstructured and pruning_fn.PRUNING_TYPE != "unstructured":  # type: ignore[union-attr]
            raise MisconfiguredValueError(
                'Only the "unstructured" PRUNING_TYPE is supported with `use_global_unstructured=True`.'
                f" Found method {pruning_fn} of type {pruning_fn.PRUNING_TYPE}. "  # type: ignore[union-attr]
            )
        self.pruning_fn = pruning_fn
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        if not (isinstance(amount, (int, float)) or callable(amount)):
            raise MisconfiguredTypeError(
                "`amount` should be provided and be either an int, a float or Callable function."
            )
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise MisconfiguredValueError("`verbose` must be any of (0, 1, 2)")
        self._verbose = verbose

    def _resolve_name(self, name: str, dim: int | None, norm: int | None) -> Callable:
        """The function (local pruning, its keyword arguments bound) or class (global pruning) named ``name``."""
        if name not in _FUNCTIONS:
            raise MisconfiguredValueError(
                f"The provided `pruning_fn` {name} isn't available in PyTorch's built-in functions: {list(_FUNCTIONS)} "
            )
        kwargs: dict[str, Any] = {}
        if name.endswith("_structured"):
            if dim is None:
                raise MisconfiguredValueError(
                    "When requesting `structured` pruning, the `pruning_dim` should be provided."
                )
            if name == "ln_structured":
                if norm is None:
                    raise MisconfiguredValueError(
                        "When requesting `ln_structured` pruning, the `pruning_norm` should be provided."
                    )
                kwargs["n"] = norm
            kwargs["dim"] = dim
        # The name is kept now for the log lines: a partial has none.
        if self._use_global_unstructured:
            self._global_kwargs = kwargs
            self._pruning_method_name = _METHODS[name].__name__
            return _METHODS[name]
        self._pruning_method_name = _FUNCTIONS[name].__name__
        return partial(_FUNCTIONS[name], **kwargs)

    def filter_parameters_to_prune(self, parameters_to_prune: ParameterList = ()) -> ParameterList:
        """Override to choose which of the sanitized ``(module, name)`` pairs are pruned."""
        return parameters_to_prune

    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Folds each pruned parameter's mask into it and removes the pruning hooks, buffers and ``_orig``."""
        for _, layer in module.named_modules():
            for key, hook in list(layer._forward_pre_hooks.items()):
                if isinstance(hook, torch_prune.BasePruningMethod):
                    hook.remove(layer)
                    del layer._forward_pre_hooks[key]

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Resets the weights pruning left to their values at ``setup`` (step 4 of the lottery ticket algorithm,
        https://arxiv.org/abs/1803.03635), or to freshly sampled ones with ``resample_parameters``."""
        assert self._original_layers is not None
        for original, names in self._original_layers.values():
            source = original
            if self._resample_parameters and callable(getattr(original, "reset_parameters", None)):
                source = deepcopy(original)  # the copy from setup stays as it was
                source.reset_parameters()
            for index, name in names:
                layer, _ = self._parameters_to_prune[index]
                _copy_parameter(layer, source, name)

    def apply_pruning(self, amount: int | float) -> None:
        """Prunes ``amount`` of ``parameters_to_prune`` (together when global, else each alone)."""
        before = [_pruned_stats(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            self._global_kwargs["amount"] = amount
            accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}
            kwargs = {key: value for key, value in self._global_kwargs.items() if key in accepted}
            torch_prune.global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn, **kwargs)
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount)
        if self._verbose:
            after = [_pruned_stats(m, n) for m, n in self._parameters_to_prune]
            self._log_sparsity_stats(before, after, amount=amount)

    @rank_zero_only
    def _log_sparsity_stats(
        self, prev: list[tuple[int, int]], curr: list[tuple[int, int]], amount: int | float = 0
    ) -> None:
        total = sum(size for _, size in curr)
        zeros_before = sum(zeros for zeros, _ in prev)
        zeros_after = sum(zeros for zeros, _ in curr)
        log.info(
            f"Applied `{self._pruning_method_name}`. Pruned:"
            f" {zeros_before}/{total} ({zeros_before / total:.2%}) ->"
            f" {zeros_after}/{total} ({zeros_after / total:.2%})"
        )
        if self._verbose == 2:
            for (module, name), (zeros_was, size_was), (zeros_now, size_now) in zip(
                self._parameters_to_prune, prev, curr, strict=True
            ):
                log.info(
                    f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned:"
                    f" {zeros_was} ({zeros_was / size_was:.2%}) -> {zeros_now} ({zeros_now / size_now:.2%})"
                )

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        sanitized = self.sanitize_parameters_to_prune(
            pl_module, self._parameters_to_prune, parameter_names=self._parameter_names
        )
        self._parameters_to_prune = self.filter_parameters_to_prune(sanitized)
        if self._use_lottery_ticket_hypothesis:
            # One copy per layer, however many of its parameters are pruned.
            self._original_layers = {}
            for index, (module, name) in enumerate(self._parameters_to_prune):
                entry = self._original_layers.setdefault(id(module), (deepcopy(module), []))
                entry[1].append((index, name))

    def _run_pruning(self, current_epoch: int) -> None:
        prune = self._apply_pruning(current_epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(current_epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(current_epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # Lightning's rule: any validation run but the sanity check, trainer.validate(...) included.
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(pl_module)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """With ``make_pruning_permanent``, the checkpoint's weights have their masks applied, on the CPU, under
        their plain names; the module keeps its masks, so training goes on as it was."""
        if not self._make_pruning_permanent:
            return
        state = pl_module.state_dict()
        for mask_key in [key for key in state if key.endswith("_mask")]:
            name = mask_key.replace("_mask", "")
            original = state.pop(name + "_orig")
            mask = state.pop(name + "_mask")
            state[name] = mask.to(dtype=original.dtype) * original
        checkpoint["state_dict"] = {
            key: value.cpu() if isinstance(value, Tensor) else value for key, value in state.items()
        }

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: nn.Module, parameters_to_prune: ParameterList = (), parameter_names: Sequence[str] = ()
    ) -> ParameterList:
        """``parameters_to_prune`` checked against the module's leaf layers, or, when empty, every parameter named
        in ``parameter_names`` of those layers (names first, then layers, as Lightning orders them)."""
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        layers = [m for m in pl_module.modules() if not _is_container(m)]
        if not parameters_to_prune:
            return [(m, p) for p in names for m in layers if isinstance(getattr(m, p, None), nn.Parameter)]
        if not (
            isinstance(parameters_to_prune, (list, tuple))
            and all(len(pair) == 2 for pair in parameters_to_prune)
            and all(isinstance(m, nn.Module) and isinstance(p, str) for m, p in parameters_to_prune)
        ):
            raise MisconfiguredTypeError(
                "The provided `parameters_to_prune` should either be list of tuple"
                " with 2 elements: (nn.Module, parameter_name_to_prune) or None"
            )
        missing_modules = [m for m, _ in parameters_to_prune if m not in layers]
        missing_parameters = [p for m, p in parameters_to_prune if m in layers and not hasattr(m, p)]
        if missing_modules or missing_parameters:
            raise MisconfiguredValueError(
                "Some provided `parameters_to_prune` don't exist in the model."
                f" Found missing modules: {missing_modules} and missing parameters: {missing_parameters}"
            )
        return parameters_to_prune

    @staticmethod
    def _is_pruning_method(method: Any) -> bool:
        return inspect.isclass(method) and issubclass(method, torch_prune.BasePruningMethod)


def _is_container(module: nn.Module) -> bool:
    """Lightning skips containers, its LightningModule among them (GPUlayer's ``Module`` here, or Lightning's)."""
    return (
        isinstance(module, _CONTAINERS) or lightning_class(type(module), "LightningModule", "core.module") is not None
    )


def _copy_parameter(layer: nn.Module, source: nn.Module, name: str) -> None:
    """``source``'s ``name`` into ``layer``'s (its ``_orig`` where pruned), on ``layer``'s device."""
    target = getattr(layer, name + "_orig") if hasattr(layer, name + "_orig") else getattr(layer, name)
    value = getattr(source, name)
    if isinstance(target, Tensor) and isinstance(value, Tensor):
        target.data = value.data.to(target.device)


def _pruned_stats(module: nn.Module, name: str) -> tuple[int, int]:
    """(zeros in the mask, its size) of ``module``'s ``name``; (0, 1) when not pruned yet."""
    mask = getattr(module, f"{name}_mask", None)
    if mask is None:
        return 0, 1
    return int((mask == 0).sum().item()), mask.numel()
