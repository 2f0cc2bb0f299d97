"""Shared fixtures: the repository on sys.path, and zoo models loaded once per session."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `from tests import models` under any pytest invocation
    sys.path.insert(0, str(ROOT))


_ZOO_CACHE: dict[str, object] = {}


@pytest.fixture(scope="session")
def zoo_model() -> Callable[[str], object]:
    """`zoo_model("resnet50")` -> LoadedModel, loaded once per test session."""
    from planner.onnx_load import load_model

    def get(name: str) -> object:
        if name not in _ZOO_CACHE:
            _ZOO_CACHE[name] = load_model(f"zoo:{name}", {})
        return _ZOO_CACHE[name]

    return get
