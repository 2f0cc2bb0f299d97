#!/usr/bin/env python3
"""Regenerate the three examples: chain_cnn/, residual_net/ and inception_net/.

Each folder holds

* ``model.onnx``   a small float32 CNN (input ``image`` 1x3xHxW, H and W in 48..64);
* ``rules.yaml``   a variant of rules/default.yaml;
* ``hardware.yaml`` a chip with a small SRAM, so whole feature maps do not fit and the
  planner must fuse *and* tile (fusion matters here: it saves DRAM traffic);
* ``plan.json``    ``fuseplan solve model.onnx --rules rules.yaml --hw hardware.yaml -o plan.json``;
* ``golden.npz``   ``fuseplan verify model.onnx plan.json --save-golden golden.npz`` (seeded
  inputs and onnxruntime outputs, for ``fuseplan verify ... --golden golden.npz``).

Run from the repository root: ``.venv/bin/python examples/make_examples.py``. The models
are deterministic (seeded), so running it again rewrites the same files; tests/test_examples.py
checks the committed plans and goldens.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FUSEPLAN = Path(sys.executable).parent / "fuseplan"
OPSET = 13


class Net:
    """A tiny graph builder: seeded He-initialised convs, named nodes, shape-checked model."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def _name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def _const(self, prefix: str, arr: np.ndarray) -> str:
        name = self._name(prefix)
        self.inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    def op(self, op: str, inputs: list[str], prefix: str | None = None, **attrs: object) -> str:
        name = self._name(prefix or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1,
             prefix: str = "conv", relu: bool = True) -> str:
        w = self._const("w", self.rng.standard_normal((cout, cin, k, k))
                        * np.sqrt(2.0 / (cin * k * k)))
        b = self._const("b", 0.01 * self.rng.standard_normal(cout))
        y = self.op("Conv", [x, w, b], prefix, kernel_shape=[k, k], strides=[stride, stride],
                    pads=[k // 2] * 4)
        return self.op("Relu", [y]) if relu else y

    def model(self, name: str, shape: tuple[int, int, int, int], out: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                             list(shape))],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="fuseplan-examples")
        model.ir_version = 8
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        model.graph.output[0].type.CopyFrom(inferred.graph.output[0].type)
        onnx.checker.check_model(model, full_check=True)
        return model


