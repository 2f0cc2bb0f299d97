"""Imports flow one way (README "Code map"): a package imports only the layers below it.

core <- hardware <- ir <- front, geometry <- cost <- plan <- rules <- solver <- app <- ui; the
emulator sits beside the solver and reads the IR, the geometry, the plan data, the chip and
the Counters record, never the cost model or a planner.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

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
