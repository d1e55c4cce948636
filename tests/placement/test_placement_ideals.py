"""The ideal DP of `hetpart placement` (NOTE [placement ideal DP]) against brute force and the known optima."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.partitioner.ideals import _bits, proper_subsets
from hetpart.placement import placement_loads, placement_violations, read_placement, solve_placement
from hetpart.placement.ideals import _ideals, _pair_loads, placement_ideal_dp
from hetpart.placement.problem import class_graph
from hetpart.placement.units import scaled_costs, scaled_loads, time_scale
from tests.placement.placement_cases import brute_force_placement as _brute_force
from tests.placement.test_placement import _edges, _node, _write

# The shared benchmark next to the checkout (../shared from the main checkout, ../../shared from a worktree).
BENCH = next((p / "shared" / "benchmarks" / "dnn-partitioning" for p in Path(__file__).resolve().parents
              if (p / "shared" / "benchmarks" / "dnn-partitioning").is_dir()), None)
needs_bench = pytest.mark.skipif(BENCH is None, reason="the shared benchmark is not checked out next to the repo")


def _training_case(tmp_path: Path, seed: int, *, forward: int = 3, orphans: int = 1, k: int = 2):
    """A random training-like input: forward nodes, a backward mate of each in its colour class
    (gradients flow back, activations are stashed), and backward nodes without a forward mate
    (floating classes) reading and feeding backward nodes."""
    rng = random.Random(seed)
    pairs, nodes = set(), []
    for v in range(1, forward):
        for u in rng.sample(range(v), rng.randint(1, min(2, v))):
            pairs.add((u, v))
    for i in range(forward):
        nodes.append(_node(i, rng.choice([1.0, 2.0, 4.0]), rng.choice([3.0, 6.0, 9.0]), size=rng.choice([1, 2]),
                           color=i, on_fpga=rng.random() > 0.1))
        nodes.append(_node(forward + i, rng.choice([1.0, 2.0]), rng.choice([3.0, 6.0]), size=rng.choice([0, 1]),
                           color=i, backward=True))
        pairs.add((i, forward + i))  # the stashed activation
    for u, v in list(pairs):
        if u < forward and v < forward:
            pairs.add((forward + v, forward + u))  # the gradient
    backward = list(range(forward, 2 * forward))
    for o in range(2 * forward, 2 * forward + orphans):
        nodes.append(_node(o, rng.choice([0.5, 1.0, 3.0]), rng.choice([1.0, 5.0]), size=rng.choice([0, 1]),
                           backward=True))
        pairs.add((rng.choice(backward), o))
        if rng.random() < 0.6:
            pairs.add((o, rng.choice(backward)))
        backward.append(o)
    n = len(nodes)
    # A backward edge into an orphan may close a cycle only through backward nodes: drop such edges.
    pairs = {(u, v) for u, v in pairs if u != v}
    cost = {i: rng.choice([0.0, 0.5, 1.5, 3.0]) for i in range(n)}
    path = _write(tmp_path, nodes, _edges(sorted(pairs), cost), k=k, max_size=rng.choice([3, 5]),
                  name=f"case{seed}.json")
    return read_placement(path)


def _inference_case(tmp_path: Path, seed: int, n: int = 6):
    rng = random.Random(seed)
    pairs = sorted({(u, v) for v in range(1, n) for u in rng.sample(range(v), rng.randint(1, min(3, v)))})
    cost = {i: rng.choice([0.0, 0.5, 1.5, 3.0]) for i in range(n)}
    nodes = [_node(i, rng.choice([1.0, 2.0, 4.0]), rng.choice([3.0, 6.0, 9.0]), size=rng.choice([1, 2]),
                   on_fpga=rng.random() > 0.15) for i in range(n)]
    return read_placement(_write(tmp_path, nodes, _edges(pairs, cost), k=2, max_size=5, name=f"inf{seed}.json"))


@pytest.mark.parametrize("seed", range(8))
def test_exact_dp_matches_brute_force(tmp_path, seed):
    problem = _inference_case(tmp_path, seed) if seed % 2 else _training_case(tmp_path, seed, orphans=0)
    want = _brute_force(problem)
    got = placement_ideal_dp(problem)
    assert got.exact, got.note
    assert placement_violations(problem, got.devices) == []
    assert max(placement_loads(problem, got.devices)) == pytest.approx(want, abs=1e-5)
    assert got.bound_units / time_scale(problem) <= want + 1e-9
    assert got.bound_units / time_scale(problem) == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("seed", range(8))
def test_floating_classes_bound_is_sound(tmp_path, seed):
    # Orphan backward nodes float; a limit below the ideals with them, at those without, takes
    # the relaxation (the bound) and the restriction (the plan).
    problem = _training_case(tmp_path, 100 + seed, forward=3, orphans=2)
    g = class_graph(problem)
    ordered = [c for c in g if g.degree(c) > 0]
    assert len(ordered) < g.number_of_nodes()
    fits = len(_ideals(g, ordered, 10**6, None))
    got = placement_ideal_dp(problem, limit=fits)
    assert not got.exact and got.ideals == fits
    want = _brute_force(problem)
    assert got.bound_units / time_scale(problem) <= want + 1e-9
    if got.devices is not None:
        assert placement_violations(problem, got.devices) == []
        assert max(placement_loads(problem, got.devices)) >= want - 1e-9
        # The whole graph's DP is exact on it.
    assert placement_ideal_dp(problem).bound_units / time_scale(problem) == pytest.approx(want, abs=1e-5)


def test_pair_loads_are_the_cost_model(tmp_path):
    # Every pair I < J of ideals: the accelerator running J \ I pays what `scaled_loads` says.
    problem = _training_case(tmp_path, 7, forward=6, orphans=0)
    classes = problem.classes()
    g = class_graph(problem)
    core = list(g)
    member = _bits(_ideals(g, core, 10**6, None), len(core))
    subset = proper_subsets(member)
    index = {c: k for k, c in enumerate(core)}
    status = {i: index[c] for c in core for i in classes[c]}
    succ = {i: [v for u, v in problem.edges if u == i] for i in problem.nodes}
    units = scaled_costs(problem)
    seg_f, seg_c = _pair_loads(problem, member, subset, [classes[c] for c in core], status, succ, units, None)
    checked = 0
    for i, j in zip(*np.nonzero(subset)):
        inside = sorted(n for k in np.flatnonzero(member[j] & ~member[i]) for n in classes[core[k]])
        rest = sorted(set(problem.nodes) - set(inside))
        devices = [("fpga", inside), ("fpga", rest)] if rest else [("fpga", inside)]
        fpga_load = scaled_loads(problem, devices, *units[:2], units[3])[0]
        fits = not any("accelerator 0" in v for v in placement_violations(problem, devices))
        assert seg_f[i, j] == (fpga_load if fits else 1 << 60)
        assert seg_c[i, j] == sum(units[1][n] for n in inside)
        checked += 1
    assert checked > 20


def test_capped_or_late_dp_proves_nothing(tmp_path):
    problem = _inference_case(tmp_path, 3)
    capped = placement_ideal_dp(problem, limit=2)
    assert capped.devices is None and capped.bound_units == 0 and "more than 2 ideals" in capped.note
    late = placement_ideal_dp(problem, deadline=time.perf_counter() - 1)
    assert late.devices is None and late.bound_units == 0 and "deadline" in late.note


def test_solve_placement_skips_cp_sat_when_the_dp_is_exact(tmp_path):
    problem = _inference_case(tmp_path, 5)
    got = solve_placement(problem, time_limit_s=10)
    assert (got.plan_engine, got.bound_engine, got.status) == ("ideal-dp", "ideal-dp", "OPTIMAL")
    assert "cpsat_seconds" not in got.stats
    assert got.max_load == pytest.approx(_brute_force(problem), abs=1e-5)


def test_cli_gap_and_engines(tmp_path, capsys):
    problem_path = tmp_path / "inf1.json"
    _inference_case(tmp_path, 1)
    assert main(["placement", str(problem_path), "--gap", "0.01", "--time-limit", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planEngine"] == "ideal-dp" and out["boundEngine"] == "ideal-dp"
    assert main(["placement", str(problem_path), "--gap", "1.5"]) == 2
    assert "--gap must be a fraction in [0, 1)" in capsys.readouterr().err
    with pytest.raises(HetpartError, match="--gap"):
        solve_placement(read_placement(problem_path), gap=-0.1)


# The authors' optima (benchmark README): the DP alone reaches them, with bounds within rounding.
@needs_bench
@pytest.mark.parametrize("name, optimum", [
    ("LayerGraphs/bert24_training", 41.745812),
    ("LayerGraphs/resnet50_training", 78.631813),
    ("OperatorGraphs/resnet50_inference", 124.348850),
    ("OperatorGraphs/bert_l-6_inference", 29.579506),
])
def test_known_optima(name, optimum):
    problem = read_placement(BENCH / f"{name}.json")
    got = placement_ideal_dp(problem)
    assert got.exact
    load = max(placement_loads(problem, got.devices))
    assert load == pytest.approx(optimum, abs=1e-6)
    assert load - 1e-4 <= got.bound_units / time_scale(problem) <= load


@pytest.mark.parametrize("seed", range(3))
def test_known_placement_prunes_but_loses_nothing(tmp_path, seed):
    # A known placement (every node on the CPU) prunes the stages above it; the optimum stays,
    # the bound stays sound, and the known one is kept only when nothing better is found.
    problem = _training_case(tmp_path, 200 + seed, forward=3, orphans=1)
    want = _brute_force(problem)
    on_cpu = [("cpu", sorted(problem.nodes))]
    exact = placement_ideal_dp(problem, known=on_cpu)
    assert exact.exact and exact.bound_units / time_scale(problem) == pytest.approx(want, abs=1e-5)
    g = class_graph(problem)
    fits = len(_ideals(g, [c for c in g if g.degree(c) > 0], 10**6, None))
    relaxed = placement_ideal_dp(problem, limit=fits, known=on_cpu)
    assert relaxed.bound_units / time_scale(problem) <= want + 1e-9
    assert relaxed.load_units <= max(placement_loads(problem, on_cpu)) * time_scale(problem)
    assert (relaxed.plan_engine == "order-dp") == (relaxed.devices == on_cpu)


def test_cp_sat_bound_above_a_checked_placement_is_dropped(tmp_path, monkeypatch):
    # A CP-SAT bound above the load of a placement the checker accepts proves nothing (its model
    # has lost that placement): the answer keeps the placement, drops the bound, and says so.
    from ortools.sat.python import cp_model

    import hetpart.placement.solve as placement_solve
    from hetpart.placement.ideals import IdealPlacement

    problem = _inference_case(tmp_path, 2)
    monkeypatch.setattr(placement_solve, "placement_ideal_dp", lambda problem, **kw: IdealPlacement(
        None, None, 0, False, 0, "not run", 0.0))
    monkeypatch.setattr(cp_model.CpSolver, "best_objective_bound", property(lambda self: 1e18))
    got = solve_placement(problem, time_limit_s=10)
    assert placement_violations(problem, got.devices) == []
    assert got.stats["cpsat_bound_unsound"] == 1.0
    assert (got.status, got.lower_bound) == ("FEASIBLE", 0.0)
