"""Data-parallel pipelines of different shapes (issue 19) at scale: plan_pipelines on synthetic
transformer-shaped problems of 64, 256 and 1,024 devices of three types, in 8-device machines.

    .venv/bin/python benchmarks/pipelines_plan.py [--sizes 64,256,1024] [--models 70b-like,405b-like]
        [--time-limit 110] [--baseline-limit 60]

Prints, per size: wall, peak RSS, devices used, the certified gap, and the speedup of the plan's
iteration over the best baseline (Megatron-style uniform, Metis-style, one pipeline). The problem
is built in the partitioner's terms (no torch): `layers` blocks of 10 ops, weights per block.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetpart.partitioner.problem import (  # noqa: E402
    LAYER, MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link, Problem, Training,
)

# type -> (relative speed, memory bytes): H100-, A100-80G- and L40S-like GPUs (bf16 dense peaks
# 989, 312 and 362 TFLOP/s; the L40S's slower memory taken as 0.3).
GPU_TYPES = {"h100": (1.0, 80 << 30), "a100": (0.32, 80 << 30), "l40s": (0.3, 48 << 30)}
NVLINK = Link(bandwidth_bytes_per_us=300_000, latency_ns=3_000)  # 300 GB/s inside a machine
NETWORK = Link(bandwidth_bytes_per_us=25_000, latency_ns=10_000)  # 200 Gb/s between machines

# One block's ops: (name, share of the block's time, reads a weight of this share of the block's bytes).
_BLOCK = [("ln1", 0.01, 0.0), ("qkv", 0.18, 0.25), ("attn", 0.14, 0.0), ("proj", 0.07, 0.08), ("add1", 0.01, 0.0),
          ("ln2", 0.01, 0.0), ("fc1", 0.26, 0.33), ("act", 0.03, 0.0), ("fc2", 0.28, 0.34), ("add2", 0.01, 0.0)]


def transformer(layers: int, block_weight_bytes: int, block_time_ns: int, hidden_bytes: int,
                devices: list[Device], microbatches: int, state_per_weight: int = 6) -> Problem:
    """A decoder-shaped chain: embedding (pinned first), `layers` blocks of 10 ops, head (pinned last).

    Times scale by each type's speed; training with 1F1B, gradient + Adam state `state_per_weight`
    times each weight's bytes; every op keeps a tenth of the hidden state per microbatch."""
    g = nx.DiGraph()
    weights: dict[str, int] = {}

    def op(name: str, time_ns: int, w: int, layer: str, pin: str | None = None) -> str:
        times = {t: max(1, int(time_ns / speed)) for t, (speed, _) in GPU_TYPES.items()}
        ws = ()
        if w:
            weights[name + ".w"] = w
            ws = (name + ".w",)
        g.add_node(name, **{TIME_NS: times, MEM_BYTES: hidden_bytes // 10, OUT_BYTES: hidden_bytes, WEIGHTS: ws,
                            PIN: pin, LAYER: layer})
        return name

    prev = op("embed", block_time_ns // 20, block_weight_bytes // 2, "embed", PIN_FIRST)
    for b in range(layers):
        for name, share, wshare in _BLOCK:
            cur = op(f"b{b}.{name}", int(block_time_ns * share), int(block_weight_bytes * wshare), f"blocks.{b}")
            g.add_edge(prev, cur)
            prev = cur
    head = op("head", block_time_ns // 5, block_weight_bytes // 2, "head", PIN_LAST)
    g.add_edge(prev, head)
    g.nodes[head][OUT_BYTES] = 0
    machines = sorted({d.node for d in devices})
    return Problem(graph=g, weights=weights, devices=devices, intra_node_links={m: NVLINK for m in machines},
                   network=NETWORK, training=Training("1f1b", microbatches,
                                                      {w: state_per_weight * b for w, b in weights.items()}))


def cluster(machines: dict[str, int], per_machine: int = 8) -> list[Device]:
    """`machines[type]` machines of `per_machine` GPUs of that type each."""
    out = []
    for t, count in machines.items():
        for m in range(count):
            out += [Device(f"{t}{m}/{i}", t, f"{t}{m}", GPU_TYPES[t][1]) for i in range(per_machine)]
    return out


# name -> (layers, weight bytes per block, time per block on an H100 in ns): a 70B- and a 405B-shaped
# model (80 blocks of hidden 8192; 126 blocks of hidden 16384), weights bf16, Adam state 6x the weights.
MODELS = {"70b-like": (80, 1_700_000_000, 20_000_000), "405b-like": (126, 6_400_000_000, 75_000_000)}
GLOBAL_MICROBATCHES = 1024  # one global batch of 1,024 sequences, microbatch 1, at every size
SIZES = {64: {"h100": 3, "a100": 3, "l40s": 2}, 256: {"h100": 11, "a100": 11, "l40s": 10},
         1024: {"h100": 43, "a100": 43, "l40s": 42}}


def run_case(model: str, size: int, time_limit_s: float, baseline_limit_s: float, single_up_to: int) -> dict:
    """One row: plan_pipelines and the baselines on `model` over the `size`-GPU cluster."""
    from hetpart.errors import HetpartError
    from hetpart.partitioner.pipeline_baselines import pipeline_baselines
    from hetpart.partitioner.pipeline_search import plan_pipelines
    from hetpart.partitioner.pipelines import pipelines_violations

    layers, block_bytes, block_ns = MODELS[model]
    hidden = 2048 * (8192 if layers == 80 else 16384) * 2
    devices = cluster(SIZES[size])
    M = GLOBAL_MICROBATCHES
    problem = transformer(layers, block_bytes, block_ns, hidden, devices, M)
    t0 = time.perf_counter()
    try:
        plan = plan_pipelines(problem, M, time_limit_s=time_limit_s, gap=0.01, run_cpsat=False, run_ideal_dp=False)
    except HetpartError as e:
        return {"model": model, "devices": size, "M": M, "refused": str(e).splitlines()[0],
                "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB
    assert not pipelines_violations(problem, plan, M)
    t1 = time.perf_counter()
    base = pipeline_baselines(problem, M, time_limit_s=baseline_limit_s, options=None, single=size <= single_up_to)
    base_wall = time.perf_counter() - t1
    best = min((b for b in base if b.plan is not None), key=lambda b: b.plan.iteration_ns)
    used = len(problem.devices) - len(plan.devices_idle)
    return {"model": model, "devices": size, "M": M, "wall_s": wall, "rss_mib": rss, "used": used,
            "iteration_s": plan.iteration_ns / 1e9, "bound_s": plan.lower_bound_ns / 1e9, "gap": plan.gap,
            "sync_s": plan.grad_sync_ns / 1e9, "pipelines": len(plan.pipelines),
            "baselines": {b.name: (b.plan.iteration_ns / 1e9 if b.plan else None) for b in base},
            "best_baseline": best.name, "speedup": best.plan.iteration_ns / plan.iteration_ns,
            "baselines_wall_s": base_wall, "stats": plan.stats, "idle": sorted(set(plan.devices_idle.values()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--time-limit", type=float, default=110.0)
    ap.add_argument("--baseline-limit", type=float, default=60.0, help="seconds for the three baselines together")
    ap.add_argument("--single-up-to", type=int, default=1024,
                    help="the one-pipeline baseline only up to this many GPUs (its solve overruns at scale)")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # model:size, run in a fresh process (its own RSS)
    args = ap.parse_args()
    if args.case:
        model, size = args.case.split(":")
        print(json.dumps(run_case(model, int(size), args.time_limit, args.baseline_limit, args.single_up_to)))
        return
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| model | GPUs | M | wall s | RSS MiB | used | pipelines | iteration s | bound s | gap | sync s "
          "| megatron s | metis s | one-pipeline s | speedup vs best | baselines wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    speedups = []
    for model in args.models.split(","):
        for size in map(int, args.sizes.split(",")):
            out = subprocess.run([sys.executable, __file__, "--case", f"{model}:{size}", "--time-limit",
                                  str(args.time_limit), "--baseline-limit", str(args.baseline_limit),
                                  "--single-up-to", str(args.single_up_to)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if "refused" in r:
                print(f"| {model} | {size} | {r['M']} | {r['wall_s']:.1f} | refused: {r['refused']} |", flush=True)
                continue
            b = r["baselines"]
            fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
            speedups.append(r["speedup"])
            print(f"| {model} | {size} | {r['M']} | {r['wall_s']:.1f} | {r['rss_mib']:.0f} | {r['used']}/{size} "
                  f"| {r['pipelines']} | {r['iteration_s']:.2f} | {r['bound_s']:.2f} | {100 * r['gap']:.1f}% "
                  f"| {r['sync_s']:.2f} | {fmt(b['megatron'])} | {fmt(b['metis'])} | {fmt(b['one-pipeline'])} "
                  f"| {r['speedup']:.2f}x ({r['best_baseline']}) | {r['baselines_wall_s']:.0f} |", flush=True)
            if r["idle"]:
                print(f"|  | idle: {'; '.join(r['idle'])} |")
    if speedups:
        print(f"geomean speedup over the best baseline: {math.prod(speedups) ** (1 / len(speedups)):.2f}x "
              f"({len(speedups)} rows)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
