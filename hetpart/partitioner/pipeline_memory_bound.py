"""A lower bound on the step of every plan of data-parallel pipelines that sees per-stage memory
(NOTE [pipelines memory bound]); pipeline_bounds.py takes the larger of it and NOTE [pipelines bound].
Nothing here imports torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
from ortools.linear_solver import pywraplp

from hetpart.partitioner.costs import held_weight_bytes
from hetpart.partitioner.pipeline_bound_parts import Part, parts_search, whole_ns_at_least
from hetpart.partitioner.pipeline_mix_bound import stage_mix
from hetpart.partitioner.pipeline_transfer_floor import cut_nodes, transfer_floor
from hetpart.partitioner.problem import MEM_BYTES, TIME_NS, WEIGHTS, Problem
from hetpart.time_limit import linear_solver_limit_ms

# NOTE [pipelines memory bound]
# NOTE [pipelines bound] checks memory per pipeline only; under 1F1B stage k of S stashes S - k
# microbatches (NOTE [training memory]), so a long pipeline's first stages hold little, and a small
# device holds little anywhere. Take any plan (NOTE [pipelines plan]) and one of its pipelines i:
# m_i microbatches, stages k on devices of kind c_k (type, capacity), stage k's nodes X_k, its
# compute x_k <= b_i (the bottleneck), sum_i = sum of its stage times, T_i = sum_i + (m_i - 1) b_i.
# Fix lambda_t >= 0 per type (NOTE [pipelines bound]'s multipliers over all types) and give node v
# the work c_v = min over its types t of lambda_t time[v, t]; Lambda = sum_v c_v; e_k = c(X_k).
# (a) cover: the stages hold every node, so sum_k e_k >= Lambda;
# (b) time: e_k <= lambda_{t_k} x_k <= lambda_{t_k} b_i, and sum_i >= sum_k x_k >= sum_k e_k /
#     lambda_{t_k}; also sum_i >= F (the least fill of NOTE [pipelines bound] (a)), b_i >= L (its (e));
# (c) memory: stage k at stash level s_k holds s_k x its nodes' activations and every weight they
#     read with its training state; charging each weight's bytes to its r readers (1/r each) can only
#     lower that, so X_k fits the fractional knapsack of capacity cap_k, values c_v and sizes
#     w_v + s_k a_v, and e_k <= K(c_k, s_k), the greedy (ratio-sorted) optimum of that knapsack;
# (d) levels: 1F1B: s_k = S_i - k (S_i <= m_i stages), so a pipeline has at most one stage at each
#     level 1..S_i; GPipe: s_k = m_i; inference: s_k = 1 (at most max_stages stages);
# (e) stages are convex (an edge never goes to an earlier stage). A cut node u is comparable with
#     every node (each is its ancestor or descendant); consecutive cuts split the nodes into
#     blocks. If X_k has nodes in blocks i < j, it has a path between them through the cuts in
#     between, so it holds every node of the blocks between i and j: X_k is within one block, or
#     whole blocks i+1..j-1 plus parts of blocks i and j. So K = the most, over those shapes, of
#     the inner blocks' work + the fractional knapsack of blocks i and j in the capacity left
#     (`knapsack_work`; without it a knapsack picks the densest ops of every layer at once).
#     Blocks are merged until each has about 1/_BLOCKS of the work (fewer cuts: still valid).
# One pipeline of all M microbatches (k = 1): for a bottleneck b, (a)-(d) are an LP over x (devices
# of kind c at level cell l; cells [s, s'] use K at s, the largest in the cell; at most width
# devices per cell) and e: the least stage sum Z(b) (GLOP); Z only falls as b grows (the LP
# loosens). Every plan has b >= b0, the largest b (bisection) whose LP cannot cover, so over cells
# [b, b r] from b0, T >= min of Z(b r) + (M - 1) b (r = _B_RATIO), up to where (M - 1) b alone
# exceeds the best found. Two or more pipelines (k >= 2): classes g by bottleneck, b_i in
# [b_g, b_g r'] (from the least b up to T; r' = _MANY_RATIO, or more to keep _MANY_CLASSES classes:
# a 46,000-variable LP took GLOP 10 s), p_g pipelines each; the same rows
# with p_g per cell and e <= min(K, lambda b_g r') x, and (m_i - 1) b_i <= T - sum_i summed:
# z_g <= p_g + (T p_g - Z_g) / b_g microbatches, at most p_g times those within T (the 1F1B stage
# count too), at least its stages under 1F1B; devices shared by all classes; sum z_g = M. Any plan
# with max_i T_i <= T gives a feasible point, so where the LP is infeasible no plan is that fast:
# bisection on T; stopped by the deadline, the largest T shown infeasible is still a bound. GPipe's
# stash (m_i) is not known per class: K at level 1 there (valid, weaker). Gradient sync: plans of
# k >= 2 are split into parts by k and the smallest pipeline's size, each charged its least sync
# (NOTE [memory bound parts]). The bound is the lesser of the one- and many-pipeline values. Both
# LPs charge each stage the least transfers of its boundaries (NOTE [boundary transfer floor] in
# pipeline_transfer_floor.py). Both also take NOTE [stage mix bound] (1) per stage, where b is known (no B):
# besides its work e, each (kind, level cell) gets q, its share of the model's reference time (stage k: r(X_k) / R),
# sum q >= 1 per pipeline, q <= x (b + delta_t) / W_t (compute_k >= W_t q_k - delta_t and compute_k <= b), and the
# stage sum >= sum (W_t q - delta_t x) + the same transfers: a second floor on (b)'s stage sums, where stages hold
# the model's mix. Left out (only weaker): transfers above that floor, NOTE [pipelines
# bound]'s supports (the larger of the two bounds is taken), interleaved schedules (no bound here: 0).

_EXACT_LEVELS = 8  # stash levels one by one up to here, then cells of ratio _LEVEL_RATIO (many pipelines)
_LEVEL_RATIO = 1.25
_MANY_CLASSES = 100  # bottleneck classes of the many-pipeline LP at most (its ratio grows past _MANY_RATIO)
_ONE_EXACT_LEVELS, _ONE_LEVEL_RATIO = 32, 1.03  # the same for one pipeline: a smaller LP, finer cells
_B_RATIO = 1.01  # bottleneck cells of NOTE [pipelines memory bound], one pipeline
_MANY_RATIO = 1.04  # ... and of the classes of many pipelines
_BLOCKS = 300  # blocks of NOTE [pipelines memory bound] (e) at most, about
MIX = True  # NOTE [stage mix bound]'s rows (False: without them, for the tests' comparisons)


@dataclass
class MemoryBound:
    """NOTE [pipelines memory bound]: the bound (0: none), the one over one pipeline, how it ran."""

    bound_ns: int
    one_pipeline_ns: int
    seconds: float
    finished: bool  # False: stopped by the deadline (the bound is the largest T proven infeasible)
    note: str
    stash_order: list[tuple[str, int]] = field(default_factory=list)  # NOTE [stash order]: kinds, front first
    stash_devices: dict[tuple[str, int], float] = field(default_factory=dict)  # ... and the devices of each it used


def _cells(lo: int, hi: int, exact: int, ratio: float) -> list[tuple[int, int]]:
    """[lo, hi] cut in cells: one value each up to `exact`, then of growing width (ratio)."""
    out, s = [], lo
    while s <= hi:
        e = s if s <= exact else min(hi, max(s, int(s * ratio)))
        out.append((s, e))
        s = e + 1
    return out


def _node_data(problem: Problem, lam: dict[str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(c_v, w_v, a_v) per node: NOTE [pipelines memory bound]'s work, weight share and activation bytes."""
    g = problem.graph
    readers: dict[str, int] = {}
    for v in g.nodes:
        for w in set(g.nodes[v].get(WEIGHTS, ())):
            readers[w] = readers.get(w, 0) + 1
    c, w_b, a_b = [], [], []
    for v in g.nodes:
        t_v = g.nodes[v][TIME_NS]
        c.append(min(lam.get(t, 0.0) * t_v[t] for t in problem.allowed_types(v)))
        w_b.append(sum(held_weight_bytes(problem, w) / readers[w] for w in set(g.nodes[v].get(WEIGHTS, ()))))
        a_b.append(float(g.nodes[v].get(MEM_BYTES, 0)))
    return np.array(c, dtype=np.float64), np.array(w_b, dtype=np.float64), np.array(a_b, dtype=np.float64)


