"""Huge models without their weights: trace + annotate + partition time and peak RSS.

    .venv/bin/python benchmarks/meta_scale.py                  # hf:llama at Llama-2-7B, zoo:llama-70b
    .venv/bin/python benchmarks/meta_scale.py --models hf-llama-7b --cluster preset:spot-16
    .venv/bin/python benchmarks/meta_scale.py --repeats 3 --without-fast-kernels   # the tracing speed-up

Each model runs in a fresh process (so its peak RSS is its own) through the same steps as
`hetpart partition --meta`: build with parameters on the meta device (NOTE [meta build]),
torch.export on meta inputs, the analysis passes, lowering, and the solver. Targets (issue 3):
7B <= 20 s and 70B <= 60 s on a 2-core machine, peak RSS <= 2 GB, no weight memory.
`--without-fast-kernels` also runs each model with torch's own kernels for linear and SDPA
while tracing (NOTE [fast fake kernels] in hetpart/frontend/fast_fake.py), in alternation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    "hf-llama-7b": ("hf:llama", {"hidden_size": "4096", "intermediate_size": "11008", "num_hidden_layers": "32",
                                 "num_attention_heads": "32", "num_key_value_heads": "32", "vocab_size": "32000",
                                 "max_position_embeddings": "4096"}),
    "zoo-llama-7b": ("zoo:llama-7b", {}),
    "zoo-llama-70b": ("zoo:llama-70b", {"dtype": "bfloat16"}),  # 138 GB in bf16, as 70B is served
    "hf-mixtral-8x7b": ("hf:mixtral", {}),
}

CHILD = r"""
import json, sys, time
start = time.perf_counter()
from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from hetpart.frontend.load import param_bytes
from hetpart.passes import lower_to_problem
from hetpart.partitioner import solve

args = json.loads(sys.argv[1])
if not args["fast_kernels"]:  # trace as torch alone would (NOTE [fast fake kernels])
    import hetpart.frontend.fast_fake
    hetpart.frontend.fast_fake._KERNELS = {}
spec = ModelSpec(args["model"], args["overrides"], batch_size=args["batch_size"], seq_len=args["seq_len"])
cluster = load_cluster(args["cluster"])
t = time.perf_counter()
analysis = analyze(spec, cluster, args["batch_size"] // args["microbatches"], meta=True, echo=lambda _: None)
analyze_s = time.perf_counter() - t
passes_s = sum(x.seconds for x in analysis.pm.timings)
t = time.perf_counter()
problem = lower_to_problem(analysis.gm, cluster)
lower_s = time.perf_counter() - t
t = time.perf_counter()
plan = solve(problem, time_limit_s=args["time_limit"], seed=0)
solve_s = time.perf_counter() - t
weights = sum(problem.weights.values())
print(json.dumps({
    "trace_s": analyze_s - passes_s, "passes_s": passes_s, "lower_s": lower_s, "solve_s": solve_s,
    "total_s": time.perf_counter() - start,
    "fx_nodes": len(analysis.gm.graph.nodes), "problem_nodes": problem.graph.number_of_nodes(),
    "weight_gb": weights / 1e9, "stages": len(plan.stages), "gap": plan.gap, "status": plan.solver_status,
    # VmHWM, not ru_maxrss: ru_maxrss carries the parent's peak over fork and exec
    "peak_rss_gb": int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024 / 1e9,
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["hf-llama-7b", "zoo-llama-70b"], choices=sorted(MODELS))
    ap.add_argument("--cluster", default="preset:a100-t4-8")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--time-limit", type=float, default=20.0, help="solver time limit per model")
    ap.add_argument("--repeats", type=int, default=1, help="runs per model (each in a fresh process)")
    ap.add_argument("--without-fast-kernels", action="store_true",
                    help="also run each model with torch's own linear/SDPA kernels while tracing, side by side")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cols = ["model", "fast kernels", "fx nodes", "problem nodes", "weights GB", "trace s", "passes s", "lower s", "solve s",
            "trace to plan s", "total s", "peak RSS GB", "stages", "gap"]
    print(f"cluster {args.cluster}, batch {args.batch_size} in {args.microbatches} microbatches, "
          f"seq {args.seq_len}, solver limit {args.time_limit:g} s; 'trace to plan' = trace (model build included) + passes "
          f"+ lower + solve; total = process start to plan, imports included")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    runs = [(name, fast) for name in args.models for _ in range(args.repeats)
            for fast in ((True, False) if args.without_fast_kernels else (True,))]
    for name, fast in runs:
        model, overrides = MODELS[name]
        child_args = {"model": model, "overrides": overrides, "batch_size": args.batch_size,
                      "microbatches": args.microbatches, "seq_len": args.seq_len, "cluster": args.cluster,
                      "time_limit": args.time_limit, "fast_kernels": fast}
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(child_args)], capture_output=True,
                              text=True, env=env, cwd=ROOT)
        if proc.returncode != 0:
            print(f"| {name} | failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else '?'} |")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"| {name} | {'yes' if fast else 'no'} | {r['fx_nodes']} | {r['problem_nodes']} | {r['weight_gb']:.1f} | {r['trace_s']:.1f} | "
              f"{r['passes_s']:.1f} | {r['lower_s']:.2f} | {r['solve_s']:.1f} | "
              f"{r['trace_s'] + r['passes_s'] + r['lower_s'] + r['solve_s']:.1f} | {r['total_s']:.1f} | "
              f"{r['peak_rss_gb']:.2f} | {r['stages']} | {r['gap']:.2%} |", flush=True)


if __name__ == "__main__":
    main()
