"""The shape of GPUlayer's code: lines per module and the functions over 60 lines, for a before/after table.

    python tools/code_shape.py [--root CHECKOUT] [--limit 60]

Reads ``packages/*/src/**/*.py`` under ``--root`` (default: this checkout), so an older checkout (a ``git
worktree``) gives the "before" column. Functions (methods too, named ``Class.method``) are measured from their
``def`` line to their last line, decorators excluded, with ``ast``. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def long_functions(tree: ast.AST, limit: int, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, lines) of every function in ``tree`` longer than ``limit`` lines, nested ones included."""
    found = []
    for node in ast.iter_child_nodes(tree):
        name = f"{prefix}{getattr(node, 'name', '')}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            found += [(name, lines)] if lines > limit else []
        found += long_functions(node, limit, f"{name}." if hasattr(node, "name") else prefix)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--limit", type=int, default=60, help="list functions longer than this many lines")
    args = parser.parse_args()
    modules = sorted(args.root.glob("packages/*/src/**/*.py"))
    if not modules:
        parser.error(f"--root {args.root}: no packages/*/src/**/*.py there (a GPUlayer checkout is accepted)")
    sizes, functions = [], []
    for path in modules:
        text = path.read_text()
        name = str(path.relative_to(args.root))
        sizes.append((name, len(text.splitlines())))
        functions += [(f"{name}: {function}", lines) for function, lines in long_functions(ast.parse(text), args.limit)]
    print("| module | lines |\n| --- | ---: |")
    print("\n".join(f"| `{name}` | {lines} |" for name, lines in sizes))
    print(f"| {len(sizes)} modules | {sum(lines for _, lines in sizes)} |\n")
    print(f"| function over {args.limit} lines | lines |\n| --- | ---: |")
    print("\n".join(f"| `{name}` | {lines} |" for name, lines in functions) or "| none | |")


if __name__ == "__main__":
    main()
