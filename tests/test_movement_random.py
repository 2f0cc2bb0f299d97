"""Random graphs of every movement op between convs and matmuls (issue 42's property test,
the kinds tests/test_any_axis_random.py does not draw): Transposes of rank 3-6 by random
permutations (ones that move the tiled axis and ones that keep it), Reshapes that split and
merge adjacent axes (channels into groups, rows into two), Expand of broadcast operands and
grouped-query attention's repeat_kv (Unsqueeze -> Expand -> Reshape), Slice along channels
and along the tiled axis (steps 1 and 2), Pad, Concat of two branches along channels and
along the tiled axis, Squeeze and Unsqueeze of unit axes, tokens' positions split with
their channels or merged with them. Each excursion leaves an image
[1, C, H, W], a sequence [1, C, L] or tokens [1, L, C], read by a conv or a matmul, so the
planner has something to fuse and tile; on random chips every plan must run in the
emulator with outputs matching onnxruntime and every counter as predicted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hand import assert_verifies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_any_axis_random import _Net, save_net

from fuseplan.planner.app import api
from fuseplan.planner.core.errors import PlanningError


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _set(n: _Net, kind: str, shape: list[int]) -> None:
    """The map is now `shape`, read as `kind` (image, sequence or tokens)."""
    n.kind = kind
    if kind == "image":
        n.c, n.h, n.w = shape[1], shape[2], shape[3]
    elif kind == "sequence":
        n.c, n.h, n.w = shape[1], shape[2], 1
    else:
        n.c, n.h, n.w = shape[2], shape[1], 1
    assert n.shape() == list(shape), (n.shape(), shape)


def _reshape(n: _Net, shape: list[int]) -> str:
    return n.add("Reshape", [n.x, n.const("s", _i64(*shape))])


def _anchor(n: _Net) -> None:
    """A conv (image, sequence) or a Linear layer (tokens) reading the map: what the
    planner fuses the movement ops with. Wide maps narrow to 8 channels."""
    wide = n.c > 32
    out = 8 if wide else n.c
    if n.kind == "tokens":
        n.add("MatMul", [n.x, n.weight(n.c, out)])
    elif n.kind == "image":
        k = 1 if wide else int(n.rng.choice([1, 3]))
        n.add("Conv", [n.x, n.weight(out, n.c, k, k)], pads=[k // 2] * 4)
    else:
        k = 1 if wide else 3
        n.add("Conv", [n.x, n.weight(out, n.c, k)], pads=[k // 2] * 2)
    n.c = out
    n.add("Tanh", [n.x])


def _split_axes(n: _Net, shape: list[int], rank: int) -> list[int]:
    """`shape` with some axes split in two (row-major) until it has `rank` axes, or none
    is left to split."""
    out = list(shape)
    while len(out) < rank:
        splittable = [i for i, d in enumerate(out) if d % 2 == 0 and d >= 4]
        if not splittable:
            break
        i = int(n.rng.choice(splittable))
        f = int(n.rng.choice([f for f in (2, 4) if out[i] % f == 0 and out[i] // f >= 2]))
        out[i:i + 1] = [f, out[i] // f]
    return out


def _groups(n: _Net, shape: list[int], count: int) -> list[int]:
    """`shape` merged into `count` runs of adjacent axes (row-major products)."""
    cuts = sorted(int(c) for c in n.rng.choice(np.arange(1, len(shape)), count - 1,
                                              replace=False))
    bounds = [0, *cuts, len(shape)]
    return [int(np.prod(shape[a:b])) for a, b in zip(bounds, bounds[1:], strict=False)]


def _permute(n: _Net) -> None:
    """Split to rank 3-6, a random permutation (it may move the tiled axis or keep it),
    then either back (an activation between, the inverse permutation, the merge) or merged
    into a new image, sequence or tokens that a conv or a matmul reads."""
    shape = n.shape()
    split = _split_axes(n, shape, int(n.rng.integers(len(shape), 7)))
    if split != shape:
        _reshape(n, split)
    perm = [int(p) for p in n.rng.permutation(len(split))]
    n.add("Transpose", [n.x], perm=perm)
    permuted = [split[p] for p in perm]
    if n.rng.random() < 0.5:
        n.add("Relu", [n.x])
        n.add("Transpose", [n.x], perm=[int(p) for p in np.argsort(perm)])
        if split != shape:
            _reshape(n, shape)
        return
    kind = str(n.rng.choice(["image", "sequence", "tokens"]))
    target = [1, *_groups(n, permuted, 3 if kind == "image" else 2)]
    _reshape(n, target)
    _set(n, kind, target)


def _regroup(n: _Net) -> None:
    """Channels split into (groups, c), or the tiled axis into (L / g, g) parts, something
    per group or per part, merged back, or (an image's row pairs) merged into the columns
    as a pixel unshuffle does."""
    shape = n.shape()
    tiled = 1 if n.kind == "tokens" else 2
    axis = tiled if n.kind == "tokens" or (n.kind == "image" and n.rng.random() < 0.5) else 1
    d = shape[axis]
    if d % 2:
        _permute(n)
        return
    g = 4 if d % 4 == 0 and n.rng.random() < 0.5 else 2
    if axis == tiled:  # the parts inner: a range of L is a range of (L / g) whole
        split, part = [*shape[:axis], d // g, g, *shape[axis + 1:]], axis + 1
    else:  # the groups outer, as GroupNorm and attention heads split channels
        split, part = [*shape[:axis], g, d // g, *shape[axis + 1:]], axis
        if n.kind == "image" and shape[2] % 2 == 0 and n.rng.random() < 0.5:
            split = [1, g, d // g, shape[2] // 2, 2, shape[3]]  # rank 6: rows split too
    _reshape(n, split)
    scale = np.ones([1] * len(split), np.float32).repeat(g, axis=part)
    n.add("Mul", [n.x, n.const("g", (scale * n.rng.uniform(0.5, 1.5, scale.shape))
                                .astype(np.float32))])
    if n.rng.random() < 0.5:
        n.add("Softmax", [n.x], axis=part)  # across the groups or the parts
    if n.kind == "image" and axis == tiled and n.rng.random() < 0.5:
        target = [1, shape[1], d // g, g * shape[3]]
        _reshape(n, target)
        _set(n, "image", target)
        return
    _reshape(n, shape)


def _expand(n: _Net) -> None:
    """A pooled operand ([N, C, 1, 1], [1, 1, H, 1], ...) expanded to the map's shape and
    multiplied into it."""
    shape = n.shape()
    channel, tiled = (2, [1]) if n.kind == "tokens" else (1, [2, 3] if n.kind == "image" else [2])
    choices = [[channel], tiled, sorted([channel, *tiled])]  # and the channels with them
    if n.kind == "image":  # the columns folded, each row kept (and its channels with them)
        choices += [[3], [1, 3]]
    # not drawn: a fold of an image's rows alone
    axes = choices[int(n.rng.integers(len(choices)))]
    x = n.x
    pooled = n.add("ReduceMean", [x], axes=axes, keepdims=1)
    gate = n.add("Sigmoid", [pooled])
    wide = n.add("Expand", [gate, n.const("s", _i64(*shape))])
    n.add("Mul", [x, wide])


def _tokens(n: _Net) -> None:
    """The map as tokens [1, L, C]."""
    if n.kind == "image":
        _reshape(n, [1, n.c, n.h * n.w])
        _set(n, "sequence", [1, n.c, n.h * n.w])
    if n.kind == "sequence":
        n.add("Transpose", [n.x], perm=[0, 2, 1])
        _set(n, "tokens", [1, n.h, n.c])


def _positions(n: _Net) -> None:
    """Tokens' positions split into (L / g, g) and their channels into (C / h, h) by one
    Reshape, or the positions merged with the channels into one axis: something per element,
    and back."""
    _tokens(n)
    shape = n.shape()
    length, c = shape[1], shape[2]
    g = next((f for f in (4, 3, 2) if length % f == 0 and n.rng.random() < 0.7), 1)
    h = next((f for f in (4, 2) if c % f == 0 and n.rng.random() < 0.5), 1)
    split = [1, length // g, g, c // h, h] if n.rng.random() < 0.8 else [1, length * c]
    _reshape(n, [d for d in split if d > 1 or split.index(d) == 0])
    n.add("Mul", [n.x, n.const("m", np.array(n.rng.uniform(0.5, 1.5), np.float32))])
    n.add("Relu", [n.x])
    _reshape(n, shape)


def _repeat_kv(n: _Net) -> None:
    """Grouped-query attention's repeat_kv: keys [1, kv, L, d] -> Unsqueeze -> Expand
    [1, kv, rep, L, d] -> Reshape [1, kv * rep, L, d], read by the queries' product (an
    attention when the sequence is short) or by a per-head projection."""
    _tokens(n)
    length, kv, d = n.h, 2, 8
    rep = int(n.rng.choice([2, 3]))
    heads = kv * rep
    x = n.x
    n.add("MatMul", [x, n.weight(n.c, kv * d)])
    _reshape(n, [1, length, kv, d])
    n.add("Transpose", [n.x], perm=[0, 2, 1, 3])
    n.add("Unsqueeze", [n.x, n.const("a", _i64(2))])
    n.add("Expand", [n.x, n.const("s", _i64(1, kv, rep, length, d))])
    k = _reshape(n, [1, heads, length, d])
    if length <= 128 and n.rng.random() < 0.7:
        n.x = x
        n.add("MatMul", [x, n.weight(n.c, heads * d)])
        _reshape(n, [1, length, heads, d])
        q = n.add("Transpose", [n.x], perm=[0, 2, 1, 3])
        scores = n.add("MatMul", [q, n.add("Transpose", [k], perm=[0, 1, 3, 2])])
        n.add("Softmax", [scores], axis=-1)
        n.add("MatMul", [n.x, k])
    else:
        n.add("MatMul", [k, n.weight(d, d)])
    n.add("Transpose", [n.x], perm=[0, 2, 1, 3])
    _reshape(n, [1, length, heads * d])
    _set(n, "tokens", [1, length, heads * d])


def _slice(n: _Net) -> None:
    """A part along the channels or along the tiled axis, step 1 or 2."""
    shape = n.shape()
    channel = 2 if n.kind == "tokens" else 1
    tiled = 1 if n.kind == "tokens" else 2
    axis = channel if n.rng.random() < 0.5 else tiled
    if n.kind == "image" and n.rng.random() < 0.3:
        axis = 3
    step = int(n.rng.choice([1, 2]))
    start = int(n.rng.integers(0, 2))
    end = shape[axis] - int(n.rng.integers(0, 2))
    if len(range(start, end, step)) < 2:
        return
    n.add("Slice", [n.x, n.const("b", _i64(start)), n.const("e", _i64(end)),
                    n.const("a", _i64(axis)), n.const("t", _i64(step))])
    shape[axis] = len(range(start, end, step))
    _set(n, n.kind, shape)


def _pad(n: _Net) -> None:
    """Zero padding of the tiled axes, read by an unpadded conv (image, sequence)."""
    if n.kind == "tokens":
        _slice(n)
        return
    rank = len(n.shape())
    spatial = rank - 2
    pads = [0, 0] + [1] * spatial + [0, 0] + [1] * spatial
    n.add("Pad", [n.x, n.const("p", _i64(*pads))], mode="constant")
    n.add("Conv", [n.x, n.weight(n.c, n.c, *([3] * spatial))])


def _concat(n: _Net) -> None:
    """The map and a branch of it (its conv or its activation) joined along the channels
    or along the tiled axis."""
    shape = n.shape()
    channel = 2 if n.kind == "tokens" else 1
    tiled = 1 if n.kind == "tokens" else 2
    axis = channel if n.h > 32 or n.rng.random() < 0.5 else tiled
    x = n.x
    branch = n.add("Sigmoid", [x])
    if n.rng.random() < 0.5:
        _anchor(n)
        branch = n.x
    n.add("Concat", [x, branch], axis=axis)
    shape[axis] *= 2
    _set(n, n.kind, shape)


def _unit_axes(n: _Net) -> None:
    """Unit axes inserted and removed: around an activation, or a sequence made an image
    one row (or one column) wide for a 2-D conv, as 1-D convs are often exported."""
    shape = n.shape()
    if n.kind == "sequence" and n.rng.random() < 0.6:
        axis = int(n.rng.choice([2, 3]))
        n.add("Unsqueeze", [n.x, n.const("a", _i64(axis))])
        kernel = [1, 3] if axis == 2 else [3, 1]
        pads = [0, 1, 0, 1] if axis == 2 else [1, 0, 1, 0]
        n.add("Conv", [n.x, n.weight(n.c, n.c, *kernel)], pads=pads)
        n.add("Squeeze", [n.x, n.const("a", _i64(axis))])
        return
    axis = int(n.rng.integers(0, len(shape) + 1))
    n.add("Unsqueeze", [n.x, n.const("a", _i64(axis))])
    n.add("Relu", [n.x])
    n.add("Squeeze", [n.x, n.const("a", _i64(axis))])


def _windows(n: _Net) -> None:
    """Windows of p x p pixels (block: neighbours; grid: pixels p apart, as grid attention
    takes them) made a batch of sequences [windows, p p, C], attention with two heads in
    each, and the windows put back into the image."""
    p = 4 if n.kind == "image" and n.h % 4 == 0 and n.w % 4 == 0 else 0
    if not p or n.c % 2:
        _permute(n)
        return
    c, h, w = n.c, n.h, n.w
    grid = bool(n.rng.random() < 0.5)
    if grid:  # [1, C, p, H/p, p, W/p]: window (i, j) holds pixels (a H/p + i, b W/p + j)
        _reshape(n, [1, c, p, h // p, p, w // p])
        n.add("Transpose", [n.x], perm=[0, 3, 5, 2, 4, 1])
    else:
        _reshape(n, [1, c, h // p, p, w // p, p])
        n.add("Transpose", [n.x], perm=[0, 2, 4, 3, 5, 1])
    windows = (h // p) * (w // p)
    x = _reshape(n, [windows, p * p, c])
    heads = []
    for _ in range(2):  # queries and keys, each split into two heads
        n.x = x
        n.add("MatMul", [x, n.weight(c, c)])
        _reshape(n, [windows, p * p, 2, c // 2])
        heads.append(n.add("Transpose", [n.x], perm=[0, 2, 1, 3]))
    q, k = heads
    n.add("MatMul", [q, n.add("Transpose", [k], perm=[0, 1, 3, 2])])
    n.add("Softmax", [n.x], axis=-1)
    n.add("MatMul", [n.x, k])
    n.add("Transpose", [n.x], perm=[0, 2, 1, 3])
    if grid:
        _reshape(n, [1, h // p, w // p, p, p, c])
        n.add("Transpose", [n.x], perm=[0, 5, 3, 1, 4, 2])
    else:
        _reshape(n, [1, h // p, w // p, p, p, c])
        n.add("Transpose", [n.x], perm=[0, 5, 1, 3, 2, 4])
    _reshape(n, [1, c, h, w])


_OPS: tuple[Callable[[_Net], None], ...] = (_permute, _regroup, _expand, _repeat_kv, _slice,
                                            _pad, _concat, _unit_axes, _windows, _positions)


def _model(tmp: Path, ops: list[int], seed: int, h: int = 12, w: int = 16) -> str:
    n = _Net(np.random.default_rng(seed), "image", 8, h, w)
    given_shape = n.shape()
    _anchor(n)
    for i in ops:
        _OPS[i](n)
        _anchor(n)
    return save_net(tmp, n, given_shape, n.shape(), "random_movement_ops")


def _check(tmp: Path, ops: list[int], seed: int, sram_kib: int, solver: str) -> None:
    """Plan and verify; a small chip may refuse a layer whose axis the planner does not
    follow through a movement op (it then needs its input whole, as it must: never a wrong
    tile), but only with the capacity message, and the model then plans and verifies on a
    chip that holds it (test_mean_over_tokens_and_channels_folds_tile_by_tile: such a gap)."""
    path = _model(tmp, ops, seed)
    problem = api.prepare(path, overrides=(f"sram.bytes={sram_kib}KiB",))
    try:
        plan = api.plan_problem(problem, solver, time_limit=20)
    except PlanningError as exc:
        assert "cannot fit the chip" in str(exc) and sram_kib < 512, str(exc)
        problem = api.prepare(path, overrides=("sram.bytes=512KiB",))
        plan = api.plan_problem(problem, solver, time_limit=20)
    assert_verifies(problem, plan)


_EXAMPLE = dict(ops=st.lists(st.integers(0, len(_OPS) - 1), min_size=1, max_size=4),
                seed=st.integers(0, 2**16), sram_kib=st.sampled_from([16, 32, 64, 512]),
                solver=st.sampled_from(["cpsat", "greedy"]))
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                       HealthCheck.function_scoped_fixture])


@settings(max_examples=25, **_SETTINGS)  # type: ignore[arg-type]
@given(**_EXAMPLE)
def test_random_movement_ops_plan_and_verify(tmp_path: Path, ops: list[int], seed: int,
                                             sram_kib: int, solver: str) -> None:
    _check(tmp_path, ops, seed, sram_kib, solver)


@pytest.mark.slow
@settings(max_examples=150, **_SETTINGS)  # type: ignore[arg-type]
@given(**_EXAMPLE)
def test_random_movement_ops_plan_and_verify_more(tmp_path: Path, ops: list[int], seed: int,
                                                  sram_kib: int, solver: str) -> None:
    _check(tmp_path, ops, seed, sram_kib, solver)


# Minimal models of what the property test found (issue 42), deterministic.

def _save(tmp: Path, n: _Net, given_shape: list[int], out_shape: list[int]) -> str:
    return save_net(tmp, n, given_shape, out_shape, "movement_case")


def _verified(path: str, sram_kib: int, solver: str = "cpsat") -> api.Problem:
    problem = api.prepare(path, overrides=(f"sram.bytes={sram_kib}KiB",))
    plan = api.plan_problem(problem, solver, time_limit=20)
    assert_verifies(problem, plan)
    return problem


def test_repeat_kv_tiles_along_the_cache_positions(tmp_path: Path) -> None:
    """Keys [1, 2, 192, 8] -> Unsqueeze -> Expand [1, 2, 3, 192, 8] -> Reshape [1, 6, 192, 8]:
    the Expand was run on a tile of 96 positions with the whole map's shape ("operands
    could not be broadcast together with shapes (1,2,1,96,8) (1,2,3,192,8)"). A tile
    broadcasts only its input's unit axes (emulator.layer._tile_expand_shape)."""
    length = 192
    n = _Net(np.random.default_rng(1), "tokens", 16, length, 1)
    n.add("MatMul", [n.x, n.weight(16, 16)])
    _reshape(n, [1, length, 2, 8])
    n.add("Transpose", [n.x], perm=[0, 2, 1, 3])
    n.add("Unsqueeze", [n.x, n.const("a", _i64(2))])
    n.add("Expand", [n.x, n.const("s", _i64(1, 2, 3, length, 8))])
    _reshape(n, [1, 6, length, 8])
    n.add("MatMul", [n.x, n.weight(8, 8)])
    n.add("Tanh", [n.x])
    for solver in ("cpsat", "greedy", "layer"):
        problem = api.prepare(_save(tmp_path, n, [1, length, 16], [1, 6, length, 8]),
                              overrides=("sram.bytes=16KiB",))
        plan = api.plan_problem(problem, solver, time_limit=20)
        assert_verifies(problem, plan)
        expand = next(g for g in plan.groups if "expand4_node" in g.layers)
        assert expand.tile.h < length  # tiled along the positions, not held whole


