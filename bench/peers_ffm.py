#!/usr/bin/env python3
"""AccelForge's side of bench/peers: FFM (the Fast and Fusiest Mapper) on one workload at
each buffer size; prints JSON lines: one with the versions, then one per size as it ends.

    /work/.peers/bin/python bench/peers_ffm.py --workload chain|block --bytes 262144,524288
                                               [--tokens 512] [--width 768] [--products 4]
                                               [--heads 12] [--hidden 3072]

Runs in a Python 3.12 venv with `accelforge` installed (and graphviz's `dot` on the PATH:
the mapper renders each chosen mapping), never in fuseplan's venv: it imports nothing of
fuseplan. bench/peers runs it in a subprocess and reads its JSON.

The architecture is AccelForge's examples/arches/simple.yaml reduced to what fuseplan's
soma_buffer preset models for DRAM traffic: a DRAM (MainMemory: every tensor but the
intermediates lives there; it may hold intermediates too, i.e. spill them) and ONE on-chip
buffer (GlobalBuffer, `size` = the buffer's bytes x 8 bits) that must hold every tensor the
MAC touches, weights and feature maps alike (`keep: All`), feeding one MAC. DRAM reads
and writes cost 1 per bit, buffer accesses and MACs cost nothing, no leakage, every
throughput unbounded; FFM minimises energy (its default metric), which is then exactly the
DRAM bits moved. Every other mapper setting is FFM's default (perfect tile factors only,
loop orders explored, one fused loop per rank variable). Values are 8-bit. The DRAM bytes
reported are MainMemory's read + write actions (bits) / 8, per tensor and in total.

Workloads (the einsums):
* chain: T{i+1}[m, n{i+1}] = T{i}[m, n{i}] * W{i}[n{i}, n{i+1}], i < products.
* block: a GPT-2-like pre-norm transformer block on [tokens, width]: a LayerNorm
  (N1 = I * LN1, LN1 its gamma and beta, [2, width]), the Q, K and V projections
  ([heads, d, width] each, d = width / heads), the scores QK[m, p, h] = Q * K, a softmax
  (A[m, p, h] = QK: element-wise here; fuseplan's is online, see bench/peers), AV = A * V,
  the output projection Z, the residual R1 = Z + I, a second LayerNorm, the MLP
  (FFA = N2 * WFFA, a ReLU, FFB = HID * WFFB) and the residual Y = FFB + R1. No causal
  mask (FFM computes every score; the ONNX model bench/peers plans has none either).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ARCH = """\
arch:
  nodes:
  - !Memory
    name: MainMemory
    size: inf
    leak_power: 0
    area: 0
    tensors: {keep: ~Intermediates, may_keep: All}
    actions:
    - {name: read, energy: 1, throughput: inf}
    - {name: write, energy: 1, throughput: inf}
  - !Memory
    name: GlobalBuffer
    size: BUFFER_BITS
    leak_power: 0
    area: 0
    tensors: {keep: All}
    actions:
    - {name: read, energy: 0, throughput: inf}
    - {name: write, energy: 0, throughput: inf}
  - !Compute
    name: MAC
    leak_power: 0
    area: 0
    actions:
    - {name: compute, energy: 0, throughput: 1}
