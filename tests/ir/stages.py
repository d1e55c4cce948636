"""Give a shared annotated graph hand-made stages for one test, then take them back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx as fx

from hetpart.ir import info


@contextlib.contextmanager
def staged(gm: fx.GraphModule, num_stages: int, ops: tuple[str, ...] = ("placeholder", "call_function", "output")
           ) -> Iterator[fx.GraphModule]:
    """Nodes whose op is in `ops` split into `num_stages` contiguous stages in graph order, inside the block.

    The session's annotated graphs are shared between tests (and a deepcopy of a
    GraphModule shares its nodes' annotations), so the stages are removed after.
    """
    nodes = [n for n in gm.graph.nodes if n.op in ops]
    try:
        for i, n in enumerate(nodes):
            info(n).stage = i * num_stages // len(nodes)
        yield gm
    finally:
        for n in nodes:
            info(n).stage = None
