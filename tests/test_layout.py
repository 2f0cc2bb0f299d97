"""planner.ir.layout: the standard layouts' axes, and that graph build gives every zoo tensor
the layout the code before layouts assumed (rank >= 4: NCHW, last two axes H and W)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import prod

import numpy as np
import onnx
import pytest

from fuseplan.planner.front.graph_build import build_graph, node_attrs
from fuseplan.planner.front.onnx_load import ZOO, LoadedModel
from fuseplan.planner.front.stretches import Stretches, find_stretches
from fuseplan.planner.ir.index_maps import IndexMap, facts_of, index_maps, regrouped
from fuseplan.planner.ir.layout import (
    Layout,
    LayoutKind,
    carried,
    flat,
    heads,
    layout_of,
    nchw,
    ncl,
    nhwc,
    sequence,
    tokens,
)
from fuseplan.planner.ir.ops import AxisMove, op_spec


def _old_dims(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The (N, C, H, W) view regions.dims computed before layouts, inline on the rank."""
    if len(shape) >= 4:
        return shape[0], prod(shape[1:-2]), shape[-2], shape[-1]
    if not shape:
        return 1, 1, 1, 1
    return shape[0], prod(shape[1:]), 1, 1


@pytest.mark.parametrize("layout, axes", [
    (nchw(), (0, (1,), 2, 3)),
    (nchw(5), (0, (1, 2), 3, 4)),  # channel shuffles: N, groups, C/groups, H, W
    (nhwc(), (0, (3,), 1, 2)),
    (tokens(), (0, (2,), 1, None)),
    (heads(), (0, (1, 3), 2, None)),
    (flat(2), (0, (1,), None, None)),
    (flat(0), (None, (), None, None)),
])
def test_standard_layouts(layout: Layout,
                          axes: tuple[int | None, tuple[int, ...], int | None, int | None]
                          ) -> None:
    assert (layout.batch_axis, layout.channel_axes, layout.row_axis, layout.col_axis) == axes
    every = [a for a in (layout.batch_axis, *layout.channel_axes, layout.row_axis,
                         layout.col_axis) if a is not None]
    assert sorted(every) == list(range(layout.rank)), "each axis plays exactly one part"
    # tiles cut every layout with rows (tokens and heads are one column wide), none flat
    assert layout.spatial == (layout.kind is not LayoutKind.FLAT)


def test_dims_by_layout() -> None:
    assert nchw().dims((2, 3, 5, 7)) == (2, 3, 5, 7)
    assert nchw(5).dims((1, 4, 6, 5, 7)) == (1, 24, 5, 7)
    assert nhwc().dims((2, 5, 7, 3)) == (2, 3, 5, 7)
    assert tokens().dims((2, 196, 768)) == (2, 768, 196, 1)
    assert heads().dims((2, 12, 196, 64)) == (2, 12 * 64, 196, 1)
    assert flat(2).dims((8, 1000)) == (8, 1000, 1, 1)
    assert flat(0).dims(()) == (1, 1, 1, 1)


def test_box_index_cuts_batch_rows_and_columns() -> None:
    x = np.arange(2 * 3 * 5 * 7).reshape(2, 3, 5, 7)
    want = x[1:2, :, 1:4, 2:6]
    assert np.array_equal(x[nchw().index(slice(1, 2), slice(1, 4), slice(2, 6))], want)
    y = x.transpose(0, 2, 3, 1)  # the same map channels-last
    got = y[nhwc().index(slice(1, 2), slice(1, 4), slice(2, 6))]
    assert np.array_equal(got.transpose(0, 3, 1, 2), want)
    # untiled tensors are cut along the batch only
    z = np.arange(12).reshape(4, 3)
    assert np.array_equal(z[flat(2).index(slice(1, 3), slice(0, 1), slice(0, 1))], z[1:3])


def test_nchw_needs_rows_and_columns() -> None:
    with pytest.raises(ValueError, match="rank >= 4"):
        nchw(3)