def test_expand_of_a_channel_mean_on_a_tile_of_rows(tmp_path: Path) -> None:
    """A mean over the channels [1, 1, H, W] expanded to [1, C, H, W] and multiplied in: a
    tile of 3 rows was expanded to the whole map's shape."""
    n = _Net(np.random.default_rng(2), "image", 16, 24, 16)
    n.add("Conv", [n.x, n.weight(16, 16, 3, 3)], pads=[1] * 4)
    x = n.x
    n.add("ReduceMean", [x], axes=[1], keepdims=1)
    n.add("Sigmoid", [n.x])
    n.add("Expand", [n.x, n.const("s", _i64(1, 16, 24, 16))])
    n.add("Mul", [x, n.x])
    n.add("Conv", [n.x, n.weight(16, 16, 3, 3)], pads=[1] * 4)
    _verified(_save(tmp_path, n, [1, 16, 24, 16], [1, 16, 24, 16]), 16)


@pytest.mark.parametrize("case", ["merge", "recognizer"])
def test_a_moved_map_into_a_pointwise_conv(tmp_path: Path, case: str) -> None:
    """A Reshape merging a map's rows and columns into the last axis of a rank-4 tensor
    ([1, 16, 8, 12] -> [1, 1, 16, 96]) makes a sequence along axis 3; a 1x1 conv whose
    node names no kernel_shape (it comes from the weight) read it by identity maps but
    gave its output NCHW, rows on axis 2: "tile needs rows [0, 96) of a kernel result with
    11 rows". The recognizer of issue 42 (Transpose [1, 1, 40, 120] -> [1, 120, 1, 40]
    into a 1x1 conv) is its neighbour."""
    if case == "merge":
        n = _Net(np.random.default_rng(3), "image", 8, 12, 16)
        given_shape = [1, 8, 12, 16]
        n.add("Conv", [n.x, n.weight(8, 8, 3, 3)], pads=[1] * 4)
        n.add("Transpose", [n.x], perm=[0, 3, 1, 2])
        _reshape(n, [1, 1, 16, 96])
        n.add("Conv", [n.x, n.weight(1, 1, 1, 1)])
    else:
        n = _Net(np.random.default_rng(4), "image", 1, 40, 120)
        given_shape = [1, 1, 40, 120]
        n.add("Conv", [n.x, n.weight(1, 1, 3, 3)], pads=[1] * 4)
        n.add("Transpose", [n.x], perm=[0, 3, 1, 2])
        n.add("Conv", [n.x, n.weight(16, 120, 1, 1)])
    n.add("Tanh", [n.x])
    out_shape = [1, 1, 16, 96] if case == "merge" else [1, 16, 1, 40]
    path = _save(tmp_path, n, given_shape, out_shape)
    # the recognizer's Transpose moves the rows into the columns, which no row map
    # follows: it needs its 19 KiB input whole
    for sram_kib in (16 if case == "merge" else 32, 512):
        _verified(path, sram_kib, "cpsat")
        _verified(path, sram_kib, "layer")


