"""The shortest path over candidate groups, searching only the groups it could use.

Every candidate group has a floor (planner.cost.bounds.group_floor_bytes): DRAM bytes none
of its tile choices goes below. The path runs over the searched costs of the groups searched
so far and the floors of the rest; the unsearched groups on it are searched (repeated blocks
share one search, solver.structure; several run on up to ``jobs`` processes) and the path
runs again, until every group on it has been searched. That path is optimal: any other path
costs at least the sum of its floors and searched costs, which is no less than this one's
(a lazy shortest path, as in Dellin and Srinivasa's LazySP). Most candidates of a deep
network never reach a path whose floors could beat a priced plan, so they are never
searched; the plan is the one the full search finds, or one of the same cost. A round
with fewer searches than cores also searches the groups on the next cheapest paths (the
cheapest path through each unsearched group first): they run on cores that would idle and
often settle the next round. Over pairs (below) a path costs far more than one over edges,
so a round there takes as many more as its path took the time of.

Floors are in the objective's units. Under the traffic objective costs add up; under one
that counts cycles a group's cost depends on the group after it (a prefetch hides that
group's weight loads behind it), so the path runs over pairs of consecutive edges, priced
by the caller (``pair``: exact once the first edge is searched, solver.prefetch_path). That
path tries an edge's predecessors cheapest bound first and stops at the first bound above
the best price found (PairPricing.least), which spares most of the pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from fuseplan.planner.core.errors import PlanningError
from fuseplan.planner.core.progress import Progress, ProgressSink
from fuseplan.planner.geometry.regions import GroupIO
from fuseplan.solver.long_groups import start_groups
from fuseplan.solver.parallel import Context, Found, Task, Workers, search
from fuseplan.solver.path_table import PathTable
from fuseplan.solver.structure import StructureKey, structure_key
from fuseplan.solver.tiles import Option, TileChoice
from fuseplan.solver.whole_starts import Start

Groups = list[tuple[tuple[str, ...], TileChoice]]
# unsearched groups looked at per idle core and round (most share a structure searched
# already, or fall to a structural rule): beyond these the round starts without more
RUNNERS_UP = 4
# work items one round over pairs runs at most, however long its path took
MOST_PER_ROUND = 64


@dataclass
class Edge:
    """One candidate group as an edge between two positions of the layer order."""

    start: int
    end: int
    # the group's layers, or a longer run they begin (a whole-map start's layers, shared by
    # all its ends: copies of each prefix would take memory cubic in a long chain's length)
    span: tuple[str, ...]
    io: GroupIO | None  # None: not refined yet, or a whole-map group (never tile-searched)
    floor: int  # objective units no tile choice of the group goes below
    choice: TileChoice | None = None  # once searched: the best tile (None: none passes)
    searched: bool = False
    quick: bool = False  # tiled by the quick search, past the time limit
    # a whole-map group not tried yet: its start's search (solver.long_groups.start_groups)
    # tries several ends at once, and the ends it keeps are the start's only groups
    whole: Start | None = None
    # False: only its cheap floor is known (planner.cost.bounds.IntervalFloors); whether it
    # breaks a structural rule and its full floor are looked at once a path reaches it
    refined: bool = True
    key: StructureKey | None = None  # the structure its search shares (_key), once asked
    # once searched under a timed objective: the choices a next-group prefetch may prefer
    options: tuple[Option, ...] = ()

    @property
    def layers(self) -> tuple[str, ...]:
        """The group's layers."""
        n = self.end - self.start
        return self.span if len(self.span) == n else self.span[:n]

    @property
    def required(self) -> bool:
        """A single layer: searched (quickly) even past the time limit."""
        return self.end - self.start == 1


@dataclass(frozen=True)
class Outcome:
    """The path's edges (all searched), and how many candidates the time limit left out
    (unsearched ones that might have beaten it)."""

    path: list[Edge]
    left_out: int


