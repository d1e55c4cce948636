"""Plans of two or more pipelines split by pipeline count and smallest pipeline size, each charged its least
gradient sync (NOTE [memory bound parts]: `sync_floor_ns`, NOTE [pipelines bound]'s sigma); pipeline_memory_bound.py
searches them. Nothing here imports torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hetpart.partitioner.pipeline_sync_topology import ring_floor_ns
from hetpart.partitioner.problem import Problem


def whole_ns_at_least(x: float) -> int:
    """A bound of NOTE [pipelines bound] or NOTE [pipelines memory bound] as whole ns: every plan's step is a whole
    number of ns at least `x` (less 1e-9 of it for the LPs' float error), so at least that number's ceiling. (The
    floor, used before planfuzz, put a bound the plan reaches 1 ns below it: no plan could read OPTIMAL.)"""
    return int(max(0.0, math.ceil(x * (1 - 1e-9)))) if math.isfinite(x) else 0


@dataclass(frozen=True)
class Part:
    """Plans of k_lo <= k < k_hi pipelines whose smallest has at least least_size devices, and the least
    gradient sync any of them pays (NOTE [memory bound parts])."""

    k_lo: int
    k_hi: int | None
    least_size: int
    sync_ns: int
    outside_ns: int = 0  # the most transfers a plan of the part can have had charged in sync_ns (NOTE [stage mix runs])


# NOTE [memory bound parts]
# The many-pipeline LP of NOTE [pipelines memory bound] left alone runs the batch on many short
# pipelines (llama-7b on hetero-64: 25 pipelines of 1-2 devices, 465 ms without sync) and was charged
# the sync of two pipelines of D / 2 devices (1 ms), though 16 pipelines of 2 devices sync 505 ms. So,
# as NOTE [pipelines bound] does, plans are split into parts by pipeline count k and smallest pipeline
# size n_s (`Part`: the LP gets k_lo <= sum p < k_hi and >= least_size devices per pipeline of every
# class, charged sync_floor_ns(min(D // k_lo, least size of the next cell - 1), k_lo), the least sync of
# any plan of the part: its smallest pipeline has at most both). A plan of k >= 2 pipelines is in one
# part, so the least over the parts of (their LP's T + their sync) and the one-pipeline value is a
# bound. The LP is built once and each part sets its rows. First the LP with no part's rows (k >= 2, no
# sync): the largest T shown infeasible, `free`, is below every part's (each only adds rows; 0 when the
# first T tried, the known bound less the least sync, is feasible: a T the LP reaches bounds no part,
# and that start bounds only the part of the least sync -- each part gets the known bound less its own
# sync in `parts_search`); a part whose sync plus `free` cannot beat the best so far costs nothing; the
# others by branch and bound (`parts_search`); past the deadline the parts left are charged `free` (or
# what they were shown not to reach) + their sync.


def parts_search(parts: list[Part], feasible, set_part, free: float, lo: float, best: float,
                 deadline: float | None, tol: float = 1e-3) -> tuple[float, bool]:
    """NOTE [memory bound parts]: (at most the least over the parts of (their LP's least T + their sync) and
    `best`, and no claim below `lo`; finished before the deadline). `free`: a T no part's LP reaches. Branch and
    bound: each part keeps the largest T shown infeasible (`low`); the part whose low + sync is least is tried
    at the best step so far less its sync, then halfway, until every part's low + sync is within `tol` of the
    best or above it; set_part(q) makes `feasible` the LP of part q."""
    low = {q: max(free, lo - q.sync_ns) for q in parts if max(free, lo - q.sync_ns) + q.sync_ns < best}
    tested: set[Part] = set()
    top = best  # a step some part (or one pipeline) is known to reach
    while True:
        alive = [q for q in low if low[q] + q.sync_ns < top * (1 - tol)]
        if not alive:
            return top if not low else min(top, min(low[q] + q.sync_ns for q in low)), True
        if deadline is not None and time.perf_counter() > deadline:
            return min(top, min(low[q] + q.sync_ns for q in low)), False
        q = min(alive, key=lambda q: low[q] + q.sync_ns)
        cap = top - q.sync_ns
        T = cap if q not in tested or not math.isfinite(low[q]) else (max(low[q], 1.0) + cap) / 2
        if not math.isfinite(T):
            T = max(1.0, 2 * low[q])
        set_part(q)
        tested.add(q)
        if feasible(T):
            top = min(top, T + q.sync_ns)
        else:
            low[q] = T


def sync_floor_ns(problem: Problem, smallest_pipeline: int, pipelines: int, crosses_machines: bool = False) -> int:
    """NOTE [pipelines bound]'s sigma: the least gradient sync of a plan of `pipelines` >= 2 pipelines
    whose smallest uses `smallest_pipeline` devices (`crosses_machines`: where every ring is known to span
    two machines, so runs over the network at best)."""
    if problem.training is None or pipelines < 2:
        return 0
    sizes = _read_weight_bytes(problem)
    if not sizes or max(sizes) <= 0:
        return 0
    links = [problem.network, *problem.intra_node_links.values()]
    lat = min(link.latency_ns for link in links)
    bw = max(link.bandwidth_bytes_per_us for link in links)
    if crosses_machines or pipelines > _largest_machine(problem):
        # More holders than any machine has devices: the ring crosses machines, so takes a link no
        # faster than the network (`_ring_link`: the slowest it crosses).
        bw = problem.network.bandwidth_bytes_per_us
    held = max(sum(sizes) / max(1, smallest_pipeline), max(sizes))
    return ring_floor_ns(pipelines, lat, held / bw)


def _read_weight_bytes(problem: Problem) -> list[int]:
    """The bytes of every weight some node reads, kept on the problem (NOTE [problem caches]): the search ranks
    hundreds of shapes by their sync floor, and a 5,806-node graph took 18 s to rescan each time."""
    def build() -> list[int]:
        g = problem.graph
        read = problem.weights_read(g.nodes)
        return [problem.weights[w] for w in sorted(read)]

    return problem.kept("read_weight_bytes", (id(problem.graph), problem.graph.number_of_nodes(),
                                              id(problem.weights)), build)


def _largest_machine(problem: Problem) -> int:
    per: dict[str, int] = {}
    for d in problem.devices:
        per[d.node] = per.get(d.node, 0) + 1
    return max(per.values(), default=1)


def _k_ranges(problem: Problem) -> list[tuple[int, int | None]]:
    """NOTE [pipelines bound]'s parts by pipeline count: split where the sync floor changes its terms."""
    cuts = sorted({2, 4, 16, 64, _largest_machine(problem) + 1})
    return [(a, b) for a, b in zip(cuts, cuts[1:])] + [(cuts[-1], None)]


def memory_parts(problem: Problem, microbatches: int) -> list[Part]:
    """NOTE [memory bound parts]: plans of >= 2 pipelines by count (`_k_ranges`) and smallest pipeline size
    (cells doubling from 1 device, those k_lo pipelines can have), each with the least sync of its plans."""
    if problem.training is None:
        return [Part(2, None, 1, 0)]
    devices = len(problem.devices)
    cells = [1]
    while cells[-1] <= devices:
        cells.append(2 * cells[-1])
    # k_lo pipelines of at least g devices need k_lo g devices, and the smallest has at most D / k_lo.
    return [Part(k_lo, k_hi, g, sync_floor_ns(problem, min(devices // k_lo, g_next - 1), k_lo))
            for k_lo, k_hi in _k_ranges(problem) if k_lo <= microbatches
            for g, g_next in zip(cells, cells[1:]) if g * k_lo <= devices]
