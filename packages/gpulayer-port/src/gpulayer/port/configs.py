"""The rewrite of one YAML config: the classes a Hydra config (``_target_:``) or a LightningCLI config
(``class_path:``) names go through the same registry as Python imports, and so do the arguments of a Lightning
``Trainer`` built from the config; every other byte stays, comments included.

An adopted class's path is replaced by GPUlayer's where it stands (a quoted value keeps its quotes); a class GPUlayer
does not adopt, and a ``Trainer`` argument it refuses (``profiler: simple``), are reported at their line and column.
"""

from __future__ import annotations

import yaml

from gpulayer.port import registry
from gpulayer.port.rewrite import Finding, Ported

_CLASS_KEYS = ("_target_", "class_path")
_TRAINER = "lightning.pytorch.Trainer"


def port_config(text: str) -> Ported:
    """``text`` ported; raises ``yaml.YAMLError`` when it is not YAML."""
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) in ``text``
    findings: list[Finding] = []
    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        for mapping in _mappings(document):
            _port_mapping(mapping, text, edits, findings)
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return Ported(text, sorted(findings))


def _mappings(node: yaml.Node | None) -> list[yaml.MappingNode]:
    """Every mapping in the document, outermost first."""
    if isinstance(node, yaml.MappingNode):
        return [node] + [m for key, value in node.value for m in _mappings(key) + _mappings(value)]
    if isinstance(node, yaml.SequenceNode):
        return [m for item in node.value for m in _mappings(item)]
    return []


def _port_mapping(
    mapping: yaml.MappingNode, text: str, edits: list[tuple[int, int, str]], findings: list[Finding]
) -> None:
    target = next(
        (value for key, value in mapping.value if key.value in _CLASS_KEYS and isinstance(value, yaml.ScalarNode)),
        None,
    )
    if target is None or not registry.is_lightning(target.value):
        return
    answer = registry.answer(target.value)
    if answer.rewritten:
        quote = target.style if target.style in ("'", '"') else ""
        edits.append((target.start_mark.index, target.end_mark.index, f"{quote}{answer.home}{quote}"))
    elif answer.reported:
        findings.append(_finding(target, target.value, answer.note))
    if registry.public_path(target.value) != _TRAINER:
        return
    for key, value in mapping.value:
        if key.value in _CLASS_KEYS or not isinstance(value, yaml.ScalarNode):
            continue
        loaded = yaml.safe_load(text[value.start_mark.index : value.end_mark.index])
        if why := registry.refused_trainer_argument(key.value, loaded):
            findings.append(_finding(key, "Trainer", why))


def _finding(node: yaml.Node, name: str, note: str) -> Finding:
    return Finding(node.start_mark.line + 1, node.start_mark.column + 1, name, note)
