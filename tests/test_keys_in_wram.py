"""Kept keys in WRAM (Mode.keys_in_wram): a prefill group split over the clusters, its row
tiles in order, keeps the keys and values its causal attention reads a prefix of in the
cores' WRAM, each cluster the heads its share of the query heads reads, instead of whole in
every cluster's SRAM (planner.geometry.cluster_split.wram_keys).

Keys that outgrow a cluster's SRAM whole then stay on chip: the layer reads its input once
and writes its output once, where held in SRAM they do not fit at any height and spilled
they go to DRAM and come back for every later tile. Each cluster's share by heads (and by
the key heads its query heads read, grouped-query); hand plans run as predicted, byte for
byte, with the SRAM peak and the WRAM the keys take measured by the emulator; plan files
state the mode and refuse it where it cannot run; `fuseplan solve` takes it.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.cost.cluster_split import split_key_bytes
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.geometry.attention import kept_prefix
from fuseplan.planner.geometry.cluster_split import cluster_split, wram_keys
from fuseplan.planner.geometry.halo_reuse import ReuseGrid, kept_outgrow
from fuseplan.planner.geometry.regions import Tile, group_chains, group_io
from fuseplan.planner.plan.json_io import plan_to_json
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app
from tests.hand import assert_refused, assert_verifies, hand_plan
from tests.models import causal_encoder, edited_rules, llama_decoder, save

pytestmark = pytest.mark.xdist_group("keys_in_wram")

TOKENS = 1024
# a cluster's SRAM below the layer's keys and values whole (1 MiB at 1,024 tokens, 256 wide)
CHIP = ["sram.bytes=512KiB"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(causal_encoder(tokens=TOKENS, width=256, heads=8),
                tmp_path_factory.mktemp("keys_in_wram"), "gpt")


@pytest.fixture(scope="module")
def layer(model: Path) -> api.Problem:
    return api.prepare(str(model), overrides=CHIP)


def _names(problem: api.Problem) -> tuple[str, ...]:
    return tuple(lay.name for lay in problem.graph.layers)


def _placement(problem: api.Problem, height: int, **mode: bool) -> Placement:
    return Placement.of(_names(problem), Tile(1, height, 1), halo_reuse=True,
                        cluster_split=True, **mode)


def test_each_cluster_keeps_its_query_heads_keys(layer: api.Problem, tmp_path: Path) -> None:
    """Eight heads over four clusters: each keeps two heads' keys and values, a quarter of
    them. Grouped-query: eight query heads reading two key heads leave one key head to a
    cluster (half); six over two leave one cluster the query heads 2 and 3, which read
    both key heads (all of them)."""
    g = layer.graph
    io = group_io(g, _names(layer))
    split = cluster_split(g, io)
    assert split is not None
    kept = kept_prefix(g, io)
    assert len(kept) == 2
    assert wram_keys(g, io, split, 4) == {t: g.elems(t) // 4 for t in kept}
    for heads, share in ((8, Fraction(1, 2)), (6, Fraction(1))):
        gqa = api.prepare(str(save(llama_decoder(tokens=512, width=16 * heads, heads=heads,
                                                 kv_heads=2), tmp_path, f"gqa{heads}")))
        names = tuple(lay.name for lay in gqa.graph.layers)
        gio = group_io(gqa.graph, names)
        gsplit = cluster_split(gqa.graph, gio)
        assert gsplit is not None
        found = wram_keys(gqa.graph, gio, gsplit, 4)
        assert found is not None and len(found) == 2
        assert all(n == gqa.graph.elems(t) * share for t, n in found.items())


@pytest.mark.parametrize("height", [64, 128])
def test_the_layer_reads_its_input_once_keys_in_wram(layer: api.Problem, height: int) -> None:
    """Held in SRAM the keys outgrow a cluster at any height; in WRAM the layer runs
    split with every tensor through DRAM once (its input, weights and output: the floor),
    its SRAM peak without the kept keys, the WRAM they take the most the busiest cluster
    keeps after a tile; verified, the emulator finding no overflow."""
    g, chip = layer.graph, layer.chip
    io = group_io(g, _names(layer))
    assert kept_outgrow(g, io, chip)
    held = hand_plan(layer, [_placement(layer, height)])
    assert recheck(g, held, chip, layer.ruleset)  # SRAM refuses the keys whole
    plan = hand_plan(layer, [_placement(layer, height, keys_in_wram=True)])
    (group,) = plan.groups
    p = group.predicted
    dt = chip.dtype_bytes
    assert p.dram_read_bytes == g.elems("input") * dt + weight_bytes(g, io.weights, chip)
    assert p.dram_write_bytes == g.elems(io.outputs[0]) * dt
    assert p.sram_peak_bytes < held.groups[0].predicted.sram_peak_bytes
    assert p.sram_peak_bytes <= chip.sram.bytes
    # a quarter of the keys and values, as the second-to-last tile keeps them
    grid = ReuseGrid.of(g, io, group_chains(g, io), group.tile, keys_in_wram=True)
    kv = sum(g.elems(t) for t in kept_prefix(g, io)) * dt
    assert split_key_bytes(g, io, chip, grid) == kv // 4 * (TOKENS - height) // TOKENS
    assert not recheck(g, plan, chip, layer.ruleset)
    assert_verifies(layer, plan)


def test_keys_past_wram_are_refused_alike(model: Path) -> None:
    """With WRAM too small for the weight share and the keys, the planner's capacity check
    and the emulator both refuse the plan, needing the same bytes of each core."""
    small = api.prepare(str(model), overrides=[*CHIP, "wram.bytes=96KiB"])
    plan = hand_plan(small, [_placement(small, 64, keys_in_wram=True)])
    planned = [v for _, v in recheck(small.graph, plan, small.chip, small.ruleset)
               if v.name == "wram"]
    assert len(planned) == 1 and "kept keys" in planned[0].message
    report = api.verify_in_memory(small, plan, seed=3)
    assert report.outputs_match and report.predicted_matches_emulated
    (emulated,) = [v for v in report.capacity_violations if v.level == "wram"]
    assert emulated.needed_bytes == planned[0].needed


def test_plan_files_state_keys_in_wram_and_refuse_it_without(layer: api.Problem, model: Path,
                                                             tmp_path: Path) -> None:
    """The key round-trips through a plan file that `verify` runs; without the split, or
    on a group keeping no keys, it is refused (exit 2), naming the fix."""
    doc = plan_to_json(hand_plan(layer, [_placement(layer, 64, keys_in_wram=True)]))
    assert doc["groups"][0]["keys_in_wram"] is True
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(doc))
    sets = [arg for c in CHIP for arg in ("--set", c)]
    ran = CliRunner().invoke(app, ["verify", str(model), str(good), *sets])
    assert ran.exit_code == 0, ran.output
    unsplit = json.loads(json.dumps(doc))
    del unsplit["groups"][0]["cluster_split"]
    assert_refused(str(model), unsplit, tmp_path, "keys_in_wram keeps a split group's")
    names = _names(layer)
    cut = names.index("residual30") + 1  # the attention's half, then the MLP's
    parted = plan_to_json(hand_plan(layer, [
        Placement.of(part, Tile(1, 64, 1), halo_reuse=True, cluster_split=True,
                     keys_in_wram=keeps)
        for part, keeps in ((names[:cut], True), (names[cut:], False))]))
    parted["groups"][1]["keys_in_wram"] = True
    assert_refused(str(model), parted, tmp_path, "this group keeps none such")


def test_solve_keeps_the_keys_in_wram(model: Path, tmp_path: Path) -> None:
    """`fuseplan solve` plans the layer as one split group with its keys in WRAM at the
    floor, and `verify` agrees; with `search.keys_in_wram` off it spills them (three times
    the bytes)."""
    sets = [arg for c in CHIP for arg in ("--set", c)]
    plan_file = tmp_path / "plan.json"
    solved = CliRunner().invoke(app, ["solve", str(model), *sets, "-o", str(plan_file)])
    assert solved.exit_code == 0, solved.output
    doc = json.loads(plan_file.read_text())
    (group,) = doc["groups"]
    assert group["keys_in_wram"] and group["cluster_split"] and group["halo"] == "reuse"
    totals = doc["totals"]
    assert totals["dram_bytes"] == totals["compulsory_dram_bytes"]
    ran = CliRunner().invoke(app, ["verify", str(model), str(plan_file), *sets])
    assert ran.exit_code == 0, ran.output
    rules = edited_rules(tmp_path, {"keys_in_wram: true": "keys_in_wram: false"})
    off = api.plan_problem(api.prepare(str(model), str(rules), overrides=CHIP), "cpsat")
    assert off.totals.dram_bytes > 2 * totals["dram_bytes"]
    assert not any(g.placement.keys_in_wram for g in off.groups)
