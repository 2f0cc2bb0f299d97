"""Random graphs of movement ops between convs and matmuls (issue 42's property test): an
image flattened into a sequence and split back, sequences turned into tokens and back,
channels split into groups around a per-group softmax, per-token and per-pixel
reductions, 1-D and 2-D convs, on random chips. Every plan the planner makes of them runs
in the emulator with outputs matching onnxruntime and every counter as predicted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from hand import assert_verifies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from fuseplan.planner.app import api


@dataclass
class _Net:
    """A model being built: its nodes, constants and the map it ends in."""

    rng: np.random.Generator
    kind: str  # "image" [1, C, H, W], "sequence" [1, C, L] or "tokens" [1, L, C]
    c: int
    h: int
    w: int
    x: str = "x"
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: dict[str, np.ndarray] = field(default_factory=dict)

    def name(self, stem: str) -> str:
        return f"{stem}{len(self.nodes)}"

    def const(self, stem: str, value: np.ndarray) -> str:
        name = self.name(stem)
        self.inits[name] = value
        return name

    def weight(self, *shape: int) -> str:
        fan_in = int(np.prod(shape[1:])) or 1
        return self.const("w", (self.rng.standard_normal(shape) / np.sqrt(fan_in))
                          .astype(np.float32))

    def add(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_node", **attrs))
        self.x = out
        return out

    def shape(self) -> list[int]:
        length = self.h * self.w
        return {"image": [1, self.c, self.h, self.w], "sequence": [1, self.c, length],
                "tokens": [1, length, self.c]}[self.kind]


def _conv(n: _Net) -> None:
    if n.kind == "image":
        k = int(n.rng.choice([1, 3]))
        n.add("Conv", [n.x, n.weight(n.c, n.c, k, k)], pads=[k // 2] * 4)
    elif n.kind == "sequence":
        n.add("Conv", [n.x, n.weight(n.c, n.c, 3)], pads=[1, 1])
    else:
        width = int(n.rng.choice([8, 16]))
        matrix = n.rng.standard_normal((n.c, width)) / np.sqrt(n.c)
        n.add("MatMul", [n.x, n.const("w", matrix.astype(np.float32))])
        n.c = width
    n.add("Tanh", [n.x])


def _flatten_or_split(n: _Net) -> None:
    """An image into a sequence of its positions, or a sequence back into the image."""
    if n.kind == "image":
        n.add("Reshape", [n.x, n.const("s", np.array([1, n.c, n.h * n.w], np.int64))])
        n.kind = "sequence"
    elif n.kind == "sequence":
        n.add("Reshape", [n.x, n.const("s", np.array([1, n.c, n.h, n.w], np.int64))])
        n.kind = "image"
    else:
        _transpose(n)


def _transpose(n: _Net) -> None:
    """A sequence into tokens and back."""
    if n.kind == "image":
        _flatten_or_split(n)
        return
    n.add("Transpose", [n.x], perm=[0, 2, 1])
    n.kind = "tokens" if n.kind == "sequence" else "sequence"


def _rms_norm(n: _Net) -> None:
    """A mean over each position's channels: RMSNorm on tokens, a channel mean elsewhere."""
    axis = -1 if n.kind == "tokens" else 1
    x = n.x
    square = n.add("Mul", [x, x])
    mean = n.add("ReduceMean", [square], axes=[axis], keepdims=1)
    root = n.add("Sqrt", [n.add("Add", [mean, n.const("e", np.array(1e-3, np.float32))])])
    n.add("Div", [x, root])


def _group_softmax(n: _Net) -> None:
    """Channels split into groups of 4, a softmax within each group, joined back (a DFL)."""
    if n.kind != "sequence" or n.c % 4:
        _rms_norm(n)
        return
    length = n.h * n.w
    n.add("Reshape", [n.x, n.const("s", np.array([1, n.c // 4, 4, length], np.int64))])
    n.add("Softmax", [n.x], axis=2)
    n.add("Reshape", [n.x, n.const("s", np.array([1, n.c, length], np.int64))])


def _join(n: _Net) -> None:
    """The map joined with its own activation along the channels."""
    axis = -1 if n.kind == "tokens" else 1
    x = n.x
    n.add("Concat", [x, n.add("Sigmoid", [x])], axis=axis)
    n.c *= 2


_OPS: tuple[Callable[[_Net], None], ...] = (_conv, _flatten_or_split, _transpose, _rms_norm,
                                            _group_softmax, _join)


def _narrow(n: _Net) -> None:
    """Back to 8 channels: a 1x1 conv (image, sequence) or a Linear layer (tokens)."""
    if n.kind == "tokens":
        matrix = n.rng.standard_normal((n.c, 8)) / np.sqrt(n.c)
        n.add("MatMul", [n.x, n.const("w", matrix.astype(np.float32))])
    else:
        n.add("Conv", [n.x, n.weight(8, n.c, *([1] * (2 if n.kind == "image" else 1)))])
    n.c = 8


def _model(tmp: Path, ops: list[int], seed: int) -> str:
    n = _Net(np.random.default_rng(seed), "image", 8, 16, 24)
    given_shape = n.shape()
    _conv(n)
    for i in ops:
        _OPS[i](n)
        if n.c > 32:  # keep the maps small: the test is about their axes
            _narrow(n)
    return save_net(tmp, n, given_shape, n.shape(), "random_movement")


def save_net(tmp: Path, n: _Net, given_shape: list[int], out_shape: list[int],
             name: str) -> str:
    """The net as a checked opset-17 model file `name`.onnx in `tmp`: input x of
    `given_shape`, its last tensor the output, of `out_shape`."""
    graph = helper.make_graph(
        n.nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, given_shape)],
        [helper.make_tensor_value_info(n.x, TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in n.inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = tmp / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.integers(0, len(_OPS) - 1), min_size=1, max_size=7),
       seed=st.integers(0, 2**16), sram_kib=st.sampled_from([16, 32, 64, 512]),
       solver=st.sampled_from(["cpsat", "greedy"]))
def test_random_movement_graphs_plan_and_verify(tmp_path: Path, ops: list[int], seed: int,
                                                sram_kib: int, solver: str) -> None:
    problem = api.prepare(_model(tmp_path, ops, seed),
                          overrides=(f"sram.bytes={sram_kib}KiB",))
    plan = api.plan_problem(problem, solver, time_limit=20)
    assert_verifies(problem, plan)
