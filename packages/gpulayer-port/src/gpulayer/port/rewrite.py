"""The rewrite of one Python source: Lightning's adopted names become GPUlayer's, what is not adopted is reported and
its import marked; every other byte stays (libcst keeps comments and formatting).

Each import of a Lightning name is resolved through ``registry``; a module bound by an import
(``import lightning as L``, ``from lightning.pytorch import callbacks``) is followed through each attribute chain
that uses it (``L.pytorch.callbacks.ModelCheckpoint``). A rewritten name takes GPUlayer's name (``LightningModule``
-> ``Module``) unless the file binds that name already, and a run of consecutive import lines becomes one sorted
block of GPUlayer imports followed by the Lightning imports that stay.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

from gpulayer.port import registry

MARK = "# gpulayer port: "
_TRAINER = "lightning.pytorch.Trainer"


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
    # default to be a TensorBoardLogger: across a project, each such Trainer call gets a finding (``files.py``).
    default_loggers: list[Finding] = field(default_factory=list)
    tensorboard_uses: list[Finding] = field(default_factory=list)
    # Imports of other libraries' Lightning integrations that work as they are (``registry.INTEGRATIONS``): no finding.
    notes: list[Finding] = field(default_factory=list)


@dataclass
class _Statement:
    """What becomes of one import statement: GPUlayer imports to add, the aliases that stay, comments above it."""

    imports: set[tuple[str, str, str]] = field(default_factory=set)  # (module, name, bound name)
    dropped: set[str] = field(default_factory=set)  # bound names of aliases no longer needed
    comments: list[str] = field(default_factory=list)


def port_code(code: str) -> Ported:
    """``code`` ported; raises ``libcst.ParserSyntaxError`` when it is not Python."""
    wrapper = MetadataWrapper(cst.parse_module(code))
    plan = _Plan(wrapper)
    plan.run()
    module = wrapper.module.visit(_Rewrite(plan))
    return Ported(module.code, sorted(plan.findings), plan.default_loggers, plan.tensorboard_uses, plan.notes)


class _Plan:
    """Reads the tree once and decides every change: node replacements, import statements, findings."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.module = wrapper.module
        self.scopes = wrapper.resolve(ScopeProvider)
        self.parents = wrapper.resolve(ParentNodeProvider)
        self.positions = wrapper.resolve(PositionProvider)
        self.replacements: dict[cst.CSTNode, cst.CSTNode] = {}
        self.statements: dict[cst.CSTNode, _Statement] = defaultdict(_Statement)
        self.findings: list[Finding] = []
        self.default_loggers: list[Finding] = []
        self.tensorboard_uses: list[Finding] = []
        self.notes: list[Finding] = []
        self.bound = {a.name for scope in set(self.scopes.values()) if scope for a in scope.assignments}

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
                    else:
                        self._integration(node, alias, f"{module}.{name}", name)
        self.tensorboard_uses = sorted(
            self._finding(node, self.module.code_for_node(node), "")
            for node in self.parents
            if _needs_tensorboard(node)
        )

    def _from_binding(self, node: cst.ImportFrom, alias: cst.ImportAlias, dotted: str) -> None:
        if any(key.startswith(registry.public_path(dotted) + ".") for key in registry.REGISTRY):
            self._module_binding(node, alias, dotted)
            return
        answer = registry.answer(dotted)
        name = get_full_name_for_node(alias.name) or ""
        bound = alias.evaluated_alias or name
        if answer.status == registry.NOT_ADOPTED:
            self._report(alias, name, answer.note, node)
        if not answer.rewritten:
            self._check_trainer_calls(dotted, self._references(node, bound))
            return
        home, new_name = answer.home.rsplit(".", 1)
        new_bound = alias.evaluated_alias or self._free(new_name, name)
        for reference in self._references(node, bound):
            self._check_trainer_calls(dotted, [reference])
            if new_bound != bound and isinstance(reference, cst.Name):
                self.replacements[reference] = cst.Name(new_bound)
        self.statements[node].imports.add((home, new_name, new_bound))
        self.statements[node].dropped.add(bound)

    def _integration(self, node: cst.CSTNode, alias: cst.ImportAlias, dotted: str, name: str) -> None:
        """An import of another library's Lightning integration: reported, as a finding where it does not work."""
        answer = registry.integration(dotted)
        if answer is not None and answer.status == registry.NOT_ADOPTED:
            self._report(alias, name, answer.note, node)
        elif answer is not None:
            self.notes.append(self._finding(alias, name, answer.note))

    def _module_binding(self, node: cst.Import | cst.ImportFrom, alias: cst.ImportAlias, prefix: str) -> None:
        """A Lightning module bound to a name: each attribute chain through it is resolved on its own."""
        bound = alias.evaluated_alias or alias.evaluated_name  # `import lightning.pytorch` binds "lightning.pytorch"
        needed = False
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
            self._check_trainer_calls(dotted, [use])
            if answer.rewritten:
                home, new_name = answer.home.rsplit(".", 1)
                new_bound = self._free(new_name, dotted.rsplit(".", 1)[1])
                self.replacements[use] = cst.Name(new_bound)
                self.statements[node].imports.add((home, new_name, new_bound))
                continue
            needed = True
            if answer.status == registry.NOT_ADOPTED:
                self._report(use, get_full_name_for_node(use) or dotted, answer.note, node)
        if not needed:
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

    def _check_trainer_calls(self, dotted: str, uses: list[cst.CSTNode]) -> None:
        if registry.public_path(dotted) != _TRAINER:
            return
        for use in uses:
            call = self.parents.get(use)
            if not (isinstance(call, cst.Call) and call.func is use):
                continue
            if _default_logger(self.module, call):
                self.default_loggers.append(self._finding(call, "Trainer", ""))
            for argument in call.args:
                if argument.keyword is None:
                    continue
                why = registry.refused_trainer_argument(argument.keyword.value, _value(self.module, argument.value))
                if why:
                    self.findings.append(self._finding(argument, "Trainer", why))

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


