"""How a group runs: one execution-mode record, what each mode needs, and which mode it is.

A group's mode is everything about how it runs but its layers and its tile: where its
weights live, its input buffers, how tiles get their halos, which loop is outermost, the
passes around its reductions and the chunks of its hidden channels. The planners' tile
choices, the placements, the plan file and the emulator all carry this one record; what the
modes need of each other and of the group is written once, in `mode_problem`, which the plan
reader, the assembler (and so `explain` and `verify`) and the emulator ask; `mode_kind`
names the one cost function and emulator runner a mode uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum

from fuseplan.planner.geometry.attention import (
    attention_heads,
    attention_kv_heads,
    head_chunk_options,
    spillable,
)
from fuseplan.planner.geometry.cluster_split import cluster_split, wram_keys
from fuseplan.planner.geometry.ends import chunked_ends
from fuseplan.planner.geometry.hidden import makes_chunks, stretches
from fuseplan.planner.geometry.passes import pass_split, pass_stretches
from fuseplan.planner.geometry.regions import Tile, group_io, whole_outputs
from fuseplan.planner.geometry.reload import reloaded_inputs
from fuseplan.planner.ir.chunks import chunk_axes
from fuseplan.planner.ir.graph import Graph


class WeightResidency(Enum):
    """Where a layer's weights live while its group runs."""

    RESIDENT = "resident"  # loaded once, held on chip (WRAM, or SRAM on unified chips)
    # loaded layer by layer, in output-channel chunks, again for every tile
    # (planner.cost.weight_stream): once in all for a group of one tile
    STREAMED_PER_TILE = "streamed_per_tile"

    @classmethod
    def of(cls, resident: bool) -> WeightResidency:
        return cls.RESIDENT if resident else cls.STREAMED_PER_TILE


class LoopOrder(StrEnum):
    """Which loop of a group is outermost (plan files' "loop_order" key)."""

    TILES_OUTER = "tiles_outer"  # each tile runs every layer; streamed weights per round
    # one layer whose streamed weights arrive in output-channel chunks: each chunk is loaded
    # once and applied to every tile of every image (the tiles' inputs are read per chunk)
    WEIGHTS_OUTER = "weights_outer"


class HaloMode(StrEnum):
    """How overlapping tiles get their halos (plan files' "halo" key)."""

    RECOMPUTE = "recompute"  # each tile reloads and recomputes its border
    REUSE = "reuse"  # row tiles run in order and keep the border rows of every tensor

    @classmethod
    def of(cls, reuse: bool) -> HaloMode:
        return cls.REUSE if reuse else cls.RECOMPUTE


class ModeKind(StrEnum):
    """Which cost function and emulator runner a mode uses (one each)."""

    TILES = "tiles"  # tiles outer, halos recomputed or reused, weights resident or streamed
    WEIGHTS_OUTER = "weights_outer"  # one layer, each weight chunk over every tile
    PASSES = "passes"  # passes around the group's global reductions
    HEAD_CHUNKS = "head_chunks"  # a lone fused attention, a chunk of its heads at a time
    HIDDEN = "hidden"  # stretches run in chunks of their hidden channels
    ENDS = "ends"  # input and output streamed in channel chunks, the maps between whole
    # every cluster on the same tile, each with its share of the output channels (row
    # tiles may reuse halos, keeping or spilling a causal attention's keys)
    CLUSTER_SPLIT = "cluster_split"
    # halos reused, the kept keys written as made and read back per tile (keys_spilled)
    KEYS_SPILLED = "keys_spilled"


