"""The emulator's clock (emulator.clock): hand-made tile sequences with answers worked out by
hand, and the clock against the cost model's closed form on small models.

Unit chip: 1 byte per cycle on the DRAM link, one core doing 1 MAC and 1 vector op per
cycle, so a tile's load of L bytes takes L cycles and M MACs take M cycles.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence
from fractions import Fraction
from math import ceil
from pathlib import Path

import pytest

from fuseplan.emulator.clock import ClockChip, GroupRun, TileEvents, simulate_group, simulate_plan
from fuseplan.hardware.chip import Chip, load_chip
from fuseplan.planner.app import api
from fuseplan.planner.cost.schedule import Step, double_buffered_span
from fuseplan.planner.geometry.regions import group_io, tile_count
from tests import models

ROOT = Path(__file__).resolve().parent.parent

UNIT = """
name: unit
dtype_bytes: 1
clock_ghz: 1.0
clusters: 1
cores_per_cluster: {cores}
dram: {{bandwidth_gbps: {gbps}, pj_per_byte: 10}}
sram: {{bytes: 1MiB, bandwidth_gbps: 64, pj_per_byte: 1}}
core: {{macs_per_cycle: 1, vector_lanes: 1, pj_per_mac: 2, pj_per_vector_op: 0.5}}
"""


def unit_chip(tmp_path: Path, cores: int = 1, gbps: float = 1) -> Chip:
    path = tmp_path / f"unit{cores}_{gbps}.yaml"
    path.write_text(UNIT.format(cores=cores, gbps=gbps))
    return load_chip(str(path))[0]


ONE = ClockChip(Fraction(1), cores=1, macs_per_cycle=1, vector_lanes=1)


def tile(load: int, macs: int, store: int, weights: int = 0, vector_ops: int = 0
         ) -> TileEvents:
    return TileEvents(load, weights, macs, vector_ops, store)


def run(tiles: Sequence[TileEvents], double_buffered: bool, prefetch: bool = False
        ) -> GroupRun:
    return GroupRun((tuple(tiles),), double_buffered, prefetch)


def test_serial_group_is_the_sum_of_its_transfers_and_compute() -> None:
    tiles = [tile(10, 30, 5, weights=4), tile(12, 20, 5), tile(8, 7, 3, vector_ops=9)]
    trace = simulate_group(ONE, run(tiles, double_buffered=False))
    assert trace.end == (14 + 5) + (12 + 5) + (8 + 3) + (30 + 20 + 7 + 9)
    # the link is busy exactly for the transfers, in six pieces
    assert len(trace.busy) == 6 and sum(b - a for a, b in trace.busy) == 14 + 5 + 12 + 5 + 8 + 3


def test_double_buffered_compute_bound_is_fill_compute_drain() -> None:
    # 4 tiles, 10 B in, 30 MACs, 5 B out; the first also loads 4 B of weights: every
    # transfer after the first load hides behind compute
    tiles = [tile(10, 30, 5, weights=4)] + [tile(10, 30, 5)] * 3
    trace = simulate_group(ONE, run(tiles, double_buffered=True))
    fill, compute, drain = 14, 4 * 30, 5
    assert trace.end == fill + compute + drain
    assert trace.compute_busy == compute


def test_double_buffered_dram_bound_trace() -> None:
    # 3 tiles, 30 B in, 10 MACs, 5 B out. By hand: load0 [0,30], load1 [30,60], compute0
    # [30,40]; store0 (ready 40) [60,65] before load2 (ready 60) [65,95]; compute1 [60,70],
    # store1 [95,100]; compute2 [95,105], store2 [105,110]
    trace = simulate_group(ONE, run([tile(30, 10, 5)] * 3, double_buffered=True))
    assert trace.busy == ((0, 30), (30, 60), (60, 65), (65, 95), (95, 100), (105, 110))
    assert trace.end == 110
    # the closed form's fill + max(rest, compute) + drain is 30 + 70 + 5: the last tile's
    # compute beyond the store before it (10 - 5 cycles) is not overlapped
    assert trace.end - (30 + max(2 * 30 + 2 * 5, 3 * 10) + 5) == 5


def test_second_buffer_waits_for_the_compute_that_frees_it() -> None:
    # tile 2 may not load before tile 0's compute (100 cycles) has freed its buffer
    tiles = [tile(1, 100, 1), tile(1, 1, 1), tile(1, 1, 1)]
    trace = simulate_group(ONE, run(tiles, double_buffered=True))
    # load0 [0,1], load1 [1,2]; compute0 [1,101] frees the buffer: store0 [101,102] (ready
    # first on the tie), load2 [102,103]; compute1 [101,102], its store (ready 102) after
    # load2 (ready 101): [103,104]; compute2 [103,104], store2 [104,105]
    assert trace.busy == ((0, 1), (1, 2), (101, 102), (102, 103), (103, 104), (104, 105))
    assert trace.end == 105



def test_a_tile_that_loads_nothing_takes_no_buffer() -> None:
    # halo reuse: tiles 1 and 3 compute from what tiles 0 and 2 brought and load nothing.
    # load0 [0,30]; load1 (empty) at 30; load2 needs the buffer no tile holds yet: [30,60]
    # (the old queue had it wait for compute0); compute0 [30,50], compute1 [50,90] still
    # reads tile 0's buffer, so load4 waits for it: [90,120]; compute2 [90,110], compute3
    # [110,111], compute4 [120,125]
    tiles = [tile(30, 20, 0), tile(0, 40, 0), tile(30, 20, 0), tile(0, 1, 0), tile(30, 5, 0)]
    trace = simulate_group(ONE, run(tiles, double_buffered=True))
    assert trace.busy == ((0, 30), (30, 60), (90, 120))
    assert trace.end == 125
    # the planner's own play of such a run (planner.cost.schedule) follows the same rule
    steps = [Step(t.load_bytes, t.macs, t.store_bytes) for t in tiles]
    assert double_buffered_span(1.0, steps) == 125

def test_fractional_bandwidth_rounds_the_group_once(tmp_path: Path) -> None:
    chip = unit_chip(tmp_path, gbps=1.5)  # 3 bytes per 2 cycles
    times = simulate_plan(chip, [run([tile(4, 3, 2)] * 2, double_buffered=False)])
    # (4 + 2) B * 2 / 3 per tile = 4 cycles of transfers, 3 of compute, twice
    assert times[0].cycles == 14
    times = simulate_plan(chip, [run([tile(5, 3, 0)], double_buffered=False)])
    assert times[0].cycles == 7  # ceil(10 / 3 + 3) = ceil(6.33)


def test_prefetch_fills_the_previous_groups_idle_link(tmp_path: Path) -> None:
    chip = unit_chip(tmp_path)
    first = run([tile(10, 50, 10)], double_buffered=False)  # link idle 50 cycles at [10, 60]
    for weights, hidden in ((20, 20), (70, 50)):
        second = run([tile(10, 5, 5, weights=weights)], double_buffered=False, prefetch=True)
        alone = simulate_plan(chip, [first, run(second.bands[0], double_buffered=False)])
        times = simulate_plan(chip, [first, second])
        assert times[0].cycles == alone[0].cycles == 70
        assert times[1].prefetch_cycles == hidden and times[1].prefetch_start == 10
        assert times[1].cycles == alone[1].cycles - hidden == 10 + weights + 5 + 5 - hidden
        # its prefetched share of the link counts as its own
        assert times[1].dram_busy == 10 + weights + 5


def test_prefetch_of_the_first_group_is_ignored(tmp_path: Path) -> None:
    chip = unit_chip(tmp_path)
    times = simulate_plan(chip, [run([tile(10, 5, 5, weights=20)], False, prefetch=True)])
    assert times[0].cycles == 40 and times[0].prefetch_cycles == 0


def test_prefetch_uses_the_gaps_of_a_double_buffered_group(tmp_path: Path) -> None:
    chip = unit_chip(tmp_path)
    # two tiles: load0 [0,20] (4 B weights), load1 [20,36], compute [20,52] and [52,84],
    # store0 [52,68], store1 [84,100]: gaps [36,52] and [68,84], 32 cycles
    first = run([tile(16, 32, 16, weights=4), tile(16, 32, 16)], double_buffered=True)
    second = run([tile(32, 576, 32, weights=36)], double_buffered=False, prefetch=True)
    a, b = simulate_plan(chip, [first, second])
    assert (a.start, a.end) == (0, 100)
    assert a.idle_gaps() == [(36, 52), (68, 84)]
    assert b.prefetch_cycles == 32 and b.prefetch_start == 36
    assert b.cycles == 32 + 36 - 32 + 576 + 32


def test_bands_compute_at_once_on_their_own_cores(tmp_path: Path) -> None:
    chip = unit_chip(tmp_path, cores=2)  # one core per band
    band = (tile(4, 20, 2, weights=6), tile(4, 20, 2))
    banded = GroupRun((band, band), double_buffered=True)
    trace = simulate_group(ClockChip.of(chip), banded)
    # by hand: band 0's first load carries the broadcast weights [0,10], band 1's [10,14],
    # then the second loads [14,18], [18,22]; band 0 computes [10,30], [30,50], band 1
    # (waiting for the weights and its load) [14,34], [34,54]; stores at 30, 34, 50, 54
    assert trace.busy[:4] == ((0, 10), (10, 14), (14, 18), (18, 22))
    assert trace.end == 56 and trace.compute_busy == 40
    # the same four tiles on both cores as one band: 10 cycles each
    one = simulate_group(ClockChip.of(chip), run([*band, band[1], band[1]], True))
    assert one.compute_busy == 40 and one.end == 10 + 40 + 2


def test_band_waits_for_the_broadcast_weights_of_its_step() -> None:
    # streamed weights: every step's 10 B are one transfer, carried by band 0's tile
    two = ClockChip(Fraction(1), cores=2, macs_per_cycle=1, vector_lanes=1)
    band = (tile(1, 5, 1, weights=10), tile(1, 5, 1, weights=10))
    trace = simulate_group(two, GroupRun((band, band), double_buffered=False))
    # step 0: band 0 [0,11], band 1 [11,12]; computes [11,16], [12,17]; stores [16,17],
    # [17,18]; step 1: band 0 [18,29] (weights again), band 1 [29,30] ...
    assert trace.busy[:5] == ((0, 11), (11, 12), (16, 17), (17, 18), (18, 29))
    assert trace.end == 36


def test_the_clock_does_not_use_the_cost_model() -> None:
    """emulator.clock imports nothing of the planner; the emulator takes only the Counters
    record from planner.cost (planner.cost.counters), never the cost model."""
    for path in sorted((ROOT / "emulator").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module} | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                                     for a in n.names}
        cost = {m for m in imported if m.startswith("fuseplan.planner.cost")}
        assert cost <= {"fuseplan.planner.cost.counters"}, (path.name, cost)
        if path.name == "clock.py":
            assert not {m for m in imported if m.startswith("fuseplan.planner")}, imported
    # nor through what it imports: loading the emulator leaves the cost model unloaded (the
    # Counters record it does load shows the probe sees what loads)
    probe = ("import sys, fuseplan.emulator.run; "
             "print(sorted(m for m in sys.modules if m.startswith('fuseplan.planner.cost')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "'fuseplan.planner.cost.counters'" in out, out
    assert "fuseplan.planner.cost.model" not in out, out


@pytest.mark.parametrize("double_buffered", [False, True])
def test_the_closed_form_is_a_lower_bound_of_uniform_groups(double_buffered: bool) -> None:
    """For uniform tiles the clock never beats fill + max(rest, compute) + drain (serial:
    transfers + compute), and exceeds it by at most one tile's compute."""
    for load, macs, store, n in ((10, 30, 5, 4), (30, 10, 5, 3), (7, 7, 7, 6), (1, 50, 40, 5)):
        tiles = [tile(load, macs, store)] * n
        trace = simulate_group(ONE, run(tiles, double_buffered))
        moved, compute = n * (load + store), n * macs
        closed = (load + max(moved - load - store, compute) + store if double_buffered
                  else moved + compute)
        assert closed <= trace.end <= closed + macs, (load, macs, store, n)


