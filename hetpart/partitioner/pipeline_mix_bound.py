"""A stage of contiguous layers runs the model's own mix of work but near its ends (NOTE [stage mix bound]): the
per-type slack of that statement, from two maximum-weight closures of the graph per type, and the lines
pipeline_bounds.py adds to its LP beside NOTE [stage sum cuts]'s. Nothing here imports torch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.graph.python import max_flow

from hetpart.partitioner.costs import transfer_ns
from hetpart.partitioner.pipeline_stage_sum import StageSum
from hetpart.partitioner.pipeline_transfer_floor import gap_table
from hetpart.partitioner.problem import TIME_NS, Problem

# NOTE [stage mix bound]
# NOTE [stage sum cuts]'s Z(C) lets each node class go to any type, so a pipeline's H100s take the matmuls and its
# A100s the memory-bound ops (llama-7b on hetero-64: 560.7 ms where stages of the model's mix give 607.4,
# docs/benchmarks.md "gap19e"). A stage is S = D2 - D1 for two nested downsets D1 <= D2 (sets closed under
# predecessors: y[v, k] of DESIGN.md 5), so it cannot pick its nodes. Fix a reference weight r(v) >= 0 (the node's
# time on the type `ref` of least model time, R = r(V)) and per type t, rho_t = W_t / R (W_t: the model on t) and
#     g_t(v) = time[v, t] - rho_t r(v),   delta_t = max over downsets D of g_t(D) - min over downsets D of g_t(D).
# (1) Every stage S on type t has time_t(S) = rho_t r(S) + g_t(D2) - g_t(D1) >= rho_t r(S) - delta_t. The two
#     extremes are maximum-weight closures (a min cut each, `downset_range`); on Llama they are within a layer
#     (delta about 1 ms on an A100 against the H100, where a stage is tens of ms). Any rho_t is valid; this one
#     makes g_t(V) = 0, so delta_t is the swing inside the graph, not a drift along it.
# (2) A pipeline's stage sum, for prices beta >= 0 over its types (n_t stages on t, each of compute <= b_i):
#         sum_S time(S) = sum_S (1 + beta_t(S)) time(S) - sum_S beta_t(S) time(S)
#                      >= sum_S (1 + beta_t(S)) (rho_t(S) r(S) - delta_t(S)) - b_i beta . n
#                      >= alpha_mix(beta) - b_i beta . n - ((1 + beta) * delta) . n,
#     alpha_mix(beta) = R min over t of (1 + beta_t) rho_t = min over t of (1 + beta_t) W_t, as sum_S r(S) = R.
#     alpha_mix is NOTE [priced fill]'s alpha on one class holding the whole model (`mix_sums`), so the lines that
#     touch it come from the same `StageSum.cut_at`.
# (3) With T >= sum_i + (m_i - 1) b_i, per pipeline
#         m_i - 1 <= (T - alpha_mix) / b_i + beta . n_i + ((1 + beta) * delta) . n_i / b_i,
#     the first two terms as NOTE [stage sum cuts] (1) writes them (u_i = T / b_i summed into w_A); the last is
#     bilinear, and 1 / b_i <= 1 / B with B a floor on every pipeline's bottleneck in the LP's part: B = max(L_A,
#     Lambda_A / max lambda . n) (NOTE [pipelines bound] (b), (e)), the max over pipelines of at most
#     D - (k_lo - 1) g devices (k_lo pipelines of at least g each; under 1F1B also at most M - (k_lo - 1) stages,
#     (h)), each type at most its devices (`bottleneck_floor`). The row sums over a support's pipelines like the
#     others: z_A - p_A <= w_A (1 - alpha_mix / T) + (beta + (1 + beta) * delta / B) . y_A.
# (5) A second row per line, as B is set by the part's largest pipeline: per pipeline x = c . n_i (c = (1 + beta)
#     delta) and 1 / b_i <= y = lambda . n_i / Lambda ((b)); with x <= x_hi (the most c . n of a pipeline of the
#     part, `_greedy`) and y >= y_lo (the least lambda . n of a pipeline of at least g devices, one of each type),
#     (x_hi - x)(y - y_lo) >= 0 gives x y <= x y_lo + x_hi (y - y_lo), linear in n_i: exact for pipelines of the
#     part's least size, where B charges them as if they were its largest. Both rows hold; the LP keeps both.
# (4) The lines: beta = 0 in the pool (the whole model on the support's fastest type, against F_A's every node on
#     its own fastest), then where the LP's point needs them, as NOTE [stage sum cuts] (2): the row's right side
#     over beta is (w_A / T) (T - alpha_mix + beta . C) + delta . y_A / B with C = (T / w_A) (y_A + delta y_A / B),
#     least at the line touching alpha_mix's Z at C.
# NOTE [pipelines memory bound] takes (1) per stage where its bottleneck is fixed (no B there; its q shares).
# Types some node may not run on get no delta (a stage there cannot hold the mix): supports with them get no line.
# What the slack costs: on llama-7b / hetero-64 (delta 0.94-1.21 ms on the A100s, 0.63 on the L4, the H100 the
# reference) B is about 6 ms in the part that binds (4-8 pipelines of >= 8 devices: up to 40 devices each) against
# the plan's 47 ms bottleneck, so (3) alone gave back most of the gain (565.7 -> 566.2 ms); with (5) 581.6 ms.
# Where every machine holds one type, NOTE [stage mix runs] pays the slack per run of one type instead, with no B.

# NOTE [stage mix runs]
# (2) of NOTE [stage mix bound] pays the slack delta once per stage, so (3) divides delta . n_i by b_i and needs B,
# which is small where a part allows long pipelines (llama-7b on hetero-256: B = 2.3 ms, the head's matmul, in the
# part that binds, 4-8 pipelines of >= 16 devices, up to 208 each: the lines there gave nothing, 592.5 ms for stages
# whose mix allows 642.7). Where every machine holds devices of one type, pay it per *run* instead: a run is a
# maximal chain of consecutive stages on one type. A run is the difference of two nested downsets too (the union of
# its stages), so (1) holds for it: its compute on type t is >= rho_t r(run) - delta_t. Two consecutive runs differ
# in type, so sit on two machines: the boundary between them goes over the network (`machine_link`) and is in the
# stage times on both its sides (NOTE [stage time]). With C(beta) and tau_net(beta) of NOTE [boundary transfer
# floor] (at most C = C(beta) - 2 boundaries of a pipeline carry fewer than beta bytes, NOTE [sync topology floor]
# (3)'s count, each other one costs a side at least tau_net = `transfer_ns(network, beta)`), a pipeline of R runs
# has at least R - 1 - C of its boundaries paying 2 tau_net each. So with c_t = (1 + beta_t) delta_t and c = the
# largest over the support's types, as in (2):
#     sum_i >= alpha_mix(beta) - b_i beta . n_i - R c + 2 tau_net max(0, R - 1 - C),
# and where c <= 2 tau_net the least over R >= 1 is at R = 1 + C: sum_i >= alpha_mix - b_i beta . n_i - K,
# K = (1 + C) c (`run_slack`: the least over beta's thresholds where the condition holds; none where it holds for
# none). K is one number per pipeline, so in (3) it is K / b_i, summed K w_A / T: the row is NOTE [stage sum cuts]
# (1)'s with alpha_mix - K, no B at all. In a part of NOTE [sync topology floor] the other rows hold at T - X
# (X: the transfers charged in the part's sync), while these use the transfers themselves, so they hold at T only:
# the part's LP takes them at T + X_hi, X_hi the largest X any plan of the part can have had charged (`Part.outside_ns`,
# NOTE [sync topology floor]'s `crossing_hi_ns`); the LP of no part's rows (`free`) at the largest X_hi of the parts,
# so it stays a relaxation of each. Left out (only weaker): runs of the reference type cost no slack (delta 0) but
# are counted in R; the fast link's transfers on the other boundaries; mixed machines (no row).

DELTA_SCALE = 1.0  # the negative control of NOTE [stage mix bound]: the slack scaled (0.5 is invalid)


@dataclass
class StageMix:
    """NOTE [stage mix bound]'s constants over the problem's types: delta per type (None: a type some node may not
    run on), the model's time per type, and the reference type."""

    ref: str
    model_ns: dict[str, float]
    delta: dict[str, float | None]

    def sums(self, types: tuple[str, ...]) -> StageSum | None:
        """alpha_mix's Z over `types` (one class: the whole model), or None where a type has no delta."""
        if any(self.delta.get(t) is None for t in types):
            return None
        times = np.array([[self.model_ns[t] for t in types]], dtype=np.float64)
        return StageSum(times, np.ones(times.shape, dtype=bool), np.ones(1))


