"""`fuseplan check MANIFEST.yaml`: verify a list of plans in one go, for CI.

A manifest lists what to verify; paths are relative to the manifest's folder::

    # examples/check.yaml
    checks:
      - name: chain_cnn                 # optional (default: the plan's path)
        model: chain_cnn/model.onnx     # a path or zoo:NAME
        plan: chain_cnn/plan.json
        golden: chain_cnn/golden.npz    # optional: compare with stored tensors
        chip: chain_cnn/hardware.yaml   # optional: the chip to emulate on (default the plan's)
        seed: 0                         # optional (without a golden file)
        weights: auto                   # optional: auto | model | random

Each entry is verified as `fuseplan verify` does (planner.app.verify_file). The answer: exit
0 when every entry passes, 1 when any fails (and none is bad input), 2 when the manifest or
an entry's files are bad input. JUnit XML (one testcase per entry, a <failure> naming what
disagrees first, an <error> for bad input) lets CI systems show the result.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fuseplan.planner.core.errors import InputError, PlanningError
from fuseplan.planner.core.files import Input
from fuseplan.planner.core.yamlio import build_dataclass, load_yaml

MAX_CHECKS = 1000  # entries one manifest may list


@dataclass(frozen=True)
class CheckEntry:
    """One plan to verify: the manifest entry's keys."""

    model: str
    plan: str
    name: str | None = None
    golden: str | None = None
    chip: str | None = None
    seed: int = field(default=0, metadata={"ge": 0, "le": 2**32 - 1})
    weights: Literal["auto", "model", "random"] = "auto"


@dataclass(frozen=True)
class Manifest:
    """A manifest file: its entries, with paths as written."""

    checks: tuple[CheckEntry, ...]


@dataclass(frozen=True)
class Resolved:
    """An entry with its paths resolved against the manifest's folder."""

    name: str
    model: str
    plan: Path
    golden: Path | None
    chip: str | None
    seed: int
    weights: str


@dataclass(frozen=True)
class CheckResult:
    """One entry's outcome: passed, failed (the first thing that disagrees) or error (bad
    input, its message); the verify report's JSON when it ran."""

    name: str
    status: Literal["passed", "failed", "error"]
    message: str
    seconds: float
    report: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """`check --json`'s entry."""
        return {"name": self.name, "status": self.status, "message": self.message,
                "seconds": round(self.seconds, 4), "verify": self.report}


def _resolve(folder: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else folder / p


def _path(folder: Path, value: str | None) -> Path | None:
    return None if value is None else _resolve(folder, value)


def _chip(folder: Path, value: str | None) -> str | None:
    """A chip file path (resolved) or a preset name (kept)."""
    from fuseplan.hardware.chip import _looks_like_path

    if value is None or not _looks_like_path(value):
        return value
    return str(_path(folder, value))


def load_manifest(path: Path) -> list[Resolved]:
    """A manifest's entries, paths resolved (InputError naming FILE:LINE:COL otherwise)."""
    node = load_yaml(path)
    manifest = build_dataclass(Manifest, node, path, "check manifest")
    if not manifest.checks:
        raise InputError(f"{path}: the manifest lists no checks. Add entries under `checks:` "
                         "(each with `model:` and `plan:`).")
    if len(manifest.checks) > MAX_CHECKS:
        raise InputError(f"{path}: the manifest lists {len(manifest.checks)} checks, more than "
                         f"{MAX_CHECKS}. Split it into several manifests.")
    folder = path.parent
    out = []
    for e in manifest.checks:
        model = e.model if e.model.startswith("zoo:") else str(_resolve(folder, e.model))
        out.append(Resolved(e.name or e.plan, model, _resolve(folder, e.plan),
                            _path(folder, e.golden),
                            _chip(folder, e.chip), e.seed, e.weights))
    names = [r.name for r in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"{path}: check names must differ, but {', '.join(twice)} appear "
                         "more than once. Give those entries a `name:` of their own.")
    return out


def manifest_inputs(entries: Sequence[Resolved]) -> list[Input]:
    """Every file the entries read, as inputs (no output may overwrite one)."""
    from fuseplan.planner.plan.schema import MAX_PLAN_BYTES

    files: list[Input] = []
    for i, r in enumerate(entries):
        where = f"checks[{i}]"
        if not r.model.startswith("zoo:"):
            files.append(Input(f"{where}.model", Path(r.model), "ONNX model", None,
                               "Fix the entry's model path."))
        files.append(Input(f"{where}.plan", r.plan, "plan file", MAX_PLAN_BYTES,
                           "Fix the entry's plan path."))
        if r.golden is not None:
            files.append(Input(f"{where}.golden", r.golden, "golden file", None,
                               "Fix the entry's golden path."))
    return files


def run_check(entry: Resolved) -> CheckResult:
    """Verify one entry; bad input and an unexecutable plan become its result."""
    from fuseplan.planner.app import api

    started = time.perf_counter()
    try:
        report = api.verify(entry.model, entry.plan, entry.seed, entry.golden, entry.chip,
                            weights=entry.weights)
    except InputError as exc:
        return CheckResult(entry.name, "error", str(exc), time.perf_counter() - started)
    except PlanningError as exc:  # the emulator cannot run the plan: it does not verify
        return CheckResult(entry.name, "failed", str(exc), time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if report.ok:
        return CheckResult(entry.name, "passed", f"{report.checked_tensors} tensors, bytes, "
                           "stated numbers and cycles agree", seconds, report.to_json())
    why = report.first_output_mismatch or report.first_counter_mismatch \
        or report.first_misstatement or report.cycles.first_off \
        or "; ".join(v.describe() for v in report.capacity_violations)
    return CheckResult(entry.name, "failed", why or "verification failed", seconds,
                       report.to_json())


def exit_code(results: Sequence[CheckResult]) -> int:
    """2 when any entry is bad input, else 1 when any failed, else 0."""
    if any(r.status == "error" for r in results):
        return 2
    return 1 if any(r.status == "failed" for r in results) else 0


# XML 1.0 allows no control characters but tab, newline and carriage return (a node name
# may hold any): they are written as \\uXXXX
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def _xml(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def junit_xml(suite: str, results: Sequence[CheckResult]) -> bytes:
    """The results as JUnit XML: one <testsuite> named `suite`, one <testcase> per entry."""
    failures = sum(r.status == "failed" for r in results)
    errors = sum(r.status == "error" for r in results)
    total = f"{sum(r.seconds for r in results):.3f}"
    counts = {"tests": str(len(results)), "failures": str(failures), "errors": str(errors),
              "time": total}
    root = ET.Element("testsuites", {"name": "fuseplan check", **counts})
    ts = ET.SubElement(root, "testsuite", {"name": _xml(suite), **counts, "skipped": "0"})
    for r in results:
        case = ET.SubElement(ts, "testcase", {"classname": "fuseplan.check",
                                              "name": _xml(r.name), "time": f"{r.seconds:.3f}"})
        if r.status == "failed":
            ET.SubElement(case, "failure", {"message": _xml(r.message), "type": "mismatch"}
                          ).text = _xml(r.message)
        elif r.status == "error":
            ET.SubElement(case, "error", {"message": _xml(r.message), "type": "bad_input"}
                          ).text = _xml(r.message)
        else:
            ET.SubElement(case, "system-out").text = _xml(r.message)
    return bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
