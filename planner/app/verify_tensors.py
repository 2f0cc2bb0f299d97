"""Tensor by tensor: every tensor a plan moves through DRAM compared with its reference, each
against its own scale, and references that could not show an error told apart.

The tolerance rule (TOLERANCE_RULE, also stated in `verify --json`): a tensor agrees with its
reference when both have the same shape, the same elements are NaN or infinite (with the same
value), and over the finite elements

    max |emulated - reference| <= REL_TOLERANCE * scale + ABS_FLOOR,

where ``scale`` is the tensor's own largest reference magnitude (max |reference|). No other
absolute floor: a tensor of values around 1e-10 is held to 1e-13, not waved through.

A reference is uninformative (UNINFORMATIVE_RULE) when it could not show an error: constant
(its values span no more than CONSTANT_SPAN of its scale: a zero-initialised head), near
zero (scale <= NEAR_ZERO), or barely depending on the input (other seeded inputs move it by
no more than INPUT_DEPENDENCE of its scale).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# float32 through 50+ layers, in another summation order: relative to the tensor's scale
REL_TOLERANCE = 1e-3
# below float32's smallest normal number squared: only exact zeros meet an all-zero tensor
ABS_FLOOR = 1e-30
TOLERANCE_RULE = (f"max |emulated - reference| <= {REL_TOLERANCE:g} * scale + {ABS_FLOOR:g}, "
                  "scale = max |reference| of that tensor; NaN and infinities must sit at the "
                  "same elements")
CONSTANT_SPAN = 1e-6
NEAR_ZERO = 1e-10
# an input change the comparison could not see (below its tolerance) leaves errors upstream unseen
INPUT_DEPENDENCE = REL_TOLERANCE
UNINFORMATIVE_RULE = (f"constant (max - min <= {CONSTANT_SPAN:g} * scale), near zero "
                      f"(scale <= {NEAR_ZERO:g}), or input-independent (other seeded inputs "
                      f"change it by <= {INPUT_DEPENDENCE:g} * scale)")


def finite_or_none(x: float) -> float | None:
    """JSON has no infinity: None stands for it."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class TensorCheck:
    """One DRAM tensor against its reference: the group that wrote it (None: a model input
    or a tensor no group writes), its errors, its scale and whether it agrees."""

    tensor: str
    group: int | None
    max_abs_err: float
    max_rel_err: float
    scale: float
    ok: bool
    note: str = ""  # why it disagrees beyond the numbers (a shape, a NaN)

    def describe(self) -> str:
        """One line for the "first mismatch" message."""
        where = "" if self.group is None else f" (group {self.group})"
        if self.note:
            return f"{self.tensor}{where}: {self.note}"
        return (f"{self.tensor}{where}: max abs error {self.max_abs_err:.3g} = "
                f"{self.max_rel_err:.3g} of its scale {self.scale:.3g} (tolerance "
                f"{REL_TOLERANCE:g})")

    def to_json(self) -> dict[str, Any]:
        """`verify --json`'s entry of "tensors"."""
        doc: dict[str, Any] = {"tensor": self.tensor, "group": self.group,
                               "max_abs_err": finite_or_none(self.max_abs_err),
                               "max_rel_err": finite_or_none(self.max_rel_err),
                               "scale": finite_or_none(self.scale), "ok": self.ok}
        if self.note:
            doc["note"] = self.note
        return doc


def check_tensor(name: str, group: int | None, got: np.ndarray, want: np.ndarray
                 ) -> TensorCheck:
    """`got` against `want` under the tolerance rule (module docstring)."""
    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        return TensorCheck(name, group, math.inf, math.inf, 0.0, False,
                           f"shape {list(a.shape)}, reference {list(b.shape)}")
    finite = np.isfinite(b)
    scale = float(np.max(np.abs(b[finite]))) if finite.any() else 0.0
    # non-finite elements must be the same non-finite value (NaN where NaN)
    odd = ~finite | ~np.isfinite(a)
    same_odd = (np.isnan(a) & np.isnan(b)) | (a == b)
    if np.any(odd & ~same_odd):
        bad = int(np.count_nonzero(odd & ~same_odd))
        return TensorCheck(name, group, math.inf, math.inf, scale, False,
                           f"{bad} element(s) NaN or infinite where the reference is not "
                           "(or the other way round)")
    both = ~odd
    err = float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    return TensorCheck(name, group, err, rel, scale, err <= REL_TOLERANCE * scale + ABS_FLOOR)


def check_tensors(order: Sequence[tuple[str, int | None]], got: Mapping[str, np.ndarray],
                  want: Mapping[str, np.ndarray]) -> list[TensorCheck]:
    """Every tensor of `order` (name, writing group) that both sides hold, in that order."""
    return [check_tensor(name, group, got[name], want[name]) for name, group in order
            if name in got and name in want]


@dataclass(frozen=True)
class Uninformative:
    """A reference tensor that could not show an error, and why (constant, near-zero,
    input-independent), with the numbers that say so."""

    tensor: str
    why: str
    scale: float
    detail: float  # the span (constant), the scale (near-zero) or the change (input-independent)

    def to_json(self) -> dict[str, Any]:
        """`verify --json`'s entry of "weights.uninformative"."""
        return {"tensor": self.tensor, "why": self.why, "scale": finite_or_none(self.scale),
                "detail": finite_or_none(self.detail)}


def uninformative(name: str, values: np.ndarray, other: np.ndarray | None) -> Uninformative | None:
    """Why the reference `values` of a tensor could not show an error (UNINFORMATIVE_RULE),
    or None; `other`: the same tensor on other seeded inputs (None: not run)."""
    b = np.asarray(values, dtype=np.float64)
    finite = b[np.isfinite(b)]
    if finite.size == 0:
        return Uninformative(name, "constant", 0.0, 0.0)
    scale = float(np.max(np.abs(finite)))
    span = float(finite.max() - finite.min())
    if span <= CONSTANT_SPAN * scale:
        return Uninformative(name, "constant", scale, span)
    if scale <= NEAR_ZERO:
        return Uninformative(name, "near-zero", scale, scale)
    if other is not None and np.shape(other) == b.shape:
        o = np.asarray(other, dtype=np.float64)
        both = np.isfinite(o) & np.isfinite(b)
        change = float(np.max(np.abs(o[both] - b[both]))) if both.any() else 0.0
        if change <= INPUT_DEPENDENCE * scale:
            return Uninformative(name, "input-independent", scale, change)
    return None


def uninformative_tensors(names: Sequence[str], values: Mapping[str, np.ndarray],
                          other: Mapping[str, np.ndarray] | None) -> list[Uninformative]:
    """The Uninformative verdict of each of `names` that `values` holds, in that order."""
    found = []
    for name in names:
        if name in values:
            u = uninformative(name, values[name], None if other is None else other.get(name))
            if u is not None:
                found.append(u)
    return found