# --------------------------------------------------------------------------- against the plan

SMALL = {"chain": lambda: models.chain_cnn(seed=1, h=64, w=64),
         "residual": lambda: models.residual_net(seed=2),
         "inception": lambda: models.inception_net(seed=3)}


@pytest.mark.parametrize("preset", ["frustum_npu", "cluster4x4"])
@pytest.mark.parametrize("name", list(SMALL))
def test_emulated_cycles_bound_the_closed_form(tmp_path: Path, name: str, preset: str) -> None:
    """The documented bound (docs/how/emulator.md, "Emulated against predicted cycles"), on
    small models:
    the closed form is a lower bound of every group's schedule up to rounding (2 cycles;
    groups whose weights were prefetched may hide more than it credits), a group never takes
    longer than its transfers and compute one after another (each tile's compute rounded up:
    at most 2 cycles a tile), and the plan's total is not below the prediction by more
    than the rounding. The upper bound is worked out here from the counters and the chip."""
    problem = api.prepare(str(models.save(SMALL[name](), tmp_path, name)), hardware=preset)
    plan = api.plan_problem(problem, "shortest-path", "latency")
    report = api.verify_in_memory(problem, plan)
    assert report.ok, (report.first_counter_mismatch, report.capacity_violations)
    chip, graph = problem.chip, problem.graph
    per_second = Fraction(str(chip.dram.bandwidth_gbps)) / Fraction(str(chip.clock_ghz))
    for group, got in zip(plan.groups, report.per_group, strict=True):
        p = group.predicted
        tiles = tile_count(graph, group_io(graph, group.layers), group.tile)
        serial = (ceil(p.dram_bytes / per_second) + ceil(p.macs / (chip.cores * chip.core
                                                                   .macs_per_cycle))
                  + ceil(p.vector_ops / (chip.cores * chip.core.vector_lanes)) + 2 * tiles)
        what = f"{name} on {preset}, group {group.id} ({tiles} tiles)"
        assert got.cycles <= serial, what
        if not group.prefetch and group.tile.bands == 1:
            assert got.cycles >= p.cycles - 2, what
    cycles = report.cycles.to_json()
    assert cycles["emulated"] == sum(c.cycles for c in report.per_group)
    assert cycles["emulated"] >= cycles["predicted"] - 2 * len(plan.groups), cycles


