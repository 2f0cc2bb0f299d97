"""Vectorized NumPy kernels with ONNX operator semantics (NCHW layout).

The emulator runs a network tile by tile, so the spatial operators here accept
*explicit asymmetric* pads (``[x1_begin, x2_begin, ..., x1_end, x2_end]``, the
ONNX order).  A tile of a layer is computed by handing the kernel the tile's
input slice (halo included) and the tile's *effective* pads: real zero padding
only on the sides where the tile touches the feature-map border, and zero (or
even negative, meaning "crop") elsewhere.

``run_op`` asks the op table (planner.ir.ops) for the op's kernel name and
calls the function registered under it in an immutable name -> function table;
an op the table names no kernel for is executed by :func:`run_reference`, which
wraps the node in a one-node ONNX model and runs
``onnx.reference.ReferenceEvaluator``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from fuseplan.emulator.attention_kernel import attention_kernel
from fuseplan.planner.ir.ops import known_ops, op_spec

__all__ = ["SUPPORTED", "registered_kernels", "run_op", "run_reference"]

_Array = np.ndarray


# --------------------------------------------------------------------------- #
# Node wrapper and small utilities
# --------------------------------------------------------------------------- #


class _Node(NamedTuple):
    """One ONNX node invocation as seen by a kernel."""

    op_type: str
    attrs: Mapping[str, Any]
    inputs: tuple[_Array | None, ...]
    opset: int
    num_outputs: int

    def inp(self, i: int) -> _Array | None:
        """Input ``i`` or None when absent."""
        return self.inputs[i] if i < len(self.inputs) else None

    def x(self, i: int = 0) -> _Array:
        """Required input ``i``."""
        value = self.inp(i)
        if value is None:
            raise ValueError(f"{self.op_type}: required input {i} is missing")
        return value

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute ``name`` or ``default``."""
        return self.attrs.get(name, default)

    def fallback(self) -> list[_Array]:
        """Run this node with the ONNX reference evaluator."""
        return run_reference(
            self.op_type, self.attrs, self.inputs, self.opset, num_outputs=self.num_outputs
        )


_Kernel = Callable[[_Node], list[_Array]]


def _nonempty(a: _Array | None) -> _Array | None:
    """Treat an empty tensor (ONNX's way of leaving an optional input out) as absent."""
    return None if a is None or a.size == 0 else a


def _ints(values: Any) -> list[int]:
    if isinstance(values, (list, tuple)):  # attributes: skip the array round trip
        return [int(v) for v in values]
    return [int(v) for v in np.asarray(values).reshape(-1)]


def _norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return [int(a) + rank if int(a) < 0 else int(a) for a in axes]


def _pad_crop(x: _Array, begin: Sequence[int], end: Sequence[int], value: float,
              first_axis: int = 2) -> _Array:
    """Pad axes ``first_axis..`` with ``value``; negative pads crop instead."""
    crop = [slice(None)] * x.ndim
    widths = [(0, 0)] * x.ndim
    for i, (b, e) in enumerate(zip(begin, end, strict=True)):
        ax = first_axis + i
        crop[ax] = slice(max(-b, 0), x.shape[ax] - max(-e, 0))
        widths[ax] = (max(b, 0), max(e, 0))
    x = x[tuple(crop)]
    if all(w == (0, 0) for w in widths):
        return x
    # np.pad's set-up costs more than the copy on a tile: fill the borders, copy the inside
    out = np.empty(tuple(n + b + e for n, (b, e) in zip(x.shape, widths, strict=True)), x.dtype)
    for ax, (b, e) in enumerate(widths):
        if b:
            out[(slice(None),) * ax + (slice(0, b),)] = value
        if e:
            out[(slice(None),) * ax + (slice(b + x.shape[ax], None),)] = value
    out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, widths, strict=True))] = x
    return out


# --------------------------------------------------------------------------- #
# Convolution / pooling geometry
# --------------------------------------------------------------------------- #


class _Geom(NamedTuple):
    """Resolved sliding-window geometry for the spatial axes."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pad_begin: tuple[int, ...]
    pad_end: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def eff(self) -> tuple[int, ...]:
        """Dilated (effective) kernel extent per axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations, strict=True))


def _geometry(n: _Node, in_sp: Sequence[int], kernel: Sequence[int],
              ceil_mode: bool = False) -> _Geom:
    """Resolve strides, dilations, pads (auto_pad aware) and output size."""
    nsp = len(kernel)
    pads = n.attr("pads")
    return _resolve_geometry(
        tuple(in_sp), tuple(kernel), tuple(_ints(n.attr("strides", [1] * nsp))),
        tuple(_ints(n.attr("dilations", [1] * nsp))),
        tuple(_ints(pads)) if pads is not None else (0,) * (2 * nsp),
        str(n.attr("auto_pad", "NOTSET")), bool(ceil_mode))


