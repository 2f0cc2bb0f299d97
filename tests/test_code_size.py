"""Modules that show their job: none over 800 lines (but the emulator's kernel table, one
entry per op) and no function whose cyclomatic complexity passes 30 (radon's measure: a
function that branches more than that does several jobs)."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("planner", "rules", "solver", "hardware", "emulator", "fuseplan")
MAX_LINES = 800
MAX_COMPLEXITY = 30
# the table of NumPy kernels, one short function per op: long because the op set is
LONG_ALLOWED = {"emulator/kernels.py"}


def _sources() -> list[Path]:
    return sorted(p for d in FOLDERS for p in (ROOT / d).rglob("*.py"))


def _too_long(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        lines = len(path.read_text().splitlines())
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        if lines > MAX_LINES and name not in LONG_ALLOWED:
            out.append(f"{name}: {lines} lines")
    return out


def _too_complex(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        for block in cc_visit(path.read_text()):
            for fn in [block, *getattr(block, "methods", [])]:
                if fn.complexity > MAX_COMPLEXITY:
                    out.append(f"{name}:{fn.lineno} {fn.fullname}: {fn.complexity}")
    return sorted(set(out))


def test_no_module_over_800_lines() -> None:
    long = _too_long(_sources())
    assert not long, "split by job:\n" + "\n".join(long)


def test_no_function_over_complexity_30() -> None:
    found = _too_complex(_sources())
    assert not found, "split by meaning:\n" + "\n".join(found)


def test_the_checks_see_a_long_module_and_a_branchy_function(tmp_path: Path) -> None:
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    branchy = tmp_path / "branchy.py"
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(MAX_COMPLEXITY + 1))
    branchy.write_text("def f(x):\n" + body + "    return -1\n")
    assert _too_long([long]) == [f"{long}: {MAX_LINES + 1} lines"]
    assert len(_too_complex([branchy])) == 1 and _too_complex([branchy])[0].endswith(": 32")
