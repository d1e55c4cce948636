"""A lower bound on the step time of every plan of data-parallel pipelines (NOTE [pipelines bound]).

The plan space is that of NOTE [pipelines plan]: any partition of any subset of the devices into
pipelines, any single-pipeline plan on each, any integer split of the microbatches. The bound is
a small LP (OR-Tools GLOP) over pipeline *supports* (the set of device types a pipeline's stages
run on), bisected on the step time; nothing here enumerates pipelines, so it costs the same on
8 devices and on 8,000. Nothing here imports torch.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

from hetpart.partitioner.costs import held_weight_bytes
from hetpart.partitioner.lp_bounds import _LpData, _solve_lp
from hetpart.partitioner.pipeline_bound_parts import (Part, _k_ranges, _read_weight_bytes, memory_parts,
                                                      parts_search, sync_floor_ns, whole_ns_at_least)
from hetpart.partitioner.pipeline_memory_bound import MemoryBound, memory_lower_bound
from hetpart.partitioner.pipeline_mix_bound import (RunFloor, StageMix, part_floors, run_floor, run_slack, slack_rows,
                                                     stage_mix)
from hetpart.partitioner.pipeline_stage_sum import StageSum
from hetpart.partitioner.pipeline_sync_topology import crossing_hi_ns, sync_topology, topology_sync_ns
from hetpart.partitioner.problem import MEM_BYTES, TIME_NS, Problem

# NOTE [pipelines bound]
# Take any plan: pipelines i = 1..k over disjoint devices, pipeline i running m_i >= 1
# microbatches (sum m_i = M) on the n_i devices its stages use, whose types form its support A_i.
# Its time is T_i = sum_i + (m_i - 1) b_i (NOTE [pipelines plan]: sum_i its stage times, b_i the
# slowest), and the step is max_i T_i + sync. For one pipeline of support A:
# (a) sum_i >= F_A, every node on its fastest type in A (stage times hold their compute);
# (b) b_i >= Lambda_A / (lambda . n_i) for any lambda >= 0 over the types: the stages on type t
#     run lambda-weighted work sum_t lambda_t W_t <= b_i lambda . n_i, and that work is at least
#     Lambda_A = sum_v min over t in A of lambda_t time[v, t] (NOTE [Lagrangian LP bound]'s
#     argument; lambda = the duals of the LP work bound on A's types, though any lambda is valid);
# (c) so T >= T_i gives m_i - 1 <= (T - F_A) lambda . n_i / Lambda_A: a pipeline's microbatches
#     are at most linear in its devices. That is the fill and drain: a pipeline of S stages
#     pays F_A once, then one bottleneck per microbatch, and b_i >= F_A / S at best;
# (d) a fast type t1 in a slow pipeline: with A' = A - {t1}, every node not on t1 costs at
#     least its time on A', and moving node v to t1 saves at most rho = max_v (min_A' time[v] -
#     time[v, t1]) / time[v, t1] per unit of t1's time, of which the pipeline has n_t1 b_i:
#     sum_i >= F_A' - rho n_t1 b_i, so m_i - 1 <= (T - F_A') / b_i + rho n_t1, with 1/b_i
#     bounded by (b) when T >= F_A' and by 1/T (b_i <= T_i) when not. Without (d) one fast
#     device would give a pipeline of slow ones the fast fill of (a). NOTE [priced fill] states (d)
#     for any prices of the types' time, and where T < F_A' crosses it with (a) in 1/b_i; NOTE [stage
#     sum cuts] (pipeline_stage_sum.py) keeps one variable for a support's 1/b_i in every such line, and
#     adds the lines that touch the exact least stage sum where the LP's point needs them;
# (e) m_i - 1 <= (T - F_A) / L_A, L_A the slowest node on its fastest type in A (it is in a stage);
# (f) the pipeline holds the whole model: its devices' memory is at least every weight read with
#     its training state plus one microbatch of activations (the stash is at least one);
# (g) under GPipe every stage keeps all m_i microbatches' activations, so (f) holds with m_i of them;
# (h) under 1F1B a pipeline has at most as many stages as microbatches (sub_problem), so m_i >= n_i.
# Summing over the pipelines of each support A (p_A of them, y_{A,c} devices of kind c = (type,
# capacity)) gives an LP: sum_A y_{A,c} <= N_c; y_{A,t} >= p_A (a support has a device of each of
# its types); memory sum_c cap_c y_{A,c} >= need p_A (+ (g)); microbatches z_A bounded by (c), (d),
# (e) summed, and z_A >= sum_c y_{A,c} under 1F1B (h); sum_A p_A <= M; sum_A z_A = M. If it is
# infeasible at T, no plan has max_i T_i <= T; it only loosens as T grows, so bisection gives the
# least feasible T (to 0.05%; as whole ns, `whole_ns_at_least`). The rows (c), (d) and (e) are
# written through NOTE [stage sum cuts] (1)'s w_A, which implies each of them.
# Gradient sync (training, k >= 2; NOTE [gradient sync]): every weight read is held in every
# pipeline, so each all-reduce has r >= k ranks and moves at least 2(k-1)/k of its bytes per rank
# over a link no faster than the fastest, with 2(k-1) latencies at least once. The smallest
# pipeline, of n_s devices, has a stage holding at least W / n_s of the W weight bytes (and some
# stage holds the largest weight), so sync >= sigma(n_s, k); with more pipelines than the largest
# machine has devices, a ring crosses machines and its link is no faster than the network. Over slots of
# several degrees (`Problem.tp_sync`, NOTE [mixed-degree gradient sync]) the same holds: each slice's
# all-reduce has a rank of every pipeline (r >= k); a rank of a degree-t stage sums of/t slices of
# ceil(whole/of) bytes of a weight it splits (at least its shard at t) or the whole one it replicates,
# so at least the weight's `Problem.weights` (`mixed_problem` keeps the least over the degrees, the
# shard at the largest); its buckets' costs add up; and k slots on one machine take k of its slots.
# tests/partitioner/test_mixed_pipelines_bound.py checks sigma against every plan of small mixed
# problems (slices over both degrees included) and the bound against their brute-force optimum. The
# plans are split by k (1; 2-3; 4-15; 16-63; 64 and more; and at one more than the largest
# machine's devices) and by n_s (every value up to 32, then geometric cells [g, g'), charged
# sigma(g' - 1, k_lo), raised by NOTE [sync topology floor]); each part adds "sum p_A in the k
# range" and "every pipeline has >= g devices" to the LP. The bound is the least over the parts of their LP's T plus their sigma;
# k = 1 has no sync. The parts are searched best first (`parts_search` of NOTE [memory bound parts]);
# past the deadline every part left is charged what it was shown not to reach, at least the LP with
# no part's rows (k >= 1, any size: a relaxation of each part), plus its own sync, not that LP alone
# (the 7B rows printed 503 ms there, 556 when the parts finished). Left out (the bound stays valid,
# only weaker): transfers between stages (NOTE [pipelines memory bound] charges their floor),
# memory per stage (only per pipeline: NOTE [pipelines memory bound] adds it, and the larger of
# the two bounds is the bound), ZeRO and bucket latencies beyond the first.

_EXACT_SIZES = 32  # n_s cells of one size up to here, then geometric (ratio 1.25)


@dataclass
class PipelinesBound:
    """NOTE [pipelines bound]: the bound, what it left out, and how long it took."""

    bound_ns: int  # no plan's iteration_ns is below it
    one_pipeline_ns: int  # the bound over plans of one pipeline only
    note: str
    seconds: float
    unfinished: list[str] = field(default_factory=list)
    stash_order: list[tuple[str, int]] = field(default_factory=list)  # NOTE [stash order] in pipeline_search.py
    stash_devices: dict[tuple[str, int], float] = field(default_factory=dict)  # ... the LP's devices per kind


@dataclass
class _Support:
    """A set of device types a pipeline's stages run on, and its constants of NOTE [pipelines bound]."""

    types: tuple[str, ...]
    fill_ns: float  # F_A
    largest_op_ns: float  # L_A
    lam: dict[str, float]  # lambda over its types
    work: float  # Lambda_A
    fast: list[tuple[dict[str, float], float]]  # (beta, alpha(beta)) of (d), NOTE [priced fill]
    sums: StageSum  # its least stage sum, NOTE [stage sum cuts]
    cuts: list[tuple[dict[str, float], float]] = field(default_factory=list)  # the lines found so far
    mix: StageSum | None = None  # alpha_mix's Z of NOTE [stage mix bound], None: no such lines
    delta: dict[str, float] = field(default_factory=dict)  # its slack per type
    mix_cuts: list[tuple[dict[str, float], float]] = field(default_factory=list)  # its lines found so far
    run_cuts: list[tuple[dict[str, float], float]] = field(default_factory=list)  # NOTE [stage mix runs]' lines

    def with_mix(self, mix: StageMix | None) -> None:
        """NOTE [stage mix bound]'s Z and slack on this support, and its pool: beta = 0 and NOTE [priced fill]'s
        prices on the one class (the lines the deadline leaves when it stops the separation)."""
        self.mix = mix.sums(self.types) if mix is not None else None
        if self.mix is not None:
            self.delta = {t: float(mix.delta[t]) for t in self.types}
            self.mix_cuts = [({}, min(mix.model_ns[t] for t in self.types)), *_price_lines(self.mix, list(self.types))]
            self.run_cuts = list(self.mix_cuts)


