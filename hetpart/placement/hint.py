"""The hint: the best placement whose devices take contiguous runs of one topological order of the colour classes."""

from __future__ import annotations

import networkx as nx
import numpy as np

from hetpart.placement.problem import PlacementProblem, class_graph
from hetpart.placement.units import scaled_costs

def placement_hint(problem: PlacementProblem) -> list[tuple[str, list[int]]] | None:
    """The best placement whose devices take contiguous runs of one topological order of the classes.

    Each run is an accelerator or (at most maxCPUs of them) a CPU. Exact for that
    class of placements, under the integer costs of `scaled_costs`; None when none fits.
    """
    classes = problem.classes()
    order = list(nx.lexicographical_topological_sort(class_graph(problem), key=lambda c: min(classes[c])))
    n = len(order)
    pos_of_class = {c: p for p, c in enumerate(order)}
    pos = {i: pos_of_class[problem.nodes[i].color] for i in problem.nodes}
    fpga, cpu, size, cost = scaled_costs(problem)

    fp = np.zeros(n + 1, dtype=np.int64)
    cp = np.zeros(n + 1, dtype=np.int64)
    sz = np.zeros(n + 1, dtype=np.float64)
    ok_fpga = np.ones(n + 1, dtype=np.int64)  # prefix count of classes that may run on an accelerator
    for c, ids in classes.items():
        p = pos_of_class[c] + 1
        fp[p] += sum(fpga[i] for i in ids)
        cp[p] += sum(cpu[i] for i in ids)
        sz[p] += sum(size[i] for i in ids)
        ok_fpga[p] = int(all(problem.nodes[i].on_fpga for i in ids))
    ok_fpga[0] = 0
    fp, cp, sz, ok_fpga = np.cumsum(fp), np.cumsum(cp), np.cumsum(sz), np.cumsum(ok_fpga)
    starts = np.arange(n + 1)

    # comm[i, j]: transfer cost paid by an accelerator holding the classes at positions [i, j).
    # u pays when it is inside and a successor outside, or outside with a successor inside.
    comm = np.zeros((n + 1, n + 1), dtype=np.int64)
    succ: dict[int, set[int]] = {}
    for u, v in problem.edges:
        succ.setdefault(u, set()).add(pos[v])
    for u, ps in succ.items():
        if cost[u] == 0:
            continue
        p, ps_arr = pos[u], np.array(sorted(ps))
        pays = np.zeros((n + 1, n + 1), dtype=bool)
        # Inside: i <= p < j, and a successor at q < i or q >= j.
        lo, hi = ps_arr.min(), ps_arr.max()
        inside = (starts[:, None] <= p) & (starts[None, :] > p)
        pays |= inside & ((lo < starts[:, None]) | (hi >= starts[None, :]))
        # Outside (p < i or p >= j) with a successor q in [i, j): the first successor >= i is < j.
        k = np.searchsorted(ps_arr, starts)
        nxt = np.where(k < len(ps_arr), ps_arr[np.minimum(k, len(ps_arr) - 1)], n + 1)
        pays |= ~inside & (nxt[:, None] < starts[None, :])
        comm += np.where(pays, cost[u], 0)

    seg_fpga = fp[None, :] - fp[:, None] + comm
    seg_fpga_ok = ((ok_fpga[None, :] - ok_fpga[:, None]) == (starts[None, :] - starts[:, None])) & (
        sz[None, :] - sz[:, None] <= problem.max_size_bytes)
    seg_cpu = cp[None, :] - cp[:, None]
    later = starts[None, :] > starts[:, None]
    inf = np.int64(1) << np.int64(60)
    seg = {"fpga": np.where(later & seg_fpga_ok, seg_fpga, inf), "cpu": np.where(later, seg_cpu, inf)}

    # best[(a, c)][j]: least max-load of placing positions [0, j) on a accelerators and c CPUs.
    best = {(0, 0): np.where(starts == 0, 0, inf)}
    back: dict[tuple[int, int], tuple[np.ndarray, str]] = {}
    for a in range(problem.max_fpgas + 1):
        for c in range(problem.max_cpus + 1):
            if (a, c) == (0, 0):
                continue
            cands = []
            for kind, prev in (("fpga", (a - 1, c)), ("cpu", (a, c - 1))):
                if prev in best:
                    val = np.maximum(best[prev][:, None], seg[kind])
                    arg = np.argmin(val, axis=0)
                    cands.append((val[arg, starts], arg, kind))
            if not cands:
                continue
            vals = np.stack([v for v, _, _ in cands])
            which = np.argmin(vals, axis=0)
            best[(a, c)] = vals[which, starts]
            back[(a, c)] = (np.stack([arg for _, arg, _ in cands])[which, starts],
                            np.array([kind for _, _, kind in cands])[which])
    state = min(best, key=lambda s: (best[s][n], s))
    if best[state][n] >= inf:
        return None
    runs = []
    j = n
    while state != (0, 0):
        arg, kinds = back[state]
        i, kind = int(arg[j]), str(kinds[j])
        runs.append((kind, i, j))
        state = (state[0] - (kind == "fpga"), state[1] - (kind == "cpu"))
        j = i
    runs.reverse()
    return [(kind, sorted(i for cl in order[s:e] for i in classes[cl])) for kind, s, e in runs if e > s]
