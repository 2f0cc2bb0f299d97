"""A causal fused attention reads its streamed keys and values only up to each tile's last
query row (FlashAttention-2's causal skipping; planner.ir.graph.MapKind.PREFIX).

(The kernel given the prefix equals whole rows: tests/test_online_attention.py.) The
closed-form row sums equal the tiles' boxes; keys a group makes itself stay whole where its
tiles recompute, and are kept as they are made where its tiles reuse (each tile makes its
own rows of them and reads the prefix held); and a lone causal attention at any tile
height, taller or shorter than a key chunk, runs as predicted byte for byte, reading q
once, each tile's prefix of k and v, o once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuseplan.planner.app import api
from fuseplan.planner.app.io_bounds import io_bounds_of
from fuseplan.planner.core.units import fmt_bytes
from fuseplan.planner.cost.bounds import group_floor_bytes
from fuseplan.planner.cost.model import region_sums
from fuseplan.planner.geometry.attention import alone_traffic, attention_traffic
from fuseplan.planner.geometry.halo_reuse import NEVER, AxisSchedule, reuse_heights
from fuseplan.planner.geometry.regions import (
    Tile,
    box_elems,
    group_chains,
    group_io,
    iter_tiles,
    tile_regions,
)
from fuseplan.planner.ir.graph import MapKind
from fuseplan.planner.plan.json_io import plan_to_json
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli_tables import bound_lines
from tests.hand import assert_refused, assert_verifies, hand_plan
from tests.models import causal_encoder, save

pytestmark = pytest.mark.xdist_group("causal_prefix")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> api.Problem:
    path = save(causal_encoder(tokens=512, width=32, heads=2),
                tmp_path_factory.mktemp("prefix"), "encoder")
    return api.prepare(str(path), overrides=["sram.bytes=256KiB"])


def _names(problem: api.Problem, first: str, last: str) -> list[str]:
    names = [lay.name for lay in problem.graph.layers]
    return names[names.index(first):names.index(last) + 1]


def _layer(problem: api.Problem, op: str, after: str | None = None) -> str:
    names = [lay.name for lay in problem.graph.layers]
    start = names.index(after) + 1 if after else 0
    return next(n for n in names[start:] if problem.graph.layer(n).op.startswith(op))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(height=st.integers(1, 512), tail=st.integers(0, 3))
def test_closed_form_row_sums_equal_the_tiles_boxes(encoder: api.Problem, height: int,
                                                     tail: int) -> None:
    """The keys' and values' rows summed over the tiles (one subtraction a tile, from the
    attention output's closed form) equal the boxes tile_regions gives each tile, alone
    and with the layers after the attention in the group (heads merged, projected)."""
    g = encoder.graph
    mix = _layer(encoder, "FlashAttention")
    layers = _names(encoder, mix, mix)
    if tail:  # tokens_first, merge_heads, proj: the anchor moves past the attention
        layers = _names(encoder, mix, _layer(encoder, "MatMul", mix))[:tail + 1]
    io = group_io(g, layers)
    chains = group_chains(g, io)
    lay = g.layer(mix)
    streamed = [t for t in lay.fmap_inputs[1:] if t in io.inputs]
    assert [lay.row_maps[i].kind for i in (1, 2)] == [MapKind.PREFIX] * 2
    tile = Tile(1, height, 1)
    sums = region_sums(g, io, chains, tile, streamed)
    walked = dict.fromkeys(streamed, 0)
    for box in iter_tiles(g, io, tile):
        regions = tile_regions(g, io, box)
        for t in streamed:
            walked[t] += box_elems(g, t, regions[t])
    assert sums == walked
    # each tile's prefix: fewer rows than every tile reading the keys whole, once tiled
    tiles = -(-512 // height)
    assert all(s <= tiles * g.elems(t) for t, s in sums.items())
    assert tiles == 1 or all(s < tiles * g.elems(t) for t, s in sums.items())


def test_keys_a_group_makes_itself_stay_whole(encoder: api.Problem) -> None:
    """Made on chip (the head stretch: qkv, the head split, the attention), the keys are
    made for every query row in each tile, so the group's tiles are translates of each
    other; streamed in, each tile reads its prefix."""
    g = encoder.graph
    mix = _layer(encoder, "FlashAttention")
    stretch = _names(encoder, _layer(encoder, "MatMul"), mix)
    io = group_io(g, stretch)
    k = g.layer(mix).fmap_inputs[1]
    assert k not in io.inputs
    box = next(iter(iter_tiles(g, io, Tile(1, 64, 1))))
    assert tile_regions(g, io, box)[k][2:4] == (0, 512)
    alone = group_io(g, (mix,))
    assert tile_regions(g, alone, (0, 1, 0, 64, 0, 1))[k][2:4] == (0, 64)
    # tiles that reuse keep the keys made so far: a tile's keys are the prefix up to it
    assert tile_regions(g, io, (0, 1, 64, 128, 0, 1), reuse=True)[k][2:4] == (0, 128)


@pytest.mark.parametrize("height", [1, 24, 64, 100])
def test_a_reusing_group_keeps_the_keys_it_makes(encoder: api.Problem, height: int) -> None:
    """A block's first half (the norm, the qkv projection, the head split, the causal
    attention, the head merge, the projection and the residual add) with tiles that run in
    order and keep what later tiles read: each tile makes its own rows of k and v and reads
    the prefix held, so the group reads its input once and writes its output once at any
    tile height, one row included (recomputing tiles read the input again for every tile's
    keys); the last tile holds every key and value. Verified byte for byte."""
    g = encoder.graph
    mix = _layer(encoder, "FlashAttention")
    first_half = _names(encoder, g.layers[0].name, _layer(encoder, "Add", mix))
    q, k, v = g.layer(mix).fmap_inputs
    plan = hand_plan(encoder, [Placement.of(first_half, Tile(1, height, 1), True,
                                            halo_reuse=True)])
    assert_verifies(encoder, plan)
    group = next(gr for gr in plan.groups if mix in gr.layers)
    io = group_io(g, group.layers)
    weights = 2 * sum(int(g.constants[w].size) for w in io.weights)
    assert io.inputs == ("input",) and len(io.outputs) == 1
    assert group.predicted.dram_read_bytes == 2 * g.elems("input") + weights
    assert group.predicted.dram_write_bytes == 2 * g.elems(io.outputs[0])
    assert group.predicted.sram_peak_bytes >= 2 * (g.elems(k) + g.elems(v))
    recompute = hand_plan(encoder, [Placement.of(first_half, Tile(1, height, 1), True)])
    assert recompute.groups[0].predicted.dram_read_bytes > group.predicted.dram_read_bytes
    # the I/O bound counts its attention at one pass: it reads its keys once
    (alone,) = alone_traffic(g, io, group.tile, 2, reuse=True)
    assert alone.passes == 1 and alone.total == 2 * sum(
        g.elems(t) for t in (q, k, v, g.layer(mix).outputs[0]))


def test_growing_schedules_sum_earlier_tiles_by_prefix_sums(encoder: api.Problem) -> None:
    """A reusing group that keeps its keys walks every tile (no interior stands for the
    rest), and sums what earlier tiles made from prefix sums: equal, for every tile, tensor
    and bound, to adding up the tiles' made parts one by one."""
    g = encoder.graph
    mix = _layer(encoder, "FlashAttention")
    io = group_io(g, _names(encoder, g.layers[0].name, _layer(encoder, "Add", mix)))
    rows = AxisSchedule(g, io, group_chains(g, io), 1, 24)
    assert rows.growing and not rows.exact and rows.indices() == list(range(rows.count))
    for t in (g.layer(mix).fmap_inputs[1], "input", io.outputs[0]):
        for i in range(rows.count + 1):
            for x in (0, 5, 24, 100, 511, 512, NEVER):
                brute = sum(max(0, b - max(a, x)) for a, b in (rows.made(j, t)
                                                              for j in range(i)))
                assert rows.made_from(i, t, x) == brute, (t, i, x)
    assert not AxisSchedule(g, group_io(g, (mix,)), group_chains(g, group_io(g, (mix,))),
                            1, 24).growing


