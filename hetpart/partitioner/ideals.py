"""The exact plan over all ideals of the graph, where the graph has few of them (NOTE [ideal DP]).

An ideal (a downset) is a set of nodes closed under predecessors. The stages before
any boundary of a valid plan form an ideal, so every plan is a chain of ideals
{} < I_1 < ... < I_S-1 < V, stage k running I_k minus I_k-1. The DP of dp.py,
run over ideals instead of the prefixes of one topological order, is exact over every
plan, contiguous or not.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from hetpart.partitioner.bounds import least_stash
from hetpart.partitioner.dp import _INF, first_states, read_back, state_of, transfer_ns
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate, held_weight_bytes
from hetpart.partitioner.problem import (
    COLOCATE, FORBIDDEN_TYPES, MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Plan, Problem,
)
from hetpart.partitioner.verify import plan_violations

IDEAL_MAX = 5_000  # ideals the DP may run over (its work grows with their square)
_VISIT_MAX = 20_000  # ideals enumerated at most, those that split a co-location group included
_VISIT_WORK = 4_000_000  # ... and at most this many (ideal, node) checks: 4,000 ideals at 1,000 nodes

# NOTE [ideal DP]
# `_dp_over` (dp.py) minimises the bottleneck over chains of "positions" 0 = P_0 < ... < P_S = n,
# with every cost a vector over positions (the compute before it, the bytes over it) or a
# matrix over pairs (a stage's memory, whether it may run on a type). Positions here are the
# ideals of the graph, sorted by size, {} first and V last: the compute of stage J \ I is
# comp(J) - comp(I), the bytes over boundary I are the outputs of I read outside I (exactly
# `evaluate`'s, NOTE [stage time]), and a pair (I, J) is a stage only when I is a proper subset
# of J. Pins and co-location groups restrict the ideals themselves: every boundary ideal holds
# the PIN_FIRST nodes, none of the PIN_LAST ones, and all or none of each group.
# Memory is the one relaxation: a stage's weights are counted by first reader (a weight is
# charged to the stage holding its first reader in the node order, which does hold it) and
# its activations with the least stash of any stage (NOTE [training memory]). So with exact
# device classes and no deadline, the DP's value is a lower bound of every plan's bottleneck,
# and its plan, re-costed by `evaluate`, is optimal whenever it fits in memory.
# Transformers lowered at FX level have few ideals (zoo:gpt-small 241, zoo:llama 4,307);
# branchy graphs have millions (zoo:unet, zoo:lstm), and there the DP does not run.
# Costs are pairs (I, J) rather than matrices: each device type keeps the pairs whose compute is
# below the known plan's bottleneck, and a state gathers the pairs of the ideals it reached.

# NOTE [ideal DP pruning]
# A state's entry for ideal I (stages so far make up I, the next runs on `cur`) is dropped when
# the devices left cannot run what is outside I within the best bottleneck B so far. For
# multipliers lambda_t >= 0 (1 each; each type's 1 / its total time), the nodes outside I need
# at least sum_v min_t lambda_t time_t(v) of weighted work (NOTE [Lagrangian LP bound]); a
# device of type t left runs at most lambda_t * B of it less its two boundaries, each at least
# c = the cheapest link's time for the fewest bytes any boundary carries (a device may also stay
# idle: no less than 0); the first stage pays the boundary into it instead, the last one none
# out; and a machine other than cur's that is used at all costs a network boundary (its
# devices' share, less 2 x (network - c) weighted by the least multiplier, no less than 0).
# NOTE [ideal DP dominance]: see `_ideal_dp_over`. Both together: zoo:llama on spot-16 (4,307
# ideals, 625 device-count states) from 83 s to 13 s. The boundary after a stage runs over its
# machine's link or the network whatever the next class is, so the best start for each end is
# found once per link, not once per next class (zoo:t5 on spot-16: 54 s to about 35 s).


def enumerate_ideals(problem: Problem, limit: int = _VISIT_MAX) -> list[int] | None:
    """Every ideal of the graph as a bitmask over `problem.node_order()`, sorted by size; None
    above `limit`."""
    order = problem.node_order()
    index = {v: i for i, v in enumerate(order)}
    g = problem.graph
    preds = [sum(1 << index[u] for u in g.predecessors(v)) for v in order]
    seen = {0}
    frontier = [0]
    while frontier:
        nxt = []
        for ideal in frontier:
            for i, need in enumerate(preds):
                if not ideal >> i & 1 and need & ~ideal == 0:
                    grown = ideal | 1 << i
                    if grown not in seen:
                        seen.add(grown)
                        nxt.append(grown)
                        if len(seen) > limit:
                            return None
        frontier = nxt
    return sorted(seen, key=lambda s: (s.bit_count(), s))


@dataclass
class IdealTables:
    """Costs over the ideals of NOTE [ideal DP], sorted by size: 0 is {}, `n` is V."""

    order: list[str]
    ideals: list[int]  # bitmasks over `order`
    member: np.ndarray  # [ideal, node] bool
    comp: dict[str, np.ndarray]  # device type -> compute of each ideal on that type
    cut_bytes: np.ndarray  # bytes over the boundary after each ideal
    mem_prefix: np.ndarray  # the memory relaxation of NOTE [ideal DP], additive over ideals
    forbidden: dict[str, np.ndarray]  # device type -> nodes of each ideal that cannot run on it
    subset: np.ndarray  # [I, J]: I is a proper subset of J
    final_ok: np.ndarray  # the last stage may start after this ideal (it keeps an unpinned node)

    @property
    def n(self) -> int:
        return len(self.ideals) - 1


def ideal_tables(problem: Problem, limit: int = IDEAL_MAX, relays: bool = False) -> IdealTables | None:
    """NOTE [ideal DP]'s tables; None when the graph has more than `limit` usable ideals. `relays`:
    a stage may also run no node at all (I = J, NOTE [ideal DP contraction])."""
    g = problem.graph
    order = problem.node_order()
    n = len(order)
    every = enumerate_ideals(problem, min(_VISIT_MAX, max(limit, _VISIT_WORK // max(1, n))))
    if every is None:
        return None
    index = {v: i for i, v in enumerate(order)}
    bit = lambda vs: sum(1 << index[v] for v in vs)  # noqa: E731
    firsts = bit(v for v in order if g.nodes[v].get(PIN) == PIN_FIRST)
    lasts = bit(v for v in order if g.nodes[v].get(PIN) == PIN_LAST)
    groups = [bit(ms) for ms in problem.colocation_groups().values()]
    full = (1 << n) - 1
    inner = [s for s in every[1:-1]
             if s & firsts == firsts and s & lasts == 0 and all(s & m in (0, m) for m in groups)]
    ideals = [0, *inner, full]
    if len(ideals) > limit:
        return None
    member = np.array([[s >> i & 1 for i in range(n)] for s in ideals], dtype=bool)
    as_int = member.astype(np.int64)
    comp = {t: as_int @ np.array([g.nodes[v][TIME_NS][t] for v in order], dtype=np.int64) for t in problem.device_types}
    cut = np.zeros(len(ideals), dtype=np.int64)
    for u in order:
        nbytes = g.nodes[u].get(OUT_BYTES, 0)
        succ = [index[v] for v in g.successors(u)]
        if nbytes > 0 and succ:
            cut += nbytes * (member[:, index[u]] & ~member[:, succ].all(axis=1))
    stash = least_stash(problem)
    own = np.array([stash * g.nodes[v].get(MEM_BYTES, 0) for v in order], dtype=np.int64)
    first_reader: dict[str, int] = {}
    for i, v in enumerate(order):
        for w in g.nodes[v].get(WEIGHTS, ()):
            first_reader.setdefault(w, i)
    for w, i in first_reader.items():
        own[i] += held_weight_bytes(problem, w)
    forbidden = {t: as_int @ np.array([t in g.nodes[v].get(FORBIDDEN_TYPES, ()) for v in order], dtype=np.int64)
                 for t in problem.device_types}
    # I is a subset of J when no node of I is outside J; proper when it is also smaller.
    sizes = as_int.sum(1)
    subset = (member.astype(np.float32) @ (~member).astype(np.float32).T == 0) & (sizes[:, None] < sizes[None, :])
    if relays:
        inner_index = np.arange(1, len(ideals) - 1)
        subset[inner_index, inner_index] = True
    # The last stage keeps a node not pinned last; with relays (a relaxation) it need not.
    final_ok = np.array([(s | lasts) != full or (relays and s != full) for s in ideals])
    return IdealTables(order=order, ideals=ideals, member=member, comp=comp, cut_bytes=cut, mem_prefix=as_int @ own,
                       forbidden=forbidden, subset=subset, final_ok=final_ok)


# NOTE [ideal DP contraction]
# Where a graph has too many ideals, the DP runs on a smaller graph that loses no plan's value:
# a node v whose time is 0 on every type, with no memory, weights, pin, group or forbidden type,
# whose only input is u, u's only reader being v, and whose output is no larger than u's, is
# merged into u. Moving v into u's stage in any plan changes no compute and no boundary on the
# far side of v's stage, and on the boundaries between u and v it replaces u's bytes with v's
# (no more). Only one thing breaks: v's stage may be left empty, and dropping it would join two
# other stages over another link, or (the last stage) hold only PIN_LAST nodes. So the DP on the
# merged graph lets a stage run nothing (a relay, paying its two boundaries) and the last stage
# hold only pinned nodes. Then every plan of the problem maps to a plan of the DP no
# slower, and the DP's value is a lower bound; its plan, with merged nodes back in their
# producers' stages, is a plan of the problem (and so optimal) unless it uses a relay.
# zoo:t5 goes from more than 300,000 ideals to 4,642.


def contract_free_nodes(problem: Problem) -> tuple[Problem, dict[str, str]]:
    """NOTE [ideal DP contraction]: the merged problem and, per node, the node it was merged into."""
    g = problem.graph.copy()
    into = {v: v for v in g.nodes}
    for v in problem.node_order():
        a = g.nodes[v]
        preds = list(g.predecessors(v))
        if (len(preds) != 1 or any(a[TIME_NS].values()) or a.get(MEM_BYTES, 0) or a.get(WEIGHTS)
                or a.get(PIN) or a.get(COLOCATE) is not None or a.get(FORBIDDEN_TYPES)):
            continue
        u = preds[0]
        if g.out_degree(u) != 1 or a.get(OUT_BYTES, 0) > g.nodes[u].get(OUT_BYTES, 0):
            continue
        g.add_edges_from((u, w) for w in g.successors(v))
        g.nodes[u][OUT_BYTES] = a.get(OUT_BYTES, 0)
        g.remove_node(v)
        into[v] = into[u]
    return dataclasses.replace(problem, graph=g), into


@dataclass(frozen=True)
class IdealResult:
    bound_ns: int  # no plan of the problem has a smaller bottleneck
    plan: Plan | None  # the DP's plan when it fits in memory (optimal, bottleneck == bound_ns, when finished)
    finished: bool = True  # False: stopped at the deadline (the bound is what was proven by then)


def _stage_pairs(tab: IdealTables, device_type: str, capacity: int, upper_ns: int) -> tuple[np.ndarray, ...]:
    """The stages (I, J) a device of this type and capacity can run in less than `upper_ns` of
    compute, sorted by I: (I, J, start of each I's run of pairs, its end, the stage's compute)."""
    comp = tab.comp[device_type]
    f = tab.forbidden[device_type]
    got_i, got_j = [], []
    for lo in range(0, tab.n + 1, 512):  # blocks of rows: the full matrices would take GBs
        rows = np.arange(lo, min(lo + 512, tab.n + 1))
        ok = (tab.subset[rows] & (f[None, :] == f[rows][:, None]) & (comp[None, :] - comp[rows][:, None] < upper_ns)
              & (tab.mem_prefix[None, :] - tab.mem_prefix[rows][:, None] <= capacity))
        a, b = np.nonzero(ok)  # row-major: sorted by I
        got_i.append((a + lo).astype(np.int32)), got_j.append(b.astype(np.int32))
    pi, pj = np.concatenate(got_i), np.concatenate(got_j)
    starts = np.searchsorted(pi, np.arange(tab.n + 1))
    ends = np.searchsorted(pi, np.arange(tab.n + 1), side="right")
    return pi, pj, starts, ends, comp[pj] - comp[pi]


def _gather(starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The pair indices of `rows`: concatenated ranges starts[r]..ends[r]."""
    lengths = ends[rows] - starts[rows]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts[rows] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(total)


