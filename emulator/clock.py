"""The emulator's clock: an event simulation of each group as its tiles run.

The emulator records, per tile, what it actually moved and computed (TileEvents); this
module plays those events on the modeled chip and returns when every group starts and
ends. It shares nothing with the planner's cost model (planner.cost), so comparing its
cycles with the predicted ones tests the closed form rather than restating it.

Resources and rules, per group:

* **the DRAM link** is one resource: a transfer of b bytes holds it for b / (DRAM bytes
  per cycle) cycles (exact fractions); ready transfers are served one at a time, the one
  ready first first (stores before loads on a tie), never interrupted;
* **the cores** compute a tile in ceil(MACs / (cores x MACs per cycle)) + ceil(vector ops /
  (cores x vector lanes)) whole cycles, one tile at a time; a banded group's bands each run
  on their own cores (cores / bands of them), all at once, sharing the link; a cluster
  split's clusters compute side by side, so its tile takes its busiest cluster's work on
  that cluster's cores (cores / clusters of them), and its gathers cross every cluster's
  link at once while they compute: the tile takes the longer of the two;
* **buffers**: without double buffering a tile loads, computes and stores before the next
  tile loads. With it the input buffers are a queue of depth 2: tile i+1's load may start
  once tile i's load is done and tile i-1's compute has freed its buffer; tile i computes
  once its load is done and the cores are free; its store follows its compute. A tile
  that loads nothing (a halo-reusing tile whose inputs earlier tiles brought) takes no
  buffer: it computes from the buffer of the last tile that loaded, so a load waits for
  every tile before that one to have computed;
* **weights** ride with the tile that first needs them (all of them with the first tile
  when resident, with the first tile of every round of tiles when streamed: the round's
  other tiles, on the other clusters, receive the same broadcast); in a banded group each
  step's weights are one broadcast transfer that every band's tile of that step waits for;
* **layer by layer**: the one tile of a group of one tile brings its maps, then each
  layer's chunks of weights in layer order; a chunk's share of its layer computes, in whole
  cycles, once that chunk is in and the cores are free; a streamed chunk loads only once
  the chunk two before it has computed (its buffer: the double-buffered pair), or, in a
  ring, as the chunks before it that have not computed leave the ring room (the link waits
  when it is full);
* **next-group prefetch**: a group marked ``prefetch`` loads its first weights in the idle
  gaps of the DRAM link during the group before it (lowest priority: it never delays that
  group's own transfers), no more than its first tile does not hide behind its own compute
  anyway; what does not fit in those gaps loads with its first tile.

Groups run back to back on whole cycles: a group starts on the cycle its predecessor ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, floor

from fuseplan.hardware.chip import Chip


@dataclass(frozen=True)
class LayerEvents:
    """One layer of a tile played layer by layer: the chunks of weights that arrived for it,
    in order, each with its share of the layer's work, and the work it did."""

    chunks: tuple[tuple[int, Fraction], ...]
    macs: int
    array_macs: int
    vector_ops: int


@dataclass(frozen=True)
class TileEvents:
    """What one tile did, as the emulator counted it while running it."""

    load_bytes: int  # feature-map bytes loaded from DRAM (halo included)
    weight_bytes: int  # weight bytes loaded from DRAM for this tile
    macs: int
    vector_ops: int
    store_bytes: int  # bytes stored to DRAM
    array_macs: int = 0  # MACs its array passes occupied (planner.ir.array; 0: no array)
    # its layers in order, when its weights arrive layer by layer after its maps and each
    # layer computes once its own are in (the tile that loads a group's weights); else ()
    layers: tuple[LayerEvents, ...] = ()
    ahead: int = 0  # chunks of weights on chip at once (streamed: 2, the pair); 0: any
    room: int = 0  # instead, bytes of weights on chip at once (a streamed group's ring)
    link_bytes: int = 0  # bytes its gathers moved between clusters (a cluster split's)
    # a cluster split's busiest cluster: (MACs, array MACs, vector ops); its cores time the
    # tile (the clusters compute side by side, as long as the busiest does)
    busiest: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class GroupRun:
    """One group's tiles in execution order, per band (one band unless the group is banded)."""

    bands: tuple[tuple[TileEvents, ...], ...]
    double_buffered: bool
    prefetch: bool = False  # its first weights load during the group before it


