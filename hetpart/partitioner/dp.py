"""A fast, exact-for-its-class plan: contiguous segments of one topological order.

PARTITIONING-NOTES finding 1: a dynamic program over one topological order is
the engine; CP-SAT starts from its answer (`model.add_hint`).

The order is `Problem.node_order()`. A plan cuts it into S contiguous segments;
segment k runs on the k-th device of a device sequence that the DP chooses too.
Interchangeable devices (`Problem.device_classes`) are one class, so the DP's
state is "how many devices of each class are used", the class of the current
stage and whether the previous one ran on the same machine (that fixes the link
of the boundary in between), not the order in which devices were used
(PARTITIONING-NOTES: DP over type-count states). Many distinct classes make too
many states: then `_classes` coarsens them (see there).

For contiguous segments the bytes crossing a cut depend only on the cut's
position j (outputs of nodes before j read at or after j), so every cost the DP
needs is a vector over positions or an (n+1) x (n+1) matrix over segments [i, j).
"""

from __future__ import annotations

import math
import time

import numpy as np

from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import (
    MEM_BYTES,
    OUT_BYTES,
    PIN,
    PIN_FIRST,
    PIN_LAST,
    TIME_NS,
    WEIGHTS,
    Link,
    Plan,
    Problem,
)

_INF = np.int64(1) << np.int64(60)
_DP_BUDGET = 300_000_000  # matrix entries the DP may touch (about a second) before it coarsens its classes


def order_cut_bytes(problem: Problem, order: list[str]) -> np.ndarray:
    """Bytes over cut j of a topological order (between positions j-1 and j), j = 0..n.

    A node's output crosses every cut between it and its last reader (NOTE [stage time]).
    """
    g = problem.graph
    pos = {v: i for i, v in enumerate(order)}
    diff = np.zeros(len(order) + 2, dtype=np.int64)
    for u in order:
        nbytes = g.nodes[u].get(OUT_BYTES, 0)
        last = max((pos[v] for v in g.successors(u)), default=-1)
        if nbytes > 0 and last > pos[u]:
            diff[pos[u] + 1] += nbytes
            diff[last + 1] -= nbytes
    return np.cumsum(diff)[: len(order) + 1]