def bounded_path(ctx: Context, edges: Sequence[Edge], end: int,
                 units: Callable[[Edge], int], jobs: int = 1,
                 searched: Callable[[Edge], None] = lambda e: None,
                 tried: Callable[[Start, Groups], None] = lambda s, g: None,
                 refine: Callable[[Edge], bool] = lambda e: True,
                 progress: ProgressSink | None = None,
                 pairs: PairPricing | None = None) -> Outcome:
    """The cheapest path from position 0 to `end`, searching unsearched edges only as they
    come onto it (see the module docstring). ``refine`` is called on each unrefined edge
    the path reaches (it sets the edge's io and full floor, False: no candidate after
    all), ``searched`` on each tile-searched edge once its search is done (the caller keeps
    its memo and raises for a layer that fits no tile), ``tried`` on each whole-map start
    with the groups it found. Past the context's time limit the unsearched groups of
    several layers are left out. ``progress`` is told of each round (_Rounds.tell).

    ``pairs`` (where what an edge adds to a plan depends on the edge after it: a timed
    objective, whose prefetch savings couple neighbours) prices an edge followed by another
    (PairPricing), exactly once both are searched, else a bound; the path is then the
    cheapest over pairs of consecutive edges, and `units` only ranks the runners-up and
    the progress reports."""
    with Workers(ctx, jobs) as workers:
        rounds = _Rounds(ctx, end, units, workers, searched, tried, refine, edges)
        rounds.progress, rounds.pairs = progress, pairs
        return rounds.run()