def ideal_dp(problem: Problem, upper_ns: int, deadline: float | None = None, limit: int = IDEAL_MAX,
             multipliers: tuple = (), lower_ns: int = 0) -> IdealResult | None:
    """NOTE [ideal DP]: the least bottleneck of any plan below `upper_ns` (a known plan's; the
    bound is `upper_ns` when there is none), and a plan with it when it fits in memory. None when
    the graph has too many ideals, or the deadline came before anything was proven or found; at
    the deadline, the bound proven so far and the best plan found (`finished` False).

    `lower_ns`, a valid bound, starts NOTE [ideal DP probes]. The merged graph of NOTE [ideal DP
    contraction] goes first (fewer ideals: zoo:llama 1,971 instead of 4,307); when its best plan
    needs a relay stage, the graph itself, if it has few enough ideals, for a plan and the exact value."""
    contracted, into = contract_free_nodes(problem)
    smaller = contracted.graph.number_of_nodes() < problem.graph.number_of_nodes()
    attempts = [(contracted, into, True)] if smaller else []
    attempts.append((problem, None, False))
    best: IdealResult | None = None
    for run_on, merged, relays in attempts:
        tab = ideal_tables(run_on, limit, relays=relays)
        if tab is None:
            continue
        got = _probed(run_on, tab, problem, merged, max(lower_ns, best.bound_ns if best else 0), upper_ns,
                      deadline, multipliers)
        if best is None or got.bound_ns >= best.bound_ns:
            best = got if got.plan is not None or best is None else dataclasses.replace(got, plan=best.plan)
        if not got.finished or got.plan is not None or got.bound_ns >= upper_ns:
            break  # the deadline, an optimal plan, or none below upper_ns even with relays
    if best is None or (best.bound_ns == 0 and best.plan is None):
        return None
    return best


