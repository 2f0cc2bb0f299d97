"""Models of the 2026 test zoo (export_zoo2026.py) that take sequences or latents: Whisper's
audio encoder, a Stable-Diffusion UNet slice, BERT and a Llama decoder, written as their
reference code writes them."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# --------------------------------------------------------------------------- audio_encoder


def _sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's sinusoidal position table [length, channels]."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2))
    scaled = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class _WhisperAttention(nn.Module):
    """Whisper's MultiHeadAttention: q, k (no bias), v Linears, view/permute into heads,
    q and k each scaled by d^-1/4, Softmax, out Linear."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(x), self.key(x), self.value(x)
        b, n, d = q.shape
        scale = (d // self.heads) ** -0.25
        q = q.view(b, n, self.heads, -1).permute(0, 2, 1, 3)
        k = k.view(b, n, self.heads, -1).permute(0, 2, 1, 3)
        v = v.view(b, n, self.heads, -1).permute(0, 2, 1, 3)
        w = ((q * scale) @ (k * scale).transpose(-1, -2)).float().softmax(dim=-1)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))


class _WhisperBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn_ln = nn.LayerNorm(dim)
        self.attn = _WhisperAttention(dim, heads)
        self.mlp_ln = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    """Whisper's AudioEncoder at tiny's width (384, 6 heads), 2 layers, 3000 frames."""

    def __init__(self, mels: int = 80, dim: int = 384, heads: int = 6, layers: int = 2,
                 frames: int = 3000) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", _sinusoids(frames // 2, dim))
        self.blocks = nn.ModuleList(_WhisperBlock(dim, heads) for _ in range(layers))
        self.ln_post = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        x = x.permute(0, 2, 1)
        x = (x + self.positional_embedding).to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


# --------------------------------------------------------------------------- diffusion_unet


class _ResBlock(nn.Module):
    """LDM's ResBlock: GroupNorm(32), SiLU, 3x3 conv; the time embedding through SiLU and a
    Linear, added as [N, C, 1, 1]; GroupNorm, SiLU, 3x3 conv; a 1x1 skip when widths differ."""

    def __init__(self, cin: int, cout: int, emb: int) -> None:
        super().__init__()
        self.in_layers = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(),
                                       nn.Conv2d(cin, cout, 3, 1, 1))
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb, cout))
        self.out_layers = nn.Sequential(nn.GroupNorm(32, cout), nn.SiLU(),
                                        nn.Conv2d(cout, cout, 3, 1, 1))
        self.skip = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x) + self.emb_layers(emb)[:, :, None, None]
        return self.skip(x) + self.out_layers(h)


