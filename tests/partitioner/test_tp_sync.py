"""NOTE [mixed-degree gradient sync] (partitioner/tp_sync.py), torch-free: the slice groups sum every weight's
gradient exactly, checked by simulating them on plain lists of numbers against the sum of the stages' whole
gradients (random degrees 1-8, splits along a dim of 1-3 chunks, replicated copies); split dims that differ are
refused; the cost over slots of two degrees is the rings of the slices, priced by hand."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import MEM_BYTES, OUT_BYTES, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.costs import allreduce_ns
from hetpart.partitioner.pipelines import fixed_pipelines, grad_sync_ns, mixed_sync_buckets
from hetpart.partitioner.problem import Problem, Training
from hetpart.partitioner.problem_json import problem_from_json, problem_to_json
from hetpart.partitioner.tp_sync import HeldBy, TPSyncLayout, slice_buckets, weight_slices


def _shard(whole: list[float], chunks: int, degree: int, j: int) -> list[float]:
    """Rank j's part of a 1-D tensor split in `degree` within each of its `chunks` parts (as codegen's
    `shard_tensor` along dim 0), written here independently of the slices."""
    n = len(whole) // chunks
    return [x for c in range(chunks) for x in whole[c * n:(c + 1) * n][j * n // degree:(j + 1) * n // degree]]


def _simulate(stages: list[tuple[int, bool]], chunks: int, length: int, rng: random.Random) -> None:
    """Stages (degree, splits the weight?) each with a random whole gradient; every rank's part after the
    slice all-reduces must be its part of the sum of the stages' gradients."""
    grads = [[rng.randint(-9, 9) * 1.0 for _ in range(length)] for _ in stages]
    total = [sum(g[i] for g in grads) for i in range(length)]
    first, held, local = 0, [], {}
    for (t, split), g in zip(stages, grads):
        ranks = tuple(range(first, first + t))
        first += t
        held.append(HeldBy(ranks, (0, chunks) if split else None))
        for j, r in enumerate(ranks):  # a replicated copy: whole, divided by its stage's degree
            local[r] = (_shard(g, chunks, t, j), t, j, split) if split else ([x / t for x in g], t, j, split)
    for ranks, slices in slice_buckets(weight_slices({"w": held})).items():
        (s,) = slices
        parts = {}
        for r in ranks:  # each rank's piece of slice s in each chunk of its local tensor
            values, t, j, split = local[r]
            pieces, idx = (s.of // t, s.index - j * (s.of // t)) if split else (s.of, s.index)
            n = len(values) // chunks
            parts[r] = [(c * n + idx * n // pieces, c * n + (idx + 1) * n // pieces) for c in range(chunks)]
        summed = [sum(local[r][0][a + i] for r in ranks for a, _ in [parts[r][c]])
                  for c in range(chunks) for i in range(parts[ranks[0]][c][1] - parts[ranks[0]][c][0])]
        for r in ranks:
            flat = [i for a, b in parts[r] for i in range(a, b)]
            for i, v in zip(flat, summed):
                local[r][0][i] = v
    for r, (values, t, j, split) in local.items():
        want = _shard(total, chunks, t, j) if split else total
        if len(stages) > 1:
            assert values == pytest.approx(want), (stages, r)


@pytest.mark.parametrize("seed", range(40))
def test_slice_groups_sum_every_gradient_exactly(seed):
    rng = random.Random(seed)
    stages = [(rng.choice((1, 2, 4, 8)), rng.random() < 0.6) for _ in range(rng.randint(2, 4))]
    stages = [(t, split and t > 1) for t, split in stages]
    chunks = rng.randint(1, 3)
    _simulate(stages, chunks, chunks * 8 * rng.randint(1, 2), rng)


def test_a_rank_of_degree_t_joins_of_over_t_groups_and_each_slice_is_summed_once():
    held = {"w": [HeldBy((0, 1, 2, 3), (1, 1)), HeldBy((4, 5), (1, 1)), HeldBy((6,))]}
    slices = weight_slices(held)
    assert [(s.index, s.of, s.ranks) for s in slices] == [(0, 4, (0, 4, 6)), (1, 4, (1, 4, 6)), (2, 4, (2, 5, 6)),
                                                          (3, 4, (3, 5, 6))]
    assert sum(4 in s.ranks for s in slices) == 2 and sum(6 in s.ranks for s in slices) == 4
    assert weight_slices({"w": [HeldBy((0, 1), (0, 1))]}) == []  # one stage: nothing to sum


def test_split_dims_that_do_not_line_up_are_refused():
    with pytest.raises(HetpartError, match=r"split 'w' in different ways \(pipeline 0: dim 0, 3 chunk\(s\); "
                                           r"pipeline 1: dim 1, 1 chunk\(s\)\)"):
        weight_slices({"w": [HeldBy((0, 1), (0, 3), "pipeline 0"), HeldBy((2, 3), (1, 1), "pipeline 1")]})
    with pytest.raises(HetpartError, match="degrees must divide each other"):
        weight_slices({"w": [HeldBy((0, 1, 2), (0, 1)), HeldBy((3, 4), (0, 1))]})


def _two_degrees(training: bool = True) -> Problem:
    """Machine a: one TP-2 slot (gpu/tp2); machine b: two single gpus. Weight w (1000 bytes whole) split at TP 2,
    n (100 bytes) replicated."""
    g = nx.DiGraph()
    g.add_node("v", **{TIME_NS: {"gpu/tp2": 100, "gpu": 150}, WEIGHTS: ("w", "n"), MEM_BYTES: 0, OUT_BYTES: 0})
    devices = [Device("a/0+a/1", "gpu/tp2", "a", 10_000), Device("b/0", "gpu", "b", 10_000),
               Device("b/1", "gpu", "b", 10_000)]
    return Problem(graph=g, weights={"w": 500, "n": 100}, devices=devices,
                   intra_node_links={"a": Link(1000, 1), "b": Link(1000, 1)}, network=Link(100, 10),
                   training=Training("1f1b", 1, {"w": 1000, "n": 200}) if training else None,
                   tp_sync=TPSyncLayout({"gpu/tp2": 2}, {2: {"w": (0, 1)}}, {"w": 1000, "n": 100}))


def test_the_cost_over_two_degrees_is_the_rings_of_the_slices():
    p = _two_degrees()
    plan = fixed_pipelines(p, [["a/0+a/1"], ["b/0"]], [1, 1], time_limit_s=5)
    # w: slices 0 and 1 (500 bytes each) over (a rank j, b/0), 2 ranks over the network; n: one ring of the 3.
    assert mixed_sync_buckets(p, plan.pipelines) == {(("a/0+a/1", 0), ("b/0", 0)): 500,
                                                    (("a/0+a/1", 1), ("b/0", 0)): 500,
                                                    (("a/0+a/1", 0), ("a/0+a/1", 1), ("b/0", 0)): 100}
    net = p.network
    b0 = 2 * allreduce_ns(net, 500, 2) + allreduce_ns(net, 100, 3)  # b/0 joins all three rings
    assert plan.grad_sync_ns == b0 == 2 * (2 * 10 + 500 * 1000 // 100) + (4 * 10 + 134 * 1000 // 100)  # 4/3 of 100 B
    assert plan.iteration_ns == 150 + b0
    # Two single gpus on one machine: w is split nowhere, so it is one ring of its whole 1000 bytes over b's link.
    both_b = fixed_pipelines(p, [["b/0"], ["b/1"]], [1, 1], time_limit_s=5)
    assert both_b.grad_sync_ns == allreduce_ns(p.intra_node_links["b"], 1100, 2)
    assert grad_sync_ns(_two_degrees(training=False), plan.pipelines) == (0, 0)


def test_the_layout_survives_the_problem_s_json():
    p = _two_degrees()
    assert problem_from_json(problem_to_json(p)).tp_sync == p.tp_sync