def test_a_group_that_ran_no_tile_takes_no_time() -> None:
    """An empty table of boxes (or no band at all) is a zero-length group, not a crash."""
    for run_ in (GroupRun(((),), double_buffered=True), GroupRun((), double_buffered=False)):
        trace = simulate_group(ONE, run_, Fraction(7))
        assert (trace.end, trace.busy, trace.compute_busy) == (7, (), 0)


@pytest.mark.parametrize("gbps,ghz", [(256, 1.0), (25.6, 1.1), (100, 0.7), (1e-3, 3.0),
                                      (68.26, 1.4)])
def test_transfer_cycles_are_the_exact_ceiling(gbps: float, ghz: float) -> None:
    """The cost model's integer transfer time is ceil(bytes / bytes per cycle), exactly, at
    rates that are not whole bytes per cycle (an off-by-one here moves every group's time)."""
    from fuseplan.planner.cost.model import dram_bytes_per_cycle, transfer_cycles

    chip = load_chip(None, [f"dram.bandwidth_gbps={gbps}", f"clock_ghz={ghz}"])[0]
    rate = dram_bytes_per_cycle(chip)
    for nbytes in (0, 1, 7, 255, 256, 257, 10**6 + 3, 3 * 2**30, -5):
        assert transfer_cycles(nbytes, rate) == ceil(Fraction(nbytes) / rate), (nbytes, rate)
