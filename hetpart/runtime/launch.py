"""`hetpart run DIR`: launch torchrun on this machine, one CPU process per stage.

The launcher builds the example inputs from the model spec recorded in
plan.json, starts torchrun (gloo, loopback), collects the last rank's outputs
and, with `verify=True`, runs the unpartitioned model on the same inputs with
the same weights and compares.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import check_rank_files, load_manifest, read_json

VERIFY_ATOL = 1e-5  # fp32


@dataclass
class RunResult:
    outputs: tuple[torch.Tensor, ...]
    step_seconds: float
    max_abs_diff: float | None  # None without --verify


def reference_model(out: Path, manifest: dict, spec: ModelSpec) -> tuple[torch.nn.Module, tuple]:
    """The unpartitioned model with the artifacts' weights, and the example inputs."""
    module, inputs = load_model(spec)
    shipped: dict[str, torch.Tensor] = {}
    for entry in manifest["ranks"]:
        shipped.update(load_file(str(check_rank_files(out, entry) / "weights.safetensors")))
    state = module.state_dict(keep_vars=True)
    alias: dict[int, str] = {}
    for key, tensor in state.items():  # tied weights ship under one of their names
        if key in shipped:
            alias[id(tensor)] = key
    new_state = {}
    for key, tensor in state.items():
        source = key if key in shipped else alias.get(id(tensor))
        new_state[key] = shipped[source] if source is not None else tensor
    module.load_state_dict(new_state, strict=True)
    return module, inputs


def _log_tails(log_dir: Path, lines: int = 15) -> str:
    chunks = []
    for path in sorted(log_dir.rglob("*.log")):
        text = path.read_text(errors="replace").strip().splitlines()
        if text:
            chunks.append(f"--- {path.relative_to(log_dir)} (last {min(lines, len(text))} lines)\n" + "\n".join(text[-lines:]))
    return "\n".join(chunks)


def run_pipeline(out: Path, *, microbatches: int | None = None, verify: bool = False, timeout_s: float = 600,
                 echo: Callable[[str], None] = print) -> RunResult:
    manifest = load_manifest(out)
    plan = read_json(out / "plan.json")
    spec = ModelSpec.from_json(plan["model"])
    m = microbatches or plan["microbatches"]
    world = manifest["world_size"]
    if m < 1 or spec.batch_size % m:
        raise HetpartError(f"--microbatches {m} must be >= 1 and divide the batch size {spec.batch_size}")
    for entry in manifest["ranks"]:
        check_rank_files(out, entry)
    module, inputs = reference_model(out, manifest, spec) if verify else (None, load_model(spec)[1])
    log_dir = out / "logs"
    with tempfile.TemporaryDirectory(prefix="hetpart-run-") as io:
        io_dir = Path(io)
        names = [i["name"] for i in manifest["ranks"][0]["inputs"]]
        save_file({n: x.contiguous() for n, x in zip(names, inputs)}, str(io_dir / "inputs.safetensors"))
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={world}", "--log-dir", str(log_dir), "--redirects", "3",
            "-m", "hetpart.runtime.worker", str(out), "--io", str(io_dir), "--microbatches", str(m),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        echo(f"launching torchrun: {world} rank(s), gloo on CPU, {m} microbatch(es); logs in {log_dir}")
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise HetpartError(f"the pipeline did not finish in {timeout_s:.0f} s; rank logs:\n{_log_tails(log_dir)}") from None
        if proc.returncode != 0:
            raise HetpartError(
                f"torchrun exited with status {proc.returncode}; rank logs:\n{_log_tails(log_dir)}\n"
                f"--- torchrun\n{proc.stderr.strip()[-3000:]}"
            )
        got = load_file(str(io_dir / "outputs.safetensors"))
        outputs = tuple(got[o["name"]] for o in manifest["ranks"][-1]["outputs"])
        step_s = float((io_dir / "step_seconds").read_text())
    diff = None
    if verify:
        with torch.no_grad():
            ref = module(*inputs)
        ref_flat = ref if isinstance(ref, tuple) else (ref,)
        if len(ref_flat) != len(outputs):
            raise HetpartError(f"verification: the model returns {len(ref_flat)} outputs, the pipeline {len(outputs)}")
        diff = max(float((a.float() - b.float()).abs().max()) if a.numel() else 0.0 for a, b in zip(outputs, ref_flat))
    return RunResult(outputs=outputs, step_seconds=step_s, max_abs_diff=diff)
