"""A plan's pipelines and tensor-parallel groups as frameworks lay out ranks: identical replicas of one pipeline,
each stage on a TP group of one degree (NOTE [identical replicas]), and which device runs each framework rank.

Torch-free, like every writer of `hetpart export`: it reads plan.json (a dict) only.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetpart.errors import REDO_PARTITION, HetpartError
from hetpart.export.layers import LayerPlan
from hetpart.partitioner.evaluate import objective_ns
from hetpart.partitioner.problem import StageCost

# NOTE [identical replicas]
# torchtitan, Megatron-LM and DeepSpeed build one device mesh of PP x DP x TP ranks: every data-parallel
# replica runs the same pipeline (same stages, same layers on each, one TP degree everywhere) on an equal
# share of the batch (torchtitan's local_batch_size, Megatron's global batch / DP, DeepSpeed's
# train_micro_batch_size_per_gpu x gradient_accumulation_steps). hetpart's data-parallel pipelines may be
# asymmetric (issue 19: its own runtime runs them), with the batch split by speed, and with --tensor-parallel
# per machine a stage's degree may differ from another's. So a plan is written for those frameworks only when
# its pipelines, rounded to whole layers, have the same stage count, the same layer on the same stage and the same
# TP degree on every stage, and take equal shares; otherwise the refusal names the first property that differs,
# where, and the flag that plans it (equal `--pipelines` groups, `--pipeline-microbatches`, `--tensor-parallel T`)
# or the format that runs it as planned (schedule-csv: one CSV per pipeline). A pipeline's device types may
# differ: the frameworks do not see them, and the plan's even split already costs the slower one.


@dataclass(frozen=True)
class Replicas:
    """A plan as P identical pipelines of S stages, each stage on a TP group of T devices (NOTE [identical
    replicas]); `devices[p][k]`: pipeline p's stage k's devices, in TP rank order."""

    plans: list[LayerPlan]  # each pipeline's rounding to whole layers (the same cuts, its own devices and times)
    microbatches: int  # each pipeline's share
    degree: int
    devices: list[list[list[str]]]

    @property
    def lp(self) -> LayerPlan:
        return self.plans[0]

    @property
    def pipelines(self) -> int:
        return len(self.devices)

    @property
    def stages(self) -> int:
        return len(self.lp.devices)

    def rank_devices(self, order: str) -> list[str]:
        """The device of each framework rank: `order` "pp-dp-tp" (torchtitan's mesh, DeepSpeed's topology, Megatron's
        default order: the pipeline stage outermost) or "dp-pp-tp" (hetpart's own numbering, Megatron's
        --use-tp-pp-dp-mapping: each pipeline's ranks together); TP innermost in both."""
        if order == "dp-pp-tp":
            return [d for pipeline in self.devices for stage in pipeline for d in stage]
        return [self.devices[p][k][t] for k in range(self.stages) for p in range(self.pipelines)
                for t in range(self.degree)]


def pipelines_of(pj: dict) -> list[dict]:
    """plan.json's pipelines; a plan of one pipeline as one (its `layers` the top-level one)."""
    if pj.get("pipelines"):
        return pj["pipelines"]
    one = {"index": 0, "microbatches": pj["microbatches"], "stages": pj["stages"]}
    return [one | ({"layers": pj["layers"]} if "layers" in pj else {})]


def stage_devices(stage: dict) -> list[str]:
    return stage.get("devices") or [stage["device"]]


def _rounded_devices(pipeline: dict, lp: LayerPlan) -> list[list[str]]:
    """The devices of each of `lp`'s stages (its slots, named by `device`, are among the pipeline's stages)."""
    by_slot = {s["device"]: stage_devices(s) for s in pipeline["stages"]}
    return [by_slot[name] for name in lp.devices]


def replicas(pj: dict, fmt: str, layer_plan) -> Replicas:
    """The plan as identical replicas, or an error naming what differs (NOTE [identical replicas]);
    `layer_plan(pipeline, fmt, where)`: a pipeline's LayerPlan, as formats.layer_plan checks it."""
    pipelines = pipelines_of(pj)
    plans = [layer_plan(q, fmt, f"pipeline {p} of plan.json's `pipelines`" if pj.get("pipelines") else "plan.json")
             for p, q in enumerate(pipelines)]
    devices = [_rounded_devices(q, lp) for q, lp in zip(pipelines, plans)]
    several = len(pipelines) > 1
    wrong, fixes = [], []  # every property that keeps the plan from being identical replicas, and what plans it
    first = plans[0]
    for p, lp in enumerate(plans[1:], start=1):
        if lp.names != first.names:
            raise HetpartError(f"--format {fmt}: pipeline {p}'s layers are not pipeline 0's (plan.json's `layers` "
                               f"was edited): {REDO_PARTITION}")
        if len(lp.devices) != len(first.devices):
            wrong.append(f"pipeline {p} has {len(lp.devices)} stage(s) ({', '.join(lp.devices)}) where pipeline 0 has "
                         f"{len(first.devices)} ({', '.join(first.devices)})")
            continue
        moved = [(name, a, b) for name, a, b in zip(lp.names, first.stage_of_layer, lp.stage_of_layer) if a != b]
        if moved:
            wrong.append(f"pipeline {p} cuts the model elsewhere: " + ", ".join(
                f"{name} on stage {b} (pipeline 0: stage {a})" for name, a, b in moved[:3])
                + (", ..." if len(moved) > 3 else ""))
    if wrong:
        fixes.append("equal --pipelines groups (the same device types in the same order; --align layers keeps the "
                     "cuts on layer boundaries)")
    degrees = {(p, k): len(d) for p, pipeline in enumerate(devices) for k, d in enumerate(pipeline)}
    if len(set(degrees.values())) > 1:
        (p0, k0), (p1, k1) = min(degrees), next(pk for pk in sorted(degrees) if degrees[pk] != degrees[min(degrees)])
        where = lambda p, k: f"{'pipeline %d ' % p if several else ''}stage {k}"  # noqa: E731
        wrong.append(f"{where(p0, k0)} runs on {_group(devices[p0][k0])} and {where(p1, k1)} on "
                     f"{_group(devices[p1][k1])}, where {fmt} takes one tensor-parallel degree for every stage")
        fixes.append("--tensor-parallel T (one degree on every machine)")
    shares = [q["microbatches"] for q in pipelines]
    if len(set(shares)) > 1:
        wrong.append(f"the plan splits its {pj['microbatches']} microbatches {'/'.join(map(str, shares))} over its "
                     f"{len(shares)} pipelines, where {fmt} splits the batch evenly: {even_split_cost(pj, pipelines)}")
        total, count = pj["microbatches"], len(shares)
        even = total if total % count == 0 else total + count - total % count  # the next multiple of P
        fixes.append(("" if even == total else f"--microbatches {even} ")
                     + f"--pipeline-microbatches {','.join([str(even // count)] * count)} to plan equal shares")
    if wrong:
        raise HetpartError(f"--format {fmt} runs identical data-parallel replicas, but " + "; ".join(wrong)
                           + ": partition with " + ", and ".join(fixes) + "; or export --format schedule-csv, which "
                           "runs each pipeline as planned")
    return Replicas(plans, shares[0], next(iter(degrees.values())), devices)


def _group(devices: list[str]) -> str:
    return f"a TP group of {len(devices)} ({'+'.join(devices)})" if len(devices) > 1 else f"one device ({devices[0]})"


def _stage_costs(pipeline: dict) -> list[StageCost]:
    ns = lambda us: round(us * 1000)  # noqa: E731
    return [StageCost(s["index"], s["device"], s["device_type"], [], ns(s["compute_us"]), ns(s["comm_in_us"]),
                      ns(s["comm_out_us"]), s["memory_bytes"], s["capacity_bytes"]) for s in pipeline["stages"]]


def even_split_cost(pj: dict, pipelines: list[dict]) -> str:
    """What an even split of the batch costs against the plan's, in the plan's cost model (NOTE [pipelines plan]:
    a pipeline's time is its stages' times plus (share - 1) bottlenecks; the gradient sync does not depend on the
    split); or why no even split exists."""
    total, count = pj["microbatches"], len(pipelines)
    if total % count:
        return f"{total} microbatches do not split evenly over {count} pipelines"
    sync_ns = round((pj.get("grad_sync_us") or 0.0) * 1000)
    even = max(objective_ns(_stage_costs(q), "iteration", total // count) for q in pipelines) + sync_ns
    planned = max(objective_ns(_stage_costs(q), "iteration", q["microbatches"]) for q in pipelines) + sync_ns
    return (f"split evenly ({total // count} each) a step would take {even / 1000:g} us against the plan's "
            f"{planned / 1000:g} us ({(even / planned - 1) * 100:+.1f}%)")


def _machine_blocks(pj: dict, ranks: list[str]) -> list[tuple[str, list[int]]]:
    """The runs of consecutive ranks on one machine, in rank order."""
    machine = {d["name"]: d["machine"] for d in pj["cluster"]["devices"]}
    blocks: list[tuple[str, list[int]]] = []
    for r, name in enumerate(ranks):
        if blocks and blocks[-1][0] == machine[name]:
            blocks[-1][1].append(r)
        else:
            blocks.append((machine[name], [r]))
    return blocks


def one_block_per_machine(pj: dict, ranks: list[str]) -> bool:
    """Whether each machine's ranks are consecutive (what torchrun can number)."""
    machines = [m for m, _ in _machine_blocks(pj, ranks)]
    return len(machines) == len(set(machines))


def gpu_ordinals(pj: dict) -> dict[str, int | str]:
    """Each device of the plan's cluster: "cpu", or its CUDA ordinal, its index among its machine's non-CPU devices
    in the cluster's order (what a framework's cuda:LOCAL_RANK and accelerate's device_map number)."""
    ordinal: dict[str, int | str] = {}
    gpus_on: dict[str, int] = {}
    for d in pj["cluster"]["devices"]:
        if d["type"] == "cpu":
            ordinal[d["name"]] = "cpu"
        else:
            ordinal[d["name"]] = gpus_on.get(d["machine"], 0)
            gpus_on[d["machine"]] = ordinal[d["name"]] + 1
    return ordinal


def launch_notes(pj: dict, ranks: list[str], order: str) -> list[str]:
    """Which device runs each rank (`ranks`, the framework's order, described by `order`), and how to launch them
    there: torchrun numbers ranks machine by machine (node rank x processes per node + local rank), and a framework
    puts a rank on cuda:LOCAL_RANK, so each machine needs its ranks in one block and CUDA_VISIBLE_DEVICES in that
    order (NOTE [identical replicas])."""
    ordinal = gpu_ordinals(pj)
    notes = [f"note: ranks in {order} order: " + ", ".join(f"{r} {name}" for r, name in enumerate(ranks))]
    blocks = _machine_blocks(pj, ranks)
    machines = [m for m, _ in blocks]
    if len(set(machines)) < len(machines):
        split = sorted({m for m in machines if machines.count(m) > 1})
        notes.append(f"note: machine(s) {', '.join(split)} hold ranks that are not one block in this order, which "
                     "torchrun cannot number (it gives each machine consecutive ranks): launch with a launcher that "
                     "sets RANK and LOCAL_RANK per process as listed above")
        return notes
    per_node = {len(rs) for _, rs in blocks}
    for node, (machine, rs) in enumerate(blocks):
        gpus = [str(ordinal[ranks[r]]) for r in rs if ordinal[ranks[r]] != "cpu"]
        visible = (f"CUDA_VISIBLE_DEVICES={','.join(gpus)}" if gpus else "") + (
            "" if len(gpus) == len(rs) else f"{' and ' if gpus else ''}{len(rs) - len(gpus)} rank(s) on its CPU")
        notes.append(f"note: machine {machine}: ranks {rs[0]}..{rs[-1]}, torchrun --nnodes {len(blocks)} --node-rank "
                     f"{node} --nproc-per-node {len(rs)}, {visible}")
    if len(per_node) > 1:
        notes.append("note: the machines run different numbers of ranks: give each its own --nproc-per-node")
    return notes
