"""The rule mechanism: one frozen dataclass per rule, registered by one decorator.

A rule's YAML keys are exactly its dataclass fields. Every rule can

* ``check(facts)`` a concrete group and tile, returning a Violation that
  carries the numbers (needed vs allowed), or None; and
* ``encode(enc, cand)`` itself into the CP-SAT model: constraints on a
  candidate group's selection literal and tile variables, each enforced only
  if the candidate is selected and the rule's own literal
  (``enc.rule_lits[rule.key]``) holds.

Both sides compute capacities with the same bound formulas (rules.facts.GroupFacts,
rules.encoding.Encoding for CP-SAT), and a property test keeps them equal.
Rules apply to fused groups; a layer left alone is always allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from fuseplan.planner.ir.graph import Graph, Layer
from fuseplan.rules.encoding import Candidate, Encoding
from fuseplan.rules.facts import GroupFacts

__all__ = ["REGISTRY", "GroupFacts", "Rule", "StructuralRule", "Violation", "adjacent_pairs",
           "rule"]


@dataclass(frozen=True)
class Violation:
    """Why a group breaks a rule, with the numbers."""

    rule: str  # stable code, e.g. "R19"
    name: str  # YAML key, e.g. "stride_redundancy"
    message: str
    needed: float | None = None
    allowed: float | None = None

    def __str__(self) -> str:
        return f"{self.rule} {self.name}: {self.message}"


class Rule:
    """Base of every rule; subclasses are frozen dataclasses registered with @rule."""

    code: ClassVar[str]
    key: ClassVar[str]
    title: ClassVar[str]
    # True for rules a group may break while it grows and satisfy later (e.g. "at least 2
    # main layers"); the greedy planner checks them only on the finished group.
    final_only: ClassVar[bool] = False
    # How holding depends on the tile height: "shrink" rules (capacities) that hold for a
    # height hold for every smaller one; "grow" rules (halo redundancy) for every larger one.
    tile_trend: ClassVar[str] = "shrink"
    # How a group run in pooling passes (planner.geometry.passes) is checked: "each" pass as
    # a group of its own (capacities, halos), or the "whole" group with the passes' tile
    # (a rule whose exemptions look at which blocks the group holds)
    in_passes: ClassVar[str] = "each"
    enabled: bool

    @property
    def is_structural(self) -> bool:
        """Whether the rule depends only on which layers a group holds, not on its tile
        (planners then drop violating groups before any tile search)."""
        return False

    def check(self, facts: GroupFacts) -> Violation | None:
        """The violation of this rule by a fused group and tile, or None."""
        raise NotImplementedError

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        """Add this rule's constraints for one candidate group, gated by cand.selected and
        the rule's literal."""
        raise NotImplementedError

    def violation(self, message: str, needed: float | None = None,
                  allowed: float | None = None) -> Violation:
        return Violation(self.code, self.key, message, needed, allowed)


R = TypeVar("R", bound=type[Rule])
REGISTRY: dict[str, type[Rule]] = {}


def rule(code: str, key: str, title: str) -> Callable[[R], R]:
    """Register a rule class under its YAML key."""

    def wrap(cls: R) -> R:
        cls.code, cls.key, cls.title = code, key, title
        if key in REGISTRY:
            raise ValueError(f"rule key {key!r} registered twice")
        REGISTRY[key] = cls
        return cls

    return wrap


class StructuralRule(Rule):
    """A rule on which layers a group holds, independent of the tile.

    Its encoding forbids a violating candidate while the rule is on: the
    candidate's selection literal and the rule literal cannot both hold.
    """

    @property
    def is_structural(self) -> bool:
        return True

    def encode(self, enc: Encoding, cand: Candidate) -> None:
        if self.check(cand.facts_any_tile) is not None:
            enc.model.add_bool_or([cand.selected.Not(), enc.rule_lits[self.key].Not()])

    def span_filter(self, graph: Graph) -> Callable[[int, Sequence[int]], list[bool]] | None:
        """A test of runs of the layer order from one start: for each end given, whether the
        rule allows the group of the layers from the start through that end, decided from
        the layers alone, with what it counts over the graph worked out once; None where it
        cannot tell so (each group is then checked whole, as check does). A deep network's
        whole-map starts keep millions of such groups (a chain of 20,000 layers asks for
        every start): a rule that can bound them by counts spares a walk of each
        (solver.whole_starts)."""
        return None


def adjacent_pairs(facts: GroupFacts) -> Iterator[tuple[Layer, Layer]]:
    """(producer, consumer) layer pairs inside the group."""
    inside = set(facts.io.layers)
    for lay in facts.layers:
        for t in lay.outputs:
            for c in facts.graph.consumers.get(t, ()):
                if c in inside:
                    yield lay, facts.graph.layer(c)
