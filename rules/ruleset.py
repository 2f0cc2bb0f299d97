"""Rule files: load, validate against the rule classes, and check groups against them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from fuseplan.planner.core.errors import InputError
from fuseplan.planner.core.files import read_input
from fuseplan.planner.core.yamlio import (
    MAX_YAML_BYTES,
    build_dataclass,
    did_you_mean,
    load_yaml,
    where,
)
from fuseplan.planner.cost.objective import ObjectiveSettings
from fuseplan.rules.base import REGISTRY, GroupFacts, Rule, Violation

RULES_DIR = Path(__file__).resolve().parent
DEFAULT_RULES = RULES_DIR / "default.yaml"
Policy = Literal["threshold", "forward", "bidirectional"]


@dataclass(frozen=True)
class SearchSettings:
    """How the planners search."""

    # largest group with a tile search (rows, batch, residency), in layers that compute
    # (views: Reshape, Transpose, Squeeze, Expand... ride along free); whole-map groups may
    # be longer when long_whole_map_groups is on (solver.long_groups)
    max_group_layers: int = field(default=12, metadata={"ge": 1})
    # whole-map groups of any length between single-tensor cuts (weights streamed layer by
    # layer; in hidden chunks or pooling passes where their maps fit no other way, as
    # hidden_chunks and pooling_passes allow): off caps every group at max_group_layers
    long_whole_map_groups: bool = True
    # tiled groups from one single-tensor cut to another (whole residual blocks, two or
    # three bottlenecks) get a tile search up to this many layers (solver.long_groups);
    # at or below max_group_layers (0): none
    max_block_group_layers: int = field(default=60, metadata={"ge": 0})
    time_limit_s: float = field(default=60.0, metadata={"gt": 0})
    seed: int = field(default=0, metadata={"ge": 0, "le": 2**31 - 1})  # CP-SAT's is 32-bit
    # 1 keeps CP-SAT deterministic; past 10,000 CP-SAT calls the model invalid
    workers: int = field(default=1, metadata={"ge": 1, "le": 10_000})
    relative_gap: float = field(default=0.0, metadata={"ge": 0})
    tile_search: Literal["large_to_small", "small_to_large"] = "large_to_small"
    # checked before any grouping: a network whose weights and largest live set fit on chip
    # runs as one group, whatever the rules say about fused groups
    whole_network_first: bool = True
    # CP-SAT is not run where the shortest path is already exact: every candidate group is
    # an interval of the layer order, no cycles cap, and costs add up or (an objective that
    # counts cycles, with prune_by_floor) each pair of consecutive groups is priced with its
    # prefetch; the plan is then proven optimal by the path (off: CP-SAT always solves)
    exact_path_first: bool = True
    # a candidate group is tile-searched only once a shortest path over the searched costs
    # and the other groups' floors (DRAM bytes no tile goes below; under latency, energy or
    # a mix, units net of what a prefetch may hide) runs through it; the plan costs what
    # searching every candidate gives (off: every candidate is searched, e.g. to time the
    # full search)
    prune_by_floor: bool = True
    # 2-D tiles (narrower than the map) are searched for a group that fits no full-width
    # tile at all, or whose best full-width tile is shorter than this many rows (0: only
    # the former; 2-D search multiplies the tile search's work)
    narrow_tiles_below_rows: int = field(default=0, metadata={"ge": 0})
    # 2-D tiles (pyramids) where no full-width tile fits; off by default: they make many
    # more candidate groups fit, and CP-SAT then no longer proves ResNet-50 optimal within
    # a minute (on: examples/fused-layer-vgg)
    two_d_tiles: bool = False
    # off for chips without scratch for kept borders: every tile recomputes its halo
    halo_reuse: bool = True
    # with 2-D halo-reusing tiles, also try one band of tile columns per core
    # (planner.geometry.bands): bands spread a group over every cluster's SRAM
    bands: bool = True
    # a group whose global pools feed back into it (squeeze-excite) may run in passes: pool
    # in tiles, then recompute and scale in tiles (planner.geometry.passes)
    pooling_passes: bool = True
    # a group's widen / per-element / narrow stretches (an MLP, an expand / project pair)
    # may run in chunks of their hidden channels, partial sums on chip
    # (planner.geometry.hidden)
    hidden_chunks: bool = True
    # with hidden chunks, a group's input read before a stretch and after it may be loaded
    # again after it instead of held across it (planner.geometry.reload): more DRAM reads,
    # less SRAM (off: held)
    reload_inputs: bool = True
    # a chain of products may stream its input and output in channel chunks (the first
    # layer summing partial sums on chip, the last writing chunks as made), holding only
    # the maps between whole (planner.geometry.ends)
    end_chunks: bool = True
    # a group whose weights do not fit one cluster's WRAM may run one tile at a time on
    # every cluster, each making its share of the output channels with its share of the
    # weights resident (planner.geometry.cluster_split): weights read once, maps gathered
    # over the cluster links
    cluster_split: bool = True
    # a prefill group whose causal attention's keys, made in the group, outgrow the chip
    # may write them to DRAM as its row tiles make them and read them back in later tiles
    # (Mode.keys_spilled, planner.cost.spilled_keys): input once, output once, the keys
    # once written and read back by every later tile
    keys_spilled: bool = True
    # a split prefill group whose kept keys outgrow a cluster's SRAM may keep them in its
    # cores' WRAM instead, each cluster the heads its share of the query heads reads
    # (Mode.keys_in_wram): the layer's input read once, its keys never leaving the chip
    keys_in_wram: bool = True


@dataclass(frozen=True)
class PartitionSettings:
    """Limits a subgraph must meet to compile, and the merge policy (rules YAML `partition`)."""

    policy: Policy = "threshold"
    planner: Literal["cpsat", "shortest-path", "greedy"] = "shortest-path"
    min_nodes: int = field(default=1, metadata={"ge": 1})
    max_nodes: int = field(default=64, metadata={"ge": 1})
    min_macs: int = field(default=0, metadata={"ge": 0})
    max_macs: int = field(default=10**15, metadata={"ge": 1})
    min_weight_bytes: int = field(default=0, metadata={"ge": 0, "size": True})
    max_weight_bytes: int = field(default=10**15, metadata={"ge": 1, "size": True})
    # a compiled subgraph keeps its weights on chip (WRAM of every core, or SRAM)
    weights_on_chip: bool = False


@dataclass(frozen=True)
class RuleSet:
    """Every registered rule with its configuration, plus search and objective settings."""

    rules: tuple[Rule, ...]
    search: SearchSettings = SearchSettings()
    objective: ObjectiveSettings = ObjectiveSettings()
    partition: PartitionSettings = PartitionSettings()
    file: str = ""
    sha256: str = ""

    @property
    def enabled(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.enabled)

    def get(self, key: str) -> Rule:
        """The configured rule with this YAML key."""
        for r in self.rules:
            if r.key == key:
                return r
        raise KeyError(key)

    def check(self, facts: GroupFacts) -> list[Violation]:
        """Violations of every enabled rule by a group; a layer alone is always allowed."""
        if not facts.fused:
            return []
        return [v for r in self.enabled if (v := r.check(facts)) is not None]

    def summary(self) -> dict[str, Any]:
        """JSON-ready description of the effective rules."""
        return {
            "file": self.file,
            "sha256": self.sha256,
            "rules": [
                {"code": r.code, "key": r.key, "title": r.title,
                 **{f.name: getattr(r, f.name) for f in fields(r)}}  # type: ignore[arg-type]
                for r in self.rules
            ],
            "search": {f.name: getattr(self.search, f.name) for f in fields(self.search)},
            "objective": {f.name: getattr(self.objective, f.name) for f in fields(self.objective)},
            "partition": {f.name: getattr(self.partition, f.name) for f in fields(self.partition)},
        }


def _by_code() -> list[type[Rule]]:
    return sorted(REGISTRY.values(), key=lambda cls: cls.code)


def default_ruleset() -> RuleSet:
    """Every rule with its class defaults (what rules/default.yaml spells out)."""
    return RuleSet(tuple(cls() for cls in _by_code()))


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Read a rule file; unknown rules or keys and wrong types are InputErrors with line:col."""
    file = Path(path) if path is not None else DEFAULT_RULES
    doc = load_yaml(file)
    known_top = ("rules", "search", "objective", "partition")
    for key in doc:
        if key not in known_top:
            raise InputError(f"{where(file, doc, key)}: unknown section `{key}`."
                             f"{did_you_mean(str(key), known_top)} Valid sections: "
                             f"{', '.join(known_top)}. Fix the spelling or remove the "
                             "section.")
    configured: dict[str, Rule] = {}
    rules_node = doc.get("rules") or {}
    if not hasattr(rules_node, "items"):
        raise InputError(f"{where(file, doc, 'rules')}: `rules` must be a mapping of rule name "
                         "to its settings.")
    for key, node in rules_node.items():
        if key not in REGISTRY:
            raise InputError(f"{where(file, rules_node, key)}: unknown rule `{key}`."
                             f"{did_you_mean(str(key), REGISTRY)} Valid rules: "
                             f"{', '.join(REGISTRY)}.")
        if node is None:
            node = {}
        if not hasattr(node, "items"):
            raise InputError(f"{where(file, rules_node, key)}: rule `{key}` needs a mapping of "
                             "settings, e.g. `{enabled: true}`.")
        configured[key] = build_dataclass(REGISTRY[key], node, file, f"rule `{key}`")
    rules = tuple(configured.get(cls.key) or cls() for cls in _by_code())
    search = build_dataclass(SearchSettings, doc.get("search") or {}, file, "search settings")
    objective = build_dataclass(ObjectiveSettings, doc.get("objective") or {}, file,
                                "objective settings")
    partition = build_dataclass(PartitionSettings, doc.get("partition") or {}, file,
                                "partition settings")
    # read as load_yaml read it: a regular file within the cap (stat before open)
    sha = hashlib.sha256(read_input(file, "rule file", MAX_YAML_BYTES,
                                    "Pass the path of a rule file (YAML).")).hexdigest()
    return RuleSet(rules, search, objective, partition, str(file), sha)