def _needs_tensorboard(node: cst.CSTNode) -> bool:
    """Code that works only when the logger is a TensorBoardLogger: ``.experiment.add_*``, ``log_graph``, an
    ``isinstance`` check against ``TensorBoardLogger``."""
    if isinstance(node, cst.Attribute):
        name = node.attr.value
        through_experiment = isinstance(node.value, cst.Attribute) and node.value.attr.value == "experiment"
        return (name.startswith("add_") and through_experiment) or name in ("log_graph", "_log_graph")
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "isinstance":
        return len(node.args) == 2 and "TensorBoardLogger" in cst.Module([]).code_for_node(node.args[1].value)
    return False


def _value(module: cst.Module, node: cst.BaseExpression) -> object:
    code = module.code_for_node(node)
    try:
        return ast.literal_eval(code.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return registry.Written(code)


class _Rewrite(cst.CSTTransformer):
    """Applies a ``_Plan``: names replaced, then each body's import lines regrouped."""

    def __init__(self, plan: _Plan) -> None:
        super().__init__()
        self.plan = plan
        self.originals: dict[cst.CSTNode, cst.CSTNode] = {}  # updated small statement -> its original

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        if original in self.plan.replacements:
            return self.plan.replacements[original]
        if original in self.plan.statements:
            self.originals[updated] = original
        return super().on_leave(original, updated)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._regroup(updated.body))

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._regroup(updated.body))

    def _planned(self, line: cst.CSTNode) -> bool:
        return isinstance(line, cst.SimpleStatementLine) and any(small in self.originals for small in line.body)

    def _regroup(self, body: tuple[cst.CSTNode, ...]) -> list[cst.CSTNode]:
        out: list[cst.CSTNode] = []
        index = 0
        while index < len(body):
            run = []  # consecutive lines: a blank line or a comment ends a run (and a notebook's cell is one)
            while index < len(body) and self._planned(body[index]) and not (run and body[index].leading_lines):
                run.append(body[index])
                index += 1
            if not run:
                out.append(body[index])
                index += 1
                continue
            out.extend(self._ported_run(run))
        return out

    def _ported_run(self, run: list[cst.SimpleStatementLine]) -> list[cst.SimpleStatementLine]:
        """Consecutive lines with Lightning imports: GPUlayer's imports first, sorted, then what stays of them."""
        imports: set[tuple[str, str, str]] = set()
        kept: list[cst.SimpleStatementLine] = []
        carried: list[str] = []  # the comments of lines replaced whole (a "# noqa", a note in parentheses)
        lead = run[0].leading_lines  # the blank lines and comments above the run stay above it
        run[0] = run[0].with_changes(leading_lines=())
        for line in run:
            smalls: list[cst.BaseSmallStatement] = []
            comments: list[str] = []
            for small in line.body:
                statement = self.plan.statements[self.originals[small]] if small in self.originals else _Statement()
                imports |= statement.imports
                comments += statement.comments
                remaining = _without(small, statement.dropped)
                if remaining is not None:
                    smalls.append(remaining)
            if smalls:
                kept.append(_with_comments(line.with_changes(body=_last_without_semicolon(smalls)), comments, lead))
            else:
                carried += _comments_in(line)
        added = [_import_line(module, names) for module, names in _by_module(imports)]
        trailing = run[-1].trailing_whitespace
        if added and len(run) == 1 and carried == [trailing.comment.value if trailing.comment else None]:
            added[-1] = added[-1].with_changes(trailing_whitespace=trailing)  # one line: its comment stays on it
        elif added and carried:
            added[0] = added[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(c)) for c in carried])
        lines = added + kept
        lines[0] = lines[0].with_changes(leading_lines=[*lead, *lines[0].leading_lines])
        return lines


