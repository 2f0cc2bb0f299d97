"""A Gather of rows from a constant table by run-time indices (a word embedding) reads only
the rows its indices select, index count x row bytes, never the whole table and never
nothing: in the cost model, the floors and the emulator alike (planner.ir.graph.Graph.
row_gathers, the one definition they share)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hand import assert_verifies, hand_plan
from onnx import TensorProto, helper, numpy_helper

from fuseplan.emulator.run import emulate
from fuseplan.planner.app import api
from fuseplan.planner.cost.bounds import group_floor_bytes
from fuseplan.planner.cost.model import compulsory_bytes, group_tensors, region_sums
from fuseplan.planner.geometry.regions import Tile, group_chains, group_io
from fuseplan.planner.plan.placement import Placement
from tests.test_bounds import _floors_hold

ROWS, WIDTH, TOKENS = 50_000, 64, 128  # a 12.8 MB fp32 table: far bigger than any chip's SRAM


def embedding_model(rows: int = ROWS, width: int = WIDTH, tokens: int = TOKENS,
                    constant_ids: np.ndarray | None = None) -> onnx.ModelProto:
    """ids [1, T] -> Gather(table [rows, width]) -> e [1, T, width] -> MatMul w -> y; with
    ``constant_ids`` the indices are an initializer (and the model input is added to y)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, width)).astype(np.float32)
    w = (rng.standard_normal((width, width)) / 8).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")]
    if constant_ids is None:
        x = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, tokens])
    else:
        inits.append(numpy_helper.from_array(constant_ids.astype(np.int64), "ids"))
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, width])
        nodes[-1].output[0] = "p"
        nodes.append(helper.make_node("Add", ["p", "x"], ["y"], name="join"))
    graph = helper.make_graph(nodes, "embedding", [x], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _problem(tmp_path: Path, model: onnx.ModelProto, overrides: tuple[str, ...] = ()
             ) -> api.Problem:
    path = tmp_path / "embedding.onnx"
    onnx.save(model, str(path))
    return api.prepare(str(path), overrides=list(overrides))


def _rows_read(problem: api.Problem, layers: tuple[str, ...], tile: Tile) -> int:
    """A group's predicted DRAM reads beyond its weights and its inputs' boxes: the rows."""
    g, chip = problem.graph, problem.chip
    io = group_io(g, layers)
    sums = region_sums(g, io, group_chains(g, io), tile, group_tensors(g, io))
    cost = hand_plan(problem, [Placement.of(layers, tile)]).groups[0].predicted
    return cost.dram_read_bytes - cost.weight_read_bytes \
        - sum(sums[t] for t in io.inputs) * chip.dtype_bytes


@pytest.mark.parametrize(("solver", "overrides"), [
    ("shortest-path", ()), ("cpsat", ()), ("cpsat", ("sram.bytes=16KiB", "nram.bytes=4KiB"))])
def test_an_embedding_plans_and_verifies_reading_only_the_rows_it_gathers(
        tmp_path: Path, solver: str, overrides: tuple[str, ...]) -> None:
    """Planned by either planner, on the default chip and on one whose SRAM holds a few
    tokens: the floor counts each gathered row once, the table is no weight and never
    'cannot fit', and the plan verifies with every counter as predicted."""
    problem = _problem(tmp_path, embedding_model(), overrides)
    g, chip = problem.graph, problem.chip
    dt = chip.dtype_bytes
    assert g.row_gathers == {"e": "table"}
    assert ROWS * WIDTH * dt > chip.sram.bytes  # the table could never sit on chip
    plan = api.plan_problem(problem, solver)
    rows = TOKENS * WIDTH * dt  # index count x row bytes
    ids, out, w = TOKENS * dt, TOKENS * WIDTH * dt, WIDTH * WIDTH * dt
    # the floor: the indices, each row, the weights read once and the output written once
    assert compulsory_bytes(g, chip) == ids + rows + w + out
    assert plan.compulsory_dram_bytes == ids + rows + w + out
    assert plan.totals.weight_read_bytes == w  # the table is never read whole
    embed = next(grp for grp in plan.groups if "embed" in grp.layers)
    assert embed.predicted.dram_read_bytes >= rows
    assert plan.totals.dram_bytes >= compulsory_bytes(g, chip)
    assert_verifies(problem, plan)


@pytest.mark.parametrize("th", [16, 40, 128])
def test_token_tiles_read_each_row_once(tmp_path: Path, th: int) -> None:
    """Tiles of `th` tokens each fetch their own rows: the table rows crossing DRAM are the
    index count x row bytes whatever the tile (a tile of 16 tokens reads 16 rows); the group
    verifies, every counter as predicted, and its floor counts the rows too."""
    problem = _problem(tmp_path, embedding_model())
    g, chip = problem.graph, problem.chip
    layers = ("embed", "proj")
    tile = Tile(1, th, 1)
    rows = TOKENS * WIDTH * chip.dtype_bytes
    assert _rows_read(problem, layers, tile) == rows
    plan = hand_plan(problem, [Placement.of(layers, tile)])
    group = plan.groups[0]
    io = group_io(g, layers)
    floor = group_floor_bytes(g, io, group_chains(g, io), chip)
    assert floor == (TOKENS + WIDTH * WIDTH) * chip.dtype_bytes + rows + rows  # ids, w, rows, y
    assert floor <= group.predicted.dram_bytes
    assert_verifies(problem, plan)


def test_repeated_indices_fetch_their_row_again_and_the_rows_are_the_tables(
        tmp_path: Path) -> None:
    """Indices with repeats, a negative one and the table's last row: the emulator fetches
    one row per index (a repeat fetched again, as a DMA gather does), in 16-token tiles, and
    its outputs are the table's rows times w."""
    problem = _problem(tmp_path, embedding_model())
    g, chip = problem.graph, problem.chip
    ids = np.random.default_rng(1).integers(0, 40, (1, TOKENS))  # many repeats
    ids[0, :3] = [ROWS - 1, -1, -ROWS]
    plan = hand_plan(problem, [Placement.of(("embed", "proj"), Tile(1, 16, 1))])
    result = emulate(g, plan, chip, {"ids": ids})
    table, w = g.constants["table"], g.constants["w"]
    expected = table[np.where(ids < 0, ids + ROWS, ids)] @ w
    np.testing.assert_allclose(result.outputs["y"], expected, rtol=1e-5, atol=1e-5)
    (emulated,), predicted = result.groups, plan.groups[0].predicted
    assert emulated.dram_read_bytes == predicted.dram_read_bytes
    assert emulated.first_load_bytes == predicted.first_load_bytes
    assert emulated.redundant_read_bytes == predicted.redundant_read_bytes
    # 8 tiles: each loads the whole index vector (the Gather's map reads it whole) and its
    # own 16 rows; the weights once
    dt = chip.dtype_bytes
    assert emulated.dram_read_bytes == 8 * TOKENS * dt + TOKENS * WIDTH * dt + WIDTH * WIDTH * dt


def test_floors_stay_below_every_searched_cost_of_an_embedding(tmp_path: Path) -> None:
    problem = _problem(tmp_path, embedding_model(), ("sram.bytes=16KiB", "nram.bytes=4KiB"))
    assert _floors_hold(problem) > 0


def test_constant_indices_are_folded_and_a_gathered_map_moves_as_before(
        tmp_path: Path) -> None:
    """Constant indices into a constant table fold at load: no Gather is left, no row is
    counted; a Gather of a run-time tensor is a movement op reading nothing from a table."""
    ids = np.arange(TOKENS)[None, :] % 7
    problem = _problem(tmp_path, embedding_model(constant_ids=ids))
    assert "embed" not in {lay.name for lay in problem.graph.layers}
    assert problem.graph.row_gathers == {}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["x", "pick"], ["y"], name="pick_tokens", axis=1)],
        "moves", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, WIDTH])],
        [numpy_helper.from_array(np.array([0, 3, 3, 9], np.int64), "pick")]),
        opset_imports=[helper.make_opsetid("", 17)])
    moved = _problem(tmp_path, model)
    assert [lay.op for lay in moved.graph.layers] == ["Gather"]
    assert moved.graph.row_gathers == {}
    plan = api.plan_problem(moved, "shortest-path")
    assert plan.totals.dram_read_bytes == TOKENS * WIDTH * moved.chip.dtype_bytes
    assert_verifies(moved, plan)
