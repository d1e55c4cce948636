"""The exact plan over all ideals of the graph, where the graph has few of them (NOTE [ideal DP]).

An ideal (a downset) is a set of nodes closed under predecessors. The stages before
any boundary of a valid plan form an ideal, so every plan is a chain of ideals
{} < I_1 < ... < I_S-1 < V, stage k running I_k minus I_k-1. The DP of dp.py,
run over ideals instead of the prefixes of one topological order, is exact over every
plan, contiguous or not.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.graph.python import max_flow

from hetpart.partitioner.costs import (
    device_classes,
    downset_cut_bytes,
    held_weight_bytes,
    least_stash,
    link_kind_ns,
    node_times_ns,
    same_machine,
    sequence_devices,
    stage_time_ns,
    transfer_ns,
)
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import (
    COLOCATE, FORBIDDEN_TYPES, MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Plan, Problem,
)
from hetpart.partitioner.symmetry import twin_order
from hetpart.partitioner.verify import plan_violations

IDEAL_MAX = 12_000  # ideals the DP may run over (its bit matrices grow with their square)
PAIRS_MAX = 30_000_000  # stages (I, J) below the known plan kept, over all device types: 8 bytes each
_VISIT_MAX = 20_000  # ideals enumerated at most, those that split a co-location group included
_VISIT_WORK = 12_000_000  # ... and at most this many (ideal, node) checks: 12,000 ideals at 1,000 nodes

# NOTE [ideal DP]
# `_dp_over` (dp.py) minimises the bottleneck over chains of "positions" 0 = P_0 < ... < P_S = n,
# with every cost a vector over positions (the compute before it, the bytes over it) or a
# matrix over pairs (a stage's memory, whether it may run on a type). Positions here are the
# ideals of the graph, sorted by size, {} first and V last: the compute of stage J \ I is
# comp(J) - comp(I), the bytes over boundary I are the outputs of I read outside I (exactly
# `evaluate`'s, NOTE [stage time]), and a pair (I, J) is a stage only when I is a proper subset
# of J. Pins and co-location groups restrict the ideals themselves: every boundary ideal holds
# the PIN_FIRST nodes, none of the PIN_LAST ones, and all or none of each group.
# Memory is the one relaxation: a stage's weights are counted by first reader (a weight is
# charged to the stage holding its first reader in the node order, which does hold it) and
# its activations with the least stash of any stage (NOTE [training memory]). So with exact
# device classes and no deadline, the DP's value is a lower bound of every plan's bottleneck,
# and its plan, re-costed by `evaluate`, is optimal whenever it fits in memory.
# Transformers lowered at FX level have few ideals (zoo:gpt-small 241, zoo:llama 4,307), fewer
# still without their free nodes (NOTE [ideal DP free nodes]). Branchy graphs have tens of
# thousands or more; where the branches are twins (NOTE [twin branches] in symmetry.py: an
# ideal holding one holds its elder twin) they drop to a few thousand: zoo:moe from 191,835 to
# 10,019 (four experts a layer), zoo:unet from 28,348 to 7,318, zoo:t5 from 4,642 to 2,060.
# Each device type keeps the pairs (I, J) whose compute is below the known plan's bottleneck
# (at most PAIRS_MAX in all: with few devices, stages are long and nearly every pair is one;
# zoo:moe on mixed-4 has 40M and is left to CP-SAT, which certifies it in 2-3 s; on spot-16 14M),
# and NOTE [ideal DP bisection] finds the least bottleneck by deciding, for one bottleneck at a
# time, whether a chain of stages below it exists.

# NOTE [ideal DP pruning]
# A state's entry for ideal I (stages so far make up I, the next runs on `cur`) is dropped when
# the devices left cannot run what is outside I within the best bottleneck B so far. For
# multipliers lambda_t >= 0 (1 each; each type's 1 / its total time), the nodes outside I need
# at least sum_v min_t lambda_t time_t(v) of weighted work (NOTE [Lagrangian LP bound]); a
# device of type t left runs at most lambda_t * B of it less its two boundaries, each at least
# c = the cheapest link's time for the fewest bytes any boundary carries (a device may also stay
# idle: no less than 0); the first stage pays the boundary into it instead, the last one none
# out; and a machine other than cur's that is used at all costs a network boundary (its
# devices' share, less 2 x (network - c) weighted by the least multiplier, no less than 0).
# NOTE [ideal DP dominance]: see `_Decider.chain_below`. Both together took zoo:llama on spot-16
# (4,307 ideals, 625 device-count states) from 83 s to 13 s, in the DP over values that NOTE
# [ideal DP bisection] replaced. The boundary after a stage runs over its machine's link or the
# network whatever the next class is, so the ideals after it are found once per link, not once
# per next class.


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
                 deadline: float | None = None) -> IdealTables | None:
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
    every = enumerate_ideals(problem, min(_VISIT_MAX, _VISIT_WORK // max(1, n)), deadline, twins)
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
    tab = IdealTables(order=order, ideals=ideals, member=member, comp=comp, cut_bytes=cut, mem_prefix=as_int @ own,
                      forbidden=forbidden, subset=subset, final_ok=final_ok)
    return _fewest_bytes_with_free_nodes(original, tab, free, deadline) if relaxed else tab


# NOTE [ideal DP free nodes]
# Where a graph has too many ideals, the DP runs over fewer, losing no plan's value. A free node
# (no time on any type, no memory, weights, pin, group or forbidden type: views, slices, the
# `x[:, t]` of each time step of an unrolled RNN) changes no stage's compute or memory, only the
# bytes over boundaries. So the DP runs over the ideals C of the graph without free nodes (u
# before w there when a path of free nodes joins them), and the bytes over the boundary after C
# are the fewest over every choice of free nodes S before it that keeps C + S an ideal: a
# minimum cut (OR-Tools' max-flow, one per ideal; a value crosses when it is before the boundary
# and one of its readers after). Every plan maps to a chain of such ideals no slower: its
# boundaries less their free nodes, each paying no more bytes; a stage of only free nodes becomes
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
    fewest bytes, and the free nodes before it, over the placements of the free nodes.

    The cut: a free node on the source side goes before the boundary. Arcs: s -> v when a reader
    of v is before (it must be too), v -> t when an input of v is after; a reader of a free value
    before it only if the value is (r -> p); a value p before the boundary pays out(p) when a
    reader is after: when that reader is not free, p -> t (or a constant); otherwise through an
    auxiliary node y_p that may go before only with all of p's free readers (p -> y_p, y_p -> r)."""
    g = problem.graph
    if not free:
        return tab
    index = {v: i for i, v in enumerate(tab.order)}
    fidx = {v: 2 + i for i, v in enumerate(free)}
    out = {v: int(g.nodes[v].get(OUT_BYTES, 0)) for v in g.nodes}
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
            return None
        flow = max_flow.SimpleMaxFlow()
        flow.add_arcs_with_capacity(tails_a, heads_a, caps_m[i])
        flow.solve(0, 1)
        cut[i] = constant[i] + flow.optimal_flow()
        side = np.asarray(flow.get_source_side_min_cut(), dtype=np.int64)
        before = np.zeros(len(free), dtype=bool)
        before[side[(side >= 2) & (side < 2 + len(free))] - 2] = True
        inside_free.append(int.from_bytes(np.packbits(before, bitorder="little").tobytes(), "little"))
    return dataclasses.replace(tab, cut_bytes=cut, free=free, free_inside=inside_free)


