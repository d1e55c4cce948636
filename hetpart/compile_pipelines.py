"""Several data-parallel pipelines (issue 19): steps 3-5 of `compile_model` for `--pipelines` and `--parallel data`.

    Problem --fixed_pipelines | plan_pipelines--> PipelinesPlan --split each pipeline's plan-->
        rank dirs numbered pipeline-major --> plan.json (pipelines), manifest.json (mesh of several), launch.sh

`compile_model` traces, annotates and lowers as always, then calls `compile_pipelines` inside its
staging directory instead of its single-pipeline solve and writes. Each pipeline is an ordinary
`Plan` of the whole graph on its own devices (NOTE [pipelines plan] in partitioner/pipelines.py),
so each is split and written exactly as one pipeline is; only the numbering of the ranks, the
mesh (NOTE [the mesh] in codegen/artifacts.py) and plan.json's `pipelines` (NOTE [plan.json
fields]) are new.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hetpart.codegen import PlannedDevice, manifest, split_stages, write_json
from hetpart.codegen.analysis import write_analysis
from hetpart.codegen.pipelines_record import write_pipelines_record, write_shape_memo
from hetpart.errors import HetpartError
from hetpart.partitioner.infeasible import PipelinesRefused
from hetpart.partitioner.pipelines import (
    Pipeline, PipelinesPlan, fixed_pipelines, own_bound, pipeline_time_ns, pipelines_violations, sub_problem,
)
from hetpart.partitioner.shape_memo import ShapeMemo
from hetpart.partitioner.tp_pipelines import slots_note
from hetpart.pipeline_groups import split_by_time
from hetpart.plan_report import PipelineReport, PlanReport
from hetpart.tensor_parallel import lower_degrees
from hetpart.units import format_us

if TYPE_CHECKING:
    import torch.fx as fx

    from hetpart.compile import CompileOptions, CompileResult
    from hetpart.devices import Cluster
    from hetpart.frontend import ModelSpec
    from hetpart.export.layers import LayerPlan
    from hetpart.partitioner import Problem
    from hetpart.passes import PassManager
    from hetpart.report.progress import Progress
    from hetpart.tensor_parallel import TPCompile
    from hetpart.timings import StepTimes


def plan_data_parallel(problem: Problem, opts: CompileOptions,
                       memo: ShapeMemo | None = None) -> tuple[PipelinesPlan, list[dict]]:
    """The pipelines of `--pipelines` (their microbatches given, or split by their times: NOTE [batch split]), or
    of `--parallel data`'s search (its solved shapes kept in `memo`: NOTE [shape memo]); and the baselines
    beside the search's plan, as plan.json records them."""
    fields = {"seed": opts.seed, "gap": opts.gap, "check_certificate": opts.check_certificate}
    if opts.replan is not None:  # `hetpart replan`'s choice (NOTE [re-plan pipelines]) in place of the search
        return opts.replan.pipelines_for(problem), []
    if opts.parallel == "data" and opts.strategy != "optimal":  # a baseline's pipelines (NOTE [--strategy])
        from hetpart.partitioner.pipeline_baselines import strategy_pipelines
        from hetpart.partitioner.solve import SolveOptions

        pp, baselines = strategy_pipelines(problem, opts.microbatches, opts.strategy,
                                           SolveOptions(time_limit_s=opts.time_limit_s / 2, **fields),
                                           time_limit_s=opts.time_limit_s)
        return pp, _baselines_json(baselines)
    if opts.parallel == "data":  # the search, and the baselines beside it (NOTE [baselines as candidates])
        from hetpart.partitioner.pipeline_search import plan_with_baselines
        from hetpart.partitioner.solve import SolveOptions

        # --time-limit is the search's and its baselines' together: two thirds and one third (before, each
        # had its own, and a partition at --time-limit 45 solved for 63-65 s: docs/benchmarks.md "scaletp")
        search_s = opts.time_limit_s * 2 / 3
        try:
            pp, baselines = plan_with_baselines(problem, opts.microbatches,
                                                SolveOptions(time_limit_s=search_s, **fields),
                                                baseline_limit_s=opts.time_limit_s - search_s, memo=memo)
        except HetpartError as e:
            raise _tp_hint(e, opts) from None
        return pp, _baselines_json(baselines)
    groups = [list(g) for g in opts.pipelines or ()]
    shares = list(opts.pipeline_microbatches) if opts.pipeline_microbatches is not None else None
    solves = len(groups) * (1 if shares is not None else 2)  # the time limit is shared by every solve
    fields["time_limit_s"] = opts.time_limit_s / solves
    if shares is None:  # NOTE [batch split]: each group planned at an equal share, then the split by their times
        equal = [max(1, opts.microbatches // len(groups))] * len(groups)
        probe = fixed_pipelines(problem, groups, equal, **fields)
        shares = split_by_time(opts.microbatches, [functools.partial(pipeline_time_ns, p.plan)
                                                   for p in probe.pipelines])
        if shares == equal:
            return probe, []
        split = fixed_pipelines(problem, groups, shares, **fields)
        if sum(equal) == opts.microbatches and probe.iteration_ns < split.iteration_ns:
            return probe, []  # planned again at their shares, the groups came out slower (NOTE [batch split])
        return split, []
    return fixed_pipelines(problem, groups, shares, **fields), []


@dataclass
class TPPipelines:
    """`--parallel data --max-tensor-parallel N`'s pipelines so far: the plan kept, its baselines (plan.json's), its
    compile (None: degree 1), its search's solved shapes (NOTE [shape memo]: what ir/shapes.json records), and every
    uniform degree lowered, those skipped with why (NOTE [per-machine pipelines candidates] starts from them)."""

    plan: PipelinesPlan
    baselines: list[dict]
    tp: TPCompile | None
    memo: ShapeMemo
    lowered: dict[int, TPCompile]
    skipped: list[str]


def choose_pipelines_tp(gm: fx.GraphModule, problem: Problem, cluster: Cluster, opts: CompileOptions,
                        groups: dict[str, str], echo: Callable[[str], None]) -> TPPipelines:
    """`--parallel data --max-tensor-parallel N` (NOTE [tensor-parallel pipelines]): each degree up to N lowered as
    `choose_tp` lowers them, each searched as `--parallel data` searches (each with its own shape memo), the fastest
    kept by `choose_pipelines_degree` (ties to the smaller degree; its bound the least over the degrees; the degrees
    share `--time-limit`: NOTE [degrees share the time limit])."""
    from hetpart.partitioner.tp_pipelines import choose_pipelines_degree

    start = time.perf_counter()
    lowered, skipped = lower_degrees(gm, problem, cluster, opts.max_tensor_parallel, groups,
                                     opts.training() is not None)
    problems = {1: problem} | {t: tp.problem for t, tp in lowered.items()}
    baselines: dict[int, list[dict]] = {}
    memos = {t: ShapeMemo("") for t in problems}  # NOTE [shape memo]: one per degree's problem

    def plan(degree: int, p: Problem, microbatches: int, seconds: float) -> PipelinesPlan:
        # The search and its baselines fit in this degree's share (NOTE [degrees share the time limit]).
        got, baselines[degree] = plan_data_parallel(p, dataclasses.replace(opts, time_limit_s=seconds), memos[degree])
        return got

    choice = choose_pipelines_degree(problems, opts.microbatches, plan,
                                     max(0.0, opts.time_limit_s - (time.perf_counter() - start)))  # after lowering
    echo("tensor parallel, data-parallel pipelines: " + "; ".join(
        f"degree {r.degree}: " + (f"{format_us(r.plan.iteration_ns)}, {len(r.plan.pipelines)} pipeline(s)"
                                  if r.plan is not None else r.error.split(":")[0] if r.error.startswith(
                                      ("not searched", "pruned")) else "no plan") + f" (bound {format_us(r.bound_ns)})"
        for r in sorted(choice.results, key=lambda r: r.degree)) + (f"; skipped: {', '.join(skipped)}" if skipped
                                                                     else "") + f"; chose degree {choice.degree}")
    echo("the degrees' parts of the time limit (NOTE [degrees share the time limit]): "
         + ", ".join(f"degree {r.degree} {r.seconds:.1f} s of {r.share_s:.1f} s" for r in choice.results))
    return TPPipelines(choice.plan, baselines.get(choice.degree, []), lowered.get(choice.degree),
                       memos[choice.degree], lowered, skipped)


# NOTE [tensor-parallel hint]
# A `--parallel data` search at one device per stage refused for memory (every shape's stages too small for
# their weights, training state and stash) may have plans once each stage is a tensor-parallel group: a TP-T
# rank holds 1/T of each split weight and of its state (NOTE [tensor-parallel costs]). The refusal says so
# where no degree was asked for: the 405B-shaped model on hetero-256 (GPipe, 8 microbatches) is refused at
# TP 1 (only the 80-GB devices hold a layer with its stash of 8, and the shapes the search reached run 2 at
# most), while `--max-tensor-parallel 8` plans it (docs/benchmarks.md, "rows19").
# Not "no set of the devices holds the model": TP splits the memory a stage needs, it adds none to the cluster. A
# search out of time some of whose shapes tried had no plan in memory says so too (the 405B's TP 1 after rows19).
# Which refusal is memory's is decided where it is raised: the search's `PipelinesRefused` counts the shapes it
# refused for memory (partitioner/infeasible.py), and the hint reads that count, never the message's words (a
# regex over them, before, would have dropped the hint the day a message was reworded).


def _tp_hint(error: HetpartError, opts: CompileOptions) -> HetpartError:
    """NOTE [tensor-parallel hint]: `error`, with the hint where it is a memory refusal and no degree was asked."""
    if opts.tensor_parallel > 1 or opts.max_tensor_parallel > 1 or not isinstance(error, PipelinesRefused) or (
            not error.memory_refused):
        return error
    return PipelinesRefused(f"{error}; tensor parallelism splits each weight and its training state over T devices "
                            "of a machine: pass --max-tensor-parallel 8 (or --tensor-parallel T) to plan stages of TP "
                            "groups", error.memory_refused)


def _baselines_json(baselines: list) -> list[dict]:
    """plan.json's `baselines` of a data-parallel plan (NOTE [pipeline baselines])."""
    return [{"name": b.name, "iteration_us": None if b.plan is None else round(b.plan.iteration_ns / 1000, 3),
             "note": b.note} for b in baselines]


def compile_pipelines(spec: ModelSpec, cluster: Cluster, opts: CompileOptions, out: Path, tmp: Path, *,
                      gm: fx.GraphModule, pm: PassManager, problem: Problem, groups: dict[str, str], inputs: tuple,
                      on_meta: bool, checkpoint_names: dict[str, list[str]], profiles: dict, model_sha256: str | None,
                      sign_key: bytes | None, times: StepTimes, echo: Callable[[str], None],
                      progress: Progress, tp: TPCompile | None = None) -> CompileResult:
    """Plan the data-parallel pipelines and write their artifacts into `tmp` (compile_model's staging dir); with `tp`,
    pipelines of TP slots, each stage a TP group (NOTE [tensor-parallel pipelines mesh] in codegen/tp.py)."""
    from hetpart.codegen.tp import tp_pipelines_manifest
    from hetpart.compile import CompileResult, finish_artifacts, mark_stages, plan_report, write_rank_dirs

    device_problem = problem  # the devices' (the pipelines are planned on the slots' problem with `tp`)
    microbatch_size = spec.batch_size // opts.microbatches
    # 3. Plan every pipeline on its devices and check the whole independently of the solver.
    start = time.perf_counter()
    with progress.step("solving"):
        # NOTE [shape memo]: the search's solved shapes (a re-plan's: those it started from and its own).
        memo = getattr(opts.replan, "memo", None) or ShapeMemo("")
        if opts.max_tensor_parallel > 1:  # NOTE [tensor-parallel pipelines]: the degree chosen with the pipelines
            uniform_s = opts.time_limit_s * (2 / 3 if opts.tensor_parallel_per_machine else 1)
            chosen = choose_pipelines_tp(gm, problem, cluster, dataclasses.replace(opts, time_limit_s=uniform_s),
                                         groups, echo)
            if opts.tensor_parallel_per_machine:  # NOTE [per-machine pipelines candidates]
                from hetpart.pipelines_per_machine import per_machine_pipelines

                chosen = per_machine_pipelines(problem, cluster, opts, plan_data_parallel, chosen,
                                               opts.time_limit_s - uniform_s, echo)
            pp, baselines, tp = chosen.plan, chosen.baselines, chosen.tp
            memo = chosen.memo  # the kept search's solved shapes (NOTE [shape memo])
        else:
            pp, baselines = plan_data_parallel(tp.problem if tp is not None else problem, opts, memo)
    problem = tp.problem if tp is not None else device_problem  # the problem planned on
    solve_s = time.perf_counter() - start
    times.add("solve", solve_s, quiet=True)
    if opts.verbose:
        echo(f"solve: {solve_s * 1e3:.1f} ms ({pp.solver_status}, {len(pp.pipelines)} pipelines)")
    for p in pp.pipelines:
        if p.plan.certificate is not None and p.plan.certificate.warning:
            echo(f"hetpart: warning: pipeline {p.index}: {p.plan.certificate.warning}")
    violations = pipelines_violations(problem, pp, opts.microbatches)
    if violations:
        raise HetpartError(f"internal error: the pipelines plan breaks {len(violations)} rule(s): "
                           f"{'; '.join(violations[:3])}")
    write_analysis(tmp, problem, cluster)  # what `hetpart replan` plans from without a trace,
    write_pipelines_record(tmp, pp)  # and the pipelines it may keep (NOTE [re-plan pipelines])
    write_shape_memo(tmp, memo)  # and the shapes its search may start from (NOTE [shape memo])
    if tp is not None:  # the partition dump shows each op's cost on the TP slots (NOTE [tensor-parallel costs])
        tp.show_costs(gm, cluster, groups, opts.mode == "training", [p.plan for p in pp.pipelines])
    mark_stages(gm, pm, pp.pipelines[0].plan.stage_of, groups)  # the partition dump shows pipeline 0
    # 4. Split the graph by each pipeline's plan; ranks are numbered pipeline-major (NOTE [the mesh]).
    with times.step("split"):
        split = [split_stages(gm, p.plan.stage_of, len(p.plan.device_of_stage), groups) for p in pp.pipelines]
    ranks = [tp.rank_graphs(s, p.plan) for s, p in zip(split, pp.pipelines)] if tp is not None else split
    stages = [s for pipeline in ranks for s in pipeline]
    files = write_rank_dirs(tmp, ranks, [p.plan for p in pp.pipelines], spec.model, inputs,
                            pt2=opts.pt2 and not on_meta and tp is None,
                            checkpoint_names=checkpoint_names if on_meta else None, times=times,
                            own_weights={w for p in pp.pipelines for w in tp.split_weights(p.plan)} if tp else set())
    report = _report(spec, cluster, opts, pp, device_problem, problem, gm, groups, split, microbatch_size,
                     on_meta=on_meta, model_sha256=model_sha256, profiles=profiles, plan_report=plan_report, tp=tp)
    report = dataclasses.replace(report, baselines=baselines)  # beside the search's plan (NOTE [pipeline baselines])
    pj = report.to_json()
    write_json(tmp / "plan.json", pj)
    rank_devices = [name for q in report.pipelines or [report] for st in q.stages for name in st.devices or [st.device]]
    planned = PlannedDevice.of_ranks(cluster, rank_devices)
    several = len(pp.pipelines) > 1
    if tp is not None and several:  # NOTE [tensor-parallel pipelines mesh]
        man = tp_pipelines_manifest(manifest(stages, files, planned), stages,
                                    [tp.stage_shardings(p.plan) for p in pp.pipelines],
                                    [p.microbatches for p in pp.pipelines], microbatch_size)
    elif tp is not None:  # one pipeline of TP stages, as without --pipelines
        man = tp.manifest(manifest(stages, files, planned), stages, pp.pipelines[0].plan)
    else:
        man = manifest(stages, files, planned, [p.microbatches for p in pp.pipelines] if several else None,
                       microbatch_size)
    finish_artifacts(tmp, man, report, gm, pm, solve_s, times, sign_key)  # 5. and the page (pipeline 0's graph)
    return CompileResult(out=out, plan=pp.pipelines[0].plan, problem=problem, plan_json=pj, report=report,
                         pipelines=pp)


# NOTE [layers per pipeline]
# plan.json records each pipeline's plan rounded to whole layers (`pipelines[p].layers`), so that `hetpart export`
# can tell identical replicas from pipelines cut elsewhere (NOTE [identical replicas] in export/replicas.py). The
# rounding costs its plan with `evaluate` on the pipeline's own devices and share (0.78 s under cProfile for
# one pipeline of llama-70b on hetero-64 at load 7-11, docs/benchmarks.md "export3d"); a plan of many stripes repeats
# one plan on machines alike: a pipeline whose nodes sit on the same stages, whose share is the same and whose stages'
# slots have the same types, capacities and links between them as an earlier one's rounds the same way (what
# `evaluate` and `round_to_layers` read), so it takes that rounding with its own devices' names.


def _layers_records(problem: Problem, pipelines: list[Pipeline]) -> list[dict | None]:
    """Each pipeline's plan rounded to whole layers and costed on its own devices and share, as plan.json records
    it for `hetpart export` (NOTE [layers per pipeline])."""
    from hetpart.export.layers import round_to_layers
    from hetpart.partitioner.costs import link_between, slot_capacity_bytes

    done: dict[tuple, tuple[list[str], LayerPlan | None]] = {}
    records = []
    for p in pipelines:
        sub = sub_problem(problem, p.devices, p.microbatches)
        slots = p.plan.device_of_stage
        key = (tuple(sorted(p.plan.stage_of.items())), p.microbatches,
               tuple((sub.slot(s).type, slot_capacity_bytes(sub, sub.slot(s))) for s in slots),
               tuple(link_between(sub, a, b) for a, b in zip(slots, slots[1:])))
        if key not in done:
            done[key] = (slots, round_to_layers(sub, p.plan))
        first_slots, layers = done[key]
        if layers is not None and first_slots != slots:
            layers = dataclasses.replace(layers, devices=[slots[first_slots.index(d)] for d in layers.devices])
        records.append(None if layers is None else layers.to_json())
    return records


def _report(spec: ModelSpec, cluster: Cluster, opts: CompileOptions, pp: PipelinesPlan, problem: Problem,
            planned: Problem, gm: fx.GraphModule, groups: dict[str, str], split: list, microbatch_size: int, *,
            on_meta: bool, model_sha256: str | None, profiles: dict, plan_report: Callable,
            tp: TPCompile | None) -> PlanReport:
    """plan.json of the pipelines (NOTE [plan.json fields]): each pipeline's stages as `plan_report` writes one
    plan's, and the step's numbers; a single pipeline reads as any one-pipeline plan. `problem`: the devices'
    (with `tp` the pipelines are planned on its slots, a stage listing its group's devices); `planned`: the problem
    the pipelines were planned on (the slots' with `tp`), which each pipeline's rounding to whole layers reads."""
    from hetpart.compile import emulation_record, stage_sums

    us = lambda ns: round(ns / 1000, 3)  # noqa: E731
    emulation = emulation_record(problem, cluster, profiles)
    reports = []
    layers = _layers_records(planned, pp.pipelines)
    for p, stages, rounded in zip(pp.pipelines, split, layers):
        flops, forward_ns = stage_sums(gm, p.plan, groups)
        shown, params = p.plan, [sum(problem.weights[w] for w in s.weights.values()) for s in stages]
        if tp is not None:  # per rank: a split weight's part (NOTE [tensor-parallel stages])
            (shown, forward_ns), params = tp.with_groups(p.plan), tp.param_bytes(p.plan, stages, problem.weights)
        reports.append(plan_report(spec, cluster, opts, shown, microbatch_size, stage_flops=flops,
                                   stage_param_bytes=params, forward_ns=forward_ns if opts.mode == "training" else None,
                                   model_sha256=model_sha256, on_meta=on_meta, gm_meta=gm.meta, baselines=[],
                                   emulation=emulation, layers=rounded))
    if len(pp.pipelines) == 1 and opts.parallel != "data":  # the search's answer keeps its step, bound and gap
        return reports[0]
    slot_devices = {g.name: list(g.devices) for g in tp.groups} if tp is not None else {}
    pipelines = [PipelineReport(index=p.index, microbatches=p.microbatches,
                                devices=[d for s in p.devices for d in slot_devices.get(s, [s])],
                                time_us=us(p.time_ns), bottleneck_us=us(p.plan.bottleneck_ns),
                                lower_bound_us=None if bound is None else us(bound), solver_status=status,
                                stages=[dataclasses.replace(s, pipeline=p.index) for s in r.stages], layers=r.layers)
                 for p, r, (bound, status) in zip(pp.pipelines, reports, map(own_bound, pp.pipelines))]
    used = [d for q in pipelines for s in q.stages for d in s.devices or [s.device]]
    degree = max(tp.shardings) if tp is not None else 1  # a slot's reason counts its groups (NOTE [tensor-parallel
    # pipelines]); degrees per machine: its slots, of several degrees (its "devices" read as slots)
    mixed = tp is not None and tp.places is not None
    idle = {d: why.replace(" devices", " slots") if mixed else slots_note(why, degree)
            for s, why in pp.devices_idle.items() for d in slot_devices.get(s, [s])}
    if tp is not None:
        idle |= {d.name: "in no slot of its machine's tensor-parallel degree" if mixed else
                 f"in no tensor-parallel group of {degree}" for d in cluster.devices
                 if d.name not in used and d.name not in idle}
    return dataclasses.replace(
        reports[0], stages=[s for q in pipelines for s in q.stages], pipelines=pipelines, layers=None,  # each its own
        bottleneck_us=max(q.bottleneck_us for q in pipelines), lower_bound_us=us(pp.lower_bound_ns),
        gap=round(pp.gap, 6), solver_status=pp.solver_status, certificate=None, bounds=None,
        predicted_samples_per_s=round(spec.batch_size / (pp.iteration_ns * 1e-9), 3) if pp.iteration_ns else None,
        iteration_us=us(pp.iteration_ns), grad_sync_us=us(pp.grad_sync_ns),
        grad_sync_overlapped_us=us(pp.grad_sync_overlapped_ns), devices_used=used,
        devices_idle=dict(sorted(idle.items())), bound_note=pp.bound_note or None,
        bound_unfinished=list(pp.bound_unfinished) or None,
        search_stats={k: round(v, 6) for k, v in sorted(pp.stats.items())} if pp.stats else None)
