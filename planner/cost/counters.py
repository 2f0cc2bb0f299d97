"""The counters of one group or a whole plan: predicted by the cost model, counted by the
emulator. A plain record with no model in it, so the emulator can fill one without
depending on the cost model (planner.cost.model)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Counters:
    """Predicted (or emulated) counters of one group or a whole plan."""

    dram_read_bytes: int = 0  # feature maps and weights
    dram_write_bytes: int = 0
    weight_read_bytes: int = 0
    redundant_read_bytes: int = 0  # halo re-reads beyond each input read once
    sram_peak_bytes: int = 0
    macs: int = 0  # multiply-accumulates of main layers, halo recompute included
    # MACs the array's passes occupy, idle rows and columns included (planner.ir.array);
    # 0 on a chip without an array
    array_macs: int = 0
    vector_ops: int = 0  # element operations of the other layers
    core_fmap_bytes: int = 0  # feature-map bytes the cores read and write on chip
    core_weight_bytes: int = 0  # weight bytes the cores read from WRAM (once per tile)
    # bytes crossing the links between clusters: a cluster-split group's gathers
    # (planner.geometry.cluster_split), each gathered share counted once per link it crosses
    cluster_link_bytes: int = 0
    first_load_bytes: int = 0  # DRAM bytes the first tile waits for (pipeline fill)
    last_store_bytes: int = 0  # DRAM bytes of the last tile's store (pipeline drain)
    prefetch_cycles: int = 0  # fill cycles hidden behind the previous group (its weights)
    # banded groups: the slowest band's compute; cluster splits: the busiest cluster's (else 0)
    band_compute_cycles: int = 0
    # double-buffered cycles the closed form's overlap misses: the cores waiting for loads
    # far from even (a weights-outer group's chunks, planner.cost.schedule)
    stall_cycles: int = 0
    # cycles of the first tile's compute hidden behind its own weight loads: its weights
    # arrive layer by layer and each layer computes once its own are in
    # (planner.cost.schedule.layered_overlap)
    overlap_cycles: int = 0
    cycles: int = 0
    energy_pj: float = 0.0

    @property
    def dram_bytes(self) -> int:
        return self.dram_read_bytes + self.dram_write_bytes

    def __add__(self, other: Counters) -> Counters:
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        summed["sram_peak_bytes"] = max(self.sram_peak_bytes, other.sram_peak_bytes)
        return Counters(**summed)


# Fields that are time or priced from time, not counted bytes or work: the emulator's come
# from its own clock, so they are compared with the prediction, not required to equal it.
TIMING_FIELDS = ("prefetch_cycles", "band_compute_cycles", "stall_cycles", "overlap_cycles",
                 "cycles", "energy_pj")
