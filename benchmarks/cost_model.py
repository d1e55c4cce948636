"""How close the cost model is to this machine: predicted vs measured, roofline-only and with a profile.

    .venv/bin/python benchmarks/cost_model.py                    # mlp, gpt-small, resnet on cpu-2 and cpu-4
    .venv/bin/python benchmarks/cost_model.py --models mlp --presets cpu-2

For each zoo model (batch 16 in 4 microbatches, as benchmarks/runtime.py):
1. `hetpart profile` the model on this machine alone (one thread, as a `hetpart run` rank).
2. Per op: a second, independent profiling run is the measurement; the Spearman rank
   correlation of each op's predicted time (roofline `cpu` type, or the profile) against it.
3. Per stage, for each preset: profile again with `--cluster preset:P` (as many processes side
   by side as the preset has ranks on this machine, NOTE [concurrent profile]), partition with
   that profile, then measure every stage's forward per microbatch twice: under torchrun
   (`hetpart run --measure --steps 4`, one process per stage, GPipe: `measured.json`'s
   `measured_cpu_time_us`, each rank's thread CPU time in its forward, NOTE [measured CPU
   time]), and alone (the stages back to back in this process, one thread), and compare with
   the plan's predicted compute, for the costs it was planned with (the concurrent profile),
   for the same stages costed with the profile taken alone (step 1), and with the roofline.
   On this 2-core VM the torchrun ranks share cores and caches with each other (cpu-4 runs 4
   ranks) and with whatever else runs; "alone" isolates the cost model's own error.
Prints markdown tables; copy them with the command into docs/benchmarks.md ("Cost model").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetpart.compile import CompileOptions, analyze, compile_model  # noqa: E402
from hetpart.devices import load_cluster  # noqa: E402
from hetpart.frontend import ModelSpec, export_model, load_model  # noqa: E402
from hetpart.ir import info  # noqa: E402
from hetpart.partitioner import evaluate  # noqa: E402
from hetpart.passes import lower_to_problem  # noqa: E402
from hetpart.passes.meta import run_on_meta  # noqa: E402
from hetpart.profiler.measure import profile_graph  # noqa: E402
from hetpart.profiler.siblings import ranks_sharing_a_machine  # noqa: E402
from hetpart.profiler.table import Profile, op_key, profiled  # noqa: E402
from hetpart.runtime import RunOptions, run_pipeline  # noqa: E402
from hetpart.runtime.artifacts import load_manifest, load_stage  # noqa: E402

SPECS = {  # model -> (--set overrides, seq_len); the sizes of benchmarks/runtime.py
    "mlp": ({"hidden": "512"}, 64),
    "gpt-small": ({}, 64),
    "resnet": ({}, 32),
    "llama": ({}, 64),
    "unet": ({}, 32),
}
BATCH, MICROBATCHES = 16, 4


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties averaged."""
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tied = x == value
        r[tied] = r[tied].mean()
    return r


def spearman(a: list[float], b: list[float]) -> float:
    return float(np.corrcoef(ranks(np.array(a, dtype=float)), ranks(np.array(b, dtype=float)))[0, 1])


def profile_of(spec: ModelSpec, repeats: int, concurrent: int = 1) -> Profile:
    module, inputs = load_model(spec)
    gm = export_model(module, inputs)
    micro = spec.batch_size // MICROBATCHES
    return profile_graph(gm, tuple(x[:micro] for x in inputs), "cpu", repeats=repeats, concurrent=concurrent,
                         microbatches=MICROBATCHES)


def per_op(spec: ModelSpec, profile: Profile, measured: Profile) -> tuple[int, float, float]:
    """(ops, Spearman of roofline vs measured, Spearman of profile vs measured), one entry per FX op."""
    cluster = load_cluster("preset:cpu-2")
    micro = spec.batch_size // MICROBATCHES
    roof = analyze(spec, cluster, micro, echo=lambda *_: None).gm
    values = run_on_meta(roof, micro)
    pred_roof, pred_prof, got = [], [], []
    for node in roof.graph.nodes:
        if not profiled(node):
            continue
        key = op_key(node, values)
        if key not in measured.forward_ns or key not in profile.forward_ns:
            continue
        pred_roof.append(info(node).cost_ns["cpu"])
        pred_prof.append(profile.forward_ns[key])
        got.append(measured.forward_ns[key])
    return len(got), spearman(pred_roof, got), spearman(pred_prof, got)


