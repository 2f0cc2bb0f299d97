#!/usr/bin/env python3
"""Stack a decoder's layer into a deep decoder, by graph surgery on a one-layer export.

A 32-layer decoder at 7B width cannot be exported here: torch would hold 6.7 billion
float32 weights (27 GB) and the ONNX protobuf stops at 2 GB. Its layers are all alike,
though, so one layer exported by torch (examples/exports/export_zoo2026.py's ``LlamaDecode``
with ``layers=1``: embedding, rotary tables, one decoder layer, final RMSNorm; weights already
``ConstantOfShape`` placeholders) is copied N times: every node that depends on the hidden
state or the layer's KV cache, and every placeholder weight it reads, is repeated with its
tensors renamed per layer, each copy reading the previous copy's hidden state and its own
cache inputs and writing its own present keys and values. The embedding, the rotary tables
(shared by every layer, as in the model) and the final norm stay single.

    python examples/exports/stack_layers.py ONE_LAYER.onnx N OUT.onnx
    /tmp/exportenv/bin/python examples/exports/stack_layers.py --llama7b

``--llama7b`` (torch, as export_zoo2026.py) exports the one layer at Llama-2-7B's width (4096,
32 heads and 32 key heads of 128, SwiGLU 11008, vocabulary 32000; caches of 1,024 positions)
and writes the committed ``examples/exports/llm/llama7b_decode_32.onnx`` (32 layers: plans,
too big to run here) and ``llama7b_decode_2.onnx`` (2 layers: plans and verifies).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import onnx
from onnx import helper

CACHE = ("past_key_values.0.key", "past_key_values.0.value")
PRESENT = ("present.0.key", "present.0.value")


def _layer_nodes(graph: onnx.GraphProto, hidden: str) -> tuple[list[int], str]:
    """(indices of the nodes of the one layer, the tensor the final norm reads)."""
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    norm_in = next(n.input[0] for n in graph.node if n.name == "/norm/Cast")
    live = {hidden, *CACHE}
    layer: list[int] = []
    for i, n in enumerate(graph.node):
        if n.name.startswith("/norm/"):
            continue
        if any(t in live for t in n.input):
            layer.append(i)
            live.update(n.output)
    # the placeholder weights the layer reads (one set per layer), not the shared tables;
    # torch writes a weight equal to another as an Identity of it: copied too
    reads = {t for i in layer for t in graph.node[i].input}
    weights: set[int] = set()
    for t in reads:
        at = producer.get(t)
        while at is not None and graph.node[at].op_type in ("ConstantOfShape", "Identity"):
            weights.add(at)
            node = graph.node[at]
            at = producer.get(node.input[0]) if node.op_type == "Identity" else None
    return sorted({*layer, *weights}), norm_in


def stack(model: onnx.ModelProto, layers: int) -> onnx.ModelProto:
    """The model with its one decoder layer repeated `layers` times (`model` unchanged)."""
    copied = onnx.ModelProto()
    copied.CopyFrom(model)
    model = copied
    graph = model.graph
    hidden = "/embed_tokens/Gather_output_0"
    picked, last = _layer_nodes(graph, hidden)
    inside = {o for i in picked for o in graph.node[i].output}
    shape_inputs = {t for i in picked if graph.node[i].op_type == "ConstantOfShape"
                    for t in graph.node[i].input}
    copies: list[onnx.NodeProto] = []
    inputs = [i for i in graph.input if i.name not in CACHE]
    outputs = [o for o in graph.output if o.name not in PRESENT]
    cache_info = {i.name: i for i in graph.input if i.name in CACHE}
    present_info = {o.name: o for o in graph.output if o.name in PRESENT}
    x = hidden
    for k in range(layers):
        rename = {t: f"/layers.{k}{t}" if t.startswith("/") else f"layers.{k}.{t}"
                  for t in inside}
        rename.update({c: f"past_key_values.{k}.{c.split('.')[-1]}" for c in CACHE})
        rename.update({p: f"present.{k}.{p.split('.')[-1]}" for p in PRESENT})
        rename[hidden] = x
        for i in picked:
            n = graph.node[i]
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = f"/layers.{k}{n.name}" if n.name.startswith("/") else \
                f"layers.{k}.{n.name}"
            copy.ClearField("input")
            copy.ClearField("output")
            copy.input.extend(t if t in shape_inputs else rename.get(t, t) for t in n.input)
            copy.output.extend(rename.get(t, t) for t in n.output)
            copies.append(copy)
        for c in CACHE:
            info = onnx.ValueInfoProto()
            info.CopyFrom(cache_info[c])
            info.name = rename[c]
            inputs.append(info)
        for p in PRESENT:
            info = onnx.ValueInfoProto()
            info.CopyFrom(present_info[p])
            info.name = rename[p]
            outputs.append(info)
        x = rename[last]
    # what no layer depends on (the embedding, the rotary tables, constants) goes first,
    # the final norm last
    chosen = set(picked)
    # (a weight the final norm shares with a layer stays as it was, beside the copies)
    shared = [n for i, n in enumerate(graph.node)
              if (i not in chosen or n.op_type in ("ConstantOfShape", "Identity"))
              and not n.name.startswith("/norm/")]
    after = [n for n in graph.node if n.name.startswith("/norm/")]
    for n in after:  # the final norm reads the last layer's hidden state
        n.input[:] = [x if t == last else t for t in n.input]
    before = shared
    out_graph = helper.make_graph([*before, *copies, *after], graph.name, inputs, outputs,
                                  list(graph.initializer))
    stacked = helper.make_model(out_graph, opset_imports=list(model.opset_import))
    stacked.doc_string = (f"{model.doc_string}; its one decoder layer stacked {layers} times by "
                          "examples/exports/stack_layers.py")
    onnx.checker.check_model(stacked)
    return stacked


def export_llama7b(out_dir: Path) -> list[Path]:
    """Export the one layer at 7B width with torch and stack it to 32 and to 2 layers."""
    import export_zoo2026 as zoo  # torch: the export venv only
    from zoo2026_text import LlamaDecode

    past = tuple((f"past_key_values.0.{kv}", (1, 32, 1024, 128), False)
                 for kv in ("key", "value"))
    zoo.MODELS["llama7b_decode_layer"] = zoo.Entry(
        lambda: LlamaDecode(dim=4096, heads=32, kv_heads=32, inter=11008, layers=1),
        (("input_ids", (1, 1), True), *past), ("last_hidden_state", *PRESENT))
    out_dir.mkdir(exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        one = onnx.load(str(zoo.export("llama7b_decode_layer", Path(tmp))))
        for layers in (32, 2):
            path = out_dir / f"llama7b_decode_{layers}.onnx"
            onnx.save(stack(one, layers), str(path))
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    if argv == ["--llama7b"]:
        for path in export_llama7b(Path(__file__).resolve().parent / "llm"):
            print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")
        return 0
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    onnx.save(stack(onnx.load(argv[0]), int(argv[1])), argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