@dataclass(frozen=True)
class Mode:
    """How a group runs, but for its layers and tile (see the module's docstring)."""

    weights: WeightResidency = WeightResidency.RESIDENT
    double_buffered: bool = False  # a second input buffer loads the next tile's inputs
    halo: HaloMode = HaloMode.RECOMPUTE
    loop: LoopOrder = LoopOrder.TILES_OUTER
    # more than 1: the group runs in passes around its global reductions
    # (planner.geometry.passes: a squeeze-excite scale waits for its pool, and a later pass
    # recomputes the pooled map, or reads it held)
    passes: int = 1
    # with passes: the group's inputs loaded whole once and held on chip for every pass
    inputs_held: bool = False
    # more than 1: the group's stretches (a widening layer, per-element layers, a narrowing
    # layer: an MLP, an expand / project pair) run in this many chunks of their hidden
    # channels, so that the hidden maps are never on chip whole (planner.geometry.hidden);
    # a lone fused attention runs in that many chunks of its heads
    hidden_chunks: int = 1
    # with passes: each pooled map kept whole on chip by its pass; later passes read it
    # there instead of computing it again
    maps_held: bool = False
    # with hidden chunks: the group's inputs read before a stretch and after it are loaded
    # again after it rather than held across (planner.geometry.reload)
    inputs_reloaded: bool = False
    # more than 1: the group's first layer reads its input in this many chunks of input
    # channels (partial sums of its output on chip) and its last layer writes its output in
    # this many chunks of output channels, so that only the maps between are on chip whole
    # (planner.geometry.ends)
    end_chunks: int = 1
    # every cluster runs the same tile on its share of each layer's output channels, its
    # share of the weights resident (planner.geometry.cluster_split): the weights are spread
    # over the clusters instead of copied into each; with halo reuse its row tiles run in
    # order, so a decoder layer keeps (or spills) its keys as a whole group
    cluster_split: bool = False
    # with halo reuse: the keys and values a causal attention reads a prefix of, made by
    # the group (planner.geometry.attention.kept_prefix), are not held as the tiles go but
    # written to DRAM as each tile makes its rows and read back by later tiles a chunk of
    # keys at a time (planner.cost.spilled_keys): a prefill whose keys outgrow the chip
    keys_spilled: bool = False
    # with a cluster split reusing halos: the kept keys and values (the attention's
    # stationary operands, as weights are a projection's) move into the cores' WRAM as each
    # tile is done with them, each cluster keeping only the heads its share of the query
    # heads reads (planner.geometry.cluster_split.wram_keys): the keys of a long prefill
    # that outgrow a cluster's SRAM whole stay on chip, spread over the clusters
    keys_in_wram: bool = False

    @classmethod
    def of(cls, *, resident: bool = True, double_buffered: bool = False,
           halo_reuse: bool = False, weights_outer: bool = False, passes: int = 1,
           inputs_held: bool = False, hidden_chunks: int = 1, maps_held: bool = False,
           inputs_reloaded: bool = False, end_chunks: int = 1,
           cluster_split: bool = False, keys_spilled: bool = False,
           keys_in_wram: bool = False) -> Mode:
        """A mode from the planners' flags (by name: no flag is ever passed by position)."""
        return cls(WeightResidency.of(resident), double_buffered, HaloMode.of(halo_reuse),
                   LoopOrder.WEIGHTS_OUTER if weights_outer else LoopOrder.TILES_OUTER,
                   passes, inputs_held, hidden_chunks, maps_held, inputs_reloaded, end_chunks,
                   cluster_split, keys_spilled, keys_in_wram)

    @property
    def weights_resident(self) -> bool:
        """Whether the group's weights are held on chip for all its tiles."""
        return self.weights is WeightResidency.RESIDENT

    @property
    def halo_reuse(self) -> bool:
        """Whether tiles keep what later tiles read instead of recomputing halos."""
        return self.halo is HaloMode.REUSE

    @property
    def weights_outer(self) -> bool:
        """Whether each weight chunk sweeps every tile before the next chunk loads."""
        return self.loop is LoopOrder.WEIGHTS_OUTER

    @property
    def pinned(self) -> bool:
        """Whether the mode runs passes, hidden or end chunks or a cluster split: each has a
        search of its own that prices it whole, and CP-SAT takes its choices pinned (its
        tile variables state the other modes)."""
        return self.passes > 1 or self.hidden_chunks > 1 or self.end_chunks > 1 \
            or self.cluster_split or self.keys_spilled

    @property
    def prefetchable(self) -> bool:
        """Whether a group before this one may load its weights ahead: all of them load with
        its first tile into each cluster's memory (resident, not split over the clusters)."""
        return self.weights_resident and not self.cluster_split


