"""The device-order search of `equal-layers-best-order` costs each order as `evaluate` does
(baselines._order_cost: only the devices change from order to order)."""

import dataclasses
import random
import sys
from pathlib import Path

import pytest

from hetpart.partitioner.baselines import _order_cost
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate

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
        cost = _order_cost(p, stage_of, S)
        for _ in range(5):
            devices = rng.sample(names, len(names))
            st = evaluate(p, stage_of, devices[:S])
            assert cost(devices) == (int(any(s.memory_bytes > s.capacity_bytes for s in st)), bottleneck_ns(st))
