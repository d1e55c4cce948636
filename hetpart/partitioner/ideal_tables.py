"""The ideals of a graph and the costs over them that the DP of ideals.py runs on (NOTE [ideal DP]).

An ideal (a downset) is a set of nodes closed under predecessors; `ideal_tables` lists the ones a
plan's boundaries can be (pins, co-location groups, NOTE [twin branches]) with each one's compute
per device type, the bytes over the boundary after it and the memory relaxation, all by the
formulas of costs.py. Where free nodes make too many ideals, NOTE [ideal DP free nodes].
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.graph.python import max_flow

from hetpart.partitioner.costs import downset_cut_bytes, held_weight_bytes, least_stash, node_sends, node_times_ns
from hetpart.partitioner.problem import (
    COLOCATE, FORBIDDEN_TYPES, MEM_BYTES, OUT_BYTES, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Problem,
)
from hetpart.partitioner.symmetry import twin_order

IDEAL_MAX = 12_000  # ideals the DP may run over (its bit matrices grow with their square)
_VISIT_MAX = 20_000  # ideals enumerated at most, those that split a co-location group included
_VISIT_WORK = 12_000_000  # ... and at most this many (ideal, node) checks: 12,000 ideals at 1,000 nodes


def enumerate_ideals(problem: Problem, limit: int = _VISIT_MAX, deadline: float | None = None,
                     before: list[tuple[str, str]] = ()) -> list[int] | None:
    """Every ideal of the graph as a bitmask over `problem.node_order()`, sorted by size; None
    above `limit` or past the deadline. Breadth first, one size at a time, the ideals of a size as bool rows.
    `before`: pairs (u, w) such that an ideal holding w must hold u (NOTE [twin branches])."""
    order = problem.node_order()
    index = {v: i for i, v in enumerate(order)}
    inputs = [[index[u] for u in problem.graph.predecessors(v)] for v in order]
    for u, w in before:
        inputs[index[w]].append(index[u])
    return enumerate_downsets(inputs, limit, deadline)


def enumerate_downsets(inputs: list[list[int]], limit: int = _VISIT_MAX,
                       deadline: float | None = None) -> list[int] | None:
    """`enumerate_ideals` over items 0..n-1, item i's inputs (the items every set holding i must hold)
    `inputs[i]`: every such set as a bitmask, sorted by size; None above `limit` or past the deadline."""
    n = len(inputs)
    flat = np.array([u for us in inputs for u in us], dtype=np.int64)  # every node's inputs, node by node
    ends = np.cumsum([len(us) for us in inputs])
    starts = ends - np.array([len(us) for us in inputs])
    level = np.zeros((1, n), dtype=bool)
    found = [0]
    while len(level):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        # A node may join an ideal when it is outside and none of its inputs is.
        outside = np.zeros((len(level), len(flat) + 1), dtype=np.int32)
        np.cumsum(~level[:, flat], axis=1, out=outside[:, 1:])
        ready = ~level & (outside[:, ends] == outside[:, starts])
        rows, nodes = np.nonzero(ready)
        grown = level[rows]
        grown[np.arange(len(rows)), nodes] = True
        packed = np.packbits(grown, axis=1, bitorder="little")
        packed = np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).ravel()).view(np.uint8).reshape(
            -1, packed.shape[1])
        if len(found) + len(packed) > limit:
            return None
        found.extend(sorted(int.from_bytes(row.tobytes(), "little") for row in packed))
        level = np.unpackbits(packed, axis=1, count=n, bitorder="little").astype(bool)
    return found


def proper_subsets(member: np.ndarray) -> np.ndarray:
    """[I, J] bool: set I (a row of `member`, [set, item] bool) is a proper subset of set J."""
    # I is a subset of J when no node of I is outside J; proper when it is also smaller.
    sizes = member.sum(1)
    inside, outside = member.astype(np.float32), (~member).astype(np.float32).T
    subset = np.zeros((len(member), len(member)), dtype=bool)
    for lo in range(0, len(member), 1024):  # blocks of rows: the whole product would take GBs
        rows = slice(lo, lo + 1024)
        subset[rows] = (inside[rows] @ outside == 0) & (sizes[rows, None] < sizes[None, :])
    return subset


def _bits(masks: list[int], n: int) -> np.ndarray:
    """[mask, bit] bool: the low n bits of each mask."""
    size = (n + 7) // 8
    raw = np.frombuffer(b"".join(m.to_bytes(size, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(raw.reshape(len(masks), size), axis=1, count=n, bitorder="little").astype(bool)


@dataclass
class IdealTables:
    """Costs over the ideals of NOTE [ideal DP], sorted by size: 0 is {}, `n` is V."""

    order: list[str]
    ideals: list[int]  # bitmasks over `order`
    member: np.ndarray  # [ideal, node] bool
    comp: dict[str, np.ndarray]  # device type -> compute of each ideal on that type
    cut_bytes: np.ndarray  # bytes over the boundary after each ideal
    cut_tensors: np.ndarray  # tensors over it, each paying the link's latency (NOTE [stage time])
    mem_prefix: np.ndarray  # the memory relaxation of NOTE [ideal DP], additive over ideals
    forbidden: dict[str, np.ndarray]  # device type -> nodes of each ideal that cannot run on it
    subset: np.ndarray  # [I, J]: I is a proper subset of J
    final_ok: np.ndarray  # the last stage may start after this ideal (it keeps an unpinned node)
    # NOTE [ideal DP free nodes]: the free nodes left out of `order`, and per ideal those of them
    # that go before its boundary (a bitmask over `free`).
    free: list[str] = field(default_factory=list)
    free_inside: list[int] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ideals) - 1


def ideal_tables(problem: Problem, limit: int = IDEAL_MAX, relaxed: bool = False,
                 deadline: float | None = None, visit_max: int = _VISIT_MAX,
                 visit_work: int = _VISIT_WORK) -> IdealTables | None:
    """NOTE [ideal DP]'s tables; None when the graph has more than `limit` usable ideals, or past the deadline.
    `relaxed`: over the ideals of the graph without its free nodes (NOTE [ideal DP free nodes]).
    Twins are ordered (NOTE [twin branches]): the ideals are those that hold every elder twin of their nodes."""
    original, free = problem, []
    if relaxed:
        problem, free = _without_free_nodes(problem)
    g = problem.graph
    order = problem.node_order()
    n = len(order)
    twins = [(u, w) for u, w in twin_order(original) if u in g and w in g]
    every = enumerate_ideals(problem, min(visit_max, visit_work // max(1, n)), deadline, twins)
    if every is None:
        return None
    index = {v: i for i, v in enumerate(order)}
    bit = lambda vs: sum(1 << index[v] for v in vs)  # noqa: E731
    firsts = bit(v for v in order if g.nodes[v].get(PIN) == PIN_FIRST)
    lasts = bit(v for v in order if g.nodes[v].get(PIN) == PIN_LAST)
    groups = [bit(ms) for ms in problem.colocation_groups().values()]
    full = (1 << n) - 1
    inner = [s for s in every[1:-1]
             if s & firsts == firsts and s & lasts == 0 and all(s & m in (0, m) for m in groups)]
    ideals = [0, *inner, full]
    if len(ideals) > limit:
        return None
    member = _bits(ideals, n)
    as_int = member.astype(np.int64)
    comp = {t: as_int @ node_times_ns(problem, order, t) for t in problem.device_types}
    cut = downset_cut_bytes(problem, order, member)
    cut_tensors = downset_cut_bytes(problem, order, member, weight=OUT_TENSORS)
    stash = least_stash(problem)
    own = np.array([stash * g.nodes[v].get(MEM_BYTES, 0) for v in order], dtype=np.int64)
    first_reader: dict[str, int] = {}
    for i, v in enumerate(order):
        for w in g.nodes[v].get(WEIGHTS, ()):
            first_reader.setdefault(w, i)
    for w, i in first_reader.items():
        own[i] += held_weight_bytes(problem, w)
    forbidden = {t: as_int @ np.array([t in g.nodes[v].get(FORBIDDEN_TYPES, ()) for v in order], dtype=np.int64)
                 for t in problem.device_types}
    subset = proper_subsets(member)
    if relaxed:  # a stage may run nothing (a relay, NOTE [ideal DP free nodes])
        inner_index = np.arange(1, len(ideals) - 1)
        subset[inner_index, inner_index] = True
    # The last stage keeps a node not pinned last; with relays (a relaxation) it need not.
    final_ok = np.array([(s | lasts) != full or (relaxed and s != full) for s in ideals])
    tab = IdealTables(order=order, ideals=ideals, member=member, comp=comp, cut_bytes=cut, cut_tensors=cut_tensors,
                      mem_prefix=as_int @ own, forbidden=forbidden, subset=subset, final_ok=final_ok)
    return _fewest_bytes_with_free_nodes(original, tab, free, deadline) if relaxed else tab


# NOTE [ideal DP free nodes]
# Where a graph has too many ideals, the DP runs over fewer, losing no plan's value. A free node
# (no time on any type, no memory, weights, pin, group or forbidden type: views, slices, the
# `x[:, t]` of each time step of an unrolled RNN) changes no stage's compute or memory, only the
# bytes over boundaries. So the DP runs over the ideals C of the graph without free nodes (u
# before w there when a path of free nodes joins them), and the bytes over the boundary after C
# are the fewest over every choice of free nodes S before it that keeps C + S an ideal: a
# minimum cut (OR-Tools' max-flow, one per ideal; a value crosses when it is before the boundary
# and one of its readers after), and its tensors (NOTE [stage time]) the fewest likewise, by a
# second cut (both minima together: a boundary's time is at least their transfer). Every plan maps
# to a chain of such ideals no slower: its boundaries less their free nodes, each paying no more
# bytes and tensors; a stage of only free nodes becomes
# a relay (a stage running nothing, paying its two boundaries), and the last stage may hold only
# PIN_LAST nodes. So the DP's value is a lower bound. Its chain is a plan once each free node
# goes before the first boundary whose cut puts it there (the union of the cuts so far, an
# ideal at every boundary), unless it has a relay; that plan may pay more bytes than the cuts,
# and is optimal when it meets the bound. zoo:t5 goes from more than 300,000 ideals to 4,642,
# zoo:lstm (every time step's input a free slice of the embeddings) from 343,000 to 638.


def _is_free(attrs: dict) -> bool:
    return (not any(attrs[TIME_NS].values()) and not attrs.get(MEM_BYTES, 0) and not attrs.get(WEIGHTS)
            and not attrs.get(PIN) and attrs.get(COLOCATE) is None and not attrs.get(FORBIDDEN_TYPES))


def _without_free_nodes(problem: Problem) -> tuple[Problem, list[str]]:
    """NOTE [ideal DP free nodes]: the problem without its free nodes, u before w where a path of
    free nodes joins them; and the free nodes, in node order."""
    g = problem.graph
    free = [v for v in problem.node_order() if _is_free(g.nodes[v])]
    if not free:
        return problem, []
    gone = set(free)
    core = g.subgraph(v for v in g.nodes if v not in gone).copy()
    for u in list(core.nodes):
        stack, seen = [w for w in g.successors(u) if w in gone], set()
        while stack:
            x = stack.pop()
            if x not in seen:
                seen.add(x)
                for w in g.successors(x):
                    (stack.append(w) if w in gone else core.add_edge(u, w))
    return dataclasses.replace(problem, graph=core), free


def _fewest_bytes_with_free_nodes(problem: Problem, tab: IdealTables, free: list[str],
                                  deadline: float | None = None) -> IdealTables | None:
    """NOTE [ideal DP free nodes]: `tab` (over the ideals without free nodes) with each boundary's
    fewest bytes, and the free nodes before it, over the placements of the free nodes; and its fewest
    tensors, a second cut of the same network (the placement of fewest bytes may send more tensors).

    The cut: a free node on the source side goes before the boundary. Arcs: s -> v when a reader
    of v is before (it must be too), v -> t when an input of v is after; a reader of a free value
    before it only if the value is (r -> p); a value p before the boundary pays out(p) when a
    reader is after: when that reader is not free, p -> t (or a constant); otherwise through an
    auxiliary node y_p that may go before only with all of p's free readers (p -> y_p, y_p -> r)."""
    if not free:
        return tab
    cut, inside_free = _free_node_cuts(problem, tab, free, node_sends(problem, OUT_BYTES), deadline)
    if cut is None:
        return None
    tensors, _ = _free_node_cuts(problem, tab, free, node_sends(problem, OUT_TENSORS), deadline)
    if tensors is None:
        return None
    return dataclasses.replace(tab, cut_bytes=cut, cut_tensors=tensors, free=free, free_inside=inside_free)