def chain_blocks(problem: Problem, c: np.ndarray, blocks: int = 0) -> list[np.ndarray]:
    """NOTE [pipelines memory bound] (e)'s blocks: node indices (in `problem.graph.nodes` order) between
    consecutive cut nodes (comparable with every node), merged until each holds about 1 / `blocks` of the work."""
    g = problem.graph
    pos = {v: i for i, v in enumerate(g.nodes)}
    order = list(nx.topological_sort(g))
    cuts = set(cut_nodes(problem, order))
    target = float(c.sum()) / max(1, blocks or _BLOCKS)
    out, cur, acc = [], [], 0.0
    for v in order:
        cur.append(pos[v])
        acc += float(c[pos[v]])
        if v in cuts and acc >= target:
            out.append(np.array(cur, dtype=np.int64))
            cur, acc = [], 0.0
    if cur:
        out.append(np.array(cur, dtype=np.int64))
    return out


class _Knap:
    """The fractional knapsack of a fixed node multiset: value at any capacities (vectorized)."""

    def __init__(self, c: np.ndarray, size: np.ndarray) -> None:
        free = size <= 0
        self.base = float(c[free].sum())
        cv, sz = c[~free], size[~free]
        order = np.argsort(-(cv / sz), kind="stable")
        self.cum_size = np.concatenate([[0.0], np.cumsum(sz[order])])
        self.cum_val = np.concatenate([[0.0], np.cumsum(cv[order])])
        self.ratio = np.concatenate([cv[order] / sz[order], [0.0]])

    def __call__(self, cap: np.ndarray) -> np.ndarray:
        cap = np.maximum(np.asarray(cap, dtype=np.float64), 0.0)
        k = np.searchsorted(self.cum_size, cap, side="right") - 1  # items taken whole
        return self.base + self.cum_val[k] + (cap - self.cum_size[k]) * self.ratio[k]


