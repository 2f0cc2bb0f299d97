"""The reference side of `verify`: onnxruntime's (or a golden file's) value of every tensor a
plan moves through DRAM, and the weights the model runs with.

A reference that cannot show an error makes a verification that cannot fail: a head
initialised to zero outputs exactly 0 whatever the plan did, a network whose outputs are
1e-10 or that barely depend on its input hides any error upstream. `--weights` says which
weights run: ``model`` (the file's own), ``random`` (seeded ones that keep activations O(1),
planner.front.synthetic) or ``auto`` (the default): the model's own unless they are
placeholders (most weight elements one repeated value) or make a model output uninformative
(planner.app.verify_tensors.UNINFORMATIVE_RULE), then seeded random ones. Whichever run, the
report lists every compared tensor whose reference is uninformative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from fuseplan.planner.app.verify_tensors import (
    UNINFORMATIVE_RULE,
    Uninformative,
    uninformative_tensors,
)
from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import write_with
from fuseplan.planner.front.onnx_load import (
    LoadedModel,
    random_inputs,
    randomize_weights,
    run_onnxruntime,
    weights_are_placeholders,
)

WEIGHT_MODES = ("auto", "model", "random")


@dataclass(frozen=True)
class Reference:
    """What the emulated tensors are compared with: onnxruntime's values of every DRAM
    tensor on the same inputs, or a golden file's; and how long producing them took."""

    source: str  # onnxruntime | golden
    tensors: Mapping[str, np.ndarray]
    seconds: float


@dataclass(frozen=True)
class WeightsChoice:
    """Which weights the model ran with and why; the model outputs the model's own weights
    left uninformative (when they were looked at), and every compared tensor whose
    reference is uninformative under the weights that ran."""

    requested: str  # auto | model | random
    used: str  # model | random
    reason: str
    model_uninformative: tuple[Uninformative, ...] = ()
    uninformative: tuple[Uninformative, ...] = ()
    outputs: tuple[str, ...] = ()  # the model's outputs, to tell them in `uninformative`

    @property
    def informative(self) -> bool:
        """Whether every model output's reference could show an error."""
        return not any(u.tensor in self.outputs for u in self.uninformative)

    def to_json(self) -> dict[str, Any]:
        """`verify --json`'s "weights"."""
        return {"requested": self.requested, "used": self.used, "reason": self.reason,
                "rule": UNINFORMATIVE_RULE, "informative": self.informative,
                "model_weights_uninformative": [u.to_json() for u in self.model_uninformative],
                "uninformative": [u.to_json() for u in self.uninformative]}


def with_outputs(proto: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of the model that also outputs `names` (its typed value_info where known, a
    bare name otherwise: onnxruntime infers the type); names no node produces are left out."""
    extra = onnx.ModelProto()
    extra.CopyFrom(proto)
    have = {o.name for o in extra.graph.output}
    info = {vi.name: vi for vi in extra.graph.value_info}
    produced = {o for n in extra.graph.node for o in n.output if o}
    for n in names:
        if n in have or n not in produced:
            continue
        extra.graph.output.append(info[n] if n in info else onnx.ValueInfoProto(name=n))
    return extra


def onnxruntime_reference(model: LoadedModel, names: Sequence[str],
                          inputs: Mapping[str, np.ndarray]) -> Reference:
    """onnxruntime's values of `names` (and the model's outputs) on `inputs`."""
    values, seconds = run_onnxruntime(with_outputs(model.proto, names), inputs)
    return Reference("onnxruntime", values, seconds)


def other_seed(seed: int) -> int:
    """The seed of the second inputs that tell whether a tensor depends on the input."""
    return seed + 1 if seed < 2**32 - 1 else 0


def _outputs(model: LoadedModel) -> tuple[str, ...]:
    return tuple(o.name for o in model.proto.graph.output)


def _looked_at(model: LoadedModel, names: Sequence[str], inputs: Mapping[str, np.ndarray],
               seed: int) -> tuple[Reference, tuple[Uninformative, ...]]:
    """onnxruntime's reference of `names` on `inputs`, and which of them are uninformative
    (the second run on other seeded inputs tells input-independent ones)."""
    first = onnxruntime_reference(model, names, inputs)
    second = onnxruntime_reference(model, names, random_inputs(model, other_seed(seed)))
    order = list(dict.fromkeys([*_outputs(model), *names]))
    return first, tuple(uninformative_tensors(order, first.tensors, second.tensors))


def choose_weights(loaded: LoadedModel, names: Sequence[str], inputs: Mapping[str, np.ndarray],
                   seed: int, mode: str = "auto"
                   ) -> tuple[LoadedModel, WeightsChoice, Reference]:
    """The model with the weights `mode` picks (module docstring), the choice, and
    onnxruntime's reference of the DRAM tensors `names` on `inputs` under those weights."""
    if mode not in WEIGHT_MODES:
        raise InputError(f"unknown --weights '{mode}'. Use {', '.join(WEIGHT_MODES)}.")
    outputs = _outputs(loaded)
    own: tuple[Uninformative, ...] = ()
    if mode == "model" or (mode == "auto" and not weights_are_placeholders(loaded)):
        reference, own = _looked_at(loaded, names, inputs, seed)
        bad = [u for u in own if u.tensor in outputs]
        if mode == "model" or not bad:
            reason = "--weights model" if mode == "model" else \
                "the model's own weights make every model output informative"
            return loaded, WeightsChoice(mode, "model", reason, own, own, outputs), reference
        reason = ("the model's own weights make " + ", ".join(f"{u.tensor} {u.why}" for u in bad)
                  + f": seeded random weights (seed {seed}) instead")
    elif mode == "random":
        reason = f"--weights random (seed {seed})"
    else:
        reason = (f"placeholder weights (most weight elements one repeated value): seeded "
                  f"random weights (seed {seed})")
    weighted = randomize_weights(loaded, seed)
    reference, found = _looked_at(weighted, names, inputs, seed)
    return weighted, WeightsChoice(mode, "random", reason, own, found, outputs), reference


