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

import math
from dataclasses import dataclass

from ortools.linear_solver import pywraplp

from hetpart.partitioner.problem import MEM_BYTES, TIME_NS, WEIGHTS, Problem

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

    @property
    def lower_bound_ns(self) -> int:
        return max(self.solver_ns, self.lp_work_ns, self.largest_op_ns)

    def to_json(self) -> dict:
        us = lambda ns: round(ns / 1000, 3)  # noqa: E731
        return {
            "solver_us": us(self.solver_ns),
            "lp_work_us": us(self.lp_work_ns),
            "largest_op_us": us(self.largest_op_ns),
            "min_devices": self.min_devices,
            "memory_feasible": self.memory_feasible,
            "lower_bound_us": us(self.lower_bound_ns),
        }


def largest_op_bound_ns(problem: Problem) -> int:
    """The slowest node on its fastest device type: some stage runs it, so the bottleneck is at least that."""
    types = problem.device_types
    g = problem.graph
    return max((min(g.nodes[v][TIME_NS][t] for t in types) for v in g.nodes), default=0)


def model_bytes(problem: Problem) -> int:
    """Memory the whole model needs on one device: every node's mem_bytes and every weight read, once."""
    g = problem.graph
    weights = {w for v in g.nodes for w in g.nodes[v].get(WEIGHTS, ())}
    return sum(g.nodes[v].get(MEM_BYTES, 0) for v in g.nodes) + sum(problem.weights[w] for w in weights)


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


def lp_work_bound_ns(problem: Problem) -> int:
    """NOTE [LP work bound], rounded down; 0 when the LP is infeasible (then memory rules out every plan)."""
    g = problem.graph
    types = problem.device_types
    count = {t: sum(d.type == t for d in problem.devices) for t in types}
    capacity = {t: sum(d.capacity_bytes for d in problem.devices if d.type == t) for t in types}
    solver = pywraplp.Solver.CreateSolver("GLOP")
    nodes = sorted(g.nodes, key=str)

    # --- Variables (bytes in MB and times in us keep the LP well scaled).
    f = {(v, t): solver.NumVar(0.0, 1.0, "") for v in nodes for t in types}
    readers: dict[str, list] = {}
    for v in nodes:
        for w in g.nodes[v].get(WEIGHTS, ()):
            readers.setdefault(w, []).append(v)
    h = {(w, t): solver.NumVar(0.0, 1.0, "") for w in sorted(readers) for t in types}
    T = solver.NumVar(0.0, solver.infinity(), "T")

    # --- Constraints.
    for v in nodes:
        # Every node runs somewhere.
        solver.Add(sum(f[v, t] for t in types) == 1)
    for w, vs in readers.items():
        for v in vs:
            for t in types:
                # Type t holds weight w as much as one of its readers runs there.
                solver.Add(h[w, t] >= f[v, t])
    for t in types:
        # The devices of type t share its work; each runs at most T.
        solver.Add(sum(g.nodes[v][TIME_NS][t] / 1000 * f[v, t] for v in nodes) <= count[t] * T)
        # Their memory holds the nodes and weights they run.
        solver.Add(sum(g.nodes[v].get(MEM_BYTES, 0) / 1e6 * f[v, t] for v in nodes)
                   + sum(problem.weights[w] / 1e6 * h[w, t] for w in readers) <= capacity[t] / 1e6)

    # --- Objective.
    solver.Minimize(T)
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        return 0
    # Round down, and a little more for the LP's floating-point tolerance.
    return max(0, math.floor(T.solution_value() * 1000 * (1 - 1e-9) - 1e-6))


def compute_bounds(problem: Problem, solver_ns: int = 0) -> Bounds:
    """All the search-free bounds, with the solver's proven bound `solver_ns`."""
    need = min_devices(problem)
    allowed = min(problem.max_stages or len(problem.devices), len(problem.devices))
    return Bounds(
        solver_ns=max(0, solver_ns),
        lp_work_ns=lp_work_bound_ns(problem),
        largest_op_ns=largest_op_bound_ns(problem),
        min_devices=need,
        memory_feasible=need is not None and need <= allowed,
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
    types = problem.device_types
    g = problem.graph
    work = sum(min(g.nodes[v][TIME_NS][t] for t in types) for v in g.nodes)
    bottleneck = max(bounds.lp_work_ns, bounds.largest_op_ns)
    latency = max(work, bottleneck)
    search_free = latency if objective == "latency" else latency + (microbatches - 1) * bottleneck
    return max(solver_ns, search_free)
