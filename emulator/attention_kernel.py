"""The online-softmax attention kernel (FlashAttention's recurrence), key chunk by key chunk.

A fused attention layer (planner.front.attention_fusion) computes
softmax(mask(scale * q @ k^T)) @ v for a tile of query rows without ever holding a row of
scores whole: it walks the keys in chunks of `kv_chunk`, keeps per query row the running
maximum m and the running sum l of exp(score - m), and rescales the running output when the
maximum grows. After the last chunk the output is divided by l. This is the execution the
cost model prices (planner.geometry.attention: the chunk of k^T and v and the chunk of scores,
m and l beside the tile's own maps), not a whole-matrix softmax sliced afterwards.

The kernel table (emulator.kernels) registers it as the FlashAttention op's kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def online_attention(q: np.ndarray, kt: np.ndarray, v: np.ndarray, *, scale: float,
                     causal: bool, mask_value: float, kv_chunk: int, query_offset: int,
                     query_length: int, key_length: int | None = None) -> np.ndarray:
    """Attention of the query rows `q` ([..., T, d]: rows `query_offset` on of a sequence
    of `query_length`) against the keys `kt` ([..., d, Lk]) and values `v` ([..., Lk, dv]),
    one chunk of `kv_chunk` keys at a time: all `key_length` keys of the sequence, or (a
    causal tile given only the keys up to its last row's) its first Lk.

    ``causal``: query i sees key j only when j <= i + (key_length - query_length); the
    others get `mask_value`, as the model's Where (or additive mask) gave them, so a chunk
    wholly in the future still runs and contributes exp(mask_value - max), zero in float32.
    """
    lk = kt.shape[-1]
    keys = lk if key_length is None else key_length
    work = np.float64 if q.dtype == np.float64 else np.float32
    qs = q.astype(work, copy=False)
    out = np.zeros((*q.shape[:-1], v.shape[-1]), work)
    running_max = np.full(q.shape[:-1], -np.inf, work)
    running_sum = np.zeros(q.shape[:-1], work)
    # the last key each query row sees (causal)
    last_key = np.arange(query_offset, query_offset + q.shape[-2])[:, None] \
        + (keys - query_length)
    for start in range(0, lk, kv_chunk):
        stop = min(lk, start + kv_chunk)
        scores = (qs @ kt[..., start:stop].astype(work, copy=False)) * work(scale)
        if causal:
            scores = np.where(np.arange(start, stop)[None, :] <= last_key, scores,
                              work(mask_value))
        new_max = np.maximum(running_max, scores.max(axis=-1))
        correction = np.exp(running_max - new_max)
        weights = np.exp(scores - new_max[..., None])
        running_sum = running_sum * correction + weights.sum(axis=-1)
        out = out * correction[..., None] + weights @ v[..., start:stop, :].astype(work,
                                                                                 copy=False)
        running_max = new_max
    return (out / running_sum[..., None]).astype(q.dtype, copy=False)


def attention_kernel(attrs: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                     *parts: np.ndarray) -> np.ndarray:
    """The fused layer's kernel with its attributes (planner.front.attention_fusion): keys
    given as k^T, or as k read through a transposed view (`transposed_keys` 0); with
    `kv_groups` n > 1, query head h reads key and value head h // n (grouped-query
    attention: the views index the unexpanded heads, as the hardware's loads would).
    `parts`: the new positions' keys and values after a KV cache's (planner.front.kv_cache),
    walked after the cache's chunks."""
    transposed = bool(int(attrs.get("transposed_keys", 1)))
    if parts:
        k_new, v_new = parts
        k = np.concatenate([k, k_new], axis=-1 if transposed else -2)
        v = np.concatenate([v, v_new], axis=-2)
    kt = k if transposed else np.swapaxes(k, -1, -2)
    groups = int(attrs.get("kv_groups", 1))
    if groups > 1:  # a view for the arithmetic; the bytes moved are the arrays given
        kt, v = np.repeat(kt, groups, axis=-3), np.repeat(v, groups, axis=-3)
    return online_attention(q, kt, v, scale=float(attrs["scale"]),
                            causal=bool(attrs["causal"]),
                            mask_value=float(attrs["mask_value"]),
                            kv_chunk=int(attrs["kv_chunk"]),
                            query_offset=int(attrs.get("query_offset", 0)),
                            query_length=int(attrs["query_length"]),
                            key_length=attrs.get("key_length"))
