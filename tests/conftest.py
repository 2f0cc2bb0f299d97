"""Shared fixtures: the repository on sys.path, and zoo models loaded once per session."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # `from tests import models` and `import models` both work
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

_ZOO_CACHE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def zoo_model() -> Callable[[str], Any]:
    """`zoo_model("resnet50")` -> planner.front.onnx_load.LoadedModel, loaded once per session."""
    from planner.front.onnx_load import load_model

    def get(name: str) -> Any:
        if name not in _ZOO_CACHE:
            _ZOO_CACHE[name] = load_model(f"zoo:{name}", {})
        return _ZOO_CACHE[name]

    return get
