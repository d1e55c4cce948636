"""Plans of two or more pipelines split by pipeline count and smallest pipeline size, each charged its least
gradient sync (NOTE [memory bound parts]); pipeline_memory_bound.py searches them. Nothing here imports torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


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