# NOTE [ideal DP probes]
# The DP prunes by the bottleneck it must beat: the pairs of a stage whose compute reaches it,
# and every partial plan at it. So a run told to beat U close to the optimum is much faster
# than one told to beat the DP plan of dp.py (zoo:t5 on spot-16: that plan is 15% above the
# optimum). When one run told to beat that plan does not finish in half the time it has,
# `ideal_dp` runs it for U = lower * 1.03, lower * 1.03^2, ... up to `upper_ns`: each run that
# finds nothing below U proves U a bound; the first that finds a plan finds the optimum (below
# U, and nothing below the previous U). At the deadline, the last U proven is kept: a bound
# even when the DP cannot finish (zoo:t5 on spot-16: 67.8 us where the other bounds give 62.0;
# the optimum, 71.9 us, takes the single run 54 s).
PROBE_STEP = 1.03


def _probed(problem: Problem, tab: IdealTables, original: Problem, into: dict[str, str] | None, lower_ns: int,
            upper_ns: int, deadline: float | None, multipliers: tuple) -> IdealResult:
    """NOTE [ideal DP probes] over `_ideal_dp_over`: with a deadline, one run told to beat `upper_ns`
    first, for half the time left (it is the fastest where that plan is close to the optimum)."""
    found = None  # a plan of the first run, stopped at its deadline
    if deadline is not None:
        first = time.perf_counter() + (deadline - time.perf_counter()) / 2 if lower_ns > 0 else deadline
        got = _ideal_dp_over(problem, tab, original, into, upper_ns, first, multipliers)
        if got.finished or lower_ns <= 0:
            return got
        found = got.plan
    proven = 0
    probe = math.ceil(lower_ns * PROBE_STEP) if lower_ns > 0 else upper_ns
    while True:
        u = min(probe, upper_ns)
        got = _ideal_dp_over(problem, tab, original, into, u, deadline, multipliers)
        if not got.finished:
            plans = [pl for pl in (got.plan, found) if pl is not None]
            return IdealResult(bound_ns=proven, plan=min(plans, key=lambda pl: pl.bottleneck_ns, default=None),
                               finished=False)
        if got.bound_ns < u or u >= upper_ns:
            return got  # the optimum below u (nothing below the last probe), or nothing below upper_ns
        proven = u
        probe = max(u + 1, math.ceil(u * PROBE_STEP))