def chain_cnn() -> onnx.ModelProto:
    """A VGG-like chain at 64x64: conv-conv-pool, conv-conv-pool, conv, global pool, classifier."""
    n = Net(seed=11)
    x = n.conv("image", 3, 16, 3, prefix="c1a")
    x = n.conv(x, 16, 16, 3, prefix="c1b")
    x = n.op("MaxPool", [x], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    x = n.conv(x, 16, 32, 3, prefix="c2a")
    x = n.conv(x, 32, 32, 3, prefix="c2b")
    x = n.op("MaxPool", [x], "pool2", kernel_shape=[2, 2], strides=[2, 2])
    x = n.conv(x, 32, 32, 3, prefix="c3")
    x = n.op("Flatten", [n.op("GlobalAveragePool", [x], "gap")], axis=1)
    w = n._const("fc_w", n.rng.standard_normal((10, 32)) / np.sqrt(32))
    b = n._const("fc_b", np.zeros(10))
    return n.model("chain_cnn", (1, 3, 64, 64), n.op("Gemm", [x, w, b], "fc", transB=1))


def residual_net() -> onnx.ModelProto:
    """A stem and three basic residual blocks (the last with stride 2 and a 1x1 projection)."""
    n = Net(seed=12)
    x = n.conv("image", 3, 16, 3, prefix="stem")

    def block(x: str, cin: int, cout: int, stride: int, tag: str) -> str:
        y = n.conv(x, cin, cout, 3, stride, prefix=f"{tag}_a")
        y = n.conv(y, cout, cout, 3, prefix=f"{tag}_b", relu=False)
        short = x if stride == 1 else n.conv(x, cin, cout, 1, stride, f"{tag}_proj", relu=False)
        return n.op("Relu", [n.op("Add", [y, short], f"{tag}_add")], f"{tag}_out")

    x = block(x, 16, 16, 1, "res1")
    x = block(x, 16, 16, 1, "res2")
    x = block(x, 16, 32, 2, "res3")
    return n.model("residual_net", (1, 3, 56, 56), x)


def inception_net() -> onnx.ModelProto:
    """A stem, two four-branch Inception modules (1x1 / 3x3 / 5x5 / pool-proj) and a pool."""
    n = Net(seed=13)
    x = n.conv("image", 3, 16, 3, 2, prefix="stem")

    def module(x: str, cin: int, tag: str) -> str:
        b1 = n.conv(x, cin, 8, 1, prefix=f"{tag}_1x1")
        b2 = n.conv(n.conv(x, cin, 8, 1, prefix=f"{tag}_3x3r"), 8, 12, 3, prefix=f"{tag}_3x3")
        b3 = n.conv(n.conv(x, cin, 4, 1, prefix=f"{tag}_5x5r"), 4, 6, 5, prefix=f"{tag}_5x5")
        pool = n.op("MaxPool", [x], f"{tag}_pool", kernel_shape=[3, 3], strides=[1, 1],
                    pads=[1, 1, 1, 1])
        b4 = n.conv(pool, cin, 6, 1, prefix=f"{tag}_poolproj")
        return n.op("Concat", [b1, b2, b3, b4], f"{tag}_concat", axis=1)

    x = module(x, 16, "inc1")
    x = module(x, 32, "inc2")
    x = n.op("AveragePool", [x], "avgpool", kernel_shape=[2, 2], strides=[2, 2])
    return n.model("inception_net", (1, 3, 64, 64), x)


# Chips where whole feature maps do not fit on chip, so groups must be tiled.
CLUSTER_CHIP = """\
# {name}: a small clustered accelerator (2 clusters x 2 cores) whose SRAM holds only a few
# rows of the model's feature maps: every fused group must be tiled, with halos.
name: {name}
description: "example chip: 2 clusters x 2 cores, {sram} SRAM per cluster"
dtype_bytes: 2          # fp16 storage
clock_ghz: 1.0
clusters: 2
cores_per_cluster: 2
dram: {{bandwidth_gbps: 32, pj_per_byte: 20}}
sram: {{bytes: {sram}, bandwidth_gbps: 512, pj_per_byte: 1.5}}   # per cluster
nram: {{bytes: {nram}, pj_per_byte: 0.5}}    # per core, feature maps
wram: {{bytes: 64KiB, pj_per_byte: 0.5}}     # per core, weights
core: {{macs_per_cycle: 256, vector_lanes: 64, pj_per_mac: 0.2}}
"""

UNIFIED_CHIP = """\
# {name}: a single-memory NPU (like hardware/frustum_npu.yaml) with a {sram} internal memory
# holding a group's weights and its tile's feature maps: fusion needs small tiles.
name: {name}
description: "example chip: one {sram} on-chip memory, 4 compute units"
dtype_bytes: 2
clock_ghz: 1.0
clusters: 1
cores_per_cluster: 4
dram: {{bandwidth_gbps: 25.6, pj_per_byte: 20}}
sram: {{bytes: {sram}, bandwidth_gbps: 512, pj_per_byte: 1.0}}
core: {{macs_per_cycle: 256, vector_lanes: 64, pj_per_mac: 0.2}}
"""

EXAMPLES = {
    "chain_cnn": (chain_cnn, CLUSTER_CHIP.format(name="example_cluster_64k", sram="64KiB",
                                                 nram="32KiB"), None),
    "residual_net": (residual_net, UNIFIED_CHIP.format(name="example_npu_96k", sram="96KiB"),
                     ("redundancy: {enabled: true, threshold_pct: 100}",
                      "redundancy: {enabled: true, threshold_pct: 150}")),
    "inception_net": (inception_net, CLUSTER_CHIP.format(name="example_cluster_56k",
                                                         sram="56KiB", nram="32KiB"),
                      # a whole Inception module is 14 layers: let a group hold one
                      ("max_group_layers: 12", "max_group_layers: 16")),
}


def write_rules(dest: Path, change: tuple[str, str] | None) -> None:
    text = (ROOT / "rules" / "default.yaml").read_text()
    if change is not None:
        old, new = change
        if old not in text:
            raise SystemExit(f"rules/default.yaml no longer contains {old!r}: update {__file__}")
        text = text.replace(old, new)
        text = f"# examples: rules/default.yaml with `{new}`\n" + text
    dest.write_text(text)


def run(*args: str) -> None:
    print("+ fuseplan", " ".join(args), flush=True)
    subprocess.run([str(FUSEPLAN), *args], check=True, cwd=ROOT)


def main(names: list[str]) -> None:
    for name in names or list(EXAMPLES):
        build, chip, rules = EXAMPLES[name]
        folder = HERE / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        onnx.save(build(), folder / "model.onnx")
        write_rules(folder / "rules.yaml", rules)
        (folder / "hardware.yaml").write_text(chip)
        rel = folder.relative_to(ROOT)
        run("solve", f"{rel}/model.onnx", "--rules", f"{rel}/rules.yaml", "--hw",
            f"{rel}/hardware.yaml", "-o", f"{rel}/plan.json")
        run("verify", f"{rel}/model.onnx", f"{rel}/plan.json", "--save-golden",
            f"{rel}/golden.npz")
        for f in sorted(folder.iterdir()):
            print(f"  {f.relative_to(ROOT)}: {f.stat().st_size:,} B")


if __name__ == "__main__":
    main(sys.argv[1:])
