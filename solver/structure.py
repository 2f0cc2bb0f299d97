"""Structural keys of candidate groups, so repeated blocks share one tile search.

Deep networks repeat one block dozens of times (ResNet bottlenecks, DenseNet layers,
encoder blocks); a candidate group over one copy has the same best tile and cost as the
same group over any other copy. The key is the group's structure with every name replaced
by its position: each layer's op, attributes, maps and shapes; how its tensors connect;
each tensor's shape, layout and role (read from DRAM, stored, kept on chip, accumulated,
the tile's anchor); the values of non-weight constants (shapes, axes, scales); how many
layers share each weight; and how the blocks of the model meet the group (rules 3 and 12
look at them). Two groups with equal keys are the same problem to the tile search, so
nothing here is an approximation: a key that differed in anything the search reads would
only cost a second search.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from fuseplan.planner.geometry.regions import GroupIO, accumulated_input
from fuseplan.planner.ir.graph import Graph

StructureKey = tuple[Hashable, ...]


def _frozen(value: Any) -> Hashable:
    """A hashable, name-free rendering of an attribute or constant value."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, (bytes, str, int, float, bool)) or value is None:
        return value
    return repr(value)


def structure_key(graph: Graph, io: GroupIO) -> StructureKey:
    """The group's structure with names replaced by positions (see the module docstring)."""
    ids: dict[str, int] = {}

    def local(t: str) -> int:
        return -1 if not t else ids.setdefault(t, len(ids))

    layers = []
    for name in io.layers:
        lay = graph.layer(name)
        layers.append((
            lay.op, lay.op_class, _frozen(lay.attrs), lay.opset,
            tuple(local(t) for t in lay.inputs), tuple(local(t) for t in lay.outputs),
            tuple(local(t) for t in lay.fmap_inputs), tuple(local(t) for t in lay.weights),
            lay.weight_elems, lay.out_shape, lay.macs_per_output, lay.row_maps, lay.col_maps,
            lay.batch_preserving))
    roles: dict[str, list[str]] = {}
    for role, tensors in (("in", io.inputs), ("out", io.outputs), ("kept", io.internal),
                          ("acc", io.accumulated), ("weight", io.weights),
                          ("anchor", (io.anchor,))):
        for t in tensors:
            roles.setdefault(t, []).append(role)
    weight_set = set(io.weights)
    shapes: list[Hashable] = []
    for t in ids:  # in order of first appearance
        shape = graph.shapes.get(t)
        value: Hashable = None
        if t in graph.constants and t not in weight_set:  # shapes, axes, scales, masks
            value = _frozen(graph.constants[t])
        elif t in graph.constants:  # a weight: its values never change a cost
            value = (tuple(graph.constants[t].shape), graph.weight_users.get(t, 0))
        shapes.append((shape, graph.layout(t) if shape is not None else None,
                        tuple(roles.get(t, ())), t in graph.outputs, t in graph.inputs,
                        value))
    return (tuple(layers), tuple(shapes), _blocks(graph, io))


def _blocks(graph: Graph, io: GroupIO) -> Hashable:
    """How each block of the model that the group touches meets it: the positions of its
    layers inside the group, and how many of its layers (and of its non-accumulating
    layers) lie outside."""
    position = {name: i for i, name in enumerate(io.layers)}
    met = []
    for block in graph.blocks:
        inside = tuple(sorted(position[n] for n in block.layers if n in position))
        if not inside:
            continue
        outside = [n for n in block.layers if n not in position]
        folding = sum(accumulated_input(graph, graph.layer(n)) is not None for n in outside)
        met.append((inside, len(outside), len(outside) - folding))
    return tuple(sorted(met))
