"""Data-parallel pipelines of tensor-parallel stages (DP x PP x TP), planned: what each TP degree buys.

    PYTHONPATH=. .venv/bin/python benchmarks/dp_tp.py [--models llama-7b llama-70b]
        [--presets hetero-64 hetero-256] [--degrees 1,2,4,8] [--time-limit 30]

Per model: traced once on meta (bf16, sequence 2048, training, 1F1B, Adam's 8 bytes per parameter), the
sharding pass run for every degree > 1. Per preset: the global batch is one microbatch of one sequence per
GPU (as `benchmarks/scale.py --parallel data`), the devices' problem lowered as `hetpart partition` does,
and one slot problem per degree > 1 (NOTE [tensor-parallel costs]: every slot a TP group of one machine).
Each degree is searched as `hetpart partition --parallel data` searches (`plan_with_baselines`: the
search of NOTE [pipeline shapes] and the baselines beside it, `--time-limit` each); degree 1 is today's
`--parallel data` plan. `choose_pipelines_degree` keeps the fastest (NOTE [tensor-parallel pipelines]),
its bound the least over the degrees. Columns: pipelines, devices used (a slot is T devices), step, its
gradient sync (NOTE [tensor-parallel gradient sync]) and that sync read as one NIC per machine
(`grad_sync_nic_ns`, an estimate beside it), bound, gap, status, wall seconds of the degree's planning,
and the step against degree 1's. The load average before and after goes with the table.
"""

from __future__ import annotations

import argparse
import os
import time

from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from hetpart.partitioner.pipeline_search import plan_with_baselines
from hetpart.partitioner.solve import SolveOptions
from hetpart.partitioner.tp_pipelines import choose_pipelines_degree, devices_used, grad_sync_nic_ns
from hetpart.passes import lower_to_problem
from hetpart.passes.lower import TrainingSpec, group_of
from hetpart.passes.tensor_parallel import TP_META
from hetpart.passes.tp_lower import lower_tensor_parallel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["llama-7b", "llama-70b"])
    ap.add_argument("--presets", nargs="+", default=["hetero-64", "hetero-256"])
    ap.add_argument("--degrees", default="1,2,4,8")
    ap.add_argument("--time-limit", type=float, default=30)
    args = ap.parse_args()
    degrees = tuple(int(t) for t in args.degrees.split(","))
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())  # noqa: E731
    print(f"load before: {load()}", flush=True)
    print("| model | preset | M | TP | slots | pipelines | devices used | step ms | sync ms | sync, one NIC per "
          "machine ms | bound ms | gap | status | wall s | step vs TP 1 |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    best_rows = []
    for model in args.models:
        clusters = {p: load_cluster(f"preset:{p}") for p in args.presets}
        t0 = time.perf_counter()
        # Traced at the first preset's batch, annotated at microbatches of one sequence (the passes read no batch).
        spec = ModelSpec(f"zoo:{model}", {"dtype": "bfloat16"}, len(clusters[args.presets[0]].devices), 2048)
        a = analyze(spec, clusters[args.presets[0]], 1, echo=lambda s: None, mode="training", meta=True,
                    tp_degrees=tuple(t for t in degrees if t > 1))  # the presets' device types are the same
        groups = group_of(a.gm)
        print(f"<!-- {model}: traced and analysed in {time.perf_counter() - t0:.0f} s -->", flush=True)
        for preset, cluster in clusters.items():
            m = len(cluster.devices)  # one microbatch of one sequence per GPU
            base = lower_to_problem(a.gm, cluster, TrainingSpec("1f1b", m, 8), groups)
            problems = {t: base if t == 1 else lower_tensor_parallel(base, a.gm, cluster, a.gm.meta[TP_META][t],
                                                                     groups, True)[0] for t in degrees}
            opts = SolveOptions(time_limit_s=args.time_limit)
            # Each degree its whole limit, to compare the degrees (the CLI shares it: NOTE [degrees share the time
            # limit]); the total given is what they may take together.
            choice = choose_pipelines_degree(problems, m, lambda _t, p, mb, _share: plan_with_baselines(
                p, mb, opts, baseline_limit_s=args.time_limit / 2)[0], 1.5 * args.time_limit * len(degrees))
            one = next((r.plan for r in choice.results if r.degree == 1 and r.plan is not None), None)
            for r in choice.results:
                head = f"| {model} | {preset} | {m} | {r.degree} | {len(problems[r.degree].devices)} |"
                if r.plan is None:
                    print(f"{head} no plan: {r.error[:200]} | | | | | {r.bound_ns / 1e6:,.1f} | | | "
                          f"{r.seconds:.0f} | |", flush=True)
                    continue
                p = r.plan
                nic = grad_sync_nic_ns(problems[r.degree], p.pipelines, lanes=r.degree)
                vs = f"{p.iteration_ns / one.iteration_ns:.3f}x" if one is not None else "-"
                print(f"{head} {len(p.pipelines)} | {devices_used(p, r.degree)}/{len(cluster.devices)} | "
                      f"{p.iteration_ns / 1e6:,.1f} | {p.grad_sync_ns / 1e6:,.1f} | {nic / 1e6:,.1f} | "
                      f"{p.lower_bound_ns / 1e6:,.1f} | {p.gap:.1%} | {p.solver_status} | {r.seconds:.0f} | {vs} |",
                      flush=True)
            c = choice.plan
            best_rows.append(f"| {model} | {preset} | {choice.degree} | {c.iteration_ns / 1e6:,.1f} | "
                             f"{c.lower_bound_ns / 1e6:,.1f} | {c.gap:.1%} | {c.solver_status} | "
                             + (f"{one.iteration_ns / c.iteration_ns:.2f}x |" if one is not None else "- |"))
    print("\nBest degree per model x preset (bound: the least over the degrees, NOTE [tensor-parallel pipelines]):")
    print("| model | preset | TP | step ms | bound ms | gap | status | speedup over TP 1 |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(best_rows))
    print(f"load after: {load()}", flush=True)


if __name__ == "__main__":
    main()
