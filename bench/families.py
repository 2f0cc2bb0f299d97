"""ResNet-18/34/50/101/152 and DenseNet-121/169/201 as ONNX, from their published structure.

Planning time against depth (bench/scale) needs whole families at one input size; the onnx
zoo ships one member of each. These graphs follow torchvision's layer lists (He et al.
2016, Huang et al. 2017) with batch normalization folded away, as exporters fold it into
the convolutions; the weights are ConstantOfShape placeholders (shape only), as in
examples/exports, so a 60 M-parameter ResNet-152 is a 100 KiB file.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RESNETS: dict[str, tuple[str, tuple[int, ...]]] = {
    "resnet18": ("basic", (2, 2, 2, 2)),
    "resnet34": ("basic", (3, 4, 6, 3)),
    "resnet50": ("bottleneck", (3, 4, 6, 3)),
    "resnet101": ("bottleneck", (3, 4, 23, 3)),
    "resnet152": ("bottleneck", (3, 8, 36, 3)),
}
DENSENETS: dict[str, tuple[int, ...]] = {
    "densenet121": (6, 12, 24, 16),
    "densenet169": (6, 12, 32, 32),
    "densenet201": (6, 12, 48, 32),
}
FAMILIES = (*RESNETS, *DENSENETS)


class _Net:
    """Nodes and placeholder weights of one graph under construction."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def weight(self, shape: tuple[int, ...]) -> str:
        """A weight of this shape, as a ConstantOfShape placeholder."""
        w = self.name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(shape, np.int64), f"{w}_shape"))
        self.nodes.append(helper.make_node(
            "ConstantOfShape", [f"{w}_shape"], [w], name=f"{w}_placeholder",
            value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.01])))
        return w

    def op(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
        """A convolution with a bias (batch normalization folded in)."""
        w, b = self.weight((cout, cin, k, k)), self.weight((cout,))
        return self.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride],
                       pads=[k // 2] * 4)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def model(self, x: str, classes: int, channels: int, size: int) -> onnx.ModelProto:
        """Global pool, flatten and classifier after x; the model with input [1,3,size,size]."""
        pooled = self.op("GlobalAveragePool", [x])
        flat = self.op("Flatten", [pooled], axis=1)
        logits = self.op("Gemm", [flat, self.weight((classes, channels)),
                                  self.weight((classes,))], transB=1)
        graph = helper.make_graph(
            self.nodes, "family",
            [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])],
            [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, classes])],
            self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _stem(net: _Net) -> str:
    x = net.relu(net.conv("input", 3, 64, 7, 2))
    return net.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


def resnet(name: str, size: int = 224) -> onnx.ModelProto:
    """torchvision's ResNet of this name (resnet18 ... resnet152)."""
    kind, blocks = RESNETS[name]
    net = _Net()
    x, cin = _stem(net), 64
    for stage, count in enumerate(blocks):
        width = 64 << stage
        cout = width * (4 if kind == "bottleneck" else 1)
        for k in range(count):
            stride = 2 if stage and not k else 1
            if kind == "bottleneck":
                y = net.relu(net.conv(x, cin, width, 1))
                y = net.relu(net.conv(y, width, width, 3, stride))
                y = net.conv(y, width, cout, 1)
            else:
                y = net.relu(net.conv(x, cin, width, 3, stride))
                y = net.conv(y, width, cout, 3)
            skip = net.conv(x, cin, cout, 1, stride) if stride != 1 or cin != cout else x
            x, cin = net.relu(net.op("Add", [y, skip])), cout
    return net.model(x, 1000, cin, size)


def densenet(name: str, size: int = 224, growth: int = 32) -> onnx.ModelProto:
    """torchvision's DenseNet of this name (densenet121, 169, 201), pre-activation layers
    with batch normalization folded into the convolutions."""
    net = _Net()
    x, c = _stem(net), 64
    for stage, count in enumerate(DENSENETS[name]):
        for _ in range(count):
            y = net.conv(net.relu(x), c, 4 * growth, 1)
            y = net.conv(net.relu(y), 4 * growth, growth, 3)
            x, c = net.op("Concat", [x, y], axis=1), c + growth
        if stage < len(DENSENETS[name]) - 1:
            x = net.conv(net.relu(x), c, c // 2, 1)
            x, c = net.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2]), c // 2
    return net.model(net.relu(x), 1000, c, size)


def build(name: str, size: int = 224) -> onnx.ModelProto:
    """The family member called name."""
    return resnet(name, size) if name in RESNETS else densenet(name, size)


def chain(blocks: int, channels: int = 64, size: int = 112, conv: bool = True
          ) -> onnx.ModelProto:
    """A plain chain of `blocks` (3x3 conv with bias -> ReLU) blocks on one map size, or of
    `blocks` ReLUs alone (``conv`` False): the deep chains of issue 46 (at 64 x 112 x 112 no
    two maps fit the default chip together)."""
    net = _Net()
    x = "input"
    for _ in range(blocks):
        x = net.relu(net.conv(x, channels, channels, 3) if conv else x)
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        net.nodes, "chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], net.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
