"""The emulator executes plans: outputs match onnxruntime, predicted bytes == emulated bytes.

* layer-by-layer plans of zoo models (seeded random weights);
* hand-written tiled plans (several tiles per group, halos, batch split, resident and
  streamed weights) on the chain / residual / Inception-like test models, on a clustered
  chip (SRAM + NRAM/WRAM) and a single-memory chip;
* a property test over random small CNNs, random chips and random valid tilings;
* capacity violations (SRAM, NRAM, WRAM) named with group, tile, level and bytes over;
* plan files that do not fit the model are rejected with clear errors.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuseplan.emulator.layer import layer_facts
from fuseplan.emulator.run import emulate
from fuseplan.hardware.chip import Chip, load_chip
from fuseplan.planner.app.assemble import assemble, layer_plan
from fuseplan.planner.app.verify import VerifyReport, verify_plan
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.cost.model import weight_bytes, weight_ring
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.cost.weight_stream import staged_steps
from fuseplan.planner.front.graph_build import build_graph
from fuseplan.planner.front.onnx_load import (
    LoadedModel,
    load_model,
    random_inputs,
    randomize_weights,
)
from fuseplan.planner.geometry.regions import (
    Tile,
    dims,
    group_io,
    input_box,
    iter_tiles,
    tile_count,
    tile_regions,
)
from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.checks import whole_tile
from fuseplan.planner.plan.data import Plan
from fuseplan.planner.plan.json_io import load_plan, save_plan
from fuseplan.planner.plan.placement import Placement
from tests import models

HYP = settings(max_examples=int(os.environ.get("FUSEPLAN_EXAMPLES", "25")), deadline=None,
               derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BYTE_COUNTERS = ("dram_read_bytes", "dram_write_bytes", "weight_read_bytes",
                 "redundant_read_bytes", "sram_peak_bytes", "macs")


@dataclass(frozen=True)
class Model:
    loaded: LoadedModel
    graph: Graph

    @property
    def names(self) -> list[str]:
        return [lay.name for lay in self.graph.layers]


def load_proto(proto: Any, seed: int | None = None) -> Model:
    with tempfile.TemporaryDirectory() as d:
        loaded = load_model(str(models.save(proto, Path(d), "m")), {})
    if seed is not None:
        loaded = randomize_weights(loaded, seed)
    return Model(loaded, build_graph(loaded))


def make_plan(m: Model, chip: Chip, groups: Sequence[Placement]) -> Plan:
    return assemble(m.graph, chip, groups,
                    model={"sha256": m.loaded.sha256}, hardware={"name": chip.name}, rules={},
                    objective=Objective.TRAFFIC, solver={"name": "test"})


def run_verify(m: Model, plan: Plan, chip: Chip, seed: int = 0) -> VerifyReport:
    return verify_plan(m.loaded, m.graph, plan, chip, random_inputs(m.loaded, seed))


def assert_verified(report: VerifyReport, plan: Plan, what: str) -> None:
    """Outputs match the reference and every group's counters equal the prediction."""
    assert report.outputs_match, f"{what}: {report.first_output_mismatch} " \
                                 f"(max rel err {report.max_rel_err:.3g})"
    assert len(report.per_group) == len(plan.groups)
    for g, got in zip(plan.groups, report.per_group, strict=True):
        diffs = {k: (getattr(g.predicted, k), getattr(got, k)) for k in BYTE_COUNTERS
                 if getattr(g.predicted, k) != getattr(got, k)}
        assert not diffs, (f"{what}: group {g.id} ({g.layers[0]}..{g.layers[-1]}, {g.tile}): "
                           f"(predicted, emulated) {diffs}")
    assert report.predicted_matches_emulated, f"{what}: {report.first_counter_mismatch}"


# =========================================================================== zoo, layer by layer


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "inception_v1", "shufflenet",
                                  "densenet121"])
