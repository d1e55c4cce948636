"""Writing stage.pt2: with the weights inside (before issue 23), weightless re-exports (serial and forked), and
programs built from the split graph (now: NOTE [stage programs]).

    .venv/bin/python benchmarks/pt2_write.py                  # zoo:llama, 4 layers of dim 1024
    .venv/bin/python benchmarks/pt2_write.py --model resnet   # zoo:resnet, 4 stages of 3 blocks, width 64

Traces, plans (preset:mixed-4) and splits the model once, then writes every rank's stage.pt2
four ways in the same process, `--repeat` times in turn so they share the machine's load:
`with-weights` (torch.export.save of the stage as exported: what hetpart wrote before NOTE
[weightless .pt2]), `weightless` (write_pt2 from example inputs, one rank after another), `forked`
(the same with one child per CPU, whatever the load: NOTE [parallel .pt2 writes]) and `from-graph`
(write_pt2 without examples: the program built from the stage's graph, NOTE [stage programs]). Prints seconds (best of the repeats) and bytes,
with the load average.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from hetpart.codegen import split_stages, stage_examples
from hetpart.codegen.pt2 import _reexport_files, _rezip_deterministically, pt2_dynamic_shapes, write_pt2
from hetpart.compile import analyze
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec
from hetpart.frontend.fast_fake import fast_fake_kernels
from hetpart.partitioner import solve
from hetpart.passes import lower_to_problem
from hetpart.timings import StepTimes

MODELS = {
    "llama": ModelSpec("zoo:llama", {"dim": "1024", "ffn_hidden": "2816", "n_layers": "4", "n_heads": "16",
                                     "n_kv_heads": "4", "vocab_size": "32000"}, batch_size=8, seq_len=128),
    "resnet": ModelSpec("zoo:resnet", {"base_width": "64", "n_stages": "4", "blocks_per_stage": "3",
                                       "image_size": "64"}, batch_size=8),
}


def with_weights(path: Path, stage, example) -> None:
    """The write before issue 23: the same export, saved with its state_dict."""
    with fast_fake_kernels():
        ep = torch.export.export(stage.gm, example, dynamic_shapes=pt2_dynamic_shapes(stage), strict=False)
    for node in ep.graph.nodes:
        node.meta.pop("from_node", None)
    raw = path.with_name(f".{path.stem}.raw.pt2")
    torch.export.save(ep, str(raw))
    _rezip_deterministically(raw, path)
    raw.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="llama")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    spec = MODELS[args.model]
    cluster = load_cluster("preset:mixed-4")
    gm, _, inputs, _, _ = analyze(spec, cluster, spec.batch_size // 4, echo=lambda _: None)
    plan = solve(lower_to_problem(gm, cluster), time_limit_s=10)
    stages = split_stages(gm, plan.stage_of, len(plan.device_of_stage))
    examples = stage_examples(stages, tuple(x[:2] for x in inputs))
    best: dict[str, float] = {}
    size: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for way in ("with-weights", "weightless", "forked", "from-graph"):
                root = Path(tmp) / f"{way}-{r}"
                jobs = []
                for s in stages:
                    (root / f"rank{s.index}").mkdir(parents=True)
                    jobs.append((root / f"rank{s.index}" / "stage.pt2", s, examples[s.index]))
                start = time.perf_counter()
                if way == "forked":
                    _reexport_files(jobs, StepTimes(), workers=len(os.sched_getaffinity(0)))  # whatever the load
                elif way == "from-graph":
                    for path, s, _ in jobs:
                        write_pt2(path, s)
                else:
                    for path, s, example in jobs:
                        (with_weights if way == "with-weights" else write_pt2)(path, s, example)
                best[way] = min(best.get(way, float("inf")), time.perf_counter() - start)
                size[way] = sum(p.stat().st_size for p, _, _ in jobs)
    params = sum(t.nbytes for t in gm.state_dict().values())
    print(f"{spec.model} {len(stages)} stages, {params / 1e6:.1f} MB of weights, load {os.getloadavg()}, "
          f"{len(os.sched_getaffinity(0))} CPUs")
    print("| stage.pt2 written | seconds (best of %d) | bytes of all stage.pt2 |" % args.repeat)
    print("|---|---|---|")
    for way in best:
        print(f"| {way} | {best[way]:.1f} | {size[way]:,} |")


if __name__ == "__main__":
    main()