@pytest.mark.parametrize("rank", range(7))
def test_inference_is_nchw_from_rank_four(rank: int) -> None:
    shape = tuple(range(2, 2 + rank))
    layout = layout_of(shape)
    assert layout.rank == rank
    assert layout.kind is (LayoutKind.NCHW if rank >= 4 else LayoutKind.FLAT)
    assert layout.spatial == (rank >= 4)
    if rank >= 4:
        assert (layout.row_axis, layout.col_axis) == (rank - 2, rank - 1)
    assert layout.dims(shape) == _old_dims(shape)
    assert layout_of(shape) is layout, "one shared layout per rank"


@pytest.mark.parametrize("name", ["shufflenet", sorted(ZOO)[0]])
def test_zoo_tensors_get_the_layouts_the_code_assumed(
        zoo_model: Callable[[str], LoadedModel], name: str) -> None:
    """shufflenet has rank-5 channel shuffles and rank-2 classifier tensors."""
    graph = build_graph(zoo_model(name))
    ranks = set()
    for t, shape in graph.shapes.items():
        layout = graph.layout(t)
        ranks.add(len(shape))
        assert layout.spatial == (len(shape) >= 4), f"zoo:{name}: {t} {shape} {layout.kind}"
        if layout.spatial:
            assert (layout.batch_axis, layout.row_axis, layout.col_axis) \
                == (0, len(shape) - 2, len(shape) - 1), f"zoo:{name}: {t}"
        assert layout.dims(shape) == _old_dims(shape), f"zoo:{name}: {t} {shape}"
    assert 4 in ranks and ranks & {1, 2}, f"zoo:{name}: ranks {ranks}"
    if name == "shufflenet":
        assert 5 in ranks


@pytest.mark.parametrize("move, axis, shapes, axes, lands", [
    # Reshape: an axis survives where the elements before it and its extent are the same
    (AxisMove.REGROUP, 1, ((8, 197, 576), (8, 197, 3, 3, 64)), (), 1),
    (AxisMove.REGROUP, 0, ((197, 1, 768), (197, 12, 64)), (), 0),
    (AxisMove.REGROUP, 1, ((197, 1, 768), (197, 12, 64)), (), None),  # merged into heads
    (AxisMove.REGROUP, 1, ((12, 197, 64), (1, 12, 197, 64)), (), 2),
    (AxisMove.REGROUP, 1, ((8, 197, 192), (8, 197 * 192)), (), None),  # flattened away
    (AxisMove.REGROUP, 0, ((197, 1, 12, 64), (197, 768)), (), 0),
    (AxisMove.PERMUTE, 1, ((8, 197, 3, 3, 64), (3, 8, 3, 197, 64)), (2, 0, 3, 1, 4), 3),
    (AxisMove.PERMUTE, 0, ((8, 197, 3, 3, 64), (3, 8, 3, 197, 64)), (2, 0, 3, 1, 4), 1),
    (AxisMove.SQUEEZE, 3, ((1, 8, 3, 197, 64), (8, 3, 197, 64)), (0,), 2),
    (AxisMove.SQUEEZE, 0, ((1, 8, 3, 197, 64), (8, 3, 197, 64)), (0,), None),
    (AxisMove.UNSQUEEZE, 0, ((197, 1, 3, 768), (1, 197, 1, 3, 768)), (0,), 1),
    (AxisMove.SELECT, 3, ((3, 8, 3, 197, 64), (1, 8, 3, 197, 64)), (0,), 3),  # Split
    (AxisMove.SELECT, 1, ((3, 197, 1, 768), (197, 1, 768)), (0, -1), 0),  # Gather, scalar
    (AxisMove.SELECT, 1, ((8, 197, 192), (8, 192)), (1, -1), None),  # the class token
])
def test_moved_axis(move: AxisMove, axis: int, shapes: tuple[tuple[int, ...], ...],
                    axes: tuple[int, ...], lands: int | None) -> None:
    """Where a movement op's index map lands an input axis whole."""
    moved = _moved(move, shapes[0], shapes[1], axes)
    assert moved.lands(axis) == lands
    if lands is not None:
        assert shapes[1][lands] == shapes[0][axis]


