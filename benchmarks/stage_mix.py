"""How much of a pipeline's least time under NOTE [stage sum cuts] comes from node classes split across types.

The stage sum Z(C) of NOTE [stage sum cuts] assigns each node class to the types freely, so a fast type can take the
classes it is fastest at (on Llama: the matmuls, 3.1x faster on an H100 than on an A100, against 1.5-2x for the
memory-bound ops) while a stage of contiguous whole layers runs the model's own mix. For one pipeline shape (devices
per type) and microbatch count this prints the least T = Z(n b) + (m - 1) b over the bottleneck b, (1) on the node
classes (what the bound's lines allow) and (2) on one class holding the whole model (every stage the model's mix).
The gap between the two is what a contiguity-aware stage sum could add to the bound (docs/benchmarks.md, "gap19e").

    PYTHONPATH=. .venv/bin/python benchmarks/stage_mix.py /tmp/scale/llama-7b-hetero-64 \\
        --shape h100-80g=2 a100-80g=2 a100-40g=2 --microbatches 8

The directory is a `hetpart partition` output (its ir/analysis.json, as benchmarks/pipeline_gaps.py reads it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_gaps import load_problem  # noqa: E402

from hetpart.partitioner.pipeline_bounds import _node_classes  # noqa: E402
from hetpart.partitioner.pipeline_stage_sum import StageSum  # noqa: E402


def least_time_ns(sums: StageSum, devices: np.ndarray, microbatches: int, points: int = 2000) -> float:
    """min over b of Z(devices b) + (microbatches - 1) b, Z from below by the line touching it at each b (a valid
    line, NOTE [stage sum cuts] (2)), b on a geometric grid from 0.01 ms to the whole model on the slowest type."""
    top = float((np.where(sums.ok, sums.time_ns, 0.0).T @ sums.count).max())
    fill = sums.alpha(np.zeros(len(devices)))
    best = float("inf")
    for b in np.geomspace(1e4, max(top, 1e5), points):
        got = sums.cut_at(devices * b)
        z = fill if got is None else max(fill, got[1] - float(got[0] @ (devices * b)))
        best = min(best, z + (microbatches - 1) * b)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a `hetpart partition` output directory")
    ap.add_argument("--shape", nargs="+", required=True, help="TYPE=COUNT per device type of the pipeline")
    ap.add_argument("--microbatches", type=int, required=True)
    args = ap.parse_args()
    problem = load_problem(args.out)
    types, time_ns, allowed, count = _node_classes(problem)
    shape = {t: int(n) for t, n in (kv.split("=") for kv in args.shape)}
    unknown = sorted(set(shape) - set(types))
    if unknown:
        sys.exit(f"stage_mix: unknown device type(s) {unknown} (the problem has {types})")
    cols = [types.index(t) for t in shape]
    ok = allowed[:, cols]
    if not ok.any(axis=1).all():
        sys.exit(f"stage_mix: some nodes run on none of {sorted(shape)}")
    devices = np.array([float(shape[t]) for t in shape])
    t = np.where(ok, time_ns[:, cols], 0.0)
    per_type = t.T @ count
    classes = StageSum(time_ns[:, cols], ok, count)
    mixed = StageSum(per_type[None, :], np.ones((1, len(cols)), dtype=bool), np.ones(1))
    print("model per type (ms): " + ", ".join(f"{k} {v / 1e6:.1f}" for k, v in zip(shape, per_type)))
    print(f"{len(count)} node classes; least T of {args.microbatches} microbatches on {shape}:")
    print(f"  node classes split freely across types: {least_time_ns(classes, devices, args.microbatches) / 1e6:.1f} ms")
    print(f"  every stage the model's mix:            {least_time_ns(mixed, devices, args.microbatches) / 1e6:.1f} ms")


if __name__ == "__main__":
    main()
