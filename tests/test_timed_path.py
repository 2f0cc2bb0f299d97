"""The bounded shortest path under objectives that count cycles (issue 44): floors in
objective units net of prefetch savings (planner.cost.bounds.timed_floor), pairs of
consecutive groups priced exactly (solver.prefetch_path), and CP-SAT's answer at a fraction
of the searches: the latency and energy plans cost what CP-SAT over every candidate finds,
and are proven optimal without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuseplan.planner.app.api import Problem, plan_problem, prepare
from fuseplan.planner.cost.bounds import group_floor_bytes, made_work, timed_floor
from fuseplan.planner.cost.objective import Objective, cycle_units, objective_units
from tests import models
from tests.test_bounds import candidate_searches
from tests.test_rules import with_rules

CHIPS: tuple[list[str], ...] = ([], ["sram.bytes=48KiB", "nram.bytes=16KiB"],
                                 ["dram.bandwidth_gbps=4"])
TIMED = (Objective.LATENCY, Objective.ENERGY)
BUILT = {"residual_net": models.residual_net, "inception_net": models.inception_net,
         "se_net": models.se_net, "mbconv_net": models.mbconv_net,
         "causal_encoder": lambda: models.causal_encoder(tokens=128, width=32, heads=2)}


def _problem(tmp: Path, model: Any, name: str, overrides: list[str]) -> Problem:
    return prepare(str(models.save(model, tmp, name)), overrides=overrides)


def _searched_everywhere(problem: Problem) -> Problem:
    """Every candidate searched and weighed by CP-SAT (no path first, no floors)."""
    return with_rules(problem, search={"exact_path_first": False, "prune_by_floor": False,
                                       "whole_network_first": False})


def _pruned(problem: Problem) -> Problem:
    return with_rules(problem, search={"whole_network_first": False})


# one chip per network keeps the fast suite fast; the slow suite takes every pair
FLOOR_CASES = [("residual_net", CHIPS[0]), ("se_net", CHIPS[1]), ("causal_encoder", CHIPS[2])]
SLOW_FLOOR_CASES = [pytest.param(b, c, marks=pytest.mark.slow) for b in BUILT for c in CHIPS
                    if (b, c) not in FLOOR_CASES]


@pytest.mark.parametrize(("builder", "overrides"), [*FLOOR_CASES, *SLOW_FLOOR_CASES])
def test_no_choice_adds_less_than_its_timed_floor(tmp_path: Path, builder: str,
                                                  overrides: list[str]) -> None:
    """Whatever the next group hides behind it (nothing, some cycles, any amount), no tile
    choice of a group adds less to a plan than its timed floor given that much: its units
    less the cycles it hides (at most its DRAM-idle cycles); under latency and energy."""
    problem = _problem(tmp_path, BUILT[builder](), builder, overrides)
    g, chip, rs = problem.graph, problem.chip, problem.ruleset
    compared = 0
    for _, _, search in candidate_searches(problem, 5):
        floor_bytes = group_floor_bytes(g, search.io, search.chains, chip)
        work = made_work(g, search.io, search.chains)
        for objective in TIMED:
            options = search.options(objective)
            coef = cycle_units(objective, rs.objective, chip)
            for hides in (0, 50, 10**12) if options else ():
                least = min(objective_units(o.cost, objective, rs.objective, chip)
                            - coef * min(o.idle, hides) for o in options)
                floor = timed_floor(chip, objective, rs.objective, floor_bytes, work, hides)
                assert floor <= least, (search.layers, objective, hides, floor, least)
                compared += 1
    assert compared > 0


def _units(plan: Any, problem: Problem, objective: Objective) -> int:
    return objective_units(plan.totals, objective, problem.ruleset.objective, problem.chip)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), chip=st.sampled_from(CHIPS),
       objective=st.sampled_from(TIMED))
def test_the_timed_path_costs_what_cpsat_over_every_candidate_costs(
        tmp_path_factory: pytest.TempPathFactory, seed: int, chip: list[str],
        objective: Objective) -> None:
    """On random CNNs and chips, the latency (energy) plan of the bounded path, proven
    without CP-SAT, costs exactly what CP-SAT finds weighing every candidate group with its
    prefetch pairs; on two processes too."""
    rng = np.random.default_rng(seed)
    problem = _problem(tmp_path_factory.mktemp("timed"), models.random_cnn(rng, 1),
                       f"r{seed}", chip)
    try:
        full = plan_problem(_searched_everywhere(problem), "cpsat", objective, time_limit=120)
    except Exception as exc:  # a layer that fits nowhere: the bounded path says so too
        with pytest.raises(type(exc)):
            plan_problem(_pruned(problem), "cpsat", objective)
        return
    pruned = plan_problem(_pruned(problem), "cpsat", objective)
    assert pruned.solver["status"] == "OPTIMAL", pruned.solver
    if full.solver["status"] == "OPTIMAL":
        assert _units(pruned, problem, objective) == _units(full, problem, objective), seed
    else:
        assert _units(pruned, problem, objective) <= _units(full, problem, objective), seed
    both = plan_problem(_pruned(problem), "cpsat", objective, jobs=2)
    assert _units(both, problem, objective) == _units(pruned, problem, objective)


@pytest.mark.parametrize(("name", "objective"), [
    ("residual_net", Objective.LATENCY),
    *(pytest.param(n, o, marks=pytest.mark.slow)
      for n in ("chain_cnn", "residual_net", "inception_net") for o in TIMED
      if (n, o) != ("residual_net", Objective.LATENCY))])
def test_the_examples_timed_plans_are_proven_by_the_path(name: str,
                                                         objective: Objective) -> None:
    """The examples' latency and energy plans: what CP-SAT over every candidate finds,
    proven by the path (CP-SAT not run), with fewer groups searched."""
    root = Path(__file__).resolve().parents[1] / "examples" / name
    problem = prepare(str(root / "model.onnx"), str(root / "rules.yaml"),
                      str(root / "hardware.yaml"))
    memo_on: dict[tuple[str, ...], Any] = {}
    memo_off: dict[tuple[str, ...], Any] = {}
    on = plan_problem(problem, "cpsat", objective, memo=memo_on)
    off = plan_problem(_searched_everywhere(problem), "cpsat", objective, time_limit=120,
                       memo=memo_off)
    assert on.solver["status"] == "OPTIMAL" and "solved_by" in on.solver, on.solver
    assert off.solver["status"] == "OPTIMAL", off.solver
    assert _units(on, problem, objective) == _units(off, problem, objective)
    assert len(memo_on) <= len(memo_off)
