"""The rewrite of one YAML config: the classes a Hydra config (``_target_:``) or a LightningCLI config
(``class_path:``) names go through the same registry as Python imports, and so do the arguments of a Lightning
``Trainer`` built from the config; every other byte stays, comments included.

An adopted class's path is replaced by GPUlayer's where it stands (a quoted value keeps its quotes); a class GPUlayer
does not adopt, and a ``Trainer`` argument it refuses (``plugins: ...``), are reported at their line and column.
A Hydra interpolation of a top-level key of the same file (``strategy: ${strategy}``) is judged by that key's value;
any other interpolation is named as one the port cannot judge. A Trainer on Lightning's default logger is treated as
in Python code (``tensorboard_logger``).
"""

from __future__ import annotations

import re

import yaml

from gpulayer.port import registry, tensorboard_logger
from gpulayer.port.rewrite import Finding, Ported

_CLASS_KEYS = ("_target_", "class_path")
_TRAINER = "lightning.pytorch.Trainer"
_UNKNOWN = object()  # an interpolated value the config does not make plain
_UNJUDGED = (
    "{}={}: an interpolation the port cannot judge (it names no plain value of this file); GPUlayer's Trainer judges "
    "the resolved value when the config is instantiated"
)


def port_config(text: str, *, tensorboard: str = "") -> Ported:
    """``text`` ported; raises ``yaml.YAMLError`` when it is not YAML. ``tensorboard``: as for ``port_code``."""
    config = _Config(text, tensorboard)
    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        for mapping in _mappings(document):
            config.port_mapping(mapping, document)
    for start, end, replacement in sorted(config.edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return Ported(text, sorted(config.findings), config.default_loggers, notes=sorted(config.notes))


def _mappings(node: yaml.Node | None) -> list[yaml.MappingNode]:
    """Every mapping in the document, outermost first."""
    if isinstance(node, yaml.MappingNode):
        return [node] + [m for key, value in node.value for m in _mappings(key) + _mappings(value)]
    if isinstance(node, yaml.SequenceNode):
        return [m for item in node.value for m in _mappings(item)]
    return []


class _Config:
    """What the port of one config writes (``edits``: ``(start, end, replacement)`` in its text) and reports."""

    def __init__(self, text: str, tensorboard: str) -> None:
        self.text = text
        self.tensorboard = tensorboard
        self.edits: list[tuple[int, int, str]] = []
        self.findings: list[Finding] = []
        self.notes: list[Finding] = []
        self.default_loggers: list[Finding] = []

    def port_mapping(self, mapping: yaml.MappingNode, document: yaml.Node) -> None:
        key, target = next(
            (
                (key.value, value)
                for key, value in mapping.value
                if key.value in _CLASS_KEYS and isinstance(value, yaml.ScalarNode)
            ),
            (None, None),
        )
        if target is None or not registry.is_lightning(target.value):
            return
        answer = registry.answer(target.value)
        if answer.rewritten:
            quote = target.style if target.style in ("'", '"') else ""
            self.edits.append((target.start_mark.index, target.end_mark.index, f"{quote}{answer.home}{quote}"))
        elif answer.reported:
            self.findings.append(_finding(target, target.value, answer.note))
        if registry.public_path(target.value) == _TRAINER:
            self._trainer(mapping, document, key, target)

    def _trainer(self, mapping: yaml.MappingNode, document: yaml.Node, key: str, target: yaml.ScalarNode) -> None:
        """A Lightning Trainer's arguments judged as GPUlayer's Trainer judges them; Lightning's default logger
        written where the project relies on TensorBoard (else the Trainer is listed, for a finding)."""
        logger = None
        for argument, value in mapping.value:
            if argument.value == "logger":
                logger = value
            if argument.value in _CLASS_KEYS or not isinstance(value, yaml.ScalarNode):
                continue
            loaded = yaml.safe_load(self.text[value.start_mark.index : value.end_mark.index])
            interpolation = isinstance(loaded, str) and "${" in loaded
            if interpolation:
                loaded = _interpolated(loaded, document)
                if loaded is _UNKNOWN:
                    self.notes.append(_finding(argument, "Trainer", _UNJUDGED.format(argument.value, value.value)))
                    continue
            if why := registry.refused_trainer_argument(argument.value, loaded):
                self.findings.append(_finding(argument, "Trainer", f"{value.value}: {why}" if interpolation else why))
        given = yaml.safe_load(logger.value) if isinstance(logger, yaml.ScalarNode) else False
        if logger is not None and given is not True and given is not None:
            return
        if logger is None and any(_is_logger(m) for m in _mappings(document)):
            return  # a logger the config builds beside the Trainer, which the code passes to it
        if not self.tensorboard or key != "_target_":  # LightningCLI's Trainer arguments are not written
            self.default_loggers.append(_finding(target, "Trainer", ""))
            return
        written, edit = tensorboard_logger.in_config(mapping, self.text)
        self.edits.append(edit)
        note = f"{written} written: Lightning's default logger, which {self.tensorboard} relies on"
        self.notes.append(_finding(target, "Trainer", note))


def _is_logger(mapping: yaml.MappingNode) -> bool:
    targets = [v.value for k, v in mapping.value if k.value in _CLASS_KEYS and isinstance(v, yaml.ScalarNode)]
    return any(registry.public_path(t).startswith("lightning.pytorch.loggers.") for t in targets)


def _interpolated(value: str, document: yaml.Node) -> object:
    """``${key}`` (a dotted key from the top of the config) read from the config where it is a plain value there;
    ``_UNKNOWN`` for any other interpolation (a resolver, a relative key, text around it)."""
    match = re.fullmatch(r"\$\{([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*)\}", value)
    if match is None:
        return _UNKNOWN
    node: yaml.Node | None = document
    for part in match.group(1).split("."):
        mapping = node.value if isinstance(node, yaml.MappingNode) else []
        node = next((v for k, v in mapping if isinstance(k, yaml.ScalarNode) and k.value == part), None)
    if not isinstance(node, yaml.ScalarNode):
        return _UNKNOWN
    loaded = yaml.safe_load(node.value) if node.style is None else node.value
    return _UNKNOWN if isinstance(loaded, str) and "${" in loaded else loaded


def _finding(node: yaml.Node, name: str, note: str) -> Finding:
    return Finding(node.start_mark.line + 1, node.start_mark.column + 1, name, note)