def test_zoo_layer_by_layer_plan_verifies(zoo_model: Callable[[str], LoadedModel],
                                          name: str) -> None:
    # an SRAM that holds every layer whole, so the layer planner tiles nothing
    chip, _ = load_chip(None, ["sram.bytes=64MiB", "nram.bytes=16MiB"])
    loaded = randomize_weights(zoo_model(name), 0)
    graph = build_graph(loaded)
    plan = layer_plan(graph, chip, model={"sha256": loaded.sha256}, hardware={})
    assert all(g.mode == "small" for g in plan.groups)
    report = verify_plan(loaded, graph, plan, chip, random_inputs(loaded, 0))
    assert_verified(report, plan, f"zoo:{name} layer by layer")
    # every layer's output goes through DRAM and is compared with onnxruntime's
    assert report.checked_tensors == len(graph.layers)
    # no fusion: each layer reads its inputs (the rows and columns its windows touch: a
    # stride-2 7x7 conv on 224 rows never reads row 223) and weights once, and writes its
    # outputs once
    dt = chip.dtype_bytes
    reads = sum(_needed_elems(graph, lay) for lay in graph.layers) * dt
    weights = sum(weight_bytes(graph, lay.weights, chip) for lay in graph.layers)
    writes = sum(graph.elems(lay.outputs[0]) for lay in graph.layers) * dt
    e = report.emulated
    assert (e.dram_read_bytes, e.weight_read_bytes, e.dram_write_bytes) == \
        (reads + weights, weights, writes), f"zoo:{name}: (read, weights, write) bytes"
    assert e.redundant_read_bytes == 0
    assert plan.layer_by_layer_dram_bytes == e.dram_bytes


def _needed_elems(graph: Graph, lay: Any) -> int:
    """Elements of a layer's inputs that its whole output needs, from its row/column maps."""
    total = 0
    for t in dict.fromkeys(lay.fmap_inputs):
        i = lay.fmap_inputs.index(t)
        shape = graph.shapes[t]
        if len(shape) < 4 or len(lay.out_shape) < 4:
            total += graph.elems(t)
            continue
        h, w = shape[-2:]
        r0, r1 = lay.row_maps[i].needed(0, lay.out_shape[-2], h)
        c0, c1 = lay.col_maps[i].needed(0, lay.out_shape[-1], w)
        rows, cols = min(h, r1) - max(0, r0), min(w, c1) - max(0, c0)
        total += graph.elems(t) // (h * w) * rows * cols
    return total


# =========================================================================== hand-written tiles


def _chain_groups(m: Model) -> list[tuple[list[str], Tile | None]]:
    n = m.names  # conv relu conv relu maxpool | conv bn relu | gap flatten gemm
    return [(n[0:5], Tile(1, 4, 6)),  # 16x16 pool output in 4x3 tiles; two 3x3 halos
            (n[5:8], Tile(1, 3, 8)),  # stride-2 conv after the pool: 3 row tiles
            (n[8:], None)]


def _residual_groups(m: Model) -> list[tuple[list[str], Tile | None]]:
    n = m.names  # stem relu | bottleneck (identity) + relu | bottleneck (stride 2, proj) + relu
    return [(n[0:2], Tile(1, 11, 32)),
            (n[2:9], Tile(1, 5, 12)),  # the 3x3 conv inside the block needs a halo
            (n[9:], Tile(1, 3, 5))]  # stride 2 and a projection shortcut


def _residual_whole_net(m: Model) -> list[tuple[list[str], Tile | None]]:
    return [(m.names, Tile(1, 4, 7))]  # the whole network in one group


def _inception_groups(m: Model) -> list[tuple[list[str], Tile | None]]:
    n = m.names  # stem relu | maxpool, four branches, concat, avgpool
    return [(n[0:2], Tile(1, 7, 32)),
            (n[2:], Tile(1, 3, 3))]  # 5x5 branch and pooled branch need different halos


def _batch_groups(m: Model) -> list[tuple[list[str], Tile | None]]:
    return [(m.names[:9], Tile(1, 6, 32)), (m.names[9:], Tile(1, 16, 16))]


