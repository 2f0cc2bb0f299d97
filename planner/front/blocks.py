"""Block detection: single-entry/single-exit subgraphs with internal branches.

A block starts where a feature map forks (a layer, or a graph input, whose
output feeds two or more layers) and ends at the fork's immediate
post-dominator, the layer where all branches join again (a ResNet bottleneck's
Sum, an Inception module's Concat). The fork must dominate the join, and no
edge may enter the block from outside, so the block has exactly one input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import networkx as nx

from fuseplan.planner.ir.graph import Block, Layer

_SOURCE = "\0source"
_SINK = "\0sink"


def find_blocks(dag: nx.DiGraph, layers: Sequence[Layer], inputs: Sequence[str],
                outputs: Sequence[str], producer: Mapping[str, str]) -> tuple[Block, ...]:
    """All blocks of the layer DAG, ordered by their exit layer's position."""
    g = dag.copy()
    g.add_node(_SOURCE)
    g.add_node(_SINK)
    for lay in layers:
        for t in lay.fmap_inputs:
            if t in inputs:
                g.add_edge(_SOURCE, lay.name)
        if g.out_degree(lay.name) == 0:
            g.add_edge(lay.name, _SINK)
    for t in outputs:
        if t in producer:
            g.add_edge(producer[t], _SINK)
    idom = nx.immediate_dominators(g, _SOURCE)
    ipdom = nx.immediate_dominators(g.reverse(copy=False), _SINK)
    position = {lay.name: i for i, lay in enumerate(layers)}
    blocks: list[Block] = []
    seen: set[tuple[str, str]] = set()
    forks = [n for n in g.nodes if n != _SINK and _fork_width(g, n) >= 2]
    for fork in forks:
        join = ipdom.get(fork)
        if join is None or join in (_SINK, _SOURCE) or (fork, join) in seen:
            continue
        if not _dominates(idom, fork, join):
            continue
        inside = (nx.descendants(g, fork) & nx.ancestors(g, join)) | {join}
        if any(p not in inside and p != fork for n in inside for p in g.predecessors(n)):
            continue
        seen.add((fork, join))
        members = tuple(sorted(inside, key=position.__getitem__))
        blocks.append(Block(id=0, entry="" if fork == _SOURCE else fork, exit=join, layers=members))
    blocks.sort(key=lambda b: (position[b.exit], -len(b.layers)))
    return tuple(
        Block(id=i, entry=b.entry, exit=b.exit, layers=b.layers) for i, b in enumerate(blocks)
    )


def _fork_width(g: nx.DiGraph, node: str) -> int:
    return sum(1 for s in g.successors(node) if s != _SINK)


def _dominates(idom: Mapping[str, str], a: str, b: str) -> bool:
    node = b
    while True:
        if node == a:
            return True
        parent = idom.get(node)
        if parent is None or parent == node:
            return False
        node = parent
