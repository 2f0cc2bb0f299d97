"""Imports flow one way (docs/how/architecture.md, "Code map"): a package imports only the
layers below it.

core <- hardware <- ir <- front, geometry <- cost <- plan <- rules <- solver <- app <- ui; the
emulator sits beside the solver and reads the IR, the geometry, the plan data, the chip and
the Counters record, never the cost model or a planner.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent

# (package, layer): a module may import packages of a strictly lower layer, or its own package
LAYERS: dict[str, int] = {
    "fuseplan.planner.core": 0,
    "fuseplan.hardware": 1,
    "fuseplan.planner.ir": 2,
    "fuseplan.planner.front": 3, "fuseplan.planner.geometry": 3,
    "fuseplan.planner.cost": 4,
    "fuseplan.planner.plan": 5,
    "fuseplan.rules": 6,
    "fuseplan.solver": 7,
    "fuseplan.emulator": 7,
    "fuseplan.planner.app": 8,
    "fuseplan.planner.ui": 9,
    "fuseplan": 10,
}
# what the emulator may read of the packages below it (its clock must be its own)
EMULATOR_MAY_IMPORT = ("fuseplan.planner.core", "fuseplan.hardware", "fuseplan.planner.ir",
                       "fuseplan.planner.geometry", "fuseplan.planner.plan",
                       "fuseplan.planner.cost.counters")
# the repository's folders, each installed under the fuseplan package (pyproject.toml's
# package-dir); nothing else of fuseplan's is importable at top level
FOLDERS = ("planner", "hardware", "rules", "solver", "emulator")


def _package(module: str) -> str | None:
    for pkg in sorted(LAYERS, key=len, reverse=True):
        if module == pkg or module.startswith(pkg + "."):
            return pkg
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):  # function-level imports too
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
    return out


def _module(path: Path) -> str:
    """The import name of a source file of the repository's package folders."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("fuseplan", *parts) if parts[0] in FOLDERS else parts)


def _violations() -> list[str]:
    found = []
    for pkg_dir in (*FOLDERS, "fuseplan"):
        for path in sorted((ROOT / pkg_dir).rglob("*.py")):
            mine = _package(_module(path))
            if mine is None:
                continue
            for line, target in _imports(path):
                theirs = _package(target)
                if theirs is None or theirs == mine:
                    continue
                if mine == "fuseplan.emulator":
                    ok = any(target == p or target.startswith(p + ".")
                             for p in EMULATOR_MAY_IMPORT)
                else:
                    ok = LAYERS[theirs] < LAYERS[mine]
                if not ok:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target}")
    return found


