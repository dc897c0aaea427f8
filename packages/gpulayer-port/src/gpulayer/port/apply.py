"""A planned rewrite applied (``rewrite`` plans it): nodes replaced or edited, then each body's import lines regrouped:
a run of consecutive lines with Lightning imports becomes one sorted block of GPUlayer's imports followed by what
stays of them, each line that stays under the marks of what is reported in it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

MARK = "# gpulayer port: "


@dataclass
class Statement:
    """What becomes of one import statement: GPUlayer imports to add, the aliases that stay, comments above it."""

    imports: set[tuple[str, str, str]] = field(default_factory=set)  # (module, name, bound name)
    dropped: set[str] = field(default_factory=set)  # bound names of aliases no longer needed
    comments: list[str] = field(default_factory=list)


class Apply(cst.CSTTransformer):
    """Applies a plan: nodes replaced or edited, then each body's import lines regrouped."""

    def __init__(
        self,
        replacements: dict[cst.CSTNode, cst.CSTNode],
        edits: dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]],  # functions of the updated node
        statements: dict[cst.CSTNode, Statement],
    ) -> None:
        super().__init__()
        self.replacements = replacements
        self.edits = edits
        self.statements = statements
        self.originals: dict[cst.CSTNode, cst.CSTNode] = {}  # updated small statement -> its original

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        if original in self.replacements:
            return self.replacements[original]
        if original in self.edits:
            updated = self.edits[original](updated)
        if original in self.statements:
            self.originals[updated] = original
        return super().on_leave(original, updated)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._regroup(updated.body))

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated.with_changes(body=self._regroup(updated.body))

    def _planned(self, line: cst.CSTNode) -> bool:
        return isinstance(line, cst.SimpleStatementLine) and any(small in self.originals for small in line.body)

    def _regroup(self, body: Sequence[cst.CSTNode]) -> list[cst.CSTNode]:
        body = list(body)
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
            lead = run[0].leading_lines
            ported = self._ported_run(run)
            out.extend(ported)
            if not ported and index < len(body):  # every import of the run went: the lines above it (but the
                # marks of what went) go above the next statement
                above = [line for line in lead if not (line.comment and line.comment.value.startswith(MARK))]
                body[index] = body[index].with_changes(leading_lines=[*above, *body[index].leading_lines])
        return out

    def _ported_run(self, run: list[cst.SimpleStatementLine]) -> list[cst.SimpleStatementLine]:
        """Consecutive lines with Lightning imports: GPUlayer's imports first, sorted, then what stays of them."""
        imports: set[tuple[str, str, str]] = set()
        kept: list[cst.SimpleStatementLine] = []
        carried: list[str] = []  # the comments of lines replaced whole (a noqa mark, a note in parentheses)
        lead = run[0].leading_lines  # the blank lines and comments above the run stay above it
        run[0] = run[0].with_changes(leading_lines=())
        for line in run:
            smalls: list[cst.BaseSmallStatement] = []
            comments: list[str] = []
            for small in line.body:
                statement = self.statements[self.originals[small]] if small in self.originals else Statement()
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
        if lines:
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
