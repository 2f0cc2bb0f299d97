"""A decoder layer as one group split over the clusters with its row tiles reusing halos
(Mode.cluster_split with halo reuse, solver.split_reuse): the layer's weights spread over
the clusters' WRAM, its attention shared out by query heads, its row tiles run in order
keeping the keys they make for later tiles, or spilling them where they outgrow a cluster.

Which layers split how (planner.geometry.cluster_split); hand plans of one group per layer
read the input once, the weights once and write the output once (spilled: the keys written
once and read back by later tiles), and run as predicted byte for byte and cycle for cycle
with outputs equal to onnxruntime's; the plan file states the composite and refuses it
where it cannot run; the planners take it where the layer's weights outgrow one cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuseplan.planner.app import api
from fuseplan.planner.app.explain import recheck
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.cost.weight_stream import stage_memory
from fuseplan.planner.geometry.cluster_split import busiest_shares, cluster_split
from fuseplan.planner.geometry.halo_reuse import kept_outgrow
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.plan.json_io import plan_to_json
from fuseplan.planner.plan.placement import Placement
from fuseplan.planner.ui.cli import app
from fuseplan.solver.tiles import GroupSearch
from tests.hand import assert_refused, hand_plan
from tests.models import causal_encoder, llama_decoder, save
from tests.test_cluster_split import wide_chain

pytestmark = pytest.mark.xdist_group("split_reuse")

TOKENS = 512
LONG = 1024  # tokens of the layer whose keys spill
# a cluster's WRAM (4 cores x 16 KiB) holds a quarter of a layer's weights, not all of them
SMALL_WRAM = "wram.bytes=16KiB"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save(llama_decoder(tokens=TOKENS, width=64, heads=4, kv_heads=2, hidden=128,
                              blocks=2), tmp_path_factory.mktemp("split_reuse"), "decoder")


@pytest.fixture(scope="module")
def decoder(model: Path) -> api.Problem:
    return api.prepare(str(model), overrides=[SMALL_WRAM, "sram.bytes=256KiB"])


def _layers(problem: api.Problem) -> list[tuple[str, ...]]:
    """Each decoder layer's layers: from the input (or the last residual) to its second
    residual add."""
    names = [lay.name for lay in problem.graph.layers]
    ends = [i for i, n in enumerate(names) if problem.graph.layer(n).op == "Add"
            and n.startswith("residual")][1::2]
    return [tuple(names[a + 1 if a else 0:b + 1]) for a, b in zip([0, *ends], ends,
                                                                  strict=False)]


def _verifies(problem: api.Problem, plan: object) -> None:
    report = api.verify_in_memory(problem, plan, seed=3)  # type: ignore[arg-type]
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations, [v.describe() for v in report.capacity_violations]
    assert report.cycles.ok, report.cycles.first_off


def test_a_decoder_layer_splits_whole_its_attention_by_heads(decoder: api.Problem) -> None:
    """Every Linear of the layer shares out its output channels, the fused attention its
    query heads (no weights, its work not done C times over), the norms and the rotary
    embedding (whose tables both q and k read) run whole on every cluster; only a share of
    the weights fits one cluster's WRAM."""
    g = decoder.graph
    first = _layers(decoder)[0]
    io = group_io(g, first)
    split = cluster_split(g, io)
    assert split is not None
    linears = [n for n in first if g.layer(n).op == "MatMul" and g.layer(n).weights]
    assert list(split.split) == linears and len(linears) == 7
    (attention,) = [n for n in first if g.layer(n).op == "FlashAttention"]
    assert split.headed == (attention,) and attention not in split.replicated
    assert g.layer(attention).outputs[0] in split.gathered
    assert dict(split.axis)[g.layer(attention).outputs[0]] == 1
    assert weight_bytes(g, io.weights, decoder.chip) > stage_memory(decoder.chip)


@pytest.mark.parametrize(("height", "double_buffered"), [(64, False), (100, True), (32, False)])
def test_split_layers_keeping_their_keys_run_as_predicted(decoder: api.Problem, height: int,
                                                          double_buffered: bool) -> None:
    """One group per layer, split, row tiles reusing halos: the input read once, every
    weight once, the output written once, nothing else crossing DRAM; the tiles pass every
    rule and capacity (explain's re-check) and run as predicted."""
    g = decoder.graph
    plan = hand_plan(decoder, [Placement.of(layers, Tile(1, height, 1), True, double_buffered,
                                            halo_reuse=True, cluster_split=True)
                               for layers in _layers(decoder)])
    for group in plan.groups:
        io = group_io(g, group.layers)
        p = group.predicted
        assert group.placement.cluster_split and group.halo_reuse
        assert p.dram_read_bytes == 2 * sum(g.elems(t) for t in io.inputs) \
            + weight_bytes(g, io.weights, decoder.chip)
        assert p.dram_write_bytes == 2 * sum(g.elems(t) for t in io.outputs)
        assert p.cluster_link_bytes > 0
    assert not recheck(g, plan, decoder.chip, decoder.ruleset)
    _verifies(decoder, plan)