@functools.lru_cache(maxsize=4096)  # a network's tiles ask for a handful of geometries
def _resolve_geometry(in_sp: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                      dil: tuple[int, ...], pads: tuple[int, ...], auto_pad: str,
                      ceil_mode: bool) -> _Geom:
    nsp = len(kernel)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil, strict=True)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(in_sp, strides, strict=True)]
        total = [max(0, (o - 1) * s + e - i)
                 for o, s, e, i in zip(out, strides, eff, in_sp, strict=True)]
        small = tuple(t // 2 for t in total)
        big = tuple(t - t // 2 for t in total)
        same = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        return _Geom(kernel, strides, dil, same[0], same[1], tuple(out))
    if auto_pad == "VALID":
        pads = (0,) * (2 * nsp)
    begin, end = pads[:nsp], pads[nsp:]
    sizes = []
    for i, b, e, ef, s in zip(in_sp, begin, end, eff, strides, strict=True):
        span = i + b + e - ef
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= i + b:
            o -= 1  # a window may not start in the right padding / beyond it
        sizes.append(o)
    return _Geom(kernel, strides, dil, begin, end, tuple(sizes))


def _fit(x: _Array, g: _Geom, value: float) -> _Array:
    """Pad (or crop) ``x`` so that exactly the windows of ``g`` fit."""
    ends = [(o - 1) * s + ef - n - b for n, b, o, s, ef
            in zip(x.shape[2:], g.pad_begin, g.out, g.strides, g.eff, strict=True)]
    if not any(ends) and not any(g.pad_begin):
        return x  # the windows cover the map exactly (a 1x1 conv, a tile inside the map)
    return _pad_crop(x, g.pad_begin, ends, value)


def _window_reduce(xp: _Array, g: _Geom, fn: Callable[..., _Array]) -> _Array:
    """Reduce every window with a binary ufunc, one strided view per kernel offset.

    Faster than reducing the 2k-axis window view: each step is one contiguous-output
    elementwise op over the whole map.
    """
    out: _Array | None = None
    for offset in np.ndindex(*g.kernel):
        idx = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s)
            for o, d, n, s in zip(offset, g.dilations, g.out, g.strides, strict=True))
        view = xp[idx]
        out = view.copy() if out is None else fn(out, view, out=out)
    if out is None:
        raise ValueError("empty kernel")
    return out


def _windows(xp: _Array, g: _Geom) -> _Array:
    """Strided view ``(N, C, *out, *kernel)`` over an already fitted input."""
    nsp = len(g.kernel)
    v = sliding_window_view(xp, g.eff, axis=tuple(range(2, 2 + nsp)))
    idx = (
        (slice(None), slice(None))
        + tuple(slice(None, (o - 1) * s + 1, s) for o, s in zip(g.out, g.strides, strict=True))
        + tuple(slice(None, None, d) for d in g.dilations)
    )
    return v[idx]


# --------------------------------------------------------------------------- #
# Conv / ConvTranspose
# --------------------------------------------------------------------------- #


def _im2col(xp: _Array, g: _Geom, cols: _Array) -> None:
    """Fill ``cols`` (C, kh, kw, oh, ow) with every kernel tap's view of a fitted map (C, H, W).

    One strided copy of the window view, in the weights' (C, kh, kw) row order.
    """
    v = sliding_window_view(xp, g.eff, axis=(1, 2))  # (C, H', W', eh, ew)
    (sh, sw), (dh, dw) = g.strides, g.dilations
    cols[...] = v[:, ::sh, ::sw, ::dh, ::dw].transpose(0, 3, 4, 1, 2)


# Products of at least this many MACs (a few hundred microseconds on one core) are split
# over two threads; below it the hand-off costs more than the second core saves.
_SPLIT_MACS = 1 << 22


@functools.cache
def _helper() -> ThreadPoolExecutor | None:
    """One helper thread for big matrix products, or None on a single-CPU machine."""
    return ThreadPoolExecutor(max_workers=1) if len(os.sched_getaffinity(0)) > 1 else None


def _split_matmul(a: _Array, b: _Array, out: _Array) -> None:
    """``out = a @ b`` for stacks (G, M, K) @ (G, K, P), big products on two cores.

    The rows of ``a`` are halved: a helper thread takes the second half while this one does
    the first. If the helper has not started by then (a busy machine), this thread takes its
    half back, so the split never waits on a core it cannot get. BLAS itself runs one
    thread per call (see emulator.run.emulate): its spin-waiting threads are what a busy
    machine punishes.
    """
    g, m, k = a.shape
    pool = _helper()
    if pool is None or m < 2 or g * m * k * b.shape[-1] < _SPLIT_MACS:
        np.matmul(a, b, out=out)
        return
    h = m // 2
    second = pool.submit(np.matmul, a[:, h:], b, out=out[:, h:])
    np.matmul(a[:, :h], b, out=out[:, :h])
    if second.cancel():
        np.matmul(a[:, h:], b, out=out[:, h:])
    else:
        second.result()


