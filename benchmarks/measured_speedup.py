"""Measured, not only predicted: hetpart's plan against every baseline on emulated heterogeneous clusters.

    .venv/bin/python benchmarks/measured_speedup.py                                 # everything (see --help)
    .venv/bin/python benchmarks/measured_speedup.py --models gpt-small --clusters 2 --rounds 2   # a smoke test

For each zoo model and each emulated cluster (2, 3 or 4 device speeds, built here):
1. profile the model's ops once on this CPU (`hetpart profile`, as device type `cpu`) and write one
   copy of that profile per emulated type, every time divided by the type's speed, so the plans are
   made with the times the emulated devices will have (NOTE [emulated devices] in
   hetpart/runtime/emulate.py: the speeds of `run --emulate` then come from the profile);
2. `hetpart partition --strategy S` for `optimal` and every baseline (plans that are the same split
   on the same devices are run once and reported for every name);
3. interleaved runs, A B C A B C ... (--rounds of each), of `hetpart run --emulate --measure
   --steps N`, the first step of each run left out; the figure is the median over rounds of each
   run's median step (with `--emulate-by quota,sleep`, every run under each emulation in turn,
   reported apart: NOTE [emulation by sleep]; each run's hand-off breakdown is kept in --json, which
   `benchmarks/handoff.py FILE --from-speedup-json` prints);
4. prints, per model and cluster, each strategy's measured step, its measured slowdown against
   hetpart's plan beside the predicted one (simulated steps, NOTE [simulated ratios] in
   hetpart/partitioner/baselines.py), per-stage predicted vs measured forward times, and the
   load average (`os.getloadavg`) beside each figure. Runs share this machine's cores with
   whatever else runs: a load above the core count makes every figure noisy.

Writes --json (default benchmarks/measured_speedup.json is not written unless asked) with every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpart.partitioner.baselines import STRATEGIES  # noqa: E402
from hetpart.plan_report import load_plan  # noqa: E402
from hetpart.report.table import simulated_step  # noqa: E402
from hetpart.partitioner.simulate import simulate  # noqa: E402

# Small enough for a step of ~0.1-0.5 s on one throttled core, big enough that ops outweigh dispatch.
MODELS = {
    "gpt-small": ["--set", "n_layer=8", "--batch-size", "8", "--seq-len", "64"],
    "llama": ["--batch-size", "8", "--seq-len", "64"],
    "resnet": ["--batch-size", "16"],
    "t5": ["--batch-size", "8", "--seq-len", "32"],
    "unet": ["--batch-size", "8"],
}
# Emulated clusters: each device's speed (share of the fastest) and the core it runs on (2 cores).
# The 4-speed cluster is 70/60/40/30% of a core once `--emulate` scales it to fit 2 cores.
CLUSTERS = {
    "2": [(1.0, 0), (0.375, 1)],
    "3": [(1.0, 0), (0.6, 1), (0.4, 1)],
    "4": [(1.0, 0), (0.857, 1), (0.571, 1), (0.429, 0)],
}
CPU_TFLOPS, CPU_MEM_BW_GBPS = 2.9, 204.8  # the catalog's `cpu` type, scaled per emulated type


def _load() -> float:
    return os.getloadavg()[0]


def _hetpart(*args: str, timeout_s: float = 900) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "hetpart", *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"hetpart {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def cluster_toml(speeds: list[tuple[float, int]], link: str = "link = { bandwidth_GBps = 10, latency_us = 20 }") -> str:
    """One machine, one custom type per speed (`emu-<percent>`), each device on its core."""
    types, devices = [], []
    for speed, core in speeds:
        name = f"emu-{round(speed * 1000)}"
        if name not in [t[0] for t in types]:
            types.append((name, speed))
        devices.append(f'{{type = "{name}", core = {core}}}')
    text = "".join(f'[[device_types]]\nname = "{n}"\npeak_tflops = {{ fp32 = {CPU_TFLOPS * s:.4f} }}\n'
                   f"mem_GB = 64\nmem_bw_GBps = {CPU_MEM_BW_GBPS * s:.3f}\n\n" for n, s in types)
    return text + ('[[nodes]]\nname = "m"\ndevices = [' + ", ".join(devices) + "]\n"
                   f"{link}\n")


def scaled_profiles(base: Path, speeds: list[tuple[float, int]], workdir: Path) -> list[Path]:
    """One profile per emulated type: the CPU's times divided by the type's speed."""
    data = json.loads(base.read_text())
    out = []
    for speed in sorted({s for s, _ in speeds}, reverse=True):
        name = f"emu-{round(speed * 1000)}"
        copy = dict(data, device_type=name,
                    forward_ns={k: round(v / speed) for k, v in data["forward_ns"].items()},
                    backward_ns={k: round(v / speed) for k, v in data.get("backward_ns", {}).items()})
        path = workdir / f"{name}.json"
        path.write_text(json.dumps(copy))
        out.append(path)
    return out


def _signature(plan: dict) -> tuple:
    return tuple((s["device"], s["node_count"], s["compute_us"]) for s in plan["stages"])


def run_case(model: str, cluster: str, args: argparse.Namespace, workdir: Path) -> dict:
    speeds = CLUSTERS[cluster]
    case = workdir / f"{model}-{cluster}"
    case.mkdir()
    (case / "cluster.toml").write_text(cluster_toml(speeds, *([args.link] if args.link else [])))
    model_args = [f"zoo:{model}", *MODELS[model], "--microbatches", str(args.microbatches)]
    profile = case / "cpu.json"
    _hetpart("profile", *model_args, "--out", str(profile), "--device-type", "cpu", "--repeats", "10")
    profiles = [x for p in scaled_profiles(profile, speeds, case) for x in ("--profile", str(p))]
    plans: dict[str, dict] = {}
    dirs: dict[str, Path] = {}
    same_as: dict[str, str] = {}
    for strategy in args.strategies:
        out = case / strategy
        try:
            _hetpart("partition", *model_args, "--cluster", str(case / "cluster.toml"), "--out", str(out),
                     "--no-pt2", "--time-limit", str(args.time_limit), "--strategy", strategy, *profiles)
        except RuntimeError as err:
            print(f"  {model} on {cluster} speeds: --strategy {strategy} has no runnable plan: "
                  f"{str(err).strip().splitlines()[-1]}", flush=True)
            continue
        plan = json.loads((out / "plan.json").read_text())
        twin = next((s for s, p in plans.items() if _signature(p) == _signature(plan)), None)
        if twin is not None:
            same_as[strategy] = twin
            shutil.rmtree(out)
        else:
            plans[strategy], dirs[strategy] = plan, out
    runs: dict[str, dict[str, list[dict]]] = {mode: {s: [] for s in plans} for mode in args.emulate_by}
    for r in range(args.rounds):
        for strategy, out in dirs.items():  # interleaved: A B C, A B C, ... (each emulation in turn)
            for mode in args.emulate_by:
                load = _load()
                _hetpart("run", str(out), "--emulate", "--emulate-by", mode, "--measure", "--steps", str(args.steps),
                         timeout_s=600)
                measured = json.loads((out / "measured.json").read_text())
                timeline = measured.get("timeline") or {}
                runs[mode][strategy].append({
                    "load_before": round(load, 2), "load_after": round(_load(), 2),
                    "step_us": measured["step_us"]["median"], "stages": measured["stages"],
                    "scale": measured["emulation"]["scale"], "ranks": measured["emulation"]["ranks"],
                    "handoff": timeline.get("handoff")})  # NOTE [hand-off latency]: where each rank's step went
        print(f"  {model} on {cluster} speeds: round {r + 1}/{args.rounds} done (load {_load():.2f})", flush=True)
    return [{"model": model, "cluster": cluster, "speeds": speeds, "plans": plans, "same_as": same_as,
             "emulate_by": mode, "runs": runs[mode]} for mode in args.emulate_by]


def _predicted_step_us(plan: dict) -> float:
    """The plan's simulated step (plan.json as a dict, read through the one loader)."""
    return simulated_step(load_plan(Path("plan.json"), plan)).step_ns / 1000