def need_bytes(problem: Problem) -> int:
    """Memory every pipeline needs at least (NOTE [pipelines bound] (f)): each weight read, with its
    training state, and one microbatch of every node's activations."""
    g = problem.graph
    read = problem.weights_read(g.nodes)
    return sum(held_weight_bytes(problem, w) for w in read) + sum(g.nodes[v].get(MEM_BYTES, 0) for v in g.nodes)


def _node_classes(problem: Problem) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(types, time [class, type] ns, allowed [class, type], count [class]): nodes with equal times and types."""
    types = problem.device_types
    g = problem.graph
    groups: dict[tuple, int] = {}
    for v in g.nodes:
        allowed = set(problem.allowed_types(v))
        key = tuple((g.nodes[v][TIME_NS][t], t in allowed) for t in types)
        groups[key] = groups.get(key, 0) + 1
    keys = sorted(groups)
    time_ns = np.array([[float(x[0]) for x in k] for k in keys], dtype=np.float64).reshape(len(keys), len(types))
    allowed = np.array([[x[1] for x in k] for k in keys], dtype=bool).reshape(len(keys), len(types))
    return types, time_ns, allowed, np.array([groups[k] for k in keys], dtype=np.float64)


# NOTE [priced fill]
# (d) of NOTE [pipelines bound], generalised by LP duality. Price time on type t at beta_t >= 0 (any
# prices). A pipeline's nodes on its stages (node v on type t(v)) cost it at least
#     sum_v time[v, t(v)] = sum_v (1 + beta_t(v)) time[v, t(v)] - sum_t beta_t (time of its nodes on t)
#                        >= alpha(beta) - b_i sum_t beta_t n_t,
# with alpha(beta) = sum_v min over t in A of (1 + beta_t) time[v, t],
# since a stage's compute is at most its stage time, at most b_i, and at most n_t stages run on type t.
# So sum_i >= alpha - (beta . n) b_i, and with T >= sum_i + (m_i - 1) b_i:
#     m_i - 1 <= (T - alpha) / b_i + beta . n_i.
# beta = 0 gives (a)'s F_A; beta = rho on t1 alone gives (d)'s F_A' (every node off t1 at its best on
# A', as rho is the largest saving rate). Where T >= alpha, 1 / b_i <= lambda . n_i / Lambda_A (b) makes
# the row linear in n_i, as (d) does; where T < alpha the first term is negative and grows with b_i,
# and (a)'s m_i - 1 <= (T - F_A) / b_i falls with it: in u = 1 / b_i the least of the two lines is at
# most their value where they cross, u* = beta . n_i / (alpha - F_A) (below u* the first line is at
# most its value there; above it the second is, decreasing), so
#     m_i - 1 <= (T - F_A) beta . n_i / (alpha - F_A),
# linear in n_i: both rows sum over the pipelines of a support like (c). In words: slow devices add
# microbatches within T only through a small bottleneck, and a small bottleneck caps the fast devices'
# share of the work, so the stage sum stays long. Prices tried (`_price_lines`; any set is valid): per
# type t1, (d)'s rho on t1 alone, and per type t0 of A and scale theta, beta_u = max(0, theta W_t0 / W_u - 1)
# with W_t the model's time on t (the slower types free, the faster ones priced by their speed-up).
# Llama-7b on hetero-64 (docs/benchmarks.md, "gap7b"): the many-pipeline LP's pipelines of 2 H100 and 6 L4
# ran 8 microbatches each in 547 ms (their fill counted at H100 speed, (d) with T < F_A' divided by T);
# the crossing allows about 6, and the bound rises from 552.3 to 556.4 ms (the crossing at rho alone:
# 554.9). What was left there, the support LP taking each line at its own bottleneck, NOTE [stage sum
# cuts] closes (565.7 ms); these prices are its first lines.

_PRICE_SCALES = (1.4,)  # theta of NOTE [priced fill] (0.7 and 1.0 too, and 6 tangent lines per t1: 557.5 ms
# instead of 556.4 on llama-7b / hetero-64 for 2.3x the LP's time, which under load ran past the bound's deadline)
_CUT_ROUNDS = 8  # LP solves per T at most, NOTE [stage sum cuts] (2)
MIX = True  # NOTE [stage mix bound]'s lines (False: the bound without them, for the tests' comparisons)
RUNS = True  # NOTE [stage mix runs]' rows (False: without them, for the tests' comparisons)
TOPOLOGY = True  # NOTE [sync topology floor] in the parts' charge (False: sigma alone, for the tests' comparisons)
CROSS_EVERYWHERE = False  # the negative control of NOTE [priced fill]: its crossing row where T >= alpha too (invalid)


def _price_lines(sums: StageSum, types: list[str]) -> list[tuple[dict[str, float], float]]:
    """NOTE [priced fill]: (beta per type, alpha(beta)) for a support's node classes, the prices of the note;
    none with no positive price."""
    time_ns, ok, count = sums.time_ns, sums.ok, sums.count
    n_types = len(types)
    betas: list[np.ndarray] = []
    for j in range(n_types):
        rest = [c for c in range(n_types) if c != j]
        if not rest or not ok[:, rest].any(axis=1).all():
            continue
        rest_best = np.where(ok[:, rest], time_ns[:, rest], np.inf).min(axis=1)
        saves = ok[:, j] & (rest_best > time_ns[:, j])
        if (saves & (time_ns[:, j] <= 0)).any() or not saves.any():
            continue  # a node free on t1 saves at an unbounded rate; or nothing saves
        beta = np.zeros(n_types)
        beta[j] = float(((rest_best[saves] - time_ns[saves, j]) / time_ns[saves, j]).max())  # (d)'s rho
        betas.append(beta)
    total = np.where(ok, time_ns, 0.0).T @ count
    for j in range(n_types):
        if total[j] <= 0 or not ok[:, j].all():
            continue
        for theta in _PRICE_SCALES:
            betas.append(np.maximum(0.0, theta * total[j] / np.maximum(total, 1e-300) - 1.0) * (total > 0))
    out = []
    for beta in betas:
        if beta.max(initial=0.0) > 0 and np.isfinite(beta).all():
            priced = {types[c]: float(beta[c]) for c in range(n_types) if beta[c] > 0}
            out.append((priced, sums.alpha(beta)))
    return out


def _supports(problem: Problem) -> list[_Support]:
    """Every support whose types can run every node, with F_A, L_A, lambda, Lambda_A and (d)'s terms."""
    types, time_ns, allowed, count = _node_classes(problem)
    per_type = {t: sum(1 for d in problem.devices if d.type == t) for t in types}
    out = []
    for r in range(1, len(types) + 1):
        for combo in itertools.combinations(range(len(types)), r):
            cols = list(combo)
            ok = allowed[:, cols]
            if not ok.any(axis=1).all():
                continue
            t_a = np.where(ok, time_ns[:, cols], np.inf)
            best = t_a.min(axis=1)
            data = _LpData(types=[types[j] for j in cols], time_us=t_a.clip(max=1e18) * count[:, None] / 1000,
                           mem_mb=np.zeros(len(count)), allowed=ok, shared={},
                           count=np.array([per_type[types[j]] for j in cols], dtype=np.float64),
                           capacity_mb=np.full(len(cols), 1e30))
            # Any lambda >= 0 gives a valid (b); keep the one with the best ratio for all of A's devices:
            # the LP's duals (degenerate ones can be poor) or each type's inverse total time.
            got = _solve_lp(data, {})
            totals = np.where(ok, time_ns[:, cols], 0.0).T @ count
            tries = [np.where(totals > 0, 1.0 / np.maximum(totals, 1e-300), 0.0)]
            if got is not None and got[1].sum() > 0:
                tries.append(np.maximum(got[1], 0.0))

            def lagrange(lam: np.ndarray) -> float:
                return float((np.where(ok, time_ns[:, cols] * lam[None, :], np.inf).min(axis=1) * count).sum())

            lam = max(tries, key=lambda lam: lagrange(lam) / max(1e-300, float(lam @ data.count)))
            work = lagrange(lam)
            sums = StageSum(time_ns[:, cols], ok, count)
            fast = _price_lines(sums, [types[j] for j in cols])
            fill = float((best * count).sum())
            out.append(_Support(types=tuple(types[j] for j in cols), fill_ns=fill,
                                largest_op_ns=float(best.max(initial=0.0)),
                                lam={types[j]: float(lam[i]) for i, j in enumerate(cols)}, work=work, fast=fast,
                                sums=sums, cuts=[({}, fill), *fast]))
    return out


