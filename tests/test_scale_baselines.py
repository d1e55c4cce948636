"""The device-order search of `equal-layers-best-order` costs each order as `evaluate` does
(baselines._OrderCost: only the devices change from order to order), and a swap of two
positions as the whole order costs."""

import dataclasses
import random
import sys
from pathlib import Path

import pytest

from hetpart.partitioner.baselines import _OrderCost
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import Training

sys.path.insert(0, str(Path(__file__).parent / "partitioner"))  # test_costs imports its neighbour partition_cases
from test_costs import _problem  # noqa: E402 - random problems of every link kind, with training


@pytest.mark.parametrize("seed", range(30))
def test_an_order_costs_what_evaluate_says(seed):
    p = _problem(seed)
    rng = random.Random(seed)
    order = p.node_order()
    names = [d.name for d in p.devices]
    for _ in range(4):
        S = rng.randint(1, min(len(names), len(order)))
        cuts = sorted(rng.sample(range(1, len(order)), S - 1)) if S > 1 else []
        stage_of = {v: sum(i >= c for c in cuts) for i, v in enumerate(order)}
        if len(set(stage_of.values())) < S:
            continue
        # Capacities that bind for some orders: the over-memory flag must match too.
        cap = sorted(s.memory_bytes for s in evaluate(p, stage_of, names[:S]))[S // 2]
        p.devices = [dataclasses.replace(d, capacity_bytes=cap + rng.choice([0, 1]) * rng.randint(0, 5))
                     for d in p.devices]
        cost = _OrderCost(p, stage_of, S)
        for _ in range(5):
            devices = rng.sample(names, len(names))
            st = evaluate(p, stage_of, devices[:S])
            assert cost(devices) == (int(any(s.memory_bytes > s.capacity_bytes for s in st)), bottleneck_ns(st))
            slowest, over = cost.stages(devices)
            for i in range(S):
                for j in range(i + 1, len(names)):
                    trial = devices[:]
                    trial[i], trial[j] = trial[j], trial[i]
                    assert cost.swapped(devices, slowest, over, i, j) == cost(trial), (i, j)


@pytest.mark.parametrize("seed", range(3))
def test_a_swap_costs_what_the_whole_order_costs_on_many_stages(seed):
    from partition_cases import random_large

    # 12 stages on 14 devices over 7 machines: most swaps leave the slowest stage alone.
    p = random_large(seed, 60, num_devices=14)
    order = p.node_order()
    stage_of = {v: i * 12 // len(order) for i, v in enumerate(order)}
    cost = _OrderCost(p, stage_of, 12)
    rng = random.Random(seed)
    names = [d.name for d in p.devices]
    for _ in range(3):
        devices = rng.sample(names, len(names))
        slowest, over = cost.stages(devices)
        for i in range(12):
            for j in range(i + 1, len(names)):
                trial = devices[:]
                trial[i], trial[j] = trial[j], trial[i]
                st = evaluate(p, stage_of, trial[:12])
                assert cost.swapped(devices, slowest, over, i, j) == cost(trial) == (
                    int(any(s.memory_bytes > s.capacity_bytes for s in st)), bottleneck_ns(st))


@pytest.mark.parametrize("seed", range(24))
def test_the_list_order_prefixes_in_one_pass_are_the_loop_over_prefixes(seed):
    """dp._prefix_chain (inference, GPipe) gives the plan of the best prefix the loop of
    `fixed_device_dp` over every prefix gives: the same cuts, devices and bottleneck."""
    import numpy as np

    from hetpart.partitioner.dp import fixed_device_dp, list_order_segments, order_tables, valid_cuts

    p = _problem(seed) if seed % 2 else __import__("partition_cases").random_large(seed, 30, num_devices=6)
    if p.training is not None and p.training.schedule == "1f1b":
        p.training = dataclasses.replace(p.training, schedule="gpipe")
    if seed % 4 == 0:  # memory that binds (a GPipe stash of 3 microbatches): some prefixes do not fit
        p.training = Training("gpipe", 3, {w: 50 for w in p.weights})
        p.devices = [dataclasses.replace(d, capacity_bytes=c) for d, c in
                     zip(p.devices, random.Random(seed).choices([600, 1500, 4000, 10**9], k=len(p.devices)))]
    tab = order_tables(p)
    P = np.arange(tab.n + 1)
    inner = P[valid_cuts(tab)[P]]
    names = [s.name for s in p.slots[: min(len(p.devices), p.max_stages or len(p.devices))]]
    loop = None
    for S in range(1, len(names) + 1):
        if len(inner) < S - 1:
            break
        seg = fixed_device_dp(p, tab, names[:S], [np.array([0]), *[inner] * (S - 1), np.array([tab.n])])
        if seg is not None and (loop is None or seg.dp_ns < loop.dp_ns):
            loop = seg
    got = list_order_segments(p, tab, P, refine=False)
    assert (got is None) == (loop is None)
    if got is not None:
        assert (got.cuts, got.devices, got.dp_ns) == (loop.cuts, loop.devices, loop.dp_ns)
