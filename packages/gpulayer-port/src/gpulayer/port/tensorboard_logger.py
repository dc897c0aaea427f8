"""Lightning's default logger, written out where a project relies on it. With no logger given (or ``logger=True``)
and tensorboard or tensorboardX installed, Lightning 2.6 builds a ``TensorBoardLogger`` (``configure_logger`` in
``lightning/pytorch/trainer/connectors/logger_connector/logger_connector.py``); GPUlayer builds a ``CSVLogger``. Where
the project's code needs TensorBoard (``.experiment.add_*``, ``log_graph``, an ``isinstance`` check), the port passes
Lightning's logger to the ``Trainer`` by name, as Lightning builds it: ``save_dir`` the Trainer's
``default_root_dir`` (the working folder unless the call gives one), ``name`` ``"lightning_logs"``; so the run writes
the same ``lightning_logs/version_N`` event files. (Under Slurm Lightning names the version by the job's id; the
written logger counts versions as it does everywhere else.)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import libcst as cst
import yaml

CLASS = "lightning.pytorch.loggers.TensorBoardLogger"
NAME = "lightning_logs"
_ROOT = "default_root_dir"


def installed() -> bool:
    """Whether Lightning's default logger here is a TensorBoardLogger (its condition: either package importable)."""
    return any(importlib.util.find_spec(name) is not None for name in ("tensorboard", "tensorboardX"))


def needs_tensorboard(node: cst.CSTNode) -> bool:
    """Code that works only when the logger is a TensorBoardLogger: ``.experiment.add_*``, ``log_graph``, an
    ``isinstance`` check against ``TensorBoardLogger``."""
    if isinstance(node, cst.Attribute):
        name = node.attr.value
        through_experiment = isinstance(node.value, cst.Attribute) and node.value.attr.value == "experiment"
        return (name.startswith("add_") and through_experiment) or name in ("log_graph", "_log_graph")
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "isinstance":
        return len(node.args) == 2 and "TensorBoardLogger" in cst.Module([]).code_for_node(node.args[1].value)
    return False


def in_call(module: cst.Module, call: cst.Call, bound: str) -> tuple[str, Callable[[cst.Call], cst.Call]]:
    """``logger=`` for ``call`` (the class imported as ``bound``) and the edit that writes it: the value of a
    ``logger=True``/``None`` replaced, else the argument added last."""
    root = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == _ROOT), None)
    code = module.code_for_node(root).strip() if root is not None else "None"
    if code == "None":
        save_dir = '"."'
    elif isinstance(root, cst.SimpleString):
        save_dir = code
    else:  # Lightning's `default_root_dir or os.getcwd()`: a variable may hold None
        simple = isinstance(root, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
        save_dir = f'{code if simple else f"({code})"} or "."'
    written = f'{bound}(save_dir={save_dir}, name="{NAME}")'
    value = cst.parse_expression(written)

    def edit(updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        for index, argument in enumerate(args):
            if argument.keyword is not None and argument.keyword.value == "logger":
                args[index] = argument.with_changes(value=value)
                return updated.with_changes(args=args)
        bare = cst.SimpleWhitespace("")
        new = cst.Arg(value, keyword=cst.Name("logger"), equal=cst.AssignEqual(bare, bare))
        if args and isinstance(args[-1].comma, cst.Comma):  # a trailing comma: the new argument takes its place
            new = new.with_changes(comma=args[-1].comma)
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=updated.whitespace_before_args))
        elif args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated.with_changes(args=[*args, new])

    return f"logger={written}", edit


def in_config(mapping: yaml.MappingNode, text: str) -> tuple[str, tuple[int, int, str]]:
    """``logger:`` for a Trainer's mapping in a Hydra config, as a flow mapping Hydra instantiates, and the edit that
    writes it, ``(start, end, text)``: the value of ``logger: true``/``null`` replaced, else the key added after the
    mapping's last one."""
    values = {k.value: v for k, v in mapping.value if isinstance(k, yaml.ScalarNode)}
    root = values.get(_ROOT)
    given = isinstance(root, yaml.ScalarNode) and yaml.safe_load(_source(root, text)) is not None
    save_dir = "'" + root.value.replace("'", "''") + "'" if given else "."  # quoted: flow indicators in ${...}
    written = f"{{_target_: {CLASS}, save_dir: {save_dir}, name: {NAME}}}"
    logger = values.get("logger")
    if logger is not None:
        start, end = logger.start_mark.index, logger.end_mark.index
        return f"logger: {written}", (start, end, written if end > start else f" {written}")
    if mapping.flow_style:
        end = mapping.end_mark.index - 1  # the closing brace
        return f"logger: {written}", (end, end, f", logger: {written}")
    indent = " " * mapping.value[0][0].start_mark.column
    last = mapping.value[-1][1].end_mark
    # after the line the last value ends on (and its comment), or, where a nested block ended at the next line's key,
    # before that line
    at = last.index - last.column if last.column <= len(indent) else text.find("\n", last.index) + 1 or len(text)
    line = f"{indent}logger: {written}\n"
    return f"logger: {written}", (at, at, line if at == 0 or text[at - 1] == "\n" else f"\n{line}")


def _source(node: yaml.Node, text: str) -> str:
    return text[node.start_mark.index : node.end_mark.index]