def transfer_ns(link: Link, nbytes: np.ndarray) -> np.ndarray:
    """`Link.transfer_ns` over a vector of byte counts."""
    bw = link.bandwidth_bytes_per_us
    return np.where(nbytes > 0, link.latency_ns + (nbytes * 1000 + bw - 1) // bw, 0).astype(np.int64)


def _classes(problem: Problem, n: int, max_stages: int) -> tuple[bool, list[list[str]]]:
    """Device classes for the DP, and whether they are exact.

    Exact classes are `Problem.device_classes()` (type, machine, capacity). When
    their states would cost more than `_DP_BUDGET` matrix entries, devices are
    grouped by (type, capacity), then by type only: the DP then assumes the
    slowest link at every boundary and the smallest capacity of a class, so its
    plan is valid (and re-costed exactly by `evaluate`) but may be worse.
    """
    keys = [
        lambda d: (d.type, d.node, d.capacity_bytes),
        lambda d: (d.type, d.capacity_bytes),
        lambda d: (d.type,),
    ]
    for level, key in enumerate(keys):
        groups: dict[tuple, list[str]] = {}
        for d in problem.devices:
            groups.setdefault(key(d), []).append(d.name)
        classes = list(groups.values())
        count_states = math.prod(min(len(c), max_stages) + 1 for c in classes)
        work = count_states * 2 * len(classes) ** 2 * (n + 1) ** 2 // 2
        if work <= _DP_BUDGET or level == len(keys) - 1:
            return level == 0, classes
    raise AssertionError("unreachable")


def dp_hint(problem: Problem) -> Plan | None:
    """The best plan whose stages are contiguous segments of `problem.node_order()`.

    Minimises the bottleneck of NOTE [stage time] (evaluate.py) under the memory
    limits and pins; returns None when no such plan fits in memory. The plan's
    `lower_bound_ns` is 0: the DP proves nothing about non-contiguous plans.

        >>> import networkx as nx
        >>> from hetpart.partitioner.problem import Device, Link
        >>> g = nx.path_graph(["a", "b", "c", "d"], create_using=nx.DiGraph)
        >>> nx.set_node_attributes(g, {v: {"gpu": 10} for v in g}, "time_ns")
        >>> p = Problem(graph=g, weights={}, devices=[Device("g0", "gpu", "n0", 1), Device("g1", "gpu", "n0", 1)],
        ...             intra_node_links={"n0": Link(1000, 0)}, network=Link(1000, 0))
        >>> plan = dp_hint(p)
        >>> plan.stage_of, plan.device_of_stage, plan.bottleneck_ns
        ({'a': 0, 'b': 0, 'c': 1, 'd': 1}, ['g0', 'g1'], 20)
    """
    t0 = time.perf_counter()
    problem.validate()
    g = problem.graph
    order = problem.node_order()
    n = len(order)
    attrs = [g.nodes[v] for v in order]

    # --- Data: prefix sums over the order, cut bytes, segment memory.
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    exact, classes = _classes(problem, n, max_stages)
    cls_dev = [[problem.device(d) for d in c] for c in classes]
    cls_type = [c[0].type for c in cls_dev]
    cls_capacity = [min(d.capacity_bytes for d in c) for c in cls_dev]
    cls_machine = [c[0].node if exact else "" for c in cls_dev]
    sizes = [len(c) for c in classes]

    comp = {
        t: np.concatenate([[0], np.cumsum([a[TIME_NS][t] for a in attrs], dtype=np.int64)]).astype(np.int64)
        for t in problem.device_types
    }
    mem_prefix = np.concatenate([[0], np.cumsum([a.get(MEM_BYTES, 0) for a in attrs], dtype=np.int64)])

    cut_bytes = order_cut_bytes(problem, order)

    # Segment memory M[i, j] of [i, j): mem_bytes plus each weight with a reader in [i, j), once.
    readers: dict[str, list[int]] = {}
    for i, a in enumerate(attrs):
        for w in a.get(WEIGHTS, ()):
            readers.setdefault(w, []).append(i)
    wdiff = np.zeros((n + 1, n + 2), dtype=np.int64)
    starts = np.arange(n + 1)
    for w, rs in sorted(readers.items()):
        rs_arr = np.array(sorted(set(rs)))
        k = np.searchsorted(rs_arr, starts)  # first reader at or after start i
        has = k < len(rs_arr)
        nxt = rs_arr[np.minimum(k, len(rs_arr) - 1)]
        np.add.at(wdiff, (starts[has], nxt[has] + 1), problem.weights[w])
    seg_mem = mem_prefix[None, :] - mem_prefix[:, None] + np.cumsum(wdiff, axis=1)[:, : n + 1]
    later = starts[None, :] > starts[:, None]  # j > i: segments are non-empty
    fits_cache: dict[int, np.ndarray] = {}

    def fits(c: int) -> np.ndarray:
        cap = cls_capacity[c]
        if cap not in fits_cache:
            fits_cache[cap] = later & (seg_mem <= cap)
        return fits_cache[cap]

    # Boundary times per link: the link between two classes depends on their machines only.
    # Without machines in the classes (not `exact`) the DP pays the slowest link everywhere.
    all_links = [problem.network, *problem.intra_node_links.values()]
    slowest = np.max([transfer_ns(link, cut_bytes) for link in all_links], axis=0)
    intra_ns = {m: transfer_ns(link, cut_bytes) for m, link in problem.intra_node_links.items()}
    network_ns = transfer_ns(problem.network, cut_bytes) if exact else slowest
    zeros = np.zeros(n + 1, dtype=np.int64)

    def same_machine(c1: int, c2: int) -> int:
        return int(exact and cls_machine[c1] == cls_machine[c2])

    def boundary_ns(same: int, cur: int) -> np.ndarray:
        """Boundary times into a stage on `cur`: same is -1 (no previous stage), 0 or 1."""
        return zeros if same < 0 else intra_ns[cls_machine[cur]] if same else network_ns

    # Pins: stage 0 ends after the last PIN_FIRST node; non-final stages end at or
    # before the first PIN_LAST node; the final stage starts before its last unpinned node.
    first_pins = [i for i, a in enumerate(attrs) if a.get(PIN) == PIN_FIRST]
    last_pins = [i for i, a in enumerate(attrs) if a.get(PIN) == PIN_LAST]
    free = [i for i, a in enumerate(attrs) if a.get(PIN) != PIN_LAST]
    first_end_min = max(first_pins, default=0) + 1
    inner_end_max = min(last_pins + [n - 1])
    final_start_max = free[-1]

    # --- DP. A state (counts, same, cur) holds G[j]: the least bottleneck of the stages
    # before cut j, given that the stage starting at j runs on class `cur` and that the
    # stage before it ran on the same machine (same=1), another one (0) or none (-1).
    # The boundary at j is paid by the stage that ends there and, through `same`, by `cur`.
    Key = tuple[tuple[int, ...], int, int]
    states: list[tuple[Key, np.ndarray, np.ndarray, np.ndarray]] = []  # key, G, back_start, back_state
    layer: dict[Key, int] = {}
    for c in range(len(classes)):
        G = np.full(n + 1, _INF, dtype=np.int64)
        G[0] = 0
        counts = tuple(int(i == c) for i in range(len(classes)))
        layer[(counts, -1, c)] = len(states)
        states.append(((counts, -1, c), G, np.full(n + 1, -1), np.full(n + 1, -1)))

    best_ns, best_state, best_start = _INF, -1, -1
    for depth in range(1, max_stages + 1):
        next_layer: dict[Key, int] = {}
        for key in sorted(layer):
            sid = layer[key]
            counts, same, cur = key
            G = states[sid][1]
            if G.min() >= best_ns:
                continue
            tin = boundary_ns(same, cur)
            rows = np.flatnonzero(G < _INF)
            ctype = cls_type[cur]

            # The stage on `cur` is the last one: segment [i, n).
            ok = rows[(rows <= final_start_max) & fits(cur)[rows, n]]
            if len(ok):
                val = np.maximum(G[ok], tin[ok] + comp[ctype][n] - comp[ctype][ok])
                k = int(np.argmin(val))
                if val[k] < best_ns:
                    best_ns, best_state, best_start = val[k], sid, int(ok[k])

            if depth == max_stages:
                continue
            # Or it ends at cut j and the next stage runs on class `nxt`.
            lo = first_end_min if depth == 1 else 1
            cols = np.arange(lo, inner_end_max + 1)
            if len(cols) == 0:
                continue
            for nxt in range(len(classes)):
                if counts[nxt] >= sizes[nxt]:
                    continue
                same = same_machine(cur, nxt)
                tout = boundary_ns(same, nxt)
                cost = (tin[rows] - comp[ctype][rows])[:, None] + (comp[ctype][cols] + tout[cols])[None, :]
                val = np.where(fits(cur)[np.ix_(rows, cols)], np.maximum(cost, G[rows][:, None]), _INF)
                arg = np.argmin(val, axis=0)
                got = val[arg, np.arange(len(cols))]
                nkey = (tuple(c + (i == nxt) for i, c in enumerate(counts)), same, nxt)
                if nkey not in next_layer:
                    next_layer[nkey] = len(states)
                    states.append((nkey, np.full(n + 1, _INF, dtype=np.int64), np.full(n + 1, -1), np.full(n + 1, -1)))
                _, G2, back_start, back_state = states[next_layer[nkey]]
                better = got < G2[cols]
                G2[cols[better]] = got[better]
                back_start[cols[better]] = rows[arg[better]]
                back_state[cols[better]] = sid
        layer = next_layer

    if best_state < 0:
        return None

    # --- Read the plan back: walk the cuts from the last stage to the first.
    segments = []  # (start, end, class)
    sid, start, end = best_state, best_start, n
    while True:
        (_, same, cur), _, back_start, back_state = states[sid]
        segments.append((start, end, cur))
        if same < 0:
            break
        sid, start, end = int(back_state[start]), int(back_start[start]), start
    segments.reverse()

    used = [0] * len(classes)
    stage_of: dict[str, int] = {}
    device_of_stage: list[str] = []
    for k, (i, j, c) in enumerate(segments):
        device_of_stage.append(classes[c][used[c]])  # a class's devices in list order
        used[c] += 1
        for v in order[i:j]:
            stage_of[v] = k
    stage_of = {v: stage_of[v] for v in g.nodes}
    stages = evaluate(problem, stage_of, device_of_stage)
    return Plan(
        stage_of=stage_of,
        device_of_stage=device_of_stage,
        stages=stages,
        bottleneck_ns=bottleneck_ns(stages),
        lower_bound_ns=0,
        solver_status="FEASIBLE",
        solve_seconds=time.perf_counter() - t0,
        stats={"dp_states": float(len(states)), "dp_bottleneck_ns": float(best_ns), "dp_exact": float(exact)},
    )
