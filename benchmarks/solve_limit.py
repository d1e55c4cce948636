"""`solve` against its --time-limit on the 405B-shaped model's TP-8 slots (docs/benchmarks.md, "solvelimit").

    PYTHONPATH=. .venv/bin/python benchmarks/solve_limit.py [--presets hetero-256 hetero-1024]
        [--limits 0.95 3.75] [--cache /tmp/solve_limit]

The one-pipeline baseline's problem of `--parallel data --max-tensor-parallel 8` (`single_pipeline` in
pipeline_baselines.py): zoo:llama-405b traced on meta (bf16, sequence 2048, training, 1F1B), lowered to one
slot per TP group of 8 (`lower_tensor_parallel`, as benchmarks/dp_tp.py), one pipeline over every slot for the
iteration objective of M = the preset's GPUs. The lowered problem is pickled under `--cache` (tracing takes
half a minute), so a second run times the solve alone. Per preset and limit: the solve's wall seconds against
the limit, its status (or its error's first words), and the seconds of each step it reports.
"""

from __future__ import annotations

import argparse
import os
import pickle
import time
from pathlib import Path

from hetpart.errors import HetpartError
from hetpart.partitioner.pipelines import sub_problem
from hetpart.partitioner.problem import Problem
from hetpart.partitioner.solve import SolveOptions, solve


def one_pipeline_problem(preset: str, cache: Path) -> tuple[Problem, int]:
    """The one-pipeline baseline's problem on `preset`'s TP-8 slots and its microbatches, cached."""
    path = cache / f"llama-405b-tp8-{preset}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    from hetpart.compile import analyze
    from hetpart.devices import load_cluster
    from hetpart.frontend import ModelSpec
    from hetpart.passes import lower_to_problem
    from hetpart.passes.lower import TrainingSpec, group_of
    from hetpart.passes.tensor_parallel import TP_META
    from hetpart.passes.tp_lower import lower_tensor_parallel

    cluster = load_cluster(f"preset:{preset}")
    m = len(cluster.devices)  # one microbatch of one sequence per GPU, as benchmarks/scale.py --parallel data
    a = analyze(ModelSpec("zoo:llama-405b", {"dtype": "bfloat16"}, m, 2048), cluster, 1, echo=lambda s: None,
                mode="training", meta=True, tp_degrees=(8,))
    groups = group_of(a.gm)
    base = lower_to_problem(a.gm, cluster, TrainingSpec("1f1b", m, 8), groups)
    slots = lower_tensor_parallel(base, a.gm, cluster, a.gm.meta[TP_META][8], groups, True)[0]
    got = (sub_problem(slots, [d.name for d in slots.devices], m), m)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(got))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["hetero-256", "hetero-1024"])
    ap.add_argument("--limits", nargs="+", type=float, default=[0.95, 3.75])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/solve_limit"))
    args = ap.parse_args()
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())  # noqa: E731
    print(f"load before: {load()}", flush=True)
    print("| preset | slots | nodes | limit s | solve s | over | status | steps (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        problem, m = one_pipeline_problem(preset, args.cache)
        for limit in args.limits:
            t = time.perf_counter()
            try:
                plan = solve(problem, SolveOptions(time_limit_s=limit, objective="iteration", microbatches=m))
                status = plan.solver_status
                steps = ", ".join(f"{k.removesuffix('_seconds')} {v:.2f}" for k, v in plan.stats.to_json().items()
                                  if k.endswith("_seconds"))
            except HetpartError as e:
                status, steps = f"error: {str(e).splitlines()[0][:90]}", ""
            took = time.perf_counter() - t
            print(f"| {preset} | {len(problem.devices)} | {problem.graph.number_of_nodes()} | {limit:g} | {took:.2f} | "
                  f"{took / limit:.1f}x | {status} | {steps} |", flush=True)
    print(f"load after: {load()}", flush=True)


if __name__ == "__main__":
    main()
