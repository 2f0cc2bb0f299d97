"""Block groups (solver.long_groups.block_groups): tiled groups from one single-tensor cut to
a later one, longer than search.max_group_layers, with a full tile search."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from fuseplan.planner.app.api import Problem, plan_problem, prepare, verify, verify_in_memory
from fuseplan.planner.core.budget import Budget
from fuseplan.planner.cost.objective import Objective
from fuseplan.planner.plan.json_io import save_plan
from fuseplan.planner.plan.mode import Mode
from fuseplan.solver import long_groups
from fuseplan.solver.long_groups import block_groups, cut_sets, single_cuts
from fuseplan.solver.parallel import Context
from tests import models
from tests.test_deep_chain import _wide_chain
from tests.test_rules import with_rules

ZOO = Path(__file__).resolve().parent.parent / "examples" / "exports" / "zoo2026"
# row tiles only: whole 64 x 64 maps do not fit 8 KiB of NRAM per core
SMALL_CHIP = ["sram.bytes=32KiB", "nram.bytes=8KiB"]


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> Problem:
    """Four bottlenecks of 7-8 layers, so every block is longer than max_group_layers 4."""
    path = models.save(models.repeated_net(h=64, w=64), tmp_path_factory.mktemp("bg"), "rep")
    return with_rules(prepare(str(path), overrides=SMALL_CHIP),
                      search={"max_group_layers": 4, "max_block_group_layers": 24,
                              "whole_network_first": False, "long_whole_map_groups": False})


def _cut_aligned(problem: Problem, layers: tuple[str, ...]) -> bool:
    """Whether a group starts after a single-tensor cut (or at the first layer) and ends at one
    (or at the last layer)."""
    g = problem.graph
    ends = {*single_cuts(g), len(g.layers) - 1}
    return g.index(layers[0]) - 1 in ends | {-1} and g.index(layers[-1]) in ends


@pytest.mark.parametrize("solver", ["shortest-path", "cpsat"])
def test_block_groups_fuse_whole_blocks_and_verify(repeated: Problem, tmp_path: Path,
                                                   solver: str) -> None:
    """With block groups the bottlenecks run fused in row tiles (groups longer than
    max_group_layers, each from cut to cut) and the plan moves a quarter of the bytes it
    moves without them; both planners agree, and the emulator confirms every counter."""
    plan = plan_problem(repeated, solver)
    off = plan_problem(with_rules(repeated, search={"max_block_group_layers": 0}), solver)
    long = [g for g in plan.groups if len(g.layers) > 4]
    assert long, f"{solver}: no block group: {[len(g.layers) for g in plan.groups]}"
    assert all(_cut_aligned(repeated, g.layers) for g in long)
    assert max(len(g.layers) for g in off.groups) <= 4
    assert 4 * plan.totals.dram_bytes < off.totals.dram_bytes, (
        plan.totals.dram_bytes, off.totals.dram_bytes)
    other = plan_problem(repeated, "cpsat" if solver == "shortest-path" else "shortest-path")
    assert other.totals.dram_bytes == plan.totals.dram_bytes
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    report = verify(repeated.model.path, path)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert not report.capacity_violations
    assert report.emulated.dram_bytes == plan.totals.dram_bytes


def test_block_groups_cap_and_budget(repeated: Problem) -> None:
    """Block groups are at most max_block_group_layers long and none is searched once the
    budget has passed (the budget says how many were left out)."""
    g, chip, rules = repeated.graph, repeated.chip, repeated.ruleset
    found = dict(block_groups(g, chip, rules, Objective.TRAFFIC))
    assert found and all(4 < len(layers) <= 24 for layers in found)
    capped = dict(block_groups(g, chip, with_rules(repeated, search={
        "max_block_group_layers": 8}).ruleset, Objective.TRAFFIC))
    assert capped and set(capped) < set(found) and all(len(k) <= 8 for k in capped)
    spent = Budget.of(0.0)
    assert not dict(block_groups(g, chip, rules, Objective.TRAFFIC, spent))
    assert any("block groups" in note for note in spent.cuts), spent.cuts


def test_a_long_skip_is_no_boundary_of_the_blocks_it_passes_by(tmp_path: Path) -> None:
    """The stem's output, read again only by the head, crosses every position between, so
    counting it leaves no single-tensor cut there; not counting a tensor read further on
    than any tiled group reaches gives the cuts between the blocks (both sets are used), and
    the blocks run as block groups: fewer bytes than without, both planners agree, the
    plan verifies."""
    path = models.save(models.skip_net(h=64, w=64), tmp_path, "skip")
    problem = with_rules(prepare(str(path), overrides=SMALL_CHIP),
                         search={"max_group_layers": 4, "max_block_group_layers": 24,
                                 "whole_network_first": False, "long_whole_map_groups": False})
    g = problem.graph
    stem = g.index(next(lay.name for lay in g.layers if lay.name.startswith("relu")))
    head = g.index(next(lay.name for lay in g.layers if lay.op == "Concat"))
    sets = cut_sets(g, problem.ruleset)
    every, past = sets[0], single_cuts(g, 24)
    assert every == single_cuts(g) and sets[1] == past  # the limit's skips first
    assert all(cuts in [single_cuts(g, b) for b in range(4, 25, 4)] for cuts in sets[1:])
    assert not [p for p in every if stem < p < head - 1]
    blocks = [p for p in past if stem < p < head - 1]
    assert len(blocks) >= 5  # after each bottleneck's Add and its ReLU
    plan = plan_problem(problem, "cpsat")
    off = plan_problem(with_rules(problem, search={"max_block_group_layers": 0}), "cpsat")
    assert any(len(grp.layers) > 4 for grp in plan.groups)
    assert plan.totals.dram_bytes < off.totals.dram_bytes
    assert plan_problem(problem, "shortest-path").totals.dram_bytes >= plan.totals.dram_bytes
    out = tmp_path / "plan.json"
    save_plan(plan, out)
    report = verify(problem.model.path, out)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch


def test_raising_the_block_limit_only_adds_spans(tmp_path: Path) -> None:
    """A long skip's crossing is left out at every multiple of max_group_layers up to the
    block limit, so raising the limit by such a multiple keeps every block span offered
    before. The detector head as exported: with the limit's own skips alone, its middle
    scale's 34-layer block (both its branches and the Concat) was no longer offered at 40,
    the skip from the neck to the last scale then counting as a crossing."""
    path = models.save(models.skip_net(h=64, w=64), tmp_path, "skip")
    problem = prepare(str(path), overrides=SMALL_CHIP)
    spans = {most: set(long_groups.block_spans(problem.graph, with_rules(problem, search={
        "max_group_layers": 4, "max_block_group_layers": most}).ruleset))
        for most in (12, 16, 20, 24, 28)}
    assert all(spans[a] <= spans[b] for a, b in zip(spans, list(spans)[1:], strict=False))
    assert spans[12] < spans[28]
    detector = prepare(str(ZOO / "detector_head.onnx"))
    g = detector.graph
    at = {most: set(long_groups.block_spans(g, with_rules(detector, search={
        "max_block_group_layers": most}).ruleset)) for most in (36, 48)}
    assert at[36] < at[48]
    heads = (g.index("/cv2.1/cv2.1.0/conv/Conv"), g.index("/Concat_3") + 1)
    assert heads in at[36] and heads in at[48]


def test_a_whole_map_start_whose_longest_ends_fail_bisects_the_shorter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ends that pass the real checks up to the 20th of 40 (the longer the group, the harder
    the whole-map tile): the four longest fail, three bisection steps find a passing end
    without checking them all, then the cheapest cuts below it; a start whose every end
    fails yields nothing after TRIES + BISECTIONS checks."""
    checked: list[int] = []
    passing = 20

    def fake_choice(graph, chip, ruleset, objective, layers):  # type: ignore[no-untyped-def]
        checked.append(len(layers) - 1)
        return (tuple(layers), None) if len(layers) - 1 <= passing else None

    monkeypatch.setattr(long_groups, "_choice", fake_choice)
    monkeypatch.setattr(long_groups, "_rereads_weights", lambda ctx, found: False)
    layers = tuple(f"l{i}" for i in range(41))
    ends = tuple(range(1, 41))
    start = long_groups.Start(layers, ends, tuple(sorted(ends, key=lambda e: -e)))
    ctx = Context(None, None, None, Objective.TRAFFIC, False, None)  # type: ignore[arg-type]
    found = long_groups.start_groups(ctx, start)
    assert found is not None and found
    longest = len(found[0][0]) - 1
    assert longest <= passing and longest > passing // 2
    assert len(checked) <= long_groups.TRIES + long_groups.BISECTIONS + long_groups.SMALL_CUTS
    assert all(len(g) - 1 < longest for g, _ in found[1:])
    checked.clear()
    passing = 0
    assert long_groups.start_groups(ctx, start) == []
    assert len(checked) == long_groups.TRIES + long_groups.BISECTIONS


