"""The bytes-first re-plan of a large problem: a DP over kept device order and cuts (NOTE [re-plan DP]).

Nothing here imports torch. `replan.py` calls `bytes_first_plan` as one candidate of NOTE [large re-plan].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetpart.partitioner.coarsen import cut_candidates
from hetpart.partitioner.costs import link_between, machine_link, slot_capacity_bytes, stash_microbatches, transfer_ns
from hetpart.partitioner.dp import OrderTables, valid_cuts
from hetpart.partitioner.problem import WEIGHTS, Problem
from hetpart.partitioner.replan_holdings import Holdings

# NOTE [re-plan DP]
# The re-plan of a large problem (NOTE [large re-plan] in replan.py) needs plans that keep most
# cuts where the old plan had them and give the stages lost with a machine to devices that are free,
# while staying within the bottleneck cap floor(B * (1 + slack)). This DP finds, over one family of
# plans, the one with the fewest bytes moved between machines, then within (NOTE [lexicographic
# re-plan]: checkpoint reads are the same for every plan and are not counted here):
# - Stages are contiguous runs of the node order cut at candidate positions P: where the old plan
#   cut (read from the holders, so the old stage_of is not needed: in each gap between the last
#   weighted node of one old holder and the first of the next, its two ends and the position with the
#   fewest bytes crossing), coarsen.cut_candidates, the from-scratch plan's cuts and the LAYER
#   boundaries.
# - Devices: the old plan's devices still alive, in their old order, each used or skipped; and the
#   free devices (alive, not in the old order: new ones, ones the old plan left idle, TP groups that
#   are not old ones), grouped in classes of interchangeable devices (machine, type, capacity), a
#   class's devices inserted as a
#   block at every place where the old order changes machine (its start and end too). A free class
#   may so be used at several places; its devices are named in order of use, and when a plan uses
#   more of a class than there are, the DP runs again with that class at one of its places, each in
#   turn, the most used first (`_RETRIES` runs at most), and the plan is no longer claimed exact
#   (`DpPlan.exact`).
#   Ties are broken by the fewest free devices used, which makes it rarer (yet about half of the
#   tight small cases of the test still need a second run).
# - The DP walks the entries of that list in order with state (entry e, the start p of e's stage,
#   whether the stage before it ran on e's machine): that flag fixes the incoming boundary's link,
#   the next entry's machine fixes the outgoing one, so each stage's time (costs.py's terms: compute
#   prefix sums, transfer_ns of the cut bytes over machine_link) is checked against the cap exactly,
#   and its memory (dp.OrderTables.seg_mem with the schedule's stash: GPipe's M and inference's one
#   are the same for every stage; 1F1B's largest, tab.stash_max, is used, valid and pessimistic).
#   The value of entry e' is a running minimum over the entries before it per machine (same
#   machine: flag 1; other machines: flag 0), so the DP costs O(entries * |P|^2).
# - A stage's bytes: for each weight its nodes read, nothing if its device held the weight, else
#   within (a device of its machine held it) or between (only other machines did). A weight read by
#   two nodes of one stage counts twice (an over-count); the plan is re-costed by `evaluate` and its
#   moves recounted exactly by replan.moves, and the caller keeps it only when it is valid.
# - Then, devices fixed, each cut may move to any valid position within `_RADIUS` of it (exact stage
#   times, memory and bytes per stage; `_refined`), while that lowers the bytes: cuts inside a layer.
# Exact over that family when `DpPlan.exact` (checked against brute force in
# tests/partitioner/test_replan_dp.py); it claims nothing about plans outside it, and nothing is printed
# as optimal: the re-plan reports the bytes and the lower limit (the lost state) beside them.

_INF = np.int64(1) << np.int64(62)
_CANDIDATES = 32  # coarsen.cut_candidates' positions beside the old cuts
_GAP_POSITIONS = 1  # an old cut gap's positions with the fewest bytes crossing, beside its ends
_RETRIES = 3
_RADIUS = 48  # positions a cut may move by in one refinement round
_ROUNDS = 4


@dataclass
class DpPlan:
    """The DP's plan: stage k is order[cuts[k]:cuts[k + 1]] on devices[k]; the DP's byte counts."""

    cuts: list[int]
    devices: list[str]
    between_bytes: int
    within_bytes: int
    exact: bool = True  # the DP ran once over its whole family: no free class had to be restricted


def candidate_positions(tab: OrderTables, problem: Problem, holders: Holdings, extra: list[int]) -> np.ndarray:
    """NOTE [re-plan DP]'s positions P: sorted, with 0 and n, every inner one a valid cut."""
    n = tab.n
    valid = valid_cuts(tab)
    out = {0, n} | {int(c) for c in cut_candidates(tab, _CANDIDATES)} | set(extra)
    out |= {j for j in range(1, n) if tab.layer_start[j]}
    last_pos, last_key = None, None
    for i, v in enumerate(tab.order):
        ws = problem.graph.nodes[v].get(WEIGHTS, ())
        if not ws:
            continue
        key = tuple(sorted({h for w in ws for p in holders.parts[w] for h in holders.old[p]}))
        if last_key is not None and key != last_key:
            gap = np.arange(last_pos + 1, i + 1)
            gap = gap[valid[gap]]
            if len(gap):  # its ends, and the positions with the fewest bytes crossing
                cheapest = gap[np.argsort(tab.cut_bytes[gap], kind="stable")[:_GAP_POSITIONS]]
                out |= {int(gap[0]), int(gap[-1])} | {int(j) for j in cheapest}
        last_pos, last_key = i, key
    return np.array(sorted(j for j in out if j in (0, n) or (0 < j < n and valid[j])), dtype=np.int64)