def knapsack_work(c: np.ndarray, w: np.ndarray, a: np.ndarray, caps: list[int], levels: list[int],
                  blocks: list[np.ndarray] | None = None) -> np.ndarray:
    """K[cap, level]: at least the most work c of a stage's node set whose w + level x a fits cap
    (NOTE [pipelines memory bound] (c), (e)): within one block, or whole blocks between two partial ones."""
    blocks = blocks if blocks is not None else [np.arange(len(c))]
    sig_of: dict[tuple, int] = {}
    sig = np.array([sig_of.setdefault(tuple(sorted(zip(c[b], w[b], a[b]))), len(sig_of)) for b in blocks])
    caps_a = np.array(caps, dtype=np.float64)
    B = len(blocks)
    out = np.zeros((len(caps), len(levels)))
    first = [int(np.flatnonzero(sig == k)[0]) for k in range(len(sig_of))]
    for col, s in enumerate(levels):
        size = w + s * a
        one = [_Knap(c[blocks[first[k]]], size[blocks[first[k]]]) for k in range(len(sig_of))]
        best = np.max([kn(caps_a) for kn in one], axis=0)
        if B >= 2:
            pv = np.concatenate([[0.0], np.cumsum([c[b].sum() for b in blocks])])
            ps = np.concatenate([[0.0], np.cumsum([size[b].sum() for b in blocks])])
            i, j = np.triu_indices(B, 1)
            inner_v, inner_s = pv[j] - pv[i + 1], ps[j] - ps[i + 1]
            keep = inner_s <= caps_a.max()
            i, j, inner_v, inner_s = i[keep], j[keep], inner_v[keep], inner_s[keep]
            lo, hi = np.minimum(sig[i], sig[j]), np.maximum(sig[i], sig[j])
            for p_, q_ in set(zip(lo.tolist(), hi.tolist())):
                sel = (lo == p_) & (hi == q_)
                bi, bj = blocks[first[p_]], blocks[first[q_]]
                ends = _Knap(np.concatenate([c[bi], c[bj]]), np.concatenate([size[bi], size[bj]]))
                for r, cap in enumerate(caps_a):
                    ok = sel & (inner_s <= cap)
                    if ok.any():
                        best[r] = max(best[r], float((inner_v[ok] + ends(cap - inner_s[ok])).max()))
        out[:, col] = best
    return out