def test_imports_flow_one_way() -> None:
    bad = _violations()
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    """The import walk finds function-level imports (a check that cannot fail proves nothing)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from fuseplan.planner.app.api import solve\n    return solve\n")
    assert _imports(f) == [(2, "fuseplan.planner.app.api")]
    assert _package("fuseplan.planner.app.api") == "fuseplan.planner.app"
    assert LAYERS[_package("fuseplan.planner.app.api") or ""] > LAYERS["fuseplan.planner.ir"]
    assert _module(ROOT / "planner" / "app" / "api.py") == "fuseplan.planner.app.api"


def _imported_modules(path: Path, known: Mapping[str, Path]) -> Iterator[tuple[int, str]]:
    """(line, module) for every module of `known` an import of the file runs, at module or
    function level: ``from a.b import c`` runs ``a.b.c`` when that is a module of its own,
    else ``a.b``; ``import a.b`` runs ``a.b``."""
    for node in ast.walk(ast.parse(path.read_text())):  # function-level imports too
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                target = sub if sub in known else node.module
                if target in known:
                    yield node.lineno, target
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name in known)


def _import_graph(modules: Mapping[str, Path]) -> nx.DiGraph:
    """Module -> module it imports, among `modules` (import name -> file); each edge keeps
    where its first import is (``where``: file:line)."""
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for line, target in _imported_modules(path, modules):
            if target != name and not graph.has_edge(name, target):
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                graph.add_edge(name, target, where=f"{where}:{line}")
    return graph


def _cycles(graph: nx.DiGraph) -> list[str]:
    """Each import cycle of the graph (a strongly connected component of more than one
    module) as a chain of modules, with where each import of the chain is; a component
    larger than its chain names all its modules after it."""
    found = []
    for component in sorted(map(sorted, nx.strongly_connected_components(graph))):
        if len(component) < 2:
            continue
        chain = nx.find_cycle(graph.subgraph(component), source=component[0])
        text = " -> ".join([u for u, _ in chain] + [chain[0][0]])
        text += " (" + ", ".join(graph.edges[u, v]["where"] for u, v in chain) + ")"
        if len(chain) < len(component):
            text += f"; its component: {', '.join(component)}"
        found.append(text)
    return found


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_import_cycles_inside_a_package(folder: str) -> None:
    """No module of a package imports, directly or through others, a module that imports it
    back, counting function-level imports: a circle a function-level import hides still ties
    the modules into one (issue 41)."""
    modules = {_module(p): p for p in sorted((ROOT / folder).rglob("*.py"))}
    cycles = _cycles(_import_graph(modules))
    assert not cycles, f"import cycles in {folder}/:\n" + "\n".join(cycles)


def _late_imports(path: Path, prefix: str) -> list[str]:
    """Imports of modules under `prefix` inside a function or class of the file."""
    found = []
    for scope in ast.walk(ast.parse(path.read_text())):
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for node in ast.walk(scope):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                found += [f"{path.name}:{node.lineno}: {scope.name} imports {n}"
                          for n in names if n == prefix or n.startswith(prefix + ".")]
    return found


def test_emulator_modules_import_one_another_at_module_level() -> None:
    """The mode runners once reached back into emulator.run from inside their functions
    (issue 41); an emulator module names what it needs of another at its top."""
    late = [v for p in sorted((ROOT / "emulator").glob("*.py"))
            for v in _late_imports(p, "fuseplan.emulator")]
    assert not late, "function-level imports inside the emulator:\n" + "\n".join(late)


def test_the_late_import_check_sees_one(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from fuseplan.emulator.tally import Tally\n\n\n"
                 "def f():\n    from fuseplan.emulator.run import emulate\n    return emulate\n")
    assert _late_imports(f, "fuseplan.emulator") == ["m.py:5: f imports fuseplan.emulator.run"]


def test_the_cycle_check_sees_a_planted_cycle(tmp_path: Path) -> None:
    """A cycle closed by a function-level import of a submodule (``from pkg import a``) is
    found and spelled as a chain; a module that only imports into it is not part of it."""
    files = {name: tmp_path / f"{name}.py" for name in ("a", "b", "c")}
    files["a"].write_text("def f():\n    from fuseplan.pkg import b\n    return b\n")
    files["b"].write_text("import json\nfrom fuseplan.pkg.a import f\n")
    files["c"].write_text("from fuseplan.pkg import a\n")
    graph = _import_graph({f"fuseplan.pkg.{name}": path for name, path in files.items()})
    assert _cycles(graph) == ["fuseplan.pkg.a -> fuseplan.pkg.b -> fuseplan.pkg.a "
                              "(a.py:2, b.py:2)"]


def _top_level_imports(path: Path) -> list[str]:
    """Imports of a repository folder by its folder name (``import planner``, ``from rules
    import ...``): run from a checkout they would load a second copy of the module beside
    the installed ``fuseplan.*`` one."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{where}:{line}: imports {target}"
            for line, target in _imports(path) if target.split(".")[0] in FOLDERS]


def test_nothing_imports_the_folders_by_their_own_names() -> None:
    files = [p for d in (*FOLDERS, "fuseplan", "tests", "examples")
             for p in (ROOT / d).rglob("*.py")]
    files += [p for p in (ROOT / "bench").iterdir() if p.suffix in ("", ".py") and p.is_file()]
    bad = [v for p in sorted(files) for v in _top_level_imports(p)]
    assert not bad, "import fuseplan.<folder> instead:\n" + "\n".join(bad)


def test_the_top_level_check_sees_an_old_import(tmp_path: Path) -> None:
    f = tmp_path / "old.py"
    f.write_text("import json\nfrom rules.ruleset import load_rules\nimport fuseplan.rules\n")
    assert [v.split(": ", 1)[1] for v in _top_level_imports(f)] == ["imports rules.ruleset"]


def test_the_package_installs_under_one_top_level_name(tmp_path: Path) -> None:
    """What `pip install .` puts in site-packages: the folders under `fuseplan/` (with their
    YAML presets and the demo model), nothing else at top level (`rules`, `solver` and
    `emulator` are other distributions' import names). setuptools' build_py lays out the
    packages as the wheel does, on a copy of the sources (it writes its egg-info beside)."""
    src = tmp_path / "src"
    for name in (*FOLDERS, "fuseplan"):
        shutil.copytree(ROOT / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    out = tmp_path / "lib"
    done = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()",
                           "build_py", "--build-lib", str(out)], cwd=src,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["fuseplan"]
    installed = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    for folder in FOLDERS:
        assert f"fuseplan/{folder}/__init__.py" in installed, folder
    assert "fuseplan/rules/default.yaml" in installed
    assert "fuseplan/hardware/cluster4x4.yaml" in installed
    assert "fuseplan/planner/data/demo.onnx" in installed
    expected = {f"fuseplan/{p.relative_to(ROOT).as_posix()}" for d in FOLDERS
                for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts}
    assert expected <= installed, sorted(expected - installed)[:5]
