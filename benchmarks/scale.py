"""Big models on big clusters: `hetpart partition` end to end, wall time, peak RSS and where the time goes.

    .venv/bin/python benchmarks/scale.py                                   # 7b, 70b, 405b x hetero-64/256/1024
    .venv/bin/python benchmarks/scale.py --models llama-70b --presets hetero-64 --time-limit 60
    .venv/bin/python benchmarks/scale.py --mode inference --out /tmp/scale
    .venv/bin/python benchmarks/scale.py --parallel data --time-limit 50   # issue 19's done-when table
    .venv/bin/python benchmarks/scale.py --parallel data --max-tensor-parallel 8 --time-limit 45  # ... TP stages

With `--parallel data` (the search of data-parallel pipelines, issue 19) the global batch is one
microbatch of one sequence per GPU unless `--microbatches-per-gpu` says otherwise, and each row adds the
pipelines, the tensor-parallel degree (`--max-tensor-parallel N`: the search picks it), the devices used,
the step, its bound and gap, the best baseline (plan.json's `baselines`) and the plan's speedup over it;
the geomean of the speedups closes the table; with `--max-tensor-parallel`, each degree's step, bound, part
of the time limit and seconds follow (NOTE [degrees share the time limit]).

Each (model, preset) is one `hetpart partition zoo:MODEL --meta --set dtype=bfloat16 --seq-len 2048
--mode training --cluster preset:PRESET --time-limit T --no-pt2` under `/usr/bin/time -v` (issue 19's
setting): its wall time and peak RSS, the steps of its timings.json (trace = build + export, the
passes, solve, baselines, writing), the plan's stages, gap, status, which bounds it went without and
what searched (plan.json's `bounds`), or the one-line error of a model the cluster cannot hold (NOTE
[refused before the trace]). Targets (issue 19): <= 2 minutes and <= 4 GB RSS each. Prints a table;
the machine's load average before and after goes with it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HETPART = ROOT / ".venv" / "bin" / "hetpart"


def run_one(model: str, preset: str, args: argparse.Namespace) -> dict:
    out = Path(args.out) / f"{model}-{preset}"
    cmd = ["/usr/bin/time", "-v", str(HETPART), "partition", f"zoo:{model}", "--meta", "--set", "dtype=bfloat16",
           "--seq-len", str(args.seq_len), "--mode", args.mode, "--cluster", f"preset:{preset}",
           "--time-limit", str(args.time_limit), "--no-pt2", "--out", str(out), "--force"]
    if args.parallel == "data":
        m = _microbatches(model, preset, args)
        schedule = args.schedule.get(model, "1f1b")
        cmd += ["--parallel", "data", "--batch-size", str(m), "--microbatches", str(m), "--schedule", schedule]
        if args.max_tensor_parallel > 1:  # NOTE [tensor-parallel pipelines]: the search picks the degree
            cmd += ["--max-tensor-parallel", str(args.max_tensor_parallel)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    row = {"model": model, "preset": preset, "rc": proc.returncode, "wall_s": wall,
           "rss_gb": int(rss.group(1)) / 1e6 if rss else None}
    if proc.returncode != 0:
        row["error"] = next((ln for ln in proc.stderr.splitlines() if ln.startswith("hetpart: error:")),
                            proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?")
        return row
    steps = json.loads((out / "timings.json").read_text())["steps_s"]
    plan = json.loads((out / "plan.json").read_text())
    bounds = plan.get("bounds") or {}
    row.update(
        trace_s=steps.get("trace/build", 0) + steps.get("trace/export", 0),
        passes_s=sum(v for k, v in steps.items() if k.startswith("pass/")),
        solve_s=steps.get("solve", 0), baselines_s=steps.get("baselines", 0),
        write_s=sum(v for k, v in steps.items() if k.startswith("write/") or k in ("split", "examples")),
        stages=len(plan["stages"]), devices=len(plan["cluster"]["devices"]), gap=plan["gap"],
        status=plan["solver_status"], bottleneck_ms=plan["bottleneck_us"] / 1000,
        left_out=",".join(bounds.get("unfinished", []) + bounds.get("skipped", [])) or "-",
        search=bounds.get("search", ""),
    )
    if args.parallel == "data":
        base = [b for b in plan.get("baselines", []) if b.get("iteration_us")]
        best = min(base, key=lambda b: b["iteration_us"], default=None)
        idle = sorted({why.split(":")[0] for why in (plan.get("devices_idle") or {}).values()})
        st = plan.get("search_stats") or {}
        row["join"] = (f"{st['join_tries']:.0f} / {st['join_solves']:.0f} / {st['join_taken']:.0f}, "
                       f"{st['join_seconds']:.1f} s" if "join_tries" in st else "-")  # NOTE [join probe]
        row["reasons"] = {}
        for device, why in (plan.get("devices_idle") or {}).items():
            row["reasons"].setdefault(why, []).append(device)
        row["tp"] = max(len(s.get("devices") or [s]) for s in plan["stages"])  # a TP stage lists its group's devices
        # The solve's two lines, unwrapped (the console wraps at 160 columns).
        said = re.search(r"^tensor parallel, data-parallel pipelines: (.*?chose\s+degree\s+\d+)", proc.stdout,
                         re.S | re.M)
        parts = re.search(r"^the degrees' parts of the time limit \(.*?\): "
                          r"((?:degree\s+\d+\s+[\d.]+\s+s\s+of\s+[\d.]+\s+s,?\s*)+)", proc.stdout, re.S | re.M)
        row["degrees"] = " ".join(((said.group(1) if said else "") + (f"; {parts.group(1).strip()}" if parts else "")).split())
        row.update(pipelines=len(plan.get("pipelines") or [1]), used=len(plan.get("devices_used") or []),
                   iteration_s=plan["iteration_us"] / 1e6, bound_s=plan["lower_bound_us"] / 1e6,
                   best=f"{best['name']} {best['iteration_us'] / 1e6:.2f}" if best else "none has a plan",
                   speedup=best["iteration_us"] / plan["iteration_us"] if best else None, idle=", ".join(idle) or "-",
                   taken=bool(best) and abs(best["iteration_us"] - plan["iteration_us"]) < 1e-3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["llama-7b", "llama-70b", "llama-405b"])
    ap.add_argument("--presets", nargs="+", default=["hetero-64", "hetero-256", "hetero-1024"])
    ap.add_argument("--mode", default="training", choices=["training", "inference"])
    ap.add_argument("--time-limit", type=float, default=60)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--out", default="/tmp/hetpart-scale")
    ap.add_argument("--parallel", default="pipeline", choices=["pipeline", "data"])
    ap.add_argument("--max-tensor-parallel", type=int, default=1,
                    help="--parallel data: passed to partition, the search picks each plan's TP degree up to this")
    ap.add_argument("--microbatches-per-gpu", type=int, default=1, help="--parallel data: the global batch per GPU")
    ap.add_argument("--schedule", type=lambda t: dict(x.split("=") for x in t.split(",")),
                    default={"llama-405b": "gpipe"}, help="--parallel data: MODEL=SCHEDULE,... (default 1f1b)")
    ap.add_argument("--batch", type=lambda t: dict(x.split("=") for x in t.split(",")), default={"llama-405b": "8"},
                    help="--parallel data: MODEL=MICROBATCHES,... (default one per GPU; the 405B-shaped model's "
                         "stash leaves room for a few: NOTE [pipeline shapes])")
    args = ap.parse_args()
    if args.parallel == "data":
        return data_table(args)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)
    print("| model | preset | wall s | RSS GB | trace s | passes s | solve s | baselines s | write s | stages/devices "
          "| bottleneck ms | gap | status | bounds left out | search |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for model in args.models:
        for preset in args.presets:
            r = run_one(model, preset, args)
            head = f"| {model} | {preset} | {r['wall_s']:.1f} | {r['rss_gb'] or 0:.2f} |"
            if r["rc"] != 0:
                print(f"{head} refused or failed (exit {r['rc']}): {r['error'][:160]} |", flush=True)
                continue
            print(f"{head} {r['trace_s']:.1f} | {r['passes_s']:.1f} | {r['solve_s']:.1f} | {r['baselines_s']:.1f} | "
                  f"{r['write_s']:.1f} | {r['stages']}/{r['devices']} | {r['bottleneck_ms']:.1f} | {r['gap']:.1%} | "
                  f"{r['status']} | {r['left_out']} | {r['search']} |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)


def _microbatches(model: str, preset: str, args: argparse.Namespace) -> int:
    """The global batch of a `--parallel data` row, in microbatches of one sequence."""
    return int(args.batch.get(model, args.microbatches_per_gpu * int(preset.rpartition("-")[2])))


def data_table(args: argparse.Namespace) -> None:
    """Issue 19's done-when table: `--parallel data` on every model x preset, and the geomean speedup."""
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())  # noqa: E731
    print(f"load before: {load()}", flush=True)
    print("| model | preset | M | wall s | RSS GB | trace s | solve s | pipelines | TP | used | iteration s | bound s "
          "| gap "
          "| best baseline s | speedup | idle reasons | join probe: tries / solves / taken, s |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    speedups, reasons, degrees = [], [], []
    for model in args.models:
        for preset in args.presets:
            r = run_one(model, preset, args)
            m = _microbatches(model, preset, args)
            head = f"| {model} | {preset} | {m} | {r['wall_s']:.1f} | {r['rss_gb'] or 0:.2f} |"
            if r["rc"] != 0:
                print(f"{head} refused or failed (exit {r['rc']}): {r['error'][:300]} |", flush=True)
                continue
            if r["speedup"] is not None:
                speedups.append(r["speedup"])
            speed = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
            print(f"{head} {r['trace_s']:.1f} | {r['solve_s']:.1f} | {r['pipelines']} | {r['tp']} | "
                  f"{r['used']}/{r['devices']} "
                  f"| {r['iteration_s']:.4g} | {r['bound_s']:.4g} | {r['gap']:.1%} | {r['best']} | {speed}"
                  f"{' (the baseline is the plan)' if r['taken'] else ''} | {r['idle']} | {r['join']} |", flush=True)
            degrees += [f"- {model} / {preset}: {r['degrees']}"] if r["degrees"] else []
            reasons += [f"- {model} / {preset}, {len(devs)} device(s) ({devs[0]} ...): {why}"
                        for why, devs in r["reasons"].items()]
    print("\n".join(["", "Each degree's search (the solve's line):"] + degrees) if degrees else "", flush=True)
    print("\n".join(["", "Idle reasons (NOTE [idle reasons]):"] + reasons) if reasons else "", flush=True)
    if speedups:
        print(f"geomean speedup over the best baseline: {math.prod(speedups) ** (1 / len(speedups)):.2f}x "
              f"({len(speedups)} rows with a baseline)")
    print(f"load after: {load()}", flush=True)


if __name__ == "__main__":
    main()
