"""`hetpart run DIR`: launch torchrun on this machine, one CPU process per stage.

The launcher builds the example inputs from the model spec recorded in
plan.json, starts torchrun (gloo, loopback), collects the last rank's outputs
and, with `verify=True`, runs the unpartitioned model on the same inputs with
the same weights and compares.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, load_model
from hetpart.frontend.hf import HFModel, OutputStructure
from hetpart.runtime.artifacts import check_rank_files, load_manifest, read_json

VERIFY_ATOL = 1e-5  # fp32 outputs: max absolute difference
VERIFY_GRAD_RTOL = 1e-5  # fp32 gradients: max difference relative to the largest reference entry


@dataclass
class RunResult:
    outputs: tuple[torch.Tensor, ...]
    step_seconds: float
    max_abs_diff: float | None  # None without --verify
    grad_rel_err: float | None = None  # training with --verify: worst weight-gradient relative error
    measured: dict | None = None  # with --measure: the contents of measured.json
    all_step_seconds: list[float] | None = None
    structure: OutputStructure | None = None  # hf: models: how `outputs` rebuild the model's ModelOutput

    def model_outputs(self) -> object:
        """The outputs in the model's own structure (hf: models: its ModelOutput), else the tuple."""
        return self.structure.rebuild(self.outputs) if self.structure is not None else self.outputs

    def described_outputs(self) -> str:
        """`CausalLMOutput(logits=8x16x128)` for hf: models, else the shapes: `8x64x2048`."""
        if self.structure is not None:
            return self.structure.describe(self.outputs)
        return ", ".join("x".join(map(str, o.shape)) for o in self.outputs)


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
    for path in sorted(log_dir.rglob("*/*.log")):  # the ranks' logs, not the launchers'
        text = path.read_text(errors="replace").strip().splitlines()
        if text:
            chunks.append(f"--- {path.relative_to(log_dir)} (last {min(lines, len(text))} lines)\n" + "\n".join(text[-lines:]))
    return "\n".join(chunks)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun_commands(manifest: dict, log_dir: Path, as_nodes: bool) -> list[list[str]]:
    """One torchrun for the whole plan, or one per planned node (NOTE [ranks are stages])."""
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    if not as_nodes:
        return [torchrun + ["--standalone", "--nnodes=1", f"--nproc-per-node={manifest['world_size']}",
                            "--log-dir", str(log_dir), "--redirects", "3"]]
    port = _free_port()
    nodes = manifest["nodes"]
    return [
        torchrun + [f"--nnodes={len(nodes)}", f"--node-rank={node['node_rank']}",
                    f"--nproc-per-node={len(node['ranks'])}", "--rdzv-backend=static",
                    "--master-addr=127.0.0.1", f"--master-port={port}",
                    "--log-dir", str(log_dir / f"node{node['node_rank']}"), "--redirects", "3"]
        for node in nodes
    ]


