"""Shared fixtures: the repository on sys.path, and zoo models loaded once per session."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# CI draws the same examples on every run (a property test that fails there fails again on
# a laptop, and no run spends minutes shrinking a new draw); FUSEPLAN_HYPOTHESIS=explore
# draws fresh examples, to look for new counterexamples
# no deadline in either: a loaded machine slows an example down, which is not a failure
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile("explore" if os.environ.get("FUSEPLAN_HYPOTHESIS") == "explore" else "ci")

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # `from tests import models` and `import models` both work
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

_ZOO_CACHE: dict[str, Any] = {}


@pytest.fixture(scope="session")
def zoo_model() -> Callable[[str], Any]:
    """`zoo_model("resnet50")` -> planner.front.onnx_load.LoadedModel, loaded once per session."""
    from fuseplan.planner.front.onnx_load import load_model

    def get(name: str) -> Any:
        if name not in _ZOO_CACHE:
            _ZOO_CACHE[name] = load_model(f"zoo:{name}", {})
        return _ZOO_CACHE[name]

    return get
