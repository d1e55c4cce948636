"""Where a `--parallel data` plan's gap lies (issue 19): plan against bound, part by part.

    .venv/bin/python benchmarks/pipeline_gaps.py /tmp/hetpart-scale/llama-7b-hetero-64 [DIR ...]

Each DIR is a `hetpart partition --parallel data` output (what `benchmarks/scale.py --parallel data`
writes). The lowered problem is read from DIR/ir/analysis.json (pickled beside it the first time, so
later runs skip the JSON), and for each plan it prints: the step, the slowest pipeline's stage sum and
bottleneck with the transfer part of each (stage time = compute + both boundaries, NOTE [stage time]),
the sync; then each bound of NOTE [pipelines bound] / NOTE [pipelines memory bound] alone (no memory,
the memory bound's one- and many-pipeline parts) and the full bound, each with its time. Nothing is
solved again, so a row costs the bounds only (seconds to a minute).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpart.partitioner.pipeline_bounds import pipelines_lower_bound  # noqa: E402
from hetpart.partitioner.problem_json import problem_from_json  # noqa: E402


def load_problem(out: Path):
    """The problem `partition` solved: DIR/ir/analysis.json, pickled beside it once."""
    pkl = out / "ir" / "problem.pkl"
    if pkl.exists():
        return pickle.loads(pkl.read_bytes())
    problem = problem_from_json(json.loads((out / "ir" / "analysis.json").read_text())["problem"])
    pkl.write_bytes(pickle.dumps(problem))
    return problem


def plan_parts(plan: dict) -> dict:
    """The slowest pipeline's parts: stages, microbatches, stage sum (compute / transfers), bottleneck."""
    pipes = plan.get("pipelines") or [{"microbatches": plan["microbatches"], "stages": plan["stages"],
                                       "time_us": plan["iteration_us"] - plan.get("grad_sync_us", 0)}]
    slow = max(pipes, key=lambda q: q["time_us"])
    st = slow["stages"]
    times = [s["compute_us"] + s["comm_in_us"] + s["comm_out_us"] for s in st]
    b = max(range(len(st)), key=lambda k: times[k])
    return {"pipelines": len(pipes), "S": len(st), "m": slow["microbatches"], "time_ms": slow["time_us"] / 1e3,
            "sum_compute_ms": sum(s["compute_us"] for s in st) / 1e3,
            "sum_comm_ms": sum(s["comm_in_us"] + s["comm_out_us"] for s in st) / 1e3,
            "b_ms": times[b] / 1e3, "b_comm_ms": (st[b]["comm_in_us"] + st[b]["comm_out_us"]) / 1e3,
            "b_type": st[b]["device_type"], "sync_ms": plan.get("grad_sync_us", 0) / 1e3,
            "shapes": sorted({(len(q["stages"]), q["microbatches"]) for q in pipes})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds each bound may take")
    args = ap.parse_args()
    for d in map(Path, args.dirs):
        plan = json.loads((d / "plan.json").read_text())
        problem = load_problem(d)
        M = sum(q["microbatches"] for q in plan["pipelines"]) if plan.get("pipelines") else plan["microbatches"]
        parts = plan_parts(plan)
        print(f"## {d.name}: M = {M}, step {plan['iteration_us'] / 1e3:.1f} ms, printed bound "
              f"{plan['lower_bound_us'] / 1e3:.1f} ms, gap {plan['gap']:.1%}")
        print("plan: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in parts.items()))
        for name, kw in (("no memory", {"memory": False}), ("full", {})):
            t0 = time.perf_counter()
            b = pipelines_lower_bound(problem, M, deadline=time.perf_counter() + args.deadline, **kw)
            print(f"bound {name}: {b.bound_ns / 1e6:.1f} ms (one pipeline {b.one_pipeline_ns / 1e6:.1f} ms), "
                  f"{time.perf_counter() - t0:.1f} s, unfinished {b.unfinished or '-'}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
