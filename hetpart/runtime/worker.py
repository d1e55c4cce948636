"""One torchrun rank: load this rank's stage, run the pipeline schedule, report.

Run by `hetpart run` as `torchrun ... -m hetpart.runtime.worker OUT --io DIR`.
Rank 0 reads the inputs from DIR/inputs.safetensors; the last rank writes the
outputs to DIR/outputs.safetensors. Each rank loads only its own files.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import load_manifest, load_stage


def run_rank(out: Path, io_dir: Path, microbatches: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = load_manifest(out)
    if manifest["world_size"] != world:
        raise HetpartError(f"the plan has {manifest['world_size']} ranks but torchrun started {world}")
    entry = manifest["ranks"][rank]
    module = load_stage(out, entry)
    module.requires_grad_(False)  # inference
    stage = PipelineStage(module, stage_index=rank, num_stages=world, device=torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=microbatches)
    args = ()
    if rank == 0:
        tensors = load_file(str(io_dir / "inputs.safetensors"))
        args = tuple(tensors[i["name"]] for i in entry["inputs"])
    dist.barrier()
    start = time.perf_counter()
    with torch.no_grad():
        result = schedule.step(*args)
    elapsed = time.perf_counter() - start
    print(f"rank {rank}: step {elapsed * 1e3:.2f} ms", flush=True)
    if rank == world - 1:
        outputs = result if isinstance(result, tuple) else (result,)
        names = [o["name"] for o in entry["outputs"]]
        save_file({n: t.contiguous() for n, t in zip(names, outputs)}, str(io_dir / "outputs.safetensors"))
        (io_dir / "step_seconds").write_text(f"{elapsed}\n")
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hetpart.runtime.worker")
    parser.add_argument("out", type=Path)
    parser.add_argument("--io", type=Path, required=True)
    parser.add_argument("--microbatches", type=int, required=True)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    try:
        run_rank(args.out, args.io, args.microbatches)
    except HetpartError as err:
        print(f"hetpart: rank {os.environ.get('RANK')}: {err}", file=sys.stderr, flush=True)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
