"""Array utilisation: a layer's MACs mapped onto a core's rows x cols MAC array.

Weight-stationary (the one dataflow hardware.chip.Array accepts): the reduction of one
output element (input channels per group x kernel, K) maps onto the rows and the output
channels of a group (M_g) onto the columns, so each output pixel of each group takes
ceil(K / R) x ceil(M_g / C) array passes, every pass occupying all R x C MACs for a cycle.
A layer's *array MACs* are therefore

    output pixels x groups x ceil(K / R) * R x ceil(M_g / C) * C   (>= its MACs)

and its utilisation MACs / array MACs. Per output pixel it is a constant of the layer, so a
tile's array MACs are its output pixels times that constant: linear in the tile, as the
closed forms and CP-SAT need. Pixels are output elements over output channels: a tile holds
every channel of what it makes. Where a group's run splits a layer's channels (streamed
output-channel chunks, hidden input-channel chunks) the layer still counts as a whole:
utilisation is the layer's, not the chunk's.

Conv (grouped and depthwise included), ConvTranspose (K = its MACs per output element:
exact at stride 1, the mean number of taps per output otherwise), Gemm and MatMul map onto
the array. The other main layers (pools, fused attention) keep the flat rate: their array
MACs are their MACs. A chip without an array counts no array MACs at all (0), and its
compute stays MACs / macs_per_cycle (`matrix_macs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from fuseplan.hardware.chip import Array, Chip
from fuseplan.planner.ir.graph import Layer

__all__ = ["ArrayMap", "array_macs", "array_map", "matrix_macs"]

_CONVS = ("Conv", "ConvTranspose")
_PRODUCTS = ("Gemm", "MatMul")


@dataclass(frozen=True)
class ArrayMap:
    """How one layer sits on the array, per output pixel."""

    groups: int
    reduction: int  # K: MACs per output element (input channels per group x kernel)
    channels: int  # output channels of all groups (output elements per pixel)
    rows: int  # rows the reduction takes: ceil(K / R) * R
    cols: int  # columns a group's output channels take: ceil(M_g / C) * C

    @property
    def per_pixel(self) -> int:
        """Array MACs of one output pixel (every group)."""
        return self.groups * self.rows * self.cols

    @property
    def utilisation(self) -> float:
        """MACs over array MACs (1.0 when K and M_g are multiples of R and C)."""
        return self.reduction * self.channels / self.per_pixel


def array_map(lay: Layer, array: Array) -> ArrayMap | None:
    """The layer's mapping onto `array`, or None for a main layer that keeps the flat rate
    (pools, fused attention) and for layers off the matrix unit."""
    if not lay.is_main or len(lay.out_shape) < 2:
        return None
    if lay.op in _CONVS:
        groups, channels = int(lay.attrs.get("group", 1)), lay.out_shape[1]
    elif lay.op in _PRODUCTS:
        groups, channels = 1, lay.out_shape[-1]
    else:
        return None
    if groups < 1 or channels % groups:
        return None
    k = lay.macs_per_output
    r, c = array.rows, array.cols
    return ArrayMap(groups, k, channels, ceil(k / r) * r, ceil(channels // groups / c) * c)


def array_macs(lay: Layer, chip: Chip, elems: int, macs: int) -> int:
    """Array MACs of a main layer making `elems` output elements with `macs` MACs (0 on a
    chip without an array; `macs` for a layer that keeps the flat rate). Exact when `elems`
    holds whole pixels (every channel), as each tile's, and each layer's, do."""
    array = chip.core.array
    if array is None:
        return 0
    amap = array_map(lay, array)
    if amap is None:
        return macs
    return elems * amap.per_pixel // amap.channels


def matrix_macs(chip: Chip, macs: int, array: int) -> int:
    """The MACs the matrix unit's time is counted in: array MACs on an array chip (idle
    rows and columns cost their cycles), else the MACs themselves."""
    return array if chip.core.array is not None else macs