@dataclass(frozen=True)
class ClockChip:
    """The chip constants the clock needs."""

    bytes_per_cycle: Fraction  # DRAM link
    cores: int
    macs_per_cycle: int  # per core
    vector_lanes: int  # per core
    array: bool = False  # the matrix unit is an array: its time is counted in array MACs
    link_bytes_per_cycle: Fraction = Fraction(1)  # every cluster's link at once
    clusters: int = 1

    @classmethod
    def of(cls, chip: Chip) -> ClockChip:
        """The timing constants of a chip (bandwidth in GB/s over clock in GHz, exact)."""
        bpc = Fraction(str(chip.dram.bandwidth_gbps)) / Fraction(str(chip.clock_ghz))
        return cls(bpc, chip.cores, chip.core.macs_per_cycle, chip.core.vector_lanes,
                   chip.core.array is not None, chip.links_bytes_per_cycle, chip.clusters)

    def compute(self, tile: TileEvents, cores: int) -> int:
        """Whole cycles `cores` cores spend on one tile's MACs and vector operations, or
        its gathers take the cluster links, if longer (they run while the cores compute)."""
        matrix, vector = (tile.array_macs if self.array else tile.macs), tile.vector_ops
        if tile.busiest is not None:  # one cluster's cores, on the busiest one's work
            macs, array, vector = tile.busiest
            matrix, cores = (array if self.array else macs), cores // self.clusters
        core = (ceil(matrix / (cores * self.macs_per_cycle))
                + ceil(vector / (cores * self.vector_lanes)))
        return max(core, ceil(tile.link_bytes / self.link_bytes_per_cycle))

    def layer_compute(self, layer: LayerEvents, cores: int) -> Fraction:
        """Exact cycles `cores` cores spend on one layer of a tile played layer by layer."""
        matrix = layer.array_macs if self.array else layer.macs
        return (Fraction(matrix, cores * self.macs_per_cycle)
                + Fraction(layer.vector_ops, cores * self.vector_lanes))

    def layered_end(self, tile: TileEvents, cores: int, begin: Fraction, free: Fraction,
                    preloaded: Fraction = Fraction(0)) -> Fraction:
        """When a tile played layer by layer ends computing: its transfer began at `begin`
        with its maps, then each layer's chunks of weights in order (less `preloaded` bytes
        at their front, prefetched; a chunk waits for the one `tile.ahead` before it to have
        computed, its buffer); a chunk's share of its layer computes once the chunk is in
        and the cores are done with what came before (free from `free` on)."""
        link = begin + tile.load_bytes / self.bytes_per_cycle
        end, skip = max(free, link), preloaded
        done: list[Fraction] = []
        ring: deque[tuple[int, Fraction]] = deque()  # chunks in the ring: (bytes, compute end)
        for layer in tile.layers:
            work = self.layer_compute(layer, cores)
            for size, share in layer.chunks or ((0, Fraction(1)),):
                if size:
                    k = len(done)
                    if tile.ahead and k >= tile.ahead:
                        link = max(link, done[k - tile.ahead])
                    if tile.room:  # the link fills the ring's free room, or waits for it
                        link = self._through_ring(link, size, tile.room, ring)
                    else:
                        took = min(skip, Fraction(size))
                        skip -= took
                        link += (size - took) / self.bytes_per_cycle
                    end = max(end, link)
                end += ceil(work * share)  # the cores work in whole cycles
                if size:
                    done.append(end)
                    if tile.room:
                        ring[-1] = (size, end)
        return end

    def _through_ring(self, link: Fraction, size: int, room: int,
                      ring: deque[tuple[int, Fraction]]) -> Fraction:
        """When a chunk of `size` bytes has all arrived through a ring of `room` bytes that
        holds `ring` (bytes, compute end; the chunk is added, its end to come), the link
        free from `link` on: it moves bytes while the ring has room and waits for the
        oldest chunk's compute to end when it has none."""
        left, held = size, sum(b for b, _ in ring)
        ring.append((0, Fraction(-1)))
        while left:
            while ring[0][1] != -1 and ring[0][1] <= link:
                held -= ring.popleft()[0]
            if held >= room:
                link = ring[0][1]
                continue
            part: int = min(left, room - held)
            link += part / self.bytes_per_cycle
            left, held = left - part, held + part
            ring[-1] = (ring[-1][0] + part, Fraction(-1))
        return link

    def hidden_by_layers(self, tile: TileEvents, cores: int) -> int:
        """Whole cycles of a tile's compute that its layer-by-layer weights hide behind its
        own transfer (0 for a tile not played layer by layer): what a prefetch of its
        weights could not hide again."""
        if not tile.layers:
            return 0
        loads = (tile.load_bytes + tile.weight_bytes) / self.bytes_per_cycle
        work = sum(ceil(self.layer_compute(x, cores) * share) for x in tile.layers
                   for _, share in x.chunks or ((0, Fraction(1)),))
        return floor(loads + work - self.layered_end(tile, cores, Fraction(0), Fraction(0)))


