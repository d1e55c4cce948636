"""Which module each problem node belongs to, at the granularity frameworks place: a block of the
model's repeated stack (`blocks.3`, `model.transformer.h.0`) or a module beside it (`wte`,
`model.transformer.ln_f`, `model.lm_head`). See NOTE [export modules].
"""

from __future__ import annotations

import torch.fx as fx

from hetpart.export.layers import MODULE
from hetpart.partitioner.problem import Problem
from hetpart.passes.lower import group_of

# NOTE [export modules]
# torch.export records each op's module stack (`nn_module_stack`, outermost first). A block is a
# module whose path ends in a list index (`h.0`). A node's module is the outermost module on its
# stack that is a block or not an ancestor of one: `model` and `model.transformer` contain the
# blocks, so an op in `model.transformer.wte` belongs to `model.transformer.wte`, one in
# `model.transformer.h.0.attn` to `model.transformer.h.0` (and one in T5's
# `model.encoder.block.0.layer.1` to `model.encoder.block.0`, the outer list), and an op directly in
# `model.transformer` (an add, a reshape between modules) to none: it is glue the framework's
# own forward runs. This is finer than lowering's LAYER (the baselines' unit), which names every
# non-block module of an HF model `model`, one module spanning the whole pipeline.


def module_paths(node: fx.Node) -> list[str]:
    """The module paths of `node`'s stack, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    return [path for path, _ in stack.values() if path and not path.startswith("_empty_nn_module_stack")]


def annotate_modules(gm: fx.GraphModule, problem: Problem) -> None:
    """Set every problem node's MODULE (NOTE [export modules]); a node lowering made of several FX
    nodes takes its first one's."""
    groups = group_of(gm)
    stacks = {node.name: module_paths(node) for node in gm.graph.nodes}
    blocks = {p for paths in stacks.values() for p in paths if p.rpartition(".")[2].isdigit()}
    ancestors = {".".join(b.split(".")[:i]) for b in blocks for i in range(1, b.count(".") + 1)}
    g = problem.graph
    for node in gm.graph.nodes:
        name = groups.get(node.name)
        if name is None or name not in g or MODULE in g.nodes[name]:
            continue
        module = next((p for p in stacks[node.name] if p in blocks or p not in ancestors), None)
        if module is not None:
            g.nodes[name][MODULE] = module
