"""Lower bounds on the bottleneck (NOTE [stage time]) that need no search, and memory feasibility.

Every bound here holds for every valid plan of the problem, contiguous or not:

- `lp_work_bound_ns`: an LP (OR-Tools GLOP) that spreads each node's work over the
  device types fractionally, NOTE [LP work bound].
- `largest_op_bound_ns`: the slowest node on its fastest device type; some stage runs it.
- `min_devices`: the fewest devices whose memory can hold the model at all.

PARTITIONING-NOTES finding 6: total work / sum of device speeds is NOT a valid bound
when the speed ratio of two device types differs from op to op (it came out above
proven optima); the LP below is the valid form of that idea.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from ortools.graph.python import max_flow
from ortools.linear_solver import pywraplp

from hetpart.partitioner.evaluate import held_weight_bytes
from hetpart.partitioner.problem import MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Problem

# NOTE [LP work bound]
# Variables f[v,t] >= 0 with sum_t f[v,t] = 1: the share of node v run on device type t;
# h[w,t] >= f[v,t] for every reader v of weight w: type t holds (a share of) w.
# In any plan a device of type t runs at most T of work, so the n_t devices of type t
# run at most n_t * T:    sum_v time[v][t] * f[v,t] <= n_t * T.
# Their memory holds what they run:
#     sum_v mem[v] * f[v,t] + sum_w bytes[w] * h[w,t] <= sum of the capacities of type t.
# Any plan gives a feasible point (f = 0/1, h = 1 where a reader runs on t, T = its
# bottleneck, transfers only add time), so the LP's least T is a lower bound.
# It ignores transfers and the order of stages: it is weak where those dominate.


@dataclass(frozen=True)
class Bounds:
    """Bounds of one problem; `lower_bound_ns` is the best valid one."""

    solver_ns: int  # CP-SAT's proven bound of the bottleneck (0 when it proved nothing or minimised another objective)
    lp_work_ns: int  # NOTE [LP work bound]; 0 when the LP says no plan fits in memory
    largest_op_ns: int
    min_devices: int | None  # fewest devices that can hold the model; None: not even all of them
    memory_feasible: bool  # min_devices is at most the stages the problem allows
    stage_sum_ns: int = 0  # NOTE [stage-sum bound]: work and unavoidable transfers, per device multiset

    @property
    def search_free_ns(self) -> int:
        """The best bound that holds without the solver (for every plan of the original problem)."""
        return max(self.lp_work_ns, self.largest_op_ns, self.stage_sum_ns)

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
            "min_devices": self.min_devices,
            "memory_feasible": self.memory_feasible,
            "lower_bound_us": us(self.lower_bound_ns),
        }


def largest_op_bound_ns(problem: Problem) -> int:
    """The slowest node on its fastest allowed device type: some stage runs it, so the bottleneck is at least that."""
    g = problem.graph
    return max((min((g.nodes[v][TIME_NS][t] for t in problem.allowed_types(v)), default=0) for v in g.nodes),
               default=0)


def least_stash(problem: Problem) -> int:
    """The fewest microbatches of activations any stage of any plan holds (NOTE [training memory]).

    Inference and 1F1B (its last stage): 1; GPipe: M. Memory bounds must use this, not the largest.
    """
    t = problem.training
    return t.microbatches if t is not None and t.schedule == "gpipe" else 1


def model_bytes(problem: Problem) -> int:
    """Memory the whole model needs at least, over all stages: every node's mem_bytes (times the
    least stash) and every weight read, once, with its training state."""
    g = problem.graph
    weights = {w for v in g.nodes for w in g.nodes[v].get(WEIGHTS, ())}
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


LP_MAX_ITEMS = 1_000  # above this many nodes the LP runs on runs of nodes, NOTE [Lagrangian LP bound]

# NOTE [Lagrangian LP bound]
# GLOP takes tens of seconds on the LP of a 20,000-node graph. Its Lagrangian dual gives
# a bound for any multipliers: for lambda_t >= 0 (work of type t) and mu_t >= 0 (memory
# of type t), every plan with bottleneck T has, summing the constraints of NOTE [LP work
# bound] with these weights and dropping the weights read by several nodes,
#     T * sum_t lambda_t n_t + sum_t mu_t cap_t
#         >= sum_v (lambda_{t(v)} time[v][t(v)] + mu_{t(v)} mem[v])
#         >= sum_v min over types t that v may run on of (lambda_t time[v][t] + mu_t mem[v]),
# so T >= (that sum - sum_t mu_t cap_t) / sum_t lambda_t n_t, a valid bound whatever the
# multipliers. Above LP_MAX_ITEMS nodes we solve the LP on contiguous runs of the node
# order (their times and memory summed; a cheap LP whose value is NOT itself a bound)
# only to get multipliers (its duals), then evaluate the bound above on every node, in
# numpy. A weight read by one node is part of that node's memory (exact); a weight read
# by several is left out of the memory rows (weaker, still valid).


@dataclass
class _LpData:
    """Per node: time on each type (us), memory with its own weights (MB), allowed types; shared weights."""

    types: list[str]
    time_us: np.ndarray  # [n, types]
    mem_mb: np.ndarray  # [n]
    allowed: np.ndarray  # [n, types] bool
    shared: dict[str, list[int]]  # weight read by 2+ nodes -> reader indices
    count: np.ndarray  # devices per type
    capacity_mb: np.ndarray  # memory per type


def _lp_data(problem: Problem) -> _LpData:
    g = problem.graph
    types = problem.device_types
    nodes = problem.node_order()
    readers: dict[str, list[int]] = {}
    for i, v in enumerate(nodes):
        for w in set(g.nodes[v].get(WEIGHTS, ())):
            readers.setdefault(w, []).append(i)
    mem = least_stash(problem) * np.array([g.nodes[v].get(MEM_BYTES, 0) for v in nodes], dtype=np.float64)
    for w, rs in readers.items():
        if len(rs) == 1:
            mem[rs[0]] += held_weight_bytes(problem, w)
    return _LpData(
        types=types,
        time_us=np.array([[g.nodes[v][TIME_NS][t] / 1000 for t in types] for v in nodes], dtype=np.float64),
        mem_mb=mem / 1e6,
        allowed=np.array([[t in problem.allowed_types(v) for t in types] for v in nodes], dtype=bool),
        shared={w: rs for w, rs in sorted(readers.items()) if len(rs) > 1},
        count=np.array([sum(d.type == t for d in problem.devices) for t in types], dtype=np.float64),
        capacity_mb=np.array([sum(d.capacity_bytes for d in problem.devices if d.type == t) for t in types]) / 1e6,
    )


def _solve_lp(data: _LpData, weights: dict[str, int | float]) -> tuple[float, np.ndarray, np.ndarray] | None:
    """NOTE [LP work bound] with GLOP: (T in us, work duals, memory duals), or None when infeasible."""
    n, nt = data.time_us.shape
    solver = pywraplp.Solver.CreateSolver("GLOP")
    # --- Variables (bytes in MB and times in us keep the LP well scaled).
    f = [[solver.NumVar(0.0, 1.0 if data.allowed[i, j] else 0.0, "") for j in range(nt)] for i in range(n)]
    h = {(w, j): solver.NumVar(0.0, 1.0, "") for w in data.shared for j in range(nt)}
    T = solver.NumVar(0.0, solver.infinity(), "T")
    # --- Constraints.
    for i in range(n):
        # Every node runs somewhere.
        solver.Add(solver.Sum(f[i]) == 1)
    for w, rs in data.shared.items():
        for i in rs:
            for j in range(nt):
                # Type t holds weight w as much as one of its readers runs there.
                solver.Add(h[w, j] >= f[i][j])
    work, memory = [], []
    for j in range(nt):
        # The devices of type t share its work; each runs at most T.
        work.append(solver.Add(solver.Sum([data.time_us[i, j] * f[i][j] for i in range(n)]) - data.count[j] * T <= 0))
        # Their memory holds the nodes and weights they run.
        memory.append(solver.Add(solver.Sum([data.mem_mb[i] * f[i][j] for i in range(n)])
                                 + solver.Sum([weights[w] / 1e6 * h[w, j] for w in data.shared])
                                 <= data.capacity_mb[j]))
    # --- Objective.
    solver.Minimize(T)
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    return (T.solution_value(), np.abs([c.dual_value() for c in work]), np.abs([c.dual_value() for c in memory]))


def _runs(data: _LpData, count: int) -> _LpData:
    """`data` with contiguous runs of about n / count nodes summed into one item (shared weights dropped)."""
    n = len(data.mem_mb)
    bounds = np.linspace(0, n, count + 1).astype(np.int64)
    return _LpData(
        types=data.types, time_us=np.add.reduceat(data.time_us, bounds[:-1], axis=0),
        mem_mb=np.add.reduceat(data.mem_mb, bounds[:-1]),
        allowed=np.logical_and.reduceat(data.allowed, bounds[:-1], axis=0), shared={},
        count=data.count, capacity_mb=data.capacity_mb,
    )


def lagrangian_bound_us(data: _LpData, lam: np.ndarray, mu: np.ndarray, comm_us: float = 0.0) -> float:
    """NOTE [Lagrangian LP bound] for multipliers `lam` (work) and `mu` (memory), in us.

    `comm_us`: transfer time the stages spend in all (each boundary counted on both sides),
    wherever it falls; it adds at least the least multiplier of a type with devices times it.
    """
    denom = float(lam @ data.count)
    if denom <= 0:
        return 0.0
    per_node = np.where(data.allowed, data.time_us * lam[None, :] + data.mem_mb[:, None] * mu[None, :], np.inf)
    least = float(lam[data.count > 0].min()) if comm_us > 0 else 0.0
    return max(0.0, (float(per_node.min(axis=1).sum()) + least * comm_us - float(mu @ data.capacity_mb)) / denom)


def _floor_ns(value_us: float) -> int:
    """Round a float bound in us down to ns, and a little more for the LP's floating-point tolerance."""
    return max(0, math.floor(value_us * 1000 * (1 - 1e-9) - 1e-6))