def _moved(move: AxisMove, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
           axes: tuple[int, ...]) -> IndexMap:
    """The index map of the movement op `move` stands for: Reshape, Transpose (perm `axes`),
    Squeeze and Unsqueeze (`axes`), Split along axes[0], or a Gather of one index when
    axes[1:] == (-1,)."""
    if move is AxisMove.REGROUP:
        return regrouped(in_shape, out_shape)
    op, attrs, shapes = {
        AxisMove.PERMUTE: ("Transpose", {"perm": list(axes)}, [in_shape]),
        AxisMove.SQUEEZE: ("Squeeze", {}, [in_shape, (len(axes),)]),
        AxisMove.UNSQUEEZE: ("Unsqueeze", {}, [in_shape, (len(axes),)]),
    }.get(move, ("Gather" if axes[1:] == (-1,) else "Split", {"axis": axes[0]},
                 [in_shape, () if axes[1:] == (-1,) else (1,)]))
    facts = facts_of(op_spec(op), attrs, shapes, [0], out_shape, 17,
                     axes=axes if move in (AxisMove.SQUEEZE, AxisMove.UNSQUEEZE) else None)
    return index_maps(facts)[0]


def test_carried_token_layouts() -> None:
    # heads split off the channels: batch and tokens stay; [3, B, H, L, d] after the permute
    split = carried(tokens(), (8, 197, 576), (8, 197, 3, 3, 64),
                    regrouped((8, 197, 576), (8, 197, 3, 3, 64)).lands)
    assert split == sequence(5, 0, 1)
    assert split is not None and split.channel_axes == (2, 3, 4)
    stacked = carried(split, (8, 197, 3, 3, 64), (3, 8, 3, 197, 64),
                      _moved(AxisMove.PERMUTE, (8, 197, 3, 3, 64), (3, 8, 3, 197, 64),
                             (2, 0, 3, 1, 4)).lands)
    assert stacked is not None and (stacked.batch_axis, stacked.row_axis) == (1, 3)
    # squeezing the stack axis gives the canonical heads layout
    assert carried(stacked, (1, 8, 3, 197, 64), (8, 3, 197, 64),
                   _moved(AxisMove.SQUEEZE, (1, 8, 3, 197, 64), (8, 3, 197, 64),
                          (0,)).lands) == heads()
    # a batch of eight merged into the heads is lost: no layout is carried
    seq_first = sequence(3, 1, 0)
    assert carried(seq_first, (197, 8, 768), (197, 96, 64),
                   regrouped((197, 8, 768), (197, 96, 64)).lands) is None
    # a batch of one may merge away; the tokens carry on
    one = carried(seq_first, (197, 1, 768), (197, 12, 64),
                  regrouped((197, 1, 768), (197, 12, 64)).lands)
    assert one is not None and (one.batch_axis, one.row_axis) == (None, 0)
    # feature maps are not token tensors: nothing is carried from NCHW
    assert carried(nchw(), (1, 8, 4, 4), (1, 8, 16),
                   regrouped((1, 8, 4, 4), (1, 8, 16)).lands) is None


def _stretches(nodes: list[onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]],
               constants: dict[str, np.ndarray]) -> Stretches:
    return find_stretches(nodes, {**shapes, **{k: v.shape for k, v in constants.items()}},
                          constants, 17, node_attrs)


