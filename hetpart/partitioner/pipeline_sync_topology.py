"""The least gradient sync plus machine-crossing transfers a part of NOTE [pipelines bound] pays (NOTE [sync topology
floor]): a ring kept on one machine costs machines, and machines cost network boundaries. Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetpart.partitioner.costs import held_weight_bytes, transfer_ns
from hetpart.partitioner.pipeline_transfer_floor import gap_table
from hetpart.partitioner.problem import Problem

# NOTE [sync topology floor]
# NOTE [pipelines bound] charges each part (k >= k_lo pipelines, the smallest of at most n devices, each
# of at least g_lo) sigma at the fastest link; a plan keeping its rings on NVLink pays for it elsewhere.
# Take any plan of the part and call a read weight *local* when all its holders sit on one machine
# (its ring stays on that machine's link), else *crossing* (its ring's link is no faster than the
# network, `_ring_link`). Let Loc be the local weights, L their bytes (0 <= L <= W, W the read bytes).
# (1) Sync. Every pipeline holds every read weight, so each ring has r >= k ranks and moves 2(r-1)/r >=
#     c_k = 2(k-1)/k of its bytes per rank. Over the smallest pipeline's n_s <= n devices the bytes held
#     add up to at least W, of which W - L crossing, so some device pays at least
#     c_k ((W - L) / bw_net + L / bw_fast) / n (bw_fast: the fastest link), and the device holding the
#     largest weight w_max at least c_k w_max / bw (bw_net where L < w_max: w_max is then crossing), plus
#     2(k-1) x the least latency (one bucket). L = W is sigma; sync(L) only falls as L grows.
# (2) Machines. Each local weight has holders of all k pipelines on its machine, so if Loc is not
#     empty every pipeline has a stage on each machine holding a local weight, and those machines hold
#     k copies of each local weight with its training state; a pipeline also holds its own copy of
#     the other weights and one microbatch of activations (NOTE [pipelines bound] (f)), on disjoint
#     devices. So the machines a pipeline's stages run on have memory at least
#     need + (k - 1) f L (need: `need_bytes`; f: the least held bytes per weight byte), and at least
#     ceil(g_lo / g) of them (g: the largest machine's devices). Q(L): the fewest machines of the
#     cluster (largest first) meeting both. A machine holding a local weight has >= k devices, so
#     k > g forces L = 0 (sigma at network speed, as before).
# (3) Boundaries. A pipeline on >= Q machines has >= Q - 1 boundaries between stages on two machines,
#     each over the network (`machine_link`); at most C(beta) - 2 of its boundaries carry fewer than
#     beta bytes (NOTE [boundary transfer floor]'s C counts |free_j| + 1 downsets in every gap, but a
#     boundary's downset is proper and non-empty: gap 0 holds at most |free_0| of them, as the empty
#     set is one of its |free_0| + 1, and the last gap |free_r|, as the whole graph is one; with no
#     cut node the one gap holds at most its |free| - 1; those two gaps have mu = 0 < beta, so are in
#     C), and a boundary is in the stage times on both its sides (NOTE [stage time]). Of its S - 1 >=
#     g_lo - 1 boundaries at least S - 1 - C' carry beta bytes (C' = C(beta) - 2), of those at least
#     a = max(0, Q - 1 - C') cross machines (the cheap ones may all cross), each of the others takes a
#     link no faster than the fastest. So every pipeline's stage sum is at least its compute plus
#     X(Q, g_lo) = max over beta > 0 of 2 (a tau_net(beta) + max(0, g_lo - 1 - C' - a) tau_fast(beta)),
#     tau: `transfer_ns` of beta bytes over the network, over the fastest link.
# (4) The part's LP. Every row of NOTE [pipelines bound]'s LP comes from T_i >= sum_i + (m_i - 1) b_i
#     with sum_i and b_i bounded below by compute only (the stage sums' lines, (b), (e), NOTE [stage mix
#     bound]'s B and slack, memory rows free of T). With sum_i >= compute + X, T_i - X >= compute +
#     (m_i - 1) b^c_i (b^c_i: the slowest stage's compute, at most b_i and at most T_i - X), so the plan
#     meets the part's LP at T - X: max_i T_i >= T_LP + X. Hence each plan of the part pays
#     T_LP + X(Q(L)) + sync(L) for its own L, and the part is charged the least of X(Q(L)) + sync(L) over
#     L: Q(L) steps up at L_q (the most L that q machines allow), sync(L) falls, so the least is at some
#     L = min(W, L_q) with q machines (and L = W). It is never below sigma (X >= 0, sync(L) >= sigma).
#     (X's fastest-link term is the transfers the LP leaves out everywhere, charged here in the parts of
#     k >= 2 only; NOTE [pipelines memory bound] charges them per stage, where the memory LP binds.) NOTE [stage
#     mix runs]' rows use transfers themselves, so hold at T only: the LP takes them at T + the largest X(Q(L))
#     of the part (`crossing_hi_ns`).
# Cost: NOTE [boundary transfer floor]'s gap table (kept on the problem; NOTE [pipelines memory bound] reads
# it too), which stops at the bound's deadline (NOTE [bounds deadline]: the gaps left get mu 0, a smaller X,
# still a floor), then arithmetic per part.
# Nothing here reads device types: a machine of several types changes no step, so mixed machines take
# the same floor. Left to sigma (no topology charged): problems whose memory or sync is per slot type
# (`held_bytes_of`, `tp_sync`: slots of several TP degrees) and inference (no sync). Left out (only
# weaker): activations of other pipelines on the shared machines, which stages sit next to which.


@dataclass
class SyncTopology:
    """NOTE [sync topology floor]'s constants for one problem."""

    weight_bytes: int  # W
    largest_weight: int  # w_max
    latency_ns: float  # the least latency of any link
    net_bw: float  # bytes per us
    fast_bw: float
    need: int
    held_per_byte: float  # f
    machine_devices: int  # g
    machine_caps: list[int]  # prefix sums of the machines' memory, largest first (0 at index 0)
    sides: list[tuple[int, int, int]]  # per beta of (3): (C(beta) - 2, its network side ns, its fastest link's)

    def crossing_ns(self, machines: int, stages: int) -> int:
        """NOTE [sync topology floor] (3)'s X for pipelines on >= `machines` machines of >= `stages` stages."""
        best = 0
        for cheap, net, fast in self.sides:
            far = max(0, machines - 1 - cheap)
            best = max(best, 2 * (far * net + max(0, stages - 1 - cheap - far) * fast))
        return best


