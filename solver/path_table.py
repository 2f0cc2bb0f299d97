"""The bounded path's live edges as arrays: its shortest paths in NumPy.

A deep chain has an edge for every whole-map group of every start, hundreds of thousands of
them, and the bounded path (solver.bounded_path) asks for the cheapest path over them every
round, and for the distances from both ends wherever it ranks runners-up or tells how many
candidates their floors rule out. A walk over so many edges in Python took most of a long
chain's solve (a 600-block conv chain: 0.7 s a round, 67 rounds); here each position's
edges are one slice of arrays sorted by end (or by start), and a round refreshes only the
edges it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np


class _Edge(Protocol):
    """What the table reads of an edge (solver.bounded_path.Edge)."""

    start: int
    end: int
    searched: bool


Edge = TypeVar("Edge", bound=_Edge)

# a cost no path reaches: positions not reachable. Weights and path lengths stay far under
# it so that no sum of weights along a path overflows (PathTable.of refuses larger ones)
_UNREACHED = np.int64(1) << 62
_LARGEST_WEIGHT = 1 << 40
_LONGEST = 1 << 20


class PathTable(Generic[Edge]):
    """The live edges' positions, weights (searched cost or floor) and whether searched, in
    the order given (ties go to the first edge in it, as the Python walk's do)."""

    def __init__(self, edges: Sequence[Edge], end: int, weight: Callable[[Edge], int]) -> None:
        self.edges = list(edges)
        self.end = end
        self.weight_of = weight
        self.at = {id(e): k for k, e in enumerate(self.edges)}
        n = len(self.edges)
        self.start = np.fromiter((e.start for e in self.edges), np.int64, n)
        self.stop = np.fromiter((e.end for e in self.edges), np.int64, n)
        self.weight = np.fromiter((weight(e) for e in self.edges), np.int64, n)
        self.unsearched = np.fromiter((not e.searched for e in self.edges), np.int64, n)
        self.alive = np.ones(n, dtype=bool)
        # stable sorts keep the order given within one position
        self.by_end = np.argsort(self.stop, kind="stable")
        self.end_at = np.searchsorted(self.stop[self.by_end], np.arange(end + 2))
        self.by_start = np.argsort(self.start, kind="stable")
        self.start_at = np.searchsorted(self.start[self.by_start], np.arange(end + 2))

    @classmethod
    def of(cls, edges: Sequence[Edge], end: int, weight: Callable[[Edge], int]
           ) -> PathTable[Edge] | None:
        """The table, or None where a weight is too large for int64 sums (the caller walks
        the edges in Python then)."""
        if end > _LONGEST:
            return None
        table = cls(edges, end, weight)
        if table.weight.size and int(table.weight.max()) > _LARGEST_WEIGHT:
            return None
        return table

    def refresh(self, edges: Iterable[Edge]) -> bool:
        """Take these edges' weights and searched flags again; False where a weight grew too
        large (then the table is no longer to be used)."""
        for e in edges:
            k = self.at.get(id(e))
            if k is None:
                continue
            w = self.weight_of(e)
            if w > _LARGEST_WEIGHT:
                return False
            self.weight[k], self.unsearched[k] = w, not e.searched
        return True

    def refresh_all(self) -> bool:
        """Every live edge's weight and flag again (after the floors were all changed)."""
        return self.refresh(self.live())

    def drop(self, ids: Iterable[int]) -> None:
        """These edges (by id) are no longer live."""
        for i in ids:
            k = self.at.get(i)
            if k is not None:
                self.alive[k] = False

    def live(self) -> list[Edge]:
        """The live edges, in the order given."""
        return [self.edges[k] for k in np.flatnonzero(self.alive)]

    def _forward(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position, the cheapest cost from position 0 over the edges in `mask` (a cost
        no path reaches where none does) and the edge a cheapest path arrives by (-1: none);
        ties: the fewest unsearched edges, then the first edge in the order given."""
        best = np.full(self.end + 1, _UNREACHED, dtype=np.int64)
        unknown = np.zeros(self.end + 1, dtype=np.int64)
        came = np.full(self.end + 1, -1, dtype=np.int64)
        best[0] = 0
        for j in range(1, self.end + 1):
            idx = self.by_end[self.end_at[j]:self.end_at[j + 1]]
            idx = idx[mask[idx]]
            if not idx.size:
                continue
            s = self.start[idx]
            reach = best[s] < _UNREACHED
            if not reach.any():
                continue
            idx, s = idx[reach], s[reach]
            cost = best[s] + self.weight[idx]
            low = cost.min()
            tied = cost == low
            unk = unknown[s] + self.unsearched[idx]
            k = int(np.flatnonzero(tied & (unk == unk[tied].min()))[0])
            best[j], unknown[j], came[j] = low, unk[k], idx[k]
        return best, came

    def cheapest(self, among: np.ndarray | None = None) -> list[Edge] | None:
        """The cheapest path 0 -> end over the live edges (and `among`, a mask, where given);
        ties: the fewest unsearched edges, then the first edge in the order given."""
        best, came = self._forward(self.alive if among is None else self.alive & among)
        if best[self.end] >= _UNREACHED:
            return None
        path: list[Edge] = []
        at = self.end
        while at:
            e = self.edges[int(came[at])]
            path.append(e)
            at = e.start
        return path[::-1]

    def searched_mask(self) -> np.ndarray:
        """The searched edges, as a mask."""
        return self.unsearched == 0

    def distances(self, forward: bool) -> np.ndarray:
        """The cheapest cost from position 0 to each position (forward), or from each to the
        end; unreachable positions at a cost no path reaches."""
        if forward:
            return self._forward(self.alive)[0]
        dist = np.full(self.end + 1, _UNREACHED, dtype=np.int64)
        dist[self.end] = 0
        for i in range(self.end - 1, -1, -1):
            idx = self.by_start[self.start_at[i]:self.start_at[i + 1]]
            idx = idx[self.alive[idx]]
            if idx.size:
                dist[i] = min(int(_UNREACHED), int((dist[self.stop[idx]]
                                                    + self.weight[idx]).min()))
        return dist

    def through(self) -> np.ndarray:
        """Per edge: the cheapest path through it (cost to its start, its weight, cost from
        its end), a cost no path reaches where it is not live or lies on no path."""
        ahead, behind = self.distances(True), self.distances(False)
        total = ahead[self.start] + self.weight + behind[self.stop]
        unreached = (ahead[self.start] >= _UNREACHED) | (behind[self.stop] >= _UNREACHED) \
            | ~self.alive
        return np.where(unreached, _UNREACHED, total)

    def runners_up(self, taken: Iterable[Edge], limit: int) -> list[Edge]:
        """Up to `limit` unsearched live edges not taken, cheapest path through each first
        (ties: the first in the order given)."""
        through = self.through()
        ok = (through < _UNREACHED) & (self.unsearched == 1)
        for e in taken:
            k = self.at.get(id(e))
            if k is not None:
                ok[k] = False
        idx = np.flatnonzero(ok)
        order = idx[np.argsort(through[idx], kind="stable")][:limit]
        return [self.edges[int(k)] for k in order]

    def ruled_out(self, best: int) -> int:
        """Unsearched live edges whose cheapest path through costs no less than `best`."""
        through = self.through()
        return int(((through < _UNREACHED) & (self.unsearched == 1)
                    & (through >= best)).sum())