def _lp(problem: Problem) -> tuple[int, _LpData, np.ndarray, np.ndarray]:
    """(NOTE [LP work bound] in ns, the LP data, work multipliers, memory multipliers)."""
    data = _lp_data(problem)
    nt = len(data.types)
    fallback = (np.ones(nt) / data.count / nt, np.zeros(nt))
    if not data.allowed.any(axis=1).all():
        return 0, data, *fallback  # a node no device type can run: no plan at all (constraints.py says which)
    n = len(data.mem_mb)
    if n <= LP_MAX_ITEMS:
        got = _solve_lp(data, {w: held_weight_bytes(problem, w) for w in data.shared})
        if got is None:
            return 0, data, *fallback
        return _floor_ns(got[0]), data, got[1], got[2]
    got = _solve_lp(_runs(data, LP_MAX_ITEMS // 2), problem.weights)
    lam, mu = (got[1], got[2]) if got else fallback
    return _floor_ns(lagrangian_bound_us(data, lam, mu)), data, lam, mu


def lp_work_bound_ns(problem: Problem) -> int:
    """NOTE [LP work bound], rounded down; 0 when the LP is infeasible (then memory rules out every plan).

    Above LP_MAX_ITEMS nodes, NOTE [Lagrangian LP bound] (a valid bound, at most the LP's).
    """
    return _lp(problem)[0]


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
def min_boundary_bytes(problem: Problem) -> int:
    """The fewest bytes any boundary between two stages carries (NOTE [stage-sum bound]); 0 when unknown."""
    g = problem.graph
    index = {v: i for i, v in enumerate(g.nodes)}
    n = len(index)
    firsts = [index[v] for v in g.nodes if g.nodes[v].get(PIN) == PIN_FIRST]
    lasts = [index[v] for v in g.nodes if g.nodes[v].get(PIN) == PIN_LAST]
    if not firsts or not lasts:
        return 0
    # Source side = the nodes in stages <= k: closed under predecessors (arc v -> u of
    # "infinite" capacity for an edge u -> v); u pays its out_bytes (arc u -> sent(u)) when a
    # successor is on the sink side (sent(u) -> v, infinite). Nodes 0..n-1, sent(u) = n + u.
    out = {v: g.nodes[v].get(OUT_BYTES, 0) for v in g.nodes}
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
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(np.array(tails, dtype=np.int64), np.array(heads, dtype=np.int64),
                                np.array(caps, dtype=np.int64))
    if flow.solve(source, sink) != flow.OPTIMAL or flow.optimal_flow() >= inf:
        return 0  # e.g. a PIN_LAST node precedes a PIN_FIRST one: only one-stage plans exist
    return int(flow.optimal_flow())


def _fewest_machines(problem: Problem, want: dict[str, int]) -> int:
    """The fewest machines whose devices include `want[t]` devices of each type t."""
    machines = sorted({d.node for d in problem.devices})
    have = {m: {t: sum(d.node == m and d.type == t for d in problem.devices) for t in want} for m in machines}
    if len(machines) > 12:
        return 1
    for size in range(1, len(machines) + 1):
        for chosen in itertools.combinations(machines, size):
            if all(sum(have[m][t] for m in chosen) >= k for t, k in want.items()):
                return size
    return len(machines)


def stage_sum_bound_ns(problem: Problem, data: _LpData, lam: np.ndarray, mu: np.ndarray) -> int:
    """NOTE [stage-sum bound], rounded down; 0 when no multiset of devices can hold the model."""
    types = data.types
    counts = [int(c) for c in data.count]
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    need = model_bytes(problem)
    caps = {t: sorted((d.capacity_bytes for d in problem.devices if d.type == t), reverse=True) for t in types}
    cut = min_boundary_bytes(problem)
    net_ns = problem.network.transfer_ns(cut)
    intra_ns = min([link.transfer_ns(cut) for link in problem.intra_node_links.values()] + [net_ns])
    time_ns = np.rint(data.time_us * 1000).astype(np.int64)  # exact: times are integer ns
    big = np.int64(1) << np.int64(62)
    best = None
    for n in itertools.product(*(range(c + 1) for c in counts)):
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
        machines = _fewest_machines(problem, {t: n[j] for j, t in enumerate(types) if n[j]})
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


def compute_bounds(problem: Problem, solver_ns: int = 0) -> Bounds:
    """All the search-free bounds, with the solver's proven bound `solver_ns`."""
    need = min_devices(problem)
    allowed = min(problem.max_stages or len(problem.devices), len(problem.devices))
    lp_ns, data, lam, mu = _lp(problem)
    return Bounds(
        solver_ns=max(0, solver_ns),
        lp_work_ns=lp_ns,
        largest_op_ns=largest_op_bound_ns(problem),
        min_devices=need,
        memory_feasible=need is not None and need <= allowed,
        stage_sum_ns=stage_sum_bound_ns(problem, data, lam, mu) if data.allowed.any(axis=1).all() else 0,
    )


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
    work = sum(min((g.nodes[v][TIME_NS][t] for t in problem.allowed_types(v)), default=0) for v in g.nodes)
    bottleneck = bounds.search_free_ns
    latency = max(work, bottleneck)
    search_free = latency if objective == "latency" else latency + (microbatches - 1) * bottleneck
    return max(solver_ns, search_free)
