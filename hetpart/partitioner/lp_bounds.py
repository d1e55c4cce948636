"""The LP bound of the bottleneck (NOTE [LP work bound]) and its Lagrangian form for large graphs
(NOTE [Lagrangian LP bound]); bounds.py combines them with the other search-free bounds.

PARTITIONING-NOTES finding 6: total work / sum of device speeds is NOT a valid bound
when the speed ratio of two device types differs from op to op (it came out above
proven optima); the LP below is the valid form of that idea.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from hetpart.partitioner.costs import held_weight_bytes, least_stash, node_time_ns, slot_capacity_bytes
from hetpart.partitioner.problem import MEM_BYTES, WEIGHTS, Problem

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
        time_us=np.array([[node_time_ns(problem, v, t) / 1000 for t in types] for v in nodes], dtype=np.float64),
        mem_mb=mem / 1e6,
        allowed=np.array([[t in problem.allowed_types(v) for t in types] for v in nodes], dtype=bool),
        shared={w: rs for w, rs in sorted(readers.items()) if len(rs) > 1},
        count=np.array([sum(s.type == t for s in problem.slots) for t in types], dtype=np.float64),
        capacity_mb=np.array([sum(slot_capacity_bytes(problem, s) for s in problem.slots if s.type == t)
                              for t in types]) / 1e6,
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


def _lp(problem: Problem, max_items: int = LP_MAX_ITEMS) -> tuple[int, _LpData, np.ndarray, np.ndarray]:
    """(NOTE [LP work bound] in ns, the LP data, work multipliers, memory multipliers)."""
    data = _lp_data(problem)
    nt = len(data.types)
    fallback = (np.ones(nt) / data.count / nt, np.zeros(nt))
    if not data.allowed.any(axis=1).all():
        return 0, data, *fallback  # a node no device type can run: no plan at all (constraints.py says which)
    n = len(data.mem_mb)
    if n <= max_items:
        got = _solve_lp(data, {w: held_weight_bytes(problem, w) for w in data.shared})
        if got is None:
            return 0, data, *fallback
        return _floor_ns(got[0]), data, got[1], got[2]
    got = _solve_lp(_runs(data, max_items // 2), problem.weights)
    lam, mu = (got[1], got[2]) if got else fallback
    return _floor_ns(lagrangian_bound_us(data, lam, mu)), data, lam, mu


def lp_work_bound_ns(problem: Problem) -> int:
    """NOTE [LP work bound], rounded down; 0 when the LP is infeasible (then memory rules out every plan).

    Above LP_MAX_ITEMS nodes, NOTE [Lagrangian LP bound] (a valid bound, at most the LP's).
    """
    return _lp(problem)[0]