def _conv_2d_gemm(x: _Array, w: _Array, b: _Array | None, g: _Geom, group: int) -> _Array:
    """2-D (grouped) conv as one BLAS matmul per image over the stacked kernel taps.

    The taps are stacked channel-major, (C, taps) rows by output pixels, which is the
    native memory order of the weights (M, C/group, kh, kw): the weights are used as a
    reshaped view, never reordered. A 1x1 stride-1 unpadded conv multiplies the map itself.
    """
    n, c = x.shape[:2]
    m = w.shape[0]
    (oh, ow), taps = g.out, math.prod(g.kernel)
    p = oh * ow
    wk = w.reshape(group, m // group, (c // group) * taps)
    out = np.empty((n, m, p), dtype=np.float32)
    xp = _fit(x, g, 0.0)  # a view unless the tile touches a padded border
    plain = taps == 1 and g.strides == (1, 1)
    cols = None if plain else np.empty((c, *g.kernel, oh, ow), dtype=np.float32)
    for k in range(n):
        if cols is None:
            rhs = xp[k].reshape(group, c // group, p)
        else:
            _im2col(xp[k], g, cols)
            rhs = cols.reshape(group, (c // group) * taps, p)
        _split_matmul(wk, rhs, out[k].reshape(group, m // group, p))
    if b is not None:
        out += b.astype(np.float32, copy=False).reshape(1, m, 1)
    return out.reshape(n, m, oh, ow)


def _conv_depthwise(xp: _Array, w: _Array, g: _Geom) -> _Array:
    """Depthwise 2-D conv on a fitted input: an elementwise multiply-add per kernel tap."""
    n, m = xp.shape[0], w.shape[0]
    (oh, ow), (sh, sw), (dh, dw) = g.out, g.strides, g.dilations
    y = np.zeros((n, m, oh, ow), dtype=np.float32)
    for i, j in np.ndindex(*g.kernel):
        y += w[:, 0, i, j].reshape(1, m, 1, 1) * xp[
            :, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
    return y


def _conv_core(x: _Array, w: _Array, b: _Array | None, g: _Geom, group: int) -> _Array:
    """Grouped N-d convolution as one batched matmul over an im2col view."""
    n, c = x.shape[:2]
    m = w.shape[0]
    nsp = len(g.kernel)
    cg, mg = c // group, m // group
    if nsp == 2 and x.dtype == np.float32:
        w = w.astype(np.float32, copy=False)
        if group == c and m == c and group > 1:
            y = _conv_depthwise(_fit(x, g, 0.0), w, g)
            if b is not None:
                y += b.reshape(1, m, 1, 1).astype(np.float32, copy=False)
            return y
        return _conv_2d_gemm(x, w, b, g, group)
    win = _windows(_fit(x, g, 0.0), g)  # (N, C, *out, *k)
    kk = math.prod(g.kernel)
    p = math.prod(g.out)
    win = win.reshape((n, group, cg) + g.out + g.kernel)
    order = (1, 0) + tuple(range(3, 3 + nsp)) + (2,) + tuple(range(3 + nsp, 3 + 2 * nsp))
    cols = win.transpose(order).reshape(group, n * p, cg * kk)
    wr = w.reshape(group, mg, cg * kk).transpose(0, 2, 1)
    y = np.matmul(cols, wr.astype(cols.dtype, copy=False))  # (G, N*P, Mg)
    y = y.reshape((group, n) + g.out + (mg,))
    y = y.transpose((1, 0, nsp + 2) + tuple(range(2, 2 + nsp))).reshape((n, m) + g.out)
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * nsp).astype(y.dtype, copy=False)
    return np.ascontiguousarray(y)


def _conv(n: _Node) -> list[_Array]:
    x, w, b = n.x(0), n.x(1), n.inp(2)
    kernel = _ints(n.attr("kernel_shape", w.shape[2:]))
    g = _geometry(n, x.shape[2:], kernel)
    return [_conv_core(x, w, b, g, int(n.attr("group", 1)))]


def _conv_transpose(n: _Node) -> list[_Array]:
    x, w, b = n.x(0), n.x(1), n.inp(2)
    group = int(n.attr("group", 1))
    nsp = x.ndim - 2
    in_sp = x.shape[2:]
    kernel = _ints(n.attr("kernel_shape", w.shape[2:]))
    strides = _ints(n.attr("strides", [1] * nsp))
    dil = _ints(n.attr("dilations", [1] * nsp))
    out_pad = _ints(n.attr("output_padding", [0] * nsp))
    auto_pad = n.attr("auto_pad", "NOTSET")
    full = [s * (i - 1) + op + (k - 1) * d + 1
            for s, i, op, k, d in zip(strides, in_sp, out_pad, kernel, dil, strict=True)]
    target: list[int] | None = None
    if n.attr("output_shape") is not None:
        target = _ints(n.attr("output_shape"))[-nsp:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(in_sp, strides, strict=True)]
    if target is not None:
        begin, end = [], []
        for f, t in zip(full, target, strict=True):
            total = f - t
            if total < 0:  # target larger than the full result: extra zeros at the end
                begin.append(0)
                end.append(total)
            elif auto_pad == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
    elif auto_pad == "VALID":
        begin, end = [0] * nsp, [0] * nsp
    else:
        pads = _ints(n.attr("pads", [0] * (2 * nsp)))
        begin, end = pads[:nsp], pads[nsp:]
    # Equivalent direct convolution: zero-insert the input by the stride, pad by
    # the dilated kernel extent minus the pads, convolve with the flipped kernel.
    xd = np.zeros(x.shape[:2] + tuple((i - 1) * s + 1 for i, s in zip(in_sp, strides,
                                                                      strict=True)),
                  dtype=x.dtype)
    xd[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)] = x
    c, mg = w.shape[0], w.shape[1]
    cg = c // group
    wf = w.reshape((group, cg, mg) + tuple(kernel)).swapaxes(1, 2)
    wf = wf.reshape((group * mg, cg) + tuple(kernel))
    wf = wf[(slice(None), slice(None)) + (slice(None, None, -1),) * nsp]
    ext = [(k - 1) * d for k, d in zip(kernel, dil, strict=True)]
    pb = [e - p for e, p in zip(ext, begin, strict=True)]
    pe = [e - p + op for e, p, op in zip(ext, end, out_pad, strict=True)]
    out = tuple(f - b_ - e_ for f, b_, e_ in zip(full, begin, end, strict=True))
    g = _Geom(tuple(kernel), (1,) * nsp, tuple(dil), tuple(pb), tuple(pe), out)
    return [_conv_core(xd, wf, b, g, group)]


# --------------------------------------------------------------------------- #
# Pooling
# --------------------------------------------------------------------------- #


def _pool_geom(n: _Node, x: _Array) -> _Geom:
    kernel = _ints(n.attr("kernel_shape"))
    return _geometry(n, x.shape[2:], kernel, ceil_mode=bool(n.attr("ceil_mode", 0)))


def _max_pool(n: _Node) -> list[_Array]:
    x = n.x()
    g = _pool_geom(n, x)
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    if n.num_outputs < 2:
        return [_window_reduce(_fit(x, g, low), g, np.maximum)]
    win = _windows(_fit(x, g, low), g)
    nsp = len(g.kernel)
    flat = win.reshape(win.shape[: 2 + nsp] + (-1,))
    arg = flat.argmax(axis=-1)
    y = np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    local = np.unravel_index(arg, g.kernel)
    pos = []
    for i in range(nsp):
        o = np.arange(g.out[i]).reshape((g.out[i],) + (1,) * (nsp - 1 - i))
        pos.append(o * g.strides[i] - g.pad_begin[i] + local[i] * g.dilations[i])
    sp = x.shape[2:]
    if int(n.attr("storage_order", 0)) == 1:
        idx = np.ravel_multi_index(tuple(reversed(pos)), tuple(reversed(sp)))
    else:
        idx = np.ravel_multi_index(tuple(pos), sp)
    nc = np.arange(x.shape[0] * x.shape[1]).reshape(x.shape[:2] + (1,) * nsp)
    return [y, (idx + nc * math.prod(sp)).astype(np.int64)]


def _avg_pool(n: _Node) -> list[_Array]:
    x = n.x()
    g = _pool_geom(n, x)
    nsp = len(g.kernel)
    include_pad = bool(n.attr("count_include_pad", 0))
    sums = _window_reduce(_fit(x, g, 0.0), g, np.add)
    # Divisor: per-axis count of window cells that are "real" (input only, or
    # input plus explicit pads); the ceil_mode tail beyond the pads never counts.
    div = np.ones((), dtype=np.float64)
    for i in range(nsp):
        size = x.shape[2 + i]
        b, e = g.pad_begin[i], g.pad_end[i]
        length = (g.out[i] - 1) * g.strides[i] + g.eff[i]
        pos = np.arange(length) - b
        valid = pos < size + e if include_pad else (pos >= 0) & (pos < size)
        cnt = sliding_window_view(valid, g.eff[i])[:: g.strides[i]][: g.out[i], :: g.dilations[i]]
        div = np.multiply.outer(div, cnt.sum(axis=-1))
    return [(sums / div.astype(x.dtype)).astype(x.dtype, copy=False)]


def _lp_pool(n: _Node) -> list[_Array]:
    """p-norm of every window, (sum |x|^p)^(1/p); padded cells are zeros and add nothing."""
    x = n.x()
    g = _pool_geom(n, x)
    p = int(n.attr("p", 2))
    powered = np.abs(_fit(x, g, 0.0)) ** p
    return [(_window_reduce(powered, g, np.add) ** (1.0 / p)).astype(x.dtype, copy=False)]


def _global_pool(reduce: Callable[..., _Array]) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        x = n.x()
        return [reduce(x, axis=tuple(range(2, x.ndim)), keepdims=True)]

    return kernel


# --------------------------------------------------------------------------- #
# Activations
# --------------------------------------------------------------------------- #


def _sigmoid_fn(x: _Array) -> _Array:
    # exp(-|x|) lies in (0, 1], so neither branch overflows; ~5x faster than the
    # logaddexp form, and as exact (squeeze-excite nets call it on every hidden chunk)
    e = np.exp(-np.abs(x))
    d = 1 + e
    return np.where(x >= 0, 1 / d, e / d).astype(x.dtype, copy=False)


def _activation(fn: Callable[[_Array, _Node], _Array]) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        x = n.x()
        return [np.asarray(fn(x, n)).astype(x.dtype, copy=False)]

    return kernel


def _f(n: _Node, name: str, default: float, dtype: np.dtype) -> Any:
    return np.asarray(n.attr(name, default), dtype=dtype)[()]


def _elu(x: _Array, n: _Node) -> _Array:
    a = _f(n, "alpha", 1.0, x.dtype)
    return np.where(x > 0, x, a * np.expm1(np.minimum(x, 0)))


def _selu(x: _Array, n: _Node) -> _Array:
    a = _f(n, "alpha", 1.67326319217681884765625, x.dtype)
    gm = _f(n, "gamma", 1.05070102214813232421875, x.dtype)
    return gm * np.where(x > 0, x, a * np.expm1(np.minimum(x, 0)))


def _hard_sigmoid(x: _Array, n: _Node) -> _Array:
    a, b = _f(n, "alpha", 0.2, x.dtype), _f(n, "beta", 0.5, x.dtype)
    return np.clip(a * x + b, 0, 1)


def _hard_swish(x: _Array, n: _Node) -> _Array:
    return x * np.clip(x / x.dtype.type(6) + x.dtype.type(0.5), 0, 1)


def _leaky_relu(x: _Array, n: _Node) -> _Array:
    return np.where(x >= 0, x, _f(n, "alpha", 0.01, x.dtype) * x)


def _prelu(n: _Node) -> list[_Array]:
    x, slope = n.x(0), n.x(1)
    return [np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False)]


def _clip(n: _Node) -> list[_Array]:
    x = n.x()
    if n.opset < 11:
        lo: Any = n.attr("min")
        hi: Any = n.attr("max")
    else:
        lo, hi = _nonempty(n.inp(1)), _nonempty(n.inp(2))
    y = x if lo is None else np.maximum(x, np.asarray(lo, dtype=x.dtype))
    y = y if hi is None else np.minimum(y, np.asarray(hi, dtype=x.dtype))
    return [np.array(y, dtype=x.dtype)]


def _softmax_family(log: bool) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        x = n.x()
        if n.opset < 13:
            axis = int(n.attr("axis", 1))
            axis = axis + x.ndim if axis < 0 else axis
            z = x.reshape(math.prod(x.shape[:axis]), -1)
            red = 1
        else:
            z = x
            red = int(n.attr("axis", -1))
        shifted = z - z.max(axis=red, keepdims=True)
        e = np.exp(shifted)
        s = e.sum(axis=red, keepdims=True)
        y = shifted - np.log(s) if log else e / s
        return [y.reshape(x.shape).astype(x.dtype, copy=False)]

    return kernel


# --------------------------------------------------------------------------- #
# Normalization
# --------------------------------------------------------------------------- #


def _lrn(n: _Node) -> list[_Array]:
    x = n.x()
    size = int(n.attr("size"))
    alpha = float(n.attr("alpha", 1e-4))
    beta = float(n.attr("beta", 0.75))
    bias = float(n.attr("bias", 1.0))
    sq = _pad_crop(x * x, [(size - 1) // 2], [size - 1 - (size - 1) // 2], 0.0, first_axis=1)
    sums = sliding_window_view(sq, size, axis=1).sum(axis=-1)
    y = x / (bias + (alpha / size) * sums) ** beta
    return [y.astype(x.dtype, copy=False)]


def _channel_param(p: _Array, x: _Array) -> _Array:
    """Reshape a per-channel (or per-activation, BN spatial=0) parameter for NCHW."""
    if p.ndim == 1:
        return p.reshape((1, -1) + (1,) * (x.ndim - 2))
    return p.reshape((1,) + p.shape)


def _batch_norm(n: _Node) -> list[_Array]:
    if int(n.attr("training_mode", 0)) == 1:
        return n.fallback()
    x = n.x()
    params = [n.x(i) for i in range(1, 5)]
    eps = float(n.attr("epsilon", 1e-5))
    if x.ndim >= 2 and all(p.ndim == 1 and p.dtype == x.dtype for p in params):
        # x * inv + (bias - mean * inv): two passes over the map instead of three, the
        # per-channel work on C values; (C, 1, ..) parameters broadcast into x in place
        scale, bias, mean, var = (p.reshape((-1,) + (1,) * (x.ndim - 2)) for p in params)
        inv = scale / np.sqrt(var + var.dtype.type(eps))
        y = np.multiply(x, inv)
        y += bias - mean * inv
        return [y]
    scale, bias, mean, var = (_channel_param(p, x) for p in params)
    inv = scale / np.sqrt(var + var.dtype.type(eps))
    y = (x - mean) * inv + bias
    return [y.astype(x.dtype, copy=False)]


def _instance_norm(n: _Node) -> list[_Array]:
    x = n.x()
    scale, bias = _channel_param(n.x(1), x), _channel_param(n.x(2), x)
    eps = float(n.attr("epsilon", 1e-5))
    axes = tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps) * scale + bias
    return [y.astype(x.dtype)]


# --------------------------------------------------------------------------- #
# Elementwise math
# --------------------------------------------------------------------------- #


def _legacy_broadcast(n: _Node, a: _Array, b: _Array) -> _Array:
    """Opset < 7 binary ops: ``broadcast=1`` aligns B with A starting at ``axis``."""
    if n.opset < 7 and int(n.attr("broadcast", 0)) and n.attr("axis") is not None:
        axis = int(n.attr("axis"))
        axis = axis + a.ndim if axis < 0 else axis
        return b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))
    return b


def _int_div(a: _Array, b: _Array) -> _Array:
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def _div_fn(a: _Array, b: _Array) -> _Array:
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return _int_div(a, b)
    return np.divide(a, b)


def _binary(fn: Callable[[_Array, _Array], _Array]) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        a, b = n.x(0), n.x(1)
        b = _legacy_broadcast(n, a, b)
        return [np.asarray(fn(a, b)).astype(a.dtype, copy=False)]

    return kernel


def _variadic(fn: Callable[[_Array, _Array], _Array], mean: bool = False) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        xs = [v for v in n.inputs if v is not None]
        y = functools.reduce(fn, xs)
        if mean:
            y = y / y.dtype.type(len(xs))
        return [np.array(y, dtype=xs[0].dtype)]

    return kernel


def _unary(fn: Callable[[_Array], _Array]) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        x = n.x()
        return [np.asarray(fn(x)).astype(x.dtype, copy=False)]

    return kernel


def _reciprocal(x: _Array) -> _Array:
    return np.reciprocal(x.astype(np.float64) if x.dtype.kind in "iu" else x)


def _gemm(n: _Node) -> list[_Array]:
    a, b, c = n.x(0), n.x(1), n.inp(2)
    if int(n.attr("transA", 0)):
        a = a.T
    if int(n.attr("transB", 0)):
        b = b.T
    alpha = float(n.attr("alpha", 1.0))
    beta = float(n.attr("beta", 1.0))
    y = a @ b
    if alpha != 1.0:
        y = y * y.dtype.type(alpha)
    if c is not None and beta != 0.0:
        y = y + (c if beta == 1.0 else c * c.dtype.type(beta))
    return [y.astype(a.dtype, copy=False)]


def _flash_attention(n: _Node) -> list[_Array]:
    parts = (n.x(3), n.x(4)) if len(n.inputs) == 5 else ()
    return [attention_kernel(n.attrs, n.x(0), n.x(1), n.x(2), *parts)]


def _matmul(n: _Node) -> list[_Array]:
    return [np.matmul(n.x(0), n.x(1))]


def _reduce(fn: Callable[..., _Array], axes_input_opset: int) -> _Kernel:
    def kernel(n: _Node) -> list[_Array]:
        x = n.x()
        keep = bool(n.attr("keepdims", 1))
        if n.opset >= axes_input_opset:
            raw = _nonempty(n.inp(1))
            axes = None if raw is None else _ints(raw)
        else:
            axes = None if n.attr("axes") is None else _ints(n.attr("axes"))
        if not axes:
            if int(n.attr("noop_with_empty_axes", 0)):
                return [x.copy()]
            axes = list(range(x.ndim))
        ax = tuple(_norm_axes(axes, x.ndim))
        return [np.asarray(fn(x, axis=ax, keepdims=keep)).astype(x.dtype, copy=False)]

    return kernel


_NP_CAST: Mapping[int, type] = MappingProxyType({
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
    TensorProto.FLOAT16: np.float16,
    TensorProto.INT8: np.int8,
    TensorProto.INT16: np.int16,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
    TensorProto.UINT8: np.uint8,
    TensorProto.UINT16: np.uint16,
    TensorProto.UINT32: np.uint32,
    TensorProto.UINT64: np.uint64,
    TensorProto.BOOL: np.bool_,
})


def _cast(n: _Node) -> list[_Array]:
    x = n.x()
    to = int(n.attr("to"))
    if to not in _NP_CAST or x.dtype.kind not in "biuf":
        return n.fallback()
    return [x.astype(_NP_CAST[to])]


# --------------------------------------------------------------------------- #
# Tensor manipulation
# --------------------------------------------------------------------------- #


def _identity(n: _Node) -> list[_Array]:
    return [n.x().copy()]


def _dropout(n: _Node) -> list[_Array]:
    x = n.x()
    out = [x.copy()]
    if n.num_outputs > 1:
        out.append(np.ones(x.shape, dtype=bool if n.opset >= 10 else x.dtype))
    return out


def _concat(n: _Node) -> list[_Array]:
    xs = [v for v in n.inputs if v is not None]
    return [np.concatenate(xs, axis=int(n.attr("axis", 1)))]


def _split(n: _Node) -> list[_Array]:
    x = n.x()
    axis = int(n.attr("axis", 0))
    axis = axis + x.ndim if axis < 0 else axis
    dim = x.shape[axis]
    raw = n.attr("split") if n.opset < 13 else _nonempty(n.inp(1))
    if raw is not None:
        sizes = _ints(raw)
    elif n.attr("num_outputs") is not None:
        k = int(n.attr("num_outputs"))
        chunk = -(-dim // k)
        sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(k)]
    else:
        k = n.num_outputs
        if dim % k:
            raise ValueError(f"Split: axis size {dim} is not divisible into {k} outputs")
        sizes = [dim // k] * k
    cuts = np.cumsum(sizes)[:-1]
    return [np.ascontiguousarray(p) for p in np.split(x, cuts, axis=axis)]


def _slice(n: _Node) -> list[_Array]:
    x = n.x()
    if n.opset < 10:
        starts, ends = _ints(n.attr("starts")), _ints(n.attr("ends"))
        axes_raw: Any = n.attr("axes")
        steps = [1] * len(starts)
    else:
        starts, ends = _ints(n.x(1)), _ints(n.x(2))
        axes_raw = _nonempty(n.inp(3))
        st = _nonempty(n.inp(4))
        steps = [1] * len(starts) if st is None else _ints(st)
    axes = list(range(len(starts))) if axes_raw is None else _norm_axes(_ints(axes_raw), x.ndim)
    index = [slice(None)] * x.ndim
    for ax, s, e, step in zip(axes, starts, ends, steps, strict=True):
        dim = x.shape[ax]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
            index[ax] = slice(s, e, step)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
            index[ax] = slice(s, e if e >= 0 else None, step)
    return [np.ascontiguousarray(x[tuple(index)])]


def _reshape(n: _Node) -> list[_Array]:
    x = n.x()
    shape = _ints(n.attr("shape") if n.opset < 5 else n.x(1))
    if not int(n.attr("allowzero", 0)):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape).copy()]


def _flatten(n: _Node) -> list[_Array]:
    x = n.x()
    axis = int(n.attr("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])).copy()]


def _transpose(n: _Node) -> list[_Array]:
    x = n.x()
    perm = n.attr("perm")
    return [np.ascontiguousarray(x.transpose(None if perm is None else _ints(perm)))]


def _axes_arg(n: _Node, input_opset: int) -> list[int] | None:
    if n.opset >= input_opset:
        raw = _nonempty(n.inp(1))
        return None if raw is None else _ints(raw)
    raw = n.attr("axes")
    return None if raw is None else _ints(raw)


def _squeeze(n: _Node) -> list[_Array]:
    x = n.x()
    axes = _axes_arg(n, 13)
    if axes is None:
        return [np.squeeze(x).copy()]
    return [np.squeeze(x, axis=tuple(_norm_axes(axes, x.ndim))).copy()]


def _unsqueeze(n: _Node) -> list[_Array]:
    x = n.x()
    axes = _axes_arg(n, 13) or []
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(_norm_axes(axes, rank)))).copy()]


def _pad(n: _Node) -> list[_Array]:
    x = n.x()
    mode = n.attr("mode", "constant")
    if n.opset < 11:
        pads = _ints(n.attr("pads", n.attr("paddings")))
        value: Any = float(n.attr("value", 0.0))
        axes = list(range(x.ndim))
    else:
        pads = _ints(n.x(1))
        cv = _nonempty(n.inp(2))
        value = 0 if cv is None else cv.reshape(-1)[0]
        raw_axes = _nonempty(n.inp(3))
        axes = list(range(x.ndim)) if raw_axes is None else _norm_axes(_ints(raw_axes), x.ndim)
    k = len(axes)
    begin, end = [0] * x.ndim, [0] * x.ndim
    for i, ax in enumerate(axes):
        begin[ax], end[ax] = pads[i], pads[k + i]
    if mode == "constant":
        return [_pad_crop(x, begin, end, value, first_axis=0)]
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"Pad: unsupported mode {mode!r}")
    y = _pad_crop(x, [min(b, 0) for b in begin], [min(e, 0) for e in end], 0, first_axis=0)
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end, strict=True)]
    return [np.pad(y, widths, mode=mode)]


