"""Export a plan with the model: an annotated ONNX file for Netron and a Graphviz dot file.

``export_onnx`` writes the cleaned model (what the planner planned: constants folded, every
node named, static shapes) with each node's group id, tile and predicted DRAM bytes in its
``metadata_props`` (keys ``fuseplan.*``) and in its ``doc_string``; Netron shows both in the
node's properties. ``export_dot`` writes the layer graph with one cluster per fused group.
"""

from __future__ import annotations

import colorsys
from collections.abc import Mapping
from pathlib import Path

import onnx

from fuseplan.planner.app.api import Problem
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import write_atomic, write_with
from fuseplan.planner.front.fills import materialized
from fuseplan.planner.plan.data import Group, Plan
from fuseplan.planner.ui.report import group_colours

METADATA_PREFIX = "fuseplan."


def tile_text(group: Group) -> str:
    """A group's tile as ``"n x h x w"``."""
    return f"{group.tile.n} x {group.tile.h} x {group.tile.w}"


def node_metadata(group: Group) -> dict[str, str]:
    """The ``metadata_props`` every node of ``group`` carries."""
    p = group.predicted
    return {
        f"{METADATA_PREFIX}group": str(group.id),
        f"{METADATA_PREFIX}group_layers": str(len(group.layers)),
        f"{METADATA_PREFIX}fused": "true" if group.fused else "false",
        f"{METADATA_PREFIX}tile": tile_text(group),
        f"{METADATA_PREFIX}mode": group.mode,
        f"{METADATA_PREFIX}weights": "resident" if group.weights_resident else "streamed",
        f"{METADATA_PREFIX}predicted_dram_bytes": str(p.dram_bytes),
        f"{METADATA_PREFIX}predicted_redundant_read_bytes": str(p.redundant_read_bytes),
        f"{METADATA_PREFIX}predicted_sram_peak_bytes": str(p.sram_peak_bytes),
        f"{METADATA_PREFIX}predicted_cycles": str(p.cycles),
        **({f"{METADATA_PREFIX}passes": str(group.placement.passes),
            f"{METADATA_PREFIX}inputs_held": str(group.placement.inputs_held).lower(),
            f"{METADATA_PREFIX}maps_held": str(group.placement.maps_held).lower()}
           if group.placement.passes > 1 else {}),
        **({f"{METADATA_PREFIX}hidden_chunks": str(group.placement.hidden_chunks)}
           if group.placement.hidden_chunks > 1 else {}),
        **({f"{METADATA_PREFIX}inputs_reloaded": "true"}
           if group.placement.inputs_reloaded else {}),
        **({f"{METADATA_PREFIX}end_chunks": str(group.placement.end_chunks)}
           if group.placement.end_chunks > 1 else {}),
        **({f"{METADATA_PREFIX}cluster_split": "true"} if group.placement.cluster_split else {}),
    }


def node_doc(group: Group) -> str:
    """The one-line doc string added to every node of ``group``."""
    kind = f"fused, {len(group.layers)} layers" if group.fused else "alone"
    return (f"fuseplan group {group.id} ({kind}): tile {tile_text(group)}, {group.mode} mode, "
            f"predicted DRAM {group.predicted.dram_bytes} B")


def _set_props(entries: onnx.NodeProto | onnx.ModelProto, props: Mapping[str, str]) -> None:
    """Replace the fuseplan.* entries of a metadata_props list, keeping the others."""
    kept = [(e.key, e.value) for e in entries.metadata_props
            if not e.key.startswith(METADATA_PREFIX)]
    del entries.metadata_props[:]
    for key, value in [*kept, *props.items()]:
        entries.metadata_props.add(key=key, value=value)


def model_metadata(plan: Plan) -> dict[str, str]:
    """Plan-wide facts stored in the model's ``metadata_props``."""
    t = plan.totals
    return {
        f"{METADATA_PREFIX}groups": str(len(plan.groups)),
        f"{METADATA_PREFIX}solver": f"{plan.solver.get('name')} {plan.solver.get('status')}",
        f"{METADATA_PREFIX}hardware": str(plan.hardware.get("name", "")),
        f"{METADATA_PREFIX}rules": str(plan.rules.get("file", "")),
        f"{METADATA_PREFIX}objective": plan.objective.value,
        f"{METADATA_PREFIX}dram_bytes": str(t.dram_bytes),
        f"{METADATA_PREFIX}compulsory_dram_bytes": str(plan.compulsory_dram_bytes),
        f"{METADATA_PREFIX}layer_by_layer_dram_bytes": str(plan.layer_by_layer_dram_bytes),
    }


