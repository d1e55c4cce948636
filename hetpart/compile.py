"""The whole pipeline in one function: trace -> passes -> partition -> codegen.

    model --export--> FX graph --passes--> annotated graph --lower--> Problem
          --solve--> Plan --verify--> --split--> stage GraphModules --write--> out/
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple
from pathlib import Path

import torch.fx as fx

from hetpart import __version__
from hetpart.codegen import (
    PlannedDevice, launch_script, manifest, split_stages, staging_dir, write_json, write_rank,
)
from hetpart.codegen import write_manifest
from hetpart.codegen.analysis import write_analysis
from hetpart.codegen.pt2 import write_pt2_files
from hetpart.codegen.split import stage_of_nodes
from hetpart.codegen.split import shared_weights_file, store_weights_once
from hetpart.codegen.virtual import virtual_manifest, virtual_report, virtual_summary
from hetpart.devices import Cluster, load_cluster
from hetpart.errors import HetpartError
from hetpart.export.layers import align_to_layers, round_to_layers
from hetpart.export.modules import annotate_modules
from hetpart.frontend import (
    ModelSpec, check_example_batch, checkpoint_names, export_model, load_for_tracing, sequence_axes,
)
from hetpart.frontend import model_file_sha256
from hetpart.frontend.fits import check_fits_cluster
from hetpart.ir import info
from hetpart.partitioner import Plan, Problem, solve, verify_plan
from hetpart.partitioner.problem import TIME_NS
from hetpart.partitioner.pipelines import PipelinesPlan, one_f_one_b_stage_cap
from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES
from hetpart.partitioner.virtual import check_virtual_options, plan_virtual
from hetpart.pipeline_groups import check_groups, check_pipeline_options
from hetpart.partitioner.baselines import baselines_json, check_strategy, compute_baselines, strategy_plan
from hetpart.plan_report import ClusterDevice, ClusterRecord, ModelRecord, PlanReport, StageReport
from hetpart.baselines.fx_partitioner import fx_baselines
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from hetpart.passes.lower import TrainingSpec, group_of
from hetpart.passes.manager import check_dump_dir
from hetpart.passes.tensor_parallel import TensorParallelPass
from hetpart.tensor_parallel import (check_tp_options, choose_tp, tp_degrees, tp_lowering, tp_per_machine,
                                     tp_pipeline_slots)
from hetpart.tp_machines import degree_of_place
from hetpart.report.blocks import coarsen_to_blocks
from hetpart.report.html import write_report
from hetpart.report.progress import Progress
from hetpart.schedule_auto import check_auto, choose_for_model, chooses_schedule
from hetpart.timings import StepTimes
from hetpart.trust import read_key


@dataclass
class CompileOptions:
    microbatches: int | str = 4  # or "auto": chosen, up to `max_microbatches` (NOTE [schedule choice])
    time_limit_s: float = 30.0
    gap: float = 0.0  # stop once the plan is certified within this relative gap (NOTE [gap stop] in cpsat.py)
    seed: int = 0
    force: bool = False
    print_ir_after: frozenset[str] = frozenset()
    verbose: bool = False  # echo each pass's and the solver's time
    dump_ir: Path | None = None  # also write the IR dumps here (besides OUT/ir/), as each pass ends
    pt2: bool = True  # also write rank<k>/stage.pt2 (torch.export.save, dynamic batch)
    mode: str = "inference"  # or "training": forward + backward costs, gradients, optimizer state, stash
    schedule: str = "gpipe"  # training: "gpipe" or "1f1b" (decides the activation stash); or an interleaved one:
    virtual_stages: int | None = None  # its stages per device (default 2; NOTE [virtual stages plan])
    optimizer_bytes_per_param: int = 8  # training: optimizer state per parameter (Adam in fp32: 8)
    profiles: tuple[Path, ...] = ()  # `hetpart profile` tables: measured op times per device type
    meta: bool | None = None  # trace without weights (True), with them (False), or decide by size (None)
    sign_key: Path | None = None  # a key file: sign manifest.json into manifest.json.hmac (hetpart/trust.py)
    check_certificate: bool | None = None  # re-prove the bound (NOTE [checked certificates]); None: the env var
    strategy: str = "optimal"  # or a baseline's name: write its plan instead (NOTE [--strategy] in baselines.py)
    align: str = "ops"  # or "layers": cut only between top-level blocks (hetpart/export/layers.py)
    # Data-parallel pipelines (issue 19, hetpart/compile_pipelines.py): each one's devices (`--pipelines`), its
    # microbatches (default: the split that finishes first, NOTE [batch split]), or "data": search them
    # (`--parallel data`).
    pipelines: tuple[tuple[str, ...], ...] | None = None
    pipeline_microbatches: tuple[int, ...] | None = None
    parallel: str = "pipeline"
    replan: Any = None  # `hetpart replan`: a ReplanChoice whose plan replaces the solve (hetpart/replan.py)
    tensor_parallel: int = 1  # every stage on a TP group of this many devices (NOTE [tensor-parallel stages])
    # `--tensor-parallel KEY=T,...` (hetpart/tp_machines.py): a machine's or device type's degree, the rest TP 1
    # (NOTE [mixed-degree pipeline]); `tensor_parallel` is then the largest of them
    tensor_parallel_machines: tuple[tuple[str, int], ...] = ()
    # `hetpart replan` of a mixed-degree plan: every place's (`machine:type`) degree, as the re-plan chose them, the
    # groups those of the cluster's device order (NOTE [re-plan of mixed degrees] in hetpart/replan_mixed.py)
    tensor_parallel_places: tuple[tuple[str, int], ...] = ()
    max_tensor_parallel: int = 1  # > 1: the solve chooses the degree, up to this (NOTE [tensor-parallel degree choice])
    tensor_parallel_per_machine: bool = False  # and degrees mixed per machine (NOTE [mixed tensor-parallel degrees])
    # `--schedule auto` / `--microbatches auto` (hetpart/schedule_auto.py): the cap on M, and once chosen, the
    # candidates for plan.json's `schedule_choice`.
    max_microbatches: int | None = None
    schedule_choice: dict | None = None

    def check(self, batch_size: int | None = None, out: Path | None = None) -> None:
        """Every option's value, and with the model's `batch_size` and the `out` directory how they fit: the one
        place options are checked, before anything is traced (`compile_model` calls it; so may a front end)."""
        if chooses_schedule(self):  # NOTE [schedule choice]: checked as a candidate's options
            return check_auto(self, batch_size, out)
        check_tp_options(self.tensor_parallel, self.strategy, self.max_tensor_parallel, self.tensor_parallel_machines,
                         fixed_pipelines=self.pipelines is not None)
        if self.tensor_parallel_per_machine and self.max_tensor_parallel <= 1:
            raise HetpartError("--tensor-parallel-per-machine searches the degrees --max-tensor-parallel N allows: "
                               "pass --max-tensor-parallel 2 (or more) with it")
        if self.microbatches < 1 or (batch_size is not None and batch_size % self.microbatches):
            divide = f" and divide --batch-size {batch_size}" if batch_size is not None else ""
            raise HetpartError(f"--microbatches {self.microbatches} must be >= 1{divide}")
        if self.time_limit_s <= 0:
            raise HetpartError(f"--time-limit must be positive (got {self.time_limit_s})")
        if not 0.0 <= self.gap < 1.0:
            raise HetpartError(f"--gap must be a fraction in [0, 1), e.g. --gap 0.01 for 1% (got {self.gap})")
        if self.mode not in ("inference", "training"):
            raise HetpartError(f"--mode {self.mode}: expected inference or training")
        check_virtual_options(self.schedule, self.virtual_stages, self.microbatches,
                              self.pipelines is not None or self.parallel == "data", self.strategy)
        if self.schedule in VIRTUAL_SCHEDULES and (self.tensor_parallel > 1 or self.max_tensor_parallel > 1):
            raise HetpartError(f"--schedule {self.schedule} with tensor-parallel stages is not planned yet: drop "
                               "--tensor-parallel/--max-tensor-parallel, or use --schedule gpipe or 1f1b")
        if self.optimizer_bytes_per_param < 0:
            raise HetpartError(f"--optimizer-bytes-per-param must be >= 0 (got {self.optimizer_bytes_per_param})")
        if self.pipelines is not None and self.strategy != "optimal":
            raise HetpartError(f"--strategy {self.strategy} writes a baseline's plan and --pipelines gives the "
                               "pipelines: pass one of the two")
        check_strategy(self.strategy, data_parallel=self.parallel == "data")
        if self.align not in ("ops", "layers"):
            raise HetpartError(f"--align {self.align}: expected ops or layers")
        check_pipeline_options(self.pipelines, self.pipeline_microbatches, self.microbatches, self.parallel)
        if (self.dump_ir is not None and out is not None
                and out.resolve() in (self.dump_ir.resolve(), *self.dump_ir.resolve().parents)):
            raise HetpartError(f"--dump-ir {self.dump_ir} is inside --out {out}, which this run creates or replaces; "
                               "pass a --dump-ir DIR outside it (OUT/ir/ gets the dumps anyway)")
        if self.dump_ir is not None and out is not None and self.dump_ir.resolve() in out.resolve().parents:
            # (refused only once traced, before: the staging directory and lock beside --out are no dumps)
            raise HetpartError(f"--out {out} is inside --dump-ir {self.dump_ir}, which holds hetpart's IR dumps "
                               "only (NOTE [--dump-ir DIR is hetpart's]); pass an --out outside it")

    def training(self) -> TrainingSpec | None:
        """The training spec of `--mode training`; None for inference."""
        if self.mode == "inference":
            return None
        return TrainingSpec(self.schedule, self.microbatches, self.optimizer_bytes_per_param)


@dataclass
class CompileResult:
    out: Path
    plan: Plan
    problem: Problem
    plan_json: dict  # report.to_json(): plan.json's contents
    report: PlanReport
    pipelines: PipelinesPlan | None = None  # several data-parallel pipelines (`plan`: pipeline 0's)


def _labelled(record: object, plan: Plan | None = None) -> dict | None:
    """`bounds` or `certificate` as plan.json writes it: with the problem it is of, for a plan chosen over several
    (NOTE [bound over a union])."""
    if record is None:
        return None
    return record.to_json() | ({"problem": plan.bound_problem} if plan is not None and plan.bound_problem else {})


def plan_report(spec: ModelSpec, cluster: Cluster, opts: CompileOptions, plan: Plan, microbatch_size: int, *,
                stage_flops: list[int], stage_param_bytes: list[int], forward_ns: list[int] | None,
                model_sha256: str | None, on_meta: bool, gm_meta: dict, baselines: list[dict],
                emulation: dict | None = None, layers: dict | None = None) -> PlanReport:
    """plan.json's contents, built once (NOTE [plan.json fields]): deterministic (no timings: timings.json).

    `forward_ns` (training plans): each stage's forward share of `compute_us`, which is forward + backward
    (NOTE [training costs] in passes/lower.py); the simulator and the report play them separately.
    """
    machine = {d.name: d.machine for d in cluster.devices}
    machine.update({s.device: machine[s.devices[0]] for s in plan.stages if s.device not in machine})  # a TP group
    us = lambda ns: round(ns / 1000, 3)  # noqa: E731
    stages = []
    for s in plan.stages:
        fwd = forward_ns[s.index] if forward_ns is not None else None
        stages.append(StageReport(
            index=s.index, device=s.device, device_type=s.device_type, machine=machine[s.device],
            slot=s.slot, devices=list(s.devices),  # the stage's slot and its devices (NOTE [slots] in problem.py)
            node_count=len(s.nodes), flops=stage_flops[s.index], param_bytes=stage_param_bytes[s.index],
            predicted_time_us=us(s.time_ns), compute_us=us(s.compute_ns), comm_in_us=us(s.comm_in_ns),
            comm_out_us=us(s.comm_out_ns), memory_bytes=s.memory_bytes, capacity_bytes=s.capacity_bytes,
            forward_us=None if fwd is None else us(fwd),
            backward_us=None if fwd is None else round(us(s.compute_ns) - fwd / 1000, 3)))
    return PlanReport(
        hetpart_version=__version__,
        model=ModelRecord(**spec.to_json(), file_sha256=model_sha256),
        cluster=ClusterRecord(name=cluster.name, devices=[
            ClusterDevice(name=d.name, type=d.type.name, machine=d.machine, mem_bytes=d.mem_bytes, core=d.core)
            for d in cluster.devices], memory_reserve_bytes=cluster.memory_reserve_bytes or None),
        mode=opts.mode, schedule=opts.schedule, objective="throughput",
        microbatches=opts.microbatches, microbatch_size=microbatch_size,
        bottleneck_us=us(plan.bottleneck_ns), lower_bound_us=us(plan.lower_bound_ns), gap=round(plan.gap, 6),
        solver_status=plan.solver_status,
        certificate=_labelled(plan.certificate, plan),
        predicted_samples_per_s=(round(microbatch_size / (plan.bottleneck_ns * 1e-9), 3)
                                 if plan.bottleneck_ns else None),
        stages=stages,
        weights="manifest" if on_meta else "included",
        # which dims `hetpart run --batch-size/--seq-len` may change (NOTE [dynamic sequence length])
        dynamic=gm_meta.get("dynamic", {"batch": True, "seq_len": False, "why": None}),
        outputs=gm_meta.get("outputs"),  # a dict or list output's keys (NOTE [model outputs] in export.py)
        optimizer_bytes_per_param=opts.optimizer_bytes_per_param if opts.mode == "training" else None,
        baselines=baselines,  # what other tools would plan, in the same cost model (issue 5)
        bounds=_labelled(plan.bounds, plan),
        bound_problems=[{"problem": b.problem, "value_us": None if b.value_ns is None else us(b.value_ns),
                         "lower_bound_us": None if b.bound_ns is None else us(b.bound_ns),
                         "taken": b.problem == plan.bound_problem, "bounds": _labelled(b.bounds),
                         "certificate": _labelled(b.certificate)} for b in plan.union] or None,
        strategy=opts.strategy,
        emulation=emulation,
        align=opts.align,
        layers=layers,
        replan=opts.replan.record if opts.replan is not None else None,
        schedule_choice=opts.schedule_choice,
    )


class Analysis(NamedTuple):
    gm: fx.GraphModule  # annotated
    pm: PassManager | None  # with the passes' timings (None: traced, not annotated yet: `trace_model`)
    inputs: tuple  # the example inputs it was traced with (full batch; real tensors even when meta)
    meta: bool = False  # traced without weights: parameters are meta tensors (NOTE [meta build])
    checkpoint_names: dict[str, list[str]] = {}  # weight name -> names a checkpoint may use (shard-weights)


def analyze(spec: ModelSpec, cluster: Cluster, microbatch_size: int, *, dump_dir: Path | None = None,
            print_ir_after: frozenset[str] = frozenset(), echo: Callable[[str], None] = print,
            extra_dump_dir: Path | None = None, verbose: bool = False,
            progress: Progress | None = None, mode: str = "inference", meta: bool | None = False,
            profiles: dict | None = None, times: StepTimes | None = None,
            optimizer_bytes_per_param: int | None = None, tp_degrees: tuple[int, ...] = ()) -> Analysis:
    """Trace the model and run the analysis passes (steps 1 and 2); with `optimizer_bytes_per_param`,
    first refuse a model whose weights the cluster cannot hold (NOTE [refused before the trace])."""
    traced = trace_model(spec, cluster, progress=progress, mode=mode, meta=meta, times=times,
                         optimizer_bytes_per_param=optimizer_bytes_per_param)
    return annotate(traced, spec, cluster, microbatch_size, dump_dir=dump_dir, print_ir_after=print_ir_after,
                    echo=echo, extra_dump_dir=extra_dump_dir, verbose=verbose, progress=progress, mode=mode,
                    profiles=profiles, tp_degrees=tp_degrees)


def trace_model(spec: ModelSpec, cluster: Cluster, *, progress: Progress | None = None, mode: str = "inference",
                meta: bool | None = False, times: StepTimes | None = None,
                optimizer_bytes_per_param: int | None = None) -> Analysis:
    """Step 1 of `analyze`: the exported graph, not annotated yet (`pm` None): `annotate` runs the passes on it,
    at any microbatch size and as often as needed (NOTE [schedule choice] re-runs them per microbatch count)."""
    progress = progress or Progress()
    times = times or StepTimes()
    progress.update("building the model")
    with times.step("trace/build"):
        module, inputs, on_meta = load_for_tracing(spec, meta)
    if optimizer_bytes_per_param is not None:
        check_fits_cluster(module, cluster, spec.model, mode == "training", optimizer_bytes_per_param)
    progress.update("tracing with torch.export" + (" (weights on the meta device)" if on_meta else ""))
    with times.step("trace/export"):
        gm = export_model(module, tuple(x.to("meta") for x in inputs) if on_meta else inputs,
                          seq=sequence_axes(spec, inputs))
    check_example_batch(spec, inputs)  # NOTE [file model batch]
    return Analysis(gm, None, inputs, on_meta, checkpoint_names(module))


def annotate(traced: Analysis, spec: ModelSpec, cluster: Cluster, microbatch_size: int, *,
             dump_dir: Path | None = None, print_ir_after: frozenset[str] = frozenset(),
             echo: Callable[[str], None] = print, extra_dump_dir: Path | None = None, verbose: bool = False,
             progress: Progress | None = None, mode: str = "inference", profiles: dict | None = None,
             tp_degrees: tuple[int, ...] = ()) -> Analysis:
    """Step 2 of `analyze`: `traced` with the analysis passes run over its graph at `microbatch_size`."""
    progress = progress or Progress()
    ctx = PassContext(device_types=cluster.device_types, batch_size=spec.batch_size, microbatch_size=microbatch_size,
                      mode=mode, profiles=profiles or {})
    passes = default_passes() + ([TensorParallelPass(tp_degrees)] if tp_degrees else [])
    pm = PassManager(passes, dump_dir=dump_dir, print_after=print_ir_after, echo=echo,
                     extra_dump_dir=extra_dump_dir, verbose=verbose, on_pass_start=progress.update)
    return traced._replace(gm=pm.run(traced.gm, ctx), pm=pm)


def load_profiles(paths: tuple[Path, ...], cluster: Cluster) -> dict:
    """Device type -> Profile, from `--profile` files; a type must be in the cluster, and profiled once."""
    from hetpart.profiler.table import Profile

    profiles: dict = {}
    for path in paths:
        prof = Profile.load(path)
        if prof.device_type not in cluster.device_types:
            raise HetpartError(f"--profile {path}: it measures device type '{prof.device_type}', which cluster "
                               f"'{cluster.name}' does not have (types: {', '.join(sorted(cluster.device_types))})")
        if prof.device_type in profiles:
            raise HetpartError(f"--profile {path}: a second profile for device type '{prof.device_type}'; "
                               "pass one per device type")
        profiles[prof.device_type] = prof
    return profiles


def stage_sums(gm: fx.GraphModule, plan: Plan, groups: dict[str, str]) -> tuple[list[int], list[int]]:
    """Each stage's FLOPs and forward time on its device type, summed over the FX nodes that lowering
    summed into its problem nodes (`groups`); a stage's time is forward + backward in training."""
    flops, forward_ns = [0] * len(plan.stages), [0] * len(plan.stages)
    for node in gm.graph.nodes:
        if node.name in groups:
            k = plan.stage_of[groups[node.name]]
            flops[k] += info(node).flops or 0
            forward_ns[k] += info(node).cost_ns.get(plan.stages[k].device_type, 0)
    return flops, forward_ns


