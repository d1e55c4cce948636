"""The pipeline schedules `hetpart run` offers, and a rank that runs several stages (virtual stages).

GPipe and 1F1B run one stage per rank; interleaved 1F1B and interleaved zero bubble
(torch.distributed.pipelining's `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`)
run the v stages of a rank of a virtual-stage plan (NOTE [virtual-stage manifest] in
codegen/virtual.py; their order: NOTE [virtual-stage schedules] in partitioner/simulate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.pipelining import (
    PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
)

from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import load_stage
from hetpart.runtime.stages import rank_stage_entries, stage_entries, virtual_stages
from hetpart.runtime.tp import is_mixed
from hetpart.runtime.tp_pipeline import mixed_stage

SCHEDULES: dict[str, type] = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
                              "interleaved-1f1b": ScheduleInterleaved1F1B,
                              "interleaved-zb": ScheduleInterleavedZeroBubble}
# One PipelineStage per stage of the rank. The names of partitioner/simulate.py's VIRTUAL_SCHEDULES, not
# imported from there: the partitioner package imports ortools, which each rank would pay at its start
# (tests/partitioner/test_virtual_schedules.py keeps the two equal).
MULTI_STAGE = ("interleaved-1f1b", "interleaved-zb")


def check_schedule(schedule: str, manifest: dict[str, Any], microbatches: int) -> None:
    """An error unless `schedule` can run this manifest's plan with `microbatches` (before torchrun starts)."""
    v = virtual_stages(manifest)
    world = manifest["world_size"]
    if schedule not in SCHEDULES:
        raise HetpartError(f"--schedule {schedule}: expected one of {', '.join(SCHEDULES)}")
    if v > 1 and schedule not in MULTI_STAGE:
        raise HetpartError(f"--schedule {schedule} runs one stage per rank, and this plan gives each of its {world} "
                           f"ranks {v} stages (virtual stages): run with --schedule interleaved-1f1b or "
                           "interleaved-zb, or partition again without --virtual-stages")
    if schedule in MULTI_STAGE:
        if "tensor_parallel" in manifest["mesh"]:  # NOTE [tensor-parallel stages]: one stage per rank
            raise HetpartError(f"--schedule {schedule} runs several stages per rank, and this plan's stages are "
                               "tensor-parallel groups of one stage per rank: run with --schedule gpipe or 1f1b")
        if "pipelines" in manifest["mesh"]:
            raise HetpartError(f"--schedule {schedule}: a plan of several data-parallel pipelines runs gpipe or 1f1b")
        rounds = max(1, microbatches // world)
        if microbatches % rounds:
            raise HetpartError(f"--schedule {schedule} needs --microbatches that are a multiple of "
                               f"max(1, M // ranks) = {rounds} ({world} ranks), got {microbatches}: pass e.g. "
                               f"--microbatches {rounds * world}")


class OwnOutputs(torch.nn.Module):
    """Returns a copy of every output, so that no output is a tensor the stage's own graph saved or a view.

    Zero bubble's input-gradient step (torch's `stage_backward_input`) detaches the stage's outputs in place
    to free their graph; an output that the stage's autograd graph also saved (a value it passes on and
    uses itself, `gelu(linear)` sending `linear` on) is then gone when the weight-gradient step runs, and a
    view (a value passed through) cannot be detached in place at all. One copy per output and microbatch;
    the other schedules do not need it.

    In training every floating output also requires grad, even one that depends on no weight (a stage that
    holds only the model's input and passes it on): the next stage receives it as an input that requires
    grad only if the sender's did, and zero bubble's split backward finds a stage's weights from its inputs
    (torch's `stage_backward_input` groups the weights by the graph between inputs and outputs). A stage whose
    inputs require no grad got no weight gradient at all under it (its weights never trained; measured on
    zoo:mlp, torch 2.13); the other schedules' full backward does not depend on it."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: D102
        outputs = tuple(o.clone() for o in self.inner(*args))
        if torch.is_grad_enabled():
            outputs = tuple(o.requires_grad_() if o.is_floating_point() and not o.requires_grad else o
                            for o in outputs)
        return outputs


class RankStages(torch.nn.Module):
    """The stage modules of one rank, in stage order: what its optimizer steps and its gradients come from."""

    def __init__(self, modules: list[torch.nn.Module], weight_names: list[dict[str, str]]) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList(modules)
        self._names = {f"stages.{i}.{attr}": fqn for i, names in enumerate(weight_names) for attr, fqn in names.items()}

    def weight_names(self) -> dict[str, str]:
        """Parameter name (as `named_parameters` gives it) -> weight FQN, over all of the rank's stages."""
        return dict(self._names)


@dataclass
class RankRun:
    """What a rank runs: its stage's module (several stages: their `RankStages`), the wrappers, the schedule."""

    module: torch.nn.Module
    boundaries: list[torch.nn.Module]  # one `Boundary` per stage; they share the first's timing lists
    schedule: Any
    first: bool  # runs stage 0: feeds the inputs
    last: bool  # runs the last stage: computes the loss, writes the outputs
    output_entry: dict[str, Any]  # the entry of the last stage it runs (its outputs' names)


def build_rank(out: Path, manifest: dict[str, Any], entry: dict[str, Any], device: torch.device, schedule_name: str,
               microbatches: int, training: bool, group: Any, group_ranks: list[int], pipeline_stages: list[list[int]],
               wrap: Callable[[torch.nn.Module], torch.nn.Module], loss_fn: Callable | None,
               weight_names: Callable[[torch.nn.Module], dict[str, str]],
               static: Callable[[dict[str, Any], list[dict] | None], dict | None],
               groups: dict[str, Any] | None = None) -> RankRun:
    """Load this rank's stage (`entry`), wrap it (`wrap`: the worker's `Boundary`) in a PipelineStage of its
    pipeline (`group`, of `group_ranks`; `pipeline_stages`: stage -> ranks) and build the schedule; with a
    multi-stage schedule, every stage of the rank (NOTE [virtual-stage manifest]). `static(entry, sent)` gives
    a stage's inference shapes (NOTE [static stage metadata] in worker.py; `sent` None: what the next rank
    receives), `weight_names` a loaded stage's attribute -> FQN; `groups`: every process group of the mesh, by name
    (a plan of mixed TP degrees: NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py)."""
    if schedule_name not in MULTI_STAGE:
        module = load_stage(out, entry).to(device)
        print(f"rank {entry['rank']}: loaded {entry['dir']}/stage.py and {len(entry['weights'])} weight(s) on "
              f"{device}", flush=True)
        module.requires_grad_(training)
        shapes = None if training else static(entry, None)
        inner, stage_class, extra = module, PipelineStage, {}
        if is_mixed(manifest):  # NOTE [mixed-degree pipeline]
            inner, stage_class, extra = mixed_stage(manifest, entry, groups or {}, module)
        boundary = wrap(inner)
        stage = stage_class(boundary, stage_index=entry["stage"], num_stages=len(pipeline_stages), device=device,
                            group=group, **(shapes or {}), **extra)
        # Each stage's peer in the pipeline group: its rank's place there (NOTE [the mesh]).
        stage.stage_index_to_group_rank = {k: group_ranks.index(r) for k, ranks in enumerate(pipeline_stages)
                                           for r in ranks if r in group_ranks}
        schedule = SCHEDULES[schedule_name](stage, n_microbatches=microbatches, loss_fn=loss_fn,
                                            scale_grads=False)  # NOTE [pipelines gradients]
        return RankRun(module=module, boundaries=[boundary], schedule=schedule, first=entry["stage"] == 0,
                       last=entry["stage"] == len(pipeline_stages) - 1, output_entry=entry)
    every = stage_entries(manifest)
    world, num_stages = manifest["world_size"], len(every)
    mine = rank_stage_entries(entry)
    modules, boundaries, stages = [], [], []
    for e in mine:
        module = load_stage(out, e).to(device)
        module.requires_grad_(training)
        modules.append(module)
        boundary = wrap(module)
        if boundaries:  # one rank's forwards in one list, in the order they ran
            boundary.forward_seconds = boundaries[0].forward_seconds
            boundary.forward_cpu_seconds = boundaries[0].forward_cpu_seconds
        boundaries.append(boundary)
        nxt = e["stage"] + 1
        shapes = None if training else static(e, every[nxt]["inputs"] if nxt < num_stages else e["outputs"])
        runs = OwnOutputs(boundary) if schedule_name == "interleaved-zb" else boundary
        stage = PipelineStage(runs, stage_index=e["stage"], num_stages=num_stages, device=device, group=group,
                              **(shapes or {}))
        stage.stage_index_to_group_rank = {k: k % world for k in range(num_stages)}  # NOTE [the mesh]
        stages.append(stage)
    print(f"rank {entry['rank']}: loaded stages {[e['stage'] for e in mine]} ({', '.join(e['dir'] for e in mine)})",
          flush=True)
    schedule = SCHEDULES[schedule_name](stages, n_microbatches=microbatches, loss_fn=loss_fn,
                                        scale_grads=False)  # NOTE [pipelines gradients]
    return RankRun(module=RankStages(modules, [weight_names(m) for m in modules]), boundaries=boundaries,
                   schedule=schedule, first=mine[0]["stage"] == 0, last=mine[-1]["stage"] == num_stages - 1,
                   output_entry=mine[-1])


def default_schedule(planned: str, mode: str) -> str:
    """The schedule of `run` (and of a worker launch.sh starts) without `--schedule`: the one the plan was made
    for (its stash; `--schedule auto`'s choice, NOTE [schedule choice]) in training, and an interleaved plan's
    in inference too (its stages need it); GPipe otherwise."""
    return planned if planned in MULTI_STAGE or (mode == "training" and planned in SCHEDULES) else "gpipe"
