"""Issue 17: the false OPTIMAL of `hetpart placement` (NOTE [int32 activities]) and its certificates."""

from __future__ import annotations

import itertools

import pytest

from hetpart.partitioner import placement as pl
from hetpart.partitioner.placement import (
    PlacementNode,
    PlacementProblem,
    placement_violations,
    solve_placement,
)

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
    got = solve_placement(problem, time_limit_s=10, params={"cp_model_presolve": presolve})
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
