"""The partitioner: a torch-free DAG of integer costs in, a verified pipeline plan out.

Data flows problem.py (the question; constraints.py: co-location and forbidden
device types) -> solve.py (the strategy, NOTE [solve strategy]: which of the engines
below run, in which order, with how much time; `SolveOptions` holds every knob;
infeasible.py says why no plan fits) ->
dp.py (fast contiguous plan, the hint) -> bounds.py and ideals.py (lower bounds, and
the DP over ideals) -> coarsen.py (fewer nodes for big graphs, NOTE [coarsened solve])
-> cpsat.py (the exact model) -> evaluate.py (a plan's costs, by costs.py's formulas:
NOTE [stage time]) ->
verify.py (independent check) -> certificate.py (the bound's source and its re-proof,
NOTE [checked certificates]). pipelines.py: data-parallel pipelines of different shapes, each
a plan of the above on its devices (NOTE [pipelines plan]). Nothing here imports torch.
"""

from hetpart.partitioner.dp import dp_hint
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import (
    COLOCATE,
    FORBIDDEN_TYPES,
    MEM_BYTES,
    OUT_BYTES,
    OUT_TENSORS,
    PIN,
    PIN_FIRST,
    PIN_LAST,
    TIME_NS,
    WEIGHTS,
    Device,
    Link,
    Plan,
    Problem,
    Slot,
    StageCost,
)
from hetpart.partitioner.solve import SolveOptions, SolveStats, solve
from hetpart.partitioner.verify import PlanError, plan_violations, verify_plan

__all__ = [
    "COLOCATE",
    "FORBIDDEN_TYPES",
    "MEM_BYTES",
    "OUT_BYTES",
    "OUT_TENSORS",
    "PIN",
    "PIN_FIRST",
    "PIN_LAST",
    "TIME_NS",
    "WEIGHTS",
    "Device",
    "Link",
    "Plan",
    "PlanError",
    "Problem",
    "SolveOptions",
    "SolveStats",
    "Slot",
    "StageCost",
    "bottleneck_ns",
    "dp_hint",
    "evaluate",
    "plan_violations",
    "solve",
    "verify_plan",
]
