"""The exact placement over the ideals of the colour-class graph, where it has few (NOTE [placement ideal DP]).

`hetpart placement` runs this first: when it proves its plan optimal (or within the gap asked
for), CP-SAT does not run; otherwise its plan is CP-SAT's hint and its bound a cut of the model.
The cost model is NOTE [placement load] (problem.py), in the solver's integer units (`scaled_costs`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import networkx as nx
import numpy as np

from hetpart.partitioner.ideals import _bits, enumerate_downsets, proper_subsets
from hetpart.partitioner.problem import Certificate
from hetpart.placement.problem import Placement, PlacementProblem, class_graph, placement_loads, placement_violations
from hetpart.placement.units import scaled_costs, scaled_loads, time_scale

IDEAL_MAX = 6_000  # ideals the DP runs over at most: it keeps two dense matrices over their pairs
# The share of `hetpart placement`'s time limit the DP may take (CP-SAT gets the rest): it gives up
# at once where the ideals are too many, and where it runs, CP-SAT seldom does better.
IDEAL_SHARE = 0.8
_INF = np.int64(1) << np.int64(60)
_ROW_BLOCK = 512  # rows of the pair matrices built at a time

# NOTE [placement ideal DP]
# (The authors' DP over ideals, NeurIPS'20 section 4, in our cost model.) Every placement of
# NOTE [placement load] is a chain of ideals {} = I_0 < I_1 < ... < I_D = V of the colour-class
# graph (`class_graph`: an edge for every edge into a forward node), device d taking the classes
# of I_d minus I_d-1: the devices in order, each a prefix union. So a DP over states (accelerators
# used, CPUs used) and ideals, best[a, c][J] = min over I < J of max(best[a-1, c][I], fpga(I, J))
# or max(best[a, c-1][I], cpu(I, J)), is exact over every placement. cpu(I, J) is a difference of
# prefix sums; fpga(I, J) also pays the transfers of NOTE [placement load], which depend on both
# ideals. For a sender u of class c and successor classes C (u's own excluded), with x = [.. in J]
# and y = [.. in I] (y <= x as I < J), u pays on the device of J \ I when
#   |C| = 1, C = {d}: c xor d is on it: x_c + x_d - y_c - y_d - 2 (x_c x_d + y_c y_d) + 2 (x_c y_d + y_c x_d);
#   |C| > 1: 1 - (1 - a) [no class of C on it] - a [all of C on it], a = x_c - y_c, where
#     [no class of C on it] = sum_t [|C & J| = t] [|C & I| = t] and [all of C on it] = [C <= J] [C & I = {}].
# Each is a sum of products f(I) g(J), so the transfers of every pair are one matrix product,
# exact in floats (integers far below 2^53). Memory: sizes are integers in the inputs (exact in
# int64; otherwise compared in floats with a relative slack of 1e-12, a relaxation).
# A floating class (no edge of the class graph: a backward node without a forward colour class,
# such as the AccumulateGrad nodes of bert_l-3 training, 14 of its 142 classes) may go on any
# device and doubles the ideals (bert_l-3 training: 1,428 ideals without them, over 30,000 with).
# When the class graph has too many ideals, two DPs run over those without the floating classes:
# - The plan: the restriction where each floating group (floating classes joined by edges) goes
#   with the ordered class it exchanges the most transfer cost with; then each group, and then
#   each of its classes, moves to the device that lowers the loads most (bert_l-3 training:
#   65.303149 joined, 65.303093 moved; the order DP's placement instead, when better). The
#   authors' DP ties them by mirrored edges (`createArtificialForwardNodes` in their dp.cpp), also
#   a restriction, which is why their bert_l-3 training optimum (65.303149) is above ours (65.303093).
# - The relaxation (the bound): a device's load depends only on which nodes are on it, so it is
#   at least the least, over the floating classes H it might host, of its load with J \ I + H on
#   it and every other floating node elsewhere. Taking that least for each device on its own (a
#   floating class may be hosted twice, or by none) is a relaxation; to take it per group (the
#   subsets of at most _HOSTING_CLASSES classes, larger groups split), each sender counts only
#   the successors that are ordered or in one group (its own, else the first it sends to): with
#   fewer successors it pays no more. Removing the floating classes instead is a relaxation too,
#   but a loose one: on bert_l-3 training it bounds 43.6 against 65.3, the hosting one 65.303052.
#   Pairs at or above the plan's load are dropped, so the bound is min(the DP's value, the plan's).
# Past the deadline or over IDEAL_MAX ideals the DP proves nothing (bound 0) and says why.


@dataclass
class IdealPlacement:
    """What the ideal DP found: a placement (None when none) and a proven bound, in solver units."""

    devices: list[tuple[str, list[int]]] | None  # in pipeline order, as `Placement.devices`
    load_units: int | None  # the placement's max load in `scaled_costs` units
    bound_units: int  # no placement has a smaller max load in `scaled_costs` units; 0 when nothing is proven
    exact: bool  # bound_units is the optimum: the DP ran over every placement and finished
    ideals: int  # ideals the DP ran over (0 when it did not run)
    note: str  # what it proved, or why it proved nothing
    seconds: float
    plan_engine: str = "ideal-dp"  # "order-dp" when the known placement was kept

    def settled(self, gap: float) -> bool:
        """The placement is certified within `gap` (relative to it) by the bound."""
        return self.load_units is not None and self.load_units - self.bound_units <= gap * self.load_units


_ON, _OFF = -1, -2  # a node's status for one device: on it whatever the ideals, or elsewhere
_HOSTING_CLASSES = 4  # classes of a floating group tried together (2^4 subsets); larger groups are split


def placement_ideal_dp(problem: PlacementProblem, *, deadline: float | None = None, limit: int = IDEAL_MAX,
                       known: list[tuple[str, list[int]]] | None = None) -> IdealPlacement:
    """NOTE [placement ideal DP]: the least max load over every placement, with its placement,
    when the class graph has at most `limit` ideals; otherwise over the ideals without its
    floating classes, a placement and a sound bound; no bound (0) over `limit` or past `deadline`.
    `known`: a placement (the order DP's); stages above its max load are dropped, and it is the
    plan when the DP finds none better."""
    got = _search(problem, deadline, limit, known)
    if got.devices is not None and placement_violations(problem, got.devices):
        # Sizes compared in floats (not integers) may let a placement over memory by 1e-12 through.
        return dataclasses.replace(got, devices=None, load_units=None, exact=False,
                                   note=got.note + "; its placement breaks a rule, dropped")
    return got


def _search(problem: PlacementProblem, deadline: float | None, limit: int,
            known: list[tuple[str, list[int]]] | None) -> IdealPlacement:
    t0 = time.perf_counter()
    classes = problem.classes()
    g = class_graph(problem)
    units = scaled_costs(problem)
    fpga, cpu, _, cost = units
    upper_units = None if known is None else max(scaled_loads(problem, known, fpga, cpu, cost))

    def give_up(note: str, ideals: int = 0) -> IdealPlacement:
        return IdealPlacement(None, None, 0, False, ideals, note, time.perf_counter() - t0)

    # --- Ideals: of the class graph, or else of it without its floating classes.
    core = list(nx.lexicographical_topological_sort(g, key=lambda c: min(classes[c])))
    ideals = _ideals(g, core, limit, deadline)
    exact = ideals is not None
    floating = [] if exact else [c for c in core if g.degree(c) == 0]
    if floating and len(floating) < len(core):
        core = [c for c in core if g.degree(c) > 0]
        ideals = _ideals(g, core, limit, deadline)
    if ideals is None:
        if deadline is not None and time.perf_counter() > deadline:
            return give_up("deadline during the enumeration of ideals: nothing proven")
        return give_up(f"more than {limit} ideals of the class graph: nothing proven")
    member = _bits(ideals, len(core))
    subset = proper_subsets(member)
    index = {c: k for k, c in enumerate(core)}
    keep = int(_INF) if upper_units is None else upper_units + 1  # stages up to upper_units
    every_succ: dict[int, list[int]] = {i: [] for i in problem.nodes}
    for u, v in problem.edges:
        every_succ[u].append(v)

    # --- Exact: one DP over every placement.
    if exact:
        status = {i: index[c] for c in core for i in classes[c]}
        got = _dp(problem, member, subset, [classes[c] for c in core], status, every_succ, units, deadline, keep)
        if got is None:
            return give_up(f"deadline during the DP over {len(ideals)} ideals: nothing proven", len(ideals))
        value, devices = got
        if devices is None:  # none up to upper_units, which a placement has: infeasible, or a bug
            return give_up(f"no placement found over {len(ideals)} ideals: nothing proven", len(ideals))
        return IdealPlacement(devices, value, value, True, len(ideals),
                              f"optimal: DP over all {len(ideals)} ideals of the class graph",
                              time.perf_counter() - t0)

    # --- Floating classes. Senders that touch none count the same in both DPs below: their
    # transfers are computed once. Each other sender counts in one term of the relaxation: its own
    # group's, else the first group it sends to; the successors it counts there are the ordered
    # ones and those of that group (fewer successors: it pays no more, NOTE [placement ideal DP]).
    groups = _floating_groups(problem, classes, set(floating))
    status = {i: index[c] for c in core for i in classes[c]}
    hosting = [gr[lo:lo + _HOSTING_CLASSES] for gr in groups for lo in range(0, len(gr), _HOSTING_CLASSES)]
    group_of = {i: k for k, gr in enumerate(hosting) for c in gr for i in classes[c]}
    base: dict[int, list[int]] = {}
    per_group: list[dict[int, list[int]]] = [{} for _ in hosting]
    for u, vs in every_succ.items():
        k = group_of.get(u, next((group_of[v] for v in vs if v in group_of), None))
        counted = [v for v in vs if v in status or group_of.get(v, -1) == k]
        (base if k is None else per_group[k])[u] = counted
    shared = _terms(member, status, base, units[3]).full(deadline)
    if shared is None:
        return IdealPlacement(known, upper_units, 0, False, len(ideals),
                              f"deadline during the DP over {len(ideals)} ideals: nothing proven",
                              time.perf_counter() - t0, "order-dp")

    # --- The plan: the restriction (each group joined to the ordered class it exchanges the most
    # transfer cost with), then each group moved.
    nodes = [list(classes[c]) for c in core]
    for gr, target in zip(groups, _join_targets(problem, classes, groups, core)):
        nodes[index[target]].extend(i for c in gr for i in classes[c])
    joined = {i: k for k, ids in enumerate(nodes) for i in ids}
    touching = {u: vs for u, vs in every_succ.items() if u not in base}
    got = _dp(problem, member, subset, nodes, joined, touching, units, deadline, keep, shared=shared)
    if got is None:
        return IdealPlacement(known, upper_units, 0, False, len(ideals),
                              f"deadline during the DP over {len(ideals)} ideals: nothing proven",
                              time.perf_counter() - t0, "order-dp")
    value, devices = got
    if devices is not None:
        # Whole groups first, then their classes one by one.
        moving = [sorted(i for c in gr for i in classes[c]) for gr in groups]
        moving += [sorted(classes[c]) for gr in groups if len(gr) > 1 for c in gr]
        devices, value = _move_floating(problem, devices, moving, units)
    engine = "ideal-dp"
    if devices is None or (upper_units is not None and upper_units <= value):
        devices, value, engine = known, upper_units, "order-dp"

    # --- The bound: the relaxation (each device hosts the floating classes that suit it best).
    upper = int(_INF) if value is None else value
    got = _dp(problem, member, subset, [classes[c] for c in core], status, {}, units, deadline, upper,
              [(gr, per_group[k], classes) for k, gr in enumerate(hosting)], shared=shared)
    if got is None:
        return IdealPlacement(devices, value, 0, False, len(ideals),
                              f"deadline during the relaxed DP over {len(ideals)} ideals: no bound",
                              time.perf_counter() - t0, engine)
    bound = min(got[0], upper)
    note = (f"bound: DP over {len(ideals)} ideals, each device hosting the {len(floating)} floating classes "
            "that suit it (NOTE [placement ideal DP])")
    return IdealPlacement(devices, value, 0 if bound >= _INF else int(bound), False, len(ideals), note,
                          time.perf_counter() - t0, engine)


def _ideals(g: nx.DiGraph, core: list, limit: int, deadline: float | None) -> list[int] | None:
    """The ideals of g restricted to `core` (bit k: class core[k]), sorted by size; None over `limit`."""
    index = {c: k for k, c in enumerate(core)}
    inputs = [[index[p] for p in g.predecessors(c) if p in index] for c in core]
    return enumerate_downsets(inputs, limit, deadline)


def _floating_groups(problem: PlacementProblem, classes: dict, floating: set) -> list[list]:
    """The floating classes joined by edges, each group's classes by first node id."""
    cls = {i: n.color for i, n in problem.nodes.items()}
    links = nx.Graph()
    links.add_nodes_from(floating)
    links.add_edges_from((cls[u], cls[v]) for u, v in problem.edges
                         if cls[u] in floating and cls[v] in floating and cls[u] != cls[v])
    groups = []  # each in breadth-first order from its first class, so that pieces of it are joined
    for comp in nx.connected_components(links):
        first = min(comp, key=lambda c: min(classes[c]))
        groups.append([first, *(v for _, v in nx.bfs_edges(links, first, sort_neighbors=lambda vs: sorted(
            vs, key=lambda c: min(classes[c]))))])
    return sorted(groups, key=lambda gr: min(classes[gr[0]]))


def _join_targets(problem: PlacementProblem, classes: dict, groups: list[list], core: list) -> list:
    """Per floating group, the ordered class it exchanges the most transfer cost with (the first if none)."""
    cls = {i: n.color for i, n in problem.nodes.items()}
    group_of = {c: k for k, gr in enumerate(groups) for c in gr}
    rank = {c: k for k, c in enumerate(core)}
    near: list[dict] = [{} for _ in groups]
    for u, v in problem.edges:
        a, b = cls[u], cls[v]
        if (a in group_of) != (b in group_of):
            k, other = (group_of[a], b) if a in group_of else (group_of[b], a)
            near[k][other] = near[k].get(other, 0.0) + problem.cost[u]
    return [max(n, key=lambda c: (n[c], -rank[c])) if n else core[0] for n in near]


@dataclass
class _Terms:
    """Transfer costs over pairs of ideals: comm[I, J] = const + vec_i[I] + vec_j[J] + lhs[I] . rhs[J]."""

    const: float
    vec_i: np.ndarray
    vec_j: np.ndarray
    lhs: np.ndarray
    rhs: np.ndarray

    def dense(self, rows: slice) -> np.ndarray:
        return np.rint(self.lhs[rows] @ self.rhs.T + self.vec_i[rows, None] + self.vec_j[None, :]
                       + self.const).astype(np.int64)

    def full(self, deadline: float | None) -> np.ndarray | None:
        """Every pair's, int64 [I, J]; None past the deadline."""
        m = len(self.vec_i)
        out = np.empty((m, m), dtype=np.int64)
        for lo in range(0, m, _ROW_BLOCK):
            if deadline is not None and time.perf_counter() > deadline:
                return None
            out[lo:lo + _ROW_BLOCK] = self.dense(slice(lo, lo + _ROW_BLOCK))
        return out

    def at(self, ri: np.ndarray, ci: np.ndarray) -> np.ndarray:
        dot = np.einsum("ij,ij->i", self.lhs[ri], self.rhs[ci]) if self.lhs.shape[1] else 0.0
        return np.rint(dot + self.vec_i[ri] + self.vec_j[ci] + self.const).astype(np.int64)


def _terms(member: np.ndarray, status: dict[int, int], senders: dict[int, list[int]], cost: dict[int, int]) -> _Terms:
    """NOTE [placement ideal DP]: what the device of J \\ I pays for the outputs of `senders` (each
    with the successors it counts), a node's status its class index, _ON or _OFF."""
    m, nc = member.shape
    x = member.astype(np.float64)
    kinds: dict[tuple, int] = {}
    for u, vs in senders.items():
        su = status.get(u)
        if su is None or cost[u] <= 0:
            continue
        st = [status[v] for v in vs if v in status]
        cs = frozenset(s for s in st if s >= 0 and s != su)
        key = (su, cs, _ON in st and su != _ON, _OFF in st and su != _OFF)
        kinds[key] = kinds.get(key, 0) + cost[u]
    const, vec_i, vec_j = 0.0, np.zeros(m), np.zeros(m)
    cross = np.zeros((nc, nc))  # cross[c, d]: weight of x_c(J) y_d(I)
    left, right = [], []
    for (su, cs, any_on, any_off), w in kinds.items():
        w = float(w)
        if su >= 0 and len(cs) == 1 and not any_on and not any_off:
            (d,) = cs  # u's class xor d's on the device
            vec_j += w * (x[:, su] + x[:, d] - 2 * x[:, su] * x[:, d])
            vec_i -= w * (x[:, su] + x[:, d] + 2 * x[:, su] * x[:, d])
            cross[su, d] += 2 * w
            cross[d, su] += 2 * w
            continue
        cols = sorted(cs)
        count = x[:, cols].sum(axis=1)
        every, none = (count == len(cols)).astype(np.float64), (count == 0).astype(np.float64)
        at = [(count == t).astype(np.float64) for t in range(len(cols) + 1)]
        # Given u on the device, it pays when a successor is not: q1 - p1 [all of C on it];
        # given u elsewhere, when one is: q0 - p0 [no class of C on it].
        q1, p1 = float(any_off or bool(cs)), float(not any_off and bool(cs))
        q0, p0 = float(any_on or bool(cs)), float(not any_on and bool(cs))
        if su == _ON:
            const += w * q1
            left.append(-w * p1 * none), right.append(every)
            continue
        const += w * q0
        for t in at:  # - p0 [no class of C on it]
            left.append(-w * p0 * t), right.append(t)
        if su == _OFF:
            continue
        xc = x[:, su]  # u's class: a = x_c(J) - y_c(I), times (q1 - q0) - p1 [all of C] + p0 [none of C]
        vec_j += w * (q1 - q0) * xc
        vec_i -= w * (q1 - q0) * xc
        left += [-w * p1 * none, w * p1 * xc * none]
        right += [xc * every, every]
        for t in at:
            left += [w * p0 * t, -w * p0 * xc * t]
            right += [xc * t, t]
    used = np.flatnonzero(cross.any(axis=1))  # classes c with a term x_c(J) y_d(I)
    lhs = np.hstack([x @ cross[used].T, np.array(left).T if left else np.zeros((m, 0))])
    rhs = np.hstack([x[:, used], np.array(right).T if right else np.zeros((m, 0))])
    return _Terms(const, vec_i, vec_j, lhs, rhs)


def _pair_loads(problem: PlacementProblem, member: np.ndarray, subset: np.ndarray, nodes: list[list[int]],
                status: dict[int, int], senders: dict[int, list[int]], units, deadline: float | None,
                upper: int = int(_INF), hosting: list = (),
                shared: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """[I, J] int64 loads of the device running J \\ I, an accelerator's and a CPU's; _INF where
    it may not (I not below J; an accelerator: a node it cannot run, or over memory) or at
    `upper` and above. `hosting`: the relaxation's floating groups, each device hosting the
    subset of each that costs it least (NOTE [placement ideal DP]). `shared`: more transfers, [I, J]."""
    fpga, cpu, size, cost = units
    m, _ = member.shape
    as_int = member.astype(np.int64)
    exact_mem = all(float(s).is_integer() for s in size.values()) and sum(size.values()) < 2**62
    cap = int(problem.max_size_bytes // 1) if exact_mem else problem.max_size_bytes * (1 + 1e-12)

    def mem_of(ids) -> int | float:  # sizes exact in int64, else in floats (a relaxation by 1e-12)
        return sum(int(size[i]) for i in ids) if exact_mem else sum(size[i] for i in ids)

    c_fpga = np.array([sum(fpga[i] for i in ids) for ids in nodes], dtype=np.int64)
    c_cpu = np.array([sum(cpu[i] for i in ids) for ids in nodes], dtype=np.int64)
    c_bad = np.array([sum(not problem.nodes[i].on_fpga for i in ids) for ids in nodes], dtype=np.int64)
    c_mem = np.array([mem_of(ids) for ids in nodes], dtype=np.int64 if exact_mem else np.float64)
    comp_f, comp_c, bad, mem = as_int @ c_fpga, as_int @ c_cpu, as_int @ c_bad, member.astype(c_mem.dtype) @ c_mem
    terms = _terms(member, status, senders, cost)
    # Per floating group, per subset H of its classes hosted: (its terms, latency, memory, fits).
    hosted = []
    for classes_of_group, group_senders, classes in hosting:
        options = []
        for mask in range(2 ** len(classes_of_group)):
            on = [i for k, c in enumerate(classes_of_group) if mask >> k & 1 for i in classes[c]]
            off = [i for k, c in enumerate(classes_of_group) if not mask >> k & 1 for i in classes[c]]
            st = {**status, **{i: _ON for i in on}, **{i: _OFF for i in off}}
            fits = all(problem.nodes[i].on_fpga for i in on)
            options.append((_terms(member, st, group_senders, cost), sum(fpga[i] for i in on), mem_of(on), fits))
        # The ordered classes its terms read: when J \ I holds none, hosting nothing costs nothing.
        near = sorted({status[i] for u, vs in group_senders.items() for i in (u, *vs) if status.get(i, -1) >= 0})
        hosted.append((options, member[:, near].sum(axis=1)))

    seg_f = np.empty((m, m), dtype=np.int64)
    seg_c = np.empty((m, m), dtype=np.int64)
    for lo in range(0, m, _ROW_BLOCK):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        rows = slice(lo, lo + _ROW_BLOCK)
        below = subset[rows]
        room = cap - (mem[None, :] - mem[rows, None])
        ok = below & (bad[None, :] == bad[rows, None]) & (room >= 0)
        comm = terms.dense(rows) if shared is None else terms.dense(rows) + shared[rows]
        load = np.where(ok, comp_f[None, :] - comp_f[rows, None] + comm, _INF)
        load[load >= upper] = _INF
        if hosted:
            ri, ci = np.nonzero(load < _INF)
            extra = np.zeros(len(ri), dtype=np.int64)
            for options, near in hosted:
                touch = np.flatnonzero(near[ci] > near[ri + lo])
                a, b = ri[touch], ci[touch]
                least = np.full(len(touch), _INF)
                for group_terms, lat, need, fits in options:
                    if fits:
                        cost_h = group_terms.at(a + lo, b) + lat
                        least = np.minimum(least, np.where(room[a, b] >= need, cost_h, _INF))
                extra[touch] += least
            load[ri, ci] = np.where(load[ri, ci] + extra >= upper, _INF, load[ri, ci] + extra)
        seg_f[rows] = load
        cpu_load = np.where(below, comp_c[None, :] - comp_c[rows, None], _INF)
        cpu_load[cpu_load >= upper] = _INF
        seg_c[rows] = cpu_load
    return seg_f, seg_c


def _dp(problem: PlacementProblem, member: np.ndarray, subset: np.ndarray, nodes: list[list[int]],
        status: dict[int, int], senders: dict[int, list[int]], units, deadline: float | None,
        upper: int = int(_INF), hosting: list = (),
        shared: np.ndarray | None = None) -> tuple[int, list[tuple[str, list[int]]] | None] | None:
    """NOTE [placement ideal DP]'s DP over the pair loads of `_pair_loads`: (least max load, its
    devices), or (_INF, None) when no placement is below `upper`; None past the deadline."""
    segs = _pair_loads(problem, member, subset, nodes, status, senders, units, deadline, upper, hosting, shared)
    if segs is None:
        return None
    seg = dict(zip(("fpga", "cpu"), segs))
    m = len(member)
    full = m - 1  # ideals are sorted by size: the last is every class
    steps = {"fpga": (1, 0), "cpu": (0, 1)}
    best = {(0, 0): np.where(np.arange(m) == 0, 0, _INF)}
    for a in range(problem.max_fpgas + 1):
        for c in range(problem.max_cpus + 1):
            if (a, c) == (0, 0):
                continue
            if deadline is not None and time.perf_counter() > deadline:
                return None
            got = np.full(m, _INF)
            for kind, (da, dc) in steps.items():
                prev = best.get((a - da, c - dc))
                if prev is None:
                    continue
                alive = np.flatnonzero(prev < _INF)
                for lo in range(0, m, _ROW_BLOCK):  # blocks of columns J
                    cols = slice(lo, lo + _ROW_BLOCK)
                    if len(alive):
                        val = np.maximum(prev[alive, None], seg[kind][alive, cols]).min(axis=0)
                        got[cols] = np.minimum(got[cols], val)
            best[(a, c)] = got
    state = min(best, key=lambda s: (best[s][full], s))
    value = int(best[state][full])
    if value >= _INF:
        return int(_INF), None
    # Read back: a device before J whose stage into J makes best[state][J].
    runs, j = [], full
    while state != (0, 0):
        for kind, (da, dc) in steps.items():
            prev = best.get((state[0] - da, state[1] - dc))
            if prev is not None:
                at = np.flatnonzero(np.maximum(prev, seg[kind][:, j]) == best[state][j])
                if len(at):
                    break
        i = int(at[0])
        ids = sorted(n for k in np.flatnonzero(member[j] & ~member[i]) for n in nodes[k])
        runs.append((kind, ids))
        state, j = (state[0] - da, state[1] - dc), i
    return value, runs[::-1]


def _move_floating(problem: PlacementProblem, devices: list[tuple[str, list[int]]], groups: list[list[int]],
                   units) -> tuple[list[tuple[str, list[int]]], int]:
    """Each floating group to the device (or a new one) that lowers the loads most, until none moves;
    (None, None) when no device takes some group."""
    fpga, cpu, size, cost = units
    ids = sorted(problem.nodes)
    pos = {i: k for k, i in enumerate(ids)}
    eu = np.array([pos[u] for u, _ in problem.edges], dtype=np.int64)
    ev = np.array([pos[v] for _, v in problem.edges], dtype=np.int64)
    e_cost = np.array([cost[u] for u, _ in problem.edges], dtype=np.int64)
    lat = {"fpga": np.array([fpga[i] for i in ids], dtype=np.int64),
           "cpu": np.array([cpu[i] for i in ids], dtype=np.int64)}
    mem = np.array([size[i] for i in ids])
    on_fpga = np.array([problem.nodes[i].on_fpga for i in ids])
    kinds = [k for k, _ in devices]
    where = np.empty(len(ids), dtype=np.int64)
    for d, (_, members) in enumerate(devices):
        where[[pos[i] for i in members]] = d
    for kind in ("fpga", "cpu"):  # empty devices a group may move to
        if kinds.count(kind) < (problem.max_fpgas if kind == "fpga" else problem.max_cpus):
            kinds.append(kind)

    def loads(at: np.ndarray) -> list[int] | None:
        out = []
        for d, kind in enumerate(kinds):
            on = at == d
            if kind == "cpu" or not on.any():
                out.append(int(lat[kind][on].sum()))
                continue
            if not on_fpga[on].all() or mem[on].sum() > problem.max_size_bytes:
                return None
            cut = on[eu] != on[ev]
            out.append(int(lat[kind][on].sum()) + _sender_cost(eu[cut], e_cost[cut]))
        return out

    def key(at: np.ndarray) -> list[float]:  # loads, largest first; [inf] when a device breaks a rule
        got = loads(at)
        return [math.inf] if got is None else sorted(got, reverse=True)

    current = key(where)
    for _ in range(4):
        moved = False
        for group in groups:
            rows = [pos[i] for i in group]
            for d in range(len(kinds)):
                if (where[rows] == d).all():
                    continue
                trial = where.copy()
                trial[rows] = d
                got = key(trial)
                if got < current:
                    where, current, moved = trial, got, True
        if not moved:
            break
    if current[0] == math.inf:
        return None, None
    out = [(kinds[d], sorted(ids[k] for k in np.flatnonzero(where == d))) for d in range(len(kinds))]
    return [d for d in out if d[1]], current[0]


def _sender_cost(senders: np.ndarray, costs: np.ndarray) -> int:
    """Each distinct sender's cost once."""
    _, first = np.unique(senders, return_index=True)
    return int(costs[first].sum())


def ideal_placement(problem: PlacementProblem, ideal: IdealPlacement, t0: float) -> Placement:
    """The ideal DP's placement as `solve_placement`'s answer (CP-SAT did not run)."""
    violations = placement_violations(problem, ideal.devices)
    if violations:
        raise RuntimeError("hetpart bug: the ideal DP's placement breaks its problem:\n  " + "\n  ".join(violations))
    loads = placement_loads(problem, ideal.devices)
    optimal = ideal.exact or ideal.load_units <= ideal.bound_units
    return Placement(devices=ideal.devices, loads=loads, max_load=max(loads),
                     lower_bound=min(ideal.bound_units / time_scale(problem), max(loads)),
                     status="OPTIMAL" if optimal else "FEASIBLE", seconds=time.perf_counter() - t0,
                     stats={"ideal_seconds": ideal.seconds, "ideals": float(ideal.ideals)},
                     plan_engine=ideal.plan_engine, bound_engine="ideal-dp",
                     certificate=Certificate("ideal_dp", ideal.note))
