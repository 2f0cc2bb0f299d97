"""Vision models of the 2026 test zoo (export_zoo2026.py): SegFormer, a DINOv2-like ViT, a
YOLOv8-like detector, MaxViT, ConvNeXt-V2 and a width-to-channels text recognizer, written
as their reference code writes them."""

from __future__ import annotations

import torch
from export_models import _SE, _Attention
from torch import nn
from torch.nn import functional as F

# --------------------------------------------------------------------------- segformer_block


class _OverlapPatchEmbed(nn.Module):
    def __init__(self, cin: int, dim: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, kernel, stride, kernel // 2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        _, _, h, w = x.shape
        return self.norm(x.flatten(2).transpose(1, 2)), h, w


class _EfficientAttention(nn.Module):
    """SegFormer's Attention: q Linear on every token; K and V from the token map reshaped
    to an image, reduced by a stride-R conv and LayerNorm, one kv Linear."""

    def __init__(self, dim: int, heads: int, sr_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, c // self.heads).permute(0, 2, 1, 3)
        x_ = self.sr(x.permute(0, 2, 1).reshape(b, c, h, w)).reshape(b, c, -1).permute(0, 2, 1)
        kv = self.kv(self.norm(x_)).reshape(b, -1, 2, self.heads, c // self.heads)
        k, v = kv.permute(2, 0, 3, 1, 4)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _MixFFN(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = self.fc1(x)
        b, n, c = x.shape
        x = self.dwconv(x.transpose(1, 2).view(b, c, h, w)).flatten(2).transpose(1, 2)
        return self.fc2(F.gelu(x))


class _SegFormerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, sr_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _EfficientAttention(dim, heads, sr_ratio)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _MixFFN(dim, 4 * dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), h, w)
        return x + self.mlp(self.norm2(x), h, w)


class SegFormer(nn.Module):
    """MiT-B0's first two stages (32 and 64 wide, SR ratios 8 and 4, 2 blocks each) and the
    all-MLP decode head (per-stage Linear to 128, bilinear upsampling to stride 4, Concat,
    1x1 fuse conv with BN and ReLU, 19-class classifier)."""

    def __init__(self, dims: tuple[int, ...] = (32, 64), heads: tuple[int, ...] = (1, 2),
                 srs: tuple[int, ...] = (8, 4), depth: int = 2, embed: int = 128,
                 classes: int = 19) -> None:
        super().__init__()
        self.patch_embeds = nn.ModuleList([_OverlapPatchEmbed(3, dims[0], 7, 4),
                                           _OverlapPatchEmbed(dims[0], dims[1], 3, 2)])
        self.stages = nn.ModuleList(
            nn.ModuleList(_SegFormerBlock(d, hd, sr) for _ in range(depth))
            for d, hd, sr in zip(dims, heads, srs, strict=True))
        self.norms = nn.ModuleList(nn.LayerNorm(d) for d in dims)
        self.linear_c = nn.ModuleList(nn.Linear(d, embed) for d in dims)
        self.fuse = nn.Sequential(nn.Conv2d(embed * len(dims), embed, 1, bias=False),
                                  nn.BatchNorm2d(embed), nn.ReLU())
        self.classifier = nn.Conv2d(embed, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        feats = []
        for embed, blocks, norm in zip(self.patch_embeds, self.stages, self.norms, strict=True):
            x, h, w = embed(x)
            for block in blocks:
                x = block(x, h, w)
            x = norm(x).reshape(b, h, w, -1).permute(0, 3, 1, 2).contiguous()
            feats.append(x)
        size = feats[0].shape[2:]
        decoded = []
        for lin, f in zip(self.linear_c, feats, strict=True):
            _, _, h, w = f.shape
            y = lin(f.flatten(2).transpose(1, 2)).permute(0, 2, 1).reshape(b, -1, h, w)
            if y.shape[2:] != size:
                y = F.interpolate(y, size=size, mode="bilinear", align_corners=False)
            decoded.append(y)
        return self.classifier(self.fuse(torch.cat(decoded[::-1], dim=1)))


# --------------------------------------------------------------------------- vit_518


class _LayerScaleBlock(nn.Module):
    """DINOv2's NestedTensorBlock without the nesting: x + ls1 * attn(norm1(x)),
    x + ls2 * mlp(norm2(x)); the attention is timm's (export_models._Attention)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim, heads)
        self.ls1 = nn.Parameter(torch.full((dim,), 1e-5))
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ls2 = nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1 * self.attn(self.norm1(x))
        return x + self.ls2 * self.mlp(self.norm2(x))


class DinoViT(nn.Module):
    """DINOv2's DinoVisionTransformer at 518x518, patch 14 (no registers, no interpolation:
    the position embedding is made for 37x37 patches)."""

    def __init__(self, dim: int = 192, heads: int = 3, depth: int = 3, size: int = 518,
                 patch: int = 14) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(_LayerScaleBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return x[:, 0], x[:, 1:]


# --------------------------------------------------------------------------- detector_head


class _ConvBNSiLU(nn.Module):
    """Ultralytics' Conv: Conv2d (no bias), BatchNorm, SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class _Bottleneck(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.cv1 = _ConvBNSiLU(ch, ch, 3)
        self.cv2 = _ConvBNSiLU(ch, ch, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.cv2(self.cv1(x))


class _C2f(nn.Module):
    """Ultralytics' C2f: 1x1 conv, chunk in two (Split), n bottlenecks on the last piece,
    every piece concatenated, 1x1 conv."""

    def __init__(self, cin: int, cout: int, n: int = 1) -> None:
        super().__init__()
        self.c = cout // 2
        self.cv1 = _ConvBNSiLU(cin, 2 * self.c)
        self.cv2 = _ConvBNSiLU((2 + n) * self.c, cout)
        self.m = nn.ModuleList(_Bottleneck(self.c) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class _SPPF(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.cv1 = _ConvBNSiLU(cin, cin // 2)
        self.cv2 = _ConvBNSiLU(cin // 2 * 4, cout)
        self.m = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class _DFL(nn.Module):
    """Distribution focal loss integral: a frozen 1x1 conv with weights 0..15."""

    def __init__(self, c1: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1)
        self.c1 = c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def _make_anchors(sizes: list[tuple[int, int]], strides: tuple[int, ...]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    points, stride_t = [], []
    for (h, w), s in zip(sizes, strides, strict=True):
        sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride_t.append(torch.full((h * w, 1), float(s)))
    return torch.cat(points).transpose(0, 1), torch.cat(stride_t).transpose(0, 1)


class YoloV8Like(nn.Module):
    """YOLOv8n's backbone widths (16..256) with C2f and SPPF, no neck (P3, P4, P5 straight
    from the backbone), and Ultralytics' Detect head as exported (``export=True``): boxes
    decoded in the graph, output [1, 4 + 80, 8400]."""

    def __init__(self, classes: int = 80, size: int = 640, reg_max: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(_ConvBNSiLU(3, 16, 3, 2), _ConvBNSiLU(16, 32, 3, 2),
                                  _C2f(32, 32))
        self.p3 = nn.Sequential(_ConvBNSiLU(32, 64, 3, 2), _C2f(64, 64, 2))
        self.p4 = nn.Sequential(_ConvBNSiLU(64, 128, 3, 2), _C2f(128, 128, 2))
        self.p5 = nn.Sequential(_ConvBNSiLU(128, 256, 3, 2), _C2f(256, 256), _SPPF(256, 256))
        chans, self.strides = (64, 128, 256), (8, 16, 32)
        self.nc, self.reg_max = classes, reg_max
        self.no = classes + 4 * reg_max
        c2, c3 = max(16, chans[0] // 4, 4 * reg_max), max(chans[0], min(classes, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(_ConvBNSiLU(c, c2, 3), _ConvBNSiLU(c2, c2, 3),
                                               nn.Conv2d(c2, 4 * reg_max, 1)) for c in chans)
        self.cv3 = nn.ModuleList(nn.Sequential(_ConvBNSiLU(c, c3, 3), _ConvBNSiLU(c3, c3, 3),
                                               nn.Conv2d(c3, classes, 1)) for c in chans)
        self.dfl = _DFL(reg_max)
        anchors, strides = _make_anchors([(size // s, size // s) for s in self.strides],
                                         self.strides)
        self.register_buffer("anchors", anchors)
        self.register_buffer("stride_t", strides)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c3 = self.p3(self.stem(x))
        c4 = self.p4(c3)
        feats = [c3, c4, self.p5(c4)]
        b = x.shape[0]
        outs = [torch.cat((self.cv2[i](f), self.cv3[i](f)), 1) for i, f in enumerate(feats)]
        x_cat = torch.cat([xi.view(b, self.no, -1) for xi in outs], 2)
        box, cls = x_cat.split((self.reg_max * 4, self.nc), 1)
        lt, rb = self.dfl(box).chunk(2, 1)  # dist2bbox, xywh
        anchor_points = self.anchors.unsqueeze(0)
        x1y1, x2y2 = anchor_points - lt, anchor_points + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.stride_t
        return torch.cat((dbox, cls.sigmoid()), 1)

# --------------------------------------------------------------------------- maxvit_like


class _RelPosAttention(nn.Module):
    """timm MaxViT's attention over [B', N, C] windows: qkv Linear, heads, q @ k^T scaled
    plus a relative position bias gathered from its table, Softmax, @ v, proj."""

    def __init__(self, dim: int, heads: int, window: int) -> None:
        super().__init__()
        self.attn = _Attention(dim, heads)
        self.heads = heads
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window),
                                            indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
        self.register_buffer("index", rel[..., 0] * (2 * window - 1) + rel[..., 1],
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        a = self.attn
        qkv = a.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        bias = self.table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        attn = ((q * a.scale) @ k.transpose(-2, -1) + bias.unsqueeze(0)).softmax(dim=-1)
        return a.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


def _block_partition(x: torch.Tensor, p: int) -> torch.Tensor:
    """[B, H, W, C] -> [B * H/p * W/p, p*p, C]: contiguous p x p windows."""
    b, h, w, c = x.shape
    x = x.view(b, h // p, p, w // p, p, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, p * p, c)


def _block_reverse(x: torch.Tensor, p: int, h: int, w: int) -> torch.Tensor:
    c = x.shape[-1]
    x = x.view(-1, h // p, w // p, p, p, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


def _grid_partition(x: torch.Tensor, g: int) -> torch.Tensor:
    """[B, H, W, C] -> [B * H/g * W/g, g*g, C]: each window a g x g grid of stride H/g."""
    b, h, w, c = x.shape
    x = x.view(b, g, h // g, g, w // g, c).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(-1, g * g, c)


def _grid_reverse(x: torch.Tensor, g: int, h: int, w: int) -> torch.Tensor:
    c = x.shape[-1]
    x = x.view(-1, h // g, w // g, g, g, c).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(-1, h, w, c)


class _PartitionAttention(nn.Module):
    """One of MaxViT's attention halves, channels last: x + attn(LN(x)) over block or grid
    windows, then x + MLP(LN(x))."""

    def __init__(self, dim: int, heads: int, window: int, grid: bool) -> None:
        super().__init__()
        self.window, self.grid = window, grid
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _RelPosAttention(dim, heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h, w, _ = x.shape
        p = self.window
        part, reverse = ((_grid_partition, _grid_reverse) if self.grid
                         else (_block_partition, _block_reverse))
        x = x + reverse(self.attn(part(self.norm1(x), p)), p, h, w)
        return x + self.mlp(self.norm2(x))


class _MBConv(nn.Module):
    """MaxViT's MBConv: pre-BN, 1x1 expand (x4), depthwise 3x3 (stride), squeeze-excite,
    1x1 project; shortcut by average pool and 1x1 conv when the size or width changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        mid = 4 * cout
        self.body = nn.Sequential(
            nn.BatchNorm2d(cin), nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid),
            nn.GELU(), nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
            nn.BatchNorm2d(mid), nn.GELU(), _SE(mid), nn.Conv2d(mid, cout, 1))
        self.shortcut = nn.Sequential(nn.AvgPool2d(stride) if stride > 1 else nn.Identity(),
                                      nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shortcut(x) + self.body(x)


class _MaxViTBlock(nn.Module):
    def __init__(self, cin: int, cout: int, heads: int, window: int = 7) -> None:
        super().__init__()
        self.conv = _MBConv(cin, cout, 2)
        self.block = _PartitionAttention(cout, heads, window, grid=False)
        self.grid = _PartitionAttention(cout, heads, window, grid=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).permute(0, 2, 3, 1)
        return self.grid(self.block(x)).permute(0, 3, 1, 2)


class MaxViTLike(nn.Module):
    """MaxViT-T's layout at smaller widths: a stride-2 conv stem (64), one MaxViT block per
    stage for two stages (64 at 56x56, 128 at 28x28; head dim 32), pool, LN, classifier."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.GELU(),
                                  nn.Conv2d(64, 64, 3, 1, 1))
        self.stages = nn.Sequential(_MaxViTBlock(64, 64, 2), _MaxViTBlock(64, 128, 4))
        self.norm = nn.LayerNorm(128)
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.stages(self.stem(x)).mean((2, 3))))


# --------------------------------------------------------------------------- convnextv2_block


class _LayerNorm2d(nn.Module):
    """ConvNeXt's channels_first LayerNorm, written out as its repository does."""

    def __init__(self, ch: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ch))
        self.bias = nn.Parameter(torch.zeros(ch))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class _GRN(nn.Module):
    """Global response normalization (channels last): L2 norm over H and W, divided by its
    mean over channels, gamma * (x * Nx) + beta + x."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.randn(1, 1, 1, dim) * 0.1)
        self.beta = nn.Parameter(torch.randn(1, 1, 1, dim) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x


class _ConvNeXtV2Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.grn = _GRN(4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(self.grn(F.gelu(self.pwconv1(self.norm(y)))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtV2(nn.Module):
    """ConvNeXt-V2-atto's first two stages (40 and 80 wide, 2 blocks each), pooled head."""

    def __init__(self, dims: tuple[int, int] = (40, 80), depth: int = 2,
                 classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), _LayerNorm2d(dims[0]))
        self.stage1 = nn.Sequential(*(_ConvNeXtV2Block(dims[0]) for _ in range(depth)))
        self.down = nn.Sequential(_LayerNorm2d(dims[0]), nn.Conv2d(dims[0], dims[1], 2, 2))
        self.stage2 = nn.Sequential(*(_ConvNeXtV2Block(dims[1]) for _ in range(depth)))
        self.norm = nn.LayerNorm(dims[1], eps=1e-6)
        self.head = nn.Linear(dims[1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.norm(x.mean([-2, -1])))


# --------------------------------------------------------------------------- text_recognizer_t


class TextRecognizerT(nn.Module):
    """A gray 40x120 text line through full-size 3x3 convs (32, 32, then 1 channel), the
    map transposed so that its 120 columns are channels ([1, 120, 1, 40]), 1x1 convs mixing
    columns into 32 character slots, a Linear over the 40 rows to 37 classes per slot."""

    def __init__(self, slots: int = 32, classes: int = 37) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 1, 1))
        self.columns = nn.Sequential(nn.Conv2d(120, 96, 1, bias=False), nn.BatchNorm2d(96),
                                     nn.ReLU(), nn.Conv2d(96, slots, 1))
        self.head = nn.Linear(40, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.backbone(x).permute(0, 3, 1, 2)  # [B, 1, H, W] -> [B, W, 1, H]
        return self.head(self.columns(y).squeeze(2))  # [B, slots, classes]