# --------------------------------------------------------------------------- golden files


@dataclass(frozen=True)
class Golden:
    """A golden file: seeded inputs, the reference value of the model's outputs and of every
    other tensor stored (a plan's DRAM tensors, from fuseplan 43 on), the seed, and which
    weights made them (None in older files: placeholders were replaced, real weights kept)."""

    inputs: Mapping[str, np.ndarray]
    outputs: Mapping[str, np.ndarray]
    tensors: Mapping[str, np.ndarray]  # the outputs and every other stored tensor
    seed: int
    weights: str | None


def save_golden(path: Path, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
                seed: int, tensors: Mapping[str, np.ndarray] | None = None,
                weights: str | None = None) -> None:
    """Store inputs and reference outputs for `verify --golden`; ``tensors``: the reference
    of other DRAM tensors too (``tensor:NAME``); ``weights``: model or random."""
    arrays = {f"input:{k}": v for k, v in inputs.items()}
    arrays.update({f"output:{k}": v for k, v in outputs.items()})
    arrays.update({f"tensor:{k}": v for k, v in (tensors or {}).items() if k not in outputs})
    arrays["seed"] = np.array(seed)
    if weights is not None:
        arrays["weights"] = np.array(weights)

    def write(tmp: Path) -> None:
        # a file object, not a path: numpy would add ".npz" to the temporary name
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)  # type: ignore[arg-type]

    write_with(path, write, "golden file")


def read_golden(path: Path) -> Golden:
    """A golden file (InputError naming it when it is not one)."""
    try:
        data = np.load(path, allow_pickle=False)
        files = list(data.files)
        arrays = {k: data[k] for k in files}
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: not a readable golden .npz file ({exc}). Write one with "
                         "`fuseplan verify MODEL PLAN --save-golden G.npz`.") from None
    inputs = {k[6:]: v for k, v in arrays.items() if k.startswith("input:")}
    outputs = {k[7:]: v for k, v in arrays.items() if k.startswith("output:")}
    others = {k[7:]: v for k, v in arrays.items() if k.startswith("tensor:")}
    if not inputs or not outputs:
        raise InputError(f"{path}: golden file has no input:/output: arrays. Write one with "
                         "`fuseplan verify MODEL PLAN --save-golden G.npz`.")
    weights = str(arrays["weights"]) if "weights" in arrays else None
    if weights is not None and weights not in ("model", "random"):
        raise InputError(f"{path}: golden file says weights '{weights}', not model or random. "
                         "Write it again with `fuseplan verify MODEL PLAN --save-golden G.npz`.")
    seed = int(arrays["seed"]) if "seed" in arrays else 0
    return Golden(inputs, outputs, {**others, **outputs}, seed, weights)


def golden_weights(loaded: LoadedModel, golden: Golden, mode: str
                   ) -> tuple[LoadedModel, WeightsChoice]:
    """The weights a golden file was made with (its record; an older file's: placeholders
    replaced, real weights kept); InputError when --weights asks for others."""
    used = golden.weights or ("random" if weights_are_placeholders(loaded) else "model")
    if mode not in WEIGHT_MODES:
        raise InputError(f"unknown --weights '{mode}'. Use {', '.join(WEIGHT_MODES)}.")
    if mode != "auto" and mode != used:
        raise InputError(f"the golden file was made with the {used} weights, not --weights "
                         f"{mode}. Leave --weights out, or write the golden file again with "
                         f"`fuseplan verify MODEL PLAN --weights {mode} --save-golden G.npz`.")
    weighted = randomize_weights(loaded, golden.seed) if used == "random" else loaded
    found = tuple(uninformative_tensors(list(golden.tensors), golden.tensors, None))
    reason = "as the golden file records" if golden.weights else \
        "as the golden file was made (an older file: placeholders replaced, real weights kept)"
    return weighted, WeightsChoice(mode, used, reason, (), found, tuple(golden.outputs))
