"""Co-location groups and forbidden device types: why they cannot be satisfied, in the data's terms.

A node's FORBIDDEN_TYPES are device types that cannot run it (an op with no kernel
there); nodes sharing a COLOCATE name must share a stage (tied weights, a forward op
and its backward). Both are node attributes (problem.py); the solvers honour them
(cpsat.py, dp.py) and the verifier checks them (verify.py). This module finds the
conflicts that make every plan impossible before any solver runs, so the error can
name the group or op and say why (NOTE [co-location closure]).
"""

from __future__ import annotations

from hetpart.partitioner.infeasible import NoPlan
from hetpart.partitioner.problem import FORBIDDEN_TYPES, MEM_BYTES, WEIGHTS, Problem

# NOTE [co-location closure]
# Stages are ordered and every edge goes forward, so when u and v share a stage every
# node on a path from u to v is in that stage too. A group's closure (its members plus
# the nodes on paths between two of them) must therefore fit one device: one device
# type that runs all of it, and enough memory for its nodes and weights (each once).
# Every node on such a path lies between its ends in any topological order, so the
# closure is searched inside the window of positions its members span: one walk down and
# one up from all the members together, never past the window. (Walking every member's
# descendants and ancestors through the whole graph cost the 405B-shaped model's 253
# tensor-parallel groups of up to 27 nodes on 5,806 nodes 20-30 s, before any solver ran:
# docs/benchmarks.md, "solvelimit".)


def closure(problem: Problem, members: list[str], position: dict[str, int] | None = None) -> set[str]:
    """The members and every node on a path between two of them (NOTE [co-location closure]);
    `position`: each node's index in a topological order (None: `problem.node_order()`'s)."""
    g = problem.graph
    if position is None:
        position = {v: i for i, v in enumerate(problem.node_order())}
    lo, hi = min(position[v] for v in members), max(position[v] for v in members)

    def reach(step, inside) -> set[str]:
        seen, todo = set(members), list(members)
        while todo:
            for w in step(todo.pop()):
                if w not in seen and inside(position[w]):
                    seen.add(w)
                    todo.append(w)
        return seen

    return reach(g.successors, lambda i: i <= hi) & reach(g.predecessors, lambda i: i >= lo)


def conflicts(problem: Problem) -> list[str]:
    """Every reason the co-location groups and forbidden types rule out all plans, as sentences."""
    g = problem.graph
    types = problem.device_types

    out: list[str] = []
    order = problem.node_order()
    position = {v: i for i, v in enumerate(order)}
    for v in order:
        if not problem.allowed_types(v):
            out.append(f"node {v!r} cannot run on any device type of the cluster: it forbids "
                       f"{sorted(g.nodes[v].get(FORBIDDEN_TYPES, ()))} and the cluster has {types}; "
                       "add a device of another type or give the op a kernel on one of these")
        elif g.nodes[v].get(FORBIDDEN_TYPES):
            need = g.nodes[v].get(MEM_BYTES, 0) + sum(problem.weights[w] for w in set(g.nodes[v].get(WEIGHTS, ())))
            allowed = [d for d in problem.devices if d.type in problem.allowed_types(v)]
            biggest = max(allowed, key=lambda d: d.capacity_bytes)
            if need > biggest.capacity_bytes:
                out.append(f"node {v!r} needs {need} bytes but the largest device of a type it may run on "
                           f"({biggest.name!r}, type {biggest.type!r}) has {biggest.capacity_bytes} bytes "
                           f"(it forbids {sorted(g.nodes[v][FORBIDDEN_TYPES])})")
    for name, members in problem.colocation_groups().items():
        nodes = closure(problem, members, position)
        extra = sorted(nodes - set(members), key=str)
        where = f"co-location group {name!r} ({len(members)} nodes: {', '.join(map(repr, members[:6]))}" + (
            ", ..." if len(members) > 6 else "") + ")"
        via = (f"; with the {len(extra)} node(s) on paths between them ({', '.join(map(repr, extra[:4]))}"
               + (", ..." if len(extra) > 4 else "") + "), which must share their stage") if extra else ""
        allowed = [t for t in types if all(t in problem.allowed_types(v) for v in nodes)]
        if not allowed:
            blockers = [f"{v!r} forbids {sorted(g.nodes[v].get(FORBIDDEN_TYPES, ()))}" for v in sorted(nodes, key=str)
                        if g.nodes[v].get(FORBIDDEN_TYPES)]
            out.append(f"{where}{via}: no device type can run all of them ({'; '.join(blockers[:6])}); "
                       "drop a forbidden type or split the group")
            continue
        weights = problem.weights_read(nodes)
        need = sum(g.nodes[v].get(MEM_BYTES, 0) for v in nodes) + sum(problem.weights[w] for w in weights)
        fits = [d for d in problem.devices if d.type in allowed and d.capacity_bytes >= need]
        if not fits:
            biggest = max((d for d in problem.devices if d.type in allowed), key=lambda d: d.capacity_bytes)
            out.append(f"{where}{via}: needs {need} bytes in one stage, but the largest device that can run it "
                       f"({biggest.name!r}, type {biggest.type!r}) has {biggest.capacity_bytes} bytes; "
                       "split the group or add a larger device")
    return out


def check_constraints(problem: Problem) -> None:
    """Raise NoPlan (a HetpartError) naming every co-location group or op that no plan can satisfy."""
    found = conflicts(problem)
    if found:
        raise NoPlan("partitioner: no plan can honour the co-location groups and forbidden device types:\n  "
                           + "\n  ".join(found))