@dataclass(frozen=True)
class IdealResult:
    bound_ns: int  # no plan of the problem has a smaller bottleneck
    plan: Plan | None  # the best plan found below upper_ns: optimal when its bottleneck is bound_ns
    finished: bool = True  # False: stopped at the deadline (the bound is what was proven by then)

    def settled(self, gap: float, upper_ns: int | None = None) -> bool:
        """The plan, or else a known plan of bottleneck `upper_ns`, is certified within `gap`
        (relative to the plan) by the bound."""
        value = self.plan.bottleneck_ns if self.plan is not None else upper_ns
        return value is not None and value - self.bound_ns <= gap * value


def _stage_pairs(tab: IdealTables, kinds: list[tuple[str, int]], upper_ns: int,
                 most: int) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] | None:
    """Per (device type, capacity), the stages (I, J) it can run in less than `upper_ns` of compute:
    (I, J) sorted by I; None when there are more than `most` in all. The pairs any of them can run
    are found first, one block of rows at a time (the full matrices would take GBs)."""
    most_cap = max(cap for _, cap in kinds)
    types = sorted({t for t, _ in kinds})
    got_i, got_j = [], []
    for lo in range(0, tab.n + 1, 512):
        rows = np.arange(lo, min(lo + 512, tab.n + 1))
        ok = tab.subset[rows] & (tab.mem_prefix[None, :] - tab.mem_prefix[rows][:, None] <= most_cap)
        fast = np.zeros_like(ok)
        for t in types:
            fast |= tab.comp[t][None, :] - tab.comp[t][rows][:, None] < upper_ns
        a, b = np.nonzero(ok & fast)
        got_i.append((a + lo).astype(np.int32)), got_j.append(b.astype(np.int32))
        if sum(len(x) for x in got_i) > most:
            return None
    pi, pj = np.concatenate(got_i), np.concatenate(got_j)
    pairs, count = {}, 0
    for t, cap in kinds:
        comp, f = tab.comp[t], tab.forbidden[t]
        keep = np.concatenate([(comp[j] - comp[i] < upper_ns) & (f[j] == f[i])
                               & (tab.mem_prefix[j] - tab.mem_prefix[i] <= cap)
                               for i, j in zip(np.split(pi, range(1 << 22, len(pi), 1 << 22)),
                                               np.split(pj, range(1 << 22, len(pj), 1 << 22)))])
        count += int(keep.sum())
        if count > most:
            return None
        pairs[(t, cap)] = (pi[keep], pj[keep])
    return pairs