def _run_torchruns(cmds: list[list[str]], log_dir: Path, timeout_s: float) -> None:
    """Start every torchrun, wait for all; on a failure or the timeout stop the rest and show the logs."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log_dir.mkdir(parents=True, exist_ok=True)
    launcher_logs = [log_dir / f"torchrun{i}.log" for i in range(len(cmds))]
    procs = []
    for cmd, log in zip(cmds, launcher_logs):
        with log.open("w") as f:  # a file, not a pipe: a chatty torchrun cannot block on a full pipe
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    failed: tuple[int, int, str] | None = None
    try:
        while any(p.poll() is None for p in procs):
            bad = next(((i, p) for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if bad is not None or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    for i, p in enumerate(procs):
        if p.returncode != 0:
            failed = (i, p.returncode, launcher_logs[i].read_text(errors="replace"))
            break
    if failed is None:
        return
    node, code, stderr = failed
    what = "did not finish in {:.0f} s".format(timeout_s) if time.monotonic() > deadline else f"exited with status {code}"
    raise HetpartError(
        f"torchrun{f' (node {node})' if len(procs) > 1 else ''} {what}; rank logs:\n{_log_tails(log_dir)}\n"
        f"--- torchrun\n{stderr.strip()[-3000:]}"
    )


def measurement(io_dir: Path, world: int, m: int, plan: dict, opts: "RunOptions") -> dict:
    """measured.json: each stage's forward time per microbatch and the step time, next to the plan's.

    The first step warms up (and runs pipelining's shape inference); with --steps > 1
    it is left out. A stage's measured time is the median wall time of its forward on
    one microbatch (compute only: transfers are measured in the step time).
    """
    from hetpart.partitioner.simulate import simulate

    keep = slice(1, None) if opts.steps > 1 else slice(0, 1)
    stages = []
    last_steps: list[float] = []
    for rank in range(world):
        data = json.loads((io_dir / f"timing{rank}.json").read_text())
        forwards = [t for step in data["forward_s"][keep] for t in step[-m:]]
        planned = plan["stages"][rank]
        stages.append({
            "index": rank,
            "device": planned["device"],
            "measured_time_us": round(statistics.median(forwards) * 1e6, 3),
            "predicted_compute_us": planned["compute_us"],
            "predicted_time_us": planned["predicted_time_us"],
        })
        if rank == world - 1:
            last_steps = data["step_s"][keep]
    predicted = None
    if opts.mode == "inference":
        timeline = simulate([round(s["compute_us"] * 1000) for s in plan["stages"]],
                            [round(s["comm_out_us"] * 1000) for s in plan["stages"][:-1]], m, opts.schedule)
        predicted = round(timeline.step_ns / 1000, 3)
    return {
        "format_version": 1,
        "mode": opts.mode,
        "schedule": opts.schedule,
        "microbatches": m,
        "steps_measured": len(last_steps),
        "threads_per_rank": int(os.environ.get("OMP_NUM_THREADS", "1")),
        "stages": stages,
        "step_time_us": round(statistics.median(last_steps) * 1e6, 3),
        "predicted_step_time_us": predicted,
    }


@dataclass(frozen=True)
class RunOptions:
    mode: str = "inference"  # or "training": loss on the last stage, SGD step on every rank
    schedule: str = "gpipe"  # or "1f1b"
    microbatches: int | None = None  # default: the plan's
    steps: int = 1
    verify: bool = False
    timeout_s: float = 600
    lr: float = 1e-3
    as_nodes: bool = False  # one torchrun per planned node on loopback (a multi-node rehearsal)
    measure: bool = False  # write DIR/measured.json


def _check_options(opts: RunOptions, batch_size: int, world: int, m: int) -> None:
    if opts.mode not in ("inference", "training"):
        raise HetpartError(f"--mode {opts.mode}: expected inference or training")
    if opts.schedule not in ("gpipe", "1f1b"):
        raise HetpartError(f"--schedule {opts.schedule}: expected gpipe or 1f1b")
    if m < 1 or batch_size % m:
        raise HetpartError(f"--microbatches {m} must be >= 1 and divide the batch size {batch_size}")
    if opts.schedule == "1f1b" and m < world:
        raise HetpartError(f"--schedule 1f1b needs at least as many microbatches as stages ({world}); "
                           f"got --microbatches {m}")
    if opts.steps < 1:
        raise HetpartError(f"--steps must be >= 1 (got {opts.steps})")


def _target(manifest: dict, batch_size: int, seed: int) -> torch.Tensor:
    """The training target: random, shaped like the model's first output at the full batch."""
    first = manifest["ranks"][-1]["outputs"][0]
    shape = [batch_size if i == 0 else int(d) for i, d in enumerate(first["shape"])]
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randn(shape, generator=generator)


def _reference_grads(module: torch.nn.Module, inputs: tuple, target: torch.Tensor, m: int) -> dict[str, torch.Tensor]:
    """Gradients of the mean over microbatches of training_loss, as the schedule computes them."""
    from hetpart.runtime.worker import training_loss

    module.zero_grad(set_to_none=True)
    chunks = list(zip(*(x.tensor_split(m) for x in inputs)))
    for xs, t in zip(chunks, target.tensor_split(m)):
        (training_loss(module(*xs), t) / m).backward()
    return {name: p.grad for name, p in module.named_parameters(remove_duplicate=False) if p.grad is not None}


def _grad_rel_err(io_dir: Path, world: int, reference: dict[str, torch.Tensor]) -> float:
    """Largest relative error of any weight's gradient, on every rank that holds the weight.

    A weight on several ranks must carry the full (summed) gradient on each of them
    (NOTE [replicated weights] in worker.py).
    """
    got: list[tuple[str, torch.Tensor]] = []
    for rank in range(world):
        path = io_dir / f"grads{rank}.safetensors"
        if path.exists():
            got.extend(load_file(str(path)).items())
    missing = sorted({name for name, _ in got} - set(reference))
    if missing:
        raise HetpartError(f"verification: the pipeline has gradients for {missing[:5]} the model does not")
    worst = 0.0
    for name, g in got:
        ref = reference[name]
        scale = float(ref.abs().max())
        worst = max(worst, float((g - ref).abs().max()) / scale if scale > 0 else float(g.abs().max()))
    return worst


def run_pipeline(out: Path, opts: RunOptions = RunOptions(), echo: Callable[[str], None] = print) -> RunResult:
    manifest = load_manifest(out)
    plan = read_json(out / "plan.json")
    spec = ModelSpec.from_json(plan["model"])
    m = opts.microbatches or plan["microbatches"]
    world = manifest["world_size"]
    _check_options(opts, spec.batch_size, world, m)
    for entry in manifest["ranks"]:
        check_rank_files(out, entry)
    module, inputs = reference_model(out, manifest, spec) if opts.verify else load_model(spec)
    structure = module.output_structure() if isinstance(module, HFModel) else None
    training = opts.mode == "training"
    log_dir = out / "logs"
    shutil.rmtree(log_dir, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="hetpart-run-") as io:
        io_dir = Path(io)
        names = [i["name"] for i in manifest["ranks"][0]["inputs"]]
        save_file({n: x.contiguous() for n, x in zip(names, inputs)}, str(io_dir / "inputs.safetensors"))
        target = _target(manifest, spec.batch_size, spec.seed) if training else None
        if target is not None:
            save_file({"target": target}, str(io_dir / "target.safetensors"))
        worker_args = ["-m", "hetpart.runtime.worker", str(out), "--io", str(io_dir), "--microbatches", str(m),
                       "--mode", opts.mode, "--schedule", opts.schedule, "--steps", str(opts.steps),
                       "--lr", str(opts.lr), "--device", "auto" if torch.cuda.is_available() else "cpu"]
        cmds = _torchrun_commands(manifest, log_dir, opts.as_nodes)
        where = (f"{len(cmds)} torchrun node(s) on loopback" if opts.as_nodes else "one torchrun")
        backend = manifest["backend"] if torch.cuda.is_available() else "gloo on CPU"
        echo(f"launching {where}: {world} rank(s), {backend}, {opts.mode} with {opts.schedule}, "
             f"{m} microbatch(es), {opts.steps} step(s); logs in {log_dir}")
        _run_torchruns([c + worker_args for c in cmds], log_dir, opts.timeout_s)
        got = load_file(str(io_dir / "outputs.safetensors"))
        outputs = tuple(got[o["name"]] for o in manifest["ranks"][-1]["outputs"])
        step_s = [float(x) for x in (io_dir / "step_seconds").read_text().split()]
        measured = measurement(io_dir, world, m, plan, opts) if opts.measure else None
        if measured is not None:
            (out / "measured.json").write_text(json.dumps(measured, indent=2) + "\n")
        diff = grad_err = None
        if opts.verify:
            if training:
                grad_err = _grad_rel_err(io_dir, world, _reference_grads(module, inputs, target, m))
            with torch.no_grad():
                ref = module(*inputs)
            ref_flat = ref if isinstance(ref, tuple) else (ref,)
            if len(ref_flat) != len(outputs):
                raise HetpartError(f"verification: the model returns {len(ref_flat)} outputs, the pipeline {len(outputs)}")
            diff = max(float((a.float() - b.float()).abs().max()) if a.numel() else 0.0 for a, b in zip(outputs, ref_flat))
    return RunResult(outputs=outputs, step_seconds=step_s[0], max_abs_diff=diff, grad_rel_err=grad_err,
                     all_step_seconds=step_s, measured=measured, structure=structure)