def isolated_us(out: Path, spec: ModelSpec, repeats: int) -> list[float]:
    """Each stage's forward on one microbatch, in this process, one thread: the stages run back to
    back (each on the previous one's outputs), `repeats` times, median per stage. Timed with the
    thread's CPU time, as the profile is (NOTE [profile clock] in hetpart/profiler/measure.py)."""
    stages = [load_stage(out, entry) for entry in load_manifest(out)["ranks"]]
    _, inputs = load_model(spec)
    micro = tuple(x[: spec.batch_size // MICROBATCHES] for x in inputs)
    times: list[list[float]] = [[] for _ in stages]
    torch.set_num_threads(1)
    with torch.no_grad():
        for index in range(repeats + 2):
            values = micro
            for k, stage in enumerate(stages):
                start = time.thread_time()
                values = stage(*values)
                if index >= 2:  # two warm-up rounds
                    times[k].append(time.thread_time() - start)
    return [statistics.median(t) * 1e6 for t in times]


def stage_costs_us(spec: ModelSpec, cluster: object, plan: object, profiles: dict) -> list[float]:
    """The plan's stages' predicted compute (us) with these profiles ({} for the roofline)."""
    gm = analyze(spec, cluster, spec.batch_size // MICROBATCHES, echo=lambda *_: None, profiles=profiles).gm
    return [s.compute_ns / 1000 for s in evaluate(lower_to_problem(gm, cluster), plan.stage_of, plan.device_of_stage)]


def per_stage(spec: ModelSpec, preset: str, alone_profile: Profile, work: Path,
              repeats: int) -> list[tuple[int, float, float, float, float, float]]:
    """[(stage, measured us under torchrun, measured us alone, predicted us with the concurrent profile
    the plan was made with, predicted us with the profile taken alone, predicted us roofline)]."""
    cluster = load_cluster(f"preset:{preset}")
    concurrent = ranks_sharing_a_machine(cluster, "cpu")
    path = work / f"{spec.model[4:]}-{preset}.json"
    profile_of(spec, repeats, concurrent).save(path)
    out = work / f"{spec.model[4:]}-{preset}"
    result = compile_model(spec, f"preset:{preset}", out,
                           CompileOptions(microbatches=MICROBATCHES, time_limit_s=10, pt2=False,
                                          profiles=(path,)), echo=lambda *_: None)
    one = stage_costs_us(spec, cluster, result.plan, {"cpu": alone_profile})
    roof = stage_costs_us(spec, cluster, result.plan, {})
    alone = isolated_us(out, spec, repeats)
    measured = run_pipeline(out, RunOptions(measure=True, steps=4), echo=lambda *_: None).measured
    return [(s["index"], s["measured_cpu_time_us"], a, s["predicted_compute_us"], o, r)
            for s, a, o, r in zip(measured["stages"], alone, one, roof)]


def rel_err(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp,gpt-small,resnet")
    parser.add_argument("--presets", default="cpu-2,cpu-4")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per op in each profile")
    args = parser.parse_args()
    names = args.models.split(",")
    presets = args.presets.split(",")
    start = time.perf_counter()
    op_rows, stage_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:
            overrides, seq = SPECS[name]
            spec = ModelSpec(f"zoo:{name}", overrides, batch_size=BATCH, seq_len=seq)
            profile = profile_of(spec, args.repeats)
            measured = profile_of(spec, args.repeats)  # a second, independent run
            op_rows.append((name, *per_op(spec, profile, measured)))
            for preset in presets:
                for row in per_stage(spec, preset, profile, work, args.repeats):
                    stage_rows.append((name, preset, *row))
                print(f"# {name} on {preset} done at {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    print("| model | ops | Spearman, roofline | Spearman, profile |")
    print("|---|---|---|---|")
    for name, n, s_roof, s_prof in op_rows:
        print(f"| {name} | {n} | {s_roof:.2f} | {s_prof:.2f} |")
    print()
    print("| model | preset | stage | torchrun CPU us | alone us | concurrent profile us | error vs torchrun "
          "| profile alone us | error vs torchrun | error vs alone | roofline us | error vs torchrun |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, preset, stage, got, alone, pred, one, roof in stage_rows:
        print(f"| {name} | {preset} | {stage} | {got:.0f} | {alone:.0f} | {pred:.0f} | {rel_err(pred, got):.0%} | "
              f"{one:.0f} | {rel_err(one, got):.0%} | {rel_err(one, alone):.0%} | {roof:.0f} | {rel_err(roof, got):.0%} |")
    print()
    print("| preset | stages | median error, concurrent profile vs torchrun | profile alone vs torchrun "
          "| profile alone vs alone | roofline vs torchrun |")
    print("|---|---|---|---|---|---|")
    for preset in [*presets, "all"]:
        rows = [r for r in stage_rows if preset in ("all", r[1])]
        med = lambda i, j: statistics.median(rel_err(r[i], r[j]) for r in rows)  # noqa: E731
        print(f"| {preset} | {len(rows)} | {med(5, 3):.1%} | {med(6, 3):.1%} | {med(6, 4):.1%} | {med(7, 3):.1%} |")
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