def _gather(n: _Node) -> list[_Array]:
    x, idx = n.x(0), n.x(1)
    axis = int(n.attr("axis", 0))
    return [np.take(x, idx.astype(np.int64), axis=axis)]


# --------------------------------------------------------------------------- #
# Resize / Upsample
# --------------------------------------------------------------------------- #


def _source_coords(mode: str, out_len: int, in_len: int, scale: np.float32) -> _Array:
    """Map output indices to (float32) input coordinates, as ONNX Runtime does."""
    f = np.float32
    x = np.arange(out_len, dtype=f)
    if mode == "half_pixel":
        return (x + f(0.5)) / scale - f(0.5)
    if mode == "pytorch_half_pixel":
        return (x + f(0.5)) / scale - f(0.5) if out_len > 1 else np.zeros(out_len, f)
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(1, f)
        return x * f(in_len - 1) / f(out_len - 1)
    if mode == "asymmetric":
        return x / scale
    if mode in ("tf_half_pixel_for_nn", "tf_half_pixel_for_nearest"):  # Resize-11 only
        return (x + f(0.5)) / scale
    if mode == "half_pixel_symmetric":
        adjustment = f(out_len) / (scale * f(in_len))
        offset = f(in_len) / f(2) * (f(1) - adjustment)
        return offset + (x + f(0.5)) / scale - f(0.5)
    raise ValueError(f"Resize: unsupported coordinate_transformation_mode {mode!r}")