class _Rounds:
    """bounded_path's rounds and what they keep between them: the edges still live, the
    searches shared by structure, the candidates the time limit left out, and whether a
    floor lied."""

    def __init__(self, ctx: Context, end: int, units: Callable[[Edge], int],
                 workers: Workers, searched: Callable[[Edge], None],
                 tried: Callable[[Start, Groups], None], refine: Callable[[Edge], bool],
                 edges: Sequence[Edge]) -> None:
        self.ctx, self.end, self.units, self.workers = ctx, end, units, workers
        self.searched, self.tried, self.refine = searched, tried, refine
        self.live = [e for e in edges if not e.searched or e.choice is not None]
        # ids of edges no longer live that `live` still lists: it is filtered when walked
        # (filtering hundreds of thousands of edges every round of a deep chain adds up)
        self.dead: set[int] = set()
        self.shared: dict[StructureKey, Found | None] = {}
        self.left_out = 0
        self.lied = False  # a searched cost came out under its floor: floors count for nothing
        self.progress: ProgressSink | None = None  # told of each round (tell)
        self.pairs: PairPricing | None = None  # see bounded_path
        self.rounds = 0
        self.n_searched = sum(e.searched for e in edges)  # candidates searched so far
        # the live edges as arrays (solver.path_table; None: over pairs, or weights too
        # large for them): paths and distances without a walk in Python
        self.table: PathTable[Edge] | None = None
        # over pairs, a round's path costs far more than a traffic round's: its searches
        # are then worth as much time as finding it took (_wanted), from these two timings
        self.path_s = 0.0  # seconds the last path took
        self.item_s: float | None = None  # mean seconds of one work item so far

    def run(self) -> Outcome:
        """Path, refine or search, path again, until the path's edges are all searched."""
        if self.pairs is None:
            self.table = PathTable.of(self.live, self.end, lambda e: _weight(e, self.units))
        while True:
            if self.ctx.until is not None and time.perf_counter() >= self.ctx.until:
                self._drop_unsearched()
            path = self._cheapest()
            if path is None:
                raise PlanningError("no grouping of the layers passes the rules and fits the "
                                    "chip")
            raw = [e for e in path if not e.refined]
            if raw:  # the path again once these are known better: no search yet
                self._remove({id(e) for e in raw if not self._refined(e)})
                continue
            batch = [e for e in path if not e.searched]
            if self.progress is not None:
                self.tell(path)
            if not batch:
                return Outcome(path, self.left_out)
            self._search(batch)

    def _walk(self) -> list[Edge]:
        """The live edges, in their order (for the walks in Python)."""
        if self.dead:
            self.live = [e for e in self.live if id(e) not in self.dead]
            self.dead = set()
        return self.live

    def _remove(self, ids: set[int]) -> None:
        """These edges (by id) are no longer live."""
        if ids:
            self.dead |= ids
            if self.table is not None:
                self.table.drop(ids)

    def _changed(self, edges: Sequence[Edge]) -> None:
        """These edges' weights or searched flags changed: the table takes them again."""
        if self.table is not None and not self.table.refresh(edges):
            self.table = None  # a weight too large for its sums: walk in Python from now

    def _cheapest(self) -> list[Edge] | None:
        """The cheapest path over the live edges, over pairs of them with ``pairs``."""
        if self.table is not None:
            return self.table.cheapest()
        if self.pairs is None:
            return _cheapest(self._walk(), self.end, self.units)
        started = time.perf_counter()
        steps = cheapest_pairs(self._walk(), self.end, self.pairs)
        self.path_s = time.perf_counter() - started
        return None if steps is None else [e for e, _ in steps]

    def _wanted(self) -> int:
        """Work items a round should run: one per core; over pairs, as many more as its
        path took the time of (the cores would otherwise wait on paths that each settle
        one edge: a deep network's thousands of whole-map ends take hundreds of rounds)."""
        jobs = self.workers.jobs
        if self.pairs is None or self.item_s is None or self.item_s <= 0:
            return jobs
        return max(jobs, min(MOST_PER_ROUND, int(self.path_s * jobs / self.item_s)))

    def tell(self, path: Sequence[Edge]) -> None:
        """Tell the progress sink where the rounds are: candidates searched, those whose
        floor rules them out (the cheapest path through it costs no less than the best plan
        of searched groups), that plan's cost (the best so far) and this path's (a bound on
        every plan: searched costs and floors)."""
        assert self.progress is not None
        self.rounds += 1
        bound = sum(_weight(e, self.units) for e in path)
        if self.table is not None:
            plan = self.table.cheapest(self.table.searched_mask())
        else:
            plan = _cheapest([e for e in self._walk() if e.searched], self.end, self.units)
        best = None if plan is None else sum(_weight(e, self.units) for e in plan)
        cut = 0
        if best is not None and self.table is not None:
            cut = self.table.ruled_out(best)
        elif best is not None:
            live = self._walk()
            ahead = _distances(live, self.end, self.units, forward=True)
            behind = _distances(live, self.end, self.units, forward=False)
            cut = sum(1 for e in live if not e.searched and e.start in ahead
                      and e.end in behind
                      and ahead[e.start] + e.floor + behind[e.end] >= best)
        self.progress(Progress("bounded path", self.rounds, None, self.n_searched, cut,
                               best, bound))

    def _drop_unsearched(self) -> None:
        """Past the time limit: leave out the unsearched groups of several layers."""
        live = self._walk()
        dropped = [e for e in live if not e.searched and not e.required]
        self.left_out += len(dropped)
        self._remove({id(e) for e in dropped})

    def _refined(self, e: Edge) -> bool:
        """Refine an edge the rounds reached: False where it is no candidate after all (then
        never on a path, its memo tile neither)."""
        e.refined = True
        if not self.refine(e):
            e.choice = None  # no candidate: never on a path, its memo tile neither
            return False
        if self.lied:
            e.floor = 0
        self._changed([e])
        return True

    def _search(self, batch: list[Edge]) -> None:
        """One round of searches: the path's unsearched edges (and runners-up on idle
        cores), their results settled on the edges."""
        work = _work(self.ctx, batch, self.shared)
        gone: set[int] = set()
        wanted = self._wanted()
        if len(work) < wanted:  # idle cores: also the groups on the next cheapest paths
            work = self._add_runners_up(batch, work, gone, wanted)
        started = time.perf_counter()
        by_start = self._evaluate(work)
        if work:
            took = (time.perf_counter() - started) * min(self.workers.jobs, len(work)) \
                / len(work)
            self.item_s = took if self.item_s is None else (self.item_s + took) / 2
        self._settle_whole(by_start, gone)
        self._settle_batch(batch, gone)
        self._remove(gone)
        if self.lied:
            for e in self._walk():
                e.floor = 0
            if self.table is not None and not self.table.refresh_all():
                self.table = None

    def _add_runners_up(self, batch: list[Edge], work: dict[StructureKey | Start, Task | Start],
                        gone: set[int], wanted: int
                        ) -> dict[StructureKey | Start, Task | Start]:
        """The work with the edges of the next cheapest paths added to the batch, until it
        holds `wanted` items (those no candidate after all go to `gone`)."""
        if self.table is not None:
            ahead = self.table.runners_up(batch, RUNNERS_UP * wanted)
        else:
            ahead = _runners_up(self._walk(), self.end, self.units, batch)[:RUNNERS_UP * wanted]
        for e in ahead:
            if not e.refined and not self._refined(e):
                gone.add(id(e))
                continue
            batch.append(e)
            work = _work(self.ctx, batch, self.shared)
            if len(work) >= wanted:
                break
        return work

    def _evaluate(self, work: dict[StructureKey | Start, Task | Start]
                  ) -> dict[Start, Groups | None]:
        """Run the work on the workers: searches go to the shared results, whole-map starts'
        groups are returned by start (and told to ``tried``)."""
        # a round's searches are few and long: a pool pays off from two of them
        results = dict(zip(work, self.workers.map(_evaluate, list(work.values()),
                                                  [len(x.layers) for x in work.values()],
                                                  least=2),
                           strict=True))
        by_start: dict[Start, Groups | None] = {}
        for item, result in results.items():
            if isinstance(item, Start):
                assert result is None or isinstance(result, list)
                by_start[item] = result
                if result is not None:
                    self.tried(item, result)
            else:
                assert result is None or isinstance(result, Found)
                self.shared[item] = result
        return by_start

    def _settle_whole(self, by_start: Mapping[Start, Groups | None], gone: set[int]) -> None:
        """Give each live whole-map edge whose start was tried its tile, or send it to
        `gone`."""
        # each start's groups by length (a whole-map group is its start's first layers):
        # looking up a group of hundreds of layers by its names costs as many hashes
        lengths = {start: None if groups is None else {len(g): c for g, c in groups}
                   for start, groups in by_start.items()}
        settled = []
        for e in self._walk():
            if e.whole is not None and e.whole in lengths:
                found = lengths[e.whole]
                if found is None:  # past the time limit: not searched
                    self.left_out += 1
                    gone.add(id(e))
                    continue
                choice = found.get(e.end - e.start)
                if choice is None:  # not among the ends its start keeps
                    gone.add(id(e))
                    continue
                e.choice, e.searched, e.whole = choice, True, None
                self.n_searched += 1
                self.lied |= _floor_lied(e, self.units)
                settled.append(e)
        self._changed(settled)

    def _settle_batch(self, batch: Sequence[Edge], gone: set[int]) -> None:
        """Give each searched edge of the batch its structure's best tile, or send it to
        `gone` (past the time limit, or no tile passes)."""
        for e in batch:
            if e.whole is not None or e.searched or id(e) in gone:
                continue
            found = self.shared[_key(self.ctx, e)]
            if found is None:  # past the time limit: not searched
                self.left_out += 1
                gone.add(id(e))
                continue
            e.choice, e.searched, e.quick = found.best, True, found.quick
            e.options = found.options
            self.n_searched += 1
            self.searched(e)
            if e.choice is None:
                gone.add(id(e))
            else:
                self.lied |= _floor_lied(e, self.units)
                self._changed([e])