def resimulated_step_us(plan: dict, rs: list[dict]) -> float:
    """The plan's schedule played with each stage's measured median forward (and the plan's transfers).

    Beside the measured step it splits the gap: a measured step near this one means the
    stages' compute was mispredicted; far above it, the loss is the pipeline's own (jitter
    of tightly balanced stages, transfers, the launcher's waits).
    """
    forwards = [round(statistics.median(r["stages"][k]["forward_us"]["median"] for r in rs) * 1000)
                for k in range(len(plan["stages"]))]
    return simulate(forwards, [round(s["comm_out_us"] * 1000) for s in plan["stages"][:-1]],
                    plan["microbatches"]).step_ns / 1000


def jittered_step_us(plan: dict, rs: list[dict], samples: int = 400, seed: int = 0) -> float:
    """The mean GPipe forward step when each microbatch's forward on stage k is drawn from a normal
    with stage k's measured median and spread ((p90 - p10) / 2.563, clipped at 0).

    Inference only (the forward recursion of a pipeline: microbatch i leaves stage k at
    max(it left stage k-1, stage k finished i-1) + transfer + its forward). Against the step
    simulated from the medians alone it prices what jitter costs a tightly balanced pipeline.
    """
    import random

    rng = random.Random(seed)
    stages = range(len(plan["stages"]))
    med = [statistics.median(r["stages"][k]["forward_us"]["median"] for r in rs) for k in stages]
    sd = [statistics.median((r["stages"][k]["forward_us"]["p90"] - r["stages"][k]["forward_us"]["p10"]) / 2.563
                            for r in rs) for k in stages]
    comm = [s["comm_out_us"] for s in plan["stages"]]
    total = 0.0
    for _ in range(samples):
        done = [0.0] * len(med)  # when stage k finished its last microbatch
        for _i in range(plan["microbatches"]):
            ready = 0.0
            for k in stages:
                start = max(ready, done[k])
                done[k] = start + max(0.0, rng.gauss(med[k], sd[k]))
                ready = done[k] + comm[k]
        total += done[-1]
    return total / samples


