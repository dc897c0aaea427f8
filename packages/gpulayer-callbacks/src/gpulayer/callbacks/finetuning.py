"""``BaseFinetuning`` and ``BackboneFinetuning``: freeze parts of a module before training and unfreeze them into new
optimizer param groups as epochs start, with Lightning 2.6's rules and checkpoint state
(Lightning 2.6 (lightning/pytorch/callbacks/finetuning.py)).

Everything here runs at setup, at fit start and once per epoch: nothing is added to a training step.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.nn import ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from gpulayer.trainer import Callback, MisconfigurationException, Module, rank_zero_only

log = logging.getLogger(__name__)

Modules = torch.nn.Module | Iterable[Any]  # a module, or an iterable of modules and of such iterables


def multiplicative(epoch: int) -> float:
    """``BackboneFinetuning``'s default ``lambda_func``: the backbone's learning rate doubles every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Subclass it and override ``freeze_before_training(pl_module)``, called at every ``setup`` (before
    ``configure_optimizers``, so the optimizer can skip frozen parameters), and ``finetune_function(pl_module,
    epoch, optimizer)``, called for each optimizer at every train epoch start to unfreeze parameters into a new
    param group (``unfreeze_and_add_param_group``).

    The groups added are kept in ``state_dict()["internal_optimizer_metadata"]`` by parameter name; a resumed fit
    rebuilds them in ``on_fit_start``, before the checkpoint's optimizer state is loaded into them.
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restarting = True
        # Checkpoints from before Lightning 1.6 hold the metadata itself, without the key.
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata", state_dict)

    def on_fit_start(self, trainer: Any, pl_module: Module) -> None:
        """On a resume, give each optimizer the param groups it had when saved (the checkpoint's optimizer state,
        loaded after this hook, then fills them), and make the parameters of the groups added since
        ``configure_optimizers`` trainable again."""
        if not self._restarting:
            return
        if self._internal_optimizer_metadata:
            named_parameters = dict(pl_module.named_parameters())
            for opt_idx, optimizer in enumerate(trainer.optimizers):
                if opt_idx in self._internal_optimizer_metadata:
                    configured = len(optimizer.param_groups)
                    groups = self._internal_optimizer_metadata[opt_idx]
                    optimizer.param_groups = self._apply_mapping_to_param_groups(groups, named_parameters)
                    _unfreeze_added_groups(pl_module, optimizer.param_groups[configured:])
        self._restarting = False

    @staticmethod
    def flatten_modules(modules: Modules) -> list[torch.nn.Module]:
        """The leaf modules of ``modules``, and the parents that hold parameters of their own."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):  # a Sequential or ModuleList too: each child is flattened
            found: Iterable[torch.nn.Module] = [m for each in modules for m in BaseFinetuning.flatten_modules(each)]
        else:
            found = modules.modules()
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Iterator[torch.Tensor]:
        """Yields the parameters of ``modules`` whose ``requires_grad`` is ``requires_grad``; batch norms' only
        with ``train_bn``."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):  # a parent's children are in the list already
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreezes the parameters of ``modules``; their batch norms track running stats again."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: torch.nn.Module) -> None:
        """Freezes ``module``'s own parameters; a batch norm stops tracking running stats."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freezes the parameters of ``modules``; with ``train_bn`` their batch norms stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """``params`` less those already in one of ``optimizer``'s param groups, with Lightning's warning when any
        are dropped. As Lightning's, a parameter counts as present when one in the optimizer has equal values."""
        kept, removed = [], []
        for param in params:
            present = any(torch.equal(p, param) for group in optimizer.param_groups for p in group["params"])
            (removed if present else kept).append(param)
        if removed and rank_zero_only.rank == 0:
            warnings.warn(
                "The provided params to be frozen already exist within another group of this optimizer."
                " Those parameters will be skipped.\n"
                "HINT: Did you init your optimizer in `configure_optimizer` as such:\n"
                f" {type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) ",
                UserWarning,
                stacklevel=2,
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreezes ``modules`` and adds their parameters not yet in ``optimizer`` as a new param group, at
        ``lr``, or else at the first group's learning rate divided by ``initial_denom_lr``. With ``train_bn=False``
        batch norms are unfrozen but left out of the group."""
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True)
        params = BaseFinetuning.filter_on_optimizer(optimizer, params)
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    def setup(self, trainer: Any, pl_module: Module, stage: str) -> None:
        self.freeze_before_training(pl_module)

    @staticmethod
    def _apply_mapping_to_param_groups(groups: list[dict[str, Any]], mapping: dict[Any, Any]) -> list[dict[str, Any]]:
        """Copies of ``groups`` with each of their params replaced by ``mapping[param]`` (a name, or back)."""
        return [
            {**{k: v for k, v in group.items() if k != "params"}, "params": [mapping[p] for p in group["params"]]}
            for group in groups
        ]

    def _store(self, pl_module: Module, opt_idx: int, num_param_groups: int, groups: list[dict[str, Any]]) -> None:
        """Record optimizer ``opt_idx``'s groups by parameter name: all of them the first time, then those added
        since it had ``num_param_groups``."""
        names = {p: n for n, p in pl_module.named_parameters()}
        if opt_idx not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[opt_idx] = self._apply_mapping_to_param_groups(groups, names)
        elif num_param_groups != len(groups):
            added = self._apply_mapping_to_param_groups(groups[num_param_groups:], names)
            self._internal_optimizer_metadata[opt_idx].extend(added)

    def on_train_epoch_start(self, trainer: Any, pl_module: Module) -> None:
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            num_param_groups = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._store(pl_module, opt_idx, num_param_groups, optimizer.param_groups)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        """Override to unfreeze parameters as epoch ``epoch`` starts."""
        raise NotImplementedError

    def freeze_before_training(self, pl_module: Module) -> None:
        """Override to freeze parameters before the optimizers are configured."""
        raise NotImplementedError


def _unfreeze_added_groups(pl_module: Module, groups: list[dict[str, Any]]) -> None:
    """A deliberate difference from Lightning 2.6, where it has a plain bug (Lightning issue #21901, fix proposed in
    #21902): ``setup`` froze the module again on the resume, and Lightning restores the added groups but leaves their
    parameters frozen, so what was unfrozen before the save never trains again. Here they train, as in an unbroken
    run, and batch norms among them track their running stats again."""
    restored = {id(p) for group in groups for p in group["params"]}
    for module in pl_module.modules():
        own = [p for p in module.parameters(recurse=False) if id(p) in restored]
        for param in own:
            param.requires_grad = True
        if own and isinstance(module, _BatchNorm):
            module.track_running_stats = True


class BackboneFinetuning(BaseFinetuning):
    """Freezes ``pl_module.backbone`` until epoch ``unfreeze_backbone_at_epoch``, then trains it in a param group of
    its own (added to every optimizer) whose learning rate grows each epoch.

    The group starts at ``backbone_initial_lr``, else the first group's learning rate times
    ``backbone_initial_ratio_lr``; each later epoch ``e`` multiplies it by ``lambda_func(e + 1)``, capped at the
    first group's learning rate with ``should_align``. ``initial_denom_lr`` and ``train_bn`` go to
    ``unfreeze_and_add_param_group``; ``verbose`` logs both learning rates at each change, rounded to ``rounding``
    digits.
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def on_fit_start(self, trainer: Any, pl_module: Module) -> None:
        # A module without ``backbone`` has failed before, in ``setup``'s freeze (an AttributeError), as in Lightning.
        if not isinstance(getattr(pl_module, "backbone", None), torch.nn.Module):
            raise MisconfigurationException("The LightningModule should have a nn.Module `backbone` attribute")
        super().on_fit_start(trainer, pl_module)

    def freeze_before_training(self, pl_module: Module) -> None:
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        if epoch < self.unfreeze_backbone_at_epoch:
            return
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = self.backbone_initial_lr
            if backbone_lr is None:
                backbone_lr = current_lr * self.backbone_initial_ratio_lr
            self.unfreeze_and_add_param_group(
                pl_module.backbone,
                optimizer,
                backbone_lr,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
        else:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr  # the backbone's group is the last one added
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            log.info(
                f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(backbone_lr, self.rounding)}"
            )
