"""Property test of halo-reusing groups that keep the keys they make (planner.geometry.
attention.kept_prefix): random pre-norm blocks long enough for their attention to fuse
(tokens, width, heads; a causal mask as GPT-2 exports it, as an additive matrix, or none),
the block's first half (norm, qkv, head split, attention, head merge, projection, residual)
as one group of random tile height, one input buffer or two, weights resident or streamed,
on a random SRAM size, the keys held or spilled (Mode.keys_spilled: written as made, read
back by later tiles): every plan runs in the emulator with outputs matching onnxruntime
and every counter (bytes, peaks, cycles) as predicted, and the group reads its input once
and writes its output once (spilled: besides, k and v written once and each tile reading
back the rows of them earlier tiles made). Then the whole block planned by CP-SAT on the
same chip verifies too."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuseplan.planner.app import api
from fuseplan.planner.geometry.regions import Tile, group_io
from fuseplan.planner.plan.placement import Placement
from tests.hand import assert_verifies, hand_plan
from tests.models import causal_encoder, save

pytestmark = pytest.mark.xdist_group("kept_keys")


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.sampled_from([512, 600, 768]), width=st.sampled_from([16, 32]),
       heads=st.sampled_from([1, 2, 4]), mask=st.sampled_from(["where", "add", "none"]),
       height=st.integers(1, 768), double_buffered=st.booleans(), resident=st.booleans(),
       sram_kib=st.sampled_from([128, 256, 2048]), spilled=st.booleans())
def test_reusing_groups_keep_their_keys_as_predicted(
        tmp_path: Path, tokens: int, width: int, heads: int, mask: str, height: int,
        double_buffered: bool, resident: bool, sram_kib: int, spilled: bool) -> None:
    path = save(causal_encoder(tokens=tokens, width=width, heads=heads, mask=mask),
                tmp_path, f"block_{tokens}_{width}_{heads}_{mask}")
    chip = [f"sram.bytes={sram_kib}KiB"]
    problem = api.prepare(str(path), overrides=chip)
    g = problem.graph
    names = [lay.name for lay in g.layers]
    mix = next(n for n in names if g.layer(n).op == "FlashAttention")
    half = names[:names.index(next(n for n in names[names.index(mix):]
                                   if g.layer(n).op == "Add")) + 1]
    tile = Tile(1, min(height, tokens), 1)
    spilled = spilled and mask != "none"  # unmasked keys are no prefix: nothing to spill
    resident = resident or spilled  # spilled keys run with weights resident (mode_problem)
    plan = hand_plan(problem, [Placement.of(half, tile, resident, double_buffered,
                                            halo_reuse=True, keys_spilled=spilled)])
    group = next(gr for gr in plan.groups if mix in gr.layers)
    io = group_io(g, group.layers)
    assert io.inputs == ("input",) and len(io.outputs) == 1
    kv = g.layer(mix).fmap_inputs[1:]
    # tile i reads back the i * height rows (keys) of k and v made before it
    starts = range(0, tokens, tile.h)
    back = sum(g.elems(t) // tokens * a for t in kv for a in starts) if spilled else 0
    fmap_read = group.predicted.dram_read_bytes - group.predicted.weight_read_bytes
    assert fmap_read == 2 * (g.elems("input") + back)
    assert group.predicted.dram_write_bytes == 2 * (
        g.elems(io.outputs[0]) + (sum(g.elems(t) for t in kv) if spilled else 0))
    report = api.verify_in_memory(problem, plan, seed=5)
    assert report.outputs_match, report.first_output_mismatch
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    # the chip may be too small for the hand-made tile; the planner's plan must fit it
    assert_verifies(problem, api.plan_problem(problem, "cpsat"))