def test_a_start_whose_longest_group_rereads_weights_also_keeps_the_longest_resident(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every end passes, but past the 12th the weights no longer fit resident and stream
    once per tile: the longest group is kept, and so is the longest that holds its weights
    (found by bisection), since a shorter group may then move fewer bytes."""
    from fuseplan.planner.cost.counters import Counters
    from fuseplan.planner.geometry.regions import Tile
    from fuseplan.solver.tiles import TileChoice

    resident_up_to = 12

    def fake_choice(graph, chip, ruleset, objective, layers):  # type: ignore[no-untyped-def]
        resident = len(layers) - 1 <= resident_up_to
        return tuple(layers), TileChoice(Tile(2, 4, 4), Mode.of(resident=resident), Counters())

    monkeypatch.setattr(long_groups, "_choice", fake_choice)
    monkeypatch.setattr(long_groups, "_rereads_weights",
                        lambda ctx, found: not found[1].resident)
    layers = tuple(f"l{i}" for i in range(41))
    ends = tuple(range(1, 41))
    start = long_groups.Start(layers, ends, ())
    ctx = Context(None, None, None, Objective.TRAFFIC, False, None)  # type: ignore[arg-type]
    found = long_groups.start_groups(ctx, start)
    assert found is not None
    lengths = [len(g) - 1 for g, _ in found]
    assert lengths[0] == 40 and resident_up_to in lengths
    assert all(c.resident for g, c in found[1:])


def test_a_plain_chain_groups_its_convs_in_blocks_and_verifies(tmp_path: Path) -> None:
    """Every position of a plain chain of convs and ReLUs is a single-tensor cut: as one
    run of adjacent cuts it used to close no block before its end, so no group was longer
    than max_group_layers. Now each cut before a conv bounds a block: block groups of
    whole conv-ReLU pairs, past the size limit, move fewer bytes than the limit allows,
    both planners agree, and the plan verifies."""
    path = tmp_path / "chain.onnx"
    onnx.save(_wide_chain(12, channels=8, size=32), path)
    problem = with_rules(prepare(str(path), overrides=SMALL_CHIP),
                         search={"max_group_layers": 4, "max_block_group_layers": 12,
                                 "long_whole_map_groups": False})
    g = problem.graph
    spans = long_groups.block_spans(g, problem.ruleset)
    last_cut = max(single_cuts(g))  # the run's last cut closes blocks too, as before
    assert spans and all(g.layers[a].op == "Conv" for a, _ in spans)
    assert all(g.layers[b - 1].op == "Relu" or b - 1 == last_cut for _, b in spans)
    assert (0, 12) in spans and (12, 24) in spans  # six conv-ReLU pairs at each end
    plan = plan_problem(problem, "shortest-path")
    off = plan_problem(with_rules(problem, search={"max_block_group_layers": 0}),
                       "shortest-path")
    assert max(len(grp.layers) for grp in plan.groups) > 4
    assert plan.totals.dram_bytes < off.totals.dram_bytes
    assert plan_problem(problem, "cpsat").totals.dram_bytes == plan.totals.dram_bytes
    saved = tmp_path / "plan.json"
    save_plan(plan, saved)
    assert verify(str(path), saved).ok


def test_a_decoder_head_ends_where_the_attention_joins(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A Llama-style attention too long to fuse whole: its norm, projections and rotary
    embeddings are one block group ending just before the fused attention (a join cut: its
    q, k and v are all that cross there, and no single tensor does), and the plan moves
    fewer bytes than without join cuts, where the rotary embedding of k ran apart, its input
    written and read again. Both verify."""
    path = models.save(models.llama_attention(tokens=1024, width=64, heads=4, kv_heads=2),
                       tmp_path, "llama")
    problem = with_rules(prepare(str(path), overrides=["sram.bytes=128KiB"]),
                         search={"max_group_layers": 6})
    g = problem.graph
    (mix,) = [lay.name for lay in g.layers if lay.op == "FlashAttention"]
    assert (0, g.index(mix)) in long_groups.block_spans(g, problem.ruleset)
    plan = plan_problem(problem, "cpsat")
    head = next(grp for grp in plan.groups if grp.layers[0] == g.layers[0].name)
    assert g.index(head.layers[-1]) == g.index(mix) - 1
    joined = long_groups._cut_and_join_sets
    monkeypatch.setattr(long_groups, "_cut_and_join_sets",
                        lambda *a: [(cuts, []) for cuts, _ in joined(*a)])
    assert (0, g.index(mix)) not in long_groups.block_spans(g, problem.ruleset)
    apart = plan_problem(problem, "cpsat")
    assert plan.totals.dram_bytes < apart.totals.dram_bytes
    for p in (plan, apart):
        report = verify_in_memory(problem, p)
        assert report.outputs_match and report.predicted_matches_emulated


def test_every_decoder_layer_of_an_export_gets_its_join_span() -> None:
    """In the zoo's Llama export each layer's norm, projections and rotary embeddings (from
    the residual add before them) are one block span ending at the join before its fused
    attention, the second layer's too: there the residual stream is read by the norm next
    and by the residual add past the attention, a long skip in every cut set but the first,
    which has no join cut unless such skips may cross it."""
    problem = prepare(str(ZOO / "llama_block.onnx"), shapes={"input_ids": (1, 1024)})
    g = problem.graph
    spans = set(long_groups.block_spans(g, problem.ruleset))
    for layer in ("layers.0", "layers.1"):
        first = g.index(f"/{layer}/input_layernorm/Pow")
        (mix,) = [lay.name for lay in g.layers
                  if lay.op == "FlashAttention" and lay.name.startswith(f"/{layer}/")]
        assert (first, g.index(mix)) in spans, layer
