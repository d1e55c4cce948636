"""Issue 17: the false OPTIMAL of `hetpart placement` (NOTE [int32 activities]) and its certificates."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.partitioner import TIME_NS, SolveOptions, certificate, solve, verify_plan
from hetpart.partitioner import placement as pl
from hetpart.partitioner.placement import (
    PlacementNode,
    PlacementProblem,
    placement_violations,
    solve_placement,
)

from partition_cases import brute_force, random_problem
from placement_cases import brute_force_placement


def int32_case() -> PlacementProblem:
    """One accelerator and a CPU five times slower; the CPU latencies add up to 2,147.48 (2**31 units
    at the old fixed scale of 1e6): OR-Tools' presolve "proved" 429.5 where 371.296729 exists."""
    fpga = [122.42757, 124.434579, 74.259346, 108.378505]
    cpu = [612.13785, 622.172897, 371.296729, 541.892523]
    nodes = {i: PlacementNode(i, cpu[i], fpga[i], 0.0, True, False, i) for i in range(4)}
    return PlacementProblem(nodes=nodes, edges=[(0, 1), (0, 2), (1, 3)], cost={0: 1.0, 1: 1.0, 2: 0.006103, 3: 0.0},
                            max_fpgas=1, max_cpus=1, max_size_bytes=1e9, name="int32")


@pytest.mark.parametrize("presolve", [True, False])
def test_int32_case_is_solved_to_its_brute_force_optimum(presolve):
    problem = int32_case()
    want = brute_force_placement(problem)
    assert want == pytest.approx(371.296729)
    got = solve_placement(problem, time_limit_s=10, params={"cp_model_presolve": presolve}, ideal_dp=False)
    assert got.lower_bound <= want + 1e-9
    assert got.max_load == pytest.approx(want)
    assert got.status == "OPTIMAL"


def test_time_scale_keeps_every_load_below_int32():
    problem = int32_case()
    fpga, cpu, _, cost = pl._scaled(problem)
    most = sum(max(fpga[i], cpu[i]) for i in problem.nodes) + sum(cost.values())
    assert most <= pl._ACTIVITY_MAX
    assert pl._time_scale(problem) < pl._SCALE  # this case needs the coarser scale
    small = PlacementProblem(nodes={0: PlacementNode(0, 1.0, 1.0, 0.0, True, False, 0)}, edges=[], cost={0: 0.0},
                             max_fpgas=1, max_cpus=1, max_size_bytes=1.0)
    assert pl._time_scale(small) == pl._SCALE


def test_memory_units_exact_over_the_gcd_else_relaxed():
    sizes = [3 * 2**30, 2**31, 2**30]  # 6 GiB together: over int32 in bytes
    units, limit, exact = pl._memory_units(sizes, 4.5 * 2**30)
    assert exact and units == [3, 2, 1] and limit == 4
    odd = [2**31 + 1, 2**31 + 2, 3.5]
    units, limit, exact = pl._memory_units(odd, 2**32 + 3)
    assert not exact and sum(units) <= pl._ACTIVITY_MAX
    # A relaxation: every subset that fits in bytes fits in units.
    for r in range(4):
        for sub in itertools.combinations(range(3), r):
            if sum(odd[i] for i in sub) <= 2**32 + 3:
                assert sum(units[i] for i in sub) <= limit


def test_memory_over_int32_bytes_matches_brute_force():
    # Node sizes of GiB (the sum passes 2**31 bytes), a limit that lets two of the three share.
    sizes = [2**31 + 1, 2**30 + 3, 2**30 + 5]
    nodes = {i: PlacementNode(i, 10.0, [4.0, 3.0, 2.0][i], sizes[i], True, False, i) for i in range(3)}
    problem = PlacementProblem(nodes=nodes, edges=[(0, 1), (1, 2)], cost={0: 0.5, 1: 0.5, 2: 0.0}, max_fpgas=2,
                               max_cpus=1, max_size_bytes=2**31 + 2**30 + 4, name="mem")
    want = brute_force_placement(problem)
    got = solve_placement(problem, time_limit_s=10)
    assert placement_violations(problem, got.devices) == []
    assert got.max_load == pytest.approx(want)
    assert got.lower_bound <= want + 1e-9


# --- Checked certificates (NOTE [checked certificates]).


@pytest.mark.parametrize("brute_max", [certificate.BRUTE_MAX, 0])  # brute force, then CP-SAT without presolve
def test_check_refutes_issue_17s_claim(monkeypatch, brute_max):
    # Back to the fixed scale of 1e6 (no int32 cap): presolve claims a false OPTIMAL again
    # (429.5 with the order DP's hint, 1164.1 without it; the optimum is 371.3).
    monkeypatch.setattr(pl, "_ACTIVITY_MAX", 2**62)
    monkeypatch.setattr(certificate, "BRUTE_MAX", brute_max)
    problem = int32_case()
    # CP-SAT's answer alone: solve_placement's ideal DP would solve the case before CP-SAT
    # starts, and its order-DP placement (371.3) would expose the claim before the check does.
    mdl = dataclasses.replace(pl._placement_model(problem), hint=None)
    trusted = pl._solve_placement_cpsat(problem, time_limit_s=10, workers=1, seed=0, params=None, mdl=mdl)
    assert trusted.status == "OPTIMAL" and trusted.lower_bound > 400, "claimed above the optimum, 371.3"
    assert trusted.certificate.bound_source == "cpsat_objective_bound" and trusted.certificate.verdict == "not_checked"
    checked = certificate.check_placement(problem, trusted, time_limit_s=10)
    cert = checked.certificate
    assert cert.verdict == "refuted" and cert.checked_by == ("brute_force" if brute_max else "cpsat_no_presolve")
    assert checked.status == "FEASIBLE" and "downgraded" in cert.warning
    assert checked.max_load == pytest.approx(371.296729) and checked.lower_bound <= checked.max_load
    assert placement_violations(problem, checked.devices) == []