def _ideal_dp_over(problem: Problem, tab: IdealTables, original: Problem, into: dict[str, str] | None,
                   upper_ns: int, deadline: float | None, multipliers: tuple) -> IdealResult:
    """`ideal_dp` on the tables `tab` of `problem` (`original` merged as `into` says, or itself),
    one run told to beat `upper_ns`."""
    t0 = time.perf_counter()
    n = tab.n
    classes = problem.device_classes()
    cls_dev = [[problem.device(d) for d in c] for c in classes]
    cls_type = [c[0].type for c in cls_dev]
    cls_machine = [c[0].node for c in cls_dev]
    sizes = [len(c) for c in classes]
    max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
    pairs = {}
    for c in cls_dev:
        key = (c[0].type, c[0].capacity_bytes)
        if key not in pairs:
            pairs[key] = _stage_pairs(tab, *key, upper_ns)
    cls_pairs = [pairs[(c[0].type, c[0].capacity_bytes)] for c in cls_dev]
    intra = {mc: transfer_ns(link, tab.cut_bytes) for mc, link in problem.intra_node_links.items()}
    network = transfer_ns(problem.network, tab.cut_bytes)
    zeros = np.zeros(n + 1, dtype=np.int64)

    def link_into(same: int, cur: int) -> np.ndarray:
        return zeros if same < 0 else intra[cls_machine[cur]] if same else network

    types = problem.device_types
    cls_t = np.array([types.index(t) for t in cls_type])

    machines = sorted(set(cls_machine))
    cls_m = np.array([machines.index(mc) for mc in cls_machine])
    # Every boundary carries at least the fewest bytes over any inner ideal (NOTE [stage time]).
    least = int(tab.cut_bytes[1:-1].min()) if tab.n > 1 else 0
    links = [problem.intra_node_links[mc] for mc in machines if sum(d.node == mc for d in problem.devices) > 1]
    c_net = problem.network.transfer_ns(least)
    c_min = min([link.transfer_ns(least) for link in links] + [c_net])

    def capacity(counts: tuple, cur: int, lam: np.ndarray, tin: np.ndarray) -> np.ndarray:
        """NOTE [ideal DP pruning]: the most weighted work the devices left (cur's included) can run
        within best_ns, over every ideal the stage on `cur` may start after."""
        left = np.array(sizes) - np.array(counts)
        left[cur] += 1
        lam_c = lam[cls_t]
        low = float(lam_c[left > 0].min())
        per_class = left * np.maximum(0.0, lam_c * float(best_ns) - 2 * low * c_min)  # a device may stay idle
        per_machine = np.bincount(cls_m, weights=per_class, minlength=len(machines))
        home = cls_m[cur]
        others = np.delete(per_machine, home)
        total = per_machine[home] + np.maximum(0.0, others - 2 * low * (c_net - c_min)).sum() + 2 * low * c_min
        return total - low * tin

    g = problem.graph
    node_time = np.array([[g.nodes[v][TIME_NS][t] for t in types] for v in tab.order], dtype=np.float64)
    node_allowed = np.array([[t in problem.allowed_types(v) for t in types] for v in tab.order])
    member_int = tab.member.astype(np.float64)
    totals = np.where(node_allowed, node_time, 0.0).sum(axis=0)
    multipliers = [np.ones(len(types)), np.where(totals > 0, 1.0 / np.maximum(totals, 1.0), 0.0), *multipliers]
    weighted = []
    for lam in multipliers:
        lam = np.asarray(lam, dtype=np.float64)
        # Work of the nodes outside each ideal, each at its cheapest weighted type: a lower bound
        # of what the devices after it run, weighted (NOTE [Lagrangian LP bound] in bounds.py).
        per_node = np.min(np.where(node_allowed, node_time * lam[None, :], np.inf), axis=1)
        weighted.append((float(per_node.sum()) - member_int @ per_node, lam))
    # A state (counts, same, cur): G[i] is the least bottleneck of the stages that make up ideal
    # i, given that the next stage runs on class `cur`, after one on the same machine or not
    # (same = 1 / 0; -1: none). As in dp._dp_over, with pairs (I, J) instead of a matrix.
    states, layer = first_states(len(classes), n + 1)
    best_ns, best_state, best_start = np.int64(upper_ns), -1, -1
    nc = len(classes)
    intra_le_net = [bool((intra[cls_machine[c]] <= network).all()) for c in range(nc)]
    env_prev: dict[tuple, np.ndarray] = {}
    timed_out = False
    for depth in range(1, max_stages + 1):
        # NOTE [ideal DP dominance]: a state is no better than one with the same next class that
        # used no more devices of any class and pays no more into the next stage; where that one
        # reached an ideal no later (G no larger), this one's entry is dropped. env[(counts, cur,
        # kind)]: the least G over such states with at most `counts`, `kind` the link into `cur`.
        env: dict[tuple, np.ndarray] = {}
        for (counts, cur, kind), vec in env_prev.items():
            for c in range(nc):
                if counts[c] < sizes[c]:
                    key = (tuple(x + (i == c) for i, x in enumerate(counts)), cur, kind)
                    env[key] = np.minimum(env[key], vec) if key in env else vec
        for key in sorted(layer, key=lambda k: (-k[1], k)):  # intra (1) before network (0)
            counts, same, cur = key
            G = states[layer[key]][1]
            kinds = [same, -1] + ([1] if same == 0 and intra_le_net[cur] else [])
            doms = [env[k] for k in ((counts, cur, kind) for kind in dict.fromkeys(kinds)) if k in env]
            if doms:
                dom = np.minimum.reduce(doms) if len(doms) > 1 else doms[0]
                G[dom <= G] = _INF
                G = np.minimum(G, dom)
            mine = (counts, cur, same)
            env[mine] = np.minimum(env[mine], G) if mine in env else G
        env_prev = env
        nxt_layer: dict[tuple, int] = {}
        for key in sorted(layer):
            if deadline is not None and time.perf_counter() > deadline:
                timed_out = True
                break
            sid = layer[key]
            counts, same, cur = key
            G = states[sid][1]
            # Rows whose remaining work the remaining devices cannot run within best_ns are dead.
            alive = G < best_ns
            tin = link_into(same, cur)
            for rest, lam in weighted:
                alive &= rest <= capacity(counts, cur, lam, tin) * (1 + 1e-9) + 1
            rows = np.flatnonzero(alive)
            if len(rows) == 0:
                continue
            pi_all, pj_all, starts, ends, dcomp = cls_pairs[cur]
            idx = _gather(starts, ends, rows)
            pi, pj = pi_all[idx], pj_all[idx]
            base = tin[pi] + dcomp[idx]
            g_pi = G[pi]
            # The stage on `cur` is the last one: J = V.
            last = (pj == n) & tab.final_ok[pi]
            if last.any():
                val = np.maximum(g_pi[last], base[last])
                k = int(np.argmin(val))
                if val[k] < best_ns:
                    best_ns, best_state, best_start = val[k], sid, int(pi[last][k])
            if depth == max_stages:
                continue
            inner = (pj < n) & (base < best_ns)
            pi, pj, base, g_pi = pi[inner], pj[inner], base[inner], g_pi[inner]
            # The boundary after the stage runs over cur's machine's link or the network, whatever
            # the next class: the best start per end J is computed once for each of the two.
            per_link: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            for nxt in range(len(classes)):
                if counts[nxt] >= sizes[nxt]:
                    continue
                nsame = int(cls_machine[cur] == cls_machine[nxt])
                if nsame not in per_link:
                    val = np.maximum(g_pi, base + link_into(nsame, nxt)[pj])
                    keep = val < best_ns
                    v, a, b = val[keep], pi[keep], pj[keep]
                    least = np.full(n + 1, _INF, dtype=np.int64)
                    np.minimum.at(least, b, v)
                    start_of = np.full(n + 1, -1, dtype=np.int64)
                    won = v == least[b]  # the pairs that reach their J's least value (any one of ties)
                    start_of[b[won]] = a[won]
                    ends_j = np.flatnonzero(least < _INF)
                    per_link[nsame] = (ends_j, least[ends_j], start_of[ends_j])
                ends_j, v, a = per_link[nsame]
                if len(ends_j) == 0:
                    continue
                nkey = (tuple(x + (i == nxt) for i, x in enumerate(counts)), nsame, nxt)
                G2, back_start, back_state = state_of(states, nxt_layer, nkey, n + 1)
                better = v < G2[ends_j]
                G2[ends_j[better]] = v[better]
                back_start[ends_j[better]] = a[better]
                back_state[ends_j[better]] = sid
        if timed_out:
            break
        layer = nxt_layer
    # Stopped at the deadline, the DP proves nothing; the best plan it found is still a plan.
    bound = 0 if timed_out else int(best_ns)
    if best_state < 0:
        return IdealResult(bound_ns=0 if timed_out else upper_ns, plan=None, finished=not timed_out)
    starts, devices = read_back(states, best_state, best_start, classes)
    cuts = [*starts, n]
    if len(set(cuts)) < len(cuts):
        return IdealResult(bound_ns=bound, plan=None, finished=not timed_out)  # a relay stage: no plan
    stage_of = {}
    for k in range(len(devices)):
        members = tab.ideals[cuts[k + 1]] & ~tab.ideals[cuts[k]]
        for i, v in enumerate(tab.order):
            if members >> i & 1:
                stage_of[v] = k
    # Merged nodes go back to the stage of the node they were merged into.
    stage_of = {v: stage_of[v if into is None else into[v]] for v in original.graph.nodes}
    stages = evaluate(original, stage_of, devices)
    plan = Plan(stage_of=stage_of, device_of_stage=devices, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                lower_bound_ns=bound, solver_status="FEASIBLE", solve_seconds=time.perf_counter() - t0)
    return IdealResult(bound_ns=bound, plan=None if plan_violations(original, plan) else plan, finished=not timed_out)
