"""What load_model hands the planner: the cleaned model and where it came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx


@dataclass(frozen=True)
class LoadedModel:
    """A cleaned model plus what the planner needs to know about where it came from."""

    proto: onnx.ModelProto
    path: str
    file: Path
    sha256: str
    inputs: dict[str, tuple[int, ...]]
    outputs: tuple[str, ...]
    opset: int