@dataclass
class _Setup:
    """What both LPs of NOTE [pipelines memory bound] read, in LP units (work: Lambda; time: the fill F)."""

    kinds: list[tuple[str, int]]  # (type, capacity)
    count: list[int]  # devices per kind
    lam: list[float]  # e <= lam x time, per kind
    K: np.ndarray  # [kind, level column] knapsack work
    col: dict[int, int]  # level -> column of K
    levels_1f1b: list[tuple[int, int]]  # level cells up to the most stages (many pipelines)
    levels_one: list[tuple[int, int]]  # ... and finer, for one pipeline
    max_stages: int
    mem: list[float]  # capacity / need, per kind
    fill: float  # F, in units of F: 1.0
    largest: float  # L
    scale_t: float  # LP time = ns x scale_t
    least_b: float  # no pipeline's bottleneck is below: L, and the work over every device's rate
    schedule: str | None
    tau: list[float]  # NOTE [boundary transfer floor], LP time units: a side's least transfer, per kind
    delta: list[float]  # ... and what a side over the network costs more
    exempt: float  # sides of one pipeline that may pay nothing
    per_machine: float  # g: devices on the largest machine
    mix: list[tuple[float, float]] | None = None  # NOTE [stage mix bound]: (W_t, delta_t) per kind, LP time units


def _setup(problem: Problem, microbatches: int, lam: dict[str, float], fill_ns: float, largest_ns: float,
           need_bytes: int, deadline: float | None = None) -> _Setup:
    t = problem.training
    schedule = None if t is None else t.schedule
    kinds = problem.device_kinds()
    kind_list = sorted(kinds)
    c, w, a = _node_data(problem, lam)
    work = max(float(c.sum()), 1e-300)
    D = len(problem.devices)
    max_stages = min(D, problem.max_stages or D)
    top = min(microbatches, max_stages)
    cells = _cells(1, top, _EXACT_LEVELS, _LEVEL_RATIO) if schedule == "1f1b" else []
    fine = _cells(1, top, _ONE_EXACT_LEVELS, _ONE_LEVEL_RATIO) if schedule == "1f1b" else []
    levels = sorted({1, microbatches, *(lo for lo, _ in cells + fine)})
    K = knapsack_work(c, w, a, [cap for _, cap in kind_list], levels, chain_blocks(problem, c)) / work
    scale_t = 1.0 / max(fill_ns, 1.0)
    lam_n = [lam.get(k[0], 0.0) / scale_t / work for k in kind_list]
    rate = sum(lam_i * kinds[k] for lam_i, k in zip(lam_n, kind_list))
    floor = transfer_floor(problem, top if schedule == "1f1b" else max_stages, deadline=deadline)  # NOTE [boundary transfer floor]
    got = stage_mix(problem, deadline) if MIX else None
    mix = None
    if got is not None and all(got.delta[k[0]] is not None for k in kind_list):
        mix = [(got.model_ns[k[0]] * scale_t, got.delta[k[0]] * scale_t) for k in kind_list]
    return _Setup(tau=[floor.tau_ns[k] * scale_t for k in kind_list],
                  delta=[floor.delta_ns[k] * scale_t for k in kind_list],
                  exempt=float(floor.exempt_sides), per_machine=float(floor.machine_devices),
                  kinds=kind_list, count=[kinds[k] for k in kind_list], lam=lam_n, K=np.minimum(K, 1.0),
                  least_b=max(largest_ns * scale_t, 1.0 / rate if rate > 0 else 1e-9, 1e-9),
                  col={s: i for i, s in enumerate(levels)}, levels_1f1b=cells, levels_one=fine,
                  max_stages=max_stages,
                  mem=[cap / max(1.0, need_bytes) for _, cap in kind_list], fill=fill_ns * scale_t,
                  largest=largest_ns * scale_t, scale_t=scale_t, schedule=schedule, mix=mix)


def _cells_for(st: _Setup, level_of_gpipe: int, most_stages: int, one: bool = False
               ) -> list[tuple[int, int, np.ndarray]]:
    """(first level, width, K column per kind) of each level cell a pipeline of at most `most_stages` stages uses
    (`one`: the finer cells of the one-pipeline LP)."""
    if st.schedule == "1f1b":
        return [(lo, min(hi, most_stages) - lo + 1, st.K[:, st.col[lo]])
                for lo, hi in (st.levels_one if one else st.levels_1f1b) if lo <= most_stages]
    level = level_of_gpipe if st.schedule == "gpipe" else 1
    return [(level, st.max_stages, st.K[:, st.col[level]])]  # GPipe, inference: stages not capped by the batch


