"""The Trainer arguments of a parsed configuration, checked by the Trainer's own declarations before anything is
built; a refused value is reported with the key and where it was set (a flag, a config file, ``trainer_defaults``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from gpulayer.trainer import MisconfigurationException
from gpulayer.trainer.arguments import DECLARATIONS, parse_arguments

CONFIG_FLAGS = ("-c", "--config")


def refusal(values: Mapping[str, Any], key: str, where: Where) -> str | None:
    """The Trainer's own error for ``values`` (the ``key`` group of a parsed config), with the argument's full key
    and where it was set; None when the Trainer takes them. Values that name a class to build (``class_path``) are
    checked when the Trainer is built."""
    given = {name: declared.default for name, declared in DECLARATIONS.items()}
    given |= {name: value for name, value in values.items() if name in DECLARATIONS and not _to_build(value)}
    try:
        parse_arguments(given)
    except MisconfigurationException as error:
        if error.argument is None:
            raise
        full = f"{key}.{error.argument}"
        return f"{error} (the key {full}, set by {where.setter(full)})"
    return None


def _to_build(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_to_build(item) for item in value)
    return isinstance(value, (Namespace, dict)) and "class_path" in value


class Where:
    """Where a key of the configuration was last set: the command line's flags and config files, in order, then the
    defaults given to ``LightningCLI``."""

    def __init__(
        self,
        args: Sequence[str] | Mapping[str, Any] | Namespace | None,
        subcommand: str | None,
        trainer_defaults: Mapping[str, Any],
    ) -> None:
        self.args = sys.argv[1:] if args is None else args
        self.subcommand = subcommand
        self.trainer_defaults = trainer_defaults

    def setter(self, key: str) -> str:
        found = "the default"
        if key.split(".", 1)[1] in self.trainer_defaults:
            found = "trainer_defaults"
        if not isinstance(self.args, Sequence) or isinstance(self.args, str):
            return "the args given to LightningCLI"
        tokens, after_subcommand = list(self.args), self.subcommand is None
        for index, token in enumerate(tokens):
            flag, _, inline = token.partition("=")
            if token == self.subcommand:
                after_subcommand = True
            elif flag in CONFIG_FLAGS:
                path = inline or (tokens[index + 1] if index + 1 < len(tokens) else "")
                prefix = [] if after_subcommand else [self.subcommand]
                if _sets(_load(path), [*prefix, *key.split(".")]):
                    found = f"the config file {path}"
            elif flag.startswith("--"):
                name = flag[2:].rstrip("+")
                if name == key or key.startswith(f"{name}.") or name.startswith(f"{key}."):
                    found = f"the flag {flag.rstrip('+')}"
        return found


def _load(path: str) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None


def _sets(config: Any, keys: list[str | None]) -> bool:
    for key in keys:
        if not isinstance(config, dict) or key not in config:
            return False
        config = config[key]
    return True
