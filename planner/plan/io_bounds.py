"""What a plan is measured against besides its floor: each fused attention's FlashAttention
I/O at the plan's tiling, a prefill's I/O bound and a decode step's KV caches (computed by
planner.app.io_bounds; written to plan files and `solve --json` under "io_bounds", shown by
`solve` and the HTML report)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionIO:
    """FlashAttention's analytic DRAM count for one fused attention layer of a group at its
    tiling (planner.geometry.attention.attention_traffic): q read once, the keys and values
    once per pass of a tile of query rows (a causal pass only up to its last query), o
    written once, each only where it crosses the group's boundary."""

    layer: str
    group: int
    q_bytes: int
    kv_bytes: int  # the keys and values, whole
    passes: int  # tiles of query rows per image
    kv_reads: int  # keys and values the passes read in all
    o_bytes: int
    group_dram_bytes: int  # what the attention's group moves in all
    kv_label: str = ""  # how many times the passes read k and v whole ('2×', '1.50×')

    @property
    def total(self) -> int:
        """q + the keys and values of every pass + o."""
        return self.q_bytes + self.kv_reads + self.o_bytes


@dataclass(frozen=True)
class CacheIO:
    """A decode step's KV caches (planner.front.kv_cache): read once, appended in place."""

    caches: int
    read_bytes: int  # every cache, read once
    new_bytes: int  # the new positions written
    # every weight, cache and other input read once, the new positions and other outputs
    # written once: with the caches appended in place, the plan's floor
    ideal_bytes: int


@dataclass(frozen=True)
class IOBounds:
    """A plan's attentions and the bound it is measured against (see the module's
    docstring). ``io_bound_bytes``: a prefill's floor plus every fused attention's
    FlashAttention I/O as if it ran alone at the plan's query rows (None for a decode step,
    or a plan with no fused attention); ``cache``: a decode step's caches (else None)."""

    attentions: tuple[AttentionIO, ...] = ()
    io_bound_bytes: int | None = None
    cache: CacheIO | None = None