def _work(ctx: Context, batch: Sequence[Edge], shared: Mapping[StructureKey, Found | None]
          ) -> dict[StructureKey | Start, Task | Start]:
    """What evaluating these edges takes: a search per structure not searched yet, a try
    per whole-map start."""
    out: dict[StructureKey | Start, Task | Start] = {}
    for e in batch:
        if e.whole is not None:
            out.setdefault(e.whole, e.whole)
        elif (key := _key(ctx, e)) not in shared:
            out.setdefault(key, Task(e.layers, required=e.required))
    return out


def _evaluate(ctx: Context, item: Task | Start) -> Found | Groups | None:
    """One work item in a worker: a tile search or a whole-map start's try."""
    if isinstance(item, Start):
        return start_groups(ctx, item)
    return search(ctx, item)


def _runners_up(live: Sequence[Edge], end: int, units: Callable[[Edge], int],
                taken: Sequence[Edge]) -> list[Edge]:
    """Unsearched edges not taken, cheapest path through each first (the cost from 0 to its
    start, its weight, the cost from its end to `end`)."""
    ahead = _distances(live, end, units, forward=True)
    behind = _distances(live, end, units, forward=False)
    chosen = {id(e) for e in taken}
    through = [(ahead[e.start] + _weight(e, units) + behind[e.end], k, e)
               for k, e in enumerate(live)
               if not e.searched and id(e) not in chosen and e.start in ahead
               and e.end in behind]
    return [e for _, _, e in sorted(through, key=lambda x: x[:2])]