@pytest.mark.parametrize(("n", "th", "db"), [(2, 2, False), (1, 3, True), (2, 8, False)])
def test_split_conv_stages_reusing_halos_run_as_predicted(tmp_path: Path, n: int, th: int,
                                                          db: bool) -> None:
    """Convolutions with halos, split and reusing them, over a batch of two images (tiles of
    one image or both): each image's input read once and the weights once, no halo
    recomputed; verified (the gathers counted from what each tile makes)."""
    problem = api.prepare(str(save(wide_chain(n=2), tmp_path, "wide")))
    g = problem.graph
    names = tuple(lay.name for lay in g.layers)
    plan = hand_plan(problem, [Placement.of(names, Tile(n, th, 8), True, db,
                                            halo_reuse=True, cluster_split=True)])
    (group,) = plan.groups
    p = group.predicted
    assert group.placement.cluster_split and group.halo_reuse and p.cluster_link_bytes > 0
    assert p.dram_read_bytes == 2 * g.elems("input") + weight_bytes(g, group_io(
        g, names).weights, problem.chip)
    assert p.redundant_read_bytes == 0
    _verifies(problem, plan)


def test_the_tile_search_takes_a_whole_layer_split(decoder: api.Problem) -> None:
    """A whole layer's tile search: its weights fit no cluster whole and tiles outer would
    make every earlier key again, so its best choice is split with halos reused, at the
    tallest height that fits (the next taller does not)."""
    first = _layers(decoder)[0]
    search = GroupSearch.of(decoder.graph, first, decoder.chip, decoder.ruleset)
    best = search.best()
    assert best is not None
    assert best.mode.cluster_split and best.mode.halo_reuse and not best.mode.keys_spilled
    assert best.cost.dram_read_bytes == 2 * decoder.graph.elems("input") \
        + weight_bytes(decoder.graph, search.io.weights, decoder.chip)
    assert search.violations(search.tile_of(best.tile.h + 1), True, halo_reuse=True,
                             cluster_split=True)