class _Lp:
    """The LP of NOTE [pipelines bound] for one part (k range, least pipeline size), at any T."""

    def __init__(self, problem: Problem, supports: list[_Support], microbatches: int, k_range: tuple[int, int | None],
                 min_size: int, need: int | None = None, deadline: float | None = None,
                 separate: bool = True, runs: RunFloor | None = None, outside_ns: float = 0.0) -> None:
        self.kinds, self.supports, self.M = problem.device_kinds(), supports, microbatches
        self.runs, self.outside = runs, outside_ns  # NOTE [stage mix runs]: its constants, and X_hi
        self.need = need_bytes(problem) if need is None else need
        self.k_range, self.min_size, self.deadline = k_range, min_size, deadline
        self.cut_short = False  # the deadline stopped NOTE [stage sum cuts]'s lines at some T
        self.separate = separate  # False: the lines already found only (NOTE [stage sum cuts] (4))
        t = problem.training
        self.schedule = t.schedule if t is not None else None
        # (g) GPipe stashes every microbatch a pipeline runs: m_i times its activations besides the model.
        g = problem.graph
        self.act = sum(g.nodes[v].get(MEM_BYTES, 0) for v in g.nodes) if self.schedule == "gpipe" else 0
        # NOTE [stage mix bound] (3): every pipeline's bottleneck is at least B in this part.
        most = len(problem.devices) - (k_range[0] - 1) * min_size
        if self.schedule == "1f1b":
            most = min(most, microbatches - (k_range[0] - 1))
        per_type: dict[str, int] = {}
        for c, n in self.kinds.items():
            per_type[c[0]] = per_type.get(c[0], 0) + n
        self.floors = {a.types: part_floors(a.largest_op_ns, a.work, a.lam, {t: per_type.get(t, 0) for t in a.types},
                                            most, min_size) for a in supports}

    def max_microbatches(self, T: float) -> float:
        """The LP's most microbatches within step T (pipelines only, no sync); -1 when infeasible."""
        s = pywraplp.Solver.CreateSolver("GLOP")
        inf = s.infinity()
        usable = [a for a in self.supports if T >= a.fill_ns and T >= a.largest_op_ns]
        # --- Variables: pipelines p, devices y per kind, microbatches z, per usable support.
        p = {a.types: s.NumVar(0.0, inf, f"p{a.types}") for a in usable}
        y = {(a.types, c): s.NumVar(0.0, float(n), f"y{a.types}{c[0]}")
             for a in usable for c, n in self.kinds.items() if c[0] in a.types}
        z = {a.types: s.NumVar(0.0, inf, f"z{a.types}") for a in usable}
        w = {a.types: s.NumVar(0.0, inf, f"w{a.types}") for a in usable}  # NOTE [stage sum cuts] (1)
        scale = 1.0 / max(1.0, self.need)
        # --- Constraints.
        for c, n in self.kinds.items():
            # Each device is in one pipeline at most.
            s.Add(s.Sum([y[a.types, c] for a in usable if c[0] in a.types]) <= n)
        for a in usable:
            ya = [y[a.types, c] for c in self.kinds if c[0] in a.types]
            for t in a.types:
                # A support has a device of each of its types in every pipeline.
                s.Add(s.Sum([y[a.types, c] for c in self.kinds if c[0] == t]) >= p[a.types])
            # Every pipeline holds the model (f), and has at least min_size devices.
            s.Add(s.Sum([c[1] * scale * y[a.types, c] for c in self.kinds if c[0] in a.types])
                  >= p[a.types] + self.act * scale * (z[a.types] - p[a.types]))
            if self.schedule == "1f1b":
                # (h) 1F1B runs at least as many microbatches as stages, one per device used.
                s.Add(z[a.types] >= s.Sum(ya))
            s.Add(s.Sum(ya) >= self.min_size * p[a.types])
            lam_y = s.Sum([a.lam[c[0]] * y[a.types, c] for c in self.kinds if c[0] in a.types])
            # NOTE [stage sum cuts] (1): w = sum over the pipelines of T / b_i, bounded by (b), (e) and b_i <= T;
            # every pipeline runs a microbatch at least.
            s.Add(w[a.types] >= p[a.types])
            s.Add(z[a.types] >= p[a.types])
            if a.work > 0:
                s.Add(w[a.types] <= T / a.work * lam_y)
            if a.largest_op_ns > 0:
                s.Add(w[a.types] <= T / max(a.largest_op_ns, self.floors[a.types].floor) * p[a.types])
            for beta, alpha in a.cuts:
                self._line(s, a, p, y, z, w, T, beta, alpha)
            for beta, alpha in a.mix_cuts:
                for extra in slack_rows(a.delta, beta, a.lam, a.work, self.floors[a.types]):
                    self._line(s, a, p, y, z, w, T, beta, alpha, extra)
            for beta, alpha in a.run_cuts:
                self._run_line(s, a, p, y, z, w, T, beta, alpha)
            if CROSS_EVERYWHERE and a.work > 0:  # NOTE [priced fill]'s negative control (invalid where T >= alpha)
                for beta, alpha in a.fast:
                    if T >= alpha > a.fill_ns:
                        beta_y = s.Sum([beta[c[0]] * y[a.types, c] for c in self.kinds if c[0] in beta])
                        s.Add(z[a.types] <= p[a.types] + (T - a.fill_ns) / (alpha - a.fill_ns) * beta_y)
        lo, hi = self.k_range
        s.Add(s.Sum(list(p.values())) <= min(self.M, hi - 1) if hi is not None else s.Sum(list(p.values())) <= self.M)
        s.Add(s.Sum(list(p.values())) >= lo)
        s.Add(s.Sum(list(z.values())) <= self.M)  # the batch, exactly (with the test below)
        # --- Objective.
        s.Maximize(s.Sum(list(z.values())))
        target = self.M * (1 - 1e-7) - 1e-6
        value = -1.0
        for r in range(_CUT_ROUNDS):  # NOTE [stage sum cuts] (2): lines where the LP's point needs them
            if s.Solve() != pywraplp.Solver.OPTIMAL:
                return -1.0
            value = s.Objective().Value()
            if value < target or r == _CUT_ROUNDS - 1 or not self.separate:
                break
            if _past(self.deadline):
                self.cut_short = True  # NOTE [stage sum cuts] (3): fewer lines, a weaker bound, and said so
                break
            new = []
            for a in usable:
                pa, wa, za = p[a.types].solution_value(), w[a.types].solution_value(), z[a.types].solution_value()
                if pa <= 1e-9 or wa <= 1e-12:
                    continue
                n = np.array([sum(y[a.types, c].solution_value() for c in self.kinds if c[0] == t) for t in a.types])
                got = a.sums.cut_at(n * T / wa)
                if got is None:
                    continue
                beta = {t: float(b) for t, b in zip(a.types, got[0]) if b > 0}
                if wa * (1 - got[1] / T) + float(got[0] @ n) < za - pa - 1e-6 * max(1.0, pa):
                    new.append((a, beta, got[1], False))
                if a.mix is not None and self.runs is not None:  # NOTE [stage mix runs]: the line at the point
                    got = a.mix.cut_at(n * T / wa)
                    if got is not None:
                        beta = {t: float(b) for t, b in zip(a.types, got[0]) if b > 0}
                        k = self._run_k(a, beta)
                        if k is not None and wa * (1 - (got[1] - k - self.outside) / T) + float(got[0] @ n) < (
                                za - pa - 1e-6 * max(1.0, pa)):
                            new.append((a, beta, got[1], None))
                f = self.floors[a.types]
                for per in ([1 / f.floor] if f.floor > 0 else []) + ([f.rate_lo] if f.rate_lo > 0 else []):
                    if a.mix is None:  # NOTE [stage mix bound] (4), at either row's slack
                        break
                    got = a.mix.cut_at((n + np.array([a.delta[t] for t in a.types]) * n * per) * T / wa)
                    if got is None:
                        continue
                    beta = {t: float(b) for t, b in zip(a.types, got[0]) if b > 0}
                    left = min(wa * (1 - got[1] / T) + q * pa
                               + sum((beta.get(t, 0.0) + x.get(t, 0.0)) * k for t, k in zip(a.types, n))
                               for x, q in slack_rows(a.delta, beta, a.lam, a.work, f))
                    if left < za - pa - 1e-6 * max(1.0, pa):
                        new.append((a, beta, got[1], True))
            if not new:
                break
            for a, beta, alpha, mixed in new:
                if mixed is None:
                    a.run_cuts.append((beta, alpha))
                    self._run_line(s, a, p, y, z, w, T, beta, alpha)
                    continue
                (a.mix_cuts if mixed else a.cuts).append((beta, alpha))
                for extra in slack_rows(a.delta, beta, a.lam, a.work, self.floors[a.types]) if mixed else [None]:
                    self._line(s, a, p, y, z, w, T, beta, alpha, extra)
        return value

    def _line(self, s, a: _Support, p, y, z, w, T: float, beta: dict[str, float], alpha: float,
              extra: tuple[dict[str, float], float] | None = None) -> None:
        """NOTE [stage sum cuts] (1)'s row for one line: z - p <= w (1 - alpha / T) + (beta + e) . y + e_p p (set
        coefficient by coefficient: the natural API's expressions took most of the bound's time with hundreds of
        lines); `extra` = (e, e_p): NOTE [stage mix bound]'s slack, else 0."""
        row = s.Constraint(-s.infinity(), 0.0)
        row.SetCoefficient(z[a.types], 1.0)
        row.SetCoefficient(p[a.types], -1.0 - (extra[1] if extra else 0.0))
        row.SetCoefficient(w[a.types], alpha / T - 1.0)
        for c in self.kinds:
            coef = beta.get(c[0], 0.0) + (extra[0].get(c[0], 0.0) if extra else 0.0)
            if c[0] in a.types and coef > 0:
                row.SetCoefficient(y[a.types, c], -coef)

    def _run_k(self, a: _Support, beta: dict[str, float]) -> float | None:
        """NOTE [stage mix runs]' K for a line of `a`'s alpha_mix (None: no row)."""
        if not RUNS or a.mix is None:
            return None
        return run_slack(a.delta, beta, self.runs)

    def _run_line(self, s, a: _Support, p, y, z, w, T: float, beta: dict[str, float], alpha: float) -> None:
        """NOTE [stage mix runs]' row: NOTE [stage sum cuts] (1)'s at T + X_hi with alpha_mix - K, in the LP's w (which
        is sum T / b_i): z - p <= w (T + X_hi - alpha + K) / T + beta . y."""
        k = self._run_k(a, beta)
        if k is not None:
            self._line(s, a, p, y, z, w, T, beta, alpha - k - self.outside)

    def feasible(self, T: float) -> bool:
        # Near-feasible counts as feasible: a float LP may only make the bound lower, never unsound.
        return self.max_microbatches(T) >= self.M * (1 - 1e-7) - 1e-6