def _nearest_index(c: _Array, nearest_mode: str, downsample: bool) -> _Array:
    if nearest_mode == "round_prefer_floor":
        r = np.ceil(c - np.float32(0.5))
    elif nearest_mode == "round_prefer_ceil":
        r = np.floor(c + np.float32(0.5))
    elif nearest_mode == "floor":
        r = np.floor(c)
    elif nearest_mode == "ceil":
        r = np.ceil(c)
    elif nearest_mode == "simple":  # pre-opset-11 behaviour (Upsample, Resize-10)
        r = np.ceil(c) if downsample else np.trunc(c)
    else:
        raise ValueError(f"Resize: unsupported nearest_mode {nearest_mode!r}")
    return r.astype(np.int64)


def _interpolate(x: _Array, out_shape: Sequence[int], scales: Sequence[np.float32], mode: str,
                 coord_mode: str, nearest_mode: str) -> _Array:
    """Separable nearest / N-linear resampling of every axis."""
    y = x
    for ax, (o, s) in enumerate(zip(out_shape, scales, strict=True)):
        i = x.shape[ax]
        if o == i and s == 1:
            continue  # unscaled axes are copied (as onnxruntime does, whatever the modes)
        c = _source_coords(coord_mode, o, i, s)
        if mode == "nearest":
            idx = np.clip(_nearest_index(c, nearest_mode, bool(s < 1)), 0, i - 1)
            y = np.take(y, idx, axis=ax)
            continue
        c = np.clip(c, 0, i - 1)
        lo = np.floor(c).astype(np.int64)
        hi = np.minimum(lo + 1, i - 1)
        w = (c - lo).astype(x.dtype)
        shape = [1] * x.ndim
        shape[ax] = o
        w = w.reshape(shape)
        a, b = np.take(y, lo, axis=ax), np.take(y, hi, axis=ax)
        y = a + (b - a) * w
    return np.ascontiguousarray(y, dtype=x.dtype)


