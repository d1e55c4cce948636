"""Try every Hugging Face family on preset:mixed-4 and print the docs/models.md table.

    .venv/bin/python benchmarks/hf_families.py               # in-process check of the stage files
    .venv/bin/python benchmarks/hf_families.py --run gpt2    # also `hetpart run --verify` under torchrun

Each family is built at small sizes (`hetpart.frontend.hf.small_overrides`), partitioned with
`compile_model`, and its generated stage.py modules are run back to back in this process at the
traced batch and at another batch, every output tensor compared with the unpartitioned model.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hetpart.compile import CompileOptions, compile_model  # noqa: E402
from hetpart.errors import HetpartError  # noqa: E402
from hetpart.frontend import ModelSpec, load_model  # noqa: E402
from hetpart.frontend.hf import choose_head, small_overrides  # noqa: E402
from hetpart.runtime.artifacts import load_manifest, load_stage  # noqa: E402

FAMILIES = [
    # required
    "gpt2", "bert", "llama", "t5", "vit", "mixtral",
    # decoder-only
    "opt", "gpt_neox", "gptj", "gpt_neo", "bloom", "mistral", "qwen2", "qwen3", "qwen2_moe", "phi", "phi3",
    "falcon", "gemma", "gemma2", "starcoder2", "olmo", "stablelm", "codegen",
    "gpt_bigcode", "xglm", "biogpt", "cohere", "granite", "olmo2", "nemotron", "persimmon", "mpt", "glm", "glm4",
    "helium", "smollm3", "exaone4", "ministral", "cohere2", "gemma3_text",
    # decoder-only, mixture of experts
    "phimoe", "qwen3_moe", "deepseek_v3", "dbrx", "granitemoe", "olmoe", "jamba",
    # decoder-only, recurrent and state-space
    "mamba", "rwkv", "recurrent_gemma",
    # encoder-only
    "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta", "mpnet", "camembert",
    "modernbert", "funnel", "ernie", "roformer", "squeezebert", "megatron-bert", "xlm", "flaubert", "data2vec-text",
    "rembert", "mobilebert", "nystromformer", "esm",
    # encoder-decoder
    "bart", "mbart", "mt5", "pegasus", "marian", "blenderbot", "led",
    "bigbird_pegasus", "prophetnet", "fsmt", "m2m_100", "plbart", "umt5", "switch_transformers", "longt5",
    "nllb-moe", "mvp",
    # vision
    "deit", "swin", "beit", "convnext", "resnet",
    "dinov2", "efficientnet", "mobilenet_v2", "regnet", "levit", "poolformer", "cvt", "swinv2", "convnextv2",
    "focalnet", "mobilevit", "pvt", "bit",
]
ATOL = 1e-4


@dataclass
class Row:
    family: str
    head: str = "-"
    partitions: bool = False
    verified: bool = False
    stages: int = 0
    seconds: float = 0.0
    note: str = ""


def stage_outputs(out: Path, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The generated stage.py modules of `out` run back to back in this process."""
    values = inputs
    with torch.no_grad():
        for entry in load_manifest(out)["ranks"]:
            values = load_stage(out, entry)(*values)
            values = values if isinstance(values, tuple) else (values,)
    return values


def check_stages(spec: ModelSpec, out: Path, other_batch: int) -> float:
    """Max |pipeline - model| over every output tensor, at the traced batch and at `other_batch`."""
    module, inputs = load_model(spec)
    worst = 0.0
    for batch in (spec.batch_size, other_batch):
        x = tuple(t[:batch] for t in inputs)
        got = stage_outputs(out, x)
        with torch.no_grad():
            want = module(*x)
        if len(got) != len(want):
            raise AssertionError(f"pipeline returns {len(got)} tensors, the model {len(want)}")
        for a, b in zip(got, want):
            if a.shape != b.shape:
                raise AssertionError(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
            worst = max(worst, float((a.float() - b.float()).abs().max()) if a.numel() else 0.0)
    return worst


def try_family(family: str, run: bool) -> Row:
    row = Row(family)
    start = time.perf_counter()
    try:
        overrides = small_overrides(family)
        spec = ModelSpec(f"hf:{family}", overrides, batch_size=8, seq_len=16)
        module, _ = load_model(spec)
        row.head = choose_head(family, module.model.config)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out"
            result = compile_model(spec, "preset:mixed-4", out, CompileOptions(microbatches=4, time_limit_s=2),
                                   echo=lambda _: None)
            row.partitions, row.stages = True, len(result.plan.stages)
            diff = check_stages(spec, out, other_batch=3)
            if diff > ATOL:
                raise AssertionError(f"stage files differ from the model by {diff:.3g}")
            if run:
                from hetpart.runtime.launch import RunOptions, run_pipeline

                res = run_pipeline(out, RunOptions(verify=True), echo=lambda _: None)
                if res.max_abs_diff is None or res.max_abs_diff > ATOL:
                    raise AssertionError(f"torchrun verify: max_abs_diff={res.max_abs_diff}")
                row.note = "torchrun verified"
            row.verified = True
    except (HetpartError, AssertionError, Exception) as err:  # the table records every failure
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        text = re.sub(r"\S*site-packages/", "", text).replace("|", "/")  # keep the table one line per row
        row.note = f"{type(err).__name__}: {text}"[:240]
        if os.environ.get("HF_FAMILIES_TRACEBACK"):
            traceback.print_exc()
    row.seconds = time.perf_counter() - start
    return row


TABLE_HEADER = "| family | head | partitions | runs verified | notes |\n|---|---|---|---|---|"


def table_row(r: Row) -> str:
    yes = {True: "yes", False: "no"}
    return (f"| {r.family} | {r.head} | {yes[r.partitions]}"
            f"{f' ({r.stages} stages)' if r.partitions else ''} | {yes[r.verified]} | {r.note} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=FAMILIES)
    parser.add_argument("--run", action="store_true", help="also run under torchrun with --verify")
    args = parser.parse_args()
    rows = []
    print(TABLE_HEADER, flush=True)
    for family in args.families:  # a row as soon as its family is done: a long run can be read as it goes
        row = try_family(family, args.run)
        print(f"{family:<14} {row.seconds:6.1f} s  {'ok' if row.verified else 'FAIL'}  {row.note}", file=sys.stderr,
              flush=True)
        print(table_row(row), flush=True)
        rows.append(row)
    return 0 if all(r.verified for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