def _least_T(lp: _Lp, lo: float, hi: float, deadline: float | None) -> float | None:
    """The least T the LP allows, from below (NOTE [pipelines bound]); None past the deadline."""
    if lp.feasible(lo):
        return lo
    while not lp.feasible(hi):
        if _past(deadline) or hi > 1e18:
            return None if hi <= 1e18 else math.inf
        lo, hi = hi, 2 * hi
    while hi - lo > max(1.0, 5e-4 * lo):
        if _past(deadline):
            return None
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if lp.feasible(mid) else (mid, hi)
    return lo


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _size_cells(devices: int) -> list[int]:
    """The starts of NOTE [pipelines bound]'s n_s cells, and devices + 1 to close the last one."""
    cells = list(range(1, min(devices, _EXACT_SIZES) + 1))
    while cells[-1] < devices:
        cells.append(min(devices, max(cells[-1] + 1, int(cells[-1] * 1.25))))
    return cells + [devices + 1]


def _lp_bound(problem: Problem, supports: list[_Support], microbatches: int, need: int, upper_ns: int | None,
              deadline: float | None, separate: bool, below: tuple[float, float, float] | None = None
              ) -> tuple[float | None, float | None, float, list[str]]:
    """(one pipeline, the LP with no part's rows, the bound, what the deadline cut) of NOTE [pipelines bound]'s LPs,
    with NOTE [stage sum cuts]'s new lines where `separate` (else the pool's lines only); None: past the deadline.
    `below`: those three from fewer lines, where each search starts (NOTE [stage sum cuts] (4))."""
    lo = min(a.fill_ns for a in supports)
    start = below or (lo, lo, lo)
    runs = run_floor(problem, deadline) if RUNS and MIX else None  # NOTE [stage mix runs]
    devices = len(problem.devices)
    cells = _size_cells(devices)
    topo = (sync_topology(problem, _read_weight_bytes(problem), need, deadline)
            if TOPOLOGY and microbatches >= 2 and problem.training is not None else None)
    parts = [Part(k_lo, k_hi, g_lo, topology_sync_ns(topo, min(devices // k_lo, g_next - 1), k_lo, g_lo,
                                                    sync_floor_ns(problem, g_next - 1, k_lo)),
                  crossing_hi_ns(topo, k_lo, g_lo))
             for k_lo, k_hi in _k_ranges(problem) if k_lo <= microbatches
             for g_lo, g_next in zip(cells, cells[1:]) if g_lo * k_lo <= devices]
    # The LP of no part's rows is a relaxation of each part's: its run rows at the largest X_hi (NOTE [stage mix runs]).
    lps = [_Lp(problem, supports, microbatches, (1, 2), 1, need, deadline, separate, runs),
           _Lp(problem, supports, microbatches, (1, None), 1, need, deadline, separate, runs,
               max((q.outside_ns for q in parts), default=0))]
    one = _least_T(lps[0], max(lo, start[0]), max(lo, start[0]) * (1.05 if below else 2.0) + 1.0, deadline)
    free = _least_T(lps[1], max(lo, start[1]), max(lo, start[1]) * (1.05 if below else 2.0) + 1.0, deadline)
    if one is None or free is None or not math.isfinite(free):
        return one, free, 0.0, ["pipelines"]
    unfinished = []
    best = one
    if microbatches >= 2:
        best = min(one, free)  # any k, no sync charged: valid on its own
        if problem.training is not None:
            by_part: dict[Part, _Lp] = {}
            now: list[_Lp] = []

            def set_part(q: Part) -> None:
                if q not in by_part:
                    by_part[q] = _Lp(problem, supports, microbatches, (q.k_lo, q.k_hi), q.least_size, need, deadline,
                                     separate, runs, q.outside_ns)
                    lps.append(by_part[q])
                now[:] = [by_part[q]]

            # NOTE [memory bound parts]'s branch and bound over the parts; past the deadline each part left is
            # charged what it was shown not to reach (at least `free`) plus its sync.
            top = min(one, upper_ns if upper_ns is not None else math.inf)
            got, finished = parts_search(parts, lambda T: now[0].feasible(T), set_part, free, max(free, start[2]), top,
                                         deadline)
            if not finished:
                unfinished.append("sync")
            best = min(one, got)
    if any(lp.cut_short for lp in lps):
        unfinished.append("stage sums")
    return one, free, best, unfinished


def pipelines_lower_bound(problem: Problem, microbatches: int, deadline: float | None = None,
                          upper_ns: int | None = None, memory: bool = True,
                          memory_deadline: float | None = None) -> PipelinesBound:
    """NOTE [pipelines bound] for `microbatches` microbatches; `upper_ns` (a known plan's step) only
    prunes parts that cannot go below it; past `deadline` (a perf_counter value) the sync parts
    left are charged the LP with no part's rows plus their own sync, the stage sums' lines left are left
    out (still a bound), and `unfinished` says so. `memory=False` leaves out NOTE [pipelines memory
    bound] (the tests compare the two); it stops at `memory_deadline` (default `deadline`)."""
    t0 = time.perf_counter()
    supports = _supports(problem)
    if not supports:
        return PipelinesBound(0, 0, "no set of device types runs every node: no plan, no bound", 0.0)
    need = need_bytes(problem)  # once: each part's LP reads it (213 scans of a 3,690-node graph took 2 s)
    lo = min(a.fill_ns for a in supports)
    # NOTE [stage mix bound]: its pool lines in both passes, its separated lines in the second (its closures within
    # the deadline, as the lines are).
    mix = stage_mix(problem, deadline) if MIX else None
    for a in supports:
        a.with_mix(mix)
    one, free, best, unfinished = _lp_bound(problem, supports, microbatches, need, upper_ns, deadline, False)
    if one is None or free is None:
        return PipelinesBound(0, 0, "the pipelines bound did not finish before the deadline", time.perf_counter() - t0,
                              ["pipelines"])
    if not math.isfinite(free):
        return PipelinesBound(0, 0, "no set of pipelines holds the model in memory: no plan, no bound",
                              time.perf_counter() - t0)
    # NOTE [stage sum cuts] (4): again with the lines the LP's points need, while time is left; the larger holds.
    more = (_lp_bound(problem, supports, microbatches, need, upper_ns, deadline, True, (one, free, best))
            if not _past(deadline) else (None, None, 0.0, ["pipelines"]))
    if more[0] is not None and more[1] is not None:
        one, best = max(one, more[0]), max(best, more[2])
        unfinished = [] if not more[3] else [*unfinished, "stage sums"]
    else:
        unfinished.append("stage sums")
    if MIX and mix is None and "stage sums" not in unfinished:
        unfinished.append("stage mix")
    bound = whole_ns_at_least(best)
    one_ns = whole_ns_at_least(one)
    # NOTE [pipelines memory bound]: memory per stage; the larger of the two bounds holds.
    full = max(supports, key=lambda a: len(a.types))
    mem = memory_lower_bound(problem, microbatches, full.lam, lo, min(a.largest_op_ns for a in supports),
                             need, memory_parts(problem, microbatches), bound,
                             memory_deadline or deadline) if memory else MemoryBound(0, 0, 0.0, True, "left out")
    bound, one_ns = max(bound, mem.bound_ns), max(one_ns, mem.one_pipeline_ns)
    if not mem.finished:
        unfinished.append("memory")
    left = ("transfers between stages above the least a boundary carries, bucket latencies"
            + ("; part of the gradient-sync floor (past the deadline)" if "sync" in unfinished else "")
            + ("; some lines of the exact stage sums (past the deadline)" if "stage sums" in unfinished else "")
            + ("; the stage mix (its closures past the deadline, or a type some node cannot run on)"
               if "stage mix" in unfinished else "")
            + ("; part of the memory-per-stage bound (past the deadline)" if not mem.finished else ""))
    note = (f"every partition of the {len(problem.devices)} devices into pipelines, every stage plan and "
            f"microbatch split (NOTE [pipelines bound], NOTE [pipelines memory bound]); left out: {left}")
    return PipelinesBound(bound, one_ns, note, time.perf_counter() - t0, unfinished, mem.stash_order,
                          mem.stash_devices)
