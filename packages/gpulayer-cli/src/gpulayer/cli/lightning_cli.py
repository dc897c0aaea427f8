"""``LightningCLI``: a Module and DataModule configured from config files and dotted flags, then built and run
under a subcommand (``fit``, ``validate``, ``test``, ``predict``), with Lightning 2.6's semantics (ADR 0028)."""

from __future__ import annotations

import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ActionConfigFile, Namespace, class_from_function

from gpulayer.cli import optimizers
from gpulayer.cli.instantiators import Instantiator
from gpulayer.cli.parser import AUTOMATIC, LR_SCHEDULERS, LightningArgumentParser
from gpulayer.cli.save_config import SaveConfigCallback
from gpulayer.cli.trainer_values import Where, refusal
from gpulayer.trainer import DataModule, MisconfigurationException, Module, Trainer, __version__, seed_everything
from gpulayer.trainer.core.hooks import is_overridden

ArgsType = list[str] | dict[str, Any] | Namespace | None


class LightningCLI:
    """Parse the configuration (``args``, else ``sys.argv``), seed, build the model, datamodule and Trainer, and,
    with ``run``, call the subcommand's Trainer method. Override ``add_arguments_to_parser`` to add arguments or
    links, ``before_<subcommand>``/``after_<subcommand>`` to run code around a subcommand."""

    def __init__(
        self,
        model_class: type[Module] | Callable[..., Module] | None = None,
        datamodule_class: type[DataModule] | Callable[..., DataModule] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] | Callable[..., Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.model_class = model_class
        self._model_class = model_class or Module
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data

        names = self.subcommands()
        main_kwargs = {key: value for key, value in self.parser_kwargs.items() if key not in names}
        subcommand_kwargs = {key: value for key, value in self.parser_kwargs.items() if key in names}
        self.setup_parser(run, main_kwargs, subcommand_kwargs)
        self.parse_arguments(self.parser, args)
        self.subcommand = self.config["subcommand"] if run else None
        self._check_trainer_arguments(args)
        self._parse_ckpt_path()
        self._set_seed()
        self.instantiators: list[tuple[Callable[..., Any], type, bool]] = []  # jsonargparse's, for instantiate
        if load_from_checkpoint_support:
            self._add_instantiators()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # The parser

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """A parser with ``--config``; its saved and printed configs start with GPUlayer's version."""
        kwargs.setdefault("dump_header", [f"gpulayer-trainer=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c", "--config", action=ActionConfigFile, help="Path to a configuration file in json or yaml format."
        )
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--seed_everything",
            type=bool | int,
            default=self.seed_everything_default,
            help="An int: run seed_everything with it before building the classes; True: a seed chosen for you.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(
            self._datamodule_class,
            "data",
            subclass_mode=self.subclass_mode_data,
            required=self.datamodule_class is not None,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments to the parser or link them (``parser.link_arguments``)."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((torch.optim.Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LR_SCHEDULERS)
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the Trainer method's parameters the CLI fills itself."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        subcommands = parser.add_subcommands()
        trainer_class = self._trainer_type()
        for subcommand in self.subcommands():
            doc = (getattr(trainer_class, subcommand).__doc__ or "").strip().split("\n\n")[0] or None
            options = {"description": doc, **kwargs.get(subcommand, {})}
            subcommand_parser = self._prepare_subcommand_parser(trainer_class, subcommand, **options)
            self._subcommand_parsers[subcommand] = subcommand_parser
            subcommands.add_subcommand(subcommand, subcommand_parser, help=doc)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = self.init_parser(**kwargs)
        self._add_arguments(parser)
        skip: set[str | int] = set(self.subcommands()[subcommand])
        self._subcommand_method_arguments[subcommand] = parser.add_method_arguments(klass, subcommand, skip=skip)
        return parser

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Link each optimizer and scheduler group added with a ``link_to`` key to that key."""
        for key, (classes, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == AUTOMATIC:
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=optimizers.class_path_adder(classes))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (a list like the command line's, or a dict/Namespace config) into ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            warnings.warn(
                "LightningCLI's args parameter is intended to run from within Python like if it were from the "
                "command line. To prevent mistakes it is not recommended to provide both args and command line "
                f"arguments, got: sys.argv[1:]={sys.argv[1:]}, args={args}.",
                stacklevel=3,
            )
        self.config = parser.parse_object(args) if isinstance(args, (dict, Namespace)) else parser.parse_args(args)

    def _check_trainer_arguments(self, args: ArgsType) -> None:
        """Refuse a Trainer value as ``Trainer(...)`` would, naming its key and where it was set, before any work."""
        parser = self._parser(self.subcommand)
        where = Where(args, self.subcommand, self.trainer_defaults)
        for key in parser.trainer_keys:
            values = self._get(self.config, key, Namespace())
            message = refusal(values.as_dict() if isinstance(values, Namespace) else values, key, where)
            if message is not None:
                parser.error(message)

    def _parse_ckpt_path(self) -> None:
        """A subcommand's ``ckpt_path`` to a file: the module's saved hyperparameters join the config."""
        if not self.subcommand:
            return
        ckpt_path = self.config[self.subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = torch.load(ckpt_path, weights_only=True, map_location="cpu").get("hyper_parameters", {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({self.subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        seed = seed_everything(None if seed is True else seed, workers=True)
        (self.config[self.subcommand] if self.subcommand else self.config)["seed_everything"] = seed

    # Building

    def _add_instantiators(self) -> None:
        """The model and datamodule save their configuration as hyperparameters (``load_from_checkpoint_support``)."""
        for key, cls, subclasses in (
            ("model", self._model_class, self.subclass_mode_model),
            ("data", self._datamodule_class, self.subclass_mode_data),
        ):
            built = cls if isinstance(cls, type) else inspect.signature(cls).return_annotation
            self.instantiators.append((Instantiator(self, key), built, subclasses))

    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are built."""

    def instantiate_classes(self) -> None:
        """Build the configured classes: ``self.model``, ``self.datamodule`` and ``self.trainer``."""
        self.config_init = self.parser.instantiate(self.config, instantiators=self.instantiators)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are built."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer from the config's ``trainer`` group (``kwargs`` win), with the callbacks of the parser's
        callback groups and ``trainer_defaults``, and the config-saving callback."""
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(config, extra)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        given = config.get("callbacks")
        config["callbacks"] = [] if given is None else list(given) if isinstance(given, list) else [given]
        config["callbacks"] += callbacks
        if "callbacks" in self.trainer_defaults:
            default = self.trainer_defaults["callbacks"]
            config["callbacks"] += default if isinstance(default, list) else [default]
        if self.save_config_callback and not config.get("fast_dev_run", False):
            config["callbacks"].append(
                self.save_config_callback(
                    self._parser(self.subcommand),
                    self.config.get(str(self.subcommand), self.config),
                    **self.save_config_kwargs,
                )
            )
        return self.trainer_class(**config)

    @staticmethod
    def configure_optimizers(module: Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None) -> Any:
        """Override to change what the module's ``configure_optimizers`` returns for the configured optimizer."""
        return optimizers.configure_optimizers(module, optimizer, lr_scheduler)

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """With one ``AUTOMATIC`` optimizer group (and at most one scheduler group) configured, the module's
        ``configure_optimizers`` becomes this CLI's, on the optimizer and scheduler built from the config."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        found_optimizers = _automatic(torch.optim.Optimizer, parser._optimizers)
        found_schedulers = _automatic(LR_SCHEDULERS, parser._lr_schedulers)
        if not found_optimizers:
            return
        if len(found_optimizers) > 1 or len(found_schedulers) > 1:
            raise MisconfigurationException(
                f"`{type(self).__name__}.add_configure_optimizers_method_to_model` expects at most one optimizer "
                f"and one lr_scheduler to be 'AUTOMATIC', but found {found_optimizers + found_schedulers}. Link the "
                "argument groups and implement `configure_optimizers` yourself."
            )
        optimizer_init = self._group_init(parser._optimizers, found_optimizers[0])
        if not optimizer_init:
            return
        scheduler_init = self._group_init(parser._lr_schedulers, found_schedulers[0]) if found_schedulers else None
        if is_overridden("configure_optimizers", self.model, Module):
            warnings.warn(
                f"`{type(self.model).__name__}.configure_optimizers` will be overridden by "
                f"`{type(self).__name__}.configure_optimizers`.",
                stacklevel=2,
            )
        optimizer = optimizers.instantiate_class(self.model.parameters(), optimizer_init)
        scheduler = optimizers.instantiate_class(optimizer, scheduler_init) if scheduler_init else None
        method = functools.partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        functools.update_wrapper(method, self.configure_optimizers)
        self.model.configure_optimizers = types.MethodType(method, self.model)

    def _group_init(self, register: dict[str, Any], key: str) -> Any:
        classes = register[key][0]
        init = self._get(self.config_init, key)
        return init if isinstance(classes, tuple) else optimizers.with_class_path(classes, init)

    # Running

    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        method = getattr(self, subcommand, getattr(self.trainer, subcommand))
        method(**self._prepare_subcommand_kwargs(subcommand))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        given = self.config_init[subcommand]
        kwargs = {key: value for key, value in given.items() if key in self._subcommand_method_arguments[subcommand]}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        """``key`` of ``config``, inside the subcommand's group where there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    def _trainer_type(self) -> type:
        cls = self.trainer_class
        return cls if isinstance(cls, type) else class_from_function(cls)


def _automatic(base: type | tuple[type, ...], register: dict[str, Any]) -> list[str]:
    """The keys of ``register``'s groups of ``base`` classes left to the CLI (linked to ``AUTOMATIC``)."""
    found = []
    for key, (classes, link_to) in register.items():
        classes = classes if isinstance(classes, tuple) else (classes,)
        if link_to == AUTOMATIC and any(issubclass(cls, base) for cls in classes):
            found.append(key)
    return found
