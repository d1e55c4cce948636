"""The whole pipeline in one function: trace -> passes -> partition -> codegen.

    model --export--> FX graph --passes--> annotated graph --lower--> Problem
          --solve--> Plan --verify--> --split--> stage GraphModules --write--> out/
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.fx as fx

from hetpart import __version__
from hetpart.codegen import manifest, split_stages, staging_dir, write_json, write_rank
from hetpart.codegen.split import stage_of_nodes
from hetpart.devices import Cluster, load_cluster
from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, export_model, load_model
from hetpart.ir import info
from hetpart.partitioner import Plan, Problem, solve, verify_plan
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem


@dataclass
class CompileOptions:
    microbatches: int = 4
    time_limit_s: float = 30.0
    seed: int = 0
    force: bool = False
    print_ir_after: frozenset[str] = frozenset()
    verbose: bool = False


@dataclass
class CompileResult:
    out: Path
    plan: Plan
    problem: Problem
    plan_json: dict


def plan_json(spec: ModelSpec, cluster: Cluster, opts: CompileOptions, plan: Plan, microbatch_size: int,
              stage_flops: list[int]) -> dict:
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


def analyze(spec: ModelSpec, cluster: Cluster, microbatch_size: int, *, dump_dir: Path | None = None,
            print_ir_after: frozenset[str] = frozenset(), echo: Callable[[str], None] = print
            ) -> tuple[fx.GraphModule, PassManager]:
    """Trace the model and run the analysis passes (steps 1 and 2)."""
    module, inputs = load_model(spec)
    gm = export_model(module, inputs)
    ctx = PassContext(device_types=cluster.device_types, batch_size=spec.batch_size, microbatch_size=microbatch_size)
    pm = PassManager(default_passes(), dump_dir=dump_dir, print_after=print_ir_after, echo=echo)
    return pm.run(gm, ctx), pm


def compile_model(spec: ModelSpec, cluster_spec: str, out: Path, opts: CompileOptions,
                  echo: Callable[[str], None] = print) -> CompileResult:
    """Partition `spec` onto `cluster_spec` and write the artifacts to `out`."""
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
        gm, pm = analyze(spec, cluster, microbatch_size, dump_dir=tmp / "ir",
                         print_ir_after=opts.print_ir_after, echo=echo)
        # 3. Lower to the torch-free problem, solve with CP-SAT, check the plan independently.
        problem = lower_to_problem(gm, cluster)
        start = time.perf_counter()
        plan = solve(problem, time_limit_s=opts.time_limit_s, seed=opts.seed)
        solve_s = time.perf_counter() - start
        verify_plan(problem, plan)
        where = stage_of_nodes(gm, plan.stage_of)
        for node in gm.graph.nodes:
            if node.name in where:
                info(node).stage = where[node.name]
        pm.emit(gm, len(pm.passes) + 1, "partition")
        # 4. Cut the graph into stages and write one rank directory per stage.
        stages = split_stages(gm, plan.stage_of, len(plan.device_of_stage))
        files = []
        for s in stages:
            dev = plan.stages[s.index]
            header = (f"hetpart {__version__}: stage {s.index} of {len(stages)} for {spec.model}, "
                      f"planned on {dev.device} ({dev.device_type}).\n\nInputs: {', '.join(s.inputs)}\n"
                      f"Outputs: {', '.join(s.outputs)}\n")
            files.append(write_rank(tmp / f"rank{s.index}", s, header))
        stage_flops = [0] * len(stages)
        for node in gm.graph.nodes:
            if node.name in where:
                stage_flops[where[node.name]] += info(node).flops or 0
        pj = plan_json(spec, cluster, opts, plan, microbatch_size, stage_flops)
        write_json(tmp / "plan.json", pj)
        write_json(tmp / "manifest.json", manifest(stages, files, plan.device_of_stage))
        write_json(tmp / "timings.json", {
            "passes": {t.name: round(t.seconds, 4) for t in pm.timings},
            "solve_s": round(solve_s, 4),
        })
    return CompileResult(out=out, plan=plan, problem=problem, plan_json=pj)