class ModeFlags:
    """The mode's fields read through a record that carries one (`mode`): the placements,
    tile choices, search options, rules' facts and CP-SAT candidates all do, so that each
    flag is declared once, in Mode."""

    mode: Mode

    @property
    def weights_resident(self) -> bool:
        """Whether the group's weights are held on chip for all its tiles."""
        return self.mode.weights_resident

    @property
    def resident(self) -> bool:
        """weights_resident, as the tile searches' choices and options say it."""
        return self.mode.weights_resident

    @property
    def double_buffered(self) -> bool:
        return self.mode.double_buffered

    @property
    def halo_reuse(self) -> bool:
        """Whether tiles keep what later tiles read instead of recomputing halos."""
        return self.mode.halo_reuse

    @property
    def weights_outer(self) -> bool:
        """Whether each weight chunk sweeps every tile before the next chunk loads."""
        return self.mode.weights_outer

    @property
    def passes(self) -> int:
        return self.mode.passes

    @property
    def inputs_held(self) -> bool:
        return self.mode.inputs_held

    @property
    def hidden_chunks(self) -> int:
        return self.mode.hidden_chunks

    @property
    def maps_held(self) -> bool:
        return self.mode.maps_held

    @property
    def inputs_reloaded(self) -> bool:
        return self.mode.inputs_reloaded

    @property
    def end_chunks(self) -> int:
        return self.mode.end_chunks

    @property
    def cluster_split(self) -> bool:
        """Whether the clusters share out the output channels of one tile at a time."""
        return self.mode.cluster_split

    @property
    def keys_spilled(self) -> bool:
        """Whether the kept keys go to DRAM as made and come back per tile."""
        return self.mode.keys_spilled

    @property
    def keys_in_wram(self) -> bool:
        """Whether a split group's kept keys stay in its cores' WRAM, heads shared out."""
        return self.mode.keys_in_wram


def mode_kind(graph: Graph, layers: tuple[str, ...], mode: Mode) -> ModeKind:
    """The kind of run `mode` makes of these layers (which cost function and runner)."""
    if mode.passes > 1:
        return ModeKind.PASSES
    if mode.cluster_split:
        return ModeKind.CLUSTER_SPLIT
    if mode.keys_spilled:
        return ModeKind.KEYS_SPILLED
    if mode.end_chunks > 1:
        return ModeKind.ENDS
    if mode.hidden_chunks > 1:
        if attention_heads(graph, group_io(graph, layers)) is not None:
            return ModeKind.HEAD_CHUNKS
        return ModeKind.HIDDEN
    if mode.weights_outer:
        return ModeKind.WEIGHTS_OUTER
    return ModeKind.TILES


def mode_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                 whole: Tile, chunked: tuple[str, ...] = ()) -> str | None:
    """What is wrong with running `layers` in `mode` with `tile`, or None. `whole` is the
    group's whole-output tile (planner.plan.checks.whole_tile); `chunked` names layers
    whose streamed weights are stated in more than one output-channel chunk.

    Every reader of a mode asks this one function: the plan file's reader (its message
    then names the key), the assembler, and through it explain and verify."""
    # in the order the plan file's keys were always checked (its messages name the first)
    for check in (_loop_problem, _passes_problem, _inputs_held_problem, _hidden_problem,
                  _maps_held_problem, _reloaded_problem, _ends_problem, _split_problem,
                  _spilled_problem, _wram_keys_problem, _whole_outputs_problem):
        found = check(graph, layers, tile, mode, whole, chunked)
        if found is not None:
            return found
    return None


def _loop_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                  whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if mode.weights_outer and (
            len(layers) != 1 or mode.weights_resident or mode.halo_reuse
            or chunk_axes(graph, graph.layer(layers[0])) is None):
        return ("loop_order \"weights_outer\" needs one layer whose weights can be split into "
                "output-channel chunks, streamed (\"weights_resident\": false), with halos "
                "recomputed; remove the key.")
    return None


def _inputs_held_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                         whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if mode.inputs_held and (mode.passes == 1 or mode.double_buffered):
        return ("inputs_held holds a group's inputs across its pooling passes, "
                "single-buffered: it needs \"passes\" above 1 and \"double_buffered\": false; "
                "remove the key or set those.")
    return None


def _maps_held_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                       whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if not mode.maps_held:
        return None
    if mode.passes == 1:
        return ("maps_held keeps each pooled map on chip for the later pooling passes: it "
                "needs \"passes\" above 1; remove the key or set it.")
    if pass_split(graph, layers, mode.inputs_held, True) is None:
        return ("maps_held: a map this group pools is one of its inputs or also leaves the "
                "group, so it cannot be held as it is made; remove the key (\"inputs_held\": "
                "true holds inputs).")
    return None


