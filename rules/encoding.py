"""CP-SAT variables of candidate groups and the closed forms rules are stated in.

Rules encode themselves over these (rules.base.Rule.encode), as they check themselves
over GroupFacts, so the module sits with the rules; the CP-SAT planner (solver.cpsat)
builds its model with it.

For every candidate group the model has a selection literal, an integer tile
height ``th`` (and tile batch ``tn`` when the batch is larger than one), the
tile count ``T = ceil(H / th)`` (a division constraint), and, per tensor, the
largest row range a tile needs, ``min(S*th + E + P - S, U)``: capacities are
linear inequalities in those. DRAM reads sum the row ranges over all tiles in
closed form (planner.geometry.regions.AxisChain.total), with ``T*th`` a multiplication
constraint. Tiles span the whole width and recompute their halos here;
halo-reusing and 2-D tiles enter as pinned candidates, each with the exact
best tile of the Python search (solver.tiles) and its cost as constants.

Quantities are ``Expr``: a plain int where the tile fixes them, else a linear expression
over the model's variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from math import ceil
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:  # ortools (and the pandas it loads) only once a model is built
    from ortools.sat.python.cp_model import Constraint, IntVar, LinearExpr
    from ortools.sat.python.cp_model_helper import Literal

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.model import Counters, dram_loads, live_steps, region_sum, weight_bytes
from fuseplan.planner.cost.weight_stream import layer_chunks, staged_steps
from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.regions import (
    GroupChains,
    GroupIO,
    Tile,
    anchor_extent,
    group_chains,
    group_io,
    tiled_like_anchor,
)
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.facts import GroupFacts, channels

# a quantity: fixed by the tile, or linear in the model's variables
Expr: TypeAlias = "LinearExpr | int"


class Pinned(Protocol):
    """A tile choice with its mode and cost (solver.tiles.TileChoice), pinned in a
    candidate."""

    @property
    def tile(self) -> Tile: ...

    @property
    def mode(self) -> Mode: ...

    @property
    def cost(self) -> Counters: ...


def tile_floor(chains: GroupChains, io: GroupIO, graph: Graph, axis: int) -> int | None:
    """Smallest tile size along an axis (0 batch, 1 rows) for which closed forms hold."""
    extent = anchor_extent(graph, io)[axis]
    low = 1
    for chain in chains.chains.values():
        c = chain[axis]
        if c is None:
            return None
        m = c.min_tile(extent)
        if m is None:
            return None
        low = max(low, m)
    return min(low, extent)


@dataclass
class Candidate:
    """One candidate group with its CP-SAT variables."""

    index: int
    layers: tuple[str, ...]
    io: GroupIO
    chains: GroupChains
    extent: tuple[int, int, int]
    selected: IntVar
    th: IntVar | int  # rows per tile: a variable, or fixed
    tn: IntVar | int  # images per tile
    tiles_h: IntVar | int
    tiles_n: IntVar | int
    tiles: Expr  # tiles_h * tiles_n
    resident: IntVar  # BoolVar: weights held on chip for the whole group
    double_buffered: IntVar  # BoolVar: a second input buffer prefetches the next tile
    halo_reuse: IntVar  # constant: tiles keep what later tiles read (pinned candidates only)
    small: IntVar  # BoolVar: th == H (whole maps on chip)
    th_low: int
    facts_any_tile: GroupFacts
    rows: dict[str, Expr] = field(default_factory=dict)  # tensor -> bound-rows var/int
    fixed: Counters | None = None  # the pinned tile's cost (no closed form for its rows)
    # a pinned tile's mode (planner.plan.mode): its passes around reductions, hidden chunks,
    # what it holds or loads again; a free candidate's residency, buffering and halo mode
    # are the variables above, the rest of its mode the default
    mode: Mode = Mode()
    # the exact feature-map peak of a tile run in passes or hidden chunks (its weights on a
    # single-memory chip beside the maps: resident ones not included, streamed ones are)
    exact_peak: int | None = None

    @property
    def passes(self) -> int:
        return self.mode.passes

    @property
    def inputs_held(self) -> bool:
        return self.mode.inputs_held

    @property
    def maps_held(self) -> bool:
        return self.mode.maps_held

    @property
    def hidden_chunks(self) -> int:
        return self.mode.hidden_chunks

    @property
    def inputs_reloaded(self) -> bool:
        return self.mode.inputs_reloaded

    @property
    def in_passes(self) -> bool:
        """Whether the candidate is a pinned tile run in passes around its reductions."""
        return self.passes > 1

    @property
    def in_hidden_chunks(self) -> bool:
        """Whether the candidate is a pinned tile run in one pass whose stretches run in
        hidden chunks (a tile in passes may chunk its passes' stretches too: in_passes)."""
        return self.hidden_chunks > 1 and self.passes == 1

    @property
    def end_chunks(self) -> int:
        return self.mode.end_chunks

    @property
    def in_end_chunks(self) -> bool:
        """Whether the candidate is a pinned tile whose input and output stream in channel
        chunks (planner.geometry.ends)."""
        return self.end_chunks > 1

    @property
    def fused(self) -> bool:
        return len(self.layers) > 1


class Encoding:
    """The CP-SAT model under construction and the expressions rules are stated in."""

    def __init__(self, graph: Graph, chip: Chip) -> None:
        self.graph = graph
        self.chip = chip
        from ortools.sat.python import cp_model

        self.model = cp_model.CpModel()
        self.candidates: list[Candidate] = []
        # each enabled rule's literal by its key (solver.cpsat.build_model): a rule gates its
        # constraints with it, and an infeasible model names the rules whose literals conflict
        self.rule_lits: dict[str, IntVar] = {}
        self._chunks: dict[str, int] = {}  # per layer, its streamed chunk count
        self._staged: dict[tuple[str, ...], tuple[int, ...]] = {}

    @cached_property
    def _dt(self) -> int:
        return self.chip.dtype_bytes

    def add_candidate(self, layers: Sequence[str], fixed: Pinned | None = None) -> Candidate:
        """Create the variables of one candidate group.

        ``fixed`` (a solver.tiles.TileChoice) pins the tile, weight residency and buffering of
        a group whose rows have no closed form (upsampling inside it): its cost terms are the
        Python cost model's constants and only its selection is decided here.
        """
        graph, m = self.graph, self.model
        i = len(self.candidates)
        io = group_io(graph, layers)
        chains = group_chains(graph, io)
        n, h, w = anchor_extent(graph, io)
        sel = m.new_bool_var(f"select_{i}")
        if fixed is not None:
            t = fixed.tile
            mode = fixed.mode
            # the rules see the tile's residency, buffers, halos, loop order, cluster
            # split and spilled keys (its passes and hidden chunks are checked by solver.passes and
            # solver.hidden)
            pinned = GroupFacts(graph, io, chains, t, self.chip, Mode(
                mode.weights, mode.double_buffered, mode.halo, mode.loop,
                cluster_split=mode.cluster_split, keys_spilled=mode.keys_spilled,
                keys_in_wram=mode.keys_in_wram))
            cand = Candidate(i, tuple(io.layers), io, chains, (n, h, w), sel, t.h, t.n,
                             ceil(h / t.h), ceil(n / t.n),
                             ceil(n / t.n) * ceil(h / t.h) * ceil(w / t.w),
                             m.new_constant(int(mode.weights_resident)),
                             m.new_constant(int(mode.double_buffered)),
                             m.new_constant(int(mode.halo_reuse)),
                             m.new_constant(int(t.h >= h and t.w >= w)), t.h, pinned,
                             fixed=fixed.cost, mode=mode,
                             exact_peak=self._exact_peak(io, fixed))
            self.candidates.append(cand)
            return cand
        h_low = tile_floor(chains, io, graph, 1)
        n_low = tile_floor(chains, io, graph, 0)
        th: IntVar | int = h if h_low is None or h_low >= h \
            else m.new_int_var(h_low, h, f"th_{i}")
        batch_kept = all(c[0] is not None and c[0].s == 1 for c in chains.chains.values())
        tn: IntVar | int = n if n_low is None or n_low >= n or not batch_kept \
            else m.new_int_var(n_low, n, f"tn_{i}")
        tiles_h: IntVar | int
        if isinstance(th, int):
            tiles_h = 1
            small = m.new_constant(1)
        else:
            tiles_h = m.new_int_var(1, ceil(h / max(h_low or 1, 1)), f"tiles_h_{i}")
            m.add_division_equality(tiles_h, th + (h - 1), th)
            small = m.new_bool_var(f"small_{i}")
            m.add(th == h).only_enforce_if(small)
            m.add(th <= h - 1).only_enforce_if(small.Not())
        tiles_n: IntVar | int = 1
        if not isinstance(tn, int):
            tiles_n = m.new_int_var(1, ceil(n / max(n_low or 1, 1)), f"tiles_n_{i}")
            m.add_division_equality(tiles_n, tn + (n - 1), tn)
        tiles: Expr
        if isinstance(tiles_h, int):
            tiles = tiles_h * tiles_n
        elif isinstance(tiles_n, int):
            tiles = tiles_h * tiles_n
        else:
            tiles = m.new_int_var(1, h * n, f"tiles_{i}")
            m.add_multiplication_equality(tiles, [tiles_h, tiles_n])
        resident = m.new_bool_var(f"resident_{i}")
        double_buffered = m.new_bool_var(f"double_buffered_{i}")
        # halo reuse and 2-D tiles come pinned from the Python search (solver.cpsat)
        reuse = m.new_constant(0)
        facts = GroupFacts(graph, io, chains, Tile(n, h, w), self.chip)
        cand = Candidate(i, tuple(io.layers), io, chains, (n, h, w), sel, th, tn, tiles_h,
                         tiles_n, tiles, resident, double_buffered, reuse, small,
                         h_low or h, facts)
        self.candidates.append(cand)
        return cand

    def _exact_peak(self, io: GroupIO, fixed: Pinned) -> int | None:
        """The exact feature-map peak of a pinned tile run in passes, hidden or end chunks, None
        for others: its cost's SRAM peak, less the resident weights a single-memory chip
        holds beside the maps (planner.cost.passes.passes_cost, planner.cost.hidden)."""
        if fixed.mode.passes == 1 and fixed.mode.hidden_chunks == 1 \
                and fixed.mode.end_chunks == 1:
            return None
        if not fixed.mode.weights_resident:
            return fixed.cost.sram_peak_bytes
        held = weight_bytes(self.graph, io.weights, self.chip) if self.chip.unified else 0
        return fixed.cost.sram_peak_bytes - held

    # --- per-tile sizes (bounds, as GroupFacts.tensor_bound_bytes) -------------------

    def _rows(self, cand: Candidate, t: str) -> Expr:
        if t in cand.rows:
            return cand.rows[t]
        chain = cand.chains.chains[t][1]
        fb = cand.chains.full[t]
        value: Expr
        if isinstance(cand.th, int) or chain is None or chain.s == 0:
            value = fb[3] - fb[2]
        else:
            var = self.model.new_int_var(0, fb[3] - fb[2], f"rows_{cand.index}_{len(cand.rows)}")
            self.model.add_min_equality(
                var, [chain.s * cand.th + (chain.e + chain.p - chain.s), chain.u])
            value = var
        cand.rows[t] = value
        return value

    def tensor_bytes(self, cand: Candidate, t: str) -> Expr:
        """Largest box of tensor t any tile needs, in bytes (linear in th; times tn if batched)."""
        return self._scaled_bytes(cand, t)

    def scratch_bytes(self, cand: Candidate, step: int) -> Expr:
        """The online softmax's scratch at `step` (planner.geometry.attention): out elements /
        dv * (keys per chunk + 2), as GroupFacts.scratch_bytes bounds it."""
        attention = online_attention(self.graph, cand.io)
        if attention is None:
            return 0
        if cand.fixed is not None:
            return cand.facts_any_tile.scratch_bytes(step)
        return sum(self._scaled_bytes(cand, out, (chunk + 2, dv))
                   for at, out, dv, chunk in attention.scratch if at == step)

    def _scaled_bytes(self, cand: Candidate, t: str, scale: tuple[int, int] = (1, 1)
                      ) -> Expr:
        """tensor_bytes with the channels scaled by scale[0] / scale[1]."""
        if cand.fixed is not None:
            return cand.facts_any_tile.tensor_bound_bytes(t)
        c = channels(self.graph, t) // scale[1] * scale[0]
        fb = cand.chains.full[t]
        cols = fb[5] - fb[4]
        rows = self._rows(cand, t)
        attention = online_attention(self.graph, cand.io)
        if attention is not None and t in attention.streamed and isinstance(rows, int):
            # one chunk of keys on chip (they are whole along rows and channels)
            keys, chunk = attention.streamed[t]
            c, rows = rows * c // keys * chunk, 1
        cn = cand.chains.chains[t][0]
        batched = cn is not None and cn.s != 0 and not isinstance(cand.tn, int)
        if not batched:
            return rows * (c * cols * (fb[1] - fb[0]) * self._dt)
        key = f"{t}#n"
        if key not in cand.rows:
            prod = self.model.new_int_var(0, (fb[3] - fb[2]) * (fb[1] - fb[0]),
                                          f"rows_n_{cand.index}_{len(cand.rows)}")
            rows_var = rows if not isinstance(rows, int) else self.model.new_constant(rows)
            self.model.add_multiplication_equality(prod, [rows_var, cand.tn])
            cand.rows[key] = prod
        return cand.rows[key] * (c * cols * self._dt)

    def in_bytes(self, cand: Candidate) -> Expr:
        return sum(self.tensor_bytes(cand, t) for t in cand.io.inputs)

    def out_bytes(self, cand: Candidate) -> Expr:
        return sum(self.tensor_bytes(cand, t) for t in cand.io.outputs)

    def staged_steps(self, cand: Candidate) -> tuple[int, ...]:
        """Streamed weight chunks on chip at each step when the candidate streams
        (planner.cost.weight_stream; a constant per step, gated by ``1 - resident``)."""
        key = cand.layers
        if key not in self._staged:
            counts = {}
            for name in cand.layers:
                if self.graph.layer(name).weights:
                    if name not in self._chunks:
                        self._chunks[name] = layer_chunks(self.graph, self.graph.layer(name),
                                                          self.chip)
                    counts[name] = self._chunks[name]
            self._staged[key] = staged_steps(self.graph, cand.io, self.chip, counts)
        return self._staged[key]

    def weight_bytes(self, cand: Candidate) -> int:
        """The candidate's weight bytes; for a pinned choice split over the clusters, one
        cluster's share: what its capacities and rules check (its DRAM terms and first load
        are its pinned cost's own, and it is never prefetched)."""
        if cand.mode.cluster_split:
            return cand.facts_any_tile.weight_bytes
        return weight_bytes(self.graph, cand.io.weights, self.chip)

    def live_steps_bytes(self, cand: Candidate) -> list[Expr]:
        """Live feature-map bytes at each step; their max is GroupFacts.live_peak_bytes."""
        return [sum(self.tensor_bytes(cand, t) for t in live) + self.scratch_bytes(cand, i)
                for i, live in enumerate(live_steps(self.graph, cand.io))]

    def all_fmap_bytes(self, cand: Candidate) -> Expr:
        io = cand.io
        tensors = set(io.inputs) | set(io.outputs) | set(io.internal)
        return sum(self.tensor_bytes(cand, t) for t in sorted(tensors))

    def enforce(self, ct: Constraint, cand: Candidate, *lits: Literal) -> None:
        """Gate a constraint on the candidate being selected and the given literals."""
        ct.only_enforce_if([cand.selected, *lits])

    # --- sums over all tiles ---------------------------------------------------------

    def rows_total(self, cand: Candidate, t: str) -> Expr:
        """Rows of tensor t summed over all row tiles (closed form, exact)."""
        chain = cand.chains.chains[t][1]
        fb = cand.chains.full[t]
        full = fb[3] - fb[2]
        if isinstance(cand.th, int):
            return full
        h = cand.extent[1]
        if chain is None:
            raise ValueError("tileable candidate with a non-affine tensor")
        if chain.s == 0:
            return cand.tiles_h * chain.u
        m = self.model
        last = h - self.rows_tiles_x_th(cand) + cand.th  # rows of the last (shorter) tile
        d = chain.delta(h)
        over = m.new_int_var(0, max(d, 0), f"clip_{cand.index}_{len(cand.rows)}")
        # the tile before the last one overshoots U when the last tile is shorter than the halo
        m.add_max_equality(over, [0, d - chain.s * last])
        cand.rows[f"{t}#over"] = over
        return cand.tiles_h * (chain.e + chain.p - chain.s) + chain.s * h - chain.p - d - over

    def region_elems_total(self, cand: Candidate, t: str) -> Expr:
        """Elements of tensor t summed over all tiles (tiles span the full width; the batch
        splits without overlap because tn is only variable when every tensor keeps it)."""
        if cand.fixed is not None:
            return region_sum(self.graph, cand.io, cand.chains, t, cand.facts_any_tile.tile)
        fb = cand.chains.full[t]
        c = channels(self.graph, t)
        return self.rows_total(cand, t) * (c * (fb[1] - fb[0]) * (fb[5] - fb[4]))

    def read_bytes(self, cand: Candidate, t: str) -> Expr:
        """DRAM bytes of input t over all tiles."""
        return self.region_elems_total(cand, t) * self._dt

    # --- pipeline fill and drain ----------------------------------------------------------

    def product(self, a: Expr, b: Expr, name: str, upper: int) -> Expr:
        """a * b as an expression (a multiplication constraint when both are variables)."""
        if isinstance(a, int):
            return a * b
        if isinstance(b, int):
            return a * b
        var = self.model.new_int_var(0, upper, name)
        self.model.add_multiplication_equality(var, [a, b])
        return var

    def first_load_bytes(self, cand: Candidate) -> Expr:
        """DRAM bytes of the first tile: its input boxes (and the table rows its gathers
        fetch) plus all the group's weights."""
        if cand.fixed is not None:
            return cand.fixed.first_load_bytes
        total: Expr = self.weight_bytes(cand)
        for k, t in enumerate(dram_loads(self.graph, cand.io)):
            chain = cand.chains.chains[t][1]
            fb = cand.chains.full[t]
            c = channels(self.graph, t)
            full_rows = fb[3] - fb[2]
            rows: Expr
            if isinstance(cand.th, int) or chain is None or chain.s == 0:
                rows = full_rows
            else:  # the first tile starts at row 0: [0, min(U, S*(th-1) + E))
                first = self.model.new_int_var(0, full_rows, f"first_rows_{cand.index}_{k}")
                self.model.add_min_equality(first, [chain.s * cand.th + (chain.e - chain.s),
                                                    chain.u])
                rows = first
            cn = cand.chains.chains[t][0]
            images: Expr = fb[1] - fb[0]
            if cn is not None and cn.s == 1 and not isinstance(cand.tn, int):
                images = cand.tn
            both = self.product(rows, images, f"first_{cand.index}_{k}",
                                full_rows * (fb[1] - fb[0]))
            total = total + both * (c * (fb[5] - fb[4]) * self._dt)
        return total

    def last_store_bytes(self, cand: Candidate) -> Expr:
        """DRAM bytes the last tile stores (the last rows and images of the anchor and of
        the outputs cut like it; any other output whole)."""
        if cand.fixed is not None:
            return cand.fixed.last_store_bytes
        n, h, w = cand.extent
        a = cand.io.anchor
        alike = [t for t in cand.io.outputs
                 if t != a and tiled_like_anchor(self.graph, cand.io, t)]
        c = channels(self.graph, a) + sum(channels(self.graph, t) for t in alike)
        others = sum(self.graph.elems(t) for t in cand.io.outputs
                     if t != a and t not in alike) * self._dt
        rows: Expr = h
        if not isinstance(cand.th, int):
            rows = h - self.rows_tiles_x_th(cand) + cand.th
        images: Expr = n
        if not isinstance(cand.tn, int):
            both = self.product(cand.tiles_n, cand.tn, f"tiles_x_tn_{cand.index}", 2 * n)
            images = n - both + cand.tn
        return self.product(rows, images, f"last_{cand.index}", h * n) * (c * w * self._dt) \
            + others

    def rows_tiles_x_th(self, cand: Candidate) -> Expr:
        """T_h * th (shared by the row sums and the last tile's height)."""
        key = "#tth"
        if key not in cand.rows:
            var = self.model.new_int_var(0, 2 * cand.extent[1], f"tiles_x_th_{cand.index}")
            self.model.add_multiplication_equality(var, [cand.tiles_h, cand.th])
            cand.rows[key] = var
        return cand.rows[key]

