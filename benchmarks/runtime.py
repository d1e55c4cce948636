"""Runtime figures: generated stages vs the original model, and measured vs simulated pipelines.

    .venv/bin/python benchmarks/runtime.py                 # back-to-back overhead, all small zoo models
    .venv/bin/python benchmarks/runtime.py --pipeline      # also torchrun on preset:cpu-2 and cpu-4

1. Overhead: the stages of a plan run back to back in one process against the
   original module on the same input, interleaved, median of --repeats runs
   (the target is within 3%).
2. Pipeline: `hetpart run --measure` on the CPU presets: measured step time next
   to the schedule simulator's prediction from the plan (the cost model's "cpu"
   type is a 40-core server socket, so the ratio also shows how far this
   2-core machine is from it).
Prints tables; copy them with the command into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetpart.compile import CompileOptions, compile_model  # noqa: E402
from hetpart.frontend import ModelSpec, load_model  # noqa: E402
from hetpart.models import ZOO  # noqa: E402
from hetpart.runtime import RunOptions, run_pipeline  # noqa: E402
from hetpart.runtime.artifacts import load_manifest, load_stage  # noqa: E402

# Bigger than the test configs, so that per-op dispatch does not dominate.
SPECS = {
    "mlp": ({"hidden": "512"}, 64),
    "gpt-small": ({}, 64),
    "resnet": ({}, 32),
    "unet": ({}, 32),
    "llama": ({}, 64),
    "bert": ({}, 64),
    "vit": ({}, 32),
}


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def overhead(name: str, overrides: dict, seq_len: int, repeats: int, workdir: Path) -> tuple[float, float, int]:
    spec = ModelSpec(f"zoo:{name}", overrides, batch_size=8, seq_len=seq_len)
    out = workdir / f"{name}-overhead"
    compile_model(spec, "preset:cpu-4", out, CompileOptions(time_limit_s=10, pt2=False), echo=lambda *_: None)
    stages = [load_stage(out, entry) for entry in load_manifest(out)["ranks"]]
    module, inputs = load_model(spec)

    def split() -> None:
        values = inputs
        for stage in stages:
            values = stage(*values)

    with torch.no_grad():
        for _ in range(3):  # warm up both
            module(*inputs)
            split()
        original, staged = [], []
        for _ in range(repeats):  # interleaved, so both see the same machine
            original.append(_median_time(lambda: module(*inputs), 1))
            staged.append(_median_time(split, 1))
    return statistics.median(original), statistics.median(staged), len(stages)


def pipeline(name: str, overrides: dict, seq_len: int, preset: str, workdir: Path) -> dict:
    spec = ModelSpec(f"zoo:{name}", overrides, batch_size=16, seq_len=seq_len)
    out = workdir / f"{name}-{preset}"
    compile_model(spec, f"preset:{preset}", out, CompileOptions(microbatches=4, time_limit_s=10, pt2=False),
                  echo=lambda *_: None)
    result = run_pipeline(out, RunOptions(measure=True, steps=4), echo=lambda *_: None)
    return result.measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--pipeline", action="store_true", help="also run torchrun on cpu-2 and cpu-4")
    parser.add_argument("--models", default=",".join(SPECS))
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n in ZOO]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("| model | stages | original ms | stages back to back ms | ratio |")
        print("|---|---|---|---|---|")
        for name in names:
            overrides, seq = SPECS[name]
            orig, staged, n = overhead(name, overrides, seq, args.repeats, work)
            print(f"| {name} | {n} | {orig * 1e3:.2f} | {staged * 1e3:.2f} | {staged / orig:.3f} |", flush=True)
        if not args.pipeline:
            return
        print()
        print("| model | preset | ranks | measured step ms | simulated step ms | measured / simulated |")
        print("|---|---|---|---|---|---|")
        for name in names:
            overrides, seq = SPECS[name]
            for preset in ("cpu-2", "cpu-4"):
                m = pipeline(name, overrides, seq, preset, work)
                sim = m["predicted_step_time_us"]
                print(f"| {name} | {preset} | {len(m['stages'])} | {m['step_time_us'] / 1e3:.1f} | "
                      f"{sim / 1e3:.2f} | {m['step_time_us'] / sim:.1f} |", flush=True)


if __name__ == "__main__":
    main()