def test_mean_over_tokens_and_channels_folds_tile_by_tile(tmp_path: Path) -> None:
    """A mean over the tokens and their channels together is folded tile by tile (the
    channels with the rows, planner.geometry.regions.folded_axes): the layer fits a 16 KiB
    chip although its input is 24 KiB."""
    n = _Net(np.random.default_rng(5), "tokens", 32, 384, 1)
    n.add("MatMul", [n.x, n.weight(32, 32)])
    x = n.add("Tanh", [n.x])
    n.add("ReduceMean", [x], axes=[1, 2], keepdims=1)
    n.add("Expand", [n.add("Sigmoid", [n.x]), n.const("s", _i64(1, 384, 32))])
    n.add("Mul", [x, n.x])
    n.add("MatMul", [n.x, n.weight(32, 32)])
    _verified(_save(tmp_path, n, [1, 384, 32], [1, 384, 32]), 16)


def test_a_sequence_split_with_its_channels_is_tiled(tmp_path: Path) -> None:
    """A Reshape splitting the positions and the channels at once carries the positions on
    their leading axis (planner.ir.index_maps.IndexMap.carries): the 24 KiB map is tiled and
    fits a 16 KiB chip."""
    n = _Net(np.random.default_rng(6), "tokens", 32, 192, 1)
    n.add("MatMul", [n.x, n.weight(32, 32)])
    _reshape(n, [1, 4, 48, 2, 16])
    n.add("Relu", [n.x])
    _reshape(n, [1, 192, 32])
    n.add("MatMul", [n.x, n.weight(32, 32)])
    _verified(_save(tmp_path, n, [1, 192, 32], [1, 192, 32]), 16)


