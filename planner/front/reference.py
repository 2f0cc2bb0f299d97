"""onnxruntime as the reference: run a model on CPU, and tell which opset and IR versions
the installed build accepts."""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.front.fills import materialized
from fuseplan.planner.front.work import _DEFAULT_DOMAINS, _one_line

_ORT_ERRORS: tuple[type[BaseException], ...] = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NotImplemented,
    ort_state.RuntimeException,
    ort_state.EPFail,
    ValueError,
)


def run_onnxruntime(
    proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], float]:
    """Run a model on CPU with onnxruntime: outputs by name and wall seconds of ``run`` only.

    Raises InputError when onnxruntime rejects the model or the feeds.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(  # (weights of one value stored as stubs: filled)
            materialized(proto).SerializeToString(), options,
            providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        start = time.perf_counter()
        results = session.run(names, dict(feeds))
        seconds = time.perf_counter() - start
    except _ORT_ERRORS as exc:
        raise InputError(
            f"onnxruntime cannot run model '{proto.graph.name or '(unnamed graph)'}': "
            f"{_one_line(str(exc))}. Check that the model and its input shapes are valid."
        ) from exc
    return {n: np.asarray(r) for n, r in zip(names, results, strict=True)}, seconds


@cache
def ort_max_opset() -> int:
    """The newest default-domain (ai.onnx) opset the installed onnxruntime implements: the
    highest version of its operator schemas (onnx's own newest opset if it cannot tell)."""
    try:
        from onnxruntime.capi import _pybind_state

        versions = [int(s.since_version) for s in _pybind_state.get_all_operator_schema()
                    if s.domain in _DEFAULT_DOMAINS]
    except (ImportError, AttributeError, RuntimeError):
        versions = []
    return max(versions) if versions else int(onnx.defs.onnx_opset_version())


def _ort_max_ir() -> int:
    """Highest IR version the installed onnxruntime accepts (8 if it cannot be told)."""
    import onnxruntime

    major_minor = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
    return 10 if major_minor >= (1, 17) else 8