def emulation_record(problem: Problem, cluster: Cluster, profiles: dict) -> dict:
    """plan.json's `emulation`: each type's time for the whole model, for `run --emulate` (NOTE [emulated
    devices]), and the types a profile measured."""
    return {"type_model_us": {t: round(sum(problem.graph.nodes[v][TIME_NS][t] for v in problem.graph) / 1000, 3)
                              for t in sorted(cluster.device_types)},
            "profiled_types": sorted(profiles)}


def mark_stages(gm: fx.GraphModule, pm: PassManager, stage_of: dict[str, int], groups: dict[str, str]) -> None:
    """Write each FX node's stage and emit the partition dump (ir/NN-partition.txt, partition.dot): only the
    dump and the report's blocks read a node's stage."""
    where = stage_of_nodes(gm, stage_of, groups)
    for node in gm.graph.nodes:
        if node.name in where:
            info(node).stage = where[node.name]
    pm.emit(gm, len(pm.passes) + 1, "partition")


def write_rank_dirs(tmp: Path, split: list[list], plans: list[Plan], model: str, inputs: tuple, *, pt2: bool,
                    checkpoint_names: dict[str, list[str]] | None, times: StepTimes,
                    own_weights: set[str] = frozenset()) -> list[dict[str, str]]:
    """One rank directory per stage of every pipeline (`split[p]`: pipeline p's stages, planned by `plans[p]`),
    ranks numbered pipeline-major (NOTE [the mesh]); each rank's files with their sha256. A plan traced on meta
    (`checkpoint_names` given) has no weights to export with: rank<k>/weights.json lists what `hetpart
    shard-weights` fills from a checkpoint (NOTE [weight manifests])."""
    stages = [s for pipeline in split for s in pipeline]
    of_pipeline = [p for p, pipeline in enumerate(split) for _ in pipeline]
    store_weights_once(stages, list(range(len(stages))))  # NOTE [weights stored once]: across pipelines too
    for s in stages:  # a TP rank's parts of split weights are its own (NOTE [tensor-parallel stages])
        s.stored_in = {fqn: k for fqn, k in s.stored_in.items() if fqn not in own_weights}
    files: list[dict[str, str]] = []
    for rank, s in enumerate(stages):
        p = of_pipeline[rank]
        dev = plans[p].stages[s.index]
        which = f" of pipeline {p} ({len(split)} pipelines)" if len(split) > 1 else ""
        header = (f"hetpart {__version__}: stage {s.index} of {len({x.index for x in split[p]})}{which} for {model}, "
                  f"planned on {dev.device} ({dev.device_type}).\n\nInputs: {', '.join(s.inputs)}\n"
                  f"Outputs: {', '.join(s.outputs)}\n")
        files.append(write_rank(tmp / f"rank{rank}", s, header, checkpoint_names=checkpoint_names, times=times))
        files[-1].update({shared_weights_file(k): files[k]["weights.safetensors"] for k in set(s.stored_in.values())
                          if checkpoint_names is None})  # on meta: shard-weights lists them, with the files it writes
    if pt2:  # NOTE [stage programs], NOTE [parallel .pt2 writes]: per pipeline (a re-export runs its stages in order)
        first = 0
        for pipeline in split:
            jobs = [(tmp / f"rank{first + s.index}" / "stage.pt2", s) for s in pipeline]
            for s, digest in zip(pipeline, write_pt2_files(jobs, tuple(x[:2] for x in inputs), times).values()):
                files[first + s.index]["stage.pt2"] = digest
            first += len(pipeline)
    return files