def _max_closure(order: list[str], preds: dict[str, list[str]], weight: dict[str, int]) -> int:
    """max over downsets D (closed under predecessors, the empty set included) of sum of `weight` over D, by a
    min cut (OR-Tools' max flow, integer capacities)."""
    index = {v: i + 2 for i, v in enumerate(order)}
    big = sum(abs(x) for x in weight.values()) + 1
    flow = max_flow.SimpleMaxFlow()
    positive = 0
    for v in order:
        x = weight[v]
        if x > 0:
            flow.add_arc_with_capacity(0, index[v], x)
            positive += x
        elif x < 0:
            flow.add_arc_with_capacity(index[v], 1, -x)
        for u in preds[v]:
            flow.add_arc_with_capacity(index[v], index[u], big)  # v in D needs u in D
    if positive == 0:
        return 0
    if flow.solve(0, 1) != flow.OPTIMAL:
        raise RuntimeError("max flow failed on the stage mix's closure")
    return positive - flow.optimal_flow()


def downset_range(problem: Problem, weight: dict[str, float]) -> float:
    """max over downsets of weight(D) - min over downsets (NOTE [stage mix bound] (1)), at least the true range:
    each node's weight rounded up for the max and down for the min."""
    g = problem.graph
    order = list(g.nodes)
    preds = {v: list(g.predecessors(v)) for v in order}
    hi = _max_closure(order, preds, {v: math.ceil(x) for v, x in weight.items()})
    lo = -_max_closure(order, preds, {v: math.ceil(-x) for v, x in weight.items()})
    return float(hi - lo)