def ring_floor_ns(pipelines: int, latency_ns: float, per_rank_us: float) -> int:
    """NOTE [pipelines bound]'s sigma given the per-rank time to move a ring's bytes once (bytes / bandwidth, us):
    2(k-1) latencies and 2(k-1)/k of the bytes."""
    k = pipelines
    return int(2 * (k - 1) * latency_ns + math.floor(2 * (k - 1) / k * per_rank_us * 1000))


def sync_topology(problem: Problem, sizes: list[int], need: int, deadline: float | None = None) -> SyncTopology | None:
    """NOTE [sync topology floor] on `problem` (`sizes`: the read weights' bytes; `need`: `need_bytes`); None where
    the note leaves the part to sigma."""
    if problem.training is None or problem.held_bytes_of is not None or problem.tp_sync is not None:
        return None
    if not sizes or max(sizes) <= 0:
        return None
    g = problem.graph
    read = problem.weights_read(g.nodes)
    ratios = [held_weight_bytes(problem, w) / problem.weights[w] for w in read if problem.weights[w] > 0]
    caps: dict[str, int] = {}
    per: dict[str, int] = {}
    for d in problem.devices:
        caps[d.node] = caps.get(d.node, 0) + d.capacity_bytes
        per[d.node] = per.get(d.node, 0) + 1
    prefix = [0]
    for c in sorted(caps.values(), reverse=True):
        prefix.append(prefix[-1] + c)
    links = [problem.network, *problem.intra_node_links.values()]
    gaps = gap_table(problem, deadline)  # NOTE [boundary transfer floor]; past the deadline mu 0 (weaker)
    betas = sorted({mu for mu, _ in gaps if mu > 0})
    cheap = [sum(n for m, n in gaps if m < b) - 2 for b in betas]  # (3): the first and last gaps hold one fewer
    sides = [(c, int(transfer_ns(problem.network, b)), min(int(transfer_ns(link, b)) for link in links))
             for c, b in zip(cheap, betas)]
    return SyncTopology(weight_bytes=sum(sizes), largest_weight=max(sizes),
                        latency_ns=min(link.latency_ns for link in links),
                        net_bw=problem.network.bandwidth_bytes_per_us,
                        fast_bw=max(link.bandwidth_bytes_per_us for link in links), need=need,
                        held_per_byte=min(ratios, default=1.0), machine_devices=max(per.values(), default=1),
                        machine_caps=prefix, sides=sides)