def test_window_heads_merged_into_the_image_width_run_whole(tmp_path: Path) -> None:
    """Window attention whose heads, put back into the image, land on its last axis (the
    image's columns: [1, H/p, W/p, p, p, C] read as rows and columns): the property test's
    example (ops [8], seed 0, 16 KiB). Run in chunks of heads, a chunk is part of an axis
    the tiles' boxes take whole, and the emulator cropped the chunk to the whole width
    ("tile needs rows [0, 8) of a kernel result with 4 rows"); such a stretch is no head
    stretch now, and the plan verifies."""
    _check(tmp_path, [8], 0, 16, "cpsat")


def test_a_conv_reading_a_batch_axis_moved_off_axis_0_takes_its_images_whole(
        tmp_path: Path) -> None:
    """The image's width moved to axis 0 by a Transpose ([1, 8, 12, 16] -> [16, 1, 8, 12]),
    a Reshape carrying that axis on as a sequence's batch at axis 1 ([1, 16, 8, 12]), a 1x1
    Conv reading it as channels: the property test's example (ops [0], seed 32767). The
    Conv kept the batch, so a tile's image range cut the input's layout batch axis, its
    channels, and the kernel got one of 16 ("cannot reshape array of size 256 into shape
    (1,16,1)"). An op that reads axis 0 as its batch keeps it only where its inputs' layouts
    have their batch where its output's has."""
    _check(tmp_path, [0], 32767, 16, "cpsat")
