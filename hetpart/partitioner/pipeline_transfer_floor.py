"""The least transfers a pipeline of S stages pays at its boundaries (NOTE [boundary transfer floor]);
NOTE [pipelines memory bound]'s LPs charge them. Nothing here imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx

from hetpart.partitioner.costs import transfer_ns
from hetpart.partitioner.problem import OUT_BYTES, Problem

# NOTE [boundary transfer floor]
# A stage's time holds the transfers of the boundaries on both its sides (NOTE [stage time]); the
# boundary after stage k carries the bytes of D_k = the nodes of stages 0..k, a proper non-empty
# downset (closed under predecessors), out of it: cut(D_k) = the out_bytes of D_k's nodes that have
# a reader outside. A pipeline's S - 1 boundaries are nested, D_1 < D_2 < ... < D_{S-1}. Take the cut
# nodes u_1 < ... < u_r (comparable with every node: `cut_nodes`) and put a downset D in gap j when
# u_j is its last cut node (j = 0: none): then D holds u_j and its ancestors, lacks u_{j+1} and its
# descendants, and differs from other downsets of the gap only in the nodes in between (free_j). So
# (i) cut(D) >= mu_j, the least cut of a downset of gap j: a minimum s-t cut (`_gap_floor`: each node
#     u an arc of capacity out_bytes(u) to an "output" vertex feeding its readers, readers tied to
#     their producers by infinite arcs so the source side is a downset; u_j's side fixed to the
#     source, u_{j+1}'s to the sink); gaps 0 and r (where the empty downset or the whole graph would
#     also count) get mu = 0;
# (ii) nested downsets of one gap differ by a free node each: at most |free_j| + 1 of a chain.
# For a threshold beta, at most C(beta) = sum over gaps with mu_j < beta of (|free_j| + 1) of a
# pipeline's boundaries carry fewer than beta bytes ("cheap"); every other one carries at least beta,
# so costs at least `transfer_ns(link, beta)` (monotone in the bytes) over its link. Any beta is
# valid; `transfer_floor` takes the one that most raises beta x (S - 1 - C(beta)) for S the most
# stages a pipeline may have.
# A stage on a device of kind k (type, capacity) has a side at a cheap boundary or at no boundary
# (the pipeline's two ends) -- at most 2 + 2 C(beta) such sides per pipeline -- or pays at least
# tau_k = transfer_ns over the fastest link a kind-k device has (its machine's, or the network) at
# beta bytes; a side over the network pays tau_net >= tau_k + delta_k. A pipeline of S stages on
# machines of at most g devices spans at least S / g machines, so at least 2 (S / g - 1) of its
# sides cross the network, of which at most 2 C(beta) are cheap. NOTE [pipelines memory bound] adds,
# per kind, u_k (exempt sides) and n_k (expensive network sides): each device's stage time
# compute + (2 - u) tau_k + n delta_k <= b, summed over the kind's devices, and the same in the
# stage sums. Left out (only weaker): which kinds sit next to each other (the LP may put every
# network side on the kind whose delta is least), transfers beyond the least bytes of each gap.


@dataclass
class TransferFloor:
    """NOTE [boundary transfer floor]: beta, C(beta), and the per-kind sides (ns)."""

    beta_bytes: int  # a boundary not among the cheap ones carries at least this
    cheap: int  # C(beta): boundaries of one pipeline that may carry less
    tau_ns: dict[tuple[str, int], int]  # kind -> least time of a side at beta bytes
    delta_ns: dict[tuple[str, int], int]  # kind -> more that a side over the network costs, at least
    machine_devices: int  # g: devices on the largest machine

    @property
    def exempt_sides(self) -> int:
        """Sides of one pipeline's stages that may pay nothing: its two ends and both sides of each cheap boundary."""
        return 2 + 2 * self.cheap


def cut_nodes(problem: Problem, order: list[str]) -> list[str]:
    """The nodes comparable with every node (each other node its ancestor or descendant), in `order` (topological)."""
    g = problem.graph
    pos = {v: i for i, v in enumerate(order)}
    anc: dict[str, int] = {}
    for v in order:  # ancestors as bitsets over positions
        m = 0
        for u in g.predecessors(v):
            m |= anc[u] | (1 << pos[u])
        anc[v] = m
    desc: dict[str, int] = {}
    for v in reversed(order):
        m = 0
        for u in g.successors(v):
            m |= desc[u] | (1 << pos[u])
        desc[v] = m
    n = len(order)
    return [v for v in order if anc[v].bit_count() + desc[v].bit_count() == n - 1]


