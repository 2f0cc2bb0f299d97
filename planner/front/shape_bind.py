"""Bind the model's input shapes: the declared dims, overridden by ``--shape`` options, each
checked against the tensor size fuseplan plans; and re-batch Reshape targets that hard-code
the exported batch."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from math import prod

import numpy as np
import onnx

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.resolve import _parse_model, _read_bytes, resolve_model
from fuseplan.planner.front.work import _static_shape, _used_names, _Work
from fuseplan.planner.ir.ops import ShapeParam, op_spec

_SHAPE_HINT = "--shape NAME=D0,D1,..."
# The largest tensor (elements) a model may have: 2**31 - 1, the int32 index limit, 8 GiB as
# float32. Past it verify cannot hold a feature map, and the tile search runs for hours.
MAX_TENSOR_ELEMENTS = 2**31 - 1


def parse_shape_option(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME=D0,D1,...`` (one ``--shape`` option) into a name and positive dims."""
    name, sep, dims_text = text.rpartition("=")
    name = name.strip()
    parts = [p.strip() for p in dims_text.split(",")]
    if not sep or not name or not all(re.fullmatch(r"[0-9]+", p) for p in parts):
        raise InputError(
            f"Bad --shape value '{text}': expected NAME=D0,D1,... with the input name, an "
            "equals sign and comma-separated integer dims, e.g. --shape data_0=1,3,224,224."
        )
    dims = tuple(int(p) for p in parts)
    if any(d <= 0 for d in dims):
        raise InputError(
            f"Bad --shape value '{text}': every dim must be a positive integer. Pass e.g. "
            f"--shape {name}=1,3,224,224."
        )
    return name, dims


def _declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """Declared dims of an input: int, symbolic name, or None if unknown; None if no shape."""
    ttype = vi.type.tensor_type
    if not ttype.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for dim in ttype.shape.dim:
        kind = dim.WhichOneof("value")
        dims.append(int(dim.dim_value) if kind == "dim_value" else (dim.dim_param or None))
    return dims


def declared_input_dims(spec: str) -> dict[str, list[int | str | None]]:
    """The real inputs of a model file as declared (symbolic dims as names), before binding."""
    file = resolve_model(spec)
    proto = _parse_model(_read_bytes(file, spec), file, spec)
    constants = {t.name for t in proto.graph.initializer}
    return {vi.name: list(_declared_dims(vi) or []) for vi in proto.graph.input
            if vi.name not in constants}


def _bind_input(
    vi: onnx.ValueInfoProto, override: tuple[int, ...] | None, spec: str
) -> tuple[int, ...]:
    """The concrete shape of one real input (declared dims, overridden by --shape)."""
    if vi.type.WhichOneof("value") != "tensor_type":
        raise InputError(
            f"Model file '{spec}': input '{vi.name}' is not a tensor (sequence, map or "
            "optional inputs are not supported). Export the model with tensor inputs only."
        )
    declared = _declared_dims(vi)
    if override is not None:
        override = tuple(int(d) for d in override)
        if any(d <= 0 for d in override):
            raise InputError(
                f"Model file '{spec}': the shape {list(override)} given for input '{vi.name}' "
                f"has a non-positive dim. Pass positive dims with {_SHAPE_HINT}."
            )
        if declared is not None and len(declared) != len(override):
            raise InputError(
                f"Model file '{spec}': --shape {vi.name}={','.join(map(str, override))} has "
                f"rank {len(override)} but input '{vi.name}' has rank {len(declared)} "
                f"(declared dims {_fmt_dims(declared)}). Pass exactly {len(declared)} dims."
            )
        return override
    if declared is None:
        raise InputError(
            f"Model file '{spec}': input '{vi.name}' has no declared shape. Pass its shape "
            f"with --shape {vi.name}=D0,D1,..."
        )
    for index, dim in enumerate(declared):
        if not isinstance(dim, int):
            what = f"dim {index} ('{dim}')" if dim else f"dim {index} (unknown)"
            raise InputError(
                f"Model file '{spec}': input '{vi.name}' has symbolic {what} in its shape "
                f"{_fmt_dims(declared)}. Bind its dims with --shape {vi.name}="
                f"{','.join(f'D{i}' for i in range(len(declared)))}, keeping the declared "
                "numbers, e.g. --shape data=1,3,224,224."
            )
        if dim <= 0:
            wanted = ",".join(str(d) if isinstance(d, int) and d > 0 else f"D{i}"
                              for i, d in enumerate(declared))
            raise InputError(
                f"Model file '{spec}': input '{vi.name}' declares dim {index} as {dim} in its "
                f"shape {_fmt_dims(declared)}; fuseplan plans only tensors whose every dim is "
                f"positive. Pass the real shape with --shape {vi.name}={wanted} (positive "
                "dims), or re-export the model with a positive input shape."
            )
    return tuple(int(d) for d in declared)  # type: ignore[arg-type]