def _byte_prefixes(problem: Problem, tab: OrderTables, holders: Holdings,
                   devices: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Prefix sums over the order of the bytes each node's weights move to each of `devices`:
    (between machines, within), each of shape (len(devices), n + 1). From three sums per position: the
    bytes of parts some surviving device holds, of those one on machine m holds, of those slot s holds
    (NOTE [re-plan by shard])."""
    machine = {d.name: d.node for d in problem.devices}
    reads = dict(problem.graph.nodes(data=WEIGHTS, default=()))
    n = tab.n
    zero = np.zeros(n + 1, dtype=np.int64)
    sums = {}  # a device's need (its degree's, with mixed degrees) -> the three sums over its parts
    for d in devices:
        key = holders.need_of_slot[d] if holders.need is not None else None
        if key in sums:
            continue
        alive_bytes = zero.copy()
        on_machine: dict[str, np.ndarray] = {}
        on_device: dict[str, np.ndarray] = {}
        for pos, v in enumerate(tab.order):
            for p in (p for w in reads[v] for p in holders.needed(w, d)):
                if not holders.sources[p]:
                    continue  # read from the checkpoint whatever the plan
                alive_bytes[pos + 1] += holders.nbytes[p]
                for mc in holders.machines[p]:
                    on_machine.setdefault(mc, zero.copy())[pos + 1] += holders.nbytes[p]
                for s in holders.slots[p]:
                    on_device.setdefault(s, zero.copy())[pos + 1] += holders.nbytes[p]
        sums[key] = (alive_bytes, on_machine, on_device)
    rows = [sums[holders.need_of_slot[d] if holders.need is not None else None] for d in devices]
    between = np.stack([a - m.get(machine[d], zero) for d, (a, m, _) in zip(devices, rows)])
    within = np.stack([m.get(machine[d], zero) - o.get(d, zero) for d, (_, m, o) in zip(devices, rows)])
    return np.cumsum(between, axis=1), np.cumsum(within, axis=1)


def _free_classes(problem: Problem, free: list[str]) -> dict[str, list[str]]:
    """The free devices by class of interchangeable ones: "machine|type|capacity" -> devices."""
    classes: dict[str, list[str]] = {}
    for name in free:
        d = problem.device(name)
        classes.setdefault(f"{d.node}|{d.type}|{d.capacity_bytes}", []).append(name)
    return classes


def _stash(problem: Problem) -> int | None:
    """The stash every stage holds (NOTE [training memory]): GPipe's M, inference's one; None (the most any
    stage may hold, OrderTables.stash_max) where it depends on the stage."""
    return (stash_microbatches(problem, 0, 1)
            if problem.training is None or problem.training.schedule == "gpipe" else None)


def _entries(problem: Problem, old_alive: list[str], classes: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """NOTE [re-plan DP]'s device list: the old order with every free class's block at each machine change;
    (the entries' devices, each entry's free class key or "" for an old device)."""
    dev = {d.name: d for d in problem.devices}
    places = [0] + [i for i in range(1, len(old_alive)) if dev[old_alive[i]].node != dev[old_alive[i - 1]].node]
    places.append(len(old_alive))
    return _list(old_alive, classes, {key: sorted(set(places)) for key in classes})


def _list(old_alive: list[str], classes: dict[str, list[str]],
          at: dict[str, list[int]]) -> tuple[list[str], list[str]]:
    """The entries with each class's block at its places `at` (a place: how many old devices come before)."""
    names, keys = [], []
    for i in range(len(old_alive) + 1):
        for key, members in sorted(classes.items()):
            if i in at[key]:
                names += members
                keys += [key] * len(members)
        if i < len(old_alive):
            names.append(old_alive[i])
            keys.append("")
    return names, keys


def bytes_first_plan(problem: Problem, tab: OrderTables, holders: Holdings, old_devices: list[str], limit_ns: int,
                     extra_cuts: Sequence[int] = ()) -> DpPlan | None:
    """NOTE [re-plan DP]: the fewest bytes between machines, then within, over kept-order plans whose
    stages each take at most `limit_ns`; None when none fits."""
    dev = {d.name: d for d in problem.devices}
    old_alive = [d for d in old_devices if d in dev]
    # Free: every device not in the old order (on one-device problems they hold nothing; a TP group that is not
    # an old one may hold parts at some of its indices, NOTE [re-plan by shard], and is placed as a free one).
    classes = _free_classes(problem, [d.name for d in problem.devices if d.name not in old_alive])
    P = candidate_positions(tab, problem, holders, list(extra_cuts))
    names, keys = _entries(problem, old_alive, classes)
    if not names:
        return None
    todo, best, runs, exact = [(names, keys)], None, 0, True
    while todo and runs <= _RETRIES:
        names, keys = todo.pop(0)
        runs += 1
        got = _dp(problem, tab, P, names, [bool(k) for k in keys], holders, limit_ns)
        if got is None:
            continue
        picked, between, within, cuts = got
        used: dict[str, list[int]] = {}
        for e in picked:
            if keys[e]:
                used.setdefault(keys[e], []).append(e)
        over = [key for key, es in used.items() if len(es) > len(classes[key])]
        if over:
            # Too many of a class: the DP again with that class at one of the places it used, each in turn.
            exact = False
            place_of = _places(keys)
            at = {key: sorted({place_of[e] for e, k in enumerate(keys) if k == key}) for key in classes}
            tried = [place_of[e] for e in used[over[0]]]
            for place in sorted(set(range(len(old_alive) + 1)) & set(at[over[0]]),
                                key=lambda i: (-tried.count(i), i)):  # the places it used most first
                todo.append(_list(old_alive, classes, {**at, over[0]: [place]}))
            continue
        if best is not None and (between, within) >= (best.between_bytes, best.within_bytes):
            continue
        devices, taken = [], {key: 0 for key in classes}
        for e in picked:  # a free class's devices named in order of use (interchangeable)
            if keys[e]:
                devices.append(classes[keys[e]][taken[keys[e]]])
                taken[keys[e]] += 1
            else:
                devices.append(names[e])
        best = DpPlan(cuts=cuts, devices=devices, between_bytes=between, within_bytes=within, exact=exact)
    if best is None:
        return None
    best.exact = exact and runs == 1
    return _refined(problem, tab, holders, limit_ns, best)


def _places(keys: list[str]) -> list[int]:
    """Each entry's place: how many old devices come before it."""
    out, i = [], 0
    for k in keys:
        out.append(i)
        if not k:
            i += 1
    return out


def _dp(problem: Problem, tab: OrderTables, P: np.ndarray, names: list[str], is_free: list[bool],
        holders: Holdings, limit_ns: int) -> tuple[list[int], int, int, list[int]] | None:
    """The DP of NOTE [re-plan DP] over entries `names`: (the entries used, bytes between, within, cuts).
    Ties are broken by the fewest free devices: the second key is within * scale + free devices used."""
    n, m = tab.n, len(P)
    valid = valid_cuts(tab)
    inner = valid[P] & (P > 0) & (P < n)
    end = m - 1  # P[-1] == n
    machine = {d.name: d.node for d in problem.devices}
    uniq = sorted(set(names))
    row = {d: i for i, d in enumerate(uniq)}
    Bp, Wp = _byte_prefixes(problem, tab, holders, uniq)
    scale = len(names) + 1
    Wp = Wp * scale
    stash = _stash(problem)
    cut, tensors = tab.cut_bytes[P], tab.cut_tensors[P]
    fits: dict[tuple, np.ndarray] = {}  # (type, capacity, machine) -> [in same?][out kind] -> bool (m, m)

    def feasible(d: str) -> list[list[np.ndarray]]:
        slot = problem.slot(d)
        key = (slot.type, slot_capacity_bytes(problem, slot), machine[d])
        if key not in fits:
            comp = tab.comp[slot.type][P]
            base = (comp[None, :] - comp[:, None])
            ok = tab.allowed(slot.type, P, P) & (tab.seg_mem(P, P, stash) <= key[1])
            same, net = machine_link(problem, machine[d], machine[d]), problem.network
            tin = [transfer_ns(net, cut, tensors), transfer_ns(same, cut, tensors), np.zeros(m, dtype=np.int64)]
            tout = [transfer_ns(net, cut, tensors), transfer_ns(same, cut, tensors), np.zeros(m, dtype=np.int64)]
            fits[key] = [[ok & (base + tin[f][:, None] + tout[o][None, :] <= limit_ns)
                          & (inner if o < 2 else (np.arange(m) == end))[None, :]
                          & ((np.arange(m) == 0) if f == 2 else (P <= (tab.final_start_max if o == 2 else n)))[:, None]
                          for o in range(3)] for f in range(3)]
        return fits[key]

    N = len(names)
    # G[e][f]: the best (between, within) of partial plans whose stage on entry e starts at P[p], the stage
    # before it on another machine (f=0), on e's machine (f=1), or none: e's stage is the first (f=2).
    run_b: dict[str, list[np.ndarray]] = {}  # machine -> [out net, out same] running best over earlier entries
    run_w: dict[str, list[np.ndarray]] = {}
    run_src: dict[str, list[np.ndarray]] = {}  # the entry that gave it
    back: list[dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]] = []  # per entry, (f, o) -> (argp, ...)
    best_final = None  # (between, within, e, f, p)
    g_src: list[list[np.ndarray]] = []
    for e in range(N):
        d = names[e]
        mc = machine[d]
        init_b = np.full(m, _INF, dtype=np.int64)
        init_b[0] = 0
        GB = [np.full(m, _INF, dtype=np.int64), np.full(m, _INF, dtype=np.int64), init_b]
        GW = [np.full(m, _INF, dtype=np.int64), np.full(m, _INF, dtype=np.int64), np.where(init_b == 0, 0, _INF)]
        src = [np.full(m, -1), np.full(m, -1), np.full(m, -1)]
        for other, (rb, rw, rs) in ((k, (run_b[k], run_w[k], run_src[k])) for k in run_b):
            f, o = (1, 1) if other == mc else (0, 0)
            better = (rb[o] < GB[f]) | ((rb[o] == GB[f]) & (rw[o] < GW[f]))
            GB[f] = np.where(better, rb[o], GB[f])
            GW[f] = np.where(better, rw[o], GW[f])
            src[f] = np.where(better, rs[o], src[f])
        g_src.append(src)
        r = row[d]
        CB = Bp[r][P][None, :] - Bp[r][P][:, None]
        CW = Wp[r][P][None, :] - Wp[r][P][:, None] + int(is_free[e])
        ok_all = feasible(d)
        out_b = [np.full(m, _INF, dtype=np.int64) for _ in range(3)]
        out_w = [np.full(m, _INF, dtype=np.int64) for _ in range(3)]
        out_arg = {o: (np.full(m, -1), np.full(m, -1)) for o in range(3)}
        for f in range(3):
            rows = np.flatnonzero(GB[f] < _INF)  # the starts some partial plan reaches
            if not len(rows):
                continue
            vb0 = GB[f][rows][:, None] + CB[rows]
            vw0 = GW[f][rows][:, None] + CW[rows]
            for o in range(3):
                okm = ok_all[f][o][rows]
                cols = [end] if o == 2 else slice(None)  # the last stage ends at n
                okm = okm[:, cols]
                if not okm.any():
                    continue
                vb = np.where(okm, vb0[:, cols], _INF)
                vw = np.where(okm, vw0[:, cols], _INF)
                mb = vb.min(axis=0)
                i = np.argmin(np.where(vb == mb[None, :], vw, _INF), axis=0)
                cb, cw = mb, vw[i, np.arange(vb.shape[1])]
                ob, ow = out_b[o][cols], out_w[o][cols]
                better = ((cb < ob) | ((cb == ob) & (cw < ow))) & (cb < _INF)
                out_b[o][cols] = np.where(better, cb, ob)
                out_w[o][cols] = np.where(better, cw, ow)
                bp, bf = out_arg[o]
                bp[cols] = np.where(better, rows[i], bp[cols])
                bf[cols] = np.where(better, f, bf[cols])
        back.append(out_arg)
        if out_b[2][end] < _INF:
            cand = (int(out_b[2][end]), int(out_w[2][end]), e)
            if best_final is None or cand[:2] < best_final[:2]:
                best_final = cand
        rb = run_b.setdefault(mc, [np.full(m, _INF, dtype=np.int64), np.full(m, _INF, dtype=np.int64)])
        rw = run_w.setdefault(mc, [np.full(m, _INF, dtype=np.int64), np.full(m, _INF, dtype=np.int64)])
        rs = run_src.setdefault(mc, [np.full(m, -1), np.full(m, -1)])
        for o in range(2):  # o: the next stage on another machine (0) or this one (1)
            better = (out_b[o] < rb[o]) | ((out_b[o] == rb[o]) & (out_w[o] < rw[o]))
            rb[o] = np.where(better, out_b[o], rb[o])
            rw[o] = np.where(better, out_w[o], rw[o])
            rs[o] = np.where(better, e, rs[o])
    if best_final is None:
        return None
    between, within, e = best_final
    picked, cuts, q, o = [], [n], end, 2
    while True:
        p, f = int(back[e][o][0][q]), int(back[e][o][1][q])
        picked.append(e)
        cuts.append(int(P[p]))
        if f == 2:
            break
        e, q, o = int(g_src[e][f][p]), p, f
    return picked[::-1], between, within // scale, cuts[::-1]