"""


def chain_workload(tokens: int, width: int, products: int) -> str:
    """A chain of `products` MatMuls by [width, width] weights on [tokens, width]."""
    lines = ["workload:", "  rank_sizes:", f"    M: {tokens}"]
    lines += [f"    N{i}: {width}" for i in range(products + 1)]
    lines += ["  bits_per_value: {All: 8}", "  einsums:"]
    lines += [f'  - "T{i + 1}[m, n{i + 1}] = T{i}[m, n{i}] * W{i}[n{i}, n{i + 1}]"'
              for i in range(products)]
    return "\n".join(lines) + "\n"


def block_workload(tokens: int, width: int, heads: int, hidden: int) -> str:
    """A GPT-2-like pre-norm transformer block (module docstring)."""
    einsums = [
        "N1[m, d] = I[m, d] * LN1[s, d]",
        "Q[m, h, e] = N1[m, d] * WQ[h, e, d]",
        "K[m, h, e] = N1[m, d] * WK[h, e, d]",
        "V[m, h, e] = N1[m, d] * WV[h, e, d]",
        "QK[m, p, h] = Q[m, h, e] * K[M: p, h, e]",
        "A[m, p, h] = QK[m, p, h]",
        "AV[m, h, f] = A[m, p, h] * V[M: p, h, E: f]",
        "Z[m, g] = AV[m, h, f] * WZ[h, f, g]",
        "R1[m, g] = Z[m, g] + I[m, D: g]",
        "N2[m, g] = R1[m, g] * LN2[s, g]",
        "FFA[m, c] = N2[m, g] * WFFA[g, c]",
        "HID[m, c] = FFA[m, c]",
        "FFB[m, j] = HID[m, c] * WFFB[c, j]",
        "Y[m, j] = FFB[m, j] + R1[m, G: j]",
    ]
    sizes = {"M": tokens, "P": tokens, "H": heads, "E": width // heads,
             "F": width // heads, "D": width, "G": width, "J": width, "C": hidden, "S": 2}
    lines = ["workload:", "  rank_sizes:"]
    lines += [f"    {k}: {v}" for k, v in sizes.items()]
    lines += ["  bits_per_value: {All: 8}", "  einsums:"]
    lines += [f'  - "{e}"' for e in einsums]
    return "\n".join(lines) + "\n"


def run(buffer_bytes: int, work: Path) -> dict[str, object]:
    """FFM's optimal mapping of one workload on one buffer size: DRAM bytes and wall s."""
    import accelforge as af

    arch = work / f"arch_{buffer_bytes}.yaml"
    arch.write_text(ARCH.replace("BUFFER_BITS", str(buffer_bytes * 8)))
    spec = af.Spec.from_yaml(str(arch), str(work / "workload.yaml"))
    started = time.perf_counter()
    mappings = spec.map_workload_to_arch(print_progress=False)
    wall = time.perf_counter() - started
    if len(mappings) == 0:
        return {"buffer_bytes": buffer_bytes, "error": "no mapping fits", "wall_s": wall}
    actions = mappings.actions(per_component=True, per_tensor=True)
    assert isinstance(actions, dict)
    per_tensor: dict[str, dict[str, int]] = {}
    for key, bits in actions.items():
        component, tensor, action = key
        if component == "MainMemory" and bits:
            per_tensor.setdefault(str(tensor), {})[str(action)] = int(bits) // 8
    total = sum(sum(d.values()) for d in per_tensor.values())
    energy = mappings.energy()
    return {"buffer_bytes": buffer_bytes, "dram_bytes": total, "wall_s": wall,
            "objective_bits": float(energy),  # FFM's objective: the same DRAM bits
            "per_tensor": per_tensor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("chain", "block"), required=True)
    parser.add_argument("--bytes", required=True, help="buffer sizes in bytes, comma-separated")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--products", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=3072)
    args = parser.parse_args()
    try:
        import accelforge
    except ImportError as exc:
        print(json.dumps({"error": f"accelforge not importable: {exc}"}))
        sys.exit(2)
    version = getattr(accelforge, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("accelforge")
    print(json.dumps({"accelforge": version, "python": sys.version.split()[0],
                      "workload": args.workload}), flush=True)
    text = (chain_workload(args.tokens, args.width, args.products) if args.workload == "chain"
            else block_workload(args.tokens, args.width, args.heads, args.hidden))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "workload.yaml").write_text(text)
        os.chdir(work)  # the mapper writes mapping.svg into the working directory
        for size in (int(s) for s in args.bytes.split(",")):
            try:
                row = run(size, work)
            except Exception as exc:  # one size failing leaves the others' rows
                row = {"buffer_bytes": size, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(row), flush=True)  # one line per size, as each is done


if __name__ == "__main__":
    main()