def finish_artifacts(tmp: Path, man: dict, report: PlanReport, gm: fx.GraphModule, pm: PassManager, solve_s: float,
                     times: StepTimes, sign_key: bytes | None) -> None:
    """launch.sh, manifest.json (last of what `run` reads: it hashes all of it), report.html and timings.json."""
    (tmp / "launch.sh").write_text(launch_script(man))
    (tmp / "launch.sh").chmod(0o755)
    times.add("write/ir/ (dumps)", pm.dump_s)  # each pass's dumps and the partition's, as they were written
    with times.step("write/manifest.json"):
        write_manifest(tmp, man, sign_key)
    # A page to look at: graph by stage, simulated schedule, memory per device.
    with times.step("write/report.html"):
        write_report(tmp / "report.html", report, coarsen_to_blocks(gm))
    write_json(tmp / "timings.json", {
        "passes": {t.name: round(t.seconds, 4) for t in pm.timings},
        "solve_s": round(solve_s, 4),
        **times.to_json(),
    })


def warn_batch_mixing(gm: fx.GraphModule, microbatches: int, microbatch_size: int, echo: Callable[[str], None]) -> None:
    """A warning per op that mixes samples across the batch, which microbatches change (NOTE [batch mixing])."""
    found = gm.meta.get("batch_mixing", [])
    if microbatches == 1 or not found:
        return
    for m in found[:5]:
        echo(f"warning: {m.describe()}")
    more = f" (and {len(found) - 5} more op(s))" if len(found) > 5 else ""
    echo(f"warning: the model mixes samples across the batch{more}: the pipeline runs it on microbatches of "
         f"{microbatch_size}, which gives other results than the whole batch; pass --microbatches 1 if the batch "
         "must stay whole (NOTE [batch mixing] in hetpart/frontend/batch_mixing.py)")