def annotated_model(problem: Problem, plan: Plan) -> onnx.ModelProto:
    """A copy of the cleaned model with every node annotated with its group."""
    proto = onnx.ModelProto()  # weights of one value written out (planner.front.fills)
    proto.CopyFrom(materialized(problem.model.proto))
    owner = {name: g for g in plan.groups for name in g.layers}
    for lay in problem.graph.layers:  # the nodes a fused attention layer stands for
        for name in lay.attrs.get("fused", ()):
            if lay.name in owner:
                owner.setdefault(name, owner[lay.name])
    for node in proto.graph.node:
        group = owner.get(node.name)
        if group is None:
            raise InputError(f"node '{node.name}' of {problem.model.path} is in no group of the "
                             "plan. Was the plan made for another model?")
        _set_props(node, node_metadata(group))
        doc = node_doc(group)
        node.doc_string = f"{node.doc_string}\n{doc}" if node.doc_string else doc
    _set_props(proto, model_metadata(plan))
    return proto


def export_onnx(problem: Problem, plan: Plan, path: str | Path) -> None:
    """Write the model annotated with the plan (see the module docstring) to ``path``."""
    proto = annotated_model(problem, plan)
    write_with(path, lambda tmp: onnx.save(proto, str(tmp)), "ONNX file")


# --------------------------------------------------------------------------- Graphviz


def dot_id(text: str) -> str:
    """A double-quoted Graphviz ID."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _dot_node(problem: Problem, name: str, group: Group) -> str:
    lay = problem.graph.layer(name)
    fill, stroke = group_colours(group.id)
    shape = "x".join(map(str, lay.out_shape))
    label = f"{lay.name}\n{lay.op} {shape}"
    return (f"    {dot_id(name)} [label={dot_id(label)}, fillcolor={dot_id(_hex(fill))}, "
            f"color={dot_id(_hex(stroke))}];")


def _hex(hsl: str) -> str:
    """Graphviz wants #rrggbb: convert our 'hsl(h,s%,l%)' colours."""
    h, s, lum = (float(v.rstrip("%")) for v in hsl[4:-1].split(","))
    r, g, b = colorsys.hls_to_rgb(h / 360, lum / 100, s / 100)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _dot_cluster(problem: Problem, group: Group) -> list[str]:
    stroke = _hex(group_colours(group.id)[1])
    label = (f"group {group.id}: {len(group.layers)} layers, tile {tile_text(group)}, "
             f"{group.mode}, DRAM {group.predicted.dram_bytes} B")
    lines = [f"  subgraph cluster_{group.id} {{",
             f"    label={dot_id(label)}; color={dot_id(stroke)}; style=\"rounded,bold\";"]
    lines += [_dot_node(problem, n, group) for n in group.layers]
    lines.append("  }")
    return lines


def render_dot(problem: Problem, plan: Plan) -> str:
    """The layer graph in Graphviz dot: one ``cluster_ID`` subgraph per fused group."""
    lines = [f"digraph {dot_id(problem.model.path)} {{",
             "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [color="#8a94a0"];']
    for g in plan.groups:
        if g.fused:
            lines += _dot_cluster(problem, g)
        else:
            lines.append(_dot_node(problem, g.layers[0], g).replace("    ", "  ", 1))
    for a, b, data in problem.graph.dag.edges(data=True):
        tensor = data.get("tensor", "")
        lines.append(f"  {dot_id(a)} -> {dot_id(b)} [tooltip={dot_id(tensor)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def export_dot(problem: Problem, plan: Plan, path: str | Path) -> None:
    """Write the Graphviz dot file of the plan to ``path``."""
    write_atomic(path, render_dot(problem, plan), "dot file")