def _refined(problem: Problem, tab: OrderTables, holders: Holdings, limit_ns: int, plan: DpPlan) -> DpPlan:
    """NOTE [re-plan DP]'s last step: with the devices fixed, each cut moved to any valid position within
    `_RADIUS` of where it is, for the fewest bytes (between, then within) under the cap; repeated while it
    improves (`_ROUNDS` at most). Each pass's windows hold the plan before it, so it never gets worse."""
    n = tab.n
    valid = valid_cuts(tab)
    Bp, Wp = _byte_prefixes(problem, tab, holders, plan.devices)
    S = len(plan.devices)
    stash = _stash(problem)
    slots = [problem.slot(d) for d in plan.devices]
    for _ in range(_ROUNDS):
        windows = [np.array([0])]
        for c in plan.cuts[1:-1]:
            w = np.arange(max(1, c - _RADIUS), min(n - 1, c + _RADIUS) + 1)
            windows.append(w[valid[w] | (w == c)])
        windows.append(np.array([n]))
        GB, GW = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
        backs = []
        for k in range(S):
            I, J = windows[k], windows[k + 1]  # noqa: E741
            t = slots[k].type
            tin = (transfer_ns(link_between(problem, plan.devices[k - 1], plan.devices[k]), tab.cut_bytes[I],
                               tab.cut_tensors[I]) if k > 0 else np.zeros(len(I), dtype=np.int64))
            tout = (transfer_ns(link_between(problem, plan.devices[k], plan.devices[k + 1]), tab.cut_bytes[J],
                                tab.cut_tensors[J]) if k < S - 1 else np.zeros(len(J), dtype=np.int64))
            time_ns = (tab.comp[t][J][None, :] - tab.comp[t][I][:, None]) + tin[:, None] + tout[None, :]
            ok = (tab.allowed(t, I, J) & (tab.seg_mem(I, J, stash) <= slot_capacity_bytes(problem, slots[k]))
                  & (time_ns <= limit_ns) & (GB < _INF)[:, None])
            if k == S - 1:
                ok &= (I <= tab.final_start_max)[:, None]
            vb = np.where(ok, GB[:, None] + Bp[k][J][None, :] - Bp[k][I][:, None], _INF)
            vw = np.where(ok, GW[:, None] + Wp[k][J][None, :] - Wp[k][I][:, None], _INF)
            mb = vb.min(axis=0)
            arg = np.argmin(np.where(vb == mb[None, :], vw, _INF), axis=0)
            GB, GW = mb, vw[arg, np.arange(len(J))]
            backs.append(arg)
        if GB[0] >= _INF or (int(GB[0]), int(GW[0])) >= (plan.between_bytes, plan.within_bytes):
            return plan
        cuts, j = [n], 0
        for k in range(S - 1, -1, -1):
            j = int(backs[k][j])
            cuts.append(int(windows[k][j]))
        plan = DpPlan(cuts=cuts[::-1], devices=plan.devices, between_bytes=int(GB[0]), within_bytes=int(GW[0]),
                      exact=plan.exact)
    return plan