def test_stretches_follow_the_axes_ops_keep() -> None:
    """A patch merging of a channels-last map (Swin's: step-2 Slices joined along the
    channels, a LayerNorm over them) reads every part channels last: the Slices and the
    Concat keep rows and columns one element per element, so the map and its parts share
    the LayerNorm's rows and columns.
    A BatchNorm reading axis 1 as channels says the opposite: nothing is channels last."""
    half = {t: (1, 4, 4, 8) for t in ("a", "b")}
    consts = {"s0": np.array([0, 0]), "e": np.array([8, 8]), "ax": np.array([1, 2]),
              "st": np.array([2, 2]), "s1": np.array([1, 1])}
    nodes = [
        onnx.helper.make_node("Slice", ["x", "s0", "e", "ax", "st"], ["a"]),
        onnx.helper.make_node("Slice", ["x", "s1", "e", "ax", "st"], ["b"]),
        onnx.helper.make_node("Concat", ["a", "b"], ["c"], axis=-1),
        onnx.helper.make_node("LayerNormalization", ["c", "g"], ["y"], axis=-1),
    ]
    consts.update(g=np.ones(16, np.float32), g2=np.ones(4, np.float32))
    shapes = {"x": (1, 8, 8, 8), **half, "c": (1, 4, 4, 16), "y": (1, 4, 4, 16),
              "z": (1, 4, 4, 16)}
    # a step-2 Slice reads one element of x per element: x's rows and columns too
    assert _stretches(nodes, shapes, consts).channels_last == {"x", "a", "b", "c", "y"}
    nodes.append(onnx.helper.make_node("BatchNormalization", ["y", "g2", "g2", "g2", "g2"],
                                       ["z"]))
    assert not _stretches(nodes, shapes, consts).channels_last


def test_stretches_tokens_and_lengths() -> None:
    """A Conv1d's [N, C, L] maps are lengths; transposed into [N, L, C] and read by a
    LayerNorm over C they are tokens, the same axis L in both."""
    consts = {"w": np.ones((6, 6, 3), np.float32), "g": np.ones(6, np.float32)}
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
        onnx.helper.make_node("Relu", ["c"], ["r"]),
        onnx.helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        onnx.helper.make_node("LayerNormalization", ["t", "g"], ["y"], axis=-1),
    ]
    found = _stretches(nodes, {"x": (1, 6, 20), "c": (1, 6, 20), "r": (1, 6, 20),
                               "t": (1, 20, 6), "y": (1, 20, 6)}, consts)
    assert found.lengths >= {"x", "c", "r"} and found.tokens >= {"t", "y"}
    assert not found.tokens & found.lengths


def test_tokens_follow_a_join_along_them_and_a_one_element_window() -> None:
    """Sequences joined along their positions (a detector's scales) and a 1x1 conv of a
    sequence keep it: the index map reads the positions shifted or one for one
    (IndexMap.follows), though no output axis reads them whole (`lands`)."""
    joined = index_maps(facts_of(op_spec("Concat"), {"axis": 2},
                                 [(1, 16, 8), (1, 16, 4)], [0, 1], (1, 16, 12), 17))
    for im, shape in zip(joined, [(1, 16, 8), (1, 16, 4)], strict=True):
        assert carried(ncl(), shape, (1, 16, 12), im.lands) is None
        assert carried(ncl(), shape, (1, 16, 12), im.lands, im.follows) == sequence(3, 0, 2)
    conv = index_maps(facts_of(op_spec("Conv"), {"kernel_shape": [1, 1]},
                               [(1, 16, 4, 8), (32, 16, 1, 1)], [0], (1, 32, 4, 8), 17))[0]
    seq = sequence(4, 0, 3)  # a DFL-like [N, C, 4, L]: positions on axis 3
    assert carried(seq, (1, 16, 4, 8), (1, 32, 4, 8), conv.follows) == seq
    wide = index_maps(facts_of(op_spec("Conv"), {"kernel_shape": [3, 3], "pads": [1] * 4},
                               [(1, 16, 4, 8), (32, 16, 3, 3)], [0], (1, 32, 4, 8), 17))[0]
    assert carried(seq, (1, 16, 4, 8), (1, 32, 4, 8), wide.follows) is None
