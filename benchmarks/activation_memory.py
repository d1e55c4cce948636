"""The cost model's activation memory per microbatch against what autograd keeps for the backward.

    .venv/bin/python benchmarks/activation_memory.py                      # the zoo and a Llama-70B-shaped layer
    .venv/bin/python benchmarks/activation_memory.py --cases llama gpt-small
    python benchmarks/activation_memory.py --device cuda       # on a GPU (benchmarks/gpu_check.sh runs it)

A training stage holds its weights and state plus the stash: the activations of every microbatch it has run
forward and not yet backward (NOTE [training memory] in hetpart/partitioner/costs.py). The cost model counts
one microbatch's activations as the bytes of every non-view output of the stage's ops (passes/memory.py,
`act_bytes`; lowered into each node's `mem_bytes`). Here each case is partitioned for training
(`hetpart partition ... --mode training --cluster preset:cpu-2`), the `mem_bytes` of every node of the lowered
problem (ir/analysis.json) summed, and set against the bytes of the tensors autograd saves for the backward
when the same model runs forward on one microbatch on this CPU (`torch.autograd.graph.saved_tensors_hooks`;
storages counted once; the model's weights and buffers left out: the cost model counts them as weights). The
saved tensors are what a stashed microbatch keeps; the ratio says by how much the stash term over- or
under-states it. Beside it, the peak a one-microbatch forward and backward reaches above the weights and their
gradients (a second step, in a fresh process, the first having allocated the gradients): /proc/self/status's
VmHWM after `clear_refs` 5 (Linux resets the high-water mark) less VmRSS before, so the saved tensors plus the
step's temporaries, as the allocator holds them. With `--device cuda` (untested: no GPU was lent to the session
that wrote it) the model runs on the GPU and the peak is `torch.cuda.max_memory_allocated` over the second step
less `torch.cuda.memory_allocated` before it: exact, without the CUDA context and the allocator's cache.
Activations are float32 here; the ratios do not depend on it.
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpart.frontend import ModelSpec, load_model  # noqa: E402

# name -> (model, overrides, seq_len): the zoo's defaults, and the Llama-70B layer's shape at 1/8 of its width
# (head_dim 128, 8 query heads per key/value head, the SwiGLU 3.5x wide, seq / dim = 2048 / 8192).
CASES = {
    "mlp": ("zoo:mlp", {}, 32),
    "gpt-small": ("zoo:gpt-small", {}, 64),
    "llama": ("zoo:llama", {}, 64),
    "bert": ("zoo:bert", {}, 64),
    "t5": ("zoo:t5", {}, 32),
    "vit": ("zoo:vit", {}, 32),
    "resnet": ("zoo:resnet", {}, 32),
    "unet": ("zoo:unet", {}, 32),
    "llama-70b-layer/8": ("zoo:llama", {"dim": "1024", "n_heads": "8", "n_kv_heads": "1", "ffn_hidden": "3584",
                                        "n_layers": "2", "vocab_size": "4000"}, 256),
}
MICROBATCH = 2  # samples per microbatch (load_model builds at least 2)


def predicted_bytes(model: str, overrides: dict[str, str], seq: int, out: Path) -> int:
    """The cost model's activations of one microbatch: every node's mem_bytes in the lowered problem."""
    cmd = [sys.executable, "-m", "hetpart", "partition", model, "--mode", "training", "--cluster", "preset:cpu-2",
           "--batch-size", str(2 * MICROBATCH), "--microbatches", "2", "--seq-len", str(seq), "--no-pt2",
           "--time-limit", "5", "--out", str(out)]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    plan = json.loads((out / "plan.json").read_text())
    assert plan["microbatch_size"] == MICROBATCH, plan["microbatch_size"]
    nodes = json.loads((out / "ir" / "analysis.json").read_text())["problem"]["graph"]["nodes"]
    return sum(n.get("mem_bytes", 0) for n in nodes)


def _built(model: str, overrides: dict[str, str], seq: int, device: str) -> tuple[torch.nn.Module, tuple]:
    module, inputs = load_model(ModelSpec(model, overrides, batch_size=MICROBATCH, seq_len=seq))
    return module.to(device), tuple(x.to(device) for x in inputs)


def saved_bytes(model: str, overrides: dict[str, str], seq: int, device: str = "cpu") -> tuple[int, int]:
    """(bytes of the tensors autograd saves in one microbatch's forward, how many storages)."""
    module, inputs = _built(model, overrides, seq, device)
    module.train()
    own = {t.untyped_storage()._cdata for t in [*module.parameters(), *module.buffers()]}
    seen: dict[int, tuple[int, object]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s._cdata not in own:
            seen[s._cdata] = (s.nbytes(), s)  # the storage kept alive, so its address is not reused
        return t

    torch.set_num_threads(1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(*inputs)
    return sum(n for n, _ in seen.values()), len(seen)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith(key))


def peak_bytes(model: str, overrides: dict[str, str], seq: int, device: str = "cpu") -> int:
    """In this (fresh) process: the resident memory a second forward and backward of one microbatch reaches
    above what the process held before it (weights, their gradients from the first step)."""
    import gc

    from torch.utils import _pytree as pytree

    module, inputs = _built(model, overrides, seq, device)
    module.train()
    torch.set_num_threads(1)

    def step() -> None:
        outs = [t for t in pytree.tree_leaves(module(*inputs)) if t.is_floating_point()]
        outs[0].float().pow(2).mean().backward()

    step()
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = _status("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here
    step()
    return _status("VmHWM:") - before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--peak", choices=list(CASES), help=argparse.SUPPRESS)  # one case's peak, in a fresh process
    args = ap.parse_args()
    if args.peak:
        print(peak_bytes(*CASES[args.peak], args.device))
        return 0
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  ({time.strftime('%H:%M:%S', time.gmtime())} UTC)")
    print("| case | predicted activations / microbatch | saved by autograd | storages | predicted / saved "
          "| peak of a step above weights + grads | predicted / peak |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="hetpart-actmem-") as tmp:
        for name in args.cases:
            model, overrides, seq = CASES[name]
            pred = predicted_bytes(model, overrides, seq, Path(tmp) / name)
            saved, count = saved_bytes(model, overrides, seq, args.device)
            # glibc maps every block of 64 KiB or more on its own and unmaps it when freed (a fixed threshold), so
            # the resident set follows the live tensors instead of keeping the first step's heap for the second.
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
            peak = int(subprocess.run([sys.executable, __file__, "--peak", name, "--device", args.device], check=True,
                                      capture_output=True, text=True, env=env).stdout.split()[-1])
            ratios.append(pred / saved)
            print(f"| {name} (seq {seq}, microbatch {MICROBATCH}) | {pred / 2**20:.2f} MiB | {saved / 2**20:.2f} MiB "
                  f"| {count} | {pred / saved:.2f}x | {peak / 2**20:.2f} MiB | {pred / peak:.2f}x |", flush=True)
    geo = torch.tensor(ratios).log().mean().exp().item()
    print(f"geomean predicted / saved: {geo:.2f}x over {len(ratios)} case(s); "
          f"range {min(ratios):.2f}x - {max(ratios):.2f}x")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  ({time.strftime('%H:%M:%S', time.gmtime())} UTC)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