def _gap_floor(problem: Problem, live: list[str], free: list[str], after: set[str]) -> int:
    """(i): the least cut bytes of a downset holding every node before the gap, any of `free` (closed under
    predecessors) and none of `after`; `live`: the nodes before the gap read at or after it."""
    g = problem.graph
    inf = float("inf")
    flow = nx.DiGraph()
    free_set = set(free)
    side = lambda v: v if v in free_set else "t" if v in after else "s"  # noqa: E731
    for u in live + free:
        nbytes = g.nodes[u].get(OUT_BYTES, 0)
        readers = [v for v in g.successors(u) if v in free_set or v in after]
        if nbytes > 0 and readers:
            flow.add_edge(side(u), ("out", u), capacity=nbytes)
            for v in readers:
                flow.add_edge(("out", u), side(v), capacity=inf)
        if u in free_set:
            for v in readers:  # a reader on the source side keeps its producer there
                if v in free_set:
                    flow.add_edge(v, u, capacity=inf)
    if "s" not in flow or "t" not in flow:
        return 0
    return int(nx.minimum_cut_value(flow, "s", "t"))


def gap_table(problem: Problem, deadline: float | None = None) -> list[tuple[int, int]]:
    """(mu_j, |free_j| + 1) per gap of NOTE [boundary transfer floor], in order. Kept on the problem (a max-flow per
    gap: 2.4-4.9 s on a 3,690-node graph, which each search's bound and each degree's bound computed again); past
    `deadline` (a perf_counter value) the gaps left get mu 0, weaker and still a floor, and the table is not kept."""
    g = problem.graph
    key = (id(g), g.number_of_nodes())
    cached = problem.kept("gap table", key)  # NOTE [problem caches]
    if cached is not None:
        return cached
    order = list(nx.topological_sort(g))
    pos = {v: i for i, v in enumerate(order)}
    last = [max((pos[v] for v in g.successors(u)), default=-1) for u in order]
    bounds = [-1] + [pos[u] for u in cut_nodes(problem, order)] + [len(order)]
    out, cut = [], False
    for j in range(len(bounds) - 1):
        lo, hi = bounds[j], bounds[j + 1]  # u_j at lo, u_{j+1} at hi; free: strictly between
        mu = 0
        if 0 < j < len(bounds) - 2 and not cut:  # gaps 0 and r: mu = 0 (the empty downset, the whole graph)
            live = [order[i] for i in range(lo + 1) if last[i] > lo]
            mu = _gap_floor(problem, live, order[lo + 1: hi], set(order[hi:]))
            cut = deadline is not None and time.perf_counter() > deadline
        out.append((mu, hi - lo))
    if not cut:
        problem.keep("gap table", key, out)
    return out


def transfer_floor(problem: Problem, stages: int, deadline: float | None = None) -> TransferFloor:
    """NOTE [boundary transfer floor] for `problem`, beta chosen for pipelines of about `stages` stages (`gap_table`'s
    `deadline`)."""
    gaps = gap_table(problem, deadline)
    beta, cheap = 0, sum(n for _, n in gaps)
    for mu in sorted({mu for mu, _ in gaps if mu > 0}):
        below = sum(n for m, n in gaps if m < mu)
        if mu * max(0, stages - 1 - below) > beta * max(0, stages - 1 - cheap):
            beta, cheap = mu, below
    link_of: dict[tuple[str, int], list] = {}
    per_machine: dict[str, int] = {}
    for d in problem.devices:
        link_of.setdefault((d.type, d.capacity_bytes), []).append(problem.intra_node_links.get(d.node, problem.network))
        per_machine[d.node] = per_machine.get(d.node, 0) + 1
    net = int(transfer_ns(problem.network, beta))
    tau = {k: min(net, *(int(transfer_ns(link, beta)) for link in ls)) for k, ls in link_of.items()}
    return TransferFloor(beta_bytes=beta, cheap=cheap, tau_ns=tau, delta_ns={k: net - t for k, t in tau.items()},
                         machine_devices=max(per_machine.values(), default=1))
