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
needs is a vector over cut positions or a matrix over segments [i, j) between
two allowed cut positions. See NOTE [candidate cuts] for how the DP stays fast
on graphs of tens of thousands of nodes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from hetpart.partitioner.coarsen import cut_candidates
from hetpart.partitioner.costs import (
    DeviceClass, SequenceState, device_classes, first_states, has_typed_memory, link_between, link_kind_ns,
    max_stage_memory_bytes, next_state, node_mem_bytes, node_times_ns, order_cut_bytes, segment_time_table_ns,
    sequence_devices, slot_capacity_bytes, stage_time_ns, stash_microbatches, transfer_ns,
)
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import FORBIDDEN_TYPES, LAYER, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, WEIGHTS, Plan
from hetpart.partitioner.problem import Problem

_INF = np.int64(1) << np.int64(60)
_DP_BUDGET = 300_000_000  # matrix entries the DP may touch (about a second) before it coarsens its classes
EXACT_CUTS = 600  # up to this many nodes the DP tries every cut position (exact over contiguous plans)
COARSE_CUTS = 200  # above it, the first pass tries this many candidate positions (NOTE [candidate cuts])
PRE_CUTS_ABOVE = 150  # exact DPs over more cut positions first plan on COARSE_CUTS // 2 of them, to prune
_REFINE_BUDGET = 3_000_000  # matrix entries of one refinement pass: windows of +-sqrt(budget / S) / 2 positions

# NOTE [candidate cuts]
# The DP's cost is (number of allowed cut positions)^2 per state, so on a graph of
# n nodes it cannot try every position once n is more than a few hundred (the figures:
# docs/benchmarks.md, "Measurements moved out of NOTEs"). Above EXACT_CUTS nodes it runs in two passes:
# 1. Coarse: only COARSE_CUTS candidate positions (`coarsen.cut_candidates`: one per
#    equal-work chunk of the order, the one with the fewest bytes crossing, module
#    boundaries on ties); the DP chooses the stage count, the device sequence and
#    which candidates to cut at.
# 2. Refine: with that device sequence fixed, cut k may move to any position within
#    a radius of where pass 1 put it (300 positions for 8 stages, 10 to 20 times the
#    spacing of the candidates); a DP over the S windows (S x window^2 entries,
#    `_REFINE_BUDGET`) finds the best positions. Repeated while it improves (4 times at most);
#    each pass contains the previous answer, so the plan never gets worse.
# 3. Pass 1 once more on twice the candidates plus the refined cuts, keeping only partial
#    plans below the bottleneck found so far (that prunes most states and positions),
#    refined again; the better plan is kept (it may use another device sequence).
# Both passes are exact over their sets of positions, so the plan is valid and its
# cost is the cost model's (`evaluate` recomputes it anyway). Memory is linear in n
# plus the matrices over candidates (COARSE_CUTS^2 entries). Co-location groups: a cut
# never falls strictly inside a group's span of the order (`OrderTables.cuttable`);
# forbidden device types: a segment is allowed on a type only if none of its nodes
# forbids it (prefix counts). Training memory (NOTE [training memory] in costs.py):
# the first pass does not know a stage's index or the stage count, so it counts the
# largest stash any stage may hold (`max_stage_memory_bytes`: valid, maybe pessimistic);
# refinement knows both and counts each stage's own stash.