def report(case: dict) -> list[str]:
    plans, runs = case["plans"], case["runs"]
    if "optimal" not in runs:
        return [f"{case['model']} on {case['cluster']} speeds: no optimal plan ran"]
    speeds = "/".join(f"{s:.0%}" for s, _ in case["speeds"])
    mine = statistics.median(r["step_us"] for r in runs["optimal"])
    mine_pred = _predicted_step_us(plans["optimal"])
    how = f", --emulate-by {case['emulate_by']}" if "emulate_by" in case else ""
    lines = [f"### zoo:{case['model']}, {len(case['speeds'])} speeds ({speeds} of the fastest){how}", "",
             "| strategy | stages (device: nodes) | measured step | predicted step | simulated from measured stages |"
             " with their jitter | load | measured / hetpart | predicted / hetpart | gap |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {}
    for name, rs in runs.items():
        step = statistics.median(r["step_us"] for r in rs)
        loads = [r["load_before"] for r in rs]
        pred = _predicted_step_us(plans[name]) / mine_pred
        meas = step / mine
        ratios[name] = (meas, pred)
        also = [s for s, t in case["same_as"].items() if t == name]
        label = name + (f" (= {', '.join(also)})" if also else "")
        split = " ".join(f"{s['device']}:{s['node_count']}" for s in plans[name]["stages"])
        resim = resimulated_step_us(plans[name], rs)
        inference = plans[name].get("mode", "inference") == "inference"
        jitter = f"{jittered_step_us(plans[name], rs) / 1e3:.1f} ms" if inference else "-"
        own = _predicted_step_us(plans[name])
        lines.append(f"| {label} | {split} | {step / 1e3:.1f} ms | {own / 1e3:.1f} ms ({step / own - 1:+.0%}) | "
                     f"{resim / 1e3:.1f} ms | {jitter} | "
                     f"{min(loads):.1f}-{max(loads):.1f} | "
                     f"{meas:.2f}x | {pred:.2f}x | {(meas - pred) / pred:+.0%} |")
    lines += ["", "per stage, hetpart's plan: predicted forward per microbatch (profile / emulation scale) vs "
              "measured median (p10-p90)", ""]
    scale = runs["optimal"][0]["scale"]
    for k, s in enumerate(plans["optimal"]["stages"]):
        fwd = [r["stages"][k]["forward_us"] for r in runs["optimal"]]
        med = statistics.median(f["median"] for f in fwd)
        p10, p90 = min(f["p10"] for f in fwd), max(f["p90"] for f in fwd)
        pred = s["compute_us"] / scale
        cpu = statistics.median(r["stages"][k]["forward_cpu_us"]["median"] for r in runs["optimal"])
        share = next(x["share"] for x in runs["optimal"][0].get("ranks", [])
                     if x["rank"] == k) if runs["optimal"][0].get("ranks") else None
        lines.append(f"- stage {k} on {s['device']} ({s['device_type']}): predicted {pred / 1e3:.2f} ms, measured "
                     f"{med / 1e3:.2f} ms ({p10 / 1e3:.2f}-{p90 / 1e3:.2f}), {med / pred - 1:+.0%}; CPU time "
                     f"{cpu / 1e3:.2f} ms against {s['compute_us'] * (share or 1) / scale / 1e3:.2f} ms predicted at "
                     f"its share, CPU / wall {cpu / med:.2f}" + (f" (share {share:.3f})" if share else ""))
    best = min((v for n, v in ratios.items() if n != "optimal"), default=None, key=lambda v: v[0])
    if best is not None:
        lines += ["", f"best baseline: measured {best[0]:.2f}x hetpart's step (predicted {best[1]:.2f}x)"]
    case["best_baseline"] = best
    return lines + [""]


def print_report(cases: list[dict]) -> int:
    for case in cases:
        print("\n".join(report(case)))
    geo = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs))  # noqa: E731
    for mode in dict.fromkeys(c.get("emulate_by", "quota") for c in cases):
        bests = [c["best_baseline"] for c in cases if c.get("best_baseline") and c.get("emulate_by", "quota") == mode]
        if bests:
            print(f"geomean over {len(bests)} case(s), --emulate-by {mode}: hetpart's plan is "
                  f"{geo([b[0] for b in bests]):.2f}x faster than the best baseline measured, "
                  f"{geo([b[1] for b in bests]):.2f}x predicted")
    return 0


