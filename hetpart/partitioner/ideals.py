"""The exact plan over all ideals of the graph, where the graph has few of them (NOTE [ideal DP]).

An ideal (a downset) is a set of nodes closed under predecessors. The stages before
any boundary of a valid plan form an ideal, so every plan is a chain of ideals
{} < I_1 < ... < I_S-1 < V, stage k running I_k minus I_k-1. The DP of dp.py,
run over ideals instead of the prefixes of one topological order, is exact over every
plan, contiguous or not. The ideals and the costs over them are in ideal_tables.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hetpart.partitioner.costs import (
    device_classes,
    link_kind_ns,
    node_times_ns,
    same_machine,
    sequence_devices,
    stage_time_ns,
    transfer_ns,
)
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.ideal_tables import (  # noqa: F401 (the tables' names, re-exported for callers)
    IDEAL_MAX,
    _VISIT_MAX,
    _VISIT_WORK,
    IdealTables,
    _bits,
    _is_free,
    _without_free_nodes,
    enumerate_downsets,
    enumerate_ideals,
    ideal_tables,
    proper_subsets,
)
from hetpart.partitioner.problem import Link, Plan, Problem
from hetpart.partitioner.verify import plan_violations

PAIRS_MAX = 30_000_000  # stages (I, J) below the known plan kept, over all device types: 8 bytes each

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
# Transformers lowered at FX level have few ideals (zoo:gpt-small 241, zoo:llama 4,307), fewer
# still without their free nodes (NOTE [ideal DP free nodes]). Branchy graphs have tens of
# thousands or more; where the branches are twins (NOTE [twin branches] in symmetry.py: an
# ideal holding one holds its elder twin) they drop to a few thousand: zoo:moe from 191,835 to
# 10,019 (four experts a layer), zoo:unet from 28,348 to 7,318, zoo:t5 from 4,642 to 2,060.
# Each device type keeps the pairs (I, J) whose compute is below the known plan's bottleneck
# (at most PAIRS_MAX in all: with few devices, stages are long and nearly every pair is one;
# graphs with more, such as zoo:moe on mixed-4, are left to CP-SAT),
# and NOTE [ideal DP bisection] finds the least bottleneck by deciding, for one bottleneck at a
# time, whether a chain of stages below it exists.

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
# NOTE [ideal DP dominance]: see `_Decider.chain_below`; what both together saved is in
# docs/benchmarks.md ("Measurements moved out of NOTEs"). The boundary after a stage runs over its machine's link or the
# network whatever the next class is, so the ideals after it are found once per link, not once
# per next class.


@dataclass(frozen=True)
class IdealResult:
    bound_ns: int  # no plan of the problem has a smaller bottleneck
    plan: Plan | None  # the best plan found below upper_ns: optimal when its bottleneck is bound_ns
    finished: bool = True  # False: stopped at the deadline (the bound is what was proven by then)

    def settled(self, gap: float, upper_ns: int | None = None) -> bool:
        """The plan, or else a known plan of bottleneck `upper_ns`, is certified within `gap`
        (relative to the plan) by the bound."""
        value = self.plan.bottleneck_ns if self.plan is not None else upper_ns
        return value is not None and value - self.bound_ns <= gap * value


def _stage_pairs(tab: IdealTables, kinds: list[tuple[str, int]], upper_ns: int,
                 most: int) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] | None:
    """Per (device type, capacity), the stages (I, J) it can run in less than `upper_ns` of compute:
    (I, J) sorted by I; None when there are more than `most` in all. The pairs any of them can run
    are found first, one block of rows at a time (the full matrices would take GBs)."""
    most_cap = max(cap for _, cap in kinds)
    types = sorted({t for t, _ in kinds})
    got_i, got_j = [], []
    for lo in range(0, tab.n + 1, 512):
        rows = np.arange(lo, min(lo + 512, tab.n + 1))
        ok = tab.subset[rows] & (tab.mem_prefix[None, :] - tab.mem_prefix[rows][:, None] <= most_cap)
        fast = np.zeros_like(ok)
        for t in types:
            fast |= tab.comp[t][None, :] - tab.comp[t][rows][:, None] < upper_ns
        a, b = np.nonzero(ok & fast)
        got_i.append((a + lo).astype(np.int32)), got_j.append(b.astype(np.int32))
        if sum(len(x) for x in got_i) > most:
            return None
    pi, pj = np.concatenate(got_i), np.concatenate(got_j)
    pairs, count = {}, 0
    for t, cap in kinds:
        comp, f = tab.comp[t], tab.forbidden[t]
        keep = np.concatenate([(comp[j] - comp[i] < upper_ns) & (f[j] == f[i])
                               & (tab.mem_prefix[j] - tab.mem_prefix[i] <= cap)
                               for i, j in zip(np.split(pi, range(1 << 22, len(pi), 1 << 22)),
                                               np.split(pj, range(1 << 22, len(pj), 1 << 22)))])
        count += int(keep.sum())
        if count > most:
            return None
        pairs[(t, cap)] = (pi[keep], pj[keep])
    return pairs


def ideal_dp(problem: Problem, upper_ns: int, deadline: float | None = None, limit: int = IDEAL_MAX,
             multipliers: tuple = (), lower_ns: int = 0, gap: float = 0.0, pairs_max: int = PAIRS_MAX,
             visit_max: int = _VISIT_MAX, visit_work: int = _VISIT_WORK) -> IdealResult | None:
    """NOTE [ideal DP]: the least bottleneck of any plan below `upper_ns` (a known plan's; the
    bound is `upper_ns` when there is none), and the best plan found on the way, by NOTE [ideal DP
    bisection] from `lower_ns` (a valid bound); it stops once that plan is within `gap` of the
    bound. None when the graph has too many ideals, or the deadline came before anything was
    proven or found; at the deadline, the bound proven so far and the best plan found
    (`finished` False).

    The graph without its free nodes (NOTE [ideal DP free nodes]) goes first (fewer ideals:
    zoo:llama 1,419 instead of 4,307); when its best chain is no plan (a relay stage, or memory),
    the graph itself, if it has few enough ideals."""
    attempts = [True, False] if any(_is_free(a) for _, a in problem.graph.nodes(data=True)) else [False]
    best: IdealResult | None = None
    for relaxed in attempts:
        tab = ideal_tables(problem, limit, relaxed=relaxed, deadline=deadline, visit_max=visit_max,
                           visit_work=visit_work)
        if tab is None:
            break  # the deadline, or too many ideals: the graph itself has no fewer than without free nodes
        lower = max(lower_ns, best.bound_ns if best else 0)
        upper = best.plan.bottleneck_ns if best and best.plan else upper_ns
        decider = _Decider(problem, tab, upper, multipliers, pairs_max)
        if decider.pairs is None:
            break  # too many stages to keep (few devices, so long ones); the graph itself has no fewer
        got = decider.bisect(lower, deadline, gap)
        best = got if best is None else IdealResult(max(best.bound_ns, got.bound_ns), got.plan or best.plan,
                                                    got.finished)
        if not got.finished or best.settled(gap, upper_ns):
            break  # the deadline, or a plan (this one, or the known one) proven good enough
    if best is None or (best.bound_ns == 0 and best.plan is None):
        return None
    return best


# NOTE [ideal DP bisection]
# For a bottleneck U, the DP decides whether some chain of ideals has every stage below U
# (memory relaxed as in NOTE [ideal DP]): reachability, one bit per ideal and state, where the
# DP of dp.py keeps a value. The pairs (I, J) a class can run below U, for each link into the
# stage (none: the first stage; cur's machine's; the network) and out of it, are bit matrices,
# and a state's next ideals are the OR of the rows of the ideals it reached: 8 pairs a byte and
# no arithmetic per pair (a decision is far cheaper than the DP over values it replaced:
# docs/benchmarks.md, "Measurements moved out of NOTEs"). Bisection between `lo` (no chain below it) and `hi` (a chain's value) finds the
# optimum in about log2(hi - lo) decisions; each that finds nothing proves its U, so at the
# deadline the bound is the last U proven. It stops once the best plan found is within the gap
# asked for, and with a gap the decisions aim there: U = hi less the gap, which settles the
# plan when no chain is below it. A chain found below the aim is often just below it, so after
# one the next decision halves: zoo:moe on spot-16 (the order DP's plan 2.4% above the plan found)
# settles in 5 decisions where halving alone takes 6; zoo:t5 (15% above) in 3 where it takes 6.
_TIMEOUT = "timeout"


def _packed(rows: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """The n x n bit matrix (np.packbits' layout) with ones at (rows, cols), given in row-major
    order: each byte is the OR of its bits, without the dense matrix."""
    width = (n + 7) // 8
    out = np.zeros((n, width), dtype=np.uint8)
    if len(rows):
        at = rows.astype(np.int64) * width + (cols >> 3)
        starts = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])
        out.ravel()[at[starts]] = np.bitwise_or.reduceat((128 >> (cols & 7)).astype(np.uint8), starts)
    return out


class _Decider:
    """NOTE [ideal DP bisection] on the tables `tab` of `problem`, for bottlenecks below `upper_ns`."""

    def __init__(self, problem: Problem, tab: IdealTables, upper_ns: int, multipliers: tuple,
                 pairs_max: int = PAIRS_MAX) -> None:
        self.problem, self.tab, self.upper_ns = problem, tab, upper_ns
        n = tab.n
        self.classes = device_classes(problem)
        self.sizes = np.array([len(c.devices) for c in self.classes])
        self.max_stages = min(problem.max_stages or len(problem.devices), len(problem.devices))
        # The boundary next to a stage on class c, by kind (NOTE [device sequences] in costs.py): -1
        # none (before the first stage), 0 the network, 1 c's machine's link (a machine with one
        # device never has kind 1).
        self.link = [{kind: link_kind_ns(problem, c, kind, tab.cut_bytes, tab.cut_tensors) for kind in (-1, 0, 1)}
                     for c in self.classes]
        self.intra_le_net = [bool((lk[1] <= lk[0]).all()) for lk in self.link]
        self.machine = [c.machine for c in self.classes]
        types = problem.device_types
        self.cls_t = np.array([types.index(c.type) for c in self.classes])
        machines = sorted(set(self.machine))
        self.n_machines = len(machines)
        self.cls_m = np.array([machines.index(mc) for mc in self.machine])
        # Every boundary is after an inner ideal, so over a link it takes at least the least time
        # of that link over the inner ideals' bytes and tensors (NOTE [stage time]).
        links = [problem.intra_node_links[mc] for mc in machines if sum(d.node == mc for d in problem.devices) > 1]

        def least_ns(link: Link) -> int:
            return int(transfer_ns(link, tab.cut_bytes[1:-1], tab.cut_tensors[1:-1]).min()) if n > 1 else 0

        self.c_net = least_ns(problem.network)
        self.c_min = min([least_ns(link) for link in links] + [self.c_net])
        node_time = np.stack([node_times_ns(problem, tab.order, t) for t in types], axis=1).astype(np.float64)
        node_allowed = np.array([[t in problem.allowed_types(v) for t in types] for v in tab.order])
        member_int = tab.member.astype(np.float64)
        totals = np.where(node_allowed, node_time, 0.0).sum(axis=0)
        self.weighted = []
        for lam in [np.ones(len(types)), np.where(totals > 0, 1.0 / np.maximum(totals, 1.0), 0.0), *multipliers]:
            lam = np.asarray(lam, dtype=np.float64)
            # Work of the nodes outside each ideal, each at its cheapest weighted type: a lower bound
            # of what the devices after it run, weighted (NOTE [Lagrangian LP bound] in lp_bounds.py).
            per_node = np.min(np.where(node_allowed, node_time * lam[None, :], np.inf), axis=1)
            self.weighted.append((float(per_node.sum()) - member_int @ per_node, lam))
        # Per (type, capacity): the stages it can run below the known plan (NOTE [ideal DP]); None
        # when there are more than PAIRS_MAX in all.
        self.pairs = _stage_pairs(tab, list(dict.fromkeys((c.type, c.capacity_bytes) for c in self.classes)),
                                  upper_ns, pairs_max)
        self._capacity: dict[tuple, tuple[float, float]] = {}

    def capacity(self, left: np.ndarray, home: int, k: int, u: int) -> tuple[float, float]:
        """NOTE [ideal DP pruning]: (the most work, weighted by multipliers k, that the devices
        `left` (per class, the next stage's included, on machine `home`) run with every stage below
        u, the least multiplier among them): what is outside an ideal must fit, less that
        multiplier times the boundary into the next stage."""
        key = (left.tobytes(), home, k, u)
        if key not in self._capacity:
            lam_c = self.weighted[k][1][self.cls_t]
            low = float(lam_c[left > 0].min())
            per_class = left * np.maximum(0.0, lam_c * float(u) - 2 * low * self.c_min)  # a device may stay idle
            per_machine = np.bincount(self.cls_m, weights=per_class, minlength=self.n_machines)
            others = np.delete(per_machine, home)
            total = (per_machine[home] + np.maximum(0.0, others - 2 * low * (self.c_net - self.c_min)).sum()
                     + 2 * low * self.c_min)
            self._capacity[key] = (total * (1 + 1e-9) + 1, low)
        return self._capacity[key]

    def matrices(self, u: int) -> list[dict]:
        """Per class, the stages below u: {(kind in, kind out): packed bit rows I, columns J},
        the first stage's (-1, kind out) one row; {(kind in, 'last'): bool over I}, J = V."""
        tab, n = self.tab, self.tab.n
        out = []
        for c, cls in enumerate(self.classes):
            pi, pj = self.pairs[(cls.type, cls.capacity_bytes)]
            comp, link = tab.comp[cls.type], self.link[c]
            dcomp = comp[pj] - comp[pi]
            keep = np.flatnonzero(dcomp < u)
            pi, pj, dcomp = pi[keep], pj[keep], dcomp[keep]
            first = int(np.searchsorted(pi, 1))  # the stages from {} (pairs are sorted by I)
            mats = {}
            # Link kind 1 only where c's machine has another device.
            kinds = (0, 1) if self.sizes[self.cls_m == self.cls_m[c]].sum() > 1 else (0,)
            for kin in (-1, *kinds):
                end = None if kin >= 0 else first
                a, b, dc = pi[:end], pj[:end], dcomp[:end]
                tin = link[kin][a]
                last = np.zeros(n + 1, dtype=bool)
                last[a[(b == n) & tab.final_ok[a] & (stage_time_ns(dc, tin, 0) < u)]] = True
                mats[(kin, "last")] = last
                for kout in kinds:
                    ok = (b < n) & (stage_time_ns(dc, tin, link[kout][b]) < u)
                    if kin < 0:
                        row = np.zeros(n + 1, dtype=bool)
                        row[b[ok]] = True
                        mats[(kin, kout)] = np.packbits(row)[None, :]
                    else:
                        mats[(kin, kout)] = _packed(a[ok], b[ok], n + 1)
            out.append(mats)
        return out

    def chain_below(self, u: int, deadline: float | None) -> list[tuple[int, int]] | None | str:
        """A chain of (start ideal, class), every stage below u (memory relaxed); None when there is
        none; _TIMEOUT at the deadline."""
        n, nc, sizes = self.tab.n, len(self.classes), self.sizes
        if deadline is not None and time.perf_counter() > deadline:
            return _TIMEOUT
        mats = self.matrices(u)
        # reached[(counts, same, cur)]: the ideals the stages so far can make up, the next stage
        # running on class cur over the link `same` (1 cur's machine's, 0 the network, -1 none).
        reached: dict[tuple, np.ndarray] = {}
        for c in range(nc):
            reached[(tuple(int(i == c) for i in range(nc)), -1, c)] = np.arange(n + 1) == 0
        layer = list(reached)
        env_prev: dict[tuple, np.ndarray] = {}
        for depth in range(1, self.max_stages + 1):
            # NOTE [ideal DP dominance]: an ideal is not expanded in a state when a state with the
            # same next class, no more devices of any class and a link into it no dearer reached
            # it. env[(counts, cur, kind)]: what such states with at most `counts` reached.
            env: dict[tuple, np.ndarray] = {}
            for (counts, cur, kind), vec in env_prev.items():
                if deadline is not None and time.perf_counter() > deadline:
                    return _TIMEOUT  # (states times classes: large on clusters of many machines)
                for c in range(nc):
                    if counts[c] < sizes[c]:
                        key = (counts[:c] + (counts[c] + 1,) + counts[c + 1:], cur, kind)
                        env[key] = env[key] | vec if key in env else vec
            nxt_layer: dict[tuple, None] = {}
            for key in sorted(layer, key=lambda k: (-k[1], k)):  # intra (1) before network (0)
                if deadline is not None and time.perf_counter() > deadline:
                    return _TIMEOUT
                counts, same, cur = key
                got = reached[key]
                kinds = [same, -1] + ([1] if same == 0 and self.intra_le_net[cur] else [])
                doms = [env[k] for k in ((counts, cur, kind) for kind in dict.fromkeys(kinds)) if k in env]
                mine = (counts, cur, same)
                env[mine] = env[mine] | got if mine in env else got
                alive = got & ~np.logical_or.reduce(doms) if doms else got.copy()
                # NOTE [ideal DP pruning]: ideals whose rest the devices left cannot run are dead.
                left = sizes - np.array(counts)
                left[cur] += 1
                tin = self.link[cur][same]
                for k, (rest, _) in enumerate(self.weighted):
                    most, low = self.capacity(left, int(self.cls_m[cur]), k, u)
                    alive &= rest <= most - low * tin
                rows = np.flatnonzero(alive)
                if len(rows) == 0:
                    continue
                last = mats[cur][(same, "last")][rows]
                if last.any():
                    return self._read_back(reached, mats, key, int(rows[np.argmax(last)]))
                if depth == self.max_stages:
                    continue
                reach: dict[int, np.ndarray] = {}  # by the link out of this stage
                for nxt in range(nc):
                    if counts[nxt] >= sizes[nxt]:
                        continue
                    nsame = same_machine(self.classes, cur, nxt)
                    if nsame not in reach:
                        mat = mats[cur][(same, nsame)]
                        bits = np.bitwise_or.reduce(mat if same < 0 else mat[rows], axis=0)
                        reach[nsame] = np.unpackbits(bits, count=n + 1).astype(bool)
                    if not reach[nsame].any():
                        continue
                    nkey = (counts[:nxt] + (counts[nxt] + 1,) + counts[nxt + 1:], nsame, nxt)
                    if nkey in reached:
                        reached[nkey] |= reach[nsame]
                    else:
                        reached[nkey] = reach[nsame].copy()
                        nxt_layer[nkey] = None
            env_prev = env
            layer = list(nxt_layer)
        return None

    def _read_back(self, reached: dict, mats: list[dict], key: tuple, start: int) -> list[tuple[int, int]]:
        """The chain ending with a stage on key's class from ideal `start` to V: each stage's
        predecessor is any state that reached an ideal with a stage from it to `start`."""
        chain = []
        while True:
            counts, same, cur = key
            chain.append((start, cur))
            if same < 0:
                break
            before = counts[:cur] + (counts[cur] - 1,) + counts[cur + 1:]
            byte, bit = start >> 3, 7 - (start & 7)
            for prev in range(len(self.classes)):
                if same_machine(self.classes, prev, cur) != same:
                    continue
                found = [(s, np.flatnonzero(reached[(before, s, prev)]
                                            & (mats[prev][(s, same)][:, byte] >> bit & 1).astype(bool)))
                         for s in (-1, 0, 1) if (before, s, prev) in reached]
                found = [(s, at) for s, at in found if len(at)]
                if found:
                    key, start = (before, found[0][0], prev), int(found[0][1][0])
                    break
            else:
                raise AssertionError("a reached ideal with no stage into it")
        return chain[::-1]

    def value(self, chain: list[tuple[int, int]]) -> int:
        """The bottleneck of a chain as the DP costs it."""
        worst = 0
        for k, (start, c) in enumerate(chain):
            end = chain[k + 1][0] if k + 1 < len(chain) else self.tab.n
            kin = -1 if k == 0 else same_machine(self.classes, chain[k - 1][1], c)
            kout = -1 if k + 1 == len(chain) else same_machine(self.classes, c, chain[k + 1][1])
            comp = self.tab.comp[self.classes[c].type]
            t = stage_time_ns(comp[end] - comp[start], self.link[c][kin][start], self.link[c][kout][end])
            worst = max(worst, int(t))
        return worst

    def plan(self, chain: list[tuple[int, int]]) -> Plan | None:
        """The chain as a plan; None when it has a relay stage or breaks memory."""
        tab = self.tab
        cuts = [start for start, _ in chain] + [tab.n]
        devices = sequence_devices(self.classes, [c for _, c in chain])  # a class's devices in list order
        stage_of = {}
        placed = 0  # NOTE [ideal DP free nodes]: a free node goes before the first boundary whose cut has it
        for k in range(len(devices)):
            members = tab.ideals[cuts[k + 1]] & ~tab.ideals[cuts[k]]
            for i, v in enumerate(tab.order):
                if members >> i & 1:
                    stage_of[v] = k
            if tab.free:
                now = (tab.free_inside[cuts[k + 1]] if k + 1 < len(devices) else (1 << len(tab.free)) - 1) & ~placed
                placed |= now
                for i, v in enumerate(tab.free):
                    if now >> i & 1:
                        stage_of[v] = k
        if len(set(stage_of.values())) < len(devices):
            return None  # a relay: a stage that runs nothing
        stages = evaluate(self.problem, stage_of, devices)
        plan = Plan(stage_of=stage_of, slot_of_stage=devices, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                    lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
        return None if plan_violations(self.problem, plan) else plan

    def bisect(self, lower_ns: int, deadline: float | None, gap: float) -> IdealResult:
        """NOTE [ideal DP bisection] from a valid bound `lower_ns`."""
        lo, hi, best = lower_ns, self.upper_ns, None
        first, aim = True, gap > 0
        while lo < hi and not IdealResult(lo, best).settled(gap, self.upper_ns):
            mid = (lo + hi + 1) // 2
            if aim:
                # With a gap: is any chain faster than the best by more than the gap? Often
                # not, and that settles the plan of value hi (NOTE [ideal DP bisection]).
                u = max(mid, hi - int(gap * hi))
            else:
                # First: is any chain faster than the known plan? Often not (the order DP's plan
                # is optimal on chains), and then one decision proves that plan optimal.
                u = hi if first else mid
            first = False
            chain = self.chain_below(u, deadline)
            if chain is _TIMEOUT:
                return IdealResult(bound_ns=lo, plan=best, finished=False)
            if chain is None:
                lo = u  # no chain below u
                aim = gap > 0
                continue
            aim = gap > 0 and not aim  # aim and halve in turn
            hi = self.value(chain)
            plan = self.plan(chain)
            if plan is not None and (best is None or plan.bottleneck_ns < best.bottleneck_ns):
                best = plan
        return IdealResult(bound_ns=lo, plan=best)
