"""The import structure the design fixes (DESIGN.md "Layout"), read from the source with ``ast``:
no import cycle, no family importing another, and the layers importing only downwards.

Every import counts, a function-level one included (it is a dependency all the same); only those
under ``if TYPE_CHECKING:`` do not, as they never run.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("runtime", "export", "server", "bench", "cli", "calib")
# What each layer may import besides itself (``s1omni.calib`` is the cases' data, below everything).
ALLOWED = {
    "runtime": {"calib"},  # the gates an engine's verdict must still meet (s1omni.runtime.engine)
    "export": {"runtime", "calib"},
    "server": {"runtime"},
    "bench": {"runtime", "calib"},
    "cli": {"runtime", "export", "server", "bench", "calib"},
    "calib": set(),
}
# Each family's modules, in every layer: none of them imports another family's.
FAMILY_MODULES = {
    "vela2": ("s1omni.runtime.vela2", "s1omni.runtime.synth.vela2", "s1omni.export.vela2_export", "s1omni.server.families.vela"),
    "omnijev": (
        "s1omni.runtime.omnijev",
        "s1omni.runtime.synth.omnijev",
        "s1omni.export.omnijev_export",
        "s1omni.server.families.omnijev",
    ),
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """``s1omni.<folder>.<...>`` -> its source file, for every module of the mapped folders."""
    modules = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            parts = ["s1omni", *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            return True
    return False


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (file ``path``) imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from package import module`` imports the module; ``from module import name`` the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        if _type_checking_only(node, parents):
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer(module: str) -> str:
    return module.split(".")[1]


def family_of(module: str) -> str | None:
    for family, prefixes in FAMILY_MODULES.items():
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return family
    return None


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def bad_layering(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer(target) != layer(module) and layer(target) not in ALLOWED[layer(module)]
    ]


def cross_family(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if family_of(module) and family_of(target) and family_of(module) != family_of(target)
    ]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_lazy_and_relative_imports(graph: dict[str, set[str]]) -> None:
    assert "s1omni.runtime.families" in graph["s1omni.runtime.package"]  # ``from . import families``
    assert "s1omni.runtime.package" in graph["s1omni.runtime.api"]  # imported inside load_model
    assert "s1omni.runtime.api" not in graph["s1omni.runtime.families"]  # under TYPE_CHECKING only


def test_no_import_cycle(graph: dict[str, set[str]]) -> None:
    assert cycle(graph) is None


def test_no_family_imports_another(graph: dict[str, set[str]]) -> None:
    assert all(family_of(prefix) == family for family, prefixes in FAMILY_MODULES.items() for prefix in prefixes)
    assert cross_family(graph) == []


def test_layers_import_only_downwards(graph: dict[str, set[str]]) -> None:
    assert bad_layering(graph) == []


def test_each_rule_rejects_a_bad_import(tmp_path: Path) -> None:
    """A copy of the tree with one bad import added per rule: each is reported."""
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            copy = tmp_path / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")

    def add(relative: str, line: str) -> dict[str, set[str]]:
        path = tmp_path / relative
        path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _bad():\n    {line}\n", encoding="utf-8")
        return import_graph(tmp_path)

    assert set(cycle(add("runtime/package.py", "from .engine import read_manifest"))) == {"s1omni.runtime.package", "s1omni.runtime.engine"}
    assert "s1omni.runtime.omnijev.heads imports s1omni.runtime.vela2.heads" in cross_family(
        add("runtime/omnijev/heads.py", "from ..vela2.heads import read_tensors")
    )
    assert "s1omni.runtime.digest imports s1omni.server.wire" in bad_layering(add("runtime/digest.py", "from s1omni.server import wire"))
    assert "s1omni.server.app imports s1omni.export.build" in bad_layering(add("server/app.py", "from s1omni.export.build import build"))