def _scatter_axes(values: Sequence[Any], axes_raw: Any, full: list[Any]) -> list[Any]:
    """Place per-axis ``values`` (given for ``axes``, opset 18+) into a full-rank list."""
    if axes_raw is None:
        return list(values)
    for a, v in zip(_norm_axes(_ints(axes_raw), len(full)), values, strict=True):
        full[a] = v
    return full


def _resize_plan(n: _Node, x: _Array, scales_in: _Array | None,
                 sizes_in: _Array | None) -> tuple[list[int], list[np.float32]]:
    """Output shape and float32 per-axis scales (as onnxruntime computes them)."""
    axes_raw = n.attr("axes")
    if sizes_in is not None:
        sizes = _scatter_axes(_ints(sizes_in), axes_raw, list(x.shape))
        ratios = [np.float32(o) / np.float32(i) for o, i in zip(sizes, x.shape, strict=True)]
        return sizes, ratios
    if scales_in is None:
        raise ValueError("Resize: neither scales nor sizes given")
    given = [np.float32(v) for v in np.asarray(scales_in, dtype=np.float32).reshape(-1)]
    scales = _scatter_axes(given, axes_raw, [np.float32(1.0)] * x.ndim)
    out = [int(np.floor(sc * np.float32(i))) for sc, i in zip(scales, x.shape, strict=True)]
    return out, scales


