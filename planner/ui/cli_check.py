"""`fuseplan check MANIFEST.yaml [--junit OUT.xml] [--json]`: verify every entry of a manifest
(planner.app.check), for CI. Exit 0 all pass, 1 any mismatch, 2 a bad manifest or entry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fuseplan.planner.core.files import write_atomic
from fuseplan.planner.ui.cli_common import (
    JsonOpt,
    Output,
    check_files,
    emit,
    err,
    guarded,
    say,
    show,
    yaml_in,
)

JunitOpt = Annotated[Path | None, typer.Option(
    "--junit", help="Write the results as JUnit XML here (one testcase per entry).")]


@guarded
def check(manifest: Path, junit: JunitOpt = None, as_json: JsonOpt = False) -> None:
    """Verify every (model, plan, golden, chip) entry of MANIFEST (YAML: a list `checks:` of
    entries with model, plan and optionally golden, chip, seed, weights, name; see
    examples/check.yaml); exit 0 when all pass, 1 when any fails, 2 on a bad manifest or
    entry."""
    from fuseplan.planner.app.check import (
        exit_code,
        junit_xml,
        load_manifest,
        manifest_inputs,
        run_check,
    )

    check_files([yaml_in(manifest, "MANIFEST", "check manifest")],
                [Output("--junit", junit, "JUnit XML file")])
    entries = load_manifest(manifest)
    # no output may overwrite a file an entry reads (and a missing file is said now)
    check_files([yaml_in(manifest, "MANIFEST", "check manifest"), *manifest_inputs(entries)],
                [Output("--junit", junit, "JUnit XML file")])
    results = []
    for i, entry in enumerate(entries):
        if not as_json:
            err.print(f"[{i + 1}/{len(entries)}] verifying {entry.name} ...", markup=False,
                      highlight=False)
        results.append(run_check(entry))
    if junit is not None:
        write_atomic(junit, junit_xml(str(manifest), results), "JUnit XML file")
    code = exit_code(results)
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "error")}
    if as_json:
        emit({"manifest": str(manifest), "checks": [r.to_json() for r in results],
              **counts, "junit": None if junit is None else str(junit), "exit": code})
    else:
        for r in results:
            show(f"{r.status.upper():6s} {r.name} ({r.seconds:.2f} s): {r.message}")
        show(f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} "
             f"bad input" + ("" if junit is None else f"; JUnit XML written to {junit}"))
    bad = [r for r in results if r.status == "error"]
    if bad:  # exit 2 says why in one paragraph on stderr, as every bad input does
        say(f"{len(bad)} of the {len(results)} checks of {manifest} are bad input; the "
            f"first, {bad[0].name}: {bad[0].message}", "error")
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``check`` command to ``app``."""
    app.command("check")(check)