def _row(s: pywraplp.Solver, lb: float, ub: float, terms: list) -> object:
    """A constraint lb <= sum(coef * var) <= ub through the direct API (the natural one costs seconds here)."""
    c = s.Constraint(lb, ub)
    for var, coef in terms:
        c.SetCoefficient(var, coef)
    return c


class _Rows:
    """One class's rows of NOTE [pipelines memory bound] (a)-(d): devices x per kind and level cell, their
    work e <= min(K, lambda b) x (b set later, `set_b`), for p pipelines (a variable, or 1 when None)."""

    def __init__(self, s: pywraplp.Solver, st: _Setup, cells: list[tuple[int, int, np.ndarray]], p,
                 per_kind: list) -> None:
        inf = s.infinity()
        one = p is None
        self.caps, self.where, self.devices = [], [], []
        cover, stage_time, memory = [], [], []
        kind_x: list[list] = [[] for _ in st.kinds]
        kind_e: list[list] = [[] for _ in st.kinds]
        self.mix_caps, share, mix_time = [], [], []  # NOTE [stage mix bound] per stage, b known
        for level, width, k_col in cells:
            xs = []
            for i in range(len(st.kinds)):
                x = s.NumVar(0.0, float(st.count[i]), "")
                e = s.NumVar(0.0, inf, "")
                self.caps.append((_row(s, -inf, 0.0, [(e, 1.0)]), x, float(k_col[i]), st.lam[i]))  # e <= cap x
                xs.append((x, 1.0))
                per_kind[i].append(x)
                kind_x[i].append(x)
                kind_e[i].append(e)
                self.devices.append(x)
                self.where.append((i, level, x))
                cover.append((e, 1.0))
                if st.lam[i] > 0:
                    stage_time.append((e, -1.0 / st.lam[i]))  # x_k >= e_k / lambda
                memory.append((x, st.mem[i]))
                if st.mix is not None:
                    q = s.NumVar(0.0, inf, "")
                    self.mix_caps.append((_row(s, -inf, 0.0, [(q, 1.0)]), x, st.mix[i]))  # q <= x (b + delta) / W
                    share.append((q, 1.0))
                    mix_time += [(q, -st.mix[i][0]), (x, st.mix[i][1])]
            # (d) one stage per level per pipeline.
            _row(s, -inf, float(width), xs) if one else _row(s, -inf, 0.0, xs + [(p, -float(width))])
        # NOTE [boundary transfer floor]: per kind, u exempt sides and n expensive sides over the network.
        self.transfer = []
        exempt, network, devices = [], [], []
        for i in range(len(st.kinds)):
            u, n = s.NumVar(0.0, inf, ""), s.NumVar(0.0, inf, "")
            two_x = [(x, -2.0) for x in kind_x[i]]
            _row(s, -inf, 0.0, [(u, 1.0), (n, 1.0)] + two_x)  # u + n <= 2 x: two sides a stage
            # compute + (2 - u) tau + n delta <= b per device, summed: E <= lam ((b - 2 tau) X + tau u - delta n).
            row = _row(s, -inf, 0.0, [(e, 1.0) for e in kind_e[i]] + [(u, -st.lam[i] * st.tau[i]),
                                                                      (n, st.lam[i] * st.delta[i])])
            self.transfer.append((row, kind_x[i], st.lam[i], st.tau[i]))
            moved = [(x, -2.0 * st.tau[i]) for x in kind_x[i]] + [(u, st.tau[i]), (n, -st.delta[i])]
            stage_time += moved
            mix_time += moved
            exempt.append((u, 1.0))
            network.append((n, 1.0))
            devices += [(x, -2.0 / st.per_machine) for x in kind_x[i]]
        per_pipe = [] if one else [(p, -st.exempt)]
        _row(s, -inf, st.exempt if one else 0.0, exempt + per_pipe)  # the ends and the cheap boundaries
        _row(s, -st.exempt if one else 0.0, inf, network + devices + ([] if one else [(p, st.exempt)]))
        self.z_sum = z = s.NumVar(0.0, inf, "")
        unit = [] if one else [(p, -1.0)]
        lb = 1.0 if one else 0.0
        _row(s, lb, inf, cover + unit)  # (a), work in units of Lambda
        _row(s, lb, inf, memory + unit)  # the devices hold the model
        _row(s, st.fill if one else 0.0, inf, [(z, 1.0)] + ([] if one else [(p, -st.fill)]))
        _row(s, 0.0, inf, [(z, 1.0)] + stage_time)  # (b) the stage sums
        if share:  # NOTE [stage mix bound]: every pipeline holds the whole reference time, stages its mix
            _row(s, lb, inf, share + unit)
            summed: dict = {}  # a device's x is in its cap's slack and in its transfers: one coefficient
            for var, coef in mix_time:
                summed[var.index()] = (var, summed.get(var.index(), (var, 0.0))[1] + coef)
            _row(s, 0.0, inf, [(z, 1.0)] + list(summed.values()))

    def set_b(self, b: float) -> None:
        """(b), (c): one device's work at its level, at most K and lambda b."""
        for row, x, k, lam in self.caps:
            row.SetCoefficient(x, -min(k, lam * b))
        for row, xs, lam, tau in self.transfer:  # NOTE [boundary transfer floor]
            for x in xs:
                row.SetCoefficient(x, -lam * (b - 2.0 * tau))
        for row, x, (model, delta) in self.mix_caps:
            row.SetCoefficient(x, -(b + delta) / max(model, 1e-300))


