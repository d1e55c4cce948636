"""The whole pipeline in one function: trace -> passes -> partition -> codegen.

    model --export--> FX graph --passes--> annotated graph --lower--> Problem
          --solve--> Plan --verify--> --split--> stage GraphModules --write--> out/
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from pathlib import Path

import torch.fx as fx

from hetpart import __version__
from hetpart.codegen import (
    PlannedDevice, launch_script, manifest, split_stages, stage_examples, staging_dir, write_json, write_rank,
)
from hetpart.codegen.split import stage_of_nodes
from hetpart.devices import Cluster, load_cluster
from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, export_model, load_model
from hetpart.ir import info
from hetpart.partitioner import Plan, Problem, solve, verify_plan
from hetpart.partitioner.baselines import compute_baselines
from hetpart.passes.fx_baselines import fx_baselines
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from hetpart.report.blocks import coarsen_to_blocks
from hetpart.report.html import write_report
from hetpart.report.progress import Progress


@dataclass
class CompileOptions:
    microbatches: int = 4
    time_limit_s: float = 30.0
    seed: int = 0
    force: bool = False
    print_ir_after: frozenset[str] = frozenset()
    verbose: bool = False  # echo each pass's and the solver's time
    dump_ir: Path | None = None  # also write the IR dumps here (besides OUT/ir/), as each pass ends
    pt2: bool = True  # also write rank<k>/stage.pt2 (torch.export.save, dynamic batch)


@dataclass
class CompileResult:
    out: Path
    plan: Plan
    problem: Problem
    plan_json: dict


def plan_json(spec: ModelSpec, cluster: Cluster, opts: CompileOptions, plan: Plan, microbatch_size: int,
              stage_flops: list[int], stage_param_bytes: list[int]) -> dict:
    """plan.json: deterministic (no timings; those go to timings.json)."""
    devices = {d.name: d for d in cluster.devices}
    us = lambda ns: round(ns / 1000, 3)  # noqa: E731
    return {
        "format_version": 1,
        "hetpart_version": __version__,
        "model": spec.to_json(),
        "cluster": {
            "name": cluster.name,
            "devices": [{"name": d.name, "type": d.type.name, "machine": d.machine, "mem_bytes": d.mem_bytes}
                        for d in cluster.devices],
        },
        "mode": "inference",
        "objective": "throughput",
        "microbatches": opts.microbatches,
        "microbatch_size": microbatch_size,
        "bottleneck_us": us(plan.bottleneck_ns),
        "lower_bound_us": us(plan.lower_bound_ns),
        "gap": round(plan.gap, 6),
        "solver_status": plan.solver_status,
        "predicted_samples_per_s": round(microbatch_size / (plan.bottleneck_ns * 1e-9), 3) if plan.bottleneck_ns else None,
        "stages": [
            {
                "index": s.index,
                "device": s.device,
                "device_type": s.device_type,
                "machine": devices[s.device].machine,
                "node_count": len(s.nodes),
                "flops": stage_flops[s.index],
                "param_bytes": stage_param_bytes[s.index],
                "predicted_time_us": us(s.time_ns),
                "compute_us": us(s.compute_ns),
                "comm_in_us": us(s.comm_in_ns),
                "comm_out_us": us(s.comm_out_ns),
                "memory_bytes": s.memory_bytes,
                "capacity_bytes": s.capacity_bytes,
            }
            for s in plan.stages
        ],
    }


class Analysis(NamedTuple):
    gm: fx.GraphModule  # annotated
    pm: PassManager  # with the passes' timings
    inputs: tuple  # the example inputs it was traced with (full batch)


def analyze(spec: ModelSpec, cluster: Cluster, microbatch_size: int, *, dump_dir: Path | None = None,
            print_ir_after: frozenset[str] = frozenset(), echo: Callable[[str], None] = print,
            extra_dump_dir: Path | None = None, verbose: bool = False,
            progress: Progress | None = None) -> Analysis:
    """Trace the model and run the analysis passes (steps 1 and 2)."""
    progress = progress or Progress()
    progress.update("building the model")
    module, inputs = load_model(spec)
    progress.update("tracing with torch.export")
    gm = export_model(module, inputs)
    ctx = PassContext(device_types=cluster.device_types, batch_size=spec.batch_size, microbatch_size=microbatch_size)
    pm = PassManager(default_passes(), dump_dir=dump_dir, print_after=print_ir_after, echo=echo,
                     extra_dump_dir=extra_dump_dir, verbose=verbose, on_pass_start=progress.update)
    return Analysis(pm.run(gm, ctx), pm, inputs)


def compile_model(spec: ModelSpec, cluster_spec: str, out: Path, opts: CompileOptions,
                  echo: Callable[[str], None] = print, progress: Progress | None = None) -> CompileResult:
    """Partition `spec` onto `cluster_spec` and write the artifacts to `out`.

    `progress` shows the long steps on a terminal (`Progress.for_console`); default: quiet.
    """
    progress = progress or Progress()
    if opts.microbatches < 1 or spec.batch_size % opts.microbatches:
        raise HetpartError(
            f"--microbatches {opts.microbatches} must be >= 1 and divide --batch-size {spec.batch_size}"
        )
    if opts.time_limit_s <= 0:
        raise HetpartError(f"--time-limit must be positive (got {opts.time_limit_s})")
    cluster = load_cluster(cluster_spec)
    microbatch_size = spec.batch_size // opts.microbatches
    with staging_dir(out, opts.force) as tmp:
        # 1-2. Trace with torch.export and annotate shapes, FLOPs, memory and op cost per device type.
        with progress.step("tracing"):
            gm, pm, inputs = analyze(spec, cluster, microbatch_size, dump_dir=tmp / "ir",
                             print_ir_after=opts.print_ir_after, echo=echo,
                             extra_dump_dir=opts.dump_ir, verbose=opts.verbose, progress=progress)
        # 3. Lower to the torch-free problem, solve with CP-SAT, check the plan independently.
        problem = lower_to_problem(gm, cluster)
        start = time.perf_counter()
        with progress.step("solving"):
            plan = solve(problem, time_limit_s=opts.time_limit_s, seed=opts.seed,
                         log_callback=progress.solver if progress.active else None)
        solve_s = time.perf_counter() - start
        if opts.verbose:
            echo(f"solve: {solve_s * 1e3:.1f} ms ({plan.solver_status})")
        verify_plan(problem, plan)
        where = stage_of_nodes(gm, plan.stage_of)
        for node in gm.graph.nodes:
            if node.name in where:
                info(node).stage = where[node.name]
        pm.emit(gm, len(pm.passes) + 1, "partition")
        # 4. Cut the graph into stages and write one rank directory per stage.
        stages = split_stages(gm, plan.stage_of, len(plan.device_of_stage))
        # Each stage's example inputs for its .pt2 export: 2 rows (a batch of 1 would be specialized).
        examples = stage_examples(stages, tuple(x[:2] for x in inputs)) if opts.pt2 else []
        files = []
        for s in stages:
            dev = plan.stages[s.index]
            header = (f"hetpart {__version__}: stage {s.index} of {len(stages)} for {spec.model}, "
                      f"planned on {dev.device} ({dev.device_type}).\n\nInputs: {', '.join(s.inputs)}\n"
                      f"Outputs: {', '.join(s.outputs)}\n")
            files.append(write_rank(tmp / f"rank{s.index}", s, header, examples[s.index] if opts.pt2 else None))
        stage_flops = [0] * len(stages)
        for node in gm.graph.nodes:
            if node.name in where:
                stage_flops[where[node.name]] += info(node).flops or 0
        stage_params = [sum(problem.weights[w] for w in s.weights.values()) for s in stages]
        pj = plan_json(spec, cluster, opts, plan, microbatch_size, stage_flops, stage_params)
        # What other tools would plan, in the same cost model (issue 5).
        pj["baselines"] = [b.to_json() for b in compute_baselines(problem) + fx_baselines(gm, problem)]
        pj["bounds"] = plan.bounds.to_json() if plan.bounds else None
        write_json(tmp / "plan.json", pj)
        planned = [PlannedDevice(d.name, d.type.name, d.machine)
                   for d in (next(c for c in cluster.devices if c.name == n) for n in plan.device_of_stage)]
        man = manifest(stages, files, planned)
        write_json(tmp / "manifest.json", man)
        (tmp / "launch.sh").write_text(launch_script(man))
        (tmp / "launch.sh").chmod(0o755)
        write_json(tmp / "timings.json", {
            "passes": {t.name: round(t.seconds, 4) for t in pm.timings},
            "solve_s": round(solve_s, 4),
        })
        # 5. A page to look at: graph by stage, simulated schedule, memory per device.
        write_report(tmp / "report.html", pj, coarsen_to_blocks(gm))
    return CompileResult(out=out, plan=plan, problem=problem, plan_json=pj)

