"""NOTE [quick pipelines bound] against brute force: at most the least step of every plan of data-parallel pipelines
(on test_pipeline_search's small problems and test_tp_pipelines' slot problems), and exact where it should be."""

from __future__ import annotations

import networkx as nx
import pytest

from hetpart.partitioner import MEM_BYTES, OUT_BYTES, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.pipeline_bounds import pipelines_lower_bound
from hetpart.partitioner.pipeline_quick_bound import quick_pipelines_bound
from hetpart.partitioner.problem import Problem

from test_pipeline_search import brute_pipelines, small_problem
from test_tp_pipelines import slot_problems


@pytest.mark.parametrize("seed", range(0, 24, 2))
def test_quick_bound_against_brute_force(seed):
    """bound <= the optimum over every plan; the one-pipeline bound <= the bound over one pipeline's plans."""
    problem, M = small_problem(seed)
    opt = brute_pipelines(problem, M)
    quick = quick_pipelines_bound(problem, M)
    assert quick.bound_ns > 0 and quick.seconds < 1.0
    if opt is not None:
        assert quick.bound_ns <= opt, (quick, opt)
        assert quick.bound_ns <= quick.one_pipeline_ns


@pytest.mark.parametrize("seed", [0, 2, 6, 10, 12, 16, 18, 24, 26])
def test_quick_bound_of_slot_problems_against_brute_force(seed):
    """Per degree of test_tp_pipelines' slot problems: at most the optimum, and weaker than nothing: above 0."""
    problems, M, _ = slot_problems(seed)
    for t, p in problems.items():
        opt = brute_pipelines(p, M)
        quick = quick_pipelines_bound(p, M)
        assert quick.bound_ns > 0
        if opt is not None:
            assert quick.bound_ns <= opt, (t, quick, opt)


def test_one_device_is_exact_and_the_work_term_counts_every_microbatch():
    """One node on one device, M microbatches: the step is M times the node's time, and the bound is exactly that
    (the work term); with two such devices and room for two pipelines, half of it (each device runs half)."""
    g = nx.DiGraph()
    g.add_node("v", **{TIME_NS: {"gpu": 100}, MEM_BYTES: 0, OUT_BYTES: 0, WEIGHTS: ("w",)})

    def problem(devices: int) -> Problem:
        return Problem(graph=g, weights={"w": 10}, devices=[Device(f"d{i}", "gpu", "m", 1000) for i in range(devices)],
                       intra_node_links={"m": Link(100, 1)}, network=Link(10, 10))

    assert quick_pipelines_bound(problem(1), 4).bound_ns == brute_pipelines(problem(1), 4) == 400
    assert quick_pipelines_bound(problem(2), 4).bound_ns == brute_pipelines(problem(2), 4) == 200


def test_a_model_no_pipeline_holds_gives_no_bound():
    """Weights beyond every device's memory together: no plan at all, the bound 0 and the note says why (as the LP
    bound's), not a number no plan reaches."""
    g = nx.DiGraph()
    g.add_node("v", **{TIME_NS: {"gpu": 100}, MEM_BYTES: 0, OUT_BYTES: 0, WEIGHTS: ("w",)})
    p = Problem(graph=g, weights={"w": 5000}, devices=[Device(f"d{i}", "gpu", "m", 1000) for i in range(2)],
                intra_node_links={"m": Link(100, 1)}, network=Link(10, 10))
    got = quick_pipelines_bound(p, 2)
    assert got.bound_ns == 0 and "no set of pipelines holds the model" in got.note
    assert brute_pipelines(p, 2) is None and pipelines_lower_bound(p, 2).bound_ns == 0
