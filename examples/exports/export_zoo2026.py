#!/usr/bin/env python3
"""Export the second test zoo (issue 42): current architectures, weights as placeholders.

Needs torch (2.13 CPU or later; no torchvision) and onnxscript in a venv of its own:

    python3 -m venv /tmp/exportenv
    /tmp/exportenv/bin/pip install torch==2.13.0 onnx onnxscript numpy
    /tmp/exportenv/bin/python examples/exports/export_zoo2026.py [NAME ...]

Neither ``make demo`` nor ``make test`` needs torch: the exported files are committed, in
``examples/exports/zoo2026/`` (the first zoo's test asserts which files sit beside it).

Every model is written here as its reference code writes it (small widths and depths, real
structure), exported like the first zoo (export_models.py): the TorchScript exporter, opset
17, constant folding, every float initializer of more than 64 elements replaced by a
``ConstantOfShape`` placeholder. Shapes are fixed unless the model is usually exported with
dynamic axes (the two text transformers: batch ``N`` and sequence ``S``, as Hugging Face's
exports have them; bind them with ``--shape input_ids=1,128``).

The models and their inputs (the classes are in zoo2026_vision.py and zoo2026_text.py):

* ``audio_encoder``     Whisper-tiny-like encoder: Conv1d stem (80 mels -> 384, k3; k3 stride
                        2), GELU, sinusoidal position table, 2 pre-LN blocks with Whisper's own
                        attention (q, k, v Linears, k without bias, both scaled by d^-1/4).
                        ``mel`` [1, 80, 3000]
* ``segformer_block``   SegFormer (MiT-B0-like) stages 1 and 2: overlapping patch embeds,
                        efficient self-attention with spatial reduction (a stride-R conv and a
                        LayerNorm on K/V), Mix-FFN (Linear, depthwise 3x3 on the tokens
                        reshaped to an image, GELU, Linear), all-MLP decode head with bilinear
                        upsampling. ``input`` [1, 3, 256, 256]
* ``vit_518``           DINOv2-like ViT-S/14 at 518x518 (width 192, depth 3): 14-pixel patches
                        (37x37 = 1369 tokens), class token, position embedding, LayerScale;
                        outputs the normed class token and patch tokens. ``input`` [1, 3, 518, 518]
* ``detector_head``     YOLOv8n-like detector: Conv-BN-SiLU backbone with C2f (Split, Concat)
                        and SPPF, strides 8, 16 and 32, the anchor-free Detect head: per scale
                        box and class branches, Reshape [1, 144, H*W], Concat to [1, 144, 8400],
                        DFL (Reshape [1, 4, 16, N], Transpose, Softmax, 1x1 conv with arange
                        weights), dist2bbox with anchors and strides, Sigmoid scores.
                        ``images`` [1, 3, 640, 640]
* ``diffusion_unet``    Stable-Diffusion-like UNet slice: conv_in, ResBlocks (GroupNorm(32),
                        SiLU, time embedding Linear added as [N, C, 1, 1]), a spatial
                        transformer at 64x64 (GroupNorm, proj in, self-attention,
                        cross-attention to the text context, GEGLU FF, proj out), a strided
                        downsample, a nearest upsample, a skip Concat. ``sample`` [1, 4, 64, 64],
                        ``t_emb`` [1, 128] (sinusoidal timestep features), ``context``
                        [1, 77, 256]
* ``bert_encoder``      BERT as Hugging Face writes it (hidden 256, 4 heads, 2 layers): word,
                        position and token-type embedding Gathers; position ids a registered
                        buffer sliced to the sequence, token-type ids gathered along them
                        (``torch.gather``: GatherElements), the additive attention mask built
                        in the graph, the pooler. ``input_ids`` [N, S] int64, usually [1, 128]
* ``llama_block``       Llama-style decoder (dim 512, 8 heads, 2 KV heads, 2 layers, prefill):
                        embedding Gather, RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal,
                        Mul), rotary embedding computed from position ids (MatMul, Cos, Sin)
                        and applied with rotate_half (Slice, Neg, Concat), grouped-query
                        attention with repeat_kv (Unsqueeze, Expand, Reshape), a causal mask
                        by Trilu, SwiGLU MLP. ``input_ids`` [N, S] int64, usually [1, 512]
* ``llama_decode``      one decode step of ``llama_block`` with a KV cache: ``input_ids``
                        [1, 1] int64 and each layer's ``past_key_values.i.key``/``value``
                        [1, 2, 1024, 64] in; the hidden state and ``present.i.key``/``value``
                        [1, 2, 1025, 64] (past and new positions concatenated) out
* ``llama_decode_b8``   the same step for a batch of 8 sequences, each with its own cache
                        (``input_ids`` [8, 1], caches [8, 2, 1024, 64])
* ``maxvit_like``       MaxViT-like hybrid at 224: conv stem, per stage an MBConv (squeeze-
                        excite), block attention (7x7 windows by Reshape and Permute) and grid
                        attention (the strided 7x7 grid), each with relative position bias
                        and an MLP; two stages, pooled head. ``input`` [1, 3, 224, 224]
* ``convnextv2_block``  ConvNeXt-V2-atto-like: channels-first LayerNorm written out, blocks of
                        depthwise 7x7, Permute to channels last, LayerNorm, Linear, GELU, GRN
                        (torch.norm over H and W: ReduceL2; mean over channels; gamma and
                        beta), Linear, Permute back; two stages. ``input`` [1, 3, 224, 224]
* ``text_recognizer_t`` an LPRNet-like recognizer whose backbone keeps a 40x120 gray text line
                        at full size and ends in one channel; a Transpose [1, 1, 40, 120] ->
                        [1, 120, 1, 40] moves the width to the channel axis, where 1x1 convs
                        mix the columns into 32 character slots, and a Linear over the height
                        gives each slot's logits. ``input`` [1, 1, 40, 120]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from export_models import OPSET, export_named, placeholder_weights
from torch import nn
from zoo2026_text import AudioEncoder, BertEncoder, DiffusionUNet, LlamaDecode, LlamaLike
from zoo2026_vision import (
    ConvNeXtV2,
    DinoViT,
    MaxViTLike,
    SegFormer,
    TextRecognizerT,
    YoloV8Like,
)

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "zoo2026"


# --------------------------------------------------------------------------- the zoo


@dataclass(frozen=True)
class Entry:
    """How to build and export one model: its example inputs (name -> shape, int64 when the
    input takes token ids), output names and the axes left dynamic."""

    build: Callable[[], nn.Module]
    inputs: tuple[tuple[str, tuple[int, ...], bool], ...]
    outputs: tuple[str, ...]
    dynamic: tuple[tuple[str, tuple[tuple[int, str], ...]], ...] = ()


MODELS: dict[str, Entry] = {
    "audio_encoder": Entry(AudioEncoder, (("mel", (1, 80, 3000), False),), ("output",)),
    "segformer_block": Entry(SegFormer, (("input", (1, 3, 256, 256), False),), ("output",)),
    "vit_518": Entry(DinoViT, (("input", (1, 3, 518, 518), False),),
                     ("cls_token", "patch_tokens")),
    "detector_head": Entry(YoloV8Like, (("images", (1, 3, 640, 640), False),), ("output0",)),
    "diffusion_unet": Entry(DiffusionUNet, (("sample", (1, 4, 64, 64), False),
                                            ("t_emb", (1, 128), False),
                                            ("context", (1, 77, 256), False)), ("out_sample",)),
    "bert_encoder": Entry(BertEncoder, (("input_ids", (1, 128), True),),
                          ("last_hidden_state", "pooler_output"),
                          (("input_ids", ((0, "N"), (1, "S"))),
                           ("last_hidden_state", ((0, "N"), (1, "S"))),
                           ("pooler_output", ((0, "N"),)))),
    "llama_block": Entry(LlamaLike, (("input_ids", (1, 512), True),), ("last_hidden_state",),
                         (("input_ids", ((0, "N"), (1, "S"))),
                          ("last_hidden_state", ((0, "N"), (1, "S"))))),
    "llama_decode": Entry(LlamaDecode, (("input_ids", (1, 1), True),
                                        *((f"past_key_values.{i}.{kv}", (1, 2, 1024, 64), False)
                                          for i in range(2) for kv in ("key", "value"))),
                          ("last_hidden_state",
                           *(f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")))),
    "llama_decode_b8": Entry(LlamaDecode, (("input_ids", (8, 1), True),
                                           *((f"past_key_values.{i}.{kv}", (8, 2, 1024, 64),
                                              False)
                                             for i in range(2) for kv in ("key", "value"))),
                             ("last_hidden_state",
                              *(f"present.{i}.{kv}" for i in range(2)
                                for kv in ("key", "value")))),
    "maxvit_like": Entry(MaxViTLike, (("input", (1, 3, 224, 224), False),), ("output",)),
    "convnextv2_block": Entry(ConvNeXtV2, (("input", (1, 3, 224, 224), False),), ("output",)),
    "text_recognizer_t": Entry(TextRecognizerT, (("input", (1, 1, 40, 120), False),),
                               ("output",)),
}
"""Name -> how it is built and exported (the shapes given are the usual ones)."""


def export(name: str, out_dir: Path) -> Path:
    """Export one model with placeholder weights; return its path."""
    entry = MODELS[name]
    torch.manual_seed(0)
    model = entry.build().eval()
    example = tuple(torch.zeros(shape, dtype=torch.long) if ids else torch.randn(shape)
                    for _, shape, ids in entry.inputs)
    path = out_dir / f"{name}.onnx"
    with torch.no_grad():
        torch.onnx.export(model, example, str(path),
                          input_names=[n for n, _, _ in entry.inputs],
                          output_names=list(entry.outputs),
                          dynamic_axes={k: dict(v) for k, v in entry.dynamic} or None,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)
    proto = onnx.load(str(path))
    placeholder_weights(proto)
    usual = ", ".join(f"{n} {'x'.join(map(str, s))}" for n, s, _ in entry.inputs)
    proto.doc_string = (f"fuseplan test zoo 2026: {name} exported by examples/exports/"
                        f"export_zoo2026.py (torch {torch.__version__}); usual input "
                        f"{usual}; weights are ConstantOfShape placeholders")
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


def main(argv: list[str]) -> int:
    return export_named(argv, MODELS, export, OUT_DIR)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