@dataclass(frozen=True)
class GroupTime:
    """When a group ran, in cycles of the whole plan."""

    start: int
    end: int
    prefetch_start: int  # the cycle its prefetched weights began loading (start if none)
    prefetch_cycles: Fraction  # link cycles its prefetched weights took in the group before it
    dram_busy: Fraction  # link cycles of its own transfers, the prefetched ones included
    compute_busy: int  # cycles the busiest band's cores computed
    busy: tuple[tuple[Fraction, Fraction], ...]  # the link's busy intervals within the group

    @property
    def cycles(self) -> int:
        return self.end - self.start

    def idle_gaps(self) -> list[tuple[Fraction, Fraction]]:
        """Intervals within the group's span in which the DRAM link moves nothing."""
        gaps, t = [], Fraction(self.start)
        for begin, end in self.busy:
            if begin > t:
                gaps.append((t, begin))
            t = max(t, end)
        if self.end > t:
            gaps.append((t, Fraction(self.end)))
        return gaps


@dataclass(frozen=True)
class GroupTrace:
    """One group played on the chip: when its last event ends, when the link was busy, and
    the cycles its busiest band's cores computed (exact fractions of a cycle)."""

    end: Fraction
    busy: tuple[tuple[Fraction, Fraction], ...]
    compute_busy: int


def simulate_plan(chip: Chip, runs: Sequence[GroupRun]) -> list[GroupTime]:
    """Start and end cycle of every group of a plan, run back to back from cycle 0."""
    timing = ClockChip.of(chip)
    times: list[GroupTime] = []
    clock = 0
    for run in runs:
        prefetched, prefetch_start = Fraction(0), clock
        if run.prefetch and times:
            # its first tile hides part of its weights' load behind its compute anyway:
            # the prefetch takes no more than the rest
            first = run.bands[0][0] if run.bands and run.bands[0] else None
            hidden = timing.hidden_by_layers(first, timing.cores) if first else 0
            wanted = max(Fraction(0), _step_weights(run.bands, 0) / timing.bytes_per_cycle
                         - hidden)
            prefetched, first_gap = _prefetch(times[-1], wanted)
            prefetch_start = floor(first_gap) if first_gap is not None else clock
        trace = simulate_group(timing, run, Fraction(clock), prefetched * timing.bytes_per_cycle)
        end = max(clock, ceil(trace.end))
        own = sum((b - a for a, b in trace.busy), Fraction(0))
        times.append(GroupTime(clock, end, prefetch_start, prefetched, own + prefetched,
                               trace.compute_busy, trace.busy))
        clock = end
    return times


def _prefetch(prev: GroupTime, wanted: Fraction) -> tuple[Fraction, Fraction | None]:
    """(link cycles of weights loaded in the previous group's idle gaps, start of the first
    gap used): the gaps are filled from the earliest on."""
    taken, first = Fraction(0), None
    for begin, end in prev.idle_gaps():
        if taken >= wanted:
            break
        first = begin if first is None else first
        taken += min(end - begin, wanted - taken)
    return taken, first


def _last_loaders(loads: Sequence[Fraction | int]) -> list[int]:
    """For each tile, the last tile before it whose load moves any byte (-1: none)."""
    out, last = [], -1
    for s, size in enumerate(loads):
        out.append(last)
        if size:
            last = s
    return out


def _step_weights(bands: Sequence[Sequence[TileEvents]], step: int) -> int:
    """Weight bytes loaded at one step: one broadcast transfer for all bands."""
    return max((b[step].weight_bytes for b in bands if step < len(b)), default=0)


def simulate_group(timing: ClockChip, run: GroupRun, start: Fraction = Fraction(0),
                   preloaded_weight_bytes: Fraction = Fraction(0)) -> GroupTrace:
    """Play one group's tiles on the link and the cores from cycle `start`.

    ``preloaded_weight_bytes`` of the first step's weights are already on chip (prefetched).
    """
    bands = run.bands or ((),)
    steps = max(len(b) for b in bands)
    if steps == 0:  # a group that ran no tile (an empty table of boxes) takes no time
        return GroupTrace(start, (), 0)
    play = _Playback(timing, run, bands, steps, start, preloaded_weight_bytes)
    while play.pending():
        play.serve_next()
    return play.trace()


