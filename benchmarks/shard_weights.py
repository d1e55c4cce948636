"""`hetpart shard-weights` memory: peak RSS against the checkpoint's size and its largest tensor.

    .venv/bin/python benchmarks/shard_weights.py               # zoo:llama, 8 layers of dim 2048 (2.2 GB fp32)
    .venv/bin/python benchmarks/shard_weights.py --set dim=1024
    .venv/bin/python benchmarks/shard_weights.py --tensor-parallel 2  # each TP rank's parts read as slices

Builds the model once with real weights and saves it as a 2-shard HF-style checkpoint, partitions
the same model with `--meta` onto preset:mixed-4, then runs `hetpart shard-weights` in a fresh
process and reads its peak RSS (ru_maxrss). The claim to check: peak memory is about the largest
tensor above the process's baseline (imports), never the model or a rank's share of it. With
`--tensor-parallel T` the plan's stages are TP groups and each rank's split weights are read as slices
of the checkpoint's tensors (NOTE [weight manifests]); what is written is then about the checkpoint
(each split weight's T parts) plus the replicated weights' copies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Peak RSS is VmHWM: ru_maxrss would carry over the parent's peak across fork and exec.
HWM = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) * 1024"
CHILD = rf"""
import sys, time
from hetpart.cli import main
start = time.perf_counter()
code = main(["shard-weights", sys.argv[1], sys.argv[2]])
print(code, {HWM}, time.perf_counter() - start)
"""
BASELINE = rf"""
import torch, safetensors, hetpart.cli, hetpart.codegen.weights  # what shard-weights imports
print({HWM})
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="sets", action="append",
                    default=["n_layers=8", "dim=2048", "ffn_hidden=5632", "n_heads=16", "n_kv_heads=16"])
    ap.add_argument("--tensor-parallel", type=int, default=1, help="partition with --tensor-parallel T")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from safetensors.torch import save_file

    from hetpart.frontend import ModelSpec, load_model

    overrides = dict(s.split("=", 1) for s in args.sets)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(dir=ROOT / "out" if (ROOT / "out").is_dir() else None) as tmp:
        tmp = Path(tmp)
        module, _ = load_model(ModelSpec("zoo:llama", overrides, batch_size=2, seq_len=16))
        state = {k: v.contiguous() for k, v in module.state_dict().items()}
        del module
        keys = sorted(state)
        ckpt = tmp / "ckpt"
        ckpt.mkdir()
        weight_map = {}
        for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
            save_file({k: state[k] for k in part}, str(ckpt / f"model-{i}.safetensors"))
            weight_map.update({k: f"model-{i}.safetensors" for k in part})
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        total = sum(t.numel() * t.element_size() for t in state.values())
        largest = max(t.numel() * t.element_size() for t in state.values())
        del state
        out = tmp / "plan"
        sets = [x for s in args.sets for x in ("--set", s)]
        subprocess.run([sys.executable, "-m", "hetpart", "partition", "zoo:llama", *sets, "--cluster",
                        "preset:mixed-4", "--out", str(out), "--meta", "--batch-size", "2", "--microbatches", "1",
                        "--seq-len", "16", "--time-limit", "5", "--tensor-parallel", str(args.tensor_parallel)],
                       check=True, env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        base = int(subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True, env=env,
                                  cwd=ROOT, check=True).stdout.split()[-1])
        start = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", CHILD, str(out), str(ckpt)], capture_output=True, text=True,
                             env=env, cwd=ROOT)
        wall = time.perf_counter() - start
        if res.returncode != 0:
            raise SystemExit(res.stderr)
        code, peak, seconds = res.stdout.split()[-3:]
        written = sum(p.stat().st_size for p in out.glob("rank*/weights.safetensors"))
    mb = lambda b: f"{int(b) / 1e6:,.0f} MB"  # noqa: E731
    print(f"zoo:llama {' '.join(args.sets)}, --tensor-parallel {args.tensor_parallel}; checkpoint in 2 shards; shard-weights exit {code}, "
          f"{float(seconds):.1f} s ({wall:.1f} s with start-up)")
    print("| checkpoint | largest tensor | written (all ranks) | RSS after imports | peak RSS | peak - imports |")
    print("|---|---|---|---|---|---|")
    print(f"| {mb(total)} | {mb(largest)} | {mb(written)} | {mb(base)} | {mb(peak)} | {mb(int(peak) - base)} |")
    del torch


if __name__ == "__main__":
    main()
