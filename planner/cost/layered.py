"""A group of one tile, played layer by layer as its weights arrive.

A group whose maps sit on chip whole runs one tile, and that tile loads every weight of
the group: all of them at once when resident, chunk by chunk when streamed. The hardware
does not wait for the last layer's weights before it computes the first layer. The DMA
brings the tile's maps, then each layer's weights in layer order. Each layer (each chunk of
its output channels) starts as soon as its own weights are in and the cores are done with
what came before (seed 000's rules 13-16 on overlapping weight loads with compute; SoMa's
schedules do the same). Resident weights have room for all of them, so the link runs ahead
freely. Streamed chunks have the double-buffered pair their peak reserves
(planner.cost.weight_stream), so a chunk loads once the one two before it has computed; on
a single-memory chip they have instead a ring of all the SRAM the tile's maps leave, when
that holds the largest pair (planner.cost.model.weight_ring; the group's peak is then that
whole SRAM), so the link runs as far ahead as the ring allows.
What that hides of the tile's compute is the group's ``overlap_cycles``:
planner.cost.model.cycles_energy takes it off the closed form. The emulator's clock plays
the same rule on the layers it counted (emulator.clock), so the two are compared, not
restated.

Only a tiles-outer group with halos recomputed and no accumulating reduction gets it. The
other modes interleave their layers (hidden chunks, passes, ends, bands). A group of
several tiles keeps the closed form: its first tile's compute is a small part of its time,
and a tile search or CP-SAT would need the overlap of every tile size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.schedule import LayerStep, layered_overlap
from fuseplan.planner.cost.weight_stream import chunk_sizes, layer_chunks
from fuseplan.planner.geometry.regions import Box, GroupIO, box_elems
from fuseplan.planner.ir.array import array_macs, matrix_macs
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph


def layer_chunks_of(graph: Graph, io: GroupIO, chip: Chip, streamed: bool
                    ) -> dict[str, tuple[tuple[int, Fraction], ...]]:
    """Per layer of the group, in its order, the chunks of weights that arrive for it, each
    with its share of the layer's work: resident, each weight tensor whole with the first
    layer that reads it; streamed, each layer's own weights in its output-channel chunks
    (planner.cost.weight_stream, with the share of the channels each chunk makes)."""
    seen: set[str] = set()
    out: dict[str, tuple[tuple[int, Fraction], ...]] = {}
    dt = chip.dtype_bytes
    for name in io.layers:
        lay = graph.layer(name)
        if streamed:
            count = layer_chunks(graph, lay, chip) if lay.weights else 0
            split = chunk_axes(graph, lay)
            sizes = chunk_sizes(graph, lay, count, dt) if count else []
            if len(sizes) > 1 and split is not None:
                out[name] = tuple((size, Fraction(hi - lo, split[0])) for size, (lo, hi)
                                  in zip(sizes, chunk_ranges(split[0], count), strict=True))
            else:
                out[name] = tuple((size, Fraction(1)) for size in sizes if size)
            continue
        new = [w for w in dict.fromkeys(lay.weights) if w not in seen]
        seen.update(new)
        size = sum(int(graph.constants[w].size) for w in new) * dt
        out[name] = ((size, Fraction(1)),) if size else ()
    return out


def layer_cycles(chip: Chip, macs: int, array: int, vector_ops: int) -> Fraction:
    """Exact cycles of one layer's work on every core: MACs on the matrix units (array MACs
    on an array chip), vector ops on the vector lanes."""
    return (Fraction(matrix_macs(chip, macs, array), chip.cores * chip.core.macs_per_cycle)
            + Fraction(vector_ops, chip.cores * chip.core.vector_lanes))


def tile_layers(graph: Graph, io: GroupIO, boxes: Mapping[str, Box], chip: Chip,
                streamed: bool = False) -> list[LayerStep]:
    """The layers of one tile (its regions `boxes`) as the weight stream feeds them."""
    chunks = layer_chunks_of(graph, io, chip, streamed)
    steps = []
    for name in io.layers:
        lay = graph.layer(name)
        elems = box_elems(graph, lay.outputs[0], boxes[lay.outputs[0]])
        ops = lay.macs_per_output * elems
        cycles = layer_cycles(chip, ops, array_macs(lay, chip, elems, ops), 0) if lay.is_main \
            else layer_cycles(chip, 0, 0, ops)
        steps.append(LayerStep(chunks[name], cycles))
    return steps


def layered_applies(io: GroupIO, halo_reuse: bool) -> bool:
    """Whether a group of one tile is played layer by layer (see the module docstring; the
    caller knows the loop tiles outer and the group is one tile)."""
    return not halo_reuse and not io.accumulated and len(io.layers) > 1


def first_tile_overlap(graph: Graph, io: GroupIO, boxes: Mapping[str, Box], chip: Chip,
                       map_bytes: int, streamed: bool = False, ring: int = 0) -> int:
    """overlap_cycles of a group whose one tile has regions `boxes` and loads `map_bytes`
    of maps before its weights: resident, every weight may arrive ahead; streamed, two
    chunks are on chip at once (the double-buffered pair its peak reserves), or as many as
    fit a ring of `ring` bytes (planner.cost.model.weight_ring)."""
    steps: Sequence[LayerStep] = tile_layers(graph, io, boxes, chip, streamed)
    if not any(s.chunks for s in steps):
        return 0
    bpc = Fraction(str(chip.dram.bandwidth_gbps)) / Fraction(str(chip.clock_ghz))
    return layered_overlap(bpc, map_bytes, steps, ahead=2 if streamed and not ring else 0,
                           room=ring if streamed else 0)