def test_unmasked_keys_made_once_where_tiles_reuse(tmp_path: Path) -> None:
    """An attention that is not causal, its keys made in the group: recomputing tiles make
    them from the whole input in every tile; reusing tiles make them in the first and keep
    them, reading the input once, so the searches offer reuse at the halvings of the map
    (a UNet's attention that fits in two tiles, not one). Verified."""
    path = save(causal_encoder(tokens=512, width=32, heads=2, mask="none"), tmp_path, "open")
    problem = api.prepare(str(path), overrides=["sram.bytes=256KiB"])
    g = problem.graph
    mix = _layer(problem, "FlashAttention")
    first_half = _names(problem, g.layers[0].name, _layer(problem, "Add", mix))
    io = group_io(g, first_half)
    assert reuse_heights(g, io, list(range(512, 0, -1)), problem.chip) == \
        [512, 256, 128, 64, 32, 16, 8]
    reuse, recompute = (hand_plan(problem, [Placement.of(first_half, Tile(1, 256, 1), True,
                                                         halo_reuse=r)]) for r in (True, False))
    group = reuse.groups[0].predicted
    weights = 2 * sum(int(g.constants[w].size) for w in io.weights)
    assert group.dram_read_bytes == 2 * g.elems("input") + weights
    assert recompute.groups[0].predicted.dram_read_bytes > group.dram_read_bytes
    assert_verifies(problem, reuse)