# NOTE [1F1B stages]: torch.distributed.pipelining's Schedule1F1B needs at least as many
# microbatches as stages (its warm-up sends one microbatch per later stage before the first
# backward), and `hetpart run --schedule 1f1b` refuses fewer. A 1F1B plan with --microbatches M
# below the devices' count is therefore planned with at most M stages (Problem.max_stages):
# the best plan that runs, rather than a plan that only `run` refuses. The note says so, and
# that more microbatches allow more stages; a GPipe plan has no such limit.
def compile_model(spec: ModelSpec, cluster_spec: str | Cluster, out: Path, opts: CompileOptions,
                  echo: Callable[[str], None] = print, progress: Progress | None = None) -> CompileResult:
    """Partition `spec` onto `cluster_spec` and write the artifacts to `out`.

    `progress` shows the long steps on a terminal (`Progress.for_console`); default: quiet.
    """
    progress = progress or Progress()
    opts.check(spec.batch_size, out)  # before tracing
    if opts.dump_ir is not None:
        check_dump_dir(opts.dump_ir)  # NOTE [--dump-ir DIR is hetpart's]
    sign_key = read_key(opts.sign_key, out) if opts.sign_key is not None else None
    model_sha256 = model_file_sha256(spec)  # the file as it is traced: NOTE [model files] in runtime/artifacts.py
    cluster = load_cluster(cluster_spec) if isinstance(cluster_spec, str) else cluster_spec
    places = degree_of_place(opts.tensor_parallel_machines, cluster) if opts.tensor_parallel_machines else None
    if opts.tensor_parallel_places:  # a re-plan's degrees, every place of the cluster (uniform or all TP 1 too)
        places = dict(opts.tensor_parallel_places)
    if opts.pipelines is not None:  # before tracing: every device of --pipelines is the cluster's, once
        check_groups(opts.pipelines, [d.name for d in cluster.devices])
        if opts.tensor_parallel > 1:  # whole TP groups, the slots planned on (NOTE [tensor-parallel pipelines])
            opts = replace(opts, pipelines=tp_pipeline_slots(opts.pipelines, cluster, opts.tensor_parallel, places))
    profiles = load_profiles(opts.profiles, cluster)
    for t, prof in sorted(profiles.items()):
        if opts.mode == "training" and not prof.backward_ns:
            echo(f"note: the '{t}' profile has no backward times (`hetpart profile --backward`); "
                 "backwards on it use the roofline")
    times = StepTimes(echo=echo if opts.verbose else None)  # for timings.json and --verbose
    with staging_dir(out, opts.force) as tmp:
        # 1-2. Trace with torch.export and annotate shapes, FLOPs, memory and op cost per device type.
        with progress.step("tracing"):
            traced = trace_model(spec, cluster, progress=progress, mode=opts.mode, meta=opts.meta, times=times,
                                 optimizer_bytes_per_param=opts.optimizer_bytes_per_param)
            auto = None
            if chooses_schedule(opts):  # --schedule/--microbatches auto: NOTE [schedule choice]
                progress.update("choosing the schedule and microbatch count")
                auto = choose_for_model(lambda size: annotate(traced, spec, cluster, size, echo=echo, mode=opts.mode,
                                                              profiles=profiles).gm,
                                        spec.batch_size, cluster, opts, on_meta=traced.meta, times=times, echo=echo,
                                        profiled=bool(profiles))
                opts = auto.options
            microbatch_size, training = spec.batch_size // opts.microbatches, opts.training()
            gm, pm, inputs, on_meta, names = annotate(
                traced, spec, cluster, microbatch_size, dump_dir=tmp / "ir", print_ir_after=opts.print_ir_after,
                echo=echo, extra_dump_dir=opts.dump_ir, verbose=opts.verbose, progress=progress, mode=opts.mode,
                profiles=profiles, tp_degrees=tp_degrees(opts.tensor_parallel, opts.max_tensor_parallel, places))
        for t in pm.timings:
            times.add(f"pass/{t.name}", t.seconds, quiet=True)  # the pass manager echoes its own
        warn_batch_mixing(gm, opts.microbatches, microbatch_size, echo)
        # 3. Lower to the torch-free problem, solve with CP-SAT, check the plan independently.
        groups = group_of(gm)  # FX node -> problem node, once: lowering, the split and the plan's sums read it
        with times.step("lower"):
            problem = lower_to_problem(gm, cluster, training, groups)
        device_problem = problem  # every device type's times (a TP problem keeps only its slots' types)
        annotate_modules(gm, problem)  # which module each node is in, for --align layers and `hetpart export`
        if opts.align == "layers" and (free := align_to_layers(problem)):  # every module one co-location group
            echo(f"note: --align layers: {len(free)} module(s) run at several places with others between "
                 f"({', '.join(free[:4])}{', ...' if len(free) > 4 else ''}); their calls are placed one by one")
        tp = None
        if places is not None:  # degrees per machine: NOTE [mixed-degree pipeline], [mixed-degree gradient sync]
            tp = tp_per_machine(gm, problem, cluster, places, groups, training is not None, echo)
        elif opts.tensor_parallel > 1:  # every slot a TP group: NOTE [tensor-parallel costs], [tensor-parallel pipelines]
            tp = tp_lowering(gm, problem, cluster, opts.tensor_parallel, groups, training is not None, echo)
        if opts.pipelines is not None or opts.parallel == "data":  # several data-parallel pipelines (issue 19)
            from hetpart.compile_pipelines import compile_pipelines

            return compile_pipelines(
                spec, cluster, opts, out, tmp, gm=gm, pm=pm, problem=problem, groups=groups, inputs=inputs,
                on_meta=on_meta, checkpoint_names=names, profiles=profiles, model_sha256=model_sha256,
                sign_key=sign_key, times=times, echo=echo, progress=progress, tp=tp)
        if tp is not None:
            problem = tp.problem
        if (cap := one_f_one_b_stage_cap(problem, opts.schedule, opts.microbatches)) is not None:
            problem.max_stages = cap  # NOTE [1F1B stages]
            echo(f"note: --schedule 1f1b runs at most as many stages as microbatches: planning at most "
                 f"{opts.microbatches} stage(s) (--microbatches {opts.microbatches}) on the {len(problem.devices)} "
                 "devices; more microbatches allow more stages")
        write_analysis(tmp, problem, cluster,  # what `hetpart replan` plans from without a trace
                       tp.analysis_record(device_problem) if tp is not None else None)
        start = time.perf_counter()
        vplan, real_problem = None, problem
        with progress.step("solving"):
            if opts.replan is not None:  # NOTE [re-plan from the stored analysis] in hetpart/replan.py
                plan = opts.replan.plan_for(problem)
            elif auto is not None and auto.plan is not None:  # the chosen finalist's solve (NOTE [schedule choice])
                plan = auto.plan
            elif opts.schedule in VIRTUAL_SCHEDULES:  # v stages per device: NOTE [virtual stages plan]
                if on_meta:  # shard-weights fills one stage per rank
                    raise HetpartError(f"--schedule {opts.schedule}: virtual stages of a model traced without "
                                       "weights (--meta, or a model too big for this machine) are not written yet: "
                                       "partition it with --schedule gpipe or 1f1b")
                vplan = plan_virtual(problem, opts.virtual_stages or 2)
                problem, plan = vplan.problem, vplan.plan
            elif opts.strategy != "optimal":  # NOTE [--strategy] in partitioner/baselines.py
                plan = strategy_plan(problem, opts.strategy, lambda: fx_baselines(gm, problem))
            elif opts.max_tensor_parallel > 1:  # NOTE [tensor-parallel degree choice]
                tp, plan = choose_tp(gm, problem, cluster, opts.max_tensor_parallel, groups, training is not None, echo,
                                     lambda p, hint=None: solve(p, time_limit_s=opts.time_limit_s, seed=opts.seed,
                                                                gap=opts.gap, check_certificate=opts.check_certificate,
                                                                hint=hint), per_machine=opts.tensor_parallel_per_machine)
                if tp is not None:  # the chosen degree's problem is what `hetpart replan` re-plans from
                    problem = tp.problem
                    write_analysis(tmp, problem, cluster, tp.analysis_record(device_problem))
            else:
                plan = solve(problem, time_limit_s=opts.time_limit_s, seed=opts.seed, gap=opts.gap,
                             log_callback=progress.solver if progress.active else None,
                             check_certificate=opts.check_certificate)
        if plan.certificate is not None and plan.certificate.warning:
            echo(f"hetpart: warning: {plan.certificate.warning}")
        solve_s = time.perf_counter() - start
        times.add("solve", solve_s, quiet=True)  # echoed below with the solver's status
        if opts.verbose:
            echo(f"solve: {solve_s * 1e3:.1f} ms ({plan.solver_status})")
        with times.step("verify"):
            verify_plan(problem, plan)
        if tp is not None and not any(tp.stage_shardings(plan)):  # degrees per machine, every stage at TP 1
            echo("note: no stage of the plan runs on a tensor-parallel group: it is written without tensor parallelism")
            tp = None
        if vplan is not None:
            echo(virtual_summary(vplan))
            plan, problem = vplan.on_devices(), real_problem  # the real devices, for what is written
        if tp is not None:  # the partition dump shows each op's cost on the TP slot (NOTE [tensor-parallel costs])
            tp.show_costs(gm, cluster, groups, training is not None, [plan])
        mark_stages(gm, pm, plan.stage_of, groups)
        # 4. Cut the graph into stages and write one rank directory per stage.
        with times.step("split"):
            stages = split_stages(gm, plan.stage_of, len(plan.slot_of_stage), groups)
        ranks = tp.rank_graphs(stages, plan) if tp is not None else stages  # NOTE [tensor-parallel stages]
        files = write_rank_dirs(tmp, [ranks], [plan], spec.model, inputs, pt2=opts.pt2 and not on_meta and tp is None,
                                checkpoint_names=names if on_meta else None, times=times,
                                own_weights=tp.split_weights(plan) if tp is not None else set())
        stage_flops, forward_ns = stage_sums(gm, plan, groups)
        shown = plan  # plan.json's: a TP stage lists its group's devices (NOTE [tensor-parallel stages])
        if tp is not None:
            shown, forward_ns = tp.with_groups(plan)
        stage_params = ([sum(problem.weights[w] for w in s.weights.values()) for s in stages] if tp is None
                        else tp.param_bytes(plan, stages, device_problem.weights))  # a TP-1 stage's whole
        with times.step("baselines"):  # what other tools would plan, in the same cost model
            baselines = [] if vplan is not None else baselines_json(  # (none of one stage per device interleaves)
                problem, plan, compute_baselines(problem) + fx_baselines(gm, problem), opts.microbatches,
                opts.schedule)  # NOTE [simulated ratios]
        layers = None if vplan is not None else round_to_layers(problem, plan)  # what `hetpart export` writes
        report = plan_report(
            spec, cluster, opts, shown, microbatch_size, stage_flops=stage_flops, stage_param_bytes=stage_params,
            forward_ns=forward_ns if training is not None else None,
            model_sha256=model_sha256, on_meta=on_meta, gm_meta=gm.meta, baselines=baselines,
            emulation=emulation_record(device_problem, cluster, profiles),
            layers=layers.to_json() if layers is not None else None)
        if vplan is not None:
            report = virtual_report(report, vplan, microbatch_size)
        pj = report.to_json()
        write_json(tmp / "plan.json", pj)
        rank_devices = plan.device_of_stage if tp is None else [n for s in shown.stages for n in s.devices]
        planned = PlannedDevice.of_ranks(cluster, rank_devices)
        if tp is not None:
            man = tp.manifest(manifest(ranks, files, planned), ranks, plan)
        elif vplan is not None:
            man = virtual_manifest(stages, files, planned, len(vplan.devices))
        else:
            man = manifest(stages, files, planned)
        finish_artifacts(tmp, man, report, gm, pm, solve_s, times, sign_key)  # 5. and the page
    return CompileResult(out=out, plan=plan, problem=problem, plan_json=pj, report=report)