def link_toml(text: str) -> str:
    """`--link GBPS,US` as a cluster file's machine link (NOTE [measured links]); an argparse type."""
    try:
        gbps, us = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GBPS,US (e.g. 2.16,178), got {text!r}") from None
    if gbps <= 0 or us < 0:
        raise argparse.ArgumentTypeError(f"expected a bandwidth > 0 and a latency >= 0, got {text!r}")
    return f"link = {{ bandwidth_GBps = {gbps:g}, latency_us = {us:g} }}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help="comma-separated speed counts, of 2, 3, 4")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated (optimal is always run first)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved runs of each plan (>= 5 for the figures)")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first warms up and is left out")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--time-limit", type=float, default=10)
    ap.add_argument("--json", type=Path, default=None, help="also write every run here")
    ap.add_argument("--keep", type=Path, default=None, help="keep the artifacts in this (new) folder")
    ap.add_argument("--from-json", type=Path, default=None, help="print the report of a --json file; run nothing")
    ap.add_argument("--emulate-by", default="quota",
                    help="comma-separated, of quota, sleep: each run is made under each (interleaved), reported apart")
    ap.add_argument("--measure-link", action="store_true",
                    help="plan with the link `hetpart profile-link --op send-recv` fits on this machine (NOTE "
                         "[measured links]) instead of 10 GB/s and 20 us")
    ap.add_argument("--link", default=None, metavar="GBPS,US", type=link_toml,
                    help="plan with this link (bandwidth in GB/s, latency in us; e.g. an earlier --measure-link's fit, "
                         "to compare runs on one link) instead of 10 GB/s and 20 us")
    args = ap.parse_args()
    args.emulate_by = [m for m in args.emulate_by.split(",") if m]
    if any(m not in ("quota", "sleep") for m in args.emulate_by):
        ap.error(f"--emulate-by {','.join(args.emulate_by)}: expected quota and/or sleep")
    if args.from_json is not None:
        return print_report(json.loads(args.from_json.read_text()))
    args.strategies = ["optimal", *[s for s in args.strategies.split(",") if s and s != "optimal"]]
    unknown = [s for s in args.strategies if s not in STRATEGIES]
    if unknown or any(m not in MODELS for m in args.models.split(",")) or any(
            c not in CLUSTERS for c in args.clusters.split(",")):
        ap.error(f"unknown model, cluster or strategy ({unknown or args.models + ' / ' + args.clusters})")
    start, cases = time.monotonic(), []
    print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    if args.measure_link:
        from hetpart.profiler.links import measure_link

        fit = measure_link("send-recv")
        args.link = fit.toml()
        print("profile-link --op send-recv: " + ", ".join(f"{n / 1024:g} KiB {t:.0f} us"
                                                          for n, t in fit.measured_us.items()) + f" -> {args.link}",
              flush=True)
    with tempfile.TemporaryDirectory(prefix="measured-speedup-") as tmp:
        workdir = Path(tmp)
        for model in args.models.split(","):
            for cluster in args.clusters.split(","):
                cases.extend(run_case(model, cluster, args, workdir))
                if args.json is not None:  # after every case, so a long run that stops keeps what it measured
                    args.json.write_text(json.dumps(cases, indent=1) + "\n")
        if args.keep is not None:
            shutil.copytree(workdir, args.keep)
    print()
    print_report(cases)
    print(f"took {time.monotonic() - start:.0f} s; load average at the end: {os.getloadavg()}")
    if args.json is not None:  # again: print_report added each case's best baseline
        args.json.write_text(json.dumps(cases, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