def _passes_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                    whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if mode.passes == 1:
        return None
    split = pass_split(graph, layers)
    if split is None:
        return (f"passes is {mode.passes}, but the group holds no global reduction whose "
                "result feeds back into it on per-image vectors (a squeeze-excite pool and "
                "scale); remove the key.")
    if split.count != mode.passes:
        return (f"passes is {mode.passes}, but the group's {split.count - 1} reductions make "
                f"{split.count} passes; write {split.count}.")
    if not mode.weights_resident or mode.halo_reuse or mode.weights_outer \
            or tile.bands > 1 or (tile.n, tile.w) != (whole.n, whole.w):
        return (f"passes {mode.passes} runs with resident weights, halos recomputed, tiles "
                "outer, no bands, and tiles of every image at full width; set those or "
                "remove the key.")
    return None


def _hidden_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                    whole: Tile, chunked: tuple[str, ...]) -> str | None:
    chunks = mode.hidden_chunks
    if chunks == 1:
        return None
    if mode.passes > 1:  # each pass's stretches (planner.geometry.passes.pass_stretches)
        split = pass_split(graph, layers, mode.inputs_held, mode.maps_held)
        found = tuple(s for ss in pass_stretches(graph, split) for s in ss) \
            if split is not None else ()
    else:
        io = group_io(graph, layers)
        heads = attention_heads(graph, io)
        if heads is not None:  # a lone fused attention: chunks of its heads
            kv = attention_kv_heads(graph, io) or heads  # grouped-query: whole groups
            if chunks not in head_chunk_options(heads, kv) or mode.halo_reuse \
                    or tile.bands > 1 or mode.weights_outer:
                which = f"{heads} heads" if kv == heads else \
                    f"{heads} query heads in groups over {kv} key heads"
                return (f"hidden_chunks is {chunks}, but the fused attention {layers[0]!r} "
                        f"runs its {which} in chunks that divide them, halos "
                        f"recomputed, tiles outer; use a divisor of {kv} or remove the "
                        "key.")
            return None
        found = stretches(graph, io)
    if not found:
        return (f"hidden_chunks is {chunks}, but the group holds no stretch to chunk (a layer "
                "widening the channels, per-element layers, a layer summing them back: an "
                "MLP, an expand / project pair); remove the key.")
    # each stretch runs in the most chunks it makes up to the count (stretch_chunks): the
    # count must be one that some stretch makes exactly
    if not any(makes_chunks(s, chunks) for s in found):
        s = max(found, key=lambda x: x.channels)
        # a cut stretch counts heads where it runs attention, else its channels (SwiGLU)
        attends = any(graph.layer(n).op in ("FlashAttention", "Softmax") for n in s.mids)
        units = "heads" if s.cuts and attends else "hidden channels"
        return (f"hidden_chunks is {chunks}, but no stretch makes {chunks} chunks: the one "
                f"from {s.widen!r} has {s.channels} {units}, which do not make {chunks} "
                f"chunks of ceil({s.channels} / {chunks}); use a count that does (e.g. "
                f"{max(1, s.channels // 2)} or a power of two below {s.channels}).")
    if mode.halo_reuse or tile.bands > 1 or mode.weights_outer:
        return (f"hidden_chunks {chunks} runs with halos recomputed, tiles outer and no bands; "
                "set those or remove the key.")
    cut = [n for n in chunked if any(n in s.layers for s in found)]
    if cut:
        return (f"weight_chunks names {cut[0]!r}, whose weights the hidden chunks cut; remove "
                "it from weight_chunks.")
    return None


def _reloaded_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                      whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if not mode.inputs_reloaded:
        return None
    if mode.hidden_chunks == 1 or mode.passes > 1 or mode.double_buffered:
        return ("inputs_reloaded loads inputs again after a stretch run in hidden chunks: it "
                "needs \"hidden_chunks\" above 1, no \"passes\" and \"double_buffered\": "
                "false; remove the key or change those.")
    if not reloaded_inputs(graph, group_io(graph, layers)):
        return ("inputs_reloaded: no input of this group is read both before and after one "
                "of its stretches (and by none of their layers), so none can be loaded "
                "again; remove the key.")
    return None