def stage_mix(problem: Problem, deadline: float | None = None) -> StageMix | None:
    """NOTE [stage mix bound]'s constants (two closures per type but the reference); None past `deadline` (checked
    between closures)."""
    g = problem.graph
    types = problem.device_types
    runs_all = [t for t in types if all(t in problem.allowed_types(v) for v in g.nodes)]
    model = {t: float(sum(g.nodes[v][TIME_NS].get(t, 0) for v in g.nodes)) for t in types}
    ref = min(runs_all, key=lambda t: (model[t], t)) if runs_all else ""
    if not runs_all or model[ref] <= 0:
        return StageMix(ref, model, {t: None for t in types})  # no line (NOTE [stage mix bound]'s last lines)
    delta: dict[str, float | None] = {}
    for t in types:
        if t not in runs_all:
            delta[t] = None
            continue
        if t == ref:
            delta[t] = 0.0  # g_ref is 0 on every node
            continue
        if deadline is not None and time.perf_counter() > deadline:
            return None
        rho = model[t] / model[ref]
        w = {v: float(g.nodes[v][TIME_NS][t]) - rho * float(g.nodes[v][TIME_NS][ref]) for v in g.nodes}
        delta[t] = DELTA_SCALE * downset_range(problem, w)
    return StageMix(ref, model, delta)


