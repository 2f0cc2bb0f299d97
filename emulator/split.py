"""A group split over the clusters as the emulator runs it (planner.geometry.cluster_split).

Every cluster runs the same tile: the emulator computes each split layer cluster by
cluster, each from the whole input with its share of the weights sliced out of the arrays
it runs with, and joins the shares; per-channel layers run on the joined map (each channel
from its own channel, so the shares are the same numbers); a replicated layer runs on the
joined maps and its work counts once per cluster. It measures from the slices the
weight bytes the fullest cluster holds, and counts the gathers from the maps themselves:
each gathered map, as made for the tile, crosses C - 1 cluster links. The clock times a
tile by its busiest cluster's work (busiest_elems).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from fuseplan.emulator.boxes import take_range
from fuseplan.emulator.chunks import Compute, run_in_slices
from fuseplan.planner.geometry.cluster_split import ClusterSplit, busiest_shares
from fuseplan.planner.geometry.regions import GroupIO
from fuseplan.planner.ir.chunks import chunk_axes, chunk_ranges
from fuseplan.planner.ir.graph import Graph, Layer


@dataclass(frozen=True)
class SplitRun:
    """The clusters' shares of a split group's weights, and what it gathers."""

    parts: Mapping[str, tuple[Mapping[str, np.ndarray], ...]]  # layer -> each cluster's
    gathered: frozenset[str]
    share: int  # weight bytes the fullest cluster holds
    links: int  # cluster links a gathered map crosses (clusters - 1)
    replicated: frozenset[str] = frozenset()  # layers every cluster runs whole
    # per shared-out layer: (its output's cut axis length, the busiest cluster's part)
    busiest: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: Graph, io: GroupIO, split: ClusterSplit, clusters: int,
           weights: Mapping[str, np.ndarray], dtype_bytes: int) -> SplitRun:
        """Slice each split layer's weights into the clusters' shares."""
        parts: dict[str, tuple[Mapping[str, np.ndarray], ...]] = {}
        held = [0] * clusters
        seen: set[str] = set()
        for name in io.layers:
            lay = graph.layer(name)
            arrays = {w: np.asarray(weights.get(w, graph.constants.get(w)))
                      for w in set(lay.weights) - seen}
            seen |= set(arrays)
            found = chunk_axes(graph, lay) if name in split.split else None
            if found is None:  # every cluster holds them whole
                held = [h + sum(a.size for a in arrays.values()) * dtype_bytes for h in held]
                continue
            channels, axes = found
            shares = tuple({w: take_range(arr, axes[w], lo, hi) for w, arr in arrays.items()
                            if w in axes} for lo, hi in chunk_ranges(channels, clusters))
            parts[name] = shares
            for k, part in enumerate(shares):
                held[k] += sum(part[w].size if w in part else arrays[w].size
                               for w in arrays) * dtype_bytes
        return cls(parts, frozenset(split.gathered), max(held), clusters - 1,
                   frozenset(split.replicated), busiest_shares(graph, io, split, clusters))

    def copies(self, lay: Layer) -> int:
        """How many clusters compute a layer's every output (1: shared out, or per
        channel on each cluster's share)."""
        return self.links + 1 if lay.name in self.replicated else 1

    def busiest_elems(self, lay: Layer, outputs: int) -> int:
        """Of `outputs` elements of a layer made for a tile, those the busiest cluster makes
        (all of a replicated layer's: every cluster makes them)."""
        if lay.name not in self.busiest:
            return outputs
        length, part = self.busiest[lay.name]
        return outputs // length * part

    def run(self, lay: Layer, weights: Mapping[str, np.ndarray], compute: Compute
            ) -> list[np.ndarray]:
        """The layer's outputs: a split layer's cluster by cluster, joined."""
        return run_in_slices(lay, weights, compute, self.parts.get(lay.name, ()))

    def link_bytes(self, lay: Layer, outputs: list[np.ndarray], dtype_bytes: int) -> int:
        """Bytes the gather of a layer's output moves over the cluster links (0: none)."""
        if lay.outputs[0] not in self.gathered:
            return 0
        return self.links * outputs[0].size * dtype_bytes
