"""Standalone reproducer (only ortools): CP-SAT 9.15's presolve proves a wrong optimum once a
linear constraint's activity can reach 2**31 (NOTE [int32 activities] in
hetpart/placement/units.py, issue 17).

Two items go to two slots; each slot is an "accelerator" (weights A, plus a small transfer
`pay` when item 1 is on it without item 0) or a "CPU" (weights B); minimise the larger load.
The CPU weights sum to `total`. With presolve on, total = 2**31 - 1 is solved right and
total = 2**31 gets a "proven" optimum about three times the true one; presolve off, or
presolve_inclusion_work_limit=0, or keep_all_feasible_solutions_in_presolve, solve it right.

    python benchmarks/ortools_presolve_int32.py
"""

from __future__ import annotations

import ortools
from ortools.sat.python import cp_model

A = [171_970_490, 257_955_735]  # accelerator weights
PAY = 6_103  # transfer cost


def solve(total: int, **params) -> tuple[str, int, int]:
    """(status, objective, bound) with the CPU weights [5 * A[0] + 1, total - that]."""
    b = [5 * A[0] + 1, total - 5 * A[0] - 1]
    m = cp_model.CpModel()
    y = [m.new_bool_var(f"y{i}") for i in range(2)]  # item i on slot 0
    x0 = [m.new_bool_var(f"x0_{i}") for i in range(2)]  # item i on slot 0
    x1 = [m.new_bool_var(f"x1_{i}") for i in range(2)]  # item i on slot 1
    for i in range(2):
        m.add(x0[i] == y[i])
        m.add(x1[i] + y[i] == 1)
    cpu0, cpu1 = m.new_bool_var("cpu0"), m.new_bool_var("cpu1")
    m.add(cpu0 + cpu1 == 1)  # one slot is the CPU
    pay0, pay1 = m.new_bool_var("pay0"), m.new_bool_var("pay1")
    m.add_bool_or([x0[0], ~x0[1], pay0])  # item 1 on a slot without item 0 pays
    m.add_bool_or([x1[0], ~x1[1], pay1])
    z = m.new_int_var(0, total, "max_load")
    m.add(z >= A[0] * x0[0] + A[1] * x0[1] + PAY * pay0).only_enforce_if(~cpu0)
    m.add(z >= b[0] * x0[0] + b[1] * x0[1]).only_enforce_if(cpu0)
    m.add(z >= A[0] * x1[0] + A[1] * x1[1] + PAY * pay1).only_enforce_if(~cpu1)
    m.add(z >= b[0] * x1[0] + b[1] * x1[1]).only_enforce_if(cpu1)
    m.minimize(z)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    for key, value in params.items():
        setattr(solver.parameters, key, value)
    status = solver.solve(m)
    return solver.status_name(status), int(solver.objective_value), int(solver.best_objective_bound)


def main() -> None:
    print(f"ortools {ortools.__version__}")
    print(f"{'total - 2**31':>14} {'presolve on':>34} {'presolve off':>34}")
    for delta in (-1, 0, 1000):
        on, off = solve(2**31 + delta), solve(2**31 + delta, cp_model_presolve=False)
        verdict = "WRONG: the bound with presolve is above a solution without" if on[2] > off[1] else "agree"
        print(f"{delta:>14} {str(on):>34} {str(off):>34}  {verdict}")


if __name__ == "__main__":
    main()
