"""Analysis passes over the FX graph, the PassManager that runs them, and lowering."""

from hetpart.passes.flops import FlopsPass
from hetpart.passes.lower import group_of, lower_to_problem
from hetpart.passes.manager import Pass, PassContext, PassManager, PassResult
from hetpart.passes.memory import MemoryPass
from hetpart.passes.op_cost import OpCostPass
from hetpart.passes.shape import ShapePass


def default_passes() -> list:
    """The analysis pipeline, in order."""
    return [ShapePass(), FlopsPass(), MemoryPass(), OpCostPass()]


__all__ = [
    "FlopsPass", "MemoryPass", "OpCostPass", "Pass", "PassContext", "PassManager", "PassResult",
    "ShapePass", "default_passes", "group_of", "lower_to_problem",
]
