"""Device placement of the NeurIPS 2020 benchmark (Tarnawski et al.): k accelerators and CPUs.

`hetpart placement INPUT.json` reads the public benchmark's format
(`../shared/benchmarks/dnn-partitioning/README.md`), solves it and prints the authors'
output shape plus a proven lower bound. The cost model differs from hetpart's pipeline
model (NOTE [placement load]), so this package has its own problem, evaluator, checker
and solvers; nothing here imports torch. It sits above `partitioner/` (it borrows its
ideal enumeration and certificates) and below `cli.py`.

Data flows `read.read_placement` (the question) -> `solve.solve_placement`: `hint.placement_hint`
(a DP over one topological order), `ideals.placement_ideal_dp` (the exact DP over ideals, where
they are few), `cpsat` (the exact CP-SAT model) -> `problem.placement_loads` (the cost model, in
floats) -> `problem.placement_violations` (independent check). `units.py` turns latencies into
the solvers' integers (NOTE [int32 activities]).
"""

from hetpart.placement.problem import Placement, PlacementNode, PlacementProblem, placement_loads, placement_violations
from hetpart.placement.read import read_placement
from hetpart.placement.solve import solve_placement

__all__ = ["Placement", "PlacementNode", "PlacementProblem", "placement_loads", "placement_violations",
           "read_placement", "solve_placement"]
