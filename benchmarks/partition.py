"""Partitioner benchmarks: the NeurIPS 2020 device-placement inputs, against the authors' optima.

    .venv/bin/python benchmarks/partition.py [--time-limit 60] [--only bert] [--bench DIR]
    .venv/bin/python benchmarks/partition.py --scaling 1000,5000,20000 [--time-limit 60]

Prints a Markdown table (input, nodes, k, ours, lower bound, certified gap, known
optimum, ours vs optimum, seconds, status). The known optima are read from the
benchmark's README (the authors' dynamic program, run by whoever filed the inputs).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import networkx as nx  # noqa: E402

from hetpart.partitioner import PIN_FIRST, PIN_LAST, Device, Link, Problem, solve, verify_plan  # noqa: E402
from hetpart.partitioner.baselines import compute_baselines  # noqa: E402
from hetpart.partitioner.placement import read_placement, solve_placement  # noqa: E402

DEFAULT_BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "dnn-partitioning"


def known_optima(bench: Path) -> dict[str, float | None]:
    """`LayerGraphs/bert24_training` -> optimum (None where the README says unknown), from the README table."""
    out: dict[str, float | None] = {}
    for line in (bench / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"\w+/[\w.-]+", cells[0]):
            try:
                out[cells[0]] = float(cells[3])
            except ValueError:
                out[cells[0]] = None
    return out


def placement_table(bench: Path, time_limit_s: float, only: str | None, workers: int) -> list[str]:
    optima = known_optima(bench)
    rows = ["| input | nodes | k | ours (max load) | lower bound | certified gap | known optimum | ours vs optimum "
            "| seconds | status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for path in sorted(bench.glob("*/*.json")):
        key = f"{path.parent.name}/{path.stem}"
        if only and only not in key:
            continue
        problem = read_placement(path)
        start = time.perf_counter()
        result = solve_placement(problem, time_limit_s=time_limit_s, workers=workers)
        seconds = time.perf_counter() - start
        opt = optima.get(key)
        vs = f"{(result.max_load / opt - 1) * 100:+.4f}%" if opt else "—"
        rows.append(f"| {key} | {len(problem.nodes)} | {problem.max_fpgas} | {result.max_load:.6f} "
                    f"| {result.lower_bound:.6f} | {result.gap * 100:.4f}% | {opt if opt else 'unknown'} | {vs} "
                    f"| {seconds:.1f} | {result.status} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def transformer_like(num_nodes: int, seed: int = 0) -> Problem:
    """A GPT-style chain of blocks (27 ops each, two residual skips per block) on a mixed 8-device cluster.

    Three device types (compute speed 1 : 0.45 : 0.15, memory-bound ops 1 : 0.58 : 0.20, +-10% per
    op), as in PARTITIONING-NOTES; every op has a `layer` (its block), weights on the matmuls.
    """
    rng = random.Random(seed)
    g = nx.DiGraph()
    weights: dict[str, int] = {}
    speed = {"big": (1.0, 1.0), "mid": (0.45, 0.58), "small": (0.15, 0.20)}
    prev, block_in, i = None, None, 0
    while i < num_nodes:
        block, op = divmod(i, 27)
        name = f"b{block}.op{op:02d}"
        matmul = op in (1, 5, 14, 20)
        base = rng.randint(20_000, 60_000) if matmul else rng.randint(2_000, 8_000)
        times = {t: int(base / s[0 if matmul else 1] * rng.uniform(0.9, 1.1)) for t, s in speed.items()}
        w = (f"w{block}.{op}",) if matmul else ()
        for wname in w:
            weights[wname] = rng.randint(20, 40) << 20
        g.add_node(name, time_ns=times, mem_bytes=1 << 20, out_bytes=1 << 18, weights=w, layer=f"blocks.{block}",
                   pin=PIN_FIRST if i == 0 else PIN_LAST if i == num_nodes - 1 else None)
        if prev is not None:
            g.add_edge(prev, name)
        if op == 0:
            block_in = name
        if op in (12, 26) and block_in is not None and block_in != prev:
            g.add_edge(block_in, name)  # residual skip
            block_in = name
        prev, i = name, i + 1
    devices = [Device(f"{t}{k}", t, f"m{k // 2}", cap << 30) for k, (t, cap) in
               enumerate([("big", 40), ("big", 40), ("mid", 16), ("mid", 16), ("small", 16), ("small", 16),
                           ("small", 16), ("small", 16)])]
    machines = sorted({d.node for d in devices})
    return Problem(graph=g, weights=weights, devices=devices,
                   intra_node_links={m: Link(300_000, 2_000) for m in machines}, network=Link(12_500, 10_000))


def scaling_table(sizes: list[int], time_limit_s: float) -> list[str]:
    rows = ["| nodes | ours (us) | lower bound (us) | gap | status | seconds | dp-topo-order | equal-layers "
            "| parameters |", "|---|---|---|---|---|---|---|---|---|"]
    for n in sizes:
        problem = transformer_like(n)
        start = time.perf_counter()
        plan = solve(problem, time_limit_s=time_limit_s, workers=2)
        seconds = time.perf_counter() - start
        verify_plan(problem, plan)
        base = {b.name: b for b in compute_baselines(problem)}

        def cell(b):
            ratio = b.bottleneck_ns / plan.bottleneck_ns if b.bottleneck_ns else float("nan")
            return f"{ratio:.2f}x" + ("" if b.feasible else " (breaks memory)")

        rows.append(f"| {n} | {plan.bottleneck_ns / 1000:.1f} | {plan.lower_bound_ns / 1000:.1f} | "
                    f"{plan.gap * 100:.2f}% | {plan.solver_status} | {seconds:.1f} | {cell(base['dp-topo-order'])} | "
                    f"{cell(base['equal-layers'])} | {cell(base['parameters'])} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, default=DEFAULT_BENCH, help="the dnn-partitioning benchmark folder")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per input")
    ap.add_argument("--workers", type=int, default=1, help="CP-SAT workers (1 is deterministic)")
    ap.add_argument("--only", default=None, help="run inputs whose name contains this")
    ap.add_argument("--scaling", default="", help="comma-separated node counts of synthetic transformer-like DAGs "
                    "to plan instead (e.g. 1000,5000,20000)")
    args = ap.parse_args()
    if args.scaling:
        print("\n".join(scaling_table([int(n) for n in args.scaling.split(",")], args.time_limit)))
    else:
        print("\n".join(placement_table(args.bench, args.time_limit, args.only, args.workers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