def _free_node_cuts(problem: Problem, tab: IdealTables, free: list[str], out: dict[str, int],
                    deadline: float | None) -> tuple[np.ndarray | None, list[int]]:
    """The min cuts of `_fewest_bytes_with_free_nodes`, each value paying `out` (its bytes or its tensors):
    per ideal, the least paid and the free nodes before the boundary (a bitmask); None past the deadline."""
    g = problem.graph
    index = {v: i for i, v in enumerate(tab.order)}
    fidx = {v: 2 + i for i, v in enumerate(free)}
    inf = sum(out.values()) + 1
    member = tab.member
    m = len(tab.ideals)
    ones, zeros = np.ones(m, dtype=bool), np.zeros(m, dtype=bool)

    def any_in(vs: list[str]) -> np.ndarray:  # per ideal: one of these (non-free) nodes is in it
        return member[:, [index[v] for v in vs]].any(axis=1) if vs else zeros

    def all_in(vs: list[str]) -> np.ndarray:  # ... all of them are
        return member[:, [index[v] for v in vs]].all(axis=1) if vs else ones

    tails, heads, caps = [], [], []  # caps: per ideal (arrays of m)

    def arc(a: int, b: int, cap: np.ndarray) -> None:
        tails.append(a), heads.append(b), caps.append(cap)

    constant = np.zeros(m, dtype=np.int64)
    aux = 2 + len(free)
    for p in [*free, *tab.order]:
        readers = list(g.successors(p))
        free_readers = [fidx[r] for r in readers if r in fidx]
        core_readers = [r for r in readers if r not in fidx]
        core_out = ~all_in(core_readers) if core_readers else zeros  # a non-free reader is after
        if p in fidx:
            v = fidx[p]
            preds = list(g.predecessors(p))
            forced_out = ~all_in([u for u in preds if u not in fidx])
            arc(0, v, np.where(any_in(core_readers), inf, 0))
            arc(v, 1, np.where(forced_out, inf, np.where(core_out, out[p], 0)))
            for u in preds:
                if u in fidx:
                    arc(v, fidx[u], np.full(m, inf))
            source, pays = v, ~core_out
        else:
            inside = member[:, index[p]]
            constant += np.where(inside & core_out, out[p], 0)
            if not free_readers:
                continue
            source = aux
            aux += 1
            arc(0, source, np.where(inside, inf, 0))
            pays = inside & ~core_out
        if free_readers and out[p]:
            arc(source, aux, np.where(pays, out[p], 0))
            for r in free_readers:
                arc(aux, r, np.full(m, inf))
            aux += 1
    tails_a, heads_a = np.array(tails, dtype=np.int64), np.array(heads, dtype=np.int64)
    caps_m = np.array(caps, dtype=np.int64).T  # [ideal, arc]
    cut = np.zeros(m, dtype=np.int64)
    inside_free = []
    for i in range(m):
        if deadline is not None and i % 256 == 0 and time.perf_counter() > deadline:
            return None, []
        flow = max_flow.SimpleMaxFlow()
        flow.add_arcs_with_capacity(tails_a, heads_a, caps_m[i])
        flow.solve(0, 1)
        cut[i] = constant[i] + flow.optimal_flow()
        side = np.asarray(flow.get_source_side_min_cut(), dtype=np.int64)
        before = np.zeros(len(free), dtype=bool)
        before[side[(side >= 2) & (side < 2 + len(free))] - 2] = True
        inside_free.append(int.from_bytes(np.packbits(before, bitorder="little").tobytes(), "little"))
    return cut, inside_free
