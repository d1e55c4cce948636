"""A tensor-parallel stage's measured time against the cost model's prediction with a profile (issue 20).

    .venv/bin/python benchmarks/tp_stage_measured.py                           # 1 stage x TP 2 on preset:cpu-2
    .venv/bin/python benchmarks/tp_stage_measured.py --cluster preset:cpu-4 --emulate --period-us 2000

1. profile the model's ops once, alone (`hetpart profile`, one thread, as a rank runs); with
   --cluster preset:cpu-4 and no --emulate, with the cluster's siblings (`profile --cluster`);
2. `hetpart partition --profile` twice: `--tensor-parallel 2` and the one-device-per-stage plan;
3. interleaved runs (A B A B ..., --rounds of each) of `hetpart run --measure --steps N
   [--emulate]`, the first step left out;
4. prints, per rank, the median forward of one microbatch (wall, and the rank thread's CPU time)
   against the plan's predicted time of its stage (compute + the all-reduces its sharding implies,
   NOTE [tensor-parallel costs] in hetpart/passes/tp_lower.py), and the measured step against the
   plan's simulated step; under --emulate every prediction is divided by the emulation's scale
   (each rank's share of a core, NOTE [emulated devices] in hetpart/runtime/emulate.py).

On preset:cpu-2 a TP-2 plan is one stage on both cores: each rank has a core of its own, so the
measured forward is the device's, all-reduce waits included. On cpu-4 (4 ranks, 2 cores) the ranks
share cores; --emulate pins them and fixes each one's share (a shorter --period-us throttles in finer
slices, so the two ranks of a group wait less for each other at every all-reduce).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from measured_speedup import _hetpart  # noqa: E402 - `python -m hetpart ARGS` with this tree first
from schedules import emulation_scale, run_fresh, with_measured_link  # noqa: E402
from hetpart.plan_report import load_plan  # noqa: E402
from hetpart.report.table import simulated_step  # noqa: E402

MODEL = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=256", "--set", "vocab_size=512", "--set",
         "block_size=64", "--batch-size", "8", "--seq-len", "64"]


def _measure(out: Path, mode: str, steps: int, emulate: bool, period_us: int) -> dict:
    """One `hetpart run --measure` of `out` in a fresh process (with the emulation's period set), its measured.json."""
    run_fresh(out, period_us, mode=mode, steps=steps, measure=True, emulate=emulate)
    return json.loads((out / "measured.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", default="preset:cpu-2")
    parser.add_argument("--mode", choices=["training", "inference"], default="inference")
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6, help="steps per run (the first is left out)")
    parser.add_argument("--emulate", action="store_true", help="pin and throttle the ranks (cgroups; root)")
    parser.add_argument("--period-us", type=int, default=10_000, help="the emulation's CPU-quota period")
    parser.add_argument("--measure-link", action="store_true",
                        help="plan on a copy of the preset whose link is measured first (`hetpart profile-link`: "
                             "gloo all-reduces between 2 local processes), not the preset's guess")
    args = parser.parse_args()
    model = [*MODEL, "--microbatches", str(args.microbatches)]
    print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="hetpart-tp-measured-") as tmp:
        work = Path(tmp)
        if args.measure_link:
            if not args.cluster.startswith("preset:"):
                parser.error("--measure-link rewrites a preset's link")
            name = args.cluster.removeprefix("preset:")
            args.cluster = with_measured_link(name, "all-reduce", work / f"{name}-measured.toml")
        profile = work / "cpu.json"
        siblings = ["--cluster", args.cluster] if args.cluster == "preset:cpu-4" and not args.emulate else []
        _hetpart("profile", *model, *siblings, *(["--backward"] if args.mode == "training" else []),
                 "--out", str(profile))
        plans = {}
        for name, extra in (("TP 2", ["--tensor-parallel", "2"]), ("one device per stage", [])):
            out = work / name.replace(" ", "_")
            _hetpart("partition", *model, "--cluster", args.cluster, "--mode", args.mode, "--profile", str(profile),
                     "--out", str(out), "--no-pt2", *extra)
            plans[name] = out
        runs: dict[str, list[tuple[dict, float]]] = {n: [] for n in plans}
        for r in range(args.rounds):
            for name, out in plans.items():  # interleaved: A B, A B, ...
                load = os.getloadavg()[0]
                runs[name].append((_measure(out, args.mode, args.steps, args.emulate, args.period_us), load))
            print(f"  round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"\n{MODEL[0]} ({' '.join(MODEL[1:])}), {args.mode}, {args.microbatches} microbatches, {args.cluster}"
              f"{f', --emulate at a {args.period_us} us period' if args.emulate else ''}; {args.rounds} rounds of "
              f"{args.steps} steps (first left out); load {min(ld for rs in runs.values() for _, ld in rs):.1f}-"
              f"{max(ld for rs in runs.values() for _, ld in rs):.1f}\n")
        print("| plan | rank | device | predicted compute ms (all-reduces in) | measured forward ms (p10-p90) | measured / "
              "predicted | CPU time ms | predicted step ms | measured step ms | step measured / predicted |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, out in plans.items():
            plan = load_plan(out / "plan.json", json.loads((out / "plan.json").read_text()))
            scale = emulation_scale(out) if args.emulate else 1.0
            step_pred = simulated_step(plan).step_ns / 1e6 / scale
            step = statistics.median(m["step_time_us"] for m, _ in runs[name]) / 1e3
            for k in range(len(runs[name][0][0]["stages"])):
                per = [m["stages"][k] for m, _ in runs[name]]
                pred = per[0]["predicted_compute_us"] / scale / 1e3  # its ops and the all-reduces they imply
                fwd = statistics.median(p["measured_time_us"] for p in per) / 1e3
                cpu = statistics.median(p["measured_cpu_time_us"] for p in per) / 1e3
                p10 = min(p["forward_us"]["p10"] for p in per) / 1e3
                p90 = max(p["forward_us"]["p90"] for p in per) / 1e3
                print(f"| {name} | {k} | {per[0]['device']} | {pred:.2f} | {fwd:.2f} ({p10:.2f}-{p90:.2f}) | "
                      f"{fwd / pred:.2f} | {cpu:.2f} | {step_pred:.2f} | {step:.2f} | {step / step_pred:.2f} |")
    print(f"\nload average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