def _comments_in(node: cst.CSTNode) -> list[str]:
    """The comments written inside ``node`` (its own leading lines excluded by the caller)."""
    found: list[str] = []

    class Collect(cst.CSTVisitor):
        def visit_Comment(self, comment: cst.Comment) -> None:
            found.append(comment.value)

    node.visit(Collect())
    return found


def _without(small: cst.BaseSmallStatement, dropped: set[str]) -> cst.BaseSmallStatement | None:
    """An import statement without the aliases bound to ``dropped`` names (None when none is left)."""
    if not dropped or not isinstance(small, (cst.Import, cst.ImportFrom)) or isinstance(small.names, cst.ImportStar):
        return small
    names = [a for a in small.names if (a.evaluated_alias or a.evaluated_name) not in dropped]
    if len(names) == len(small.names):
        return small
    if not names:
        return None
    names[-1] = names[-1].with_changes(comma=small.names[-1].comma)  # a trailing comma stays
    return small.with_changes(names=names)


def _last_without_semicolon(smalls: list[cst.BaseSmallStatement]) -> list[cst.BaseSmallStatement]:
    smalls[-1] = smalls[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
    return smalls


def _with_comments(
    line: cst.SimpleStatementLine, comments: list[str], lead: Sequence[cst.EmptyLine]
) -> cst.SimpleStatementLine:
    """``line`` with the marks not already above it (in its own leading lines or the run's, ``lead``)."""
    present = {empty.comment.value for empty in (*lead, *line.leading_lines) if empty.comment}
    new = [cst.EmptyLine(comment=cst.Comment(text)) for text in comments if text not in present]
    return line.with_changes(leading_lines=[*line.leading_lines, *new])


def _by_module(imports: set[tuple[str, str, str]]) -> list[tuple[str, list[tuple[str, str]]]]:
    grouped: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for module, name, bound in imports:
        grouped[module].add((name, bound))
    return [(module, sorted(grouped[module], key=_isort_key)) for module in sorted(grouped)]


def _isort_key(pair: tuple[str, str]) -> tuple[int, str, str]:
    """isort's order by type, as ruff applies it: constants, classes, then functions and variables."""
    name = pair[0]
    return (0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2, *pair)


def _import_line(module: str, names: list[tuple[str, str]]) -> cst.SimpleStatementLine:
    listed = ", ".join(name if name == bound else f"{name} as {bound}" for name, bound in names)
    return cst.parse_statement(f"from {module} import {listed}\n")
