"""Predicted training iteration of a model per uniform tensor-parallel degree (issue 20), in hetpart's cost model.

    PYTHONPATH=. .venv/bin/python benchmarks/tensor_parallel.py [--model zoo:llama-70b] [--cluster preset:hetero-64]
        [--degrees 1,2,4,8] [--microbatches 4] [--schedule gpipe|1f1b] [--time-limit 60]
        [--objectives iteration,throughput] [--mixed T] [--per-machine]

Traces the model once on meta (bf16, sequence 2048, batch = microbatches), runs the sharding pass for
every degree, lowers one problem per degree (NOTE [tensor-parallel costs]; the schedule's activation stash,
and under 1F1B at most M stages: NOTE [1F1B stages]) and solves each for the
`iteration` objective of NOTE [objectives] (sum of stage times + (M-1) x bottleneck, M microbatches), and
for the bottleneck (`throughput`, what `partition` optimises); prints value, proven bound and stage count.

`--mixed T` also plans TP T on the NVLink machines (link >= 100 GB/s) beside single devices on the
others, as a relaxation (`partition --tensor-parallel MACHINE=T,...` plans it exactly, each slot with its own
memory: NOTE [mixed-degree pipeline]): the problem keeps every
node's per-rank memory of degree T, a relaxation for the single devices, so its bound is valid; the plan
found is then checked with the single devices' whole memory (`stage_memory_bytes` of the degree-1 problem).

`--per-machine` instead runs `partition --max-tensor-parallel`'s search (NOTE [mixed tensor-parallel
degrees]): every uniform degree of `--degrees` (1 among them), the relaxation with every group of every
degree at once (its bound bounds the whole space), and the degrees per machine its plan uses, each solved
with each slot's own memory; one row per solve, for the first of `--objectives`.
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
from hetpart.partitioner.pipelines import one_f_one_b_stage_cap
from hetpart.partitioner.problem import WEIGHTS, Problem
from hetpart.passes import lower_to_problem
from hetpart.passes.lower import TrainingSpec, group_of
from hetpart.passes.tensor_parallel import TP_META
from hetpart.passes.tp_lower import lower_tensor_parallel
from hetpart.partitioner.tp_choice import choose_mixed
from hetpart.tensor_parallel import TPCompile, tp_slots


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:llama-70b")
    ap.add_argument("--cluster", default="preset:hetero-64")
    ap.add_argument("--degrees", default="1,2,4,8")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b"], help="the stash, and 1F1B's stage cap")
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--objectives", default="iteration,throughput")
    ap.add_argument("--mixed", type=int, default=0, help="also TP MIXED on NVLink machines, TP 1 elsewhere")
    ap.add_argument("--per-machine", action="store_true", help="the degree chosen per machine, as partition does")
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
    base = _capped(lower_to_problem(a.gm, cluster, TrainingSpec(args.schedule, m, 8), groups), args.schedule, m)
    print(f"{args.model} on {args.cluster}: traced and analysed in {time.perf_counter() - t0:.0f} s; "
          f"training, {args.schedule}, {m} microbatch(es) of 1 x 2048 tokens")
    if args.per_machine:
        return _per_machine(a.gm, base, cluster, groups, degrees, args.objectives.split(",")[0], m, args.time_limit,
                            args.schedule)
    print("| TP degree | slots | objective | value ms | bound ms | gap | stages | status | solve s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t, mixed in runs:
        if t == 1:
            problem, slots = base, base.devices
        else:
            problem, slots = lower_tensor_parallel(base, a.gm, cluster, a.gm.meta[TP_META][t], groups, True)
            problem = _capped(problem, args.schedule, m)
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


def _capped(problem: Problem, schedule: str, m: int) -> Problem:
    """`problem` with 1F1B's stage cap where it needs one (NOTE [1F1B stages]), as `partition` plans it."""
    cap = one_f_one_b_stage_cap(problem, schedule, m)
    return dataclasses.replace(problem, max_stages=cap) if cap is not None else problem


def _per_machine(gm, base: Problem, cluster, groups: dict, degrees: tuple[int, ...], objective: str, m: int,
                 time_limit: float, schedule: str) -> None:
    """NOTE [mixed tensor-parallel degrees] on the traced model: one row per solve, then the choice."""
    problems, lowered = {1: base}, {}
    for t in degrees:
        if t > 1:
            problem, groups_t = lower_tensor_parallel(base, gm, cluster, gm.meta[TP_META][t], groups, True)
            problems[t] = _capped(problem, schedule, m)
            lowered[t] = TPCompile(problems[t], {t: gm.meta[TP_META][t]}, groups_t)
    log = []

    def timed(problem: Problem, hint=None):
        start = time.perf_counter()
        plan = solve(problem, time_limit_s=time_limit, objective=objective, microbatches=m, hint=hint)
        log.append((problem, plan, time.perf_counter() - start))
        return plan

    slots = tp_slots(base, lowered)
    choice = choose_mixed(problems, slots, timed)
    labels = {id(p): f"{t} everywhere" for t, p in problems.items()}
    print(f"objective {objective}, --time-limit {time_limit:g} s per solve; the mixed space's bound (least of the "
          f"uniform degrees' and the relaxation's): {choice.plan.lower_bound_ns / 1e6:,.1f} ms")
    print("| solve | TP per machine kind | slots | value ms | own bound ms | gap to the space's bound | stages | "
          "status | solve s |")
    print("|---|---|---|---|---|---|---|---|---|")
    tried = iter(choice.tried)
    for problem, plan, secs in log:
        if id(problem) in labels:
            what, per = "uniform", labels[id(problem)]
        elif len(problem.devices) > len(base.devices):
            what, per = "relaxation", "every group of every degree"
        else:
            what, per = "per machine", _per_kind(next(tried))
        value = plan.value_ns if plan is not None else None
        gap = 1 - choice.plan.lower_bound_ns / value if value else float("nan")
        print(f"| {what} | {per} | {len(problem.devices)} | {value / 1e6:,.1f} | {plan.lower_bound_ns / 1e6:,.1f} | "
              f"{gap:.1%} | {len(plan.stages)} | {plan.solver_status} | {secs:.0f} |", flush=True)
    best_uniform = choice.uniform.plan.value_ns if choice.uniform is not None else None
    print(f"chosen: {_per_kind(choice.degree_of_place)}, {choice.plan.value_ns / 1e6:,.1f} ms "
          f"(bound {choice.plan.lower_bound_ns / 1e6:,.1f} ms, gap {choice.plan.gap:.1%}, {choice.plan.solver_status})"
          + (f"; best uniform: degree {choice.uniform.degree}, {best_uniform / 1e6:,.1f} ms, the choice "
             f"{1 - choice.plan.value_ns / best_uniform:+.2%} faster" if best_uniform else ""))


def _per_kind(degree_of_place: dict[str, int]) -> str:
    """'h100-80g 8, l4-24g 1': each device type's degree (its machines' degrees, when they differ)."""
    by_type: dict[str, list[int]] = {}
    for place, t in sorted(degree_of_place.items()):
        by_type.setdefault(place.split(":", 1)[1], []).append(t)
    return ", ".join(f"{ty} {ts[0] if len(set(ts)) == 1 else '/'.join(map(str, ts))}" for ty, ts in by_type.items())


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
