"""Measured vs simulated step time of the pipeline schedules on preset:cpu-4 with a profile (issue 23).

    .venv/bin/python benchmarks/schedules.py                         # gpt-small, training, 3 rounds
    .venv/bin/python benchmarks/schedules.py --mode inference --rounds 2 --steps 4

1. profile the model once as `hetpart profile --cluster preset:cpu-4 --backward` does (the ops timed
   while 3 sibling processes run the rest of the graph, as cpu-4's other ranks will);
2. `hetpart partition --profile` once per schedule: 1f1b (one stage per device, the reference) and
   the virtual-stage ones, interleaved-1f1b and interleaved-zb (--virtual-stages 2: 8 stages on 4);
3. interleaved runs, A B C A B C ... (--rounds of each), of `hetpart run --steps N`, the first step of
   each run left out; a schedule's measured step is the median over its rounds of each run's median;
4. prints each schedule's simulated step (`simulated_step` of plan.json: the report's and partition's
   figure, NOTE [virtual-stage schedules] in partitioner/simulate.py), the measured one, the error
   |measured - simulated| / measured, and the load average at each run.

The 4 ranks share this machine's cores (2 here) with whatever else runs: the profile's concurrency
assumes the ranks only; a load above the core count slows every measured figure.

With --emulate (NOTE [emulated devices] in hetpart/runtime/emulate.py) the ranks do not compete for
cores: each runs pinned to one core at a fixed CPU quota (cpu-4's 4 equal devices on 2 cores: half a
core each), so the devices are known ones, and every simulated figure is divided by the emulation's
scale (the share of a core each rank gets), the plan's step at the emulated speed. The profile is
still taken with cpu-4's three sibling ranks beside it (`--cluster`, NOTE [concurrent profile]): the
emulated ranks share each core two by two and one L3, and a profile taken alone times the same ops
10-18% faster than they run there (docs/benchmarks.md, "Issue 23's schedules on a quiet machine");
`--profile-alone` takes it alone, as this script did before (one thread, no siblings).
`--emulate-by sleep` pads each forward and backward to that share instead of a quota.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpart.plan_report import load_plan  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from measured_speedup import _hetpart, link_toml  # noqa: E402 - `python -m hetpart ARGS` with this tree first
from hetpart.report.table import simulated_step  # noqa: E402

MODEL = ["zoo:gpt-small", "--set", "n_layer=8", "--batch-size", "16", "--seq-len", "64"]
SCHEDULES = ["1f1b", "interleaved-1f1b", "interleaved-zb"]


def run_fresh(out: Path, period_us: int | None = None, **options: object) -> list[float]:
    """One `hetpart run` of `out` with these RunOptions fields, in a fresh process (`period_us`: the emulation's
    CPU-quota period, else its default); each step's seconds (rank D-1's, as `run` prints)."""
    period = f"import hetpart.runtime.emulate as e; e.PERIOD_US = {period_us}; " if period_us is not None else ""
    code = (f"import json; from pathlib import Path; {period}from hetpart.runtime import RunOptions, run_pipeline; "
            f"r = run_pipeline(Path({str(out)!r}), RunOptions(**{options!r}), echo=lambda s: None); "
            "print(json.dumps(r.all_step_seconds))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"run {out} ({options}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_measured_link(preset: str, op: str, path: Path, given: str | None = None, **measure: Any) -> str:
    """Write `preset:NAME` to `path` with its machine's link measured by `hetpart profile-link --op op` (NOTE
    [measured links] in hetpart/profiler/links.py; `measure`: measure_link's sizes, repeats, gap_us), or the
    `given` one (`link = {...}`); the path, and print what was fitted."""
    import re
    from textwrap import dedent

    from hetpart.devices.cluster import PRESETS
    from hetpart.profiler.links import measure_link

    if given is None:
        fit = measure_link(op, **measure)
        given = fit.toml()
        print(f"profile-link --op {op}: " + ", ".join(f"{n / 1024:g} KiB {t:.0f} us" for n, t in fit.measured_us.items())
              + f" -> {given} (the preset's: {re.search(r'link = [{][^}]*[}]', PRESETS[preset]).group(0)})", flush=True)
    path.write_text(re.sub(r"link = [{][^}]*[}]", given, dedent(PRESETS[preset])))
    return str(path)


def emulation_scale(out: Path) -> float:
    """The share of a core every rank of `out` gets under `run --emulate` (1.0: a whole core)."""
    from hetpart.runtime.emulate import emulation_plan

    plan = load_plan(out / "plan.json", json.loads((out / "plan.json").read_text()))
    ranks = json.loads((out / "manifest.json").read_text())["ranks"]
    return emulation_plan(plan, rank_devices=[r["planned_device"] for r in ranks]).scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["training", "inference"], default="training")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps per run (the first is left out)")
    parser.add_argument("--schedules", nargs="+", default=SCHEDULES, choices=SCHEDULES)
    parser.add_argument("--json", type=Path, default=None, help="also write every run here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the profile and the plans in this (new) folder")
    parser.add_argument("--measure-link", action="store_true",
                        help="plan on a copy of cpu-4 whose link is measured first (`hetpart profile-link --op "
                             "send-recv`), not the preset's guess")
    parser.add_argument("--link", default=None, metavar="GBPS,US", type=link_toml,
                        help="plan on a copy of cpu-4 with this link (GB/s, us: an earlier --measure-link's fit, to "
                             "compare runs on one link)")
    parser.add_argument("--emulate", action="store_true",
                        help="run each rank on its own core at a fixed quota (cgroups; root)")
    parser.add_argument("--profile-alone", action="store_true",
                        help="with --emulate: profile alone, without cpu-4's 3 sibling ranks beside it (NOTE "
                             "[concurrent profile]), as this script did before handoff2")
    parser.add_argument("--emulate-by", default="quota", choices=["quota", "sleep"],
                        help="with --emulate: CPU quotas (cgroups) or each forward/backward padded with a sleep "
                             "(NOTE [emulation by sleep] in hetpart/runtime/emulate.py)")
    args = parser.parse_args()
    model = [*MODEL, "--microbatches", str(args.microbatches)]
    with tempfile.TemporaryDirectory(prefix="hetpart-schedules-") as tmp:
        work = Path(tmp)
        profile = work / "cpu.json"
        print(f"profiling ({os.getloadavg()[0]:.1f} load) ...", flush=True)
        given = args.link
        cluster = (with_measured_link("cpu-4", "send-recv", work / "cpu-4.toml", given)
                   if args.measure_link or given else "preset:cpu-4")
        # --emulate: each core still runs two ranks' ops in turn, sharing caches: siblings unless --profile-alone
        siblings = [] if args.emulate and args.profile_alone else ["--cluster", "preset:cpu-4"]
        _hetpart("profile", *model, *siblings, "--backward", "--out", str(profile))
        plans, predicted_ms, stage_counts = {}, {}, {}
        for schedule in args.schedules:
            out = work / schedule
            _hetpart("partition", *model, "--cluster", cluster, "--mode", args.mode, "--schedule", schedule,
                     "--profile", str(profile), "--out", str(out), "--no-pt2")
            plans[schedule] = out
            plan = load_plan(out / "plan.json", json.loads((out / "plan.json").read_text()))
            scale = emulation_scale(out) if args.emulate else 1.0
            predicted_ms[schedule] = simulated_step(plan).step_ns / 1e6 / scale
            stage_counts[schedule] = len(plan.stages)
        runs: dict[str, list[tuple[float, float]]] = {s: [] for s in args.schedules}  # (median step s, load)
        for r in range(args.rounds):
            for schedule, out in plans.items():  # interleaved: A B C, A B C, ...
                load = os.getloadavg()[0]
                steps = run_fresh(out, mode=args.mode, schedule=schedule, steps=args.steps, emulate=args.emulate,
                                  **({"emulate_by": args.emulate_by} if args.emulate else {}))[1:]
                runs[schedule].append((statistics.median(steps), load))
                print(f"  round {r}: {schedule}: {statistics.median(steps) * 1e3:.1f} ms (load {load:.1f})",
                      flush=True)
        if args.keep is not None:
            shutil.copytree(work, args.keep)
    profiled = "alone" if args.profile_alone else "with --cluster preset:cpu-4's siblings"
    how = (f"run --emulate --emulate-by {args.emulate_by} (each rank on one core at a fixed share), profile --backward "
           f"{profiled}, simulated / scale" if args.emulate else "profile --cluster preset:cpu-4 --backward")
    print(f"\n{MODEL[0]} ({' '.join(MODEL[1:])}), {args.mode}, {args.microbatches} microbatches, preset:cpu-4, "
          f"{how}; {args.rounds} rounds of {args.steps} steps\n")
    print(f"| schedule | stages | simulated step ms | measured step ms (median of rounds) | rounds ms | error | "
          f"simulated / {args.schedules[0]} | measured / {args.schedules[0]} (median of rounds) | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    base = args.schedules[0]
    for schedule in args.schedules:
        sim_ratio = predicted_ms[schedule] / predicted_ms[base]
        ratio = statistics.median(a / b for (a, _), (b, _) in zip(runs[schedule], runs[base]))  # same round
        measured = statistics.median(s for s, _ in runs[schedule]) * 1e3
        error = abs(measured - predicted_ms[schedule]) / measured
        print(f"| {schedule} | {stage_counts[schedule]} | {predicted_ms[schedule]:.1f} | {measured:.1f} | "
              f"{' / '.join(f'{s * 1e3:.0f}' for s, _ in runs[schedule])} | {error:.0%} | {sim_ratio:.2f} | {ratio:.2f} | "
              f"{' / '.join(f'{ld:.1f}' for _, ld in runs[schedule])} |")
        rows.append({"schedule": schedule, "simulated_ms": predicted_ms[schedule], "measured_ms": measured,
                     "error": error, "runs": runs[schedule], "simulated_ratio": sim_ratio, "measured_ratio": ratio})
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
