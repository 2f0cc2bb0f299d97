#!/usr/bin/env python3
"""Export the test zoo of current architectures from PyTorch, weights as placeholders.

Needs the optional ``export`` extra (torch, torchvision, onnxscript) in a venv of its own:

    python3 -m venv /tmp/exportenv
    /tmp/exportenv/bin/pip install -e ".[export]"      # or torch==2.14.1 torchvision==0.29.1
    /tmp/exportenv/bin/python examples/exports/export_models.py [NAME ...]

Neither ``make demo`` nor ``make test`` needs torch: the exported files are committed.

Each model is exported with torch's TorchScript exporter (the one most deployed graphs
came through: Shape/Gather/Concat chains for dynamic sizes, Erf-GELU, HardSwish, folded
BatchNorm) with the batch, height and width dynamic, so tests bind small sizes and bench
binds the real ones. Every float initializer of more than 64 elements is then replaced by a
``ConstantOfShape`` node, as the onnx model zoo's "light" files do: the files stay a few
hundred KiB, and ``fuseplan verify`` fills seeded random weights (planner.front.onnx_load
``weights_are_placeholders``).

The models (torchvision builds, random init; ``dbnet_se`` and ``unet`` are defined here):

* ``mobilenet_v3_small``   squeeze-excite with HardSigmoid, HardSwish
* ``efficientnet_b0``      MBConv with squeeze-excite and SiLU
* ``regnet_y_400mf``       grouped convs with squeeze-excite
* ``convnext_tiny``        channels-last blocks: Permute, LayerNorm, Linear, Erf-GELU
* ``lraspp_mobilenet_v3``  LR-ASPP segmentation: a pooling branch gating the head, bilinear Resize
* ``deeplabv3_mobilenet``  DeepLabV3: dilated ASPP convs, global-pool branch, Concat
* ``ssdlite_backbone``     SSDLite's MobileNetV3 feature extractor with its extra layers, 6 outputs
* ``unet``                 a 4-level UNet: long skip connections, nearest upsampling, Concat
* ``dbnet_se``             a DBNet-style text detector: MobileNetV3 backbone with squeeze-excite,
                           FPN with upsample and Concat, probability and threshold heads
* ``deit_tiny``            a ViT as timm writes it (DeiT-tiny's sizes): qkv Linear, Reshape and
                           Permute into heads, q @ k^T, Softmax, @ v, Erf-GELU MLP; 224x224 only
* ``vit_b_16``             torchvision's ViT-B/16 (nn.MultiheadAttention); 224x224 only
* ``swin_t``               torchvision's Swin-T: shifted windows (Roll as Slice and Concat),
                           window partition by Reshape and Permute, relative position bias;
                           224x224 only
* ``mobilevit_like``       a MobileViT-XXS-like hybrid: inverted residuals, then MobileViT
                           blocks (conv, unfold into 2x2 patches, transformer, fold, fuse)
* ``text_recognizer``      a CNN + transformer text recognizer (SVTR-like): conv backbone to
                           one row at stride 4, columns as tokens, encoder, per-token logits;
                           usual input 32x320
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

HERE = Path(__file__).resolve().parent
OPSET = 17
PLACEHOLDER_MIN_ELEMS = 64


# --------------------------------------------------------------------------- own models


class _SE(nn.Module):
    """Squeeze-excite as PP-OCR and MobileNetV3 write it: pool, 1x1 reduce, 1x1 expand, gate."""

    def __init__(self, ch: int, reduce: int = 4) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(ch, ch // reduce, 1)
        self.fc2 = nn.Conv2d(ch // reduce, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.fc1(self.pool(x)))
        return x * nn.functional.hardsigmoid(self.fc2(s))


class _Block(nn.Module):
    """Inverted residual: expand 1x1, depthwise kxk (stride), SE, project 1x1."""

    def __init__(self, cin: int, cout: int, expand: int, stride: int | tuple[int, int],
                 se: bool) -> None:
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish(),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
            nn.Hardswish(),
            _SE(mid) if se else nn.Identity(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class DBNetSE(nn.Module):
    """DBNet-style text detector (as PP-OCR's det models): an SE MobileNetV3-like backbone
    giving strides 4, 8, 16 and 32, an FPN that upsamples every level to stride 4 and
    concatenates them, and a head giving the probability and threshold maps at full size."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.Hardswish())
        self.stage1 = nn.Sequential(_Block(16, 16, 2, 1, False), _Block(16, 24, 3, 2, False))
        self.stage2 = nn.Sequential(_Block(24, 40, 3, 2, True), _Block(40, 40, 3, 1, True))
        self.stage3 = nn.Sequential(_Block(40, 80, 3, 2, False), _Block(80, 96, 3, 1, True))
        self.stage4 = nn.Sequential(_Block(96, 160, 3, 2, True), _Block(160, 160, 3, 1, True))
        self.lateral = nn.ModuleList(nn.Conv2d(c, 64, 1, bias=False) for c in (24, 40, 96, 160))
        self.smooth = nn.ModuleList(nn.Conv2d(64, 16, 3, 1, 1, bias=False) for _ in range(4))
        self.heads = nn.ModuleList(self._head() for _ in range(2))

    @staticmethod
    def _head() -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(64, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.ConvTranspose2d(16, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.ConvTranspose2d(16, 1, 2, 2), nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c2 = self.stage1(self.stem(x))
        c3 = self.stage2(c2)
        c4 = self.stage3(c3)
        c5 = self.stage4(c4)
        levels = [lat(c) for lat, c in zip(self.lateral, (c2, c3, c4, c5), strict=True)]
        for i in (2, 1, 0):  # top-down pathway
            levels[i] = levels[i] + nn.functional.interpolate(levels[i + 1], scale_factor=2.0,
                                                              mode="nearest")
        outs = [sm(level) for sm, level in zip(self.smooth, levels, strict=True)]
        fused = torch.cat([nn.functional.interpolate(o, scale_factor=float(2 ** i),
                                                     mode="nearest") if i else o
                           for i, o in enumerate(outs)], dim=1)
        return self.heads[0](fused), self.heads[1](fused)


class UNet(nn.Module):
    """A 4-level UNet: long skip connections concatenated after nearest upsampling."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        chans = [width * 2 ** i for i in range(4)]
        self.down = nn.ModuleList()
        cin = 3
        for c in chans:
            self.down.append(self._double(cin, c))
            cin = c
        self.bottom = self._double(chans[-1], chans[-1] * 2)
        self.up = nn.ModuleList()
        cin = chans[-1] * 2
        for c in reversed(chans):
            self.up.append(self._double(cin + c, c))
            cin = c
        self.out = nn.Conv2d(chans[0], 2, 1)

    @staticmethod
    def _double(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.bottom(x)
        for block, skip in zip(self.up, reversed(skips), strict=True):
            x = nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
            x = block(torch.cat([x, skip], dim=1))
        return self.out(x)


class _Attention(nn.Module):
    """Multi-head self-attention as timm's ViT writes it: one qkv Linear, Reshape and Permute
    into heads, q @ k^T scaled, Softmax, @ v, heads back into channels, a proj Linear."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _EncoderBlock(nn.Module):
    """Pre-norm transformer block: x + attention(LN(x)), then x + MLP(LN(x)), exact GELU."""

    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DeiT(nn.Module):
    """A ViT / DeiT as timm builds it (``deit_tiny_patch16_224``: width 192, 3 heads, 12
    blocks): 16x16 patch embedding as a strided Conv, Flatten and Transpose into tokens, a
    class token concatenated in front, a learned position embedding added, the encoder
    blocks, a final LayerNorm and the head on the class token."""

    def __init__(self, dim: int = 192, heads: int = 3, depth: int = 12, size: int = 224,
                 patch: int = 16, classes: int = 1000) -> None:
        super().__init__()
        tokens = (size // patch) ** 2 + 1
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*(_EncoderBlock(dim, heads, 4 * dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


class _MobileViTBlock(nn.Module):
    """MobileViT's block: a local 3x3 and 1x1 conv, the map unfolded into 2x2 patches (each
    of the four pixel positions a sequence over the patches: Reshape and Transpose), a
    transformer over every sequence, folded back, projected and fused with the input."""

    def __init__(self, cin: int, dim: int, depth: int, heads: int = 2, patch: int = 2) -> None:
        super().__init__()
        self.patch = patch
        self.local = nn.Sequential(nn.Conv2d(cin, cin, 3, 1, 1, bias=False),
                                   nn.BatchNorm2d(cin), nn.SiLU(),
                                   nn.Conv2d(cin, dim, 1, bias=False))
        self.blocks = nn.Sequential(*(_EncoderBlock(dim, heads, 2 * dim)
                                      for _ in range(depth)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.project = nn.Sequential(nn.Conv2d(dim, cin, 1, bias=False), nn.BatchNorm2d(cin),
                                     nn.SiLU())
        self.fuse = nn.Sequential(nn.Conv2d(2 * cin, cin, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cin), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        b, c, h, w = y.shape
        p = self.patch
        # [B, C, H, W] -> [B * p * p, (H / p) * (W / p), C]: one sequence per pixel position
        t = y.reshape(b, c, h // p, p, w // p, p).permute(0, 3, 5, 2, 4, 1)
        t = t.reshape(b * p * p, (h // p) * (w // p), c)
        t = self.norm(self.blocks(t))
        y = t.reshape(b, p, p, h // p, w // p, c).permute(0, 5, 3, 1, 4, 2).reshape(b, c, h, w)
        return self.fuse(torch.cat([x, self.project(y)], dim=1))


class MobileViTLike(nn.Module):
    """A MobileViT-XXS-like hybrid: a strided conv stem, inverted residuals (MobileNetV2),
    MobileViT blocks at strides 8, 16 and 32, a 1x1 conv, global pool and classifier."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.SiLU())
        self.body = nn.Sequential(
            _Block(16, 16, 2, 1, False), _Block(16, 24, 2, 2, False), _Block(24, 24, 2, 1, False),
            _Block(24, 48, 2, 2, False), _MobileViTBlock(48, 64, 2),
            _Block(48, 64, 2, 2, False), _MobileViTBlock(64, 80, 4),
            _Block(64, 80, 2, 2, False), _MobileViTBlock(80, 96, 3),
            nn.Conv2d(80, 320, 1, bias=False), nn.BatchNorm2d(320), nn.SiLU())
        self.head = nn.Linear(320, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)).mean((2, 3)))


class TextRecognizer(nn.Module):
    """A CNN + transformer text recognizer (as SVTR / PP-OCRv4's rec models): a conv
    backbone takes a 32-pixel-high text line to one row of features at stride 4 along the
    width, the columns become tokens [B, W/4, C], two encoder blocks, and a Linear gives
    each token's character logits (97 classes, CTC-style)."""

    def __init__(self, dim: int = 128, classes: int = 97) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.Hardswish(),
            _Block(32, 32, 2, 1, True), _Block(32, 64, 3, (2, 1), False),
            _Block(64, 64, 3, 1, True), _Block(64, 96, 3, (2, 1), False),
            _Block(96, dim, 3, (2, 1), True))
        self.blocks = nn.Sequential(*(_EncoderBlock(dim, 4, 2 * dim) for _ in range(2)))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.backbone(x).mean(2).transpose(1, 2)  # the rows pooled: [B, W/4, C]
        return self.head(self.norm(self.blocks(t)))


class _Outputs(nn.Module):
    """Return a dict-returning torchvision model's tensors as a tuple (exporters want one)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(x)
        keys = self.keys or tuple(out)
        return tuple(out[k] for k in keys)


# --------------------------------------------------------------------------- the zoo


def _tv(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision  # lazily: export_zoo2026 imports this module without torchvision
        return getattr(torchvision.models, name)(weights=None)
    return build


def _seg(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import torchvision
        return _Outputs(getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, aux_loss=False), ("out",))
    return build


def _ssdlite_backbone() -> nn.Module:
    import torchvision
    det = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None)
    return _Outputs(det.backbone)


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, int]]] = {
    "mobilenet_v3_small": (_tv("mobilenet_v3_small"), (224, 224)),
    "efficientnet_b0": (_tv("efficientnet_b0"), (224, 224)),
    "regnet_y_400mf": (_tv("regnet_y_400mf"), (224, 224)),
    "convnext_tiny": (_tv("convnext_tiny"), (224, 224)),
    "lraspp_mobilenet_v3": (_seg("lraspp_mobilenet_v3_large"), (512, 512)),
    "deeplabv3_mobilenet": (_seg("deeplabv3_mobilenet_v3_large"), (512, 512)),
    "ssdlite_backbone": (_ssdlite_backbone, (320, 320)),
    "unet": (UNet, (256, 256)),
    "dbnet_se": (DBNetSE, (640, 640)),
    "deit_tiny": (DeiT, (224, 224)),
    "vit_b_16": (_tv("vit_b_16"), (224, 224)),
    "swin_t": (_tv("swin_t"), (224, 224)),
    "mobilevit_like": (MobileViTLike, (256, 256)),
    "text_recognizer": (TextRecognizer, (32, 320)),
}
"""Name -> (builder, the size it is usually run at; bench uses it, tests bind smaller)."""
FIXED_SIZE = frozenset({"deit_tiny", "vit_b_16", "swin_t"})


def export(name: str, out_dir: Path) -> Path:
    """Export one model with dynamic N, H, W and placeholder weights; return its path."""
    import torchvision  # only for its version in the doc string (see _tv)
    build, (h, w) = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    example = torch.randn(1, 3, h, w)
    with torch.no_grad():
        outputs = model(example)
    n_out = len(outputs) if isinstance(outputs, tuple) else 1
    out_names = [f"output{i}" for i in range(n_out)] if n_out > 1 else ["output"]
    # a transformer's position embedding fixes its image size: only the batch is dynamic
    axes = {"input": {0: "N"} if name in FIXED_SIZE else {0: "N", 2: "H", 3: "W"}}
    path = out_dir / f"{name}.onnx"
    torch.onnx.export(model, (example,), str(path), input_names=["input"],
                      output_names=out_names, dynamic_axes=axes, opset_version=OPSET,
                      do_constant_folding=True, dynamo=False)
    proto = onnx.load(str(path))
    placeholder_weights(proto)
    proto.doc_string = (f"fuseplan test zoo: {name} exported by examples/exports/"
                        f"export_models.py (torch {torch.__version__}, torchvision "
                        f"{torchvision.__version__}); usual input 1x3x{h}x{w}; weights are "
                        "ConstantOfShape placeholders")
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


def placeholder_weights(proto: onnx.ModelProto) -> None:
    """Replace each big float initializer by a ConstantOfShape node of the same shape."""
    keep, nodes = [], []
    for init in proto.graph.initializer:
        elems = 1
        for d in init.dims:
            elems *= d
        if init.data_type != TensorProto.FLOAT or elems <= PLACEHOLDER_MIN_ELEMS:
            keep.append(init)
            continue
        shape_name = f"{init.name}__shape"
        keep.append(numpy_helper.from_array(
            np.asarray(list(init.dims), dtype=np.int64), shape_name))
        nodes.append(helper.make_node(
            "ConstantOfShape", [shape_name], [init.name], name=f"{init.name}__placeholder",
            value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.01])))
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    graph_nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes + graph_nodes)


def export_named(argv: list[str], models: Collection[str],
                 export_one: Callable[[str, Path], Path], out_dir: Path) -> int:
    """Export the models `argv` names (all of `models` when none) into `out_dir`, a line
    each; 2 when a name is unknown (the command line of this script and export_zoo2026)."""
    names = argv or list(models)
    unknown = [n for n in names if n not in models]
    if unknown:
        sys.stderr.write(f"unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(models)}\n")
        return 2
    out_dir.mkdir(exist_ok=True)
    for name in names:
        path = export_one(name, out_dir)
        sys.stdout.write(f"{path.relative_to(HERE.parent.parent)}  "
                         f"{path.stat().st_size / 1024:.0f} KiB\n")
    return 0


def main(argv: list[str]) -> int:
    return export_named(argv, MODELS, export, HERE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
