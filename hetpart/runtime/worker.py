"""One torchrun rank: load this rank's stage, run the pipeline schedule, report.

Run by `hetpart run` as `python -m hetpart.runtime.agent ... --run-path worker.py OUT --io DIR ...` (NOTE [forked
ranks] in agent.py), or by torchrun as `torchrun ... -m hetpart.runtime.worker OUT --io DIR ...`.
Rank 0 reads the inputs from DIR/inputs.safetensors, the last rank the training
target from DIR/target.safetensors; the last rank writes the first step's
outputs to DIR/outputs.safetensors and, in training, every rank writes its
weights' gradients (before the optimizer step) to DIR/grads<rank>.safetensors,
the last its microbatches' losses of every step to DIR/losses<rank>.safetensors and,
with --dump-weights, every rank its weights after the last step to DIR/weights<rank>.safetensors.
With several data-parallel pipelines (issue 19) each pipeline's first and last ranks do this
on the pipeline's rows of the batch, and its last writes DIR/outputs.pipeline<p>.safetensors.
Each rank loads only its own files, and checks them (and plan.json, and with --key the
manifest's signature) before it executes its stage.py: NOTE [artifacts are code] in hetpart/trust.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from hetpart.errors import HetpartError
from hetpart.ir.info import DTYPE_NAMES
from hetpart.procs import process_start
from hetpart.runtime.checkpoint import CheckpointRun
from hetpart.runtime.emulate import SleepPadding
from hetpart.runtime.optimizers import DEFAULT, DEFAULT_LR, OPTIMIZERS, OptimizerSpec
from hetpart.runtime import tp
from hetpart.runtime.artifacts import dim_size, load_manifest, rank_pipeline, read_plan, symbol_sizes
from hetpart.runtime.schedules import SCHEDULES, build_rank, default_schedule
from hetpart.runtime.timeline import recording, schedule_stages
from hetpart.trust import read_key

# NOTE [test-only crash hook]: HETPART_TEST_CRASH_RANK=K makes rank K SIGKILL itself after its
# first forward, so tests/runtime/test_faults.py can kill a rank mid-run deterministically
# (with HETPART_TEST_CRASH_AFTER=N, after its N-th: tests/runtime/test_spot.py, after a checkpoint).
# Tests only; unset, it costs one dictionary lookup per forward.
# HETPART_TEST_BREAK_GRAD_SYNC=scale|sync|degree breaks NOTE [pipelines gradients] on purpose (each
# pipeline's own mean instead of the global batch's; no all-reduce; a TP stage's replicated copies not
# divided by its degree, NOTE [mixed-degree gradient sync]), so tests/runtime/
# test_pipelines_run.py can check that `--verify` then fails. Tests only. =virtual counts the gradient of
# the last of a rank's virtual stages twice (NOTE [virtual-stage manifest]), for tests/runtime/test_schedules.py.
# HETPART_TEST_BREAK_TP=shard|copy breaks a tensor-parallel stage (runtime/tp.py `break_for_test`:
# TP rank 1 doubles its shards' gradients; codegen/tp.py's TP_SOURCE: f's backward all-reduce is left out).


def training_loss(output: torch.Tensor | tuple[torch.Tensor, ...], target: torch.Tensor) -> torch.Tensor:
    """The loss `hetpart run --mode training` optimizes: MSE of the first output against a target.

    Model-agnostic on purpose: it exercises every weight's gradient through the
    pipeline; the reference in launch.py computes the same.
    """
    first = output[0] if isinstance(output, (tuple, list)) else output
    return torch.nn.functional.mse_loss(first.float(), target)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous.

    gloo sends and receives contiguous buffers only, and pipelining sizes a
    stage's gradient buffers like the next stage's input gradients, which are
    often strided (the gradient of a `cat` input is a slice of the `cat`'s).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return grad.contiguous()


class Boundary(torch.nn.Module):
    """Wraps a generated stage so that what crosses a boundary is contiguous, both ways."""

    def __init__(self, stage: torch.nn.Module) -> None:
        super().__init__()
        self.stage = stage
        self.forward_seconds: list[float] = []  # wall time of each microbatch's forward (for --measure)
        self.forward_cpu_seconds: list[float] = []  # and this thread's CPU time in it (the rank's own compute)
        self.padding: SleepPadding | None = None  # --emulate-by sleep: NOTE [emulation by sleep]

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        start, cpu_start = time.perf_counter(), time.thread_time()
        args = tuple(_ContiguousGrad.apply(a) if a.is_floating_point() else a for a in args)
        outputs = tuple(o.contiguous() for o in self.stage(*args))
        if self.padding is not None:
            self.padding.pad(start, cpu_start)
        self.forward_seconds.append(time.perf_counter() - start)
        self.forward_cpu_seconds.append(time.thread_time() - cpu_start)
        if (os.environ.get("HETPART_TEST_CRASH_RANK") == os.environ.get("RANK")  # NOTE [test-only crash hook]
                and len(self.forward_seconds) >= int(os.environ.get("HETPART_TEST_CRASH_AFTER", "1"))):
            os.kill(os.getpid(), signal.SIGKILL)
        return outputs


def _static_metadata(manifest: dict, entry: dict, sizes: dict[str, int], device: torch.device,
                     sent: list[dict] | None = None) -> dict | None:
    """`input_args`/`output_args` for PipelineStage: zeros shaped like this rank's boundary values.

    NOTE [static stage metadata]: without them, pipelining infers each stage's output shapes by
    running it on `torch.empty` inputs, and an integer tensor crossing a cut (HF attention-mask
    indices, decoder token ids) then holds garbage that `index`/`embedding` reject. The manifest
    knows every shape in the model's symbols; `sizes` gives each symbol's size in one microbatch
    of this run (the batch symbols the microbatch size, the sequence symbol the run's length:
    `symbol_sizes`), and every dim is evaluated at them (`16*s0`, `s0*s1`: NOTE [symbolic dims]).
    A dim naming a symbol `sizes` lacks leaves the stage to inference (None). Inference mode
    only: training also needs gradient metadata. `sent`: what the stage sends, where the manifest's
    next rank does not run the next stage (virtual stages: NOTE [virtual-stage manifest]).
    """
    dtypes = {name: dtype for dtype, name in DTYPE_NAMES.items()}

    def zeros(values: list[dict]) -> tuple[torch.Tensor, ...] | None:
        out = []
        for v in values:
            dims = [dim_size(d, sizes) for d in v["shape"]]
            if None in dims or v["dtype"] not in dtypes:
                return None
            out.append(torch.zeros(dims, dtype=dtypes[v["dtype"]], device=device))
        return tuple(out)

    if sent is None:
        ranks, stages = manifest["ranks"], rank_pipeline(manifest, entry["rank"]).stages
        nxt = entry["stage"] + 1  # the next stage of this rank's pipeline
        sent = ranks[stages[nxt][0]]["inputs"] if nxt < len(stages) else entry["outputs"]
    inputs, outputs = zeros(entry["inputs"]), zeros(sent)  # what a rank sends is what the next receives
    return None if inputs is None or outputs is None else {"input_args": inputs, "output_args": outputs}


def _weight_names(module: torch.nn.Module) -> dict[str, str]:
    """Stage attribute -> weight FQN, from the generated stage.py's WEIGHTS table (a rank's several stages: theirs)."""
    if hasattr(module, "weight_names"):  # runtime/schedules.py's RankStages
        return module.weight_names()
    table = sys.modules[type(module).__module__].WEIGHTS
    return {attr: key for attr, (key, _) in table.items()}


def mesh_groups(manifest: dict, training: bool) -> dict[str, dist.ProcessGroup]:
    """The process groups of the manifest's mesh (NOTE [the mesh] in codegen/artifacts.py), by name: every
    rank creates every group, in the mesh's order, as torch.distributed requires; the `weights` groups only
    in training, where their gradients are summed."""
    return {g["name"]: dist.new_group(g["ranks"]) for g in manifest["mesh"]["groups"]
            if g["kind"] in ("pipeline", "tp") or training}


def shared_weight_groups(manifest: dict) -> list[tuple[tuple[int, ...], list[str], dict[str, dict]]]:
    """The mesh's `weights` groups: (the ranks holding copies of the same weights, those weights' names, the slice
    each group sums of a split weight: NOTE [mixed-degree gradient sync] in partitioner/tp_sync.py)."""
    return [(tuple(g["ranks"]), g["weights"], g.get("slices", {})) for g in manifest["mesh"]["groups"]
            if g["kind"] == "weights"]


@dataclass
class SharedGrads:
    """What `sum_shared_grads` does on this rank each step, derived once before the steps (the hot path): the
    parameters its weights groups sum (a zero gradient made where a step left none), those first divided by its
    stage's degree, and per group (in the mesh's order: the collectives pair up on every rank) each parameter with
    its slice (pieces, local piece, dim, chunks; None: the whole gradient)."""

    held: list[torch.nn.Parameter] = field(default_factory=list)
    divided: list[torch.nn.Parameter] = field(default_factory=list)
    degree: int = 1
    groups: list[tuple[Any, list[tuple[torch.nn.Parameter, tuple[int, int, int, int] | None]]]] = field(
        default_factory=list)


def shared_grads(module: torch.nn.Module, groups: list, process_groups: list, degree: int = 1,
                 split: tuple[int, frozenset[str]] = (0, frozenset())) -> SharedGrads:
    """This rank's part of the weights groups (`shared_weight_groups`, their `process_groups`) as `SharedGrads`.
    `degree` > 1: this rank's stage's TP degree in a plan of mixed degrees, whose weights groups hold every TP rank
    of a stage, each adding its (whole, equal) gradient of a weight it does not split divided by the degree;
    `split`: (this rank's TP index, the weights its stage splits); a group's `slices` name the part of a split
    weight it sums (NOTE [mixed-degree gradient sync] in partitioner/tp_sync.py)."""
    if not groups:
        return SharedGrads()
    names = _weight_names(module)
    by_name = {names[attr]: p for attr, p in module.named_parameters() if attr in names}
    mine = [(weights, slices, pg) for (ranks, weights, slices), pg in zip(groups, process_groups)
            if dist.get_rank() in ranks]
    held = sorted({n for weights, _, _ in mine for n in weights if n in by_name})
    broken = os.environ.get("HETPART_TEST_BREAK_GRAD_SYNC") == "degree"  # NOTE [test-only crash hook]
    out = SharedGrads([by_name[n] for n in held], [by_name[n] for n in held if degree > 1 and n not in split[1]
                                                    and not broken], degree)  # each rank's copy adds 1/degree
    for weights, slices, pg in mine:
        parts: list[tuple[torch.nn.Parameter, tuple[int, int, int, int] | None]] = []
        for name in (n for n in weights if n in by_name):
            spec = slices.get(name)  # this rank's part of the slice: a shard holds of/degree of them, a copy all
            if spec is None:
                parts.append((by_name[name], None))
                continue
            pieces, local = ((spec["of"] // degree, spec["index"] - split[0] * (spec["of"] // degree))
                             if name in split[1] else (spec["of"], spec["index"]))
            parts.append((by_name[name], (pieces, local, spec["dim"], spec["chunks"])))
        out.groups.append((pg, parts))
    return out


def sum_shared_grads(shared: SharedGrads) -> None:
    """Sum the gradients of every weight that several ranks hold, over its mesh group.

    NOTE [replicated weights]: a weight read by several stages (a tied embedding and LM
    head) is a copy on each of their ranks; each copy gets the gradient of its own uses,
    so the copies' gradients are summed before the optimizer step and they stay equal.
    Degrees mixed per stage: `shared_grads`."""
    for p in shared.held:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for p in shared.divided:
        p.grad.div_(shared.degree)
    for pg, parts in shared.groups:
        for p, part in parts:
            if part is None:
                dist.all_reduce(p.grad, group=pg)
                continue
            pieces, local, dim, chunks = part
            views = [c.chunk(pieces, dim=dim)[local] for c in p.grad.chunk(chunks, dim=dim)]
            buf = torch.cat(views, dim=dim).contiguous()
            dist.all_reduce(buf, group=pg)
            for v, piece in zip(views, buf.chunk(len(views), dim=dim)):
                v.copy_(piece)


# NOTE [pipelines gradients]
# `training_loss` is a mean over one microbatch's elements. The global batch's loss is the
# mean over all of its elements, and with microbatches of one size that is the mean of the M
# microbatch losses, L = (1/M) sum_i L_i, whichever pipeline ran microbatch i. So every schedule
# runs with `scale_grads=False` (its stages sum their microbatches' gradients; pipelining's
# default would divide by the pipeline's own count m_p), each rank divides its sums by the
# global M, and the mesh's "weights" groups all-reduce (sum) over every rank holding a copy of
# a weight: the copies of one pipeline (a tied embedding and LM head) hold the gradients of
# their own uses, the pipelines those of disjoint microbatches, so the sum is dL/dw on every
# copy. One pipeline is the case M = m_p: what pipelining's scaling did before. The optimizer
# then steps every copy alike, and `run --verify` compares the loss, every copy's gradient and
# the weights after the last step with the unpartitioned model on the global batch.
def sync_gradients(module: torch.nn.Module, shared: SharedGrads, microbatches: int, pipeline_microbatches: int) -> None:
    """NOTE [pipelines gradients]: this rank's summed gradients divided by the global `microbatches`, then
    summed over the weights groups (`shared`; `pipeline_microbatches`: its pipeline's share, for the test hook)."""
    broken = os.environ.get("HETPART_TEST_BREAK_GRAD_SYNC")  # NOTE [test-only crash hook]
    divisor = pipeline_microbatches if broken == "scale" else microbatches
    if broken == "virtual" and hasattr(module, "stages"):  # runtime/schedules.py's RankStages
        for p in module.stages[-1].parameters():
            if p.grad is not None:
                p.grad.mul_(2)
    for p in module.parameters():
        if p.grad is not None:
            p.grad.div_(divisor)
    if broken != "sync":
        sum_shared_grads(shared)


def _dump_weights(module: torch.nn.Module, weight_names: dict[str, str], manifest: dict, entry: dict, groups: dict,
                  device: torch.device, path: Path) -> None:
    """--verify: every weight this rank holds, whole (a TP rank's shards gathered), by FQN, to `path`."""
    dumped = {weight_names[attr]: p.detach().cpu().contiguous() for attr, p in module.named_parameters()
              if attr in weight_names}
    save_file(tp.gather_shards(dumped, manifest, entry, groups, device), str(path))


def run_rank(out: Path, io_dir: Path, mode: str, schedule_name: str | None, microbatches: int, steps: int,
             optim: OptimizerSpec, device: torch.device, batch_size: int | None = None, seq_len: int | None = None,
             key: bytes | None = None, dump_weights: bool = False, checkpoint: CheckpointRun | None = None,
             timeline: bool = False, padding: SleepPadding | None = None) -> None:
    """Run this rank's stage; `checkpoint`: save and resume hooks (NOTE [checkpoint layout]); `batch_size` and `seq_len` are the run's (default: the plan's traced ones);
    with `key`, only if manifest.json's signature verifies. `microbatches` is the global batch's; a
    rank of one of several pipelines runs its pipeline's share of them (NOTE [the mesh])."""
    rank, world = dist.get_rank(), dist.get_world_size()
    manifest = load_manifest(out, key)
    plan = read_plan(out, manifest)  # checked before any code of `out` runs
    model = plan.model
    schedule_name = schedule_name or default_schedule(plan.schedule, mode)  # launch.sh without --schedule
    if manifest["world_size"] != world:
        raise HetpartError(f"the plan has {manifest['world_size']} ranks but torchrun started {world}")
    entry = manifest["ranks"][rank]
    if device.type != "cpu":  # stage code creates tensors (arange, masks) on the default device: NOTE [baked devices]
        torch.set_default_device(device)
    training = mode == "training"
    sizes = symbol_sizes(manifest, (batch_size or model.batch_size) // microbatches, seq_len or model.seq_len)
    mesh = manifest["mesh"]
    groups = mesh_groups(manifest, training)
    pipe = rank_pipeline(manifest, rank)
    pipeline = next(g for g in mesh["groups"] if g["name"] == pipe.group)
    share = pipe.microbatches or microbatches  # this pipeline's microbatches of the global batch
    # This rank's stage(s) in PipelineStages and the schedule (several stages per rank: NOTE [virtual-stage manifest]).
    built = build_rank(out, manifest, entry, device, schedule_name, share, training, groups[pipeline["name"]],
                       pipeline["ranks"], pipe.stages, Boundary, training_loss if training else None, _weight_names,
                       lambda e, sent: _static_metadata(manifest, e, sizes, device, sent), groups)
    module, boundary, schedule = built.module, built.boundaries[0], built.schedule
    tp.attach_group(module, manifest, entry, groups)  # NOTE [tensor-parallel stages]
    if padding is not None:  # NOTE [emulation by sleep]: every forward (in Boundary) and backward
        for b in built.boundaries:
            b.padding = padding
        for s in schedule_stages(schedule):
            padding.wrap(s, "backward_one_chunk")
            padding.wrap(s, "backward_weight_one_chunk")
    first, last, output_entry = built.first, built.last, built.output_entry
    params = [p for p in module.parameters() if p.requires_grad]
    process_groups = [groups[g["name"]] for g in mesh["groups"] if g["kind"] == "weights" and training]
    optimizer = optim.make(params) if training and params else None  # NOTE [the run's optimizer]
    checkpoint = checkpoint or CheckpointRun()
    weight_names = _weight_names(module)  # stage attribute -> weight FQN, fixed for the run
    shards = tp.weight_shards(manifest, entry)  # a TP rank's parts of its split weights (NOTE [checkpoint slices])
    checkpoint.before_loop(entry, module, optimizer, weight_names, params, shards)  # --resume
    if dump_weights and training and checkpoint.resume is not None:  # NOTE [verify a resume] in verify.py
        _dump_weights(module, weight_names, manifest, entry, groups, device, io_dir / f"resumed{rank}.safetensors")
    shared = shared_grads(module, shared_weight_groups(manifest) if training else [], process_groups,  # once
                          entry["tp"]["degree"] if tp.is_mixed(manifest) else 1, (tp.tp_rank(entry), frozenset(shards)))
    args: tuple = ()
    rows = slice(None)  # this pipeline's rows of the global batch: its microbatches, in order
    if pipe.microbatches is not None:
        size = (batch_size or model.batch_size) // microbatches
        rows = slice(pipe.microbatch_offset * size, (pipe.microbatch_offset + share) * size)
    if first:
        tensors = load_file(str(io_dir / "inputs.safetensors"))
        args = tuple(tensors[i["name"]][rows].to(device) for i in entry["inputs"])
    kwargs = {}
    if training and last:
        kwargs["target"] = load_file(str(io_dir / "target.safetensors"))["target"][rows].to(device)
    losses: list[list[torch.Tensor]] = []
    step_seconds = []
    forwards_per_step, forward_cpu_per_step = [], []
    recorder = recording(schedule_stages(schedule)) if timeline else contextlib.nullcontext()  # NOTE [action timeline]
    with recorder as actions:  # the pipelining patches undone however the loop ends
        for step in range(steps):
            seen = len(boundary.forward_seconds)
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            dist.barrier()
            start = time.perf_counter()
            if actions is not None:
                actions.step = step
                actions.add(kind="step", t_ns=time.monotonic_ns())
            if training and last:
                losses.append([])
                kwargs["losses"] = losses[-1]
            with torch.no_grad() if not training else contextlib.nullcontext():
                result = schedule.step(*args, **kwargs)
            if training:
                sync_gradients(module, shared, microbatches, share)  # NOTE [pipelines gradients]
                tp.break_for_test(module, manifest, entry, weight_names)  # NOTE [test-only crash hook]
            step_seconds.append(time.perf_counter() - start)
            if actions is not None:
                actions.add(kind="step_end", t_ns=time.monotonic_ns())
            forwards_per_step.append(boundary.forward_seconds[seen:])
            forward_cpu_per_step.append(boundary.forward_cpu_seconds[seen:])
            if step == 0 and last and tp.tp_rank(entry) == 0:  # a TP stage's ranks have equal outputs
                outputs = result if isinstance(result, tuple) else (result,)
                names = [o["name"] for o in output_entry["outputs"]]
                save_file({n: t.detach().cpu().contiguous() for n, t in zip(names, outputs)},
                          str(io_dir / outputs_file(pipe.index if pipe.microbatches is not None else None)))
            if step == 0 and training:
                grads = {weight_names[attr]: p.grad.detach().cpu().contiguous()
                         for attr, p in module.named_parameters() if p.grad is not None}
                grads = tp.gather_shards(grads, manifest, entry, groups, device)  # whole, for --verify
                save_file(grads, str(io_dir / f"grads{rank}.safetensors"))
            if optimizer is not None:
                optimizer.step()
            checkpoint.after_step(step, entry, module, optimizer, weight_names, params, shards)  # --checkpoint-every
            print(f"rank {rank}: step {step} {step_seconds[-1] * 1e3:.2f} ms", flush=True)
    if losses:
        save_file({"losses": torch.stack([torch.stack(step).detach().float().cpu() for step in losses])},
                  str(io_dir / f"losses{rank}.safetensors"))  # [steps, this pipeline's microbatches]
    if dump_weights and training:
        _dump_weights(module, weight_names, manifest, entry, groups, device, io_dir / f"weights{rank}.safetensors")
    if rank == world - 1:
        (io_dir / "step_seconds").write_text("\n".join(f"{s}" for s in step_seconds) + "\n")
    (io_dir / f"timing{rank}.json").write_text(json.dumps({"step_s": step_seconds, "forward_s": forwards_per_step,
                                                                 "forward_cpu_s": forward_cpu_per_step,
                                                                 "timeline": actions.events if actions else None}))
    dist.barrier()


def outputs_file(pipeline: int | None) -> str:
    """The file a pipeline's last rank writes its first step's outputs to: the one pipeline's, or pipeline p's."""
    return "outputs.safetensors" if pipeline is None else f"outputs.pipeline{pipeline}.safetensors"


LAUNCHER_PID_ENV = "HETPART_LAUNCHER_PID"  # set by `hetpart run` for its ranks: NOTE [orphaned ranks]


def _launcher(text: str) -> tuple[int, str] | None:
    """The launcher's pid and start time from LAUNCHER_PID_ENV; None where unset (launch.sh, a test)."""
    if not text.isdigit():
        return None
    start = process_start(int(text))
    return (int(text), start) if start is not None else (int(text), "gone")


def _exit_with_parent(io_dir: Path, poll_s: float = 1.0) -> None:
    """Exit once this rank's torchrun or its --io directory is gone.

    NOTE [orphaned ranks]: a rank whose torchrun died (SIGKILLed, or its machine's launcher
    stopped) would wait for its peers until the process-group timeout; it exits instead.
    A torchrun killed while it starts its ranks may die before a rank reads its parent's pid;
    so a rank also exits once its --io directory is gone, which `hetpart run` removes as it
    ends, however it ends (a launch.sh run's IO_DIR stays: there the parent alone counts; a
    node that has no IO_DIR when the rank starts watches its parent only).
    A `hetpart run` that is SIGKILLed removes nothing and stops no torchrun (each leads a
    session of its own, `_run_torchruns`), so it passes its pid in LAUNCHER_PID_ENV and a rank
    also exits once that process is gone (the same pid with the same start time: a pid reused
    meanwhile is another process). torchrun then sees its ranks fail and exits too."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # not started by torchrun (a test calling main)
        return
    parent = os.getppid()
    watch_io = io_dir.is_dir()
    launcher = _launcher(os.environ.get(LAUNCHER_PID_ENV, ""))

    def watch() -> None:
        while (os.getppid() == parent and (io_dir.is_dir() or not watch_io)
               and (launcher is None or process_start(launcher[0]) == launcher[1])):
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="hetpart-parent-watch", daemon=True).start()


# NOTE [the cause fails first]: when a rank dies (killed, or out at once with a HetpartError), its
# peers fail too, in the collective or receive that waited for it ("connection reset by peer"). torchrun
# names the failure it observes first: exec'd ranks' failures are ordered by a clock of seconds, and a
# forked rank's agent (NOTE [forked ranks] in agent.py) reports only the first process it finds dead,
# which, where two died between its polls (0.1 s apart), is the lower rank. A rank that raises anything
# but a HetpartError therefore waits CAUSE_FIRST_S before it exits: the rank that caused it has been
# observed by then, and `hetpart run` names it (and its device, for the re-plan commands). A rank whose
# own error is the cause is named too: its peers wait as long after it.
CAUSE_FIRST_S = 1.0
RANK_NAME = "hetpart-rank"  # a rank's process name (/proc/PID/comm, what ps and top show): RANK_NAME + its rank


def rank_said(err: Exception) -> str:
    """A rank's error, named by its rank once: the artifacts' checks already say "rank K: " (the log read
    "hetpart: rank 2: rank 2: 'g4/rank2/weights.safetensors' does not match its sha256", ux21)."""
    who = f"rank {os.environ.get('RANK')}: "
    return str(err) if str(err).startswith(who) else who + str(err)


def _name_process(rank: str | None) -> None:
    """Name this process hetpart-rankN where ps and top show it.

    A forked rank's command line is its forkserver's (NOTE [forked ranks] in agent.py), which names neither the
    rank nor the artifacts: the name tells the ranks apart from torchrun and its server. Linux only (prctl
    PR_SET_NAME, 15 bytes); elsewhere the process keeps its name."""
    if rank is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, (RANK_NAME + rank).encode()[:15], 0, 0, 0)


def main(argv: list[str] | None = None) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun, not a test calling main
        _name_process(os.environ.get("RANK"))
    parser = argparse.ArgumentParser(prog="hetpart.runtime.worker")
    parser.add_argument("out", type=Path)
    parser.add_argument("--io", type=Path, required=True)
    parser.add_argument("--mode", choices=["inference", "training"], default="inference")
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default=None,
                        help="default: the plan's in training (runtime/schedules.py default_schedule)")
    parser.add_argument("--microbatches", type=int, required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=DEFAULT)
    parser.add_argument("--lr", type=float, default=DEFAULT_LR)
    parser.add_argument("--batch-size", type=int, default=None, help="the inputs' batch (default: the plan's)")
    parser.add_argument("--seq-len", type=int, default=None, help="the inputs' sequence length (default: the plan's)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds any send, receive or collective may wait for a peer before this rank fails")
    parser.add_argument("--device", choices=["auto", "cpu"], default="auto",
                        help="auto: the manifest's device and backend where CUDA is available, else CPU and gloo")
    parser.add_argument("--key", type=Path, default=None,
                        help="run only if manifest.json.hmac is the manifest's signature under this key file")
    parser.add_argument("--dump-weights", action="store_true",
                        help="training: write every rank's weights after the last step (for --verify)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint and resume settings (JSON, from the launcher)")
    parser.add_argument("--timeline", action="store_true", help="record every schedule action (NOTE [action timeline])")
    args = parser.parse_args(argv)
    try:
        key = read_key(args.key, args.out) if args.key is not None else None
        manifest = load_manifest(args.out, key)
    except HetpartError as err:
        print(f"hetpart: {rank_said(err)}", file=sys.stderr, flush=True)
        return 2
    use_cuda = args.device == "auto" and manifest["backend"] == "nccl" and torch.cuda.is_available()
    padding = SleepPadding.for_rank(args.io, int(os.environ.get("RANK", "0")))  # NOTE [emulation by sleep]
    if padding is not None:
        padding.pin()  # before gloo starts its threads: they inherit the core
    _exit_with_parent(args.io)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
    try:
        device = torch.device(manifest["ranks"][dist.get_rank()]["device"] if use_cuda else "cpu")
        run_rank(args.out, args.io, args.mode, args.schedule, args.microbatches, args.steps,
                 OptimizerSpec(args.optimizer, args.lr), device,
                 args.batch_size, args.seq_len, key, args.dump_weights,
                 CheckpointRun.from_json(args.checkpoint) if args.checkpoint else None, args.timeline, padding)
    except HetpartError as err:
        print(f"hetpart: {rank_said(err)}", file=sys.stderr, flush=True)
        if "TORCHELASTIC_RUN_ID" in os.environ:
            # Out at once, before destroy_process_group closes the sockets: a peer waiting in a
            # collective then fails (status 1) no earlier than this rank, and torchrun, which
            # orders failures by a clock of seconds, lists this one too (`_failure` in launch.py).
            os._exit(HetpartError.exit_code)
        return 2
    except Exception:
        if "TORCHELASTIC_RUN_ID" in os.environ:  # NOTE [the cause fails first]
            time.sleep(CAUSE_FIRST_S)
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
