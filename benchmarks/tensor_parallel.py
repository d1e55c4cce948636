"""Predicted training iteration of a model per uniform tensor-parallel degree (issue 20), in hetpart's cost model.

    PYTHONPATH=. .venv/bin/python benchmarks/tensor_parallel.py [--model zoo:llama-70b] [--cluster preset:hetero-64]
        [--degrees 1,2,4,8] [--microbatches 4] [--time-limit 60]

Traces the model once on meta (bf16, sequence 2048, batch = microbatches), runs the sharding pass for
every degree, lowers one problem per degree (NOTE [tensor-parallel costs]) and solves each for the
`iteration` objective of NOTE [objectives] (sum of stage times + (M-1) x bottleneck, M microbatches), and
for the bottleneck (`throughput`, what `partition` optimises); prints value, proven bound and stage count.
"""

from __future__ import annotations

import argparse
import time

from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from hetpart.partitioner import solve
from hetpart.passes import lower_to_problem
from hetpart.passes.lower import TrainingSpec, group_of
from hetpart.passes.tensor_parallel import TP_META
from hetpart.passes.tp_lower import lower_tensor_parallel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:llama-70b")
    ap.add_argument("--cluster", default="preset:hetero-64")
    ap.add_argument("--degrees", default="1,2,4,8")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=60)
    args = ap.parse_args()
    degrees = tuple(int(t) for t in args.degrees.split(","))
    m = args.microbatches
    cluster = load_cluster(args.cluster)
    t0 = time.perf_counter()
    spec = ModelSpec(args.model, {"dtype": "bfloat16"}, m, 2048)
    a = analyze(spec, cluster, 1, echo=lambda s: None, mode="training", meta=True,
                tp_degrees=tuple(t for t in degrees if t > 1))
    groups = group_of(a.gm)
    base = lower_to_problem(a.gm, cluster, TrainingSpec("gpipe", m, 8), groups)
    print(f"{args.model} on {args.cluster}: traced and analysed in {time.perf_counter() - t0:.0f} s; "
          f"training, GPipe, {m} microbatch(es) of 1 x 2048 tokens")
    print("| TP degree | slots | objective | value ms | bound ms | gap | stages | status | solve s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in degrees:
        if t == 1:
            problem, slots = base, base.devices
        else:
            problem, slots = lower_tensor_parallel(base, a.gm, cluster, a.gm.meta[TP_META][t], groups, True)
        for objective in ("iteration", "throughput"):
            start = time.perf_counter()
            plan = solve(problem, time_limit_s=args.time_limit, objective=objective, microbatches=m)
            print(f"| {t} | {len(slots)} | {objective} | {plan.value_ns / 1e6:,.1f} | {plan.lower_bound_ns / 1e6:,.1f} "
                  f"| {plan.gap:.1%} | {len(plan.stages)} | {plan.solver_status} | {time.perf_counter() - start:.0f} |",
                  flush=True)


if __name__ == "__main__":
    main()