def _weight(e: Edge, units: Callable[[Edge], int]) -> int:
    """The edge's searched cost, or unsearched, its floor."""
    return units(e) if e.searched and e.choice is not None else e.floor


def _distances(edges: Sequence[Edge], end: int, units: Callable[[Edge], int],
               forward: bool) -> dict[int, int]:
    """The cheapest cost from position 0 to each position (forward), or from each to `end`."""
    dist = {0: 0} if forward else {end: 0}
    ordered = sorted(edges, key=lambda e: e.end if forward else -e.start)
    for e in ordered:
        a, b = (e.start, e.end) if forward else (e.end, e.start)
        if a in dist:
            d = dist[a] + _weight(e, units)
            if b not in dist or d < dist[b]:
                dist[b] = d
    return dist


def _floor_lied(e: Edge, units: Callable[[Edge], int]) -> bool:
    """A floor above a searched cost is a bug of the floor: then no floor is trusted (every
    edge is searched before the path may use it)."""
    assert e.choice is not None
    return units(e) < e.floor


def _key(ctx: Context, e: Edge) -> StructureKey:
    """The structure an unsearched edge's search shares (it has its io), worked out once."""
    if e.key is None:
        assert e.io is not None
        e.key = structure_key(ctx.graph, e.io)
    return e.key


def _cheapest(edges: Sequence[Edge], end: int, units: Callable[[Edge], int]
              ) -> list[Edge] | None:
    """The cheapest path 0 -> end over the edges (positions only increase along an edge),
    each weighing its searched cost or, unsearched, its floor; ties: the fewest unsearched
    edges, then the first edge in the order given."""
    into: dict[int, list[Edge]] = {}
    for e in edges:
        into.setdefault(e.end, []).append(e)
    best: dict[int, tuple[int, int, Edge | None]] = {0: (0, 0, None)}
    for j in range(1, end + 1):
        here = None
        for e in into.get(j, ()):
            if e.start not in best:
                continue
            cost, unknown, _ = best[e.start]
            weight = _weight(e, units)
            cand = (cost + weight, unknown + (not e.searched), e)
            if here is None or cand[:2] < here[:2]:
                here = cand
        if here is not None:
            best[j] = here
    if end not in best:
        return None
    path: list[Edge] = []
    at = end
    while at:
        last = best[at][2]
        assert last is not None
        path.append(last)
        at = last.start
    return path[::-1]


