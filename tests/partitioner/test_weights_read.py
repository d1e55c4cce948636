"""`Problem.weights_read`, the one definition of the weights a group of nodes holds (each once), and its three
readers: `stage_weights` (the re-plan's bytes), `pipelines.weight_holders` (the gradient sync's buckets) and the
pipeline baselines' `_Blocks` (their memory counts). Pinned on a small chain against a brute force over every
split of it, computed from the nodes' attributes without them."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import networkx as nx
import pytest

from hetpart.partitioner.evaluate import evaluate
from hetpart.partitioner.pipeline_baselines import _Blocks
from hetpart.partitioner.pipelines import weight_holders
from hetpart.partitioner.problem import (
    MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link, Problem, stage_weights,
)

# a reads wa; b reads wa (shared with a) and wb; c reads nothing; d reads wc twice and wb (shared with b)
READS = {"a": ("wa",), "b": ("wb", "wa"), "c": (), "d": ("wc", "wb", "wc")}
ORDER = ["a", "b", "c", "d"]
DEVICES = ["g0", "g1", "g2", "g3"]


@pytest.fixture(scope="module")
def problem() -> Problem:
    g = nx.DiGraph()
    for v in ORDER:
        g.add_node(v, **{TIME_NS: {"gpu": 10}, MEM_BYTES: 1, OUT_BYTES: 4, WEIGHTS: READS[v],
                         PIN: PIN_FIRST if v == "a" else PIN_LAST if v == "d" else None})
    g.add_edges_from(zip(ORDER, ORDER[1:]))
    return Problem(graph=g, weights={"wa": 100, "wb": 20, "wc": 3},
                   devices=[Device(d, "gpu", "n0", 1 << 30) for d in DEVICES],
                   intra_node_links={"n0": Link(300_000, 2_000)}, network=Link(12_500, 10_000))


def _by_hand(nodes) -> set[str]:
    """The brute force: every name each node's attribute lists, once."""
    out: set[str] = set()
    for v in nodes:
        for w in READS[v]:
            out.add(w)
    return out


def _splits():
    """Every split of the chain into consecutive stages: stage_of per cut set."""
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, 4), k) for k in range(4)):
        yield {v: sum(i >= c for c in cuts) for i, v in enumerate(ORDER)}


def test_weights_read_pins_each_weight_once_in_any_order(problem):
    assert problem.weights_read(["a"]) == {"wa"} and problem.weights_read(["c"]) == set()
    assert problem.weights_read(["d"]) == {"wc", "wb"}  # read twice by one node: once
    assert problem.weights_read(["a", "b"]) == problem.weights_read(iter(["b", "a"])) == {"wa", "wb"}
    assert problem.weights_read([]) == set() and problem.weights_read(ORDER) == {"wa", "wb", "wc"}
    for k in range(len(ORDER) + 1):  # every subset against the brute force
        for nodes in itertools.combinations(ORDER, k):
            assert problem.weights_read(nodes) == _by_hand(nodes)


def test_the_three_readers_agree_with_the_brute_force_on_every_split(problem):
    for stage_of in _splits():
        stages = sorted(set(stage_of.values()))
        members = {k: [v for v in ORDER if stage_of[v] == k] for k in stages}
        assert stage_weights(problem, stage_of) == {k: _by_hand(members[k]) for k in stages}
        assert list(stage_weights(problem, stage_of)) == stages  # the order the stages first appear in
        slots = DEVICES[:len(stages)]
        costs = evaluate(problem, stage_of, slots)
        holders = weight_holders(problem, [SimpleNamespace(plan=SimpleNamespace(stages=costs))])
        assert holders == {w: [slots[k] for k in stages if w in _by_hand(members[k])] for w in ("wa", "wb", "wc")}
        block = [stage_of[v] for v in ORDER]
        sums = _Blocks(problem, ORDER, block, len(stages))
        assert sums.read_in == [_by_hand(members[k]) for k in stages]
        # `exact` iff no weight is read in two blocks (brute force); the negative control is the one block
        shared = any(_by_hand(members[i]) & _by_hand(members[j]) for i, j in itertools.combinations(stages, 2))
        assert sums.exact is (not shared)
        _, held, _ = sums.of("gpu")
        # each block's held bytes count its weights once (in inference `held_weight_bytes` is a weight's bytes)
        assert [b - a for a, b in zip(held, held[1:])] == [sum(problem.weights[w] for w in _by_hand(members[k]))
                                                           for k in stages]
    assert _Blocks(problem, ORDER, [0, 0, 0, 0], 1).exact and not _Blocks(problem, ORDER, [0, 1, 1, 1], 2).exact
