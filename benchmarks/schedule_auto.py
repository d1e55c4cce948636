"""What `partition --schedule auto --microbatches auto` picks, against the default GPipe with 4 microbatches.

    .venv/bin/python benchmarks/schedule_auto.py                       # the cases below, training
    .venv/bin/python benchmarks/schedule_auto.py --case gpt-small/cpu-4

For each case: `hetpart partition` once with the defaults (`--schedule gpipe --microbatches 4`) and once with
`--schedule auto --microbatches auto` (NOTE [schedule choice] in hetpart/partitioner/schedule_choice.py), both
`--no-pt2`; prints the chosen (schedule, V, M), each plan's simulated step (plan.json's, as `partition` prints
it), their ratio, each partition's wall time (timings.json `total_s`) and the choice's own (`schedule choice`
plus the passes per M), and the load average before and after. Predicted steps only: nothing is run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpart.plan_report import load_plan  # noqa: E402
from hetpart.report.table import simulated_step  # noqa: E402

CASES = {
    "gpt-small/cpu-4": ["zoo:gpt-small", "--cluster", "preset:cpu-4"],
    "llama/cpu-4": ["zoo:llama", "--cluster", "preset:cpu-4"],
    "t5/cpu-4": ["zoo:t5", "--cluster", "preset:cpu-4"],
    "gpt-small/a100-t4-8": ["zoo:gpt-small", "--cluster", "preset:a100-t4-8"],
    "llama/a100-t4-8": ["zoo:llama", "--cluster", "preset:a100-t4-8"],
    "llama-7b/hetero-64": ["zoo:llama-7b", "--meta", "--cluster", "preset:hetero-64"],
}


def partition(argv: list[str], out: Path) -> dict:
    """Run `hetpart partition ARGV --out OUT`; its plan.json, timings.json and chosen step."""
    cmd = [sys.executable, "-m", "hetpart", "partition", *argv, "--out", str(out), "--no-pt2", "--force"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    data = json.loads((out / "plan.json").read_text())
    times = json.loads((out / "timings.json").read_text())
    step = simulated_step(load_plan(out / "plan.json", data))
    return {"plan": data, "times": times, "step_us": step.step_ns / 1000, "bubble": step.bubble_fraction}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--mode", default="training", choices=["training", "inference"])
    parser.add_argument("--time-limit", default="30")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    print("| case | chosen | auto step | bubble | gpipe M=4 step | bubble | auto / default | partition default | "
          "partition auto | of which the choice |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    schedule = ["--schedule", "auto"] if args.mode == "training" else []
    for name in args.case or list(CASES):
        base = [*CASES[name], "--mode", args.mode, "--time-limit", args.time_limit]
        with tempfile.TemporaryDirectory() as tmp:
            default = partition(base, Path(tmp) / "default")
            auto = partition([*base, *schedule, "--microbatches", "auto"], Path(tmp) / "auto")
        chosen = auto["plan"]["schedule_choice"]["chosen"]
        v = f" V={chosen['virtual_stages']}" if chosen["virtual_stages"] else ""
        steps = auto["times"]["steps_s"]
        choice_s = sum(s for k, s in steps.items() if k.startswith("schedule choice"))
        print(f"| {name} | {chosen['schedule']}{v} M={chosen['microbatches']} | {auto['step_us'] / 1000:.3g} ms | "
              f"{auto['bubble']:.0%} | {default['step_us'] / 1000:.3g} ms | {default['bubble']:.0%} | "
              f"{auto['step_us'] / default['step_us']:.2f} | {default['times']['total_s']:.1f} s | "
              f"{auto['times']['total_s']:.1f} s | {choice_s:.1f} s |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