def ideal_dp(problem: Problem, upper_ns: int, deadline: float | None = None, limit: int = IDEAL_MAX,
             multipliers: tuple = (), lower_ns: int = 0, gap: float = 0.0) -> IdealResult | None:
    """NOTE [ideal DP]: the least bottleneck of any plan below `upper_ns` (a known plan's; the
    bound is `upper_ns` when there is none), and the best plan found on the way, by NOTE [ideal DP
    bisection] from `lower_ns` (a valid bound); it stops once that plan is within `gap` of the
    bound. None when the graph has too many ideals, or the deadline came before anything was
    proven or found; at the deadline, the bound proven so far and the best plan found
    (`finished` False).

    The graph without its free nodes (NOTE [ideal DP free nodes]) goes first (fewer ideals:
    zoo:llama 1,419 instead of 4,307); when its best chain is no plan (a relay stage, or memory),
    the graph itself, if it has few enough ideals."""
    attempts = [True, False] if any(_is_free(a) for _, a in problem.graph.nodes(data=True)) else [False]
    best: IdealResult | None = None
    for relaxed in attempts:
        tab = ideal_tables(problem, limit, relaxed=relaxed, deadline=deadline)
        if tab is None:
            break  # the deadline, or too many ideals: the graph itself has no fewer than without free nodes
        lower = max(lower_ns, best.bound_ns if best else 0)
        upper = best.plan.bottleneck_ns if best and best.plan else upper_ns
        decider = _Decider(problem, tab, upper, multipliers)
        if decider.pairs is None:
            break  # too many stages to keep (few devices, so long ones); the graph itself has no fewer
        got = decider.bisect(lower, deadline, gap)
        best = got if best is None else IdealResult(max(best.bound_ns, got.bound_ns), got.plan or best.plan,
                                                    got.finished)
        if not got.finished or best.settled(gap, upper_ns):
            break  # the deadline, or a plan (this one, or the known one) proven good enough
    if best is None or (best.bound_ns == 0 and best.plan is None):
        return None
    return best


