"""ARCHITECTURE.md names only modules that exist, lists every module of gpulayer-trainer, and lists the private
APIs of torch and torchmetrics that GPUlayer uses exactly as their pinning tests do; gpulayer-trainer's rooms import
one another one way only (ADR 0027)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINER = ROOT / "packages" / "gpulayer-trainer" / "src" / "gpulayer" / "trainer"
# gpulayer-trainer's rooms, highest first: at run time a room imports only from the tiers below its own (ADR 0027).
# "top" is the Trainer, its arguments and defaults, and the public names; "leaf" the helpers beside them that import
# nothing of the trainer.
TIERS = [("top",), ("loops",), ("strategies", "data"), ("core",), ("logging", "checkpoint", "profilers"), ("leaf",)]
LEAVES = {"exceptions", "states", "batch", "private_files"}


def test_architecture_lists_every_module_and_no_missing_one():
    """Each package's section lists its modules by their path in its source folder (``loops/stages.py``)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`(packages/[^`\s]+\.py)`", text))
    gone = sorted(path for path in named if not (ROOT / path).is_file())
    assert gone == [], f"ARCHITECTURE.md names modules that do not exist: {gone}"
    sections = text.split("\n## The modules\n")[1].split("\n## ")[0].split("\n### ")[1:]
    listed = {section.split("\n", 1)[0]: set(re.findall(r"^- `([\w/]+\.py)`", section, re.M)) for section in sections}
    for source in sorted(ROOT.glob("packages/*/src/gpulayer/*")):
        distribution = source.parent.parent.parent.name
        # A room's __init__.py holds its docstring alone (test_each_room_init_holds_its_docstring_alone).
        modules = {
            str(path.relative_to(source))
            for path in source.rglob("*.py")
            if path.parent == source or path.stem != "__init__"
        }
        named_here = listed.get(distribution, set())
        assert sorted(named_here - modules) == [], f"ARCHITECTURE.md lists modules {distribution} does not have"
        assert sorted(modules - named_here) == [], f"modules of {distribution} not listed in ARCHITECTURE.md"
    assert TRAINER.is_dir()


def test_each_room_init_holds_its_docstring_alone():
    """A re-export in a room's ``__init__.py`` would import the room whenever any of its modules is imported."""
    for init in sorted(TRAINER.glob("*/__init__.py")):
        body = ast.parse(init.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{init.relative_to(ROOT)}: a docstring alone"


def test_every_private_api_listed_has_its_pinning_test_and_every_pinning_test_is_listed():
    section = (ROOT / "ARCHITECTURE.md").read_text().split("\n## Private APIs of torch and torchmetrics\n")[1]
    section = section.split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+)/([\w/]+\.py)` \| `([^`]+)`[^|]*\|.*\| `(test_\w+)` \|$", section, re.MULTILINE)
    table = [line for line in section.splitlines() if line.startswith("|")][2:]  # below the header and its rule
    assert len(rows) == len(table) > 0, "each row reads | `package/folder/module.py` | `API` | ... | `test_name` |"
    listed = {}
    for package, module, api, test in rows:
        source = ROOT / "packages" / f"gpulayer-{package}" / "src" / "gpulayer" / package / module
        used = _names(api.rsplit(".", 1)[-1], source.read_text())
        assert used, f"ARCHITECTURE.md lists {api} for {module}, which does not use it"
        listed[package, test] = api
    pinned = {}
    for path in ROOT.glob("packages/gpulayer-*/tests/test_private_apis.py"):
        package, text = path.parent.parent.name.removeprefix("gpulayer-"), path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                pinned[package, node.name] = ast.get_source_segment(text, node)
    assert sorted(listed.keys() - pinned.keys()) == [], "private APIs in ARCHITECTURE.md without their pinning test"
    assert sorted(pinned.keys() - listed.keys()) == [], "pinning tests whose private API ARCHITECTURE.md does not list"
    named_elsewhere = sorted(key for key, api in listed.items() if not _names(api, pinned[key]))
    assert named_elsewhere == [], "these tests do not name the private API their ARCHITECTURE.md row gives"


def _names(name: str, text: str) -> bool:
    """Whether ``text`` names ``name`` whole (``_rebuild_bucket`` is not named by ``_rebuild_buckets``)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def test_no_runtime_import_climbs_back_up_the_rooms():
    assert _climbs(TRAINER) == []


def test_a_climbing_import_is_found_and_one_for_types_only_is_not(tmp_path):
    package = tmp_path / "trainer"
    (package / "core").mkdir(parents=True)
    (package / "core" / "module.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from gpulayer.trainer.exceptions import MisconfigurationException\n"
        "if TYPE_CHECKING:\n"
        "    from gpulayer.trainer.trainer import Trainer\n"
        "def load():\n"
        "    from gpulayer.trainer.loops import stages\n"
        "    from gpulayer.trainer import Trainer\n"
    )
    assert _climbs(package) == [
        "core/module.py:6 imports gpulayer.trainer.loops.stages (room loops)",
        "core/module.py:7 imports gpulayer.trainer.Trainer (room top)",
    ]


def _climbs(package: Path) -> list[str]:
    """Every import, module-level or inside a function (not under ``if TYPE_CHECKING:``), of a room at the same tier
    or above the importing module's own room."""
    tier = {room: index for index, rooms in enumerate(TIERS) for room in rooms}
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        room = _room(relative.parts[0] if len(relative.parts) > 1 else relative.stem)
        for line, imported in _runtime_imports(ast.parse(path.read_text())):
            target = _room(imported.removeprefix("gpulayer.trainer").lstrip(".").split(".")[0])
            if target != room and tier[target] <= tier[room]:
                found.append(f"{relative}:{line} imports {imported} (room {target})")
    return found


def _room(name: str) -> str:
    """The room of a top-level name of the trainer package: a folder, a leaf helper, or the top."""
    rooms = {room for rooms in TIERS for room in rooms}
    return name if name in rooms else "leaf" if name in LEAVES else "top"


def _runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, gpulayer.trainer...)`` for each name imported from the trainer, outside ``if TYPE_CHECKING:``."""
    imports = []
    for node in ast.walk(_without_type_checking_blocks(tree)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpulayer.trainer"):
            imports += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            imports += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpulayer.trainer")]
    return imports


def _without_type_checking_blocks(tree: ast.AST) -> ast.AST:
    class Drop(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                return node.orelse
            return self.generic_visit(node)

    return Drop().visit(tree)


def test_the_trainers_private_attributes_are_used_outside_trainer_py_only_where_architecture_md_says():
    """Each stage gets the Trainer's parts and its checkpoint request as arguments; what is left is listed, with
    its reason, under "Where a module reaches into the Trainer's private state"."""
    uses: dict[str, int] = {}
    for path in sorted(ROOT.glob("packages/*/src/gpulayer/**/*.py")):
        if path == TRAINER / "trainer.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if (isinstance(owner, ast.Name) and owner.id == "trainer") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "trainer"
                ):
                    key = str(path.relative_to(TRAINER if path.is_relative_to(TRAINER) else ROOT))
                    uses[key] = uses.get(key, 0) + 1
    assert uses == {"checkpoint/checkpoint.py": 2, "core/metric_logging.py": 1, "started_call.py": 1}