@dataclass
class OrderTables:
    """Everything the DP needs about one topological order, as vectors over positions 0..n."""

    order: list[str]
    comp: dict[str, np.ndarray]  # device type -> prefix sums of node times
    act_prefix: np.ndarray  # prefix sums of mem_bytes (activations of one microbatch)
    weight_prefix: np.ndarray  # prefix sums of the held bytes of weights read at one position only
    shared_readers: list[tuple[np.ndarray, int]]  # (sorted reader positions, held bytes) of weights read at 2+
    stash_max: int  # NOTE [training memory]: microbatches of activations a stage may hold, at most
    forbidden: dict[str, np.ndarray]  # device type -> prefix count of nodes that cannot run on it
    cut_bytes: np.ndarray  # bytes over each cut position 0..n (NOTE [stage time])
    cut_tensors: np.ndarray  # tensors over each cut position, each paying the link's latency
    cuttable: np.ndarray  # bool over positions: a cut there splits no co-location group
    layer_start: np.ndarray  # bool over positions: order[j] starts a new LAYER (a module boundary)
    first_end_min: int  # stage 0 ends at or after this position (after the last PIN_FIRST node)
    inner_end_max: int  # a stage other than the last ends at or before this position (first PIN_LAST node)
    final_start_max: int  # the last stage starts at or before this position (its last unpinned node)
    # slot type -> its (act_prefix, weight_prefix, shared_readers) where it has memory of its own
    typed_memory: dict[str, tuple] = dataclasses.field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.order)

    def seg_mem(self, starts: np.ndarray, ends: np.ndarray, stash: int | None = None,
                slot_type: str | None = None) -> np.ndarray:
        """Memory of segments [starts[a], ends[b]) on a `slot_type` slot (NOTE [memory per slot type]), a matrix:
        `stash` microbatches of activations (default `stash_max`) + each weight read, once (NOTE [training memory])."""
        mult = self.stash_max if stash is None else stash
        act_prefix, weight_prefix, shared_readers = self.typed_memory.get(
            slot_type, (self.act_prefix, self.weight_prefix, self.shared_readers))
        out = (mult * (act_prefix[ends][None, :] - act_prefix[starts][:, None])
               + weight_prefix[ends][None, :] - weight_prefix[starts][:, None])
        if shared_readers:
            diff = np.zeros((len(starts), len(ends) + 1), dtype=np.int64)
            rows = np.arange(len(starts))
            for readers, nbytes in shared_readers:
                k = np.searchsorted(readers, starts)  # first reader at or after each start
                has = k < len(readers)
                first = readers[np.minimum(k, len(readers) - 1)]
                col = np.searchsorted(ends, first, side="right")  # first end that includes it
                np.add.at(diff, (rows[has], col[has]), nbytes)
            out = out + np.cumsum(diff, axis=1)[:, : len(ends)]
        return out

    def allowed(self, device_type: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """[a, b]: segment [starts[a], ends[b]) is non-empty and every node in it can run on `device_type`."""
        f = self.forbidden[device_type]
        return (ends[None, :] > starts[:, None]) & (f[ends][None, :] == f[starts][:, None])


def order_tables(problem: Problem, order: list[str] | None = None) -> OrderTables:
    g = problem.graph
    order = problem.node_order() if order is None else order
    n = len(order)
    attrs = [g.nodes[v] for v in order]
    comp = {t: np.concatenate([[0], np.cumsum(node_times_ns(problem, order, t))]).astype(np.int64)
            for t in problem.device_types}
    stash_max, _ = max_stage_memory_bytes(problem)
    act_prefix, weight_prefix, shared = _memory_tables(problem, order)
    typed = {t: _memory_tables(problem, order, t) for t in problem.device_types} if has_typed_memory(problem) else {}
    forbidden = {t: np.concatenate([[0], np.cumsum([t in a.get(FORBIDDEN_TYPES, ()) for a in attrs])]).astype(np.int64)
                 for t in problem.device_types}
    # A cut at j separates positions < j from >= j: not allowed strictly inside a group's span.
    cuttable = np.ones(n + 1, dtype=bool)
    pos = {v: i for i, v in enumerate(order)}
    for members in problem.colocation_groups().values():
        ps = [pos[v] for v in members]
        cuttable[min(ps) + 1: max(ps) + 1] = False
    layers = [a.get(LAYER) for a in attrs]
    layer_start = np.array([True] + [layers[j] != layers[j - 1] for j in range(1, n)] + [True])
    first_pins = [i for i, a in enumerate(attrs) if a.get(PIN) == PIN_FIRST]
    last_pins = [i for i, a in enumerate(attrs) if a.get(PIN) == PIN_LAST]
    free = [i for i, a in enumerate(attrs) if a.get(PIN) != PIN_LAST]
    return OrderTables(
        order=order, comp=comp, act_prefix=act_prefix, weight_prefix=weight_prefix, shared_readers=shared,
        stash_max=stash_max, forbidden=forbidden, cut_bytes=order_cut_bytes(problem, order),
        cut_tensors=order_cut_bytes(problem, order, weight=OUT_TENSORS), cuttable=cuttable, layer_start=layer_start,
        first_end_min=max(first_pins, default=0) + 1, inner_end_max=min(last_pins + [n - 1]),
        final_start_max=free[-1] if free else -1, typed_memory=typed,
    )


def _memory_tables(problem: Problem, order: list[str], slot_type: str | None = None) -> tuple:
    """(activation prefix sums, own-weight prefix sums, shared readers) of `order` on `slot_type` (OrderTables)."""
    _, held = max_stage_memory_bytes(problem, slot_type)
    act = np.array([node_mem_bytes(problem, v, slot_type) for v in order], dtype=np.int64)
    own = np.zeros(len(order), dtype=np.int64)
    readers: dict[str, set[int]] = {}
    for i, v in enumerate(order):
        for w in problem.graph.nodes[v].get(WEIGHTS, ()):
            readers.setdefault(w, set()).add(i)
    shared = []
    for w, rs in sorted(readers.items()):
        if len(rs) == 1:
            own[next(iter(rs))] += held[w]  # read at one position: held exactly when that node is
        else:
            shared.append((np.array(sorted(rs), dtype=np.int64), held[w]))
    return (np.concatenate([[0], np.cumsum(act)]).astype(np.int64),
            np.concatenate([[0], np.cumsum(own)]).astype(np.int64), shared)


def _classes(problem: Problem, m: int, max_stages: int,
             budget: int = _DP_BUDGET) -> tuple[bool, list[DeviceClass]]:
    """Device classes for the DP over `m` cut positions, and whether they are exact.

    Exact classes are `Problem.device_classes()` (type, machine, capacity). When
    their states would cost more than `_DP_BUDGET` matrix entries, devices are
    grouped by (type, capacity), then by type only: the DP then assumes the
    slowest link at every boundary and the smallest capacity of a class, so its
    plan is valid (and re-costed exactly by `evaluate`) but may be worse.
    """
    keys = ["exact", "type_capacity", "type"]
    exact_classes = None
    for level, key in enumerate(keys):
        classes = device_classes(problem, key)
        exact_classes = exact_classes or [c.devices for c in classes]
        count_states = math.prod(min(len(c.devices), max_stages) + 1 for c in classes)
        work = count_states * 2 * len(classes) ** 2 * m**2 // 2
        if work <= budget or level == len(keys) - 1:
            # Exact when merging changed nothing (each type on one machine with one capacity). A
            # merged DP pays the slowest link at every boundary (machine "", NOTE [device sequences]).
            exact = [c.devices for c in classes] == exact_classes
            return exact, classes if exact else [dataclasses.replace(c, machine="") for c in classes]
    raise AssertionError("unreachable")


@dataclass
class Segments:
    """A contiguous plan: stage k is order[cuts[k]:cuts[k+1]] on slot `devices[k]` (NOTE [slots])."""

    cuts: list[int]  # 0 = cuts[0] < ... < cuts[S] = n
    devices: list[str]
    dp_ns: int  # the DP's value of the plan (equal to `evaluate`'s bottleneck when the classes are exact)
    exact: bool
    states: int
    timed_out: bool = False  # the DP stopped at its deadline: the best plan of the stage counts it finished


def _dp_over(problem: Problem, tab: OrderTables, P: np.ndarray, upper_ns: int | None = None,
             deadline: float | None = None, known_ns: int | None = None, budget: int = _DP_BUDGET) -> Segments | None:
    """The best contiguous plan cutting only at positions `P` (sorted, with 0 and n), devices chosen too.

    With `upper_ns`, only a plan whose DP value is below it (None if there is none): partial
    plans already at `upper_ns` are dropped, which prunes most of the work. `known_ns`: the
    `evaluate` bottleneck of a plan already found; when the classes are exact (DP values are
    `evaluate`'s) it prunes like `upper_ns` = known_ns + 1 (ties still found), else it is ignored.
    At `deadline` (a `time.perf_counter()` value) the DP stops and returns the best plan of the
    stage counts it finished (`timed_out`; NOTE [DP deadline]).
    """
    n, m = tab.n, len(P)
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    exact, classes = _classes(problem, m, max_stages, budget)
    cls_type = [c.type for c in classes]
    cls_capacity = [c.capacity_bytes for c in classes]
    comp = {t: c[P] for t, c in tab.comp.items()}
    seg_mem = tab.seg_mem(P, P)
    fits_cache: dict[tuple[int, str], np.ndarray] = {}

    def fits(c: int) -> np.ndarray:
        key = (cls_capacity[c], cls_type[c])
        if key not in fits_cache:
            mem = tab.seg_mem(P, P, slot_type=cls_type[c]) if cls_type[c] in tab.typed_memory else seg_mem
            fits_cache[key] = tab.allowed(cls_type[c], P, P) & (mem <= cls_capacity[c])
        return fits_cache[key]

    # Boundary times per link kind (NOTE [device sequences] in costs.py): the link between two
    # classes depends on their machines only; without machines in the classes (not `exact`) the
    # DP pays the slowest link everywhere.
    cut_bytes, cut_tensors = tab.cut_bytes[P], tab.cut_tensors[P]
    link_ns: dict[tuple[int, int], np.ndarray] = {}

    def boundary_ns(same: int, cur: int) -> np.ndarray:
        """Boundary times next to a stage on `cur`: same is -1 (no previous stage), 0 or 1."""
        if (same, cur) not in link_ns:
            link_ns[(same, cur)] = link_kind_ns(problem, classes[cur], same, cut_bytes, cut_tensors)
        return link_ns[(same, cur)]

    # Pins: stage 0 ends after the last PIN_FIRST node; non-final stages end at or
    # before the first PIN_LAST node; the final stage starts before its last unpinned node.
    final_ok = P <= tab.final_start_max

    # --- DP. A state (counts, same, cur) (NOTE [device sequences] in costs.py) holds G[j]: the
    # least bottleneck of the stages before cut P[j], given that the stage starting at P[j] runs
    # on class `cur` and that the stage before it ran on the same machine (same=1), another one
    # (0) or none (-1). The boundary at P[j] is paid by the stage that ends there and, through
    # `same`, by `cur`.
    states: list[tuple[SequenceState, np.ndarray, np.ndarray, np.ndarray]] = []  # key, G, back_start, back_state
    layer: dict[SequenceState, int] = {}
    for key in first_states(classes):
        G = np.full(m, _INF, dtype=np.int64)
        G[0] = 0
        layer[key] = len(states)
        states.append((key, G, np.full(m, -1), np.full(m, -1)))

    best_ns, best_state, best_start = (_INF if upper_ns is None else np.int64(upper_ns)), -1, -1
    if known_ns is not None and exact:
        best_ns = min(best_ns, np.int64(known_ns + 1))
    timed_out = False
    for depth in range(1, max_stages + 1):
        next_layer: dict[SequenceState, int] = {}
        for key in sorted(layer):
            if deadline is not None and time.perf_counter() > deadline:
                timed_out = True
                break
            sid = layer[key]
            same, cur = key.same, key.cur
            G = states[sid][1]
            if G.min() >= best_ns:
                continue
            tin = boundary_ns(same, cur)
            rows = np.flatnonzero(G < best_ns)  # a partial plan at the best bottleneck cannot improve it
            ctype = cls_type[cur]

            # The stage on `cur` is the last one: segment [P[i], n).
            ok = rows[final_ok[rows] & fits(cur)[rows, m - 1]]
            if len(ok):
                val = np.maximum(G[ok], stage_time_ns(comp[ctype][m - 1] - comp[ctype][ok], tin[ok], 0))
                k = int(np.argmin(val))
                if val[k] < best_ns:
                    best_ns, best_state, best_start = val[k], sid, int(ok[k])

            if depth == max_stages:
                continue
            # Or it ends at cut P[j] and the next stage runs on class `nxt`.
            lo = tab.first_end_min if depth == 1 else 1
            cols = np.flatnonzero((P >= lo) & (P <= tab.inner_end_max))
            if best_ns < _INF:
                # A stage longer than the best bottleneck is useless: its compute alone is too much.
                cols = cols[comp[ctype][cols] < comp[ctype][rows.max()] + best_ns]
            if len(cols) == 0:
                continue
            for nxt in range(len(classes)):
                nkey = next_state(classes, key, nxt)
                if nkey is None:
                    continue
                tout = boundary_ns(nkey.same, nxt)
                cost = segment_time_table_ns((comp[ctype][rows], comp[ctype][cols]), tin[rows], tout[cols])
                val = np.where(fits(cur)[np.ix_(rows, cols)], np.maximum(cost, G[rows][:, None]), _INF)
                arg = np.argmin(val, axis=0)
                got = val[arg, np.arange(len(cols))]
                if nkey not in next_layer:
                    next_layer[nkey] = len(states)
                    states.append((nkey, np.full(m, _INF, dtype=np.int64), np.full(m, -1), np.full(m, -1)))
                _, G2, back_start, back_state = states[next_layer[nkey]]
                better = got < G2[cols]
                G2[cols[better]] = got[better]
                back_start[cols[better]] = rows[arg[better]]
                back_state[cols[better]] = sid
        if timed_out:
            break
        layer = next_layer

    if best_state < 0:
        return None

    # --- Read the plan back: walk the cuts from the last stage to the first.
    segments = []  # (start index, class)
    sid, start = best_state, best_start
    while True:
        key, _, back_start, back_state = states[sid]
        segments.append((start, key.cur))
        if key.same < 0:
            break
        sid, start = int(back_state[start]), int(back_start[start])
    segments.reverse()
    devices = sequence_devices(classes, [c for _, c in segments])  # a class's devices in list order
    cuts = [int(P[i]) for i, _ in segments] + [n]
    return Segments(cuts=cuts, devices=devices, dp_ns=int(best_ns), exact=exact, states=len(states),
                    timed_out=timed_out)


def valid_cuts(tab: OrderTables) -> np.ndarray:
    """bool over positions 0..n: a cut between two stages may go there (groups, pins)."""
    valid = tab.cuttable.copy()
    valid[: tab.first_end_min] = False
    valid[tab.inner_end_max + 1:] = False
    valid[0] = valid[tab.n] = False
    return valid


def fixed_device_dp(problem: Problem, tab: OrderTables, devices: list[str],
                    windows: list[np.ndarray]) -> Segments | None:
    """The best contiguous plan on `devices` in this order whose cut k lies in `windows[k]`.

    `windows[0]` is [0] and `windows[-1]` is [n]; one window per stage boundary in between.
    Exact over its windows (every link, capacity and stash is the real one); None when no
    choice of cuts fits in memory.
    """
    n, S = tab.n, len(devices)
    devs = [problem.slot(d) for d in devices]  # NOTE [slots]
    G = np.zeros(1, dtype=np.int64)
    backs = []
    for k in range(S):
        G, arg = _fixed_step(problem, tab, devs, k, S, windows[k], windows[k + 1], G)
        backs.append(arg)
    if G[0] >= _INF:
        return None
    cuts, j = [n], 0
    for k in range(S - 1, -1, -1):
        j = int(backs[k][j])
        cuts.append(int(windows[k][j]))
    return Segments(cuts=cuts[::-1], devices=list(devices), dp_ns=int(G[0]), exact=True, states=S)


def _fixed_step(problem: Problem, tab: OrderTables, devs: list, k: int, S: int, I: np.ndarray,  # noqa: E741
                J: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stage k of S on slots `devs` from starts `I` to ends `J` after bottlenecks `G`: each end's best, and its start."""
    t = devs[k].type
    tin = (transfer_ns(link_between(problem, devs[k - 1].name, devs[k].name), tab.cut_bytes[I], tab.cut_tensors[I])
           if k > 0 else np.zeros(len(I), dtype=np.int64))
    tout = (transfer_ns(link_between(problem, devs[k].name, devs[k + 1].name), tab.cut_bytes[J], tab.cut_tensors[J])
            if k < S - 1 else np.zeros(len(J), dtype=np.int64))
    cost = segment_time_table_ns((tab.comp[t][I], tab.comp[t][J]), tin, tout)
    mem = tab.seg_mem(I, J, stash_microbatches(problem, k, S), t)
    ok = tab.allowed(t, I, J) & (mem <= slot_capacity_bytes(problem, devs[k])) & (G[:, None] < _INF)
    if k == S - 1:
        ok &= (I <= tab.final_start_max)[:, None]
    val = np.where(ok, np.maximum(cost, G[:, None]), _INF)
    arg = np.argmin(val, axis=0)
    return val[arg, np.arange(len(J))], arg


def refine_cuts(problem: Problem, tab: OrderTables, seg: Segments, radius: int) -> Segments:
    """The best cuts within `radius` positions of `seg.cuts`, devices fixed; NOTE [candidate cuts] pass 2.

    The windows contain `seg`'s cuts, so the answer is at most `evaluate`'s bottleneck of `seg`.
    """
    n = tab.n
    valid = valid_cuts(tab)
    windows = [np.array([0])]
    for c in seg.cuts[1:-1]:
        w = np.arange(max(1, c - radius), min(n - 1, c + radius) + 1)
        windows.append(w[valid[w] | (w == c)])
    windows.append(np.array([n]))
    got = fixed_device_dp(problem, tab, seg.devices, windows)
    return seg if got is None else got


def contiguous_plan(problem: Problem, tab: OrderTables, cuts: list[int], devices: list[str], t0: float,
                    stats: dict[str, float]) -> Plan:
    """A Plan from cut positions of `tab.order`, costed by `evaluate`."""
    stage_of: dict[str, int] = {}
    for k in range(len(devices)):
        for v in tab.order[cuts[k]:cuts[k + 1]]:
            stage_of[v] = k
    stage_of = {v: stage_of[v] for v in problem.graph.nodes}
    stages = evaluate(problem, stage_of, devices)
    return Plan(stage_of=stage_of, slot_of_stage=list(devices), stages=stages, bottleneck_ns=bottleneck_ns(stages),
                lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=time.perf_counter() - t0, stats=stats)


def dp_hint(problem: Problem, *, exact_cuts: int = EXACT_CUTS, coarse_cuts: int = COARSE_CUTS,
            time_limit_s: float | None = None, pre_cuts_above: int = PRE_CUTS_ABOVE, budget: int = _DP_BUDGET,
            refine_budget: int = _REFINE_BUDGET) -> Plan | None:
    """The best plan whose stages are contiguous segments of `problem.node_order()`.

    Minimises the bottleneck of NOTE [stage time] (costs.py) under the memory
    limits, pins, co-location groups and forbidden device types; returns None when
    no such plan fits. Exact over contiguous plans up to `exact_cuts` nodes; above,
    NOTE [candidate cuts]. The plan's `lower_bound_ns` is 0: the DP proves nothing
    about non-contiguous plans. With `time_limit_s`, NOTE [DP deadline].

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
    deadline = None if time_limit_s is None else t0 + time_limit_s
    problem.validate()
    tab = order_tables(problem)
    n = tab.n
    every = np.flatnonzero(tab.cuttable | (np.arange(n + 1) == 0) | (np.arange(n + 1) == n))
    exact = n <= exact_cuts
    P = every if exact else cut_candidates(tab, coarse_cuts)
    # Devices in list order with exact links and capacities (what dp-topo-order does): it can
    # beat a DP whose classes had to be merged (`_classes`), and finds plans when that DP cannot.
    # Computed first: it is cheap, it is the plan to fall back on at the deadline, and its
    # bottleneck prunes the exact DP.
    listed = list_order_segments(problem, tab, P, refine=not exact, refine_budget=refine_budget, deadline=deadline)
    known = [_cost(problem, tab, listed)] if listed is not None else []
    pre = None
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    if exact and len(P) > pre_cuts_above and _classes(problem, len(P), max_stages, budget)[0]:
        # A quick plan from half the candidate cuts, refined, to prune the exact DP (NOTE [DP deadline]).
        rough = _dp_over(problem, tab, cut_candidates(tab, coarse_cuts // 2), deadline=deadline, budget=budget)
        if rough is not None:
            pre, pre_ns, _ = _refined(problem, tab, rough, refine_budget)
            known.append(pre_ns)
    seg = _dp_over(problem, tab, P, deadline=deadline, known_ns=min(known) if exact and known else None,
                   budget=budget)
    if seg is None and not exact and not _past(deadline):
        # The candidates may miss the only cuts that fit in memory: try positions four times
        # denser before giving up (rare: memory that tight).
        P = np.unique(np.concatenate([P, every[:: max(1, len(every) // (4 * coarse_cuts))], [0, n]]))
        seg = _dp_over(problem, tab, P, deadline=deadline, budget=budget)
    found: list[Segments] = []
    timed_out = _past(deadline) if seg is None else seg.timed_out
    # Exact over contiguous plans: every cut position, exact classes, not stopped (None from the
    # exact DP then means that no plan beats the list-order one).
    dp_exact = exact and not timed_out and (seg.exact if seg is not None
                                            else _classes(problem, len(P), max_stages, budget)[0])
    stats = {"dp_candidates": float(len(P)), "dp_exact": float(dp_exact),
             "dp_states": float(seg.states if seg else 0), "dp_timed_out": float(timed_out)}
    if seg is not None:
        stats["dp_coarse_ns"] = float(_cost(problem, tab, seg))
        if exact and seg.exact:
            found.append(seg)  # the best contiguous plan (of the stage counts done): nothing to refine
        else:
            best, best_ns, rounds = _refined(problem, tab, seg, refine_budget)
            found.append(best)
            stats["dp_refine_rounds"] = float(rounds)
            if not exact and not seg.timed_out:
                # Pass 1 again on twice the candidates and the refined cuts, pruned by the plan so
                # far: it may find a better device sequence (NOTE [candidate cuts] step 3).
                P2 = np.union1d(cut_candidates(tab, 2 * coarse_cuts), best.cuts)
                again = _dp_over(problem, tab, P2, upper_ns=best_ns, deadline=deadline, budget=budget)
                if again is not None:
                    found.append(_refined(problem, tab, again, refine_budget)[0])
    if pre is not None:
        found.append(pre)
    if listed is not None:
        found.append(listed)
    if not found:
        return None
    best = min(found, key=lambda sg: _cost(problem, tab, sg))
    stats["dp_bottleneck_ns"] = float(_cost(problem, tab, best))
    stats["dp_from_list_order"] = float(best is listed)
    return contiguous_plan(problem, tab, best.cuts, best.devices, t0, stats)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


# NOTE [DP deadline]
# The DP's work grows with the number of device-count states (up to 625 x 16 on 16 devices of
# 4 types) times the cut positions squared: tens of seconds on a few hundred nodes. `dp_hint(...,
# time_limit_s=...)` keeps it within a limit: the list-order plan (`list_order_segments`,
# devices in list order, prefixes of them tried by length until the deadline once one fits)
# comes first; the DP over device classes goes by stage count
# (depth) and, at the deadline, stops and keeps the best plan of the depths it finished
# (a valid plan, costed by `evaluate`; `stats["dp_timed_out"]`); the further passes are skipped.
# The exact DP is pruned by the best bottleneck known before it starts (the list-order plan;
# above PRE_CUTS_ABOVE positions also a DP over COARSE_CUTS // 2 candidate cuts, refined)
# when its classes are exact (its values are then `evaluate`'s): it keeps the same optimum
# and skips most partial plans (docs/benchmarks.md, "Measurements moved out of NOTEs").


def _cost(problem: Problem, tab: OrderTables, seg: Segments) -> int:
    """`evaluate`'s bottleneck of a contiguous plan."""
    return contiguous_plan(problem, tab, seg.cuts, seg.devices, 0.0, {}).bottleneck_ns


def list_order_segments(problem: Problem, tab: OrderTables, P: np.ndarray, refine: bool,
                        refine_budget: int = _REFINE_BUDGET, deadline: float | None = None) -> Segments | None:
    """The best contiguous plan on a prefix of the devices in list order, cutting at positions `P`
    (then, for the best prefix, refined op by op when `refine`); None when no prefix fits. Past
    `deadline`, once some prefix fits, the longer prefixes are not tried (NOTE [DP deadline])."""
    n = tab.n
    names = [s.name for s in problem.slots[: min(len(problem.devices), problem.max_stages or len(problem.devices))]]
    valid = valid_cuts(tab)
    inner = np.array([j for j in P if valid[j]], dtype=np.int64)
    one_pass = problem.training is None or problem.training.schedule != "1f1b"  # a 1F1B stash depends on S
    best = _prefix_chain(problem, tab, names, inner, deadline) if one_pass else None  # the same plans
    for S in () if one_pass else range(1, len(names) + 1):
        if len(inner) < S - 1:
            break
        seg = fixed_device_dp(problem, tab, names[:S], [np.array([0]), *[inner] * (S - 1), np.array([n])])
        if seg is not None and (best is None or seg.dp_ns < best.dp_ns):
            best = seg
        if best is not None and _past(deadline):  # NOTE [DP deadline]
            break
    if best is not None and refine and not _past(deadline):
        best = _refined(problem, tab, best, refine_budget)[0]  # only the best stage count: refining is the costly part
    return best


def _prefix_chain(problem: Problem, tab: OrderTables, names: list[str], inner: np.ndarray,
                  deadline: float | None) -> Segments | None:
    """`list_order_segments`' best prefix, unrefined, where a stash does not depend on the stage count
    (inference, GPipe): stage k's table as a middle stage is then the same for every longer prefix, so
    one pass builds it once and closes each prefix with its last stage (the same plans, S times faster)."""
    devs = [problem.slot(d) for d in names]
    best, G, backs = None, np.zeros(1, dtype=np.int64), []  # backs: the middle stages' back pointers
    for S in range(1, min(len(names), len(inner) + 1) + 1):
        k = S - 1
        I = np.array([0]) if k == 0 else inner  # noqa: E741
        end, arg = _fixed_step(problem, tab, devs, k, S, I, np.array([tab.n]), G)  # the last stage
        if end[0] < _INF and (best is None or int(end[0]) < best.dp_ns):
            j = int(arg[0])
            cuts = [tab.n, int(I[j])]
            for kk in range(k - 1, 0, -1):
                j = int(backs[kk][j])
                cuts.append(int(inner[j]))
            cuts = [0] + cuts[::-1] if k > 0 else [0, tab.n]
            best = Segments(cuts=cuts, devices=list(names[:S]), dp_ns=int(end[0]), exact=True, states=S)
        if best is not None and _past(deadline):
            break  # NOTE [DP deadline]
        if S < len(names):
            G, arg = _fixed_step(problem, tab, devs, k, len(names), I, inner, G)  # a middle one
            backs.append(arg)
    return best


def _refined(problem: Problem, tab: OrderTables, seg: Segments,
             budget: int = _REFINE_BUDGET) -> tuple[Segments, int, int]:
    """`refine_cuts` until it stops improving: (plan, its bottleneck, rounds)."""
    radius = max(16, int(math.sqrt(budget / len(seg.devices)) / 2))
    cur_ns = _cost(problem, tab, seg)
    rounds = 0
    while rounds < 4:
        rounds += 1
        nxt = refine_cuts(problem, tab, seg, radius)
        if nxt.dp_ns >= cur_ns:
            break
        seg, cur_ns = nxt, nxt.dp_ns
    return seg, cur_ns, rounds