@pytest.fixture(scope="module")
def long_context(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """One layer at 1,024 tokens: its keys and values (128 KiB) outgrow 120 KiB of SRAM; a
    cluster's WRAM (96 KiB) holds a quarter of its Linears beside the rotary tables (64
    KiB, whole on every cluster), not all of them."""
    path = save(llama_decoder(tokens=LONG, width=64, heads=4, kv_heads=2, hidden=128),
                tmp_path_factory.mktemp("split_spill"), "decoder_1k")
    return path, ["wram.bytes=24KiB", "sram.bytes=120KiB"]


def test_split_layers_spill_keys_that_outgrow_a_cluster(
        long_context: tuple[Path, list[str]]) -> None:
    """The layer's tile search takes it split with its keys spilled; run so, it reads its
    input once, its weights once, writes its output and its keys once and reads back, in
    each tile, the rows of keys earlier tiles made; verified."""
    path, chip = long_context
    problem = api.prepare(str(path), overrides=chip)
    g = problem.graph
    (layers,) = _layers(problem)
    best = GroupSearch.of(g, layers, problem.chip, problem.ruleset).best()
    assert best is not None and best.mode.cluster_split and best.mode.keys_spilled
    plan = hand_plan(problem, [best.placement(layers)])
    (group,) = plan.groups
    io = group_io(g, group.layers)
    assert kept_outgrow(g, io, problem.chip)
    (attention,) = [n for n in group.layers if g.layer(n).op == "FlashAttention"]
    kv = g.layer(attention).fmap_inputs[1:]
    height = group.tile.h
    back = sum(g.elems(t) // LONG * a for t in kv for a in range(0, LONG, height))
    p = group.predicted
    assert p.dram_read_bytes == 2 * (g.elems("input") + back) \
        + weight_bytes(g, io.weights, problem.chip)
    assert p.dram_write_bytes == 2 * (sum(g.elems(t) for t in io.outputs)
                                      + sum(g.elems(t) for t in kv))
    assert not recheck(g, plan, problem.chip, problem.ruleset)
    _verifies(problem, plan)


def test_plan_files_state_the_split_with_reused_halos(decoder: api.Problem, model: Path,
                                                      tmp_path: Path) -> None:
    """The composite round-trips through a plan file that `verify` runs; streamed weights
    with it are refused (exit 2), naming the fix."""
    plan = hand_plan(decoder, [Placement.of(layers, Tile(1, 64, 1), halo_reuse=True,
                                            cluster_split=True)
                               for layers in _layers(decoder)])
    doc = plan_to_json(plan)
    assert all(gr["cluster_split"] is True and gr["halo"] == "reuse" for gr in doc["groups"])
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(doc))
    ran = CliRunner().invoke(app, ["verify", str(model), str(good), "--set", SMALL_WRAM,
                                   "--set", "sram.bytes=256KiB"])
    assert ran.exit_code == 0, ran.output
    doc["groups"][0]["weights_resident"] = False
    assert_refused(str(model), doc, tmp_path, "cluster_split runs with resident weights")


@pytest.mark.slow
def test_solve_plans_a_long_context_layer_split_and_spilled(
        long_context: tuple[Path, list[str]], tmp_path: Path) -> None:
    """`fuseplan solve` on the 1,024-token layer: one group, split with its keys spilled,
    `verify` and `explain` clean, fewer bytes than with
    `search.cluster_split` off (the layer then parts where its weights outgrow a
    cluster)."""
    path, chip = long_context
    sets = [arg for c in chip for arg in ("--set", c)]
    plan_file = tmp_path / "plan.json"
    solved = CliRunner().invoke(app, ["solve", str(path), *sets, "-o", str(plan_file)])
    assert solved.exit_code == 0, solved.output
    doc = json.loads(plan_file.read_text())
    (group,) = doc["groups"]
    assert group["cluster_split"] and group["keys_spilled"] and group["halo"] == "reuse"
    ran = CliRunner().invoke(app, ["verify", str(path), str(plan_file)])
    assert ran.exit_code == 0, ran.output
    assert not api.explain(str(path), plan_file, None, None, None, chip)["violations"]
    rules = tmp_path / "no_split.yaml"
    rules.write_text((Path(__file__).parents[1] / "rules" / "default.yaml").read_text()
                     .replace("cluster_split: true", "cluster_split: false"))
    off = api.prepare(str(path), str(rules), overrides=chip)
    without = api.plan_problem(off, "cpsat")
    assert doc["totals"]["dram_bytes"] < without.totals.dram_bytes
    _verifies(off, without)


@pytest.mark.parametrize("spilled", [False, True])
def test_a_gpt2_layer_parting_qkv_with_one_split_splits_whole(tmp_path: Path,
                                                              spilled: bool) -> None:
    """GPT-2's export parts q, k and v with one Split node (three maps out): it runs whole
    on every cluster (as a reshape does), so the layer still splits as one group, its fused
    attention by query heads; hand plans keeping and spilling the keys run as predicted, and
    the layer's tile search takes the split (before, no group holding the Split split)."""
    problem = api.prepare(str(save(causal_encoder(tokens=512, width=64, heads=4), tmp_path,
                                   "gpt")), overrides=[SMALL_WRAM, "sram.bytes=256KiB"])
    g = problem.graph
    names = tuple(lay.name for lay in g.layers)
    io = group_io(g, names)
    split = cluster_split(g, io)
    assert split is not None
    (parts,) = [n for n in names if g.layer(n).op == "Split"]
    assert parts in split.replicated and len(g.layer(parts).outputs) == 3
    assert [g.layer(n).op for n in split.headed] == ["FlashAttention"]
    assert weight_bytes(g, io.weights, problem.chip) > stage_memory(problem.chip)
    plan = hand_plan(problem, [Placement.of(names, Tile(1, 64, 1), halo_reuse=True,
                                            cluster_split=True, keys_spilled=spilled)])
    (group,) = plan.groups
    p = group.predicted
    kv = sum(g.elems(t) for t in g.layer(split.headed[0]).fmap_inputs[1:])
    assert p.dram_write_bytes == 2 * (g.elems(io.outputs[0]) + (kv if spilled else 0))
    assert not recheck(g, plan, problem.chip, problem.ruleset)
    _verifies(problem, plan)
    best = GroupSearch.of(g, names, problem.chip, problem.ruleset).best()
    assert best is not None and best.mode.cluster_split and best.mode.halo_reuse


@pytest.mark.parametrize(("heads", "busiest"), [(6, 2), (4, 1)])
def test_the_clusters_wait_for_the_busiest(tmp_path: Path, heads: int, busiest: int) -> None:
    """Six query heads over four clusters keep one cluster on two of them: the split group
    computes as long as its busiest cluster does (each shared-out layer's largest share, the
    replicated layers whole), longer than the work spread evenly over every core; four heads
    spread evenly, and the two agree. The emulator's clock times each tile by the same
    cluster: verified, cycles included."""
    problem = api.prepare(str(save(llama_decoder(tokens=TOKENS, width=16 * heads, heads=heads,
                                                 kv_heads=2), tmp_path, "heads")),
                          overrides=[SMALL_WRAM, "sram.bytes=256KiB"])
    g, chip = problem.graph, problem.chip
    (layers,) = _layers(problem)
    split = cluster_split(g, group_io(g, layers))
    assert split is not None
    (attention,) = split.headed
    assert busiest_shares(g, group_io(g, layers), split, chip.clusters)[attention] == (
        heads, busiest)
    plan = hand_plan(problem, [Placement.of(layers, Tile(1, 64, 1), halo_reuse=True,
                                            cluster_split=True)])
    p = plan.groups[0].predicted
    even = (-(-p.macs // (chip.cores * chip.core.macs_per_cycle))
            + -(-p.vector_ops // (chip.cores * chip.core.vector_lanes)))
    assert p.band_compute_cycles > even if heads % chip.clusters else \
        p.band_compute_cycles == even
    _verifies(problem, plan)