def _resize(n: _Node) -> list[_Array]:
    x = n.x()
    mode = n.attr("mode", "nearest")
    coord = n.attr("coordinate_transformation_mode", "half_pixel")
    if (
        mode not in ("nearest", "linear")
        or coord == "tf_crop_and_resize"
        or int(n.attr("antialias", 0))
        or n.attr("keep_aspect_ratio_policy", "stretch") != "stretch"
    ):
        return n.fallback()
    if n.opset < 11:
        out, sc = _resize_plan(n, x, n.x(1), None)
        return [_interpolate(x, out, sc, mode, "asymmetric", "simple")]
    out, sc = _resize_plan(n, x, _nonempty(n.inp(2)), _nonempty(n.inp(3)))
    nearest_mode = n.attr("nearest_mode", "round_prefer_floor")
    return [_interpolate(x, out, sc, mode, coord, nearest_mode)]


def _upsample(n: _Node) -> list[_Array]:
    x = n.x()
    mode = n.attr("mode", "nearest")
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        return n.fallback()
    scales = n.attr("scales") if n.opset < 9 else n.x(1)
    out, sc = _resize_plan(n, x, np.asarray(scales, dtype=np.float32), None)
    return [_interpolate(x, out, sc, mode, "asymmetric", "simple")]


# --------------------------------------------------------------------------- #
# Dispatch
# --------------------------------------------------------------------------- #


