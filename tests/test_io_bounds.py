"""What a plan is measured against besides its floor (planner.app.io_bounds, issue 46):
each fused attention's FlashAttention count at its group's tiling, a prefill's I/O bound and
a decode step's KV caches, in `solve --json`, the plan file, `solve`'s lines and the HTML
report, each the same numbers."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.geometry.attention import alone_traffic, attention_traffic
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.ui.cli import app
from fuseplan.planner.ui.cli_tables import attention_lines
from fuseplan.planner.ui.report import load_problem_plan, write_report
from tests.models import causal_encoder, rules_keeping_keys_in_sram, save

DECODE = Path(__file__).resolve().parent.parent / "examples" / "exports" / "zoo2026" \
    / "llama_decode.onnx"
# a lone attention: its q, keys and values come from DRAM, its output goes back
SMALL = ["sram.bytes=48KiB"]


def test_a_prefills_bound_is_its_floor_and_each_attentions_io(tmp_path: Path) -> None:
    """A causal prefill: `solve --json` and the plan file state the I/O bound (the floor
    plus every fused attention's FlashAttention I/O as if alone at the plan's query rows)
    and each attention's analytic count where it crosses its group's boundary, as the
    geometry counts them; read back from the file, `solve`'s lines and the HTML report show
    the same bound. (Kept keys past SRAM neither spilled nor in WRAM, so that the attention
    is a group of its own: with them the layer is one group at its floor.)"""
    model = save(causal_encoder(tokens=512, width=64, heads=2), tmp_path, "prefill")
    sets = [a for s in SMALL for a in ("--set", s)]
    sets += ["--rules", str(rules_keeping_keys_in_sram(tmp_path))]
    plan_file = tmp_path / "plan.json"
    ran = CliRunner().invoke(app, ["solve", str(model), *sets, "-o", str(plan_file), "--json"])
    assert ran.exit_code == 0, ran.output
    doc = json.loads(ran.output)
    assert json.loads(plan_file.read_text())["io_bounds"] == doc["io_bounds"]
    problem = api.prepare(str(model), overrides=SMALL)
    g, dt = problem.graph, problem.chip.dtype_bytes
    alone = counted = 0
    for gr in doc["groups"]:
        io = group_io(g, tuple(gr["layers"]))
        t = Tile(gr["tile"]["n"], gr["tile"]["h"], gr["tile"]["w"])
        alone += sum(a.total for a in alone_traffic(
            g, io, t, dt, gr["halo"] == "reuse" and not gr.get("keys_spilled", False)))
        for a in attention_traffic(g, io, t, dt):
            if a.total:
                counted += 1
                (row,) = [r for r in doc["io_bounds"]["attentions"] if r["layer"] == a.layer]
                assert (row["group"], row["analytic_bytes"], row["kv_read_bytes"]) == (
                    gr["id"], a.total, a.kv_reads)
                assert row["group_dram_bytes"] == gr["predicted"]["dram_read_bytes"] \
                    + gr["predicted"]["dram_write_bytes"]
    assert counted == len(doc["io_bounds"]["attentions"]) >= 1
    bound = doc["totals"]["compulsory_dram_bytes"] + alone
    assert alone > 0 and doc["io_bounds"]["io_bound_bytes"] == bound
    assert doc["io_bounds"]["x_io_bound"] == round(doc["totals"]["dram_bytes"] / bound, 4)
    assert "kv_cache" not in doc["io_bounds"]
    # read back from its file, io_bounds is not (derived from the groups again): solve's
    # lines and the report show the same bound
    problem, plan = load_problem_plan(str(model), plan_file)
    assert plan.io_bounds is None
    assert f"the plan moves {doc['totals']['dram_bytes'] / bound:.2f}× it" in " ".join(
        " ".join(attention_lines(problem, plan)).split())
    page = tmp_path / "report.html"
    write_report(problem, plan, page, verify=False)
    assert "× I/O bound" in page.read_text()


def test_a_decode_step_states_its_caches_and_ideal() -> None:
    """A decode step (the zoo's Llama with a 1,024-position cache per layer): no prefill
    bound, its caches read once and only the new positions written, its ideal the floor."""
    problem = api.prepare(str(DECODE))
    plan = api.plan_problem(problem)
    bounds = plan.io_bounds
    assert bounds is not None and bounds.io_bound_bytes is None and bounds.cache is not None
    g, dt = problem.graph, problem.chip.dtype_bytes
    assert bounds.cache.caches == len(g.appends) == 4
    assert bounds.cache.read_bytes == sum(g.elems(a.cache) for a in g.appends) * dt
    assert bounds.cache.new_bytes == sum(g.elems(a.new) for a in g.appends) * dt
    assert bounds.cache.ideal_bytes == plan.compulsory_dram_bytes == plan.totals.dram_bytes
