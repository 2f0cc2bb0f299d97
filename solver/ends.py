"""Tile search for a group whose input and output stream in channel chunks
(planner.geometry.ends).

The search is in Python for every planner: CP-SAT gets the best choice pinned (its cost and
exact peak are constants, its rules checked here). Streaming the ends changes no DRAM byte
of a tile; it lets taller tiles fit, and a taller tile reads streamed weights fewer times.
So only heights taller than any found without end chunks are tried, tallest first, each
with the fewest chunks that fit the chip and pass the rules (more chunks only add core
traffic: partial sums read back, the last layer's inputs read again), single-buffered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fuseplan.hardware.chip import Chip
from fuseplan.planner.cost.counters import Counters
from fuseplan.planner.cost.ends import ends_cost, ends_peak_bytes, ends_stream
from fuseplan.planner.cost.model import weight_bytes
from fuseplan.planner.geometry.ends import Ends, EndStream, chunk_options, chunked_ends
from fuseplan.planner.geometry.regions import GroupChains, GroupIO, Tile
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.mode import Mode
from fuseplan.rules.base import GroupFacts, Rule, Violation
from fuseplan.solver.bisect import first_passing
from fuseplan.solver.hidden import chunk_violations, hidden_room

TALLEST = 4  # feasible heights costed per group and residency


@dataclass
class EndSearch:
    """Feasibility and cost of one group's tiles run with end chunks."""

    graph: Graph
    io: GroupIO
    chains: GroupChains
    chip: Chip
    ends: Ends
    peaks: dict[tuple[Tile, bool, int], int] = field(default_factory=dict, repr=False)
    streams: dict[int, EndStream] = field(default_factory=dict, repr=False)
    # what the rules' facts work out for this group whatever the residency and chunks
    memo: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, graph: Graph, io: GroupIO, chains: GroupChains, chip: Chip
           ) -> EndSearch | None:
        """The search of a group whose ends can stream, else None."""
        ends = chunked_ends(graph, io)
        if ends is None or not chunk_options(ends):
            return None
        return cls(graph, io, chains, chip, ends)

    def chunk_options(self) -> list[int]:
        return chunk_options(self.ends)

    def stream(self, chunks: int) -> EndStream:
        """The weights on chip at every step when they stream."""
        if chunks not in self.streams:
            self.streams[chunks] = ends_stream(self.graph, self.io, self.ends, chunks,
                                               self.chip)
        return self.streams[chunks]

    def peak(self, tile: Tile, resident: bool, chunks: int) -> int:
        """Exact SRAM peak (weights included on single-memory chips)."""
        key = (tile, resident, chunks)
        if key not in self.peaks:
            self.peaks[key] = ends_peak_bytes(self.graph, self.io, self.chains, self.ends,
                                              chunks, tile, self.chip, resident)
        return self.peaks[key]

    def weights_on_chip(self, resident: bool, chunks: int) -> int:
        """Weight bytes in the weight memory at once: all when resident, else the most the
        stream holds."""
        return weight_bytes(self.graph, self.io.weights, self.chip) if resident \
            else self.stream(chunks).most

    def physical(self, tile: Tile, resident: bool, chunks: int) -> list[Violation]:
        """The chip's capacities, from the exact peak (as the emulator checks them)."""
        return chunk_violations(self.chip, "end", self.peak(tile, resident, chunks),
                                self.weights_on_chip(resident, chunks), resident)

    def facts(self, tile: Tile, resident: bool, chunks: int) -> GroupFacts:
        """The group's facts with its input and output held as their widest chunks."""
        return GroupFacts(self.graph, self.io, self.chains, tile, self.chip,
                          Mode.of(resident=resident, end_chunks=chunks), ends=self.ends,
                          end_weights=None if resident else self.stream(chunks),
                          memo=self.memo)

    def rule_violations(self, tile: Tile, resident: bool, chunks: int, rules: Iterable[Rule]
                        ) -> list[Violation]:
        facts = self.facts(tile, resident, chunks)
        return [v for r in rules if (v := r.check(facts)) is not None]

    def fewest_chunks(self, tile: Tile, resident: bool, rules: tuple[Rule, ...]) -> int | None:
        """The fewest chunks with which the tile fits and passes the rules (None: no count).
        More chunks hold less at once, so the counts that fit and pass form a range, found
        by bisection from the most."""
        def ok(k: int) -> bool:
            return not self.physical(tile, resident, k) \
                and not self.rule_violations(tile, resident, k, rules)

        return first_passing(self.chunk_options(), ok)

    def cost(self, tile: Tile, resident: bool, chunks: int, work: Counters | None = None
             ) -> Counters:
        """Every counter (``work``: the tile's work counters run whole, when known)."""
        c = ends_cost(self.graph, self.io, self.chains, self.ends, chunks, tile, self.chip,
                      resident, work)
        self.peaks[(tile, resident, chunks)] = c.sram_peak_bytes
        return c

    def room(self, tile: Tile, resident: bool, chunks: int) -> int:
        return hidden_room(self.chip, self.peak(tile, resident, chunks),
                           self.weights_on_chip(resident, chunks))

    def fits_at(self, tile_of: Callable[[int], Tile], resident: bool, chunks: int, th: int
                ) -> bool:
        """The tile th rows tall (`tile_of`: its search's tiles) fits with `chunks` chunks."""
        return not self.physical(tile_of(th), resident, chunks)

    def fewest_at(self, tile_of: Callable[[int], Tile], resident: bool,
                  rules: tuple[Rule, ...], th: int) -> int | None:
        """fewest_chunks of the tile th rows tall (`tile_of`: its search's tiles)."""
        return self.fewest_chunks(tile_of(th), resident, rules)
