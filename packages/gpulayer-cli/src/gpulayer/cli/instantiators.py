"""``load_from_checkpoint_support``: a module or datamodule ``LightningCLI`` builds saves its configuration as its
hyperparameters, with ``_instantiator`` naming ``instantiate_module``, so that ``Module.load_from_checkpoint`` on a
base class rebuilds the configured subclass (Lightning 2.6's ``_InstantiatorFn``)."""

from __future__ import annotations

from typing import Any

import yaml
from jsonargparse import ArgumentParser

from gpulayer.trainer.core.hyperparameters import given_hyperparameters

INSTANTIATOR = "gpulayer.cli.instantiate_module"


class Instantiator:
    """Builds the class of a ``LightningCLI``'s ``key`` group (``model`` or ``data``) with the group's config, as
    dumped, for its hyperparameters."""

    def __init__(self, cli: Any, key: str) -> None:
        self.cli, self.key = cli, key

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        config = self.cli.config
        dumped = yaml.safe_load(self.cli.parser.dump(config, skip_link_targets=False, skip_unset=False, format="yaml"))
        if "subcommand" in config:
            dumped = dumped[config.subcommand]
        hparams = dumped.get(self.key, {})
        if "class_path" in hparams:  # saved flat, the same in and out of subclass mode, with the class apart
            hparams = {
                "_class_path": hparams["class_path"],
                **hparams.get("init_args", {}),
                **hparams.get("dict_kwargs", {}),
            }
        for target, value in applied_instantiation_links.items():
            if target.startswith(f"{self.key}."):
                _set_nested(hparams, target[len(self.key) + 1 :].removeprefix("init_args."), value)
        with given_hyperparameters(hparams, INSTANTIATOR):
            return class_type(*args, **kwargs)


def instantiate_module(class_type: type, config: dict[str, Any]) -> Any:
    """``class_type`` (or the subclass ``config["_class_path"]`` names) built from the saved ``config``."""
    parser = ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        config = {
            "class_path": config["_class_path"],
            "dict_kwargs": {key: value for key, value in config.items() if key != "_class_path"},
        }
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    return parser.instantiate(parser.parse_object({"module": config})).module


def _set_nested(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    data[last] = value
