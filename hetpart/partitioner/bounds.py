"""Lower bounds on the bottleneck (NOTE [stage time]) that need no search, and memory feasibility.

Every bound here holds for every valid plan of the problem, contiguous or not:

- `lp_work_bound_ns` (lp_bounds.py): an LP (OR-Tools GLOP) that spreads each node's work over the
  device types fractionally, NOTE [LP work bound].
- `largest_op_bound_ns`: the slowest node on its fastest device type; some stage runs it.
- `min_devices`: the fewest devices whose memory can hold the model at all.
- `stage_sum_bound_ns`: work and unavoidable transfers per multiset of devices, NOTE [stage-sum bound].
- `sequence_bound_ns`: ops and work each stage of a device sequence can run, NOTE [sequence bound].
- `ideal_ns` (ideals.py, filled in by `solve`): the exact optimum over chains of ideals, memory
  relaxed, on graphs with few ideals, NOTE [ideal DP].
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.graph.python import max_flow

from hetpart.partitioner.costs import (
    device_classes,
    held_weight_bytes,
    least_stash,
    machine_link,
    node_sends,
    node_time_ns,
    slot_capacity_bytes,
    stage_time_ns,
    transfer_ns,
)
from hetpart.partitioner.lp_bounds import (  # noqa: F401 (LP_MAX_ITEMS, lp_work_bound_ns: re-exported)
    LP_MAX_ITEMS,
    _floor_ns,
    _lp,
    _LpData,
    lagrangian_bound_us,
    lp_work_bound_ns,
)
from hetpart.partitioner.problem import (
    MEM_BYTES, OUT_BYTES, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, Link, Problem,
)
from hetpart.partitioner.type_bounds import (
    STAGE_SUM_MAX_MULTISETS, TYPES_MAX, TypeFleet, devices_per_machine, fewest_machines, saturated_caps,
    type_classes, multisets, stage_sum_by_types_ns,
)

@dataclass(frozen=True)
class Bounds:
    """Bounds of one problem; `lower_bound_ns` is the best valid one."""

    solver_ns: int  # CP-SAT's proven bound of the bottleneck (0 when it proved nothing or minimised another objective)
    lp_work_ns: int  # NOTE [LP work bound]; 0 when the LP says no plan fits in memory
    largest_op_ns: int
    min_devices: int | None  # fewest devices that can hold the model; None: not even all of them
    memory_feasible: bool  # min_devices is at most the stages the problem allows
    stage_sum_ns: int = 0  # NOTE [stage-sum bound]: work and unavoidable transfers, per device multiset
    sequence_ns: int = 0  # NOTE [sequence bound]: ops and work per stage, per device sequence
    ideal_ns: int = 0  # NOTE [ideal DP] (ideals.py): exact but for memory, where the graph has few ideals
    unfinished: tuple[str, ...] = ()  # bounds stopped by their deadline, NOTE [bounds deadline]
    skipped: tuple[str, ...] = ()  # bounds not run: the cluster is too large for them (NOTE [bounds deadline])
    by_types: tuple[str, ...] = ()  # bounds run per device type, weaker (NOTE [stage-sum bound by types], [sequence bound by types])
    search: str = ""  # what searched beyond these bounds, in words (NOTE [what ran] in solve.py)

    @property
    def search_free_ns(self) -> int:
        """The best bound that holds without the solver (for every plan of the original problem)."""
        return max(self.lp_work_ns, self.largest_op_ns, self.stage_sum_ns, self.sequence_ns, self.ideal_ns)

    @property
    def lower_bound_ns(self) -> int:
        return max(self.solver_ns, self.search_free_ns)

    def to_json(self) -> dict:
        us = lambda ns: round(ns / 1000, 3)  # noqa: E731
        return {
            "solver_us": us(self.solver_ns),
            "lp_work_us": us(self.lp_work_ns),
            "largest_op_us": us(self.largest_op_ns),
            "stage_sum_us": us(self.stage_sum_ns),
            "sequence_us": us(self.sequence_ns),
            "ideal_us": us(self.ideal_ns),
            "min_devices": self.min_devices,
            "memory_feasible": self.memory_feasible,
            "lower_bound_us": us(self.lower_bound_ns),
            **({"unfinished": list(self.unfinished)} if self.unfinished else {}),
            **({"skipped": list(self.skipped)} if self.skipped else {}),
            **({"by_types": list(self.by_types)} if self.by_types else {}),
            **({"search": self.search} if self.search else {}),
        }


def left_out(bounds_json: dict) -> str:
    """The bounds a plan went without, and why, in words, from plan.json's `bounds` ("" when none;
    NOTE [bounds deadline])."""
    why = [f"{name} left out (not finished by its deadline)" for name in bounds_json.get("unfinished", ())]
    why += [f"{name} left out (too large a cluster for it)" for name in bounds_json.get("skipped", ())]
    why += [f"{name} run per device type (weaker)" for name in bounds_json.get("by_types", ())
            if name not in bounds_json.get("unfinished", ())]
    return "; ".join(why)


def largest_op_bound_ns(problem: Problem) -> int:
    """The slowest node on its fastest allowed device type: some stage runs it, so the bottleneck is at least that."""
    g = problem.graph
    return max((min((node_time_ns(problem, v, t) for t in problem.allowed_types(v)), default=0) for v in g.nodes),
               default=0)


def model_bytes(problem: Problem) -> int:
    """Memory the whole model needs at least, over all stages: every node's mem_bytes (times the
    least stash) and every weight read, once, with its training state."""
    g = problem.graph
    weights = problem.weights_read(g.nodes)
    return (least_stash(problem) * sum(g.nodes[v].get(MEM_BYTES, 0) for v in g.nodes)
            + sum(held_weight_bytes(problem, w) for w in weights))


def min_devices(problem: Problem) -> int | None:
    """The fewest devices (largest first) whose memories add up to `model_bytes`; None if all do not.

    A weight read in two stages is held twice, so real plans may need more.
    """
    need = model_bytes(problem)
    total = 0
    for k, cap in enumerate(sorted((d.capacity_bytes for d in problem.devices), reverse=True), start=1):
        total += cap
        if total >= need:
            return k
    return None


# NOTE [stage-sum bound]
# Every plan runs on some multiset of devices: n_t devices of type t, S = sum n_t stages.
# For a fixed n, three things hold and each bounds the bottleneck T:
# - The stages' times add up to their compute plus each boundary twice (NOTE [stage
#   time]), and T is at least their average: S*T >= W(n) + 2*C(n), where W(n) is each
#   node's time on its fastest type among those used, and C(n) the least total of the
#   S-1 boundaries. Every boundary separates the PIN_FIRST nodes (stage 0) from the
#   PIN_LAST ones (stage S-1), so it carries at least the bytes of a minimum cut between
#   them (`min_boundary_bytes`: a closure problem, one OR-Tools max-flow); and a chain through
#   m machines crosses the network at least m-1 times, m being the fewest machines
#   that hold n's devices.
# - NOTE [Lagrangian LP bound] with the multipliers of the LP, n_t devices of type t, the
#   memory of the n_t largest of them, and the 2*C(n) of transfers added to the work of
#   whichever used type has the least multiplier (they occupy some stage).
# - The slowest node on its fastest used type.
# The bottleneck of any plan is at least the least over n (whose devices can hold the
# model) of the largest of the three. It sees transfers, which the LP does not: on small
# models on many devices the boundaries are a large part of every stage.
def min_boundary_bytes(problem: Problem, weight: str = OUT_BYTES) -> int:
    """The fewest bytes (`weight=OUT_TENSORS`: tensors) any boundary between two stages carries
    (NOTE [stage-sum bound]); 0 when unknown. A boundary's least time over a link is the transfer of
    both minima (each may come from another cut; NOTE [stage time])."""
    got = _closure_cut(_closure_arcs(problem, weight))
    return 0 if got is None else got


@dataclass
class _Closure:
    """The max-flow network of `min_boundary_bytes`, to solve again with one more node forced to a side."""

    index: dict[str, int]
    tails: np.ndarray
    heads: np.ndarray
    caps: np.ndarray
    source: int
    sink: int
    inf: int
    pinned: bool  # both PIN_FIRST and PIN_LAST nodes exist


def _closure_arcs(problem: Problem, weight: str = OUT_BYTES) -> _Closure:
    g = problem.graph
    index = {v: i for i, v in enumerate(g.nodes)}
    n = len(index)
    firsts = [index[v] for v in g.nodes if g.nodes[v].get(PIN) == PIN_FIRST]
    lasts = [index[v] for v in g.nodes if g.nodes[v].get(PIN) == PIN_LAST]
    # Source side = the nodes in stages <= k: closed under predecessors (arc v -> u of
    # "infinite" capacity for an edge u -> v); u pays its out_bytes (arc u -> sent(u)) when a
    # successor is on the sink side (sent(u) -> v, infinite). Nodes 0..n-1, sent(u) = n + u.
    out = node_sends(problem, weight)
    inf = sum(out.values()) + 1
    source, sink = 2 * n, 2 * n + 1
    tails, heads, caps = [], [], []
    for u, v in g.edges:
        tails.append(index[v]), heads.append(index[u]), caps.append(inf)
        if out[u] > 0:
            tails.append(n + index[u]), heads.append(index[v]), caps.append(inf)
    for u in g.nodes:
        if out[u] > 0 and g.out_degree(u):
            tails.append(index[u]), heads.append(n + index[u]), caps.append(out[u])
    tails += [source] * len(firsts) + lasts
    heads += firsts + [sink] * len(lasts)
    caps += [inf] * (len(firsts) + len(lasts))
    return _Closure(index=index, tails=np.array(tails, dtype=np.int64), heads=np.array(heads, dtype=np.int64),
                    caps=np.array(caps, dtype=np.int64), source=source, sink=sink, inf=inf,
                    pinned=bool(firsts and lasts))


def _closure_cut(net: _Closure, inside: str | None = None, outside: str | None = None) -> int | None:
    """The fewest bytes over a boundary whose stages before it hold every PIN_FIRST node and node
    `inside`, and whose stages after it hold every PIN_LAST node and node `outside`; None when no
    such boundary exists or there are no pins."""
    if not net.pinned:
        return None
    extra_t = [net.source] if inside is not None else []
    extra_h = [net.index[inside]] if inside is not None else []
    if outside is not None:
        extra_t.append(net.index[outside]), extra_h.append(net.sink)
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(np.concatenate([net.tails, np.array(extra_t, dtype=np.int64)]),
                                np.concatenate([net.heads, np.array(extra_h, dtype=np.int64)]),
                                np.concatenate([net.caps, np.full(len(extra_t), net.inf, dtype=np.int64)]))
    if flow.solve(net.source, net.sink) != flow.OPTIMAL or flow.optimal_flow() >= net.inf:
        return None  # e.g. a PIN_LAST node precedes a PIN_FIRST one: only one-stage plans exist
    return int(flow.optimal_flow())


INNER_CUT_MAX_NODES = 1_500  # above, `inner_boundary_bytes` does not run its max-flows (one per unpinned node)


def inner_boundary_bytes(problem: Problem, max_nodes: int = INNER_CUT_MAX_NODES) -> tuple[int, int]:
    """(after_second, before_last): the fewest bytes a boundary carries when at least two stages
    precede it, and when at least two follow it (NOTE [sequence bound]); `min_boundary_bytes` where unknown.

    A stage other than the first and the last holds an unpinned node (it holds a node not pinned
    last, and PIN_FIRST nodes are in the first stage). So with two stages before a boundary, some
    unpinned node u is before it: the least over u of the cut with u forced before; likewise after.
    """
    g = problem.graph
    net = _closure_arcs(problem)
    got = _closure_cut(net)
    base = 0 if got is None else got
    unpinned = [v for v in g.nodes if g.nodes[v].get(PIN) is None]
    if len(g) > max_nodes or not unpinned or got is None:
        return base, base
    before = [c for u in unpinned if (c := _closure_cut(net, inside=u)) is not None]
    after = [c for w in unpinned if (c := _closure_cut(net, outside=w)) is not None]
    return max(base, min(before, default=base)), max(base, min(after, default=base))


def stage_sum_bound_ns(problem: Problem, data: _LpData, lam: np.ndarray, mu: np.ndarray,
                       deadline: float | None = None, max_multisets: int = STAGE_SUM_MAX_MULTISETS) -> int | None:
    """NOTE [stage-sum bound], rounded down; 0 when no multiset of devices can hold the model;
    None when `deadline` (a `time.perf_counter()` value) passed first (NOTE [bounds deadline]).
    Above `max_multisets` multisets, NOTE [stage-sum bound by types] (type_bounds.py) instead."""
    types = data.types
    counts = [int(c) for c in data.count]
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    need = model_bytes(problem)
    caps = {t: sorted((slot_capacity_bytes(problem, s) for s in problem.slots if s.type == t), reverse=True)
            for t in types}
    cut, tensors = min_boundary_bytes(problem), min_boundary_bytes(problem, OUT_TENSORS)
    net_ns = transfer_ns(problem.network, cut, tensors)
    intra_ns = min([transfer_ns(link, cut, tensors) for link in problem.intra_node_links.values()] + [net_ns])
    have = devices_per_machine(problem)
    if multisets(counts) > max_multisets:
        fleet = TypeFleet(capacities_bytes=[np.array(caps[t], dtype=np.int64) for t in types], max_stages=max_stages,
                          machine_size=max(sum(k.values()) for k in have.values()),
                          pure_machines=all(len(k) == 1 for k in have.values()))
        return stage_sum_by_types_ns(fleet, data.time_us, data.mem_mb, data.allowed, lam, mu, need, net_ns, intra_ns,
                                     deadline)
    time_ns = np.rint(data.time_us * 1000).astype(np.int64)  # exact: times are integer ns
    big = np.int64(1) << np.int64(62)
    best = None
    for n in itertools.product(*(range(c + 1) for c in counts)):
        if _past(deadline):
            return None  # the least over part of the multisets is no bound
        S = sum(n)
        if S == 0 or S > max_stages:
            continue
        if sum(sum(caps[t][: n[j]]) for j, t in enumerate(types)) < need:
            continue  # these devices cannot hold the model
        used = np.array([k > 0 for k in n])
        ok = data.allowed & used[None, :]
        if not ok.any(axis=1).all():
            continue  # some node runs on none of these types
        fastest = np.where(ok, time_ns, big).min(axis=1)
        machines = fewest_machines(have, {t: n[j] for j, t in enumerate(types) if n[j]})
        comm = 0 if S == 1 else (machines - 1) * net_ns + (S - machines) * intra_ns
        average = -(-(int(fastest.sum()) + 2 * comm) // S)
        lam_n = np.where(used, lam, 0.0)
        sub = _LpData(types=types, time_us=data.time_us, mem_mb=data.mem_mb, allowed=ok, shared={},
                      count=np.array(n, dtype=np.float64),
                      capacity_mb=np.array([sum(caps[t][: n[j]]) for j, t in enumerate(types)]) / 1e6)
        lagrange = (_floor_ns(lagrangian_bound_us(sub, lam_n, np.where(used, mu, 0.0), 2 * comm / 1000))
                    if lam_n.any() else 0)
        value = max(average, lagrange, int(fastest.max()))
        best = value if best is None else min(best, value)
    return best or 0


# NOTE [sequence bound]
# A plan runs its S stages on a sequence of distinct devices d_1..d_S; boundary k carries at
# least `min_boundary_bytes` (NOTE [stage-sum bound]), and at least `inner_boundary_bytes` when
# two stages precede it (k >= 2) or follow it (k <= S-2): on transformers only the first
# boundary can carry just the token ids, every other one a hidden state. Over the link between
# d_k and d_k+1 it takes at least L(d_k, d_k+1) = that link's transfer_ns of those bytes. With bottleneck T,
# stage k computes within its budget B_k = T - L(d_k-1, d_k) - L(d_k, d_k+1) (the first and last
# stage pay one side). Two measures of what a stage on type t can run within B:
# - count: the ops whose time is > 0 on every type they may run on ("busy" ops) each take a
#   slot; a t-stage holds at most the largest j such that the j fastest busy ops on t (among
#   those allowed on t) take <= B in all. Every busy op is in some stage, so the stages' slots
#   add up to at least their number. Tight where ops are alike (zoo:glm: 35 ops of 4 us).
# - work: op v has work w(v) = its time on its fastest allowed type; a t-stage runs at most the
#   fractional knapsack of w within B on t (ops by w / time_t, best first), and the stages
#   together run all the work.
# - weighted work (the stages of one type pooled, NOTE [Lagrangian LP bound]'s argument): for
#   multipliers lambda_t >= 0, op v has work w_l(v) = min over its allowed types t of
#   lambda_t * time_t(v) <= lambda_t * time_t(v), so a t-stage runs at most the fractional knapsack
#   of w_l within B on t (<= lambda_t * B), and the stages together run all of it. With the LP's
#   work multipliers this charges each type's stages together for the work only that type runs
#   well, which per-stage knapsacks of w count once per stage; lambda = 1 is the plain work check.
# For a given T, a DP over device sequences (state: devices used per class of type and machine,
# the last class and the link into it) finds the most slots and the most work any sequence
# offers; if either falls short, no plan has bottleneck T. Both only grow with T, so bisection
# gives the least T that passes: a bound for every plan (contiguous or not; memory and the
# order of ops ignored). Above SEQUENCE_MAX_STATES device-count states it runs on device types
# instead (NOTE [sequence bound by types] in type_bounds.py), and is skipped (0) only when even
# those are too many.
SEQUENCE_MAX_STATES = 20_000


def _cap_tables(problem: Problem, lam: dict[str, float] | None = None
                ) -> tuple[dict[str, np.ndarray], int, dict[str, tuple], float]:
    """Per type: (count prefix sums, number of busy ops); (work knapsack breakpoints, total work),
    work weighted by the multipliers `lam` per type (None: 1 each, NOTE [sequence bound])."""
    g = problem.graph
    types = problem.device_types
    allowed = {v: problem.allowed_types(v) for v in g.nodes}
    fastest = {v: min((node_time_ns(problem, v, t) for t in allowed[v]), default=0) for v in g.nodes}
    busy = [v for v in g.nodes if fastest[v] > 0]
    if lam is not None:
        fastest = {v: min((lam[t] * node_time_ns(problem, v, t) for t in allowed[v]), default=0.0) for v in g.nodes}
    count_prefix = {t: np.concatenate([[0], np.cumsum(sorted(node_time_ns(problem, v, t) for v in busy
                                                              if t in allowed[v]))]).astype(np.int64)
                    for t in types}
    work = {}
    for t in types:
        items = sorted(((fastest[v], node_time_ns(problem, v, t)) for v in busy if t in allowed[v]),
                       key=lambda it: -it[0] / it[1])
        tp = np.concatenate([[0], np.cumsum([it[1] for it in items])]).astype(np.float64)
        wp = np.concatenate([[0], np.cumsum([it[0] for it in items])]).astype(np.float64)
        ratio = np.array([it[0] / it[1] for it in items] + [0.0])
        work[t] = (tp, wp, ratio)
    return count_prefix, len(busy), work, float(sum(fastest[v] for v in busy))


def sequence_bound_ns(problem: Problem, lower_ns: int = 0, upper_ns: int | None = None,
                      multipliers: list[dict[str, float]] = ()) -> int:
    """NOTE [sequence bound]: the least T in [lower_ns, upper_ns] that no relaxation rules out
    (`lower_ns` when it cannot rule out that one); 0 when skipped. `lower_ns` must be a valid bound.
    `multipliers`: per-type weights (>= 0) of the weighted work checks, besides the plain one."""
    return _sequence_bound(problem, lower_ns, upper_ns, multipliers).value_ns


@dataclass(frozen=True)
class _SequenceResult:
    value_ns: int
    finished: bool  # False: stopped by the deadline (NOTE [bounds deadline])
    how: str  # "exact", "by_types" (NOTE [sequence bound by types]) or "skipped" (too many states)


class _PastDeadline(Exception):
    """Raised inside a bound's search when its deadline has passed (NOTE [bounds deadline])."""


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _sequence_bound(problem: Problem, lower_ns: int, upper_ns: int | None, multipliers: list[dict[str, float]],
                    deadline: float | None = None, max_states: int = SEQUENCE_MAX_STATES,
                    inner_cut_max_nodes: int = INNER_CUT_MAX_NODES) -> _SequenceResult:
    """`sequence_bound_ns`, whether it finished and how it ran: at `deadline` it stops with the T
    below which every value was ruled out so far (0 before the first test ends; NOTE [bounds deadline])."""
    # Classes of one type on one machine (NOTE [device sequences] in costs.py), by (type, machine);
    # where their states are too many, classes of one type (NOTE [sequence bound by types]).
    classes = sorted(device_classes(problem, "type_machine"), key=lambda c: (c.type, c.machine))
    sizes = [len(c.devices) for c in classes]
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    links: list[list[Link | None]] = [[machine_link(problem, a.machine, b.machine) if (a is not b or len(a.devices) > 1)
                                       else None for b in classes] for a in classes]
    caps = [min(s, max_stages) for s in sizes]  # devices a state counts per class
    how = "exact"
    if math.prod(c + 1 for c in caps) > max_states:
        classes, links = type_classes(problem)
        sizes = [len(c.devices) for c in classes]
        caps = saturated_caps([min(s, max_stages) for s in sizes], max_states)
        if caps is None:
            return _SequenceResult(0, True, "skipped")
        how = "by_types"
    if _past(deadline):
        return _SequenceResult(0, False, how)  # (its tables alone take seconds on thousands of nodes)
    count_prefix, busy, work, total_work = _cap_tables(problem)
    if busy == 0:
        return _SequenceResult(lower_ns, True, how)
    # One (knapsack tables, work to run) per work check: the plain one, then the weighted ones.
    checks = [(work, total_work)] + [_cap_tables(problem, lam)[2:] for lam in multipliers
                                     if any(x > 0 for x in lam.values())]
    if _past(deadline):
        return _SequenceResult(0, False, how)
    nw = len(checks)
    cut, tensors = min_boundary_bytes(problem), min_boundary_bytes(problem, OUT_TENSORS)
    after_two, before_two = inner_boundary_bytes(problem, inner_cut_max_nodes)
    nc = len(classes)
    # A class whose count saturates at its cap below its size may take any number of stages more.
    limit = [sizes[c] if caps[c] >= min(sizes[c], max_stages) else math.inf for c in range(nc)]

    def boundary_bytes(d: int, last: bool) -> int:
        """Bytes boundary d (after stage d, from 1) carries at least; `last`: no stage after the next."""
        return max(cut, after_two if d >= 2 else 0, 0 if last else before_two)

    def slots(t: str, budget: int) -> float:
        if budget < 0:
            return -math.inf
        return float(np.searchsorted(count_prefix[t], budget, side="right") - 1)

    def carries(t: str, budget: int, i: int = 0) -> float:
        if budget < 0:
            return -math.inf
        tp, wp, ratio = checks[i][0][t]
        j = int(np.searchsorted(tp, budget, side="right") - 1)
        return float(wp[j] + (budget - tp[j]) * ratio[j])

    # Boundary times by (from class, to class, boundary after the first stage?, the next stage last?).
    ltime = {(c, c2, d >= 2, last): transfer_ns(links[c][c2], boundary_bytes(d, last), tensors)
             for c in range(nc) for c2 in range(nc) if links[c][c2] is not None
             for d in (1, 2) for last in (False, True)}
    work_need = [total * (1 - 1e-9) - 1e-6 * (total > 0) for _, total in checks]

    def enough(slots_: float, work_: tuple[float, ...]) -> bool:
        return slots_ >= busy and all(w >= need for w, need in zip(work_, work_need))

    def passes(T: int) -> bool:
        """Whether some device sequence offers enough slots, and for each work check some (maybe
        another) enough work, at T."""
        cache: dict[tuple[int, int], tuple[float, tuple[float, ...]]] = {}

        def stage(c: int, budget: int) -> tuple[float, tuple[float, ...]]:
            key = (c, budget)
            if key not in cache:
                t = classes[c].type
                cache[key] = (slots(t, budget), tuple(carries(t, budget, i) for i in range(nw)))
            return cache[key]

        best_slots = max(stage(c, T)[0] for c in range(nc))
        best_work = tuple(max(stage(c, T)[1][i] for c in range(nc)) for i in range(nw))
        # A state is a stage at depth d that is not the last: (devices used per class, its class,
        # the time of the boundary into it) -> the most slots and work of the stages before it.
        layer = {(tuple(int(i == c) for i in range(nc)), c, 0): (0.0, (0.0,) * nw) for c in range(nc)}
        for d in range(1, max_stages):
            if _past(deadline):
                raise _PastDeadline
            nxt: dict[tuple, tuple[float, tuple[float, ...]]] = {}
            for (counts, c, tin), (vs, vw) in layer.items():
                for c2 in range(nc):
                    if counts[c2] >= limit[c2] or links[c][c2] is None:
                        continue
                    # The next stage, on c2, is the last one: boundary d is the last. A stage's
                    # compute budget is T less its boundaries (NOTE [stage time]).
                    lk = ltime[c, c2, d >= 2, True]
                    s1, w1 = stage(c, T - stage_time_ns(0, tin, lk))
                    s2, w2 = stage(c2, T - stage_time_ns(0, lk, 0))
                    best_slots = max(best_slots, vs + s1 + s2)
                    best_work = tuple(max(b, x + y + z) for b, x, y, z in zip(best_work, vw, w1, w2))
                    if enough(best_slots, best_work):
                        return True
                    if d + 1 < max_stages:
                        # Or more stages follow it.
                        lk = ltime[c, c2, d >= 2, False]
                        s1, w1 = stage(c, T - stage_time_ns(0, tin, lk))
                        if s1 == -math.inf:
                            continue
                        key = (tuple(min(k + (i == c2), caps[i]) for i, k in enumerate(counts)), c2, lk)
                        old = nxt.get(key)
                        got = (vs + s1, tuple(x + y for x, y in zip(vw, w1)))
                        nxt[key] = got if old is None else (max(old[0], got[0]),
                                                            tuple(max(x, y) for x, y in zip(old[1], got[1])))
            layer = nxt
        return enough(best_slots, best_work)

    failed = max(0, lower_ns)  # no plan has bottleneck `failed` or less once it fails the test
    proven = 0  # every T below it failed the test
    try:
        if passes(failed):
            return _SequenceResult(failed, True, how)
        proven = failed + 1
        hi = upper_ns if upper_ns is not None and upper_ns > failed else 2 * failed + 1
        step = max(1, failed)
        for _ in range(64):
            if passes(hi):
                break
            failed, hi, step = hi, hi + step, 2 * step
            proven = failed + 1
        else:
            return _SequenceResult(failed + 1, True, how)  # nothing passes: no plan at all (memory or constraints say why)
        lo = failed + 1
        tol = max(1, hi // 2000)  # stop within 0.05% of T: `lo` is a bound all the same
        while hi - lo >= tol:
            mid = (lo + hi) // 2
            if passes(mid):
                hi = mid
            else:
                lo = mid + 1
            proven = lo
        return _SequenceResult(lo, True, how)
    except _PastDeadline:
        return _SequenceResult(proven, False, how)


def _work_multipliers(data: _LpData, lam: np.ndarray) -> list[dict[str, float]]:
    """The weighted work checks of NOTE [sequence bound]: the LP's work duals, and each type's
    share of its own total time (a type that is slow on everything weighs little)."""
    total = np.where(data.allowed, data.time_us, 0.0).sum(axis=0)
    share = {t: (1.0 / total[j] if total[j] > 0 else 0.0) for j, t in enumerate(data.types)}
    return [{t: float(lam[j]) for j, t in enumerate(data.types)}, share]


def compute_bounds(problem: Problem, solver_ns: int = 0, upper_ns: int | None = None,
                   deadline: float | None = None, lp_max_items: int = LP_MAX_ITEMS,
                   inner_cut_max_nodes: int = INNER_CUT_MAX_NODES,
                   sequence_max_states: int = SEQUENCE_MAX_STATES,
                   stage_sum_max_multisets: int = STAGE_SUM_MAX_MULTISETS) -> Bounds:
    """All the search-free bounds, with the solver's proven bound `solver_ns`; `upper_ns`, the
    bottleneck of a known plan, only narrows the search of NOTE [sequence bound]. The searches
    stop at `deadline` (a `time.perf_counter()` value), NOTE [bounds deadline]."""
    need = min_devices(problem)
    allowed = min(problem.max_stages or len(problem.devices), len(problem.devices))
    lp_ns, data, lam, mu = _lp(problem, lp_max_items)
    feasible_types = bool(data.allowed.any(axis=1).all())
    unfinished, skipped, by_types = [], [], []
    stage_sum = (stage_sum_bound_ns(problem, data, lam, mu, deadline, stage_sum_max_multisets)
                 if feasible_types else 0)
    if multisets([int(c) for c in data.count]) > stage_sum_max_multisets:
        (skipped if len(data.types) > TYPES_MAX else by_types).append("stage_sum")
    if stage_sum is None:
        if "stage_sum" not in skipped:
            unfinished.append("stage_sum")
        stage_sum = 0
    largest = largest_op_bound_ns(problem)
    seq = (_sequence_bound(problem, max(lp_ns, stage_sum, largest), upper_ns, _work_multipliers(data, lam), deadline,
                           sequence_max_states, inner_cut_max_nodes)
           if feasible_types else _SequenceResult(0, True, "exact"))
    if not seq.finished:
        unfinished.append("sequence")
    if seq.how != "exact":
        (skipped if seq.how == "skipped" else by_types).append("sequence")
    return Bounds(
        solver_ns=max(0, solver_ns),
        lp_work_ns=lp_ns,
        largest_op_ns=largest,
        min_devices=need,
        memory_feasible=need is not None and need <= allowed,
        stage_sum_ns=stage_sum,
        sequence_ns=seq.value_ns,
        unfinished=tuple(unfinished),
        skipped=tuple(skipped),
        by_types=tuple(by_types),
    )


# NOTE [bounds deadline]
# The stage-sum bound visits every multiset of device counts (a product over the types, so
# 2,000 devices of five types are 10^13 multisets) and the sequence bound bisects over a DP
# whose states grow with the cluster; neither may overrun --time-limit. Above
# STAGE_SUM_MAX_MULTISETS multisets and SEQUENCE_MAX_STATES states they run per device type
# (NOTE [stage-sum bound by types], NOTE [sequence bound by types]: weaker, in time that grows
# with the types, not the devices; `Bounds.by_types` names them), and both look at the clock as
# they go: the stage-sum bound is the least over ALL multisets (or type sets), so when it stops
# early it is left out (0); the sequence bound keeps the T below which every value it tested
# failed (a valid bound: the tests only grow with T). `Bounds.unfinished` names each one that
# stopped, `Bounds.skipped` each one the cluster is too large for even by types (more than
# TYPES_MAX types; more than SEQUENCE_MAX_STATES states at one device of each type); plan.json's
# `bounds` lists them as "unfinished", "skipped" and "by_types", and `partition` prints which
# bounds the plan went without (`left_out`).


def objective_bound_ns(problem: Problem, bounds: Bounds, objective: str, microbatches: int = 1,
                       solver_ns: int = 0) -> int:
    """A lower bound of NOTE [objectives] (evaluate.py) from the bottleneck bounds.

    `solver_ns` is the solver's bound of that objective. Latency (the
    sum of stage times) is at least every node's time on its fastest type, summed, and
    at least the bottleneck; iteration adds (M - 1) x the bottleneck's bound to that.
    """
    if objective == "throughput":
        return max(bounds.lower_bound_ns, solver_ns)
    g = problem.graph
    work = sum(min((node_time_ns(problem, v, t) for t in problem.allowed_types(v)), default=0) for v in g.nodes)
    bottleneck = bounds.search_free_ns
    latency = max(work, bottleneck)
    search_free = latency if objective == "latency" else latency + (microbatches - 1) * bottleneck
    return max(solver_ns, search_free)