def _squeeze_excite() -> Any:
    """conv -> [global pool -> 1x1 -> 1x1 -> sigmoid] -> Mul -> conv: a whole-map op mid-group."""
    b = models._Builder(np.random.default_rng(5))
    x = b.one("Relu", [b.conv("input", 3, 8, 3)])
    s = b.one("GlobalAveragePool", [x], "gap")
    s = b.one("Sigmoid", [b.conv(b.one("Relu", [b.conv(s, 8, 4, 1, prefix="fc1")]), 4, 8, 1,
                                 prefix="fc2")])
    y = b.one("Relu", [b.conv(b.one("Mul", [x, s]), 8, 8, 3, prefix="post")])
    return b.model((1, 3, 20, 20), y, 13, name="squeeze_excite")


def _upsampling() -> Any:
    """stride-2 conv, ConvTranspose k3 s2 p1 output_padding 1, conv, nearest Resize x2, conv."""
    b = models._Builder(np.random.default_rng(6))
    x = b.one("Relu", [b.conv("input", 3, 8, 3, stride=2)])
    x = b.one("ConvTranspose", [x, b.weight((8, 4, 3, 3), 8 * 9), b.bias(4)], "deconv",
              kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])
    x = b.one("Relu", [b.conv(x, 4, 4, 3)])
    x = b.one("Resize", [x, b.const("roi", np.zeros(0, np.float32)),
                         b.const("scales", np.array([1, 1, 2, 2], np.float32))],
              mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    x = b.one("Relu", [b.conv(x, 4, 4, 3)])
    return b.model((1, 3, 20, 20), x, 13, name="upsampling")


def _one_group(tile: Tile) -> Callable[[Model], list[tuple[list[str], Tile | None]]]:
    return lambda m: [(m.names, tile)]


# name: (model, grouping, whether fusion must beat layer-by-layer traffic with resident weights)
CASES: dict[str, tuple[Callable[[], Any], Callable[[Model], list[tuple[list[str], Tile | None]]],
                       bool]] = {
    "chain": (lambda: models.chain_cnn(seed=1, h=32, w=32), _chain_groups, True),
    "residual": (lambda: models.residual_net(seed=2), _residual_groups, True),
    "residual-one-group": (lambda: models.residual_net(seed=2), _residual_whole_net, True),
    "inception": (lambda: models.inception_net(seed=3), _inception_groups, True),
    "residual-batch2": (lambda: models.residual_net(seed=4, n=2), _batch_groups, True),
    # every tile recomputes the whole first conv for the global pool: no saving promised
    "squeeze-excite": (_squeeze_excite, _one_group(Tile(1, 3, 4)), False),
    "upsampling": (_upsampling, _one_group(Tile(1, 7, 9)), True),
}


@pytest.mark.parametrize("resident", [True, False], ids=["resident", "streamed"])
@pytest.mark.parametrize("preset", ["cluster4x4", "frustum_npu"])
@pytest.mark.parametrize("case", list(CASES))
def test_hand_tiled_plan_verifies(case: str, preset: str, resident: bool) -> None:
    build, grouping, saves = CASES[case]
    m = load_proto(build())
    chip, _ = load_chip(preset)
    spec = [Placement.of(ls, t or whole_tile(m.graph, ls), resident) for ls, t in grouping(m)]
    plan = make_plan(m, chip, spec)
    report = run_verify(m, plan, chip, seed=5)
    what = f"{case} on {preset}, weights {'resident' if resident else 'streamed'}"
    assert_verified(report, plan, what)
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    dt = chip.dtype_bytes
    tiled = 0
    for g, got in zip(plan.groups, report.per_group, strict=True):
        io = group_io(m.graph, g.layers)
        tiles = tile_count(m.graph, io, g.tile)
        wbytes = weight_bytes(m.graph, io.weights, chip)
        # weights: once per group when resident, once per round of tiles when streamed (a
        # tile per cluster; an accumulating reduction's tiles one by one)
        size = 1 if io.accumulated else chip.clusters
        assert got.weight_read_bytes == wbytes * (1 if resident else -(-tiles // size)), \
            f"{what}: group {g.id} ({tiles} tiles) read {got.weight_read_bytes} B of weights " \
            f"({wbytes} B)"
        # only the group's outputs go back to DRAM, each element once: no halo is written
        assert got.dram_write_bytes == sum(m.graph.elems(t) for t in io.outputs) * dt
        if tiles > 1:
            tiled += 1
            assert got.sram_peak_bytes < sum(m.graph.elems(t) for t in
                                             io.inputs + io.internal + io.outputs) * dt
    assert tiled >= 1
    # the halo groups of each case re-read some input rows
    assert sum(c.redundant_read_bytes for c in report.per_group) > 0, f"{what}: no halo"
    if resident and saves:  # fusion keeps intermediates on chip: less than layer by layer
        assert report.emulated.dram_bytes < plan.layer_by_layer_dram_bytes, \
            f"{what}: {report.emulated.dram_bytes} B vs {plan.layer_by_layer_dram_bytes} B"


@pytest.mark.parametrize("name", ["resnet50", "densenet121", "inception_v2", "shufflenet"])
def test_run_layer_same_box_shortcut_is_the_region_function(
        zoo_model: Callable[[str], LoadedModel], name: str) -> None:
    """run_layer skips input_box for inputs it marks as needing the output's own box: for
    every such input of a zoo model and boxes all over the output, input_box agrees."""
    graph = build_graph(zoo_model(name))
    rng = np.random.default_rng(0)
    marked = 0
    for lay in graph.layers:
        for _, i, name_, _, same in layer_facts(graph, lay).fmaps:
            if not same:
                continue
            marked += 1
            n, _, h, w = dims(lay.out_shape)
            for _ in range(4):
                n0, r0, c0 = (int(rng.integers(0, e)) for e in (n, h, w))
                box = (n0, int(rng.integers(n0 + 1, n + 1)), r0, int(rng.integers(r0 + 1, h + 1)),
                       c0, int(rng.integers(c0 + 1, w + 1)))
                assert input_box(graph, lay, i, box) == box, f"{lay.name} input {name_} {box}"
    assert marked > 0


def test_tile_size_does_not_change_results() -> None:
    """One big tile and many small tiles of the same group give the same tensor (up to float32
    rounding); the small tiles read more (halos) but write the same bytes."""
    m = load_proto(models.chain_cnn(seed=7, h=40, w=40))
    chip, _ = load_chip("frustum_npu")
    group = m.names[0:5]
    rest = [Placement.of(m.names[5:8], whole_tile(m.graph, m.names[5:8])),
            Placement.of(m.names[8:], whole_tile(m.graph, m.names[8:]))]
    inputs = random_inputs(m.loaded, 1)
    results = []
    for tile in (whole_tile(m.graph, group), Tile(1, 3, 4), Tile(1, 1, 1)):
        plan = make_plan(m, chip, [Placement.of(group, tile), *rest])
        results.append((emulate(m.graph, plan, chip, inputs), plan))
    anchor = group_io(m.graph, group).anchor
    base = results[0][0].tensors[anchor]
    for res, plan in results[1:]:
        np.testing.assert_allclose(res.tensors[anchor], base, rtol=1e-5, atol=1e-5,
                                   err_msg=f"tile {plan.groups[0].tile}")
        assert res.groups[0].dram_write_bytes == results[0][0].groups[0].dram_write_bytes
        assert res.groups[0].dram_read_bytes > results[0][0].groups[0].dram_read_bytes
    # 1x1 tiles: 20x20 pool outputs, each needing a 6x6 input window (two 3x3 convs + 2x2 pool)
    one = results[2][0].groups[0]
    inner = 18 * 18  # tiles away from the border read the full 6x6 window
    assert one.dram_read_bytes - one.weight_read_bytes >= inner * 6 * 6 * 3 * chip.dtype_bytes


# =========================================================================== property test


@st.composite
def random_plans(draw: st.DrawFn) -> tuple[int, Model, Chip, list[Placement]]:
    seed = draw(st.integers(0, 2**31 - 1), "model seed")
    m = load_proto(models.random_cnn(np.random.default_rng(seed)))
    preset = draw(st.sampled_from(["cluster4x4", "frustum_npu"]), "preset")
    sram = draw(st.sampled_from(["2KiB", "16KiB", "64KiB", "1MiB"]), "sram")
    dtype = draw(st.sampled_from([2, 4]), "dtype_bytes")
    overrides = [f"sram.bytes={sram}", f"dtype_bytes={dtype}"]
    if preset == "cluster4x4":  # small WRAM: streamed weights arrive in channel chunks
        overrides.append(f"wram.bytes={draw(st.sampled_from(['256', '4KiB', '1MiB']), 'wram')}")
        # rounds of one to four tiles share each streamed read (the last round short)
        overrides.append(f"clusters={draw(st.integers(1, 4), 'clusters')}")
    chip, _ = load_chip(preset, overrides)
    names = m.names
    cuts = sorted(draw(st.sets(st.integers(1, len(names) - 1), max_size=len(names) - 1),
                       "group boundaries")) if len(names) > 1 else []
    groups: list[Placement] = []
    for a, b in zip([0, *cuts], [*cuts, len(names)], strict=True):
        layers = names[a:b]
        io = group_io(m.graph, layers)
        full = whole_tile(m.graph, layers)
        if len(io.outputs) == 1:
            tile = Tile(1, draw(st.integers(1, full.h), "tile h"),
                        draw(st.integers(1, full.w), "tile w"))
        else:
            tile = full
        resident = draw(st.booleans(), "resident")
        # one streamed layer that splits into output-channel chunks may sweep each chunk
        # over every tile (weights outer)
        sweep = (len(layers) == 1 and not resident
                 and chunk_axes(m.graph, m.graph.layer(layers[0])) is not None
                 and draw(st.booleans(), "weights outer"))
        groups.append(Placement.of(layers, tile, resident,
                                   draw(st.booleans(), "double buffered"),
                                   weights_outer=sweep))
    return seed, m, chip, groups


@HYP
@given(random_plans())
def test_random_tilings_verify(case: tuple[int, Model, Chip, list[Placement]]) -> None:
    seed, m, chip, groups = case
    plan = make_plan(m, chip, groups)
    report = run_verify(m, plan, chip, seed=seed % 1000)
    shown = [(g.layers[0], len(g.layers), g.tile) for g in plan.groups]
    what = (f"random_cnn seed {seed} on {chip.name} (sram {chip.sram.bytes} B, dtype "
            f"{chip.dtype_bytes} B), groups {shown}")
    assert_verified(report, plan, what)
    # a group overflows SRAM exactly when its predicted peak exceeds the SRAM
    over = {v.group for v in report.capacity_violations if v.level == "sram"}
    want = {g.id for g in plan.groups if g.predicted.sram_peak_bytes > chip.sram.bytes}
    assert over == want, f"{what}: SRAM violations in groups {sorted(over)}, predicted " \
                         f"peaks over {chip.sram.bytes} B in {sorted(want)}"


# =========================================================================== capacity


def _tiled_chain(overrides: list[str], preset: str = "cluster4x4",
                 resident: bool = True) -> tuple[Model, Chip, Plan, VerifyReport]:
    m = load_proto(models.chain_cnn(seed=1, h=32, w=32))
    chip, _ = load_chip(preset, overrides)
    spec = [Placement.of(ls, t or whole_tile(m.graph, ls), resident)
            for ls, t in _chain_groups(m)]
    plan = make_plan(m, chip, spec)
    return m, chip, plan, run_verify(m, plan, chip)


def test_sram_overflow_is_reported_with_group_tile_level_and_bytes() -> None:
    m, chip, plan, report = _tiled_chain(["sram.bytes=3KiB"])
    assert report.outputs_match and report.predicted_matches_emulated  # still runs correctly
    assert not report.ok
    sram = [v for v in report.capacity_violations if v.level == "sram"]
    peaks = {g.id: g.predicted.sram_peak_bytes for g in plan.groups}
    over = sorted(g for g, p in peaks.items() if p > 3072)
    assert sorted(v.group for v in sram) == over, f"predicted peaks {peaks}"
    assert over, f"a 3 KiB SRAM holds every group? peaks {peaks}"
    for v in sram:
        g = plan.groups[v.group]
        assert v.capacity_bytes == 3072
        assert v.needed_bytes == g.predicted.sram_peak_bytes  # the worst tile is reported
        assert v.over_bytes == v.needed_bytes - 3072 > 0
        assert 0 <= v.tile < tile_count(m.graph, group_io(m.graph, g.layers), g.tile)
        text = v.describe()
        assert f"group {v.group}" in text and f"tile {v.tile}" in text and "SRAM" in text \
            and f"{v.over_bytes} B over" in text, text
    doc = report.to_json()["capacity_violations"]
    assert {(d["group"], d["tile"], d["level"], d["over_bytes"]) for d in doc} >= \
        {(v.group, v.tile, "sram", v.over_bytes) for v in sram}


def test_nram_overflow_is_reported() -> None:
    """Each core of a cluster holds 1/cores_per_cluster of the tile's feature maps."""
    _, chip, plan, report = _tiled_chain(["nram.bytes=512"])
    nram = [v for v in report.capacity_violations if v.level == "nram"]
    assert nram, [v.describe() for v in report.capacity_violations]
    for v in nram:
        share = -(-plan.groups[v.group].predicted.sram_peak_bytes // chip.cores_per_cluster)
        assert (v.needed_bytes, v.capacity_bytes) == (share, 512), v.describe()
    assert not [v for v in report.capacity_violations if v.level == "sram"]


def test_wram_overflow_only_with_resident_weights() -> None:
    """Resident weights are split over the cores' WRAM; streamed weights are not held."""
    m, chip, plan, report = _tiled_chain(["wram.bytes=256"])
    wram = [v for v in report.capacity_violations if v.level == "wram"]
    for v in wram:
        io = group_io(m.graph, plan.groups[v.group].layers)
        share = -(-weight_bytes(m.graph, io.weights, chip) // chip.cores_per_cluster)
        assert (v.needed_bytes, v.capacity_bytes) == (share, 256), v.describe()
    assert {v.group for v in wram} == {
        g.id for g in plan.groups
        if -(-weight_bytes(m.graph, group_io(m.graph, g.layers).weights, chip) // 4) > 256}
    assert wram
    *_, streamed = _tiled_chain(["wram.bytes=256"], resident=False)
    assert not [v for v in streamed.capacity_violations if v.level == "wram"]


def test_unified_chip_counts_resident_weights_in_sram() -> None:
    """On a single-memory chip resident weights occupy the SRAM next to the tile; streamed
    ones only the chunks of the step (the running layer's and the next one's)."""
    m, chip, plan, report = _tiled_chain([], preset="frustum_npu")
    _, _, streamed_plan, streamed = _tiled_chain([], preset="frustum_npu", resident=False)
    for g, s in zip(plan.groups, streamed_plan.groups, strict=True):
        io = group_io(m.graph, g.layers)
        w = weight_bytes(m.graph, io.weights, chip)
        held = staged_steps(m.graph, io, chip)
        assert max(held) <= w
        first = tile_regions(m.graph, io, next(iter_tiles(m.graph, io, s.tile)))
        if tile_count(m.graph, io, s.tile) == 1 and weight_ring(m.graph, io, chip, first):
            # a group of one tile: its streamed weights run through a ring of all the SRAM
            # its maps leave (planner.cost.model.weight_ring)
            assert s.predicted.sram_peak_bytes == chip.sram.bytes
            continue
        saved = g.predicted.sram_peak_bytes - s.predicted.sram_peak_bytes
        assert w - max(held) <= saved <= w, g.layers
        if sum(1 for n in g.layers if m.graph.layer(n).weights) > 2:
            assert max(held) < w  # a pair, not the whole group's weights
    for r, p in ((report, plan), (streamed, streamed_plan)):
        assert_verified(r, p, "chain on frustum_npu")


# =========================================================================== plan files


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Model, Chip, Path]:
    m = load_proto(models.chain_cnn(seed=1))
    chip, _ = load_chip(None)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    spec = [Placement.of(ls, t or whole_tile(m.graph, ls)) for ls, t in _chain_groups(m)]
    save_plan(make_plan(m, chip, spec), path)
    return m, chip, path


def _edited(path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    doc = json.loads(path.read_text())
    edit(doc)
    out = path.with_name(f"edited_{abs(hash(json.dumps(doc, sort_keys=True)))}.json")
    out.write_text(json.dumps(doc))
    return out


def test_plan_round_trips(saved_plan: tuple[Model, Chip, Path]) -> None:
    m, chip, path = saved_plan
    plan = load_plan(path, m.graph, chip, m.loaded.sha256)
    assert [g.layers for g in plan.groups] == [tuple(ls) for ls, _ in _chain_groups(m)]
    assert [g.tile for g in plan.groups][:2] == [Tile(1, 4, 6), Tile(1, 3, 8)]
    report = run_verify(m, plan, chip)
    assert_verified(report, plan, "reloaded plan")


def test_plan_for_another_model_is_rejected(saved_plan: tuple[Model, Chip, Path]) -> None:
    m, chip, path = saved_plan
    with pytest.raises(InputError, match="different model") as err:
        load_plan(path, m.graph, chip, "0" * 64)
    assert str(path) in str(err.value) and "Solve this model again" in str(err.value)


def test_layer_in_two_groups_is_rejected(saved_plan: tuple[Model, Chip, Path]) -> None:
    m, chip, path = saved_plan
    layer = m.names[5]

    def dup(doc: dict[str, Any]) -> None:
        doc["groups"][0]["layers"].append(layer)

    with pytest.raises(InputError, match=rf"layer '{layer}' is in group \d and group \d"):
        load_plan(_edited(path, dup), m.graph, chip, m.loaded.sha256)


def test_missing_layer_is_rejected(saved_plan: tuple[Model, Chip, Path]) -> None:
    m, chip, path = saved_plan
    dropped = m.names[-1]

    def drop(doc: dict[str, Any]) -> None:
        doc["groups"][-1]["layers"].remove(dropped)

    with pytest.raises(InputError, match=rf"layer '{dropped}' .*is in no group"):
        load_plan(_edited(path, drop), m.graph, chip, m.loaded.sha256)


def test_unknown_layer_and_bad_tile_are_rejected(saved_plan: tuple[Model, Chip, Path]) -> None:
    m, chip, path = saved_plan

    def rename(doc: dict[str, Any]) -> None:
        doc["groups"][0]["layers"][0] = "no_such_layer"

    with pytest.raises(InputError, match="'no_such_layer', which the model does not have"):
        load_plan(_edited(path, rename), m.graph, chip, m.loaded.sha256)

    def zero(doc: dict[str, Any]) -> None:
        doc["groups"][0]["tile"]["h"] = 0

    with pytest.raises(InputError, match=r"tile\.h must be at least 1"):
        load_plan(_edited(path, zero), m.graph, chip, m.loaded.sha256)


def test_non_convex_groups_are_rejected(saved_plan: tuple[Model, Chip, Path]) -> None:
    """Groups {conv, maxpool} and {relu...} depend on each other: no execution order."""
    m, chip, path = saved_plan
    n = m.names

    def cycle(doc: dict[str, Any]) -> None:
        doc["groups"][0]["layers"] = [n[0], n[4]]
        doc["groups"].insert(1, {**doc["groups"][0], "layers": n[1:4]})

    with pytest.raises(InputError, match="cycle|execution order"):
        load_plan(_edited(path, cycle), m.graph, chip, m.loaded.sha256)