class _Playback:
    """One group's tiles being played: when each band's loads, computes and stores end, and
    when the DRAM link is busy."""

    def __init__(self, timing: ClockChip, run: GroupRun,
                 bands: Sequence[Sequence[TileEvents]], steps: int, start: Fraction,
                 preloaded_weight_bytes: Fraction) -> None:
        self.timing, self.bands, self.start = timing, bands, start
        self.double_buffered = run.double_buffered
        cores = timing.cores // len(bands)
        # the band whose tile carries each step's weights: the first band that has that step
        self.carrier = [min(b for b in range(len(bands)) if s < len(bands[b]))
                        for s in range(steps)]
        self.weights = [Fraction(_step_weights(bands, s)) for s in range(steps)]
        self.weights[0] = max(Fraction(0), self.weights[0] - preloaded_weight_bytes)
        self.work = [[timing.compute(t, cores) for t in b] for b in bands]
        # before each tile, the last tile of its band that loaded anything (-1: none)
        self.last_loader = [_last_loaders([t.load_bytes + (self.weights[s] if self.carrier[s] == b
                                                           else 0) for s, t in enumerate(band)])
                            for b, band in enumerate(bands)]
        self.preloaded = preloaded_weight_bytes
        self.load_begin: list[list[Fraction]] = [[] for _ in bands]
        self.load_end: list[list[Fraction]] = [[] for _ in bands]
        self.comp_end: list[list[Fraction]] = [[] for _ in bands]
        self.store_end: list[list[Fraction]] = [[] for _ in bands]
        self.busy: list[tuple[Fraction, Fraction]] = []
        self.link = start

    def pending(self) -> bool:
        """Whether some band has a tile not stored yet."""
        return any(len(e) < len(b) for e, b in zip(self.store_end, self.bands, strict=True))

    def load_ready(self, b: int) -> Fraction | None:
        """When band b's next load may start (None: not before something else ends)."""
        load_end, comp_end, store_end = self.load_end[b], self.comp_end[b], self.store_end[b]
        s = len(load_end)
        if s == 0:
            return self.start
        if not self.double_buffered:  # one buffer: the previous tile is stored first
            return store_end[s - 1] if len(store_end) >= s else None
        # the other buffer is the last loading tile's: the tiles before it must be done
        p = self.last_loader[b][s]
        if p >= 1 and len(comp_end) < p:
            return None
        return max(load_end[s - 1], comp_end[p - 1] if p >= 1 else self.start)

    def advance_compute(self) -> None:
        """Compute every loaded tile whose step's weights have arrived."""
        load_end, carrier = self.load_end, self.carrier
        for b, ends in enumerate(self.comp_end):
            while len(ends) < len(load_end[b]):
                s = len(ends)
                ready = load_end[b][s]
                if carrier[s] != b:  # the step's broadcast weights arrive with another band
                    if len(load_end[carrier[s]]) <= s:
                        break
                    ready = max(ready, load_end[carrier[s]][s])
                free = ends[-1] if ends else self.start
                tile = self.bands[b][s]
                if tile.layers and carrier[s] == b:  # its layers compute as weights arrive
                    ends.append(self.timing.layered_end(
                        tile, self.timing.cores // len(self.bands), self.load_begin[b][s],
                        free, self.preloaded if s == 0 else Fraction(0)))
                else:
                    ends.append(max(ready, free) + self.work[b][s])

    def next_transfer(self) -> tuple[Fraction, int, int]:
        """(ready, kind: 0 store / 1 load, band) of the transfer served next: the earliest
        ready (stores first on a tie), by band."""
        best: tuple[Fraction, int, int] | None = None
        for b, tiles in enumerate(self.bands):
            if len(self.store_end[b]) < len(self.comp_end[b]):
                cand = (self.comp_end[b][len(self.store_end[b])], 0, b)
                best = cand if best is None or cand < best else best
            if len(self.load_end[b]) < len(tiles) and (ready := self.load_ready(b)) is not None:
                cand = (ready, 1, b)
                best = cand if best is None or cand < best else best
        if best is None:
            raise RuntimeError("clock deadlock: no transfer can start")  # a bug, not input
        return best

    def serve_next(self) -> None:
        """Move the next transfer over the link, then compute what it made ready."""
        ready, kind, b = self.next_transfer()
        if kind == 0:
            s = len(self.store_end[b])
            size = Fraction(self.bands[b][s].store_bytes)
        else:
            s = len(self.load_end[b])
            size = self.bands[b][s].load_bytes \
                + (self.weights[s] if self.carrier[s] == b else Fraction(0))
        begin = max(ready, self.link)
        self.link = begin + size / self.timing.bytes_per_cycle
        if self.link > begin:
            self.busy.append((begin, self.link))
        if kind == 1:
            self.load_begin[b].append(begin)
        (self.store_end if kind == 0 else self.load_end)[b].append(self.link)
        self.advance_compute()

    def trace(self) -> GroupTrace:
        """When the last event ends, the link's busy intervals, the busiest band's compute."""
        end = max([self.start] + [e[-1] for e in self.store_end if e]
                  + [e[-1] for e in self.comp_end if e])
        return GroupTrace(end, tuple(self.busy), max(sum(w) for w in self.work))