def test_a_cpsat_bound_above_a_checked_placement_is_dropped(monkeypatch):
    # The same false claim with the order DP's placement beside it: CP-SAT's bound is above a
    # placement the checker accepts, so it proves nothing (stats flag it) and nothing claims OPTIMAL.
    monkeypatch.setattr(pl, "_ACTIVITY_MAX", 2**62)
    problem = int32_case()
    got = solve_placement(problem, time_limit_s=10, check_certificate=False, ideal_dp=False)
    assert got.status == "FEASIBLE" and got.stats["cpsat_bound_unsound"] == 1.0
    assert got.lower_bound <= 371.296729 <= got.max_load


def test_check_confirms_a_sound_claim():
    got = solve_placement(int32_case(), time_limit_s=10, check_certificate=True)
    assert got.status == "OPTIMAL"
    assert got.certificate.verdict == "confirmed" and got.certificate.checked_by == "brute_force"
    assert got.to_json(int32_case())["certificate"]["verdict"] == "confirmed"


def test_placement_cli_is_right_without_the_int32_fix(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pl, "_ACTIVITY_MAX", 2**62)
    problem = int32_case()
    data = {"maxSizePerFPGA": 1e9, "maxFPGAs": 1, "maxCPUs": 1,
            "nodes": [{"id": i, "supportedOnFpga": 1, "cpuLatency": n.cpu_latency, "fpgaLatency": n.fpga_latency}
                      for i, n in problem.nodes.items()],
            "edges": [{"sourceId": u, "destId": v, "cost": problem.cost[u]} for u, v in problem.edges]}
    path = tmp_path / "int32.json"
    path.write_text(json.dumps(data))
    # Through the CLI the ideal DP solves it exactly before CP-SAT: the optimum, confirmed.
    assert main(["placement", str(path), "--check-certificate"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["status"] == "OPTIMAL" and out["maxLoad"] == pytest.approx(371.296729)
    assert out["boundEngine"] == "ideal-dp" and out["certificate"]["verdict"] == "confirmed", out
    assert "warning" not in captured.err
    assert main(["placement", str(path), "--no-check-certificate"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["maxLoad"] == pytest.approx(371.296729) and out["certificate"]["verdict"] == "not_checked"


def _slow_ops(seed: int):
    """random_problem(seed) with op times of 0.03-1.2 s: stage sums pass 2**31 ns (NOTE [int32 activities])."""
    p = random_problem(seed)
    g = p.graph.copy()
    for v in g.nodes:
        g.nodes[v][TIME_NS] = {t: ns * 30_000_000 for t, ns in g.nodes[v][TIME_NS].items()}
    return dataclasses.replace(p, graph=g)


def test_partition_cpsat_claim_is_sound_on_ops_of_seconds():
    # cpsat.py's side of NOTE [int32 activities]: presolve without its inclusion step.
    for seed in (94, 105, 115, 116):  # each claimed a bound above the optimum before
        p = _slow_ops(seed)
        plan = solve(p, time_limit_s=10, check_certificate=False, run_ideal_dp=False)
        assert plan.stats.presolve_inclusion_off
        assert plan.lower_bound_ns <= brute_force(p) <= plan.value_ns


def test_partition_claim_from_cpsat_refuted_and_downgraded():
    # The same presolve bug in `partition`'s model with the workaround taken out: CP-SAT alone
    # claims a bound above the optimum, and the check catches it.
    unsafe = SolveOptions(int32_safe_ns=2**62, run_ideal_dp=False)
    p = _slow_ops(115)
    optimum = brute_force(p)
    trusted = solve(p, unsafe, time_limit_s=10, check_certificate=False)
    assert trusted.solver_status == "OPTIMAL" and trusted.lower_bound_ns > optimum
    assert trusted.certificate.bound_source == "cpsat_objective_bound"
    checked = solve(p, unsafe, time_limit_s=10, check_certificate=True)
    verify_plan(p, checked)
    assert checked.certificate.verdict == "refuted" and checked.certificate.checked_by == "brute_force"
    assert checked.solver_status == "FEASIBLE" and checked.lower_bound_ns <= optimum == checked.value_ns


def test_partition_certificates_name_their_source_and_are_confirmed():
    for seed in range(4):
        p = random_problem(seed)
        try:
            plan = solve(p, time_limit_s=10, check_certificate=True)
        except HetpartError:
            continue  # no plan fits
        assert plan.certificate.bound_source in {"cpsat_objective_bound", "ideal_dp", "sequence", "stage_sum",
                                                 "lp_work", "single_op"}
        if plan.solver_status in ("OPTIMAL", "WITHIN_GAP"):
            assert plan.certificate.verdict == "confirmed"
            assert plan.certificate.reproved_bound >= plan.lower_bound_ns
