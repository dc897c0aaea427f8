"""Lightning's ``AsyncCheckpointIO`` plugin in a ``Trainer`` call, moved to the strategy's ``async_save=True``: GPUlayer
takes no plugins, and its strategies write the checkpoint callbacks' saves behind training when asked (ADR 0029).

The move is made only where the call says which strategy: a name (``"ddp"``, its ``find_unused_parameters``
variants, ``"single_device"``) becomes GPUlayer's strategy object, and a DDP, single-device or sharded FSDP strategy
built in the call takes ``async_save=True``. Lightning's sharded FSDP saves bypass the plugin and stay synchronous;
the port has them written behind training on purpose, as the plugin asked (the files are the same). Anywhere else the
plugin stays and is reported, naming the edit: no strategy, ``"auto"`` or a variable (one device or several: not guessed), FSDP
with full checkpoints (GPUlayer writes only sharded ones behind training, and a folder of shards is the user's choice),
or a ``CheckpointIO`` of the user's own inside the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

from gpulayer.port import registry

# strategy= names, as GPUlayer reads them (any case): its class and the arguments the name implies
_DDP_STARTS = {"ddp": "", "ddp_spawn": 'start_method="spawn", ', "ddp_fork": 'start_method="fork", '}
_DDP_STARTS["ddp_notebook"] = _DDP_STARTS["ddp_fork"]
_UNUSED = {"": "", "_find_unused_parameters_false": "", "_find_unused_parameters_true": "find_unused_parameters=True, "}
_NAMED = {
    "single_device": ("SingleDeviceStrategy", ""),
    **{
        f"{name}{suffix}": ("DDPStrategy", unused + start)
        for name, start in _DDP_STARTS.items()
        for suffix, unused in _UNUSED.items()
    },
}
_FSDP = "gpulayer.fsdp.FSDPStrategy"
_BUILT = ("gpulayer.trainer.SingleDeviceStrategy", "gpulayer.trainer.DDPStrategy", _FSDP)  # take async_save=True
_NOTE = registry.REGISTRY[registry.ASYNC_CHECKPOINT_IO].note
FSDP_NOTE = (
    "GPUlayer takes no plugins, and under FSDP writes only sharded checkpoints behind training: "
    "FSDPStrategy(state_dict_type='sharded', async_save=True) saves each checkpoint as a folder of shards; to keep "
    "full checkpoints (one file, saved synchronously), drop the plugin"
)
WRAPPED_NOTE = (
    "GPUlayer takes no plugins and writes checkpoints itself (torch.save): drop the plugin and the CheckpointIO it "
    "wraps and pass async_save=True to the strategy, or keep Lightning's Trainer for your CheckpointIO"
)


@dataclass
class Move:
    """What becomes of one Trainer call's ``AsyncCheckpointIO`` plugins."""

    edits: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]] = field(default_factory=dict)  # of updated nodes
    removed: list[cst.CSTNode] = field(default_factory=list)  # the uses of Lightning names that leave the code
    notes: dict[cst.CSTNode, str] = field(default_factory=dict)  # a plugin that stays (its name) -> what to do
    plugins: cst.BaseExpression | None = None  # what the Trainer's plugins= finding judges; None: no finding


def move(
    call: cst.Call, resolve: Callable[[cst.CSTNode], str | None], bind: Callable[[str], str | None]
) -> Move | None:
    """The move of ``call``'s ``AsyncCheckpointIO`` plugins, or None where ``plugins=`` holds none. ``resolve`` names
    the Lightning or GPUlayer path a node refers to (None: neither); ``bind`` imports GPUlayer's class at a path for
    the call and gives the name to write, or None where that name means something else there."""
    keywords = {argument.keyword.value: argument for argument in call.args if argument.keyword is not None}
    plugins = keywords.get("plugins")
    items = _items(plugins.value) if plugins is not None else []
    ours = {
        index: item
        for index, item in enumerate(items)
        if isinstance(item, cst.Call) and resolve(item.func) == registry.ASYNC_CHECKPOINT_IO
    }
    if not ours:
        return None
    result = Move()
    wrapped = [item for item in ours.values() if not _wraps_the_default(item, resolve)]
    note = WRAPPED_NOTE if wrapped else _strategy(keywords.get("strategy"), resolve, bind, result)
    if note is not None:
        result.notes = {item.func: note for item in ours.values()}
        result.plugins = plugins.value if len(ours) < len(items) else None
        return result
    if len(ours) == len(items):  # plugins= holds nothing else: the argument goes
        index = call.args.index(plugins)
        result.edits[call] = lambda updated: _without(updated, "args", {index})
    else:
        result.edits[plugins.value] = lambda updated: _without(updated, "elements", set(ours))
        result.plugins = _without(plugins.value, "elements", set(ours))
    result.removed = [node for item in ours.values() for node in _nodes(item) if resolve(node)]
    return result


def _nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node`` and every node below it."""
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, visited: cst.CSTNode) -> bool:
            found.append(visited)
            return True

    node.visit(Collect())
    return found


def _items(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The plugins ``value`` lists, written out: a list or tuple of them, or one plugin (no ``*`` in either)."""
    if isinstance(value, (cst.List, cst.Tuple)):
        elements = value.elements
        return [] if any(isinstance(e, cst.StarredElement) for e in elements) else [e.value for e in elements]
    return [value]