class _OneLp:
    """NOTE [pipelines memory bound]'s LP of one pipeline of M microbatches: its least stage sum at bottleneck b."""

    def __init__(self, st: _Setup, microbatches: int) -> None:
        self.st = st
        self.s = s = pywraplp.Solver.CreateSolver("GLOP")
        per_kind: list[list] = [[] for _ in st.kinds]
        self.rows = _Rows(s, st, _cells_for(st, microbatches, microbatches, True), None, per_kind)
        for i, xs in enumerate(per_kind):
            _row(s, -s.infinity(), float(st.count[i]), [(x, 1.0) for x in xs])  # each device in one stage
        s.Minimize(self.rows.z_sum)

    def z(self, b: float, witness: dict | None = None) -> float | None:
        """The least stage sum with bottleneck at most b (LP units); None when none covers. `witness` gets,
        per kind used, (the mean stash level of its devices, how many) in the LP's answer."""
        self.rows.set_b(b)
        status = self.s.Solve()
        if status == pywraplp.Solver.INFEASIBLE:
            return None
        if status != pywraplp.Solver.OPTIMAL:
            return self.st.fill
        if witness is not None:
            used: dict[int, list[float]] = {}
            for i, level, x in self.rows.where:
                got = used.setdefault(i, [0.0, 0.0])
                got[0] += x.solution_value()
                got[1] += x.solution_value() * level
            witness.clear()
            witness.update({self.st.kinds[i]: (lv / n, n) for i, (n, lv) in used.items() if n > 1e-6})
        return self.s.Objective().Value() * (1 - 1e-9)


def one_pipeline_bound_ns(st: _Setup, microbatches: int, deadline: float | None,
                          witness: dict | None = None) -> tuple[float, bool]:
    """NOTE [pipelines memory bound] for one pipeline of all M microbatches, in ns (inf: none fits): the least
    bottleneck b0 that covers (bisection), then over cells [b, b r] from there the least of (the least stage
    sum with bottleneck b r) + (M - 1) b. Past the deadline the cells not reached are charged their b only.
    `witness`: per kind, (the mean stash level of its devices, how many) at the least value (NOTE [stash order])."""
    M = microbatches
    witness = {} if witness is None else witness
    lp = _OneLp(st, M)
    if M == 1:  # no bubble: the stage sum with no bottleneck cap
        z = lp.z(1e30)
        return (math.inf if z is None else max(z, st.fill)) / st.scale_t, True
    lo, hi = st.least_b, st.least_b
    while lp.z(hi) is None:  # the first bottleneck that covers, doubling
        lo, hi = hi, 2 * hi
        if hi > 1e12:
            return math.inf, True
    while hi > lo * _B_RATIO and not _past(deadline):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if lp.z(mid) is not None else (mid, hi)
    b, best = lo, math.inf  # no plan has a bottleneck below lo (its LP does not cover)
    while (M - 1) * b + st.fill < best:
        if _past(deadline):
            return (M - 1) * b + st.fill, False
        seen: dict = {}
        z = lp.z(b * _B_RATIO, seen)
        if z is not None and max(z, st.fill) + (M - 1) * b < best:
            best = max(z, st.fill) + (M - 1) * b
            witness.clear()
            witness.update(seen)
        b *= _B_RATIO
    return best / st.scale_t, True