def _sync_ns(topo: SyncTopology, local: float, smallest: int, pipelines: int) -> int:
    """NOTE [sync topology floor] (1): the least sync with `local` bytes of local weights."""
    w, n = topo.weight_bytes, max(1, smallest)
    spread = ((w - local) / topo.net_bw + local / topo.fast_bw) / n
    largest = topo.largest_weight / (topo.fast_bw if local >= topo.largest_weight else topo.net_bw)
    return ring_floor_ns(pipelines, topo.latency_ns, max(spread, largest))


def _machines(topo: SyncTopology, memory: float, least: int) -> int | None:
    """NOTE [sync topology floor] (2): the fewest machines with `memory` bytes and `least` of them; None: none."""
    caps = topo.machine_caps
    q = max(least, next((i for i, c in enumerate(caps) if c >= memory), len(caps)))
    return q if q < len(caps) else None


def topology_sync_ns(topo: SyncTopology | None, smallest: int, pipelines: int, least_size: int,
                     sigma_ns: int) -> int:
    """NOTE [sync topology floor]: the least X(Q(L)) + sync(L) over L for plans of >= `pipelines` pipelines, the
    smallest of at most `smallest` devices, each of at least `least_size`; `sigma_ns` (today's charge) where
    `topo` is None, and never below it."""
    if topo is None or pipelines < 2:
        return sigma_ns
    best = math.inf
    for local, q in _steps(topo, pipelines, least_size):
        best = min(best, topo.crossing_ns(q, least_size) + _sync_ns(topo, local, smallest, pipelines))
    return max(sigma_ns, int(best)) if math.isfinite(best) else sigma_ns


def crossing_hi_ns(topo: SyncTopology | None, pipelines: int, least_size: int) -> int:
    """The largest X(Q(L)) of (4) over the L a plan of >= `pipelines` pipelines, each of >= `least_size` devices, may
    have (0 where `topo` is None or one pipeline: nothing charged): what NOTE [stage mix runs]' rows add to T."""
    if topo is None or pipelines < 2:
        return 0
    return max((topo.crossing_ns(q, least_size) for _, q in _steps(topo, pipelines, least_size)), default=0)


def _steps(topo: SyncTopology, pipelines: int, least_size: int) -> list[tuple[float, int]]:
    """(L, Q(L)) at the L where Q steps up (and 0 and W), those some machines hold: Q(L) of any L a plan has is at
    most that of the next of them."""
    k, w = pipelines, topo.weight_bytes
    least = math.ceil(max(1, least_size) / topo.machine_devices)
    extra = (k - 1) * topo.held_per_byte
    tops = [0.0] if k > topo.machine_devices else [
        0.0, float(w), *((c - topo.need) / extra for c in topo.machine_caps[1:] if extra > 0)]
    out = []
    for local in tops:
        local = min(float(w), max(0.0, local))
        # Less a relative 1e-9: the L of a machine's capacity, put back through float arithmetic, may land an ulp
        # above it and take one machine more (review19: 929 of 200,000 draws above the exact least); less memory
        # can only lower the floor.
        q = _machines(topo, (topo.need + extra * local) * (1 - 1e-9), least)
        if q is not None:  # else no machines hold that much: no plan of this L
            out.append((local, q))
    return out
