"""NOTE [doubled GPipe shapes]: a GPipe shape of one kind that stashes fewer microbatches than its copies need
is solved again at twice its machines (half the layers a stage holds)."""

from __future__ import annotations

import time

import networkx as nx

from hetpart.partitioner import MEM_BYTES, OUT_BYTES, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.pipeline_search import Shape, machine_kinds, plan_pipelines
from hetpart.partitioner.pipeline_shape import doubled_shape
from hetpart.partitioner.problem import LAYER, Problem, Training


def cliff(schedule: str = "gpipe", M: int = 8) -> Problem:
    """8 layers of 100 bytes of weights and 10 of activations per microbatch; 16 one-GPU machines of 230 bytes
    (a stage of two layers holds one GPipe microbatch: 220; of one layer, 13) and 32 slow ones (4x the time)."""
    g = nx.DiGraph()
    for i in range(8):
        g.add_node(f"v{i}", **{TIME_NS: {"gpu": 100, "slow": 400}, MEM_BYTES: 10, OUT_BYTES: 1 if i < 7 else 0,
                               WEIGHTS: (f"w{i}",), LAYER: f"blocks.{i}"})
        if i:
            g.add_edge(f"v{i - 1}", f"v{i}")
    devices = ([Device(f"g{i}", "gpu", f"n{i}", 230) for i in range(16)]
               + [Device(f"s{i}", "slow", f"n{16 + i}", 230) for i in range(32)])
    return Problem(graph=g, weights={f"w{i}": 100 for i in range(8)}, devices=devices,
                   intra_node_links={f"n{i}": Link(1000, 0) for i in range(48)}, network=Link(1000, 0),
                   training=Training(schedule, M, {}))


def test_a_shape_that_stashes_too_few_microbatches_is_solved_at_twice_its_machines(monkeypatch):
    """Four GPUs (two layers a stage) run one microbatch each and the 16 GPU machines hold four such pipelines:
    no mix of the enumerated shapes (up to 6 machines, then 14, 28 and all 48) runs the 8 microbatches well --
    before, the plan was one pipeline of all 48 devices (1,528 ns against a bound of 1,151). Eight GPUs (one
    layer a stage) run four each: two of them take 1,220 ns. The LP's shapes, the join and stripe probes, which
    find the 8-GPU pipelines here by other routes, are left out: the shapes' loop must reach them itself."""
    import hetpart.partitioner.pipeline_search as search

    monkeypatch.setattr(search, "_lp_shapes", lambda *a: [])
    join, stripes = search.join_probe, search.stripe_probe
    monkeypatch.setattr(search, "join_probe", lambda *a, **k: join(*a[:7], time.perf_counter() - 1.0, *a[8:], **k))
    monkeypatch.setattr(search, "stripe_probe", lambda *a, **k: stripes(*a[:5], time.perf_counter() - 1.0, **k))
    p = cliff()
    kinds, _ = machine_kinds(p)
    assert Shape(machines=(8, 0)) not in search.enumerate_shapes(p, kinds)  # only the doubling reaches it
    plan = plan_pipelines(p, 8, time_limit_s=20)
    assert all(p.device(d).type == "gpu" for pipe in plan.pipelines for d in pipe.devices)
    assert min(pipe.microbatches for pipe in plan.pipelines) >= 2
    assert plan.iteration_ns - plan.lower_bound_ns < 0.1 * plan.iteration_ns  # within 10% of the bound


def test_doubling_only_one_kind_short_of_its_share_with_the_machines_there():
    p = cliff()
    kinds, _ = machine_kinds(p)
    assert doubled_shape(kinds, Shape(machines=(4, 0)), 1, 8) == Shape(machines=(8, 0))  # 4 copies need 2 each
    assert doubled_shape(kinds, Shape(machines=(4, 0)), 2, 8) is None  # they run their share
    assert doubled_shape(kinds, Shape(machines=(8, 0)), 1, 8) == Shape(machines=(16, 0))
    assert doubled_shape(kinds, Shape(machines=(16, 0)), 1, 8) is None  # no 32 GPU machines
    assert doubled_shape(kinds, Shape(machines=(4, 4)), 1, 8) is None  # two kinds
    assert doubled_shape(kinds, Shape(piece_kind=0, piece=(1,)), 1, 8) is None  # a piece