def _wraps_the_default(plugin: cst.Call, resolve: Callable[[cst.CSTNode], str | None]) -> bool:
    """``AsyncCheckpointIO()``, or around ``None`` or ``TorchCheckpointIO()``: Lightning's default writer, torch.save."""
    if len(plugin.args) != 1:
        return not plugin.args
    inner = plugin.args[0]
    if inner.star or (inner.keyword is not None and inner.keyword.value != "checkpoint_io"):
        return False
    if isinstance(inner.value, cst.Name) and inner.value.value == "None":
        return True
    io = inner.value
    return isinstance(io, cst.Call) and not io.args and (resolve(io.func) or "").endswith(".TorchCheckpointIO")


def _strategy(
    strategy: cst.Arg | None,
    resolve: Callable[[cst.CSTNode], str | None],
    bind: Callable[[str], str | None],
    result: Move,
) -> str | None:
    """Plans ``async_save=True`` on the call's strategy into ``result``; else says what the user is to do."""
    value = strategy.value if strategy is not None else None
    name = getattr(value, "evaluated_value", None) if isinstance(value, cst.BaseString) else None
    if isinstance(name, str):
        if name.lower() not in _NAMED:
            return FSDP_NOTE if name.lower() == "fsdp" else _NOTE
        cls, implied = _NAMED[name.lower()]
        bound = bind(f"gpulayer.trainer.{cls}")
        if bound is None:
            return _NOTE
        result.edits[value] = lambda _: cst.parse_expression(f"{bound}({implied}async_save=True)")
        return None
    path = _home(resolve(value.func)) if isinstance(value, cst.Call) else None
    if path not in _BUILT:
        return _NOTE
    keywords = {argument.keyword.value: argument.value for argument in value.args if argument.keyword is not None}
    if "async_save" in keywords:  # written by hand already: True needs nothing more
        written = keywords["async_save"]
        return None if isinstance(written, cst.Name) and written.value == "True" else _note(path)
    sharded = keywords.get("state_dict_type")
    if path == _FSDP and getattr(sharded, "evaluated_value", None) != "sharded":
        return FSDP_NOTE
    result.edits[value] = _with_async_save
    return None


def _home(path: str | None) -> str | None:
    """GPUlayer's name for ``path``: Lightning's that GPUlayer adopts, or GPUlayer's own as it is."""
    answer = registry.exact(path) if path and registry.is_lightning(path) else None
    return answer.home if answer is not None and answer.rewritten else path


def _note(path: str) -> str:
    return FSDP_NOTE if path == _FSDP else _NOTE


def _with_async_save(call: cst.Call) -> cst.Call:
    """``call`` with ``async_save=True`` after its last argument, laid out as its arguments are (one a line: on a line
    of its own, and a comment after the last stays on its line)."""
    new = cst.parse_expression("f(async_save=True)").args[0]
    if not call.args:
        return call.with_changes(args=[new])
    *others, last = call.args
    between = others[-1].comma.whitespace_after if others and isinstance(others[-1].comma, cst.Comma) else None
    between = between or call.whitespace_before_args
    trailing = isinstance(last.comma, cst.Comma)
    own = last.comma.whitespace_after if trailing else last.whitespace_after_arg
    if isinstance(own, cst.ParenthesizedWhitespace) and isinstance(between, cst.ParenthesizedWhitespace):
        end = cst.ParenthesizedWhitespace(indent=own.indent, last_line=own.last_line)
        new = (
            new.with_changes(comma=cst.Comma(whitespace_after=end))
            if trailing
            else new.with_changes(whitespace_after_arg=end)
        )
        after_last = own.with_changes(indent=between.indent, last_line=between.last_line)
    else:
        new = new.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
        after_last = cst.SimpleWhitespace(" ")
    last = last.with_changes(
        comma=cst.Comma(whitespace_after=after_last), whitespace_after_arg=cst.SimpleWhitespace("")
    )
    return call.with_changes(args=[*others, last, new])


def _without(node: cst.CSTNode, field_name: str, dropped: set[int]) -> cst.CSTNode:
    """``node`` without the arguments or elements at ``dropped``; when its last goes, the one now last ends the
    sequence as that did (a trailing comma or none, the closing bracket's line), and the comment after it stays."""
    items: Sequence[cst.Arg | cst.Element] = getattr(node, field_name)
    kept = [item for index, item in enumerate(items) if index not in dropped]
    changes: dict[str, object] = {}
    if kept and kept[-1] is not items[-1]:
        item, gone = kept[-1], items[-1]
        own = item.comma.whitespace_after if isinstance(item.comma, cst.Comma) else None
        end = (
            gone.comma.whitespace_after
            if isinstance(gone.comma, cst.Comma)
            else getattr(gone, "whitespace_after_arg", None)
        )
        if isinstance(own, cst.ParenthesizedWhitespace) and isinstance(end, cst.ParenthesizedWhitespace):
            closing = own.with_changes(indent=end.indent, last_line=end.last_line)  # a call's: the break is the comma's
            kept[-1] = item.with_changes(comma=item.comma.with_changes(whitespace_after=closing))
        else:
            ending = {"whitespace_after_arg": gone.whitespace_after_arg} if isinstance(gone, cst.Arg) else {}
            kept[-1] = item.with_changes(comma=gone.comma, **ending)
            bracket = node.rbracket if isinstance(node, cst.List) else None  # a list's: the break is the bracket's
            if isinstance(own, cst.ParenthesizedWhitespace) and isinstance(
                getattr(bracket, "whitespace_before", None), cst.ParenthesizedWhitespace
            ):
                before = bracket.whitespace_before.with_changes(first_line=own.first_line)
                changes["rbracket"] = bracket.with_changes(whitespace_before=before)
    if isinstance(node, cst.Tuple) and len(kept) == 1 and not isinstance(kept[0].comma, cst.Comma):
        kept[0] = kept[0].with_changes(comma=cst.Comma())  # still a tuple
    return node.with_changes(**{field_name: kept}, **changes)
