"""Load an ONNX model, bind its input shapes, fold its constants and infer every shape.

The planner works on a *cleaned* model: only real (non-constant) graph inputs, every
weight stored as an initializer, no ``Constant``/``ConstantOfShape`` nodes, every node
named, and a concrete static shape for every tensor in ``graph.value_info``.

``load_model`` pipeline: read + check the file; treat inputs that have an initializer as
constants; name unnamed/duplicate nodes ``{op_type}_{index}``; drop nodes that do not reach an
output; bind input shapes (``--shape``); fold constants to a fixed point (Constant,
ConstantOfShape, Shape/Size of statically shaped tensors with numpy, every other node whose
inputs are all constant in one ReferenceEvaluator model per run of such nodes), with strict
shape inference (data propagation) between rounds so Shape nodes of intermediate tensors fold
too; drop dead nodes, initializers, unused inputs and unused optional outputs; write the
inferred shapes (or, where inference gives none, shapes measured with onnxruntime) into the
graph.

The stages live in modules by job (resolve, validate, shape_bind, fold, shape_infer, assemble);
this module runs them in order and re-exports what other packages import from it: the
synthetic weights and inputs (synthetic) and the onnxruntime reference run (reference).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType

import onnx

from fuseplan.planner.core.budget import Budget
from fuseplan.planner.front.assemble import _assemble
from fuseplan.planner.front.fills import fill_in
from fuseplan.planner.front.fold import _fold_round, _has_unresolved_shape_nodes
from fuseplan.planner.front.group_norm import MADE_CONSTANT, split_group_norms
from fuseplan.planner.front.loaded import LoadedModel
from fuseplan.planner.front.reference import ort_max_opset, run_onnxruntime
from fuseplan.planner.front.resolve import ZOO, _parse_model, _read_bytes, resolve_model, zoo_dir
from fuseplan.planner.front.shape_bind import (
    MAX_TENSOR_ELEMENTS,
    _bind_shapes,
    _rebatch_reshapes,
    declared_input_dims,
    parse_shape_option,
)
from fuseplan.planner.front.shape_infer import _fill_runtime_shapes, _infer_types, _record_static
from fuseplan.planner.front.synthetic import (
    _weight_roles,
    random_inputs,
    randomize_weights,
    weights_are_placeholders,
)
from fuseplan.planner.front.validate import (
    _check_channels,
    _check_control_flow,
    _check_element_types,
    _check_opset,
    _check_outputs_defined,
    _check_runnable,
    _check_sizes,
    _default_opset,
)
from fuseplan.planner.front.work import (
    _copy_node,
    _drop_pass_throughs,
    _live_nodes,
    _name_nodes,
    _static_shape,
    _trim_unused_outputs,
    _Work,
)

# what other packages and the tests import from here (_weight_roles: tests/test_ops.py)
__all__ = [
    "MAX_TENSOR_ELEMENTS",
    "ZOO",
    "LoadedModel",
    "_weight_roles",
    "declared_input_dims",
    "load_model",
    "ort_max_opset",
    "parse_shape_option",
    "random_inputs",
    "randomize_weights",
    "resolve_model",
    "run_onnxruntime",
    "weights_are_placeholders",
    "zoo_dir",
]


def load_model(
    spec: str, shapes: Mapping[str, tuple[int, ...]] = MappingProxyType({}),
    budget: Budget | None = None,
) -> LoadedModel:
    """Load, validate and clean a model (see the module docstring for what "clean" means).

    ``spec`` is a path or ``zoo:NAME``; ``shapes`` binds input shapes by input name
    (``--shape`` options). Raises InputError for every problem with the model or the shapes;
    OutOfTime where ``budget``'s limit passes between two steps.
    """
    budget = budget or Budget()
    file = resolve_model(spec)
    data = _read_bytes(file, spec)
    sha = hashlib.sha256(data).hexdigest()
    budget.check("reading the file", spec)
    model = _parse_model(data, file, spec)
    del data
    budget.check("parsing the model", spec)
    opset = _default_opset(model, spec)
    _check_opset(opset, spec)
    graph = model.graph
    nodes = [_copy_node(n) for n in graph.node]
    _name_nodes(nodes)
    work = _Work(spec=spec, nodes=nodes, inits={t.name: t for t in graph.initializer})
    _check_outputs_defined(work, graph)
    work.nodes = _live_nodes(work.nodes, (o.name for o in graph.output))
    _check_control_flow(work.nodes, spec)
    _bind_shapes(work, graph, shapes)
    budget.check("binding the input shapes", spec)
    types = _fold_constants(work, model)
    budget.check("folding constants and inferring shapes", spec)
    if _rebatch_reshapes(work, types, spec):
        types = _fold_constants(work, model)
    made = split_group_norms(work, types, opset)
    if made:  # the new tensors' shapes
        types = _fold_constants(work, model)
    budget.check("folding constants and inferring shapes", spec)
    work.nodes = _live_nodes(work.nodes, (o.name for o in graph.output))
    _trim_unused_outputs(work.nodes, (o.name for o in graph.output), opset)
    work.nodes = _drop_pass_throughs(work.nodes, (o.name for o in graph.output), types)
    _check_runnable(work.nodes, opset, spec)
    _check_element_types(work, types)
    budget.check("checking the nodes", spec)
    _assemble(work, model, types)
    for tensor in model.graph.initializer:
        # the loader's constants, and those the model computes from shapes (a causal mask
        # built from the sequence length): verification's random weights leave them alone
        if tensor.name in made or tensor.name in work.shaped:
            fill_in(tensor)  # its doc_string says what it is: no room for a stub's value
            tensor.doc_string = MADE_CONSTANT
    _check_sizes(model, spec)
    _fill_runtime_shapes(model, spec)
    _check_channels(model, spec)
    return LoadedModel(
        proto=model,
        path=spec,
        file=file,
        sha256=sha,
        inputs={vi.name: _static_shape(vi.type) or () for vi in model.graph.input},
        outputs=tuple(o.name for o in model.graph.output),
        opset=opset,
    )


def _fold_constants(work: _Work, model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Fold to a fixed point, inferring shapes between rounds; return the final types."""
    _fold_round(work, model.opset_import)
    while True:
        types = _infer_types(work, model)
        _record_static(work, types)
        if not _has_unresolved_shape_nodes(work) or not _fold_round(work, model.opset_import):
            return types