class _CrossAttention(nn.Module):
    """LDM/diffusers attention: to_q on x, to_k and to_v on the context (x itself for
    self-attention), heads split by reshape, scaled_dot_product_attention, to_out."""

    def __init__(self, dim: int, context_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(context_dim, dim, bias=False)
        self.to_v = nn.Linear(context_dim, dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        ctx = x if context is None else context
        b, n, c = x.shape
        q = self.to_q(x).view(b, -1, self.heads, c // self.heads).transpose(1, 2)
        k = self.to_k(ctx).view(b, -1, self.heads, c // self.heads).transpose(1, 2)
        v = self.to_v(ctx).view(b, -1, self.heads, c // self.heads).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, c))


class _GEGLU(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * F.gelu(gate)


class _SpatialTransformer(nn.Module):
    """LDM's SpatialTransformer (SD 1.x): GroupNorm, 1x1 proj_in, tokens [B, HW, C], one
    BasicTransformerBlock (self-attention, cross-attention, GEGLU FF, each pre-LN with a
    residual), back to [B, C, H, W], 1x1 proj_out, residual."""

    def __init__(self, ch: int, heads: int, context_dim: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(32, ch, eps=1e-6)
        self.proj_in = nn.Conv2d(ch, ch, 1)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(ch) for _ in range(3))
        self.attn1 = _CrossAttention(ch, ch, heads)
        self.attn2 = _CrossAttention(ch, context_dim, heads)
        self.ff = nn.Sequential(_GEGLU(ch, 4 * ch), nn.Linear(4 * ch, ch))
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        t = self.attn1(self.norm1(t)) + t
        t = self.attn2(self.norm2(t), context) + t
        t = self.ff(self.norm3(t)) + t
        t = t.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()
        return self.proj_out(t) + x


class DiffusionUNet(nn.Module):
    """A two-level slice of SD's UNet at width 64: conv_in, ResBlock + SpatialTransformer at
    64x64, a stride-2 conv Downsample, a ResBlock at 32x32 (64 -> 128), a nearest 2x
    Upsample with conv, Concat with the 64x64 skip, a ResBlock (192 -> 64), out GroupNorm,
    SiLU, conv_out. The time embedding MLP (Linear, SiLU, Linear) runs on ``t_emb``."""

    def __init__(self, ch: int = 64, t_dim: int = 128, context_dim: int = 256,
                 heads: int = 2) -> None:
        super().__init__()
        emb = 4 * ch
        self.time_embed = nn.Sequential(nn.Linear(t_dim, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.conv_in = nn.Conv2d(4, ch, 3, 1, 1)
        self.res1 = _ResBlock(ch, ch, emb)
        self.attn1 = _SpatialTransformer(ch, heads, context_dim)
        self.down = nn.Conv2d(ch, ch, 3, 2, 1)
        self.res2 = _ResBlock(ch, 2 * ch, emb)
        self.up = nn.Conv2d(2 * ch, 2 * ch, 3, 1, 1)
        self.res3 = _ResBlock(3 * ch, ch, emb)
        self.out = nn.Sequential(nn.GroupNorm(32, ch), nn.SiLU(), nn.Conv2d(ch, 4, 3, 1, 1))

    def forward(self, sample: torch.Tensor, t_emb: torch.Tensor,
                context: torch.Tensor) -> torch.Tensor:
        emb = self.time_embed(t_emb)
        h = self.attn1(self.res1(self.conv_in(sample), emb), context)
        skip = h
        h = self.res2(self.down(h), emb)
        h = self.up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        h = self.res3(torch.cat([h, skip], dim=1), emb)
        return self.out(h)

# --------------------------------------------------------------------------- bert_encoder


class _BertLayer(nn.Module):
    """BertLayer (eager attention): query/key/value Linears, transpose_for_scores, scores
    / sqrt(d) + the extended mask, Softmax, context, dense + residual + LayerNorm, then the
    intermediate (Linear, GELU) and output (Linear + residual + LayerNorm)."""

    def __init__(self, dim: int, heads: int, inter: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.attn_out = nn.Linear(dim, dim)
        self.attn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.intermediate = nn.Linear(dim, inter)
        self.output = nn.Linear(inter, dim)
        self.out_norm = nn.LayerNorm(dim, eps=1e-12)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        ctx = (scores.softmax(dim=-1) @ v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size()[:-2] + (self.heads * self.head_dim,))
        x = self.attn_norm(self.attn_out(ctx) + x)
        return self.out_norm(self.output(F.gelu(self.intermediate(x))) + x)


class BertEncoder(nn.Module):
    """BertModel (hidden 256, 4 heads, 2 layers, vocabulary 30522) as recent transformers
    write its embeddings and mask; outputs the last hidden state and the pooler's."""

    def __init__(self, vocab: int = 30522, dim: int = 256, heads: int = 4, layers: int = 2,
                 max_pos: int = 512) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_pos, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(max_pos).expand((1, -1)),
                             persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, max_pos), dtype=torch.long),
                             persistent=False)
        self.layers = nn.ModuleList(_BertLayer(dim, heads, 4 * dim) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, seq = input_ids.shape
        position_ids = self.position_ids[:, :seq]
        # transformers >= 4.48: the buffered token types gathered along the position ids
        buffered = self.token_type_ids.expand(position_ids.shape[0], -1)
        token_type_ids = torch.gather(buffered, dim=1, index=position_ids).expand(batch, seq)
        x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
             + self.position_embeddings(position_ids))
        x = self.norm(x)
        attention_mask = torch.ones((batch, seq), device=input_ids.device)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return x, torch.tanh(self.pooler(x[:, 0]))


# --------------------------------------------------------------------------- llama_block


class _RMSNorm(nn.Module):
    """LlamaRMSNorm: in float32, x * rsqrt(mean(x^2) + eps), times the weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:  # as Hugging Face's repeat_kv: every query head has its own key head
        return x
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class _LlamaLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, inter: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.input_layernorm = _RMSNorm(dim)
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.post_attention_layernorm = _RMSNorm(dim)
        self.gate_proj = nn.Linear(dim, inter, bias=False)
        self.up_proj = nn.Linear(dim, inter, bias=False)
        self.down_proj = nn.Linear(inter, dim, bias=False)

    def _rotated(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, b: int, s: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (rotated) and v of the normed input, heads on axis 1 (b, s: x's batch and
        length, taken once by the caller: each x.shape is a Shape chain in the export)."""
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _rest(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None, b: int, s: int) -> torch.Tensor:
        """Attention of q over k and v (repeat_kv'd), the residual, the SwiGLU MLP."""
        n_rep = self.heads // self.kv_heads
        k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
        scores = q @ k.transpose(2, 3) * self.head_dim ** -0.5
        if mask is not None:
            scores = scores + mask
        attn = scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype) @ v
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self._rotated(x, cos, sin, b, s)
        return self._rest(x, q, k, v, mask, b, s)

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             past_key: torch.Tensor, past_value: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decode step with a KV cache: the new keys and values are appended to the
        past ones (torch.cat along the positions, as DynamicCache.update does); one query
        attends to every position, so there is no mask."""
        b, s, _ = x.shape
        q, k, v = self._rotated(x, cos, sin, b, s)
        key, value = torch.cat((past_key, k), dim=2), torch.cat((past_value, v), dim=2)
        return self._rest(x, q, key, value, None, b, s), key, value


class LlamaLike(nn.Module):
    """LlamaModel (no LM head) with dim 512, 8 heads, 2 KV heads, SwiGLU 1408, 2 layers,
    vocabulary 32000, RoPE base 10000; prefill without a KV cache."""

    def __init__(self, vocab: int = 32000, dim: int = 512, heads: int = 8, kv_heads: int = 2,
                 inter: int = 1408, layers: int = 2, base: float = 10000.0) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(_LlamaLayer(dim, heads, kv_heads, inter)
                                    for _ in range(layers))
        self.norm = _RMSNorm(dim)
        head_dim = dim // heads
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        b, s = input_ids.shape
        position_ids = torch.arange(s, device=x.device).unsqueeze(0).expand(b, -1)
        # LlamaRotaryEmbedding: inv_freq [1, d/2, 1] @ positions [B, 1, S]
        freqs = (self.inv_freq[None, :, None].float().expand(b, -1, 1)
                 @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        mask = torch.full((s, s), torch.finfo(x.dtype).min, device=x.device).triu(1)
        mask = mask[None, None, :, :].expand(b, 1, -1, -1)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class LlamaDecode(LlamaLike):
    """One decode step of LlamaLike with a KV cache (issue 46): the next token's id, each
    layer's past keys and values [N, kv_heads, P, head_dim] in, the hidden state and the
    present keys and values [N, kv_heads, P + 1, head_dim] out, as Hugging Face's decoder
    exports (past_key_values.i.key/value, present.i.key/value) write them. The new token sits
    at position P; one query attends to every position, so there is no mask."""

    def forward(self, input_ids: torch.Tensor,  # type: ignore[override]
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed_tokens(input_ids)
        b, s = input_ids.shape
        length = past[0].shape[2]
        position_ids = (torch.arange(s, device=x.device) + length).unsqueeze(0).expand(b, -1)
        freqs = (self.inv_freq[None, :, None].float().expand(b, -1, 1)
                 @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        present: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            x, key, value = layer.step(x, cos, sin, past[2 * i], past[2 * i + 1])
            present += [key, value]
        return (self.norm(x), *present)