class _Stopped(Exception):
    """The deadline passed while an LP was being built."""


class _ManyLp:
    """The LP of NOTE [pipelines memory bound] for >= k_min pipelines, classes by bottleneck up to `top`
    (LP units), at any step T <= top (`feasible`)."""

    def __init__(self, st: _Setup, microbatches: int, top: float, k_min: int, deadline: float | None) -> None:
        self.st, self.M, self.top, self.deadline = st, microbatches, top, deadline
        ratio = max(_MANY_RATIO, (max(top, st.least_b) / st.least_b) ** (1.0 / _MANY_CLASSES))
        self.s = s = pywraplp.Solver.CreateSolver("GLOP")
        inf = s.infinity()
        per_kind: list[list] = [[] for _ in st.kinds]
        self.classes, self.sizes = [], []
        cells = _cells_for(st, 1, microbatches)
        b = st.least_b
        while b <= top:
            if _past(deadline):
                raise _Stopped()
            p = s.NumVar(0.0, inf, "")
            z = s.NumVar(0.0, inf, "")
            rows = _Rows(s, st, cells, p, per_kind)
            rows.set_b(b * ratio)
            # Each pipeline: (m_i - 1) b_i <= T - sum_i with b_i >= b: z <= p (1 + T / b) - Z / b (T set later).
            by_time = _row(s, -inf, 0.0, [(z, 1.0), (rows.z_sum, 1.0 / b)])
            within = _row(s, -inf, 0.0, [(z, 1.0)])  # z <= most(T) p: the microbatches that fit T
            _row(s, 0.0, inf, [(z, 1.0), (p, -1.0)])
            if st.schedule == "1f1b":
                _row(s, 0.0, inf, [(z, 1.0)] + [(x, -1.0) for x in rows.devices])  # stages <= microbatches
            # Each pipeline of the part (`set_part`) has at least its least size of devices.
            self.sizes.append((_row(s, 0.0, inf, [(x, 1.0) for x in rows.devices] + [(p, -1.0)]), p))
            self.classes.append((b, p, z, by_time, within, rows))
            b *= ratio
        for i, xs in enumerate(per_kind):
            _row(s, -inf, float(st.count[i]), [(x, 1.0) for x in xs])  # each device in one pipeline at most
        self.k_row = _row(s, float(k_min), inf, [(c[1], 1.0) for c in self.classes])  # the part's pipelines
        _row(s, -inf, float(microbatches), [(c[2], 1.0) for c in self.classes])  # the batch, at most
        objective = s.Objective()
        for c in self.classes:
            objective.SetCoefficient(c[2], 1.0)
        objective.SetMaximization()

    def set_part(self, part: Part) -> None:
        """Only plans of `part`'s pipeline counts, each pipeline at least its least size (NOTE [memory bound parts])."""
        self.k_row.SetBounds(float(part.k_lo), float(part.k_hi - 1) if part.k_hi is not None else self.s.infinity())
        for row, p in self.sizes:
            row.SetCoefficient(p, -float(part.least_size))

    def feasible(self, T_ns: float) -> bool:
        """Whether the LP runs the batch within step T (near-feasible counts: only a lower bound)."""
        st, T = self.st, T_ns * self.st.scale_t
        for b, p, _, by_time, within, rows in self.classes:
            most = int(min(self.M, 1 + max(0.0, T - st.fill) / b)) if b <= T else 0  # 1F1B: stages too
            by_time.SetCoefficient(p, -(1.0 + T / b))
            within.SetCoefficient(p, -float(most))
            for i, level, x in rows.where:
                x.SetUb(float(st.count[i]) if level <= most else 0.0)
        if self.deadline is not None:  # GLOP stops there (status not OPTIMAL: no claim)
            self.s.SetTimeLimit(linear_solver_limit_ms(self.deadline - time.perf_counter()))
        status = self.s.Solve()
        if status == pywraplp.Solver.INFEASIBLE:
            return False
        if status != pywraplp.Solver.OPTIMAL:
            return True  # unknown: assume feasible, which can only lower the bound
        return self.s.Objective().Value() >= self.M * (1 - 1e-7) - 1e-6


