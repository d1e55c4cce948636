"""manifest.json of a plan with virtual stages: D ranks, each running v stages (NOTE [virtual-stage manifest])."""

from __future__ import annotations

import dataclasses

from hetpart.codegen.artifacts import PlannedDevice, manifest, mesh
from hetpart.codegen.split import StageGraph
from hetpart.errors import HetpartError
from hetpart.partitioner.virtual import VirtualPlan, virtual_name
from hetpart.plan_report import PlanReport
from hetpart.units import format_bytes

# NOTE [virtual-stage manifest]
# A plan of S = v*D stages on D devices (NOTE [virtual stages plan] in partitioner/virtual.py)
# runs as D ranks (one process per device, as always), rank r running stages r, r+D, ...,
# r+(v-1)D. Each stage has its own directory as in any plan, `rank<k>/` for stage k (the k-th
# stage directory: in such a plan the directory of stage k >= D is run by rank k mod D), with
# its own stage.py, weights and sha256s, so everything that writes and checks one stage's files
# is unchanged. manifest.json then has `world_size` D and D `ranks` entries; entry r is the
# entry of its first stage r, exactly as in a one-stage plan, plus `virtual_stages`: the
# entries of its other stages (stage, dir, files, inputs, outputs, weights; rank, device,
# node and local rank those of rank r). The mesh's `stages` lists all S stages, stage k's ranks
# being [k mod D]; `virtual_stages` is v; the pipeline group holds ranks 0..D-1; a `weights`
# group holds the ranks whose stages read copies of one weight. `load_manifest` checks all of
# it (runtime/stages.py), `run` checks every stage's files before any runs, and a rank builds
# one PipelineStage per stage (runtime/schedules.py). Two stages of one rank reading the same
# weight would hold two copies on one rank whose gradients no group sums: refused here.


def virtual_manifest(stages: list[StageGraph], files: list[dict[str, str]], devices: list[PlannedDevice],
                     ranks: int) -> dict:
    """manifest.json of `stages` (S of them, stage k planned on `devices[k]`) run by `ranks` ranks, stage k on
    rank k mod ranks (NOTE [virtual-stage manifest])."""
    num_stages = len(stages)
    if num_stages % ranks or any(devices[k] != devices[k % ranks] for k in range(num_stages)):
        raise HetpartError(f"internal: {num_stages} stages on {ranks} ranks must repeat the device sequence")
    man = manifest(stages[:ranks], files[:ranks], devices[:ranks])
    every = manifest(stages, files, devices)["ranks"]  # each stage's entry (files, inputs, outputs, weights)
    held: list[list[str]] = [[] for _ in range(ranks)]
    for k, s in enumerate(stages):
        mine = held[k % ranks]
        twice = sorted(set(mine) & set(s.weights.values()))
        if twice:
            raise HetpartError(f"weight {twice[0]!r} is read by two stages of device {devices[k].name} (stage {k} "
                               f"and an earlier one); virtual stages of one device cannot share a weight yet: "
                               "partition with fewer --virtual-stages, or without them")
        mine += sorted(s.weights.values())
    keep = ("rank", "device", "planned_device", "machine", "node_rank", "local_rank")
    for r, entry in enumerate(man["ranks"]):
        entry["virtual_stages"] = [{**every[k], **{f: entry[f] for f in keep}} for k in range(r + ranks, num_stages, ranks)]
    man["mesh"] = mesh([sorted(w) for w in held])
    man["mesh"]["stages"] = [[k % ranks] for k in range(num_stages)]
    man["mesh"]["virtual_stages"] = num_stages // ranks
    return man


def virtual_report(report: PlanReport, vplan: VirtualPlan, microbatch_size: int) -> PlanReport:
    """plan.json of a virtual-stage plan: its v, and the samples per second of its busiest device (which runs
    v stages of each microbatch), not of its slowest stage."""
    busiest_ns = max(vplan.device_loads_ns())
    return dataclasses.replace(report, virtual_stages=vplan.virtual_stages,
                               predicted_samples_per_s=round(microbatch_size / (busiest_ns * 1e-9), 3)
                               if busiest_ns else None)


def virtual_summary(vplan: VirtualPlan) -> str:
    """What `partition` prints of a virtual-stage plan: each device's stages, summed time and memory."""
    stages, loads, mem = vplan.plan.stages, vplan.device_loads_ns(), vplan.device_memory_bytes()
    lines = [f"virtual stages: {len(stages)} stages on {len(vplan.devices)} devices ({vplan.virtual_stages} each, "
             "stage k on device k mod D; NOTE [virtual stages plan]):"]
    for r, d in enumerate(vplan.devices):
        cap = vplan.problem.device(virtual_name(d, 0)).capacity_bytes * vplan.virtual_stages
        lines.append(f"  {d}: stages {list(range(r, len(stages), len(vplan.devices)))}, {loads[r] / 1000:.1f} us per "
                     f"microbatch, {format_bytes(mem[r])} of {format_bytes(cap)}")
    return "\n".join(lines)
