"""A tensor-parallel stage's measured time against the cost model's prediction with a profile (issue 20).

    .venv/bin/python benchmarks/tp_stage_measured.py                           # 1 stage x TP 2 on preset:cpu-2
    .venv/bin/python benchmarks/tp_stage_measured.py --cluster preset:cpu-4 --emulate --period-us 2000

1. profile the model's ops once (`hetpart profile`, one thread, as a rank runs), without --emulate
   with the cluster's siblings (`profile --cluster`: as many processes as ranks share the machine,
   NOTE [concurrent profile]); `--alone` profiles with nothing beside it;
2. `hetpart partition --profile` twice: `--tensor-parallel 2` and the one-device-per-stage plan;
3. interleaved runs (A B A B ..., --rounds of each) of `hetpart run --measure --steps N
   [--emulate]`, the first step left out;
4. prints, per rank, the median forward of one microbatch (wall, and the rank thread's CPU time)
   against the plan's predicted time of its stage (compute + the all-reduces its sharding implies,
   NOTE [tensor-parallel costs] in hetpart/passes/tp_lower.py), and the measured step against the
   plan's simulated step; under --emulate every prediction is divided by the emulation's scale
   (each rank's share of a core, NOTE [emulated devices] in hetpart/runtime/emulate.py);
5. per TP rank, where its forward went (NOTE [collective skew] in hetpart/runtime/collectives.py):
   its ops (wall, and thread CPU time), the skew (waiting in a collective for the peer that was
   behind) and the collectives themselves, against the plan's ops and all-reduces.

`--measure-link` plans on the machine's link as `hetpart profile-link --op all-reduce --gap-us G`
fits it just before each round: each all-reduce timed after G us of matmuls, as a TP rank calls
it between its ops (NOTE [collectives between work] in hetpart/profiler/links.py; --gap-us 0:
back to back behind a barrier, as before).

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
from hetpart.errors import HetpartError  # noqa: E402
from hetpart.plan_report import load_plan  # noqa: E402
from hetpart.report.table import simulated_step  # noqa: E402

MODEL = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=256", "--set", "vocab_size=512", "--set",
         "block_size=64", "--batch-size", "8", "--seq-len", "64"]
# --measure-link's sizes: a quarter to 16x the all-reduces the stage runs (256 KiB); between work the smaller ones
# cost about the same (NOTE [collectives between work]), so the 4 MiB one is what lets the fit find a slope
LINK_SIZES = (65536, 262144, 1048576, 4194304)


def _measure(out: Path, mode: str, steps: int, emulate: bool, period_us: int) -> dict:
    """One `hetpart run --measure` of `out` in a fresh process (with the emulation's period set), its measured.json."""
    run_fresh(out, period_us, mode=mode, steps=steps, measure=True, emulate=emulate)
    return json.loads((out / "measured.json").read_text())


def _priced_collectives_ms(events: list[dict], link: object) -> float:
    """The cost model's price of the collectives one measured forward of this rank called (the second step's first;
    each by its op, bytes and group: `costs.allreduce_ns`, `costs.allgather_ns`), ms."""
    from hetpart.partitioner.costs import allgather_ns, allreduce_ns

    price = {"all_reduce": allreduce_ns, "all_gather": allgather_ns}
    f = next(e for e in events if e["kind"] == "F" and e["step"] == 1)
    inside = [e for e in events if e["kind"] == "collective" and f["t0_ns"] <= e["t0_ns"] <= f["t1_ns"]]
    return sum(price[e["op"]](link, e["bytes"], len(e["group"])) for e in inside) / 1e6


def _print_collectives(splits: dict, runs: dict) -> None:
    """Per TP rank, its forward split into ops, skew and collectives (NOTE [collective skew]), medians over the
    rounds, against the plan: its ops (the stage's predicted compute less its all-reduces) and all-reduces."""
    from hetpart.devices.cluster import load_cluster
    from hetpart.passes.tp_lower import _link

    print("\nper TP rank, one forward (ms, median over the rounds; each round's figure is its forwards' median; "
          "NOTE [collective skew]):\n")
    print("| plan | rank | forward | ops wall | ops CPU | ops predicted | collectives | skew | collectives "
          "themselves | one collective (median) | collectives predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rounds in splits.items():
        if not rounds or not rounds[0][0]:
            continue
        for k, first in enumerate(rounds[0][0]):
            rows = []
            for (split, cluster, scale), (m, _, _) in zip(rounds, runs[name]):
                link = _link(load_cluster(cluster).machines[0].link)  # the round's plan's machine (one machine here)
                n = round(split[k]["collectives_per_forward"])
                coll = _priced_collectives_ms(m["timeline"]["ranks"][split[k]["rank"]], link) / scale
                ops = m["stages"][split[k]["rank"]]["predicted_compute_us"] / 1e3 / scale - coll
                rows.append({**{f: v / 1e3 for f, v in split[k].items() if f.endswith("_us")}, "n": n,
                             "coll_pred": coll, "ops_pred": ops})
            med = {f: statistics.median(r[f] for r in rows) for f in rows[0]}
            print(f"| {name} | {first['rank']} | {med['forward_us']:.2f} | {med['ops_wall_us']:.2f} | "
                  f"{med['ops_cpu_us']:.2f} | {med['ops_pred']:.2f} | {med['n']:.0f} | {med['skew_us']:.2f} | "
                  f"{med['itself_us']:.2f} | {med['itself_median_us']:.2f} | {med['coll_pred']:.2f} |")


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
    parser.add_argument("--gap-us", type=int, default=2000,
                        help="--measure-link: the matmuls before each timed all-reduce (NOTE "
                             "[collectives between work]); about a TP rank's ops between two of its all-reduces here")
    parser.add_argument("--link-repeats", type=int, default=200, help="--measure-link: timed calls per size")
    parser.add_argument("--alone", action="store_true", help="profile with no siblings (as before tpmeasure)")
    args = parser.parse_args()
    model = [*MODEL, "--microbatches", str(args.microbatches)]
    print(f"load average at start: {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="hetpart-tp-measured-") as tmp:
        work = Path(tmp)
        if args.measure_link and not args.cluster.startswith("preset:"):
            parser.error("--measure-link rewrites a preset's link")
        preset = args.cluster.removeprefix("preset:")

        def cluster_now(r: int) -> str:  # the cluster to plan round r with: its link measured now, or the given one
            if not args.measure_link:
                return args.cluster
            for attempt in range(3):  # a noisy minute can give times that do not grow with the size: measure again
                try:
                    return with_measured_link(preset, "all-reduce", work / f"{preset}-measured-{r}.toml",
                                              sizes=LINK_SIZES, repeats=args.link_repeats, gap_us=args.gap_us)
                except HetpartError as e:
                    print(f"  round {r + 1}, link measurement {attempt + 1}: {e}", flush=True)
            raise SystemExit("--measure-link: no fit in 3 tries")

        clusters = [cluster_now(0)]
        profile = work / "cpu.json"
        siblings = ["--cluster", clusters[0]] if not (args.emulate or args.alone) else []
        _hetpart("profile", *model, *siblings, *(["--backward"] if args.mode == "training" else []),
                 "--out", str(profile))
        names = {"TP 2": ["--tensor-parallel", "2"], "one device per stage": []}

        def plan_now(name: str, r: int) -> Path:
            out = work / f"{name.replace(' ', '_')}-{r}"
            _hetpart("partition", *model, "--cluster", clusters[r], "--mode", args.mode, "--profile", str(profile),
                     "--out", str(out), "--no-pt2", *names[name])
            return out

        # runs[name]: per round (measured.json, load, plan dir); with --measure-link each round is planned on the link
        # measured just before it (the machine's collectives change from minute to minute: NOTE [collectives between
        # work]), and its prediction is that plan's
        runs: dict[str, list[tuple[dict, float, Path]]] = {n: [] for n in names}
        for r in range(args.rounds):
            if r > 0 and args.measure_link:
                clusters.append(cluster_now(r))
            elif r > 0:
                clusters.append(clusters[0])
            for name in names:  # interleaved: A B, A B, ...
                out = plan_now(name, r) if r == 0 or args.measure_link else runs[name][0][2]
                load = os.getloadavg()[0]
                runs[name].append((_measure(out, args.mode, args.steps, args.emulate, args.period_us), load, out))
            print(f"  round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"\n{MODEL[0]} ({' '.join(MODEL[1:])}), {args.mode}, {args.microbatches} microbatches, {args.cluster}"
              f"{' (link measured before each round)' if args.measure_link else ''}"
              f"{f', --emulate at a {args.period_us} us period' if args.emulate else ''}; {args.rounds} rounds of "
              f"{args.steps} steps (first left out); load {min(ld for rs in runs.values() for _, ld, _ in rs):.1f}-"
              f"{max(ld for rs in runs.values() for _, ld, _ in rs):.1f}\n")
        print("| plan | rank | device | predicted compute ms (all-reduces in) | measured forward ms (p10-p90) | measured / "
              "predicted (per round) | CPU time ms | predicted step ms | measured step ms | step measured / predicted "
              "(per round) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        splits = {}
        for name in names:
            scales = [emulation_scale(out) if args.emulate else 1.0 for _, _, out in runs[name]]
            step_preds = [simulated_step(load_plan(out / "plan.json", json.loads((out / "plan.json").read_text())))
                          .step_ns / 1e6 / sc for (_, _, out), sc in zip(runs[name], scales)]
            steps = [m["step_time_us"] / 1e3 for m, _, _ in runs[name]]
            step_ratios = [a / b for a, b in zip(steps, step_preds)]
            for k in range(len(runs[name][0][0]["stages"])):
                per = [m["stages"][k] for m, _, _ in runs[name]]
                preds = [p["predicted_compute_us"] / sc / 1e3 for p, sc in zip(per, scales)]  # ops + all-reduces
                fwds = [p["measured_time_us"] / 1e3 for p in per]
                ratios = [f / q for f, q in zip(fwds, preds)]
                cpu = statistics.median(p["measured_cpu_time_us"] for p in per) / 1e3
                p10 = min(p["forward_us"]["p10"] for p in per) / 1e3
                p90 = max(p["forward_us"]["p90"] for p in per) / 1e3
                print(f"| {name} | {k} | {per[0]['device']} | {statistics.median(preds):.2f} | "
                      f"{statistics.median(fwds):.2f} ({p10:.2f}-{p90:.2f}) | {statistics.median(ratios):.2f} "
                      f"({', '.join(f'{x:.2f}' for x in ratios)}) | {cpu:.2f} | {statistics.median(step_preds):.2f} | "
                      f"{statistics.median(steps):.2f} | {statistics.median(step_ratios):.2f} "
                      f"({', '.join(f'{x:.2f}' for x in step_ratios)}) |")
            splits[name] = [(m["timeline"]["collectives"], c, sc) for (m, _, _), c, sc in
                            zip(runs[name], clusters, scales) if m.get("timeline")]
        _print_collectives(splits, runs)
    print(f"\nload average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