def _check_size(spec: str, what: str, dims: Sequence[int], input_name: str | None) -> None:
    """Refuse a tensor past MAX_TENSOR_ELEMENTS before anything is computed on it (solve would
    search tiles for hours, verify would need its whole map in memory)."""
    elements = prod(dims)
    if elements <= MAX_TENSOR_ELEMENTS:
        return
    fix = (f"Pass a smaller shape with --shape {input_name}=D0,D1,... (e.g. batch 1 and the "
           "resolution the model was trained at)" if input_name is not None else
           f"Bind smaller input shapes with {_SHAPE_HINT}")
    raise InputError(
        f"Model file '{spec}': {what} has shape {list(dims)}, {elements:,} elements; fuseplan "
        f"plans tensors of at most {MAX_TENSOR_ELEMENTS:,} elements (verify holds every "
        f"feature map in memory). {fix}, or re-export the model with a smaller input."
    )


def _fmt_dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _bind_shapes(
    work: _Work, graph: onnx.GraphProto, shapes: Mapping[str, tuple[int, ...]]
) -> None:
    """Select the real inputs, check --shape names, and give the used ones concrete dims."""
    real = [vi for vi in graph.input if vi.name not in work.inits]
    names = [vi.name for vi in real]
    for name in shapes:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise InputError(
                f"Model file '{work.spec}': --shape names '{name}', which is not a real input "
                f"of the model.{hint} Its real inputs are: {', '.join(names) or '(none)'}. Name "
                f"one of them in --shape NAME=D0,D1,... (`fuseplan inspect MODEL` lists them)."
            )
    used = _used_names(work.nodes, (o.name for o in graph.output))
    for vi in real:
        if vi.name not in used:
            continue
        dims = _bind_input(vi, shapes.get(vi.name), work.spec)
        _check_size(work.spec, f"input '{vi.name}'", dims, vi.name)
        bound = onnx.ValueInfoProto()
        bound.CopyFrom(vi)
        bound.type.tensor_type.ClearField("shape")
        bound.type.tensor_type.shape.SetInParent()
        for d in dims:
            bound.type.tensor_type.shape.dim.add().dim_value = d
        work.inputs[vi.name] = bound
        work.shapes[vi.name] = dims


def _rebatch_reshapes(work: _Work, types: Mapping[str, onnx.TypeProto], spec: str) -> bool:
    """Exports often hard-code the batch in a Reshape's target ([1, 25088] in the zoo VGG).
    When --shape changes the batch, such a target no longer holds the input's elements: keep
    the per-sample shape and put the batch back in axis 0. Any other mismatch is an error."""
    changed = False
    for node in work.nodes:
        if (op_spec(node.op_type).shape_param is not ShapeParam.TARGET_SHAPE
                or len(node.input) < 2 or not work.is_const(node.input[1])):
            continue
        shape = _static_shape(types.get(node.input[0]))
        if shape is None:
            continue
        target = [int(v) for v in work.value(node.input[1]).reshape(-1)]
        dims = [shape[i] if v == 0 and i < len(shape) else v for i, v in enumerate(target)]
        numel = int(np.prod(shape))
        known = int(np.prod([d for d in dims if d != -1]))
        if -1 in dims or known == numel:
            continue
        rest = int(np.prod(dims[1:]))
        if rest > 0 and numel % rest == 0 and shape and numel // rest == shape[0]:
            dims[0] = shape[0]
            work.folded[node.input[1]] = np.array(dims, dtype=np.int64)
            changed = True
            continue
        raise InputError(
            f"Model file '{spec}': node '{node.name}' (Reshape) cannot reshape {list(shape)} "
            f"({numel} elements) into {target}. Check the --shape values ({_SHAPE_HINT})."
        )
    return changed
