"""Imports flow one way (README "Code map"): a package imports only the layers below it.

core <- hardware <- ir <- front, geometry <- cost <- plan <- rules <- solver <- app <- ui; the
emulator sits beside the solver and reads the IR, the geometry, the plan data, the chip and
the Counters record, never the cost model or a planner.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (package, layer): a module may import packages of a strictly lower layer, or its own package
LAYERS: dict[str, int] = {
    "planner.core": 0,
    "hardware": 1,
    "planner.ir": 2,
    "planner.front": 3, "planner.geometry": 3,
    "planner.cost": 4,
    "planner.plan": 5,
    "rules": 6,
    "solver": 7,
    "emulator": 7,
    "planner.app": 8,
    "planner.ui": 9,
    "fuseplan": 10,
}
# what the emulator may read of the packages below it (its clock must be its own)
EMULATOR_MAY_IMPORT = ("planner.core", "hardware", "planner.ir", "planner.geometry",
                       "planner.plan", "planner.cost.counters")


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


def _violations() -> list[str]:
    found = []
    for pkg_dir in ("planner", "hardware", "rules", "solver", "emulator", "fuseplan"):
        for path in sorted((ROOT / pkg_dir).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mine = _package(module)
            if mine is None:
                continue
            for line, target in _imports(path):
                theirs = _package(target)
                if theirs is None or theirs == mine:
                    continue
                if mine == "emulator":
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
    f.write_text("def f():\n    from planner.app.api import solve\n    return solve\n")
    assert _imports(f) == [(2, "planner.app.api")]
    assert _package("planner.app.api") == "planner.app"
    assert LAYERS[_package("planner.app.api") or ""] > LAYERS["planner.ir"]