# NOTE [ideal DP bisection]
# For a bottleneck U, the DP decides whether some chain of ideals has every stage below U
# (memory relaxed as in NOTE [ideal DP]): reachability, one bit per ideal and state, where the
# DP of dp.py keeps a value. The pairs (I, J) a class can run below U, for each link into the
# stage (none: the first stage; cur's machine's; the network) and out of it, are bit matrices,
# and a state's next ideals are the OR of the rows of the ideals it reached: 8 pairs a byte and
# no arithmetic per pair (zoo:t5 on spot-16, 4,467 ideals: about 1 s a decision, where the DP
# over values took 13 s told to beat the optimum itself and 35 s told to beat the order DP's
# plan). Bisection between `lo` (no chain below it) and `hi` (a chain's value) finds the
# optimum in about log2(hi - lo) decisions; each that finds nothing proves its U, so at the
# deadline the bound is the last U proven. It stops once the best plan found is within the gap
# asked for, and with a gap the decisions aim there: U = hi less the gap, which settles the
# plan when no chain is below it. A chain found below the aim is often just below it, so after
# one the next decision halves: zoo:moe on spot-16 (the order DP's plan 2.4% above the plan found)
# settles in 5 decisions where halving alone takes 6; zoo:t5 (15% above) in 3 where it takes 6.
_TIMEOUT = "timeout"


def _packed(rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """The n x n bit matrix (np.packbits' layout) with ones at (rows, cols), given in row-major
    order: each byte is the OR of its bits, without the dense matrix."""
    width = (n + 7) // 8
    out = np.zeros((n, width), dtype=np.uint8)
    if len(rows):
        at = rows.astype(np.int64) * width + (cols >> 3)
        starts = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])
        out.ravel()[at[starts]] = np.bitwise_or.reduceat((128 >> (cols & 7)).astype(np.uint8), starts)
    return out


