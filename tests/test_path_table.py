"""The bounded path's arrays (solver.path_table) find what its walks in Python find: the
same cheapest path (ties included), the same distances, the same runners-up, on random
edge sets with searched and unsearched edges, dead ones among them."""

from __future__ import annotations

from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from fuseplan.solver.bounded_path import Edge, _cheapest, _distances, _runners_up, _weight
from fuseplan.solver.path_table import _UNREACHED, PathTable
from fuseplan.solver.tiles import TileChoice

# the searched cost of each edge, by id: the walks and the arrays only ask `units` for it
_COSTS: dict[int, int] = {}
_CHOSEN = cast(TileChoice, object())  # an edge's tile: only whether it has one matters here


def _units(e: Edge) -> int:
    return _COSTS[id(e)]


def _search(e: Edge, cost: int) -> None:
    e.searched, e.choice = True, _CHOSEN
    _COSTS[id(e)] = cost


@st.composite
def _edges(draw: st.DrawFn) -> tuple[list[Edge], int, list[bool]]:
    end = draw(st.integers(1, 9))
    edges = []
    for _ in range(draw(st.integers(1, 40))):
        a = draw(st.integers(0, end - 1))
        b = draw(st.integers(a + 1, end))
        floor = draw(st.integers(0, 20))
        e = Edge(a, b, (), None, floor)
        if draw(st.booleans()):
            _search(e, floor + draw(st.integers(0, 5)))
        edges.append(e)
    alive = [draw(st.booleans()) or draw(st.booleans()) for _ in edges]
    return edges, end, alive


@settings(max_examples=300, deadline=None)
@given(_edges())
def test_the_arrays_find_what_the_walks_find(case: tuple[list[Edge], int, list[bool]]) -> None:
    edges, end, alive = case
    table = PathTable(edges, end, lambda e: _weight(e, _units))
    table.drop(id(e) for e, ok in zip(edges, alive, strict=True) if not ok)
    live = [e for e, ok in zip(edges, alive, strict=True) if ok]
    assert table.live() == live
    walked = _cheapest(live, end, _units)
    found = table.cheapest()
    assert (found is None) == (walked is None)
    if walked is not None and found is not None:
        assert [id(e) for e in found] == [id(e) for e in walked]
    for forward in (True, False):
        dist = _distances(live, end, _units, forward)
        arr = table.distances(forward)
        assert {p: int(d) for p, d in enumerate(arr) if d < _UNREACHED} == dist
    taken = live[:2]
    assert [id(e) for e in table.runners_up(taken, 5)] \
        == [id(e) for e in _runners_up(live, end, _units, taken)[:5]]
    searched = [e for e in live if e.searched]
    only = table.cheapest(table.searched_mask())
    walked = _cheapest(searched, end, _units)
    assert (None if only is None else [id(e) for e in only]) \
        == (None if walked is None else [id(e) for e in walked])


def test_a_refreshed_edge_weighs_its_search() -> None:
    """An edge searched after the table was built is priced at its searched cost."""
    a, b = Edge(0, 1, (), None, 1), Edge(0, 1, (), None, 2)
    table = PathTable([a, b], 1, lambda e: _weight(e, _units))
    assert table.cheapest() == [a]
    _search(a, 9)
    assert table.refresh([a])
    assert table.cheapest() == [b]


def test_weights_too_large_for_the_arrays_are_refused() -> None:
    """A weight whose sums could overflow int64: no table (the walk in Python serves)."""
    assert PathTable.of([Edge(0, 1, (), None, 1 << 45)], 1, lambda e: e.floor) is None
