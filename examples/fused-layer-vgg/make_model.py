#!/usr/bin/env python3
"""Write model.onnx: VGG19 (the onnx package's zoo copy) from data_0 up to conv3_1's Relu
(r11): conv1_1, conv1_2, pool1, conv2_1, conv2_2, pool2, conv3_1, the MICRO 2016
fused-layer example. Its weights are the zoo's ConstantOfShape placeholders, folded;
`fuseplan verify` gives them seeded random values."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx.utils import Extractor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from fuseplan.planner.front.onnx_load import load_model  # noqa: E402


def main() -> None:
    cleaned = load_model("zoo:vgg19").proto
    head = Extractor(cleaned).extract_model(["data_0"], ["r11"])
    onnx.save(head, HERE / "model.onnx")


if __name__ == "__main__":
    main()
