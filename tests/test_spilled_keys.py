"""Kept keys spilled (Mode.keys_spilled, planner.cost.spilled_keys): a prefill group that
makes its causal attention's keys and values writes them to DRAM as its row tiles make
them and reads back, in each later tile, the rows earlier tiles made, so keys that outgrow
the chip no longer split the group at the attention.

Hand plans at several heights run as predicted byte for byte with the byte identities of
the mode (input read once, output written once, k and v written once, tile i reading back
the rows before it) and hold less than the same tiles keeping the keys; the searches offer
it where the kept keys do not fit one cluster's SRAM and take it on a two-block prefill
(one group, fewer bytes than with `search.keys_spilled` off, both verified); plan files
state it with `"keys_spilled": true`, refused where it cannot run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.geometry.halo_reuse import GROWING_TILES, kept_outgrow
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.plan.json_io import plan_to_json
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app
from fuseplan.solver.spilled_keys import spilled_heights
from tests.hand import assert_refused, assert_verifies, hand_plan
from tests.models import causal_encoder, edited_rules, rules_keeping_keys_in_sram, save

pytestmark = pytest.mark.xdist_group("spilled_keys")

TOKENS = 512


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(causal_encoder(tokens=TOKENS, width=32, heads=2),
                tmp_path_factory.mktemp("spill"), "encoder")


@pytest.fixture(scope="module")
def encoder(model: Path) -> api.Problem:
    return api.prepare(str(model), overrides=["sram.bytes=256KiB"])


def _first_half(problem: api.Problem) -> tuple[list[str], str]:
    """A block's norm .. residual add (the attention's half) and its attention."""
    g = problem.graph
    names = [lay.name for lay in g.layers]
    mix = next(n for n in names if g.layer(n).op == "FlashAttention")
    add = next(n for n in names[names.index(mix):] if g.layer(n).op == "Add")
    return names[:names.index(add) + 1], mix


@pytest.mark.parametrize(("height", "double_buffered"),
                         [(1, False), (64, False), (64, True), (100, True)])
def test_spilled_keys_run_as_predicted(encoder: api.Problem, height: int,
                                       double_buffered: bool) -> None:
    """Input once, output once, k and v written once, each tile reading back the rows of
    them earlier tiles made (a tile starting at row a: a rows); fewer bytes on chip than
    the same tiles holding every key; verified, with one input buffer or two."""
    g = encoder.graph
    half, mix = _first_half(encoder)
    kv = g.layer(mix).fmap_inputs[1:]
    tile = Tile(1, height, 1)
    spilled = hand_plan(encoder, [Placement.of(half, tile, True, double_buffered,
                                               halo_reuse=True, keys_spilled=True)])
    held = hand_plan(encoder, [Placement.of(half, tile, True, double_buffered,
                                            halo_reuse=True)])
    group = next(gr for gr in spilled.groups if mix in gr.layers)
    io = group_io(g, group.layers)
    p = group.predicted
    back = sum(g.elems(t) // TOKENS * a for t in kv for a in range(0, TOKENS, height))
    assert p.dram_read_bytes - p.weight_read_bytes == 2 * (g.elems("input") + back)
    assert p.dram_write_bytes == 2 * (g.elems(io.outputs[0]) + sum(g.elems(t) for t in kv))
    assert p.sram_peak_bytes < held.groups[0].predicted.sram_peak_bytes
    assert group.placement.keys_spilled and not held.groups[0].placement.keys_spilled
    assert_verifies(encoder, spilled)


def test_the_search_spills_keys_that_outgrow_the_chip(tmp_path: Path) -> None:
    """Two blocks at 2,048 tokens on 256 KiB of SRAM: k and v (512 KiB a layer) do not fit
    held, so each attention was a group of its own; with 64 KiB of WRAM a core, nor do a
    cluster's heads' share of them in WRAM (Mode.keys_in_wram); `fuseplan solve` spills them
    (its table says so), fewer bytes than with the rules' `search.keys_spilled` off;
    `explain` re-checks the spilled groups clean; both plans verify."""
    path = save(causal_encoder(tokens=2048, width=64, heads=2, blocks=2), tmp_path, "long")
    overrides = ["sram.bytes=256KiB", "wram.bytes=64KiB"]
    chip = [arg for c in overrides for arg in ("--set", c)]
    plan_file = tmp_path / "plan.json"
    solved = CliRunner().invoke(app, ["solve", str(path), *chip, "-o", str(plan_file)])
    assert solved.exit_code == 0, solved.output
    assert "keys spilled" in " ".join(solved.output.split())
    problem = api.prepare(str(path), overrides=overrides)
    g = problem.graph
    attentions = {lay.name for lay in g.layers if lay.op == "FlashAttention"}
    doc = json.loads(plan_file.read_text())
    spilling = [gr["layers"] for gr in doc["groups"] if gr.get("keys_spilled")]
    assert spilling and all(attentions & set(layers) for layers in spilling)
    assert all(kept_outgrow(g, group_io(g, layers), problem.chip) for layers in spilling)
    assert not api.explain(str(path), plan_file, None, None, None, overrides)["violations"]
    ran = CliRunner().invoke(app, ["verify", str(path), str(plan_file)])
    assert ran.exit_code == 0, ran.output
    off = api.prepare(str(path), rules_keeping_keys_in_sram(tmp_path), overrides=overrides)
    without = api.plan_problem(off, "cpsat")
    assert not any(gr.placement.keys_spilled for gr in without.groups)
    assert doc["totals"]["dram_bytes"] < without.totals.dram_bytes
    assert_verifies(off, without)


def test_spilled_heights_offer_every_tile_count() -> None:
    """One height per tile count from 2 to GROWING_TILES, the shortest making it, tallest
    first; heights a map cannot take are not offered."""
    heights = list(range(4096, 0, -1))
    offered = spilled_heights(heights)
    counts = [-(-4096 // th) for th in offered]
    assert counts == list(range(2, GROWING_TILES + 1))
    assert all(-(-4096 // (th - 1)) > count for th, count in zip(offered, counts, strict=True))
    assert offered[:3] == [2048, 1366, 1024]
    assert spilled_heights([10, 9, 8, 7, 6, 5, 4, 3, 2, 1]) == [5, 4, 3, 2, 1]
    assert spilled_heights([8, 4, 2, 1]) == [4, 2, 1]
    assert spilled_heights([1]) == spilled_heights([]) == []


def test_the_search_spills_at_tile_counts_between_halvings(tmp_path: Path) -> None:
    """The two blocks at 2,048 tokens on 240 KiB, the rules' `search.keys_in_wram` off (in
    WRAM the keys would stay on chip): the tallest spilled tile that fits is 228 rows (9
    tiles), not a halving of the map; the search takes it, one group reading the keys back
    4 times, fewer bytes than the same group at the tallest halving that fits (128 rows, 16
    tiles, 7.5 times), and it verifies."""
    path = save(causal_encoder(tokens=2048, width=64, heads=2, blocks=2), tmp_path, "long")
    rules = edited_rules(tmp_path, {"keys_in_wram: true": "keys_in_wram: false"})
    problem = api.prepare(str(path), str(rules), overrides=["sram.bytes=240KiB"])
    plan = api.plan_problem(problem, "cpsat")
    (group,) = plan.groups
    assert group.placement.keys_spilled and group.tile.h == 228
    layers = [lay.name for lay in problem.graph.layers]
    halving = hand_plan(problem, [Placement.of(layers, Tile(1, 128, 1), True, halo_reuse=True,
                                               keys_spilled=True)])
    assert not recheck(problem.graph, halving, problem.chip, problem.ruleset)
    assert plan.totals.dram_bytes < halving.totals.dram_bytes
    assert_verifies(problem, plan)


def test_plan_files_state_spilled_keys(encoder: api.Problem, model: Path,
                                       tmp_path: Path) -> None:
    """The key round-trips through a plan file that `verify` runs; a group without kept
    keys (the attention alone, its keys loaded) or recomputing its halos is refused, exit
    2, naming the fix."""
    half, mix = _first_half(encoder)
    plan = hand_plan(encoder, [Placement.of(half, Tile(1, 64, 1), halo_reuse=True,
                                            keys_spilled=True)])
    doc = plan_to_json(plan)
    (stated,) = [gr for gr in doc["groups"] if mix in gr["layers"]]
    assert stated["keys_spilled"] is True and stated["halo"] == "reuse"
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(doc))
    ran = CliRunner().invoke(app, ["verify", str(model), str(good), "--set",
                                   "sram.bytes=256KiB"])
    assert ran.exit_code == 0, ran.output
    stated["halo"] = "recompute"
    assert_refused(str(model), doc, tmp_path, 'keys_spilled runs row tiles in order')
    alone = plan_to_json(hand_plan(encoder, [Placement.of((mix,), Tile(1, 64, 1))]))
    next(gr for gr in alone["groups"] if gr["layers"] == [mix])["keys_spilled"] = True
    assert_refused(str(model), alone, tmp_path, "this group makes none such")