def test_tiles_reuse_no_keys_they_load(tmp_path: Path) -> None:
    """A group that loads its keys streams them afresh for every tile: a plan file asking
    it to reuse halos is refused (exit 2, naming the fix)."""
    path = save(causal_encoder(tokens=512, width=32, heads=2), tmp_path, "encoder")
    problem = api.prepare(str(path))
    mix = _layer(problem, "FlashAttention")
    doc = plan_to_json(hand_plan(problem, [Placement.of((mix,), Tile(1, 64, 1), True)]))
    next(gr for gr in doc["groups"] if gr["layers"] == [mix])["halo"] = "reuse"
    assert_refused(str(path), doc, tmp_path, 'Use "halo": "recompute"')


@pytest.mark.parametrize("double_buffered", [False, True])
@pytest.mark.parametrize("height", [24, 64, 100, 256])
def test_a_lone_causal_attention_runs_as_predicted_at_any_height(
        encoder: api.Problem, height: int, double_buffered: bool) -> None:
    """Tiles shorter than a key chunk (64: the first tiles hold fewer keys), as tall, and
    taller, with one input buffer or two: verified, every counter equal, the group's bytes
    q once + each tile's prefix of k and v + o once (against every tile reading them
    whole)."""
    mix = _layer(encoder, "FlashAttention")
    plan = hand_plan(encoder, [Placement.of((mix,), Tile(1, height, 1), True,
                                            double_buffered)])
    assert_verifies(encoder, plan)
    g = encoder.graph
    group = next(gr for gr in plan.groups if gr.layers == (mix,))
    (count,) = attention_traffic(g, group_io(g, group.layers), group.tile, 2)
    q, k, v = g.layer(mix).fmap_inputs
    tiles = -(-512 // height)
    prefix = sum(min(512, (i + 1) * height) for i in range(tiles))
    assert count.kv_reads == 2 * (g.elems(k) + g.elems(v)) * prefix // 512
    assert group.predicted.dram_bytes == count.total == 2 * (g.elems(q) + g.elems(
        g.layer(mix).outputs[0])) + count.kv_reads
    # the bounded path's floor of the group counts every key once (the last query reads
    # them all), never more than a tile choice moves
    io = group_io(g, group.layers)
    floor = group_floor_bytes(g, io, group_chains(g, io), encoder.chip)
    assert floor == 2 * sum(g.elems(t) for t in (q, k, v, g.layer(mix).outputs[0]))
    assert floor <= group.predicted.dram_bytes


def test_the_prefill_bound_counts_each_attention_as_if_alone(encoder: api.Problem) -> None:
    """`fuseplan solve`'s I/O bound: the floor + each fused attention's FlashAttention I/O at
    the query rows its group's tiles give it (q and o once, k and v per pass up to each
    pass's last query), whether the group keeps q, k, v and o on chip or not."""
    g = encoder.graph
    mix = _layer(encoder, "FlashAttention")
    stretch = _names(encoder, _layer(encoder, "MatMul"), mix)
    q, k, v = g.layer(mix).fmap_inputs
    out = g.layer(mix).outputs[0]
    for placement, rows in ((Placement.of((mix,), Tile(1, 100, 1), True), 100),
                            (Placement.of(tuple(stretch), Tile(1, 512, 1), True), 512)):
        plan = hand_plan(encoder, [placement])
        group = next(gr for gr in plan.groups if mix in gr.layers)
        (alone,) = alone_traffic(g, group_io(g, group.layers), group.tile, 2)
        prefix = sum(min(512, (i + 1) * rows) for i in range(-(-512 // rows)))
        want = 2 * (g.elems(q) + g.elems(out) + (g.elems(k) + g.elems(v)) * prefix // 512)
        assert alone.total == want
        bounds = io_bounds_of(g, encoder.chip, plan)
        assert bounds.io_bound_bytes == plan.compulsory_dram_bytes + want
        (line,) = bound_lines(bounds, plan)
        assert fmt_bytes(plan.compulsory_dram_bytes + want) in line, line
        assert f"{plan.totals.dram_bytes / (plan.compulsory_dram_bytes + want):.2f}×" in line
