"""Predicted training iteration of a model per uniform tensor-parallel degree (issue 20), in hetpart's cost model.

    PYTHONPATH=. .venv/bin/python benchmarks/tensor_parallel.py [--model zoo:llama-70b] [--cluster preset:hetero-64]
        [--degrees 1,2,4,8] [--microbatches 4] [--time-limit 60] [--objectives iteration,throughput] [--mixed T]

Traces the model once on meta (bf16, sequence 2048, batch = microbatches), runs the sharding pass for
every degree, lowers one problem per degree (NOTE [tensor-parallel costs]) and solves each for the
`iteration` objective of NOTE [objectives] (sum of stage times + (M-1) x bottleneck, M microbatches), and
for the bottleneck (`throughput`, what `partition` optimises); prints value, proven bound and stage count.

`--mixed T` also plans TP T on the NVLink machines (link >= 100 GB/s) beside single devices on the
others, which `partition` cannot yet (NOTE [tensor-parallel degree choice]): the problem keeps every
node's per-rank memory of degree T, a relaxation for the single devices, so its bound is valid; the plan
found is then checked with the single devices' whole memory (`stage_memory_bytes` of the degree-1 problem).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from hetpart.partitioner import solve
from hetpart.partitioner.costs import stage_activation_bytes, stage_memory_bytes
from hetpart.partitioner.problem import WEIGHTS, Problem
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
    ap.add_argument("--objectives", default="iteration,throughput")
    ap.add_argument("--mixed", type=int, default=0, help="also TP MIXED on NVLink machines, TP 1 elsewhere")
    args = ap.parse_args()
    degrees = tuple(int(t) for t in args.degrees.split(",") if t)
    runs = [(t, False) for t in degrees] + ([(args.mixed, True)] if args.mixed else [])
    m = args.microbatches
    cluster = load_cluster(args.cluster)
    t0 = time.perf_counter()
    spec = ModelSpec(args.model, {"dtype": "bfloat16"}, m, 2048)
    a = analyze(spec, cluster, 1, echo=lambda s: None, mode="training", meta=True,
                tp_degrees=tuple(sorted({t for t, _ in runs if t > 1})))
    groups = group_of(a.gm)
    base = lower_to_problem(a.gm, cluster, TrainingSpec("gpipe", m, 8), groups)
    print(f"{args.model} on {args.cluster}: traced and analysed in {time.perf_counter() - t0:.0f} s; "
          f"training, GPipe, {m} microbatch(es) of 1 x 2048 tokens")
    print("| TP degree | slots | objective | value ms | bound ms | gap | stages | status | solve s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t, mixed in runs:
        if t == 1:
            problem, slots = base, base.devices
        else:
            problem, slots = lower_tensor_parallel(base, a.gm, cluster, a.gm.meta[TP_META][t], groups, True)
        if mixed:
            problem, slots = _mixed(problem, base, cluster)
        for objective in args.objectives.split(","):
            start = time.perf_counter()
            plan = solve(problem, time_limit_s=args.time_limit, objective=objective, microbatches=m)
            note = _memory_check(plan, base, problem) if mixed else ""
            label = f"{t} on NVLink, 1 elsewhere{note}" if mixed else str(t)
            print(f"| {label} | {len(slots)} | {objective} | {plan.value_ns / 1e6:,.1f} | "
                  f"{plan.lower_bound_ns / 1e6:,.1f} | {plan.gap:.1%} | {len(plan.stages)} | {plan.solver_status} | "
                  f"{time.perf_counter() - start:.0f} |",
                  flush=True)


def _pcie(cluster) -> set[str]:
    return {m.name for m in cluster.machines if m.link.bandwidth_bytes_per_s < 100e9}


def _mixed(tp_problem: Problem, base: Problem, cluster) -> tuple[Problem, list]:
    """The TP problem with the PCIe machines' groups replaced by their single devices (their whole time keys)."""
    pcie = _pcie(cluster)
    devices = [d for d in tp_problem.devices if d.node not in pcie] + [d for d in base.devices if d.node in pcie]
    return dataclasses.replace(tp_problem, devices=devices), devices


def _memory_check(plan, base: Problem, problem: Problem) -> str:
    """' (memory ok)' when every single-device stage fits with its whole memory, else which do not."""
    over = []
    singles = {d.name for d in base.devices}
    for s in plan.stages:
        if s.device in singles:
            held = {w: 1 for v in s.nodes for w in base.graph.nodes[v].get(WEIGHTS, ())}
            need = stage_memory_bytes(base, stage_activation_bytes(base, s.nodes), held, s.index, len(plan.stages))
            if need > base.device(s.device).capacity_bytes:
                over.append(s.index)
    return " (memory ok)" if not over else f" (stages {over} over memory when whole)"


if __name__ == "__main__":
    main()
