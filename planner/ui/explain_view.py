"""`fuseplan explain`'s text answer (its --json is planner.app.explain.explain_doc): what
binds each boundary as tables, needed against available in human bytes, and what to change."""

from __future__ import annotations

from typing import Any

from fuseplan.planner.core.units import fmt_bytes
from fuseplan.planner.ui.cli_common import out, show
from fuseplan.planner.ui.tables import Col, table


def _binds_rows(boundaries: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per violation that binds a boundary (its rule, numbers and fix)."""
    rows: list[tuple[str, ...]] = []
    for b in boundaries:
        for v in b.get("binds", ()):
            rows.append((str(b["group"]), b["next_layer"],
                         f"{v['rule']} {v['name']}: {v['message']}",
                         v["shown"]["needed"], v["shown"]["allowed"],
                         v["fix"]))
    return rows


def _print_layer(doc: dict[str, Any]) -> None:
    lay = doc["layer"]
    n = len(lay["group_layers"])
    show(f"layer {lay['name']} is in group {lay['group']} ({n} layer{'s' * (n != 1)}, "
         f"{lay['mode']}, tile {lay['tile']})")
    for m in lay["memories"]:
        share = m["needed"] / m["available"] if m["available"] else 0
        show(f"{m['memory'].upper()} per {m['per']}: needs {fmt_bytes(m['needed'])} of "
             f"{fmt_bytes(m['available'])} ({share:.0%})")
    for b in doc["boundaries"]:
        if b["group"] == lay["group"] and b.get("lift"):
            show(f"group {b['group']} would take in {b['next_layer']} with: "
                 + "; ".join(b["lift"]))
    if not doc["boundaries"]:
        show("nothing binds it: its group ends where the model does")


def print_explain(doc: dict[str, Any]) -> None:
    """The boundaries (why each group stops), what binds them with the numbers and a fix,
    and the re-check of every group."""
    if "layer" in doc:
        _print_layer(doc)
    why = [(str(b["group"]), b["next_layer"],
            "\n".join(r for r in b["reasons"]) if not b.get("binds")
            else f"{len(b['binds'])} rule{'s' * (len(b['binds']) != 1)} bind (below)")
           for b in doc["boundaries"]]
    if why:
        out.print(table(out, "why each group stops where it does",
                        [Col("group", num=True), Col("before layer", max_width=24),
                         Col("why", prose=True)], why))
    binds = _binds_rows(doc["boundaries"])
    if binds:
        out.print(table(out, "what binds, and what would lift it",
                        [Col("group", num=True), Col("before layer", wide=True, max_width=24),
                         Col("rule: what it says", prose=True), Col("needed", num=True),
                         Col("has", num=True), Col("change", prose=True)],
                        binds))
    if doc["violations"]:
        out.print(table(out, "VIOLATIONS: groups the rules or the chip refuse",
                        [Col("group", num=True), Col("rule"), Col("needed", num=True),
                         Col("has", num=True), Col("what", wide=True, prose=True),
                         Col("change", prose=True)],
                        [(str(v["group"]), f"{v['rule']} {v['name']}",
                          v["shown"]["needed"], v["shown"]["allowed"],
                          v["message"], v["fix"]) for v in doc["violations"]]))
    else:
        show("every group passes every enabled rule and fits the chip")
    if binds or doc["violations"]:
        show("change: `--set KEY=SIZE` overrides a chip capacity; in the rules file, `rules: "
             "KEY: {PARAM: VALUE}` sets a rule's parameter and `KEY: {enabled: false}` turns "
             "it off (`fuseplan rules check` shows the settings).")
