"""Pipeline shapes solved on the layer-level problem (NOTE [shapes on layers]). Nothing here imports torch.

The search of pipeline_search.py solves one single-pipeline plan per shape; on a meta-traced
Llama-70B (3,690 ops) `solve` needs seconds per shape to find any plan that fits, so only a
few shapes were solved in the time limit. Here each shape is solved on the problem coarsened
to one node per model layer (coarsen.py, NOTE [coarse nodes]: a chain of about 85 nodes
for 80 blocks), its plan read back onto the ops and its cuts refined op by op on the real
problem (dp.refine_cuts), then recosted there by `evaluate`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from hetpart.partitioner.coarsen import Coarse, coarsen
from hetpart.partitioner.dp import OrderTables, Segments, _refined, contiguous_plan, order_tables
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.pipelines import pipeline_time_ns, sub_problem
from hetpart.partitioner.problem import Plan, Problem
from hetpart.partitioner.solve import SolveOptions, solve
from hetpart.partitioner.verify import plan_violations

# NOTE [shapes on layers]
# A shape's plan (NOTE [pipeline shapes]) is found in three steps:
# 1. `solve` on the layer-level problem restricted to the shape's devices: runs of the node
#    order between LAYER boundaries (a module of the model, e.g. "layers.7"), each one node
#    (coarsen.py keeps compute, memory and the training stash exactly, transfers rounded up).
#    A model of fewer than _FINE_BELOW layers is also cut inside its layers wherever no more bytes
#    cross than the median between layers (llama's residual after attention: half layers), since
#    its stages hold a few layers or less (llama-7b's search: 835 -> 814 ms on hetero-64, 826 ->
#    794 on hetero-256; llama-70b's on hetero-64 6,727 -> 6,610 ms, its 48-GPU shape 7,025 -> 6,385).
#    That problem is a chain of a few hundred nodes at most, so `solve`'s DP is exact over
#    its plans (every plan of a chain is contiguous) and needs no CP-SAT: tenths of a second
#    where the op-level solve needed seconds (docs/benchmarks.md, "pipeline shapes on layers");
# 2. its plan read back (each op in its layer's stage) and its cuts moved op by op within a
#    radius on the real problem with the devices fixed (dp.refine_cuts, exact stash and links),
#    so a stage boundary may fall inside a layer;
# 3. both recosted by `evaluate` on the real problem, checked by `plan_violations`, and the
#    lower iteration time kept.
# The plan is a plan of the real problem; nothing about it is claimed optimal: the search's
# bound is NOTE [pipelines bound] on the real problem, never a bound of the coarse one (which
# has fewer plans and rounded-up transfers). Plans are cached per shape and microbatch count
# by the search (machines of a kind are interchangeable: one solve per type-count vector).

_MIN_SAVING = 4  # coarsen only when the layer problem has at most 1/_MIN_SAVING of the nodes
_MIN_LAYERS = 8  # ... and at least this many layer boundaries (fewer would cap the stage count too low)
_FINE_BELOW = 100  # fewer layer boundaries than this: also cut inside layers where no more than between them crosses
_REFINE_BUDGET = 3_000_000  # matrix entries of one refinement pass (dp.py's default)


@dataclass
class LayerProblem:
    """The layer-level coarsening of a problem and the real problem's order tables (for refining)."""

    coarse: Coarse
    tab: OrderTables
    layers: int  # nodes of the coarse problem


def layer_problem(problem: Problem, fine: bool | None = None) -> LayerProblem | None:
    """NOTE [shapes on layers]'s coarse problem: one node per run between LAYER boundaries that may be cut
    (and the pin positions); None when the graph has no layers to speak of (fewer than _MIN_LAYERS
    boundaries, or fewer than _MIN_SAVING times fewer runs than nodes) or the runs cannot separate the pins."""
    tab = order_tables(problem)
    n = tab.n
    boundaries = {j for j in range(1, n) if tab.layer_start[j] and tab.cuttable[j]}
    cuts = {0, n} | boundaries | {j for j in (tab.first_end_min, tab.inner_end_max) if 0 < j < n and tab.cuttable[j]}
    if len(boundaries) < _MIN_LAYERS or (len(cuts) - 1) * _MIN_SAVING > n:
        return None
    if fine or (fine is None and len(boundaries) < _FINE_BELOW):  # NOTE [shapes on layers], step 1
        residual = float(np.median(tab.cut_bytes[sorted(boundaries)]))
        finer = cuts | {j for j in range(1, n) if tab.cuttable[j] and tab.cut_bytes[j] <= residual}
        cuts = finer if (len(finer) - 1) * _MIN_SAVING <= n else cuts
    coarse = coarsen(problem, tab, np.array(sorted(cuts), dtype=np.int64))
    if coarse is None:
        return None
    return LayerProblem(coarse=coarse, tab=tab, layers=coarse.problem.graph.number_of_nodes())


def solve_on_layers(problem: Problem, layers: LayerProblem, devices: tuple[str, ...], microbatches: int,
                    opts: SolveOptions, limit_s: float) -> Plan | None:
    """NOTE [shapes on layers]: the shape's plan on `devices` for `microbatches`, a plan of the real
    `problem` (recosted, checked), or None when no layer plan the DP finds is valid op by op. Raises `solve`'s
    errors on the layer problem: NoPlan proves that no plan on layer boundaries fits (a plan cutting inside a
    layer may), OutOfTime that `limit_s` ran out."""
    t0 = time.perf_counter()
    m = microbatches
    cplan = solve(sub_problem(layers.coarse.problem, devices, m), dataclasses.replace(
        opts, time_limit_s=max(0.05, limit_s), objective="iteration", microbatches=m, run_bounds=False,
        run_ideal_dp=False, run_cpsat=False, check_certificate=False, coarsen_above=None))
    sub = sub_problem(problem, devices, m)
    slots = list(cplan.slot_of_stage)
    fine = layers.coarse.fine_stage_of(cplan.stage_of)
    tried = [fine]
    tab = layers.tab
    cuts = [0] + [i for i in range(1, tab.n) if fine[tab.order[i]] != fine[tab.order[i - 1]]] + [tab.n]
    if len(cuts) - 1 == len(slots):  # contiguous (a chain's plans are): move the cuts op by op
        seg = Segments(cuts=cuts, devices=slots, dp_ns=0, exact=True, states=0)
        refined = _refined(sub, tab, seg, _REFINE_BUDGET)[0]
        tried.append(contiguous_plan(sub, tab, refined.cuts, refined.devices, t0, {}).stage_of)
    best = None
    for stage_of in tried:
        stages = evaluate(sub, stage_of, slots)
        plan = Plan(stage_of=stage_of, slot_of_stage=slots, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                    lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0, objective="iteration",
                    microbatches=m)
        value = pipeline_time_ns(plan, m)
        if plan_violations(sub, plan) or (best is not None and value >= best.objective_ns):
            continue
        best = dataclasses.replace(plan, objective_ns=value, solve_seconds=time.perf_counter() - t0)
    return best