_KERNELS: Mapping[str, _Kernel] = MappingProxyType({
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _max_pool,
    "AveragePool": _avg_pool,
    "LpPool": _lp_pool,
    "GlobalAveragePool": _global_pool(np.mean),
    "GlobalMaxPool": _global_pool(np.max),
    "Relu": _unary(lambda x: np.maximum(x, 0)),
    "LeakyRelu": _activation(_leaky_relu),
    "PRelu": _prelu,
    "Elu": _activation(_elu),
    "Selu": _activation(_selu),
    "Sigmoid": _unary(_sigmoid_fn),
    "Tanh": _unary(np.tanh),
    "HardSigmoid": _activation(_hard_sigmoid),
    "HardSwish": _activation(_hard_swish),
    "Clip": _clip,
    "Softmax": _softmax_family(log=False),
    "LogSoftmax": _softmax_family(log=True),
    "LRN": _lrn,
    "BatchNormalization": _batch_norm,
    "InstanceNormalization": _instance_norm,
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
    "Mul": _binary(np.multiply),
    "Div": _binary(_div_fn),
    "Pow": _binary(np.power),
    "Sum": _variadic(np.add),
    "Mean": _variadic(np.add, mean=True),
    "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum),
    "Sqrt": _unary(np.sqrt),
    "Exp": _unary(np.exp),
    "Abs": _unary(np.abs),
    "Neg": _unary(np.negative),
    "Reciprocal": _unary(_reciprocal),
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Pad": _pad,
    "Resize": _resize,
    "Upsample": _upsample,
    "Identity": _identity,
    "Dropout": _dropout,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "FlashAttention": _flash_attention,
    "ReduceMean": _reduce(np.mean, 18),
    "ReduceSum": _reduce(np.sum, 13),
    "ReduceMax": _reduce(np.max, 18),
    "ReduceMin": _reduce(np.min, 18),
    "Cast": _cast,
    "Gather": _gather,
})

SUPPORTED: frozenset[str] = frozenset(
    op for op, spec in known_ops().items() if spec.kernel is not None)
"""Op types that :func:`run_op` implements natively (others use :func:`run_reference`)."""


def registered_kernels() -> frozenset[str]:
    """Names of the kernels registered here (the op table names them, planner.ir.ops)."""
    return frozenset(_KERNELS)


def _default_num_outputs(op_type: str, attrs: Mapping[str, Any],
                         inputs: Sequence[_Array | None], opset: int) -> int:
    """Output count when the caller does not say (only Split can need more than one)."""
    if op_type != "Split":
        return 1
    if attrs.get("num_outputs") is not None:
        return int(attrs["num_outputs"])
    raw = attrs.get("split") if opset < 13 else (inputs[1] if len(inputs) > 1 else None)
    if raw is not None and np.asarray(raw).size:
        return int(np.asarray(raw).size)
    raise ValueError("Split without 'split' sizes needs num_outputs")


def _trim(inputs: Sequence[_Array | None]) -> tuple[_Array | None, ...]:
    items = list(inputs)
    while items and items[-1] is None:
        items.pop()
    return tuple(items)


def run_op(op_type: str, attrs: Mapping[str, Any], inputs: Sequence[_Array | None], opset: int,
           *, num_outputs: int | None = None) -> list[_Array]:
    """Run one ONNX node (default domain) on numpy arrays; returns its outputs in order.

    Args:
        op_type: ONNX operator name, e.g. ``"Conv"``.
        attrs: attribute values as plain Python objects (lists, ints, floats,
            str, numpy arrays for tensor attributes); missing ones take the
            ONNX defaults of ``opset``.
        inputs: input arrays in ONNX order; absent optional inputs are None
            (or the sequence is simply shorter).
        opset: the default-domain opset version the node belongs to.
        num_outputs: how many outputs the node declares.  Needed for Split
            without explicit sizes; also enables optional outputs such as
            MaxPool ``Indices`` or Dropout ``mask``.  Defaults to 1 (or the
            number of explicit split sizes).

    Ops in :data:`SUPPORTED` run natively; everything else is delegated to
    :func:`run_reference`.
    """
    ins = _trim(inputs)
    count = num_outputs if num_outputs is not None else _default_num_outputs(
        op_type, attrs, ins, opset)
    name = op_spec(op_type).kernel
    if name is None:
        return run_reference(op_type, attrs, ins, opset, num_outputs=count)
    return _KERNELS[name](_Node(op_type, attrs, ins, opset, count))


def _attr_value(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return onnx.numpy_helper.from_array(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def run_reference(op_type: str, attrs: Mapping[str, Any], inputs: Sequence[_Array | None],
                  opset: int, *, num_outputs: int | None = None) -> list[_Array]:
    """Run one node with ``onnx.reference.ReferenceEvaluator`` (slow but complete).

    Builds a one-node model in the default domain at ``opset``; absent optional
    inputs become empty input names.  ``num_outputs`` is as in :func:`run_op`.
    """
    ins = _trim(inputs)
    count = num_outputs if num_outputs is not None else _default_num_outputs(
        op_type, attrs, ins, opset)
    in_names = [f"in{i}" if v is not None else "" for i, v in enumerate(ins)]
    out_names = [f"out{i}" for i in range(count)]
    node = onnx.helper.make_node(
        op_type, in_names, out_names, **{k: _attr_value(v) for k, v in attrs.items()})
    graph_inputs = [
        onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for name, v in zip(in_names, ins, strict=True) if v is not None
    ]
    graph_outputs = [onnx.ValueInfoProto(name=name) for name in out_names]
    graph = onnx.helper.make_graph([node], f"{op_type}_ref", graph_inputs, graph_outputs)
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    feeds = {name: v for name, v in zip(in_names, ins, strict=True) if v is not None}
    results = ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(r) for r in results]
