"""The rewrite of one Python source: Lightning's adopted names become GPUlayer's, what is not adopted is reported and
its import marked; every other byte stays (libcst keeps comments and formatting).

Each import of a Lightning name is resolved through ``registry``; a module bound by an import
(``import lightning as L``, ``from lightning.pytorch import callbacks``) is followed through each attribute chain
that uses it (``L.pytorch.callbacks.ModelCheckpoint``). A rewritten name takes GPUlayer's name (``LightningModule``
-> ``Module``) unless the file binds that name already, and a run of consecutive import lines becomes one sorted
block of GPUlayer imports followed by the Lightning imports that stay.

Other code changes in one place: a Trainer call's ``AsyncCheckpointIO`` becomes the strategy's ``async_save=True``
(``async_checkpoint_io``). So Trainer calls are judged once every import is read, and a reported import's fate waits
for them: a use they take out of the code needs no import, and no finding.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

from gpulayer.port import async_checkpoint_io, registry, tensorboard_logger
from gpulayer.port.apply import MARK, Apply, Statement

_TRAINER = "lightning.pytorch.Trainer"
_OUR_TRAINER = "gpulayer.trainer.Trainer"


@dataclass(frozen=True, order=True)
class Finding:
    """One thing left to do by hand, at a 1-based line and column."""

    line: int
    column: int
    name: str
    note: str

    def format(self, path: str) -> str:
        return f"{path}:{self.line}:{self.column}: {self.name}: {self.note}"


@dataclass(frozen=True)
class Ported:
    code: str
    findings: list[Finding]
    # Lightning's Trainer built with its default logger (no ``logger=``, or True/None), and code that needs that
    # default to be a TensorBoardLogger: across a project, each such Trainer call gets Lightning's logger written
    # (``tensorboard_logger``) or a finding (``files.py``).
    default_loggers: list[Finding] = field(default_factory=list)
    tensorboard_uses: list[Finding] = field(default_factory=list)
    # Imports that work as they are, other libraries' Lightning integrations (``registry.INTEGRATIONS``) and Lightning's
    # helpers (``registry.WORKS``), what the port wrote beyond names, values it cannot judge: no finding.
    notes: list[Finding] = field(default_factory=list)


_Reported = tuple[cst.CSTNode, str, str]  # a use of a name the port reports: (the use, its name, what to do)


def port_code(code: str, *, tensorboard: str = "") -> Ported:
    """``code`` ported; raises ``libcst.ParserSyntaxError`` when it is not Python. ``tensorboard``: where the
    project relies on TensorBoard (``PATH:LINE (code)``), for a Trainer on Lightning's default logger to get it
    written; empty, such a Trainer is listed in ``default_loggers``."""
    wrapper = MetadataWrapper(cst.parse_module(code))
    plan = _Plan(wrapper, tensorboard)
    plan.run()
    module = wrapper.module.visit(Apply(plan.replacements, plan.edits, plan.statements))
    return Ported(module.code, sorted(plan.findings), plan.default_loggers, plan.tensorboard_uses, sorted(plan.notes))


class _Plan:
    """Reads the tree once and decides every change: node replacements, import statements, findings."""

    def __init__(self, wrapper: MetadataWrapper, tensorboard: str) -> None:
        self.module = wrapper.module
        self.tensorboard = tensorboard
        self.scopes = wrapper.resolve(ScopeProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.positions = wrapper.resolve(PositionProvider)
        self.replacements: dict[cst.CSTNode, cst.CSTNode] = {}
        self.statements: dict[cst.CSTNode, Statement] = defaultdict(Statement)
        self.findings: list[Finding] = []
        self.default_loggers: list[Finding] = []
        self.tensorboard_uses: list[Finding] = []
        self.notes: list[Finding] = []
        self.bound = {a.name for scope in set(self.scopes.values()) if scope for a in scope.assignments}
        self.edits: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]] = {}  # functions of the updated node
        # each use of a Lightning or GPUlayer name -> its public path and the import it comes by
        self.resolved: dict[cst.CSTNode, tuple[str, cst.CSTNode]] = {}
        self.homes: dict[tuple[cst.CSTNode, str], str] = {}  # (import, bound name) -> the GPUlayer name it imports
        self.removed: set[cst.CSTNode] = set()  # uses of Lightning names the rewrite takes out of the code
        self.use_notes: dict[cst.CSTNode, str] = {}  # a use left to the user -> what to do, where not its answer's
        self.settlements: list[Callable[[], None]] = []  # what becomes of reported imports, once the calls are judged

    def run(self) -> None:
        for node in self.scopes:
            if isinstance(node, cst.Import):
                for alias in node.names:
                    dotted = get_full_name_for_node(alias.name) or ""
                    if registry.is_lightning(dotted):
                        self._module_binding(node, alias, dotted if alias.asname else dotted.split(".")[0])
                    else:
                        self._integration(node, alias, dotted, dotted)
            elif isinstance(node, cst.ImportFrom) and not node.relative and not isinstance(node.names, cst.ImportStar):
                module = get_full_name_for_node(node.module) or ""
                for alias in node.names:
                    name = get_full_name_for_node(alias.name) or ""
                    if registry.is_lightning(module):
                        self._from_binding(node, alias, f"{module}.{name}")
                    elif module.split(".")[0] == "gpulayer":
                        self._gpulayer_binding(node, alias, f"{module}.{name}")
                    else:
                        self._integration(node, alias, f"{module}.{name}", name)
        for use, (path, statement) in self.resolved.items():
            call = self.parents.get(use)
            if path in (_TRAINER, _OUR_TRAINER) and isinstance(call, cst.Call) and call.func is use:
                self._trainer_call(call, statement, judged=path == _TRAINER)
        for settle in self.settlements:
            settle()
        self.tensorboard_uses = sorted(
            self._finding(node, self.module.code_for_node(node), "")
            for node in self.parents
            if tensorboard_logger.needs_tensorboard(node)
        )

    def _from_binding(self, node: cst.ImportFrom, alias: cst.ImportAlias, dotted: str) -> None:
        if any(key.startswith(registry.public_path(dotted) + ".") for key in registry.REGISTRY):
            self._module_binding(node, alias, dotted)
            return
        answer = registry.answer(dotted)
        name = get_full_name_for_node(alias.name) or ""
        bound = alias.evaluated_alias or name
        self.homes[node, bound] = registry.public_path(dotted)
        references = self._references(node, bound)
        self.resolved.update(dict.fromkeys(references, (registry.public_path(dotted), node)))
        if answer.reported:
            self.settlements.append(lambda: self._settle_name(node, alias, answer, references))
        elif answer.status == registry.WORKS:
            self.notes.append(self._finding(alias, name, answer.note))
        if not answer.rewritten:
            return
        home, new_name = answer.home.rsplit(".", 1)
        new_bound = alias.evaluated_alias or self._free(new_name, name)
        for reference in references:
            if new_bound != bound and isinstance(reference, cst.Name):
                self.replacements[reference] = cst.Name(new_bound)
        self.statements[node].imports.add((home, new_name, new_bound))
        self.statements[node].dropped.add(bound)
        self.homes[node, new_bound] = answer.home

    def _settle_name(
        self, node: cst.ImportFrom, alias: cst.ImportAlias, answer: registry.Answer, uses: list[cst.CSTNode]
    ) -> None:
        """A reported name imported by name: gone with its uses, else reported at the import (or, where the answer is
        an argument, at each use: what to write there depends on the call)."""
        name = get_full_name_for_node(alias.name) or ""
        left = [use for use in uses if use not in self.removed]
        if uses and not left:
            self.statements[node].dropped.add(alias.evaluated_alias or name)
        elif answer.status == registry.ARGUMENT and left:
            for use in left:
                self._report(use, name, self.use_notes.get(use, answer.note), node)
        else:
            self._report(alias, name, answer.note, node)

    def _gpulayer_binding(self, node: cst.ImportFrom, alias: cst.ImportAlias, dotted: str) -> None:
        """A GPUlayer name, as a port (this one, or one before issue 41) wrote it: its Trainer's and strategies' calls
        are followed, so a plugin left by an earlier port moves as Lightning's, and a second port finds what the
        first found."""
        bound = alias.evaluated_alias or get_full_name_for_node(alias.name) or ""
        self.resolved.update(dict.fromkeys(self._references(node, bound), (dotted, node)))
        self.homes[node, bound] = dotted

    def _integration(self, node: cst.CSTNode, alias: cst.ImportAlias, dotted: str, name: str) -> None:
        """An import of another library's Lightning integration: reported, as a finding where it does not work; a
        library that builds Lightning's Trainer itself is named once for each import statement."""
        answer = registry.integration(dotted)
        library = registry.own_trainer_library(dotted)
        if library is not None:
            if not any(comment.startswith(f"{MARK}{library}: ") for comment in self.statements[node].comments):
                self._report(alias, library, answer.note, node)
        elif answer is not None and answer.reported:
            self._report(alias, name, answer.note, node)
        elif answer is not None:
            self.notes.append(self._finding(alias, name, answer.note))

    def _module_binding(self, node: cst.Import | cst.ImportFrom, alias: cst.ImportAlias, prefix: str) -> None:
        """A Lightning module bound to a name: each attribute chain through it is resolved on its own."""
        bound = alias.evaluated_alias or alias.evaluated_name  # `import lightning.pytorch` binds "lightning.pytorch"
        needed = False
        reported: list[_Reported] = []  # unless the rewrite takes them out
        for reference in self._references(node, bound):
            if not isinstance(reference, (cst.Name, cst.Attribute)):
                needed = True  # a string annotation: left to the user with the import
                continue
            # `import lightning.pytorch` binds `lightning`, and its uses name the whole path
            written = prefix if alias.asname or isinstance(node, cst.ImportFrom) else get_full_name_for_node(reference)
            use, dotted = self._longest_known(reference, written or prefix)
            if use is reference and registry.exact(dotted) is None:
                needed = True  # the module itself, passed on or tested
                continue
            answer = registry.answer(dotted)
            self.resolved[use] = (registry.public_path(dotted), node)
            if answer.rewritten:
                home, new_name = answer.home.rsplit(".", 1)
                new_bound = self._free(new_name, dotted.rsplit(".", 1)[1])
                self.replacements[use] = cst.Name(new_bound)
                self.statements[node].imports.add((home, new_name, new_bound))
                continue
            if answer.reported:
                reported.append((use, get_full_name_for_node(use) or dotted, answer.note))
                continue
            if answer.status == registry.WORKS:
                self.notes.append(self._finding(use, get_full_name_for_node(use) or dotted, answer.note))
            needed = True
        self.settlements.append(lambda: self._settle_module(node, bound, needed, reported))

    def _settle_module(self, node: cst.CSTNode, bound: str, needed: bool, reported: list[_Reported]) -> None:
        """A module bound by an import: each reported use that stays is reported; the import goes with the last."""
        left = [(use, name, note) for use, name, note in reported if use not in self.removed]
        for use, name, note in left:
            self._report(use, name, self.use_notes.get(use, note), node)
        if not needed and not left:
            self.statements[node].dropped.add(bound)

    def _longest_known(self, node: cst.CSTNode, dotted: str) -> tuple[cst.CSTNode, str]:
        """The attribute chain above ``node`` up to the first name the registry knows (or the whole chain)."""
        while registry.exact(dotted) is None:
            parent = self.parents.get(node)
            if not (isinstance(parent, cst.Attribute) and parent.value is node):
                break
            node, dotted = parent, f"{dotted}.{parent.attr.value}"
        return node, dotted

    def _references(self, node: cst.Import | cst.ImportFrom, bound: str) -> list[cst.CSTNode]:
        scope = self.scopes[node]
        accesses = {access for a in scope.assignments[bound] if a.node is node for access in a.references}
        return [access.node for access in sorted(accesses, key=lambda a: self._position(a.node))]

    def _free(self, name: str, lightning_name: str) -> str:
        """GPUlayer's name, unless the file binds it already (then the Lightning name, imported ``as`` it)."""
        return name if name == lightning_name or name not in self.bound else lightning_name

    def _trainer_call(self, call: cst.Call, statement: cst.CSTNode, judged: bool) -> None:
        """The call's ``AsyncCheckpointIO`` moved to its strategy where it can be, and, ``judged`` (Lightning's
        Trainer), each argument GPUlayer's Trainer refuses reported (``plugins=`` as the move leaves it)."""
        moved = async_checkpoint_io.move(call, self._path, lambda home: self._bind(call, statement, home))
        if moved is not None:
            self.edits.update(moved.edits)
            self.use_notes.update(moved.notes)
            self.removed.update(moved.removed)
        if not judged:
            return
        if _default_logger(self.module, call):
            self._default_logger(call, statement)
        for argument in call.args:
            if argument.keyword is None:
                continue
            value = argument.value
            if moved is not None and argument.keyword.value == "plugins":
                if moved.plugins is None:
                    continue
                value = moved.plugins
            why = registry.refused_trainer_argument(argument.keyword.value, _value(self.module, value))
            if why:
                self.findings.append(self._finding(argument, "Trainer", why))

    def _default_logger(self, call: cst.Call, statement: cst.CSTNode) -> None:
        """Lightning's TensorBoardLogger written into ``call`` where the project relies on it and the class's name
        can be bound at the call; else the call is listed, for a finding."""
        bound = self._bind(call, statement, tensorboard_logger.CLASS) if self.tensorboard else None
        if bound is None:
            self.default_loggers.append(self._finding(call, "Trainer", ""))
            return
        written, edit = tensorboard_logger.in_call(self.module, call, bound)
        earlier = self.edits.get(call)
        self.edits[call] = edit if earlier is None else lambda updated: edit(earlier(updated))
        note = f"{written} written: Lightning's default logger, which {self.tensorboard} relies on"
        self.notes.append(self._finding(call, "Trainer", note))

    def _path(self, node: cst.CSTNode) -> str | None:
        """The public path of the Lightning or GPUlayer name ``node`` uses, or None."""
        return self.resolved[node][0] if node in self.resolved else None

    def _bind(self, call: cst.Call, statement: cst.CSTNode, home: str) -> str | None:
        """The name to write the class ``home`` (GPUlayer's, or Lightning's logger) by at ``call``, imported with the
        Trainer where the name is free there; None where the name means something else."""
        module, name = home.rsplit(".", 1)
        scope = self.scopes[call]
        if name in scope:
            return name if all(self.homes.get((a.node, name)) == home for a in scope[name]) else None
        ours = get_full_name_for_node(statement.module) if isinstance(statement, cst.ImportFrom) else None
        if ours and not registry.is_lightning(ours):  # GPUlayer's import line (an earlier port's): written again whole
            for alias in statement.names:
                bound = alias.evaluated_alias or alias.evaluated_name
                self.statements[statement].imports.add((ours, alias.evaluated_name, bound))
                self.statements[statement].dropped.add(bound)
        self.statements[statement].imports.add((module, name, name))
        return name

    def _report(self, where: cst.CSTNode, name: str, note: str, statement: cst.CSTNode) -> None:
        self.findings.append(self._finding(where, name, note))
        comment = f"{MARK}{name}: {note}"
        if comment not in self.statements[statement].comments:
            self.statements[statement].comments.append(comment)

    def _finding(self, node: cst.CSTNode, name: str, note: str) -> Finding:
        line, column = self._position(node)
        return Finding(line, column, name, note)

    def _position(self, node: cst.CSTNode) -> tuple[int, int]:
        start = self.positions[node].start
        return start.line, start.column + 1


def _default_logger(module: cst.Module, call: cst.Call) -> bool:
    """``Trainer(...)`` with Lightning's default logger: no ``logger=`` (and no ``**`` that could hold one), or
    ``logger=True``/``None``."""
    if any(argument.star == "**" for argument in call.args):
        return False
    logger = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "logger"), None)
    return logger is None or _value(module, logger) in (True, None)


def _value(module: cst.Module, node: cst.BaseExpression) -> object:
    code = module.code_for_node(node)
    try:
        return ast.literal_eval(code.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return registry.Written(code)