def _least_infeasible(feasible, lo: float, deadline: float | None, hi: float | None = None) -> tuple[float, bool]:
    """(the largest T shown infeasible, or 0.0 when feasible at `lo`: nothing shown; finished before the
    deadline); `hi`: a T known feasible, if any."""
    if feasible(lo):
        return 0.0, True
    hi = hi if hi is not None and hi > lo else 2 * lo
    while not feasible(hi):
        lo, hi = hi, 2 * hi
        if _past(deadline):
            return lo, False
        if hi > 1e18:
            return math.inf, True
    while hi - lo > max(1.0, 1e-3 * lo):
        if _past(deadline):
            return lo, False
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if feasible(mid) else (mid, hi)
    return lo, True


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def memory_lower_bound(problem: Problem, microbatches: int, lam: dict[str, float], fill_ns: float,
                       largest_ns: float, need_bytes: int, parts: list[Part], start_ns: float,
                       deadline: float | None = None) -> MemoryBound:
    """NOTE [pipelines memory bound] for `microbatches`, searched from `start_ns` up (a bound already
    known; 0 back when it proves nothing above it); plans of >= 2 pipelines are split into `parts`
    (NOTE [memory bound parts]; they must cover every k >= 2 and size)."""
    t0 = time.perf_counter()
    t = problem.training
    if t is not None and (t.schedule not in ("1f1b", "gpipe") or t.virtual_stages != 1):
        return MemoryBound(0, 0, 0.0, True, f"no memory bound for the {t.schedule} schedule")
    if _past(deadline):  # its setup alone takes seconds on thousands of nodes: not begun past the deadline
        return MemoryBound(0, 0, time.perf_counter() - t0, False, "memory per stage (NOTE [pipelines memory bound]), "
                           "not begun before the deadline")
    st = _setup(problem, microbatches, lam, fill_ns, largest_ns, need_bytes, deadline)
    lo = max(1.0, start_ns, fill_ns)
    witness: dict = {}
    one, done = one_pipeline_bound_ns(st, microbatches, deadline, witness)
    built: list[_ManyLp] = []
    part = [Part(2, None, 1, 0)]

    def many_lp(T_ns: float) -> bool:  # the LP of the part, built once for steps up to twice this one
        if not built or T_ns * st.scale_t > built[0].top:
            built[:] = [_ManyLp(st, microbatches, 2 * T_ns * st.scale_t, 2, deadline)]
            built[0].set_part(part[0])
        return built[0].feasible(T_ns)

    def set_part(q: Part) -> None:
        part[0] = q
        if built:
            built[0].set_part(q)

    best = one
    if microbatches >= 2 and len(problem.devices) >= 2:
        if _past(deadline):
            best, done = min(one, lo), False
        elif one > lo:
            try:
                # Every k >= 2 with no size (each part's LP only adds rows): a T no part's LP reaches, with the
                # least sync, or `one` stands (one LP spent).
                least = min((q.sync_ns for q in parts), default=0)
                free, finished = lo - least, True
                if not math.isfinite(one) or many_lp(one - least):
                    free, finished = _least_infeasible(many_lp, max(1.0, lo - least), deadline,
                                                       one - least if math.isfinite(one) else None)
                else:
                    free = one - least
                best, finished2 = parts_search(parts, many_lp, set_part, free, lo, best, deadline)
                done = done and finished and finished2
            except _Stopped:  # nothing known about two or more pipelines: no claim above `lo`
                best, done = min(one, lo), False
    note = "memory per stage (NOTE [pipelines memory bound])" + ("" if done else ", stopped at the deadline")
    order = sorted(witness, key=lambda k: -witness[k][0])  # NOTE [stash order]: the deepest stash first
    return MemoryBound(whole_ns_at_least(best) if best > lo else 0, whole_ns_at_least(one), time.perf_counter() - t0,
                       done, note, order,
                       {k: n for k, (_, n) in witness.items()})