class _Decider:
    """NOTE [ideal DP bisection] on the tables `tab` of `problem`, for bottlenecks below `upper_ns`."""

    def __init__(self, problem: Problem, tab: IdealTables, upper_ns: int, multipliers: tuple) -> None:
        self.problem, self.tab, self.upper_ns = problem, tab, upper_ns
        n = tab.n
        self.classes = device_classes(problem)
        self.sizes = np.array([len(c.devices) for c in self.classes])
        self.max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
        # The boundary next to a stage on class c, by kind (NOTE [device sequences] in costs.py): -1
        # none (before the first stage), 0 the network, 1 c's machine's link (a machine with one
        # device never has kind 1).
        self.link = [{kind: link_kind_ns(problem, c, kind, tab.cut_bytes) for kind in (-1, 0, 1)}
                     for c in self.classes]
        self.intra_le_net = [bool((lk[1] <= lk[0]).all()) for lk in self.link]
        self.machine = [c.machine for c in self.classes]
        types = problem.device_types
        self.cls_t = np.array([types.index(c.type) for c in self.classes])
        machines = sorted(set(self.machine))
        self.n_machines = len(machines)
        self.cls_m = np.array([machines.index(mc) for mc in self.machine])
        # Every boundary carries at least the fewest bytes over any inner ideal (NOTE [stage time]).
        least = int(tab.cut_bytes[1:-1].min()) if n > 1 else 0
        links = [problem.intra_node_links[mc] for mc in machines if sum(d.node == mc for d in problem.devices) > 1]
        self.c_net = transfer_ns(problem.network, least)
        self.c_min = min([transfer_ns(link, least) for link in links] + [self.c_net])
        g = problem.graph
        node_time = np.stack([node_times_ns(problem, tab.order, t) for t in types], axis=1).astype(np.float64)
        node_allowed = np.array([[t in problem.allowed_types(v) for t in types] for v in tab.order])
        member_int = tab.member.astype(np.float64)
        totals = np.where(node_allowed, node_time, 0.0).sum(axis=0)
        self.weighted = []
        for lam in [np.ones(len(types)), np.where(totals > 0, 1.0 / np.maximum(totals, 1.0), 0.0), *multipliers]:
            lam = np.asarray(lam, dtype=np.float64)
            # Work of the nodes outside each ideal, each at its cheapest weighted type: a lower bound
            # of what the devices after it run, weighted (NOTE [Lagrangian LP bound] in bounds.py).
            per_node = np.min(np.where(node_allowed, node_time * lam[None, :], np.inf), axis=1)
            self.weighted.append((float(per_node.sum()) - member_int @ per_node, lam))
        # Per (type, capacity): the stages it can run below the known plan (NOTE [ideal DP]); None
        # when there are more than PAIRS_MAX in all.
        self.pairs = _stage_pairs(tab, list(dict.fromkeys((c.type, c.capacity_bytes) for c in self.classes)),
                                  upper_ns, PAIRS_MAX)
        self._capacity: dict[tuple, tuple[float, float]] = {}

    def capacity(self, left: np.ndarray, home: int, k: int, u: int) -> tuple[float, float]:
        """NOTE [ideal DP pruning]: (the most work, weighted by multipliers k, that the devices
        `left` (per class, the next stage's included, on machine `home`) run with every stage below
        u, the least multiplier among them): what is outside an ideal must fit, less that
        multiplier times the boundary into the next stage."""
        key = (left.tobytes(), home, k, u)
        if key not in self._capacity:
            lam_c = self.weighted[k][1][self.cls_t]
            low = float(lam_c[left > 0].min())
            per_class = left * np.maximum(0.0, lam_c * float(u) - 2 * low * self.c_min)  # a device may stay idle
            per_machine = np.bincount(self.cls_m, weights=per_class, minlength=self.n_machines)
            others = np.delete(per_machine, home)
            total = (per_machine[home] + np.maximum(0.0, others - 2 * low * (self.c_net - self.c_min)).sum()
                     + 2 * low * self.c_min)
            self._capacity[key] = (total * (1 + 1e-9) + 1, low)
        return self._capacity[key]

    def matrices(self, u: int) -> list[dict]:
        """Per class, the stages below u: {(kind in, kind out): packed bit rows I, columns J},
        the first stage's (-1, kind out) one row; {(kind in, 'last'): bool over I}, J = V."""
        tab, n = self.tab, self.tab.n
        out = []
        for c, cls in enumerate(self.classes):
            pi, pj = self.pairs[(cls.type, cls.capacity_bytes)]
            comp, link = tab.comp[cls.type], self.link[c]
            dcomp = comp[pj] - comp[pi]
            keep = np.flatnonzero(dcomp < u)
            pi, pj, dcomp = pi[keep], pj[keep], dcomp[keep]
            first = int(np.searchsorted(pi, 1))  # the stages from {} (pairs are sorted by I)
            mats = {}
            # Link kind 1 only where c's machine has another device.
            kinds = (0, 1) if self.sizes[self.cls_m == self.cls_m[c]].sum() > 1 else (0,)
            for kin in (-1, *kinds):
                end = None if kin >= 0 else first
                a, b, dc = pi[:end], pj[:end], dcomp[:end]
                tin = link[kin][a]
                last = np.zeros(n + 1, dtype=bool)
                last[a[(b == n) & tab.final_ok[a] & (stage_time_ns(dc, tin, 0) < u)]] = True
                mats[(kin, "last")] = last
                for kout in kinds:
                    ok = (b < n) & (stage_time_ns(dc, tin, link[kout][b]) < u)
                    if kin < 0:
                        row = np.zeros(n + 1, dtype=bool)
                        row[b[ok]] = True
                        mats[(kin, kout)] = np.packbits(row)[None, :]
                    else:
                        mats[(kin, kout)] = _packed(a[ok], b[ok], n + 1)
            out.append(mats)
        return out

    def chain_below(self, u: int, deadline: float | None) -> list[tuple[int, int]] | None | str:
        """A chain of (start ideal, class), every stage below u (memory relaxed); None when there is
        none; _TIMEOUT at the deadline."""
        n, nc, sizes = self.tab.n, len(self.classes), self.sizes
        if deadline is not None and time.perf_counter() > deadline:
            return _TIMEOUT
        mats = self.matrices(u)
        # reached[(counts, same, cur)]: the ideals the stages so far can make up, the next stage
        # running on class cur over the link `same` (1 cur's machine's, 0 the network, -1 none).
        reached: dict[tuple, np.ndarray] = {}
        for c in range(nc):
            reached[(tuple(int(i == c) for i in range(nc)), -1, c)] = np.arange(n + 1) == 0
        layer = list(reached)
        env_prev: dict[tuple, np.ndarray] = {}
        for depth in range(1, self.max_stages + 1):
            # NOTE [ideal DP dominance]: an ideal is not expanded in a state when a state with the
            # same next class, no more devices of any class and a link into it no dearer reached
            # it. env[(counts, cur, kind)]: what such states with at most `counts` reached.
            env: dict[tuple, np.ndarray] = {}
            for (counts, cur, kind), vec in env_prev.items():
                if deadline is not None and time.perf_counter() > deadline:
                    return _TIMEOUT  # (states times classes: large on clusters of many machines)
                for c in range(nc):
                    if counts[c] < sizes[c]:
                        key = (counts[:c] + (counts[c] + 1,) + counts[c + 1:], cur, kind)
                        env[key] = env[key] | vec if key in env else vec
            nxt_layer: dict[tuple, None] = {}
            for key in sorted(layer, key=lambda k: (-k[1], k)):  # intra (1) before network (0)
                if deadline is not None and time.perf_counter() > deadline:
                    return _TIMEOUT
                counts, same, cur = key
                got = reached[key]
                kinds = [same, -1] + ([1] if same == 0 and self.intra_le_net[cur] else [])
                doms = [env[k] for k in ((counts, cur, kind) for kind in dict.fromkeys(kinds)) if k in env]
                mine = (counts, cur, same)
                env[mine] = env[mine] | got if mine in env else got
                alive = got & ~np.logical_or.reduce(doms) if doms else got.copy()
                # NOTE [ideal DP pruning]: ideals whose rest the devices left cannot run are dead.
                left = sizes - np.array(counts)
                left[cur] += 1
                tin = self.link[cur][same]
                for k, (rest, _) in enumerate(self.weighted):
                    most, low = self.capacity(left, int(self.cls_m[cur]), k, u)
                    alive &= rest <= most - low * tin
                rows = np.flatnonzero(alive)
                if len(rows) == 0:
                    continue
                last = mats[cur][(same, "last")][rows]
                if last.any():
                    return self._read_back(reached, mats, key, int(rows[np.argmax(last)]))
                if depth == self.max_stages:
                    continue
                reach: dict[int, np.ndarray] = {}  # by the link out of this stage
                for nxt in range(nc):
                    if counts[nxt] >= sizes[nxt]:
                        continue
                    nsame = same_machine(self.classes, cur, nxt)
                    if nsame not in reach:
                        mat = mats[cur][(same, nsame)]
                        bits = np.bitwise_or.reduce(mat if same < 0 else mat[rows], axis=0)
                        reach[nsame] = np.unpackbits(bits, count=n + 1).astype(bool)
                    if not reach[nsame].any():
                        continue
                    nkey = (counts[:nxt] + (counts[nxt] + 1,) + counts[nxt + 1:], nsame, nxt)
                    if nkey in reached:
                        reached[nkey] |= reach[nsame]
                    else:
                        reached[nkey] = reach[nsame].copy()
                        nxt_layer[nkey] = None
            env_prev = env
            layer = list(nxt_layer)
        return None

    def _read_back(self, reached: dict, mats: list[dict], key: tuple, start: int) -> list[tuple[int, int]]:
        """The chain ending with a stage on key's class from ideal `start` to V: each stage's
        predecessor is any state that reached an ideal with a stage from it to `start`."""
        chain = []
        while True:
            counts, same, cur = key
            chain.append((start, cur))
            if same < 0:
                break
            before = counts[:cur] + (counts[cur] - 1,) + counts[cur + 1:]
            byte, bit = start >> 3, 7 - (start & 7)
            for prev in range(len(self.classes)):
                if same_machine(self.classes, prev, cur) != same:
                    continue
                found = [(s, np.flatnonzero(reached[(before, s, prev)]
                                            & (mats[prev][(s, same)][:, byte] >> bit & 1).astype(bool)))
                         for s in (-1, 0, 1) if (before, s, prev) in reached]
                found = [(s, at) for s, at in found if len(at)]
                if found:
                    key, start = (before, found[0][0], prev), int(found[0][1][0])
                    break
            else:
                raise AssertionError("a reached ideal with no stage into it")
        return chain[::-1]

    def value(self, chain: list[tuple[int, int]]) -> int:
        """The bottleneck of a chain as the DP costs it."""
        worst = 0
        for k, (start, c) in enumerate(chain):
            end = chain[k + 1][0] if k + 1 < len(chain) else self.tab.n
            kin = -1 if k == 0 else same_machine(self.classes, chain[k - 1][1], c)
            kout = -1 if k + 1 == len(chain) else same_machine(self.classes, c, chain[k + 1][1])
            comp = self.tab.comp[self.classes[c].type]
            t = stage_time_ns(comp[end] - comp[start], self.link[c][kin][start], self.link[c][kout][end])
            worst = max(worst, int(t))
        return worst

    def plan(self, chain: list[tuple[int, int]]) -> Plan | None:
        """The chain as a plan; None when it has a relay stage or breaks memory."""
        tab = self.tab
        cuts = [start for start, _ in chain] + [tab.n]
        devices = sequence_devices(self.classes, [c for _, c in chain])  # a class's devices in list order
        stage_of = {}
        placed = 0  # NOTE [ideal DP free nodes]: a free node goes before the first boundary whose cut has it
        for k in range(len(devices)):
            members = tab.ideals[cuts[k + 1]] & ~tab.ideals[cuts[k]]
            for i, v in enumerate(tab.order):
                if members >> i & 1:
                    stage_of[v] = k
            if tab.free:
                now = (tab.free_inside[cuts[k + 1]] if k + 1 < len(devices) else (1 << len(tab.free)) - 1) & ~placed
                placed |= now
                for i, v in enumerate(tab.free):
                    if now >> i & 1:
                        stage_of[v] = k
        if len(set(stage_of.values())) < len(devices):
            return None  # a relay: a stage that runs nothing
        stages = evaluate(self.problem, stage_of, devices)
        plan = Plan(stage_of=stage_of, slot_of_stage=devices, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                    lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
        return None if plan_violations(self.problem, plan) else plan

    def bisect(self, lower_ns: int, deadline: float | None, gap: float) -> IdealResult:
        """NOTE [ideal DP bisection] from a valid bound `lower_ns`."""
        lo, hi, best = lower_ns, self.upper_ns, None
        first, aim = True, gap > 0
        while lo < hi and not IdealResult(lo, best).settled(gap, self.upper_ns):
            mid = (lo + hi + 1) // 2
            if aim:
                # With a gap: is any chain faster than the best by more than the gap? Often
                # not, and that settles the plan of value hi (NOTE [ideal DP bisection]).
                u = max(mid, hi - int(gap * hi))
            else:
                # First: is any chain faster than the known plan? Often not (the order DP's plan
                # is optimal on chains), and then one decision proves that plan optimal.
                u = hi if first else mid
            first = False
            chain = self.chain_below(u, deadline)
            if chain is _TIMEOUT:
                return IdealResult(bound_ns=lo, plan=best, finished=False)
            if chain is None:
                lo = u  # no chain below u
                aim = gap > 0
                continue
            aim = gap > 0 and not aim  # aim and halve in turn
            hi = self.value(chain)
            plan = self.plan(chain)
            if plan is not None and (best is None or plan.bottleneck_ns < best.bottleneck_ns):
                best = plan
        return IdealResult(bound_ns=lo, plan=best)
