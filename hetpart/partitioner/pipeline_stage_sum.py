"""The least stage sum of a pipeline as a function of its types' capacities, and the price lines that touch it
(NOTE [stage sum cuts]); pipeline_bounds.py adds them to its LP as cuts. Nothing here imports torch.
"""

from __future__ import annotations

import numpy as np
from ortools.linear_solver import pywraplp

# NOTE [stage sum cuts]
# NOTE [priced fill] bounds a pipeline's stage sum by alpha(beta) - b_i beta . n_i for any prices beta >= 0,
# and the LP of NOTE [pipelines bound] used a few such lines, each row then taking its own worst b_i (the
# bottleneck was eliminated row by row). Both are loose: the least stage sum of pipeline i is
#     Z(C) = min sum_v time[v, t(v)] over fractional assignments x[v, t] >= 0, sum_t x[v, t] = 1, with
#            sum_v x[v, t] time[v, t] <= C_t = n_{i,t} b_i (a stage's compute is at most b_i, one per device),
# and its LP dual is max over beta >= 0 of alpha(beta) - beta . C: Z is the upper envelope of every price
# line, and at any C the duals of Z(C)'s capacity rows are the beta whose line touches Z there.
# (1) One variable per support for the bottlenecks: with u_i = T / b_i, pipeline i's time within T gives
#     m_i - 1 <= (T - sum_i) / b_i <= u_i (1 - alpha(beta) / T) + beta . n_i   for every beta >= 0,
#     linear in (u_i, n_i, m_i) for a fixed beta, so it sums over the pipelines of a support A (w_A = sum u_i,
#     z_A = sum m_i, y_A = sum n_i) with one w_A shared by every line, instead of each line picking its own
#     b_i. What bounds b_i bounds w_A: b_i >= L_A ((e): w_A <= p_A T / L_A), b_i >= Lambda_A / (lambda . n_i)
#     ((b): w_A <= T lambda . y_A / Lambda_A), b_i <= T_i <= T (w_A >= p_A), and m_i >= 1 (z_A >= p_A). beta = 0
#     is (a) with (c) and (e); the lines of NOTE [priced fill] are (d) and its crossing row, now implied.
# (2) Which lines: any set is valid (each holds for every plan). Given the LP's point, the line most violated
#     at support A is the one touching Z at the pipelines' mean capacity C_t = T y_{A,t} / w_A (the bound on
#     w_A (1 - alpha / T) + beta . y_A is (w_A / T) (T - (alpha - beta . C)), least at the beta maximizing
#     alpha - beta . C, i.e. Z's dual at C): `cut_at` solves Z(C) and returns its duals; the LP re-solves
#     with the new lines until none is violated (a cutting-plane loop; the lines are kept for every later
#     T and part of the same bound). Its alpha is recomputed from beta by `alpha` (every node at its least
#     priced time), so a line's validity never rests on the solver's duals being exact. Where C cannot hold
#     the nodes, Z(C) gets an unplaced slack at a high price so that its duals stay finite.
# (3) Stopped early (rounds or deadline), the LP has fewer lines: a relaxation, only weaker; a deadline that
#     stopped them is reported ("stage sums" in the bound's unfinished parts).
# (4) Finding the lines costs LP solves (llama-7b on hetero-256: 9 s against 25 under load), so the bound runs
#     twice: first with the pool's lines only (beta = 0 and NOTE [priced fill]'s, at about the cost of the rows
#     they replace), then, while its deadline allows, with the lines found; the larger of the two holds. The
#     second starts each search where the first ended: more lines only raise each LP's least T, so the first's
#     one-pipeline and free values, and its bound less a part's sync, are below the second's (a part of plans
#     that all take at least the first bound, less its sync, to run their pipelines).
# Left out: the lines bound a support's pipelines through their sums, so pipelines of one support with very
# different shapes are priced at their mean (Z is convex and its perspective sums: the sum of the pipelines'
# lines is at least the mean's), which is exact only when they are alike.

_SLACK_PRICE = 20.0  # an unplaced node in Z(C) costs this times its slowest allowed time
ALPHA_SCALE = 1.0  # the negative control of NOTE [stage sum cuts]: alpha scaled up (1.1 is invalid)


class StageSum:
    """Z(C) of NOTE [stage sum cuts] for one support: node classes' time [class, type] ns, allowed, count."""

    def __init__(self, time_ns: np.ndarray, ok: np.ndarray, count: np.ndarray) -> None:
        self.time_ns, self.ok, self.count = time_ns, ok, count
        self.scale = max(1.0, float((np.where(ok, time_ns, 0.0).max(axis=1) * count).sum()))

    def alpha(self, beta: np.ndarray) -> float:
        """NOTE [priced fill]'s alpha(beta): every node at its least priced time over the support's types."""
        return float((np.where(self.ok, self.time_ns * (1.0 + beta[None, :]), np.inf).min(axis=1) * self.count).sum())

    def cut_at(self, capacity_ns: np.ndarray) -> tuple[np.ndarray, float] | None:
        """(beta, alpha(beta)) of the line touching Z at `capacity_ns` per type (NOTE [stage sum cuts] (2)); None
        where the solver fails or every price is 0 (the line beta = 0 is there already)."""
        s = pywraplp.Solver.CreateSolver("GLOP")
        n_cls, n_t = self.time_ns.shape
        t = self.time_ns / self.scale
        x = {(v, j): s.NumVar(0.0, s.infinity(), "") for v in range(n_cls) for j in range(n_t) if self.ok[v, j]}
        slack = [s.NumVar(0.0, s.infinity(), "") for _ in range(n_cls)]
        for v in range(n_cls):
            s.Add(s.Sum([x[v, j] for j in range(n_t) if self.ok[v, j]] + [slack[v]]) == float(self.count[v]))
        rows = []
        for j in range(n_t):
            terms = [float(t[v, j]) * x[v, j] for v in range(n_cls) if self.ok[v, j]]
            rows.append(s.Add(s.Sum(terms) <= float(capacity_ns[j]) / self.scale) if terms else None)
        worst = np.where(self.ok, t, 0.0).max(axis=1)
        s.Minimize(s.Sum([float(t[v, j]) * x[v, j] for (v, j) in x]
                         + [_SLACK_PRICE * float(worst[v]) * slack[v] for v in range(n_cls)]))
        if s.Solve() != pywraplp.Solver.OPTIMAL:
            return None
        beta = np.array([max(0.0, -r.dual_value()) if r is not None else 0.0 for r in rows], dtype=np.float64)
        if not np.isfinite(beta).all() or beta.max(initial=0.0) <= 0:
            return None
        return beta, ALPHA_SCALE * self.alpha(beta)