class PairPricing(Protocol):
    """Prices what an edge adds to a plan given the edge after it (see bounded_path)."""

    def kinds(self, e: Edge) -> Sequence[Hashable]:
        """The states an edge can run in that its predecessor's price depends on."""
        ...

    def follows(self, b: Edge, kind: Hashable) -> Hashable:
        """What an edge in that state is to the edge before it (its price's argument)."""
        ...

    def adds(self, a: Edge, kind: Hashable, after: Hashable | None) -> tuple[int, int]:
        """(what edge a in state `kind` adds followed by an edge that `follows` calls
        `after` (None: a ends the plan), the way of running a that adds that)."""
        ...

    def least(self, a: Edge, kind: Hashable) -> int:
        """No more than what `adds` says edge a in state `kind` adds before any edge that
        may follow it (lets the path skip predecessors that cannot win)."""
        ...


def cheapest_pairs(edges: Sequence[Edge], end: int, pricing: PairPricing
                   ) -> list[tuple[Edge, int]] | None:
    """The cheapest path 0 -> end over the edges, each priced by what it adds given the
    edge after it (a shortest path over the line graph of the edges' states); ties as
    _cheapest. Returns each edge of the path with its way of running."""
    by_start: dict[int, list[tuple[Edge, Hashable]]] = {}
    for e in edges:
        by_start.setdefault(e.start, []).extend((e, k) for k in pricing.kinds(e))
    # per state: the cheapest (cost, unsearched edges, state before) of a path from 0 up to
    # its start, every edge before it priced given its successor
    State = tuple[Edge, Hashable]
    reach: dict[tuple[int, Hashable], tuple[int, int, State | None]] = {
        (id(e), k): (0, 0, None) for e, k in by_start.get(0, ())}
    ending: dict[int, list[State]] = {}
    last: tuple[int, int, State] | None = None
    for start in sorted(by_start):
        # the states ending here are final: price each kind of successor once, trying
        # them cheapest bound first and stopping where a bound exceeds the best found
        # (ties as min over them in their order: the index k breaks them)
        here = [x for x in by_start[start] if (id(x[0]), x[1]) not in reach]
        ranked = sorted((reach[id(a), ka][0] + pricing.least(a, ka), k, a, ka)
                        for k, (a, ka) in enumerate(ending.get(start, ())))
        best: dict[Hashable, tuple[int, int, State]] = {}
        for b, kb in here:
            cls = pricing.follows(b, kb)
            if cls not in best:
                top: tuple[int, int, int, State] | None = None
                for lb, k, a, ka in ranked:
                    if top is not None and lb > top[0]:
                        break
                    cost, unknown, _ = reach[id(a), ka]
                    tried = (cost + pricing.adds(a, ka, cls)[0], unknown + (not a.searched),
                             k, (a, ka))
                    if top is None or tried[:3] < top[:3]:
                        top = tried
                if top is None:
                    continue
                best[cls] = (top[0], top[1], top[3])
            reach[id(b), kb] = best[cls]
        for a, ka in by_start[start]:
            if (id(a), ka) not in reach:
                continue
            ending.setdefault(a.end, []).append((a, ka))
    for a, ka in ending.get(end, []):
        cost, unknown, _ = reach[id(a), ka]
        cand = (cost + pricing.adds(a, ka, None)[0], unknown + (not a.searched), (a, ka))
        if last is None or cand[:2] < last[:2]:
            last = cand
    if last is None:
        return None
    states = [last[2]]
    while (prev := reach[id(states[-1][0]), states[-1][1]][2]) is not None:
        states.append(prev)
    states.reverse()
    out = []
    for k, (a, ka) in enumerate(states):
        after = None if k + 1 == len(states) else pricing.follows(*states[k + 1])
        out.append((a, pricing.adds(a, ka, after)[1]))
    return out
