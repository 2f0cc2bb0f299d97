"""Checks a list of groups must pass to be a plan of a graph, wherever it came from."""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil

import networkx as nx

from fuseplan.hardware.chip import Chip
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.geometry.attention import online_attention
from fuseplan.planner.geometry.bands import bands_problem
from fuseplan.planner.geometry.regions import Tile, anchor_extent, backward_range, group_io
from fuseplan.planner.ir.graph import Graph
from fuseplan.planner.plan.data import Mode


def group_mode(graph: Graph, layers: Sequence[str], tile: Tile) -> Mode:
    """Small-map mode when the tile holds whole feature maps (only the batch is split)."""
    _, h, w = anchor_extent(graph, group_io(graph, layers))
    return "small" if tile.h >= h and tile.w >= w else "big"


def check_reuse_tile(graph: Graph, layers: Sequence[str], tile: Tile, source: str) -> None:
    """Halo reuse runs the tiles of each batch part in order; bands split the columns of
    tiles that span the whole batch."""
    io = group_io(graph, layers)
    n, _, _ = anchor_extent(graph, io)
    attention = online_attention(graph, io)
    if attention is not None and attention.streamed:
        raise InputError(f"{source}: group starting at '{layers[0]}' reuses halos, but it "
                         "holds a fused attention layer whose keys and values it loads, and "
                         "its tiles stream them afresh (nothing carries to the next tile; "
                         "keys the group makes itself are kept). Use \"halo\": "
                         "\"recompute\".")
    backward = backward_range(graph, io, tile)
    if backward is not None:
        t, axis, index = backward
        along = "rows" if axis == 1 else "columns"
        raise InputError(f"{source}: group starting at '{layers[0]}' reuses halos with tile "
                         f"{tile.n}x{tile.h}x{tile.w}, but tile {index} along {along} needs a "
                         f"range of '{t}' that starts or ends before the tile before it "
                         "(a cyclic shift wraps the map's last rows onto its first): "
                         "reusing tiles keep only what lies ahead. Use \"halo\": "
                         "\"recompute\".")
    if tile.n < n and tile.bands > 1:
        raise InputError(f"{source}: group starting at '{layers[0]}' reuses halos in "
                         f"{tile.bands} bands with tile {tile.n}x{tile.h}x{tile.w}; bands "
                         f"need tiles over the whole batch ({n} images). Use \"bands\": 1 "
                         "or tiles of the whole batch.")


def check_bands(graph: Graph, layers: Sequence[str], tile: Tile, chip: Chip, halo_reuse: bool,
                source: str) -> None:
    """Bands split halo-reusing tiles among the chip's cores (planner.geometry.bands)."""
    if tile.bands == 1:
        return
    columns = ceil(anchor_extent(graph, group_io(graph, layers))[2] / tile.w)
    problem = ("bands need halo reuse" if not halo_reuse
               else bands_problem(chip, tile.bands, columns))
    if problem:
        raise InputError(f"{source}: group starting at '{layers[0]}' runs in {tile.bands} "
                         f"bands on chip {chip.name}, but {problem}. Use \"bands\": 1 or "
                         "solve again for this chip.")


def whole_tile(graph: Graph, layers: Sequence[str]) -> Tile:
    """The tile covering the whole anchor (one tile)."""
    n, h, w = anchor_extent(graph, group_io(graph, layers))
    return Tile(n, h, w)


def execution_order(graph: Graph, groups: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Groups sorted so every group runs after the groups producing its inputs."""

    owner = {name: i for i, g in enumerate(groups) for name in g}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    for a, b in graph.dag.edges:
        if owner[a] != owner[b]:
            dag.add_edge(owner[a], owner[b])
    if not nx.is_directed_acyclic_graph(dag):
        raise InputError("the plan's groups depend on each other in a cycle: a group must be "
                         "convex (no path leaves it and comes back).")
    first = {i: min(graph.index(n) for n in g) for i, g in enumerate(groups)}
    order = nx.lexicographical_topological_sort(dag, key=first.__getitem__)
    return [tuple(groups[i]) for i in order]


def check_order(graph: Graph, groups: Sequence[Sequence[str]], source: str) -> None:
    """Groups run in the order given: each must find its inputs already in DRAM."""
    ready = set(graph.inputs)
    for i, layers in enumerate(groups):
        io = group_io(graph, layers)
        missing = [t for t in io.inputs if t not in ready]
        if missing:
            raise InputError(f"{source}: group {i} (starting at '{layers[0]}') reads "
                             f"'{missing[0]}' before any earlier group writes it; list the "
                             "groups in execution order.")
        ready.update(t for name in io.layers for t in graph.layer(name).outputs)


def check_cover(graph: Graph, groups: Sequence[Sequence[str]], source: str) -> None:
    """Every layer of the model in exactly one group, and no unknown layer."""
    seen: dict[str, int] = {}
    known = {lay.name for lay in graph.layers}
    for i, g in enumerate(groups):
        for name in g:
            if name not in known:
                raise InputError(f"{source}: group {i} names layer '{name}', which the model does "
                                 "not have. Was the plan made for another model?")
            if name in seen:
                raise InputError(f"{source}: layer '{name}' is in group {seen[name]} and group "
                                 f"{i}; each layer must be in exactly one group.")
            seen[name] = i
    missing = [n for n in known if n not in seen]
    if missing:
        raise InputError(f"{source}: layer '{missing[0]}' (and {len(missing) - 1} more) is in no "
                         "group; a plan must cover every layer exactly once.")