def _ends_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                  whole: Tile, chunked: tuple[str, ...]) -> str | None:
    chunks = mode.end_chunks
    if chunks == 1:
        return None
    ends = chunked_ends(graph, group_io(graph, layers))
    if ends is None:
        return (f"end_chunks is {chunks}, but the group does not end with one output, its "
                "channels last, made by a layer computed in output-channel chunks and the "
                "per-element layers after it (or, where it starts with a MatMul by constant "
                "weights reading an input no other layer of it reads, by any such layer and "
                "those after it); remove the key.")
    if not ends.makes_chunks(chunks):
        which = f"{ends.produced} output channels of {ends.last!r} do not make" \
            if ends.first is None else (f"{ends.reduced} input channels of {ends.first!r} "
                                        f"and {ends.produced} output channels of "
                                        f"{ends.last!r} do not both make")
        return (f"end_chunks is {chunks}, but {which} {chunks} chunks of ceil(C / "
                f"{chunks}); use a power of two below {ends.most_chunks} that does.")
    if mode.passes > 1 or mode.hidden_chunks > 1 or mode.halo_reuse or mode.weights_outer \
            or mode.double_buffered or mode.inputs_reloaded or tile.bands > 1:
        return (f"end_chunks {chunks} runs with one input buffer, halos recomputed, tiles "
                "outer, no passes, hidden chunks or bands; set those or remove the key.")
    cut = [n for n in chunked if n in ends.layers]
    if cut:
        return (f"weight_chunks names {cut[0]!r}, whose weights the end chunks cut; remove "
                "it from weight_chunks.")
    return None


def _split_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                   whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if not mode.cluster_split:
        return None
    if cluster_split(graph, group_io(graph, layers)) is None:
        return ("cluster_split shares out output channels over the clusters: one layer of "
                "the group must cut its weights along its output channels (a Conv without "
                "groups, a Linear), no main layer may hold weights it cannot cut (a "
                "depthwise conv) or make two maps, a layer cutting its weights "
                "may share none with another, and the group may not end in an accumulation; "
                "remove the key.")
    if not mode.weights_resident or mode.weights_outer \
            or mode.passes > 1 or mode.hidden_chunks > 1 or mode.end_chunks > 1 \
            or tile.bands > 1 or (mode.halo_reuse and tile.w != whole.w):
        return ("cluster_split runs with resident weights, tiles outer, halos recomputed or "
                "reused by row tiles at full width, no passes, hidden or end chunks and no "
                "bands; set those or remove the key.")
    return None


def _spilled_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                     whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if not mode.keys_spilled:
        return None
    if not spillable(graph, group_io(graph, layers)):
        return ("keys_spilled writes to DRAM the keys and values a causal attention of the "
                "group reads a prefix of, where the group makes them, reads them nowhere "
                "else and does not output them; this group makes none such; remove the "
                "key.")
    if not mode.halo_reuse or not mode.weights_resident or mode.weights_outer \
            or mode.passes > 1 or mode.hidden_chunks > 1 or mode.end_chunks > 1 \
            or tile.bands > 1 or (tile.n, tile.w) != (whole.n, whole.w):
        return ("keys_spilled runs row tiles in order (\"halo\": \"reuse\") over every image "
                "at full width, weights resident (or split over the clusters), tiles outer, "
                "no passes, hidden or end chunks or bands; set those or remove the key.")
    return None


def _wram_keys_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                       whole: Tile, chunked: tuple[str, ...]) -> str | None:
    if not mode.keys_in_wram:
        return None
    if not mode.cluster_split or not mode.halo_reuse or mode.keys_spilled:
        return ("keys_in_wram keeps a split group's kept keys in its cores' WRAM: it runs "
                "with \"cluster_split\": true and \"halo\": \"reuse\", its keys not spilled; "
                "set those or remove the key.")
    io = group_io(graph, layers)
    split = cluster_split(graph, io)
    if split is None or wram_keys(graph, io, split, 1) is None:
        return ("keys_in_wram keeps the keys and values a causal fused attention of the "
                "group reads a prefix of, made in the group, [batch, heads, rows, width], "
                "each cluster its query heads' share; this group keeps none such; remove "
                "the key.")
    return None


def _whole_outputs_problem(graph: Graph, layers: tuple[str, ...], tile: Tile, mode: Mode,
                           whole: Tile, chunked: tuple[str, ...]) -> str | None:
    # tiles outer (split over the clusters, or in hidden chunks): an output leaving
    # mid-group is stored once, whole, so such a group runs as one tile (passes and end
    # chunks say their own tiles: pass_split judges the last pass's outputs)
    if mode.passes > 1 or mode.end_chunks > 1 or (
            tile.n >= whole.n and tile.h >= whole.h and tile.w >= whole.w):
        return None
    found = whole_outputs(graph, group_io(graph, layers))
    if not found:
        return None
    return (f"the tile {tile.n}x{tile.h}x{tile.w} cuts the group's output, but {found[0]!r} "
            "leaves the group mid-way and every tile needs it whole; use the whole tile "
            f"{whole.n}x{whole.h}x{whole.w} or end the group where {found[0]!r} is made.")