def _greedy(weight: dict[str, float], devices: dict[str, int], most: int, least: int = 0, high: bool = True) -> float:
    """The most (`high`) or least of weight . n over n_t <= devices[t] for t in weight, n_t >= 1 each, and
    least <= sum n <= most (the least: one of each type, then the lightest)."""
    if not high:
        total = sum(weight.values())
        left = max(0, least - len(weight))
        for t in sorted(weight, key=lambda t: weight[t]):
            take = min(left, max(0, devices.get(t, 0) - 1))
            total += weight[t] * take
            left -= take
        return total
    total, left = 0.0, max(0, most)
    for t in sorted(weight, key=lambda t: -weight[t]):
        take = min(left, devices.get(t, 0))
        total += weight[t] * take
        left -= take
    return total


@dataclass
class PartFloors:
    """NOTE [stage mix bound] (3) for one support in one LP part: B, the least lambda . n / Lambda of a pipeline
    of at least `least` devices, the part's most devices per pipeline and the devices per type."""

    floor: float
    rate_lo: float
    most: int
    devices: dict[str, int]


def part_floors(largest_op_ns: float, work: float, lam: dict[str, float], devices: dict[str, int], most: int,
                least: int) -> PartFloors:
    """NOTE [stage mix bound] (3)'s B (no pipeline of at most `most` devices, `devices[t]` of type t, over a support
    of lambda `lam` and Lambda `work` has a bottleneck below it) and (5)'s least rate."""
    best = _greedy(lam, devices, most)
    floor = max(largest_op_ns, work / best) if work > 0 and best > 0 else largest_op_ns
    rate_lo = _greedy(lam, devices, most, least, high=False) / work if work > 0 else 0.0
    return PartFloors(floor, rate_lo, most, devices)


def slack_rows(delta: dict[str, float], beta: dict[str, float], lam: dict[str, float], work: float,
               f: PartFloors) -> list[tuple[dict[str, float], float]]:
    """Upper bounds on sum_i ((1 + beta) delta) . n_i / b_i over a support's pipelines in a part, each as
    (coefficient per type on y, coefficient on p): (3)'s over B, and (5)'s McCormick row."""
    c = {t: (1.0 + beta.get(t, 0.0)) * d for t, d in delta.items()}
    rows = [({t: x / f.floor for t, x in c.items()}, 0.0)] if f.floor > 0 else []
    if work > 0 and f.rate_lo > 0:
        top = _greedy(c, f.devices, f.most)
        rows.append(({t: c[t] * f.rate_lo + top * lam[t] / work for t in c}, -top * f.rate_lo))
    return rows


@dataclass
class RunFloor:
    """NOTE [stage mix runs]: per threshold beta of NOTE [boundary transfer floor], (C(beta) - 2, tau_net(beta) ns)."""

    sides: list[tuple[int, int]]


def run_floor(problem: Problem, deadline: float | None = None) -> RunFloor | None:
    """NOTE [stage mix runs]'s constants; None where some machine holds two device types (two runs may then share a
    machine) or the problem's slots are of several TP degrees."""
    types_of: dict[str, set[str]] = {}
    for d in problem.devices:
        types_of.setdefault(d.node, set()).add(d.type)
    if problem.tp_sync is not None or any(len(ts) > 1 for ts in types_of.values()):
        return None
    gaps = gap_table(problem, deadline)  # kept on the problem; past the deadline mu 0 (fewer sides, still valid)
    betas = sorted({mu for mu, _ in gaps if mu > 0})
    # C(beta) - 2: the first and last gaps (mu 0, so counted) each hold one downset that is no boundary.
    return RunFloor([(max(0, sum(n for m, n in gaps if m < b) - 2), int(transfer_ns(problem.network, b)))
                     for b in betas])


def run_slack(delta: dict[str, float], beta: dict[str, float], runs: RunFloor | None) -> float | None:
    """NOTE [stage mix runs]'s K for prices `beta` over a support of slack `delta` (its types); None: no row."""
    if runs is None:
        return None
    c = max(((1.0 + beta.get(t, 0.0)) * d for t, d in delta.items()), default=0.0)
    if c <= 0:
        return 0.0
    got = [(1 + cheap) * c for cheap, side in runs.sides if c <= 2 * side]
    return min(got) if got else None
