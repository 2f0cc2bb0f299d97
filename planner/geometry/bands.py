"""Bands (strips of tile columns, each traversed by its own cores): a halo-reusing group's
tile columns split among the cores.

Without bands every core works on every tile (the cluster's cores split each tile). With
B bands the tile columns are cut into B contiguous strips; each strip is traversed
row-major by its own cores (chip.cores / B of them), all strips at once. Neighbouring
bands *overlap*: a band computes the border columns it needs from its left neighbour's
strip itself (and loads that border of the group's inputs), so bands never wait for each
other; the cost of that is the recomputed and re-read border, counted as redundancy.

Band b runs on cores b * (cores / B) ...; B is a multiple of the number of clusters, so a
band never spans clusters: each cluster's SRAM holds its own bands, each core 1 / (cores
per band) of its band. The bands run in step, so the group's weights are read from DRAM
once (per tile when streamed) and broadcast: each band's cores hold a copy in WRAM, and on
single-memory chips each cluster holds one in SRAM.
"""

from __future__ import annotations

from math import ceil

from fuseplan.hardware.chip import Chip


def band_columns(count: int, bands: int) -> list[tuple[int, int]]:
    """Tile-column indices [first, end) of each band: contiguous, sizes differing by at most
    one, wider bands last."""
    return [(b * count // bands, (b + 1) * count // bands) for b in range(bands)]


def band_counts(chip: Chip, columns: int) -> list[int]:
    """Band counts the planners try beyond one: one band per core, when the chip has
    several and the group has at least as many tile columns."""
    return [chip.cores] if 1 < chip.cores <= columns else []


def bands_problem(chip: Chip, bands: int, columns: int) -> str | None:
    """Why a group cannot run in `bands` bands on this chip (None: it can)."""
    if bands == 1:
        return None
    if chip.cores % bands or bands % chip.clusters:
        return (f"{bands} bands do not split this chip's {chip.clusters} cluster(s) of "
                f"{chip.cores_per_cluster} cores evenly (use a multiple of the cluster count "
                f"that divides {chip.cores})")
    if bands > columns:
        return f"{bands} bands need at least as many tile columns, the tile makes {columns}"
    return None


def cores_per_band(chip: Chip, bands: int) -> int:
    """Cores that share each band's tiles."""
    return chip.cores // bands


def cluster_loads(chip: Chip, band_bytes: list[int]) -> list[int]:
    """Per cluster, the bytes of its bands summed (bands are placed in order, cluster by
    cluster)."""
    per_cluster = len(band_bytes) // chip.clusters
    return [sum(band_bytes[c * per_cluster:(c + 1) * per_cluster]) for c in range(chip.clusters)]


def band_compute_cycles(chip: Chip, macs: int, vector_ops: int, bands: int) -> int:
    """Cycles one band's cores compute its MACs and vector operations."""
    cores = cores_per_band(chip, bands)
    return (ceil(macs / (cores * chip.core.macs_per_cycle))
            + ceil(vector_ops / (cores * chip.core.vector_lanes)))


def band_overflows(chip: Chip, fmap_peaks: list[int], own: int) -> list[tuple[str, int, int]]:
    """(level, bytes needed, capacity) of every on-chip memory a banded group overflows,
    from each band's feature-map peak and `own`, the weight bytes a band holds at once
    (resident weights, or the largest streamed pair): SRAM per cluster (its bands, plus those
    weights on single-memory chips), NRAM per core (1 / cores-per-band of its band), WRAM per
    core (its share of its band's copy of the weights)."""
    cores = cores_per_band(chip, len(fmap_peaks))
    found = []
    sram = max(cluster_loads(chip, fmap_peaks)) + (own if chip.unified else 0)
    if sram > chip.sram.bytes:
        found.append(("sram", sram, chip.sram.bytes))
    if chip.nram is not None:
        nram = max(ceil(p / cores) for p in fmap_peaks)
        if nram > chip.nram.bytes:
            found.append(("nram", nram, chip.nram.bytes))
    if chip.wram is not None and own:
        wram = ceil(own / cores)
        if wram > chip.wram.bytes:
            found.append(("wram", wram, chip.wram.bytes))
    return found
