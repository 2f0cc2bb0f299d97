"""The first tile played layer by layer (planner.cost.layered, emulator.clock): the weights of
a group arrive in layer order after the tile's maps and each layer (each chunk of a
streamed layer's output channels) computes once its own weights are in. Schedules worked out
by hand; the planner's account against the emulator's clock on random layers (they share no
code); and plans that verify with predicted cycles where the emulator's clock finds them.
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.emulator.clock import ClockChip, GroupRun, LayerEvents, TileEvents, simulate_group
from fuseplan.planner.app import api
from fuseplan.planner.cost.schedule import LayerStep, layered_overlap, layered_span
from fuseplan.planner.plan.data import Plan
from tests import models

ONE = ClockChip(Fraction(1), cores=1, macs_per_cycle=1, vector_lanes=1)
WHOLE = Fraction(1)


def test_resident_layers_compute_as_their_weights_arrive() -> None:
    # maps 10 B, then 100 B of weights for each of two layers computing 50 cycles each:
    # layer 1's weights are in at 110, it computes [110, 160]; layer 2's at 210: [210, 260]
    steps = [LayerStep(((100, WHOLE),), Fraction(50)), LayerStep(((100, WHOLE),), Fraction(50))]
    assert layered_span(Fraction(1), 10, steps) == 260
    # all loads first, then all compute: 210 + 100; the first layer's 50 are hidden
    assert layered_overlap(Fraction(1), 10, steps) == 51  # 50, rounded up past it
    # a layer without weights computes right after the one before it
    steps.insert(1, LayerStep((), Fraction(30)))
    assert layered_span(Fraction(1), 10, steps) == 260  # [160, 190] waits for nothing


def test_streamed_chunks_wait_for_their_buffer() -> None:
    # one layer in 3 chunks of 10 B, each computing a third of 90 cycles; two on chip at
    # once: chunk 0 in at 10, computes [10, 40]; chunk 1 in at 20, computes [40, 70];
    # chunk 2 may load once chunk 0 is done: [40, 50], computes [70, 100]
    third = Fraction(1, 3)
    step = [LayerStep(((10, third),) * 3, Fraction(90))]
    assert layered_span(Fraction(1), 0, step, ahead=2) == 100
    assert layered_span(Fraction(1), 0, step) == 100  # compute bound either way
    # loads of 60 B each: the link binds; chunk 2 loads after chunk 0 computed (at 90)
    step = [LayerStep(((60, third),) * 3, Fraction(30))]
    assert layered_span(Fraction(1), 0, step, ahead=2) == 60 + 60 + 60 + 10
    # a streamed group's first tile without the limit would load straight through
    assert layered_span(Fraction(1), 0, step) == 190
    # compute 100 per chunk. Pair: chunk 0 in at 60, computes [60, 160]; chunk 1 in at 120,
    # computes [160, 260]; chunk 2 loads [160, 220], computes [260, 360]
    step = [LayerStep(((60, third),) * 3, Fraction(300))]
    assert layered_span(Fraction(1), 0, step, ahead=2) == 360
    # a ring of 100 B: chunk 1 fills the 40 B free [60, 100], the rest once chunk 0 has
    # computed [160, 180], computes [180, 280]; chunk 2 likewise [180, 220] and [280, 300],
    # computes [300, 400]
    assert layered_span(Fraction(1), 0, step, room=100) == 400
    # a ring of 150 B: chunk 1 [60, 120]; chunk 2 takes the 30 B free [120, 150], the rest
    # once chunk 0 has computed [160, 190]: the cores never wait after the first chunk
    assert layered_span(Fraction(1), 0, step, room=150) == 360


def test_prefetched_bytes_shorten_the_stream_from_its_front() -> None:
    steps = [LayerStep(((100, WHOLE),), Fraction(50)), LayerStep(((100, WHOLE),), Fraction(50))]
    # the first layer's weights on chip already: it computes [10, 60]; layer 2 in at 110
    assert layered_span(Fraction(1), 10, steps, preloaded=100) == 160
    assert layered_span(Fraction(1), 10, steps, preloaded=150) == 110


def _events(layers: list[tuple[tuple[tuple[int, int], ...], int, int]], maps: int,
            ahead: int, room: int = 0) -> TileEvents:
    chunks = [tuple((size, Fraction(1, len(c))) for size, _ in c) for c, _, _ in layers]
    return TileEvents(maps, sum(s for c in chunks for s, _ in c),
                      sum(m for _, m, _ in layers), sum(v for _, _, v in layers), 0,
                      layers=tuple(LayerEvents(c, m, 0, v)
                                   for c, (_, m, v) in zip(chunks, layers, strict=True)),
                      ahead=ahead, room=room)


@settings(max_examples=60, deadline=None)
@given(layers=st.lists(st.tuples(st.lists(st.tuples(st.integers(1, 200), st.just(0)),
                                          max_size=3).map(tuple),
                                 st.integers(0, 300), st.integers(0, 50)),
                       min_size=1, max_size=6),
       maps=st.integers(0, 100), buffers=st.sampled_from(["any", "pair", "ring"]),
       spare=st.integers(0, 400), preloaded=st.integers(0, 150),
       bpc=st.sampled_from([Fraction(1), Fraction(3, 2)]), macs=st.sampled_from([1, 4]))
def test_the_clock_plays_the_planners_schedule(layers: list, maps: int, buffers: str,
                                               spare: int, preloaded: int, bpc: Fraction,
                                               macs: int) -> None:
    """The emulator's clock (its own code) against planner.cost.schedule's account: weights
    arriving freely (resident, with prefetched bytes), in pairs or through a ring."""
    ahead = 2 if buffers == "pair" else 0
    biggest = max((size for c, _, _ in layers for size, _ in c), default=0)
    room = biggest + spare if buffers == "ring" else 0
    preloaded = preloaded if buffers == "any" else 0
    tile = _events(layers, maps, ahead, room)
    clock = ClockChip(bpc, cores=1, macs_per_cycle=macs, vector_lanes=1)
    steps = [LayerStep(x.chunks, Fraction(x.macs, macs) + x.vector_ops) for x in tile.layers]
    assert clock.layered_end(tile, 1, Fraction(0), Fraction(0), Fraction(preloaded)) \
        == layered_span(bpc, maps, steps, preloaded=preloaded, ahead=ahead, room=room)
    # the whole group of that one tile ends there (no store), and never later than serially
    trace = simulate_group(clock, GroupRun(((tile,),), double_buffered=False))
    assert trace.end == layered_span(bpc, maps, steps, ahead=ahead, room=room)
    assert trace.end <= (maps + tile.weight_bytes) / bpc + sum(
        ceil(s.compute_cycles * share) for s in steps for _, share in s.chunks or ((0, 1),))


def _plan(model: Path, objective: str, sram: str, resident: bool | None = None
          ) -> tuple[api.Problem, Plan]:
    problem = api.prepare(str(model), hardware="soma_buffer", overrides=[f"sram.bytes={sram}"])
    return problem, api.plan_problem(problem, "cpsat", objective)


def _verified(problem: api.Problem, plan: Plan) -> None:
    report = api.verify_in_memory(problem, plan)
    assert report.outputs_match
    assert report.predicted_matches_emulated, report.first_counter_mismatch
    assert report.cycles.ok, report.cycles.to_json()


def _wide_chain(layers: int = 4, channels: int = 384, size: int = 14) -> onnx.ModelProto:
    """1x1 convs over a small map: weights dominate (SoMa's late ResNet stages)."""
    b = models._Builder(np.random.default_rng(0))
    x = b.one("Relu", [b.conv("input", 64, channels, 3, prefix="stem")])
    for _ in range(layers):
        x = b.one("Relu", [b.conv(x, channels, channels, 1)])
    return b.model((1, 64, size, size), x, 13, name="wide_chain")


@pytest.mark.parametrize(("name", "objective", "sram", "resident"), [
    ("residual", "traffic", "4MB", True), ("residual", "latency", "96KB", None),
    ("wide", "traffic", "4MB", True), ("wide", "traffic", "400KB", False),
    ("wide", "latency", "400KB", None)])
def test_plans_that_overlap_verify_their_cycles(tmp_path: Path, name: str, objective: str,
                                                sram: str, resident: bool | None) -> None:
    """Groups whose first tile hides compute behind its own weight loads (resident, or
    streamed in a group of one tile) on the SoMa-style chip: the emulator's clock agrees
    with the prediction within the stated rule."""
    model = models.residual_net(h=56, w=56) if name == "residual" else _wide_chain()
    problem, plan = _plan(models.save(model, tmp_path, name), objective, sram)
    if resident is not None:  # the plan the case is about: one group, hiding compute
        (group,) = plan.groups
        assert group.weights_resident is resident and group.predicted.overlap_cycles > 0
    _verified(problem, plan)
